//! The audit hub: every sidecar's audit log, shipped into PostgreSQL (`--cluster-db`)
//! line by line with its signed checkpoints, verified on ingest, and tied together by
//! a fleet log whose leaves are the sidecars' checkpoints.
//!
//! # Layout
//! - `mod.rs`: the hub's tables, [`HubError`], and [`ingest`]: one batch (lines and
//!   the signed checkpoint over their end) checked and stored in one transaction.
//! - [`ship`]: the shipper task of a sidecar: reads committed lines and checkpoints
//!   from its local log and ingests them, in order, resuming where the hub stands; at a
//!   graceful stop it ships what is left.
//! - [`tail`]: which runs a sidecar holds events of that the hub does not have yet
//!   (`hub_unshipped`), marked before they are appended, so a fleet export knows.
//! - [`fleet`]: `audit verify --cluster-db` and `audit export --cluster-db --run`.
//! - [`coverage`]: up to when the hub holds each sidecar's log (recorded by the
//!   shippers), and the lines that name an approval: a sidecar's evidence of the other
//!   sidecars' decisions and uses of an approval.
//! - [`witness`]: `serve --witness` in a fleet: the fleet checkpoint submitted to the
//!   witnesses, their cosignatures stored in the hub.
//!
//! Each sidecar's log has a globally unique origin (`serve --audit-origin`), bound on
//! its first shipment to its checkpoint key: a batch under that origin must carry a
//! checkpoint signed by that key. Ingest checks chain continuity (seq, prev, canonical
//! bytes, event id), the Merkle root at the checkpoint and its signature; a re-shipped
//! line must be byte-identical to the stored one (idempotent), anything else is
//! refused as a fork; a checkpoint at or below the hub's newest is accepted only if it
//! is byte-identical to the one stored at its size (a replay otherwise).
//!
//! The fleet log: every accepted sidecar checkpoint becomes a leaf (its exact note
//! bytes) of one RFC 9162 tree; at each leaf a fleet checkpoint (`toolgate/fleet`,
//! size, root) is signed with the fleet key (`serve --fleet-key-dir`, one key shared by
//! every sidecar of the fleet), so one fleet checkpoint commits to the newest
//! checkpoint of every sidecar at that point and one key verifies every fleet
//! checkpoint. The hub binds the fleet key on its first fleet leaf (like an origin to
//! its key) and refuses a batch offered with another fleet key
//! ([`HubError::FleetKey`]).
//!
//! INVARIANT: only the hub knows the hub's tables; ingest writes nothing unless every
//! check passed (one transaction, rolled back on any refusal); the sidecar's local log
//! is written first and the hub never sits on a call's path, but for one read: a retry
//! under an approval (and a decision on one) reads the other sidecars' evidence of that
//! approval in the hub ([`coverage`]), bounded, and refuses when it is not there in time.

pub mod coverage;
pub mod fleet;
pub mod ship;
pub mod tail;
pub mod witness;

use std::time::Duration;

use serde_json::Value;

use crate::audit::checkpoint::{Checkpoint, verify_note};
use crate::audit::keys::VerifierKey;
use crate::audit::line::{GENESIS_PREV, event_id};
use crate::audit::merkle::{Frontier, Hash, leaf_hash};
use crate::audit::signer::Signer;

/// The origin line of fleet checkpoints.
pub const FLEET_ORIGIN: &str = "toolgate/fleet";
/// The longest one ingest transaction may take.
pub const INGEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The most lines one batch may carry.
pub const MAX_BATCH_LINES: usize = 2000;

