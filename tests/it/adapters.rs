//! Adapter tests through the public interface: the demo builtins on the shipped data,
//! command tools as real processes, http tools against real upstreams on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use toolgate::adapter::{self, Adapter, AdapterEnv, Adapters, ExecContext, ExecError};
use toolgate::diagnostic::{Reason, Refusal};
use toolgate::policy::{
    AdapterConfig, Determinism, FileVersion, Limits, Policy, PolicySource, PolicyVersions,
    Redaction, Tool,
};

// ---------------------------------------------------------------------------
// Building policies and tools in Rust (the policy loader is tested elsewhere).

fn tool(name: &str, adapter: AdapterConfig, input: Value, output: Value) -> Tool {
    let input_validator = jsonschema::validator_for(&input).expect("input schema compiles");
    let output_validator = jsonschema::validator_for(&output).expect("output schema compiles");
    Tool {
        tool_name: name.to_string(),
        description: format!("test tool {name}"),
        enabled: true,
        version: semver::Version::new(1, 0, 0),
        determinism: Determinism::Pure,
        idempotent: true,
        timeout_default_ms: 5000,
        limits: Limits {
            timeout_ms_max: 30000,
            max_output_bytes: 65536,
            max_concurrency: 16,
        },
        allowed_lanes: vec![],
        required_scope_keys: vec![],
        prohibited_flags: vec![],
        flag_rules: vec![],
        conditions: vec![],
        approval: None,
        write_targets: vec![],
        adapter,
        phases: None,
        call_limits: Default::default(),
        redaction: Redaction::Full,
        input_schema: Arc::new(input),
        output_schema: Arc::new(output),
        input_validator: Arc::new(input_validator),
        output_validator: Arc::new(output_validator),
    }
}

fn policy(tools: Vec<Tool>) -> Policy {
    let version = FileVersion {
        version: "2026.11.1".into(),
        sha256: "0".repeat(64),
    };
    Policy {
        roles: BTreeMap::new(),
        admins: vec![],
        lanes: BTreeMap::new(),
        tools: tools
            .into_iter()
            .map(|t| (t.tool_name.clone(), t))
            .collect(),
        versions: PolicyVersions {
            roles: version.clone(),
            lanes: version.clone(),
            registry: version,
        },
        identity: Default::default(),
        secrets: Default::default(),
        source: PolicySource {
            policy_dir: "policy".into(),
            tools_file: "tools/tool_registry.yaml".into(),
            git_commit: None,
            git_dirty: None,
        },
    }
}

fn builtin(name: &str, settings: Value) -> AdapterConfig {
    let settings: BTreeMap<String, Value> = serde_json::from_value(settings).unwrap();
    AdapterConfig::Builtin {
        name: name.into(),
        settings,
    }
}

/// A command tool, unconfined: these tests drive the adapter in this process, where
/// no launcher binary runs; the confined path is tested end to end in sandbox.rs.
fn command(argv: &[&str], env_allowlist: &[&str]) -> AdapterConfig {
    AdapterConfig::Command {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        working_dir: None,
        env_allowlist: env_allowlist.iter().map(|s| s.to_string()).collect(),
        sandbox: unconfined(),
    }
}

fn unconfined() -> toolgate::policy::Sandbox {
    toolgate::policy::Sandbox::Unconfined {
        reason: "the adapter's mechanics, tested in-process".into(),
    }
}

fn http(url: &str, hosts: &[&str]) -> AdapterConfig {
    AdapterConfig::Http {
        url: url.into(),
        allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
        request: Default::default(),
    }
}

fn any_object() -> Value {
    json!({"type": "object"})
}

fn object(required: &[&str], properties: Value) -> Value {
    json!({"type": "object", "additionalProperties": false, "required": required, "properties": properties})
}

/// The demo tools, with the schemas of notes/demo_tools.md.
fn demo_tools(court_url: &str, court_host: &str) -> Vec<Tool> {
    let s = |min: u64, max: u64| json!({"type": "string", "minLength": min, "maxLength": max});
    let hex64 = json!({"type": "string", "pattern": "^[0-9a-f]{64}$"});
    let draft_id = json!({"type": "string", "pattern": "^d-[0-9a-f]{16}$"});
    vec![
        tool(
            "conflict_check",
            builtin("conflict_check", json!({})),
            object(&["party_name"], json!({"party_name": s(1, 200)})),
            object(
                &["party_name", "conflict", "matches"],
                json!({
                    "party_name": {"type": "string"},
                    "conflict": {"type": "boolean"},
                    "matches": {"type": "array", "items": object(
                        &["client_id", "name", "relationship"],
                        json!({
                            "client_id": {"type": "string"},
                            "name": {"type": "string"},
                            "relationship": {"enum": ["client", "adverse_party", "former_client"]}
                        }))}
                }),
            ),
        ),
        tool(
            "case_lookup",
            builtin("case_lookup", json!({})),
            object(&[], json!({})),
            object(
                &[
                    "case_id",
                    "title",
                    "court",
                    "status",
                    "matter_ids",
                    "parties",
                    "opened",
                ],
                json!({
                    "case_id": {"type": "string"}, "title": {"type": "string"},
                    "court": {"type": "string"}, "status": {"type": "string"},
                    "matter_ids": {"type": "array", "items": {"type": "string"}},
                    "parties": {"type": "array", "items": object(&["name", "role"],
                        json!({"name": {"type": "string"}, "role": {"type": "string"}}))},
                    "opened": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}
                }),
            ),
        ),
        tool(
            "legal_search",
            builtin("legal_search", json!({})),
            object(
                &["query"],
                json!({"query": s(1, 200), "limit": {"type": "integer", "minimum": 1, "maximum": 50}}),
            ),
            object(
                &["query", "results", "total"],
                json!({
                    "query": {"type": "string"},
                    "results": {"type": "array", "items": object(&["source", "line", "text"], json!({
                        "source": {"type": "string"}, "line": {"type": "integer", "minimum": 1},
                        "text": {"type": "string"}}))},
                    "total": {"type": "integer", "minimum": 0}
                }),
            ),
        ),
        tool(
            "read_document",
            builtin("read_document", json!({})),
            object(&["path"], json!({"path": s(1, 512)})),
            object(
                &["case_id", "path", "bytes", "sha256", "content"],
                json!({"case_id": {"type": "string"}, "path": {"type": "string"},
                       "bytes": {"type": "integer"}, "sha256": hex64, "content": {"type": "string"}}),
            ),
        ),
        tool(
            "draft_document",
            builtin("draft_document", json!({})),
            object(
                &["title", "body"],
                json!({"title": s(1, 200), "body": s(1, 100000)}),
            ),
            object(
                &["draft_id", "case_id", "path", "bytes", "sha256"],
                json!({"draft_id": draft_id, "case_id": {"type": "string"}, "path": {"type": "string"},
                       "bytes": {"type": "integer"}, "sha256": hex64}),
            ),
        ),
        tool(
            "file_with_court",
            builtin(
                "file_with_court",
                json!({"url": court_url, "allowed_hosts": [court_host]}),
            ),
            object(&["draft_id"], json!({"draft_id": draft_id})),
            object(
                &["draft_id", "filing_id", "status"],
                json!({"draft_id": {"type": "string"}, "filing_id": {"type": "string"},
                       "status": {"type": "string"}}),
            ),
        ),
        tool(
            "disabled_tool",
            builtin("echo", json!({})),
            object(&["text"], json!({"text": {"type": "string"}})),
            object(&["echo"], json!({"echo": {"type": "object"}})),
        ),
    ]
}

