//! `toolgate audit export` and `audit/verify_export.py`: an untouched export (full and
//! filtered) verifies with Python's standard library alone; each tampered one is
//! rejected with the documented exit code and the seq named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::audit_support;
use crate::common;

use std::path::{Path, PathBuf};

use audit_support::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

const N: u64 = 14;

fn export(db: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "audit",
        "export",
        "--db",
        db.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
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

/// Runs the Python verifier; returns its exit code and output.
fn python(dir: &Path, fingerprint: &str) -> (i32, String) {
    common::verify_export(dir, &["--key-fingerprint", fingerprint])
}

/// A forger who edits a file also fixes its hash (and event count) in the manifest,
/// and, holding the stolen key in `keys`, re-signs the manifest (so that the checks
/// behind the manifest's signature are tested too).
fn fix_manifest(dir: &Path, keys: &Path) {
    fix_manifest_unsigned(dir);
    let key = toolgate::audit::keys::load_signer(keys).unwrap();
    let mut statement = toolgate::audit::signer::MANIFEST_DOMAIN.as_bytes().to_vec();
    statement.extend_from_slice(&std::fs::read(dir.join("manifest.json")).unwrap());
    let mut signature = key.verifier.key_id.to_vec();
    signature.extend_from_slice(&key.sign(&statement));
    use base64::Engine;
    std::fs::write(
        dir.join("manifest.sig"),
        format!(
            "{} {}\n",
            key.verifier.name,
            base64::engine::general_purpose::STANDARD.encode(signature)
        ),
    )
    .unwrap();
}

/// The same, without the key: the manifest's signature no longer verifies.
fn fix_manifest_unsigned(dir: &Path) {
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
    std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
}

fn edit_lines(dir: &Path, edit: impl FnOnce(&mut Vec<String>)) {
    let path = dir.join("events.jsonl");
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    edit(&mut lines);
    let mut text = lines.join("\n");
    if !lines.is_empty() {
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
}

struct Fixture {
    _dir: tempfile::TempDir,
    data: PathBuf,
    full: PathBuf,
    filtered: PathBuf,
    fingerprint: String,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("var");
    std::fs::create_dir_all(&data).unwrap();
    let db = make_log(&data, N);
    let full = dir.path().join("full");
    let filtered = dir.path().join("filtered");
    export(&db, &full, &["--format", "csv"]);
    export(&db, &filtered, &["--format", "jsonl", "--run", "run-b"]);
    let fingerprint = fingerprint(&data);
    Fixture {
        data,
        full,
        filtered,
        fingerprint,
        _dir: dir,
    }
}

fn tampered(from: &Path, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    common::copy_dir(from, dir.path());
    edit(dir.path());
    dir
}

#[test]
fn untouched_exports_verify_and_carry_every_file() {
    let f = fixture();
    let (exit, out) = python(&f.full, &f.fingerprint);
    assert_eq!(exit, 0, "{out}");
    assert!(
        out.contains(&format!("OK: full export, {N} events (seq 1..{N})")),
        "{out}"
    );
    let (exit, out) = python(&f.filtered, &f.fingerprint);
    assert_eq!(exit, 0, "{out}");
    assert!(
        out.contains("OK: filtered export, 7 events (seq 2..14)"),
        "{out}"
    );

    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(f.full.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["tree_size"], N);
    assert_eq!(manifest["full"], true);
    assert_eq!(manifest["range"]["first_seq"], 1);
    assert_eq!(manifest["csv_is_integrity_protected"], false);
    for name in [
        "events.jsonl",
        "events.csv",
        "checkpoints.txt",
        "public-key.vkey",
        "README.txt",
        "verify_export.py",
    ] {
        assert!(
            manifest["files"][name].is_string(),
            "{name} missing from the manifest"
        );
    }
    // The lines are exactly the stored bytes.
    let conn = rusqlite::Connection::open(f.data.join("audit.db")).unwrap();
    let stored: Vec<String> = conn
        .prepare("SELECT line FROM events ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(
        std::fs::read_to_string(f.full.join("events.jsonl")).unwrap(),
        stored.join("\n") + "\n"
    );
    let readme = std::fs::read_to_string(f.full.join("README.txt")).unwrap();
    assert!(readme.contains("NOT") && readme.contains("integrity-protected"));
    assert!(
        std::fs::read_to_string(f.full.join("events.csv"))
            .unwrap()
            .starts_with("# derived view of events.jsonl for spreadsheets; NOT integrity-protected: verify events.jsonl\nseq,event_id,type,")
    );
    // The export's checkpoint is recorded in the database.
    let reasons: Vec<String> = conn
        .prepare("SELECT reason FROM checkpoints")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert!(reasons.contains(&"export".to_string()));
    // And the database still verifies afterwards.
    assert_eq!(code(&verify(&f.data.join("audit.db"), &[])), 0);
}

#[test]
fn tampered_full_exports_are_rejected() {
    let f = fixture();
    let k = f.data.join("keys");
    type Case<'a> = (&'static str, Box<dyn FnOnce(&Path) + 'a>, i32, &'static str);
    let cases: Vec<Case> = vec![
        (
            "edited line, manifest left alone",
            Box::new(|d: &Path| {
                edit_lines(d, |l| l[4] = l[4].replace("cases/5.txt", "cases/X.txt"))
            }),
            1,
            "events.jsonl does not match its sha256",
        ),
        (
            "edited line, manifest fixed",
            Box::new(|d: &Path| {
                edit_lines(d, |l| l[4] = l[4].replace("cases/5.txt", "cases/X.txt"));
                fix_manifest(d, &k);
            }),
            1,
            "FAILED at seq 5",
        ),
        (
            "edited line, manifest fixed without the key",
            Box::new(|d: &Path| {
                edit_lines(d, |l| l[4] = l[4].replace("cases/5.txt", "cases/X.txt"));
                fix_manifest_unsigned(d);
            }),
            3,
            "the signature of manifest.json does not verify",
        ),
        (
            "removed line",
            Box::new(|d: &Path| {
                edit_lines(d, |l| {
                    l.remove(6);
                });
                fix_manifest(d, &k);
            }),
            1,
            "FAILED at seq 7: seq 7 is missing",
        ),
        (
            "truncated",
            Box::new(|d: &Path| {
                edit_lines(d, |l| l.truncate(10));
                fix_manifest(d, &k);
            }),
            2,
            "FAILED at seq 11",
        ),
        (
            "bad signature",
            Box::new(|d: &Path| {
                let path = d.join("checkpoints.txt");
                let text = std::fs::read_to_string(&path).unwrap();
                let last = text.trim_end().rfind(' ').unwrap() + 30;
                let mut bytes = text.into_bytes();
                bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
                std::fs::write(&path, bytes).unwrap();
                fix_manifest(d, &k);
            }),
            3,
            "does not verify",
        ),
    ];
    for (name, edit, expected, message) in cases {
        let dir = tampered(&f.full, edit);
        let (exit, out) = python(dir.path(), &f.fingerprint);
        assert_eq!(exit, expected, "{name}: {out}");
        assert!(out.contains(message), "{name}: {out}");
    }
    let (exit, out) = python(&f.full, &"00".repeat(32));
    assert_eq!(exit, 3, "wrong fingerprint: {out}");
    assert!(out.contains("fingerprint"), "{out}");
}

#[test]
fn tampered_filtered_exports_are_rejected() {
    let f = fixture();
    let k = f.data.join("keys");
    let dir = tampered(&f.filtered, |d| {
        edit_lines(d, |l| l[1] = l[1].replace("cases/4.txt", "cases/Y.txt"));
        fix_manifest(d, &k);
    });
    let (exit, out) = python(dir.path(), &f.fingerprint);
    assert_eq!(exit, 1, "{out}");
    assert!(
        out.contains("FAILED at seq 4") && out.contains("inclusion proof"),
        "{out}"
    );

    // A forged checkpoint history: drop the export checkpoint's consistency proof.
    let dir = tampered(&f.filtered, |d| {
        std::fs::write(d.join("proofs/consistency.jsonl"), "").unwrap();
        fix_manifest(d, &k);
    });
    let (exit, out) = python(dir.path(), &f.fingerprint);
    assert_eq!(exit, 2, "{out}");
    assert!(out.contains("fork"), "{out}");
}

#[test]
fn export_refuses_a_tampered_database_and_a_non_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let conn = tamper(&db);
    conn.execute(
        "UPDATE events SET line = replace(line, 'cases/5.txt', 'cases/6.txt') WHERE seq = 5",
        [],
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let out = toolgate(&[
        "audit",
        "export",
        "--db",
        db.to_str().unwrap(),
        "--format",
        "jsonl",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 1);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("edited at seq 5"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out_dir.join("events.jsonl").exists());

    let clean = tempfile::tempdir().unwrap();
    let db = make_log(clean.path(), 3);
    std::fs::create_dir_all(clean.path().join("used")).unwrap();
    std::fs::write(clean.path().join("used/file"), "x").unwrap();
    let out = toolgate(&[
        "audit",
        "export",
        "--db",
        db.to_str().unwrap(),
        "--format",
        "jsonl",
        "--out",
        clean.path().join("used").to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 4);
}

#[test]
fn tail_prints_the_stored_lines() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), N);
    let out = toolgate(&[
        "audit",
        "tail",
        "--db",
        db.to_str().unwrap(),
        "--limit",
        "3",
    ]);
    assert_eq!(code(&out), 0);
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines
            .iter()
            .map(|v| v["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![12, 13, 14]
    );
    let out = toolgate(&[
        "audit",
        "tail",
        "--db",
        db.to_str().unwrap(),
        "--run",
        "run-a",
        "--after-seq",
        "6",
        "--limit",
        "2",
    ]);
    let seqs: Vec<u64> = stdout(&out)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, vec![7, 9]);
    let out = toolgate(&[
        "audit",
        "tail",
        "--db",
        db.to_str().unwrap(),
        "--run",
        "run-a",
        "--limit",
        "2",
    ]);
    let seqs: Vec<u64> = stdout(&out)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, vec![11, 13]);
}

#[test]
fn empty_exports_verify() {
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), 0);
    let key = fingerprint(dir.path());
    let full = dir.path().join("empty-full");
    export(&db, &full, &["--format", "jsonl"]);
    let (exit, out) = python(&full, &key);
    assert_eq!(exit, 0, "{out}");
    assert!(
        out.contains("OK: full export, 0 events (no events), 1 checkpoints, tree size 0"),
        "{out}"
    );
    // A filter that selects nothing, over a log that has events.
    let dir = tempfile::tempdir().unwrap();
    let db = make_log(dir.path(), 5);
    let none = dir.path().join("none");
    export(&db, &none, &["--format", "jsonl", "--run", "no-such-run"]);
    let (exit, out) = python(&none, &fingerprint(dir.path()));
    assert_eq!(exit, 0, "{out}");
    assert!(out.contains("OK: filtered export, 0 events"), "{out}");
}
