// /ui/workloads/{id}: a Run:ai workload's pods and, for the first few pods, charts of a few metric types.

import { ChartGroup, aligned, columns } from "./charts.js";
import { api, clear, el, fmtDuration, fmtTime, header, parseTime, requireKey, showError } from "./common.js";

export const POD_TYPES = [
  ["GPU_UTILIZATION_PER_GPU", "GPU utilization", "percent"],
  ["GPU_MEMORY_USAGE_BYTES_PER_GPU", "GPU memory used", "bytes"],
  ["CPU_USAGE_CORES", "CPU usage", "cores"],
  ["CPU_MEMORY_USAGE_BYTES", "CPU memory used", "bytes"],
];
const CHARTED_PODS = 4;
const SAMPLES = 300;
const $ = (id) => document.getElementById(id);

function label(labels) {
  if (!labels) return "pod";
  return Object.entries(labels).map(([k, v]) => `${k} ${v}`).join(", ") || "pod";
}

function podWindow(pod) {
  const start = parseTime(pod.startedAt || pod.createdAt);
  const end = pod.completedAt ? parseTime(pod.completedAt) : Date.now();
  return [start, end];
}

async function podCharts(workloadId, pod, box) {
  const [startMs, endMs] = podWindow(pod);
  const section = el("section", { class: "pod", data: { pod: pod.id } }, el("h2", {}, `Pod ${pod.name}`));
  box.append(section);
  if (!Number.isFinite(startMs)) {
    section.append(el("p", { class: "muted" }, "Not started: no metrics."));
    return;
  }
  const status = el("p", { class: "muted" }, `${fmtTime(startMs)} – ${fmtTime(endMs)}`);
  const charts = el("div", { class: "charts" });
  section.append(status, charts);
  const load = async (a, b) => {
    const body = await api(`/api/v1/workloads/${encodeURIComponent(workloadId)}/pods/${encodeURIComponent(pod.id)}/metrics`, {
      metricType: POD_TYPES.map(([t]) => t),
      start: new Date(a).toISOString(),
      end: new Date(b).toISOString(),
      numberOfSamples: SAMPLES,
    });
    const byType = new Map();
    for (const m of body.measurements || []) {
      const list = byType.get(m.type) || [];
      list.push(m);
      byType.set(m.type, list);
    }
    return byType;
  };
  const group = new ChartGroup(`pod-${pod.id}`, async (a, b) => {
    const byType = await load(a, b);
    group.setRange(a, b);
    POD_TYPES.forEach(([type], i) => {
      const ms = byType.get(type) || [];
      const labels = group.charts[i].series.length - 1;
      const data = ms.length ? aligned(ms.map((m) => columns(m.values))) : [[]];
      while (data.length < labels + 1) data.push(new Array(data[0].length).fill(null));
      group.update(i, data.slice(0, labels + 1));
    });
  });
  group.setRange(startMs, endMs);
  const byType = await load(startMs, endMs);
  for (const [type, title, unit] of POD_TYPES) {
    const ms = byType.get(type) || [];
    const plot = el("div", { class: "plot" });
    const container = el("section", { class: "chart", data: { metric: type } }, el("h3", {}, title), plot);
    charts.append(container);
    if (!ms.length) {
      group.add(plot, { unit, labels: [title], data: [[], []] });
      plot.append(el("p", { class: "muted" }, "No data."));
      continue;
    }
    group.add(plot, { unit, labels: ms.map((m) => label(m.labels)), data: aligned(ms.map((m) => columns(m.values))) });
  }
  window.addEventListener("resize", () => group.resize());
}

async function main() {
  if (!requireKey()) return;
  const id = decodeURIComponent(window.location.pathname.split("/").filter(Boolean).pop() || "");
  document.body.prepend(header(`Workload ${id}`));
  document.title = `gpulens – workload ${id}`;
  let pods;
  try {
    pods = (await api(`/api/v1/workloads/${encodeURIComponent(id)}/pods`, { limit: 500 })).pods;
  } catch (e) {
    showError($("pods"), e);
    return;
  }
  const head = ["Pod", "Namespace", "Node", "Phase", "GPUs", "Started", "Duration"];
  const rows = pods.map((p) => {
    const [s, e] = podWindow(p);
    return el(
      "tr",
      { data: { pod: p.id } },
      el("td", {}, p.name),
      el("td", {}, p.namespace),
      el("td", {}, p.nodeName || "–"),
      el("td", {}, el("span", { class: `status ${p.k8sPhase}` }, p.k8sPhase)),
      el("td", {}, p.gpus && p.gpus.length ? p.gpus.join(", ") : "by pod labels"),
      el("td", {}, fmtTime(s)),
      el("td", {}, Number.isFinite(s) ? fmtDuration(e - s) : "–"),
    );
  });
  clear($("pods")).append(
    pods.length
      ? el("table", {}, el("thead", {}, el("tr", {}, head.map((h) => el("th", { scope: "col" }, h)))), el("tbody", {}, rows))
      : el("p", { class: "muted" }, "No pods."),
  );
  const box = $("pod-charts");
  for (const pod of pods.slice(0, CHARTED_PODS)) {
    try {
      await podCharts(id, pod, box);
    } catch (e) {
      const err = el("div");
      box.append(err);
      showError(err, e);
    }
  }
  document.body.dataset.charts = "drawn";
}

main();
