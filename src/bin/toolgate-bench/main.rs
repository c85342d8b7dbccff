//! `toolgate-bench`: what the gateway costs. A separate binary on top of the library,
//! not part of the product's command line. Runs the real server (`toolgate serve`, the
//! binary next to this one, as a child process) on a generated benchmark policy and measures, in one
//! run and side by side, the same tool call made directly to the tool and through the
//! gateway, at several numbers of concurrent clients, with audit durability FULL and
//! NORMAL:
//!
//! - `builtin`: the `echo` builtin with empty arguments (the cheapest tool there is),
//!   called directly through the adapter API in this process; through the gateway, the
//!   same builtin as a registry tool;
//! - `http`: a tiny HTTP upstream (in this process, echoing the body it gets), called
//!   directly with a plain HTTP client; through the gateway, an `http` adapter tool
//!   posting to it;
//! - `case` (issue 19): the demo policy's `research_agent` calling `case_lookup` in the
//!   `research` lane (the shipped `policy/` and `tools/`, copied, with the tool's
//!   `max_concurrency` lifted so that no call is refused), against a bare hyper JSON
//!   echo of the same body (`echo`, the same upstream), measured right before each of
//!   its rows so that the ratio compares two minutes of the same machine;
//! - `dryrun`: the same call with `"dry_run": true` (the decision and one durable
//!   event, nothing executed).
//!
//! For every gateway row the server's CPU time (utime + stime of the child process,
//! from `/proc/<pid>/stat`) over the counted window is divided by the calls counted:
//! the CPU microseconds one call costs the server, a figure that stays meaningful on
//! a machine other work is also using. Likewise its context switches per call (summed
//! over its threads, `/proc/<pid>/task/*/status`): the hand-offs between threads on a
//! call's path, each a thread that parked and had to be woken.
//!
//! Every client is a closed loop on its own keep-alive connection. Prints a table and
//! writes the figures as JSON (default `target/bench/gateway.json`).
//!
//! INVARIANT: loopback only (the server, the upstream and the clients all bind or
//! connect to 127.0.0.1); every measurement is bounded in time and in calls, and every
//! request in time; the child server is stopped on every path.

mod measure;
mod policy;
mod report;
mod server;
mod stats;
mod upstream;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use serde_json::json;
use tokio::time::Instant;

use toolgate::gateway::Loaded;

use crate::measure::{Window, Workload, measure};
use crate::policy::{WorkDir, demo_call_body, write_demo_policy, write_policy};
use crate::report::{
    BenchDurability, BenchTool, Report, echo_drift, machine, print_report, ratios, targets,
};
use crate::server::GatewayServer;
use crate::stats::round;
use crate::upstream::Upstream;

/// Longest accepted measurement, per configuration.
const MAX_SECONDS: f64 = 60.0;

/// Most concurrent clients.
const MAX_CLIENTS: usize = 1024;

/// How long one request may take before the client counts an error and stops.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Time allowed to open every client connection before the clock starts.
const CONNECT_ALLOWANCE: Duration = Duration::from_millis(300);

/// How long the child server may take to start and to stop.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(30);

const AGENT_TOKEN: &str = "bench-agent-token";

const ADMIN_TOKEN: &str = "bench-admin-token";

/// The bearer tokens of one server's policy.
struct Tokens {
    agent: &'static str,
    admin: &'static str,
}

const BENCH_TOKENS: Tokens = Tokens {
    agent: AGENT_TOKEN,
    admin: ADMIN_TOKEN,
};

/// The demo policy's public development tokens (policy/roles.yaml).
const DEMO_TOKENS: Tokens = Tokens {
    agent: "demo-research_agent",
    admin: "demo-admin",
};

/// The case the demo run is opened for.
const DEMO_CASE: &str = "C-1001";

/// Measures the gateway against direct tool calls (throughput, latency percentiles).
#[derive(Debug, Parser)]
#[command(name = "toolgate-bench", version)]
struct BenchArgs {
    /// Seconds measured per configuration (at most 60).
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Warm-up seconds before each measurement, not counted.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Concurrent clients, comma-separated (each 1 to 1024).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 64])]
    pub clients: Vec<usize>,
    /// Audit durability settings of the gateway, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [BenchDurability::Full, BenchDurability::Normal])]
    pub durability: Vec<BenchDurability>,
    /// Tools, comma-separated (`case` and `dryrun` are measured against the bare echo).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [BenchTool::Case, BenchTool::Dryrun])]
    pub tools: Vec<BenchTool>,
    /// The demo policy (`roles.yaml`, `lanes.yaml`) the `case` and `dryrun` rows copy.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/policy"))]
    pub demo_policy: PathBuf,
    /// The demo tool registry directory (`tool_registry.yaml`, schemas, data) they copy.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/tools"))]
    pub demo_tools: PathBuf,
    /// Most calls counted in one measurement (its latencies are kept in memory).
    #[arg(long, default_value_t = 2_000_000)]
    pub max_calls: u64,
    /// Where the JSON report is written.
    #[arg(long, default_value = "target/bench/gateway.json")]
    pub out: PathBuf,
}

