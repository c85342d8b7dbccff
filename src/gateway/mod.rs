//! The gateway: the loaded policy, the audit log, runs, the safety lock and the
//! operations on them. The call pipeline itself is in `pipeline.rs`.
//!
//! INVARIANT: the policy is swapped as a whole (`ArcSwap`): a call takes one snapshot
//! at step 1 and decides with it to the end. Every state change (run created, run
//! status, safety lock, policy loaded) is written to the audit log before it takes
//! effect.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use arc_swap::ArcSwap;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::adapter::{Adapter, AdapterEnv, Adapters};
use crate::artifacts::ArtifactStore;
use crate::audit::{AuditError, AuditLog, EventFilter, EventType, NewEvent};
use crate::authz;
use crate::capacity::AuditCapacity;
use crate::diagnostic::{Reason, Refusal};
use crate::idempotency::Idempotency;
use crate::observe::Metrics;
use crate::observe::metrics::{AuditCapacityState, ScrapeState};
use crate::policy::{Policy, Problem, Tool};
use crate::requests::{SetSafetyLock, malformed};
use crate::runs::{RunError, RunStore, valid_run_id};

mod approvals;
mod evidence;
pub use evidence::{EvidencePage, MAX_BUNDLE_BYTES};
pub(crate) mod budgets;
mod capacity;
mod catalog;
mod credential;
pub use credential::Credential;
mod drain;
mod fleet;
pub(crate) use fleet::{FLEET_CLAIM_SLACK, FLEET_CLAIM_WAIT_MAX};
pub(crate) use phases::add_refusal;
mod jwt;
pub mod phases;
mod principal;
pub use principal::{Admin, Approver, Auditor, Authenticated, Principal, Reader, RoleCaller};
mod responses;
pub use responses::{
    AuditEvents, CatalogCondition, CatalogTool, PolicyServed, Reloaded, Repinned, RunPage,
    ToolCatalog,
};
mod run_tokens;
mod runs;
pub use approvals::{ApprovalPage, ApprovalRequest};
pub use evidence::RunEvents;
pub mod shadow;

/// How long a caller over a tool's concurrency limit is told to wait.
const RETRY_AFTER_MS: u64 = 100;

/// A policy together with what was built from it.
pub struct Loaded {
    pub policy: Policy,
    pub adapters: Adapters,
    /// One semaphore per tool, sized by its max_concurrency.
    concurrency: BTreeMap<String, Arc<Semaphore>>,
    /// `policy.versions`, shared by every audit event decided under this snapshot
    /// (issue 19: copying its six strings into each event cost 18 allocations a call).
    versions: Arc<crate::policy::PolicyVersions>,
}

impl Loaded {
    /// Loads and validates the policy and builds its adapters: what the gateway starts
    /// with and what a reload swaps in. Every problem is returned; nothing half-loaded.
    pub fn load(
        policy_dir: &Path,
        tools_file: &Path,
        data_dir: &Path,
    ) -> Result<Loaded, Vec<Problem>> {
        let policy = crate::policy::load(policy_dir, tools_file)?;
        let env = adapter_env(tools_file, data_dir);
        let adapters = crate::adapter::build(&policy, &env)?;
        Ok(Loaded::new(policy, adapters))
    }

    pub fn new(policy: Policy, adapters: Adapters) -> Loaded {
        let concurrency = policy
            .tools
            .values()
            .map(|t| {
                let permits = t.limits.max_concurrency as usize;
                (t.tool_name.clone(), Arc::new(Semaphore::new(permits)))
            })
            .collect();
        Loaded {
            versions: Arc::new(policy.versions.clone()),
            policy,
            adapters,
            concurrency,
        }
    }

    /// The versions of this snapshot's policy files, shared (`policy.versions`).
    pub fn shared_versions(&self) -> &Arc<crate::policy::PolicyVersions> {
        &self.versions
    }

