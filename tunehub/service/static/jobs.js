// The jobs list page (/): a paged table of jobs, refreshed while any shown job is active.

import { bestGflops, speedupClass, speedupText } from "./best.js";
import {
  ACTIVE_STATES,
  ApiError,
  apiKey,
  el,
  fetchJson,
  fill,
  IDLE_REFRESH_MS,
  isNum,
  mountKeyBox,
  onKeyChange,
  opCell,
  orDash,
  poll,
  progressCell,
  REFRESH_MS,
  showError,
  stateBadge,
  timeCell,
} from "./common.js";

const PAGE_SIZE = 50;
const COLUMNS = 9;
const MAX_PAGE_SIZE = 200;

/** An integer query parameter of the page's URL, clamped to [lo, hi]. */
function queryInt(name, fallback, lo, hi) {
  const raw = Number.parseInt(new URLSearchParams(location.search).get(name) ?? "", 10);
  return Number.isFinite(raw) ? Math.min(hi, Math.max(lo, raw)) : fallback;
}

function emptyRow() {
  const curl =
    `curl -X POST ${location.origin}/api/v1/jobs \\\n` +
    '  -H "X-API-Key: $TUNEHUB_API_KEY" -H "Content-Type: application/json" \\\n' +
    '  -d \'{"workload": {"m": 256, "n": 256, "k": 256, "dtype": "float32"}, "budget": {"max_trials": 32}}\'';
  return el(
    "tr",
    { class: "empty-row" },
    el(
      "td",
      { colspan: COLUMNS, class: "empty wrap" },
      el("p", {}, el("strong", {}, "No tuning jobs yet."), " A job tunes one GEMM shape on one target and stores its best schedule, which lookups then serve."),
      el("p", {}, "Submit one with the form above once an API key is set (an operator makes one: ", el("code", {}, "tunehub keys create --scope write"), "), or over HTTP:"),
      el("pre", {}, curl),
      el("p", {}, "or tune on this machine from the command line, into the same database (same ", el("code", {}, "TUNEHUB_HOME"), "):"),
      el("pre", {}, "tunehub tune 256 256 256 --trials 32"),
      el("p", {}, "Each job's page then draws its best-so-far curve against the vendor library as trials arrive."),
    ),
  );
}

function jobRow(job) {
  const href = `/jobs/${encodeURIComponent(job.id)}`;
  return el(
    "tr",
    { "data-job-id": job.id, "data-state": job.state, "data-op": job.workload?.op ?? "matmul" },
    el("td", { class: "num" }, el("a", { href }, `#${job.id}`)),
    el("td", {}, stateBadge(job.state)),
    el("td", {}, progressCell(job)),
    el("td", { class: "num best-gflops" }, bestGflops(job.best)),
    el("td", { class: `num ${speedupClass(job.best)}` }, speedupText(job.best)),
    opCell(job.workload, job.workload_label, href),
    el("td", { class: "clip target", title: orDash(job.target_label) }, orDash(job.target_label)),
    el("td", {}, orDash(job.template)),
    el("td", {}, timeCell(job.created_at)),
  );
}

function renderPager(page) {
  const pager = document.getElementById("jobs-pager");
  const total = isNum(page.total) ? page.total : 0;
  const limit = isNum(page.limit) && page.limit > 0 ? page.limit : PAGE_SIZE;
  const offset = isNum(page.offset) ? page.offset : 0;
  pager.hidden = total <= limit && offset === 0;
  const shown = page.items.length;
  document.getElementById("jobs-range").textContent =
    shown > 0 ? `${offset + 1}\u2013${offset + shown} of ${total}` : `none of ${total} here`;
  const prev = document.getElementById("jobs-prev");
  const next = document.getElementById("jobs-next");
  prev.disabled = offset <= 0;
  next.disabled = offset + limit >= total;
  prev.onclick = () => go(Math.max(0, offset - limit));
  next.onclick = () => go(offset + limit);
}

