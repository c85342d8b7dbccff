//! The pending commits of two-phase tools: one row per prepared call, with the
//! upstream's commit token (never in the audit log), the commit deadline and the
//! state. Rows of decided calls keep their state (so a late commit is refused with the
//! right reason) with the token erased.
//!
//! A row also keeps the outcome events of its phases that the audit log has not taken
//! yet (`unrecorded`, a JSON array): the phase happened upstream, its event is owed,
//! and the gateway appends it at its next chance without running the phase again.
//! Such a row is never pruned.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::params;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{StateError, sqlite_error};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS pending_commits (
    call_id      TEXT PRIMARY KEY,
    commit_id    TEXT NOT NULL UNIQUE,
    run_id       TEXT NOT NULL,
    role_id      TEXT NOT NULL,
    lane_id      TEXT NOT NULL,
    tool_name    TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    token        TEXT NOT NULL,
    token_sha256 TEXT NOT NULL,
    deadline_ms  INTEGER NOT NULL,
    state        TEXT NOT NULL,
    updated_ms   INTEGER NOT NULL,
    unrecorded   TEXT NOT NULL DEFAULT '[]'
);
";

/// The column added after the first release of the table: a store created before it
/// gets it at open (its rows owe no event).
const ADD_UNRECORDED: &str =
    "ALTER TABLE pending_commits ADD COLUMN unrecorded TEXT NOT NULL DEFAULT '[]'";

/// Where a prepared call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitState {
    /// Prepared; waiting for a commit until the deadline.
    Pending,
    /// A commit was claimed and is running (or a restart found it running).
    Committing,
    Committed,
    /// A rollback was claimed and is running (or a restart found it running).
    RollingBack,
    RolledBack,
    /// The commit failed upstream; a rollback follows.
    CommitFailed,
    /// The rollback failed upstream after its retries; retried at the next start.
    RollbackFailed,
}

impl CommitState {
    pub fn as_str(self) -> &'static str {
        match self {
            CommitState::Pending => "pending",
            CommitState::Committing => "committing",
            CommitState::Committed => "committed",
            CommitState::RollingBack => "rolling_back",
            CommitState::RolledBack => "rolled_back",
            CommitState::CommitFailed => "commit_failed",
            CommitState::RollbackFailed => "rollback_failed",
        }
    }

    fn parse(s: &str) -> Option<CommitState> {
        [
            CommitState::Pending,
            CommitState::Committing,
            CommitState::Committed,
            CommitState::RollingBack,
            CommitState::RolledBack,
            CommitState::CommitFailed,
            CommitState::RollbackFailed,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    /// Whether the call is decided for good (its token is erased).
    pub fn is_final(self) -> bool {
        matches!(self, CommitState::Committed | CommitState::RolledBack)
    }
}

/// The outcome event of a phase that happened upstream, kept until the audit log holds
/// it. The call's identifiers come from its row; this holds the rest of the event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnrecordedEvent {
    /// The event type's name (`tool_committed`, `tool_rolled_back`, ...).
    pub event_type: String,
    #[serde(default)]
    pub output_hash_sha256: Option<String>,
    #[serde(default)]
    pub error_code: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub failed_step: Option<u8>,
    /// The event's `details`, `outcome_id` included (unique per outcome: the gateway
    /// finds with it whether the log took the event after all).
    pub details: Map<String, Value>,
}

impl UnrecordedEvent {
    /// The `details.outcome_id` of the event.
    pub fn outcome_id(&self) -> &str {
        self.details
            .get("outcome_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// One prepared call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCommit {
    pub call_id: String,
    /// The gateway-side id the caller commits with.
    pub commit_id: String,
    pub run_id: String,
    pub role_id: String,
    pub lane_id: String,
    pub tool_name: String,
    pub tool_version: String,
    /// The upstream's commit token; empty once the call is decided.
    pub token: String,
    /// sha256 of the token, for the audit log and for matching upstream records.
    pub token_sha256: String,
    /// Unix milliseconds after which the call is rolled back.
    pub deadline_ms: i64,
    pub state: CommitState,
    /// Outcome events owed to the audit log, oldest first.
    pub unrecorded: Vec<UnrecordedEvent>,
}

/// The table of pending commits in `<data_dir>/phases.db`.
pub struct PhaseStore {
    path: PathBuf,
    conn: Mutex<rusqlite::Connection>,
}

impl std::fmt::Debug for PhaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseStore")
            .field("path", &self.path)
            .finish()
    }
}

