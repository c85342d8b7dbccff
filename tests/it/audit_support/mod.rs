//! Shared helpers for the audit integration tests: build a real log, tamper with its
//! SQLite file, run the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use toolgate::audit::merkle::leaf_hash;
use toolgate::audit::{AuditLog, AuditOptions, EventType, NewEvent};

pub const CHECKPOINT_EVERY: u64 = 4;

/// Creates `<dir>/audit.db` with `n` events (runs alternate between `run-a` and
/// `run-b`), a checkpoint every 4 events and one at close.
pub fn make_log(dir: &Path, n: u64) -> PathBuf {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut options = AuditOptions::new(dir);
    options.checkpoint_every_events = CHECKPOINT_EVERY;
    options.checkpoint_interval = Duration::from_secs(3600);
    let log = AuditLog::open(options).unwrap();
    rt.block_on(async {
        for i in 1..=n {
            let kind = if i % 3 == 0 {
                EventType::ToolExecuted
            } else {
                EventType::ToolRequested
            };
            let mut e = NewEvent::new(kind);
            e.run_id = Some(if i % 2 == 0 {
                "run-b".into()
            } else {
                "run-a".into()
            });
            e.call_id = Some(format!("call-{i}"));
            e.tool_name = Some("read_document".into());
            // Strings and keys that stress canonical JSON: escapes, non-ASCII, a key
            // above U+FFFF (RFC 8785 sorts keys by UTF-16 code units).
            e.arguments = Some(json!({
                "path": format!("cases/{i}.txt"),
                "note": "caf\u{e9} \u{1}\t\"q\" \u{7f}\u{2028}\u{1F600}",
                "\u{1F600}": 1,
                "\u{FB01}": 2,
                "count": i,
            }));
            e.execution_time_ms = Some(i * 3);
            // Appended one at a time so every event is its own batch.
            log.append(e).await.unwrap();
        }
        log.close().await.unwrap();
    });
    dir.join("audit.db")
}

pub fn toolgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(args)
        .output()
        .unwrap()
}

pub fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn verify(db: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["audit", "verify", "--db", db.to_str().unwrap()];
    args.extend_from_slice(extra);
    toolgate(&args)
}

/// Opens the database as an attacker with file access would: triggers dropped.
pub fn tamper(db: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(
        "DROP TRIGGER events_no_update; DROP TRIGGER events_no_delete;
         DROP TRIGGER checkpoints_no_update; DROP TRIGGER checkpoints_no_delete;",
    )
    .unwrap();
    conn
}

pub fn line_of(conn: &rusqlite::Connection, seq: i64) -> Value {
    let line: String = conn
        .query_row("SELECT line FROM events WHERE seq = ?1", [seq], |r| {
            r.get(0)
        })
        .unwrap();
    serde_json::from_str(&line).unwrap()
}

/// Stores `value` as the line at `seq` with a consistent hash column.
pub fn store_line(conn: &rusqlite::Connection, seq: i64, value: &Value) -> String {
    let line = toolgate::canonical::to_canonical_string(value);
    let hash = hex::encode(leaf_hash(line.as_bytes()));
    conn.execute(
        "UPDATE events SET line = ?1, hash = ?2 WHERE seq = ?3",
        rusqlite::params![line, hash, seq],
    )
    .unwrap();
    hash
}

/// Changes event `from` and recomputes every later line's prev and hash, as a forger
/// without the key would.
pub fn rewrite_chain_from(conn: &rusqlite::Connection, from: i64) {
    let count: i64 = conn
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap();
    let mut prev: Option<String> = None;
    for seq in from..=count {
        let mut value = line_of(conn, seq);
        if seq == from {
            value["arguments"]["path"] = json!("cases/forged.txt");
        }
        if let Some(p) = &prev {
            value["prev"] = json!(p);
        }
        prev = Some(store_line(conn, seq, &value));
    }
}

/// The key fingerprint, as `toolgate audit key` prints it.
pub fn fingerprint(data_dir: &Path) -> String {
    let out = toolgate(&[
        "audit",
        "key",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    value["fingerprint"].as_str().unwrap().to_string()
}
