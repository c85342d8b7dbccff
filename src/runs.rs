//! Runs: one agent job each, bound to a scope and pinned to the policy versions it was
//! created under.
//!
//! The audit log is the source of truth: creating a run or changing its status appends
//! `run_created` / `run_status_changed` first, and only then changes the in-memory
//! table. On start the table is rebuilt from those events, so runs survive restarts and
//! their history is as tamper-evident as every other event.

use std::collections::BTreeMap;
use std::sync::RwLock;

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

/// Why a run operation was refused.
#[derive(Debug)]
pub enum RunError {
    /// A run with this id exists already.
    Exists(String),
    NotFound(String),
    /// The run is closed; closed is final.
    Closed(String),
    Audit(AuditError),
}

/// Runs by id, rebuilt from the audit log.
#[derive(Debug, Default)]
pub struct RunStore {
    runs: RwLock<BTreeMap<String, RunRecord>>,
    /// Serializes writers so the audit order and the table order agree.
    write: tokio::sync::Mutex<()>,
}

/// The largest number of runs kept; creating more is refused (bounded memory).
pub const MAX_RUNS: usize = 1_000_000;

impl RunStore {
    /// Rebuilds the table from the run events in the audit log.
    pub async fn rebuild(audit: &AuditLog) -> Result<RunStore, AuditError> {
        let events = audit
            .events(EventFilter {
                event_types: vec![
                    EventType::RunCreated,
                    EventType::RunStatusChanged,
                    EventType::RunRepinned,
                ],
                ..EventFilter::default()
            })
            .await?;
        let mut runs = BTreeMap::new();
        for event in events {
            let details = &event.value["details"];
            match event.value["type"].as_str() {
                Some("run_created") => {
                    if let Some(record) = details
                        .get("run")
                        .and_then(|r| serde_json::from_value::<RunRecord>(r.clone()).ok())
                    {
                        runs.insert(record.run_id.clone(), record);
                    }
                }
                Some("run_repinned") => {
                    let run_id = event.value["run_id"].as_str().unwrap_or_default();
                    let to = serde_json::from_value::<PolicyVersions>(details["to"].clone()).ok();
                    if let (Some(run), Some(to)) = (runs.get_mut(run_id), to) {
                        run.policy_versions = to;
                    }
                }
                Some("run_status_changed") => {
                    let run_id = event.value["run_id"].as_str().unwrap_or_default();
                    let status = serde_json::from_value::<RunStatus>(details["to"].clone()).ok();
                    if let (Some(run), Some(status)) = (runs.get_mut(run_id), status) {
                        run.status = status;
                    }
                }
                _ => {}
            }
        }
        Ok(RunStore {
            runs: RwLock::new(runs),
            write: tokio::sync::Mutex::new(()),
        })
    }

    pub fn get(&self, run_id: &str) -> Option<RunRecord> {
        self.runs.read().ok()?.get(run_id).cloned()
    }

    pub fn len(&self) -> usize {
        self.runs.read().map(|r| r.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records `run_created` and then adds the run.
    pub async fn create(&self, audit: &AuditLog, record: RunRecord) -> Result<RunRecord, RunError> {
        let _writer = self.write.lock().await;
        if self.get(&record.run_id).is_some() {
            return Err(RunError::Exists(record.run_id));
        }
        let mut event = NewEvent::new(EventType::RunCreated);
        event.run_id = Some(record.run_id.clone());
        event.policy_versions = Some(record.policy_versions.clone());
        event.details.insert("run".into(), run_json(&record));
        audit.append(event).await.map_err(RunError::Audit)?;
        if let Ok(mut runs) = self.runs.write() {
            runs.insert(record.run_id.clone(), record.clone());
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
        let Some(mut record) = self.get(run_id) else {
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
        if let Ok(mut runs) = self.runs.write() {
            runs.insert(run_id.to_string(), record.clone());
        }
        Ok(record)
    }
}

impl RunStore {
    /// A page of runs in run-id order after `cursor`, optionally of one status, and
    /// the cursor of the next page (None when this one is the last).
    pub fn list(
        &self,
        status: Option<RunStatus>,
        cursor: Option<&str>,
        limit: usize,
    ) -> (Vec<RunRecord>, Option<String>) {
        use std::ops::Bound;
        let Ok(runs) = self.runs.read() else {
            return (Vec::new(), None);
        };
        let start = match cursor {
            Some(c) => Bound::Excluded(c.to_string()),
            None => Bound::Unbounded,
        };
        let mut page: Vec<RunRecord> = runs
            .range((start, Bound::Unbounded))
            .map(|(_, r)| r)
            .filter(|r| status.is_none_or(|s| r.status == s))
            .take(limit + 1)
            .cloned()
            .collect();
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
        event.policy_versions = Some(versions.clone());
        event.details.insert("from".into(), json!(from));
        event.details.insert("to".into(), json!(versions));
        event.details.insert("by".into(), json!(by));
        event.details.insert("scope_check".into(), scope_check);
        audit.append(event).await.map_err(RunError::Audit)?;
        record.policy_versions = versions;
        if let Ok(mut runs) = self.runs.write() {
            runs.insert(run_id.to_string(), record.clone());
        }
        Ok((record, from))
    }
}

/// The run record as kept in `run_created` details.
fn run_json(record: &RunRecord) -> Value {
    serde_json::to_value(record).unwrap_or(Value::Null)
}
