//! `toolgate audit verify | export | key | tail`: flags and command bodies
//! (`audit replay` is `commands::replay`).
//!
//! Exit codes: 0 ok; 1 integrity failure (edited, missing, inserted, reordered, a root
//! that does not match; across segments too: a missing or swapped segment, a start that
//! does not match the previous seal or the archive record), and `archive` refused; 2
//! truncation or fork; 3 key or signature problem; 4 invalid arguments, a database that
//! cannot be opened as an audit log, or (`archive`) a log locked by a running gateway.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::audit::export::{ExportError, ExportFormat, ExportOptions, export};
use crate::audit::keys::{default_key_dir, load_verifier};
use crate::audit::verify::{Problem, Progress, VerifyError, VerifyOptions, verify_db};
use crate::audit::{AuditError, DEFAULT_SINK_FILE};
use crate::commands::{Exit, Format, print_error, refuse, say_json_outcome};

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute the whole chain, the Merkle tree and every checkpoint signature.
    Verify(VerifyArgs),
    /// Write an export directory an auditor can verify with audit/verify_export.py.
    Export(ExportArgs),
    /// Print the checkpoint key's name and fingerprint.
    Key(KeyArgs),
    /// Print event lines.
    Tail(TailArgs),
    /// Re-decide recorded tool calls under a candidate policy; list changed decisions.
    Replay(crate::commands::replay::ReplayArgs),
    /// Move sealed segments out of the data directory (the gateway must be stopped);
    /// what remains still verifies, from the oldest remaining segment.
    Archive(ArchiveArgs),
    /// Make the fleet's signing key once (or print the one in the directory): every
    /// sidecar of a fleet that ships to the audit hub mounts it (`serve
    /// --fleet-key-dir`).
    FleetKey(super::audit_fleet::FleetKeyArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["before_seq", "keep_segments"])))]
pub struct ArchiveArgs {
    /// The audit database (the log's first segment).
    #[arg(long, default_value = "var/audit.db")]
    pub db: PathBuf,
    /// The key directory (default: `keys` next to the database).
    #[arg(long)]
    pub key_dir: Option<PathBuf>,
    /// Sign with a `toolgate signer` process on this Unix socket.
    #[arg(long)]
    pub signer_socket: Option<PathBuf>,
    /// Archive every sealed segment whose events all have a seq below this one.
    #[arg(long)]
    pub before_seq: Option<u64>,
    /// Archive every sealed segment but the newest N sealed ones.
    #[arg(long)]
    pub keep_segments: Option<u64>,
    /// The archive directory (created if missing; not the data directory).
    #[arg(long)]
    pub to: PathBuf,
    /// Archive even events a `serve --ship` sink has not confirmed yet (refused
    /// otherwise: the sink reads the log in the data directory and would never get them).
    #[arg(long)]
    pub ignore_ship_cursors: bool,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The audit database.
    #[arg(long, default_value = "var/audit.db")]
    pub db: PathBuf,
    /// The key directory (default: `keys` next to the database).
    #[arg(long)]
    pub key_dir: Option<PathBuf>,
    /// A checkpoint note kept by the auditor; the log must contain and extend it.
    #[arg(long)]
    pub trusted_checkpoint: Option<PathBuf>,
    /// Checkpoint files to check besides the database (default: `checkpoints.log`
    /// next to the database, if it exists).
    #[arg(long = "checkpoints")]
    pub checkpoint_files: Vec<PathBuf>,
    /// The key fingerprint you recorded (`toolgate audit key`); the key found must have
    /// it (exit 3 otherwise). Without it the key is trusted as found, with a warning.
    #[arg(long)]
    pub key_fingerprint: Option<String>,
    /// A directory of archived segments (`toolgate audit archive --to`; repeatable):
    /// verified with the segments beside the database as one log from seq 1.
    #[arg(long = "archive")]
    pub archive_dirs: Vec<PathBuf>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// A witness's cosignature verifier key (`name+keyid+base64`, type 0x04;
    /// repeatable): the cosigned checkpoints (`--cosignatures`) must carry valid
    /// cosignatures from `--quorum` of these keys, and the log must extend them.
    #[arg(long = "witness-key", value_parser = parse_witness_key)]
    pub witness_keys: Vec<crate::audit::witness::WitnessKey>,
    /// How many of the `--witness-key`s must have cosigned one checkpoint (default:
    /// all of them).
    #[arg(long, requires = "witness_keys")]
    pub quorum: Option<usize>,
    /// The file of cosigned checkpoints (default: `cosigned-checkpoints.log` next to
    /// the database).
    #[arg(long, requires = "witness_keys")]
    pub cosignatures: Option<PathBuf>,
    /// Verify the audit hub in this PostgreSQL database instead of a local log: every
    /// sidecar's shipped log and the fleet log (docs/audit.md, "The audit hub").
    #[arg(long, value_name = "URL")]
    pub cluster_db: Option<String>,
    /// With `--cluster-db`: the fleet key fingerprint you recorded (`toolgate audit
    /// fleet-key`); the fleet key bound in the hub must have it and every fleet
    /// checkpoint must verify with it (exit 3 otherwise). Without it the bound key is
    /// trusted as found, with a warning.
    #[arg(long, requires = "cluster_db")]
    pub fleet_key_fingerprint: Option<String>,
}

