//! Decision: re-decides each recorded call under the candidate with
//! `pipeline::explain` and classifies the change against what was recorded.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::extract::{Arguments, Recorded, RecordedCall};
use crate::call::{CallRequest, Decision, Verdict};
use crate::gateway::Loaded;
use crate::pipeline::explain;

/// How a decision changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    AllowedToDenied,
    DeniedToAllowed,
    ReasonChanged,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::AllowedToDenied => "allowed -> denied",
            ChangeKind::DeniedToAllowed => "denied -> allowed",
            ChangeKind::ReasonChanged => "different denial reason",
        }
    }
}

/// One replayed call (changed, or undetermined).
#[derive(Debug, Clone, Serialize)]
pub struct Replayed {
    pub seq: u64,
    pub call_id: String,
    pub timestamp: Option<String>,
    pub role_id: String,
    pub lane_id: String,
    pub tool_name: String,
    pub run_id: String,
    pub dry_run: bool,
    pub arguments: Arguments,
    /// Whether the step-8 argument checks were re-run.
    pub arguments_checked: bool,
    pub was: Verdict,
    pub now: Verdict,
    /// None for an undetermined call.
    pub change: Option<ChangeKind>,
}

/// The whole replay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    /// Calls re-decided.
    pub replayed: usize,
    pub unchanged: usize,
    /// Calls whose decision changes, in log order.
    pub changes: Vec<Replayed>,
    /// Calls denied at step 8 whose arguments were not kept: the candidate lets them
    /// through steps 1-7, and the argument checks could not be re-run.
    pub undetermined: Vec<Replayed>,
    /// Calls re-decided without the step-8 argument checks (arguments not kept).
    pub not_rechecked: usize,
    /// Calls skipped, by why.
    pub skipped: BTreeMap<String, usize>,
    /// More calls matched than were replayed (see `--limit`).
    pub truncated: bool,
}

impl ReplayReport {
    pub fn count(&self, kind: ChangeKind) -> usize {
        self.changes
            .iter()
            .filter(|c| c.change == Some(kind))
            .count()
    }
}

/// Re-decides every call under `candidate`.
pub fn replay(candidate: &Loaded, calls: &[RecordedCall]) -> ReplayReport {
    let mut report = ReplayReport::default();
    for call in calls {
        report.add(candidate, call);
    }
    report
}

impl ReplayReport {
    /// Re-decides one call and counts it.
    pub fn add(&mut self, candidate: &Loaded, call: &RecordedCall) {
        let was = match &call.recorded {
            Recorded::Skipped(why) => {
                *self.skipped.entry((*why).to_string()).or_default() += 1;
                return;
            }
            Recorded::Decided(v) => v.clone(),
        };
        self.replayed += 1;
        let (now, checked) = decide(candidate, call);
        if !checked {
            self.not_rechecked += 1;
            // `now` is an allow that steps 1-7 and the scope's prohibitions support.
            if was.step == Some(8) {
                self.undetermined
                    .push(replayed(call, was, now, false, None));
                return;
            }
        }
        match classify(&was, &now) {
            None => self.unchanged += 1,
            Some(kind) => self
                .changes
                .push(replayed(call, was, now, checked, Some(kind))),
        }
    }
}

fn classify(was: &Verdict, now: &Verdict) -> Option<ChangeKind> {
    if !was.diverges(now) {
        return None;
    }
    Some(match (was.decision, now.decision) {
        (Decision::Allow, _) => ChangeKind::AllowedToDenied,
        (Decision::Deny, Decision::Allow) => ChangeKind::DeniedToAllowed,
        (Decision::Deny, Decision::Deny) => ChangeKind::ReasonChanged,
    })
}

fn replayed(
    call: &RecordedCall,
    was: Verdict,
    now: Verdict,
    arguments_checked: bool,
    change: Option<ChangeKind>,
) -> Replayed {
    Replayed {
        seq: call.seq,
        call_id: call.call_id.clone(),
        timestamp: call.timestamp.clone(),
        role_id: call.role_id.clone(),
        lane_id: call.lane_id.clone(),
        tool_name: call.tool_name.clone(),
        run_id: call.run_id.clone(),
        dry_run: call.dry_run,
        arguments: call.kept,
        arguments_checked,
        was,
        now,
        change,
    }
}

/// The candidate's verdict, and whether it covers the step-8 argument checks.
fn decide(candidate: &Loaded, call: &RecordedCall) -> (Verdict, bool) {
    let intact = call.kept == Arguments::Intact;
    let request = CallRequest {
        role_id: call.role_id.clone(),
        run_id: call.run_id.clone(),
        lane_id: call.lane_id.clone(),
        tool_name: call.tool_name.clone(),
        arguments: match (&call.arguments, intact) {
            (Some(arguments), true) => arguments.clone(),
            _ => json!({}),
        },
        scope: call.scope.clone(),
        timeout_ms: None,
        idempotency_key: None,
        dry_run: call.dry_run,
        approval_id: None,
    };
    let run = call.run.clone().map(|mut run| {
        run.policy_versions = candidate.policy.versions.clone();
        run
    });
    let explanation = explain(candidate, request, run);
    let verdict = explanation.verdict();
    if intact || verdict.step.is_some_and(|step| step < 8) {
        return (verdict, true);
    }
    // Steps 1-7 passed; of step 8 only the scope's flags can be checked.
    let policy = &candidate.policy;
    if let (Some(lane), Some(tool)) = (
        policy.lanes.get(&call.lane_id),
        policy.tools.get(&call.tool_name),
    ) {
        let scope = call
            .run
            .as_ref()
            .and_then(|run| crate::authz::merge_scope(&run.scope, &call.scope).ok())
            .unwrap_or_else(|| crate::authz::EffectiveScope {
                scope: call.scope.clone(),
                from_run: Vec::new(),
            });
        let flags: Vec<String> = scope
            .scope
            .iter()
            .filter(|(_, v)| **v == Value::Bool(true))
            .map(|(k, _)| k.clone())
            .collect();
        if let Err(refusal) = crate::authz::check_prohibitions(lane, tool, &flags, &scope) {
            return (Verdict::of(Some(&refusal)), true);
        }
    }
    (Verdict::of(None), false)
}
