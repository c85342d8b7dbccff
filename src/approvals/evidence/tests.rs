//! The evidence of an approval read from its events, and every editable field of a
//! store record checked against it (one row per edit).

use super::*;

const ID: &str = "apr-0000-1";
const EXPIRES: &str = "2026-01-01T01:00:00.000Z";
const EXPIRES_MS: i64 = 1_767_229_200_000;

fn binding() -> Binding {
    let v = json!({"version": "1", "sha256": "aa"});
    serde_json::from_value(json!({
        "run_id": "r", "role_id": "drafting_agent", "lane_id": "drafting",
        "tool_name": "draft_document", "tool_version": "1.0.0",
        "arguments_sha256": "a1", "scope_sha256": "s1",
        "policy_versions": {"roles": v, "lanes": v, "registry": v},
    }))
    .unwrap()
}

fn requirements(quorum: u32) -> Value {
    json!([{"owner": "tool:draft_document", "approvers": ["attorney", "attorney2", "ops"], "quorum": quorum, "ttl_s": 3600}])
}

fn requested_event(quorum: u32) -> Value {
    let b = binding();
    json!({
        "type": "approval_requested", "call_id": "c-req", "role_id": "drafting_agent",
        "timestamp_utc": "2026-01-01T00:00:00.000Z",
        "details": {"approval": {
            "approval_id": ID, "call_digest": b.digest(), "binding": b,
            "expires_at": EXPIRES, "requirements": requirements(quorum),
        }},
    })
}

fn decision(kind: &str, by: &str, subject: Option<&str>) -> Value {
    let mut details =
        json!({"approval_id": ID, "call_digest": binding().digest(), "by": by, "reason": "ok"});
    if let Some(s) = subject {
        details["subject"] = json!(s);
    }
    json!({"type": kind, "call_id": "c-req", "timestamp_utc": "2026-01-01T00:01:00.000Z", "details": details})
}

fn call_event(kind: &str, call_id: &str, released: bool) -> Value {
    let mut approval = json!({"approval_id": ID, "approved_by": ["role:attorney"]});
    if released {
        approval["released"] = json!(true);
    }
    json!({"type": kind, "call_id": call_id, "timestamp_utc": "2026-01-01T00:02:00.000Z",
           "details": {"approval": approval}})
}

fn evidence(events: &[Value]) -> Evidence {
    Evidence::from_events(
        ID,
        events.iter().enumerate().map(|(i, e)| (i as u64 + 1, e)),
    )
}

/// The store's record of the approval as the gateway writes it after `events`.
fn record(status: &str, decisions: Value, used_by: Option<&str>) -> ApprovalRecord {
    let b = binding();
    let mut value = json!({
        "approval_id": ID, "status": status,
        "created_at": "2026-01-01T00:00:00.000Z", "expires_at": EXPIRES,
        "created_at_ms": EXPIRES_MS - 3_600_000, "expires_at_ms": EXPIRES_MS,
        "call_id": "c-req", "binding": b, "call_digest": b.digest(),
        "arguments": null, "redaction": "full", "scope": {},
        "requester": {"role_id": "drafting_agent"}, "requirements": requirements(1),
        "decisions": decisions,
    });
    if let Some(call) = used_by {
        value["used_by_call_id"] = json!(call);
    }
    serde_json::from_value(value).unwrap()
}

fn granted() -> Value {
    json!([{"approver": "role:attorney", "decision": "approve", "reason": "ok", "at": "2026-01-01T00:01:00.000Z"}])
}

const NOW: i64 = EXPIRES_MS - 1_000_000;

