//! The 13-step tool-call pipeline of the gateway contract, in order ([`Gateway::handle`]):
//! `run_steps` takes a call through steps 1-11 and returns how it ended, and `steps`
//! closes it with its one `close` (steps 12 and 13). A step that fails stops the call
//! there: its refusal (`?`) skips to step 12 (the closing audit event) and step 13 (the
//! response).
//!
//! INVARIANT: a tool is executed only after steps 2-8 passed and its `tool_requested`
//! event is durable (step 9); every call, allowed or not, ends with exactly one closing
//! event (step 12) whose id the response carries; if that event cannot be written, no
//! output is returned (fail closed).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::adapter::{Adapter, ExecContext, ExecError};
use crate::artifacts::ArtifactOwner;
use crate::audit::{Appended, AuditError, EventType, NewEvent};
use crate::authz;
use crate::call::{
    ArtifactRef, CallRequest, CallResponse, CallSignals, Decision, DryRun, PartialRequest,
    Received, Status, Trace, Verdict,
};
use crate::canonical::{Portable, sha256_hex, to_canonical_bytes};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::add_refusal;
use crate::gateway::{FLEET_CLAIM_SLACK, FLEET_CLAIM_WAIT_MAX, Gateway, Loaded, SafetyLock};
use crate::idempotency::{Claim, MAX_INLINE_OUTPUT_BYTES, Outcome};
use crate::observe::metrics::{AppendKind, CallRecord};
use crate::observe::trace::{self, TraceParent};
use crate::policy::{Redaction, Role, Tool};
use crate::runs::RunRecord;

mod held;
use held::{Claimed, Held, HeldKey, KeyClaim};

/// How long past its deadline an adapter may take to report the timeout before the
/// pipeline stops waiting (the adapter's own kill runs at the deadline).
const DEADLINE_BACKSTOP: Duration = Duration::from_millis(50);

/// A call that passed steps 1-8.
struct Allowed<'p> {
    request: CallRequest,
    role: &'p Role,
    tool: &'p Tool,
    adapter: &'p Adapter,
    run: Arc<RunRecord>,
    /// The effective scope (run and call merged): what the tool executes with.
    scope: authz::EffectiveScope,
    /// The validated, sanitized, normalized arguments: what runs and what is hashed.
    arguments: Value,
}

/// How steps 1-11 ended a call they did not refuse: what steps 12 and 13 record and
/// answer (a refusal is the other way a call ends).
enum Ended {
    /// Executed and captured (step 11), with the closing event's details.
    Executed(Captured, Map<String, Value>),
    /// A dry run that steps 1-8 allowed: audited as `tool_allowed`, never executed.
    DryRun,
    /// A repeat of an idempotent call: the first call's outcome, nothing executed.
    Replay(Outcome),
}

/// Why step 10 failed, and whether the request reached the tool: false only when the
/// adapter says nothing was sent to it ([`ExecError::reached_tool`]).
struct ExecFailure {
    refusal: Refusal,
    reached_tool: bool,
}

/// What a successful execution produced (step 11).
struct Captured {
    output: Option<Value>,
    artifact: Option<ArtifactRef>,
    output_hash: String,
    tool_ms: u64,
}

/// What the pipeline knows about the call so far, for its audit events and response.
struct Call {
    call_id: String,
    started: Instant,
    ids: PartialRequest,
    tool_version: Option<String>,
    /// The arguments as received, then as normalized once step 8 passed.
    arguments: Option<Value>,
    /// The audit fields derived from `arguments` (hash, commitment, redacted form),
    /// computed for the first event and reused by the closing event. Cleared whenever
    /// `arguments` or `redaction` change.
    committed: Option<CommittedArguments>,
    /// The scope as received (case and matter ids, flags), kept for replay and review.
    scope: Option<Map<String, Value>>,
    /// `scope` in the line's form, rendered for the first event that records it
    /// (None inside when it cannot be, and the log judges the JSON). `scope` never
    /// changes once the call is received, so the rendering stays true.
    scope_portable: Option<Option<Portable>>,
    /// Bounded digests of what a malformed request carried (see
    /// `call::PartialRequest::received`), recorded as `details.received`.
    received: Map<String, Value>,
    /// How to keep the arguments readable; unknown until the tool is found, and then
    /// only the hash and the commitment are kept.
    redaction: Redaction,
    trace: Trace,
    dry_run: bool,
    /// Whether a failed execution may be retried: the tool is idempotent and the call
    /// carries an idempotency key (contract: retry rule).
    retry_safe: bool,
    /// Whether the adapter was started: from then on a retry may repeat a side effect.
    executed: bool,
    /// The versions of the policy snapshot deciding this call.
    policy_versions: Arc<crate::policy::PolicyVersions>,
    /// How long the adapter ran (step 10), for the metrics.
    tool_time: Option<Duration>,
    /// The call's trace span (disabled unless traces are exported).
    span: Span,
    /// Who called, beyond the role, when the credential says more (a run token's id),
    /// recorded as `details.caller`.
    caller: Option<Value>,
    /// The approval this call runs under (claimed at the approval gate), recorded as
    /// `details.approval`.
    approval: Option<Value>,
    /// The sandbox a local tool process ran in (`details.sandbox`), and its CPU time
    /// and peak memory for the response's `metrics`.
    sandbox: Option<crate::sandbox::Evidence>,
    /// Whether the caller's bearer token is a JWT that verified at step 2: only then
    /// is it handed to the adapter (the subject token of a `token_exchange`).
    jwt_verified: bool,
    /// `{sub, act}` of a token exchanged for the caller's JWT and sent upstream
    /// (`details.delegation`).
    delegation: Option<Value>,
}

/// What step 10 hands the adapter beyond the call, and where it reports back.
#[derive(Clone, Copy)]
struct Reported<'a> {
    /// The sandbox evidence of a local process (`details.sandbox`).
    evidence: &'a crate::sandbox::EvidenceSlot,
    /// The delegation of an exchanged token (`details.delegation`).
    delegation: &'a crate::adapter::DelegationSlot,
    /// The caller's verified JWT, as sent.
    subject_token: Option<&'a str>,
}

/// What the audit events of a call record about its arguments.
#[derive(Clone)]
struct CommittedArguments {
    sha256: Option<String>,
    hmac_sha256: Option<String>,
    /// The arguments as kept readable (after the tool's redaction), if any.
    readable: Option<Value>,
    /// `readable` in the line's form, rendered once for both events; None when there
    /// is nothing readable or it cannot be rendered (nested too deep), and the events
    /// then carry `readable` for the log to judge.
    rendered: Option<Portable>,
}

pub use crate::authz::Caller;

