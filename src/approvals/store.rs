//! The durable approval store: one SQLite file (`approvals.db` in the data directory,
//! next to the audit log), so a restart keeps pending approvals.
//!
//! Each approval is one row: the columns the store queries (status, run, digest,
//! times) and the whole record as JSON. Every operation is one statement or one
//! transaction; the claim of an approved approval by a retry is one conditional
//! `UPDATE`, so of concurrent retries exactly one wins.
//!
//! INVARIANT: with `audit`, the only code that knows rusqlite; nothing here decides
//! who may do what (the gateway does, before it calls the store).

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{ApprovalRecord, ApprovalStatus, PendingCounts};

/// A failed store operation (the database is unreadable, unwritable or corrupt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreError {}

fn map(e: rusqlite::Error) -> StoreError {
    StoreError(e.to_string())
}

pub(crate) fn decode(json: &str) -> Result<ApprovalRecord, StoreError> {
    serde_json::from_str(json)
        .map_err(|e| StoreError(format!("an approval record is unreadable: {e}")))
}

pub(crate) fn encode(record: &ApprovalRecord) -> Result<String, StoreError> {
    serde_json::to_string(record).map_err(|e| StoreError(e.to_string()))
}

/// How one database names what a page of approvals is read with.
pub(crate) struct PageSql {
    pub table: &'static str,
    /// The row-number column (the cursor's).
    pub row: &'static str,
    /// The record column as text.
    pub record: &'static str,
    /// Placeholder `n` (1: cursor, 2: now in ms, 3: run id or NULL, 4: rows to fetch),
    /// with the type the database needs to bind it where it stands alone.
    pub param: fn(u8) -> String,
}

/// The query behind `list`, the same filters for SQLite and PostgreSQL: rows after the
/// cursor (0 starts at either end) in the order they were requested, of one status as
/// of "now" (pending and approved ones past their expiry are expired), of one run if
/// given. Every placeholder appears whatever the filters, as both drivers want every
/// bound parameter used.
pub(crate) fn page_query(
    sql: &PageSql,
    status: Option<ApprovalStatus>,
    newest_first: bool,
) -> String {
    let PageSql {
        table, row, record, ..
    } = sql;
    let [cursor, now, run, fetch] = [1, 2, 3, 4].map(sql.param);
    let status = match status {
        None => format!("{now} = {now}"),
        Some(ApprovalStatus::Pending) => format!("(status = 'pending' AND expires_at_ms > {now})"),
        Some(ApprovalStatus::Approved) => {
            format!("(status = 'approved' AND expires_at_ms > {now})")
        }
        Some(ApprovalStatus::Expired) => format!(
            "(status = 'expired' OR (status IN ('pending', 'approved') AND expires_at_ms <= {now}))"
        ),
        Some(ApprovalStatus::Denied) => format!("(status = 'denied' AND {now} = {now})"),
        Some(ApprovalStatus::Used) => format!("(status = 'used' AND {now} = {now})"),
    };
    let (after, order) = if newest_first {
        (format!("({cursor} = 0 OR {row} < {cursor})"), "DESC")
    } else {
        (format!("{row} > {cursor}"), "ASC")
    };
    format!(
        "SELECT {row}, {record} FROM {table} WHERE {after} AND {status} \
         AND ({run} IS NULL OR run_id = {run}) ORDER BY {row} {order} LIMIT {fetch}"
    )
}

/// The approvals database. Operations block (they write with `synchronous=FULL`):
/// async callers run them on the blocking pool.
pub struct ApprovalStore {
    conn: Mutex<Connection>,
}

impl ApprovalStore {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<ApprovalStore, StoreError> {
        // Owner-only, with the WAL and shared-memory files SQLite makes beside it.
        crate::localfile::prepare_database(path).map_err(|e| {
            StoreError(format!(
                "cannot create the approval store `{}`: {e}",
                path.display()
            ))
        })?;
        let conn = Connection::open(path).map_err(map)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(map)?;
        let _: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(map)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(map)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS approvals (
                 approval_id   TEXT PRIMARY KEY,
                 status        TEXT NOT NULL,
                 run_id        TEXT NOT NULL,
                 call_digest   TEXT NOT NULL,
                 created_at_ms INTEGER NOT NULL,
                 expires_at_ms INTEGER NOT NULL,
                 expiry_audited INTEGER NOT NULL DEFAULT 0,
                 record        TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS approvals_status ON approvals (status, expires_at_ms);
             CREATE INDEX IF NOT EXISTS approvals_run ON approvals (run_id, status);
             CREATE INDEX IF NOT EXISTS approvals_digest ON approvals (call_digest, status);",
        )
        .map_err(map)?;
        Ok(ApprovalStore {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| StoreError("the approval store is poisoned".into()))?;
        f(&mut conn)
    }