fn parse_witness_key(text: &str) -> Result<crate::audit::witness::WitnessKey, String> {
    crate::audit::witness::WitnessKey::parse_vkey(text)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormatArg {
    Jsonl,
    Csv,
    Ocsf,
    Cef,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[arg(long, default_value = "var/audit.db")]
    pub db: PathBuf,
    /// The key directory (default: `keys` next to the database).
    #[arg(long)]
    pub key_dir: Option<PathBuf>,
    /// `jsonl`: events.jsonl only; `csv`: also events.csv (a derived view); `ocsf`:
    /// also events.ocsf.jsonl (OCSF 1.8.0 records); `cef`: also events.cef (CEF lines).
    /// OCSF and CEF records carry their seq, leaf hash and the export checkpoint.
    #[arg(long, value_enum, default_value = "jsonl")]
    pub format: ExportFormatArg,
    /// Export one run (`--run`) from the audit hub in this PostgreSQL database: its
    /// events from every sidecar with the proofs to the signed fleet checkpoint.
    #[arg(long, value_name = "URL", requires = "run_id")]
    pub cluster_db: Option<String>,
    /// With `--cluster-db`: the fleet key directory (`serve --fleet-key-dir`); the
    /// manifest, listing every event of the run per sidecar, is signed with it.
    /// Default: the TOOLGATE_FLEET_KEY_DIR environment variable.
    #[arg(long, value_name = "DIR", requires = "cluster_db")]
    pub fleet_key_dir: Option<PathBuf>,
    /// Only the events of this run.
    #[arg(long = "run")]
    pub run_id: Option<String>,
    /// Only events at or after this time (RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// Only events before this time (RFC 3339).
    #[arg(long)]
    pub until: Option<String>,
    /// The output directory (created; must be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Sign with a `toolgate signer` process on this Unix socket instead of the key
    /// file in the key directory.
    #[arg(long)]
    pub signer_socket: Option<PathBuf>,
    /// A directory of archived segments (repeatable): an export needs every segment
    /// from seq 1.
    #[arg(long = "archive")]
    pub archive_dirs: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SignerArgs {
    /// The directory holding the signing key (created with a new key if empty). Keep
    /// it readable only by the signer's user; the signer refuses one that group or
    /// others can write.
    #[arg(long)]
    pub key_dir: PathBuf,
    /// The Unix socket to listen on (mode 0660: give the gateway's user the group).
    #[arg(long)]
    pub socket: PathBuf,
    /// The name of a new key (the checkpoint origin).
    #[arg(long, default_value = crate::audit::DEFAULT_ORIGIN)]
    pub name: String,
}

#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The data directory; the key is in `<data-dir>/keys`.
    #[arg(long, default_value = "var")]
    pub data_dir: PathBuf,
    /// The key directory, if not `<data-dir>/keys`.
    #[arg(long)]
    pub key_dir: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    #[arg(long, default_value = "var/audit.db")]
    pub db: PathBuf,
    /// Only the events of this run.
    #[arg(long = "run")]
    pub run_id: Option<String>,
    /// Only events after this seq.
    #[arg(long, default_value_t = 0)]
    pub after_seq: u64,
    /// At most this many events (the newest ones when --after-seq is not given).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub limit: u64,
}

/// Prints a line to stdout; a closed pipe (`| head`) is not an error worth a panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Runs an `audit` subcommand and returns its exit code.
pub fn run(command: AuditCommand) -> Exit {
    match command {
        AuditCommand::Verify(args) => verify_command(&args),
        AuditCommand::Export(args) => export_command(&args),
        AuditCommand::Key(args) => key_command(&args),
        AuditCommand::Tail(args) => tail_command(&args),
        AuditCommand::Replay(args) => crate::commands::replay::replay_command(&args),
        AuditCommand::Archive(args) => archive_command(&args),
        AuditCommand::FleetKey(args) => super::audit_fleet::fleet_key_command(&args),
    }
}

fn exit_for_problem(problem: &Problem) -> Exit {
    match problem.kind.exit_code() {
        2 => Exit::Truncated,
        3 => Exit::Signature,
        _ => Exit::Failure,
    }
}

/// Errors that stop a command before it could check anything.
fn exit_for_error(error: &AuditError) -> Exit {
    match error {
        AuditError::Key { .. } | AuditError::Signer { .. } => Exit::Signature,
        AuditError::Diverged { .. } => Exit::Truncated,
        AuditError::Corrupt { .. } => Exit::Failure,
        _ => Exit::InvalidConfig,
    }
}

/// A progress bar on stderr, hidden unless both stdout and stderr are terminals.
fn progress_bar(message: &'static str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    if !(std::io::stdout().is_terminal() && std::io::stderr().is_terminal()) {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} events ({per_sec}, eta {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message);
    bar
}

fn on_progress(bar: &ProgressBar) -> impl FnMut(Progress) + '_ {
    move |p| match p {
        Progress::Total(total) => bar.set_length(total),
        Progress::Checked(done) => bar.set_position(done),
    }
}

