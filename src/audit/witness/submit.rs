//! The witness task, one per `--witness`: every interval it offers the log's newest
//! checkpoint to its witness with the consistency proof from the size the witness
//! stands at, after checking that the log's leaves hash to that checkpoint. A witness
//! further behind than [`MAX_LEAVES_PER_SUBMISSION`] leaves is brought up in several
//! submissions, each through a stored checkpoint (bounded memory).
//!
//! The same task serves the sidecar's own log (`local.rs`) and the fleet log in the
//! audit hub (`hub::witness`); where the checkpoints, leaves and cosignatures are kept
//! is the log's ([`WitnessedLog`]).
//!
//! How an answer is read (c2sp.org/tlog-witness):
//! - 200 with a cosignature by the witness's key: stored by the log, and the next
//!   submission starts from that size.
//! - 409 naming another size than the proof starts from: the task rebuilds the tree's
//!   right edge at that size and sends again. In a fleet that is routine (another
//!   sidecar moved the witness). For one log, a witness behind the cosignatures the
//!   log stored is counted as a conflict (it lost what it cosigned); a witness ahead
//!   of them is not, as the log's store lost its newest cosignatures (the sidecar
//!   stopped between the witness's answer and the store, or the file was replaced by
//!   an older copy): the proof from the witness's size shows any other history (a
//!   422), and a witness standing at the newest checkpoint is offered it again with an
//!   empty proof, which it cosigns again only if its root is ours. A size beyond the
//!   log means the log was cut.
//! - 409 at the same size, or 422 (the proof does not verify): the witness saw another
//!   history, a fork. Counted, nothing stored, offered again next round.
//! - Anything else: a failure, retried next round.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{
    Answer, CONNECT_TIMEOUT, MAX_LEAVES_PER_SUBMISSION, REQUEST_TIMEOUT, Refusal, WitnessConfig,
    WitnessKey, WitnessStatus, add_checkpoint,
};
use crate::audit::checkpoint::verify_note;
use crate::audit::keys::VerifierKey;
use crate::audit::merkle::{Frontier, Hash, consistency_proof_extending};
use crate::outbound::{self, error_chain};

/// Why a log's leaves could not be read.
pub(crate) enum Unread {
    /// The store cannot be read now: retried next round.
    Unavailable(String),
    /// The log holds fewer leaves than asked for, or has a gap.
    Short(String),
}

impl Unread {
    fn into_message(self) -> String {
        match self {
            Unread::Unavailable(what) | Unread::Short(what) => what,
        }
    }
}

