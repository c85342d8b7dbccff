//! `audit/verify_export.py` on fleet exports built in the test (no PostgreSQL): the
//! files `toolgate audit export --cluster-db` writes, made with the library's own keys,
//! tree and notes, so each check of the fleet path can be attacked on its own. What a
//! key thief or an insider does to an export: repackage a run as a fleet export to
//! skip `--trusted-checkpoint`, sign a sidecar's checkpoint with the fleet key, use one
//! key for two sidecars, append an unterminated line to a sidecar's `events.jsonl`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use base64::Engine;
use serde_json::json;
use sha2::{Digest, Sha256};
use toolgate::audit::checkpoint::Checkpoint;
use toolgate::audit::keys::SignerKey;
use toolgate::audit::merkle::{Tree, leaf_hash};
use toolgate::hub::fleet::FLEET_MANIFEST_DOMAIN;

use crate::common;

const RUN: &str = "run-fleet-1";

fn key(name: &str, seed: u8) -> SignerKey {
    SignerKey::from_seed(name, [seed; 32]).unwrap()
}

fn fingerprint(key: &SignerKey) -> String {
    key.verifier.fingerprint()
}

fn origin(name: &str) -> String {
    format!("{name}.fleet.test/audit")
}

fn hex_all(hashes: &[[u8; 32]]) -> Vec<String> {
    hashes.iter().map(hex::encode).collect()
}

/// The event lines of one sidecar's log: `count` events, all of run [`RUN`].
fn event_lines(count: u64) -> Vec<String> {
    let mut prev = "0".repeat(64);
    (1..=count)
        .map(|seq| {
            let line = toolgate::canonical::to_canonical_string(&json!({
                "seq": seq,
                "event_id": format!("ev-{seq:012}"),
                "type": "tool_requested",
                "run_id": RUN,
                "prev": prev,
                "timestamp_utc": "2026-01-01T00:00:00.000Z",
                "contract_version": "v1",
                "details": {},
            }));
            prev = hex::encode(leaf_hash(line.as_bytes()));
            line
        })
        .collect()
}

/// Writes a fleet export of run [`RUN`] into `out` as `toolgate audit export
/// --cluster-db` does: per sidecar (origin, key) three events under its signed
/// checkpoint, that checkpoint a leaf of the fleet tree, the manifest (with the sha256
/// of every file) signed by `fleet`. Returns each sidecar's checkpoint note.
fn fabricate(out: &Path, fleet: &SignerKey, sidecars: &[(String, &SignerKey)]) -> Vec<String> {
    std::fs::create_dir_all(out).unwrap();
    let lines = event_lines(3);
    let leaves: Vec<[u8; 32]> = lines.iter().map(|l| leaf_hash(l.as_bytes())).collect();
    let tree = Tree::new(leaves.clone());
    let notes: Vec<String> = sidecars
        .iter()
        .map(|(origin, key)| {
            Checkpoint {
                origin: origin.clone(),
                size: 3,
                root: tree.root(3),
            }
            .sign(key)
        })
        .collect();
    let fleet_tree = Tree::new(notes.iter().map(|n| leaf_hash(n.as_bytes())).collect());
    let fleet_size = notes.len() as u64;
    let fleet_note = Checkpoint {
        origin: "toolgate/fleet".into(),
        size: fleet_size,
        root: fleet_tree.root(fleet_size),
    }
    .sign(fleet);
    let mut files = serde_json::Map::new();
    let mut write = |name: &str, text: &str| {
        let path = out.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        files.insert(name.to_string(), hex::encode(Sha256::digest(text)).into());
    };
    let mut entries = Vec::new();
    for (n, ((origin, key), note)) in sidecars.iter().zip(&notes).enumerate() {
        let dir = format!("sidecars/{:03}", n + 1);
        let mut events = String::new();
        let mut proofs = String::new();
        for (i, line) in lines.iter().enumerate() {
            events.push_str(line);
            events.push('\n');
            let path = tree.inclusion_proof(i as u64, 3).unwrap();
            proofs.push_str(
                &json!({"seq": i + 1, "tree_size": 3, "path": hex_all(&path)}).to_string(),
            );
            proofs.push('\n');
        }
        write(&format!("{dir}/events.jsonl"), &events);
        write(&format!("{dir}/proofs.jsonl"), &proofs);
        write(&format!("{dir}/checkpoint.txt"), note);
        let fleet_path = fleet_tree.inclusion_proof(n as u64, fleet_size).unwrap();
        entries.push(json!({
            "origin": origin,
            "dir": dir,
            "vkey": key.verifier.to_vkey(),
            "events": 3,
            "seqs": [1, 2, 3],
            "leaf_hashes": hex_all(&leaves),
            "checkpoint_size": 3,
            "fleet_leaf_index": n,
            "fleet_path": hex_all(&fleet_path),
        }));
    }
    write("fleet-checkpoint.txt", &fleet_note);
    let manifest = json!({
        "format": "toolgate-fleet-export/1",
        "run_id": RUN,
        "complete": true,
        "fleet": {
            "size": fleet_size,
            "root": hex::encode(fleet_tree.root(fleet_size)),
            "signer": fleet.verifier.name,
            "signer_vkey": fleet.verifier.to_vkey(),
            "cosigned": [],
        },
        "sidecars": entries,
        "files": files,
    });
    let text = serde_json::to_string_pretty(&manifest).unwrap() + "\n";
    let mut statement = FLEET_MANIFEST_DOMAIN.as_bytes().to_vec();
    statement.extend_from_slice(text.as_bytes());
    let mut signature = fleet.verifier.key_id.to_vec();
    signature.extend_from_slice(&fleet.sign(&statement));
    std::fs::write(out.join("manifest.json"), text).unwrap();
    std::fs::write(
        out.join("manifest.sig"),
        format!(
            "{} {}\n",
            fleet.verifier.name,
            base64::engine::general_purpose::STANDARD.encode(signature)
        ),
    )
    .unwrap();
    notes
}

