// The job page (/jobs/{id}): summary, cancel, best-so-far chart and the table of records.

import { bestConfig, bestGflops, confirmationText, speedupClass, speedupText } from "./best.js";
import { drawBestChart } from "./chart.js";
import { drawPredictionChart } from "./prediction_chart.js";
import {
  ACTIVE_STATES,
  ApiError,
  apiKey,
  el,
  fetchJson,
  fill,
  fmtConfig,
  fmtGflops,
  fmtLocal,
  fmtRelative,
  fmtSecs,
  fmtSpan,
  isNum,
  mountKeyBox,
  onKeyChange,
  opFields,
  orDash,
  parseTime,
  poll,
  progressCell,
  REFRESH_MS,
  showError,
  stateBadge,
  statusBadge,
  truncate,
} from "./common.js";

const STATUSES = [
  "ok",
  "invalid",
  "build_error",
  "runtime_error",
  "wrong_answer",
  "timeout",
  "cancelled",
  "worker_error",
  "noisy",
];
const ERROR_CHARS = 90;

const rawId = decodeURIComponent(location.pathname.replace(/\/+$/, "").split("/").pop() ?? "");
const jobId = /^[0-9]+$/.test(rawId) ? Number.parseInt(rawId, 10) : null;
let lastRecordsKey = null;
let lastJob = null;
let lastBaselines = [];
// Records arrive incrementally: the page keeps what it has and asks only for what is newer.
const seen = { records: [], after: null };

function item(label, value, { cls = "", ddClass = "", title = null } = {}) {
  return el("div", { class: cls || null }, el("dt", {}, label), el("dd", { class: ddClass || null, title }, value));
}

function when(iso) {
  const date = parseTime(iso);
  if (!date) return "\u2014";
  return el("time", { datetime: iso, title: fmtRelative(iso) }, fmtLocal(iso));
}

function elapsed(job) {
  const start = parseTime(job.started_at);
  if (!start) return "\u2014";
  const end = parseTime(job.finished_at) ?? (ACTIVE_STATES.has(job.state) ? new Date() : null);
  return end ? fmtSpan((end.getTime() - start.getTime()) / 1000) : "\u2014";
}

function budgetText(budget) {
  if (!budget) return "\u2014";
  const trials = isNum(budget.max_trials) ? `${budget.max_trials} trials` : null;
  const secs = isNum(budget.max_secs) ? fmtSpan(budget.max_secs) : null;
  return [trials, secs].filter(Boolean).join(" \u00b7 ") || "\u2014";
}

function baselineText(job, baselines) {
  if (!baselines.length) return "\u2014";
  const label = (b) => {
    const tf32 = b.config && b.config.allow_tf32 === true ? ", TF32" : "";
    const kernel = b.kernel ? `, ${b.kernel}` : "";
    return `${fmtGflops(b.gflops)} GFLOP/s (${b.threads} thr${tf32}${kernel})`;
  };
  return el("span", { class: "baselines" }, baselines.map(label).join(" \u00b7 "));
}

function renderSummary(job, baselines) {
  document.title = `Job ${job.id} \u00b7 ${job.state} \u00b7 tunehub`;
  fill(
    document.getElementById("job-title"),
    `Job #${job.id}`,
    stateBadge(job.state),
    el("span", { class: "subtle" }, orDash(job.workload_label)),
  );
  // One best: the schedule the lookup serves for this workload (job.best), not the fastest
  // single trial; until the job's end confirms it, it is the best trial so far and says so.
  const best = job.best ?? null;
  const items = [
    item("State", stateBadge(job.state)),
    item("Best", bestGflops(best, { long: true }), {
      ddClass: "big best-gflops",
      title: "The schedule the lookup serves for this workload on this target",
    }),
    item("vs library", speedupText(best), { ddClass: `big ${speedupClass(best)}` }),
    item("Best median time", fmtSecs(best ? best.median_secs : null), { ddClass: "big" }),
    item("Confirmed", confirmationText(best), { ddClass: "best-confirmed" }),
    item("Best config", bestConfig(best), { cls: "wide", ddClass: "best-config" }),
    item(baselines.length ? `${baselines[0].library} (${baselines[0].template})` : "Vendor library", baselineText(job, baselines), {
      ddClass: "baseline-gflops",
      title: "The vendor library, timed the same way on the same machine",
    }),
    item("Progress", progressCell(job)),
    item("Operator", `${job.workload?.op ?? "matmul"}${opFields(job.workload) ? `: ${opFields(job.workload)}` : ""}`, { ddClass: "job-operator" }),
    item("Workload", orDash(job.workload_label), { title: job.workload_key ?? null }),
    item("Target", orDash(job.target_label), { title: job.target_key ?? null }),
    item("Template", orDash(job.template)),
    item("Strategy", orDash(job.strategy)),
    item("Budget", budgetText(job.budget)),
    item("Created", when(job.created_at)),
    item("Started", when(job.started_at)),
    item("Finished", when(job.finished_at)),
    item("Elapsed", elapsed(job)),
    item("Tuning time", isNum(job.tuning_secs) && job.tuning_secs > 0 ? fmtSpan(job.tuning_secs) : "\u2014", {
      title: "Time spent measuring candidates, over every run of the job (what the budget counts)",
    }),
    item("Best record", bestRecord(best)),
  ];
  if (job.waiting_for) {
    items.push(item("Waiting", job.waiting_for, { cls: "wide job-waiting" }));
  }
  if (job.error) {
    items.push(item("Error", el("pre", { class: "error-text" }, job.error), { cls: "wide job-error" }));
  }
  const summary = document.getElementById("job-summary");
  summary.dataset.state = job.state;
  fill(summary, items);

  lastJob = job;
  lastBaselines = baselines;
  renderCancel(job);
}

