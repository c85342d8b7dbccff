//! The connection threads of `toolgate serve`: one single-threaded tokio runtime per
//! core, each serving the connections the accept loop hands it (issue 19).
//!
//! Why not tokio's multi-threaded runtime: on it, a worker woken by a request wakes a
//! second, idle worker to look for more work. A gated call wakes the server three times
//! (the request, then each of its two audit commits), so a lone client paid about six
//! context switches per call on the workers, where one thread per connection's work
//! needs three. Here a connection, the calls it carries and every task they spawn stay
//! on one thread; nothing is stolen and nobody is woken to steal.
//!
//! The price is that work does not move between threads: a connection stays on the
//! thread that got it. The accept loop gives each new connection to the thread with the
//! fewest open ones, so many clients spread evenly; a task that blocks its thread
//! delays the other connections on it (the gateway runs blocking work on the blocking
//! pool, as it must on any tokio runtime).
//!
//! INVARIANT: a [`Workers`] value with no threads (the default, and every in-process
//! test) spawns on the caller's runtime, as `tokio::spawn` does.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// How long a stopping connection thread waits for its blocking-pool tasks.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Where connections are served: a cloneable handle on the connection threads.
#[derive(Clone, Default)]
pub struct Workers {
    slots: Arc<[Slot]>,
}

struct Slot {
    handle: Handle,
    /// Connections open on this thread.
    open: AtomicUsize,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("threads", &self.slots.len())
            .finish()
    }
}

/// The running connection threads; [`WorkerThreads::stop`] ends them.
pub struct WorkerThreads {
    workers: Workers,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerThreads {
    /// Starts `count` threads, named `toolgate-http-<i>`, each running its own
    /// single-threaded runtime with every driver enabled. With none, connections are
    /// served on the runtime that accepts them.
    pub fn start(count: usize) -> std::io::Result<WorkerThreads> {
        let mut slots = Vec::new();
        let mut stops = Vec::new();
        let mut threads = Vec::new();
        for i in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            slots.push(Slot {
                handle: runtime.handle().clone(),
                open: AtomicUsize::new(0),
            });
            let thread = std::thread::Builder::new()
                .name(format!("toolgate-http-{i}"))
                .spawn(move || {
                    // The runtime runs its tasks only while `block_on` runs: until stopped.
                    let _ = runtime.block_on(stopped);
                    // A blocking task that never returns must not hold the exit.
                    runtime.shutdown_timeout(STOP_WAIT);
                })?;
            stops.push(stop);
            threads.push(thread);
        }
        Ok(WorkerThreads {
            workers: Workers {
                slots: slots.into(),
            },
            stops,
            threads,
        })
    }

    /// A handle to give connections to.
    pub fn workers(&self) -> Workers {
        self.workers.clone()
    }

    /// Stops every thread and waits for it: tasks still on a thread are dropped, as
    /// they are when a runtime is dropped.
    pub fn stop(self) {
        for stop in self.stops {
            let _ = stop.send(());
        }
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

impl Workers {
    /// How many connection threads there are (0: the caller's runtime serves).
    pub fn threads(&self) -> usize {
        self.slots.len()
    }

    /// Serves `stream` with `serve` on the thread with the fewest open connections (the
    /// first of those tied), or on the caller's runtime when there are no threads. A
    /// stream that cannot move between runtimes is dropped (the client sees a reset).
    pub fn spawn_connection<F, Fut>(&self, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some((index, slot)) = self
            .slots
            .iter()
            .enumerate()
            .min_by_key(|(_, slot)| slot.open.load(Ordering::Relaxed))
        else {
            tokio::spawn(serve(stream));
            return;
        };
        // The socket is registered with the accepting runtime's reactor: take it out,
        // and register it again on the connection thread.
        let std_stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot hand a connection to its thread");
                return;
            }
        };
        slot.open.fetch_add(1, Ordering::Relaxed);
        let workers = self.clone();
        slot.handle.spawn(async move {
            let _open = OpenGuard { workers, index };
            match TcpStream::from_std(std_stream) {
                Ok(stream) => serve(stream).await,
                Err(e) => tracing::warn!(error = %e, "cannot register a connection"),
            }
        });
    }
}

