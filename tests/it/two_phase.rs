//! Two-phase tools (issue 17 item 5): the real server and the real stand-in court
//! (`demo/court.py`): prepare -> commit, prepare -> deadline -> rollback, a commit is
//! never replayed (twice, concurrently), refused commits (another run, another role,
//! unknown or forged ids, after a rollback), a failing commit upstream, and the
//! rollback of a deadline that passed while the gateway was down, the commit's
//! write-ahead event (no upstream commit the log could not record first) and an outcome
//! the log could not take recorded later, once. Every test ends with
//! `toolgate audit verify` on the log.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::lab::sha;
use crate::common::{self, BIN, Server, Start, poll_for, poll_until};

const ROLES: &str = r#"
version: "tp-1"
roles:
  - role_id: clerk
    description: Files with the court.
    enabled: true
    lanes: [filing]
    credential: {token_sha256: CLERK_SHA}
  - role_id: intern
    description: Also files, but did not prepare the calls under test.
    enabled: true
    lanes: [filing]
    credential: {token_sha256: INTERN_SHA}
admins:
  - admin_id: ops
    description: Operator.
    credential: {token_sha256: ADMIN_SHA}
"#;

const LANES: &str = r#"
version: "tp-1"
lanes:
  - lane_id: filing
    description: Court filings.
    tools: [court_file, court_quick, cmd_file]
    required_scope_keys: []
    prohibited_flags: []
    run_statuses: [active]
    write: true
"#;

const TOOLS: &str = r#"
version: "tp-1"
tools:
  - tool_name: court_file
    description: Prepares a filing; committed within a minute.
    enabled: true
    version: 1.0.0
    determinism: side_effectful
    idempotent: false
    timeout_default_ms: 10000
    limits: {timeout_ms_max: 20000, max_output_bytes: 65536, max_concurrency: 16}
    allowed_lanes: [filing]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: ["http:COURT/filings"]
    adapter:
      kind: http
      url: "http://COURT/filings/prepare"
      allowed_hosts: ["COURT"]
      phases:
        commit: {url: "http://COURT/filings/commit"}
        rollback: {url: "http://COURT/filings/rollback"}
        commit_within_s: 60
        max_attempts: 3
        timeout_ms: 5000
    input_schema: {type: object}
    output_schema: {type: object, properties: {filing_id: {type: string}, status: {type: string}}, required: [filing_id, status], additionalProperties: false}
  - tool_name: court_quick
    description: Prepares a filing that must be committed within a second.
    enabled: true
    version: 1.0.0
    determinism: side_effectful
    idempotent: false
    timeout_default_ms: 10000
    limits: {timeout_ms_max: 20000, max_output_bytes: 65536, max_concurrency: 16}
    allowed_lanes: [filing]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: ["http:COURT/filings"]
    adapter:
      kind: http
      url: "http://COURT/filings/prepare"
      allowed_hosts: ["COURT"]
      phases:
        commit: {url: "http://COURT/filings/commit"}
        rollback: {url: "http://COURT/filings/rollback"}
        commit_within_s: 1
    input_schema: {type: object}
    output_schema: {type: object}
  - tool_name: cmd_file
    description: A two-phase command tool; its commit program records what it was given.
    enabled: true
    version: 1.0.0
    determinism: side_effectful
    idempotent: false
    timeout_default_ms: 10000
    limits: {timeout_ms_max: 20000, max_output_bytes: 65536, max_concurrency: 16}
    allowed_lanes: [filing]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: ["data_dir:phases/"]
    adapter:
      kind: command
      argv: ["sh", "-c", "cat >/dev/null; printf '{\"status\":\"prepared\",\"commit_token\":\"ct-cmd-1\"}'"]
      env_allowlist: [PATH]
      sandbox: {unconfined: "its phases write beside the registry, in a root-only temporary directory"}
      phases:
        commit: {argv: ["sh", "-c", "cat > committed.json; printf '{\"status\":\"committed\"}'"]}
        rollback: {argv: ["sh", "-c", "cat > rolled_back.json; printf '{}'"]}
        commit_within_s: 60
    input_schema: {type: object}
    output_schema: {type: object}
"#;

/// The stand-in court, `demo/court.py`, on a free port; killed on drop.
pub(crate) struct Court {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub(crate) host: String,
    agent: ureq::Agent,
}

