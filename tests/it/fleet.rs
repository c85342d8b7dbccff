//! A fleet: three real `toolgate serve --cluster-db` processes on loopback sharing one
//! real PostgreSQL (installed and started by `common::postgres`): runs, run tokens,
//! the safety lock and idempotency keys are one state across the sidecars; the
//! database being down refuses calls with a structured reason, and they resume when
//! it returns; a bad cluster URL stops the start with a structured error.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::postgres::Postgres;
use crate::common::{self, ADMIN, Server, Start, token};

/// The bound the safety lock reaches every sidecar within (`cluster::LOCK_BOUND`).
const LOCK_BOUND: Duration = Duration::from_secs(2);
/// What an HTTP round trip may add to it on a loaded test machine.
const HTTP_SLACK: Duration = Duration::from_secs(3);

fn sidecar(url: &str) -> Server {
    Server::start_with(Start {
        args: vec!["--cluster-db".into(), url.to_string()],
        ..Start::default()
    })
}

/// Three sidecars on `pg`, started at once (they migrate the fresh database together).
fn fleet(pg: &Postgres) -> Vec<Server> {
    let url = pg.url();
    let starts: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || sidecar(&url))
        })
        .collect();
    starts.into_iter().map(|s| s.join().unwrap()).collect()
}

fn reason(body: &Value) -> &str {
    body["diagnostic"]["reason"].as_str().unwrap_or_default()
}

fn research(server: &Server, run: &str) -> (u16, Value) {
    server.call(
        "research_agent",
        run,
        "research",
        "legal_search",
        json!({"query": "duty", "limit": 2}),
        json!({"case_id": "C-1001"}),
    )
}

/// This sidecar's local audit events of `run` (oldest first).
fn events(server: &Server, run: &str) -> Vec<Value> {
    let (code, page) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(code, 200, "{page}");
    page["events"].as_array().unwrap().clone()
}

