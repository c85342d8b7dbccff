//! Call budgets and rates (issue 18 item 5), through the real server with its real
//! SQLite counters: a budget is per run and exhausts with `budget_exhausted` (not
//! retryable); a rate is per key value and refuses with a retryable `rate_limited` and
//! `retry_after_ms`; denied calls and dry runs count nothing; concurrent callers never
//! pass a budget; a restart keeps the counts. `policy check` refuses bad limits.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::lab::sha;
use crate::common::{self, BIN, Server, Start, poll_until};

const ROLES: &str = r#"
version: "bg-1"
roles:
  - role_id: tester
    description: Calls the limited tools.
    enabled: true
    lanes: [ops, tight]
    credential: {token_sha256: TESTER_SHA}
admins:
  - admin_id: ops
    description: Operator.
    credential: {token_sha256: ADMIN_SHA}
"#;

const LANES: &str = r#"
version: "bg-1"
lanes:
  - lane_id: ops
    description: Operations.
    tools: [restart, ping, gated, slow_limited]
    required_scope_keys: []
    prohibited_flags: []
    run_statuses: [active]
    write: false
  - lane_id: tight
    description: A lane with its own budget over all its tools.
    tools: [ping, gated]
    required_scope_keys: []
    prohibited_flags: []
    run_statuses: [active]
    write: false
    budget: {max_calls_per_run: 2}
"#;

pub(crate) const TOOLS: &str = r#"
version: "bg-1"
tools:
  - tool_name: restart
    description: Restarts a service (echoes); at most 3 per service per hour.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {timeout_ms_max: 10000, max_output_bytes: 4096, max_concurrency: 16}
    allowed_lanes: [ops]
    required_scope_keys: [service]
    prohibited_flags: []
    write_targets: []
    adapter: {kind: command, argv: ["cat"]}
    rate: {max: 3, per_s: 3600, key: scope.service}
    input_schema: {type: object}
    output_schema: {type: object}
  - tool_name: ping
    description: At most 2 calls a second, over all callers.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {timeout_ms_max: 10000, max_output_bytes: 4096, max_concurrency: 16}
    allowed_lanes: [ops, tight]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {kind: command, argv: ["cat"]}
    rate: {max: 2, per_s: 1}
    input_schema: {type: object}
    output_schema: {type: object}
  - tool_name: gated
    description: Two calls per run; a condition denies some calls.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {timeout_ms_max: 10000, max_output_bytes: 4096, max_concurrency: 16}
    allowed_lanes: [ops, tight]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {kind: command, argv: ["cat"]}
    budget: {max_calls_per_run: 2}
    conditions:
      - name: not_denied
        expr: "!has(args.deny) || args.deny == false"
        message: the call asked to be denied
    input_schema: {type: object}
    output_schema: {type: object}
  - tool_name: slow_limited
    description: Four calls per run; each takes a while, so callers overlap.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 10000
    limits: {timeout_ms_max: 20000, max_output_bytes: 4096, max_concurrency: 64}
    allowed_lanes: [ops]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {kind: command, argv: ["sh", "-c", "read -r line; sleep 0.3; echo \"$line\""], env_allowlist: [PATH]}
    budget: {max_calls_per_run: 4}
    input_schema: {type: object}
    output_schema: {type: object}
"#;

pub(crate) fn write_policy(dir: &Path, tools: &str) -> Start {
    let policy = dir.join("policy");
    let tools_dir = dir.join("tools");
    fs::create_dir_all(&policy).unwrap();
    fs::create_dir_all(&tools_dir).unwrap();
    fs::write(
        policy.join("roles.yaml"),
        ROLES
            .replace("TESTER_SHA", &sha("demo-tester"))
            .replace("ADMIN_SHA", &sha(common::ADMIN)),
    )
    .unwrap();
    fs::write(policy.join("lanes.yaml"), LANES).unwrap();
    fs::write(tools_dir.join("tool_registry.yaml"), tools).unwrap();
    Start {
        policy_dir: policy,
        tools: tools_dir.join("tool_registry.yaml"),
        ..Start::default()
    }
}

