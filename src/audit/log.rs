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
//! INVARIANT: a waiter is answered Ok only after the COMMIT that holds its events
//! returned, and that commit also holds a checkpoint over every event signed by the
//! log's [`Signer`] (the signed head); only the holder of the [`Writer`] (the writer
//! thread, or a quiet appender) writes events, and one holds it at a time.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use time::OffsetDateTime;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, oneshot};

use super::checkpoint::{Checkpoint, verify_note};
use super::keys::{Keys, VerifierKey, valid_key_name};
use super::line::{Prepared, event_id, format_timestamp, prepare, render};
use super::merkle::{Frontier, Hash, leaf_hash};
use super::segments::{SealRecord, StartRecord};
use super::signer::Signer;
use super::sink::Sinks;
use super::store::{self, INSERT_CHECKPOINT, INSERT_EVENT, UPSERT_HEAD, map_sqlite};
use super::wal::WalCheckpointer;
use super::{
    Appended, ArgumentCommitment, AuditError, AuditOptions, Durability, EventFilter, NewEvent,
    StoredEvent, hmac_sha256_hex,
};

/// The most events one transaction takes.
pub const MAX_BATCH_EVENTS: usize = 1024;
/// The most events one `append_all` may carry.
pub const MAX_REQUEST_EVENTS: usize = 4096;
/// The most events waiting for the writer; appenders beyond wait for room.
const MAX_QUEUED_EVENTS: usize = 65_536;

type Reply<T> = oneshot::Sender<Result<T, AuditError>>;

enum Request {
    Append {
        events: Vec<Prepared>,
        reply: Reply<Vec<Appended>>,
        _permit: OwnedSemaphorePermit,
    },
    Close {
        reply: Reply<()>,
    },
}

/// The audit log. Cheap to clone; every clone appends to the same log.
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

/// Told about every group commit, on the writer thread: how many events the
/// transaction held and how long writing and committing it took. Must be cheap and
/// must not block (metrics use it).
pub type BatchObserver = Arc<dyn Fn(usize, Duration) + Send + Sync>;

/// What an append of events of a run waits for first ([`RunMarks::enter`]).
pub type MarkWait = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Told before and after every append of events that name a run (a sidecar shipping
/// to the audit hub marks in the cluster database which runs it holds events of that
/// the hub does not have yet: `hub::tail`).
pub trait RunMarks: Send + Sync {
    /// Before events of `runs` (distinct, not empty) are appended to a log whose
    /// newest seq is `head`: what the append waits for first (None: nothing). The
    /// append goes ahead once it resolves, whatever it found.
    fn enter(&self, runs: &[String], head: u64) -> Option<MarkWait>;
    /// After that append (also when it failed or its caller went away): the seq of
    /// its last event, or None when it is not known to be in the log (it may still
    /// be committed later).
    fn leave(&self, runs: &[String], last_seq: Option<u64>);
}

/// Calls [`RunMarks::leave`] however the append ends.
struct Marked<'a> {
    marks: &'a dyn RunMarks,
    runs: Vec<String>,
    last_seq: Option<u64>,
}

impl Drop for Marked<'_> {
    fn drop(&mut self) {
        self.marks.leave(&self.runs, self.last_seq);
    }
}

struct Inner {
    sender: Sender<Request>,
    /// The writer's state: held by the writer thread while it gathers and commits a
    /// batch, and by a quiet append that commits on its own thread (module docs).
    /// `None` once the log is closed.
    writer: Arc<Mutex<Option<Writer>>>,
    /// Appends in progress (prepared, not yet answered).
    appenders: AtomicUsize,
    /// Whether quiet appends may commit on their own thread: NORMAL durability and an
    /// in-process signer.
    quiet_commits: bool,
    /// Set once by [`AuditLog::observe_batches`]; read by the writer after each commit.
    batch_observer: Arc<OnceLock<BatchObserver>>,
    closed: AtomicBool,
    head: Arc<RwLock<Option<(u64, String)>>>,
    hmac_key: [u8; 32],
    verifier: VerifierKey,
    permits: Arc<Semaphore>,
    /// One read at a time (reads open the segments they need).
    reader: Arc<Mutex<()>>,
    /// The first segment's path (the configured database).
    db_path: PathBuf,
    /// How the WAL was kept bounded (see `wal.rs`), for metrics.
    wal_state: Arc<super::wal::WalState>,
    append_timeout: Duration,
    /// The key directory and the checkpoint signer, for exports made by the server
    /// (a run's evidence bundle).
    key_dir: PathBuf,
    signer: Arc<dyn Signer>,
    /// Told of the runs of every append (set once, by a sidecar that ships).
    marks: OnceLock<Arc<dyn RunMarks>>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("db_path", &self.inner.db_path)
            .field("head", &self.head())
            .finish()
    }
}

