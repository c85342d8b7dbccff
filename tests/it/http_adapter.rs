//! The complete http adapter (issue 41): method, url template, query, headers, body,
//! scope forwarding and answer mapping, through the policy loader and a real upstream
//! on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use toolgate::adapter::{self, Adapter, AdapterEnv, Adapters, ExecContext};
use toolgate::diagnostic::{Reason, Refusal};
use toolgate::policy::{self, Policy, Problem};

const ROLES: &str = r#"
version: "r-1"
roles:
  - role_id: tester
    description: Calls the http tools.
    enabled: true
    lanes: [lab]
    credential: {token_sha256: "0000000000000000000000000000000000000000000000000000000000000000"}
admins: []
"#;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    /// Path and query exactly as sent.
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// An upstream recording every request; its answer depends on the path's first
/// segment: `/status/<code>` answers that status (with `Retry-After: 3` and a
/// `Location` for 3xx), `/text` plain text, anything else JSON naming what it saw.
async fn start_upstream() -> (SocketAddr, Log) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log: Log = Arc::default();
    let recorder = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let recorder = recorder.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(req, recorder.clone()));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, log)
}

async fn handle(req: Request<Incoming>, log: Log) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = req.into_body().collect().await.unwrap().to_bytes().to_vec();
    log.lock().unwrap().push(Seen {
        method: method.clone(),
        target: target.clone(),
        headers,
        body,
    });
    let mut response = Response::builder();
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = if let Some(code) = path.strip_prefix("/status/") {
        let code: u16 = code.parse().unwrap_or(500);
        response = response
            .header("retry-after", "3")
            .header("location", "http://evil.example:8080/elsewhere");
        (code, "text/plain", format!("upstream says {code}"))
    } else if path == "/text" {
        (200, "text/plain; charset=utf-8", "plain words".to_string())
    } else {
        (
            200,
            "application/json",
            json!({"method": method, "target": target}).to_string(),
        )
    };
    Ok(response
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap())
}

/// A tool entry of kind http with the given adapter fields (YAML flow mapping body).
fn tool_entry(name: &str, adapter: &str) -> String {
    format!(
        r#"  - tool_name: {name}
    description: An http test tool.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {{timeout_ms_max: 10000, max_output_bytes: 65536, max_concurrency: 4}}
    allowed_lanes: [lab]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {{kind: http, {adapter}}}
    input_schema: {{type: object}}
    output_schema: {{type: object}}
"#
    )
}

/// Writes roles, lanes and a registry of `tools` (name, adapter fields) to `dir` and
/// loads them.
fn load(dir: &Path, tools: &[(&str, String)]) -> Result<Policy, Vec<Problem>> {
    let policy_dir = dir.join("policy");
    let tools_dir = dir.join("tools");
    std::fs::create_dir_all(&policy_dir).unwrap();
    std::fs::create_dir_all(&tools_dir).unwrap();
    std::fs::write(policy_dir.join("roles.yaml"), ROLES).unwrap();
    let names: Vec<&str> = tools.iter().map(|(n, _)| *n).collect();
    std::fs::write(
        policy_dir.join("lanes.yaml"),
        format!(
            "version: \"r-1\"\nlanes:\n  - lane_id: lab\n    description: Test lane.\n    tools: [{}]\n    required_scope_keys: []\n    prohibited_flags: []\n    run_statuses: [active]\n    write: false\n",
            names.join(", ")
        ),
    )
    .unwrap();
    let mut registry = String::from("version: \"r-1\"\ntools:\n");
    for (name, adapter) in tools {
        registry.push_str(&tool_entry(name, adapter));
    }
    let tools_file = tools_dir.join("tool_registry.yaml");
    std::fs::write(&tools_file, registry).unwrap();
    policy::load(&policy_dir, &tools_file)
}

struct Gate {
    policy: Policy,
    adapters: Adapters,
    _dir: tempfile::TempDir,
}

impl Gate {
    fn new(tools: &[(&str, String)]) -> Gate {
        let dir = tempfile::tempdir().unwrap();
        let policy = load(dir.path(), tools).expect("the registry loads");
        let env = AdapterEnv {
            tools_dir: dir.path().join("tools"),
            data_dir: dir.path().join("var"),
        };
        let adapters = adapter::build(&policy, &env).expect("adapters build");
        Gate {
            policy,
            adapters,
            _dir: dir,
        }
    }

