// The models page (/models): the cost model in use per family, and every registered model
// with its held-out metrics, the analytical default's on the same workloads and the quality
// gate's verdict (refused candidates are kept and shown with the reason).

import { el, fetchJson, fill, isNum, poll, showError, timeCell, IDLE_REFRESH_MS } from "./common.js";

const COLUMNS = 9;

function metric(value, digits, suffix = "") {
  return isNum(value) ? `${value.toFixed(digits)}${suffix}` : "\u2014";
}

function share(value) {
  return isNum(value) ? metric(100 * value, 1, "%") : "\u2014";
}

function timeError(log2err) {
  // median |log2(predicted / measured)| as a factor: 0.1 -> "×1.07"
  return isNum(log2err) ? `\u00d7${(2 ** log2err).toFixed(2)}` : "\u2014";
}

/** The first pick's share of the best the gate compared (geomean), else the median. */
function firstPick(metrics) {
  return isNum(metrics.top1_geomean) ? metrics.top1_geomean : metrics.top1_fraction;
}

function verdict(model) {
  if (model.active) return ["active", "in use"];
  if (model.accepted === true) return ["accepted", "accepted, superseded"];
  if (model.accepted === false) return ["refused", "refused"];
  return ["ungated", "not gated"];
}

function row(model) {
  const m = model.metrics ?? {};
  const d = model.default_metrics ?? {};
  const [kind, text] = verdict(model);
  return el(
    "tr",
    { "data-model-id": String(model.id), "data-verdict": kind, class: model.active ? "active-model" : null },
    el(
      "td",
      { class: "model-label" },
      model.label,
      el(
        "div",
        { class: "subtle family family-name clip-line", title: `${model.target_label || "target family"}\n${model.family_key}` },
        model.target_label || model.family_key.slice(0, 12),
      ),
      el("div", { class: "subtle family" }, "registered ", timeCell(model.created_at)),
    ),
    el("td", { class: "verdict" }, el("span", { class: `badge model-${kind}` }, text)),
    el("td", { class: "num records-used" }, String(model.records_used)),
    el("td", { class: "num" }, String(model.workloads_used)),
    el("td", { class: "num spearman" }, metric(m.spearman, 3)),
    el("td", { class: "num top1" }, share(firstPick(m))),
    el("td", { class: "num default-top1" }, share(d.top1_geomean)),
    el("td", { class: "num" }, timeError(m.time_log2_error)),
    el("td", { class: "reason wrap" }, model.reason || "\u2014"),
  );
}

function inUse(active) {
  if (!active.length) {
    return el(
      "p",
      { class: "empty" },
      "No model in use: lookups of untuned shapes answer with the template's analytical default, " +
        "and jobs search without a global model, until a trained model clears the gate.",
    );
  }
  return el(
    "ul",
    { class: "active-models" },
    active.map((model) => {
      const m = model.metrics ?? {};
      const d = model.default_metrics ?? {};
      return el(
        "li",
        { "data-model-id": String(model.id) },
        el("strong", {}, model.label),
        ` (${model.target_label || model.family_key.slice(0, 12)}): first pick ${share(firstPick(m))} of the best, ` +
          `the default ${share(d.top1_geomean)}; Spearman ${metric(m.spearman, 3)}; time error ${timeError(m.time_log2_error)}`,
      );
    }),
  );
}

/** Why there is no model yet, and how one comes. */
function noModelYet() {
  return [
    el("p", {}, el("strong", {}, "No model yet."), " A global cost model ranks candidate configs for the jobs of one target family and template, and predicts the best config of shapes nobody tuned."),
    el(
      "p",
      {},
      "The service's background trainer (",
      el("code", {}, "TUNEHUB_TRAIN_MODELS"),
      ", on by default) looks every ",
      el("code", {}, "TUNEHUB_TRAIN_INTERVAL_SECS"),
      " (60 s) and trains a family's model once ",
      el("code", {}, "TUNEHUB_TRAIN_MIN_NEW_RECORDS"),
      " (200) new measurements of it are stored: run tuning jobs to get there. A model is used only if, held out one workload at a time, its first pick does at least as well as the template's analytical default; until then lookups answer with the default.",
    ),
  ];
}

async function load() {
  const table = document.querySelector("#models-table tbody");
  try {
    const page = await fetchJson("/models");
    const items = Array.isArray(page.items) ? page.items : [];
    const active = Array.isArray(page.active) ? page.active : [];
    document.getElementById("models-count").textContent = `(${items.length})`;
    fill(document.getElementById("models-active"), inUse(active));
    if (!items.length) {
      fill(table, el("tr", { class: "empty-row" }, el("td", { colspan: String(COLUMNS), class: "empty wrap" }, noModelYet())));
    } else {
      fill(table, ...items.map(row));
    }
    showError(document.getElementById("models-error"), "");
  } catch (err) {
    showError(document.getElementById("models-error"), `Could not load models: ${err.message}`);
  }
  return IDLE_REFRESH_MS;
}

poll(load);
