//! Human approval bound to the exact call, over real HTTP against the real server:
//! required -> pending -> approved -> retried -> executed, denied, expired, changed
//! arguments, self-approval, quorum, concurrent retries, a restart, and hostile input.
//! Every lifecycle test checks its audit events and that `toolgate audit verify`
//! passes on the log it left.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::demo::Demo;
use common::{ADMIN, BIN, Server, Start, poll_for, token};
use serde_json::{Value, json};

pub(crate) const SUPERVISOR: &str = "demo-supervisor";

/// The demo policy in `dir`, with `draft_document` requiring approval by
/// `drafting_agent` (to try self-approval), the admin `ops` and `supervisor`, with
/// `quorum` and `ttl_s`, and its `/body` argument redacted.
pub(crate) fn approval_policy(dir: &Path, quorum: u32, ttl_s: u64) -> Start {
    approval_policy_with(dir, "[drafting_agent, ops, supervisor]", quorum, ttl_s)
}

/// [`approval_policy`] with `approvers` (a YAML flow list) as `draft_document`'s
/// approvers.
pub(crate) fn approval_policy_with(dir: &Path, approvers: &str, quorum: u32, ttl_s: u64) -> Start {
    let demo = Demo::copy_into(dir);
    let anchor = "    write_targets: [\"data_dir:drafts/{case_id}/\"]\n";
    let block = format!(
        "    approval: {{required: true, approvers: {approvers}, quorum: {quorum}, ttl_s: {ttl_s}}}\n    redaction: {{mode: fields, pointers: [/body]}}\n"
    );
    demo.edit(
        "tools/tool_registry.yaml",
        anchor,
        &format!("{block}{anchor}"),
    );
    Start {
        data_dir: None,
        ..demo.start()
    }
}

fn started(dir: &Path, quorum: u32, ttl_s: u64) -> Server {
    let mut start = approval_policy(dir, quorum, ttl_s);
    start.data_dir = Some(dir.join("var"));
    Server::start_with(start)
}

pub(crate) fn draft_call(run: &str, title: &str) -> Value {
    json!({
        "role_id": "drafting_agent", "run_id": run, "lane_id": "drafting",
        "tool_name": "draft_document",
        "arguments": {"title": title, "body": "The defendant moves <script>alert(1)</script>."},
        "scope": {"case_id": "C-1001"},
    })
}

pub(crate) fn with_approval(call: &Value, approval_id: &str) -> Value {
    let mut call = call.clone();
    call["approval_id"] = json!(approval_id);
    call
}

pub(crate) fn send(server: &Server, call: &Value) -> (u16, Value) {
    let role = call["role_id"].as_str().unwrap();
    server.post("/v1/tool-calls", Some(&token(role)), call)
}

/// Sends a call that needs approval: 409 approval_required; returns the approval id.
pub(crate) fn request(server: &Server, call: &Value) -> String {
    let (code, body) = send(server, call);
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["status"], "denied", "{body}");
    let d = &body["diagnostic"];
    assert_eq!(d["reason"], "approval_required", "{body}");
    assert_eq!(d["retryable"], true, "{body}");
    assert_eq!(d["failed_step"], 8, "{body}");
    assert!(d["details"]["expires_at"].is_string(), "{body}");
    assert!(body["output"].is_null(), "{body}");
    let id = d["details"]["approval_id"].as_str().unwrap().to_string();
    assert_eq!(d["details"]["retry_with"]["approval_id"], id.as_str());
    id
}

pub(crate) fn decide(
    server: &Server,
    token: Option<&str>,
    id: &str,
    decision: &str,
    reason: &str,
) -> (u16, Value) {
    server.post(
        &format!("/v1/approvals/{id}/decision"),
        token,
        &json!({"decision": decision, "reason": reason}),
    )
}

pub(crate) fn events(server: &Server) -> Vec<Value> {
    let (code, body) = server.get("/v1/audit/events?limit=1000", Some(ADMIN));
    assert_eq!(code, 200, "{body}");
    body["events"].as_array().unwrap().clone()
}

pub(crate) fn of_type<'a>(events: &'a [Value], kind: &str, approval_id: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .filter(|e| {
            e["details"]["approval_id"] == approval_id
                || e["details"]["approval"]["approval_id"] == approval_id
        })
        .collect()
}