/** Cancel is offered for an active job once a key is set; before, the page asks for one. */
function renderCancel(job) {
  const active = ACTIVE_STATES.has(job.state);
  const cancel = document.getElementById("cancel-button");
  cancel.hidden = !active || !apiKey();
  document.getElementById("cancel-needs-key").hidden = !active || Boolean(apiKey());
  if (cancel.hidden) {
    cancel.disabled = false;
    cancel.textContent = "Cancel job";
  }
}

async function cancelJob() {
  const button = document.getElementById("cancel-button");
  button.disabled = true;
  button.textContent = "Cancelling\u2026";
  try {
    const job = await fetchJson(`/jobs/${jobId}/cancel`, { method: "POST" });
    showError(document.getElementById("job-error"), "");
    renderSummary(job, lastBaselines);
  } catch (err) {
    showError(document.getElementById("job-error"), `Could not cancel job ${jobId}: ${err.message}`);
    if (err instanceof ApiError && err.status === 401) askKey(`The service refused the key: ${err.message}`);
    button.disabled = false;
    button.textContent = "Cancel job";
  }
  reload();
}

/** The served schedule's record, and whether it is one of this job's trials. */
function bestRecord(best) {
  if (!best) return "\u2014";
  const uid = best.record_id;
  const mine = seen.records.some((r) => r.uid === uid);
  return el(
    "span",
    {},
    el("code", { title: uid }, truncate(uid, 13)),
    mine ? null : el("span", { class: "subtle" }, " (measured before this job: none of its trials beat it)"),
  );
}

/** The record to star: the served schedule's where it is one of this job's. */
function bestUidOf(job, records) {
  if (job.best) return records.some((r) => r.uid === job.best.record_id) ? job.best.record_id : null;
  let best = null;
  for (const r of records) {
    if (r.status === "ok" && isNum(r.gflops) && (!best || r.gflops > best.gflops)) best = r;
  }
  return best ? best.uid : null;
}

function recordRow(record, bestUid) {
  const isBest = record.uid === bestUid;
  const repeats = Array.isArray(record.repeat_secs) ? record.repeat_secs.length : 0;
  const config = fmtConfig(record.config);
  const error = String(record.error ?? "");
  return el(
    "tr",
    {
      class: isBest ? "best" : null,
      "data-status": record.status,
      "data-trial": record.trial,
      "data-uid": record.uid,
      "data-best": isBest ? "true" : null,
    },
    el("td", { class: "num" }, orDash(record.trial), isBest ? el("span", { class: "star", title: "the best: the schedule the lookup serves" }, "\u2605") : null),
    el("td", {}, statusBadge(record.status)),
    el("td", { class: "num" }, fmtGflops(record.gflops)),
    el("td", { class: "num" }, fmtSecs(record.median_secs)),
    el("td", { class: "num" }, repeats > 0 ? String(repeats) : "\u2014"),
    el("td", { class: "num" }, isNum(record.compile_secs) && record.compile_secs > 0 ? fmtSecs(record.compile_secs) : "\u2014"),
    el("td", { class: "config", title: config || null }, config || "\u2014"),
    el("td", { class: "error-cell", title: error || null }, error ? truncate(error.replace(/\s+/g, " "), ERROR_CHARS) : ""),
  );
}

function renderRecords(job, records, baselines) {
  const bestUid = bestUidOf(job, records);
  const last = records.length ? records[records.length - 1].uid : "";
  const key = `${records.length}|${bestUid}|${last}|${baselines.map((b) => b.record_id).join(",")}`;
  if (key === lastRecordsKey) return;
  lastRecordsKey = key;

  drawBestChart(document.getElementById("best-chart"), records, bestUid, baselines);

  const counts = new Map();
  for (const r of records) counts.set(r.status, (counts.get(r.status) ?? 0) + 1);
  const order = [...STATUSES, ...[...counts.keys()].filter((s) => !STATUSES.includes(s))];
  fill(
    document.getElementById("status-counts"),
    order.filter((s) => counts.has(s)).map((s) => {
      const badge = statusBadge(s);
      badge.append(` ${counts.get(s)}`);
      return badge;
    }),
  );
  document.getElementById("records-count").textContent = records.length ? `(${records.length})` : "";

  const tbody = document.querySelector("#records-table tbody");
  if (records.length === 0) {
    const text = ACTIVE_STATES.has(job.state) ? "No measurements yet; this page refreshes itself." : "This job stored no measurements.";
    fill(tbody, el("tr", {}, el("td", { colspan: 8, class: "empty" }, text)));
  } else {
    fill(tbody, records.map((r) => recordRow(r, bestUid)));
  }
}