fn call(
    server: &Server,
    run: &str,
    lane: &str,
    tool: &str,
    arguments: Value,
    scope: Value,
) -> (u16, Value) {
    server.call("tester", run, lane, tool, arguments, scope)
}

fn reason(body: &Value) -> &str {
    body["diagnostic"]["reason"].as_str().unwrap_or("")
}

fn verify(db: &Path) {
    let out = Command::new(BIN)
        .args(["audit", "verify", "--db"])
        .arg(db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_budget_is_per_run_and_denied_calls_and_dry_runs_do_not_count() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(write_policy(tmp.path(), TOOLS));
    let run = server.create_run(json!({}));
    // Denied at step 8 by a condition: not counted.
    for _ in 0..3 {
        let (status, body) = call(
            &server,
            &run,
            "ops",
            "gated",
            json!({"deny": true}),
            json!({}),
        );
        assert_eq!((status, reason(&body)), (403, "condition_failed"), "{body}");
    }
    // A dry run is checked, not counted.
    let (status, body) = server.post(
        "/v1/tool-calls",
        Some("demo-tester"),
        &json!({"role_id": "tester", "run_id": run, "lane_id": "ops", "tool_name": "gated",
                "arguments": {}, "scope": {}, "dry_run": true}),
    );
    assert_eq!(status, 200, "{body}");
    for i in 0..2 {
        let (status, body) = call(&server, &run, "ops", "gated", json!({"i": i}), json!({}));
        assert_eq!(status, 200, "call {i}: {body}");
        assert_eq!(body["trace"]["limits"][0]["kind"], "budget", "{body}");
    }
    let (status, body) = call(&server, &run, "ops", "gated", json!({"i": 3}), json!({}));
    assert_eq!((status, reason(&body)), (403, "budget_exhausted"), "{body}");
    let d = &body["diagnostic"];
    assert_eq!(d["failed_step"], 8);
    assert_eq!(d["retryable"], false);
    assert_eq!(d["details"]["owner"], "tool:gated");
    assert_eq!(d["details"]["max"], 2);
    assert_eq!(d["details"]["used"], 2);
    // A dry run now says so too.
    let (status, body) = server.post(
        "/v1/tool-calls",
        Some("demo-tester"),
        &json!({"role_id": "tester", "run_id": run, "lane_id": "ops", "tool_name": "gated",
                "arguments": {}, "scope": {}, "dry_run": true}),
    );
    assert_eq!((status, reason(&body)), (403, "budget_exhausted"), "{body}");
    // Another run has its own budget.
    let other = server.create_run(json!({}));
    let (status, body) = call(&server, &other, "ops", "gated", json!({}), json!({}));
    assert_eq!(status, 200, "{body}");
    verify(&server.db());
}

#[test]
fn a_lane_budget_counts_every_tool_of_the_lane() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(write_policy(tmp.path(), TOOLS));
    let run = server.create_run(json!({}));
    let (status, body) = call(&server, &run, "tight", "gated", json!({}), json!({}));
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&server, &run, "tight", "ping", json!({}), json!({}));
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&server, &run, "tight", "gated", json!({}), json!({}));
    assert_eq!((status, reason(&body)), (403, "budget_exhausted"), "{body}");
    assert_eq!(
        body["diagnostic"]["details"]["owner"], "lane:tight",
        "{body}"
    );
    // The refused call counted nothing: the tool's own budget still has a call left in
    // another lane.
    let (status, body) = call(&server, &run, "ops", "gated", json!({}), json!({}));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_rate_is_per_key_value_and_says_when_to_retry() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(write_policy(tmp.path(), TOOLS));
    let run = server.create_run(json!({}));
    for i in 0..3 {
        let (status, body) = call(
            &server,
            &run,
            "ops",
            "restart",
            json!({}),
            json!({"service": "api"}),
        );
        assert_eq!(status, 200, "restart {i}: {body}");
    }
    let (status, body) = call(
        &server,
        &run,
        "ops",
        "restart",
        json!({}),
        json!({"service": "api"}),
    );
    assert_eq!((status, reason(&body)), (429, "rate_limited"), "{body}");
    let d = &body["diagnostic"];
    assert_eq!(d["failed_step"], 8);
    assert_eq!(d["retryable"], true);
    assert_eq!(d["details"]["key"], "scope.service");
    assert_eq!(d["details"]["key_value"], "api");
    let wait = d["details"]["retry_after_ms"].as_u64().unwrap();
    assert!(wait > 3_500_000 && wait <= 3_600_000, "{wait}");
    // Another service has its own count.
    let (status, body) = call(
        &server,
        &run,
        "ops",
        "restart",
        json!({}),
        json!({"service": "db"}),
    );
    assert_eq!(status, 200, "{body}");

    // A one-second window: the third call is refused, and a retry after the given
    // wait is admitted.
    let (status, _) = call(&server, &run, "ops", "ping", json!({}), json!({}));
    assert_eq!(status, 200);
    let (status, _) = call(&server, &run, "ops", "ping", json!({}), json!({}));
    assert_eq!(status, 200);
    let (status, body) = call(&server, &run, "ops", "ping", json!({}), json!({}));
    // Taken once the answer is in: the server's wait counts from its own, earlier, now.
    let refused_at = Instant::now();
    if status == 429 {
        let wait = body["diagnostic"]["details"]["retry_after_ms"]
            .as_u64()
            .unwrap();
        assert!((1..=1000).contains(&wait), "{body}");
        assert!(poll_until(Duration::from_secs(10), || refused_at.elapsed()
            >= Duration::from_millis(wait)));
        let (status, body) = call(&server, &run, "ops", "ping", json!({}), json!({}));
        assert_eq!(
            status, 200,
            "the retry after retry_after_ms is admitted: {body}"
        );
    } else {
        // The machine was slow enough that the window had already moved on.
        assert_eq!(status, 200, "{body}");
    }
    verify(&server.db());
}

