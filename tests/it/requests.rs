//! The typed requests of the HTTP API over the real server: each endpoint's body is
//! parsed by the server, a malformed one is answered with the documented
//! `request_malformed` diagnostic only after the caller is authenticated, and a tool
//! call whose body cannot be parsed is still audited.

use serde_json::{Value, json};

use crate::common::{self, ADMIN, Server};

fn problems(body: &Value) -> Vec<String> {
    serde_json::from_value(body["diagnostic"]["details"]["problems"].clone()).unwrap()
}

#[test]
fn admin_bodies_are_refused_with_every_documented_problem() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let status_path = format!("/v1/runs/{run}/status");
    let repin_path = format!("/v1/runs/{run}/repin");
    let cases: [(&str, &[u8], &str); 9] = [
        (
            "/v1/runs",
            b"{nope",
            "the body is not valid JSON: key must be a string at line 1 column 2",
        ),
        ("/v1/runs", b"[1]", "the body must be a JSON object"),
        (
            "/v1/runs",
            br#"{"run_id": "a b"}"#,
            "`run_id` must match ^[A-Za-z0-9._-]{1,128}$",
        ),
        ("/v1/runs", br#"{"scope": 7}"#, "`scope` must be an object"),
        (
            "/v1/safety-lock",
            br#"{"reason": "x"}"#,
            "`engaged` must be a boolean",
        ),
        (
            "/v1/safety-lock",
            br#"{"engaged": 1}"#,
            "`engaged` must be a boolean",
        ),
        (
            &status_path,
            br#"{"status": "paused"}"#,
            "`status` must be one of active, suspended, closed",
        ),
        (
            &status_path,
            b"",
            "`status` must be one of active, suspended, closed",
        ),
        (&repin_path, br#"{"force": true}"#, "unknown field `force`"),
    ];
    for (path, body, problem) in cases {
        let (code, answer) = server.post_raw(path, Some(ADMIN), body);
        assert_eq!(code, 400, "{path} {answer}");
        assert_eq!(answer["diagnostic"]["reason"], "request_malformed");
        assert_eq!(
            answer["error_message"],
            format!("malformed request: {problem}")
        );
        assert_eq!(problems(&answer), [problem], "{path}");
    }
    // Every unknown field is named, in order, whatever else is wrong.
    let (code, answer) = server.post_raw(
        "/v1/safety-lock",
        Some(ADMIN),
        br#"{"zeta": 1, "engaged": "no", "alpha": 2}"#,
    );
    assert_eq!(code, 400, "{answer}");
    assert_eq!(
        problems(&answer),
        ["unknown field `alpha`", "unknown field `zeta`"]
    );
    // Nothing was changed by a refused body.
    let (_, lock) = server.get("/v1/safety-lock", Some(ADMIN));
    assert_eq!(lock["engaged"], false, "{lock}");
    let (_, record) = server.get(&format!("/v1/runs/{run}"), Some(ADMIN));
    assert_eq!(record["status"], "active", "{record}");
}

#[test]
fn a_malformed_admin_body_is_answered_only_after_the_caller_is_authenticated() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let agent = common::token("research_agent");
    for path in [
        "/v1/runs".to_string(),
        "/v1/safety-lock".to_string(),
        format!("/v1/runs/{run}/status"),
        format!("/v1/runs/{run}/repin"),
    ] {
        for (token, code, reason) in [
            (None, 401, "credential_missing"),
            (Some("wrong"), 401, "credential_invalid"),
            (Some(agent.as_str()), 401, "credential_invalid"),
        ] {
            let (status, answer) = server.post_raw(&path, token, b"{not json");
            assert_eq!(status, code, "{path} {answer}");
            assert_eq!(answer["diagnostic"]["reason"], reason, "{path} {answer}");
        }
    }
    let (status, answer) = server.get("/v1/runs?limit=0", Some("wrong"));
    assert_eq!(
        (status, &answer["diagnostic"]["reason"]),
        (401, &json!("credential_invalid"))
    );
    let (status, answer) = server.get("/v1/runs?limit=0", Some(ADMIN));
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        problems(&answer),
        ["`limit` must be an integer from 1 to 1000"]
    );
}

