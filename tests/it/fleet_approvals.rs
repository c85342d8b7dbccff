//! Approvals shared by a fleet (real PostgreSQL, real sidecars), the insider cases:
//! two sidecars' sweepers racing for one expiry write exactly one `approval_expired`,
//! and a row edited to `approved` in PostgreSQL without the fleet key is refused on the
//! retry with a structured reason. With sidecars that ship to the audit hub (issue
//! 38): a used approval's row restored to its pre-use state with its original, valid
//! attestation is refused through either sidecar (the use is in the logs); an expired
//! one extended is refused (the attestation covers the expiry); edited approvers let
//! no drafting agent decide; and a sidecar that stopped without shipping holds the
//! approvals it could have used (fail closed). Also: the approvals list reads the same
//! on SQLite and on PostgreSQL (one query built for both).

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::approvals::{
    SUPERVISOR, approval_policy, approval_policy_with, decide, draft_call, request, send,
    with_approval,
};
use crate::common::postgres::Postgres;
use crate::common::{self, ADMIN, BIN, Server, Start, token};
use crate::fleet_audit::{fleet_key, origin};

fn events(server: &Server, run: &str, kind: &str) -> Vec<Value> {
    let (code, page) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(code, 200, "{page}");
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == kind)
        .cloned()
        .collect()
}

fn reason(body: &Value) -> &str {
    body["diagnostic"]["reason"].as_str().unwrap_or_default()
}

/// A sidecar of the fleet on `pg` with the approval policy (`ttl_s`), the fleet key
/// in `fleet` when given.
fn sidecar(pg: &Postgres, dir: &Path, ttl_s: u64, fleet: Option<&Path>) -> Server {
    let mut start = approval_policy(dir, 1, ttl_s);
    start.args = vec!["--cluster-db".into(), pg.url()];
    if let Some(fleet) = fleet {
        start.args.push("--fleet-key-dir".into());
        start.args.push(fleet.display().to_string());
    }
    Server::start_with(start)
}

#[test]
fn two_sweepers_racing_for_one_expiry_write_one_approval_expired() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (
        sidecar(&pg, tmp.path(), 1, None),
        sidecar(&pg, tmp.path(), 1, None),
    );
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let id = request(&a, &draft_call(&run, "Motion"));
    // An insider holds the approval's row: both sweepers find it due and wait on it
    // at once; when it is let go they race.
    let mut holder = pg.psql_spawn(&format!(
        "BEGIN; SELECT 1 FROM toolgate_approvals WHERE approval_id = '{id}' FOR UPDATE; SELECT pg_sleep(30); COMMIT;"
    ));
    let waiting = || -> u64 {
        pg.psql("SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted")
            .parse()
            .unwrap()
    };
    assert!(
        common::poll_until(Duration::from_secs(20), || waiting() >= 2),
        "the two sweepers did not both wait on the approval"
    );
    pg.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%' AND pid <> pg_backend_pid()",
    );
    assert!(common::poll_until(Duration::from_secs(10), || holder
        .try_wait()
        .unwrap()
        .is_some()));
    let audited = || {
        pg.psql(&format!(
            "SELECT expiry_audited FROM toolgate_approvals WHERE approval_id = '{id}'"
        )) == "t"
    };
    assert!(common::poll_until(Duration::from_secs(20), || audited() && waiting() == 0));
    let count =
        || events(&a, &run, "approval_expired").len() + events(&b, &run, "approval_expired").len();
    assert!(common::poll_until(Duration::from_secs(10), || count() >= 1));
    // Both sweepers were past the row; no second event follows (bounded look).
    assert!(
        !common::poll_until(Duration::from_secs(3), || count() > 1),
        "two sidecars audited the expiry"
    );
    assert_eq!(count(), 1);
    let (code, shown) = b.get(&format!("/v1/approvals/{id}"), Some(SUPERVISOR));
    assert_eq!(
        (code, &shown["status"]),
        (200, &json!("expired")),
        "{shown}"
    );
}

