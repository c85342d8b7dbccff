//! Execution-stage outcomes over real HTTP, on the lab policy (tests/common/lab.rs):
//! concurrency limits, output-schema violations, artifacts, tool errors, upstreams.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::Server;
use common::lab::{call, lab};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

#[test]
fn execution_outcomes_each_get_their_status_reason_and_audit_event() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(lab(tmp.path()));
    let run = server.create_run(json!({}));

    let (code, body) = call(
        &server,
        &run,
        "echo_cmd",
        json!({"text": "hello"}),
        json!({}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["output"], json!({"text": "hello"}));

    let (code, body) = call(&server, &run, "bad_output", json!({"x": 1}), json!({}));
    assert_eq!(code, 500, "{body}");
    assert_eq!(body["status"], "failed");
    assert_eq!(body["diagnostic"]["reason"], "output_schema_violation");
    assert_eq!(body["diagnostic"]["failed_step"], 11);
    assert!(
        body["output"].is_null(),
        "a bad output is never passed on: {body}"
    );

    let (code, body) = call(&server, &run, "failing", json!({}), json!({}));
    assert_eq!(code, 500, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "tool_error");
    let tool_error = body["diagnostic"]["details"]["tool_error"]
        .as_str()
        .unwrap();
    assert!(tool_error.contains("the court is closed"), "{tool_error}");

    let (code, body) = call(
        &server,
        &run,
        "upstream_echo",
        json!({"q": "status"}),
        json!({}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["output"]["received"], json!({"q": "status"}));

    // A large output is kept whole as an artifact, never cut.
    let (code, body) = call(&server, &run, "big_output", json!({}), json!({}));
    assert_eq!(code, 200, "{body}");
    assert!(body["output"].is_null());
    let artifact = &body["artifact"];
    let sha256 = artifact["sha256"].as_str().unwrap();
    assert!(artifact["bytes"].as_u64().unwrap() > 200_000);
    let mut resp = ureq::get(format!(
        "{}/v1/artifacts/{sha256}?run_id={run}&role_id=tester",
        server.base
    ))
    .header("Authorization", "Bearer demo-tester")
    .call()
    .unwrap();
    let bytes = resp
        .body_mut()
        .with_config()
        .limit(10 << 20)
        .read_to_vec()
        .unwrap();
    assert_eq!(hex::encode(Sha256::digest(&bytes)), sha256);
    let stored: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(stored["blob"].as_str().unwrap().len(), 200_000);

    // Every call has exactly one closing event, and it is the one the response names.
    let (_, events) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some("demo-admin"),
    );
    let events = events["events"].as_array().unwrap();
    let closing: Vec<&str> = events
        .iter()
        .filter(|e| {
            e["type"] != "tool_requested"
                && e["type"] != "run_created"
                && e["type"] != "artifact_read"
        })
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        closing,
        [
            "tool_executed",
            "tool_failed",
            "tool_failed",
            "tool_executed",
            "tool_executed"
        ]
    );
    let executed = events.iter().rfind(|e| e["type"] == "tool_executed");
    assert_eq!(executed.unwrap()["details"]["artifact"]["sha256"], sha256);
    let read = events.last().unwrap();
    assert_eq!(read["type"], "artifact_read");
    assert_eq!(read["details"]["sha256"], sha256);
    assert_eq!(read["details"]["allowed"], true);
}

#[test]
fn over_max_concurrency_is_refused_with_retry_after() {
    let tmp = tempfile::tempdir().unwrap();
    let server = std::sync::Arc::new(Server::start_with(lab(tmp.path())));
    let run = server.create_run(json!({}));
    let first = {
        let server = server.clone();
        let run = run.clone();
        std::thread::spawn(move || call(&server, &run, "slow_one", json!({}), json!({})))
    };
    // The first call holds the only slot while its tool process runs.
    assert!(
        common::poll_until(Duration::from_secs(30), || !common::children_of(
            server.pid()
        )
        .is_empty()),
        "the first call's tool never started"
    );
    let (code, body) = call(&server, &run, "slow_one", json!({}), json!({}));
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "concurrency_limit_reached");
    assert_eq!(
        body["diagnostic"]["retryable"], true,
        "nothing ran, so a retry is safe"
    );
    assert!(
        body["diagnostic"]["details"]["retry_after_ms"]
            .as_u64()
            .unwrap()
            > 0
    );
    let (code, body) = first.join().unwrap();
    assert_eq!(code, 200, "{body}");
}

/// An agent whose tool echoes what it is sent makes every call leave a new artifact.
/// The artifacts are bounded together (`--max-artifact-bytes`): past the bound a call
/// fails with `artifact_store_failed` and its output withheld, the same output again
/// (already stored) still succeeds, and the bound holds across a restart.
#[test]
fn artifacts_are_bounded_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let start = || {
        let mut start = lab(tmp.path());
        start.data_dir = Some(tmp.path().join("var"));
        start.args = vec!["--max-artifact-bytes".into(), "50000".into()];
        Server::start_with(start)
    };
    let echo = |server: &Server, run: &str, fill: &str| {
        call(
            server,
            run,
            "echo_cmd",
            json!({"text": fill.repeat(20_000)}),
            json!({}),
        )
    };
    let server = start();
    let run = server.create_run(json!({}));
    for fill in ["a", "b"] {
        let (code, body) = echo(&server, &run, fill);
        assert_eq!(code, 200, "{body}");
        assert!(body["artifact"]["sha256"].is_string(), "{body}");
    }
    let (code, body) = echo(&server, &run, "c");
    assert_eq!(
        body["diagnostic"]["reason"], "artifact_store_failed",
        "{code} {body}"
    );
    assert!(body["output"].is_null(), "{body}");
    let message = body["error_message"].as_str().unwrap_or_default();
    assert!(message.contains("--max-artifact-bytes"), "{body}");
    let (code, body) = echo(&server, &run, "a");
    assert_eq!(
        code, 200,
        "an artifact already stored takes no room: {body}"
    );

    assert_eq!(server.stop().code(), Some(0));
    let server = start();
    let run = server.create_run(json!({}));
    let (_, body) = echo(&server, &run, "d");
    assert_eq!(
        body["diagnostic"]["reason"], "artifact_store_failed",
        "{body}"
    );
    let stored: u64 = std::fs::read_dir(tmp.path().join("var/artifacts"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.len())
        .sum();
    assert!(stored <= 50_000, "{stored} bytes of artifacts");
}