/// Stops the server and checks the log it left with `toolgate audit verify`.
pub(crate) fn stop_and_verify(server: Server) -> PathBuf {
    let db = server.db();
    assert!(server.stop().success());
    let out = std::process::Command::new(BIN)
        .args(["audit", "verify", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "audit verify failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    db
}

#[test]
fn required_pending_approved_retried_executed() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    // The same call again while pending: the same approval, no second request.
    let (code, again) = send(&server, &call);
    assert_eq!(code, 409);
    assert_eq!(again["diagnostic"]["details"]["approval_id"], id.as_str());
    assert_eq!(again["diagnostic"]["details"]["reused"], true);
    // Retried before a decision: pending.
    let (code, early) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 409, "{early}");
    assert_eq!(early["diagnostic"]["reason"], "approval_pending");

    // The approver sees it pending, with the exact call and the body redacted.
    let (code, list) = server.get("/v1/approvals?status=pending", Some(SUPERVISOR));
    assert_eq!(code, 200, "{list}");
    let listed = list["approvals"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!(listed[0]["approval_id"], id.as_str());
    let (code, shown) = server.get(&format!("/v1/approvals/{id}"), Some(SUPERVISOR));
    assert_eq!(code, 200, "{shown}");
    assert_eq!(shown["status"], "pending");
    assert_eq!(shown["binding"]["run_id"], run.as_str());
    assert_eq!(shown["binding"]["tool_name"], "draft_document");
    assert_eq!(shown["binding"]["tool_version"], "1.0.0");
    assert_eq!(shown["requester"]["role_id"], "drafting_agent");
    assert_eq!(shown["arguments"]["title"], "Motion");
    assert_eq!(shown["arguments"]["body"], "[redacted]", "{shown}");
    assert!(!shown.to_string().contains("defendant moves"), "{shown}");
    assert_eq!(shown["redaction"], "fields");
    assert!(shown["binding"]["policy_versions"]["registry"]["sha256"].is_string());
    // The requester may read its own approval (to poll it).
    let (code, own) = server.get(
        &format!("/v1/approvals/{id}"),
        Some(&token("drafting_agent")),
    );
    assert_eq!((code, &own["status"]), (200, &json!("pending")), "{own}");

    let (code, decided) = decide(
        &server,
        Some(SUPERVISOR),
        &id,
        "approve",
        "checked the motion",
    );
    assert_eq!(code, 200, "{decided}");
    assert_eq!(decided["status"], "approved");
    assert_eq!(decided["decisions"][0]["approver"], "role:supervisor");

    let (code, done) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 200, "{done}");
    assert_eq!(done["status"], "success");
    assert!(done["output"]["draft_id"].is_string(), "{done}");
    // Used once: a second retry is refused.
    let (code, twice) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 403, "{twice}");
    assert_eq!(twice["diagnostic"]["reason"], "approval_used");
    assert_eq!(
        twice["diagnostic"]["details"]["used_by_call_id"],
        done["call_id"]
    );
    let (_, shown) = server.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(shown["status"], "used");
    assert_eq!(shown["used_by_call_id"], done["call_id"]);

    let all = events(&server);
    let requested = of_type(&all, "approval_requested", &id);
    assert_eq!(requested.len(), 1, "{all:#?}");
    let requested = requested[0];
    assert_eq!(requested["run_id"], run.as_str());
    assert_eq!(
        requested["details"]["approval"]["call_digest"],
        shown["call_digest"]
    );
    assert_eq!(
        requested["arguments_hash_sha256"],
        shown["binding"]["arguments_sha256"]
    );
    let granted = of_type(&all, "approval_granted", &id);
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0]["details"]["by"], "role:supervisor");
    assert_eq!(granted[0]["details"]["reason"], "checked the motion");
    assert_eq!(granted[0]["details"]["quorum_met"], true);
    // The first call closed as denied (approval_required), the retry executed under it.
    let denied: Vec<&Value> = all
        .iter()
        .filter(|e| e["type"] == "tool_denied" && e["reason"] == "approval_required")
        .collect();
    assert_eq!(denied.len(), 2, "the first call and its repeat");
    let executed = of_type(&all, "tool_executed", &id);
    assert_eq!(executed.len(), 1);
    assert_eq!(executed[0]["call_id"], done["call_id"]);
    assert_eq!(of_type(&all, "tool_requested", &id).len(), 1);
    stop_and_verify(server);
}

