//! `GET /metrics` on the real server: every family is present, and the counters and
//! histograms move by label when calls succeed, are denied and fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;

use common::{ADMIN, Server};
use serde_json::json;

/// Every family `/metrics` must expose (as its `# TYPE` line names it). Labelled
/// families appear with their first series; the others are there from the start.
const FAMILIES: &[(&str, &str)] = &[
    ("toolgate_calls", "counter"),
    ("toolgate_call_refusals", "counter"),
    ("toolgate_call_overhead_seconds", "histogram"),
    ("toolgate_tool_execution_seconds", "histogram"),
    ("toolgate_calls_in_flight", "gauge"),
    ("toolgate_audit_append_seconds", "histogram"),
    ("toolgate_audit_batch_events", "histogram"),
    ("toolgate_audit_batch_commit_seconds", "histogram"),
    ("toolgate_policy", "info"),
    ("toolgate_safety_lock_engaged", "gauge"),
];

/// A scrape: the content type and every sample, keyed by series name and its labels.
struct Scrape {
    text: String,
    samples: BTreeMap<(String, BTreeMap<String, String>), f64>,
}

impl Scrape {
    /// The value of the one series `name` whose labels include `labels` (0 if absent;
    /// panics if several match, so a test names a series exactly).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| *v)
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
        found.first().copied().unwrap_or(0.0)
    }

    /// The label sets of every series of `name`.
    fn series(&self, name: &str) -> Vec<BTreeMap<String, String>> {
        self.samples
            .keys()
            .filter(|(n, _)| n == name)
            .map(|(_, l)| l.clone())
            .collect()
    }
}

fn scrape(server: &Server) -> Scrape {
    let mut response = ureq::get(format!("{}/metrics", server.base))
        .call()
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = response.body_mut().read_to_string().unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let mut samples = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => (name.to_string(), parse_labels(rest.trim_end_matches('}'))),
        };
        samples.insert((name, labels), value.parse::<f64>().unwrap());
    }
    Scrape { text, samples }
}

/// `a="x",b="y"` (our label values hold no quotes or commas).
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap();
            (k.to_string(), v.trim_matches('"').to_string())
        })
        .collect()
}

const LABELLED: &[&str] = &[
    "toolgate_calls",
    "toolgate_call_refusals",
    "toolgate_tool_execution_seconds",
    "toolgate_audit_append_seconds",
];

fn assert_families(s: &Scrape, families: &[(&str, &str)]) {
    for (family, kind) in families {
        assert!(
            s.text.contains(&format!("# TYPE {family} {kind}\n")),
            "no {kind} family {family} in:\n{}",
            s.text
        );
    }
}

#[test]
fn unlabelled_families_are_present_before_any_call() {
    let server = Server::start();
    let s = scrape(&server);
    let unlabelled: Vec<(&str, &str)> = FAMILIES
        .iter()
        .filter(|(f, _)| !LABELLED.contains(f))
        .copied()
        .collect();
    assert_families(&s, &unlabelled);
    assert_eq!(s.value("toolgate_calls_in_flight", &[]), 0.0);
    assert_eq!(s.value("toolgate_safety_lock_engaged", &[]), 0.0);
    // The info series carries the versions GET /v1/policy reports.
    let (_, policy) = server.get("/v1/policy", Some(ADMIN));
    let versions = &policy["policy_versions"];
    let labels = [
        ("roles", versions["roles"]["version"].as_str().unwrap()),
        ("lanes", versions["lanes"]["version"].as_str().unwrap()),
        (
            "registry",
            versions["registry"]["version"].as_str().unwrap(),
        ),
        (
            "registry_sha256",
            versions["registry"]["sha256"].as_str().unwrap(),
        ),
    ];
    assert_eq!(s.value("toolgate_policy_info", &labels), 1.0, "{}", s.text);
}

