// The models page (/models): every registered cost model with its held-out metrics.

import { el, fetchJson, fill, isNum, poll, showError, timeCell, IDLE_REFRESH_MS } from "./common.js";

function metric(value, digits, suffix = "") {
  return isNum(value) ? `${value.toFixed(digits)}${suffix}` : "\u2014";
}

function timeError(log2err) {
  // median |log2(predicted / measured)| as a factor: 0.1 -> "×1.07"
  return isNum(log2err) ? `\u00d7${(2 ** log2err).toFixed(2)}` : "\u2014";
}

function row(model) {
  const m = model.metrics ?? {};
  return el(
    "tr",
    { "data-model-id": String(model.id) },
    el("td", { class: "model-label" }, model.label),
    el("td", {}, model.target_label || model.family_key.slice(0, 12)),
    el("td", { class: "num records-used" }, String(model.records_used)),
    el("td", { class: "num" }, String(model.workloads_used)),
    el("td", { class: "num spearman" }, metric(m.spearman, 3)),
    el("td", { class: "num top1" }, isNum(m.top1_fraction) ? metric(100 * m.top1_fraction, 1, "%") : "\u2014"),
    el("td", { class: "num" }, timeError(m.time_log2_error)),
    el("td", {}, model.features),
    timeCell(model.created_at),
  );
}

async function load() {
  const table = document.querySelector("#models-table tbody");
  try {
    const page = await fetchJson("/models");
    const items = Array.isArray(page.items) ? page.items : [];
    document.getElementById("models-count").textContent = `(${items.length})`;
    if (!items.length) {
      fill(table, el("tr", {}, el("td", { colspan: "9", class: "empty" },
        "No model yet: the trainer registers one once enough measurements are stored.")));
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