#[test]
fn an_approval_row_edited_to_approved_without_the_fleet_key_is_refused_on_the_retry() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, _) = crate::fleet_audit::fleet_key(tmp.path());
    let (a, b) = (
        sidecar(&pg, tmp.path(), 600, Some(&fleet_dir)),
        sidecar(&pg, tmp.path(), 600, Some(&fleet_dir)),
    );
    let run = a.create_run(json!({"case_id": "C-1001"}));
    // Decided through B (which signs the grant with the fleet key), used through A.
    let honest = draft_call(&run, "Motion");
    let granted = request(&a, &honest);
    let (code, body) = decide(&b, Some(SUPERVISOR), &granted, "approve", "checked");
    assert_eq!(code, 200, "{body}");
    let (code, body) = send(&a, &with_approval(&honest, &granted));
    assert_eq!(code, 200, "{body}");

    // An insider with the database edits a pending approval to approved: with no
    // attestation, then with the valid attestation and decisions of another approval.
    let call = draft_call(&run, "Brief");
    let id = request(&a, &call);
    for attestation in ["NULL", "copied"] {
        let copied = format!(
            "(SELECT record->'attestation' FROM toolgate_approvals WHERE approval_id = '{granted}')"
        );
        pg.psql(&format!(
            "UPDATE toolgate_approvals SET status = 'approved', record = jsonb_set(jsonb_set(record, '{{status}}', '\"approved\"'), '{{decisions}}', \
             (SELECT record->'decisions' FROM toolgate_approvals WHERE approval_id = '{granted}')) \
             || jsonb_build_object('attestation', {}) WHERE approval_id = '{id}'",
            if attestation == "NULL" { "NULL::jsonb" } else { copied.as_str() }
        ));
        for server in [&a, &b] {
            let (code, body) = send(server, &with_approval(&call, &id));
            assert_eq!(code, 403, "{body}");
            assert_eq!(reason(&body), "approval_attestation_invalid", "{body}");
            assert_eq!(body["diagnostic"]["retryable"], false, "{body}");
            assert_eq!(body["diagnostic"]["details"]["approval_id"], id.as_str());
        }
    }
    // Nothing ran under the forged approval; it is still not used.
    let executed =
        events(&a, &run, "tool_executed").len() + events(&b, &run, "tool_executed").len();
    assert_eq!(executed, 1);
    assert_eq!(
        pg.psql(&format!(
            "SELECT status FROM toolgate_approvals WHERE approval_id = '{id}'"
        )),
        "approved"
    );
}

