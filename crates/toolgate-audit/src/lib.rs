//! toolgate-audit: toolgate's audit log, as a crate an auditor can read alone.
//!
//! A hash-chained, append-only record of every request and outcome. Events are stored
//! in SQLite (WAL) as one line of canonical JSON each (RFC 8785); each line carries
//! `seq` and `prev` (the hash of the line before), and the lines are the leaves of an
//! RFC 9162 Merkle tree whose signed checkpoints let an auditor prove that nothing was
//! edited, removed, inserted or cut off. docs/audit.md describes the format field by
//! field; `audit/verify_export.py` is an independent second implementation of the
//! export's checks, sharing no code with this crate.
//!
//! # What an auditor must trust
//!
//! This crate's Cargo.toml is the whole list: SHA-256 and HMAC (`sha2`, `hmac`), RFC
//! 8785 numbers checked against `serde_json_canonicalizer`, Ed25519 (`ed25519-dalek`
//! verifies; `aws-lc-rs` signs, `getrandom` seeds new keys), SQLite (`rusqlite`),
//! `serde`/`serde_json`, `time`, `base64`/`hex`, `csv` (an export format), `libc` (the
//! bounded opener's open flags), `uuid` (a bundle's work directory), `tokio`'s channels
//! and timers (the writer's group commit) and `tracing`. No HTTP stack, no PostgreSQL,
//! no CEL, no MCP: a test reads `cargo metadata` and keeps it so
//! (`tests/dependencies.rs`). Webhook checkpoint sinks are
//! delivered by the application through [`sink::WebhookClient`]; shipping to SIEMs,
//! witnesses' client, the fleet's hub and archiving stay in the application.
//!
//! # Public API
//! - [`AuditLog`]: open a log ([`AuditOptions`]), [`AuditLog::append`] events
//!   ([`NewEvent`], [`EventType`]) and read them back ([`EventFilter`],
//!   [`StoredEvent`]); [`AuditReader`]: read-only access beside a live writer;
//!   [`AuditError`]: everything that can go wrong, with its `help`.
//! - [`line`]: how an event becomes its canonical line ([`line::PolicyVersions`]).
//! - [`merkle`]: the RFC 9162 tree, proofs and their verification.
//! - [`checkpoint`]: C2SP signed-note checkpoints.
//! - [`keys`]: the signing and HMAC keys, kept outside the database.
//! - [`signer`]: the [`signer::Signer`] interface: the key file, or a separate signing
//!   process over a Unix socket.
//! - [`store`]: the SQLite schema, its connections and error mapping (the writer's,
//!   and read-only ones for the application's readers: shipping, witnesses).
//! - [`segments`]: the log as sealed segment files, one chain and one tree over all.
//! - [`verify`]: recomputes a database's chain, tree and checkpoints.
//! - [`export`]: writes an export directory an auditor can check without toolgate;
//!   [`evidence`]: one run's events with their proofs, and its export bundle.
//! - [`siem`]: OCSF records and CEF lines of events, with their evidence (an export
//!   format).
//! - [`cosign`]: witness cosignatures and their quorum check.
//! - [`sink`]: where checkpoints are published besides the database (files and
//!   syslog here, webhooks through the application's [`sink::WebhookClient`]).
//! - [`canonical`]: RFC 8785 canonical JSON and the sha256 helpers;
//!   [`localfile`]: the one bounded opener of local files, and owner-only creation
//!   (both re-exported by the application, which has no copy of its own).
//! - Redaction ([`Redaction`], [`redact`], [`scrub`]): what a line keeps of a call's
//!   arguments.
//!
//! Inside: `log` (the handle, the group-commit writer thread and the read path) and
//! `wal` (the WAL thread).
//!
//! INVARIANT: only this crate writes the audit database; there is no code path that
//! updates or deletes an event; `append` returns only once the event is durable; this
//! crate depends on nothing of the application.

pub mod canonical;
pub mod checkpoint;
pub mod cosign;
pub mod evidence;
pub mod export;
pub mod keys;
pub mod line;
pub mod localfile;
mod log;
pub mod merkle;
pub mod segments;
pub mod siem;
pub mod signer;
pub mod sink;
pub mod store;
pub mod verify;
mod wal;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hmac::{KeyInit, Mac};
use serde::Serialize;
use serde_json::{Map, Value};
use time::OffsetDateTime;

