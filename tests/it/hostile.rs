//! Hostile input and sustained load (issue 13), against the real server: floods that
//! must leave one bounded audit event per request, the safety-lock race, idempotency
//! under repetition and scope changes, idle-socket floods, and malformed transport.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{ADMIN, Server, Start, token};
use serde_json::{Value, json};

/// Sends raw bytes on a fresh connection and reads the answer until the server closes
/// it (bounded by a 5 s timeout); returns the status and the parsed JSON body.
fn raw(base: &str, request: &[u8]) -> (u16, String, Value) {
    let addr = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // The server may answer and close before reading everything: ignore write errors.
    let _ = stream.write_all(request);
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not a JSON body ({e}): {text:?}"));
    (status, head.to_string(), body)
}

/// Bytes of the audit database after a clean stop (the WAL is checkpointed and
/// removed when the last connection closes).
fn stopped_db_bytes(data_dir: &Path) -> u64 {
    let wal = data_dir.join("audit.db-wal");
    std::fs::metadata(data_dir.join("audit.db")).unwrap().len()
        + std::fs::metadata(wal).map_or(0, |m| m.len())
}

fn start_in(data_dir: &Path, args: &[&str]) -> Server {
    Server::start_with(Start {
        data_dir: Some(data_dir.to_path_buf()),
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Start::default()
    })
}

/// Closing events by call, read straight from the database after a stop.
fn closing_lines(db: &Path) -> Vec<(String, String)> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT type, line FROM events WHERE type IN ('tool_denied','tool_failed','tool_executed','tool_timeout','tool_allowed') ORDER BY seq",
        )
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn nested(depth: usize) -> Value {
    let mut v = json!("leaf");
    for _ in 0..depth {
        v = json!({ "k": v });
    }
    v
}

#[test]
fn deep_nesting_flood_leaves_one_bounded_closing_event_per_request() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let server = start_in(&data, &[]);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    assert!(server.stop().success());
    let before = stopped_db_bytes(&data);
    let server = start_in(&data, &[]);
    let requests = 60;
    let t = token("research_agent");
    for i in 0..requests {
        // 100 levels: valid JSON for the parser, far past what is accepted.
        let mut scope = nested(100);
        scope["case_id"] = json!("C-1001");
        let body = match i % 3 {
            0 => json!({"role_id": "research_agent", "run_id": run, "lane_id": "research",
                "tool_name": "case_lookup", "arguments": {}, "scope": scope}),
            1 => json!({"role_id": "research_agent", "run_id": run, "lane_id": "research",
                "tool_name": "case_lookup", "arguments": nested(100), "scope": {"case_id": "C-1001"}}),
            // Deeper than the JSON parser accepts at all.
            _ => json!("x"),
        };
        let bytes = if i % 3 == 2 {
            format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes()
        } else {
            body.to_string().into_bytes()
        };
        // Wrong token on every other request: unauthenticated callers are bounded too.
        let tok = if i % 2 == 0 {
            t.clone()
        } else {
            "wrong".into()
        };
        let (code, resp) = server.post_raw("/v1/tool-calls", Some(&tok), &bytes);
        assert_eq!(code, 400, "{resp}");
        assert_eq!(resp["diagnostic"]["reason"], "request_malformed", "{resp}");
        assert_eq!(resp["diagnostic"]["failed_step"], 1, "{resp}");
        assert!(resp["audit_event_id"].is_string(), "{resp}");
    }
    // The same through MCP's scope header: refused, audited.
    let deep_header = nested(100).to_string();
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"case_lookup","arguments":{}}}"#;
    let mcp = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nAuthorization: Bearer {t}\r\nX-Toolgate-Role: research_agent\r\nX-Toolgate-Run: {run}\r\nX-Toolgate-Lane: research\r\nX-Toolgate-Scope: {deep_header}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{call}",
        call.len()
    );
    let (code, _, resp) = raw(&server.base, mcp.as_bytes());
    assert_eq!(code, 200, "{resp}");
    assert!(resp.to_string().contains("request_malformed"), "{resp}");
    assert!(server.stop().success());
    let lines = closing_lines(&data.join("audit.db"));
    assert_eq!(lines.len(), requests + 1, "one closing event per request");
    for (kind, line) in &lines {
        assert_eq!(kind, "tool_denied");
        assert!(line.len() < 4096, "bounded event: {} bytes", line.len());
        let event: Value = serde_json::from_str(line).unwrap();
        assert!(event["details"]["received"].is_object(), "{event}");
    }
    let grown = stopped_db_bytes(&data) - before;
    let per_request = grown / (requests as u64 + 2);
    assert!(
        per_request < 10 * 1024,
        "{per_request} bytes per refused request"
    );
}

