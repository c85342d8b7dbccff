//! What the audit logs hold of one approval ([`Evidence`]), read for a retry that
//! presents it and for a decision on it, and the refusals of a store that the
//! evidence or the fleet key's attestation contradicts.
//!
//! One sidecar: its own log, read through the run's index (`events.run_id`, which
//! holds the seq too) from shortly before the store says the approval was requested
//! (an earlier time is the insider's only lever, and it only costs a longer read), for
//! the lines naming the approval id (`instr`, before any JSON is parsed): a read of
//! the run's events since the request, not of the log. If that finds no request (the
//! store's run or time edited, or an id the log never saw), one search of the
//! `approval_requested` events (their type index) finds where it really is.
//!
//! A fleet that ships to the audit hub: this sidecar's own log (its own decisions and
//! uses, whatever the hub holds yet) and the other sidecars' logs in the hub (one
//! query on the run's index of `hub_events`), read once the hub holds every other
//! sidecar's log up to the moment the read began (`hub::coverage`), waiting at most
//! [`HUB_WAIT`]. A sidecar whose coverage stopped more than [`FRESH`] before the
//! approval was requested is not waited for: it could not have decided or used it,
//! because a sidecar decides and uses approvals only while its own coverage is within
//! [`FRESH`] of now. Past the wait the answer is `approval_evidence_unavailable`
//! (retryable): an unproven "unused" is never honoured.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::approvals::evidence::{Agreement, Evidence, Mismatch};
use crate::approvals::{self, ApprovalRecord, ApprovalStatus};
use crate::audit::{EventFilter, EventType};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::{Gateway, audit_refusal};

/// What a fleet member checks approvals with: the fleet key (signs and checks the
/// decisions' attestations) and the audit hub (the other sidecars' evidence).
#[derive(Default)]
pub(crate) struct FleetApprovals {
    pub key: Option<std::sync::Arc<crate::audit::keys::SignerKey>>,
    pub hub: Option<HubLink>,
}

/// The audit hub a fleet's sidecars ship to, as this sidecar reads it.
pub(crate) struct HubLink {
    pub pool: deadpool_postgres::Pool,
    /// This sidecar's own origin in the hub (its own log is read locally).
    pub origin: String,
}

/// The longest a retry or a decision waits for the hub to hold every other sidecar's
/// log up to the moment it asked.
pub const HUB_WAIT: Duration = Duration::from_secs(5);
/// How often the hub's coverage is read again while waiting.
const HUB_POLL: Duration = Duration::from_millis(100);
/// A sidecar decides or uses an approval only while the hub holds its own log up to
/// this long ago (its shipping works); and one whose coverage ended this long before
/// an approval was requested is not waited for.
pub const FRESH: Duration = Duration::from_secs(30);
/// How much earlier than the store's `created_at` the local read starts (the store and
/// the log take their times from the same clock, a moment apart).
const CREATED_SLACK_MS: i64 = 1000;

/// The event types that carry an approval's evidence.
const TYPES: [EventType; 9] = [
    EventType::ApprovalRequested,
    EventType::ApprovalGranted,
    EventType::ApprovalDenied,
    EventType::ApprovalExpired,
    EventType::ToolRequested,
    EventType::ToolExecuted,
    EventType::ToolFailed,
    EventType::ToolTimeout,
    EventType::ToolDenied,
];

fn unavailable(message: String, details: Value) -> Refusal {
    Refusal::new(Reason::ApprovalEvidenceUnavailable, message).with_details(details)
}

/// What the store and the log say of one approval.
pub(super) struct Checked {
    /// The store's record (read again when it changed while the log was read).
    pub record: ApprovalRecord,
    /// The log's evidence (None in a fleet without the hub).
    pub evidence: Option<Evidence>,
    /// How the store stands against the log (always `Same` without evidence).
    pub agreement: Result<Agreement, Mismatch>,
}

/// How many times the store is read again when it changed while the log was read.
const REREADS: usize = 3;