impl AuditLog {
    /// Opens (or creates) the log: checks the database is an audit log that can be
    /// written now, validates the chain head and the newest checkpoint against the key,
    /// opens the checkpoint sinks and starts the writer thread.
    pub fn open(options: AuditOptions) -> Result<AuditLog, AuditError> {
        if options.checkpoint_every_events == 0 {
            return Err(AuditError::Config {
                what: "checkpoint_every_events must be at least 1".into(),
            });
        }
        if options.checkpoint_interval < Duration::from_millis(10) {
            return Err(AuditError::Config {
                what: "checkpoint_interval must be at least 10 ms".into(),
            });
        }
        if !valid_key_name(&options.origin) {
            return Err(AuditError::Config {
                what: format!(
                    "origin `{}` must be non-empty, without spaces or `+`",
                    options.origin
                ),
            });
        }
        let base = options.db_path.clone();
        if let Some(dir) = base
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.exists())
        {
            crate::localfile::create_dir_all(dir).map_err(|e| AuditError::Io {
                path: dir.to_path_buf(),
                what: format!("cannot create the data directory: {e}"),
            })?;
        }
        let lock = take_writer_lock(&base, options.busy_timeout)?;
        let (conn, path, start) = open_active(&options)?;
        let (count, _) = store::head(&conn, &path)?;
        let signed_before: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM checkpoints) OR EXISTS (SELECT 1 FROM signed_head)",
                [],
                |r| r.get(0),
            )
            .map_err(|e| map_sqlite(&e, &path))?;
        let fresh = count == 0 && !signed_before && start.size == 0;
        let keys = match &options.signer {
            Some(signer) => Keys::with_signer(&options.key_dir, signer.clone(), fresh)?,
            None => Keys::load_or_create(&options.key_dir, &options.origin, fresh)?,
        };
        let verifier = keys.signer.verifier().clone();
        // The newest checkpoint each readable sink holds: the log must extend them.
        let mut extra = Vec::new();
        for sink in &options.checkpoint_sinks {
            if let super::CheckpointSink::File { path: file } = sink
                && let Some(note) = super::sink::newest_note(file)?
            {
                let checkpoint = verify_note(&note, &verifier).map_err(|e| AuditError::Key {
                    path: file.clone(),
                    what: format!("the newest checkpoint in this sink does not verify: {e}"),
                })?;
                extra.push((
                    format!("the newest checkpoint in `{}`", file.display()),
                    checkpoint,
                ));
            }
        }
        let state = store::load_state(&conn, &path, &extra, &start)?;
        for (what, row) in [
            ("newest checkpoint", &state.last_checkpoint),
            ("signed head", &state.head),
        ] {
            let Some(row) = row else { continue };
            let checkpoint = verify_note(&row.note, &verifier).map_err(|e| AuditError::Key {
                path: options.key_dir.clone(),
                what: format!("the {what} does not verify with this key: {e}"),
            })?;
            if checkpoint.size != row.size || crate::canonical::to_hex(checkpoint.root) != row.root
            {
                return Err(AuditError::Corrupt {
                    seq: 0,
                    what: format!("the {what} note does not match its row"),
                });
            }
        }
        let sinks = Sinks::open(
            &options.checkpoint_sinks,
            options.checkpoint_sink_ca.as_deref(),
        )?;
        let wal_state = Arc::new(super::wal::WalState::default());
        let wal = WalCheckpointer::start(&path, options.durability, sinks, wal_state.clone())?;
        let head_value = (state.frontier.size() > 0)
            .then(|| (state.frontier.size(), crate::canonical::to_hex(state.prev)));
        let head = Arc::new(RwLock::new(head_value));
        let (sender, receiver) = std::sync::mpsc::channel();
        let batch_observer = Arc::new(OnceLock::new());
        let writer = Writer {
            batch_observer: batch_observer.clone(),
            path: path.clone(),
            durability: options.durability,
            last_cp_size: state
                .last_checkpoint
                .as_ref()
                .map_or(0, |c| c.size)
                .max(start.size),
            base: base.clone(),
            start,
            needs_segment: false,
            segment_max_bytes: options.segment_max_bytes,
            segment_max_age: options.segment_max_age,
            max_db_bytes: options.max_db_bytes,
            busy_timeout: options.busy_timeout,
            _lock: lock,
            last_cp_at: Instant::now(),
            frontier: state.frontier,
            prev: state.prev,
            last_ts: state.last_ts,
            conn,
            signer: keys.signer.clone(),
            origin: options.origin.clone(),
            every: options.checkpoint_every_events,
            interval: options.checkpoint_interval,
            idle_heartbeat: options.idle_heartbeat,
            head: head.clone(),
            last_batch: 0,
            last_commit: Duration::ZERO,
            last_commit_end: Instant::now(),
            linger_until: Instant::now(),
            linger_target: 0,
            wal,
        };
        let quiet_commits = options.durability == Durability::Normal && keys.signer.in_process();
        let first_wait = writer.until_checkpoint();
        let writer = Arc::new(Mutex::new(Some(writer)));
        let thread_writer = writer.clone();
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || run_writer(&thread_writer, receiver, first_wait))
            .map_err(|e| AuditError::Io {
                path: path.clone(),
                what: format!("cannot start the audit writer thread: {e}"),
            })?;
        Ok(AuditLog {
            inner: Arc::new(Inner {
                sender,
                writer,
                appenders: AtomicUsize::new(0),
                quiet_commits,
                batch_observer,
                closed: AtomicBool::new(false),
                head,
                hmac_key: keys.hmac_key,
                verifier,
                permits: Arc::new(Semaphore::new(MAX_QUEUED_EVENTS)),
                reader: Arc::new(Mutex::new(())),
                db_path: base,
                wal_state,
                append_timeout: options.append_timeout,
                key_dir: options.key_dir.clone(),
                signer: keys.signer.clone(),
                marks: OnceLock::new(),
            }),
        })
    }

    /// Appends one event; returns once it is durable (committed with the configured
    /// durability).
    pub async fn append(&self, event: NewEvent) -> Result<Appended, AuditError> {
        self.append_all(vec![event])
            .await?
            .pop()
            .ok_or(AuditError::Closed)
    }

    /// Appends events with contiguous seqs in one transaction; returns once they are
    /// durable. Needs a tokio runtime with the time driver (bounded waits).
    pub async fn append_all(&self, events: Vec<NewEvent>) -> Result<Vec<Appended>, AuditError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let Some(marks) = self.inner.marks.get() else {
            return self.append_unmarked(events).await;
        };
        let mut runs: Vec<String> = Vec::new();
        for run in events.iter().filter_map(|e| e.run_id.as_ref()) {
            if !runs.contains(run) {
                runs.push(run.clone());
            }
        }
        if runs.is_empty() {
            return self.append_unmarked(events).await;
        }
        let wait = marks.enter(&runs, self.head().map_or(0, |h| h.0));
        let mut marked = Marked {
            marks: marks.as_ref(),
            runs,
            last_seq: None,
        };
        if let Some(wait) = wait {
            wait.await;
        }
        let appended = self.append_unmarked(events).await;
        if let Ok(appended) = &appended {
            marked.last_seq = appended.last().map(|a| a.seq);
        }
        appended
    }

    /// Tells `marks` of the runs of every append from now on (the first registration
    /// wins; false if one was already set).
    pub fn mark_runs(&self, marks: Arc<dyn RunMarks>) -> bool {
        self.inner.marks.set(marks).is_ok()
    }

    /// The newest seq when nothing is being appended or waits for the writer (every
    /// append handed over so far is in the log or failed for good); None while
    /// something is.
    pub fn settled_head(&self) -> Option<u64> {
        let idle = self.inner.appenders.load(Ordering::Acquire) == 0
            && self.inner.permits.available_permits() == MAX_QUEUED_EVENTS;
        let head = self.head().map_or(0, |h| h.0);
        // Read again: an append that began in between makes this moment unsettled.
        (idle
            && self.inner.appenders.load(Ordering::Acquire) == 0
            && self.inner.permits.available_permits() == MAX_QUEUED_EVENTS)
            .then_some(head)
    }

    /// [`AuditLog::append_all`] without telling the run marks.
    async fn append_unmarked(&self, events: Vec<NewEvent>) -> Result<Vec<Appended>, AuditError> {
        if events.len() > MAX_REQUEST_EVENTS {
            return Err(AuditError::TooLarge {
                what: "number of events in one append".into(),
                limit: MAX_REQUEST_EVENTS as u64,
            });
        }
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(AuditError::Closed);
        }
        let prepared = events.iter().map(prepare).collect::<Result<Vec<_>, _>>()?;
        let appending = Appending::enter(&self.inner.appenders);
        if let Some(result) = self.commit_if_quiet(&prepared, appending.others) {
            return result;
        }
        let timeout = self.inner.append_timeout;
        let timed_out = || AuditError::Timeout {
            waited_ms: timeout.as_millis() as u64,
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let count = prepared.len() as u32;
        // Room in the queue is the common case: taken without arming a timer; only a
        // full queue waits, bounded by the deadline.
        let permit = match self.inner.permits.clone().try_acquire_many_owned(count) {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return Err(AuditError::Closed),
            Err(TryAcquireError::NoPermits) => tokio::time::timeout_at(
                deadline,
                self.inner.permits.clone().acquire_many_owned(count),
            )
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| AuditError::Closed)?,
        };
        let (reply, answer) = oneshot::channel();
        self.inner
            .sender
            .send(Request::Append {
                events: prepared,
                reply,
                _permit: permit,
            })
            .map_err(|_| AuditError::Closed)?;
        match tokio::time::timeout_at(deadline, answer).await {
            Err(_) => Err(timed_out()),
            Ok(Err(_)) => Err(AuditError::Closed),
            Ok(Ok(result)) => result,
        }
    }

    /// Commits `prepared` on this thread when the log is quiet (module docs); None
    /// hands it to the writer thread. `others`: the appends in progress besides this.
    fn commit_if_quiet(
        &self,
        prepared: &[Prepared],
        others: usize,
    ) -> Option<Result<Vec<Appended>, AuditError>> {
        if !self.inner.quiet_commits || others > 0 {
            return None;
        }
        // Never waits: a writer held by its thread is busy, and the events join its
        // next batch instead. A poisoned writer is recovered by the writer thread
        // (`lock_writer`).
        let mut guard = self.inner.writer.try_lock().ok()?;
        let result = guard.as_mut()?.commit_quietly(prepared)?;
        Some(result.and_then(|mut appended| appended.pop().ok_or(AuditError::Closed)))
    }

    /// The SHA-256 and the keyed HMAC-SHA256 of the canonical arguments.
    pub fn commit_arguments(&self, canonical_arguments: &[u8]) -> ArgumentCommitment {
        ArgumentCommitment {
            sha256: crate::canonical::sha256_hex(canonical_arguments),
            hmac_sha256: hmac_sha256_hex(&self.inner.hmac_key, canonical_arguments),
        }
    }

    /// Reads events, oldest first.
    pub async fn events(&self, filter: EventFilter) -> Result<Vec<StoredEvent>, AuditError> {
        let reader = self.inner.reader.clone();
        let path = self.inner.db_path.clone();
        tokio::task::spawn_blocking(move || {
            let _one = reader.lock().unwrap_or_else(|p| p.into_inner());
            read_segment_events(&path, &filter)
        })
        .await
        .map_err(|_| AuditError::Closed)?
    }

    /// Flushes what is queued, signs a final checkpoint if events arrived since the last
    /// one, and stops the writer. Later appends fail with [`AuditError::Closed`].
    pub async fn close(&self) -> Result<(), AuditError> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (reply, answer) = oneshot::channel();
        if self.inner.sender.send(Request::Close { reply }).is_err() {
            return Ok(());
        }
        match tokio::time::timeout(self.inner.append_timeout, answer).await {
            Err(_) => Err(AuditError::Timeout {
                waited_ms: self.inner.append_timeout.as_millis() as u64,
            }),
            Ok(Err(_)) => Err(AuditError::Closed),
            Ok(Ok(result)) => result,
        }
    }

    /// The last seq and its hash, or None for an empty log.
    pub fn head(&self) -> Option<(u64, String)> {
        self.inner
            .head
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Registers the observer of group commits (the first registration wins; false if
    /// one was already set).
    pub fn observe_batches(&self, observer: BatchObserver) -> bool {
        self.inner.batch_observer.set(observer).is_ok()
    }

    /// The log's first segment (the configured database).
    /// How often the WAL was started over after the writer's copy, and how often the
    /// WAL thread had to truncate it instead (see `wal.rs`), since the log was opened.
    pub fn wal_counters(&self) -> (u64, u64) {
        let state = &self.inner.wal_state;
        (
            state.restarts.load(Ordering::Relaxed),
            state.truncations.load(Ordering::Relaxed),
        )
    }

    pub fn db_path(&self) -> &std::path::Path {
        &self.inner.db_path
    }

    /// The public key that verifies this log's checkpoints.
    pub fn verifier_key(&self) -> &VerifierKey {
        &self.inner.verifier
    }

    /// One page of a run's events with their verification status against the newest
    /// signed checkpoint (see `evidence::run_evidence`), read off the async runtime.
    pub async fn run_evidence(
        &self,
        run_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<super::evidence::RunEvidence, AuditError> {
        let reader = self.inner.reader.clone();
        let path = self.inner.db_path.clone();
        let key = self.inner.verifier.clone();
        let run_id = run_id.to_string();
        tokio::task::spawn_blocking(move || {
            let _one = reader.lock().unwrap_or_else(|p| p.into_inner());
            super::evidence::run_evidence(&path, &key, &run_id, after_seq, limit)
        })
        .await
        .map_err(|_| AuditError::Closed)?
    }

    /// A run's export bundle (see `evidence::run_bundle`), made in a fresh directory
    /// under `work_root` that is removed afterwards, off the async runtime.
    pub async fn run_bundle(
        &self,
        run_id: &str,
        work_root: PathBuf,
        max_bytes: u64,
    ) -> Result<super::evidence::Bundle, super::evidence::BundleError> {
        let reader = self.inner.reader.clone();
        let path = self.inner.db_path.clone();
        let key_dir = self.inner.key_dir.clone();
        let signer = self.inner.signer.clone();
        let run_id = run_id.to_string();
        let work_dir = work_root.join(format!("bundle-{}", uuid::Uuid::new_v4()));
        tokio::task::spawn_blocking(move || {
            let _one = reader.lock().unwrap_or_else(|p| p.into_inner());
            super::evidence::run_bundle(&path, &key_dir, signer, &run_id, &work_dir, max_bytes)
        })
        .await
        .map_err(|_| {
            super::evidence::BundleError::Export(super::export::ExportError::Audit(
                AuditError::Closed,
            ))
        })?
    }

    /// The directory of the log's first segment (the data directory).
    pub fn data_dir(&self) -> PathBuf {
        self.inner
            .db_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }
}

/// How long a read waits for the writer's lock.
const READ_BUSY_TIMEOUT: Duration = Duration::from_millis(2000);

/// Reads events matching `filter` across the segments of the log whose first segment
/// is `base`, oldest first: each segment is opened read-only while it is read; a
/// sealed segment wholly at or before `filter.after_seq` is skipped. A segment that
/// vanishes between the listing and its opening (archived meanwhile) is skipped too.
pub(crate) fn read_segment_events(
    base: &std::path::Path,
    filter: &EventFilter,
) -> Result<Vec<StoredEvent>, AuditError> {
    let mut out: Vec<StoredEvent> = Vec::new();
    let segments = super::segments::list(base)?;
    if segments.is_empty() {
        return Err(AuditError::Io {
            path: base.to_path_buf(),
            what: "no such file".into(),
        });
    }
    for (_, path) in segments {
        let conn = match store::open_reader(&path, READ_BUSY_TIMEOUT) {
            Ok(conn) => conn,
            Err(AuditError::Io { .. }) if !path.exists() => continue,
            Err(e) => return Err(e),
        };
        if let Some(seal) = super::segments::read_seal(&conn, &path)?
            && seal.last_seq <= filter.after_seq
        {
            continue;
        }
        let mut part = filter.clone();
        if let Some(last) = out.last() {
            part.after_seq = part.after_seq.max(last.seq);
        }
        if filter.limit != 0 {
            part.limit = filter.limit - out.len();
        }
        out.extend(read_events(&conn, &path, &part)?);
        if filter.limit != 0 && out.len() >= filter.limit {
            break;
        }
    }
    Ok(out)
}

/// Waits (up to `wait`) for the exclusive lock on `<db>.lock`: one writer per log
/// (a gateway, or `toolgate audit archive`).
fn take_writer_lock(base: &std::path::Path, wait: Duration) -> Result<std::fs::File, AuditError> {
    let mut name = base.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    // Opened for appending (nothing is written to it) through localfile: a FIFO put in
    // its place is refused at once instead of waiting for a reader.
    let file = crate::localfile::open_append(&lock_path).map_err(|e| match e {
        crate::localfile::ReadError::Io(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            AuditError::ReadOnly {
                path: lock_path.clone(),
            }
        }
        e => AuditError::Io {
            path: lock_path.clone(),
            what: format!("cannot open the writer lock: {e}"),
        },
    })?;
    let deadline = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                // Bounded retry: a writer closing in this process releases it soon.
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(AuditError::Locked {
                    path: base.to_path_buf(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(AuditError::Io {
                    path: lock_path,
                    what: format!("cannot take the writer lock: {e}"),
                });
            }
        }
    }
}

/// Opens the active segment for writing and returns it with its start record: the
/// newest segment present; if it is sealed (a crash after its seal), the next one,
/// created from its seal record.
fn open_active(
    options: &AuditOptions,
) -> Result<(Connection, PathBuf, super::segments::StartRecord), AuditError> {
    use super::segments::{self, StartRecord};
    let base = &options.db_path;
    let (number, path) = segments::newest(base)?;
    let conn = store::open_writer(
        &path,
        options.durability,
        options.busy_timeout,
        options.max_db_bytes,
    )?;
    let map = |e: rusqlite::Error| map_sqlite(&e, &path);
    let start = match segments::read_start(&conn, &path)? {
        Some(start) => start,
        None if number == 1 => {
            let start = StartRecord::genesis(OffsetDateTime::now_utc().unix_timestamp());
            segments::write_start(&conn, &start).map_err(map)?;
            start
        }
        None => {
            return Err(AuditError::Corrupt {
                seq: 0,
                what: format!(
                    "`{}` has no segment start record: run `toolgate audit verify`",
                    path.display()
                ),
            });
        }
    };
    if start.segment != number {
        return Err(AuditError::Corrupt {
            seq: 0,
            what: format!(
                "`{}` holds segment {}, not {number}: run `toolgate audit verify`",
                path.display(),
                start.segment
            ),
        });
    }
    if let Some(seal) = segments::read_seal(&conn, &path)? {
        drop(conn);
        let next = segments::segment_path(base, number + 1);
        let start = seal.next_start(OffsetDateTime::now_utc().unix_timestamp());
        segments::create(&next, &start, options.durability)?;
        let conn = store::open_writer(
            &next,
            options.durability,
            options.busy_timeout,
            options.max_db_bytes,
        )?;
        super::wal::configure_writer(&conn, &next)?;
        return Ok((conn, next, start));
    }
    super::wal::configure_writer(&conn, &path)?;
    Ok((conn, path, start))
}

/// Reads events matching `filter` over `conn`.
pub(crate) fn read_events(
    conn: &Connection,
    path: &std::path::Path,
    filter: &EventFilter,
) -> Result<Vec<StoredEvent>, AuditError> {
    let map = |e: rusqlite::Error| map_sqlite(&e, path);
    let (sql, args) = events_query(conn, filter).map_err(map)?;
    let mut stmt = conn.prepare_cached(&sql).map_err(map)?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(args), |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?))
        })
        .map_err(map)?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, line) = row.map_err(map)?;
        let value = serde_json::from_str(&line).map_err(|_| AuditError::Corrupt {
            seq,
            what: "the stored line is not JSON".into(),
        })?;
        out.push(StoredEvent { seq, line, value });
    }
    Ok(out)
}

