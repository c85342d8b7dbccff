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

use std::convert::Infallible;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1 as client_http1;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use toolgate::adapter::ExecContext;
use toolgate::canonical::sha256_hex;
use toolgate::gateway::Loaded;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum BenchDurability {
    Full,
    Normal,
}

impl BenchDurability {
    fn as_str(self) -> &'static str {
        match self {
            BenchDurability::Full => "full",
            BenchDurability::Normal => "normal",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum BenchTool {
    /// The `echo` builtin with empty arguments.
    Builtin,
    /// An HTTP upstream echoing its body.
    Http,
    /// The demo's `research_agent` -> `case_lookup` (the full gated call).
    Case,
    /// The same call as a dry run (decision and one durable event).
    Dryrun,
    /// The bare hyper JSON echo (direct only): the yardstick of `case` and `dryrun`.
    Echo,
}

impl BenchTool {
    fn as_str(self) -> &'static str {
        match self {
            BenchTool::Builtin => "builtin",
            BenchTool::Http => "http",
            BenchTool::Case => "case",
            BenchTool::Dryrun => "dryrun",
            BenchTool::Echo => "echo",
        }
    }

    /// The tool's name in the benchmark registry (or the demo's).
    fn tool_name(self) -> &'static str {
        match self {
            BenchTool::Builtin => "builtin",
            BenchTool::Http => "upstream",
            BenchTool::Case | BenchTool::Dryrun => "case_lookup",
            BenchTool::Echo => "echo",
        }
    }

    /// Whether the tool is called on the demo policy's server.
    fn on_demo(self) -> bool {
        matches!(self, BenchTool::Case | BenchTool::Dryrun)
    }

