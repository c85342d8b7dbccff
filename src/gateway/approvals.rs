//! The gateway's approval operations: requesting an approval for a refused call and
//! claiming one on its retry (both called by the pipeline's approval gate, between
//! step 8 and step 9), the approvers' endpoints (list, show, decide), and the sweeper
//! that expires approvals and audits each expiry once.
//!
//! INVARIANT: every change of an approval is in the audit log before it takes effect
//! (requested, granted, denied); an expiry is audited exactly once, by the sweeper.
//! Decisions are serialized (one at a time), so quorum counts and status checks never
//! race; the claim of a retry is atomic in the store itself.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::approvals::evidence::{Agreement, Mismatch};
use crate::approvals::{
    self, ApprovalBackend, ApprovalRecord, ApprovalStatus, Binding, Decision, Requester,
    StoreError, Verdict,
};
use crate::audit::{EventFilter, EventType, NewEvent};
use crate::call::ApprovalRequirement;
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::principal::{Approver, Principal};
use crate::gateway::{Gateway, audit_refusal};
use crate::requests::{DecideApproval, ListApprovals};

/// What the pipeline knows of a call that needs an approval it did not present.
pub struct ApprovalRequest {
    pub call_id: String,
    pub binding: Binding,
    pub arguments: Option<Value>,
    pub redaction: String,
    pub scope: serde_json::Map<String, Value>,
    pub requester: Requester,
    pub requirements: Vec<ApprovalRequirement>,
    /// The `approval_requested` event, filled with the call's fields by the pipeline.
    pub event: NewEvent,
}

mod logged;
pub(crate) use logged::{FleetApprovals, HubLink};

/// `GET /v1/approvals`' answer: a page of the approvals the caller may see.
#[derive(Debug, serde::Serialize)]
pub struct ApprovalPage {
    pub approvals: Vec<ApprovalRecord>,
    /// Where the next page starts (None: this is the last).
    pub next_cursor: Option<String>,
}

fn store_refusal(e: StoreError) -> Refusal {
    Refusal::new(
        Reason::ApprovalStoreUnavailable,
        format!("the approval store could not be used: {e}"),
    )
}

fn unknown(approval_id: &str) -> Refusal {
    Refusal::new(
        Reason::ApprovalUnknown,
        format!(
            "no approval `{}` exists",
            approval_id.chars().take(128).collect::<String>()
        ),
    )
    .with_details(json!({ "approval_id": approval_id.chars().take(128).collect::<String>() }))
}

impl Gateway {
    /// `approval_unknown` for an id the store does not hold. In a fleet the approvals
    /// are shared (the cluster database): no sidecar holds it, and the refusal says so.
    fn unknown_approval(&self, approval_id: &str) -> Refusal {
        self.fleet_sidecar(unknown(approval_id))
    }

    /// In a fleet, names the answering sidecar in an approval refusal (`sidecar`) and
    /// says the approvals are shared (`approvals_shared: true`): the retry and the
    /// decisions may go through any sidecar of the fleet.
    fn fleet_sidecar(&self, mut refusal: Refusal) -> Refusal {
        if let (Some(cluster), Some(details)) = (&self.cluster, refusal.details.as_object_mut()) {
            details.insert("sidecar".into(), json!(cluster.node_id));
            details.insert("approvals_shared".into(), json!(true));
        }
        refusal
    }

    /// Runs a store operation on the blocking pool.
    async fn approval_store<T: Send + 'static>(
        &self,
        op: impl FnOnce(&dyn ApprovalBackend) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, Refusal> {
        let store = self.approvals.clone();
        match tokio::task::spawn_blocking(move || op(store.as_ref())).await {
            Ok(result) => result.map_err(store_refusal),
            Err(_) => Err(Refusal::new(
                Reason::ApprovalStoreUnavailable,
                "the approval store task failed",
            )),
        }
    }

