//! OIDC/JWT credentials through the real server: a JWK Set served by a local HTTP
//! server in the test, tokens signed in the test with the fixture keys in
//! tests/fixtures/jwt/ (see its README.md), every refusal with its own reason, key
//! rotation and an unreachable key-set endpoint, hostile tokens and key sets in bounded
//! time, the audit record of a JWT caller (never the token), and MCP authorization
//! (RFC 9728 metadata, 401 with `WWW-Authenticate`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use crate::common::{self, ADMIN, Server, Start};
use crate::mcp_support as support;

pub(crate) const ISSUER: &str = "https://idp.lab.test";
pub(crate) const AUDIENCE: &str = "toolgate-lab";

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(common::repo().join("tests/fixtures/jwt").join(name)).unwrap()
}

/// A fixture signing key: its encoding key, algorithm and kid.
pub(crate) struct SigningKey {
    key: EncodingKey,
    alg: Algorithm,
    kid: &'static str,
}

pub(crate) fn rsa1() -> SigningKey {
    SigningKey {
        key: EncodingKey::from_rsa_pem(&fixture("rsa1.pem")).unwrap(),
        alg: Algorithm::RS256,
        kid: "rsa-1",
    }
}

fn rsa2() -> SigningKey {
    SigningKey {
        key: EncodingKey::from_rsa_pem(&fixture("rsa2.pem")).unwrap(),
        alg: Algorithm::RS256,
        kid: "rsa-2",
    }
}

fn ec1() -> SigningKey {
    SigningKey {
        key: EncodingKey::from_ec_pem(&fixture("ec1.pem")).unwrap(),
        alg: Algorithm::ES256,
        kid: "ec-1",
    }
}

fn ed1() -> SigningKey {
    SigningKey {
        key: EncodingKey::from_ed_pem(&fixture("ed1.pem")).unwrap(),
        alg: Algorithm::EdDSA,
        kid: "ed-1",
    }
}

/// The public JWK of a signing key, with its kid.
fn public_jwk(key: &SigningKey) -> Value {
    let jwk = Jwk::from_encoding_key(&key.key, key.alg).unwrap();
    let mut value = serde_json::to_value(jwk).unwrap();
    value["kid"] = json!(key.kid);
    value["use"] = json!("sig");
    value
}

pub(crate) fn jwks(keys: &[SigningKey]) -> String {
    json!({ "keys": keys.iter().map(public_jwk).collect::<Vec<_>>() }).to_string()
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Claims of a valid drafter token; `edit` changes them.
pub(crate) fn claims(subject: &str) -> Value {
    json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": subject,
        "groups": ["drafters"],
        "iat": now(),
        "exp": now() + 600,
        "jti": format!("jti-{subject}"),
    })
}

pub(crate) fn sign(key: &SigningKey, claims: &Value) -> String {
    let mut header = Header::new(key.alg);
    header.kid = Some(key.kid.to_string());
    jsonwebtoken::encode(&header, claims, &key.key).unwrap()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What the local key-set server answers.
#[derive(Clone)]
pub(crate) enum Jwks {
    Serve(String),
    /// Closes every connection without an answer.
    Down,
    /// Sends headers, then nothing.
    Slow,
    /// A body larger than the gateway accepts.
    Huge,
    NotJson,
}

/// A small real HTTP server for one JWK Set, on 127.0.0.1.
pub(crate) struct JwksServer {
    pub(crate) url: String,
    mode: Arc<Mutex<Jwks>>,
    hits: Arc<Mutex<u32>>,
}

impl JwksServer {
    pub(crate) fn start(mode: Jwks) -> JwksServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
        let mode = Arc::new(Mutex::new(mode));
        let hits = Arc::new(Mutex::new(0));
        let (m, h) = (mode.clone(), hits.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let (m, h) = (m.clone(), h.clone());
                std::thread::spawn(move || answer(stream, &m, &h));
            }
        });
        JwksServer { url, mode, hits }
    }

    fn set(&self, mode: Jwks) {
        *self.mode.lock().unwrap() = mode;
    }

    fn hits(&self) -> u32 {
        *self.hits.lock().unwrap()
    }
}