use crate::canonical::Portable;
use crate::line::PolicyVersions;

pub use log::{AuditLog, AuditReader, BatchObserver, MarkWait, RunMarks};
pub use wal::WAL_TRUNCATE_BYTES;

/// The version of the tool gateway contract this build implements, recorded in every
/// audit line (`contract_version`).
pub const CONTRACT_VERSION: &str = "v1";

/// What the audit log keeps of a call's arguments as readable text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Redaction {
    /// Keep the canonical arguments.
    Full,
    /// Replace the values at these JSON pointers with "[redacted]".
    Fields { pointers: Vec<String> },
    /// Keep only the hash and the HMAC commitment.
    HashOnly,
}

/// The kinds of event the log records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    ToolRequested,
    ToolAllowed,
    ToolDenied,
    ToolExecuted,
    ToolFailed,
    ToolTimeout,
    RunCreated,
    RunStatusChanged,
    PolicyLoaded,
    SafetyLockEngaged,
    SafetyLockReleased,
    /// Shadow mode: the candidate policy decided a call differently from the active one.
    ShadowDivergence,
    /// A read of an artifact, allowed or refused, with who read what.
    ArtifactRead,
    /// An admin re-pinned an open run to the loaded policy versions.
    RunRepinned,
    /// Shadow mode: calls not shadowed because its queue was full (a periodic summary).
    ShadowDropped,
    /// An admin issued a run token (its sha256 and binding, never the token).
    RunTokenIssued,
    /// An admin revoked a run token.
    RunTokenRevoked,
    /// `toolgate audit archive` moved sealed segments out of the data directory.
    AuditSegmentsArchived,
    /// A call needing human approval was refused and an approval bound to it requested.
    ApprovalRequested,
    /// An approver approved (details.quorum_met: whether the approval is now granted).
    ApprovalGranted,
    /// An approver denied the approval.
    ApprovalDenied,
    /// An approval expired undecided or unused (recorded once, by the sweeper).
    ApprovalExpired,
    /// A proven credential's decision on an approval was refused: not an approver of
    /// it, or its requester (nothing about the approval changed).
    ApprovalDecisionRefused,
    /// A commit of a two-phase tool's prepared call is about to be sent upstream
    /// (written ahead: the upstream commit runs only once this is durable).
    ToolCommitRequested,
    /// A two-phase tool's prepared call was committed upstream.
    ToolCommitted,
    /// A commit request was refused by the gateway (nothing was sent upstream).
    ToolCommitRefused,
    /// A two-phase tool's commit failed upstream (after its bounded retries).
    ToolCommitFailed,
    /// A two-phase tool's prepared call was rolled back upstream.
    ToolRolledBack,
    /// A two-phase tool's rollback failed upstream (after its bounded retries).
    ToolRollbackFailed,
}