#[test]
fn a_denied_approval_refuses_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    let (code, decided) = decide(&server, Some(ADMIN), &id, "deny", "wrong court");
    assert_eq!(code, 200, "{decided}");
    assert_eq!(decided["status"], "denied");
    assert_eq!(decided["decisions"][0]["approver"], "admin:ops");
    let (code, refused) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 403, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "approval_denied");
    assert_eq!(
        refused["diagnostic"]["details"]["decisions"][0]["reason"],
        "wrong court"
    );
    // A decided approval takes no further decision.
    let (code, again) = decide(&server, Some(SUPERVISOR), &id, "approve", "overrule");
    assert_eq!(code, 409, "{again}");
    assert_eq!(again["diagnostic"]["reason"], "approval_already_decided");
    let all = events(&server);
    let denied = of_type(&all, "approval_denied", &id);
    assert_eq!(denied.len(), 1);
    assert_eq!(denied[0]["details"]["by"], "admin:ops");
    assert_eq!(denied[0]["details"]["reason"], "wrong court");
    assert!(of_type(&all, "tool_requested", &id).is_empty());
    assert!(of_type(&all, "approval_granted", &id).is_empty());
    stop_and_verify(server);
}

#[test]
fn an_undecided_approval_expires_once_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 1);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    // Nobody asks: the sweeper records the expiry.
    let expired = poll_for(Duration::from_secs(20), || {
        let all = events(&server);
        let found: Vec<Value> = of_type(&all, "approval_expired", &id)
            .into_iter()
            .cloned()
            .collect();
        (!found.is_empty()).then_some(found)
    })
    .expect("approval_expired was not recorded");
    assert_eq!(expired[0]["details"]["status_before"], "pending");
    let (code, decided) = decide(&server, Some(SUPERVISOR), &id, "approve", "too late");
    assert_eq!(code, 403, "{decided}");
    assert_eq!(decided["diagnostic"]["reason"], "approval_expired");
    let (code, refused) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 403, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "approval_expired");
    let (_, shown) = server.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(shown["status"], "expired");
    let (_, pending) = server.get("/v1/approvals?status=pending", Some(ADMIN));
    assert_eq!(pending["approvals"], json!([]));
    // A fresh request gets a new approval.
    let fresh = request(&server, &call);
    assert_ne!(fresh, id);
    let all = events(&server);
    assert_eq!(
        of_type(&all, "approval_expired", &id).len(),
        1,
        "audited once"
    );
    assert!(of_type(&all, "approval_granted", &id).is_empty());
    stop_and_verify(server);
}

#[test]
fn changed_arguments_run_or_role_do_not_use_the_approval() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let other_run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    let (code, _) = decide(&server, Some(SUPERVISOR), &id, "approve", "ok");
    assert_eq!(code, 200);

    let changed = with_approval(&draft_call(&run, "Motion to dismiss"), &id);
    let (code, refused) = send(&server, &changed);
    assert_eq!(code, 403, "{refused}");
    assert_eq!(
        refused["diagnostic"]["reason"],
        "approval_arguments_mismatch"
    );
    assert_eq!(refused["diagnostic"]["details"]["mismatch"], "arguments");

    let elsewhere = with_approval(&draft_call(&other_run, "Motion"), &id);
    let (code, refused) = send(&server, &elsewhere);
    assert_eq!(code, 403, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "approval_run_mismatch");

    let mut as_supervisor = with_approval(&call, &id);
    as_supervisor["role_id"] = json!("supervisor");
    let (code, refused) = send(&server, &as_supervisor);
    assert_eq!(code, 403, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "approval_role_mismatch");

    let mut other_scope = with_approval(&call, &id);
    other_scope["scope"]["matter_id"] = json!("M-9");
    let (code, refused) = send(&server, &other_scope);
    assert_eq!(code, 403, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "approval_call_mismatch");

    // None of them used it up: the exact call still runs, once.
    let (code, done) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 200, "{done}");
    let all = events(&server);
    let closing_denials = all
        .iter()
        .filter(|e| {
            e["type"] == "tool_denied" && e["details"]["approval"]["approval_id"] == id.as_str()
        })
        .count();
    assert_eq!(
        closing_denials, 5,
        "the request and the four refused retries each closed once"
    );
    assert_eq!(of_type(&all, "tool_executed", &id).len(), 1);
    stop_and_verify(server);
}

#[test]
fn a_reloaded_policy_voids_the_approval() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    let (code, _) = decide(&server, Some(SUPERVISOR), &id, "approve", "ok");
    assert_eq!(code, 200);
    // Same rules, another version: still a changed policy.
    let registry = dir.path().join("tools/tool_registry.yaml");
    let text = fs::read_to_string(&registry).unwrap();
    fs::write(&registry, format!("{text}\n# reviewed again\n")).unwrap();
    let (code, body) = server.post("/v1/policy/reload", Some(ADMIN), &json!({}));
    assert_eq!(code, 200, "{body}");
    // The run is pinned to the old versions: re-pin it (an admin's reviewed step).
    let (code, body) = server.post(&format!("/v1/runs/{run}/repin"), Some(ADMIN), &json!({}));
    assert_eq!(code, 200, "{body}");
    let (code, refused) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 403, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "approval_policy_changed");
    stop_and_verify(server);
}