    /// The direct call a gateway row of this tool is compared with.
    fn direct(self) -> BenchTool {
        if self.on_demo() {
            BenchTool::Echo
        } else {
            self
        }
    }
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

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
struct Row {
    pub tool: BenchTool,
    /// `direct` or `gateway`.
    pub path: &'static str,
    /// The gateway's audit durability; None for direct calls.
    pub durability: Option<BenchDurability>,
    pub clients: usize,
    pub calls: u64,
    pub errors: u64,
    pub seconds: f64,
    pub calls_per_s: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    /// Mean events per audit transaction during the measurement (gateway only).
    pub audit_batch_mean: Option<f64>,
    /// Mean time of one audit group commit during the measurement, in ms (gateway
    /// only).
    pub audit_commit_mean_ms: Option<f64>,
    /// Mean of the server's own `toolgate_call_overhead_seconds` during the
    /// measurement, in ms (gateway only).
    pub server_overhead_mean_ms: Option<f64>,
    /// The server process's CPU time (user + system, `/proc/<pid>/stat`) over the
    /// counted window divided by the calls counted, in microseconds (gateway only).
    pub server_cpu_us_per_call: Option<f64>,
    /// The server's context switches (voluntary and involuntary, summed over its
    /// threads from `/proc/<pid>/task/*/status`) over the counted window divided by the
    /// calls counted (gateway only): each is a thread that blocked or was preempted,
    /// the cost of every hand-off between threads on a call's path.
    pub server_switches_per_call: Option<f64>,
}

/// Gateway against direct, for one tool, durability and number of clients.
#[derive(Debug, Clone, Serialize)]
struct Ratio {
    pub tool: BenchTool,
    pub durability: BenchDurability,
    pub clients: usize,
    /// Gateway calls/s divided by direct calls/s (for `case` and `dryrun`: by the
    /// bare echo's).
    pub throughput_ratio: f64,
    /// Gateway p50 minus direct p50, in ms: what the gateway adds to a call.
    pub overhead_p50_ms: f64,
}

/// How far the bare echo moved during one run, at one number of clients: it is
/// measured again before each gated row, so on a machine whose speed changes under the
/// benchmark (a shared VM) the spread shows how much of a difference between rows the
/// machine alone can make.
#[derive(Debug, Clone, Serialize)]
struct EchoDrift {
    pub clients: usize,
    pub measurements: usize,
    pub min_calls_per_s: f64,
    pub max_calls_per_s: f64,
    /// `max_calls_per_s / min_calls_per_s`: 1.0 on a steady machine.
    pub spread: f64,
}

/// One of the issue's targets, checked against this run.
#[derive(Debug, Clone, Serialize)]
struct TargetCheck {
    pub name: String,
    pub goal: String,
    pub measured: Option<f64>,
    pub met: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub optimized_build: bool,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    pub machine: Machine,
    pub command: String,
    pub seconds: f64,
    pub warmup: f64,
    pub rows: Vec<Row>,
    pub ratios: Vec<Ratio>,
    /// The bare echo's spread during the run, per number of clients measured more than
    /// once.
    pub echo_drift: Vec<EchoDrift>,
    /// The median time of one commit-sized sync on the data directory's file system
    /// (16 KiB written over a file, then `fdatasync`), in ms: the unit of the FULL
    /// one-client target. None when no FULL row was measured.
    pub fsync_p50_ms: Option<f64>,
    pub targets: Vec<TargetCheck>,
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

/// A temporary directory for the policy and the data dirs, removed when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create() -> Result<WorkDir, BenchError> {
        let dir = std::env::temp_dir().join(format!("toolgate-bench-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).map_err(io(format!("creating `{}`", dir.display())))?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes the benchmark policy: one role, one lane, the `builtin` tool (echo) and the
/// `upstream` http tool. Returns (policy dir, tool registry).
fn write_policy(dir: &Path, upstream: SocketAddr) -> Result<(PathBuf, PathBuf), BenchError> {
    let policy = dir.join("policy");
    let tools = dir.join("tools");
    let roles = format!(
        r#"version: "1.0.0"
roles:
  - role_id: bench_agent
    description: The benchmark's load generator.
    enabled: true
    lanes: [bench]
    credential:
      token_sha256: {agent}
admins:
  - admin_id: bench_admin
    description: Creates the benchmark's run.
    credential:
      token_sha256: {admin}
"#,
        agent = sha256_hex(AGENT_TOKEN.as_bytes()),
        admin = sha256_hex(ADMIN_TOKEN.as_bytes()),
    );
    let lanes = r#"version: "1.0.0"
lanes:
  - lane_id: bench
    description: Benchmark calls.
    tools: [builtin, upstream]
    required_scope_keys: []
    prohibited_flags: []
    run_statuses: [active]
    write: false
"#;
    let tool = |name: &str, adapter: &str| {
        format!(
            r#"  - tool_name: {name}
    description: Does nothing and returns an empty object.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {{timeout_ms_max: 30000, max_output_bytes: 65536, max_concurrency: 1024}}
    allowed_lanes: [bench]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {adapter}
    input_schema: {{path: {name}/schema/input.json}}
    output_schema: {{path: {name}/schema/output.json}}
"#
        )
    };
    let registry = format!(
        "version: \"1.0.0\"\ntools:\n{}{}",
        tool("builtin", "{kind: builtin, name: echo}"),
        tool(
            "upstream",
            &format!(
                "{{kind: http, url: \"http://{upstream}/noop\", allowed_hosts: [\"{upstream}\"]}}"
            )
        ),
    );
    let input = r#"{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "additionalProperties": false}"#;
    let output = r#"{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}"#;
    let mut files = vec![
        (policy.join("roles.yaml"), roles),
        (policy.join("lanes.yaml"), lanes.to_string()),
        (tools.join("tool_registry.yaml"), registry),
    ];
    for name in ["builtin", "upstream"] {
        let schema = tools.join(name).join("schema");
        files.push((schema.join("input.json"), input.to_string()));
        files.push((schema.join("output.json"), output.to_string()));
    }
    for (path, text) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating `{}`", parent.display())))?;
        }
        std::fs::write(&path, text).map_err(io(format!("writing `{}`", path.display())))?;
    }
    Ok((policy, tools.join("tool_registry.yaml")))
}

/// The body of the demo's gated call (`research_agent` -> `case_lookup`) in `run_id`.
fn demo_call_body(run_id: &str, dry_run: bool) -> String {
    let mut body = json!({
        "role_id": "research_agent", "run_id": run_id, "lane_id": "research",
        "tool_name": "case_lookup", "arguments": {}, "scope": {"case_id": DEMO_CASE},
    });
    if dry_run {
        body["dry_run"] = json!(true);
    }
    body.to_string()
}

/// Copies the demo policy and registry (with its schemas and data) into `dir`, with
/// `case_lookup`'s `max_concurrency` lifted to 1024 so that no measured call is refused
/// at its cap. Returns (policy dir, tool registry).
fn write_demo_policy(
    dir: &Path,
    policy: &Path,
    tools: &Path,
) -> Result<(PathBuf, PathBuf), BenchError> {
    let policy_out = dir.join("demo-policy");
    let tools_out = dir.join("demo-tools");
    std::fs::create_dir_all(&policy_out)
        .map_err(io(format!("creating `{}`", policy_out.display())))?;
    for name in ["roles.yaml", "lanes.yaml"] {
        std::fs::copy(policy.join(name), policy_out.join(name))
            .map_err(io(format!("copying `{}`", policy.join(name).display())))?;
    }
    copy_tree(tools, &tools_out, 0)?;
    let registry = tools_out.join("tool_registry.yaml");
    let text = std::fs::read_to_string(&registry)
        .map_err(io(format!("reading `{}`", registry.display())))?;
    let lifted = lift_concurrency(&text, "case_lookup").ok_or_else(|| {
        BenchError::Policy("the demo registry has no `case_lookup` with `max_concurrency`".into())
    })?;
    std::fs::write(&registry, lifted).map_err(io(format!("writing `{}`", registry.display())))?;
    Ok((policy_out, registry))
}

/// `text` with the first `max_concurrency: N` after `tool_name: <tool>` set to 1024.
fn lift_concurrency(text: &str, tool: &str) -> Option<String> {
    let at = text.find(&format!("tool_name: {tool}\n"))?;
    let key = "max_concurrency: ";
    let from = at + text[at..].find(key)? + key.len();
    let digits = text[from..].find(|c: char| !c.is_ascii_digit())?;
    Some(format!("{}1024{}", &text[..from], &text[from + digits..]))
}

/// Copies a directory tree (regular files and directories only, at most 8 levels).
fn copy_tree(from: &Path, to: &Path, depth: usize) -> Result<(), BenchError> {
    if depth > 8 {
        return Err(BenchError::Policy(format!(
            "`{}` is nested too deeply",
            from.display()
        )));
    }
    std::fs::create_dir_all(to).map_err(io(format!("creating `{}`", to.display())))?;
    let entries = std::fs::read_dir(from).map_err(io(format!("listing `{}`", from.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("listing `{}`", from.display())))?;
        let kind = entry
            .file_type()
            .map_err(io(format!("reading `{}`", entry.path().display())))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target, depth + 1)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)
                .map_err(io(format!("copying `{}`", entry.path().display())))?;
        }
    }
    Ok(())
}

