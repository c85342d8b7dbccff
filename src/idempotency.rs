//! Idempotency: a repeated call with the same key and arguments returns the first
//! outcome without executing again, also while the first is still running.
//!
//! Keys are namespaced by run, role and tool, so two agents cannot collide. The table
//! is bounded: past [`MAX_ENTRIES`] the oldest completed entries are dropped. It lives
//! in memory; after a restart a repeated key executes again (documented in docs/api.md).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::call::CallResponse;

/// The most keys remembered at once.
pub const MAX_ENTRIES: usize = 100_000;

/// The namespaced key of one idempotent call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub run_id: String,
    pub role_id: String,
    pub tool_name: String,
    pub idempotency_key: String,
}

enum Entry {
    /// The first call is running; waiters subscribe to its outcome.
    InFlight {
        arguments_hash: String,
        outcome: watch::Receiver<Option<Arc<CallResponse>>>,
    },
    Done {
        arguments_hash: String,
        response: Arc<CallResponse>,
    },
}

/// What a call with a key should do.
pub enum Claim {
    /// First of its key: run it, then `complete` the guard.
    First(Guard),
    /// The same key and arguments completed before: return this.
    Replay(Arc<CallResponse>),
    /// The same key and arguments are running: wait for this.
    Wait(watch::Receiver<Option<Arc<CallResponse>>>),
    /// The same key was used with other arguments.
    Conflict,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Completed keys, oldest first, for eviction.
    order: VecDeque<Key>,
}

/// The table of idempotency keys.
#[derive(Default, Clone)]
pub struct Idempotency {
    inner: Arc<Mutex<Inner>>,
}

impl Idempotency {
    pub fn claim(&self, key: Key, arguments_hash: &str) -> Claim {
        let Ok(mut inner) = self.inner.lock() else {
            return Claim::Conflict;
        };
        match inner.entries.get(&key) {
            Some(Entry::Done {
                arguments_hash: h,
                response,
            }) => {
                if h == arguments_hash {
                    Claim::Replay(response.clone())
                } else {
                    Claim::Conflict
                }
            }
            Some(Entry::InFlight {
                arguments_hash: h,
                outcome,
            }) => {
                if h == arguments_hash {
                    Claim::Wait(outcome.clone())
                } else {
                    Claim::Conflict
                }
            }
            None => {
                let (sender, receiver) = watch::channel(None);
                inner.entries.insert(
                    key.clone(),
                    Entry::InFlight {
                        arguments_hash: arguments_hash.to_string(),
                        outcome: receiver,
                    },
                );
                Claim::First(Guard {
                    table: self.clone(),
                    key: Some(key),
                    arguments_hash: arguments_hash.to_string(),
                    sender,
                })
            }
        }
    }
}

/// Held by the first call of a key. Completing it stores the outcome (when `keep`) and
/// wakes the waiters; dropping it without completing forgets the key.
pub struct Guard {
    table: Idempotency,
    key: Option<Key>,
    arguments_hash: String,
    sender: watch::Sender<Option<Arc<CallResponse>>>,
}

impl Guard {
    /// Publishes the outcome. With `keep` false (a retryable failure of an idempotent
    /// tool) the key is forgotten so a retry executes again.
    pub fn complete(mut self, response: Arc<CallResponse>, keep: bool) {
        let Some(key) = self.key.take() else { return };
        if let Ok(mut inner) = self.table.inner.lock() {
            if keep {
                inner.entries.insert(
                    key.clone(),
                    Entry::Done {
                        arguments_hash: std::mem::take(&mut self.arguments_hash),
                        response: response.clone(),
                    },
                );
                inner.order.push_back(key);
                while inner.order.len() > MAX_ENTRIES {
                    if let Some(old) = inner.order.pop_front() {
                        inner.entries.remove(&old);
                    }
                }
            } else {
                inner.entries.remove(&key);
            }
        }
        self.sender.send_replace(Some(response));
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(key) = self.key.take()
            && let Ok(mut inner) = self.table.inner.lock()
        {
            inner.entries.remove(&key);
        }
    }
}