fn answer(mut stream: TcpStream, mode: &Mutex<Jwks>, hits: &Mutex<u32>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
        line.clear();
    }
    *hits.lock().unwrap() += 1;
    let mode = mode.lock().unwrap().clone();
    let body = match mode {
        Jwks::Down => return,
        Jwks::Slow => {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"keys\":",
            );
            let _ = stream.flush();
            std::thread::sleep(Duration::from_secs(20));
            return;
        }
        Jwks::Huge => format!(
            "{{\"keys\":[],\"pad\":\"{}\"}}",
            "x".repeat(2 * 1024 * 1024)
        ),
        Jwks::NotJson => "<html>maintenance</html>".to_string(),
        Jwks::Serve(body) => body,
    };
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// The demo policy plus identity providers (each `(id, issuer, jwks_uri)`), a
/// `workload_drafter` role proven by a JWT whose `groups` holds `drafters`, and a
/// `platform` admin proven by `groups: toolgate-admins`.
fn policy_dir(dir: &Path, providers: &[(&str, &str, &str)]) -> PathBuf {
    let policy = dir.join("policy");
    std::fs::create_dir_all(&policy).unwrap();
    std::fs::copy(
        common::repo().join("policy/lanes.yaml"),
        policy.join("lanes.yaml"),
    )
    .unwrap();
    let roles = std::fs::read_to_string(common::repo().join("policy/roles.yaml")).unwrap();
    let mut declared = String::from("identity_providers:\n");
    for (id, issuer, uri) in providers {
        declared.push_str(&format!(
            "  - id: {id}\n    issuer: \"{issuer}\"\n    audience: {AUDIENCE}\n    jwks_uri: \"{uri}\"\n    algorithms: [RS256, ES256, EdDSA]\n    leeway_s: 5\n    jwks_cooldown_s: 1\n"
        ));
    }
    let roles = roles
        .replacen("\nroles:\n", &format!("\n{declared}\nroles:\n"), 1)
        .replacen(
            "\nadmins:\n",
            "\n  - role_id: workload_drafter\n    description: Drafts as a platform workload proven by its OIDC token.\n    enabled: true\n    lanes: [drafting]\n    credential:\n      jwt: {provider: lab, claim: groups, value: drafters}\n\nadmins:\n",
            1,
        );
    let roles = format!(
        "{roles}\n  - admin_id: platform\n    description: Platform automation proven by its OIDC token.\n    credential:\n      jwt: {{provider: lab, claim: groups, value: toolgate-admins}}\n"
    );
    std::fs::write(policy.join("roles.yaml"), roles).unwrap();
    policy
}

struct Lab {
    server: Server,
    jwks: JwksServer,
    _dir: tempfile::TempDir,
}

fn lab_with(mode: Jwks, args: &[&str]) -> Lab {
    let jwks = JwksServer::start(mode);
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_dir(dir.path(), &[("lab", ISSUER, &jwks.url)]);
    let server = Server::start_with(Start {
        policy_dir: policy,
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Start::default()
    });
    Lab {
        server,
        jwks,
        _dir: dir,
    }
}

fn lab() -> Lab {
    lab_with(Jwks::Serve(jwks(&[rsa1(), ec1(), ed1()])), &[])
}

fn draft_call(run: &str) -> Value {
    json!({
        "role_id": "workload_drafter", "run_id": run, "lane_id": "drafting",
        "tool_name": "draft_document",
        "arguments": {"title": "Engagement letter", "body": "Dear client."},
        "scope": {},
    })
}

fn run(server: &Server) -> String {
    server.create_run(json!({"case_id": "C-1001"}))
}