    /// The adapter of a registered tool.
    pub fn adapter(&self, tool_name: &str) -> Result<&Adapter, Refusal> {
        self.adapters.by_tool.get(tool_name).ok_or_else(|| {
            Refusal::new(
                Reason::AdapterNotImplemented,
                format!("no adapter is built for tool `{tool_name}`"),
            )
        })
    }

    /// A slot under the tool's max_concurrency, or a retryable refusal.
    pub fn acquire(&self, tool: &Tool) -> Result<OwnedSemaphorePermit, Refusal> {
        let semaphore = self.concurrency.get(&tool.tool_name).ok_or_else(|| {
            Refusal::new(Reason::InternalError, "no concurrency limit for the tool")
        })?;
        semaphore.clone().try_acquire_owned().map_err(|_| {
            Refusal::new(
                Reason::ConcurrencyLimitReached,
                format!(
                    "`{}` is already running {} calls, its max_concurrency",
                    tool.tool_name, tool.limits.max_concurrency
                ),
            )
            .with_details(json!({ "retry_after_ms": RETRY_AFTER_MS }))
        })
    }
}

/// Where adapters find their files: data next to the tool registry, writes in the data
/// directory.
pub fn adapter_env(tools_file: &Path, data_dir: &Path) -> AdapterEnv {
    let tools_dir = tools_file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    AdapterEnv {
        tools_dir,
        data_dir: data_dir.to_path_buf(),
    }
}

/// Where the policy is reloaded from.
#[derive(Debug, Clone)]
pub struct PolicySourcePaths {
    pub policy_dir: PathBuf,
    pub tools_file: PathBuf,
}

/// The safety lock's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SafetyLock {
    pub engaged: bool,
    pub reason: Option<String>,
    pub changed_by: Option<String>,
}

/// The running gateway.
pub struct Gateway {
    loaded: ArcSwap<Loaded>,
    pub audit: AuditLog,
    pub runs: RunStore,
    /// Run tokens by sha256, rebuilt from the audit log (see `identity::run_tokens`).
    pub run_tokens: crate::identity::RunTokenStore,
    lock: RwLock<SafetyLock>,
    pub(crate) idempotency: Idempotency,
    pub(crate) artifacts: ArtifactStore,
    pub env: AdapterEnv,
    /// Where reloads read the policy from.
    source: PolicySourcePaths,
    /// Serializes reloads so the audit order and the swap order agree.
    reloading: tokio::sync::Mutex<()>,
    /// Serializes safety-lock changes: held across the audit append and the state
    /// change, so the audited order is the enforced order (and a restart, which
    /// rebuilds the lock from the last lock event, enforces the same state).
    lock_change: tokio::sync::Mutex<()>,
    /// Counters and histograms of the calls, scraped by `GET /metrics`.
    pub metrics: Metrics,
    /// A candidate policy deciding every call beside the active one (shadow mode).
    shadow: Option<shadow::Shadow>,
    /// The audit log's disk headroom; new calls are refused when it runs out.
    capacity: Option<Arc<AuditCapacity>>,
    /// Verifies bearer JWTs against the identity providers' keys (see `identity::jwt`).
    pub jwt: crate::identity::JwtVerifier,
    /// The server's public base URL (`serve --public-url`): the MCP resource URI is
    /// this plus `/mcp`, accepted as a JWT audience (RFC 8707).
    public_url: Option<String>,
    /// Approvals of calls that need one (`approvals.db` in the data directory).
    approvals: Arc<dyn crate::approvals::ApprovalBackend>,
    /// Serializes approval requests and decisions (quorum counts, status checks).
    approval_changes: tokio::sync::Mutex<()>,
    /// Serializes expiry sweeps, so each expiry is audited once.
    approval_sweep: tokio::sync::Mutex<()>,
    /// The pending commits of two-phase tools (see `phases`).
    pub(crate) two_phase: phases::TwoPhase,
    /// The counters of call budgets and rates, or why they could not be opened.
    pub(crate) counters: Result<Arc<dyn crate::state::counters::Counters>, String>,
    /// The fleet's shared state (`serve --cluster-db`); None: embedded state only.
    cluster: Option<Arc<crate::cluster::ClusterDb>>,
    /// The fleet key (`serve --fleet-key-dir`: signs and checks approval decisions) and
    /// the audit hub (where the other sidecars' approval decisions and uses are read).
    fleet_approvals: approvals::FleetApprovals,
    /// Cancelled when a shutdown's drain time has run out: every call still running stops
    /// as if its caller had gone and closes as `cancelled` before the log does (calls wait
    /// on it beside their own cancellation: a child token per call would lock it twice).
    shutdown: tokio_util::sync::CancellationToken,
}