impl Court {
    pub(crate) fn start() -> Court {
        let mut child = Command::new("python3")
            .arg(common::repo().join("demo/court.py"))
            .args(["--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs demo/court.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let host = line
            .trim()
            .strip_prefix("court listening on http://")
            .unwrap_or_else(|| panic!("court did not start: {line:?}"))
            .to_string();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Court { child, host, agent }
    }

    /// Every filing the court holds.
    pub(crate) fn filings(&self) -> Vec<Value> {
        let mut resp = self
            .agent
            .get(format!("http://{}/filings", self.host))
            .call()
            .unwrap();
        let body: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
        body["filings"].as_array().cloned().unwrap_or_default()
    }

    fn filing(&self, filing_id: &str) -> Value {
        let mut resp = self
            .agent
            .get(format!("http://{}/filings/{filing_id}", self.host))
            .call()
            .unwrap();
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap()
    }

    /// Makes the next request of `phase` wait, before it takes effect, until
    /// [`Court::release`].
    fn hold_next(&self, phase: &str) {
        self.control(json!({ "hold_next": phase }));
    }

    fn release(&self, phase: &str) {
        self.control(json!({ "release": phase }));
    }

    /// How many requests of `phase` are waiting now.
    fn held(&self, phase: &str) -> u64 {
        let mut resp = self
            .agent
            .get(format!("http://{}/control", self.host))
            .call()
            .unwrap();
        let body: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
        body["held"][phase].as_u64().unwrap()
    }

    fn control(&self, body: Value) {
        let resp = self
            .agent
            .post(format!("http://{}/control", self.host))
            .send(body.to_string().as_bytes())
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }

    /// Makes the next `count` requests of `phase` fail with a 503.
    fn fail_next(&self, phase: &str, count: u32) {
        let resp = self
            .agent
            .post(format!("http://{}/control", self.host))
            .send(
                json!({ "fail_next": phase, "count": count })
                    .to_string()
                    .as_bytes(),
            )
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }
}

impl Drop for Court {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes the policy for `court` under `dir`.
fn policy(dir: &Path, court: &Court) -> Start {
    let policy = dir.join("policy");
    let tools = dir.join("tools");
    fs::create_dir_all(&policy).unwrap();
    fs::create_dir_all(&tools).unwrap();
    fs::write(
        policy.join("roles.yaml"),
        ROLES
            .replace("CLERK_SHA", &sha("demo-clerk"))
            .replace("INTERN_SHA", &sha("demo-intern"))
            .replace("ADMIN_SHA", &sha(common::ADMIN)),
    )
    .unwrap();
    fs::write(policy.join("lanes.yaml"), LANES).unwrap();
    fs::write(
        tools.join("tool_registry.yaml"),
        TOOLS.replace("COURT", &court.host),
    )
    .unwrap();
    Start {
        policy_dir: policy,
        tools: tools.join("tool_registry.yaml"),
        ..Start::default()
    }
}

struct Lab {
    server: Server,
    court: Court,
    _tmp: tempfile::TempDir,
}

fn lab() -> Lab {
    let tmp = tempfile::tempdir().unwrap();
    let court = Court::start();
    let server = Server::start_with(policy(tmp.path(), &court));
    Lab {
        server,
        court,
        _tmp: tmp,
    }
}

fn prepare(server: &Server, run: &str, tool: &str) -> Value {
    let (status, body) = server.call(
        "clerk",
        run,
        "filing",
        tool,
        json!({"title": "motion"}),
        json!({}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "success", "{body}");
    assert_eq!(body["details"]["phase"], "prepared", "{body}");
    assert!(
        body["details"]["commit"]["commit_id"]
            .as_str()
            .is_some_and(|c| c.starts_with("commit-")),
        "{body}"
    );
    assert!(body["details"]["commit"]["deadline"].is_string(), "{body}");
    // INVARIANT under test: the upstream's commit token never reaches the agent.
    assert!(
        !body.to_string().contains("ct-"),
        "the commit token leaked: {body}"
    );
    assert!(body["output"].get("commit_token").is_none(), "{body}");
    body
}

fn commit(server: &Server, prepared: &Value, role: &str, run: &str) -> (u16, Value) {
    commit_with(
        server,
        prepared["call_id"].as_str().unwrap(),
        prepared["details"]["commit"]["commit_id"].as_str().unwrap(),
        role,
        run,
    )
}

fn commit_with(
    server: &Server,
    call_id: &str,
    commit_id: &str,
    role: &str,
    run: &str,
) -> (u16, Value) {
    server.post(
        &format!("/v1/tool-calls/{call_id}/commit"),
        Some(&common::token(role)),
        &json!({ "commit_id": commit_id, "role_id": role, "run_id": run }),
    )
}

fn reason(body: &Value) -> &str {
    body["diagnostic"]["reason"].as_str().unwrap_or("")
}

/// The audit events of `call_id` (admin read), oldest first.
fn events_of(server: &Server, call_id: &str) -> Vec<Value> {
    let (status, body) = server.get("/v1/audit/events?limit=1000", Some(common::ADMIN));
    assert_eq!(status, 200, "{body}");
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call_id"] == call_id)
        .cloned()
        .collect()
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

/// `toolgate audit verify` passes on the server's log, and the log never holds a
/// commit token.
fn verify(db: &Path) {
    verify_with(db, &[]);
}

/// `toolgate audit verify --db DB` with `extra` arguments passes.
fn verify_with(db: &Path, extra: &[&std::ffi::OsStr]) {
    let out = Command::new(BIN)
        .args(["audit", "verify", "--db"])
        .arg(db)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "audit verify failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn no_token_in_log(server: &Server, call_id: &str) {
    let events = events_of(server, call_id);
    let text = serde_json::to_string(&events).unwrap();
    assert!(
        !text.contains("ct-"),
        "a commit token is in the audit log: {text}"
    );
}

fn filing_id(prepared: &Value) -> String {
    prepared["output"]["filing_id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn prepare_then_commit_commits_upstream_once_and_audits_each_phase() {
    let lab = lab();
    let run = lab.server.create_run(json!({}));
    let prepared = prepare(&lab.server, &run, "court_file");
    let filing = filing_id(&prepared);
    assert_eq!(lab.court.filing(&filing)["status"], "prepared");

    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["phase"], "committed", "{body}");
    assert_eq!(body["output"]["status"], "committed", "{body}");
    assert!(!body.to_string().contains("ct-"), "{body}");
    assert_eq!(lab.court.filing(&filing)["status"], "committed");
    assert_eq!(lab.court.filing(&filing)["commits"], 1);

    let call_id = prepared["call_id"].as_str().unwrap();
    let events = events_of(&lab.server, call_id);
    assert_eq!(
        types(&events),
        [
            "tool_requested",
            "tool_executed",
            "tool_commit_requested",
            "tool_committed"
        ],
        "{events:?}"
    );
    assert_eq!(events[1]["details"]["phase"], "prepared");
    assert_eq!(events[2]["details"]["trigger"], "request");
    assert_eq!(events[3]["details"]["trigger"], "request");
    assert_eq!(events[3]["details"]["attempts"], 1);
    no_token_in_log(&lab.server, call_id);
    verify(&lab.server.db());
}

#[test]
fn without_a_commit_the_deadline_rolls_back_and_a_late_commit_is_refused() {
    let lab = lab();
    let run = lab.server.create_run(json!({}));
    let prepared = prepare(&lab.server, &run, "court_quick");
    let filing = filing_id(&prepared);
    assert!(
        poll_until(
            Duration::from_secs(20),
            || lab.court.filing(&filing)["status"] == "rolled_back"
        ),
        "the stand-in court never saw the rollback: {}",
        lab.court.filing(&filing)
    );
    let call_id = prepared["call_id"].as_str().unwrap();
    let rolled = poll_for(Duration::from_secs(5), || {
        events_of(&lab.server, call_id)
            .into_iter()
            .find(|e| e["type"] == "tool_rolled_back")
    })
    .expect("a tool_rolled_back event");
    assert_eq!(rolled["details"]["trigger"], "deadline");

    // Commit after rollback: refused, and nothing reaches the court.
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(status, 409, "{body}");
    assert_eq!(reason(&body), "commit_expired", "{body}");
    assert_eq!(
        body["diagnostic"]["details"]["state"], "rolled_back",
        "{body}"
    );
    assert_eq!(lab.court.filing(&filing)["commits"], 0);
    let events = events_of(&lab.server, call_id);
    assert_eq!(types(&events).last().unwrap(), "tool_commit_refused");
    assert_eq!(events.last().unwrap()["reason"], "commit_expired");
    no_token_in_log(&lab.server, call_id);
    verify(&lab.server.db());
}

#[test]
fn a_commit_is_never_replayed_even_by_concurrent_commits() {
    let lab = lab();
    let run = lab.server.create_run(json!({}));
    let prepared = prepare(&lab.server, &run, "court_file");
    let filing = filing_id(&prepared);
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| commit(&lab.server, &prepared, "clerk", &run)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let won: Vec<_> = answers.iter().filter(|(s, _)| *s == 200).collect();
    assert_eq!(won.len(), 1, "exactly one commit wins: {answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!(*status, 409, "{body}");
        assert_eq!(reason(body), "commit_already_used", "{body}");
    }
    // And once more, after it is settled.
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(status, 409, "{body}");
    assert_eq!(reason(&body), "commit_already_used", "{body}");
    assert_eq!(
        body["diagnostic"]["details"]["state"], "committed",
        "{body}"
    );
    assert_eq!(
        lab.court.filing(&filing)["commits"],
        1,
        "the court saw one commit"
    );

    let events = events_of(&lab.server, prepared["call_id"].as_str().unwrap());
    let t = types(&events);
    assert_eq!(
        t.iter().filter(|e| *e == "tool_committed").count(),
        1,
        "{t:?}"
    );
    assert_eq!(
        t.iter().filter(|e| *e == "tool_commit_refused").count(),
        8,
        "{t:?}"
    );
    verify(&lab.server.db());
}

#[test]
fn commits_by_another_run_or_role_or_with_unknown_ids_are_refused_and_consume_nothing() {
    let lab = lab();
    let run = lab.server.create_run(json!({}));
    let other_run = lab.server.create_run(json!({}));
    let prepared = prepare(&lab.server, &run, "court_file");
    let call_id = prepared["call_id"].as_str().unwrap();
    let commit_id = prepared["details"]["commit"]["commit_id"].as_str().unwrap();

    // Another run of the same role.
    let (status, body) = commit(&lab.server, &prepared, "clerk", &other_run);
    assert_eq!(
        (status, reason(&body)),
        (403, "commit_not_allowed"),
        "{body}"
    );
    // Another role, with its own valid credential.
    let (status, body) = commit(&lab.server, &prepared, "intern", &run);
    assert_eq!(
        (status, reason(&body)),
        (403, "commit_not_allowed"),
        "{body}"
    );
    // The right role and run named, with another role's credential.
    let (status, body) = lab.server.post(
        &format!("/v1/tool-calls/{call_id}/commit"),
        Some(&common::token("intern")),
        &json!({ "commit_id": commit_id, "role_id": "clerk", "run_id": run }),
    );
    assert_eq!(status, 401, "{body}");
    // No credential at all.
    let (status, body) = lab.server.post(
        &format!("/v1/tool-calls/{call_id}/commit"),
        None,
        &json!({ "commit_id": commit_id, "role_id": "clerk", "run_id": run }),
    );
    assert_eq!(status, 401, "{body}");
    // A forged commit id for the real call, a real commit id for another call id, an
    // unknown call: all unknown.
    for (call, commit) in [
        (call_id, "commit-00000000-0000-4000-8000-000000000000"),
        ("call-00000000-0000-4000-8000-000000000000", commit_id),
        ("nope", "nope"),
    ] {
        let (status, body) = commit_with(&lab.server, call, commit, "clerk", &run);
        assert_eq!((status, reason(&body)), (404, "commit_unknown"), "{body}");
    }
    // Malformed and oversized bodies: structured refusals.
    let (status, body) = lab.server.post(
        &format!("/v1/tool-calls/{call_id}/commit"),
        Some(&common::token("clerk")),
        &json!({ "commit_id": "x".repeat(10_000), "role_id": "clerk", "run_id": run }),
    );
    assert_eq!(
        (status, reason(&body)),
        (400, "request_malformed"),
        "{body}"
    );
    let (status, body) = lab.server.post(
        &format!("/v1/tool-calls/{call_id}/commit"),
        Some(&common::token("clerk")),
        &json!({ "commit_id": commit_id, "role_id": "clerk", "run_id": run, "token": "x" }),
    );
    assert_eq!(
        (status, reason(&body)),
        (400, "request_malformed"),
        "{body}"
    );

    // None of that consumed the commit.
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        lab.court.filing(&filing_id(&prepared))["status"],
        "committed"
    );
    let refused: Vec<Value> = events_of(&lab.server, call_id)
        .into_iter()
        .filter(|e| e["type"] == "tool_commit_refused")
        .collect();
    assert!(
        refused.len() >= 4,
        "each refusal naming the call is audited: {refused:?}"
    );
    verify(&lab.server.db());
}

#[test]
fn a_commit_failing_upstream_is_retried_within_bounds_then_rolled_back() {
    let lab = lab();
    let run = lab.server.create_run(json!({}));
    let prepared = prepare(&lab.server, &run, "court_file");
    let filing = filing_id(&prepared);
    lab.court.fail_next("commit", 100);
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!((status, reason(&body)), (502, "commit_failed"), "{body}");
    let details = &body["diagnostic"]["details"];
    assert_eq!(
        details["attempts"], 3,
        "max_attempts bounds the retries: {body}"
    );
    assert_eq!(details["rollback"], "rolled_back", "{body}");
    assert_eq!(lab.court.filing(&filing)["status"], "rolled_back");
    let events = events_of(&lab.server, prepared["call_id"].as_str().unwrap());
    let t = types(&events);
    assert!(
        t.ends_with(&[
            "tool_commit_failed".to_string(),
            "tool_rolled_back".to_string()
        ]),
        "{t:?}"
    );
    assert_eq!(
        events.last().unwrap()["details"]["trigger"],
        "commit_failed"
    );
    // A second commit is refused: the call was rolled back.
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!((status, reason(&body)), (409, "commit_expired"), "{body}");
    verify(&lab.server.db());
}

#[test]
fn a_deadline_that_passes_while_the_gateway_is_down_is_rolled_back_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let court = Court::start();
    let data_dir = tmp.path().join("var");
    let start = || Start {
        data_dir: Some(data_dir.clone()),
        ..policy(tmp.path(), &court)
    };
    let server = Server::start_with(start());
    let run = server.create_run(json!({}));
    let prepared = prepare(&server, &run, "court_quick");
    let filing = filing_id(&prepared);
    // Killed at once: the one-second deadline passes while it is down.
    server.kill9();
    let deadline_ms = prepared["details"]["commit"]["deadline_unix_ms"]
        .as_i64()
        .unwrap();
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    assert!(poll_until(Duration::from_secs(10), || now_ms() > deadline_ms));
    assert_eq!(
        court.filing(&filing)["status"],
        "prepared",
        "nothing rolled back while down"
    );

    let server = Server::start_with(start());
    assert!(
        poll_until(Duration::from_secs(20), || court.filing(&filing)["status"]
            == "rolled_back"),
        "the restarted gateway did not roll back: {}",
        court.filing(&filing)
    );
    let call_id = prepared["call_id"].as_str().unwrap();
    let rolled = poll_for(Duration::from_secs(5), || {
        events_of(&server, call_id)
            .into_iter()
            .find(|e| e["type"] == "tool_rolled_back")
    })
    .expect("a tool_rolled_back event after the restart");
    assert_eq!(rolled["details"]["trigger"], "deadline_passed_while_down");
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!((status, reason(&body)), (409, "commit_expired"), "{body}");
    verify(&server.db());
}

#[test]
fn a_registry_with_bad_phases_is_refused_with_every_problem_located() {
    let tmp = tempfile::tempdir().unwrap();
    let court = Court::start();
    let start = policy(tmp.path(), &court);
    let text = fs::read_to_string(&start.tools).unwrap();
    let bad = text
        .replacen("commit_within_s: 60", "commit_within_s: 0", 1)
        .replacen(
            &format!(
                "rollback: {{url: \"http://{}/filings/rollback\"}}",
                court.host
            ),
            "rollback: {argv: [\"true\"]}",
            1,
        );
    fs::write(&start.tools, bad).unwrap();
    let out = Command::new(BIN)
        .args(["policy", "check", "--policy-dir"])
        .arg(&start.policy_dir)
        .arg("--tools")
        .arg(&start.tools)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("commit_within_s"), "{text}");
    assert!(text.contains("phases.rollback"), "{text}");
}

#[test]
fn a_command_tool_commits_through_its_commit_program_with_the_kept_token() {
    let lab = lab();
    let run = lab.server.create_run(json!({}));
    let prepared = prepare(&lab.server, &run, "cmd_file");
    assert_eq!(
        prepared["output"],
        json!({"status": "prepared"}),
        "{prepared}"
    );
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"], json!({"status": "committed"}), "{body}");
    // The commit program got the token the prepare answered, on its stdin.
    let tools_dir = lab._tmp.path().join("tools");
    let given: Value =
        serde_json::from_slice(&fs::read(tools_dir.join("committed.json")).unwrap()).unwrap();
    assert_eq!(given["phase"], "commit");
    assert_eq!(given["commit_token"], "ct-cmd-1");
    assert_eq!(given["call_id"], prepared["call_id"]);
    assert!(!tools_dir.join("rolled_back.json").exists());
    // The commit's event records the sandbox its program ran under, as a call's does.
    let call_id = prepared["call_id"].as_str().unwrap();
    let events = events_of(&lab.server, call_id);
    let committed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_committed")
        .collect();
    assert_eq!(committed.len(), 1, "{events:?}");
    assert_eq!(
        committed[0]["details"]["sandbox"]["unconfined"],
        "its phases write beside the registry, in a root-only temporary directory",
        "{}",
        committed[0]
    );
    no_token_in_log(&lab.server, call_id);
    verify(&lab.server.db());
}

/// A `toolgate signer` process holding the audit log's key, on a socket; killed on drop.
struct SignerProcess {
    child: Option<Child>,
    keys: PathBuf,
    socket: PathBuf,
}

impl SignerProcess {
    fn start(dir: &Path) -> SignerProcess {
        let mut signer = SignerProcess {
            child: None,
            keys: dir.join("signer-keys"),
            socket: dir.join("signer.sock"),
        };
        signer.restart();
        signer
    }

    /// Starts the signer (again) and waits until it accepts connections.
    fn restart(&mut self) {
        let mut child = Command::new(BIN)
            .arg("signer")
            .arg("--key-dir")
            .arg(&self.keys)
            .arg("--socket")
            .arg(&self.socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let listening = poll_until(Duration::from_secs(20), || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the signer exited: {status}");
            }
            std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
        });
        assert!(listening, "the signer did not start");
        self.child = Some(child);
    }

    /// Kills the signer: the audit log cannot sign, so it takes no event.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for SignerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A gateway whose audit log is signed by a separate signer process, on a data
/// directory that survives restarts.
struct SignedLab {
    signer: SignerProcess,
    court: Court,
    tmp: tempfile::TempDir,
}

impl SignedLab {
    fn new() -> SignedLab {
        let tmp = tempfile::tempdir().unwrap();
        SignedLab {
            signer: SignerProcess::start(tmp.path()),
            court: Court::start(),
            tmp,
        }
    }

    fn gateway_keys(&self) -> PathBuf {
        self.tmp.path().join("gateway-keys")
    }

    fn start(&self) -> Server {
        Server::start_with(Start {
            data_dir: Some(self.tmp.path().join("var")),
            args: vec![
                "--signer-socket".into(),
                self.signer.socket.display().to_string(),
                "--key-dir".into(),
                self.gateway_keys().display().to_string(),
            ],
            ..policy(self.tmp.path(), &self.court)
        })
    }

    /// Sends the commit of `prepared`; while the court holds it, kills the signer, so
    /// the commit's outcome happens upstream but the log cannot take its event.
    fn commit_while_the_signer_dies(
        &mut self,
        server: &Server,
        prepared: &Value,
        run: &str,
    ) -> (u16, Value) {
        self.court.hold_next("commit");
        std::thread::scope(|s| {
            let committing = s.spawn(|| commit(server, prepared, "clerk", run));
            assert!(
                poll_until(Duration::from_secs(20), || self.court.held("commit") == 1),
                "the commit never reached the court"
            );
            self.signer.kill();
            self.court.release("commit");
            committing.join().unwrap()
        })
    }

    /// `toolgate audit verify` passes on the stopped gateway's log.
    fn verify(&self) {
        let keys = self.gateway_keys();
        verify_with(
            &self.tmp.path().join("var/audit.db"),
            &["--key-dir".as_ref(), keys.as_os_str()],
        );
    }
}

#[test]
fn a_commit_is_recorded_before_it_is_sent_upstream_and_not_sent_when_it_cannot_be() {
    let mut lab = SignedLab::new();
    let server = lab.start();
    let run = server.create_run(json!({}));
    let prepared = prepare(&server, &run, "court_file");
    let filing = filing_id(&prepared);
    let call_id = prepared["call_id"].as_str().unwrap();

    // The log cannot take the commit's write-ahead event: nothing reaches the court.
    lab.signer.kill();
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!(
        (status, reason(&body)),
        (503, "audit_unavailable"),
        "{body}"
    );
    assert_eq!(body["diagnostic"]["retryable"], true, "{body}");
    assert_eq!(
        lab.court.filing(&filing)["commits"],
        0,
        "the court saw no commit"
    );
    assert_eq!(lab.court.filing(&filing)["status"], "prepared");

    // The signer is back: the same commit goes through, recorded before it ran.
    lab.signer.restart();
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["phase"], "committed", "{body}");
    assert_eq!(lab.court.filing(&filing)["commits"], 1);
    let events = events_of(&server, call_id);
    assert_eq!(
        types(&events),
        [
            "tool_requested",
            "tool_executed",
            "tool_commit_requested",
            "tool_committed"
        ],
        "{events:?}"
    );
    let requested = &events[2];
    assert_eq!(requested["run_id"], run.as_str());
    assert_eq!(requested["role_id"], "clerk");
    assert_eq!(requested["tool_name"], "court_file");
    assert_eq!(requested["details"]["trigger"], "request");
    assert_eq!(
        requested["details"]["commit_id"],
        prepared["details"]["commit"]["commit_id"]
    );
    no_token_in_log(&server, call_id);
    assert_eq!(server.stop().code(), Some(0));
    lab.verify();
}

#[test]
fn a_commit_outcome_the_log_could_not_take_is_recorded_later_exactly_once() {
    let mut lab = SignedLab::new();
    let server = lab.start();
    let run = server.create_run(json!({}));
    let prepared = prepare(&server, &run, "court_file");
    let filing = filing_id(&prepared);
    let call_id = prepared["call_id"].as_str().unwrap().to_string();

    // The commit reaches the court and waits there; the signer dies meanwhile.
    let (status, body) = lab.commit_while_the_signer_dies(&server, &prepared, &run);
    assert_eq!(
        (status, reason(&body)),
        (503, "audit_unavailable"),
        "{body}"
    );
    assert_eq!(body["diagnostic"]["retryable"], false, "{body}");
    assert!(body.get("output").is_none(), "{body}");
    assert_eq!(lab.court.filing(&filing)["status"], "committed");
    let committed = |server: &Server| {
        events_of(server, &call_id)
            .into_iter()
            .filter(|e| e["type"] == "tool_committed")
            .collect::<Vec<_>>()
    };
    assert!(committed(&server).is_empty(), "the log could not take it");

    // The signer is back: the owed tool_committed is recorded without a second commit.
    lab.signer.restart();
    let late = poll_for(Duration::from_secs(20), || committed(&server).pop())
        .expect("the owed tool_committed is recorded once the log takes it");
    assert_eq!(late["details"]["recorded_late"], true, "{late}");
    assert_eq!(late["details"]["trigger"], "request", "{late}");
    assert!(late["output_hash_sha256"].is_string(), "{late}");
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!(
        (status, reason(&body)),
        (409, "commit_already_used"),
        "{body}"
    );
    assert_eq!(
        body["diagnostic"]["details"]["state"], "committed",
        "{body}"
    );

    // A restart neither records it again nor commits again.
    assert_eq!(server.stop().code(), Some(0));
    let server = lab.start();
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!(
        (status, reason(&body)),
        (409, "commit_already_used"),
        "{body}"
    );
    let events = events_of(&server, &call_id);
    assert_eq!(
        types(&events),
        [
            "tool_requested",
            "tool_executed",
            "tool_commit_requested",
            "tool_committed",
            "tool_commit_refused",
            "tool_commit_refused"
        ],
        "{events:?}"
    );
    assert_eq!(
        lab.court.filing(&filing)["commits"],
        1,
        "the court saw one commit"
    );
    no_token_in_log(&server, &call_id);
    assert_eq!(server.stop().code(), Some(0));
    lab.verify();
}

/// A commit that fails upstream is rolled back; when the log cannot take either
/// outcome, both are owed and recorded later, in order, once each, and neither phase is
/// run again to record it.
#[test]
fn a_failed_commit_and_its_rollback_the_log_could_not_take_are_recorded_later_once() {
    let mut lab = SignedLab::new();
    let server = lab.start();
    let run = server.create_run(json!({}));
    let prepared = prepare(&server, &run, "court_file");
    let filing = filing_id(&prepared);
    let call_id = prepared["call_id"].as_str().unwrap().to_string();

    // Every commit attempt fails; the first waits at the court while the signer dies.
    lab.court.fail_next("commit", 100);
    let (status, body) = lab.commit_while_the_signer_dies(&server, &prepared, &run);
    assert_eq!(
        (status, reason(&body)),
        (503, "audit_unavailable"),
        "{body}"
    );
    let record = lab.court.filing(&filing);
    assert_eq!(record["status"], "rolled_back", "{record}");
    assert_eq!(record["rollbacks"], 1, "{record}");
    let outcomes = |server: &Server| {
        events_of(server, &call_id)
            .into_iter()
            .filter(|e| e["type"] == "tool_commit_failed" || e["type"] == "tool_rolled_back")
            .collect::<Vec<_>>()
    };
    assert!(outcomes(&server).is_empty(), "the log could not take them");

    // The signer is back: both are recorded, oldest first, marked late.
    lab.signer.restart();
    let late = poll_for(Duration::from_secs(20), || {
        Some(outcomes(&server)).filter(|o| o.len() == 2)
    })
    .expect("both owed outcomes are recorded once the log takes them");
    assert_eq!(
        types(&late),
        ["tool_commit_failed", "tool_rolled_back"],
        "{late:?}"
    );
    for event in &late {
        assert_eq!(event["details"]["recorded_late"], true, "{event}");
    }
    assert_eq!(late[0]["reason"], "commit_failed", "{late:?}");
    assert_eq!(late[1]["details"]["trigger"], "commit_failed", "{late:?}");
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!((status, reason(&body)), (409, "commit_expired"), "{body}");

    // A restart records neither again and runs no phase again.
    assert_eq!(server.stop().code(), Some(0));
    let server = lab.start();
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!((status, reason(&body)), (409, "commit_expired"), "{body}");
    assert_eq!(
        types(&events_of(&server, &call_id)),
        [
            "tool_requested",
            "tool_executed",
            "tool_commit_requested",
            "tool_commit_failed",
            "tool_rolled_back",
            "tool_commit_refused",
            "tool_commit_refused"
        ]
    );
    let record = lab.court.filing(&filing);
    assert_eq!(
        (&record["commits"], &record["rollbacks"]),
        (&json!(0), &json!(1)),
        "{record}"
    );
    no_token_in_log(&server, &call_id);
    assert_eq!(server.stop().code(), Some(0));
    lab.verify();
}

/// The deadline's rollback, when the log cannot take its outcome: recorded later, once.
#[test]
fn a_deadline_rollback_the_log_could_not_take_is_recorded_later_once() {
    let mut lab = SignedLab::new();
    let server = lab.start();
    let run = server.create_run(json!({}));
    lab.court.hold_next("rollback");
    let prepared = prepare(&server, &run, "court_quick");
    let filing = filing_id(&prepared);
    let call_id = prepared["call_id"].as_str().unwrap().to_string();
    assert!(
        poll_until(Duration::from_secs(20), || lab.court.held("rollback") == 1),
        "the deadline's rollback never reached the court"
    );
    lab.signer.kill();
    lab.court.release("rollback");
    assert!(
        poll_until(Duration::from_secs(20), || {
            lab.court.filing(&filing)["status"] == "rolled_back"
        }),
        "the rollback never took effect"
    );
    let rolled = |server: &Server| {
        events_of(server, &call_id)
            .into_iter()
            .filter(|e| e["type"] == "tool_rolled_back")
            .collect::<Vec<_>>()
    };
    // The court has rolled back, but the gateway still owes the event: a commit now
    // is refused, and since its refusal cannot be recorded either, it is answered
    // `audit_unavailable`; nothing reaches the court.
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!(
        (status, reason(&body)),
        (503, "audit_unavailable"),
        "{body}"
    );
    assert_eq!(lab.court.filing(&filing)["commits"], 0);

    lab.signer.restart();
    let late = poll_for(Duration::from_secs(20), || rolled(&server).pop())
        .expect("the owed tool_rolled_back is recorded once the log takes it");
    assert_eq!(late["details"]["recorded_late"], true, "{late}");
    assert_eq!(late["details"]["trigger"], "deadline", "{late}");
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!((status, reason(&body)), (409, "commit_expired"), "{body}");
    assert_eq!(server.stop().code(), Some(0));
    let server = lab.start();
    assert_eq!(rolled(&server).len(), 1, "recorded once");
    let record = lab.court.filing(&filing);
    assert_eq!(
        (&record["commits"], &record["rollbacks"]),
        (&json!(0), &json!(1)),
        "{record}"
    );
    assert_eq!(server.stop().code(), Some(0));
    lab.verify();
}

#[test]
fn a_commit_outcome_owed_at_a_stop_is_recorded_at_the_next_start() {
    let mut lab = SignedLab::new();
    let server = lab.start();
    let run = server.create_run(json!({}));
    let prepared = prepare(&server, &run, "court_file");
    let filing = filing_id(&prepared);
    let call_id = prepared["call_id"].as_str().unwrap().to_string();

    let (status, body) = lab.commit_while_the_signer_dies(&server, &prepared, &run);
    assert_eq!(
        (status, reason(&body)),
        (503, "audit_unavailable"),
        "{body}"
    );
    // Killed while it still owes the event; the signer is back before it starts.
    server.kill9();
    lab.signer.restart();
    let server = lab.start();
    let late = poll_for(Duration::from_secs(20), || {
        events_of(&server, &call_id)
            .into_iter()
            .find(|e| e["type"] == "tool_committed")
    })
    .expect("the owed tool_committed is recorded at start");
    assert_eq!(late["details"]["recorded_late"], true, "{late}");
    let events = events_of(&server, &call_id);
    assert_eq!(
        types(&events),
        [
            "tool_requested",
            "tool_executed",
            "tool_commit_requested",
            "tool_committed"
        ],
        "{events:?}"
    );
    assert_eq!(
        lab.court.filing(&filing)["commits"],
        1,
        "the court saw one commit"
    );
    assert_eq!(server.stop().code(), Some(0));
    lab.verify();
}

#[test]
fn a_commit_is_refused_and_audited_when_the_audit_log_has_no_room() {
    let tmp = tempfile::tempdir().unwrap();
    let court = Court::start();
    let data_dir = tmp.path().join("var");
    let start = |args: Vec<String>| Start {
        data_dir: Some(data_dir.clone()),
        args,
        ..policy(tmp.path(), &court)
    };
    let server = Server::start_with(start(Vec::new()));
    let run = server.create_run(json!({}));
    let prepared = prepare(&server, &run, "court_file");
    let filing = filing_id(&prepared);
    let call_id = prepared["call_id"].as_str().unwrap();
    // The least cap `serve` accepts is 64 MiB, 48 of them the WAL's allowance: grow the
    // log past 13 MiB so that a cap 3 MiB over what it holds is accepted.
    let log_bytes = || -> u64 {
        ["audit.db", "audit.db-wal"]
            .iter()
            .map(|f| fs::metadata(data_dir.join(f)).map_or(0, |m| m.len()))
            .sum()
    };
    let pad = "p".repeat(100_000);
    let pad_run = server.create_run(json!({}));
    let db_bytes = || fs::metadata(data_dir.join("audit.db")).map_or(0, |m| m.len());
    while db_bytes() < 14 * 1024 * 1024 {
        let (status, body) = server.call(
            "clerk",
            &pad_run,
            "filing",
            "court_quick",
            json!({ "title": pad }),
            json!({}),
        );
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(server.stop().code(), Some(0));

    // Back with a cap that leaves less than the 4 MiB reserve (but more than the half
    // kept for admin changes, so the refusal is recorded).
    let cap = (log_bytes() + 48 * 1024 * 1024 + 3 * 1024 * 1024).to_string();
    let server = Server::start_with(start(vec!["--max-audit-bytes".into(), cap]));
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!(
        (status, reason(&body)),
        (503, "audit_capacity_exhausted"),
        "{body}"
    );
    assert_eq!(
        court.filing(&filing)["commits"],
        0,
        "the court saw no commit"
    );
    // The events of this call's run only: the padding run's are large.
    let (_, page) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=100"),
        Some(common::ADMIN),
    );
    let events: Vec<&Value> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call_id"] == call_id)
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["type"], "tool_commit_refused", "{events:?}");
    assert_eq!(last["reason"], "audit_capacity_exhausted", "{last}");
    assert_eq!(server.stop().code(), Some(0));

