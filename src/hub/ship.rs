//! The shipper: one task per sidecar that copies its committed audit lines and signed
//! checkpoints into the hub, in order, from where the hub stands (so it resumes after
//! a restart, a crash or an outage by itself), off every call's path.
//!
//! Each round: read the hub's size of this origin, pick the largest local signed
//! checkpoint within [`MAX_BATCH_LINES`] lines above it (or the nearest one above),
//! read the lines up to it from the local log and [`ingest`] them. A refusal is
//! final for that batch and is logged with its reason; the database being down is
//! retried at the next round. The lag (local seq minus shipped seq) is in `/metrics`.
//! After each round the runs whose events the hub now holds lose their mark
//! (`tail`).
//!
//! At a graceful stop ([`HubShipper::finish`], once the audit log is closed and its
//! last checkpoint signed) the shipper ships what is left, within the drain time; what
//! the hub could not take stays in the local log, marked, and ships at the next start.
//!
//! Coverage (`hub::coverage`): each round reads the database's clock before the local
//! head, and when the hub then holds the whole local log as read, records that reading
//! as up to when the hub holds every event of this log; a last shipment that leaves
//! nothing behind closes the log's coverage (the log appends nothing more).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::tail::Tail;
use super::{Batch, HubError, MAX_BATCH_LINES, db_error, ingest, pool_error};
use crate::audit::keys::VerifierKey;
use crate::audit::signer::Signer;
use crate::audit::{AuditLog, AuditReader, EventFilter};

/// What `/metrics` shows of the shipping.
#[derive(Debug)]
pub struct ShipStatus {
    /// The local log, whose newest seq is read at each scrape (a lag computed from a
    /// stale copy could read 0 while events wait).
    audit: AuditLog,
    /// The newest seq the hub holds of this log.
    pub shipped_seq: AtomicU64,
    /// Rounds that could not reach the hub.
    pub failures: AtomicU64,
    /// Batches the hub refused (a fork, a forged line, another's origin, ...).
    pub refusals: AtomicU64,
    /// The last refusal or failure, structured.
    pub last_error: Mutex<Option<serde_json::Value>>,
}

impl ShipStatus {
    fn new(audit: AuditLog) -> Self {
        ShipStatus {
            audit,
            shipped_seq: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }
    }

    /// The newest committed seq of the local log, now.
    pub fn local_seq(&self) -> u64 {
        self.audit.head().map_or(0, |h| h.0)
    }

    /// Events committed locally and not yet in the hub.
    pub fn lag(&self) -> u64 {
        self.local_seq()
            .saturating_sub(self.shipped_seq.load(Ordering::Relaxed))
    }
}

/// How a sidecar ships.
#[derive(Clone)]
pub struct ShipOptions {
    /// The log's origin (unique in the fleet).
    pub origin: String,
    /// The log's first segment.
    pub db_path: PathBuf,
    /// The log's checkpoint key.
    pub key: VerifierKey,
    /// Signs fleet checkpoints: the fleet key (`serve --fleet-key-dir`), shared by
    /// every sidecar of the fleet.
    pub fleet_signer: Arc<dyn Signer>,
    /// How often the shipper looks for new lines.
    pub interval: Duration,
    /// The marks of the runs this sidecar holds events of that the hub does not
    /// (installed on the audit log by the caller).
    pub tail: Arc<Tail>,
}

/// A running shipper: its status, and the way to stop it with a last shipment.
pub struct HubShipper {
    status: Arc<ShipStatus>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    pool: deadpool_postgres::Pool,
    audit: AuditLog,
    options: ShipOptions,
}

/// How a last shipment ended ([`HubShipper::finish`]).
#[derive(Debug)]
pub struct Finished {
    /// The local log's newest seq.
    pub local: u64,
    /// What the hub holds of it.
    pub shipped: u64,
    /// Why the hub does not hold all of it (None: it does).
    pub error: Option<HubError>,
}

/// How often a last shipment tries a hub that did not answer.
const FINAL_ATTEMPTS: u32 = 4;
/// How long it waits between two tries.
const FINAL_RETRY: Duration = Duration::from_millis(500);