fn reason(body: &Value) -> String {
    body["diagnostic"]["reason"]
        .as_str()
        .or_else(|| body["reason"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn rs256_es256_and_eddsa_tokens_are_accepted_and_audited_without_the_token() {
    let lab = lab();
    let run = run(&lab.server);
    let mut tokens = Vec::new();
    for key in [rsa1(), ec1(), ed1()] {
        let token = sign(
            &key,
            &claims(&format!("system:serviceaccount:lab:{}", key.kid)),
        );
        let (code, body) = lab
            .server
            .post("/v1/tool-calls", Some(&token), &draft_call(&run));
        assert_eq!(code, 200, "{:?}: {body}", key.alg);
        assert_eq!(body["trace"]["role"], "workload_drafter");
        tokens.push(token);
    }
    // The same caller without the claim the role needs proves nothing.
    let mut other = claims("system:serviceaccount:lab:other");
    other["groups"] = json!(["readers"]);
    let (code, body) = lab.server.post(
        "/v1/tool-calls",
        Some(&sign(&rsa1(), &other)),
        &draft_call(&run),
    );
    assert_eq!(
        (code, reason(&body).as_str()),
        (401, "credential_invalid"),
        "{body}"
    );

    // An admin proven by a JWT creates a run.
    let mut admin = claims("system:serviceaccount:platform:ops");
    admin["groups"] = json!(["toolgate-admins"]);
    let admin_token = sign(&ec1(), &admin);
    let (code, body) = lab.server.post(
        "/v1/runs",
        Some(&admin_token),
        &json!({"scope": {"case_id": "C-1002"}}),
    );
    assert_eq!(code, 201, "{body}");
    // A drafter token is no admin credential.
    let (code, body) = lab.server.post(
        "/v1/runs",
        Some(&tokens[0]),
        &json!({"scope": {"case_id": "C-1002"}}),
    );
    assert_eq!(
        (code, reason(&body).as_str()),
        (401, "credential_invalid"),
        "{body}"
    );

    // Every event of a JWT call names the caller: issuer, subject, kid, jti.
    let (_, events) = lab
        .server
        .get(&format!("/v1/audit/events?run_id={run}"), Some(ADMIN));
    let events = events["events"].as_array().unwrap().clone();
    let calls: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_requested" || e["type"] == "tool_executed")
        .collect();
    assert_eq!(calls.len(), 6, "{events:?}");
    for (i, kid) in ["rsa-1", "ec-1", "ed-1"].iter().enumerate() {
        for event in &calls[2 * i..2 * i + 2] {
            let caller = &event["details"]["caller"];
            assert_eq!(caller["kind"], "jwt", "{event}");
            assert_eq!(caller["issuer"], ISSUER);
            assert_eq!(caller["kid"], *kid);
            assert_eq!(
                caller["subject"],
                format!("system:serviceaccount:lab:{kid}")
            );
            assert_eq!(
                caller["jti"],
                format!("jti-system:serviceaccount:lab:{kid}")
            );
        }
    }
    // No token, nor its signature, in the audit log, the logs or the metrics.
    let audit = std::fs::read(lab.server.db()).unwrap();
    let logs = lab.server.log_lines_with("");
    let (_, _, metrics) = raw(
        &lab.server,
        "GET /metrics HTTP/1.1\r\nhost: gate.test\r\nconnection: close\r\n\r\n",
    );
    for token in tokens.iter().chain([&admin_token]) {
        let signature = token.rsplit('.').next().unwrap();
        for part in [token.as_str(), signature] {
            assert!(
                !audit.windows(part.len()).any(|w| w == part.as_bytes()),
                "token in the audit database"
            );
            assert!(!logs.iter().any(|l| l.contains(part)), "token in the logs");
            assert!(!metrics.contains(part), "token in the metrics");
        }
    }
}

#[test]
fn each_bad_token_is_refused_with_its_own_reason_and_audited() {
    let lab = lab();
    let run = run(&lab.server);
    let key = rsa1();
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut c = claims("system:serviceaccount:lab:drafter");
        edit(&mut c);
        sign(&key, &c)
    };
    let valid = with(&|_| {});
    let (header, payload, signature) = {
        let parts: Vec<&str> = valid.split('.').collect();
        (
            parts[0].to_string(),
            parts[1].to_string(),
            parts[2].to_string(),
        )
    };
    // HS256 keyed with the provider's public key: the classic algorithm confusion.
    let public_pem = {
        let jwk = public_jwk(&key);
        serde_json::to_vec(&jwk).unwrap()
    };
    let mut hs_header = Header::new(Algorithm::HS256);
    hs_header.kid = Some(key.kid.to_string());
    let hs256 = jsonwebtoken::encode(
        &hs_header,
        &claims("x"),
        &EncodingKey::from_secret(&public_pem),
    )
    .unwrap();
    let none = format!(
        "{}.{payload}.",
        b64(json!({"alg": "none", "kid": key.kid})
            .to_string()
            .as_bytes())
    );
    let mut tampered_signature = signature.clone().into_bytes();
    tampered_signature[10] = if tampered_signature[10] == b'A' {
        b'B'
    } else {
        b'A'
    };
    let tampered_signature = format!(
        "{header}.{payload}.{}",
        String::from_utf8(tampered_signature).unwrap()
    );
    let mut altered = claims("system:serviceaccount:lab:drafter");
    altered["groups"] = json!(["drafters", "toolgate-admins"]);
    let tampered_payload = format!(
        "{header}.{}.{signature}",
        b64(altered.to_string().as_bytes())
    );
    let bomb = format!("{}{}", "[".repeat(3000), "]".repeat(3000));
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "expired",
            with(&|c| c["exp"] = json!(now() - 3600)),
            "jwt_expired",
        ),
        (
            "not yet valid",
            with(&|c| c["nbf"] = json!(now() + 3600)),
            "jwt_not_yet_valid",
        ),
        (
            "issued in the future",
            with(&|c| c["iat"] = json!(now() + 3600)),
            "jwt_not_yet_valid",
        ),
        (
            "wrong issuer",
            with(&|c| c["iss"] = json!("https://evil.test")),
            "jwt_issuer_mismatch",
        ),
        (
            "wrong audience",
            with(&|c| c["aud"] = json!(["other-service"])),
            "jwt_audience_mismatch",
        ),
        (
            "no audience",
            with(&|c| {
                c.as_object_mut().unwrap().remove("aud");
            }),
            "jwt_audience_mismatch",
        ),
        (
            "no expiry",
            with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            }),
            "jwt_malformed",
        ),
        (
            "unknown kid",
            {
                let mut h = Header::new(Algorithm::RS256);
                h.kid = Some("nobody".into());
                jsonwebtoken::encode(&h, &claims("x"), &key.key).unwrap()
            },
            "jwt_unknown_kid",
        ),
        ("alg none", none, "jwt_algorithm_refused"),
        ("HS256 with the public key", hs256, "jwt_algorithm_refused"),
        (
            "RS384 not listed",
            {
                let mut h = Header::new(Algorithm::RS384);
                h.kid = Some(key.kid.into());
                jsonwebtoken::encode(&h, &claims("x"), &key.key).unwrap()
            },
            "jwt_algorithm_refused",
        ),
        (
            "ES256 header on an RSA key",
            {
                let mut h = Header::new(Algorithm::ES256);
                h.kid = Some(key.kid.into());
                jsonwebtoken::encode(&h, &claims("x"), &ec1().key).unwrap()
            },
            "jwt_algorithm_refused",
        ),
        (
            "tampered signature",
            tampered_signature,
            "jwt_signature_invalid",
        ),
        (
            "tampered payload",
            tampered_payload,
            "jwt_signature_invalid",
        ),
        ("bad base64", "a$$.b%%.c^^".to_string(), "jwt_malformed"),
        (
            "100 KB token",
            format!("{header}.{}.{signature}", "A".repeat(100 * 1024)),
            "jwt_malformed",
        ),
        (
            "huge header",
            format!(
                "{}.{payload}.{signature}",
                b64(json!({"alg": "RS256", "kid": "x".repeat(7000)})
                    .to_string()
                    .as_bytes())
            ),
            "jwt_malformed",
        ),
        (
            "json bomb header",
            format!("{}.{payload}.{signature}", b64(bomb.as_bytes())),
            "jwt_malformed",
        ),
        (
            "json bomb payload",
            format!(
                "{header}.{}.{signature}",
                b64(format!("{{\"iss\":{bomb}}}").as_bytes())
            ),
            "jwt_malformed",
        ),
        (
            "header not an object",
            format!("{}.{payload}.{signature}", b64(b"[1]")),
            "jwt_malformed",
        ),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for (name, token, expected) in &cases {
        let started = Instant::now();
        let (code, body) = lab
            .server
            .post("/v1/tool-calls", Some(token), &draft_call(&run));
        assert_eq!(reason(&body), *expected, "{name}: {body}");
        assert_eq!(code, 401, "{name}: {body}");
        assert!(
            body["audit_event_id"].is_string(),
            "{name}: not audited: {body}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{name} took {:?}",
            started.elapsed()
        );
        seen.insert(*expected);
    }
    assert_eq!(seen.len(), 8, "{seen:?}");
    // Every refused call left exactly one closing event; none names a caller.
    let (_, events) = lab.server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some(ADMIN),
    );
    let denied: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool_denied")
        .collect();
    assert_eq!(denied.len(), cases.len(), "{events}");
    assert!(denied.iter().all(|e| e["details"]["caller"].is_null()));
}

