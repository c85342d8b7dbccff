//! The log writer: lines are formatted on the calling thread and appended, whole, to one
//! bounded buffer; a writer thread puts them on stderr in batches.
//!
//! Why not a queue with a thread woken per line (`tracing-appender`, which this
//! replaced): with one call at a time every log line woke the writer thread, which then
//! wrote the line alone and parked again, about two context switches per call on top of
//! the wake-up on the calling thread (docs/performance.md, seventh pass). Here a line
//! wakes the writer only when it lands in an empty buffer or fills it past
//! [`HIGH_WATER`]; the writer then gathers for up to [`FLUSH_DELAY`] and writes
//! everything in one `write(2)`.
//!
//! INVARIANT: nothing is dropped and memory is bounded: a line that would take the
//! buffer past [`CAPACITY`] waits until the writer has taken the buffer (a line larger
//! than the whole capacity goes in alone). Lines never interleave: each `write` appends
//! its bytes under the lock. Dropping the [`LogFlusher`] writes out what is buffered
//! (waiting at most [`CLOSE_WAIT`] for a blocked stderr).

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How long the writer thread gathers lines after the first one lands in an empty
/// buffer, before it writes them out.
pub const FLUSH_DELAY: Duration = Duration::from_millis(20);
/// A buffer this full is written out at once, without waiting for [`FLUSH_DELAY`].
pub const HIGH_WATER: usize = 64 * 1024;
/// The most bytes buffered; a line that would go past it waits for the writer.
pub const CAPACITY: usize = 1024 * 1024;
/// How long dropping the [`LogFlusher`] waits for the last lines to be written.
pub const CLOSE_WAIT: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    buffer: Vec<u8>,
    /// The flusher was dropped: write out what is left and stop.
    closing: bool,
    /// The writer thread has stopped; later lines are written directly.
    done: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the writer thread (a line in an empty buffer, the high-water mark, closing).
    wake: Condvar,
    /// Wakes callers waiting for room, and the flusher's drop waiting for `done`.
    room: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a buffer of whole lines: keep using it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The `MakeWriter` of the log layer: each event's line is appended to the shared buffer.
#[derive(Clone)]
pub struct BatchWriter {
    shared: Arc<Shared>,
    /// Where lines go once the writer thread has stopped (stderr in the server).
    direct: Arc<Mutex<Box<dyn Write + Send>>>,
}

/// Keeps the writer thread; dropping it writes out the buffered lines.
pub struct LogFlusher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LogFlusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFlusher").finish_non_exhaustive()
    }
}

/// Starts the writer thread `name` writing to `out`; `direct` takes the lines written
/// after it stopped.
pub fn spawn(
    name: &str,
    out: Box<dyn Write + Send>,
    direct: Box<dyn Write + Send>,
) -> io::Result<(BatchWriter, LogFlusher)> {
    let shared = Arc::new(Shared::default());
    let thread = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(&shared, out))?
    };
    Ok((
        BatchWriter {
            shared: shared.clone(),
            direct: Arc::new(Mutex::new(direct)),
        },
        LogFlusher {
            shared,
            thread: Some(thread),
        },
    ))
}

