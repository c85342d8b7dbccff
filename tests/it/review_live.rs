//! Policy review against a running gateway (the real binary on 127.0.0.1:0 with a
//! temporary data directory): shadow mode, reloads under load, SIGHUP, and
//! `audit replay` of recorded traffic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::demo::edit;
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
    common::poll_for(NO_HANG, || {
        Some(events(server, event_type)).filter(|found| found.len() >= n)
    })
    .unwrap_or_else(|| events(server, event_type))
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
    let data_dir = tmp.path().join("var");
    let server = Server::start_with(Start {
        data_dir: Some(data_dir.clone()),
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
    assert_eq!(found[0]["call_id"], urgent["call_id"]);
    assert_eq!(found[0]["tool_name"], "case_lookup");
    assert_eq!(found[1]["call_id"], dry["call_id"]);
    assert_eq!(found[1]["details"]["dry_run"], true);

    // Shutdown records every queued divergence before the log closes: exactly these
    // two, read from the database.
    assert!(server.stop().success());
    let all = tail(&data_dir.join("audit.db"));
    let divergences: Vec<&Value> = all
        .iter()
        .filter(|e| e["type"] == "shadow_divergence")
        .collect();
    assert_eq!(divergences.len(), 2, "{divergences:#?}");
    assert_eq!(divergences[0]["call_id"], urgent["call_id"]);
    // They are part of the verifiable chain like every other event.
    let db = data_dir.join("audit.db");
    let (code, out, err) = common::run(
        Path::new("."),
        &["audit", "verify", "--db", db.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{out}{err}");
}

/// Every event in the database, through `toolgate audit tail` (the real binary).
fn tail(db: &Path) -> Vec<Value> {
    let (code, out, err) = common::run(
        Path::new("."),
        &[
            "audit",
            "tail",
            "--db",
            db.to_str().unwrap(),
            "--limit",
            "10000",
        ],
    );
    assert_eq!(code, 0, "{err}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
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
    common::poll_until(NO_HANG, || calls.load(Ordering::Relaxed) >= 20);
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
        common::poll_until(NO_HANG, || calls.load(Ordering::Relaxed) != before);
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
    assert!(
        !server
            .log_lines_with("policy reload failed; the current policy stays")
            .is_empty(),
        "the failed reload was not logged"
    );
    assert_eq!(events(&server, "policy_loaded").len(), 1);
    assert_eq!(
        server.get("/v1/policy", Some(ADMIN)).1["policy_versions"],
        before
    );
    // A good one: the signal swaps it in and records it.
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

fn sha256_file(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(fs::read(path).unwrap()))
}

#[test]
fn replay_lists_the_recorded_calls_a_candidate_decides_differently() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("var");
    let server = Server::start_with(Start {
        data_dir: Some(data_dir.clone()),
        ..Start::default()
    });
    let run = server.create_run(json!({ "case_id": "C-1001" }));
    let scope = json!({ "case_id": "C-1001" });
    let mut ids = Vec::new();
    let mut call = |role: &str, tool: &str, arguments: Value, expected: u16| {
        let (status, body) = server.call(role, &run, "research", tool, arguments, scope.clone());
        assert_eq!(status, expected, "{body}");
        ids.push(body["call_id"].as_str().unwrap().to_string());
    };
    call(
        "research_agent",
        "legal_search",
        json!({ "query": "duty" }),
        200,
    );
    call("research_agent", "case_lookup", json!({}), 200);
    call(
        "research_agent",
        "read_document",
        json!({ "path": "privileged/strategy.md" }),
        403,
    );
    call(
        "research_agent",
        "read_document",
        json!({ "path": "notes.md" }),
        200,
    );
    call(
        "supervisor",
        "legal_search",
        json!({ "query": "breach" }),
        200,
    );
    // A refused credential: replay cannot re-decide it (tokens are not recorded).
    let (status, _) = server.post(
        "/v1/tool-calls",
        Some("not-a-token"),
        &json!({"role_id": "research_agent", "run_id": run, "lane_id": "research",
                "tool_name": "case_lookup", "arguments": {}, "scope": scope}),
    );
    assert_eq!(status, 401);

    // The candidate disables legal_search and lets research read privileged documents.
    let candidate = tmp.path().join("candidate");
    let policy = policy_copy(&candidate);
    common::copy_dir(&repo().join("tools"), &candidate.join("tools"));
    edit(
        &policy.join("lanes.yaml"),
        "prohibited_flags: [privileged, sealed]",
        "prohibited_flags: [sealed]",
    );
    let registry = candidate.join("tools/tool_registry.yaml");
    let text = fs::read_to_string(&registry).unwrap();
    let at = text.find("tool_name: legal_search").unwrap();
    let enabled = at + text[at..].find("enabled: true").unwrap();
    let mut changed = text.clone();
    changed.replace_range(enabled..enabled + "enabled: true".len(), "enabled: false");
    fs::write(&registry, changed).unwrap();

    let db = data_dir.join("audit.db");
    let replay = |policy: &Path, tools: &Path, extra: &[&str]| {
        let mut args = vec![
            "audit",
            "replay",
            "--policy-dir",
            policy.to_str().unwrap(),
            "--tools",
            tools.to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        common::run(tmp.path(), &args)
    };

    // Beside the running gateway (read-only), and again once it stopped.
    let (code, live, err) = replay(&policy, &registry, &["--format", "json"]);
    assert_eq!(code, 0, "{err}");
    assert!(server.stop().success());
    let before = sha256_file(&db);
    let (code, out, err) = replay(&policy, &registry, &["--format", "json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(sha256_file(&db), before, "replay never writes the log");
    assert_eq!(live, out);

    let report: Value = serde_json::from_str(&out).unwrap();
    let summary = &report["summary"];
    assert_eq!(summary["replayed"], 5, "{report:#}");
    assert_eq!(summary["unchanged"], 2);
    assert_eq!(summary["allowed_to_denied"], 2);
    assert_eq!(summary["denied_to_allowed"], 1);
    assert_eq!(summary["reason_changed"], 0);
    assert_eq!(summary["undetermined"], 0);
    assert_eq!(
        summary["not_rechecked"], 0,
        "the demo tools keep their arguments"
    );
    assert_eq!(summary["skipped"]["bearer tokens are not recorded"], 1);
    let changes = report["changes"].as_array().unwrap();
    let got: Vec<(&str, &str, &str, Option<&str>)> = changes
        .iter()
        .map(|c| {
            (
                c["call_id"].as_str().unwrap(),
                c["tool_name"].as_str().unwrap(),
                c["change"].as_str().unwrap(),
                c["now"]["reason"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                ids[0].as_str(),
                "legal_search",
                "allowed_to_denied",
                Some("tool_disabled")
            ),
            (ids[2].as_str(), "read_document", "denied_to_allowed", None),
            (
                ids[4].as_str(),
                "legal_search",
                "allowed_to_denied",
                Some("tool_disabled")
            ),
        ]
    );
    assert_eq!(changes[0]["was"]["decision"], "allow");
    assert_eq!(changes[0]["now"]["step"], 5);
    assert_eq!(changes[1]["was"]["reason"], "prohibited_flag");

    let (code, text, _) = replay(&policy, &registry, &[]);
    assert_eq!(code, 0);
    assert!(
        text.contains("5 calls replayed: 2 unchanged, 2 allowed -> denied, 1 denied -> allowed, 0 with a different denial reason"),
        "{text}"
    );
    assert!(
        text.contains("    now: deny at step 5 (tool_disabled): tool `legal_search` is disabled"),
        "{text}"
    );
    assert!(
        text.contains("skipped: 1 call (bearer tokens are not recorded)"),
        "{text}"
    );

    // The policy that recorded the calls decides them all the same.
    let (code, out, _) = replay(
        &repo().join("policy"),
        &repo().join("tools/tool_registry.yaml"),
        &["--format", "json"],
    );
    assert_eq!(code, 0);
    let same: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(same["summary"]["unchanged"], 5, "{same:#}");
    // Nothing recorded after a time in the future.
    let (code, out, _) = replay(
        &policy,
        &registry,
        &["--since", "2999-01-01T00:00:00Z", "--format", "json"],
    );
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["summary"]["replayed"],
        0
    );
    // At most --limit calls.
    let (_, out, _) = replay(&policy, &registry, &["--limit", "2", "--format", "json"]);
    let limited: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(limited["summary"]["replayed"], 2);
    assert_eq!(limited["summary"]["truncated"], true);
    // Bad input is refused with exit 4.
    assert_eq!(replay(&policy, &registry, &["--since", "yesterday"]).0, 4);
    let none = tmp.path().join("none.db");
    let (code, _, err) = common::run(
        tmp.path(),
        &[
            "audit",
            "replay",
            "--policy-dir",
            policy.to_str().unwrap(),
            "--tools",
            registry.to_str().unwrap(),
            "--db",
            none.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 4, "{err}");
}
