//! Traces and logs of the real server: a call carrying a W3C `traceparent` is exported
//! over OTLP/HTTP within that trace, and every call leaves one JSON log line with its
//! ids and outcome but no arguments or credentials.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{BIN, Server, Start, repo, token};
use serde_json::{Value, json};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_ID}-01")
}

/// What the collector received: (request line, body) per request.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A stand-in OTLP collector: accepts HTTP/1.1 requests on loopback, keeps each body,
/// answers 200. Serves until the test process ends (its threads are detached).
fn collector() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    let keep = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let keep = keep.clone();
            std::thread::spawn(move || serve_collector(stream, &keep));
        }
    });
    (url, received)
}

fn serve_collector(stream: TcpStream, keep: &Mutex<Vec<(String, Vec<u8>)>>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).unwrap();
        keep.lock()
            .unwrap()
            .push((request_line.trim_end().to_string(), body));
        let reply =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// Posts a tool call with a `traceparent` header.
fn traced_call(base: &str, run: &str, arguments: Value) -> Value {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let body = json!({
        "role_id": "research_agent", "run_id": run, "lane_id": "research",
        "tool_name": "legal_search", "arguments": arguments,
        "scope": {"case_id": "C-1001"},
    });
    let mut response = agent
        .post(format!("{base}/v1/tool-calls"))
        .header(
            "Authorization",
            &format!("Bearer {}", token("research_agent")),
        )
        .header("traceparent", &traceparent())
        .header("Content-Type", "application/json")
        .send(body.to_string().as_bytes())
        .unwrap();
    serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_call_is_exported_over_otlp_within_the_callers_trace() {
    let (url, received) = collector();
    let server = Server::start_with(Start {
        args: vec!["--otlp-endpoint".into(), url],
        env: vec![("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into())],
        ..Start::default()
    });
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let response = traced_call(&server.base, &run, json!({"query": "duty"}));
    assert_eq!(response["status"], "success", "{response}");
    let call_id = response["call_id"].as_str().unwrap().to_string();

    let trace_id = hex::decode(TRACE_ID).unwrap();
    let parent_id = hex::decode(PARENT_ID).unwrap();
    // Spans are exported in batches: the call span and its step spans may arrive in
    // separate requests, so look at every request that carries the caller's trace.
    let texts = [
        "execute_tool legal_search",
        "authorize",
        "execute",
        "audit_append",
        "legal_search",
    ];
    let mut requests = 0;
    let complete = common::poll_until(Duration::from_secs(30), || {
        let exported: Vec<(String, Vec<u8>)> = received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, body)| contains(body, &trace_id))
            .cloned()
            .collect();
        let seen = |needle: &[u8]| exported.iter().any(|(_, body)| contains(body, needle));
        let complete = seen(call_id.as_bytes()) && texts.iter().all(|text| seen(text.as_bytes()));
        if complete {
            for (request_line, _) in &exported {
                assert_eq!(request_line, "POST /v1/traces HTTP/1.1");
            }
            // The call span's parent is the caller's span.
            assert!(seen(&parent_id), "parent span id not in the export");
        }
        requests = exported.len();
        complete
    });
    assert!(
        complete,
        "the export of {call_id} is incomplete: {requests} requests with its trace"
    );
}

/// A server started by hand, its stderr (the logs) in a file.
struct Logged {
    child: Child,
    base: String,
    stderr: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_logged() -> Logged {
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr.log");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--policy-dir"])
        .arg(repo().join("policy"))
        .arg("--tools")
        .arg(repo().join("tools/tool_registry.yaml"))
        .arg("--data-dir")
        .arg(dir.path().join("var"))
        .env("TOOLGATE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = lines.next().expect("server exited").unwrap();
        if let Some(addr) = line.strip_prefix("toolgate listening on ") {
            break addr.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Logged {
        child,
        base,
        stderr,
        _dir: dir,
    }
}

#[test]
fn every_call_logs_one_json_line_without_arguments_or_credentials() {
    let server = start_logged();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut created = agent
        .post(format!("{}/v1/runs", server.base))
        .header("Authorization", "Bearer demo-admin")
        .send(
            json!({"scope": {"case_id": "C-1001"}})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    let run: Value = serde_json::from_str(&created.body_mut().read_to_string().unwrap()).unwrap();
    let run = run["run_id"].as_str().unwrap().to_string();

    let secret = "zebra-7781-confidential";
    let allowed = traced_call(&server.base, &run, json!({"query": secret}));
    assert_eq!(allowed["status"], "success", "{allowed}");
    let denied = traced_call(&server.base, &run, json!({"query": secret, "nope": 1}));
    assert_eq!(denied["status"], "denied", "{denied}");

    // The log line is written after the response; wait for both (bounded).
    let denied_id = denied["call_id"].as_str().unwrap();
    common::poll_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&server.stderr)
            .unwrap()
            .contains(denied_id)
    });
    let logs = std::fs::read_to_string(&server.stderr).unwrap();
    for (response, error_code) in [(&allowed, "-"), (&denied, "TOOL_INVALID_ARGUMENTS")] {
        let call_id = response["call_id"].as_str().unwrap();
        let lines: Vec<Value> = logs
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["call_id"] == call_id)
            .collect();
        assert_eq!(lines.len(), 1, "one line for {call_id} in:\n{logs}");
        let line = &lines[0];
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["message"], "tool call");
        assert_eq!(line["tool_name"], "legal_search");
        assert_eq!(line["status"], response["status"]);
        assert_eq!(line["error_code"], error_code, "{line}");
        assert!(line["duration_ms"].is_u64(), "{line}");
        assert_eq!(line["audit_event_id"], response["audit_event_id"]);
        assert_eq!(line["trace_id"], TRACE_ID);
    }
    assert!(
        !logs.contains(secret),
        "an argument reached the logs:\n{logs}"
    );
    assert!(
        !logs.contains(&token("research_agent")) && !logs.contains("demo-admin"),
        "a credential reached the logs:\n{logs}"
    );
}