/// The query of [`read_events`] and its arguments.
fn events_query(
    conn: &Connection,
    filter: &EventFilter,
) -> rusqlite::Result<(String, Vec<rusqlite::types::Value>)> {
    let mut sql = String::from("SELECT seq, line FROM events WHERE seq > ?");
    let mut args: Vec<rusqlite::types::Value> =
        vec![(filter.after_seq.min(i64::MAX as u64) as i64).into()];
    if let Some(run) = &filter.run_id {
        sql.push_str(" AND run_id = ?");
        args.push(run.clone().into());
    }
    if !filter.event_types.is_empty() {
        sql.push_str(" AND type IN (");
        sql.push_str(&vec!["?"; filter.event_types.len()].join(", "));
        sql.push(')');
        if !filter
            .event_types
            .iter()
            .any(|t| store::UNINDEXED_TYPES.contains(t))
        {
            // Lets SQLite use the partial index on the other types (store.rs).
            sql.push_str(" AND ");
            sql.push_str(store::UNINDEXED_TYPES_TERM);
        }
        args.extend(
            filter
                .event_types
                .iter()
                .map(|t| t.as_str().to_string().into()),
        );
    }
    if let Some(text) = &filter.contains {
        sql.push_str(" AND instr(line, ?) > 0");
        args.push(text.clone().into());
    }
    // The time bounds become seq bounds (no index on ts); the ts conditions stay, so
    // a row out of order (a database edited by hand) is still never returned.
    if let Some(since) = filter.since {
        let since = format_timestamp(since);
        sql.push_str(" AND seq >= ? AND ts >= ?");
        args.push(seq_bound(conn, &since)?.into());
        args.push(since.into());
    }
    if let Some(until) = filter.until {
        let until = format_timestamp(until);
        sql.push_str(" AND seq < ? AND ts < ?");
        args.push(seq_bound(conn, &until)?.into());
        args.push(until.into());
    }
    let limit = if filter.limit == 0 {
        -1
    } else {
        filter.limit.min(i64::MAX as usize) as i64
    };
    // LIMIT -1: no limit.
    sql.push_str(" ORDER BY seq LIMIT ?");
    args.push(limit.into());
    Ok((sql, args))
}

