// /ui/executions/{id}: the headline (the biggest findings by impact), the 12 Lyceum series as
// synchronized charts with the findings shaded, the findings grouped by kind, the receipt, stats and
// per-GPU figures; above them, the rules firing on it now (live alerts) and a snooze of their stop.

import { ChartGroup, columns } from "./charts.js";
import {
  ApiError, api, apiPost, clear, el, fmtDuration, fmtMoney, fmtNum, fmtTime, fmtUnit, header, isAbort, parseTime, requireKey,
  showError,
} from "./common.js";

export const SERIES = [
  ["gpuUtilizationPercent", "GPU utilization", "percent"],
  ["gpuMemoryUtilizationPercent", "GPU memory used", "percent"],
  ["gpuTemperatureCelsius", "GPU temperature (hottest)", "celsius"],
  ["gpuPowerWatt", "GPU power", "watt"],
  ["gpuPowerLimitWatt", "GPU power limit", "watt"],
  ["gpuClockSmMhz", "SM clock", "megahertz"],
  ["gpuClockMemMhz", "Memory clock", "megahertz"],
  ["gpuPcieThroughputRxBytesPerSec", "PCIe receive", "bytes_per_second"],
  ["gpuPcieThroughputTxBytesPerSec", "PCIe transmit", "bytes_per_second"],
  ["systemRamTotalBytes", "Host RAM total", "bytes"],
  ["systemRamUsedBytes", "Host RAM used", "bytes"],
  ["systemCpuUsagePercent", "Host CPU busy", "percent"],
];
const POINTS = 720; // about one point per pixel column of a wide chart
const $ = (id) => document.getElementById(id);

const HEADLINE_ITEMS = 3; // the biggest findings by GPU-hours
const GROUP_SHOWN = 3; // findings of a kind shown before "Show all N" (a kind of up to 4 shows them all)
const SEVERITY = ["critical", "warning", "info"];

const state = { id: "", full: null, minStep: 15, group: null, series: null, drawn: false };

// Fetches in flight, cancelled when the page goes away (nothing would read their answers).
const inFlight = new Set();
window.addEventListener("pagehide", () => {
  for (const c of inFlight) c.abort();
  inFlight.clear();
});

// fn(signal) with a controller aborted when the page goes away; the controller is handed to `hold`
// (to abort it sooner) before the request starts.
async function cancellable(fn, hold) {
  const ctl = new AbortController();
  inFlight.add(ctl);
  if (hold) hold(ctl);
  try {
    return await fn(ctl.signal);
  } finally {
    inFlight.delete(ctl);
  }
}

// `?step=<seconds>` on the page's URL asks for that resolution whatever the window.
const FORCED_STEP = Number.parseInt(new URLSearchParams(window.location.search).get("step") || "", 10);

function stepFor(spanMs) {
  if (Number.isInteger(FORCED_STEP) && FORCED_STEP > 0) return FORCED_STEP;
  return Math.max(state.minStep, Math.ceil(spanMs / 1000 / POINTS));
}

// Fetch and draw the series of [startMs, endMs]. A newer call (a zoom, a reset) aborts this one's
// request: only the latest window is ever fetched to the end and drawn.
async function loadSeries(startMs, endMs) {
  if (state.series) state.series.abort();
  const step = stepFor(endMs - startMs);
  $("window").textContent = `${fmtTime(startMs)} – ${fmtTime(endMs)} (${fmtDuration(endMs - startMs)}, step ${step} s)`;
  $("charts").setAttribute("aria-busy", "true");
  let mine;
  const body = await cancellable(
    (signal) => api(`/api/v2/external/execution/${encodeURIComponent(state.id)}/metrics`, {
      start: new Date(startMs).toISOString(),
      end: new Date(endMs).toISOString(),
      step: `${step}s`,
    }, { signal }),
    (ctl) => { mine = ctl; state.series = ctl; },
  );
  if (state.series !== mine) return; // superseded after its answer came (its abort came too late)
  state.series = null;
  const range = body.timeRange || {};
  state.group.setRange(parseTime(range.start) || startMs, parseTime(range.end) || endMs);
  SERIES.forEach(([key], i) => state.group.update(i, columns(body[key] || [])));
  $("chart-error").replaceChildren();
  $("charts").setAttribute("aria-busy", "false");
  $("charts").dataset.step = String(step);
  $("charts").dataset.window = `${startMs}-${endMs}`;
  if (!state.drawn) {
    state.drawn = true;
    document.body.dataset.charts = "drawn";
    performance.mark("gpulens:charts-drawn");
  }
}