/// The writer thread: waits for a first line, gathers for [`FLUSH_DELAY`] (less once
/// past [`HIGH_WATER`] or closing), takes the whole buffer and writes it in one go.
fn run(shared: &Shared, mut out: Box<dyn Write + Send>) {
    let mut spare = Vec::new();
    loop {
        let mut state = shared.lock();
        while state.buffer.is_empty() && !state.closing {
            state = shared
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if state.buffer.is_empty() {
            // Closing, and everything is written.
            state.done = true;
            drop(state);
            shared.room.notify_all();
            return;
        }
        let until = Instant::now() + FLUSH_DELAY;
        while state.buffer.len() < HIGH_WATER && !state.closing {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = shared
                .wake
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let mut batch = std::mem::replace(&mut state.buffer, std::mem::take(&mut spare));
        drop(state);
        shared.room.notify_all();
        // A failed write loses these lines, as a failed write to stderr always would;
        // the gateway's work never depends on its logs.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        spare = batch;
    }
}

impl BatchWriter {
    fn append(&self, line: &[u8]) -> io::Result<()> {
        let mut state = self.shared.lock();
        while !state.buffer.is_empty() && state.buffer.len() + line.len() > CAPACITY && !state.done
        {
            state = self
                .shared
                .room
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if state.done {
            drop(state);
            let mut direct = self.direct.lock().unwrap_or_else(PoisonError::into_inner);
            return direct.write_all(line).and_then(|()| direct.flush());
        }
        let before = state.buffer.len();
        state.buffer.extend_from_slice(line);
        let after = state.buffer.len();
        drop(state);
        // Only the transitions wake the writer: notifying is a system call.
        if before == 0 || (before < HIGH_WATER && after >= HIGH_WATER) {
            self.shared.wake.notify_one();
        }
        Ok(())
    }
}

/// One event's writer, as the fmt layer asks for it.
pub struct LineWriter<'a>(&'a BatchWriter);

impl Write for LineWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.append(bytes)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchWriter {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(self)
    }
}

impl Drop for LogFlusher {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.closing = true;
        self.shared.wake.notify_one();
        let until = Instant::now() + CLOSE_WAIT;
        while !state.done {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // stderr is blocked: leave the thread rather than hang the shutdown.
                return;
            }
            state = self
                .shared
                .room
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(state);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// An output that records each `write_all` batch, optionally held until released.
    #[derive(Clone, Default)]
    struct Recorder {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        gate: Arc<Mutex<Option<mpsc::Receiver<()>>>>,
    }

    impl Write for Recorder {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if let Some(gate) = self.gate.lock().unwrap().as_ref() {
                let _ = gate.recv();
            }
            self.writes.lock().unwrap().push(bytes.to_vec());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Recorder {
        fn text(&self) -> String {
            String::from_utf8(self.writes.lock().unwrap().concat()).unwrap()
        }
    }

    fn line(writer: &BatchWriter, text: &str) {
        let mut w = writer.make_writer();
        w.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn lines_from_many_threads_come_out_whole_in_order_and_none_is_lost() {
        let out = Recorder::default();
        let (writer, flusher) =
            spawn("test-log", Box::new(out.clone()), Box::new(io::sink())).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000 {
                        line(
                            &writer,
                            &format!("thread {t} line {i:05} {}\n", "x".repeat(i % 97)),
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(flusher);
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8_000);
        for t in 0..4 {
            let prefix = format!("thread {t} line ");
            let mine: Vec<usize> = lines
                .iter()
                .filter_map(|l| l.strip_prefix(&prefix))
                .map(|rest| {
                    let (n, pad) = rest.split_once(' ').unwrap();
                    let n: usize = n.parse().unwrap();
                    assert_eq!(pad, "x".repeat(n % 97), "line {n} of thread {t} is whole");
                    n
                })
                .collect();
            assert_eq!(
                mine,
                (0..2_000).collect::<Vec<_>>(),
                "thread {t}'s lines in order"
            );
        }
        // Batched: far fewer writes than lines.
        assert!(out.writes.lock().unwrap().len() < 8_000 / 4);
    }

    #[test]
    fn a_full_buffer_makes_writers_wait_and_drops_nothing() {
        let out = Recorder::default();
        let (release, gate) = mpsc::channel();
        *out.gate.lock().unwrap() = Some(gate);
        let (writer, flusher) =
            spawn("test-log", Box::new(out.clone()), Box::new(io::sink())).unwrap();
        // The writer thread takes the first batch and blocks in its write; then the
        // buffer fills to its capacity and the next writer has to wait.
        line(&writer, "first\n");
        let taken = || writer.shared.lock().buffer.is_empty();
        let start = Instant::now();
        while !taken() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the writer took the batch"
            );
            std::thread::yield_now();
        }
        let chunk = "y".repeat(1023) + "\n";
        for _ in 0..CAPACITY / chunk.len() {
            line(&writer, &chunk);
        }
        let (done_tx, done_rx) = mpsc::channel();
        let waiting = {
            let writer = writer.clone();
            std::thread::spawn(move || {
                line(&writer, "over the capacity\n");
                done_tx.send(()).unwrap();
            })
        };
        assert!(
            done_rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "a line past the capacity waits while the writer is blocked"
        );
        assert!(writer.shared.lock().buffer.len() <= CAPACITY);
        // Release the output: everything goes out, the waiting line too.
        drop(release);
        done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        waiting.join().unwrap();
        drop(flusher);
        let text = out.text();
        assert!(text.starts_with("first\n"));
        assert!(text.ends_with("over the capacity\n"));
        assert_eq!(text.lines().count(), 2 + CAPACITY / chunk.len());
    }

    #[test]
    fn a_line_larger_than_the_capacity_goes_out_alone() {
        let out = Recorder::default();
        let (writer, flusher) =
            spawn("test-log", Box::new(out.clone()), Box::new(io::sink())).unwrap();
        let big = "z".repeat(CAPACITY + 10) + "\n";
        line(&writer, &big);
        line(&writer, "after\n");
        drop(flusher);
        assert_eq!(out.text(), big + "after\n");
    }

    #[test]
    fn a_line_is_written_without_waiting_for_more_and_lines_after_the_close_go_direct() {
        let out = Recorder::default();
        let direct = Recorder::default();
        let (writer, flusher) =
            spawn("test-log", Box::new(out.clone()), Box::new(direct.clone())).unwrap();
        line(&writer, "alone\n");
        let start = Instant::now();
        while out.text().is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a lone line is written"
            );
            std::thread::yield_now();
        }
        assert_eq!(out.text(), "alone\n");
        drop(flusher);
        line(&writer, "late\n");
        assert_eq!(direct.text(), "late\n");
        assert_eq!(out.text(), "alone\n");
    }
}
