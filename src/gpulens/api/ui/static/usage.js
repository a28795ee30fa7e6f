// /ui/usage: the fleet usage table (docs/usage.md) over a window, one row per group (one or two of
// project, user, hardware profile, host, day): GPU-hours and where they went, drawn as a bar to scale,
// energy and cost, a totals row, sortable columns, and a link to each group's executions, worst first.
//
// What a bar shows follows the API's definitions (shaping/usage.py): every GPU-second is charged to at
// most one of idle, idle with memory held, input-bound and throttled, so those four and the rest (busy)
// stack into the GPU-hours. Useful GPU-hours integrate utilization over all of them: they overlap, so
// they are a separate line under the bar, never a segment of it.

import { api, clear, el, fmtMoney, fmtNum, header, isAbort, requireKey, showError } from "./common.js";

const USAGE = "/api/v2/external/usage";
const KEYS = { project: "Project", user: "User", hardware_profile: "Hardware profile", hostname: "Host", day: "Day" };
const FILTERABLE = ["project", "user", "hardware_profile", "hostname"]; // the executions list's filters
const PRESETS = { "24h": 24, "7d": 7 * 24, "30d": 30 * 24 }; // hours before now
const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;
// The bar's segments, left to right: the busy rest first, the waste after it.
const SEGMENTS = [
  ["busy", "busy"],
  ["input_bound", "input-bound"],
  ["throttled", "throttled"],
  ["idle_held", "idle, memory held"],
  ["idle", "idle"],
];
const BAR_W = 1000; // the bar's viewBox width; the widest row fills it
const $ = (id) => document.getElementById(id);

// Leaving the page makes its requests useless: cancel them; a new query cancels the one in flight.
const page = new AbortController();
window.addEventListener("pagehide", () => page.abort());
let inflight = null;

let table = null; // the API's answer shown
let sort = null; // { col, dir: 1 | -1 } or null: the API's order

// -- the window and the grouping, kept in the address (a link shows the same table) ------------------

function toInput(ms) {
  return new Date(ms).toISOString().slice(0, 16); // YYYY-MM-DDTHH:MM, UTC
}

function fromInput(text) {
  if (!text) return NaN;
  return Date.parse(text.length === 16 ? `${text}:00Z` : `${text}Z`);
}

function iso(ms) {
  return new Date(ms).toISOString();
}

function stateFromAddress() {
  const q = new URLSearchParams(window.location.search);
  const keys = [...new Set((q.get("group_by") || "project").split(",").filter((k) => k in KEYS))].slice(0, 2);
  const now = Math.floor(Date.now() / 60_000) * 60_000;
  let end = Date.parse(q.get("end") || "");
  let start = Date.parse(q.get("start") || "");
  if (!Number.isFinite(end)) end = now;
  if (!Number.isFinite(start)) start = end - PRESETS["7d"] * HOUR_MS;
  return { keys: keys.length ? keys : ["project"], start, end };
}

function stateFromForm() {
  const first = $("group-by").value;
  const then = $("then-by").value;
  const keys = then && then !== first ? [first, then] : [first];
  return { keys, start: fromInput($("start").value), end: fromInput($("end").value) };
}

function showState(s) {
  $("group-by").value = s.keys[0];
  $("then-by").value = s.keys[1] || "";
  $("start").value = toInput(s.start);
  $("end").value = toInput(s.end);
}

function remember(s) {
  const q = new URLSearchParams({ group_by: s.keys.join(","), start: iso(s.start), end: iso(s.end) });
  window.history.replaceState(null, "", `${window.location.pathname}?${q}`);
}

// -- the rows' figures -----------------------------------------------------------------------------------

const waste = (r) => r.idleGpuHours + r.idleHeldGpuHours + r.inputBoundGpuHours + r.throttledGpuHours;

function segments(r) {
  const hours = {
    input_bound: r.inputBoundGpuHours,
    throttled: r.throttledGpuHours,
    idle_held: r.idleHeldGpuHours,
    idle: r.idleGpuHours,
  };
  hours.busy = Math.max(0, r.gpuHours - waste(r));
  return hours;
}