/// The stand-in tool upstream and the bare echo: answers every request with its body, on its own thread and
/// single-threaded runtime, until stopped.
struct Upstream {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    fn start() -> Result<Upstream, BenchError> {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(io("binding the upstream"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("configuring the upstream socket"))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the upstream address"))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io("starting the upstream runtime"))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-upstream".into())
            .spawn(move || runtime.block_on(serve_upstream(listener, stopped)))
            .map_err(io("starting the upstream thread"))?;
        Ok(Upstream {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn serve_upstream(
    listener: std::net::TcpListener,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    tokio::pin!(stopped);
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(|request: Request<Incoming>| async move {
                let body = match request.into_body().collect().await {
                    Ok(body) => body.to_bytes(),
                    Err(_) => Bytes::from_static(b"{}"),
                };
                let mut response = Response::new(Full::new(body));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                Ok::<_, Infallible>(response)
            });
            let _ = server_http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The gateway under test: `toolgate serve` as a child process.
struct GatewayServer {
    child: Option<Child>,
    addr: SocketAddr,
    /// Log lines the server wrote (its stderr is drained, as a log shipper would).
    log_lines: Arc<AtomicU64>,
}

impl GatewayServer {
    fn start(
        work: &Path,
        name: &str,
        policy_dir: &Path,
        tools_file: &Path,
        durability: BenchDurability,
    ) -> Result<GatewayServer, BenchError> {
        let exe = toolgate_exe()?;
        let data_dir = work.join(format!("var-{name}"));
        let mut child = Command::new(exe)
            .arg("serve")
            .args([
                "--listen",
                "127.0.0.1:0",
                "--durability",
                durability.as_str(),
            ])
            .arg("--policy-dir")
            .arg(policy_dir)
            .arg("--tools")
            .arg(tools_file)
            .arg("--data-dir")
            .arg(&data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("starting `toolgate serve`"))?;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let mut server = GatewayServer {
            child: Some(child),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_lines: Arc::new(AtomicU64::new(0)),
        };
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            return Err(BenchError::Server("no stdout or stderr pipe".into()));
        };
        let lines = server.log_lines.clone();
        std::thread::spawn(move || {
            for _ in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.fetch_add(1, Ordering::Relaxed);
            }
        });
        // The listening line comes first; a reader thread hands it over with a timeout.
        let (found, listening) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            for line in lines.by_ref().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("toolgate listening on http://") {
                    let _ = found.send(addr.trim().to_string());
                    break;
                }
            }
            for _ in lines {}
        });
        let addr = listening
            .recv_timeout(SERVER_START_TIMEOUT)
            .map_err(|_| BenchError::Server("it did not report its address in time".into()))?;
        server.addr = addr
            .parse()
            .map_err(|_| BenchError::Server(format!("unexpected address `{addr}`")))?;
        Ok(server)
    }

    /// The server's process id, while it runs.
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Opens the measured run (for the demo policy, bound to [`DEMO_CASE`]).
    async fn create_run(&self, admin: &str, demo: bool) -> Result<String, BenchError> {
        let mut conn = Conn::open(self.addr).await?;
        let body = if demo {
            json!({ "scope": { "case_id": DEMO_CASE } }).to_string()
        } else {
            "{}".to_string()
        };
        let (status, body) = conn
            .request(Method::POST, "/v1/runs", Some(admin), Bytes::from(body))
            .await?;
        let value: Value = serde_json::from_slice(&body)
            .map_err(|_| BenchError::Http("POST /v1/runs did not answer json".into()))?;
        match (status, value["run_id"].as_str()) {
            (201, Some(id)) => Ok(id.to_string()),
            _ => Err(BenchError::Http(format!(
                "POST /v1/runs answered {status}: {value}"
            ))),
        }
    }

