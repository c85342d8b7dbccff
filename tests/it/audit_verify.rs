//! `toolgate audit verify` on real databases tampered with in every way the issue lists:
//! each one is caught, with the right exit code and the seq named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::audit_support;

use audit_support::*;
use serde_json::{Value, json};

const N: u64 = 14;

fn failure(db: &std::path::Path, extra: &[&str]) -> (i32, Value) {
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--format", "json"]);
    let out = verify(db, &args);
    let value: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr)));
    (code(&out), value)
}

#[test]
fn an_untouched_log_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let out = verify(&db, &[]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!("ok: {N} events, head seq {N} hash ")),
        "{text}"
    );
    let (exit, value) = failure(&db, &[]);
    assert_eq!(exit, 0);
    assert_eq!(value["status"], json!("ok"));
    assert_eq!(value["events"], json!(N));
    assert_eq!(value["latest_checkpoint_size"], json!(N));
}

#[test]
fn an_edited_field_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let conn = tamper(&db);
    conn.execute(
        "UPDATE events SET line = replace(line, 'cases/5.txt', 'cases/6.txt') WHERE seq = 5",
        [],
    )
    .unwrap();
    let (exit, v) = failure(&db, &[]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (1, json!("edited"), json!(5)),
        "{v}"
    );
}

#[test]
fn an_edited_field_with_a_recomputed_hash_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let conn = tamper(&db);
    let mut value = line_of(&conn, 5);
    value["tool_name"] = json!("delete_everything");
    store_line(&conn, 5, &value);
    let (exit, v) = failure(&db, &[]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (1, json!("edited"), json!(5)),
        "{v}"
    );
}

#[test]
fn a_deleted_event_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    tamper(&db)
        .execute("DELETE FROM events WHERE seq = 6", [])
        .unwrap();
    let (exit, v) = failure(&db, &[]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (1, json!("missing"), json!(6)),
        "{v}"
    );
}

#[test]
fn an_inserted_event_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let conn = tamper(&db);
    // Make room at seq 7 and put a forged event there, chained to seq 6.
    conn.execute_batch("UPDATE events SET seq = -seq WHERE seq >= 7; UPDATE events SET seq = 1 - seq WHERE seq < 0;").unwrap();
    let mut forged = line_of(&conn, 6);
    let prev: String = conn
        .query_row("SELECT hash FROM events WHERE seq = 6", [], |r| r.get(0))
        .unwrap();
    forged["seq"] = json!(7);
    forged["event_id"] = json!("ev-000000000007");
    forged["prev"] = json!(prev);
    forged["call_id"] = json!("call-forged");
    let line = toolgate::canonical::to_canonical_string(&forged);
    let hash = hex::encode(toolgate::audit::merkle::leaf_hash(line.as_bytes()));
    conn.execute(
        "INSERT INTO events (seq, event_id, type, run_id, ts, line, hash) VALUES (7, 'forged', ?1, ?2, ?3, ?4, ?5)",
        rusqlite::params![forged["type"].as_str(), forged["run_id"].as_str(), forged["timestamp_utc"].as_str(), line, hash],
    )
    .unwrap();
    let (exit, v) = failure(&db, &[]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (1, json!("inserted"), json!(7)),
        "{v}"
    );
}

#[test]
fn swapped_events_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let conn = tamper(&db);
    conn.execute_batch("UPDATE events SET seq = 100 WHERE seq = 3; UPDATE events SET seq = 3 WHERE seq = 9; UPDATE events SET seq = 9 WHERE seq = 100;")
        .unwrap();
    let (exit, v) = failure(&db, &[]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (1, json!("reordered"), json!(3)),
        "{v}"
    );
}

#[test]
fn a_tail_cut_after_a_checkpoint_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    tamper(&db)
        .execute("DELETE FROM events WHERE seq > 10", [])
        .unwrap();
    let (exit, v) = failure(&db, &[]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (2, json!("truncated"), json!(11)),
        "{v}"
    );
}

