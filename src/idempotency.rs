//! Idempotency: a repeated call with the same key, arguments and scope returns the
//! first outcome without executing again, also while the first is still running.
//!
//! Keys are namespaced by run, role and tool, so two agents cannot collide; the
//! fingerprint of a key's first call covers its arguments and its scope (with the run
//! fixed by the key, that determines the effective scope), so the same key with other
//! arguments or another scope is a conflict, never a replay of someone else's answer.
//!
//! The table is bounded in entries ([`MAX_ENTRIES`]) and in bytes
//! ([`MAX_STORED_BYTES`]): past either, the oldest completed entries are dropped. An
//! output larger than [`MAX_INLINE_OUTPUT_BYTES`] is kept in the artifact store and
//! only its sha256 here. The table lives in memory; after a restart a repeated key
//! executes again (documented in docs/api.md).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::call::CallResponse;

/// The most keys remembered at once.
pub const MAX_ENTRIES: usize = 100_000;
/// The most bytes of stored outcomes (their JSON size) remembered at once.
pub const MAX_STORED_BYTES: usize = 64 * 1024 * 1024;
/// An output larger than this (as JSON) is kept by reference to the artifact store.
pub const MAX_INLINE_OUTPUT_BYTES: usize = 64 * 1024;

/// The namespaced key of one idempotent call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub run_id: String,
    pub role_id: String,
    pub tool_name: String,
    pub idempotency_key: String,
}

/// What the first call of a key left for its repeats.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The first call's response; its output is removed when `spilled_output` is set.
    pub response: Arc<CallResponse>,
    /// The sha256 of the output kept in the artifact store instead of in memory.
    pub spilled_output: Option<String>,
    /// The JSON size of what is kept in memory, for the byte budget.
    pub bytes: usize,
}

type OutcomeReceiver = watch::Receiver<Option<Outcome>>;

enum Entry {
    /// The first call is running; waiters subscribe to its outcome.
    InFlight {
        fingerprint: String,
        outcome: OutcomeReceiver,
    },
    Done {
        fingerprint: String,
        outcome: Outcome,
    },
}

/// What a call with a key should do.
pub enum Claim {
    /// First of its key: run it, then `complete` the guard.
    First(Guard),
    /// The same key, arguments and scope completed before: replay this.
    Replay(Outcome),
    /// The same key, arguments and scope are running: wait for this.
    Wait(OutcomeReceiver),
    /// The same key was used with other arguments or another scope.
    Conflict,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Completed keys, oldest first, for eviction.
    order: VecDeque<Key>,
    /// The sum of `Outcome::bytes` over the completed entries.
    bytes: usize,
}

impl Inner {
    /// Drops the oldest completed entries until both bounds hold.
    fn evict(&mut self) {
        while self.order.len() > MAX_ENTRIES || self.bytes > MAX_STORED_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(Entry::Done { outcome, .. }) = self.entries.get(&old) {
                self.bytes = self.bytes.saturating_sub(outcome.bytes);
                self.entries.remove(&old);
            }
        }
    }
}

/// The table of idempotency keys.
#[derive(Default, Clone)]
pub struct Idempotency {
    inner: Arc<Mutex<Inner>>,
}

impl Idempotency {
    /// Claims `key` for a call whose arguments and scope hash to `fingerprint`.
    pub fn claim(&self, key: Key, fingerprint: &str) -> Claim {
        let Ok(mut inner) = self.inner.lock() else {
            return Claim::Conflict;
        };
        match inner.entries.get(&key) {
            Some(Entry::Done {
                fingerprint: f,
                outcome,
            }) => {
                if f == fingerprint {
                    Claim::Replay(outcome.clone())
                } else {
                    Claim::Conflict
                }
            }
            Some(Entry::InFlight {
                fingerprint: f,
                outcome,
            }) => {
                if f == fingerprint {
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
                        fingerprint: fingerprint.to_string(),
                        outcome: receiver,
                    },
                );
                Claim::First(Guard {
                    table: self.clone(),
                    key: Some(key),
                    fingerprint: fingerprint.to_string(),
                    sender,
                })
            }
        }
    }

    /// Completed keys and the bytes their outcomes hold (for tests and metrics).
    pub fn usage(&self) -> (usize, usize) {
        self.inner
            .lock()
            .map(|i| (i.order.len(), i.bytes))
            .unwrap_or((0, 0))
    }
}

/// Held by the first call of a key. Completing it stores the outcome (when `keep`) and
/// wakes the waiters; dropping it without completing forgets the key.
pub struct Guard {
    table: Idempotency,
    key: Option<Key>,
    fingerprint: String,
    sender: watch::Sender<Option<Outcome>>,
}

impl Guard {
    /// Publishes the outcome. With `keep` false (nothing reached the tool, or a
    /// retryable failure of an idempotent tool) the key is forgotten so a retry
    /// executes again; the calls already waiting still get this outcome.
    pub fn complete(mut self, outcome: Outcome, keep: bool) {
        let Some(key) = self.key.take() else { return };
        if let Ok(mut inner) = self.table.inner.lock() {
            if keep {
                inner.bytes = inner.bytes.saturating_add(outcome.bytes);
                inner.entries.insert(
                    key.clone(),
                    Entry::Done {
                        fingerprint: std::mem::take(&mut self.fingerprint),
                        outcome: outcome.clone(),
                    },
                );
                inner.order.push_back(key);
                inner.evict();
            } else {
                inner.entries.remove(&key);
            }
        }
        self.sender.send_replace(Some(outcome));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::call::{CallResponse, Status, Trace};

    fn key(k: &str) -> Key {
        Key {
            run_id: "r".into(),
            role_id: "a".into(),
            tool_name: "t".into(),
            idempotency_key: k.into(),
        }
    }

    fn outcome(bytes: usize) -> Outcome {
        Outcome {
            response: Arc::new(CallResponse {
                call_id: "c".into(),
                status: Status::Success,
                tool_name: None,
                tool_version: None,
                execution_time_ms: 0,
                output: None,
                artifact: None,
                error_code: None,
                error_message: None,
                audit_event_id: None,
                diagnostic: None,
                trace: Trace::default(),
                dry_run: None,
                replayed: false,
                replay_of: None,
                details: None,
                metrics: None,
            }),
            spilled_output: None,
            bytes,
        }
    }

    #[test]
    fn the_byte_budget_evicts_the_oldest_outcomes() {
        let table = Idempotency::default();
        let each = MAX_STORED_BYTES / 4;
        for i in 0..10 {
            let Claim::First(guard) = table.claim(key(&i.to_string()), "f") else {
                panic!("first claim");
            };
            guard.complete(outcome(each), true);
        }
        let (entries, bytes) = table.usage();
        assert!(bytes <= MAX_STORED_BYTES, "{bytes}");
        assert_eq!(entries, 4);
        // The newest are kept, the oldest are gone (a repeat would execute again).
        assert!(matches!(table.claim(key("9"), "f"), Claim::Replay(_)));
        assert!(matches!(table.claim(key("0"), "f"), Claim::First(_)));
    }

    #[test]
    fn another_fingerprint_conflicts_and_a_released_key_runs_again() {
        let table = Idempotency::default();
        let Claim::First(guard) = table.claim(key("k"), "f1") else {
            panic!("first claim");
        };
        assert!(matches!(table.claim(key("k"), "f2"), Claim::Conflict));
        assert!(matches!(table.claim(key("k"), "f1"), Claim::Wait(_)));
        guard.complete(outcome(10), false);
        assert!(matches!(table.claim(key("k"), "f2"), Claim::First(_)));
    }
}
