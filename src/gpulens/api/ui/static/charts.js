// Synchronized time-series charts over the vendored uPlot (a global from vendor/uPlot.iife.min.js).
// Every chart of a group shares its cursor and its x range; dragging on one asks `onZoom(minMs, maxMs)`.

import { fmtTime, fmtUnit } from "./common.js";

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];
const SHADE = { critical: "rgba(220, 38, 38, 0.18)", warning: "rgba(234, 179, 8, 0.20)", info: "rgba(37, 99, 235, 0.07)" };

// Points [{timestamp, value}] -> [x seconds[], y[]] (Run:ai sends values as decimal strings).
export function columns(points) {
  const xs = new Array(points.length);
  const ys = new Array(points.length);
  for (let i = 0; i < points.length; i++) {
    xs[i] = Date.parse(points[i].timestamp) / 1000;
    const v = points[i].value === null ? NaN : Number(points[i].value);
    ys[i] = Number.isFinite(v) ? v : null;
  }
  return [xs, ys];
}

// Several labelled series on their own x arrays -> one aligned table (nulls where a series has no point).
export function aligned(seriesList) {
  if (seriesList.length === 1) return [seriesList[0][0], seriesList[0][1]];
  const all = new Set();
  for (const [xs] of seriesList) for (const x of xs) all.add(x);
  const xs = [...all].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const out = [xs];
  for (const [sx, sy] of seriesList) {
    const ys = new Array(xs.length).fill(null);
    for (let i = 0; i < sx.length; i++) ys[index.get(sx[i])] = sy[i];
    out.push(ys);
  }
  return out;
}

function shadePlugin(group) {
  return {
    hooks: {
      drawClear: (u) => {
        const ctx = u.ctx;
        const { top, height } = u.bbox;
        ctx.save();
        for (const f of group.findings) {
          const x0 = u.valToPos(f.startMs / 1000, "x", true);
          const x1 = u.valToPos(f.endMs / 1000, "x", true);
          const left = Math.max(u.bbox.left, Math.min(x0, x1));
          const right = Math.min(u.bbox.left + u.bbox.width, Math.max(x0, x1));
          if (right <= left) continue;
          ctx.fillStyle = SHADE[f.severity] || SHADE.info;
          ctx.fillRect(left, top, Math.max(1, right - left), height);
        }
        ctx.restore();
      },
    },
  };
}

export class ChartGroup {
  constructor(syncKey, onZoom) {
    this.sync = uPlot.sync(syncKey);
    this.onZoom = onZoom;
    this.charts = [];
    this.findings = [];
    this.range = null; // [minS, maxS]
  }

  width(container) {
    return Math.max(280, Math.floor(container.clientWidth || 600));
  }

  // One chart in `container`: `labels` are the series' names, `data` = [xs, ys1, ys2, ...].
  add(container, { unit, labels, data }) {
    const group = this;
    const opts = {
      width: this.width(container),
      height: 180,
      scales: { x: { time: true, range: () => (group.range ? group.range : [null, null]) } },
      series: [
        { value: (u, v) => (v == null ? "–" : fmtTime(v * 1000)) },
        ...labels.map((label, i) => ({
          label,
          stroke: COLORS[i % COLORS.length],
          width: 1.5,
          spanGaps: false,
          points: { show: false },
          value: (u, v) => (v == null ? "–" : fmtUnit(v, unit)),
        })),
      ],
      axes: [{}, { size: 86, values: (u, ticks) => ticks.map((v) => fmtUnit(v, unit)) }],
      cursor: { sync: { key: this.sync.key, setSeries: true }, drag: { x: true, y: false, setScale: false } },
      legend: { live: true },
      plugins: [shadePlugin(group)],
      hooks: {
        setSelect: [
          (u) => {
            if (u.select.width < 3) return;
            const min = u.posToVal(u.select.left, "x");
            const max = u.posToVal(u.select.left + u.select.width, "x");
            u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
            if (group.onZoom && max > min) group.onZoom(min * 1000, max * 1000);
          },
        ],
      },
    };
    const chart = new uPlot(opts, data, container);
    chart.gpulensContainer = container;
    this.charts.push(chart);
    return chart;
  }

  setRange(minMs, maxMs) {
    this.range = [minMs / 1000, maxMs / 1000];
  }

  setFindings(findings) {
    this.findings = findings;
    for (const c of this.charts) c.redraw(false);
  }

  // New data for chart i (same series), redrawn on the group's x range.
  update(i, data) {
    const chart = this.charts[i];
    chart.setData(data, true);
  }

  resize() {
    for (const c of this.charts) c.setSize({ width: this.width(c.gpulensContainer), height: 180 });
  }
}
