//! The sandbox of local tool processes (issue 40), attacked the way a hostile tool
//! would: a command tool (tests/fixtures/sandbox/hostile.py) tries to read the keys,
//! the audit log and another tool's directory, write outside its scratch directory,
//! reach the network, exhaust processes, memory, CPU and file size, spy on or signal
//! toolgate, and follow a symlink it planted. Each call must close with a structured
//! failure and exactly one closing event that records the sandbox; the same tool
//! behaving well succeeds. Run with toolgate as root (the tool runs as `nobody`) and as
//! a non-root user, with and without namespaces (the test-only switch refusing them),
//! and with Landlock reported missing (every call refused, nothing started).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::lab::sha;
use common::{ADMIN, Server, Start, repo};
use rstest::rstest;
use serde_json::{Value, json};

const ROLES: &str = r#"
version: "s-1"
roles:
  - role_id: tester
    description: Runs the sandboxed tools.
    enabled: true
    lanes: [lab]
    credential: {token_sha256: TESTER_SHA}
admins:
  - admin_id: ops
    description: Operator.
    credential: {token_sha256: ADMIN_SHA}
"#;

const LANES: &str = r#"
version: "s-1"
lanes:
  - lane_id: lab
    description: Where the sandboxed tools run.
    tools: [hostile, hostile_ports, hostile_connect, other_tool, marker]
    required_scope_keys: []
    prohibited_flags: []
    run_statuses: [active]
    write: true
"#;

const TOOL: &str = r#"
  - tool_name: NAME
    description: A tool under test.
    enabled: true
    version: 1.0.0
    determinism: side_effectful
    idempotent: false
    timeout_default_ms: 20000
    limits: {timeout_ms_max: 30000, max_output_bytes: 4096, max_concurrency: 4}
    allowed_lanes: [lab]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: ["fs:scratch"]
    adapter: ADAPTER
    input_schema: {type: object}
    output_schema: {type: object}
"#;

/// The limits every hostile tool runs under (small, so the tests are quick).
const LIMITS: &str = "{cpu_s: 2, processes: 24, file_size_mb: 1, memory_mb: 1024}";

fn tool(name: &str, adapter: &str) -> String {
    TOOL.replace("NAME", name).replace("ADAPTER", adapter)
}

/// A policy with the hostile tool in three network modes, another tool with its own
/// directory, and a tool that leaves a marker file if it ever runs.
struct Lab {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    start: Start,
    /// The port `hostile_ports` and `hostile_connect` may reach (an echo server), and
    /// one they may not (also listening).
    allowed: u16,
    forbidden: u16,
}

fn world_readable(path: &Path) {
    let mode = if path.is_dir() { 0o755 } else { 0o644 };
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// An echo server on 127.0.0.1: answers `pong` to each line.
fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let _ = writer.write_all(b"pong\n");
                    line.clear();
                }
            });
        }
    });
    port
}

