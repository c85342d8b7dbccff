//! The WAL thread: copies committed pages from SQLite's write-ahead log into the
//! database file on its own thread and connection, so the audit writer never does it
//! inside a commit; and publishes signed checkpoints to their sinks once the WAL that
//! holds them is synced, so the writer never waits for those syncs either.
//!
//! SQLite's automatic checkpoint runs in the connection that commits, after the commit
//! that crossed 1,000 WAL pages: the writer (and every call waiting on its next batch)
//! stalled for the copy and its syncs, which set the p99 latency (docs/performance.md).
//! Here the writer runs with `wal_autocheckpoint = 0` and this thread runs a PASSIVE
//! checkpoint every [`INTERVAL`]: PASSIVE never waits for the writer or for readers and
//! never blocks them; it copies what it can and the rest waits for the next round.
//! (Not to be confused with the audit log's signed checkpoints, `checkpoint.rs`.)
//!
//! Keeping the WAL bounded under sustained load: PASSIVE rounds copy frames while the
//! writer appends more, so the WAL is never fully copied at a moment when nobody
//! writes, and SQLite never starts it over from its beginning. Once the frames in the
//! WAL pass [`WAL_RESTART_BYTES`], this thread copies back to back until only a few
//! are left and then asks the writer ([`WalCheckpointer::restart_wanted`]) to run one
//! PASSIVE checkpoint itself between two commits ([`checkpoint_between_commits`]):
//! nothing appends during it, so it copies the rest, and the writer's next commit
//! starts the WAL over. The pause is one small copy, not a lock held for a truncation
//! (the TRUNCATE checkpoint this replaced set the 64-client p99 and cost a quarter to
//! a half of the throughput, docs/performance.md). A TRUNCATE stays as the fallback
//! past [`WAL_TRUNCATE_BYTES`], for a WAL that a long reader keeps from starting over.
//!
//! INVARIANT: a checkpoint only copies committed frames; it never changes what the log
//! says, and a crash at any point leaves SQLite's own recovery to do the rest.
//! INVARIANT: a signed note leaves the process only after every event under it is on
//! disk (committed with `synchronous=FULL`, or the WAL fsynced here first); notes are
//! published in the order they were signed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::sink::{HEAD_INTERVAL, Sinks};
use super::store::map_sqlite;
use super::{AuditError, Durability};

/// How often the checkpointer copies the WAL into the database.
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);

/// Once the WAL is reset (fully copied, no reader on it), SQLite truncates the file back
/// to this many bytes, so a burst does not leave a large file behind.
pub(crate) const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// A signed note to publish; `synced` when the commit that stored it was already synced.
struct Publish {
    note: String,
    synced: bool,
}

/// What the WAL thread and the writer share to keep the WAL bounded (module docs).
#[derive(Debug, Default)]
pub struct WalState {
    /// Set by the WAL thread when the writer should run its between-commits checkpoint.
    restart_wanted: AtomicBool,
    /// Checkpoints the writer ran between commits that copied every frame (the WAL
    /// starts over at its next commit unless a reader still uses the old frames).
    pub(crate) restarts: AtomicU64,
    /// TRUNCATE checkpoints the WAL thread ran to the end (the fallback).
    pub(crate) truncations: AtomicU64,
}

/// The running WAL thread; [`WalCheckpointer::stop`] ends it after it has published
/// every note sent and run a last checkpoint.
pub(crate) struct WalCheckpointer {
    sender: Option<Sender<Publish>>,
    /// Gives the sinks back when it ends (see [`WalCheckpointer::restart`]).
    thread: Option<JoinHandle<Sinks>>,
    path: PathBuf,
    durability: Durability,
    state: Arc<WalState>,
}

impl WalCheckpointer {
    /// Opens its own connection to `path` and starts the thread, which owns the sinks.
    pub(crate) fn start(
        path: &Path,
        durability: Durability,
        sinks: Sinks,
        state: Arc<WalState>,
    ) -> Result<Self, AuditError> {
        let conn = open(path, durability)?;
        Self::spawn(conn, path, durability, sinks, state)
    }

    /// Whether the writer should run [`checkpoint_between_commits`] now.
    pub(crate) fn restart_wanted(&self) -> bool {
        self.state.restart_wanted.load(Ordering::Relaxed)
    }

    /// The state shared with the writer (counters for tests and operators).
    pub(crate) fn state(&self) -> &Arc<WalState> {
        &self.state
    }

