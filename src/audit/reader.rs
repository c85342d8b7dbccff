//! Read-only access to an audit log (all its segments), for tools that read beside a live gateway
//! (`toolgate audit replay`): no writer, no keys, no checkpoint is ever written.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{AuditError, EventFilter, StoredEvent};

/// How long opening a segment waits for the writer's lock.
const BUSY_TIMEOUT: Duration = Duration::from_millis(2000);

/// Read-only access to an audit log, across its segments (each opened while read).
pub struct AuditReader {
    path: PathBuf,
}

impl AuditReader {
    /// Opens the log whose first segment is `db` read-only; its newest segment must
    /// exist and be a toolgate audit log.
    pub fn open(db: &Path) -> Result<AuditReader, AuditError> {
        let (_, newest) = super::segments::newest(db)?;
        drop(super::store::open_reader(&newest, BUSY_TIMEOUT)?);
        Ok(AuditReader {
            path: db.to_path_buf(),
        })
    }

    /// Events matching `filter`, oldest first (at most `filter.limit`; 0: every match).
    pub fn events(&self, filter: &EventFilter) -> Result<Vec<StoredEvent>, AuditError> {
        super::log::read_segment_events(&self.path, filter)
    }
}
