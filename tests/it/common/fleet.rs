//! Fleets for the tests and the load runs: sidecars sharing a real PostgreSQL
//! (`postgres`), shipping to the audit hub with a fleet key, and what they are asked.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::postgres::Postgres;
use super::{Server, Start};

/// A sidecar of the fleet on `url` (`--cluster-db`), not shipping.
pub fn cluster_sidecar(url: &str) -> Server {
    Server::start_with(Start {
        args: vec!["--cluster-db".into(), url.to_string()],
        ..Start::default()
    })
}

/// Three sidecars on `pg`, started at once (they migrate the fresh database together).
pub fn fleet(pg: &Postgres) -> Vec<Server> {
    let url = pg.url();
    let starts: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || cluster_sidecar(&url))
        })
        .collect();
    starts.into_iter().map(|s| s.join().unwrap()).collect()
}

/// The reason of a refusal's diagnostic.
pub fn reason(body: &Value) -> &str {
    body["diagnostic"]["reason"].as_str().unwrap_or_default()
}

pub fn origin(name: &str) -> String {
    format!("{name}.fleet.test/audit")
}

/// Makes a fleet key in `<dir>/fleet-key` (`toolgate audit fleet-key`); returns its
/// directory and fingerprint.
pub fn fleet_key(dir: &Path) -> (PathBuf, String) {
    let key_dir = dir.join("fleet-key");
    std::fs::create_dir_all(dir).unwrap();
    let (code, out, text) = toolgate(
        dir,
        &[
            "audit",
            "fleet-key",
            "--key-dir",
            key_dir.to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    assert_eq!(code, 0, "{text}");
    let fingerprint = out["fingerprint"].as_str().unwrap().to_string();
    (key_dir, fingerprint)
}

/// A sidecar of the fleet on `url` that ships its log to the hub as `name`, signing
/// with the fleet key in `fleet`.
pub fn shipping_sidecar(url: &str, fleet: &Path, name: &str, data_dir: Option<&Path>) -> Server {
    Server::start_with(Start {
        data_dir: data_dir.map(Path::to_path_buf),
        args: vec![
            "--cluster-db".into(),
            url.to_string(),
            "--fleet-key-dir".into(),
            fleet.display().to_string(),
            "--audit-origin".into(),
            origin(name),
            "--checkpoint-every-events".into(),
            "16".into(),
            "--checkpoint-interval-ms".into(),
            "200".into(),
            "--hub-ship-interval-ms".into(),
            "100".into(),
        ],
        ..Start::default()
    })
}

/// A research call on `run` with `query`.
pub fn research(server: &Server, run: &str, query: &str) -> (u16, Value) {
    server.call(
        "research_agent",
        run,
        "research",
        "legal_search",
        json!({"query": query, "limit": 2}),
        json!({"case_id": "C-1001"}),
    )
}

/// The sidecar's `/metrics` text.
pub fn scrape(server: &Server) -> String {
    let mut response = ureq::get(format!("{}/metrics", server.base))
        .call()
        .unwrap();
    response.body_mut().read_to_string().unwrap()
}

/// A gauge's value in a `/metrics` text.
pub fn gauge(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits until the sidecar's hub lag is 0 with something shipped.
pub fn shipped(server: &Server) {
    let done = super::poll_until(Duration::from_secs(60), || {
        let m = scrape(server);
        gauge(&m, "toolgate_hub_ship_lag_events") == Some(0)
            && gauge(&m, "toolgate_hub_shipped_seq").unwrap_or(0) > 0
    });
    assert!(done, "the sidecar never caught up: {}", scrape(server));
}

/// Runs the binary in `dir`: exit code, stdout as JSON, stdout and stderr as text.
pub fn toolgate(dir: &Path, args: &[&str]) -> (i32, Value, String) {
    let (code, out, err) = super::run(dir, args);
    let value = serde_json::from_str(&out).unwrap_or(Value::Null);
    (code, value, format!("{out}{err}"))
}

/// `audit verify --cluster-db` of the hub on `url`.
pub fn verify_hub(url: &str) -> (i32, Value, String) {
    toolgate(
        Path::new("."),
        &["audit", "verify", "--cluster-db", url, "--format", "json"],
    )
}
