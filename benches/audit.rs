//! Audit append throughput: events per second with durability FULL and NORMAL at 1, 8
//! and 64 concurrent writers, each awaiting its own durable append (group commit).
//!
//! Run: `cargo bench --bench audit` (optionally `-- SECONDS` per configuration). Last,
//! it prints what signing one checkpoint costs (each commit signs its head).
#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate::audit::{AuditLog, AuditOptions, Durability, EventType, NewEvent};

fn event(writer: usize, i: u64) -> NewEvent {
    let mut e = NewEvent::new(EventType::ToolRequested);
    e.call_id = Some(format!("call-{writer}-{i}"));
    e.run_id = Some(format!("run-{writer}"));
    e.role_id = Some("paralegal".into());
    e.lane_id = Some("research".into());
    e.tool_name = Some("read_document".into());
    e.tool_version = Some("1.0.0".into());
    e.arguments_hash_sha256 = Some("ab".repeat(32));
    e.arguments_hmac_sha256 = Some("cd".repeat(32));
    e.arguments = Some(json!({"path": format!("cases/c-{i}/memo.txt"), "max_bytes": 65536}));
    e
}

fn run(durability: Durability, writers: usize, seconds: f64) -> (u64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut options = AuditOptions::new(dir.path());
    options.durability = durability;
    let log = AuditLog::open(options).expect("open");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..writers {
            let (log, stop, count) = (log.clone(), stop.clone(), count.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    log.append(event(w, i)).await.expect("append");
                    count.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.expect("task");
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    runtime.block_on(log.close()).expect("close");
    let n = count.load(Ordering::Relaxed);
    (n, n as f64 / elapsed)
}

/// Median and 90th percentile of one 32 KiB write + fdatasync, in ms: the disk's
/// commit latency right now, which bounds FULL throughput (events per commit / latency).
fn fsync_latency() -> (f64, f64) {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut file = std::fs::File::create(dir.path().join("probe")).expect("probe file");
    let mut times: Vec<f64> = (0..50)
        .map(|i| {
            file.seek(SeekFrom::Start((i % 8) * 32768)).expect("seek");
            file.write_all(&[7u8; 32768]).expect("write");
            let started = Instant::now();
            file.sync_data().expect("fdatasync");
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[25], times[45])
}

fn main() {
    let (median, p90) = fsync_latency();
    println!("disk: 32 KiB write + fdatasync median {median:.2} ms, p90 {p90:.2} ms");
    let seconds: f64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(3.0);
    println!("audit append throughput ({seconds} s per row, each append awaited until durable)");
    println!(
        "{:<12} {:>8} {:>10} {:>12}",
        "durability", "writers", "events", "events/s"
    );
    for (name, durability) in [("FULL", Durability::Full), ("NORMAL", Durability::Normal)] {
        for writers in [1, 8, 64] {
            let (n, rate) = run(durability, writers, seconds);
            println!("{name:<12} {writers:>8} {n:>10} {rate:>12.0}");
        }
    }
    let (median, p90) = fsync_latency();
    println!("disk: 32 KiB write + fdatasync median {median:.2} ms, p90 {p90:.2} ms");
    println!(
        "signing one checkpoint (every commit signs its head): {:.1} us",
        sign_cost_us()
    );
}

/// Mean time to sign one checkpoint note with the file signer, in microseconds.
fn sign_cost_us() -> f64 {
    use toolgate::audit::checkpoint::Checkpoint;
    use toolgate::audit::keys::SignerKey;
    let key = SignerKey::from_seed("toolgate/audit", [7; 32]).expect("a signing key");
    let rounds = 2000u64;
    let started = Instant::now();
    let mut bytes = 0;
    for size in 0..rounds {
        let checkpoint = Checkpoint {
            origin: "toolgate/audit".into(),
            size,
            root: [size as u8; 32],
        };
        bytes += checkpoint.sign(&key).len();
    }
    let elapsed = started.elapsed().as_secs_f64();
    std::hint::black_box(bytes);
    elapsed * 1e6 / rounds as f64
}
