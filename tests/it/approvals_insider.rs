//! Approvals against an insider and against one person posing as two (issue 38,
//! findings 1-3 and the approval API of finding 10), through the real server: a JWT
//! subject whose tokens prove two approver roles meets a quorum of two alone; a used
//! approval reset in `approvals.db` (the demo's court filing, with the stand-in court);
//! an expired one extended there; the approvers of a pending one edited so a drafting
//! agent may decide; every other field an insider can edit, one row each. The audit
//! log is the evidence: each is refused (`approval_store_mismatch`, naming the field),
//! nothing runs twice, and `toolgate audit verify` passes on the log each leaves.
//! Also: a run token polls its own approvals, an `audit_read` admin lists them and is
//! told why it may not decide.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::approvals::{
    SUPERVISOR, approval_policy, approval_policy_with, decide, draft_call, events, of_type,
    request, send, stop_and_verify, with_approval,
};
use crate::common::{self, ADMIN, Server, Start, token};
use crate::two_phase::Court;

/// The credential of the `audit_read` admin [`with_auditor`] adds.
const AUDITOR: &str = "demo-compliance";

/// Opens `approvals.db` beside a server (running or stopped), as an insider would.
fn store(data_dir: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(data_dir.join("approvals.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

/// Runs one `UPDATE` on approval `id`'s row (`?1` is the id); it must change the row.
fn edit(data_dir: &Path, id: &str, sql: &str) {
    let changed = store(data_dir).execute(sql, [id]).unwrap();
    assert_eq!(changed, 1, "{sql}");
}

/// The body is the `approval_store_mismatch` refusal; returns the field it names.
fn mismatch(code: u16, body: &Value) -> String {
    let d = &body["diagnostic"];
    assert_eq!(
        (code, d["reason"].as_str()),
        (403, Some("approval_store_mismatch")),
        "{body}"
    );
    assert_eq!(d["retryable"], false, "{body}");
    assert_eq!(d["failed_step"], 8, "{body}");
    d["details"]["field"].as_str().unwrap().to_string()
}

fn started_in(dir: &Path, start: Start) -> Server {
    let mut start = start;
    start.data_dir = Some(dir.join("var"));
    Server::start_with(start)
}

fn executed(server: &Server, id: &str) -> usize {
    of_type(&events(server), "tool_executed", id).len()
}

/// The counter of store mismatches for `field`, as `/metrics` shows it.
fn mismatches_counted(server: &Server, field: &str) -> u64 {
    let needle = format!("toolgate_approval_store_mismatches_total{{field=\"{field}\"}} ");
    server
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix(needle.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Finding 1: one subject whose tokens prove two approver roles (`groups: [approvers]`,
/// then `groups: [approvers2]`) counts once toward a quorum of two.
#[test]
fn one_jwt_subject_proving_two_approver_roles_meets_a_quorum_of_two_only_once() {
    use crate::jwt::{ISSUER, Jwks, JwksServer, claims, jwks, rsa1, sign};
    let idp = JwksServer::start(Jwks::Serve(jwks(&[rsa1()])));
    let dir = tempfile::tempdir().unwrap();
    let start = approval_policy_with(dir.path(), "[approvers, approvers2]", 2, 600);
    let roles_path = start.policy_dir.join("roles.yaml");
    let roles = std::fs::read_to_string(&roles_path).unwrap();
    let people = |group: &str| {
        format!(
            "  - role_id: {group}\n    description: People who approve drafts.\n    enabled: true\n    lanes: []\n    credential:\n      jwt: {{provider: lab, claim: groups, value: {group}}}\n\n"
        )
    };
    let roles = roles
        .replacen(
            "\nroles:\n",
            &format!(
                "\nidentity_providers:\n  - id: lab\n    issuer: \"{ISSUER}\"\n    audience: {}\n    jwks_uri: \"{}\"\n    algorithms: [RS256]\n\nroles:\n",
                crate::jwt::AUDIENCE,
                idp.url
            ),
            1,
        )
        .replacen(
            "\nadmins:\n",
            &format!("\n{}{}admins:\n", people("approvers"), people("approvers2")),
            1,
        );
    std::fs::write(&roles_path, roles).unwrap();
    let server = started_in(dir.path(), start);
    let jwt = |subject: &str, group: &str| {
        let mut c = claims(subject);
        c["groups"] = json!([group]);
        c["jti"] = json!(format!("jti-{subject}-{group}"));
        sign(&rsa1(), &c)
    };
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    let (code, body) = decide(
        &server,
        Some(&jwt("alice", "approvers")),
        &id,
        "approve",
        "one",
    );
    assert_eq!((code, &body["status"]), (200, &json!("pending")), "{body}");
    // The same person through her other group: the same subject, counted once.
    let (code, body) = decide(
        &server,
        Some(&jwt("alice", "approvers2")),
        &id,
        "approve",
        "one again",
    );
    assert_eq!(code, 409, "{body}");
    assert_eq!(
        body["diagnostic"]["reason"], "approval_already_decided",
        "{body}"
    );
    let (code, body) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "approval_pending", "{body}");
    // A second person meets the quorum.
    let (code, body) = decide(
        &server,
        Some(&jwt("bob", "approvers2")),
        &id,
        "approve",
        "two",
    );
    assert_eq!((code, &body["status"]), (200, &json!("approved")), "{body}");
    let (code, body) = send(&server, &with_approval(&call, &id));
    assert_eq!(code, 200, "{body}");
    let all = events(&server);
    let granted = of_type(&all, "approval_granted", &id);
    let subjects: Vec<&Value> = granted.iter().map(|e| &e["details"]["subject"]).collect();
    assert_eq!(
        subjects,
        [
            &json!(format!("{ISSUER}#alice")),
            &json!(format!("{ISSUER}#bob"))
        ]
    );
    stop_and_verify(server);
}

/// The demo policy and tools in `dir`, the court filing pointed at `court`.
fn demo_with_court(dir: &Path, court: &Court) -> Start {
    let demo = common::demo::Demo::copy_into(dir);
    demo.edit_all("tools/tool_registry.yaml", "127.0.0.1:8799", &court.host);
    demo.start()
}

/// Finding 2: the demo's court filing, approved by the attorney, filed and committed
/// once; its used approval reset to `approved` in `approvals.db` (no key, no edit of
/// the log) on the running server, then again on a restarted one: each retry is
/// refused naming `status`, and the court holds one filing.
#[test]
fn a_used_approval_reset_in_approvals_db_is_refused_and_the_filing_runs_once() {
    let court = Court::start();
    let dir = tempfile::tempdir().unwrap();
    let start = demo_with_court(dir.path(), &court);
    let server = Server::start_with(start.clone());
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
    let filing = json!({
        "role_id": "filing_agent", "run_id": run, "lane_id": "filing",
        "tool_name": "file_with_court",
        "arguments": {"draft_id": draft["output"]["draft_id"]},
        "scope": {"case_id": "C-1001", "matter_id": "M-1"},
    });
    let id = request(&server, &filing);
    let (code, body) = decide(
        &server,
        Some(&token("attorney")),
        &id,
        "approve",
        "reviewed the filing",
    );
    assert_eq!(code, 200, "{body}");
    let (code, prepared) = send(&server, &with_approval(&filing, &id));
    assert_eq!(code, 200, "{prepared}");
    assert_eq!(prepared["details"]["phase"], "prepared", "{prepared}");
    let (code, committed) = server.post(
        &format!(
            "/v1/tool-calls/{}/commit",
            prepared["call_id"].as_str().unwrap()
        ),
        Some(&token("filing_agent")),
        &json!({
            "commit_id": prepared["details"]["commit"]["commit_id"],
            "role_id": "filing_agent", "run_id": run,
        }),
    );
    assert_eq!(code, 200, "{committed}");
    assert_eq!(court.filings().len(), 1);

    let reset = "UPDATE approvals SET status = 'approved', record = json_remove(\
                 json_set(record, '$.status', 'approved'), '$.used_by_call_id', '$.used_at') \
                 WHERE approval_id = ?1";
    edit(&server.data_dir, &id, reset);
    let (_, shown) = server.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(shown["status"], "approved", "the edit took: {shown}");
    let (code, refused) = send(&server, &with_approval(&filing, &id));
    assert_eq!(mismatch(code, &refused), "status");
    let details = &refused["diagnostic"]["details"];
    assert_eq!(details["log"]["status"], "used", "{refused}");
    assert_eq!(
        details["log"]["used_by_call_id"], prepared["call_id"],
        "{refused}"
    );
    assert_eq!(mismatches_counted(&server, "status"), 1);
    // Audited like any refused retry: one closing event, with the reason.
    let all = events(&server);
    let refusal: Vec<&Value> = of_type(&all, "tool_denied", &id)
        .into_iter()
        .filter(|e| e["reason"] == "approval_store_mismatch")
        .collect();
    assert_eq!(refusal.len(), 1, "{all:#?}");
    assert_eq!(of_type(&all, "tool_requested", &id).len(), 1);
    let data_dir = server.data_dir.clone();
    stop_and_verify(server);

    // Stopped: the same edit again, then a restart. The log still holds the use.
    edit(&data_dir, &id, reset);
    let server = Server::start_with(start);
    let (code, refused) = send(&server, &with_approval(&filing, &id));
    assert_eq!(mismatch(code, &refused), "status");
    assert_eq!(court.filings().len(), 1, "{:?}", court.filings());
    assert_eq!(of_type(&events(&server), "tool_requested", &id).len(), 1);
    stop_and_verify(server);
}

/// Finding 3: an approval that expired (its `approval_expired` in the log) is extended
/// and set approved again in `approvals.db` while the server is stopped; after the
/// restart the retry is refused naming `expires_at`, and nothing runs.
#[test]
fn an_expired_approval_extended_in_approvals_db_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = started_in(dir.path(), approval_policy(dir.path(), 1, 3));
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&server, &call);
    let (code, body) = decide(&server, Some(SUPERVISOR), &id, "approve", "ok");
    assert_eq!(code, 200, "{body}");
    assert!(
        common::poll_until(Duration::from_secs(30), || {
            of_type(&events(&server), "approval_expired", &id).len() == 1
        }),
        "the approval never expired"
    );
    let data_dir = server.data_dir.clone();
    stop_and_verify(server);
    let later = json!(common_later_ms());
    edit(
        &data_dir,
        &id,
        &format!(
            "UPDATE approvals SET status = 'approved', expires_at_ms = {later}, \
             record = json_set(record, '$.status', 'approved', '$.expires_at_ms', {later}, \
             '$.expires_at', strftime('%Y-%m-%dT%H:%M:%fZ', {later} / 1000.0, 'unixepoch')) \
             WHERE approval_id = ?1"
        ),
    );
    let server = started_in(dir.path(), approval_policy(dir.path(), 1, 3));
    let (_, shown) = server.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(shown["status"], "approved", "the edit took: {shown}");
    let (code, refused) = send(&server, &with_approval(&call, &id));
    assert_eq!(mismatch(code, &refused), "expires_at");
    assert_eq!(executed(&server, &id), 0);
    stop_and_verify(server);
}

/// An hour from now, in Unix milliseconds.
fn common_later_ms() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    now.as_millis() as i64 + 3_600_000
}

/// Finding 2's last part: the approvers of a pending approval edited in `approvals.db`
/// to name the drafting agent do not let it decide: the decision is checked against
/// the requirements `approval_requested` logged, refused and audited as refused.
#[test]
fn edited_approvers_of_a_pending_approval_do_not_let_a_drafting_agent_decide() {
    let dir = tempfile::tempdir().unwrap();
    let server = started_in(
        dir.path(),
        approval_policy_with(dir.path(), "[ops, attorney]", 1, 600),
    );
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let mut call = draft_call(&run, "Motion");
    call["role_id"] = json!("supervisor");
    let id = request(&server, &call);
    edit(
        &server.data_dir,
        &id,
        "UPDATE approvals SET record = json_set(record, '$.requirements[0].approvers', \
         json('[\"attorney\", \"drafting_agent\", \"ops\"]')) WHERE approval_id = ?1",
    );
    let (code, refused) = decide(
        &server,
        Some(&token("drafting_agent")),
        &id,
        "approve",
        "looks fine to me",
    );
    assert_eq!(mismatch(code, &refused), "requirements");
    let all = events(&server);
    assert!(
        of_type(&all, "approval_granted", &id).is_empty(),
        "{all:#?}"
    );
    let logged = of_type(&all, "approval_decision_refused", &id);
    assert_eq!(logged.len(), 1, "{all:#?}");
    assert_eq!(logged[0]["details"]["refused"], "approval_store_mismatch");
    assert_eq!(
        logged[0]["details"]["by"]["roles"],
        json!(["drafting_agent"])
    );
    let (_, shown) = server.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(shown["status"], "pending", "{shown}");
    assert_eq!(shown["decisions"], json!([]), "{shown}");
    stop_and_verify(server);
}

/// The bad input of issue 38: every field of `approvals.db` an insider can edit (in
/// the record, in the row's columns), on an approval in the state where the edit would
/// help, one row each; each retry is refused naming the field, nothing more runs,
/// each refusal is counted, and the log verifies.
#[test]
fn every_editable_field_of_approvals_db_is_refused_naming_it() {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Pending,
        Approved,
        Used,
    }
    let rows: [(&str, State, &str, &str); 12] = [
        (
            "used, reset to approved",
            State::Used,
            "status = 'approved', record = json_remove(json_set(record, '$.status', 'approved'), '$.used_by_call_id', '$.used_at')",
            "status",
        ),
        (
            "used, reset to approved in the column only",
            State::Used,
            "status = 'approved'",
            "status",
        ),
        (
            "used by another call",
            State::Used,
            "record = json_set(record, '$.used_by_call_id', 'call-forged')",
            "used_by_call_id",
        ),
        (
            "expiry extended",
            State::Approved,
            "expires_at_ms = expires_at_ms + 3600000, record = json_set(record, '$.expires_at_ms', json_extract(record, '$.expires_at_ms') + 3600000, '$.expires_at', strftime('%Y-%m-%dT%H:%M:%fZ', (json_extract(record, '$.expires_at_ms') + 3600000) / 1000.0, 'unixepoch'))",
            "expires_at",
        ),
        (
            "expiry extended in the column only",
            State::Approved,
            "expires_at_ms = expires_at_ms + 3600000",
            "expires_at",
        ),
        (
            "a forged approver's decision",
            State::Pending,
            "status = 'approved', record = json_set(record, '$.status', 'approved', '$.decisions', json('[{\"approver\": \"admin:ops\", \"decision\": \"approve\", \"reason\": \"forged\", \"at\": \"2026-01-01T00:00:00Z\"}]'))",
            "decisions",
        ),
        (
            "pending marked approved",
            State::Pending,
            "status = 'approved', record = json_set(record, '$.status', 'approved')",
            "status",
        ),
        (
            "quorum changed",
            State::Approved,
            "record = json_set(record, '$.requirements[0].quorum', 2)",
            "requirements",
        ),
        (
            "an approver added",
            State::Pending,
            "record = json_set(record, '$.requirements[0].approvers', json('[\"drafting_agent\", \"ops\", \"research_agent\", \"supervisor\"]'))",
            "requirements",
        ),
        (
            "call digest retargeted",
            State::Approved,
            "call_digest = 'aaaa', record = json_set(record, '$.call_digest', 'aaaa')",
            "call_digest",
        ),
        (
            "binding retargeted",
            State::Approved,
            "record = json_set(record, '$.binding.arguments_sha256', 'aaaa')",
            "binding",
        ),
        (
            "another requester",
            State::Approved,
            "record = json_set(record, '$.requester.role_id', 'supervisor')",
            "requester",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let server = started_in(dir.path(), approval_policy(dir.path(), 1, 600));
    let run = server.create_run(json!({"case_id": "C-1001"}));
    for (i, (what, state, set, field)) in rows.iter().enumerate() {
        let call = draft_call(&run, &format!("Motion {i}"));
        let id = request(&server, &call);
        if *state != State::Pending {
            let (code, body) = decide(&server, Some(SUPERVISOR), &id, "approve", "ok");
            assert_eq!(code, 200, "{what}: {body}");
        }
        if *state == State::Used {
            let (code, body) = send(&server, &with_approval(&call, &id));
            assert_eq!(code, 200, "{what}: {body}");
        }
        let ran = executed(&server, &id);
        let before = mismatches_counted(&server, field);
        edit(
            &server.data_dir,
            &id,
            &format!("UPDATE approvals SET {set} WHERE approval_id = ?1"),
        );
        let (code, refused) = send(&server, &with_approval(&call, &id));
        assert_eq!(mismatch(code, &refused), *field, "{what}: {refused}");
        assert_eq!(executed(&server, &id), ran, "{what}: it ran again");
        assert_eq!(mismatches_counted(&server, field), before + 1, "{what}");
    }
    stop_and_verify(server);
}

/// The policy of [`approval_policy`] with an `audit_read` admin (`compliance`).
fn with_auditor(start: Start) -> Start {
    let roles_path = start.policy_dir.join("roles.yaml");
    let mut roles = std::fs::read_to_string(&roles_path).unwrap();
    roles.push_str(&format!(
        "  - admin_id: compliance\n    description: Reads the audit trail only.\n    access: audit_read\n    credential:\n      token_sha256: {}\n",
        common::lab::sha(AUDITOR)
    ));
    std::fs::write(&roles_path, roles).unwrap();
    start
}

/// Finding 10's approval API: a run token polls the approvals its role requested in
/// its run (and retries once one is approved) but decides none; an `audit_read` admin
/// lists and reads every approval and is told, with `details.access`, that it never
/// decides.
#[test]
fn a_run_token_polls_its_own_approvals_and_an_auditor_lists_them_but_neither_decides() {
    let dir = tempfile::tempdir().unwrap();
    let server = started_in(
        dir.path(),
        with_auditor(approval_policy(dir.path(), 1, 600)),
    );
    let (code, created) = server.post(
        "/v1/runs",
        Some(ADMIN),
        &json!({"scope": {"case_id": "C-1001"}, "issue_tokens": [{"role_id": "paralegal_agent"}]}),
    );
    assert_eq!(code, 201, "{created}");
    let run = created["run_id"].as_str().unwrap().to_string();
    let run_token = created["tokens"][0]["token"].as_str().unwrap().to_string();
    let mut call = draft_call(&run, "Engagement letter");
    call["role_id"] = json!("paralegal_agent");
    let (code, body) = server.post("/v1/tool-calls", Some(&run_token), &call);
    assert_eq!(code, 409, "{body}");
    let own = body["diagnostic"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Another role's approval in another run.
    let other_run = server.create_run(json!({"case_id": "C-1001"}));
    let other = request(&server, &draft_call(&other_run, "Someone else's motion"));

    let (code, page) = server.get("/v1/approvals", Some(&run_token));
    assert_eq!(code, 200, "{page}");
    let ids: Vec<&str> = page["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["approval_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [own.as_str()], "{page}");
    let (code, shown) = server.get(&format!("/v1/approvals/{own}"), Some(&run_token));
    assert_eq!(
        (code, &shown["status"]),
        (200, &json!("pending")),
        "{shown}"
    );
    let (code, refused) = server.get(&format!("/v1/approvals/{other}"), Some(&run_token));
    assert_eq!(code, 403, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "approver_not_allowed");
    let (code, refused) = decide(&server, Some(&run_token), &own, "approve", "me");
    assert_eq!(code, 401, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "credential_invalid");
    assert_eq!(
        refused["diagnostic"]["details"]["credential"], "run_token",
        "{refused}"
    );

    let (code, page) = server.get("/v1/approvals", Some(AUDITOR));
    assert_eq!(code, 200, "{page}");
    assert_eq!(page["approvals"].as_array().unwrap().len(), 2, "{page}");
    let (code, shown) = server.get(&format!("/v1/approvals/{other}"), Some(AUDITOR));
    assert_eq!(code, 200, "{shown}");
    let (code, refused) = decide(&server, Some(AUDITOR), &other, "approve", "me");
    assert_eq!(code, 401, "{refused}");
    let d = &refused["diagnostic"];
    assert_eq!(d["reason"], "credential_invalid", "{refused}");
    assert_eq!(d["details"]["access"], "audit_read", "{refused}");
    assert!(
        !refused["error_message"]
            .as_str()
            .unwrap_or_default()
            .contains("not a known credential"),
        "{refused}"
    );

    // Approved, the agent's run token retries and the draft runs.
    let (code, body) = decide(&server, Some(SUPERVISOR), &own, "approve", "ok");
    assert_eq!(code, 200, "{body}");
    let (code, shown) = server.get(&format!("/v1/approvals/{own}"), Some(&run_token));
    assert_eq!(
        (code, &shown["status"]),
        (200, &json!("approved")),
        "{shown}"
    );
    let (code, body) = server.post(
        "/v1/tool-calls",
        Some(&run_token),
        &with_approval(&call, &own),
    );
    assert_eq!(code, 200, "{body}");
    stop_and_verify(server);
}
