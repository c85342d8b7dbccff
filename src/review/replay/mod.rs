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

//!
//! - `extract`: the recorded calls, rebuilt from the log's events.
//! - `decide`: each call re-decided under the candidate and the change classified.
//! - `render`: the report as text or JSON.

pub mod decide;
pub mod extract;
pub mod render;

use time::OffsetDateTime;

use crate::audit::{AuditError, AuditReader, EventFilter, EventType, StoredEvent};
use crate::gateway::Loaded;
pub use decide::{ChangeKind, ReplayReport, Replayed, replay};
pub use extract::{Arguments, CallLog, Recorded, RecordedCall, recorded_calls};

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

    use serde_json::{Value, json};

    use super::*;
    use crate::call::Verdict;
    use crate::canonical::{sha256_hex, to_canonical_bytes};
    use crate::policy::RunStatus;

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