impl EventType {
    /// Every event type, in declaration order.
    pub const ALL: [EventType; 29] = [
        EventType::ToolRequested,
        EventType::ToolAllowed,
        EventType::ToolDenied,
        EventType::ToolExecuted,
        EventType::ToolFailed,
        EventType::ToolTimeout,
        EventType::RunCreated,
        EventType::RunStatusChanged,
        EventType::PolicyLoaded,
        EventType::SafetyLockEngaged,
        EventType::SafetyLockReleased,
        EventType::ShadowDivergence,
        EventType::ArtifactRead,
        EventType::RunRepinned,
        EventType::ShadowDropped,
        EventType::RunTokenIssued,
        EventType::RunTokenRevoked,
        EventType::AuditSegmentsArchived,
        EventType::ApprovalRequested,
        EventType::ApprovalGranted,
        EventType::ApprovalDenied,
        EventType::ApprovalExpired,
        EventType::ApprovalDecisionRefused,
        EventType::ToolCommitRequested,
        EventType::ToolCommitted,
        EventType::ToolCommitRefused,
        EventType::ToolCommitFailed,
        EventType::ToolRolledBack,
        EventType::ToolRollbackFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ToolRequested => "tool_requested",
            EventType::ToolAllowed => "tool_allowed",
            EventType::ToolDenied => "tool_denied",
            EventType::ToolExecuted => "tool_executed",
            EventType::ToolFailed => "tool_failed",
            EventType::ToolTimeout => "tool_timeout",
            EventType::RunCreated => "run_created",
            EventType::RunStatusChanged => "run_status_changed",
            EventType::PolicyLoaded => "policy_loaded",
            EventType::SafetyLockEngaged => "safety_lock_engaged",
            EventType::SafetyLockReleased => "safety_lock_released",
            EventType::ShadowDivergence => "shadow_divergence",
            EventType::ArtifactRead => "artifact_read",
            EventType::RunRepinned => "run_repinned",
            EventType::ShadowDropped => "shadow_dropped",
            EventType::RunTokenIssued => "run_token_issued",
            EventType::RunTokenRevoked => "run_token_revoked",
            EventType::AuditSegmentsArchived => "audit_segments_archived",
            EventType::ApprovalRequested => "approval_requested",
            EventType::ApprovalGranted => "approval_granted",
            EventType::ApprovalDenied => "approval_denied",
            EventType::ApprovalExpired => "approval_expired",
            EventType::ApprovalDecisionRefused => "approval_decision_refused",
            EventType::ToolCommitRequested => "tool_commit_requested",
            EventType::ToolCommitted => "tool_committed",
            EventType::ToolCommitRefused => "tool_commit_refused",
            EventType::ToolCommitFailed => "tool_commit_failed",
            EventType::ToolRolledBack => "tool_rolled_back",
            EventType::ToolRollbackFailed => "tool_rollback_failed",
        }
    }

    /// The type named `name` (`tool_requested`, ...).
    pub fn parse(name: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

/// What a caller hands to [`AuditLog::append`]; the log adds seq, event_id,
/// timestamp_utc, contract_version and prev, and computes the hash.
///
/// Numbers in `arguments` and `details` that are not integers within +-(2^53 - 1) are
/// stored as strings holding their RFC 8785 form, so that any RFC 8785 implementation
/// (Python's `json` included) reproduces the canonical bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub event_type: EventType,
    pub call_id: Option<String>,
    pub run_id: Option<String>,
    pub role_id: Option<String>,
    pub lane_id: Option<String>,
    pub tool_name: Option<String>,
    pub tool_version: Option<String>,
    /// sha256 of the canonical (RFC 8785) arguments.
    pub arguments_hash_sha256: Option<String>,
    /// HMAC-SHA256 of the canonical arguments under the log's commitment key.
    pub arguments_hmac_sha256: Option<String>,
    /// The arguments as kept readable, after the tool's redaction setting.
    pub arguments: Option<Value>,
    /// The same, already in the line's form: the pipeline renders a call's arguments
    /// once for both of its events. An event sets `arguments` or this, never both.
    pub arguments_portable: Option<Portable>,
    pub output_hash_sha256: Option<String>,
    pub error_code: Option<String>,
    pub reason: Option<String>,
    pub failed_step: Option<u8>,
    pub execution_time_ms: Option<u64>,
    pub policy_versions: Option<std::sync::Arc<PolicyVersions>>,
    /// Event-specific fields: decision trace, dry_run, artifacts, run record, ...
    pub details: Map<String, Value>,
    /// More entries of `details`, already in the line's form (the pipeline's scope and
    /// trace, rendered once per call or per event without building a JSON tree). The
    /// line merges them with `details` by key; a key in both is refused.
    pub details_portable: Vec<(&'static str, Portable)>,
}

impl NewEvent {
    /// An event of this type with every optional field empty.
    pub fn new(event_type: EventType) -> Self {
        NewEvent {
            event_type,
            call_id: None,
            run_id: None,
            role_id: None,
            lane_id: None,
            tool_name: None,
            tool_version: None,
            arguments_hash_sha256: None,
            arguments_hmac_sha256: None,
            arguments: None,
            arguments_portable: None,
            output_hash_sha256: None,
            error_code: None,
            reason: None,
            failed_step: None,
            execution_time_ms: None,
            policy_versions: None,
            details: Map::new(),
            details_portable: Vec::new(),
        }
    }

    /// Sets the three argument fields from the canonical arguments: the hash, the HMAC
    /// commitment, and the readable form after `redaction`.
    pub fn with_arguments(
        mut self,
        log: &AuditLog,
        arguments: &Value,
        redaction: &Redaction,
    ) -> Self {
        let commitment = log.commit_arguments(&crate::canonical::to_canonical_bytes(arguments));
        self.arguments_hash_sha256 = Some(commitment.sha256);
        self.arguments_hmac_sha256 = Some(commitment.hmac_sha256);
        self.arguments = redact(arguments, redaction);
        self
    }
}

/// How hard each commit pushes the data to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: an acknowledged event survives power loss. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: an acknowledged event survives a process crash but the
    /// newest ones may be lost on power loss; a checkpoint is only published after an
    /// fsync of the WAL covers every event under it.
    Normal,
}