/// The approvals list reads the same through SQLite (one sidecar) and PostgreSQL (a
/// fleet): the same approvals requested and decided on each, then every status filter
/// in both orders, for all runs and for one, walked two at a time.
#[test]
fn the_approvals_list_reads_the_same_on_sqlite_and_on_postgresql() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let single = {
        let dir = tmp.path().join("single");
        let mut start = approval_policy(&dir, 1, 600);
        start.data_dir = Some(dir.join("var"));
        Server::start_with(start)
    };
    let fleet = sidecar(&pg, &tmp.path().join("fleet"), 600, None);
    let statuses = ["", "pending", "approved", "denied", "used", "expired"];
    let mut listings = Vec::new();
    for server in [&single, &fleet] {
        let a = server.create_run(json!({"case_id": "C-1001"}));
        let b = server.create_run(json!({"case_id": "C-1001"}));
        let mut ids = std::collections::HashMap::new();
        for (run, title) in [
            (&a, "a0"),
            (&b, "b0"),
            (&a, "a1"),
            (&a, "a2"),
            (&b, "b1"),
            (&a, "a3"),
            (&a, "a4"),
        ] {
            ids.insert(title, request(server, &draft_call(run, title)));
        }
        for (title, decision) in [("a1", "approve"), ("a2", "deny"), ("a3", "approve")] {
            let (code, body) = decide(server, Some(SUPERVISOR), &ids[title], decision, "ok");
            assert_eq!(code, 200, "{body}");
        }
        let (code, body) = send(server, &with_approval(&draft_call(&a, "a1"), &ids["a1"]));
        assert_eq!(code, 200, "{body}");
        let mut listing = Vec::new();
        for status in statuses {
            for order in ["oldest", "newest"] {
                for run in [None, Some(&a)] {
                    let mut titles = Vec::new();
                    let mut cursor = String::new();
                    loop {
                        let mut path = format!("/v1/approvals?limit=2&order={order}{cursor}");
                        if !status.is_empty() {
                            path.push_str(&format!("&status={status}"));
                        }
                        if let Some(run) = run {
                            path.push_str(&format!("&run_id={run}"));
                        }
                        let (code, page) = server.get(&path, Some(ADMIN));
                        assert_eq!(code, 200, "{path}: {page}");
                        let approvals = page["approvals"].as_array().unwrap();
                        assert!(approvals.len() <= 2, "{page}");
                        for approval in approvals {
                            let title = approval["arguments"]["title"].as_str().unwrap();
                            let shown = approval["status"].as_str().unwrap();
                            assert!(status.is_empty() || shown == status, "{approval}");
                            titles.push(format!("{title}:{shown}"));
                        }
                        match page["next_cursor"].as_str() {
                            Some(next) => cursor = format!("&cursor={next}"),
                            None => break,
                        }
                    }
                    listing.push((status, order, run.is_some(), titles.join(" ")));
                }
            }
        }
        listings.push(listing);
    }
    assert_eq!(listings[0], listings[1]);
    // And what they agree on is right (a few rows by hand).
    let row = |status: &str, order: &str, one_run: bool| {
        listings[0]
            .iter()
            .find(|r| r.0 == status && r.1 == order && r.2 == one_run)
            .unwrap()
            .3
            .clone()
    };
    assert_eq!(
        row("", "oldest", false),
        "a0:pending b0:pending a1:used a2:denied b1:pending a3:approved a4:pending"
    );
    assert_eq!(
        row("pending", "newest", false),
        "a4:pending b1:pending b0:pending a0:pending"
    );
    assert_eq!(row("pending", "oldest", true), "a0:pending a4:pending");
    assert_eq!(row("approved", "oldest", false), "a3:approved");
    assert_eq!(row("used", "newest", true), "a1:used");
    assert_eq!(row("expired", "oldest", false), "");
}

/// A sidecar of the fleet on `pg` that ships its audit log to the hub under `name`'s
/// origin, with `start`'s policy and the fleet key in `fleet`.
fn shipping(pg: &Postgres, start: Start, name: &str, fleet: &Path) -> Server {
    let mut start = start;
    // Beside the policy, so the log outlives the server (`stop_and_verify`).
    start.data_dir = start
        .policy_dir
        .parent()
        .map(|dir| dir.join(format!("var-{name}")));
    start.args = vec![
        "--cluster-db".into(),
        pg.url(),
        "--fleet-key-dir".into(),
        fleet.display().to_string(),
        "--audit-origin".into(),
        origin(name),
        "--hub-ship-interval-ms".into(),
        "100".into(),
    ];
    Server::start_with(start)
}

/// Stops a sidecar and checks the log it left with `toolgate audit verify`.
fn stop_and_verify(server: Server) {
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
}