#[test]
fn concurrent_callers_never_pass_a_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(write_policy(tmp.path(), TOOLS));
    let run = server.create_run(json!({}));
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let server = &server;
                let run = &run;
                s.spawn(move || {
                    call(
                        server,
                        run,
                        "ops",
                        "slow_limited",
                        json!({"i": i}),
                        json!({}),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(ok, 4, "exactly the budget is admitted: {answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!((*status, reason(body)), (403, "budget_exhausted"), "{body}");
    }
}

#[test]
fn a_restart_keeps_the_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("var");
    let start = || Start {
        data_dir: Some(data_dir.clone()),
        ..write_policy(tmp.path(), TOOLS)
    };
    let server = Server::start_with(start());
    let run = server.create_run(json!({}));
    let (status, _) = call(&server, &run, "ops", "gated", json!({}), json!({}));
    assert_eq!(status, 200);
    for _ in 0..3 {
        let (status, _) = call(
            &server,
            &run,
            "ops",
            "restart",
            json!({}),
            json!({"service": "api"}),
        );
        assert_eq!(status, 200);
    }
    server.kill9();
    let server = Server::start_with(start());
    let (status, body) = call(&server, &run, "ops", "gated", json!({}), json!({}));
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&server, &run, "ops", "gated", json!({}), json!({}));
    assert_eq!((status, reason(&body)), (403, "budget_exhausted"), "{body}");
    let (status, body) = call(
        &server,
        &run,
        "ops",
        "restart",
        json!({}),
        json!({"service": "api"}),
    );
    assert_eq!((status, reason(&body)), (429, "rate_limited"), "{body}");
    verify(&server.db());
}

#[test]
fn policy_check_refuses_bad_limits_each_located() {
    let cases = [
        (
            "budget: {max_calls_per_run: 2}",
            "budget: {max_calls_per_run: 0}",
            "budget.max_calls_per_run",
        ),
        (
            "rate: {max: 2, per_s: 1}",
            "rate: {max: 2, per_s: 0}",
            "rate.per_s",
        ),
        (
            "rate: {max: 2, per_s: 1}",
            "rate: {max: 0, per_s: 1}",
            "rate.max",
        ),
        (
            "rate: {max: 2, per_s: 1}",
            "rate: {max: 2, per_s: 1, key: scope.service}",
            "not one of its required scope keys",
        ),
        (
            "rate: {max: 2, per_s: 1}",
            "rate: {max: 2, per_s: 1, key: caller}",
            "is not `run`, `role`",
        ),
        (
            "rate: {max: 2, per_s: 1}",
            "rate: {max: 2, per_s: 1, burst: 3}",
            "burst",
        ),
    ];
    for (from, to, expect) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let start = write_policy(tmp.path(), &TOOLS.replacen(from, to, 1));
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
        assert!(!out.status.success(), "{to}: {text}");
        assert!(text.contains(expect), "{to}: expected `{expect}` in {text}");
        assert!(
            text.contains("tool_registry.yaml:"),
            "{to}: located: {text}"
        );
    }
}

