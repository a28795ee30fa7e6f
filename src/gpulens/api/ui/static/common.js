// Shared by every page: the API key, authenticated fetches, safe DOM building, formatting.
// Everything inserted into the page goes through textContent or attributes, never parsed as HTML.

const KEY = "gpulens.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY);
}

export function signIn(key) {
  sessionStorage.setItem(KEY, key);
}

export function signOut() {
  sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// GET a same-origin API path with the key as a Bearer token; JSON back (207 counts as success).
// `options.signal` (an AbortSignal) cancels the request: the promise then rejects with an AbortError
// (isAbort tells it from a failure).
export async function api(path, params, options = {}) {
  return request("GET", path, params, undefined, options);
}

// POST a JSON body (or nothing) to a same-origin API path; JSON back, an ApiError with the API's
// `detail` when it refuses.
export async function apiPost(path, body, options = {}) {
  return request("POST", path, undefined, body, options);
}

async function request(method, path, params, body, options) {
  const url = new URL(path, window.location.origin);
  if (url.origin !== window.location.origin) throw new Error("refusing a cross-origin request");
  for (const [k, v] of Object.entries(params || {})) {
    if (Array.isArray(v)) v.forEach((x) => url.searchParams.append(k, x));
    else if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
  }
  const headers = { Authorization: `Bearer ${apiKey() || ""}`, Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(url, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
    signal: options.signal,
  });
  if (!resp.ok) {
    let message = `${resp.status} ${resp.statusText}`;
    try {
      const answer = await resp.json();
      const detail = answer.detail ?? answer.message ?? answer.error;
      if (typeof detail === "string") message = detail;
      else if (Array.isArray(detail) && detail.every((d) => d && typeof d.msg === "string")) {
        // a 422: each field's complaint, named by where it is
        message = detail.map((d) => `${(d.loc || []).slice(1).join(".") || "request"}: ${d.msg}`).join("; ");
      } else if (detail !== undefined) message = JSON.stringify(detail);
    } catch (_) {
      // not JSON: keep the status line
    }
    throw new ApiError(resp.status, message);
  }
  return resp.json();
}

// Whether an error is a request cancelled through its AbortSignal (not something to show).
export function isAbort(err) {
  return err instanceof DOMException && err.name === "AbortError";
}

// el("td", {class: "x", data: {metric: "m"}}, "text", child, ...): text children become text nodes.
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "data") for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = String(dv);
    else if (k === "class") node.className = v;
    else if (k === "text") node.textContent = String(v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "href") node.setAttribute("href", safeHref(v));
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// Only same-origin paths become links.
function safeHref(v) {
  const url = new URL(String(v), window.location.origin);
  return url.origin === window.location.origin ? url.pathname + url.search + url.hash : "#";
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

export function showError(where, err) {
  const msg = err instanceof Error ? err.message : String(err);
  clear(where).append(el("p", { class: "error", role: "alert" }, msg));
}

// The user must be signed in; otherwise back to the sign-in form, coming back here after.
export function requireKey() {
  if (apiKey()) return true;
  sessionStorage.setItem("gpulens.next", window.location.pathname);
  window.location.assign("/");
  return false;
}

// The pages every signed-in page links to (the current one marked).
const NAV = [["/", "Executions"], ["/ui/usage", "Usage"], ["/ui/alerts", "Alerts"]];

export function header(title) {
  const out = el("button", { type: "button", class: "signout", onclick: () => { signOut(); window.location.assign("/"); } }, "Sign out");
  const here = window.location.pathname;
  const nav = el("nav", { "aria-label": "Pages" }, NAV.map(([href, label]) =>
    el("a", { href, "aria-current": href === here ? "page" : null }, label)));
  return el("header", {}, el("a", { href: "/", class: "brand" }, "gpulens"), el("h1", {}, title), apiKey() ? nav : null, apiKey() ? out : null);
}

export function parseTime(text) {
  return text ? Date.parse(text) : NaN;
}

export function fmtTime(ms) {
  if (!Number.isFinite(ms)) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.000Z$|Z$/, " UTC");
}

export function fmtDuration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return "–";
  let s = Math.round(ms / 1000);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return `${d}d ${h}h ${m}m`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

export function fmtNum(v, digits = 1) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  return v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

export function fmtBytes(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  let i = 0;
  let x = Math.abs(v);
  while (x >= 1024 && i < BYTE_UNITS.length - 1) { x /= 1024; i++; }
  return `${v < 0 ? "-" : ""}${x.toFixed(x >= 100 || i === 0 ? 0 : 1)} ${BYTE_UNITS[i]}`;
}

export function fmtUnit(v, unit) {
  switch (unit) {
    case "percent": return `${fmtNum(v)} %`;
    case "celsius": return `${fmtNum(v)} °C`;
    case "watt": return `${fmtNum(v)} W`;
    case "megahertz": return `${fmtNum(v, 0)} MHz`;
    case "bytes": return fmtBytes(v);
    case "bytes_per_second": return `${fmtBytes(v)}/s`;
    case "cores": return `${fmtNum(v, 2)} cores`;
    default: return fmtNum(v, 2);
  }
}

export function fmtMoney(v, currency) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  return `${v.toFixed(2)} ${currency || ""}`.trim();
}

// Runs fn over items with at most `limit` in flight.
export async function eachLimited(items, limit, fn) {
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      try { await fn(items[i], i); } catch (e) { console.warn(e); }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}
