//! Red-team tests of the audit evidence (issue 12): an insider with shell access to the
//! data directory (and, in some, the stolen signing key) rewrites the log, trims an
//! export, or cuts the tail after a SIGKILL; each attack must be detected, with the
//! documented exit code, by `toolgate audit verify` and by `audit/verify_export.py`
//! given what docs/audit.md says the auditor must keep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::audit_support;
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use audit_support::{code, stdout, tamper, toolgate};
use common::{Server, Start, repo};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use toolgate::audit::checkpoint::{Checkpoint, split_notes};
use toolgate::audit::keys::load_signer;
use toolgate::audit::merkle::{Frontier, leaf_hash};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `audit verify --format json` with extra flags: (exit code, report).
fn verify_json(db: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["audit", "verify", "--db", s(db), "--format", "json"];
    args.extend_from_slice(extra);
    let out = toolgate(&args);
    let value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (code(&out), value)
}

fn export(db: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec!["audit", "export", "--db", s(db), "--out", s(out)];
    args.extend_from_slice(extra);
    let output = toolgate(&args);
    assert_eq!(
        code(&output),
        0,
        "{}{}",
        stdout(&output),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn fingerprint(key_dir: &Path) -> String {
    let out = toolgate(&["audit", "key", "--key-dir", s(key_dir), "--format", "json"]);
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    value["fingerprint"].as_str().unwrap().to_string()
}

/// A gateway on the demo policy with an "off-box" checkpoint sink (a file outside the
/// data directory, standing for a remote append-only store) and a checkpoint every 4
/// events.
struct Deployment {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    offbox: PathBuf,
    policy: PathBuf,
}

impl Deployment {
    fn new() -> Deployment {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("var");
        let offbox = tmp.path().join("remote").join("checkpoints.log");
        Deployment {
            data,
            offbox,
            policy: repo().join("policy"),
            _tmp: tmp,
        }
    }

    fn start(&self, extra: &[&str]) -> Server {
        let mut args = vec![
            "--checkpoint-sink".to_string(),
            format!("file:{}", self.offbox.display()),
            "--checkpoint-every-events".to_string(),
            "4".to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        Server::start_with(Start {
            policy_dir: self.policy.clone(),
            data_dir: Some(self.data.clone()),
            args,
            ..Start::default()
        })
    }

    fn serve_exit(&self, extra: &[&str]) -> (i32, String) {
        let mut args = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--policy-dir",
            s(&self.policy),
            "--data-dir",
            s(&self.data),
            "--checkpoint-sink",
        ];
        let sink = format!("file:{}", self.offbox.display());
        args.push(&sink);
        args.extend_from_slice(extra);
        let tools = repo().join("tools/tool_registry.yaml");
        args.extend_from_slice(&["--tools", s(&tools)]);
        // A refusal exits at once; a server that starts is stopped after 10 s.
        match run_within(&args, Duration::from_secs(10)) {
            Some((code, out)) => (code, String::from_utf8_lossy(&out.stderr).into_owned()),
            None => (-1, "the server started".into()),
        }
    }

    fn db(&self) -> PathBuf {
        self.data.join("audit.db")
    }
}

/// Some allowed and some denied calls (a denied one is what an insider wants gone).
fn traffic(server: &Server, calls: usize) -> String {
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    for i in 0..calls {
        let (status, body) = server.call(
            "research_agent",
            &run,
            "research",
            "legal_search",
            json!({"query": format!("duty {i}"), "limit": 3}),
            scope.clone(),
        );
        assert_eq!(status, 200, "{body}");
        // Not allowed in this lane: a tool_denied event.
        let (status, body) = server.call(
            "research_agent",
            &run,
            "research",
            "file_with_court",
            json!({"document_id": "doc-1"}),
            scope.clone(),
        );
        assert_ne!(status, 200, "{body}");
    }
    run
}

/// Every line, oldest first.
fn lines(db: &Path) -> Vec<Value> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT line FROM events ORDER BY seq")
        .unwrap();
    stmt.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect()
}

/// The insider's forgery with the stolen key: drop the events `drop` selects,
/// renumber and re-chain the rest, re-sign a checkpoint every 4 events and the head,
/// and rewrite the database and the sink file in the data directory.
fn forge(data: &Path, drop: impl Fn(&Value) -> bool) {
    let db = data.join("audit.db");
    let key = load_signer(&data.join("keys")).unwrap();
    let kept: Vec<Value> = lines(&db).into_iter().filter(|v| !drop(v)).collect();
    let conn = tamper(&db);
    conn.execute_batch("DELETE FROM events; DELETE FROM checkpoints; DELETE FROM signed_head;")
        .unwrap();
    let mut frontier = Frontier::new();
    let mut prev = "0".repeat(64);
    let mut notes = String::new();
    let origin = "toolgate/audit".to_string();
    let count = kept.len();
    for (i, mut value) in kept.into_iter().enumerate() {
        let seq = i as u64 + 1;
        value["seq"] = json!(seq);
        value["event_id"] = json!(format!("ev-{seq:012}"));
        value["prev"] = json!(prev);
        let line = toolgate::canonical::to_canonical_string(&value);
        let hash = leaf_hash(line.as_bytes());
        conn.execute(
            "INSERT INTO events (seq, event_id, type, run_id, ts, line, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            rusqlite::params![
                seq as i64,
                value["event_id"].as_str().unwrap(),
                value["type"].as_str().unwrap(),
                value["run_id"].as_str(),
                value["timestamp_utc"].as_str().unwrap(),
                line,
                hex::encode(hash)
            ],
        )
        .unwrap();
        frontier.push(hash);
        prev = hex::encode(hash);
        if seq.is_multiple_of(4) || i + 1 == count {
            let cp = Checkpoint {
                origin: origin.clone(),
                size: seq,
                root: frontier.root(),
            };
            let note = cp.sign(&key);
            conn.execute(
                "INSERT INTO checkpoints (size, root, note, created_utc, reason) VALUES (?1, ?2, ?3, 'x', 'events')",
                rusqlite::params![seq as i64, hex::encode(cp.root), note],
            )
            .unwrap();
            if i + 1 == count {
                conn.execute(
                    "INSERT INTO signed_head (id, size, root, note) VALUES (1, ?1, ?2, ?3)",
                    rusqlite::params![seq as i64, hex::encode(cp.root), note],
                )
                .unwrap();
            }
            notes.push_str(&note);
            notes.push('\n');
        }
    }
    drop_wal(conn);
    std::fs::write(data.join("checkpoints.log"), notes).unwrap();
}