/// A log whose checkpoints witnesses cosign, as the witness task reads and writes it.
pub(crate) trait WitnessedLog: Send + Sync + 'static {
    /// What messages call the log (`log`, `fleet log`).
    const NAME: &'static str;
    /// Whether several submitters (the sidecars of a fleet) offer this log to the same
    /// witness: a witness standing at another size, even beyond the newest checkpoint
    /// this one read, was moved by another.
    const SHARED: bool;

    /// The key the log's checkpoints are signed with.
    fn log_key(&self) -> &VerifierKey;

    /// The newest checkpoint (size, note); None while there is none.
    fn newest(&self) -> impl Future<Output = Result<Option<(u64, String)>, String>> + Send;

    /// The checkpoint to offer a witness standing at `have` when `newest` is more than
    /// one submission ahead: a stored one of at most `limit` leaves.
    fn checkpoint_towards(
        &self,
        have: u64,
        limit: u64,
        newest: &(u64, String),
    ) -> impl Future<Output = Result<(u64, String), String>> + Send;

    /// The largest size `witness` cosigned, as stored by this log (0: none).
    fn stored_position(
        &self,
        witness: &WitnessKey,
    ) -> impl Future<Output = Result<u64, String>> + Send;

    /// The tree's right edge at `size`.
    fn frontier_at(&self, size: u64) -> impl Future<Output = Result<Frontier, Unread>> + Send;

    /// The leaf hashes of `from + 1 ..= to`.
    fn leaves_between(
        &self,
        from: u64,
        to: u64,
    ) -> impl Future<Output = Result<Vec<Hash>, Unread>> + Send;

    /// Keeps `witness`'s signature `lines` on the checkpoint `note` of `size` leaves.
    fn store(
        &self,
        witness: &WitnessKey,
        size: u64,
        note: &str,
        lines: &str,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// Starts one task per witness on the current tokio runtime; returns their status
/// (`/metrics`).
pub(crate) fn start<L: WitnessedLog>(
    log: Arc<L>,
    witnesses: &[WitnessConfig],
    interval: Duration,
) -> Result<Vec<Arc<WitnessStatus>>, String> {
    let client = outbound::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build the witness client: {}", error_chain(&e)))?;
    let mut statuses = Vec::new();
    for witness in witnesses {
        let status = Arc::new(WitnessStatus::new(&witness.key.name));
        statuses.push(status.clone());
        let task = Submitter {
            log: log.clone(),
            witness: witness.clone(),
            client: client.clone(),
            status,
            interval,
            frontier: None,
            stored: 0,
        };
        tokio::spawn(task.run());
    }
    Ok(statuses)
}

struct Submitter<L> {
    log: Arc<L>,
    witness: WitnessConfig,
    client: reqwest::Client,
    status: Arc<WitnessStatus>,
    interval: Duration,
    /// The tree's right edge at the size the witness stands at (as far as known).
    frontier: Option<Frontier>,
    /// The largest size whose cosignature by this witness the log holds (as far as
    /// known; a fleet's is stored by whichever sidecar got it).
    stored: u64,
}

/// How one submission ended.
enum Outcome {
    Cosigned,
    /// The witness stands at another size: start again from there.
    Resync(u64),
    Failed(String),
}

impl<L: WitnessedLog> Submitter<L> {
    async fn run(mut self) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            ticker.tick().await;
            match self.round().await {
                Ok(()) => {
                    if failing {
                        tracing::info!(witness = %self.witness.key.name, log = L::NAME, "witness cosigns again");
                    }
                    failing = false;
                }
                Err(error) => {
                    self.status.failures.fetch_add(1, Ordering::Relaxed);
                    if !failing {
                        tracing::warn!(witness = %self.witness.key.name, log = L::NAME, error = %error, "witness submission failed; the checkpoint stays signed and is offered again next round");
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

    /// Offers the newest checkpoint, catching the witness up first if needed.
    async fn round(&mut self) -> Result<(), String> {
        let Some(newest) = self.log.newest().await? else {
            return Ok(());
        };
        let size = newest.0;
        self.status.checkpoint_size.store(size, Ordering::Relaxed);
        if self.frontier.is_none() {
            let from = self.log.stored_position(&self.witness.key).await?;
            self.stored = from;
            self.resync(from).await?;
        }
        // Bounded: each resync answer moves the start; give up after a few.
        for _ in 0..4 {
            let have = self.frontier.as_ref().map_or(0, Frontier::size);
            // A witness already at the newest checkpoint whose cosignature this log
            // lost is offered it again (an empty proof) to store its cosignature.
            let lost = !L::SHARED && have == size && self.stored < size;
            if have >= size && !lost {
                return Ok(());
            }
            let (target, note) = if size - have > MAX_LEAVES_PER_SUBMISSION {
                let limit = have + MAX_LEAVES_PER_SUBMISSION;
                self.log.checkpoint_towards(have, limit, &newest).await?
            } else {
                newest.clone()
            };
            match self.submit(target, &note).await? {
                Outcome::Cosigned => continue,
                Outcome::Resync(at) => self.resync(at).await?,
                Outcome::Failed(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Rebuilds the tree's right edge at `size` from the log.
    async fn resync(&mut self, size: u64) -> Result<(), String> {
        let frontier = match self.log.frontier_at(size).await {
            Ok(frontier) => frontier,
            Err(Unread::Short(what)) => {
                self.status.conflicts.fetch_add(1, Ordering::Relaxed);
                let (name, log) = (&self.witness.key.name, L::NAME);
                return Err(format!(
                    "witness `{name}` stands at {log} size {size}: {what} (the {log} was cut, or the witness saw another {log})"
                ));
            }
            Err(Unread::Unavailable(what)) => return Err(what),
        };
        // The gauge counts cosignatures the log holds: a fleet's witness was moved by a
        // sidecar that stored its cosignature in the hub; a witness standing beyond what
        // this one log stored counts once its cosignature is stored again.
        if L::SHARED || frontier.size() <= self.stored {
            self.status
                .cosigned_size
                .fetch_max(frontier.size(), Ordering::Relaxed);
        }
        self.frontier = Some(frontier);
        Ok(())
    }

    /// One add-checkpoint request for the checkpoint `note` of `size` leaves.
    async fn submit(&mut self, size: u64, note: &str) -> Result<Outcome, String> {
        let Some(old) = self.frontier.clone() else {
            return Ok(Outcome::Resync(0));
        };
        let log = L::NAME;
        let from = old.size();
        let appended = self
            .log
            .leaves_between(from, size)
            .await
            .map_err(Unread::into_message)?;
        let mut new = old.clone();
        for leaf in &appended {
            new.push(*leaf);
        }
        let checkpoint = verify_note(note, self.log.log_key()).map_err(|e| {
            format!("the {log} checkpoint at size {size} does not verify with the {log}'s key: {e}")
        })?;
        if checkpoint.size != size || new.root() != checkpoint.root {
            return Err(format!(
                "the {log}'s leaves do not hash to its checkpoint at size {size}: not offered"
            ));
        }
        let proof = consistency_proof_extending(&old, &appended);
        let answer = add_checkpoint(&self.client, &self.witness, from, &proof, note).await?;
        let (lines, timestamp) = match answer {
            Answer::Cosigned { lines, timestamp } => (lines, timestamp),
            Answer::Refused(refusal) => return Ok(self.refused(refusal, from, size)),
        };
        self.log
            .store(&self.witness.key, size, note, &lines)
            .await?;
        tracing::debug!(witness = %self.witness.key.name, log, size, timestamp, "checkpoint cosigned");
        self.status.cosigned_size.fetch_max(size, Ordering::Relaxed);
        self.frontier = Some(new);
        self.stored = size;
        Ok(Outcome::Cosigned)
    }

    /// What a refusal of the checkpoint of `size` leaves, proven from `from`, means
    /// (module docs); a conflict is counted in the witness's status.
    fn refused(&self, refusal: Refusal, from: u64, size: u64) -> Outcome {
        let (name, log) = (&self.witness.key.name, L::NAME);
        let conflict = || {
            self.status.conflicts.fetch_add(1, Ordering::Relaxed);
        };
        match refusal {
            Refusal::Conflict(Some(at)) if at != from && (L::SHARED || at <= size) => {
                if !L::SHARED && at < self.stored {
                    conflict();
                } else if !L::SHARED && at > self.stored {
                    tracing::warn!(witness = %name, log, at, stored = self.stored, "the witness stands beyond the cosignatures this log stored; offering from its size");
                }
                Outcome::Resync(at)
            }
            Refusal::Conflict(Some(at)) if at > size => {
                conflict();
                Outcome::Failed(format!(
                    "witness `{name}` has cosigned {at} leaves of this {log}, more than the {size} it holds: the {log} was cut"
                ))
            }
            Refusal::Conflict(theirs) => {
                conflict();
                Outcome::Failed(format!(
                    "witness `{name}` refuses the {log} checkpoint at size {size} as conflicting with the one it cosigned (size {}): the {log} forked",
                    theirs.map_or_else(|| "unknown".to_string(), |s| s.to_string())
                ))
            }
            Refusal::Status(422, _) => {
                conflict();
                Outcome::Failed(format!(
                    "witness `{name}` refuses the consistency proof from {log} size {from} to {size}: it saw another {log} (a fork)"
                ))
            }
            Refusal::Status(code, text) => {
                Outcome::Failed(format!("witness `{name}` answered {code}: {text}"))
            }
        }
    }
}