#[test]
fn a_recomputed_chain_without_the_key_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let conn = tamper(&db);
    rewrite_chain_from(&conn, 6);
    // The chain itself is consistent again...
    // ...but the signed checkpoint at size 8 no longer matches: seq 5..8 are named.
    let (exit, v) = failure(&db, &[]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (1, json!("root_mismatch"), json!(5)),
        "{v}"
    );

    // Replacing the checkpoints with ones signed by another key fails on the signature,
    conn.execute("DELETE FROM checkpoints", []).unwrap();
    let other = toolgate::audit::keys::SignerKey::from_seed("toolgate/audit", [9; 32]).unwrap();
    let note = toolgate::audit::checkpoint::Checkpoint {
        origin: "toolgate/audit".into(),
        size: N,
        root: [0; 32],
    }
    .sign(&other);
    conn.execute("INSERT INTO checkpoints (size, root, note, created_utc, reason) VALUES (?1, ?2, ?3, 'x', 'x')", rusqlite::params![N as i64, hex::encode([0u8; 32]), note])
        .unwrap();
    let (exit, v) = failure(&db, &[]);
    assert_eq!((exit, v["kind"].clone()), (3, json!("signature")), "{v}");

    // and deleting them all still leaves the checkpoints in the sink file, which the
    // log no longer extends (only the sink holds them now: a fork).
    conn.execute("DELETE FROM checkpoints", []).unwrap();
    let (exit, v) = failure(&db, &[]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (2, json!("fork"), json!(5)),
        "{v}"
    );
}

#[test]
fn a_trusted_checkpoint_detects_a_cut_the_log_alone_cannot_show() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    // The auditor kept the newest checkpoint (the last note of the sink file).
    let sink = std::fs::read_to_string(dir.path().join("checkpoints.log")).unwrap();
    let notes = toolgate::audit::checkpoint::split_notes(&sink).unwrap();
    let trusted = dir.path().join("trusted.note");
    std::fs::write(&trusted, notes.last().unwrap()).unwrap();
    // The attacker cuts the tail and every checkpoint after it, and the sink file.
    let conn = tamper(&db);
    conn.execute("DELETE FROM events WHERE seq > 8", [])
        .unwrap();
    conn.execute("DELETE FROM checkpoints WHERE size > 8", [])
        .unwrap();
    std::fs::write(dir.path().join("checkpoints.log"), "").unwrap();
    // The signed head (stored by every commit) still covers the cut events...
    let (exit, v) = failure(&db, &[]);
    assert_eq!((exit, v["kind"].clone()), (2, json!("truncated")), "{v}");
    // ...so the attacker removes it too.
    conn.execute("DELETE FROM signed_head", []).unwrap();
    assert_eq!(
        code(&verify(&db, &[])),
        0,
        "without the trusted checkpoint the cut is invisible"
    );
    let (exit, v) = failure(&db, &["--trusted-checkpoint", trusted.to_str().unwrap()]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (2, json!("truncated"), json!(9)),
        "{v}"
    );
}