/// The sink file next to the database, if it exists, plus any named explicitly.
fn checkpoint_files(db: &Path, named: &[PathBuf]) -> Vec<PathBuf> {
    if !named.is_empty() {
        return named.to_vec();
    }
    let default = db
        .parent()
        .unwrap_or(Path::new("."))
        .join(DEFAULT_SINK_FILE);
    if default.exists() {
        vec![default]
    } else {
        Vec::new()
    }
}

fn verify_command(args: &VerifyArgs) -> Exit {
    if let Some(url) = &args.cluster_db {
        return super::audit_fleet::fleet_verify_command(url, args);
    }
    if log_missing(&args.db) {
        return refuse(
            args.format,
            "open",
            &format!("no audit database at `{}`", args.db.display()),
            Some("pass --db PATH"),
            Exit::InvalidConfig,
        );
    }
    let cosignatures = args
        .cosignatures
        .clone()
        .unwrap_or_else(|| crate::audit::witness::default_cosignature_file(&args.db));
    let mut files = checkpoint_files(&args.db, &args.checkpoint_files);
    if !args.witness_keys.is_empty() && cosignatures.exists() {
        // The cosigned checkpoints are checkpoints too: the log must extend them.
        files.push(cosignatures.clone());
    }
    let options = VerifyOptions {
        db_path: args.db.clone(),
        key_dir: args
            .key_dir
            .clone()
            .unwrap_or_else(|| default_key_dir(&args.db)),
        checkpoint_files: files,
        trusted_checkpoint: args.trusted_checkpoint.clone(),
        key_fingerprint: args.key_fingerprint.clone(),
        archive_dirs: args.archive_dirs.clone(),
    };
    let bar = progress_bar("verifying");
    let result = verify_db(&options, &mut on_progress(&bar));
    bar.finish_and_clear();
    match result {
        Ok(verified) => {
            let witnessed = match check_witnesses(args, &cosignatures, &verified) {
                Ok(witnessed) => witnessed,
                Err(message) => {
                    match args.format {
                        Format::Json => {
                            say_json_outcome("failed", "witness", None, &message, Exit::Signature)
                        }
                        Format::Text => say!("FAILED: witness: {message}"),
                    }
                    return Exit::Signature;
                }
            };
            let r = &verified.report;
            match args.format {
                Format::Json => {
                    let mut value = serde_json::to_value(r).unwrap_or_default();
                    value["status"] = "ok".into();
                    if let Some(w) = &witnessed {
                        value["witnesses"] = serde_json::to_value(w).unwrap_or_default();
                        value["unwitnessed_events"] = r
                            .events
                            .saturating_sub(w.witnessed_size.unwrap_or(0))
                            .into();
                    }
                    say!(
                        "{}",
                        serde_json::to_string_pretty(&value).unwrap_or_default()
                    );
                }
                Format::Text => {
                    match &r.head_hash {
                        Some(hash) => {
                            say!("ok: {} events, head seq {} hash {hash}", r.events, r.events)
                        }
                        None => say!("ok: the log is empty"),
                    }
                    say!("root {}", r.root);
                    match (r.archived_through_segment, r.archived_through_seq) {
                        (Some(segment), Some(seq)) => say!(
                            "verified from seq {} (segment {}): segments 1..{segment} (seq 1..{seq}) were archived; the start was checked against the audit_segments_archived record, verify the archive with --archive DIR",
                            r.first_seq,
                            segment + 1
                        ),
                        _ if r.segments.len() > 1 => {
                            say!("{} segments (1..{})", r.segments.len(), r.segments.len())
                        }
                        _ => {}
                    }
                    match r.latest_checkpoint_size {
                        Some(size) => say!(
                            "{} checkpoints verified (newest at size {size})",
                            r.checkpoints
                        ),
                        None => say!("no checkpoints"),
                    }
                    if let Some(size) = r.trusted_checkpoint_size {
                        say!("extends the trusted checkpoint at size {size}");
                    }
                    if r.key_fingerprint_confirmed {
                        say!("key fingerprint {} (as given)", r.key_fingerprint);
                    } else {
                        say!("key fingerprint {} (NOT confirmed)", r.key_fingerprint);
                    }
                    if let Some(w) = &witnessed {
                        let size = w.witnessed_size.unwrap_or(0);
                        say!(
                            "witnessed: size {size} cosigned by {} of {} witnesses",
                            w.quorum,
                            w.witnesses.len()
                        );
                        for (name, cosigned) in &w.witnesses {
                            match cosigned {
                                Some(s) => say!("witness {name}: cosigned up to size {s}"),
                                None => say!("witness {name}: cosigned nothing"),
                            }
                        }
                        if r.events > size {
                            say!(
                                "warning: seq {}..{} are not yet cosigned by a quorum of witnesses (the cosignature gap)",
                                size + 1,
                                r.events
                            );
                        }
                    }
                    for warning in &r.warnings {
                        say!("warning: {warning}");
                    }
                }
            }
            Exit::Ok
        }
        Err(VerifyError::Problem(problem)) => {
            let exit = exit_for_problem(&problem);
            match args.format {
                Format::Json => {
                    say_json_outcome("failed", problem.kind, problem.seq, &problem.message, exit)
                }
                Format::Text => say!("FAILED: {problem}"),
            }
            exit
        }
        // A pipeline reading JSON gets JSON for this outcome too: the log could not be
        // read as an audit log, so nothing was verified.
        Err(VerifyError::Open(error)) => refuse(
            args.format,
            "open",
            &error,
            error.help(),
            exit_for_error(&error),
        ),
    }
}

