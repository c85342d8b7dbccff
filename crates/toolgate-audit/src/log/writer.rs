//! The writer: the state the writer thread (or a quiet appender) holds, its group
//! commit, the checkpoints it signs and the segments it seals.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior, params};
use time::OffsetDateTime;
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::handle::{BatchObserver, MAX_BATCH_EVENTS};
use crate::checkpoint::Checkpoint;
use crate::line::{Prepared, event_id, format_timestamp, render};
use crate::merkle::{Frontier, Hash, leaf_hash};
use crate::segments::{SealRecord, StartRecord};
use crate::signer::Signer;
use crate::store::{self, INSERT_CHECKPOINT, INSERT_EVENT, UPSERT_HEAD, map_sqlite};
use crate::wal::WalCheckpointer;
use crate::{Appended, AuditError, Durability};

pub(super) type Reply<T> = oneshot::Sender<Result<T, AuditError>>;

pub(super) enum Request {
    Append {
        events: Vec<Prepared>,
        reply: Reply<Vec<Appended>>,
        _permit: OwnedSemaphorePermit,
    },
    Close {
        reply: Reply<()>,
    },
}

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) path: PathBuf,
    pub(super) durability: Durability,
    /// The tree over every committed event.
    pub(super) frontier: Frontier,
    /// The leaf hash of the last committed event (zeros for an empty log).
    pub(super) prev: Hash,
    /// The newest timestamp written; timestamps never go backwards along seq.
    pub(super) last_ts: String,
    pub(super) signer: Arc<dyn Signer>,
    pub(super) origin: String,
    pub(super) every: u64,
    pub(super) interval: Duration,
    pub(super) idle_heartbeat: bool,
    /// Size of the newest checkpoint, and when the writer last considered one.
    pub(super) last_cp_size: u64,
    pub(super) last_cp_at: Instant,
    pub(super) head: Arc<RwLock<Option<(u64, String)>>>,
    /// Events in the previous commit, how long it took and when it ended (adaptive
    /// group commit, see `should_linger`).
    pub(super) last_batch: usize,
    pub(super) last_commit: Duration,
    pub(super) last_commit_end: Instant,
    pub(super) linger_until: Instant,
    /// How many events the batch being gathered waits for (see `should_linger`).
    pub(super) linger_target: usize,
    /// See [`BatchObserver`].
    pub(super) batch_observer: Arc<OnceLock<BatchObserver>>,
    /// Copies the WAL into the database off this thread (see `wal.rs`).
    pub(super) wal: WalCheckpointer,
    /// The first segment's path; `path` is the active segment's.
    pub(super) base: PathBuf,
    /// The active segment's start record.
    pub(super) start: StartRecord,
    /// The active segment is sealed and the next could not be opened yet: every
    /// commit tries again first and fails closed until it can.
    pub(super) needs_segment: bool,
    pub(super) segment_max_bytes: Option<u64>,
    pub(super) segment_max_age: Option<Duration>,
    pub(super) max_db_bytes: Option<u64>,
    pub(super) busy_timeout: Duration,
    /// Held for the writer's life: one writer per log.
    pub(super) _lock: std::fs::File,
}

/// A request arriving this soon after a commit belongs to a busy streak.
pub(super) const BUSY_STREAK: Duration = Duration::from_millis(2);
/// Bounds of the wait for more requests in a busy streak (the previous commit's
/// duration, clamped): a little latency buys far fewer fsyncs per event.
pub(super) const MIN_LINGER: Duration = Duration::from_micros(100);
pub(super) const MAX_LINGER: Duration = Duration::from_millis(1);
/// A batch of at least this many events means many appenders are waiting (8 clients
/// never make one: each has at most one event in flight). The next batch then aims
/// for twice as many, for up to [`CROWDED_LINGER_FACTOR`] commit times (still at most
/// [`MAX_LINGER`]): every commit's own cost (the signature, the index and head pages
/// written to the WAL) is shared by more events, which with NORMAL durability (a
/// commit of a fraction of a millisecond) otherwise carried about 8 (issue 19).
pub(super) const CROWDED_BATCH: usize = 10;
pub(super) const CROWDED_LINGER_FACTOR: u32 = 4;
pub(super) const MAX_CROWDED_TARGET: usize = 256;
/// In a crowded streak the writer sleeps in slices this long while it lingers.
pub(super) const LINGER_SLICE: Duration = Duration::from_micros(100);

/// The outcome of one committed batch.
pub(super) struct Committed {
    appended: Vec<Vec<Appended>>,
    frontier: Frontier,
    prev: Hash,
    last_ts: String,
    note: Option<(u64, String)>,
}

