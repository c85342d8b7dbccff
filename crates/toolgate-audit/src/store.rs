//! The SQLite side of the audit log: schema, connections, typed errors, and reading
//! back the state the writer needs.
//!
//! INVARIANT: events and checkpoints are only ever INSERTed; triggers abort any UPDATE
//! or DELETE on them (a guard against accidents, not against someone who owns the file:
//! that is what the hash chain and the signed checkpoints are for).

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params};

use super::checkpoint::Checkpoint;
use super::merkle::{Frontier, Hash};
use super::{AuditError, Durability};

/// The value of `meta.format` in a toolgate audit database.
pub(crate) const FORMAT: &str = "toolgate-audit/1";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    event_id TEXT NOT NULL,
    type TEXT NOT NULL,
    run_id TEXT,
    ts TEXT NOT NULL,
    line TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_run_id ON events (run_id);
-- The type index leaves out the two events of every call: each commit writes one page
-- less, and those types are dense enough that a scan along seq finds them at once. The
-- WHERE clause is UNINDEXED_TYPES_TERM (a query repeats it to use the index).
DROP INDEX IF EXISTS events_type;
CREATE INDEX IF NOT EXISTS events_type_rare ON events (type)
    WHERE type NOT IN ('tool_requested', 'tool_executed');
-- No index on ts: timestamps never go backwards along seq, so a time bound is found by
-- a binary search over seq (`log::seq_bound`), and every commit writes one page less.
DROP INDEX IF EXISTS events_ts;
CREATE TABLE IF NOT EXISTS checkpoints (
    id INTEGER PRIMARY KEY,
    size INTEGER NOT NULL,
    root TEXT NOT NULL,
    note TEXT NOT NULL,
    created_utc TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS signed_head (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    size INTEGER NOT NULL,
    root TEXT NOT NULL,
    note TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS checkpoints_no_update BEFORE UPDATE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'audit checkpoints are append-only'); END;
CREATE TRIGGER IF NOT EXISTS checkpoints_no_delete BEFORE DELETE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'audit checkpoints are append-only'); END;
";

/// The condition of the partial index `events_type_rare`, as the schema writes it: a
/// query on types other than these adds it (SQLite uses a partial index only when the
/// query's WHERE holds the index's condition).
pub(crate) const UNINDEXED_TYPES_TERM: &str = "type NOT IN ('tool_requested', 'tool_executed')";
/// The types `events_type_rare` leaves out.
pub(crate) const UNINDEXED_TYPES: [super::EventType; 2] = [
    super::EventType::ToolRequested,
    super::EventType::ToolExecuted,
];
pub(crate) const INSERT_EVENT: &str = "INSERT INTO events (seq, event_id, type, run_id, ts, line, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
/// The signed checkpoint over every committed event, replaced by each commit.
pub(crate) const UPSERT_HEAD: &str =
    "INSERT OR REPLACE INTO signed_head (id, size, root, note) VALUES (1, ?1, ?2, ?3)";
pub(crate) const INSERT_CHECKPOINT: &str =
    "INSERT INTO checkpoints (size, root, note, created_utc, reason) VALUES (?1, ?2, ?3, ?4, ?5)";

/// Maps an SQLite error to the typed error an operator can act on.
pub fn map_sqlite(err: &rusqlite::Error, path: &Path) -> AuditError {
    let path = path.to_path_buf();
    match err {
        rusqlite::Error::SqliteFailure(e, _) => match e.code {
            ErrorCode::NotADatabase => AuditError::NotSqlite { path },
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => AuditError::Locked { path },
            ErrorCode::ReadOnly => AuditError::ReadOnly { path },
            ErrorCode::DiskFull => AuditError::DiskFull { path },
            ErrorCode::DatabaseCorrupt => AuditError::Corrupt {
                seq: 0,
                what: format!("sqlite reports a malformed database: {err}"),
            },
            ErrorCode::CannotOpen => AuditError::Io {
                path,
                what: format!("cannot open the database: {err}"),
            },
            ErrorCode::PermissionDenied => AuditError::ReadOnly { path },
            ErrorCode::SystemIoFailure => AuditError::Io {
                path,
                what: err.to_string(),
            },
            _ => AuditError::Sqlite {
                what: err.to_string(),
            },
        },
        _ => AuditError::Sqlite {
            what: err.to_string(),
        },
    }
}

