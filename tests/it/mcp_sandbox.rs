//! A stdio MCP server runs inside its sandbox profile, as a command tool does: a
//! hostile server (tests/mcp/lab_server.py's `probe`) cannot read the gateway's keys or
//! audit log nor reach a listener on loopback, every call it answers records the
//! sandbox it ran under, and where the host cannot hold the profile the server never
//! starts (`sandbox_unavailable`).

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use crate::common::{ADMIN, Server};
use crate::mcp_adapter::{ANY_OBJECT, LabTool, call, lab, lab_server, starts};
use serde_json::{Value, json};

/// The closing event of the call `call_id`.
fn closing_event(server: &Server, run: &str, call_id: &str) -> Value {
    let (code, body) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(code, 200, "{body}");
    let closing: Vec<&Value> = body["events"]
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
        .collect();
    assert_eq!(closing.len(), 1, "{closing:?}");
    closing[0].clone()
}

fn probe_tool(state: &Path) -> LabTool {
    LabTool {
        name: "probe",
        adapter: lab_server(state, "", "probe"),
        timeout_ms: 20000,
        output_schema: ANY_OBJECT,
    }
}

/// The files of the key directory and the audit log: what a hostile tool wants.
fn secrets_of(data_dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(data_dir.join("keys"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.push(data_dir.join("audit.db"));
    found
}

#[test]
fn a_hostile_stdio_server_cannot_read_the_keys_or_reach_the_network() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = Server::start_with(lab(dir.path(), &[probe_tool(&state)]));
    let run = server.create_run(json!({}));

    // Its own state directory (the profile's `write`) it may read: the probe works.
    let (code, body) = call(
        &server,
        &run,
        "probe",
        json!({"read": state.join("starts")}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["output"]["read"], "ok", "{body}");
    let event = closing_event(&server, &run, body["call_id"].as_str().unwrap());
    let sandbox = &event["details"]["sandbox"];
    assert_eq!(
        sandbox["profile_sha256"].as_str().map(str::len),
        Some(64),
        "{event}"
    );
    assert_eq!(sandbox["lifetime"], "server", "{event}");
    assert!(
        sandbox["enforced"]["filesystem"]
            .as_str()
            .is_some_and(|f| f.starts_with("landlock_abi_")),
        "{event}"
    );
    assert_eq!(sandbox["network"], "none", "{event}");

    // The keys and the audit log are out of reach; so is a listener on loopback.
    let secrets = secrets_of(&server.data_dir);
    assert!(secrets.len() >= 2, "{secrets:?}");
    for target in &secrets {
        let (code, body) = call(&server, &run, "probe", json!({"read": target}));
        assert_eq!(code, 200, "{body}");
        let read = body["output"]["read"].as_str().unwrap();
        assert!(read.starts_with("denied"), "{}: {body}", target.display());
    }
    let (code, body) = call(&server, &run, "probe", json!({"connect": port}));
    assert_eq!(code, 200, "{body}");
    let connect = body["output"]["connect"].as_str().unwrap();
    assert!(connect.starts_with("denied"), "{body}");
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "the server reached the listener"
    );

    // One process answered every call, confined once.
    assert_eq!(starts(&state), 1);
    assert!(server.stop().success());
}

#[test]
fn a_stdio_server_the_host_cannot_confine_never_starts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut start = lab(dir.path(), &[probe_tool(&state)]);
    start
        .env
        .push(("TOOLGATE_TEST_SANDBOX".into(), "landlock-missing".into()));
    let server = Server::start_with(start);
    let run = server.create_run(json!({}));
    let (code, body) = call(&server, &run, "probe", json!({"read": "/etc/hostname"}));
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        body["diagnostic"]["reason"], "sandbox_unavailable",
        "{body}"
    );
    assert_eq!(
        body["diagnostic"]["details"]["reached_tool"], false,
        "{body}"
    );
    let event = closing_event(&server, &run, body["call_id"].as_str().unwrap());
    assert_eq!(event["reason"], "sandbox_unavailable");
    assert_eq!(
        event["details"]["sandbox"]["unavailable"]["guarantee"], "filesystem",
        "{event}"
    );
    // The server's program never ran.
    assert_eq!(starts(&state), 0);
}
