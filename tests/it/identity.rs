//! Run tokens through the real server: issued with a run, bound to its run, role and
//! lanes, dead once the run closes, revoked or expired, durable across restarts, and
//! never written to a log, a metric or the audit log.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{self, ADMIN, Server, Start, token};

/// Creates a run bound to case C-1001 with the tokens `issue` asks for; returns the run
/// id and the answer's `tokens`.
fn run_with_tokens(server: &Server, issue: Value) -> (String, Vec<Value>) {
    let (status, body) = server.post(
        "/v1/runs",
        Some(ADMIN),
        &json!({"scope": {"case_id": "C-1001"}, "issue_tokens": issue}),
    );
    assert_eq!(status, 201, "{body}");
    let tokens = body["tokens"].as_array().cloned().unwrap_or_default();
    (body["run_id"].as_str().unwrap().to_string(), tokens)
}

fn paralegal_token(server: &Server) -> (String, String, String) {
    let (run, tokens) = run_with_tokens(server, json!([{"role_id": "paralegal_agent"}]));
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    let t = &tokens[0];
    assert_eq!(t["role_id"], "paralegal_agent");
    assert_eq!(t["lanes"], json!(["drafting"]));
    assert!(t["expires_utc"].as_str().unwrap().ends_with('Z'), "{t}");
    (
        run,
        t["token"].as_str().unwrap().to_string(),
        t["token_id"].as_str().unwrap().to_string(),
    )
}

/// A draft call carrying nothing but the tool and its arguments.
fn draft() -> Value {
    json!({
        "tool_name": "draft_document",
        "arguments": {"title": "Engagement letter", "body": "Dear client."},
    })
}

fn reason(body: &Value) -> &str {
    body["diagnostic"]["reason"]
        .as_str()
        .or_else(|| body["reason"].as_str())
        .unwrap_or_default()
}

#[test]
fn a_call_with_only_the_run_token_succeeds_and_is_audited_with_the_token_id() {
    let server = Server::start();
    let (run, t, token_id) = paralegal_token(&server);
    let (code, body) = server.post("/v1/tool-calls", Some(&t), &draft());
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["trace"]["role"], "paralegal_agent", "{body}");
    // The same ids, named explicitly, are accepted too.
    let mut named = draft();
    named["role_id"] = json!("paralegal_agent");
    named["run_id"] = json!(run);
    named["lane_id"] = json!("drafting");
    let (code, body) = server.post("/v1/tool-calls", Some(&t), &named);
    assert_eq!(code, 200, "{body}");

    let (_, events) = server.get(&format!("/v1/audit/events?run_id={run}"), Some(ADMIN));
    let events = events["events"].as_array().unwrap().clone();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "run_created",
            "run_token_issued",
            "tool_requested",
            "tool_executed",
            "tool_requested",
            "tool_executed"
        ]
    );
    let issued = &events[1];
    assert_eq!(issued["role_id"], "paralegal_agent");
    assert_eq!(issued["details"]["token_id"], token_id.as_str());
    assert_eq!(issued["details"]["by"], "ops");
    assert_eq!(
        issued["details"]["token_sha256"],
        toolgate::canonical::sha256_hex(t.as_bytes())
    );
    for call_event in &events[2..] {
        assert_eq!(call_event["role_id"], "paralegal_agent");
        assert_eq!(call_event["run_id"], run.as_str());
        assert_eq!(
            call_event["details"]["caller"],
            json!({"kind": "run_token", "token_id": token_id})
        );
    }
}

