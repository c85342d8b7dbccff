//! The request path through `server::handle`, without a socket: the route table
//! (every endpoint routed, 405 with its path's `Allow`, 404), the typed queries, and a
//! refusal's response (status, `Allow`, `Retry-After`, `WWW-Authenticate`, JSON body).
//!
//! The gateway is the real one, on the demo policy and a real audit log in a temporary
//! directory; only the socket is left out.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::HeaderMap;
use hyper::{Method, Request, StatusCode};
use rstest::rstest;
use serde_json::{Value, json};
use tempfile::TempDir;
use toolgate::audit::{AuditLog, AuditOptions, EventFilter, EventType};
use toolgate::gateway::{Gateway, Loaded, PolicySourcePaths, adapter_env};
use toolgate::limits::LimitOptions;
use toolgate::policy::Policy;
use toolgate::server::{RequestBody, ServerOptions, Shared, handle};

use crate::common::{ADMIN, repo, token};

/// The gateway behind `server::handle`, on the demo policy (edited by `edit`).
struct Front {
    shared: Shared,
    audit: AuditLog,
    _dir: TempDir,
}

/// One response, read whole.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    bytes: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or_else(|e| {
            panic!(
                "{} is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.bytes)
            )
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// The diagnostic's reason of a refusal (None for any other answer).
    fn reason(&self) -> Option<String> {
        let body: Value = serde_json::from_slice(&self.bytes).ok()?;
        body["diagnostic"]["reason"].as_str().map(str::to_string)
    }
}

impl Front {
    async fn start(edit: impl FnOnce(&mut Policy), options: ServerOptions) -> Front {
        let dir = tempfile::tempdir().unwrap();
        let tools = repo().join("tools/tool_registry.yaml");
        let mut policy = toolgate::policy::load(&repo().join("policy"), &tools).unwrap();
        edit(&mut policy);
        let env = adapter_env(&tools, dir.path());
        let adapters = toolgate::adapter::build(&policy, &env).unwrap();
        let audit = AuditLog::open(AuditOptions::new(dir.path())).unwrap();
        let gateway = Gateway::start(
            Loaded::new(policy, adapters),
            audit.clone(),
            env,
            PolicySourcePaths {
                policy_dir: repo().join("policy"),
                tools_file: tools,
            },
        )
        .await
        .unwrap();
        Front {
            shared: Shared::new(Arc::new(gateway), options),
            audit,
            _dir: dir,
        }
    }

