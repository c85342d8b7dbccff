//! The MCP front (`/mcp`) driven by a real MCP client nobody on this project wrote (the
//! official Python SDK, installed by the test setup), plus raw JSON-RPC requests for
//! the protocol details a client library hides, and the audit log compared with the
//! HTTP API's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::mcp_support as support;

use std::process::Command;
use std::time::Duration;

use common::{ADMIN, Server, Start, token};
use serde_json::{Value, json};

/// The five headers of an MCP request as `role` in `lane` on `run` with `scope`.
fn headers(role: &str, run: &str, lane: &str, scope: &Value) -> Value {
    json!({
        "Authorization": format!("Bearer {}", token(role)),
        "X-Toolgate-Role": role,
        "X-Toolgate-Run": run,
        "X-Toolgate-Lane": lane,
        "X-Toolgate-Scope": scope.to_string(),
    })
}

/// Runs tests/mcp/client.py (the Python SDK's client) with `plan`; returns what it saw.
fn python_client(server: &Server, mode: &str, headers: Value, calls: Value) -> Value {
    let plan = json!({
        "url": format!("{}/mcp", server.base),
        "mode": mode,
        "headers": headers,
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

fn tool_names(seen: &Value) -> Vec<String> {
    let mut names: Vec<String> = seen["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {seen}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// The calls every client test makes as research_agent in the research lane.
fn research_calls() -> Value {
    json!([
        {"name": "case_lookup", "arguments": {}},
        {"name": "read_document", "arguments": {"path": "privileged/strategy.md"}},
        {"name": "draft_document", "arguments": {"title": "t", "body": "b"}},
        {"name": "no_such_tool", "arguments": {}},
    ])
}

fn check_research_session(seen: &Value, expected_version: &str) {
    assert!(seen.get("connect_error").is_none(), "{seen}");
    assert_eq!(seen["protocol_version"], expected_version, "{seen}");
    // Only what research_agent may use in the research lane (disabled_tool is off).
    assert_eq!(
        tool_names(seen),
        ["case_lookup", "legal_search", "read_document"]
    );
    let case_lookup = seen["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "case_lookup")
        .unwrap();
    assert_eq!(case_lookup["inputSchema"]["type"], "object");
    assert_eq!(case_lookup["outputSchema"]["type"], "object");
    let calls = seen["calls"].as_array().unwrap();

    // An allowed call: structured output (the client checked it against outputSchema).
    assert_eq!(calls[0]["isError"], false, "{}", calls[0]);
    assert_eq!(calls[0]["structuredContent"]["case_id"], "C-1001");
    assert!(calls[0]["meta"]["io.toolgate/audit_event_id"].is_string());

    // A forbidden one: a tool result with isError and the diagnostic.
    let denied = &calls[1];
    assert_eq!(denied["isError"], true, "{denied}");
    // Never a structuredContent that the outputSchema would reject: the diagnostic is
    // in `_meta` and in the text.
    assert!(denied["structuredContent"].is_null(), "{denied}");
    let d = &denied["meta"]["io.toolgate/diagnostic"];
    assert_eq!(d["reason"], "prohibited_flag", "{d}");
    assert_eq!(d["status"], "denied");
    assert_eq!(d["error_code"], "TOOL_DENIED");
    assert_eq!(d["failed_step"], 8);
    assert_eq!(d["details"]["flag"], "privileged");
    assert!(d["call_id"].as_str().unwrap().starts_with("call-"));
    assert!(d["audit_event_id"].is_string());
    assert!(d["suggested_fix"].is_string());
    // The same diagnostic as JSON text, for clients that only read text.
    let text: Value = serde_json::from_str(denied["text"][0].as_str().unwrap()).unwrap();
    assert_eq!(&text, d);

    // A registered tool the lane does not allow: denied at step 6.
    assert_eq!(calls[2]["isError"], true);
    assert_eq!(
        calls[2]["meta"]["io.toolgate/diagnostic"]["reason"],
        "tool_not_allowed_in_lane"
    );

    // A tool the registry does not know: a JSON-RPC error, not a tool result.
    let unknown = &calls[3]["error"];
    assert_eq!(unknown["code"], -32602, "{}", calls[3]);
    assert_eq!(unknown["data"]["reason"], "tool_unregistered");
}

#[test]
fn the_python_sdk_client_lists_calls_and_reads_denials_over_2025_11_25() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let seen = python_client(
        &server,
        "legacy",
        headers("research_agent", &run, "research", &scope),
        research_calls(),
    );
    check_research_session(&seen, "2025-11-25");
}

/// The official TypeScript SDK client validates every `structuredContent` against the
/// tool's `outputSchema` and throws when it does not conform: a denial of a tool with
/// an output schema must reach it as an `isError` result, never as an exception.
#[test]
fn the_typescript_sdk_client_reads_denials_as_is_error_results() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let plan = json!({
        "url": format!("{}/mcp", server.base),
        "headers": headers("research_agent", &run, "research", &scope),
        "calls": research_calls(),
    });
    let seen = support::node_client(&plan, Duration::from_secs(60));
    assert!(seen.get("connect_error").is_none(), "{seen}");
    let tools = seen["tools"].as_array().unwrap();
    let read_document = tools.iter().find(|t| t["name"] == "read_document").unwrap();
    assert_eq!(read_document["outputSchema"]["type"], "object", "{seen}");
    let calls = seen["calls"].as_array().unwrap();
    assert_eq!(calls[0]["isError"], false, "{}", calls[0]);
    assert_eq!(calls[0]["structuredContent"]["case_id"], "C-1001");
    for denied in &calls[1..3] {
        assert!(denied.get("error").is_none(), "the SDK threw: {denied}");
        assert_eq!(denied["isError"], true, "{denied}");
        assert!(denied["structuredContent"].is_null(), "{denied}");
        let d = &denied["meta"]["io.toolgate/diagnostic"];
        assert_eq!(d["status"], "denied", "{denied}");
        let text: Value =
            serde_json::from_str(denied["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(&text, d);
    }
    assert_eq!(
        calls[1]["meta"]["io.toolgate/diagnostic"]["reason"],
        "prohibited_flag"
    );
    // A tool the registry does not know stays a protocol error.
    assert_eq!(calls[3]["error"]["code"], -32602, "{}", calls[3]);
}

#[test]
fn the_python_sdk_client_speaks_the_stateless_2026_07_28_revision() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let seen = python_client(
        &server,
        "auto",
        headers("research_agent", &run, "research", &scope),
        research_calls(),
    );
    check_research_session(&seen, "2026-07-28");
}

#[test]
fn the_python_sdk_client_is_refused_without_valid_headers() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let mut wrong_token = headers("research_agent", &run, "research", &scope);
    wrong_token["Authorization"] = json!("Bearer not-a-token");
    let mut no_run = headers("research_agent", &run, "research", &scope);
    no_run.as_object_mut().unwrap().remove("X-Toolgate-Run");
    let mut bad_scope = headers("research_agent", &run, "research", &scope);
    bad_scope["X-Toolgate-Scope"] = json!("case_id=C-1001");
    let cases = [
        (wrong_token, "credential_invalid"),
        (no_run, "request_malformed"),
        (bad_scope, "request_malformed"),
        (
            headers("research_agent", &run, "drafting", &scope),
            "lane_not_allowed_for_role",
        ),
    ];
    for (headers, reason) in cases {
        for mode in ["legacy", "auto"] {
            let seen = python_client(&server, mode, headers.clone(), json!([]));
            let error = &seen["connect_error"];
            assert_eq!(error["code"], -32040, "{mode} {reason}: {seen}");
            assert_eq!(error["data"]["reason"], reason, "{mode}: {seen}");
            assert!(error["data"]["suggested_fix"].is_string());
        }
    }
}

#[test]
fn meta_and_arguments_cannot_widen_the_headers() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    // _meta and arguments naming another role, lane or scope change nothing: the
    // call is still research_agent's, in research, on C-1001.
    let seen = python_client(
        &server,
        "legacy",
        headers("research_agent", &run, "research", &scope),
        json!([
            {"name": "read_document", "arguments": {"path": "privileged/strategy.md"},
             "meta": {"io.toolgate/role_id": "supervisor", "io.toolgate/lane_id": "drafting",
                      "role_id": "supervisor", "lane_id": "drafting", "scope": {"case_id": "C-1002"}}},
            {"name": "case_lookup", "arguments": {"role_id": "supervisor"}},
        ]),
    );
    let calls = seen["calls"].as_array().unwrap();
    assert_eq!(
        calls[0]["meta"]["io.toolgate/diagnostic"]["reason"], "prohibited_flag",
        "{seen}"
    );
    assert_eq!(
        calls[1]["meta"]["io.toolgate/diagnostic"]["reason"],
        "arguments_invalid"
    );
}

// ---------------------------------------------------------------------------------------
// Raw JSON-RPC over HTTP: what the client library hides.

struct Rpc {
    url: String,
    agent: ureq::Agent,
}

impl Rpc {
    fn new(server: &Server) -> Rpc {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Rpc {
            url: format!("{}/mcp", server.base),
            agent,
        }
    }

    /// POSTs `body` with `headers`; returns the status, headers of interest and JSON.
    fn post(&self, headers: &Value, body: &str) -> (u16, Value) {
        let pairs: Vec<(&str, &str)> = headers
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
            .collect();
        self.post_pairs(&pairs, body)
    }

    /// [`Rpc::post`] with headers as name-value pairs, a name possibly more than once.
    fn post_pairs(&self, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
        let mut req = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut resp = req.send(body.as_bytes()).unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
        };
        (status, value)
    }

    fn call(&self, headers: &Value, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
        let (status, value) = self.post(headers, &body.to_string());
        assert_eq!(status, 200, "{value}");
        value
    }
}

fn initialize(version: &str) -> Value {
    json!({"protocolVersion": version, "capabilities": {},
           "clientInfo": {"name": "raw", "version": "0"}})
}

#[test]
fn initialize_negotiates_the_supported_revisions() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let rpc = Rpc::new(&server);
    let h = headers("research_agent", &run, "research", &scope);
    for (asked, answered) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        // Older or unknown revisions get the newest one with a handshake; the
        // client decides whether it can speak it.
        ("2025-03-26", "2025-11-25"),
        ("2031-01-01", "2025-11-25"),
    ] {
        let answer = rpc.call(&h, "initialize", initialize(asked));
        let result = &answer["result"];
        assert_eq!(result["protocolVersion"], answered, "{answer}");
        assert!(result["capabilities"]["tools"].is_object(), "{answer}");
        assert_eq!(result["serverInfo"]["name"], "toolgate");
    }
}

