// /ui/alerts: the org's live alerts (docs/alerts.md): its rules, its channels (and whether they
// work), and the recent deliveries, a failed one retried with a click.

import {
  api, apiPost, clear, el, fmtTime, header, isAbort, parseTime, requireKey, showError,
} from "./common.js";

const BASE = "/api/v2/external/alerts";
const DELIVERIES = 100; // the newest, as the API lists them
const $ = (id) => document.getElementById(id);

// Leaving the page makes its requests useless: cancel them.
const page = new AbortController();
window.addEventListener("pagehide", () => page.abort());

const when = (text) => (text ? fmtTime(parseTime(text)) : "–");

function table(head, rows) {
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, head.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows),
  );
}

// What to do when a list is empty: a sentence and the API call (or file) that fills it.
function empty(sentence, how) {
  return el("p", { class: "muted none" }, sentence, " ", el("code", {}, how));
}

// -- rules ---------------------------------------------------------------------------------------------

function matchText(match, kind) {
  const pairs = Object.entries(match || {});
  if (pairs.length) return pairs.map(([k, v]) => `${k} = ${v}`).join(", ");
  return kind === "digest" ? "every execution" : "every running execution";
}

function ruleRow(r) {
  let action = r.action ? `stop after ${r.action.after}` : "tell only";
  if (r.kind === "digest") action = `users with ≥ ${r.min_idle_gpu_hours} idle GPU-hours`;
  return el(
    "tr",
    { data: { rule: r.id, kind: r.kind } },
    el("td", {}, r.kind.replaceAll("_", " ")),
    el("td", {}, r.kind === "digest" ? `every ${r.every}` : r.for),
    el("td", {}, el("span", { class: `badge ${r.severity}` }, r.severity)),
    el("td", { data: { field: "action" } }, action),
    el("td", {}, r.channels.join(", ")),
    el("td", { data: { field: "match" } }, matchText(r.match, r.kind)),
    el("td", { class: "muted", title: r.id }, r.source === "file" ? "operator's file" : "API"),
  );
}

function renderRules(rules) {
  $("rules-count").textContent = rules.length ? `(${rules.length})` : "";
  const box = clear($("rules"));
  if (!rules.length) {
    box.append(empty(
      "No rules yet: create one with",
      `POST ${BASE}/rules {"kind": "idle_held", "for": "30m", "channels": ["chn_…"]}`,
    ), el("p", { class: "muted" }, "(a channel first, see below), or list them in the operator's file (GPULENS_ALERTS); docs/alerts.md says how."));
    return;
  }
  box.append(table(["Kind", "For", "Severity", "Action", "Channels", "Match", "Source"], rules.map(ruleRow)));
}

// -- channels ------------------------------------------------------------------------------------------

function channelState(c) {
  if (c.disabled_at) {
    return el("span", { class: "error" }, `disabled since ${when(c.disabled_at)}${c.disabled_reason ? `: ${c.disabled_reason}` : ""}`);
  }
  if (c.failing_since) return el("span", { class: "status pending" }, `failing since ${when(c.failing_since)}`);
  return el("span", { class: "status delivered" }, "working");
}

function channelRow(c) {
  return el(
    "tr",
    { class: c.disabled_at ? "disabled" : null, data: { channel: c.id, disabled: Boolean(c.disabled_at) } },
    el("td", {}, c.id),
    el("td", {}, c.type),
    el("td", { data: { field: "url" } }, el("code", {}, c.url)),
    el("td", { data: { field: "state" } }, channelState(c)),
    el("td", { class: "muted" }, c.source === "file" ? "operator's file" : "API"),
  );
}

function renderChannels(channels) {
  $("channels-count").textContent = channels.length ? `(${channels.length})` : "";
  const box = clear($("channels"));
  if (!channels.length) {
    box.append(empty(
      "No channels yet: add where events go with",
      `POST ${BASE}/channels {"type": "webhook", "url": "<your receiver>"}`,
    ), el("p", { class: "muted" }, "(or type alertmanager, or apprise with any Apprise URL); docs/alerts.md says how."));
    return;
  }
  box.append(table(["Channel", "Type", "URL", "State", "Source"], channels.map(channelRow)));
}

// -- deliveries ----------------------------------------------------------------------------------------

function deliveryCells(tr, d) {
  tr.dataset.status = d.status;
  const retry = d.status === "failed"
    ? el("button", { type: "button", class: "retry", onclick: (ev) => retryDelivery(tr, d, ev.currentTarget) }, "Retry")
    : null;
  const next = d.status === "pending" ? when(d.next_attempt_at) : "–";
  tr.replaceChildren(
    el("td", {}, when(d.created_at)),
    el("td", { data: { field: "status" } }, el("span", { class: `status ${d.status}` }, d.status)),
    el("td", {}, d.channel_id),
    el("td", { class: "muted" }, d.event_id),
    el("td", { data: { field: "attempts" } }, String(d.attempts)),
    el("td", { class: d.last_error ? "error-text" : null, data: { field: "error" } }, d.last_error || "–"),
    el("td", { data: { field: "next" } }, next),
    el("td", { data: { field: "retry" } }, retry),
  );
}

async function retryDelivery(tr, d, button) {
  button.disabled = true;
  try {
    const retried = await apiPost(`${BASE}/deliveries/${encodeURIComponent(d.id)}/retry`, undefined, { signal: page.signal });
    deliveryCells(tr, retried);
  } catch (e) {
    if (isAbort(e)) return;
    button.disabled = false;
    const cell = tr.querySelector('[data-field="retry"]');
    cell.querySelector(".error")?.remove();
    cell.append(el("span", { class: "error", role: "alert" }, e instanceof Error ? e.message : String(e)));
  }
}

function renderDeliveries(deliveries, status) {
  const box = clear($("deliveries"));
  if (!deliveries.length) {
    box.append(el("p", { class: "muted none" }, status
      ? `No ${status} deliveries.`
      : "No deliveries yet: each event a rule fires is delivered to the rule's channels and listed here."));
    return;
  }
  const rows = deliveries.map((d) => {
    const tr = el("tr", { data: { delivery: d.id } });
    deliveryCells(tr, d);
    return tr;
  });
  box.append(table(["Created", "Status", "Channel", "Event", "Attempts", "Last error", "Next attempt", ""], rows));
}

async function loadDeliveries() {
  const status = $("delivery-status").value;
  $("deliveries").setAttribute("aria-busy", "true");
  try {
    const found = await api(`${BASE}/deliveries`, { status: status || undefined, limit: DELIVERIES }, { signal: page.signal });
    renderDeliveries(found, status);
  } catch (e) {
    if (!isAbort(e)) showError($("deliveries"), e);
  } finally {
    $("deliveries").setAttribute("aria-busy", "false");
  }
}

async function main() {
  if (!requireKey()) return;
  document.body.prepend(header("Alerts"));
  $("delivery-status").addEventListener("change", () => loadDeliveries());
  $("deliveries-reload").addEventListener("click", () => loadDeliveries());
  const load = async (path, render, where) => {
    try {
      render(await api(`${BASE}/${path}`, undefined, { signal: page.signal }));
    } catch (e) {
      if (!isAbort(e)) showError($(where), e);
    }
  };
  await Promise.all([load("rules", renderRules, "rules"), load("channels", renderChannels, "channels"), loadDeliveries()]);
  document.body.dataset.alerts = "loaded";
}

main();