function showMissing(label, detail) {
  document.title = `${label} \u00b7 tunehub`;
  fill(document.getElementById("job-title"), label);
  document.getElementById("job-body").hidden = true;
  const notice = document.getElementById("job-error");
  fill(notice, `${detail} `, el("a", { href: "/" }, "Back to all jobs"));
  notice.classList.remove("error");
  notice.hidden = false;
}

async function load() {
  if (jobId === null) {
    showMissing(`no job ${rawId}`, "Job ids are whole numbers.");
    return 0;
  }
  let job;
  let baselines;
  const items = (page) => (Array.isArray(page.items) ? page.items : []);
  try {
    [job, baselines] = await Promise.all([
      fetchJson(`/jobs/${jobId}`),
      fetchJson(`/jobs/${jobId}/baselines`).then(items),
      fetchNewRecords(),
    ]);
  } catch (err) {
    // 422: an id beyond what the API accepts, which no job can have either
    if (err instanceof ApiError && (err.status === 404 || err.status === 422)) {
      showMissing(`no job ${jobId}`, `The service knows no job with id ${jobId}.`);
      return 0;
    }
    showError(document.getElementById("job-error"), `Could not load job ${jobId}: ${err.message}`);
    if (err instanceof ApiError && err.status === 401) askKey(`Reading needs a key here: ${err.message}`);
    return REFRESH_MS * 2.5;
  }
  showError(document.getElementById("job-error"), "");
  renderSummary(job, baselines);
  renderRecords(job, seen.records, baselines);
  await renderPredictions();
  return ACTIVE_STATES.has(job.state) ? REFRESH_MS : 0;
}

/** Why the predicted-against-measured chart is absent: no model in use for the job's target
 * family and template yet, or no ok measurement to compare. */
function noPredictions(model) {
  if (model) {
    return el("div", { class: "teaching" }, el("p", {}, `Model ${model.label} is in use for this job's target family; the chart appears with the job's first ok measurement.`));
  }
  return el(
    "div",
    { class: "teaching" },
    el("p", {}, "No cost model is in use for this job's target family and template yet, so there is nothing to compare its measured times against."),
    el(
      "p",
      {},
      "The service's background trainer trains one once the family has ",
      el("code", {}, "TUNEHUB_TRAIN_MIN_NEW_RECORDS"),
      " (200 by default) new measurements, and uses it only if it beats the template's analytical default on held-out workloads. Every trained model, used or refused, and why, is on the ",
      el("a", { href: "/models" }, "Models"),
      " page.",
    ),
  );
}

/** The global model's predicted time against each ok record's measured time; before there is
 * a model (or a measurement), why not. */
async function renderPredictions() {
  let out;
  try {
    out = await fetchJson(`/jobs/${jobId}/predictions`);
  } catch {
    return; // the rest of the page stands without it
  }
  const panel = document.getElementById("prediction-panel");
  const items = Array.isArray(out.items) ? out.items : [];
  panel.hidden = false;
  const chart = document.getElementById("prediction-chart");
  if (!out.model || !items.length) {
    panel.dataset.state = out.model ? "no-records" : "no-model";
    document.getElementById("prediction-model").textContent = out.model ? `model ${out.model.label}` : "no model yet";
    fill(chart, noPredictions(out.model));
    return;
  }
  panel.dataset.state = "shown";
  const rho = isNum(out.spearman) ? `, Spearman ${out.spearman.toFixed(2)}` : "";
  document.getElementById("prediction-model").textContent =
    `model ${out.model.label}, ${items.length} records${rho}`;
  drawPredictionChart(chart, items);
}

/** Fetch the records stored since the last call (every page of them) and keep them. */
async function fetchNewRecords() {
  for (;;) {
    const query = seen.after === null ? "" : `?after=${seen.after}`;
    const page = await fetchJson(`/jobs/${jobId}/records${query}`);
    const fresh = Array.isArray(page.items) ? page.items : [];
    if (!fresh.length) return;
    seen.records.push(...fresh);
    seen.after = page.next_after;
  }
}

const askKey = mountKeyBox();
document.getElementById("cancel-button").addEventListener("click", cancelJob);
document.getElementById("cancel-needs-key").addEventListener("click", () => askKey());
const reload = poll(load);
onKeyChange(() => {
  if (lastJob) renderCancel(lastJob);
});
