//! Shadow mode: a candidate policy decides every live call beside the active one.
//!
//! The active policy enforces; the candidate only decides (steps 1-8, offline, like
//! `policy explain`: the caller's token is verified against the candidate's
//! credentials and the live run is pinned to the candidate's versions, so only real
//! policy differences show). Each call whose two decisions differ (allow against deny,
//! or two different denial reasons) is a divergence: it is counted at once and
//! recorded as a `shadow_divergence` audit event with both decisions.
//!
//! The work is off the response path: the pipeline hands a copy of the request to one
//! worker task over a bounded queue and goes on. When the queue is full the copy is
//! dropped and counted, never waited for: shadow mode must not delay a live call. The
//! worker records the drops in a `shadow_dropped` audit event at most every
//! [`DROP_SUMMARY_EVERY`] (and at flush), so the evaluation says how much it did not
//! see. [`Shadow::flush`] (run at shutdown before the audit log closes) waits until
//! every queued call is decided and recorded.
//!
//! INVARIANT: the candidate never executes anything, never changes a response and
//! never delays one.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::json;
use tokio::sync::mpsc;

use crate::audit::{AuditLog, EventType, NewEvent};
use crate::gateway::Loaded;
use crate::gateway::shadow::{Counters, Job, Message};
use crate::pipeline::{Caller, explain_as};

pub use crate::gateway::shadow::Shadow;

/// Calls waiting for the shadow worker; beyond this, calls are not shadowed (counted).
const QUEUE: usize = 4096;
/// How often dropped calls are summarized in the audit log (when there were any).
pub const DROP_SUMMARY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// The most divergences recorded in one audit append.
const BATCH: usize = 64;

/// Starts the worker (on the current tokio runtime) that decides calls under
/// `candidate` and records divergences in `audit`; the handle the gateway holds
/// (`Gateway::with_shadow`).
pub fn start(candidate: Loaded, audit: AuditLog) -> Shadow {
    with_queue(candidate, audit, QUEUE)
}

/// [`start`] with a queue of `queue` calls.
fn with_queue(candidate: Loaded, audit: AuditLog, queue: usize) -> Shadow {
    let (sender, receiver) = mpsc::channel(queue.max(1));
    let counters = Arc::new(Counters::default());
    let versions = candidate.policy.versions.clone();
    let worker = Worker {
        candidate,
        audit,
        counters: counters.clone(),
        reported: 0,
    };
    tokio::spawn(worker.run(receiver));
    Shadow::new(versions, sender, counters)
}

struct Worker {
    candidate: Loaded,
    audit: AuditLog,
    counters: Arc<Counters>,
    /// Drops already recorded in a `shadow_dropped` event.
    reported: u64,
}

