//! Human approval of a tool call, bound to the exact call: the approval record, the
//! binding and its digest, and the durable store (`store.rs`, SQLite).
//!
//! A call that a lane's or tool's `approval:` applies to is not executed: the gateway
//! records a pending approval bound to a [`Binding`] of that call (run, role, lane, tool
//! and version, canonical arguments hash, effective scope hash, policy versions) and
//! answers `approval_required`. Approvers decide through the API; the agent's retry
//! presents `approval_id`, is compared field by field with the binding
//! ([`Binding::mismatch`]) and claims the approval once (atomically, in the store).
//!
//! INVARIANT: an approval runs at most one call, and only the call it is bound to; the
//! store keeps a redacted form of the arguments (the tool's redaction), never more.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::call::ApprovalRequirement;
use crate::canonical::{sha256_hex, to_canonical_bytes};
use crate::diagnostic::Reason;
use crate::policy::PolicyVersions;

pub mod attestation;
pub mod evidence;
pub mod store;

pub use store::{ApprovalBackend, ApprovalStore, StoreError};

/// The longest decision reason accepted, in bytes.
pub const MAX_REASON_BYTES: usize = 1000;
/// Pending approvals allowed per run, and in total: past them a call needing approval
/// is refused (`approval_limit_reached`) rather than queued without end.
pub const MAX_PENDING_PER_RUN: u64 = 32;
pub const MAX_PENDING_TOTAL: u64 = 1000;
/// Pending approvals one role may hold across all runs: a quarter of the total, so one
/// role (one agent's credential) cannot use up the budget every other role needs.
pub const MAX_PENDING_PER_ROLE: u64 = MAX_PENDING_TOTAL / 4;

/// Pending (unexpired) approvals: of one run, of one role, and in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingCounts {
    pub run: u64,
    pub role: u64,
    pub total: u64,
}
/// Largest page of `GET /v1/approvals`, and the default.
pub const MAX_PAGE: usize = 200;
pub const DEFAULT_PAGE: usize = 50;
/// Decided, expired and used approvals kept in the store (the oldest are pruned; the
/// audit log keeps every event).
pub const MAX_FINISHED_KEPT: u64 = 10_000;
/// How often the sweeper looks for expired approvals (and audits each once).
pub const SWEEP_INTERVAL_MS: u64 = 500;

/// Where an approval is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Denied,
    Expired,
    Used,
}

impl ApprovalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Denied => "denied",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Used => "used",
        }
    }

    pub fn parse(s: &str) -> Option<ApprovalStatus> {
        [
            ApprovalStatus::Pending,
            ApprovalStatus::Approved,
            ApprovalStatus::Denied,
            ApprovalStatus::Expired,
            ApprovalStatus::Used,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
}

/// What an approval is bound to: the exact call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub run_id: String,
    pub role_id: String,
    pub lane_id: String,
    pub tool_name: String,
    pub tool_version: String,
    /// sha256 of the canonical (RFC 8785) normalized arguments: the audit log's
    /// `arguments_hash_sha256` of the same call.
    pub arguments_sha256: String,
    /// sha256 of the canonical effective scope (the run's merged with the call's).
    pub scope_sha256: String,
    pub policy_versions: PolicyVersions,
}

impl Binding {
    /// The digest of the exact call: sha256 of the canonical binding.
    pub fn digest(&self) -> String {
        sha256_hex(&to_canonical_bytes(&json!(self)))
    }

    /// Why a call with binding `call` may not use an approval bound to `self`: the
    /// first differing field, in the order run, role, lane/tool/version/scope,
    /// arguments, policy. None when they are the same call.
    pub fn mismatch(&self, call: &Binding) -> Option<(Reason, &'static str)> {
        if self.run_id != call.run_id {
            return Some((Reason::ApprovalRunMismatch, "run_id"));
        }
        if self.role_id != call.role_id {
            return Some((Reason::ApprovalRoleMismatch, "role_id"));
        }
        if self.lane_id != call.lane_id {
            return Some((Reason::ApprovalCallMismatch, "lane_id"));
        }
        if self.tool_name != call.tool_name {
            return Some((Reason::ApprovalCallMismatch, "tool_name"));
        }
        if self.tool_version != call.tool_version {
            return Some((Reason::ApprovalCallMismatch, "tool_version"));
        }
        if self.scope_sha256 != call.scope_sha256 {
            return Some((Reason::ApprovalCallMismatch, "scope"));
        }
        if self.arguments_sha256 != call.arguments_sha256 {
            return Some((Reason::ApprovalArgumentsMismatch, "arguments"));
        }
        if self.policy_versions != call.policy_versions {
            return Some((Reason::ApprovalPolicyChanged, "policy_versions"));
        }
        None
    }
}