impl Writer {
    /// How long until the next timed checkpoint is due (zero: due now).
    pub(super) fn until_checkpoint(&self) -> Duration {
        (self.last_cp_at + self.interval).saturating_duration_since(Instant::now())
    }

    /// Gathers a batch starting with `first` (and whatever else is queued, lingering
    /// in a busy streak), commits it and answers it. Returns the reply of a `Close`
    /// met on the way, which the caller carries out.
    pub(super) fn serve(
        &mut self,
        first: Request,
        receiver: &Receiver<Request>,
    ) -> Option<Reply<()>> {
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
                crate::wal::checkpoint_between_commits(&self.conn, &self.path, self.wal.state());
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
    pub(super) fn should_linger(&self, count: usize) -> bool {
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
    pub(super) fn commit_quietly(
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
    pub(super) fn commit_timed(
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
    pub(super) fn commit(
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
    pub(super) fn write_batch(
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
    pub(super) fn checkpoint_now(&mut self, reason: &str) -> Result<(), AuditError> {
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
    pub(super) fn timed_checkpoint(&mut self) {
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
    pub(super) fn shutdown(mut self) -> Result<(), AuditError> {
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
    pub(super) fn segment_due(&self) -> bool {
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
    pub(super) fn seal(&mut self) -> Result<(), AuditError> {
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
        crate::segments::write_seal(&tx, &record).map_err(map)?;
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
    pub(super) fn open_next_segment(&mut self) -> Result<(), AuditError> {
        let number = self.start.segment + 1;
        let next = crate::segments::segment_path(&self.base, number);
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
            let found = crate::segments::read_start(&conn, &next)?;
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
            crate::segments::create(&next, &start, self.durability)?;
        }
        let conn =
            store::open_writer(&next, self.durability, self.busy_timeout, self.max_db_bytes)?;
        crate::wal::configure_writer(&conn, &next)?;
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

    pub(super) fn set_head(&self) {
        let value = (self.frontier.size() > 0)
            .then(|| (self.frontier.size(), crate::canonical::to_hex(self.prev)));
        *self.head.write().unwrap_or_else(|p| p.into_inner()) = value;
    }

    /// After a failed commit: make sure the in-memory chain matches the database (it
    /// should, the transaction rolled back); rebuild it from the database otherwise.
    pub(super) fn reload(&mut self) {
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
pub(super) fn run_writer(
    cell: &Mutex<Option<Writer>>,
    receiver: Receiver<Request>,
    mut wait: Duration,
) {
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
pub(super) fn lock_writer(cell: &Mutex<Option<Writer>>) -> MutexGuard<'_, Option<Writer>> {
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

/// A signed checkpoint over the tree as a commit stores it.
pub(super) struct SignedHead {
    size: u64,
    /// The tree's root in hex, computed once per checkpoint (it takes one hash per
    /// level of the tree).
    root: String,
    note: String,
}

/// Signs a checkpoint over `frontier`. Fails closed when the signer cannot sign (the
/// batch is rolled back and its callers get the error).
pub(super) fn sign_head(
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
pub(super) struct BatchTransaction<'c> {
    conn: &'c Connection,
}

/// Whether a commit takes the database's write lock (`BEGIN IMMEDIATE`, waiting up to
/// the busy timeout) or finds it held already (a quiet commit took it without waiting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lock {
    Take,
    Held,
}

impl<'c> BatchTransaction<'c> {
    pub(super) fn begin(conn: &'c Connection) -> rusqlite::Result<BatchTransaction<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(BatchTransaction { conn })
    }

    /// The transaction the caller just began on `conn` (rolled back if dropped).
    pub(super) fn adopt(conn: &'c Connection) -> BatchTransaction<'c> {
        BatchTransaction { conn }
    }

    pub(super) fn commit(self) -> rusqlite::Result<()> {
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
pub(super) fn insert_checkpoint(
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

    /// A batch's transaction commits what it wrote; one dropped after a failed
    /// statement (or never committed) leaves nothing behind and the connection ready for
    /// the next batch.
    #[test]
    fn a_batch_transaction_commits_or_rolls_back_whole() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, event_id TEXT NOT NULL,
             type TEXT NOT NULL, run_id TEXT, ts TEXT NOT NULL, line TEXT NOT NULL,
             hash TEXT NOT NULL);
             INSERT INTO events VALUES (1, 'e', 'tool_requested', 'r', 't', 'l', 'h');",
        )
        .unwrap();
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
}
