//! The shared state's queries: runs, run tokens and idempotency claims.

use std::future::Future;

use serde_json::{Map, Value, json};

use super::{ClusterDb, bounded};
use crate::call::{ArtifactRef, CallResponse, Status, Trace};
use crate::diagnostic::{Reason, Refusal};
use crate::idempotency::Key;
use crate::identity::RunBinding;
use crate::policy::{PolicyVersions, RunStatus};
use crate::runs::{RunError, RunRecord};

const RUN_COLUMNS: &str = "run_id, status, scope, policy_versions, created_at, created_by";

fn run_of(row: &tokio_postgres::Row) -> Option<RunRecord> {
    let status: String = row.try_get(1).ok()?;
    let scope: Value = row.try_get(2).ok()?;
    let versions: Value = row.try_get(3).ok()?;
    Some(RunRecord {
        run_id: row.try_get(0).ok()?,
        status: serde_json::from_value(Value::String(status)).ok()?,
        scope: match scope {
            Value::Object(map) => map,
            _ => Map::new(),
        },
        policy_versions: serde_json::from_value::<PolicyVersions>(versions).ok()?,
        created_at: row.try_get(4).ok()?,
        created_by: row.try_get(5).ok()?,
    })
}

fn corrupt(what: &str) -> Refusal {
    super::unavailable(format!(
        "the cluster database holds a {what} this sidecar cannot read"
    ))
}

/// What an idempotency key's claim found.
#[derive(Debug)]
pub enum FleetClaim {
    /// This call claimed the key: run it, then [`ClusterDb::complete_claim`].
    First,
    /// The first call completed: its response, to replay.
    Done(Box<CallResponse>),
    /// The first call is still running (on this or another sidecar), or its sidecar
    /// died before storing the outcome: the node that holds the claim and how long
    /// ago it claimed the key (None: the claim moved while it was read).
    InFlight {
        holder: Option<String>,
        age_ms: Option<i64>,
    },
    /// The key was used with other arguments or another scope.
    Conflict,
}

impl ClusterDb {
    /// A run by id.
    pub async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, Refusal> {
        let client = self.client().await?;
        let row = bounded(client.query_opt(
            &format!("SELECT {RUN_COLUMNS} FROM toolgate_runs WHERE run_id = $1"),
            &[&run_id],
        ))
        .await?;
        match row {
            None => Ok(None),
            Some(row) => run_of(&row).map(Some).ok_or_else(|| corrupt("run")),
        }
    }

    /// A page of runs in run-id order after `cursor`, optionally of one status.
    pub async fn list_runs(
        &self,
        status: Option<RunStatus>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<RunRecord>, Option<String>), Refusal> {
        let client = self.client().await?;
        let status = status.map(|s| s.as_str().to_string());
        let cursor = cursor.map(str::to_string);
        let fetch = (limit as i64).saturating_add(1);
        let rows = bounded(client.query(
            &format!(
                "SELECT {RUN_COLUMNS} FROM toolgate_runs \
                 WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR run_id > $2) \
                 ORDER BY run_id LIMIT $3"
            ),
            &[&status, &cursor, &fetch],
        ))
        .await?;
        let mut runs = rows
            .iter()
            .map(run_of)
            .collect::<Option<Vec<RunRecord>>>()
            .ok_or_else(|| corrupt("run"))?;
        let next = if runs.len() > limit {
            runs.truncate(limit);
            runs.last().map(|r| r.run_id.clone())
        } else {
            None
        };
        Ok((runs, next))
    }