    // With room again, the refusal consumed nothing: the same commit goes through.
    let server = Server::start_with(start(Vec::new()));
    let (status, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        court.filing(&filing)["commits"],
        1,
        "{} {body}",
        court.filing(&filing)
    );
    verify(&server.db());
}

/// The commit is where the side effect happens: the safety lock and a run no longer
/// active for the lane refuse it as they refuse a call; each refusal is audited, nothing reaches the upstream, and the prepared call
/// can be committed once nothing refuses it any more.
#[test]
fn a_commit_is_refused_under_the_safety_lock_or_while_its_run_is_suspended() {
    let lab = lab();
    let run = lab.server.create_run(json!({}));
    let prepared = prepare(&lab.server, &run, "court_file");
    let filing = filing_id(&prepared);
    let admin = Some(common::ADMIN);
    let set_lock = |engaged: bool| {
        let (status, body) = lab.server.post(
            "/v1/safety-lock",
            admin,
            &json!({"engaged": engaged, "reason": "incident"}),
        );
        assert_eq!(status, 200, "{body}");
    };
    let set_status = |status: &str| {
        let (code, body) = lab.server.post(
            &format!("/v1/runs/{run}/status"),
            admin,
            &json!({ "status": status }),
        );
        assert_eq!(code, 200, "{body}");
    };

    set_lock(true);
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(reason(&body), "safety_lock_engaged", "{status} {body}");
    set_lock(false);
    set_status("suspended");
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(reason(&body), "run_not_active", "{status} {body}");
    assert_eq!(lab.court.filing(&filing)["status"], "prepared");
    assert_eq!(lab.court.filing(&filing)["commits"], 0);

    set_status("active");
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(status, 200, "{body}");
    assert_eq!(lab.court.filing(&filing)["commits"], 1);
    let call_id = prepared["call_id"].as_str().unwrap();
    let events = events_of(&lab.server, call_id);
    assert_eq!(
        types(&events),
        [
            "tool_requested",
            "tool_executed",
            "tool_commit_refused",
            "tool_commit_refused",
            "tool_commit_requested",
            "tool_committed"
        ],
        "{events:?}"
    );
    verify(&lab.server.db());
}

