//! Which runs this sidecar holds events of that the hub does not have yet, marked in
//! the cluster database (`hub_unshipped`, one row per origin and run), so that a fleet
//! export never calls a run complete while a sidecar holds more of it (docs/audit.md,
//! "Fleet export").
//!
//! A run is marked before the first of its events is appended: the audit log asks
//! [`Tail`] (its [`RunMarks`]) before every append that names a run, and an append of
//! a run not marked yet waits for the row, at most [`MARK_TIMEOUT`]. The shipper
//! removes the mark ([`Tail::settle`]) once the hub holds every event of the run this
//! sidecar appended and none is being appended; the next event of the run marks it
//! again. A mark that could not be written (the database unreachable) is owed: the
//! append goes ahead (the local log comes first), and the shipper writes the mark
//! before it ships again. At start the runs of the local events the hub does not hold
//! yet are marked ([`Tail::mark_backlog`]), and the marks an earlier run of this
//! sidecar left are removed once the hub holds everything this log had at start.
//!
//! INVARIANT: an event of run R in this sidecar's log is in the hub, or (origin, R) is
//! in `hub_unshipped`, or the database could not be reached since the event was
//! appended (the mark is owed). A mark is removed only by the holder that wrote it
//! last (`holder`, `generation`), and only when the hub holds the run's events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{HubError, db_error, pool_error};
use crate::audit::{AuditLog, MarkWait, RunMarks};

/// The table of marks (a versioned migration of the cluster database).
pub const SCHEMA: &str = "
CREATE TABLE hub_unshipped (
    origin text NOT NULL,
    run_id text NOT NULL,
    holder text NOT NULL,
    generation bigint NOT NULL,
    since_seq bigint NOT NULL,
    marked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (origin, run_id)
);
CREATE INDEX hub_unshipped_run ON hub_unshipped (run_id);
";

/// The longest an append waits for its run's mark; past it the mark is owed.
pub const MARK_TIMEOUT: Duration = Duration::from_secs(2);
/// After a mark could not be written, appends do not wait for one again for this
/// long (the shipper writes the owed marks).
const DOWN_FOR: Duration = Duration::from_secs(1);

/// One run this sidecar holds (or is appending) events of.
#[derive(Debug, Default)]
struct Run {
    /// Appends of the run in progress.
    in_flight: u32,
    /// The seq of its newest event known to be in the local log.
    max_seq: u64,
    /// An append of it failed or was dropped: it may still be committed, so the run
    /// is not released before the log settles ([`crate::audit::AuditLog::settled_head`]).
    uncertain: bool,
    /// The generation of the row written for it (None: not written yet, or owed).
    marked: Option<i64>,
}

#[derive(Debug, Default)]
struct State {
    runs: HashMap<String, Run>,
    next_generation: i64,
    /// Until when appends do not wait for a mark (the database was unreachable).
    down_until: Option<Instant>,
    /// Whether the marks of earlier lives of this sidecar were removed.
    earlier_cleared: bool,
}

/// The marks of one sidecar's runs (see the module docs).
pub struct Tail {
    pool: deadpool_postgres::Pool,
    origin: String,
    /// This process: marks it did not write are an earlier life's.
    holder: String,
    /// The local log's size when shipping started.
    start_size: u64,
    /// The runtime the database connections live on (appends run on others too).
    runtime: tokio::runtime::Handle,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("origin", &self.origin)
            .field("holder", &self.holder)
            .finish()
    }
}