#[test]
fn protocol_problems_are_json_rpc_errors_and_http_refusals() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let rpc = Rpc::new(&server);
    let h = headers("research_agent", &run, "research", &scope);

    // An unknown method.
    let answer = rpc.call(&h, "resources/list", json!({}));
    assert_eq!(answer["error"]["code"], -32601, "{answer}");

    // tools/list without credentials: refused with the diagnostic.
    let mut no_auth = h.clone();
    no_auth.as_object_mut().unwrap().remove("Authorization");
    let answer = rpc.call(&no_auth, "tools/list", json!({}));
    assert_eq!(answer["error"]["code"], -32040, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "credential_missing");

    // A body that is not JSON-RPC.
    let (status, body) = rpc.post(&h, "{not json");
    assert!((400..500).contains(&status), "{status} {body}");

    // No server-initiated streams and no sessions: GET and DELETE are 405, as JSON.
    for method in ["GET", "DELETE"] {
        let out = Command::new("curl")
            .args(["-s", "-i", "-X", method, &rpc.url])
            .output();
        if let Ok(out) = out {
            let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
            assert!(text.starts_with("http/1.1 405"), "{text}");
            assert!(text.contains("allow: post"), "{text}");
            assert!(text.contains("\"reason\":\"method_not_allowed\""), "{text}");
        }
    }
    let resp = rpc.agent.get(&rpc.url).call().unwrap();
    assert_eq!(resp.status().as_u16(), 405);

    // A browser origin is refused (DNS rebinding defence).
    let mut from_browser = h.clone();
    from_browser["Origin"] = json!("http://evil.example");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let (status, refusal) = rpc.post(&from_browser, &body.to_string());
    assert_eq!(status, 403, "{refusal}");
    assert_eq!(refusal["status"], "denied");
    assert_eq!(refusal["diagnostic"]["reason"], "origin_not_allowed");
    // Look-alikes of localhost are refused too; localhost itself is allowed.
    from_browser["Origin"] = json!("http://localhost.evil.example");
    let (status, refusal) = rpc.post(&from_browser, &body.to_string());
    assert_eq!(status, 403, "{refusal}");
    from_browser["Origin"] = json!("http://localhost:6274");
    let (status, answer) = rpc.post(&from_browser, &body.to_string());
    assert_eq!(status, 200, "{answer}");
    assert!(answer["result"]["tools"].is_array(), "{answer}");

    // Unsupported protocol revisions, named in the header: the JSON-RPC error of the
    // 2026-07-28 revision (see the test below).
    let mut versioned = h.clone();
    versioned["MCP-Protocol-Version"] = json!("2024-11-05");
    let (status, refusal) = rpc.post(&versioned, &body.to_string());
    assert_eq!(status, 400, "{refusal}");
    assert_eq!(refusal["error"]["code"], -32022, "{refusal}");
    let mut versioned = h.clone();
    versioned["MCP-Protocol-Version"] = json!("2025-11-25");
    let (status, answer) = rpc.post(&versioned, &body.to_string());
    assert_eq!(status, 200, "{answer}");

    // A batch: its own reason, not 415.
    let batch = format!("[{body}]");
    let (status, refusal) = rpc.post(&h, &batch);
    assert_eq!(status, 400, "{refusal}");
    assert_eq!(refusal["diagnostic"]["reason"], "batch_unsupported");
}