impl PhaseStore {
    pub fn open(path: &Path) -> Result<PhaseStore, StateError> {
        let conn = super::open(path, SCHEMA)?;
        let has_unrecorded = conn
            .prepare("SELECT 1 FROM pragma_table_info('pending_commits') WHERE name = 'unrecorded'")
            .and_then(|mut stmt| stmt.exists([]))
            .map_err(|e| sqlite_error(path, &e))?;
        if !has_unrecorded {
            conn.execute_batch(ADD_UNRECORDED)
                .map_err(|e| sqlite_error(path, &e))?;
        }
        Ok(PhaseStore {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StateError> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| StateError("the state store's lock is poisoned".into()))?;
        f(&conn).map_err(|e| sqlite_error(&self.path, &e))
    }

    /// Every row, decided ones included (bounded by the caller's pruning).
    pub fn load(&self) -> Result<Vec<PendingCommit>, StateError> {
        let rows = self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT call_id, commit_id, run_id, role_id, lane_id, tool_name, tool_version,
                        token, token_sha256, deadline_ms, state, unrecorded
                 FROM pending_commits",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    PendingCommit {
                        call_id: r.get(0)?,
                        commit_id: r.get(1)?,
                        run_id: r.get(2)?,
                        role_id: r.get(3)?,
                        lane_id: r.get(4)?,
                        tool_name: r.get(5)?,
                        tool_version: r.get(6)?,
                        token: r.get(7)?,
                        token_sha256: r.get(8)?,
                        deadline_ms: r.get(9)?,
                        state: CommitState::Pending,
                        unrecorded: Vec::new(),
                    },
                    r.get::<_, String>(10)?,
                    r.get::<_, String>(11)?,
                ))
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        rows.into_iter()
            .map(|(mut row, state, unrecorded)| {
                row.state = CommitState::parse(&state).ok_or_else(|| {
                    StateError(format!(
                        "state store `{}`: call `{}` has an unknown state `{state}`",
                        self.path.display(),
                        row.call_id
                    ))
                })?;
                row.unrecorded = serde_json::from_str(&unrecorded).map_err(|e| {
                    StateError(format!(
                        "state store `{}`: call `{}` has unreadable unrecorded events: {e}",
                        self.path.display(),
                        row.call_id
                    ))
                })?;
                Ok(row)
            })
            .collect()
    }

    pub fn insert(&self, row: &PendingCommit, now_ms: i64) -> Result<(), StateError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO pending_commits (call_id, commit_id, run_id, role_id, lane_id,
                    tool_name, tool_version, token, token_sha256, deadline_ms, state, updated_ms,
                    unrecorded)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                params![
                    row.call_id,
                    row.commit_id,
                    row.run_id,
                    row.role_id,
                    row.lane_id,
                    row.tool_name,
                    row.tool_version,
                    row.token,
                    row.token_sha256,
                    row.deadline_ms,
                    row.state.as_str(),
                    now_ms,
                    unrecorded_json(&row.unrecorded)?
                ],
            )
            .map(|_| ())
        })
    }

    /// Sets a row's state; a final state erases the token.
    pub fn set_state(
        &self,
        call_id: &str,
        state: CommitState,
        now_ms: i64,
    ) -> Result<(), StateError> {
        self.with(|c| {
            let sql = if state.is_final() {
                "UPDATE pending_commits SET state = ?2, updated_ms = ?3, token = '' WHERE call_id = ?1"
            } else {
                "UPDATE pending_commits SET state = ?2, updated_ms = ?3 WHERE call_id = ?1"
            };
            c.execute(sql, params![call_id, state.as_str(), now_ms])
                .map(|_| ())
        })
    }

    /// Sets a row's state and the outcome events it owes in one write; a final state
    /// erases the token.
    pub fn set_outcome(
        &self,
        call_id: &str,
        state: CommitState,
        unrecorded: &[UnrecordedEvent],
        now_ms: i64,
    ) -> Result<(), StateError> {
        let events = unrecorded_json(unrecorded).map_err(|e| sqlite_error(&self.path, &e))?;
        self.with(|c| {
            let sql = if state.is_final() {
                "UPDATE pending_commits SET state = ?2, updated_ms = ?3, unrecorded = ?4,
                    token = '' WHERE call_id = ?1"
            } else {
                "UPDATE pending_commits SET state = ?2, updated_ms = ?3, unrecorded = ?4
                 WHERE call_id = ?1"
            };
            c.execute(sql, params![call_id, state.as_str(), now_ms, events])
                .map(|_| ())
        })
    }

    /// Sets the outcome events a row owes (after some were recorded).
    pub fn set_unrecorded(
        &self,
        call_id: &str,
        unrecorded: &[UnrecordedEvent],
        now_ms: i64,
    ) -> Result<(), StateError> {
        let events = unrecorded_json(unrecorded).map_err(|e| sqlite_error(&self.path, &e))?;
        self.with(|c| {
            c.execute(
                "UPDATE pending_commits SET unrecorded = ?2, updated_ms = ?3 WHERE call_id = ?1",
                params![call_id, events, now_ms],
            )
            .map(|_| ())
        })
    }

    /// Deletes decided rows last changed before `before_ms` that owe no event; returns
    /// how many.
    pub fn prune(&self, before_ms: i64) -> Result<usize, StateError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM pending_commits WHERE state IN ('committed', 'rolled_back')
                 AND unrecorded = '[]' AND updated_ms < ?1",
                params![before_ms],
            )
        })
    }
}

