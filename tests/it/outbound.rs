//! The one outgoing HTTP stack over real TLS: checkpoint sinks over https (a private CA
//! given with `--checkpoint-sink-ca`, a certificate that CA did not issue), the newest
//! signed head reaching a remote sink between periodic checkpoints, and the http
//! adapter calling an https upstream (trusted through `SSL_CERT_FILE`, or refused with
//! nothing sent), and the adapter's answer cap enforced while the body streams.
//! Certificates are made by the test (rcgen); the TLS servers are rustls on 127.0.0.1.

use crate::audit_support::{code, toolgate};
use crate::common::lab;
use crate::common::{Server, Start, repo};

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};

/// A test CA and a server certificate it issued for 127.0.0.1 and localhost.
struct Pki {
    ca_pem: String,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn pki(name: &str) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, format!("toolgate test CA {name}"));
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        chain: vec![leaf.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    }
}

/// An https server on 127.0.0.1 (one thread per connection): answers every request
/// with `answer(body)` as JSON and reports the request; a connection that ends
/// without a request (a refused handshake) is counted in `refused`.
struct TlsServer {
    addr: String,
    requests: mpsc::Receiver<(String, Vec<u8>)>,
    refused: Arc<AtomicUsize>,
}

fn tls_server(pki: &Pki, answer: fn(&[u8]) -> Value) -> TlsServer {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(pki.chain.clone(), pki.key.clone_key())
    .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, requests) = mpsc::channel();
    let refused = Arc::new(AtomicUsize::new(0));
    let counted = refused.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { continue };
            let (config, tx, counted) = (config.clone(), tx.clone(), counted.clone());
            std::thread::spawn(move || {
                tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let (head, body) = lab::read_request(&mut tls);
                if head.is_empty() {
                    counted.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                let text = answer(&body).to_string();
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = tls.write_all(response.as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
                let _ = tx.send((head, body));
            });
        }
    });
    TlsServer {
        addr,
        requests,
        refused,
    }
}

/// Waits (at most 10 s) until the server has seen a connection end without a request.
fn wait_refused(server: &TlsServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.refused.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "no refused handshake reached the server"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn event_count(db: &Path) -> u64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))
        .unwrap() as u64
}

fn checkpoint_rows(db: &Path) -> u64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT count(*) FROM checkpoints", [], |r| {
        r.get::<_, i64>(0)
    })
    .unwrap() as u64
}

/// The tree size a note covers (its second line).
fn note_size(note: &str) -> u64 {
    note.lines().nth(1).unwrap().parse().unwrap()
}

/// Makes a run and `calls` calls of the demo policy.
fn traffic(server: &Server, calls: usize) {
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    for i in 0..calls {
        let (status, body) = server.call(
            "research_agent",
            &run,
            "research",
            "legal_search",
            json!({"query": format!("duty {i}"), "limit": 3}),
            scope.clone(),
        );
        assert_eq!(status, 200, "{body}");
    }
}

/// Waits (at most 20 s) for the sink to receive a note covering `size` events; returns
/// every note received until then, in order.
fn notes_until(sink: &TlsServer, size: u64) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut notes: Vec<String> = Vec::new();
    while notes.last().is_none_or(|n| note_size(n) < size) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (head, body) = sink
            .requests
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no note covering {size} events within 20 s: {notes:?}"));
        assert!(head.starts_with("POST /checkpoints "), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain"),
            "{head}"
        );
        notes.push(String::from_utf8(body).unwrap());
    }
    notes
}

#[test]
fn an_https_sink_with_a_private_ca_receives_checkpoints_that_verify_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki("private");
    let ca = dir.path().join("sink-ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let sink = tls_server(&pki, |_| json!({}));
    let server = Server::start_with(Start {
        args: vec![
            "--checkpoint-sink".into(),
            format!("https://{}/checkpoints", sink.addr),
            "--checkpoint-sink-ca".into(),
            ca.display().to_string(),
        ],
        data_dir: Some(dir.path().join("var")),
        ..Start::default()
    });
    traffic(&server, 3);
    let events = event_count(&server.db());
    let notes = notes_until(&sink, events);
    let sizes: Vec<u64> = notes.iter().map(|n| note_size(n)).collect();
    assert!(sizes.windows(2).all(|w| w[0] <= w[1]), "{sizes:?}");
    let data_dir = server.data_dir.clone();
    assert!(server.stop().success());
    // What the sink holds is a checkpoint signed by the gateway's key that the log
    // extends: an auditor's trusted checkpoint.
    let trusted = dir.path().join("trusted.note");
    std::fs::write(&trusted, notes.last().unwrap()).unwrap();
    let db = data_dir.join("audit.db");
    let out = toolgate(&[
        "audit",
        "verify",
        "--db",
        db.to_str().unwrap(),
        "--trusted-checkpoint",
        trusted.to_str().unwrap(),
    ]);
    assert_eq!(
        code(&out),
        0,
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sink.refused.load(Ordering::SeqCst), 0);
}