#[test]
fn a_tools_call_with_missing_headers_is_a_denied_and_audited_call() {
    let server = Server::start_with(Start {
        env: vec![("TOOLGATE_LOG".into(), "info".into())],
        ..Start::default()
    });
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let rpc = Rpc::new(&server);
    let mut h = headers("research_agent", &run, "research", &scope);
    h.as_object_mut().unwrap().remove("X-Toolgate-Scope");
    let before = last_seq(&server);
    let answer = rpc.call(
        &h,
        "tools/call",
        json!({"name": "case_lookup", "arguments": {}}),
    );
    let result = &answer["result"];
    assert_eq!(result["isError"], true, "{answer}");
    assert!(result.get("structuredContent").is_none(), "{answer}");
    let d = &result["_meta"]["io.toolgate/diagnostic"];
    assert_eq!(d["reason"], "request_malformed");
    assert_eq!(
        d["details"]["problems"][0],
        "missing header `X-Toolgate-Scope`"
    );
    let events = events_after(&server, &run, before);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["tool_denied"], "{events:#?}");
    // Logged once, like an HTTP call: one JSON line naming the call.
    let call_id = d["call_id"].as_str().unwrap();
    let needle = format!("\"call_id\":\"{call_id}\"");
    assert!(!server.log_lines_with(&needle).is_empty(), "no log line");
    // A later call's log line is the barrier: once it is there, a second line for the
    // first call would be too.
    let (_, marker) = server.call(
        "research_agent",
        &run,
        "research",
        "no_such_tool",
        json!({}),
        scope.clone(),
    );
    let marker = format!("\"call_id\":\"{}\"", marker["call_id"].as_str().unwrap());
    assert!(
        !server.log_lines_with(&marker).is_empty(),
        "no marker log line"
    );
    let lines = server.log_lines_with(&needle);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("\"message\":\"tool call\""),
        "{}",
        lines[0]
    );
    assert_eq!(events[0]["run_id"], run.as_str());
    if events[0].get("event_id").is_some() {
        assert_eq!(events[0]["event_id"], d["audit_event_id"]);
        assert_eq!(events[0]["call_id"], d["call_id"]);
        assert_eq!(events[0]["role_id"], "research_agent");
        assert_eq!(events[0]["tool_name"], "case_lookup");
    }
}