/// In a fleet a sidecar keeps a copy of the runs and run tokens, refreshed when a
/// request names them. A commit is where the side effect happens, so it reads them
/// from the cluster database first: a run suspended, or a run token revoked, through
/// another sidecar refuses the commit at once, and the court sees nothing.
#[test]
fn in_a_fleet_a_commit_reads_its_run_and_token_from_the_cluster_database() {
    let pg = crate::common::postgres::Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let court = Court::start();
    let start = || {
        let mut start = policy(tmp.path(), &court);
        start.args = vec!["--cluster-db".into(), pg.url()];
        Server::start_with(start)
    };
    let (a, b) = (start(), start());
    let admin = Some(common::ADMIN);

    // A run suspended through B: A's copy still says active, the database does not.
    let run = a.create_run(json!({}));
    let prepared = prepare(&a, &run, "court_file");
    let filing = filing_id(&prepared);
    let set_status = |status: &str| {
        let (code, body) = b.post(
            &format!("/v1/runs/{run}/status"),
            admin,
            &json!({ "status": status }),
        );
        assert_eq!(code, 200, "{body}");
    };
    set_status("suspended");
    let (status, body) = commit(&a, &prepared, "clerk", &run);
    assert_eq!(
        (status, reason(&body)),
        (403, "run_not_active"),
        "{status} {body}"
    );
    assert_eq!(court.filing(&filing)["commits"], 0);
    set_status("active");
    let (status, body) = commit(&a, &prepared, "clerk", &run);
    assert_eq!(status, 200, "{body}");
    assert_eq!(court.filing(&filing)["commits"], 1);

    // A run token revoked through B: A last saw it valid when the call was prepared.
    let (code, created) = a.post(
        "/v1/runs",
        admin,
        &json!({"scope": {}, "issue_tokens": [{"role_id": "clerk"}]}),
    );
    assert_eq!(code, 201, "{created}");
    let token_run = created["run_id"].as_str().unwrap();
    let token = created["tokens"][0]["token"].as_str().unwrap();
    let token_id = created["tokens"][0]["token_id"].as_str().unwrap();
    let (code, prepared) = a.post(
        "/v1/tool-calls",
        Some(token),
        &json!({"tool_name": "court_file", "arguments": {"title": "motion"}}),
    );
    assert_eq!(code, 200, "{prepared}");
    assert_eq!(prepared["details"]["phase"], "prepared", "{prepared}");
    let filing = filing_id(&prepared);
    let (code, revoked) = b.post(
        &format!("/v1/runs/{token_run}/tokens/{token_id}/revoke"),
        admin,
        &json!({}),
    );
    assert_eq!(code, 200, "{revoked}");
    let (status, body) = a.post(
        &format!(
            "/v1/tool-calls/{}/commit",
            prepared["call_id"].as_str().unwrap()
        ),
        Some(token),
        &json!({
            "commit_id": prepared["details"]["commit"]["commit_id"],
            "role_id": "clerk",
            "run_id": token_run,
        }),
    );
    assert_eq!(
        (status, reason(&body)),
        (401, "credential_expired"),
        "{status} {body}"
    );
    assert_eq!(court.filing(&filing)["commits"], 0);

    // Each refusal is A's audit event, and A's log verifies.
    let call_id = prepared["call_id"].as_str().unwrap();
    assert_eq!(
        types(&events_of(&a, call_id)),
        ["tool_requested", "tool_executed", "tool_commit_refused"]
    );
    verify(&a.db());
}