    /// The approval gate, no `approval_id`: records a pending approval bound to the
    /// call (or finds the pending one of the same exact call), audits
    /// `approval_requested`, and returns the `approval_required` refusal.
    pub async fn request_approval(&self, request: ApprovalRequest) -> Refusal {
        let _one_at_a_time = self.approval_changes.lock().await;
        match self.request_approval_locked(request).await {
            Ok(refusal) | Err(refusal) => refusal,
        }
    }

    async fn request_approval_locked(&self, request: ApprovalRequest) -> Result<Refusal, Refusal> {
        let now = approvals::now_ms();
        let digest = request.binding.digest();
        let d = digest.clone();
        if let Some(existing) = self.approval_store(move |s| s.pending_for(&d, now)).await? {
            return Ok(self.fleet_sidecar(required(&existing, true)));
        }
        let (run_id, role_id) = (
            request.binding.run_id.clone(),
            request.binding.role_id.clone(),
        );
        let pending = self
            .approval_store(move |s| s.pending_counts(&run_id, &role_id, now))
            .await?;
        if pending.run >= approvals::MAX_PENDING_PER_RUN
            || pending.role >= approvals::MAX_PENDING_PER_ROLE
            || pending.total >= approvals::MAX_PENDING_TOTAL
        {
            return Err(Refusal::new(
                Reason::ApprovalLimitReached,
                format!(
                    "{} approvals are pending for this run, {} for this role and {} in total (limits {}, {} and {})",
                    pending.run,
                    pending.role,
                    pending.total,
                    approvals::MAX_PENDING_PER_RUN,
                    approvals::MAX_PENDING_PER_ROLE,
                    approvals::MAX_PENDING_TOTAL
                ),
            )
            .with_details(json!({
                "pending_for_run": pending.run,
                "pending_for_role": pending.role,
                "pending_total": pending.total,
                "max_pending_per_run": approvals::MAX_PENDING_PER_RUN,
                "max_pending_per_role": approvals::MAX_PENDING_PER_ROLE,
                "max_pending_total": approvals::MAX_PENDING_TOTAL,
                "retry_after_ms": 1000,
            })));
        }
        let ttl_s = request
            .requirements
            .iter()
            .map(|r| r.ttl_s)
            .min()
            .unwrap_or(crate::policy::DEFAULT_APPROVAL_TTL_S);
        let expires = now.saturating_add((ttl_s as i64).saturating_mul(1000));
        let record = ApprovalRecord {
            approval_id: approvals::new_approval_id(),
            status: ApprovalStatus::Pending,
            created_at: approvals::rfc3339_ms(now),
            expires_at: approvals::rfc3339_ms(expires),
            created_at_ms: now,
            expires_at_ms: expires,
            call_id: request.call_id,
            binding: request.binding,
            call_digest: digest,
            arguments: request.arguments,
            redaction: request.redaction,
            scope: request.scope,
            requester: request.requester,
            requirements: request.requirements,
            decisions: Vec::new(),
            used_by_call_id: None,
            used_at: None,
            attestation: None,
            row_disagrees: None,
        };
        let mut event = request.event;
        event.details.insert(
            "approval".into(),
            json!({
                "approval_id": record.approval_id,
                "call_digest": record.call_digest,
                "binding": record.binding,
                "expires_at": record.expires_at,
                "requirements": record.requirements,
            }),
        );
        // The log first: the store never holds an approval the log does not (a
        // request whose store write then fails is never announced, and expires).
        if let Err(e) = self.audit.append(event).await {
            return Err(Refusal::new(
                Reason::AuditUnavailable,
                format!("the audit log could not record the approval request: {e}"),
            ));
        }
        let stored = record.clone();
        self.approval_store(move |s| s.insert(&stored)).await?;
        Ok(self.fleet_sidecar(required(&record, false)))
    }