#[test]
fn the_requester_never_approves_its_own_call() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    // drafting_agent is a listed approver, but it made the call.
    let (code, refused) = decide(
        &server,
        Some(&token("drafting_agent")),
        &id,
        "approve",
        "mine",
    );
    assert_eq!(code, 403, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "self_approval_refused");
    let (_, shown) = server.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(shown["status"], "pending");
    assert_eq!(shown["decisions"], json!([]));
    let (code, early) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 409, "{early}");
    assert_eq!(early["diagnostic"]["reason"], "approval_pending");
    let all = events(&server);
    assert!(of_type(&all, "approval_granted", &id).is_empty());
    // The attempt is evidence: who tried, what, and why it was refused.
    let tried = of_type(&all, "approval_decision_refused", &id);
    assert_eq!(tried.len(), 1, "{all:?}");
    let d = &tried[0]["details"];
    assert_eq!(d["refused"], "self_approval_refused", "{d}");
    assert_eq!(d["decision"], "approve", "{d}");
    assert_eq!(d["by"]["roles"], json!(["drafting_agent"]), "{d}");
    stop_and_verify(server);
}

#[test]
fn quorum_two_needs_two_distinct_approvers() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 2, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    let (code, first) = decide(&server, Some(SUPERVISOR), &id, "approve", "one");
    assert_eq!(code, 200, "{first}");
    assert_eq!(first["status"], "pending", "one approval of two");
    // The same approver again counts once: refused.
    let (code, again) = decide(&server, Some(SUPERVISOR), &id, "approve", "one again");
    assert_eq!(code, 409, "{again}");
    assert_eq!(again["diagnostic"]["reason"], "approval_already_decided");
    let (code, early) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 409, "{early}");
    assert_eq!(early["diagnostic"]["reason"], "approval_pending");
    let (code, second) = decide(&server, Some(ADMIN), &id, "approve", "two");
    assert_eq!(code, 200, "{second}");
    assert_eq!(second["status"], "approved");
    let (code, done) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 200, "{done}");
    let all = events(&server);
    let granted = of_type(&all, "approval_granted", &id);
    assert_eq!(granted.len(), 2);
    assert_eq!(granted[0]["details"]["quorum_met"], false);
    assert_eq!(granted[1]["details"]["quorum_met"], true);
    stop_and_verify(server);
}

#[test]
fn concurrent_retries_consume_the_approval_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    let (code, _) = decide(&server, Some(ADMIN), &id, "approve", "ok");
    assert_eq!(code, 200);
    let retry = with_approval(&call, &id);
    let barrier = std::sync::Barrier::new(8);
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    send(&server, &retry)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let succeeded = answers.iter().filter(|(c, _)| *c == 200).count();
    assert_eq!(succeeded, 1, "{answers:#?}");
    for (code, body) in answers.iter().filter(|(c, _)| *c != 200) {
        assert_eq!(*code, 403, "{body}");
        assert_eq!(body["diagnostic"]["reason"], "approval_used", "{body}");
    }
    let all = events(&server);
    assert_eq!(of_type(&all, "tool_executed", &id).len(), 1);
    assert_eq!(of_type(&all, "tool_requested", &id).len(), 1);
    stop_and_verify(server);
}

#[test]
fn a_restart_keeps_pending_approvals() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    stop_and_verify(server);

    let server = started(dir.path(), 1, 600);
    let (code, list) = server.get("/v1/approvals?status=pending", Some(ADMIN));
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["approvals"][0]["approval_id"], id.as_str(), "{list}");
    let (code, _) = decide(
        &server,
        Some(SUPERVISOR),
        &id,
        "approve",
        "after the restart",
    );
    assert_eq!(code, 200);
    let (code, done) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 200, "{done}");
    let all = events(&server);
    assert_eq!(of_type(&all, "approval_requested", &id).len(), 1);
    assert_eq!(of_type(&all, "tool_executed", &id).len(), 1);
    stop_and_verify(server);
}

