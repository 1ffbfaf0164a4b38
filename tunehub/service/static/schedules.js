// The schedules page (/schedules): stored schedules, filtered, sorted and paged by the API.
// The filters, sort and page live in the page's URL, so a view can be linked and reloaded.

import { el, fetchJson, fill, fmtConfig, fmtGflops, fmtSecs, isNum, opCell, poll, showError, timeCell, IDLE_REFRESH_MS } from "./common.js";

const PAGE_SIZE = 50;
const MAX_PAGE_SIZE = 500;
const SORTS = new Set(["updated_at", "confirmed_at", "speedup", "gflops", "median_secs", "workload", "template", "target"]);
// Columns a user most likely wants largest (or newest) first when they first click them.
const DESC_FIRST = new Set(["updated_at", "confirmed_at", "speedup", "gflops"]);
const FILTERS = ["op", "target", "template", "dtype"];

function params() {
  const q = new URLSearchParams(location.search);
  const int = (name, fallback, min, max) => {
    const raw = Number.parseInt(q.get(name) ?? "", 10);
    return Number.isInteger(raw) && raw >= min && raw <= max ? raw : fallback;
  };
  const sort = SORTS.has(q.get("sort")) ? q.get("sort") : "updated_at";
  const order = q.get("order") === "asc" || q.get("order") === "desc" ? q.get("order") : (DESC_FIRST.has(sort) ? "desc" : "asc");
  const found = { sort, order, limit: int("limit", PAGE_SIZE, 1, MAX_PAGE_SIZE), offset: int("offset", 0, 0, 2 ** 31 - 1) };
  for (const name of FILTERS) found[name] = q.get(name) || "";
  return found;
}

function go(changes) {
  const url = new URL(location.href);
  for (const [name, value] of Object.entries(changes)) {
    if (value === "" || value === null || value === undefined) url.searchParams.delete(name);
    else url.searchParams.set(name, String(value));
  }
  history.pushState(null, "", url);
  reload();
}

function speedupCell(value) {
  if (!isNum(value)) return el("td", { class: "num speedup", title: "no vendor-library time measured" }, "\u2014");
  const kind = value >= 1 ? "faster" : "slower";
  const title = value >= 1 ? "tunehub's kernel beats the library" : "the library is faster: lookups say so";
  return el("td", { class: `num speedup ${kind}`, title }, `\u00d7${value.toFixed(2)}`);
}

function row(item) {
  return el(
    "tr",
    { "data-workload-key": item.workload_key, "data-target-key": item.target_key, "data-template": item.template, "data-op": item.workload?.op ?? "matmul" },
    opCell(item.workload, item.workload_label),
    el("td", { class: "clip target", title: `${item.target_label}\n${item.target_key}` }, item.target_label),
    el("td", {}, `${item.template} v${item.template_version}`),
    el("td", { class: "config clip", title: fmtConfig(item.config) }, fmtConfig(item.config)),
    el("td", { class: "num time" }, fmtSecs(item.median_secs)),
    el("td", { class: "num gflops" }, fmtGflops(item.gflops)),
    speedupCell(item.speedup_vs_baseline),
    el("td", {}, el("span", { class: `badge source-${item.source}` }, item.source)),
    el("td", { class: "confirmed" }, item.confirmed_at ? timeCell(item.confirmed_at) : "not yet"),
    el("td", {}, timeCell(item.updated_at)),
  );
}

function showSort(p) {
  for (const button of document.querySelectorAll("#schedules-table button.sort")) {
    const mine = button.dataset.sort === p.sort;
    button.classList.toggle("sorted", mine);
    button.dataset.order = mine ? p.order : "";
    button.closest("th").setAttribute("aria-sort", mine ? (p.order === "asc" ? "ascending" : "descending") : "none");
  }
}