/// Steps 1-8: the decision. Reads only what it is given (the policy snapshot, the run
/// table, the lock state): no I/O beyond the adapter's sanitization, no clock.
fn decide<'p>(
    loaded: &'p Loaded,
    caller: Caller<'_>,
    request: Received,
    runs: &dyn Fn(&str) -> Option<Arc<RunRecord>>,
    lock: &SafetyLock,
    call: &mut Call,
) -> Result<Allowed<'p>, Refusal> {
    // 1. receive request
    let request = request.map_err(|rejected| rejected.0)?;
    if lock.engaged {
        return Err(Refusal::new(
            Reason::SafetyLockEngaged,
            "the safety lock is engaged; no tool call is executed",
        )
        .with_details(json!({ "lock_reason": lock.reason })));
    }
    call.trace.passed_step = 1;

    // 2-4. verify caller identity (role_id); verify run_id exists (and is pinned to
    //      the loaded policy versions); validate lane authorization for the role (and
    //      the run's status); a run token acts only in its own run and lanes
    let policy = &loaded.policy;
    let acting = authz::Acting {
        role_id: &request.role_id,
        run_id: &request.run_id,
        lane_id: &request.lane_id,
    };
    let authz::Admitted { role, run, lane } =
        authz::admit(policy, caller, acting, runs, &mut call.trace)?;

    // 5. validate the tool is registered and enabled
    let tool = authz::find_tool(policy, &request.tool_name)?;
    call.tool_version = Some(tool.version.to_string());
    call.redaction = tool.redaction.clone();
    call.committed = None;
    call.retry_safe = tool.idempotent && request.idempotency_key.is_some();
    call.trace.tool = Some(format!("{}@{}", tool.tool_name, tool.version));
    call.trace.passed_step = 5;

    // 6. validate the lane permits tool_name
    authz::lane_permits(lane, tool)?;
    call.trace.passed_step = 6;

    // 7. validate required scope keys (lane and tool) on the effective scope: the run's
    //    scope merged with the call's, which may not contradict it
    let scope = authz::check_scope(lane, tool, &request.scope, &run)?;
    call.trace.effective_scope = Some(scope.scope.clone());
    call.trace.scope_from_run = scope.from_run.clone();
    call.trace.passed_step = 7;

    // 8. enforce prohibition rules (lane and tool), on arguments that were first
    //    validated against the input schema, sanitized and normalized
    authz::check_arguments(tool, &request.arguments)?;
    let adapter = loaded.adapter(&tool.tool_name)?;
    adapter.validate(tool, &request.arguments, &scope.scope)?;
    let arguments = adapter.normalize(tool, &request.arguments);
    call.arguments = Some(arguments.clone());
    call.committed = None;
    call.trace.flags = authz::raised_flags(tool, &scope.scope, &arguments);
    authz::check_prohibitions(lane, tool, &call.trace.flags, &scope)?;
    //    and every condition of the lane and the tool holds
    let needs_vars =
        |a: &Option<crate::policy::Approval>| a.as_ref().is_some_and(|a| a.when.is_some());
    let vars = (!lane.conditions.is_empty()
        || !tool.conditions.is_empty()
        || needs_vars(&lane.approval)
        || needs_vars(&tool.approval))
    .then(|| authz::condition_variables(role, lane, tool, &run, &scope, &arguments));
    if let Some(vars) = &vars
        && (!lane.conditions.is_empty() || !tool.conditions.is_empty())
    {
        call.trace.conditions = authz::evaluate_conditions(lane, tool, vars);
        authz::check_conditions(lane, tool, &call.trace.conditions)?;
    }
    //    and which human approvals the call needs (granted or not: the gate after
    //    step 8 decides, with the approval store)
    call.trace.approval = authz::approval_requirements(lane, tool, vars.as_ref());
    //    and the budgets and rates it will be counted against (claimed by the
    //    pipeline right after this pure decision)
    call.trace.limits = authz::limit_claims(lane, tool, &run, role, &scope.scope, &arguments);
    call.trace.passed_step = 8;

    Ok(Allowed {
        request,
        role,
        tool,
        adapter,
        run,
        scope,
        arguments,
    })
}

/// The decision of steps 1-8 for one request, offline: nothing is executed or audited.
/// `policy explain`, `policy test` and replay use it.
pub fn explain(loaded: &Loaded, request: CallRequest, run: Option<RunRecord>) -> Explanation {
    explain_as(loaded, Caller::Offline, request, run)
}

/// [`explain`] for a given caller: shadow mode verifies the live caller's token against
/// the candidate policy's credentials.
pub fn explain_as(
    loaded: &Loaded,
    caller: Caller<'_>,
    request: CallRequest,
    run: Option<RunRecord>,
) -> Explanation {
    let mut call = Call::new(&Ok(request.clone()), loaded.shared_versions());
    let run = run.map(Arc::new);
    let runs = move |id: &str| run.clone().filter(|r| r.run_id == id);
    let decided = decide(
        loaded,
        caller,
        Ok(request),
        &runs,
        &SafetyLock::default(),
        &mut call,
    );
    let refusal = decided.err();
    if let Some(r) = &refusal {
        call.trace.failed = Some(format!("{}:{}", r.step(), r.reason.as_str()));
    }
    Explanation {
        trace: call.trace,
        refusal,
    }
}

/// What `explain` found.
#[derive(Debug, Clone)]
pub struct Explanation {
    pub trace: Trace,
    /// The first failing check, or None when steps 1-8 all pass.
    pub refusal: Option<Refusal>,
}

impl Explanation {
    pub fn verdict(&self) -> Verdict {
        Verdict::of(self.refusal.as_ref())
    }

    /// One line per step 1-8: pass, fail (with the message) or not reached.
    pub fn steps(&self) -> Vec<(u8, &'static str, String)> {
        (1..=8u8)
            .map(|step| {
                let name = crate::call::STEP_NAMES[usize::from(step) - 1];
                let outcome = if step <= self.trace.passed_step {
                    "pass".to_string()
                } else if step == self.trace.passed_step + 1 {
                    match &self.refusal {
                        Some(r) => format!("fail: {} ({})", r.message, r.reason.as_str()),
                        None => "pass".to_string(),
                    }
                } else {
                    "not reached".to_string()
                };
                (step, name, outcome)
            })
            .collect()
    }
}

impl Gateway {
    /// Runs one tool call through the 13 steps and returns its response.
    pub async fn handle(&self, token: Option<&str>, request: Received) -> CallResponse {
        self.handle_traced(token, request, None).await
    }

    /// [`Gateway::handle`] inside the call's trace span (continuing the caller's trace
    /// when it sent a `traceparent`), counted in the metrics and logged.
    pub async fn handle_traced(
        &self,
        token: Option<&str>,
        request: Received,
        parent: Option<&TraceParent>,
    ) -> CallResponse {
        self.handle_signalled(token, request, parent, CallSignals::default())
            .await
    }