/// The flags of an auditor who pinned the fleet key and both sidecars' keys.
fn pinned<'a>(fleet: &'a str, sidecars: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--fleet",
        "--expect-run",
        RUN,
        "--fleet-key-fingerprint",
        fleet,
    ];
    for fp in sidecars {
        args.extend(["--key-fingerprint", fp]);
    }
    args
}

struct Keys {
    fleet: SignerKey,
    a: SignerKey,
    b: SignerKey,
    fleet_fp: String,
    a_fp: String,
    b_fp: String,
}

fn keys() -> Keys {
    let (fleet, a, b) = (
        key("toolgate/fleet", 1),
        key(&origin("a"), 2),
        key(&origin("b"), 3),
    );
    Keys {
        fleet_fp: fingerprint(&fleet),
        a_fp: fingerprint(&a),
        b_fp: fingerprint(&b),
        fleet,
        a,
        b,
    }
}

#[test]
fn a_fleet_export_is_verified_only_as_one_and_the_trusted_checkpoint_is_applied() {
    let k = keys();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("export");
    let notes = fabricate(&out, &k.fleet, &[(origin("a"), &k.a), (origin("b"), &k.b)]);
    let args = pinned(&k.fleet_fp, &[&k.a_fp, &k.b_fp]);
    let (code, text) = common::verify_export(&out, &args);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("from 2 sidecars"), "{text}");
    // Bound to their origins, the sidecar keys pass too.
    let bound_a = format!("{}={}", origin("a"), k.a_fp);
    let bound_b = format!("{}={}", origin("b"), k.b_fp);
    let (code, text) = common::verify_export(&out, &pinned(&k.fleet_fp, &[&bound_a, &bound_b]));
    assert_eq!(code, 0, "{text}");

    // The manifest does not choose the weaker path: without --fleet it is refused.
    let (code, text) =
        common::verify_export(&out, &["--key-fingerprint", &k.a_fp, "--expect-run", RUN]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("--fleet"), "{text}");

    // A trusted checkpoint is never ignored: unreadable, it is an error.
    let missing = tmp.path().join("no-such.note");
    let mut with = args.clone();
    with.extend(["--trusted-checkpoint", missing.to_str().unwrap()]);
    let (code, text) = common::verify_export(&out, &with);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("trusted checkpoint"), "{text}");
    // A sidecar's checkpoint at the exported size: its root is compared.
    let kept = tmp.path().join("kept.note");
    std::fs::write(&kept, &notes[1]).unwrap();
    let mut with = args.clone();
    with.extend(["--trusted-checkpoint", kept.to_str().unwrap()]);
    let (code, text) = common::verify_export(&out, &with);
    assert_eq!(code, 0, "{text}");
    // The same size with another root (a rewritten history): a fork.
    let forked = Checkpoint {
        origin: origin("b"),
        size: 3,
        root: [9u8; 32],
    }
    .sign(&k.b);
    std::fs::write(&kept, &forked).unwrap();
    let (code, text) = common::verify_export(&out, &with);
    assert_eq!(code, 2, "{text}");
    // Another size: the export holds no proof that it extends it.
    let other = Checkpoint {
        origin: origin("b"),
        size: 2,
        root: [9u8; 32],
    }
    .sign(&k.b);
    std::fs::write(&kept, &other).unwrap();
    let (code, text) = common::verify_export(&out, &with);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("cannot show"), "{text}");
}

