//! RFC 8693 token exchange (issue 41): a JWT caller's token is exchanged at a real
//! local token endpoint (which checks the form and the client) for the token the
//! upstream sees; the closing event records `details.delegation {sub, act}` and no
//! token is kept anywhere; a run-token caller is refused before anything is sent; a
//! token endpoint down, slow, garbage or huge fails closed. The caller's JWT is signed
//! with the fixture keys of tests/fixtures/jwt/ and verified against a local JWK Set
//! (`crate::jwt`).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::common::{ADMIN, Server, Start};
use crate::jwt::{AUDIENCE, ISSUER, Jwks, JwksServer, claims, jwks, rsa1, sign};
use crate::outbound_auth::{
    Log, base64_encode, failing_endpoints, files_under, http_server, secret_file, tool_entry,
    write_policy,
};

const CLIENT_SECRET: &str = "client-secret-value-1";
const ACTOR_TOKEN: &str = "actor-token-of-the-sidecar-Qx7";
const SECRETS: &str = "secrets:\n  - {id: client_secret, from: {file: client.secret}}\n  - {id: actor, from: {file: actor.token}}\n";

/// Roles: `delegate`, proven by a JWT of the lab issuer whose `groups` holds
/// `drafters`; the `ops` admin with its static token.
fn roles(jwks_url: &str) -> String {
    format!(
        r#"version: "r-1"
identity_providers:
  - id: lab
    issuer: "{ISSUER}"
    audience: {AUDIENCE}
    jwks_uri: "{jwks_url}"
    algorithms: [RS256]
roles:
  - role_id: delegate
    description: Calls on behalf of its user, proven by its OIDC token.
    enabled: true
    lanes: [lab]
    credential:
      jwt: {{provider: lab, claim: groups, value: drafters}}
admins:
  - admin_id: ops
    description: Creates runs.
    credential: {{token_sha256: {}}}
"#,
        crate::common::lab::sha(ADMIN)
    )
}

fn exchange_tool(name: &str, upstream: &str, token_url: &str, timeout_ms: u64) -> String {
    tool_entry(
        name,
        &format!(
            "method: GET, url: \"http://{upstream}/Patient/{{args.patient_id}}\", allowed_hosts: [\"{upstream}\"], auth: {{token_exchange: {{token_url: \"{token_url}\", client_id: my-client, client_secret: \"${{secret:client_secret}}\", audience: fhir-api, scope: patient.read, actor_token: \"${{secret:actor}}\"}}}}"
        ),
        timeout_ms,
    )
}

/// A compact JWT with `claims` (the signature is not checked by anyone: toolgate reads
/// the issued token's claims without verifying them).
fn unsigned_jwt(claims: &Value) -> String {
    use base64::Engine;
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.c2lnbmF0dXJl",
        b64(&json!({"alg": "RS256", "typ": "JWT"})),
        b64(claims)
    )
}

/// The form fields of a token request.
fn form(body: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(body).into_owned().collect()
}

fn field<'a>(form: &'a [(String, String)], name: &str) -> Option<&'a str> {
    form.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// A token endpoint for RFC 8693: refuses a request without the client's credential,