/// Where checkpoints are published besides the database's `checkpoints` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointSink {
    /// Append each note (and a blank line) to this file, fsynced. Make it append-only
    /// for the gateway's user (`chattr +a`, a separate mount, a log shipper).
    File { path: PathBuf },
    /// POST the newest signed note (periodic checkpoints and the signed head of the
    /// newest commit, latest wins) as `text/plain` to this `http://` or `https://` URL;
    /// best effort, bounded.
    Webhook { url: String },
    /// Send the newest signed note (as a webhook gets it) as one line to this Unix
    /// datagram syslog socket (usually `/dev/log`); best effort.
    Syslog { socket: PathBuf },
}

impl CheckpointSink {
    /// Parses `file:PATH`, `http(s)://HOST[:PORT]/PATH` or `syslog://SOCKET` (e.g.
    /// `syslog:///dev/log`; `syslog://` alone means `/dev/log`).
    pub fn parse(text: &str) -> Result<CheckpointSink, String> {
        if let Some(path) = text.strip_prefix("file:") {
            if path.is_empty() {
                return Err(
                    "`file:` needs a path, e.g. `file:/var/log/toolgate/checkpoints.log`".into(),
                );
            }
            return Ok(CheckpointSink::File {
                path: PathBuf::from(path),
            });
        }
        if let Some(socket) = text.strip_prefix("syslog://") {
            let socket = if socket.is_empty() {
                "/dev/log"
            } else {
                socket
            };
            return Ok(CheckpointSink::Syslog {
                socket: PathBuf::from(socket),
            });
        }
        if text.starts_with("http://") || text.starts_with("https://") {
            return Ok(CheckpointSink::Webhook {
                url: text.to_string(),
            });
        }
        Err(format!(
            "`{text}` is not a checkpoint sink: use `file:PATH`, `http(s)://HOST/PATH` or `syslog://SOCKET`"
        ))
    }
}

