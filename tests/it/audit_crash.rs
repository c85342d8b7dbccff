//! A process appending from 32 tasks is killed with SIGKILL: the database it leaves
//! verifies, and every append that was acknowledged is in it.
//!
//! The test binary re-runs itself as the child (selected by an environment variable),
//! so the child is a real separate process using the real library.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::audit_support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use audit_support::*;
use toolgate::audit::{AuditLog, AuditOptions, EventType, NewEvent};

const CHILD_ENV: &str = "TOOLGATE_AUDIT_CRASH_CHILD_DIR";

/// In the child: append forever from 32 tasks, printing each acknowledged seq.
fn crash_child(dir: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut options = AuditOptions::new(std::path::Path::new(dir));
    options.checkpoint_every_events = 50;
    let log = AuditLog::open(options).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    std::thread::spawn(move || {
        let mut out = std::io::stdout().lock();
        for seq in rx {
            writeln!(out, "acked {seq}").unwrap();
            out.flush().unwrap();
        }
    });
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..32 {
            let (log, tx) = (log.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0.. {
                    let mut e = NewEvent::new(EventType::ToolExecuted);
                    e.run_id = Some(format!("run-{t}"));
                    e.call_id = Some(format!("call-{t}-{i}"));
                    let appended = log.append(e).await.unwrap();
                    tx.send(appended.seq).unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
}

/// The test's name, by which the child process (this same test binary) selects it.
const THIS_TEST: &str = "audit_crash::sigkill_while_32_tasks_append_leaves_a_verifiable_log_with_every_acknowledged_event";

/// Run normally, this is the parent: it starts this test binary again as the child
/// (the same test, selected by name, with `CHILD_ENV` set), kills it and checks the log.
#[test]
fn sigkill_while_32_tasks_append_leaves_a_verifiable_log_with_every_acknowledged_event() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        crash_child(&dir);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", THIS_TEST, "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pipe = child.stdout.take().unwrap();
    let mut acked = Vec::new();
    let mut lines = BufReader::new(pipe).lines();
    while acked.len() < 2000 {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(seq) = line.strip_prefix("acked ") {
            acked.push(seq.parse::<u64>().unwrap());
        }
    }
    // SIGKILL: no shutdown, no final checkpoint.
    child.kill().unwrap();
    child.wait().unwrap();
    // Acknowledgements printed before the kill are read too.
    for line in lines.map_while(Result::ok) {
        if let Some(seq) = line.strip_prefix("acked ") {
            acked.push(seq.parse::<u64>().unwrap());
        }
    }
    assert!(
        acked.len() >= 2000,
        "the child acknowledged only {} appends",
        acked.len()
    );

    let db = dir.path().join("audit.db");
    let out = verify(&db, &["--format", "json"]);
    assert_eq!(
        code(&out),
        0,
        "{}{}",
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stored = report["events"].as_u64().unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    for seq in &acked {
        let n: i64 = conn
            .query_row(
                "SELECT count(*) FROM events WHERE seq = ?1",
                [*seq as i64],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 1, "acknowledged seq {seq} is not in the database");
        assert!(*seq <= stored);
    }
    // The gateway can reopen the log and continue the chain.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut options = AuditOptions::new(dir.path());
    options.checkpoint_interval = Duration::from_secs(3600);
    let log = AuditLog::open(options).unwrap();
    let next = rt
        .block_on(log.append(NewEvent::new(EventType::PolicyLoaded)))
        .unwrap();
    assert_eq!(next.seq, stored + 1);
    rt.block_on(log.close()).unwrap();
    assert_eq!(code(&verify(&db, &[])), 0);
}
