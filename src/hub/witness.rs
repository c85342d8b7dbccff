//! Witnesses in a fleet: on a sidecar that ships to the audit hub, `serve --witness`
//! submits the fleet checkpoint (`toolgate/fleet`, signed with the fleet key) with
//! consistency proofs over the fleet log (the leaves in `hub_fleet`), instead of the
//! sidecar's own checkpoints, and stores the cosignatures in the hub
//! (`hub_fleet_cosignatures`), where every sidecar and verifier sees them.
//!
//! Every sidecar of the fleet runs these tasks, so several submit to one witness at
//! once: a 409 naming the witness's current size is normal then (another sidecar got
//! there first) and the task starts again from that size with a proof from it; a
//! cosignature already stored (witness, size) is not stored twice. A witness that has
//! seen another fleet log (a fork) refuses with a 409 at the same size or a 422, and
//! nothing is stored.
//!
//! INVARIANT: as for a single log, witnessing never delays or refuses a call: the
//! tasks read the hub over the shipper's pool and share nothing with the writer.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use super::fleet::FleetError;
use super::{HubError, db_error, pool_error};
use crate::audit::checkpoint::verify_note;
use crate::audit::keys::VerifierKey;
use crate::audit::merkle::{Frontier, Hash, consistency_proof_extending, leaf_hash};
use crate::audit::witness::{
    Answer, CONNECT_TIMEOUT, MAX_LEAVES_PER_SUBMISSION, REQUEST_TIMEOUT, WitnessConfig, WitnessKey,
    WitnessProblem, WitnessReport, WitnessStatus, add_checkpoint, check_cosignatures,
};
use crate::outbound::{self, error_chain};

/// The cosignatures of fleet checkpoints (a versioned migration of the cluster
/// database): per witness (its cosignature vkey) and fleet size, the witness's
/// signature lines on the fleet checkpoint `hub_fleet.note` at that seq.
pub const SCHEMA: &str = "
CREATE TABLE hub_fleet_cosignatures (
    witness text NOT NULL,
    size bigint NOT NULL REFERENCES hub_fleet (seq),
    cosignature text NOT NULL,
    stored_by text NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (witness, size)
);
";

/// How many fleet leaves one query reads.
const PAGE: i64 = 5000;
/// The most cosignature rows `audit verify` and `audit export` read.
const MAX_COSIGNATURE_ROWS: i64 = 1_000_000;

/// How the fleet's witness tasks run.
#[derive(Debug, Clone)]
pub struct FleetWitnessOptions {
    /// This sidecar's origin (recorded with the cosignatures it stores).
    pub origin: String,
    /// The fleet key: a fleet checkpoint is offered only if it verifies with it.
    pub fleet_key: VerifierKey,
    pub witnesses: Vec<WitnessConfig>,
    /// How often each witness is offered the newest fleet checkpoint.
    pub interval: Duration,
}

/// Starts one task per witness (on the current tokio runtime); returns their status
/// (`/metrics`: the sizes are fleet log sizes).
pub fn start(
    pool: deadpool_postgres::Pool,
    options: FleetWitnessOptions,
) -> Result<Vec<Arc<WitnessStatus>>, String> {
    let client = outbound::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build the witness client: {}", error_chain(&e)))?;
    let mut statuses = Vec::new();
    for witness in &options.witnesses {
        let status = Arc::new(WitnessStatus::new(&witness.key.name));
        statuses.push(status.clone());
        let task = Submitter {
            pool: pool.clone(),
            witness: witness.clone(),
            options: options.clone(),
            client: client.clone(),
            status,
            frontier: None,
        };
        tokio::spawn(task.run());
    }
    Ok(statuses)
}

struct Submitter {
    pool: deadpool_postgres::Pool,
    witness: WitnessConfig,
    options: FleetWitnessOptions,
    client: reqwest::Client,
    status: Arc<WitnessStatus>,
    /// The fleet tree's right edge at the size the witness stands at (as far as known).
    frontier: Option<Frontier>,
}

