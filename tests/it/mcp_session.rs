//! MCP upstream sessions, cancellation and progress, end to end through the real
//! binary: one upstream process per `servers:` entry whatever the number of its tools
//! (restarted after it is killed), a caller that gives up (a dropped HTTP connection,
//! an MCP `notifications/cancelled`) stops the upstream request or the command's
//! process and closes the call as `cancelled`, and an upstream's progress reaches the
//! official Python client through the front, bounded under a flood.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::mcp_adapter::{
    ANY_OBJECT, ECHO_OUTPUT, LabTool, call, lab_with_servers, none_left, policy_check,
    processes_mentioning, starts,
};
use crate::mcp_support as support;

use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{ADMIN, Server};
use serde_json::{Value, json};

/// A `servers:` entry running tests/mcp/lab_server.py with its state in `state`.
fn lab_server_entry(id: &str, state: &Path, max_concurrency: u32) -> String {
    let bin = support::open_to_sandbox(state);
    format!(
        "  - server_id: {id}\n    description: The lab server.\n    command: {}\n    max_concurrency: {max_concurrency}\n    sandbox: {}\n",
        json!([support::SYSTEM_PYTHON, bin.join("lab_server.py"), state, ""]),
        support::sandbox(std::slice::from_ref(&bin), &[state])
    )
}

fn on(server: &str, tool: &str) -> String {
    format!("{{kind: mcp, server: {server}, tool: {tool}}}")
}

/// Polls `check` every 10 ms for at most 20 s.
fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The lab server's record of the cancellations it received: (request id, unix time).
fn cancellations(state: &Path) -> Vec<(String, f64)> {
    fs::read_to_string(state.join("cancelled"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (id, at) = line.rsplit_once(' ')?;
            Some((id.to_string(), at.parse().ok()?))
        })
        .collect()
}

