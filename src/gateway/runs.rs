//! The gateway's run operations of the admin API: creating a run (its tokens are
//! `run_tokens.rs`), reading and listing runs, changing a run's status and re-pinning
//! it to the loaded policy. Each is audited before it takes effect (`runs::RunStore`,
//! or the cluster database in a fleet).

use serde_json::json;

use super::{Admin, Auditor, Gateway, Reader, Repinned, RunPage, now_rfc3339, run_refusal};
use crate::authz;
use crate::diagnostic::{Reason, Refusal};
use crate::policy::RunStatus;
use crate::requests::{CreateRun, ListRuns, Repin, SetRunStatus};
use crate::runs::RunRecord;

impl Gateway {
    /// Creates a run bound to a scope and pinned to the loaded policy versions (admin).
    /// Run tokens are issued by [`Gateway::create_run_issuing`].
    pub async fn create_run(
        &self,
        admin: &Admin,
        request: CreateRun,
    ) -> Result<RunRecord, Refusal> {
        let loaded = admin.loaded();
        let admin = admin.admin_id().to_string();
        let run_id = request
            .run_id
            .unwrap_or_else(|| format!("run-{}", uuid::Uuid::new_v4()));
        let scope = request.scope;
        if self.cluster.is_none() && self.runs.len() >= crate::runs::MAX_RUNS {
            return Err(Refusal::new(Reason::InternalError, "the run table is full"));
        }
        let record = RunRecord {
            run_id,
            status: RunStatus::Active,
            scope,
            policy_versions: loaded.policy.versions.clone(),
            created_at: now_rfc3339(),
            created_by: admin,
        };
        if let Some(cluster) = &self.cluster {
            return self.fleet_create_run(cluster, record).await;
        }
        self.runs
            .create(&self.audit, record)
            .await
            .map_err(run_refusal)
    }

    /// Reads a run (admin or any role credential).
    pub async fn get_run(&self, _reader: &Reader, run_id: &str) -> Result<RunRecord, Refusal> {
        if self.cluster.is_some() {
            self.fleet_refresh(None, Some(run_id)).await?;
        }
        self.runs.get(run_id).ok_or_else(|| {
            Refusal::new(
                Reason::RunNotFound,
                format!("run `{run_id}` does not exist"),
            )
        })
    }

    /// Changes a run's status (admin).
    pub async fn set_run_status(
        &self,
        admin: &Admin,
        run_id: &str,
        request: SetRunStatus,
    ) -> Result<RunRecord, Refusal> {
        let admin = admin.admin_id();
        let status = request.status;
        if let Some(cluster) = &self.cluster {
            return self
                .fleet_set_run_status(cluster, run_id, status, admin)
                .await;
        }
        self.runs
            .set_status(&self.audit, run_id, status, admin)
            .await
            .map_err(run_refusal)
    }

    /// `GET /v1/runs` (admin): runs in run-id order, optionally of one status, a page of
    /// at most `limit` after the run id `cursor`.
    pub async fn list_runs(&self, _auditor: &Auditor, query: ListRuns) -> Result<RunPage, Refusal> {
        let ListRuns {
            status,
            limit,
            cursor,
        } = query;
        let (runs, next) = match &self.cluster {
            Some(cluster) => cluster.list_runs(status, cursor.as_deref(), limit).await?,
            None => self.runs.list(status, cursor.as_deref(), limit),
        };
        Ok(RunPage {
            runs,
            next_cursor: next,
        })
    }

    /// `POST /v1/runs/{id}/repin` (admin): re-pins an open run to the loaded policy
    /// versions after a reviewed change. The run's scope is re-checked against the new
    /// policy first; the change is audited (`run_repinned`) before it takes effect.
    pub async fn repin_run(
        &self,
        admin: &Admin,
        run_id: &str,
        request: Repin,
    ) -> Result<Repinned, Refusal> {
        let loaded = admin.loaded();
        let admin = admin.admin_id();
        let Repin {} = request;
        if self.cluster.is_some() {
            self.fleet_refresh(None, Some(run_id)).await?;
        }
        let Some(run) = self.runs.get(run_id) else {
            return Err(Refusal::new(
                Reason::RunNotFound,
                format!("run `{run_id}` does not exist"),
            ));
        };
        if run.status == RunStatus::Closed {
            return Err(Refusal::new(
                Reason::RunNotActive,
                format!("run `{run_id}` is closed; a closed run is never re-pinned"),
            ));
        }
        let check = authz::check_run_scope(&loaded.policy, &run.scope);
        let report = json!(check);
        if run.policy_versions == loaded.policy.versions {
            return Ok(Repinned {
                run,
                repinned: false,
                from_policy_versions: None,
                scope_check: check,
            });
        }
        if let Some(cluster) = &self.cluster {
            let (record, from) = self
                .fleet_repin(
                    cluster,
                    run_id,
                    loaded.policy.versions.clone(),
                    admin,
                    report,
                )
                .await?;
            return Ok(Repinned {
                run: record,
                repinned: true,
                from_policy_versions: Some(from),
                scope_check: check,
            });
        }
        let (record, from) = self
            .runs
            .repin(
                &self.audit,
                run_id,
                loaded.policy.versions.clone(),
                admin,
                report,
            )
            .await
            .map_err(run_refusal)?;
        Ok(Repinned {
            run: record,
            repinned: true,
            from_policy_versions: Some(from),
            scope_check: check,
        })
    }
}