impl Gateway {
    /// The store's record of an approval (`record`, just read) checked against the
    /// log's evidence. The store and the log are read one after the other, not at one
    /// instant: a claim or an expiry that lands in between is in the log the second read
    /// sees but not in the store the first read saw (the store takes those first), and
    /// would read as an edit. So a disagreement counts only when the store, read again,
    /// is what it was before the log was read; otherwise the log is read again with the
    /// newer record, a few times at most.
    pub(super) async fn checked_approval(
        &self,
        mut record: ApprovalRecord,
    ) -> Result<Checked, Refusal> {
        let mut round = 0;
        loop {
            let Some(evidence) = self.approval_evidence(&record).await? else {
                return Ok(Checked {
                    record,
                    evidence: None,
                    agreement: Ok(Agreement::Same),
                });
            };
            let agreement = evidence.compare(&record, approvals::now_ms());
            if agreement.is_ok() || round == REREADS {
                return Ok(Checked {
                    record,
                    evidence: Some(evidence),
                    agreement,
                });
            }
            round += 1;
            let id = record.approval_id.clone();
            let again = self
                .approval_store(move |s| s.get(&id))
                .await?
                .ok_or_else(|| self.unknown_approval(&record.approval_id))?;
            if again == record {
                return Ok(Checked {
                    record,
                    evidence: Some(evidence),
                    agreement,
                });
            }
            record = again;
        }
    }

    /// A fleet's shared row says approved only with the deciding sidecar's fleet-key
    /// signature over its id, digest, approvers and expiry.
    pub(super) fn attested(&self, record: &ApprovalRecord) -> Result<(), Refusal> {
        let approval_id = &record.approval_id;
        if self.approvals.shared()
            && record.status_at(approvals::now_ms()) == ApprovalStatus::Approved
            && let Some(key) = self.fleet_key()
            && let Err(why) = approvals::attestation::verify(record, &key.verifier)
        {
            return Err(Refusal::new(
                Reason::ApprovalAttestationInvalid,
                format!(
                    "approval `{approval_id}` reads approved in the cluster database but {why}: it is not used"
                ),
            )
            .with_details(json!({ "approval_id": approval_id })));
        }
        Ok(())
    }

    /// The refusal of a store that disagrees with the audit log about an approval,
    /// counted by field (`toolgate_approval_store_mismatches_total`).
    pub(super) fn store_mismatch(&self, approval_id: &str, mismatch: Mismatch) -> Refusal {
        self.metrics.count_approval_store_mismatch(mismatch.field);
        tracing::error!(
            approval_id,
            field = mismatch.field,
            store = %mismatch.store,
            log = %mismatch.log,
            "the approval store disagrees with the audit log: the store is not honoured"
        );
        self.fleet_sidecar(
            Refusal::new(
                Reason::ApprovalStoreMismatch,
                format!(
                    "approval `{approval_id}`: the approval store's {} disagrees with the audit log; the store is not honoured",
                    mismatch.field
                ),
            )
            .with_details(json!({
                "approval_id": approval_id,
                "field": mismatch.field,
                "store": mismatch.store,
                "log": mismatch.log,
            })),
        )
    }

    /// The evidence of `record`'s approval: this sidecar's log, and in a fleet that
    /// ships to the hub, the other sidecars' logs there. None in a fleet without the
    /// hub, where only this sidecar's own uses can be read
    /// ([`Gateway::own_approval_evidence`]).
    async fn approval_evidence(
        &self,
        record: &ApprovalRecord,
    ) -> Result<Option<Evidence>, Refusal> {
        match (&self.cluster, &self.fleet_approvals.hub) {
            (None, _) => self.local_evidence(record).await.map(Some),
            (Some(_), Some(hub)) => self.fleet_evidence(record, hub).await.map(Some),
            (Some(_), None) => Ok(None),
        }
    }

    /// This sidecar's own log's evidence of the approval in run `run_id` (in a fleet
    /// without the hub: its own uses at least).
    pub(super) async fn own_approval_evidence(
        &self,
        approval_id: &str,
        run_id: &str,
    ) -> Result<Evidence, Refusal> {
        let events = self.own_events(approval_id, run_id, None).await?;
        Ok(Evidence::from_events(
            approval_id,
            events.iter().map(|(seq, v)| (*seq, v)),
        ))
    }

    /// The lines of this log naming `approval_id` in run `run_id`, from `since` on.
    async fn own_events(
        &self,
        approval_id: &str,
        run_id: &str,
        since: Option<time::OffsetDateTime>,
    ) -> Result<Vec<(u64, Value)>, Refusal> {
        let events = self
            .audit
            .events(EventFilter {
                run_id: Some(run_id.to_string()),
                event_types: TYPES.to_vec(),
                contains: Some(approval_id.to_string()),
                since,
                ..EventFilter::default()
            })
            .await
            .map_err(audit_refusal)?;
        Ok(events.into_iter().map(|e| (e.seq, e.value)).collect())
    }

