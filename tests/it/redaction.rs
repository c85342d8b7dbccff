//! Redaction covers every path an argument value can take (issue 12): a secret planted
//! under a redacted pointer is echoed by a failing command tool on stderr and by an
//! HTTP upstream in its error body; it must appear in no output: the responses, the
//! audit database's bytes, an export, `audit tail`, or the server's log lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::Path;

use common::lab::{read_request, sha};
use common::{Server, Start, run};
use serde_json::{Value, json};

const SECRET: &str = "hunter2-Pl4nted-s3cret";

const ROLES: &str = r#"
version: "r-1"
roles:
  - role_id: tester
    description: Runs the leaky tools.
    enabled: true
    lanes: [lab]
    credential: {token_sha256: TESTER_SHA}
admins:
  - admin_id: ops
    description: Operator.
    credential: {token_sha256: ADMIN_SHA}
"#;

const LANES: &str = r#"
version: "r-1"
lanes:
  - lane_id: lab
    description: Where the leaky tools run.
    tools: [leaky_cmd, leaky_http, leaky_http_down]
    required_scope_keys: []
    prohibited_flags: []
    run_statuses: [active]
    write: false
"#;

const TOOLS: &str = r#"
version: "r-1"
tools:
  - tool_name: leaky_cmd
    description: Echoes its input (with the password) to stderr, then fails.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {timeout_ms_max: 10000, max_output_bytes: 4096, max_concurrency: 4}
    allowed_lanes: [lab]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    redaction: {mode: fields, pointers: [/password]}
    adapter: {kind: command, argv: ["sh", "-c", "echo login failed for: >&2; cat >&2; exit 3"], sandbox: {filesystem: {exec: [/usr/bin]}}}
    input_schema: {type: object}
    output_schema: {type: object}
  - tool_name: leaky_http
    description: Posts its input to an upstream that echoes it in a 400 error body.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {timeout_ms_max: 10000, max_output_bytes: 4096, max_concurrency: 4}
    allowed_lanes: [lab]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    redaction: {mode: fields, pointers: [/password]}
    adapter: {kind: http, url: "http://UPSTREAM/400", allowed_hosts: ["UPSTREAM"]}
    input_schema: {type: object}
    output_schema: {type: object}
  - tool_name: leaky_http_down
    description: The same upstream answering 500 (a dependency down).
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {timeout_ms_max: 10000, max_output_bytes: 4096, max_concurrency: 4}
    allowed_lanes: [lab]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    redaction: {mode: fields, pointers: [/password]}
    adapter: {kind: http, url: "http://UPSTREAM/500", allowed_hosts: ["UPSTREAM"]}
    input_schema: {type: object}
    output_schema: {type: object}
"#;

/// An upstream that answers every request with an error whose body echoes the request
/// body: 400 on `/400`, 500 otherwise.
fn start_echoing_upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (head, body) = read_request(&mut stream);
            let status = if head.contains("/400 ") {
                "400 Bad Request"
            } else {
                "500 Internal Server Error"
            };
            let body = format!("invalid credentials in {}", String::from_utf8_lossy(&body));
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    addr
}

fn policy(dir: &Path) -> Start {
    let upstream = start_echoing_upstream();
    let policy = dir.join("policy");
    fs::create_dir_all(&policy).unwrap();
    fs::write(
        policy.join("roles.yaml"),
        ROLES
            .replace("TESTER_SHA", &sha("demo-tester"))
            .replace("ADMIN_SHA", &sha("demo-admin")),
    )
    .unwrap();
    fs::write(policy.join("lanes.yaml"), LANES).unwrap();
    let tools = dir.join("tool_registry.yaml");
    fs::write(&tools, TOOLS.replace("UPSTREAM", &upstream)).unwrap();
    Start {
        policy_dir: policy,
        tools,
        data_dir: Some(dir.join("var")),
        // Every log line the server writes, not only warnings.
        env: vec![("TOOLGATE_LOG".into(), "debug".into())],
        ..Start::default()
    }
}

/// Every file under `dir`, as bytes, with its path.
fn files(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push((path.display().to_string(), fs::read(&path).unwrap()));
        }
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn a_redacted_value_appears_in_no_output() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(policy(tmp.path()));
    let run_id = server.create_run(json!({}));
    let mut responses = Vec::new();
    for tool in ["leaky_cmd", "leaky_http", "leaky_http_down"] {
        let body = json!({
            "role_id": "tester", "run_id": run_id, "lane_id": "lab", "tool_name": tool,
            "arguments": {"user": "alice", "password": SECRET},
            "scope": {},
        });
        let (status, answer) = server.post("/v1/tool-calls", Some("demo-tester"), &body);
        assert_ne!(status, 200, "{answer}");
        // The failure is still explained (the echo happened), just without the value.
        let text = answer.to_string();
        assert!(text.contains("[redacted]"), "{tool}: {answer}");
        assert!(
            text.contains("alice"),
            "non-redacted input stays readable: {answer}"
        );
        responses.push(answer);
    }
    let data = server.data_dir.clone();
    let db = server.db();
    // The log lines, while the server runs: every call's line is in before they are
    // taken (lines reach stderr in batches), so the search below covers all three.
    for r in &responses {
        let call_id = r["call_id"].as_str().unwrap();
        assert!(
            !server.log_lines_with(call_id).is_empty(),
            "no log line for {call_id}"
        );
    }
    let logged: Vec<String> = server.log_lines_with("");
    assert_eq!(server.stop().code(), Some(0));

    let mut outputs: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, r) in responses.iter().enumerate() {
        outputs.push((format!("response {i}"), r.to_string().into_bytes()));
    }
    outputs.push(("server log".into(), logged.join("\n").into_bytes()));
    // The audit database and everything else in the data directory, byte for byte.
    files(&data, &mut outputs);
    let export = tmp.path().join("export");
    let (exit, out, err) = run(
        tmp.path(),
        &[
            "audit",
            "export",
            "--db",
            db.to_str().unwrap(),
            "--out",
            export.to_str().unwrap(),
            "--format",
            "csv",
        ],
    );
    assert_eq!(exit, 0, "{out}{err}");
    files(&export, &mut outputs);
    let (exit, tail, _) = run(tmp.path(), &["audit", "tail", "--db", db.to_str().unwrap()]);
    assert_eq!(exit, 0);
    outputs.push(("audit tail".into(), tail.clone().into_bytes()));
    // The test can fail: the tool failures are in the log, with their echoed input.
    let failures: Vec<Value> = tail
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "tool_failed")
        .collect();
    assert_eq!(failures.len(), 3, "{tail}");
    assert!(
        tail.contains("[redacted]") && tail.contains("alice"),
        "{tail}"
    );
    for (what, bytes) in &outputs {
        assert!(!contains(bytes, SECRET), "the secret leaked into {what}");
    }
}
