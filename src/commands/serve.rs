//! `toolgate serve`: loads the policy, opens the audit log, and serves the API until
//! SIGTERM or Ctrl-C, then drains in-flight calls and closes the audit log.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::audit::{AuditError, AuditLog, AuditOptions, Durability};
use crate::capacity::{AuditCapacity, CapacityOptions};
use crate::commands::Exit;
use crate::commands::serve_args::MAX_CONNECTION_THREADS;
pub use crate::commands::serve_args::{ConnectionThreads, DurabilityArg, LogFormat, ServeArgs};
use crate::gateway::{Gateway, Loaded, PolicySourcePaths, adapter_env};
use crate::limits::LimitOptions;
use crate::observe::trace;
use crate::server::{self, ServerOptions};
use crate::workers::{WorkerThreads, Workers};

/// The fleet key of a fleet member (`--cluster-db`): `--fleet-key-dir`, else
/// TOOLGATE_FLEET_KEY_DIR, checked like `--key-dir`. Required for a sidecar that ships
/// to the audit hub (an own `--audit-origin`): missing is then an invalid
/// configuration (exit 4); unreadable or unsafe is a key problem (exit 3); each printed
/// as one JSON object on stderr. It also signs and checks approval decisions.
fn load_fleet_key(args: &ServeArgs) -> Result<Option<crate::audit::keys::SignerKey>, Exit> {
    if cluster_db_url(args).is_none() {
        return Ok(None);
    }
    let ships = args.audit_origin != crate::audit::DEFAULT_ORIGIN;
    let refuse = |error: &str, message: String| {
        eprintln!("error: {message}");
        eprintln!(
            "{}",
            serde_json::json!({"error": error, "message": message, "retryable": false})
        );
    };
    let dir = args.fleet_key_dir.clone().or_else(|| {
        std::env::var_os("TOOLGATE_FLEET_KEY_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    });
    let Some(dir) = dir else {
        if !ships {
            tracing::warn!(
                "no fleet key (--fleet-key-dir): approval decisions in this fleet are not attested; a row edited in the cluster database is trusted"
            );
            return Ok(None);
        }
        refuse(
            "fleet_key_missing",
            "a sidecar that ships its audit log to the hub (--cluster-db with its own --audit-origin) needs the fleet's signing key: give --fleet-key-dir DIR (or TOOLGATE_FLEET_KEY_DIR), the same key in every sidecar (`toolgate audit fleet-key --key-dir DIR` makes one)".into(),
        );
        return Err(Exit::InvalidConfig);
    };
    let loaded = crate::audit::keys::check_private(&dir)
        .and_then(|()| crate::audit::keys::load_signer(&dir));
    match loaded {
        Ok(key) => Ok(Some(key)),
        Err(e) => {
            refuse(
                "fleet_key_invalid",
                format!("refusing the fleet key directory: {e}"),
            );
            Err(Exit::Signature)
        }
    }
}

/// The hub shipper, with `--witness` the fleet witness tasks' status, and the hub's
/// pool (where the gateway reads the fleet's approval evidence).
type ShipperStarted = (
    crate::hub::ship::HubShipper,
    Option<Vec<Arc<crate::audit::witness::WitnessStatus>>>,
    deadpool_postgres::Pool,
);

/// Starts shipping the audit log to the hub in the cluster database (items of
/// docs/audit.md, "The audit hub"). The default origin is shared by every sidecar
/// that keeps it, so a fleet member without its own `--audit-origin` does not ship
/// (with a warning) rather than collide.
async fn start_shipper(
    url: &str,
    args: &ServeArgs,
    audit: &AuditLog,
    db_path: &std::path::Path,
    fleet_key: Option<crate::audit::keys::SignerKey>,
    origin: &str,
) -> Result<Option<ShipperStarted>, Exit> {
    if origin == crate::audit::DEFAULT_ORIGIN {
        tracing::warn!(
            "the audit log keeps the default origin `toolgate/audit`: it is not shipped to the audit hub; give each sidecar its own --audit-origin"
        );
        eprintln!(
            "warning: not shipping the audit log to the hub: give this sidecar its own --audit-origin (every sidecar's origin must be unique in the fleet)"
        );
        return Ok(None);
    }
    // Loaded before the audit log was opened (`load_fleet_key`).
    let Some(fleet_key) = fleet_key else {
        eprintln!("error: no fleet key to sign fleet checkpoints with");
        return Err(Exit::InvalidConfig);
    };
    let pool = match crate::hub::connect(url).await {
        Ok(pool) => pool,
        Err(e) => {
            eprintln!("{}", e.to_json());
            return Err(Exit::Cluster);
        }
    };
    // A sidecar with another fleet key than the one the fleet log is bound to would
    // have every batch refused: it does not start.
    if let Err(e) = crate::hub::ship::check_fleet_key(&pool, origin, &fleet_key.verifier).await {
        eprintln!("error: {e}");
        eprintln!("{}", e.to_json());
        return Err(match e {
            crate::hub::HubError::FleetKey { .. } => Exit::Signature,
            _ => Exit::Cluster,
        });
    }
    let fingerprint = fleet_key.verifier.fingerprint();
    let fleet_verifier = fleet_key.verifier.clone();
    // From now on every append of a run's events first marks the run as held by this
    // sidecar in the hub, until the hub holds them (`hub::tail`).
    let tail = crate::hub::tail::Tail::new(pool.clone(), origin, audit.head().map_or(0, |h| h.0));
    audit.mark_runs(tail.clone());
    let options = crate::hub::ship::ShipOptions {
        origin: origin.to_string(),
        db_path: db_path.to_path_buf(),
        key: audit.verifier_key().clone(),
        fleet_signer: Arc::new(fleet_key),
        interval: Duration::from_millis(args.hub_ship_interval_ms),
        tail,
    };
    println!("audit hub: shipping origin {origin} (fleet key fingerprint {fingerprint})");
    // In a fleet the witnesses cosign the fleet checkpoint, not this sidecar's own.
    let witnesses = if args.witnesses.is_empty() {
        None
    } else {
        let options = crate::hub::witness::FleetWitnessOptions {
            origin: origin.to_string(),
            fleet_key: fleet_verifier,
            witnesses: args.witnesses.clone(),
            interval: Duration::from_millis(args.witness_interval_ms),
        };
        match crate::hub::witness::start(pool.clone(), options) {
            Ok(statuses) => Some(statuses),
            Err(e) => {
                eprintln!("error: cannot start the witness client: {e}");
                return Err(Exit::InvalidConfig);
            }
        }
    };
    // A sidecar that stopped cleanly closed its log's coverage in the hub; starting
    // again, it reopens it before it serves (the others then wait for its shipping
    // before they trust an approval unused: `hub::coverage`).
    if let Err(e) = crate::hub::coverage::reopen(&pool, origin).await {
        eprintln!("{}", e.to_json());
        return Err(Exit::Cluster);
    }
    Ok(Some((
        crate::hub::ship::start(pool.clone(), audit.clone(), options),
        witnesses,
        pool,
    )))
}

/// The cluster database URL: `--cluster-db`, else `TOOLGATE_CLUSTER_DB` (unset or
/// empty: none).
fn cluster_db_url(args: &ServeArgs) -> Option<String> {
    args.cluster_db
        .clone()
        .or_else(|| std::env::var("TOOLGATE_CLUSTER_DB").ok())
        .filter(|u| !u.trim().is_empty())
}

/// Connects to the cluster database; a failure is printed as one JSON object on
/// stderr and gives the exit code.
async fn join_cluster(url: &str) -> Result<Arc<crate::cluster::ClusterDb>, Exit> {
    match crate::cluster::ClusterDb::connect(url).await {
        Ok(db) => Ok(db),
        Err(e) => {
            eprintln!("error: cannot join the cluster database: {e}");
            eprintln!("{}", e.to_json(url));
            Err(match e {
                crate::cluster::ClusterError::InvalidUrl(_) => Exit::InvalidConfig,
                _ => Exit::Cluster,
            })
        }
    }
}

pub fn serve_command(args: &ServeArgs) -> Exit {
    if args.sandbox_uid == 0 || args.sandbox_gid == 0 {
        eprintln!(
            "error: --sandbox-uid and --sandbox-gid name the unprivileged user tools run as; 0 is root"
        );
        return Exit::InvalidConfig;
    }
    // Before the policy loads: the adapters' sandbox plans read these.
    crate::sandbox::host::configure(crate::sandbox::HostConfig {
        run_as: (args.sandbox_uid, args.sandbox_gid),
        scratch_root: args
            .sandbox_scratch_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir),
        key_dir: Some(
            args.key_dir
                .clone()
                .unwrap_or_else(|| args.data_dir.join("keys")),
        ),
    });
    // A tool running as toolgate's own user cannot read its memory or environment
    // through /proc, nor trace it.
    crate::sandbox::host::make_undumpable();
    let host = crate::sandbox::host::probe_once();
    if !host.default_profile_enforceable() {
        eprintln!(
            "warning: this host cannot enforce the default sandbox profile; calls of confined tools will be refused (sandbox_unavailable); run `toolgate doctor`"
        );
    }
    let runtime = match crate::commands::runtime(&mut tokio::runtime::Builder::new_multi_thread()) {
        Ok(rt) => rt,
        Err(exit) => return exit,
    };
    let endpoint = args
        .otlp_endpoint
        .clone()
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok());
    let format = match args.log_format {
        LogFormat::Json => trace::LogFormat::Json,
        LogFormat::Text => trace::LogFormat::Text,
    };
    let telemetry = match trace::init(format, endpoint.as_deref(), runtime.handle()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return Exit::InvalidConfig;
        }
    };
    if let Some(url) = &telemetry.traces_url {
        println!("traces: exporting over otlp to {url}");
    }
    let threads = match args.connection_threads {
        ConnectionThreads::Auto => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_CONNECTION_THREADS),
        ConnectionThreads::Count(n) => n,
        ConnectionThreads::Shared => 0,
    };
    let threads = match WorkerThreads::start(threads) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: cannot start the connection threads: {e}");
            return Exit::Failure;
        }
    };
    let exit = runtime.block_on(run(args, threads.workers()));
    // Calls still running past the drain time were cancelled and closed (server/mod.rs);
    // what is left ends with its threads.
    threads.stop();
    // The runtime still runs: the last batch of spans is sent before it stops.
    telemetry.shutdown();
    exit
}