    /// Creates a run unless one with its id exists (atomic across sidecars); `record`
    /// writes the local audit event before the commit.
    pub async fn create_run<F, Fut>(&self, record: &RunRecord, audit: F) -> Result<(), RunError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), RunError>>,
    {
        let mut client = self.client().await.map_err(RunError::Cluster)?;
        let tx = bounded(client.transaction())
            .await
            .map_err(RunError::Cluster)?;
        let inserted = bounded(tx.query_opt(
            &format!(
                "INSERT INTO toolgate_runs ({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (run_id) DO NOTHING RETURNING run_id"
            ),
            &[
                &record.run_id,
                &record.status.as_str(),
                &Value::Object(record.scope.clone()),
                &json!(record.policy_versions),
                &record.created_at,
                &record.created_by,
            ],
        ))
        .await
        .map_err(RunError::Cluster)?;
        if inserted.is_none() {
            return Err(RunError::Exists(record.run_id.clone()));
        }
        audit().await?;
        bounded(tx.commit()).await.map_err(RunError::Cluster)
    }

    /// Changes a run (its status or its pinned versions) under a row lock: `change`
    /// gets the current record and returns the new one (or refuses), `audit` writes
    /// the local audit event before the commit.
    pub async fn update_run<C, F, Fut>(
        &self,
        run_id: &str,
        change: C,
        audit: F,
    ) -> Result<(RunRecord, RunRecord), RunError>
    where
        C: FnOnce(&RunRecord) -> Result<RunRecord, RunError>,
        F: FnOnce(RunRecord, RunRecord) -> Fut,
        Fut: Future<Output = Result<(), RunError>>,
    {
        let mut client = self.client().await.map_err(RunError::Cluster)?;
        let tx = bounded(client.transaction())
            .await
            .map_err(RunError::Cluster)?;
        let row = bounded(tx.query_opt(
            &format!("SELECT {RUN_COLUMNS} FROM toolgate_runs WHERE run_id = $1 FOR UPDATE"),
            &[&run_id],
        ))
        .await
        .map_err(RunError::Cluster)?;
        let Some(row) = row else {
            return Err(RunError::NotFound(run_id.to_string()));
        };
        let old = run_of(&row).ok_or_else(|| RunError::Cluster(corrupt("run")))?;
        let new = change(&old)?;
        bounded(tx.execute(
            "UPDATE toolgate_runs SET status = $2, policy_versions = $3, updated_at = now() \
             WHERE run_id = $1",
            &[&run_id, &new.status.as_str(), &json!(new.policy_versions)],
        ))
        .await
        .map_err(RunError::Cluster)?;
        audit(old.clone(), new.clone()).await?;
        bounded(tx.commit()).await.map_err(RunError::Cluster)?;
        Ok((old, new))
    }

    /// A run token's binding and whether it was revoked, by the token's sha256.
    pub async fn token(&self, sha256: &str) -> Result<Option<(RunBinding, bool)>, Refusal> {
        let client = self.client().await?;
        let row = bounded(client.query_opt(
            "SELECT token_id, run_id, role_id, lanes, expires_unix, revoked \
             FROM toolgate_run_tokens WHERE token_sha256 = $1",
            &[&sha256],
        ))
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let read = || -> Option<(RunBinding, bool)> {
            let lanes: Value = row.try_get(3).ok()?;
            Some((
                RunBinding {
                    token_id: row.try_get(0).ok()?,
                    run_id: row.try_get(1).ok()?,
                    role_id: row.try_get(2).ok()?,
                    lanes: serde_json::from_value(lanes).ok()?,
                    expires_unix: row.try_get(4).ok()?,
                },
                row.try_get(5).ok()?,
            ))
        };
        read().map(Some).ok_or_else(|| corrupt("run token"))
    }

    /// Makes issued tokens valid across the fleet (their sha256 and binding).
    pub async fn insert_tokens(&self, tokens: &[(String, RunBinding)]) -> Result<(), Refusal> {
        let mut client = self.client().await?;
        let tx = bounded(client.transaction()).await?;
        for (sha256, b) in tokens {
            bounded(tx.execute(
                "INSERT INTO toolgate_run_tokens \
                 (token_sha256, token_id, run_id, role_id, lanes, expires_unix) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    sha256,
                    &b.token_id,
                    &b.run_id,
                    &b.role_id,
                    &json!(b.lanes),
                    &b.expires_unix,
                ],
            ))
            .await?;
        }
        bounded(tx.commit()).await
    }

    /// Revokes a live token of `run_id` by id: `audit` gets its role and writes the
    /// local audit event before the commit. None when there is no such live token.
    pub async fn revoke_token<F, Fut>(
        &self,
        run_id: &str,
        token_id: &str,
        audit: F,
    ) -> Result<Option<String>, Refusal>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<(), Refusal>>,
    {
        let mut client = self.client().await?;
        let tx = bounded(client.transaction()).await?;
        let row = bounded(tx.query_opt(
            "SELECT role_id FROM toolgate_run_tokens \
             WHERE token_id = $1 AND run_id = $2 AND NOT revoked AND expires_unix > $3 FOR UPDATE",
            &[
                &token_id,
                &run_id,
                &time::OffsetDateTime::now_utc().unix_timestamp(),
            ],
        ))
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let role_id: String = row.try_get(0).map_err(|_| corrupt("run token"))?;
        bounded(tx.execute(
            "UPDATE toolgate_run_tokens SET revoked = true WHERE token_id = $1",
            &[&token_id],
        ))
        .await?;
        audit(role_id.clone()).await?;
        bounded(tx.commit()).await?;
        Ok(Some(role_id))
    }

    /// Claims an idempotency key for a call whose arguments and scope hash to
    /// `fingerprint`: atomic across sidecars (`INSERT ... ON CONFLICT DO NOTHING`).
    pub async fn claim(&self, key: &Key, fingerprint: &str) -> Result<FleetClaim, Refusal> {
        let client = self.client().await?;
        // A key released between the insert and the read is claimed again.
        for _ in 0..3 {
            let inserted = bounded(client.query_opt(
                "INSERT INTO toolgate_idempotency \
                 (run_id, role_id, tool_name, idempotency_key, fingerprint, state, node_id) \
                 VALUES ($1, $2, $3, $4, $5, 'in_flight', $6) \
                 ON CONFLICT DO NOTHING RETURNING 1",
                &[
                    &key.run_id,
                    &key.role_id,
                    &key.tool_name,
                    &key.idempotency_key,
                    &fingerprint,
                    &self.node_id,
                ],
            ))
            .await?;
            if inserted.is_some() {
                return Ok(FleetClaim::First);
            }
            let row = bounded(client.query_opt(
                "SELECT fingerprint, state, outcome, node_id, \
                 (extract(epoch FROM now() - claimed_at) * 1000)::bigint FROM toolgate_idempotency \
                 WHERE run_id = $1 AND role_id = $2 AND tool_name = $3 AND idempotency_key = $4",
                &[
                    &key.run_id,
                    &key.role_id,
                    &key.tool_name,
                    &key.idempotency_key,
                ],
            ))
            .await?;
            let Some(row) = row else {
                continue;
            };
            let found: String = row.try_get(0).map_err(|_| corrupt("claim"))?;
            if found != fingerprint {
                return Ok(FleetClaim::Conflict);
            }
            let state: String = row.try_get(1).map_err(|_| corrupt("claim"))?;
            if state != "done" {
                return Ok(FleetClaim::InFlight {
                    holder: row.try_get(3).ok(),
                    age_ms: row.try_get(4).ok(),
                });
            }
            let outcome: Option<Value> = row.try_get(2).map_err(|_| corrupt("claim"))?;
            return outcome
                .as_ref()
                .and_then(response_from_json)
                .map(|r| FleetClaim::Done(Box::new(r)))
                .ok_or_else(|| corrupt("stored outcome"));
        }
        Ok(FleetClaim::InFlight {
            holder: None,
            age_ms: None,
        })
    }

    /// Completes this sidecar's claim: stores the outcome for every repeat (`Some`),
    /// or releases the key so a retry executes again (`None`).
    pub async fn complete_claim(&self, key: &Key, outcome: Option<Value>) -> Result<(), Refusal> {
        let client = self.client().await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &key.run_id,
            &key.role_id,
            &key.tool_name,
            &key.idempotency_key,
            &self.node_id,
        ];
        match outcome {
            Some(outcome) => {
                bounded(client.execute(
                    "UPDATE toolgate_idempotency SET state = 'done', outcome = $6 \
                     WHERE run_id = $1 AND role_id = $2 AND tool_name = $3 \
                     AND idempotency_key = $4 AND node_id = $5",
                    &[
                        params[0], params[1], params[2], params[3], params[4], &outcome,
                    ],
                ))
                .await?;
            }
            None => {
                bounded(client.execute(
                    "DELETE FROM toolgate_idempotency \
                     WHERE run_id = $1 AND role_id = $2 AND tool_name = $3 \
                     AND idempotency_key = $4 AND node_id = $5 AND state = 'in_flight'",
                    &params,
                ))
                .await?;
            }
        }
        Ok(())
    }
}

