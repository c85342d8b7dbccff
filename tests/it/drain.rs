//! A shutdown's drain, through the real server and SIGTERM: the drain time follows the
//! policy loaded when the shutdown comes (a reload may have raised or lowered a tool's
//! limits), and a call still running when it runs out is cancelled and closes with its
//! own event before the log closes: no call is left with a `tool_requested` and no
//! closing event.

use std::fs;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::lab::sha;
use crate::common::{ADMIN, Server, Start, poll_until, token};

const ROLES: &str = r#"
version: "dr-1"
roles:
  - role_id: tester
    description: Calls the held tool.
    enabled: true
    lanes: [ops]
    credential: {token_sha256: TESTER_SHA}
admins:
  - admin_id: ops
    description: Operator.
    credential: {token_sha256: ADMIN_SHA}
"#;

const LANES: &str = r#"
version: "dr-1"
lanes:
  - lane_id: ops
    description: Operations.
    tools: [held]
    required_scope_keys: []
    prohibited_flags: []
    run_statuses: [active]
    write: false
"#;

/// The registry: one tool that runs until the test's `go` file appears, with the
/// given `timeout_ms_max` and version.
fn registry(gate: &Path, version: u32, timeout_ms_max: u64) -> String {
    format!(
        r#"
version: "dr-{version}"
tools:
  - tool_name: held
    description: Runs until the test lets it finish.
    enabled: true
    version: 1.{version}.0
    determinism: pure
    idempotent: true
    timeout_default_ms: {timeout_ms_max}
    limits: {{timeout_ms_max: {timeout_ms_max}, max_output_bytes: 4096, max_concurrency: 8}}
    allowed_lanes: [ops]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {{kind: command, argv: ["sh", "-c", "read -r line; touch {gate}/started; while [ ! -e {gate}/go ]; do sleep 0.02; done; echo \"$line\""], env_allowlist: [PATH], sandbox: {{unconfined: "the gate files live in a root-only temporary directory"}}}}
    input_schema: {{type: object}}
    output_schema: {{type: object}}
"#,
        gate = gate.display()
    )
}

struct Setup {
    _dir: tempfile::TempDir,
    gate: std::path::PathBuf,
    registry: std::path::PathBuf,
    db: std::path::PathBuf,
    server: Server,
}

fn start(timeout_ms_max: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (policy, tools, gate) = (
        dir.path().join("policy"),
        dir.path().join("tools"),
        dir.path().join("gate"),
    );
    for d in [&policy, &tools, &gate] {
        fs::create_dir_all(d).unwrap();
    }
    let roles = ROLES
        .replace("TESTER_SHA", &sha(&token("tester")))
        .replace("ADMIN_SHA", &sha(ADMIN));
    fs::write(policy.join("roles.yaml"), roles).unwrap();
    fs::write(policy.join("lanes.yaml"), LANES).unwrap();
    let registry = tools.join("tool_registry.yaml");
    fs::write(&registry, self::registry(&gate, 1, timeout_ms_max)).unwrap();
    let data = dir.path().join("data");
    let server = Server::start_with(Start {
        policy_dir: policy,
        tools: registry.clone(),
        data_dir: Some(data.clone()),
        ..Start::default()
    });
    Setup {
        gate,
        registry,
        db: data.join("audit.db"),
        server,
        _dir: dir,
    }
}

impl Setup {
    fn reload(&self, version: u32, timeout_ms_max: u64) {
        fs::write(
            &self.registry,
            registry(&self.gate, version, timeout_ms_max),
        )
        .unwrap();
        let (code, body) = self
            .server
            .post("/v1/policy/reload", Some(ADMIN), &json!({}));
        assert_eq!(code, 200, "{body}");
    }

    /// Starts a call of `held` on a thread and waits until its tool runs.
    fn call_held(&self, run: &str, timeout_ms: u64) -> mpsc::Receiver<Option<(u16, Value)>> {
        let body = json!({
            "role_id": "tester", "run_id": run, "lane_id": "ops", "tool_name": "held",
            "arguments": {}, "scope": {}, "timeout_ms": timeout_ms,
        });
        let base = self.server.base.clone();
        let (sent, answer) = mpsc::channel();
        std::thread::spawn(move || {
            let answer = ureq::post(format!("{base}/v1/tool-calls"))
                .header("Authorization", &format!("Bearer {}", token("tester")))
                .config()
                .http_status_as_error(false)
                .build()
                .send(body.to_string().as_bytes())
                .ok()
                .map(|mut resp| {
                    let code = resp.status().as_u16();
                    let text = resp.body_mut().read_to_string().unwrap_or_default();
                    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
                });
            let _ = sent.send(answer);
        });
        assert!(
            poll_until(Duration::from_secs(10), || self
                .gate
                .join("started")
                .exists()),
            "the call never reached its tool"
        );
        answer
    }
}

