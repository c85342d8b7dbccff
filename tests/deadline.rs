//! The deadline bound of issue 3: a command tool that sleeps past its deadline is
//! answered with status timeout within deadline + 100 ms (measured by the gateway from
//! receipt to response) and leaves no process behind. In its own test binary so no other
//! test's calls share the machine while it measures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "it/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::Server;
use common::lab::{call, lab, processes_with};
use serde_json::json;

#[test]
fn a_command_tool_past_its_deadline_times_out_and_leaves_no_process() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(lab(tmp.path()));
    let run = server.create_run(json!({}));
    let started = Instant::now();
    let (code, body) = call(
        &server,
        &run,
        "sleeper",
        json!({}),
        json!({"timeout_ms": 300}),
    );
    let elapsed = started.elapsed();
    assert_eq!(code, 504, "{body}");
    assert_eq!(body["status"], "timeout");
    assert_eq!(body["error_code"], "TOOL_TIMEOUT");
    assert_eq!(body["diagnostic"]["reason"], "tool_timeout");
    assert_eq!(body["diagnostic"]["failed_step"], 10);
    // Not idempotent: a retry could repeat a side effect.
    assert_eq!(body["diagnostic"]["retryable"], false);
    // Measured by the gateway, from receipt to response: the deadline counts from
    // receipt, so this is deadline + kill + reap + the closing audit append.
    let inside = body["execution_time_ms"].as_u64().unwrap();
    eprintln!(
        "timeout answered after {elapsed:?} (client), {inside} ms (gateway), deadline 300 ms"
    );
    assert!(inside >= 300, "answered before the deadline: {inside} ms");
    assert!(
        inside < 300 + 100,
        "timeout took {inside} ms in the gateway, over deadline + 100 ms"
    );
    // The whole process group is gone, the background child included.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !processes_with("sleep 47.25").is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(processes_with("sleep 47.25"), Vec::<String>::new());
    // A deadline above the tool's maximum is capped (1000 ms), not honoured.
    let started = Instant::now();
    let (code, body) = call(
        &server,
        &run,
        "sleeper",
        json!({}),
        json!({"timeout_ms": 60000}),
    );
    assert_eq!(code, 504, "{body}");
    assert_eq!(body["diagnostic"]["details"]["timeout_ms"], 1000);
    assert!(started.elapsed() < Duration::from_secs(3));
}