/// The request ids of the `slow` calls the lab server has started.
fn slow_calls(state: &Path) -> Vec<String> {
    fs::read_to_string(state.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The closing events (anything but `tool_requested`) of the calls in `run`.
fn closing_events(server: &Server, run: &str) -> Vec<Value> {
    let (status, body) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(status, 200, "{body}");
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call_id"].is_string() && e["type"] != "tool_requested")
        .cloned()
        .collect()
}

/// Sends a tool call on a raw connection and returns the connection unread: the
/// caller drops it to hang up.
fn call_and_hold(server: &Server, body: &Value) -> TcpStream {
    let address = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    let body = body.to_string();
    write!(
        stream,
        "POST /v1/tool-calls HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer demo-tester\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream.flush().unwrap();
    stream
}

#[test]
fn the_tools_of_one_server_share_one_process_and_a_killed_one_is_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let names = ["echo_a", "echo_b", "echo_c", "echo_d", "echo_e"];
    let tools: Vec<LabTool> = names
        .iter()
        .map(|name| LabTool {
            name,
            adapter: on("lab", "echo"),
            timeout_ms: 20000,
            output_schema: ECHO_OUTPUT,
        })
        .collect();
    let server = Server::start_with(lab_with_servers(
        dir.path(),
        &lab_server_entry("lab", &state, 8),
        &tools,
    ));
    let run = server.create_run(json!({}));
    // Building the policy started nothing.
    assert_eq!(starts(&state), 0);
    for name in names {
        let (status, body) = call(&server, &run, name, json!({"text": name}));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["output"], json!({"text": name, "start": 1}), "{body}");
    }
    // Five tools, one upstream process.
    assert_eq!(starts(&state), 1);
    let running = processes_mentioning(&state);
    assert_eq!(running.len(), 1, "{running:?}");
    // The pid the server reports is its pid namespace's own: the host's is in /proc.
    let pid = &running[0];

    // Killed behind the gateway's back, it is restarted by the next call.
    common::unsafe_free_kill(pid.parse().unwrap(), "KILL");
    wait_for("the killed server to be gone", || {
        processes_mentioning(&state).is_empty().then_some(())
    });
    let (status, body) = call(&server, &run, "echo_c", json!({"text": "again"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["output"],
        json!({"text": "again", "start": 2}),
        "{body}"
    );
    assert_eq!(starts(&state), 2);
    assert_eq!(processes_mentioning(&state).len(), 1);
    assert!(server.stop().success());
    assert!(none_left(&state));
}

#[test]
fn the_servers_section_is_checked_strictly() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let good = lab_server_entry("lab", &state, 8);
    let cases: [(&str, String, &str, &str); 5] = [
        (
            "an unknown server",
            good.clone(),
            "nowhere",
            "adapter `server` `nowhere` is not in the registry's `servers:`",
        ),
        (
            "a duplicate id",
            format!("{good}{good}"),
            "lab",
            "duplicate server id `lab`",
        ),
        (
            "command and url",
            format!("{}    url: http://127.0.0.1:9/mcp\n", good),
            "lab",
            "needs exactly one of `command` or `url`",
        ),
        (
            "a zero max_concurrency",
            good.replace("max_concurrency: 8", "max_concurrency: 0"),
            "lab",
            "`max_concurrency` must be 1 to",
        ),
        (
            "an unknown field",
            format!("{good}    restart: always\n"),
            "lab",
            "restart",
        ),
    ];
    for (what, servers, referred, needle) in cases {
        let case = dir.path().join(what.replace(' ', "_"));
        let start = lab_with_servers(
            &case,
            &servers,
            &[LabTool {
                name: "echo",
                adapter: on(referred, "echo"),
                timeout_ms: 20000,
                output_schema: ECHO_OUTPUT,
            }],
        );
        let (ok, out) = policy_check(&start.policy_dir, &start.tools);
        assert!(!ok, "{what}: loaded\n{out}");
        assert!(out.contains(needle), "{what}: `{needle}` not in\n{out}");
    }
    // A tool gives its server one way only.
    let start = lab_with_servers(
        &dir.path().join("both"),
        &good,
        &[LabTool {
            name: "echo",
            adapter: "{kind: mcp, server: lab, url: \"http://127.0.0.1:9/mcp\", tool: echo}".into(),
            timeout_ms: 20000,
            output_schema: ECHO_OUTPUT,
        }],
    );
    let (ok, out) = policy_check(&start.policy_dir, &start.tools);
    assert!(
        !ok && out.contains("exactly one of `server`, `command` or `url`"),
        "{out}"
    );
}

#[test]
fn a_caller_that_hangs_up_cancels_the_upstream_request_and_releases_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let server = Server::start_with(lab_with_servers(
        dir.path(),
        &lab_server_entry("lab", &state, 8),
        &[LabTool {
            name: "slow",
            adapter: on("lab", "slow"),
            timeout_ms: 30000,
            output_schema: ANY_OBJECT,
        }],
    ));
    let run = server.create_run(json!({}));
    let body = json!({
        "role_id": "tester", "run_id": run, "lane_id": "lab", "tool_name": "slow",
        "arguments": {"seconds": 25}, "scope": {}, "idempotency_key": "k-slow",
    });
    let stream = call_and_hold(&server, &body);
    let upstream_id = wait_for("the upstream to start the call", || {
        slow_calls(&state).first().cloned()
    });
    let hung_up = now_secs();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    drop(stream);
    // The upstream hears the cancellation of that very request, soon.
    let (id, heard) = wait_for("the upstream to hear the cancellation", || {
        cancellations(&state).first().cloned()
    });
    assert_eq!(id, upstream_id);
    eprintln!(
        "hang-up to upstream cancellation: {:.1} ms",
        (heard - hung_up) * 1000.0
    );
    assert!(
        heard - hung_up < 0.5,
        "the upstream heard the cancellation {:.3} s after the hang-up",
        heard - hung_up
    );
    // The call closed once, as cancelled.
    let closing = wait_for("the closing event", || {
        let events = closing_events(&server, &run);
        (!events.is_empty()).then_some(events)
    });
    assert_eq!(closing.len(), 1, "{closing:?}");
    assert_eq!(closing[0]["type"], "tool_failed", "{}", closing[0]);
    assert_eq!(closing[0]["reason"], "cancelled", "{}", closing[0]);

    // The idempotency key was released: the same call executes again (and is not a
    // replay of the cancelled one).
    fs::write(state.join("go"), "").unwrap();
    let (status, again) = server.post("/v1/tool-calls", Some("demo-tester"), &body);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["status"], "success", "{again}");
    assert_eq!(again["replayed"], false, "{again}");
    assert_eq!(slow_calls(&state).len(), 2);
    // Still one upstream process: cancelling a request does not restart the server.
    assert_eq!(starts(&state), 1);
}