/// The `approval_store_mismatch` refusal; returns the field it names.
fn mismatch(code: u16, body: &Value) -> String {
    assert_eq!(
        (code, reason(body)),
        (403, "approval_store_mismatch"),
        "{body}"
    );
    assert_eq!(body["diagnostic"]["retryable"], false, "{body}");
    body["diagnostic"]["details"]["field"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Issue 38, finding 2 in a fleet: an approval decided through B (which attests it)
/// and used through A; an insider restores its row to the state before the use, with
/// the original, validly signed attestation. Through A (its own log holds the use) and
/// through B (the hub holds A's use) the retry is refused, and it ran once.
#[test]
fn a_used_approval_row_restored_with_its_attestation_is_refused_through_either_sidecar() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, _) = fleet_key(tmp.path());
    let (a, b) = (
        shipping(&pg, approval_policy(tmp.path(), 1, 600), "a", &fleet_dir),
        shipping(&pg, approval_policy(tmp.path(), 1, 600), "b", &fleet_dir),
    );
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&a, &call);
    let (code, body) = decide(&b, Some(SUPERVISOR), &id, "approve", "checked");
    assert_eq!((code, &body["status"]), (200, &json!("approved")), "{body}");
    let before_use = pg.psql(&format!(
        "SELECT record::text FROM toolgate_approvals WHERE approval_id = '{id}'"
    ));
    assert!(before_use.contains("\"attestation\""), "{before_use}");
    let (code, body) = send(&a, &with_approval(&call, &id));
    assert_eq!(code, 200, "{body}");

    pg.psql(&format!(
        "UPDATE toolgate_approvals SET status = 'approved', record = $${before_use}$$::jsonb WHERE approval_id = '{id}'"
    ));
    let (code, shown) = b.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(
        (code, &shown["status"]),
        (200, &json!("approved")),
        "{shown}"
    );
    for server in [&a, &b] {
        let (code, refused) = send(server, &with_approval(&call, &id));
        assert_eq!(mismatch(code, &refused), "status");
        assert_eq!(refused["diagnostic"]["details"]["log"]["status"], "used");
    }
    let executed =
        events(&a, &run, "tool_executed").len() + events(&b, &run, "tool_executed").len();
    assert_eq!(executed, 1);
    stop_and_verify(a);
    stop_and_verify(b);
}

/// Issue 38, finding 3 in a fleet: an approval that expired is set approved again with
/// a later expiry in the cluster database; its attestation covers the expiry, so the
/// retry through either sidecar is refused.
#[test]
fn an_expired_approval_extended_in_the_cluster_database_is_refused() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, _) = fleet_key(tmp.path());
    let (a, b) = (
        shipping(&pg, approval_policy(tmp.path(), 1, 3), "a", &fleet_dir),
        shipping(&pg, approval_policy(tmp.path(), 1, 3), "b", &fleet_dir),
    );
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&a, &call);
    let (code, body) = decide(&b, Some(SUPERVISOR), &id, "approve", "checked");
    assert_eq!(code, 200, "{body}");
    assert!(
        common::poll_until(Duration::from_secs(30), || {
            events(&a, &run, "approval_expired").len() + events(&b, &run, "approval_expired").len()
                == 1
        }),
        "the approval never expired"
    );
    pg.psql(&format!(
        "UPDATE toolgate_approvals SET status = 'approved', \
         expires_at_ms = (extract(epoch FROM now()) * 1000)::bigint + 3600000, \
         record = record || jsonb_build_object('status', 'approved', \
           'expires_at_ms', (extract(epoch FROM now()) * 1000)::bigint + 3600000, \
           'expires_at', to_char((now() + interval '1 hour') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')) \
         WHERE approval_id = '{id}'"
    ));
    let (code, shown) = a.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(
        (code, &shown["status"]),
        (200, &json!("approved")),
        "{shown}"
    );
    for server in [&a, &b] {
        let (code, refused) = send(server, &with_approval(&call, &id));
        assert_eq!(
            (code, reason(&refused)),
            (403, "approval_attestation_invalid"),
            "{refused}"
        );
    }
    assert!(events(&a, &run, "tool_executed").is_empty());
    assert!(events(&b, &run, "tool_executed").is_empty());
    stop_and_verify(a);
    stop_and_verify(b);
}

