//! The gateway and its audit log under crash and failure: SIGKILL under load leaves a
//! log that verifies with every answered call in it; an audit log that cannot be written
//! refuses calls instead of running them unrecorded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ADMIN, BIN, Server, Start, token};
use serde_json::json;

fn event_ids(db: &std::path::Path) -> BTreeSet<String> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn.prepare("SELECT event_id FROM events").unwrap();
    stmt.query_map([], |row| row.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn verify(db: &std::path::Path) -> (i32, String) {
    let out = std::process::Command::new(BIN)
        .args(["audit", "verify", "--db"])
        .arg(db)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// 32 clients with FULL (group commit on the writer thread), and one client with
/// NORMAL, whose commits are quiet ones on its connection thread (docs/audit.md).
#[rstest::rstest]
#[case::full_32_clients("full", 32)]
#[case::normal_1_client("normal", 1)]
fn sigkill_mid_call_leaves_a_log_that_verifies_with_every_answered_call(
    #[case] durability: &str,
    #[case] callers: usize,
) {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("var");
    let server = Arc::new(Server::start_with(Start {
        data_dir: Some(data_dir.clone()),
        args: vec!["--durability".into(), durability.into()],
        ..Start::default()
    }));
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let answered = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..callers {
        let (server, run, answered, stop) =
            (server.clone(), run.clone(), answered.clone(), stop.clone());
        clients.push(std::thread::spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(10)))
                .build()
                .into();
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(20) {
                let tool = if i % 2 == 0 { "case_lookup" } else { "read_document" };
                let arguments = if i % 2 == 0 { json!({}) } else { json!({"path": "notes.md"}) };
                let body = json!({
                    "role_id": "research_agent", "run_id": run, "lane_id": "research", "tool_name": tool,
                    "arguments": arguments, "scope": {"case_id": "C-1001"},
                });
                let sent = agent
                    .post(format!("{}/v1/tool-calls", server.base))
                    .header("Authorization", &format!("Bearer {}", token("research_agent")))
                    .send(body.to_string().as_bytes());
                // A connection cut by the kill is no answer; only answered calls count.
                let Ok(mut resp) = sent else { break };
                let Ok(text) = resp.body_mut().read_to_string() else { break };
                let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else { break };
                if let Some(id) = value["audit_event_id"].as_str() {
                    answered.lock().unwrap().push(id.to_string());
                }
            }
        }));
    }
    // Let the load build up, then kill the server mid-flight.
    common::poll_until(Duration::from_secs(10), || {
        answered.lock().unwrap().len() >= 300
    });
    common::unsafe_free_kill(server.pid(), "KILL");
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let answered = answered.lock().unwrap().clone();
    assert!(
        answered.len() >= 100,
        "too few calls answered before the kill: {}",
        answered.len()
    );

    let db = data_dir.join("audit.db");
    let (code, report) = verify(&db);
    assert_eq!(code, 0, "the log must verify after SIGKILL: {report}");
    let stored = event_ids(&db);
    let missing: Vec<&String> = answered.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} answered calls have no closing event: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    eprintln!(
        "{} calls answered before SIGKILL; all closing events present; log verifies",
        answered.len()
    );

    // The gateway starts again on the same log and extends it.
    drop(server);
    let server = Server::start_with(Start {
        data_dir: Some(data_dir.clone()),
        ..Start::default()
    });
    let (code, body) = server.look_up_case(&run);
    assert_eq!(code, 200, "{body}");
    assert!(server.stop().success());
    let (code, report) = verify(&db);
    assert_eq!(code, 0, "{report}");
}

/// Both durabilities: with NORMAL a lone call's commits would run on its connection
/// thread (docs/audit.md, "Quiet commits"); a held lock sends them to the writer thread,
/// which waits within its busy timeout and refuses.
#[rstest::rstest]
#[case::full("full")]
#[case::normal("normal")]
fn a_locked_audit_log_refuses_calls_and_runs_nothing(#[case] durability: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("var");
    let server = Server::start_with(Start {
        data_dir: Some(data_dir.clone()),
        args: vec!["--durability".into(), durability.into()],
        ..Start::default()
    });
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let draft = |title: &str| {
        json!({
            "role_id": "drafting_agent", "run_id": run, "lane_id": "drafting", "tool_name": "draft_document",
            "arguments": {"title": title, "body": "Comes now the defendant."}, "scope": {"case_id": "C-1001"},
        })
    };

    // Another process takes the write lock of the database and holds it.
    let holder = rusqlite::Connection::open(data_dir.join("audit.db")).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let (code, body) = server.post(
        "/v1/tool-calls",
        Some(&token("drafting_agent")),
        &draft("Locked out"),
    );
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["status"], "failed");
    assert_eq!(body["diagnostic"]["reason"], "audit_unavailable");
    assert_eq!(
        body["diagnostic"]["failed_step"], 9,
        "refused before anything ran: {body}"
    );
    assert_eq!(body["diagnostic"]["retryable"], true);
    assert!(body["output"].is_null());
    // Nothing was executed: no draft was written.
    let drafts = data_dir.join("drafts/C-1001");
    let written = std::fs::read_dir(&drafts).map(|d| d.count()).unwrap_or(0);
    assert_eq!(
        written, 0,
        "a draft was written while the log could not record it"
    );

    // Released: the same call goes through and is recorded.
    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    let (code, body) = server.post(
        "/v1/tool-calls",
        Some(&token("drafting_agent")),
        &draft("Unlocked"),
    );
    assert_eq!(code, 200, "{body}");
    let (_, events) = server.get(
        &format!("/v1/audit/events?run_id={run}&type=tool_executed"),
        Some(ADMIN),
    );
    assert_eq!(events["events"].as_array().unwrap().len(), 1, "{events}");
    assert!(server.stop().success());
    let (code, report) = verify(&data_dir.join("audit.db"));
    assert_eq!(code, 0, "{report}");
}