/// How to open the log. [`AuditOptions::new`] gives the defaults for a data directory.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// The SQLite database, usually `<data_dir>/audit.db`.
    pub db_path: PathBuf,
    /// Where the signing and HMAC keys live; never inside the database.
    pub key_dir: PathBuf,
    /// An external signer (e.g. [`signer::SocketSigner`]); None: the key file in
    /// `key_dir`. With a signer, `key_dir` holds only the HMAC key and the public key.
    pub signer: Option<std::sync::Arc<dyn signer::Signer>>,
    pub durability: Durability,
    /// Sign a checkpoint once this many events arrived since the last one.
    pub checkpoint_every_events: u64,
    /// Sign a checkpoint this long after the last one if events arrived since.
    pub checkpoint_interval: Duration,
    /// Sign a checkpoint at every interval even when nothing arrived (a heartbeat
    /// proving the log was alive at that size). Default false.
    pub idle_heartbeat: bool,
    pub checkpoint_sinks: Vec<CheckpointSink>,
    /// A PEM file of CA certificates: https webhook sinks then trust only these, not
    /// the system's roots. None: the system's roots.
    pub checkpoint_sink_ca: Option<PathBuf>,
    /// Delivers the webhook sinks (the application's HTTP client); None: a webhook
    /// sink or a sink CA is a configuration error at open.
    pub webhooks: Option<std::sync::Arc<dyn sink::WebhookClient>>,
    /// The checkpoint origin line, and the name given to a new signing key.
    pub origin: String,
    /// How long SQLite waits for another process's lock before failing with
    /// [`AuditError::Locked`].
    pub busy_timeout: Duration,
    /// The longest `append` waits for its commit before failing with
    /// [`AuditError::Timeout`] (the event may still be committed later).
    pub append_timeout: Duration,
    /// Refuse appends with [`AuditError::DiskFull`] once the database would exceed this
    /// many bytes. None: no cap besides the disk.
    pub max_db_bytes: Option<u64>,
    /// Seal the active segment once its database passes this many bytes (checked at
    /// each commit) and continue in a new one (see `segments`). None: never by size.
    pub segment_max_bytes: Option<u64>,
    /// Seal the active segment once it has been open this long and holds an event.
    /// None: never by age.
    pub segment_max_age: Option<Duration>,
}

impl AuditOptions {
    /// The defaults for `data_dir`: `audit.db`, `keys/`, `checkpoints.log`, FULL
    /// durability, a checkpoint every 1000 events or 10 s.
    pub fn new(data_dir: &Path) -> Self {
        AuditOptions {
            db_path: data_dir.join("audit.db"),
            key_dir: data_dir.join("keys"),
            signer: None,
            durability: Durability::Full,
            checkpoint_every_events: 1000,
            checkpoint_interval: Duration::from_secs(10),
            idle_heartbeat: false,
            checkpoint_sinks: vec![CheckpointSink::File {
                path: data_dir.join(DEFAULT_SINK_FILE),
            }],
            checkpoint_sink_ca: None,
            webhooks: None,
            origin: DEFAULT_ORIGIN.to_string(),
            busy_timeout: Duration::from_millis(1000),
            append_timeout: Duration::from_secs(30),
            max_db_bytes: None,
            segment_max_bytes: None,
            segment_max_age: None,
        }
    }
}

/// The default origin line and key name.
pub const DEFAULT_ORIGIN: &str = "toolgate/audit";
/// The default checkpoint sink file, next to the database.
pub const DEFAULT_SINK_FILE: &str = "checkpoints.log";

/// What `append` returns once the event is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub event_id: String,
    /// The event's leaf hash, hex.
    pub hash: String,
}

/// A selection of events; every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub run_id: Option<String>,
    /// Empty: every type.
    pub event_types: Vec<EventType>,
    /// Only events with a larger seq.
    pub after_seq: u64,
    /// Only events at or after this time.
    pub since: Option<OffsetDateTime>,
    /// Only events before this time.
    pub until: Option<OffsetDateTime>,
    /// At most this many, oldest first; 0: every matching event (for rebuilding state
    /// from a few event types; operators' reads should always set a limit).
    pub limit: usize,
    /// Only events whose line holds this text (a prefilter: the caller still checks
    /// the fields it means, e.g. an approval id under `details`).
    pub contains: Option<String>,
}

/// An event as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: u64,
    /// The exact hashed bytes.
    pub line: String,
    pub value: Value,
}

/// A commitment to a call's full arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArgumentCommitment {
    /// Hex SHA-256 of the canonical arguments.
    pub sha256: String,
    /// Hex HMAC-SHA256 of the canonical arguments under the log's HMAC key.
    pub hmac_sha256: String,
}

/// Hex HMAC-SHA256 of `bytes` under `key`.
pub fn hmac_sha256_hex(key: &[u8; 32], bytes: &[u8]) -> String {
    // A 32-byte key is always accepted by HMAC.
    match hmac::Hmac::<sha2::Sha256>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(bytes);
            crate::canonical::to_hex(mac.finalize().into_bytes())
        }
        Err(_) => String::new(),
    }
}