/// the token-exchange grant, a JWT subject token, the audience or the actor token;
/// issues a JWT whose `sub` is the subject token's and whose `act` names the sidecar.
/// Returns its address, the tokens it issued and the requests it saw.
fn exchange_endpoint() -> (String, Arc<Mutex<Vec<String>>>, Log) {
    let issued: Arc<Mutex<Vec<String>>> = Arc::default();
    let counter = Arc::new(AtomicUsize::new(0));
    let kept = issued.clone();
    let (addr, requests) = http_server(move |seen| {
        let client = format!(
            "Basic {}",
            base64_encode(&format!("my-client:{CLIENT_SECRET}"))
        );
        if seen.header("authorization").as_deref() != Some(client.as_str()) {
            return (401, json!({"error": "invalid_client"}).to_string());
        }
        let form = form(&seen.body);
        let expected = [
            (
                "grant_type",
                "urn:ietf:params:oauth:grant-type:token-exchange",
            ),
            ("subject_token_type", "urn:ietf:params:oauth:token-type:jwt"),
            ("audience", "fhir-api"),
            ("scope", "patient.read"),
            ("actor_token", ACTOR_TOKEN),
            ("actor_token_type", "urn:ietf:params:oauth:token-type:jwt"),
        ];
        if expected.iter().any(|(n, v)| field(&form, n) != Some(*v)) {
            return (400, json!({"error": "invalid_request"}).to_string());
        }
        // The subject's `sub`, read from the subject token's payload.
        let subject = field(&form, "subject_token").unwrap_or_default();
        let sub = subject
            .split('.')
            .nth(1)
            .and_then(|p| {
                use base64::Engine;
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(p)
                    .ok()
            })
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|c| c["sub"].as_str().map(str::to_string));
        let Some(sub) = sub else {
            return (400, json!({"error": "invalid_grant"}).to_string());
        };
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        let token = unsigned_jwt(&json!({
            "iss": "https://sts.lab.test", "aud": "fhir-api", "sub": sub,
            "act": {"sub": "toolgate-sidecar"}, "jti": format!("exchanged-{n}"),
        }));
        kept.lock().unwrap().push(token.clone());
        (
            200,
            json!({
                "access_token": token, "token_type": "Bearer", "expires_in": 3600,
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
            })
            .to_string(),
        )
    });
    (addr, issued, requests)
}

/// An upstream that answers 401 to the tokens in `revoked`, else echoes the
/// `Authorization` it was sent (an upstream that leaks what it got).
fn echoing_upstream(revoked: Arc<Mutex<Vec<String>>>) -> (String, Log) {
    http_server(move |seen| {
        let auth = seen.header("authorization").unwrap_or_default();
        let token = auth.strip_prefix("Bearer ").unwrap_or("").to_string();
        if token.is_empty() || revoked.lock().unwrap().contains(&token) {
            return (401, json!({"issue": "token refused"}).to_string());
        }
        (
            200,
            json!({"resourceType": "Patient", "you_sent": auth}).to_string(),
        )
    })
}

/// The policy of `tools` with the `delegate` role, the client secret and the actor
/// token, served by a real server with its data directory under `dir`.
fn serve(dir: &Path, jwks_url: &str, tools: &[(&str, String)]) -> Server {
    secret_file(dir, "client.secret", &format!("{CLIENT_SECRET}\n"));
    secret_file(dir, "actor.token", ACTOR_TOKEN);
    let (policy_dir, tools_file) = write_policy(dir, SECRETS, tools);
    std::fs::write(policy_dir.join("roles.yaml"), roles(jwks_url)).unwrap();
    Server::start_with(Start {
        policy_dir,
        tools: tools_file,
        data_dir: Some(dir.join("var")),
        ..Start::default()
    })
}

fn call_body(run: &str, tool: &str, patient: &str) -> Value {
    json!({
        "role_id": "delegate", "run_id": run, "lane_id": "lab", "tool_name": tool,
        "arguments": {"patient_id": patient}, "scope": {},
    })
}

fn user_token(sub: &str) -> String {
    sign(&rsa1(), &claims(sub))
}