function keyText(key, value) {
  if (value === null || value === undefined || value === "") return `(no ${KEYS[key].toLowerCase()})`;
  return key === "day" ? value.slice(0, 10) : value;
}

// The columns: the group keys, then the figures. `value` sorts; `cell` draws.
function columns(keys, currency, maxHours) {
  const hours = (field, label) => ({
    id: field,
    label,
    numeric: true,
    value: (r) => r[field],
    cell: (r) => fmtNum(r[field], 2),
  });
  return [
    ...keys.map((k) => ({
      id: `key:${k}`,
      label: KEYS[k],
      numeric: false,
      value: (r) => r.group[k],
      cell: (r) => keyText(k, r.group[k]),
    })),
    {
      id: "executions",
      label: "Executions",
      numeric: true,
      value: (r) => r.executions,
      // running ones count up to their last provisional figures (GPULENS_USAGE_INTERVAL)
      cell: (r) => (r.runningExecutions ? `${fmtNum(r.executions, 0)} (${fmtNum(r.runningExecutions, 0)} running)` : fmtNum(r.executions, 0)),
    },
    hours("gpuHours", "GPU-hours"),
    {
      id: "bar",
      label: "Where the GPU-hours went",
      title: "Sorts by the share of GPU-hours idle, idle with memory held, input-bound or throttled",
      numeric: true,
      value: (r) => (r.gpuHours > 0 ? waste(r) / r.gpuHours : null),
      cell: (r) => bar(r, maxHours),
    },
    hours("usefulGpuHours", "Useful GPU-h"),
    {
      id: "usefulShare",
      label: "Useful %",
      numeric: true,
      value: (r) => (r.gpuHours > 0 ? (100 * r.usefulGpuHours) / r.gpuHours : null),
      cell: (r) => (r.gpuHours > 0 ? `${fmtNum((100 * r.usefulGpuHours) / r.gpuHours)} %` : "–"),
    },
    hours("idleGpuHours", "Idle GPU-h"),
    hours("idleHeldGpuHours", "Idle, held GPU-h"),
    hours("inputBoundGpuHours", "Input-bound GPU-h"),
    hours("throttledGpuHours", "Throttled GPU-h"),
    { id: "energyKwh", label: "Energy kWh", numeric: true, value: (r) => r.energyKwh, cell: (r) => fmtNum(r.energyKwh, 2) },
    {
      id: "cost",
      label: "Cost",
      numeric: true,
      value: (r) => r.cost,
      cell: (r) => fmtMoney(r.cost, currency),
      // a group partly priced: what the cost covers
      hint: (r) =>
        r.cost !== null && r.pricedGpuHours < r.gpuHours - 1e-9
          ? `covers ${fmtNum(r.pricedGpuHours, 2)} of ${fmtNum(r.gpuHours, 2)} GPU-h (the rest has no price)`
          : null,
    },
  ];
}

// -- the bar: an SVG (the page holds one, so that its namespace need not be written here) -------------

function svg(tag, attrs, ...children) {
  const node = document.createElementNS($("svg-template").namespaceURI, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "data") for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = String(dv);
    else node.setAttribute(k, String(v));
  }
  node.append(...children);
  return node;
}

