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
//! INVARIANT: a checkpoint only copies committed frames; it never changes what the log
//! says, and a crash at any point leaves SQLite's own recovery to do the rest.
//! INVARIANT: a signed note leaves the process only after every event under it is on
//! disk (committed with `synchronous=FULL`, or the WAL fsynced here first); notes are
//! published in the order they were signed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
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

/// The running WAL thread; [`WalCheckpointer::stop`] ends it after it has published
/// every note sent and run a last checkpoint.
pub(crate) struct WalCheckpointer {
    sender: Option<Sender<Publish>>,
    /// Gives the sinks back when it ends (see [`WalCheckpointer::restart`]).
    thread: Option<JoinHandle<Sinks>>,
    path: PathBuf,
    durability: Durability,
}

impl WalCheckpointer {
    /// Opens its own connection to `path` and starts the thread, which owns the sinks.
    pub(crate) fn start(
        path: &Path,
        durability: Durability,
        sinks: Sinks,
    ) -> Result<Self, AuditError> {
        let conn = open(path, durability)?;
        Self::spawn(conn, path, durability, sinks)
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
        *self = Self::spawn(conn, &target, self.durability, sinks)?;
        result
    }

    fn spawn(
        conn: Connection,
        path: &Path,
        durability: Durability,
        mut sinks: Sinks,
    ) -> Result<Self, AuditError> {
        let (sender, received) = mpsc::channel::<Publish>();
        let owned: PathBuf = path.to_path_buf();
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
                    checkpoint(&conn, &owned);
                    if Instant::now() >= next_head {
                        offer_head(&conn, &owned, durability, &mut sinks);
                        next_head = Instant::now() + HEAD_INTERVAL;
                    }
                    next_round = Instant::now() + INTERVAL;
                }
                checkpoint(&conn, &owned);
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

/// Once the WAL file is larger than this, a round also runs a TRUNCATE checkpoint:
/// under sustained load a PASSIVE checkpoint copies frames but the WAL is never idle
/// long enough to be reset, so without it the file grows without bound.
pub(crate) const WAL_TRUNCATE_BYTES: u64 = 16 * 1024 * 1024;
/// How long a TRUNCATE checkpoint waits for the writer's commit (and readers) to let
/// it in; the writer's transactions are short, so this is ample.
const TRUNCATE_WAIT: Duration = Duration::from_millis(500);

/// One round: PASSIVE, and TRUNCATE when the WAL is over [`WAL_TRUNCATE_BYTES`]. A
/// failure is logged and the next round tries again.
fn checkpoint(conn: &Connection, path: &Path) {
    let run = |mode: &str| {
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
    };
    if let Err(e) = run("PASSIVE") {
        tracing::warn!(error = %map_sqlite(&e, path), "WAL checkpoint failed");
        return;
    }
    if wal_bytes(path) <= WAL_TRUNCATE_BYTES {
        return;
    }
    // Waits (busy handler) for a gap between the writer's commits, copies what is
    // left, and truncates the WAL to zero bytes.
    let _ = conn.busy_timeout(TRUNCATE_WAIT);
    match run("TRUNCATE") {
        Ok((0, _, _)) => {}
        Ok(_) => tracing::warn!(
            wal_bytes = wal_bytes(path),
            "the WAL could not be truncated this round (busy); trying again next round"
        ),
        Err(e) => tracing::warn!(error = %map_sqlite(&e, path), "WAL truncate checkpoint failed"),
    }
    let _ = conn.busy_timeout(Duration::ZERO);
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
        let mut wal =
            WalCheckpointer::start(&path, Durability::Full, Sinks::open(&[], None).unwrap())
                .unwrap();
        wal.stop();
        assert!(db_bytes() > 1_000_000, "{}", db_bytes());
        let n: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2000);
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
            &[crate::audit::CheckpointSink::File { path: sink.clone() }],
            None,
        )
        .unwrap();
        let mut wal = WalCheckpointer::start(&path, Durability::Normal, sinks).unwrap();
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
