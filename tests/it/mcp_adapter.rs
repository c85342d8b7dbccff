//! The MCP adapter over real HTTP through the real binary: a real third-party MCP
//! server (`mcp-server-time`, over stdio), a server built with the official Python
//! SDK (over Streamable HTTP), and a hand-written stdio server that crashes and
//! hangs on purpose (supervision: restart, deadline, process killed). Also
//! `toolgate mcp import`: what it prints loads with the policy loader and runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::mcp_support as support;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::lab::sha;
use common::{BIN, Server, Start};
use serde_json::{Value, json};

const ROLES: &str = r#"
version: "mcp-lab-1"
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

/// One registry entry of a lab tool executed through an `mcp` adapter.
pub(crate) struct LabTool {
    pub name: &'static str,
    pub adapter: String,
    pub timeout_ms: u64,
    pub output_schema: &'static str,
}

/// Writes a lab policy (one role, one lane holding every tool) and returns how to
/// start a server on it.
pub(crate) fn lab(dir: &Path, tools: &[LabTool]) -> Start {
    lab_with_servers(dir, "", tools)
}

/// [`lab`] with a `servers:` section (`servers` is its YAML list, or empty).
pub(crate) fn lab_with_servers(dir: &Path, servers: &str, tools: &[LabTool]) -> Start {
    let policy = dir.join("policy");
    let tools_dir = dir.join("tools");
    fs::create_dir_all(&policy).unwrap();
    fs::create_dir_all(&tools_dir).unwrap();
    fs::write(
        policy.join("roles.yaml"),
        ROLES
            .replace("TESTER_SHA", &sha("demo-tester"))
            .replace("ADMIN_SHA", &sha("demo-admin")),
    )
    .unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name).collect();
    fs::write(
        policy.join("lanes.yaml"),
        format!(
            "version: \"mcp-lab-1\"\nlanes:\n  - lane_id: lab\n    description: Where the lab tools run.\n    tools: [{}]\n    required_scope_keys: []\n    prohibited_flags: []\n    run_statuses: [active]\n    write: true\n",
            names.join(", ")
        ),
    )
    .unwrap();
    let mut registry = String::from("version: \"mcp-lab-1\"\n");
    if !servers.is_empty() {
        registry.push_str("servers:\n");
        registry.push_str(servers);
    }
    registry.push_str("tools:\n");
    for t in tools {
        registry.push_str(&format!(
            r#"  - tool_name: {name}
    description: Lab tool {name}.
    enabled: true
    version: 1.0.0
    determinism: idempotent
    idempotent: true
    timeout_default_ms: {timeout}
    limits: {{timeout_ms_max: 60000, max_output_bytes: 65536, max_concurrency: 4}}
    allowed_lanes: [lab]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {adapter}
    input_schema: {{type: object}}
    output_schema: {output}
"#,
            name = t.name,
            timeout = t.timeout_ms,
            adapter = t.adapter,
            output = t.output_schema,
        ));
    }
    fs::write(tools_dir.join("tool_registry.yaml"), registry).unwrap();
    Start {
        policy_dir: policy,
        tools: tools_dir.join("tool_registry.yaml"),
        ..Start::default()
    }
}

pub(crate) fn call(server: &Server, run: &str, tool: &str, arguments: Value) -> (u16, Value) {
    let body = json!({
        "role_id": "tester", "run_id": run, "lane_id": "lab", "tool_name": tool,
        "arguments": arguments, "scope": {},
    });
    server.post("/v1/tool-calls", Some("demo-tester"), &body)
}

/// An `mcp` adapter running tests/mcp/lab_server.py with its state in `state`.
pub(crate) fn lab_server(state: &Path, mode: &str, tool: &str) -> String {
    let bin = support::open_to_sandbox(state);
    format!(
        "{{kind: mcp, command: {}, tool: {tool}, sandbox: {}}}",
        json!([
            support::SYSTEM_PYTHON,
            bin.join("lab_server.py"),
            state,
            mode
        ]),
        support::sandbox(std::slice::from_ref(&bin), &[state])
    )
}