#[test]
fn a_run_created_through_one_sidecar_is_used_and_closed_through_the_others() {
    let pg = Postgres::start();
    let fleet = fleet(&pg);
    let (a, b, c) = (&fleet[0], &fleet[1], &fleet[2]);
    // The three migrated the fresh database once.
    assert_eq!(
        pg.psql("SELECT count(*) FROM toolgate_schema"),
        pg.psql("SELECT max(version) FROM toolgate_schema")
    );

    let run = a.create_run(json!({"case_id": "C-1001"}));
    for sidecar in [b, c] {
        let (code, body) = research(sidecar, &run);
        assert_eq!(code, 200, "{body}");
        let (code, got) = sidecar.get(&format!("/v1/runs/{run}"), Some(ADMIN));
        assert_eq!((code, &got["status"]), (200, &json!("active")), "{got}");
    }
    // The same run id cannot be created again through another sidecar.
    let (code, again) = b.post("/v1/runs", Some(ADMIN), &json!({"run_id": run}));
    assert_eq!(code, 400, "{again}");
    // Listed by every sidecar.
    let (_, listed) = c.get("/v1/runs?status=active", Some(ADMIN));
    assert!(
        listed["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["run_id"] == json!(run)),
        "{listed}"
    );
    // Suspended through C: refused on A at once (every call re-reads the run).
    let (code, _) = c.post(
        &format!("/v1/runs/{run}/status"),
        Some(ADMIN),
        &json!({"status": "suspended"}),
    );
    assert_eq!(code, 200);
    let (code, body) = research(a, &run);
    assert_eq!((code, reason(&body)), (403, "run_not_active"), "{body}");
    // Closed through B: final everywhere.
    let (code, _) = b.post(
        &format!("/v1/runs/{run}/status"),
        Some(ADMIN),
        &json!({"status": "closed"}),
    );
    assert_eq!(code, 200);
    let (code, reopen) = a.post(
        &format!("/v1/runs/{run}/status"),
        Some(ADMIN),
        &json!({"status": "active"}),
    );
    assert_eq!(code, 403, "closed is final across the fleet: {reopen}");
    // Each sidecar audited what it did: A the creation, C the suspension.
    let types = |s: &Server| -> Vec<String> {
        events(s, &run)
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(types(a).contains(&"run_created".to_string()));
    assert!(types(c).contains(&"run_status_changed".to_string()));
}

#[test]
fn a_safety_lock_engaged_on_one_sidecar_denies_on_the_others_within_the_bound() {
    let pg = Postgres::start();
    let fleet = fleet(&pg);
    let (a, b, c) = (&fleet[0], &fleet[1], &fleet[2]);
    let run = a.create_run(json!({"case_id": "C-1001"}));
    assert_eq!(research(c, &run).0, 200);

    let engaged_at = Instant::now();
    let (code, lock) = a.post(
        "/v1/safety-lock",
        Some(ADMIN),
        &json!({"engaged": true, "reason": "incident 7"}),
    );
    assert_eq!(code, 200, "{lock}");
    for sidecar in [b, c] {
        let denied = common::poll_until(LOCK_BOUND + HTTP_SLACK, || {
            let (_, body) = research(sidecar, &run);
            reason(&body) == "safety_lock_engaged"
        });
        assert!(
            denied,
            "not denied within {:?}",
            engaged_at.elapsed()
        );
    }
    let took = engaged_at.elapsed();
    eprintln!("the lock reached both other sidecars within {took:?}");
    let (_, state) = c.get("/v1/safety-lock", Some(ADMIN));
    assert_eq!(state["engaged"], true, "{state}");
    assert_eq!(state["reason"], "incident 7", "{state}");

    // Released through B: calls pass on A and C again.
    let (code, _) = b.post("/v1/safety-lock", Some(ADMIN), &json!({"engaged": false}));
    assert_eq!(code, 200);
    for sidecar in [a, c] {
        assert!(common::poll_until(LOCK_BOUND + HTTP_SLACK, || research(
            sidecar, &run
        )
        .0
            == 200));
    }
}

#[test]
fn the_same_idempotency_key_sent_to_two_sidecars_at_once_executes_once() {
    let pg = Postgres::start();
    let fleet = Arc::new(fleet(&pg));
    let run = fleet[0].create_run(json!({"case_id": "C-1001"}));
    for round in 0..3 {
        let body = json!({
            "role_id": "drafting_agent", "run_id": run, "lane_id": "drafting",
            "tool_name": "draft_document",
            "arguments": {"title": format!("Motion {round}"), "body": "Comes now the defendant."},
            "scope": {"case_id": "C-1001"}, "idempotency_key": format!("draft-{round}"),
        });
        let barrier = Arc::new(Barrier::new(2));
        let senders: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|i| {
                let (fleet, barrier, body) = (fleet.clone(), barrier.clone(), body.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    fleet[i].post("/v1/tool-calls", Some(&token("drafting_agent")), &body)
                })
            })
            .collect();
        let answers: Vec<(u16, Value)> = senders.into_iter().map(|s| s.join().unwrap()).collect();
        for (code, answer) in &answers {
            assert_eq!(*code, 200, "{answer}");
        }
        let firsts: Vec<&Value> = answers
            .iter()
            .map(|(_, a)| a)
            .filter(|a| a["replayed"] == false)
            .collect();
        assert_eq!(firsts.len(), 1, "exactly one executed: {answers:?}");
        let replay = answers
            .iter()
            .map(|(_, a)| a)
            .find(|a| a["replayed"] == true)
            .unwrap();
        assert_eq!(replay["replay_of"], firsts[0]["call_id"]);
        assert_eq!(replay["output"], firsts[0]["output"]);
        // One tool_requested across both sidecars' logs for this key.
        let requested: usize = fleet[..2]
            .iter()
            .map(|s| {
                events(s, &run)
                    .iter()
                    .filter(|e| e["type"] == "tool_requested")
                    .filter(|e| e["call_id"] == firsts[0]["call_id"])
                    .count()
            })
            .sum();
        assert_eq!(requested, 1, "round {round}");
    }
    // Three rounds, three executions in all, none twice.
    let requested: usize = fleet
        .iter()
        .map(|s| {
            events(s, &run)
                .iter()
                .filter(|e| e["type"] == "tool_requested")
                .count()
        })
        .sum();
    assert_eq!(requested, 3);
    // The same key with other arguments on the third sidecar: a conflict.
    let other = json!({
        "role_id": "drafting_agent", "run_id": run, "lane_id": "drafting",
        "tool_name": "draft_document",
        "arguments": {"title": "Something else", "body": "x"},
        "scope": {"case_id": "C-1001"}, "idempotency_key": "draft-0",
    });
    let (code, conflict) = fleet[2].post("/v1/tool-calls", Some(&token("drafting_agent")), &other);
    assert_eq!((code, reason(&conflict)), (409, "idempotency_conflict"), "{conflict}");
}

