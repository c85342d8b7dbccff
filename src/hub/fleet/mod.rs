//! `audit verify --cluster-db` and `audit export --cluster-db --run`: the hub read back
//! and checked from its rows alone (every sidecar's chain, tree and checkpoints, and
//! the fleet log over them), and one run's events from every sidecar written with the
//! proofs that tie each event to a signed sidecar checkpoint and each checkpoint to the
//! signed fleet checkpoint.
//!
//! INVARIANT: the hub is verified in full before anything is exported; a problem names
//! the sidecar (its origin) and the seq.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::{FLEET_ORIGIN, HubError, check_line, db_error, pool_error};
use crate::audit::checkpoint::verify_note;
use crate::audit::keys::VerifierKey;
use crate::audit::line::GENESIS_PREV;
use crate::audit::merkle::{Frontier, Hash, leaf_hash};
use crate::audit::verify::ProblemKind;

/// How many rows one query reads.
mod export;
pub use export::{FleetExportSummary, export};

const PAGE: i64 = 5000;
/// What the fleet export manifest's signature (by the fleet key) covers, before the
/// bytes of manifest.json.
pub const FLEET_MANIFEST_DOMAIN: &str = "toolgate-fleet-export-manifest/1\n";
/// The most cosigned fleet checkpoints an export carries (the newest ones).
const MAX_EXPORTED_COSIGNED: usize = 64;

/// The first problem found in the hub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetProblem {
    pub kind: ProblemKind,
    /// The sidecar's origin, or `toolgate/fleet` for the fleet log.
    pub sidecar: Option<String>,
    pub seq: Option<u64>,
    pub message: String,
}

