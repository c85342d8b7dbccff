//! The authorization seams of issue 11 over the real server: the run's scope binds every
//! call (effective scope), CEL conditions on lanes and tools, artifacts that belong to
//! their run, authentication before anything about the policy is revealed, and the run
//! operations for admins (list, re-pin).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::demo::edit;
use common::lab::{lab, sha};
use common::{ADMIN, Server, Start, run, token};
use serde_json::{Value, json};
use sha2::Digest;

/// The audit events of `run` (admin API).
fn events(server: &Server, run: &str) -> Vec<Value> {
    let (code, body) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(code, 200, "{body}");
    body["events"].as_array().unwrap().clone()
}

/// The event the response names.
fn closing_event(server: &Server, run: &str, response: &Value) -> Value {
    let id = response["audit_event_id"].as_str().unwrap();
    events(server, run)
        .into_iter()
        .find(|e| e["event_id"] == id)
        .unwrap_or_else(|| panic!("no event {id}"))
}

/// A GET returning the status and the raw body bytes.
fn get_raw(server: &Server, path: &str, token: Option<&str>) -> (u16, Vec<u8>) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut req = agent.get(format!("{}{}", server.base, path));
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut resp = req.call().unwrap();
    let status = resp.status().as_u16();
    let bytes = resp
        .body_mut()
        .with_config()
        .limit(10 << 20)
        .read_to_vec()
        .unwrap();
    (status, bytes)
}

// ---------------------------------------------------------------------------------------
// Effective scope

#[test]
fn a_sealed_run_denies_a_call_that_leaves_sealed_out() {
    let server = Server::start();
    let sealed = server.create_run(json!({"case_id": "C-1001", "sealed": true}));
    let (code, body) = server.call(
        "research_agent",
        &sealed,
        "research",
        "legal_search",
        json!({"query": "duty"}),
        json!({"case_id": "C-1001"}),
    );
    assert_eq!(code, 403, "{body}");
    let d = &body["diagnostic"];
    assert_eq!(d["reason"], "prohibited_flag");
    assert_eq!(d["failed_step"], 8);
    assert_eq!(d["details"]["flag"], "sealed");
    assert_eq!(d["details"]["source"], "run");
    assert!(
        body["error_message"]
            .as_str()
            .unwrap()
            .contains("run's scope"),
        "{body}"
    );
    // The audit event shows the effective scope and which keys came from the run.
    let event = closing_event(&server, &sealed, &body);
    assert_eq!(event["type"], "tool_denied");
    let trace = &event["details"]["trace"];
    assert_eq!(
        trace["effective_scope"],
        json!({"case_id": "C-1001", "sealed": true})
    );
    assert_eq!(trace["scope_from_run"], json!(["case_id", "sealed"]));
    // The call's own scope is kept as received too.
    assert_eq!(event["details"]["scope"], json!({"case_id": "C-1001"}));

    // Every tool of every lane refuses it, whatever the call's scope says.
    for (role, lane, tool, arguments) in [
        ("research_agent", "research", "case_lookup", json!({})),
        (
            "drafting_agent",
            "drafting",
            "draft_document",
            json!({"title": "t", "body": "b"}),
        ),
        (
            "research_agent",
            "research",
            "read_document",
            json!({"path": "notes.md"}),
        ),
    ] {
        let (code, body) = server.call(role, &sealed, lane, tool, arguments, json!({}));
        assert_eq!(code, 403, "{tool}: {body}");
        assert_eq!(body["diagnostic"]["reason"], "prohibited_flag", "{tool}");
        assert_eq!(body["diagnostic"]["details"]["source"], "run", "{tool}");
    }
}

