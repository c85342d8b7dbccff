//! `toolgate audit replay`: re-decides recorded tool calls under a candidate policy and
//! lists those whose decision would change, so a reviewer sees the effect of a policy
//! change on real traffic before merging it.
//!
//! Each call is one decision, taken from the first event the log holds for its
//! `call_id` (`tool_requested` or `tool_allowed` mean allowed; a closing event with a
//! failed step of 8 or less means denied for its reason). The request is rebuilt from
//! that event (role, lane, tool, run, `details.scope`, and the arguments when the tool's
//! redaction kept them intact), the run from its `run_created` event and the status
//! changes before the call, pinned to the candidate's versions so that only real policy
//! differences show. It is then decided with `pipeline::explain`, the gateway's own
//! decision code.
//!
//! When the arguments were not kept intact (redacted, hash only, or altered by the
//! log's portable number form), the step-8 argument checks cannot be re-run: a call the
//! candidate lets through steps 1-7 and the scope's prohibitions is then reported as
//! not fully re-checked, and as undetermined when it had been denied at step 8.
//!
//! Calls refused before any policy decision (a malformed request, the safety lock),
//! refused for their credential (tokens are never recorded) or for a run pinned to
//! other policy versions are skipped and counted.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use serde_json::{Map, Value, json};
use time::OffsetDateTime;

use crate::audit::{AuditError, AuditReader, EventFilter, EventType, StoredEvent};
use crate::call::{CallRequest, Decision, Verdict};
use crate::canonical::{sha256_hex, to_canonical_bytes};
use crate::gateway::Loaded;
use crate::pipeline::explain;
use crate::policy::RunStatus;
use crate::runs::RunRecord;

/// Recorded reasons that are not policy decisions a candidate could change.
const NOT_REPLAYABLE: [(&str, &str); 6] = [
    ("request_malformed", "the request was malformed"),
    ("request_too_large", "the request was too large"),
    ("safety_lock_engaged", "the safety lock was engaged"),
    ("credential_missing", "bearer tokens are not recorded"),
    ("credential_invalid", "bearer tokens are not recorded"),
    (
        "policy_version_mismatch",
        "the run was pinned to other policy versions",
    ),
];

/// How much of a call's arguments the log kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arguments {
    /// The arguments hash to the recorded `arguments_hash_sha256`: replayed exactly.
    Intact,
    /// Some values were redacted (or numbers kept in portable form).
    Altered,
    /// Not kept (hash only, or refused before the tool was known).
    Absent,
}

/// What the log says was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    Decided(Verdict),
    /// Not a policy decision; why.
    Skipped(&'static str),
}

/// One recorded call, rebuilt from the log.
#[derive(Debug, Clone)]
pub struct RecordedCall {
    /// The seq of the first event of the call.
    pub seq: u64,
    pub call_id: String,
    pub timestamp: Option<String>,
    pub role_id: String,
    pub lane_id: String,
    pub tool_name: String,
    pub run_id: String,
    pub scope: Map<String, Value>,
    pub arguments: Option<Value>,
    pub kept: Arguments,
    pub dry_run: bool,
    /// The run as it was when the call was made.
    pub run: Option<RunRecord>,
    pub recorded: Recorded,
}

/// Rebuilds calls from events in seq order (run events and tool events). At most
/// `limit` calls are returned; the flag says whether more were left out.
pub fn recorded_calls(events: &[Value], limit: usize) -> (Vec<RecordedCall>, bool) {
    let mut log = CallLog::default();
    let mut calls = Vec::new();
    for event in events {
        if let Some(call) = log.push(event) {
            if calls.len() >= limit {
                return (calls, true);
            }
            calls.push(call);
        }
    }
    (calls, false)
}

/// Follows the log in seq order: keeps the runs current and turns the first event of
/// each call into a [`RecordedCall`].
#[derive(Debug, Default)]
pub struct CallLog {
    runs: HashMap<String, RunRecord>,
    seen: HashSet<String>,
}

impl CallLog {
    /// Takes the next event; returns the call it starts, if it starts one.
    pub fn push(&mut self, event: &Value) -> Option<RecordedCall> {
        let kind = event["type"].as_str().unwrap_or_default();
        match kind {
            "run_created" => {
                if let Ok(run) =
                    serde_json::from_value::<RunRecord>(event["details"]["run"].clone())
                {
                    self.runs.insert(run.run_id.clone(), run);
                }
                None
            }
            "run_status_changed" => {
                let status = serde_json::from_value::<RunStatus>(event["details"]["to"].clone());
                if let (Some(run), Ok(status)) = (
                    event["run_id"]
                        .as_str()
                        .and_then(|id| self.runs.get_mut(id)),
                    status,
                ) {
                    run.status = status;
                }
                None
            }
            "tool_requested" | "tool_allowed" | "tool_denied" | "tool_executed" | "tool_failed"
            | "tool_timeout" => {
                let call_id = event["call_id"].as_str()?;
                if !self.seen.insert(call_id.to_string()) {
                    return None;
                }
                Some(call(event, kind, call_id, &self.runs))
            }
            _ => None,
        }
    }
}