#[test]
fn one_megabyte_scope_wrong_token_flood_stays_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let server = start_in(&data, &[]);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    assert!(server.stop().success());
    let before = stopped_db_bytes(&data);
    let server = start_in(&data, &[]);
    let requests = 100;
    let big = "A".repeat(1_000_000);
    let body = json!({"role_id": "research_agent", "run_id": run, "lane_id": "research",
        "tool_name": "case_lookup", "arguments": {}, "scope": {"case_id": "C-1001", "pad": big}})
    .to_string();
    assert!(body.len() < 1024 * 1024);
    let started = Instant::now();
    for _ in 0..requests {
        let (code, resp) = server.post_raw("/v1/tool-calls", Some("not-a-token"), body.as_bytes());
        assert_eq!(code, 400, "{resp}");
        assert!(resp["audit_event_id"].is_string(), "{resp}");
    }
    eprintln!("{requests} x 1 MB refused in {:?}", started.elapsed());
    // A small wrong-token call (within the bounds) is refused at step 2 and its scope
    // kept only as a digest.
    let (code, resp) = server.post(
        "/v1/tool-calls",
        Some("not-a-token"),
        &json!({"role_id": "research_agent", "run_id": run, "lane_id": "research",
            "tool_name": "case_lookup", "arguments": {}, "scope": {"case_id": "C-1001", "note": "x".repeat(10_000)}}),
    );
    assert_eq!(
        (code, resp["diagnostic"]["reason"].as_str()),
        (401, Some("credential_invalid")),
        "{resp}"
    );
    // 100,000 unknown fields in a body under 1 MiB: ten named, the rest counted.
    let fields: Vec<String> = (0..100_000).map(|i| format!("\"{i:x}\":0")).collect();
    let many = format!("{{{}}}", fields.join(","));
    assert!(many.len() < 1024 * 1024);
    let (code, resp) = server.post_raw("/v1/tool-calls", None, many.as_bytes());
    assert_eq!(code, 400, "{resp}");
    assert!(resp["audit_event_id"].is_string(), "{resp}");
    assert!(
        resp["diagnostic"]["details"]["problems"]
            .as_array()
            .unwrap()
            .contains(&json!("99990 more unknown fields")),
        "{resp}"
    );
    assert!(server.stop().success());
    let lines = closing_lines(&data.join("audit.db"));
    assert_eq!(lines.len(), requests + 2);
    for (_, line) in &lines {
        assert!(line.len() < 4096, "{} bytes", line.len());
        let event: Value = serde_json::from_str(line).unwrap();
        if event["details"]["received"]["scope"].is_null() {
            continue; // the body of unknown fields had no scope
        }
        assert!(
            event["details"]["scope"].is_null(),
            "no raw scope kept: {event}"
        );
        let digest = &event["details"]["received"]["scope"];
        assert_eq!(digest["sha256"].as_str().unwrap().len(), 64, "{event}");
        assert!(digest["excerpt"].as_str().unwrap().chars().count() <= 256);
    }
    let grown = stopped_db_bytes(&data) - before;
    let per_request = grown / (requests as u64 + 1);
    assert!(
        per_request < 10 * 1024,
        "{per_request} bytes per refused request"
    );
}