function go(offset) {
  const url = new URL(location.href);
  if (offset > 0) url.searchParams.set("offset", String(offset));
  else url.searchParams.delete("offset");
  history.pushState(null, "", url);
  reload();
}

async function load() {
  const offset = queryInt("offset", 0, 0, Number.MAX_SAFE_INTEGER);
  const limit = queryInt("limit", PAGE_SIZE, 1, MAX_PAGE_SIZE);
  let page;
  try {
    page = await fetchJson(`/jobs?limit=${limit}&offset=${offset}`);
  } catch (err) {
    showError(document.getElementById("jobs-error"), `Could not load jobs: ${err.message}`);
    if (err instanceof ApiError && err.status === 401) askKey(`Reading needs a key here: ${err.message}`);
    return REFRESH_MS * 2.5; // the service may be restarting: keep trying
  }
  showError(document.getElementById("jobs-error"), "");
  const items = Array.isArray(page.items) ? page.items : [];
  page.items = items;
  const tbody = document.querySelector("#jobs-table tbody");
  const total = isNum(page.total) ? page.total : items.length;
  document.getElementById("jobs-count").textContent = total > 0 ? `(${total})` : "";
  if (items.length === 0 && total === 0) fill(tbody, emptyRow());
  else if (items.length === 0) {
    fill(tbody, el("tr", {}, el("td", { colspan: COLUMNS, class: "empty" }, "No jobs on this page.")));
  } else fill(tbody, items.map(jobRow));
  renderPager(page);
  // Fast while something moves; the first page also checks now and then for new jobs.
  if (items.some((job) => ACTIVE_STATES.has(job.state))) return REFRESH_MS;
  return offset === 0 ? IDLE_REFRESH_MS : 0;
}

/** The 422's `detail` as lines naming each field, or the message as it is. */
function describeError(err) {
  try {
    const detail = JSON.parse(err.message);
    if (Array.isArray(detail)) {
      return detail.map((e) => `${(e.loc ?? []).filter((p) => p !== "body").join(".")}: ${e.msg}`).join("; ");
    }
  } catch {
    // a plain message
  }
  return err.message;
}

// --- the submit form: what the service runs, from GET /api/v1/targets ----------------------

let offers = null; // {targets: [{value, label, templates}], strategies, defaultStrategy}

/** The form's operator: a GEMM. */
const OP = "matmul";

/** The targets a job here runs on (live ones, and this service's own: local-cpu, ...), each
 * with its templates that compute the form's operator. */
function runnableTargets(items) {
  return items
    .filter((t) => t.live || (Array.isArray(t.aliases) && t.aliases.length > 0))
    .map((t) => ({
      value: t.aliases?.[0] ?? t.target_key,
      label: t.aliases?.length ? `${t.aliases[0]}: ${t.label}` : t.label,
      title: `${t.label}\n${t.target_key}${t.live ? "" : "\nno live worker yet: the job waits for one"}`,
      templates: (Array.isArray(t.templates) ? t.templates : []).filter((p) => !Array.isArray(p.ops) || p.ops.includes(OP)),
    }))
    .filter((t) => t.templates.length > 0);
}

/** Replace `select`'s options with `values` ([value, label, title?]), keeping the choice if
 * it is still offered, else `preferred`, else the first. */
function offer(select, values, preferred) {
  const previous = select.value;
  fill(select, values.map(([value, label, title]) => el("option", { value, title }, label ?? value)));
  const has = (v) => values.some(([value]) => value === v);
  select.value = has(previous) ? previous : has(preferred) ? preferred : values[0]?.[0] ?? "";
}

function chosen(form) {
  const target = offers?.targets.find((t) => t.value === form.elements.target.value);
  const template = target?.templates.find((t) => t.name === form.elements.template.value);
  return { target, template };
}