#[test]
fn hostile_decisions_and_ids_get_structured_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    let forged = "apr-00000000-0000-4000-8000-000000000000";

    // No credential, a wrong one.
    for (code, body) in [
        server.get("/v1/approvals", None),
        server.get(&format!("/v1/approvals/{id}"), None),
        decide(&server, None, &id, "approve", "x"),
    ] {
        assert_eq!(code, 401, "{body}");
        assert_eq!(body["diagnostic"]["reason"], "credential_missing", "{body}");
    }
    let (code, body) = decide(&server, Some("not-a-token"), &id, "approve", "x");
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (401, &json!("credential_invalid")),
        "{body}"
    );
    // Unknown and forged ids.
    let (code, body) = decide(&server, Some(SUPERVISOR), forged, "approve", "x");
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (404, &json!("approval_unknown")),
        "{body}"
    );
    let (code, body) = server.get("/v1/approvals/%3Cscript%3E", Some(ADMIN));
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (404, &json!("approval_unknown")),
        "{body}"
    );
    let (code, body) = send(&server, &with_approval(&call, forged));
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (404, &json!("approval_unknown")),
        "{body}"
    );
    let (code, body) = send(&server, &with_approval(&call, "apr-<x>"));
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (400, &json!("request_malformed")),
        "{body}"
    );
    // A non-approver may neither decide nor read it.
    let research = token("research_agent");
    let (code, body) = decide(&server, Some(&research), &id, "approve", "x");
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (403, &json!("approver_not_allowed")),
        "{body}"
    );
    let tried = of_type(&events(&server), "approval_decision_refused", &id)
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(tried.len(), 1, "{tried:?}");
    assert_eq!(tried[0]["details"]["refused"], "approver_not_allowed");
    assert_eq!(
        tried[0]["details"]["by"]["roles"],
        json!(["research_agent"])
    );
    let (code, body) = server.get(&format!("/v1/approvals/{id}"), Some(&research));
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (403, &json!("approver_not_allowed")),
        "{body}"
    );
    let (code, body) = server.get("/v1/approvals", Some(&research));
    assert_eq!((code, &body["approvals"]), (200, &json!([])), "{body}");
    // Bad bodies: huge reason, empty reason, unknown decision, unknown field.
    let huge = "x".repeat(100_000);
    for body in [
        json!({"decision": "approve", "reason": huge}),
        json!({"decision": "approve", "reason": " "}),
        json!({"decision": "approve"}),
        json!({"decision": "maybe", "reason": "x"}),
        json!({"decision": "approve", "reason": "x", "approver": "ops"}),
    ] {
        let (code, answer) = server.post(
            &format!("/v1/approvals/{id}/decision"),
            Some(SUPERVISOR),
            &body,
        );
        assert_eq!(code, 400, "{answer}");
        assert_eq!(
            answer["diagnostic"]["reason"], "request_malformed",
            "{answer}"
        );
    }
    let (code, body) = server.get("/v1/approvals?limit=100000", Some(ADMIN));
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (400, &json!("request_malformed")),
        "{body}"
    );
    let (code, body) = server.get("/v1/approvals?status=maybe", Some(ADMIN));
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (400, &json!("request_malformed")),
        "{body}"
    );
    // Nothing of that decided anything.
    let (_, shown) = server.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(shown["status"], "pending");
    assert_eq!(shown["decisions"], json!([]));
    // A double decision.
    let (code, _) = decide(&server, Some(SUPERVISOR), &id, "approve", "ok");
    assert_eq!(code, 200);
    let (code, body) = decide(&server, Some(ADMIN), &id, "deny", "late");
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (409, &json!("approval_already_decided")),
        "{body}"
    );
    let (code, body) = server.post(&format!("/v1/approvals/{id}"), Some(ADMIN), &json!({}));
    assert_eq!(
        (code, &body["diagnostic"]["reason"]),
        (405, &json!("method_not_allowed")),
        "{body}"
    );
    stop_and_verify(server);
}

#[test]
fn the_demo_court_filing_needs_the_attorney() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(Start {
        data_dir: Some(dir.path().join("var")),
        ..Start::default()
    });
    let run = server.create_run(json!({"case_id": "C-1001", "matter_id": "M-1"}));
    let (code, draft) = server.call(
        "drafting_agent",
        &run,
        "drafting",
        "draft_document",
        json!({"title": "Motion", "body": "The defendant moves."}),
        json!({"case_id": "C-1001"}),
    );
    assert_eq!(code, 200, "{draft}");
    let call = json!({
        "role_id": "filing_agent", "run_id": run, "lane_id": "filing",
        "tool_name": "file_with_court",
        "arguments": {"draft_id": draft["output"]["draft_id"]},
        "scope": {"case_id": "C-1001", "matter_id": "M-1"},
    });
    let id = request(&server, &call);
    // The filing agent itself is no approver, and neither is the supervisor's agent:
    // the demo's approvers are people (the attorney) and the admin.
    for agent in ["filing_agent", "supervisor"] {
        let (code, body) = decide(&server, Some(&token(agent)), &id, "approve", "me");
        assert_eq!(code, 403, "{agent}: {body}");
        assert_eq!(
            body["diagnostic"]["reason"], "approver_not_allowed",
            "{agent}: {body}"
        );
    }
    let (code, body) = decide(
        &server,
        Some(&token("attorney")),
        &id,
        "approve",
        "reviewed the filing",
    );
    assert_eq!(code, 200, "{body}");
    // Approved, it reaches the court (no stand-in court listens here: dependency down).
    let (code, body) = send(&server, &with_approval(&call, &id));
    assert_eq!(body["trace"]["passed_step"], 9, "{body}");
    assert_eq!(
        body["diagnostic"]["reason"], "dependency_down",
        "{code} {body}"
    );
    let all = events(&server);
    assert_eq!(of_type(&all, "tool_requested", &id).len(), 1);
    stop_and_verify(server);
}