    async fn scrape(&self) -> Result<Scrape, BenchError> {
        let mut conn = Conn::open(self.addr).await?;
        let (status, body) = conn
            .request(Method::GET, "/metrics", None, Bytes::new())
            .await?;
        if status != 200 {
            return Err(BenchError::Http(format!("GET /metrics answered {status}")));
        }
        Ok(Scrape(String::from_utf8_lossy(&body).into_owned()))
    }

    fn stop(mut self) {
        self.shutdown();
    }

    /// SIGTERM (graceful: the audit log is closed), then SIGKILL if it lingers.
    fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + SERVER_START_TIMEOUT;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for GatewayServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A `/metrics` text.
struct Scrape(String);

impl Scrape {
    /// The value of an unlabelled sample, e.g. `toolgate_audit_batch_events_sum`.
    fn sample(&self, name: &str) -> Option<f64> {
        self.0.lines().find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name).then(|| value.parse().ok()).flatten()
        })
    }

    /// The mean of histogram `name` over the observations made since `before`.
    fn mean_since(&self, before: &Scrape, name: &str) -> Option<f64> {
        let delta = |suffix: &str| {
            let key = format!("{name}_{suffix}");
            Some(self.sample(&key)? - before.sample(&key).unwrap_or(0.0))
        };
        let (sum, count) = (delta("sum")?, delta("count")?);
        (count > 0.0).then(|| sum / count)
    }
}

/// One HTTP/1.1 keep-alive connection of a client.
struct Conn {
    sender: client_http1::SendRequest<Full<Bytes>>,
    host: HeaderValue,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Result<Conn, BenchError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(io(format!("connecting to {addr}")))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = client_http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| BenchError::Http(format!("handshake with {addr}: {e}")))?;
        tokio::spawn(connection);
        let host = HeaderValue::from_str(&addr.to_string())
            .map_err(|e| BenchError::Http(e.to_string()))?;
        Ok(Conn { sender, host })
    }

    async fn request(
        &mut self,
        method: Method,
        path: &'static str,
        token: Option<&str>,
        body: Bytes,
    ) -> Result<(u16, Bytes), BenchError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(token) = token {
            builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = builder
            .body(Full::new(body))
            .map_err(|e| BenchError::Http(e.to_string()))?;
        let exchange = async {
            self.sender
                .ready()
                .await
                .map_err(|e| BenchError::Http(e.to_string()))?;
            let response = self
                .sender
                .send_request(request)
                .await
                .map_err(|e| BenchError::Http(e.to_string()))?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| BenchError::Http(e.to_string()))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| BenchError::Http(format!("no answer within {REQUEST_TIMEOUT:?}")))?
    }
}

/// What one measurement does per call.
#[derive(Clone)]
enum Workload {
    /// The builtin tool through the adapter API, in this process.
    Adapter { loaded: Arc<Loaded> },
    /// A POST over a keep-alive connection; success is status 200.
    Http {
        addr: SocketAddr,
        path: &'static str,
        token: Option<&'static str>,
        body: Bytes,
    },
}

/// How long to measure and how much to keep.
struct Window {
    seconds: f64,
    warmup: f64,
    max_calls: u64,
}

/// The latencies (ns) of the calls completed in the window, and the errors.
struct Measured {
    latencies: Vec<u64>,
    errors: u64,
    seconds: f64,
    /// The server's CPU time over the counted window, in microseconds.
    server_cpu_us: Option<f64>,
    /// The server's context switches over the counted window.
    server_switches: Option<u64>,
}

impl Measured {
    fn row(
        mut self,
        tool: BenchTool,
        path: &'static str,
        durability: Option<BenchDurability>,
        clients: usize,
    ) -> Row {
        self.latencies.sort_unstable();
        let calls = self.latencies.len() as u64;
        let ms = |p: f64| percentile(&self.latencies, p) as f64 / 1e6;
        Row {
            tool,
            path,
            durability,
            clients,
            calls,
            errors: self.errors,
            seconds: round(self.seconds, 3),
            calls_per_s: round(calls as f64 / self.seconds.max(1e-9), 0),
            p50_ms: round(ms(0.50), 4),
            p95_ms: round(ms(0.95), 4),
            p99_ms: round(ms(0.99), 4),
            audit_batch_mean: None,
            audit_commit_mean_ms: None,
            server_overhead_mean_ms: None,
            server_cpu_us_per_call: self
                .server_cpu_us
                .filter(|_| calls > 0)
                .map(|us| round(us / calls as f64, 1)),
            server_switches_per_call: self
                .server_switches
                .filter(|_| calls > 0)
                .map(|n| round(n as f64 / calls as f64, 2)),
        }
    }
}

/// The CPU time (user + system) process `pid` has used so far, in microseconds, from
/// `/proc/<pid>/stat` (fields 14 and 15, in clock ticks); None if unreadable.
fn process_cpu_us(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3, so utime (14) and stime (15) are at 11 and 12.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 * 1e6 / per_second as f64)
}