    async fn demo() -> Front {
        Front::start(|_| {}, ServerOptions::default()).await
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Answer {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(t) = bearer {
            request = request.header("authorization", format!("Bearer {t}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(RequestBody::from(Bytes::copy_from_slice(body)))
            .unwrap();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let response = handle(&self.shared, peer, request).await;
        let (head, body) = response.into_parts();
        Answer {
            status: head.status,
            headers: head.headers,
            bytes: body.collect().await.unwrap().to_bytes(),
        }
    }

    async fn create_run(&self) -> String {
        let body = br#"{"scope": {"case_id": "C-1001"}}"#;
        let answer = self
            .send(Method::POST, "/v1/runs", Some(ADMIN), &[], body)
            .await;
        assert_eq!(answer.status, StatusCode::CREATED);
        answer.json()["run_id"].as_str().unwrap().to_string()
    }

    async fn close(self) {
        drop(self.shared);
        self.audit.close().await.unwrap();
    }
}

/// Asserts the structured refusal's body and the headers every JSON answer carries.
fn assert_refusal_shape(answer: &Answer) {
    let body = answer.json();
    for key in ["status", "error_code", "error_message", "diagnostic"] {
        assert!(!body[key].is_null(), "no `{key}`: {body}");
    }
    assert_eq!(
        body["error_code"], body["diagnostic"]["error_code"],
        "{body}"
    );
    assert_eq!(
        body["error_message"], body["diagnostic"]["message"],
        "{body}"
    );
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("cache-control"), Some("no-store"));
}

/// Each endpoint reaches its own handler: the answer only that handler gives
/// (`{run}` is a run created first). `expect` is a key of the JSON answer, a reason,
/// or a header's value.
#[rstest]
#[case::call_tool(
    Method::POST,
    "/v1/tool-calls",
    "research_agent",
    "{}",
    400,
    "key:call_id"
)]
#[case::commit(
    Method::POST,
    "/v1/tool-calls/c-1/commit",
    "research_agent",
    "{}",
    400,
    "message:commit_id"
)]
#[case::create_run(Method::POST, "/v1/runs", "admin", "{}", 201, "key:run_id")]
#[case::list_runs(Method::GET, "/v1/runs", "admin", "", 200, "key:runs")]
#[case::get_run(Method::GET, "/v1/runs/{run}", "admin", "", 200, "key:scope")]
#[case::set_run_status(
    Method::POST,
    "/v1/runs/{run}/status",
    "admin",
    r#"{"status": "suspended"}"#,
    200,
    "key:status"
)]
#[case::repin_run(Method::POST, "/v1/runs/{run}/repin", "admin", "", 200, "key:repinned")]
#[case::revoke_run_token(
    Method::POST,
    "/v1/runs/{run}/tokens/t-none/revoke",
    "admin",
    "",
    400,
    "message:t-none"
)]
#[case::run_events(Method::GET, "/v1/runs/{run}/events", "admin", "", 200, "key:events")]
#[case::run_export(
    Method::GET,
    "/v1/runs/{run}/export",
    "admin",
    "",
    200,
    "header:content-disposition"
)]
#[case::list_tools(
    Method::GET,
    "/v1/tools?role_id=research_agent&lane_id=research",
    "research_agent",
    "",
    200,
    "key:tools"
)]
#[case::get_safety_lock(Method::GET, "/v1/safety-lock", "admin", "", 200, "key:engaged")]
#[case::set_safety_lock(
    Method::POST,
    "/v1/safety-lock",
    "admin",
    r#"{"engaged": false}"#,
    200,
    "key:engaged"
)]
#[case::audit_events(
    Method::GET,
    "/v1/audit/events",
    "admin",
    "",
    200,
    "key:next_after_seq"
)]
#[case::artifact(
    Method::GET,
    "/v1/artifacts/0000000000000000000000000000000000000000000000000000000000000000",
    "admin",
    "",
    404,
    "reason:artifact_not_found"
)]
#[case::list_approvals(Method::GET, "/v1/approvals", "admin", "", 200, "key:approvals")]
#[case::get_approval(
    Method::GET,
    "/v1/approvals/a-none",
    "admin",
    "",
    404,
    "reason:approval_unknown"
)]
#[case::decide_approval(
    Method::POST,
    "/v1/approvals/a-none/decision",
    "admin",
    r#"{"decision": "approve", "reason": "ok"}"#,
    404,
    "reason:approval_unknown"
)]
#[case::reload_policy(
    Method::POST,
    "/v1/policy/reload",
    "admin",
    "",
    200,
    "key:policy_versions"
)]
#[case::get_policy(Method::GET, "/v1/policy", "admin", "", 200, "key:source")]
#[case::metrics(
    Method::GET,
    "/metrics",
    "none",
    "",
    200,
    "header:content-type=application/openmetrics-text; version=1.0.0; charset=utf-8"
)]
#[case::health(Method::GET, "/healthz", "none", "", 200, "key:status")]
#[case::ready(Method::GET, "/readyz", "none", "", 200, "key:ready")]
#[case::resource_metadata(
    Method::GET,
    "/.well-known/oauth-protected-resource",
    "none",
    "",
    404,
    "message:identity providers"
)]
#[case::console(
    Method::GET,
    "/console",
    "none",
    "",
    200,
    "header:content-type=text/html; charset=utf-8"
)]
#[case::console_head(
    Method::HEAD,
    "/console/assets/console.js",
    "none",
    "",
    200,
    "header:content-type=text/javascript; charset=utf-8"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_reaches_its_handler(
    #[case] method: Method,
    #[case] path: &str,
    #[case] who: &str,
    #[case] body: &str,
    #[case] status: u16,
    #[case] expect: &str,
) {
    let front = Front::demo().await;
    let path = if path.contains("{run}") {
        path.replace("{run}", &front.create_run().await)
    } else {
        path.to_string()
    };
    let bearer = match who {
        "none" => None,
        "admin" => Some(ADMIN.to_string()),
        role => Some(token(role)),
    };
    let answer = front
        .send(method, &path, bearer.as_deref(), &[], body.as_bytes())
        .await;
    let text = String::from_utf8_lossy(&answer.bytes).into_owned();
    assert_eq!(answer.status.as_u16(), status, "{path}: {text}");
    let (kind, value) = expect.split_once(':').unwrap();
    match kind {
        "key" => assert!(
            !answer.json()[value].is_null(),
            "{path}: no `{value}` in {text}"
        ),
        "reason" => assert_eq!(answer.reason().as_deref(), Some(value), "{path}: {text}"),
        "message" => assert!(
            answer.json()["error_message"]
                .as_str()
                .is_some_and(|m| m.contains(value)),
            "{path}: {text}"
        ),
        "header" => match value.split_once('=') {
            Some((name, v)) => assert_eq!(answer.header(name), Some(v), "{path}"),
            None => assert!(answer.header(value).is_some(), "{path}: no {value}"),
        },
        _ => unreachable!("{expect}"),
    }
    front.close().await;
}

