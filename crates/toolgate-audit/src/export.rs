//! Export: a directory an auditor can check with `audit/verify_export.py` alone.
//!
//! ```text
//! events.jsonl                 the selected events, the exact hashed bytes, one per line
//! events.csv                   (--format csv) a derived view; NOT integrity-protected
//! events.ocsf.jsonl            (--format ocsf) one OCSF record per event, each with its
//!                              leaf hash, the export checkpoint and inclusion proof
//! events.cef                   (--format cef) one CEF line per event, the same evidence
//! checkpoints.txt              every signed checkpoint, the fresh export one last
//! public-key.vkey              the checkpoint verifier key
//! proofs/inclusion.jsonl       per event: its RFC 9162 inclusion proof in the export tree
//! proofs/consistency.jsonl     per consecutive checkpoint pair: a consistency proof
//! cosignatures.txt             (with `serve --witness`) the witnesses' cosigned
//!                              checkpoints among those of checkpoints.txt
//! manifest.json                range, counts, filter, sha256 of every file above,
//!                              the export checkpoint and the calls still open
//! manifest.sig                 the manifest's Ed25519 signature by the checkpoint key
//! README.txt                   how to verify
//! verify_export.py             a copy of the verifier (use your own trusted copy)
//! ```
//!
//! INVARIANT: the log is verified before anything is signed or written, so an export
//! never launders a tampered log under a fresh checkpoint.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use serde::Serialize;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::checkpoint::Checkpoint;
use super::keys::load_signer;
use super::line::format_timestamp;
use super::merkle::Tree;
use super::signer::{MANIFEST_DOMAIN, Signer};
use super::store::{INSERT_CHECKPOINT, map_sqlite};
use super::verify::{
    Problem, Progress, VerifyError, VerifyOptions, check_signed, open_segments,
    read_checkpoint_files, verify_segments,
};
use super::{AuditError, DEFAULT_ORIGIN};

/// The signature of manifest.json: `<key name> <base64(key id || Ed25519 signature)>`
/// over [`MANIFEST_DOMAIN`] followed by the bytes of manifest.json.
pub const MANIFEST_SIGNATURE_FILE: &str = "manifest.sig";

/// The verifier script shipped in every export (`audit/verify_export.py` at the top of
/// the workspace: the independent second implementation, no part of this crate).
pub const VERIFY_SCRIPT: &str = include_str!("../../../audit/verify_export.py");

/// Which view to write besides `events.jsonl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Jsonl,
    Csv,
    /// Also events.ocsf.jsonl: one OCSF 1.8.0 record per event (see `siem`).
    Ocsf,
    /// Also events.cef: one CEF line per event (see `siem`).
    Cef,
}

#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub db_path: PathBuf,
    pub key_dir: PathBuf,
    pub out_dir: PathBuf,
    pub format: ExportFormat,
    pub run_id: Option<String>,
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    /// Checkpoint sink files to check and to append the export checkpoint to.
    pub checkpoint_files: Vec<PathBuf>,
    /// Directories holding archived segments, exported with those beside the database.
    pub archive_dirs: Vec<PathBuf>,
    /// Who signs the export checkpoint and the manifest; None: the key file in
    /// `key_dir`.
    pub signer: Option<Arc<dyn Signer>>,
}

/// Why an export failed.
#[derive(Debug, Clone)]
pub enum ExportError {
    Audit(AuditError),
    /// The log did not verify; nothing was exported.
    Verify(Problem),
    /// The output directory exists and is not empty.
    OutNotEmpty(PathBuf),
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Audit(e) => write!(f, "{e}"),
            ExportError::Verify(p) => {
                write!(f, "the log does not verify, nothing was exported: {p}")
            }
            ExportError::OutNotEmpty(dir) => {
                write!(f, "the output directory `{}` is not empty", dir.display())
            }
        }
    }
}

impl From<AuditError> for ExportError {
    fn from(e: AuditError) -> Self {
        ExportError::Audit(e)
    }
}

/// What was exported.
#[derive(Debug, Clone, Serialize)]
pub struct ExportSummary {
    pub out_dir: String,
    pub tree_size: u64,
    pub events: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    pub checkpoints: usize,
    pub key_fingerprint: String,
    pub warnings: Vec<String>,
}

