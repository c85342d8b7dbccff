//! The bound on what an upstream MCP server asks of toolgate on its own: the requests
//! it sends (`ping`, `sampling/createMessage`, ...) that toolgate has not finished
//! answering. rmcp starts a handler and a reply for each one, without a limit; a
//! server that sends requests and never reads the replies would make them pile up.
//!
//! [`Bounded`] wraps the transport of one connection and counts them: a request is
//! outstanding from the moment it is read until its reply is written (or given up).
//! One more than [`MAX_UPSTREAM_REQUESTS`] trips the connection's [`Tripwire`]: the
//! transport reads nothing more (rmcp's session ends), a stdio server is killed with its
//! process group, the call in flight fails with `dependency_down` saying why, and the
//! next call opens a new connection.
//!
//! INVARIANT: at most [`MAX_UPSTREAM_REQUESTS`] upstream requests of one connection
//! are held at once; a request reusing the id of one still outstanding is not read
//! further (JSON-RPC ids are unique among requests in flight) and holds nothing.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Mutex;

use rmcp::RoleClient;
use rmcp::model::{JsonRpcMessage, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Most requests of an upstream that toolgate holds unanswered at once, per
/// connection; one more closes the connection.
pub const MAX_UPSTREAM_REQUESTS: usize = 128;

/// What a connection's upstream asked and has not been answered yet, and whether it
/// went past the bound.
pub(super) struct Tripwire {
    /// How the server is named in messages.
    label: String,
    state: Mutex<Outstanding>,
    /// Cancelled when the bound is passed.
    tripped: CancellationToken,
    /// What to stop when the bound is passed (a stdio server's process group).
    on_trip: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

#[derive(Default)]
struct Outstanding {
    ids: HashSet<RequestId>,
    /// Why the connection was closed, once it was.
    why: Option<String>,
}

/// Whether a request just read may go on to rmcp.
enum Admit {
    Yes,
    /// Its id is already outstanding: dropped.
    Duplicate,
    /// Past the bound: the connection is closed.
    Over,
}

impl Tripwire {
    pub(super) fn new(label: String) -> Arc<Tripwire> {
        Arc::new(Tripwire {
            label,
            state: Mutex::default(),
            tripped: CancellationToken::new(),
            on_trip: Mutex::default(),
        })
    }

    /// Sets what to stop when the bound is passed (run at once if it already was).
    pub(super) fn on_trip(&self, stop: Box<dyn FnOnce() + Send>) {
        if self.tripped.is_cancelled() {
            stop();
        } else if let Ok(mut slot) = self.on_trip.lock() {
            *slot = Some(stop);
        }
    }

    /// Why the connection was closed, if the bound was passed.
    pub(super) fn why(&self) -> Option<String> {
        self.state.lock().ok().and_then(|s| s.why.clone())
    }

    pub(super) fn is_tripped(&self) -> bool {
        self.tripped.is_cancelled()
    }

    /// Resolves when the bound is passed.
    pub(super) async fn tripped(&self) {
        self.tripped.cancelled().await;
    }

    fn admit(&self, id: &RequestId) -> Admit {
        let Ok(mut state) = self.state.lock() else {
            return Admit::Over;
        };
        if state.ids.contains(id) {
            return Admit::Duplicate;
        }
        if state.ids.len() >= MAX_UPSTREAM_REQUESTS {
            let why = format!(
                "mcp server {} sent more than {MAX_UPSTREAM_REQUESTS} requests that toolgate had not finished answering (it does not read the answers); the connection was closed",
                self.label
            );
            tracing::warn!(server = %self.label, limit = MAX_UPSTREAM_REQUESTS, "{why}");
            state.why = Some(why);
            drop(state);
            self.trip();
            return Admit::Over;
        }
        state.ids.insert(id.clone());
        Admit::Yes
    }

    fn trip(&self) {
        self.tripped.cancel();
        let stop = self.on_trip.lock().ok().and_then(|mut slot| slot.take());
        if let Some(stop) = stop {
            stop();
        }
    }

    fn answered(&self, id: &RequestId) {
        if let Ok(mut state) = self.state.lock() {
            state.ids.remove(id);
        }
    }
}

/// A request's reply on its way: the request stops being outstanding when the reply
/// is written or given up (dropped).
struct Replying {
    wire: Arc<Tripwire>,
    id: RequestId,
}

impl Drop for Replying {
    fn drop(&mut self) {
        self.wire.answered(&self.id);
    }
}

/// A client transport whose upstream's requests are bounded by a [`Tripwire`].
pub(super) struct Bounded<T> {
    /// The transport; dropped when the bound is passed (an HTTP client's worker stops
    /// with it, closing its streams), after which messages sent are discarded.
    inner: Option<T>,
    wire: Arc<Tripwire>,
}

impl<T> Bounded<T> {
    pub(super) fn new(inner: T, wire: Arc<Tripwire>) -> Bounded<T> {
        Bounded {
            inner: Some(inner),
            wire,
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Bounded<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let id = match &item {
            JsonRpcMessage::Response(response) => Some(response.id.clone()),
            JsonRpcMessage::Error(error) => error.id.clone(),
            _ => None,
        };
        let replying = id.map(|id| Replying {
            wire: self.wire.clone(),
            id,
        });
        let sent = self.inner.as_mut().map(|inner| inner.send(item));
        async move {
            let result = match sent {
                Some(sent) => sent.await,
                None => Ok(()),
            };
            drop(replying);
            result
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            if self.wire.is_tripped() {
                self.inner = None;
                return None;
            }
            let message = self.inner.as_mut()?.receive().await?;
            if let JsonRpcMessage::Request(request) = &message {
                match self.wire.admit(&request.id) {
                    Admit::Yes => {}
                    Admit::Duplicate => continue,
                    Admit::Over => {
                        self.inner = None;
                        return None;
                    }
                }
            }
            return Some(message);
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let inner = self.inner.as_mut();
        async move {
            match inner {
                Some(inner) => inner.close().await,
                None => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use rmcp::model::NumberOrString;

    fn id(n: i64) -> RequestId {
        NumberOrString::Number(n)
    }

    #[test]
    fn the_bound_trips_once_and_answers_free_places() {
        let wire = Tripwire::new("`lab`".into());
        let stopped = Arc::new(Mutex::new(0));
        let count = stopped.clone();
        wire.on_trip(Box::new(move || *count.lock().unwrap() += 1));
        for n in 0..MAX_UPSTREAM_REQUESTS as i64 {
            assert!(matches!(wire.admit(&id(n)), Admit::Yes));
        }
        assert!(matches!(wire.admit(&id(0)), Admit::Duplicate));
        // An answered request frees its place.
        wire.answered(&id(0));
        assert!(matches!(wire.admit(&id(-1)), Admit::Yes));
        assert!(!wire.is_tripped());
        assert!(matches!(wire.admit(&id(-2)), Admit::Over));
        assert!(wire.is_tripped());
        assert_eq!(*stopped.lock().unwrap(), 1);
        assert!(wire.why().unwrap().contains("more than 128 requests"));
    }
}