/// Why the benchmark could not run.
#[derive(Debug)]
enum BenchError {
    /// Bad flags.
    Usage(String),
    /// A file or socket operation failed.
    Io { what: String, error: std::io::Error },
    /// The benchmark policy did not load.
    Policy(String),
    /// The gateway server did not start or misbehaved.
    Server(String),
    /// A request failed outside a measurement (setup).
    Http(String),
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Usage(m) => write!(f, "{m}"),
            BenchError::Io { what, error } => write!(f, "{what}: {error}"),
            BenchError::Policy(m) => write!(f, "the benchmark policy did not load: {m}"),
            BenchError::Server(m) => write!(f, "the gateway server failed: {m}"),
            BenchError::Http(m) => write!(f, "http: {m}"),
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let what = what.into();
    move |error| BenchError::Io { what, error }
}

/// `toolgate-bench`: the only place here that prints an error and picks the exit code
/// (0 success, 1 a failed measurement, 4 bad flags: the codes of `toolgate`).
fn main() -> ExitCode {
    let args = match BenchArgs::try_parse() {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 4 } else { 0 });
        }
    };
    if let Err(e) = check_args(&args) {
        eprintln!("error: {e}");
        return ExitCode::from(4);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(report) => {
            print_report(&report);
            if let Err(e) = write_report(&report, &args.out) {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            println!("\nwrote {}", args.out.display());
            if report.rows.iter().any(|r| r.errors > 0) {
                eprintln!("error: some calls failed; the figures are not comparable");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The `toolgate` binary this benchmark starts: the one built next to this one.
fn toolgate_exe() -> Result<PathBuf, BenchError> {
    let exe = std::env::current_exe().map_err(io("finding this executable"))?;
    let toolgate = exe.with_file_name("toolgate");
    if toolgate.is_file() {
        Ok(toolgate)
    } else {
        Err(BenchError::Server(format!(
            "no `toolgate` binary next to this one (looked for `{}`; build it with `cargo build --release`)",
            toolgate.display()
        )))
    }
}

fn check_args(args: &BenchArgs) -> Result<(), BenchError> {
    if !(args.seconds > 0.0 && args.seconds <= MAX_SECONDS) {
        return Err(BenchError::Usage(format!(
            "`--seconds` must be above 0 and at most {MAX_SECONDS}"
        )));
    }
    if !(args.warmup >= 0.0 && args.warmup <= MAX_SECONDS) {
        return Err(BenchError::Usage(format!(
            "`--warmup` must be between 0 and {MAX_SECONDS}"
        )));
    }
    if args.clients.is_empty() || args.clients.iter().any(|c| !(1..=MAX_CLIENTS).contains(c)) {
        return Err(BenchError::Usage(format!(
            "`--clients` must list numbers from 1 to {MAX_CLIENTS}"
        )));
    }
    if args.max_calls == 0 || args.durability.is_empty() || args.tools.is_empty() {
        return Err(BenchError::Usage(
            "`--max-calls`, `--durability` and `--tools` must not be empty or zero".into(),
        ));
    }
    Ok(())
}

async fn run(args: &BenchArgs) -> Result<Report, BenchError> {
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: this toolgate is built without optimizations; run `cargo bench --bench gateway` or a release build for real figures"
        );
    }
    let work = WorkDir::create()?;
    let upstream = Upstream::start()?;
    let (policy_dir, tools_file) = write_policy(&work.0, upstream.addr)?;
    let loaded = Arc::new(
        Loaded::load(&policy_dir, &tools_file, &work.0.join("direct"))
            .map_err(|p| BenchError::Policy(format!("{} problems, first: {}", p.len(), p[0])))?,
    );
    let window = Window {
        seconds: args.seconds,
        warmup: args.warmup,
        max_calls: args.max_calls,
    };
    let demo = if args.tools.iter().any(|t| t.on_demo()) {
        Some(write_demo_policy(
            &work.0,
            &args.demo_policy,
            &args.demo_tools,
        )?)
    } else {
        None
    };
    // The direct calls of the benchmark policy's tools. The demo's tools are compared
    // with a bare echo measured right before each of their rows (below): the echo's
    // own rate drifts by a third within an hour here, and a ratio over an echo
    // measured minutes earlier carried that drift.
    let mut direct_tools: Vec<BenchTool> = Vec::new();
    for tool in args.tools.iter().filter(|t| !t.on_demo()) {
        if !direct_tools.contains(&tool.direct()) {
            direct_tools.push(tool.direct());
        }
    }
    let echo_body = demo_call_body("run-echo", false);
    let echo = Workload::Http {
        addr: upstream.addr,
        path: "/echo",
        token: None,
        body: Bytes::from(echo_body.clone()),
    };
    let bench_files = (policy_dir.clone(), tools_file.clone());
    let mut rows = Vec::new();
    for &clients in &args.clients {
        for &tool in &direct_tools {
            let target = match tool {
                BenchTool::Builtin => Workload::Adapter {
                    loaded: loaded.clone(),
                },
                BenchTool::Echo => echo.clone(),
                _ => Workload::Http {
                    addr: upstream.addr,
                    path: "/noop",
                    token: None,
                    body: Bytes::from_static(b"{}"),
                },
            };
            eprintln!("measuring {} direct, {clients} clients", tool.as_str());
            let measured = measure(&target, clients, &window, None).await?;
            rows.push(measured.row(tool, "direct", None, clients));
        }
    }
    for &durability in &args.durability {
        // The benchmark policy's server, then the demo policy's, each only if needed.
        let servers: [(bool, Option<&(PathBuf, PathBuf)>); 2] = [
            (args.tools.iter().any(|t| !t.on_demo()), Some(&bench_files)),
            (demo.is_some(), demo.as_ref()),
        ];
        for (on_demo, (wanted, files)) in servers.into_iter().enumerate() {
            let (true, Some((policy, registry))) = (wanted, files) else {
                continue;
            };
            let on_demo = on_demo == 1;
            let tokens = if on_demo { DEMO_TOKENS } else { BENCH_TOKENS };
            let name = format!(
                "{}{}",
                if on_demo { "demo-" } else { "" },
                durability.as_str()
            );
            let server = GatewayServer::start(&work.0, &name, policy, registry, durability)?;
            let run_id = server.create_run(tokens.admin, on_demo).await?;
            for &clients in &args.clients {
                for &tool in args.tools.iter().filter(|t| t.on_demo() == on_demo) {
                    let body = match tool {
                        BenchTool::Case => demo_call_body(&run_id, false),
                        BenchTool::Dryrun => demo_call_body(&run_id, true),
                        _ => json!({
                            "role_id": "bench_agent", "run_id": run_id, "lane_id": "bench",
                            "tool_name": tool.tool_name(), "arguments": {}, "scope": {},
                        })
                        .to_string(),
                    };
                    let target = Workload::Http {
                        addr: server.addr,
                        path: "/v1/tool-calls",
                        token: Some(tokens.agent),
                        body: Bytes::from(body),
                    };
                    if on_demo {
                        eprintln!("measuring echo direct, {clients} clients (beside it)");
                        let measured = measure(&echo, clients, &window, None).await?;
                        rows.push(measured.row(BenchTool::Echo, "direct", None, clients));
                    }
                    eprintln!(
                        "measuring {} through the gateway ({}), {clients} clients",
                        tool.as_str(),
                        durability.as_str()
                    );
                    let before = server.scrape().await?;
                    let measured = measure(&target, clients, &window, server.pid()).await?;
                    let after = server.scrape().await?;
                    let mut row = measured.row(tool, "gateway", Some(durability), clients);
                    row.audit_batch_mean = after.mean_since(&before, "toolgate_audit_batch_events");
                    row.audit_commit_mean_ms = after
                        .mean_since(&before, "toolgate_audit_batch_commit_seconds")
                        .map(|s| round(s * 1000.0, 3));
                    row.server_overhead_mean_ms = after
                        .mean_since(&before, "toolgate_call_overhead_seconds")
                        .map(|s| s * 1000.0);
                    rows.push(row);
                }
            }
            server.stop();
        }
    }
    upstream.stop();
    let ratios = ratios(&rows);
    let fsync_p50_ms = if args.durability.contains(&BenchDurability::Full) {
        Some(measure_fsync(&work.0)?)
    } else {
        None
    };
    let targets = targets(&rows, &ratios, fsync_p50_ms);
    let echo_drift = echo_drift(&rows);
    Ok(Report {
        machine: machine(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        seconds: args.seconds,
        warmup: args.warmup,
        rows,
        ratios,
        echo_drift,
        fsync_p50_ms,
        targets,
    })
}

/// The median time, in ms, of writing 16 KiB (a one-event commit's WAL frames) over a
/// 1 MiB file in `dir` and syncing it, 200 times: what a FULL commit waits for at least.
fn measure_fsync(dir: &Path) -> Result<f64, BenchError> {
    use std::os::unix::fs::FileExt;
    let path = dir.join("fsync-probe");
    let io = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |error| BenchError::Io { what, error }
    };
    let file = std::fs::File::create(&path).map_err(io("cannot create"))?;
    let page = vec![0x5a_u8; 16 * 1024];
    for i in 0..64 {
        file.write_all_at(&page, i * page.len() as u64)
            .map_err(io("cannot write"))?;
    }
    file.sync_all().map_err(io("cannot sync"))?;
    let mut times = Vec::with_capacity(200);
    for i in 0..200_u64 {
        let started = Instant::now();
        file.write_all_at(&page, (i % 64) * page.len() as u64)
            .map_err(io("cannot write"))?;
        file.sync_data().map_err(io("cannot sync"))?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    times.sort_by(f64::total_cmp);
    Ok(round(times[times.len() / 2], 3))
}

fn write_report(report: &Report, out: &Path) -> Result<(), BenchError> {
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(format!("creating `{}`", parent.display())))?;
    }
    let text = serde_json::to_string_pretty(report).map_err(|e| BenchError::Io {
        what: "encoding the report".into(),
        error: std::io::Error::other(e),
    })?;
    std::fs::write(out, text + "\n").map_err(io(format!("writing `{}`", out.display())))
}
