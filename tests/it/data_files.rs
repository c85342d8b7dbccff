//! The modes of what toolgate writes (issue 38, finding 7): the real server, run under
//! the most permissive umask with every feature that writes a file (approvals,
//! two-phase calls with the stand-in court, drafts, artifacts and their reads, sealed
//! segments, shipping to a loopback syslog listener and to a file, a run's evidence
//! bundle, the keys), leaves every file in its data and key directories 0600 and every
//! directory 0700; and files left wider (an older version, a copy, a `chmod`) are made
//! owner-only at the next start, each named in a warning.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::approvals::{approval_policy, decide, draft_call, request, send, with_approval};
use crate::common::{self, ADMIN, Server, Start, token};
use crate::two_phase::Court;

/// A tool whose output is larger than its limit: kept as an artifact.
const BIG_OUTPUT: &str = r#"
  - tool_name: big_output
    description: Returns an output larger than its max_output_bytes.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 10000
    limits: {timeout_ms_max: 10000, max_output_bytes: 1024, max_concurrency: 4}
    allowed_lanes: [research]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {kind: command, argv: ["/usr/bin/python3", "-c", "import json; print(json.dumps({'blob': 'x' * 200000}))"]}
    input_schema: {type: object}
    output_schema: {type: object, properties: {blob: {type: string}}, required: [blob]}
"#;

/// Every entry under `root` (itself included) whose mode is not owner-only: files
/// 0600, directories 0700; symbolic links are listed as such.
fn not_owner_only(root: &Path) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o7777;
        if meta.file_type().is_symlink() {
            wrong.push(format!("{} is a symbolic link", path.display()));
        } else if meta.is_dir() {
            if mode != 0o700 {
                wrong.push(format!("{} (directory) is {mode:o}", path.display()));
            }
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
        } else if mode != 0o600 {
            wrong.push(format!("{} is {mode:o}", path.display()));
        }
    }
    wrong
}

/// Every path under `root`, files and directories.
fn entries(root: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
        }
        all.push(path);
    }
    all
}

