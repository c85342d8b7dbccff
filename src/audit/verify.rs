//! Verification of an audit database: recompute every line's hash, the `seq`/`prev`
//! chain, the Merkle tree, and every checkpoint signature and root; optionally check
//! that the log still contains and extends a checkpoint the auditor kept.
//!
//! The first problem found is reported with the seq it concerns and what is wrong;
//! [`ProblemKind::exit_code`] maps it to the CLI's exit code.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};
use serde::Serialize;
use serde_json::Value;

use super::checkpoint::{Checkpoint, NoteError, split_notes, verify_note};
use super::keys::{VerifierKey, load_verifier};
use super::line::{GENESIS_PREV, MAX_SAFE_INTEGER, event_id};
use super::merkle::{Frontier, Hash, Tree, leaf_hash, verify_consistency};
use super::store::{self, decode_hash, map_sqlite};
use super::{AuditError, EventType};
use crate::canonical::to_canonical_string;

/// What verification needs.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    pub db_path: PathBuf,
    /// Holds the public key (`audit-signing.vkey`).
    pub key_dir: PathBuf,
    /// Extra files of checkpoints (the sink files), checked like the stored ones; used
    /// by [`verify_db`] (callers of [`verify_conn`] read them with
    /// [`read_checkpoint_files`]).
    pub checkpoint_files: Vec<PathBuf>,
    /// A checkpoint note the auditor kept; the log must contain and extend it.
    pub trusted_checkpoint: Option<PathBuf>,
    /// The key fingerprint the auditor recorded (hex SHA-256 of the public key); the
    /// key in `key_dir` must have it. None: the key is trusted as found, with a warning.
    pub key_fingerprint: Option<String>,
}

/// What can be wrong with a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// An event's content changed.
    Edited,
    /// An event is gone from the middle of the log.
    Missing,
    /// An event was added into the middle of the log.
    Inserted,
    /// Events are out of order.
    Reordered,
    /// A line is not a well-formed event.
    Malformed,
    /// The events under a signed checkpoint do not hash to its root.
    RootMismatch,
    /// The log ends before a signed checkpoint says it should.
    Truncated,
    /// The log does not extend a signed checkpoint (two different histories).
    Fork,
    /// A checkpoint signature does not verify.
    Signature,
    /// The key is missing or unusable, or not the one the auditor expects.
    Key,
    /// Events that no signed checkpoint covers, although every commit signs one.
    Unsigned,
}

impl ProblemKind {
    /// 1 for integrity failures, 2 for truncation or fork, 3 for key or signature.
    pub fn exit_code(self) -> u8 {
        match self {
            ProblemKind::Edited
            | ProblemKind::Missing
            | ProblemKind::Inserted
            | ProblemKind::Reordered
            | ProblemKind::Malformed
            | ProblemKind::RootMismatch
            | ProblemKind::Unsigned => 1,
            ProblemKind::Truncated | ProblemKind::Fork => 2,
            ProblemKind::Signature | ProblemKind::Key => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Edited => "edited",
            ProblemKind::Missing => "missing",
            ProblemKind::Inserted => "inserted",
            ProblemKind::Reordered => "reordered",
            ProblemKind::Malformed => "malformed",
            ProblemKind::RootMismatch => "root_mismatch",
            ProblemKind::Truncated => "truncated",
            ProblemKind::Fork => "fork",
            ProblemKind::Signature => "signature",
            ProblemKind::Key => "key",
            ProblemKind::Unsigned => "unsigned",
        }
    }
}

/// The first problem found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub kind: ProblemKind,
    /// The first bad seq, when the problem is tied to one.
    pub seq: Option<u64>,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.seq {
            Some(seq) => write!(f, "{} at seq {seq}: {}", self.kind.as_str(), self.message),
            None => write!(f, "{}: {}", self.kind.as_str(), self.message),
        }
    }
}

/// Why verification did not pass.
#[derive(Debug, Clone)]
pub enum VerifyError {
    /// The database could not be read at all.
    Open(AuditError),
    /// The log is not intact.
    Problem(Problem),
}

impl From<AuditError> for VerifyError {
    fn from(e: AuditError) -> Self {
        VerifyError::Open(e)
    }
}

fn problem(kind: ProblemKind, seq: Option<u64>, message: impl Into<String>) -> VerifyError {
    VerifyError::Problem(Problem {
        kind,
        seq,
        message: message.into(),
    })
}

/// A checkpoint whose signature verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedCheckpoint {
    pub size: u64,
    pub root: Hash,
    pub note: String,
}