impl std::fmt::Display for FleetProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind.as_str())?;
        if let Some(s) = &self.sidecar {
            write!(f, " in sidecar `{s}`")?;
        }
        if let Some(seq) = self.seq {
            write!(f, " at seq {seq}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a fleet verify or export did not pass.
#[derive(Debug, Clone)]
pub enum FleetError {
    /// The hub could not be read.
    Hub(HubError),
    /// The hub is not intact.
    Problem(FleetProblem),
    /// The export's output directory exists and is not empty, or cannot be written.
    Output(String),
    /// The fleet checkpoints' cosignatures (`--witness-key`) do not verify or reach no
    /// quorum.
    Witness(String),
}

impl From<HubError> for FleetError {
    fn from(e: HubError) -> Self {
        FleetError::Hub(e)
    }
}

fn problem(
    kind: ProblemKind,
    sidecar: &str,
    seq: Option<u64>,
    message: impl Into<String>,
) -> FleetError {
    FleetError::Problem(FleetProblem {
        kind,
        sidecar: Some(sidecar.to_string()),
        seq,
        message: message.into(),
    })
}

/// One sidecar log in the hub, verified.
#[derive(Debug, Clone, Serialize)]
pub struct SidecarReport {
    pub origin: String,
    pub events: u64,
    pub checkpoints: u64,
    pub key_fingerprint: String,
}

/// The summary of an intact hub.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    pub sidecars: Vec<SidecarReport>,
    pub fleet_size: u64,
    /// The fleet tree's root, hex.
    pub fleet_root: String,
    /// The fingerprint of the fleet key every fleet checkpoint verified with (None:
    /// the fleet log is empty and bound to no key yet).
    pub fleet_key_fingerprint: Option<String>,
    /// Whether it is the fingerprint given (`--fleet-key-fingerprint`); without one
    /// the key bound in the hub is trusted as found.
    pub fleet_key_confirmed: bool,
    /// With `--witness-key`: the fleet checkpoints' cosignatures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub witnesses: Option<crate::audit::witness::WitnessReport>,
}

/// What export builds on.
struct Verified {
    report: FleetReport,
    keys: BTreeMap<String, VerifierKey>,
    /// The fleet key (None: the fleet log is empty).
    fleet_key: Option<VerifierKey>,
    /// Per origin, every leaf hash from seq 1.
    leaves: BTreeMap<String, Vec<Hash>>,
    /// The fleet rows: (origin, sidecar size, leaf note, fleet note), fleet seq order.
    fleet: Vec<(String, u64, String, String)>,
    /// With a run: its events per origin, (seq, line) in seq order, read in the same
    /// snapshot.
    run_rows: BTreeMap<String, Vec<(u64, String)>>,
    /// With a run: the sidecars that hold events of it the hub does not have yet
    /// (`hub_unshipped`), each with the first seq it may hold them from.
    unshipped: Vec<(String, u64)>,
}

async fn client(pool: &deadpool_postgres::Pool) -> Result<deadpool_postgres::Client, HubError> {
    tokio::time::timeout(super::INGEST_TIMEOUT, pool.get())
        .await
        .map_err(|_| HubError::Unavailable("no database connection in time".into()))?
        .map_err(|e| pool_error(&e))
}

/// Verifies every sidecar log in the hub and the fleet log; every fleet checkpoint
/// must verify with the one fleet key the hub is bound to, and that key must have
/// `fleet_key_fingerprint` when one is given.
pub async fn verify(
    pool: &deadpool_postgres::Pool,
    fleet_key_fingerprint: Option<&str>,
    witnesses: Option<(&[crate::audit::witness::WitnessKey], usize)>,
) -> Result<FleetReport, FleetError> {
    let verified = verify_all(pool, false, fleet_key_fingerprint, None).await?;
    let mut report = verified.report;
    if let Some((keys, quorum)) = witnesses {
        let notes: Vec<&str> = verified.fleet.iter().map(|f| f.3.as_str()).collect();
        report.witnesses = Some(
            super::witness::check(pool, &notes, verified.fleet_key.as_ref(), keys, quorum).await?,
        );
    }
    Ok(report)
}

/// The fleet key bound in the hub (`hub_fleet_head.vkey`), checked against the pinned
/// fingerprint; None when the fleet log is empty and no pin is given.
fn fleet_key(
    bound: Option<String>,
    fleet_rows: usize,
    pin: Option<&str>,
) -> Result<Option<VerifierKey>, FleetError> {
    let key_problem = |message: String| problem(ProblemKind::Key, FLEET_ORIGIN, None, message);
    let key = match bound {
        Some(vkey) => Some(VerifierKey::parse_vkey(&vkey).map_err(|e| {
            key_problem(format!("the fleet key bound in the hub is unusable: {e}"))
        })?),
        None if fleet_rows > 0 => {
            return Err(key_problem(
                "the fleet log holds checkpoints but the hub has no fleet key bound: the hub row was edited".into(),
            ));
        }
        None => None,
    };
    if let Some(pin) = pin {
        let pin = pin.trim().to_ascii_lowercase();
        match &key {
            Some(key) if key.fingerprint() == pin => {}
            Some(key) => {
                return Err(key_problem(format!(
                    "the fleet key bound in the hub has fingerprint {}, not the {pin} you gave: fleet checkpoints signed with another key",
                    key.fingerprint()
                )));
            }
            None => {
                return Err(key_problem(format!(
                    "the fleet log is empty: no fleet key to confirm as {pin}"
                )));
            }
        }
    }
    Ok(key)
}

async fn verify_all(
    pool: &deadpool_postgres::Pool,
    keep: bool,
    pin: Option<&str>,
    run: Option<&str>,
) -> Result<Verified, FleetError> {
    let client = client(pool).await?;
    // One snapshot of every table.
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .map_err(hub_error)?;
    let logs = client
        .query(
            "SELECT origin, vkey, size, checkpoint_size FROM hub_logs ORDER BY origin",
            &[],
        )
        .await
        .map_err(hub_error)?;
    let mut keys = BTreeMap::new();
    let mut all_leaves = BTreeMap::new();
    let mut sidecars = Vec::new();
    let mut checkpoint_count = 0u64;
    for row in &logs {
        let origin: String = row.get(0);
        let vkey: String = row.get(1);
        let size = row.get::<_, i64>(2).max(0) as u64;
        let key = VerifierKey::parse_vkey(&vkey).map_err(|e| {
            problem(
                ProblemKind::Key,
                &origin,
                None,
                format!("the registered key is unusable: {e}"),
            )
        })?;
        let wanted = sidecar_checkpoints(&client, &origin, &key).await?;
        checkpoint_count += wanted.len() as u64;
        let leaves = sidecar_chain(&client, &origin, size, &wanted, keep).await?;
        sidecars.push(SidecarReport {
            origin: origin.clone(),
            events: leaves.size,
            checkpoints: wanted.len() as u64,
            key_fingerprint: key.fingerprint(),
        });
        keys.insert(origin.clone(), key);
        if keep {
            all_leaves.insert(origin, leaves.hashes);
        }
    }
    let (frontier, fleet, fleet_key) = fleet_log(&client, &keys, pin).await?;
    if (fleet.len() as u64) != checkpoint_count {
        return Err(FleetError::Problem(FleetProblem {
            kind: ProblemKind::Missing,
            sidecar: Some(FLEET_ORIGIN.to_string()),
            seq: None,
            message: format!(
                "the hub holds {checkpoint_count} sidecar checkpoints but the fleet log {}: one was added or removed outside ingest",
                fleet.len()
            ),
        }));
    }
    let (run_rows, unshipped) = match run {
        Some(run) => run_evidence(&client, run).await?,
        None => (BTreeMap::new(), Vec::new()),
    };
    client.batch_execute("COMMIT").await.map_err(hub_error)?;
    Ok(Verified {
        report: FleetReport {
            sidecars,
            fleet_size: frontier.size(),
            fleet_root: crate::canonical::to_hex(frontier.root()),
            fleet_key_fingerprint: fleet_key.as_ref().map(VerifierKey::fingerprint),
            fleet_key_confirmed: pin.is_some(),
            witnesses: None,
        },
        keys,
        fleet_key,
        leaves: all_leaves,
        fleet,
        run_rows,
        unshipped,
    })
}

fn hub_error(e: tokio_postgres::Error) -> FleetError {
    FleetError::Hub(db_error(&e))
}

/// A sidecar's signed checkpoints, each verified with its key: the root signed at
/// each size.
async fn sidecar_checkpoints(
    client: &deadpool_postgres::Client,
    origin: &str,
    key: &VerifierKey,
) -> Result<BTreeMap<u64, Hash>, FleetError> {
    let rows = client
        .query(
            "SELECT size, note FROM hub_checkpoints WHERE origin = $1 ORDER BY size",
            &[&origin],
        )
        .await
        .map_err(hub_error)?;
    let mut wanted: BTreeMap<u64, Hash> = BTreeMap::new();
    for r in &rows {
        let at = r.get::<_, i64>(0).max(0) as u64;
        let note: String = r.get(1);
        let checkpoint = verify_note(&note, key).map_err(|e| {
            problem(
                ProblemKind::Signature,
                origin,
                Some(at),
                format!("the checkpoint at size {at} does not verify with the sidecar's key: {e}"),
            )
        })?;
        if checkpoint.origin != origin || checkpoint.size != at {
            return Err(problem(
                ProblemKind::Edited,
                origin,
                Some(at),
                format!(
                    "the checkpoint stored at size {at} is of `{}` size {}",
                    checkpoint.origin, checkpoint.size
                ),
            ));
        }
        wanted.insert(at, checkpoint.root);
    }
    Ok(wanted)
}

/// A sidecar's chain as the hub holds it.
struct Leaves {
    size: u64,
    /// Every leaf hash from seq 1, when kept.
    hashes: Vec<Hash>,
}

/// Walks a sidecar's lines page by page: each chains to the one before, the lines
/// under each signed checkpoint hash to its root, none is missing, injected or
/// beyond the last checkpoint.
async fn sidecar_chain(
    client: &deadpool_postgres::Client,
    origin: &str,
    size: u64,
    wanted: &BTreeMap<u64, Hash>,
    keep: bool,
) -> Result<Leaves, FleetError> {
    let mut frontier = Frontier::new();
    let mut prev = GENESIS_PREV.to_string();
    let mut leaves = Vec::new();
    let mut last_good = 0u64;
    loop {
        let rows = client
            .query(
                "SELECT seq, line FROM hub_events WHERE origin = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                &[&origin, &(frontier.size() as i64), &PAGE],
            )
            .await
            .map_err(hub_error)?;
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            let seq = r.get::<_, i64>(0).max(0) as u64;
            let line: String = r.get(1);
            let expected = frontier.size() + 1;
            if seq != expected {
                return Err(problem(
                    ProblemKind::Missing,
                    origin,
                    Some(expected),
                    format!("seq {expected} is missing from the hub (the next row is seq {seq})"),
                ));
            }
            if seq > size {
                return Err(problem(
                    ProblemKind::Inserted,
                    origin,
                    Some(seq),
                    format!("a row beyond the {size} lines the hub accepted: injected"),
                ));
            }
            let hash = match check_line(origin, seq, &prev, &line) {
                Ok(hash) => hash,
                // The line before changed after this one was chained to it.
                Err(HubError::Fork { .. }) => {
                    return Err(problem(
                        ProblemKind::Edited,
                        origin,
                        Some(seq - 1),
                        format!(
                            "the line changed after seq {seq} was chained to it: seq {seq}'s prev does not match its hash"
                        ),
                    ));
                }
                Err(e) => {
                    return Err(problem(
                        ProblemKind::Edited,
                        origin,
                        Some(seq),
                        e.to_string(),
                    ));
                }
            };
            frontier.push(hash);
            if keep {
                leaves.push(hash);
            }
            prev = crate::canonical::to_hex(hash);
            if let Some(root) = wanted.get(&seq) {
                if *root != frontier.root() {
                    // Every line before chains to the next, so only this last
                    // line under the checkpoint can differ from what was signed.
                    return Err(problem(
                        ProblemKind::Edited,
                        origin,
                        Some(seq),
                        format!(
                            "the lines up to seq {seq} do not hash to the signed checkpoint at size {seq}, and every earlier line chains to the next: seq {seq} was edited"
                        ),
                    ));
                }
                last_good = seq;
            }
        }
    }
    if frontier.size() < size {
        return Err(problem(
            ProblemKind::Truncated,
            origin,
            Some(frontier.size() + 1),
            format!(
                "the hub accepted {size} lines but holds {}: rows were removed",
                frontier.size()
            ),
        ));
    }
    if let Some((&cut, _)) = wanted.range(frontier.size() + 1..).next() {
        return Err(problem(
            ProblemKind::Truncated,
            origin,
            Some(frontier.size() + 1),
            format!(
                "a signed checkpoint covers {cut} lines but the hub holds {}",
                frontier.size()
            ),
        ));
    }
    if last_good < frontier.size() {
        return Err(problem(
            ProblemKind::Unsigned,
            origin,
            Some(last_good + 1),
            format!(
                "seq {}..{} are covered by no signed checkpoint: every batch is shipped with one",
                last_good + 1,
                frontier.size()
            ),
        ));
    }
    Ok(Leaves {
        size: frontier.size(),
        hashes: leaves,
    })
}