function showSeriesError(e) {
  if (isAbort(e)) return; // replaced by a newer window, or the page is going away: not a failure
  showError($("chart-error"), e);
  $("charts").setAttribute("aria-busy", "false");
}

function zoomTo(startMs, endMs) {
  [startMs, endMs] = [Math.floor(startMs / 1000) * 1000, Math.ceil(endMs / 1000) * 1000];
  if (state.full) [startMs, endMs] = [Math.max(startMs, state.full[0]), Math.min(endMs, state.full[1])];
  if (endMs <= startMs) return;
  $("reset").disabled = false;
  loadSeries(startMs, endMs).catch(showSeriesError);
}

function buildCharts(startMs, endMs) {
  const group = new ChartGroup(`execution-${state.id}`, zoomTo);
  group.setRange(startMs, endMs);
  state.group = group;
  const box = clear($("charts"));
  for (const [key, title, unit] of SERIES) {
    const plot = el("div", { class: "plot" });
    box.append(el("section", { class: "chart", data: { metric: key } }, el("h3", {}, title), plot));
    group.add(plot, { unit, labels: [title], data: [[], []] });
  }
  window.addEventListener("resize", () => group.resize());
}

function renderMeta(e) {
  const start = parseTime(e.start_time);
  const end = e.end_time ? parseTime(e.end_time) : Date.now();
  const rows = [
    ["Status", e.status],
    ["Host", e.hostname || "–"],
    ["GPUs", e.gpus && e.gpus.length ? e.gpus.join(", ") : "all of the host"],
    ["Profile", e.hardware_profile || "–"],
    ["File", e.file_name || "–"],
    ["Start", fmtTime(start)],
    ["End", e.end_time ? fmtTime(end) : "running"],
    ["Duration", fmtDuration(end - start)],
    ["Return code", e.return_code ?? "–"],
  ];
  if (e.status_details) rows.push(["Details", e.status_details]);
  clear($("meta")).append(...rows.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v))));
}

// -- findings: impact, headline, groups -----------------------------------------------------------

const kindLabel = (kind) => kind.replaceAll("_", " ");
const impactHours = (f) => (f.impact && f.impact.gpuHours) || 0;
const impactCost = (f) => (f.impact && Number.isFinite(f.impact.cost) ? f.impact.cost : null);
const gpuHoursText = (h) => (h >= 10 ? h.toFixed(1) : h.toFixed(2));
const severityRank = (s) => (SEVERITY.includes(s) ? SEVERITY.indexOf(s) : SEVERITY.length);

// 7 h 12 min, 40 min, 45 s
function shortDuration(ms) {
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  const minutes = Math.round(s / 60);
  const h = Math.floor(minutes / 60);
  const m = minutes % 60;
  if (!h) return `${m} min`;
  return m ? `${h} h ${m} min` : `${h} h`;
}

// "on all 4 GPUs" / "on both GPUs" (a finding about every GPU of the execution), "on GPUs 1, 3", or "".
function gpuPhrase(f, summary) {
  const n = summary.gpuCount || 0;
  const own = summary.gpus || [];
  const mine = f.gpus || [];
  const same = (a, b) => a.length === b.length && [...a].sort().join() === [...b].sort().join();
  const whole = !mine.length || (own.length ? same(mine, own) : mine.length === n);
  if (whole) {
    if (n > 1) return n === 2 ? "on both GPUs" : `on all ${n} GPUs`;
    if (mine.length) return `on GPU ${mine[0]}`;
    return n === 1 ? "on its GPU" : "";
  }
  return mine.length === 1 ? `on GPU ${mine[0]}` : `on GPUs ${mine.join(", ")}`;
}

// "2.65 GPU-hours, 6.63 USD" (the cost when priced); "" when the finding concerns no GPU time.
function impactText(hours, cost, summary) {
  if (!(hours > 0)) return "";
  const text = `${gpuHoursText(hours)} GPU-hours`;
  return cost === null ? text : `${text}, ${fmtMoney(cost, summary.cost ? summary.cost.currency : "")}`;
}