/// `POST /mcp` reaches the MCP front (its own JSON-RPC answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_reaches_the_front() {
    let front = Front::demo().await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2025-06-18"),
        ("host", "127.0.0.1"),
    ];
    let answer = front
        .send(Method::POST, "/mcp", None, &headers, body.as_bytes())
        .await;
    let text = String::from_utf8_lossy(&answer.bytes).into_owned();
    assert_eq!(answer.status, StatusCode::OK, "{text}");
    assert!(text.contains("\"jsonrpc\""), "{text}");
    front.close().await;
}

/// A path served with other methods: 405 `method_not_allowed`, its methods in `Allow`
/// and in `details.allow`, from the one route table.
#[rstest]
#[case("/v1/tool-calls", Method::GET, "POST")]
#[case("/v1/tool-calls/c-1/commit", Method::GET, "POST")]
#[case("/v1/runs", Method::DELETE, "GET, POST")]
#[case("/v1/runs/r-1", Method::POST, "GET")]
#[case("/v1/runs/r-1/status", Method::GET, "POST")]
#[case("/v1/runs/r-1/repin", Method::GET, "POST")]
#[case("/v1/runs/r-1/tokens/t-1/revoke", Method::GET, "POST")]
#[case("/v1/runs/r-1/events", Method::POST, "GET")]
#[case("/v1/runs/r-1/export", Method::POST, "GET")]
#[case("/v1/tools", Method::POST, "GET")]
#[case("/v1/safety-lock", Method::DELETE, "GET, POST")]
#[case("/v1/audit/events", Method::POST, "GET")]
#[case("/v1/artifacts/abc", Method::POST, "GET")]
#[case("/v1/approvals", Method::POST, "GET")]
#[case("/v1/approvals/a-1", Method::POST, "GET")]
#[case("/v1/approvals/a-1/decision", Method::GET, "POST")]
#[case("/v1/policy/reload", Method::GET, "POST")]
#[case("/v1/policy", Method::POST, "GET")]
#[case("/metrics", Method::POST, "GET")]
#[case("/healthz", Method::POST, "GET")]
#[case("/readyz", Method::PUT, "GET")]
#[case("/mcp", Method::GET, "POST")]
#[case("/mcp", Method::DELETE, "POST")]
#[case("/console", Method::POST, "GET, HEAD")]
#[case("/console/", Method::PUT, "GET, HEAD")]
#[case("/console/assets/console.js", Method::DELETE, "GET, HEAD")]
#[case("/console/assets/console.css", Method::POST, "GET, HEAD")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_405_with_the_paths_methods(
    #[case] path: &str,
    #[case] method: Method,
    #[case] allow: &str,
) {
    let front = Front::demo().await;
    let answer = front
        .send(method.clone(), path, Some(ADMIN), &[], b"")
        .await;
    assert_eq!(
        answer.status,
        StatusCode::METHOD_NOT_ALLOWED,
        "{method} {path}"
    );
    assert_refusal_shape(&answer);
    assert_eq!(answer.header("allow"), Some(allow), "{method} {path}");
    let body = answer.json();
    assert_eq!(body["diagnostic"]["reason"], "method_not_allowed");
    let listed: Vec<&str> = allow.split(", ").collect();
    assert_eq!(body["diagnostic"]["details"]["allow"], json!(listed));
    assert!(
        body["error_message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("`{method} {path}` is not served")),
        "{body}"
    );
    front.close().await;
}

/// A path that is no endpoint: 404 `endpoint_not_found`, with no `Allow`. A console
/// path is answered without a credential, like the console's files.
#[rstest]
#[case(Method::GET, "/", Some(ADMIN))]
#[case(Method::GET, "/v2/runs", Some(ADMIN))]
#[case(Method::POST, "/v1/tool-calls/c-1/commit/now", Some(ADMIN))]
#[case(Method::GET, "/v1/runs/r-1/events/1", Some(ADMIN))]
#[case(Method::GET, "/v1", Some(ADMIN))]
#[case(Method::GET, "/mcp/", Some(ADMIN))]
#[case(Method::POST, "/console/nope", None)]
#[case(Method::GET, "/console/assets/other.js", None)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_path_is_404(
    #[case] method: Method,
    #[case] path: &str,
    #[case] bearer: Option<&str>,
) {
    let front = Front::demo().await;
    let answer = front.send(method.clone(), path, bearer, &[], b"").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}");
    assert_refusal_shape(&answer);
    assert_eq!(answer.reason().as_deref(), Some("endpoint_not_found"));
    assert_eq!(answer.header("allow"), None);
    assert_eq!(
        answer.json()["error_message"],
        format!("no endpoint `{method} {path}`")
    );
    front.close().await;
}

