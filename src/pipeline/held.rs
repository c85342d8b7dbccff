//! What a call holds between its admission (step 8) and its one exit (steps 12 and 13),
//! settled once: the budget counts of its admission, its claim on an idempotency key
//! (in memory, or in the cluster database in a fleet), an approval to give back and a
//! prepared commit.
//!
//! INVARIANT: an admission is refunded at most once, and only when the call reached no
//! tool; a key's claim is answered (or released) only once step 9's event is written,
//! and after the closing event.

use serde_json::{Map, Value, json};

use super::{Allowed, Call};
use crate::call::{CallResponse, Status};
use crate::canonical::{sha256_hex, to_canonical_bytes};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::Gateway;
use crate::gateway::budgets::Admission;
use crate::idempotency::{Guard, Key, Outcome};

/// The idempotency claim of a call that carries an `idempotency_key`: its key,
/// namespaced by run, role and tool, and the fingerprint of its arguments and scope.
/// Built once from the decision and claimed once, locally or in the fleet.
pub(super) struct KeyClaim {
    pub(super) key: Key,
    pub(super) fingerprint: String,
}

impl KeyClaim {
    /// The claim of an allowed call, if it carries an idempotency key.
    pub(super) fn of(allowed: &Allowed<'_>) -> Option<KeyClaim> {
        let idempotency_key = allowed.request.idempotency_key.as_ref()?;
        let key = Key {
            run_id: allowed.run.run_id.clone(),
            role_id: allowed.role.role_id.clone(),
            tool_name: allowed.tool.tool_name.clone(),
            idempotency_key: idempotency_key.clone(),
        };
        Some(KeyClaim::new(
            key,
            &allowed.arguments,
            &allowed.request.scope,
        ))
    }

    /// The run is in the key; with the call's scope, that fixes the effective scope, so
    /// the fingerprint covers the normalized arguments and the call's scope.
    fn new(key: Key, arguments: &Value, scope: &Map<String, Value>) -> KeyClaim {
        let fingerprint = sha256_hex(&to_canonical_bytes(&json!({
            "arguments": arguments,
            "scope": scope,
        })));
        KeyClaim { key, fingerprint }
    }
}

/// What claiming a key answered.
pub(super) enum Claimed {
    /// This call is the first of its key: it runs, and holds the key until its exit.
    First(HeldKey),
    /// A repeat: the first call's outcome, to replay (nothing is executed).
    Repeat(Outcome),
}

/// A first call's hold on its idempotency key.
pub(super) enum HeldKey {
    /// In the gateway's table; dropping the guard unanswered forgets the key.
    Local(Guard),
    /// In the cluster database; completed with the call's response.
    Fleet(Key),
}

/// What a call holds until its exit.
#[derive(Default)]
pub(super) struct Held {
    /// The budget counts claimed at step 8; refunded when the call reached no tool.
    pub(super) admission: Admission,
    /// The idempotency key this call is the first of.
    pub(super) key: Option<HeldKey>,
    /// Whether the key keeps this call's outcome for its repeats, decided once steps
    /// 10-11 ended; None when they never started (the claim ends unanswered).
    keep: Option<bool>,
    /// The approval to give back, because nothing reached the tool.
    release: Option<String>,
    /// Whether a prepared commit is held that only the response announces.
    pub(super) prepared: bool,
}

impl Held {
    /// After steps 10 and 11: whether they failed and whether anything reached the tool
    /// decide what the key keeps and whether the approval is given back. The closing
    /// event says an approval is given back before the store takes it back (the log
    /// leads the store in what an approval allows: approvals::evidence).
    pub(super) fn executed(
        &mut self,
        failed: Option<&Refusal>,
        call: &mut Call,
        allowed: &Allowed<'_>,
    ) {
        self.keep = Some(keeps_outcome(failed, call.executed, call.retry_safe));
        // An approval is used up only once something may have reached the tool.
        self.release = match &mut call.approval {
            Some(Value::Object(approval))
                if failed.is_some() && !call.executed && approval.contains_key("approved_by") =>
            {
                approval.insert("released".into(), json!(true));
                allowed.request.approval_id.clone()
            }
            _ => None,
        };
    }

