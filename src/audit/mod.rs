//! The audit log: the `toolgate-audit` crate (the line format, Merkle tree,
//! checkpoints, keys, signer, store, segments, writer, reader, verify and export; see
//! its crate docs for what an auditor must trust), re-exported here under the paths
//! the application uses, and what only the application adds:
//!
//! - [`webhook`]: delivers webhook checkpoint sinks over the one outgoing HTTP stack
//!   (`outbound`), for the crate's [`sink::WebhookClient`].
//! - [`archive`]: `toolgate audit archive`: sealed segments moved out, recorded as an
//!   event; refuses while a `--ship` sink has not confirmed them.
//! - [`witness`]: the C2SP tlog-witness client (the cosignature checks are the
//!   crate's [`cosign`]).
//! - [`ship`]: `serve --ship`: committed events streamed to SIEM sinks, at least once.
//!
//! INVARIANT: the audit crate depends on nothing of the application; only the crate
//! writes the audit database.

pub mod archive;
pub mod ship;
pub mod webhook;
pub mod witness;

pub use toolgate_audit::{
    Appended, ArgumentCommitment, AuditError, AuditLog, AuditOptions, AuditReader, BatchObserver,
    CheckpointSink, DEFAULT_ORIGIN, DEFAULT_SINK_FILE, Durability, EventFilter, EventType,
    MIN_SCRUBBED_CHARS, MarkWait, NewEvent, REDACTED, Redaction, RunMarks, StoredEvent,
    WAL_TRUNCATE_BYTES, hmac_sha256_hex, redact, redacted_values, scrub, scrub_value, tail_events,
};
pub use toolgate_audit::{
    checkpoint, cosign, evidence, export, keys, line, merkle, segments, siem, signer, sink, store,
    verify,
};