/// With `--witness-key`: checks the cosigned checkpoints of `file` against the keys
/// and the quorum (the verified log already extends each of them).
fn check_witnesses(
    args: &VerifyArgs,
    file: &Path,
    verified: &crate::audit::verify::Verified,
) -> Result<Option<crate::audit::witness::WitnessReport>, String> {
    use crate::audit::witness::{WitnessProblem, check_cosignatures, read_cosigned};
    if args.witness_keys.is_empty() {
        return Ok(None);
    }
    let quorum = args.quorum.unwrap_or(args.witness_keys.len());
    if quorum == 0 || quorum > args.witness_keys.len() {
        return Err(format!(
            "--quorum {quorum} must be between 1 and the {} witness keys given",
            args.witness_keys.len()
        ));
    }
    let notes = if file.exists() {
        read_cosigned(file).map_err(|e| e.to_string())?
    } else {
        Vec::new()
    };
    match check_cosignatures(&notes, &verified.key, &args.witness_keys, quorum) {
        Ok((report, _)) => Ok(Some(report)),
        Err(WitnessProblem::BadCosignature(m) | WitnessProblem::NoQuorum(m)) => Err(m),
    }
}

/// True when no segment of the log whose first segment is `db` exists.
fn log_missing(db: &Path) -> bool {
    crate::audit::segments::list(db).map_or(!db.exists(), |s| s.is_empty())
}