/// Who asked: the calling role and, when the credential says more, who held it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Requester {
    pub role_id: String,
    /// The call's `details.caller` (a run token's id, a JWT's issuer and subject).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<Value>,
}

impl Requester {
    /// The JWT subject (with its issuer) that made the call, if it was a JWT.
    pub fn subject(&self) -> Option<String> {
        subject_of(self.caller.as_ref()?)
    }
}

/// `iss` + `sub` of a caller JSON (`identity::JwtIdentity::caller_json`).
pub fn subject_of(caller: &Value) -> Option<String> {
    let sub = caller.get("subject")?.as_str()?;
    let iss = caller.get("issuer").and_then(Value::as_str).unwrap_or("");
    Some(format!("{iss}#{sub}"))
}

/// approve or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Approve,
    Deny,
}

/// One approver's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// `role:<id>` or `admin:<id>`.
    pub approver: String,
    /// The JWT subject that decided (`iss#sub`), when the credential was a JWT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub decision: Verdict,
    pub reason: String,
    pub at: String,
}

impl Decision {
    /// The approver as decisions are shown and attested: the approver, and with a JWT
    /// the subject too (`role:attorney/https://idp#alice`).
    pub fn who(&self) -> String {
        match &self.subject {
            Some(s) => format!("{}/{s}", self.approver),
            None => self.approver.clone(),
        }
    }

    /// The person quorum counts: [`subject_key`] of this decision.
    pub fn subject_key(&self) -> String {
        subject_key(&self.approver, self.subject.as_deref())
    }
}

/// Who decided, as quorum counts them: a JWT's subject (`iss#sub`) whatever approver
/// role or admin it decided as, so one person whose token proves two approver roles
/// counts once; without a JWT, the static credential itself (`role:<id>` or
/// `admin:<id>`: each static token belongs to exactly one role or admin).
pub fn subject_key(approver: &str, subject: Option<&str>) -> String {
    match subject {
        Some(s) => format!("subject:{s}"),
        None => approver.to_string(),
    }
}

/// One approval: the exact call, who asked, what it needs and what was decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub approval_id: String,
    pub status: ApprovalStatus,
    pub created_at: String,
    pub expires_at: String,
    /// Milliseconds since the Unix epoch, for comparisons.
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    /// The call that was refused with `approval_required`.
    pub call_id: String,
    pub binding: Binding,
    /// [`Binding::digest`].
    pub call_digest: String,
    /// The arguments as the audit log keeps them (the tool's redaction): the whole
    /// canonical arguments, some fields replaced by "[redacted]", or null (hash only).
    pub arguments: Option<Value>,
    /// The tool's redaction mode: full, fields or hash_only.
    pub redaction: String,
    /// The effective scope the call was decided on.
    pub scope: Map<String, Value>,
    pub requester: Requester,
    pub requirements: Vec<ApprovalRequirement>,
    #[serde(default)]
    pub decisions: Vec<Decision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_by_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_at: Option<String>,
    /// In a fleet with a fleet key: the deciding sidecar's signature of the decision
    /// (`attestation`), verified by the sidecar that uses the approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<String>,
    /// Set by the store when its row's own columns (which its conditional statements
    /// act on) disagree with its record: the field, as `evidence::FIELDS` names it.
    #[serde(skip)]
    pub row_disagrees: Option<&'static str>,
}