fn repo_tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools")
}

/// A policy and its adapters, as the pipeline holds them.
struct Gate {
    policy: Policy,
    adapters: Adapters,
}

impl Gate {
    fn new(tools: Vec<Tool>, env: &AdapterEnv) -> Gate {
        let policy = policy(tools);
        let adapters = adapter::build(&policy, env).expect("adapters build");
        Gate { policy, adapters }
    }

    fn demo(env: &AdapterEnv) -> Gate {
        Gate::new(
            demo_tools("http://127.0.0.1:8799/filings", "127.0.0.1:8799"),
            env,
        )
    }

    fn parts(&self, name: &str) -> (&Tool, &Adapter) {
        (&self.policy.tools[name], &self.adapters.by_tool[name])
    }

    /// What the pipeline does with an authorized call: input schema, validate,
    /// normalize, execute by the deadline, classify, output schema.
    async fn call(
        &self,
        name: &str,
        arguments: Value,
        scope: Value,
        deadline_ms: u64,
    ) -> Result<Value, Refusal> {
        let (tool, adapter) = self.parts(name);
        assert!(
            tool.input_validator.is_valid(&arguments),
            "test arguments must match the input schema of `{name}`: {arguments}"
        );
        let scope = scope_map(scope);
        adapter.validate(tool, &arguments, &scope)?;
        let normalized = adapter.normalize(tool, &arguments);
        let ctx = ExecContext {
            call_id: "call-1",
            run_id: "run-1",
            scope: &scope,
            deadline: Instant::now() + Duration::from_millis(deadline_ms),
            sandbox: None,
            subject_token: None,
            idempotency_key: None,
            delegation: None,
        };
        let output = adapter
            .execute(tool, &normalized, ctx)
            .await
            .map_err(|e| Adapter::classify_error(tool, &e))?;
        assert!(
            tool.output_validator.is_valid(&output),
            "output of `{name}` must match its output schema: {output}"
        );
        Ok(output)
    }

    async fn execute_raw(
        &self,
        name: &str,
        arguments: Value,
        scope: Value,
        deadline_ms: u64,
    ) -> Result<Value, ExecError> {
        let (tool, adapter) = self.parts(name);
        let scope = scope_map(scope);
        let ctx = ExecContext {
            call_id: "call-1",
            run_id: "run-1",
            scope: &scope,
            deadline: Instant::now() + Duration::from_millis(deadline_ms),
            sandbox: None,
            subject_token: None,
            idempotency_key: None,
            delegation: None,
        };
        adapter.execute(tool, &arguments, ctx).await
    }

    fn validate(&self, name: &str, arguments: Value, scope: Value) -> Result<(), Refusal> {
        let (tool, adapter) = self.parts(name);
        adapter.validate(tool, &arguments, &scope_map(scope))
    }
}

fn scope_map(scope: Value) -> Map<String, Value> {
    match scope {
        Value::Object(m) => m,
        _ => panic!("scope must be an object"),
    }
}

fn demo_env(data_dir: &Path) -> AdapterEnv {
    AdapterEnv {
        tools_dir: repo_tools_dir(),
        data_dir: data_dir.to_path_buf(),
    }
}

fn assert_unsafe(result: Result<(), Refusal>, pointer: &str) {
    let refusal = result.expect_err("must be refused");
    assert_eq!(refusal.reason, Reason::ArgumentUnsafe, "{refusal:?}");
    assert_eq!(refusal.details["pointer"], pointer, "{refusal:?}");
    assert!(refusal.details["problem"].is_string(), "{refusal:?}");
}

// ---------------------------------------------------------------------------
// A small upstream for http tests.

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, Value)>>>);

async fn start_upstream() -> (SocketAddr, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Seen::default();
    let recorder = seen.clone();
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
    (addr, seen)
}

async fn handle(req: Request<Incoming>, seen: Seen) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let call_id = req
        .headers()
        .get("x-toolgate-call-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.0.lock().unwrap().push((path.clone(), json.clone()));
    let reply = |status: StatusCode, body: String| {
        Ok(Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap())
    };
    match path.as_str() {
        "/echo" => reply(
            StatusCode::OK,
            json!({"received": json, "call_id": call_id, "content_type": content_type}).to_string(),
        ),
        "/filings" => reply(
            StatusCode::CREATED,
            json!({"filing_id": "F-2026-0001", "status": "received"}).to_string(),
        ),
        "/fail" => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "{\"error\":\"database down\"}".into(),
        ),
        "/missing" => reply(StatusCode::NOT_FOUND, "no such endpoint: /missing".into()),
        "/text" => reply(StatusCode::OK, "this is not json".into()),
        "/slow" => {
            // The slow upstream under test (the deadline must cut it), not a wait.
            tokio::time::sleep(Duration::from_secs(10)).await;
            reply(StatusCode::OK, "{}".into())
        }
        _ => reply(StatusCode::NOT_FOUND, "unknown".into()),
    }
}

/// An address where nothing listens.
async fn closed_port() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

// ---------------------------------------------------------------------------
// Processes.

/// Live (not zombie) processes whose process group is `pgid`.
fn live_group_members(pgid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...; comm may contain spaces, so split after ')'.
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2].parse::<i32>() == Ok(pgid) {
            found.push(pid);
        }
    }
    found
}

