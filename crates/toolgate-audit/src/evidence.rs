//! A run's evidence: its events, each with its verification status against the latest
//! signed checkpoint, and its export bundle (one JSON file holding an export directory
//! that `audit/verify_export.py` checks offline).
//!
//! INVARIANT: an event is reported `verified` only when the whole log verified (chain,
//! Merkle roots, every checkpoint signature) in one read snapshot and the event's
//! inclusion proof checks against the newest signed checkpoint's root.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::AuditError;
use super::export::{ExportError, ExportFormat, ExportOptions, ExportSummary, export};
use super::keys::VerifierKey;
use super::merkle::{Tree, leaf_hash, verify_inclusion};
use super::signer::Signer;
use super::store::map_sqlite;
use super::verify::{Problem, VerifyError, VerifyOptions, open_segments, verify_segments};

/// The most events one page of a run's evidence holds.
pub const MAX_EVIDENCE_PAGE: usize = 500;

/// The format name of a run's export bundle.
pub const BUNDLE_FORMAT: &str = "toolgate-audit-export-bundle/1";

/// The files an export directory may hold, the only names a bundle carries
/// (`cosignatures.txt` only when the gateway has witnesses).
pub const BUNDLE_FILES: [&str; 10] = [
    "events.jsonl",
    "checkpoints.txt",
    "public-key.vkey",
    "proofs/inclusion.jsonl",
    "proofs/consistency.jsonl",
    "manifest.json",
    "manifest.sig",
    "README.txt",
    "verify_export.py",
    "cosignatures.txt",
];

/// How one event stands against the newest signed checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventStatus {
    /// Its inclusion proof checks against the newest signed checkpoint, in a log that
    /// verified as a whole.
    Verified,
    /// Appended after the newest signed checkpoint (the next commit signs it).
    Pending,
    /// The log did not verify (see `log.problem`), or the proof did not check.
    Failed,
}

/// One event of the run, with its evidence.
#[derive(Debug, Clone, Serialize)]
pub struct EventEvidence {
    pub seq: u64,
    /// The event as stored (the hashed line, parsed).
    pub event: Value,
    /// Hex SHA-256(0x00 || line), the Merkle leaf.
    pub leaf_hash: String,
    pub status: EventStatus,
    /// The size of the checkpoint the proof is against (None unless verified).
    pub checkpoint_size: Option<u64>,
    /// The RFC 9162 inclusion proof, hex, leaf upwards (empty unless verified).
    pub inclusion_proof: Vec<String>,
}

/// The newest signed checkpoint of the log.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointEvidence {
    pub size: u64,
    /// Hex RFC 9162 root.
    pub root: String,
    /// The C2SP signed note.
    pub note: String,
}

/// How the log as a whole verified.
#[derive(Debug, Clone, Serialize)]
pub struct LogEvidence {
    pub verified: bool,
    pub events: u64,
    pub key_fingerprint: String,
    /// The first problem found, when it did not verify.
    pub problem: Option<Problem>,
}

/// One page of a run's evidence.
#[derive(Debug, Clone, Serialize)]
pub struct RunEvidence {
    pub run_id: String,
    pub log: LogEvidence,
    pub checkpoint: Option<CheckpointEvidence>,
    pub events: Vec<EventEvidence>,
    /// The `after_seq` of the next page; None on the last page.
    pub next_after_seq: Option<u64>,
}

/// Reads one page of `run_id`'s events (after `after_seq`, at most `limit`) from the
/// log whose first segment is `db_path`, and checks each against the newest signed
/// checkpoint. The whole log is verified in the same snapshot first (as `audit verify`
/// does): a log that does not verify marks every event `failed` and names the problem.
pub fn run_evidence(
    db_path: &Path,
    key: &VerifierKey,
    run_id: &str,
    after_seq: u64,
    limit: usize,
) -> Result<RunEvidence, AuditError> {
    let limit = limit.clamp(1, MAX_EVIDENCE_PAGE);
    let segments = match open_segments(db_path, &[]) {
        Ok(segments) => segments,
        Err(VerifyError::Open(e)) => return Err(e),
        Err(VerifyError::Problem(problem)) => {
            return Ok(failed_log(run_id, key, problem));
        }
    };
    // One page plus one row, to know whether another page follows.
    let mut rows: Vec<(u64, String)> = Vec::new();
    for segment in &segments {
        let map = |e: rusqlite::Error| map_sqlite(&e, &segment.path);
        let mut stmt = segment
            .conn
            .prepare(
                "SELECT seq, line FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            )
            .map_err(map)?;
        let found = stmt
            .query_map(
                rusqlite::params![
                    run_id,
                    after_seq.min(i64::MAX as u64) as i64,
                    (limit + 1 - rows.len()) as i64
                ],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?)),
            )
            .map_err(map)?;
        for row in found {
            rows.push(row.map_err(map)?);
        }
        if rows.len() > limit {
            break;
        }
    }
    let next_after_seq = (rows.len() > limit).then(|| rows[limit - 1].0);
    rows.truncate(limit);

    let options = VerifyOptions {
        db_path: db_path.to_path_buf(),
        key_dir: PathBuf::new(),
        checkpoint_files: Vec::new(),
        trusted_checkpoint: None,
        key_fingerprint: Some(key.fingerprint()),
        archive_dirs: Vec::new(),
    };
    let verified = verify_segments(&segments, &options, Vec::new(), key, &mut |_| {}, true);
    let (log, checkpoint, tree) = match verified {
        Ok(verified) => {
            let newest = verified.checkpoints.last().cloned();
            let log = LogEvidence {
                verified: true,
                events: verified.report.events,
                key_fingerprint: key.fingerprint(),
                problem: None,
            };
            (log, newest, Some(Tree::new(verified.leaves)))
        }
        Err(VerifyError::Open(e)) => return Err(e),
        Err(VerifyError::Problem(problem)) => {
            let log = LogEvidence {
                verified: false,
                events: 0,
                key_fingerprint: key.fingerprint(),
                problem: Some(problem),
            };
            (log, None, None)
        }
    };
    let mut events = Vec::with_capacity(rows.len());
    for (seq, line) in rows {
        let leaf = leaf_hash(line.as_bytes());
        let event: Value = serde_json::from_str(&line).map_err(|_| AuditError::Corrupt {
            seq,
            what: "the stored line is not JSON".into(),
        })?;
        let mut evidence = EventEvidence {
            seq,
            event,
            leaf_hash: crate::canonical::to_hex(leaf),
            status: EventStatus::Failed,
            checkpoint_size: None,
            inclusion_proof: Vec::new(),
        };
        if let (Some(tree), Some(cp)) = (&tree, &checkpoint) {
            if seq > cp.size {
                evidence.status = EventStatus::Pending;
            } else if let Some(proof) = tree.inclusion_proof(seq - 1, cp.size)
                && tree.leaf(seq - 1) == Some(leaf)
                && verify_inclusion(seq - 1, cp.size, &leaf, &proof, &cp.root)
            {
                evidence.status = EventStatus::Verified;
                evidence.checkpoint_size = Some(cp.size);
                evidence.inclusion_proof = proof.iter().map(hex::encode).collect();
            }
        } else if tree.is_some() {
            // An intact log without any signed checkpoint yet.
            evidence.status = EventStatus::Pending;
        }
        events.push(evidence);
    }
    Ok(RunEvidence {
        run_id: run_id.to_string(),
        log,
        checkpoint: checkpoint.map(|c| CheckpointEvidence {
            size: c.size,
            root: crate::canonical::to_hex(c.root),
            note: c.note,
        }),
        events,
        next_after_seq,
    })
}

