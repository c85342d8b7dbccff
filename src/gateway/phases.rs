//! Two-phase tools, the gateway's side: the pending commits (durable in
//! `<data_dir>/phases.db`, see `state::phases`), `POST /v1/tool-calls/{call_id}/commit`,
//! and the task that rolls prepared calls back at their deadline.
//!
//! INVARIANT: a prepared call is decided once: the commit and the rollback claim it
//! under one lock (`pending -> committing` or `pending -> rolling_back`), and the claim
//! is durable before the upstream is called. A commit is never replayed. The commit
//! token stays in the state store: no response, audit event or log line carries it
//! (only its sha256).
//! INVARIANT: the upstream commit runs only once its `tool_commit_requested` is durable
//! in the audit log (written ahead, like a call's `tool_requested`).
//! INVARIANT: every phase leaves an audit event (`tool_committed`,
//! `tool_commit_refused`, `tool_commit_failed`, `tool_rolled_back`,
//! `tool_rollback_failed`). An outcome event is owed before it is appended: the new
//! state and the event are durable together in the state store, then appended; one the
//! log cannot take stays owed and is appended by the reaper's next round or at the next
//! start, never by running the phase again.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{Gateway, Loaded};
use crate::adapter::{ExecError, Phase, PhaseOutcome};
use crate::audit::EventType;
use crate::authz::{self, Caller};
use crate::call::Trace;
use crate::canonical::sha256_hex;
use crate::diagnostic::{Reason, Refusal};
use crate::requests::Commit;
use crate::runs::RunRecord;
use crate::state::StateError;
use crate::state::phases::{CommitState, PendingCommit, PhaseStore, UnrecordedEvent};

mod events;
mod owed;

pub(crate) use events::add_refusal;
use events::{
    malformed_event, phase_event, phase_refusal, prepared_details, refusal_event, with_sandbox,
};

/// `POST /v1/tool-calls/{call_id}/commit`'s answer: the call committed upstream, its
/// output and the `tool_committed` event that records it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Committed {
    pub call_id: String,
    pub commit_id: String,
    /// Always `success`: a commit that fails is refused (`commit_failed`).
    pub status: &'static str,
    /// Always `committed`.
    pub phase: &'static str,
    pub attempts: u32,
    pub output: Value,
    pub audit_event_id: String,
}

/// Undecided prepared calls the gateway holds at most; a prepare beyond is refused.
pub const MAX_PENDING: usize = 10_000;
/// Decided calls are remembered this long (a late commit is refused with the right
/// reason), then pruned at start.
const KEEP_DECIDED_MS: i64 = 7 * 24 * 3600 * 1000;
/// The most decided calls kept in memory; older ones are forgotten first.
const MAX_DECIDED: usize = 50_000;
/// The reaper looks at the table at least this often.
const REAPER_IDLE: Duration = Duration::from_secs(30);
/// While an outcome event is owed, the reaper tries to record it this often.
const OWED_RETRY: Duration = Duration::from_secs(1);

/// The pending commits of the running gateway.
pub struct TwoPhase {
    /// The durable store, or why it could not be opened (every two-phase call is
    /// then refused: fail closed).
    store: Result<Arc<PhaseStore>, String>,
    /// Every known prepared call by call_id, mirroring the store; the one lock under
    /// which commits and rollbacks claim a call.
    table: Mutex<HashMap<String, PendingCommit>>,
    /// Wakes the reaper when a call is prepared.
    wake: tokio::sync::Notify,
    /// Held while outcome events are made owed and appended, so that each is appended
    /// once and a call's events keep their order.
    recording: tokio::sync::Mutex<()>,
    /// When this process started (unix ms): a deadline before it passed while the
    /// gateway was down.
    started_ms: i64,
    /// The calls a stop interrupted mid-phase (their state when the store was loaded):
    /// the only ones resumed at start, never a phase this process has begun since.
    interrupted: std::collections::HashSet<String>,
}

/// The states a stop can leave a call in mid-phase (resumed at start).
fn is_unfinished(state: CommitState) -> bool {
    matches!(
        state,
        CommitState::Committing
            | CommitState::RollingBack
            | CommitState::CommitFailed
            | CommitState::RollbackFailed
    )
}

