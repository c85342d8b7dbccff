//! Outbound credentials (issue 41): the registry's `secrets:`, `auth:` on http tools
//! (bearer, basic, OAuth 2.0 client credentials, mTLS), `ca:` for private CAs, and
//! scrubbing, with real parts on loopback: TLS upstreams with certificates made here
//! (rcgen), a real token endpoint, the real server for reloads and for grepping what
//! it keeps, and the loader's refusals with file:line:col.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use crate::common::lab::{read_request, sha};
use crate::common::{Server, Start};
use toolgate::adapter::{self, Adapter, AdapterEnv, Adapters, ExecContext};
use toolgate::diagnostic::{Reason, Refusal};
use toolgate::policy::{self, Policy, Problem};

const ROLES: &str = r#"
version: "r-1"
roles:
  - role_id: tester
    description: Calls the tools.
    enabled: true
    lanes: [lab]
    credential: {token_sha256: TESTER_SHA}
admins:
  - admin_id: ops
    description: Reloads.
    credential: {token_sha256: ADMIN_SHA}
"#;

/// One request as an upstream saw it: its head (request line and headers) and body.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) head: String,
    pub(crate) body: Vec<u8>,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

pub(crate) type Log = Arc<Mutex<Vec<Seen>>>;

/// A plain-TCP HTTP server on 127.0.0.1, one thread per connection, answering each
/// request with `answer(request)`: (status, content-type, body).
pub(crate) fn http_server(
    answer: impl Fn(&Seen) -> (u16, String) + Send + Sync + 'static,
) -> (String, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let log: Log = Arc::default();
    let recorder = log.clone();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(mut tcp) = tcp else { continue };
            let (recorder, answer) = (recorder.clone(), answer.clone());
            std::thread::spawn(move || {
                tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let (head, body) = read_request(&mut tcp);
                if head.is_empty() {
                    return;
                }
                let seen = Seen { head, body };
                let (status, text) = answer(&seen);
                recorder.lock().unwrap().push(seen);
                let _ = tcp.write_all(response(status, &text).as_bytes());
            });
        }
    });
    (addr, log)
}