    /// Adds a new (pending) approval.
    pub fn insert(&self, record: &ApprovalRecord) -> Result<(), StoreError> {
        let json = encode(record)?;
        self.with(|c| {
            c.execute(
                "INSERT INTO approvals (approval_id, status, run_id, call_digest, created_at_ms, expires_at_ms, record)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    record.approval_id,
                    record.status.as_str(),
                    record.binding.run_id,
                    record.call_digest,
                    record.created_at_ms,
                    record.expires_at_ms,
                    json
                ],
            )
            .map_err(map)?;
            Ok(())
        })
    }

    /// The approval, with [`ApprovalRecord::row_disagrees`] set when the row's
    /// columns disagree with its record.
    pub fn get(&self, approval_id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        self.with(|c| {
            let row: Option<(String, String, i64, String)> = c
                .query_row(
                    "SELECT status, call_digest, expires_at_ms, record FROM approvals WHERE approval_id = ?1",
                    [approval_id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .optional()
                .map_err(map)?;
            row.map(|(status, digest, expires, json)| {
                decode(&json).map(|r| r.check_row(&status, &digest, expires))
            })
            .transpose()
        })
    }

    /// A pending, unexpired approval of the same exact call, if there is one (a
    /// repeated call reuses it instead of requesting another).
    pub fn pending_for(
        &self,
        call_digest: &str,
        now_ms: i64,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        self.with(|c| {
            let json: Option<String> = c
                .query_row(
                    "SELECT record FROM approvals WHERE call_digest = ?1 AND status = 'pending'
                     AND expires_at_ms > ?2 ORDER BY created_at_ms LIMIT 1",
                    params![call_digest, now_ms],
                    |r| r.get(0),
                )
                .optional()
                .map_err(map)?;
            json.as_deref().map(decode).transpose()
        })
    }

    /// Unexpired pending approvals: of `run_id`, and in total.
    pub fn pending_counts(
        &self,
        run_id: &str,
        role_id: &str,
        now_ms: i64,
    ) -> Result<PendingCounts, StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FILTER (WHERE run_id = ?1),
                        COUNT(*) FILTER (WHERE json_extract(record, '$.binding.role_id') = ?2),
                        COUNT(*)
                 FROM approvals WHERE status = 'pending' AND expires_at_ms > ?3",
                rusqlite::params![run_id, role_id, now_ms],
                |r| {
                    let get = |i: usize| r.get::<_, i64>(i).map(|n| n.max(0) as u64);
                    Ok(PendingCounts {
                        run: get(0)?,
                        role: get(1)?,
                        total: get(2)?,
                    })
                },
            )
            .map_err(map)
        })
    }

    /// A page of at most `limit` approvals in the order they were requested, after
    /// `cursor` (a row number), optionally of one status as of `now_ms` and of one
    /// run, each with its row number; and whether more follow.
    #[allow(clippy::type_complexity)]
    pub fn list(
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
                table: "approvals",
                row: "rowid",
                record: "record",
                param: |n| format!("?{n}"),
            },
            status,
            newest_first,
        );
        self.with(|c| {
            let mut stmt = c.prepare(&sql).map_err(map)?;
            let rows = stmt
                .query_map(params![cursor, now_ms, run_id, (limit + 1) as i64], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(map)?;
            let mut out = Vec::new();
            let mut more = false;
            for row in rows {
                let (rowid, json) = row.map_err(map)?;
                if out.len() == limit {
                    more = true;
                    break;
                }
                out.push((rowid, decode(&json)?));
            }
            Ok((out, more))
        })
    }

    /// Writes a decided record (status and decisions) if its status is still
    /// `expected` and it has not expired by `now_ms`; false when it changed meanwhile.
    pub fn update_decided(
        &self,
        record: &ApprovalRecord,
        expected: ApprovalStatus,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let json = encode(record)?;
        self.with(|c| {
            let changed = c
                .execute(
                    "UPDATE approvals SET status = ?1, record = ?2
                     WHERE approval_id = ?3 AND status = ?4 AND expires_at_ms > ?5",
                    params![
                        record.status.as_str(),
                        json,
                        record.approval_id,
                        expected.as_str(),
                        now_ms
                    ],
                )
                .map_err(map)?;
            Ok(changed == 1)
        })
    }

    /// Claims an approved, unexpired approval for `call_id`: one conditional UPDATE,
    /// so of concurrent claims exactly one returns true.
    pub fn claim(
        &self,
        approval_id: &str,
        call_id: &str,
        now_ms: i64,
        used_at: &str,
    ) -> Result<bool, StoreError> {
        self.with(|c| {
            let changed = c
                .execute(
                    "UPDATE approvals SET status = 'used',
                         record = json_set(record, '$.status', 'used', '$.used_by_call_id', ?2, '$.used_at', ?4)
                     WHERE approval_id = ?1 AND status = 'approved' AND expires_at_ms > ?3",
                    params![approval_id, call_id, now_ms, used_at],
                )
                .map_err(map)?;
            Ok(changed == 1)
        })
    }

    /// Gives back an approval `call_id` claimed but never ran (nothing reached the
    /// tool): approved again, if it has not expired.
    pub fn release(
        &self,
        approval_id: &str,
        call_id: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.with(|c| {
            let changed = c
                .execute(
                    "UPDATE approvals SET status = 'approved',
                         record = json_remove(json_set(record, '$.status', 'approved'), '$.used_by_call_id', '$.used_at')
                     WHERE approval_id = ?1 AND status = 'used' AND expires_at_ms > ?3
                       AND json_extract(record, '$.used_by_call_id') = ?2",
                    params![approval_id, call_id, now_ms],
                )
                .map_err(map)?;
            Ok(changed == 1)
        })
    }

    /// Approvals past their expiry whose expiry is not audited yet (pending or
    /// approved, or already marked expired by an earlier sweep that could not audit).
    pub fn due_expiries(
        &self,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        self.with(|c| {
            let mut stmt = c
                .prepare(
                    "SELECT record FROM approvals
                     WHERE ((status IN ('pending', 'approved') AND expires_at_ms <= ?1)
                            OR status = 'expired') AND expiry_audited = 0
                     ORDER BY expires_at_ms LIMIT ?2",
                )
                .map_err(map)?;
            let rows = stmt
                .query_map(params![now_ms, limit as i64], |r| r.get::<_, String>(0))
                .map_err(map)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(decode(&row.map_err(map)?)?);
            }
            Ok(out)
        })
    }

    /// Marks an approval expired (before its expiry is audited): from now on nothing
    /// else can change it.
    pub fn mark_expired(&self, approval_id: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE approvals SET status = 'expired', record = json_set(record, '$.status', 'expired')
                 WHERE approval_id = ?1 AND status IN ('pending', 'approved', 'expired')",
                [approval_id],
            )
            .map_err(map)?;
            Ok(())
        })
    }

    /// Records that an approval's expiry is in the audit log.
    pub fn expiry_audited(&self, approval_id: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE approvals SET expiry_audited = 1 WHERE approval_id = ?1",
                [approval_id],
            )
            .map_err(map)?;
            Ok(())
        })
    }

    /// Deletes the oldest finished approvals beyond `keep` (denied, used, and expired
    /// ones whose expiry is audited).
    pub fn prune(&self, keep: u64) -> Result<usize, StoreError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM approvals WHERE rowid IN (
                     SELECT rowid FROM approvals
                     WHERE status IN ('denied', 'used') OR (status = 'expired' AND expiry_audited = 1)
                     ORDER BY rowid DESC LIMIT -1 OFFSET ?1)",
                [keep as i64],
            )
            .map_err(map)
        })
    }
}

