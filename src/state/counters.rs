//! The counters of call budgets and rates (`budget`, `rate` of lanes and tools),
//! behind the [`Counters`] trait: [`SqliteCounters`] on one node (`<data_dir>/counters.db`);
//! in a fleet (`serve --cluster-db`) `cluster::counters::PgCounters` implements the same
//! trait on the shared PostgreSQL database.
//!
//! INVARIANT: [`Counters::admit`] is atomic: either every claim of a call is within its
//! limit and all are counted, or none is counted. So concurrent calls never count past
//! a limit, and a refused call consumes nothing.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::{StateError, sqlite_error};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS budget_counts (
    counter TEXT PRIMARY KEY,
    used    INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rate_events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    counter TEXT NOT NULL,
    at_ms   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS rate_events_by_counter ON rate_events (counter, at_ms);
";

/// One limit a call is counted against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The counter's identity (kind, owner, key value).
    pub counter: String,
    pub max: u64,
    /// A rate's window in milliseconds; None for a budget (counted for ever).
    pub window_ms: Option<i64>,
}

/// What was counted for an admitted call, to give back if nothing was executed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ticket {
    budgets: Vec<String>,
    rate_rows: Vec<i64>,
}

impl Ticket {
    /// A ticket of the budget counters incremented and the rate events inserted (by
    /// their row ids), for a [`Counters`] implementation outside this module.
    pub fn new(budgets: Vec<String>, rate_rows: Vec<i64>) -> Ticket {
        Ticket { budgets, rate_rows }
    }

    /// The budget counters this ticket incremented.
    pub fn budgets(&self) -> &[String] {
        &self.budgets
    }

    /// The ids of the rate events this ticket inserted.
    pub fn rate_rows(&self) -> &[i64] {
        &self.rate_rows
    }
}

/// The answer to a call's claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Every claim was within its limit (and counted, unless it was a dry run).
    Admitted(Ticket),
    /// The claim at `index` is at its limit: `used` of `max`; for a rate, the window
    /// frees a slot in `retry_after_ms`.
    Refused {
        index: usize,
        used: u64,
        retry_after_ms: Option<u64>,
    },
}

/// Budget and rate counters.
pub trait Counters: Send + Sync + std::fmt::Debug {
    /// Checks every claim and, if all are within their limits and `count` is set,
    /// counts the call against each, atomically.
    fn admit(&self, claims: &[Claim], now_ms: i64, count: bool) -> Result<Admission, StateError>;
    /// Gives back what an admitted call counted (it executed nothing).
    fn refund(&self, ticket: &Ticket) -> Result<(), StateError>;
}

/// [`Counters`] in a SQLite file of the data directory.
pub struct SqliteCounters {
    path: PathBuf,
    conn: Mutex<rusqlite::Connection>,
}

impl std::fmt::Debug for SqliteCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteCounters")
            .field("path", &self.path)
            .finish()
    }
}

