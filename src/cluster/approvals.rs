//! The approvals shared by a fleet (`serve --cluster-db`): [`PgApprovals`] implements
//! `approvals::ApprovalBackend` on the cluster database, so an approval requested
//! through one sidecar is listed, decided and used through any other.
//!
//! INVARIANT: the same semantics as the SQLite store: every operation is one
//! statement; the claim of an approved approval is one conditional
//! `UPDATE ... RETURNING`, so of concurrent retries on any sidecars exactly one wins;
//! a decision is written only if the approval is still pending with the decisions it
//! was read with (a concurrent decision through another sidecar is not overwritten);
//! the auditing of an expiry is claimed by one conditional `UPDATE ... RETURNING`
//! (with a lease, [`EXPIRY_CLAIM_LEASE_MS`]), so one sidecar writes `approval_expired`.
//! Every query is bounded by `cluster::QUERY_TIMEOUT`; a failure is a `StoreError`
//! the gateway turns into `approval_store_unavailable` (never guessed state).

use std::sync::Arc;

use tokio::runtime::Handle;

use super::{ClusterDb, QUERY_TIMEOUT, bounded};
use crate::approvals::store::{PageSql, decode, encode, page_query};
use crate::approvals::{
    ApprovalBackend, ApprovalRecord, ApprovalStatus, PendingCounts, StoreError,
};
use crate::diagnostic::Refusal;

/// How long a sidecar's claim to audit an approval's expiry holds: a sidecar that
/// claimed it and died before noting it audited is relieved by another after this.
pub const EXPIRY_CLAIM_LEASE_MS: i64 = 60_000;

/// Shared approvals in the cluster database. Its methods block: the gateway calls
/// them from `spawn_blocking`, where waiting on the runtime `handle` is allowed.
pub struct PgApprovals {
    db: Arc<ClusterDb>,
    handle: Handle,
}

impl PgApprovals {
    /// Approvals on `db`, run on the runtime `handle`.
    pub fn new(db: Arc<ClusterDb>, handle: Handle) -> PgApprovals {
        PgApprovals { db, handle }
    }

    /// Runs `work` (a connection and one query) on the runtime and waits for it,
    /// bounded by three query bounds (connection, query, scheduling).
    fn wait<T: Send + 'static>(
        &self,
        work: impl FnOnce(Arc<ClusterDb>) -> BoxedWork<T>,
    ) -> Result<T, StoreError> {
        let (done, answer) = std::sync::mpsc::sync_channel(1);
        let fut = work(self.db.clone());
        self.handle.spawn(async move {
            let _ = done.send(fut.await);
        });
        let bound = QUERY_TIMEOUT * 3;
        answer
            .recv_timeout(bound)
            .map_err(|_| {
                StoreError(format!(
                    "the cluster database did not answer within {} ms",
                    bound.as_millis()
                ))
            })?
            .map_err(|r| StoreError(r.message))
    }
}

type BoxedWork<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, Refusal>> + Send + 'static>>;

fn bad(e: StoreError) -> Refusal {
    Refusal::new(crate::diagnostic::Reason::ApprovalStoreUnavailable, e.0)
}

fn decode_rows(rows: &[tokio_postgres::Row], col: usize) -> Result<Vec<ApprovalRecord>, Refusal> {
    rows.iter()
        .map(|r| decode(&r.get::<_, String>(col)).map_err(bad))
        .collect()
}