/// One JSON-RPC `tools/call` to `/mcp` as drafting_agent.
fn mcp_call(server: &Server, run: &str, params: Value) -> Value {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params});
    let mut resp = agent
        .post(format!("{}/mcp", server.base))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header(
            "Authorization",
            &format!("Bearer {}", token("drafting_agent")),
        )
        .header("X-Toolgate-Role", "drafting_agent")
        .header("X-Toolgate-Run", run)
        .header("X-Toolgate-Lane", "drafting")
        .header(
            "X-Toolgate-Scope",
            &json!({"case_id": "C-1001"}).to_string(),
        )
        .send(body.to_string().as_bytes())
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.body_mut().read_to_string().unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn over_mcp_the_refusal_names_the_approval_and_meta_carries_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let params =
        json!({"name": "draft_document", "arguments": {"title": "Motion", "body": "Text."}});
    let answer = mcp_call(&server, &run, params.clone());
    let result = &answer["result"];
    assert_eq!(result["isError"], true, "{answer}");
    let d = &result["_meta"]["io.toolgate/diagnostic"];
    assert_eq!(d["reason"], "approval_required", "{answer}");
    let id = d["details"]["approval_id"].as_str().unwrap().to_string();
    assert!(result["content"][0]["text"].as_str().unwrap().contains(&id));
    let (code, _) = decide(&server, Some(SUPERVISOR), &id, "approve", "ok");
    assert_eq!(code, 200);
    let mut retry = params.clone();
    retry["_meta"] = json!({"io.toolgate/approval_id": id});
    let answer = mcp_call(&server, &run, retry.clone());
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    // Used: the same retry again is an isError refusal.
    let answer = mcp_call(&server, &run, retry);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert_eq!(
        answer["result"]["_meta"]["io.toolgate/diagnostic"]["reason"],
        "approval_used"
    );
    let all = events(&server);
    assert_eq!(of_type(&all, "tool_executed", &id).len(), 1);
    stop_and_verify(server);
}