function bar(r, maxHours) {
  const scale = maxHours > 0 ? BAR_W / maxHours : 0;
  const parts = segments(r);
  const rects = [];
  let x = 0;
  for (const [category, label] of SEGMENTS) {
    const h = parts[category];
    if (!(h > 0)) continue;
    const w = h * scale;
    const share = r.gpuHours > 0 ? ` (${fmtNum((100 * h) / r.gpuHours)} %)` : "";
    rects.push(svg(
      "rect",
      { class: `seg ${category}`, x, y: 0, width: w, height: 12, data: { category, hours: h } },
      svg("title", {}, `${label}: ${fmtNum(h, 2)} GPU-h${share}`),
    ));
    x += w;
  }
  const useful = Math.max(0, r.usefulGpuHours) * scale;
  if (useful > 0) {
    rects.push(svg(
      "rect",
      { class: "seg useful", x: 0, y: 14, width: useful, height: 4, data: { category: "useful", hours: r.usefulGpuHours } },
      svg("title", {}, `useful: ${fmtNum(r.usefulGpuHours, 2)} GPU-h (utilization integrated)`),
    ));
  }
  const label = `${fmtNum(r.gpuHours, 2)} GPU-hours: ${SEGMENTS.map(([c, l]) => `${l} ${fmtNum(parts[c], 2)}`).join(", ")}; useful ${fmtNum(r.usefulGpuHours, 2)}`;
  return svg(
    "svg",
    { class: "usage-bar", viewBox: `0 0 ${BAR_W} 18`, preserveAspectRatio: "none", role: "img", "aria-label": label },
    ...rects,
  );
}

// -- links to a group's executions ---------------------------------------------------------------------

// The index page lists the group's executions that ran in the window (a day: that day's part of it),
// worst first; null when the list cannot be filtered by one of the keys.
function executionsLink(r, keys, start, end) {
  const q = new URLSearchParams();
  let from = start;
  let to = end;
  for (const k of keys) {
    const v = r.group[k];
    if (k === "day") {
      const day = Date.parse(v);
      if (!Number.isFinite(day)) return null;
      from = Math.max(from, day);
      to = Math.min(to, day + DAY_MS);
    } else if (FILTERABLE.includes(k)) q.set(k, v ?? "");
    else return null;
  }
  q.set("start", iso(from));
  q.set("end", iso(to));
  q.set("order", "worst");
  return `/?${q}`;
}

// -- the table -----------------------------------------------------------------------------------------

function compare(col, dir) {
  return (a, b) => {
    const x = col.value(a);
    const y = col.value(b);
    const xNull = x === null || x === undefined;
    const yNull = y === null || y === undefined;
    if (xNull || yNull) return xNull === yNull ? 0 : xNull ? 1 : -1; // nulls last, either way
    if (col.numeric) return dir * (x - y);
    return dir * String(x).localeCompare(String(y));
  };
}

function totals(rows, keys) {
  const sum = (f) => rows.reduce((acc, r) => acc + (r[f] ?? 0), 0);
  const priced = rows.filter((r) => r.cost !== null && r.cost !== undefined);
  return {
    group: {},
    // an execution that ran on several days is in several day rows: their sum would count it twice
    executions: keys.includes("day") ? null : sum("executions"),
    gpuHours: sum("gpuHours"),
    usefulGpuHours: sum("usefulGpuHours"),
    idleGpuHours: sum("idleGpuHours"),
    idleHeldGpuHours: sum("idleHeldGpuHours"),
    inputBoundGpuHours: sum("inputBoundGpuHours"),
    throttledGpuHours: sum("throttledGpuHours"),
    energyKwh: sum("energyKwh"),
    cost: priced.length ? sum("cost") : null,
    partlyPriced: priced.length > 0 && priced.length < rows.length,
  };
}