/// Issue 38, finding 2's last part in a fleet: the approvers of a pending approval
/// edited in the cluster database to name the drafting agent; its decision through the
/// other sidecar is checked against the requirements the requester's log holds (read
/// from the hub) and refused.
#[test]
fn edited_approvers_in_the_cluster_database_let_no_drafting_agent_decide() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, _) = fleet_key(tmp.path());
    let policy = || approval_policy_with(tmp.path(), "[ops, attorney]", 1, 600);
    let (a, b) = (
        shipping(&pg, policy(), "a", &fleet_dir),
        shipping(&pg, policy(), "b", &fleet_dir),
    );
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let mut call = draft_call(&run, "Motion");
    call["role_id"] = json!("supervisor");
    let id = request(&a, &call);
    pg.psql(&format!(
        "UPDATE toolgate_approvals SET record = jsonb_set(record, '{{requirements,0,approvers}}', \
         '[\"attorney\", \"drafting_agent\", \"ops\"]') WHERE approval_id = '{id}'"
    ));
    let (code, refused) = decide(&b, Some(&token("drafting_agent")), &id, "approve", "fine");
    assert_eq!(mismatch(code, &refused), "requirements");
    assert!(events(&b, &run, "approval_granted").is_empty());
    assert_eq!(events(&b, &run, "approval_decision_refused").len(), 1);
    let (_, shown) = a.get(&format!("/v1/approvals/{id}"), Some(ADMIN));
    assert_eq!(shown["status"], "pending", "{shown}");
    stop_and_verify(a);
    stop_and_verify(b);
}

/// A sidecar that stopped without a word (killed) could hold an unshipped use of any
/// approval requested while it ran: the other sidecars wait for the hub within their
/// bound, then refuse (`approval_evidence_unavailable`, retryable) rather than guess
/// "unused". One stopped gracefully shipped everything and closed its coverage: it is
/// not waited for.
#[test]
fn a_sidecar_gone_without_shipping_holds_the_approvals_it_could_have_used() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, _) = fleet_key(tmp.path());
    let start = || approval_policy(tmp.path(), 1, 600);
    let (a, b) = (
        shipping(&pg, start(), "a", &fleet_dir),
        shipping(&pg, start(), "b", &fleet_dir),
    );
    let (c, d) = (
        shipping(&pg, start(), "c", &fleet_dir),
        shipping(&pg, start(), "d", &fleet_dir),
    );
    let registered = |name: &str| {
        pg.psql(&format!(
            "SELECT count(*) FROM hub_logs WHERE origin = '{}' AND size > 0",
            origin(name)
        )) == "1"
    };
    assert!(common::poll_until(Duration::from_secs(30), || {
        registered("c") && registered("d")
    }));
    c.kill9();
    assert!(d.stop().success());
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&a, &call);
    let started = std::time::Instant::now();
    let (code, refused) = decide(&b, Some(SUPERVISOR), &id, "approve", "checked");
    assert_eq!(
        (code, reason(&refused)),
        (503, "approval_evidence_unavailable"),
        "{refused}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "it did not wait"
    );
    let d = &refused["diagnostic"];
    assert_eq!(d["retryable"], true, "{refused}");
    assert_eq!(
        d["details"]["waiting_for"],
        json!([origin("c")]),
        "{refused}"
    );
    assert!(events(&b, &run, "approval_granted").is_empty());
    stop_and_verify(a);
    stop_and_verify(b);
}