/// Fails with [`AuditError::NotSqlite`] if `path` exists, is not empty, and does not
/// start with the SQLite header.
pub(crate) fn check_header(path: &Path) -> Result<(), AuditError> {
    use crate::localfile::ReadError;
    // Through localfile: a FIFO or a device in the database's place is refused at
    // once, not waited on.
    let mut file = match crate::localfile::open(path) {
        Ok(file) => file,
        Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(AuditError::ReadOnly {
                path: path.to_path_buf(),
            });
        }
        Err(ReadError::NotAFile) => {
            return Err(AuditError::NotSqlite {
                path: path.to_path_buf(),
            });
        }
        Err(e) => {
            return Err(AuditError::Io {
                path: path.to_path_buf(),
                what: format!("cannot read the database: {e}"),
            });
        }
    };
    let mut header = Vec::with_capacity(16);
    file.by_ref()
        .take(16)
        .read_to_end(&mut header)
        .map_err(|e| AuditError::Io {
            path: path.to_path_buf(),
            what: format!("cannot read the database: {e}"),
        })?;
    if !header.is_empty() && header != b"SQLite format 3\0" {
        return Err(AuditError::NotSqlite {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Opens (creating if needed) the database for the writer: WAL, the durability, the
/// schema, and a write lock taken once to prove the database is writable now.
pub(crate) fn open_writer(
    path: &Path,
    durability: Durability,
    busy_timeout: Duration,
    max_bytes: Option<u64>,
) -> Result<Connection, AuditError> {
    check_header(path)?;
    // Owner-only, and so are the WAL and shared-memory files SQLite makes beside it.
    crate::localfile::prepare_database(path).map_err(|e| AuditError::Io {
        path: path.to_path_buf(),
        what: format!("cannot create the database: {e}"),
    })?;
    let map = |e: rusqlite::Error| map_sqlite(&e, path);
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(map)?;
    conn.busy_timeout(busy_timeout).map_err(map)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(map)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(AuditError::ReadOnly {
            path: path.to_path_buf(),
        });
    }
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync).map_err(map)?;
    conn.set_prepared_statement_cache_capacity(16);
    conn.execute_batch("BEGIN IMMEDIATE").map_err(map)?;
    let created = (|| -> Result<(), AuditError> {
        let has_events: bool = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'events'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(map)?
            > 0;
        let has_meta: bool = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(map)?
            > 0;
        if has_events && !has_meta {
            return Err(AuditError::NotAuditLog {
                path: path.to_path_buf(),
                what: "it has an `events` table but no format marker".into(),
            });
        }
        conn.execute_batch(SCHEMA).map_err(map)?;
        conn.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('format', ?1)",
            params![FORMAT],
        )
        .map_err(map)?;
        let format: String = conn
            .query_row("SELECT value FROM meta WHERE key = 'format'", [], |r| {
                r.get(0)
            })
            .map_err(map)?;
        if format != FORMAT {
            return Err(AuditError::NotAuditLog {
                path: path.to_path_buf(),
                what: format!("unknown format `{format}`"),
            });
        }
        Ok(())
    })();
    match created {
        Ok(()) => conn.execute_batch("COMMIT").map_err(map)?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    if let Some(bytes) = max_bytes {
        let page_size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(map)?;
        let pages = (bytes / page_size.max(512) as u64).max(1);
        let _: i64 = conn
            .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
                r.get(0)
            })
            .map_err(map)?;
    }
    Ok(conn)
}