    /// One sidecar: its log is the whole evidence.
    async fn local_evidence(&self, record: &ApprovalRecord) -> Result<Evidence, Refusal> {
        let id = &record.approval_id;
        let since = time::OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(record.created_at_ms.saturating_sub(CREATED_SLACK_MS)) * 1_000_000,
        )
        .ok();
        let events = self.own_events(id, &record.binding.run_id, since).await?;
        let evidence = Evidence::from_events(id, events.iter().map(|(seq, v)| (*seq, v)));
        if evidence.requested.is_some() {
            return Ok(evidence);
        }
        // Not where the store says: find the request itself, wherever it is.
        let found = self
            .audit
            .events(EventFilter {
                event_types: vec![EventType::ApprovalRequested],
                contains: Some(id.clone()),
                ..EventFilter::default()
            })
            .await
            .map_err(audit_refusal)?;
        let run = found.iter().find_map(|e| {
            (e.value["details"]["approval"]["approval_id"] == json!(id))
                .then(|| e.value["run_id"].as_str().map(str::to_string))
                .flatten()
        });
        let Some(run) = run else {
            return Ok(evidence);
        };
        let events = self.own_events(id, &run, None).await?;
        Ok(Evidence::from_events(
            id,
            events.iter().map(|(seq, v)| (*seq, v)),
        ))
    }

    /// A fleet that ships to the hub: this log and the others' in the hub, once the
    /// hub holds each of them up to now (see the module's comment).
    async fn fleet_evidence(
        &self,
        record: &ApprovalRecord,
        hub: &HubLink,
    ) -> Result<Evidence, Refusal> {
        let id = &record.approval_id;
        let run = &record.binding.run_id;
        let hub_error = |e: crate::hub::HubError| {
            unavailable(
                format!("the audit hub could not be read for approval `{id}`: {e}"),
                json!({ "approval_id": id, "hub": e.to_json() }),
            )
        };
        let asked = crate::hub::coverage::clock_ms(&hub.pool)
            .await
            .map_err(hub_error)?;
        let fresh_ms = i64::try_from(FRESH.as_millis()).unwrap_or(i64::MAX);
        let deadline = Instant::now() + HUB_WAIT;
        loop {
            // The coverage first, then the lines: what the coverage promises is in.
            let coverage = crate::hub::coverage::coverage(&hub.pool)
                .await
                .map_err(hub_error)?;
            let mut events = self.own_events(id, run, None).await?;
            for (_, seq, line) in
                crate::hub::coverage::lines_naming(&hub.pool, run, id, &hub.origin)
                    .await
                    .map_err(hub_error)?
            {
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    events.push((seq, value));
                }
            }
            let evidence = Evidence::from_events(id, events.iter().map(|(seq, v)| (*seq, v)));
            let requested_ms = evidence.requested.as_ref().map(|r| r.at_ms);
            let mut waiting = Vec::new();
            for (origin, covered) in &coverage.logs {
                let covered = covered.unwrap_or(i64::MIN);
                if *origin == hub.origin {
                    // This sidecar's own shipping must work: its decisions and uses
                    // are how the others learn of them.
                    if covered < asked.saturating_sub(fresh_ms) {
                        waiting.push(origin.clone());
                    }
                    continue;
                }
                let gone_before =
                    requested_ms.is_some_and(|at| covered < at.saturating_sub(fresh_ms));
                if covered < asked && !gone_before {
                    waiting.push(origin.clone());
                }
            }
            if !coverage.logs.iter().any(|(o, _)| *o == hub.origin) {
                waiting.push(hub.origin.clone());
            }
            if waiting.is_empty() {
                return Ok(evidence);
            }
            if Instant::now() >= deadline {
                return Err(unavailable(
                    format!(
                        "the audit hub does not hold every sidecar's log up to now ({} waited for): whether approval `{id}` was decided or used elsewhere is not proven",
                        waiting.join(", ")
                    ),
                    json!({
                        "approval_id": id,
                        "waiting_for": waiting,
                        "waited_ms": HUB_WAIT.as_millis() as u64,
                        "retry_after_ms": 1000,
                    }),
                ));
            }
            tokio::time::sleep(HUB_POLL).await;
        }
    }
}