/// The hub's tables (a versioned migration of the cluster database).
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS hub_logs (
    origin text PRIMARY KEY,
    vkey text NOT NULL,
    size bigint NOT NULL DEFAULT 0,
    head text NOT NULL,
    frontier jsonb NOT NULL,
    checkpoint_size bigint NOT NULL DEFAULT 0,
    registered_at timestamptz NOT NULL DEFAULT now(),
    shipped_at timestamptz
);
CREATE TABLE IF NOT EXISTS hub_events (
    origin text NOT NULL REFERENCES hub_logs (origin),
    seq bigint NOT NULL,
    run_id text,
    line text NOT NULL,
    PRIMARY KEY (origin, seq)
);
CREATE INDEX IF NOT EXISTS hub_events_run ON hub_events (run_id);
CREATE TABLE IF NOT EXISTS hub_checkpoints (
    origin text NOT NULL REFERENCES hub_logs (origin),
    size bigint NOT NULL,
    note text NOT NULL,
    PRIMARY KEY (origin, size)
);
CREATE TABLE IF NOT EXISTS hub_fleet (
    seq bigint PRIMARY KEY,
    origin text NOT NULL,
    size bigint NOT NULL,
    leaf text NOT NULL,
    note text NOT NULL,
    FOREIGN KEY (origin, size) REFERENCES hub_checkpoints (origin, size)
);
CREATE TABLE IF NOT EXISTS hub_fleet_head (
    id integer PRIMARY KEY CHECK (id = 1),
    size bigint NOT NULL,
    frontier jsonb NOT NULL
);
INSERT INTO hub_fleet_head (id, size, frontier) VALUES (1, 0, '[]') ON CONFLICT DO NOTHING;
";

/// The fleet key bound to the fleet log (a versioned migration of the cluster
/// database): NULL until the first fleet leaf, then the verifier key every fleet
/// checkpoint is signed with.
pub const SCHEMA_FLEET_KEY: &str = "
ALTER TABLE hub_fleet_head ADD COLUMN vkey text;
";

/// Why the hub refused a batch or could not be reached. Every refusal leaves the hub
/// as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubError {
    /// The database could not be reached or answered with an error.
    Unavailable(String),
    /// The origin is registered to another checkpoint key: a sidecar shipping under
    /// another's origin.
    OriginKey { origin: String, registered: String },
    /// A line differs from the one the hub holds at its seq, or the chain does not
    /// continue the hub's: another history.
    Fork {
        origin: String,
        seq: u64,
        what: String,
    },
    /// A line is not a well-formed, canonical event of this log at its seq.
    Forged {
        origin: String,
        seq: u64,
        what: String,
    },
    /// A checkpoint at or below the hub's newest that is not the one it holds.
    Replayed { origin: String, size: u64 },
    /// A checkpoint that does not verify, names another origin, or whose root the
    /// lines do not hash to.
    BadCheckpoint {
        origin: String,
        size: u64,
        what: String,
    },
    /// The batch is malformed (too many lines, lines out of order).
    Malformed(String),
    /// The fleet log is bound to another fleet key than the one this sidecar signs
    /// fleet checkpoints with (`serve --fleet-key-dir`).
    FleetKey {
        origin: String,
        registered: String,
        offered: String,
    },
}

impl HubError {
    /// The stable reason code (logs, metrics, JSON output).
    pub fn reason(&self) -> &'static str {
        match self {
            HubError::Unavailable(_) => "hub_unavailable",
            HubError::OriginKey { .. } => "hub_origin_key_mismatch",
            HubError::Fork { .. } => "hub_fork",
            HubError::Forged { .. } => "hub_forged_line",
            HubError::Replayed { .. } => "hub_checkpoint_replayed",
            HubError::BadCheckpoint { .. } => "hub_bad_checkpoint",
            HubError::Malformed(_) => "hub_batch_malformed",
            HubError::FleetKey { .. } => "hub_fleet_key_mismatch",
        }
    }

    /// Whether retrying later may succeed (the database was down); every other
    /// refusal is final for the batch as it is.
    pub fn retryable(&self) -> bool {
        matches!(self, HubError::Unavailable(_))
    }

    /// The structured form.
    pub fn to_json(&self) -> Value {
        let (origin, seq) = match self {
            HubError::OriginKey { origin, .. }
            | HubError::Replayed { origin, .. }
            | HubError::FleetKey { origin, .. } => (Some(origin), None),
            HubError::Fork { origin, seq, .. } | HubError::Forged { origin, seq, .. } => {
                (Some(origin), Some(*seq))
            }
            HubError::BadCheckpoint { origin, .. } => (Some(origin), None),
            HubError::Unavailable(_) | HubError::Malformed(_) => (None, None),
        };
        serde_json::json!({
            "error": self.reason(),
            "sidecar": origin,
            "seq": seq,
            "message": self.to_string(),
            "retryable": self.retryable(),
        })
    }
}