impl ApprovalRecord {
    /// Notes which of a row's columns, if any, disagree with its record.
    pub fn check_row(mut self, status: &str, call_digest: &str, expires_at_ms: i64) -> Self {
        self.row_disagrees = if status != self.status.as_str() {
            Some("status")
        } else if call_digest != self.call_digest {
            Some("call_digest")
        } else if expires_at_ms != self.expires_at_ms {
            Some("expires_at")
        } else {
            None
        };
        self
    }

    /// The status as of `now_ms`: a pending or approved approval past its expiry is
    /// expired even before the sweeper records it.
    pub fn status_at(&self, now_ms: i64) -> ApprovalStatus {
        match self.status {
            ApprovalStatus::Pending | ApprovalStatus::Approved if now_ms >= self.expires_at_ms => {
                ApprovalStatus::Expired
            }
            s => s,
        }
    }

    /// The record as the API shows it at `now_ms` (status as of then).
    pub fn view(&self, now_ms: i64) -> ApprovalRecord {
        let mut view = self.clone();
        view.status = self.status_at(now_ms);
        view
    }

    /// Whether every requirement has its quorum of approvals by distinct subjects.
    pub fn quorum_met(&self) -> bool {
        quorum_met(&self.requirements, &self.decisions)
    }

    /// Which approver ids of the requirements could decide this approval.
    pub fn eligible(&self, id: &str) -> bool {
        self.requirements
            .iter()
            .any(|r| r.approvers.iter().any(|a| a == id))
    }
}

/// Whether `decisions` meet every requirement's quorum: per requirement, approvals by
/// approvers it names, counted by distinct subject ([`subject_key`]): one person
/// approving as two approver roles counts once.
pub fn quorum_met(requirements: &[ApprovalRequirement], decisions: &[Decision]) -> bool {
    requirements.iter().all(|req| {
        let mut subjects: Vec<String> = decisions
            .iter()
            .filter(|d| d.decision == Verdict::Approve)
            .filter(|d| {
                d.approver
                    .split_once(':')
                    .is_some_and(|(_, id)| req.approvers.iter().any(|a| a == id))
            })
            .map(Decision::subject_key)
            .collect();
        subjects.sort();
        subjects.dedup();
        subjects.len() >= req.quorum as usize
    })
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// RFC 3339 UTC of milliseconds since the Unix epoch.
pub fn rfc3339_ms(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// A fresh approval id: `apr-` and a random UUID (122 random bits: not guessable).
pub fn new_approval_id() -> String {
    format!("apr-{}", uuid::Uuid::new_v4())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::FileVersion;

    fn binding() -> Binding {
        let v = FileVersion {
            version: "1".into(),
            sha256: "aa".into(),
        };
        Binding {
            run_id: "r".into(),
            role_id: "filing_agent".into(),
            lane_id: "filing".into(),
            tool_name: "file_with_court".into(),
            tool_version: "1.0.0".into(),
            arguments_sha256: "a1".into(),
            scope_sha256: "s1".into(),
            policy_versions: PolicyVersions {
                roles: v.clone(),
                lanes: v.clone(),
                registry: v,
            },
        }
    }

    #[test]
    fn each_differing_field_has_its_reason() {
        let b = binding();
        assert_eq!(b.mismatch(&b), None);
        type Change = fn(&mut Binding);
        let cases: [(Change, Reason); 5] = [
            (|c| c.run_id = "other".into(), Reason::ApprovalRunMismatch),
            (|c| c.role_id = "x".into(), Reason::ApprovalRoleMismatch),
            (
                |c| c.tool_version = "2.0.0".into(),
                Reason::ApprovalCallMismatch,
            ),
            (
                |c| c.arguments_sha256 = "a2".into(),
                Reason::ApprovalArgumentsMismatch,
            ),
            (
                |c| c.policy_versions.roles.sha256 = "bb".into(),
                Reason::ApprovalPolicyChanged,
            ),
        ];
        for (change, reason) in cases {
            let mut call = b.clone();
            change(&mut call);
            assert_eq!(b.mismatch(&call).map(|m| m.0), Some(reason));
            assert_ne!(b.digest(), call.digest());
        }
    }
}
