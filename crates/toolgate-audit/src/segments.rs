//! Sealed segments: the audit log as a sequence of SQLite files, each holding a run of
//! consecutive events, with one Merkle tree and one hash chain over all of them.
//!
//! Segment 1 is the configured database (`audit.db`); segment n >= 2 is
//! `<stem>-<n:06>.<ext>` beside it (`audit-000002.db`). Each segment's `meta` table
//! holds its start record (`segment_start`: the tree size before its first event, the
//! last leaf hash before it and the right edge of the tree, RFC 9162's compact range),
//! so roots and the chain continue without reading older segments. A segment is sealed
//! by one transaction that stores a signed checkpoint over its last event and its seal
//! record (`segment_seal`: first and last seq, last leaf hash, root, right edge and the
//! signed note); a sealed segment is never written again. docs/audit.md has the rules
//! an auditor checks across segments and across an archive.
//!
//! INVARIANT: a segment file becomes visible under its final name only once its start
//! record is committed (it is built under a `.new` name and renamed).

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::merkle::{Frontier, Hash};
use super::store::{decode_hash, map_sqlite};
use super::{AuditError, Durability};

const START_KEY: &str = "segment_start";
const SEAL_KEY: &str = "segment_seal";
/// The most segments a data directory may hold (a bound on every listing).
pub const MAX_SEGMENTS: usize = 100_000;

/// Where the log stood before a segment's first event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartRecord {
    pub segment: u64,
    /// The tree size before the segment's first event (its first seq is `size + 1`).
    pub size: u64,
    /// The leaf hash of event `size` (zeros for the genesis), hex.
    pub prev: String,
    /// The right edge of the tree of `size` leaves, largest subtree first, hex.
    pub frontier: Vec<String>,
    /// The newest timestamp before the segment (timestamps never go backwards).
    pub last_ts: String,
    /// When the segment was opened (unix seconds), for `--audit-segment-max-age`.
    pub opened_unix: i64,
}

impl StartRecord {
    pub fn genesis(opened_unix: i64) -> Self {
        StartRecord {
            segment: 1,
            size: 0,
            prev: crate::canonical::to_hex([0u8; 32]),
            frontier: Vec::new(),
            last_ts: String::new(),
            opened_unix,
        }
    }

    /// The tree and last leaf hash the record describes; None if malformed.
    pub fn state(&self) -> Option<(Frontier, Hash)> {
        let nodes = self
            .frontier
            .iter()
            .map(|h| decode_hash(h))
            .collect::<Option<Vec<Hash>>>()?;
        Some((
            Frontier::from_parts(self.size, &nodes)?,
            decode_hash(&self.prev)?,
        ))
    }
}

/// What a sealed segment holds, stored in it by the sealing transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealRecord {
    pub segment: u64,
    pub first_seq: u64,
    /// Also the tree size at the seal.
    pub last_seq: u64,
    /// The leaf hash of `last_seq`, hex.
    pub last_hash: String,
    /// The Merkle root over seq 1..=last_seq, hex.
    pub root: String,
    /// The right edge of that tree (the next segment's start), hex.
    pub frontier: Vec<String>,
    pub last_ts: String,
    /// The signed checkpoint over `last_seq` events.
    pub note: String,
}

impl SealRecord {
    /// The start record of the segment after this one.
    pub fn next_start(&self, opened_unix: i64) -> StartRecord {
        StartRecord {
            segment: self.segment + 1,
            size: self.last_seq,
            prev: self.last_hash.clone(),
            frontier: self.frontier.clone(),
            last_ts: self.last_ts.clone(),
            opened_unix,
        }
    }
}

/// The file of segment `number` of the log whose first segment is `base`.
pub fn segment_path(base: &Path, number: u64) -> PathBuf {
    if number <= 1 {
        return base.to_path_buf();
    }
    let stem = base
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match base.extension() {
        Some(ext) => format!("{stem}-{number:06}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{number:06}"),
    };
    base.with_file_name(name)
}

/// The segment number a file name stands for, if it is one of `base`'s segments.
pub fn segment_number(base: &Path, name: &str) -> Option<u64> {
    let base_name = base.file_name()?.to_string_lossy();
    if name == base_name {
        return Some(1);
    }
    let stem = base.file_stem()?.to_string_lossy();
    let rest = name.strip_prefix(&*stem)?.strip_prefix('-')?;
    let digits = match base.extension() {
        Some(ext) => rest.strip_suffix(&*format!(".{}", ext.to_string_lossy()))?,
        None => rest,
    };
    if digits.len() < 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let number: u64 = digits.parse().ok()?;
    (number >= 2 && segment_path(base, number).file_name()?.to_string_lossy() == name)
        .then_some(number)
}

/// The segments present beside `base` (in `base`'s directory), oldest first.
pub fn list(base: &Path) -> Result<Vec<(u64, PathBuf)>, AuditError> {
    list_in(base, base.parent().filter(|p| !p.as_os_str().is_empty()))
}