#[test]
fn a_caller_that_hangs_up_kills_a_command_tools_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    fs::create_dir_all(&marker).unwrap();
    let started = marker.join("started");
    let script = format!(
        "import sys, time; open(sys.argv[1], 'w').write('x'); time.sleep(30)  # {}",
        marker.display()
    );
    let argv = json!(["python3", "-c", script, started]);
    let server = Server::start_with(lab_with_servers(
        dir.path(),
        "",
        &[LabTool {
            name: "sleeper",
            adapter: format!(
                "{{kind: command, argv: {argv}, sandbox: {{unconfined: \"python3 here is a pyenv shim under /root\"}}}}"
            ),
            timeout_ms: 40000,
            output_schema: ANY_OBJECT,
        }],
    ));
    let run = server.create_run(json!({}));
    let body = json!({
        "role_id": "tester", "run_id": run, "lane_id": "lab", "tool_name": "sleeper",
        "arguments": {}, "scope": {},
    });
    let stream = call_and_hold(&server, &body);
    wait_for("the command to start", || started.exists().then_some(()));
    assert_eq!(processes_mentioning(&marker).len(), 1);
    let hung_up = Instant::now();
    drop(stream);
    wait_for("the command to be killed", || {
        processes_mentioning(&marker).is_empty().then_some(())
    });
    // Well before its 30 s sleep or the 40 s deadline: it was killed, not waited for.
    assert!(hung_up.elapsed() < Duration::from_secs(10));
    let closing = wait_for("the closing event", || {
        let events = closing_events(&server, &run);
        (!events.is_empty()).then_some(events)
    });
    assert_eq!(closing.len(), 1, "{closing:?}");
    assert_eq!(closing[0]["reason"], "cancelled", "{}", closing[0]);
}

/// Sends an MCP `tools/call` of `tool` to /mcp on a raw connection and returns the
/// connection unread: the caller drops it to hang up.
fn mcp_call_and_hold(server: &Server, run: &str, tool: &str, id: u64, progress: bool) -> TcpStream {
    let address = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    let mut params = json!({"name": tool, "arguments": {"seconds": 25}});
    if progress {
        params["_meta"] = json!({"progressToken": format!("p-{id}")});
    }
    let body =
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string();
    let mut head = format!("POST /mcp HTTP/1.1\r\nHost: {address}\r\n");
    for (name, value) in mcp_headers(run, "demo-tester") {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    write!(stream, "{head}Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    stream.flush().unwrap();
    stream
}

/// Reads `stream` until what it received contains `needle` (at most 20 s).
fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    use std::io::Read;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {needle} in {}",
            String::from_utf8_lossy(&seen)
        );
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => panic!("closed before {needle}: {}", String::from_utf8_lossy(&seen)),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading for {needle}: {e}"),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[test]
fn an_mcp_client_that_drops_its_connection_cancels_the_upstream_call() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let server = Server::start_with(lab_with_servers(
        dir.path(),
        &lab_server_entry("lab", &state, 8),
        &[LabTool {
            name: "slow",
            adapter: on("lab", "slow"),
            timeout_ms: 30000,
            output_schema: ANY_OBJECT,
        }],
    ));
    let run = server.create_run(json!({}));
    // Two ways to hang up: while the JSON answer is pending, and in the middle of the
    // SSE stream that carries the call's progress.
    for (round, progress) in [(1usize, false), (2, true)] {
        let mut stream = mcp_call_and_hold(&server, &run, "slow", round as u64, progress);
        wait_for("the upstream to start the call", || {
            (slow_calls(&state).len() == round).then_some(())
        });
        if progress {
            // The upstream's progress reached the client: the answer is a stream.
            let seen = read_until(&mut stream, "notifications/progress");
            assert!(seen.contains("text/event-stream"), "{seen}");
            assert!(seen.contains("started"), "{seen}");
        }
        let upstream_id = slow_calls(&state)[round - 1].clone();
        let hung_up = now_secs();
        stream.shutdown(std::net::Shutdown::Both).unwrap();
        drop(stream);
        let (id, heard) = wait_for("the upstream to hear the cancellation", || {
            cancellations(&state).get(round - 1).cloned()
        });
        assert_eq!(id, upstream_id, "round {round}");
        eprintln!(
            "mcp hang-up (progress: {progress}) to upstream cancellation: {:.1} ms",
            (heard - hung_up) * 1000.0
        );
        assert!(
            heard - hung_up < 0.5,
            "round {round}: the upstream heard the cancellation {:.3} s after the hang-up",
            heard - hung_up
        );
        // The call closed once, as cancelled by the caller.
        let closing = wait_for("the closing event", || {
            let events = closing_events(&server, &run);
            (events.len() == round).then_some(events)
        });
        let last = &closing[round - 1];
        assert_eq!(last["type"], "tool_failed", "{last}");
        assert_eq!(last["reason"], "cancelled", "{last}");
    }
    // The upstream call stopped (no answer was sent for either) and the server was
    // not restarted: cancelling a request is not a failure of the server.
    assert_eq!(starts(&state), 1);
    assert_eq!(cancellations(&state).len(), 2);
}