#[test]
fn the_life_of_an_approval_reads_from_its_events() {
    let mut events = vec![requested_event(1)];
    assert_eq!(
        evidence(&events).status_at(NOW),
        Some(ApprovalStatus::Pending)
    );
    events.push(decision("approval_granted", "role:attorney", None));
    assert_eq!(
        evidence(&events).status_at(NOW),
        Some(ApprovalStatus::Approved)
    );
    // A refused retry names the approval but claims nothing.
    events.push(json!({"type": "tool_denied", "call_id": "c-x",
        "details": {"approval": {"approval_id": ID}}}));
    assert_eq!(
        evidence(&events).status_at(NOW),
        Some(ApprovalStatus::Approved)
    );
    // Claimed, nothing reached the tool, given back.
    events.push(call_event("tool_requested", "c-1", false));
    assert_eq!(evidence(&events).status_at(NOW), Some(ApprovalStatus::Used));
    events.push(call_event("tool_failed", "c-1", true));
    assert_eq!(
        evidence(&events).status_at(NOW),
        Some(ApprovalStatus::Approved)
    );
    // Used.
    events.push(call_event("tool_requested", "c-2", false));
    events.push(call_event("tool_executed", "c-2", false));
    let e = evidence(&events);
    assert_eq!(e.status_at(NOW), Some(ApprovalStatus::Used));
    assert_eq!(e.used_by(), Some("c-2"));
    // After its expiry a used approval stays used; an unused one expires.
    assert_eq!(e.status_at(EXPIRES_MS), Some(ApprovalStatus::Used));
    let e = evidence(&events[..2]);
    assert_eq!(e.status_at(EXPIRES_MS), Some(ApprovalStatus::Expired));
    let mut expired = events[..2].to_vec();
    expired.push(json!({"type": "approval_expired", "details": {"approval_id": ID}}));
    assert_eq!(
        evidence(&expired).status_at(NOW),
        Some(ApprovalStatus::Expired)
    );
    // Nothing about another approval counts, whatever its text holds.
    let other: Vec<Value> = events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            let text = e.to_string().replace(ID, "apr-other");
            e = serde_json::from_str(&text).unwrap();
            e["arguments"] = json!({"note": ID});
            e
        })
        .collect();
    assert_eq!(evidence(&other).status_at(NOW), None);
}

#[test]
fn quorum_counts_each_subject_once_whatever_role_it_approves_as() {
    let two = |decisions: &[Value]| {
        let mut events = vec![requested_event(2)];
        events.extend(decisions.iter().cloned());
        evidence(&events).quorum_met()
    };
    let alice = Some("https://idp#alice");
    let bob = Some("https://idp#bob");
    assert!(!two(&[
        decision("approval_granted", "role:attorney", alice),
        decision("approval_granted", "role:attorney2", alice),
    ]));
    assert!(two(&[
        decision("approval_granted", "role:attorney", alice),
        decision("approval_granted", "role:attorney2", bob),
    ]));
    // A static credential is its own subject.
    assert!(two(&[
        decision("approval_granted", "role:attorney", None),
        decision("approval_granted", "admin:ops", None),
    ]));
    assert!(!two(&[
        decision("approval_granted", "role:attorney", None),
        decision("approval_granted", "role:attorney", None),
    ]));
    // An approver the logged requirement does not name never counts.
    assert!(!two(&[
        decision("approval_granted", "role:attorney", alice),
        decision("approval_granted", "role:drafting_agent", bob),
    ]));
    let e = evidence(&[
        requested_event(2),
        decision("approval_granted", "role:attorney", alice),
    ]);
    assert!(e.decided_by("role:attorney2", alice));
    assert!(!e.decided_by("role:attorney2", bob));
}

#[test]
fn a_store_that_agrees_or_lags_is_accepted() {
    let events = vec![
        requested_event(1),
        decision("approval_granted", "role:attorney", None),
    ];
    let e = evidence(&events);
    assert_eq!(
        e.compare(&record("approved", granted(), None), NOW),
        Ok(Agreement::Same)
    );
    // The grant is logged, the store has not taken it yet.
    assert_eq!(
        e.compare(&record("pending", json!([]), None), NOW),
        Ok(Agreement::Behind)
    );
    // The store claimed it for a call whose events are not logged yet.
    assert_eq!(
        e.compare(&record("used", granted(), Some("c-9")), NOW),
        Ok(Agreement::Behind)
    );
    // A store that dropped a logged denial is behind too: it says pending, never
    // approved, and a decision is checked against the log.
    let mut denied = events.clone();
    denied.push(decision("approval_denied", "admin:ops", None));
    assert_eq!(
        evidence(&denied).compare(&record("pending", granted(), None), NOW),
        Ok(Agreement::Behind)
    );
    let mut used = events.clone();
    used.push(call_event("tool_requested", "c-9", false));
    assert_eq!(
        evidence(&used).compare(&record("used", granted(), Some("c-9")), NOW),
        Ok(Agreement::Same)
    );
}

