//! The sidecar's own log as its witness tasks see it (`submit.rs`): checkpoints and
//! leaf hashes read from its segments over read-only connections (never the writer's),
//! and cosigned checkpoints appended, fsynced, to the cosignature file, from whose
//! tail a restarted task finds where its witness stands.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::submit::{self, Unread, WitnessedLog};
use super::{WitnessConfig, WitnessKey, WitnessStatus};
use crate::audit::AuditError;
use crate::audit::checkpoint::{split_notes, verify_note};
use crate::audit::keys::VerifierKey;
use crate::audit::merkle::{Frontier, Hash};
use crate::audit::segments::{self, StartRecord};
use crate::audit::store::{self, decode_hash, map_sqlite};
use crate::localfile::ReadError;

/// The most bytes of the cosignature file read (from its end) to find where a witness
/// stands after a restart.
const MAX_TAIL_BYTES: u64 = 4 * 1024 * 1024;

/// How the witness client runs.
#[derive(Debug, Clone)]
pub struct WitnessOptions {
    /// The log's first segment (the audit database).
    pub db_path: PathBuf,
    /// The log's checkpoint key (cosigned notes are checked against it before they
    /// are stored).
    pub log_key: VerifierKey,
    pub witnesses: Vec<WitnessConfig>,
    /// How often each witness is offered the newest checkpoint.
    pub interval: Duration,
    /// Where cosigned checkpoints are appended.
    pub cosignature_file: PathBuf,
}

/// Starts one task per witness (on the current tokio runtime); returns their status.
pub fn start(options: WitnessOptions) -> Result<Vec<Arc<WitnessStatus>>, AuditError> {
    let log = LocalLog {
        db_path: options.db_path,
        log_key: options.log_key,
        cosignature_file: options.cosignature_file,
        file: Arc::new(Mutex::new(())),
    };
    submit::start(Arc::new(log), &options.witnesses, options.interval)
        .map_err(|what| AuditError::Config { what })
}

/// The log in the audit database's segments, and its cosignature file.
struct LocalLog {
    db_path: PathBuf,
    log_key: VerifierKey,
    cosignature_file: PathBuf,
    /// One append to the cosignature file at a time (the tasks of all witnesses).
    file: Arc<Mutex<()>>,
}

impl WitnessedLog for LocalLog {
    const NAME: &'static str = "log";
    const SHARED: bool = false;

    fn log_key(&self) -> &VerifierKey {
        &self.log_key
    }

    async fn newest(&self) -> Result<Option<(u64, String)>, String> {
        let db = self.db_path.clone();
        blocking(move || newest_checkpoint(&db)).await
    }

    /// The largest stored checkpoint within reach, or the newest if none is.
    async fn checkpoint_towards(
        &self,
        have: u64,
        limit: u64,
        newest: &(u64, String),
    ) -> Result<(u64, String), String> {
        let db = self.db_path.clone();
        let found = blocking(move || checkpoint_at_most(&db, have, limit)).await?;
        Ok(found.unwrap_or_else(|| newest.clone()))
    }

    /// From the notes in the cosignature file's tail that verify with the log's key
    /// and carry a cosignature by `witness`.
    async fn stored_position(&self, witness: &WitnessKey) -> Result<u64, String> {
        let path = self.cosignature_file.clone();
        let key = witness.clone();
        let log_key = self.log_key.clone();
        blocking(move || {
            let notes = read_tail(&path)?;
            let mut best = 0u64;
            for note in notes {
                let Ok(checkpoint) = verify_note(&note, &log_key) else {
                    continue;
                };
                if matches!(key.check_note(&note), Ok(Some(_))) {
                    best = best.max(checkpoint.size);
                }
            }
            Ok(best)
        })
        .await
    }

    async fn frontier_at(&self, size: u64) -> Result<Frontier, Unread> {
        let db = self.db_path.clone();
        blocking(move || frontier_at(&db, size))
            .await
            .map_err(Unread::Unavailable)
    }

    async fn leaves_between(&self, from: u64, to: u64) -> Result<Vec<Hash>, Unread> {
        let db = self.db_path.clone();
        blocking(move || leaves_between(&db, from, to))
            .await
            .map_err(Unread::Unavailable)
    }

    /// Appends the checkpoint with the witness's lines to the cosignature file.
    async fn store(
        &self,
        _witness: &WitnessKey,
        _size: u64,
        note: &str,
        lines: &str,
    ) -> Result<(), String> {
        let stored = format!("{note}{lines}");
        let path = self.cosignature_file.clone();
        let lock = self.file.clone();
        blocking(move || {
            let _one = lock.lock().unwrap_or_else(|p| p.into_inner());
            append_note(&path, &stored)
        })
        .await
    }
}

/// Runs blocking work (SQLite, files) off the runtime's workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| format!("the witness worker stopped: {e}"))?
}

/// Appends a note and a blank line to the cosignature file and syncs it.
fn append_note(path: &Path, note: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::localfile::create_dir_all(dir).map_err(|e| format!("`{}`: {e}", dir.display()))?;
    }
    let mut file = crate::localfile::open_append(path)
        .map_err(|e| format!("cannot open `{}`: {e}", path.display()))?;
    file.write_all(note.as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_data())
        .map_err(|e| format!("cannot append to `{}`: {e}", path.display()))
}

