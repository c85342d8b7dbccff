//! The audit log through its public API: group commit, durability, the read side,
//! append-only triggers, and the typed errors on bad databases.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use toolgate::audit::{
    AuditError, AuditLog, AuditOptions, Durability, EventFilter, EventType, NewEvent,
};

fn options(dir: &Path) -> AuditOptions {
    let mut options = AuditOptions::new(dir);
    options.checkpoint_interval = Duration::from_secs(3600);
    options.append_timeout = Duration::from_secs(20);
    // As `serve` does: webhook sinks go through the application's HTTP client.
    options.webhooks = Some(std::sync::Arc::new(toolgate::audit::webhook::Webhooks));
    options
}

fn event(run: &str, n: u64) -> NewEvent {
    let mut e = NewEvent::new(EventType::ToolRequested);
    e.run_id = Some(run.to_string());
    e.call_id = Some(format!("call-{n}"));
    e.tool_name = Some("read_document".into());
    e.details.insert("n".into(), json!(n));
    e
}

fn count_rows(db: &Path, table: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_get_gapless_seqs_and_are_all_stored() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.checkpoint_every_events = 100;
    let log = AuditLog::open(opts).unwrap();
    let mut tasks = Vec::new();
    for task in 0..64u64 {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..20u64 {
                got.push(log.append(event(&format!("run-{task}"), i)).await.unwrap());
            }
            got
        }));
    }
    let mut appended = Vec::new();
    for task in tasks {
        appended.extend(task.await.unwrap());
    }
    let mut seqs: Vec<u64> = appended.iter().map(|a| a.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=1280).collect::<Vec<_>>());
    assert_eq!(log.head().unwrap().0, 1280);
    // Every acknowledged event is in the database with the hash we were given.
    let conn = rusqlite::Connection::open(dir.path().join("audit.db")).unwrap();
    for a in &appended {
        let (id, hash): (String, String) = conn
            .query_row(
                "SELECT event_id, hash FROM events WHERE seq = ?1",
                [a.seq as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((id, hash), (a.event_id.clone(), a.hash.clone()));
    }
    // One task's events appear in its own order.
    let events = log
        .events(EventFilter {
            run_id: Some("run-7".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let ns: Vec<u64> = events
        .iter()
        .map(|e| e.value["details"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, (0..20).collect::<Vec<_>>());
    log.close().await.unwrap();
    // Checkpoints were signed along the way and at close.
    assert!(count_rows(&dir.path().join("audit.db"), "checkpoints") >= 2);
    let sink = std::fs::read_to_string(dir.path().join("checkpoints.log")).unwrap();
    assert!(sink.contains("\n1280\n"), "{sink}");
}

#[tokio::test]
async fn append_all_is_contiguous_and_reopen_continues_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(options(dir.path())).unwrap();
    log.append(event("r", 0)).await.unwrap();
    let batch = log
        .append_all((1..=5).map(|i| event("r", i)).collect())
        .await
        .unwrap();
    assert_eq!(
        batch.iter().map(|a| a.seq).collect::<Vec<_>>(),
        vec![2, 3, 4, 5, 6]
    );
    let head = log.head().unwrap();
    log.close().await.unwrap();
    assert!(matches!(
        log.append(event("r", 9)).await,
        Err(AuditError::Closed)
    ));

    let log = AuditLog::open(options(dir.path())).unwrap();
    assert_eq!(log.head().unwrap(), head);
    let next = log.append(event("r", 7)).await.unwrap();
    assert_eq!(next.seq, 7);
    let line = &log
        .events(EventFilter {
            after_seq: 6,
            ..Default::default()
        })
        .await
        .unwrap()[0];
    assert_eq!(line.value["prev"], json!(head.1));
    assert_eq!(line.value["event_id"], json!("ev-000000000007"));
    // Filters: type, limit, time window.
    log.append(NewEvent::new(EventType::PolicyLoaded))
        .await
        .unwrap();
    let loaded = log
        .events(EventFilter {
            event_types: vec![EventType::PolicyLoaded],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(loaded.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![8]);
    let all = log.events(EventFilter::default()).await.unwrap();
    assert_eq!(all.len(), 8);
    let two = log
        .events(EventFilter {
            after_seq: 3,
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(two.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    let future = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    assert!(
        log.events(EventFilter {
            since: Some(future),
            ..Default::default()
        })
        .await
        .unwrap()
        .is_empty()
    );
    assert_eq!(
        log.events(EventFilter {
            until: Some(future),
            ..Default::default()
        })
        .await
        .unwrap()
        .len(),
        8
    );
    log.close().await.unwrap();
}

#[tokio::test]
async fn normal_durability_appends_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.durability = Durability::Normal;
    opts.checkpoint_every_events = 3;
    let log = AuditLog::open(opts).unwrap();
    for i in 0..10 {
        log.append(event("n", i)).await.unwrap();
    }
    log.close().await.unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("audit.db")).unwrap();
    let sizes: Vec<i64> = conn
        .prepare("SELECT size FROM checkpoints ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(sizes, vec![3, 6, 9, 10]);
}

#[tokio::test]
async fn idle_interval_signs_a_checkpoint_over_new_events() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.checkpoint_interval = Duration::from_millis(50);
    let log = AuditLog::open(opts).unwrap();
    log.append(event("i", 1)).await.unwrap();
    // Generous upper bound: the interval is 50 ms.
    let db = dir.path().join("audit.db");
    assert!(
        common::poll_until_async(Duration::from_secs(10), || count_rows(&db, "checkpoints")
            > 0)
        .await,
        "no interval checkpoint after 10 s"
    );
    log.close().await.unwrap();
}

#[tokio::test]
async fn triggers_reject_update_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(options(dir.path())).unwrap();
    log.append(event("t", 1)).await.unwrap();
    log.close().await.unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("audit.db")).unwrap();
    for sql in [
        "UPDATE events SET line = 'x' WHERE seq = 1",
        "DELETE FROM events WHERE seq = 1",
        "UPDATE checkpoints SET note = 'x'",
        "DELETE FROM checkpoints",
    ] {
        let err = conn.execute(sql, []).unwrap_err();
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    assert_eq!(count_rows(&dir.path().join("audit.db"), "events"), 1);
}

#[tokio::test]
async fn argument_commitments_use_a_key_outside_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(options(dir.path())).unwrap();
    let args = json!({"client": "Jane Roe", "path": "cases/1.txt"});
    let redaction = toolgate::policy::Redaction::Fields {
        pointers: vec!["/client".into()],
    };
    let e = NewEvent::new(EventType::ToolRequested).with_arguments(&log, &args, &redaction);
    let canonical = toolgate::canonical::to_canonical_bytes(&args);
    assert_eq!(
        e.arguments_hash_sha256.as_deref(),
        Some(toolgate::canonical::sha256_hex(&canonical).as_str())
    );
    assert_eq!(
        e.arguments,
        Some(json!({"client": "[redacted]", "path": "cases/1.txt"}))
    );
    // The HMAC is keyed: recompute it with the key file, not derivable from the hash.
    let key_hex = std::fs::read_to_string(dir.path().join("keys/audit-hmac.key")).unwrap();
    let key: [u8; 32] = hex::decode(key_hex.trim()).unwrap().try_into().unwrap();
    assert_eq!(
        e.arguments_hmac_sha256.as_deref(),
        Some(toolgate::audit::hmac_sha256_hex(&key, &canonical).as_str())
    );
    assert_ne!(e.arguments_hmac_sha256, e.arguments_hash_sha256);
    log.append(e).await.unwrap();
    log.close().await.unwrap();
    // No key material and no redacted value in the database file.
    let bytes = std::fs::read(dir.path().join("audit.db")).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains("Jane Roe"));
    assert!(!text.contains(key_hex.trim()));
    assert_eq!(
        toolgate::audit::redact(&args, &toolgate::policy::Redaction::HashOnly),
        None
    );
    assert_eq!(
        toolgate::audit::redact(&args, &toolgate::policy::Redaction::Full),
        Some(args.clone())
    );
}

#[test]
fn a_file_that_is_not_sqlite_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("audit.db"),
        "this is a text file, not a database\n",
    )
    .unwrap();
    let err = AuditLog::open(options(dir.path())).unwrap_err();
    assert!(matches!(err, AuditError::NotSqlite { .. }), "{err:?}");
    assert!(err.to_string().contains("is not an sqlite database"));
}

#[test]
fn a_foreign_sqlite_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("audit.db")).unwrap();
    conn.execute_batch("CREATE TABLE events (x INTEGER)")
        .unwrap();
    drop(conn);
    let err = AuditLog::open(options(dir.path())).unwrap_err();
    assert!(matches!(err, AuditError::NotAuditLog { .. }), "{err:?}");
}