fn lab(run_as: Option<(u32, u32)>, env: &[(&str, &str)]) -> Lab {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    world_readable(&root);
    let policy = root.join("policy");
    let tools = root.join("tools");
    let hostile = tools.join("hostile");
    let other = tools.join("other");
    let markers = root.join("markers");
    for dir in [&policy, &tools, &hostile, &other, &markers] {
        fs::create_dir_all(dir).unwrap();
        world_readable(dir);
    }
    fs::set_permissions(&markers, fs::Permissions::from_mode(0o777)).unwrap();
    fs::copy(
        repo().join("tests/fixtures/sandbox/hostile.py"),
        hostile.join("hostile.py"),
    )
    .unwrap();
    fs::write(
        hostile.join("data.txt"),
        "hello from the tool's own directory\n",
    )
    .unwrap();
    fs::write(other.join("secret.txt"), "another tool's file\n").unwrap();
    for f in [
        hostile.join("hostile.py"),
        hostile.join("data.txt"),
        other.join("secret.txt"),
    ] {
        world_readable(&f);
    }
    let allowed = echo_server();
    let forbidden = echo_server();
    let py = "[/usr/bin/python3, hostile.py]";
    let mut registry = String::from("version: \"s-1\"\ntools:\n");
    registry.push_str(&tool(
        "hostile",
        &format!(
            "{{kind: command, argv: {py}, working_dir: hostile, sandbox: {{limits: {LIMITS}}}}}"
        ),
    ));
    registry.push_str(&tool(
        "hostile_ports",
        &format!("{{kind: command, argv: {py}, working_dir: hostile, sandbox: {{network: {{ports: [{allowed}]}}, limits: {LIMITS}}}}}"),
    ));
    registry.push_str(&tool(
        "hostile_connect",
        &format!("{{kind: command, argv: {py}, working_dir: hostile, sandbox: {{network: {{connect: [\"localhost:{allowed}\"]}}, limits: {LIMITS}}}}}"),
    ));
    registry.push_str(&tool(
        "other_tool",
        "{kind: command, argv: [cat], working_dir: other}",
    ));
    registry.push_str(&tool(
        "marker",
        &format!(
            "{{kind: command, argv: [/usr/bin/touch, {m}/started], working_dir: hostile, sandbox: {{filesystem: {{write: [{m}]}}}}}}",
            m = markers.display()
        ),
    ));
    fs::write(
        policy.join("roles.yaml"),
        ROLES
            .replace("TESTER_SHA", &sha("demo-tester"))
            .replace("ADMIN_SHA", &sha("demo-admin")),
    )
    .unwrap();
    fs::write(policy.join("lanes.yaml"), LANES).unwrap();
    fs::write(tools.join("tool_registry.yaml"), registry).unwrap();
    for f in [
        policy.join("roles.yaml"),
        policy.join("lanes.yaml"),
        tools.join("tool_registry.yaml"),
    ] {
        world_readable(&f);
    }
    let data_dir = root.join("var");
    if let Some((uid, gid)) = run_as {
        fs::create_dir_all(&data_dir).unwrap();
        std::os::unix::fs::chown(&data_dir, Some(uid), Some(gid)).unwrap();
    }
    Lab {
        start: Start {
            policy_dir: policy,
            tools: tools.join("tool_registry.yaml"),
            data_dir: Some(data_dir),
            run_as,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Start::default()
        },
        _tmp: tmp,
        root,
        allowed,
        forbidden,
    }
}

fn call(server: &Server, run: &str, tool: &str, arguments: Value) -> (u16, Value) {
    let body = json!({
        "role_id": "tester", "run_id": run, "lane_id": "lab", "tool_name": tool,
        "arguments": arguments, "scope": {},
    });
    server.post("/v1/tool-calls", Some("demo-tester"), &body)
}

/// The closing events of the call `call_id` (exactly one is expected).
fn closing_events(server: &Server, run: &str, call_id: &str) -> Vec<Value> {
    let (code, body) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(code, 200, "{body}");
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call_id"] == call_id)
        .filter(|e| {
            matches!(
                e["type"].as_str(),
                Some("tool_executed" | "tool_failed" | "tool_denied" | "tool_timeout")
            )
        })
        .cloned()
        .collect()
}

/// Calls `tool` with `arguments`; asserts the call did not succeed, closed with one
/// event recording the sandbox; returns the response and that event.
fn stopped(server: &Server, run: &str, tool: &str, arguments: Value) -> (Value, Value) {
    let (code, body) = call(server, run, tool, arguments.clone());
    assert_ne!(code, 200, "{arguments}: the attack worked: {body}");
    assert_ne!(body["status"], "success", "{arguments}: {body}");
    let events = closing_events(server, run, body["call_id"].as_str().unwrap());
    assert_eq!(events.len(), 1, "{arguments}: {events:?}");
    let event = events.into_iter().next().unwrap();
    let sandbox = &event["details"]["sandbox"];
    assert_eq!(
        sandbox["profile_sha256"].as_str().map(str::len),
        Some(64),
        "{arguments}: {event}"
    );
    (body, event)
}