    /// The approval gate, with `approval_id`: the approval must be bound to this exact
    /// call and approved, by the audit log's evidence (not the store's word); it is
    /// claimed for `call_id` in the store (once: a concurrent retry finds it used).
    /// Returns the approval as the log has it (its logged decisions).
    pub async fn use_approval(
        &self,
        approval_id: &str,
        binding: &Binding,
        call_id: &str,
    ) -> Result<ApprovalRecord, Refusal> {
        let id = approval_id.to_string();
        let record = self
            .approval_store(move |s| s.get(&id))
            .await?
            .ok_or_else(|| self.unknown_approval(approval_id))?;
        self.attested(&record)?;
        // The evidence: the store is an index; the log says what was requested,
        // granted, expired and used.
        let checked = self.checked_approval(record).await?;
        let record = checked.record;
        self.attested(&record)?;
        let now = approvals::now_ms();
        let logged = match (&checked.evidence, checked.agreement) {
            (Some(_), Err(mismatch)) => return Err(self.store_mismatch(approval_id, mismatch)),
            (Some(_), Ok(Agreement::Behind)) => return Err(not_usable(&record, now)),
            (Some(evidence), Ok(Agreement::Same)) => evidence.record(&record, now),
            (None, _) => {
                // A fleet without the hub: the other sidecars' logs cannot be read
                // here, this one's can (its own uses).
                let own = self
                    .own_approval_evidence(approval_id, &record.binding.run_id)
                    .await?;
                if let Some(used_by) = own.used_by()
                    && record.used_by_call_id.as_deref() != Some(used_by)
                {
                    return Err(self.store_mismatch(
                        approval_id,
                        Mismatch {
                            field: "status",
                            store: json!({"status": record.status_at(now), "used_by_call_id": record.used_by_call_id}),
                            log: json!({"status": ApprovalStatus::Used, "used_by_call_id": used_by}),
                        },
                    ));
                }
                record.clone()
            }
        };
        // The call must be the one the approval was requested for.
        if let Some((reason, field)) = logged.binding.mismatch(binding) {
            return Err(Refusal::new(
                reason,
                format!(
                    "approval `{approval_id}` was requested for another call: its {field} differs"
                ),
            )
            .with_details(json!({ "approval_id": approval_id, "mismatch": field })));
        }
        let digest = binding.digest();
        if logged.call_digest != digest || logged.binding.digest() != digest {
            return Err(self.store_mismatch(
                approval_id,
                Mismatch {
                    field: "call_digest",
                    store: json!(logged.call_digest),
                    log: json!(digest),
                },
            ));
        }
        if logged.status_at(now) != ApprovalStatus::Approved {
            return Err(not_usable(&logged, now));
        }
        // The reads took time: the expiry is checked as of the claim.
        let now = approvals::now_ms();
        let (id, call) = (approval_id.to_string(), call_id.to_string());
        let used_at = approvals::rfc3339_ms(now);
        let claimed = self
            .approval_store(move |s| s.claim(&id, &call, now, &used_at))
            .await?;
        if claimed {
            return Ok(logged);
        }
        // Not claimable: say why, as of now (a lost race reads `used`).
        let id = approval_id.to_string();
        let record = self
            .approval_store(move |s| s.get(&id))
            .await?
            .ok_or_else(|| self.unknown_approval(approval_id))?;
        Err(not_usable(&record, approvals::now_ms()))
    }

    /// Gives back the approval a call claimed when nothing reached the tool (refused
    /// at step 9 or 10 before the adapter sent anything), so that the agent's retry can
    /// run under it; true when it was given back.
    pub async fn release_approval(&self, approval_id: &str, call_id: &str) -> bool {
        let (id, call) = (approval_id.to_string(), call_id.to_string());
        let now = approvals::now_ms();
        self.approval_store(move |s| s.release(&id, &call, now))
            .await
            .unwrap_or(false)
    }

