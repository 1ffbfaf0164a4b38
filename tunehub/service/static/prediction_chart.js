// Predicted against measured time for a job's records: an SVG scatter on log axes with the
// y = x line (points on it: the model predicted the time exactly).

const SVG = "http://www.w3.org/2000/svg";
const W = 520;
const H = 300;
const PAD = { left: 64, right: 16, top: 12, bottom: 40 };

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function fmtMs(secs) {
  const ms = secs * 1e3;
  return ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toPrecision(2);
}

/** Draw ``items`` ({measured_secs, predicted_secs, trial}) into ``container``. */
export function drawPredictionChart(container, items) {
  container.replaceChildren();
  if (!items.length) return;
  const values = items.flatMap((i) => [i.measured_secs, i.predicted_secs]).filter((v) => v > 0);
  let lo = Math.log10(Math.min(...values));
  let hi = Math.log10(Math.max(...values));
  const margin = Math.max(0.05, (hi - lo) * 0.08);
  lo -= margin;
  hi += margin;
  const x = (s) => PAD.left + ((Math.log10(s) - lo) / (hi - lo)) * (W - PAD.left - PAD.right);
  const y = (s) => H - PAD.bottom - ((Math.log10(s) - lo) / (hi - lo)) * (H - PAD.top - PAD.bottom);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "prediction-svg", role: "img" });
  root.append(svg("rect", { x: PAD.left, y: PAD.top, width: W - PAD.left - PAD.right,
    height: H - PAD.top - PAD.bottom, class: "plot-area" }));
  const lineLo = 10 ** lo;
  const lineHi = 10 ** hi;
  root.append(svg("line", { x1: x(lineLo), y1: y(lineLo), x2: x(lineHi), y2: y(lineHi),
    class: "identity" }));
  for (const t of [lo + (hi - lo) * 0.1, (lo + hi) / 2, hi - (hi - lo) * 0.1]) {
    const s = 10 ** t;
    const tx = svg("text", { x: x(s), y: H - PAD.bottom + 16, class: "tick", "text-anchor": "middle" });
    tx.textContent = fmtMs(s);
    const ty = svg("text", { x: PAD.left - 6, y: y(s) + 4, class: "tick", "text-anchor": "end" });
    ty.textContent = fmtMs(s);
    root.append(tx, ty);
  }
  const xl = svg("text", { x: (W + PAD.left) / 2, y: H - 6, class: "axis-label", "text-anchor": "middle" });
  xl.textContent = "measured (ms)";
  const yl = svg("text", { x: 14, y: (H - PAD.bottom) / 2, class: "axis-label",
    transform: `rotate(-90 14 ${(H - PAD.bottom) / 2})`, "text-anchor": "middle" });
  yl.textContent = "predicted (ms)";
  root.append(xl, yl);
  for (const item of items) {
    const dot = svg("circle", { cx: x(item.measured_secs), cy: y(item.predicted_secs), r: 3.5,
      class: "prediction-point", "data-trial": item.trial });
    const title = svg("title");
    title.textContent = `trial ${item.trial}: measured ${fmtMs(item.measured_secs)} ms, predicted ${fmtMs(item.predicted_secs)} ms`;
    dot.append(title);
    root.append(dot);
  }
  container.append(root);
}