#[derive(Serialize)]
struct Manifest {
    format: &'static str,
    origin: String,
    created_utc: String,
    full: bool,
    filter: Filter,
    tree_size: u64,
    range: Option<Range>,
    counts: Counts,
    key: KeyInfo,
    csv_is_integrity_protected: bool,
    files: BTreeMap<String, String>,
    /// The export checkpoint this statement is about: every event line is included in
    /// the tree of this size and root.
    checkpoint: CheckpointInfo,
    /// Call ids whose `tool_requested` is in the export but whose closing event is not
    /// in the log yet (calls still running at export time); every other requested call
    /// has its closing event in the export.
    open_calls: Vec<String>,
}

#[derive(Serialize)]
struct CheckpointInfo {
    size: u64,
    /// Hex RFC 9162 root.
    root: String,
}

/// The event types that close a requested call.
const CLOSING_TYPES: [&str; 5] = [
    "tool_executed",
    "tool_denied",
    "tool_failed",
    "tool_timeout",
    "tool_allowed",
];

#[derive(Serialize)]
struct Filter {
    run_id: Option<String>,
    since: Option<String>,
    until: Option<String>,
}

#[derive(Serialize)]
struct Range {
    first_seq: u64,
    last_seq: u64,
}

#[derive(Serialize)]
struct Counts {
    events: u64,
    checkpoints: usize,
    by_type: BTreeMap<String, u64>,
}

#[derive(Serialize)]
struct KeyInfo {
    name: String,
    fingerprint: String,
}

#[derive(Serialize)]
struct InclusionProof {
    seq: u64,
    leaf_index: u64,
    tree_size: u64,
    path: Vec<String>,
}

#[derive(Serialize)]
struct ConsistencyProof {
    from: u64,
    to: u64,
    path: Vec<String>,
}

/// A file being written whose sha256 goes into the manifest.
struct Hashed {
    path: PathBuf,
    out: BufWriter<File>,
    hasher: Sha256,
}