/// One row per field an insider can edit in the store: the edit, and the field the
/// comparison names.
#[test]
fn every_edited_field_of_the_store_is_a_mismatch_naming_it() {
    let mut events = vec![
        requested_event(2),
        decision("approval_granted", "role:attorney", None),
    ];
    let pending = evidence(&events);
    events.push(decision("approval_granted", "admin:ops", None));
    let approved = evidence(&events);
    events.push(call_event("tool_requested", "c-1", false));
    events.push(call_event("tool_executed", "c-1", false));
    let used = evidence(&events);
    let mut denials = events[..2].to_vec();
    denials.push(decision("approval_denied", "admin:ops", None));
    let denied = evidence(&denials);
    let two = json!([
        {"approver": "role:attorney", "decision": "approve", "reason": "ok", "at": "t"},
        {"approver": "admin:ops", "decision": "approve", "reason": "ok", "at": "t"},
    ]);
    let one =
        json!([{"approver": "role:attorney", "decision": "approve", "reason": "ok", "at": "t"}]);
    let and_denied = json!([
        {"approver": "role:attorney", "decision": "approve", "reason": "ok", "at": "t"},
        {"approver": "admin:ops", "decision": "deny", "reason": "no", "at": "t"},
    ]);
    let base = |status: &str, decisions: &Value, used_by: Option<&str>| {
        let mut r = record(status, decisions.clone(), used_by);
        r.requirements = serde_json::from_value(requirements(2)).unwrap();
        r
    };
    let nothing = Evidence::default();
    type Edit = fn(&mut ApprovalRecord);
    let rows: Vec<(&str, &Evidence, ApprovalRecord, Edit, &str)> = vec![
        (
            "a used approval reset to approved",
            &used,
            base("used", &two, Some("c-1")),
            |r| {
                r.status = ApprovalStatus::Approved;
                r.used_by_call_id = None;
            },
            "status",
        ),
        (
            "used by another call",
            &used,
            base("used", &two, Some("c-1")),
            |r| r.used_by_call_id = Some("c-2".into()),
            "used_by_call_id",
        ),
        (
            "expiry extended",
            &approved,
            base("approved", &two, None),
            |r| {
                r.expires_at_ms += 86_400_000;
                r.expires_at = "2026-01-02T01:00:00.000Z".into();
            },
            "expires_at",
        ),
        (
            "expiry extended in the column only",
            &approved,
            base("approved", &two, None),
            |r| r.expires_at_ms += 86_400_000,
            "expires_at",
        ),
        (
            "quorum lowered",
            &pending,
            base("pending", &one, None),
            |r| r.requirements[0].quorum = 1,
            "requirements",
        ),
        (
            "an approver added",
            &pending,
            base("pending", &one, None),
            |r| r.requirements[0].approvers.push("drafting_agent".into()),
            "requirements",
        ),
        (
            "a forged decision",
            &pending,
            base("pending", &one, None),
            |r| {
                r.decisions.push(Decision {
                    approver: "admin:ops".into(),
                    subject: None,
                    decision: Verdict::Approve,
                    reason: "forged".into(),
                    at: "t".into(),
                })
            },
            "decisions",
        ),
        (
            "a decision's subject changed",
            &pending,
            base("pending", &one, None),
            |r| r.decisions[0].subject = Some("https://idp#mallory".into()),
            "decisions",
        ),
        (
            "status forged to approved",
            &pending,
            base("pending", &one, None),
            |r| r.status = ApprovalStatus::Approved,
            "status",
        ),
        (
            "a denial undone",
            &denied,
            base("denied", &and_denied, None),
            |r| r.status = ApprovalStatus::Pending,
            "status",
        ),
        (
            "retargeted to another call's digest",
            &approved,
            base("approved", &two, None),
            |r| r.call_digest = "d2".into(),
            "call_digest",
        ),
        (
            "the binding changed under the same digest",
            &approved,
            base("approved", &two, None),
            |r| r.binding.arguments_sha256 = "a2".into(),
            "binding",
        ),
        (
            "another requester",
            &pending,
            base("pending", &one, None),
            |r| r.requester.role_id = "filing_agent".into(),
            "requester",
        ),
        (
            "an id the log never requested",
            &nothing,
            base("approved", &two, None),
            |_| {},
            "approval_id",
        ),
    ];
    for (what, evidence, mut store, edit, field) in rows {
        assert!(
            evidence.requested.is_none() || evidence.compare(&store, NOW).is_ok(),
            "{what}: the unedited store agrees: {:?}",
            evidence.compare(&store, NOW)
        );
        edit(&mut store);
        let found = evidence.compare(&store, NOW);
        assert_eq!(
            found.clone().map_err(|m| m.field),
            Err(field),
            "{what}: {found:?}"
        );
        assert!(FIELDS.contains(&field));
    }
}