impl SqliteCounters {
    pub fn open(path: &Path) -> Result<SqliteCounters, StateError> {
        let conn = super::open(path, SCHEMA)?;
        Ok(SqliteCounters {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, rusqlite::Connection>, StateError> {
        self.conn
            .lock()
            .map_err(|_| StateError("the counters' lock is poisoned".into()))
    }
}

impl Counters for SqliteCounters {
    fn admit(&self, claims: &[Claim], now_ms: i64, count: bool) -> Result<Admission, StateError> {
        let mut conn = self.lock()?;
        let map = |e: rusqlite::Error| sqlite_error(&self.path, &e);
        // IMMEDIATE: the write lock is taken before the reads, so two processes on one
        // file cannot both read the same count.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map)?;
        for (index, claim) in claims.iter().enumerate() {
            match claim.window_ms {
                None => {
                    let used: u64 = tx
                        .query_row(
                            "SELECT used FROM budget_counts WHERE counter = ?1",
                            params![claim.counter],
                            |r| r.get::<_, i64>(0),
                        )
                        .optional()
                        .map_err(map)?
                        .map_or(0, |n| u64::try_from(n).unwrap_or(0));
                    if used >= claim.max {
                        return Ok(Admission::Refused {
                            index,
                            used,
                            retry_after_ms: None,
                        });
                    }
                }
                Some(window) => {
                    let since = now_ms.saturating_sub(window);
                    tx.execute(
                        "DELETE FROM rate_events WHERE counter = ?1 AND at_ms <= ?2",
                        params![claim.counter, since],
                    )
                    .map_err(map)?;
                    let (used, oldest): (i64, Option<i64>) = tx
                        .query_row(
                            "SELECT count(*), min(at_ms) FROM rate_events WHERE counter = ?1",
                            params![claim.counter],
                            |r| Ok((r.get(0)?, r.get(1)?)),
                        )
                        .map_err(map)?;
                    let used = u64::try_from(used).unwrap_or(0);
                    if used >= claim.max {
                        let frees = oldest.unwrap_or(now_ms).saturating_add(window);
                        let wait = u64::try_from(frees.saturating_sub(now_ms)).unwrap_or(0);
                        return Ok(Admission::Refused {
                            index,
                            used,
                            retry_after_ms: Some(wait.max(1)),
                        });
                    }
                }
            }
        }
        let mut ticket = Ticket::default();
        if !count {
            return Ok(Admission::Admitted(ticket));
        }
        for claim in claims {
            match claim.window_ms {
                None => {
                    tx.execute(
                        "INSERT INTO budget_counts (counter, used) VALUES (?1, 1)
                         ON CONFLICT (counter) DO UPDATE SET used = used + 1",
                        params![claim.counter],
                    )
                    .map_err(map)?;
                    ticket.budgets.push(claim.counter.clone());
                }
                Some(_) => {
                    tx.execute(
                        "INSERT INTO rate_events (counter, at_ms) VALUES (?1, ?2)",
                        params![claim.counter, now_ms],
                    )
                    .map_err(map)?;
                    ticket.rate_rows.push(tx.last_insert_rowid());
                }
            }
        }
        tx.commit().map_err(map)?;
        Ok(Admission::Admitted(ticket))
    }

    fn refund(&self, ticket: &Ticket) -> Result<(), StateError> {
        if ticket.budgets.is_empty() && ticket.rate_rows.is_empty() {
            return Ok(());
        }
        let mut conn = self.lock()?;
        let map = |e: rusqlite::Error| sqlite_error(&self.path, &e);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map)?;
        for counter in &ticket.budgets {
            tx.execute(
                "UPDATE budget_counts SET used = max(used - 1, 0) WHERE counter = ?1",
                params![counter],
            )
            .map_err(map)?;
        }
        for id in &ticket.rate_rows {
            tx.execute("DELETE FROM rate_events WHERE id = ?1", params![id])
                .map_err(map)?;
        }
        tx.commit().map_err(map)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn claim(counter: &str, max: u64, window_ms: Option<i64>) -> Claim {
        Claim {
            counter: counter.into(),
            max,
            window_ms,
        }
    }

    #[test]
    fn budgets_count_to_their_limit_and_refused_calls_count_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = SqliteCounters::open(&dir.path().join("c.db")).unwrap();
        let claims = [claim("b", 2, None), claim("r", 10, Some(1000))];
        assert!(matches!(
            c.admit(&claims, 0, true).unwrap(),
            Admission::Admitted(_)
        ));
        let second = c.admit(&claims, 1, true).unwrap();
        assert!(matches!(second, Admission::Admitted(_)));
        assert_eq!(
            c.admit(&claims, 2, true).unwrap(),
            Admission::Refused {
                index: 0,
                used: 2,
                retry_after_ms: None
            }
        );
        // The refused call did not count against the rate.
        let rate_only = [claim("r", 3, Some(1000))];
        assert!(matches!(
            c.admit(&rate_only, 3, false).unwrap(),
            Admission::Admitted(_)
        ));
        if let Admission::Admitted(ticket) = second {
            c.refund(&ticket).unwrap();
        }
        assert!(matches!(
            c.admit(&claims, 4, true).unwrap(),
            Admission::Admitted(_)
        ));
    }

    #[test]
    fn rates_free_a_slot_when_the_oldest_call_leaves_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let c = SqliteCounters::open(&path).unwrap();
        let claims = [claim("r", 2, Some(1000))];
        assert!(matches!(
            c.admit(&claims, 100, true).unwrap(),
            Admission::Admitted(_)
        ));
        assert!(matches!(
            c.admit(&claims, 400, true).unwrap(),
            Admission::Admitted(_)
        ));
        assert_eq!(
            c.admit(&claims, 500, true).unwrap(),
            Admission::Refused {
                index: 0,
                used: 2,
                retry_after_ms: Some(600)
            }
        );
        drop(c);
        // The counts survive reopening.
        let c = SqliteCounters::open(&path).unwrap();
        assert!(matches!(
            c.admit(&claims, 1099, true).unwrap(),
            Admission::Refused { .. }
        ));
        assert!(matches!(
            c.admit(&claims, 1100, true).unwrap(),
            Admission::Admitted(_)
        ));
    }
}
