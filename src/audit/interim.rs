//! Interim in-memory stand-in for the audit store API, replaced when the store lands.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;

use super::{EventType, NewEvent};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    Full,
    Normal,
}

#[derive(Debug, Clone)]
pub struct AuditOptions {
    pub db_path: PathBuf,
    pub key_dir: PathBuf,
    pub durability: Durability,
    pub checkpoint_every_events: u64,
    pub checkpoint_interval: Duration,
    pub origin: String,
}

#[derive(Debug, Clone)]
pub struct Appended {
    pub seq: u64,
    pub event_id: String,
    pub hash: String,
}

#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub run_id: Option<String>,
    pub event_types: Vec<EventType>,
    pub after_seq: u64,
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    pub limit: usize,
}

#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub seq: u64,
    pub line: String,
    pub value: Value,
}

#[derive(Debug, Clone)]
pub struct ArgumentCommitment {
    pub sha256: String,
    pub hmac_sha256: String,
}

#[derive(Debug)]
pub enum AuditError {
    Closed,
}

impl std::fmt::Display for AuditError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "audit log closed")
    }
}

#[derive(Clone, Default)]
pub struct AuditLog {
    events: Arc<Mutex<Vec<StoredEvent>>>,
}

impl AuditLog {
    pub fn open(_options: AuditOptions) -> Result<AuditLog, AuditError> {
        Ok(AuditLog::default())
    }
    pub async fn append(&self, event: NewEvent) -> Result<Appended, AuditError> {
        let mut v = self.append_all(vec![event]).await?;
        v.pop().ok_or(AuditError::Closed)
    }
    pub async fn append_all(&self, events: Vec<NewEvent>) -> Result<Vec<Appended>, AuditError> {
        let mut all = self.events.lock().map_err(|_| AuditError::Closed)?;
        let mut out = Vec::new();
        for e in events {
            let seq = all.len() as u64 + 1;
            let value = serde_json::json!({"seq": seq, "type": e.event_type.as_str(), "run_id": e.run_id, "details": e.details});
            all.push(StoredEvent {
                seq,
                line: value.to_string(),
                value,
            });
            out.push(Appended {
                seq,
                event_id: format!("ev-{seq}"),
                hash: String::new(),
            });
        }
        Ok(out)
    }
    pub fn commit_arguments(&self, canonical_arguments: &[u8]) -> ArgumentCommitment {
        ArgumentCommitment {
            sha256: crate::canonical::sha256_hex(canonical_arguments),
            hmac_sha256: String::new(),
        }
    }
    pub async fn events(&self, filter: EventFilter) -> Result<Vec<StoredEvent>, AuditError> {
        let all = self.events.lock().map_err(|_| AuditError::Closed)?;
        Ok(all
            .iter()
            .filter(|e| e.seq > filter.after_seq)
            .filter(|e| {
                filter.event_types.is_empty()
                    || filter
                        .event_types
                        .iter()
                        .any(|t| e.value["type"] == t.as_str())
            })
            .take(if filter.limit == 0 {
                usize::MAX
            } else {
                filter.limit
            })
            .cloned()
            .collect())
    }
    pub async fn close(&self) -> Result<(), AuditError> {
        Ok(())
    }
}

pub fn redact(arguments: &Value, redaction: &crate::policy::Redaction) -> Option<Value> {
    match redaction {
        crate::policy::Redaction::HashOnly => None,
        _ => Some(arguments.clone()),
    }
}