impl Gateway {
    /// Starts the gateway on an open audit log: rebuilds runs and the safety lock from
    /// the log, then records `policy_loaded`.
    pub async fn start(
        loaded: Loaded,
        audit: AuditLog,
        env: AdapterEnv,
        source: PolicySourcePaths,
    ) -> Result<Gateway, AuditError> {
        let metrics = Metrics::new();
        audit.observe_batches(metrics.audit_batch_observer());
        let runs = RunStore::rebuild(&audit).await?;
        let run_tokens = crate::identity::RunTokenStore::rebuild(&audit).await?;
        let lock = rebuild_lock(&audit).await?;
        let approvals_path = env.data_dir.join("approvals.db");
        let approvals =
            crate::approvals::ApprovalStore::open(&approvals_path).map_err(|e| AuditError::Io {
                path: approvals_path.clone(),
                what: format!("the approval store could not be opened: {e}"),
            })?;
        record_policy_loaded(&audit, &loaded.policy, "start").await?;
        let two_phase = phases::TwoPhase::open(&env.data_dir);
        let counters = budgets::open(&env.data_dir);
        Ok(Gateway {
            loaded: ArcSwap::from_pointee(loaded),
            audit,
            runs,
            run_tokens,
            lock: RwLock::new(lock),
            idempotency: Idempotency::default(),
            artifacts: ArtifactStore::new(env.data_dir.join("artifacts")),
            env,
            source,
            reloading: tokio::sync::Mutex::new(()),
            lock_change: tokio::sync::Mutex::new(()),
            metrics,
            shadow: None,
            capacity: None,
            jwt: crate::identity::JwtVerifier::new(),
            public_url: None,
            approvals: Arc::new(approvals),
            approval_changes: tokio::sync::Mutex::new(()),
            approval_sweep: tokio::sync::Mutex::new(()),
            two_phase,
            counters,
            cluster: None,
            fleet_approvals: approvals::FleetApprovals::default(),
            shutdown: tokio_util::sync::CancellationToken::new(),
        })
    }

    /// Turns shadow mode on: `shadow` decides every call beside the active policy.
    pub fn with_shadow(mut self, shadow: shadow::Shadow) -> Gateway {
        self.shadow = Some(shadow);
        self
    }

    /// Bounds the audit log's growth: new calls are refused once `capacity` has no
    /// headroom left.
    pub fn with_capacity(mut self, capacity: Arc<AuditCapacity>) -> Gateway {
        self.capacity = Some(capacity);
        self
    }

    /// The most bytes the artifact store may hold (`serve --max-artifact-bytes`).
    pub fn with_artifact_limit(mut self, limit: u64) -> Gateway {
        self.artifacts = self.artifacts.clone().with_limit(limit);
        self
    }

    /// The shadow policy, when shadow mode is on.
    pub fn shadow(&self) -> Option<&shadow::Shadow> {
        self.shadow.as_ref()
    }

    /// The current policy snapshot.
    pub fn current(&self) -> Arc<Loaded> {
        self.loaded.load_full()
    }