fn failed_log(run_id: &str, key: &VerifierKey, problem: Problem) -> RunEvidence {
    RunEvidence {
        run_id: run_id.to_string(),
        log: LogEvidence {
            verified: false,
            events: 0,
            key_fingerprint: key.fingerprint(),
            problem: Some(problem),
        },
        checkpoint: None,
        events: Vec::new(),
        next_after_seq: None,
    }
}

/// Why a run's bundle was not made.
#[derive(Debug, Clone)]
pub enum BundleError {
    Export(ExportError),
    /// The bundle would be larger than the cap (bytes of its files).
    TooLarge {
        max_bytes: u64,
    },
}

/// A run's export bundle: the files of `toolgate audit export --run RUN_ID`, in one
/// JSON object (`{"format", "run_id", "key_fingerprint", "files": {name: text}}`).
#[derive(Debug, Clone, Serialize)]
pub struct Bundle {
    pub format: &'static str,
    pub run_id: String,
    pub key_fingerprint: String,
    pub events: u64,
    pub tree_size: u64,
    pub files: BTreeMap<String, String>,
}

/// Exports `run_id` (verifying the whole log and signing a fresh export checkpoint
/// with `signer`, as `toolgate audit export --run` does) into `work_dir` (created,
/// then removed), and reads the files back into a [`Bundle`] of at most `max_bytes`.
pub fn run_bundle(
    db_path: &Path,
    key_dir: &Path,
    signer: Arc<dyn Signer>,
    run_id: &str,
    work_dir: &Path,
    max_bytes: u64,
) -> Result<Bundle, BundleError> {
    let options = ExportOptions {
        db_path: db_path.to_path_buf(),
        key_dir: key_dir.to_path_buf(),
        out_dir: work_dir.to_path_buf(),
        format: ExportFormat::Jsonl,
        run_id: Some(run_id.to_string()),
        since: None,
        until: None,
        checkpoint_files: Vec::new(),
        archive_dirs: Vec::new(),
        signer: Some(signer),
    };
    let result = export(&options, &mut |_| {})
        .map_err(BundleError::Export)
        .and_then(|summary| read_bundle(work_dir, run_id, &summary, max_bytes));
    let _ = fs::remove_dir_all(work_dir);
    result
}

fn read_bundle(
    dir: &Path,
    run_id: &str,
    summary: &ExportSummary,
    max_bytes: u64,
) -> Result<Bundle, BundleError> {
    let mut files = BTreeMap::new();
    let mut total = 0u64;
    for name in BUNDLE_FILES {
        let path = dir.join(name);
        if name == "cosignatures.txt" && !path.exists() {
            continue;
        }
        // Read within what is left of the bound, so no file is held beyond it.
        let text = match crate::localfile::read_to_string(&path, max_bytes - total) {
            Ok(text) => text,
            Err(crate::localfile::ReadError::TooLarge { .. }) => {
                return Err(BundleError::TooLarge { max_bytes });
            }
            Err(e) => {
                return Err(BundleError::Export(ExportError::Audit(AuditError::Io {
                    path: path.clone(),
                    what: e.to_string(),
                })));
            }
        };
        total += text.len() as u64;
        files.insert(name.to_string(), text);
    }
    Ok(Bundle {
        format: BUNDLE_FORMAT,
        run_id: run_id.to_string(),
        key_fingerprint: summary.key_fingerprint.clone(),
        events: summary.events,
        tree_size: summary.tree_size,
        files,
    })
}
