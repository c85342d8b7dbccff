//! An upstream MCP server that sends toolgate requests (`ping`) and never reads the
//! answers: toolgate holds at most `MAX_UPSTREAM_REQUESTS` of them per connection,
//! then closes the connection (killing a stdio server), says why, and the next call
//! opens a new one. The gateway's memory is read from /proc: the old behaviour (a
//! handler and a reply per request, without a limit) grew it by hundreds of MiB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::mcp_adapter::{
    ANY_OBJECT, HttpUpstream, LabTool, call, lab, lab_server, none_left, processes_mentioning,
    starts,
};

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::Server;
use serde_json::json;

/// How many requests the hostile upstreams write: far past the bound, and enough that
/// holding them all grows the gateway by well over [`GROWTH_BOUND_KIB`].
const FLOOD: u64 = 100_000;
/// How much the gateway's peak resident memory may grow during a flood.
const GROWTH_BOUND_KIB: u64 = 64 * 1024;
/// What the gateway says (in its log and to the call in flight) when it cuts one off.
const CUT_OFF: &str = "requests that toolgate had not finished answering";

/// A line of /proc/<pid>/status, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Waits (at most 60 s) until the upstream either finished writing its flood
/// (`flood-done` in `state`) or `cut_off` holds.
fn flood_settles(state: &Path, mut cut_off: impl FnMut() -> bool) {
    common::poll_until(Duration::from_secs(60), || {
        state.join("flood-done").exists() || cut_off()
    });
}

#[test]
fn a_stdio_upstream_flooding_requests_while_idle_is_killed_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let server = Server::start_with(lab(
        dir.path(),
        &[
            LabTool {
                name: "ping_flood",
                adapter: lab_server(&state, "", "ping_flood"),
                timeout_ms: 20000,
                output_schema: ANY_OBJECT,
            },
            LabTool {
                name: "echo",
                adapter: lab_server(&state, "", "echo"),
                timeout_ms: 20000,
                output_schema: ANY_OBJECT,
            },
        ],
    ));
    let run = server.create_run(json!({}));
    let before = status_kib(server.pid(), "VmRSS:");
    // The call is answered; then the upstream stops reading and floods.
    let (status, body) = call(&server, &run, "ping_flood", json!({"count": FLOOD}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["text"], "flooding", "{body}");
    flood_settles(&state, || processes_mentioning(&state).is_empty());
    assert!(
        !state.join("flood-done").exists(),
        "the gateway read all {FLOOD} requests"
    );
    assert!(none_left(&state), "the flooding server was left running");
    let grown = status_kib(server.pid(), "VmHWM:").saturating_sub(before);
    assert!(grown < GROWTH_BOUND_KIB, "the gateway grew by {grown} KiB");
    assert!(!server.log_lines_with(CUT_OFF).is_empty());
    // The next call starts a new server.
    let (status, body) = call(&server, &run, "echo", json!({"text": "again"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"], json!({"text": "again", "start": 2}));
    assert_eq!(starts(&state), 2);
}

#[test]
fn a_stdio_upstream_flooding_requests_during_a_call_fails_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let server = Server::start_with(lab(
        dir.path(),
        &[LabTool {
            name: "ping_flood_in_call",
            adapter: lab_server(&state, "", "ping_flood_in_call"),
            timeout_ms: 30000,
            output_schema: ANY_OBJECT,
        }],
    ));
    let run = server.create_run(json!({}));
    let (status, body) = call(&server, &run, "ping_flood_in_call", json!({"count": FLOOD}));
    // Not a timeout: the call fails as soon as the bound is passed, saying why.
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "dependency_down", "{body}");
    let why = body["diagnostic"]["details"]["dependency_error"]
        .as_str()
        .unwrap();
    assert!(why.contains(CUT_OFF), "{why}");
    assert!(none_left(&state), "the flooding server was left running");
    assert!(!state.join("flood-done").exists());
    // Exactly one closing event for the call.
    let (status, events) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some("demo-admin"),
    );
    assert_eq!(status, 200, "{events}");
    let closing: Vec<_> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call_id"].is_string() && e["type"] != "tool_requested")
        .collect();
    assert_eq!(closing.len(), 1, "{events}");
    assert_eq!(closing[0]["type"], "tool_failed", "{events}");
}

#[test]
fn an_http_upstream_flooding_requests_on_its_get_stream_is_dropped_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    fs::create_dir_all(&state).unwrap();
    let upstream = HttpUpstream::script(
        "flood_http_server.py",
        &[state.as_os_str(), FLOOD.to_string().as_ref()],
    );
    let adapter = |tool: &str| format!("{{kind: mcp, url: {}, tool: {tool}}}", json!(upstream.url));
    let server = Server::start_with(lab(
        dir.path(),
        &[
            LabTool {
                name: "arm",
                adapter: adapter("arm"),
                timeout_ms: 20000,
                output_schema: ANY_OBJECT,
            },
            LabTool {
                name: "echo",
                adapter: adapter("echo"),
                timeout_ms: 20000,
                output_schema: ANY_OBJECT,
            },
        ],
    ));
    let run = server.create_run(json!({}));
    let before = status_kib(server.pid(), "VmRSS:");
    // The server may take a moment to accept: retry a refused first call.
    let mut answer = serde_json::Value::Null;
    common::poll_until(Duration::from_secs(10), || {
        answer = call(&server, &run, "arm", json!({})).1;
        answer["status"] == "success"
    });
    assert_eq!(answer["output"], json!({"tool": "arm"}), "{answer}");
    flood_settles(&state, || state.join("get-closed").exists());
    assert!(
        !state.join("flood-done").exists(),
        "the gateway read all {FLOOD} requests"
    );
    assert!(state.join("get-closed").exists());
    let grown = status_kib(server.pid(), "VmHWM:").saturating_sub(before);
    assert!(grown < GROWTH_BOUND_KIB, "the gateway grew by {grown} KiB");
    assert!(!server.log_lines_with(CUT_OFF).is_empty());
    // The next call opens a new session.
    let (status, body) = call(&server, &run, "echo", json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"], json!({"tool": "echo"}));
    let sessions = fs::read_to_string(state.join("sessions")).unwrap();
    assert_eq!(sessions.lines().count(), 2, "{sessions}");
}