impl std::fmt::Display for HubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HubError::Unavailable(what) => write!(f, "the audit hub is unavailable: {what}"),
            HubError::OriginKey { origin, registered } => write!(
                f,
                "origin `{origin}` is registered to another checkpoint key ({registered}): a sidecar ships under another's origin; give each sidecar its own --audit-origin"
            ),
            HubError::Fork { origin, seq, what } => {
                write!(f, "sidecar `{origin}` seq {seq}: fork: {what}")
            }
            HubError::Forged { origin, seq, what } => {
                write!(f, "sidecar `{origin}` seq {seq}: forged line: {what}")
            }
            HubError::Replayed { origin, size } => write!(
                f,
                "sidecar `{origin}`: the checkpoint at size {size} is at or below the hub's newest and is not the one it holds: a replayed old checkpoint"
            ),
            HubError::BadCheckpoint { origin, size, what } => {
                write!(f, "sidecar `{origin}` checkpoint at size {size}: {what}")
            }
            HubError::Malformed(what) => write!(f, "malformed hub batch: {what}"),
            HubError::FleetKey {
                origin,
                registered,
                offered,
            } => write!(
                f,
                "sidecar `{origin}` signs fleet checkpoints with another fleet key ({offered}) than the one the fleet log is bound to ({registered}); mount the fleet's key in --fleet-key-dir"
            ),
        }
    }
}

impl std::error::Error for HubError {}

pub(crate) fn db_error(e: &tokio_postgres::Error) -> HubError {
    HubError::Unavailable(match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    })
}

pub(crate) fn pool_error(e: &deadpool_postgres::PoolError) -> HubError {
    HubError::Unavailable(format!("no database connection: {e}"))
}

/// The longest connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A small pool to the hub's database at `url` (`postgres://...`; TLS as
/// `sslmode` asks, with the system's roots), checked by one round trip: the database
/// answers and holds the hub's tables. A failure is [`HubError::Unavailable`].
pub async fn connect(url: &str) -> Result<deadpool_postgres::Pool, HubError> {
    use std::str::FromStr;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(HubError::Unavailable(
            "the cluster database URL must start with postgres:// or postgresql://".into(),
        ));
    }
    let mut config = tokio_postgres::Config::from_str(url)
        .map_err(|e| HubError::Unavailable(format!("not a usable PostgreSQL URL: {e}")))?;
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .application_name("toolgate-hub");
    let tls = crate::outbound::system_tls_config()
        .map(tokio_postgres_rustls::MakeRustlsConnect::new)
        .map_err(HubError::Unavailable)?;
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(4)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .timeouts(deadpool_postgres::Timeouts {
            wait: Some(CONNECT_TIMEOUT),
            create: Some(CONNECT_TIMEOUT),
            recycle: Some(CONNECT_TIMEOUT),
        })
        .build()
        .map_err(|e| HubError::Unavailable(e.to_string()))?;
    let client = tokio::time::timeout(CONNECT_TIMEOUT * 2, pool.get())
        .await
        .map_err(|_| HubError::Unavailable("no answer from the cluster database in time".into()))?
        .map_err(|e| pool_error(&e))?;
    client
        .query_one("SELECT size FROM hub_fleet_head WHERE id = 1", &[])
        .await
        .map_err(|e| match e.as_db_error() {
            Some(db) if db.code().code() == "42P01" => HubError::Unavailable(
                "this database holds no audit hub (no sidecar with --cluster-db has started on it)"
                    .into(),
            ),
            _ => db_error(&e),
        })?;
    drop(client);
    Ok(pool)
}

/// One shipment: committed lines from `first_seq` on (consecutive), and a signed
/// checkpoint of the log at the seq of the last line.
#[derive(Debug, Clone)]
pub struct Batch {
    pub origin: String,
    /// The log's checkpoint key.
    pub key: VerifierKey,
    /// (seq, exact line bytes), consecutive.
    pub lines: Vec<(u64, String)>,
    /// The signed note of the log at `lines`' last seq.
    pub checkpoint: String,
}