/// Every attack of the issue's list, each stopped; the tool behaving well succeeds.
/// Returns the `enforced` block the calls recorded.
fn attack_everything(lab: &Lab, server: &Server) -> Value {
    let run = server.create_run(json!({}));
    let data = server.data_dir.clone();
    // The well-behaved call under the same profile.
    let (code, body) = call(server, &run, "hostile", json!({"attack": "behave"}));
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["output"]["ok"], true, "{body}");
    assert!(
        body["output"]["read"]
            .as_str()
            .unwrap()
            .starts_with("hello")
    );
    let scratch = body["output"]["scratch"].as_str().unwrap().to_string();
    assert!(
        common::poll_until(std::time::Duration::from_secs(5), || !Path::new(&scratch)
            .exists()),
        "the scratch directory {scratch} outlived its call"
    );
    assert!(body["metrics"]["cpu_ms"].is_u64(), "{body}");
    assert!(
        body["metrics"]["memory_peak_mb"].as_u64().unwrap() > 0,
        "{body}"
    );
    let events = closing_events(server, &run, body["call_id"].as_str().unwrap());
    assert_eq!(events.len(), 1);
    let enforced = events[0]["details"]["sandbox"]["enforced"].clone();
    assert!(
        enforced["filesystem"]
            .as_str()
            .unwrap()
            .starts_with("landlock_abi_")
    );
    assert_eq!(enforced["syscalls"], "seccomp");
    assert!(events[0]["details"]["sandbox"]["cpu_ms"].is_u64());

    let keys = fs::read_dir(data.join("keys"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_file())
        .unwrap();
    let pid = server.pid().to_string();
    let attacks = [
        json!({"attack": "read", "target": keys}),
        json!({"attack": "list", "target": data.join("keys")}),
        json!({"attack": "read", "target": data.join("audit.db")}),
        json!({"attack": "read", "target": lab.root.join("tools/other/secret.txt")}),
        json!({"attack": "read", "target": lab.root.join("tools/tool_registry.yaml")}),
        json!({"attack": "write", "target": lab.root.join("tools/hostile/planted.txt")}),
        json!({"attack": "write", "target": format!("/tmp/toolgate-hostile-{}", std::process::id())}),
        json!({"attack": "connect", "port": lab.allowed}),
        json!({"attack": "fork_bomb"}),
        json!({"attack": "memory"}),
        json!({"attack": "read", "target": format!("/proc/{pid}/environ")}),
        json!({"attack": "read", "target": format!("/proc/{pid}/mem")}),
        json!({"attack": "ptrace", "target": pid}),
        json!({"attack": "signal", "target": pid}),
        json!({"attack": "symlink", "target": keys}),
        json!({"attack": "symlink", "target": data.join("audit.db")}),
    ];
    for attack in attacks {
        let (body, event) = stopped(server, &run, "hostile", attack.clone());
        assert_eq!(
            body["error_code"], "TOOL_INTERNAL_ERROR",
            "{attack}: {body}"
        );
        assert_eq!(
            event["details"]["sandbox"]["enforced"], enforced,
            "{attack}"
        );
        assert_eq!(event["details"]["sandbox"]["limits"]["processes"], 24);
    }
    assert!(!lab.root.join("tools/hostile/planted.txt").exists());
    // Limits the kernel signals end the call with tool_resource_limit, naming it.
    for (attack, limit) in [("spin", "cpu_s"), ("big_file", "file_size_mb")] {
        let (body, event) = stopped(server, &run, "hostile", json!({"attack": attack}));
        assert_eq!(
            body["diagnostic"]["reason"], "tool_resource_limit",
            "{body}"
        );
        assert_eq!(event["reason"], "tool_resource_limit", "{event}");
        assert_eq!(event["details"]["sandbox"]["limit_hit"], limit, "{event}");
    }
    // toolgate is alive and well after all that.
    let (code, _) = server.get("/healthz", None);
    assert_eq!(code, 200);
    enforced
}

#[rstest]
#[case::as_root(None, false)]
#[case::as_root_without_namespaces(None, true)]
#[case::as_nobody(Some((65534, 65534)), false)]
#[case::as_nobody_without_namespaces(Some((65534, 65534)), true)]
fn a_hostile_tool_is_stopped(#[case] run_as: Option<(u32, u32)>, #[case] no_namespaces: bool) {
    let env: &[(&str, &str)] = if no_namespaces {
        &[("TOOLGATE_TEST_SANDBOX", "userns-refused")]
    } else {
        &[]
    };
    let lab = lab(run_as, env);
    let server = Server::start_with(Start { ..lab.start_copy() });
    let enforced = attack_everything(&lab, &server);
    if no_namespaces {
        assert_eq!(enforced["network"], "seccomp_unix_only", "{enforced}");
        assert_ne!(enforced["isolation"], "pid_namespace", "{enforced}");
        assert_eq!(enforced["namespaces"], json!([]), "{enforced}");
    } else {
        assert_eq!(enforced["network"], "network_namespace", "{enforced}");
        assert_eq!(enforced["isolation"], "pid_namespace", "{enforced}");
    }
    match run_as {
        None => {
            assert_eq!(enforced["uid"], 65534, "{enforced}");
            assert!(
                enforced["privileges"]
                    .as_str()
                    .unwrap()
                    .contains("uid_65534")
            );
        }
        Some(_) => assert_eq!(enforced["uid"], 65534, "{enforced}"),
    }
}