#[test]
fn a_run_token_issued_through_one_sidecar_works_on_another_until_revoked_on_a_third() {
    let pg = Postgres::start();
    let fleet = fleet(&pg);
    let (a, b, c) = (&fleet[0], &fleet[1], &fleet[2]);
    let (code, created) = a.post(
        "/v1/runs",
        Some(ADMIN),
        &json!({"scope": {"case_id": "C-1001"}, "issue_tokens": [{"role_id": "paralegal_agent"}]}),
    );
    assert_eq!(code, 201, "{created}");
    let run = created["run_id"].as_str().unwrap();
    let t = created["tokens"][0]["token"].as_str().unwrap();
    let token_id = created["tokens"][0]["token_id"].as_str().unwrap();
    // Only the sha256 is in the database.
    let stored = pg.psql("SELECT token_sha256 || ' ' || token_id FROM toolgate_run_tokens");
    assert!(!stored.contains(t), "the token itself must never be stored");
    assert!(stored.contains(token_id), "{stored}");

    let draft = json!({
        "tool_name": "draft_document",
        "arguments": {"title": "Engagement letter", "body": "Dear client."},
    });
    let (code, body) = c.post("/v1/tool-calls", Some(t), &draft);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["trace"]["role"], "paralegal_agent", "{body}");
    let (code, catalog) = c.get(
        "/v1/tools?role_id=paralegal_agent&lane_id=drafting",
        Some(t),
    );
    assert_eq!(code, 200, "{catalog}");

    // Revoked through B: dead on C and A at once.
    let (code, revoked) = b.post(
        &format!("/v1/runs/{run}/tokens/{token_id}/revoke"),
        Some(ADMIN),
        &json!({}),
    );
    assert_eq!(code, 200, "{revoked}");
    for sidecar in [c, a] {
        let (code, body) = sidecar.post("/v1/tool-calls", Some(t), &draft);
        assert_eq!((code, reason(&body)), (401, "credential_expired"), "{body}");
    }
    // A token no sidecar issued is refused everywhere.
    let forged = format!("tgr_{}", "A".repeat(43));
    let (code, body) = b.post("/v1/tool-calls", Some(&forged), &draft);
    assert_eq!((code, reason(&body)), (401, "credential_invalid"), "{body}");
}