    /// Moves the thread to the database at `path` (a new audit segment): publishes
    /// what was sent, stops, and starts again there with the same sinks. If `path`
    /// cannot be opened, it goes on with the old database and returns the error.
    pub(crate) fn restart(&mut self, path: &Path) -> Result<(), AuditError> {
        let Some(sinks) = self.stop() else {
            return Err(AuditError::Closed);
        };
        let (conn, result, target) = match open(path, self.durability) {
            Ok(conn) => (conn, Ok(()), path.to_path_buf()),
            Err(e) => (
                open(&self.path, self.durability)?,
                Err(e),
                self.path.clone(),
            ),
        };
        let state = self.state.clone();
        state.restart_wanted.store(false, Ordering::Relaxed);
        *self = Self::spawn(conn, &target, self.durability, sinks, state)?;
        result
    }

    fn spawn(
        conn: Connection,
        path: &Path,
        durability: Durability,
        mut sinks: Sinks,
        state: Arc<WalState>,
    ) -> Result<Self, AuditError> {
        let (sender, received) = mpsc::channel::<Publish>();
        let owned: PathBuf = path.to_path_buf();
        let shared = state.clone();
        let thread = std::thread::Builder::new()
            .name("audit-wal".into())
            .spawn(move || {
                let mut next_round = Instant::now() + INTERVAL;
                let mut next_head = Instant::now();
                loop {
                    let wait = next_round.saturating_duration_since(Instant::now());
                    match received.recv_timeout(wait) {
                        Ok(publish) => {
                            if publish.synced || sync_wal(&owned) {
                                sinks.publish(&publish.note);
                            }
                            // A steady stream of notes must not starve the rounds.
                            if Instant::now() < next_round {
                                continue;
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        // Stopped: every note sent before has been received.
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                    checkpoint(&conn, &owned, &shared, LIMITS);
                    if Instant::now() >= next_head {
                        offer_head(&conn, &owned, durability, &mut sinks);
                        next_head = Instant::now() + HEAD_INTERVAL;
                    }
                    next_round = Instant::now() + INTERVAL;
                }
                checkpoint(&conn, &owned, &shared, LIMITS);
                if let Err((_, e)) = conn.close() {
                    tracing::warn!(error = %e, "closing the WAL thread's connection failed");
                }
                sinks
            })
            .map_err(|e| AuditError::Io {
                path: path.to_path_buf(),
                what: format!("cannot start the audit WAL thread: {e}"),
            })?;
        Ok(WalCheckpointer {
            sender: Some(sender),
            thread: Some(thread),
            path: path.to_path_buf(),
            durability,
            state,
        })
    }

    /// Hands a signed note over for publication (after a sync of the WAL unless
    /// `synced`).
    pub(crate) fn publish(&self, note: String, synced: bool) {
        if let Some(sender) = &self.sender
            && sender.send(Publish { note, synced }).is_err()
        {
            tracing::error!("the audit WAL thread stopped; a checkpoint was not published");
        }
    }

    /// Publishes what was sent, runs a last round and waits for the thread to close
    /// its connection.
    pub(crate) fn stop(&mut self) -> Option<Sinks> {
        self.sender.take();
        self.thread.take().and_then(|thread| thread.join().ok())
    }
}

impl Drop for WalCheckpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Hands the signed head of the newest commit (the `signed_head` row) to the remote
/// sinks when they lack it; under NORMAL durability only after a sync of the WAL, so the
/// events under it are on disk before it leaves the process.
fn offer_head(conn: &Connection, db: &Path, durability: Durability, sinks: &mut Sinks) {
    if !sinks.has_remote() {
        return;
    }
    let head = conn
        .query_row("SELECT size, note FROM signed_head", [], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })
        .optional();
    match head {
        Ok(Some((size, note))) => {
            let size = u64::try_from(size).unwrap_or(0);
            if sinks.wants_head(size) && (durability == Durability::Full || sync_wal(db)) {
                sinks.publish_head(size, &note);
            }
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %map_sqlite(&e, db), "cannot read the signed head for the checkpoint sinks")
        }
    }
}

/// fsyncs the WAL file (any descriptor of a file flushes the file). A missing WAL means
/// every frame was checkpointed into the database, which the checkpoint synced.
fn sync_wal(db: &Path) -> bool {
    let mut name = OsString::from(db.as_os_str());
    name.push("-wal");
    let wal = PathBuf::from(name);
    let synced = match std::fs::File::open(&wal) {
        Ok(file) => file.sync_all(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    match synced {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(path = %wal.display(), error = %e, "cannot sync the audit WAL; the checkpoint is stored but not published");
            false
        }
    }
}

/// fdatasyncs the database file. Syncing is always safe: it only makes what the
/// checkpoint rounds wrote durable sooner.
fn sync_database(db: &Path) -> bool {
    match std::fs::File::open(db).and_then(|file| file.sync_data()) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(path = %db.display(), error = %e, "cannot sync the audit database before the WAL starts over; trying again next round");
            false
        }
    }
}