/// Queries are typed per endpoint: an unknown or repeated parameter is refused 400
/// `request_malformed`, every problem named, where it used to be ignored; the
/// documented ones still work. Where the gateway takes the parsed request (run and
/// approval listings, a run's events, bodies), the credential is checked first.
#[rstest]
#[case(Method::GET, "/v1/runs?bogus=1", "admin", 400, &["unknown query parameter `bogus`"])]
#[case(Method::GET, "/v1/runs?limit=5&limit=6", "admin", 400, &["query parameter `limit` is given more than once"])]
#[case(Method::GET, "/v1/runs?bogus=1", "none", 401, &[])]
#[case(Method::GET, "/v1/runs?status=active&limit=5", "admin", 200, &[])]
#[case(Method::GET, "/v1/runs/r-1?verbose=1", "admin", 400, &["unknown query parameter `verbose`"])]
#[case(Method::GET, "/v1/runs/r-1/events?after_seq=0&page=2", "admin", 400, &["unknown query parameter `page`"])]
#[case(Method::GET, "/v1/runs/r-1/events?page=2", "none", 401, &[])]
#[case(Method::GET, "/v1/audit/events?type=tool_denied&type=tool_executed", "admin", 400, &["query parameter `type` is given more than once"])]
#[case(Method::GET, "/v1/audit/events?run=r-1&zz=1&aa=2", "admin", 400, &["unknown query parameter `aa`", "unknown query parameter `run`", "unknown query parameter `zz`"])]
#[case(Method::GET, "/v1/audit/events?run_id=r-1&limit=5&after_seq=0&type=tool_denied", "admin", 200, &[])]
#[case(Method::GET, "/v1/tools?role_id=research_agent&lane_id=research&debug=1", "research_agent", 400, &["unknown query parameter `debug`"])]
#[case(Method::GET, "/v1/artifacts/abc?run_id=r-1&role=x", "admin", 400, &["unknown query parameter `role`"])]
#[case(Method::GET, "/v1/approvals?status=pending&state=open", "admin", 400, &["unknown query parameter `state`"])]
#[case(Method::GET, "/v1/approvals?status=pending&state=open", "none", 401, &[])]
#[case(Method::GET, "/v1/approvals?status=pending&order=newest&limit=5&cursor=0", "admin", 200, &[])]
#[case(Method::POST, "/v1/runs?dry_run=1", "admin", 400, &["unknown query parameter `dry_run`"])]
#[case(Method::POST, "/v1/runs?dry_run=1", "none", 401, &[])]
#[case(Method::GET, "/v1/policy?x", "admin", 400, &["unknown query parameter `x`"])]
#[case(Method::GET, "/v1/safety-lock?x=1", "admin", 400, &["unknown query parameter `x`"])]
#[case(Method::GET, "/healthz?probe=1", "none", 400, &["unknown query parameter `probe`"])]
#[case(Method::GET, "/metrics?x=1", "none", 400, &["unknown query parameter `x`"])]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_names_only_its_endpoints_parameters(
    #[case] method: Method,
    #[case] path: &str,
    #[case] who: &str,
    #[case] status: u16,
    #[case] problems: &[&str],
) {
    let front = Front::demo().await;
    let bearer = match who {
        "none" => None,
        "admin" => Some(ADMIN.to_string()),
        role => Some(token(role)),
    };
    let answer = front.send(method, path, bearer.as_deref(), &[], b"").await;
    let text = String::from_utf8_lossy(&answer.bytes).into_owned();
    assert_eq!(answer.status.as_u16(), status, "{path}: {text}");
    if !problems.is_empty() {
        assert_refusal_shape(&answer);
        let body = answer.json();
        assert_eq!(body["diagnostic"]["reason"], "request_malformed", "{text}");
        assert_eq!(body["diagnostic"]["details"]["problems"], json!(problems));
        assert_eq!(
            body["error_message"],
            format!("malformed request: {}", problems[0])
        );
    }
    front.close().await;
}

