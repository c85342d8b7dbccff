//! Runs: one agent job each, bound to a scope and pinned to the policy versions it was
//! created under.
//!
//! The audit log is the source of truth: creating a run or changing its status appends
//! `run_created` / `run_status_changed` first, and only then changes the in-memory
//! table. On start the table is rebuilt from those events, so runs survive restarts and
//! their history is as tamper-evident as every other event.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::audit::{AuditError, AuditLog, EventFilter, EventType, NewEvent};
use crate::policy::{PolicyVersions, RunStatus};

/// The record of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub status: RunStatus,
    /// The scope the run is bound to; a call's scope may not contradict it.
    pub scope: Map<String, Value>,
    /// The policy versions the run was created under; calls are denied once the loaded
    /// policy differs.
    pub policy_versions: PolicyVersions,
    pub created_at: String,
    /// The admin that created the run.
    pub created_by: String,
}

/// Whether `s` is a run id the API accepts: `^[A-Za-z0-9._-]{1,128}$`.
pub fn valid_run_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Why a run operation was refused.
#[derive(Debug)]
pub enum RunError {
    /// A run with this id exists already.
    Exists(String),
    NotFound(String),
    /// The run is closed; closed is final.
    Closed(String),
    Audit(AuditError),
    /// The cluster database (`serve --cluster-db`) could not be used.
    Cluster(crate::diagnostic::Refusal),
}

/// Runs by id, rebuilt from the audit log.
///
/// Live runs (active or suspended) are kept in memory, at most [`MAX_RUNS`]. A closed
/// run leaves that table (closed is final): the newest [`MAX_CLOSED_KEPT`] closed runs
/// stay in a bounded index, and an older one is read back from the log when a call
/// names it ([`RunStore::load`]), so it is still refused as `run_not_active`, and
/// closing runs frees room for new ones.
#[derive(Debug, Default)]
pub struct RunStore {
    /// Live runs, in run-id order (for paged listing).
    runs: RwLock<BTreeMap<String, Arc<RunRecord>>>,
    closed: RwLock<ClosedRuns>,
    /// Serializes writers so the audit order and the table order agree.
    write: tokio::sync::Mutex<()>,
}

/// The newest closed runs, oldest first for eviction.
#[derive(Debug, Default)]
struct ClosedRuns {
    records: HashMap<String, Arc<RunRecord>>,
    order: VecDeque<String>,
}

impl ClosedRuns {
    fn insert(&mut self, record: RunRecord) {
        let run_id = record.run_id.clone();
        if self
            .records
            .insert(run_id.clone(), Arc::new(record))
            .is_none()
        {
            self.order.push_back(run_id);
        }
        while self.order.len() > MAX_CLOSED_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.records.remove(&old);
            }
        }
    }
}

/// The events that make up a run's record.
const RUN_EVENTS: [EventType; 3] = [
    EventType::RunCreated,
    EventType::RunStatusChanged,
    EventType::RunRepinned,
];

/// The largest number of live (not closed) runs kept; creating more is refused
/// (bounded memory). Closed runs do not count.
pub const MAX_RUNS: usize = 1_000_000;
/// The most closed runs kept in memory; older ones are read back from the log.
pub const MAX_CLOSED_KEPT: usize = 10_000;

impl RunStore {
    /// Rebuilds the table from the run events in the audit log.
    pub async fn rebuild(audit: &AuditLog) -> Result<RunStore, AuditError> {
        let events = audit
            .events(EventFilter {
                event_types: RUN_EVENTS.to_vec(),
                ..EventFilter::default()
            })
            .await?;
        let mut runs = replay_events(events.iter().map(|e| &e.value));
        let mut closed = ClosedRuns::default();
        let mut closed_ids: Vec<(u64, String)> = Vec::new();
        let last_seq: HashMap<&str, u64> = events
            .iter()
            .filter_map(|e| Some((e.value["run_id"].as_str()?, e.seq)))
            .collect();
        for (id, run) in &runs {
            if run.status == RunStatus::Closed {
                closed_ids.push((last_seq.get(id.as_str()).copied().unwrap_or(0), id.clone()));
            }
        }
        // Oldest closed first, so the newest stay in the bounded index.
        closed_ids.sort();
        for (_, id) in closed_ids {
            if let Some(record) = runs.remove(&id) {
                closed.insert(record);
            }
        }
        Ok(RunStore {
            runs: RwLock::new(runs.into_iter().map(|(id, r)| (id, Arc::new(r))).collect()),
            closed: RwLock::new(closed),
            write: tokio::sync::Mutex::new(()),
        })
    }

    /// Whether [`RunStore::get`] would find the run (without cloning its record).
    pub fn contains(&self, run_id: &str) -> bool {
        let live = self.runs.read().map(|r| r.contains_key(run_id));
        match live {
            Ok(true) => true,
            _ => self
                .closed
                .read()
                .is_ok_and(|c| c.records.contains_key(run_id)),
        }
    }

    /// A run in memory: live, or among the newest closed.
    pub fn get(&self, run_id: &str) -> Option<RunRecord> {
        self.shared(run_id).map(|run| RunRecord::clone(&run))
    }