async fn run(args: &ServeArgs, workers: Workers) -> Exit {
    let (loaded, shadow) = match load_policies(args) {
        Ok(policies) => policies,
        Err(exit) => return exit,
    };
    if let Err(e) = crate::localfile::create_dir_all(&args.data_dir) {
        eprintln!(
            "error: cannot create data directory `{}`: {e}",
            args.data_dir.display()
        );
        return Exit::Failure;
    }
    let (options, fleet_key) = match audit_options(args) {
        Ok(prepared) => prepared,
        Err(exit) => return exit,
    };
    let options_db_path = options.db_path.clone();
    let audit_origin = options.origin.clone();
    let audit = match open_audit(options) {
        Ok(audit) => audit,
        Err(exit) => return exit,
    };
    // The cluster database is joined before the gateway starts: a sidecar that cannot
    // reach the fleet's state serves nothing.
    let cluster = match cluster_db_url(args) {
        None => None,
        Some(url) => match join_cluster(&url).await {
            Ok(db) => Some((db, crate::cluster::redact(&url))),
            Err(exit) => {
                let _ = audit.close().await;
                return exit;
            }
        },
    };
    let fingerprint = audit.verifier_key().fingerprint();
    let started = Started {
        audit: &audit,
        db_path: &options_db_path,
        origin: &audit_origin,
        cluster: cluster.as_ref().map(|(db, _)| db),
        fleet_key,
    };
    let (gateway, hub_shipper) = match start_gateway(args, loaded, shadow, started).await {
        Ok(started) => started,
        Err(exit) => return exit,
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", args.listen);
            return Exit::Failure;
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    // The handlers are installed before the server says it is listening: a SIGTERM or
    // SIGHUP sent right away then drains or reloads instead of killing the process (the
    // default action of both).
    let signals = Signals::install();
    println!("toolgate listening on http://{addr}");
    print_versions("policy", &gateway.current().policy.versions);
    println!("data dir: {}", args.data_dir.display());
    println!("audit key fingerprint: {fingerprint}");
    if let Some((db, url)) = &cluster {
        println!("cluster db: {url} (node {})", db.node_id);
    }
    tokio::spawn(reload_on_sighup(gateway.clone(), signals.hup));
    // The shippers read the committed log on their own tasks; a call never waits on one.
    let shipper = match crate::audit::ship::start(&args.ships, &audit, &args.data_dir, |name| {
        gateway.metrics.ship_sink(name)
    }) {
        Ok(shipper) => shipper,
        Err(e) => {
            eprintln!("error: {e}");
            return Exit::Failure;
        }
    };
    for spec in &args.ships {
        println!("shipping audit events to {}", spec.name);
    }
    let server_options = ServerOptions {
        max_body_bytes: args.max_body_bytes,
        limits: LimitOptions {
            max_connections: args.max_connections.max(1),
            max_connections_per_client: args.max_connections_per_client.max(1),
            max_requests_per_second_per_client: args.max_requests_per_second_per_client,
        },
        workers,
        ..ServerOptions::default()
    };
    raise_open_files_limit();
    if let Some(shadow) = gateway.shadow() {
        print_versions("shadow policy", shadow.versions());
    }
    let stop_requested = Arc::new(std::sync::OnceLock::new());
    server::serve(
        listener,
        gateway.clone(),
        server_options,
        shutdown_signal(signals.term, signals.int, stop_requested.clone()),
    )
    .await;
    // Every divergence seen so far is recorded before the log closes.
    gateway.flush_shadow().await;
    // What the sinks have not confirmed is sent after the next start (their cursors).
    shipper.stop(Duration::from_secs(2)).await;
    let exit = match audit.close().await {
        Ok(()) => Exit::Ok,
        Err(e) => {
            eprintln!("error: closing the audit log: {e}");
            Exit::Failure
        }
    };
    // The log is closed and its last checkpoint signed: what the hub does not hold
    // yet is shipped within the drain time (counted from the stop request).
    if let Some(hub_shipper) = hub_shipper {
        let requested = stop_requested
            .get()
            .copied()
            .unwrap_or_else(tokio::time::Instant::now);
        let deadline =
            (requested + gateway.drain_time()).max(tokio::time::Instant::now() + FINAL_SHIP_FLOOR);
        finish_hub_shipping(hub_shipper, deadline, &audit_origin).await;
    }
    println!("toolgate stopped");
    exit
}

/// The enforced policy and the shadow candidate (`--shadow-policy-dir`), each printed
/// with its problems when it does not load (exit 2).
fn load_policies(args: &ServeArgs) -> Result<(Loaded, Option<Loaded>), Exit> {
    let loaded = match Loaded::load(
        &args.location.policy_dir,
        &args.location.tools,
        &args.data_dir,
    ) {
        Ok(loaded) => loaded,
        Err(problems) => {
            eprintln!("error: the policy did not load; nothing is served");
            for problem in &problems {
                eprintln!("{problem}");
            }
            return Err(Exit::InvalidConfig);
        }
    };
    let Some(dir) = &args.shadow_policy_dir else {
        return Ok((loaded, None));
    };
    let tools = args.shadow_tools.as_ref().unwrap_or(&args.location.tools);
    match Loaded::load(dir, tools, &args.data_dir) {
        Ok(candidate) => Ok((loaded, Some(candidate))),
        Err(problems) => {
            eprintln!("error: the shadow policy did not load; nothing is served");
            for problem in &problems {
                eprintln!("{problem}");
            }
            Err(Exit::InvalidConfig)
        }
    }
}

/// The audit log's options from the flags, after the key directory is checked and the
/// data and key directories are made owner-only; with the fleet key, loaded in
/// between (it may live in those directories).
fn audit_options(
    args: &ServeArgs,
) -> Result<(AuditOptions, Option<crate::audit::keys::SignerKey>), Exit> {
    let mut options = AuditOptions::new(&args.data_dir);
    options.durability = match args.durability {
        DurabilityArg::Full => Durability::Full,
        DurabilityArg::Normal => Durability::Normal,
    };
    if let Some(dir) = &args.key_dir {
        options.key_dir = dir.clone();
    }
    options.checkpoint_every_events = args.checkpoint_every_events;
    options.origin = args.audit_origin.clone();
    options.checkpoint_interval = Duration::from_millis(args.checkpoint_interval_ms);
    options
        .checkpoint_sinks
        .extend(args.checkpoint_sinks.iter().cloned());
    options.checkpoint_sink_ca = args.checkpoint_sink_ca.clone();
    options.webhooks = Some(std::sync::Arc::new(crate::audit::webhook::Webhooks));
    if options.key_dir.exists()
        && let Err(e) = crate::audit::keys::check_private(&options.key_dir)
    {
        eprintln!("error: refusing the key directory: {e}");
        return Err(Exit::Signature);
    }
    // What an older version, a copy or a `chmod` left readable by others is made
    // owner-only before anything is opened, each entry named.
    let found = crate::commands::owner_only(&[&args.data_dir, &options.key_dir]);
    for (path, mode) in &found.tightened {
        tracing::warn!(
            path = %path.display(), mode = format!("{mode:o}"),
            "a file in the data or key directory was open to group or others; made owner-only"
        );
    }
    for (path, error) in &found.failed {
        tracing::warn!(
            path = %path.display(), %error,
            "a file in the data or key directory could not be checked or made owner-only"
        );
    }
    let fleet_key = load_fleet_key(args)?;
    if let Some(socket) = &args.signer_socket {
        match crate::audit::signer::SocketSigner::connect(socket) {
            Ok(signer) => options.signer = Some(Arc::new(signer)),
            Err(e) => {
                eprintln!("error: {e}");
                return Err(Exit::Signature);
            }
        }
    }
    if let Some(max) = args.max_audit_bytes {
        if max < crate::capacity::MIN_MAX_AUDIT_BYTES {
            eprintln!(
                "error: --max-audit-bytes {max} is under the least accepted, {} (the WAL's allowance of {} bytes, twice the {}-byte reserve, and 8 MiB for the database)",
                crate::capacity::MIN_MAX_AUDIT_BYTES,
                crate::capacity::WAL_ALLOWANCE,
                crate::capacity::RESERVE_BYTES,
            );
            return Err(Exit::InvalidConfig);
        }
        // The hard stop beneath the refusal: SQLite itself refuses to grow the
        // database past what leaves room for the WAL.
        options.max_db_bytes = Some(max - crate::capacity::WAL_ALLOWANCE);
    }
    options.segment_max_bytes = args.audit_segment_bytes;
    options.segment_max_age = args.audit_segment_max_age_s.map(Duration::from_secs);
    Ok((options, fleet_key))
}

/// Opens the audit log; a log that diverged from its checkpoint exits 6, a key or
/// signer problem 3.
fn open_audit(options: AuditOptions) -> Result<AuditLog, Exit> {
    AuditLog::open(options).map_err(|e| {
        eprintln!("error: cannot open the audit log: {e}");
        if let Some(help) = e.help() {
            eprintln!("help: {help}");
        }
        match e {
            AuditError::Diverged { .. } => Exit::Truncated,
            AuditError::Key { .. } | AuditError::Signer { .. } => Exit::Signature,
            _ => Exit::Failure,
        }
    })
}

/// What the gateway starts with besides its policy: the open log, where it lives,
/// the fleet's database and key.
struct Started<'a> {
    audit: &'a AuditLog,
    db_path: &'a std::path::Path,
    origin: &'a str,
    cluster: Option<&'a Arc<crate::cluster::ClusterDb>>,
    fleet_key: Option<crate::audit::keys::SignerKey>,
}