impl Lab {
    fn start_copy(&self) -> Start {
        Start {
            policy_dir: self.start.policy_dir.clone(),
            tools: self.start.tools.clone(),
            data_dir: self.start.data_dir.clone(),
            args: self.start.args.clone(),
            env: self.start.env.clone(),
            run_as: self.start.run_as,
        }
    }
}

#[test]
fn ports_reach_their_port_and_no_other() {
    let lab = lab(None, &[]);
    let server = Server::start_with(lab.start_copy());
    let run = server.create_run(json!({}));
    let (code, body) = call(
        &server,
        &run,
        "hostile_ports",
        json!({"attack": "connect", "port": lab.allowed}),
    );
    assert_eq!(code, 200, "{body}");
    let (_, event) = stopped(
        &server,
        &run,
        "hostile_ports",
        json!({"attack": "connect", "port": lab.forbidden}),
    );
    assert_eq!(
        event["details"]["sandbox"]["enforced"]["network"],
        "landlock_ports+seccomp_tcp_only"
    );
}

#[test]
fn connect_reaches_its_host_through_the_proxy_and_names_it() {
    let lab = lab(None, &[]);
    let server = Server::start_with(lab.start_copy());
    let run = server.create_run(json!({}));
    let allowed = format!("localhost:{}", lab.allowed);
    let (code, body) = call(
        &server,
        &run,
        "hostile_connect",
        json!({"attack": "proxy", "target": allowed, "expect_ok": true}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["output"]["reply"], "pong", "{body}");
    let events = closing_events(&server, &run, body["call_id"].as_str().unwrap());
    let sandbox = &events[0]["details"]["sandbox"];
    assert_eq!(
        sandbox["enforced"]["network"],
        "network_namespace+egress_proxy"
    );
    assert_eq!(
        sandbox["connections"]["attempts"],
        json!([{"target": allowed, "allowed": true}]),
        "{sandbox}"
    );
    // Another port through the proxy: refused and recorded; directly: no network.
    let denied = format!("localhost:{}", lab.forbidden);
    let (_, event) = stopped(
        &server,
        &run,
        "hostile_connect",
        json!({"attack": "proxy", "target": denied}),
    );
    assert_eq!(
        event["details"]["sandbox"]["connections"]["attempts"][0]["allowed"], false,
        "{event}"
    );
    assert_eq!(
        event["details"]["sandbox"]["connections"]["attempts"][0]["target"],
        denied
    );
    stopped(
        &server,
        &run,
        "hostile_connect",
        json!({"attack": "connect", "port": lab.allowed}),
    );
}

#[test]
fn with_landlock_missing_nothing_starts() {
    let lab = lab(None, &[("TOOLGATE_TEST_SANDBOX", "landlock-missing")]);
    let server = Server::start_with(lab.start_copy());
    let run = server.create_run(json!({}));
    for tool in ["marker", "hostile"] {
        let (code, body) = call(&server, &run, tool, json!({"attack": "behave"}));
        assert_eq!(code, 503, "{body}");
        assert_eq!(
            body["diagnostic"]["reason"], "sandbox_unavailable",
            "{body}"
        );
        let events = closing_events(&server, &run, body["call_id"].as_str().unwrap());
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["reason"], "sandbox_unavailable");
        assert_eq!(
            events[0]["details"]["sandbox"]["unavailable"]["guarantee"], "filesystem",
            "{}",
            events[0]
        );
        assert_eq!(
            events[0]["details"]["diagnostic_details"]["reached_tool"],
            false
        );
    }
    assert!(!lab.root.join("markers/started").exists(), "the tool ran");
    // The same tool runs once the host can confine it.
    drop(server);
    let server = Server::start_with(Start {
        env: Vec::new(),
        ..lab.start_copy()
    });
    let run = server.create_run(json!({}));
    let (code, body) = call(&server, &run, "marker", json!({}));
    assert_eq!(code, 500, "touch answers no JSON: {body}");
    assert!(lab.root.join("markers/started").exists());
}