/// The store's operations, whatever keeps the approvals: [`ApprovalStore`] (SQLite,
/// one sidecar) or `cluster::approvals::PgApprovals` (the cluster database, shared by
/// a fleet). Methods block: async callers run them on the blocking pool. Each has the
/// meaning documented on [`ApprovalStore`]'s method of the same name; `claim` is
/// atomic (of concurrent claims, exactly one returns true).
#[allow(clippy::type_complexity)]
pub trait ApprovalBackend: Send + Sync {
    fn insert(&self, record: &ApprovalRecord) -> Result<(), StoreError>;
    fn get(&self, approval_id: &str) -> Result<Option<ApprovalRecord>, StoreError>;
    fn pending_for(
        &self,
        call_digest: &str,
        now_ms: i64,
    ) -> Result<Option<ApprovalRecord>, StoreError>;
    fn pending_counts(
        &self,
        run_id: &str,
        role_id: &str,
        now_ms: i64,
    ) -> Result<PendingCounts, StoreError>;
    fn list(
        &self,
        status: Option<ApprovalStatus>,
        run_id: Option<&str>,
        cursor: i64,
        newest_first: bool,
        limit: usize,
        now_ms: i64,
    ) -> Result<(Vec<(i64, ApprovalRecord)>, bool), StoreError>;
    fn update_decided(
        &self,
        record: &ApprovalRecord,
        expected: ApprovalStatus,
        now_ms: i64,
    ) -> Result<bool, StoreError>;
    fn claim(
        &self,
        approval_id: &str,
        call_id: &str,
        now_ms: i64,
        used_at: &str,
    ) -> Result<bool, StoreError>;
    fn release(&self, approval_id: &str, call_id: &str, now_ms: i64) -> Result<bool, StoreError>;
    fn due_expiries(&self, now_ms: i64, limit: usize) -> Result<Vec<ApprovalRecord>, StoreError>;
    fn mark_expired(&self, approval_id: &str) -> Result<(), StoreError>;
    /// Marks the approval expired and claims the auditing of its expiry for this
    /// sidecar; true when this caller is the one to write `approval_expired`. One
    /// process with one sweeper (SQLite): always. In a fleet, one conditional
    /// statement: of concurrent sweepers on any sidecars exactly one wins.
    fn claim_expiry(&self, approval_id: &str, _now_ms: i64) -> Result<bool, StoreError> {
        self.mark_expired(approval_id).map(|()| true)
    }
    fn expiry_audited(&self, approval_id: &str) -> Result<(), StoreError>;
    fn prune(&self, keep: u64) -> Result<usize, StoreError>;
    /// Whether the approvals are shared by a fleet (the gateway then cannot find every
    /// grant in its own audit log: see `docs/deployment.md`).
    fn shared(&self) -> bool {
        false
    }
}