fn text(event: &Value, key: &str) -> String {
    event[key].as_str().unwrap_or_default().to_string()
}

/// The call whose first event is `event`.
fn call(
    event: &Value,
    kind: &str,
    call_id: &str,
    runs: &HashMap<String, RunRecord>,
) -> RecordedCall {
    let details = &event["details"];
    let (arguments, kept) = match &event["arguments"] {
        Value::Object(_) => {
            let intact = event["arguments_hash_sha256"].as_str()
                == Some(sha256_hex(&to_canonical_bytes(&event["arguments"])).as_str());
            let kept = if intact {
                Arguments::Intact
            } else {
                Arguments::Altered
            };
            (Some(event["arguments"].clone()), kept)
        }
        _ => (None, Arguments::Absent),
    };
    let step = event["failed_step"].as_u64();
    let reason = event["reason"].as_str();
    let recorded = match (kind, step, reason) {
        ("tool_requested" | "tool_allowed" | "tool_executed", _, _) => {
            Recorded::Decided(Verdict::of(None))
        }
        (_, Some(step), Some(reason)) if step <= 8 => {
            match NOT_REPLAYABLE.iter().find(|(r, _)| *r == reason) {
                Some((_, why)) => Recorded::Skipped(why),
                None => Recorded::Decided(Verdict {
                    decision: Decision::Deny,
                    reason: Some(reason.to_string()),
                    step: u8::try_from(step).ok(),
                    message: details["message"].as_str().map(str::to_string),
                }),
            }
        }
        // Refused after the decision (executing, recording): it had been allowed.
        (_, Some(_), _) => Recorded::Decided(Verdict::of(None)),
        _ => Recorded::Skipped("the event does not say where the call stopped"),
    };
    let run_id = text(event, "run_id");
    RecordedCall {
        seq: event["seq"].as_u64().unwrap_or_default(),
        call_id: call_id.to_string(),
        timestamp: event["timestamp_utc"].as_str().map(str::to_string),
        role_id: text(event, "role_id"),
        lane_id: text(event, "lane_id"),
        tool_name: text(event, "tool_name"),
        scope: details["scope"].as_object().cloned().unwrap_or_default(),
        arguments,
        kept,
        dry_run: details["dry_run"] == Value::Bool(true),
        run: runs.get(&run_id).cloned(),
        run_id,
        recorded,
    }
}

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

/// The most events read at once.
const PAGE: usize = 10_000;

/// Reads the log page by page and re-decides each call as it comes: memory grows with
/// the changed calls, not with the log.
pub fn replay_db(
    reader: &AuditReader,
    candidate: &Loaded,
    since: Option<OffsetDateTime>,
    limit: usize,
) -> Result<ReplayReport, AuditError> {
    // The runs come from the whole log (a call after `since` may belong to an older
    // run); they are merged with the tool events in seq order.
    let runs = read_all(
        reader,
        EventFilter {
            event_types: vec![EventType::RunCreated, EventType::RunStatusChanged],
            ..EventFilter::default()
        },
    )?;
    let mut runs = runs.into_iter().peekable();
    let mut log = CallLog::default();
    let mut report = ReplayReport::default();
    let mut calls = 0usize;
    let mut after_seq = 0;
    loop {
        let page = reader.events(&EventFilter {
            event_types: TOOL_EVENTS.to_vec(),
            after_seq,
            since,
            limit: PAGE,
            ..EventFilter::default()
        })?;
        let Some(last) = page.last() else {
            break;
        };
        after_seq = last.seq;
        let full = page.len() >= PAGE;
        for event in page {
            while let Some(run) = runs.next_if(|r| r.seq < event.seq) {
                log.push(&run.value);
            }
            if let Some(call) = log.push(&event.value) {
                if calls >= limit {
                    report.truncated = true;
                    return Ok(report);
                }
                calls += 1;
                report.add(candidate, &call);
            }
        }
        if !full {
            break;
        }
    }
    Ok(report)
}

const TOOL_EVENTS: [EventType; 6] = [
    EventType::ToolRequested,
    EventType::ToolAllowed,
    EventType::ToolDenied,
    EventType::ToolExecuted,
    EventType::ToolFailed,
    EventType::ToolTimeout,
];