#[test]
fn a_tool_call_body_is_read_whole_and_a_refused_one_is_audited() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let token = common::token("research_agent");
    // A field given twice: the last one counts, as in any JSON object.
    let body = format!(
        r#"{{"role_id": "nobody", "role_id": "research_agent", "run_id": "{run}", "lane_id": "research", "tool_name": "case_lookup", "arguments": {{}}, "scope": {{"case_id": "C-1001"}}}}"#
    );
    let (code, answer) = server.post_raw("/v1/tool-calls", Some(&token), body.as_bytes());
    assert_eq!(
        (code, &answer["status"]),
        (200, &json!("success")),
        "{answer}"
    );
    // Not an object, not JSON, and wrong fields: each refused at step 1 and audited.
    let bad: [(&[u8], &str); 3] = [
        (b"[1, 2]", "the body must be a JSON object"),
        (b"{\"role_id\": ", "the body is not valid JSON"),
        (br#"{"extra": 1, "role_id": 5}"#, "unknown field `extra`"),
    ];
    for (body, problem) in bad {
        let (code, answer) = server.post_raw("/v1/tool-calls", Some(&token), body);
        assert_eq!(code, 400, "{answer}");
        assert_eq!(answer["diagnostic"]["reason"], "request_malformed");
        assert_eq!(answer["diagnostic"]["failed_step"], 1);
        assert!(problems(&answer)[0].starts_with(problem), "{answer}");
        let event_id = answer["audit_event_id"].as_str().unwrap().to_string();
        let (_, events) = server.get("/v1/audit/events?type=tool_denied&limit=1000", Some(ADMIN));
        let event = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["event_id"] == event_id.as_str())
            .unwrap_or_else(|| panic!("no closing event {event_id}: {events}"));
        assert_eq!(event["call_id"], answer["call_id"]);
        assert_eq!(event["reason"], "request_malformed");
    }
}

/// Issue 38, finding 10: a request carries one credential. With two `Authorization`
/// headers none is picked (neither the first nor the last): the request is malformed,
/// answered with the structured refusal and left unrecorded (nobody was
/// authenticated), except a tool call, which is still a call: refused at step 1 and
/// audited once under the ids its body names.
#[test]
fn two_authorization_headers_are_refused_as_malformed() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let send = |method: &str, path: &str, first: &str, second: &str, body: &Value| {
        let url = format!("{}{path}", server.base);
        let mut resp = match method {
            "GET" => agent
                .get(&url)
                .header("Authorization", &format!("Bearer {first}"))
                .header("Authorization", &format!("Bearer {second}"))
                .call(),
            _ => agent
                .post(&url)
                .header("Authorization", &format!("Bearer {first}"))
                .header("Authorization", &format!("Bearer {second}"))
                .header("Content-Type", "application/json")
                .send(body.to_string().as_bytes()),
        }
        .unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str::<Value>(&text).unwrap())
    };
    let malformed = |answer: &Value| {
        assert_eq!(
            answer["diagnostic"]["reason"], "request_malformed",
            "{answer}"
        );
        assert_eq!(
            problems(answer),
            ["header `Authorization` is given more than once"],
            "{answer}"
        );
    };
    let research = common::token("research_agent");
    for (method, path, body) in [
        ("GET", "/v1/runs".to_string(), json!({})),
        ("POST", "/v1/runs".to_string(), json!({"run_id": "twice"})),
        ("GET", format!("/v1/runs/{run}"), json!({})),
    ] {
        let (code, answer) = send(method, &path, ADMIN, ADMIN, &body);
        assert_eq!(code, 400, "{method} {path}: {answer}");
        malformed(&answer);
    }
    let (code, _) = server.get("/v1/runs/twice", Some(ADMIN));
    assert_eq!(code, 403, "nothing was created");

    let (_, before) = server.get("/v1/audit/events?limit=1000", Some(ADMIN));
    let before = before["events"].as_array().unwrap().len();
    let call = json!({
        "role_id": "research_agent", "run_id": run, "lane_id": "research",
        "tool_name": "case_lookup", "arguments": {}, "scope": {"case_id": "C-1001"},
    });
    for second in [research.as_str(), "nonsense"] {
        let (code, answer) = send("POST", "/v1/tool-calls", &research, second, &call);
        assert_eq!(code, 400, "{answer}");
        assert_eq!(answer["status"], "denied", "{answer}");
        assert_eq!(answer["diagnostic"]["failed_step"], 1, "{answer}");
        malformed(&answer);
    }
    let (_, after) = server.get("/v1/audit/events?limit=1000", Some(ADMIN));
    let added: Vec<Value> = after["events"].as_array().unwrap()[before..].to_vec();
    let types: Vec<&str> = added.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["tool_denied", "tool_denied"], "{added:#?}");
    for event in &added {
        assert_eq!(event["reason"], "request_malformed", "{event}");
        assert_eq!(event["run_id"], run.as_str(), "{event}");
        assert_eq!(event["tool_name"], "case_lookup", "{event}");
    }
    // One header: the same call runs.
    let (code, answer) = server.post("/v1/tool-calls", Some(&research), &call);
    assert_eq!(
        (code, &answer["status"]),
        (200, &json!("success")),
        "{answer}"
    );
}
