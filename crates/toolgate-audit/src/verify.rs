//! Verification of an audit log: recompute every line's hash, the `seq`/`prev` chain,
//! the Merkle tree, and every checkpoint signature and root, across its segments (each
//! must start where the one before ends; an archived start must be vouched for by an
//! `audit_segments_archived` event); optionally check that the log still contains and
//! extends a checkpoint the auditor kept.
//!
//! The first problem found is reported with the seq it concerns and what is wrong;
//! [`ProblemKind::exit_code`] maps it to the CLI's exit code.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};
use serde::Serialize;
use serde_json::Value;

use super::checkpoint::{Checkpoint, NoteError, NotesFileError, read_notes_file, verify_note};
use super::keys::{VerifierKey, load_verifier};
use super::line::{GENESIS_PREV, MAX_SAFE_INTEGER, event_id};
use super::merkle::{Frontier, Hash, leaf_hash};
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
    /// by [`verify_db`] (callers of [`verify_segments`] read them with
    /// [`read_checkpoint_files`]).
    pub checkpoint_files: Vec<PathBuf>,
    /// A checkpoint note the auditor kept; the log must contain and extend it.
    pub trusted_checkpoint: Option<PathBuf>,
    /// The key fingerprint the auditor recorded (hex SHA-256 of the public key); the
    /// key in `key_dir` must have it. None: the key is trusted as found, with a warning.
    pub key_fingerprint: Option<String>,
    /// Directories holding archived segments (`toolgate audit archive --to`): their
    /// segments are verified with those beside the database, as one log.
    pub archive_dirs: Vec<PathBuf>,
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
    /// A line is not a well-formed event, or a part of the log's format is missing or
    /// unusable (a start record, the `signed_head` table, a checkpoint row).
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
    /// The segment files verified, oldest first (their numbers).
    pub segments: Vec<u64>,
    /// The first seq verified: 1, or the first seq after an archive.
    pub first_seq: u64,
    /// Older segments were archived: the last archived segment and its last seq (the
    /// verification started from the oldest remaining segment's start record, which
    /// the newest `audit_segments_archived` event vouches for).
    pub archived_through_segment: Option<u64>,
    pub archived_through_seq: Option<u64>,
}

/// An intact log: the report, and what export builds on.
#[derive(Debug, Clone)]
pub struct Verified {
    pub report: Report,
    /// Every leaf hash from seq 1 (only when asked for, see [`verify_segments`]).
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
    let segments = open_segments(&options.db_path, &options.archive_dirs)?;
    verify_segments(&segments, options, sink_notes, &key, progress, false)
}

/// One segment file of the log, open read-only inside a read transaction.
pub struct OpenSegment {
    pub number: u64,
    pub path: PathBuf,
    pub conn: Connection,
}

/// Opens every segment of the log whose first segment is `base`, oldest first, each
/// in its own read transaction (a consistent snapshot of each file while a writer
/// appends; a segment sealed meanwhile is seen as it was at the listing or after).
pub fn open_segments(
    base: &Path,
    archive_dirs: &[PathBuf],
) -> Result<Vec<OpenSegment>, VerifyError> {
    let mut listed = super::segments::list(base)?;
    for dir in archive_dirs {
        if !dir.is_dir() {
            return Err(VerifyError::Open(AuditError::Io {
                path: dir.clone(),
                what: "no such archive directory".into(),
            }));
        }
        listed.extend(super::segments::list_in(base, Some(dir))?);
    }
    listed.sort();
    if let Some(pair) = listed.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(problem(
            ProblemKind::Inserted,
            None,
            format!(
                "segment {} is both `{}` and `{}`: keep one copy",
                pair[0].0,
                pair[0].1.display(),
                pair[1].1.display()
            ),
        ));
    }
    if listed.is_empty() {
        return Err(VerifyError::Open(AuditError::Io {
            path: base.to_path_buf(),
            what: "no such file".into(),
        }));
    }
    let mut out = Vec::with_capacity(listed.len());
    for (number, path) in listed {
        let conn = store::open_reader(&path, std::time::Duration::from_millis(2000))?;
        conn.execute_batch("BEGIN")
            .map_err(|e| map_sqlite(&e, &path))?;
        // The first read pins the snapshot.
        conn.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))
            .map_err(|e| map_sqlite(&e, &path))?;
        out.push(OpenSegment { number, path, conn });
    }
    Ok(out)
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
/// before the database snapshot of [`verify_segments`] starts.
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