fn drop_wal(conn: rusqlite::Connection) {
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    drop(conn);
}

fn newest_note(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    split_notes(&text).unwrap().pop().unwrap()
}

/// Attack 1: the insider steals the key, deletes a `tool_denied` event, re-chains,
/// re-signs every checkpoint and the head, and rewrites the local sink. The log then
/// verifies on its own, even with the true fingerprint (the key is the real one);
/// the off-box sink, a trusted checkpoint, and serve's start-up check all see it.
#[test]
fn a_rewrite_resigned_with_the_stolen_key_is_caught_by_the_offbox_sink_and_a_trusted_checkpoint() {
    let d = Deployment::new();
    let server = d.start(&[]);
    traffic(&server, 5);
    assert_eq!(server.stop().code(), Some(0));
    // The auditor's trusted checkpoint: the newest one the off-box sink received.
    let trusted = d.data.parent().unwrap().join("auditor.note");
    std::fs::write(&trusted, newest_note(&d.offbox)).unwrap();
    let fp = fingerprint(&d.data.join("keys"));
    assert_eq!(verify_json(&d.db(), &["--key-fingerprint", &fp]).0, 0);

    let denied = lines(&d.db())
        .iter()
        .filter(|v| v["type"] == "tool_denied")
        .count();
    assert!(denied >= 5);
    let first_denied = lines(&d.db())
        .into_iter()
        .find(|v| v["type"] == "tool_denied")
        .unwrap()["seq"]
        .clone();
    forge(&d.data, |v| v["seq"] == first_denied);
    let denied_after = lines(&d.db())
        .iter()
        .filter(|v| v["type"] == "tool_denied")
        .count();
    assert_eq!(denied_after, denied - 1);

    // The forgery passes on its own, with the true fingerprint: the key is the real one.
    let (exit, report) = verify_json(&d.db(), &["--key-fingerprint", &fp]);
    assert_eq!(exit, 0, "{report}");
    // The off-box sink holds checkpoints the forgery does not extend.
    let (exit, report) = verify_json(
        &d.db(),
        &["--key-fingerprint", &fp, "--checkpoints", s(&d.offbox)],
    );
    assert_eq!(exit, 2, "{report}");
    assert!(
        ["fork", "truncated"].contains(&report["kind"].as_str().unwrap()),
        "{report}"
    );
    // So does the auditor's trusted checkpoint.
    let (exit, report) = verify_json(
        &d.db(),
        &[
            "--key-fingerprint",
            &fp,
            "--trusted-checkpoint",
            s(&trusted),
        ],
    );
    assert_eq!(exit, 2, "{report}");
    // verify_export.py, on an export of the forged log, given the trusted checkpoint.
    let out = d.data.parent().unwrap().join("export");
    export(&d.db(), &out, &["--format", "jsonl"]);
    let (exit, text) = common::verify_export(&out, &["--key-fingerprint", &fp]);
    assert_eq!(exit, 0, "the forgery is self-consistent: {text}");
    let (exit, text) = common::verify_export(
        &out,
        &[
            "--key-fingerprint",
            &fp,
            "--trusted-checkpoint",
            s(&trusted),
        ],
    );
    assert_eq!(exit, 2, "{text}");
    // serve refuses to continue a log that does not extend its off-box sink.
    let (exit, stderr) = d.serve_exit(&[]);
    assert_eq!(exit, 2, "{stderr}");
    assert!(
        stderr.contains("was cut") || stderr.contains("forks"),
        "{stderr}"
    );
}