/// The bad input of issue 38 in a fleet: every field of `toolgate_approvals` an insider
/// can edit (in the record, in the row's columns), on an approval in the state where
/// the edit would help; each retry through the other sidecar (which reads the
/// requester's and user's events from the hub) is refused, by the attestation where it
/// covers the field, else naming the field, and nothing more runs.
#[test]
fn every_editable_field_of_the_cluster_database_is_refused_through_the_other_sidecar() {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Pending,
        Approved,
        Used,
    }
    let mismatch_of = |field: &'static str| ("approval_store_mismatch", Some(field));
    let attestation = ("approval_attestation_invalid", None);
    /// The reason expected, and the field it names (a mismatch's).
    type Expected<'a> = (&'a str, Option<&'a str>);
    let rows: [(&str, State, &str, Expected); 11] = [
        (
            "used, reset to approved",
            State::Used,
            "status = 'approved', record = (record - 'used_by_call_id' - 'used_at') || '{\"status\": \"approved\"}'::jsonb",
            mismatch_of("status"),
        ),
        (
            "used, reset to approved in the column only",
            State::Used,
            "status = 'approved'",
            mismatch_of("status"),
        ),
        (
            "used by another call",
            State::Used,
            "record = record || '{\"used_by_call_id\": \"call-forged\"}'::jsonb",
            mismatch_of("used_by_call_id"),
        ),
        (
            "expiry extended",
            State::Approved,
            "expires_at_ms = expires_at_ms + 3600000, record = jsonb_set(record, '{expires_at_ms}', to_jsonb((record->>'expires_at_ms')::bigint + 3600000))",
            attestation,
        ),
        (
            "expiry extended in the column only",
            State::Approved,
            "expires_at_ms = expires_at_ms + 3600000",
            mismatch_of("expires_at"),
        ),
        (
            "quorum changed",
            State::Approved,
            "record = jsonb_set(record, '{requirements,0,quorum}', '2')",
            mismatch_of("requirements"),
        ),
        (
            "an approver added",
            State::Pending,
            "record = jsonb_set(record, '{requirements,0,approvers}', '[\"drafting_agent\", \"ops\", \"research_agent\", \"supervisor\"]')",
            mismatch_of("requirements"),
        ),
        (
            "pending marked approved",
            State::Pending,
            "status = 'approved', record = record || '{\"status\": \"approved\"}'::jsonb",
            attestation,
        ),
        (
            "call digest retargeted",
            State::Approved,
            "call_digest = 'aaaa', record = record || '{\"call_digest\": \"aaaa\"}'::jsonb",
            attestation,
        ),
        (
            "binding retargeted",
            State::Approved,
            "record = jsonb_set(record, '{binding,arguments_sha256}', '\"aaaa\"')",
            mismatch_of("binding"),
        ),
        (
            "another requester",
            State::Approved,
            "record = jsonb_set(record, '{requester,role_id}', '\"supervisor\"')",
            mismatch_of("requester"),
        ),
    ];
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, _) = fleet_key(tmp.path());
    let (a, b) = (
        shipping(&pg, approval_policy(tmp.path(), 1, 600), "a", &fleet_dir),
        shipping(&pg, approval_policy(tmp.path(), 1, 600), "b", &fleet_dir),
    );
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let executed =
        || events(&a, &run, "tool_executed").len() + events(&b, &run, "tool_executed").len();
    for (i, (what, state, set, (expected, field))) in rows.iter().enumerate() {
        let call = draft_call(&run, &format!("Motion {i}"));
        let id = request(&a, &call);
        if *state != State::Pending {
            let (code, body) = decide(&b, Some(SUPERVISOR), &id, "approve", "ok");
            assert_eq!(code, 200, "{what}: {body}");
        }
        if *state == State::Used {
            let (code, body) = send(&a, &with_approval(&call, &id));
            assert_eq!(code, 200, "{what}: {body}");
        }
        let ran = executed();
        pg.psql(&format!(
            "UPDATE toolgate_approvals SET {set} WHERE approval_id = '{id}'"
        ));
        let (code, refused) = send(&b, &with_approval(&call, &id));
        assert_eq!(reason(&refused), *expected, "{what}: {refused}");
        assert_eq!(code, 403, "{what}: {refused}");
        if let Some(field) = field {
            assert_eq!(
                refused["diagnostic"]["details"]["field"], *field,
                "{what}: {refused}"
            );
        }
        assert_eq!(executed(), ran, "{what}: it ran again");
    }
    stop_and_verify(a);
    stop_and_verify(b);
}