impl Hashed {
    fn create(dir: &Path, name: &str) -> Result<Hashed, AuditError> {
        let path = dir.join(name);
        let file = crate::localfile::create(&path, false).map_err(|e| io(&path, e))?;
        Ok(Hashed {
            path,
            out: BufWriter::new(file),
            hasher: Sha256::new(),
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), AuditError> {
        self.hasher.update(bytes);
        self.out.write_all(bytes).map_err(|e| io(&self.path, e))
    }

    fn finish(mut self) -> Result<String, AuditError> {
        self.out.flush().map_err(|e| io(&self.path, e))?;
        self.out
            .get_ref()
            .sync_all()
            .map_err(|e| io(&self.path, e))?;
        Ok(crate::canonical::to_hex(self.hasher.finalize()))
    }
}

fn io(path: &Path, e: std::io::Error) -> AuditError {
    AuditError::Io {
        path: path.to_path_buf(),
        what: e.to_string(),
    }
}

/// The first line of events.csv.
const CSV_NOTICE: &str = "# derived view of events.jsonl for spreadsheets; NOT integrity-protected: verify events.jsonl\n";

const CSV_COLUMNS: [&str; 17] = [
    "seq",
    "event_id",
    "type",
    "timestamp_utc",
    "run_id",
    "call_id",
    "role_id",
    "lane_id",
    "tool_name",
    "tool_version",
    "error_code",
    "reason",
    "failed_step",
    "execution_time_ms",
    "arguments_hash_sha256",
    "output_hash_sha256",
    "prev",
];

/// Verifies the log, signs a fresh checkpoint over all of it, and writes the export.
pub fn export(
    options: &ExportOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<ExportSummary, ExportError> {
    let out = &options.out_dir;
    if out.exists() && fs::read_dir(out).map_err(|e| io(out, e))?.next().is_some() {
        return Err(ExportError::OutNotEmpty(out.clone()));
    }
    let signer: Arc<dyn Signer> = match &options.signer {
        Some(signer) => signer.clone(),
        None => Arc::new(load_signer(&options.key_dir)?),
    };
    let key = signer.verifier().clone();
    // Sink files first, then the snapshot (see `verify::read_checkpoint_files`).
    let sink_notes = read_checkpoint_files(&options.checkpoint_files).map_err(verify_error)?;
    let segments = open_segments(&options.db_path, &options.archive_dirs).map_err(verify_error)?;
    // The export checkpoint is stored in the newest segment.
    let path = &segments
        .last()
        .map_or_else(|| options.db_path.clone(), |s| s.path.clone());
    let verify_options = VerifyOptions {
        db_path: options.db_path.clone(),
        key_dir: options.key_dir.clone(),
        checkpoint_files: options.checkpoint_files.clone(),
        trusted_checkpoint: None,
        // The signer's own key: nothing to confirm.
        key_fingerprint: Some(key.fingerprint()),
        archive_dirs: options.archive_dirs.clone(),
    };
    let verified = verify_segments(&segments, &verify_options, sink_notes, &key, progress, true)
        .map_err(verify_error)?;
    let mut warnings = verified.report.warnings.clone();
    let tree_size = verified.report.events;
    // INVARIANT: the export checkpoint signs only events some signature already
    // covers, so it never launders events added or rewritten by hand.
    check_signed(
        &verified.checkpoints,
        verified.report.first_seq - 1,
        tree_size,
    )
    .map_err(verify_error)?;
    let tree = Tree::new(verified.leaves);
    let origin =
        checkpoint_origin(&verified.checkpoints).unwrap_or_else(|| DEFAULT_ORIGIN.to_string());
    let export_checkpoint = Checkpoint {
        origin: origin.clone(),
        size: tree_size,
        root: tree.root(tree_size),
    };
    let export_note = export_checkpoint.sign_with(signer.as_ref())?;
    let created = format_timestamp(OffsetDateTime::now_utc());

    // Record the export checkpoint like any other; an export from a read-only copy still
    // works, with a warning.
    match record_checkpoint(path, &export_checkpoint, &export_note, &created) {
        Ok(()) => {}
        Err(e) => warnings.push(format!(
            "the export checkpoint was not stored in the database: {e}"
        )),
    }
    for file in &options.checkpoint_files {
        let appended = fs::OpenOptions::new()
            .append(true)
            .open(file)
            .and_then(|mut f| {
                f.write_all(export_note.as_bytes())?;
                f.write_all(b"\n")?;
                f.sync_data()
            });
        if let Err(e) = appended {
            warnings.push(format!(
                "the export checkpoint was not appended to `{}`: {e}",
                file.display()
            ));
        }
    }

    crate::localfile::create_dir_all(&out.join("proofs")).map_err(|e| io(out, e))?;
    let mut files = BTreeMap::new();

    // Events, their inclusion proofs, and the CSV view.
    let full = options.run_id.is_none() && options.since.is_none() && options.until.is_none();
    let mut events = Hashed::create(out, "events.jsonl")?;
    let mut inclusion = Hashed::create(out, "proofs/inclusion.jsonl")?;
    let mut csv = match options.format {
        ExportFormat::Csv => {
            let path = out.join("events.csv");
            let file = crate::localfile::create(&path, false).map_err(|e| io(&path, e))?;
            let mut out = BufWriter::new(file);
            out.write_all(CSV_NOTICE.as_bytes())
                .map_err(|e| io(&path, e))?;
            let mut writer = csv::Writer::from_writer(out);
            writer
                .write_record(CSV_COLUMNS)
                .map_err(|e| AuditError::Io {
                    path: path.clone(),
                    what: e.to_string(),
                })?;
            Some((path, writer))
        }
        ExportFormat::Jsonl | ExportFormat::Ocsf | ExportFormat::Cef => None,
    };
    // The SIEM view: records that carry their evidence against the export checkpoint.
    let export_ref = crate::siem::CheckpointRef {
        size: tree_size,
        root: crate::canonical::to_hex(export_checkpoint.root),
        note: export_note.clone(),
    };
    let mut siem = match options.format {
        ExportFormat::Ocsf => Some(Hashed::create(out, "events.ocsf.jsonl")?),
        ExportFormat::Cef => Some(Hashed::create(out, "events.cef")?),
        ExportFormat::Jsonl | ExportFormat::Csv => None,
    };
    let mut by_type: BTreeMap<String, u64> = BTreeMap::new();
    let mut open_calls = std::collections::BTreeSet::new();
    let (mut count, mut first_seq, mut last_seq) = (0u64, None, None);
    for segment in &segments {
        let conn = &segment.conn;
        let map = |e: rusqlite::Error| ExportError::Audit(map_sqlite(&e, &segment.path));
        let mut sql = String::from("SELECT seq, line FROM events WHERE seq <= ?");
        let mut args: Vec<rusqlite::types::Value> = vec![(tree_size as i64).into()];
        if let Some(run) = &options.run_id {
            sql.push_str(" AND run_id = ?");
            args.push(run.clone().into());
        }
        if let Some(since) = options.since {
            sql.push_str(" AND ts >= ?");
            args.push(format_timestamp(since).into());
        }
        if let Some(until) = options.until {
            sql.push_str(" AND ts < ?");
            args.push(format_timestamp(until).into());
        }
        sql.push_str(" ORDER BY seq");
        let mut stmt = conn.prepare(&sql).map_err(map)?;
        let mut rows = stmt.query(rusqlite::params_from_iter(args)).map_err(map)?;
        while let Some(row) = rows.next().map_err(map)? {
            let seq = row.get::<_, i64>(0).map_err(map)? as u64;
            let line: String = row.get(1).map_err(map)?;
            events.write(line.as_bytes())?;
            events.write(b"\n")?;
            let path = tree.inclusion_proof(seq - 1, tree_size).unwrap_or_default();
            let proof = InclusionProof {
                seq,
                leaf_index: seq - 1,
                tree_size,
                path: path.iter().map(hex::encode).collect(),
            };
            inclusion.write(&serde_json::to_vec(&proof).unwrap_or_default())?;
            inclusion.write(b"\n")?;
            if let Some(file) = &mut siem {
                let evidence = crate::siem::Evidence {
                    seq,
                    leaf_hash: crate::canonical::to_hex(super::merkle::leaf_hash(line.as_bytes())),
                    checkpoint: Some(&export_ref),
                    inclusion_proof: Some(proof.path.clone()),
                };
                let record = match options.format {
                    ExportFormat::Cef => crate::siem::cef(&line, &evidence),
                    _ => crate::siem::ocsf(&line, &evidence).to_string(),
                };
                file.write(record.as_bytes())?;
                file.write(b"\n")?;
            }
            let value: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if let Some(kind) = value.get("type").and_then(|t| t.as_str()) {
                *by_type.entry(kind.to_string()).or_default() += 1;
                if let Some(call) = value.get("call_id").and_then(|c| c.as_str()) {
                    if kind == "tool_requested" {
                        open_calls.insert(call.to_string());
                    } else if CLOSING_TYPES.contains(&kind) {
                        open_calls.remove(call);
                    }
                }
            }
            if let Some((path, writer)) = &mut csv {
                let record: Vec<String> = CSV_COLUMNS
                    .iter()
                    .map(|c| match value.get(*c) {
                        Some(serde_json::Value::String(s)) => s.clone(),
                        Some(serde_json::Value::Null) | None => String::new(),
                        Some(other) => other.to_string(),
                    })
                    .collect();
                writer.write_record(&record).map_err(|e| AuditError::Io {
                    path: path.clone(),
                    what: e.to_string(),
                })?;
            }
            count += 1;
            first_seq.get_or_insert(seq);
            last_seq = Some(seq);
        }
    }
    files.insert("events.jsonl".to_string(), events.finish()?);
    files.insert("proofs/inclusion.jsonl".to_string(), inclusion.finish()?);
    if let Some(file) = siem {
        let name = match options.format {
            ExportFormat::Cef => "events.cef",
            _ => "events.ocsf.jsonl",
        };
        files.insert(name.to_string(), file.finish()?);
    }
    if let Some((path, writer)) = csv {
        writer
            .into_inner()
            .map_err(|e| AuditError::Io {
                path: path.clone(),
                what: e.to_string(),
            })?
            .flush()
            .map_err(|e| io(&path, e))?;
        files.insert(
            "events.csv".to_string(),
            crate::canonical::sha256_hex(&fs::read(&path).map_err(|e| io(&path, e))?),
        );
    }

    // Checkpoints, smallest first, the export one last; consistency between neighbours.
    let mut checkpoints: Vec<(u64, String)> = verified
        .checkpoints
        .iter()
        .filter(|c| c.size > 0 && c.size < tree_size)
        .map(|c| (c.size, c.note.clone()))
        .collect();
    // The export checkpoint is always there, even over an empty log (size 0).
    checkpoints.push((tree_size, export_note.clone()));
    let mut notes = Hashed::create(out, "checkpoints.txt")?;
    let mut consistency = Hashed::create(out, "proofs/consistency.jsonl")?;
    for (i, (size, note)) in checkpoints.iter().enumerate() {
        notes.write(note.as_bytes())?;
        notes.write(b"\n")?;
        if let Some((next, _)) = checkpoints.get(i + 1) {
            let path = tree.consistency_proof(*size, *next).unwrap_or_default();
            let proof = ConsistencyProof {
                from: *size,
                to: *next,
                path: path.iter().map(hex::encode).collect(),
            };
            consistency.write(&serde_json::to_vec(&proof).unwrap_or_default())?;
            consistency.write(b"\n")?;
        }
    }
    files.insert("checkpoints.txt".to_string(), notes.finish()?);
    files.insert(
        "proofs/consistency.jsonl".to_string(),
        consistency.finish()?,
    );
    // The witnesses' cosignatures (`serve --witness`) of the checkpoints above.
    let cosigned = crate::cosign::default_cosignature_file(&options.db_path);
    if cosigned.exists() {
        let roots: std::collections::HashMap<u64, super::merkle::Hash> = verified
            .checkpoints
            .iter()
            .map(|c| (c.size, c.root))
            .chain(std::iter::once((tree_size, export_checkpoint.root)))
            .collect();
        let mut file = Hashed::create(out, "cosignatures.txt")?;
        for note in crate::cosign::read_cosigned(&cosigned)? {
            let checkpoint = super::checkpoint::verify_note(&note, &key);
            if checkpoint.is_ok_and(|c| roots.get(&c.size) == Some(&c.root)) {
                file.write(note.as_bytes())?;
                file.write(b"\n")?;
            }
        }
        files.insert("cosignatures.txt".to_string(), file.finish()?);
    }

    let mut write_file = |name: &str, contents: &str| -> Result<(), AuditError> {
        let mut file = Hashed::create(out, name)?;
        file.write(contents.as_bytes())?;
        files.insert(name.to_string(), file.finish()?);
        Ok(())
    };
    write_file("public-key.vkey", &format!("{}\n", key.to_vkey()))?;
    write_file("verify_export.py", VERIFY_SCRIPT)?;
    write_file("README.txt", &readme(&key.fingerprint(), full))?;

    let manifest = Manifest {
        format: "toolgate-audit-export/1",
        origin,
        created_utc: created,
        full,
        filter: Filter {
            run_id: options.run_id.clone(),
            since: options.since.map(format_timestamp),
            until: options.until.map(format_timestamp),
        },
        tree_size,
        range: first_seq.zip(last_seq).map(|(first_seq, last_seq)| Range {
            first_seq,
            last_seq,
        }),
        counts: Counts {
            events: count,
            checkpoints: checkpoints.len(),
            by_type,
        },
        key: KeyInfo {
            name: key.name.clone(),
            fingerprint: key.fingerprint(),
        },
        csv_is_integrity_protected: false,
        files,
        checkpoint: CheckpointInfo {
            size: tree_size,
            root: crate::canonical::to_hex(export_checkpoint.root),
        },
        open_calls: open_calls.into_iter().collect(),
    };
    let manifest_text = serde_json::to_string_pretty(&manifest).unwrap_or_default() + "\n";
    // The manifest is a signed statement: the signature covers MANIFEST_DOMAIN followed
    // by the exact bytes of manifest.json.
    let mut statement = MANIFEST_DOMAIN.as_bytes().to_vec();
    statement.extend_from_slice(manifest_text.as_bytes());
    let mut signature = key.key_id.to_vec();
    signature.extend_from_slice(&signer.sign(&statement)?);
    let manifest_path = out.join("manifest.json");
    crate::localfile::write(&manifest_path, manifest_text.as_bytes())
        .map_err(|e| io(&manifest_path, e))?;
    let signature_path = out.join(MANIFEST_SIGNATURE_FILE);
    crate::localfile::write(
        &signature_path,
        format!("{} {}\n", key.name, B64.encode(signature)).as_bytes(),
    )
    .map_err(|e| io(&signature_path, e))?;
    Ok(ExportSummary {
        out_dir: out.display().to_string(),
        tree_size,
        events: count,
        first_seq,
        last_seq,
        checkpoints: checkpoints.len(),
        key_fingerprint: key.fingerprint(),
        warnings,
    })
}

fn verify_error(e: VerifyError) -> ExportError {
    match e {
        VerifyError::Open(e) => ExportError::Audit(e),
        VerifyError::Problem(p) => ExportError::Verify(p),
    }
}

/// The origin of the stored checkpoints (they all share it).
fn checkpoint_origin(checkpoints: &[super::verify::VerifiedCheckpoint]) -> Option<String> {
    checkpoints
        .last()
        .and_then(|c| c.note.lines().next())
        .map(str::to_string)
}

fn record_checkpoint(
    path: &Path,
    checkpoint: &Checkpoint,
    note: &str,
    created: &str,
) -> Result<(), AuditError> {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE)
            .map_err(|e| map_sqlite(&e, path))?;
    conn.busy_timeout(std::time::Duration::from_millis(2000))
        .map_err(|e| map_sqlite(&e, path))?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| map_sqlite(&e, path))?;
    conn.execute(
        INSERT_CHECKPOINT,
        rusqlite::params![
            checkpoint.size as i64,
            crate::canonical::to_hex(checkpoint.root),
            note,
            created,
            "export"
        ],
    )
    .map_err(|e| map_sqlite(&e, path))?;
    Ok(())
}

fn readme(fingerprint: &str, full: bool) -> String {
    let scope = if full {
        "This is a FULL export: events.jsonl holds every event from seq 1 to the tree size of\n\
         the last checkpoint, so the verifier recomputes the whole seq/prev chain and the\n\
         Merkle root, and detects any event edited, removed, inserted, reordered or cut off."
    } else {
        "This is a FILTERED export (see manifest.json, \"filter\"): events.jsonl holds only the\n\
         selected events. Each one is tied to the signed export checkpoint by its inclusion\n\
         proof, which proves it is in the log exactly as shown. The signed manifest states\n\
         the filter and commits to the sha256 of events.jsonl, so a dropped line is\n\
         detected; every tool_requested has its closing event here unless the manifest\n\
         lists the call in open_calls."
    };
    format!(
        "toolgate audit export\n\
         =====================\n\
         \n\
         {scope}\n\
         \n\
         How to verify (Python 3, standard library only):\n\
         \n\
         1. Get the log's key fingerprint through a channel you trust (not from this\n\
            directory): the operator runs `toolgate audit key --data-dir DIR`.\n\
            For reference, this export was signed by the key with fingerprint\n\
            {fingerprint}\n\
         2. Use your own trusted copy of verify_export.py (a copy is included here for\n\
            convenience; compare it with the published one).\n\
         3. Run: python3 verify_export.py THIS_DIRECTORY --key-fingerprint HEX\n\
            [--trusted-checkpoint FILE] [--expect-full | --expect-run RUN_ID]\n\
            (--trusted-checkpoint: a checkpoint you kept; the export must extend it).\n\
            Exit codes: 0 intact, 1 integrity failure (edited, missing, inserted,\n\
            reordered), 2 truncation or fork, 3 key or signature problem. The first bad\n\
            seq is named.\n\
         4. Keep checkpoints.txt: a later export must be consistent with it.\n\
         \n\
         Files:\n\
         - events.jsonl: one event per line, the exact bytes that were hashed (RFC 8785\n\
           canonical JSON). Leaf hash = SHA-256(0x00 || line).\n\
         - checkpoints.txt: C2SP signed notes (origin, tree size, base64 RFC 9162 root),\n\
           signed with Ed25519; the last one was made for this export.\n\
         - public-key.vkey: the verifier key, <name>+<key id>+base64(0x01 || public key).\n\
         - proofs/inclusion.jsonl: one RFC 9162 inclusion proof per exported event,\n\
           against the last checkpoint.\n\
         - proofs/consistency.jsonl: RFC 9162 consistency proofs between consecutive\n\
           checkpoints.\n\
         - manifest.json: the range, counts, filter, the sha256 of every file, the\n\
           export checkpoint and the calls still open; a statement signed in\n\
           manifest.sig (an unsigned or altered manifest is refused).\n\
         - events.csv (if present): a derived view for spreadsheets. It is NOT\n\
           integrity-protected; rely on events.jsonl.\n"
    )
}