fn response(status: u16, body: &str) -> String {
    let kind = if body.starts_with('{') {
        "application/json"
    } else {
        "text/plain"
    };
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A tool entry of kind http (the adapter's fields as a YAML flow mapping body).
pub(crate) fn tool_entry(name: &str, adapter: &str, timeout_ms: u64) -> String {
    format!(
        r#"  - tool_name: {name}
    description: An outbound test tool.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: {timeout_ms}
    limits: {{timeout_ms_max: 20000, max_output_bytes: 65536, max_concurrency: 8}}
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

/// Writes roles, lanes and a registry (`secrets` section text, then `tools`) under
/// `dir`; returns the policy directory and the registry's path.
pub(crate) fn write_policy(
    dir: &Path,
    secrets: &str,
    tools: &[(&str, String)],
) -> (PathBuf, PathBuf) {
    let policy_dir = dir.join("policy");
    let tools_dir = dir.join("tools");
    std::fs::create_dir_all(&policy_dir).unwrap();
    std::fs::create_dir_all(&tools_dir).unwrap();
    std::fs::write(
        policy_dir.join("roles.yaml"),
        ROLES
            .replace("TESTER_SHA", &sha("demo-tester"))
            .replace("ADMIN_SHA", &sha("demo-admin")),
    )
    .unwrap();
    let names: Vec<&str> = tools.iter().map(|(n, _)| *n).collect();
    std::fs::write(
        policy_dir.join("lanes.yaml"),
        format!(
            "version: \"r-1\"\nlanes:\n  - lane_id: lab\n    description: Test lane.\n    tools: [{}]\n    required_scope_keys: []\n    prohibited_flags: []\n    run_statuses: [active]\n    write: false\n",
            names.join(", ")
        ),
    )
    .unwrap();
    let mut registry = format!("version: \"r-1\"\n{secrets}tools:\n");
    for (_, entry) in tools {
        registry.push_str(entry);
    }
    let tools_file = tools_dir.join("tool_registry.yaml");
    std::fs::write(&tools_file, registry).unwrap();
    (policy_dir, tools_file)
}

/// A secret file (mode 0600) in `dir/tools`.
pub(crate) fn secret_file(dir: &Path, name: &str, value: &str) -> PathBuf {
    let path = dir.join("tools").join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, value).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// The loaded policy and its adapters, called the way the pipeline calls them.
struct Gate {
    policy: Policy,
    adapters: Adapters,
}

impl Gate {
    fn new(dir: &Path, secrets: &str, tools: &[(&str, String)], files: &[(&str, &str)]) -> Gate {
        std::fs::create_dir_all(dir.join("tools")).unwrap();
        for (name, value) in files {
            secret_file(dir, name, value);
        }
        let (policy_dir, tools_file) = write_policy(dir, secrets, tools);
        let policy = policy::load(&policy_dir, &tools_file).expect("the registry loads");
        let env = AdapterEnv {
            tools_dir: dir.join("tools"),
            data_dir: dir.join("var"),
        };
        let adapters = adapter::build(&policy, &env).expect("adapters build");
        Gate { policy, adapters }
    }

    async fn call(&self, name: &str, arguments: Value) -> Result<Value, Refusal> {
        let tool = &self.policy.tools[name];
        let adapter = &self.adapters.by_tool[name];
        let scope = Map::new();
        adapter.validate(tool, &arguments, &scope)?;
        let ctx = ExecContext {
            call_id: "call-1",
            run_id: "run-1",
            scope: &scope,
            deadline: Instant::now() + Duration::from_millis(tool.timeout_default_ms),
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

// ---------------------------------------------------------------------------------
// A real OAuth 2.0 token endpoint.

/// Counts tokens issued (`tok-1`, `tok-2`, ...), each valid for `lifetime_s`.
struct TokenEndpoint {
    addr: String,
    issued: Arc<AtomicUsize>,
    requests: Log,
}

fn token_endpoint(lifetime_s: u64) -> TokenEndpoint {
    let issued = Arc::new(AtomicUsize::new(0));
    let counter = issued.clone();
    let (addr, requests) = http_server(move |seen| {
        let expected = format!("Basic {}", base64_encode("my-client:client-secret-value-1"));
        if seen.header("authorization").as_deref() != Some(expected.as_str()) {
            return (401, json!({"error": "invalid_client"}).to_string());
        }
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        (
            200,
            json!({"access_token": format!("tok-{n}-abcdefgh"), "token_type": "Bearer", "expires_in": lifetime_s})
                .to_string(),
        )
    });
    TokenEndpoint {
        addr,
        issued,
        requests,
    }
}

pub(crate) fn base64_encode(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

const CLIENT_SECRETS: &str = "secrets:\n  - {id: client_secret, from: {file: client.secret}}\n";

fn client_credentials_tool(name: &str, upstream: &str, token_url: &str, timeout_ms: u64) -> String {
    tool_entry(
        name,
        &format!(
            "method: GET, url: \"http://{upstream}/Patient/{{args.patient_id}}\", allowed_hosts: [\"{upstream}\"], auth: {{oauth2_client_credentials: {{token_url: \"{token_url}\", client_id: my-client, client_secret: \"${{secret:client_secret}}\", scope: patient.read}}}}"
        ),
        timeout_ms,
    )
}

/// An upstream that answers 401 to the tokens in `revoked` and echoes what it saw.
fn fhir_upstream(revoked: Arc<Mutex<Vec<String>>>) -> (String, Log) {
    http_server(move |seen| {
        let auth = seen.header("authorization").unwrap_or_default();
        let token = auth.strip_prefix("Bearer ").unwrap_or("").to_string();
        if token.is_empty() || revoked.lock().unwrap().contains(&token) {
            return (401, json!({"issue": "token refused"}).to_string());
        }
        let target = seen
            .head
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_string();
        (
            200,
            json!({"resourceType": "Patient", "target": target}).to_string(),
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_are_fetched_once_cached_and_refreshed_after_expiry_and_after_a_401() {
    let dir = tempfile::tempdir().unwrap();
    // Valid for 31 s: fresh for 1 s under the 30 s skew.
    let endpoint = token_endpoint(31);
    let revoked: Arc<Mutex<Vec<String>>> = Arc::default();
    let (upstream, seen) = fhir_upstream(revoked.clone());
    let token_url = format!("http://{}/oauth/token", endpoint.addr);
    let gate = Gate::new(
        dir.path(),
        CLIENT_SECRETS,
        &[(
            "read_patient",
            client_credentials_tool("read_patient", &upstream, &token_url, 5000),
        )],
        &[("client.secret", "client-secret-value-1\n")],
    );
    // Two calls, one token: the second is served from the cache.
    for _ in 0..2 {
        let out = gate
            .call("read_patient", json!({"patient_id": "p-17"}))
            .await
            .unwrap();
        assert_eq!(out["target"], "/Patient/p-17");
    }
    assert_eq!(endpoint.issued.load(Ordering::SeqCst), 1);
    {
        let requests = endpoint.requests.lock().unwrap();
        let form = String::from_utf8(requests[0].body.clone()).unwrap();
        assert!(form.contains("grant_type=client_credentials"), "{form}");
        assert!(form.contains("scope=patient.read"), "{form}");
        assert!(
            !form.contains("client-secret-value-1"),
            "the secret goes in the header"
        );
    }
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|s| s.header("authorization").as_deref() == Some("Bearer tok-1-abcdefgh"))
    );

    // Past its freshness, the next call fetches a new token (polled on what the
    // endpoint issued, not slept on).
    let refreshed = {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            gate.call("read_patient", json!({"patient_id": "p-17"}))
                .await
                .unwrap();
            if endpoint.issued.load(Ordering::SeqCst) >= 2 {
                break true;
            }
            if std::time::Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert!(refreshed, "no new token after the first expired");
    let last = seen.lock().unwrap().last().unwrap().header("authorization");
    assert_eq!(last.as_deref(), Some("Bearer tok-2-abcdefgh"));

    // The upstream refuses the cached token: the call fails retryable, nothing is
    // resent, and the next call uses a new token.
    revoked.lock().unwrap().push("tok-2-abcdefgh".to_string());
    let before = seen.lock().unwrap().len();
    let r = gate
        .call("read_patient", json!({"patient_id": "p-18"}))
        .await
        .unwrap_err();
    assert_eq!(r.reason, Reason::DependencyDown, "{r:?}");
    assert!(r.diagnostic().retryable);
    assert!(
        !r.details.to_string().contains("tok-2-abcdefgh"),
        "{}",
        r.details
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        before + 1,
        "sent once, never resent"
    );
    let out = gate
        .call("read_patient", json!({"patient_id": "p-18"}))
        .await
        .unwrap();
    assert_eq!(out["target"], "/Patient/p-18");
    assert_eq!(endpoint.issued.load(Ordering::SeqCst), 3);
}

#[test]
fn after_a_401_a_keyed_idempotent_call_is_sent_again_with_a_new_token_and_an_unkeyed_one_fails_retryable()
 {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = token_endpoint(3600);
    let revoked: Arc<Mutex<Vec<String>>> = Arc::default();
    let (upstream, seen) = fhir_upstream(revoked.clone());
    let token_url = format!("http://{}/oauth/token", endpoint.addr);
    secret_file(dir.path(), "client.secret", "client-secret-value-1");
    let (policy_dir, tools_file) = write_policy(
        dir.path(),
        CLIENT_SECRETS,
        &[(
            "read_patient",
            client_credentials_tool("read_patient", &upstream, &token_url, 5000),
        )],
    );
    let server = Server::start_with(Start {
        policy_dir,
        tools: tools_file,
        ..Start::default()
    });
    let run = server.create_run(json!({}));
    let call = |patient: &str, extra: Value| {
        crate::common::lab::call(
            &server,
            &run,
            "read_patient",
            json!({"patient_id": patient}),
            extra,
        )
    };
    let (status, body) = call("p-1", json!({}));
    assert_eq!(status, 200, "{body}");
    let sent = |n: usize| {
        let seen = seen.lock().unwrap();
        seen[seen.len() - n..]
            .iter()
            .map(|s| s.header("authorization").unwrap_or_default())
            .collect::<Vec<_>>()
    };

    // The upstream refuses the cached token. Keyed (the tool is idempotent): the
    // token is dropped, a new one fetched, and the request sent once more.
    revoked.lock().unwrap().push("tok-1-abcdefgh".to_string());
    let (status, body) = call("p-2", json!({"idempotency_key": "read-p-2"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["target"], "/Patient/p-2", "{body}");
    assert_eq!(
        sent(2),
        ["Bearer tok-1-abcdefgh", "Bearer tok-2-abcdefgh"],
        "sent twice, the second time with the new token"
    );
    assert_eq!(endpoint.issued.load(Ordering::SeqCst), 2);

    // Not keyed: the call fails retryable after one request, and the next call uses a
    // new token.
    revoked.lock().unwrap().push("tok-2-abcdefgh".to_string());
    let before = seen.lock().unwrap().len();
    let (status, body) = call("p-3", json!({}));
    assert_eq!(body["diagnostic"]["reason"], "dependency_down", "{body}");
    assert_eq!(body["diagnostic"]["retryable"], true, "{body}");
    // Refused at the door (401): the upstream did not act on it.
    assert_eq!(
        body["diagnostic"]["details"]["reached_tool"], false,
        "{body}"
    );
    assert!(status >= 500, "{status}");
    assert_eq!(seen.lock().unwrap().len(), before + 1, "sent once");
    assert!(!body.to_string().contains("tok-2-abcdefgh"), "{body}");
    let (status, body) = call("p-3", json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(sent(1), ["Bearer tok-3-abcdefgh"]);

    // A new token refused too: the keyed call is sent twice, never a third time.
    revoked.lock().unwrap().push("tok-3-abcdefgh".to_string());
    revoked.lock().unwrap().push("tok-4-abcdefgh".to_string());
    let before = seen.lock().unwrap().len();
    let (_, body) = call("p-4", json!({"idempotency_key": "read-p-4"}));
    assert_eq!(body["diagnostic"]["reason"], "dependency_down", "{body}");
    assert_eq!(seen.lock().unwrap().len(), before + 2, "{body}");
}

/// Token endpoints that fail each its own way.
pub(crate) fn failing_endpoints() -> Vec<(&'static str, String)> {
    // Down: a port bound, then closed.
    let down = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    // Slow: accepts and never answers.
    let slow = TcpListener::bind("127.0.0.1:0").unwrap();
    let slow_addr = slow.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for tcp in slow.incoming() {
            held.push(tcp);
        }
    });
    let (garbage, _) = http_server(|_| (200, "<html>not a token</html>".to_string()));
    // 10 MB of JSON-looking bytes, streamed.
    let huge = TcpListener::bind("127.0.0.1:0").unwrap();
    let huge_addr = huge.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for tcp in huge.incoming() {
            let Ok(mut tcp) = tcp else { continue };
            std::thread::spawn(move || {
                let _ = read_request(&mut tcp);
                let size = 10 * 1024 * 1024;
                let _ = tcp.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"access_token\": \"",
                );
                let chunk = vec![b'a'; 64 * 1024];
                for _ in 0..size / chunk.len() {
                    if tcp.write_all(&chunk).is_err() {
                        return;
                    }
                }
            });
        }
    });
    vec![
        ("down", down),
        ("slow", slow_addr),
        ("garbage", garbage),
        ("huge", huge_addr),
    ]
}

#[test]
fn a_token_endpoint_down_slow_garbage_or_huge_fails_closed_and_the_sidecar_stays_responsive() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, seen) = http_server(|_| (200, json!({"ok": true}).to_string()));
    let endpoints = failing_endpoints();
    let mut tools: Vec<(&str, String)> = endpoints
        .iter()
        .map(|(name, addr)| {
            (
                *name,
                client_credentials_tool(name, &upstream, &format!("http://{addr}/token"), 2000),
            )
        })
        .collect();
    tools.push((
        "plain",
        tool_entry(
            "plain",
            &format!("url: \"http://{upstream}/plain\", allowed_hosts: [\"{upstream}\"]"),
            2000,
        ),
    ));
    secret_file(dir.path(), "client.secret", "client-secret-value-1");
    let (policy_dir, tools_file) = write_policy(dir.path(), CLIENT_SECRETS, &tools);
    let server = Server::start_with(Start {
        policy_dir,
        tools: tools_file,
        ..Start::default()
    });
    let run = server.create_run(json!({}));
    for (name, _) in &endpoints {
        let (status, body) =
            crate::common::lab::call(&server, &run, name, json!({"patient_id": "p-1"}), json!({}));
        let diagnostic = &body["diagnostic"];
        assert_eq!(diagnostic["reason"], "dependency_down", "{name}: {body}");
        assert_eq!(
            diagnostic["details"]["reached_tool"], false,
            "{name}: {body}"
        );
        assert_eq!(diagnostic["retryable"], true, "{name}: {body}");
        assert!(status >= 500, "{name}: {status}");
        assert!(!body.to_string().contains("client-secret-value-1"));
    }
    assert!(seen.lock().unwrap().is_empty(), "nothing reached the tool");
    let (status, body) = crate::common::lab::call(&server, &run, "plain", json!({}), json!({}));
    assert_eq!(status, 200, "{body}");
    let (status, _) = server.get("/healthz", None);
    assert_eq!(status, 200);
}

// ---------------------------------------------------------------------------------
// Secrets: scrubbed everywhere, rotated on reload.

#[test]
fn a_secret_an_upstream_echoes_appears_nowhere_and_a_rotated_one_is_used_after_reload() {
    let dir = tempfile::tempdir().unwrap();
    const FIRST: &str = "first-secret-Zq81x";
    const SECOND: &str = "second-secret-Pw77k";
    // Echoes the key back: in a 400's body, in a 200's JSON, as base64 too.
    let (upstream, seen) = http_server(|seen| {
        let key = seen.header("x-api-key").unwrap_or_default();
        if seen.head.starts_with("POST /bad") {
            (
                400,
                format!("invalid key {key} (b64 {})", base64_encode(&key)),
            )
        } else {
            (
                200,
                json!({"you_sent": key, "note": format!("key={key}")}).to_string(),
            )
        }
    });
    let secret = secret_file(dir.path(), "api.key", &format!("{FIRST}\n"));
    let entry = |name: &str, path: &str| {
        tool_entry(
            name,
            &format!(
                "url: \"http://{upstream}/{path}\", allowed_hosts: [\"{upstream}\"], headers: {{x-api-key: \"${{secret:api_key}}\"}}"
            ),
            5000,
        )
    };
    let (policy_dir, tools_file) = write_policy(
        dir.path(),
        "secrets:\n  - id: api_key\n    from: {file: api.key}\n",
        &[
            ("bad_call", entry("bad_call", "bad")),
            ("echo_call", entry("echo_call", "echo")),
        ],
    );
    let data_dir = dir.path().join("var");
    let server = Server::start_with(Start {
        policy_dir,
        tools: tools_file,
        data_dir: Some(data_dir.clone()),
        ..Start::default()
    });
    let run = server.create_run(json!({}));
    let mut answers = Vec::new();
    let (_, body) = crate::common::lab::call(&server, &run, "bad_call", json!({}), json!({}));
    assert_eq!(body["diagnostic"]["reason"], "tool_error", "{body}");
    assert!(body.to_string().contains("[secret]"), "{body}");
    answers.push(body);
    let (status, body) = crate::common::lab::call(&server, &run, "echo_call", json!({}), json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["you_sent"], "[secret]", "{body}");
    answers.push(body);
    assert_eq!(
        seen.lock().unwrap()[0].header("x-api-key").as_deref(),
        Some(FIRST)
    );

    // Rotated by rewriting the file, then a reload: the next call sends the new value.
    std::fs::write(&secret, SECOND).unwrap();
    let (status, body) = server.post("/v1/policy/reload", Some("demo-admin"), &json!({}));
    assert_eq!(status, 200, "{body}");
    let (_, body) = crate::common::lab::call(&server, &run, "bad_call", json!({}), json!({}));
    assert_eq!(body["diagnostic"]["reason"], "tool_error", "{body}");
    answers.push(body);
    assert_eq!(
        seen.lock()
            .unwrap()
            .last()
            .unwrap()
            .header("x-api-key")
            .as_deref(),
        Some(SECOND)
    );
    let (status, events) = server.get(&format!("/v1/runs/{run}/events"), Some("demo-admin"));
    assert_eq!(status, 200);
    answers.push(events);
    let metrics = server.metrics();
    let logs = server.log_lines_with("");
    assert!(server.stop().success());

    let forms = [
        FIRST.to_string(),
        SECOND.to_string(),
        base64_encode(FIRST),
        base64_encode(SECOND),
    ];
    for form in &forms {
        for answer in &answers {
            assert!(
                !answer.to_string().contains(form.as_str()),
                "{form} in {answer}"
            );
        }
        assert!(!metrics.contains(form.as_str()), "{form} in the metrics");
        assert!(
            logs.iter().all(|l| !l.contains(form.as_str())),
            "{form} in the logs"
        );
        for file in files_under(&data_dir) {
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                !bytes.windows(form.len()).any(|w| w == form.as_bytes()),
                "{form} in {}",
                file.display()
            );
        }
    }
}

pub(crate) fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

// ---------------------------------------------------------------------------------
// TLS: a private CA, a client certificate, an untrusted upstream.

struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
}

fn pki(name: &str) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("toolgate outbound test CA {name}"),
    );
    let cert = ca.self_signed(&ca_key).unwrap();
    Pki {
        ca_pem: cert.pem(),
        ca_der: cert.der().clone(),
        issuer: Issuer::new(ca, ca_key),
    }
}

/// A leaf certificate of `pki` for `names`: (PEM chain, PEM key, DER chain, DER key).
fn leaf(
    pki: &Pki,
    names: &[&str],
) -> (
    String,
    String,
    Vec<CertificateDer<'static>>,
    PrivateKeyDer<'static>,
) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&key, &pki.issuer)
        .unwrap();
    (
        cert.pem(),
        key.serialize_pem(),
        vec![cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
}

/// An https upstream with a certificate of `server`, requiring a client certificate
/// of `clients` when given. Answers JSON naming whether it saw a client certificate;
/// counts the requests it read.
fn tls_upstream(server: &Pki, clients: Option<&Pki>) -> (SocketAddr, Arc<AtomicUsize>) {
    tls_upstream_for(server, clients, &["127.0.0.1", "localhost"])
}

/// [`tls_upstream`] with a certificate for `names`.
fn tls_upstream_for(
    server: &Pki,
    clients: Option<&Pki>,
    names: &[&str],
) -> (SocketAddr, Arc<AtomicUsize>) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let (_, _, chain, key) = leaf(server, names);
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let config = match clients {
        Some(clients) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(clients.ca_der.clone()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)
                .unwrap()
        }
        None => builder
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    };
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { continue };
            let (config, counted) = (config.clone(), counted.clone());
            std::thread::spawn(move || {
                tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let (head, _) = read_request(&mut tls);
                if head.is_empty() {
                    return;
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let client_cert = tls.conn.peer_certificates().is_some_and(|c| !c.is_empty());
                let body = json!({"client_cert": client_cert}).to_string();
                let _ = tls.write_all(response(200, &body).as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    (addr, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_upstreams_with_a_private_ca_a_client_certificate_and_an_untrusted_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let tools_dir = dir.path().join("tools");
    std::fs::create_dir_all(&tools_dir).unwrap();
    let private = pki("private");
    let other = pki("other");
    let client_ca = pki("clients");
    std::fs::write(tools_dir.join("private-ca.pem"), &private.ca_pem).unwrap();
    let (cert_pem, key_pem, _, _) = leaf(&client_ca, &["toolgate-sidecar"]);
    std::fs::write(tools_dir.join("client.pem"), cert_pem).unwrap();
    secret_file(dir.path(), "client.key", &key_pem);

    let (trusted, trusted_seen) = tls_upstream(&private, None);
    let (mutual, mutual_seen) = tls_upstream(&private, Some(&client_ca));
    let (untrusted, untrusted_seen) = tls_upstream(&other, None);
    let https = |name: &str, addr: SocketAddr, extra: &str| {
        tool_entry(
            name,
            &format!("url: \"https://{addr}/x\", allowed_hosts: [\"{addr}\"]{extra}"),
            5000,
        )
    };
    let gate = Gate::new(
        dir.path(),
        "",
        &[
            (
                "private_ca",
                https("private_ca", trusted, ", ca: private-ca.pem"),
            ),
            (
                "mutual",
                https(
                    "mutual",
                    mutual,
                    ", auth: {mtls: {cert: client.pem, key: client.key, ca: private-ca.pem}}",
                ),
            ),
            (
                "mutual_without_cert",
                https("mutual_without_cert", mutual, ", ca: private-ca.pem"),
            ),
            (
                "untrusted",
                https("untrusted", untrusted, ", ca: private-ca.pem"),
            ),
        ],
        &[],
    );
    let out = gate.call("private_ca", json!({})).await.unwrap();
    assert_eq!(out["client_cert"], false);
    let out = gate.call("mutual", json!({})).await.unwrap();
    assert_eq!(out["client_cert"], true);
    assert_eq!(trusted_seen.load(Ordering::SeqCst), 1);
    assert_eq!(mutual_seen.load(Ordering::SeqCst), 1);

    // A certificate the private CA did not issue is refused at the handshake:
    // nothing is sent. Without its certificate the mutual upstream refuses the
    // connection (under TLS 1.3 after the client's part of the handshake, so the
    // adapter cannot tell whether request bytes left; the upstream read none).
    let r = gate.call("untrusted", json!({})).await.unwrap_err();
    assert_eq!(r.reason, Reason::DependencyDown, "{r:?}");
    assert_eq!(r.details["reached_tool"], false, "{r:?}");
    let r = gate
        .call("mutual_without_cert", json!({}))
        .await
        .unwrap_err();
    assert_eq!(r.reason, Reason::DependencyDown, "{r:?}");
    assert!(
        r.details["dependency_error"]
            .as_str()
            .unwrap()
            .contains("CertificateRequired"),
        "{r:?}"
    );
    assert_eq!(mutual_seen.load(Ordering::SeqCst), 1);
    assert_eq!(untrusted_seen.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_and_basic_credentials_are_added_after_the_check_and_scrubbed() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, seen) = http_server(|seen| {
        let auth = seen.header("authorization").unwrap_or_default();
        (403, format!("refused credential: {auth}"))
    });
    let entry = |name: &str, auth: &str| {
        tool_entry(
            name,
            &format!("url: \"http://{upstream}/x\", allowed_hosts: [\"{upstream}\"], auth: {auth}"),
            5000,
        )
    };
    let gate = Gate::new(
        dir.path(),
        "secrets:\n  - {id: token, from: {file: token.txt}}\n  - {id: password, from: {file: password.txt}}\n",
        &[
            ("bearer", entry("bearer", "{bearer: \"${secret:token}\"}")),
            (
                "basic",
                entry(
                    "basic",
                    "{basic: {username: svc, password: \"${secret:password}\"}}",
                ),
            ),
        ],
        &[
            ("token.txt", "bearer-token-value-9"),
            ("password.txt", "pass-word-value-7"),
        ],
    );
    let r = gate.call("bearer", json!({})).await.unwrap_err();
    assert_eq!(r.reason, Reason::ToolError);
    let r2 = gate.call("basic", json!({})).await.unwrap_err();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen[0].header("authorization").as_deref(),
        Some("Bearer bearer-token-value-9")
    );
    let basic = format!("Basic {}", base64_encode("svc:pass-word-value-7"));
    assert_eq!(
        seen[1].header("authorization").as_deref(),
        Some(basic.as_str())
    );
    for text in [r.details.to_string(), r2.details.to_string()] {
        assert!(text.contains("[secret]"), "{text}");
        assert!(!text.contains("bearer-token-value-9"), "{text}");
        assert!(
            !text.contains(&base64_encode("svc:pass-word-value-7")),
            "{text}"
        );
    }
    // The policy's serialized form holds references, never values.
    let shown = serde_json::to_string(&json!(gate.policy.tools["basic"].adapter)).unwrap();
    assert!(
        shown.contains("${secret:password}") && !shown.contains("pass-word"),
        "{shown}"
    );
}

// ---------------------------------------------------------------------------------
// Refused at load, located.

#[test]
fn bad_secrets_and_auth_are_refused_at_load_with_a_position() {
    let root = tempfile::tempdir().unwrap();
    let ok = "url: \"http://127.0.0.1:9/x\", allowed_hosts: [\"127.0.0.1:9\"]";
    let secret = "secrets:\n  - {id: key, from: {file: key.txt}}\n";
    struct Case {
        secrets: &'static str,
        adapter: String,
        prepare: fn(&Path),
        expected: &'static str,
    }
    let fine: fn(&Path) = |tools| {
        std::fs::write(tools.join("key.txt"), "a-fine-secret-value").unwrap();
        std::fs::set_permissions(
            tools.join("key.txt"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
    };
    let cases = [
        Case {
            secrets: secret,
            adapter: format!("{ok}, headers: {{x-key: \"${{secret:missing}}\"}}"),
            prepare: fine,
            expected: "`${secret:missing}` is not in the registry's `secrets:`",
        },
        Case {
            secrets: secret,
            adapter: "url: \"http://127.0.0.1:9/${secret:key}\", allowed_hosts: [\"127.0.0.1:9\"]"
                .to_string(),
            prepare: fine,
            expected: "may not stand here",
        },
        Case {
            secrets: secret,
            adapter: format!("{ok}, query: {{k: \"${{secret:key}}\"}}"),
            prepare: fine,
            expected: "may not stand here",
        },
        Case {
            secrets: secret,
            adapter: "url: \"http://${secret:key}/x\", allowed_hosts: [\"127.0.0.1:9\"]"
                .to_string(),
            prepare: fine,
            expected: "may not stand here",
        },
        Case {
            secrets: secret,
            adapter: format!("{ok}, headers: {{x-key: \"${{env:HOME}}\"}}"),
            prepare: fine,
            expected: "may not stand here",
        },
        Case {
            secrets: "",
            adapter:
                "url: \"http://${env:TOOLGATE_TEST_UNSET_VAR}/x\", allowed_hosts: [\"127.0.0.1:9\"]"
                    .to_string(),
            prepare: fine,
            expected: "is not set",
        },
        Case {
            secrets: secret,
            adapter: format!("{ok}, auth: {{kerberos: \"${{secret:key}}\"}}"),
            prepare: fine,
            expected: "kerberos",
        },
        Case {
            secrets: secret,
            adapter: format!("{ok}, auth: {{bearer: literal-token-in-the-registry}}"),
            prepare: fine,
            expected: "instead of referring to a secret",
        },
        Case {
            secrets: secret,
            adapter: format!(
                "{ok}, auth: {{oauth2_client_credentials: {{token_url: \"http://idp.example/token\", client_id: c, client_secret: \"${{secret:key}}\"}}}}"
            ),
            prepare: fine,
            expected: "plain http to a host that is not loopback",
        },
        Case {
            secrets: secret,
            adapter: ok.to_string(),
            prepare: |tools| {
                std::fs::write(tools.join("key.txt"), "a-fine-secret-value").unwrap();
                std::fs::set_permissions(
                    tools.join("key.txt"),
                    std::fs::Permissions::from_mode(0o644),
                )
                .unwrap();
            },
            expected: "lets anyone read it",
        },
        Case {
            secrets: secret,
            adapter: ok.to_string(),
            prepare: |tools| {
                std::fs::write(tools.join("key.txt"), "a-fine-secret-value").unwrap();
                std::fs::set_permissions(
                    tools.join("key.txt"),
                    std::fs::Permissions::from_mode(0o620),
                )
                .unwrap();
            },
            expected: "lets others than its owner write it",
        },
        Case {
            secrets: secret,
            adapter: ok.to_string(),
            prepare: |tools| {
                let path = tools.join("key.txt");
                std::fs::write(&path, "a-fine-secret-value").unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
                std::os::unix::fs::chown(&path, None, Some(54_321)).unwrap();
            },
            expected: "which is not a group of this process",
        },
        Case {
            secrets: secret,
            adapter: ok.to_string(),
            prepare: |tools| {
                let outside = tools.parent().unwrap().join("outside.txt");
                std::fs::write(&outside, "a-fine-secret-value").unwrap();
                std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
                std::os::unix::fs::symlink(&outside, tools.join("key.txt")).unwrap();
            },
            expected: "symlink leading out of its directory",
        },
        Case {
            secrets: secret,
            adapter: ok.to_string(),
            prepare: |tools| {
                let fifo = std::ffi::CString::new(tools.join("key.txt").to_str().unwrap()).unwrap();
                // SAFETY: a valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
            },
            expected: "not a regular file",
        },
        Case {
            secrets: secret,
            adapter: format!(
                "{ok}, auth: {{token_exchange: {{token_url: \"https://sts.example/token\", client_id: c, client_secret: \"${{secret:key}}\", audience: fhir}}}}"
            ),
            prepare: fine,
            expected: "roles without a `jwt` credential can reach it: tester",
        },
        Case {
            secrets: secret,
            adapter: format!(
                "{ok}, auth: {{token_exchange: {{token_url: \"https://sts.example/token\", client_id: c, client_secret: \"${{secret:key}}\", actor_token_type: \"urn:ietf:params:oauth:token-type:jwt\"}}}}"
            ),
            prepare: fine,
            expected: "`actor_token_type` without an `actor_token`",
        },
        Case {
            secrets: "secrets:\n  - {id: key, from: {file: key.txt, env: KEY}}\n",
            adapter: ok.to_string(),
            prepare: fine,
            expected: "exactly one of `env` and `file`",
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let dir = root.path().join(format!("case-{i}"));
        let tools = dir.join("tools");
        std::fs::create_dir_all(&tools).unwrap();
        (case.prepare)(&tools);
        let (policy_dir, tools_file) = write_policy(
            &dir,
            case.secrets,
            &[("t", tool_entry("t", &case.adapter, 5000))],
        );
        let problems: Vec<Problem> = policy::load(&policy_dir, &tools_file)
            .err()
            .unwrap_or_else(|| panic!("case {i} ({}) loaded", case.expected));
        let problem = problems
            .iter()
            .find(|p| p.message.contains(case.expected))
            .unwrap_or_else(|| panic!("case {i}: no `{}` in {problems:?}", case.expected));
        assert!(problem.file.ends_with("tool_registry.yaml"), "{problem:?}");
        assert!(
            problem.line.is_some() && problem.column.is_some(),
            "case {i}: {problem:?}"
        );
        // No secret value is ever named in a problem.
        assert!(
            problems
                .iter()
                .all(|p| !p.to_string().contains("a-fine-secret-value"))
        );
    }
}

#[test]
fn a_kubernetes_style_secret_volume_is_read_and_env_settings_pin_the_registry_version() {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools");
    // tools/secrets/key -> ..data/key, ..data -> ..2026_11_28 (all inside the directory).
    let volume = tools.join("secrets");
    let generation = volume.join("..2026_11_28");
    std::fs::create_dir_all(&generation).unwrap();
    std::fs::write(generation.join("key"), "volume-secret-value\n").unwrap();
    std::fs::set_permissions(
        generation.join("key"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::os::unix::fs::symlink("..2026_11_28", volume.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/key", volume.join("key")).unwrap();
    let adapter = "url: \"http://127.0.0.1:${env:T41_PORT}/x\", allowed_hosts: [\"127.0.0.1:${env:T41_PORT}\"], headers: {x-key: \"${secret:key}\"}";
    let (policy_dir, tools_file) = write_policy(
        dir.path(),
        "secrets:\n  - {id: key, from: {file: secrets/key}}\n",
        &[("t", tool_entry("t", adapter, 5000))],
    );
    let load = |port: &str| {
        let env = |var: &str| (var == "T41_PORT").then(|| port.to_string());
        policy::load_with_env(&policy_dir, &tools_file, &env).unwrap()
    };
    let a = load("8081");
    let b = load("8082");
    assert_eq!(a.secrets["key"].value.expose(), "volume-secret-value");
    match &a.tools["t"].adapter {
        policy::AdapterConfig::Http {
            url, allowed_hosts, ..
        } => {
            assert_eq!(url, "http://127.0.0.1:8081/x");
            assert_eq!(allowed_hosts, &["127.0.0.1:8081".to_string()]);
        }
        other => panic!("{other:?}"),
    }
    assert_ne!(a.versions.registry.sha256, b.versions.registry.sha256);
    assert_eq!(
        a.versions.registry.sha256,
        load("8081").versions.registry.sha256
    );
    // A new secret value is not a new version: values never enter it.
    std::fs::write(generation.join("key"), "rotated-secret-value\n").unwrap();
    let c = load("8081");
    assert_eq!(c.secrets["key"].value.expose(), "rotated-secret-value");
    assert_eq!(a.versions.registry.sha256, c.versions.registry.sha256);
    assert!(!format!("{:?}", c).contains("rotated-secret-value"));
}

#[test]
fn policy_diff_reports_a_tool_gaining_a_secret_or_a_changed_auth_as_widening() {
    let tmp = tempfile::tempdir().unwrap();
    let upstream = "127.0.0.1:9";
    let plain = format!("url: \"http://{upstream}/x\", allowed_hosts: [\"{upstream}\"]");
    let secrets = "secrets:\n  - {id: api_key, from: {file: api.key}}\n  - {id: token, from: {env: T41_DIFF_TOKEN}}\n";
    for (side, adapter) in [
        ("old", plain.clone()),
        (
            "new",
            format!(
                "{plain}, headers: {{x-api-key: \"${{secret:api_key}}\"}}, auth: {{bearer: \"${{secret:token}}\"}}"
            ),
        ),
    ] {
        let dir = tmp.path().join(side);
        // The secret file holds a value the report must never show; `policy diff`
        // does not even read it.
        secret_file(&dir, "api.key", "diff-secret-value-31");
        write_policy(&dir, secrets, &[("t", tool_entry("t", &adapter, 5000))]);
    }
    let out = std::process::Command::new(crate::common::BIN)
        .args(["policy", "diff", "old", "new", "--format", "json"])
        .current_dir(tmp.path())
        .env_remove("T41_DIFF_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!text.contains("diff-secret-value-31") && !err.contains("diff-secret-value-31"));
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}{err}"));
    let changes = report["changes"].as_array().unwrap();
    let find = |kind: &str| {
        changes
            .iter()
            .filter(|c| c["kind"] == kind)
            .cloned()
            .collect::<Vec<_>>()
    };
    let added = find("tool_secret_added");
    let names: Vec<&str> = added
        .iter()
        .map(|c| c["message"].as_str().unwrap())
        .collect();
    assert_eq!(added.len(), 2, "{names:?}");
    assert!(added.iter().all(|c| c["effect"] == "widening"), "{added:?}");
    let auth = find("tool_auth_changed");
    assert_eq!(auth.len(), 1, "{changes:?}");
    assert_eq!(auth[0]["effect"], "widening");
    assert_eq!(
        auth[0]["after"]["bearer"], "${secret:token}",
        "{:?}",
        auth[0]
    );
}

// ---------------------------------------------------------------------------------
// MCP upstreams: a hosted server over https with a bearer secret, a stdio server
// given its secret in `env`.

/// tests/mcp/secret_server.py over https (a certificate of `pki`), expecting
/// `token`; killed on drop.
struct HttpsMcp {
    child: std::process::Child,
    port: u16,
}

impl Drop for HttpsMcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn https_mcp(dir: &Path, pki: &Pki, token: &str) -> HttpsMcp {
    use std::io::BufRead;
    let (cert, key, _, _) = leaf(pki, &["127.0.0.1", "localhost"]);
    let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    let mut child = std::process::Command::new(crate::mcp_support::python())
        .arg(crate::mcp_support::scripts().join("secret_server.py"))
        .arg("https")
        .arg(&cert_path)
        .arg(&key_path)
        .env("EXPECTED_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no port: {line:?}"));
    HttpsMcp { child, port }
}

#[test]
fn an_https_mcp_server_gets_its_bearer_secret_and_a_stdio_server_its_env_secret_and_neither_leaks()
{
    const BEARER: &str = "mcp-bearer-token-42x";
    const STDIO: &str = "stdio-env-token-77y";
    let dir = tempfile::tempdir().unwrap();
    let tools_dir = dir.path().join("tools");
    std::fs::create_dir_all(&tools_dir).unwrap();
    let private = pki("mcp");
    std::fs::write(tools_dir.join("private-ca.pem"), &private.ca_pem).unwrap();
    secret_file(dir.path(), "mcp.token", BEARER);
    let upstream = https_mcp(dir.path(), &private, BEARER);
    let script = crate::mcp_support::scripts().join("secret_server.py");
    let python = crate::mcp_support::python();
    let servers = format!(
        "secrets:\n  - {{id: mcp_token, from: {{file: mcp.token}}}}\n  - {{id: stdio_token, from: {{env: T41_STDIO_TOKEN}}}}\nservers:\n  - server_id: hosted\n    url: \"https://127.0.0.1:{}/mcp\"\n    ca: private-ca.pem\n    auth: {{bearer: \"${{secret:mcp_token}}\"}}\n  - server_id: local\n    command: [{}, {}, stdio]\n    env: {{UPSTREAM_TOKEN: \"${{secret:stdio_token}}\", PLAIN: fixed-value}}\n    sandbox: {{unconfined: \"the test's Python environment lives in the target directory\"}}\n",
        upstream.port,
        json!(python),
        json!(script)
    );
    let mcp_tool = |name: &str, server: &str, tool: &str| {
        tool_entry(name, "", 20000).replace(
            "adapter: {kind: http, }",
            &format!("adapter: {{kind: mcp, server: {server}, tool: {tool}}}"),
        )
    };
    let (policy_dir, tools_file) = write_policy(
        dir.path(),
        &servers,
        &[
            ("hosted_add", mcp_tool("hosted_add", "hosted", "add")),
            ("hosted_leak", mcp_tool("hosted_leak", "hosted", "leak")),
            ("local_leak", mcp_tool("local_leak", "local", "leak")),
        ],
    );
    let data_dir = dir.path().join("var");
    let server = Server::start_with(Start {
        policy_dir,
        tools: tools_file,
        data_dir: Some(data_dir.clone()),
        env: vec![("T41_STDIO_TOKEN".into(), STDIO.into())],
        ..Start::default()
    });
    let run = server.create_run(json!({}));
    let call = |tool: &str, arguments: Value| {
        crate::common::lab::call(&server, &run, tool, arguments, json!({}))
    };
    // uvicorn printed its port before it accepts: retry a refused first call a
    // bounded number of times.
    let mut answer = Value::Null;
    crate::common::poll_until(Duration::from_secs(15), || {
        answer = call("hosted_add", json!({"a": 2, "b": 3})).1;
        answer["status"] == "success"
    });
    assert_eq!(answer["output"]["sum"], 5, "{answer}");
    let mut answers = vec![answer];
    let (status, body) = call("hosted_leak", json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["value"], "[secret]", "{body}");
    assert_eq!(body["output"]["length"], BEARER.len(), "{body}");
    answers.push(body);
    let (status, body) = call("local_leak", json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["value"], "[secret]", "{body}");
    assert_eq!(
        body["output"]["length"],
        STDIO.len(),
        "the server got its env: {body}"
    );
    answers.push(body);
    let (_, events) = server.get(&format!("/v1/runs/{run}/events"), Some("demo-admin"));
    answers.push(events);
    let metrics = server.metrics();
    let logs = server.log_lines_with("");
    assert!(server.stop().success());
    for secret in [BEARER, STDIO] {
        for answer in &answers {
            assert!(!answer.to_string().contains(secret), "{secret} in {answer}");
        }
        assert!(!metrics.contains(secret));
        assert!(
            logs.iter().all(|l| !l.contains(secret)),
            "{secret} in the logs"
        );
        for file in files_under(&data_dir) {
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{secret} in {}",
                file.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_with_a_proxy_sends_through_it_and_only_to_its_allowed_host() {
    let dir = tempfile::tempdir().unwrap();
    // The "proxy" answers itself, recording the absolute-form request it was sent.
    let (proxy, seen) = http_server(|_| (200, json!({"via": "proxy"}).to_string()));
    // Nothing listens on the upstream's port: only the proxy can answer.
    let upstream = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let gate = Gate::new(
        dir.path(),
        "",
        &[(
            "proxied",
            tool_entry(
                "proxied",
                &format!(
                    "url: \"http://{upstream}/x\", allowed_hosts: [\"{upstream}\"], proxy: \"http://{proxy}\""
                ),
                5000,
            ),
        )],
        &[],
    );
    let out = gate.call("proxied", json!({"q": 1})).await.unwrap();
    assert_eq!(out["via"], "proxy");
    let head = seen.lock().unwrap()[0].head.clone();
    assert!(
        head.starts_with(&format!("POST http://{upstream}/x ")),
        "{head}"
    );
    // A url argument naming another host is still refused before anything is sent.
    let r = gate
        .call("proxied", json!({"u": "http://169.254.169.254/"}))
        .await
        .unwrap_err();
    assert_eq!(r.reason, Reason::ArgumentUnsafe);
}

#[test]
fn policy_explain_runs_without_the_secrets_and_policy_check_refuses_them_missing() {
    let dir = tempfile::tempdir().unwrap();
    let adapter = "url: \"http://127.0.0.1:9/x\", allowed_hosts: [\"127.0.0.1:9\"], headers: {x-key: \"${secret:key}\"}";
    write_policy(
        dir.path(),
        "secrets:\n  - {id: key, from: {env: T41_UNSET_SECRET}}\n",
        &[("t", tool_entry("t", adapter, 5000))],
    );
    let run = |args: &[&str]| {
        std::process::Command::new(crate::common::BIN)
            .args(args)
            .current_dir(dir.path())
            .env_remove("T41_UNSET_SECRET")
            .output()
            .unwrap()
    };
    let explain = run(&[
        "policy", "explain", "--role", "tester", "--lane", "lab", "--tool", "t", "--format", "json",
    ]);
    let text = String::from_utf8_lossy(&explain.stdout);
    assert_eq!(
        explain.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&explain.stderr)
    );
    assert!(text.contains("\"decision\":\"allow\""), "{text}");
    assert!(!text.contains("policy-review-placeholder"), "{text}");
    let check = run(&["policy", "check"]);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert_ne!(check.status.code(), Some(0), "{out}");
    assert!(
        out.contains("tool_registry.yaml:3:") && out.contains("`T41_UNSET_SECRET` is not set"),
        "{out}"
    );
}

/// A recording proxy on 127.0.0.1: a `CONNECT` (whatever host it names) is tunneled to
/// `tunnel_to`; a plain request in absolute form is answered by the proxy itself.
/// Returns its address and the request line of everything it was asked.
fn recording_proxy(tunnel_to: SocketAddr) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorded = lines.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(mut tcp) = tcp else { continue };
            let recorded = recorded.clone();
            std::thread::spawn(move || {
                let (head, _) = read_request(&mut tcp);
                let line = head.lines().next().unwrap_or_default().to_string();
                recorded.lock().unwrap().push(line.clone());
                if !line.starts_with("CONNECT ") {
                    let body = json!({"via": "env-proxy", "line": line}).to_string();
                    let _ = tcp.write_all(response(200, &body).as_bytes());
                    return;
                }
                let Ok(upstream) = std::net::TcpStream::connect(tunnel_to) else {
                    return;
                };
                let _ = tcp.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
                let (mut up_read, mut client_write) =
                    (upstream.try_clone().unwrap(), tcp.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut up_read, &mut client_write);
                    let _ = client_write.shutdown(std::net::Shutdown::Write);
                });
                let (mut client_read, mut up_write) = (tcp, upstream);
                let _ = std::io::copy(&mut client_read, &mut up_write);
                let _ = up_write.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (addr, lines)
}

#[test]
fn the_environments_proxies_carry_upstreams_without_their_own_except_no_proxy_and_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let tools_dir = dir.path().join("tools");
    std::fs::create_dir_all(&tools_dir).unwrap();
    let private = pki("proxied");
    std::fs::write(tools_dir.join("private-ca.pem"), &private.ca_pem).unwrap();
    // The https upstream is reachable only through the proxy's tunnel: its name does not
    // resolve, and its certificate (of the private CA) names it.
    let (tls_addr, tls_requests) = tls_upstream_for(&private, None, &["fhir.proxied.test"]);
    let (proxy, lines) = recording_proxy(tls_addr);
    let (direct, direct_seen) = http_server(|_| (200, json!({"via": "direct"}).to_string()));
    let entry = |name: &str, url: &str, host: &str, extra: &str| {
        (
            name.to_string(),
            tool_entry(
                name,
                &format!("url: \"{url}\", allowed_hosts: [\"{host}\"]{extra}"),
                5000,
            ),
        )
    };
    let tools = [
        entry(
            "secure",
            "https://fhir.proxied.test/Patient/1",
            "fhir.proxied.test",
            ", ca: private-ca.pem",
        ),
        entry(
            "plain",
            "http://records.proxied.test:8080/x",
            "records.proxied.test:8080",
            "",
        ),
        entry(
            "skipped",
            "http://skip.proxied.test:8080/y",
            "skip.proxied.test:8080",
            "",
        ),
        entry("local", &format!("http://{direct}/z"), &direct, ""),
    ];
    let tools: Vec<(&str, String)> = tools.iter().map(|(n, e)| (n.as_str(), e.clone())).collect();
    let (policy_dir, tools_file) = write_policy(dir.path(), "", &tools);
    let server = Server::start_with(Start {
        policy_dir,
        tools: tools_file,
        env: vec![
            ("HTTPS_PROXY".into(), format!("http://{proxy}")),
            ("http_proxy".into(), format!("http://{proxy}")),
            ("NO_PROXY".into(), "skip.proxied.test".into()),
        ],
        ..Start::default()
    });
    let run = server.create_run(json!({}));
    let call = |tool: &str| crate::common::lab::call(&server, &run, tool, json!({}), json!({}));

    // https: a CONNECT to the upstream's own name, the certificate verified through the
    // tunnel against the registry's CA.
    let (status, body) = call("secure");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["client_cert"], false, "{body}");
    assert_eq!(tls_requests.load(Ordering::SeqCst), 1);
    // http: the request in absolute form, to the proxy.
    let (status, body) = call("plain");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["via"], "env-proxy", "{body}");
    // NO_PROXY: direct (and the name does not resolve); loopback: direct.
    let (status, body) = call("skipped");
    assert_ne!(status, 200, "{body}");
    assert_eq!(
        body["diagnostic"]["details"]["reached_tool"], false,
        "{body}"
    );
    let (status, body) = call("local");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["via"], "direct", "{body}");
    assert_eq!(direct_seen.lock().unwrap().len(), 1);

    let lines = lines.lock().unwrap().clone();
    assert_eq!(
        lines,
        [
            "CONNECT fhir.proxied.test:443 HTTP/1.1".to_string(),
            "POST http://records.proxied.test:8080/x HTTP/1.1".to_string(),
        ],
        "the proxy saw the two proxied upstreams and nothing else"
    );
}

#[test]
fn an_https_mcp_server_gets_a_client_credentials_token_fetched_once_and_scrubbed() {
    let dir = tempfile::tempdir().unwrap();
    let tools_dir = dir.path().join("tools");
    std::fs::create_dir_all(&tools_dir).unwrap();
    let private = pki("mcp-oauth");
    std::fs::write(tools_dir.join("private-ca.pem"), &private.ca_pem).unwrap();
    let endpoint = token_endpoint(3600);
    // The Python SDK's server answers 401 to every request without the first token
    // the endpoint issues.
    let upstream = https_mcp(dir.path(), &private, "tok-1-abcdefgh");
    // Connected to once it listens, so no connection of toolgate's is refused.
    assert!(crate::common::poll_until(Duration::from_secs(15), || {
        std::net::TcpStream::connect(("127.0.0.1", upstream.port)).is_ok()
    }));
    secret_file(dir.path(), "client.secret", "client-secret-value-1");
    let servers = format!(
        "{CLIENT_SECRETS}servers:\n  - server_id: hosted\n    url: \"https://127.0.0.1:{}/mcp\"\n    ca: private-ca.pem\n    auth: {{oauth2_client_credentials: {{token_url: \"http://{}/oauth/token\", client_id: my-client, client_secret: \"${{secret:client_secret}}\", scope: mcp.tools}}}}\n",
        upstream.port, endpoint.addr
    );
    let mcp_tool = |name: &str, tool: &str| {
        tool_entry(name, "", 20000).replace(
            "adapter: {kind: http, }",
            &format!("adapter: {{kind: mcp, server: hosted, tool: {tool}}}"),
        )
    };
    let (policy_dir, tools_file) = write_policy(
        dir.path(),
        &servers,
        &[
            ("hosted_add", mcp_tool("hosted_add", "add")),
            ("hosted_leak", mcp_tool("hosted_leak", "leak")),
        ],
    );
    let data_dir = dir.path().join("var");
    let server = Server::start_with(Start {
        policy_dir,
        tools: tools_file,
        data_dir: Some(data_dir.clone()),
        ..Start::default()
    });
    let run = server.create_run(json!({}));
    let call = |tool: &str, arguments: Value| {
        crate::common::lab::call(&server, &run, tool, arguments, json!({}))
    };
    let (status, body) = call("hosted_add", json!({"a": 2, "b": 3}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["sum"], 5, "{body}");
    let mut answers = vec![body];
    // The server echoes the token it got: scrubbed.
    let (status, body) = call("hosted_leak", json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["value"], "[secret]", "{body}");
    assert_eq!(body["output"]["length"], "tok-1-abcdefgh".len(), "{body}");
    answers.push(body);
    assert_eq!(
        endpoint.issued.load(Ordering::SeqCst),
        1,
        "one token for the connection"
    );
    let form = String::from_utf8(endpoint.requests.lock().unwrap()[0].body.clone()).unwrap();
    assert!(form.contains("grant_type=client_credentials"), "{form}");
    let (_, events) = server.get(&format!("/v1/runs/{run}/events"), Some("demo-admin"));
    answers.push(events);
    let metrics = server.metrics();
    assert!(server.stop().success());
    for answer in &answers {
        assert!(!answer.to_string().contains("tok-1-abcdefgh"), "{answer}");
    }
    assert!(!metrics.contains("tok-1-abcdefgh"));
    for file in files_under(&data_dir) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes.windows(14).any(|w| w == b"tok-1-abcdefgh"),
            "{}",
            file.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_phase_tools_commit_and_rollback_carry_its_client_credentials_token() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = token_endpoint(3600);
    let revoked: Arc<Mutex<Vec<String>>> = Arc::default();
    let (upstream, seen) = fhir_upstream(revoked.clone());
    let token_url = format!("http://{}/oauth/token", endpoint.addr);
    let entry = tool_entry(
        "file_order",
        &format!(
            "url: \"http://{upstream}/prepare\", allowed_hosts: [\"{upstream}\"], auth: {{oauth2_client_credentials: {{token_url: \"{token_url}\", client_id: my-client, client_secret: \"${{secret:client_secret}}\"}}}}, phases: {{commit: {{url: \"http://{upstream}/commit\"}}, rollback: {{url: \"http://{upstream}/rollback\"}}, commit_within_s: 60, max_attempts: 2}}"
        ),
        5000,
    )
    .replace("determinism: pure", "determinism: side_effectful")
    .replace(
        "write_targets: []",
        &format!("write_targets: [\"http:{upstream}/orders\"]"),
    );
    secret_file(dir.path(), "client.secret", "client-secret-value-1\n");
    let (policy_dir, tools_file) =
        write_policy(dir.path(), CLIENT_SECRETS, &[("file_order", entry)]);
    let lanes = policy_dir.join("lanes.yaml");
    let text = std::fs::read_to_string(&lanes).unwrap();
    std::fs::write(&lanes, text.replace("write: false", "write: true")).unwrap();
    let policy = policy::load(&policy_dir, &tools_file).expect("the registry loads");
    let env = AdapterEnv {
        tools_dir: dir.path().join("tools"),
        data_dir: dir.path().join("var"),
    };
    let adapters = adapter::build(&policy, &env).expect("adapters build");
    let gate = Gate { policy, adapters };
    let tool = &gate.policy.tools["file_order"];
    let runner = &gate.adapters.phases["file_order"];
    let outcome = runner
        .run(
            tool,
            adapter::Phase::Commit,
            "ct-1",
            "call-1",
            "commit-1",
            "run-1",
        )
        .await;
    let output = outcome.result.unwrap();
    assert_eq!(output["target"], "/commit");
    assert_eq!(outcome.attempts, 1);
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        last.header("authorization").as_deref(),
        Some("Bearer tok-1-abcdefgh")
    );
    assert!(String::from_utf8_lossy(&last.body).contains("\"commit_token\":\"ct-1\""));

    // The token is refused: the attempt is not acted on, so the next one is made, with
    // a new token.
    revoked.lock().unwrap().push("tok-1-abcdefgh".to_string());
    let outcome = runner
        .run(
            tool,
            adapter::Phase::Commit,
            "ct-1",
            "call-1",
            "commit-1",
            "run-1",
        )
        .await;
    assert_eq!(outcome.result.unwrap()["target"], "/commit");
    assert_eq!(outcome.attempts, 2);
    let sent: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .rev()
        .take(2)
        .map(|s| s.header("authorization").unwrap_or_default())
        .collect();
    assert_eq!(sent, ["Bearer tok-2-abcdefgh", "Bearer tok-1-abcdefgh"]);
    assert_eq!(endpoint.issued.load(Ordering::SeqCst), 2);
    // The rollback carries the credential too.
    let outcome = runner
        .run(
            tool,
            adapter::Phase::Rollback,
            "ct-1",
            "call-1",
            "commit-1",
            "run-1",
        )
        .await;
    assert_eq!(outcome.result.unwrap()["target"], "/rollback");
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert!(
        last.header("authorization")
            .is_some_and(|a| a.starts_with("Bearer tok-")),
        "{last:?}"
    );
}
