//! The counters of call budgets and rates shared by a fleet (`serve --cluster-db`):
//! [`PgCounters`] implements `state::counters::Counters` on the cluster database, so a
//! budget of N admits N calls in total across every sidecar and a rate counts every
//! sidecar's calls in one window.
//!
//! INVARIANT: one claim is one transaction: the counters' rows are locked in counter
//! order (`SELECT ... ORDER BY counter FOR UPDATE`, so concurrent claims never
//! deadlock), checked, and counted, all or none. The window of a rate is measured on
//! the database's clock (one clock for the fleet, whatever the sidecars' clocks say).
//! Every query is bounded by `cluster::QUERY_TIMEOUT`; a failure is a `StateError`
//! the gateway turns into `counter_state_unavailable` (fail closed, never admitted).

use std::sync::Arc;

use tokio::runtime::Handle;

use super::{ClusterDb, QUERY_TIMEOUT, bounded};
use crate::state::StateError;
use crate::state::counters::{Admission, Claim, Counters, Ticket};

/// [`Counters`] in the cluster database. Its methods block: the gateway calls them
/// from `spawn_blocking`, where blocking on the runtime `handle` is allowed.
pub struct PgCounters {
    db: Arc<ClusterDb>,
    handle: Handle,
}

impl std::fmt::Debug for PgCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCounters")
            .field("node_id", &self.db.node_id)
            .finish()
    }
}

impl PgCounters {
    /// Counters on `db`, run on the runtime `handle`.
    pub fn new(db: Arc<ClusterDb>, handle: Handle) -> PgCounters {
        PgCounters { db, handle }
    }

    /// Runs `work` on the runtime and waits for it (bounded: a claim is a handful of
    /// bounded queries). The work is spawned, not `block_on`-ed, so a caller on any
    /// thread waits without panicking.
    fn wait<T: Send + 'static>(
        &self,
        queries: usize,
        work: impl std::future::Future<Output = Result<T, StateError>> + Send + 'static,
    ) -> Result<T, StateError> {
        let (done, answer) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = done.send(work.await);
        });
        // Each query is bounded; one more bound's worth covers the task's scheduling.
        // Should the wait still end first, the call is refused while the claim may yet
        // commit: the call then stays counted, erring on the side of the limit.
        let bound = QUERY_TIMEOUT * u32::try_from(queries.saturating_add(1)).unwrap_or(u32::MAX);
        answer.recv_timeout(bound).map_err(|_| {
            StateError(format!(
                "the cluster database did not settle the counters within {} ms",
                bound.as_millis()
            ))
        })?
    }
}

/// The most bounded steps of a claim of `claims` counters (a connection, begin,
/// insert, lock, clock, commit, and per counter up to three).
fn claim_queries(claims: usize) -> usize {
    claims.saturating_mul(3).saturating_add(6)
}

fn state_error(refusal: crate::diagnostic::Refusal) -> StateError {
    StateError(refusal.message)
}

/// Milliseconds since the epoch on the database's clock.
const NOW_MS: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

impl Counters for PgCounters {
    /// `_now_ms` (the sidecar's clock) is not used: the fleet counts on the database's.
    fn admit(&self, claims: &[Claim], _now_ms: i64, count: bool) -> Result<Admission, StateError> {
        let db = self.db.clone();
        let claims = claims.to_vec();
        self.wait(claim_queries(claims.len()), async move {
            admit(&db, &claims, count).await.map_err(state_error)
        })
    }

    fn refund(&self, ticket: &Ticket) -> Result<(), StateError> {
        if ticket.budgets().is_empty() && ticket.rate_rows().is_empty() {
            return Ok(());
        }
        let db = self.db.clone();
        let ticket = ticket.clone();
        let queries = ticket.budgets().len().saturating_add(4);
        self.wait(queries, async move {
            refund(&db, &ticket).await.map_err(state_error)
        })
    }
}