/// The readable form of `arguments` under `redaction`: all of it, the values at the
/// given JSON pointers replaced by `"[redacted]"`, or nothing.
pub fn redact(arguments: &Value, redaction: &Redaction) -> Option<Value> {
    match redaction {
        Redaction::Full => Some(arguments.clone()),
        Redaction::HashOnly => None,
        Redaction::Fields { pointers } => {
            let mut kept = arguments.clone();
            for pointer in pointers {
                if let Some(slot) = kept.pointer_mut(pointer) {
                    *slot = Value::String(REDACTED.to_string());
                }
            }
            Some(kept)
        }
    }
}

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Values shorter than this many characters are not scrubbed from free text (they
/// would mangle every message that happens to contain them, and hide nothing).
pub const MIN_SCRUBBED_CHARS: usize = 4;

/// The argument values `redaction` hides from the audit line, as text to scrub from
/// every other output a call produces (error messages, a tool's stderr, an upstream
/// error body, diagnostic details): every scalar under a redacted pointer (every
/// scalar of the arguments under `hash_only`), raw and JSON-escaped, longest first.
pub fn redacted_values(arguments: &Value, redaction: &Redaction) -> Vec<String> {
    fn leaves(value: &Value, out: &mut Vec<String>, depth: usize) {
        match value {
            Value::String(s) => out.push(s.clone()),
            Value::Number(n) => out.push(n.to_string()),
            Value::Array(items) if depth < 64 => {
                items.iter().for_each(|v| leaves(v, out, depth + 1))
            }
            Value::Object(map) if depth < 64 => {
                map.values().for_each(|v| leaves(v, out, depth + 1))
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    match redaction {
        Redaction::Full => {}
        Redaction::HashOnly => leaves(arguments, &mut found, 0),
        Redaction::Fields { pointers } => {
            for pointer in pointers {
                if let Some(value) = arguments.pointer(pointer) {
                    leaves(value, &mut found, 0);
                }
            }
        }
    }
    let mut secrets = Vec::new();
    for value in found {
        // As JSON would write it (quotes and backslashes escaped), without the quotes.
        let escaped = serde_json::to_string(&value).unwrap_or_default();
        let escaped = escaped
            .strip_prefix('"')
            .and_then(|e| e.strip_suffix('"'))
            .unwrap_or(&escaped)
            .to_string();
        for text in [value, escaped] {
            if text.chars().count() >= MIN_SCRUBBED_CHARS && !secrets.contains(&text) {
                secrets.push(text);
            }
        }
    }
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

/// `text` with every one of `secrets` replaced by [`REDACTED`].
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_string();
    for secret in secrets {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), REDACTED);
        }
    }
    text
}

/// Scrubs every string (and object key) inside `value`.
pub fn scrub_value(value: &mut Value, secrets: &[String]) {
    if secrets.is_empty() {
        return;
    }
    match value {
        Value::String(s) => *s = scrub(s, secrets),
        Value::Array(items) => items.iter_mut().for_each(|v| scrub_value(v, secrets)),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut item) in entries {
                scrub_value(&mut item, secrets);
                map.insert(scrub(&key, secrets), item);
            }
        }
        _ => {}
    }
}

/// Everything that can go wrong with the audit log. Cloneable, so that one failed
/// commit can fail every waiter in its batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditError {
    /// The database file exists but is not an SQLite database.
    NotSqlite { path: PathBuf },
    /// The database is SQLite but not a toolgate audit log.
    NotAuditLog { path: PathBuf, what: String },
    /// Another process holds a lock on the database.
    Locked { path: PathBuf },
    /// The database (or its directory) cannot be written.
    ReadOnly { path: PathBuf },
    /// The disk, or the configured size cap, is full.
    DiskFull { path: PathBuf },
    /// The stored log is inconsistent at `seq` (0: not tied to one event).
    Corrupt { seq: u64, what: String },
    /// A key file is missing, unreadable or does not match.
    Key { path: PathBuf, what: String },
    /// A file or directory could not be read or written.
    Io { path: PathBuf, what: String },
    /// Another SQLite error.
    Sqlite { what: String },
    /// The event cannot be recorded as given.
    InvalidEvent { what: String },
    /// Something exceeds a size limit.
    TooLarge { what: String, limit: u64 },
    /// The log was closed, or its writer stopped.
    Closed,
    /// The writer did not answer within the append timeout.
    Timeout { waited_ms: u64 },
    /// Invalid options.
    Config { what: String },
    /// The external signer (`toolgate signer`) is unreachable or refused to sign.
    Signer { socket: PathBuf, what: String },
    /// The log does not extend a signed checkpoint it must extend: it was cut
    /// (`cut: true`) or its history differs (a fork).
    Diverged { cut: bool, what: String },
}