/// Attack 2: after a SIGKILL the insider (without the key) rewrites the newest
/// acknowledged events. Every commit signed them, so the log no longer matches its
/// signed head; removing the head leaves them unsigned; serve refuses either way.
#[test]
fn acknowledged_events_rewritten_after_sigkill_are_caught_without_the_key() {
    let d = Deployment::new();
    let server = d.start(&[]);
    traffic(&server, 3);
    let acknowledged = lines(&d.db()).len();
    server.kill9();
    assert_eq!(lines(&d.db()).len(), acknowledged);
    let conn = tamper(&d.db());
    // Rewrite the last event (arguments, prev chain intact) and fix its hash column.
    let last = acknowledged as i64;
    let mut value = audit_support::line_of(&conn, last);
    value["reason"] = json!("forged");
    audit_support::store_line(&conn, last, &value);
    drop_wal(conn);
    let (exit, report) = verify_json(&d.db(), &[]);
    assert_eq!(exit, 1, "{report}");
    assert_eq!(report["kind"], "root_mismatch", "{report}");
    let (exit, stderr) = d.serve_exit(&[]);
    assert_ne!(exit, 0, "{stderr}");
    assert!(stderr.contains("signed head"), "{stderr}");

    // Without the head, the rewritten events are covered by no signature at all.
    let conn = tamper(&d.db());
    conn.execute("DELETE FROM signed_head", []).unwrap();
    drop_wal(conn);
    let (exit, report) = verify_json(&d.db(), &[]);
    assert_eq!(
        (exit, report["kind"].clone()),
        (1, json!("unsigned")),
        "{report}"
    );
    let (exit, stderr) = d.serve_exit(&[]);
    assert_ne!(exit, 0, "{stderr}");
    assert!(
        stderr.contains("covered by no signed checkpoint"),
        "{stderr}"
    );
}

/// The signed checkpoints of a notes file, keeping only those below `size`.
fn keep_notes_below(file: &Path, size: u64) {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut kept = String::new();
    for note in split_notes(&text).unwrap() {
        let note_size: u64 = note.lines().nth(1).unwrap().parse().unwrap();
        if note_size < size {
            kept.push_str(&note);
            kept.push('\n');
        }
    }
    std::fs::write(file, kept).unwrap();
}