    /// What the pipeline does with an authorized call: validate, execute, classify.
    async fn call(&self, name: &str, arguments: Value, scope: Value) -> Result<Value, Refusal> {
        let tool = &self.policy.tools[name];
        let adapter = &self.adapters.by_tool[name];
        let scope: Map<String, Value> = match scope {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        adapter.validate(tool, &arguments, &scope)?;
        let ctx = ExecContext {
            call_id: "call-1",
            run_id: "run-1",
            scope: &scope,
            deadline: Instant::now() + Duration::from_secs(5),
            sandbox: None,
            subject_token: None,
            idempotency_key: None,
            delegation: None,
        };
        adapter
            .execute(tool, &arguments, ctx)
            .await
            .map_err(|e| Adapter::classify_error(tool, &e))
    }
}

#[tokio::test]
async fn each_method_sends_its_path_query_headers_and_body() {
    let (addr, log) = start_upstream().await;
    let hosts = format!("allowed_hosts: [\"{addr}\"]");
    let gate = Gate::new(&[
        (
            "read_patient",
            format!(
                "method: GET, url: \"http://{addr}/fhir/Patient/{{args.patient_id}}?_format=json\", {hosts}, query: {{_elements: \"{{args.fields}}\", missing: \"{{args.absent}}\", tenant: \"t-{{scope.tenant}}\"}}, headers: {{Accept: application/fhir+json, X-Api-Version: \"4\"}}, forward_scope: [tenant, matter_id]"
            ),
        ),
        (
            "create_item",
            format!("method: POST, url: \"http://{addr}/items\", {hosts}"),
        ),
        (
            "replace_item",
            format!(
                "method: PUT, url: \"http://{addr}/items/{{args.id}}\", {hosts}, body: arguments"
            ),
        ),
        (
            "patch_item",
            format!(
                "method: PATCH, url: \"http://{addr}/items/{{args.id}}\", {hosts}, headers: {{content-type: application/merge-patch+json}}"
            ),
        ),
        (
            "delete_item",
            format!(
                "method: DELETE, url: \"http://{addr}/items/{{run.scope.matter_id}}/{{args.id}}\", {hosts}"
            ),
        ),
    ]);
    let scope = json!({"tenant": "north", "matter_id": "M-7", "other": "kept back"});

    let out = gate
        .call(
            "read_patient",
            json!({"patient_id": "p 1/2", "fields": "name,birthDate"}),
            scope.clone(),
        )
        .await
        .unwrap();
    assert_eq!(out["method"], "GET");
    let seen = log.lock().unwrap().last().cloned().unwrap();
    assert_eq!(seen.method, "GET");
    assert_eq!(
        seen.target,
        "/fhir/Patient/p%201%2F2?_format=json&_elements=name%2CbirthDate&tenant=t-north"
    );
    assert_eq!(seen.header("accept"), Some("application/fhir+json"));
    assert_eq!(seen.header("x-api-version"), Some("4"));
    assert_eq!(
        seen.header("toolgate-scope"),
        Some(r#"{"matter_id":"M-7","tenant":"north"}"#)
    );
    assert_eq!(seen.header("x-toolgate-call-id"), Some("call-1"));
    assert!(seen.body.is_empty(), "a GET carries no body");
    assert_eq!(seen.header("content-type"), None);

    let args = json!({"name": "widget", "count": 2});
    gate.call("create_item", args.clone(), scope.clone())
        .await
        .unwrap();
    let seen = log.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.target.as_str()),
        ("POST", "/items")
    );
    assert_eq!(serde_json::from_slice::<Value>(&seen.body).unwrap(), args);
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.header("toolgate-scope"), None, "forwarding is opt-in");

    gate.call(
        "replace_item",
        json!({"id": 42, "name": "w"}),
        scope.clone(),
    )
    .await
    .unwrap();
    let seen = log.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.target.as_str()),
        ("PUT", "/items/42")
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&seen.body).unwrap(),
        json!({"id": 42, "name": "w"})
    );

    gate.call("patch_item", json!({"id": "a", "name": "w"}), scope.clone())
        .await
        .unwrap();
    let seen = log.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.target.as_str()),
        ("PATCH", "/items/a")
    );
    assert_eq!(
        seen.header("content-type"),
        Some("application/merge-patch+json")
    );
    assert!(!seen.body.is_empty());

    gate.call("delete_item", json!({"id": true}), scope.clone())
        .await
        .unwrap();
    let seen = log.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.target.as_str()),
        ("DELETE", "/items/M-7/true")
    );
    assert!(seen.body.is_empty(), "a DELETE carries no body by default");

    // A placeholder with no value, or an object, is refused before anything is sent.
    let before = log.lock().unwrap().len();
    let r = gate
        .call("replace_item", json!({"name": "no id"}), scope.clone())
        .await
        .unwrap_err();
    assert_eq!(r.reason, Reason::ArgumentUnsafe, "{r:?}");
    let r = gate
        .call("replace_item", json!({"id": {"a": 1}}), scope.clone())
        .await
        .unwrap_err();
    assert_eq!(r.reason, Reason::ArgumentUnsafe, "{r:?}");
    assert_eq!(r.details["pointer"], "/id");
    assert_eq!(log.lock().unwrap().len(), before, "nothing was sent");
}