/// A stored response, read back for a replay on any sidecar. The output is inline (a
/// fleet does not spill outputs to one sidecar's artifact store); an artifact
/// reference names the artifact on the sidecar that produced it.
pub fn response_from_json(v: &Value) -> Option<CallResponse> {
    let status = match v["status"].as_str()? {
        "success" => Status::Success,
        "failed" => Status::Failed,
        "denied" => Status::Denied,
        "timeout" => Status::Timeout,
        _ => return None,
    };
    let text = |field: &str| v[field].as_str().map(str::to_string);
    let diagnostic = match &v["diagnostic"] {
        Value::Object(d) => {
            let code = d.get("reason")?.as_str()?;
            let reason = Reason::ALL.into_iter().find(|r| r.as_str() == code)?;
            let mut refusal = Refusal::new(reason, d.get("message")?.as_str()?)
                .with_details(d.get("details").cloned().unwrap_or(json!({})));
            if let Some(retryable) = d.get("retryable").and_then(Value::as_bool) {
                refusal = refusal.with_retryable(retryable);
            }
            if let Some(step) = d.get("failed_step").and_then(Value::as_u64) {
                refusal = refusal.at_step(step as u8);
            }
            Some(refusal.diagnostic())
        }
        _ => None,
    };
    let artifact = match &v["artifact"] {
        Value::Object(a) => Some(ArtifactRef {
            sha256: a.get("sha256")?.as_str()?.to_string(),
            bytes: a.get("bytes")?.as_u64()?,
            media_type: "application/json",
            uri: a.get("uri")?.as_str()?.to_string(),
        }),
        _ => None,
    };
    let t = &v["trace"];
    let trace = Trace {
        role: t["role"].as_str().map(str::to_string),
        lane: t["lane"].as_str().map(str::to_string),
        tool: t["tool"].as_str().map(str::to_string),
        flags: serde_json::from_value(t["flags"].clone()).unwrap_or_default(),
        passed_step: t["passed_step"].as_u64().unwrap_or(0) as u8,
        failed: t["failed"].as_str().map(str::to_string),
        ..Trace::default()
    };
    Some(CallResponse {
        call_id: text("call_id")?,
        status,
        tool_name: text("tool_name"),
        tool_version: text("tool_version"),
        execution_time_ms: v["execution_time_ms"].as_u64().unwrap_or(0),
        output: v.get("output").filter(|o| !o.is_null()).cloned(),
        details: v.get("details").and_then(Value::as_object).cloned(),
        artifact,
        error_code: diagnostic.as_ref().map(|d| d.error_code),
        error_message: text("error_message"),
        audit_event_id: text("audit_event_id"),
        diagnostic,
        trace,
        dry_run: None,
        replayed: false,
        replay_of: None,
        metrics: None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn response(refusal: Option<Refusal>) -> CallResponse {
        let diagnostic = refusal.map(|r| r.diagnostic());
        CallResponse {
            call_id: "call-1".into(),
            status: if diagnostic.is_some() {
                Status::Denied
            } else {
                Status::Success
            },
            tool_name: Some("draft_document".into()),
            tool_version: Some("1.0.0".into()),
            execution_time_ms: 12,
            output: diagnostic.is_none().then(|| json!({"draft_id": "d-1"})),
            details: None,
            artifact: None,
            error_code: diagnostic.as_ref().map(|d| d.error_code),
            error_message: diagnostic.as_ref().map(|d| d.message.clone()),
            audit_event_id: Some("ev-000000000007".into()),
            diagnostic,
            trace: Trace {
                role: Some("drafting_agent".into()),
                passed_step: 11,
                ..Trace::default()
            },
            dry_run: None,
            replayed: false,
            replay_of: None,
            metrics: None,
        }
    }

    #[test]
    fn a_stored_response_reads_back_as_it_was_answered() {
        let refused = Refusal::new(Reason::ToolError, "boom")
            .with_details(json!({"reached_tool": true}))
            .with_retryable(true)
            .at_step(10);
        for original in [response(None), response(Some(refused))] {
            let stored = serde_json::to_value(&original).unwrap();
            let back = response_from_json(&stored).expect("reads back");
            assert_eq!(serde_json::to_value(&back).unwrap(), stored);
        }
    }

    #[test]
    fn a_stored_response_with_an_unknown_reason_or_status_is_not_replayed() {
        let mut stored =
            serde_json::to_value(response(Some(Refusal::new(Reason::ToolError, "boom")))).unwrap();
        stored["diagnostic"]["reason"] = json!("made_up");
        assert!(response_from_json(&stored).is_none());
        let mut stored = serde_json::to_value(response(None)).unwrap();
        stored["status"] = json!("maybe");
        assert!(response_from_json(&stored).is_none());
    }
}