/// The notes in the last [`MAX_TAIL_BYTES`] of the cosignature file (none if absent).
fn read_tail(path: &Path) -> Result<Vec<String>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = match crate::localfile::open(path) {
        Ok(file) => file,
        Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(format!("cannot read `{}`: {e}", path.display())),
    };
    let len = file
        .metadata()
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?
        .len();
    let start = len.saturating_sub(MAX_TAIL_BYTES);
    file.seek(SeekFrom::Start(start))
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_TAIL_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    // Mid-file: skip to the first note's start (a line after a blank line that is not
    // a signature line).
    let from = if start == 0 {
        0
    } else {
        let mut at = 0;
        loop {
            match text[at..].find("\n\n") {
                Some(i) if !text[at + i + 2..].starts_with('\u{2014}') => break at + i + 2,
                Some(i) => at += i + 2,
                None => return Ok(Vec::new()),
            }
        }
    };
    split_notes(&text[from..]).map_err(|e| format!("`{}` is malformed: {e}", path.display()))
}

// ---- Reading the log (read-only connections; never the writer's).

fn open(path: &Path) -> Result<rusqlite::Connection, String> {
    store::open_reader(path, Duration::from_millis(2000)).map_err(|e| e.to_string())
}

/// The newest stored checkpoint (size, note) of the log, newest segment first.
fn newest_checkpoint(base: &Path) -> Result<Option<(u64, String)>, String> {
    use rusqlite::OptionalExtension;
    let segments = segments::list(base).map_err(|e| e.to_string())?;
    for (_, path) in segments.iter().rev() {
        let conn = open(path)?;
        let row: Option<(i64, String)> = conn
            .query_row(
                "SELECT size, note FROM checkpoints ORDER BY id DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| map_sqlite(&e, path).to_string())?;
        if let Some((size, note)) = row {
            return Ok(Some((size.max(0) as u64, note)));
        }
    }
    Ok(None)
}

/// The largest stored checkpoint with a size in (`above`, `limit`].
fn checkpoint_at_most(
    base: &Path,
    above: u64,
    limit: u64,
) -> Result<Option<(u64, String)>, String> {
    use rusqlite::OptionalExtension;
    let mut best: Option<(u64, String)> = None;
    for (_, path) in segments::list(base).map_err(|e| e.to_string())? {
        let conn = open(&path)?;
        let row: Option<(i64, String)> = conn
            .query_row(
                "SELECT size, note FROM checkpoints WHERE size > ?1 AND size <= ?2 ORDER BY size DESC LIMIT 1",
                rusqlite::params![above as i64, limit as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| map_sqlite(&e, &path).to_string())?;
        if let Some((size, note)) = row
            && best.as_ref().is_none_or(|b| b.0 < size as u64)
        {
            best = Some((size as u64, note));
        }
    }
    Ok(best)
}

/// The segments with their start records, oldest first.
fn starts(base: &Path) -> Result<Vec<(PathBuf, StartRecord)>, String> {
    let mut out = Vec::new();
    for (number, path) in segments::list(base).map_err(|e| e.to_string())? {
        let conn = open(&path)?;
        let start = match segments::read_start(&conn, &path).map_err(|e| e.to_string())? {
            Some(start) => start,
            None if number == 1 => StartRecord::genesis(0),
            None => return Err(format!("`{}` has no start record", path.display())),
        };
        out.push((path, start));
    }
    Ok(out)
}

/// The leaf hashes of seq `from + 1 ..= to`, across segments.
fn leaves_between(base: &Path, from: u64, to: u64) -> Result<Vec<Hash>, String> {
    let mut out = Vec::with_capacity(to.saturating_sub(from).min(1 << 20) as usize);
    for (path, start) in starts(base)? {
        if start.size >= to {
            break;
        }
        let conn = open(&path)?;
        let mut stmt = conn
            .prepare("SELECT seq, hash FROM events WHERE seq > ?1 AND seq <= ?2 ORDER BY seq")
            .map_err(|e| map_sqlite(&e, &path).to_string())?;
        let mut rows = stmt
            .query(rusqlite::params![from as i64, to as i64])
            .map_err(|e| map_sqlite(&e, &path).to_string())?;
        while let Some(row) = rows.next().map_err(|e| map_sqlite(&e, &path).to_string())? {
            let seq: i64 = row.get(0).map_err(|e| e.to_string())?;
            let hash: String = row.get(1).map_err(|e| e.to_string())?;
            if seq as u64 != from + out.len() as u64 + 1 {
                return Err(format!(
                    "seq {} is missing from the log",
                    from + out.len() as u64 + 1
                ));
            }
            out.push(decode_hash(&hash).ok_or_else(|| format!("seq {seq}: a malformed hash"))?);
        }
    }
    if (out.len() as u64) != to - from.min(to) {
        return Err(format!(
            "the log holds seq {}..{} but not up to {to}",
            from + 1,
            from + out.len() as u64
        ));
    }
    Ok(out)
}

/// The right edge of the log's tree at `size` (from the nearest segment start).
fn frontier_at(base: &Path, size: u64) -> Result<Frontier, String> {
    let starts = starts(base)?;
    let Some((_, start)) = starts.iter().rev().find(|(_, s)| s.size <= size) else {
        return Err(format!(
            "the segments holding seq 1..{size} are not here (archived): cannot rebuild the tree at size {size}"
        ));
    };
    let (mut frontier, _) = start
        .state()
        .ok_or_else(|| "a segment start record is malformed".to_string())?;
    for leaf in leaves_between(base, start.size, size)? {
        frontier.push(leaf);
    }
    Ok(frontier)
}