#[test]
fn a_run_token_is_refused_in_another_run_for_another_role_and_outside_its_lanes() {
    let server = Server::start();
    let (_run, t, _) = paralegal_token(&server);
    let other = server.create_run(json!({"case_id": "C-1002"}));
    // Another run, existing or not: step 3, credential_not_for_run.
    for run_id in [other.as_str(), "no-such-run"] {
        let mut body = draft();
        body["run_id"] = json!(run_id);
        let (code, answer) = server.post("/v1/tool-calls", Some(&t), &body);
        assert_eq!(code, 403, "{answer}");
        assert_eq!(reason(&answer), "credential_not_for_run", "{answer}");
        assert_eq!(answer["diagnostic"]["failed_step"], 3, "{answer}");
    }
    // Another role named in the body: the token does not prove it.
    let mut body = draft();
    body["role_id"] = json!("supervisor");
    let (code, answer) = server.post("/v1/tool-calls", Some(&t), &body);
    assert_eq!(code, 401, "{answer}");
    assert_eq!(reason(&answer), "credential_invalid", "{answer}");

    // A supervisor token limited to research cannot draft, though the role may.
    let (run, tokens) = run_with_tokens(
        &server,
        json!([{"role_id": "supervisor", "lanes": ["research"], "ttl_s": 600}]),
    );
    let sup = tokens[0]["token"].as_str().unwrap();
    let body = json!({
        "lane_id": "drafting", "tool_name": "draft_document",
        "arguments": {"title": "t", "body": "b"},
    });
    let (code, answer) = server.post("/v1/tool-calls", Some(sup), &body);
    assert_eq!(code, 403, "{answer}");
    assert_eq!(reason(&answer), "lane_not_allowed_for_role", "{answer}");
    assert_eq!(
        answer["diagnostic"]["details"]["token_lanes"],
        json!(["research"])
    );
    // With one lane in the token, the lane may be left out.
    let body = json!({
        "tool_name": "legal_search", "arguments": {"query": "duty", "limit": 1},
    });
    let (code, answer) = server.post("/v1/tool-calls", Some(sup), &body);
    assert_eq!(code, 200, "{answer}");
    assert!(!run.is_empty());
}

#[test]
fn closing_the_run_revoking_or_expiry_kills_the_token() {
    let server = Server::start();
    let (run, t, _) = paralegal_token(&server);
    let (code, _) = server.post(
        &format!("/v1/runs/{run}/status"),
        Some(ADMIN),
        &json!({"status": "closed"}),
    );
    assert_eq!(code, 200);
    let (code, answer) = server.post("/v1/tool-calls", Some(&t), &draft());
    assert_eq!(code, 401, "{answer}");
    assert_eq!(reason(&answer), "credential_expired", "{answer}");

    // Revocation: by admins only, audited, final.
    let (run, t, token_id) = paralegal_token(&server);
    let path = format!("/v1/runs/{run}/tokens/{token_id}/revoke");
    let (code, answer) = server.post(&path, Some(&token("supervisor")), &json!({}));
    assert_eq!(code, 401, "{answer}");
    let (code, answer) = server.post(&path, Some(&t), &json!({}));
    assert_eq!(code, 401, "a run token cannot revoke: {answer}");
    let (code, answer) = server.post(&path, Some(ADMIN), &json!({}));
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["revoked"], true);
    let (code, answer) = server.post(&path, Some(ADMIN), &json!({}));
    assert_eq!(code, 400, "revoking twice: {answer}");
    let (code, answer) = server.post("/v1/tool-calls", Some(&t), &draft());
    assert_eq!(code, 401, "{answer}");
    assert_eq!(reason(&answer), "credential_expired", "{answer}");
    assert!(
        answer["error_message"]
            .as_str()
            .unwrap()
            .contains("revoked")
    );
    let (_, events) = server.get(
        &format!("/v1/audit/events?run_id={run}&type=run_token_revoked"),
        Some(ADMIN),
    );
    assert_eq!(
        events["events"][0]["details"]["token_id"],
        token_id.as_str()
    );
    assert_eq!(events["events"][0]["details"]["by"], "ops");

    // Expiry: a one-second token is refused once its second has passed.
    let (_, tokens) = run_with_tokens(&server, json!([{"role_id": "paralegal_agent", "ttl_s": 1}]));
    let short = tokens[0]["token"].as_str().unwrap().to_string();
    let mut answer = Value::Null;
    common::poll_until(Duration::from_secs(10), || {
        let (code, body) = server.post("/v1/tool-calls", Some(&short), &draft());
        answer = body;
        code != 200
    });
    assert_eq!(reason(&answer), "credential_expired", "{answer}");
    assert!(
        answer["error_message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );
}

/// A copy of the demo policy in which `drafting_agent` sets `run_tokens_only` beside its
/// static token.
fn run_tokens_only_policy(dir: &Path) -> Start {
    let policy = dir.join("policy");
    std::fs::create_dir_all(&policy).unwrap();
    for file in ["roles.yaml", "lanes.yaml"] {
        let text = std::fs::read_to_string(common::repo().join("policy").join(file)).unwrap();
        let text = if file == "roles.yaml" {
            text.replace(
                "      token_sha256: cc29d088710abf93017af18ac5608115e06cbb370c59bb79ff92f415eb5b501c  # demo-drafting_agent",
                "      token_sha256: cc29d088710abf93017af18ac5608115e06cbb370c59bb79ff92f415eb5b501c  # demo-drafting_agent\n      run_tokens_only: true",
            )
        } else {
            text
        };
        std::fs::write(policy.join(file), text).unwrap();
    }
    Start {
        policy_dir: policy,
        ..Start::default()
    }
}

#[test]
fn a_run_tokens_only_role_cannot_call_with_its_static_token() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(run_tokens_only_policy(tmp.path()));
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, answer) = server.call(
        "drafting_agent",
        &run,
        "drafting",
        "draft_document",
        json!({"title": "t", "body": "b"}),
        json!({}),
    );
    assert_eq!(code, 403, "{answer}");
    assert_eq!(reason(&answer), "run_token_required", "{answer}");
    assert_eq!(answer["diagnostic"]["failed_step"], 2);
    // The demo's paralegal has no static token at all: any guess is just invalid.
    let (code, answer) = server.call(
        "paralegal_agent",
        &run,
        "drafting",
        "draft_document",
        json!({"title": "t", "body": "b"}),
        json!({}),
    );
    assert_eq!(code, 401, "{answer}");
    assert_eq!(reason(&answer), "credential_invalid", "{answer}");
    // A run token for the role works.
    let (_, tokens) = run_with_tokens(&server, json!([{"role_id": "drafting_agent"}]));
    let t = tokens[0]["token"].as_str().unwrap();
    let (code, answer) = server.post("/v1/tool-calls", Some(t), &draft());
    assert_eq!(code, 200, "{answer}");
}

