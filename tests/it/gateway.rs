//! The gateway over real HTTP: every outcome and denial of the pipeline, driven by the
//! golden examples in contract/examples/, and the API around it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::demo::Demo;
use common::golden::{self, Example};
use common::{ADMIN, Server, Start, assert_subset, repo, token};
use rstest::rstest;
use serde_json::{Value, json};

/// Replaces `$RUN` and `$DRAFT` placeholders in a golden request.
fn substitute(value: &Value, run: &str, draft: &str) -> Value {
    match value {
        Value::String(s) if s == "$RUN" => json!(run),
        Value::String(s) if s == "$DRAFT" => json!(draft),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), substitute(v, run, draft)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|v| substitute(v, run, draft)).collect()),
        other => other.clone(),
    }
}

/// Copies the demo policy to `dir` with the lanes file's version changed.
fn other_policy(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let demo = Demo::copy_into(dir);
    demo.edit(
        "policy/lanes.yaml",
        "\nversion: \"",
        "\nversion: \"0.0.1-other-",
    );
    (demo.policy, demo.registry)
}

/// Sends a golden request (an empty token sends no Authorization header).
fn send(server: &Server, request: &golden::Request, run: &str, draft: &str) -> (u16, Value) {
    let body = substitute(&request.body, run, draft);
    let token = Some(request.token.as_str()).filter(|t| !t.is_empty());
    server.post("/v1/tool-calls", token, &body)
}

/// The run `$RUN` of an example: created under another policy version by a first server
/// on `data_dir` when the example asks for it.
fn example_run(example: &Example, tmp: &Path, data_dir: &Path) -> Option<String> {
    if !example.setup.run_under_other_policy {
        return None;
    }
    let (other_dir, other_tools) = other_policy(tmp);
    let old = Server::start_with(Start {
        policy_dir: other_dir,
        tools: other_tools,
        data_dir: Some(data_dir.to_path_buf()),
        ..Start::default()
    });
    let run = old.create_run(Value::Object(example.setup.run_scope.clone()));
    assert!(old.stop().success());
    Some(run)
}

/// The closing audit event type an outcome must leave.
fn closing_type(example: &Example) -> &'static str {
    match (example.status(), example.dry_run()) {
        ("success", true) => "tool_allowed",
        ("success", false) => "tool_executed",
        ("denied", _) => "tool_denied",
        ("failed", _)
            if example
                .diagnostic()
                .is_some_and(|d| d["reason"] == "tool_timeout") =>
        {
            "tool_timeout"
        }
        ("failed", _) => "tool_failed",
        (other, _) => panic!("{}: unknown status {other}", example.description),
    }
}

const CLOSING_TYPES: [&str; 5] = [
    "tool_allowed",
    "tool_executed",
    "tool_denied",
    "tool_failed",
    "tool_timeout",
];

