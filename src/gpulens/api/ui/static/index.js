// GET /: the sign-in form, then the caller's executions (history) and running workloads.
// With filters in the address (the usage page's links: user, project, hostname, hardware_profile, a
// start and end, order=worst) the history lists only those executions (the API filters them), worst
// first: by the GPU-hours their findings cost, from the stored summaries.

import {
  ApiError, api, apiKey, clear, el, fmtDuration, fmtMoney, fmtNum, header, isAbort, parseTime, showError,
  signIn, signOut,
} from "./common.js";

// Every row's figures come from one request (the stored summaries; nothing is computed for the list):
// at most ROWS_PER_REQUEST ids a request. A finished execution whose summary is not stored yet is
// "pending" (the server queues it): asked again after each of RETRY_MS, then left as it is.
const SUMMARIES = "/api/v2/external/execution-summaries";
const ROWS_PER_REQUEST = 100;
const RETRY_MS = [1500, 3000, 6000];
const $ = (id) => document.getElementById(id);
const FILTERS = ["user", "project", "hostname", "hardware_profile", "start", "end"];
const FILTERED_ROWS = 1000; // the API's most in one page

// Leaving the page makes its requests useless: cancel them (the server stops their work too).
const page = new AbortController();
window.addEventListener("pagehide", () => page.abort());

function duration(e) {
  const start = parseTime(e.start_time);
  const end = e.end_time ? parseTime(e.end_time) : Date.now();
  return Number.isFinite(start) ? fmtDuration(end - start) : "–";
}

function row(e) {
  const link = el("a", { href: `/ui/executions/${encodeURIComponent(e.execution_id)}` }, e.execution_id);
  return el(
    "tr",
    { data: { execution: e.execution_id } },
    el("td", {}, link),
    el("td", {}, el("span", { class: `status ${e.status}` }, e.status)),
    el("td", {}, e.hostname || "–"),
    el("td", {}, e.gpus.length ? e.gpus.join(", ") : "all"),
    el("td", {}, duration(e)),
    el("td", { class: "util", data: { field: "meanGpuUtil" } }, "…"),
    el("td", { class: "cost", data: { field: "cost" } }, "…"),
    el("td", { class: "findings", data: { field: "findings" } }, "…"),
  );
}

function cellsOf(tr) {
  return { util: tr.querySelector(".util"), cost: tr.querySelector(".cost"), findings: tr.querySelector(".findings") };
}

// One badge per kind of finding: its worst severity, how many, and what they cost in GPU-hours.
function badge(f) {
  const hours = Number.isFinite(f.gpuHours) && f.gpuHours > 0 ? ` ${fmtNum(f.gpuHours)} GPU-h` : "";
  const label = `${f.kind.replaceAll("_", " ")}${f.count > 1 ? ` ×${f.count}` : ""}${hours}`;
  const title = `${f.count} ${f.kind} finding${f.count > 1 ? "s" : ""} (${f.severity})${hours ? `, ${fmtNum(f.gpuHours, 2)} GPU-hours` : ""}`;
  return el("span", { class: `badge ${f.severity}`, data: { kind: f.kind, gpuHours: f.gpuHours }, title }, label);
}

function fillRow(tr, s) {
  const cells = cellsOf(tr);
  tr.dataset.summary = s.status;
  if (s.status !== "ready") {
    const text = s.status === "pending" ? "pending" : "–";
    for (const c of Object.values(cells)) clear(c).append(el("span", { class: "muted" }, text));
    return;
  }
  tr.dataset.waste = String(s.findings.reduce((acc, f) => acc + (Number.isFinite(f.gpuHours) ? f.gpuHours : 0), 0));
  const util = s.meanGpuUtilizationPercent;
  cells.util.textContent = util !== null && util !== undefined ? `${fmtNum(util)} %` : "–";
  cells.cost.textContent = s.cost ? fmtMoney(s.cost.total, s.cost.currency) : "–";
  clear(cells.findings).append(...s.findings.map(badge));
  if (!s.findings.length) cells.findings.textContent = "none";
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); reject(signal.reason); }, { once: true });
  });
}

// rows: execution id -> { trs, finished }. Fills every row from the stored summaries; re-asks for the
// finished ones still pending a few times, then leaves them.
async function fillSummaries(rows) {
  let ids = [...rows.keys()];
  for (let attempt = 0; ids.length; attempt++) {
    const pending = [];
    for (let i = 0; i < ids.length; i += ROWS_PER_REQUEST) {
      const chunk = ids.slice(i, i + ROWS_PER_REQUEST);
      const body = await api(SUMMARIES, { execution_id: chunk }, { signal: page.signal });
      const found = new Map(body.summaries.map((s) => [s.executionId, s]));
      for (const id of chunk) {
        const s = found.get(id) || { executionId: id, status: "unavailable" };
        for (const tr of rows.get(id).trs) fillRow(tr, s);
        if (s.status === "pending" && rows.get(id).finished) pending.push(id);
      }
    }
    if (attempt >= RETRY_MS.length) break;
    ids = pending;
    if (ids.length) await sleep(RETRY_MS[attempt], page.signal);
  }
}