// ---------------------------------------------------------------------------------------
// The audit log: an MCP call is recorded exactly like an HTTP API call.

/// The events of `run` after `after_seq`, in log order. Calls in these tests are made
/// one at a time, so the events after a call's start are that call's.
fn events_after(server: &Server, run: &str, after_seq: u64) -> Vec<Value> {
    let (status, body) = server.get(
        &format!("/v1/audit/events?run_id={run}&after_seq={after_seq}&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(status, 200, "{body}");
    body["events"].as_array().unwrap().clone()
}

/// The seq of the last event in the log.
fn last_seq(server: &Server) -> u64 {
    let mut after = 0;
    loop {
        let (status, body) = server.get(
            &format!("/v1/audit/events?after_seq={after}&limit=1000"),
            Some(ADMIN),
        );
        assert_eq!(status, 200, "{body}");
        match body["next_after_seq"].as_u64() {
            Some(next) if next > after => after = next,
            _ => return after,
        }
    }
}

/// An event without what differs between any two calls: ids, position, time, hashes
/// of the chain, durations.
fn comparable(event: &Value) -> Value {
    let mut event = event.clone();
    strip(&mut event);
    event
}

fn strip(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|k, _| {
                !matches!(
                    k.as_str(),
                    "seq" | "event_id" | "call_id" | "timestamp_utc" | "prev" | "hash"
                ) && !k.ends_with("_ms")
            });
            for v in map.values_mut() {
                strip(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip),
        _ => {}
    }
}

#[test]
fn mcp_calls_are_audited_exactly_like_http_calls() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let rpc = Rpc::new(&server);
    let h = headers("research_agent", &run, "research", &scope);
    let cases = [
        ("case_lookup", json!({})),                                   // executed
        ("read_document", json!({"path": "privileged/strategy.md"})), // denied
        ("legal_search", json!({"query": 7})),                        // invalid arguments
    ];
    for (tool, arguments) in cases {
        let before_http = last_seq(&server);
        let (_, http) = server.call(
            "research_agent",
            &run,
            "research",
            tool,
            arguments.clone(),
            scope.clone(),
        );
        let before_mcp = last_seq(&server);
        let answer = rpc.call(
            &h,
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        );
        let meta = &answer["result"]["_meta"];
        assert_eq!(meta["io.toolgate/status"], http["status"], "{tool}");

        let mut http_events = events_after(&server, &run, before_http);
        http_events.retain(|e| e["seq"].as_u64() <= Some(before_mcp));
        let mcp_events = events_after(&server, &run, before_mcp);
        assert!(
            !http_events.is_empty(),
            "{tool}: no events for the HTTP call"
        );
        let http_types: Vec<&Value> = http_events.iter().map(|e| &e["type"]).collect();
        let mcp_types: Vec<&Value> = mcp_events.iter().map(|e| &e["type"]).collect();
        assert_eq!(http_types, mcp_types, "{tool}");
        for (a, b) in http_events.iter().zip(&mcp_events) {
            assert_eq!(comparable(a), comparable(b), "{tool}");
        }
        // The closing event is the one each response names.
        let (http_last, mcp_last) = (http_events.last().unwrap(), mcp_events.last().unwrap());
        if http_last.get("event_id").is_some() {
            assert_eq!(http_last["event_id"], http["audit_event_id"]);
            assert_eq!(mcp_last["event_id"], meta["io.toolgate/audit_event_id"]);
            assert_eq!(http_last["call_id"], http["call_id"]);
            assert_eq!(mcp_last["call_id"], meta["io.toolgate/call_id"]);
        }
    }
}

