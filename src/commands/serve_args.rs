//! The flags of `toolgate serve` and their parsers.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::audit::CheckpointSink;
use crate::commands::PolicyLocation;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub location: PolicyLocation,
    /// Directory for the audit database, keys, artifacts and tool writes.
    #[arg(long, default_value = "var")]
    pub data_dir: PathBuf,
    /// When toolgate runs as root, sandboxed tools run as this uid (never 0).
    #[arg(long, default_value_t = crate::sandbox::host::DEFAULT_RUN_AS.0)]
    pub sandbox_uid: u32,
    /// When toolgate runs as root, sandboxed tools run with this gid (never 0).
    #[arg(long, default_value_t = crate::sandbox::host::DEFAULT_RUN_AS.1)]
    pub sandbox_gid: u32,
    /// Where each call's scratch directory of a sandboxed tool is made (below
    /// `toolgate-scratch/`; default: the system's temporary directory).
    #[arg(long)]
    pub sandbox_scratch_dir: Option<PathBuf>,
    /// Audit durability: full (every acknowledged event survives power loss) or normal.
    #[arg(long, value_enum, default_value = "full")]
    pub durability: DurabilityArg,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Connections served at once, all clients together; more are answered only on
    /// /healthz and /readyz (429 otherwise).
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Threads that serve connections, each with its own single-threaded runtime:
    /// `auto` (one per core), a number from 1 to 1024, or `shared` (no connection
    /// threads: connections share the main runtime's work-stealing pool with the
    /// background work, as before issue 19's eighth pass).
    #[arg(long, default_value = "auto", value_parser = parse_connection_threads)]
    pub connection_threads: ConnectionThreads,
    /// Connections served at once from one client address; more are answered only on
    /// /healthz and /readyz (429 otherwise).
    #[arg(long, default_value_t = 256)]
    pub max_connections_per_client: usize,
    /// Requests per second from one client address, bursts of twice as many (0: no
    /// limit); more get a 429 with Retry-After. /healthz, /readyz and /metrics are
    /// not counted.
    #[arg(long, default_value_t = 0)]
    pub max_requests_per_second_per_client: u32,
    /// The most bytes the audit database and its WAL may take (every segment still in
    /// the data directory, with `--audit-segment-bytes`; the WAL counted at its 48 MiB
    /// bound; at least 64 MiB); new calls are refused (`audit_capacity_exhausted`)
    /// once less than 4 MiB of it is left.
    #[arg(long)]
    pub max_audit_bytes: Option<u64>,
    /// The least free space to leave on the disk holding the audit database; new calls
    /// are refused (`audit_capacity_exhausted`) 4 MiB before it is reached.
    #[arg(long)]
    pub min_free_disk_bytes: Option<u64>,
    /// The most bytes the artifacts (outputs larger than a tool's `max_output_bytes`,
    /// kept whole in `<data_dir>/artifacts`) may take together; a call whose output
    /// would pass it fails with `artifact_store_failed` and its output withheld.
    /// Default 1 GiB.
    #[arg(long, default_value_t = crate::artifacts::DEFAULT_MAX_ARTIFACT_BYTES)]
    pub max_artifact_bytes: u64,
    /// Seal the active audit segment once its database passes this many bytes
    /// (checked at each commit; at least 65536) and continue in a new segment file
    /// (`audit-000002.db`, ...); one chain and one Merkle tree span the segments
    /// (docs/audit.md). Default: no rotation by size.
    #[arg(long, value_parser = clap::value_parser!(u64).range(65_536..))]
    pub audit_segment_bytes: Option<u64>,
    /// Seal the active audit segment once it has been open this many seconds and holds
    /// an event. Default: no rotation by age.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub audit_segment_max_age_s: Option<u64>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Export traces over OTLP/HTTP (protobuf) to this collector, e.g.
    /// `http://127.0.0.1:4318` (`/v1/traces` is appended). Default: the
    /// OTEL_EXPORTER_OTLP_ENDPOINT environment variable; unset, no traces are exported.
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// Shadow mode: a candidate policy directory that decides every call beside the
    /// active policy; divergences are audited (`shadow_divergence`), never enforced.
    #[arg(long)]
    pub shadow_policy_dir: Option<PathBuf>,
    /// The candidate's tool registry (default: the active `--tools`).
    #[arg(long, requires = "shadow_policy_dir")]
    pub shadow_tools: Option<PathBuf>,
    /// The audit key directory (default `<data-dir>/keys`). Keep it outside the data
    /// directory, owned by another user; serve refuses one that group or others can
    /// write.
    #[arg(long)]
    pub key_dir: Option<PathBuf>,
    /// Sign checkpoints with a separate `toolgate signer` process listening on this
    /// Unix socket instead of the key file; the key directory then holds only the HMAC
    /// key and the public key.
    #[arg(long)]
    pub signer_socket: Option<PathBuf>,
    /// Also publish checkpoints here (repeatable): `file:PATH`, `http(s)://HOST/PATH`
    /// or `syslog://SOCKET`. Webhook and syslog sinks get the newest signed note (the
    /// signed head at least every second under traffic, latest wins). serve refuses to
    /// start on a log that does not extend the newest checkpoint of a file sink (exit 2).
    #[arg(long = "checkpoint-sink", value_parser = parse_sink)]
    pub checkpoint_sinks: Vec<CheckpointSink>,
    /// A PEM file of CA certificates that https checkpoint sinks must chain to (instead
    /// of the system's roots), for a sink with a private CA.
    #[arg(long)]
    pub checkpoint_sink_ca: Option<PathBuf>,
    /// Publish a checkpoint to the sinks once this many events arrived since the last
    /// (every commit is signed locally regardless).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every_events: u64,
    /// ... or this many milliseconds after the last, if events arrived since.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..))]
    pub checkpoint_interval_ms: u64,
    /// The base URL clients reach this server at, e.g. `https://toolgate.example`: the
    /// MCP resource URI (`<url>/mcp`) published in the OAuth protected-resource
    /// metadata and accepted as a JWT audience (RFC 8707).
    #[arg(long, value_parser = parse_public_url)]
    pub public_url: Option<String>,
    /// Submit the audit checkpoints to this C2SP tlog-witness (repeatable): `URL+VKEY`,
    /// the witness's submission prefix (`/add-checkpoint` is appended; no `+` in it)
    /// and its cosignature verifier key (`name+keyid+base64`, type 0x04). Cosigned
    /// checkpoints are appended to `cosigned-checkpoints.log` in the data directory;
    /// `audit verify --witness-key ... --quorum N` checks them. A witness that is down
    /// never delays a call (see docs/audit.md).
    #[arg(long = "witness", value_parser = parse_witness)]
    pub witnesses: Vec<crate::audit::witness::WitnessConfig>,
    /// The audit log's origin (its checkpoints' first line and a new signing key's
    /// name). In a fleet (`--cluster-db`) every sidecar needs its own, e.g.
    /// `toolgate.example/pod-7/audit`: the hub binds each origin to one key.
    #[arg(long, default_value = crate::audit::DEFAULT_ORIGIN)]
    pub audit_origin: String,
    /// With `--cluster-db`: how often the audit shipper looks for new committed lines
    /// to ship to the hub, in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..))]
    pub hub_ship_interval_ms: u64,
    /// How often each witness is offered the newest checkpoint, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(50..))]
    pub witness_interval_ms: u64,
    /// Join a fleet: keep runs, run tokens, the safety lock and idempotency claims in
    /// this PostgreSQL database (`postgres://USER:PASSWORD@HOST:PORT/DB`), shared by
    /// every sidecar given the same URL (docs/deployment.md). Default: the
    /// TOOLGATE_CLUSTER_DB environment variable; unset, state stays in this process.
    #[arg(long, value_name = "URL")]
    pub cluster_db: Option<String>,
    /// Stream every committed audit event to a SIEM sink (repeatable), at least once,
    /// in order, resuming after a restart: `file:PATH`, `syslog+udp://HOST:PORT`,
    /// `syslog+tcp://HOST:PORT`, `syslog+tls://HOST:PORT`, `hec+http(s)://HOST:PORT[/PATH]`
    /// (Splunk HEC) or `otlp+http(s)://HOST:PORT[/PATH]` (OTLP logs), with options after
    /// `?`: `format=ocsf|native`, file `max_bytes=N&keep=N`, tls `ca=FILE`, hec
    /// `token_file=FILE` or `token_env=NAME` (never the token itself). See docs/audit.md.
    #[arg(long = "ship", value_parser = parse_ship)]
    pub ships: Vec<crate::audit::ship::ShipSpec>,
    /// With `--cluster-db` and an own `--audit-origin` (a sidecar that ships to the
    /// audit hub; required then): the fleet key directory, holding the fleet's signing
    /// key (`audit-signing.key`, made once with `toolgate audit fleet-key`), the same
    /// in every sidecar of the fleet (one Kubernetes secret mounted in every pod).
    /// Every fleet checkpoint is signed with it and the hub binds the fleet log to it.
    /// Same file format and permission checks as `--key-dir`. Default: the
    /// TOOLGATE_FLEET_KEY_DIR environment variable.
    #[arg(long, value_name = "DIR")]
    pub fleet_key_dir: Option<PathBuf>,
}