// The finding's duration: its evidence's (the points it covers x the interval), else end - start.
function findingMs(f) {
  const s = f.evidence && f.evidence.durationSeconds;
  return Number.isFinite(s) && s >= 0 ? s * 1000 : parseTime(f.end) - parseTime(f.start);
}

// "7 h 12 min input bound on all 4 GPUs: 28.8 GPU-hours, 72.00 USD"
function headlineText(f, summary) {
  const what = [shortDuration(findingMs(f)), kindLabel(f.kind), gpuPhrase(f, summary)]
    .filter(Boolean).join(" ");
  const impact = impactText(impactHours(f), impactCost(f), summary);
  return impact ? `${what}: ${impact}` : what;
}

function zoomButton(f) {
  const startMs = parseTime(f.start);
  const endMs = parseTime(f.end);
  return el("button", { type: "button", class: "zoom", onclick: () => zoomTo(startMs - 60_000, endMs + 60_000) }, "Zoom to");
}

// The biggest findings by GPU-hours (the API's order among equals), one line each and its message.
function renderHeadline(summary) {
  const list = clear($("headline"));
  // a stable sort: equal impacts keep the API's order (severity first)
  const top = [...summary.findings].sort((a, b) => impactHours(b) - impactHours(a)).slice(0, HEADLINE_ITEMS);
  if (!top.length) {
    list.append(el("li", { class: "none" }, "No findings: nothing wasted or wrong was detected."));
    return;
  }
  for (const f of top) {
    list.append(
      el(
        "li",
        { class: `headline-item ${f.severity}`, data: { kind: f.kind, severity: f.severity, gpuHours: impactHours(f) } },
        el("span", { class: `badge ${f.severity}` }, f.severity),
        el("strong", { class: "what" }, headlineText(f, summary)),
        zoomButton(f),
        el("p", { class: "message", title: f.message }, f.message),
      ),
    );
  }
}

// One group per kind, in the order the API first lists each kind (severity, then impact).
function kindGroups(findings) {
  const groups = new Map();
  for (const f of findings) {
    if (!groups.has(f.kind)) groups.set(f.kind, []);
    groups.get(f.kind).push(f);
  }
  return [...groups].map(([kind, fs]) => ({
    kind,
    findings: fs,
    severity: fs.map((f) => f.severity).sort((a, b) => severityRank(a) - severityRank(b))[0],
    gpuHours: fs.reduce((t, f) => t + impactHours(f), 0),
    cost: fs.some((f) => impactCost(f) !== null) ? fs.reduce((t, f) => t + (impactCost(f) || 0), 0) : null,
  }));
}

function findingItem(f, summary, hidden) {
  const startMs = parseTime(f.start);
  const endMs = parseTime(f.end);
  const impact = impactText(impactHours(f), impactCost(f), summary);
  const where = gpuPhrase(f, summary);
  return el(
    "li",
    { class: `finding ${f.severity}`, data: { kind: f.kind, severity: f.severity }, hidden },
    el("span", { class: "when" }, `${fmtTime(startMs)} – ${fmtTime(endMs)} (${fmtDuration(findingMs(f))})`),
    where ? el("span", { class: "gpus" }, where) : null,
    impact ? el("span", { class: "impact" }, impact) : null,
    zoomButton(f),
    el("p", { class: "message" }, f.message),
  );
}