    /// Reloads the policy from its source: the candidate is fully loaded and validated
    /// first, `policy_loaded` is recorded, then the whole policy is swapped at once. A
    /// candidate that fails to load changes nothing and says why.
    pub async fn reload(&self, trigger: &str) -> Result<crate::policy::PolicyVersions, Refusal> {
        let _one_at_a_time = self.reloading.lock().await;
        let source = self.source.clone();
        let data_dir = self.env.data_dir.clone();
        let candidate = tokio::task::spawn_blocking(move || {
            Loaded::load(&source.policy_dir, &source.tools_file, &data_dir)
        })
        .await
        .map_err(|_| Refusal::new(Reason::InternalError, "the reload task failed"))?;
        let loaded = candidate.map_err(|problems| {
            let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
            Refusal::new(
                Reason::PolicyInvalid,
                format!(
                    "the candidate policy did not load ({} problems); the current policy stays",
                    listed.len()
                ),
            )
            .with_details(json!({ "problems": listed }))
        })?;
        let versions = loaded.policy.versions.clone();
        record_policy_loaded(&self.audit, &loaded.policy, trigger)
            .await
            .map_err(audit_refusal)?;
        self.loaded.store(Arc::new(loaded));
        Ok(versions)
    }

    /// `POST /v1/policy/reload` (admin).
    pub async fn reload_as_admin(&self, admin: &Admin) -> Result<Reloaded, Refusal> {
        let versions = self.reload(&format!("admin:{}", admin.admin_id())).await?;
        Ok(Reloaded {
            reloaded: true,
            policy_versions: versions,
        })
    }

    /// `GET /v1/policy`: the versions and the source of the policy served.
    pub fn policy_served(&self, _reader: &Reader) -> PolicyServed {
        let loaded = self.current();
        PolicyServed {
            policy_versions: loaded.policy.versions.clone(),
            source: loaded.policy.source.clone(),
        }
    }

    /// `GET /v1/safety-lock`: the safety lock as it is enforced now.
    pub fn safety_lock_for(&self, _reader: &Reader) -> SafetyLock {
        self.safety_lock()
    }

    pub fn safety_lock(&self) -> SafetyLock {
        if let Some(cluster) = &self.cluster {
            let (state, _) = cluster.safety_lock();
            return SafetyLock {
                engaged: state.engaged,
                reason: state.reason,
                changed_by: state.changed_by,
            };
        }
        self.lock.read().map(|l| l.clone()).unwrap_or(SafetyLock {
            // A poisoned lock cannot be read: fail closed.
            engaged: true,
            reason: Some("safety lock state unreadable".into()),
            changed_by: None,
        })
    }

    /// Engages or releases the safety lock (admin).
    pub async fn set_safety_lock(
        &self,
        admin: &Admin,
        request: SetSafetyLock,
    ) -> Result<SafetyLock, Refusal> {
        let admin = admin.admin_id().to_string();
        let SetSafetyLock { engaged, reason } = request;
        let event_type = if engaged {
            EventType::SafetyLockEngaged
        } else {
            EventType::SafetyLockReleased
        };
        let mut event = NewEvent::new(event_type);
        event.details.insert("by".into(), json!(admin));
        event.details.insert("reason".into(), json!(reason));
        let new = SafetyLock {
            engaged,
            reason,
            changed_by: Some(admin),
        };
        // INVARIANT: one change at a time, from its audit append to its state change,
        // so the last lock event in the log is the state enforced.
        let _one_at_a_time = self.lock_change.lock().await;
        if let Some(cluster) = &self.cluster {
            self.fleet_set_safety_lock(cluster, event, &new).await?;
            return Ok(new);
        }
        if let Err(e) = self.audit.append(event).await {
            // The event may or may not be in the log (a timed-out append can still
            // commit): the state is uncertain, so the lock engages (fail closed).
            if let Ok(mut lock) = self.lock.write() {
                *lock = SafetyLock {
                    engaged: true,
                    reason: Some(
                        "a safety-lock change could not be recorded; engaged until an admin sets it again"
                            .into(),
                    ),
                    changed_by: None,
                };
            }
            return Err(audit_refusal(e));
        }
        if let Ok(mut lock) = self.lock.write() {
            *lock = new.clone();
        }
        Ok(new)
    }