/// Starts the gateway with its capacity watch, fleet state, shadow policy, hub
/// shipper and witnesses, and its background sweepers.
async fn start_gateway(
    args: &ServeArgs,
    loaded: Loaded,
    shadow: Option<Loaded>,
    started: Started<'_>,
) -> Result<(Arc<Gateway>, Option<crate::hub::ship::HubShipper>), Exit> {
    let Started {
        audit,
        db_path,
        origin,
        cluster,
        fleet_key,
    } = started;
    let env = adapter_env(&args.location.tools, &args.data_dir);
    let source = PolicySourcePaths {
        policy_dir: args.location.policy_dir.clone(),
        tools_file: args.location.tools.clone(),
    };
    let capacity = AuditCapacity::new(
        db_path,
        CapacityOptions {
            max_audit_bytes: args.max_audit_bytes,
            min_free_disk_bytes: args.min_free_disk_bytes,
        },
    );
    tokio::spawn(capacity.clone().run());
    let gateway = match Gateway::start(loaded, audit.clone(), env, source).await {
        Ok(g) => g
            .with_capacity(capacity)
            .with_artifact_limit(args.max_artifact_bytes)
            .with_public_url(args.public_url.clone()),
        Err(e) => {
            eprintln!("error: cannot start the gateway: {e}");
            return Err(Exit::Failure);
        }
    };
    let gateway = match cluster {
        Some(db) => gateway.with_cluster(db.clone()),
        None => gateway,
    };
    let gateway = match (cluster, &fleet_key) {
        (Some(_), Some(key)) => gateway.with_fleet_key(Arc::new(key.clone())),
        _ => gateway,
    };
    let mut gateway = match shadow {
        Some(candidate) => gateway.with_shadow(crate::shadow::start(candidate, audit.clone())),
        None => gateway,
    };
    let mut fleet_witnessed = false;
    let mut hub_shipper = None;
    if let Some(url) = cluster_db_url(args) {
        let started = start_shipper(&url, args, audit, db_path, fleet_key, origin).await?;
        if let Some((shipper, witnesses, pool)) = started {
            gateway.metrics.watch_shipper(shipper.status());
            hub_shipper = Some(shipper);
            // Approvals in this fleet are checked against the hub's evidence of the
            // other sidecars' decisions and uses.
            gateway = gateway.with_hub(pool, origin.to_string());
            if let Some(witnesses) = witnesses {
                gateway.metrics.watch_witnesses(witnesses);
                fleet_witnessed = true;
            }
        }
    }
    if !args.witnesses.is_empty() && !fleet_witnessed {
        let options = crate::audit::witness::WitnessOptions {
            cosignature_file: crate::audit::witness::default_cosignature_file(db_path),
            db_path: db_path.to_path_buf(),
            log_key: audit.verifier_key().clone(),
            witnesses: args.witnesses.clone(),
            interval: Duration::from_millis(args.witness_interval_ms),
        };
        match crate::audit::witness::start(options) {
            Ok(statuses) => gateway.metrics.watch_witnesses(statuses),
            Err(e) => {
                eprintln!("error: cannot start the witness client: {e}");
                return Err(Exit::InvalidConfig);
            }
        }
    }
    let gateway = Arc::new(gateway);
    gateway.spawn_approval_sweeper();
    // Two-phase tools: roll back what expired while the gateway was down, then at
    // each deadline.
    gateway.spawn_phase_reaper();
    Ok((gateway, hub_shipper))
}