// The findings by kind: a head per kind (count, GPU-hours, cost), its first few findings, and a
// toggle for the rest.
function renderFindings(summary) {
  const box = clear($("findings"));
  $("findings-count").textContent = summary.findings.length ? `(${summary.findings.length})` : "";
  if (!summary.findings.length) {
    box.append(el("p", { class: "none" }, "No findings: nothing wasted or wrong was detected."));
    return;
  }
  for (const g of kindGroups(summary.findings)) {
    const n = g.findings.length;
    const shown = n <= GROUP_SHOWN + 1 ? n : GROUP_SHOWN; // "show 1 more" would take the line it saves
    const items = g.findings.map((f, i) => findingItem(f, summary, i >= shown));
    const head = [`${n} finding${n === 1 ? "" : "s"}`];
    if (g.gpuHours > 0) head.push(`${gpuHoursText(g.gpuHours)} GPU-hours`);
    if (g.gpuHours > 0 && g.cost !== null) head.push(fmtMoney(g.cost, summary.cost ? summary.cost.currency : ""));
    let toggle = null;
    if (shown < n) {
      const more = `Show all ${n}`;
      toggle = el("button", {
        type: "button",
        class: "more",
        "aria-expanded": "false",
        onclick: (ev) => {
          const open = ev.currentTarget.getAttribute("aria-expanded") !== "true";
          items.forEach((li, i) => { li.hidden = !open && i >= shown; });
          ev.currentTarget.setAttribute("aria-expanded", String(open));
          ev.currentTarget.textContent = open ? `Show the first ${shown}` : more;
        },
      }, more);
    }
    box.append(
      el(
        "section",
        { class: "kind-group", data: { kindGroup: g.kind, count: n, gpuHours: g.gpuHours } },
        el("h3", {}, el("span", { class: `badge ${g.severity}` }, kindLabel(g.kind)), el("span", { class: "head" }, head.join(" · "))),
        el("ul", { class: "findings" }, items),
        toggle,
      ),
    );
  }
}

// The receipt in GPU-hours (summary.gpuTime), with money beside it when the execution is priced.
// active + idle + idleHeld = total; input-bound and throttled time are part of the active time.
const RECEIPT = [
  ["total", "GPU time", 0],
  ["active", "Active", 1],
  ["inputBound", "of which input-bound", 2],
  ["throttled", "of which throttled", 2],
  ["idle", "Idle", 1],
  ["idleHeld", "Idle (memory held)", 1],
];

const fmtHours = (h) => (Number.isFinite(h) ? `${h.toFixed(2)} GPU-h` : "–");

function renderCost(summary) {
  const box = clear($("cost"));
  const m = summary.cost;
  const time = summary.gpuTime || null;
  const energy = summary.energy;
  const cur = m ? m.currency : "";
  const rows = [];
  if (time) { // null when the GPU count is unknown (and then there is no cost either)
    for (const [key, label, depth] of RECEIPT) {
      const hours = time[key];
      if (depth === 2 && hours === 0) continue; // no input-bound or throttled time: nothing to say
      rows.push({ label, depth, hours: fmtHours(hours), money: m ? fmtMoney(m[key], cur) : null, total: depth === 0 });
    }
  }
  if (m) {
    rows.push(
      { label: "GPU-hour price", hours: "", money: fmtMoney(m.gpuHourPrice, cur) },
      { label: "Useful GPU hours", hours: fmtHours(m.usefulGpuHours), money: "" },
      { label: "Per useful GPU hour", hours: "", money: fmtMoney(m.perUsefulGpuHour, cur) },
    );
  } else {
    box.append(el("p", { class: "muted" }, "No price for this hardware profile (GPULENS_PRICES): the receipt in GPU time."));
  }
  if (energy) {
    rows.push({ label: "Energy", hours: `${fmtNum(energy.kwh, 3)} kWh (${energy.source}, ${energy.method})`, money: "" });
    if (energy.co2eKg !== null) rows.push({ label: "CO₂e", hours: `${fmtNum(energy.co2eKg, 3)} kg`, money: "" });
  }
  if (!rows.length) return;
  const priced = Boolean(m);
  const head = el("tr", {}, el("th", { scope: "col" }, ""), el("th", { scope: "col", class: "num" }, "GPU-hours"), priced ? el("th", { scope: "col", class: "num" }, "Cost") : null);
  const body = rows.map((r) =>
    el(
      "tr",
      { class: r.total ? "total" : null, data: { depth: r.depth ?? 0 } },
      el("th", { scope: "row", class: `depth-${r.depth ?? 0}` }, r.label),
      el("td", { class: "num" }, r.hours),
      priced ? el("td", { class: "num" }, r.money) : null,
    ));
  box.append(el("table", { class: "receipt" }, el("thead", {}, head), el("tbody", {}, body)));
}