#[test]
fn a_run_only_key_satisfies_the_lane_and_contradictions_are_refused() {
    let server = Server::start();
    let run_id = server.create_run(json!({"case_id": "C-1001"}));
    // The lane and the tool require case_id; the run has it, the call does not repeat it.
    let (code, body) = server.call(
        "research_agent",
        &run_id,
        "research",
        "case_lookup",
        json!({}),
        json!({}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["output"]["case_id"], "C-1001");
    assert_eq!(body["trace"]["scope_from_run"], json!(["case_id"]));
    // A call may add keys the run does not have.
    let (code, body) = server.call(
        "research_agent",
        &run_id,
        "research",
        "case_lookup",
        json!({}),
        json!({"note": "x"}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body["trace"]["effective_scope"],
        json!({"case_id": "C-1001", "note": "x"})
    );
    // Contradicting the run: another value, null, or false for a run flag.
    let sealed = server.create_run(json!({"case_id": "C-1001", "sealed": true}));
    for (run_id, scope, key) in [
        (&run_id, json!({"case_id": "C-1002"}), "case_id"),
        (&run_id, json!({"case_id": null}), "case_id"),
        (&sealed, json!({"sealed": false}), "sealed"),
    ] {
        let (code, body) = server.call(
            "research_agent",
            run_id,
            "research",
            "legal_search",
            json!({"query": "duty"}),
            scope.clone(),
        );
        assert_eq!(code, 403, "{scope}: {body}");
        let d = &body["diagnostic"];
        assert_eq!(d["reason"], "scope_conflicts_with_run", "{scope}");
        assert_eq!(d["failed_step"], 7);
        assert_eq!(d["details"]["conflicting_keys"], json!([key]));
    }
}

// ---------------------------------------------------------------------------------------
// Conditions

const OPS_ROLES: &str = r#"
version: "ops-1"
roles:
  - role_id: ops_agent
    description: Inspects and remediates services.
    enabled: true
    lanes: [remediate]
    credential: {token_sha256: OPS_SHA}
admins:
  - admin_id: ops
    description: Operator.
    credential: {token_sha256: ADMIN_SHA}
"#;

const OPS_LANES: &str = r#"
version: "ops-1"
lanes:
  - lane_id: remediate
    description: Inspects and restarts the run's service.
    tools: [get_logs]
    required_scope_keys: [service]
    prohibited_flags: [production]
    run_statuses: [active]
    write: false
    conditions:
      - name: same_service
        expr: "args.service == scope.service"
        message: a call acts only on the service its run is for
"#;

const OPS_TOOLS: &str = r#"
version: "ops-1"
tools:
  - tool_name: get_logs
    description: Returns a service's recent log lines (an echo here).
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {timeout_ms_max: 10000, max_output_bytes: 65536, max_concurrency: 4}
    allowed_lanes: [remediate]
    required_scope_keys: []
    prohibited_flags: []
    conditions:
      - name: lines_within_run
        expr: "args.lines <= scope.max_lines"
        message: at most the run's max_lines lines
      - name: hosts_known
        expr: "!has(args.hosts) || args.hosts.all(h, h.startsWith(scope.service + '-'))"
        message: only the service's own hosts
    write_targets: []
    adapter: {kind: builtin, name: echo}
    input_schema:
      type: object
      additionalProperties: false
      required: [service, lines]
      properties:
        service: {type: string}
        lines: {type: integer}
        hosts: {type: array, items: {type: string}}
    output_schema: {type: object}
"#;

/// Writes the DevOps policy into `dir`; returns (policy dir, tools file).
fn ops_policy(dir: &Path, lanes: &str, tools: &str) -> (PathBuf, PathBuf) {
    let policy = dir.join("policy");
    let tools_dir = dir.join("tools");
    fs::create_dir_all(&policy).unwrap();
    fs::create_dir_all(&tools_dir).unwrap();
    fs::write(
        policy.join("roles.yaml"),
        OPS_ROLES
            .replace("OPS_SHA", &sha("ops-token"))
            .replace("ADMIN_SHA", &sha(ADMIN)),
    )
    .unwrap();
    fs::write(policy.join("lanes.yaml"), lanes).unwrap();
    fs::write(tools_dir.join("tool_registry.yaml"), tools).unwrap();
    (policy, tools_dir.join("tool_registry.yaml"))
}

fn ops_call(server: &Server, run: &str, arguments: Value, scope: Value) -> (u16, Value) {
    let body = json!({
        "role_id": "ops_agent", "run_id": run, "lane_id": "remediate", "tool_name": "get_logs",
        "arguments": arguments, "scope": scope,
    });
    server.post("/v1/tool-calls", Some("ops-token"), &body)
}

#[test]
fn conditions_allow_deny_by_name_and_deny_when_they_cannot_be_evaluated() {
    let tmp = tempfile::tempdir().unwrap();
    let (policy_dir, tools) = ops_policy(tmp.path(), OPS_LANES, OPS_TOOLS);
    let server = Server::start_with(Start {
        policy_dir,
        tools,
        ..Start::default()
    });
    let run_id = server.create_run(json!({"service": "checkout", "max_lines": 100}));

    // Allowed: every condition holds; the trace shows each value.
    let (code, body) = ops_call(
        &server,
        &run_id,
        json!({"service": "checkout", "lines": 50, "hosts": ["checkout-1"]}),
        json!({}),
    );
    assert_eq!(code, 200, "{body}");
    let values: Vec<(String, Value)> = body["trace"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c["value"].clone()))
        .collect();
    assert_eq!(
        values,
        [
            ("same_service".to_string(), json!(true)),
            ("lines_within_run".to_string(), json!(true)),
            ("hosts_known".to_string(), json!(true)),
        ]
    );

    // The argument is tied to the run's scope: another service is denied by name.
    let (code, body) = ops_call(
        &server,
        &run_id,
        json!({"service": "payments", "lines": 5}),
        json!({}),
    );
    assert_eq!(code, 403, "{body}");
    let d = &body["diagnostic"];
    assert_eq!(d["reason"], "condition_failed");
    assert_eq!(d["failed_step"], 8);
    assert_eq!(d["details"]["condition"], "same_service");
    assert_eq!(d["details"]["owner"], "lane:remediate");
    assert_eq!(
        d["details"]["condition_message"],
        "a call acts only on the service its run is for"
    );
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .contains("a call acts only on the service its run is for"),
        "{d}"
    );
    // Saying another service in the call's scope is a contradiction, not an escape.
    let (code, body) = ops_call(
        &server,
        &run_id,
        json!({"service": "payments", "lines": 5}),
        json!({"service": "payments"}),
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "scope_conflicts_with_run");

    // A comprehension over the arguments.
    let (code, body) = ops_call(
        &server,
        &run_id,
        json!({"service": "checkout", "lines": 5, "hosts": ["checkout-1", "payments-1"]}),
        json!({}),
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["diagnostic"]["details"]["condition"], "hosts_known");

    // An evaluation error (the run has no max_lines) denies, never allows.
    let no_max = server.create_run(json!({"service": "checkout"}));
    let (code, body) = ops_call(
        &server,
        &no_max,
        json!({"service": "checkout", "lines": 1}),
        json!({}),
    );
    assert_eq!(code, 403, "{body}");
    let d = &body["diagnostic"];
    assert_eq!(d["reason"], "condition_failed");
    assert_eq!(d["details"]["condition"], "lines_within_run");
    assert_eq!(d["details"]["value"], Value::Null);
    assert!(d["details"]["error"].is_string(), "{d}");
    // Nor can the call supply the missing key itself with an overriding value type.
    let (code, body) = ops_call(
        &server,
        &no_max,
        json!({"service": "checkout", "lines": 1}),
        json!({"max_lines": "many"}),
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "condition_failed");
    assert!(body["diagnostic"]["details"]["error"].is_string(), "{body}");

    // A large list cannot make a condition run long: the budget stops it with a denial.
    let hosts: Vec<String> = (0..20_000).map(|i| format!("checkout-{i}")).collect();
    let heavy_tools = OPS_TOOLS.replace(
        "!has(args.hosts) || args.hosts.all(h, h.startsWith(scope.service + '-'))",
        "!has(args.hosts) || args.hosts.all(h, args.hosts.exists(g, g == h))",
    );
    let tmp2 = tempfile::tempdir().unwrap();
    let (policy_dir, tools) = ops_policy(tmp2.path(), OPS_LANES, &heavy_tools);
    let heavy = Server::start_with(Start {
        policy_dir,
        tools,
        ..Start::default()
    });
    let run_id = heavy.create_run(json!({"service": "checkout", "max_lines": 100}));
    let started = std::time::Instant::now();
    let (code, body) = ops_call(
        &heavy,
        &run_id,
        json!({"service": "checkout", "lines": 5, "hosts": hosts}),
        json!({}),
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["diagnostic"]["details"]["condition"], "hosts_known");
    assert!(
        body["diagnostic"]["details"]["error"]
            .as_str()
            .unwrap()
            .contains("budget"),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_run_flag_binds_the_devops_lane_too() {
    let tmp = tempfile::tempdir().unwrap();
    let (policy_dir, tools) = ops_policy(tmp.path(), OPS_LANES, OPS_TOOLS);
    let server = Server::start_with(Start {
        policy_dir,
        tools,
        ..Start::default()
    });
    let run_id =
        server.create_run(json!({"service": "checkout", "max_lines": 100, "production": true}));
    let (code, body) = ops_call(
        &server,
        &run_id,
        json!({"service": "checkout", "lines": 5}),
        json!({}),
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "prohibited_flag");
    assert_eq!(body["diagnostic"]["details"]["flag"], "production");
    assert_eq!(body["diagnostic"]["details"]["source"], "run");
}

/// `toolgate policy check` on the DevOps policy with `lanes` and `tools` as given.
fn check(lanes: &str, tools: &str) -> (i32, String) {
    let tmp = tempfile::tempdir().unwrap();
    let (policy_dir, tools_file) = ops_policy(tmp.path(), lanes, tools);
    let (code, out, err) = run(
        tmp.path(),
        &[
            "policy",
            "check",
            "--policy-dir",
            policy_dir.to_str().unwrap(),
            "--tools",
            tools_file.to_str().unwrap(),
        ],
    );
    (code, format!("{out}{err}"))
}

#[test]
fn a_broken_condition_fails_policy_check_with_its_location() {
    assert_eq!(check(OPS_LANES, OPS_TOOLS).0, 0);
    // The exact column inside a one-line expression: `request` is at 1:17 of the
    // expression, which starts after `expr: "` at column 16 of line 13.
    let (code, report) = check(
        &OPS_LANES.replace(
            "args.service == scope.service",
            "args.service == request.service",
        ),
        OPS_TOOLS,
    );
    assert_eq!(code, 4, "{report}");
    assert!(
        report.contains("policy/lanes.yaml:13:32: error: lane `remediate`: condition `same_service`: unknown variable `request`"),
        "{report}"
    );
    let expr = "expr: \"args.service == scope.service\"";
    let cases = [
        // (lanes, tools, what the report must say)
        (
            OPS_LANES.replace(expr, "expr: \"args.service == \""),
            OPS_TOOLS.to_string(),
            "lanes.yaml:15:",
            "syntax error",
        ),
        (
            OPS_LANES.replace(expr, "expr: \"args.service == request.service\""),
            OPS_TOOLS.to_string(),
            "lanes.yaml:15:",
            "unknown variable `request`",
        ),
        (
            OPS_LANES.replace(expr, "expr: \"args.servce == scope.service\""),
            OPS_TOOLS.to_string(),
            "lanes.yaml:15:",
            "`args.servce`",
        ),
        (
            OPS_LANES.to_string(),
            OPS_TOOLS.replace(
                "args.lines <= scope.max_lines",
                "args.line <= scope.max_lines",
            ),
            "tool_registry.yaml:17:",
            "`args.line`",
        ),
        (
            OPS_LANES.replace(
                expr,
                &format!("expr: \"{}true{}\"", "(".repeat(5000), ")".repeat(5000)),
            ),
            OPS_TOOLS.to_string(),
            "lanes.yaml:15:",
            "bytes long",
        ),
        (
            OPS_LANES.replace(
                expr,
                &format!("expr: \"{}true{}\"", "[".repeat(100), "]".repeat(100)),
            ),
            OPS_TOOLS.to_string(),
            "lanes.yaml:15:",
            "nest",
        ),
        (
            OPS_LANES.replace(
                expr,
                "expr: \"scope.l.all(a, scope.l.all(b, scope.l.all(c, a == b)))\"",
            ),
            OPS_TOOLS.to_string(),
            "lanes.yaml:15:",
            "comprehensions",
        ),
    ];
    for (lanes, tools, location, needle) in cases {
        let location = location_of(location, &lanes, &tools);
        let (code, report) = check(&lanes, &tools);
        assert_eq!(code, 4, "{needle}: {report}");
        assert!(report.contains(&location), "{location} not in {report}");
        assert!(report.contains(needle), "{needle} not in {report}");
        assert!(report.contains("condition"), "{report}");
    }
}

/// `file:line:` of the first `expr:` line that differs from the valid policy.
fn location_of(file: &str, lanes: &str, tools: &str) -> String {
    let (text, valid) = if file.starts_with("lanes") {
        (lanes, OPS_LANES)
    } else {
        (tools, OPS_TOOLS)
    };
    let line = text
        .lines()
        .zip(valid.lines())
        .position(|(a, b)| a != b)
        .unwrap()
        + 1;
    format!(
        "{}:{line}:",
        file.trim_end_matches(|c: char| c == ':' || c.is_ascii_digit())
    )
}

fn demo_into(root: &Path) {
    common::demo::Demo::copy_into(root);
}

#[test]
fn explain_test_and_diff_know_conditions() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    demo_into(root);

    // explain shows each condition with its value, and the effective scope.
    let (code, out, err) = run(
        root,
        &[
            "policy",
            "explain",
            "--role",
            "research_agent",
            "--lane",
            "research",
            "--tool",
            "legal_search",
            "--scope",
            "{}",
            "--run-scope",
            r#"{"case_id": "C-1001"}"#,
            "--arguments",
            r#"{"query": "duty", "limit": 30}"#,
            "--format",
            "json",
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    let explained: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(explained["decision"], "deny");
    assert_eq!(explained["diagnostic"]["reason"], "condition_failed");
    assert_eq!(
        explained["trace"]["conditions"],
        json!([{"name": "limit_ceiling", "owner": "tool:legal_search", "value": false}])
    );
    assert_eq!(explained["trace"]["scope_from_run"], json!(["case_id"]));
    let (_, text, _) = run(
        root,
        &[
            "policy",
            "explain",
            "--role",
            "research_agent",
            "--lane",
            "research",
            "--tool",
            "legal_search",
            "--scope",
            r#"{"case_id": "C-1001"}"#,
            "--arguments",
            r#"{"query": "duty"}"#,
        ],
    );
    assert!(
        text.contains("condition limit_ceiling (tool:legal_search): true"),
        "{text}"
    );

    // policy test asserts the condition by name; naming another fails the case.
    let cases = root.join("cases");
    fs::create_dir_all(&cases).unwrap();
    let case = |condition: &str| {
        format!(
            "tests:\n  - name: ceiling\n    request: {{role: research_agent, lane: research, tool: legal_search, scope: {{case_id: C-1001}}, arguments: {{query: duty, limit: 30}}}}\n    expect: {{decision: deny, reason: condition_failed, step: 8, condition: {condition}}}\n"
        )
    };
    fs::write(cases.join("c.yaml"), case("limit_ceiling")).unwrap();
    let (code, out, err) = run(root, &["policy", "test", "cases"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 passed, 0 failed"), "{out}");
    fs::write(cases.join("c.yaml"), case("case_of_the_run")).unwrap();
    let (code, out, _) = run(root, &["policy", "test", "cases"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("expected condition `case_of_the_run` to deny, got condition `limit_ceiling`"),
        "{out}"
    );
    // The same as JSON, and JSON too when the cases or the policy do not load.
    let json_of = |args: &[&str]| -> (i32, Value) {
        let (code, out, err) = run(root, args);
        let value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}{err}"));
        (code, value)
    };
    let (code, report) = json_of(&["policy", "test", "cases", "--format", "json"]);
    assert_eq!(
        (code, &report["ok"], &report["failed"]),
        (1, &json!(false), &json!(1))
    );
    assert_eq!(report["results"][0]["ok"], false, "{report}");
    fs::write(cases.join("c.yaml"), case("limit_ceiling")).unwrap();
    let (code, report) = json_of(&["policy", "test", "cases", "--format", "json"]);
    assert_eq!(
        (code, &report["ok"], &report["passed"]),
        (0, &json!(true), &json!(1))
    );
    fs::write(cases.join("c.yaml"), "tests:\n  - name: no request\n").unwrap();
    let (code, report) = json_of(&["policy", "test", "cases", "--format", "json"]);
    assert_eq!(code, 4, "{report}");
    assert_eq!(
        (&report["ok"], &report["not_loaded"]),
        (&json!(false), &json!("cases"))
    );
    assert!(
        report["problems"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("c.yaml"),
        "{report}"
    );
    let nowhere: [&[&str]; 2] = [
        &["policy", "test", "cases"],
        &[
            "policy", "explain", "--role", "r", "--lane", "l", "--tool", "t",
        ],
    ];
    for command in nowhere {
        let args = [command, &["--format", "json", "--policy-dir", "nowhere"]].concat();
        let (code, report) = json_of(&args);
        assert_eq!(code, 4, "{report}");
        assert_eq!(report["not_loaded"], "policy", "{report}");
        assert!(
            !report["problems"].as_array().unwrap().is_empty(),
            "{report}"
        );
    }
    fs::write(cases.join("c.yaml"), case("case_of_the_run")).unwrap();

    // policy diff: added narrows, removed and changed widen.
    let (old, new) = (root.join("old"), root.join("new"));
    demo_into(&old);
    demo_into(&new);
    let lanes = new.join("policy/lanes.yaml");
    edit(
        &lanes,
        "    prohibited_flags: [privileged, sealed]\n",
        "    prohibited_flags: [privileged, sealed]\n    conditions:\n      - {name: no_wildcards, expr: \"!has(args.query) || !args.query.contains('*')\", message: no wildcard searches}\n",
    );
    let registry = new.join("tools/tool_registry.yaml");
    edit(&registry, "args.limit <= 20", "args.limit <= 40");
    edit(
        &registry,
        "    conditions:\n      - name: case_of_the_run\n        expr: \"has(run.scope.case_id) && scope.case_id == run.scope.case_id\"\n        message: case_lookup reads only the case its run is bound to; open a run for the case\n",
        "",
    );
    let (code, out, err) = run(root, &["policy", "diff", "old", "new", "--format", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let changes = report["changes"].as_array().unwrap();
    let effect = |kind: &str| -> Vec<String> {
        changes
            .iter()
            .filter(|c| c["kind"] == kind)
            .map(|c| c["effect"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(effect("lane_condition_added"), ["narrowing"], "{out}");
    assert_eq!(effect("tool_condition_changed"), ["widening"], "{out}");
    assert_eq!(effect("tool_condition_removed"), ["widening"], "{out}");
    let (code, out, _) = run(
        root,
        &["policy", "diff", "old", "new", "--fail-on", "widening"],
    );
    assert_eq!(code, 1, "{out}");
}

// ---------------------------------------------------------------------------------------
// Artifacts

#[test]
fn an_artifact_is_served_only_in_its_run_and_every_read_is_audited() {
    let tmp = tempfile::tempdir().unwrap();
    let start = lab(tmp.path());
    // A second role, `outsider`, acting only in another lane.
    let roles = start.policy_dir.join("roles.yaml");
    let text = fs::read_to_string(&roles).unwrap().replace(
        "admins:\n",
        &format!(
            "  - role_id: outsider\n    description: Acts in the side lane only.\n    enabled: true\n    lanes: [side]\n    credential: {{token_sha256: {}}}\nadmins:\n",
            sha("demo-outsider")
        ),
    );
    fs::write(&roles, text).unwrap();
    let lanes = start.policy_dir.join("lanes.yaml");
    let mut text = fs::read_to_string(&lanes).unwrap();
    text.push_str("  - lane_id: side\n    description: Another lane.\n    tools: [echo_cmd]\n    required_scope_keys: []\n    prohibited_flags: []\n    run_statuses: [active]\n    write: false\n");
    fs::write(&lanes, text).unwrap();
    let text = fs::read_to_string(&start.tools).unwrap();
    let at = text.find("tool_name: echo_cmd").unwrap();
    let lane_at = at + text[at..].find("allowed_lanes: [lab]").unwrap();
    let text = format!(
        "{}allowed_lanes: [lab, side]{}",
        &text[..lane_at],
        &text[lane_at + "allowed_lanes: [lab]".len()..]
    );
    fs::write(&start.tools, text).unwrap();
    let server = Server::start_with(start);
    let run_a = server.create_run(json!({}));
    let run_b = server.create_run(json!({}));
    let (code, body) = common::lab::call(&server, &run_a, "big_output", json!({}), json!({}));
    assert_eq!(code, 200, "{body}");
    let sha256 = body["artifact"]["sha256"].as_str().unwrap().to_string();
    let produced_by = body["call_id"].as_str().unwrap().to_string();

    // A caller acting in run B is refused, exactly as for a hash that does not exist.
    let path = |run: &str, sha: &str| format!("/v1/artifacts/{sha}?run_id={run}&role_id=tester");
    let (code, refused) = get_raw(&server, &path(&run_b, &sha256), Some("demo-tester"));
    assert_eq!(code, 404, "{}", String::from_utf8_lossy(&refused));
    let refused: Value = serde_json::from_slice(&refused).unwrap();
    assert_eq!(refused["diagnostic"]["reason"], "artifact_not_found");
    let (code, missing) = get_raw(&server, &path(&run_b, &"0".repeat(64)), Some("demo-tester"));
    assert_eq!(code, 404);
    let missing: Value = serde_json::from_slice(&missing).unwrap();
    assert_eq!(missing["diagnostic"], refused["diagnostic"]);

    // Naming the right run does not help a role that may not act in the artifact's lane.
    let outsider = format!("/v1/artifacts/{sha256}?run_id={run_a}&role_id=outsider");
    let (code, body) = get_raw(&server, &outsider, Some("demo-outsider"));
    assert_eq!(code, 404, "{}", String::from_utf8_lossy(&body));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["diagnostic"], refused["diagnostic"]);

    // Without naming the run, or with a wrong credential, nothing is served either.
    let (code, _) = get_raw(
        &server,
        &format!("/v1/artifacts/{sha256}"),
        Some("demo-tester"),
    );
    assert_eq!(code, 400);
    let (code, _) = get_raw(&server, &path(&run_a, &sha256), Some("wrong"));
    assert_eq!(code, 401);
    let (code, _) = get_raw(&server, &path(&run_a, &sha256), None);
    assert_eq!(code, 401);

    // In run A it is served, byte for byte; an admin may read it too.
    let (code, bytes) = get_raw(&server, &path(&run_a, &sha256), Some("demo-tester"));
    assert_eq!(code, 200);
    assert_eq!(hex::encode(sha2::Sha256::digest(&bytes)), sha256);
    let (code, admin_bytes) = get_raw(&server, &format!("/v1/artifacts/{sha256}"), Some(ADMIN));
    assert_eq!(code, 200);
    assert_eq!(admin_bytes, bytes);

    // The longest run id works as well (owner records are named by its hash).
    let long = "r".repeat(128);
    let (code, body) = server.post(
        "/v1/runs",
        Some(ADMIN),
        &json!({"run_id": long, "scope": {}}),
    );
    assert_eq!(code, 201, "{body}");
    let (code, body) = common::lab::call(&server, &long, "big_output", json!({}), json!({}));
    assert_eq!(code, 200, "{body}");
    let (code, long_bytes) = get_raw(&server, &path(&long, &sha256), Some("demo-tester"));
    assert_eq!(code, 200);
    assert_eq!(long_bytes, bytes);

    // Every read is audited with who read what, allowed or not.
    let (_, all) = server.get(
        "/v1/audit/events?type=artifact_read&limit=1000",
        Some(ADMIN),
    );
    let reads: Vec<(Value, Value, Value, Value)> = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["run_id"].clone(),
                e["details"]["reader"].clone(),
                e["details"]["allowed"].clone(),
                e["reason"].clone(),
            )
        })
        .collect();
    assert_eq!(
        reads,
        [
            (
                json!(run_b),
                json!("role:tester"),
                json!(false),
                json!("artifact_not_found")
            ),
            (
                json!(run_b),
                json!("role:tester"),
                json!(false),
                json!("artifact_not_found")
            ),
            (
                json!(run_a),
                json!("role:outsider"),
                json!(false),
                json!("artifact_not_found")
            ),
            (
                Value::Null,
                json!("unnamed"),
                json!(false),
                json!("request_malformed")
            ),
            (
                json!(run_a),
                json!("unauthenticated"),
                json!(false),
                json!("credential_invalid")
            ),
            (
                json!(run_a),
                json!("unauthenticated"),
                json!(false),
                json!("credential_missing")
            ),
            (json!(run_a), json!("role:tester"), json!(true), Value::Null),
            (Value::Null, json!("admin:ops"), json!(true), Value::Null),
            (json!(long), json!("role:tester"), json!(true), Value::Null),
        ]
    );
    let allowed = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["details"]["allowed"] == true && e["run_id"] == json!(run_a))
        .unwrap();
    assert_eq!(allowed["details"]["sha256"], sha256);
    assert_eq!(allowed["details"]["produced_by"]["call_id"], produced_by);
    assert_eq!(allowed["role_id"], "tester");
}

/// An insider edits a stored artifact in the data directory: its reader gets a refusal
/// (`artifact_store_failed`), never the edited bytes, and the read is audited as such.
#[test]
fn an_artifact_edited_in_the_data_directory_is_refused_and_the_read_audited() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(lab(tmp.path()));
    let run = server.create_run(json!({}));
    let (code, body) = common::lab::call(&server, &run, "big_output", json!({}), json!({}));
    assert_eq!(code, 200, "{body}");
    let sha256 = body["artifact"]["sha256"].as_str().unwrap().to_string();
    let path = format!("/v1/artifacts/{sha256}?run_id={run}&role_id=tester");
    let (code, original) = get_raw(&server, &path, Some("demo-tester"));
    assert_eq!(code, 200);

    let mut edited = original.clone();
    edited[0] ^= 0x20;
    fs::write(server.data_dir.join("artifacts").join(&sha256), &edited).unwrap();
    let (code, body) = get_raw(&server, &path, Some("demo-tester"));
    assert_eq!(code, 500, "{}", String::from_utf8_lossy(&body));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body["diagnostic"]["reason"], "artifact_store_failed",
        "{body}"
    );
    let (_, all) = server.get(
        "/v1/audit/events?type=artifact_read&limit=1000",
        Some(ADMIN),
    );
    let last = all["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["details"]["allowed"], false, "{last}");
    assert_eq!(last["reason"], "artifact_store_failed", "{last}");
}

// ---------------------------------------------------------------------------------------
// Authentication before revealing policy

#[test]
fn unknown_and_known_ids_with_a_bad_credential_get_identical_answers() {
    let server = Server::start();
    let run_id = server.create_run(json!({"case_id": "C-1001"}));
    let call = |role: &str, lane: &str, tool: &str, token: Option<&str>| {
        let body = json!({
            "role_id": role, "run_id": run_id, "lane_id": lane, "tool_name": tool,
            "arguments": {}, "scope": {"case_id": "C-1001"},
        });
        let (code, body) = server.post("/v1/tool-calls", token, &body);
        (code, serde_json::to_vec(&body["diagnostic"]).unwrap())
    };
    for token in [
        Some("not-a-token"),
        Some(token("filing_agent").as_str()),
        None,
    ] {
        let known = call("research_agent", "research", "case_lookup", token);
        for (role, lane, tool) in [
            ("paralegal_bot", "research", "case_lookup"),
            ("research_agent", "appeals", "case_lookup"),
            ("research_agent", "research", "shred_documents"),
            ("paralegal_bot", "appeals", "shred_documents"),
        ] {
            let unknown = call(role, lane, tool, token);
            assert_eq!(
                unknown,
                known,
                "{role}/{lane}/{tool} with {token:?}: {} vs {}",
                String::from_utf8_lossy(&unknown.1),
                String::from_utf8_lossy(&known.1)
            );
        }
        let reason: Value = serde_json::from_slice(&known.1).unwrap();
        let expected = if token.is_some() {
            "credential_invalid"
        } else {
            "credential_missing"
        };
        assert_eq!(reason["reason"], expected);
        assert_eq!(reason["failed_step"], 2);
    }
    // A caller that proves its role sees the conditions its calls must satisfy.
    let (code, body) = server.get(
        "/v1/tools?role_id=research_agent&lane_id=research",
        Some(&token("research_agent")),
    );
    assert_eq!(code, 200, "{body}");
    let search = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tool_name"] == "legal_search")
        .unwrap();
    assert_eq!(search["conditions"][0]["name"], "limit_ceiling");
    assert_eq!(search["conditions"][0]["expr"], "args.limit <= 20");
    // The catalog answers whole bodies byte for byte alike.
    let catalog = |role: &str, lane: &str, token: Option<&str>| {
        get_raw(
            &server,
            &format!("/v1/tools?role_id={role}&lane_id={lane}"),
            token,
        )
    };
    for token in [Some("not-a-token"), None] {
        let known = catalog("research_agent", "research", token);
        assert_eq!(catalog("paralegal_bot", "research", token), known);
        assert_eq!(catalog("research_agent", "appeals", token), known);
        assert_ne!(known.0, 200);
    }
}

// ---------------------------------------------------------------------------------------
// Runs for operators

#[test]
fn admins_list_runs_by_status_in_pages() {
    let server = Server::start();
    let mut ids: Vec<String> = (0..5)
        .map(|i| {
            let (code, body) = server.post(
                "/v1/runs",
                Some(ADMIN),
                &json!({"run_id": format!("run-{i}"), "scope": {"case_id": "C-1001"}}),
            );
            assert_eq!(code, 201, "{body}");
            body["run_id"].as_str().unwrap().to_string()
        })
        .collect();
    ids.sort();
    for id in ["run-1", "run-3"] {
        let (code, _) = server.post(
            &format!("/v1/runs/{id}/status"),
            Some(ADMIN),
            &json!({"status": "closed"}),
        );
        assert_eq!(code, 200);
    }
    // Paged: two at a time, following the cursor.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/runs?limit=2&cursor={c}"),
            None => "/v1/runs?limit=2".to_string(),
        };
        let (code, page) = server.get(&path, Some(ADMIN));
        assert_eq!(code, 200, "{page}");
        let runs = page["runs"].as_array().unwrap();
        assert!(runs.len() <= 2);
        seen.extend(
            runs.iter()
                .map(|r| r["run_id"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(seen.len() <= 5, "the pages never end: {seen:?}");
    }
    assert_eq!(seen, ids);
    // Filtered by status.
    let (code, page) = server.get("/v1/runs?status=closed", Some(ADMIN));
    assert_eq!(code, 200);
    let closed: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(closed, ["run-1", "run-3"]);
    // Admins only; bad parameters are structured refusals.
    let (code, body) = server.get("/v1/runs", Some(&token("supervisor")));
    assert_eq!(code, 401, "{body}");
    for bad in [
        "/v1/runs?status=open",
        "/v1/runs?limit=0",
        "/v1/runs?limit=x",
    ] {
        let (code, body) = server.get(bad, Some(ADMIN));
        assert_eq!(code, 400, "{bad}: {body}");
        assert_eq!(body["diagnostic"]["reason"], "request_malformed");
    }
}

#[test]
fn an_admin_repins_an_open_run_to_the_current_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("var");
    let policy = tmp.path().join("p");
    demo_into(&policy);
    let start = || Start {
        policy_dir: policy.join("policy"),
        tools: policy.join("tools/tool_registry.yaml"),
        data_dir: Some(data_dir.clone()),
        ..Start::default()
    };
    let server = Server::start_with(start());
    let open = server.create_run(json!({"case_id": "C-1001"}));
    let closed = server.create_run(json!({"case_id": "C-1001"}));
    let (code, _) = server.post(
        &format!("/v1/runs/{closed}/status"),
        Some(ADMIN),
        &json!({"status": "closed"}),
    );
    assert_eq!(code, 200);
    assert!(server.stop().success());

    // A reviewed change: the run is now pinned to other versions than the loaded ones.
    edit(
        &policy.join("tools/tool_registry.yaml"),
        "args.limit <= 20",
        "args.limit <= 25",
    );
    let server = Server::start_with(start());
    let search = |server: &Server| {
        server.call(
            "research_agent",
            &open,
            "research",
            "legal_search",
            json!({"query": "duty", "limit": 25}),
            json!({}),
        )
    };
    let (code, body) = search(&server);
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "policy_version_mismatch");

    // Not for roles; not for closed runs; not for runs that do not exist.
    let (code, _) = server.post(
        &format!("/v1/runs/{open}/repin"),
        Some(&token("supervisor")),
        &json!({}),
    );
    assert_eq!(code, 401);
    let (code, body) = server.post(&format!("/v1/runs/{closed}/repin"), Some(ADMIN), &json!({}));
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "run_not_active");
    let (code, _) = server.post("/v1/runs/nope/repin", Some(ADMIN), &json!({}));
    assert_eq!(code, 403);

    let (code, body) = server.post(&format!("/v1/runs/{open}/repin"), Some(ADMIN), &json!({}));
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["repinned"], true);
    assert_eq!(
        body["scope_check"]["usable_lanes"],
        json!(["drafting", "filing", "intake", "research"])
    );
    let (code, body) = search(&server);
    assert_eq!(code, 200, "{body}");
    // Audited, and it survives a restart (rebuilt from the log).
    let repinned: Vec<Value> = events(&server, &open)
        .into_iter()
        .filter(|e| e["type"] == "run_repinned")
        .collect();
    assert_eq!(repinned.len(), 1);
    assert_eq!(repinned[0]["details"]["by"], "ops");
    assert_ne!(repinned[0]["details"]["from"], repinned[0]["details"]["to"]);
    // A second re-pin changes nothing and records nothing.
    let (code, body) = server.post(&format!("/v1/runs/{open}/repin"), Some(ADMIN), &json!({}));
    assert_eq!(code, 200);
    assert_eq!(body["repinned"], false);
    assert!(server.stop().success());
    let server = Server::start_with(start());
    let (code, body) = search(&server);
    assert_eq!(code, 200, "{body}");
    // The sealed-run report: a sealed run's scope blocks every tool in every lane.
    let sealed = server.create_run(json!({"case_id": "C-1001", "sealed": true}));
    let (code, body) = server.post(&format!("/v1/runs/{sealed}/repin"), Some(ADMIN), &json!({}));
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["scope_check"]["usable_lanes"], json!([]));
    assert_eq!(
        body["scope_check"]["blocked"]["research"]["case_lookup"],
        json!(["sealed"])
    );
}
