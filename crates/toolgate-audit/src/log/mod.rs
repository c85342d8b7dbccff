//! [`AuditLog`]: the handle the gateway appends through, and the one writer thread that
//! owns the SQLite connection and commits concurrent appends in groups.
//!
//! Group commit: appenders canonicalize their events, then send them with a oneshot
//! reply over a channel. The writer takes everything queued (up to
//! [`MAX_BATCH_EVENTS`]), gives the events contiguous seqs, renders and hashes their
//! lines, inserts them in ONE transaction and commits it (one fsync), and only then
//! answers every waiter. If the commit fails, every waiter of the batch gets the error
//! and the in-memory chain state (worked on a copy) stays as it was, so seqs stay
//! gapless.
//!
//! Quiet commits (issue 19): when an append finds the log quiet (no other append in
//! progress, the writer idle, no between-commits WAL copy or segment seal due, the
//! database's write lock free), with NORMAL durability and an in-process signer, the
//! appending thread takes the writer and commits its own events with the same code,
//! instead of handing them over and waiting for the answer. One client's call then wakes no other thread for its two
//! events (four thread wake-ups fewer per call). Everything else goes to the writer
//! thread: FULL (a commit waits for the disk, and a connection thread must not), a
//! socket signer (it waits for another process), and any append that meets another,
//! so group commit still gathers concurrent appends.
//!
//! The files: `handle.rs` the [`AuditLog`] handle (open, append, read, close);
//! `writer.rs` the `Writer` (group commit, checkpoints, segment seals) and its thread;
//! `reader.rs` the read path (events by filter across segments, [`AuditReader`]).
//!
//! INVARIANT: a waiter is answered Ok only after the COMMIT that holds its events
//! returned, and that commit also holds a checkpoint over every event signed by the
//! log's [`Signer`](crate::signer::Signer) (the signed head); only the holder of the
//! `Writer` (the writer thread, or a quiet appender) writes events, and one holds it at
//! a time.

mod handle;
mod reader;
mod writer;

pub use handle::{AuditLog, BatchObserver, MarkWait, RunMarks};
pub use reader::AuditReader;
pub(crate) use reader::read_segment_events;