function render() {
  const box = clear($("usage"));
  const { rows, groupBy: keys, currency } = table;
  const start = Date.parse(table.start);
  const end = Date.parse(table.end);
  $("usage-window").textContent = `${table.start.replace("T", " ")} – ${table.end.replace("T", " ")}, by ${keys.map((k) => KEYS[k].toLowerCase()).join(" and ")}`;
  if (!rows.length) {
    box.append(el("p", { class: "muted none" }, "No usage in this window: no finished execution with a stored summary ran in it."));
    return;
  }
  const maxHours = Math.max(...rows.map((r) => r.gpuHours));
  const cols = columns(keys, currency, maxHours);
  const shown = sort ? [...rows].sort(compare(cols.find((c) => c.id === sort.col), sort.dir)) : rows;
  const head = el("tr", {}, cols.map((c) => {
    const state = sort && sort.col === c.id ? (sort.dir > 0 ? "ascending" : "descending") : null;
    const button = el("button", { type: "button", class: "sort", title: c.title, onclick: () => sortBy(c) }, c.label);
    return el("th", { scope: "col", class: c.numeric && c.id !== "bar" ? "num" : null, "aria-sort": state, data: { col: c.id } }, button);
  }), el("th", { scope: "col" }, "Executions, worst first"));
  const body = shown.map((r) => {
    const href = executionsLink(r, keys, start, end);
    const label = keys.map((k) => keyText(k, r.group[k])).join(" / ");
    return el(
      "tr",
      { data: { group: label } },
      cols.map((c) => el("td", { class: c.numeric && c.id !== "bar" ? "num" : c.id === "bar" ? "bar" : null, data: { field: c.id }, title: c.hint ? c.hint(r) : null }, c.cell(r))),
      el("td", {}, href ? el("a", { href, class: "executions-link" }, `${fmtNum(r.executions, 0)} →`) : "–"),
    );
  });
  const t = totals(rows, keys);
  const foot = el("tr", { class: "total", data: { group: "total" } }, cols.map((c, i) => {
    let text;
    if (c.id.startsWith("key:")) text = i === 0 ? `Total (${rows.length} groups)` : "";
    else if (c.id === "bar") text = bar(t, t.gpuHours);
    else if (c.id === "executions" && t.executions === null) text = "–";
    else text = c.cell(t);
    const title = c.id === "executions" && t.executions === null
      ? "an execution that ran on several days counts in each of them"
      : c.id === "cost" && t.partlyPriced ? "some groups have no price: their cost is not in the total" : null;
    if (c.id === "cost" && t.partlyPriced) text = `${text} *`;
    return el(c.id.startsWith("key:") ? "th" : "td", { class: c.id === "bar" ? "bar" : c.numeric ? "num" : null, data: { field: c.id }, title }, text);
  }), el("td", {}, ""));
  box.append(el(
    "table",
    { class: "usage" },
    el("thead", {}, head),
    el("tbody", {}, body),
    el("tfoot", {}, foot),
  ));
}

function sortBy(col) {
  if (sort && sort.col === col.id) sort = { col: col.id, dir: -sort.dir };
  else sort = { col: col.id, dir: col.numeric ? -1 : 1 };
  render();
}

// -- loading -------------------------------------------------------------------------------------------

async function load(s) {
  if (!Number.isFinite(s.start) || !Number.isFinite(s.end)) {
    showError($("usage"), "Give a start and an end.");
    return;
  }
  if (s.end <= s.start) {
    showError($("usage"), "The end must be after the start.");
    return;
  }
  remember(s);
  if (inflight) inflight.abort();
  const mine = new AbortController();
  inflight = mine;
  page.signal.addEventListener("abort", () => mine.abort(), { once: true });
  document.body.dataset.usage = "loading";
  $("usage").setAttribute("aria-busy", "true");
  try {
    const answer = await api(USAGE, { group_by: s.keys.join(","), start: iso(s.start), end: iso(s.end) }, { signal: mine.signal });
    table = answer;
    sort = null;
    render();
  } catch (e) {
    if (isAbort(e)) return;
    showError($("usage"), e);
  } finally {
    if (inflight === mine) {
      inflight = null;
      $("usage").setAttribute("aria-busy", "false");
      document.body.dataset.usage = "loaded";
    }
  }
}

function main() {
  if (!requireKey()) return;
  document.body.prepend(header("Usage"));
  const s = stateFromAddress();
  showState(s);
  $("usage-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    load(stateFromForm());
  });
  for (const button of document.querySelectorAll("[data-preset]")) {
    button.addEventListener("click", () => {
      const end = Math.floor(Date.now() / 60_000) * 60_000;
      const next = { ...stateFromForm(), start: end - PRESETS[button.dataset.preset] * HOUR_MS, end };
      showState(next);
      load(next);
    });
  }
  load(s);
}

main();