fn archive_command(args: &ArchiveArgs) -> Exit {
    use crate::audit::archive::{ArchiveError, ArchiveOptions, Selection, archive};
    if log_missing(&args.db) {
        return refuse(
            args.format,
            "open",
            &format!("no audit database at `{}`", args.db.display()),
            Some("pass --db PATH"),
            Exit::InvalidConfig,
        );
    }
    let selection = match (args.before_seq, args.keep_segments) {
        (Some(seq), None) => Selection::BeforeSeq(seq),
        (None, Some(keep)) => Selection::KeepSegments(keep),
        _ => {
            return refuse(
                args.format,
                "arguments",
                &"give exactly one of --before-seq and --keep-segments",
                None,
                Exit::InvalidConfig,
            );
        }
    };
    let signer: Option<std::sync::Arc<dyn crate::audit::signer::Signer>> = match &args.signer_socket
    {
        None => None,
        Some(socket) => match crate::audit::signer::SocketSigner::connect(socket) {
            Ok(signer) => Some(std::sync::Arc::new(signer)),
            Err(error) => {
                return refuse(args.format, "signer", &error, error.help(), Exit::Signature);
            }
        },
    };
    let key_dir = args
        .key_dir
        .clone()
        .unwrap_or_else(|| default_key_dir(&args.db));
    // The archive appends to the log: a key directory others can write is refused,
    // and what was left readable by others in the data and key directories is made
    // owner-only first, as `serve` does.
    if key_dir.exists()
        && let Err(error) = crate::audit::keys::check_private(&key_dir)
    {
        return refuse(args.format, "key", &error, None, Exit::Signature);
    }
    let data_dir = args
        .db
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let found = crate::commands::owner_only(&[data_dir, &key_dir]);
    for (path, mode) in &found.tightened {
        eprintln!(
            "warning: `{}` was mode {mode:o}, open to group or others; made owner-only",
            path.display()
        );
    }
    for (path, error) in &found.failed {
        eprintln!(
            "warning: `{}` could not be checked or made owner-only: {error}",
            path.display()
        );
    }
    let options = ArchiveOptions {
        db_path: args.db.clone(),
        key_dir,
        signer,
        checkpoint_files: checkpoint_files(&args.db, &[]),
        selection,
        to: args.to.clone(),
        ignore_ship_cursors: args.ignore_ship_cursors,
    };
    let runtime = match crate::commands::runtime(&mut tokio::runtime::Builder::new_current_thread())
    {
        Ok(runtime) => runtime,
        Err(exit) => return exit,
    };
    match runtime.block_on(archive(&options)) {
        Ok(summary) => {
            match args.format {
                Format::Json => {
                    let mut value = serde_json::to_value(&summary).unwrap_or_default();
                    value["status"] = "ok".into();
                    say!(
                        "{}",
                        serde_json::to_string_pretty(&value).unwrap_or_default()
                    );
                }
                Format::Text => match (summary.archived.first(), summary.archived.last()) {
                    (Some(first), Some(last)) => say!(
                        "archived segments {}..{} (seq {}..{}) to `{}`; recorded as seq {}",
                        first.seal.segment,
                        last.seal.segment,
                        first.seal.first_seq,
                        last.seal.last_seq,
                        summary.to,
                        summary.event_seq.unwrap_or_default()
                    ),
                    _ => say!("nothing to archive"),
                },
            }
            Exit::Ok
        }
        Err(ArchiveError::Verify(problem)) => {
            print_error(
                &ArchiveError::Verify(problem.clone()),
                Some("run `toolgate audit verify` for details"),
            );
            let exit = exit_for_problem(&problem);
            if args.format == Format::Json {
                say_json_outcome("failed", problem.kind, problem.seq, &problem.message, exit);
            }
            exit
        }
        Err(ArchiveError::Audit(error)) => {
            let kind = match error {
                AuditError::Locked { .. } => "locked",
                _ => "open",
            };
            refuse(
                args.format,
                kind,
                &error,
                error.help(),
                exit_for_error(&error),
            )
        }
        Err(error @ ArchiveError::Refused(_)) => {
            refuse(args.format, "refused", &error, None, Exit::Failure)
        }
    }
}

