//! An approval's life as the audit log holds it, and the store checked against it.
//!
//! The store (`approvals.db`, or `toolgate_approvals` in a fleet) is an index that
//! whoever holds the data directory or the database can edit; the signed, hash-chained
//! audit log is the evidence. [`Evidence`] is built from the log's events about one
//! approval: its `approval_requested` (call digest, binding, expiry, requirements,
//! requester), each `approval_granted` / `approval_denied` with its approver and
//! subject, its `approval_expired`, and every call that ran under it (a
//! `tool_requested` or closing event whose `details.approval` carries `approved_by`,
//! which only a claimed approval puts there; a closing event saying `released: true`
//! gives the approval back). [`Evidence::compare`] checks a store record against it
//! field by field; the gateway honours a retry or a decision only on the evidence.
//!
//! The store may lag the log, never lead it: every change that widens what an approval
//! allows (requested, granted, released) is appended to the log before the store takes
//! it, and the changes that narrow it (claimed, expired) are taken by the store first.
//! So a store that says less than the log (pending while the log holds the grant that
//! met the quorum; used while the log holds no use yet) is behind, and its own answer
//! (pending, used) stands; a store that says more, or anything else, is a mismatch.
//!
//! Pure: no I/O, no clock (the time is a parameter).

use serde_json::{Value, json};

use super::{
    ApprovalRecord, ApprovalStatus, Binding, Decision, Requester, Verdict, quorum_met, subject_key,
};
use crate::call::ApprovalRequirement;

/// Every field [`Evidence::compare`] may name: the bounded label set of
/// `toolgate_approval_store_mismatches_total`.
pub const FIELDS: [&str; 9] = [
    "approval_id",
    "call_digest",
    "binding",
    "expires_at",
    "requirements",
    "requester",
    "decisions",
    "status",
    "used_by_call_id",
];

/// The `approval_requested` event of an approval.
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    /// The event's seq in the log that holds it.
    pub seq: u64,
    /// Its `timestamp_utc`, in Unix milliseconds.
    pub at_ms: i64,
    pub call_id: String,
    pub call_digest: String,
    pub binding: Binding,
    pub expires_at: String,
    pub expires_at_ms: i64,
    pub requirements: Vec<ApprovalRequirement>,
    pub requester: Requester,
}

/// A call that claimed the approval, as its events say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    pub call_id: String,
    /// A closing event of the call says the approval was given back (nothing reached
    /// the tool).
    pub released: bool,
}

/// An approval's life in the audit log.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Evidence {
    pub approval_id: String,
    /// None: the log holds no request of this approval.
    pub requested: Option<Requested>,
    /// Grants and denials for the requested call digest, in log order.
    pub decisions: Vec<Decision>,
    /// The log holds its `approval_expired`.
    pub expiry_logged: bool,
    /// The calls that claimed it, in log order.
    pub uses: Vec<Use>,
}

/// A field of the store that disagrees with the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// One of [`FIELDS`].
    pub field: &'static str,
    /// What the store says, and what the log says (small values; lists summarized).
    pub store: Value,
    pub log: Value,
}

/// How the store stands against the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// Every field agrees.
    Same,
    /// The store says less than the log (a decision or a release the store has not
    /// taken yet, a claim the log does not hold yet): its own answer stands.
    Behind,
}

/// Milliseconds since the Unix epoch of an RFC 3339 time.
pub fn parse_ms(text: &str) -> Option<i64> {
    let at =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}