#[test]
fn list_initialize_and_ping_check_the_run_as_a_call_does() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let (status, body) = server.post(
        "/v1/runs",
        Some(ADMIN),
        &json!({"scope": scope, "issue_tokens": [{"role_id": "paralegal_agent"}]}),
    );
    assert_eq!(status, 201, "{body}");
    let own_run = body["run_id"].as_str().unwrap().to_string();
    let run_token = body["tokens"][0]["token"].as_str().unwrap().to_string();
    let other_run = server.create_run(scope.clone());
    let closed_run = server.create_run(scope.clone());
    let (status, body) = server.post(
        &format!("/v1/runs/{closed_run}/status"),
        Some(ADMIN),
        &json!({"status": "closed"}),
    );
    assert_eq!(status, 200, "{body}");
    let rpc = Rpc::new(&server);
    let with_token = |run: &str| {
        json!({
            "Authorization": format!("Bearer {run_token}"),
            "X-Toolgate-Run": run,
        })
    };
    let requests = [
        ("tools/list", json!({})),
        ("initialize", initialize("2025-11-25")),
        ("ping", json!({})),
    ];
    let refused = |headers: &Value, reason: &str| {
        for (method, params) in &requests {
            let answer = rpc.call(headers, method, params.clone());
            assert_eq!(answer["error"]["code"], -32040, "{method}: {answer}");
            assert_eq!(
                answer["error"]["data"]["reason"], reason,
                "{method}: {answer}"
            );
            assert!(answer.get("result").is_none(), "{method}: {answer}");
        }
    };
    // A run token names its own run; another run (existing or not) is refused, as
    // tools/call refuses it.
    refused(&with_token(&other_run), "credential_not_for_run");
    refused(&with_token("run-nobody-created"), "credential_not_for_run");
    let answer = rpc.call(&with_token(&own_run), "tools/list", json!({}));
    assert!(answer["result"]["tools"].is_array(), "{answer}");
    // A role's own credential: the run must exist and be open for the lane.
    refused(
        &headers("research_agent", "run-nobody-created", "research", &scope),
        "run_not_found",
    );
    refused(
        &headers("research_agent", &closed_run, "research", &scope),
        "run_not_active",
    );
    let answer = rpc.call(
        &headers("research_agent", &other_run, "research", &scope),
        "tools/list",
        json!({}),
    );
    assert!(answer["result"]["tools"].is_array(), "{answer}");
}

