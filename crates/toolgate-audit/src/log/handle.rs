//! [`AuditLog`]: the handle the gateway appends through and reads from.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use time::OffsetDateTime;
use tokio::sync::{Semaphore, TryAcquireError, oneshot};

use super::reader::read_segment_events;
use super::writer::{Request, Writer, run_writer};
use crate::checkpoint::verify_note;
use crate::keys::{Keys, VerifierKey, valid_key_name};
use crate::line::{Prepared, prepare};
use crate::signer::Signer;
use crate::sink::Sinks;
use crate::store::{self, map_sqlite};
use crate::wal::WalCheckpointer;
use crate::{
    Appended, ArgumentCommitment, AuditError, AuditOptions, Durability, EventFilter, NewEvent,
    StoredEvent, hmac_sha256_hex,
};

/// The most events one transaction takes.
pub const MAX_BATCH_EVENTS: usize = 1024;
/// The most events one `append_all` may carry.
pub const MAX_REQUEST_EVENTS: usize = 4096;
/// The most events waiting for the writer; appenders beyond wait for room.
const MAX_QUEUED_EVENTS: usize = 65_536;

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
    wal_state: Arc<crate::wal::WalState>,
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
            if let crate::CheckpointSink::File { path: file } = sink
                && let Some(note) = crate::sink::newest_note(file)?
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
            options.webhooks.as_deref(),
        )?;
        let wal_state = Arc::new(crate::wal::WalState::default());
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
    ) -> Result<crate::evidence::RunEvidence, AuditError> {
        let reader = self.inner.reader.clone();
        let path = self.inner.db_path.clone();
        let key = self.inner.verifier.clone();
        let run_id = run_id.to_string();
        tokio::task::spawn_blocking(move || {
            let _one = reader.lock().unwrap_or_else(|p| p.into_inner());
            crate::evidence::run_evidence(&path, &key, &run_id, after_seq, limit)
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
    ) -> Result<crate::evidence::Bundle, crate::evidence::BundleError> {
        let reader = self.inner.reader.clone();
        let path = self.inner.db_path.clone();
        let key_dir = self.inner.key_dir.clone();
        let signer = self.inner.signer.clone();
        let run_id = run_id.to_string();
        let work_dir = work_root.join(format!("bundle-{}", uuid::Uuid::new_v4()));
        tokio::task::spawn_blocking(move || {
            let _one = reader.lock().unwrap_or_else(|p| p.into_inner());
            crate::evidence::run_bundle(&path, &key_dir, signer, &run_id, &work_dir, max_bytes)
        })
        .await
        .map_err(|_| {
            crate::evidence::BundleError::Export(crate::export::ExportError::Audit(
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
) -> Result<(Connection, PathBuf, crate::segments::StartRecord), AuditError> {
    use crate::segments::{self, StartRecord};
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
        crate::wal::configure_writer(&conn, &next)?;
        return Ok((conn, next, start));
    }
    crate::wal::configure_writer(&conn, &path)?;
    Ok((conn, path, start))
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
    struct OutOfProcess(crate::keys::SignerKey);

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
        let event = || NewEvent::new(crate::EventType::ToolRequested);

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
            crate::segments::list_in(&base, Some(dir.path()))
                .unwrap()
                .len()
        };
        let mut expected = Vec::new();
        for (n, on, after) in [
            (1, caller.as_str(), 1),
            (2, "audit-writer", 2),
            (3, caller.as_str(), 2),
        ] {
            let event = NewEvent::new(crate::EventType::ToolRequested);
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
        let event = NewEvent::new(crate::EventType::ToolRequested);
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
                let key = crate::keys::SignerKey::from_seed(&options.origin, [7; 32]).unwrap();
                options.signer = Some(Arc::new(OutOfProcess(key)));
            }
            let log = AuditLog::open(options).unwrap();
            let threads = committing_threads(&log);
            log.inner.appenders.fetch_add(others, Ordering::AcqRel);
            for n in 1..=3u64 {
                let mut event = NewEvent::new(crate::EventType::ToolRequested);
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
}