/// What an `audit_segments_archived` event says (see docs/audit.md).
struct ArchiveClaim {
    seq: u64,
    through_segment: u64,
    through_seq: u64,
    through_root: String,
}

/// Verifies the segments (oldest first, each inside a read transaction), with the sink
/// notes read before the first segment was opened (see [`read_checkpoint_files`]).
/// `keep_leaves` keeps every leaf hash (32 bytes per event) for export; verification
/// alone keeps only the tree's right edge.
pub fn verify_segments(
    segments: &[OpenSegment],
    options: &VerifyOptions,
    sink_notes: Vec<(String, String)>,
    key: &VerifierKey,
    progress: &mut dyn FnMut(Progress),
    keep_leaves: bool,
) -> Result<Verified, VerifyError> {
    let mut verifier = Verifier {
        segments,
        options,
        key,
        progress,
        keep_leaves,
        by_size: BTreeMap::new(),
        trusted: None,
        frontier: Frontier::new(),
        prev: [0u8; 32],
        leaves: Vec::new(),
        roots: BTreeMap::new(),
        boundaries: BTreeMap::new(),
        claims: Vec::new(),
        start_size: 0,
        prev_line_seq: 0,
        previous_seal: None,
    };
    let total = verifier.count_events()?;
    verifier.collect_checkpoints(sink_notes)?;
    verifier.read_trusted()?;
    verifier.walk_chain(total)?;
    let archived = verifier.check_archive()?;
    let trusted_size = verifier.check_trusted()?;
    let verified = verifier.check_checkpoints()?;
    verifier.check_heads_and_report(verified, archived, trusted_size)
}

/// A signed checkpoint as verification keeps it, by size: its root, its note, where it
/// was found first, and whether it is stored in a segment present.
type SignedAt = (Hash, String, String, bool);

/// One verification of a log's segments ([`verify_segments`]), phase by phase, in
/// order: count the events, collect the checkpoints, read the trusted checkpoint, walk
/// the chain, check the archive, the trusted checkpoint, every signed checkpoint, and
/// the signed heads. Every phase feeds (or reads) the same running tree.
struct Verifier<'a> {
    segments: &'a [OpenSegment],
    options: &'a VerifyOptions,
    key: &'a VerifierKey,
    progress: &'a mut dyn FnMut(Progress),
    keep_leaves: bool,
    /// Every signed checkpoint, by size (one root per size, or the log forked).
    by_size: BTreeMap<u64, SignedAt>,
    /// The auditor's trusted checkpoint and where it was read.
    trusted: Option<(Checkpoint, String)>,
    /// The tree over the events walked so far.
    frontier: Frontier,
    /// The hash of the last event walked.
    prev: Hash,
    /// Every leaf hash, when kept for export.
    leaves: Vec<Hash>,
    /// The tree's root at each size a checkpoint (or the trusted one) signs.
    roots: BTreeMap<u64, Hash>,
    /// Where each sealed segment ends: its last seq and the root there.
    boundaries: BTreeMap<u64, (u64, Hash)>,
    /// What the `audit_segments_archived` events met on the way say.
    claims: Vec<ArchiveClaim>,
    /// The size of the log before the oldest segment present (0 unless archived).
    start_size: u64,
    /// The `seq` of the last line walked.
    prev_line_seq: u64,
    /// The last segment walked, and whether it is sealed.
    previous_seal: Option<(u64, bool)>,
}