#[test]
fn a_jwt_callers_token_is_exchanged_and_the_closing_event_records_the_delegation_never_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let idp = JwksServer::start(Jwks::Serve(jwks(&[rsa1()])));
    let (endpoint, issued, requests) = exchange_endpoint();
    let revoked: Arc<Mutex<Vec<String>>> = Arc::default();
    let (upstream, seen) = echoing_upstream(revoked.clone());
    let token_url = format!("http://{endpoint}/oauth/token");
    let server = serve(
        dir.path(),
        &idp.url,
        &[(
            "read_patient",
            exchange_tool("read_patient", &upstream, &token_url, 5000),
        )],
    );
    let run = server.create_run(json!({}));
    let alice = user_token("user-alice");
    let bob = user_token("user-bob");
    let mut answers = Vec::new();

    // Alice twice (one exchange: the second is served from the cache), then Bob.
    for (caller, patient) in [(&alice, "p-1"), (&alice, "p-2"), (&bob, "p-3")] {
        let (status, body) = server.post(
            "/v1/tool-calls",
            Some(caller),
            &call_body(&run, "read_patient", patient),
        );
        assert_eq!(status, 200, "{body}");
        // The upstream echoed the token it got: scrubbed.
        assert_eq!(body["output"]["you_sent"], "Bearer [secret]", "{body}");
        answers.push(body);
    }
    let issued_tokens = issued.lock().unwrap().clone();
    assert_eq!(issued_tokens.len(), 2, "one exchange per caller");
    {
        let requests = requests.lock().unwrap();
        let subjects: Vec<String> = requests
            .iter()
            .map(|r| field(&form(&r.body), "subject_token").unwrap().to_string())
            .collect();
        assert_eq!(subjects, vec![alice.clone(), bob.clone()]);
    }
    // The upstream saw the exchanged tokens, never a caller's.
    let sent: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.header("authorization").unwrap())
        .collect();
    assert_eq!(
        sent,
        vec![
            format!("Bearer {}", issued_tokens[0]),
            format!("Bearer {}", issued_tokens[0]),
            format!("Bearer {}", issued_tokens[1]),
        ]
    );

    // The upstream refuses Alice's exchanged token once: an idempotent call with an
    // idempotency_key is exchanged again and sent again; one without fails
    // retryable and the next call uses a new token.
    revoked.lock().unwrap().push(issued_tokens[0].clone());
    let mut keyed = call_body(&run, "read_patient", "p-4");
    keyed["idempotency_key"] = json!("key-p-4");
    let (status, body) = server.post("/v1/tool-calls", Some(&alice), &keyed);
    assert_eq!(status, 200, "{body}");
    answers.push(body);
    assert_eq!(issued.lock().unwrap().len(), 3);
    revoked
        .lock()
        .unwrap()
        .push(issued.lock().unwrap()[2].clone());
    let before = seen.lock().unwrap().len();
    let (status, body) = server.post(
        "/v1/tool-calls",
        Some(&alice),
        &call_body(&run, "read_patient", "p-5"),
    );
    assert_eq!(body["diagnostic"]["reason"], "dependency_down", "{body}");
    assert_eq!(body["diagnostic"]["retryable"], true, "{body}");
    // Refused at the door (401): the upstream did not act on it.
    assert_eq!(
        body["diagnostic"]["details"]["reached_tool"], false,
        "{body}"
    );
    assert!(status >= 500, "{status}");
    assert_eq!(seen.lock().unwrap().len(), before + 1, "sent once");
    answers.push(body);
    let (status, body) = server.post(
        "/v1/tool-calls",
        Some(&alice),
        &call_body(&run, "read_patient", "p-5"),
    );
    assert_eq!(status, 200, "{body}");
    answers.push(body);
    assert_eq!(issued.lock().unwrap().len(), 4);

    // A run token of the same role carries no JWT to exchange: refused before
    // anything is sent to the token endpoint or the upstream.
    let (status, created) = server.post(
        "/v1/runs",
        Some(ADMIN),
        &json!({"scope": {}, "issue_tokens": [{"role_id": "delegate"}]}),
    );
    assert_eq!(status, 201, "{created}");
    let run_token = created["tokens"][0]["token"].as_str().unwrap().to_string();
    let run2 = created["run_id"].as_str().unwrap().to_string();
    let (exchanges, sends) = (requests.lock().unwrap().len(), seen.lock().unwrap().len());
    let (status, body) = server.post(
        "/v1/tool-calls",
        Some(&run_token),
        &json!({"tool_name": "read_patient", "arguments": {"patient_id": "p-1"}}),
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["diagnostic"]["reason"], "caller_jwt_required",
        "{body}"
    );
    assert_eq!(
        body["diagnostic"]["details"]["reached_tool"], false,
        "{body}"
    );
    assert_eq!(requests.lock().unwrap().len(), exchanges);
    assert_eq!(seen.lock().unwrap().len(), sends);
    answers.push(body);

    // The closing events hold the delegation of the token sent; the first events
    // (before anything was exchanged) do not.
    let (status, events) = server.get(&format!("/v1/runs/{run}/events"), Some(ADMIN));
    assert_eq!(status, 200);
    let events: Vec<Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].clone())
        .collect();
    let closing: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_executed" || e["type"] == "tool_failed")
        .collect();
    assert_eq!(closing.len(), 6);
    let subs: Vec<&Value> = closing
        .iter()
        .map(|e| &e["details"]["delegation"]["sub"])
        .collect();
    assert_eq!(
        subs,
        [
            "user-alice",
            "user-alice",
            "user-bob",
            "user-alice",
            "user-alice",
            "user-alice"
        ]
    );
    for e in &closing {
        assert_eq!(
            e["details"]["delegation"]["act"],
            json!({"sub": "toolgate-sidecar"}),
            "{e}"
        );
    }
    assert!(
        events
            .iter()
            .filter(|e| e["type"] == "tool_requested")
            .all(|e| e["details"].get("delegation").is_none())
    );
    let (_, refused) = server.get(&format!("/v1/runs/{run2}/events"), Some(ADMIN));
    let refused_closing: Vec<&Value> = refused["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["event"])
        .filter(|e| e["type"] == "tool_denied" || e["type"] == "tool_failed")
        .collect();
    assert_eq!(refused_closing.len(), 1);
    assert_eq!(refused_closing[0]["reason"], "caller_jwt_required");
    assert!(refused_closing[0]["details"].get("delegation").is_none());
    answers.push(Value::Array(events));
    answers.push(refused);

    // No token, secret or credential anywhere: answers, events, metrics, logs, and
    // every file of the data directory.
    let metrics = server.metrics();
    let logs = server.log_lines_with("");
    assert!(server.stop().success());
    let mut needles = vec![
        alice.clone(),
        bob.clone(),
        CLIENT_SECRET.to_string(),
        ACTOR_TOKEN.to_string(),
        base64_encode(&format!("my-client:{CLIENT_SECRET}")),
    ];
    needles.extend(issued.lock().unwrap().iter().cloned());
    for needle in &needles {
        for answer in &answers {
            assert!(
                !answer.to_string().contains(needle.as_str()),
                "{needle} in {answer}"
            );
        }
        assert!(
            !metrics.contains(needle.as_str()),
            "{needle} in the metrics"
        );
        assert!(
            logs.iter().all(|l| !l.contains(needle.as_str())),
            "{needle} in the logs"
        );
        for file in files_under(&dir.path().join("var")) {
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{needle} in {}",
                file.display()
            );
        }
    }
}