#[test]
fn a_restart_keeps_unexpired_run_tokens_valid_and_revoked_ones_dead() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("var");
    let server = Server::start_with(Start {
        data_dir: Some(data_dir.clone()),
        ..Start::default()
    });
    let (_, t, _) = paralegal_token(&server);
    let (run, revoked, revoked_id) = paralegal_token(&server);
    let (code, _) = server.post(
        &format!("/v1/runs/{run}/tokens/{revoked_id}/revoke"),
        Some(ADMIN),
        &json!({}),
    );
    assert_eq!(code, 200);
    let _ = server.kill9();
    let restarted = Server::start_with(Start {
        data_dir: Some(data_dir),
        ..Start::default()
    });
    let (code, answer) = restarted.post("/v1/tool-calls", Some(&t), &draft());
    assert_eq!(code, 200, "{answer}");
    let (code, answer) = restarted.post("/v1/tool-calls", Some(&revoked), &draft());
    assert_eq!(code, 401, "{answer}");
    assert_eq!(reason(&answer), "credential_expired", "{answer}");
}

#[test]
fn issuing_refuses_bad_requests_and_non_admins() {
    let server = Server::start();
    // A role's token cannot create runs or mint tokens, and learns nothing of roles.
    let (code, answer) = server.post(
        "/v1/runs",
        Some(&token("supervisor")),
        &json!({"issue_tokens": [{"role_id": "nobody"}]}),
    );
    assert_eq!(code, 401, "{answer}");
    for bad in [
        json!("paralegal_agent"),
        json!([{"role_id": "nobody"}]),
        json!([{"role_id": "paralegal_agent", "lanes": ["research"]}]),
        json!([{"role_id": "paralegal_agent", "lanes": []}]),
        json!([{"role_id": "paralegal_agent", "ttl_s": 0}]),
        json!([{"role_id": "paralegal_agent", "ttl_s": 86_401}]),
        json!([{"role_id": "paralegal_agent", "extra": 1}]),
        Value::Array(vec![json!({"role_id": "paralegal_agent"}); 33]),
    ] {
        let (code, answer) = server.post(
            "/v1/runs",
            Some(ADMIN),
            &json!({"run_id": "refused", "issue_tokens": bad}),
        );
        assert_eq!(code, 400, "{bad}: {answer}");
        assert_eq!(reason(&answer), "request_malformed", "{answer}");
    }
    // Nothing was created by the refused requests.
    let (code, _) = server.get("/v1/runs/refused", Some(ADMIN));
    assert_eq!(code, 403);
    // A huge bearer token shaped like a run token is refused, not looked up.
    let huge = format!("tgr_{}", "A".repeat(100_000));
    let (code, answer) = server.post("/v1/tool-calls", Some(&huge), &draft());
    assert!(code == 401 || code == 431 || code == 400, "{code} {answer}");
}