/// Waits (at most 3 s) until no live process is left in `pgid`; returns the survivors.
async fn survivors_of(pgid: i32) -> Vec<i32> {
    common::poll_until_async(Duration::from_secs(3), || {
        live_group_members(pgid).is_empty()
    })
    .await;
    live_group_members(pgid)
}

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .expect("the tool wrote its pid")
        .trim()
        .parse()
        .unwrap()
}

// ===========================================================================
// build

#[tokio::test]
async fn build_reports_every_problem_with_the_tool_named() {
    let tools = vec![
        tool(
            "t_unknown",
            builtin("no_such_builtin", json!({})),
            any_object(),
            any_object(),
        ),
        tool(
            "t_settings",
            builtin("echo", json!({"color": "red"})),
            any_object(),
            any_object(),
        ),
        tool(
            "t_court_settings",
            builtin("file_with_court", json!({"url": 7, "retries": 2})),
            any_object(),
            any_object(),
        ),
        tool(
            "t_empty_argv",
            command(&[], &[]),
            any_object(),
            any_object(),
        ),
        tool(
            "t_relative",
            command(&["./run.sh"], &[]),
            any_object(),
            any_object(),
        ),
        tool(
            "t_not_on_path",
            command(&["no-such-program-toolgate"], &[]),
            any_object(),
            any_object(),
        ),
        tool(
            "t_workdir",
            AdapterConfig::Command {
                argv: vec!["cat".into()],
                working_dir: Some("no/such/dir".into()),
                env_allowlist: vec![],
                sandbox: unconfined(),
            },
            any_object(),
            any_object(),
        ),
        tool(
            "t_https",
            http("https://127.0.0.1/x", &["127.0.0.1:8799"]),
            any_object(),
            any_object(),
        ),
        tool(
            "t_foreign",
            http("http://example.com/x", &["127.0.0.1:8799"]),
            any_object(),
            any_object(),
        ),
        tool(
            "t_garbage",
            http("not a url", &["127.0.0.1:8799"]),
            any_object(),
            any_object(),
        ),
        tool(
            "t_mcp",
            AdapterConfig::Mcp {
                server: None,
                command: None,
                url: Some("http://127.0.0.1:9/mcp".into()),
                tool: "x".into(),
                max_concurrency: 4,
                sandbox: None,
                env: Default::default(),
                headers: Default::default(),
                outbound: Default::default(),
            },
            any_object(),
            any_object(),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let problems = adapter::build(&policy(tools), &demo_env(dir.path())).unwrap_err();
    for p in &problems {
        assert_eq!(p.file, "tools/tool_registry.yaml");
        println!("{p}");
    }
    let expect = [
        ("t_unknown", "unknown builtin `no_such_builtin`"),
        ("t_settings", "unknown setting `color`"),
        ("t_court_settings", "unknown setting `retries`"),
        ("t_court_settings", "`url` must be a string"),
        ("t_empty_argv", "`argv` is empty"),
        ("t_relative", "relative path"),
        ("t_not_on_path", "not found on PATH"),
        ("t_workdir", "working_dir"),
        ("t_https", "not in its own `allowed_hosts`"),
        ("t_foreign", "not in its own `allowed_hosts`"),
        ("t_garbage", "does not parse"),
    ];
    for (tool_name, fragment) in expect {
        assert!(
            problems
                .iter()
                .any(|p| p.message.starts_with(&format!("tool `{tool_name}`:"))
                    && p.message.contains(fragment)),
            "no problem for `{tool_name}` containing `{fragment}` in {problems:#?}"
        );
    }
    assert!(
        !problems.iter().any(|p| p.message.contains("t_mcp")),
        "{problems:#?}"
    );
}

#[tokio::test]
async fn the_demo_tools_build_and_an_mcp_server_that_exits_is_dependency_down() {
    // The mcp adapter itself is tested end to end in tests/mcp_adapter.rs; here it
    // only builds with the others and reports a server that exits at once.
    let dir = tempfile::tempdir().unwrap();
    let mut tools = demo_tools("http://127.0.0.1:8799/filings", "127.0.0.1:8799");
    tools.push(tool(
        "upstream_mcp",
        AdapterConfig::Mcp {
            server: None,
            command: Some(vec!["sh".into(), "-c".into(), "exit 3".into()]),
            url: None,
            tool: "search".into(),
            max_concurrency: 4,
            sandbox: Some(unconfined()),
            env: Default::default(),
            headers: Default::default(),
            outbound: Default::default(),
        },
        any_object(),
        any_object(),
    ));
    let gate = Gate::new(tools, &demo_env(dir.path()));
    assert_eq!(gate.adapters.by_tool.len(), 8);
    let refusal = gate
        .call("upstream_mcp", json!({}), json!({}), 5000)
        .await
        .unwrap_err();
    assert_eq!(refusal.reason, Reason::DependencyDown);
    assert!(
        refusal.message.contains("upstream_mcp"),
        "{}",
        refusal.message
    );
}

#[test]
fn adapters_build_outside_a_runtime() {
    // `toolgate policy check` builds adapters without starting tokio.
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(demo_tools(
        "http://127.0.0.1:8799/filings",
        "127.0.0.1:8799",
    ));
    assert!(adapter::build(&policy, &demo_env(dir.path())).is_ok());
}

// ===========================================================================
// builtins on the shipped data

#[tokio::test]
async fn conflict_check_finds_adverse_and_former_parties() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::demo(&demo_env(dir.path()));
    let scope = json!({"client_id": "CL-001"});

    let out = gate
        .call(
            "conflict_check",
            json!({"party_name": "MERIDIAN freight"}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    assert_eq!(out["conflict"], true);
    assert_eq!(
        out["matches"],
        json!([{"client_id": "CL-002", "name": "Meridian Freight Corporation", "relationship": "adverse_party"}])
    );

    // Two matches, sorted by client_id; a former client is a conflict too.
    let out = gate
        .call(
            "conflict_check",
            json!({"party_name": "harbor"}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    let ids: Vec<&str> = out["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["client_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["CL-001", "CL-008"]);
    assert_eq!(out["conflict"], true);

    let out = gate
        .call(
            "conflict_check",
            json!({"party_name": "Pinecrest"}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    assert_eq!(out["conflict"], false);
    assert_eq!(out["matches"].as_array().unwrap().len(), 1);

    let out = gate
        .call(
            "conflict_check",
            json!({"party_name": "Nobody Ltd"}),
            scope,
            2000,
        )
        .await
        .unwrap();
    assert_eq!(
        out,
        json!({"party_name": "Nobody Ltd", "conflict": false, "matches": []})
    );
}

#[tokio::test]
async fn case_lookup_reads_the_case_record() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::demo(&demo_env(dir.path()));
    let out = gate
        .call("case_lookup", json!({}), json!({"case_id": "C-1001"}), 2000)
        .await
        .unwrap();
    assert_eq!(out["case_id"], "C-1001");
    assert_eq!(out["matter_ids"], json!(["M-2001", "M-2002"]));
    assert_eq!(out["parties"][1]["name"], "Meridian Freight Corporation");

    let out = gate
        .call("case_lookup", json!({}), json!({"case_id": "C-1002"}), 2000)
        .await
        .unwrap();
    assert_eq!(out["matter_ids"], json!(["M-3001"]));

    let refusal = gate
        .call("case_lookup", json!({}), json!({"case_id": "C-9999"}), 2000)
        .await
        .unwrap_err();
    assert_eq!(refusal.reason, Reason::ToolError);
    assert!(
        refusal.details["tool_error"]
            .as_str()
            .unwrap()
            .contains("C-9999")
    );

    let refusal = gate
        .call(
            "case_lookup",
            json!({}),
            json!({"case_id": "../C-1001"}),
            2000,
        )
        .await
        .unwrap_err();
    assert_eq!(refusal.reason, Reason::ArgumentUnsafe);
    assert_eq!(refusal.details["location"], "scope");
}

#[tokio::test]
async fn legal_search_orders_by_source_and_line_and_applies_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::demo(&demo_env(dir.path()));
    let all = gate
        .call(
            "legal_search",
            json!({"query": "Privileged"}),
            json!({"case_id": "C-1001"}),
            2000,
        )
        .await
        .unwrap();
    let results = all["results"].as_array().unwrap();
    assert!(results.len() >= 4, "{all}");
    assert_eq!(all["total"], results.len());
    let keys: Vec<(String, u64)> = results
        .iter()
        .map(|r| {
            (
                r["source"].as_str().unwrap().to_string(),
                r["line"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    let sources: std::collections::BTreeSet<&str> = keys.iter().map(|(s, _)| s.as_str()).collect();
    assert!(sources.contains("civil_procedure.txt") && sources.contains("evidence_privilege.txt"));

    // The line numbers and texts are the real ones.
    for r in results {
        let file = std::fs::read_to_string(
            repo_tools_dir()
                .join("data/corpus")
                .join(r["source"].as_str().unwrap()),
        )
        .unwrap();
        let line = file
            .lines()
            .nth(r["line"].as_u64().unwrap() as usize - 1)
            .unwrap();
        assert_eq!(r["text"], line.trim_end());
        assert!(line.to_lowercase().contains("privileged"));
    }

    let limited = gate
        .call(
            "legal_search",
            json!({"query": "privileged", "limit": 2}),
            json!({}),
            2000,
        )
        .await
        .unwrap();
    assert_eq!(limited["total"], all["total"]);
    assert_eq!(limited["results"].as_array().unwrap()[..], results[..2]);

    // Every term must appear in the line.
    let both = gate
        .call(
            "legal_search",
            json!({"query": "breach contract"}),
            json!({}),
            2000,
        )
        .await
        .unwrap();
    for r in both["results"].as_array().unwrap() {
        let text = r["text"].as_str().unwrap().to_lowercase();
        assert!(
            text.contains("breach") && text.contains("contract"),
            "{text}"
        );
    }
    assert!(both["total"].as_u64().unwrap() >= 3);

    let (tool, adapter) = gate.parts("legal_search");
    assert_eq!(
        adapter.normalize(tool, &json!({"query": "x"})),
        json!({"query": "x", "limit": 10})
    );
}

#[tokio::test]
async fn read_document_reads_inside_the_case_folder() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::demo(&demo_env(dir.path()));
    let scope = json!({"case_id": "C-1001"});
    let expected = std::fs::read(repo_tools_dir().join("data/cases/C-1001/notes.md")).unwrap();

    let out = gate
        .call(
            "read_document",
            json!({"path": "notes.md"}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    assert_eq!(out["content"].as_str().unwrap().as_bytes(), &expected[..]);
    assert_eq!(out["bytes"], expected.len());
    assert_eq!(out["sha256"], toolgate::canonical::sha256_hex(&expected));
    assert_eq!(out["path"], "notes.md");
    assert_eq!(out["case_id"], "C-1001");

    let (tool, adapter) = gate.parts("read_document");
    assert_eq!(
        adapter.normalize(tool, &json!({"path": "./x/../notes.md"})),
        json!({"path": "notes.md"})
    );
    let out = gate
        .call(
            "read_document",
            json!({"path": "./x/../notes.md"}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    assert_eq!(out["path"], "notes.md");

    // Flags are the pipeline's business; the adapter reads privileged documents when asked.
    let out = gate
        .call(
            "read_document",
            json!({"path": "privileged/strategy.md"}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    assert!(out["content"].as_str().unwrap().contains("PRIVILEGED"));

    let refusal = gate
        .call("read_document", json!({"path": "missing.md"}), scope, 2000)
        .await
        .unwrap_err();
    assert_eq!(refusal.reason, Reason::ToolError);
}

#[tokio::test]
async fn read_document_refuses_paths_that_leave_the_case_folder() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::demo(&demo_env(dir.path()));
    let scope = json!({"case_id": "C-1001"});
    for bad in [
        "../C-1002/case.json",
        "/etc/passwd",
        "a\\b",
        "notes.md\0",
        "privileged/../../x",
        ".",
    ] {
        assert_unsafe(
            gate.validate("read_document", json!({"path": bad}), scope.clone()),
            "/path",
        );
    }
    let refusal = gate
        .call(
            "read_document",
            json!({"path": "../C-1002/case.json"}),
            scope,
            2000,
        )
        .await
        .unwrap_err();
    assert_eq!(refusal.reason, Reason::ArgumentUnsafe);

    // The case id names a folder, so it must be a plain id.
    for bad_case in [
        json!("../C-1002"),
        json!("C-1001/privileged"),
        json!(""),
        json!(7),
    ] {
        let r = gate
            .validate(
                "read_document",
                json!({"path": "notes.md"}),
                json!({"case_id": bad_case}),
            )
            .unwrap_err();
        assert_eq!(r.reason, Reason::ArgumentUnsafe);
        assert_eq!(r.details["location"], "scope");
        assert_eq!(r.details["pointer"], "/case_id");
    }
}

#[tokio::test]
async fn read_document_refuses_symlinks_that_resolve_outside() {
    // A temporary copy of the tools folder, with symlinks planted in the case folder.
    let root = tempfile::tempdir().unwrap();
    let tools = root.path().join("tools");
    let case = tools.join("data/cases/C-1001");
    std::fs::create_dir_all(case.join("privileged")).unwrap();
    let shipped = repo_tools_dir().join("data/cases/C-1001");
    std::fs::copy(shipped.join("notes.md"), case.join("notes.md")).unwrap();
    std::fs::create_dir_all(tools.join("data/cases/C-1002")).unwrap();
    std::fs::write(tools.join("data/cases/C-1002/secret.md"), "other case").unwrap();
    let outside = root.path().join("outside.txt");
    std::fs::write(&outside, "outside the case folder").unwrap();
    std::os::unix::fs::symlink(&outside, case.join("leak.md")).unwrap();
    std::os::unix::fs::symlink("../C-1002", case.join("sibling")).unwrap();
    std::os::unix::fs::symlink("/etc", case.join("etc")).unwrap();
    std::os::unix::fs::symlink("notes.md", case.join("alias.md")).unwrap();
    std::fs::write(case.join("privileged/strategy.md"), "privileged").unwrap();
    std::os::unix::fs::symlink("privileged/strategy.md", case.join("harmless.md")).unwrap();
    std::os::unix::fs::symlink("privileged", case.join("public")).unwrap();

    let env = AdapterEnv {
        tools_dir: tools,
        data_dir: root.path().join("var"),
    };
    let gate = Gate::demo(&env);
    let scope = json!({"case_id": "C-1001"});
    for bad in ["leak.md", "sibling/secret.md", "etc/passwd"] {
        // Lexically fine, so validate lets it through; the resolved path does not.
        assert!(
            gate.validate("read_document", json!({"path": bad}), scope.clone())
                .is_ok()
        );
        let refusal = gate
            .call("read_document", json!({"path": bad}), scope.clone(), 2000)
            .await
            .unwrap_err();
        assert_eq!(refusal.reason, Reason::ArgumentUnsafe, "{bad}: {refusal:?}");
        assert_eq!(refusal.details["pointer"], "/path");
    }
    // Inside the folder, a symlink would make flag rules (which see the normalized
    // path: `harmless.md` raises no `privileged`) judge another file than the one
    // read, so every symlink on the way is refused.
    for aliased in ["alias.md", "harmless.md", "public/strategy.md"] {
        let refusal = gate
            .call(
                "read_document",
                json!({"path": aliased}),
                scope.clone(),
                2000,
            )
            .await
            .unwrap_err();
        assert_eq!(
            refusal.reason,
            Reason::ArgumentUnsafe,
            "{aliased}: {refusal:?}"
        );
        assert!(
            refusal.details["problem"]
                .as_str()
                .unwrap()
                .contains("symlink"),
            "{refusal:?}"
        );
    }
    // The real paths read fine.
    let out = gate
        .call(
            "read_document",
            json!({"path": "privileged/strategy.md"}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    assert_eq!(out["content"], "privileged");
    let out = gate
        .call("read_document", json!({"path": "notes.md"}), scope, 2000)
        .await
        .unwrap();
    assert_eq!(
        out["content"],
        std::fs::read_to_string(case.join("notes.md")).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_during_reads_never_leads_outside_the_case() {
    // The case folder has `sub/doc.md`; a thread keeps swapping `sub` for a symlink to
    // a folder outside the case with its own `doc.md`, while reads run.
    let root = tempfile::tempdir().unwrap();
    let tools = root.path().join("tools");
    let case = tools.join("data/cases/C-1001");
    std::fs::create_dir_all(case.join("sub")).unwrap();
    std::fs::write(case.join("sub/doc.md"), "inside").unwrap();
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("doc.md"), "SECRET-OUTSIDE").unwrap();
    let gate = Gate::demo(&AdapterEnv {
        tools_dir: tools.clone(),
        data_dir: root.path().join("var"),
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swaps = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, case, outside) =
            (stop.clone(), swaps.clone(), case.clone(), outside.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::rename(case.join("sub"), case.join("sub.real")).unwrap();
                std::os::unix::fs::symlink(&outside, case.join("sub")).unwrap();
                std::thread::yield_now();
                std::fs::remove_file(case.join("sub")).unwrap();
                std::fs::rename(case.join("sub.real"), case.join("sub")).unwrap();
                swaps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let scope = json!({"case_id": "C-1001"});
    let (mut read, mut refused) = (0, 0);
    for _ in 0..2000 {
        match gate
            .call(
                "read_document",
                json!({"path": "sub/doc.md"}),
                scope.clone(),
                2000,
            )
            .await
        {
            Ok(out) => {
                assert_eq!(out["content"], "inside", "read outside the case: {out}");
                read += 1;
            }
            Err(r) => {
                assert!(!format!("{r:?}").contains("SECRET"), "{r:?}");
                refused += 1;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(swaps.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert_eq!(read + refused, 2000);
}

#[tokio::test]
async fn draft_document_writes_atomically_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::demo(&demo_env(dir.path()));
    let scope = json!({"case_id": "C-1001"});
    let args =
        json!({"title": "Demand letter", "body": "Dear Sir,\n\nPlease pay the cover costs."});

    let first = gate
        .call("draft_document", args.clone(), scope.clone(), 2000)
        .await
        .unwrap();
    let draft_id = first["draft_id"].as_str().unwrap().to_string();
    let digest = toolgate::canonical::sha256_hex(
        b"C-1001\nDemand letter\nDear Sir,\n\nPlease pay the cover costs.",
    );
    assert_eq!(draft_id, format!("d-{}", &digest[..16]));
    let path = dir.path().join(first["path"].as_str().unwrap());
    assert_eq!(
        path,
        dir.path().join(format!("drafts/C-1001/{draft_id}.md"))
    );
    let written = std::fs::read(&path).unwrap();
    assert_eq!(
        written,
        b"# Demand letter\n\nDear Sir,\n\nPlease pay the cover costs.\n"
    );
    assert_eq!(first["bytes"], written.len());
    assert_eq!(first["sha256"], toolgate::canonical::sha256_hex(&written));

    let second = gate
        .call("draft_document", args, scope.clone(), 2000)
        .await
        .unwrap();
    assert_eq!(first, second);
    let files: Vec<_> = std::fs::read_dir(dir.path().join("drafts/C-1001"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files.len(), 1, "no temporary files are left: {files:?}");

    assert_unsafe(
        gate.validate(
            "draft_document",
            json!({"title": "a\nb", "body": "x"}),
            scope,
        ),
        "/title",
    );
}

/// An insider with the data directory plants a symlink where a case's drafts folder
/// (or the drafts folder itself) would be: the draft is refused, never written through
/// it to a place outside the data directory that the audit record would not name.
#[tokio::test]
async fn a_draft_is_never_written_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let gate = Gate::demo(&demo_env(dir.path()));
    let args = json!({"title": "Motion", "body": "The defendant moves."});
    let draft = |case: &str| {
        gate.call(
            "draft_document",
            args.clone(),
            json!({"case_id": case}),
            2000,
        )
    };

    std::fs::create_dir_all(dir.path().join("drafts")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("drafts/C-1001")).unwrap();
    let refused = draft("C-1001").await.unwrap_err();
    assert_eq!(refused.reason, Reason::ToolError, "{refused:?}");
    assert!(
        refused.details["tool_error"]
            .as_str()
            .unwrap()
            .contains("a symlink on its path is refused"),
        "{refused:?}"
    );

    std::fs::remove_dir_all(dir.path().join("drafts")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("drafts")).unwrap();
    let refused = draft("C-1002").await.unwrap_err();
    assert_eq!(refused.reason, Reason::ToolError, "{refused:?}");
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing was written outside the data directory"
    );

    // With the folders real again, the same draft is written where it says.
    std::fs::remove_file(dir.path().join("drafts")).unwrap();
    let written = draft("C-1002").await.unwrap();
    assert!(dir.path().join(written["path"].as_str().unwrap()).is_file());
}

#[tokio::test]
async fn file_with_court_posts_the_draft_upstream() {
    let (addr, seen) = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::new(
        demo_tools(&format!("http://{addr}/filings"), &addr.to_string()),
        &demo_env(dir.path()),
    );
    let scope = json!({"case_id": "C-1001", "matter_id": "M-2002"});
    let draft = gate
        .call(
            "draft_document",
            json!({"title": "Settlement offer", "body": "We offer terms."}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    let draft_id = draft["draft_id"].as_str().unwrap();

    let out = gate
        .call(
            "file_with_court",
            json!({"draft_id": draft_id}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    assert_eq!(
        out,
        json!({"draft_id": draft_id, "filing_id": "F-2026-0001", "status": "received"})
    );
    let requests = seen.0.lock().unwrap().clone();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].0, "/filings");
    assert_eq!(
        requests[0].1,
        json!({
            "case_id": "C-1001", "matter_id": "M-2002", "draft_id": draft_id,
            "title": "Settlement offer", "body": "We offer terms.", "sha256": draft["sha256"]
        })
    );

    let refusal = gate
        .call(
            "file_with_court",
            json!({"draft_id": "d-0000000000000000"}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap_err();
    assert_eq!(refusal.reason, Reason::ToolError);
    assert!(
        refusal.details["tool_error"]
            .as_str()
            .unwrap()
            .contains("not found")
    );

    assert_unsafe(
        gate.validate("file_with_court", json!({"draft_id": "../../etc"}), scope),
        "/draft_id",
    );
}

#[tokio::test]
async fn file_with_court_reports_a_down_court_as_dependency_down() {
    let addr = closed_port().await;
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::new(
        demo_tools(&format!("http://{addr}/filings"), &addr.to_string()),
        &demo_env(dir.path()),
    );
    let scope = json!({"case_id": "C-1001", "matter_id": "M-2002"});
    let draft = gate
        .call(
            "draft_document",
            json!({"title": "T", "body": "B"}),
            scope.clone(),
            2000,
        )
        .await
        .unwrap();
    let refusal = gate
        .call(
            "file_with_court",
            json!({"draft_id": draft["draft_id"]}),
            scope,
            2000,
        )
        .await
        .unwrap_err();
    assert_eq!(refusal.reason, Reason::DependencyDown, "{refusal:?}");
    assert!(refusal.diagnostic().retryable);
    println!("{}", refusal.details["dependency_error"]);
}

#[tokio::test]
async fn the_echo_builtin_returns_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::demo(&demo_env(dir.path()));
    let out = gate
        .call("disabled_tool", json!({"text": "hi"}), json!({}), 1000)
        .await
        .unwrap();
    assert_eq!(out, json!({"echo": {"text": "hi"}}));
}

// ===========================================================================
// command adapter

fn gate_with(tools: Vec<Tool>) -> (Gate, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::new(tools, &demo_env(dir.path()));
    (gate, dir)
}

#[tokio::test]
async fn command_tool_gets_the_arguments_on_stdin() {
    let (gate, _dir) = gate_with(vec![tool(
        "cat",
        command(&["cat"], &[]),
        any_object(),
        any_object(),
    )]);
    // Shell metacharacters are plain bytes: nothing runs them.
    let args =
        json!({"text": "$(touch /tmp/pwned); rm -rf / `id` | tee x & ; > y", "n": [1, 2.5, null]});
    gate.validate("cat", args.clone(), json!({})).unwrap();
    let out = gate
        .call("cat", args.clone(), json!({}), 5000)
        .await
        .unwrap();
    assert_eq!(out, args);
}

/// A real python3 binary: a version-manager shim (pyenv) would add its own variables.
fn python3() -> &'static str {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("python3")
}

#[tokio::test]
async fn command_tool_runs_with_a_cleared_environment() {
    let script = "import json, os, sys\n\
                  env = dict(e.split('=', 1) for e in open('/proc/self/environ').read().split('\\0') if e)\n\
                  print(json.dumps({'env': env, 'cwd': os.getcwd(), 'stdin': json.load(sys.stdin)}))";
    assert!(
        std::env::var_os("HOME").is_some(),
        "the test needs HOME set"
    );
    assert!(
        std::env::var_os("PATH").is_some(),
        "the test needs PATH set"
    );
    let (gate, _dir) = gate_with(vec![tool(
        "env",
        command(
            &[python3(), "-c", script],
            &["HOME", "TG_TEST_SURELY_UNSET_VAR"],
        ),
        any_object(),
        any_object(),
    )]);
    let scope = json!({"case_id": "C-1001", "sealed": false});
    let out = gate
        .call("env", json!({"q": 1}), scope.clone(), 10_000)
        .await
        .unwrap();
    let env = out["env"].as_object().unwrap();
    let names: Vec<&str> = env.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "HOME",
            "TOOLGATE_CALL_ID",
            "TOOLGATE_RUN_ID",
            "TOOLGATE_SCOPE"
        ]
    );
    assert_eq!(env["HOME"], std::env::var("HOME").unwrap());
    assert_eq!(env["TOOLGATE_CALL_ID"], "call-1");
    assert_eq!(env["TOOLGATE_RUN_ID"], "run-1");
    let sent_scope: Value = serde_json::from_str(env["TOOLGATE_SCOPE"].as_str().unwrap()).unwrap();
    assert_eq!(sent_scope, scope);
    assert_eq!(out["stdin"], json!({"q": 1}));
    // No working_dir: the directory of the tool registry.
    assert_eq!(
        Path::new(out["cwd"].as_str().unwrap())
            .canonicalize()
            .unwrap(),
        repo_tools_dir().canonicalize().unwrap()
    );
}

#[tokio::test]
async fn command_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; sleep 30 & sleep 30", pid_file.display());
    let (gate, _d) = gate_with(vec![tool(
        "sleepy",
        command(&["/bin/sh", "-c", &script], &[]),
        any_object(),
        any_object(),
    )]);
    let started = Instant::now();
    let result = gate.execute_raw("sleepy", json!({}), json!({}), 300).await;
    let elapsed = started.elapsed();
    println!("timeout returned after {elapsed:?} for a 300 ms deadline");
    assert_eq!(result, Err(ExecError::Timeout));
    assert!(elapsed < Duration::from_millis(1300), "took {elapsed:?}");

    let pgid = read_pid(&pid_file);
    let left = survivors_of(pgid).await;
    assert!(left.is_empty(), "processes left in group {pgid}: {left:?}");

    let (tool, _) = gate.parts("sleepy");
    let refusal = Adapter::classify_error(tool, &ExecError::Timeout);
    assert_eq!(refusal.reason, Reason::ToolTimeout);
    assert!(
        refusal.diagnostic().retryable,
        "the test tool is idempotent"
    );
}

#[tokio::test]
async fn a_cancelled_command_call_kills_the_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; sleep 30 & sleep 30", pid_file.display());
    let (gate, _d) = gate_with(vec![tool(
        "sleepy",
        command(&["/bin/sh", "-c", &script], &[]),
        any_object(),
        any_object(),
    )]);
    // The caller gives up long before the tool's own deadline: the future is dropped.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        gate.execute_raw("sleepy", json!({}), json!({}), 30_000),
    )
    .await;
    assert!(cancelled.is_err());
    let pgid = read_pid(&pid_file);
    let left = survivors_of(pgid).await;
    assert!(left.is_empty(), "processes left in group {pgid}: {left:?}");
}

#[tokio::test]
async fn command_failure_carries_the_exit_status_and_stderr_tail() {
    let noise = "x".repeat(10_000);
    let script = format!("echo {noise} >&2; echo 'boom: disk on fire' >&2; exit 3");
    let (gate, _dir) = gate_with(vec![tool(
        "fails",
        command(&["/bin/sh", "-c", &script], &[]),
        any_object(),
        any_object(),
    )]);
    let refusal = gate
        .call("fails", json!({}), json!({}), 5000)
        .await
        .unwrap_err();
    assert_eq!(refusal.reason, Reason::ToolError);
    let message = refusal.details["tool_error"].as_str().unwrap();
    assert!(message.contains("exited with status 3"), "{message}");
    assert!(message.contains("boom: disk on fire"), "{message}");
    assert!(
        message.len() <= adapter::MAX_TOOL_ERROR_BYTES,
        "{}",
        message.len()
    );
}

/// A program that cannot start (removed after the policy loaded, or a script whose
/// interpreter is missing) ran nothing: `dependency_down` with `reached_tool: false`,
/// so a retry is safe and an idempotency key is not spent on it.
#[tokio::test]
async fn a_command_that_cannot_start_reached_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let script = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        path
    };
    let removed = script("removed.sh", "#!/bin/sh\necho '{}'\n");
    let bad = script("bad.sh", "#!/nonexistent/interpreter\necho '{}'\n");
    let (gate, _data) = gate_with(vec![
        tool(
            "removed",
            command(&[removed.to_str().unwrap()], &[]),
            any_object(),
            any_object(),
        ),
        tool(
            "bad_interpreter",
            command(&[bad.to_str().unwrap()], &[]),
            any_object(),
            any_object(),
        ),
    ]);
    std::fs::remove_file(&removed).unwrap();
    for name in ["removed", "bad_interpreter"] {
        let refusal = gate
            .call(name, json!({}), json!({}), 5000)
            .await
            .unwrap_err();
        assert_eq!(
            refusal.reason,
            Reason::DependencyDown,
            "{name}: {refusal:?}"
        );
        assert_eq!(
            refusal.details["reached_tool"], false,
            "{name}: {refusal:?}"
        );
        assert!(refusal.diagnostic().retryable, "{name}");
    }
}

/// A program that writes a large output at once and exits: parsing it takes longer than
/// the call's deadline (seconds for 16 MiB of small objects in a test build), and the
/// deadline still holds: `tool_timeout`, not a success answered seconds late.
#[tokio::test]
async fn a_large_output_is_parsed_within_the_deadline() {
    let script = r#"
import sys
sys.stdout.write("[" + ",".join(['{"k":1}'] * 2_000_000) + "]")
"#;
    let mut big = tool(
        "big",
        command(&["python3", "-c", script], &[]),
        any_object(),
        json!({"type": "array"}),
    );
    big.limits.max_output_bytes = 1024 * 1024;
    let (gate, _dir) = gate_with(vec![big]);
    match gate.call("big", json!({}), json!({}), 1500).await {
        Ok(output) => panic!(
            "answered a success past the deadline ({} elements)",
            output.as_array().map_or(0, Vec::len)
        ),
        Err(refusal) => assert_eq!(refusal.reason, Reason::ToolTimeout, "{refusal:?}"),
    }
}

#[tokio::test]
async fn command_output_must_be_one_json_value() {
    let (gate, _dir) = gate_with(vec![
        tool(
            "prose",
            command(&["/bin/sh", "-c", "echo not json"], &[]),
            any_object(),
            any_object(),
        ),
        tool(
            "silent",
            command(&["/bin/sh", "-c", "true"], &[]),
            any_object(),
            any_object(),
        ),
        tool(
            "two",
            command(&["/bin/sh", "-c", "echo '{} {}'"], &[]),
            any_object(),
            any_object(),
        ),
    ]);
    for name in ["prose", "silent", "two"] {
        let r = gate.execute_raw(name, json!({}), json!({}), 5000).await;
        assert!(
            matches!(r, Err(ExecError::OutputNotJson(_))),
            "{name}: {r:?}"
        );
    }
    let (tool, _) = gate.parts("prose");
    let refusal = Adapter::classify_error(tool, &ExecError::OutputNotJson("x".into()));
    assert_eq!(refusal.reason, Reason::OutputSchemaViolation);
}

#[tokio::test]
async fn command_stdout_over_the_hard_cap_fails() {
    let (gate, _dir) = gate_with(vec![tool(
        "flood",
        command(&["head", "-c", "20000000", "/dev/zero"], &[]),
        any_object(),
        any_object(),
    )]);
    let r = gate
        .execute_raw("flood", json!({}), json!({}), 10_000)
        .await;
    match r {
        Err(ExecError::Failed(m)) => assert!(m.contains("more than 16777216 bytes"), "{m}"),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn command_arguments_with_nul_or_over_a_mebibyte_are_refused() {
    let (gate, _dir) = gate_with(vec![tool(
        "cat",
        command(&["cat"], &[]),
        any_object(),
        any_object(),
    )]);
    assert_unsafe(
        gate.validate("cat", json!({"a": {"b": "x\u{0}y"}}), json!({})),
        "/a/b",
    );
    assert_unsafe(
        gate.validate(
            "cat",
            json!({"big": "x".repeat(1024 * 1024 + 1)}),
            json!({}),
        ),
        "",
    );
}

// ===========================================================================
// http adapter

fn http_gate(addr: SocketAddr) -> (Gate, tempfile::TempDir) {
    let host = addr.to_string();
    let tools = ["echo", "fail", "missing", "text", "slow"]
        .into_iter()
        .map(|p| {
            tool(
                p,
                http(&format!("http://{addr}/{p}"), &[host.as_str()]),
                any_object(),
                any_object(),
            )
        })
        .collect();
    gate_with(tools)
}

#[tokio::test]
async fn http_tool_posts_json_and_returns_the_answer() {
    let (addr, _seen) = start_upstream().await;
    let (gate, _dir) = http_gate(addr);
    let args = json!({"query": "cover costs", "limit": 3});
    let out = gate
        .call("echo", args.clone(), json!({}), 5000)
        .await
        .unwrap();
    assert_eq!(
        out,
        json!({"received": args, "call_id": "call-1", "content_type": "application/json"})
    );
    // The pooled client serves a second call too.
    let out = gate
        .call("echo", json!({"n": 2}), json!({}), 5000)
        .await
        .unwrap();
    assert_eq!(out["received"], json!({"n": 2}));
}

#[tokio::test]
async fn http_errors_are_classified() {
    let (addr, _seen) = start_upstream().await;
    let (gate, _dir) = http_gate(addr);

    let r = gate
        .call("fail", json!({}), json!({}), 5000)
        .await
        .unwrap_err();
    assert_eq!(r.reason, Reason::DependencyDown, "{r:?}");
    assert!(r.diagnostic().retryable);
    assert!(
        r.details["dependency_error"]
            .as_str()
            .unwrap()
            .contains("500")
    );

    let r = gate
        .call("missing", json!({}), json!({}), 5000)
        .await
        .unwrap_err();
    assert_eq!(r.reason, Reason::ToolError, "{r:?}");
    let message = r.details["tool_error"].as_str().unwrap();
    assert!(
        message.contains("404") && message.contains("no such endpoint"),
        "{message}"
    );

    let r = gate
        .call("text", json!({}), json!({}), 5000)
        .await
        .unwrap_err();
    assert_eq!(r.reason, Reason::OutputSchemaViolation, "{r:?}");

    let started = Instant::now();
    let r = gate.execute_raw("slow", json!({}), json!({}), 300).await;
    let elapsed = started.elapsed();
    println!("http timeout returned after {elapsed:?} for a 300 ms deadline");
    assert_eq!(r, Err(ExecError::Timeout));
    assert!(elapsed < Duration::from_millis(1300), "took {elapsed:?}");
}

#[tokio::test]
async fn http_tool_with_nothing_listening_is_dependency_down() {
    let addr = closed_port().await;
    let (gate, _dir) = http_gate(addr);
    let r = gate
        .call("echo", json!({}), json!({}), 5000)
        .await
        .unwrap_err();
    assert_eq!(r.reason, Reason::DependencyDown, "{r:?}");
    assert!(r.diagnostic().retryable);
    println!("{}", r.details["dependency_error"]);
}

#[tokio::test]
async fn http_tool_refuses_url_arguments_outside_its_allowlist() {
    let (addr, seen) = start_upstream().await;
    let (gate, _dir) = http_gate(addr);
    assert_unsafe(
        gate.validate(
            "echo",
            json!({"url": "http://169.254.169.254/latest/meta-data"}),
            json!({}),
        ),
        "/url",
    );
    assert_unsafe(
        gate.validate("echo", json!({"links": ["file:///etc/passwd"]}), json!({})),
        "/links/0",
    );
    // Forms a URL parser reads as a URL to the metadata address though they have no
    // `scheme://` at their start (a hostile review's list).
    for sneaky in [
        "http:169.254.169.254/latest",
        "http:\\\\169.254.169.254/latest",
        "//169.254.169.254/latest",
        "ht\ttp://169.254.169.254/",
        "\u{1}http://169.254.169.254/",
        "see http://169.254.169.254/latest",
    ] {
        assert_unsafe(
            gate.validate("echo", json!({"url": sneaky}), json!({})),
            "/url",
        );
    }
    let own = format!("http://{addr}/echo");
    gate.validate("echo", json!({"url": own}), json!({}))
        .unwrap();
    assert!(
        seen.0.lock().unwrap().is_empty(),
        "validate never sends anything"
    );
}
