//! Prometheus metrics of the gateway, rendered by `GET /metrics` in the OpenMetrics
//! text format (what Prometheus scrapes) with the official `prometheus-client` crate.
//!
//! Families (all prefixed `toolgate_`):
//! - `calls_total{tool, lane, status, error_code}`: every tool call, by outcome.
//! - `call_refusals_total{reason, step}`: refused or failed calls, by catalog reason.
//! - `call_overhead_seconds`: what the gateway adds to a call (its total time minus the
//!   tool's execution time).
//! - `tool_execution_seconds{tool}`: the adapter's execution time of executed calls.
//! - `calls_in_flight`: calls between receipt and response.
//! - `audit_append_seconds{event}`: how long a call waited for its audit event to be
//!   durable (`requested`: step 9; `closing`: step 12).
//! - `audit_batch_events`, `audit_batch_commit_seconds`: the audit writer's group
//!   commits, as the audit log reports them.
//! - `policy_info{roles, lanes, registry, ...}` and `safety_lock_engaged`: state read
//!   at scrape time.
//! - `approval_store_mismatches_total{field}`: approvals whose store disagreed with the
//!   audit log (`approval_store_mismatch`), by the first field that differed (a fixed
//!   set: `approvals::evidence::FIELDS`).
//! - `ship_delivered_total{sink}`, `ship_failures_total{sink}`, `ship_lag_events{sink}`,
//!   `ship_skipped_events_total{sink}`,
//!   `ship_lag_seconds{sink}`: `serve --ship` sinks (the sink label is the spec the
//!   operator gave, so the set is bounded by the command line).
//!
//! INVARIANT: every label value comes from a bounded set: tool and lane labels carry
//! only names the loaded policy validated (anything else is `-`), status and
//! error_code come from the contract's enums, reason and step from the diagnostic
//! catalog. A caller cannot create series by sending made-up names.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::policy::PolicyVersions;

/// The label value used when a call did not get far enough to have a validated value.
pub const UNSET: &str = "-";

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    lane: String,
    status: &'static str,
    error_code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: &'static str,
    step: u8,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SinkLabels {
    sink: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MismatchLabels {
    field: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppendLabels {
    event: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    roles: String,
    lanes: String,
    registry: String,
    roles_sha256: String,
    lanes_sha256: String,
    registry_sha256: String,
}

/// Which audit event a call waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendKind {
    /// `tool_requested`, before the tool runs (step 9).
    Requested,
    /// The closing event (step 12).
    Closing,
}

impl AppendKind {
    fn as_str(self) -> &'static str {
        match self {
            AppendKind::Requested => "requested",
            AppendKind::Closing => "closing",
        }
    }
}

/// One finished call, as the metrics see it.
#[derive(Debug, Clone, Copy)]
pub struct CallRecord<'a> {
    /// The tool's name once step 5 validated it, else None.
    pub tool: Option<&'a str>,
    /// The lane once step 4 validated it, else None.
    pub lane: Option<&'a str>,
    pub status: &'static str,
    pub error_code: Option<&'static str>,
    /// The refusal's catalog reason and step, if the call did not succeed.
    pub refusal: Option<(&'static str, u8)>,
    /// From receipt to response.
    pub total: Duration,
    /// The adapter's execution, if the tool was started.
    pub tool_time: Option<Duration>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    kind: &'static str,
}

/// State that is read when `/metrics` is scraped rather than kept up to date.
#[derive(Debug, Clone, Copy)]
pub struct ScrapeState<'a> {
    pub policy: &'a PolicyVersions,
    pub safety_lock_engaged: bool,
    /// Calls whose shadow decision differed from the live one, if the gateway counts them.
    pub shadow_divergences: Option<u64>,
    /// The audit log's size and headroom, when `--max-audit-bytes` or
    /// `--min-free-disk-bytes` bounds it.
    pub audit_capacity: Option<AuditCapacityState>,
    /// Shadow calls dropped because the shadow queue was full, if shadow mode is on.
    pub shadow_dropped: Option<u64>,
    /// Connections served in full and overflow connections open now.
    pub connections: Option<(usize, usize)>,
    /// The audit WAL's restarts and truncations (`AuditLog::wal_counters`).
    pub audit_wal: Option<(u64, u64)>,
}

/// What `/metrics` shows of the audit log's capacity.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuditCapacityState {
    pub used_bytes: u64,
    pub headroom_bytes: u64,
    pub max_bytes: Option<u64>,
    pub free_disk_bytes: Option<u64>,
}