/// Starts the shipper on the current runtime.
pub fn start(pool: deadpool_postgres::Pool, audit: AuditLog, options: ShipOptions) -> HubShipper {
    let status = Arc::new(ShipStatus::new(audit.clone()));
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(
        pool.clone(),
        audit.clone(),
        options.clone(),
        status.clone(),
        stop.clone(),
    ));
    HubShipper {
        status,
        stop,
        task,
        pool,
        audit,
        options,
    }
}

impl HubShipper {
    /// What `/metrics` shows of the shipping.
    pub fn status(&self) -> Arc<ShipStatus> {
        self.status.clone()
    }

    /// Stops the rounds and ships what the local log holds beyond the hub, before
    /// `deadline`: call it once the audit log is closed (its last checkpoint signed,
    /// nothing appended any more). Then the runs the hub holds everything of lose
    /// their marks. A hub that does not answer is tried [`FINAL_ATTEMPTS`] times.
    pub async fn finish(mut self, deadline: Instant) -> Finished {
        self.stop.cancel();
        if tokio::time::timeout_at(deadline, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        let local = self.audit.head().map_or(0, |h| h.0);
        let mut shipped = self.status.shipped_seq.load(Ordering::Relaxed);
        let mut attempts = 0;
        let error = loop {
            let before = shipped;
            match tokio::time::timeout_at(deadline, round(&self.pool, &self.options, local)).await {
                Ok(Ok(size)) => {
                    shipped = size;
                    self.status.shipped_seq.store(size, Ordering::Relaxed);
                    if size >= local {
                        break None;
                    }
                    if size <= before && attempts > 0 {
                        break Some(HubError::Unavailable(format!(
                            "no signed checkpoint of the local log above seq {size}"
                        )));
                    }
                    attempts += 1;
                }
                Ok(Err(error)) if error.retryable() && attempts + 1 < FINAL_ATTEMPTS => {
                    attempts += 1;
                    if Instant::now() + FINAL_RETRY >= deadline {
                        break Some(error);
                    }
                    tokio::time::sleep(FINAL_RETRY).await;
                }
                Ok(Err(error)) => break Some(error),
                Err(_) => {
                    break Some(HubError::Unavailable(
                        "the hub did not take the last events within the drain time".into(),
                    ));
                }
            }
        };
        if error.is_none() {
            // The log is closed and the hub holds all of it: so is its coverage, until
            // the sidecar starts again (`coverage::reopen`).
            if tokio::time::timeout_at(
                deadline.max(Instant::now() + FINAL_RETRY),
                super::coverage::close(&self.pool, &self.options.origin, local),
            )
            .await
            .map_or(true, |closed| closed.is_err())
            {
                tracing::warn!(
                    origin = %self.options.origin,
                    "the audit hub was not told that this sidecar's log is complete; the other sidecars hold the approvals it could have used until it starts again or they expire"
                );
            }
            // The log is closed: everything appended is in it, and in the hub.
            let settled = tokio::time::timeout_at(
                deadline.max(Instant::now() + FINAL_RETRY),
                self.options.tail.settle(shipped, &self.audit),
            )
            .await;
            if !matches!(settled, Ok(Ok(0))) {
                tracing::warn!(
                    origin = %self.options.origin,
                    "the marks of the runs this sidecar shipped were not all removed from the audit hub; the next start removes them"
                );
            }
        }
        Finished {
            local,
            shipped,
            error,
        }
    }
}

async fn run(
    pool: deadpool_postgres::Pool,
    audit: AuditLog,
    options: ShipOptions,
    status: Arc<ShipStatus>,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(options.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_reason: Option<&'static str> = None;
    let mut backlog_marked = false;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = stop.cancelled() => return,
        }
        // The runs of what the local log holds beyond the hub at start are marked
        // before anything else is shipped (an earlier life may not have marked them).
        if !backlog_marked {
            match mark_backlog(&pool, &audit, &options).await {
                Ok(()) => backlog_marked = true,
                Err(error) => {
                    status.failures.fetch_add(1, Ordering::Relaxed);
                    if last_reason != Some(error.reason()) {
                        tracing::error!(origin = %options.origin, reason = error.reason(), error = %error, "the runs of the local events the audit hub does not hold yet could not be marked; retrying at the next round");
                    }
                    last_reason = Some(error.reason());
                    continue;
                }
            }
        }
        // Ship as long as there is a full batch waiting, then wait for the next tick.
        loop {
            if stop.is_cancelled() {
                return;
            }
            // The database's clock before the local head: every event committed
            // before the reading is at or below the head.
            let clock = super::coverage::clock_ms(&pool).await;
            let local = audit.head().map_or(0, |h| h.0);
            let before = status.shipped_seq.load(Ordering::Relaxed);
            let shipped = match (round(&pool, &options, local).await, clock) {
                (Ok(shipped), Ok(clock)) => match options.tail.settle(shipped, &audit).await {
                    Ok(_) if shipped >= local && shipped > 0 => {
                        super::coverage::record(&pool, &options.origin, clock)
                            .await
                            .map(|()| shipped)
                    }
                    Ok(_) => Ok(shipped),
                    Err(error) => Err(error),
                },
                (Err(error), _) | (_, Err(error)) => Err(error),
            };
            match shipped {
                Ok(shipped) => {
                    status.shipped_seq.store(shipped, Ordering::Relaxed);
                    if last_reason.take().is_some() {
                        tracing::info!(origin = %options.origin, shipped, "audit shipping to the hub resumed");
                    }
                    // Caught up, or no signed checkpoint to ship up to yet.
                    if shipped >= local || shipped <= before {
                        break;
                    }
                }
                Err(error) => {
                    if error.retryable() {
                        status.failures.fetch_add(1, Ordering::Relaxed);
                    } else {
                        status.refusals.fetch_add(1, Ordering::Relaxed);
                    }
                    if last_reason != Some(error.reason()) {
                        tracing::error!(origin = %options.origin, reason = error.reason(), error = %error, "audit shipping to the hub failed; the local log keeps every event and shipping resumes from the hub's size");
                    }
                    last_reason = Some(error.reason());
                    *status.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(error.to_json());
                    break;
                }
            }
        }
    }
}