/// Prints a policy's versions and short digests on one line.
fn print_versions(label: &str, v: &crate::policy::PolicyVersions) {
    println!(
        "{label}: roles {} ({}), lanes {} ({}), registry {} ({})",
        v.roles.version,
        short(&v.roles.sha256),
        v.lanes.version,
        short(&v.lanes.sha256),
        v.registry.version,
        short(&v.registry.sha256),
    );
}

/// Ships what the hub does not hold yet, until `deadline`, and logs how it ended.
async fn finish_hub_shipping(
    hub_shipper: crate::hub::ship::HubShipper,
    deadline: tokio::time::Instant,
    origin: &str,
) {
    let finished = hub_shipper.finish(deadline).await;
    match &finished.error {
        None => tracing::info!(
            origin = %origin, shipped = finished.shipped,
            "the audit hub holds this sidecar's log up to its last event"
        ),
        Some(error) => tracing::error!(
            origin = %origin,
            reason = error.reason(),
            error = %error,
            first_seq = finished.shipped + 1,
            last_seq = finished.local,
            "the audit hub did not take this sidecar's last events before it stopped; they stay in the local log and ship when this sidecar starts again with this data directory, and until then a fleet export of their runs is not complete"
        ),
    }
}

/// The least time a stopping sidecar gives its last shipment to the audit hub, even
/// when the drain time was used up by the calls in flight.
const FINAL_SHIP_FLOOR: Duration = Duration::from_secs(2);