    /// `GET /v1/approvals`: a page of the approvals the caller may see (an admin: all;
    /// a role: those it may decide and those it requested).
    pub async fn list_approvals(
        &self,
        principal: &Principal,
        query: ListApprovals,
    ) -> Result<ApprovalPage, Refusal> {
        let ListApprovals {
            status,
            run_id,
            limit,
            cursor,
            newest_first,
        } = query;
        let now = approvals::now_ms();
        let mut visible = Vec::new();
        let mut cursor = cursor;
        // Store pages filtered by what the caller may read, in a bounded number of
        // rounds; the next cursor is the last row looked at.
        let mut next = None;
        'pages: for _ in 0..8 {
            let run = run_id.clone();
            let (page, more) = self
                .approval_store(move |s| {
                    s.list(status, run.as_deref(), cursor, newest_first, limit, now)
                })
                .await?;
            for (rowid, record) in page {
                if visible.len() == limit {
                    next = Some(cursor);
                    break 'pages;
                }
                cursor = rowid;
                if principal.may_read(&record) {
                    visible.push(record.view(now));
                }
            }
            if !more {
                next = None;
                break;
            }
            next = Some(cursor);
            if visible.len() == limit {
                break;
            }
        }
        Ok(ApprovalPage {
            approvals: visible,
            next_cursor: next.map(|n| n.to_string()),
        })
    }

    /// `GET /v1/approvals/{id}`: the exact call (arguments as the tool's redaction
    /// keeps them), requester, run, policy versions, requirements, decisions, expiry.
    pub async fn get_approval(
        &self,
        principal: &Principal,
        approval_id: &str,
    ) -> Result<ApprovalRecord, Refusal> {
        if !crate::call::is_approval_id(approval_id) {
            return Err(self.unknown_approval(approval_id));
        }
        let id = approval_id.to_string();
        let record = self
            .approval_store(move |s| s.get(&id))
            .await?
            .ok_or_else(|| self.unknown_approval(approval_id))?;
        if !principal.may_read(&record) {
            return Err(Refusal::new(
                Reason::ApproverNotAllowed,
                format!("this credential may not read approval `{approval_id}`: it is neither one of its approvers nor its requester"),
            )
            .with_details(json!({ "approval_id": approval_id })));
        }
        Ok(record.view(approvals::now_ms()))
    }

    /// `POST /v1/approvals/{id}/decision`: an approver named by the approval approves
    /// or denies it, with a reason. Never the requester itself; each subject once.
    /// Who may decide, whether it is still pending and who already decided are read
    /// from the audit log's evidence, not from the store (an edited store is refused,
    /// `approval_store_mismatch`). The decision is audited (`approval_granted` /
    /// `approval_denied`) before it takes effect.
    pub async fn decide_approval(
        &self,
        approver: &Approver,
        approval_id: &str,
        request: DecideApproval,
    ) -> Result<ApprovalRecord, Refusal> {
        let principal: &Principal = approver;
        let DecideApproval { decision, reason } = request;
        if !crate::call::is_approval_id(approval_id) {
            return Err(self.unknown_approval(approval_id));
        }
        let _one_at_a_time = self.approval_changes.lock().await;
        let id = approval_id.to_string();
        let stored = self
            .approval_store(move |s| s.get(&id))
            .await?
            .ok_or_else(|| self.unknown_approval(approval_id))?;
        // The approval as the log has it: who may decide, who asked, who decided.
        let checked = self.checked_approval(stored).await?;
        let evidence = checked.evidence;
        let now = approvals::now_ms();
        let record = match (&evidence, checked.agreement) {
            (Some(evidence), Err(mismatch)) => {
                // Recorded with the call the log says it is about, not the store's.
                let mut about = checked.record;
                if let Some(requested) = &evidence.requested {
                    about.call_id.clone_from(&requested.call_id);
                    about.call_digest.clone_from(&requested.call_digest);
                    about.binding = requested.binding.clone();
                }
                let refusal = self.store_mismatch(approval_id, mismatch);
                return Err(self
                    .refused_decision(&about, principal, decision, refusal)
                    .await);
            }
            (Some(evidence), Ok(_)) => evidence.record(&checked.record, now),
            (None, _) => checked.record,
        };
        // Who decides: an eligible admin, else an eligible role the credential proves.
        let admin = principal
            .admin()
            .filter(|a| record.eligible(a.trim_start_matches("admin:")));
        let role = principal.roles().iter().find(|r| record.eligible(r));
        let approver = match (admin, role) {
            (Some(admin), _) => admin.to_string(),
            (None, Some(role)) => format!("role:{role}"),
            (None, None) => {
                let approvers: Vec<&String> = record
                    .requirements
                    .iter()
                    .flat_map(|r| &r.approvers)
                    .collect();
                let refusal = Refusal::new(
                    Reason::ApproverNotAllowed,
                    format!("this credential is not an approver of approval `{approval_id}`"),
                )
                .with_details(json!({ "approval_id": approval_id, "approvers": approvers }));
                return Err(self
                    .refused_decision(&record, principal, decision, refusal)
                    .await);
            }
        };
        // Never the requester: not its role, not its JWT subject.
        let own_role = format!("role:{}", record.requester.role_id);
        let same_subject = principal.subject().is_some()
            && principal.subject() == record.requester.subject().as_deref();
        if approver == own_role
            || principal.roles().contains(&record.requester.role_id)
            || same_subject
        {
            let refusal = Refusal::new(
                Reason::SelfApprovalRefused,
                format!("the requester of approval `{approval_id}` may not decide it"),
            )
            .with_details(json!({ "approval_id": approval_id, "requester": record.requester }));
            return Err(self
                .refused_decision(&record, principal, decision, refusal)
                .await);
        }
        match record.status_at(now) {
            ApprovalStatus::Pending => {}
            ApprovalStatus::Expired => return Err(not_usable(&record, now)),
            status => {
                return Err(Refusal::new(
                    Reason::ApprovalAlreadyDecided,
                    format!(
                        "approval `{approval_id}` is {}, no longer pending",
                        status.as_str()
                    ),
                )
                .with_details(json!({ "approval_id": approval_id, "status": status })));
            }
        }
        let vote = Decision {
            approver,
            subject: principal.subject().map(str::to_string),
            decision,
            reason,
            at: approvals::rfc3339_ms(now),
        };
        // Each subject once, whichever approver role it decides as: one person whose
        // token proves two approver roles is one approver.
        let already = match &evidence {
            Some(evidence) => evidence.decided_by(&vote.approver, vote.subject.as_deref()),
            None => record
                .decisions
                .iter()
                .any(|d| d.subject_key() == vote.subject_key()),
        };
        if already {
            return Err(Refusal::new(
                Reason::ApprovalAlreadyDecided,
                format!(
                    "{} already decided approval `{approval_id}`; each approver counts once, whichever approver role it decides as",
                    vote.who()
                ),
            )
            .with_details(json!({ "approval_id": approval_id, "status": "pending" })));
        }
        let mut decided = record.clone();
        decided.decisions.push(vote.clone());
        decided.status = match decision {
            Verdict::Deny => ApprovalStatus::Denied,
            Verdict::Approve if decided.quorum_met() => ApprovalStatus::Approved,
            Verdict::Approve => ApprovalStatus::Pending,
        };
        // In a fleet with a fleet key, the grant is signed: the sidecar that uses it
        // checks the signature, not only the shared row.
        decided.attestation = None;
        if decided.status == ApprovalStatus::Approved
            && let Some(key) = self.fleet_key()
        {
            decided.attestation = Some(approvals::attestation::sign(&decided, key));
        }
        let event_type = match decision {
            Verdict::Approve => EventType::ApprovalGranted,
            Verdict::Deny => EventType::ApprovalDenied,
        };
        let mut event = approval_event(event_type, &decided);
        event.details.insert("by".into(), json!(vote.approver));
        if let Some(subject) = &vote.subject {
            event.details.insert("subject".into(), json!(subject));
        }
        event.details.insert("reason".into(), json!(vote.reason));
        event.details.insert(
            "quorum_met".into(),
            json!(decided.status == ApprovalStatus::Approved),
        );
        event.details.insert("status".into(), json!(decided.status));
        self.audit.append(event).await.map_err(audit_refusal)?;
        let stored = decided.clone();
        // The append took time: the expiry is checked as of the update.
        let now = approvals::now_ms();
        let written = self
            .approval_store(move |s| s.update_decided(&stored, ApprovalStatus::Pending, now))
            .await?;
        if !written {
            let id = approval_id.to_string();
            let current = self
                .approval_store(move |s| s.get(&id))
                .await?
                .ok_or_else(|| self.unknown_approval(approval_id))?;
            return Err(not_usable(&current, approvals::now_ms()));
        }
        Ok(decided.view(approvals::now_ms()))
    }

    /// Expires every approval past its expiry and audits each expiry once. The store
    /// marks the approval expired first (nothing else can change it after its expiry
    /// anyway), then the event is appended, then the store notes it is audited; an
    /// approval found marked but not noted (a crash in between) is audited only if the
    /// log does not already hold its `approval_expired`.
    pub async fn sweep_approvals(&self) -> Result<usize, Refusal> {
        let _one_at_a_time = self.approval_sweep.lock().await;
        let now = approvals::now_ms();
        let due = self
            .approval_store(move |s| s.due_expiries(now, 100))
            .await?;
        let mut expired = 0;
        for record in due {
            let already_marked = record.status == ApprovalStatus::Expired;
            if already_marked && self.expiry_in_log(&record).await? {
                let id = record.approval_id.clone();
                self.approval_store(move |s| s.expiry_audited(&id)).await?;
                continue;
            }
            // In a fleet another sidecar's sweeper may have it: one writes the event.
            let id = record.approval_id.clone();
            if !self
                .approval_store(move |s| s.claim_expiry(&id, now))
                .await?
            {
                continue;
            }
            let mut event = approval_event(EventType::ApprovalExpired, &record);
            event
                .details
                .insert("status_before".into(), json!(record.status));
            event.details.insert("by".into(), json!("sweeper"));
            event.details.insert(
                "reason".into(),
                json!(match record.status {
                    ApprovalStatus::Approved => "approved but not used before it expired",
                    _ => "not decided before it expired",
                }),
            );
            self.audit.append(event).await.map_err(audit_refusal)?;
            let id = record.approval_id.clone();
            self.approval_store(move |s| s.expiry_audited(&id)).await?;
            expired += 1;
        }
        Ok(expired)
    }

    /// Records a proven credential's refused decision (`approval_decision_refused`:
    /// who tried, what, and why it was refused) and gives back the refusal; if the log
    /// cannot take it, the caller is told so instead.
    async fn refused_decision(
        &self,
        record: &ApprovalRecord,
        principal: &Principal,
        decision: Verdict,
        refusal: Refusal,
    ) -> Refusal {
        let mut event = approval_event(EventType::ApprovalDecisionRefused, record);
        event.details.insert(
            "by".into(),
            json!({
                "admin": principal.admin(),
                "roles": principal.roles(),
                "subject": principal.subject(),
            }),
        );
        event.details.insert("decision".into(), json!(decision));
        event
            .details
            .insert("refused".into(), json!(refusal.reason.as_str()));
        match self.audit.append(event).await {
            Ok(_) => refusal,
            Err(e) => audit_refusal(e),
        }
    }

    /// Whether the audit log already holds the `approval_expired` of `record`.
    async fn expiry_in_log(&self, record: &ApprovalRecord) -> Result<bool, Refusal> {
        let events = self
            .audit
            .events(EventFilter {
                run_id: Some(record.binding.run_id.clone()),
                event_types: vec![EventType::ApprovalExpired],
                ..EventFilter::default()
            })
            .await
            .map_err(audit_refusal)?;
        Ok(events
            .iter()
            .any(|e| e.value["details"]["approval_id"] == json!(record.approval_id)))
    }

    /// Starts the sweeper: every `SWEEP_INTERVAL_MS`, expired approvals are recorded
    /// (and, now and then, the oldest finished ones pruned). It stops when the
    /// gateway is dropped.
    pub fn spawn_approval_sweeper(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut rounds: u64 = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(approvals::SWEEP_INTERVAL_MS)).await;
                let Some(gateway) = weak.upgrade() else { break };
                if let Err(refusal) = gateway.sweep_approvals().await {
                    tracing::warn!(reason = refusal.reason.as_str(), message = %refusal.message, "approval sweep failed");
                }
                rounds += 1;
                if rounds.is_multiple_of(120) {
                    let _ = gateway
                        .approval_store(|s| s.prune(approvals::MAX_FINISHED_KEPT))
                        .await;
                }
            }
        });
    }
}