#[test]
fn the_fleet_key_and_each_sidecar_key_are_pinned_apart() {
    let k = keys();
    let tmp = tempfile::tempdir().unwrap();

    // A sidecar's checkpoint signed with the fleet key.
    let out = tmp.path().join("fleet-as-sidecar");
    fabricate(
        &out,
        &k.fleet,
        &[(origin("a"), &k.fleet), (origin("b"), &k.b)],
    );
    let (code, text) = common::verify_export(&out, &pinned(&k.fleet_fp, &[&k.fleet_fp, &k.b_fp]));
    assert_eq!(code, 3, "{text}");
    // A sidecar key pinned as the fleet key is not the fleet key either.
    let out = tmp.path().join("sidecar-as-fleet");
    fabricate(&out, &k.a, &[(origin("a"), &k.a), (origin("b"), &k.b)]);
    let (code, text) = common::verify_export(&out, &pinned(&k.fleet_fp, &[&k.a_fp, &k.b_fp]));
    assert_eq!(code, 3, "{text}");

    // One key signing for two sidecars.
    let out = tmp.path().join("one-key-two-origins");
    fabricate(&out, &k.fleet, &[(origin("a"), &k.a), (origin("b"), &k.a)]);
    let (code, text) = common::verify_export(&out, &pinned(&k.fleet_fp, &[&k.a_fp]));
    assert_eq!(code, 3, "{text}");

    // A key bound to an origin is refused for another.
    let out = tmp.path().join("swapped");
    fabricate(&out, &k.fleet, &[(origin("a"), &k.b), (origin("b"), &k.a)]);
    let bound_a = format!("{}={}", origin("a"), k.a_fp);
    let bound_b = format!("{}={}", origin("b"), k.b_fp);
    let (code, text) = common::verify_export(&out, &pinned(&k.fleet_fp, &[&bound_a, &bound_b]));
    assert_eq!(code, 3, "{text}");
}

#[test]
fn unterminated_data_after_a_sidecars_last_line_is_refused() {
    let k = keys();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("export");
    fabricate(&out, &k.fleet, &[(origin("a"), &k.a), (origin("b"), &k.b)]);
    let args = pinned(&k.fleet_fp, &[&k.a_fp, &k.b_fp]);
    assert_eq!(common::verify_export(&out, &args).0, 0);
    let events = out.join("sidecars/001/events.jsonl");
    let mut bytes = std::fs::read(&events).unwrap();
    bytes.extend_from_slice(br#"{"seq":4,"type":"tool_executed","run_id":"run-fleet-1"}"#);
    std::fs::write(&events, &bytes).unwrap();
    let (code, text) = common::verify_export(&out, &args);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sidecars/001/events.jsonl"), "{text}");
}