/// Issue 38, finding 4: a run token limited to other lanes than the prepared call's
/// commits nothing. A commit is decided like a call of its run and lane: the same
/// token sending the call itself is refused with `lane_not_allowed_for_role`, and so
/// is its commit (audited as `tool_commit_refused`, with the token's id).
#[test]
fn a_run_token_of_other_lanes_cannot_commit_a_call_of_the_filing_lane() {
    let tmp = tempfile::tempdir().unwrap();
    let court = Court::start();
    let start = policy(tmp.path(), &court);
    // The clerk also keeps the records lane; the token below is limited to it.
    let roles = start.policy_dir.join("roles.yaml");
    let text = fs::read_to_string(&roles).unwrap();
    fs::write(
        &roles,
        text.replacen("lanes: [filing]", "lanes: [filing, records]", 1),
    )
    .unwrap();
    let lanes = start.policy_dir.join("lanes.yaml");
    let text = fs::read_to_string(&lanes).unwrap();
    fs::write(
        &lanes,
        format!(
            "{text}  - lane_id: records\n    description: Keeps records.\n    tools: []\n    required_scope_keys: []\n    prohibited_flags: []\n    run_statuses: [active]\n    write: false\n"
        ),
    )
    .unwrap();
    let server = Server::start_with(start);
    let (code, created) = server.post(
        "/v1/runs",
        Some(common::ADMIN),
        &json!({"scope": {}, "issue_tokens": [{"role_id": "clerk", "lanes": ["records"]}]}),
    );
    assert_eq!(code, 201, "{created}");
    let run = created["run_id"].as_str().unwrap().to_string();
    let records_token = created["tokens"][0]["token"].as_str().unwrap().to_string();
    let token_id = created["tokens"][0]["token_id"]
        .as_str()
        .unwrap()
        .to_string();

    // The clerk's own credential prepares a filing in the run.
    let prepared = prepare(&server, &run, "court_file");
    let filing = filing_id(&prepared);
    let call_id = prepared["call_id"].as_str().unwrap();
    let commit_id = prepared["details"]["commit"]["commit_id"].as_str().unwrap();

    // The records token sending the call itself: refused at step 4.
    let (code, called) = server.post(
        "/v1/tool-calls",
        Some(&records_token),
        &json!({"lane_id": "filing", "tool_name": "court_file", "arguments": {"title": "motion"}}),
    );
    assert_eq!(
        (code, reason(&called)),
        (403, "lane_not_allowed_for_role"),
        "{called}"
    );
    // Its commit of the filing: refused the same way, and the court sees nothing.
    let (code, body) = server.post(
        &format!("/v1/tool-calls/{call_id}/commit"),
        Some(&records_token),
        &json!({ "commit_id": commit_id, "role_id": "clerk", "run_id": run }),
    );
    assert_eq!(
        (code, reason(&body)),
        (403, "lane_not_allowed_for_role"),
        "{body}"
    );
    assert_eq!(
        body["diagnostic"]["failed_step"], called["diagnostic"]["failed_step"],
        "{body}"
    );
    assert_eq!(court.filing(&filing)["commits"], 0);
    let events = events_of(&server, call_id);
    assert_eq!(
        types(&events),
        ["tool_requested", "tool_executed", "tool_commit_refused"],
        "{events:?}"
    );
    let refused = events.last().unwrap();
    assert_eq!(refused["reason"], "lane_not_allowed_for_role", "{refused}");
    assert_eq!(refused["lane_id"], "filing", "{refused}");
    assert_eq!(
        refused["details"]["caller"]["token_id"], token_id,
        "{refused}"
    );

    // The refusal consumed nothing: the clerk commits.
    let (code, body) = commit(&server, &prepared, "clerk", &run);
    assert_eq!(code, 200, "{body}");
    assert_eq!(court.filing(&filing)["commits"], 1);
    verify(&server.db());
}