/** Fill the form's choices down from the chosen target: templates, then dtypes and epilogues. */
function refreshChoices(form) {
  if (!offers) return;
  offer(form.elements.target, offers.targets.map((t) => [t.value, t.label, t.title]));
  const { target } = chosen(form);
  offer(form.elements.template, (target?.templates ?? []).map((t) => [t.name, `${t.name} v${t.version}`]));
  const { template } = chosen(form);
  offer(form.elements.dtype, (template?.dtypes ?? []).map((d) => [d]), "float32");
  offer(form.elements.epilogue, (template?.epilogues ?? []).map((e) => [e]), "none");
  const tf32 = Boolean(template?.allow_tf32) && form.elements.dtype.value === "float32";
  document.getElementById("tf32-field").hidden = !tf32;
  if (!tf32) form.elements.allow_tf32.checked = false;
  const names = offers.strategies.length ? offers.strategies : [offers.defaultStrategy];
  offer(form.elements.strategy, names.map((s) => [s, s === offers.defaultStrategy ? `${s} (default)` : s]), offers.defaultStrategy);
}

async function loadOffers() {
  const form = document.getElementById("submit-form");
  const note = document.getElementById("submit-note");
  let answer;
  try {
    answer = await fetchJson("/targets");
  } catch (err) {
    note.textContent = `Could not read what this service runs: ${err.message}`;
    return;
  }
  const items = Array.isArray(answer.items) ? answer.items : [];
  const targets = runnableTargets(items);
  offers = {
    targets,
    strategies: Array.isArray(answer.strategies) ? answer.strategies : [],
    defaultStrategy: answer.default_strategy || "transfer",
  };
  refreshChoices(form);
  const idle = items.length - targets.length;
  note.textContent = targets.length === 0
    ? "No target can run a job now: no worker has reported. Start one with `tunehub serve` (or `tunehub worker` on a Ray node)."
    : idle > 0
      ? `Offered: what this service can run now. ${idle} other stored target${idle > 1 ? "s have" : " has"} no live worker.`
      : "Offered: what this service can run now, from GET /api/v1/targets.";
  document.getElementById("submit-button").disabled = targets.length === 0;
}

async function submitJob(event) {
  event.preventDefault();
  const form = event.target;
  const data = new FormData(form);
  const number = (name) => Number(data.get(name));
  const workload = {
    op: OP,
    m: number("m"),
    n: number("n"),
    k: number("k"),
    dtype: data.get("dtype"),
    epilogue: data.get("epilogue"),
  };
  if (data.get("allow_tf32")) workload.allow_tf32 = true;
  const body = {
    workload,
    target: data.get("target"),
    template: data.get("template"),
    strategy: data.get("strategy"),
    budget: { max_trials: number("max_trials"), max_secs: number("max_secs") },
  };
  const button = document.getElementById("submit-button");
  button.disabled = true;
  try {
    const job = await fetchJson("/jobs", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    showError(document.getElementById("submit-error"), "");
    location.assign(`/jobs/${encodeURIComponent(job.id)}`);
  } catch (err) {
    showError(document.getElementById("submit-error"), `Not submitted: ${describeError(err)}`);
    if (err instanceof ApiError && err.status === 401) askKey(`The service refused the key: ${err.message}`);
  } finally {
    button.disabled = false;
  }
}

const askKey = mountKeyBox();
const submitForm = document.getElementById("submit-form");
submitForm.addEventListener("submit", submitJob);
submitForm.addEventListener("change", (event) => {
  if (["target", "template", "dtype"].includes(event.target.name)) refreshChoices(submitForm);
});
document.getElementById("submit-needs-key").addEventListener("click", () => askKey());
onKeyChange((key) => {
  submitForm.hidden = !key;
  document.getElementById("submit-needs-key").hidden = Boolean(key);
  if (key) loadOffers();
});
const reload = poll(load);
window.addEventListener("popstate", () => reload());