/// Opens the database read-only (for reads next to the writer, verify and export).
pub fn open_reader(path: &Path, busy_timeout: Duration) -> Result<Connection, AuditError> {
    if !path.exists() {
        return Err(AuditError::Io {
            path: path.to_path_buf(),
            what: "no such file".into(),
        });
    }
    check_header(path)?;
    let map = |e: rusqlite::Error| map_sqlite(&e, path);
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(map)?;
    conn.busy_timeout(busy_timeout).map_err(map)?;
    let format: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'format'", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(|e| match map(e) {
            AuditError::Sqlite { what } => AuditError::NotAuditLog {
                path: path.to_path_buf(),
                what,
            },
            other => other,
        })?;
    match format.as_deref() {
        Some(FORMAT) => Ok(conn),
        Some(other) => Err(AuditError::NotAuditLog {
            path: path.to_path_buf(),
            what: format!("unknown format `{other}`"),
        }),
        None => Err(AuditError::NotAuditLog {
            path: path.to_path_buf(),
            what: "no format marker".into(),
        }),
    }
}

/// The newest checkpoint row.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointRow {
    pub size: u64,
    pub root: String,
    pub note: String,
}

/// What the writer needs to continue the log.
#[derive(Debug, Clone)]
pub(crate) struct State {
    pub frontier: Frontier,
    pub prev: Hash,
    pub last_ts: String,
    pub last_checkpoint: Option<CheckpointRow>,
    /// The signed checkpoint over every event, replaced by each commit.
    pub head: Option<CheckpointRow>,
}

pub fn decode_hash(text: &str) -> Option<Hash> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

/// The last event's (seq, hash, ts).
pub(crate) type LastEvent = (u64, String, String);

/// The count and the last event of the events table.
pub(crate) fn head(conn: &Connection, path: &Path) -> Result<(u64, Option<LastEvent>), AuditError> {
    let map = |e: rusqlite::Error| map_sqlite(&e, path);
    let count: i64 = conn
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .map_err(map)?;
    let last = conn
        .query_row(
            "SELECT seq, hash, ts FROM events ORDER BY seq DESC LIMIT 1",
            [],
            |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            },
        )
        .optional()
        .map_err(map)?;
    Ok((count as u64, last))
}