/// The summary of an intact log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub events: u64,
    /// The leaf hash of the last event.
    pub head_hash: Option<String>,
    /// The Merkle root over every event, hex.
    pub root: String,
    /// Distinct checkpoints verified (signature and root).
    pub checkpoints: usize,
    pub latest_checkpoint_size: Option<u64>,
    /// The size of the trusted checkpoint the log extends.
    pub trusted_checkpoint_size: Option<u64>,
    pub key_fingerprint: String,
    /// Whether the key matched the fingerprint the auditor gave.
    pub key_fingerprint_confirmed: bool,
    /// Not failures, but worth knowing (events not yet under a checkpoint, ...).
    pub warnings: Vec<String>,
}

/// An intact log: the report, and what export builds on.
#[derive(Debug, Clone)]
pub struct Verified {
    pub report: Report,
    pub leaves: Vec<Hash>,
    /// Sorted by size, one per size.
    pub checkpoints: Vec<VerifiedCheckpoint>,
    pub key: VerifierKey,
}

/// How often the progress callback is called, in events.
pub const PROGRESS_STEP: u64 = 4096;

/// Verifies the database at `options.db_path`. `progress` is called with the number of
/// events checked so far, and first with the total.
pub fn verify_db(
    options: &VerifyOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Verified, VerifyError> {
    let key = load_verifier(&options.key_dir)
        .map_err(|e| problem(ProblemKind::Key, None, e.to_string()))?;
    check_fingerprint(&key, options.key_fingerprint.as_deref())?;
    // INVARIANT: the sink files are read before the database snapshot starts. The
    // writer publishes a checkpoint only after committing the events under it, so every
    // checkpoint read here is covered by the snapshot unless the log was really cut.
    let sink_notes = read_checkpoint_files(&options.checkpoint_files)?;
    let conn = store::open_reader(&options.db_path, std::time::Duration::from_millis(2000))?;
    // One read transaction: a consistent snapshot even while a writer appends.
    conn.execute_batch("BEGIN")
        .map_err(|e| map_sqlite(&e, &options.db_path))?;
    verify_conn(&conn, options, sink_notes, &key, progress)
}

/// Fails with a key problem unless `key` has the `expected` fingerprint (when given).
pub fn check_fingerprint(key: &VerifierKey, expected: Option<&str>) -> Result<(), VerifyError> {
    match expected {
        Some(hex) if !key.fingerprint().eq_ignore_ascii_case(hex.trim()) => Err(problem(
            ProblemKind::Key,
            None,
            format!(
                "the key found has fingerprint {}, not the {} you gave: the key was replaced",
                key.fingerprint(),
                hex.trim()
            ),
        )),
        _ => Ok(()),
    }
}

/// Reads the checkpoint notes of sink files, as (where it came from, note). Read them
/// before the database snapshot of [`verify_conn`] starts.
pub fn read_checkpoint_files(files: &[PathBuf]) -> Result<Vec<(String, String)>, VerifyError> {
    let mut notes = Vec::new();
    for file in files {
        for (i, note) in read_notes(file)?.into_iter().enumerate() {
            notes.push((
                format!("checkpoint {} in `{}`", i + 1, file.display()),
                note,
            ));
        }
    }
    Ok(notes)
}

/// Progress of a long verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Total(u64),
    Checked(u64),
}