/// The context switches of each thread of process `pid` so far (voluntary and
/// involuntary, from `/proc/<pid>/task/<tid>/status`), by thread id; None if the
/// process cannot be read.
fn thread_switches(pid: u32) -> Option<std::collections::BTreeMap<u32, u64>> {
    let mut switches = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        // A thread that ended since the listing has nothing left to count.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let count: u64 = status
            .lines()
            .filter(|l| {
                l.starts_with("voluntary_ctxt_switches:")
                    || l.starts_with("nonvoluntary_ctxt_switches:")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        switches.insert(tid, count);
    }
    Some(switches)
}

/// The context switches between two [`thread_switches`] readings: a thread that
/// started in between counts whole; one that ended in between is not counted.
fn switches_between(
    first: &std::collections::BTreeMap<u32, u64>,
    last: &std::collections::BTreeMap<u32, u64>,
) -> u64 {
    last.iter()
        .map(|(tid, n)| n.saturating_sub(first.get(tid).copied().unwrap_or(0)))
        .sum()
}

/// The nearest-rank percentile of sorted values (0 for none).
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Runs `clients` closed-loop clients against `target`: connect, wait for the start,
/// warm up, then count the calls that complete within the window.
///
/// With `server`, the CPU time of that process is read at the window's start and end.
async fn measure(
    target: &Workload,
    clients: usize,
    window: &Window,
    server: Option<u32>,
) -> Result<Measured, BenchError> {
    let begin = Instant::now() + CONNECT_ALLOWANCE;
    let counted_from = begin + Duration::from_secs_f64(window.warmup);
    let end = counted_from + Duration::from_secs_f64(window.seconds);
    let cpu = server.map(|pid| {
        tokio::spawn(async move {
            tokio::time::sleep_until(counted_from).await;
            let first = (process_cpu_us(pid), thread_switches(pid));
            tokio::time::sleep_until(end).await;
            let last = (process_cpu_us(pid), thread_switches(pid));
            let cpu = first.0.zip(last.0).map(|(a, b)| b - a);
            let switches = first.1.zip(last.1).map(|(a, b)| switches_between(&a, &b));
            (cpu, switches)
        })
    });
    let per_client = (window.max_calls / clients as u64).max(1) as usize;
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let client = match target {
            Workload::Adapter { loaded } => Client::Adapter(loaded.clone()),
            Workload::Http {
                addr,
                path,
                token,
                body,
            } => Client::Http {
                conn: Conn::open(*addr).await?,
                path,
                token: *token,
                body: body.clone(),
            },
        };
        tasks.push(tokio::spawn(client.run(
            begin,
            counted_from,
            end,
            per_client,
        )));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut stopped = counted_from;
    for task in tasks {
        let done = task
            .await
            .map_err(|e| BenchError::Http(format!("a client failed: {e}")))?;
        latencies.extend(done.latencies);
        errors += done.errors;
        stopped = stopped.max(done.stopped);
    }
    let (server_cpu_us, server_switches) = match cpu {
        Some(sampler) => sampler.await.unwrap_or_default(),
        None => (None, None),
    };
    Ok(Measured {
        latencies,
        errors,
        seconds: stopped.duration_since(counted_from).as_secs_f64(),
        server_cpu_us,
        server_switches,
    })
}

/// How long a client that counted no call in its window goes on for one (see
/// `Client::run`). Only a machine stalled for the whole window gets there; the server's
/// CPU is still sampled over the window itself.
const OVERTIME: Duration = Duration::from_secs(30);

enum Client {
    Adapter(Arc<Loaded>),
    Http {
        conn: Conn,
        path: &'static str,
        token: Option<&'static str>,
        body: Bytes,
    },
}

struct ClientDone {
    latencies: Vec<u64>,
    errors: u64,
    /// When this client's counting ended: the window's end, or its last call when
    /// it reached its share of calls first.
    stopped: Instant,
}

impl Client {
    async fn run(
        mut self,
        begin: Instant,
        counted_from: Instant,
        end: Instant,
        most: usize,
    ) -> ClientDone {
        tokio::time::sleep_until(begin).await;
        let mut latencies = Vec::with_capacity(most.min(1 << 20));
        let mut errors = 0;
        let mut last = counted_from;
        let scope = Map::new();
        let arguments = json!({});
        loop {
            let started = Instant::now();
            // A client that has counted nothing yet (the machine stalled through the
            // whole window) goes on until it counts one call, for at most OVERTIME:
            // a row is never empty.
            let counted_none = latencies.is_empty() && errors == 0;
            let overtime = counted_none && started < end + OVERTIME;
            if (started >= end && !overtime) || latencies.len() >= most {
                break;
            }
            let ok = match &mut self {
                Client::Adapter(loaded) => call_builtin(loaded, &arguments, &scope).await,
                Client::Http {
                    conn,
                    path,
                    token,
                    body,
                } => match conn.request(Method::POST, path, *token, body.clone()).await {
                    Ok((status, _)) => status == 200,
                    Err(_) => {
                        // The connection's state is unknown: this client stops.
                        errors += 1;
                        break;
                    }
                },
            };
            let done = Instant::now();
            if started >= counted_from && (done <= end || counted_none) {
                if ok {
                    latencies.push(done.duration_since(started).as_nanos() as u64);
                } else {
                    errors += 1;
                }
                last = done;
            }
        }
        // A client that reached its share of calls stopped early: its window ends
        // with its last call, as does one that went on past the end for its first
        // call; every other client's window is the whole measurement.
        let stopped = if latencies.len() >= most || last > end {
            last
        } else {
            end
        };
        ClientDone {
            latencies,
            errors,
            stopped,
        }
    }
}

/// One direct call of the builtin tool through the adapter API.
async fn call_builtin(loaded: &Loaded, arguments: &Value, scope: &Map<String, Value>) -> bool {
    let name = BenchTool::Builtin.tool_name();
    let (Some(tool), Ok(adapter)) = (loaded.policy.tools.get(name), loaded.adapter(name)) else {
        return false;
    };
    let ctx = ExecContext {
        call_id: "bench",
        run_id: "bench",
        scope,
        deadline: Instant::now() + REQUEST_TIMEOUT,
    };
    adapter.execute(tool, arguments, ctx).await.is_ok()
}

fn ratios(rows: &[Row]) -> Vec<Ratio> {
    let mut out = Vec::new();
    for (i, gateway) in rows.iter().enumerate().filter(|(_, r)| r.path == "gateway") {
        // The direct row measured last before this one (rows are in measured order).
        let direct = rows[..i].iter().rev().find(|r| {
            r.path == "direct" && r.tool == gateway.tool.direct() && r.clients == gateway.clients
        });
        if let (Some(direct), Some(durability)) = (direct, gateway.durability) {
            out.push(Ratio {
                tool: gateway.tool,
                durability,
                clients: gateway.clients,
                throughput_ratio: round(gateway.calls_per_s / direct.calls_per_s.max(1e-9), 4),
                overhead_p50_ms: round(gateway.p50_ms - direct.p50_ms, 4),
            });
        }
    }
    out
}

/// The bare echo's lowest and highest calls/s at each number of clients it was measured
/// at more than once, in client order.
fn echo_drift(rows: &[Row]) -> Vec<EchoDrift> {
    let mut by_clients: std::collections::BTreeMap<usize, Vec<f64>> = Default::default();
    for r in rows
        .iter()
        .filter(|r| r.path == "direct" && r.tool == BenchTool::Echo)
    {
        by_clients.entry(r.clients).or_default().push(r.calls_per_s);
    }
    by_clients
        .into_iter()
        .filter(|(_, all)| all.len() > 1)
        .map(|(clients, all)| {
            let min = all.iter().copied().fold(f64::INFINITY, f64::min);
            let max = all.iter().copied().fold(0.0, f64::max);
            EchoDrift {
                clients,
                measurements: all.len(),
                min_calls_per_s: min,
                max_calls_per_s: max,
                spread: round(max / min.max(1e-9), 2),
            }
        })
        .collect()
}

/// The issues' targets for this machine class (2 cores, load generator alongside):
/// issue 7's on the `builtin` tool, issue 19's on the demo's gated call (`case`) against
/// the bare echo. A target whose rows were not measured is "not measured".
fn targets(rows: &[Row], ratios: &[Ratio], fsync_p50_ms: Option<f64>) -> Vec<TargetCheck> {
    let gateway = |tool: BenchTool, durability: BenchDurability, clients: usize| {
        rows.iter().find(|r| {
            r.path == "gateway"
                && r.tool == tool
                && r.durability == Some(durability)
                && r.clients == clients
        })
    };
    let ratio = |tool: BenchTool, durability: BenchDurability, clients: usize| {
        ratios
            .iter()
            .find(|r| r.tool == tool && r.durability == durability && r.clients == clients)
    };
    let check = |name: &str, goal: &str, measured: Option<f64>, met: fn(f64) -> bool| TargetCheck {
        name: name.into(),
        goal: goal.into(),
        measured,
        met: measured.map(met),
    };
    use BenchDurability::{Full, Normal};
    use BenchTool::{Builtin, Case};
    // FULL, one client: at most two single-commit syncs plus 0.25 ms over the echo.
    let full_one = ratio(Case, Full, 1).map(|r| r.overhead_p50_ms);
    let full_one_goal = fsync_p50_ms.map(|f| 2.0 * f + 0.25);
    let full_one_check = TargetCheck {
        name: "case p50 minus echo p50 ms, FULL, 1 client".into(),
        goal: full_one_goal.map_or("<= 2 fsync + 0.25".into(), |g| format!("<= {g:.3}")),
        measured: full_one,
        met: full_one.zip(full_one_goal).map(|(m, g)| m <= g),
    };
    let mut checks = vec![
        check(
            "builtin calls/s through the gateway, FULL, 64 clients",
            ">= 14000",
            gateway(Builtin, Full, 64).map(|r| r.calls_per_s),
            |v| v >= 14_000.0,
        ),
        check(
            "builtin calls/s through the gateway, NORMAL, 64 clients",
            ">= 20000",
            gateway(Builtin, Normal, 64).map(|r| r.calls_per_s),
            |v| v >= 20_000.0,
        ),
        check(
            "builtin p99 ms through the gateway, FULL, 8 clients",
            "< 2",
            gateway(Builtin, Full, 8).map(|r| r.p99_ms),
            |v| v < 2.0,
        ),
        check(
            "builtin p99 ms through the gateway, NORMAL, 8 clients",
            "< 2",
            gateway(Builtin, Normal, 8).map(|r| r.p99_ms),
            |v| v < 2.0,
        ),
        check(
            "builtin gateway overhead p50 ms, FULL, 1 client",
            "< 0.5",
            ratio(Builtin, Full, 1).map(|r| r.overhead_p50_ms),
            |v| v < 0.5,
        ),
        check(
            "case server CPU us per call, NORMAL, 64 clients",
            "<= 80",
            gateway(Case, Normal, 64).and_then(|r| r.server_cpu_us_per_call),
            |v| v <= 80.0,
        ),
        check(
            "case calls/s over echo, NORMAL, 64 clients",
            ">= 0.20",
            ratio(Case, Normal, 64).map(|r| r.throughput_ratio),
            |v| v >= 0.20,
        ),
        check(
            "case calls/s over echo, FULL, 64 clients",
            ">= 0.15",
            ratio(Case, Full, 64).map(|r| r.throughput_ratio),
            |v| v >= 0.15,
        ),
        check(
            "case p50 minus echo p50 ms, NORMAL, 1 client",
            "<= 0.30",
            ratio(Case, Normal, 1).map(|r| r.overhead_p50_ms),
            |v| v <= 0.30,
        ),
        check(
            "case p99 ms, NORMAL, 8 clients",
            "< 3",
            gateway(Case, Normal, 8).map(|r| r.p99_ms),
            |v| v < 3.0,
        ),
    ];
    checks.insert(checks.len() - 1, full_one_check);
    checks
}

fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    Machine {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
        optimized_build: !cfg!(debug_assertions),
    }
}

