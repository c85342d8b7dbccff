//! The gateway's side of shadow mode: the bounded queue that hands a copy of each live
//! call to the shadow worker (`shadow.rs`, which decides it under the candidate
//! policy), and the counters both sides keep. The gateway hands over values (the
//! request, the active verdict, the run record as it was), never itself.
//!
//! INVARIANT: submitting never waits: a call that finds the queue full is not
//! shadowed, only counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use crate::call::{CallRequest, Received, Verdict};
use crate::gateway::Gateway;
use crate::policy::PolicyVersions;
use crate::runs::RunRecord;

/// One live call to decide under the candidate.
#[derive(Debug)]
pub struct Job {
    pub call_id: String,
    /// The caller's bearer token, held only until the candidate has verified it.
    pub token: Option<String>,
    /// The caller's JWT as the active gateway verified it (who it proves, or why not):
    /// the candidate decides on the same identity.
    pub jwt: Option<Result<Arc<crate::identity::JwtIdentity>, crate::diagnostic::Refusal>>,
    pub request: CallRequest,
    /// The live run record at the time of the call, if the run exists.
    pub run: Option<RunRecord>,
    /// The active policy's decision.
    pub active: Verdict,
    pub active_versions: PolicyVersions,
}

/// What the queue carries to the worker.
pub enum Message {
    Decide(Box<Job>),
    /// Answered once every message before it is decided and recorded.
    Flush(oneshot::Sender<()>),
}

/// What shadow mode has done so far, shared by the queue and the worker.
#[derive(Debug, Default)]
pub struct Counters {
    /// Calls decided under the candidate.
    pub decided: AtomicU64,
    /// Calls whose candidate decision differed from the active one.
    pub divergences: AtomicU64,
    /// Calls not shadowed because the queue was full.
    pub dropped: AtomicU64,
}

/// The handle the gateway holds: the queue to the worker, the candidate's versions and
/// the counters. `shadow::start` builds it with its worker.
pub struct Shadow {
    versions: PolicyVersions,
    sender: mpsc::Sender<Message>,
    counters: Arc<Counters>,
}

impl Shadow {
    /// A handle on the queue `sender` of a worker deciding under the candidate
    /// `versions`, reporting in `counters`.
    pub fn new(
        versions: PolicyVersions,
        sender: mpsc::Sender<Message>,
        counters: Arc<Counters>,
    ) -> Shadow {
        Shadow {
            versions,
            sender,
            counters,
        }
    }

    /// Calls not shadowed because the queue was full, so far.
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// The candidate's versions.
    pub fn versions(&self) -> &PolicyVersions {
        &self.versions
    }

    /// Calls decided under the candidate so far.
    pub fn decided(&self) -> u64 {
        self.counters.decided.load(Ordering::Relaxed)
    }

    /// Calls whose candidate decision differed from the active one so far.
    pub fn divergences(&self) -> u64 {
        self.counters.divergences.load(Ordering::Relaxed)
    }

    /// Waits until every call queued so far is decided and its divergence recorded.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.sender.send(Message::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// Queues a call; never waits.
    fn submit(&self, job: Job) {
        match self.sender.try_send(Message::Decide(Box::new(job))) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::error!("the shadow worker stopped; a call was not shadowed");
            }
        }
    }
}

impl Gateway {
    /// A copy of a well-formed request when shadow mode is on.
    pub(crate) fn shadow_copy(&self, request: &Received) -> Option<CallRequest> {
        match (self.shadow(), request) {
            (Some(_), Ok(request)) => Some(request.clone()),
            _ => None,
        }
    }

    /// Queues a call for the candidate's decision; never waits: a call that finds the
    /// queue full is not shadowed, only counted.
    pub(crate) fn shadow_submit(
        &self,
        call_id: &str,
        token: Option<&str>,
        jwt: Option<&Result<Arc<crate::identity::JwtIdentity>, crate::diagnostic::Refusal>>,
        request: CallRequest,
        active: Verdict,
        active_versions: &PolicyVersions,
    ) {
        let Some(shadow) = self.shadow() else {
            return;
        };
        shadow.submit(Job {
            call_id: call_id.to_string(),
            token: token.map(str::to_string),
            jwt: jwt.cloned(),
            run: self.runs.get(&request.run_id),
            request,
            active,
            active_versions: active_versions.clone(),
        });
    }

    /// Calls whose shadow decision diverged from the active one (0 without shadow
    /// mode), for metrics.
    pub fn shadow_divergences(&self) -> u64 {
        self.shadow().map_or(0, Shadow::divergences)
    }

    /// Waits until every shadowed call so far is decided and recorded.
    pub async fn flush_shadow(&self) {
        if let Some(shadow) = self.shadow() {
            shadow.flush().await;
        }
    }
}
