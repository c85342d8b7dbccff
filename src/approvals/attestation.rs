//! Decision attestations in a fleet: the sidecar that decides an approval (the
//! decision that meets its quorum) signs what was decided with the fleet key, and the
//! sidecar that uses it verifies that signature before it claims the approval. The
//! shared store (the cluster database) is then an index, not the authority: a row an
//! insider edits to `approved` without the fleet key is refused
//! (`approval_attestation_invalid`).
//!
//! The statement is the RFC 8785 canonical JSON of the approval id, the call digest,
//! the decision, the approvers (each `Decision::who`, in decision order) and the expiry,
//! after a domain line; the attestation is `<key name> <base64(key id || Ed25519
//! signature)>`, the form of manifest.sig.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::json;

use super::{ApprovalRecord, ApprovalStatus, Decision, Verdict};
use crate::audit::keys::{SignerKey, VerifierKey};

/// What an attestation's signature covers, before the statement.
pub const DOMAIN: &str = "toolgate-approval-attestation/1\n";

/// The signed statement of `record`'s decision.
fn statement(record: &ApprovalRecord) -> Vec<u8> {
    let approvers: Vec<String> = record
        .decisions
        .iter()
        .filter(|d| d.decision == Verdict::Approve)
        .map(Decision::who)
        .collect();
    let value = json!({
        "approval_id": record.approval_id,
        "call_digest": record.call_digest,
        "decision": record.status.as_str(),
        "approvers": approvers,
        "expires_at_ms": record.expires_at_ms,
    });
    let mut out = DOMAIN.as_bytes().to_vec();
    out.extend_from_slice(crate::canonical::to_canonical_string(&value).as_bytes());
    out
}

/// The attestation of `record`'s decision, signed with the fleet key.
pub fn sign(record: &ApprovalRecord, key: &SignerKey) -> String {
    let mut signature = key.verifier.key_id.to_vec();
    signature.extend_from_slice(&key.sign(&statement(record)));
    format!("{} {}", key.verifier.name, B64.encode(signature))
}

/// Checks that `record` is approved and carries a valid attestation of exactly that
/// by the fleet key; the error says what is wrong.
pub fn verify(record: &ApprovalRecord, key: &VerifierKey) -> Result<(), String> {
    if record.status != ApprovalStatus::Approved {
        return Err("it is not approved".into());
    }
    let Some(attestation) = &record.attestation else {
        return Err("it carries no attestation of the decision".into());
    };
    let Some((name, signature)) = attestation.split_once(' ') else {
        return Err("its attestation is malformed".into());
    };
    let Ok(signature) = B64.decode(signature) else {
        return Err("its attestation is not base64".into());
    };
    if name != key.name || signature.len() != 68 || signature[..4] != key.key_id {
        return Err("its attestation is not by the fleet key".into());
    }
    let Ok(bytes) = <[u8; 64]>::try_from(&signature[4..]) else {
        return Err("its attestation is malformed".into());
    };
    if !key.verify(&statement(record), &bytes) {
        return Err(
            "its attestation does not verify for this approval, call, decision, approvers and expiry"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn approved() -> ApprovalRecord {
        let v = json!({"version": "1", "sha256": "aa"});
        serde_json::from_value(json!({
            "approval_id": "apr_1", "status": "approved",
            "created_at": "2026-01-01T00:00:00.000Z", "expires_at": "2026-01-01T01:00:00.000Z",
            "created_at_ms": 0, "expires_at_ms": 3_600_000, "call_id": "c1",
            "binding": {"run_id": "r", "role_id": "drafting_agent", "lane_id": "drafting",
                "tool_name": "draft_document", "tool_version": "1.0.0",
                "arguments_sha256": "a1", "scope_sha256": "s1",
                "policy_versions": {"roles": v, "lanes": v, "registry": v}},
            "call_digest": "d1", "arguments": null, "redaction": "full", "scope": {},
            "requester": {"role_id": "drafting_agent"}, "requirements": [],
            "decisions": [{"approver": "role:supervisor", "decision": "approve",
                "reason": "ok", "at": "2026-01-01T00:01:00.000Z"}],
        }))
        .unwrap()
    }

    #[test]
    fn a_signed_grant_verifies_and_any_change_or_another_key_fails() {
        let fleet = SignerKey::from_seed("toolgate/fleet", [5; 32]).unwrap();
        let mut record = approved();
        assert!(verify(&record, &fleet.verifier).is_err(), "unsigned");
        record.attestation = Some(sign(&record, &fleet));
        verify(&record, &fleet.verifier).unwrap();
        let other = SignerKey::from_seed("toolgate/fleet", [6; 32]).unwrap();
        assert!(verify(&record, &other.verifier).is_err(), "another key");
        type Change = fn(&mut ApprovalRecord);
        let changes: [Change; 5] = [
            |r| r.approval_id = "apr_2".into(),
            |r| r.call_digest = "d2".into(),
            |r| r.expires_at_ms += 1,
            |r| r.decisions[0].approver = "role:ops".into(),
            |r| r.status = ApprovalStatus::Pending,
        ];
        for change in changes {
            let mut edited = record.clone();
            change(&mut edited);
            assert!(verify(&edited, &fleet.verifier).is_err());
        }
    }
}