/// The fleet log (fleet seq order): each leaf is a sidecar checkpoint the hub holds,
/// each fleet checkpoint verifies with the fleet key and covers the leaves up to it.
async fn fleet_log(
    client: &deadpool_postgres::Client,
    keys: &BTreeMap<String, VerifierKey>,
    pin: Option<&str>,
) -> Result<FleetLog, FleetError> {
    let fleet_rows = client
        .query(
            "SELECT seq, origin, size, leaf, note FROM hub_fleet ORDER BY seq",
            &[],
        )
        .await
        .map_err(hub_error)?;
    let stored: std::collections::HashMap<(String, i64), String> = client
        .query("SELECT origin, size, note FROM hub_checkpoints", &[])
        .await
        .map_err(hub_error)?
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    let bound: Option<String> = client
        .query_one("SELECT vkey FROM hub_fleet_head WHERE id = 1", &[])
        .await
        .map_err(hub_error)?
        .get(0);
    let fleet_key = fleet_key(bound, fleet_rows.len(), pin)?;
    let mut frontier = Frontier::new();
    let mut fleet = Vec::new();
    for r in &fleet_rows {
        let seq = r.get::<_, i64>(0).max(0) as u64;
        let origin: String = r.get(1);
        let size: i64 = r.get(2);
        let leaf: String = r.get(3);
        let note: String = r.get(4);
        let fleet_problem = |kind, message: String| problem(kind, FLEET_ORIGIN, Some(seq), message);
        if seq != frontier.size() + 1 {
            return Err(fleet_problem(
                ProblemKind::Missing,
                format!("fleet leaf {} is missing", frontier.size() + 1),
            ));
        }
        if stored.get(&(origin.clone(), size)) != Some(&leaf) {
            return Err(fleet_problem(
                ProblemKind::Edited,
                format!(
                    "the fleet leaf is not the checkpoint of sidecar `{origin}` at size {size} the hub holds"
                ),
            ));
        }
        if !keys.contains_key(&origin) {
            return Err(fleet_problem(
                ProblemKind::Key,
                format!("no sidecar `{origin}` is registered"),
            ));
        }
        let Some(key) = &fleet_key else {
            return Err(fleet_problem(
                ProblemKind::Key,
                "no fleet key is bound in the hub".into(),
            ));
        };
        frontier.push(leaf_hash(leaf.as_bytes()));
        let checkpoint = verify_note(&note, key).map_err(|e| {
            fleet_problem(
                ProblemKind::Signature,
                format!(
                    "fleet checkpoint {seq} does not verify with the fleet key (fingerprint {}): {e}",
                    key.fingerprint()
                ),
            )
        })?;
        if checkpoint.origin != FLEET_ORIGIN
            || checkpoint.size != seq
            || checkpoint.root != frontier.root()
        {
            return Err(fleet_problem(
                ProblemKind::RootMismatch,
                "the fleet checkpoint does not match the fleet leaves up to it".into(),
            ));
        }
        fleet.push((origin, size.max(0) as u64, leaf, note));
    }
    Ok((frontier, fleet, fleet_key))
}