/// What an ingest did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ingested {
    /// Lines stored now (re-shipped identical lines are not counted).
    pub new_lines: u64,
    /// The hub's size of this log afterwards.
    pub size: u64,
    /// The fleet log's size afterwards (None: no new fleet leaf).
    pub fleet_size: Option<u64>,
}

/// The hub's view of one sidecar log.
#[derive(Debug, Clone)]
struct LogRow {
    vkey: String,
    size: u64,
    head: String,
    frontier: Frontier,
    checkpoint_size: u64,
}

fn frontier_from(size: u64, nodes: &Value) -> Option<Frontier> {
    let nodes: Vec<Hash> = nodes
        .as_array()?
        .iter()
        .map(|n| {
            let mut out = [0u8; 32];
            hex::decode_to_slice(n.as_str()?, &mut out).ok()?;
            Some(out)
        })
        .collect::<Option<_>>()?;
    Frontier::from_parts(size, &nodes)
}

fn frontier_json(frontier: &Frontier) -> Value {
    Value::Array(
        frontier
            .nodes()
            .iter()
            .map(|n| Value::String(crate::canonical::to_hex(n)))
            .collect(),
    )
}

/// Checks one line as the event at `seq` following `prev`; returns its leaf hash.
pub(crate) fn check_line(origin: &str, seq: u64, prev: &str, line: &str) -> Result<Hash, HubError> {
    let forged = |what: &str| HubError::Forged {
        origin: origin.to_string(),
        seq,
        what: what.to_string(),
    };
    if line.len() > crate::audit::line::MAX_LINE_BYTES {
        return Err(forged("the line is too large"));
    }
    let value: Value = serde_json::from_str(line).map_err(|_| forged("not JSON"))?;
    if crate::canonical::to_canonical_string(&value) != line {
        return Err(forged("not canonical JSON (RFC 8785): it was edited"));
    }
    if value.get("seq").and_then(Value::as_u64) != Some(seq) {
        return Err(forged("the line carries another seq"));
    }
    if value.get("event_id").and_then(Value::as_str) != Some(event_id(seq).as_str()) {
        return Err(forged("the event_id does not match the seq"));
    }
    if value.get("prev").and_then(Value::as_str) != Some(prev) {
        return Err(HubError::Fork {
            origin: origin.to_string(),
            seq,
            what: "its prev is not the hash of the line before: the chain breaks".into(),
        });
    }
    Ok(leaf_hash(line.as_bytes()))
}

/// Checks and stores one batch in one transaction (see the module docs); with a new
/// checkpoint, appends it to the fleet log and signs the fleet checkpoint with
/// `fleet_signer` (the fleet key, which the fleet log is bound to).
pub async fn ingest(
    pool: &deadpool_postgres::Pool,
    batch: &Batch,
    fleet_signer: &dyn Signer,
) -> Result<Ingested, HubError> {
    tokio::time::timeout(INGEST_TIMEOUT, ingest_inner(pool, batch, fleet_signer))
        .await
        .map_err(|_| {
            HubError::Unavailable(format!(
                "the ingest did not finish within {} s",
                INGEST_TIMEOUT.as_secs()
            ))
        })?
}