/// Raises the soft limit of open files to the hard limit: every connection, admitted
/// or overflow, is a descriptor, and running out of them would stop the accept loop.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    let raised = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0
            && (limit.rlim_cur >= limit.rlim_max || {
                limit.rlim_cur = limit.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
            })
    };
    if !raised {
        tracing::warn!("cannot raise the open-files limit; connection floods may exhaust it");
    }
}

fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

/// Reloads the policy on every SIGHUP; a failed reload keeps the current policy.
/// The signals `serve` answers, each handler installed when this is made.
struct Signals {
    term: Option<Signal>,
    int: Option<Signal>,
    hup: Option<Signal>,
}

impl Signals {
    fn install() -> Signals {
        Signals {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
        }
    }
}

async fn reload_on_sighup(gateway: Arc<Gateway>, hup: Option<Signal>) {
    let Some(mut hup) = hup else {
        tracing::warn!("cannot listen for SIGHUP; reload with POST /v1/policy/reload");
        return;
    };
    while hup.recv().await.is_some() {
        match gateway.reload("sighup").await {
            Ok(v) => tracing::info!(
                roles = %v.roles.version, lanes = %v.lanes.version, registry = %v.registry.version,
                "policy reloaded"
            ),
            Err(refusal) => tracing::error!(
                reason = refusal.reason.as_str(), message = %refusal.message,
                problems = %refusal.details["problems"], "policy reload failed; the current policy stays"
            ),
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT), noting when in `requested`; a signal whose
/// handler could not be installed is not waited for.
async fn shutdown_signal(
    term: Option<Signal>,
    int: Option<Signal>,
    requested: Arc<std::sync::OnceLock<tokio::time::Instant>>,
) {
    async fn received(signal: Option<Signal>) {
        match signal {
            Some(mut s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
    tokio::select! {
        () = received(term) => {},
        () = received(int) => {},
    }
    let _ = requested.set(tokio::time::Instant::now());
    tracing::info!("shutdown requested; draining in-flight calls");
}