pub(crate) fn starts(state: &Path) -> usize {
    fs::read_to_string(state.join("starts"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// The live (not zombie) processes whose command line mentions `needle`.
pub(crate) fn processes_mentioning(needle: &Path) -> Vec<String> {
    let needle = needle.to_str().unwrap();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) && !stat.contains(") Z") {
            found.push(pid);
        }
    }
    found
}

/// Waits (at most 20 s) until no process mentions `needle`.
pub(crate) fn none_left(needle: &Path) -> bool {
    common::poll_until(Duration::from_secs(20), || {
        processes_mentioning(needle).is_empty()
    })
}

pub(crate) const ANY_OBJECT: &str = "{type: object}";
pub(crate) const ECHO_OUTPUT: &str = "{type: object, properties: {text: {type: string}, start: {type: integer}}, required: [text, start], additionalProperties: false}";

#[test]
fn a_real_third_party_server_over_stdio_answers_through_the_gateway() {
    let python = support::python();
    let dir = tempfile::tempdir().unwrap();
    let command = json!([
        python,
        "-m",
        "mcp_server_time",
        "--local-timezone",
        "Etc/UTC"
    ]);
    let server = Server::start_with(lab(
        dir.path(),
        &[LabTool {
            name: "convert_time",
            adapter: format!(
                "{{kind: mcp, command: {command}, tool: convert_time, sandbox: {}}}",
                support::UNCONFINED_PYTHON
            ),
            timeout_ms: 30000,
            output_schema: "{type: object, properties: {source: {type: object}, target: {type: object, properties: {datetime: {type: string}, timezone: {type: string}}, required: [datetime, timezone]}, time_difference: {type: string}}, required: [source, target, time_difference]}",
        }],
    ));
    let run = server.create_run(json!({}));
    let arguments =
        json!({"source_timezone": "Etc/UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"});
    for _ in 0..2 {
        // The second call reuses the running server.
        let (status, body) = call(&server, &run, "convert_time", arguments.clone());
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "success");
        let target = &body["output"]["target"];
        assert_eq!(target["timezone"], "Asia/Tokyo");
        assert!(
            target["datetime"].as_str().unwrap().contains("T21:00:00"),
            "{body}"
        );
        assert_eq!(body["output"]["time_difference"], "+9.0h");
    }
    // The upstream's own validation error is a tool error, not a hang.
    let (status, body) = call(
        &server,
        &run,
        "convert_time",
        json!({"source_timezone": "Nowhere/Atlantis", "time": "12:00", "target_timezone": "Etc/UTC"}),
    );
    assert_eq!(
        body["diagnostic"]["reason"], "tool_error",
        "{status} {body}"
    );
}