#[test]
fn policy_diff_calls_raising_or_removing_a_limit_widening() {
    let tmp = tempfile::tempdir().unwrap();
    write_policy(&tmp.path().join("old"), TOOLS);
    let cases = [
        (
            "budget: {max_calls_per_run: 2}",
            "budget: {max_calls_per_run: 5}",
            "widening",
        ),
        (
            "budget: {max_calls_per_run: 2}",
            "budget: {max_calls_per_run: 1}",
            "narrowing",
        ),
        ("    budget: {max_calls_per_run: 2}\n", "", "widening"),
        (
            "rate: {max: 2, per_s: 1}",
            "rate: {max: 2, per_s: 10}",
            "narrowing",
        ),
        (
            "rate: {max: 2, per_s: 1}",
            "rate: {max: 20, per_s: 1}",
            "widening",
        ),
    ];
    for (i, (from, to, effect)) in cases.into_iter().enumerate() {
        write_policy(
            &tmp.path().join(format!("new{i}")),
            &TOOLS.replacen(from, to, 1),
        );
        let out = Command::new(BIN)
            .args(["policy", "diff"])
            .arg(tmp.path().join("old"))
            .arg(tmp.path().join(format!("new{i}")))
            .args(["--format", "json"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!(
                "{to}: not json ({e}): {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let changes = report["changes"].as_array().cloned().unwrap_or_default();
        let found = changes.iter().any(|c| {
            c["kind"]
                .as_str()
                .is_some_and(|k| k.ends_with("budget_changed") || k.ends_with("rate_changed"))
                && c["effect"] == effect
        });
        assert!(found, "{to}: expected a {effect} limit change in {report}");
    }
}

#[test]
fn a_call_waiting_for_its_approval_does_not_count_against_the_budget() {
    use crate::approvals::{SUPERVISOR, approval_policy, decide, draft_call, request, send};
    let tmp = tempfile::tempdir().unwrap();
    let mut start = approval_policy(tmp.path(), 1, 600);
    // draft_document: one call per run.
    let text = fs::read_to_string(&start.tools).unwrap();
    let anchor = "    approval: {required: true";
    assert!(text.contains(anchor), "the approval line moved");
    fs::write(
        &start.tools,
        text.replacen(
            anchor,
            &format!("    budget: {{max_calls_per_run: 1}}\n{anchor}"),
            1,
        ),
    )
    .unwrap();
    start.data_dir = Some(tmp.path().join("var"));
    let server = Server::start_with(start);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    // Two different calls ask for approval, one of them twice: nothing executes, so
    // nothing is counted.
    let motion = draft_call(&run, "Motion");
    let id = request(&server, &motion);
    let (code, body) = send(&server, &motion);
    assert_eq!(code, 409, "{body}");
    let brief = draft_call(&run, "Brief");
    let other = request(&server, &brief);
    assert_ne!(id, other);
    let (code, body) = decide(&server, Some(SUPERVISOR), &id, "approve", "checked");
    assert_eq!(code, 200, "{body}");
    let (code, body) = decide(&server, Some(SUPERVISOR), &other, "approve", "checked");
    assert_eq!(code, 200, "{body}");
    let mut approved = motion.clone();
    approved["approval_id"] = json!(id);
    let (code, body) = send(&server, &approved);
    assert_eq!(code, 200, "the budget's one call is still there: {body}");
    // The budget is now used: the other approved call is refused at step 8.
    let mut second = brief.clone();
    second["approval_id"] = json!(other);
    let (code, body) = send(&server, &second);
    assert_eq!((code, reason(&body)), (403, "budget_exhausted"), "{body}");
}