/// Every span of every export request: (name, attributes as text), decoded by
/// opentelemetry-proto as a collector would.
fn spans(received: &Received) -> Vec<(String, std::collections::BTreeMap<String, String>)> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message as _;
    let mut out = Vec::new();
    for (_, body) in received.lock().unwrap().iter() {
        let request = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        for resource in &request.resource_spans {
            for scope in &resource.scope_spans {
                for span in &scope.spans {
                    let attributes = span
                        .attributes
                        .iter()
                        .filter_map(|kv| {
                            let text = match kv.value.as_ref()?.value.as_ref()? {
                                Any::StringValue(s) => s.clone(),
                                Any::BoolValue(b) => b.to_string(),
                                Any::IntValue(i) => i.to_string(),
                                _ => return None,
                            };
                            Some((kv.key.clone(), text))
                        })
                        .collect();
                    out.push((span.name.clone(), attributes));
                }
            }
        }
    }
    out
}

#[test]
fn call_spans_follow_the_genai_and_mcp_semantic_conventions() {
    let (url, received) = collector();
    let tmp = tempfile::tempdir().unwrap();
    let mut start = common::lab::lab(tmp.path());
    start.args = vec!["--otlp-endpoint".into(), url];
    start.env = vec![("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into())];
    let server = Server::start_with(start);
    let run = server.create_run(json!({}));
    let (_, ok) = common::lab::call(&server, &run, "echo_cmd", json!({"text": "hi"}), json!({}));
    assert_eq!(ok["status"], "success", "{ok}");
    let (_, failed) = common::lab::call(&server, &run, "failing", json!({}), json!({}));
    assert_eq!(failed["status"], "failed", "{failed}");
    // The same tool over MCP (a raw JSON-RPC tools/call).
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let rpc = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo_cmd", "arguments": {"text": "over mcp"}}});
    let mut answer = agent
        .post(format!("{}/mcp", server.base))
        .header("Authorization", "Bearer demo-tester")
        .header("X-Toolgate-Role", "tester")
        .header("X-Toolgate-Run", &run)
        .header("X-Toolgate-Lane", "lab")
        .header("X-Toolgate-Scope", "{}")
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .send(rpc.to_string().as_bytes())
        .unwrap();
    let text = answer.body_mut().read_to_string().unwrap();
    let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let mcp_call = answer["result"]["_meta"]["io.toolgate/call_id"]
        .as_str()
        .map(str::to_string);

    let ids = [
        ok["call_id"].as_str().unwrap(),
        failed["call_id"].as_str().unwrap(),
    ];
    let find = |call_id: &str| {
        spans(&received)
            .into_iter()
            .find(|(_, a)| a.get("gen_ai.tool.call.id").map(String::as_str) == Some(call_id))
    };
    assert!(
        common::poll_until(Duration::from_secs(30), || ids
            .iter()
            .all(|id| find(id).is_some())
            && spans(&received)
                .iter()
                .any(|(_, a)| a.get("mcp.method.name").is_some())),
        "spans missing: {:?}",
        spans(&received)
    );
    let (name, a) = find(ids[0]).unwrap();
    assert_eq!(name, "execute_tool echo_cmd");
    assert_eq!(a["gen_ai.operation.name"], "execute_tool");
    assert_eq!(a["gen_ai.tool.name"], "echo_cmd");
    assert!(!a.contains_key("error.type"), "{a:?}");
    assert!(!a.contains_key("mcp.method.name"), "{a:?}");
    // toolgate's own attributes stay beside them.
    assert_eq!(a["call_id"], ids[0]);
    assert_eq!(a["run_id"], run);
    assert_eq!(a["status"], "success");
    let (name, a) = find(ids[1]).unwrap();
    assert_eq!(name, "execute_tool failing");
    assert_eq!(a["gen_ai.tool.name"], "failing");
    assert_eq!(a["error.type"], failed["error_code"].as_str().unwrap());
    let (name, a) = spans(&received)
        .into_iter()
        .find(|(_, a)| a.get("mcp.method.name").is_some())
        .unwrap();
    assert_eq!(name, "execute_tool echo_cmd");
    assert_eq!(a["mcp.method.name"], "tools/call");
    assert_eq!(a["gen_ai.operation.name"], "execute_tool");
    if let Some(id) = mcp_call {
        assert_eq!(a["gen_ai.tool.call.id"], id);
    }
}