    /// The tools a role may use in a lane, with schemas and a prompt-ready description.
    pub fn tool_catalog(&self, caller: &RoleCaller) -> Result<ToolCatalog, Refusal> {
        let (role_id, lane_id) = (caller.role_id(), caller.lane_id());
        let policy = &caller.loaded().policy;
        let role = authz::find_role(policy, role_id)?;
        let lane = policy.lanes.get(lane_id).ok_or_else(|| {
            Refusal::new(
                Reason::LaneUnknown,
                format!("lane `{lane_id}` is not defined"),
            )
        })?;
        if !role.lanes.iter().any(|l| l == lane_id) {
            return Err(Refusal::new(
                Reason::LaneNotAllowedForRole,
                format!("role `{role_id}` may not act in lane `{lane_id}`"),
            ));
        }
        let tools = lane
            .tools
            .iter()
            .filter_map(|name| policy.tools.get(name))
            .filter(|t| t.enabled)
            .map(|t| tool_entry(t, lane))
            .collect();
        Ok(ToolCatalog {
            role_id: role_id.to_string(),
            lane_id: lane_id.to_string(),
            required_scope_keys: lane.required_scope_keys.clone(),
            tools,
        })
    }

    /// Accepts any role's or admin's credential (read-only endpoints).
    fn verify_any(&self, token: Option<&str>) -> Result<(), Refusal> {
        let loaded = self.current();
        let policy = &loaded.policy;
        if self.auditor_of(policy, token).is_ok() {
            return Ok(());
        }
        let any_role = policy
            .roles
            .keys()
            .any(|role_id| self.role_of(policy, role_id, token).is_ok());
        if any_role {
            Ok(())
        } else if token.is_none() {
            Err(Refusal::new(
                Reason::CredentialMissing,
                "no bearer token in the Authorization header",
            ))
        } else {
            Err(Refusal::new(
                Reason::CredentialInvalid,
                "the bearer token is not a known credential",
            ))
        }
    }

    /// `GET /v1/artifacts/{sha256}`: an admin reads any artifact; a role reads one only
    /// through a run that owns it (`run_id`), produced in a lane the role may act in
    /// (`role_id`, proven by its credential). Every read, allowed or refused, is audited
    /// (`artifact_read`); no bytes are returned unless that record is durable.
    pub async fn artifact(
        &self,
        token: Option<&str>,
        sha256: &str,
        run_id: Option<&str>,
        role_id: Option<&str>,
    ) -> Result<Vec<u8>, Refusal> {
        let loaded = self.current();
        let mut event = NewEvent::new(EventType::ArtifactRead);
        event.run_id = run_id.filter(|r| valid_run_id(r)).map(str::to_string);
        event.details.insert(
            "sha256".into(),
            json!(sha256.chars().take(64).collect::<String>()),
        );
        event
            .details
            .insert("reader".into(), json!("unauthenticated"));
        let outcome = self
            .read_artifact(&loaded.policy, token, sha256, run_id, role_id, &mut event)
            .await;
        event
            .details
            .insert("allowed".into(), json!(outcome.is_ok()));
        if let Ok(bytes) = &outcome {
            event.details.insert("bytes".into(), json!(bytes.len()));
        }
        if let Err(refusal) = &outcome {
            event.reason = Some(refusal.reason.as_str().to_string());
            event
                .details
                .insert("message".into(), json!(refusal.message));
        }
        match self.audit.append(event).await {
            Ok(_) => outcome,
            Err(e) => Err(audit_refusal(e)),
        }
    }