/// An event about an approval, carrying the bound call's identifiers.
fn approval_event(event_type: EventType, record: &ApprovalRecord) -> NewEvent {
    let mut event = NewEvent::new(event_type);
    event.call_id = Some(record.call_id.clone());
    event.run_id = Some(record.binding.run_id.clone());
    event.role_id = Some(record.binding.role_id.clone());
    event.lane_id = Some(record.binding.lane_id.clone());
    event.tool_name = Some(record.binding.tool_name.clone());
    event.tool_version = Some(record.binding.tool_version.clone());
    event.policy_versions = Some(std::sync::Arc::new(record.binding.policy_versions.clone()));
    event.arguments_hash_sha256 = Some(record.binding.arguments_sha256.clone());
    event
        .details
        .insert("approval_id".into(), json!(record.approval_id));
    event
        .details
        .insert("call_digest".into(), json!(record.call_digest));
    event
}

/// The `approval_required` refusal for `record` (`reused`: the pending approval of
/// an earlier identical call).
fn required(record: &ApprovalRecord, reused: bool) -> Refusal {
    let id = &record.approval_id;
    Refusal::new(
        Reason::ApprovalRequired,
        format!(
            "`{}` needs human approval for this call; approval `{id}` is pending until {}: retry the same call with \"approval_id\": \"{id}\" once it is approved",
            record.binding.tool_name, record.expires_at
        ),
    )
    .with_details(json!({
        "approval_id": id,
        "status": "pending",
        "expires_at": record.expires_at,
        "call_digest": record.call_digest,
        "requirements": record.requirements,
        "approval_url": format!("/v1/approvals/{id}"),
        "retry_with": { "approval_id": id },
        "reused": reused,
        "next": "an approver decides with POST /v1/approvals/{approval_id}/decision; poll GET /v1/approvals/{approval_id} (your role may read it) and, once its status is approved, send exactly the same call again with approval_id set",
    }))
}