async fn ingest_inner(
    pool: &deadpool_postgres::Pool,
    batch: &Batch,
    signer: &dyn Signer,
) -> Result<Ingested, HubError> {
    let origin = batch.origin.as_str();
    let checkpoint = check_batch(batch)?;
    let bad = |size: u64, what: String| HubError::BadCheckpoint {
        origin: origin.to_string(),
        size,
        what,
    };
    let mut client = pool.get().await.map_err(|e| pool_error(&e))?;
    let tx = client.transaction().await.map_err(|e| db_error(&e))?;
    let map = |e: tokio_postgres::Error| db_error(&e);
    let log = lock_log(&tx, batch).await?;
    check_fleet_key(&tx, origin, signer.verifier(), false).await?;
    if log.vkey != batch.key.to_vkey() {
        return Err(HubError::OriginKey {
            origin: origin.to_string(),
            registered: match VerifierKey::parse_vkey(&log.vkey) {
                Ok(key) => format!("fingerprint {}", key.fingerprint()),
                Err(_) => "an unreadable key".into(),
            },
        });
    }
    check_resent(&tx, batch, log.size).await?;
    // New lines continue the chain and the tree.
    let new: Vec<&(u64, String)> = batch.lines.iter().filter(|l| l.0 > log.size).collect();
    if let Some(first) = new.first()
        && first.0 != log.size + 1
    {
        return Err(HubError::Malformed(format!(
            "the batch starts at seq {} but the hub holds up to {}",
            first.0, log.size
        )));
    }
    let mut frontier = log.frontier.clone();
    let mut prev = log.head.clone();
    for (seq, line) in &new {
        let hash = check_line(origin, *seq, &prev, line)?;
        frontier.push(hash);
        prev = crate::canonical::to_hex(hash);
    }
    let new_size = frontier.size().max(log.size);
    // The checkpoint: a new one must match the tree; an old one must be the stored one.
    let mut fleet_leaf = None;
    if checkpoint.size <= log.checkpoint_size {
        let stored: Option<String> = tx
            .query_opt(
                "SELECT note FROM hub_checkpoints WHERE origin = $1 AND size = $2",
                &[&origin, &(checkpoint.size as i64)],
            )
            .await
            .map_err(map)?
            .map(|r| r.get(0));
        if stored.as_deref() != Some(batch.checkpoint.as_str()) {
            return Err(HubError::Replayed {
                origin: origin.to_string(),
                size: checkpoint.size,
            });
        }
    } else {
        if checkpoint.size != new_size || frontier.root() != checkpoint.root {
            return Err(bad(
                checkpoint.size,
                "the lines do not hash to its root: a line was forged or the checkpoint belongs to another history".into(),
            ));
        }
        fleet_leaf = Some(batch.checkpoint.clone());
    }
    insert_events(&tx, origin, &new).await?;
    let mut fleet_size = None;
    if let Some(leaf) = fleet_leaf {
        tx.execute(
            "INSERT INTO hub_checkpoints (origin, size, note) VALUES ($1, $2, $3)",
            &[&origin, &(checkpoint.size as i64), &leaf],
        )
        .await
        .map_err(map)?;
        fleet_size = Some(append_fleet(&tx, origin, checkpoint.size, &leaf, signer).await?);
    }
    let new_checkpoint_size = log.checkpoint_size.max(checkpoint.size);
    tx.execute(
        "UPDATE hub_logs SET size = $2, head = $3, frontier = $4, checkpoint_size = $5, shipped_at = now() WHERE origin = $1",
        &[
            &origin,
            &(new_size as i64),
            &prev,
            &frontier_json(&frontier),
            &(new_checkpoint_size as i64),
        ],
    )
    .await
    .map_err(map)?;
    tx.commit().await.map_err(map)?;
    Ok(Ingested {
        new_lines: new.len() as u64,
        size: new_size,
        fleet_size,
    })
}

/// The checks of a batch that need no database: its size, consecutive seqs, and a
/// checkpoint signed by its key, for its origin, at its last line.
fn check_batch(batch: &Batch) -> Result<Checkpoint, HubError> {
    let origin = batch.origin.as_str();
    if batch.lines.len() > MAX_BATCH_LINES {
        return Err(HubError::Malformed(format!(
            "{} lines (at most {MAX_BATCH_LINES})",
            batch.lines.len()
        )));
    }
    if batch.lines.windows(2).any(|w| w[1].0 != w[0].0 + 1)
        || batch.lines.first().is_some_and(|l| l.0 == 0)
    {
        return Err(HubError::Malformed(
            "the lines are not consecutive from seq 1 on".into(),
        ));
    }
    let bad = |size: u64, what: String| HubError::BadCheckpoint {
        origin: origin.to_string(),
        size,
        what,
    };
    let checkpoint: Checkpoint = verify_note(&batch.checkpoint, &batch.key)
        .map_err(|e| bad(0, format!("does not verify with the log's key: {e}")))?;
    if checkpoint.origin != origin {
        return Err(bad(
            checkpoint.size,
            format!("it is the checkpoint of origin `{}`", checkpoint.origin),
        ));
    }
    let end = batch.lines.last().map_or(checkpoint.size, |l| l.0);
    if checkpoint.size != end {
        return Err(bad(
            checkpoint.size,
            format!("it does not end at the batch's last seq {end}"),
        ));
    }
    Ok(checkpoint)
}