/// The segments of `base`'s log found in `dir` (None: the current directory).
pub fn list_in(base: &Path, dir: Option<&Path>) -> Result<Vec<(u64, PathBuf)>, AuditError> {
    let dir = dir.unwrap_or(Path::new("."));
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(AuditError::Io {
                path: dir.to_path_buf(),
                what: format!("cannot list the audit segments: {e}"),
            });
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| AuditError::Io {
            path: dir.to_path_buf(),
            what: format!("cannot list the audit segments: {e}"),
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(number) = segment_number(base, &name) {
            out.push((number, dir.join(&name)));
            if out.len() > MAX_SEGMENTS {
                return Err(AuditError::TooLarge {
                    what: "number of audit segments".into(),
                    limit: MAX_SEGMENTS as u64,
                });
            }
        }
    }
    out.sort();
    Ok(out)
}

fn read_json<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    path: &Path,
    key: &str,
) -> Result<Option<T>, AuditError> {
    let text: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
        .map_err(|e| map_sqlite(&e, path))?;
    match text {
        None => Ok(None),
        Some(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| AuditError::Corrupt {
                seq: 0,
                what: format!("`{}`: the {key} record is malformed: {e}", path.display()),
            }),
    }
}

/// The segment's start record; None for a database written before segments existed
/// (which is segment 1 and starts at the genesis).
pub fn read_start(conn: &Connection, path: &Path) -> Result<Option<StartRecord>, AuditError> {
    read_json(conn, path, START_KEY)
}

/// The segment's seal record, if it is sealed.
pub fn read_seal(conn: &Connection, path: &Path) -> Result<Option<SealRecord>, AuditError> {
    read_json(conn, path, SEAL_KEY)
}

fn write_json<T: Serialize>(conn: &Connection, key: &str, value: &T) -> rusqlite::Result<()> {
    let text = serde_json::to_string(value).unwrap_or_default();
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
        params![key, text],
    )?;
    Ok(())
}

/// Stores the start record (inside the caller's transaction).
pub(crate) fn write_start(conn: &Connection, record: &StartRecord) -> rusqlite::Result<()> {
    write_json(conn, START_KEY, record)
}

/// Stores the seal record (inside the sealing transaction).
pub(crate) fn write_seal(conn: &Connection, record: &SealRecord) -> rusqlite::Result<()> {
    write_json(conn, SEAL_KEY, record)
}

/// Creates segment `start.segment` at `path` holding only its start record: built
/// under `<path>.new`, closed, renamed into place, directory synced.
pub(crate) fn create(
    path: &Path,
    start: &StartRecord,
    durability: Durability,
) -> Result<(), AuditError> {
    let io = |what: String| AuditError::Io {
        path: path.to_path_buf(),
        what,
    };
    if path.exists() {
        return Err(io(
            "the next audit segment already exists; refusing to overwrite it".into(),
        ));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = tmp.as_os_str().to_owned();
        name.push(suffix);
        match std::fs::remove_file(PathBuf::from(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("cannot remove a stale segment file: {e}"))),
        }
    }
    let conn =
        super::store::open_writer(&tmp, durability, std::time::Duration::from_secs(1), None)?;
    write_start(&conn, start).map_err(|e| map_sqlite(&e, &tmp))?;
    // Everything into the main file before it is renamed without its WAL.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(|e| map_sqlite(&e, &tmp))
    .and_then(|busy| match busy {
        0 => Ok(()),
        _ => Err(AuditError::Locked { path: tmp.clone() }),
    })?;
    conn.close().map_err(|(_, e)| map_sqlite(&e, &tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| io(format!("cannot create the segment: {e}")))?;
    sync_dir(path)
}

/// fsyncs the directory holding `path` (so a rename or removal in it is durable).
pub fn sync_dir(path: &Path) -> Result<(), AuditError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| AuditError::Io {
            path: dir.to_path_buf(),
            what: format!("cannot sync the directory: {e}"),
        })
}

/// The total bytes of every segment of `base`'s log and their WAL files.
pub fn total_bytes(base: &Path) -> u64 {
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let segments = list(base).unwrap_or_else(|_| vec![(1, base.to_path_buf())]);
    segments
        .iter()
        .map(|(_, p)| {
            let mut wal = p.as_os_str().to_owned();
            wal.push("-wal");
            len(p).saturating_add(len(Path::new(&wal)))
        })
        .fold(0u64, u64::saturating_add)
}

/// The active segment's number and path: the newest present (segment 1 when none).
pub fn newest(base: &Path) -> Result<(u64, PathBuf), AuditError> {
    Ok(list(base)?.pop().unwrap_or_else(|| (1, base.to_path_buf())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_round_trip_and_strangers_are_ignored() {
        let base = Path::new("/d/audit.db");
        assert_eq!(segment_path(base, 1), PathBuf::from("/d/audit.db"));
        assert_eq!(segment_path(base, 2), PathBuf::from("/d/audit-000002.db"));
        assert_eq!(
            segment_path(base, 1_234_567),
            PathBuf::from("/d/audit-1234567.db")
        );
        for n in [1, 2, 17, 999_999, 1_000_000] {
            let name = segment_path(base, n);
            let name = name.file_name().unwrap().to_string_lossy();
            assert_eq!(segment_number(base, &name), Some(n));
        }
        for stranger in [
            "audit-000001.db",
            "audit-2.db",
            "audit-000002.db-wal",
            "audit-000002.db.new",
            "audit-00000x.db",
            "other-000002.db",
            "audit-0000002.db",
        ] {
            assert_eq!(segment_number(base, stranger), None, "{stranger}");
        }
    }
}