/// The gateway's metrics. Updating one costs a few atomic operations and, for the
/// labelled families, one short read-locked map lookup.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    refusals: Family<RefusalLabels, Counter>,
    overhead: Histogram,
    tool_execution: Family<ToolLabels, Histogram>,
    in_flight: Gauge,
    unrecorded: Counter,
    audit_append: Family<AppendLabels, Histogram>,
    audit_batch_events: Histogram,
    audit_batch_commit: Histogram,
    approval_store_mismatches: Family<MismatchLabels, Counter>,
    /// Serializes scrapes (each builds its scrape-time families afresh).
    scrape: Mutex<()>,
    /// The witnesses' and the hub shipper's progress, read at scrape time.
    audit_remote: std::sync::RwLock<AuditRemote>,
    ship: ShipFamilies,
}

/// The `serve --ship` families.
#[derive(Debug, Default)]
struct ShipFamilies {
    delivered: Family<SinkLabels, Counter>,
    failures: Family<SinkLabels, Counter>,
    lag_events: Family<SinkLabels, Gauge>,
    lag_seconds: Family<SinkLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    skipped: Family<SinkLabels, Counter>,
}

/// What is read at scrape time of the audit log's copies elsewhere: the witnesses'
/// cosignatures (`serve --witness`) and the shipping to the hub (`--cluster-db`).
#[derive(Debug, Default, Clone)]
pub struct AuditRemote {
    pub witnesses: Vec<std::sync::Arc<crate::audit::witness::WitnessStatus>>,
    pub ship: Option<std::sync::Arc<crate::hub::ship::ShipStatus>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WitnessLabels {
    witness: String,
}

/// Latency buckets from 25 us to about 13 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_025, 2.0, 20))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("toolgate");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "calls",
            "Tool calls by validated tool, lane, status and error code",
            calls.clone(),
        );
        let refusals = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "call_refusals",
            "Calls that did not succeed, by diagnostic reason and failed step",
            refusals.clone(),
        );
        let overhead = latency_histogram();
        registry.register_with_unit(
            "call_overhead",
            "Time the gateway adds to a call: total time minus tool execution",
            Unit::Seconds,
            overhead.clone(),
        );
        let tool_execution =
            Family::<ToolLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        registry.register_with_unit(
            "tool_execution",
            "Adapter execution time of calls whose tool was started",
            Unit::Seconds,
            tool_execution.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "calls_in_flight",
            "Tool calls received and not yet answered",
            in_flight.clone(),
        );
        let unrecorded = Counter::default();
        registry.register(
            "calls_unrecorded",
            "Calls refused in front of the pipeline, unrecorded, because the audit log was at the admin half of its reserve",
            unrecorded.clone(),
        );
        let audit_append =
            Family::<AppendLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        registry.register_with_unit(
            "audit_append",
            "Time a call waited for its audit event to be durable",
            Unit::Seconds,
            audit_append.clone(),
        );
        let audit_batch_events = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register(
            "audit_batch_events",
            "Events committed together in one audit transaction (group commit)",
            audit_batch_events.clone(),
        );
        let audit_batch_commit = latency_histogram();
        registry.register_with_unit(
            "audit_batch_commit",
            "Time to write and commit one audit batch",
            Unit::Seconds,
            audit_batch_commit.clone(),
        );
        let approval_store_mismatches = Family::<MismatchLabels, Counter>::default();
        registry.register(
            "approval_store_mismatches",
            "Approvals refused because the approval store disagreed with the audit log, by the field that differed",
            approval_store_mismatches.clone(),
        );
        let ship = ShipFamilies::default();
        registry.register(
            "ship_delivered",
            "Audit events delivered to a --ship sink",
            ship.delivered.clone(),
        );
        registry.register(
            "ship_failures",
            "Failed deliveries to a --ship sink (each retried with backoff)",
            ship.failures.clone(),
        );
        registry.register(
            "ship_lag_events",
            "Committed audit events a --ship sink has not confirmed yet",
            ship.lag_events.clone(),
        );
        registry.register_with_unit(
            "ship_lag",
            "Age of the oldest audit event a --ship sink has not confirmed (0 when caught up)",
            Unit::Seconds,
            ship.lag_seconds.clone(),
        );
        registry.register(
            "ship_skipped_events",
            "Audit events a --ship sink never received because they left the data directory first (archived)",
            ship.skipped.clone(),
        );
        Metrics {
            ship,
            registry,
            calls,
            refusals,
            overhead,
            tool_execution,
            in_flight,
            unrecorded,
            audit_append,
            audit_batch_events,
            audit_batch_commit,
            approval_store_mismatches,
            scrape: Mutex::new(()),
            audit_remote: std::sync::RwLock::new(AuditRemote::default()),
        }
    }

    /// Shows the shipping to the audit hub from now on (`serve --cluster-db`).
    pub fn watch_shipper(&self, ship: std::sync::Arc<crate::hub::ship::ShipStatus>) {
        self.audit_remote
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .ship = Some(ship);
    }

    /// Shows the witnesses' progress from now on (`serve --witness`).
    pub fn watch_witnesses(
        &self,
        witnesses: Vec<std::sync::Arc<crate::audit::witness::WitnessStatus>>,
    ) {
        self.audit_remote
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .witnesses = witnesses;
    }

    /// The metric handles of one `--ship` sink.
    pub fn ship_sink(&self, sink: &str) -> crate::audit::ship::ShipMetrics {
        let labels = SinkLabels {
            sink: sink.to_string(),
        };
        crate::audit::ship::ShipMetrics {
            delivered: self.ship.delivered.get_or_create(&labels).clone(),
            failures: self.ship.failures.get_or_create(&labels).clone(),
            lag_events: self.ship.lag_events.get_or_create(&labels).clone(),
            lag_seconds: self.ship.lag_seconds.get_or_create(&labels).clone(),
            skipped: self.ship.skipped.get_or_create(&labels).clone(),
        }
    }

    /// Counts an approval refused with `approval_store_mismatch`, by the field of the
    /// store that disagreed with the audit log (one of a fixed set).
    pub fn count_approval_store_mismatch(&self, field: &'static str) {
        self.approval_store_mismatches
            .get_or_create(&MismatchLabels { field })
            .inc();
    }

    /// Counts a call refused unrecorded (the audit log at the admin half of its
    /// reserve; see `capacity::RECORDED_REFUSALS_FLOOR`).
    pub fn count_unrecorded(&self) {
        self.unrecorded.inc();
    }

    /// Counts a call in flight until the returned guard is dropped.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight(&self.in_flight)
    }

    /// Records one finished call.
    pub fn record_call(&self, call: &CallRecord<'_>) {
        let labels = CallLabels {
            tool: call.tool.unwrap_or(UNSET).to_string(),
            lane: call.lane.unwrap_or(UNSET).to_string(),
            status: call.status,
            error_code: call.error_code.unwrap_or(UNSET),
        };
        self.calls.get_or_create(&labels).inc();
        if let Some((reason, step)) = call.refusal {
            self.refusals
                .get_or_create(&RefusalLabels { reason, step })
                .inc();
        }
        let tool_time = call.tool_time.unwrap_or_default();
        self.overhead
            .observe(call.total.saturating_sub(tool_time).as_secs_f64());
        if let (Some(time), Some(tool)) = (call.tool_time, call.tool) {
            self.tool_execution
                .get_or_create(&ToolLabels {
                    tool: tool.to_string(),
                })
                .observe(time.as_secs_f64());
        }
    }

    /// Records how long a call waited for one of its audit events.
    pub fn record_audit_append(&self, kind: AppendKind, waited: Duration) {
        self.audit_append
            .get_or_create(&AppendLabels {
                event: kind.as_str(),
            })
            .observe(waited.as_secs_f64());
    }

    /// Records one group commit of the audit writer.
    pub fn record_audit_batch(&self, events: usize, commit: Duration) {
        self.audit_batch_events.observe(events as f64);
        self.audit_batch_commit.observe(commit.as_secs_f64());
    }

    /// A recorder of group commits for the audit writer thread (it shares the
    /// histograms with these metrics).
    pub fn audit_batch_observer(&self) -> crate::audit::BatchObserver {
        let (events, commit) = (
            self.audit_batch_events.clone(),
            self.audit_batch_commit.clone(),
        );
        std::sync::Arc::new(move |count: usize, took: Duration| {
            events.observe(count as f64);
            commit.observe(took.as_secs_f64());
        })
    }

    /// The OpenMetrics text of every family, with the scrape-time state.
    pub fn render(&self, state: ScrapeState<'_>) -> String {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        let mut scraped = Registry::with_prefix("toolgate");
        let v = state.policy;
        scraped.register(
            "policy",
            "Versions and sha256 of the loaded policy files",
            Info::new(PolicyLabels {
                roles: v.roles.version.clone(),
                lanes: v.lanes.version.clone(),
                registry: v.registry.version.clone(),
                roles_sha256: v.roles.sha256.clone(),
                lanes_sha256: v.lanes.sha256.clone(),
                registry_sha256: v.registry.sha256.clone(),
            }),
        );
        let lock = Gauge::<i64>::default();
        lock.set(i64::from(state.safety_lock_engaged));
        scraped.register(
            "safety_lock_engaged",
            "1 while the safety lock is engaged (no tool call runs), else 0",
            lock,
        );
        if let Some(divergences) = state.shadow_divergences {
            let counter = Counter::<u64>::default();
            counter.inc_by(divergences);
            scraped.register(
                "shadow_divergences",
                "Calls whose shadow policy decision differed from the live decision",
                counter,
            );
        }
        if let Some(dropped) = state.shadow_dropped {
            let counter = Counter::<u64>::default();
            counter.inc_by(dropped);
            scraped.register(
                "shadow_dropped",
                "Calls not shadowed because the shadow queue was full (never delaying a live call)",
                counter,
            );
        }
        if let Some(c) = state.audit_capacity {
            let gauge = |value: u64| {
                let g = Gauge::<i64>::default();
                g.set(i64::try_from(value).unwrap_or(i64::MAX));
                g
            };
            scraped.register(
                "audit_bytes",
                "Bytes of the audit database and its WAL",
                gauge(c.used_bytes),
            );
            scraped.register(
                "audit_headroom_bytes",
                "Bytes the audit log may still grow by before --max-audit-bytes or --min-free-disk-bytes is reached; new calls are refused under 4 MiB",
                gauge(c.headroom_bytes),
            );
            if let Some(max) = c.max_bytes {
                scraped.register("audit_max_bytes", "The --max-audit-bytes cap", gauge(max));
            }
            if let Some(free) = c.free_disk_bytes {
                scraped.register(
                    "disk_free_bytes",
                    "Free bytes on the disk holding the audit database",
                    gauge(free),
                );
            }
        }
        if let Some((restarts, truncations)) = state.audit_wal {
            let counter = |value: u64| {
                let c = Counter::<u64>::default();
                c.inc_by(value);
                c
            };
            scraped.register(
                "audit_wal_restarts",
                "Times the audit writer copied the rest of the WAL between two commits so that the WAL started over (keeps it bounded under load)",
                counter(restarts),
            );
            scraped.register(
                "audit_wal_truncations",
                "Times the WAL thread had to truncate the audit WAL, holding the write lock (a reader kept it from starting over)",
                counter(truncations),
            );
        }
        if let Some((full, overflow)) = state.connections {
            let family = Family::<ConnectionLabels, Gauge<i64>>::default();
            family
                .get_or_create(&ConnectionLabels { kind: "served" })
                .set(full as i64);
            family
                .get_or_create(&ConnectionLabels { kind: "overflow" })
                .set(overflow as i64);
            scraped.register(
                "connections",
                "Open connections: served in full, or over a connection cap (health only, 429 otherwise)",
                family,
            );
        }
        let remote = self
            .audit_remote
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        register_witnesses(&mut scraped, &remote.witnesses);
        if let Some(ship) = &remote.ship {
            register_ship(&mut scraped, ship);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &scraped);
        let _ = encode_eof(&mut out);
        out
    }
}