/// One test per golden example (rstest's `#[files]`; the name contains the file's):
/// the example holds over HTTP against a server of its own, and the call leaves exactly
/// one closing audit event, read back from the server's log, that agrees with the
/// answer (type, reason, failed step, error code).
#[rstest]
fn golden_example_holds_over_http(#[files("contract/examples/*.json")] file: PathBuf) {
    let name = file.file_stem().unwrap().to_string_lossy().to_string();
    let example = Example::read(&file);
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("var");
    let old_run = example_run(&example, tmp.path(), &data_dir);
    let server = Server::start_with(Start {
        data_dir: Some(data_dir),
        ..Start::default()
    });
    let setup = &example.setup;
    let run = old_run.unwrap_or_else(|| server.create_run(Value::Object(setup.run_scope.clone())));
    if let Some(status) = &setup.run_status {
        let (code, body) = server.post(
            &format!("/v1/runs/{run}/status"),
            Some(ADMIN),
            &json!({"status": status}),
        );
        assert_eq!(code, 200, "{name}: {body}");
    }
    let mut draft = String::new();
    for before in &setup.before {
        let (code, body) = send(&server, before, &run, "");
        assert_eq!(code, 200, "{name}: setup call failed: {body}");
        if let Some(id) = body["output"]["draft_id"].as_str() {
            draft = id.to_string();
        }
    }
    if setup.safety_lock {
        let (code, _) = server.post(
            "/v1/safety-lock",
            Some(ADMIN),
            &json!({"engaged": true, "reason": "drill"}),
        );
        assert_eq!(code, 200);
    }
    let mut request = golden::Request {
        token: example.request.token.clone(),
        body: example.request.body.clone(),
    };
    if let Some(approver) = &setup.approved_by {
        let (code, body) = send(&server, &request, &run, &draft);
        assert_eq!(code, 409, "{name}: {body}");
        let id = body["diagnostic"]["details"]["approval_id"]
            .as_str()
            .unwrap();
        let (code, decided) = server.post(
            &format!("/v1/approvals/{id}/decision"),
            Some(approver),
            &json!({"decision": "approve", "reason": "golden example"}),
        );
        assert_eq!(code, 200, "{name}: {decided}");
        request.body["approval_id"] = json!(id);
    }
    let (code, body) = send(&server, &request, &run, &draft);
    if setup.safety_lock {
        let (code, _) = server.post("/v1/safety-lock", Some(ADMIN), &json!({"engaged": false}));
        assert_eq!(code, 200);
    }
    assert_eq!(code, example.response.http_status, "{name}: {body}");
    assert_subset(&example.response.body, &body, &name);
    // Every response names its closing audit event and carries the trace.
    let event_id = body["audit_event_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{name}: {body}"));
    let call_id = body["call_id"].as_str().unwrap();
    assert!(call_id.starts_with("call-"), "{name}");
    if body["status"] != "success" {
        let d = &body["diagnostic"];
        for field in [
            "error_code",
            "category",
            "message",
            "likely_cause",
            "suggested_fix",
            "retryable",
            "severity",
            "reason",
            "failed_step",
        ] {
            assert!(
                !d[field].is_null(),
                "{name}: diagnostic.{field} missing: {body}"
            );
        }
        let trace_failed = body["trace"]["failed"].as_str().unwrap();
        assert_eq!(
            trace_failed,
            format!("{}:{}", d["failed_step"], d["reason"].as_str().unwrap()),
            "{name}"
        );
    }

    // The closing audit event, read from the real server's log.
    let (code, events) = server.get("/v1/audit/events?limit=1000", Some(ADMIN));
    assert_eq!(code, 200, "{events}");
    let of_call: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call_id"] == call_id)
        .collect();
    let closing: Vec<&&Value> = of_call
        .iter()
        .filter(|e| CLOSING_TYPES.contains(&e["type"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(closing.len(), 1, "{name}: closing events {of_call:#?}");
    let event = closing[0];
    assert_eq!(event["event_id"], event_id, "{name}: {event}");
    assert_eq!(
        of_call.last().map(|e| &e["event_id"]),
        Some(&event["event_id"]),
        "{name}: the closing event is not the call's last"
    );
    assert_eq!(event["type"], closing_type(&example), "{name}: {event}");
    match example.diagnostic() {
        Some(expected) => {
            let d = &body["diagnostic"];
            assert_eq!(event["reason"], expected["reason"], "{name}: {event}");
            assert_eq!(event["reason"], d["reason"], "{name}: {event}");
            assert_eq!(event["failed_step"], d["failed_step"], "{name}: {event}");
            assert_eq!(event["error_code"], d["error_code"], "{name}: {event}");
        }
        None => {
            for field in ["reason", "failed_step", "error_code"] {
                assert!(event.get(field).is_none(), "{name}: {field} on {event}");
            }
        }
    }
}

#[test]
fn golden_examples_are_all_there_and_typed() {
    let mut count = 0;
    for entry in fs::read_dir(repo().join("contract/examples")).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(
            path.extension().and_then(|e| e.to_str()),
            Some("json"),
            "{}: every file in contract/examples/ is a golden example (.json)",
            path.display()
        );
        Example::read(&path);
        count += 1;
    }
    assert!(count >= 20, "expected the golden examples, found {count}");
}

/// A typo in a key of an example fails instead of being ignored.
#[test]
fn a_typo_in_a_golden_setup_key_is_refused() {
    let good = json!({
        "description": "d",
        "setup": {"run_scope": {"case_id": "C-1"}, "safety_lock": true},
        "request": {"token": "", "body": {}},
        "response": {"http_status": 200, "body": {}},
    });
    assert!(serde_json::from_value::<Example>(good.clone()).is_ok());
    for (pointer, key) in [
        ("/setup", "safety_lok"),
        ("/setup", "run_stauts"),
        ("/request", "tokn"),
        ("/response", "http_staus"),
        ("", "descripton"),
    ] {
        let mut bad = good.clone();
        bad.pointer_mut(pointer)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert(key.to_string(), json!(true));
        assert!(
            serde_json::from_value::<Example>(bad.clone()).is_err(),
            "accepted {bad}"
        );
    }
}

#[test]
fn invalid_arguments_list_every_violation_with_its_pointer() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, body) = server.call(
        "research_agent",
        &run,
        "research",
        "legal_search",
        json!({"query": "", "limit": 500, "extra": true}),
        json!({"case_id": "C-1001"}),
    );
    assert_eq!(code, 400, "{body}");
    let violations = body["diagnostic"]["details"]["violations"]
        .as_array()
        .unwrap();
    let pointers: Vec<&str> = violations
        .iter()
        .map(|v| v["pointer"].as_str().unwrap())
        .collect();
    assert!(pointers.contains(&"/query"), "{pointers:?}");
    assert!(pointers.contains(&"/limit"), "{pointers:?}");
    assert!(violations.len() >= 3, "{violations:?}");
}