/// Registers the origin on its first shipment and locks its row for this batch.
async fn lock_log(
    tx: &deadpool_postgres::Transaction<'_>,
    batch: &Batch,
) -> Result<LogRow, HubError> {
    let origin = batch.origin.as_str();
    let vkey = batch.key.to_vkey();
    let map = |e: tokio_postgres::Error| db_error(&e);
    tx.execute(
        "INSERT INTO hub_logs (origin, vkey, head, frontier) VALUES ($1, $2, $3, '[]'::jsonb) ON CONFLICT (origin) DO NOTHING",
        &[&origin, &vkey, &GENESIS_PREV],
    )
    .await
    .map_err(map)?;
    let row = tx
        .query_one(
            "SELECT vkey, size, head, frontier, checkpoint_size FROM hub_logs WHERE origin = $1 FOR UPDATE",
            &[&origin],
        )
        .await
        .map_err(map)?;
    let size: i64 = row.get(1);
    let frontier_value: Value = row.get(3);
    let checkpoint_size: i64 = row.get(4);
    let mut log = LogRow {
        vkey: row.get(0),
        size: size.max(0) as u64,
        head: row.get(2),
        frontier: Frontier::new(),
        checkpoint_size: checkpoint_size.max(0) as u64,
    };
    log.frontier = frontier_from(log.size, &frontier_value).ok_or_else(|| HubError::Forged {
        origin: origin.to_string(),
        seq: log.size,
        what: "the hub's stored tree edge is malformed (the hub row was edited)".into(),
    })?;
    Ok(log)
}