function renderStats(summary) {
  const head = el("tr", {}, ["Series", "Mean", "Min", "Max", "p50", "p95", "Samples", "Coverage"].map((h) => el("th", { scope: "col" }, h)));
  const body = SERIES.map(([key, title, unit]) => {
    const s = summary.stats[key];
    if (!s) return null;
    return el(
      "tr",
      { data: { metric: key } },
      el("th", { scope: "row" }, title),
      [s.mean, s.min, s.max, s.p50, s.p95].map((v) => el("td", {}, fmtUnit(v, unit))),
      el("td", {}, fmtNum(s.samples, 0)),
      el("td", {}, `${fmtNum(s.coverage * 100, 1)} %`),
    );
  });
  clear($("stats")).append(el("table", {}, el("thead", {}, head), el("tbody", {}, body)));
}

// Per GPU: how long each kind of finding held it.
function renderPerGpu(summary) {
  const box = clear($("per-gpu"));
  // an execution that lists no GPUs owns every GPU of its host: indices 0..gpuCount-1
  let gpus = summary.gpus.length ? summary.gpus : (summary.perGpu || []).map((p) => p.gpu || p.uuid);
  if (!gpus.length) gpus = [...new Set(summary.findings.flatMap((f) => f.gpus))];
  if (!gpus.length) gpus = Array.from({ length: summary.gpuCount || 0 }, (_, i) => String(i));
  box.append(el("p", { class: "muted" }, `${summary.gpuCount} GPU(s) on ${summary.hostname || "–"}`));
  if (!gpus.length) return;
  const kinds = [...new Set(summary.findings.map((f) => f.kind))].sort();
  // each GPU's own figures (summary.perGpu), found by index or UUID
  const figures = new Map();
  for (const p of summary.perGpu || []) for (const id of [p.gpu, p.uuid]) if (id) figures.set(id, p);
  const columns = [
    ["util mean", "gpuUtilizationPercent", "mean", "percent"],
    ["memory max", "gpuMemoryUtilizationPercent", "max", "percent"],
    ["power mean", "gpuPowerWatt", "mean", "watt"],
    ["temp max", "gpuTemperatureCelsius", "max", "celsius"],
  ];
  const head = el("tr", {}, el("th", { scope: "col" }, "GPU"), columns.map(([t]) => el("th", { scope: "col" }, t)), el("th", { scope: "col" }, "energy"), el("th", { scope: "col" }, "Findings"), kinds.map((k) => el("th", { scope: "col" }, k.replaceAll("_", " "))));
  const rows = gpus.map((g) => {
    const mine = summary.findings.filter((f) => f.gpus.length === 0 || f.gpus.includes(g));
    const cells = kinds.map((k) => {
      const ms = mine.filter((f) => f.kind === k).reduce((t, f) => t + (parseTime(f.end) - parseTime(f.start)), 0);
      return el("td", {}, ms ? fmtDuration(ms) : "–");
    });
    const own = figures.get(g);
    const stats = columns.map(([, key, how, unit]) => el("td", { data: { stat: key } }, fmtUnit(own?.stats?.[key]?.[how] ?? null, unit)));
    const kwh = own && own.energyKwh !== null ? `${fmtNum(own.energyKwh, 3)} kWh` : "–";
    return el("tr", { data: { gpu: g } }, el("th", { scope: "row" }, g), stats, el("td", {}, kwh), el("td", {}, String(mine.length)), cells);
  });
  box.append(el("table", {}, el("thead", {}, head), el("tbody", {}, rows)));
}

async function loadSummary() {
  try {
    const summary = await cancellable((signal) =>
      api(`/api/v2/external/execution/${encodeURIComponent(state.id)}/summary`, undefined, { signal }));
    state.minStep = Math.max(1, Math.round(summary.stepSeconds || 15));
    state.group.setFindings(summary.findings.map((f) => ({ startMs: parseTime(f.start), endMs: parseTime(f.end), severity: f.severity })));
    renderHeadline(summary);
    renderFindings(summary);
    renderCost(summary);
    renderStats(summary);
    renderPerGpu(summary);
    document.body.dataset.summary = "loaded";
  } catch (e) {
    if (isAbort(e)) return; // the page is going away
    for (const id of ["headline", "findings", "cost", "stats", "per-gpu"]) showError($(id), e);
    document.body.dataset.summary = "error";
  }
}

// -- live alerts: the rules firing on the execution now, and a snooze of their stop requests ----------

const ALERTS = "/api/v2/external/alerts";
const SNOOZE_MS = 2 * 3600_000;
const ALERTS_EVERY_MS = 60_000; // asked again while the execution runs