/// Attack 2b: after a SIGKILL the insider (without the key) removes the signed head
/// itself, not just its row: the `signed_head` table is dropped, renamed or replaced by
/// a view, the checkpoints over the newest events are deleted (table and local sink)
/// and those events rewritten and re-chained. The head is part of the log's format, so
/// its absence is a failure, never a warning; and `audit export` must not sign a fresh
/// checkpoint over the rewritten tail (which would launder it for verify_export.py).
#[test]
fn a_signed_head_table_dropped_after_sigkill_is_a_failure_and_export_signs_nothing() {
    let d = Deployment::new();
    let server = d.start(&[]);
    traffic(&server, 3);
    server.kill9();
    let fp = fingerprint(&d.data.join("keys"));
    let size = lines(&d.db()).len() as i64;
    assert!(size >= 8, "{size} events");
    // The rewrite: seq size-1 and size, with every signature over them removed.
    let from = size - 1;
    let conn = tamper(&d.db());
    conn.execute("DELETE FROM checkpoints WHERE size >= ?1", [from])
        .unwrap();
    audit_support::rewrite_chain_from(&conn, from);
    drop_wal(conn);
    keep_notes_below(&d.data.join("checkpoints.log"), from as u64);
    let forged = d.data.parent().unwrap().join("forged.db");
    std::fs::copy(d.db(), &forged).unwrap();

    for (name, attack) in [
        (
            "replaced by a view",
            "DROP TABLE signed_head; CREATE VIEW signed_head AS \
             SELECT 1 AS id, size, root, note FROM checkpoints ORDER BY checkpoints.id DESC LIMIT 1",
        ),
        (
            "renamed",
            "ALTER TABLE signed_head RENAME TO signed_head_old",
        ),
        // Last: what export and serve meet below.
        ("dropped", "DROP TABLE signed_head"),
    ] {
        std::fs::copy(&forged, d.db()).unwrap();
        let conn = rusqlite::Connection::open(d.db()).unwrap();
        conn.execute_batch(attack).unwrap();
        drop_wal(conn);
        let (exit, report) = verify_json(&d.db(), &["--key-fingerprint", &fp]);
        assert_eq!(exit, 1, "signed_head {name}: {report}");
        assert!(
            ["unsigned", "malformed"].contains(&report["kind"].as_str().unwrap_or("")),
            "signed_head {name}: {report}"
        );
    }

    // Export refuses, stores no checkpoint over the forged tail and writes no export.
    let out = d.data.parent().unwrap().join("export");
    let output = toolgate(&[
        "audit",
        "export",
        "--db",
        s(&d.db()),
        "--format",
        "jsonl",
        "--out",
        s(&out),
    ]);
    assert_ne!(
        code(&output),
        0,
        "{}{}",
        stdout(&output),
        String::from_utf8_lossy(&output.stderr)
    );
    let covering: i64 = rusqlite::Connection::open(d.db())
        .unwrap()
        .query_row(
            "SELECT count(*) FROM checkpoints WHERE size >= ?1",
            [from],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        covering, 0,
        "export signed a checkpoint over the forged tail"
    );
    assert!(!out.join("manifest.json").exists());
    // serve refuses to continue it too.
    let (exit, stderr) = d.serve_exit(&[]);
    assert_ne!(exit, 0, "{stderr}");
}

