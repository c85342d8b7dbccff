//! Durable gateway state beside the audit log, in its own SQLite file in the data
//! directory: the pending commits of two-phase tools (`phases`) and the counters of
//! call budgets and rates (`counters`).
//!
//! INVARIANT: a state change is durable (committed with `synchronous = FULL`) before the
//! gateway acts on it; a store that cannot be opened, read or written is an error the
//! caller turns into a refusal (fail closed), never a guess.

pub mod counters;
pub mod phases;

/// A state store could not be opened, read or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError(pub String);

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StateError {}

fn sqlite_error(path: &std::path::Path, e: &rusqlite::Error) -> StateError {
    StateError(format!("state store `{}`: {e}", path.display()))
}

/// Opens (creating) a state database: WAL, synchronous FULL, a busy timeout, the
/// file and its WAL readable by its owner only.
fn open(path: &std::path::Path, schema: &str) -> Result<rusqlite::Connection, StateError> {
    let map = |e: rusqlite::Error| sqlite_error(path, &e);
    crate::localfile::prepare_database(path)
        .map_err(|e| StateError(format!("cannot create `{}`: {e}", path.display())))?;
    let conn = rusqlite::Connection::open(path).map_err(map)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(map)?;
    let _mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(map)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(map)?;
    conn.execute_batch(schema).map_err(map)?;
    Ok(conn)
}