/// Polls `check` until it is true or `limit` passes.
fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn a_rotated_key_is_picked_up_without_restart() {
    let lab = lab();
    let run = run(&lab.server);
    let old = sign(&rsa1(), &claims("a"));
    let (code, body) = lab
        .server
        .post("/v1/tool-calls", Some(&old), &draft_call(&run));
    assert_eq!(code, 200, "{body}");
    let new = sign(&rsa2(), &claims("b"));
    let (code, body) = lab
        .server
        .post("/v1/tool-calls", Some(&new), &draft_call(&run));
    assert_eq!(reason(&body), "jwt_unknown_kid", "{code} {body}");

    // The issuer publishes its next key beside the current one.
    lab.jwks.set(Jwks::Serve(jwks(&[rsa1(), rsa2()])));
    let accepted = eventually(Duration::from_secs(10), || {
        let (code, _) = lab
            .server
            .post("/v1/tool-calls", Some(&new), &draft_call(&run));
        code == 200
    });
    assert!(accepted, "the new kid was never accepted");
    // Unknown kids are refetched at most once per cooldown (1 s here), however many
    // tokens name them.
    let before = lab.jwks.hits();
    let started = Instant::now();
    for i in 0..20 {
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some(format!("spray-{i}"));
        let spray = jsonwebtoken::encode(&h, &claims("x"), &rsa1().key).unwrap();
        let (_, body) = lab
            .server
            .post("/v1/tool-calls", Some(&spray), &draft_call(&run));
        assert_eq!(reason(&body), "jwt_unknown_kid", "{body}");
    }
    let fetched = lab.jwks.hits() - before;
    let allowed = started.elapsed().as_secs() as u32 + 1;
    assert!(
        fetched <= allowed,
        "{fetched} fetches in {:?}",
        started.elapsed()
    );
}

