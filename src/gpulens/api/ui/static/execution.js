// /ui/executions/{id}: the 12 Lyceum series as synchronized charts, findings, cost, stats, per-GPU figures.

import { ChartGroup, columns } from "./charts.js";
import {
  api, clear, el, fmtDuration, fmtMoney, fmtNum, fmtTime, fmtUnit, header, parseTime, requireKey, showError,
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

const state = { id: "", full: null, minStep: 15, group: null, seq: 0 };

// `?step=<seconds>` on the page's URL asks for that resolution whatever the window.
const FORCED_STEP = Number.parseInt(new URLSearchParams(window.location.search).get("step") || "", 10);

function stepFor(spanMs) {
  if (Number.isInteger(FORCED_STEP) && FORCED_STEP > 0) return FORCED_STEP;
  return Math.max(state.minStep, Math.ceil(spanMs / 1000 / POINTS));
}

async function loadSeries(startMs, endMs) {
  const seq = ++state.seq;
  const step = stepFor(endMs - startMs);
  $("window").textContent = `${fmtTime(startMs)} – ${fmtTime(endMs)} (${fmtDuration(endMs - startMs)}, step ${step} s)`;
  $("charts").setAttribute("aria-busy", "true");
  const body = await api(`/api/v2/external/execution/${encodeURIComponent(state.id)}/metrics`, {
    start: new Date(startMs).toISOString(),
    end: new Date(endMs).toISOString(),
    step: `${step}s`,
  });
  if (seq !== state.seq) return; // a newer zoom won
  const range = body.timeRange || {};
  state.group.setRange(parseTime(range.start) || startMs, parseTime(range.end) || endMs);
  SERIES.forEach(([key], i) => state.group.update(i, columns(body[key] || [])));
  $("charts").setAttribute("aria-busy", "false");
  $("charts").dataset.step = String(step);
}

function zoomTo(startMs, endMs) {
  [startMs, endMs] = [Math.floor(startMs / 1000) * 1000, Math.ceil(endMs / 1000) * 1000];
  if (state.full) [startMs, endMs] = [Math.max(startMs, state.full[0]), Math.min(endMs, state.full[1])];
  if (endMs <= startMs) return;
  $("reset").disabled = false;
  loadSeries(startMs, endMs).catch((e) => showError($("chart-error"), e));
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

function renderFindings(summary) {
  const list = clear($("findings"));
  if (!summary.findings.length) {
    list.append(el("li", { class: "none" }, "No findings: nothing wasted or wrong was detected."));
    return;
  }
  for (const f of summary.findings) {
    const startMs = parseTime(f.start);
    const endMs = parseTime(f.end);
    list.append(
      el(
        "li",
        { class: `finding ${f.severity}`, data: { kind: f.kind, severity: f.severity } },
        el("span", { class: `badge ${f.severity}` }, f.kind.replaceAll("_", " ")),
        el("span", { class: "when" }, `${fmtTime(startMs)} – ${fmtTime(endMs)} (${fmtDuration(endMs - startMs)})`),
        f.gpus.length ? el("span", { class: "gpus" }, `GPUs ${f.gpus.join(", ")}`) : null,
        el("p", { class: "message" }, f.message),
        el("button", { type: "button", class: "zoom", onclick: () => zoomTo(startMs - 60_000, endMs + 60_000) }, "Zoom to"),
      ),
    );
  }
}

function renderCost(summary) {
  const box = clear($("cost"));
  const m = summary.cost;
  const energy = summary.energy;
  const rows = [];
  if (m) {
    const cur = m.currency;
    rows.push(
      ["GPU-hour price", fmtMoney(m.gpuHourPrice, cur)],
      ["GPU hours", fmtNum(m.gpuHours, 3)],
      ["Active", fmtMoney(m.active, cur)],
      ["Idle", fmtMoney(m.idle, cur)],
      ["Idle (held)", fmtMoney(m.idleHeld, cur)],
      ["Input-bound", fmtMoney(m.inputBound, cur)],
      ["Throttled", fmtMoney(m.throttled, cur)],
      ["Total", fmtMoney(m.total, cur)],
      ["Useful GPU hours", fmtNum(m.usefulGpuHours, 3)],
      ["Per useful GPU hour", fmtMoney(m.perUsefulGpuHour, cur)],
    );
  } else {
    box.append(el("p", { class: "muted" }, "No price for this hardware profile (GPULENS_PRICES)."));
  }
  if (energy) {
    rows.push(["Energy", `${fmtNum(energy.kwh, 3)} kWh (${energy.source}, ${energy.method})`]);
    if (energy.co2eKg !== null) rows.push(["CO₂e", `${fmtNum(energy.co2eKg, 3)} kg`]);
  }
  if (rows.length) {
    box.append(
      el("table", { class: "receipt" }, el("tbody", {}, rows.map(([k, v]) => el("tr", { class: k === "Total" ? "total" : null }, el("th", { scope: "row" }, k), el("td", {}, v))))),
    );
  }
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
    const summary = await api(`/api/v2/external/execution/${encodeURIComponent(state.id)}/summary`);
    state.minStep = Math.max(1, Math.round(summary.stepSeconds || 15));
    state.group.setFindings(summary.findings.map((f) => ({ startMs: parseTime(f.start), endMs: parseTime(f.end), severity: f.severity })));
    renderFindings(summary);
    renderCost(summary);
    renderStats(summary);
    renderPerGpu(summary);
    document.body.dataset.summary = "loaded";
  } catch (e) {
    for (const id of ["findings", "cost", "stats", "per-gpu"]) showError($(id), e);
    document.body.dataset.summary = "error";
  }
}

async function main() {
  if (!requireKey()) return;
  state.id = decodeURIComponent(window.location.pathname.split("/").filter(Boolean).pop() || "");
  document.body.prepend(header(`Execution ${state.id}`));
  document.title = `gpulens – ${state.id}`;
  let execution;
  try {
    execution = await api(`/api/v2/external/execution/${encodeURIComponent(state.id)}`);
  } catch (e) {
    showError($("meta"), e);
    return;
  }
  renderMeta(execution);
  const startMs = parseTime(execution.start_time);
  const endMs = execution.end_time ? parseTime(execution.end_time) : Date.now();
  if (!Number.isFinite(startMs)) {
    showError($("charts"), "This execution has not started: no metrics yet.");
    return;
  }
  state.full = [startMs, endMs];
  buildCharts(startMs, endMs);
  $("reset").addEventListener("click", () => {
    $("reset").disabled = true;
    loadSeries(...state.full).catch((e) => showError($("chart-error"), e));
  });
  const summary = loadSummary();
  try {
    await loadSeries(startMs, endMs);
    document.body.dataset.charts = "drawn";
    performance.mark("gpulens:charts-drawn");
  } catch (e) {
    showError($("chart-error"), e);
  }
  await summary;
}

main();