/// (type, reason) of every tool call event, in order, read from the stopped log.
fn call_events(db: &Path) -> Vec<(String, Option<String>)> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn
        .prepare("SELECT type, line FROM events WHERE type LIKE 'tool_%' ORDER BY seq")
        .unwrap();
    stmt.query_map([], |r| {
        let (kind, line): (String, String) = (r.get(0)?, r.get(1)?);
        Ok((kind, line))
    })
    .unwrap()
    .map(|row| {
        let (kind, line) = row.unwrap();
        let event: Value = serde_json::from_str(&line).unwrap();
        (kind, event["reason"].as_str().map(str::to_string))
    })
    .collect()
}

#[test]
fn a_reload_that_raises_a_tools_limit_raises_the_drain_time() {
    // Started with a 1 s limit (a 2 s drain); reloaded to 6 s before the call.
    let setup = start(1000);
    setup.reload(2, 6000);
    let run = setup.server.create_run(json!({}));
    let answer = setup.call_held(&run, 4000);
    let db = setup.db.clone();
    // SIGTERM while the call runs: it may take its whole 4 s, past the first drain time.
    assert_eq!(setup.server.stop().code(), Some(0));
    let (code, body) = answer
        .recv_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("the call was cut off without an answer");
    assert_eq!(code, 504, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "tool_timeout", "{body}");
    assert_eq!(
        call_events(&db),
        [
            ("tool_requested".to_string(), None),
            ("tool_timeout".to_string(), Some("tool_timeout".to_string()))
        ]
    );
}

#[test]
fn a_call_still_running_when_the_drain_time_ends_is_cancelled_and_closed() {
    // Started with a 20 s limit; the call may run 15 s, but a reload lowers the limit
    // to 0.5 s (a 1.5 s drain) before the shutdown.
    let setup = start(20_000);
    let run = setup.server.create_run(json!({}));
    let answer = setup.call_held(&run, 15_000);
    setup.reload(2, 500);
    let db = setup.db.clone();
    let gate = setup.gate.clone();
    assert_eq!(setup.server.stop().code(), Some(0));
    // Released only after the stop, should the server have waited for it.
    fs::write(gate.join("go"), b"").unwrap();
    let (code, body) = answer
        .recv_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("the call was cut off without an answer");
    assert_eq!(body["diagnostic"]["reason"], "cancelled", "{code} {body}");
    assert_eq!(
        call_events(&db),
        [
            ("tool_requested".to_string(), None),
            ("tool_failed".to_string(), Some("cancelled".to_string()))
        ]
    );
}

/// A SIGTERM or SIGHUP sent the moment the server says it is listening is handled (a
/// clean stop, exit 0; a reload), never the signal's default action, which kills the
/// process before its log is closed. The handlers are installed before that line;
/// before, a stop sent at once killed it now and then (exit by signal). A sink whose
/// start takes a moment after the line (`--ship`) widened that window.
#[test]
fn a_signal_sent_as_soon_as_the_server_listens_is_handled() {
    let tmp = tempfile::tempdir().unwrap();
    for round in 0..10 {
        let start = |data: &str| Start {
            data_dir: Some(tmp.path().join(data)),
            args: vec!["--ship".into(), "otlp+http://127.0.0.1:1".into()],
            ..Start::default()
        };
        let server = Server::start_with(start(&format!("term-{round}")));
        assert_eq!(server.stop().code(), Some(0), "round {round}: SIGTERM");
        let server = Server::start_with(start(&format!("hup-{round}")));
        crate::common::unsafe_free_kill(server.pid(), "HUP");
        let (code, body) = server.get("/healthz", None);
        assert_eq!(code, 200, "round {round}: alive after SIGHUP: {body}");
        assert_eq!(server.stop().code(), Some(0), "round {round}");
    }
}
