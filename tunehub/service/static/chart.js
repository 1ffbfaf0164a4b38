// The job page's SVG chart: best-so-far GFLOP/s (a step line) against trial number.

import { fmtConfig, fmtGflops, isNum } from "./common.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const WIDTH = 880;
const HEIGHT = 300;
const MARGIN = { top: 16, right: 20, bottom: 44, left: 62 };

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  for (const child of children) node.append(child);
  return node;
}

function tooltip(text) {
  return svg("title", {}, text);
}

/**
 * Round tick values (steps of 1, 2 or 5 × 10^k) within [lo, hi], about `count` of them; with
 * `cover`, the last tick is the first one at or above `hi`.
 */
export function niceTicks(lo, hi, count, { integer = false, cover = false } = {}) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / Math.max(1, count);
  const power = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? 10 * power;
  if (integer) step = Math.max(1, Math.round(step));
  const ticks = [];
  const last = cover ? Math.ceil(hi / step - 1e-9) * step : hi;
  for (let v = Math.ceil(lo / step) * step; v <= last + step * 1e-9; v += step) {
    ticks.push(Number(v.toPrecision(12)));
  }
  return ticks;
}

function tickLabel(value, step) {
  const digits = step >= 1 ? 0 : Math.min(6, Math.ceil(-Math.log10(step)));
  return value.toLocaleString("en-US", {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  });
}

/** The ok records' running maximum, as [{trial, gflops, record}] at each improvement. */
export function bestSoFar(records) {
  const steps = [];
  let best = -Infinity;
  for (const r of records) {
    if (r.status === "ok" && isNum(r.gflops) && r.gflops > best) {
      best = r.gflops;
      steps.push({ trial: r.trial, gflops: r.gflops, record: r });
    }
  }
  return steps;
}

/**
 * Draw into `container` (replacing what is there). `records` are RecordOut objects, oldest
 * first; `bestUid` marks the job's best record (else the fastest ok record is marked);
 * `baselines` (BaselineOut objects) are drawn as dashed horizontal reference lines.
 */