/// What a commit is decided under: the policy snapshot, the caller (resolved as for a
/// call), and in a fleet the run as the cluster database has it.
struct CommitDecision<'a> {
    loaded: &'a Loaded,
    caller: Caller<'a>,
    /// In a fleet, the run the cluster database returned (None: no such run); None
    /// outside a fleet (the local table is the authority).
    fleet_run: Option<Option<Arc<RunRecord>>>,
}

/// The identifiers of a call being prepared.
pub struct Prepared<'a> {
    pub call_id: &'a str,
    pub run_id: &'a str,
    pub role_id: &'a str,
    pub lane_id: &'a str,
    pub tool_name: &'a str,
    pub tool_version: &'a str,
}

impl TwoPhase {
    /// Opens `<data_dir>/phases.db`, prunes long-decided rows and loads the rest.
    pub fn open(data_dir: &Path) -> TwoPhase {
        let now = now_ms();
        let mut table = HashMap::new();
        let store = PhaseStore::open(&data_dir.join("phases.db")).and_then(|store| {
            store.prune(now - KEEP_DECIDED_MS)?;
            for row in store.load()? {
                table.insert(row.call_id.clone(), row);
            }
            Ok(Arc::new(store))
        });
        let interrupted = table
            .values()
            .filter(|e| is_unfinished(e.state))
            .map(|e| e.call_id.clone())
            .collect();
        TwoPhase {
            store: store.map_err(|e| e.to_string()),
            table: Mutex::new(table),
            wake: tokio::sync::Notify::new(),
            recording: tokio::sync::Mutex::new(()),
            started_ms: now,
            interrupted,
        }
    }