#[test]
fn a_key_set_endpoint_that_goes_down_keeps_the_cached_keys_and_without_a_cache_fails_closed() {
    let lab = lab();
    let run = run(&lab.server);
    let token = sign(&rsa1(), &claims("cached"));
    let (code, body) = lab
        .server
        .post("/v1/tool-calls", Some(&token), &draft_call(&run));
    assert_eq!(code, 200, "{body}");

    lab.jwks.set(Jwks::Down);
    // A kid the cache lacks makes the gateway try the endpoint (once the cooldown
    // passed): that fails, and says so.
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some("next".into());
    let unknown = jsonwebtoken::encode(&h, &claims("x"), &rsa1().key).unwrap();
    let hits = lab.jwks.hits();
    let failed_fetch = eventually(Duration::from_secs(10), || {
        let (code, body) = lab
            .server
            .post("/v1/tool-calls", Some(&unknown), &draft_call(&run));
        code == 503 && reason(&body) == "jwks_unavailable"
    });
    assert!(failed_fetch && lab.jwks.hits() > hits);
    // The cached keys keep serving.
    let (code, body) = lab
        .server
        .post("/v1/tool-calls", Some(&token), &draft_call(&run));
    assert_eq!(code, 200, "{body}");

    // A gateway that never had the keys refuses: fail closed, retryable.
    let cold = lab_with(Jwks::Down, &[]);
    let run = cold.server.create_run(json!({"case_id": "C-1001"}));
    let (code, body) = cold
        .server
        .post("/v1/tool-calls", Some(&token), &draft_call(&run));
    assert_eq!(
        (code, reason(&body).as_str()),
        (503, "jwks_unavailable"),
        "{body}"
    );
    assert_eq!(body["diagnostic"]["retryable"], true, "{body}");
    assert!(body["audit_event_id"].is_string(), "{body}");
}

#[test]
fn huge_slow_and_non_json_key_sets_are_refused_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    let huge = JwksServer::start(Jwks::Huge);
    let slow = JwksServer::start(Jwks::Slow);
    let text = JwksServer::start(Jwks::NotJson);
    let empty = JwksServer::start(Jwks::Serve(
        r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"rsa-1"}]}"#.into(),
    ));
    let policy = policy_dir(
        dir.path(),
        &[
            ("lab", "https://huge.test", &huge.url),
            ("slow", "https://slow.test", &slow.url),
            ("text", "https://text.test", &text.url),
            ("hmac", "https://hmac.test", &empty.url),
        ],
    );
    let server = Server::start_with(Start {
        policy_dir: policy,
        ..Start::default()
    });
    let run = server.create_run(json!({"case_id": "C-1001"}));
    for issuer in [
        "https://huge.test",
        "https://slow.test",
        "https://text.test",
        "https://hmac.test",
    ] {
        let mut c = claims("x");
        c["iss"] = json!(issuer);
        let token = sign(&rsa1(), &c);
        let started = Instant::now();
        let (code, body) = server.post("/v1/tool-calls", Some(&token), &draft_call(&run));
        assert_eq!(
            (code, reason(&body).as_str()),
            (503, "jwks_unavailable"),
            "{issuer}: {body}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{issuer} took {:?}",
            started.elapsed()
        );
    }
}