/// Sets up the writer's connection for an outside checkpointer.
pub(crate) fn configure_writer(conn: &Connection, path: &Path) -> Result<(), AuditError> {
    let map = |e: rusqlite::Error| map_sqlite(&e, path);
    let _: i64 = conn
        .query_row("PRAGMA wal_autocheckpoint = 0", [], |r| r.get(0))
        .map_err(map)?;
    let _: i64 = conn
        .query_row(
            &format!("PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}"),
            [],
            |r| r.get(0),
        )
        .map_err(map)?;
    Ok(())
}

fn open(path: &Path, durability: Durability) -> Result<Connection, AuditError> {
    let map = |e: rusqlite::Error| map_sqlite(&e, path);
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(map)?;
    // The checkpoint syncs the WAL before copying and the database after, as the
    // writer's own would have.
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync).map_err(map)?;
    Ok(conn)
}

/// Once the frames in the WAL pass this many bytes, the WAL is made to start over
/// (module docs).
pub(crate) const WAL_RESTART_BYTES: u64 = 16 * 1024 * 1024;
/// The writer's between-commits checkpoint is asked for once at most this many frames
/// are left to copy: its pause is a copy and a sync of at most about 256 KiB.
const RESTART_FRAMES_LEFT: i64 = 64;
/// Back-to-back PASSIVE rounds to get there (each copies what was appended during the
/// one before, so a few suffice unless the writer outruns the copy).
const CATCH_UP_ROUNDS: usize = 8;
/// The fallback: a WAL file larger than this is truncated with a TRUNCATE checkpoint,
/// which waits for a gap between commits and holds the write lock for its copy (a
/// reader that keeps the WAL from starting over, or a writer faster than the copy).
pub const WAL_TRUNCATE_BYTES: u64 = 3 * WAL_RESTART_BYTES;
/// How long a TRUNCATE checkpoint waits for the writer's commit (and readers) to let
/// it in; the writer's transactions are short, so this is ample.
const TRUNCATE_WAIT: Duration = Duration::from_millis(500);

/// The WAL's bounds (the constants above; smaller in tests).
#[derive(Clone, Copy, Debug)]
struct WalLimits {
    restart_bytes: u64,
    truncate_bytes: u64,
}

const LIMITS: WalLimits = WalLimits {
    restart_bytes: WAL_RESTART_BYTES,
    truncate_bytes: WAL_TRUNCATE_BYTES,
};

/// One PASSIVE checkpoint: (frames in the WAL, frames copied into the database), or
/// `None` when another connection's checkpoint held the lock.
fn passive(conn: &Connection) -> rusqlite::Result<Option<(i64, i64)>> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        let busy = r.get::<_, i64>(0)? != 0;
        Ok((!busy).then_some((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))
    })
}

/// The bytes of `frames` WAL frames of this database (a frame is a page and its
/// 24-byte header).
fn frame_bytes(conn: &Connection, frames: i64) -> u64 {
    let page = conn
        .query_row("PRAGMA page_size", [], |r| r.get::<_, i64>(0))
        .unwrap_or(4096);
    u64::try_from(frames.max(0) * (page + 24)).unwrap_or(u64::MAX)
}