/// The enforced lock state and the last audited lock event, as (engaged, reason).
fn lock_states(
    server: &Server,
    after_seq: &mut u64,
    last: &mut Option<(bool, String)>,
) -> (bool, String) {
    loop {
        let (code, page) = server.get(
            &format!("/v1/audit/events?after_seq={after_seq}&limit=1000"),
            Some(ADMIN),
        );
        assert_eq!(code, 200, "{page}");
        let events = page["events"].as_array().unwrap();
        if events.is_empty() {
            break;
        }
        for e in events {
            *after_seq = e["seq"].as_u64().unwrap();
            match e["type"].as_str().unwrap() {
                "safety_lock_engaged" | "safety_lock_released" => {
                    *last = Some((
                        e["type"] == "safety_lock_engaged",
                        e["details"]["reason"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    ));
                }
                _ => {}
            }
        }
    }
    let (code, state) = server.get("/v1/safety-lock", Some(ADMIN));
    assert_eq!(code, 200, "{state}");
    (
        state["engaged"].as_bool().unwrap(),
        state["reason"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn safety_lock_race_audited_order_is_enforced_order_also_after_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    // NORMAL durability keeps the 3,200 changes quick; the ordering is the same.
    let server = start_in(&data, &["--durability", "normal"]);
    let trials = 200;
    let concurrent = 16;
    let mut after_seq = 0;
    let mut last = None;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    for trial in 0..trials {
        let barrier = Arc::new(Barrier::new(concurrent));
        let handles: Vec<_> = (0..concurrent)
            .map(|i| {
                let (barrier, agent, base) = (barrier.clone(), agent.clone(), server.base.clone());
                std::thread::spawn(move || {
                    let body = json!({"engaged": i % 2 == 0, "reason": format!("t{trial}-{i}")});
                    barrier.wait();
                    let resp = agent
                        .post(format!("{base}/v1/safety-lock"))
                        .header("Authorization", &format!("Bearer {ADMIN}"))
                        .send(body.to_string().as_bytes())
                        .unwrap();
                    let status = resp.status().as_u16();
                    let answer = resp.into_body().read_to_string().unwrap_or_default();
                    assert_eq!(status, 200, "{answer}");
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let enforced = lock_states(&server, &mut after_seq, &mut last);
        assert_eq!(Some(&enforced), last.as_ref(), "trial {trial}");
    }
    // Enforced on calls too: the state decides a call as it says.
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (_, resp) = server.look_up_case(&run);
    let engaged = last.as_ref().unwrap().0;
    assert_eq!(
        resp["diagnostic"]["reason"] == "safety_lock_engaged",
        engaged,
        "{resp}"
    );
    assert!(server.stop().success());
    let server = start_in(&data, &["--durability", "normal"]);
    let mut after = 0;
    let mut audited = None;
    let enforced = lock_states(&server, &mut after, &mut audited);
    assert_eq!(Some(&enforced), audited.as_ref(), "after restart");
    assert_eq!(audited, last);
}

#[test]
fn idempotent_repeats_are_audited_scoped_and_released_when_nothing_ran() {
    let server = Server::start();
    // A run without a case: the calls' scopes choose it.
    let run = server.create_run(json!({}));
    let t = token("drafting_agent");
    let body = json!({
        "role_id": "drafting_agent", "run_id": run, "lane_id": "drafting", "tool_name": "draft_document",
        "arguments": {"title": "Motion", "body": "Comes now the defendant."},
        "scope": {"case_id": "C-1001"}, "idempotency_key": "k-24",
    });
    // 24 identical calls at once: one execution, 24 closing events.
    let barrier = Arc::new(Barrier::new(24));
    let handles: Vec<_> = (0..24)
        .map(|_| {
            let (barrier, base, body, t) = (
                barrier.clone(),
                server.base.clone(),
                body.clone(),
                t.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                let mut resp = ureq::post(format!("{base}/v1/tool-calls"))
                    .header("Authorization", &format!("Bearer {t}"))
                    .send(body.to_string().as_bytes())
                    .unwrap();
                serde_json::from_str::<Value>(&resp.body_mut().read_to_string().unwrap()).unwrap()
            })
        })
        .collect();
    let responses: Vec<Value> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let firsts: Vec<&Value> = responses
        .iter()
        .filter(|r| r["replayed"] == false)
        .collect();
    assert_eq!(firsts.len(), 1, "{responses:?}");
    let first_id = firsts[0]["call_id"].clone();
    let event_ids: std::collections::BTreeSet<String> = responses
        .iter()
        .map(|r| r["audit_event_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(event_ids.len(), 24, "each call has its own closing event");
    for r in responses.iter().filter(|r| r["replayed"] == true) {
        assert_eq!(r["replay_of"], first_id);
        assert_eq!(r["output"], firsts[0]["output"]);
    }
    let events = |kind: &str| {
        let (_, page) = server.get(
            &format!("/v1/audit/events?run_id={run}&type={kind}&limit=1000"),
            Some(ADMIN),
        );
        page["events"].as_array().unwrap().clone()
    };
    assert_eq!(events("tool_requested").len(), 1);
    let executed = events("tool_executed");
    assert_eq!(executed.len(), 24);
    assert_eq!(
        executed
            .iter()
            .filter(|e| e["details"]["replay_of"]["call_id"] == first_id)
            .count(),
        23
    );

    // The same key and arguments under another scope: a conflict, audited, never
    // C-1001's answer.
    let mut other = body.clone();
    other["scope"] = json!({"case_id": "C-1002"});
    let (code, resp) = server.post("/v1/tool-calls", Some(&t), &other);
    assert_eq!(code, 409, "{resp}");
    assert_eq!(resp["diagnostic"]["reason"], "idempotency_conflict");
    assert!(resp["output"].is_null());
    assert!(resp["audit_event_id"].is_string());

    // Nothing reached the tool (no court upstream listens): retry is safe, the key is
    // released, and the retry executes again rather than replaying the failure.
    let draft = firsts[0]["output"]["draft_id"]
        .as_str()
        .unwrap()
        .to_string();
    let filing_run = server.create_run(json!({"case_id": "C-1001", "matter_id": "M-1"}));
    let filing = json!({
        "role_id": "filing_agent", "run_id": filing_run, "lane_id": "filing", "tool_name": "file_with_court",
        "arguments": {"draft_id": draft}, "scope": {"case_id": "C-1001", "matter_id": "M-1"},
        "idempotency_key": "file-1",
    });
    // The filing needs the attorney's approval first (docs/api.md, "Approvals").
    let (code, resp) = server.post("/v1/tool-calls", Some(&token("filing_agent")), &filing);
    assert_eq!(code, 409, "{resp}");
    let approval_id = resp["diagnostic"]["details"]["approval_id"].clone();
    let (code, resp) = server.post(
        &format!("/v1/approvals/{}/decision", approval_id.as_str().unwrap()),
        Some(&token("attorney")),
        &json!({"decision": "approve", "reason": "file it"}),
    );
    assert_eq!(code, 200, "{resp}");
    let mut filing = filing;
    filing["approval_id"] = approval_id;
    // Nothing reached the court: the approval is given back with the key.
    for attempt in 0..2 {
        let (code, resp) = server.post("/v1/tool-calls", Some(&token("filing_agent")), &filing);
        assert_eq!(code, 502, "{resp}");
        let d = &resp["diagnostic"];
        assert_eq!(d["reason"], "dependency_down");
        assert_eq!(d["details"]["reached_tool"], false, "{resp}");
        assert_eq!(d["retryable"], true, "{resp}");
        assert_eq!(d["details"]["retry_safe"], true, "{resp}");
        assert_eq!(resp["replayed"], false, "attempt {attempt}: {resp}");
    }
    let (_, page) = server.get(
        &format!("/v1/audit/events?run_id={filing_run}&type=tool_requested"),
        Some(ADMIN),
    );
    assert_eq!(page["events"].as_array().unwrap().len(), 2);
}

/// Raises this process's open-files soft limit to at least `want` (up to the hard
/// limit); returns the limit in force.
fn raise_nofile(want: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < want {
            limit.rlim_cur = want.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        }
    }
    limit.rlim_cur
}

#[test]
fn health_answers_within_100ms_under_5000_idle_sockets() {
    let sockets = 5000;
    let limit = raise_nofile(sockets as u64 + 512);
    assert!(
        limit >= sockets as u64 + 256,
        "open-files limit {limit} is too low for this test"
    );
    let server = Server::start();
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut idle = Vec::with_capacity(sockets);
    for _ in 0..sockets {
        idle.push(TcpStream::connect(&addr).unwrap());
    }
    // The accept loop takes connections in order, so an answer on a connection made
    // after the 5,000 shows that none of them left it waiting; every answer is timed,
    // the first one included.
    for path in ["/healthz", "/readyz"] {
        for _ in 0..5 {
            let started = Instant::now();
            let (code, _, body) = raw(
                &server.base,
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            );
            let took = started.elapsed();
            assert_eq!(code, 200, "{body}");
            assert!(took < Duration::from_millis(100), "{path} took {took:?}");
        }
    }
    // Anything else from this over-the-cap client: a structured 429.
    let (code, head, body) = raw(
        &server.base,
        b"POST /v1/tool-calls HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_eq!(code, 429, "{head}");
    assert_eq!(body["diagnostic"]["reason"], "rate_limited");
    drop(idle);
}

#[test]
fn request_rate_per_client_is_limited_with_a_structured_429() {
    let server = Server::start_with(Start {
        args: vec!["--max-requests-per-second-per-client".into(), "5".into()],
        ..Start::default()
    });
    let mut limited = None;
    for _ in 0..50 {
        let (code, body) = server.get("/v1/policy", Some(ADMIN));
        if code == 429 {
            limited = Some(body);
            break;
        }
    }
    let body = limited.expect("the 11th request within a second is limited");
    assert_eq!(body["diagnostic"]["reason"], "rate_limited");
    assert!(
        body["diagnostic"]["details"]["retry_after_ms"]
            .as_u64()
            .unwrap()
            >= 1
    );
    // Health stays answerable.
    assert_eq!(server.get("/healthz", None).0, 200);
}

#[test]
fn every_malformed_transport_case_answers_json() {
    let server = Server::start();
    let base = &server.base;
    let long_uri = format!("/{}", "a".repeat(100 * 1024));
    let many_headers: String = (0..1000).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("bad request line", b"GARBAGE\r\n\r\n".to_vec(), 400, "request_malformed"),
        ("nul in a header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n".to_vec(), 400, "request_malformed"),
        ("negative content-length", b"POST /v1/tool-calls HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".to_vec(), 400, "request_malformed"),
        ("1000 headers", format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n").into_bytes(), 431, "request_too_large"),
        ("100 KB uri", format!("GET {long_uri} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes(), 414, "request_too_large"),
        ("obsolete line folding", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  folded\r\n\r\n".to_vec(), 400, "request_malformed"),
        ("content-length and transfer-encoding", b"POST /v1/tool-calls HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), 400, "request_malformed"),
        ("transfer-encoding and content-length", b"POST /v1/tool-calls HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n".to_vec(), 400, "request_malformed"),
        ("chunked body", b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n".to_vec(), 400, "request_malformed"),
        ("wrong method", b"DELETE /v1/tool-calls HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), 405, "method_not_allowed"),
        ("token with a leading space", format!("GET /v1/policy HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer  {ADMIN}\r\nConnection: close\r\n\r\n").into_bytes(), 401, "credential_invalid"),
        ("token after a tab", format!("GET /v1/policy HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\t{ADMIN}\r\nConnection: close\r\n\r\n").into_bytes(), 401, "credential_invalid"),
        ("mcp wrong method", b"GET /mcp HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), 405, "method_not_allowed"),
    ];
    for (name, request, status, reason) in cases {
        let (code, head, body) = raw(base, &request);
        assert_eq!(code, status, "{name}: {head} {body}");
        assert_eq!(body["diagnostic"]["reason"], reason, "{name}: {body}");
        if status == 405 {
            assert!(
                head.to_ascii_lowercase().contains("\r\nallow: "),
                "{name}: {head}"
            );
        }
    }
    // The exact token is accepted.
    let (code, _, body) = raw(
        base,
        format!("GET /v1/policy HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(code, 200, "{body}");
    // MCP: malformed JSON is a JSON-RPC parse error.
    let junk = "{not json";
    let (code, _, body) = raw(
        base,
        format!("POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{junk}", junk.len()).as_bytes(),
    );
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["code"], -32700, "{body}");
    // Still healthy.
    assert_eq!(server.get("/healthz", None).0, 200);
}

/// The cap holds the database and its WAL together (the WAL counted at its bound), and
/// the reserve under it is shared: callers who prove nothing can fill the refusals'
/// half of it with recorded refusals, never the half kept for admin changes. Past that
/// point calls are refused unrecorded, and counted.
#[test]
fn audit_capacity_refuses_new_calls_before_the_cap() {
    const MIN_CAP: u64 = 64 * 1024 * 1024;
    // Under the least accepted cap, `serve` refuses to start.
    let scratch = tempfile::tempdir().unwrap();
    let mut serve = std::process::Command::new(common::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--max-audit-bytes"])
        .arg((MIN_CAP - 1).to_string())
        .arg("--data-dir")
        .arg(scratch.path())
        .current_dir(common::repo())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = common::poll_for(Duration::from_secs(10), || serve.try_wait().unwrap());
    if exited.is_none() {
        let _ = serve.kill();
    }
    let out = serve.wait_with_output().unwrap();
    assert_eq!(exited.and_then(|s| s.code()), Some(4), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--max-audit-bytes"),
        "{out:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("var");
    let server = start_in(&data, &["--max-audit-bytes", &MIN_CAP.to_string()]);
    let run = server.create_run(json!({"case_id": "C-1001"}));
    // Grow the log past the point where less than the reserve is left.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut refused = None;
    let pad = "p".repeat(8000);
    while Instant::now() < deadline {
        let (code, resp) = server.call(
            "research_agent",
            &run,
            "research",
            "legal_search",
            json!({"query": pad}),
            json!({"case_id": "C-1001"}),
        );
        if resp["diagnostic"]["reason"] == "audit_capacity_exhausted" {
            assert_eq!(code, 503, "{resp}");
            refused = Some(resp);
            break;
        }
    }
    let resp = refused.expect("calls are refused before the cap");
    assert!(
        resp["audit_event_id"].is_string(),
        "the refusal is audited: {resp}"
    );
    let headroom = resp["diagnostic"]["details"]["headroom_bytes"]
        .as_u64()
        .unwrap();
    assert!(headroom < 4 * 1024 * 1024 && headroom > 0, "{resp}");
    // /metrics shows the headroom.
    let text = server.metrics();
    assert!(text.contains("toolgate_audit_headroom_bytes "), "{text}");
    assert!(
        text.contains(&format!("toolgate_audit_max_bytes {MIN_CAP}")),
        "{text}"
    );

    // A flood of calls with a wrong token: recorded refusals until the admin half of
    // the reserve, then refused unrecorded.
    let body = json!({"role_id": "research_agent", "run_id": run, "lane_id": "research",
        "tool_name": "case_lookup", "arguments": {}, "scope": {"case_id": "C-1001"}});
    let mut recorded = 0;
    let mut unrecorded = None;
    for _ in 0..30_000 {
        let (code, resp) = server.post("/v1/tool-calls", Some("not-a-token"), &body);
        assert_eq!(code, 503, "{resp}");
        if resp["audit_event_id"].is_string() {
            recorded += 1;
        } else {
            unrecorded = Some(resp);
            break;
        }
    }
    let unrecorded = unrecorded.expect("refusals were recorded past the admin reserve");
    assert_eq!(
        unrecorded["diagnostic"]["details"]["recorded"], false,
        "{unrecorded}"
    );
    assert_eq!(
        unrecorded["diagnostic"]["reason"], "audit_capacity_exhausted",
        "{unrecorded}"
    );
    eprintln!("{recorded} refusals recorded before the admin reserve");
    for _ in 0..200 {
        let (code, _) = server.post("/v1/tool-calls", Some("not-a-token"), &body);
        assert_eq!(code, 503);
    }
    let counted = server
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix("toolgate_calls_unrecorded_total "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(counted >= 1, "{}", server.metrics());
    // Admin changes still fit in the reserve: a run, and the lock.
    let (code, body) = server.post("/v1/runs", Some(ADMIN), &json!({"scope": {}}));
    assert_eq!(code, 201, "{body}");
    let (code, body) = server.post("/v1/safety-lock", Some(ADMIN), &json!({"engaged": true}));
    assert_eq!(code, 200, "{body}");
    assert!(server.stop().success());
    // The database and its WAL stayed within the cap, and the log verifies.
    let used = stopped_db_bytes(&data);
    assert!(
        used <= MIN_CAP,
        "{used} bytes on disk over a {MIN_CAP}-byte cap"
    );
    let out = std::process::Command::new(common::BIN)
        .args(["audit", "verify", "--db"])
        .arg(data.join("audit.db"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_closed_run_is_still_refused_as_not_active_and_its_id_stays_taken() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, _) = server.post(
        &format!("/v1/runs/{run}/status"),
        Some(ADMIN),
        &json!({"status": "closed"}),
    );
    assert_eq!(code, 200);
    let (code, resp) = server.look_up_case(&run);
    assert_eq!(
        (code, resp["diagnostic"]["reason"].as_str()),
        (403, Some("run_not_active")),
        "{resp}"
    );
    // Its id cannot be taken again.
    let (code, resp) = server.post("/v1/runs", Some(ADMIN), &json!({"run_id": run}));
    assert_eq!(code, 400, "{resp}");
}

/// The call-budget policy (`budgets.rs`) whose `slow_limited` tool, once started,
/// touches `<gate>/started` and runs until `<gate>/go` exists; returns the gate folder.
fn held_tool_policy(dir: &Path) -> (std::path::PathBuf, Start) {
    use std::os::unix::fs::PermissionsExt;
    let gate = dir.join("gate");
    std::fs::create_dir(&gate).unwrap();
    // The tool runs confined (as an unprivileged user when the tests run as root): it
    // may run /usr/bin's programs and write in the gate, which that user can reach.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&gate, std::fs::Permissions::from_mode(0o777)).unwrap();
    let held = format!(
        "touch {0}/started; while [ ! -e {0}/go ]; do sleep 0.02; done",
        gate.display()
    );
    let confined = format!(
        "echo \\\"$line\\\"\"], env_allowlist: [PATH], sandbox: {{filesystem: {{exec: [/usr/bin], write: [{}]}}}}}}",
        gate.display()
    );
    let tools = crate::budgets::TOOLS
        .replace("sleep 0.3", &held)
        .replace("echo \\\"$line\\\"\"], env_allowlist: [PATH]}", &confined);
    assert!(
        tools.contains(&confined),
        "the budgets policy changed shape"
    );
    (gate, crate::budgets::write_policy(dir, &tools))
}

/// Posts `body` as the `tester` role on a thread of its own; the answer (status and
/// JSON) arrives on the returned channel.
fn post_as_tester(server: &Server, body: Value) -> std::sync::mpsc::Receiver<(u16, Value)> {
    let base = server.base.clone();
    let (sent, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut resp = ureq::post(format!("{base}/v1/tool-calls"))
            .header("Authorization", &format!("Bearer {}", token("tester")))
            .config()
            .http_status_as_error(false)
            .build()
            .send(body.to_string().as_bytes())
            .unwrap();
        let code = resp.status().as_u16();
        let body: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
        let _ = sent.send((code, body));
    });
    answer
}

/// A repeat of an idempotency key still in flight waits for the first call's outcome,
/// but within its own deadline and only while its caller waits: it closes as
/// `tool_timeout` when its own `timeout_ms` runs out and as `cancelled` when its caller
/// goes away, each with its own event, and the first call's outcome is unchanged.
#[test]
fn a_repeat_waiting_on_its_key_keeps_its_own_deadline_and_its_callers_patience() {
    let dir = tempfile::tempdir().unwrap();
    let (gate, start) = held_tool_policy(dir.path());
    let server = Server::start_with(Start {
        data_dir: Some(dir.path().join("data")),
        ..start
    });
    let run = server.create_run(json!({}));
    let body = |timeout_ms: u64| {
        json!({
            "role_id": "tester", "run_id": run, "lane_id": "ops", "tool_name": "slow_limited",
            "arguments": {"n": 1}, "scope": {}, "idempotency_key": "k-held",
            "timeout_ms": timeout_ms,
        })
    };
    let post_in_thread = |timeout_ms: u64| post_as_tester(&server, body(timeout_ms));
    let release = || std::fs::write(gate.join("go"), b"").unwrap();
    let first = post_in_thread(15_000);
    assert!(
        common::poll_until(Duration::from_secs(10), || gate.join("started").exists()),
        "the first call never reached its tool"
    );

    // A repeat with a 300 ms budget: refused when its own deadline passes, not when
    // the first call ends.
    let waited = post_in_thread(300).recv_timeout(Duration::from_secs(10));
    let Ok((code, resp)) = waited else {
        release();
        panic!("the repeat waited past its own deadline");
    };
    assert_eq!(code, 504, "{resp}");
    assert_eq!(resp["diagnostic"]["reason"], "tool_timeout", "{resp}");
    assert_eq!(resp["replayed"], false, "{resp}");
    assert!(resp["audit_event_id"].is_string(), "{resp}");
    let timed_out_call = resp["call_id"].as_str().unwrap().to_string();

    // A repeat whose caller goes away: closed as cancelled at once.
    let request = body(15_000).to_string();
    let addr = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /v1/tool-calls HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{request}",
        token("tester"),
        request.len()
    )
    .unwrap();
    let failed = |server: &Server| {
        let (_, page) = server.get(
            &format!("/v1/audit/events?run_id={run}&type=tool_failed&limit=100"),
            Some(ADMIN),
        );
        page["events"].as_array().unwrap().clone()
    };
    // The server holds the request once two calls are in flight; then the caller leaves.
    let accepted = common::poll_until(Duration::from_secs(10), || {
        server
            .metrics()
            .lines()
            .any(|l| l.starts_with("toolgate_calls_in_flight ") && l.ends_with(" 2"))
    });
    assert!(accepted, "{}", server.metrics());
    drop(stream);
    let cancelled = common::poll_for(Duration::from_secs(10), || {
        let events = failed(&server);
        (!events.is_empty()).then_some(events)
    });
    release();
    let cancelled =
        cancelled.expect("the abandoned repeat was not closed while the first call ran");
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert_eq!(cancelled[0]["reason"], "cancelled", "{cancelled:?}");

    let (code, resp) = first.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!((code, &resp["replayed"]), (200, &json!(false)), "{resp}");
    let (code, again) = server.post("/v1/tool-calls", Some(&token("tester")), &body(15_000));
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["replay_of"], resp["call_id"], "{again}");

    let (_, page) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=100"),
        Some(ADMIN),
    );
    let events = page["events"].as_array().unwrap();
    let of = |kind: &str| events.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(
        of("tool_requested"),
        1,
        "only the first call ran: {events:?}"
    );
    assert_eq!(of("tool_timeout"), 1, "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "tool_timeout" && e["call_id"] == timed_out_call.as_str()),
        "{events:?}"
    );
}

/// An idempotent call whose tool ran but whose closing event the log could not take
/// (the signer went away) is answered `audit_unavailable`, retryable; the retry with
/// the same key must run again once the log is back, not replay that failure.
#[test]
fn an_outcome_the_log_could_not_record_is_not_replayed_to_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let (gate, start) = held_tool_policy(dir.path());
    let (signer_keys, socket) = (
        dir.path().join("signer-keys"),
        dir.path().join("signer.sock"),
    );
    let start_signer = || {
        let mut child = std::process::Command::new(common::BIN)
            .arg("signer")
            .arg("--key-dir")
            .arg(&signer_keys)
            .arg("--socket")
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let listening = common::poll_until(Duration::from_secs(20), || {
            assert!(child.try_wait().unwrap().is_none(), "the signer exited");
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        });
        assert!(listening, "the signer did not start");
        child
    };
    let mut signer = start_signer();
    let server = Server::start_with(Start {
        data_dir: Some(dir.path().join("data")),
        args: vec![
            "--signer-socket".into(),
            socket.display().to_string(),
            "--key-dir".into(),
            dir.path().join("gateway-keys").display().to_string(),
        ],
        ..start
    });
    let run = server.create_run(json!({}));
    let body = json!({
        "role_id": "tester", "run_id": run, "lane_id": "ops", "tool_name": "slow_limited",
        "arguments": {"n": 1}, "scope": {}, "idempotency_key": "k-unrecorded",
    });
    let first = post_as_tester(&server, body.clone());
    assert!(
        common::poll_until(Duration::from_secs(10), || gate.join("started").exists()),
        "the first call never reached its tool"
    );
    // The tool is running: the signer goes away, then the tool finishes.
    signer.kill().unwrap();
    signer.wait().unwrap();
    std::fs::write(gate.join("go"), b"").unwrap();
    let (code, resp) = first.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(code, 503, "{resp}");
    assert_eq!(resp["diagnostic"]["reason"], "audit_unavailable", "{resp}");
    assert_eq!(resp["diagnostic"]["retryable"], true, "{resp}");

    // The log is back: the retry runs the (idempotent) tool again.
    let mut signer = start_signer();
    std::fs::remove_file(gate.join("started")).unwrap();
    let (code, retry) = server.post("/v1/tool-calls", Some(&token("tester")), &body);
    assert_eq!(code, 200, "{retry}");
    assert_eq!(retry["replayed"], false, "{retry}");
    assert!(
        gate.join("started").exists(),
        "the retry did not run the tool"
    );
    assert_eq!(server.stop().code(), Some(0));
    signer.kill().unwrap();
    signer.wait().unwrap();
}
