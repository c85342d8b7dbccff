//! `toolgate-bench` end to end, shortened: it starts the real server, measures every
//! path and writes a complete report. (Figures are not checked here: speed belongs in
//! the benchmark itself, see docs/performance.md.)
//!
//! The benchmark's pure modules are compiled here with their unit tests (the binary
//! itself has no test harness: `test = false` in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../src/bin/toolgate-bench/report.rs"]
#[allow(dead_code)]
mod report;
#[path = "../../src/bin/toolgate-bench/stats.rs"]
#[allow(dead_code)]
mod stats;

use crate::common;

/// The benchmark binary (not part of `toolgate`).
const BENCH: &str = env!("CARGO_BIN_EXE_toolgate-bench");
use serde_json::Value;

#[test]
fn a_short_bench_measures_every_path_and_writes_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report.json");
    let output = std::process::Command::new(BENCH)
        .args(["--seconds", "0.2", "--warmup", "0", "--clients", "1,2"])
        .args(["--durability", "full,normal"])
        .args(["--tools", "builtin,http,case,dryrun", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("gateway / direct") && stdout.contains("targets"),
        "{stdout}"
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    // builtin and http x 2 client counts directly; 4 tools x 2 client counts through
    // each durability; and a bare echo right before each of the 8 case and dryrun rows.
    assert_eq!(rows.len(), 4 + 16 + 8, "{report:#}");
    for row in rows {
        assert!(row["calls"].as_u64().unwrap() > 0, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
        assert!(row["p50_ms"].as_f64().unwrap() <= row["p99_ms"].as_f64().unwrap());
        if row["path"] == "gateway" {
            // The server's own overhead histogram moved during the measurement.
            assert!(
                row["server_overhead_mean_ms"].as_f64().unwrap() > 0.0,
                "{row}"
            );
            // The server's CPU time per call, from /proc.
            assert!(
                row["server_cpu_us_per_call"].as_f64().unwrap() >= 0.0,
                "{row}"
            );
            // Its context switches per call. With FULL and one client every commit is
            // handed to the audit writer, which then waits for the next one (it cannot
            // come before this one is answered), so two calls in the window move the
            // count; with NORMAL a lone client's commits are quiet and may park no
            // thread at all in a short window on a loaded machine.
            let switches = row["server_switches_per_call"].as_f64().unwrap();
            if row["durability"] == "full"
                && row["clients"] == 1
                && row["calls"].as_u64() >= Some(2)
            {
                assert!(switches > 0.0, "{row}");
            } else {
                assert!(switches >= 0.0, "{row}");
            }
        }
    }
    for durability in ["full", "normal"] {
        for tool in ["builtin", "http", "case", "dryrun"] {
            assert!(
                rows.iter().any(|r| r["path"] == "gateway"
                    && r["durability"] == durability
                    && r["tool"] == tool),
                "no {tool} {durability} row"
            );
        }
    }
    // The echo, measured before each of the 4 case and dryrun rows at each client
    // count, has its spread reported per client count.
    let drift = report["echo_drift"].as_array().unwrap();
    assert_eq!(drift.len(), 2, "{drift:?}");
    for (d, clients) in drift.iter().zip([1, 2]) {
        assert_eq!(
            (d["clients"].as_u64(), d["measurements"].as_u64()),
            (Some(clients), Some(4))
        );
        let (min, max) = (
            d["min_calls_per_s"].as_f64().unwrap(),
            d["max_calls_per_s"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= max, "{d}");
        assert!(d["spread"].as_f64().unwrap() >= 1.0, "{d}");
    }
    assert!(stdout.contains("the bare echo during this run"), "{stdout}");
    let ratios = report["ratios"].as_array().unwrap();
    assert_eq!(ratios.len(), 16);
    // A demo row's ratio is over the echo measured just before it, at its clients.
    for (i, row) in rows.iter().enumerate() {
        if row["path"] != "gateway" || !(row["tool"] == "case" || row["tool"] == "dryrun") {
            continue;
        }
        let echo = &rows[i - 1];
        assert_eq!(
            (&echo["tool"], &echo["path"]),
            (&"echo".into(), &"direct".into())
        );
        assert_eq!(echo["clients"], row["clients"]);
        let ratio = ratios
            .iter()
            .find(|r| {
                r["tool"] == row["tool"]
                    && r["durability"] == row["durability"]
                    && r["clients"] == row["clients"]
            })
            .unwrap();
        let expected = row["calls_per_s"].as_f64().unwrap() / echo["calls_per_s"].as_f64().unwrap();
        let got = ratio["throughput_ratio"].as_f64().unwrap();
        assert!((got - expected).abs() < 1e-3, "{ratio} {row} {echo}");
    }
    let targets = report["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 11);
    // The FULL one-client target is checked against a sync measured in this run.
    let fsync = report["fsync_p50_ms"].as_f64().unwrap();
    assert!(fsync > 0.0, "{fsync}");
    let full_one = targets
        .iter()
        .find(|t| t["name"] == "case p50 minus echo p50 ms, FULL, 1 client")
        .unwrap();
    assert_eq!(full_one["goal"], format!("<= {:.3}", 2.0 * fsync + 0.25));
    assert!(full_one["measured"].is_f64(), "{full_one}");
    assert!(
        rows.iter()
            .any(|r| r["path"] == "direct" && r["tool"] == "echo"),
        "no bare echo row"
    );
    assert_eq!(
        report["machine"]["nproc"],
        std::thread::available_parallelism().unwrap().get()
    );
}

#[test]
fn bad_flags_are_refused_before_anything_starts() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BENCH)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, stderr) = run(&["--seconds", "0"]);
    assert_eq!(code, Some(4), "{stderr}");
    assert!(stderr.contains("`--seconds`"), "{stderr}");
    let (code, _) = run(&["--clients", "0"]);
    assert_eq!(code, Some(4));
}

#[test]
fn the_product_command_line_has_no_benchmark() {
    let (code, stdout, _) = common::run(std::path::Path::new("."), &["--help"]);
    assert_eq!(code, 0);
    assert!(!stdout.contains("bench"), "{stdout}");
    let (code, _, _) = common::run(std::path::Path::new("."), &["bench"]);
    assert_eq!(code, 4);
}
