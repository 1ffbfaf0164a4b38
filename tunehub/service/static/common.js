// Shared helpers of the dashboard pages: DOM building, API access, formatting, polling.

export const API = "/api/v1";
export const REFRESH_MS = 2000;
export const IDLE_REFRESH_MS = 15000;
export const ACTIVE_STATES = new Set(["queued", "running"]);
const DASH = "\u2014";

/** Build an element: el("td", {class: "num", title: "x"}, "text", childNode, ...). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "style") {
      // Through the CSSOM: the content-security policy refuses style attributes.
      node.style.cssText = String(value);
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** An error from the API, carrying the HTTP status and FastAPI's `detail` text. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

async function detailOf(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string") return body.detail;
    if (body.detail !== undefined) return JSON.stringify(body.detail);
  } catch {
    // not JSON: fall back to the status line
  }
  return `${response.status} ${response.statusText}`.trim();
}

// --- the API key -----------------------------------------------------------------------------
// Kept in this tab's session storage only and sent as a header, never as a cookie: a page on
// another site cannot make the browser send it.
const KEY_STORAGE = "tunehub.apiKey";
export const KEY_HEADER = "X-API-Key";
const KEY_FORM = /^th_[0-9a-f]{8}_[A-Za-z0-9_-]{43}$/;

export function apiKey() {
  try {
    return sessionStorage.getItem(KEY_STORAGE) || null;
  } catch {
    return null; // storage disabled
  }
}

const keyListeners = new Set();

/** Call `listener(key)` now and whenever the key is set or forgotten. */
export function onKeyChange(listener) {
  keyListeners.add(listener);
  listener(apiKey());
}

function storeKey(key) {
  try {
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
  } catch {
    // storage disabled: the key lasts until the page is left
  }
  for (const listener of keyListeners) listener(key);
}

/** "th_1a2b3c4d" of a key: what the page shows of it. */
export function keyLabel(key) {
  return key ? key.split("_").slice(0, 2).join("_") : "";
}

/**
 * Wire the header's key box: shows whether a key is set, asks for one (with `reason`, e.g.
 * after a 401), forgets it. Returns `ask(reason)`, which opens the form.
 */
export function mountKeyBox() {
  const state = document.getElementById("key-state");
  const setButton = document.getElementById("key-set");
  const forget = document.getElementById("key-forget");
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  const message = document.getElementById("key-message");
  const close = () => {
    form.hidden = true;
    input.value = "";
  };
  const ask = (reason = "") => {
    message.textContent = reason || "Writes (cancelling, submitting) need an API key of scope write; an operator makes one with `tunehub keys create`.";
    form.hidden = false;
    input.focus();
  };
  onKeyChange((key) => {
    state.textContent = key ? `API key ${keyLabel(key)}` : "No API key";
    state.dataset.key = key ? "set" : "none";
    forget.hidden = !key;
    setButton.textContent = key ? "Change key" : "Set API key";
  });
  setButton.addEventListener("click", () => ask());
  forget.addEventListener("click", () => storeKey(null));
  document.getElementById("key-cancel").addEventListener("click", close);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!KEY_FORM.test(key)) {
      message.textContent = "That is not a tunehub API key (th_ followed by 8 hex digits, _ and 43 characters).";
      return;
    }
    close();
    storeKey(key);
  });
  return ask;
}

export async function fetchJson(path, options = {}) {
  const key = apiKey();
  const headers = { Accept: "application/json", ...(options.headers ?? {}) };
  if (key) headers[KEY_HEADER] = key;
  const response = await fetch(API + path, {
    cache: "no-store",
    ...options,
    headers,
  });
  if (!response.ok) throw new ApiError(response.status, await detailOf(response));
  return response.json();
}

export function isNum(value) {
  return typeof value === "number" && Number.isFinite(value);
}

export function orDash(value) {
  return value === null || value === undefined || value === "" ? DASH : String(value);
}

/** GFLOP/s with about four significant digits, or a dash. */
export function fmtGflops(value) {
  if (!isNum(value)) return DASH;
  const abs = Math.abs(value);
  const digits = abs >= 1000 ? 0 : abs >= 100 ? 1 : abs >= 10 ? 2 : 3;
  return value.toLocaleString("en-US", {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  });
}

/** A duration in seconds as ns / µs / ms / s with three significant digits, or a dash. */
export function fmtSecs(secs) {
  if (!isNum(secs)) return DASH;
  const abs = Math.abs(secs);
  const [scale, unit] =
    abs === 0 || abs >= 1 ? [1, "s"] : abs >= 1e-3 ? [1e3, "ms"] : abs >= 1e-6 ? [1e6, "\u00b5s"] : [1e9, "ns"];
  const v = secs * scale;
  const digits = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2;
  return `${v.toFixed(digits)} ${unit}`;
}

/** A long span in seconds as "1 h 02 min", "3 min 05 s", "12.3 s". */
export function fmtSpan(secs) {
  if (!isNum(secs) || secs < 0) return DASH;
  if (secs < 60) return `${secs.toFixed(secs < 10 ? 1 : 0)} s`;
  const s = Math.round(secs);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = s % 60;
  if (h > 0) return `${h} h ${String(m).padStart(2, "0")} min`;
  return `${m} min ${String(rest).padStart(2, "0")} s`;
}