enum Outcome {
    Cosigned,
    /// The witness stands at another size: start again from there.
    Resync(u64),
    Failed(String),
}

impl Submitter {
    async fn run(mut self) {
        let mut ticker = tokio::time::interval(self.options.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            ticker.tick().await;
            match self.round().await {
                Ok(()) => {
                    if failing {
                        tracing::info!(witness = %self.witness.key.name, "witness cosigns the fleet checkpoint again");
                    }
                    failing = false;
                }
                Err(error) => {
                    self.status.failures.fetch_add(1, Ordering::Relaxed);
                    if !failing {
                        tracing::warn!(witness = %self.witness.key.name, error = %error, "fleet witness submission failed; offered again next round");
                    }
                    failing = true;
                    *self
                        .status
                        .last_error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(error);
                }
            }
        }
    }

    /// Offers the newest fleet checkpoint, catching the witness up first if needed.
    async fn round(&mut self) -> Result<(), String> {
        let Some((size, note)) = fleet_note(&self.pool, None).await? else {
            return Ok(());
        };
        self.status.checkpoint_size.store(size, Ordering::Relaxed);
        if self.frontier.is_none() {
            let from = self.stored_position().await?;
            self.resync(from).await?;
        }
        // Bounded: each resync answer moves the start; give up after a few.
        for _ in 0..4 {
            let have = self.frontier.as_ref().map_or(0, Frontier::size);
            if have >= size {
                return Ok(());
            }
            let (target, target_note) = if size - have > MAX_LEAVES_PER_SUBMISSION {
                let at = have + MAX_LEAVES_PER_SUBMISSION;
                fleet_note(&self.pool, Some(at))
                    .await?
                    .ok_or_else(|| format!("the hub holds no fleet checkpoint at size {at}"))?
            } else {
                (size, note.clone())
            };
            match self.submit(target, &target_note).await? {
                Outcome::Cosigned => continue,
                Outcome::Resync(at) => self.resync(at).await?,
                Outcome::Failed(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// The largest fleet size this witness cosigned, per the hub (0: none).
    async fn stored_position(&self) -> Result<u64, String> {
        let client = connection(&self.pool).await?;
        let row = client
            .query_one(
                "SELECT coalesce(max(size), 0) FROM hub_fleet_cosignatures WHERE witness = $1",
                &[&self.witness.key.to_vkey()],
            )
            .await
            .map_err(|e| db_error(&e).to_string())?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    /// Rebuilds the fleet tree's right edge at `size` from the hub.
    async fn resync(&mut self, size: u64) -> Result<(), String> {
        let mut frontier = Frontier::new();
        for leaf in fleet_leaves(&self.pool, 0, size).await.map_err(|e| match e {
            Leaves::Short(what) => {
                self.status.conflicts.fetch_add(1, Ordering::Relaxed);
                format!(
                    "witness `{}` stands at fleet size {size}: {what} (the fleet log was cut, or the witness saw another fleet log)",
                    self.witness.key.name
                )
            }
            Leaves::Unavailable(what) => what,
        })? {
            frontier.push(leaf);
        }
        self.status.cosigned_size.fetch_max(size, Ordering::Relaxed);
        self.frontier = Some(frontier);
        Ok(())
    }

    /// One add-checkpoint request for the fleet checkpoint `note` of `size` leaves.
    async fn submit(&mut self, size: u64, note: &str) -> Result<Outcome, String> {
        let Some(old) = self.frontier.clone() else {
            return Ok(Outcome::Resync(0));
        };
        let from = old.size();
        let appended = fleet_leaves(&self.pool, from, size)
            .await
            .map_err(Leaves::into_message)?;
        let mut new = old.clone();
        for leaf in &appended {
            new.push(*leaf);
        }
        let checkpoint = verify_note(note, &self.options.fleet_key)
            .map_err(|e| format!("the fleet checkpoint does not verify with the fleet key: {e}"))?;
        if checkpoint.size != size || new.root() != checkpoint.root {
            return Err(format!(
                "the fleet leaves do not hash to the fleet checkpoint at size {size}: not offered"
            ));
        }
        let proof = consistency_proof_extending(&old, &appended);
        let name = &self.witness.key.name;
        match add_checkpoint(&self.client, &self.witness, from, &proof, note).await? {
            Answer::Cosigned { lines, .. } => {
                self.store(size, &lines).await?;
                self.status.cosigned_size.fetch_max(size, Ordering::Relaxed);
                self.frontier = Some(new);
                Ok(Outcome::Cosigned)
            }
            // Another sidecar moved the witness (or it restarted): from there.
            Answer::Conflict(Some(at)) if at != from => Ok(Outcome::Resync(at)),
            Answer::Conflict(theirs) => {
                self.status.conflicts.fetch_add(1, Ordering::Relaxed);
                Ok(Outcome::Failed(format!(
                    "witness `{name}` refuses the fleet checkpoint at size {size} as conflicting with the one it cosigned (size {}): the fleet log forked",
                    theirs.map_or_else(|| "unknown".to_string(), |s| s.to_string())
                )))
            }
            Answer::Refused(422, _) => {
                self.status.conflicts.fetch_add(1, Ordering::Relaxed);
                Ok(Outcome::Failed(format!(
                    "witness `{name}` refuses the consistency proof from fleet size {from} to {size}: it saw another fleet log (a fork)"
                )))
            }
            Answer::Refused(code, text) => Ok(Outcome::Failed(format!(
                "witness `{name}` answered {code}: {text}"
            ))),
        }
    }

    /// Stores the witness's signature lines on the fleet checkpoint at `size`, once.
    async fn store(&self, size: u64, lines: &str) -> Result<(), String> {
        let client = connection(&self.pool).await?;
        client
            .execute(
                "INSERT INTO hub_fleet_cosignatures (witness, size, cosignature, stored_by) VALUES ($1, $2, $3, $4) ON CONFLICT (witness, size) DO NOTHING",
                &[
                    &self.witness.key.to_vkey(),
                    &(size as i64),
                    &lines,
                    &self.options.origin,
                ],
            )
            .await
            .map_err(|e| format!("cannot store the cosignature: {}", db_error(&e)))?;
        Ok(())
    }
}

async fn connection(pool: &deadpool_postgres::Pool) -> Result<deadpool_postgres::Client, String> {
    tokio::time::timeout(super::INGEST_TIMEOUT, pool.get())
        .await
        .map_err(|_| "no database connection in time".to_string())?
        .map_err(|e| pool_error(&e).to_string())
}

/// The fleet checkpoint (size, note) at `at`, or the newest (None: the fleet log is
/// empty, or holds no checkpoint at `at`).
async fn fleet_note(
    pool: &deadpool_postgres::Pool,
    at: Option<u64>,
) -> Result<Option<(u64, String)>, String> {
    let client = connection(pool).await?;
    let row = match at {
        Some(at) => {
            client
                .query_opt(
                    "SELECT seq, note FROM hub_fleet WHERE seq = $1",
                    &[&(at as i64)],
                )
                .await
        }
        None => {
            client
                .query_opt(
                    "SELECT seq, note FROM hub_fleet ORDER BY seq DESC LIMIT 1",
                    &[],
                )
                .await
        }
    }
    .map_err(|e| db_error(&e).to_string())?;
    Ok(row.map(|r| (r.get::<_, i64>(0).max(0) as u64, r.get(1))))
}

/// Why the fleet leaves could not be read.
enum Leaves {
    /// The hub could not be read (retried next round).
    Unavailable(String),
    /// The hub holds fewer leaves, or a gap.
    Short(String),
}

impl Leaves {
    fn into_message(self) -> String {
        match self {
            Leaves::Unavailable(what) | Leaves::Short(what) => what,
        }
    }
}

/// The fleet leaf hashes of seq `from + 1 ..= to`, page by page.
async fn fleet_leaves(
    pool: &deadpool_postgres::Pool,
    from: u64,
    to: u64,
) -> Result<Vec<Hash>, Leaves> {
    let client = connection(pool).await.map_err(Leaves::Unavailable)?;
    let mut out = Vec::with_capacity(to.saturating_sub(from).min(1 << 16) as usize);
    let mut next = from;
    while next < to {
        let rows = client
            .query(
                "SELECT seq, leaf FROM hub_fleet WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3",
                &[&(next as i64), &(to as i64), &PAGE],
            )
            .await
            .map_err(|e| Leaves::Unavailable(db_error(&e).to_string()))?;
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            let seq = r.get::<_, i64>(0).max(0) as u64;
            if seq != next + 1 {
                return Err(Leaves::Short(format!(
                    "fleet leaf {} is missing from the hub",
                    next + 1
                )));
            }
            let leaf: String = r.get(1);
            out.push(leaf_hash(leaf.as_bytes()));
            next = seq;
        }
    }
    if next < to {
        return Err(Leaves::Short(format!(
            "the hub holds the fleet log up to size {next}, not {to}"
        )));
    }
    Ok(out)
}

/// The cosigned fleet checkpoints at sizes up to `fleet_size`: per size, the fleet
/// checkpoint `notes[size - 1]` with every stored cosignature line on it.
pub(crate) async fn cosigned_notes(
    pool: &deadpool_postgres::Pool,
    notes: &[&str],
) -> Result<Vec<(u64, String)>, FleetError> {
    let client = tokio::time::timeout(super::INGEST_TIMEOUT, pool.get())
        .await
        .map_err(|_| HubError::Unavailable("no database connection in time".into()))?
        .map_err(|e| pool_error(&e))?;
    let rows = client
        .query(
            "SELECT size, cosignature FROM hub_fleet_cosignatures WHERE size <= $1 ORDER BY size, witness LIMIT $2",
            &[&(notes.len() as i64), &(MAX_COSIGNATURE_ROWS + 1)],
        )
        .await
        .map_err(|e| db_error(&e))?;
    if rows.len() as i64 > MAX_COSIGNATURE_ROWS {
        return Err(FleetError::Witness(format!(
            "the hub holds more than {MAX_COSIGNATURE_ROWS} fleet cosignatures; not read"
        )));
    }
    let mut out: Vec<(u64, String)> = Vec::new();
    for r in &rows {
        let size = r.get::<_, i64>(0).max(1) as u64;
        let lines: String = r.get(1);
        match out.last_mut() {
            Some((at, note)) if *at == size => note.push_str(&lines),
            _ => {
                let Some(note) = notes.get(size as usize - 1) else {
                    continue;
                };
                out.push((size, format!("{note}{lines}")));
            }
        }
    }
    Ok(out)
}

/// Checks the stored cosignatures of the fleet checkpoints against `keys`: every
/// cosignature line by one of them must verify, and some fleet checkpoint must be
/// cosigned by `quorum` of them.
pub(crate) async fn check(
    pool: &deadpool_postgres::Pool,
    notes: &[&str],
    fleet_key: Option<&VerifierKey>,
    keys: &[WitnessKey],
    quorum: usize,
) -> Result<WitnessReport, FleetError> {
    let Some(fleet_key) = fleet_key else {
        return Err(FleetError::Witness(
            "the fleet log is empty: no fleet checkpoint was witnessed".into(),
        ));
    };
    let cosigned: Vec<String> = cosigned_notes(pool, notes)
        .await?
        .into_iter()
        .map(|(_, note)| note)
        .collect();
    match check_cosignatures(&cosigned, fleet_key, keys, quorum) {
        Ok((report, _)) => Ok(report),
        Err(WitnessProblem::BadCosignature(m) | WitnessProblem::NoQuorum(m)) => {
            Err(FleetError::Witness(format!("fleet log: {m}")))
        }
    }
}

/// The structured form of a witness problem (exit 3).
pub(crate) fn problem_json(message: &str) -> serde_json::Value {
    json!({
        "status": "failed",
        "kind": "witness",
        "sidecar": super::FLEET_ORIGIN,
        "seq": null,
        "message": message,
        "exit_code": 3,
    })
}