#[test]
fn a_research_call_executes_real_work_and_is_audited() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, body) = server.call(
        "research_agent",
        &run,
        "research",
        "legal_search",
        json!({"query": "duty", "limit": 3}),
        json!({"case_id": "C-1001"}),
    );
    assert_eq!(code, 200, "{body}");
    let results = body["output"]["results"].as_array().unwrap();
    assert!(!results.is_empty() && results.len() <= 3, "{body}");
    for r in results {
        assert!(r["text"].as_str().unwrap().to_lowercase().contains("duty"));
    }
    // The audit log has the request (before execution) and the closing event.
    let (code, events) = server.get(&format!("/v1/audit/events?run_id={run}"), Some(ADMIN));
    assert_eq!(code, 200, "{events}");
    let types: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["run_created", "tool_requested", "tool_executed"],
        "{events}"
    );
    let closing = &events["events"][2];
    assert_eq!(closing["event_id"], body["audit_event_id"]);
    assert_eq!(closing["call_id"], body["call_id"]);
    assert!(closing["output_hash_sha256"].as_str().unwrap().len() == 64);
    assert!(closing["arguments_hash_sha256"].as_str().unwrap().len() == 64);
    // Operators only: a role's token cannot read the audit log.
    let (code, _) = server.get("/v1/audit/events", Some(&token("research_agent")));
    assert_eq!(code, 401);
}

#[test]
fn idempotent_repeat_returns_the_first_outcome_without_executing_again() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let body = json!({
        "role_id": "drafting_agent", "run_id": run, "lane_id": "drafting", "tool_name": "draft_document",
        "arguments": {"title": "Motion to dismiss", "body": "Comes now the defendant."},
        "scope": {"case_id": "C-1001"}, "idempotency_key": "draft-1",
    });
    let t = token("drafting_agent");
    let (c1, first) = server.post("/v1/tool-calls", Some(&t), &body);
    let (c2, second) = server.post("/v1/tool-calls", Some(&t), &body);
    assert_eq!((c1, c2), (200, 200), "{first} {second}");
    assert_eq!(second["replay_of"], first["call_id"]);
    assert_ne!(first["call_id"], second["call_id"]);
    assert_eq!(first["output"], second["output"]);
    assert_eq!(second["replayed"], true);
    // Executed once: one tool_requested for the run.
    let (_, events) = server.get(
        &format!("/v1/audit/events?run_id={run}&type=tool_requested"),
        Some(ADMIN),
    );
    assert_eq!(events["events"].as_array().unwrap().len(), 1, "{events}");
    // The draft really exists in the data directory.
    let path = server
        .data_dir
        .join(first["output"]["path"].as_str().unwrap());
    assert!(path.exists(), "{path:?}");
    // Same key, other arguments: 409.
    let mut other = body.clone();
    other["arguments"]["body"] = json!("Something else.");
    let (c3, conflict) = server.post("/v1/tool-calls", Some(&t), &other);
    assert_eq!(c3, 409, "{conflict}");
    assert_eq!(conflict["diagnostic"]["reason"], "idempotency_conflict");
}