/// A raw HTTP request; the status line, headers (lowercased names) and body.
fn raw(server: &Server, request: &str) -> (u16, Vec<(String, String)>, String) {
    let address = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn mcp_post(token: Option<&str>) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!(
        "POST /mcp HTTP/1.1\r\nhost: gate.test\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-11-25\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn mcp_answers_401_with_resource_metadata_and_audiences_follow_the_resource_uri() {
    let lab = lab_with(
        Jwks::Serve(jwks(&[rsa1()])),
        &["--public-url", "https://gate.example/"],
    );
    let (status, headers, body) = raw(&lab.server, &mcp_post(None));
    assert_eq!(status, 401, "{body}");
    let challenge = headers
        .iter()
        .find(|(k, _)| k == "www-authenticate")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert_eq!(
        challenge,
        "Bearer resource_metadata=\"https://gate.example/.well-known/oauth-protected-resource/mcp\""
    );
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reason(&body), "credential_missing", "{body}");
    // A JWT that does not verify: 401, `invalid_token`.
    let expired = {
        let mut c = claims("x");
        c["exp"] = json!(now() - 3600);
        sign(&rsa1(), &c)
    };
    let (status, headers, _) = raw(&lab.server, &mcp_post(Some(&expired)));
    assert_eq!(status, 401);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "www-authenticate" && v.contains("error=\"invalid_token\"")),
        "{headers:?}"
    );

    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let (status, metadata) = lab.server.get(path, None);
        assert_eq!(status, 200, "{path}: {metadata}");
        assert_eq!(metadata["resource"], "https://gate.example/mcp");
        assert_eq!(metadata["authorization_servers"], json!([ISSUER]));
        assert_eq!(metadata["bearer_methods_supported"], json!(["header"]));
    }
    // RFC 8707: a token minted for the resource URI is accepted as well.
    let run = run(&lab.server);
    let mut c = claims("resource");
    c["aud"] = json!("https://gate.example/mcp");
    let (code, body) = lab.server.post(
        "/v1/tool-calls",
        Some(&sign(&rsa1(), &c)),
        &draft_call(&run),
    );
    assert_eq!(code, 200, "{body}");

    // Without identity providers there is no metadata document.
    let plain = Server::start();
    let (status, body) = plain.get("/.well-known/oauth-protected-resource", None);
    assert_eq!(
        (status, reason(&body).as_str()),
        (404, "endpoint_not_found")
    );
}

/// Runs tests/mcp/client.py (the official Python SDK's client) with `plan`.
fn python_client(plan: Value) -> Value {
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

#[test]
fn the_python_mcp_sdk_is_told_401_without_a_credential_and_lists_and_calls_with_a_jwt() {
    let lab = lab();
    let run = run(&lab.server);
    let url = format!("{}/mcp", lab.server.base);
    let refused = python_client(json!({"url": url, "mode": "legacy", "headers": {}}));
    assert!(refused["connect_error"].is_object(), "{refused}");
    let first = &refused["responses"][0];
    assert_eq!(first["status"], 401, "{refused}");
    let challenge = first["www_authenticate"].as_str().unwrap_or_default();
    assert!(
        challenge.starts_with("Bearer resource_metadata=\"http://")
            && challenge.ends_with("/.well-known/oauth-protected-resource/mcp\""),
        "{refused}"
    );
    // The document the challenge names answers.
    let path = challenge
        .split("//")
        .nth(1)
        .and_then(|rest| rest.split_once('/'))
        .map(|(_, path)| format!("/{}", path.trim_end_matches('"')))
        .unwrap();
    let (status, metadata) = lab.server.get(&path, None);
    assert_eq!(status, 200, "{metadata}");
    assert_eq!(metadata["resource"], url);

    let token = sign(&ed1(), &claims("system:serviceaccount:lab:mcp"));
    let seen = python_client(json!({
        "url": url,
        "mode": "legacy",
        "headers": {
            "Authorization": format!("Bearer {token}"),
            "X-Toolgate-Role": "workload_drafter",
            "X-Toolgate-Run": run,
            "X-Toolgate-Lane": "drafting",
            "X-Toolgate-Scope": "{}",
        },
        "calls": [{"name": "draft_document", "arguments": {"title": "t", "body": "b"}}],
    }));
    let names: Vec<&str> = seen["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{seen}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"draft_document"), "{seen}");
    assert_eq!(seen["calls"][0]["isError"], false, "{seen}");
}