/// One round of the WAL thread: PASSIVE; past [`WAL_RESTART_BYTES`] of frames, catch
/// up and ask the writer to start the WAL over; past [`WAL_TRUNCATE_BYTES`] of file,
/// TRUNCATE. A failure is logged and the next round tries again.
fn checkpoint(conn: &Connection, path: &Path, state: &WalState, limits: WalLimits) {
    let (mut frames, mut copied) = match passive(conn) {
        Ok(Some(done)) => done,
        // The writer's own checkpoint is running: next round.
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(error = %map_sqlite(&e, path), "WAL checkpoint failed");
            return;
        }
    };
    if frame_bytes(conn, frames) > limits.restart_bytes {
        for _ in 0..CATCH_UP_ROUNDS {
            if frames - copied <= RESTART_FRAMES_LEFT {
                break;
            }
            match passive(conn) {
                Ok(Some(done)) => (frames, copied) = done,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %map_sqlite(&e, path), "WAL checkpoint failed");
                    return;
                }
            }
        }
        // The rounds wrote the copied pages into the database file without syncing it
        // (SQLite syncs it only when a round copies the whole WAL): synced here, the
        // writer's round below syncs only its own few pages instead of megabytes.
        if frames - copied <= RESTART_FRAMES_LEFT && sync_database(path) {
            state.restart_wanted.store(true, Ordering::Relaxed);
        }
    }
    if wal_bytes(path) <= limits.truncate_bytes {
        return;
    }
    // Waits (busy handler) for a gap between the writer's commits, copies what is
    // left, and truncates the WAL to zero bytes.
    let _ = conn.busy_timeout(TRUNCATE_WAIT);
    let run = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    });
    match run {
        Ok(0) => {
            state.truncations.fetch_add(1, Ordering::Relaxed);
        }
        Ok(_) => tracing::warn!(
            wal_bytes = wal_bytes(path),
            "the WAL could not be truncated this round (busy); trying again next round"
        ),
        Err(e) => tracing::warn!(error = %map_sqlite(&e, path), "WAL truncate checkpoint failed"),
    }
    let _ = conn.busy_timeout(Duration::ZERO);
}

/// Run by the writer between two commits when the WAL thread asked for it
/// ([`WalCheckpointer::restart_wanted`]): one PASSIVE checkpoint on the writer's own
/// connection, which copies the few frames left (nothing appends meanwhile), so the
/// writer's next commit starts the WAL over from its beginning. Busy (the WAL thread's
/// round holds the checkpoint lock) or failed: the request stays for the next gap.
pub(crate) fn checkpoint_between_commits(conn: &Connection, path: &Path, state: &WalState) {
    match passive(conn) {
        Ok(Some((frames, copied))) if frames == copied => {
            state.restart_wanted.store(false, Ordering::Relaxed);
            state.restarts.fetch_add(1, Ordering::Relaxed);
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %map_sqlite(&e, path), "the writer's WAL checkpoint failed")
        }
    }
}

