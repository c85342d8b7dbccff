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
//! nothing is stored. The task itself is the one of a single log
//! (`audit::witness::submit`); this file is where the fleet log keeps what it reads and
//! stores ([`FleetLog`]).
//!
//! INVARIANT: as for a single log, witnessing never delays or refuses a call: the
//! tasks read the hub over the shipper's pool and share nothing with the writer.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::fleet::FleetError;
use super::{HubError, db_error, pool_error};
use crate::audit::keys::VerifierKey;
use crate::audit::merkle::{Frontier, Hash, leaf_hash};
use crate::audit::witness::submit::{self, Unread, WitnessedLog};
use crate::audit::witness::{
    WitnessConfig, WitnessKey, WitnessProblem, WitnessReport, WitnessStatus, check_cosignatures,
};

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
    let log = FleetLog {
        pool,
        fleet_key: options.fleet_key,
        origin: options.origin,
    };
    submit::start(Arc::new(log), &options.witnesses, options.interval)
}

/// The fleet log in the hub: its leaves and checkpoints in `hub_fleet`, the
/// cosignatures in `hub_fleet_cosignatures`.
struct FleetLog {
    pool: deadpool_postgres::Pool,
    fleet_key: VerifierKey,
    /// This sidecar's origin, stored with the cosignatures it stores.
    origin: String,
}

impl WitnessedLog for FleetLog {
    const NAME: &'static str = "fleet log";
    const SHARED: bool = true;

    fn log_key(&self) -> &VerifierKey {
        &self.fleet_key
    }

    async fn newest(&self) -> Result<Option<(u64, String)>, String> {
        fleet_note(&self.pool, None).await
    }

    /// Every fleet size has its checkpoint: the one at `limit`.
    async fn checkpoint_towards(
        &self,
        _have: u64,
        limit: u64,
        _newest: &(u64, String),
    ) -> Result<(u64, String), String> {
        fleet_note(&self.pool, Some(limit))
            .await?
            .ok_or_else(|| format!("the hub holds no fleet checkpoint at size {limit}"))
    }

    async fn stored_position(&self, witness: &WitnessKey) -> Result<u64, String> {
        let client = connection(&self.pool).await?;
        let row = client
            .query_one(
                "SELECT coalesce(max(size), 0) FROM hub_fleet_cosignatures WHERE witness = $1",
                &[&witness.to_vkey()],
            )
            .await
            .map_err(|e| db_error(&e).to_string())?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    async fn frontier_at(&self, size: u64) -> Result<Frontier, Unread> {
        let mut frontier = Frontier::new();
        for leaf in fleet_leaves(&self.pool, 0, size).await? {
            frontier.push(leaf);
        }
        Ok(frontier)
    }

    async fn leaves_between(&self, from: u64, to: u64) -> Result<Vec<Hash>, Unread> {
        fleet_leaves(&self.pool, from, to).await
    }

    /// Stores the witness's lines on the fleet checkpoint at `size`, once.
    async fn store(
        &self,
        witness: &WitnessKey,
        size: u64,
        _note: &str,
        lines: &str,
    ) -> Result<(), String> {
        let client = connection(&self.pool).await?;
        client
            .execute(
                "INSERT INTO hub_fleet_cosignatures (witness, size, cosignature, stored_by) VALUES ($1, $2, $3, $4) ON CONFLICT (witness, size) DO NOTHING",
                &[&witness.to_vkey(), &(size as i64), &lines, &self.origin],
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

/// The fleet leaf hashes of seq `from + 1 ..= to`, page by page.
async fn fleet_leaves(
    pool: &deadpool_postgres::Pool,
    from: u64,
    to: u64,
) -> Result<Vec<Hash>, Unread> {
    let client = connection(pool).await.map_err(Unread::Unavailable)?;
    let mut out = Vec::with_capacity(to.saturating_sub(from).min(1 << 16) as usize);
    let mut next = from;
    while next < to {
        let rows = client
            .query(
                "SELECT seq, leaf FROM hub_fleet WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3",
                &[&(next as i64), &(to as i64), &PAGE],
            )
            .await
            .map_err(|e| Unread::Unavailable(db_error(&e).to_string()))?;
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            let seq = r.get::<_, i64>(0).max(0) as u64;
            if seq != next + 1 {
                return Err(Unread::Short(format!(
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
        return Err(Unread::Short(format!(
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