#[tokio::test]
async fn a_locked_database_fails_open_and_append_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("audit.db");
    let mut opts = options(dir.path());
    opts.busy_timeout = Duration::from_millis(200);
    let log = AuditLog::open(opts.clone()).unwrap();
    log.append(event("l", 1)).await.unwrap();

    let other = rusqlite::Connection::open(&db).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let started = std::time::Instant::now();
    let err = log.append(event("l", 2)).await.unwrap_err();
    assert!(matches!(err, AuditError::Locked { .. }), "{err:?}");
    let err = AuditLog::open(opts.clone()).unwrap_err();
    assert!(matches!(err, AuditError::Locked { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(15), "no hang");
    other.execute_batch("COMMIT").unwrap();
    drop(other);
    // The chain continues gapless once the lock is gone.
    assert_eq!(log.append(event("l", 3)).await.unwrap().seq, 2);
    log.close().await.unwrap();
}

#[tokio::test]
async fn a_full_disk_fails_appends_with_a_typed_error_and_keeps_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.max_db_bytes = Some(256 * 1024);
    let log = AuditLog::open(opts).unwrap();
    let mut stored = 0u64;
    let mut full = None;
    for i in 0..10_000 {
        let mut e = event("big", i);
        e.details.insert("padding".into(), json!("x".repeat(2000)));
        match log.append(e).await {
            Ok(a) => {
                stored += 1;
                assert_eq!(a.seq, stored);
            }
            Err(err) => {
                full = Some(err);
                break;
            }
        }
    }
    assert!(
        matches!(full, Some(AuditError::DiskFull { .. })),
        "{full:?}"
    );
    // A later small append also fails cleanly or succeeds with the next seq: never a gap.
    match log.append(event("small", 0)).await {
        Ok(a) => assert_eq!(a.seq, stored + 1),
        Err(err) => assert!(matches!(err, AuditError::DiskFull { .. }), "{err:?}"),
    }
    assert_eq!(
        log.head().map(|h| h.0).unwrap_or(0) as i64,
        count_rows(&dir.path().join("audit.db"), "events")
    );
    let _ = log.close().await;
}