#[test]
fn postgres_down_refuses_calls_with_a_structured_reason_and_they_resume_when_it_returns() {
    let mut pg = Postgres::start();
    let fleet = fleet(&pg);
    let (a, b) = (&fleet[0], &fleet[1]);
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let mut answers: Vec<(usize, Value)> = Vec::new();
    for (i, sidecar) in [a, b].into_iter().enumerate() {
        let (code, body) = research(sidecar, &run);
        assert_eq!(code, 200, "{body}");
        answers.push((i, body));
    }

    pg.stop();
    for (i, sidecar) in [a, b].into_iter().enumerate() {
        for _ in 0..3 {
            let (code, body) = research(sidecar, &run);
            assert_eq!(code, 503, "{body}");
            assert_eq!(reason(&body), "cluster_unavailable", "{body}");
            assert_eq!(body["diagnostic"]["retryable"], true, "{body}");
            answers.push((i, body));
        }
        // Admin operations that need the database are refused too, never guessed.
        let (code, body) = sidecar.post("/v1/runs", Some(ADMIN), &json!({"scope": {}}));
        assert_eq!((code, reason(&body)), (503, "cluster_unavailable"), "{body}");
        let (code, body) = sidecar.post(
            "/v1/safety-lock",
            Some(ADMIN),
            &json!({"engaged": false}),
        );
        assert_eq!((code, reason(&body)), (503, "cluster_unavailable"), "{body}");
    }

    pg.restart();
    for (i, sidecar) in [a, b].into_iter().enumerate() {
        let resumed = common::poll_for(Duration::from_secs(30), || {
            let (code, body) = research(sidecar, &run);
            let ok = code == 200;
            answers.push((i, body));
            ok.then_some(())
        });
        assert!(resumed.is_some(), "sidecar {i} did not resume");
    }

    // Every call, refused or executed, closed by exactly one event in the log of the
    // sidecar that answered it; none lost, none twice.
    for (i, sidecar) in [a, b].into_iter().enumerate() {
        let log = events(sidecar, &run);
        let mut closing: HashMap<String, usize> = HashMap::new();
        for e in &log {
            if matches!(
                e["type"].as_str(),
                Some("tool_executed" | "tool_denied" | "tool_failed" | "tool_timeout")
            ) {
                *closing
                    .entry(e["call_id"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        let mine: Vec<&Value> = answers
            .iter()
            .filter(|(s, _)| *s == i)
            .map(|(_, a)| a)
            .collect();
        for answer in &mine {
            let id = answer["call_id"].as_str().unwrap();
            assert_eq!(closing.get(id), Some(&1), "call {id} on sidecar {i}: {answer}");
        }
        assert_eq!(closing.len(), mine.len(), "no event without a call");
    }
}

/// Runs `serve` with `url` as the cluster database; it must exit (bounded): its code
/// and the JSON object it printed on stderr.
fn serve_refuses(url: &str) -> (i32, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("stderr");
    let mut child = Command::new(common::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path().join("var"))
        .arg("--policy-dir")
        .arg(common::repo().join("policy"))
        .arg("--tools")
        .arg(common::repo().join("tools/tool_registry.yaml"))
        .args(["--cluster-db", url])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&out).unwrap())
        .spawn()
        .unwrap();
    let Some(status) = common::poll_for(Duration::from_secs(30), || child.try_wait().unwrap())
    else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve with --cluster-db {url} did not exit");
    };
    let text = std::fs::read_to_string(&out).unwrap();
    let json = text
        .lines()
        .find_map(|l| serde_json::from_str::<Value>(l).ok().filter(|v| v["error"].is_string()))
        .unwrap_or_else(|| panic!("no JSON error on stderr: {text}"));
    assert!(
        !text.contains(common::postgres::PASSWORD) && !text.contains("wrong-pw"),
        "a password leaked: {text}"
    );
    (status.code().unwrap_or(-1), json)
}

#[test]
fn a_wrong_or_unreachable_cluster_database_stops_the_start_with_a_structured_error() {
    let pg = Postgres::start();
    // Nothing listens on a port just freed.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (code, err) = serve_refuses(&format!("postgres://u:p@127.0.0.1:{free}/db"));
    assert_eq!((code, err["error"].as_str()), (6, Some("cluster_db_unreachable")), "{err}");

    let (code, err) = serve_refuses(&pg.url_as("postgres", "wrong-pw", "postgres"));
    assert_eq!((code, err["error"].as_str()), (6, Some("cluster_db_auth_failed")), "{err}");
    assert!(err["cluster_db"].as_str().unwrap().contains("***"), "{err}");

    let (code, err) = serve_refuses(&pg.url_as("postgres", common::postgres::PASSWORD, "nodb"));
    assert_eq!((code, err["error"].as_str()), (6, Some("cluster_db_auth_failed")), "{err}");

    // An HTTP server (a plain toolgate) is not PostgreSQL.
    let http = Server::start();
    let port = http.base.rsplit(':').next().unwrap();
    let (code, err) = serve_refuses(&format!("postgres://u:p@127.0.0.1:{port}/db"));
    assert_eq!((code, err["error"].as_str()), (6, Some("cluster_db_not_postgres")), "{err}");

    for bad in ["mysql://u:p@127.0.0.1/db", "postgres://u:p@127.0.0.1:notaport/db"] {
        let (code, err) = serve_refuses(bad);
        assert_eq!((code, err["error"].as_str()), (4, Some("cluster_db_invalid_url")), "{bad}: {err}");
    }

    // A database migrated by a newer toolgate is refused, not written to.
    drop(sidecar(&pg.url()));
    pg.psql("INSERT INTO toolgate_schema (version, applied_by) VALUES (99, 'toolgate 9')");
    let (code, err) = serve_refuses(&pg.url());
    assert_eq!((code, err["error"].as_str()), (6, Some("cluster_db_schema_newer")), "{err}");
}