/// The first seq whose timestamp is at or after `ts` (one past the last event when
/// none is): a binary search over seq, as timestamps never go backwards along it.
fn seq_bound(conn: &Connection, ts: &str) -> rusqlite::Result<i64> {
    let (first, last): (Option<i64>, Option<i64>) =
        conn.query_row("SELECT min(seq), max(seq) FROM events", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let (Some(mut low), Some(last)) = (first, last) else {
        return Ok(0);
    };
    let mut high = last + 1;
    let mut at =
        conn.prepare_cached("SELECT seq, ts FROM events WHERE seq >= ?1 ORDER BY seq LIMIT 1")?;
    while low < high {
        let middle = low + (high - low) / 2;
        let found: Option<(i64, String)> = at
            .query_row([middle], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        match found {
            Some((seq, found_ts)) if found_ts.as_str() < ts => low = seq + 1,
            _ => high = middle,
        }
    }
    Ok(low)
}

/// The writer thread's state.
struct Writer {
    conn: Connection,
    path: PathBuf,
    durability: Durability,
    /// The tree over every committed event.
    frontier: Frontier,
    /// The leaf hash of the last committed event (zeros for an empty log).
    prev: Hash,
    /// The newest timestamp written; timestamps never go backwards along seq.
    last_ts: String,
    signer: Arc<dyn Signer>,
    origin: String,
    every: u64,
    interval: Duration,
    idle_heartbeat: bool,
    /// Size of the newest checkpoint, and when the writer last considered one.
    last_cp_size: u64,
    last_cp_at: Instant,
    head: Arc<RwLock<Option<(u64, String)>>>,
    /// Events in the previous commit, how long it took and when it ended (adaptive
    /// group commit, see `should_linger`).
    last_batch: usize,
    last_commit: Duration,
    last_commit_end: Instant,
    linger_until: Instant,
    /// How many events the batch being gathered waits for (see `should_linger`).
    linger_target: usize,
    /// See [`BatchObserver`].
    batch_observer: Arc<OnceLock<BatchObserver>>,
    /// Copies the WAL into the database off this thread (see `wal.rs`).
    wal: WalCheckpointer,
    /// The first segment's path; `path` is the active segment's.
    base: PathBuf,
    /// The active segment's start record.
    start: StartRecord,
    /// The active segment is sealed and the next could not be opened yet: every
    /// commit tries again first and fails closed until it can.
    needs_segment: bool,
    segment_max_bytes: Option<u64>,
    segment_max_age: Option<Duration>,
    max_db_bytes: Option<u64>,
    busy_timeout: Duration,
    /// Held for the writer's life: one writer per log.
    _lock: std::fs::File,
}

/// A request arriving this soon after a commit belongs to a busy streak.
const BUSY_STREAK: Duration = Duration::from_millis(2);
/// Bounds of the wait for more requests in a busy streak (the previous commit's
/// duration, clamped): a little latency buys far fewer fsyncs per event.
const MIN_LINGER: Duration = Duration::from_micros(100);
const MAX_LINGER: Duration = Duration::from_millis(1);
/// A batch of at least this many events means many appenders are waiting (8 clients
/// never make one: each has at most one event in flight). The next batch then aims
/// for twice as many, for up to [`CROWDED_LINGER_FACTOR`] commit times (still at most
/// [`MAX_LINGER`]): every commit's own cost (the signature, the index and head pages
/// written to the WAL) is shared by more events, which with NORMAL durability (a
/// commit of a fraction of a millisecond) otherwise carried about 8 (issue 19).
const CROWDED_BATCH: usize = 10;
const CROWDED_LINGER_FACTOR: u32 = 4;
const MAX_CROWDED_TARGET: usize = 256;
/// In a crowded streak the writer sleeps in slices this long while it lingers.
const LINGER_SLICE: Duration = Duration::from_micros(100);

/// The outcome of one committed batch.
struct Committed {
    appended: Vec<Vec<Appended>>,
    frontier: Frontier,
    prev: Hash,
    last_ts: String,
    note: Option<(u64, String)>,
}

impl Writer {
    /// How long until the next timed checkpoint is due (zero: due now).
    fn until_checkpoint(&self) -> Duration {
        (self.last_cp_at + self.interval).saturating_duration_since(Instant::now())
    }

    /// Gathers a batch starting with `first` (and whatever else is queued, lingering
    /// in a busy streak), commits it and answers it. Returns the reply of a `Close`
    /// met on the way, which the caller carries out.
    fn serve(&mut self, first: Request, receiver: &Receiver<Request>) -> Option<Reply<()>> {
        let mut batch = Vec::new();
        let mut count = 0;
        let mut close = None;
        let mut next = Some(first);
        // INVARIANT: lingering is bounded by MAX_LINGER per batch.
        // A crowded streak (many appenders, issue 19) aims for twice the last batch
        // and may wait a few commit times for it; otherwise the batch aims for the
        // appenders the last commit answered, for at most one commit time.
        let crowded = self.last_batch >= CROWDED_BATCH;
        let (linger, target) = if crowded {
            (
                self.last_commit * CROWDED_LINGER_FACTOR,
                (self.last_batch * 2).min(MAX_CROWDED_TARGET),
            )
        } else {
            (self.last_commit, self.last_batch)
        };
        self.linger_until = Instant::now() + linger.clamp(MIN_LINGER, MAX_LINGER);
        self.linger_target = target;
        while let Some(request) = next.take() {
            match request {
                Request::Append {
                    events,
                    reply,
                    _permit,
                } => {
                    count += events.len();
                    batch.push((events, reply, _permit));
                }
                Request::Close { reply } => {
                    close = Some(reply);
                    break;
                }
            }
            if count >= MAX_BATCH_EVENTS {
                break;
            }
            next = receiver.try_recv().ok();
            if next.is_none() && self.should_linger(count) {
                // Busy streak: the appenders answered by the last commit are
                // coming back; wait briefly so they share this commit.
                let left = self.linger_until.saturating_duration_since(Instant::now());
                if crowded {
                    // Appenders arrive every few microseconds: sleep a slice and
                    // take what came, instead of being woken by each of them.
                    std::thread::sleep(left.min(LINGER_SLICE));
                    next = receiver.try_recv().ok();
                } else {
                    next = receiver.recv_timeout(left).ok();
                }
            }
        }
        if !batch.is_empty() {
            let requests: Vec<&[Prepared]> = batch
                .iter()
                .map(|(events, _, _)| events.as_slice())
                .collect();
            let result = self.commit_timed(&requests, count, Lock::Take);
            match result {
                Ok(appended) => {
                    for ((_, reply, permit), appended) in batch.into_iter().zip(appended) {
                        let _ = reply.send(Ok(appended));
                        drop(permit);
                    }
                }
                Err(error) => {
                    for (_, reply, _) in batch {
                        let _ = reply.send(Err(error.clone()));
                    }
                }
            }
            // The batch is answered; the WAL thread may have asked for the copy
            // that lets the next commit start the WAL over (see `wal.rs`).
            if self.wal.restart_wanted() {
                super::wal::checkpoint_between_commits(&self.conn, &self.path, self.wal.state());
            }
        }
        if close.is_none() && self.until_checkpoint().is_zero() {
            self.timed_checkpoint();
        }
        close
    }

    /// Whether to wait for more requests before committing `count` events: only in a
    /// busy streak (the previous commit ended moments ago), until `linger_target`
    /// events are in (as many as the last commit answered; twice that in a crowded
    /// streak), and never past `linger_until`.
    fn should_linger(&self, count: usize) -> bool {
        count < self.linger_target
            && self.last_commit_end.elapsed() < BUSY_STREAK
            && Instant::now() < self.linger_until
    }

    /// A quiet append's commit, on the appending thread (module docs). None hands the
    /// events to the writer thread instead: it wants its between-commits WAL copy, the
    /// active segment is due for its seal or the next one is not open yet, or another
    /// connection holds the database's write lock. A quiet commit never waits for that
    /// lock (a connection thread must not stall on another process; the writer thread
    /// waits for it, within `busy_timeout`, and reports what it finds), and never seals
    /// a segment (the seal moves the WAL thread, which first syncs and publishes to the
    /// checkpoint sinks): the append that fills a segment returns at once, and the next
    /// one goes to the writer thread, which seals it after that commit.
    fn commit_quietly(
        &mut self,
        prepared: &[Prepared],
    ) -> Option<Result<Vec<Vec<Appended>>, AuditError>> {
        if self.needs_segment || self.wal.restart_wanted() || self.segment_due() {
            return None;
        }
        self.conn.busy_timeout(Duration::ZERO).ok()?;
        let began = self
            .conn
            .prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut begin| begin.execute([]));
        let restored = self.conn.busy_timeout(self.busy_timeout);
        match (began, restored) {
            (Ok(_), Ok(())) => Some(self.commit_timed(&[prepared], prepared.len(), Lock::Held)),
            (Ok(_), Err(e)) => {
                // Not left without its busy timeout: give the lock back, hand over.
                tracing::warn!(error = %e, "cannot restore the audit writer's busy timeout");
                drop(BatchTransaction::adopt(&self.conn));
                None
            }
            (Err(_), _) => None,
        }
    }

    /// Commits one batch and keeps the group-commit figures (`should_linger`) and the
    /// batch observer up to date; the caller answers the appenders.
    fn commit_timed(
        &mut self,
        requests: &[&[Prepared]],
        count: usize,
        lock: Lock,
    ) -> Result<Vec<Vec<Appended>>, AuditError> {
        let started = Instant::now();
        let result = self.commit(requests, count as u64, lock);
        self.last_batch = count;
        self.last_commit = started.elapsed();
        self.last_commit_end = Instant::now();
        if let Some(observe) = self.batch_observer.get() {
            observe(count, self.last_commit);
        }
        result
    }

    /// Commits one batch: each request's events in order, with contiguous seqs.
    fn commit(
        &mut self,
        requests: &[&[Prepared]],
        count: u64,
        lock: Lock,
    ) -> Result<Vec<Vec<Appended>>, AuditError> {
        if self.needs_segment
            && let Err(error) = self.open_next_segment()
        {
            tracing::error!(error = %error, "cannot open the next audit segment");
            return Err(error);
        }
        let with_checkpoint = self.frontier.size() + count - self.last_cp_size >= self.every;
        match self.write_batch(requests, with_checkpoint, lock) {
            Ok(committed) => {
                self.frontier = committed.frontier;
                self.prev = committed.prev;
                self.last_ts = committed.last_ts;
                self.set_head();
                if let Some((size, note)) = committed.note {
                    self.last_cp_size = size;
                    self.last_cp_at = Instant::now();
                    self.wal.publish(note, self.durability == Durability::Full);
                }
                // Sealed before the batch is answered: an append that fills a segment
                // returns once that segment is sealed (a few ms, once per segment). Not
                // by a quiet commit: the next append goes to the writer thread for it.
                if lock == Lock::Take
                    && self.segment_due()
                    && let Err(error) = self.seal()
                {
                    tracing::error!(error = %error, "cannot seal the audit segment");
                }
                Ok(committed.appended)
            }
            Err(error) => {
                tracing::error!(error = %error, "audit batch commit failed");
                self.reload();
                Err(error)
            }
        }
    }

    /// Writes one batch in one transaction. Works on copies of the chain state, which
    /// the caller adopts only if the commit succeeded.
    fn write_batch(
        &mut self,
        requests: &[&[Prepared]],
        with_checkpoint: bool,
        lock: Lock,
    ) -> Result<Committed, AuditError> {
        let mut frontier = self.frontier.clone();
        let mut prev = self.prev;
        let now = format_timestamp(OffsetDateTime::now_utc());
        let ts = if now > self.last_ts {
            now
        } else {
            self.last_ts.clone()
        };
        let path = self.path.clone();
        let map = |e: rusqlite::Error| map_sqlite(&e, &path);
        let tx = match lock {
            Lock::Take => BatchTransaction::begin(&self.conn).map_err(map)?,
            Lock::Held => BatchTransaction::adopt(&self.conn),
        };
        let mut appended = Vec::with_capacity(requests.len());
        {
            let mut insert = tx.prepare_cached(INSERT_EVENT).map_err(map)?;
            // The previous leaf hash in hex: the last event's `hash`, carried along.
            let mut prev_hex = crate::canonical::to_hex(prev);
            for events in requests {
                let mut out = Vec::with_capacity(events.len());
                for prepared in *events {
                    let seq = frontier.size() + 1;
                    let line = render(prepared, seq, &ts, &prev_hex);
                    let hash = leaf_hash(line.as_bytes());
                    let hash_hex = crate::canonical::to_hex(hash);
                    prev_hex.clear();
                    prev_hex.push_str(&hash_hex);
                    let id = event_id(seq);
                    insert
                        .execute(params![
                            seq as i64,
                            id,
                            prepared.event_type.as_str(),
                            prepared.run_id,
                            ts,
                            line,
                            hash_hex
                        ])
                        .map_err(map)?;
                    frontier.push(hash);
                    prev = hash;
                    out.push(Appended {
                        seq,
                        event_id: id,
                        hash: hash_hex,
                    });
                }
                appended.push(out);
            }
        }
        // INVARIANT: every commit carries a signed checkpoint over all of its events
        // (the signed head), so no acknowledged event is ever unsigned.
        let head = sign_head(self.signer.as_ref(), &self.origin, &frontier)?;
        tx.prepare_cached(UPSERT_HEAD)
            .and_then(|mut s| s.execute(params![head.size as i64, head.root, head.note]))
            .map_err(map)?;
        let note = if with_checkpoint {
            insert_checkpoint(&tx, &head, &ts, "events").map_err(map)?;
            Some((head.size, head.note))
        } else {
            None
        };
        tx.commit().map_err(map)?;
        Ok(Committed {
            appended,
            frontier,
            prev,
            last_ts: ts,
            note,
        })
    }

    /// Signs and stores a checkpoint over the current tree in its own transaction, then
    /// hands it to the WAL thread, which publishes it once the WAL holding it is synced.
    fn checkpoint_now(&mut self, reason: &str) -> Result<(), AuditError> {
        let path = self.path.clone();
        let map = |e: rusqlite::Error| map_sqlite(&e, &path);
        let ts = format_timestamp(OffsetDateTime::now_utc());
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map)?;
        let head = sign_head(self.signer.as_ref(), &self.origin, &self.frontier)?;
        insert_checkpoint(&tx, &head, &ts, reason).map_err(map)?;
        tx.commit().map_err(map)?;
        self.last_cp_size = head.size;
        self.last_cp_at = Instant::now();
        self.wal
            .publish(head.note, self.durability == Durability::Full);
        Ok(())
    }

    /// The interval elapsed: sign if events arrived since the last checkpoint (or
    /// always, with the idle heartbeat).
    fn timed_checkpoint(&mut self) {
        if self.segment_due()
            && let Err(error) = self.seal()
        {
            tracing::error!(error = %error, "cannot seal the audit segment");
        }
        if self.needs_segment {
            // Nothing more goes into a sealed segment.
            self.last_cp_at = Instant::now();
            return;
        }
        if self.frontier.size() > self.last_cp_size || self.idle_heartbeat {
            let reason = if self.frontier.size() > self.last_cp_size {
                "interval"
            } else {
                "heartbeat"
            };
            if let Err(e) = self.checkpoint_now(reason) {
                tracing::error!(error = %e, "cannot sign a timed audit checkpoint");
            }
        }
        self.last_cp_at = Instant::now();
    }

    /// Final checkpoint (if events arrived since the last one) and close the connection.
    fn shutdown(mut self) -> Result<(), AuditError> {
        let result = if self.frontier.size() > self.last_cp_size {
            self.checkpoint_now("close")
        } else {
            Ok(())
        };
        self.wal.stop();
        // Copy the whole WAL into the database and cut it to zero bytes, so a stopped
        // gateway leaves no WAL behind (readers may still hold connections, which keeps
        // SQLite from deleting it at close). Best effort: the WAL is valid either way.
        if let Err(e) = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        {
            tracing::warn!(error = %e, "cannot truncate the audit WAL at close");
        }
        let path = self.path.clone();
        let closed = self.conn.close().map_err(|(_, e)| map_sqlite(&e, &path));
        result.and(closed)
    }

    /// Whether the active segment is due for its seal: it holds an event and passed
    /// the size or age limit.
    fn segment_due(&self) -> bool {
        if self.needs_segment || self.frontier.size() <= self.start.size {
            return false;
        }
        let by_size = self.segment_max_bytes.is_some_and(|max| {
            let pages = |pragma: &str| {
                self.conn
                    .query_row(pragma, [], |r| r.get::<_, i64>(0))
                    .unwrap_or(0)
                    .max(0) as u64
            };
            pages("PRAGMA page_count").saturating_mul(pages("PRAGMA page_size")) >= max
        });
        let by_age = self.segment_max_age.is_some_and(|age| {
            let now = OffsetDateTime::now_utc().unix_timestamp();
            now.saturating_sub(self.start.opened_unix) >= age.as_secs() as i64
        });
        by_size || by_age
    }

    /// Seals the active segment: one transaction stores a signed checkpoint over its
    /// last event (reason `seal`) and its seal record; then the next segment is opened.
    fn seal(&mut self) -> Result<(), AuditError> {
        let path = self.path.clone();
        let map = |e: rusqlite::Error| map_sqlite(&e, &path);
        let ts = format_timestamp(OffsetDateTime::now_utc());
        let head = sign_head(self.signer.as_ref(), &self.origin, &self.frontier)?;
        let record = SealRecord {
            segment: self.start.segment,
            first_seq: self.start.size + 1,
            last_seq: head.size,
            last_hash: crate::canonical::to_hex(self.prev),
            root: head.root.clone(),
            frontier: self.frontier.nodes().iter().map(hex::encode).collect(),
            last_ts: self.last_ts.clone(),
            note: head.note.clone(),
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map)?;
        insert_checkpoint(&tx, &head, &ts, "seal").map_err(map)?;
        super::segments::write_seal(&tx, &record).map_err(map)?;
        tx.commit().map_err(map)?;
        self.last_cp_size = head.size;
        self.last_cp_at = Instant::now();
        self.wal
            .publish(head.note, self.durability == Durability::Full);
        self.needs_segment = true;
        tracing::info!(
            segment = record.segment,
            first_seq = record.first_seq,
            last_seq = record.last_seq,
            "audit segment sealed"
        );
        self.open_next_segment()
    }

    /// Creates the segment after the sealed active one and moves the writer and the WAL
    /// thread to it.
    fn open_next_segment(&mut self) -> Result<(), AuditError> {
        let number = self.start.segment + 1;
        let next = super::segments::segment_path(&self.base, number);
        let start = StartRecord {
            segment: number,
            size: self.frontier.size(),
            prev: crate::canonical::to_hex(self.prev),
            frontier: self.frontier.nodes().iter().map(hex::encode).collect(),
            last_ts: self.last_ts.clone(),
            opened_unix: OffsetDateTime::now_utc().unix_timestamp(),
        };
        if next.exists() {
            // A previous attempt created it and failed later: take it if it is
            // exactly the segment this one would create, still empty.
            let conn = store::open_reader(&next, self.busy_timeout)?;
            let found = super::segments::read_start(&conn, &next)?;
            let (count, _) = store::head(&conn, &next)?;
            let same = found.as_ref().is_some_and(|f| {
                f.segment == start.segment
                    && f.size == start.size
                    && f.prev == start.prev
                    && f.frontier == start.frontier
            });
            if !same || count > 0 {
                return Err(AuditError::Corrupt {
                    seq: 0,
                    what: format!(
                        "`{}` exists but is not the segment that continues this log",
                        next.display()
                    ),
                });
            }
        } else {
            super::segments::create(&next, &start, self.durability)?;
        }
        let conn =
            store::open_writer(&next, self.durability, self.busy_timeout, self.max_db_bytes)?;
        super::wal::configure_writer(&conn, &next)?;
        // The notes signed so far are published by the thread before it moves.
        self.wal.restart(&next)?;
        let old = std::mem::replace(&mut self.conn, conn);
        if let Err(e) = old.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "cannot truncate the sealed segment's WAL");
        }
        if let Err((_, e)) = old.close() {
            tracing::warn!(error = %e, "closing the sealed segment failed");
        }
        self.path = next;
        self.start = start;
        self.needs_segment = false;
        Ok(())
    }

    fn set_head(&self) {
        let value = (self.frontier.size() > 0)
            .then(|| (self.frontier.size(), crate::canonical::to_hex(self.prev)));
        *self.head.write().unwrap_or_else(|p| p.into_inner()) = value;
    }

    /// After a failed commit: make sure the in-memory chain matches the database (it
    /// should, the transaction rolled back); rebuild it from the database otherwise.
    fn reload(&mut self) {
        match store::head(&self.conn, &self.path) {
            Ok((count, last))
                if count + self.start.size == self.frontier.size()
                    && last.as_ref().map(|l| l.1.as_str())
                        == (count > 0)
                            .then(|| crate::canonical::to_hex(self.prev))
                            .as_deref() => {}
            Ok(_) => match store::load_state(&self.conn, &self.path, &[], &self.start) {
                Ok(state) => {
                    self.frontier = state.frontier;
                    self.prev = state.prev;
                    self.last_ts = state.last_ts;
                    self.set_head();
                }
                Err(e) => tracing::error!(error = %e, "cannot reload the audit chain state"),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the audit chain state after a failed commit")
            }
        }
    }
}