#[test]
fn runs_lifecycle_and_admin_endpoints() {
    let server = Server::start();
    // Admin only.
    let (code, body) = server.post("/v1/runs", Some(&token("research_agent")), &json!({}));
    assert_eq!(code, 401, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "credential_invalid");
    let (code, run) = server.post(
        "/v1/runs",
        Some(ADMIN),
        &json!({"run_id": "run-42", "scope": {"case_id": "C-1001"}}),
    );
    assert_eq!(code, 201, "{run}");
    assert_eq!(run["status"], "active");
    assert_eq!(
        run["policy_versions"]["roles"]["sha256"]
            .as_str()
            .unwrap()
            .len(),
        64
    );
    let (code, again) = server.post("/v1/runs", Some(ADMIN), &json!({"run_id": "run-42"}));
    assert_eq!(code, 400, "{again}");
    let (code, got) = server.get("/v1/runs/run-42", Some(&token("research_agent")));
    assert_eq!((code, &got["scope"]), (200, &json!({"case_id": "C-1001"})));
    let (code, closed) = server.post(
        "/v1/runs/run-42/status",
        Some(ADMIN),
        &json!({"status": "closed"}),
    );
    assert_eq!((code, &closed["status"]), (200, &json!("closed")));
    let (code, reopen) = server.post(
        "/v1/runs/run-42/status",
        Some(ADMIN),
        &json!({"status": "active"}),
    );
    assert_eq!(code, 403, "closed is final: {reopen}");
    let (code, bad) = server.post(
        "/v1/runs/run-42/status",
        Some(ADMIN),
        &json!({"status": "paused"}),
    );
    assert_eq!(code, 400, "{bad}");
}

#[test]
fn runs_and_the_safety_lock_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("var");
    let server = Server::start_with(Start {
        data_dir: Some(data_dir.clone()),
        ..Start::default()
    });
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, _) = server.post(
        "/v1/safety-lock",
        Some(ADMIN),
        &json!({"engaged": true, "reason": "incident 7"}),
    );
    assert_eq!(code, 200);
    assert!(server.stop().success());

    let server = Server::start_with(Start {
        data_dir: Some(data_dir),
        ..Start::default()
    });
    let (code, got) = server.get(&format!("/v1/runs/{run}"), Some(ADMIN));
    assert_eq!(code, 200, "{got}");
    let (code, body) = server.look_up_case(&run);
    assert_eq!(code, 403, "the lock must still be engaged: {body}");
    assert_eq!(body["diagnostic"]["reason"], "safety_lock_engaged");
    assert_eq!(body["diagnostic"]["details"]["lock_reason"], "incident 7");
    server.post("/v1/safety-lock", Some(ADMIN), &json!({"engaged": false}));
    let (code, body) = server.look_up_case(&run);
    assert_eq!(code, 200, "{body}");
}