fn read_all(reader: &AuditReader, filter: EventFilter) -> Result<Vec<StoredEvent>, AuditError> {
    let mut all = Vec::new();
    let mut after_seq = 0;
    loop {
        let page = reader.events(&EventFilter {
            after_seq,
            limit: PAGE,
            ..filter.clone()
        })?;
        let full = page.len() >= PAGE;
        if let Some(last) = page.last() {
            after_seq = last.seq;
        }
        all.extend(page);
        if !full {
            return Ok(all);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::path::Path;

    use super::*;

    fn loaded(edit: impl FnOnce(&mut crate::policy::Policy)) -> Loaded {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut policy = crate::policy::load_with_env(
            &root.join("policy"),
            &root.join("tools/tool_registry.yaml"),
            &|_| Some("t".into()),
        )
        .unwrap();
        edit(&mut policy);
        let env =
            crate::gateway::adapter_env(&root.join("tools/tool_registry.yaml"), Path::new("var"));
        let adapters = crate::adapter::build(&policy, &env).unwrap();
        Loaded::new(policy, adapters)
    }

    fn run_created(seq: u64, run_id: &str) -> Value {
        let versions = loaded(|_| {}).policy.versions;
        json!({"seq": seq, "type": "run_created", "run_id": run_id, "details": {"run": {
            "run_id": run_id, "status": "active", "scope": {"case_id": "C-1001"},
            "policy_versions": versions, "created_at": "", "created_by": "ops"}}})
    }

    fn tool_event(
        seq: u64,
        kind: &str,
        call_id: &str,
        tool: &str,
        arguments: Option<Value>,
    ) -> Value {
        let mut event = json!({
            "seq": seq, "type": kind, "call_id": call_id, "run_id": "r1",
            "role_id": "research_agent", "lane_id": "research", "tool_name": tool,
            "details": {"scope": {"case_id": "C-1001"}},
        });
        if let Some(arguments) = arguments {
            event["arguments_hash_sha256"] = json!(sha256_hex(&to_canonical_bytes(&arguments)));
            event["arguments"] = arguments;
        }
        event
    }

    fn denied(mut event: Value, step: u8, reason: &str) -> Value {
        event["failed_step"] = json!(step);
        event["reason"] = json!(reason);
        event
    }

    #[test]
    fn one_decision_per_call_from_its_first_event() {
        let events = vec![
            run_created(1, "r1"),
            tool_event(
                2,
                "tool_requested",
                "c1",
                "legal_search",
                Some(json!({"query": "duty"})),
            ),
            tool_event(
                3,
                "tool_executed",
                "c1",
                "legal_search",
                Some(json!({"query": "duty"})),
            ),
            denied(
                tool_event(
                    4,
                    "tool_denied",
                    "c2",
                    "read_document",
                    Some(json!({"path": "privileged/strategy.md"})),
                ),
                8,
                "prohibited_flag",
            ),
            denied(
                tool_event(5, "tool_denied", "c3", "case_lookup", None),
                2,
                "credential_invalid",
            ),
            denied(
                tool_event(
                    6,
                    "tool_failed",
                    "c4",
                    "legal_search",
                    Some(json!({"query": "x"})),
                ),
                10,
                "tool_error",
            ),
        ];
        let (calls, truncated) = recorded_calls(&events, 100);
        assert!(!truncated);
        assert_eq!(calls.len(), 4);
        assert_eq!(calls[0].recorded, Recorded::Decided(Verdict::of(None)));
        assert_eq!(calls[0].kept, Arguments::Intact);
        assert!(calls[0].run.is_some());
        assert!(
            matches!(&calls[1].recorded, Recorded::Decided(v) if v.reason.as_deref() == Some("prohibited_flag"))
        );
        assert_eq!(
            calls[2].recorded,
            Recorded::Skipped("bearer tokens are not recorded")
        );
        assert_eq!(
            calls[3].recorded,
            Recorded::Decided(Verdict::of(None)),
            "refused after the decision"
        );
        let (calls, truncated) = recorded_calls(&events, 2);
        assert_eq!(calls.len(), 2);
        assert!(truncated);
    }

    #[test]
    fn the_same_policy_changes_nothing_and_a_narrower_one_denies() {
        let events = vec![
            run_created(1, "r1"),
            tool_event(
                2,
                "tool_requested",
                "c1",
                "legal_search",
                Some(json!({"query": "duty"})),
            ),
            tool_event(3, "tool_requested", "c2", "case_lookup", Some(json!({}))),
            denied(
                tool_event(
                    4,
                    "tool_denied",
                    "c3",
                    "read_document",
                    Some(json!({"path": "privileged/strategy.md"})),
                ),
                8,
                "prohibited_flag",
            ),
        ];
        let (calls, _) = recorded_calls(&events, 100);
        let same = replay(&loaded(|_| {}), &calls);
        assert_eq!(
            (same.replayed, same.unchanged, same.changes.len()),
            (3, 3, 0),
            "{same:#?}"
        );

        // The candidate takes legal_search out of research and stops prohibiting
        // privileged there.
        let candidate = loaded(|p| {
            p.lanes
                .get_mut("research")
                .unwrap()
                .tools
                .retain(|t| t != "legal_search");
            p.tools
                .get_mut("legal_search")
                .unwrap()
                .allowed_lanes
                .retain(|l| l != "research");
            p.lanes
                .get_mut("research")
                .unwrap()
                .prohibited_flags
                .retain(|f| f != "privileged");
        });
        let report = replay(&candidate, &calls);
        assert_eq!(report.unchanged, 1);
        let got: Vec<(&str, ChangeKind, Option<&str>)> = report
            .changes
            .iter()
            .map(|c| {
                (
                    c.call_id.as_str(),
                    c.change.unwrap(),
                    c.now.reason.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "c1",
                    ChangeKind::AllowedToDenied,
                    Some("tool_not_allowed_in_lane")
                ),
                ("c3", ChangeKind::DeniedToAllowed, None),
            ]
        );
        assert!(report.changes.iter().all(|c| c.arguments_checked));
    }

    #[test]
    fn without_arguments_step_8_is_undetermined_but_earlier_steps_count() {
        let events = vec![
            run_created(1, "r1"),
            // Denied at step 8, arguments not kept.
            denied(
                tool_event(2, "tool_denied", "c1", "read_document", None),
                8,
                "prohibited_flag",
            ),
            // Allowed, arguments not kept.
            tool_event(3, "tool_requested", "c2", "read_document", None),
            // Allowed, redacted: the hash does not match.
            {
                let mut e = tool_event(
                    4,
                    "tool_requested",
                    "c3",
                    "read_document",
                    Some(json!({"path": "notes.md"})),
                );
                e["arguments"] = json!({"path": "[redacted]"});
                e
            },
        ];
        let (calls, _) = recorded_calls(&events, 100);
        assert_eq!(calls[2].kept, Arguments::Altered);
        let report = replay(&loaded(|_| {}), &calls);
        assert_eq!(report.undetermined.len(), 1);
        assert_eq!(report.undetermined[0].call_id, "c1");
        assert_eq!(report.unchanged, 2);
        assert_eq!(report.not_rechecked, 3);
        // A candidate that denies earlier is definitive even without arguments.
        let candidate = loaded(|p| p.tools.get_mut("read_document").unwrap().enabled = false);
        let report = replay(&candidate, &calls);
        assert!(report.undetermined.is_empty());
        assert_eq!(report.count(ChangeKind::AllowedToDenied), 2);
        assert_eq!(report.count(ChangeKind::ReasonChanged), 1);
        assert!(
            report
                .changes
                .iter()
                .all(|c| c.now.reason.as_deref() == Some("tool_disabled"))
        );
    }

    #[test]
    fn runs_are_pinned_to_the_candidate_and_keep_their_status() {
        let mut events = vec![run_created(1, "r1")];
        events.push(json!({"seq": 2, "type": "run_status_changed", "run_id": "r1", "details": {"to": "suspended"}}));
        events.push(denied(
            tool_event(3, "tool_denied", "c1", "case_lookup", Some(json!({}))),
            4,
            "run_not_active",
        ));
        let (calls, _) = recorded_calls(&events, 100);
        assert_eq!(calls[0].run.as_ref().unwrap().status, RunStatus::Suspended);
        // Another version string: the run is still pinned to the candidate.
        let candidate = loaded(|p| p.versions.lanes.version = "other".into());
        let report = replay(&candidate, &calls);
        assert_eq!(
            (report.unchanged, report.changes.len()),
            (1, 0),
            "{report:#?}"
        );
        // A candidate whose research lane acts in suspended runs would allow it.
        let candidate = loaded(|p| {
            p.lanes
                .get_mut("research")
                .unwrap()
                .run_statuses
                .push(RunStatus::Suspended)
        });
        let report = replay(&candidate, &calls);
        assert_eq!(report.count(ChangeKind::DeniedToAllowed), 1);
    }

    #[test]
    fn scope_prohibitions_are_checked_without_arguments() {
        let mut event = tool_event(2, "tool_requested", "c1", "case_lookup", None);
        event["details"]["scope"]["urgent"] = json!(true);
        let (calls, _) = recorded_calls(&[run_created(1, "r1"), event], 100);
        let candidate = loaded(|p| {
            p.lanes
                .get_mut("research")
                .unwrap()
                .prohibited_flags
                .push("urgent".into())
        });
        let report = replay(&candidate, &calls);
        assert_eq!(report.count(ChangeKind::AllowedToDenied), 1);
        assert!(report.changes[0].arguments_checked);
        assert_eq!(
            report.changes[0].now.reason.as_deref(),
            Some("prohibited_flag")
        );
    }
}
