//! The gateway's operations when it is one sidecar of a fleet (`serve --cluster-db`):
//! runs, run tokens and the safety lock read from and written to the cluster database
//! (see `cluster`), each change recorded in the local audit log inside the database
//! transaction that makes it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::audit::{EventType, NewEvent};
use crate::call::CallResponse;
use crate::cluster::ClusterDb;
use crate::cluster::state::FleetClaim;
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::{Gateway, SafetyLock, audit_refusal, run_refusal};
use crate::idempotency::Key;
use crate::identity::RunTokenStore;
use crate::identity::run_tokens::IssuedToken;
use crate::policy::{PolicyVersions, RunStatus};
use crate::runs::{self, RunError, RunRecord};

/// How much longer than the tool's longest deadline a repeat waits for the first call
/// of its idempotency key on another sidecar.
pub(crate) const FLEET_CLAIM_SLACK: Duration = Duration::from_secs(5);
/// The longest a repeat waits for the first call of its key.
pub(crate) const FLEET_CLAIM_WAIT_MAX: Duration = Duration::from_secs(120);
/// How often a waiting repeat looks at the first call's claim again.
const FLEET_CLAIM_POLL: Duration = Duration::from_millis(25);

impl Gateway {
    /// Claims an idempotency key in the cluster database: `Ok(None)` when this call is
    /// the first (run it, then [`Gateway::fleet_complete`]), the first call's response
    /// to replay, or a refusal (conflict, still in flight after `wait`, database down).
    pub(crate) async fn fleet_claim(
        &self,
        cluster: &ClusterDb,
        key: &Key,
        fingerprint: &str,
        wait: Duration,
    ) -> Result<Option<CallResponse>, Refusal> {
        let deadline = Instant::now() + wait;
        loop {
            match cluster.claim(key, fingerprint).await? {
                FleetClaim::First => return Ok(None),
                FleetClaim::Done(first) => return Ok(Some(*first)),
                FleetClaim::Conflict => {
                    return Err(Refusal::new(
                        Reason::IdempotencyConflict,
                        "`idempotency_key` was already used with different arguments or another scope",
                    ));
                }
                FleetClaim::InFlight { holder, age_ms } if Instant::now() >= deadline => {
                    // Who holds the claim and since when: a claim older than the tool's
                    // longest deadline belongs to a sidecar that died before storing
                    // the outcome (docs/deployment.md, stale idempotency claims).
                    return Err(Refusal::new(
                        Reason::IdempotencyInFlight,
                        format!(
                            "the first call with this idempotency key was still running after {} ms",
                            wait.as_millis()
                        ),
                    )
                    .with_details(json!({
                        "retry_after_ms": 1000,
                        "claimed_by": holder,
                        "claim_age_ms": age_ms,
                    })));
                }
                FleetClaim::InFlight { .. } => tokio::time::sleep(FLEET_CLAIM_POLL).await,
            }
        }
    }

    /// Completes this call's claim: the response is kept for every repeat (`keep`), or
    /// the key released. A claim that cannot be completed (the database went down)
    /// stays in flight, and repeats are refused rather than executed again.
    pub(crate) async fn fleet_complete(
        &self,
        cluster: &ClusterDb,
        key: &Key,
        response: &CallResponse,
        keep: bool,
    ) {
        let outcome = keep.then(|| serde_json::to_value(response).unwrap_or(Value::Null));
        if let Err(refusal) = cluster.complete_claim(key, outcome).await {
            tracing::error!(
                run_id = %key.run_id, tool = %key.tool_name, message = %refusal.message,
                "an idempotency claim could not be completed in the cluster database; repeats of its key are refused until an operator clears it"
            );
        }
    }