/// Issue 38, finding 9: an `MCP-Protocol-Version` header the front does not speak is
/// answered with the 2026-07-28 revision's `UnsupportedProtocolVersion` JSON-RPC error
/// (HTTP 400, code -32022, `data.supported` listing the revisions it speaks and
/// `data.requested` the one asked for), which a client reads to pick a version; the
/// diagnostic rides along as `data.diagnostic`. Nothing reaches the pipeline.
#[test]
fn an_unsupported_protocol_version_is_the_json_rpc_error_clients_pick_a_version_from() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let rpc = Rpc::new(&server);
    let h = headers("research_agent", &run, "research", &scope);
    let before = last_seq(&server);
    for (requested, id, body) in [
        (
            "2024-11-05",
            json!(3),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}}).to_string(),
        ),
        (
            "2025-03-26",
            json!("call-a"),
            json!({"jsonrpc": "2.0", "id": "call-a", "method": "tools/call",
                   "params": {"name": "case_lookup", "arguments": {}}})
            .to_string(),
        ),
        (
            "2099-01-01",
            json!(9),
            json!({"jsonrpc": "2.0", "id": 9, "method": "server/discover", "params": {}})
                .to_string(),
        ),
        ("junk", Value::Null, "not json".to_string()),
    ] {
        let mut versioned = h.clone();
        versioned["MCP-Protocol-Version"] = json!(requested);
        let (status, answer) = rpc.post(&versioned, &body);
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
        assert_eq!(answer["id"], id, "{answer}");
        let error = &answer["error"];
        assert_eq!(error["code"], -32022, "{answer}");
        assert!(
            error["message"].as_str().unwrap().contains(requested),
            "{answer}"
        );
        let data = &error["data"];
        assert_eq!(data["requested"], requested, "{answer}");
        assert_eq!(
            data["supported"],
            json!(["2025-06-18", "2025-11-25", "2026-07-28"]),
            "{answer}"
        );
        let diagnostic = &data["diagnostic"];
        assert_eq!(
            diagnostic["reason"], "protocol_version_unsupported",
            "{answer}"
        );
        assert_eq!(diagnostic["status"], "denied", "{answer}");
        assert_eq!(
            diagnostic["details"]["supported"], data["supported"],
            "{answer}"
        );
        assert!(diagnostic["suggested_fix"].is_string(), "{answer}");
    }
    assert_eq!(
        last_seq(&server),
        before,
        "transport refusals are not audited"
    );
}

