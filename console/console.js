// toolgate console: the approver's view (pending approvals, decisions) and a run's
// evidence page, over the same JSON API as every other client. Every value from the
// API is rendered as text (textContent / text nodes); nothing is parsed as HTML.
"use strict";

(function () {
  const TOKEN_KEY = "toolgate.console.token";
  const POLL_MS = 2000;
  const PAGE = 200;

  const $ = (id) => document.getElementById(id);

  // el("td", {class: "mono"}, "text", otherNode): children are text or nodes.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function text(value) {
    if (value === undefined || value === null || value === "") return "-";
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function announce(message) {
    const status = $("status");
    status.textContent = "";
    // A fresh text node so assistive technology reads repeated messages too.
    window.setTimeout(() => { status.textContent = message; }, 30);
  }

  // ---- credential

  function token() {
    return window.sessionStorage.getItem(TOKEN_KEY);
  }

  function signOut(reason) {
    window.sessionStorage.removeItem(TOKEN_KEY);
    stopPolling();
    render();
    if (reason) showRefusal($("sign-in-error"), reason);
  }

  // ---- API

  // Returns {ok, status, body}; body is the parsed JSON answer, or a refusal made up
  // here when the network or the body failed.
  async function api(method, path, body, credential) {
    const headers = { "Accept": "application/json" };
    const tok = credential === undefined ? token() : credential;
    if (tok) headers["Authorization"] = "Bearer " + tok;
    const init = { method, headers, cache: "no-store", credentials: "omit", redirect: "error" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      return { ok: false, status: 0, body: localRefusal("the gateway could not be reached: " + e.message) };
    }
    let parsed;
    try {
      parsed = await response.json();
    } catch (e) {
      parsed = localRefusal("the answer (HTTP " + response.status + ") was not JSON");
    }
    return { ok: response.ok, status: response.status, body: parsed, response };
  }

  // A credential that no longer works at all (expired, revoked): sign out. Other
  // refusals (this credential may not use this view) are shown in the view.
  function expired(answer) {
    const reason = answer.body && answer.body.diagnostic && answer.body.diagnostic.reason;
    return answer.status === 401 &&
      ["credential_missing", "credential_expired", "jwt_expired"].includes(reason);
  }

  function localRefusal(message) {
    return { status: "failed", error_code: "CONSOLE_ERROR", error_message: message, diagnostic: null };
  }

  // Shows the API's structured refusal: error code, reason, message and the fix.
  function showRefusal(box, answer, status) {
    clear(box);
    const d = (answer && answer.diagnostic) || {};
    const head = el("p", {},
      el("strong", {}, "Refused"),
      status ? " (HTTP " + status + ") " : " ",
      el("span", { class: "code", "data-field": "error_code" }, text(answer && answer.error_code)),
      d.reason ? " / " : "",
      d.reason ? el("span", { class: "code", "data-field": "reason" }, d.reason) : null);
    box.append(head, el("p", { "data-field": "message" }, text((answer && answer.error_message) || d.message)));
    if (d.suggested_fix) box.append(el("p", {}, "What to do: " + d.suggested_fix));
    box.hidden = false;
  }

  function hideRefusal(box) {
    clear(box);
    box.hidden = true;
  }

  // ---- views

  let polling = null;
  let view = "approvals";
  let runState = null;

  function stopPolling() {
    if (polling) window.clearTimeout(polling);
    polling = null;
  }

  function route() {
    const hash = window.location.hash.replace(/^#/, "");
    if (hash === "approvals" || hash === "") view = "approvals";
    else if (hash === "runs") view = "runs";
    else if (hash.startsWith("runs/")) view = "run";
    else return; // an in-page anchor (skip link): keep the view
    render();
  }

  function render() {
    const signedIn = !!token();
    $("sign-in").hidden = signedIn;
    $("nav").hidden = !signedIn;
    $("who").hidden = !signedIn;
    for (const id of ["approvals", "runs", "run"]) $(id).hidden = !signedIn || view !== id;
    for (const [id, name] of [["nav-approvals", "approvals"], ["nav-runs", "runs"]]) {
      const current = view === name || (view === "run" && name === "runs");
      if (current) $(id).setAttribute("aria-current", "page");
      else $(id).removeAttribute("aria-current");
    }
    stopPolling();
    if (!signedIn) {
      $("token").focus();
      return;
    }
    if (view === "approvals") pollApprovals();
    else if (view === "runs") loadRuns();
    else if (view === "run") {
      const id = decodeURIComponent(window.location.hash.replace(/^#runs\//, ""));
      loadRun(id);
    }
  }

  // ---- sign in

  async function signIn(event) {
    event.preventDefault();
    const candidate = $("token").value;
    const button = $("sign-in-button");
    button.disabled = true;
    hideRefusal($("sign-in-error"));
    // Any valid credential may read the loaded policy versions: the cheapest check.
    const answer = await api("GET", "/v1/policy", undefined, candidate || null);
    button.disabled = false;
    if (!answer.ok) {
      showRefusal($("sign-in-error"), answer.body, answer.status);
      announce("Sign in refused: " + text(answer.body.error_message));
      $("token").focus();
      return;
    }
    window.sessionStorage.setItem(TOKEN_KEY, candidate);
    $("token").value = "";
    $("who-text").textContent = "Signed in";
    announce("Signed in");
    render();
    $("main").focus();
  }

  // ---- approvals (docs/api.md, "The approval object")

  let lastPending = null;
  const RECENT = 20;

  async function pollApprovals() {
    stopPolling();
    await loadApprovals();
    if (view === "approvals" && token()) polling = window.setTimeout(pollApprovals, POLL_MS);
  }

  function approvalsOf(body) {
    return body && Array.isArray(body.approvals) ? body.approvals : [];
  }

  async function loadApprovals() {
    const pending = await api("GET", "/v1/approvals?status=pending&limit=200");
    if (expired(pending)) return signOut(pending.body);
    if (!pending.ok) {
      showRefusal($("approvals-error"), pending.body, pending.status);
      return;
    }
    hideRefusal($("approvals-error"));
    renderPending(approvalsOf(pending.body));
    // Recent decisions: approved (and since used) and denied approvals, newest decision
    // first; each list read newest first, so a long-lived gateway shows its latest.
    const decided = [];
    for (const status of ["approved", "used", "denied"]) {
      const query = "/v1/approvals?order=newest&limit=200&status=" + status;
      const answer = await api("GET", query);
      if (answer.ok) decided.push(...approvalsOf(answer.body));
    }
    renderRecent(decided);
    $("approvals-updated").textContent = "Updated " + new Date().toLocaleTimeString();
  }

  function bindingOf(a) {
    return a.binding || {};
  }

  function decisionsOf(a) {
    return Array.isArray(a.decisions) ? a.decisions : [];
  }

  function requesterText(r) {
    if (!r) return "-";
    return "role " + text(r.role_id) + (r.caller ? " " + JSON.stringify(r.caller) : "");
  }

  function requirementsText(list) {
    if (!Array.isArray(list) || !list.length) return "-";
    return list.map((q) => text(q.owner) + ": " + text(q.quorum) + " of " +
      (Array.isArray(q.approvers) ? q.approvers.join(", ") : text(q.approvers))).join("; ");
  }

  function renderPending(list) {
    const key = list.map((a) => a.approval_id + ":" + decisionsOf(a).length).join(",");
    if (key === lastPending) return; // nothing new: keep what the approver is doing
    if (lastPending !== null) {
      announce(list.length + (list.length === 1 ? " approval pending" : " approvals pending"));
    }
    lastPending = key;
    $("approvals-empty").hidden = list.length > 0;
    // Keep typed reasons and focus across the re-render.
    const ul = $("pending");
    const typed = {};
    for (const t of ul.querySelectorAll("textarea")) typed[t.id] = t.value;
    const focused = document.activeElement && ul.contains(document.activeElement) ? document.activeElement.id : null;
    clear(ul);
    for (const a of list) ul.append(pendingCard(a));
    for (const [id, value] of Object.entries(typed)) {
      const t = document.getElementById(id);
      if (t) t.value = value;
    }
    if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
  }

  function field(dl, name, value) {
    dl.append(el("dt", {}, name), el("dd", { "data-field": name }, text(value)));
  }

  function pendingCard(a) {
    const id = a.approval_id;
    const b = bindingOf(a);
    const li = el("li", { class: "card", "data-approval-id": id });
    const title = el("h3", { id: "ap-" + id }, text(b.tool_name) + " v" + text(b.tool_version));
    const facts = el("dl", { class: "facts" });
    field(facts, "approval", id);
    field(facts, "run", b.run_id);
    field(facts, "role", b.role_id);
    field(facts, "lane", b.lane_id);
    field(facts, "requester", requesterText(a.requester));
    field(facts, "scope", a.scope);
    field(facts, "requested", a.created_at);
    field(facts, "expires", a.expires_at);
    field(facts, "needs", requirementsText(a.requirements));
    const given = decisionsOf(a).map((d) => d.approver + " " + d.decision + "d: " + d.reason);
    if (given.length) field(facts, "decisions so far", given.join("; "));
    field(facts, "call digest", a.call_digest);
    const redaction = a.redaction || "full";
    const args = el("pre", { class: "args", "data-field": "arguments", "aria-label": "arguments" },
      a.arguments === null || a.arguments === undefined
        ? "(not shown: the tool keeps only a hash of its arguments)"
        : JSON.stringify(a.arguments, null, 2));
    const reasonId = "reason-" + id;
    const reason = el("textarea", { id: reasonId, maxlength: "1000" });
    const approve = el("button", { type: "button", class: "approve", id: "approve-" + id }, "Approve");
    const deny = el("button", { type: "button", class: "deny", id: "deny-" + id }, "Deny");
    const error = el("div", { class: "refusal", role: "alert", hidden: true });
    const decide = async (decision) => {
      approve.disabled = deny.disabled = true;
      hideRefusal(error);
      const answer = await api("POST", "/v1/approvals/" + encodeURIComponent(id) + "/decision",
        { decision, reason: reason.value });
      approve.disabled = deny.disabled = false;
      if (!answer.ok) {
        showRefusal(error, answer.body, answer.status);
        announce("Decision refused: " + text(answer.body.error_message));
        return;
      }
      announce((decision === "approve" ? "Approved " : "Denied ") + text(b.tool_name) + " in run " + text(b.run_id));
      lastPending = null;
      await loadApprovals();
      $("approvals-title").focus();
    };
    approve.addEventListener("click", () => decide("approve"));
    deny.addEventListener("click", () => decide("deny"));
    const box = el("div", { class: "decide" },
      el("label", { for: reasonId }, "Reason for the decision (required)"),
      reason,
      el("div", { class: "buttons" }, approve, deny));
    li.setAttribute("aria-labelledby", "ap-" + id);
    li.append(title, facts,
      el("p", {}, "Arguments (as the API shows them; redaction: " + redaction + "):"), args, box, error);
    return li;
  }

  function renderRecent(list) {
    const rows = [];
    for (const a of list) {
      const decisions = decisionsOf(a);
      if (!decisions.length) continue;
      rows.push({ a, last: decisions[decisions.length - 1] });
    }
    rows.sort((x, y) => (x.last.at < y.last.at ? 1 : x.last.at > y.last.at ? -1 : 0));
    const body = $("recent-rows");
    clear(body);
    for (const { a, last } of rows.slice(0, RECENT)) {
      const b = bindingOf(a);
      body.append(el("tr", { "data-approval-id": a.approval_id },
        el("td", { class: "mono" }, text(last.at)),
        el("td", {}, el("span", { class: "badge " + text(a.status) }, text(a.status))),
        el("td", {}, text(b.tool_name)),
        el("td", { class: "mono" }, text(b.run_id)),
        el("td", {}, text(last.approver)),
        el("td", {}, text(last.reason))));
    }
    $("recent").hidden = rows.length === 0;
    $("recent-empty").hidden = rows.length > 0;
  }

  // ---- runs

  async function loadRuns() {
    const answer = await api("GET", "/v1/runs?limit=100");
    if (expired(answer)) return signOut(answer.body);
    const list = $("run-list");
    clear(list);
    if (!answer.ok) {
      showRefusal($("runs-error"), answer.body, answer.status);
      return;
    }
    hideRefusal($("runs-error"));
    for (const run of answer.body.runs || []) {
      list.append(el("li", {},
        el("a", { href: "#runs/" + encodeURIComponent(run.run_id) }, text(run.run_id)),
        " (" + text(run.status) + ", created " + text(run.created_at) + ")"));
    }
  }

  function showRun(event) {
    event.preventDefault();
    const id = $("run-id").value.trim();
    if (id) window.location.hash = "#runs/" + encodeURIComponent(id);
  }

  async function loadRun(id) {
    runState = { id, after: 0 };
    $("run-title").textContent = "Run " + id;
    clear($("timeline-rows"));
    clear($("run-facts"));
    clear($("log-status"));
    $("download-status").textContent = "";
    hideRefusal($("run-error"));
    await loadRunPage();
  }

  async function loadRunPage() {
    const state = runState;
    const answer = await api("GET", "/v1/runs/" + encodeURIComponent(state.id) +
      "/events?limit=" + PAGE + "&after_seq=" + state.after);
    if (expired(answer)) return signOut(answer.body);
    if (state !== runState) return;
    if (!answer.ok) {
      showRefusal($("run-error"), answer.body, answer.status);
      $("more").hidden = true;
      return;
    }
    const body = answer.body;
    if (state.after === 0) renderRunFacts(body);
    const rows = $("timeline-rows");
    for (const e of body.events || []) rows.append(timelineRow(e));
    state.after = body.next_after_seq || state.after;
    $("more").hidden = !body.next_after_seq;
    const n = rows.children.length;
    announce("Run " + state.id + ": " + n + " events shown");
  }

  function renderRunFacts(body) {
    const facts = $("run-facts");
    const run = body.run || {};
    field(facts, "run", body.run_id);
    field(facts, "status", run.status);
    field(facts, "scope", run.scope);
    field(facts, "created", run.created_at);
    field(facts, "policy versions", run.policy_versions);
    const log = body.log || {};
    const cp = body.checkpoint;
    const status = $("log-status");
    clear(status);
    const verdict = log.verified
      ? el("span", { class: "badge verified", "data-field": "log" }, "log verified")
      : el("span", { class: "badge failed", "data-field": "log" }, "log does NOT verify");
    status.append(el("p", {}, verdict, " ", log.verified
      ? "The whole log (" + text(log.events) + " events) verified: hash chain, Merkle roots and every checkpoint signature."
      : "Problem: " + text(log.problem && (log.problem.kind + (log.problem.seq ? " at seq " + log.problem.seq : "") + ": " + log.problem.message))));
    const dl = el("dl", { class: "facts" });
    field(dl, "newest signed checkpoint", cp ? "size " + cp.size : "none yet");
    field(dl, "root", cp && cp.root);
    field(dl, "key fingerprint", log.key_fingerprint);
    status.append(dl);
  }

  function outcomeOf(ev) {
    const parts = [];
    if (ev.error_code) parts.push(ev.error_code);
    if (ev.reason) parts.push(ev.reason);
    if (ev.failed_step) parts.push("step " + ev.failed_step);
    const d = ev.details || {};
    if (d.message) parts.push(d.message);
    if (d.by) parts.push("by " + text(d.by));
    if (d.reason) parts.push("reason: " + text(d.reason));
    if (d.status && typeof d.status === "string") parts.push("status " + d.status);
    const approval = d.approval_id || (d.approval && d.approval.approval_id);
    if (approval) parts.push("approval " + text(approval));
    if (ev.execution_time_ms !== undefined && ev.execution_time_ms !== null) parts.push(ev.execution_time_ms + " ms");
    return parts.length ? parts.join(" / ") : "-";
  }

  function timelineRow(e) {
    const ev = e.event || {};
    const call = [ev.tool_name && (ev.tool_name + (ev.tool_version ? " v" + ev.tool_version : "")),
      ev.role_id && ("role " + ev.role_id), ev.lane_id && ("lane " + ev.lane_id)].filter(Boolean).join(", ");
    const title = e.status === "verified"
      ? "included in the signed checkpoint of size " + e.checkpoint_size + " (inclusion proof checked)"
      : e.status === "pending" ? "after the newest signed checkpoint" : "not verified";
    return el("tr", { "data-seq": e.seq, "data-status": e.status },
      el("td", { class: "mono" }, text(e.seq)),
      el("td", { class: "mono" }, text(ev.timestamp_utc)),
      el("td", {}, text(ev.type)),
      el("td", {}, call || "-", ev.call_id ? el("div", { class: "hint mono" }, ev.call_id) : null),
      el("td", {}, outcomeOf(ev)),
      el("td", {}, el("span", { class: "badge " + e.status, title }, e.status)));
  }

  async function download() {
    const id = runState && runState.id;
    if (!id) return;
    const button = $("download");
    button.disabled = true;
    $("download-status").textContent = "Preparing the export bundle (the log is verified first)...";
    const answer = await api("GET", "/v1/runs/" + encodeURIComponent(id) + "/export");
    button.disabled = false;
    if (!answer.ok) {
      $("download-status").textContent = "";
      showRefusal($("run-error"), answer.body, answer.status);
      return;
    }
    const blob = new Blob([JSON.stringify(answer.body)], { type: "application/json" });
    const url = URL.createObjectURL(blob);
    const a = el("a", { href: url, download: "toolgate-run-" + id + "-export.json" });
    document.body.append(a);
    a.click();
    a.remove();
    window.setTimeout(() => URL.revokeObjectURL(url), 10000);
    $("download-status").textContent = "Downloaded the export bundle of run " + id + " (" +
      text(answer.body.events) + " events). Verify it offline: python3 verify_export.py BUNDLE --key-fingerprint " +
      text(answer.body.key_fingerprint);
  }

  // ---- start

  document.addEventListener("DOMContentLoaded", () => {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => { signOut(null); announce("Signed out"); });
    $("run-form").addEventListener("submit", showRun);
    $("download").addEventListener("click", download);
    $("refresh-run").addEventListener("click", () => runState && loadRun(runState.id));
    $("more").addEventListener("click", loadRunPage);
    $("approvals-title").setAttribute("tabindex", "-1");
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible" && view === "approvals" && token()) pollApprovals();
    });
    window.addEventListener("hashchange", route);
    if (token()) $("who-text").textContent = "Signed in";
    route();
  });
})();