/// The witness families: per witness (names come from the validated `--witness`
/// flags, so the label values are bounded), the newest checkpoint size offered, the
/// newest it cosigned, their difference in events, and the failed and conflicting
/// submissions.
fn register_witnesses(
    registry: &mut Registry,
    witnesses: &[std::sync::Arc<crate::audit::witness::WitnessStatus>],
) {
    use std::sync::atomic::Ordering;
    if witnesses.is_empty() {
        return;
    }
    let cosigned = Family::<WitnessLabels, Gauge<i64>>::default();
    let offered = Family::<WitnessLabels, Gauge<i64>>::default();
    let lag = Family::<WitnessLabels, Gauge<i64>>::default();
    let failures = Family::<WitnessLabels, Counter<u64>>::default();
    let conflicts = Family::<WitnessLabels, Counter<u64>>::default();
    for w in witnesses {
        let labels = WitnessLabels {
            witness: w.name.clone(),
        };
        let done = w.cosigned_size.load(Ordering::Relaxed);
        let newest = w.checkpoint_size.load(Ordering::Relaxed);
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        cosigned.get_or_create(&labels).set(as_i64(done));
        offered.get_or_create(&labels).set(as_i64(newest));
        lag.get_or_create(&labels)
            .set(as_i64(newest.saturating_sub(done)));
        failures
            .get_or_create(&labels)
            .inc_by(w.failures.load(Ordering::Relaxed));
        conflicts
            .get_or_create(&labels)
            .inc_by(w.conflicts.load(Ordering::Relaxed));
    }
    registry.register(
        "witness_cosigned_size",
        "The largest audit checkpoint size this witness cosigned",
        cosigned,
    );
    registry.register(
        "witness_checkpoint_size",
        "The newest audit checkpoint size offered to this witness",
        offered,
    );
    registry.register(
        "witness_lag_events",
        "Events under the newest checkpoint that this witness has not cosigned yet (the cosignature gap)",
        lag,
    );
    registry.register(
        "witness_failures",
        "Submissions to this witness that failed (unreachable, refused, a bad answer)",
        failures,
    );
    registry.register(
        "witness_conflicts",
        "Submissions this witness refused as conflicting with what it cosigned (409)",
        conflicts,
    );
}