#[test]
fn calls_move_their_series_by_label() {
    let server = Server::start();
    // The writer reports a batch after its appender is answered: wait (bounded) until
    // the startup `policy_loaded` batch is counted, so it is not counted as ours.
    let before = common::poll_for(std::time::Duration::from_secs(30), || {
        let scraped = scrape(&server);
        (scraped.value("toolgate_audit_batch_events_sum", &[]) >= 1.0).then_some(scraped)
    })
    .expect("the startup batch was never observed");
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let scope = json!({"case_id": "C-1001"});

    // Two successes.
    for query in ["duty", "notice"] {
        let (code, body) = server.call(
            "research_agent",
            &run,
            "research",
            "legal_search",
            json!({"query": query}),
            scope.clone(),
        );
        assert_eq!(code, 200, "{body}");
    }
    // A denial at step 6: the tool exists but the lane does not permit it.
    let (code, body) = server.call(
        "research_agent",
        &run,
        "research",
        "draft_document",
        json!({"title": "t", "body": "b"}),
        scope.clone(),
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["diagnostic"]["reason"], "tool_not_allowed_in_lane");
    // A denial at step 5 for a made-up tool: it must not become a label.
    let (code, body) = server.call(
        "research_agent",
        &run,
        "research",
        "made_up_tool_x",
        json!({}),
        scope.clone(),
    );
    assert_eq!(code, 403, "{body}");
    // A failure at step 10: the tool runs and reports an error (no such case).
    let other = server.create_run(json!({"case_id": "C-9999"}));
    let (code, body) = server.call(
        "research_agent",
        &other,
        "research",
        "case_lookup",
        json!({}),
        json!({"case_id": "C-9999"}),
    );
    assert_eq!(body["status"], "failed", "{body}");
    let failed_code = body["error_code"].as_str().unwrap().to_string();
    let failed_reason = body["diagnostic"]["reason"].as_str().unwrap().to_string();
    assert!(code >= 500, "{body}");

    let after = scrape(&server);
    assert_families(&after, FAMILIES);
    let moved = |name: &str, labels: &[(&str, &str)]| {
        after.value(name, labels) - before.value(name, labels)
    };
    let success = [
        ("tool", "legal_search"),
        ("lane", "research"),
        ("status", "success"),
        ("error_code", "-"),
    ];
    assert_eq!(
        moved("toolgate_calls_total", &success),
        2.0,
        "{}",
        after.text
    );
    let denied = [
        ("tool", "draft_document"),
        ("lane", "research"),
        ("status", "denied"),
        ("error_code", "TOOL_DENIED"),
    ];
    assert_eq!(
        moved("toolgate_calls_total", &denied),
        1.0,
        "{}",
        after.text
    );
    let unregistered = [("tool", "-"), ("lane", "research"), ("status", "denied")];
    assert_eq!(moved("toolgate_calls_total", &unregistered), 1.0);
    let failed = [
        ("tool", "case_lookup"),
        ("lane", "research"),
        ("status", "failed"),
        ("error_code", failed_code.as_str()),
    ];
    assert_eq!(
        moved("toolgate_calls_total", &failed),
        1.0,
        "{}",
        after.text
    );
    assert!(
        !after.text.contains("made_up_tool_x"),
        "a caller's made-up name became a label"
    );

    // Refusals by reason and step.
    let refusal = |reason: &str, step: &str| {
        moved(
            "toolgate_call_refusals_total",
            &[("reason", reason), ("step", step)],
        )
    };
    assert_eq!(refusal("tool_not_allowed_in_lane", "6"), 1.0);
    assert_eq!(refusal("tool_unregistered", "5"), 1.0);
    assert_eq!(refusal(&failed_reason, "10"), 1.0, "{}", after.text);

    // Histograms: overhead for every call; tool execution for the executed ones.
    assert_eq!(moved("toolgate_call_overhead_seconds_count", &[]), 5.0);
    assert!(moved("toolgate_call_overhead_seconds_sum", &[]) > 0.0);
    let exec = |tool: &str| moved("toolgate_tool_execution_seconds_count", &[("tool", tool)]);
    assert_eq!(exec("legal_search"), 2.0);
    assert_eq!(exec("case_lookup"), 1.0);
    assert_eq!(exec("draft_document"), 0.0);
    // Audit appends: a request event for the three executed calls, a closing event each.
    let append = |event: &str| moved("toolgate_audit_append_seconds_count", &[("event", event)]);
    assert_eq!(append("requested"), 3.0);
    assert_eq!(append("closing"), 5.0);
    assert_eq!(after.value("toolgate_calls_in_flight", &[]), 0.0);
    // The audit writer reported its group commits: at least one batch, and no more
    // batches than events (8 call events, 2 run events).
    let batches = moved("toolgate_audit_batch_events_count", &[]);
    let events = moved("toolgate_audit_batch_events_sum", &[]);
    assert!(batches >= 1.0 && batches <= events, "{batches} {events}");
    assert_eq!(events, 10.0, "{}", after.text);
    assert_eq!(
        moved("toolgate_audit_batch_commit_seconds_count", &[]),
        batches
    );
    assert!(
        !after.text.contains("shadow"),
        "no shadow mode, no shadow family"
    );
    for labels in after.series("toolgate_calls_total") {
        assert!(labels.contains_key("tool") && labels.contains_key("error_code"));
    }
}

#[test]
fn the_safety_lock_gauge_follows_the_lock() {
    let server = Server::start();
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, _) = server.post(
        "/v1/safety-lock",
        Some(ADMIN),
        &json!({"engaged": true, "reason": "drill"}),
    );
    assert_eq!(code, 200);
    let s = scrape(&server);
    assert_eq!(s.value("toolgate_safety_lock_engaged", &[]), 1.0);
    let (code, body) = server.call(
        "research_agent",
        &run,
        "research",
        "legal_search",
        json!({"query": "duty"}),
        json!({"case_id": "C-1001"}),
    );
    assert_eq!(code, 403, "{body}");
    let s = scrape(&server);
    assert_eq!(
        s.value(
            "toolgate_call_refusals_total",
            &[("reason", "safety_lock_engaged"), ("step", "1")]
        ),
        1.0,
        "{}",
        s.text
    );
    let (code, _) = server.post("/v1/safety-lock", Some(ADMIN), &json!({"engaged": false}));
    assert_eq!(code, 200);
    assert_eq!(
        scrape(&server).value("toolgate_safety_lock_engaged", &[]),
        0.0
    );
}

#[test]
fn shadow_mode_exposes_its_divergence_counter() {
    let server = Server::start_with(common::Start {
        args: vec![
            "--shadow-policy-dir".into(),
            common::repo().join("policy").display().to_string(),
        ],
        ..common::Start::default()
    });
    let s = scrape(&server);
    assert!(
        s.text
            .contains("# TYPE toolgate_shadow_divergences counter\n"),
        "{}",
        s.text
    );
    assert_eq!(s.value("toolgate_shadow_divergences_total", &[]), 0.0);
}