export function parseTime(iso) {
  if (typeof iso !== "string" || iso === "") return null;
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? null : date;
}

export function fmtLocal(iso) {
  const date = parseTime(iso);
  return date ? date.toLocaleString() : DASH;
}

/** "just now", "5 min ago", "3 h ago", "2 d ago" (then the local date). */
export function fmtRelative(iso, now = Date.now()) {
  const date = parseTime(iso);
  if (!date) return DASH;
  const secs = Math.round((now - date.getTime()) / 1000);
  if (secs < 10) return "just now";
  if (secs < 60) return `${secs} s ago`;
  if (secs < 3600) return `${Math.floor(secs / 60)} min ago`;
  if (secs < 86400) return `${Math.floor(secs / 3600)} h ago`;
  if (secs < 7 * 86400) return `${Math.floor(secs / 86400)} d ago`;
  return date.toLocaleDateString();
}

/** A <time> element showing a relative time, with the local time as its tooltip. */
export function timeCell(iso) {
  const date = parseTime(iso);
  if (!date) return DASH;
  return el("time", { datetime: iso, title: date.toLocaleString() }, fmtRelative(iso));
}

/** Config as compact `MR=6 NR=16 KC=256`, knobs in the order the API gives them. */
export function fmtConfig(config) {
  if (!config || typeof config !== "object") return "";
  return Object.entries(config)
    .map(([knob, value]) => `${knob}=${value}`)
    .join(" ");
}

// The fields every workload has; the rest of a workload's members are its operator's own
// (GET /api/v1/operators: bmm's batch, grouped_mm's group_sizes, conv2d's stride_h, ...).
const COMMON_FIELDS = new Set(["op", "m", "n", "k", "dtype", "a_layout", "b_layout", "epilogue", "allow_tf32"]);

/** A workload's operator's own fields as `batch=16 b_broadcast` (true flags by name, false
 * ones left out, lists as 3,0,5), in the order the API gives them. */
export function opFields(workload) {
  if (!workload || typeof workload !== "object") return "";
  return Object.entries(workload)
    .filter(([name, value]) => !COMMON_FIELDS.has(name) && value !== false && value !== null && value !== undefined)
    .map(([name, value]) => (value === true ? name : `${name}=${Array.isArray(value) ? value.join(",") : value}`))
    .join(" ");
}

/** The workload cell: the operator's name, the rest of the workload's label (shape, dtype,
 * ...; a link where `href` is given), and the operator's own fields under them. One cell, not
 * a column more: every column of the tables stays on a 1280 px screen. */
export function opCell(workload, label, href = null) {
  const op = workload && typeof workload.op === "string" ? workload.op : "matmul";
  const fields = opFields(workload);
  const text = String(label ?? "").startsWith(`${op} `) ? String(label).slice(op.length + 1) : String(label ?? "\u2014");
  return el(
    "td",
    { class: "workload operator", "data-op": op, title: fields ? `${op}: ${fields}` : op },
    el("span", { class: "op-name" }, op),
    " ",
    href ? el("a", { href }, text) : text,
    fields ? el("span", { class: "op-fields subtle" }, fields) : "",
  );
}

export function truncate(text, max) {
  const s = String(text ?? "");
  return s.length > max ? `${s.slice(0, max - 1)}\u2026` : s;
}

function badge(kind, value) {
  const text = orDash(value);
  const safe = String(value ?? "unknown").replace(/[^a-z_]/gi, "");
  return el("span", { class: `badge ${kind}-${safe}` }, text.replace(/_/g, " "));
}

export const stateBadge = (state) => badge("state", state);
export const statusBadge = (status) => badge("status", status);

/** "12 / 32" with a small bar; full when the job is finished. */
export function progressCell(job) {
  const done = isNum(job.trials_done) ? job.trials_done : 0;
  const max = job.budget && isNum(job.budget.max_trials) ? job.budget.max_trials : 0;
  const frac = max > 0 ? Math.min(1, done / max) : 0;
  const finished = !ACTIVE_STATES.has(job.state);
  return el(
    "div",
    { class: `progress${finished ? (job.state === "succeeded" ? " done" : " stopped") : ""}`, title: `${Math.round(frac * 100)}% of the trial budget` },
    el("div", { class: "bar" }, el("span", { style: `width: ${(frac * 100).toFixed(1)}%` })),
    el("span", {}, `${done} / ${max > 0 ? max : DASH}`),
  );
}

/** Replace every child of `node` with `children`. */
export function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

export function showError(node, message) {
  if (!node) return;
  if (message) {
    node.textContent = message;
    node.hidden = false;
  } else {
    node.textContent = "";
    node.hidden = true;
  }
}

/**
 * Run `load` now and again after the delay (ms) it resolves to; a falsy delay stops. Returns a
 * function that reloads at once. Only the latest run schedules the next one, so a reload while
 * a fetch is in flight never doubles the polling.
 */
export function poll(load) {
  let timer = null;
  let generation = 0;
  const run = async () => {
    clearTimeout(timer);
    const mine = ++generation;
    let delay;
    try {
      delay = await load();
    } catch (err) {
      delay = REFRESH_MS * 2.5;
      console.error(err);
    }
    if (mine === generation && delay) timer = setTimeout(run, delay);
  };
  run();
  return run;
}