    fn store(&self) -> Result<Arc<PhaseStore>, Refusal> {
        self.store
            .clone()
            .map_err(|e| unavailable(&format!("it could not be opened: {e}")))
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, PendingCommit>>, Refusal> {
        self.table
            .lock()
            .map_err(|_| unavailable("its table lock is poisoned"))
    }

    /// Whether a two-phase call may be prepared now: the store is open and holds
    /// fewer than [`MAX_PENDING`] undecided calls.
    pub fn room(&self) -> Result<(), Refusal> {
        self.store()?;
        let table = self.lock()?;
        let undecided = table.values().filter(|e| !e.state.is_final()).count();
        if undecided >= MAX_PENDING {
            return Err(unavailable(&format!(
                "it holds {MAX_PENDING} undecided prepared calls, its limit"
            ))
            .with_details(json!({ "retry_after_ms": 1000 })));
        }
        Ok(())
    }

    /// Claims the call for `to` if its state is one of `from`; returns it as it was.
    fn claim(&self, call_id: &str, from: &[CommitState], to: CommitState) -> Option<PendingCommit> {
        let mut table = self.table.lock().ok()?;
        let entry = table.get_mut(call_id)?;
        if !from.contains(&entry.state) {
            return None;
        }
        let before = entry.clone();
        entry.state = to;
        Some(before)
    }

    fn set(&self, call_id: &str, state: CommitState) {
        self.set_owing(call_id, state, None);
    }

    /// Sets the call's state and adds `owed` to the events it owes; returns them all.
    fn set_owing(
        &self,
        call_id: &str,
        state: CommitState,
        owed: Option<UnrecordedEvent>,
    ) -> Vec<UnrecordedEvent> {
        let mut all = Vec::new();
        if let Ok(mut table) = self.table.lock() {
            if let Some(entry) = table.get_mut(call_id) {
                entry.state = state;
                if state.is_final() {
                    entry.token.clear();
                }
                entry.unrecorded.extend(owed);
                all = entry.unrecorded.clone();
            }
            if table.len() > MAX_PENDING + MAX_DECIDED {
                // Forget the decided calls whose deadline is oldest (never one that
                // still owes an event).
                let mut decided: Vec<(i64, String)> = table
                    .values()
                    .filter(|e| e.state.is_final() && e.unrecorded.is_empty())
                    .map(|e| (e.deadline_ms, e.call_id.clone()))
                    .collect();
                decided.sort();
                let excess = table.len() - (MAX_PENDING + MAX_DECIDED);
                for (_, id) in decided.into_iter().take(excess) {
                    table.remove(&id);
                }
            }
        }
        all
    }

    /// The call as the table holds it.
    fn entry(&self, call_id: &str) -> Option<PendingCommit> {
        self.table.lock().ok()?.get(call_id).cloned()
    }

    /// Notes that the event `outcome_id` of the call is in the log; returns the events
    /// it still owes.
    fn recorded(&self, call_id: &str, outcome_id: &str) -> Vec<UnrecordedEvent> {
        let Ok(mut table) = self.table.lock() else {
            return Vec::new();
        };
        let Some(entry) = table.get_mut(call_id) else {
            return Vec::new();
        };
        entry.unrecorded.retain(|e| e.outcome_id() != outcome_id);
        entry.unrecorded.clone()
    }

    /// The calls that owe outcome events.
    fn owing(&self) -> Vec<String> {
        self.table
            .lock()
            .map(|t| {
                t.values()
                    .filter(|e| !e.unrecorded.is_empty())
                    .map(|e| e.call_id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Gateway {
    /// Refuses a call to a two-phase tool before anything runs when its commit could
    /// not be held (store unavailable or full).
    pub(crate) fn two_phase_room(&self) -> Result<(), Refusal> {
        self.two_phase.room()
    }

    /// Records a prepared call (durable before the caller hears of it) and returns its
    /// details for the response and the closing event: `phase`, `commit.commit_id`,
    /// `commit.deadline`.
    pub(crate) async fn record_prepared(
        &self,
        call: Prepared<'_>,
        token: String,
        commit_within_s: u64,
    ) -> Result<Map<String, Value>, Refusal> {
        let store = self.two_phase.store()?;
        let now = now_ms();
        let deadline_ms = now.saturating_add(i64::try_from(commit_within_s).unwrap_or(0) * 1000);
        let row = PendingCommit {
            call_id: call.call_id.to_string(),
            commit_id: format!("commit-{}", uuid::Uuid::new_v4()),
            run_id: call.run_id.to_string(),
            role_id: call.role_id.to_string(),
            lane_id: call.lane_id.to_string(),
            tool_name: call.tool_name.to_string(),
            tool_version: call.tool_version.to_string(),
            token_sha256: sha256_hex(token.as_bytes()),
            token,
            deadline_ms,
            state: CommitState::Pending,
            unrecorded: Vec::new(),
        };
        let stored = row.clone();
        let inserted = blocking(store, move |s| s.insert(&stored, now)).await;
        let details = prepared_details(&row);
        let call_id = row.call_id.clone();
        self.two_phase.lock()?.insert(call_id.clone(), row);
        if let Err(e) = inserted {
            // Not held durably: the caller is refused and the prepare rolled back now.
            self.roll_back(&call_id, &[CommitState::Pending], "not_held")
                .await;
            return Err(unavailable(&e.to_string()));
        }
        self.two_phase.wake.notify_one();
        Ok(details)
    }

    /// A prepared call whose response could not be given (its closing event was not
    /// written): rolled back at once.
    pub(crate) async fn abandon_prepared(&self, call_id: &str) {
        self.roll_back(call_id, &[CommitState::Pending], "not_delivered")
            .await;
    }

    /// `POST /v1/tool-calls/{call_id}/commit`: commits a prepared call for the role and
    /// run that made it, within its deadline, once. Every request that names a call
    /// is audited (`tool_committed`, `tool_commit_refused` or `tool_commit_failed`).
    pub async fn commit(
        &self,
        token: Option<&str>,
        call_id: &str,
        request: Commit,
    ) -> Result<Committed, Refusal> {
        let known = self
            .two_phase
            .lock()?
            .get(call_id)
            .filter(|e| e.commit_id == request.commit_id)
            .cloned();
        // In a fleet the run, the run token and the safety lock are read from the cluster
        // database first, as for a call: a run suspended or closed, or a token revoked,
        // through another sidecar refuses the commit here, and a database that cannot
        // be asked refuses it too.
        let fleet_checked = match self.cluster {
            Some(_) => self
                .fleet_preflight(token, &request.run_id)
                .await
                .map(|run| Some(run.map(Arc::new))),
            None => Ok(None),
        };
        // One policy snapshot and the credential, resolved as for a call.
        let loaded = self.current();
        let credential = self.credential(&loaded.policy, token).await;
        let decided = fleet_checked.and_then(|fleet_run| {
            let decision = CommitDecision {
                loaded: &loaded,
                caller: credential.caller(),
                fleet_run,
            };
            self.decide_commit(decision, call_id, &request, known.as_ref())
        });
        let entry = match decided {
            Ok(entry) => entry,
            Err(refusal) => {
                let mut event = refusal_event(call_id, known.as_ref(), &request);
                add_refusal(&mut event, &refusal);
                if let Some(caller) = credential.caller_json() {
                    event.details.insert("caller".into(), caller);
                }
                self.audit
                    .append(event)
                    .await
                    .map_err(super::audit_refusal)?;
                return Err(refusal);
            }
        };
        let store = self.two_phase.store()?;
        let id = entry.call_id.clone();
        if let Err(e) = blocking(store.clone(), move |s| {
            s.set_state(&id, CommitState::Committing, now_ms())
        })
        .await
        {
            self.two_phase.set(&entry.call_id, CommitState::Pending);
            let refusal = unavailable(&e.to_string());
            let mut event = refusal_event(call_id, Some(&entry), &request);
            add_refusal(&mut event, &refusal);
            self.audit
                .append(event)
                .await
                .map_err(super::audit_refusal)?;
            return Err(refusal);
        }
        // Written ahead: the upstream commit runs only once its request is recorded.
        let mut requested = phase_event(EventType::ToolCommitRequested, &entry, "request", 0);
        requested.details.remove("attempts");
        if let Err(e) = self.audit.append(requested).await {
            // Nothing was sent upstream: the call is pending again, and the same commit
            // may be retried.
            self.persist(&entry.call_id, CommitState::Pending).await;
            return Err(Refusal::new(
                Reason::AuditUnavailable,
                format!(
                    "the commit request could not be recorded, so nothing was sent upstream; \
                     the call is still pending and the commit may be retried: {e}"
                ),
            )
            .with_retryable(true));
        }
        self.finish_commit(entry, "request").await
    }

    /// A commit request whose body is malformed. A caller that is not authenticated
    /// is refused unrecorded (what it can make the log keep stays bounded: nothing);
    /// an authenticated one's request names a call, so it is audited, once, as
    /// `tool_commit_refused` with the problem.
    pub async fn refuse_malformed_commit(
        &self,
        token: Option<&str>,
        call_id: &str,
        malformed: Refusal,
    ) -> Refusal {
        // In a fleet the run token is read from the cluster database first (a failure
        // leaves the local copy, which can only be staler).
        let _ = self.fleet_refresh(token, None).await;
        let loaded = self.current();
        let credential = self.credential(&loaded.policy, token).await;
        let authenticated = match &credential.run {
            Some(Ok(_)) => Ok(()),
            Some(Err(dead)) => Err(dead.clone()),
            None => self.verify_any(token),
        };
        if let Err(unauthenticated) = authenticated {
            return unauthenticated;
        }
        let mut event = malformed_event(call_id);
        add_refusal(&mut event, &malformed);
        if let Some(caller) = credential.caller_json() {
            event.details.insert("caller".into(), caller);
        }
        match self.audit.append(event).await {
            Ok(_) => malformed,
            Err(e) => super::audit_refusal(e),
        }
    }

    /// The checks of a commit request, in order: the caller proves the role it names
    /// (and a run token its run), the call and commit id are known, the role and run
    /// are the call's, the audit log has room, the safety lock is released; then the
    /// commit is decided like a call of its run and lane (`authz::admit`, steps 2-4,
    /// and steps 5-6 for its tool) under the loaded policy, which the run's calls are
    /// decided under now: whatever refuses such a call (a run token of other lanes, a
    /// run pinned to other policy versions, the run's status, the role, lane or tool
    /// no longer permitting it) refuses its commit. Last, the call is still pending
    /// within its deadline. Claims it.
    fn decide_commit(
        &self,
        decision: CommitDecision<'_>,
        call_id: &str,
        request: &Commit,
        known: Option<&PendingCommit>,
    ) -> Result<PendingCommit, Refusal> {
        let CommitDecision {
            loaded,
            caller,
            fleet_run,
        } = decision;
        let policy = &loaded.policy;
        // Authenticated before anything about the call is revealed.
        authz::verify_caller(policy, caller, &request.role_id)?;
        if let Caller::Run(Ok(binding)) = caller {
            authz::check_token_run(binding, &request.run_id)?;
        }
        let Some(entry) = known else {
            return Err(Refusal::new(
                Reason::CommitUnknown,
                format!(
                    "no prepared call `{}` with this commit_id",
                    bounded(call_id)
                ),
            ));
        };
        if entry.role_id != request.role_id || entry.run_id != request.run_id {
            return Err(Refusal::new(
                Reason::CommitNotAllowed,
                "the call was prepared by another run or role; only they may commit it",
            ));
        }
        // The audit log must have room for the commit's events, as for a call's.
        if let Some(refusal) = self.capacity_refusal() {
            return Err(refusal);
        }
        // The commit is where the side effect happens: what refuses a call now refuses
        // its commit too.
        let lock = self.safety_lock();
        if lock.engaged {
            return Err(Refusal::new(
                Reason::SafetyLockEngaged,
                "the safety lock is engaged; no commit is executed",
            )
            .with_details(json!({ "lock_reason": lock.reason })));
        }
        // In a fleet, only what the cluster database said just now (as for a call).
        let run = match fleet_run {
            Some(run) => run,
            None => self.runs.shared(&entry.run_id),
        };
        let acting = authz::Acting {
            role_id: &entry.role_id,
            run_id: &entry.run_id,
            lane_id: &entry.lane_id,
        };
        let runs = move |run_id: &str| run.filter(|r| r.run_id == run_id);
        let admitted = authz::admit(policy, caller, acting, runs, &mut Trace::default())?;
        let tool = authz::find_tool(policy, &entry.tool_name)?;
        authz::lane_permits(admitted.lane, tool)?;
        let now = now_ms();
        let mut table = self.two_phase.lock()?;
        let Some(current) = table.get_mut(call_id) else {
            return Err(Refusal::new(
                Reason::CommitUnknown,
                "the prepared call is no longer known",
            ));
        };
        match current.state {
            CommitState::Pending if now < current.deadline_ms => {
                let before = current.clone();
                current.state = CommitState::Committing;
                Ok(before)
            }
            CommitState::Pending => {
                self.two_phase.wake.notify_one();
                Err(Refusal::new(
                    Reason::CommitExpired,
                    "the commit deadline has passed; the call is being rolled back",
                )
                .with_details(json!({ "state": "rolling_back", "commit_deadline": rfc3339(current.deadline_ms) })))
            }
            CommitState::Committing | CommitState::Committed => Err(Refusal::new(
                Reason::CommitAlreadyUsed,
                "the call was already committed; a commit is never replayed",
            )
            .with_details(json!({ "state": current.state.as_str() }))),
            state => Err(Refusal::new(
                Reason::CommitExpired,
                "the call was rolled back (or its commit failed); it can no longer be committed",
            )
            .with_details(json!({ "state": state.as_str() }))),
        }
    }

    /// Runs the claimed commit upstream and records its outcome; a failed commit is
    /// rolled back.
    async fn finish_commit(
        &self,
        entry: PendingCommit,
        trigger: &str,
    ) -> Result<Committed, Refusal> {
        let outcome = self.run_phase(&entry, Phase::Commit).await;
        let attempts = outcome.attempts;
        let sandbox = outcome.sandbox;
        match outcome.result {
            Ok(mut answer) => {
                let token_field = self.token_field(&entry.tool_name);
                if let Some(o) = answer.as_object_mut() {
                    o.remove(&token_field);
                }
                let mut event = phase_event(EventType::ToolCommitted, &entry, trigger, attempts);
                with_sandbox(&mut event, sandbox);
                event.output_hash_sha256 =
                    Some(sha256_hex(&crate::canonical::to_canonical_bytes(&answer)));
                let appended = self
                    .record_outcome(&entry.call_id, CommitState::Committed, event)
                    .await
                    .map_err(|e| {
                        Refusal::new(
                            Reason::AuditUnavailable,
                            format!(
                                "the call was committed, but the audit log could not record it yet; \
                                 its tool_committed is recorded once the log takes it; no output \
                                 is returned: {e}"
                            ),
                        )
                        .at_step(12)
                        .with_retryable(false)
                    })?;
                Ok(Committed {
                    call_id: entry.call_id,
                    commit_id: entry.commit_id,
                    status: "success",
                    phase: "committed",
                    attempts,
                    output: answer,
                    audit_event_id: appended.event_id,
                })
            }
            Err(error) => {
                let mut refusal = phase_refusal(
                    Reason::CommitFailed,
                    &entry,
                    Phase::Commit,
                    &error,
                    attempts,
                );
                let mut event = phase_event(EventType::ToolCommitFailed, &entry, trigger, attempts);
                with_sandbox(&mut event, sandbox);
                add_refusal(&mut event, &refusal);
                let recorded = self
                    .record_outcome(&entry.call_id, CommitState::CommitFailed, event)
                    .await;
                let rolled = self
                    .roll_back(
                        &entry.call_id,
                        &[CommitState::CommitFailed],
                        "commit_failed",
                    )
                    .await;
                if let Value::Object(d) = &mut refusal.details {
                    d.insert("rollback".into(), json!(rolled.as_str()));
                }
                recorded.map_err(super::audit_refusal)?;
                Err(refusal)
            }
        }
    }

    /// Rolls a call back if its state is one of `from`; returns the state it ends in.
    async fn roll_back(&self, call_id: &str, from: &[CommitState], trigger: &str) -> CommitState {
        let Some(entry) = self
            .two_phase
            .claim(call_id, from, CommitState::RollingBack)
        else {
            return self
                .two_phase
                .table
                .lock()
                .ok()
                .and_then(|t| t.get(call_id).map(|e| e.state))
                .unwrap_or(CommitState::RolledBack);
        };
        self.persist(call_id, CommitState::RollingBack).await;
        let outcome = self.run_phase(&entry, Phase::Rollback).await;
        let attempts = outcome.attempts;
        let (state, mut event) = match outcome.result {
            Ok(_) => (
                CommitState::RolledBack,
                phase_event(EventType::ToolRolledBack, &entry, trigger, attempts),
            ),
            Err(error) => {
                let refusal = phase_refusal(
                    Reason::RollbackFailed,
                    &entry,
                    Phase::Rollback,
                    &error,
                    attempts,
                );
                let mut event =
                    phase_event(EventType::ToolRollbackFailed, &entry, trigger, attempts);
                add_refusal(&mut event, &refusal);
                (CommitState::RollbackFailed, event)
            }
        };
        with_sandbox(&mut event, outcome.sandbox);
        if let Err(e) = self.record_outcome(call_id, state, event).await {
            tracing::error!(call_id, error = %e, "the audit log could not record a rollback yet; it is recorded at the next chance");
        }
        state
    }

    /// Runs a phase with the current policy's runner of the call's tool.
    async fn run_phase(&self, entry: &PendingCommit, phase: Phase) -> PhaseOutcome {
        let loaded = self.current();
        let runner = loaded.adapters.phases.get(&entry.tool_name);
        let tool = loaded.policy.tools.get(&entry.tool_name);
        match (runner, tool) {
            (Some(runner), Some(tool)) => {
                runner
                    .run(
                        tool,
                        phase,
                        &entry.token,
                        &entry.call_id,
                        &entry.commit_id,
                        &entry.run_id,
                    )
                    .await
            }
            _ => PhaseOutcome {
                attempts: 0,
                result: Err(ExecError::NotImplemented(format!(
                    "tool `{}` no longer declares phases in the loaded policy",
                    entry.tool_name
                ))),
                sandbox: None,
            },
        }
    }

    fn token_field(&self, tool_name: &str) -> String {
        self.current()
            .policy
            .tools
            .get(tool_name)
            .and_then(|t| t.phases.as_ref())
            .map_or(crate::policy::DEFAULT_TOKEN_FIELD.to_string(), |p| {
                p.token_field.clone()
            })
    }

    /// Makes a state change durable and visible. A store that cannot be written is
    /// logged; the in-memory state still changes (the phase already happened
    /// upstream), and a restart resumes from the last durable state.
    async fn persist(&self, call_id: &str, state: CommitState) {
        self.two_phase.set(call_id, state);
        let id = call_id.to_string();
        self.store_write(call_id, move |s| s.set_state(&id, state, now_ms()))
            .await;
    }

    /// Writes to the state store; a store that cannot be written is logged (the
    /// in-memory state already changed, and a restart resumes from the last durable
    /// state).
    async fn store_write(
        &self,
        call_id: &str,
        write: impl FnOnce(&PhaseStore) -> Result<(), StateError> + Send + 'static,
    ) {
        let Ok(store) = self.two_phase.store() else {
            return;
        };
        if let Err(e) = blocking(store, write).await {
            tracing::error!(call_id, error = %e, "the two-phase state could not be written");
        }
    }

    /// Starts the task that rolls prepared calls back at their deadline. First it
    /// finishes what a stopped gateway left: calls whose deadline passed while it was
    /// down are rolled back, commits and rollbacks under way are run again (the
    /// upstream treats a repeated phase of one token as the same request).
    pub fn spawn_phase_reaper(self: &Arc<Self>) {
        let gateway = self.clone();
        tokio::spawn(async move {
            gateway.resume_phases().await;
            loop {
                let owing = gateway.record_owed().await;
                let next = gateway.roll_back_expired().await;
                let mut wait = next.map_or(REAPER_IDLE, |deadline| {
                    Duration::from_millis(u64::try_from(deadline - now_ms()).unwrap_or(0))
                        .min(REAPER_IDLE)
                });
                if owing {
                    wait = wait.min(OWED_RETRY);
                }
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = gateway.two_phase.wake.notified() => {}
                }
            }
        });
    }

    async fn resume_phases(&self) {
        // What the log could not take before the stop comes first, in order.
        self.record_owed().await;
        // Only what the stop interrupted: a commit a request began since the start (the
        // reaper may run after the first requests) is that request's to finish.
        let unfinished: Vec<PendingCommit> = match self.two_phase.table.lock() {
            Ok(t) => t
                .values()
                .filter(|e| self.two_phase.interrupted.contains(&e.call_id))
                .filter(|e| is_unfinished(e.state))
                .cloned()
                .collect(),
            Err(_) => Vec::new(),
        };
        for entry in unfinished {
            if entry.state == CommitState::Committing {
                self.resume_commit(entry).await;
            } else {
                let from = [
                    CommitState::RollingBack,
                    CommitState::CommitFailed,
                    CommitState::RollbackFailed,
                ];
                self.roll_back(&entry.call_id, &from, "resumed").await;
            }
        }
    }

    /// A commit a stop interrupted: run again if its `tool_commit_requested` is in the
    /// log (the upstream may have seen it; its idempotence makes the repeat safe);
    /// otherwise it was never sent upstream and the call is pending again.
    async fn resume_commit(&self, entry: PendingCommit) {
        match self.commit_request_in_log(&entry).await {
            Ok(true) => {
                let _ = self.finish_commit(entry, "resumed").await;
            }
            Ok(false) => self.persist(&entry.call_id, CommitState::Pending).await,
            Err(e) => {
                tracing::error!(call_id = %entry.call_id, error = %e, "the audit log could not be read; the interrupted commit is resumed at the next start");
            }
        }
    }

    /// Rolls back every pending call past its deadline; returns the next deadline.
    async fn roll_back_expired(&self) -> Option<i64> {
        let now = now_ms();
        let (expired, next) = match self.two_phase.table.lock() {
            Ok(t) => {
                let pending = t.values().filter(|e| e.state == CommitState::Pending);
                let expired: Vec<(String, i64)> = pending
                    .clone()
                    .filter(|e| e.deadline_ms <= now)
                    .map(|e| (e.call_id.clone(), e.deadline_ms))
                    .collect();
                let next = pending
                    .filter(|e| e.deadline_ms > now)
                    .map(|e| e.deadline_ms)
                    .min();
                (expired, next)
            }
            Err(_) => (Vec::new(), None),
        };
        for (call_id, deadline) in expired {
            let trigger = if deadline < self.two_phase.started_ms {
                "deadline_passed_while_down"
            } else {
                "deadline"
            };
            self.roll_back(&call_id, &[CommitState::Pending], trigger)
                .await;
        }
        next
    }
}

/// A refusal of the two-phase state store.
fn unavailable(why: &str) -> Refusal {
    Refusal::new(
        Reason::CommitStateUnavailable,
        format!("the two-phase state store is unavailable: {why}"),
    )
}

async fn blocking<T: Send + 'static>(
    store: Arc<PhaseStore>,
    f: impl FnOnce(&PhaseStore) -> Result<T, StateError> + Send + 'static,
) -> Result<T, StateError> {
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .unwrap_or_else(|_| Err(StateError("the state task failed".into())))
}

fn now_ms() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp_nanos() as i64 / 1_000_000
}

fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// A caller-given id, cut to 256 bytes for the audit log.
fn bounded(s: &str) -> String {
    crate::text::prefix_bytes(s, 256).to_string()
}

fn bounded_error(s: &str) -> String {
    crate::text::prefix_bytes(s, crate::adapter::MAX_TOOL_ERROR_BYTES).to_string()
}
