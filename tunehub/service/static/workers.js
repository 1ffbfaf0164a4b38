// The workers page (/workers): every worker by target with its live state, refreshed live.

import { el, fetchJson, fill, fmtConfig, orDash, poll, showError, timeCell, REFRESH_MS } from "./common.js";

const STATES = ["timing", "building", "idle", "lost"];

function stateBadge(state) {
  const safe = STATES.includes(state) ? state : "unknown";
  return el("span", { class: `badge worker-${safe}` }, orDash(state));
}

function jobCell(jobId) {
  return Number.isInteger(jobId) ? el("a", { href: `/jobs/${jobId}` }, `#${jobId}`) : "\u2014";
}

function row(worker) {
  const where = worker.node && worker.node !== worker.host ? `${worker.host} \u00b7 ${worker.node}` : worker.host;
  return el(
    "tr",
    { "data-worker-id": worker.worker_id, "data-state": worker.state, class: worker.live ? null : "lost" },
    el("td", { class: "mono", title: worker.worker_id }, worker.worker_id.slice(0, 12)),
    el("td", {}, worker.kind),
    el("td", { class: "clip", title: where }, where),
    el("td", { class: "mono" }, worker.device),
    el("td", { class: "clip device-name", title: worker.device_name }, orDash(worker.device_name)),
    el("td", { class: "state" }, stateBadge(worker.state)),
    el("td", { class: "job" }, jobCell(worker.job_id)),
    el("td", { class: "config clip", title: fmtConfig(worker.config) }, fmtConfig(worker.config) || "\u2014"),
    el("td", { class: "heartbeat" }, timeCell(worker.heartbeat_at)),
  );
}

function group(targetKey, workers) {
  const live = workers.filter((w) => w.live).length;
  const busy = workers.filter((w) => w.state === "timing" || w.state === "building").length;
  return el(
    "section",
    { class: "panel flush worker-group", "data-target-key": targetKey },
    el(
      "div",
      { class: "panel-head" },
      el("h2", { title: targetKey }, workers[0].target_label),
      el("span", { class: "subtle group-counts" }, `${live} live \u00b7 ${busy} busy \u00b7 ${workers.length} in all`),
    ),
    el(
      "table",
      {},
      el(
        "thead",
        {},
        el("tr", {}, ...["Worker", "Kind", "Host \u00b7 node", "Device", "Device name", "State", "Job", "Config", "Heartbeat"].map((h) => el("th", {}, h))),
      ),
      el("tbody", {}, workers.map(row)),
    ),
  );
}

async function load() {
  const groups = document.getElementById("workers-groups");
  try {
    const answer = await fetchJson("/workers");
    const workers = Array.isArray(answer.workers) ? answer.workers : [];
    const byTarget = new Map();
    for (const worker of workers) {
      if (!byTarget.has(worker.target_key)) byTarget.set(worker.target_key, []);
      byTarget.get(worker.target_key).push(worker);
    }
    const live = workers.filter((w) => w.live).length;
    document.getElementById("workers-count").textContent = `(${live} live of ${workers.length})`;
    if (!workers.length) {
      fill(groups, el("section", { class: "panel flush" }, el("p", { class: "empty" },
        "No worker has reported in the last hour. Start one with `tunehub serve` or `tunehub worker --address HEAD:6379`.")));
    } else {
      // Targets with live workers first, then by label.
      const ordered = [...byTarget.entries()].sort(([, a], [, b]) =>
        Number(b.some((w) => w.live)) - Number(a.some((w) => w.live)) || a[0].target_label.localeCompare(b[0].target_label));
      fill(groups, ordered.map(([key, list]) => group(key, list)));
    }
    showError(document.getElementById("workers-error"), "");
  } catch (err) {
    showError(document.getElementById("workers-error"), `Could not load workers: ${err.message}`);
  }
  return REFRESH_MS;
}

poll(load);