    /// Joins a fleet: shared state lives in `cluster` from now on.
    pub fn with_cluster(mut self, cluster: Arc<ClusterDb>) -> Gateway {
        // Budgets and rates count across the fleet: the shared counters replace the
        // local `counters.db` (which a fleet sidecar does not use).
        self.counters = match tokio::runtime::Handle::try_current() {
            Ok(handle) => Ok(Arc::new(crate::cluster::counters::PgCounters::new(
                cluster.clone(),
                handle,
            ))),
            Err(_) => Err("the shared counters need the async runtime".into()),
        };
        // Approvals are shared too: requested through one sidecar, decided and used
        // through any (the local `approvals.db` is not used in a fleet).
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            self.approvals = Arc::new(crate::cluster::approvals::PgApprovals::new(
                cluster.clone(),
                handle,
            ));
        }
        self.cluster = Some(cluster);
        self
    }

    /// The cluster database, when this sidecar is part of a fleet.
    pub fn cluster(&self) -> Option<&Arc<ClusterDb>> {
        self.cluster.as_ref()
    }

    /// Signs approval decisions with the fleet key and requires its signature on an
    /// approval used in the fleet (`approvals::attestation`).
    pub fn with_fleet_key(mut self, key: Arc<crate::audit::keys::SignerKey>) -> Gateway {
        self.fleet_approvals.key = Some(key);
        self
    }

    /// Reads the other sidecars' approval decisions and uses from the audit hub
    /// (`pool`), where this sidecar ships its own log under `origin`
    /// (`gateway::approvals`, "evidence").
    pub fn with_hub(mut self, pool: deadpool_postgres::Pool, origin: String) -> Gateway {
        self.fleet_approvals.hub = Some(super::approvals::HubLink { pool, origin });
        self
    }

    /// The fleet key, when this sidecar has one.
    pub fn fleet_key(&self) -> Option<&crate::audit::keys::SignerKey> {
        self.fleet_approvals.key.as_deref()
    }

    /// In a fleet, re-reads from the cluster database what a request is decided on:
    /// the run it names and the run token it carries (with the token's run), into the
    /// local tables. Returns the named run (None: no such run). Outside a fleet it does
    /// nothing and returns None.
    pub async fn fleet_refresh(
        &self,
        token: Option<&str>,
        run_id: Option<&str>,
    ) -> Result<Option<RunRecord>, Refusal> {
        let Some(cluster) = &self.cluster else {
            return Ok(None);
        };
        if let Some(hash) = token.and_then(RunTokenStore::hash_of) {
            let found = cluster.token(&hash).await?;
            if let Some((binding, _)) = &found
                && let Some(run) = cluster.get_run(&binding.run_id).await?
            {
                self.runs.remember(run);
            }
            self.run_tokens.remember(&hash, found);
        }
        let Some(run_id) = run_id.filter(|r| runs::valid_run_id(r)) else {
            return Ok(None);
        };
        let run = cluster.get_run(run_id).await?;
        if let Some(run) = &run {
            self.runs.remember(run.clone());
        }
        Ok(run)
    }

    /// In a fleet, re-reads a bearer run token's binding (and its run) from the
    /// cluster database before a front reads the ids it names; nothing outside one.
    pub async fn fleet_token(&self, token: Option<String>) -> Result<(), Refusal> {
        self.fleet_refresh(token.as_deref(), None).await.map(|_| ())
    }

    /// Before steps 1-8 of a call in a fleet: re-reads the call's run and run token
    /// ([`Gateway::fleet_refresh`]) and checks that the safety lock's state is
    /// confirmed within its bound (else `safety_lock_unconfirmed`). Returns the run.
    pub(crate) async fn fleet_preflight(
        &self,
        token: Option<&str>,
        run_id: &str,
    ) -> Result<Option<RunRecord>, Refusal> {
        let run = self.fleet_refresh(token, Some(run_id)).await?;
        if let Some(cluster) = &self.cluster
            && !cluster.safety_lock().1
        {
            let bound = crate::cluster::LOCK_BOUND.as_millis() as u64;
            return Err(Refusal::new(
                Reason::SafetyLockUnconfirmed,
                format!(
                    "the safety lock's state was not confirmed from the cluster database within {bound} ms; treated as engaged"
                ),
            )
            .with_details(json!({ "bound_ms": bound })));
        }
        Ok(run)
    }

    /// `serve --cluster-db`: creates the run in the cluster database (atomic across
    /// sidecars), recording `run_created` locally before the commit.
    pub(super) async fn fleet_create_run(
        &self,
        cluster: &ClusterDb,
        record: RunRecord,
    ) -> Result<RunRecord, Refusal> {
        cluster
            .create_run(&record, || async {
                self.audit
                    .append(runs::created_event(&record))
                    .await
                    .map(|_| ())
                    .map_err(RunError::Audit)
            })
            .await
            .map_err(run_refusal)?;
        self.runs.remember(record.clone());
        Ok(record)
    }

    pub(super) async fn fleet_set_run_status(
        &self,
        cluster: &ClusterDb,
        run_id: &str,
        status: RunStatus,
        by: &str,
    ) -> Result<RunRecord, Refusal> {
        let (_, new) = cluster
            .update_run(
                run_id,
                |old| {
                    if old.status == RunStatus::Closed && status != RunStatus::Closed {
                        return Err(RunError::Closed(run_id.to_string()));
                    }
                    let mut new = old.clone();
                    new.status = status;
                    Ok(new)
                },
                |old, new| async move {
                    self.audit
                        .append(runs::status_event(run_id, old.status, new.status, by))
                        .await
                        .map(|_| ())
                        .map_err(RunError::Audit)
                },
            )
            .await
            .map_err(run_refusal)?;
        self.runs.remember(new.clone());
        Ok(new)
    }

    pub(super) async fn fleet_repin(
        &self,
        cluster: &ClusterDb,
        run_id: &str,
        versions: PolicyVersions,
        by: &str,
        scope_check: Value,
    ) -> Result<(RunRecord, PolicyVersions), Refusal> {
        let (old, new) = cluster
            .update_run(
                run_id,
                |old| {
                    if old.status == RunStatus::Closed {
                        return Err(RunError::Closed(run_id.to_string()));
                    }
                    let mut new = old.clone();
                    new.policy_versions = versions.clone();
                    Ok(new)
                },
                |old, new| async move {
                    let event = runs::repinned_event(
                        run_id,
                        &old.policy_versions,
                        &new.policy_versions,
                        by,
                        scope_check,
                    );
                    self.audit
                        .append(event)
                        .await
                        .map(|_| ())
                        .map_err(RunError::Audit)
                },
            )
            .await
            .map_err(run_refusal)?;
        self.runs.remember(new.clone());
        Ok((new, old.policy_versions))
    }

    /// Makes tokens just issued (and audited) valid across the fleet.
    pub(super) async fn fleet_publish_tokens(
        &self,
        cluster: &ClusterDb,
        tokens: &[IssuedToken],
    ) -> Result<(), Refusal> {
        let mut rows = Vec::with_capacity(tokens.len());
        for issued in tokens {
            let Some(hash) = RunTokenStore::hash_of(&issued.token) else {
                continue;
            };
            let Some(binding) = self.run_tokens.lookup(&issued.token) else {
                continue;
            };
            rows.push((hash, binding));
        }
        if let Err(refusal) = cluster.insert_tokens(&rows).await {
            // Not valid anywhere: forget them here too.
            for (hash, _) in &rows {
                self.run_tokens.remember(hash, None);
            }
            return Err(refusal);
        }
        Ok(())
    }

    pub(super) async fn fleet_revoke_token(
        &self,
        cluster: &ClusterDb,
        run_id: &str,
        token_id: &str,
        by: &str,
    ) -> Result<crate::identity::run_tokens::Revoked, Refusal> {
        let revoked = cluster
            .revoke_token(run_id, token_id, |role_id| async move {
                let mut event = NewEvent::new(EventType::RunTokenRevoked);
                event.run_id = Some(run_id.to_string());
                event.role_id = Some(role_id);
                event.details.insert("token_id".into(), json!(token_id));
                event.details.insert("by".into(), json!(by));
                self.audit.append(event).await.map(|_| ()).map_err(|e| {
                    Refusal::new(
                        Reason::AuditUnavailable,
                        format!("the audit log could not record the revocation: {e}"),
                    )
                })
            })
            .await?;
        let Some(role_id) = revoked else {
            return Err(Refusal::new(
                Reason::RequestMalformed,
                format!(
                    "run `{run_id}` has no live run token `{}`",
                    token_id.chars().take(64).collect::<String>()
                ),
            )
            .with_details(json!({ "problems": ["no such live run token"] })));
        };
        Ok(crate::identity::run_tokens::Revoked::new(
            run_id, token_id, role_id,
        ))
    }

    /// Engages or releases the lock for the whole fleet, recording the change locally
    /// inside the database transaction. When the outcome is uncertain, this sidecar
    /// treats the lock as engaged until it re-reads it.
    pub(super) async fn fleet_set_safety_lock(
        &self,
        cluster: &ClusterDb,
        event: NewEvent,
        new: &SafetyLock,
    ) -> Result<(), Refusal> {
        let new = crate::cluster::LockState {
            engaged: new.engaged,
            reason: new.reason.clone(),
            changed_by: new.changed_by.clone(),
        };
        let set = cluster
            .set_safety_lock(&new, || async {
                self.audit
                    .append(event)
                    .await
                    .map(|_| ())
                    .map_err(audit_refusal)
            })
            .await;
        if set.is_err() {
            cluster.forget_lock();
        }
        set
    }
}