fn parse_witness(text: &str) -> Result<crate::audit::witness::WitnessConfig, String> {
    crate::audit::witness::WitnessConfig::parse(text)
}

fn parse_ship(text: &str) -> Result<crate::audit::ship::ShipSpec, String> {
    crate::audit::ship::ShipSpec::parse(text)
}

/// Where connections are served (`--connection-threads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionThreads {
    /// One connection thread per core the process may use.
    Auto,
    /// This many connection threads.
    Count(usize),
    /// No connection threads: the main runtime serves connections.
    Shared,
}

/// The most connection threads `--connection-threads` accepts.
pub(super) const MAX_CONNECTION_THREADS: usize = 1024;

fn parse_connection_threads(text: &str) -> Result<ConnectionThreads, String> {
    match text {
        "auto" => Ok(ConnectionThreads::Auto),
        "shared" => Ok(ConnectionThreads::Shared),
        _ => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_CONNECTION_THREADS).contains(&n) => Ok(ConnectionThreads::Count(n)),
            _ => Err(format!(
                "use `auto`, `shared` or a number of threads from 1 to {MAX_CONNECTION_THREADS}"
            )),
        },
    }
}

fn parse_public_url(text: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("use an http or https URL with a host".into());
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err("use a base URL without query, fragment or user".into());
    }
    Ok(text.trim_end_matches('/').to_string())
}

fn parse_sink(text: &str) -> Result<CheckpointSink, String> {
    CheckpointSink::parse(text)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    Full,
    Normal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

#[cfg(test)]
mod tests {
    use super::{ConnectionThreads, parse_connection_threads};

    #[test]
    fn connection_threads_take_auto_shared_or_a_bounded_count() {
        let cases: [(&str, Option<ConnectionThreads>); 8] = [
            ("auto", Some(ConnectionThreads::Auto)),
            ("shared", Some(ConnectionThreads::Shared)),
            ("1", Some(ConnectionThreads::Count(1))),
            ("1024", Some(ConnectionThreads::Count(1024))),
            ("0", None),
            ("1025", None),
            ("-1", None),
            ("two", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_connection_threads(text).ok(), expected, "{text}");
        }
    }
}