#[test]
fn an_mcp_client_that_drops_its_connection_kills_a_command_tools_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    fs::create_dir_all(&marker).unwrap();
    let started = marker.join("started");
    let script = format!(
        "import sys, time; open(sys.argv[1], 'w').write('x'); time.sleep(30)  # {}",
        marker.display()
    );
    let argv = json!(["python3", "-c", script, started]);
    let server = Server::start_with(lab_with_servers(
        dir.path(),
        "",
        &[LabTool {
            name: "sleeper",
            adapter: format!(
                "{{kind: command, argv: {argv}, sandbox: {{unconfined: \"python3 here is a pyenv shim under /root\"}}}}"
            ),
            timeout_ms: 40000,
            output_schema: ANY_OBJECT,
        }],
    ));
    let run = server.create_run(json!({}));
    let stream = mcp_call_and_hold(&server, &run, "sleeper", 1, false);
    wait_for("the command to start", || started.exists().then_some(()));
    assert_eq!(processes_mentioning(&marker).len(), 1);
    let hung_up = Instant::now();
    drop(stream);
    wait_for("the command to be killed", || {
        processes_mentioning(&marker).is_empty().then_some(())
    });
    // Well before its 30 s sleep or the 40 s deadline: it was killed, not waited for.
    assert!(hung_up.elapsed() < Duration::from_secs(10));
    let closing = wait_for("the closing event", || {
        let events = closing_events(&server, &run);
        (!events.is_empty()).then_some(events)
    });
    assert_eq!(closing.len(), 1, "{closing:?}");
    assert_eq!(closing[0]["type"], "tool_failed", "{}", closing[0]);
    assert_eq!(closing[0]["reason"], "cancelled", "{}", closing[0]);
}

/// The headers of the lab's MCP caller.
fn mcp_headers(run: &str, token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("Authorization", format!("Bearer {token}")),
        ("X-Toolgate-Role", "tester".into()),
        ("X-Toolgate-Run", run.into()),
        ("X-Toolgate-Lane", "lab".into()),
        ("X-Toolgate-Scope", "{}".into()),
        ("Accept", "application/json, text/event-stream".into()),
        ("Content-Type", "application/json".into()),
        ("MCP-Protocol-Version", "2025-11-25".into()),
    ]
}

/// POSTs one JSON-RPC message to /mcp; returns the status and the body text.
fn mcp_post(server: &Server, headers: &[(&str, String)], message: &Value) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut request = agent.post(format!("{}/mcp", server.base));
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let mut response = request.send(message.to_string().as_bytes()).unwrap();
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().unwrap())
}