#[test]
fn an_upstream_that_crashes_is_dependency_down_and_restarted_by_the_next_call() {
    let dir = tempfile::tempdir().unwrap();
    let at_start = dir.path().join("state-start");
    let mid_call = dir.path().join("state-call");
    let server = Server::start_with(lab(
        dir.path(),
        &[
            LabTool {
                name: "crashes_at_start",
                adapter: lab_server(&at_start, "crash-first", "echo"),
                timeout_ms: 20000,
                output_schema: ECHO_OUTPUT,
            },
            LabTool {
                name: "crashes_mid_call",
                adapter: lab_server(&mid_call, "crash-first-call", "echo"),
                timeout_ms: 20000,
                output_schema: ECHO_OUTPUT,
            },
        ],
    ));
    let run = server.create_run(json!({}));

    // The server exits before its handshake: dependency down, with its stderr.
    let (status, body) = call(&server, &run, "crashes_at_start", json!({"text": "hi"}));
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error_code"], "TOOL_DEPENDENCY_DOWN");
    let why = body["diagnostic"]["details"]["dependency_error"]
        .as_str()
        .unwrap();
    assert!(why.contains("refusing to start (start 1)"), "{why}");
    // The next call starts it again, and this time it works.
    let (status, body) = call(&server, &run, "crashes_at_start", json!({"text": "hi"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"], json!({"text": "hi", "start": 2}));
    assert_eq!(starts(&at_start), 2);

    // The server dies in the middle of a call: dependency down, then restarted.
    let (_, body) = call(&server, &run, "crashes_mid_call", json!({"text": "a"}));
    assert_eq!(body["diagnostic"]["reason"], "dependency_down", "{body}");
    let why = body["diagnostic"]["details"]["dependency_error"]
        .as_str()
        .unwrap();
    assert!(why.contains("crashing in the first call"), "{why}");
    let (_, body) = call(&server, &run, "crashes_mid_call", json!({"text": "b"}));
    assert_eq!(body["output"], json!({"text": "b", "start": 2}), "{body}");

    // The servers run until the gateway stops, and stop with it.
    assert!(!processes_mentioning(&mid_call).is_empty());
    assert!(server.stop().success());
    assert!(none_left(&at_start) && none_left(&mid_call));
}

#[test]
fn an_upstream_that_hangs_times_out_within_the_deadline_and_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let hangs_in_call = dir.path().join("state-call");
    let hangs_in_handshake = dir.path().join("state-handshake");
    let server = Server::start_with(lab(
        dir.path(),
        &[
            LabTool {
                name: "hangs_in_call",
                adapter: lab_server(&hangs_in_call, "", "hang"),
                timeout_ms: 4000,
                output_schema: ANY_OBJECT,
            },
            LabTool {
                name: "hangs_in_handshake",
                adapter: lab_server(&hangs_in_handshake, "hang-handshake", "echo"),
                timeout_ms: 4000,
                output_schema: ANY_OBJECT,
            },
        ],
    ));
    let run = server.create_run(json!({}));
    for (tool, state) in [
        ("hangs_in_call", &hangs_in_call),
        ("hangs_in_handshake", &hangs_in_handshake),
    ] {
        let started = Instant::now();
        let (status, body) = call(&server, &run, tool, json!({}));
        // A generous upper bound that proves "no hang" (the deadline is 4 s).
        assert!(started.elapsed() < Duration::from_secs(20), "{tool} hung");
        assert_eq!(status, 504, "{tool}: {body}");
        assert_eq!(body["status"], "timeout");
        assert_eq!(body["error_code"], "TOOL_TIMEOUT");
        // The stuck server was terminated, not left running the call.
        assert!(
            none_left(state),
            "{tool}: {:?} still run",
            processes_mentioning(state)
        );
    }
    // The next call starts a fresh server (and times out again, within its deadline).
    let (_, body) = call(&server, &run, "hangs_in_call", json!({}));
    assert_eq!(body["status"], "timeout", "{body}");
    assert_eq!(starts(&hangs_in_call), 2);
    assert!(none_left(&hangs_in_call));
}

#[test]
fn an_error_result_is_a_tool_error_and_bad_output_is_withheld() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let server = Server::start_with(lab(
        dir.path(),
        &[
            LabTool {
                name: "fails",
                adapter: lab_server(&state, "", "fail"),
                timeout_ms: 20000,
                output_schema: ANY_OBJECT,
            },
            LabTool {
                name: "echo_wrong_schema",
                adapter: lab_server(&state, "", "echo"),
                timeout_ms: 20000,
                output_schema: "{type: object, required: [missing]}",
            },
            LabTool {
                name: "no_such_upstream_tool",
                adapter: lab_server(&state, "", "nope"),
                timeout_ms: 20000,
                output_schema: ANY_OBJECT,
            },
        ],
    ));
    let run = server.create_run(json!({}));
    let (_, body) = call(&server, &run, "fails", json!({}));
    assert_eq!(body["diagnostic"]["reason"], "tool_error", "{body}");
    let why = body["diagnostic"]["details"]["tool_error"]
        .as_str()
        .unwrap();
    assert!(why.contains("the archive is closed today"), "{why}");
    // The registry's output schema applies to what the upstream returned.
    let (_, body) = call(&server, &run, "echo_wrong_schema", json!({"text": "x"}));
    assert_eq!(
        body["diagnostic"]["reason"], "output_schema_violation",
        "{body}"
    );
    assert!(body["output"].is_null());
    // A tool the upstream does not have: the upstream's JSON-RPC error, as a tool error.
    let (_, body) = call(&server, &run, "no_such_upstream_tool", json!({}));
    assert_eq!(body["diagnostic"]["reason"], "tool_error", "{body}");
}

/// A Streamable HTTP server run by the test's Python (by default tests/mcp/http_server.py,
/// built with the official Python SDK); killed on drop.
pub(crate) struct HttpUpstream {
    pub(crate) child: Child,
    pub(crate) url: String,
}

impl HttpUpstream {
    fn start() -> HttpUpstream {
        HttpUpstream::script("http_server.py", &[])
    }

    /// Runs tests/mcp/`script` with `args`; it prints its port on its first line.
    pub(crate) fn script(script: &str, args: &[&std::ffi::OsStr]) -> HttpUpstream {
        let mut child = Command::new(support::python())
            .arg(support::scripts().join(script))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no port: {line:?}"));
        HttpUpstream {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_upstream_over_streamable_http_answers_and_its_outage_is_dependency_down() {
    let mut upstream = HttpUpstream::start();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_url = format!("http://{}/mcp", closed.local_addr().unwrap());
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(lab(
        dir.path(),
        &[
            LabTool {
                name: "add",
                adapter: format!("{{kind: mcp, url: {}, tool: add}}", json!(upstream.url)),
                timeout_ms: 20000,
                output_schema: "{type: object, properties: {sum: {type: integer}}, required: [sum]}",
            },
            LabTool {
                name: "nobody_home",
                adapter: format!("{{kind: mcp, url: {}, tool: add}}", json!(closed_url)),
                timeout_ms: 20000,
                output_schema: ANY_OBJECT,
            },
        ],
    ));
    let run = server.create_run(json!({}));
    // The server is ready once it printed its port, but give uvicorn a moment to
    // accept: retry a refused first call a bounded number of times.
    let mut answer = Value::Null;
    common::poll_until(Duration::from_secs(10), || {
        answer = call(&server, &run, "add", json!({"a": 2, "b": 3})).1;
        answer["status"] == "success"
    });
    assert_eq!(answer["output"], json!({"sum": 5}), "{answer}");

    let (status, body) = call(&server, &run, "nobody_home", json!({"a": 1, "b": 1}));
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error_code"], "TOOL_DEPENDENCY_DOWN");

    // The upstream goes away: the next call is dependency down, not a hang.
    let _ = upstream.child.kill();
    let _ = upstream.child.wait();
    let started = Instant::now();
    let (_, body) = call(&server, &run, "add", json!({"a": 1, "b": 1}));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(body["diagnostic"]["reason"], "dependency_down", "{body}");
}

/// Runs `toolgate mcp import` with `args`; returns its stdout.
fn import(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["mcp", "import"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mcp import failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A copy of the demo policy in `dir`.
fn demo_copy(dir: &Path) -> (PathBuf, PathBuf) {
    let demo = crate::common::demo::Demo::copy_into(dir);
    (demo.policy, demo.registry)
}

pub(crate) fn policy_check(policy: &Path, registry: &Path) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["policy", "check", "--policy-dir"])
        .arg(policy)
        .arg("--tools")
        .arg(registry)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn imported_entries_load_once_reviewed_and_then_run() {
    let python = support::python();
    let python = python.to_str().unwrap();
    let server_command = [
        python,
        "-m",
        "mcp_server_time",
        "--local-timezone",
        "Etc/UTC",
    ];
    let mut args = vec!["--command"];
    args.extend(server_command);
    let printed = import(&args);
    for needle in [
        "- tool_name: convert_time",
        "- tool_name: get_current_time",
        "enabled: false",
        "allowed_lanes: []",
        r#"tool: "convert_time""#,
        "input_schema: {",
    ] {
        assert!(printed.contains(needle), "{needle} not in\n{printed}");
    }
    // mcp-server-time says its tools are read-only: idempotent, no write targets.
    assert!(printed.contains("determinism: idempotent"), "{printed}");
    // --lane fills allowed_lanes (the entries stay disabled).
    let mut args = vec!["--lane", "research", "--command"];
    args.extend(server_command);
    let with_lane = import(&args);
    assert_eq!(
        with_lane.matches(r#"allowed_lanes: ["research"]"#).count(),
        2
    );
    assert_eq!(with_lane.matches("enabled: false").count(), 2);

    let dir = tempfile::tempdir().unwrap();
    let (policy, registry) = demo_copy(dir.path());
    // The server is printed once and both tools refer to it.
    assert_eq!(printed.matches("  - server_id: ").count(), 1, "{printed}");
    assert_eq!(
        printed.matches("{kind: mcp, server: ").count(),
        2,
        "{printed}"
    );
    // Pasted as a reviewer would: the `servers:` part before the registry's `tools:`
    // (the demo registry has none yet), the tool entries at the end of its list.
    let (servers_part, tools_part) = printed.split_once("\ntools:\n").unwrap();
    let servers_part = &servers_part[servers_part.find("\nservers:\n").unwrap()..];
    // The reviewer gives the server the paths it reads (it runs confined).
    let servers_part = servers_part.replacen(
        "    max_concurrency: ",
        &format!(
            "    sandbox: {}\n    max_concurrency: ",
            support::UNCONFINED_PYTHON
        ),
        1,
    );
    let mut text = fs::read_to_string(&registry).unwrap().replacen(
        "\ntools:\n",
        &format!("{servers_part}\n\ntools:\n"),
        1,
    );
    text.push_str(tools_part);
    fs::write(&registry, &text).unwrap();
    // As printed (disabled, in no lane's allowlist yet), the policy loads.
    let (ok, out) = policy_check(&policy, &registry);
    assert!(ok, "{out}\n{printed}");

    // The reviewer assigns the research lane to both and enables convert_time.
    let enabled = text
        .replace("allowed_lanes: []", "allowed_lanes: [research]")
        .replacen(
            "  - tool_name: convert_time\n    description: \"Convert time between timezones\"\n    enabled: false",
            "  - tool_name: convert_time\n    description: \"Convert time between timezones\"\n    enabled: true",
            1,
        );
    assert_ne!(enabled, text, "the printed entry changed shape:\n{printed}");
    fs::write(&registry, enabled).unwrap();
    let lanes = policy.join("lanes.yaml");
    let lanes_text = fs::read_to_string(&lanes).unwrap().replacen(
        "tools: [case_lookup, legal_search, read_document, disabled_tool]",
        "tools: [case_lookup, legal_search, read_document, disabled_tool, convert_time, get_current_time]",
        1,
    );
    fs::write(&lanes, lanes_text).unwrap();
    let (ok, out) = policy_check(&policy, &registry);
    assert!(ok, "{out}");

    // And it runs through the gateway, with the demo's research lane rules.
    let server = Server::start_with(Start {
        policy_dir: policy,
        tools: registry,
        ..Start::default()
    });
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let (status, body) = server.call(
        "research_agent",
        &run,
        "research",
        "convert_time",
        json!({"source_timezone": "Etc/UTC", "time": "08:30", "target_timezone": "Asia/Tokyo"}),
        scope.clone(),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body["output"]["target"]["datetime"]
            .as_str()
            .unwrap()
            .contains("T17:30:00"),
        "{body}"
    );
    // get_current_time is still disabled: the review decides, not the import.
    let (_, body) = server.call(
        "research_agent",
        &run,
        "research",
        "get_current_time",
        json!({"timezone": "Etc/UTC"}),
        scope,
    );
    assert_eq!(body["diagnostic"]["reason"], "tool_disabled", "{body}");
}

/// A raw JSON-RPC stdio MCP server listing a tool that can only be called as a task
/// (MCP 2025-11-25 `execution.taskSupport: "required"`), one where tasks are optional
/// and one plain tool.
const TASK_SERVER: &str = r#"
import json, sys
TOOLS = [
    {"name": "long_report", "inputSchema": {"type": "object"},
     "execution": {"taskSupport": "required"}},
    {"name": "maybe_task", "inputSchema": {"type": "object"},
     "execution": {"taskSupport": "optional"}},
    {"name": "echo", "inputSchema": {"type": "object"}},
]
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method = msg.get("method")
    if method == "initialize":
        answer = {"result": {"protocolVersion": msg["params"]["protocolVersion"],
                             "capabilities": {"tools": {}},
                             "serverInfo": {"name": "tasks", "version": "1.0.0"}}}
    elif method == "tools/list":
        answer = {"result": {"tools": TOOLS}}
    else:
        answer = {"error": {"code": -32601, "message": "no such method"}}
    answer.update({"jsonrpc": "2.0", "id": msg["id"]})
    print(json.dumps(answer), flush=True)
"#;

#[test]
fn import_marks_and_warns_on_tools_that_require_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("task_server.py");
    fs::write(&script, TASK_SERVER).unwrap();
    let out = Command::new(BIN)
        .args(["mcp", "import", "--command", "python3"])
        .arg(&script)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // One warning, naming the task-required tool only.
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("requires task augmentation"))
        .collect();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(warned[0].starts_with("warning: "), "{stderr}");
    assert!(warned[0].contains(r#""long_report""#), "{stderr}");
    assert!(warned[0].contains("cannot serve it"), "{stderr}");
    assert!(
        !stderr.contains("could not read the raw tools/list"),
        "{stderr}"
    );
    // Each entry's comment block runs from its `# upstream tool` line to the next.
    let entry = |name: &str| -> String {
        let start = stdout
            .find(&format!(r#"# upstream tool "{name}""#))
            .unwrap_or_else(|| panic!("{name} not printed:\n{stdout}"));
        let rest = &stdout[start + 1..];
        let end = rest.find("# upstream tool").unwrap_or(rest.len());
        rest[..end].to_string()
    };
    let long = entry("long_report");
    assert!(long.contains("CANNOT BE SERVED"), "{long}");
    assert!(long.contains("\n    enabled: false\n"), "{long}");
    for other in ["maybe_task", "echo"] {
        let text = entry(other);
        assert!(!text.contains("CANNOT BE SERVED"), "{text}");
        assert!(text.contains("\n    enabled: false\n"), "{text}");
    }
    // Still a valid registry: the marked entry loads (disabled) with the others.
    assert_eq!(stdout.matches("- tool_name: ").count(), 3, "{stdout}");
}

/// The same tools served over Streamable HTTP by a raw stateless server: `initialize`
/// answered as JSON, `tools/list` as an SSE stream; prints its port first.
const TASK_HTTP_SERVER: &str = r#"
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
TOOLS = [
    {"name": "long_report", "inputSchema": {"type": "object"},
     "execution": {"taskSupport": "required"}},
    {"name": "echo", "inputSchema": {"type": "object"}},
]
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def answer(self, status, ctype, body):
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.answer(405, None, b"")
    def do_DELETE(self):
        self.answer(200, None, b"")
    def do_POST(self):
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in msg:
            return self.answer(202, None, b"")
        method = msg.get("method")
        reply = {"jsonrpc": "2.0", "id": msg["id"]}
        if method == "initialize":
            reply["result"] = {"protocolVersion": msg["params"]["protocolVersion"],
                               "capabilities": {"tools": {}},
                               "serverInfo": {"name": "tasks", "version": "1.0.0"}}
            return self.answer(200, "application/json", json.dumps(reply).encode())
        if method == "tools/list":
            reply["result"] = {"tools": TOOLS}
            event = "event: message\ndata: " + json.dumps(reply) + "\n\n"
            return self.answer(200, "text/event-stream", event.encode())
        reply["error"] = {"code": -32601, "message": "no such method"}
        self.answer(200, "application/json", json.dumps(reply).encode())
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

#[test]
fn import_over_http_marks_and_warns_on_tools_that_require_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("task_http_server.py");
    fs::write(&script, TASK_HTTP_SERVER).unwrap();
    let mut child = Command::new("python3")
        .arg(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().unwrap();
    let out = Command::new(BIN)
        .args(["mcp", "import", "--url"])
        .arg(format!("http://127.0.0.1:{port}/mcp"))
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("requires task augmentation"))
        .collect();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(warned[0].contains(r#""long_report""#), "{stderr}");
    assert!(
        !stderr.contains("could not read the raw tools/list"),
        "{stderr}"
    );
    let long = stdout.find(r#"# upstream tool "long_report""#).unwrap();
    let echo = stdout.find(r#"# upstream tool "echo""#).unwrap();
    // Sorted by name: echo first, then long_report with its note.
    assert!(echo < long, "{stdout}");
    assert!(!stdout[echo..long].contains("CANNOT BE SERVED"), "{stdout}");
    assert!(stdout[long..].contains("CANNOT BE SERVED"), "{stdout}");
    assert_eq!(
        stdout.matches("\n    enabled: false\n").count(),
        2,
        "{stdout}"
    );
}

#[test]
fn import_refuses_bad_flags_and_reports_an_unreachable_server() {
    let out = Command::new(BIN)
        .args(["mcp", "import", "--url", "ftp://example.com/mcp"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an absolute http"));
    let out = Command::new(BIN).args(["mcp", "import"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "neither --command nor --url");
    let out = Command::new(BIN)
        .args([
            "mcp",
            "import",
            "--timeout-secs",
            "5",
            "--command",
            "sh",
            "-c",
            "exit 3",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot list the tools"), "{stderr}");
}

/// `@modelcontextprotocol/server-everything` (over stdio) behind the MCP adapter, read
/// by the official TypeScript SDK client through the front: the upstream's content
/// blocks arrive as it sent them (an image as an image block, not base64 in text).
#[test]
fn server_everything_content_blocks_reach_the_typescript_client_unchanged() {
    let everything = support::server_everything();
    let dir = tempfile::tempdir().unwrap();
    let command = json!(["node", everything, "stdio"]);
    let server = Server::start_with(lab(
        dir.path(),
        &[LabTool {
            name: "tiny_image",
            adapter: format!(
                "{{kind: mcp, command: {command}, tool: get-tiny-image, sandbox: {}}}",
                support::UNCONFINED_NODE
            ),
            timeout_ms: 30000,
            output_schema: ANY_OBJECT,
        }],
    ));
    let run = server.create_run(json!({}));
    let plan = json!({
        "url": format!("{}/mcp", server.base),
        "headers": {
            "Authorization": "Bearer demo-tester",
            "X-Toolgate-Role": "tester",
            "X-Toolgate-Run": run,
            "X-Toolgate-Lane": "lab",
            "X-Toolgate-Scope": "{}",
        },
        "calls": [{"name": "tiny_image", "arguments": {}}],
    });
    let seen = support::node_client(&plan, Duration::from_secs(90));
    assert!(seen.get("connect_error").is_none(), "{seen}");
    let result = &seen["calls"][0];
    assert!(result.get("error").is_none(), "the SDK threw: {result}");
    assert_eq!(result["isError"], false, "{result}");
    let content = result["content"].as_array().unwrap();
    let image = content
        .iter()
        .find(|b| b["type"] == "image")
        .unwrap_or_else(|| panic!("no image block in {result}"));
    assert_eq!(image["mimeType"], "image/png", "{image}");
    assert!(!image["data"].as_str().unwrap().is_empty());
    // The HTTP API keeps the blocks too: `output.content` as the upstream sent them.
    let (status, body) = call(&server, &run, "tiny_image", json!({}));
    assert_eq!(status, 200, "{body}");
    let blocks = body["output"]["content"].as_array().unwrap();
    assert_eq!(blocks.len(), content.len(), "{body}");
    assert!(blocks.iter().any(|b| b["type"] == "image"), "{body}");
}