    /// [`RunStore::get`] without copying the record: what every call reads.
    pub fn shared(&self, run_id: &str) -> Option<Arc<RunRecord>> {
        if let Some(run) = self.runs.read().ok()?.get(run_id) {
            return Some(Arc::clone(run));
        }
        self.closed.read().ok()?.records.get(run_id).cloned()
    }

    /// A run that is not in memory, read back from its events in the log (a closed
    /// run evicted from the index). None if the log has no such run.
    pub async fn load(
        &self,
        audit: &AuditLog,
        run_id: &str,
    ) -> Result<Option<RunRecord>, AuditError> {
        let events = audit
            .events(EventFilter {
                run_id: Some(run_id.to_string()),
                event_types: RUN_EVENTS.to_vec(),
                ..EventFilter::default()
            })
            .await?;
        Ok(replay_events(events.iter().map(|e| &e.value)).remove(run_id))
    }

    /// Live runs in memory (closed runs do not count against [`MAX_RUNS`]).
    pub fn len(&self) -> usize {
        self.runs.read().map(|r| r.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `record` as read from the cluster database (`serve --cluster-db`), the
    /// authority in a fleet: live or closed, it replaces what this table had.
    pub fn remember(&self, record: RunRecord) {
        if record.status == RunStatus::Closed {
            if let Ok(mut runs) = self.runs.write() {
                runs.remove(&record.run_id);
            }
            if let Ok(mut closed) = self.closed.write() {
                closed.records.remove(&record.run_id);
                closed.insert(record);
            }
        } else if let Ok(mut runs) = self.runs.write() {
            // A cache in a fleet: kept within MAX_RUNS by dropping one run, which the
            // next call naming it reads again.
            if runs.len() >= MAX_RUNS
                && !runs.contains_key(&record.run_id)
                && let Some(first) = runs.keys().next().cloned()
            {
                runs.remove(&first);
            }
            runs.insert(record.run_id.clone(), Arc::new(record));
        }
    }

    /// Records `run_created` and then adds the run.
    pub async fn create(&self, audit: &AuditLog, record: RunRecord) -> Result<RunRecord, RunError> {
        let _writer = self.write.lock().await;
        if self.get(&record.run_id).is_some()
            || self
                .load(audit, &record.run_id)
                .await
                .map_err(RunError::Audit)?
                .is_some()
        {
            return Err(RunError::Exists(record.run_id));
        }
        let mut event = NewEvent::new(EventType::RunCreated);
        event.run_id = Some(record.run_id.clone());
        event.policy_versions = Some(std::sync::Arc::new(record.policy_versions.clone()));
        event.details.insert("run".into(), run_json(&record));
        audit.append(event).await.map_err(RunError::Audit)?;
        if let Ok(mut runs) = self.runs.write() {
            runs.insert(record.run_id.clone(), Arc::new(record.clone()));
        }
        Ok(record)
    }

    /// Records `run_status_changed` and then changes the status.
    pub async fn set_status(
        &self,
        audit: &AuditLog,
        run_id: &str,
        status: RunStatus,
        by: &str,
    ) -> Result<RunRecord, RunError> {
        let _writer = self.write.lock().await;
        let known = match self.get(run_id) {
            Some(record) => Some(record),
            None => self.load(audit, run_id).await.map_err(RunError::Audit)?,
        };
        let Some(mut record) = known else {
            return Err(RunError::NotFound(run_id.to_string()));
        };
        if record.status == RunStatus::Closed && status != RunStatus::Closed {
            return Err(RunError::Closed(run_id.to_string()));
        }
        let mut event = NewEvent::new(EventType::RunStatusChanged);
        event.run_id = Some(run_id.to_string());
        event.details.insert("from".into(), json!(record.status));
        event.details.insert("to".into(), json!(status));
        event.details.insert("by".into(), json!(by));
        audit.append(event).await.map_err(RunError::Audit)?;
        record.status = status;
        if status == RunStatus::Closed {
            // Closed is final: the run leaves the live table for the bounded index.
            if let Ok(mut runs) = self.runs.write() {
                runs.remove(run_id);
            }
            if let Ok(mut closed) = self.closed.write() {
                closed.insert(record.clone());
            }
        } else if let Ok(mut runs) = self.runs.write() {
            runs.insert(run_id.to_string(), Arc::new(record.clone()));
        }
        Ok(record)
    }
}

impl RunStore {
    /// A page of runs in run-id order after `cursor`, optionally of one status, and
    /// the cursor of the next page (None when this one is the last). Lists the live
    /// runs and the newest closed ones kept in memory ([`MAX_CLOSED_KEPT`]); older
    /// closed runs are in the audit log (`GET /v1/audit/events?type=run_created`).
    pub fn list(
        &self,
        status: Option<RunStatus>,
        cursor: Option<&str>,
        limit: usize,
    ) -> (Vec<RunRecord>, Option<String>) {
        let after = |id: &str| cursor.is_none_or(|c| id > c);
        let wanted = |r: &RunRecord| status.is_none_or(|s| r.status == s) && after(&r.run_id);
        let mut page: Vec<RunRecord> = Vec::new();
        if status != Some(RunStatus::Closed)
            && let Ok(runs) = self.runs.read()
        {
            page.extend(
                runs.values()
                    .filter(|r| wanted(r))
                    .take(limit + 1)
                    .map(|r| RunRecord::clone(r)),
            );
        }
        if status.is_none_or(|s| s == RunStatus::Closed)
            && let Ok(closed) = self.closed.read()
        {
            page.extend(
                closed
                    .records
                    .values()
                    .filter(|r| wanted(r))
                    .map(|r| RunRecord::clone(r)),
            );
        }
        page.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        page.truncate(limit + 1);
        let next = if page.len() > limit {
            page.truncate(limit);
            page.last().map(|r| r.run_id.clone())
        } else {
            None
        };
        (page, next)
    }

    /// Records `run_repinned` and then pins the run to `versions`. Returns the record
    /// and the versions it was pinned to before.
    pub async fn repin(
        &self,
        audit: &AuditLog,
        run_id: &str,
        versions: PolicyVersions,
        by: &str,
        scope_check: Value,
    ) -> Result<(RunRecord, PolicyVersions), RunError> {
        let _writer = self.write.lock().await;
        let Some(mut record) = self.get(run_id) else {
            return Err(RunError::NotFound(run_id.to_string()));
        };
        if record.status == RunStatus::Closed {
            return Err(RunError::Closed(run_id.to_string()));
        }
        let from = record.policy_versions.clone();
        let mut event = NewEvent::new(EventType::RunRepinned);
        event.run_id = Some(run_id.to_string());
        event.policy_versions = Some(std::sync::Arc::new(versions.clone()));
        event.details.insert("from".into(), json!(from));
        event.details.insert("to".into(), json!(versions));
        event.details.insert("by".into(), json!(by));
        event.details.insert("scope_check".into(), scope_check);
        audit.append(event).await.map_err(RunError::Audit)?;
        record.policy_versions = versions;
        if let Ok(mut runs) = self.runs.write() {
            runs.insert(run_id.to_string(), Arc::new(record.clone()));
        }
        Ok((record, from))
    }
}

/// The `run_created` event of a new run.
pub fn created_event(record: &RunRecord) -> NewEvent {
    let mut event = NewEvent::new(EventType::RunCreated);
    event.run_id = Some(record.run_id.clone());
    event.policy_versions = Some(std::sync::Arc::new(record.policy_versions.clone()));
    event.details.insert("run".into(), run_json(record));
    event
}

/// The `run_status_changed` event of a status change.
pub fn status_event(run_id: &str, from: RunStatus, to: RunStatus, by: &str) -> NewEvent {
    let mut event = NewEvent::new(EventType::RunStatusChanged);
    event.run_id = Some(run_id.to_string());
    event.details.insert("from".into(), json!(from));
    event.details.insert("to".into(), json!(to));
    event.details.insert("by".into(), json!(by));
    event
}

/// The `run_repinned` event of a re-pin.
pub fn repinned_event(
    run_id: &str,
    from: &PolicyVersions,
    to: &PolicyVersions,
    by: &str,
    scope_check: Value,
) -> NewEvent {
    let mut event = NewEvent::new(EventType::RunRepinned);
    event.run_id = Some(run_id.to_string());
    event.policy_versions = Some(std::sync::Arc::new(to.clone()));
    event.details.insert("from".into(), json!(from));
    event.details.insert("to".into(), json!(to));
    event.details.insert("by".into(), json!(by));
    event.details.insert("scope_check".into(), scope_check);
    event
}

/// The runs that `run_created`, `run_repinned` and `run_status_changed` events (oldest
/// first) leave.
fn replay_events<'a>(events: impl Iterator<Item = &'a Value>) -> BTreeMap<String, RunRecord> {
    let mut runs = BTreeMap::new();
    for event in events {
        let details = &event["details"];
        match event["type"].as_str() {
            Some("run_created") => {
                if let Some(record) = details
                    .get("run")
                    .and_then(|r| serde_json::from_value::<RunRecord>(r.clone()).ok())
                {
                    runs.insert(record.run_id.clone(), record);
                }
            }
            Some("run_repinned") => {
                let run_id = event["run_id"].as_str().unwrap_or_default();
                let to = serde_json::from_value::<PolicyVersions>(details["to"].clone()).ok();
                if let (Some(run), Some(to)) = (runs.get_mut(run_id), to) {
                    run.policy_versions = to;
                }
            }
            Some("run_status_changed") => {
                let run_id = event["run_id"].as_str().unwrap_or_default();
                let status = serde_json::from_value::<RunStatus>(details["to"].clone()).ok();
                if let (Some(run), Some(status)) = (runs.get_mut(run_id), status) {
                    run.status = status;
                }
            }
            _ => {}
        }
    }
    runs
}

/// The run record as kept in `run_created` details.
fn run_json(record: &RunRecord) -> Value {
    serde_json::to_value(record).unwrap_or(Value::Null)
}