/// Lines shipped again (a seq the hub holds) must be byte-identical to the stored ones.
async fn check_resent(
    tx: &deadpool_postgres::Transaction<'_>,
    batch: &Batch,
    size: u64,
) -> Result<(), HubError> {
    let origin = batch.origin.as_str();
    let map = |e: tokio_postgres::Error| db_error(&e);
    let overlap: Vec<&(u64, String)> = batch.lines.iter().filter(|l| l.0 <= size).collect();
    if let (Some(first), Some(last)) = (overlap.first(), overlap.last()) {
        let rows = tx
            .query(
                "SELECT seq, line FROM hub_events WHERE origin = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq",
                &[&origin, &(first.0 as i64), &(last.0 as i64)],
            )
            .await
            .map_err(map)?;
        let stored: std::collections::HashMap<i64, String> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        for (seq, line) in &overlap {
            match stored.get(&(*seq as i64)) {
                Some(have) if have == line => {}
                Some(_) => {
                    return Err(HubError::Fork {
                        origin: origin.to_string(),
                        seq: *seq,
                        what: "the line differs from the one the hub holds at this seq".into(),
                    });
                }
                None => {
                    return Err(HubError::Forged {
                        origin: origin.to_string(),
                        seq: *seq,
                        what: "the hub has no line at a seq below its size (a hub row was removed)"
                            .into(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Stores the new lines, each under its run; a row already at a seq beyond the
/// recorded size was injected.
async fn insert_events(
    tx: &deadpool_postgres::Transaction<'_>,
    origin: &str,
    new: &[&(u64, String)],
) -> Result<(), HubError> {
    for (seq, line) in new {
        let value: Value = serde_json::from_str(line).unwrap_or_default();
        let run_id = value.get("run_id").and_then(Value::as_str);
        tx.execute(
            "INSERT INTO hub_events (origin, seq, run_id, line) VALUES ($1, $2, $3, $4)",
            &[&origin, &(*seq as i64), &run_id, line],
        )
        .await
        .map_err(|e| match e.as_db_error() {
            Some(db) if db.code().code() == "23505" => HubError::Fork {
                origin: origin.to_string(),
                seq: *seq,
                what: "the hub already holds a row at this seq beyond its recorded size (a row was injected)".into(),
            },
            _ => db_error(&e),
        })?;
    }
    Ok(())
}

/// Appends a sidecar checkpoint to the fleet log and stores the fleet checkpoint
/// signed by `signer` (in the caller's transaction; the fleet head row is locked).
async fn append_fleet(
    tx: &deadpool_postgres::Transaction<'_>,
    origin: &str,
    size: u64,
    leaf: &str,
    signer: &dyn Signer,
) -> Result<u64, HubError> {
    let map = |e: tokio_postgres::Error| db_error(&e);
    check_fleet_key(tx, origin, signer.verifier(), true).await?;
    let row = tx
        .query_one(
            "SELECT size, frontier FROM hub_fleet_head WHERE id = 1 FOR UPDATE",
            &[],
        )
        .await
        .map_err(map)?;
    let fleet_size: i64 = row.get(0);
    let nodes: Value = row.get(1);
    let mut frontier =
        frontier_from(fleet_size.max(0) as u64, &nodes).ok_or_else(|| HubError::Forged {
            origin: FLEET_ORIGIN.to_string(),
            seq: fleet_size.max(0) as u64,
            what: "the fleet log's stored tree edge is malformed (the hub row was edited)".into(),
        })?;
    frontier.push(leaf_hash(leaf.as_bytes()));
    let fleet = Checkpoint {
        origin: FLEET_ORIGIN.to_string(),
        size: frontier.size(),
        root: frontier.root(),
    };
    let note = fleet
        .sign_with(signer)
        .map_err(|e| HubError::Unavailable(format!("cannot sign the fleet checkpoint: {e}")))?;
    tx.execute(
        "INSERT INTO hub_fleet (seq, origin, size, leaf, note) VALUES ($1, $2, $3, $4, $5)",
        &[
            &(frontier.size() as i64),
            &origin,
            &(size as i64),
            &leaf,
            &note,
        ],
    )
    .await
    .map_err(map)?;
    tx.execute(
        "UPDATE hub_fleet_head SET size = $1, frontier = $2 WHERE id = 1",
        &[&(frontier.size() as i64), &frontier_json(&frontier)],
    )
    .await
    .map_err(map)?;
    Ok(frontier.size())
}

/// Refuses `offered` unless the fleet log is bound to it; with `bind` (the fleet head
/// row is then locked), binds an unbound fleet log to it.
async fn check_fleet_key(
    tx: &deadpool_postgres::Transaction<'_>,
    origin: &str,
    offered: &VerifierKey,
    bind: bool,
) -> Result<(), HubError> {
    let map = |e: tokio_postgres::Error| db_error(&e);
    let lock = if bind { " FOR UPDATE" } else { "" };
    let row = tx
        .query_one(
            &format!("SELECT vkey FROM hub_fleet_head WHERE id = 1{lock}"),
            &[],
        )
        .await
        .map_err(map)?;
    let registered: Option<String> = row.get(0);
    match registered {
        Some(vkey) => fleet_key_matches(origin, &vkey, offered),
        None if bind => {
            tx.execute(
                "UPDATE hub_fleet_head SET vkey = $1 WHERE id = 1",
                &[&offered.to_vkey()],
            )
            .await
            .map_err(map)?;
            Ok(())
        }
        None => Ok(()),
    }
}

/// Refuses `offered` unless it is the fleet key `registered` (a vkey).
pub(crate) fn fleet_key_matches(
    origin: &str,
    registered: &str,
    offered: &VerifierKey,
) -> Result<(), HubError> {
    if registered == offered.to_vkey() {
        return Ok(());
    }
    Err(HubError::FleetKey {
        origin: origin.to_string(),
        registered: match VerifierKey::parse_vkey(registered) {
            Ok(key) => format!("fingerprint {}", key.fingerprint()),
            Err(_) => "an unreadable key".into(),
        },
        offered: format!("fingerprint {}", offered.fingerprint()),
    })
}