/// A syslog-over-TCP listener on loopback that reads and drops what it is sent.
fn loopback_sink() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[test]
fn every_file_a_run_with_every_feature_leaves_is_owner_only_under_a_permissive_umask() {
    let tmp = tempfile::tempdir().unwrap();
    let court = Court::start();
    let mut start = approval_policy(tmp.path(), 1, 3600);
    let registry = std::fs::read_to_string(&start.tools).unwrap();
    assert!(registry.contains("127.0.0.1:8799"), "the demo court moved");
    std::fs::write(
        &start.tools,
        registry.replace("127.0.0.1:8799", &court.host) + BIG_OUTPUT,
    )
    .unwrap();
    let lanes = start.policy_dir.join("lanes.yaml");
    let text = std::fs::read_to_string(&lanes).unwrap();
    let research = "tools: [case_lookup, legal_search, read_document, disabled_tool]";
    assert!(text.contains(research), "the research lane moved");
    std::fs::write(
        &lanes,
        text.replace(
            research,
            "tools: [case_lookup, legal_search, read_document, disabled_tool, big_output]",
        ),
    )
    .unwrap();
    let data = tmp.path().join("var");
    start.data_dir = Some(data.clone());
    start.args = vec![
        "--audit-segment-bytes".into(),
        "65536".into(),
        "--ship".into(),
        format!("syslog+tcp://{}", loopback_sink()),
        "--ship".into(),
        format!("file:{}", data.join("siem").join("events.jsonl").display()),
    ];
    let server = Server::start_under_umask(start, "000");
    let run = server.create_run(json!({"case_id": "C-1001", "matter_id": "M-1"}));

    // A draft, written under an approval.
    let call = draft_call(&run, "motion");
    let approval = request(&server, &call);
    assert_eq!(
        decide(&server, Some(ADMIN), &approval, "approve", "ok").0,
        200
    );
    let (code, drafted) = send(&server, &with_approval(&call, &approval));
    assert_eq!(code, 200, "{drafted}");
    let draft_id = drafted["output"]["draft_id"].as_str().unwrap();

    // A two-phase filing with the court, under its approval, prepared and committed.
    let filing = json!({
        "role_id": "filing_agent", "run_id": run, "lane_id": "filing",
        "tool_name": "file_with_court", "arguments": {"draft_id": draft_id},
        "scope": {"case_id": "C-1001", "matter_id": "M-1"},
    });
    let approval = request(&server, &filing);
    assert_eq!(
        decide(&server, Some(ADMIN), &approval, "approve", "file it").0,
        200
    );
    let (code, prepared) = send(&server, &with_approval(&filing, &approval));
    assert_eq!(code, 200, "{prepared}");
    assert_eq!(prepared["details"]["phase"], "prepared", "{prepared}");
    let call_id = prepared["call_id"].as_str().unwrap();
    let (code, committed) = server.post(
        &format!("/v1/tool-calls/{call_id}/commit"),
        Some(&token("filing_agent")),
        &json!({
            "commit_id": prepared["details"]["commit"]["commit_id"],
            "role_id": "filing_agent", "run_id": run,
        }),
    );
    assert_eq!(code, 200, "{committed}");

    // An artifact, and its read.
    let scope = json!({"case_id": "C-1001"});
    let (code, big) = server.call(
        "research_agent",
        &run,
        "research",
        "big_output",
        json!({}),
        scope.clone(),
    );
    assert_eq!(code, 200, "{big}");
    let sha256 = big["artifact"]["sha256"].as_str().unwrap();
    let (code, _) = server.get(
        &format!("/v1/artifacts/{sha256}?run_id={run}&role_id=research_agent"),
        Some(&token("research_agent")),
    );
    assert_eq!(code, 200);

    // Enough calls for a sealed segment.
    let sealed = common::poll_until(Duration::from_secs(120), || {
        let (code, body) = server.call(
            "research_agent",
            &run,
            "research",
            "legal_search",
            json!({"query": "duty of care", "limit": 3}),
            scope.clone(),
        );
        assert_eq!(code, 200, "{body}");
        data.join("audit-000002.db").exists()
    });
    assert!(sealed, "no second segment");

    // The run's evidence bundle (built in the data directory).
    let (code, body) = server.get(&format!("/v1/runs/{run}/export"), Some(ADMIN));
    assert_eq!(code, 200, "{body}");

    // Both sinks have their cursors.
    assert!(common::poll_until(Duration::from_secs(30), || {
        std::fs::read_dir(data.join("ship")).is_ok_and(|d| d.count() >= 2)
    }));
    assert!(server.stop().success());

    let made: Vec<String> = entries(&data)
        .iter()
        .filter_map(|p| p.strip_prefix(&data).ok()?.to_str().map(str::to_string))
        .collect();
    for expected in [
        "audit.db",
        "audit-000002.db",
        "approvals.db",
        "phases.db",
        "counters.db",
        "checkpoints.log",
        "keys/audit-signing.key",
        "keys/audit-signing.vkey",
        "keys/audit-hmac.key",
        "siem/events.jsonl",
        "drafts/C-1001",
        "artifacts",
        "ship",
        "exports",
    ] {
        assert!(
            made.iter().any(|m| m == expected),
            "no {expected} in {made:?}"
        );
    }
    let wal_files = made.iter().filter(|m| m.ends_with("-wal")).count();
    assert!(wal_files > 0, "no WAL file was left to check: {made:?}");
    let wrong = not_owner_only(&data);
    assert!(
        wrong.is_empty(),
        "not owner-only under umask 000: {wrong:#?}"
    );
}

#[test]
fn a_data_file_left_readable_by_others_is_made_owner_only_at_start_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let start = || Start {
        data_dir: Some(data.clone()),
        ..Start::default()
    };
    let server = Server::start_with(start());
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, body) = server.look_up_case(&run);
    assert_eq!(code, 200, "{body}");
    assert!(server.stop().success());
    assert!(not_owner_only(&data).is_empty());

    // What an older version (or a copy, or a chmod) leaves: readable by everyone.
    let widened: Vec<PathBuf> = entries(&data);
    for path in &widened {
        let mode = if path.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    for name in ["audit.db", "approvals.db", "keys/audit-signing.key"] {
        assert!(widened.contains(&data.join(name)), "no {name}");
    }

    let server = Server::start_with(start());
    for path in &widened {
        let named = server.log_lines_with(&format!("\"path\":\"{}\"", path.display()));
        assert!(
            named.iter().any(|l| l.contains("made owner-only")),
            "no warning names {}",
            path.display()
        );
    }
    let wrong = not_owner_only(&data);
    assert!(wrong.is_empty(), "left as found: {wrong:#?}");
    // ... and the gateway works on them.
    let (code, body) = server.look_up_case(&run);
    assert_eq!(code, 200, "{body}");
    let line: Value = serde_json::from_str(&server.log_lines_with("made owner-only")[0]).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
}