/// Every file under `dir`, read whole.
fn files_under(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap().map_while(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path.display().to_string(), bytes));
        }
    }
}

#[test]
fn no_run_token_appears_in_logs_metrics_or_the_audit_log() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(Start {
        data_dir: Some(tmp.path().join("var")),
        env: vec![("TOOLGATE_LOG".into(), "debug".into())],
        ..Start::default()
    });
    let (run, t, token_id) = paralegal_token(&server);
    let (code, answer) = server.post("/v1/tool-calls", Some(&t), &draft());
    assert_eq!(code, 200);
    let call_id = answer["call_id"].as_str().unwrap().to_string();
    let mut other = draft();
    other["run_id"] = json!("elsewhere");
    let (code, _) = server.post("/v1/tool-calls", Some(&t), &other);
    assert_eq!(code, 403);
    let (code, _) = server.post(
        &format!("/v1/runs/{run}/tokens/{token_id}/revoke"),
        Some(ADMIN),
        &json!({}),
    );
    assert_eq!(code, 200);
    // The logs did record the calls (so the search below searched something).
    assert!(!server.log_lines_with(&call_id).is_empty());
    assert!(
        server.log_lines_with(&t).is_empty(),
        "the token is in the logs"
    );
    // The secret part: without its prefix, and a long piece of it.
    let secret = &t[4..];
    assert!(server.log_lines_with(&secret[..24]).is_empty());

    let metrics = server.metrics();
    assert!(metrics.contains("toolgate_"), "{metrics}");
    assert!(!metrics.contains(&secret[..24]));

    let (_, events) = server.get("/v1/audit/events?limit=1000", Some(ADMIN));
    let events = events.to_string();
    assert!(events.contains(&token_id));
    assert!(!events.contains(&secret[..24]));

    let data_dir = server.data_dir.clone();
    let _ = server.stop();
    let mut files = Vec::new();
    files_under(&data_dir, &mut files);
    assert!(files.iter().any(|(name, _)| name.ends_with("audit.db")));
    let needle = &secret.as_bytes()[..24];
    for (name, bytes) in &files {
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "the token is in {name}"
        );
    }
}