/// The `unrecorded` column's text.
fn unrecorded_json(unrecorded: &[UnrecordedEvent]) -> rusqlite::Result<String> {
    serde_json::to_string(unrecorded).map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn rows_survive_reopening_and_final_states_erase_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("phases.db");
        let store = PhaseStore::open(&path).unwrap();
        let row = PendingCommit {
            call_id: "call-1".into(),
            commit_id: "commit-1".into(),
            run_id: "run".into(),
            role_id: "role".into(),
            lane_id: "lane".into(),
            tool_name: "tool".into(),
            tool_version: "1.0.0".into(),
            token: "secret".into(),
            token_sha256: "abc".into(),
            deadline_ms: 5,
            state: CommitState::Pending,
            unrecorded: Vec::new(),
        };
        store.insert(&row, 1).unwrap();
        assert!(store.insert(&row, 1).is_err(), "a call is prepared once");
        drop(store);
        let store = PhaseStore::open(&path).unwrap();
        assert_eq!(store.load().unwrap(), vec![row.clone()]);
        store
            .set_state("call-1", CommitState::Committed, 2)
            .unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded[0].state, CommitState::Committed);
        assert_eq!(loaded[0].token, "");
        assert_eq!(store.prune(3).unwrap(), 1);
        assert!(store.load().unwrap().is_empty());
    }

    #[test]
    fn a_store_of_the_first_schema_opens_and_owed_events_keep_a_row_from_pruning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("phases.db");
        {
            let old = rusqlite::Connection::open(&path).unwrap();
            old.execute_batch(
                &SCHEMA.replace(",\n    unrecorded   TEXT NOT NULL DEFAULT '[]'", ""),
            )
            .unwrap();
            old.execute(
                "INSERT INTO pending_commits VALUES ('call-1', 'commit-1', 'run', 'role',
                 'lane', 'tool', '1.0.0', 'secret', 'abc', 5, 'pending', 1)",
                [],
            )
            .unwrap();
        }
        let store = PhaseStore::open(&path).unwrap();
        let rows = store.load().unwrap();
        assert_eq!(rows.len(), 1);
        assert!(rows[0].unrecorded.is_empty());

        let mut details = Map::new();
        details.insert("outcome_id".into(), Value::from("o-1"));
        let owed = UnrecordedEvent {
            event_type: "tool_committed".into(),
            output_hash_sha256: Some("def".into()),
            error_code: None,
            reason: None,
            failed_step: None,
            details,
        };
        store
            .set_outcome(
                "call-1",
                CommitState::Committed,
                std::slice::from_ref(&owed),
                2,
            )
            .unwrap();
        assert_eq!(store.prune(3).unwrap(), 0, "a row owing an event stays");
        let loaded = store.load().unwrap();
        assert_eq!(loaded[0].state, CommitState::Committed);
        assert_eq!(loaded[0].token, "");
        assert_eq!(loaded[0].unrecorded, vec![owed]);
        assert_eq!(loaded[0].unrecorded[0].outcome_id(), "o-1");
        store.set_unrecorded("call-1", &[], 2).unwrap();
        assert_eq!(store.prune(3).unwrap(), 1);
    }
}