impl fmt::Display for AuditError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuditError::NotSqlite { path } => {
                write!(f, "`{}` is not an sqlite database", path.display())
            }
            AuditError::NotAuditLog { path, what } => write!(
                f,
                "`{}` is not a toolgate audit log: {what}",
                path.display()
            ),
            AuditError::Locked { path } => write!(
                f,
                "the audit database `{}` is locked by another process",
                path.display()
            ),
            AuditError::ReadOnly { path } => {
                write!(f, "the audit database `{}` is read-only", path.display())
            }
            AuditError::DiskFull { path } => write!(
                f,
                "the disk holding the audit database `{}` is full",
                path.display()
            ),
            AuditError::Corrupt { seq: 0, what } => write!(f, "the audit log is corrupt: {what}"),
            AuditError::Corrupt { seq, what } => {
                write!(f, "the audit log is corrupt at seq {seq}: {what}")
            }
            AuditError::Key { path, what } => write!(f, "audit key `{}`: {what}", path.display()),
            AuditError::Io { path, what } => write!(f, "`{}`: {what}", path.display()),
            AuditError::Sqlite { what } => write!(f, "audit database error: {what}"),
            AuditError::InvalidEvent { what } => write!(f, "invalid audit event: {what}"),
            AuditError::TooLarge { what, limit } => {
                write!(f, "the {what} exceeds the limit of {limit}")
            }
            AuditError::Closed => write!(f, "the audit log is closed"),
            AuditError::Timeout { waited_ms } => write!(
                f,
                "the audit log did not confirm the write within {waited_ms} ms"
            ),
            AuditError::Config { what } => write!(f, "invalid audit configuration: {what}"),
            AuditError::Signer { socket, what } => {
                write!(f, "the checkpoint signer at `{}`: {what}", socket.display())
            }
            AuditError::Diverged { cut: true, what } => {
                write!(f, "the audit log was cut: {what}")
            }
            AuditError::Diverged { cut: false, what } => {
                write!(f, "the audit log forks from a signed checkpoint: {what}")
            }
        }
    }
}

impl std::error::Error for AuditError {}

impl AuditError {
    /// What an operator can do about it.
    pub fn help(&self) -> Option<&'static str> {
        Some(match self {
            AuditError::NotSqlite { .. } => {
                "point --db (or the data directory) at the audit database, or move the file away"
            }
            AuditError::NotAuditLog { .. } => "use a separate database file for the audit log",
            AuditError::Locked { .. } => {
                "stop the other process using the database (only one toolgate may write it)"
            }
            AuditError::ReadOnly { .. } => {
                "check the permissions of the database file and its directory"
            }
            AuditError::DiskFull { .. } => "free disk space or raise the size cap, then retry",
            AuditError::Corrupt { .. } => {
                "run `toolgate audit verify` and keep the database for investigation"
            }
            AuditError::Key { .. } => {
                "check the key directory; never replace the signing key of an existing log"
            }
            AuditError::Io { .. } => "check that the path exists and is writable",
            AuditError::Timeout { .. } => "the disk may be overloaded; check the data directory",
            AuditError::Closed => {
                "the gateway is shutting down or the audit writer stopped; see the logs"
            }
            AuditError::Signer { .. } => {
                "start the signer (`toolgate signer`) or check --signer-socket; nothing is recorded unsigned"
            }
            AuditError::Diverged { .. } => {
                "keep the database and the checkpoint sinks for investigation; run `toolgate audit verify`"
            }
            AuditError::Sqlite { .. }
            | AuditError::InvalidEvent { .. }
            | AuditError::TooLarge { .. }
            | AuditError::Config { .. } => {
                return None;
            }
        })
    }
}