    async fn read_artifact(
        &self,
        policy: &Policy,
        token: Option<&str>,
        sha256: &str,
        run_id: Option<&str>,
        role_id: Option<&str>,
        event: &mut NewEvent,
    ) -> Result<Vec<u8>, Refusal> {
        let not_found = || {
            Refusal::new(
                Reason::ArtifactNotFound,
                "no artifact with this sha256 belongs to the named run for this role",
            )
        };
        let role = match self.admin_of(policy, token) {
            Ok(admin) => {
                event
                    .details
                    .insert("reader".into(), json!(format!("admin:{}", admin.admin_id)));
                None
            }
            Err(_) => {
                let Some(role_id) = role_id else {
                    self.verify_any(token)?;
                    event.details.insert("reader".into(), json!("unnamed"));
                    return Err(malformed(
                        "name the run and the role the artifact is read for: ?run_id=...&role_id=...",
                    ));
                };
                let role = self.role_of(policy, role_id, token)?;
                event.role_id = Some(role.role_id.clone());
                event
                    .details
                    .insert("reader".into(), json!(format!("role:{}", role.role_id)));
                Some(role)
            }
        };
        if !crate::artifacts::is_sha256(sha256) {
            return Err(malformed("the artifact id must be 64 lowercase hex digits"));
        }
        if let Some(role) = role {
            let Some(run_id) = run_id else {
                return Err(malformed(
                    "name the run the artifact was produced in: ?run_id=...",
                ));
            };
            if !valid_run_id(run_id) {
                return Err(not_found());
            }
            let owners = self.artifacts.owners(sha256, run_id).await.map_err(|e| {
                Refusal::new(
                    Reason::ArtifactStoreFailed,
                    format!("the artifact's owner records could not be read: {e}"),
                )
            })?;
            let Some(owner) = owners
                .iter()
                .find(|o| o.run_id == run_id && role.lanes.contains(&o.lane_id))
            else {
                return Err(not_found());
            };
            event.details.insert("produced_by".into(), json!(owner));
        }
        self.artifacts.get(sha256).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                // The reader may see it, and it exists, but it is not what was stored:
                // recorded as such, never served.
                Refusal::new(
                    Reason::ArtifactStoreFailed,
                    format!("the stored artifact was changed after it was written: {e}"),
                )
            } else {
                not_found()
            }
        })
    }

    /// The metrics in the OpenMetrics text format, with the policy versions, the
    /// safety lock and the audit headroom as they are now (and the server's open
    /// connections, when it counts them).
    pub fn render_metrics(&self, connections: Option<(usize, usize)>) -> String {
        let loaded = self.current();
        let audit_capacity = self
            .audit_headroom()
            .map(|(h, options)| AuditCapacityState {
                used_bytes: h.used_bytes,
                headroom_bytes: h.headroom_bytes,
                max_bytes: options.max_audit_bytes,
                free_disk_bytes: options.min_free_disk_bytes.map(|_| h.free_disk_bytes),
            });
        self.metrics.render(ScrapeState {
            policy: &loaded.policy.versions,
            safety_lock_engaged: self.safety_lock().engaged,
            shadow_divergences: self.shadow().map(shadow::Shadow::divergences),
            audit_capacity,
            shadow_dropped: self.shadow().map(shadow::Shadow::dropped),
            connections,
            audit_wal: Some(self.audit.wal_counters()),
        })
    }

    /// Audit events for operators (admin).
    pub async fn audit_events(
        &self,
        _auditor: &Auditor,
        filter: EventFilter,
    ) -> Result<AuditEvents, Refusal> {
        let events = self.audit.events(filter).await.map_err(audit_refusal)?;
        let events: Vec<Value> = events.into_iter().map(|e| e.value).collect();
        let next_after_seq = events.last().and_then(|e| e["seq"].as_u64());
        Ok(AuditEvents {
            events,
            next_after_seq,
        })
    }
}