    /// Settles what the call held, once its closing event was written (or not):
    /// gives an unused approval back, abandons a prepared commit nobody heard of and
    /// answers the idempotency key.
    pub(super) async fn settle(self, gateway: &Gateway, call_id: &str, response: &CallResponse) {
        if let Some(approval_id) = self.release
            && response.audit_event_id.is_some()
        {
            // Recorded as given back: the agent's retry may run under it.
            gateway.release_approval(&approval_id, call_id).await;
        }
        if self.prepared && response.status != Status::Success {
            // The caller was not told of the prepared call: nobody can commit it.
            gateway.abandon_prepared(call_id).await;
        }
        let (Some(key), Some(keep)) = (self.key, self.keep) else {
            return;
        };
        // An outcome the log could not record is never the key's answer when the
        // caller is told to retry: the retry must run (or record) again, not replay it.
        let keep = keep
            && !response
                .diagnostic
                .as_ref()
                .is_some_and(|d| d.reason == Reason::AuditUnavailable && d.retryable);
        match key {
            HeldKey::Local(guard) => guard.complete(gateway.stored_outcome(response).await, keep),
            HeldKey::Fleet(key) => {
                if let Some(cluster) = gateway.cluster() {
                    gateway.fleet_complete(cluster, &key, response, keep).await;
                }
            }
        }
    }
}

/// Whether an idempotency key keeps a call's outcome. It is released (a retry executes
/// again) when nothing reached the tool, when the caller cancelled the call, or when
/// the failure is retryable for an idempotent tool called with a key (`retry_safe`).
fn keeps_outcome(failed: Option<&Refusal>, executed: bool, retry_safe: bool) -> bool {
    !failed.is_some_and(|r| {
        !executed || r.reason == Reason::Cancelled || (retry_safe && r.diagnostic().retryable)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(idempotency_key: &str) -> Key {
        Key {
            run_id: "run-1".into(),
            role_id: "agent".into(),
            tool_name: "read_file".into(),
            idempotency_key: idempotency_key.into(),
        }
    }

    fn scope(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    #[test]
    fn the_fingerprint_covers_arguments_and_scope_in_canonical_form() {
        let first = KeyClaim::new(
            key("k"),
            &json!({ "path": "a.txt", "max": 3 }),
            &scope(json!({ "case_id": "c-1" })),
        );
        // Key order does not matter: the fingerprint is over canonical JSON.
        let reordered = KeyClaim::new(
            key("k"),
            &json!({ "max": 3, "path": "a.txt" }),
            &scope(json!({ "case_id": "c-1" })),
        );
        assert_eq!(first.fingerprint, reordered.fingerprint);
        let other_scope = KeyClaim::new(
            key("k"),
            &json!({ "path": "a.txt", "max": 3 }),
            &scope(json!({ "case_id": "c-2" })),
        );
        assert_ne!(first.fingerprint, other_scope.fingerprint);
        let other_arguments = KeyClaim::new(
            key("k"),
            &json!({ "path": "b.txt", "max": 3 }),
            &scope(json!({ "case_id": "c-1" })),
        );
        assert_ne!(first.fingerprint, other_arguments.fingerprint);
        // The fleet's sidecars compare fingerprints stored by each other: its form is
        // pinned (sha256 of `{"arguments":...,"scope":...}` in RFC 8785 form).
        assert_eq!(
            first.fingerprint,
            sha256_hex(br#"{"arguments":{"max":3,"path":"a.txt"},"scope":{"case_id":"c-1"}}"#)
        );
        assert_eq!(first.key, key("k"));
    }

    #[test]
    fn the_key_keeps_an_outcome_unless_a_retry_must_run_again() {
        let failed = Refusal::new(Reason::ToolError, "the tool failed");
        let cancelled = Refusal::new(Reason::Cancelled, "cancelled");
        let retryable = Refusal::new(Reason::ToolTimeout, "timed out").with_retryable(true);
        // (failure, reached the tool, retry_safe) -> kept
        let cases: [(Option<&Refusal>, bool, bool, bool); 8] = [
            (None, true, false, true),
            (None, true, true, true),
            (Some(&failed), true, false, true),
            (Some(&failed), false, false, false),
            (Some(&cancelled), true, false, false),
            (Some(&retryable), true, false, true),
            (Some(&retryable), true, true, false),
            (Some(&failed), true, true, true),
        ];
        for (failure, executed, retry_safe, kept) in cases {
            assert_eq!(
                keeps_outcome(failure, executed, retry_safe),
                kept,
                "{:?} executed={executed} retry_safe={retry_safe}",
                failure.map(|r| r.reason)
            );
        }
    }
}