fn parse_time(flag: &str, text: &Option<String>) -> Result<Option<OffsetDateTime>, Exit> {
    match text {
        None => Ok(None),
        Some(t) => OffsetDateTime::parse(t, &Rfc3339).map(Some).map_err(|_| {
            print_error(
                &format!("--{flag} `{t}` is not an RFC 3339 time"),
                Some("e.g. 2026-01-31T00:00:00Z"),
            );
            Exit::InvalidConfig
        }),
    }
}

fn export_command(args: &ExportArgs) -> Exit {
    if let (Some(url), Some(run)) = (&args.cluster_db, &args.run_id) {
        return super::audit_fleet::fleet_export_command(
            url,
            run,
            &args.out,
            args.fleet_key_dir.as_deref(),
        );
    }
    if log_missing(&args.db) {
        print_error(
            &format!("no audit database at `{}`", args.db.display()),
            Some("pass --db PATH"),
        );
        return Exit::InvalidConfig;
    }
    let (since, until) = match (
        parse_time("since", &args.since),
        parse_time("until", &args.until),
    ) {
        (Ok(since), Ok(until)) => (since, until),
        (Err(exit), _) | (_, Err(exit)) => return exit,
    };
    let signer: Option<std::sync::Arc<dyn crate::audit::signer::Signer>> = match &args.signer_socket
    {
        None => None,
        Some(socket) => match crate::audit::signer::SocketSigner::connect(socket) {
            Ok(signer) => Some(std::sync::Arc::new(signer)),
            Err(error) => {
                print_error(&error, error.help());
                return Exit::Signature;
            }
        },
    };
    let options = ExportOptions {
        signer,
        db_path: args.db.clone(),
        key_dir: args
            .key_dir
            .clone()
            .unwrap_or_else(|| default_key_dir(&args.db)),
        out_dir: args.out.clone(),
        format: match args.format {
            ExportFormatArg::Jsonl => ExportFormat::Jsonl,
            ExportFormatArg::Csv => ExportFormat::Csv,
            ExportFormatArg::Ocsf => ExportFormat::Ocsf,
            ExportFormatArg::Cef => ExportFormat::Cef,
        },
        run_id: args.run_id.clone(),
        since,
        until,
        checkpoint_files: checkpoint_files(&args.db, &[]),
        archive_dirs: args.archive_dirs.clone(),
    };
    let bar = progress_bar("exporting");
    let result = export(&options, &mut on_progress(&bar));
    bar.finish_and_clear();
    match result {
        Ok(summary) => {
            match (summary.first_seq, summary.last_seq) {
                (Some(first), Some(last)) => say!(
                    "exported {} events (seq {first}..{last}) of {} to `{}`",
                    summary.events,
                    summary.tree_size,
                    summary.out_dir
                ),
                _ => say!(
                    "exported 0 events of {} to `{}`",
                    summary.tree_size,
                    summary.out_dir
                ),
            }
            say!(
                "{} checkpoints; signed by key fingerprint {}",
                summary.checkpoints,
                summary.key_fingerprint
            );
            for warning in &summary.warnings {
                say!("warning: {warning}");
            }
            Exit::Ok
        }
        Err(ExportError::Verify(problem)) => {
            print_error(
                &ExportError::Verify(problem.clone()),
                Some("run `toolgate audit verify` for details"),
            );
            exit_for_problem(&problem)
        }
        Err(ExportError::Audit(error)) => {
            print_error(&error, error.help());
            exit_for_error(&error)
        }
        Err(error @ ExportError::OutNotEmpty(_)) => {
            print_error(&error, Some("choose a new directory for each export"));
            Exit::InvalidConfig
        }
    }
}