#[test]
fn a_read_only_database_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let log = AuditLog::open(options(dir.path())).unwrap();
    rt.block_on(log.append(event("ro", 1))).unwrap();
    rt.block_on(log.close()).unwrap();
    drop(log);
    let db = dir.path().join("audit.db");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let opts = options(dir.path());
    // Root ignores file modes. Then drop the file-system capabilities of this thread
    // only (setfsuid to nobody), so that the kernel applies the modes to it.
    let as_root = std::fs::OpenOptions::new().write(true).open(&db).is_ok();
    let err = std::thread::spawn(move || {
        if as_root {
            // SAFETY: setfsuid only changes this thread's file-system uid.
            unsafe { libc::setfsuid(65534) };
            assert!(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&opts.db_path)
                    .is_err(),
                "setfsuid did not take effect"
            );
        }
        AuditLog::open(opts).unwrap_err()
    })
    .join()
    .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(matches!(err, AuditError::ReadOnly { .. }), "{err:?}");
}

#[tokio::test]
async fn an_existing_log_is_never_given_a_fresh_or_foreign_key() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(options(dir.path())).unwrap();
    log.append(event("k", 1)).await.unwrap();
    log.close().await.unwrap();
    // The key directory is gone: refuse, and create nothing.
    let mut moved = options(dir.path());
    moved.key_dir = dir.path().join("elsewhere");
    let err = AuditLog::open(moved.clone()).unwrap_err();
    assert!(matches!(err, AuditError::Key { .. }), "{err:?}");
    assert!(!moved.key_dir.join("audit-signing.key").exists());
    // Another log's key does not verify this log's checkpoints.
    let other = tempfile::tempdir().unwrap();
    let other_log = AuditLog::open(options(other.path())).unwrap();
    other_log.close().await.unwrap();
    moved.key_dir = other.path().join("keys");
    let err = AuditLog::open(moved).unwrap_err();
    assert!(matches!(err, AuditError::Key { .. }), "{err:?}");
    assert!(err.to_string().contains("does not verify"), "{err}");
}