/// A tool call with a query parameter is still a call: refused at step 1 and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_with_a_query_is_refused_and_audited() {
    let front = Front::demo().await;
    let run = front.create_run().await;
    let call = json!({
        "role_id": "research_agent", "run_id": run, "lane_id": "research",
        "tool_name": "case_lookup", "arguments": {"case_id": "C-1001"},
        "scope": {"case_id": "C-1001"},
    });
    let answer = front
        .send(
            Method::POST,
            "/v1/tool-calls?dry_run=true",
            Some(&token("research_agent")),
            &[],
            call.to_string().as_bytes(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let body = answer.json();
    assert_eq!(body["diagnostic"]["reason"], "request_malformed", "{body}");
    assert_eq!(body["diagnostic"]["failed_step"], 1, "{body}");
    assert_eq!(
        body["diagnostic"]["details"]["problems"],
        json!(["unknown query parameter `dry_run`"])
    );
    let denied = front
        .audit
        .events(EventFilter {
            event_types: vec![EventType::ToolDenied],
            ..EventFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(denied.len(), 1);
    assert_eq!(denied[0].value["call_id"], body["call_id"]);
    assert_eq!(denied[0].value["run_id"], json!(run));
    front.close().await;
}

/// Refusals become responses in one place: status, JSON body, and `Retry-After`,
/// `Allow`, `WWW-Authenticate` and `Connection: close` where the refusal calls for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_carry_their_status_body_and_headers() {
    let options = ServerOptions {
        max_body_bytes: 64,
        ..ServerOptions::default()
    };
    let front = Front::start(with_identity_provider, options).await;
    let limited = ServerOptions {
        limits: LimitOptions {
            max_requests_per_second_per_client: 1,
            ..LimitOptions::default()
        },
        ..ServerOptions::default()
    };
    let limited = Front::start(|_| {}, limited).await;
    let mut cases: Vec<Expected> = Vec::new();

    let answer = front
        .send(
            Method::POST,
            "/mcp",
            None,
            &[("host", "gate.example:8787")],
            b"{}",
        )
        .await;
    let challenge = r#"Bearer resource_metadata="http://gate.example:8787/.well-known/oauth-protected-resource/mcp""#;
    cases.push(Expected {
        name: "mcp without a credential",
        answer,
        status: 401,
        reason: "credential_missing",
        present: vec![("www-authenticate", challenge)],
        absent: vec!["allow", "retry-after"],
    });
    let answer = front
        .send(
            Method::PUT,
            "/.well-known/oauth-protected-resource/mcp",
            None,
            &[],
            b"",
        )
        .await;
    cases.push(Expected {
        name: "metadata with a wrong method",
        answer,
        status: 405,
        reason: "method_not_allowed",
        present: vec![("allow", "GET")],
        absent: vec!["www-authenticate", "retry-after"],
    });
    let answer = front.send(Method::GET, "/v1/policy", None, &[], b"").await;
    cases.push(Expected {
        name: "api without a credential (no challenge: only /mcp has one)",
        answer,
        status: 401,
        reason: "credential_missing",
        present: vec![],
        absent: vec!["www-authenticate", "allow", "retry-after"],
    });
    let answer = front
        .send(
            Method::GET,
            "/healthz",
            None,
            &[("transfer-encoding", "chunked")],
            b"",
        )
        .await;
    cases.push(Expected {
        name: "transfer-encoding",
        answer,
        status: 400,
        reason: "request_malformed",
        present: vec![("connection", "close")],
        absent: vec!["allow", "retry-after"],
    });
    let answer = front
        .send(Method::GET, "/readyz", None, &[], &[b'x'; 65])
        .await;
    cases.push(Expected {
        name: "a body over the limit",
        answer,
        status: 413,
        reason: "request_too_large",
        present: vec![],
        absent: vec!["allow", "retry-after", "www-authenticate"],
    });
    // The bucket holds two requests and refills one a second: of ten sent at once,
    // one is over the rate whatever the machine's pauses.
    let mut over = None;
    for _ in 0..10 {
        let answer = limited
            .send(Method::GET, "/v1/policy", Some(ADMIN), &[], b"")
            .await;
        if answer.status != StatusCode::OK {
            over = Some(answer);
            break;
        }
    }
    let answer = over.expect("ten requests at one a second");
    cases.push(Expected {
        name: "over the request rate",
        answer,
        status: 429,
        reason: "rate_limited",
        present: vec![("retry-after", "1")],
        absent: vec!["allow", "www-authenticate"],
    });
    // The probes are not counted.
    let answer = limited.send(Method::GET, "/healthz", None, &[], b"").await;
    assert_eq!(answer.status, StatusCode::OK);

    for case in &cases {
        let (name, answer) = (case.name, &case.answer);
        assert_eq!(answer.status.as_u16(), case.status, "{name}");
        assert_refusal_shape(answer);
        assert_eq!(answer.reason().as_deref(), Some(case.reason), "{name}");
        for (header, value) in &case.present {
            assert_eq!(answer.header(header), Some(*value), "{name}: {header}");
        }
        for header in &case.absent {
            assert_eq!(answer.header(header), None, "{name}: {header}");
        }
    }
    let metadata = front
        .send(
            Method::GET,
            "/.well-known/oauth-protected-resource",
            None,
            &[],
            b"",
        )
        .await;
    assert_eq!(metadata.status, StatusCode::OK);
    assert_eq!(metadata.json()["resource"], "http://localhost/mcp");
    front.close().await;
    limited.close().await;
}

/// One refusal and what its response must carry.
struct Expected {
    name: &'static str,
    answer: Answer,
    status: u16,
    reason: &'static str,
    /// Headers that must be there, with their values.
    present: Vec<(&'static str, &'static str)>,
    /// Headers that must not be.
    absent: Vec<&'static str>,
}

/// The demo policy with one identity provider (the MCP front's authorization and the
/// protected-resource metadata turn on; no key set is ever fetched here).
fn with_identity_provider(policy: &mut Policy) {
    use toolgate::policy::{IdentityProvider, JwksSource};
    policy.identity.providers.insert(
        "idp".into(),
        IdentityProvider {
            id: "idp".into(),
            issuer: "https://idp.example".into(),
            audience: "toolgate".into(),
            jwks: JwksSource::File(Path::new("jwks.json").to_path_buf()),
            algorithms: vec!["ES256".into()],
            leeway_s: 0,
            jwks_refresh_s: 300,
            jwks_cooldown_s: 10,
        },
    );
}

/// Authenticate, then parse: on every endpoint of the admin API (and a commit), a
/// caller without a valid credential is refused for its credential whatever its query
/// and body hold, and only an authenticated caller learns that its request is
/// malformed. `good` is a credential the endpoint accepts; `body` is malformed JSON
/// where the endpoint reads a body (None: it reads none, and its query is the
/// malformed part).
#[rstest]
#[case::commit(Method::POST, "/v1/tool-calls/c-1/commit", "research_agent", Some("{"))]
#[case::create_run(Method::POST, "/v1/runs", "admin", Some("{"))]
#[case::list_runs(Method::GET, "/v1/runs", "admin", None)]
#[case::get_run(Method::GET, "/v1/runs/{run}", "admin", None)]
#[case::set_run_status(Method::POST, "/v1/runs/{run}/status", "admin", Some("{"))]
#[case::repin_run(Method::POST, "/v1/runs/{run}/repin", "admin", Some("{"))]
#[case::revoke_run_token(Method::POST, "/v1/runs/{run}/tokens/t-none/revoke", "admin", None)]
#[case::run_events(Method::GET, "/v1/runs/{run}/events", "admin", None)]
#[case::run_export(Method::GET, "/v1/runs/{run}/export", "admin", None)]
#[case::get_safety_lock(Method::GET, "/v1/safety-lock", "research_agent", None)]
#[case::set_safety_lock(Method::POST, "/v1/safety-lock", "admin", Some("{"))]
#[case::audit_events(Method::GET, "/v1/audit/events", "admin", None)]
#[case::list_approvals(Method::GET, "/v1/approvals", "research_agent", None)]
#[case::get_approval(Method::GET, "/v1/approvals/a-none", "admin", None)]
#[case::decide_approval(Method::POST, "/v1/approvals/a-none/decision", "admin", Some("{"))]
#[case::reload_policy(Method::POST, "/v1/policy/reload", "admin", None)]
#[case::get_policy(Method::GET, "/v1/policy", "research_agent", None)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credential_is_checked_before_the_request_is_read(
    #[case] method: Method,
    #[case] path: &str,
    #[case] good: &str,
    #[case] body: Option<&str>,
) {
    let front = Front::demo().await;
    let path = if path.contains("{run}") {
        path.replace("{run}", &front.create_run().await)
    } else {
        path.to_string()
    };
    let good = match good {
        "admin" => ADMIN.to_string(),
        role => token(role),
    };
    // Malformed both ways where there is a body: an unknown query parameter, and a
    // body that is not JSON.
    let (path, body) = match body {
        Some(body) => (path, body.as_bytes()),
        None => (format!("{path}?bogus=1"), &b""[..]),
    };
    let cases = [
        (None, 401, "credential_missing"),
        (Some("not-a-known-credential"), 401, "credential_invalid"),
        (Some(good.as_str()), 400, "request_malformed"),
    ];
    for (bearer, status, reason) in cases {
        let answer = front.send(method.clone(), &path, bearer, &[], body).await;
        let text = String::from_utf8_lossy(&answer.bytes).into_owned();
        let who = bearer.map_or("no credential", |_| "a credential");
        assert_eq!(answer.status.as_u16(), status, "{path} with {who}: {text}");
        assert_refusal_shape(&answer);
        assert_eq!(answer.reason().as_deref(), Some(reason), "{path}: {text}");
    }
    front.close().await;
}

/// The proofs an endpoint asks for, told apart: a role's credential is not an admin's,
/// an `audit_read` admin reads but never changes, a run token reads its own approvals
/// but never decides; each refused before its (malformed) request is read.
#[rstest]
#[case::role_creates_a_run(Method::POST, "/v1/runs", "research_agent", Some("{"))]
#[case::role_lists_runs(Method::GET, "/v1/runs", "research_agent", None)]
#[case::role_reads_the_log(Method::GET, "/v1/audit/events", "research_agent", None)]
#[case::role_reloads(Method::POST, "/v1/policy/reload", "research_agent", None)]
#[case::auditor_engages_the_lock(Method::POST, "/v1/safety-lock", "auditor", Some("{"))]
#[case::auditor_decides(Method::POST, "/v1/approvals/a-none/decision", "auditor", Some("{"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_that_is_not_enough_is_refused_before_the_request_is_read(
    #[case] method: Method,
    #[case] path: &str,
    #[case] who: &str,
    #[case] body: Option<&str>,
) {
    let front = Front::start(with_auditor, ServerOptions::default()).await;
    let bearer = match who {
        "auditor" => AUDITOR.to_string(),
        role => token(role),
    };
    let (path, body) = match body {
        Some(body) => (path.to_string(), body.as_bytes()),
        None => (format!("{path}?bogus=1"), &b""[..]),
    };
    let answer = front.send(method, &path, Some(&bearer), &[], body).await;
    let text = String::from_utf8_lossy(&answer.bytes).into_owned();
    assert_eq!(answer.status.as_u16(), 401, "{path}: {text}");
    assert_eq!(
        answer.reason().as_deref(),
        Some("credential_invalid"),
        "{path}: {text}"
    );
    front.close().await;
}

/// The `audit_read` admin of [`with_auditor`].
const AUDITOR: &str = "handle-auditor-token";

/// The demo policy with an `access: audit_read` admin whose token is [`AUDITOR`].
fn with_auditor(policy: &mut Policy) {
    let mut auditor = policy.admins[0].clone();
    auditor.admin_id = "auditor".into();
    auditor.access = toolgate::policy::AdminAccess::AuditRead;
    auditor.credential =
        toolgate::policy::Credential::TokenSha256(crate::common::lab::sha(AUDITOR));
    policy.admins.push(auditor);
}