/// The JSON-RPC message of a response body (JSON, or the last SSE `data:` line).
fn rpc_message(body: &str) -> Value {
    if let Ok(value) = serde_json::from_str(body) {
        return value;
    }
    let data = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .rfind(|d| !d.trim().is_empty())
        .unwrap_or_else(|| panic!("no message in {body}"));
    serde_json::from_str(data.trim()).unwrap()
}

#[test]
fn mcp_cancellation_stops_the_upstream_and_only_the_caller_can_send_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let server = Server::start_with(lab_with_servers(
        dir.path(),
        &lab_server_entry("lab", &state, 8),
        &[LabTool {
            name: "slow",
            adapter: on("lab", "slow"),
            timeout_ms: 30000,
            output_schema: ANY_OBJECT,
        }],
    ));
    let run = server.create_run(json!({}));
    let headers = mcp_headers(&run, "demo-tester");
    let call = |id: u64, seconds: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "slow", "arguments": {"seconds": seconds}}})
    };
    let cancel = |id: u64| {
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": id, "reason": "the user pressed stop"}})
    };

    std::thread::scope(|scope| {
        // A call that someone else tries to cancel: it still runs to its result.
        let first = scope.spawn(|| mcp_post(&server, &headers, &call(7, 25)));
        wait_for("the upstream to start call 7", || {
            (!slow_calls(&state).is_empty()).then_some(())
        });
        let other_run = mcp_headers("run-of-someone-else", "demo-tester");
        let wrong_token = mcp_headers(&run, "demo-admin");
        for hostile in [&other_run, &wrong_token] {
            let (status, body) = mcp_post(&server, hostile, &cancel(7));
            assert_eq!(status, 202, "{body}");
        }
        // Had either been taken, the call would be cancelled by now: the cancel
        // is set before the 202 is sent.
        fs::write(state.join("go"), "").unwrap();
        let (status, body) = first.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let answer = rpc_message(&body);
        assert_eq!(answer["result"]["isError"], false, "{answer}");
        assert!(cancellations(&state).is_empty());
    });
    fs::remove_file(state.join("go")).unwrap();

    std::thread::scope(|scope| {
        let second = scope.spawn(|| mcp_post(&server, &headers, &call(8, 25)));
        wait_for("the upstream to start call 8", || {
            (slow_calls(&state).len() == 2).then_some(())
        });
        let upstream_id = slow_calls(&state)[1].clone();
        let sent = now_secs();
        let (status, body) = mcp_post(&server, &headers, &cancel(8));
        assert_eq!(status, 202, "{body}");
        let (id, heard) = wait_for("the upstream to hear the cancellation", || {
            cancellations(&state).first().cloned()
        });
        assert_eq!(id, upstream_id);
        eprintln!(
            "notifications/cancelled to upstream: {:.1} ms",
            (heard - sent) * 1000.0
        );
        assert!(
            heard - sent < 0.5,
            "the upstream heard the cancellation {:.3} s after the client sent it",
            heard - sent
        );
        // The client still gets an answer: a cancelled result with its diagnostic.
        let (status, body) = second.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let answer = rpc_message(&body);
        assert_eq!(answer["result"]["isError"], true, "{answer}");
        let diagnostic = &answer["result"]["_meta"]["io.toolgate/diagnostic"];
        assert_eq!(diagnostic["reason"], "cancelled", "{answer}");
        assert_eq!(diagnostic["status"], "failed", "{answer}");
    });
    // One closing event per call: executed, then cancelled.
    let closing = closing_events(&server, &run);
    let kinds: Vec<(&str, &str)> = closing
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [("tool_executed", ""), ("tool_failed", "cancelled")],
        "{closing:?}"
    );
}

/// Runs tests/mcp/client.py (the official Python SDK) against the front.
fn python_client(server: &Server, run: &str, calls: Value) -> Value {
    let plan = json!({
        "url": format!("{}/mcp", server.base),
        "mode": "legacy",
        "headers": {
            "Authorization": "Bearer demo-tester",
            "X-Toolgate-Role": "tester",
            "X-Toolgate-Run": run,
            "X-Toolgate-Lane": "lab",
            "X-Toolgate-Scope": "{}",
        },
        "calls": calls,
    });
    let out = Command::new(support::python())
        .arg(support::scripts().join("client.py"))
        .arg(plan.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client.py failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("client.py printed no JSON ({e}): {stdout}"))
}