/// The writer thread: waits for requests without holding the writer (a quiet append
/// may take it meanwhile, see the module docs), then holds it while it gathers a
/// batch, commits it and answers it.
///
/// `wait`: how long until the first timed checkpoint. Each next wait is taken while the
/// writer is held, so the thread never takes it just to wait; a quiet commit can only
/// move the due time later, so a stale wait at worst wakes the thread early.
fn run_writer(cell: &Mutex<Option<Writer>>, receiver: Receiver<Request>, mut wait: Duration) {
    loop {
        let received = receiver.recv_timeout(wait);
        let mut guard = lock_writer(cell);
        let Some(writer) = guard.as_mut() else {
            return;
        };
        let close = match received {
            Ok(first) => writer.serve(first, &receiver),
            Err(RecvTimeoutError::Timeout) => {
                // A quiet append's commit may have signed a checkpoint meanwhile.
                if writer.until_checkpoint().is_zero() {
                    writer.timed_checkpoint();
                }
                None
            }
            Err(RecvTimeoutError::Disconnected) => {
                // Every handle is gone: shut down as `close` would.
                if let Some(writer) = guard.take()
                    && let Err(e) = writer.shutdown()
                {
                    tracing::error!(error = %e, "audit log shutdown failed");
                }
                return;
            }
        };
        if let Some(reply) = close {
            drop(receiver);
            let result = guard.take().map_or(Ok(()), Writer::shutdown);
            let _ = reply.send(result);
            return;
        }
        wait = writer.until_checkpoint();
    }
}