/// `toolgate audit tail`: the events of `run_id` (or all) after `after_seq`, at most
/// `limit`; with `after_seq` 0, the newest `limit` events. Read over a read-only
/// connection to the database at `db`.
pub fn tail_events(
    db: &std::path::Path,
    run_id: Option<String>,
    after_seq: u64,
    limit: u64,
) -> Result<Vec<StoredEvent>, AuditError> {
    let mut filter = EventFilter {
        run_id,
        after_seq,
        limit: limit as usize,
        ..EventFilter::default()
    };
    if after_seq == 0 {
        // The newest `limit` events: start after the seq of the one just older,
        // counting back from the newest segment.
        use rusqlite::OptionalExtension;
        let mut newer = 0i64;
        for (_, path) in segments::list(db)?.into_iter().rev() {
            let conn = store::open_reader(&path, std::time::Duration::from_millis(2000))?;
            let map = |e: rusqlite::Error| store::map_sqlite(&e, &path);
            let count: i64 = conn
                .query_row(
                    "SELECT count(*) FROM events WHERE (?1 IS NULL OR run_id = ?1)",
                    rusqlite::params![filter.run_id],
                    |r| r.get(0),
                )
                .map_err(map)?;
            if newer + count > limit as i64 {
                let older: Option<i64> = conn
                    .query_row(
                        "SELECT seq FROM events WHERE (?1 IS NULL OR run_id = ?1) ORDER BY seq DESC LIMIT 1 OFFSET ?2",
                        rusqlite::params![filter.run_id, limit as i64 - newer],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(map)?;
                if let Some(seq) = older {
                    filter.after_seq = seq as u64;
                }
                break;
            }
            newer += count;
        }
    }
    log::read_segment_events(db, &filter)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redacted_values_are_scrubbed_raw_and_json_escaped() {
        let arguments = json!({"user": "alice", "password": "pa\"ss-w0rd", "pin": 1234, "x": "ab"});
        let fields = Redaction::Fields {
            pointers: vec!["/password".into(), "/pin".into(), "/x".into()],
        };
        let secrets = redacted_values(&arguments, &fields);
        // The raw and the JSON-escaped forms; "ab" is too short to scrub.
        assert_eq!(secrets.len(), 3, "{secrets:?}");
        let echoed = format!("failed for {arguments} (pass pa\"ss-w0rd, pin 1234)");
        let scrubbed = scrub(&echoed, &secrets);
        assert!(
            !scrubbed.contains("ss-w0rd") && !scrubbed.contains("1234"),
            "{scrubbed}"
        );
        assert!(scrubbed.contains("alice"), "{scrubbed}");
        let mut details = json!({"tool_error": echoed, "pa\"ss-w0rd": ["1234"]});
        scrub_value(&mut details, &secrets);
        assert!(!details.to_string().contains("ss-w0rd"), "{details}");
        assert!(!details.to_string().contains("1234"), "{details}");
        // hash_only hides every value; full none.
        assert_eq!(redacted_values(&arguments, &Redaction::HashOnly).len(), 4);
        assert!(redacted_values(&arguments, &Redaction::Full).is_empty());
    }

    #[test]
    fn checkpoint_sinks_parse() {
        assert_eq!(
            CheckpointSink::parse("file:/a/b.log"),
            Ok(CheckpointSink::File {
                path: "/a/b.log".into()
            })
        );
        assert_eq!(
            CheckpointSink::parse("syslog://"),
            Ok(CheckpointSink::Syslog {
                socket: "/dev/log".into()
            })
        );
        assert_eq!(
            CheckpointSink::parse("http://h:1/p"),
            Ok(CheckpointSink::Webhook {
                url: "http://h:1/p".into()
            })
        );
        assert_eq!(
            CheckpointSink::parse("https://h/p"),
            Ok(CheckpointSink::Webhook {
                url: "https://h/p".into()
            })
        );
        assert!(CheckpointSink::parse("ftp://h").is_err());
        assert!(CheckpointSink::parse("file:").is_err());
    }
}
