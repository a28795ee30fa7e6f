// GET /: the sign-in form, then the caller's executions (history) and running workloads.

import {
  ApiError, api, apiKey, clear, eachLimited, el, fmtDuration, fmtMoney, fmtNum, header, parseTime, showError,
  signIn, signOut,
} from "./common.js";

const SUMMARIES = 20; // executions whose summary (utilization, cost, findings) is fetched, newest first
const $ = (id) => document.getElementById(id);

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
    el("td", { class: "util" }, "…"),
    el("td", { class: "cost" }, "…"),
    el("td", { class: "findings" }, "…"),
  );
}

async function fillSummary(tr, id) {
  const cells = { util: tr.querySelector(".util"), cost: tr.querySelector(".cost"), findings: tr.querySelector(".findings") };
  try {
    const s = await api(`/api/v2/external/execution/${encodeURIComponent(id)}/summary`);
    const util = s.stats.gpuUtilizationPercent;
    cells.util.textContent = util && util.mean !== null ? `${fmtNum(util.mean)} %` : "–";
    cells.cost.textContent = s.cost ? fmtMoney(s.cost.total, s.cost.currency) : "–";
    const counts = new Map();
    for (const f of s.findings) {
      const c = counts.get(f.kind) || { n: 0, severity: f.severity };
      c.n += 1;
      if (f.severity === "critical") c.severity = "critical";
      counts.set(f.kind, c);
    }
    clear(cells.findings).append(
      ...[...counts].map(([kind, c]) => el("span", { class: `badge ${c.severity}`, data: { kind }, title: kind }, `${kind.replaceAll("_", " ")}${c.n > 1 ? ` ×${c.n}` : ""}`)),
    );
    if (!counts.size) cells.findings.textContent = "none";
  } catch (e) {
    for (const c of Object.values(cells)) c.textContent = "–";
    cells.findings.textContent = e instanceof ApiError ? `(${e.status})` : "(error)";
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
    api("/api/v2/external/billing/history", { limit: 100 }),
    api("/api/v2/external/workloads/list"),
  ]);
  if (history.status === "rejected" && history.reason instanceof ApiError && history.reason.status === 401) {
    signOut();
    window.location.assign("/");
    return;
  }
  const pending = [];
  if (running.status === "fulfilled") {
    const t = table(running.value, `Running now (${running.value.length})`);
    clear($("running")).append(running.value.length ? t.node : el("p", { class: "muted" }, "Nothing running."));
    t.rows.forEach((tr, i) => pending.push([tr, running.value[i].execution_id]));
  } else showError($("running"), running.reason);
  if (history.status === "fulfilled") {
    const h = history.value;
    const t = table(h.executions, `History (${h.executions.length} of ${h.total_executions})`);
    clear($("history")).append(h.executions.length ? t.node : el("p", { class: "muted" }, "No executions yet."));
    t.rows.slice(0, SUMMARIES).forEach((tr, i) => pending.push([tr, h.executions[i].execution_id]));
    t.rows.slice(SUMMARIES).forEach((tr) => {
      for (const c of tr.querySelectorAll(".util, .cost, .findings")) c.textContent = "";
    });
  } else showError($("history"), history.reason);
  await eachLimited(pending, 3, ([tr, id]) => fillSummary(tr, id));
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