/// Takes the writer, waiting for its holder. If a holder panicked, the chain state is
/// still the last committed one (a batch is adopted only once committed), and it is
/// checked against the database again, as after a failed commit.
fn lock_writer(cell: &Mutex<Option<Writer>>) -> MutexGuard<'_, Option<Writer>> {
    match cell.lock() {
        Ok(guard) => guard,
        Err(poisoned) => {
            cell.clear_poison();
            let mut guard = poisoned.into_inner();
            if let Some(writer) = guard.as_mut() {
                writer.reload();
            }
            guard
        }
    }
}

/// An append in progress, counted for as long as it lives (also when the appending
/// future is dropped before its answer).
struct Appending<'a> {
    count: &'a AtomicUsize,
    /// Appends in progress when this one began.
    others: usize,
}

impl<'a> Appending<'a> {
    fn enter(count: &'a AtomicUsize) -> Appending<'a> {
        let others = count.fetch_add(1, Ordering::AcqRel);
        Appending { count, others }
    }
}

impl Drop for Appending<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A signed checkpoint over the tree as a commit stores it.
struct SignedHead {
    size: u64,
    /// The tree's root in hex, computed once per checkpoint (it takes one hash per
    /// level of the tree).
    root: String,
    note: String,
}

/// Signs a checkpoint over `frontier`. Fails closed when the signer cannot sign (the
/// batch is rolled back and its callers get the error).
fn sign_head(
    signer: &dyn Signer,
    origin: &str,
    frontier: &Frontier,
) -> Result<SignedHead, AuditError> {
    let checkpoint = Checkpoint {
        origin: origin.to_string(),
        size: frontier.size(),
        root: frontier.root(),
    };
    Ok(SignedHead {
        size: checkpoint.size,
        root: crate::canonical::to_hex(checkpoint.root),
        note: checkpoint.sign_with(signer)?,
    })
}

/// The transaction of a commit batch: rusqlite's `Transaction` parses its BEGIN and
/// COMMIT on every commit, here they are cached statements (a few microseconds on every
/// commit's path). Rolled back when dropped without a successful commit.
struct BatchTransaction<'c> {
    conn: &'c Connection,
}

/// Whether a commit takes the database's write lock (`BEGIN IMMEDIATE`, waiting up to
/// the busy timeout) or finds it held already (a quiet commit took it without waiting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lock {
    Take,
    Held,
}

impl<'c> BatchTransaction<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<BatchTransaction<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(BatchTransaction { conn })
    }

    /// The transaction the caller just began on `conn` (rolled back if dropped).
    fn adopt(conn: &'c Connection) -> BatchTransaction<'c> {
        BatchTransaction { conn }
    }

    fn commit(self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(())
    }
}