    /// [`Gateway::handle_traced`] for a caller that may cancel the call or hear its
    /// progress (`signals`): a cancelled call stops executing and closes as
    /// `cancelled` (status failed) with its one closing event.
    pub async fn handle_signalled(
        &self,
        token: Option<&str>,
        request: Received,
        parent: Option<&TraceParent>,
        signals: CallSignals,
    ) -> CallResponse {
        let span = trace::call_span(parent);
        if let Some(method) = signals.mcp_method {
            trace::record_mcp_method(&span, method);
        }
        let _in_flight = self.metrics.in_flight();
        // Boxed: the steps' state machine is large, and a boxed one is not copied again
        // each time the call's task moves it (spawn, poll, completion).
        let steps = Box::pin(self.steps(token, request, &signals));
        let response = steps.instrument(span.clone()).await;
        let trace_id = match parent {
            Some(p) => Some(p.trace_id_hex()),
            None => trace::exported_trace_id(&span),
        };
        trace::log_call(&response, trace_id.as_deref());
        response
    }

    /// The 13 steps. Steps 1-11 ([`Gateway::run_steps`]) end the call one way or
    /// another; steps 12 and 13 close it here, once, and what the call held on the way
    /// is settled once after that.
    async fn steps(
        &self,
        token: Option<&str>,
        request: Received,
        signals: &CallSignals,
    ) -> CallResponse {
        // One policy snapshot for the whole call: a reload never mixes two policies.
        let loaded: Arc<Loaded> = self.current();
        let mut call = Call::new(&request, loaded.shared_versions());
        let mut held = Held::default();
        let ended = self
            .run_steps(&loaded, token, request, signals, &mut call, &mut held)
            .await;
        // An admitted call that reached no tool executed nothing: it is not counted.
        if !call.executed {
            held.admission.refund().await;
        }
        let call_id = call.call_id.clone();
        // 12. emit audit event: tool_executed | tool_failed | tool_denied | tool_timeout
        // 13. return the response
        let response = self.close(call, ended).await;
        held.settle(self, &call_id, &response).await;
        response
    }

    /// Steps 1-11 of one call, up to how it ended: executed, a dry run, a repeat of an
    /// idempotent call, or refused at the step its refusal names. What the call holds
    /// on the way (its budget counts, its idempotency key, an approval to give back, a
    /// prepared commit) is kept in `held`.
    async fn run_steps(
        &self,
        loaded: &Loaded,
        token: Option<&str>,
        request: Received,
        signals: &CallSignals,
        call: &mut Call,
        held: &mut Held,
    ) -> Result<Ended, Refusal> {
        // Shadow mode: a copy of the request is also decided under the candidate policy.
        let shadowed = self.shadow_copy(&request);

        // 1. (before anything else) the audit log must have room for this call
        if let Some(refusal) = self.capacity_refusal() {
            return Err(refusal);
        }
        // The run when it is not in memory: confirmed by the cluster database in a
        // fleet, read back from the log when it closed long ago.
        let unheld = self.unheld_run(token, &request).await?;

        // 1-8. decide: receive the request and run the authorization checks
        let allowed = self
            .authorize(loaded, token, request, shadowed, unheld, call)
            .await?;
        // 8. (counted) the budgets and rates: claimed at admission, all or none, so a
        //    denied call never counts and concurrent calls never count past a limit;
        //    a dry run is checked, not counted
        held.admission = self
            .admit(&call.trace.limits, !call.dry_run)
            .await
            .inspect_err(|_| call.trace.passed_step = 7)?;
        if call.dry_run {
            return Ok(Ended::DryRun);
        }
        // A two-phase tool's commit must be holdable before anything runs.
        if allowed.tool.phases.is_some() {
            self.two_phase_room()?;
        }

        // 8a. human approval: a call the policy requires approval for runs only under
        //     an approval granted for this exact call, claimed once (the store is
        //     read here, outside the pure decision); waiting for (or refused) an
        //     approval executes nothing
        if !call.trace.approval.is_empty() {
            self.approval_gate(&allowed, call).await?;
        }

        // 9. emit audit event: tool_requested (durable before anything runs; once per
        //    idempotency key, arguments and scope: a repeat returns the first outcome
        //    and writes its own closing event referring to the first call)
        if let Some(claim) = KeyClaim::of(&allowed) {
            match self.claim_key(claim, &allowed, call, signals, held).await? {
                Claimed::First(key) => held.key = Some(key),
                Claimed::Repeat(first) => return Ok(Ended::Replay(first)),
            }
        }
        let event = call.event(self, EventType::ToolRequested);
        self.append_timed(event, AppendKind::Requested)
            .await
            .map_err(|e| {
                Refusal::new(
                    Reason::AuditUnavailable,
                    format!("the audit log could not record the request: {e}"),
                )
            })?;
        call.trace.passed_step = 9;

        let captured = async {
            // 10. execute the tool via its adapter (within its concurrency limit and
            //     deadline); a two-phase tool's commit token is taken out of its output
            let subject_token = token.filter(|_| call.jwt_verified);
            let (output, tool_ms, commit_token) = self
                .execute_step(loaded, &allowed, call, signals, subject_token)
                .await?;
            call.trace.passed_step = 10;

            // 11. capture output and register derived artifacts
            let captured = self
                .capture(&allowed, &call.call_id, output, tool_ms)
                .instrument(trace::step_span("capture", 11))
                .await?;
            call.trace.passed_step = 11;
            Ok((captured, commit_token))
        }
        .await;
        held.executed(captured.as_ref().err(), call, &allowed);
        let (captured, commit_token) = captured?;
        // A prepared call is held (durably) before its response says so.
        let mut details = match (commit_token, &allowed.tool.phases) {
            (Some(token), Some(phases)) => {
                let ids = crate::gateway::phases::Prepared {
                    call_id: &call.call_id,
                    run_id: &allowed.run.run_id,
                    role_id: &allowed.role.role_id,
                    lane_id: &allowed.request.lane_id,
                    tool_name: &allowed.tool.tool_name,
                    tool_version: call.tool_version.as_deref().unwrap_or_default(),
                };
                let details = self
                    .record_prepared(ids, token, phases.commit_within_s)
                    .await?;
                held.prepared = true;
                details
            }
            _ => Map::new(),
        };
        details.insert("tool_ms".into(), json!(captured.tool_ms));
        if !allowed.tool.write_targets.is_empty() {
            details.insert("write_targets".into(), json!(allowed.tool.write_targets));
        }
        if let Some(artifact) = &captured.artifact {
            details.insert("artifact".into(), json!(artifact));
        }
        Ok(Ended::Executed(captured, details))
    }