/// One tool in the catalog.
fn tool_entry(tool: &Tool, lane: &crate::policy::Lane) -> CatalogTool {
    let mut scope_keys: Vec<String> = lane
        .required_scope_keys
        .iter()
        .chain(tool.required_scope_keys.iter())
        .cloned()
        .collect();
    scope_keys.sort();
    scope_keys.dedup();
    let prompt = format!(
        "{} (v{}): {} Call it through toolgate with scope keys {}. {}",
        tool.tool_name,
        tool.version,
        tool.description.trim(),
        if scope_keys.is_empty() {
            "(none)".to_string()
        } else {
            scope_keys.join(", ")
        },
        if tool.idempotent {
            "Safe to retry with the same idempotency_key."
        } else {
            "Not idempotent: never retry blindly."
        }
    );
    CatalogTool {
        tool_name: tool.tool_name.clone(),
        version: tool.version.to_string(),
        description: tool.description.clone(),
        determinism: tool.determinism,
        idempotent: tool.idempotent,
        timeout_default_ms: tool.timeout_default_ms,
        limits: tool.limits.clone(),
        required_scope_keys: scope_keys,
        // What else a call must satisfy (lane, then tool), for the agent's prompt.
        conditions: lane
            .conditions
            .iter()
            .chain(tool.conditions.iter())
            .map(|c| CatalogCondition {
                name: c.name.clone(),
                expr: c.expr.clone(),
                message: c.message.clone(),
            })
            .collect(),
        input_schema: tool.input_schema.clone(),
        output_schema: tool.output_schema.clone(),
        prompt,
    }
}

async fn record_policy_loaded(
    audit: &AuditLog,
    policy: &Policy,
    trigger: &str,
) -> Result<(), AuditError> {
    let mut event = NewEvent::new(EventType::PolicyLoaded);
    event.policy_versions = Some(std::sync::Arc::new(policy.versions.clone()));
    event.details.insert("trigger".into(), json!(trigger));
    event.details.insert("source".into(), json!(policy.source));
    event.details.insert(
        "counts".into(),
        json!({ "roles": policy.roles.len(), "lanes": policy.lanes.len(), "tools": policy.tools.len() }),
    );
    audit.append(event).await.map(|_| ())
}

/// The safety lock as the last lock event in the log left it.
async fn rebuild_lock(audit: &AuditLog) -> Result<SafetyLock, AuditError> {
    let events = audit
        .events(EventFilter {
            event_types: vec![EventType::SafetyLockEngaged, EventType::SafetyLockReleased],
            ..EventFilter::default()
        })
        .await?;
    Ok(match events.last() {
        None => SafetyLock::default(),
        Some(last) => SafetyLock {
            engaged: last.value["type"] == "safety_lock_engaged",
            reason: last.value["details"]["reason"].as_str().map(str::to_string),
            changed_by: last.value["details"]["by"].as_str().map(str::to_string),
        },
    })
}

fn audit_refusal(e: AuditError) -> Refusal {
    Refusal::new(
        Reason::AuditUnavailable,
        format!("the audit log could not record the change: {e}"),
    )
}

fn run_refusal(e: RunError) -> Refusal {
    match e {
        RunError::Exists(id) => Refusal::new(
            Reason::RequestMalformed,
            format!("run `{id}` exists already"),
        )
        .with_details(json!({ "problems": [format!("run `{id}` exists already")] })),
        RunError::NotFound(id) => {
            Refusal::new(Reason::RunNotFound, format!("run `{id}` does not exist"))
        }
        RunError::Closed(id) => Refusal::new(
            Reason::RunNotActive,
            format!("run `{id}` is closed; closed is final"),
        ),
        RunError::Audit(e) => audit_refusal(e),
        RunError::Cluster(refusal) => refusal,
    }
}

/// The current time as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
