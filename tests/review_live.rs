//! Policy review against a running gateway (the real binary on 127.0.0.1:0 with a
//! temporary data directory): shadow mode, reloads under load, SIGHUP, and
//! `audit replay` of recorded traffic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{ADMIN, Server, Start, repo};

/// A generous bound that only proves "no hang".
const NO_HANG: Duration = Duration::from_secs(60);

/// A copy of the demo policy directory (roles.yaml, lanes.yaml) in `dir`.
fn policy_copy(dir: &Path) -> PathBuf {
    let policy = dir.join("policy");
    fs::create_dir_all(&policy).unwrap();
    for file in ["roles.yaml", "lanes.yaml"] {
        fs::copy(repo().join("policy").join(file), policy.join(file)).unwrap();
    }
    policy
}

/// Replaces `from` by `to` in `file` (which must contain it exactly once).
fn edit(file: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(file).unwrap();
    assert_eq!(
        text.matches(from).count(),
        1,
        "`{from}` in {}",
        file.display()
    );
    fs::write(file, text.replace(from, to)).unwrap();
}

/// Writes `bytes` to `path` atomically (a temporary file renamed over it).
fn replace_file(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// Audit events of one type, read through the admin API.
fn events(server: &Server, event_type: &str) -> Vec<Value> {
    let (status, body) = server.get(
        &format!("/v1/audit/events?type={event_type}&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(status, 200, "{body}");
    body["events"].as_array().unwrap().clone()
}

/// Polls until at least `n` events of `event_type` are visible (recording may follow
/// the response), within the no-hang bound.
fn wait_for_events(server: &Server, event_type: &str, n: usize) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let found = events(server, event_type);
        if found.len() >= n || started.elapsed() > NO_HANG {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn shadow_divergences_are_recorded_but_never_enforced() {
    let tmp = tempfile::tempdir().unwrap();
    let candidate = policy_copy(tmp.path());
    // The candidate also prohibits `urgent` in research; the active policy does not.
    edit(
        &candidate.join("lanes.yaml"),
        "prohibited_flags: [privileged, sealed]",
        "prohibited_flags: [privileged, sealed, urgent]",
    );
    let server = Server::start_with(Start {
        args: vec![
            "--shadow-policy-dir".into(),
            candidate.display().to_string(),
        ],
        ..Start::default()
    });
    let run = server.create_run(json!({ "case_id": "C-1001" }));
    let call = |tool: &str, arguments: Value, scope: Value| {
        server.call("research_agent", &run, "research", tool, arguments, scope)
    };

    // Allowed by the active policy, denied by the candidate: served, and diverges.
    let (status, urgent) = call(
        "case_lookup",
        json!({}),
        json!({ "case_id": "C-1001", "urgent": true }),
    );
    assert_eq!(
        (status, urgent["status"].as_str()),
        (200, Some("success")),
        "{urgent}"
    );
    assert_eq!(urgent["output"]["case_id"], "C-1001");
    // The same decision under both: no divergence.
    let (status, plain) = call("case_lookup", json!({}), json!({ "case_id": "C-1001" }));
    assert_eq!(status, 200, "{plain}");
    let (status, privileged) = call(
        "read_document",
        json!({ "path": "privileged/strategy.md" }),
        json!({ "case_id": "C-1001" }),
    );
    assert_eq!(status, 403, "{privileged}");
    assert_eq!(privileged["diagnostic"]["reason"], "prohibited_flag");
    // A dry run is decided by both as well.
    let (status, dry) = server.post(
        "/v1/tool-calls",
        Some("demo-research_agent"),
        &json!({
            "role_id": "research_agent", "run_id": run, "lane_id": "research",
            "tool_name": "legal_search", "arguments": {"query": "duty"},
            "scope": {"case_id": "C-1001", "urgent": true}, "dry_run": true,
        }),
    );
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["dry_run"]["decision"], "allow");

    let found = wait_for_events(&server, "shadow_divergence", 2);
    assert_eq!(found.len(), 2, "{found:#?}");
    for event in &found {
        let details = &event["details"];
        assert_eq!(details["active"]["decision"], "allow", "{event}");
        assert_eq!(details["shadow"]["decision"], "deny", "{event}");
        assert_eq!(details["shadow"]["reason"], "prohibited_flag", "{event}");
        assert_eq!(details["shadow"]["step"], 8, "{event}");
        assert!(
            details["shadow"]["message"]
                .as_str()
                .unwrap()
                .contains("`urgent`"),
            "{event}"
        );
        assert_ne!(
            details["shadow_policy_versions"]["lanes"]["sha256"],
            Value::Null
        );
    }
    assert_eq!(
        found[0]["details"]["shadow_trace"]["failed"],
        "8:prohibited_flag"
    );
    assert_eq!(found[1]["details"]["dry_run"], true);
    // Nothing else diverged (the recording is in call order).
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(events(&server, "shadow_divergence").len(), 2);
}

#[test]
fn a_shadow_policy_that_does_not_load_stops_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let candidate = policy_copy(tmp.path());
    fs::write(candidate.join("roles.yaml"), "version: [\n").unwrap();
    let (code, _, err) = common::run(
        tmp.path(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--policy-dir",
            repo().join("policy").to_str().unwrap(),
            "--tools",
            repo().join("tools/tool_registry.yaml").to_str().unwrap(),
            "--data-dir",
            tmp.path().join("var").to_str().unwrap(),
            "--shadow-policy-dir",
            candidate.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("the shadow policy did not load"), "{err}");
}

/// Issue 5, done when: while clients call continuously, 50 reloads alternating a valid
/// and an invalid policy give no failed or mixed-policy response, and each valid
/// reload is audited.
#[test]
fn fifty_reloads_under_load_never_fail_a_call() {
    let tmp = tempfile::tempdir().unwrap();
    let policy = policy_copy(tmp.path());
    let roles = policy.join("roles.yaml");
    let valid = fs::read(&roles).unwrap();
    // Invalid in a way only validation sees: a role names a lane that does not exist.
    let invalid = String::from_utf8(valid.clone())
        .unwrap()
        .replace("lanes: [intake]\n", "lanes: [intake, no_such_lane]\n")
        .into_bytes();
    assert_ne!(valid, invalid);
    let server = Arc::new(Server::start_with(Start {
        policy_dir: policy.clone(),
        ..Start::default()
    }));
    let run = server.create_run(json!({ "case_id": "C-1001" }));
    let versions = server.get("/v1/policy", Some(ADMIN)).1["policy_versions"].clone();

    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (server, run, stop, calls) =
                (server.clone(), run.clone(), stop.clone(), calls.clone());
            std::thread::spawn(move || {
                let mut bad = Vec::new();
                let started = Instant::now();
                let mut n = 0;
                // Bounded by count and time as well as by the stop flag.
                while !stop.load(Ordering::Relaxed) && n < 20_000 && started.elapsed() < NO_HANG {
                    let (status, body) = if i % 2 == 0 {
                        server.call(
                            "research_agent",
                            &run,
                            "research",
                            "legal_search",
                            json!({ "query": "duty", "limit": 1 }),
                            json!({ "case_id": "C-1001" }),
                        )
                    } else {
                        server.call(
                            "supervisor",
                            &run,
                            "research",
                            "case_lookup",
                            json!({}),
                            json!({ "case_id": "C-1001" }),
                        )
                    };
                    if status != 200 || body["status"] != "success" {
                        bad.push(body);
                    }
                    n += 1;
                    calls.fetch_add(1, Ordering::Relaxed);
                }
                bad
            })
        })
        .collect();

    // Let the clients get going before the first reload.
    let started = Instant::now();
    while calls.load(Ordering::Relaxed) < 20 && started.elapsed() < NO_HANG {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut valid_reloads = 0;
    for i in 0..50 {
        let before = calls.load(Ordering::Relaxed);
        if i % 2 == 0 {
            replace_file(&roles, &valid);
            let (status, body) = server.post("/v1/policy/reload", Some(ADMIN), &json!({}));
            assert_eq!(status, 200, "reload {i}: {body}");
            assert_eq!(body["reloaded"], true);
            assert_eq!(
                body["policy_versions"], versions,
                "the same bytes, the same versions"
            );
            valid_reloads += 1;
        } else {
            replace_file(&roles, &invalid);
            let (status, body) = server.post("/v1/policy/reload", Some(ADMIN), &json!({}));
            assert_eq!(status, 400, "reload {i}: {body}");
            assert_eq!(body["diagnostic"]["reason"], "policy_invalid", "{body}");
            let problems = body["diagnostic"]["details"]["problems"].to_string();
            assert!(problems.contains("no_such_lane"), "{problems}");
        }
        // Calls keep flowing between reloads.
        let waited = Instant::now();
        while calls.load(Ordering::Relaxed) == before && waited.elapsed() < NO_HANG {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut bad = Vec::new();
    for client in clients {
        bad.extend(client.join().unwrap());
    }
    assert!(
        bad.is_empty(),
        "{} of {} calls failed, e.g. {:#}",
        bad.len(),
        calls.load(Ordering::Relaxed),
        bad[0]
    );
    assert!(calls.load(Ordering::Relaxed) >= 50);
    // The policy in force is the valid one.
    assert_eq!(
        server.get("/v1/policy", Some(ADMIN)).1["policy_versions"],
        versions
    );

    let loaded = events(&server, "policy_loaded");
    assert_eq!(
        loaded.len(),
        1 + valid_reloads,
        "one at start, one per valid reload"
    );
    assert_eq!(loaded[0]["details"]["trigger"], "start");
    assert!(
        loaded[1..]
            .iter()
            .all(|e| e["details"]["trigger"] == "admin:ops")
    );
}

#[test]
fn sighup_reloads_and_a_bad_policy_keeps_the_old_one() {
    let tmp = tempfile::tempdir().unwrap();
    let policy = policy_copy(tmp.path());
    let lanes = policy.join("lanes.yaml");
    let server = Server::start_with(Start {
        policy_dir: policy.clone(),
        ..Start::default()
    });
    let before = server.get("/v1/policy", Some(ADMIN)).1["policy_versions"].clone();

    // A broken policy: the signal changes nothing.
    let good = fs::read(&lanes).unwrap();
    replace_file(&lanes, b"version: [\n");
    common::unsafe_free_kill(server.pid(), "HUP");
    // A good one: the signal swaps it in and records it.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(events(&server, "policy_loaded").len(), 1);
    assert_eq!(
        server.get("/v1/policy", Some(ADMIN)).1["policy_versions"],
        before
    );
    let mut changed = good.clone();
    changed.extend_from_slice(b"# reviewed\n");
    replace_file(&lanes, &changed);
    common::unsafe_free_kill(server.pid(), "HUP");
    let loaded = wait_for_events(&server, "policy_loaded", 2);
    assert_eq!(loaded.len(), 2);
    assert_eq!(loaded[1]["details"]["trigger"], "sighup");
    let after = server.get("/v1/policy", Some(ADMIN)).1["policy_versions"].clone();
    assert_ne!(after["lanes"]["sha256"], before["lanes"]["sha256"]);
    assert_eq!(after["roles"], before["roles"]);
}