/// The size of the WAL file next to `db` (0 when there is none).
pub(crate) fn wal_bytes(db: &Path) -> u64 {
    let mut name = OsString::from(db.as_os_str());
    name.push("-wal");
    std::fs::metadata(PathBuf::from(name)).map_or(0, |m| m.len())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_checkpointer_moves_committed_pages_into_the_database_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = Connection::open(&path).unwrap();
        let mode: String = writer
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        configure_writer(&writer, &path).unwrap();
        writer
            .execute_batch("CREATE TABLE t (x TEXT); BEGIN;")
            .unwrap();
        for i in 0..2000 {
            writer
                .execute("INSERT INTO t VALUES (?1)", [format!("{i:0>500}")])
                .unwrap();
        }
        writer.execute_batch("COMMIT").unwrap();
        let db_bytes = || std::fs::metadata(&path).unwrap().len();
        // The writer never copies: the rows are only in the WAL.
        let before = db_bytes();
        assert!(before < 100_000, "{before}");
        let mut wal = WalCheckpointer::start(
            &path,
            Durability::Full,
            Sinks::open(&[], None, None).unwrap(),
            Arc::default(),
        )
        .unwrap();
        wal.stop();
        assert!(db_bytes() > 1_000_000, "{}", db_bytes());
        let n: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2000);
    }

    /// Small bounds, so a test writes a few MiB rather than the production tens.
    const SMALL: WalLimits = WalLimits {
        restart_bytes: 512 * 1024,
        truncate_bytes: 3 * 512 * 1024,
    };

    fn wal_database(dir: &Path) -> (PathBuf, Connection) {
        let path = dir.join("t.db");
        let writer = Connection::open(&path).unwrap();
        let _: String = writer
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        configure_writer(&writer, &path).unwrap();
        writer.execute_batch("CREATE TABLE t (x TEXT)").unwrap();
        (path, writer)
    }

    fn commit(writer: &Connection, rows: usize) {
        let row = "x".repeat(3000);
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        for _ in 0..rows {
            writer.execute("INSERT INTO t VALUES (?1)", [&row]).unwrap();
        }
        writer.execute_batch("COMMIT").unwrap();
    }

    /// A connection in the middle of a read: it keeps the frames it sees in use.
    fn reading(path: &Path) -> Connection {
        let reader = Connection::open(path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        reader
    }

    /// One step of sustained load as the WAL thread sees it: a commit lands while a
    /// round copies, so the round copies everything but that commit (a reader pinned
    /// at the frames before it stands in for the timing).
    fn commit_during_a_round(
        writer: &Connection,
        rounds: &Connection,
        path: &Path,
        state: &WalState,
    ) {
        let reader = reading(path);
        commit(writer, 10);
        checkpoint(rounds, path, state, SMALL);
        reader.execute_batch("COMMIT").unwrap();
    }

    /// The WAL under sustained writes: each time its frames pass the threshold, a round
    /// asks the writer for its between-commits copy, and the writer's next commit
    /// starts the WAL over: the file stays near the threshold and never needs the
    /// TRUNCATE fallback, and the rows are all there.
    #[test]
    fn a_busy_wal_starts_over_after_the_writers_copy_instead_of_being_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let (path, writer) = wal_database(dir.path());
        let rounds = open(&path, Durability::Normal).unwrap();
        let state = WalState::default();
        let mut largest = 0;
        let mut rows = 0;
        for cycle in 1..=3_u64 {
            let mut steps = 0;
            while !state.restart_wanted.load(Ordering::Relaxed) {
                commit_during_a_round(&writer, &rounds, &path, &state);
                rows += 10;
                largest = largest.max(wal_bytes(&path));
                steps += 1;
                assert!(steps < 1_000, "cycle {cycle}: no restart asked for");
            }
            // Asked for only past the threshold.
            assert!(wal_bytes(&path) > SMALL.restart_bytes, "cycle {cycle}");
            assert!(steps > 5, "cycle {cycle}: asked after {steps} commits");
            commit(&writer, 5);
            rows += 5;
            checkpoint_between_commits(&writer, &path, &state);
            assert!(!state.restart_wanted.load(Ordering::Relaxed));
            assert_eq!(state.restarts.load(Ordering::Relaxed), cycle);
            // The next commit starts the WAL over: only its own frames are in it.
            commit(&writer, 5);
            rows += 5;
            let (frames, _) = passive(&rounds).unwrap().unwrap();
            assert!(
                frames < 32,
                "cycle {cycle}: {frames} frames after the restart"
            );
            largest = largest.max(wal_bytes(&path));
        }
        assert_eq!(state.truncations.load(Ordering::Relaxed), 0);
        assert!(
            largest < SMALL.restart_bytes + 128 * 1024,
            "the WAL file grew to {largest} bytes"
        );
        let n: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, rows);
    }

    /// A long reader keeps the WAL from being copied and from starting over; once the
    /// file passes the fallback bound, the round truncates it when the reader is gone.
    #[test]
    fn a_wal_held_by_a_reader_falls_back_to_the_truncate_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let (path, writer) = wal_database(dir.path());
        let rounds = open(&path, Durability::Normal).unwrap();
        let state = WalState::default();
        commit(&writer, 10);
        let reader = reading(&path);
        while wal_bytes(&path) <= SMALL.truncate_bytes {
            commit(&writer, 10);
            if state.restart_wanted.load(Ordering::Relaxed) {
                checkpoint_between_commits(&writer, &path, &state);
            }
        }
        // The round cannot copy past the reader's snapshot: nothing is asked of the
        // writer, and the truncation waits for the reader (and gives up).
        checkpoint(&rounds, &path, &state, SMALL);
        assert!(!state.restart_wanted.load(Ordering::Relaxed));
        assert_eq!(state.restarts.load(Ordering::Relaxed), 0);
        assert_eq!(state.truncations.load(Ordering::Relaxed), 0);
        reader.execute_batch("COMMIT").unwrap();
        checkpoint(&rounds, &path, &state, SMALL);
        assert_eq!(state.truncations.load(Ordering::Relaxed), 1);
        assert_eq!(wal_bytes(&path), 0);
    }

    #[test]
    fn notes_are_published_in_order_after_the_wal_sync_and_before_stop_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = Connection::open(&path).unwrap();
        let _: String = writer
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        writer.execute_batch("CREATE TABLE t (x TEXT)").unwrap();
        let sink = dir.path().join("sink.log");
        let sinks = Sinks::open(
            &[crate::CheckpointSink::File { path: sink.clone() }],
            None,
            None,
        )
        .unwrap();
        let mut wal =
            WalCheckpointer::start(&path, Durability::Normal, sinks, Arc::default()).unwrap();
        for i in 0..50 {
            wal.publish(format!("note {i}"), i % 2 == 0);
        }
        wal.stop();
        let published = std::fs::read_to_string(&sink).unwrap();
        let expected: String = (0..50).map(|i| format!("note {i}\n")).collect();
        assert_eq!(published, expected);
        // Stopped: later notes go nowhere, and nothing panics.
        wal.publish("late".into(), false);
        assert_eq!(std::fs::read_to_string(&sink).unwrap(), expected);
    }
}