/// Verifies over an open connection (inside a read transaction), with the sink notes
/// read before the transaction's first read (see [`read_checkpoint_files`]).
pub fn verify_conn(
    conn: &Connection,
    options: &VerifyOptions,
    sink_notes: Vec<(String, String)>,
    key: &VerifierKey,
    progress: &mut dyn FnMut(Progress),
) -> Result<Verified, VerifyError> {
    let path = &options.db_path;
    let map = |e: rusqlite::Error| VerifyError::Open(map_sqlite(&e, path));
    let total: i64 = conn
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .map_err(map)?;
    progress(Progress::Total(total as u64));

    // Checkpoints: stored ones and those in the sink files, each signature checked
    // (once per distinct note: the sink repeats the stored ones).
    let mut notes: Vec<(String, String, Checkpoint)> = Vec::new();
    let mut seen: HashMap<String, Checkpoint> = HashMap::new();
    {
        let mut stmt = conn
            .prepare("SELECT id, size, root, note FROM checkpoints ORDER BY id")
            .map_err(map)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })
            .map_err(map)?;
        for row in rows {
            let (id, size, root, note) = row.map_err(map)?;
            let origin = format!("checkpoint #{id} in the database");
            let checkpoint = checked(&mut seen, &note, key, &origin)?;
            if checkpoint.size != size as u64 || hex::encode(checkpoint.root) != root {
                return Err(problem(
                    ProblemKind::Malformed,
                    None,
                    format!("{origin}: the size or root column disagrees with the signed note"),
                ));
            }
            notes.push((origin, note, checkpoint));
        }
    }
    // The signed head: a checkpoint over every committed event, stored by each commit.
    let has_head: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'signed_head')",
            [],
            |r| r.get(0),
        )
        .map_err(map)?;
    if has_head {
        let head: Option<(i64, String, String)> = conn
            .query_row("SELECT size, root, note FROM signed_head", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
            .map_err(map)?;
        if let Some((size, root, note)) = head {
            let origin = "the signed head in the database".to_string();
            let checkpoint = checked(&mut seen, &note, key, &origin)?;
            if checkpoint.size != size as u64 || hex::encode(checkpoint.root) != root {
                return Err(problem(
                    ProblemKind::Malformed,
                    None,
                    format!("{origin}: the size or root column disagrees with the signed note"),
                ));
            }
            notes.push((origin, note, checkpoint));
        }
    }
    for (origin, note) in sink_notes {
        let checkpoint = checked(&mut seen, &note, key, &origin)?;
        notes.push((origin, note, checkpoint));
    }
    let mut by_size: BTreeMap<u64, (Hash, String, String)> = BTreeMap::new();
    for (origin, note, checkpoint) in notes {
        match by_size.get(&checkpoint.size) {
            Some((root, _, first)) if *root != checkpoint.root => {
                return Err(problem(
                    ProblemKind::Fork,
                    None,
                    format!(
                        "{first} and {origin} are both signed for size {} with different roots",
                        checkpoint.size
                    ),
                ));
            }
            Some(_) => {}
            None => {
                by_size.insert(checkpoint.size, (checkpoint.root, note, origin));
            }
        }
    }

    // The chain, row by row.
    let mut frontier = Frontier::new();
    let mut leaves: Vec<Hash> = Vec::with_capacity(total.max(0) as usize);
    let mut roots: BTreeMap<u64, Hash> = BTreeMap::new();
    if by_size.contains_key(&0) {
        roots.insert(0, frontier.root());
    }
    let mut prev = [0u8; 32];
    let mut prev_line_seq = 0u64;
    {
        let mut stmt = conn
            .prepare("SELECT seq, line, hash, type, run_id, ts FROM events ORDER BY seq")
            .map_err(map)?;
        let mut rows = stmt.query([]).map_err(map)?;
        while let Some(row) = rows.next().map_err(map)? {
            let position = frontier.size() + 1;
            let row_seq = row.get::<_, i64>(0).map_err(map)? as u64;
            let line: String = row.get(1).map_err(map)?;
            let stored_hash: String = row.get(2).map_err(map)?;
            let columns: (String, Option<String>, String) = (
                row.get(3).map_err(map)?,
                row.get(4).map_err(map)?,
                row.get(5).map_err(map)?,
            );
            let hash = leaf_hash(line.as_bytes());
            let value: Value = serde_json::from_str(&line).map_err(|_| {
                problem(
                    ProblemKind::Malformed,
                    Some(row_seq),
                    "the stored line is not JSON",
                )
            })?;
            let line_seq = value.get("seq").and_then(Value::as_u64).ok_or_else(|| {
                problem(
                    ProblemKind::Malformed,
                    Some(row_seq),
                    "the line has no integer `seq`",
                )
            })?;
            if line_seq != row_seq {
                if line_seq == prev_line_seq {
                    return Err(problem(
                        ProblemKind::Inserted,
                        Some(line_seq),
                        format!("two events claim seq {line_seq}: one was inserted"),
                    ));
                }
                return Err(problem(
                    ProblemKind::Reordered,
                    Some(row_seq),
                    format!("position {row_seq} holds the event with seq {line_seq}"),
                ));
            }
            if row_seq != position {
                return Err(problem(
                    ProblemKind::Missing,
                    Some(position),
                    format!("seq {position} is missing (the next event is seq {row_seq})"),
                ));
            }
            if to_canonical_string(&value) != line {
                return Err(problem(
                    ProblemKind::Edited,
                    Some(row_seq),
                    "the line is not in canonical (RFC 8785) form",
                ));
            }
            if decode_hash(&stored_hash) != Some(hash) {
                return Err(problem(
                    ProblemKind::Edited,
                    Some(row_seq),
                    "the line does not match its stored hash",
                ));
            }
            let expected_prev = if position == 1 {
                GENESIS_PREV.to_string()
            } else {
                hex::encode(prev)
            };
            if value.get("prev").and_then(Value::as_str) != Some(expected_prev.as_str()) {
                return Err(if position == 1 {
                    problem(
                        ProblemKind::Edited,
                        Some(1),
                        "the first event's `prev` is not the genesis value",
                    )
                } else {
                    problem(
                        ProblemKind::Edited,
                        Some(position - 1),
                        format!(
                            "the event changed after seq {position} was chained to it: seq {position}'s `prev` does not match its hash"
                        ),
                    )
                });
            }
            check_fields(&value, row_seq, &columns)?;
            frontier.push(hash);
            leaves.push(hash);
            prev = hash;
            prev_line_seq = line_seq;
            if by_size.contains_key(&position) {
                roots.insert(position, frontier.root());
            }
            if position.is_multiple_of(PROGRESS_STEP) {
                progress(Progress::Checked(position));
            }
        }
    }
    let size = frontier.size();
    progress(Progress::Checked(size));
    let root = frontier.root();

    // The auditor's trusted checkpoint: the log must contain and extend it.
    let mut trusted_size = None;
    if let Some(file) = &options.trusted_checkpoint {
        let trusted_notes = read_notes(file)?;
        let origin = format!("the trusted checkpoint `{}`", file.display());
        let Some(note) = trusted_notes.last() else {
            return Err(problem(
                ProblemKind::Malformed,
                None,
                format!("{origin} holds no checkpoint"),
            ));
        };
        let trusted = check_note(note, key, &origin)?;
        if trusted.size > size {
            return Err(problem(
                ProblemKind::Truncated,
                Some(size + 1),
                format!(
                    "the log has {size} events but {origin} covers {}: seq {}..{} were cut",
                    trusted.size,
                    size + 1,
                    trusted.size
                ),
            ));
        }
        let tree = Tree::new(leaves.clone());
        let proof = tree
            .consistency_proof(trusted.size, size)
            .unwrap_or_default();
        if !verify_consistency(trusted.size, size, &proof, &trusted.root, &root) {
            return Err(problem(
                ProblemKind::Fork,
                None,
                format!(
                    "the log does not extend {origin} (size {}): the consistency proof fails, the history was rewritten",
                    trusted.size
                ),
            ));
        }
        trusted_size = Some(trusted.size);
    }

    // Every signed checkpoint, smallest first.
    let mut verified = Vec::new();
    let mut last_good = 0u64;
    for (checkpoint_size, (checkpoint_root, note, origin)) in &by_size {
        let Some(actual) = roots.get(checkpoint_size) else {
            return Err(problem(
                ProblemKind::Truncated,
                Some(size + 1),
                format!(
                    "the log has {size} events but {origin} covers {checkpoint_size}: seq {}..{checkpoint_size} were cut",
                    size + 1
                ),
            ));
        };
        let only_outside = !origin.contains("in the database");
        if actual != checkpoint_root && only_outside {
            // The database no longer holds this checkpoint: the log was cut below it
            // and continued (its sequence numbers reused), or replaced by another
            // history. Either way it does not extend what was published.
            return Err(problem(
                ProblemKind::Fork,
                Some(last_good + 1),
                format!(
                    "the events seq {}..{checkpoint_size} do not match {origin}, which the database no longer holds: the log was cut below it and continued, or forked",
                    last_good + 1
                ),
            ));
        }
        if actual != checkpoint_root {
            return Err(problem(
                ProblemKind::RootMismatch,
                Some(last_good + 1),
                format!(
                    "the events seq {}..{checkpoint_size} do not match {origin}: one of them was changed",
                    last_good + 1
                ),
            ));
        }
        last_good = *checkpoint_size;
        verified.push(VerifiedCheckpoint {
            size: *checkpoint_size,
            root: *checkpoint_root,
            note: note.clone(),
        });
    }

    let mut warnings = Vec::new();
    let covered = verified.last().map_or(0, |c| c.size);
    if covered < size && has_head {
        // Each commit stores a signed head over all of its events, in the same
        // transaction: unsigned events were added (or the head removed) by hand.
        return Err(problem(
            ProblemKind::Unsigned,
            Some(covered + 1),
            format!(
                "seq {}..{size} are covered by no signed checkpoint: every commit signs its events, so they were added or rewritten outside the gateway",
                covered + 1
            ),
        ));
    }
    match verified.last() {
        None if size > 0 => warnings.push(
            "no signed checkpoint covers the log: a cut tail could not be detected".to_string(),
        ),
        Some(latest) if latest.size < size => {
            warnings.push(format!(
                "seq {}..{size} are not yet covered by a signed checkpoint",
                latest.size + 1
            ));
        }
        _ => {}
    }
    if options.key_fingerprint.is_none() {
        warnings.push(format!(
            "no --key-fingerprint given: the key in `{}` (fingerprint {}) was trusted as found; an insider who replaced it could have re-signed a rewritten log",
            options.key_dir.display(),
            key.fingerprint()
        ));
    }
    let report = Report {
        events: size,
        head_hash: (size > 0).then(|| hex::encode(prev)),
        root: hex::encode(root),
        checkpoints: verified.len(),
        latest_checkpoint_size: verified.last().map(|c| c.size),
        trusted_checkpoint_size: trusted_size,
        key_fingerprint: key.fingerprint(),
        key_fingerprint_confirmed: options.key_fingerprint.is_some(),
        warnings,
    };
    Ok(Verified {
        report,
        leaves,
        checkpoints: verified,
        key: key.clone(),
    })
}

