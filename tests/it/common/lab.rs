//! The "lab" policy: a small policy of command and HTTP tools written for the execution
//! tests (tests/lab.rs, tests/deadline.rs), with a one-thread HTTP upstream.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Server, Start};

pub const ROLES: &str = r#"
version: "lab-1"
roles:
  - role_id: tester
    description: Runs the lab tools.
    enabled: true
    lanes: [lab]
    credential: {token_sha256: TESTER_SHA}
admins:
  - admin_id: ops
    description: Lab operator.
    credential: {token_sha256: ADMIN_SHA}
"#;

pub const LANES: &str = r#"
version: "lab-1"
lanes:
  - lane_id: lab
    description: Where the lab tools run.
    tools: [big_output, bad_output, echo_cmd, failing, sleeper, slow_one, upstream_echo]
    required_scope_keys: []
    prohibited_flags: []
    run_statuses: [active]
    write: true
"#;

pub const TOOLS: &str = r#"
version: "lab-1"
tools:
  - tool_name: sleeper
    description: Sleeps far past any deadline, with a background child in its process group.
    enabled: true
    version: 1.0.0
    determinism: side_effectful
    idempotent: false
    timeout_default_ms: 300
    limits: {timeout_ms_max: 1000, max_output_bytes: 1024, max_concurrency: 4}
    allowed_lanes: [lab]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: ["data_dir:lab/"]
    adapter: {kind: command, argv: ["sh", "-c", "sleep 47.25 & sleep 47.25"], sandbox: {filesystem: {exec: [/usr/bin]}}}
    input_schema: {type: object}
    output_schema: {type: object}
  - tool_name: echo_cmd
    description: Echoes its arguments back (cat reads the JSON on stdin).
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
    adapter: {kind: command, argv: ["cat"]}
    input_schema: {type: object, properties: {text: {type: string}}, required: [text], additionalProperties: false}
    output_schema: {type: object, properties: {text: {type: string}}, required: [text]}
  - tool_name: bad_output
    description: Returns something its output schema does not allow.
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
    adapter: {kind: command, argv: ["cat"]}
    input_schema: {type: object}
    output_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
  - tool_name: big_output
    description: Returns an output larger than its max_output_bytes.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 10000
    limits: {timeout_ms_max: 10000, max_output_bytes: 1024, max_concurrency: 4}
    allowed_lanes: [lab]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {kind: command, argv: ["python3", "-c", "import json; print(json.dumps({'blob': 'x' * 200000}))"], sandbox: {unconfined: "python3 here is a pyenv shim under /root, out of the sandbox user's reach"}}
    input_schema: {type: object}
    output_schema: {type: object, properties: {blob: {type: string}}, required: [blob]}
  - tool_name: failing
    description: Exits non-zero with a message on stderr.
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
    adapter: {kind: command, argv: ["sh", "-c", "echo the court is closed >&2; exit 3"]}
    input_schema: {type: object}
    output_schema: {type: object}
  - tool_name: slow_one
    description: Takes a second and runs one at a time.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {timeout_ms_max: 10000, max_output_bytes: 4096, max_concurrency: 1}
    allowed_lanes: [lab]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {kind: command, argv: ["python3", "-c", "import time; time.sleep(1.5); print('{}')"], sandbox: {unconfined: "python3 here is a pyenv shim under /root, out of the sandbox user's reach"}}
    input_schema: {type: object}
    output_schema: {type: object}
  - tool_name: upstream_echo
    description: Posts its arguments to an HTTP upstream.
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
    adapter: {kind: http, url: "http://UPSTREAM/echo", allowed_hosts: ["UPSTREAM"]}
    input_schema: {type: object}
    output_schema: {type: object, properties: {received: {type: object}}, required: [received]}
"#;

pub fn sha(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Reads one HTTP/1.1 request from `stream`: its head (request line and headers, as
/// text) and its body (by Content-Length). A broken connection reads as what arrived.
pub fn read_request(stream: &mut impl Read) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_end, len) = loop {
        let n = stream.read(&mut chunk).unwrap_or(0);
        if n == 0 {
            break (buf.len(), 0);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..pos]).to_lowercase();
            let len = head
                .lines()
                .find_map(|l| {
                    l.strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap_or(0))
                })
                .unwrap_or(0);
            break (pos + 4, len);
        }
    };
    while buf.len() < head_end + len {
        let n = stream.read(&mut chunk).unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    (head, buf.split_off(head_end))
}

/// A one-thread HTTP upstream that answers `{"received": <body>}` to every request.
pub fn start_upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (_, body) = read_request(&mut stream);
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let answer = json!({ "received": body }).to_string();
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    addr
}

pub fn lab(dir: &Path) -> Start {
    let upstream = start_upstream();
    let policy = dir.join("policy");
    let tools = dir.join("tools");
    fs::create_dir_all(&policy).unwrap();
    fs::create_dir_all(&tools).unwrap();
    fs::write(
        policy.join("roles.yaml"),
        ROLES
            .replace("TESTER_SHA", &sha("demo-tester"))
            .replace("ADMIN_SHA", &sha("demo-admin")),
    )
    .unwrap();
    fs::write(policy.join("lanes.yaml"), LANES).unwrap();
    fs::write(
        tools.join("tool_registry.yaml"),
        TOOLS.replace("UPSTREAM", &upstream),
    )
    .unwrap();
    Start {
        policy_dir: policy,
        tools: tools.join("tool_registry.yaml"),
        ..Start::default()
    }
}

pub fn call(
    server: &Server,
    run: &str,
    tool: &str,
    arguments: Value,
    extra: Value,
) -> (u16, Value) {
    let mut body = json!({
        "role_id": "tester", "run_id": run, "lane_id": "lab", "tool_name": tool,
        "arguments": arguments, "scope": {},
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    server.post("/v1/tool-calls", Some("demo-tester"), &body)
}

/// Processes whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}