impl Evidence {
    /// The evidence of approval `approval_id` in `events` (event lines as JSON, each
    /// with the seq of the log that holds it, in log order). Events about anything
    /// else are ignored, whatever their text holds: only the fields the gateway writes
    /// count.
    pub fn from_events<'a>(
        approval_id: &str,
        events: impl IntoIterator<Item = (u64, &'a Value)>,
    ) -> Evidence {
        let mut evidence = Evidence {
            approval_id: approval_id.to_string(),
            ..Evidence::default()
        };
        let id = json!(approval_id);
        let mut decided: Vec<(String, Decision)> = Vec::new();
        for (seq, event) in events {
            let details = &event["details"];
            match event["type"].as_str().unwrap_or_default() {
                "approval_requested"
                    if details["approval"]["approval_id"] == id && evidence.requested.is_none() =>
                {
                    evidence.requested = requested(seq, event);
                }
                kind @ ("approval_granted" | "approval_denied") if details["approval_id"] == id => {
                    let Some(by) = details["by"].as_str() else {
                        continue;
                    };
                    decided.push((
                        details["call_digest"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        Decision {
                            approver: by.to_string(),
                            subject: details["subject"].as_str().map(str::to_string),
                            decision: if kind == "approval_granted" {
                                Verdict::Approve
                            } else {
                                Verdict::Deny
                            },
                            reason: details["reason"].as_str().unwrap_or_default().to_string(),
                            at: event["timestamp_utc"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                        },
                    ));
                }
                "approval_expired" if details["approval_id"] == id => {
                    evidence.expiry_logged = true;
                }
                "tool_requested" | "tool_executed" | "tool_failed" | "tool_timeout"
                | "tool_denied"
                    if details["approval"]["approval_id"] == id =>
                {
                    let approval = &details["approval"];
                    // Only a claimed approval's calls carry who approved it; a refused
                    // retry names the approval and nothing more.
                    if approval.get("approved_by").is_none() {
                        continue;
                    }
                    let Some(call_id) = event["call_id"].as_str() else {
                        continue;
                    };
                    let released = approval["released"] == json!(true);
                    match evidence.uses.iter_mut().find(|u| u.call_id == call_id) {
                        Some(found) => found.released |= released,
                        None => evidence.uses.push(Use {
                            call_id: call_id.to_string(),
                            released,
                        }),
                    }
                }
                _ => {}
            }
        }
        // Decisions count for the digest the approval was requested for.
        if let Some(requested) = &evidence.requested {
            evidence.decisions = decided
                .into_iter()
                .filter(|(digest, _)| *digest == requested.call_digest)
                .map(|(_, d)| d)
                .collect();
        }
        evidence
    }

    /// The call that used the approval: the first claim the log does not say was
    /// given back.
    pub fn used_by(&self) -> Option<&str> {
        self.uses
            .iter()
            .find(|u| !u.released)
            .map(|u| u.call_id.as_str())
    }

    /// Whether every requirement the request logged has its quorum of logged grants by
    /// distinct subjects.
    pub fn quorum_met(&self) -> bool {
        self.requested
            .as_ref()
            .is_some_and(|r| quorum_met(&r.requirements, &self.decisions))
    }

    /// The approval's status as of `now_ms`, on the log alone: used once a call
    /// claimed it (and did not give it back), denied after a denial, expired after its
    /// logged `expires_at` (or its logged expiry), approved once the logged grants meet
    /// the logged quorum, else pending. None when the log holds no request.
    pub fn status_at(&self, now_ms: i64) -> Option<ApprovalStatus> {
        let requested = self.requested.as_ref()?;
        Some(if self.used_by().is_some() {
            ApprovalStatus::Used
        } else if self.decisions.iter().any(|d| d.decision == Verdict::Deny) {
            ApprovalStatus::Denied
        } else if self.expiry_logged || now_ms >= requested.expires_at_ms {
            ApprovalStatus::Expired
        } else if self.quorum_met() {
            ApprovalStatus::Approved
        } else {
            ApprovalStatus::Pending
        })
    }

    /// Whether a decision by `approver` (with JWT `subject`) is already logged: the
    /// same subject counts once, whichever approver role it decided as.
    pub fn decided_by(&self, approver: &str, subject: Option<&str>) -> bool {
        let key = subject_key(approver, subject);
        self.decisions.iter().any(|d| d.subject_key() == key)
    }

    /// Checks `store` (an approval record as the store holds it) against the log as of
    /// `now_ms`: the fields fixed at the request (call digest, binding, expiry,
    /// requirements, requester) must be the logged ones; every stored decision must be
    /// logged; the status and the use must be the log's, or the store behind it (see
    /// the module's comment). The first field that disagrees is the mismatch.
    pub fn compare(&self, store: &ApprovalRecord, now_ms: i64) -> Result<Agreement, Mismatch> {
        let Some(requested) = &self.requested else {
            return Err(Mismatch {
                field: "approval_id",
                store: json!(store.approval_id),
                log: Value::Null,
            });
        };
        if let Some(field) = store.row_disagrees {
            return Err(Mismatch {
                field,
                store: json!("the row's column and its record disagree"),
                log: Value::Null,
            });
        }
        if store.call_digest != requested.call_digest {
            return Err(Mismatch {
                field: "call_digest",
                store: json!(store.call_digest),
                log: json!(requested.call_digest),
            });
        }
        if store.binding != requested.binding || store.binding.digest() != requested.call_digest {
            return Err(Mismatch {
                field: "binding",
                store: json!(store.binding.digest()),
                log: json!(requested.call_digest),
            });
        }
        if store.expires_at_ms != requested.expires_at_ms
            || parse_ms(&store.expires_at) != Some(requested.expires_at_ms)
        {
            return Err(Mismatch {
                field: "expires_at",
                store: json!(store.expires_at),
                log: json!(requested.expires_at),
            });
        }
        if store.requirements != requested.requirements {
            let quorums = |r: &[ApprovalRequirement]| -> Value {
                r.iter()
                    .map(
                        |r| json!({"owner": r.owner, "approvers": r.approvers, "quorum": r.quorum}),
                    )
                    .collect()
            };
            return Err(Mismatch {
                field: "requirements",
                store: quorums(&store.requirements),
                log: quorums(&requested.requirements),
            });
        }
        if store.requester != requested.requester {
            return Err(Mismatch {
                field: "requester",
                store: json!(store.requester.role_id),
                log: json!(requested.requester.role_id),
            });
        }
        // Every stored decision is a logged one (each logged decision at most once).
        let mut logged: Vec<(String, Option<String>, Verdict)> = self
            .decisions
            .iter()
            .map(|d| (d.approver.clone(), d.subject.clone(), d.decision))
            .collect();
        for d in &store.decisions {
            let key = (d.approver.clone(), d.subject.clone(), d.decision);
            match logged.iter().position(|l| *l == key) {
                Some(i) => {
                    logged.remove(i);
                }
                None => {
                    return Err(Mismatch {
                        field: "decisions",
                        store: json!(
                            store
                                .decisions
                                .iter()
                                .map(Decision::who)
                                .collect::<Vec<_>>()
                        ),
                        log: json!(self.decisions.iter().map(Decision::who).collect::<Vec<_>>()),
                    });
                }
            }
        }
        let store_behind_on_decisions = !logged.is_empty();
        let log_status = self.status_at(now_ms).unwrap_or(ApprovalStatus::Pending);
        let store_status = store.status_at(now_ms);
        let status_mismatch = || Mismatch {
            field: "status",
            store: json!({"status": store_status, "used_by_call_id": store.used_by_call_id}),
            log: json!({"status": log_status, "used_by_call_id": self.used_by()}),
        };
        match (store_status, log_status) {
            (ApprovalStatus::Used, ApprovalStatus::Used) => {
                let used_by = store.used_by_call_id.as_deref();
                if used_by.is_some()
                    && self
                        .uses
                        .iter()
                        .any(|u| Some(u.call_id.as_str()) == used_by)
                {
                    Ok(Agreement::Same)
                } else {
                    Err(Mismatch {
                        field: "used_by_call_id",
                        store: json!(store.used_by_call_id),
                        log: json!(self.used_by()),
                    })
                }
            }
            // A claim the log does not hold yet (the call's events follow the claim),
            // or a release the store has not taken yet.
            (ApprovalStatus::Used, _) => Ok(Agreement::Behind),
            // A decision the log holds and the store has not taken yet.
            (ApprovalStatus::Pending, ApprovalStatus::Approved | ApprovalStatus::Denied)
                if store_behind_on_decisions =>
            {
                Ok(Agreement::Behind)
            }
            (s, l) if s == l => {
                if store_behind_on_decisions {
                    Ok(Agreement::Behind)
                } else {
                    Ok(Agreement::Same)
                }
            }
            _ => Err(status_mismatch()),
        }
    }

    /// The record as the log has it: `store` (which [`Evidence::compare`] found the
    /// same or behind) with the logged decisions and the log's status as of `now_ms`.
    pub fn record(&self, store: &ApprovalRecord, now_ms: i64) -> ApprovalRecord {
        let mut record = store.clone();
        record.decisions = self.decisions.clone();
        if let Some(status) = self.status_at(now_ms) {
            record.status = status;
        }
        record
    }
}

/// The request an `approval_requested` event logged, if its fields are whole.
fn requested(seq: u64, event: &Value) -> Option<Requested> {
    let approval = &event["details"]["approval"];
    let expires_at = approval["expires_at"].as_str()?.to_string();
    Some(Requested {
        seq,
        at_ms: parse_ms(event["timestamp_utc"].as_str()?)?,
        call_id: event["call_id"].as_str()?.to_string(),
        call_digest: approval["call_digest"].as_str()?.to_string(),
        binding: serde_json::from_value(approval["binding"].clone()).ok()?,
        expires_at_ms: parse_ms(&expires_at)?,
        expires_at,
        requirements: serde_json::from_value(approval["requirements"].clone()).ok()?,
        requester: Requester {
            role_id: event["role_id"].as_str()?.to_string(),
            caller: event["details"].get("caller").cloned(),
        },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
