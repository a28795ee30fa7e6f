// GET /: the sign-in form, then the caller's executions (history) and running workloads.

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

async function dashboard() {
  $("signin").hidden = true;
  $("dashboard").hidden = false;
  document.body.prepend(header("Executions"));
  const [history, running] = await Promise.allSettled([
    api("/api/v2/external/billing/history", { limit: 100 }, { signal: page.signal }),
    api("/api/v2/external/workloads/list", {}, { signal: page.signal }),
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
    clear($("history")).append(h.executions.length ? t.node : el("p", { class: "muted" }, "No executions yet."));
    t.rows.forEach((tr, i) => add(tr, h.executions[i]));
  } else showError($("history"), history.reason);
  try {
    await fillSummaries(rows);
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