function table(executions, caption) {
  const head = ["Execution", "Status", "Host", "GPUs", "Duration", "Mean GPU util.", "Cost", "Findings"];
  const rows = executions.map(row);
  return {
    node: el("table", { class: "executions" }, el("caption", {}, caption), el("thead", {}, el("tr", {}, head.map((h) => el("th", { scope: "col" }, h)))), el("tbody", {}, rows)),
    rows,
  };
}

// The address's filters (an empty value: executions without one), or null.
function filters() {
  const q = new URLSearchParams(window.location.search);
  const found = FILTERS.filter((k) => q.has(k));
  if (!found.length) return null;
  return { params: Object.fromEntries(found.map((k) => [k, q.get(k)])), worst: q.get("order") === "worst" };
}

function describe(f) {
  const parts = [];
  for (const k of ["project", "user", "hardware_profile", "hostname"]) {
    if (k in f.params) parts.push(f.params[k] ? `${k.replace("_", " ")} ${f.params[k]}` : `no ${k.replace("_", " ")}`);
  }
  const when = [];
  if (f.params.start) when.push(`from ${f.params.start}`);
  if (f.params.end) when.push(`until ${f.params.end}`);
  return `Executions${parts.length ? ` of ${parts.join(", ")}` : ""}${when.length ? ` that ran ${when.join(" ")}` : ""}${f.worst ? ", worst first (by the GPU-hours their findings cost)" : ""}.`;
}

// Worst first: the most GPU-hours charged to findings first; rows without a stored summary last.
function sortWorst(tbody) {
  const rows = [...tbody.children];
  const waste = (tr) => (tr.dataset.waste === undefined ? -1 : Number(tr.dataset.waste));
  rows.sort((a, b) => waste(b) - waste(a));
  tbody.append(...rows);
}

async function dashboard() {
  $("signin").hidden = true;
  $("dashboard").hidden = false;
  document.body.prepend(header("Executions"));
  const filter = filters();
  if (filter) {
    $("running").closest("section").hidden = true;
    $("history").before(el("p", { id: "filter" }, describe(filter), " ", el("a", { href: "/" }, "All executions")));
  }
  const query = filter ? { ...filter.params, limit: FILTERED_ROWS } : { limit: 100 };
  const [history, running] = await Promise.allSettled([
    api("/api/v2/external/billing/history", query, { signal: page.signal }),
    filter ? Promise.resolve([]) : api("/api/v2/external/workloads/list", {}, { signal: page.signal }),
  ]);
  if (history.status === "rejected" && history.reason instanceof ApiError && history.reason.status === 401) {
    signOut();
    window.location.assign("/");
    return;
  }
  const rows = new Map();
  const add = (tr, e) => {
    const entry = rows.get(e.execution_id) || { trs: [], finished: false };
    entry.trs.push(tr);
    entry.finished ||= !["pending", "starting", "running"].includes(e.status);
    rows.set(e.execution_id, entry);
  };
  if (running.status === "fulfilled") {
    const t = table(running.value, `Running now (${running.value.length})`);
    clear($("running")).append(running.value.length ? t.node : el("p", { class: "muted" }, "Nothing running."));
    t.rows.forEach((tr, i) => add(tr, running.value[i]));
  } else showError($("running"), running.reason);
  if (history.status === "fulfilled") {
    const h = history.value;
    const t = table(h.executions, `History (${h.executions.length} of ${h.total_executions})`);
    clear($("history")).append(h.executions.length ? t.node : el("p", { class: "muted" }, filter ? "No execution matches." : "No executions yet."));
    t.rows.forEach((tr, i) => add(tr, h.executions[i]));
  } else showError($("history"), history.reason);
  try {
    await fillSummaries(rows);
    const tbody = $("history").querySelector("tbody");
    if (filter && filter.worst && tbody) sortWorst(tbody);
  } catch (e) {
    if (isAbort(e)) return;
    for (const { trs } of rows.values()) {
      for (const tr of trs) {
        if (tr.dataset.summary) continue;
        const cells = cellsOf(tr);
        for (const c of Object.values(cells)) c.textContent = "–";
        cells.findings.textContent = e instanceof ApiError ? `(${e.status})` : "(error)";
      }
    }
  }
  document.body.dataset.summaries = "loaded";
}

function main() {
  $("workload-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const id = $("workload-id").value.trim();
    if (id) window.location.assign(`/ui/workloads/${encodeURIComponent(id)}`);
  });
  if (apiKey()) {
    dashboard().catch((e) => showError($("history"), e));
    return;
  }
  $("signin").hidden = false;
  $("signin").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = ev.target.elements.api_key.value.trim();
    if (!key) return;
    signIn(key);
    try {
      await api("/api/v2/external/workloads/list");
    } catch (e) {
      signOut();
      showError($("signin-error"), e instanceof ApiError && e.status === 401 ? "That key was not accepted." : e);
      return;
    }
    const next = sessionStorage.getItem("gpulens.next");
    sessionStorage.removeItem("gpulens.next");
    if (next && next.startsWith("/ui/")) window.location.assign(next);
    else dashboard().catch((err) => showError($("history"), err));
  });
}

main();