// "10:42 UTC" today, else the whole date
function sinceText(ms) {
  const full = fmtTime(ms);
  const today = new Date().toISOString().slice(0, 10);
  return new Date(ms).toISOString().slice(0, 10) === today ? full.slice(11, 16) + " UTC" : full.replace(/:\d\d UTC$/, " UTC");
}

function snoozedText(until) {
  return until ? `Stop snoozed until ${fmtTime(parseTime(until))}` : "";
}

function renderAlerts(live) {
  const box = $("alerts-live");
  if (!live.firing.length) {
    box.hidden = true;
    clear(box);
    return;
  }
  const badges = live.firing.map((f) => {
    const sinceMs = parseTime(f.since);
    const text = `${f.kind} firing since ${sinceText(sinceMs)}${f.stop_requested ? " · stop requested" : ""}`;
    return el("span", {
      class: `badge ${f.severity}`,
      title: `rule ${f.rule_id} (${f.severity}) fired at ${fmtTime(sinceMs)}`,
      data: { rule: f.rule_id, kind: f.kind, stopRequested: f.stop_requested },
    }, text);
  });
  const note = el("span", { class: "snoozed", id: "snoozed" }, snoozedText(live.snoozed_until));
  const button = el("button", { type: "button", id: "snooze", onclick: () => snooze(button, note) }, "Snooze stop for 2 h");
  clear(box).append(el("h2", {}, "Alerts"), ...badges, button, note);
  box.hidden = false;
}

async function snooze(button, note) {
  button.disabled = true;
  try {
    const until = new Date(Date.now() + SNOOZE_MS).toISOString();
    const answer = await cancellable((signal) => apiPost(`${ALERTS}/snooze`, { execution_id: state.id, until }, { signal }));
    note.className = "snoozed";
    note.textContent = snoozedText(answer.until);
  } catch (e) {
    if (isAbort(e)) return;
    note.className = "error";
    note.setAttribute("role", "alert");
    note.textContent = e instanceof Error ? e.message : String(e);
  } finally {
    button.disabled = false;
  }
}

// A key limited to projects sees no alerts (403) and an unknown execution says so elsewhere (404):
// nothing to show here then; any other failure is shown.
async function loadAlerts() {
  try {
    const live = await cancellable((signal) =>
      api(`${ALERTS}/executions/${encodeURIComponent(state.id)}`, undefined, { signal }));
    renderAlerts(live);
  } catch (e) {
    if (isAbort(e)) return;
    if (e instanceof ApiError && (e.status === 403 || e.status === 404)) return;
    showError($("alerts-live"), e);
    $("alerts-live").hidden = false;
  } finally {
    document.body.dataset.alerts = "loaded";
  }
}

async function main() {
  if (!requireKey()) return;
  state.id = decodeURIComponent(window.location.pathname.split("/").filter(Boolean).pop() || "");
  document.body.prepend(header(`Execution ${state.id}`));
  document.title = `gpulens – ${state.id}`;
  let execution;
  try {
    execution = await cancellable((signal) =>
      api(`/api/v2/external/execution/${encodeURIComponent(state.id)}`, undefined, { signal }));
  } catch (e) {
    if (!isAbort(e)) for (const id of ["meta", "headline", "findings"]) showError($(id), e);
    return;
  }
  renderMeta(execution);
  loadAlerts();
  if (!execution.end_time) {
    const timer = setInterval(loadAlerts, ALERTS_EVERY_MS);
    window.addEventListener("pagehide", () => clearInterval(timer));
  }
  const startMs = parseTime(execution.start_time);
  const endMs = execution.end_time ? parseTime(execution.end_time) : Date.now();
  if (!Number.isFinite(startMs)) {
    showError($("charts"), "This execution has not started: no metrics yet.");
    clear($("headline")).append(el("li", { class: "none" }, "Not started: nothing to say yet."));
    return;
  }
  state.full = [startMs, endMs];
  buildCharts(startMs, endMs);
  $("reset").addEventListener("click", () => {
    $("reset").disabled = true;
    loadSeries(...state.full).catch(showSeriesError);
  });
  const summary = loadSummary();
  await loadSeries(startMs, endMs).catch(showSeriesError);
  await summary;
}

main();