impl ApprovalBackend for ApprovalStore {
    fn insert(&self, record: &ApprovalRecord) -> Result<(), StoreError> {
        ApprovalStore::insert(self, record)
    }
    fn get(&self, approval_id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        ApprovalStore::get(self, approval_id)
    }
    fn pending_for(
        &self,
        call_digest: &str,
        now_ms: i64,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        ApprovalStore::pending_for(self, call_digest, now_ms)
    }
    fn pending_counts(
        &self,
        run_id: &str,
        role_id: &str,
        now_ms: i64,
    ) -> Result<PendingCounts, StoreError> {
        ApprovalStore::pending_counts(self, run_id, role_id, now_ms)
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
        ApprovalStore::list(self, status, run_id, cursor, newest_first, limit, now_ms)
    }
    fn update_decided(
        &self,
        record: &ApprovalRecord,
        expected: ApprovalStatus,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        ApprovalStore::update_decided(self, record, expected, now_ms)
    }
    fn claim(
        &self,
        approval_id: &str,
        call_id: &str,
        now_ms: i64,
        used_at: &str,
    ) -> Result<bool, StoreError> {
        ApprovalStore::claim(self, approval_id, call_id, now_ms, used_at)
    }
    fn release(&self, approval_id: &str, call_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        ApprovalStore::release(self, approval_id, call_id, now_ms)
    }
    fn due_expiries(&self, now_ms: i64, limit: usize) -> Result<Vec<ApprovalRecord>, StoreError> {
        ApprovalStore::due_expiries(self, now_ms, limit)
    }
    fn mark_expired(&self, approval_id: &str) -> Result<(), StoreError> {
        ApprovalStore::mark_expired(self, approval_id)
    }
    fn expiry_audited(&self, approval_id: &str) -> Result<(), StoreError> {
        ApprovalStore::expiry_audited(self, approval_id)
    }
    fn prune(&self, keep: u64) -> Result<usize, StoreError> {
        ApprovalStore::prune(self, keep)
    }
}
