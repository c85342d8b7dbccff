//! `toolgate audit archive`: moves sealed segments out of the data directory without
//! breaking the verification of what remains.
//!
//! Order, each step failing closed: take the writer lock (the gateway must be stopped),
//! verify the whole log present, copy each chosen segment (oldest first) to the archive
//! directory under a `.partial` name, fsync, rename, fsync the directory, re-read the
//! copy and compare its SHA-256 with the source; write its seal record beside it; append
//! an `audit_segments_archived` event to the live log (durable, signed); only then
//! remove the sources. A crash before the event leaves the log as it was (plus copies);
//! a crash after it leaves segments that are both archived and present, which verifies.
//!
//! INVARIANT: the active segment is never archived; only a prefix of the segments
//! (oldest first) is, so what remains is one contiguous run of segments.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::keys::VERIFIER_KEY_FILE;
use super::segments::{self, SealRecord};
use super::verify::{
    Problem, VerifyError, VerifyOptions, open_segments, read_checkpoint_files, verify_segments,
};
use super::{AuditError, AuditLog, AuditOptions, EventType, NewEvent};

/// Which sealed segments to archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Every sealed segment whose events all have a seq below this one.
    BeforeSeq(u64),
    /// Every sealed segment but the newest `n` sealed ones.
    KeepSegments(u64),
}

#[derive(Debug, Clone)]
pub struct ArchiveOptions {
    /// The log's first segment (`<data-dir>/audit.db`).
    pub db_path: PathBuf,
    pub key_dir: PathBuf,
    /// An external signer, as for `serve --signer-socket`.
    pub signer: Option<std::sync::Arc<dyn super::signer::Signer>>,
    /// Sink files to check while verifying, and to append the archive's checkpoints
    /// to (the gateway's file sinks).
    pub checkpoint_files: Vec<PathBuf>,
    pub selection: Selection,
    /// The archive directory (created if missing).
    pub to: PathBuf,
    /// Archive even events a `--ship` sink has not confirmed yet (its cursor in
    /// `<data-dir>/ship` is behind them).
    pub ignore_ship_cursors: bool,
}

/// One archived segment, as written to `<to>/<segment file>.seal.json`.
#[derive(Debug, Clone, Serialize)]
pub struct ArchivedSegment {
    pub file: String,
    pub sha256: String,
    pub seal: SealRecord,
}

#[derive(Debug, Clone, Serialize)]
pub struct ArchiveSummary {
    pub archived: Vec<ArchivedSegment>,
    /// The seq of the `audit_segments_archived` event (None: nothing to archive).
    pub event_seq: Option<u64>,
    pub to: String,
}

#[derive(Debug)]
pub enum ArchiveError {
    /// The log does not verify: nothing was archived.
    Verify(Problem),
    Audit(AuditError),
    /// Something about the request or the files is not as it must be.
    Refused(String),
}

impl std::fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArchiveError::Verify(p) => write!(f, "the log does not verify, nothing archived: {p}"),
            ArchiveError::Audit(e) => write!(f, "{e}"),
            ArchiveError::Refused(what) => write!(f, "refused, nothing archived: {what}"),
        }
    }
}

impl From<AuditError> for ArchiveError {
    fn from(e: AuditError) -> Self {
        ArchiveError::Audit(e)
    }
}

fn from_verify(e: VerifyError) -> ArchiveError {
    match e {
        VerifyError::Open(e) => ArchiveError::Audit(e),
        VerifyError::Problem(p) => ArchiveError::Verify(p),
    }
}

fn io(path: &Path, what: &str, e: std::io::Error) -> ArchiveError {
    ArchiveError::Audit(AuditError::Io {
        path: path.to_path_buf(),
        what: format!("{what}: {e}"),
    })
}

/// Opens a file of the log to read it, refusing at once what is not a regular file.
fn open(path: &Path) -> Result<File, ArchiveError> {
    crate::localfile::open(path).map_err(|e| {
        ArchiveError::Audit(AuditError::Io {
            path: path.to_path_buf(),
            what: format!("cannot read: {e}"),
        })
    })
}

/// Archives the chosen sealed segments (see the module docs for the order of steps).
pub async fn archive(options: &ArchiveOptions) -> Result<ArchiveSummary, ArchiveError> {
    let data_dir = options
        .db_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let mut audit_options = AuditOptions::new(&data_dir);
    audit_options.db_path = options.db_path.clone();
    audit_options.key_dir = options.key_dir.clone();
    audit_options.signer = options.signer.clone();
    audit_options.checkpoint_sinks = options
        .checkpoint_files
        .iter()
        .map(|path| super::CheckpointSink::File { path: path.clone() })
        .collect();
    // Takes the writer lock: refused while a gateway writes this log.
    let log = AuditLog::open(audit_options)?;
    let result = archive_with(options, &log).await;
    let closed = log.close().await;
    let summary = result?;
    closed?;
    Ok(summary)
}