    /// The run of a call when the gateway may not hold it in memory. In a fleet
    /// (`serve --cluster-db`) the run, the run token and the safety lock are confirmed
    /// from the cluster database, the authority; it being down (or the lock
    /// unconfirmed) refuses the call. Otherwise a run no longer in memory (closed long
    /// ago) is read back from the log, so step 3 still knows it.
    async fn unheld_run(
        &self,
        token: Option<&str>,
        request: &Received,
    ) -> Result<Option<RunRecord>, Refusal> {
        let Ok(request) = request else {
            return Ok(None);
        };
        if self.cluster().is_some() {
            return self.fleet_preflight(token, &request.run_id).await;
        }
        if self.runs.contains(&request.run_id) {
            return Ok(None);
        }
        self.runs
            .load(&self.audit, &request.run_id)
            .await
            .map_err(|e| {
                // Unknown is not "does not exist": refuse rather than guess.
                Refusal::new(
                    Reason::AuditUnavailable,
                    format!("the run could not be looked up in the audit log: {e}"),
                )
                .at_step(3)
            })
    }

    /// Steps 1-8 of a live call: its credential resolved, then the pure decision, with
    /// (in shadow mode) a copy of the request queued for the candidate policy.
    async fn authorize<'l>(
        &self,
        loaded: &'l Loaded,
        token: Option<&str>,
        request: Received,
        shadowed: Option<CallRequest>,
        unheld: Option<RunRecord>,
        call: &mut Call,
    ) -> Result<Allowed<'l>, Refusal> {
        let fleet = self.cluster().is_some();
        let lock = self.safety_lock();
        let unheld = unheld.map(Arc::new);
        let runs = |run_id: &str| {
            if fleet {
                // Only what the cluster database said just now.
                return unheld.clone().filter(|r| r.run_id == run_id);
            }
            self.runs
                .shared(run_id)
                .or_else(|| unheld.clone().filter(|r| r.run_id == run_id))
        };
        // The credential is resolved here (a run token: table lookup, clock, run
        // status; a bearer JWT: key-set cache, clock); who it proves is decided in
        // steps 2-4, which stay pure.
        let credential = self.credential(&loaded.policy, token).await;
        call.caller = credential.caller_json();
        call.jwt_verified = matches!(credential.jwt, Some(Ok(_)));
        let caller = credential.caller();
        let decided = trace::step_span("authorize", 8)
            .in_scope(|| decide(loaded, caller, request, &runs, &lock, call));
        if let Some(copy) = shadowed
            && !lock.engaged
        {
            let verdict = Verdict::of(decided.as_ref().err());
            self.shadow_submit(
                &call.call_id,
                token,
                credential.jwt.as_ref(),
                copy,
                verdict,
                &loaded.policy.versions,
            );
        }
        decided
    }

    /// Step 9's claim of the call's idempotency key. In a fleet the key is claimed in
    /// the cluster database instead of the in-memory table: one sidecar of the fleet
    /// executes, every repeat replays. A repeat executes nothing: it is not counted.
    async fn claim_key(
        &self,
        claim: KeyClaim,
        allowed: &Allowed<'_>,
        call: &Call,
        signals: &CallSignals,
        held: &mut Held,
    ) -> Result<Claimed, Refusal> {
        if let Some(cluster) = self.cluster() {
            let wait = Duration::from_millis(allowed.tool.limits.timeout_ms_max)
                .saturating_add(FLEET_CLAIM_SLACK)
                .min(FLEET_CLAIM_WAIT_MAX);
            let first = self
                .fleet_claim(cluster, &claim.key, &claim.fingerprint, wait)
                .await?;
            return Ok(match first {
                None => Claimed::First(HeldKey::Fleet(claim.key)),
                Some(first) => Claimed::Repeat(Outcome {
                    response: Arc::new(first),
                    spilled_output: None,
                    bytes: 0,
                }),
            });
        }
        let claimed = self.idempotency.claim(claim.key, &claim.fingerprint);
        if !matches!(claimed, Claim::First(_)) {
            // Given back now, not once the first call's outcome was waited for.
            held.admission.refund().await;
        }
        match claimed {
            Claim::First(guard) => Ok(Claimed::First(HeldKey::Local(guard))),
            Claim::Replay(first) => Ok(Claimed::Repeat(first)),
            Claim::Wait(outcome) => self
                .wait_for_first(outcome, allowed, call, signals)
                .await
                .map(Claimed::Repeat),
            Claim::Conflict => Err(Refusal::new(
                Reason::IdempotencyConflict,
                "`idempotency_key` was already used with different arguments or another scope",
            )),
        }
    }

    /// A repeat of a call that is still running waits for its outcome within its own
    /// deadline, and no longer than its caller does.
    async fn wait_for_first(
        &self,
        mut outcome: tokio::sync::watch::Receiver<Option<Outcome>>,
        allowed: &Allowed<'_>,
        call: &Call,
        signals: &CallSignals,
    ) -> Result<Outcome, Refusal> {
        let (timeout_ms, deadline) = call_deadline(allowed, call);
        tokio::select! {
            first = outcome.wait_for(Option::is_some) => {
                first.ok().and_then(|f| f.clone()).ok_or_else(|| Refusal::new(
                    Reason::InternalError,
                    "the first call with this idempotency key ended without an outcome",
                ))
            }
            () = tokio::time::sleep_until(deadline) => {
                let refusal = Adapter::classify_error(allowed.tool, &ExecError::Timeout);
                Err(Refusal {
                    message: format!(
                        "the first call with this idempotency key did not finish within this call's {timeout_ms} ms"
                    ),
                    ..refusal
                }
                .with_details(json!({ "timeout_ms": timeout_ms, "reached_tool": false })))
            }
            () = self.shutting_down() => {
                Err(Adapter::classify_error(allowed.tool, &ExecError::Cancelled))
            }
            () = signals.cancel.cancelled() => {
                Err(Adapter::classify_error(allowed.tool, &ExecError::Cancelled))
            }
        }
    }

    /// Step 10: the tool runs within its concurrency limit (its slot is held while it
    /// runs) and its deadline. Returns its output, how long it took and, for a
    /// two-phase tool's prepare, the commit token taken out of the output before
    /// anything else (output schema, response, audit) sees it.
    async fn execute_step(
        &self,
        loaded: &Loaded,
        allowed: &Allowed<'_>,
        call: &mut Call,
        signals: &CallSignals,
        subject_token: Option<&str>,
    ) -> Result<(Value, u64, Option<String>), Refusal> {
        let executed = {
            let _slot = loaded.acquire(allowed.tool)?;
            call.executed = true;
            let started = Instant::now();
            let evidence = crate::sandbox::EvidenceSlot::default();
            let delegation = crate::adapter::DelegationSlot::default();
            let reported = Reported {
                evidence: &evidence,
                delegation: &delegation,
                subject_token,
            };
            let executed = self
                .execute(allowed, call, signals, reported)
                .instrument(trace::step_span("execute", 10))
                .await;
            call.tool_time = Some(started.elapsed());
            call.sandbox = evidence.into_inner().ok().flatten();
            call.delegation = delegation.into_inner().ok().flatten();
            executed
        };
        let (mut output, tool_ms) = executed.map_err(|failed| {
            // Nothing was sent to the tool: no side effect can have happened.
            call.executed = failed.reached_tool;
            failed.refusal
        })?;
        let commit_token = match &allowed.tool.phases {
            Some(phases) => Some(
                crate::adapter::take_token(&mut output, &phases.token_field)
                    .map_err(|e| Adapter::classify_error(allowed.tool, &e).at_step(10))?,
            ),
            None => None,
        };
        Ok((output, tool_ms, commit_token))
    }

    /// The approval gate (after step 8): without `approval_id`, requests an approval
    /// bound to this exact call (`approval_requested`) and refuses it with
    /// `approval_required`; with one, claims that approval if it was granted for
    /// exactly this call, or refuses with the reason it cannot be used.
    async fn approval_gate(&self, allowed: &Allowed<'_>, call: &mut Call) -> Result<(), Refusal> {
        let binding = crate::approvals::Binding {
            run_id: allowed.run.run_id.clone(),
            role_id: allowed.role.role_id.clone(),
            lane_id: allowed.request.lane_id.clone(),
            tool_name: allowed.tool.tool_name.clone(),
            tool_version: allowed.tool.version.to_string(),
            arguments_sha256: sha256_hex(&to_canonical_bytes(&allowed.arguments)),
            scope_sha256: sha256_hex(&to_canonical_bytes(&Value::Object(
                allowed.scope.scope.clone(),
            ))),
            policy_versions: crate::policy::PolicyVersions::clone(&call.policy_versions),
        };
        if let Some(approval_id) = &allowed.request.approval_id {
            // A refused retry is attributed to the approval it presented too.
            call.approval = Some(json!({ "approval_id": approval_id }));
            let record = self
                .use_approval(approval_id, &binding, &call.call_id)
                .await?;
            call.approval = Some(json!({
                "approval_id": record.approval_id,
                "call_digest": record.call_digest,
                "requested_by_call_id": record.call_id,
                "approved_by": record
                    .decisions
                    .iter()
                    .map(crate::approvals::Decision::who)
                    .collect::<Vec<_>>(),
            }));
            return Ok(());
        }
        let event = call.event(self, EventType::ApprovalRequested);
        // What the approver sees: the arguments as the event keeps them readable.
        let arguments = call.committed.as_ref().and_then(|c| c.readable.clone());
        let redaction = match &call.redaction {
            Redaction::Full => "full",
            Redaction::Fields { .. } => "fields",
            Redaction::HashOnly => "hash_only",
        };
        let request = crate::gateway::ApprovalRequest {
            call_id: call.call_id.clone(),
            binding,
            arguments,
            redaction: redaction.to_string(),
            scope: allowed.scope.scope.clone(),
            requester: crate::approvals::Requester {
                role_id: allowed.role.role_id.clone(),
                caller: call.caller.clone(),
            },
            requirements: call.trace.approval.clone(),
            event,
        };
        let refusal = self.request_approval(request).await;
        if let Some(id) = refusal.details.get("approval_id") {
            call.approval = Some(json!({ "approval_id": id }));
        }
        Err(refusal)
    }

    /// What the idempotency table keeps of a first call's response: an output larger
    /// than `MAX_INLINE_OUTPUT_BYTES` goes to the artifact store (content-addressed)
    /// and only its sha256 stays in memory.
    async fn stored_outcome(&self, response: &CallResponse) -> Outcome {
        let mut kept = response.clone();
        let mut spilled_output = None;
        if let Some(output) = &response.output
            && crate::call::json_size(output, MAX_INLINE_OUTPUT_BYTES) > MAX_INLINE_OUTPUT_BYTES
        {
            let output = output.clone();
            let bytes = tokio::task::spawn_blocking(move || to_canonical_bytes(&output)).await;
            if let Ok(bytes) = bytes
                && let Ok(artifact) = self.artifacts.put(bytes).await
            {
                kept.output = None;
                spilled_output = Some(artifact.sha256);
            }
        }
        let bytes = serde_json::to_vec(&kept).map_or(0, |v| v.len());
        Outcome {
            response: Arc::new(kept),
            spilled_output,
            bytes,
        }
    }

    /// Steps 12 and 13 of a repeat of an idempotent call: the first call's outcome,
    /// nothing executed, recorded by its own closing event (`details.replay_of` names
    /// the first call and its closing event). Fails closed like any call: no output
    /// is returned unless that event is written.
    async fn close_replay(&self, mut call: Call, first: Outcome) -> CallResponse {
        let mut response = (*first.response).clone();
        if let Some(sha256) = &first.spilled_output {
            let output = match self.artifacts.get(sha256).await {
                Ok(bytes) => serde_json::from_slice::<Value>(&bytes).ok(),
                Err(_) => None,
            };
            let Some(output) = output else {
                let refusal = Refusal::new(
                    Reason::InternalError,
                    "the stored outcome of the first call with this idempotency key could not be read",
                );
                return self.close_outcome(call, Err(refusal)).await;
            };
            response.output = Some(output);
        }
        let event_type = match response.status {
            Status::Success => EventType::ToolExecuted,
            Status::Denied => EventType::ToolDenied,
            Status::Timeout => EventType::ToolTimeout,
            Status::Failed => EventType::ToolFailed,
        };
        let mut event = call.event(self, event_type);
        event.execution_time_ms = Some(call.started.elapsed().as_millis() as u64);
        if let Some(d) = &response.diagnostic {
            event.error_code = Some(d.error_code.as_str().to_string());
            event.reason = Some(d.reason.as_str().to_string());
            event.failed_step = Some(d.failed_step);
        }
        if let Some(artifact) = &response.artifact {
            event.details.insert("artifact".into(), json!(artifact));
        }
        event.details.insert(
            "replay_of".into(),
            json!({ "call_id": response.call_id, "audit_event_id": response.audit_event_id }),
        );
        match self.append_timed(event, AppendKind::Closing).await {
            Ok(appended) => {
                response.replay_of = Some(response.call_id.clone());
                response.call_id = call.call_id.clone();
                response.audit_event_id = Some(appended.event_id);
                response.replayed = true;
                response.execution_time_ms = call.started.elapsed().as_millis() as u64;
                self.observed(&call, response)
            }
            Err(e) => {
                call.trace.failed = Some("12:audit_unavailable".into());
                let refusal = Refusal::new(
                    Reason::AuditUnavailable,
                    format!("the audit log could not record the repeated call; no output is returned: {e}"),
                )
                .at_step(12);
                let response = call.response(Status::Failed, Some(&refusal));
                self.observed(&call, response)
            }
        }
    }

    /// Step 10: runs the adapter within the call's deadline: the request's timeout_ms
    /// (capped by the tool's timeout_ms_max) counted from the call's receipt, so the
    /// agent has its answer by then whatever the earlier steps took.
    ///
    /// The caller's cancellation stops the execution at once: the adapter's work is
    /// dropped (a process group is killed, an upstream MCP request is cancelled
    /// upstream) and the call fails with `cancelled`.
    async fn execute(
        &self,
        allowed: &Allowed<'_>,
        call: &Call,
        signals: &CallSignals,
        reported: Reported<'_>,
    ) -> Result<(Value, u64), ExecFailure> {
        let tool = allowed.tool;
        let (timeout_ms, deadline) = call_deadline(allowed, call);
        let started = Instant::now();
        let ctx = ExecContext {
            call_id: &call.call_id,
            run_id: &allowed.run.run_id,
            scope: &allowed.scope.scope,
            deadline,
            sandbox: Some(reported.evidence),
            subject_token: reported.subject_token,
            idempotency_key: allowed.request.idempotency_key.as_deref(),
            delegation: Some(reported.delegation),
        };
        // INVARIANT: nothing starts once the deadline has passed (e.g. a slow audit
        // append in step 9 used the whole budget).
        let result = if signals.cancel.is_cancelled() || self.is_shutting_down() {
            Err(ExecError::Cancelled)
        } else if started >= deadline {
            Err(ExecError::Timeout)
        } else {
            let run = allowed
                .adapter
                .execute_signalled(tool, &allowed.arguments, ctx, signals);
            tokio::select! {
                // The tool first: most finish on their first poll (a builtin's small
                // file read), and then the cancellation waiter is never registered.
                biased;
                timed = tokio::time::timeout_at(deadline + DEADLINE_BACKSTOP, run) => match timed {
                    Ok(result) => result,
                    Err(_) => Err(ExecError::Timeout),
                },
                () = signals.cancel.cancelled() => Err(ExecError::Cancelled),
                () = self.shutting_down() => Err(ExecError::Cancelled),
            }
        };
        let tool_ms = started.elapsed().as_millis() as u64;
        result.map(|output| (output, tool_ms)).map_err(|e| {
            let mut refusal = Adapter::classify_error(tool, &e);
            if refusal.step() < 10 {
                // Found while executing (e.g. a symlink out of the case folder): say so.
                refusal = refusal.at_step(10);
            }
            if matches!(e, ExecError::Timeout) {
                let message = format!(
                    "`{}` did not finish within {timeout_ms} ms and was terminated",
                    tool.tool_name
                );
                refusal = Refusal { message, ..refusal }
                    .with_details(json!({ "timeout_ms": timeout_ms }));
            }
            ExecFailure {
                refusal,
                reached_tool: e.reached_tool() != Some(false),
            }
        })
    }

    /// Step 11: the output must match the tool's output schema; one larger than the
    /// tool's max_output_bytes is stored whole as an artifact and referenced.
    async fn capture(
        &self,
        allowed: &Allowed<'_>,
        call_id: &str,
        output: Value,
        tool_ms: u64,
    ) -> Result<Captured, Refusal> {
        let tool = allowed.tool;
        // A large output is validated, canonicalized and hashed on the blocking pool,
        // never on a connection thread that other calls are waiting for.
        let checked = if crate::call::json_size(&output, MAX_INLINE_OUTPUT_BYTES)
            > MAX_INLINE_OUTPUT_BYTES
        {
            let validator = tool.output_validator.clone();
            tokio::task::spawn_blocking(move || check_output(&validator, output))
                .await
                .map_err(|_| Refusal::new(Reason::InternalError, "checking the output failed"))?
        } else {
            check_output(&tool.output_validator, output)
        };
        let (output, bytes, output_hash) = checked.map_err(|violations| {
            Refusal::new(
                Reason::OutputSchemaViolation,
                format!(
                    "the output of `{}` does not match its output schema; it was withheld",
                    tool.tool_name
                ),
            )
            .with_details(json!({ "violations": violations }))
        })?;
        if bytes.len() as u64 <= tool.limits.max_output_bytes {
            return Ok(Captured {
                output: Some(output),
                artifact: None,
                output_hash,
                tool_ms,
            });
        }
        // The artifact belongs to this call's run: its owner record is durable before
        // the response names the artifact.
        let owner = ArtifactOwner {
            run_id: allowed.run.run_id.clone(),
            role_id: allowed.role.role_id.clone(),
            lane_id: allowed.request.lane_id.clone(),
            tool_name: tool.tool_name.clone(),
            call_id: call_id.to_string(),
        };
        let stored = match self.artifacts.put(bytes).await {
            Ok(artifact) => self
                .artifacts
                .record_owner(&artifact.sha256, &owner)
                .await
                .map(|()| artifact),
            Err(e) => Err(e),
        };
        match stored {
            Ok(artifact) => Ok(Captured {
                output: None,
                artifact: Some(artifact),
                output_hash,
                tool_ms,
            }),
            Err(e) => Err(Refusal::new(
                Reason::ArtifactStoreFailed,
                format!("the output could not be stored as an artifact: {e}"),
            )),
        }
    }

    /// Appends one event (step 9 or 12) in its trace span and records how long it took.
    async fn append_timed(
        &self,
        event: NewEvent,
        kind: AppendKind,
    ) -> Result<Appended, AuditError> {
        let step = match kind {
            AppendKind::Requested => 9,
            AppendKind::Closing => 12,
        };
        let appending = Instant::now();
        let appended = self
            .audit
            .append(event)
            .instrument(trace::step_span("audit_append", step))
            .await;
        self.metrics.record_audit_append(kind, appending.elapsed());
        appended
    }

    /// A dry run: the decision and the trace, audited as `tool_allowed`, never executed.
    async fn close_dry_run(&self, mut call: Call) -> CallResponse {
        let event = call.event(self, EventType::ToolAllowed);
        let appended = self.append_timed(event, AppendKind::Closing).await;
        match appended {
            Ok(appended) => {
                let mut response = call.response(Status::Success, None);
                response.audit_event_id = Some(appended.event_id);
                response.dry_run = Some(DryRun {
                    decision: Decision::Allow,
                });
                self.observed(&call, response)
            }
            Err(e) => {
                call.dry_run = true;
                let refusal = Refusal::new(
                    Reason::AuditUnavailable,
                    format!("the audit log could not record the dry run: {e}"),
                );
                self.close_outcome(call, Err(refusal)).await
            }
        }
    }

    /// Step 12 (emit the closing event) and step 13 (return the response) of a call,
    /// however steps 1-11 ended it. If the closing event cannot be written, the call
    /// fails closed: no output is returned.
    async fn close(&self, call: Call, ended: Result<Ended, Refusal>) -> CallResponse {
        match ended {
            Ok(Ended::Executed(captured, details)) => {
                self.close_outcome(call, Ok((captured, details))).await
            }
            Ok(Ended::DryRun) => self.close_dry_run(call).await,
            Ok(Ended::Replay(first)) => self.close_replay(call, first).await,
            Err(refusal) => self.close_outcome(call, Err(refusal)).await,
        }
    }

    /// Steps 12 and 13 of an executed or a refused call.
    async fn close_outcome(
        &self,
        call: Call,
        outcome: Result<(Captured, Map<String, Value>), Refusal>,
    ) -> CallResponse {
        // INVARIANT: a redacted argument value appears nowhere: not in the message or
        // details of a refusal (a tool's stderr, an upstream error body, a validation
        // message quoting the input), hence not in the audit line, the response or the
        // logs built from them.
        let (event_type, refusal) = match &outcome {
            Ok(_) => (EventType::ToolExecuted, None),
            Err(refusal) => {
                // Only a refusal carries text to scrub: the values are collected here,
                // not on every successful call.
                let secrets = call
                    .arguments
                    .as_ref()
                    .map(|arguments| crate::audit::redacted_values(arguments, &call.redaction))
                    .unwrap_or_default();
                let mut refusal = refusal.clone();
                refusal.message = crate::audit::scrub(&refusal.message, &secrets);
                crate::audit::scrub_value(&mut refusal.details, &secrets);
                if call.executed && !call.retry_safe {
                    // A retry could repeat a side effect: only idempotent tools called
                    // with an idempotency key may be retried.
                    refusal.retryable = Some(false);
                }
                if refusal.reason == Reason::DependencyDown {
                    let safe = refusal.diagnostic().retryable;
                    refusal.message.push_str(if safe {
                        "; a retry is safe"
                    } else {
                        "; the request may have reached the tool, so a retry could repeat its effect"
                    });
                    if let Value::Object(details) = &mut refusal.details {
                        details.insert("retry_safe".into(), json!(safe));
                    }
                }
                let event_type = match Status::of(refusal.reason) {
                    Status::Timeout => EventType::ToolTimeout,
                    Status::Denied => EventType::ToolDenied,
                    Status::Failed | Status::Success => EventType::ToolFailed,
                };
                (event_type, Some(refusal))
            }
        };
        let mut call = call;
        if let Some(refusal) = &refusal {
            call.trace.failed = Some(format!("{}:{}", refusal.step(), refusal.reason.as_str()));
        }
        let mut event = call.event(self, event_type);
        event.execution_time_ms = Some(call.started.elapsed().as_millis() as u64);
        match (&outcome, &refusal) {
            (Ok((captured, details)), _) => {
                event.output_hash_sha256 = Some(captured.output_hash.clone());
                event.details.extend(details.clone());
            }
            (Err(_), Some(refusal)) => add_refusal(&mut event, refusal),
            (Err(_), None) => {}
        }
        let appended = self.append_timed(event, AppendKind::Closing).await;

        // 13. return the response
        let response = match (outcome, refusal, appended) {
            (Ok((captured, details)), _, Ok(appended)) => {
                let mut response = call.response(Status::Success, None);
                if details.contains_key("phase") {
                    let phase = ["phase", "commit"]
                        .into_iter()
                        .filter_map(|k| details.get(k).map(|v| (k.to_string(), v.clone())))
                        .collect();
                    response.details = Some(phase);
                }
                response.output = captured.output;
                response.artifact = captured.artifact;
                response.audit_event_id = Some(appended.event_id);
                response
            }
            (_, Some(refusal), Ok(appended)) => {
                let mut response = call.response(Status::of(refusal.reason), Some(&refusal));
                response.audit_event_id = Some(appended.event_id);
                response
            }
            (_, Some(refusal), Err(_)) if refusal.reason == Reason::AuditUnavailable => {
                // The log was already unavailable before anything ran: say so as is.
                call.response(Status::Failed, Some(&refusal))
            }
            (_, _, Err(e)) => {
                let refusal = Refusal::new(
                    Reason::AuditUnavailable,
                    format!(
                        "the audit log could not record the outcome; no output is returned: {e}"
                    ),
                )
                .at_step(12)
                .with_retryable(call.retry_safe || !call.executed);
                call.response(Status::Failed, Some(&refusal))
            }
            (Err(_), None, Ok(_)) => call.response(Status::Failed, None),
        };
        self.observed(&call, response)
    }

    /// Counts a finished call in the metrics and records its outcome on its span.
    fn observed(&self, call: &Call, response: CallResponse) -> CallResponse {
        let diagnostic = response.diagnostic.as_ref();
        self.metrics.record_call(&CallRecord {
            // Only names the policy validated (steps 4 and 5) become labels.
            tool: call
                .tool_version
                .as_ref()
                .and(call.ids.tool_name.as_deref()),
            lane: call.trace.lane.as_deref(),
            status: response.status.as_str(),
            error_code: response.error_code.map(|c| c.as_str()),
            refusal: diagnostic.map(|d| (d.reason.as_str(), d.failed_step)),
            total: call.started.elapsed(),
            tool_time: call.tool_time,
        });
        trace::record_outcome(&call.span, &response);
        response
    }
}