#[tokio::test]
async fn checkpoints_reach_the_webhook_and_syslog_sinks() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    // A one-shot HTTP server that hands back the body it received.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/checkpoints", listener.local_addr().unwrap());
    let (body_tx, body_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).unwrap();
            request.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&request).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap();
                if request.len() >= end + 4 + length {
                    stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .unwrap();
                    body_tx.send(text[end + 4..].to_string()).unwrap();
                    return;
                }
            }
            assert!(n > 0, "connection closed early");
        }
    });
    let socket_path = dir.path().join("syslog.sock");
    let syslog = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    syslog
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();

    let mut opts = options(dir.path());
    opts.checkpoint_every_events = 1;
    opts.checkpoint_sinks = vec![
        toolgate::audit::CheckpointSink::Webhook { url },
        toolgate::audit::CheckpointSink::Syslog {
            socket: socket_path.clone(),
        },
    ];
    let log = AuditLog::open(opts).unwrap();
    log.append(event("w", 1)).await.unwrap();
    let body = body_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("no webhook call within 20 s");
    assert!(body.starts_with("toolgate/audit\n1\n"), "{body}");
    assert!(body.contains("\n\n\u{2014} toolgate/audit "), "{body}");
    let mut buf = [0u8; 4096];
    let n = syslog.recv(&mut buf).unwrap();
    let message = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(
        message.starts_with("<134>toolgate-audit: checkpoint toolgate/audit | 1 | "),
        "{message}"
    );
    log.close().await.unwrap();
    // An unusable webhook url is a configuration error at open.
    let mut bad = options(dir.path());
    bad.checkpoint_sinks = vec![toolgate::audit::CheckpointSink::Webhook {
        url: "ftp://example.com/x".into(),
    }];
    assert!(matches!(
        AuditLog::open(bad),
        Err(AuditError::Config { .. })
    ));
}

#[tokio::test]
async fn the_idle_heartbeat_signs_even_when_nothing_arrived() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.checkpoint_interval = Duration::from_millis(30);
    opts.idle_heartbeat = true;
    let log = AuditLog::open(opts).unwrap();
    let db = dir.path().join("audit.db");
    assert!(
        common::poll_until_async(Duration::from_secs(10), || count_rows(&db, "checkpoints")
            >= 2)
        .await,
        "no heartbeat after 10 s"
    );
    log.close().await.unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    let reasons: Vec<(i64, String)> = conn
        .prepare("SELECT size, reason FROM checkpoints ORDER BY id LIMIT 2")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(
        reasons,
        vec![(0, "heartbeat".to_string()), (0, "heartbeat".to_string())]
    );
}