async fn admit(
    db: &ClusterDb,
    claims: &[Claim],
    count: bool,
) -> Result<Admission, crate::diagnostic::Refusal> {
    let mut names: Vec<String> = claims.iter().map(|c| c.counter.clone()).collect();
    names.sort();
    names.dedup();
    let mut client = db.client().await?;
    let tx = bounded(client.transaction()).await?;
    // Every counter has a row to lock (inserted in counter order too).
    bounded(tx.execute(
        "INSERT INTO toolgate_counters (counter) \
         SELECT c FROM unnest($1::text[]) AS c ORDER BY c ON CONFLICT (counter) DO NOTHING",
        &[&names],
    ))
    .await?;
    let rows = bounded(tx.query(
        "SELECT counter, used FROM toolgate_counters WHERE counter = ANY($1) \
         ORDER BY counter FOR UPDATE",
        &[&names],
    ))
    .await?;
    let used_of = |name: &str| -> u64 {
        rows.iter()
            .find(|r| r.get::<_, String>(0) == name)
            .map_or(0, |r| u64::try_from(r.get::<_, i64>(1)).unwrap_or(0))
    };
    let now: i64 = bounded(tx.query_one(NOW_MS, &[])).await?.get(0);
    for (index, claim) in claims.iter().enumerate() {
        match claim.window_ms {
            None => {
                let used = used_of(&claim.counter);
                if used >= claim.max {
                    return Ok(Admission::Refused {
                        index,
                        used,
                        retry_after_ms: None,
                    });
                }
            }
            Some(window) => {
                let since = now.saturating_sub(window);
                bounded(tx.execute(
                    "DELETE FROM toolgate_rate_events WHERE counter = $1 AND at_ms <= $2",
                    &[&claim.counter, &since],
                ))
                .await?;
                let row = bounded(tx.query_one(
                    "SELECT count(*), min(at_ms) FROM toolgate_rate_events WHERE counter = $1",
                    &[&claim.counter],
                ))
                .await?;
                let (used, oldest): (i64, Option<i64>) = (row.get(0), row.get(1));
                let used = u64::try_from(used).unwrap_or(0);
                if used >= claim.max {
                    let frees = oldest.unwrap_or(now).saturating_add(window);
                    let wait = u64::try_from(frees.saturating_sub(now)).unwrap_or(0);
                    return Ok(Admission::Refused {
                        index,
                        used,
                        retry_after_ms: Some(wait.max(1)),
                    });
                }
            }
        }
    }
    if !count {
        return Ok(Admission::Admitted(Ticket::default()));
    }
    let mut budgets = Vec::new();
    let mut rate_rows = Vec::new();
    for claim in claims {
        match claim.window_ms {
            None => {
                bounded(tx.execute(
                    "UPDATE toolgate_counters SET used = used + 1 WHERE counter = $1",
                    &[&claim.counter],
                ))
                .await?;
                budgets.push(claim.counter.clone());
            }
            Some(_) => {
                // A random id: the sidecar role has no sequence privileges, and a
                // clash (2^-64) fails the insert, refusing the call.
                let id = i64::from_ne_bytes(uuid::Uuid::new_v4().as_u64_pair().0.to_ne_bytes());
                bounded(tx.execute(
                    "INSERT INTO toolgate_rate_events (id, counter, at_ms) VALUES ($1, $2, $3)",
                    &[&id, &claim.counter, &now],
                ))
                .await?;
                rate_rows.push(id);
            }
        }
    }
    bounded(tx.commit()).await?;
    Ok(Admission::Admitted(Ticket::new(budgets, rate_rows)))
}

async fn refund(db: &ClusterDb, ticket: &Ticket) -> Result<(), crate::diagnostic::Refusal> {
    let mut client = db.client().await?;
    let tx = bounded(client.transaction()).await?;
    let mut budgets = ticket.budgets().to_vec();
    budgets.sort();
    for counter in &budgets {
        bounded(tx.execute(
            "UPDATE toolgate_counters SET used = greatest(used - 1, 0) WHERE counter = $1",
            &[counter],
        ))
        .await?;
    }
    let ids = ticket.rate_rows().to_vec();
    bounded(tx.execute(
        "DELETE FROM toolgate_rate_events WHERE id = ANY($1)",
        &[&ids],
    ))
    .await?;
    bounded(tx.commit()).await
}