/// `toolgate approvals ...` against the server, with `token` in TOOLGATE_TOKEN.
fn cli(server: &Server, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("approvals")
        .args(args)
        .args(["--server", &server.base])
        .env_remove("TOOLGATE_TOKEN");
    if let Some(t) = token {
        cmd.env("TOOLGATE_TOKEN", t);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_cli_lists_shows_and_decides() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let id = request(&server, &draft_call(&run, "Motion"));
    let (code, out, err) = cli(&server, Some(SUPERVISOR), &["list", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(listed["approvals"][0]["approval_id"], id.as_str());
    let (code, out, err) = cli(&server, Some(SUPERVISOR), &["show", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&id) && out.contains("pending"), "{out}");
    assert!(out.contains("[redacted]"), "{out}");
    let (code, _, err) = cli(
        &server,
        Some(SUPERVISOR),
        &["approve", &id, "--reason", "from the cli"],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(&server, Some(ADMIN), &["deny", &id, "--reason", "late"]);
    assert_eq!(code, 1);
    assert!(err.contains("approval_already_decided"), "{err}");
    let (code, _, err) = cli(&server, None, &["list"]);
    assert_eq!(code, 4, "{err}");
    let (code, _, err) = cli(&server, Some("wrong"), &["list"]);
    assert_eq!(code, 1);
    assert!(err.contains("credential_invalid"), "{err}");
    let all = events(&server);
    let granted = of_type(&all, "approval_granted", &id);
    assert_eq!(granted[0]["details"]["reason"], "from the cli");
    stop_and_verify(server);
}

/// With `--format json`, a failure before any answer (no token, nothing listening, an
/// answer that is not the API's JSON) is one JSON object on stdout too, as a refusal is.
#[test]
fn the_cli_answers_json_when_there_is_no_answer_to_show() {
    let json_outcome = |out: &str| -> Value {
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"))
    };
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let (code, out, err) = cli(&server, None, &["list", "--format", "json"]);
    assert_eq!(code, 4, "{err}");
    let outcome = json_outcome(&out);
    assert_eq!(
        (&outcome["status"], &outcome["kind"], &outcome["exit_code"]),
        (&json!("error"), &json!("token"), &json!(4)),
        "{outcome}"
    );
    assert!(err.contains("TOOLGATE_TOKEN"), "{err}");
    // A refusal by the server is its own JSON diagnostic.
    let (code, out, _) = cli(&server, Some("wrong"), &["list", "--format", "json"]);
    assert_eq!(code, 1);
    assert_eq!(
        json_outcome(&out)["diagnostic"]["reason"],
        "credential_invalid"
    );
    stop_and_verify(server);

    // Nothing listening: a port that was just closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    // Something listening that does not speak the API: a plain-text answer.
    let text = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let text_base = format!("http://{}", text.local_addr().unwrap());
    let answering = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut stream, _) = text.accept().unwrap();
        let mut request = [0u8; 4096];
        let _ = stream.read(&mut request).unwrap();
        stream
            .write_all(
                b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 5\r\nconnection: close\r\n\r\noops\n",
            )
            .unwrap();
    });
    for (base, kind) in [(&base, "unreachable"), (&text_base, "answer")] {
        let out = std::process::Command::new(BIN)
            .args(["approvals", "list", "--format", "json", "--server", base])
            .env("TOOLGATE_TOKEN", SUPERVISOR)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let outcome = json_outcome(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(
            (&outcome["status"], &outcome["kind"], &outcome["exit_code"]),
            (&json!("error"), &json!(kind), &json!(1)),
            "{outcome}"
        );
        assert!(
            !outcome["message"].as_str().unwrap().is_empty(),
            "{outcome}"
        );
    }
    answering.join().unwrap();
}

#[test]
fn pending_approvals_per_run_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    for i in 0..32 {
        request(&server, &draft_call(&run, &format!("Motion {i}")));
    }
    let (code, body) = send(&server, &draft_call(&run, "one too many"));
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "approval_limit_reached");
    assert_eq!(body["diagnostic"]["details"]["max_pending_per_run"], 32);
    // Another run still gets its approvals.
    let other = server.create_run(json!({"case_id": "C-1001"}));
    request(&server, &draft_call(&other, "Motion"));
    // Pages are bounded and walk the whole list.
    let (code, page) = server.get("/v1/approvals?status=pending&limit=20", Some(ADMIN));
    assert_eq!(code, 200, "{page}");
    assert_eq!(page["approvals"].as_array().unwrap().len(), 20);
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, rest) = server.get(
        &format!("/v1/approvals?status=pending&limit=20&cursor={cursor}"),
        Some(ADMIN),
    );
    assert_eq!(rest["approvals"].as_array().unwrap().len(), 13, "{rest}");
    assert!(rest["next_cursor"].is_null());
    // Newest first (the console's recent decisions) walks the same list backwards.
    let ids = |page: &Value| -> Vec<String> {
        page["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["approval_id"].as_str().unwrap().to_string())
            .collect()
    };
    let oldest_first: Vec<String> = ids(&page).into_iter().chain(ids(&rest)).collect();
    let mut newest_first = Vec::new();
    let mut cursor = String::new();
    loop {
        let (code, page) = server.get(
            &format!("/v1/approvals?status=pending&order=newest&limit=20{cursor}"),
            Some(ADMIN),
        );
        assert_eq!(code, 200, "{page}");
        newest_first.extend(ids(&page));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(newest_first.len(), 33);
    assert_eq!(
        newest_first,
        oldest_first.iter().rev().cloned().collect::<Vec<_>>()
    );
    let (code, body) = server.get("/v1/approvals?order=sideways", Some(ADMIN));
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "request_malformed");
    stop_and_verify(server);
}