export function drawBestChart(container, records, bestUid = null, baselines = []) {
  const refs = baselines.filter((b) => isNum(b.gflops));
  const trials = records.filter((r) => isNum(r.trial));
  const ok = trials.filter((r) => r.status === "ok" && isNum(r.gflops));
  const failed = trials.filter((r) => r.status !== "ok" || !isNum(r.gflops));
  const root = svg("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    "aria-label": "best-so-far GFLOP/s by trial",
    "data-points": ok.length,
    "data-failures": failed.length,
  });
  container.replaceChildren(root);

  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  if (trials.length === 0) {
    root.append(
      svg("rect", { x: MARGIN.left, y: MARGIN.top, width: plotW, height: plotH, fill: "#fafbfc", stroke: "#e5e8ec" }),
      svg("text", { class: "placeholder", x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle" }, "no measurements yet"),
    );
    return;
  }

  const lastTrial = Math.max(...trials.map((r) => r.trial));
  const firstTrial = Math.min(...trials.map((r) => r.trial));
  const pad = Math.max(0.5, (lastTrial - firstTrial) * 0.02);
  const x0 = firstTrial - pad;
  const x1 = lastTrial + pad;
  const maxG = Math.max(...ok.map((r) => r.gflops), ...refs.map((b) => b.gflops), 0) || 1;
  const yTicks = niceTicks(0, maxG * 1.04, 5, { cover: true });
  const yTop = Math.max(yTicks[yTicks.length - 1], maxG) || 1;
  const yStep = yTicks.length > 1 ? yTicks[1] - yTicks[0] : yTop;

  const sx = (t) => MARGIN.left + ((t - x0) / (x1 - x0)) * plotW;
  const sy = (g) => MARGIN.top + plotH - (g / yTop) * plotH;
  const baseY = MARGIN.top + plotH;

  // grid and y axis
  const grid = svg("g", { class: "grid" });
  const yAxis = svg("g", { class: "axis axis-y" });
  for (const v of yTicks) {
    const y = sy(v);
    grid.append(svg("line", { x1: MARGIN.left, x2: MARGIN.left + plotW, y1: y, y2: y }));
    yAxis.append(
      svg("line", { x1: MARGIN.left - 5, x2: MARGIN.left, y1: y, y2: y }),
      svg("text", { x: MARGIN.left - 8, y: y + 4, "text-anchor": "end" }, tickLabel(v, yStep)),
    );
  }
  yAxis.append(svg("line", { x1: MARGIN.left, x2: MARGIN.left, y1: MARGIN.top, y2: baseY }));

  // x axis
  const xAxis = svg("g", { class: "axis axis-x" });
  xAxis.append(svg("line", { x1: MARGIN.left, x2: MARGIN.left + plotW, y1: baseY, y2: baseY }));
  for (const t of niceTicks(firstTrial, lastTrial, 10, { integer: true })) {
    const x = sx(t);
    xAxis.append(
      svg("line", { x1: x, x2: x, y1: baseY, y2: baseY + 5 }),
      svg("text", { x, y: baseY + 18, "text-anchor": "middle" }, String(t)),
    );
  }
  const labels = svg(
    "g",
    {},
    svg("text", { class: "axis-label", x: MARGIN.left + plotW / 2, y: HEIGHT - 6, "text-anchor": "middle" }, "trial"),
    svg(
      "text",
      { class: "axis-label", transform: `translate(16 ${MARGIN.top + plotH / 2}) rotate(-90)`, "text-anchor": "middle" },
      "GFLOP/s",
    ),
  );
  root.append(grid, yAxis, xAxis, labels);

  // best-so-far step line: flat until the next improvement, then straight up
  const steps = bestSoFar(trials);
  if (steps.length) {
    let d = `M${sx(steps[0].trial).toFixed(1)},${sy(steps[0].gflops).toFixed(1)}`;
    for (const s of steps.slice(1)) d += ` H${sx(s.trial).toFixed(1)} V${sy(s.gflops).toFixed(1)}`;
    d += ` H${sx(lastTrial).toFixed(1)}`;
    root.append(svg("path", { class: "best-line", d }));
  }

  // the vendor library, one dashed line per thread count, labelled at the right end
  const refLines = svg("g", { class: "baselines" });
  for (const b of refs) {
    const y = sy(b.gflops);
    const label = `${b.library} ${b.threads} thr: ${fmtGflops(b.gflops)}`;
    refLines.append(
      svg(
        "line",
        { class: "baseline-line", x1: MARGIN.left, x2: MARGIN.left + plotW, y1: y, y2: y, "data-threads": b.threads },
        tooltip(`${b.template} (${b.library}), ${b.threads} thread(s): ${fmtGflops(b.gflops)} GFLOP/s`),
      ),
      svg("text", { class: "baseline-label", x: MARGIN.left + plotW - 4, y: y - 5, "text-anchor": "end" }, label),
    );
  }
  root.append(refLines);

  // failures: short marks standing on the x axis
  const fails = svg("g", { class: "failures" });
  for (const r of failed) {
    const x = sx(r.trial);
    fails.append(
      svg(
        "line",
        { class: "fail-mark", x1: x, x2: x, y1: baseY, y2: baseY - 10, "data-trial": r.trial, "data-status": r.status },
        tooltip(`trial ${r.trial}: ${String(r.status).replace(/_/g, " ")}`),
      ),
    );
  }
  root.append(fails);

  // every ok trial as a dot; the best one ringed
  const best = bestUid ? ok.find((r) => r.uid === bestUid) : null;
  const champion = best ?? (steps.length ? steps[steps.length - 1].record : null);
  const dots = svg("g", { class: "dots" });
  for (const r of ok) {
    dots.append(
      svg(
        "circle",
        { class: "trial-dot", cx: sx(r.trial), cy: sy(r.gflops), r: 3.5, "data-trial": r.trial },
        tooltip(`trial ${r.trial}: ${fmtGflops(r.gflops)} GFLOP/s\n${fmtConfig(r.config)}`),
      ),
    );
  }
  if (champion) {
    dots.append(
      svg(
        "circle",
        { class: "best-dot", cx: sx(champion.trial), cy: sy(champion.gflops), r: 6, "data-trial": champion.trial },
        tooltip(`best: trial ${champion.trial}, ${fmtGflops(champion.gflops)} GFLOP/s\n${fmtConfig(champion.config)}`),
      ),
    );
  }
  root.append(dots);
}