#[test]
fn tool_catalog_lists_only_what_the_caller_may_use() {
    let server = Server::start();
    let (code, catalog) = server.get(
        "/v1/tools?role_id=research_agent&lane_id=research",
        Some(&token("research_agent")),
    );
    assert_eq!(code, 200, "{catalog}");
    let names: Vec<&str> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["case_lookup", "legal_search", "read_document"],
        "disabled tools are not listed"
    );
    let first = &catalog["tools"][0];
    assert!(first["input_schema"].is_object() && first["output_schema"].is_object());
    assert!(first["prompt"].as_str().unwrap().contains("case_lookup"));
    let (code, denied) = server.get(
        "/v1/tools?role_id=research_agent&lane_id=filing",
        Some(&token("research_agent")),
    );
    assert_eq!(code, 403, "{denied}");
    assert_eq!(denied["diagnostic"]["reason"], "lane_not_allowed_for_role");
}

#[test]
fn every_malformed_input_gets_a_structured_answer() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let t = token("research_agent");
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("not json", b"hello".to_vec(), 400),
        ("not utf-8", vec![0xff, 0xfe, 0x00, 0x80], 400),
        ("empty", Vec::new(), 400),
        ("array", b"[1,2]".to_vec(), 400),
        ("nested 10000 deep", deep.into_bytes(), 400),
        ("too large", vec![b' '; 2 * 1024 * 1024], 413),
    ];
    for (name, body, expected) in cases {
        let (code, resp) = server.post_raw("/v1/tool-calls", Some(&t), &body);
        assert_eq!(code, expected, "{name}: {resp}");
        assert!(resp["diagnostic"]["reason"].is_string(), "{name}: {resp}");
        assert!(
            resp["audit_event_id"].is_string(),
            "{name}: refusals are audited too: {resp}"
        );
    }
    // Hostile arguments: traversal, shell metacharacters, absolute paths, NUL.
    for path in [
        "../../../../etc/passwd",
        "/etc/passwd",
        "notes.md; rm -rf /",
        "notes.md\u{0}",
        "..\\..\\x",
        "$(reboot)",
    ] {
        let (code, resp) = server.call(
            "research_agent",
            &run,
            "research",
            "read_document",
            json!({"path": path}),
            json!({"case_id": "C-1001"}),
        );
        assert!(code == 400 || code == 500, "{path}: {code} {resp}");
        assert!(resp["diagnostic"]["reason"].is_string(), "{path}: {resp}");
        assert!(resp["output"].is_null(), "{path}: {resp}");
    }
    // Unknown endpoint and wrong method.
    let (code, resp) = server.get("/v1/nothing-here", None);
    assert_eq!(
        (code, &resp["diagnostic"]["reason"]),
        (404, &json!("endpoint_not_found"))
    );
    let (code, resp) = server.get("/v1/tool-calls", None);
    assert_eq!(code, 405, "{resp}");
    assert_eq!(resp["diagnostic"]["reason"], "method_not_allowed");
    // The server is still healthy.
    let (code, _) = server.get("/healthz", None);
    assert_eq!(code, 200);
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, _) = server.look_up_case(&run);
    assert_eq!(code, 200);
    let status = server.stop();
    assert!(status.success(), "{status:?}");
}

/// The server's threads named `toolgate-http-*`, by name, with the nanoseconds each
/// has run (`/proc/<pid>/task/<tid>/schedstat`).
fn connection_threads(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut threads = std::collections::BTreeMap::new();
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let name = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let name = name.trim();
        if name.starts_with("toolgate-http-") {
            let stat = fs::read_to_string(task.path().join("schedstat")).unwrap();
            let ran: u64 = stat.split_whitespace().next().unwrap().parse().unwrap();
            threads.insert(name.to_string(), ran);
        }
    }
    threads
}