/// Runs tests/mcp/client.py (the official Python MCP SDK) with `headers` and `calls`.
fn python_client(server: &Server, headers: Value, calls: Value) -> Value {
    let plan = json!({
        "url": format!("{}/mcp", server.base),
        "mode": "legacy",
        "headers": headers,
        "calls": calls,
    });
    let out = std::process::Command::new(crate::mcp_support::python())
        .arg(crate::mcp_support::scripts().join("client.py"))
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

#[test]
fn an_mcp_host_lists_and_calls_tools_with_only_the_run_token() {
    let server = Server::start();
    let (run, t, token_id) = paralegal_token(&server);
    let seen = python_client(
        &server,
        json!({"Authorization": format!("Bearer {t}")}),
        json!([{"name": "draft_document", "arguments": {"title": "Letter", "body": "Dear client."}}]),
    );
    let names: Vec<&str> = seen["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {seen}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"draft_document"), "{seen}");
    assert_eq!(seen["calls"][0]["isError"], false, "{seen}");
    let (_, events) = server.get(
        &format!("/v1/audit/events?run_id={run}&type=tool_executed"),
        Some(ADMIN),
    );
    let executed = &events["events"][0];
    assert_eq!(executed["role_id"], "paralegal_agent", "{events}");
    assert_eq!(executed["details"]["caller"]["token_id"], token_id.as_str());

    // The token of a closed run no longer admits the host.
    let (code, _) = server.post(
        &format!("/v1/runs/{run}/status"),
        Some(ADMIN),
        &json!({"status": "closed"}),
    );
    assert_eq!(code, 200);
    let seen = python_client(
        &server,
        json!({"Authorization": format!("Bearer {t}")}),
        json!([]),
    );
    assert!(seen["tools"].is_null(), "{seen}");
    assert!(seen.to_string().contains("credential_expired"), "{seen}");
}

#[test]
fn the_run_token_lifetime_cap_is_the_policys() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy");
    std::fs::create_dir_all(&policy).unwrap();
    let repo = common::repo().join("policy");
    std::fs::copy(repo.join("lanes.yaml"), policy.join("lanes.yaml")).unwrap();
    let roles = std::fs::read_to_string(repo.join("roles.yaml")).unwrap();
    let roles = roles.replacen(
        "\nroles:\n",
        "\nrun_tokens: {max_ttl_s: 600}\n\nroles:\n",
        1,
    );
    std::fs::write(policy.join("roles.yaml"), roles).unwrap();
    let server = Server::start_with(Start {
        policy_dir: policy,
        ..Start::default()
    });
    let ask = |ttl: Value| {
        server.post(
            "/v1/runs",
            Some(ADMIN),
            &json!({"scope": {"case_id": "C-1001"},
                    "issue_tokens": [{"role_id": "paralegal_agent", "ttl_s": ttl}]}),
        )
    };
    let (status, body) = ask(json!(601));
    assert_eq!(
        (status, reason(&body)),
        (400, "request_malformed"),
        "{body}"
    );
    assert!(
        body["error_message"]
            .as_str()
            .unwrap()
            .contains("from 1 to 600"),
        "{body}"
    );
    let (status, body) = ask(json!(600));
    assert_eq!(status, 201, "{body}");
    // Without ttl_s the default (3600) is cut to the cap.
    let (status, body) = ask(Value::Null);
    assert_eq!(status, 201, "{body}");
    let (_, events) = server.get(
        &format!(
            "/v1/audit/events?run_id={}",
            body["run_id"].as_str().unwrap()
        ),
        Some(ADMIN),
    );
    let issued = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "run_token_issued")
        .cloned()
        .unwrap();
    assert_eq!(issued["details"]["ttl_s"], 600, "{issued}");
}

/// Issue 38, finding 10: a run token acts only in its lanes, a non-empty subset of its
/// role's (docs/api.md). The demo's `attorney` may act in no lane, so a token for it
/// could never act: it is refused like any bad token request, and nothing is created.
#[test]
fn a_run_token_for_a_role_with_no_lanes_is_refused() {
    let server = Server::start();
    for issue in [
        json!([{"role_id": "attorney"}]),
        json!([{"role_id": "paralegal_agent"}, {"role_id": "attorney", "ttl_s": 60}]),
    ] {
        let (code, answer) = server.post(
            "/v1/runs",
            Some(ADMIN),
            &json!({"run_id": "lane-less", "scope": {"case_id": "C-1001"}, "issue_tokens": issue}),
        );
        assert_eq!(code, 400, "{issue}: {answer}");
        assert_eq!(reason(&answer), "request_malformed", "{answer}");
        assert!(
            answer["diagnostic"]["message"]
                .as_str()
                .unwrap()
                .contains("no lane"),
            "{answer}"
        );
    }
    let (code, _) = server.get("/v1/runs/lane-less", Some(ADMIN));
    assert_eq!(code, 403, "the refused requests created no run");
    let (_, events) = server.get("/v1/audit/events?type=run_token_issued", Some(ADMIN));
    assert_eq!(events["events"], json!([]), "{events}");
}