impl Tail {
    /// The marks of `origin`'s runs, for a log of `start_size` events now; its
    /// database work runs on the current runtime.
    pub fn new(pool: deadpool_postgres::Pool, origin: &str, start_size: u64) -> Arc<Tail> {
        Arc::new(Tail {
            pool,
            origin: origin.to_string(),
            holder: uuid::Uuid::new_v4().simple().to_string(),
            start_size,
            runtime: tokio::runtime::Handle::current(),
            state: Arc::new(Mutex::new(State {
                next_generation: 1,
                ..State::default()
            })),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Writes (or takes over) the marks of `runs` with `generation`.
    async fn write_marks(
        pool: deadpool_postgres::Pool,
        origin: String,
        holder: String,
        runs: Vec<String>,
        generation: i64,
        since_seq: i64,
    ) -> Result<(), HubError> {
        let work = async {
            let client = pool.get().await.map_err(|e| pool_error(&e))?;
            client
                .execute(
                    "INSERT INTO hub_unshipped (origin, run_id, holder, generation, since_seq)
                     SELECT $1, run_id, $2, $3, $4 FROM unnest($5::text[]) AS r (run_id)
                     ON CONFLICT (origin, run_id) DO UPDATE SET
                         holder = excluded.holder,
                         generation = CASE WHEN hub_unshipped.holder = excluded.holder
                             THEN greatest(hub_unshipped.generation, excluded.generation)
                             ELSE excluded.generation END,
                         since_seq = least(hub_unshipped.since_seq, excluded.since_seq)",
                    &[&origin, &holder, &generation, &since_seq, &runs],
                )
                .await
                .map_err(|e| db_error(&e))
        };
        match tokio::time::timeout(MARK_TIMEOUT, work).await {
            Ok(result) => result.map(|_| ()),
            Err(_) => Err(HubError::Unavailable(format!(
                "the run marks were not written within {} ms",
                MARK_TIMEOUT.as_millis()
            ))),
        }
    }

    fn marked(&self, runs: &[String], generation: i64, result: &Result<(), HubError>) {
        marked(&self.state, runs, generation, result);
    }

    /// Marks the runs of the local events from `from_seq` to `upto` (read by the
    /// shipper from the local log at start, beyond what the hub holds): an earlier life
    /// of this sidecar may have appended them while the database was unreachable. They
    /// stay marked until the hub holds `upto`.
    pub async fn mark_backlog(
        &self,
        runs: Vec<String>,
        from_seq: u64,
        upto: u64,
    ) -> Result<(), HubError> {
        if runs.is_empty() {
            return Ok(());
        }
        let generation = {
            let mut state = self.state();
            for name in &runs {
                let run = state.runs.entry(name.clone()).or_default();
                run.max_seq = run.max_seq.max(upto);
            }
            state.next_generation += 1;
            state.next_generation
        };
        let result = Self::write_marks(
            self.pool.clone(),
            self.origin.clone(),
            self.holder.clone(),
            runs.clone(),
            generation,
            i64::try_from(from_seq).unwrap_or(i64::MAX),
        )
        .await;
        self.marked(&runs, generation, &result);
        result
    }

    /// After a shipping round that left the hub holding `audit` up to `hub_size`:
    /// writes the owed marks, removes an earlier life's marks once the hub holds what
    /// the log had at start, and removes the marks of the runs whose events the hub
    /// now holds. Returns how many runs are still held.
    pub async fn settle(&self, hub_size: u64, audit: &AuditLog) -> Result<usize, HubError> {
        // 1. The owed marks, before anything is removed.
        let (owed, generation) = {
            let mut state = self.state();
            let owed: Vec<String> = state
                .runs
                .iter()
                .filter(|(_, run)| run.marked.is_none())
                .map(|(name, _)| name.clone())
                .collect();
            state.next_generation += 1;
            (owed, state.next_generation)
        };
        if !owed.is_empty() {
            let since = i64::try_from(hub_size.saturating_add(1)).unwrap_or(i64::MAX);
            let result = Self::write_marks(
                self.pool.clone(),
                self.origin.clone(),
                self.holder.clone(),
                owed.clone(),
                generation,
                since,
            )
            .await;
            self.marked(&owed, generation, &result);
            result?;
        }
        // 2. An earlier life's marks: what they covered is in the hub once the hub
        //    holds the log as it was at start (its backlog was marked again).
        let clear_earlier = !self.state().earlier_cleared && hub_size >= self.start_size;
        if clear_earlier {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM hub_unshipped WHERE origin = $1 AND holder <> $2",
                    &[&self.origin, &self.holder],
                )
                .await
                .map_err(|e| db_error(&e))?;
            self.state().earlier_cleared = true;
        }
        // 3. The runs the hub now holds every appended event of.
        let released: Vec<(String, i64, Run)> = {
            let mut state = self.state();
            // Read under the lock: no append of a run can start meanwhile, and one
            // that failed before is in the log or failed for good once it settled.
            let settled = audit.settled_head();
            let done: Vec<String> = state
                .runs
                .iter_mut()
                .filter_map(|(name, run)| {
                    if run.uncertain
                        && run.in_flight == 0
                        && let Some(head) = settled
                    {
                        run.max_seq = run.max_seq.max(head);
                        run.uncertain = false;
                    }
                    let shipped = run.in_flight == 0 && !run.uncertain && run.max_seq <= hub_size;
                    (shipped && run.marked.is_some()).then(|| name.clone())
                })
                .collect();
            done.into_iter()
                .filter_map(|name| {
                    let run = state.runs.remove(&name)?;
                    Some((name, run.marked.unwrap_or(0), run))
                })
                .collect()
        };
        if !released.is_empty() {
            let names: Vec<String> = released.iter().map(|r| r.0.clone()).collect();
            let generations: Vec<i64> = released.iter().map(|r| r.1).collect();
            let removed = async {
                let client = self.client().await?;
                client
                    .execute(
                        "DELETE FROM hub_unshipped h
                         USING unnest($3::text[], $4::bigint[]) AS r (run_id, generation)
                         WHERE h.origin = $1 AND h.holder = $2 AND h.run_id = r.run_id
                           AND h.generation <= r.generation",
                        &[&self.origin, &self.holder, &names, &generations],
                    )
                    .await
                    .map_err(|e| db_error(&e))
            }
            .await;
            if let Err(error) = removed {
                // Held again (unless an append marked the run anew meanwhile): the
                // next round removes them.
                let mut state = self.state();
                for (name, _, run) in released {
                    state.runs.entry(name).or_insert(run);
                }
                return Err(error);
            }
        }
        Ok(self.state().runs.len())
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, HubError> {
        tokio::time::timeout(MARK_TIMEOUT, self.pool.get())
            .await
            .map_err(|_| HubError::Unavailable("no database connection in time".into()))?
            .map_err(|e| pool_error(&e))
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records the outcome of writing `runs`' marks with `generation`.
fn marked(state: &Mutex<State>, runs: &[String], generation: i64, result: &Result<(), HubError>) {
    let mut state = lock(state);
    match result {
        Ok(()) => {
            for name in runs {
                if let Some(run) = state.runs.get_mut(name) {
                    run.marked = Some(run.marked.map_or(generation, |g| g.max(generation)));
                }
            }
        }
        Err(_) => state.down_until = Some(Instant::now() + DOWN_FOR),
    }
}

impl RunMarks for Tail {
    fn enter(&self, runs: &[String], head: u64) -> Option<MarkWait> {
        let (to_mark, generation) = {
            let mut state = self.state();
            let down = state.down_until.is_some_and(|until| Instant::now() < until);
            let mut to_mark = Vec::new();
            for name in runs {
                if !state.runs.contains_key(name) {
                    state.runs.insert(name.clone(), Run::default());
                }
                let Some(run) = state.runs.get_mut(name) else {
                    continue;
                };
                run.in_flight += 1;
                if run.marked.is_none() && !down {
                    to_mark.push(name.clone());
                }
            }
            if to_mark.is_empty() {
                return None;
            }
            state.next_generation += 1;
            (to_mark, state.next_generation)
        };
        let since = i64::try_from(head.saturating_add(1)).unwrap_or(i64::MAX);
        // On the runtime the pool's connections live on: an append may run on a
        // connection thread's own runtime.
        let write = self.runtime.spawn(Tail::write_marks(
            self.pool.clone(),
            self.origin.clone(),
            self.holder.clone(),
            to_mark.clone(),
            generation,
            since,
        ));
        let (state, origin) = (self.state.clone(), self.origin.clone());
        Some(Box::pin(async move {
            let result = match write.await {
                Ok(result) => result,
                Err(e) => Err(HubError::Unavailable(format!(
                    "the run mark task stopped: {e}"
                ))),
            };
            if let Err(error) = &result {
                tracing::warn!(
                    origin = %origin, reason = error.reason(), error = %error,
                    "a run could not be marked as held by this sidecar in the audit hub; the shipper marks it when the database answers"
                );
            }
            marked(&state, &to_mark, generation, &result);
        }))
    }

    fn leave(&self, runs: &[String], last_seq: Option<u64>) {
        let mut state = self.state();
        for name in runs {
            if let Some(run) = state.runs.get_mut(name) {
                run.in_flight = run.in_flight.saturating_sub(1);
                match last_seq {
                    Some(seq) => run.max_seq = run.max_seq.max(seq),
                    None => run.uncertain = true,
                }
            }
        }
    }
}