function showPager(page) {
  const pager = document.getElementById("schedules-pager");
  const { total, limit, offset } = page;
  const shown = page.items.length;
  pager.hidden = total <= limit && offset === 0;
  document.getElementById("schedules-range").textContent =
    shown > 0 ? `${offset + 1}\u2013${offset + shown} of ${total}` : `none of ${total} here`;
  const prev = document.getElementById("schedules-prev");
  const next = document.getElementById("schedules-next");
  prev.disabled = offset <= 0;
  next.disabled = offset + limit >= total;
  prev.onclick = () => go({ offset: Math.max(0, offset - limit) || "" });
  next.onclick = () => go({ offset: offset + limit });
}

let targetsLoaded = false;
let operatorsLoaded = false;

/** The operator filter's choices: the registered operators (GET /api/v1/operators). */
async function loadOperators(current) {
  const select = document.querySelector("#schedules-filter select[name=op]");
  if (!operatorsLoaded) {
    try {
      const answer = await fetchJson("/operators");
      const items = Array.isArray(answer) ? answer : answer.items ?? answer.operators ?? [];
      const names = items.map((o) => (typeof o === "string" ? o : o.name)).filter(Boolean);
      fill(select, el("option", { value: "" }, "any"), names.map((name) => el("option", { value: name }, name)));
      operatorsLoaded = true;
    } catch {
      // the filter still works with the operator from the URL
    }
  }
  if (current && ![...select.options].some((o) => o.value === current)) {
    select.append(el("option", { value: current }, current));
  }
  select.value = current;
}

async function loadTargets(current) {
  if (targetsLoaded) return;
  const select = document.querySelector("#schedules-filter select[name=target]");
  try {
    const answer = await fetchJson("/targets");
    const options = (answer.items ?? []).map((t) => el("option", { value: t.target_key }, t.label));
    fill(select, el("option", { value: "" }, "any"), options);
    targetsLoaded = true;
  } catch {
    // the filter still works with the key from the URL
  }
  if (current && ![...select.options].some((o) => o.value === current)) {
    select.append(el("option", { value: current }, current.slice(0, 12)));
  }
  select.value = current;
}

async function load() {
  const p = params();
  const form = document.getElementById("schedules-filter");
  await Promise.all([loadTargets(p.target), loadOperators(p.op)]);
  for (const name of FILTERS) form.elements[name].value = p[name];
  showSort(p);
  const table = document.querySelector("#schedules-table tbody");
  const q = new URLSearchParams({ sort: p.sort, order: p.order, limit: String(p.limit), offset: String(p.offset) });
  for (const name of FILTERS) if (p[name]) q.set(name, p[name]);
  try {
    const page = await fetchJson(`/schedules?${q}`);
    const items = Array.isArray(page.items) ? page.items : [];
    document.getElementById("schedules-count").textContent = `(${page.total})`;
    if (!items.length) {
      const filtered = FILTERS.some((name) => p[name]);
      fill(table, el("tr", {}, el("td", { colspan: "10", class: "empty" },
        filtered ? "No schedule matches these filters." : "No schedule yet: a tuning job stores one for each workload it tunes.")));
    } else {
      fill(table, items.map(row));
    }
    showPager(page);
    showError(document.getElementById("schedules-error"), "");
  } catch (err) {
    showError(document.getElementById("schedules-error"), `Could not load schedules: ${err.message}`);
  }
  return IDLE_REFRESH_MS;
}

document.getElementById("schedules-filter").addEventListener("submit", (event) => {
  event.preventDefault();
  const form = event.currentTarget;
  go({ ...Object.fromEntries(FILTERS.map((name) => [name, form.elements[name].value])), offset: "" });
});
document.getElementById("schedules-reset").addEventListener("click", () => {
  go({ ...Object.fromEntries(FILTERS.map((name) => [name, ""])), offset: "" });
});
for (const button of document.querySelectorAll("#schedules-table button.sort")) {
  button.addEventListener("click", () => {
    const p = params();
    const sort = button.dataset.sort;
    const order = sort === p.sort ? (p.order === "asc" ? "desc" : "asc") : (DESC_FIRST.has(sort) ? "desc" : "asc");
    go({ sort, order, offset: "" });
  });
}
window.addEventListener("popstate", () => reload());

const reload = poll(load);