/// Issue 38, finding 5: what refuses a call refuses its commit, under the policy the
/// run's calls are decided under now. After a reload every call of a run pinned to the
/// old versions is refused (`policy_version_mismatch`), and so is the commit of a call
/// it prepared; once an admin re-pins the run, both are decided under the new policy.
#[test]
fn a_commit_after_a_reload_that_refuses_its_runs_calls_is_refused_too() {
    let lab = lab();
    let run = lab.server.create_run(json!({}));
    let prepared = prepare(&lab.server, &run, "court_file");
    let filing = filing_id(&prepared);
    let call_id = prepared["call_id"].as_str().unwrap();

    // Same rules, another version: the run stays pinned to the old one.
    let registry = lab._tmp.path().join("tools/tool_registry.yaml");
    let text = fs::read_to_string(&registry).unwrap();
    fs::write(&registry, format!("{text}\n# reviewed again\n")).unwrap();
    let (code, body) = lab
        .server
        .post("/v1/policy/reload", Some(common::ADMIN), &json!({}));
    assert_eq!(code, 200, "{body}");

    let (code, called) = lab.server.call(
        "clerk",
        &run,
        "filing",
        "court_file",
        json!({"title": "another motion"}),
        json!({}),
    );
    assert_eq!(reason(&called), "policy_version_mismatch", "{called}");
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(
        (status, reason(&body)),
        (code, "policy_version_mismatch"),
        "{body}"
    );
    assert_eq!(lab.court.filing(&filing)["commits"], 0);
    assert_eq!(lab.court.filing(&filing)["status"], "prepared");
    let events = events_of(&lab.server, call_id);
    assert_eq!(
        types(&events),
        ["tool_requested", "tool_executed", "tool_commit_refused"],
        "{events:?}"
    );
    assert_eq!(events[2]["reason"], "policy_version_mismatch");

    // Re-pinned: the run's calls are decided under the new policy, and so is the commit.
    let (code, body) = lab.server.post(
        &format!("/v1/runs/{run}/repin"),
        Some(common::ADMIN),
        &json!({}),
    );
    assert_eq!(code, 200, "{body}");
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(status, 200, "{body}");
    assert_eq!(lab.court.filing(&filing)["commits"], 1);
    verify(&lab.server.db());
}