/// The other fields every line must carry, and the indexed columns that must agree.
fn check_fields(
    value: &Value,
    seq: u64,
    columns: &(String, Option<String>, String),
) -> Result<(), VerifyError> {
    let text = |k: &str| value.get(k).and_then(Value::as_str);
    if text("event_id") != Some(event_id(seq).as_str()) {
        return Err(problem(
            ProblemKind::Edited,
            Some(seq),
            "the `event_id` does not match the seq",
        ));
    }
    let Some(kind) = text("type").and_then(EventType::parse) else {
        return Err(problem(
            ProblemKind::Malformed,
            Some(seq),
            "the `type` is not a known event type",
        ));
    };
    let Some(ts) = text("timestamp_utc") else {
        return Err(problem(
            ProblemKind::Malformed,
            Some(seq),
            "the line has no `timestamp_utc`",
        ));
    };
    if columns.0 != kind.as_str() || columns.1.as_deref() != text("run_id") || columns.2 != ts {
        return Err(problem(
            ProblemKind::Edited,
            Some(seq),
            "the indexed columns (type, run_id, ts) disagree with the line",
        ));
    }
    if !integers_only(value, 0) {
        return Err(problem(
            ProblemKind::Malformed,
            Some(seq),
            "the line holds a number that is not an integer within 2^53",
        ));
    }
    Ok(())
}