/// The resident set of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn upstream_progress_reaches_the_python_client_and_a_flood_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let state: PathBuf = dir.path().join("state");
    let server = Server::start_with(lab_with_servers(
        dir.path(),
        &lab_server_entry("lab", &state, 8),
        &[
            LabTool {
                name: "three_steps",
                adapter: on("lab", "progress"),
                timeout_ms: 30000,
                output_schema: ANY_OBJECT,
            },
            LabTool {
                name: "flood",
                adapter: on("lab", "flood"),
                timeout_ms: 60000,
                output_schema: ANY_OBJECT,
            },
        ],
    ));
    let run = server.create_run(json!({}));
    let seen = python_client(
        &server,
        &run,
        json!([{"name": "three_steps", "arguments": {}, "progress": true},
               {"name": "three_steps", "arguments": {}}]),
    );
    assert!(seen.get("connect_error").is_none(), "{seen}");
    let with = &seen["calls"][0];
    assert_eq!(with["isError"], false, "{with}");
    assert_eq!(
        with["progress"],
        json!([
            [1.0, 3.0, "step 1"],
            [2.0, 3.0, "step 2"],
            [3.0, 3.0, "step 3"]
        ]),
        "{with}"
    );
    // Without a progressToken, nothing is sent to the client.
    assert_eq!(seen["calls"][1]["progress"], json!([]), "{seen}");

    // 20000 notifications of 100 bytes as fast as the upstream writes them: the call
    // completes, the client hears some of them (the latest, coalesced), and the
    // gateway's memory does not grow with the flood.
    let before = rss_kib(server.pid());
    let seen = python_client(
        &server,
        &run,
        json!([{"name": "flood", "arguments": {"count": 20000}, "progress": true}]),
    );
    let flood = &seen["calls"][0];
    assert_eq!(flood["isError"], false, "{flood}");
    let heard = flood["progress"].as_array().unwrap().len();
    assert!((1..=20000).contains(&heard), "{heard}");
    let grown = rss_kib(server.pid()).saturating_sub(before);
    eprintln!("flood of 20000: the client heard {heard}, the gateway grew by {grown} KiB");
    assert!(grown < 64 * 1024, "the gateway grew by {grown} KiB");
}

#[test]
fn a_busy_server_refuses_more_than_its_max_concurrency_without_sending() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let server = Server::start_with(lab_with_servers(
        dir.path(),
        &lab_server_entry("lab", &state, 1),
        &[
            LabTool {
                name: "slow",
                adapter: on("lab", "slow"),
                timeout_ms: 30000,
                output_schema: ANY_OBJECT,
            },
            LabTool {
                name: "slow_too",
                adapter: on("lab", "slow"),
                timeout_ms: 30000,
                output_schema: ANY_OBJECT,
            },
        ],
    ));
    let run = server.create_run(json!({}));
    std::thread::scope(|scope| {
        let first = scope.spawn(|| call(&server, &run, "slow", json!({"seconds": 25})));
        wait_for("the upstream to start the first call", || {
            (!slow_calls(&state).is_empty()).then_some(())
        });
        // Another tool of the same server: the server's limit is shared by its tools.
        let (status, body) = call(&server, &run, "slow_too", json!({"seconds": 25}));
        assert_eq!(status, 429, "{body}");
        let d = &body["diagnostic"];
        assert_eq!(d["reason"], "concurrency_limit_reached", "{body}");
        assert_eq!(d["details"]["reached_tool"], false, "{body}");
        assert!(d["details"]["retry_after_ms"].is_u64(), "{body}");
        fs::write(state.join("go"), "").unwrap();
        let (status, body) = first.join().unwrap();
        assert_eq!(status, 200, "{body}");
    });
    // Nothing of the refused call reached the upstream.
    assert_eq!(slow_calls(&state).len(), 1);
}