/// Issue 38, finding 6: a commit request that names a call is audited, a malformed one
/// too once its caller is authenticated: exactly one `tool_commit_refused` each, with
/// `request_malformed`. An unauthenticated one is refused, structured, and leaves
/// nothing (what a caller without a credential can make the log keep stays bounded).
#[test]
fn a_malformed_commit_by_an_authenticated_caller_is_audited_once() {
    let lab = lab();
    let run = lab.server.create_run(json!({}));
    let prepared = prepare(&lab.server, &run, "court_file");
    let call_id = prepared["call_id"].as_str().unwrap();
    let commit_id = prepared["details"]["commit"]["commit_id"].as_str().unwrap();
    let path = format!("/v1/tool-calls/{call_id}/commit");
    let refusals = || {
        events_of(&lab.server, call_id)
            .into_iter()
            .filter(|e| e["type"] == "tool_commit_refused")
            .collect::<Vec<Value>>()
    };
    let clerk = common::token("clerk");
    let bodies: [Vec<u8>; 4] = [
        b"{\"commit_id\": ".to_vec(),
        json!({ "commit_id": commit_id, "role_id": "clerk", "run_id": run, "extra": 1 })
            .to_string()
            .into_bytes(),
        json!({ "commit_id": 7, "role_id": "clerk", "run_id": run })
            .to_string()
            .into_bytes(),
        b"[]".to_vec(),
    ];
    for (i, body) in bodies.iter().enumerate() {
        let (status, answer) = lab.server.post_raw(&path, Some(&clerk), body);
        assert_eq!(
            (status, reason(&answer)),
            (400, "request_malformed"),
            "{answer}"
        );
        let refused = refusals();
        assert_eq!(
            refused.len(),
            i + 1,
            "exactly one event per request: {refused:?}"
        );
        let event = refused.last().unwrap();
        assert_eq!(event["reason"], "request_malformed", "{event}");
        assert_eq!(event["call_id"], call_id, "{event}");
        assert_eq!(event["error_code"], answer["error_code"], "{event}");
    }
    // Without a credential, or with one that proves nothing: refused, unrecorded.
    for token in [None, Some("not-a-token")] {
        let (status, answer) = lab.server.post_raw(&path, token, &bodies[1]);
        assert_eq!(status, 401, "{answer}");
        assert!(answer["diagnostic"]["reason"].is_string(), "{answer}");
    }
    assert_eq!(refusals().len(), bodies.len());
    // Nothing was consumed.
    let (status, body) = commit(&lab.server, &prepared, "clerk", &run);
    assert_eq!(status, 200, "{body}");
    verify(&lab.server.db());
}