fn print_report(report: &Report) {
    let m = &report.machine;
    if let Some(fsync) = report.fsync_p50_ms {
        println!("\none commit-sized sync (16 KiB + fdatasync), p50: {fsync:.3} ms");
    }
    println!(
        "\nmachine: {} x {} (kernel {}){}",
        m.nproc,
        m.cpu_model,
        m.kernel,
        if m.optimized_build {
            ""
        } else {
            ", UNOPTIMIZED BUILD"
        }
    );
    println!(
        "{} s per configuration after {} s warm-up; closed-loop clients on keep-alive connections\n",
        report.seconds, report.warmup
    );
    println!(
        "{:<7} {:<8} {:<10} {:>7} {:>11} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9} {:>8} {:>7}",
        "tool",
        "path",
        "durability",
        "clients",
        "calls/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "errors",
        "batch",
        "commit ms",
        "srv ms",
        "cpu us",
        "cs/call"
    );
    for r in &report.rows {
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
        println!(
            "{:<7} {:<8} {:<10} {:>7} {:>11.0} {:>9.3} {:>9.3} {:>9.3} {:>7} {:>7} {:>9} {:>9} {:>8} {:>7}",
            r.tool.as_str(),
            r.path,
            r.durability.map_or("-", BenchDurability::as_str),
            r.clients,
            r.calls_per_s,
            r.p50_ms,
            r.p95_ms,
            r.p99_ms,
            r.errors,
            opt(r.audit_batch_mean, 1),
            opt(r.audit_commit_mean_ms, 3),
            opt(r.server_overhead_mean_ms, 3),
            opt(r.server_cpu_us_per_call, 1),
            opt(r.server_switches_per_call, 2),
        );
    }
    println!("\ngateway / direct (case and dryrun: / the bare echo)");
    println!(
        "{:<7} {:<10} {:>7} {:>16} {:>18}",
        "tool", "durability", "clients", "throughput ratio", "overhead p50 ms"
    );
    for r in &report.ratios {
        println!(
            "{:<7} {:<10} {:>7} {:>16.4} {:>18.3}",
            r.tool.as_str(),
            r.durability.as_str(),
            r.clients,
            r.throughput_ratio,
            r.overhead_p50_ms
        );
    }
    if !report.echo_drift.is_empty() {
        println!(
            "\nthe bare echo during this run (measured before each gated row; a spread well above 1 is the machine's speed moving)"
        );
        for d in &report.echo_drift {
            println!(
                "  {:>3} clients: {:.0} to {:.0} calls/s over {} measurements, spread x{:.2}",
                d.clients, d.min_calls_per_s, d.max_calls_per_s, d.measurements, d.spread
            );
        }
    }
    println!("\ntargets");
    for t in &report.targets {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not measured",
        };
        let measured = t.measured.map_or("-".to_string(), |v| format!("{v:.3}"));
        println!(
            "  {:<55} goal {:<8} measured {:>12}  {verdict}",
            t.name, t.goal, measured
        );
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn switches_count_each_thread_from_its_first_reading() {
        let first = std::collections::BTreeMap::from([(1, 100), (2, 50), (3, 7)]);
        // Thread 1 switched 10 times, thread 2 not at all, thread 3 ended, thread 4
        // started and switched 5 times.
        let last = std::collections::BTreeMap::from([(1, 110), (2, 50), (4, 5)]);
        assert_eq!(switches_between(&first, &last), 15);
        // This process's own threads, read twice: never negative, and this thread's
        // sleep in between is a switch.
        let pid = std::process::id();
        let a = thread_switches(pid).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = thread_switches(pid).unwrap();
        assert!(switches_between(&a, &b) >= 1);
        assert!(thread_switches(u32::MAX).is_none());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.50), 50);
        assert_eq!(percentile(&v, 0.95), 95);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    /// A row of one measured call, with the given clients, calls/s and p50.
    fn measured_row(
        tool: BenchTool,
        path: &'static str,
        durability: Option<BenchDurability>,
        clients: usize,
        calls_per_s: f64,
        p50_ms: f64,
    ) -> Row {
        Row {
            calls_per_s,
            p50_ms,
            ..Measured {
                latencies: vec![1],
                errors: 0,
                seconds: 1.0,
                server_cpu_us: None,
                server_switches: None,
            }
            .row(tool, path, durability, clients)
        }
    }

    #[test]
    fn each_ratio_is_over_the_echo_measured_last_before_it() {
        let row = |tool, path, durability, calls_per_s, p50_ms| {
            measured_row(tool, path, durability, 8, calls_per_s, p50_ms)
        };
        let normal = Some(BenchDurability::Normal);
        let rows = [
            row(BenchTool::Echo, "direct", None, 1000.0, 0.2),
            row(BenchTool::Case, "gateway", normal, 100.0, 0.5),
            row(BenchTool::Echo, "direct", None, 500.0, 0.1),
            row(BenchTool::Dryrun, "gateway", normal, 250.0, 0.4),
            row(BenchTool::Builtin, "gateway", normal, 10.0, 1.0),
        ];
        let ratios = ratios(&rows);
        // The builtin has no direct row here: no ratio.
        assert_eq!(ratios.len(), 2);
        assert_eq!(
            (ratios[0].tool, ratios[0].throughput_ratio),
            (BenchTool::Case, 0.1)
        );
        assert_eq!(ratios[0].overhead_p50_ms, 0.3);
        assert_eq!(
            (ratios[1].tool, ratios[1].throughput_ratio),
            (BenchTool::Dryrun, 0.5)
        );
        assert_eq!(ratios[1].overhead_p50_ms, 0.3);
    }

    #[test]
    fn the_echo_drift_spans_each_client_count_measured_twice() {
        let row = |tool, path, clients, calls_per_s| {
            measured_row(tool, path, None, clients, calls_per_s, 1.0)
        };
        let rows = [
            row(BenchTool::Echo, "direct", 64, 60_000.0),
            row(BenchTool::Case, "gateway", 64, 9_000.0),
            row(BenchTool::Echo, "direct", 1, 5_000.0),
            row(BenchTool::Echo, "direct", 64, 20_000.0),
            row(BenchTool::Echo, "direct", 64, 40_000.0),
            row(BenchTool::Http, "direct", 8, 1.0),
            row(BenchTool::Http, "direct", 8, 100.0),
        ];
        let drift = echo_drift(&rows);
        // One client was measured once, the HTTP upstream is not the echo: only 64.
        assert_eq!(drift.len(), 1);
        assert_eq!(drift[0].clients, 64);
        assert_eq!(drift[0].measurements, 3);
        assert_eq!(
            (drift[0].min_calls_per_s, drift[0].max_calls_per_s),
            (20_000.0, 60_000.0)
        );
        assert_eq!(drift[0].spread, 3.0);
    }

    #[test]
    fn histogram_means_come_from_deltas() {
        let before = Scrape("x_sum 10\nx_count 2\n".into());
        let after = Scrape("x_sum 40\nx_count 8\n".into());
        assert_eq!(after.mean_since(&before, "x"), Some(5.0));
        assert_eq!(after.mean_since(&after, "x"), None);
    }

    #[test]
    fn the_generated_policy_loads_with_both_tools() {
        let dir = WorkDir::create().unwrap();
        let (policy, tools) = write_policy(&dir.0, "127.0.0.1:9".parse().unwrap()).unwrap();
        let loaded = Loaded::load(&policy, &tools, &dir.0.join("var"))
            .unwrap_or_else(|p| panic!("{}", p[0]));
        assert!(loaded.adapter("builtin").is_ok());
        assert!(loaded.adapter("upstream").is_ok());
    }
}