#[test]
fn an_insider_editing_the_approval_store_cannot_grant() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    // Someone with the data directory marks the approval granted in approvals.db.
    let conn = rusqlite::Connection::open(server.data_dir.join("approvals.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let forged = json!([{"approver": "role:supervisor", "decision": "approve", "reason": "forged", "at": "2026-01-01T00:00:00Z"}]);
    let changed = conn
        .execute(
            "UPDATE approvals SET status = 'approved',
                 record = json_set(record, '$.status', 'approved', '$.decisions', json(?2))
             WHERE approval_id = ?1",
            rusqlite::params![id, forged.to_string()],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(conn);
    let (_, shown) = server.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(shown["status"], "approved", "the edit took: {shown}");
    let (code, refused) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 403, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "approval_store_mismatch");
    assert_eq!(refused["diagnostic"]["details"]["field"], "decisions");
    let all = events(&server);
    assert!(
        of_type(&all, "tool_requested", &id).is_empty(),
        "nothing ran"
    );
    assert!(of_type(&all, "tool_executed", &id).is_empty());
    stop_and_verify(server);
}

/// An approval granted for one call, pointed by an insider at another (its binding and
/// digest copied from that call's own pending approval) or given a lower quorum in
/// approvals.db, is not honoured: the log holds what was requested and granted.
#[test]
fn an_insider_cannot_retarget_a_granted_approval_or_lower_its_quorum() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 2, 600);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let granted_call = draft_call(&run, "Motion");
    let granted = request(&server, &granted_call);
    let (code, body) = decide(&server, Some(SUPERVISOR), &granted, "approve", "one of two");
    assert_eq!(code, 200, "{body}");
    let (code, body) = decide(&server, Some(ADMIN), &granted, "approve", "two of two");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "approved", "{body}");
    let other_call = draft_call(&run, "Another motion");
    let other = request(&server, &other_call);

    let conn = rusqlite::Connection::open(server.data_dir.join("approvals.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let record_of = |id: &str| -> Value {
        let text: String = conn
            .query_row(
                "SELECT record FROM approvals WHERE approval_id = ?1",
                [id],
                |r| r.get(0),
            )
            .unwrap();
        serde_json::from_str(&text).unwrap()
    };
    // Retarget: the granted approval now carries the other call's binding and digest.
    let target = record_of(&other);
    let changed = conn
        .execute(
            "UPDATE approvals SET record = json_set(record, '$.binding', json(?2), '$.call_digest', ?3)
             WHERE approval_id = ?1",
            rusqlite::params![
                granted,
                target["binding"].to_string(),
                target["call_digest"].as_str().unwrap()
            ],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let (code, refused) = send(&server, &with_approval(&other_call, &granted));
    assert_eq!(code, 403, "{refused}");
    assert_eq!(
        refused["diagnostic"]["reason"], "approval_store_mismatch",
        "{refused}"
    );
    assert_eq!(refused["diagnostic"]["details"]["field"], "call_digest");

    // A quorum lowered to one: the other call's approval, granted once, and marked
    // approved in the store.
    let (code, body) = decide(&server, Some(SUPERVISOR), &other, "approve", "one of two");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "pending", "{body}");
    let changed = conn
        .execute(
            "UPDATE approvals SET status = 'approved',
                 record = json_set(record, '$.status', 'approved', '$.requirements[0].quorum', 1)
             WHERE approval_id = ?1",
            rusqlite::params![other],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(conn);
    let (code, refused) = send(&server, &with_approval(&other_call, &other));
    assert_eq!(code, 403, "{refused}");
    assert_eq!(
        refused["diagnostic"]["reason"], "approval_store_mismatch",
        "{refused}"
    );
    assert_eq!(refused["diagnostic"]["details"]["field"], "requirements");
    let all = events(&server);
    assert!(
        all.iter()
            .all(|e| e["type"] != "tool_requested" || e["tool_name"] != "draft_document"),
        "nothing ran"
    );
    stop_and_verify(server);
}

/// One role (one agent's credential) cannot fill the whole pending budget: past a
/// quarter of it, its requests are refused, and another role still gets its approval.
#[test]
fn one_role_cannot_use_up_the_pending_approvals_of_every_role() {
    let dir = tempfile::tempdir().unwrap();
    let server = started(dir.path(), 1, 600);
    let mut refused = None;
    'runs: for r in 0..9 {
        let run = server.create_run(json!({"case_id": "C-1001"}));
        for i in 0..32 {
            let (code, body) = send(&server, &draft_call(&run, &format!("Motion {r}-{i}")));
            if code == 429 {
                refused = Some((r * 32 + i, body));
                break 'runs;
            }
            assert_eq!(code, 409, "{body}");
        }
    }
    let (requested, body) = refused.expect("one role filled more than a quarter");
    assert_eq!(requested, 250, "{body}");
    let d = &body["diagnostic"];
    assert_eq!(d["reason"], "approval_limit_reached", "{body}");
    assert_eq!(d["details"]["pending_for_role"], 250, "{body}");
    assert_eq!(d["details"]["max_pending_per_role"], 250, "{body}");
    // Another role is not held up by the first one's requests.
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let mut call = draft_call(&run, "The supervisor's motion");
    call["role_id"] = json!("supervisor");
    let (code, body) = send(&server, &call);
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "approval_required", "{body}");
    stop_and_verify(server);
}