/// Marks the runs of the local events above the hub's size of this log (at most the
/// log's size when shipping started).
async fn mark_backlog(
    pool: &deadpool_postgres::Pool,
    audit: &AuditLog,
    options: &ShipOptions,
) -> Result<(), HubError> {
    let hub = hub_size(pool, &options.origin).await?;
    let upto = audit.head().map_or(0, |h| h.0);
    if hub >= upto {
        return Ok(());
    }
    let db = options.db_path.clone();
    let runs = tokio::task::spawn_blocking(move || -> Result<BTreeSet<String>, String> {
        let reader = AuditReader::open(&db).map_err(|e| e.to_string())?;
        let mut runs = BTreeSet::new();
        let mut after = hub;
        while after < upto {
            let page = reader
                .events(&EventFilter {
                    after_seq: after,
                    limit: MAX_BATCH_LINES,
                    ..EventFilter::default()
                })
                .map_err(|e| e.to_string())?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            runs.extend(page.iter().filter(|e| e.seq <= upto).filter_map(|e| {
                e.value
                    .get("run_id")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_string)
            }));
        }
        Ok(runs)
    })
    .await
    .map_err(|e| HubError::Unavailable(format!("the shipper's reader stopped: {e}")))?
    .map_err(|e| HubError::Unavailable(format!("cannot read the local audit log: {e}")))?;
    options
        .tail
        .mark_backlog(runs.into_iter().collect(), hub.saturating_add(1), upto)
        .await
}