/// True if every number in `value` is an integer within +-(2^53 - 1).
fn integers_only(value: &Value, depth: usize) -> bool {
    match value {
        Value::Number(n) => {
            n.as_u64().is_some_and(|v| v <= MAX_SAFE_INTEGER)
                || n.as_i64()
                    .is_some_and(|v| v.unsigned_abs() <= MAX_SAFE_INTEGER)
        }
        Value::Array(items) => depth < 128 && items.iter().all(|v| integers_only(v, depth + 1)),
        Value::Object(map) => depth < 128 && map.values().all(|v| integers_only(v, depth + 1)),
        _ => true,
    }
}

/// [`check_note`], remembering the notes already verified.
fn checked(
    seen: &mut HashMap<String, Checkpoint>,
    note: &str,
    key: &VerifierKey,
    origin: &str,
) -> Result<Checkpoint, VerifyError> {
    if let Some(checkpoint) = seen.get(note) {
        return Ok(checkpoint.clone());
    }
    let checkpoint = check_note(note, key, origin)?;
    seen.insert(note.to_string(), checkpoint.clone());
    Ok(checkpoint)
}

fn check_note(
    note: &str,
    key: &VerifierKey,
    origin: &str,
) -> Result<super::checkpoint::Checkpoint, VerifyError> {
    verify_note(note, key).map_err(|e| match e {
        NoteError::Malformed(what) => {
            problem(ProblemKind::Malformed, None, format!("{origin}: {what}"))
        }
        NoteError::NoSignatureByKey { .. } | NoteError::BadSignature { .. } => {
            problem(ProblemKind::Signature, None, format!("{origin}: {e}"))
        }
    })
}

/// The most bytes read from a checkpoint file.
const MAX_CHECKPOINT_FILE_BYTES: u64 = 256 * 1024 * 1024;

fn read_notes(file: &Path) -> Result<Vec<String>, VerifyError> {
    let io = |what: String| {
        VerifyError::Open(AuditError::Io {
            path: file.to_path_buf(),
            what,
        })
    };
    let len = std::fs::metadata(file)
        .map_err(|e| io(format!("cannot read the checkpoint file: {e}")))?
        .len();
    if len > MAX_CHECKPOINT_FILE_BYTES {
        return Err(io("the checkpoint file is too large".into()));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| io(format!("cannot read the checkpoint file: {e}")))?;
    split_notes(&text).map_err(|what| {
        problem(
            ProblemKind::Malformed,
            None,
            format!("`{}`: {what}", file.display()),
        )
    })
}