#[tokio::test]
async fn template_values_never_change_the_host_or_add_a_segment() {
    let (addr, log) = start_upstream().await;
    let gate = Gate::new(&[(
        "read_patient",
        format!(
            "method: GET, url: \"http://{addr}/Patient/{{args.patient_id}}/_history\", allowed_hosts: [\"{addr}\"], query: {{q: \"{{args.patient_id}}\"}}"
        ),
    )]);
    let long = "a/../".repeat(2048);
    let table: Vec<String> = vec![
        "../".into(),
        "../../admin".into(),
        "%2F".into(),
        "%2e%2e".into(),
        "a?b=c".into(),
        "a#frag".into(),
        "user@evil.example".into(),
        "@evil.example:80".into(),
        "a\\b".into(),
        "\u{e9}\u{4e2d}\u{1F600}".into(),
        " \t\r\nx".into(),
        "a;b=c".into(),
        "a&b=c".into(),
        "...".into(),
        long,
    ];
    for value in &table {
        let out = gate
            .call("read_patient", json!({"patient_id": value}), json!({}))
            .await
            .unwrap_or_else(|e| panic!("{value:?}: {e:?}"));
        let seen = log.lock().unwrap().last().cloned().unwrap();
        assert_eq!(out["target"], seen.target.as_str());
        let (path, query) = seen.target.split_once('?').unwrap();
        let segments: Vec<&str> = path.split('/').collect();
        assert_eq!(segments.len(), 4, "{value:?} -> {path}");
        assert_eq!(segments[1], "Patient");
        assert_eq!(segments[3], "_history");
        assert!(!query.contains('&'), "{value:?} -> {query}");
        assert!(query.starts_with("q="), "{value:?} -> {query}");
        // The value arrives whole: decoding the segment gives it back.
        let decoded = percent_decode(segments[2]);
        assert_eq!(&decoded, value);
        assert_eq!(percent_decode(&query[2..]), *value);
        assert_eq!(seen.header("host"), Some(addr.to_string().as_str()));
    }
    // A whole segment of dots would be removed by the client, and a url naming another
    // host is refused by the argument guard: refused, nothing sent.
    let before = log.lock().unwrap().len();
    for value in [
        ".",
        "..",
        "\\\\evil.example\\x",
        "//evil.example/x",
        "http://evil.example/",
    ] {
        let r = gate
            .call("read_patient", json!({"patient_id": value}), json!({}))
            .await
            .unwrap_err();
        assert_eq!(r.reason, Reason::ArgumentUnsafe, "{value}: {r:?}");
    }
    assert_eq!(log.lock().unwrap().len(), before, "nothing was sent");
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn answers_are_mapped_and_redirects_are_not_followed() {
    let (addr, log) = start_upstream().await;
    let gate = Gate::new(&[
        (
            "get",
            format!(
                "method: GET, url: \"http://{addr}/{{args.path}}/{{args.code}}\", allowed_hosts: [\"{addr}\"]"
            ),
        ),
        (
            "text",
            format!("method: GET, url: \"http://{addr}/text\", allowed_hosts: [\"{addr}\"]"),
        ),
    ]);
    let out = gate.call("text", json!({}), json!({})).await.unwrap();
    assert_eq!(out, json!({"text": "plain words"}));

    let status = |code: u16| json!({"path": "status", "code": code});
    let r = gate.call("get", status(429), json!({})).await.unwrap_err();
    assert_eq!(r.reason, Reason::ToolError, "{r:?}");
    assert!(r.diagnostic().retryable, "{r:?}");
    assert_eq!(r.details["retry_after_ms"], 3000);

    let sent = log.lock().unwrap().len();
    let r = gate.call("get", status(302), json!({})).await.unwrap_err();
    assert_eq!(r.reason, Reason::ToolError, "{r:?}");
    let message = r.details["tool_error"].as_str().unwrap();
    assert!(message.contains("evil.example"), "{message}");
    assert!(message.contains("not followed"), "{message}");
    assert_eq!(
        log.lock().unwrap().len(),
        sent + 1,
        "the redirect was not followed"
    );

    let r = gate.call("get", status(404), json!({})).await.unwrap_err();
    assert_eq!(r.reason, Reason::ToolError, "{r:?}");
    assert!(
        r.details["tool_error"]
            .as_str()
            .unwrap()
            .contains("upstream says 404")
    );

    let r = gate.call("get", status(503), json!({})).await.unwrap_err();
    assert_eq!(r.reason, Reason::DependencyDown, "{r:?}");
    assert!(r.diagnostic().retryable);
}

#[test]
fn bad_http_settings_are_refused_at_load_with_a_position() {
    let ok = "allowed_hosts: [\"127.0.0.1:9\"]";
    for (adapter, expected) in [
        (
            format!("url: \"http://{{args.host}}/x\", {ok}"),
            "scheme, host or port",
        ),
        (
            format!("url: \"http://127.0.0.1:{{args.port}}/x\", {ok}"),
            "scheme, host or port",
        ),
        (
            format!("url: \"http://127.0.0.1:9/x#{{args.f}}\", {ok}"),
            "fragment",
        ),
        (
            format!("url: \"http://127.0.0.1:9/{{input.f}}\", {ok}"),
            "is not `{args.NAME}`",
        ),
        (
            format!("url: \"http://127.0.0.1:9/{{args.f\", {ok}"),
            "without its",
        ),
        (
            format!("url: \"http://127.0.0.1:9/\", {ok}, method: TRACE"),
            "method",
        ),
        (
            format!("url: \"http://127.0.0.1:9/\", {ok}, body: form"),
            "`body`",
        ),
        (
            format!("url: \"http://127.0.0.1:9/\", {ok}, method: GET, body: arguments"),
            "no body",
        ),
        (
            format!("url: \"http://127.0.0.1:9/\", {ok}, headers: {{Host: evil.example}}"),
            "set by toolgate",
        ),
        (
            format!("url: \"http://127.0.0.1:9/\", {ok}, headers: {{\"bad name\": x}}"),
            "not a header name",
        ),
        (
            format!("url: \"http://127.0.0.1:9/\", {ok}, query: {{q: \"{{nope}}\"}}"),
            "query parameter",
        ),
        (
            format!("url: \"http://127.0.0.1:9/\", {ok}, forward_scope: [\"Not A Key\"]"),
            "forward_scope",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let problems =
            load(dir.path(), &[("t", adapter.clone())]).expect_err(&format!("{adapter} loaded"));
        let problem = problems
            .iter()
            .find(|p| p.message.contains(expected))
            .unwrap_or_else(|| panic!("{adapter}: no `{expected}` in {problems:?}"));
        assert!(problem.file.ends_with("tool_registry.yaml"), "{problem:?}");
        assert!(
            problem.line.is_some() && problem.column.is_some(),
            "{adapter}: {problem:?}"
        );
    }
}
