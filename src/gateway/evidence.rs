//! A run's evidence for compliance users (the console's run view): the run's events
//! with their verification status, and its verifiable export bundle. Read-only; an
//! admin of either access (`full` or `audit_read`) may read it.

use std::time::Duration;

use serde_json::json;
use tokio::sync::Semaphore;

use super::Gateway;
use super::principal::Auditor;
use crate::audit::evidence::{Bundle, BundleError, MAX_EVIDENCE_PAGE, RunEvidence};
use crate::audit::export::ExportError;
use crate::diagnostic::{Reason, Refusal};
use crate::requests::malformed;
use crate::runs::{RunRecord, valid_run_id};

/// Evidence verifies the whole log (as `audit verify` does), so one request at a time
/// does it; others wait up to [`EVIDENCE_WAIT`], then get a retryable 429.
static EVIDENCE: Semaphore = Semaphore::const_new(1);
const EVIDENCE_WAIT: Duration = Duration::from_secs(10);
/// The largest export bundle served (bytes of its files); larger runs are exported
/// with `toolgate audit export --run`.
pub const MAX_BUNDLE_BYTES: u64 = 64 * 1024 * 1024;

/// The query of `GET /v1/runs/{id}/events`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvidencePage {
    pub after_seq: u64,
    pub limit: usize,
}

impl EvidencePage {
    /// `after_seq` (default 0) and `limit` (1 to 500, default 100).
    pub fn from_query(after_seq: Option<&str>, limit: Option<&str>) -> Result<Self, Refusal> {
        let after_seq = match after_seq {
            None => 0,
            Some(v) => v
                .parse()
                .map_err(|_| malformed("`after_seq` must be a non-negative integer"))?,
        };
        let limit = match limit {
            None => 100,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_EVIDENCE_PAGE).contains(&n) => n,
                _ => {
                    return Err(malformed(&format!(
                        "`limit` must be an integer from 1 to {MAX_EVIDENCE_PAGE}"
                    )));
                }
            },
        };
        Ok(EvidencePage { after_seq, limit })
    }
}

/// `GET /v1/runs/{run_id}/events`' answer: a page of the run's events with their
/// verification status, and the run's record (null when it is not known).
#[derive(Debug, serde::Serialize)]
pub struct RunEvents {
    #[serde(flatten)]
    pub evidence: RunEvidence,
    pub run: Option<RunRecord>,
}

impl Gateway {
    /// `GET /v1/runs/{run_id}/events`: one page of the run's events, oldest first,
    /// each with its verification status against the newest signed checkpoint, and the
    /// run's record when it is known.
    pub async fn run_events(
        &self,
        _auditor: &Auditor,
        run_id: &str,
        page: EvidencePage,
    ) -> Result<RunEvents, Refusal> {
        check_run_id(run_id)?;
        let _permit = evidence_permit().await?;
        let evidence = self
            .audit
            .run_evidence(run_id, page.after_seq, page.limit)
            .await
            .map_err(|e| {
                Refusal::new(
                    Reason::AuditUnavailable,
                    format!("the audit log could not be read: {e}"),
                )
            })?;
        let run = self.runs.get(run_id);
        if run.is_none() && evidence.events.is_empty() && page.after_seq == 0 {
            return Err(Refusal::new(
                Reason::RunNotFound,
                format!("run `{run_id}` does not exist"),
            ));
        }
        Ok(RunEvents { evidence, run })
    }

    /// `GET /v1/runs/{run_id}/export`: the run's verifiable export bundle, made as
    /// `toolgate audit export --run` makes its directory (the whole log verified, a
    /// fresh export checkpoint signed), in one JSON object.
    pub async fn run_export(&self, _auditor: &Auditor, run_id: &str) -> Result<Bundle, Refusal> {
        check_run_id(run_id)?;
        if self.runs.get(run_id).is_none() {
            let page = self
                .run_events_exist(run_id)
                .await
                .map_err(|e| Refusal::new(Reason::AuditUnavailable, e))?;
            if !page {
                return Err(Refusal::new(
                    Reason::RunNotFound,
                    format!("run `{run_id}` does not exist"),
                ));
            }
        }
        let _permit = evidence_permit().await?;
        let work_root = self.audit.data_dir().join("exports");
        crate::localfile::create_dir_all(&work_root).map_err(|e| {
            Refusal::new(
                Reason::AuditUnavailable,
                format!(
                    "cannot create the export work directory `{}`: {e}",
                    work_root.display()
                ),
            )
        })?;
        self.audit
            .run_bundle(run_id, work_root, MAX_BUNDLE_BYTES)
            .await
            .map_err(|e| match e {
                BundleError::TooLarge { max_bytes } => Refusal::new(
                    Reason::RequestTooLarge,
                    format!(
                        "the export bundle of run `{run_id}` would be larger than {max_bytes} bytes; export it with `toolgate audit export --run {run_id}`"
                    ),
                )
                .with_details(json!({ "max_bundle_bytes": max_bytes })),
                BundleError::Export(ExportError::Verify(problem)) => Refusal::new(
                    Reason::AuditUnavailable,
                    format!("the audit log does not verify, nothing was exported: {problem}"),
                )
                .with_details(json!({ "problem": problem })),
                BundleError::Export(e) => Refusal::new(
                    Reason::AuditUnavailable,
                    format!("the export could not be made: {e}"),
                ),
            })
    }

    /// Whether the log holds any event of `run_id` (a closed run no longer in memory).
    async fn run_events_exist(&self, run_id: &str) -> Result<bool, String> {
        let filter = crate::audit::EventFilter {
            run_id: Some(run_id.to_string()),
            limit: 1,
            ..Default::default()
        };
        self.audit
            .events(filter)
            .await
            .map(|events| !events.is_empty())
            .map_err(|e| format!("the audit log could not be read: {e}"))
    }
}

fn check_run_id(run_id: &str) -> Result<(), Refusal> {
    if valid_run_id(run_id) {
        Ok(())
    } else {
        Err(malformed("the run id is not a valid run id"))
    }
}

async fn evidence_permit() -> Result<tokio::sync::SemaphorePermit<'static>, Refusal> {
    match tokio::time::timeout(EVIDENCE_WAIT, EVIDENCE.acquire()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(Refusal::new(
            Reason::RateLimited,
            "another evidence request is verifying the log; retry shortly",
        )
        .with_details(json!({ "limit": "evidence_concurrency", "retry_after_ms": 1000 }))),
    }
}