/// Why `record` cannot be used (or decided) now.
fn not_usable(record: &ApprovalRecord, now_ms: i64) -> Refusal {
    let id = &record.approval_id;
    let (reason, message) = match record.status_at(now_ms) {
        ApprovalStatus::Pending => (
            Reason::ApprovalPending,
            format!("approval `{id}` is not decided yet; retry after it is approved"),
        ),
        ApprovalStatus::Denied => (
            Reason::ApprovalDenied,
            format!("approval `{id}` was denied"),
        ),
        ApprovalStatus::Expired => (
            Reason::ApprovalExpired,
            format!("approval `{id}` expired at {}", record.expires_at),
        ),
        ApprovalStatus::Used => (
            Reason::ApprovalUsed,
            format!(
                "approval `{id}` was already used by call `{}`",
                record.used_by_call_id.as_deref().unwrap_or("?")
            ),
        ),
        ApprovalStatus::Approved => (
            Reason::ApprovalPending,
            format!("approval `{id}` is approved but could not be claimed; retry"),
        ),
    };
    Refusal::new(reason, message).with_details(json!({
        "approval_id": id,
        "status": record.status_at(now_ms),
        "expires_at": record.expires_at,
        "decisions": record.decisions,
        "used_by_call_id": record.used_by_call_id,
    }))
}