/// The hub shipping families.
fn register_ship(registry: &mut Registry, ship: &crate::hub::ship::ShipStatus) {
    use std::sync::atomic::Ordering;
    let gauge = |value: u64| {
        let g = Gauge::<i64>::default();
        g.set(i64::try_from(value).unwrap_or(i64::MAX));
        g
    };
    let counter = |value: u64| {
        let c = Counter::<u64>::default();
        c.inc_by(value);
        c
    };
    registry.register(
        "hub_shipped_seq",
        "The newest seq of this sidecar's audit log the hub holds",
        gauge(ship.shipped_seq.load(Ordering::Relaxed)),
    );
    registry.register(
        "hub_ship_lag_events",
        "Events committed locally and not yet in the hub (the ship lag)",
        gauge(ship.lag()),
    );
    registry.register(
        "hub_ship_failures",
        "Shipping rounds that could not reach the hub (retried)",
        counter(ship.failures.load(Ordering::Relaxed)),
    );
    registry.register(
        "hub_ship_refusals",
        "Batches the hub refused (a fork, a forged line, another sidecar's origin)",
        counter(ship.refusals.load(Ordering::Relaxed)),
    );
}

/// A call in flight; decrements the gauge when dropped (also on early returns).
#[derive(Debug)]
pub struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::policy::{FileVersion, PolicyVersions};

    fn versions() -> PolicyVersions {
        let file = |v: &str| FileVersion {
            version: v.to_string(),
            sha256: "ab".repeat(32),
        };
        PolicyVersions {
            roles: file("1.0.0"),
            lanes: file("1.1.0"),
            registry: file("2.0.0"),
        }
    }

    fn render(m: &Metrics) -> String {
        m.render(ScrapeState {
            policy: &versions(),
            safety_lock_engaged: true,
            shadow_divergences: None,
            audit_capacity: None,
            shadow_dropped: None,
            connections: None,
            audit_wal: Some((3, 0)),
        })
    }

    #[test]
    fn a_call_moves_its_series() {
        let m = Metrics::new();
        m.record_call(&CallRecord {
            tool: Some("echo"),
            lane: None,
            status: "denied",
            error_code: Some("TOOL_DENIED"),
            refusal: Some(("lane_unknown", 4)),
            total: Duration::from_micros(300),
            tool_time: None,
        });
        let text = render(&m);
        assert!(text.contains(
            r#"toolgate_calls_total{tool="echo",lane="-",status="denied",error_code="TOOL_DENIED"} 1"#
        ), "{text}");
        assert!(text.contains(r#"toolgate_call_refusals_total{reason="lane_unknown",step="4"} 1"#));
        assert!(text.contains("toolgate_call_overhead_seconds_count 1"));
        assert!(text.contains("toolgate_safety_lock_engaged 1"));
        assert!(text.contains("toolgate_audit_wal_restarts_total 3"));
        assert!(text.contains("toolgate_audit_wal_truncations_total 0"));
        assert!(
            text.contains(r#"toolgate_policy_info{roles="1.0.0",lanes="1.1.0",registry="2.0.0""#)
        );
        assert!(!text.contains("shadow"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn overhead_excludes_tool_time() {
        let m = Metrics::new();
        m.record_call(&CallRecord {
            tool: Some("echo"),
            lane: Some("research"),
            status: "success",
            error_code: None,
            refusal: None,
            total: Duration::from_millis(10),
            tool_time: Some(Duration::from_millis(9)),
        });
        let text = render(&m);
        assert!(
            text.contains("toolgate_call_overhead_seconds_sum 0.001"),
            "{text}"
        );
        assert!(text.contains(r#"toolgate_tool_execution_seconds_count{tool="echo"} 1"#));
    }

    #[test]
    fn in_flight_guard_decrements() {
        let m = Metrics::new();
        let a = m.in_flight();
        let b = m.in_flight();
        assert!(render(&m).contains("toolgate_calls_in_flight 2"));
        drop(a);
        drop(b);
        assert!(render(&m).contains("toolgate_calls_in_flight 0"));
    }
}