/// The fleet tree, its rows (origin, sidecar size, leaf note, fleet note) and key.
type FleetLog = (
    Frontier,
    Vec<(String, u64, String, String)>,
    Option<VerifierKey>,
);

/// The run's events per origin and the sidecars that hold more of it, read in the
/// verification's snapshot: a mark removed in it means its events are in it.
async fn run_evidence(
    client: &deadpool_postgres::Client,
    run: &str,
) -> Result<RunEvidence, FleetError> {
    let mut run_rows: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    let mut unshipped = Vec::new();
    for r in client
        .query(
            "SELECT origin, seq, line FROM hub_events WHERE run_id = $1 ORDER BY origin, seq",
            &[&run],
        )
        .await
        .map_err(hub_error)?
    {
        run_rows
            .entry(r.get(0))
            .or_default()
            .push((r.get::<_, i64>(1).max(0) as u64, r.get(2)));
    }
    for r in client
        .query(
            "SELECT origin, since_seq FROM hub_unshipped WHERE run_id = $1 ORDER BY origin",
            &[&run],
        )
        .await
        .map_err(hub_error)?
    {
        unshipped.push((r.get(0), r.get::<_, i64>(1).max(0) as u64));
    }
    Ok((run_rows, unshipped))
}

/// A run's rows per origin, (seq, line), and the sidecars holding unshipped events of it.
type RunEvidence = (BTreeMap<String, Vec<(u64, String)>>, Vec<(String, u64)>);

/// The structured form of a fleet error.
pub fn error_json(error: &FleetError) -> Value {
    match error {
        FleetError::Hub(e) => {
            let mut v = e.to_json();
            v["status"] = "failed".into();
            v
        }
        FleetError::Problem(p) => json!({
            "status": "failed",
            "kind": p.kind,
            "sidecar": p.sidecar,
            "seq": p.seq,
            "message": p.message,
            "exit_code": p.kind.exit_code(),
        }),
        FleetError::Output(m) => {
            json!({"status": "failed", "error": "export_output", "message": m})
        }
        FleetError::Witness(m) => super::witness::problem_json(m),
    }
}