#[test]
fn connections_spread_over_the_connection_threads_and_each_serves_calls() {
    let server = Server::start_with(Start {
        args: vec!["--connection-threads".into(), "3".into()],
        ..Start::default()
    });
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let before = connection_threads(server.pid());
    let names: Vec<&str> = before.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["toolgate-http-0", "toolgate-http-1", "toolgate-http-2"]
    );

    // Three keep-alive connections, open together: one on each thread.
    let agents: Vec<ureq::Agent> = (0..3)
        .map(|_| {
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_idle_connections_per_host(1)
                .build()
                .into()
        })
        .collect();
    let body = json!({
        "role_id": "research_agent", "run_id": run, "lane_id": "research",
        "tool_name": "case_lookup", "arguments": {}, "scope": {"case_id": "C-1001"},
    })
    .to_string();
    for _ in 0..40 {
        for agent in &agents {
            let mut response = agent
                .post(format!("{}/v1/tool-calls", server.base))
                .header(
                    "Authorization",
                    &format!("Bearer {}", token("research_agent")),
                )
                .header("Content-Type", "application/json")
                .send(&body)
                .unwrap();
            assert_eq!(response.status().as_u16(), 200);
            let answer: Value =
                serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap();
            assert_eq!(answer["status"], "success", "{answer}");
        }
    }
    // Every thread ran: each had a connection's 40 calls to serve.
    let after = connection_threads(server.pid());
    for (name, ran) in &after {
        assert!(
            *ran > before[name],
            "{name} did not run: {before:?} {after:?}"
        );
    }
    // And every call was recorded, once.
    let (_, events) = server.get(
        &format!("/v1/audit/events?run_id={run}&type=tool_executed&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(events["events"].as_array().unwrap().len(), 120, "{events}");
}

#[test]
fn shared_connection_threads_serve_on_the_main_runtime() {
    let server = Server::start_with(Start {
        args: vec!["--connection-threads".into(), "shared".into()],
        ..Start::default()
    });
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, body) = server.look_up_case(&run);
    assert_eq!(code, 200, "{body}");
    assert!(connection_threads(server.pid()).is_empty());
}

/// Voluntary context switches of the server's `audit-writer` thread
/// (`/proc/<pid>/task/<tid>/status`): each time it parked and was woken again.
fn audit_writer_switches(pid: u32) -> u64 {
    let mut switches = None;
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let name = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if name.trim() == "audit-writer" {
            let status = fs::read_to_string(task.path().join("status")).unwrap();
            let line = status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .unwrap();
            assert!(switches.is_none(), "two audit-writer threads");
            switches = Some(line.trim().parse().unwrap());
        }
    }
    switches.expect("no audit-writer thread")
}

/// One client's calls, one after another: with NORMAL durability the appending thread
/// commits each event itself (the log is quiet), so the writer thread is not woken for
/// them; with FULL (a commit waits for the disk) every commit is handed to it. Either
/// way every call is recorded once and the log verifies.
#[test]
fn a_quiet_log_commits_on_the_calling_thread_only_with_normal_durability() {
    const CALLS: u64 = 60;
    for (durability, quiet) in [("normal", true), ("full", false)] {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start_with(Start {
            args: vec!["--durability".into(), durability.into()],
            data_dir: Some(dir.path().to_path_buf()),
            ..Start::default()
        });
        let run = server.create_run(json!({"case_id": "C-1001"}));
        let before = audit_writer_switches(server.pid());
        for _ in 0..CALLS {
            let (code, body) = server.look_up_case(&run);
            assert_eq!(code, 200, "{body}");
        }
        let woken = audit_writer_switches(server.pid()) - before;
        if quiet {
            // Timed checkpoints and WAL upkeep may still wake it a few times.
            assert!(woken < CALLS / 4, "{durability}: woken {woken} times");
        } else {
            // Two commits per call, each handed over (and each fsync a wait of its
            // own); at least one wake-up per call even if a second request sometimes
            // arrives before the writer parks.
            assert!(woken >= CALLS, "{durability}: woken {woken} times");
        }
        let (_, events) = server.get(
            &format!("/v1/audit/events?run_id={run}&type=tool_executed&limit=1000"),
            Some(ADMIN),
        );
        assert_eq!(
            events["events"].as_array().unwrap().len() as u64,
            CALLS,
            "{durability}"
        );
        let db = server.db();
        assert!(server.stop().success());
        let verified = std::process::Command::new(common::BIN)
            .args(["audit", "verify", "--db"])
            .arg(&db)
            .output()
            .unwrap();
        assert!(verified.status.success(), "{durability}: {verified:?}");
    }
}