/// Counts a connection as open on its thread until dropped.
struct OpenGuard {
    workers: Workers,
    index: usize,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.workers.slots.get(self.index) {
            slot.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    /// Connects a client to `listener` and returns the server's side of it.
    async fn accept_one(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// The open counts, read on each connection thread itself: a task spawned there
    /// runs only after the tasks before it returned, their futures dropped.
    async fn open_counts(workers: &Workers) -> Vec<usize> {
        let mut counts = Vec::new();
        for slot in workers.slots.iter() {
            let w = workers.clone();
            let read = slot.handle.spawn(async move {
                w.slots
                    .iter()
                    .map(|s| s.open.load(Ordering::Relaxed))
                    .collect::<Vec<_>>()
            });
            counts = read.await.unwrap();
        }
        counts
    }

    /// Hands `stream` to `workers`; the connection reports its thread's name, then
    /// stays open until `done` is sent or dropped.
    fn serve_until(
        workers: &Workers,
        stream: TcpStream,
        names: &mpsc::UnboundedSender<String>,
    ) -> oneshot::Sender<()> {
        let (done, wait) = oneshot::channel::<()>();
        let names = names.clone();
        workers.spawn_connection(stream, move |stream| async move {
            let name = std::thread::current().name().unwrap_or("").to_string();
            let _ = names.send(name);
            let _ = wait.await;
            drop(stream);
        });
        done
    }

    #[tokio::test]
    async fn each_connection_goes_to_the_thread_with_the_fewest_open_ones() {
        let threads = WorkerThreads::start(2).unwrap();
        let workers = threads.workers();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (names, mut served) = mpsc::unbounded_channel::<String>();
        let mut open = Vec::new();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let (client, stream) = accept_one(&listener).await;
            open.push((client, serve_until(&workers, stream, &names)));
            seen.push(served.recv().await.unwrap());
        }
        assert_eq!(
            seen,
            ["toolgate-http-0", "toolgate-http-1", "toolgate-http-0"]
        );
        assert_eq!(open_counts(&workers).await, vec![2, 1]);

        // The connection on thread 1 ends: it is counted closed, and the next one goes
        // there rather than to the busier thread 0.
        let (_client, done) = open.remove(1);
        let _ = done.send(());
        assert_eq!(open_counts(&workers).await, vec![2, 0]);
        let (client, stream) = accept_one(&listener).await;
        open.push((client, serve_until(&workers, stream, &names)));
        assert_eq!(served.recv().await.unwrap(), "toolgate-http-1");

        // Stopping drops what was still served and counts it closed.
        threads.stop();
        let left: usize = workers
            .slots
            .iter()
            .map(|s| s.open.load(Ordering::Relaxed))
            .sum();
        assert_eq!(left, 0);
    }

    #[test]
    fn a_blocking_task_that_never_returns_does_not_hold_the_stop() {
        let threads = WorkerThreads::start(1).unwrap();
        let (_never, wait) = std::sync::mpsc::channel::<()>();
        let (started, running) = std::sync::mpsc::channel::<()>();
        threads.workers().slots[0].handle.spawn_blocking(move || {
            let _ = started.send(());
            let _ = wait.recv();
        });
        running.recv().unwrap();
        let (stopped, done) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            threads.stop();
            let _ = stopped.send(());
        });
        // STOP_WAIT is 1 s; a stop that waited for the task would never come.
        assert!(
            done.recv_timeout(std::time::Duration::from_secs(30))
                .is_ok()
        );
    }

    #[tokio::test]
    async fn without_threads_the_callers_runtime_serves() {
        let workers = Workers::default();
        assert_eq!(workers.threads(), 0);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_client, stream) = accept_one(&listener).await;
        let (names, mut served) = mpsc::unbounded_channel::<String>();
        let here = std::thread::current().name().unwrap_or("").to_string();
        let _done = serve_until(&workers, stream, &names);
        // A current-thread test runtime: the connection runs on this very thread.
        assert_eq!(served.recv().await.unwrap(), here);
    }
}