/// Bad profiles are refused at load, each with its file, line and column; a profile
/// naming the data or key directory is refused against the data directory given.
#[test]
fn bad_profiles_are_refused_with_their_location() {
    let lab = lab(None, &[]);
    let tools = lab.root.join("tools");
    std::os::unix::fs::symlink("/usr/lib", tools.join("libs")).unwrap();
    let data = lab.root.join("var");
    fs::create_dir_all(data.join("keys")).unwrap();
    let registry = fs::read_to_string(tools.join("tool_registry.yaml")).unwrap();
    let bad = [
        ("filesystem: {read: [../policy]}", "contains `..`"),
        ("filesystem: {read: [/no/such/dir]}", "does not exist"),
        ("filesystem: {read: [libs]}", "passes through the symlink"),
        ("limits: {cpu_s: 0}", "`sandbox.limits.cpu_s` is 0"),
        (
            "limits: {memory_mb: 99999999999}",
            "`sandbox.limits.memory_mb`",
        ),
        ("network: {ports: [0]}", "port 0"),
        ("network: everything", "`sandbox.network` is `everything`"),
        ("unconfined: \"\"", "needs a reason"),
        ("filesystem: {read: [/tmp]}", "reaches"),
        ("filesystem: {read: [VAR]}", "the data directory"),
        ("filesystem: {write: [VAR/keys]}", "the data directory"),
        (
            "filesystem: {read: [other]}",
            "the working directory of tool `other_tool`",
        ),
        ("filesystem: {read: [POLICY]}", "the policy directory"),
        ("colour: blue", "unknown field"),
    ];
    for (block, expected) in bad {
        let block = block
            .replace("VAR", data.to_str().unwrap())
            .replace("POLICY", lab.root.join("policy").to_str().unwrap());
        let changed = registry.replacen(
            &format!("sandbox: {{limits: {LIMITS}}}"),
            &format!("sandbox: {{{block}}}"),
            1,
        );
        assert_ne!(changed, registry);
        fs::write(tools.join("tool_registry.yaml"), &changed).unwrap();
        let (code, out, err) = common::run(
            &lab.root,
            &[
                "policy",
                "check",
                "--policy-dir",
                "policy",
                "--tools",
                "tools/tool_registry.yaml",
                "--data-dir",
                data.to_str().unwrap(),
            ],
        );
        assert_eq!(code, 4, "{block}: {out}{err}");
        let all = format!("{out}{err}");
        let line = all
            .lines()
            .find(|l| l.contains(expected) && !l.trim_start().starts_with("help:"))
            .unwrap_or_else(|| panic!("{block}: no `{expected}` in {all}"));
        // file:line:col: the line and column of the offending value.
        let located = line.split(": ").next().unwrap();
        assert_eq!(located.matches(':').count(), 2, "{block}: {line}");
        assert!(located.ends_with(char::is_numeric), "{block}: {line}");
    }
}

/// `policy diff --fail-on widening` exits 1 on a loosened profile and names it.
#[test]
fn a_loosened_profile_is_widening() {
    let lab = lab(None, &[]);
    for side in ["old", "new"] {
        let status = std::process::Command::new("cp")
            .args(["-r", "policy", "tools"])
            .arg(lab.root.join(side))
            .current_dir(&lab.root)
            .status();
        fs::create_dir_all(lab.root.join(side)).unwrap();
        let status = status.unwrap();
        if !status.success() {
            for dir in ["policy", "tools"] {
                let ok = std::process::Command::new("cp")
                    .arg("-r")
                    .arg(lab.root.join(dir))
                    .arg(lab.root.join(side).join(dir))
                    .status()
                    .unwrap();
                assert!(ok.success());
            }
        }
    }
    let tools = lab.root.join("new/tools/tool_registry.yaml");
    let registry = fs::read_to_string(&tools).unwrap();
    fs::create_dir_all("/srv").unwrap();
    let loosened = registry.replacen(
        &format!("sandbox: {{limits: {LIMITS}}}"),
        "sandbox: {filesystem: {read: [/srv]}, network: {ports: [443]}, limits: {cpu_s: 9}}",
        1,
    );
    assert_ne!(loosened, registry);
    fs::write(&tools, loosened).unwrap();
    let (code, out, err) = common::run(
        &lab.root,
        &["policy", "diff", "./old", "./new", "--fail-on", "widening"],
    );
    assert_eq!(code, 1, "{out}{err}");
    for expected in [
        "tool `hostile`: sandbox: may now read `/srv`",
        "tool `hostile`: sandbox: network is now {\"ports\":[443]}",
        "tool `hostile`: sandbox: limit `cpu_s` is now 9 (was 2)",
        "tool `hostile`: sandbox: limit `processes` is now 64 (was 24)",
    ] {
        assert!(out.contains(expected), "no `{expected}` in {out}");
    }
}