/// Step 11's checks of an output: it matches the output schema (the validator's fast
/// path first; the violations, at most 50, are listed only for an output that does not),
/// then its canonical bytes and their sha256.
fn check_output(
    validator: &jsonschema::Validator,
    output: Value,
) -> Result<(Value, Vec<u8>, String), Vec<Value>> {
    if !validator.is_valid(&output) {
        return Err(validator
            .iter_errors(&output)
            .take(50)
            .map(|e| json!({ "pointer": e.instance_path().as_str(), "message": e.masked().to_string() }))
            .collect());
    }
    let bytes = to_canonical_bytes(&output);
    let hash = sha256_hex(&bytes);
    Ok((output, bytes, hash))
}

/// A call's timeout (the request's `timeout_ms`, else the tool's default, capped by its
/// `timeout_ms_max`) and the deadline it sets, counted from the call's receipt.
fn call_deadline(allowed: &Allowed<'_>, call: &Call) -> (u64, Instant) {
    let tool = allowed.tool;
    let timeout_ms = allowed
        .request
        .timeout_ms
        .unwrap_or(tool.timeout_default_ms)
        .min(tool.limits.timeout_ms_max);
    (timeout_ms, call.started + Duration::from_millis(timeout_ms))
}

impl Call {
    fn new(request: &Received, versions: &Arc<crate::policy::PolicyVersions>) -> Call {
        let (ids, arguments, scope, dry_run) = match request {
            Ok(r) => (
                PartialRequest {
                    role_id: Some(r.role_id.clone()),
                    run_id: Some(r.run_id.clone()),
                    lane_id: Some(r.lane_id.clone()),
                    tool_name: Some(r.tool_name.clone()),
                    received: Map::new(),
                },
                Some(r.arguments.clone()),
                Some(r.scope.clone()),
                r.dry_run,
            ),
            Err(rejected) => (rejected.1.clone(), None, None, false),
        };
        let received = ids.received.clone();
        Call {
            call_id: format!("call-{}", uuid::Uuid::new_v4()),
            started: Instant::now(),
            ids,
            tool_version: None,
            arguments,
            committed: None,
            scope,
            scope_portable: None,
            received,
            redaction: Redaction::HashOnly,
            trace: Trace::default(),
            dry_run,
            retry_safe: false,
            executed: false,
            policy_versions: Arc::clone(versions),
            tool_time: None,
            span: Span::current(),
            caller: None,
            approval: None,
            sandbox: None,
            jwt_verified: false,
            delegation: None,
        }
        .traced()
    }