/// Runs one statement: `execute` (rows changed) on a pooled connection.
async fn execute(
    db: &ClusterDb,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<u64, Refusal> {
    let client = db.client().await?;
    bounded(client.execute(sql, params)).await
}

/// Runs one query on a pooled connection.
async fn query(
    db: &ClusterDb,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, Refusal> {
    let client = db.client().await?;
    bounded(client.query(sql, params)).await
}

impl ApprovalBackend for PgApprovals {
    fn shared(&self) -> bool {
        true
    }

    fn insert(&self, record: &ApprovalRecord) -> Result<(), StoreError> {
        let json = encode(record)?;
        let r = record.clone();
        self.wait(move |db| {
            Box::pin(async move {
                execute(
                    &db,
                    "INSERT INTO toolgate_approvals (approval_id, status, run_id, call_digest, \
                     created_at_ms, expires_at_ms, record) VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb)",
                    &[
                        &r.approval_id,
                        &r.status.as_str(),
                        &r.binding.run_id,
                        &r.call_digest,
                        &r.created_at_ms,
                        &r.expires_at_ms,
                        &json,
                    ],
                )
                .await
                .map(|_| ())
            })
        })
    }

    fn get(&self, approval_id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        let id = approval_id.to_string();
        self.wait(move |db| {
            Box::pin(async move {
                let rows = query(
                    &db,
                    "SELECT record::text, status, call_digest, expires_at_ms FROM toolgate_approvals WHERE approval_id = $1",
                    &[&id],
                )
                .await?;
                let Some(row) = rows.first() else {
                    return Ok(None);
                };
                let record = decode_rows(&rows, 0)?.into_iter().next();
                Ok(record.map(|r| {
                    r.check_row(
                        &row.get::<_, String>(1),
                        &row.get::<_, String>(2),
                        row.get::<_, i64>(3),
                    )
                }))
            })
        })
    }

    fn pending_for(
        &self,
        call_digest: &str,
        now_ms: i64,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        let digest = call_digest.to_string();
        self.wait(move |db| {
            Box::pin(async move {
                let rows = query(
                    &db,
                    "SELECT record::text FROM toolgate_approvals WHERE call_digest = $1 \
                     AND status = 'pending' AND expires_at_ms > $2 ORDER BY seq LIMIT 1",
                    &[&digest, &now_ms],
                )
                .await?;
                Ok(decode_rows(&rows, 0)?.into_iter().next())
            })
        })
    }

    fn pending_counts(
        &self,
        run_id: &str,
        role_id: &str,
        now_ms: i64,
    ) -> Result<PendingCounts, StoreError> {
        let (run, role) = (run_id.to_string(), role_id.to_string());
        self.wait(move |db| {
            Box::pin(async move {
                let rows = query(
                    &db,
                    "SELECT count(*) FILTER (WHERE run_id = $1), \
                     count(*) FILTER (WHERE record->'binding'->>'role_id' = $2), count(*) \
                     FROM toolgate_approvals WHERE status = 'pending' AND expires_at_ms > $3",
                    &[&run, &role, &now_ms],
                )
                .await?;
                let row = rows.first();
                let get = |i: usize| row.map(|r| r.get::<_, i64>(i).max(0) as u64).unwrap_or(0);
                Ok(PendingCounts {
                    run: get(0),
                    role: get(1),
                    total: get(2),
                })
            })
        })
    }

    fn list(
        &self,
        status: Option<ApprovalStatus>,
        run_id: Option<&str>,
        cursor: i64,
        newest_first: bool,
        limit: usize,
        now_ms: i64,
    ) -> Result<(Vec<(i64, ApprovalRecord)>, bool), StoreError> {
        let sql = page_query(
            &PageSql {
                table: "toolgate_approvals",
                row: "seq",
                record: "record::text",
                param: |n| match n {
                    3 => "$3::text".to_string(),
                    n => format!("${n}::bigint"),
                },
            },
            status,
            newest_first,
        );
        let run = run_id.map(str::to_string);
        let fetch = (limit as i64).saturating_add(1);
        self.wait(move |db| {
            Box::pin(async move {
                let rows = query(&db, &sql, &[&cursor, &now_ms, &run, &fetch]).await?;
                let records = decode_rows(&rows, 1)?;
                let mut out: Vec<(i64, ApprovalRecord)> = rows
                    .iter()
                    .map(|r| r.get::<_, i64>(0))
                    .zip(records)
                    .collect();
                let more = out.len() > limit;
                out.truncate(limit);
                Ok((out, more))
            })
        })
    }

    fn update_decided(
        &self,
        record: &ApprovalRecord,
        expected: ApprovalStatus,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let json = encode(record)?;
        let id = record.approval_id.clone();
        let status = record.status.as_str();
        // A decision adds exactly one to the decisions it was read with.
        let before = (record.decisions.len() as i32).saturating_sub(1);
        self.wait(move |db| {
            Box::pin(async move {
                execute(
                    &db,
                    "UPDATE toolgate_approvals SET status = $1, record = $2::text::jsonb \
                     WHERE approval_id = $3 AND status = $4 AND expires_at_ms > $5 \
                     AND coalesce(jsonb_array_length(record->'decisions'), 0) = $6",
                    &[&status, &json, &id, &expected.as_str(), &now_ms, &before],
                )
                .await
                .map(|n| n == 1)
            })
        })
    }

    fn claim(
        &self,
        approval_id: &str,
        call_id: &str,
        now_ms: i64,
        used_at: &str,
    ) -> Result<bool, StoreError> {
        let (id, call, at) = (
            approval_id.to_string(),
            call_id.to_string(),
            used_at.to_string(),
        );
        self.wait(move |db| {
            Box::pin(async move {
                let rows = query(
                    &db,
                    "UPDATE toolgate_approvals SET status = 'used', record = record || \
                     jsonb_build_object('status', 'used', 'used_by_call_id', $2::text, 'used_at', $4::text) \
                     WHERE approval_id = $1 AND status = 'approved' AND expires_at_ms > $3 \
                     RETURNING approval_id",
                    &[&id, &call, &now_ms, &at],
                )
                .await?;
                Ok(rows.len() == 1)
            })
        })
    }

    fn release(&self, approval_id: &str, call_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let (id, call) = (approval_id.to_string(), call_id.to_string());
        self.wait(move |db| {
            Box::pin(async move {
                let rows = query(
                    &db,
                    "UPDATE toolgate_approvals SET status = 'approved', record = \
                     (record - 'used_by_call_id' - 'used_at') || '{\"status\": \"approved\"}'::jsonb \
                     WHERE approval_id = $1 AND status = 'used' AND expires_at_ms > $3 \
                     AND record->>'used_by_call_id' = $2 RETURNING approval_id",
                    &[&id, &call, &now_ms],
                )
                .await?;
                Ok(rows.len() == 1)
            })
        })
    }

    fn due_expiries(&self, now_ms: i64, limit: usize) -> Result<Vec<ApprovalRecord>, StoreError> {
        let limit = limit as i64;
        self.wait(move |db| {
            Box::pin(async move {
                let rows = query(
                    &db,
                    "SELECT record::text FROM toolgate_approvals \
                     WHERE ((status IN ('pending', 'approved') AND expires_at_ms <= $1) \
                            OR status = 'expired') AND NOT expiry_audited \
                     AND (expiry_claimed_at_ms IS NULL OR expiry_claimed_at_ms <= $1 - $3) \
                     ORDER BY expires_at_ms LIMIT $2",
                    &[&now_ms, &limit, &EXPIRY_CLAIM_LEASE_MS],
                )
                .await?;
                decode_rows(&rows, 0)
            })
        })
    }

    fn mark_expired(&self, approval_id: &str) -> Result<(), StoreError> {
        let id = approval_id.to_string();
        self.wait(move |db| {
            Box::pin(async move {
                execute(
                    &db,
                    "UPDATE toolgate_approvals SET status = 'expired', \
                     record = record || '{\"status\": \"expired\"}'::jsonb \
                     WHERE approval_id = $1 AND status IN ('pending', 'approved', 'expired')",
                    &[&id],
                )
                .await
                .map(|_| ())
            })
        })
    }

    fn claim_expiry(&self, approval_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let id = approval_id.to_string();
        let node = self.db.node_id.clone();
        self.wait(move |db| {
            Box::pin(async move {
                // One statement: a concurrent sweeper blocked on the row re-reads it
                // after this one commits and finds it claimed.
                let rows = query(
                    &db,
                    "UPDATE toolgate_approvals SET status = 'expired', \
                     record = record || '{\"status\": \"expired\"}'::jsonb, \
                     expiry_claimed_at_ms = $2, expiry_claimed_by = $3 \
                     WHERE approval_id = $1 AND NOT expiry_audited \
                     AND ((status IN ('pending', 'approved') AND expires_at_ms <= $2) \
                          OR status = 'expired') \
                     AND (expiry_claimed_at_ms IS NULL OR expiry_claimed_at_ms <= $2 - $4) \
                     RETURNING approval_id",
                    &[&id, &now_ms, &node, &EXPIRY_CLAIM_LEASE_MS],
                )
                .await?;
                Ok(rows.len() == 1)
            })
        })
    }

    fn expiry_audited(&self, approval_id: &str) -> Result<(), StoreError> {
        let id = approval_id.to_string();
        self.wait(move |db| {
            Box::pin(async move {
                execute(
                    &db,
                    "UPDATE toolgate_approvals SET expiry_audited = true WHERE approval_id = $1",
                    &[&id],
                )
                .await
                .map(|_| ())
            })
        })
    }

    fn prune(&self, keep: u64) -> Result<usize, StoreError> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        self.wait(move |db| {
            Box::pin(async move {
                execute(
                    &db,
                    "DELETE FROM toolgate_approvals WHERE seq IN ( \
                     SELECT seq FROM toolgate_approvals \
                     WHERE status IN ('denied', 'used') OR (status = 'expired' AND expiry_audited) \
                     ORDER BY seq DESC OFFSET $1)",
                    &[&keep],
                )
                .await
                .map(|n| n as usize)
            })
        })
    }
}