impl std::ops::Deref for BatchTransaction<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for BatchTransaction<'_> {
    fn drop(&mut self) {
        // Still inside the transaction: a statement or the COMMIT failed.
        if !self.conn.is_autocommit()
            && let Err(e) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::error!(error = %e, "cannot roll back a failed audit batch");
        }
    }
}

/// Inserts a signed checkpoint (the head just signed) as a checkpoint row.
fn insert_checkpoint(
    tx: &Connection,
    head: &SignedHead,
    ts: &str,
    reason: &str,
) -> rusqlite::Result<()> {
    tx.prepare_cached(INSERT_CHECKPOINT)?.execute(params![
        head.size as i64,
        head.root,
        head.note,
        ts,
        reason
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The names of the threads that committed each batch of `log`, in order.
    fn committing_threads(log: &AuditLog) -> Arc<Mutex<Vec<String>>> {
        let threads = Arc::new(Mutex::new(Vec::new()));
        let seen = threads.clone();
        log.observe_batches(Arc::new(move |_, _| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            seen.lock().unwrap().push(name);
        }));
        threads
    }

    /// Returns once the writer thread has let go of the writer: it answers a batch
    /// before it does, so an append right after that answer could find it still held
    /// (and rightly hand its events over).
    fn writer_released(log: &AuditLog) {
        drop(log.inner.writer.lock().unwrap());
    }

    /// A runtime on the test's own thread, so that a quiet commit runs there.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Signs with a key in this process but says it does not, as the socket signer.
    #[derive(Debug)]
    struct OutOfProcess(crate::audit::keys::SignerKey);

    impl Signer for OutOfProcess {
        fn verifier(&self) -> &VerifierKey {
            Signer::verifier(&self.0)
        }

        fn sign(&self, message: &[u8]) -> Result<[u8; 64], AuditError> {
            Ok(self.0.sign(message))
        }
    }

    /// An insider's process holds the database's write lock: a quiet append does not
    /// wait for it on its own thread but hands over to the writer thread, which waits
    /// up to the busy timeout and fails closed; once the lock is free, appends commit
    /// quietly again.
    #[test]
    fn a_quiet_append_never_waits_for_a_lock_another_process_holds() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = AuditOptions::new(dir.path());
        options.durability = Durability::Normal;
        options.busy_timeout = Duration::from_millis(50);
        let db = options.db_path.clone();
        let log = AuditLog::open(options).unwrap();
        let threads = committing_threads(&log);
        let runtime = runtime();
        let event = || NewEvent::new(crate::audit::EventType::ToolRequested);

        let holder = Connection::open(&db).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let refused = runtime.block_on(log.append(event()));
        assert!(
            matches!(refused, Err(AuditError::Locked { .. })),
            "{refused:?}"
        );
        assert_eq!(*threads.lock().unwrap(), ["audit-writer"]);

        holder.execute_batch("ROLLBACK").unwrap();
        writer_released(&log);
        let appended = runtime.block_on(log.append(event())).unwrap();
        assert_eq!(appended.seq, 1);
        let caller = std::thread::current().name().unwrap().to_string();
        assert_eq!(
            *threads.lock().unwrap(),
            ["audit-writer".to_string(), caller]
        );
        runtime.block_on(log.close()).unwrap();
    }

    /// A quiet commit never seals: the append that fills the segment returns at once,
    /// the next one goes to the writer thread, which commits it into the full segment
    /// and seals it before answering; the append after that is quiet again, in the new
    /// segment.
    #[test]
    fn a_quiet_commit_leaves_the_seal_to_the_writer_thread() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = AuditOptions::new(dir.path());
        options.durability = Durability::Normal;
        // Due for its seal as soon as it holds an event.
        options.segment_max_bytes = Some(1);
        let base = options.db_path.clone();
        let log = AuditLog::open(options).unwrap();
        let threads = committing_threads(&log);
        let runtime = runtime();
        let caller = std::thread::current().name().unwrap().to_string();
        let segments = || {
            crate::audit::segments::list_in(&base, Some(dir.path()))
                .unwrap()
                .len()
        };
        let mut expected = Vec::new();
        for (n, on, after) in [
            (1, caller.as_str(), 1),
            (2, "audit-writer", 2),
            (3, caller.as_str(), 2),
        ] {
            let event = NewEvent::new(crate::audit::EventType::ToolRequested);
            let appended = runtime.block_on(log.append(event)).unwrap();
            writer_released(&log);
            assert_eq!(appended.seq, n);
            expected.push(on.to_string());
            assert_eq!(*threads.lock().unwrap(), expected, "append {n}");
            assert_eq!(segments(), after, "segments after append {n}");
        }
        runtime.block_on(log.close()).unwrap();
    }

    /// An append dropped while it waits for the writer no longer counts as in
    /// progress, so it never keeps later appends from committing quietly.
    #[test]
    fn a_dropped_append_is_no_longer_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = AuditOptions::new(dir.path());
        options.durability = Durability::Full;
        options.busy_timeout = Duration::from_secs(60);
        let db = options.db_path.clone();
        let log = AuditLog::open(options).unwrap();
        let runtime = runtime();
        // The writer cannot commit while another connection holds the write lock.
        let holder = Connection::open(&db).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let event = NewEvent::new(crate::audit::EventType::ToolRequested);
        // Polled once (the events go to the writer thread), then dropped.
        let waited = runtime
            .block_on(async { tokio::time::timeout(Duration::ZERO, log.append(event)).await });
        assert!(waited.is_err(), "{waited:?}");
        assert_eq!(log.inner.appenders.load(Ordering::Acquire), 0);
        holder.execute_batch("ROLLBACK").unwrap();
        runtime.block_on(log.close()).unwrap();
    }

    /// Which thread commits an append (module docs, "Quiet commits"): the appending
    /// one only with NORMAL durability, an in-process signer and no other append in
    /// progress; every other append is handed to the writer thread.
    #[test]
    fn only_a_quiet_append_commits_on_its_own_thread() {
        let cases = [
            // (durability, in-process signer, other appends in progress, on the caller)
            (Durability::Normal, true, 0, true),
            (Durability::Normal, true, 1, false),
            (Durability::Normal, true, 3, false),
            (Durability::Normal, false, 0, false),
            (Durability::Full, true, 0, false),
            (Durability::Full, false, 0, false),
        ];
        let caller = std::thread::current().name().unwrap().to_string();
        let runtime = runtime();
        for (durability, in_process, others, on_caller) in cases {
            let case = format!("{durability:?}, in process {in_process}, others {others}");
            let dir = tempfile::tempdir().unwrap();
            let mut options = AuditOptions::new(dir.path());
            options.durability = durability;
            if !in_process {
                let key =
                    crate::audit::keys::SignerKey::from_seed(&options.origin, [7; 32]).unwrap();
                options.signer = Some(Arc::new(OutOfProcess(key)));
            }
            let log = AuditLog::open(options).unwrap();
            let threads = committing_threads(&log);
            log.inner.appenders.fetch_add(others, Ordering::AcqRel);
            for n in 1..=3u64 {
                let mut event = NewEvent::new(crate::audit::EventType::ToolRequested);
                event.call_id = Some(format!("call-{n}"));
                let appended = runtime.block_on(log.append(event)).unwrap();
                assert_eq!(appended.seq, n, "{case}");
            }
            log.inner.appenders.fetch_sub(others, Ordering::AcqRel);
            let expected = if on_caller { &caller } else { "audit-writer" };
            assert_eq!(*threads.lock().unwrap(), [expected; 3], "{case}");
            // No append left counted as in progress.
            assert_eq!(log.inner.appenders.load(Ordering::Acquire), 0, "{case}");
            runtime.block_on(log.close()).unwrap();
            let events = read_segment_events(&dir.path().join("audit.db"), &EventFilter::default());
            assert_eq!(events.unwrap().len(), 3, "{case}");
        }
    }

    /// Events with these timestamps from seq `first` on (seq `skip` left out, as a
    /// database may have a gap).
    fn events(first: i64, skip: i64, stamps: &[&str]) -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, event_id TEXT NOT NULL,
             type TEXT NOT NULL, run_id TEXT, ts TEXT NOT NULL, line TEXT NOT NULL,
             hash TEXT NOT NULL)",
        )
        .unwrap();
        for (i, ts) in stamps.iter().enumerate() {
            let seq = first + i as i64;
            if seq != skip {
                conn.execute(
                    "INSERT INTO events VALUES (?1, 'e', 'tool_requested', 'r', ?2, ?3, 'h')",
                    params![seq, ts, format!("{{\"seq\":{seq}}}")],
                )
                .unwrap();
            }
        }
        conn
    }

    /// A batch's transaction commits what it wrote; one dropped after a failed
    /// statement (or never committed) leaves nothing behind and the connection ready for
    /// the next batch.
    #[test]
    fn a_batch_transaction_commits_or_rolls_back_whole() {
        let conn = events(1, 0, &["2026-11-24T10:00:00.000Z"]);
        let insert = |conn: &Connection, seq: i64| {
            conn.execute(
                "INSERT INTO events VALUES (?1, 'e', 'tool_requested', 'r', 't', 'l', 'h')",
                params![seq],
            )
        };
        let count = |conn: &Connection| -> i64 {
            conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
                .unwrap()
        };
        {
            let tx = BatchTransaction::begin(&conn).unwrap();
            insert(&tx, 2).unwrap();
            // seq 1 exists: the batch's second statement fails, as a write can.
            assert!(insert(&tx, 1).is_err());
        }
        assert!(conn.is_autocommit());
        assert_eq!(count(&conn), 1);
        let tx = BatchTransaction::begin(&conn).unwrap();
        insert(&tx, 2).unwrap();
        insert(&tx, 3).unwrap();
        tx.commit().unwrap();
        assert!(conn.is_autocommit());
        assert_eq!(count(&conn), 3);
    }

    /// A database with the writer's schema and events of these types, seq 1 on.
    fn typed_events(dir: &Path, types: &[crate::audit::EventType]) -> Connection {
        let path = dir.join("audit.db");
        let conn =
            store::open_writer(&path, Durability::Normal, Duration::from_secs(1), None).unwrap();
        for (i, t) in types.iter().enumerate() {
            let seq = i as i64 + 1;
            conn.execute(
                INSERT_EVENT,
                params![
                    seq,
                    event_id(seq as u64),
                    t.as_str(),
                    "r",
                    "2026-11-24T10:00:00.000Z",
                    format!("{{\"seq\":{seq}}}"),
                    "h"
                ],
            )
            .unwrap();
        }
        conn
    }

    fn plan(conn: &Connection, filter: &EventFilter) -> String {
        let (sql, args) = events_query(conn, filter).unwrap();
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
            .unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
    }

    /// The type index leaves out the two events of every call; a query on other types
    /// uses it, one on those two scans along seq, and both return what a scan returns.
    #[test]
    fn the_partial_type_index_serves_the_rarer_types_and_every_filter_is_exact() {
        use crate::audit::EventType::*;
        let dir = tempfile::tempdir().unwrap();
        let mut types = Vec::new();
        for i in 0..40 {
            types.extend([ToolRequested, ToolExecuted]);
            if i % 7 == 0 {
                types.extend([ApprovalGranted, ToolRequested, ToolDenied]);
            }
            if i % 11 == 0 {
                types.push(SafetyLockEngaged);
            }
        }
        let conn = typed_events(dir.path(), &types);
        let filters: [&[crate::audit::EventType]; 6] = [
            &[ApprovalGranted],
            &[SafetyLockEngaged, SafetyLockReleased],
            &[ToolDenied],
            &[ToolExecuted],
            &[ToolRequested, ToolDenied],
            &[],
        ];
        for wanted in filters {
            let filter = EventFilter {
                event_types: wanted.to_vec(),
                ..EventFilter::default()
            };
            let got: Vec<u64> = read_events(&conn, Path::new("audit.db"), &filter)
                .unwrap()
                .iter()
                .map(|e| e.seq)
                .collect();
            let scan: Vec<u64> = (1..=types.len() as u64)
                .filter(|&seq| wanted.is_empty() || wanted.contains(&types[seq as usize - 1]))
                .collect();
            assert_eq!(got, scan, "{wanted:?}");
            let plan = plan(&conn, &filter);
            let indexed =
                !wanted.is_empty() && !wanted.iter().any(|t| store::UNINDEXED_TYPES.contains(t));
            assert_eq!(
                plan.contains("events_type_rare"),
                indexed,
                "{wanted:?}: {plan}"
            );
        }
        // The schema's index condition is the term the queries repeat.
        let index_sql: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'events_type_rare'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(
            index_sql.ends_with(&format!("WHERE {}", store::UNINDEXED_TYPES_TERM)),
            "{index_sql}"
        );
        for t in store::UNINDEXED_TYPES {
            assert!(store::UNINDEXED_TYPES_TERM.contains(&format!("'{}'", t.as_str())));
        }
    }

    /// A database written before the partial index gets it (and loses the full one)
    /// when the writer opens it.
    #[test]
    fn an_older_database_gets_the_partial_type_index() {
        let dir = tempfile::tempdir().unwrap();
        let conn = typed_events(
            dir.path(),
            &[
                crate::audit::EventType::ToolRequested,
                crate::audit::EventType::RunCreated,
            ],
        );
        conn.execute_batch(
            "DROP INDEX events_type_rare; CREATE INDEX events_type ON events (type);",
        )
        .unwrap();
        drop(conn);
        let path = dir.path().join("audit.db");
        let conn =
            store::open_writer(&path, Durability::Normal, Duration::from_secs(1), None).unwrap();
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' ORDER BY name")
            .unwrap();
        let names: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(names, ["events_run_id", "events_type_rare"]);
    }

    fn time(ts: &str) -> OffsetDateTime {
        OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).unwrap()
    }

    /// The seq bound of every instant, on and between the stored ones, is where a scan
    /// of the timestamps would put it, and a time window returns what a scan returns.
    #[test]
    fn time_bounds_found_by_binary_search_match_a_scan() {
        let stamps = [
            "2026-11-24T10:00:00.000Z",
            "2026-11-24T10:00:00.000Z",
            "2026-11-24T10:00:01.000Z",
            "2026-11-24T10:00:02.500Z",
            "2026-11-24T10:00:02.500Z",
            "2026-11-24T10:00:02.500Z",
            "2026-11-24T10:00:07.000Z",
            "2026-11-24T10:01:00.000Z",
        ];
        let probes = [
            "2026-11-24T09:59:59.000Z",
            "2026-11-24T10:00:00.000Z",
            "2026-11-24T10:00:00.500Z",
            "2026-11-24T10:00:01.000Z",
            "2026-11-24T10:00:02.500Z",
            "2026-11-24T10:00:03.000Z",
            "2026-11-24T10:00:07.000Z",
            "2026-11-24T10:01:00.000Z",
            "2026-11-24T10:02:00.000Z",
        ];
        for (first, skip) in [(1, 0), (100, 0), (100, 103), (1, 1)] {
            let conn = events(first, skip, &stamps);
            let stored: Vec<(i64, &str)> = stamps
                .iter()
                .enumerate()
                .map(|(i, ts)| (first + i as i64, *ts))
                .filter(|(seq, _)| *seq != skip)
                .collect();
            for probe in probes {
                // The same split of the stored events (a bound on a missing seq is
                // as good as the next stored one).
                let bound = seq_bound(&conn, probe).unwrap();
                let below: Vec<bool> = stored.iter().map(|(seq, _)| *seq < bound).collect();
                let earlier: Vec<bool> = stored.iter().map(|(_, ts)| *ts < probe).collect();
                assert_eq!(below, earlier, "{first} {skip} {probe}");
            }
            for since in probes {
                for until in probes {
                    let filter = EventFilter {
                        since: Some(time(since)),
                        until: Some(time(until)),
                        ..Default::default()
                    };
                    let got: Vec<i64> = read_events(&conn, Path::new("t"), &filter)
                        .unwrap()
                        .iter()
                        .map(|e| e.seq as i64)
                        .collect();
                    let want: Vec<i64> = stored
                        .iter()
                        .filter(|(_, ts)| *ts >= since && *ts < until)
                        .map(|(seq, _)| *seq)
                        .collect();
                    assert_eq!(got, want, "{first} {skip} {since}..{until}");
                }
            }
        }
        assert_eq!(seq_bound(&events(1, 0, &[]), probes[0]).unwrap(), 0);
    }

    /// A row whose timestamp was edited out of order may be missed by a window, but
    /// an event outside the window is never returned.
    #[test]
    fn a_timestamp_out_of_order_is_never_returned_outside_the_window() {
        let conn = events(
            1,
            0,
            &[
                "2026-11-24T10:00:00.000Z",
                "2026-11-24T12:00:00.000Z",
                "2026-11-24T10:00:02.000Z",
                "2026-11-24T10:00:03.000Z",
            ],
        );
        for (since, until) in [
            ("2026-11-24T10:00:01.000Z", "2026-11-24T10:00:04.000Z"),
            ("2026-11-24T11:00:00.000Z", "2026-11-24T13:00:00.000Z"),
            ("2026-11-24T09:00:00.000Z", "2026-11-24T11:00:00.000Z"),
        ] {
            let filter = EventFilter {
                since: Some(time(since)),
                until: Some(time(until)),
                ..Default::default()
            };
            for event in read_events(&conn, Path::new("t"), &filter).unwrap() {
                let ts = event.value["seq"].as_i64().unwrap();
                let stored: String = conn
                    .query_row("SELECT ts FROM events WHERE seq = ?1", [ts], |r| r.get(0))
                    .unwrap();
                assert!(
                    stored.as_str() >= since && stored.as_str() < until,
                    "{stored}"
                );
            }
        }
    }
}
