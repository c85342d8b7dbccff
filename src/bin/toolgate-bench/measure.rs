//! One measurement: closed-loop clients against a workload, counted over a window.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use toolgate::adapter::ExecContext;
use toolgate::gateway::Loaded;

use super::report::{BenchTool, Measured};
use super::server::Conn;
use super::stats::{process_cpu_us, switches_between, thread_switches};
use crate::{BenchError, CONNECT_ALLOWANCE, REQUEST_TIMEOUT};

/// What one measurement does per call.
#[derive(Clone)]
pub(crate) enum Workload {
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
pub(crate) struct Window {
    pub(crate) seconds: f64,
    pub(crate) warmup: f64,
    pub(crate) max_calls: u64,
}

/// Runs `clients` closed-loop clients against `target`: connect, wait for the start,
/// warm up, then count the calls that complete within the window.
///
/// With `server`, the CPU time of that process is read at the window's start and end.
pub(crate) async fn measure(
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
pub(crate) const OVERTIME: Duration = Duration::from_secs(30);

pub(crate) enum Client {
    Adapter(Arc<Loaded>),
    Http {
        conn: Conn,
        path: &'static str,
        token: Option<&'static str>,
        body: Bytes,
    },
}

pub(crate) struct ClientDone {
    pub(crate) latencies: Vec<u64>,
    pub(crate) errors: u64,
    /// When this client's counting ended: the window's end, or its last call when
    /// it reached its share of calls first.
    pub(crate) stopped: Instant,
}

impl Client {
    pub(crate) async fn run(
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
pub(crate) async fn call_builtin(
    loaded: &Loaded,
    arguments: &Value,
    scope: &Map<String, Value>,
) -> bool {
    let name = BenchTool::Builtin.tool_name();
    let (Some(tool), Ok(adapter)) = (loaded.policy.tools.get(name), loaded.adapter(name)) else {
        return false;
    };
    let ctx = ExecContext {
        call_id: "bench",
        run_id: "bench",
        scope,
        deadline: Instant::now() + REQUEST_TIMEOUT,
        sandbox: None,
        subject_token: None,
        idempotency_key: None,
        delegation: None,
    };
    adapter.execute(tool, arguments, ctx).await.is_ok()
}