async fn archive_with(
    options: &ArchiveOptions,
    log: &AuditLog,
) -> Result<ArchiveSummary, ArchiveError> {
    let key = log.verifier_key().clone();
    let sink_notes = read_checkpoint_files(&options.checkpoint_files).map_err(from_verify)?;
    let present = open_segments(&options.db_path, &[]).map_err(from_verify)?;
    let verify_options = VerifyOptions {
        db_path: options.db_path.clone(),
        key_dir: options.key_dir.clone(),
        checkpoint_files: options.checkpoint_files.clone(),
        trusted_checkpoint: None,
        key_fingerprint: Some(key.fingerprint()),
        archive_dirs: Vec::new(),
    };
    verify_segments(
        &present,
        &verify_options,
        sink_notes,
        &key,
        &mut |_| {},
        false,
    )
    .map_err(from_verify)?;
    let chosen = choose_sealed(options, present)?;
    // A `--ship` sink reads the log in the data directory: events archived before it
    // confirmed them would never reach it.
    if let Some((_, _, last)) = chosen.last()
        && !options.ignore_ship_cursors
    {
        check_ship_cursors(options, last.last_seq)?;
    }
    let to = options.to.clone();
    if chosen.is_empty() {
        return Ok(ArchiveSummary {
            archived: Vec::new(),
            event_seq: None,
            to: to.display().to_string(),
        });
    }
    crate::localfile::create_dir_all(&to).map_err(|e| io(&to, "cannot create the archive", e))?;
    let data_dir = std::fs::canonicalize(options.db_path.parent().unwrap_or(Path::new(".")))
        .map_err(|e| io(&options.db_path, "cannot resolve the data directory", e))?;
    if std::fs::canonicalize(&to).map_err(|e| io(&to, "cannot resolve the archive", e))? == data_dir
    {
        return Err(ArchiveError::Refused(
            "--to is the data directory itself".into(),
        ));
    }

    // Copy, sync, verify each copy; write its seal record.
    let mut archived = Vec::new();
    for (number, path, seal) in &chosen {
        archived.push(copy_segment(*number, path, seal, &to)?);
    }
    // The public key, for an auditor who gets only the archive.
    let vkey = to.join(VERIFIER_KEY_FILE);
    if !vkey.exists() {
        let source = options.key_dir.join(VERIFIER_KEY_FILE);
        let text =
            crate::localfile::read(&source, super::keys::MAX_KEY_FILE_BYTES).map_err(|e| {
                ArchiveError::Audit(AuditError::Io {
                    path: source.clone(),
                    what: format!("cannot read the key file: {e}"),
                })
            })?;
        write_synced(&vkey, &text)?;
    }

    // Record the archive in the live log before anything is removed.
    let (last_number, _, last_seal) = &chosen[chosen.len() - 1];
    let event = archived_event(&archived, *last_number, last_seal, &to);
    let appended = log.append(event).await?;

    // Remove the sources, oldest first.
    for (_, path, _) in &chosen {
        for suffix in ["-wal", "-shm", ""] {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            match std::fs::remove_file(PathBuf::from(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(path, "cannot remove the archived segment", e)),
            }
        }
    }
    segments::sync_dir(&options.db_path)?;
    let manifest = to.join("archive.jsonl");
    let line = json!({
        "event_seq": appended.seq,
        "event_id": appended.event_id,
        "through_segment": last_number,
        "through_seq": last_seal.last_seq,
        "through_root": last_seal.root,
        "segments": archived.iter().map(|a| a.file.clone()).collect::<Vec<_>>(),
    });
    let mut file = crate::localfile::open_append(&manifest).map_err(|e| {
        io(
            &manifest,
            "cannot write",
            std::io::Error::other(e.to_string()),
        )
    })?;
    file.write_all(format!("{line}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| io(&manifest, "cannot write", e))?;
    Ok(ArchiveSummary {
        archived,
        event_seq: Some(appended.seq),
        to: to.display().to_string(),
    })
}

/// The sealed segments the selection names, oldest first (all but the active one,
/// which is the newest, can be sealed; one that is not is refused).
fn choose_sealed(
    options: &ArchiveOptions,
    present: Vec<crate::audit::verify::OpenSegment>,
) -> Result<Vec<(u64, PathBuf, SealRecord)>, ArchiveError> {
    let mut sealed: Vec<(u64, PathBuf, SealRecord)> = Vec::new();
    for segment in present.iter().take(present.len().saturating_sub(1)) {
        let seal = segments::read_seal(&segment.conn, &segment.path)?.ok_or_else(|| {
            ArchiveError::Refused(format!(
                "segment {} is followed by another but not sealed",
                segment.number
            ))
        })?;
        sealed.push((segment.number, segment.path.clone(), seal));
    }
    let chosen = match options.selection {
        Selection::BeforeSeq(seq) => sealed
            .into_iter()
            .take_while(|(_, _, seal)| seal.last_seq < seq)
            .collect(),
        Selection::KeepSegments(keep) => {
            let count = sealed
                .len()
                .saturating_sub(keep.min(usize::MAX as u64) as usize);
            sealed.into_iter().take(count).collect()
        }
    };
    Ok(chosen)
}

/// Refuses to archive through `last_seq` while a `--ship` sink has not confirmed it.
fn check_ship_cursors(options: &ArchiveOptions, last_seq: u64) -> Result<(), ArchiveError> {
    let data_dir = options
        .db_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let behind: Vec<String> = super::ship::cursors(data_dir)
        .map_err(ArchiveError::Refused)?
        .into_iter()
        .filter(|(_, seq)| *seq < last_seq)
        .map(|(path, seq)| format!("`{}` at seq {seq}", path.display()))
        .collect();
    if !behind.is_empty() {
        return Err(ArchiveError::Refused(format!(
            "archiving through seq {} would remove events a --ship sink has not \
             confirmed ({}); let the sinks catch up (toolgate_ship_lag_events), or pass \
             --ignore-ship-cursors",
            last_seq,
            behind.join(", ")
        )));
    }
    Ok(())
}

/// Copies one sealed segment into the archive, synced and checked against its sha256,
/// with its seal record beside it.
fn copy_segment(
    number: u64,
    path: &Path,
    seal: &SealRecord,
    to: &Path,
) -> Result<ArchivedSegment, ArchiveError> {
    flush_wal(path)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let target = to.join(&name);
    if target.exists() {
        return Err(ArchiveError::Refused(format!(
            "`{}` already exists in the archive",
            target.display()
        )));
    }
    let partial = to.join(format!("{name}.partial"));
    let sha256 = copy_synced(path, &partial)?;
    std::fs::rename(&partial, &target).map_err(|e| io(&target, "cannot rename the copy", e))?;
    segments::sync_dir(&target)?;
    let copied = sha256_of(&target)?;
    if copied != sha256 {
        return Err(ArchiveError::Refused(format!(
            "the copy `{}` does not match segment {number} (sha256 {copied} != {sha256})",
            target.display()
        )));
    }
    let record = ArchivedSegment {
        file: name.clone(),
        sha256,
        seal: seal.clone(),
    };
    let seal_path = to.join(format!("{name}.seal.json"));
    write_synced(
        &seal_path,
        &serde_json::to_vec_pretty(&record).unwrap_or_default(),
    )?;
    Ok(record)
}

/// The `audit_segments_archived` event naming what moved where.
fn archived_event(
    archived: &[ArchivedSegment],
    last_number: u64,
    last_seal: &SealRecord,
    to: &Path,
) -> NewEvent {
    let mut event = NewEvent::new(EventType::AuditSegmentsArchived);
    event.reason = Some("sealed segments moved out of the data directory".into());
    let list: Vec<Value> = archived
        .iter()
        .map(|a| {
            json!({
                "segment": a.seal.segment,
                "file": a.file,
                "sha256": a.sha256,
                "first_seq": a.seal.first_seq,
                "last_seq": a.seal.last_seq,
                "root": a.seal.root,
                "last_hash": a.seal.last_hash,
            })
        })
        .collect();
    event
        .details
        .insert("through_segment".into(), json!(last_number));
    event
        .details
        .insert("through_seq".into(), json!(last_seal.last_seq));
    event
        .details
        .insert("through_root".into(), json!(last_seal.root));
    event.details.insert("segments".into(), Value::Array(list));
    event
        .details
        .insert("archive_dir".into(), json!(to.display().to_string()));
    event
}

/// A sealed segment's WAL must be empty before its file alone is copied: copy what is
/// left into the database (nobody writes a sealed segment), or refuse.
fn flush_wal(path: &Path) -> Result<(), ArchiveError> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal = PathBuf::from(wal);
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    if len(&wal) == 0 {
        return Ok(());
    }
    let conn = rusqlite::Connection::open(path)
        .map_err(|e| ArchiveError::Audit(super::store::map_sqlite(&e, path)))?;
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
        .map_err(|e| ArchiveError::Audit(super::store::map_sqlite(&e, path)))?;
    drop(conn);
    if busy != 0 || len(&wal) != 0 {
        return Err(ArchiveError::Refused(format!(
            "the WAL of `{}` could not be emptied (a reader holds it); retry",
            path.display()
        )));
    }
    Ok(())
}

/// Copies `from` to a new file `to` in bounded chunks, fsyncs it, returns the SHA-256.
fn copy_synced(from: &Path, to: &Path) -> Result<String, ArchiveError> {
    let mut source = open(from)?;
    let mut target = crate::localfile::create(to, true).map_err(|e| io(to, "cannot create", e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = source
            .read(&mut buffer)
            .map_err(|e| io(from, "cannot read", e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        target
            .write_all(&buffer[..n])
            .map_err(|e| io(to, "cannot write", e))?;
    }
    target.sync_all().map_err(|e| io(to, "cannot sync", e))?;
    Ok(crate::canonical::to_hex(hasher.finalize()))
}

fn sha256_of(path: &Path) -> Result<String, ArchiveError> {
    let mut file = open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = file
            .read(&mut buffer)
            .map_err(|e| io(path, "cannot read", e))?;
        if n == 0 {
            return Ok(crate::canonical::to_hex(hasher.finalize()));
        }
        hasher.update(&buffer[..n]);
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), ArchiveError> {
    let mut file =
        crate::localfile::create(path, false).map_err(|e| io(path, "cannot create", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| io(path, "cannot write", e))
}
