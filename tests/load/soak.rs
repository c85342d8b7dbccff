//! The soak test (issue 13): TOOLGATE_SOAK_CLIENTS (default 64) clients call through
//! the real server for TOOLGATE_SOAK_SECONDS (default 600) while the WAL file and the
//! process RSS are sampled every second; TOOLGATE_SOAK_DURABILITY (default `normal`)
//! picks the durability. One client with NORMAL makes every commit a quiet one
//! (docs/audit.md), whose WAL is kept bounded by handing the restart to the writer
//! thread. Not part of `cargo test` (the `load` target is built only on request); run it
//! with
//!
//!     TOOLGATE_SOAK_SECONDS=600 cargo test --release --test load soak -- --nocapture
//!
//! (`TOOLGATE_TEST_BIN=target/release/toolgate` runs a release server from a debug test
//! build.)
//!
//! It asserts the WAL stays under 64 MiB and the RSS is flat (the last quarter's
//! peak within 25% + 16 MiB of the first quarter's), and prints the figures that
//! docs/performance.md records.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Server, Start, token};
use serde_json::json;

const WAL_BOUND: u64 = 64 * 1024 * 1024;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn soak_keeps_the_wal_bounded_and_rss_flat() {
    let seconds: u64 = std::env::var("TOOLGATE_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let durability = std::env::var("TOOLGATE_SOAK_DURABILITY").unwrap_or_else(|_| "normal".into());
    let clients: usize = std::env::var("TOOLGATE_SOAK_CLIENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let server = Server::start_with(Start {
        args: vec!["--durability".into(), durability.clone()],
        ..Start::default()
    });
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let pid = server.pid();
    let wal = server.data_dir.join("audit.db-wal");
    let db = server.db();
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = (0..clients)
        .map(|_| {
            let (stop, calls, errors, limited) =
                (stop.clone(), calls.clone(), errors.clone(), limited.clone());
            let (base, run) = (server.base.clone(), run.clone());
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(30)))
                    .build()
                    .into();
                let body =
                    json!({"role_id": "research_agent", "run_id": run, "lane_id": "research",
                    "tool_name": "case_lookup", "arguments": {}, "scope": {"case_id": "C-1001"}})
                    .to_string();
                let auth = format!("Bearer {}", token("research_agent"));
                while !stop.load(Ordering::Relaxed) {
                    let ok = agent
                        .post(format!("{base}/v1/tool-calls"))
                        .header("Authorization", &auth)
                        .send(body.as_bytes())
                        .map(|mut r| {
                            let _ = r.body_mut().read_to_string();
                            r.status().as_u16()
                        })
                        .unwrap_or(0);
                    match ok {
                        200 => calls.fetch_add(1, Ordering::Relaxed),
                        // The tool's max_concurrency (64 clients, a smaller limit): a
                        // structured, audited refusal, not a failure of the gateway.
                        429 => limited.fetch_add(1, Ordering::Relaxed),
                        _ => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut max_wal = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        // The sampling period of the measurement, not a wait for anything.
        std::thread::sleep(Duration::from_secs(1));
        let wal_bytes = std::fs::metadata(&wal).map_or(0, |m| m.len());
        max_wal = max_wal.max(wal_bytes);
        let rss = rss_bytes(pid);
        samples.push((started.elapsed().as_secs(), wal_bytes, rss));
        if samples.len() % 30 == 0 {
            eprintln!(
                "t={}s calls={} errors={} wal={} MiB rss={} MiB",
                started.elapsed().as_secs(),
                calls.load(Ordering::Relaxed),
                errors.load(Ordering::Relaxed),
                wal_bytes >> 20,
                rss >> 20
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.join().unwrap();
    }
    let total = calls.load(Ordering::Relaxed);
    let quarter = (samples.len() / 4).max(1);
    let peak = |s: &[(u64, u64, u64)]| s.iter().map(|x| x.2).max().unwrap_or(0);
    let early = peak(&samples[..quarter]);
    let late = peak(&samples[samples.len() - quarter..]);
    let db_bytes = std::fs::metadata(&db).map_or(0, |m| m.len());
    let metrics = server.metrics();
    let counter = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    let restarts = counter("toolgate_audit_wal_restarts_total ");
    let truncations = counter("toolgate_audit_wal_truncations_total ");
    eprintln!("soak: the WAL started over {restarts} times, was truncated {truncations} times");
    eprintln!(
        "soak: {seconds}s, {clients} clients, durability {durability}: {total} calls ({:.0}/s), {} refused at max_concurrency, {} errors; \
         WAL max {:.1} MiB; RSS first quarter peak {:.1} MiB, last quarter peak {:.1} MiB; database {:.0} MiB",
        total as f64 / seconds as f64,
        limited.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        max_wal as f64 / 1048576.0,
        early as f64 / 1048576.0,
        late as f64 / 1048576.0,
        db_bytes as f64 / 1048576.0,
    );
    assert!(max_wal < WAL_BOUND, "WAL reached {max_wal} bytes");
    // Kept bounded by starting over after the writer's copy, not by truncations that
    // hold the write lock (no reader holds old frames here).
    assert!(
        db_bytes < 64 << 20 || restarts > 0,
        "{db_bytes} bytes written, no restart"
    );
    assert_eq!(truncations, 0);
    assert!(
        late <= early + early / 4 + 16 * 1024 * 1024,
        "RSS grew from {early} to {late}"
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    assert!(server.stop().success());
}