/// Reads the state of the log and checks what can be checked cheaply: the seqs are
/// gapless from 1, the last line hashes to its stored hash, and the log extends the
/// newest stored checkpoint, the signed head and every checkpoint in `extra` (read
/// from the sinks, signatures already checked): a log shorter than one of them was
/// cut, one whose root differs forks ([`AuditError::Diverged`]). Reads every stored
/// hash (32 bytes of memory per event are not kept: only the frontier is).
pub(crate) fn load_state(
    conn: &Connection,
    path: &Path,
    extra: &[(String, Checkpoint)],
    start: &super::segments::StartRecord,
) -> Result<State, AuditError> {
    let map = |e: rusqlite::Error| map_sqlite(&e, path);
    let row = |r: &rusqlite::Row<'_>| {
        Ok(CheckpointRow {
            size: r.get::<_, i64>(0)? as u64,
            root: r.get(1)?,
            note: r.get(2)?,
        })
    };
    let last_checkpoint = conn
        .query_row(
            "SELECT size, root, note FROM checkpoints ORDER BY id DESC LIMIT 1",
            [],
            row,
        )
        .optional()
        .map_err(map)?;
    let head = conn
        .query_row("SELECT size, root, note FROM signed_head", [], row)
        .optional()
        .map_err(map)?;
    // Every signed (size, root) the log must extend, and where it came from.
    let mut wanted: Vec<(String, u64, String)> = Vec::new();
    if let Some(c) = &last_checkpoint {
        wanted.push((
            "the newest stored checkpoint".into(),
            c.size,
            c.root.clone(),
        ));
    }
    if let Some(h) = &head {
        wanted.push(("the signed head".into(), h.size, h.root.clone()));
    }
    for (origin, c) in extra {
        wanted.push((origin.clone(), c.size, crate::canonical::to_hex(c.root)));
    }
    // Checkpoints below this segment's start concern older segments (checked by
    // `audit verify`); the segment's start record carries the tree up to its start.
    wanted.retain(|w| w.1 >= start.size);
    let sizes: std::collections::BTreeSet<u64> = wanted.iter().map(|w| w.1).collect();
    let mut roots: std::collections::BTreeMap<u64, String> = std::collections::BTreeMap::new();
    let (mut frontier, mut prev) = start.state().ok_or_else(|| AuditError::Corrupt {
        seq: 0,
        what: format!(
            "`{}`: the segment's start record is malformed",
            path.display()
        ),
    })?;
    if sizes.contains(&start.size) {
        roots.insert(start.size, crate::canonical::to_hex(frontier.root()));
    }
    {
        let mut stmt = conn
            .prepare("SELECT seq, hash FROM events ORDER BY seq")
            .map_err(map)?;
        let mut rows = stmt.query([]).map_err(map)?;
        while let Some(row) = rows.next().map_err(map)? {
            let seq = row.get::<_, i64>(0).map_err(map)? as u64;
            let expected = frontier.size() + 1;
            if seq != expected {
                return Err(AuditError::Corrupt {
                    seq: expected,
                    what: format!("seq {expected} is missing (the next stored seq is {seq})"),
                });
            }
            let hash_text: String = row.get(1).map_err(map)?;
            let hash = decode_hash(&hash_text).ok_or_else(|| AuditError::Corrupt {
                seq,
                what: "the stored hash is not 64 hex digits".into(),
            })?;
            frontier.push(hash);
            prev = hash;
            if sizes.contains(&seq) {
                roots.insert(seq, crate::canonical::to_hex(frontier.root()));
            }
        }
    }
    let mut last_ts = start.last_ts.clone();
    if frontier.size() > start.size {
        let (seq, line, hash, ts): (i64, String, String, String) = conn
            .query_row(
                "SELECT seq, line, hash, ts FROM events ORDER BY seq DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .map_err(map)?;
        let seq = seq as u64;
        if crate::canonical::to_hex(super::merkle::leaf_hash(line.as_bytes())) != hash {
            return Err(AuditError::Corrupt {
                seq,
                what: "the last event's line does not match its stored hash".into(),
            });
        }
        let value: serde_json::Value =
            serde_json::from_str(&line).map_err(|_| AuditError::Corrupt {
                seq,
                what: "the last event is not JSON".into(),
            })?;
        if value.get("seq").and_then(serde_json::Value::as_u64) != Some(seq) {
            return Err(AuditError::Corrupt {
                seq,
                what: "the last event's line carries another seq".into(),
            });
        }
        last_ts = ts;
    }
    let size = frontier.size();
    for (origin, wanted_size, wanted_root) in &wanted {
        match roots.get(wanted_size) {
            None => {
                return Err(AuditError::Diverged {
                    cut: true,
                    what: format!(
                        "the log has {size} events but {origin} covers {wanted_size}: seq {}..{wanted_size} are gone; refusing to reuse their sequence numbers",
                        size + 1
                    ),
                });
            }
            Some(root) if root != wanted_root => {
                return Err(AuditError::Diverged {
                    cut: false,
                    what: format!(
                        "the events up to seq {wanted_size} do not match {origin}: the history was rewritten"
                    ),
                });
            }
            Some(_) => {}
        }
    }
    // Every acknowledged event was signed (the head is stored in the commit that
    // holds the events): events beyond every signed note were added outside the writer.
    let covered = wanted
        .iter()
        .map(|w| w.1)
        .max()
        .unwrap_or(0)
        .max(start.size);
    if size > covered {
        return Err(AuditError::Corrupt {
            seq: covered + 1,
            what: format!(
                "seq {}..{size} are covered by no signed checkpoint: every acknowledged event is signed when it is committed, so they were added or rewritten outside the gateway",
                covered + 1
            ),
        });
    }
    Ok(State {
        frontier,
        prev,
        last_ts,
        last_checkpoint,
        head,
    })
}
