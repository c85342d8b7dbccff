//! The report: the tools and durabilities measured, one row per measurement, the
//! ratios of gateway to direct, the echo's drift, the issues' targets, and the table
//! printed. Pure: no I/O but `machine` (reads /proc) and printing.

use clap::ValueEnum;
use serde::Serialize;

use super::stats::{percentile, round};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BenchDurability {
    Full,
    Normal,
}

impl BenchDurability {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BenchDurability::Full => "full",
            BenchDurability::Normal => "normal",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BenchTool {
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
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BenchTool::Builtin => "builtin",
            BenchTool::Http => "http",
            BenchTool::Case => "case",
            BenchTool::Dryrun => "dryrun",
            BenchTool::Echo => "echo",
        }
    }

    /// The tool's name in the benchmark registry (or the demo's).
    pub(crate) fn tool_name(self) -> &'static str {
        match self {
            BenchTool::Builtin => "builtin",
            BenchTool::Http => "upstream",
            BenchTool::Case | BenchTool::Dryrun => "case_lookup",
            BenchTool::Echo => "echo",
        }
    }

    /// Whether the tool is called on the demo policy's server.
    pub(crate) fn on_demo(self) -> bool {
        matches!(self, BenchTool::Case | BenchTool::Dryrun)
    }

    /// The direct call a gateway row of this tool is compared with.
    pub(crate) fn direct(self) -> BenchTool {
        if self.on_demo() {
            BenchTool::Echo
        } else {
            self
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
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
pub(crate) struct Ratio {
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
pub(crate) struct EchoDrift {
    pub clients: usize,
    pub measurements: usize,
    pub min_calls_per_s: f64,
    pub max_calls_per_s: f64,
    /// `max_calls_per_s / min_calls_per_s`: 1.0 on a steady machine.
    pub spread: f64,
}

/// One of the targets, checked against this run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TargetCheck {
    pub name: String,
    pub goal: String,
    pub measured: Option<f64>,
    pub met: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub optimized_build: bool,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
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

/// The latencies (ns) of the calls completed in the window, and the errors.
pub(crate) struct Measured {
    pub(crate) latencies: Vec<u64>,
    pub(crate) errors: u64,
    pub(crate) seconds: f64,
    /// The server's CPU time over the counted window, in microseconds.
    pub(crate) server_cpu_us: Option<f64>,
    /// The server's context switches over the counted window.
    pub(crate) server_switches: Option<u64>,
}

impl Measured {
    pub(crate) fn row(
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

pub(crate) fn ratios(rows: &[Row]) -> Vec<Ratio> {
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
pub(crate) fn echo_drift(rows: &[Row]) -> Vec<EchoDrift> {
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
pub(crate) fn targets(
    rows: &[Row],
    ratios: &[Ratio],
    fsync_p50_ms: Option<f64>,
) -> Vec<TargetCheck> {
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

pub(crate) fn machine() -> Machine {
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

pub(crate) fn print_report(report: &Report) {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

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
}