#[test]
fn a_token_exchange_endpoint_down_slow_garbage_or_huge_fails_closed_and_nothing_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let idp = JwksServer::start(Jwks::Serve(jwks(&[rsa1()])));
    let (upstream, seen) = http_server(|_| (200, json!({"ok": true}).to_string()));
    let endpoints = failing_endpoints();
    let tools: Vec<(&str, String)> = endpoints
        .iter()
        .map(|(name, addr)| {
            (
                *name,
                exchange_tool(name, &upstream, &format!("http://{addr}/token"), 2000),
            )
        })
        .collect();
    let server = serve(dir.path(), &idp.url, &tools);
    let run = server.create_run(json!({}));
    let alice = user_token("user-alice");
    for (name, _) in &endpoints {
        let (status, body) = server.post(
            "/v1/tool-calls",
            Some(&alice),
            &call_body(&run, name, "p-1"),
        );
        let diagnostic = &body["diagnostic"];
        assert_eq!(diagnostic["reason"], "dependency_down", "{name}: {body}");
        assert_eq!(
            diagnostic["details"]["reached_tool"], false,
            "{name}: {body}"
        );
        assert!(status >= 500, "{name}: {status}");
        assert!(!body.to_string().contains(&alice), "{name}: {body}");
    }
    assert!(seen.lock().unwrap().is_empty(), "nothing reached the tool");
    let (status, _) = server.get("/healthz", None);
    assert_eq!(status, 200);
}
