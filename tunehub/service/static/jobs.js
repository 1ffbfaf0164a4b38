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
    '  -H "Content-Type: application/json" \\\n' +
    '  -d \'{"workload": {"m": 256, "n": 256, "k": 256, "dtype": "float32"}, "budget": {"max_trials": 32}}\'';
  return el(
    "tr",
    { class: "empty-row" },
    el(
      "td",
      { colspan: COLUMNS, class: "empty wrap" },
      el("p", {}, el("strong", {}, "No tuning jobs yet."), " Tune a GEMM on this machine's CPU:"),
      el("pre", {}, "tunehub tune 256 256 256 --trials 32"),
      el("p", {}, "or submit a job to this service:"),
      el("pre", {}, curl),
    ),
  );
}

function jobRow(job) {
  const href = `/jobs/${encodeURIComponent(job.id)}`;
  return el(
    "tr",
    { "data-job-id": job.id, "data-state": job.state },
    el("td", { class: "num" }, el("a", { href }, `#${job.id}`)),
    el("td", {}, stateBadge(job.state)),
    el("td", {}, progressCell(job)),
    el("td", { class: "num best-gflops" }, bestGflops(job.best)),
    el("td", { class: `num ${speedupClass(job.best)}` }, speedupText(job.best)),
    el("td", {}, el("a", { href }, orDash(job.workload_label))),
    el("td", { class: "clip", title: orDash(job.target_label) }, orDash(job.target_label)),
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

async function submitJob(event) {
  event.preventDefault();
  const form = event.target;
  const data = new FormData(form);
  const number = (name) => Number(data.get(name));
  const body = {
    workload: { op: "matmul", m: number("m"), n: number("n"), k: number("k"), dtype: data.get("dtype") },
    target: data.get("target"),
    template: data.get("template"),
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
document.getElementById("submit-form").addEventListener("submit", submitJob);
document.getElementById("submit-needs-key").addEventListener("click", () => askKey());
onKeyChange((key) => {
  document.getElementById("submit-form").hidden = !key;
  document.getElementById("submit-needs-key").hidden = Boolean(key);
});
const reload = poll(load);
window.addEventListener("popstate", () => reload());