#[test]
fn a_trusted_checkpoint_detects_a_fork() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let sink = std::fs::read_to_string(dir.path().join("checkpoints.log")).unwrap();
    let trusted = dir.path().join("trusted.note");
    std::fs::write(
        &trusted,
        toolgate::audit::checkpoint::split_notes(&sink)
            .unwrap()
            .last()
            .unwrap(),
    )
    .unwrap();
    let conn = tamper(&db);
    rewrite_chain_from(&conn, 6);
    conn.execute("DELETE FROM checkpoints WHERE size >= 6", [])
        .unwrap();
    conn.execute("DELETE FROM signed_head", []).unwrap();
    std::fs::write(dir.path().join("checkpoints.log"), "").unwrap();
    // Without the key the rewritten events cannot be signed again: every commit signs
    // its events, so events covered by no signature are themselves the evidence.
    let (exit, v) = failure(&db, &[]);
    assert_eq!(
        (exit, v["kind"].clone(), v["seq"].clone()),
        (1, json!("unsigned"), json!(5)),
        "{v}"
    );
    let (exit, v) = failure(&db, &["--trusted-checkpoint", trusted.to_str().unwrap()]);
    assert_eq!((exit, v["kind"].clone()), (2, json!("fork")), "{v}");
    // An untouched log extends the same trusted checkpoint.
    let clean = tempfile::tempdir().unwrap();
    let clean_db = make_log(clean.path(), N);
    let clean_sink = std::fs::read_to_string(clean.path().join("checkpoints.log")).unwrap();
    let notes = toolgate::audit::checkpoint::split_notes(&clean_sink).unwrap();
    std::fs::write(&trusted, &notes[0]).unwrap();
    let out = verify(
        &clean_db,
        &["--trusted-checkpoint", trusted.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(stdout(&out).contains("extends the trusted checkpoint at size 4"));
}

#[test]
fn a_wrong_key_and_bad_databases_give_their_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let other = tempfile::tempdir().unwrap();
    make_log(other.path(), 1);
    let (exit, v) = failure(
        &db,
        &["--key-dir", other.path().join("keys").to_str().unwrap()],
    );
    assert_eq!((exit, v["kind"].clone()), (3, json!("signature")), "{v}");

    let not_sqlite = dir.path().join("notes.txt");
    std::fs::write(&not_sqlite, "hello").unwrap();
    let out = verify(
        &not_sqlite,
        &["--key-dir", dir.path().join("keys").to_str().unwrap()],
    );
    assert_eq!(code(&out), 4);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not an sqlite database"));
    assert_eq!(code(&verify(&dir.path().join("missing.db"), &[])), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_and_export_read_a_consistent_snapshot_while_the_log_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = toolgate::audit::AuditOptions::new(dir.path());
    options.checkpoint_every_events = 25;
    let log = toolgate::audit::AuditLog::open(options).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appended = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (log, stop, appended) = (log.clone(), stop.clone(), appended.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut e =
                    toolgate::audit::NewEvent::new(toolgate::audit::EventType::ToolRequested);
                e.run_id = Some(format!("run-{}", n % 5));
                log.append(e).await.unwrap();
                n += 1;
                appended.store(n, std::sync::atomic::Ordering::Relaxed);
                // A steady trickle (the load under test, not a wait), so that
                // checkpoints land while verify runs.
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            n
        })
    };
    // Verify starts once the log has events and a checkpoint over them.
    assert!(
        crate::common::poll_until_async(std::time::Duration::from_secs(30), || {
            appended.load(std::sync::atomic::Ordering::Relaxed) > 50
        })
        .await,
        "the writer did not get going"
    );
    let db = dir.path().join("audit.db");
    for round in 0..3 {
        let db = db.clone();
        let out_dir = dir.path().join(format!("export-{round}"));
        let (verified, exported) = tokio::task::spawn_blocking(move || {
            (
                verify(&db, &[]),
                toolgate(&[
                    "audit",
                    "export",
                    "--db",
                    db.to_str().unwrap(),
                    "--format",
                    "jsonl",
                    "--out",
                    out_dir.to_str().unwrap(),
                ]),
            )
        })
        .await
        .unwrap();
        assert_eq!(code(&verified), 0, "{}", stdout(&verified));
        assert_eq!(
            code(&exported),
            0,
            "{}{}",
            stdout(&exported),
            String::from_utf8_lossy(&exported.stderr)
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(writer.await.unwrap() > 0);
    log.close().await.unwrap();
    assert_eq!(code(&verify(&db, &[])), 0);
}

/// Issue 12, scenario 5: the log is cut below a published checkpoint (the stored ones
/// and the head deleted too). The gateway refuses to continue it; a log continued
/// anyway (sequence numbers reused) is reported as a fork (exit 2), not as an edit.
#[test]
fn a_log_cut_below_its_sink_is_refused_and_a_continued_one_is_a_fork() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let conn = tamper(&db);
    conn.execute("DELETE FROM events WHERE seq > 8", [])
        .unwrap();
    conn.execute("DELETE FROM checkpoints WHERE size > 8", [])
        .unwrap();
    conn.execute("DELETE FROM signed_head", []).unwrap();
    drop(conn);
    let open = |sinks: bool| {
        let mut options = toolgate::audit::AuditOptions::new(dir.path());
        options.checkpoint_every_events = 1000;
        if !sinks {
            options.checkpoint_sinks.clear();
        }
        toolgate::audit::AuditLog::open(options)
    };
    // The sink next to the database still holds the checkpoints at 12 and 14.
    let err = open(true).unwrap_err();
    assert!(
        matches!(err, toolgate::audit::AuditError::Diverged { cut: true, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("reuse"), "{err}");
    // Without the sink (an older gateway did this) the cut seqs are reused...
    let log = open(false).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for i in 0..6 {
            let mut e = toolgate::audit::NewEvent::new(toolgate::audit::EventType::RunCreated);
            e.run_id = Some(format!("run-new-{i}"));
            log.append(e).await.unwrap();
        }
        log.close().await.unwrap();
    });
    // ...and verify says the log does not extend what the sink published.
    let (exit, v) = failure(&db, &[]);
    assert_eq!((exit, v["kind"].clone()), (2, json!("fork")), "{v}");
}