/// Attack 5 and the SIGKILL cut: the tail is cut after a SIGKILL. The signed head
/// shows it (exit 2); cutting the head and checkpoints too, the off-box sink and the
/// auditor's trusted checkpoint show it (exit 2, in both verifiers); serve refuses to
/// reuse the cut sequence numbers (exit 2).
#[test]
fn a_tail_cut_after_sigkill_is_truncation_everywhere() {
    let d = Deployment::new();
    let server = d.start(&[]);
    traffic(&server, 4);
    let before = lines(&d.db()).len() as i64;
    server.kill9();
    let fp = fingerprint(&d.data.join("keys"));
    let conn = tamper(&d.db());
    conn.execute("DELETE FROM events WHERE seq > ?1", [before - 3])
        .unwrap();
    drop_wal(conn);
    let (exit, report) = verify_json(&d.db(), &[]);
    assert_eq!(
        (exit, report["kind"].clone(), report["seq"].clone()),
        (2, json!("truncated"), json!(before - 2)),
        "{report}"
    );
    let (exit, stderr) = d.serve_exit(&[]);
    assert_eq!(exit, 2, "{stderr}");
    assert!(stderr.contains("reuse"), "{stderr}");

    // A thorough insider also removes every signature above the cut, locally.
    let trusted = d.data.parent().unwrap().join("auditor.note");
    std::fs::write(&trusted, newest_note(&d.offbox)).unwrap();
    let trusted_size: i64 = newest_note(&d.offbox)
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let cut = trusted_size - 1;
    let conn = tamper(&d.db());
    conn.execute("DELETE FROM events WHERE seq > ?1", [cut])
        .unwrap();
    conn.execute("DELETE FROM checkpoints WHERE size > ?1", [cut])
        .unwrap();
    let key = load_signer(&d.data.join("keys")).unwrap();
    let mut frontier = Frontier::new();
    for v in lines(&d.db()) {
        frontier.push(leaf_hash(
            toolgate::canonical::to_canonical_string(&v).as_bytes(),
        ));
    }
    // (With the stolen key the head can even be re-signed over the cut log.)
    let note = Checkpoint {
        origin: "toolgate/audit".into(),
        size: frontier.size(),
        root: frontier.root(),
    }
    .sign(&key);
    conn.execute(
        "UPDATE signed_head SET size = ?1, root = ?2, note = ?3",
        rusqlite::params![frontier.size() as i64, hex::encode(frontier.root()), note],
    )
    .unwrap();
    drop_wal(conn);
    std::fs::write(d.data.join("checkpoints.log"), "").unwrap();
    assert_eq!(verify_json(&d.db(), &[]).0, 0, "invisible locally");
    for extra in [
        vec!["--checkpoints", s(&d.offbox)],
        vec!["--trusted-checkpoint", s(&trusted)],
    ] {
        let (exit, report) = verify_json(&d.db(), &extra);
        assert_eq!(
            (exit, report["kind"].clone()),
            (2, json!("truncated")),
            "{extra:?}: {report}"
        );
    }
    let out = d.data.parent().unwrap().join("export");
    export(&d.db(), &out, &["--format", "jsonl"]);
    let (exit, text) = common::verify_export(
        &out,
        &[
            "--key-fingerprint",
            &fp,
            "--trusted-checkpoint",
            s(&trusted),
        ],
    );
    assert_eq!(exit, 2, "{text}");
    assert!(text.contains("cut"), "{text}");
    let (exit, stderr) = d.serve_exit(&[]);
    assert_eq!(exit, 2, "{stderr}");
}

/// A forger who edits an export file also fixes its hash and count in the manifest.
fn fix_manifest(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("manifest.json");
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let names: Vec<String> = manifest["files"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    for name in names {
        if let Ok(bytes) = std::fs::read(dir.join(&name)) {
            manifest["files"][&name] = hex::encode(Sha256::digest(bytes)).into();
        }
    }
    let events = std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .count();
    manifest["counts"]["events"] = events.into();
    edit(&mut manifest);
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&manifest).unwrap() + "\n",
    )
    .unwrap();
}

