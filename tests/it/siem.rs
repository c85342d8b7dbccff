//! SIEM exports and shipping: `audit export --format ocsf|cef` over a varied log from the
//! real gateway, each OCSF record validated against the published OCSF JSON Schema
//! (PyPI's `ocsf-json-schema`, with `jsonschema`, in a test virtualenv) and each
//! record's evidence checked against its signed checkpoint with the library's own proof
//! code; CEF lines that a hostile tool name cannot add fields to.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{self, ADMIN, Server, lab};

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use toolgate::audit::checkpoint::verify_note;
use toolgate::audit::keys::load_verifier;
use toolgate::audit::merkle::{leaf_hash, verify_inclusion};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/siem/validate_ocsf.py")
}

/// The test environment's Python (tests/it/common/python.rs), with the OCSF schema
/// package and `jsonschema` importable.
fn ocsf_python() -> PathBuf {
    common::python::python()
}

/// A tool name no SIEM parser should split: CEF separators, escapes and a line break.
const HOSTILE_TOOL: &str = "evil|x=1 act=allowed\\ cs5=OK\nCEF:0|a|b|c|d|e|10|suser=root";

/// Drives the lab gateway through every kind of outcome and admin event; returns the
/// data directory (the gateway stopped).
fn varied_log(dir: &Path) -> PathBuf {
    let mut start = lab::lab(dir);
    let data_dir = dir.join("var");
    start.data_dir = Some(data_dir.clone());
    let server = Server::start_with(start);
    let (code, body) = server.post(
        "/v1/runs",
        Some(ADMIN),
        &json!({"scope": {}, "issue_tokens": [{"role_id": "tester"}]}),
    );
    assert_eq!(code, 201, "{body}");
    let run = body["run_id"].as_str().unwrap().to_string();
    let token_id = body["tokens"][0]["token_id"].as_str().unwrap().to_string();
    let run_token = body["tokens"][0]["token"].as_str().unwrap().to_string();
    let expect = |(code, body): (u16, Value), status: &str| {
        assert_eq!(body["status"], status, "{code} {body}");
        body
    };
    // Success, failure, timeout.
    expect(
        lab::call(&server, &run, "echo_cmd", json!({"text": "hi"}), json!({})),
        "success",
    );
    expect(
        lab::call(&server, &run, "failing", json!({}), json!({})),
        "failed",
    );
    expect(
        lab::call(&server, &run, "sleeper", json!({}), json!({})),
        "timeout",
    );
    // A call with only the run token.
    let (_, body) = server.post(
        "/v1/tool-calls",
        Some(&run_token),
        &json!({"tool_name": "echo_cmd", "arguments": {"text": "by token"}}),
    );
    expect((200, body), "success");
    // Denials: unknown tool (hostile name), bad arguments, wrong lane, unknown run, bad
    // credential, malformed request.
    let mut reasons = Vec::new();
    for (tool, args, extra, token) in [
        (HOSTILE_TOOL, json!({}), json!({}), "demo-tester"),
        ("echo_cmd", json!({"text": 5}), json!({}), "demo-tester"),
        (
            "echo_cmd",
            json!({"text": "x"}),
            json!({"lane_id": "nowhere"}),
            "demo-tester",
        ),
        (
            "echo_cmd",
            json!({"text": "x"}),
            json!({"run_id": "run-unknown"}),
            "demo-tester",
        ),
        ("echo_cmd", json!({"text": "x"}), json!({}), "not-a-token"),
        (
            "echo_cmd",
            json!({"text": "x"}),
            json!({"role_id": 17}),
            "demo-tester",
        ),
    ] {
        let mut body = json!({
            "role_id": "tester", "run_id": run, "lane_id": "lab", "tool_name": tool,
            "arguments": args, "scope": {},
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (_, answer) = server.post("/v1/tool-calls", Some(token), &body);
        let answer = expect((0, answer), "denied");
        reasons.push(answer["diagnostic"]["reason"].as_str().unwrap().to_string());
    }
    // Admin events: token revoked, safety lock (with a call refused under it), policy
    // reload, run status changes.
    let (code, body) = server.post(
        &format!("/v1/runs/{run}/tokens/{token_id}/revoke"),
        Some(ADMIN),
        &json!({}),
    );
    assert_eq!(code, 200, "{body}");
    let (code, _) = server.post(
        "/v1/safety-lock",
        Some(ADMIN),
        &json!({"engaged": true, "reason": "drill"}),
    );
    assert_eq!(code, 200);
    let (_, answer) = lab::call(&server, &run, "echo_cmd", json!({"text": "x"}), json!({}));
    reasons.push(expect((0, answer), "denied")["diagnostic"]["reason"].to_string());
    let (code, _) = server.post("/v1/safety-lock", Some(ADMIN), &json!({"engaged": false}));
    assert_eq!(code, 200);
    let (code, body) = server.post("/v1/policy/reload", Some(ADMIN), &json!({}));
    assert!(code == 200, "{code} {body}");
    let (code, body) = server.post(
        &format!("/v1/runs/{run}/status"),
        Some(ADMIN),
        &json!({"status": "suspended"}),
    );
    assert_eq!(code, 200, "{body}");
    let (_, answer) = lab::call(&server, &run, "echo_cmd", json!({"text": "x"}), json!({}));
    reasons.push(expect((0, answer), "denied")["diagnostic"]["reason"].to_string());
    println!("denial reasons covered: {reasons:?}");
    assert!(server.stop().success());
    data_dir
}

fn export(db: &Path, out: &Path, format: &str) {
    let (code, stdout, stderr) = common::run(
        db.parent().unwrap(),
        &[
            "audit",
            "export",
            "--db",
            db.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--format",
            format,
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
}

fn hash_hex(text: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).unwrap();
    out
}

#[test]
fn an_ocsf_export_validates_against_the_published_schema_and_every_record_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = varied_log(tmp.path());
    let db = data_dir.join("audit.db");
    let out = tmp.path().join("ocsf");
    export(&db, &out, "ocsf");
    let records_path = out.join("events.ocsf.jsonl");
    let lines: Vec<String> = fs::read_to_string(&records_path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let events = fs::read_to_string(out.join("events.jsonl")).unwrap();
    assert_eq!(lines.len(), events.lines().count());

    // 1. The published schema, zero errors.
    let output = Command::new(ocsf_python())
        .arg(script())
        .arg(&records_path)
        .output()
        .unwrap();
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "validator printed no summary ({e}): {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    println!("OCSF validation: {summary}");
    assert_eq!(summary["errors"], json!([]), "{summary}");
    assert_eq!(summary["records"], json!(lines.len()));
    assert!(output.status.success());

    // 2. Each record's evidence: raw_data hashes to the leaf, the leaf is in the signed
    // checkpoint's tree by the inclusion proof.
    let key = load_verifier(&data_dir.join("keys")).unwrap();
    let mut by_type: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (i, line) in lines.iter().enumerate() {
        let record: Value = serde_json::from_str(line).unwrap();
        let evidence = &record["unmapped"]["toolgate"]["evidence"];
        let seq = evidence["seq"].as_u64().unwrap();
        assert_eq!(seq, i as u64 + 1);
        assert_eq!(record["metadata"]["sequence"], json!(seq));
        let raw = record["raw_data"].as_str().unwrap();
        assert_eq!(raw, events.lines().nth(i).unwrap());
        let leaf = leaf_hash(raw.as_bytes());
        assert_eq!(evidence["leaf_hash_sha256"], json!(hex::encode(leaf)));
        let note = evidence["checkpoint"]["note"].as_str().unwrap();
        let checkpoint = verify_note(note, &key).unwrap();
        assert_eq!(evidence["checkpoint"]["size"], json!(checkpoint.size));
        let proof: Vec<[u8; 32]> = evidence["inclusion_proof"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| hash_hex(h.as_str().unwrap()))
            .collect();
        assert!(
            verify_inclusion(seq - 1, checkpoint.size, &leaf, &proof, &checkpoint.root),
            "seq {seq} does not verify against its checkpoint"
        );
        // A record whose raw_data was altered no longer verifies.
        let forged = leaf_hash(raw.replace("tester", "admin").as_bytes());
        if forged != leaf {
            assert!(!verify_inclusion(
                seq - 1,
                checkpoint.size,
                &forged,
                &proof,
                &checkpoint.root
            ));
        }
        let kind = record["metadata"]["event_code"]
            .as_str()
            .unwrap()
            .to_string();
        by_type.entry(kind).or_default().push(record);
    }
    for kind in [
        "run_created",
        "run_token_issued",
        "run_token_revoked",
        "tool_requested",
        "tool_executed",
        "tool_failed",
        "tool_timeout",
        "tool_denied",
        "safety_lock_engaged",
        "safety_lock_released",
        "policy_loaded",
        "run_status_changed",
    ] {
        assert!(
            by_type.contains_key(kind),
            "no {kind} in {:?}",
            by_type.keys()
        );
    }

    // 3. The mapping of the fields that matter.
    let executed = &by_type["tool_executed"][0];
    assert_eq!(executed["class_uid"], json!(6003));
    assert_eq!(executed["type_uid"], json!(600399));
    assert_eq!(executed["api"]["operation"], json!("execute_tool"));
    assert_eq!(executed["api"]["service"]["name"], json!("echo_cmd"));
    assert_eq!(executed["status_id"], json!(1));
    let raw: Value = serde_json::from_str(executed["raw_data"].as_str().unwrap()).unwrap();
    assert_eq!(executed["actor"]["session"]["uid"], raw["run_id"]);
    assert_eq!(
        executed["actor"]["user"]["groups"][0]["name"],
        json!("tester")
    );
    assert_eq!(executed["api"]["request"]["uid"], raw["call_id"]);
    assert_eq!(executed["metadata"]["correlation_uid"], raw["call_id"]);
    // The hostile tool name fails request validation: the denial is recorded with the
    // request's digest and excerpt (never as a field a SIEM would parse).
    let hostile = by_type["tool_denied"]
        .iter()
        .find(|r| r["status_detail"] == json!("request_malformed"))
        .expect("the malformed request is a recorded denial");
    assert_eq!(hostile["status_id"], json!(2));
    assert_eq!(hostile["action_id"], json!(2));
    assert_eq!(hostile["disposition_id"], json!(2));
    assert!(hostile["status_code"].is_string() && hostile["status_detail"].is_string());
    assert_eq!(
        hostile["api"]["response"]["error_message"],
        hostile["status_detail"]
    );
    let timeout = &by_type["tool_timeout"][0];
    assert_eq!(timeout["status_id"], json!(2));
    assert_eq!(timeout["disposition"], json!("Error"));
    let by_token = by_type["tool_executed"]
        .iter()
        .find(|r| r["actor"]["user"]["credential_uid"].is_string())
        .expect("the run-token call names its token in actor.user");
    assert!(by_token["unmapped"]["toolgate"]["caller"]["kind"] == json!("run_token"));
    assert_eq!(by_type["run_created"][0]["class_uid"], json!(3004));
    assert_eq!(by_type["safety_lock_engaged"][0]["class_uid"], json!(6002));
    assert_eq!(by_type["safety_lock_engaged"][0]["activity_id"], json!(7));
    assert_eq!(by_type["policy_loaded"][0]["class_uid"], json!(6002));

    // 4. The CEF view of the same log: one line per event, the hostile name a value.
    let cef_out = tmp.path().join("cef");
    export(&db, &cef_out, "cef");
    let cef = fs::read_to_string(cef_out.join("events.cef")).unwrap();
    let cef_lines: Vec<&str> = cef.lines().collect();
    assert_eq!(cef_lines.len(), lines.len());
    for (i, line) in cef_lines.iter().enumerate() {
        assert!(line.starts_with("CEF:0|toolgate|toolgate|"), "{line}");
        let fields = cef_extension(line);
        let get = |k: &str| {
            fields
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("cn1"), Some((i + 1).to_string()), "{line}");
        let raw = events.lines().nth(i).unwrap();
        assert_eq!(get("cs6"), Some(hex::encode(leaf_hash(raw.as_bytes()))));
        let keys: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        let mut unique = keys.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "a field repeats: {line}");
        for key in &keys {
            assert!(CEF_KEYS.contains(key), "unexpected CEF key {key}: {line}");
        }
    }
    // No line, whatever the agent sent, carries a field toolgate did not write (checked
    // above) or a value planted by the hostile name.
    for line in &cef_lines {
        let fields = cef_extension(line);
        assert!(
            !fields
                .iter()
                .any(|(k, v)| (k == "suser" && v == "root") || (k == "cs5" && v == "OK"))
        );
        assert!(
            fields.iter().filter(|(k, _)| k == "act").count() <= 1,
            "{line}"
        );
    }
}

/// Every extension key toolgate writes.
const CEF_KEYS: [&str; 33] = [
    "rt",
    "externalId",
    "cn1Label",
    "cn1",
    "outcome",
    "msg",
    "act",
    "suser",
    "spriv",
    "cs1Label",
    "cs1",
    "cs2Label",
    "cs2",
    "cs3Label",
    "cs3",
    "cs4Label",
    "cs4",
    "cs5Label",
    "cs5",
    "reason",
    "cs6Label",
    "cs6",
    "cn2Label",
    "cn2",
    "cn3Label",
    "cn3",
    "flexNumber1Label",
    "flexNumber1",
    "flexString1Label",
    "flexString1",
    "flexString2Label",
    "flexString2",
    "deviceExternalId",
];

/// The (key, value) pairs of a CEF line's extension, split and unescaped the way a
/// receiver does: the header is the first 7 unescaped `|`-separated fields; in the
/// extension a key is `[A-Za-z0-9_]+` directly before an unescaped `=`.
fn cef_extension(line: &str) -> Vec<(String, String)> {
    let chars: Vec<char> = line.chars().collect();
    let (mut pipes, mut i) = (0, 0);
    while i < chars.len() && pipes < 7 {
        match chars[i] {
            '\\' => i += 1,
            '|' => pipes += 1,
            _ => {}
        }
        i += 1;
    }
    let ext = &chars[i..];
    let mut starts = Vec::new();
    let mut j = 0;
    while j < ext.len() {
        if ext[j] == '\\' {
            j += 2;
            continue;
        }
        if ext[j] == '=' {
            let mut k = j;
            while k > 0 && (ext[k - 1].is_ascii_alphanumeric() || ext[k - 1] == '_') {
                k -= 1;
            }
            starts.push((k, j));
        }
        j += 1;
    }
    let mut out = Vec::new();
    for (n, (k, eq)) in starts.iter().enumerate() {
        let end = starts
            .get(n + 1)
            .map_or(ext.len(), |(next, _)| next.saturating_sub(1));
        let key: String = ext[*k..*eq].iter().collect();
        let mut value = String::new();
        let mut it = ext[eq + 1..end.max(eq + 1)].iter();
        while let Some(c) = it.next() {
            if *c == '\\' {
                match it.next() {
                    Some('n') => value.push('\n'),
                    Some('r') => value.push('\r'),
                    Some(o) => value.push(*o),
                    None => {}
                }
            } else {
                value.push(*c);
            }
        }
        out.push((key, value));
    }
    out
}