fn key_command(args: &KeyArgs) -> Exit {
    let dir = args
        .key_dir
        .clone()
        .unwrap_or_else(|| args.data_dir.join("keys"));
    match load_verifier(&dir) {
        Ok(key) => {
            match args.format {
                Format::Json => {
                    let value = serde_json::json!({
                        "key_name": key.name,
                        "key_id": crate::canonical::to_hex(key.key_id),
                        "fingerprint": key.fingerprint(),
                        "vkey": key.to_vkey(),
                    });
                    say!(
                        "{}",
                        serde_json::to_string_pretty(&value).unwrap_or_default()
                    );
                }
                Format::Text => {
                    say!("key name: {}", key.name);
                    say!("key id: {}", crate::canonical::to_hex(key.key_id));
                    say!("fingerprint: {}", key.fingerprint());
                    say!("verifier key: {}", key.to_vkey());
                }
            }
            Exit::Ok
        }
        Err(error) => refuse(
            args.format,
            "key",
            &error,
            Some("the key is created when the gateway first opens the audit log"),
            Exit::Signature,
        ),
    }
}

fn tail_command(args: &TailArgs) -> Exit {
    let events =
        crate::audit::tail_events(&args.db, args.run_id.clone(), args.after_seq, args.limit);
    match events {
        Ok(events) => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            for event in events {
                if writeln!(out, "{}", event.line).is_err() {
                    break;
                }
            }
            Exit::Ok
        }
        Err(error) => {
            print_error(&error, error.help());
            exit_for_error(&error)
        }
    }
}

/// `toolgate signer`: holds the checkpoint key in its own process and signs over a Unix
/// socket (protocol: `audit::signer`). Runs until stopped.
pub fn signer_command(args: &SignerArgs) -> Exit {
    let key = if args
        .key_dir
        .join(crate::audit::keys::SIGNING_KEY_FILE)
        .exists()
    {
        crate::audit::keys::load_signer(&args.key_dir)
    } else {
        crate::audit::keys::create_signer(&args.key_dir, &args.name)
    };
    let key = match key.and_then(|key| {
        crate::audit::keys::check_private(&args.key_dir)?;
        Ok(key)
    }) {
        Ok(key) => key,
        Err(error) => {
            print_error(&error, error.help());
            return Exit::Signature;
        }
    };
    say!(
        "toolgate signer listening on {} (key {}, fingerprint {})",
        args.socket.display(),
        key.verifier.name,
        key.verifier.fingerprint()
    );
    match crate::audit::signer::serve(key, &args.socket) {
        Ok(()) => Exit::Ok,
        Err(error) => {
            print_error(&error, error.help());
            Exit::Failure
        }
    }
}