impl Worker {
    async fn run(mut self, mut receiver: mpsc::Receiver<Message>) {
        let mut summary = tokio::time::interval(DROP_SUMMARY_EVERY);
        summary.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let first = tokio::select! {
                message = receiver.recv() => match message {
                    Some(m) => m,
                    None => break,
                },
                _ = summary.tick() => {
                    self.summarize_drops().await;
                    continue;
                }
            };
            let mut events = Vec::new();
            let mut flushes = Vec::new();
            let mut next = Some(first);
            while let Some(message) = next.take() {
                match message {
                    Message::Decide(job) => events.extend(self.decide(*job)),
                    Message::Flush(done) => flushes.push(done),
                }
                if events.len() < BATCH && flushes.is_empty() {
                    next = receiver.try_recv().ok();
                }
            }
            if !events.is_empty() {
                let count = events.len();
                if let Err(e) = self.audit.append_all(events).await {
                    tracing::error!(error = %e, divergences = count, "shadow divergences could not be recorded in the audit log");
                }
            }
            if !flushes.is_empty() {
                self.summarize_drops().await;
            }
            for done in flushes {
                let _ = done.send(());
            }
        }
    }

    /// Records the calls dropped since the last summary, if any.
    async fn summarize_drops(&mut self) {
        let total = self.counters.dropped.load(Ordering::Relaxed);
        if total == self.reported {
            return;
        }
        let mut event = NewEvent::new(EventType::ShadowDropped);
        event
            .details
            .insert("dropped".into(), json!(total - self.reported));
        event.details.insert("dropped_total".into(), json!(total));
        event.details.insert(
            "shadow_policy_versions".into(),
            json!(self.candidate.policy.versions),
        );
        match self.audit.append(event).await {
            Ok(_) => self.reported = total,
            Err(e) => {
                tracing::error!(error = %e, dropped = total - self.reported, "the shadow drop summary could not be recorded")
            }
        }
    }

    /// Decides one call under the candidate; the divergence event, if any.
    fn decide(&self, job: Job) -> Option<NewEvent> {
        let run = job.run.map(|mut run| {
            run.policy_versions = self.candidate.policy.versions.clone();
            run
        });
        let caller = match &job.jwt {
            Some(jwt) => Caller::Jwt(jwt),
            None => Caller::Token(job.token.as_deref()),
        };
        let explanation = explain_as(&self.candidate, caller, job.request.clone(), run);
        self.counters.decided.fetch_add(1, Ordering::Relaxed);
        let shadow = explanation.verdict();
        if !job.active.diverges(&shadow) {
            return None;
        }
        self.counters.divergences.fetch_add(1, Ordering::Relaxed);
        let request = &job.request;
        let mut event = NewEvent::new(EventType::ShadowDivergence);
        event.call_id = Some(job.call_id);
        event.run_id = Some(request.run_id.clone());
        event.role_id = Some(request.role_id.clone());
        event.lane_id = Some(request.lane_id.clone());
        event.tool_name = Some(request.tool_name.clone());
        event.policy_versions = Some(std::sync::Arc::new(job.active_versions));
        event.details.insert("active".into(), json!(job.active));
        event.details.insert("shadow".into(), json!(shadow));
        event.details.insert(
            "shadow_policy_versions".into(),
            json!(self.candidate.policy.versions),
        );
        event
            .details
            .insert("shadow_trace".into(), explanation.trace.to_json());
        if request.dry_run {
            event.details.insert("dry_run".into(), json!(true));
        }
        Some(event)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::path::{Path, PathBuf};

    use serde_json::{Value, json};

    use super::*;
    use crate::audit::{AuditOptions, EventFilter};
    use crate::call::Received;
    use crate::call::Status;
    use crate::gateway::{Gateway, PolicySourcePaths, adapter_env};

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    fn loaded(edit: impl FnOnce(&mut crate::policy::Policy)) -> Loaded {
        let tools = repo().join("tools/tool_registry.yaml");
        let mut policy = crate::policy::load(&repo().join("policy"), &tools).unwrap();
        edit(&mut policy);
        let adapters =
            crate::adapter::build(&policy, &adapter_env(&tools, Path::new("var"))).unwrap();
        Loaded::new(policy, adapters)
    }

    fn request(run_id: &str, tool: &str, scope: Value) -> Received {
        crate::call::parse_request_value(json!({
            "role_id": "research_agent", "run_id": run_id, "lane_id": "research",
            "tool_name": tool, "arguments": {}, "scope": scope,
        }))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn divergences_are_counted_and_recorded_and_responses_follow_the_active_policy() {
        let dir = tempfile::tempdir().unwrap();
        let audit = AuditLog::open(AuditOptions::new(dir.path())).unwrap();
        let tools = repo().join("tools/tool_registry.yaml");
        let gateway = Gateway::start(
            loaded(|_| {}),
            audit.clone(),
            adapter_env(&tools, dir.path()),
            PolicySourcePaths {
                policy_dir: repo().join("policy"),
                tools_file: tools.clone(),
            },
        )
        .await
        .unwrap();
        let candidate = loaded(|p| {
            let lane = p.lanes.get_mut("research").unwrap();
            lane.prohibited_flags.push("urgent".into());
        });
        let gateway = gateway.with_shadow(start(candidate, audit.clone()));
        assert_eq!(gateway.shadow_divergences(), 0);
        let run = gateway
            .create_run(
                &gateway.admin(Some("demo-admin")).unwrap(),
                crate::requests::parse(br#"{"scope": {"case_id": "C-1001"}}"#).unwrap(),
            )
            .await
            .unwrap();
        let token = Some("demo-research_agent");

        let urgent = json!({"case_id": "C-1001", "urgent": true});
        let response = gateway
            .handle(token, request(&run.run_id, "case_lookup", urgent))
            .await;
        assert_eq!(
            response.status,
            Status::Success,
            "the active policy decides"
        );
        let plain = json!({"case_id": "C-1001"});
        let same = gateway
            .handle(token, request(&run.run_id, "case_lookup", plain))
            .await;
        assert_eq!(same.status, Status::Success);
        // A wrong token is refused by both: no divergence.
        let bad = gateway
            .handle(
                Some("nope"),
                request(&run.run_id, "case_lookup", json!({"case_id": "C-1001"})),
            )
            .await;
        assert_eq!(bad.status, Status::Denied);
        gateway.flush_shadow().await;
        let shadow = gateway.shadow().unwrap();
        assert_eq!((shadow.decided(), gateway.shadow_divergences()), (3, 1));

        let events = audit
            .events(EventFilter {
                event_types: vec![EventType::ShadowDivergence],
                ..EventFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(events.len(), 1);
        let event = &events[0].value;
        assert_eq!(event["call_id"], json!(response.call_id));
        assert_eq!(event["details"]["active"]["decision"], "allow");
        assert_eq!(event["details"]["shadow"]["reason"], "prohibited_flag");
        assert_eq!(
            event["policy_versions"],
            json!(gateway.current().policy.versions)
        );
        audit.close().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_drops_and_counts_rather_than_delaying_a_call() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = AuditOptions::new(dir.path());
        options.durability = crate::audit::Durability::Normal;
        let audit = AuditLog::open(options).unwrap();
        let tools = repo().join("tools/tool_registry.yaml");
        let gateway = Gateway::start(
            loaded(|_| {}),
            audit.clone(),
            adapter_env(&tools, dir.path()),
            PolicySourcePaths {
                policy_dir: repo().join("policy"),
                tools_file: tools,
            },
        )
        .await
        .unwrap();
        // Every call diverges: the candidate has no research lane tools enabled.
        let candidate = loaded(|p| {
            for tool in p.tools.values_mut() {
                tool.enabled = false;
            }
        });
        // A queue of 4 calls, and 200 calls at once.
        let gateway = gateway.with_shadow(with_queue(candidate, audit.clone(), 4));
        let gateway = Arc::new(gateway);
        let run = gateway
            .create_run(
                &gateway.admin(Some("demo-admin")).unwrap(),
                crate::requests::parse(br#"{"scope": {"case_id": "C-1001"}}"#).unwrap(),
            )
            .await
            .unwrap();
        let calls = 200;
        let mut tasks = Vec::new();
        for _ in 0..calls {
            let (gateway, run_id) = (gateway.clone(), run.run_id.clone());
            tasks.push(tokio::spawn(async move {
                let mut req =
                    request(&run_id, "case_lookup", json!({"case_id": "C-1001"})).unwrap();
                req.dry_run = true;
                gateway.handle(Some("demo-research_agent"), Ok(req)).await
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap().status, Status::Success);
        }
        gateway.flush_shadow().await;
        let shadow = gateway.shadow().unwrap();
        // Every call is either shadowed (and diverged) or dropped and counted.
        assert_eq!(shadow.decided() + shadow.dropped(), calls as u64);
        assert_eq!(gateway.shadow_divergences(), shadow.decided());
        let recorded = audit
            .events(EventFilter {
                event_types: vec![EventType::ShadowDivergence],
                ..EventFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(recorded.len() as u64, shadow.decided());
        // The drops are summarized in the log at the flush.
        let summaries = audit
            .events(EventFilter {
                event_types: vec![EventType::ShadowDropped],
                ..EventFilter::default()
            })
            .await
            .unwrap();
        let summarized: u64 = summaries
            .iter()
            .map(|e| e.value["details"]["dropped"].as_u64().unwrap())
            .sum();
        assert_eq!(summarized, shadow.dropped());
        audit.close().await.unwrap();
    }
}