/// A sink whose certificate the given CA did not issue gets no byte of a checkpoint;
/// the failure is logged, the calls go on at their usual pace and every acknowledged
/// event is still signed locally.
#[test]
fn an_https_sink_with_an_untrusted_certificate_is_refused_and_calls_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let trusted = pki("trusted");
    let ca = dir.path().join("sink-ca.pem");
    std::fs::write(&ca, &trusted.ca_pem).unwrap();
    let impostor = tls_server(&pki("impostor"), |_| json!({}));
    let server = Server::start_with(Start {
        args: vec![
            "--checkpoint-sink".into(),
            format!("https://{}/checkpoints", impostor.addr),
            "--checkpoint-sink-ca".into(),
            ca.display().to_string(),
            "--checkpoint-every-events".into(),
            "1".into(),
        ],
        data_dir: Some(dir.path().join("var")),
        ..Start::default()
    });
    let started = Instant::now();
    traffic(&server, 4);
    assert!(started.elapsed() < Duration::from_secs(20));
    let logged = server.log_lines_with("checkpoint sink failed");
    assert!(!logged.is_empty());
    assert!(
        logged[0].contains("UnknownIssuer") || logged[0].contains("certificate"),
        "{logged:?}"
    );
    wait_refused(&impostor);
    let db = server.db();
    let events = event_count(&db);
    server.kill9();
    assert!(
        impostor.requests.try_recv().is_err(),
        "a request reached the impostor"
    );
    let out = toolgate(&[
        "audit",
        "verify",
        "--db",
        db.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(
        code(&out),
        0,
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["events"], json!(events), "{report}");
}

/// With periodic checkpoints far apart, a remote sink still gets the signed head of the
/// newest commit (coalesced, in signing order) soon after the calls.
#[test]
fn a_remote_sink_gets_the_newest_signed_head_between_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki("heads");
    let ca = dir.path().join("sink-ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let sink = tls_server(&pki, |_| json!({}));
    let server = Server::start_with(Start {
        args: vec![
            "--checkpoint-sink".into(),
            format!("https://{}/checkpoints", sink.addr),
            "--checkpoint-sink-ca".into(),
            ca.display().to_string(),
            "--checkpoint-every-events".into(),
            "1000000".into(),
            "--checkpoint-interval-ms".into(),
            "3600000".into(),
        ],
        ..Start::default()
    });
    for round in 1..=2 {
        traffic(&server, 5);
        let events = event_count(&server.db());
        let notes = notes_until(&sink, events);
        assert_eq!(note_size(notes.last().unwrap()), events, "round {round}");
        // No periodic checkpoint covers these events: what the sink got are heads.
        assert_eq!(checkpoint_rows(&server.db()), 0, "round {round}");
        // Coalesced: far fewer notes than the commits behind them.
        assert!(notes.len() as u64 <= events, "{} notes", notes.len());
    }
    server.kill9();
}

#[test]
fn serve_refuses_an_unusable_sink_ca() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let pki = pki("unused");
    let good = dir.path().join("good.pem");
    std::fs::write(&good, &pki.ca_pem).unwrap();
    let data = dir.path().join("var");
    for (ca, sink, expect) in [
        (&not_pem, "https://127.0.0.1:9/x", "BEGIN CERTIFICATE"),
        (
            &good,
            "http://127.0.0.1:9/x",
            "no checkpoint sink is an https",
        ),
    ] {
        let mut child = std::process::Command::new(crate::common::server_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--policy-dir"])
            .arg(repo().join("policy"))
            .arg("--tools")
            .arg(repo().join("tools/tool_registry.yaml"))
            .arg("--data-dir")
            .arg(&data)
            .args(["--checkpoint-sink", sink, "--checkpoint-sink-ca"])
            .arg(ca)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("serve started with an unusable sink CA ({expect})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 1, "{stderr}");
        assert!(stderr.contains(expect), "{stderr}");
    }
}

/// The lab's `upstream_echo` tool pointed at an https upstream.
fn https_lab(dir: &Path, upstream: &str) -> Start {
    let start = lab::lab(dir);
    std::fs::write(
        &start.tools,
        lab::TOOLS
            .replace("http://UPSTREAM", &format!("https://{upstream}"))
            .replace("UPSTREAM", upstream),
    )
    .unwrap();
    start
}

#[test]
fn the_http_adapter_calls_an_https_upstream_its_system_trusts() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki("upstream");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let upstream = tls_server(
        &pki,
        |body| json!({"received": serde_json::from_slice::<Value>(body).unwrap_or(Value::Null)}),
    );
    // The private CA is the system's trust store of this server (SSL_CERT_FILE).
    let mut start = https_lab(dir.path(), &upstream.addr);
    start.env = vec![("SSL_CERT_FILE".into(), ca.display().to_string())];
    let server = Server::start_with(start);
    let run = server.create_run(json!({}));
    let (status, body) = lab::call(
        &server,
        &run,
        "upstream_echo",
        json!({"q": "over tls"}),
        json!({}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["received"], json!({"q": "over tls"}));
    let (head, _) = upstream.requests.try_recv().unwrap();
    assert!(head.starts_with("POST /echo "), "{head}");
}

#[test]
fn an_https_upstream_with_an_untrusted_certificate_is_dependency_down_and_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = tls_server(&pki("unknown"), |_| json!({"received": {}}));
    let server = Server::start_with(https_lab(dir.path(), &upstream.addr));
    let run = server.create_run(json!({}));
    let (status, body) = lab::call(
        &server,
        &run,
        "upstream_echo",
        json!({"q": "secret"}),
        json!({}),
    );
    let diagnostic = &body["diagnostic"];
    assert_eq!(diagnostic["reason"], "dependency_down", "{body}");
    assert_eq!(
        diagnostic["details"]["reached_tool"],
        json!(false),
        "{body}"
    );
    let error = diagnostic["details"]["dependency_error"].as_str().unwrap();
    assert!(error.contains("certificate"), "{error}");
    assert!(status >= 500, "{status}");
    assert!(
        upstream.requests.try_recv().is_err(),
        "the request reached an upstream whose certificate is not trusted"
    );
    wait_refused(&upstream);
}

/// A plain-http upstream that answers the first request on each connection with
/// `head` and then blocks of 64 KiB (chunked encoding when `chunked`), until the
/// client goes away or 1 GiB was written; reports the bytes written.
fn flooding_upstream(head: &'static str, chunked: bool) -> (String, mpsc::Receiver<u64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, written) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let _ = lab::read_request(&mut stream);
                let mut total = 0u64;
                let block = vec![b'a'; 64 * 1024];
                let mut chunk = Vec::new();
                if chunked {
                    chunk.extend_from_slice(format!("{:x}\r\n", block.len()).as_bytes());
                }
                chunk.extend_from_slice(&block);
                if chunked {
                    chunk.extend_from_slice(b"\r\n");
                }
                if stream.write_all(head.as_bytes()).is_ok() {
                    while total < (1 << 30) && stream.write_all(&chunk).is_ok() {
                        total += chunk.len() as u64;
                    }
                }
                let _ = tx.send(total);
            });
        }
    });
    (addr, written)
}