    /// Records the call's identifiers on its span.
    fn traced(self) -> Call {
        if !self.span.is_disabled() {
            let span = &self.span;
            span.record("call_id", self.call_id.as_str());
            trace::record_tool_call(span, self.call_id.as_str(), self.ids.tool_name.as_deref());
            for (field, value) in [
                ("run_id", &self.ids.run_id),
                ("role_id", &self.ids.role_id),
                ("lane_id", &self.ids.lane_id),
                ("tool_name", &self.ids.tool_name),
            ] {
                if let Some(value) = value {
                    span.record(field, value.as_str());
                }
            }
        }
        self
    }

    /// An audit event of this call, carrying everything known so far.
    ///
    /// What both of a call's events carry (the arguments and the scope) is rendered in
    /// the line's form once and shared; the trace is written straight to it (issue 19).
    /// A value that cannot be rendered (nested too deep) is handed over as JSON instead,
    /// so that the log refuses it exactly as before.
    fn event(&mut self, gateway: &Gateway, event_type: EventType) -> NewEvent {
        let mut event = NewEvent::new(event_type);
        event.call_id = Some(self.call_id.clone());
        event.run_id = self.ids.run_id.clone();
        event.role_id = self.ids.role_id.clone();
        event.lane_id = self.ids.lane_id.clone();
        event.tool_name = self.ids.tool_name.clone();
        event.tool_version = self.tool_version.clone();
        event.policy_versions = Some(Arc::clone(&self.policy_versions));
        if let Some(arguments) = &self.arguments {
            // Computed once (hash, commitment, redacted form) and reused by the
            // closing event.
            let committed = self.committed.get_or_insert_with(|| {
                let e = NewEvent::new(event_type).with_arguments(
                    &gateway.audit,
                    arguments,
                    &self.redaction,
                );
                CommittedArguments {
                    sha256: e.arguments_hash_sha256,
                    hmac_sha256: e.arguments_hmac_sha256,
                    rendered: e.arguments.as_ref().and_then(|a| Portable::of(a, 0).ok()),
                    readable: e.arguments,
                }
            });
            event.arguments_hash_sha256 = committed.sha256.clone();
            event.arguments_hmac_sha256 = committed.hmac_sha256.clone();
            match &committed.rendered {
                Some(rendered) => event.arguments_portable = Some(rendered.clone()),
                None => event.arguments = committed.readable.clone(),
            }
        }
        let mut received = self.received.clone();
        match &self.scope {
            // INVARIANT: what a caller that has not proved its identity (step 2) can
            // make the log keep is bounded: its scope is kept as a digest only.
            Some(scope) if self.trace.passed_step < 2 => {
                let digest = crate::call::digest_value(&Value::Object(scope.clone()), true);
                received.insert("scope".into(), digest);
            }
            Some(scope) => {
                let rendered = self
                    .scope_portable
                    .get_or_insert_with(|| Portable::of_map(scope, 1).ok());
                match rendered {
                    Some(rendered) => event.details_portable.push(("scope", rendered.clone())),
                    None => {
                        event
                            .details
                            .insert("scope".into(), Value::Object(scope.clone()));
                    }
                }
            }
            None => {}
        }
        if !received.is_empty() {
            event
                .details
                .insert("received".into(), Value::Object(received));
        }
        match self.trace.portable() {
            Ok(trace) => event.details_portable.push(("trace", trace)),
            Err(_) => {
                event.details.insert("trace".into(), self.trace.to_json());
            }
        }
        if let Some(caller) = &self.caller {
            event.details.insert("caller".into(), caller.clone());
        }
        if let Some(approval) = &self.approval {
            event.details.insert("approval".into(), approval.clone());
        }
        if self.dry_run {
            event.details.insert("dry_run".into(), json!(true));
        }
        if let Some(sandbox) = &self.sandbox {
            event
                .details
                .insert("sandbox".into(), Value::Object(sandbox.details.clone()));
        }
        if let Some(delegation) = &self.delegation {
            event
                .details
                .insert("delegation".into(), delegation.clone());
        }
        event
    }

    fn response(&self, status: Status, refusal: Option<&Refusal>) -> CallResponse {
        let diagnostic = refusal.map(Refusal::diagnostic);
        CallResponse {
            call_id: self.call_id.clone(),
            status,
            tool_name: self.ids.tool_name.clone(),
            tool_version: self.tool_version.clone(),
            execution_time_ms: self.started.elapsed().as_millis() as u64,
            output: None,
            artifact: None,
            error_code: diagnostic.as_ref().map(|d| d.error_code),
            error_message: refusal.map(|r| r.message.clone()),
            audit_event_id: None,
            diagnostic,
            trace: self.trace.clone(),
            dry_run: self.dry_run.then_some(DryRun {
                decision: if refusal.is_some() {
                    Decision::Deny
                } else {
                    Decision::Allow
                },
            }),
            replayed: false,
            replay_of: None,
            details: None,
            metrics: self.sandbox.as_ref().and_then(|s| {
                (s.cpu_ms.is_some() || s.memory_peak_mb.is_some()).then(|| crate::call::Metrics {
                    duration_ms: self.started.elapsed().as_millis() as u64,
                    cpu_ms: s.cpu_ms,
                    memory_peak_mb: s.memory_peak_mb,
                })
            }),
        }
    }
}