fn drop_lines(dir: &Path, mut drop: impl FnMut(&Value) -> bool) -> usize {
    let path = dir.join("events.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut dropped = 0;
    let mut kept = String::new();
    for line in text.lines() {
        let value: Value = serde_json::from_str(line).unwrap();
        if drop(&value) {
            dropped += 1;
        } else {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    std::fs::write(&path, kept).unwrap();
    dropped
}

/// Attack 3: trimming exports. The manifest is a signed statement: dropping the
/// `tool_denied` lines and calling the export filtered, or dropping one line of a run
/// export, is refused, whatever the forger fixes without the key.
#[test]
fn trimmed_exports_are_refused() {
    let d = Deployment::new();
    let server = d.start(&[]);
    let run = traffic(&server, 4);
    assert_eq!(server.stop().code(), Some(0));
    let fp = fingerprint(&d.data.join("keys"));
    let root = d.data.parent().unwrap().to_path_buf();
    let full = root.join("full");
    let filtered = root.join("run");
    export(&d.db(), &full, &["--format", "jsonl"]);
    export(&d.db(), &filtered, &["--format", "jsonl", "--run", &run]);
    assert_eq!(
        common::verify_export(&full, &["--key-fingerprint", &fp, "--expect-full"]).0,
        0
    );
    let (exit, text) =
        common::verify_export(&filtered, &["--key-fingerprint", &fp, "--expect-run", &run]);
    assert_eq!(exit, 0, "{text}");
    // What the auditor expects is checked against the signed statement.
    let (exit, text) =
        common::verify_export(&filtered, &["--key-fingerprint", &fp, "--expect-full"]);
    assert_eq!(exit, 1, "{text}");
    let (exit, text) =
        common::verify_export(&full, &["--key-fingerprint", &fp, "--expect-run", &run]);
    assert_eq!(exit, 1, "{text}");
    let (exit, text) = common::verify_export(
        &filtered,
        &["--key-fingerprint", &fp, "--expect-run", "run-other"],
    );
    assert_eq!(exit, 1, "{text}");

    // Drop every tool_denied line and call the export filtered.
    let t = root.join("trimmed");
    common::copy_dir(&full, &t);
    assert!(drop_lines(&t, |v| v["type"] == "tool_denied") >= 4);
    fix_manifest(&t, |m| m["full"] = json!(false));
    let (exit, text) = common::verify_export(&t, &["--key-fingerprint", &fp]);
    assert_eq!(exit, 3, "{text}");
    assert!(text.contains("manifest"), "{text}");
    // Without the signature file it is not a signed statement at all.
    std::fs::remove_file(t.join("manifest.sig")).unwrap();
    assert_eq!(common::verify_export(&t, &["--key-fingerprint", &fp]).0, 3);

    // Drop one tool_executed line of the run export: the signed manifest's hash of
    // events.jsonl no longer matches...
    let r = root.join("run-trimmed");
    common::copy_dir(&filtered, &r);
    let mut once = false;
    assert_eq!(
        drop_lines(&r, |v| {
            let hit = !once && v["type"] == "tool_executed";
            if hit {
                once = true;
            }
            hit
        }),
        1
    );
    let (exit, text) = common::verify_export(&r, &["--key-fingerprint", &fp, "--expect-run", &run]);
    assert_eq!(exit, 1, "{text}");
    // ...and fixing the manifest breaks its signature.
    fix_manifest(&r, |_| {});
    let (exit, text) = common::verify_export(&r, &["--key-fingerprint", &fp, "--expect-run", &run]);
    assert_eq!(exit, 3, "{text}");

    // The signed manifest names the calls still open; every other requested call has
    // its closing event in the export.
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(filtered.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["open_calls"], json!([]), "{manifest}");
    assert_eq!(manifest["filter"]["run_id"], json!(run));
    // Without a fingerprint the verifier says which key it trusted, and warns.
    let (exit, text) = common::verify_export(&filtered, &[]);
    assert_eq!(exit, 0, "{text}");
    assert!(text.contains("WARNING") && text.contains(&fp), "{text}");
}

/// `audit verify` without a fingerprint prints the one it trusted and a warning; a
/// wrong one is a key problem (exit 3).
#[test]
fn verify_names_the_key_it_trusted() {
    let d = Deployment::new();
    let server = d.start(&[]);
    traffic(&server, 1);
    assert_eq!(server.stop().code(), Some(0));
    let fp = fingerprint(&d.data.join("keys"));
    let out = toolgate(&["audit", "verify", "--db", s(&d.db())]);
    assert_eq!(code(&out), 0);
    let text = stdout(&out);
    assert!(
        text.contains(&fp) && text.contains("NOT confirmed"),
        "{text}"
    );
    assert!(text.contains("warning: no --key-fingerprint"), "{text}");
    let out = toolgate(&[
        "audit",
        "verify",
        "--db",
        s(&d.db()),
        "--key-fingerprint",
        &fp,
    ]);
    assert_eq!(code(&out), 0);
    assert!(!stdout(&out).contains("warning: no --key-fingerprint"));
    let (exit, report) = verify_json(&d.db(), &["--key-fingerprint", &"ab".repeat(32)]);
    assert_eq!(
        (exit, report["kind"].clone()),
        (3, json!("key")),
        "{report}"
    );
}

/// The key outside the data directory, held by a separate signer process: every
/// acknowledged event is signed by it; when it is unreachable the gateway fails
/// closed (no acknowledged event without a signature); it recovers when the signer
/// is back.
#[test]
fn a_separate_signer_process_signs_and_the_gateway_fails_closed_without_it() {
    let tmp = tempfile::tempdir().unwrap();
    let signer_keys = tmp.path().join("signer-keys");
    let socket = tmp.path().join("signer.sock");
    let start_signer = || {
        let mut child = Command::new(common::BIN)
            .args([
                "signer",
                "--key-dir",
                s(&signer_keys),
                "--socket",
                s(&socket),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let listening = common::poll_until(Duration::from_secs(20), || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the signer exited: {status}");
            }
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        });
        assert!(listening, "the signer did not start");
        child
    };
    let mut signer = start_signer();
    let data = tmp.path().join("var");
    let gateway_keys = tmp.path().join("gateway-keys");
    let server = Server::start_with(Start {
        data_dir: Some(data.clone()),
        args: vec![
            "--signer-socket".into(),
            socket.display().to_string(),
            "--key-dir".into(),
            gateway_keys.display().to_string(),
        ],
        ..Start::default()
    });
    traffic(&server, 2);
    // No private key anywhere near the gateway.
    assert!(!data.join("keys").exists());
    assert!(!gateway_keys.join("audit-signing.key").exists());
    let fp = fingerprint(&signer_keys);
    assert_eq!(fingerprint(&gateway_keys), fp);

    // The signer goes away: calls fail closed with a structured answer.
    signer.kill().unwrap();
    signer.wait().unwrap();
    let scope = json!({"case_id": "C-1001"});
    let (status, body) = server.post("/v1/runs", Some(common::ADMIN), &json!({"scope": scope}));
    assert_ne!(status, 201, "{body}");
    assert!(
        body["error_code"].is_string() || body["reason"].is_string(),
        "{body}"
    );

    // It comes back: the gateway reconnects.
    let mut signer = start_signer();
    traffic(&server, 1);
    assert_eq!(server.stop().code(), Some(0));
    let db = data.join("audit.db");
    let (exit, report) = verify_json(
        &db,
        &["--key-dir", s(&gateway_keys), "--key-fingerprint", &fp],
    );
    assert_eq!(exit, 0, "{report}");
    assert!(
        report["warnings"].as_array().unwrap().is_empty(),
        "{report}"
    );
    // An export signed by the signer process verifies with its fingerprint.
    let out = tmp.path().join("export");
    export(
        &db,
        &out,
        &[
            "--format",
            "jsonl",
            "--key-dir",
            s(&gateway_keys),
            "--signer-socket",
            s(&socket),
        ],
    );
    let (exit, text) = common::verify_export(&out, &["--key-fingerprint", &fp, "--expect-full"]);
    assert_eq!(exit, 0, "{text}");
    signer.kill().unwrap();
    signer.wait().unwrap();
}

/// serve refuses a key directory that group or others can write.
#[test]
fn serve_refuses_a_key_directory_others_can_write() {
    use std::os::unix::fs::PermissionsExt;
    let d = Deployment::new();
    let keys = d.data.parent().unwrap().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (exit, stderr) = d.serve_exit(&["--key-dir", s(&keys)]);
    assert_eq!(exit, 3, "{stderr}");
    assert!(stderr.contains("writable by group or others"), "{stderr}");
}

/// An insider puts something else where a key file was: a symlink to a device that
/// never ends, a FIFO nobody writes, a file of a terabyte. serve refuses each at once,
/// naming the key file, instead of hanging or filling its memory.
#[test]
fn serve_refuses_key_files_replaced_by_a_device_a_fifo_or_a_huge_file() {
    use std::os::unix::fs::PermissionsExt;
    let d = Deployment::new();
    d.start(&[]).stop();
    let keys = d.data.join("keys");
    let fifo = |p: &Path| {
        let name = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    };
    let zeros = |p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap();
    let huge = |p: &Path| std::fs::File::create(p).unwrap().set_len(1 << 40).unwrap();
    type Replace<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Replace, &str); 3] = [
        ("a symlink to /dev/zero", &zeros, "symbolic link"),
        ("a FIFO", &fifo, "cannot read the key file"),
        ("a sparse terabyte", &huge, "cannot read the key file"),
    ];
    for name in ["audit-signing.key", "audit-hmac.key"] {
        let path = keys.join(name);
        let original = std::fs::read(&path).unwrap();
        for (what, replace, why) in cases {
            std::fs::remove_file(&path).unwrap();
            replace(&path);
            let (exit, stderr) = d.serve_exit(&[]);
            assert_eq!(exit, 3, "{name} as {what}: {stderr}");
            assert!(
                stderr.contains(why) && stderr.contains(name),
                "{name} as {what}: {stderr}"
            );
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, original).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

/// `audit verify --format json` that must answer within 20 s: (exit code, report);
/// (-1, null) when it was still running.
fn verify_json_bounded(db: &Path) -> (i32, Value) {
    let args = ["audit", "verify", "--db", s(db), "--format", "json"];
    match run_within(&args, Duration::from_secs(20)) {
        Some((code, out)) => (
            code,
            serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        ),
        None => (-1, Value::Null),
    }
}

/// Runs the binary with `args`: its exit code and output, or None when it was still
/// running after `within` (it is killed then).
fn run_within(args: &[&str], within: Duration) -> Option<(i32, std::process::Output)> {
    let mut child = Command::new(common::BIN)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    match common::poll_for(within, || child.try_wait().unwrap()) {
        Some(status) => Some((
            status.code().unwrap_or(-1),
            child.wait_with_output().unwrap(),
        )),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    }
}

/// An insider puts a FIFO or a directory where one of the log's files is (the
/// database, its writer lock, a checkpoint sink's file): `serve` refuses to start and
/// `audit verify` refuses to verify, at once, each with an answer naming the file.
/// Neither waits on the FIFO (before, each of these hung).
#[test]
fn a_fifo_or_a_directory_in_place_of_a_log_file_is_refused_at_once() {
    let d = Deployment::new();
    let server = d.start(&[]);
    traffic(&server, 2);
    server.stop();
    // The sink file next to the database is the one verify reads by default.
    let local_sink = d.data.join("checkpoints.log");
    std::fs::copy(&d.offbox, &local_sink).unwrap();
    let fifo = |p: &Path| {
        let name = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    };
    let directory = |p: &Path| std::fs::create_dir(p).unwrap();
    type Replace<'a> = &'a dyn Fn(&Path);
    let replacements: [(&str, Replace); 2] = [("a FIFO", &fifo), ("a directory", &directory)];
    // The file, whether serve reads it, whether verify reads it.
    let rows = [
        (d.db(), true, true),
        (d.data.join("audit.db.lock"), true, false),
        (d.offbox.clone(), true, false),
        (local_sink, false, true),
    ];
    for (path, serve_reads, verify_reads) in rows {
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let saved = path.with_extension("saved");
        std::fs::rename(&path, &saved).unwrap();
        for (what, replace) in replacements {
            replace(&path);
            if serve_reads {
                let (exit, stderr) = d.serve_exit(&[]);
                assert!(exit > 0, "{name} as {what}: serve exited {exit}: {stderr}");
                assert!(stderr.contains(&name), "{name} as {what}: {stderr}");
            }
            let (exit, report) = verify_json_bounded(&d.db());
            if verify_reads {
                assert_eq!(exit, 4, "{name} as {what}: {report}");
                assert_eq!(report["status"], "error", "{name} as {what}: {report}");
                assert_eq!(report["kind"], "open", "{report}");
                assert_eq!(report["exit_code"], 4, "{report}");
                assert!(
                    report["message"].as_str().unwrap().contains(&name),
                    "{name} as {what}: {report}"
                );
            } else {
                assert_eq!(exit, 0, "{name} as {what}: {report}");
            }
            if path.is_dir() {
                std::fs::remove_dir(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
        std::fs::rename(&saved, &path).unwrap();
    }
    // Put back, the log verifies and the gateway starts on it.
    let (exit, report) = verify_json_bounded(&d.db());
    assert_eq!((exit, &report["status"]), (0, &json!("ok")), "{report}");
    d.start(&[]).stop();
    // A key directory with no key: `audit key --format json` answers JSON too.
    let none = d.data.join("no-keys");
    let out = toolgate(&["audit", "key", "--key-dir", s(&none), "--format", "json"]);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(code(&out), 3);
    assert_eq!(
        (&answer["status"], &answer["kind"], &answer["exit_code"]),
        (&json!("error"), &json!("key"), &json!(3)),
        "{answer}"
    );
}

/// A webhook sink that never answers does not slow the gateway down, and every
/// acknowledged event is still signed locally.
#[test]
fn a_dead_webhook_sink_neither_blocks_calls_nor_leaves_events_unsigned() {
    // Accepts connections and never reads or answers.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/checkpoints", blackhole.local_addr().unwrap());
    let d = Deployment::new();
    let server = d.start(&["--checkpoint-sink", &url]);
    let started = Instant::now();
    traffic(&server, 3);
    // 6 calls and a run; the webhook would take 5 s per checkpoint if it blocked.
    assert!(started.elapsed() < Duration::from_secs(20));
    let count = lines(&d.db()).len();
    server.kill9();
    let (exit, report) = verify_json(&d.db(), &[]);
    assert_eq!(exit, 0, "{report}");
    assert_eq!(report["events"], json!(count));
    drop(blackhole);
}