impl Verifier<'_> {
    /// How many events the segments hold, reported as the progress total.
    fn count_events(&mut self) -> Result<u64, VerifyError> {
        let mut total = 0u64;
        for segment in self.segments {
            let count: i64 = segment
                .conn
                .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
                .map_err(|e| VerifyError::Open(map_sqlite(&e, &segment.path)))?;
            total += count.max(0) as u64;
        }
        (self.progress)(Progress::Total(total));
        Ok(total)
    }

    /// Checkpoints: stored ones (in every segment) and those in the sink files, each
    /// signature checked (once per distinct note: the sink repeats the stored ones),
    /// kept by size; two roots for one size are a fork.
    fn collect_checkpoints(
        &mut self,
        sink_notes: Vec<(String, String)>,
    ) -> Result<(), VerifyError> {
        let key = self.key;
        // (origin, note, checkpoint, stored in a segment present)
        let mut notes: Vec<(String, String, Checkpoint, bool)> = Vec::new();
        let mut seen: HashMap<String, Checkpoint> = HashMap::new();
        for segment in self.segments {
            let conn = &segment.conn;
            let path = &segment.path;
            let map = |e: rusqlite::Error| VerifyError::Open(map_sqlite(&e, path));
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
                let origin = format!("checkpoint #{id} in segment {}", segment.number);
                let checkpoint = stored_note(&mut seen, key, &origin, &note, size, &root)?;
                notes.push((origin, note, checkpoint, true));
            }
            // The signed head: a checkpoint over every committed event, stored by each commit.
            check_head_table(segment)?;
            let head: Option<(i64, String, String)> = conn
                .query_row("SELECT size, root, note FROM signed_head", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()
                .map_err(map)?;
            if let Some((size, root, note)) = head {
                let origin = format!("the signed head in segment {}", segment.number);
                let checkpoint = stored_note(&mut seen, key, &origin, &note, size, &root)?;
                notes.push((origin, note, checkpoint, true));
            }
            if let Some(seal) = super::segments::read_seal(conn, path)? {
                let origin = format!("the seal of segment {}", segment.number);
                let checkpoint = checked(&mut seen, &seal.note, key, &origin)?;
                if checkpoint.size != seal.last_seq
                    || crate::canonical::to_hex(checkpoint.root) != seal.root
                {
                    return Err(problem(
                        ProblemKind::Edited,
                        Some(seal.last_seq),
                        format!("{origin}: its size or root disagrees with its signed note"),
                    ));
                }
                notes.push((origin, seal.note, checkpoint, true));
            }
        }
        for (origin, note) in sink_notes {
            let checkpoint = checked(&mut seen, &note, key, &origin)?;
            notes.push((origin, note, checkpoint, false));
        }
        for (origin, note, checkpoint, inside) in notes {
            match self.by_size.get_mut(&checkpoint.size) {
                Some((root, _, first, _)) if *root != checkpoint.root => {
                    return Err(problem(
                        ProblemKind::Fork,
                        None,
                        format!(
                            "{first} and {origin} are both signed for size {} with different roots",
                            checkpoint.size
                        ),
                    ));
                }
                Some(entry) => entry.3 |= inside,
                None => {
                    self.by_size
                        .insert(checkpoint.size, (checkpoint.root, note, origin, inside));
                }
            }
        }
        Ok(())
    }

    /// The auditor's trusted checkpoint, read up front so its root is recorded on the way.
    fn read_trusted(&mut self) -> Result<(), VerifyError> {
        let Some(file) = &self.options.trusted_checkpoint else {
            return Ok(());
        };
        let trusted_notes = read_notes(file)?;
        let origin = format!("the trusted checkpoint `{}`", file.display());
        let Some(note) = trusted_notes.last() else {
            return Err(problem(
                ProblemKind::Malformed,
                None,
                format!("{origin} holds no checkpoint"),
            ));
        };
        self.trusted = Some((check_note(note, self.key, &origin)?, origin));
        Ok(())
    }

    /// The chain, segment by segment, row by row.
    fn walk_chain(&mut self, total: u64) -> Result<(), VerifyError> {
        if self.keep_leaves {
            self.leaves.reserve(total as usize);
        }
        let segments = self.segments;
        for (index, segment) in segments.iter().enumerate() {
            let start = self.start_segment(index, segment)?;
            self.walk_rows(index, segment)?;
            self.end_segment(segment, &start)?;
        }
        let size = self.frontier.size();
        (self.progress)(Progress::Checked(size - self.start_size));
        Ok(())
    }

    /// A segment's start record: the first segment present starts the tree from it;
    /// every later one must follow a sealed segment and start exactly where it ends.
    fn start_segment(
        &mut self,
        index: usize,
        segment: &OpenSegment,
    ) -> Result<super::segments::StartRecord, VerifyError> {
        let path = &segment.path;
        let start = match super::segments::read_start(&segment.conn, path)? {
            Some(start) => start,
            None if segment.number == 1 => super::segments::StartRecord::genesis(0),
            None => {
                return Err(problem(
                    ProblemKind::Malformed,
                    None,
                    format!("`{}` has no segment start record", path.display()),
                ));
            }
        };
        if start.segment != segment.number {
            return Err(problem(
                ProblemKind::Reordered,
                Some(start.size + 1),
                format!(
                    "the file of segment {} (`{}`) holds segment {}: segment files were renamed or swapped",
                    segment.number,
                    path.display(),
                    start.segment
                ),
            ));
        }
        let Some((start_frontier, start_prev)) = start.state() else {
            return Err(problem(
                ProblemKind::Malformed,
                Some(start.size + 1),
                format!("segment {}: the start record is malformed", segment.number),
            ));
        };
        if index == 0 {
            if segment.number > 1 && self.keep_leaves {
                return Err(problem(
                    ProblemKind::Missing,
                    Some(1),
                    format!(
                        "segments 1..{} are not here (archived?): an export needs every segment from seq 1; copy the archived segments back beside the database",
                        segment.number - 1
                    ),
                ));
            }
            self.frontier = start_frontier;
            self.prev = start_prev;
            self.start_size = start.size;
            self.prev_line_seq = start.size;
            if self.by_size.contains_key(&start.size) {
                self.roots.insert(start.size, self.frontier.root());
            }
            if segment.number > 1 {
                self.boundaries
                    .insert(segment.number - 1, (start.size, self.frontier.root()));
            }
            return Ok(start);
        }
        let frontier = &self.frontier;
        let expected = self.segments[index - 1].number + 1;
        if segment.number != expected {
            return Err(problem(
                ProblemKind::Missing,
                Some(frontier.size() + 1),
                format!(
                    "segment {expected} is missing (the next present is segment {}): events from seq {} on were removed",
                    segment.number,
                    frontier.size() + 1
                ),
            ));
        }
        match self.previous_seal {
            Some((_, true)) => {}
            _ => {
                return Err(problem(
                    ProblemKind::Malformed,
                    Some(frontier.size()),
                    format!(
                        "segment {} is followed by segment {} but is not sealed",
                        segment.number - 1,
                        segment.number
                    ),
                ));
            }
        }
        if start.size != frontier.size()
            || start_prev != self.prev
            || start_frontier.root() != frontier.root()
        {
            let kind = if start.size > frontier.size() {
                ProblemKind::Missing
            } else {
                ProblemKind::Edited
            };
            return Err(problem(
                kind,
                Some(frontier.size() + 1),
                format!(
                    "segment {} does not start where segment {} ends (its start record says size {}, the log has {}): the segment was replaced or events were removed",
                    segment.number,
                    segment.number - 1,
                    start.size,
                    frontier.size()
                ),
            ));
        }
        Ok(start)
    }

    /// Every row of a segment, in `seq` order, onto the running tree.
    fn walk_rows(&mut self, index: usize, segment: &OpenSegment) -> Result<(), VerifyError> {
        let path = &segment.path;
        let map = |e: rusqlite::Error| VerifyError::Open(map_sqlite(&e, path));
        let mut stmt = segment
            .conn
            .prepare("SELECT seq, line, hash, type, run_id, ts FROM events ORDER BY seq")
            .map_err(map)?;
        let mut rows = stmt.query([]).map_err(map)?;
        while let Some(row) = rows.next().map_err(map)? {
            let row_seq = row.get::<_, i64>(0).map_err(map)? as u64;
            let line: String = row.get(1).map_err(map)?;
            let stored_hash: String = row.get(2).map_err(map)?;
            let columns: (String, Option<String>, String) = (
                row.get(3).map_err(map)?,
                row.get(4).map_err(map)?,
                row.get(5).map_err(map)?,
            );
            self.walk_row(index, segment, row_seq, &line, &stored_hash, &columns)?;
        }
        Ok(())
    }

    /// One stored event: its line, hash, `seq` and `prev` checked, then pushed onto
    /// the tree (its root recorded where a checkpoint signs it).
    fn walk_row(
        &mut self,
        index: usize,
        segment: &OpenSegment,
        row_seq: u64,
        line: &str,
        stored_hash: &str,
        columns: &(String, Option<String>, String),
    ) -> Result<(), VerifyError> {
        let position = self.frontier.size() + 1;
        let hash = leaf_hash(line.as_bytes());
        let value: Value = serde_json::from_str(line).map_err(|_| {
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
            if line_seq == self.prev_line_seq {
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
        if decode_hash(stored_hash) != Some(hash) {
            return Err(problem(
                ProblemKind::Edited,
                Some(row_seq),
                "the line does not match its stored hash",
            ));
        }
        self.check_prev(&value, position, index, segment)?;
        check_fields(&value, row_seq, columns)?;
        if columns.0 == EventType::AuditSegmentsArchived.as_str() {
            self.claims.push(archive_claim(&value, row_seq)?);
        }
        self.frontier.push(hash);
        if self.keep_leaves {
            self.leaves.push(hash);
        }
        self.prev = hash;
        self.prev_line_seq = line_seq;
        if self.by_size.contains_key(&position)
            || self.trusted.as_ref().is_some_and(|t| t.0.size == position)
        {
            self.roots.insert(position, self.frontier.root());
        }
        if position.is_multiple_of(PROGRESS_STEP) {
            (self.progress)(Progress::Checked(position - self.start_size));
        }
        Ok(())
    }

    /// An event's `prev` must be the hash of the event before it (the genesis value
    /// for seq 1, the start record's for the first event of the oldest segment here).
    fn check_prev(
        &self,
        value: &Value,
        position: u64,
        index: usize,
        segment: &OpenSegment,
    ) -> Result<(), VerifyError> {
        let expected_prev = if position == 1 {
            GENESIS_PREV.to_string()
        } else {
            crate::canonical::to_hex(self.prev)
        };
        if value.get("prev").and_then(Value::as_str) == Some(expected_prev.as_str()) {
            return Ok(());
        }
        Err(if position == 1 {
            problem(
                ProblemKind::Edited,
                Some(1),
                "the first event's `prev` is not the genesis value",
            )
        } else if position == self.start_size + 1 && index == 0 {
            problem(
                ProblemKind::Edited,
                Some(position),
                format!(
                    "seq {position}'s `prev` does not match the start record of segment {}: the start record was replaced",
                    segment.number
                ),
            )
        } else {
            problem(
                ProblemKind::Edited,
                Some(position - 1),
                format!(
                    "the event changed after seq {position} was chained to it: seq {position}'s `prev` does not match its hash"
                ),
            )
        })
    }

    /// A segment's seal, if it has one, must say exactly what the segment holds; its
    /// end is then a boundary an archive claim may name.
    fn end_segment(
        &mut self,
        segment: &OpenSegment,
        start: &super::segments::StartRecord,
    ) -> Result<(), VerifyError> {
        let frontier = &self.frontier;
        let seal = super::segments::read_seal(&segment.conn, &segment.path)?;
        if let Some(seal) = &seal {
            let matches = seal.segment == segment.number
                && seal.first_seq == start.size + 1
                && seal.last_seq == frontier.size()
                && seal.last_hash == crate::canonical::to_hex(self.prev)
                && seal.root == crate::canonical::to_hex(frontier.root())
                && seal.frontier == frontier.nodes().iter().map(hex::encode).collect::<Vec<_>>();
            if !matches {
                let kind = if seal.last_seq > frontier.size() {
                    ProblemKind::Truncated
                } else {
                    ProblemKind::Edited
                };
                return Err(problem(
                    kind,
                    Some(frontier.size().min(seal.last_seq) + 1),
                    format!(
                        "segment {} does not hold what its seal says (seq {}..{}, the segment has up to {}): events were removed, added or changed",
                        segment.number,
                        seal.first_seq,
                        seal.last_seq,
                        frontier.size()
                    ),
                ));
            }
            self.boundaries
                .insert(segment.number, (frontier.size(), frontier.root()));
        }
        self.previous_seal = Some((segment.number, seal.is_some()));
        Ok(())
    }

    /// An archive: the oldest remaining segment starts after seq 1. The newest
    /// `audit_segments_archived` event must vouch for it (else segments were removed),
    /// and each archive claim must match the boundary it names. Returns the archived
    /// segments and events (through segment, through seq), if any.
    fn check_archive(&self) -> Result<Option<(u64, u64)>, VerifyError> {
        for claim in &self.claims {
            if let Some((last_seq, boundary_root)) = self.boundaries.get(&claim.through_segment)
                && (claim.through_seq != *last_seq
                    || claim.through_root != crate::canonical::to_hex(boundary_root))
            {
                return Err(problem(
                    ProblemKind::Edited,
                    Some(claim.through_seq + 1),
                    format!(
                        "the archive recorded at seq {} says segment {} ended at seq {} with root {}, but the log here has seq {last_seq} with root {}: a start record or segment was replaced",
                        claim.seq,
                        claim.through_segment,
                        claim.through_seq,
                        claim.through_root,
                        crate::canonical::to_hex(boundary_root)
                    ),
                ));
            }
        }
        let first_number = self.segments.first().map_or(1, |s| s.number);
        if first_number <= 1 {
            return Ok(None);
        }
        let vouched = self
            .claims
            .iter()
            .map(|c| c.through_segment)
            .max()
            .is_some_and(|through| through >= first_number - 1);
        if !vouched {
            return Err(problem(
                ProblemKind::Missing,
                Some(1),
                format!(
                    "segments 1..{} are gone and no audit_segments_archived event in the log records their archive: they were removed",
                    first_number - 1
                ),
            ));
        }
        Ok(Some((first_number - 1, self.start_size)))
    }

    /// The auditor's trusted checkpoint: the log must contain and extend it (the root
    /// over its first `size` events, recomputed, must be the one it signs). Returns
    /// its size.
    fn check_trusted(&self) -> Result<Option<u64>, VerifyError> {
        let Some((trusted, origin)) = &self.trusted else {
            return Ok(None);
        };
        let size = self.frontier.size();
        let start_size = self.start_size;
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
        if trusted.size < start_size {
            // The events under it are not here: a forged log could start above it and
            // claim the older segments were archived. Only the archive can show it.
            return Err(problem(
                ProblemKind::Truncated,
                None,
                format!(
                    "{origin} (size {}) predates the oldest segment here (which starts after seq {start_size}): cannot show that the log extends the trusted checkpoint; give the archived segments with --archive",
                    trusted.size
                ),
            ));
        }
        if self.roots.get(&trusted.size) != Some(&trusted.root) {
            return Err(problem(
                ProblemKind::Fork,
                None,
                format!(
                    "the log does not extend {origin} (size {}): the root over its events differs, the history was rewritten",
                    trusted.size
                ),
            ));
        }
        Ok(Some(trusted.size))
    }

    /// Every signed checkpoint, smallest first: the root over its events, recomputed,
    /// must be the one it signs. Returns those verified, and how many cover only
    /// archived events (checked against the archive, not here).
    fn check_checkpoints(&self) -> Result<(Vec<VerifiedCheckpoint>, usize), VerifyError> {
        let size = self.frontier.size();
        let mut verified = Vec::new();
        let mut last_good = 0u64;
        let mut before_start = 0usize;
        for (checkpoint_size, (checkpoint_root, note, origin, inside)) in &self.by_size {
            if *checkpoint_size < self.start_size {
                // Over archived events: checked against the archive, not here.
                before_start += 1;
                continue;
            }
            let Some(actual) = self.roots.get(checkpoint_size) else {
                return Err(problem(
                    ProblemKind::Truncated,
                    Some(size + 1),
                    format!(
                        "the log has {size} events but {origin} covers {checkpoint_size}: seq {}..{checkpoint_size} were cut",
                        size + 1
                    ),
                ));
            };
            let only_outside = !inside;
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
        Ok((verified, before_start))
    }

    /// Each commit stores a signed head over all of its events, in the same
    /// transaction: unsigned events were added (or the head removed) by hand. Then the
    /// report, with what the auditor should know (warnings).
    fn check_heads_and_report(
        self,
        (verified, before_start): (Vec<VerifiedCheckpoint>, usize),
        archived: Option<(u64, u64)>,
        trusted_size: Option<u64>,
    ) -> Result<Verified, VerifyError> {
        let (size, start_size, key, options) = (
            self.frontier.size(),
            self.start_size,
            self.key,
            self.options,
        );
        let mut warnings = Vec::new();
        if before_start > 0 {
            warnings.push(format!(
                "{before_start} checkpoints cover only archived events (before seq {}): check them against the archive",
                start_size + 1
            ));
        }
        check_signed(&verified, start_size, size)?;
        if options.key_fingerprint.is_none() {
            warnings.push(format!(
                "no --key-fingerprint given: the key in `{}` (fingerprint {}) was trusted as found; an insider who replaced it could have re-signed a rewritten log",
                options.key_dir.display(),
                key.fingerprint()
            ));
        }
        let report = Report {
            events: size,
            head_hash: (size > 0).then(|| crate::canonical::to_hex(self.prev)),
            root: crate::canonical::to_hex(self.frontier.root()),
            checkpoints: verified.len(),
            latest_checkpoint_size: verified.last().map(|c| c.size),
            trusted_checkpoint_size: trusted_size,
            key_fingerprint: key.fingerprint(),
            key_fingerprint_confirmed: options.key_fingerprint.is_some(),
            warnings,
            segments: self.segments.iter().map(|s| s.number).collect(),
            first_seq: start_size + 1,
            archived_through_segment: archived.map(|a| a.0),
            archived_through_seq: archived.map(|a| a.1),
        };
        Ok(Verified {
            report,
            leaves: self.leaves,
            checkpoints: verified,
            key: key.clone(),
        })
    }
}

/// Fails unless the `signed_head` table of `segment` is there as a table. The writer
/// creates it with the schema of every `toolgate-audit/1` segment and stores the head
/// of each commit in it; without it (dropped, renamed, replaced by a view) the newest
/// events would be covered by no signature and could be rewritten unseen.
fn check_head_table(segment: &OpenSegment) -> Result<(), VerifyError> {
    let kind: Option<String> = segment
        .conn
        .query_row(
            "SELECT type FROM sqlite_master WHERE name = 'signed_head'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| VerifyError::Open(map_sqlite(&e, &segment.path)))?;
    let what = match kind.as_deref() {
        Some("table") => return Ok(()),
        Some(other) => format!("`signed_head` is a {other}, not the table"),
        None => "it has no `signed_head` table (dropped or renamed)".to_string(),
    };
    Err(problem(
        ProblemKind::Malformed,
        None,
        format!(
            "segment {} (`{}`): {what}: every commit stores its signed head there, so the newest events were left unsigned by hand",
            segment.number,
            segment.path.display()
        ),
    ))
}

/// Fails with `unsigned` unless the signed checkpoints (sorted by size) cover every
/// event from `start_size + 1` to `size`. Every commit signs its events (the signed
/// head), so an intact log never has any left over; export checks it again before it
/// signs a checkpoint of its own.
pub fn check_signed(
    checkpoints: &[VerifiedCheckpoint],
    start_size: u64,
    size: u64,
) -> Result<(), VerifyError> {
    let covered = checkpoints.last().map_or(0, |c| c.size).max(start_size);
    if covered >= size {
        return Ok(());
    }
    Err(problem(
        ProblemKind::Unsigned,
        Some(covered + 1),
        format!(
            "seq {}..{size} are covered by no signed checkpoint: every commit signs its events, so they were added or rewritten outside the gateway",
            covered + 1
        ),
    ))
}

/// Reads the claim of an `audit_segments_archived` event (`details.through_segment`,
/// `details.through_seq`, `details.through_root`).
fn archive_claim(value: &Value, seq: u64) -> Result<ArchiveClaim, VerifyError> {
    let details = value.get("details");
    let field = |k: &str| details.and_then(|d| d.get(k));
    match (
        field("through_segment").and_then(Value::as_u64),
        field("through_seq").and_then(Value::as_u64),
        field("through_root").and_then(Value::as_str),
    ) {
        (Some(through_segment), Some(through_seq), Some(root)) => Ok(ArchiveClaim {
            seq,
            through_segment,
            through_seq,
            through_root: root.to_string(),
        }),
        _ => Err(problem(
            ProblemKind::Malformed,
            Some(seq),
            "an audit_segments_archived event without through_segment, through_seq and through_root",
        )),
    }
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
/// A stored checkpoint row: its signed note checked, and its `size` and `root` columns
/// the note's own.
fn stored_note(
    seen: &mut HashMap<String, Checkpoint>,
    key: &VerifierKey,
    origin: &str,
    note: &str,
    size: i64,
    root: &str,
) -> Result<Checkpoint, VerifyError> {
    let checkpoint = checked(seen, note, key, origin)?;
    if checkpoint.size != size as u64 || crate::canonical::to_hex(checkpoint.root) != root {
        return Err(problem(
            ProblemKind::Malformed,
            None,
            format!("{origin}: the size or root column disagrees with the signed note"),
        ));
    }
    Ok(checkpoint)
}

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

/// The notes of a checkpoint file (a sink's, or the one given with `--checkpoints`).
fn read_notes(file: &Path) -> Result<Vec<String>, VerifyError> {
    read_notes_file(file, "the checkpoint file").map_err(|e| match e {
        NotesFileError::Io(what) => VerifyError::Open(AuditError::Io {
            path: file.to_path_buf(),
            what,
        }),
        NotesFileError::Malformed(what) => problem(ProblemKind::Malformed, None, what),
    })
}