/// One batch; returns the hub's size of this log afterwards.
async fn round(
    pool: &deadpool_postgres::Pool,
    options: &ShipOptions,
    local: u64,
) -> Result<u64, HubError> {
    let (hub, registered, fleet_key) = hub_log(pool, &options.origin).await?;
    // The fleet log must be bound to this sidecar's fleet key (or to none yet).
    if let Some(vkey) = fleet_key {
        super::fleet_key_matches(&options.origin, &vkey, options.fleet_signer.verifier())?;
    }
    // The origin must be this log's: another sidecar's key under it is refused even
    // when there is nothing to ship.
    if let Some(vkey) = registered
        && vkey != options.key.to_vkey()
    {
        return Err(HubError::OriginKey {
            origin: options.origin.clone(),
            registered: match VerifierKey::parse_vkey(&vkey) {
                Ok(key) => format!("fingerprint {}", key.fingerprint()),
                Err(_) => "an unreadable key".into(),
            },
        });
    }
    if hub > local {
        return Err(HubError::Fork {
            origin: options.origin.clone(),
            seq: local + 1,
            what: format!(
                "the hub holds this log up to seq {hub} but the local log ends at seq {local}: the local log was cut or replaced"
            ),
        });
    }
    if hub == local {
        return Ok(hub);
    }
    let db = options.db_path.clone();
    let limit = MAX_BATCH_LINES as u64;
    let read = tokio::task::spawn_blocking(move || -> Result<_, String> {
        let reader = AuditReader::open(&db).map_err(|e| e.to_string())?;
        let mut notes = reader
            .notes_between(hub, hub + limit)
            .map_err(|e| e.to_string())?;
        let (size, note) = match notes.pop() {
            Some(found) => found,
            None => return Ok(None),
        };
        let events = reader
            .events(&EventFilter {
                after_seq: hub,
                limit: (size - hub) as usize,
                ..EventFilter::default()
            })
            .map_err(|e| e.to_string())?;
        Ok(Some((note, events)))
    })
    .await
    .map_err(|e| HubError::Unavailable(format!("the shipper's reader stopped: {e}")))?
    .map_err(|e| HubError::Unavailable(format!("cannot read the local audit log: {e}")))?;
    let Some((note, events)) = read else {
        // No signed checkpoint within a batch above the hub: wait for the next one.
        return Ok(hub);
    };
    let batch = Batch {
        origin: options.origin.clone(),
        key: options.key.clone(),
        lines: events.into_iter().map(|e| (e.seq, e.line)).collect(),
        checkpoint: note,
    };
    let ingested = ingest(pool, &batch, options.fleet_signer.as_ref()).await?;
    Ok(ingested.size)
}

/// The hub's size of the log of `origin` (0: not registered yet).
pub async fn hub_size(pool: &deadpool_postgres::Pool, origin: &str) -> Result<u64, HubError> {
    Ok(hub_log(pool, origin).await?.0)
}

/// Refuses to start shipping under `origin` with the fleet key `offered` when the
/// fleet log is bound to another one (nothing is written).
pub async fn check_fleet_key(
    pool: &deadpool_postgres::Pool,
    origin: &str,
    offered: &VerifierKey,
) -> Result<(), HubError> {
    match hub_log(pool, origin).await?.2 {
        Some(vkey) => super::fleet_key_matches(origin, &vkey, offered),
        None => Ok(()),
    }
}

/// The hub's size of the log of `origin`, the key registered for it (None: not
/// registered yet) and the fleet key the fleet log is bound to (None: none yet).
async fn hub_log(
    pool: &deadpool_postgres::Pool,
    origin: &str,
) -> Result<(u64, Option<String>, Option<String>), HubError> {
    let client = tokio::time::timeout(super::INGEST_TIMEOUT, pool.get())
        .await
        .map_err(|_| HubError::Unavailable("no database connection in time".into()))?
        .map_err(|e| pool_error(&e))?;
    let row = client
        .query_one(
            "SELECT l.size, l.vkey, h.vkey FROM hub_fleet_head h LEFT JOIN hub_logs l ON l.origin = $1 WHERE h.id = 1",
            &[&origin],
        )
        .await
        .map_err(|e| db_error(&e))?;
    let size: Option<i64> = row.get(0);
    Ok((size.unwrap_or(0).max(0) as u64, row.get(1), row.get(2)))
}