/// The upstream's answer is read as it streams and refused once it passes the hard
/// cap (16 MiB here): the gateway never reads (or holds) an endless body, and refuses
/// at once a body whose announced length is over the cap.
#[test]
fn an_http_answer_over_the_cap_is_refused_while_it_streams() {
    let cap = 16 * 1024 * 1024u64;
    for (head, chunked) in [
        (
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
            true,
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1073741824\r\n\r\n",
            false,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (addr, written) = flooding_upstream(head, chunked);
        let start = lab::lab(dir.path());
        std::fs::write(&start.tools, lab::TOOLS.replace("UPSTREAM", &addr)).unwrap();
        let server = Server::start_with(start);
        let run = server.create_run(json!({}));
        let started = Instant::now();
        let (_, body) = lab::call(&server, &run, "upstream_echo", json!({}), json!({}));
        let elapsed = started.elapsed();
        let diagnostic = &body["diagnostic"];
        assert_eq!(diagnostic["reason"], "tool_error", "{body}");
        let error = diagnostic["details"]["tool_error"].as_str().unwrap();
        assert!(error.contains(&format!("more than {cap} bytes")), "{error}");
        // Refused well before the 5 s deadline, not by it.
        assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
        let total = written.recv_timeout(Duration::from_secs(20)).unwrap();
        // What the upstream got rid of: at most the cap plus what the kernel's socket
        // buffers hold, far from the 1 GiB it would send to a reader that kept reading.
        assert!(total < cap + (32 << 20), "the upstream wrote {total} bytes");
        println!("chunked={chunked}: refused after {elapsed:?}; upstream wrote {total} bytes");
    }
}
