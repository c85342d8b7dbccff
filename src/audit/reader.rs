//! Read-only access to an audit database, for tools that read beside a live gateway
//! (`toolgate audit replay`): no writer, no keys, no checkpoint is ever written.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

use super::{AuditError, EventFilter, StoredEvent};

/// How long a read waits for the writer's lock.
const BUSY_TIMEOUT: Duration = Duration::from_millis(2000);

/// A read-only connection to an audit database.
pub struct AuditReader {
    conn: Connection,
    path: PathBuf,
}

impl AuditReader {
    /// Opens `db` read-only; it must exist and be a toolgate audit log.
    pub fn open(db: &Path) -> Result<AuditReader, AuditError> {
        Ok(AuditReader {
            conn: super::store::open_reader(db, BUSY_TIMEOUT)?,
            path: db.to_path_buf(),
        })
    }

    /// Events matching `filter`, oldest first (at most `filter.limit`; 0: every match).
    pub fn events(&self, filter: &EventFilter) -> Result<Vec<StoredEvent>, AuditError> {
        super::log::read_events(&self.conn, &self.path, filter)
    }
}
