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

    /// The signed checkpoint notes (stored checkpoints and the signed head of each
    /// segment) with a size in (`above`, `upto`], as (size, note), by size, one per
    /// size.
    pub fn notes_between(&self, above: u64, upto: u64) -> Result<Vec<(u64, String)>, AuditError> {
        let mut out = std::collections::BTreeMap::new();
        for (_, path) in super::segments::list(&self.path)? {
            let conn = super::store::open_reader(&path, BUSY_TIMEOUT)?;
            let map = |e: rusqlite::Error| super::store::map_sqlite(&e, &path);
            let mut stmt = conn
                .prepare(
                    "SELECT size, note FROM checkpoints WHERE size > ?1 AND size <= ?2 \
                     UNION ALL SELECT size, note FROM signed_head WHERE size > ?1 AND size <= ?2",
                )
                .map_err(map)?;
            let rows = stmt
                .query_map(rusqlite::params![above as i64, upto as i64], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(map)?;
            for row in rows {
                let (size, note) = row.map_err(map)?;
                out.entry(size.max(0) as u64).or_insert(note);
            }
        }
        Ok(out.into_iter().collect())
    }
}