/// Issue 38, finding 10: two `Authorization` headers on `/mcp` prove nothing; the
/// front does not pick one. Any method but `tools/call` is refused with the JSON-RPC
/// error of a malformed request; a `tools/call` goes through the pipeline like a call
/// with malformed headers: denied (`request_malformed`) and audited once.
#[test]
fn two_authorization_headers_on_mcp_are_refused_as_malformed() {
    let server = Server::start();
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    let rpc = Rpc::new(&server);
    let research = format!("Bearer {}", token("research_agent"));
    let supervisor = format!("Bearer {}", token("supervisor"));
    let scope_text = scope.to_string();
    let pairs = |second: &str| -> Vec<(&str, String)> {
        vec![
            ("Authorization", research.clone()),
            ("Authorization", second.to_string()),
            ("X-Toolgate-Role", "research_agent".into()),
            ("X-Toolgate-Run", run.clone()),
            ("X-Toolgate-Lane", "research".into()),
            ("X-Toolgate-Scope", scope_text.clone()),
        ]
    };
    let send = |second: &str, body: &Value| {
        let owned = pairs(second);
        let borrowed: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        rpc.post_pairs(&borrowed, &body.to_string())
    };
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    for second in [research.as_str(), supervisor.as_str(), "Bearer nonsense"] {
        let (status, answer) = send(second, &list);
        assert_eq!(status, 200, "{answer}");
        assert!(answer.get("result").is_none(), "{answer}");
        assert_eq!(answer["error"]["code"], -32040, "{answer}");
        let data = &answer["error"]["data"];
        assert_eq!(data["reason"], "request_malformed", "{answer}");
        assert!(
            data["details"]["problems"]
                .as_array()
                .unwrap()
                .contains(&json!("header `Authorization` is given more than once")),
            "{answer}"
        );
    }

    let before = last_seq(&server);
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "case_lookup", "arguments": {}}});
    let (status, answer) = send(&supervisor, &call);
    assert_eq!(status, 200, "{answer}");
    let result = &answer["result"];
    assert_eq!(result["isError"], true, "{answer}");
    let d = &result["_meta"]["io.toolgate/diagnostic"];
    assert_eq!(d["reason"], "request_malformed", "{answer}");
    let events = events_after(&server, &run, before);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["tool_denied"], "{events:#?}");
    assert_eq!(events[0]["reason"], "request_malformed");
    assert_eq!(events[0]["call_id"], d["call_id"]);
    // One header, the same request: allowed.
    let (status, answer) = rpc.post(
        &headers("research_agent", &run, "research", &scope),
        &call.to_string(),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["isError"], false, "{answer}");
}
