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

use crate::common::fleet::{cluster_sidecar as sidecar, fleet, reason, research};
use crate::common::postgres::Postgres;
use crate::common::{self, ADMIN, Server, token};

/// The bound the safety lock reaches every sidecar within (`cluster::LOCK_BOUND`).
const LOCK_BOUND: Duration = Duration::from_secs(2);
/// What an HTTP round trip may add to it on a loaded test machine.
const HTTP_SLACK: Duration = Duration::from_secs(3);

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
        let (code, body) = research(sidecar, &run, "duty");
        assert_eq!(code, 200, "{body}");
        let (code, got) = sidecar.get(&format!("/v1/runs/{run}"), Some(ADMIN));
        assert_eq!((code, &got["status"]), (200, &json!("active")), "{got}");
    }
    // The same run id cannot be created again through another sidecar.
    let (code, again) = b.post("/v1/runs", Some(ADMIN), &json!({"run_id": run}));
    assert_eq!(code, 400, "{again}");
    // Nor by two sidecars racing for a new id: exactly one wins.
    let fleet = Arc::new(fleet);
    for round in 0..5 {
        let id = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(3));
        let racers: Vec<_> = (0..3)
            .map(|i| {
                let (fleet, barrier, id) = (fleet.clone(), barrier.clone(), id.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    fleet[i]
                        .post("/v1/runs", Some(ADMIN), &json!({"run_id": id, "scope": {}}))
                        .0
                })
            })
            .collect();
        let mut codes: Vec<u16> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        codes.sort();
        assert_eq!(codes, [201, 400, 400], "round {round}");
    }
    let (a, b, c) = (&fleet[0], &fleet[1], &fleet[2]);
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
    let (code, body) = research(a, &run, "duty");
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
    assert_eq!(research(c, &run, "duty").0, 200);

    let engaged_at = Instant::now();
    let (code, lock) = a.post(
        "/v1/safety-lock",
        Some(ADMIN),
        &json!({"engaged": true, "reason": "incident 7"}),
    );
    assert_eq!(code, 200, "{lock}");
    for sidecar in [b, c] {
        let denied = common::poll_until(LOCK_BOUND + HTTP_SLACK, || {
            let (_, body) = research(sidecar, &run, "duty");
            reason(&body) == "safety_lock_engaged"
        });
        assert!(denied, "not denied within {:?}", engaged_at.elapsed());
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
            sidecar, &run, "duty"
        )
        .0 == 200));
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
    assert_eq!(
        (code, reason(&conflict)),
        (409, "idempotency_conflict"),
        "{conflict}"
    );
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
    let mut named = draft.clone();
    named["role_id"] = json!("paralegal_agent");
    named["run_id"] = json!(run);
    named["lane_id"] = json!("drafting");
    named["scope"] = json!({});
    let (code, body) = b.post("/v1/tool-calls", Some(&forged), &named);
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
        let (code, body) = research(sidecar, &run, "duty");
        assert_eq!(code, 200, "{body}");
        answers.push((i, body));
    }

    pg.stop();
    for (i, sidecar) in [a, b].into_iter().enumerate() {
        for _ in 0..3 {
            let (code, body) = research(sidecar, &run, "duty");
            assert_eq!(code, 503, "{body}");
            assert_eq!(reason(&body), "cluster_unavailable", "{body}");
            assert_eq!(body["diagnostic"]["retryable"], true, "{body}");
            answers.push((i, body));
        }
        // Admin operations that need the database are refused too, never guessed.
        let (code, body) = sidecar.post("/v1/runs", Some(ADMIN), &json!({"scope": {}}));
        assert_eq!(
            (code, reason(&body)),
            (503, "cluster_unavailable"),
            "{body}"
        );
        let (code, body) = sidecar.post("/v1/safety-lock", Some(ADMIN), &json!({"engaged": false}));
        assert_eq!(
            (code, reason(&body)),
            (503, "cluster_unavailable"),
            "{body}"
        );
    }

    // The lock cannot be confirmed either: it reads as engaged (fail closed).
    let engaged = common::poll_until(LOCK_BOUND + HTTP_SLACK, || {
        a.get("/v1/safety-lock", Some(ADMIN)).1["engaged"] == true
    });
    assert!(engaged, "an unconfirmed lock must read as engaged");

    pg.restart();
    for (i, sidecar) in [a, b].into_iter().enumerate() {
        let resumed = common::poll_for(Duration::from_secs(30), || {
            let (code, body) = research(sidecar, &run, "duty");
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
            assert_eq!(
                closing.get(id),
                Some(&1),
                "call {id} on sidecar {i}: {answer}"
            );
        }
        assert_eq!(closing.len(), mine.len(), "no event without a call");
    }
}

#[test]
fn a_safety_lock_that_cannot_be_confirmed_within_the_bound_refuses_calls() {
    let pg = Postgres::start();
    let a = sidecar(&pg.url());
    let run = a.create_run(json!({"case_id": "C-1001"}));
    assert_eq!(research(&a, &run, "duty").0, 200);
    // The lock row is held by another session: the run still reads, the lock does
    // not (each read gives up after the query timeout).
    let mut holder = pg.psql_spawn(
        "BEGIN; LOCK TABLE toolgate_safety_lock IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(8); COMMIT;",
    );
    let refused = common::poll_for(LOCK_BOUND * 3 + HTTP_SLACK, || {
        let (code, body) = research(&a, &run, "duty");
        (reason(&body) == "safety_lock_unconfirmed").then_some((code, body))
    });
    let (code, body) = refused.expect("calls must be refused while the lock is unconfirmed");
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["diagnostic"]["retryable"], true, "{body}");
    assert_eq!(body["diagnostic"]["details"]["bound_ms"], 2000, "{body}");
    let (_, state) = a.get("/v1/safety-lock", Some(ADMIN));
    assert_eq!(state["engaged"], true, "{state}");
    // Once the lock row reads again, calls pass.
    assert!(common::poll_until(Duration::from_secs(30), || holder
        .try_wait()
        .unwrap()
        .is_some()));
    assert!(common::poll_until(LOCK_BOUND + HTTP_SLACK, || research(
        &a, &run, "duty"
    )
    .0 == 200));
}

#[test]
fn the_documented_least_privilege_roles_run_a_fleet() {
    // docs/deployment.md, "Least-privilege roles", statement by statement.
    let pg = Postgres::start();
    pg.psql("CREATE DATABASE toolgate");
    pg.psql("CREATE ROLE toolgate_owner LOGIN PASSWORD 'owner-pw'");
    pg.psql("CREATE ROLE toolgate_sidecar LOGIN PASSWORD 'sidecar-pw' CONNECTION LIMIT 2000");
    let admin = pg.url_as("postgres", common::postgres::PASSWORD, "toolgate");
    for sql in [
        "CREATE SCHEMA toolgate AUTHORIZATION toolgate_owner",
        "REVOKE ALL ON SCHEMA public FROM PUBLIC",
        "ALTER ROLE toolgate_owner IN DATABASE toolgate SET search_path = toolgate",
        "ALTER ROLE toolgate_sidecar IN DATABASE toolgate SET search_path = toolgate",
        "GRANT USAGE ON SCHEMA toolgate TO toolgate_sidecar",
        "ALTER DEFAULT PRIVILEGES FOR ROLE toolgate_owner IN SCHEMA toolgate \
         GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO toolgate_sidecar",
    ] {
        pg.psql_at(&admin, sql).unwrap();
    }
    let owner = pg.url_as("toolgate_owner", "owner-pw", "toolgate");
    let sidecar_url = pg.url_as("toolgate_sidecar", "sidecar-pw", "toolgate");

    // The sidecar role cannot create the schema: a clear start-up error.
    let (code, err) = serve_refuses(&sidecar_url);
    assert_eq!(
        (code, err["error"].as_str()),
        (6, Some("cluster_db_migration_failed")),
        "{err}"
    );
    // The owner migrates once; then the fleet runs as the sidecar role.
    drop(sidecar(&owner));
    let (a, b) = (sidecar(&sidecar_url), sidecar(&sidecar_url));
    let run = a.create_run(json!({"case_id": "C-1001"}));
    assert_eq!(research(&b, &run, "duty").0, 200);
    let (code, _) = b.post("/v1/safety-lock", Some(ADMIN), &json!({"engaged": true}));
    assert_eq!(code, 200);
    assert!(common::poll_until(LOCK_BOUND + HTTP_SLACK, || reason(
        &research(&a, &run, "duty").1
    ) == "safety_lock_engaged"));
    // The shared approvals (an identity column) need no sequence grant.
    pg.psql_at(
        &sidecar_url,
        "INSERT INTO toolgate_approvals (approval_id, status, run_id, call_digest, \
         created_at_ms, expires_at_ms, record) VALUES ('apr_x', 'pending', 'r', 'd', 0, 0, '{}')",
    )
    .unwrap();
    pg.psql_at(
        &sidecar_url,
        "DELETE FROM toolgate_approvals WHERE approval_id = 'apr_x'",
    )
    .unwrap();
    // ... and cannot change the schema or drop the tables.
    for sql in [
        "DROP TABLE toolgate_runs",
        "ALTER TABLE toolgate_runs ADD COLUMN x int",
        "CREATE TABLE toolgate_evil (x int)",
    ] {
        assert!(
            pg.psql_at(&sidecar_url, sql).is_err(),
            "{sql} must be refused"
        );
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
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["error"].is_string())
        })
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
    assert_eq!(
        (code, err["error"].as_str()),
        (6, Some("cluster_db_unreachable")),
        "{err}"
    );

    let (code, err) = serve_refuses(&pg.url_as("postgres", "wrong-pw", "postgres"));
    assert_eq!(
        (code, err["error"].as_str()),
        (6, Some("cluster_db_auth_failed")),
        "{err}"
    );
    assert!(err["cluster_db"].as_str().unwrap().contains("***"), "{err}");

    let (code, err) = serve_refuses(&pg.url_as("postgres", common::postgres::PASSWORD, "nodb"));
    assert_eq!(
        (code, err["error"].as_str()),
        (6, Some("cluster_db_auth_failed")),
        "{err}"
    );

    // An HTTP server (a plain toolgate) is not PostgreSQL.
    let http = Server::start();
    let port = http.base.rsplit(':').next().unwrap();
    let (code, err) = serve_refuses(&format!("postgres://u:p@127.0.0.1:{port}/db"));
    assert_eq!(
        (code, err["error"].as_str()),
        (6, Some("cluster_db_not_postgres")),
        "{err}"
    );

    for bad in [
        "mysql://u:p@127.0.0.1/db",
        "postgres://u:p@127.0.0.1:notaport/db",
    ] {
        let (code, err) = serve_refuses(bad);
        assert_eq!(
            (code, err["error"].as_str()),
            (4, Some("cluster_db_invalid_url")),
            "{bad}: {err}"
        );
    }

    // A database migrated by a newer toolgate is refused, not written to.
    drop(sidecar(&pg.url()));
    pg.psql("INSERT INTO toolgate_schema (version, applied_by) VALUES (99, 'toolgate 9')");
    let (code, err) = serve_refuses(&pg.url());
    assert_eq!(
        (code, err["error"].as_str()),
        (6, Some("cluster_db_schema_newer")),
        "{err}"
    );
}

/// Two sidecars on `pg` with the budgets test's policy (budgets and rates).
fn limited_pair(pg: &Postgres, dir: &std::path::Path) -> (Server, Server) {
    let start = || {
        let mut start = crate::budgets::write_policy(dir, crate::budgets::TOOLS);
        start.args = vec!["--cluster-db".into(), pg.url()];
        Server::start_with(start)
    };
    let a = start();
    (a, start())
}

fn tester(server: &Server, run: &str, tool: &str, arguments: Value, scope: Value) -> (u16, Value) {
    server.call("tester", run, "ops", tool, arguments, scope)
}

/// How many tool executions this sidecar's local log holds for `run` (one
/// `tool_requested` each; a replayed repeat writes only its closing event).
fn executed(server: &Server, run: &str) -> usize {
    events(server, run)
        .iter()
        .filter(|e| e["type"] == "tool_requested")
        .count()
}

#[test]
fn a_budget_shared_by_two_sidecars_admits_exactly_its_limit_to_concurrent_callers() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = limited_pair(&pg, tmp.path());
    let run = a.create_run(json!({}));
    // slow_limited: 4 calls per run, each takes a while so the callers overlap; half
    // of the callers go to each sidecar, all released at once.
    let callers = 12;
    let gate = Arc::new(Barrier::new(callers));
    let answers: Vec<(usize, u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..callers)
            .map(|i| {
                let server = if i % 2 == 0 { &a } else { &b };
                let (run, gate) = (&run, gate.clone());
                s.spawn(move || {
                    gate.wait();
                    let (code, body) =
                        tester(server, run, "slow_limited", json!({"i": i}), json!({}));
                    (i % 2, code, body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = answers.iter().filter(|(_, code, _)| *code == 200).count();
    assert_eq!(
        ok, 4,
        "exactly the budget is admitted in total: {answers:?}"
    );
    for (_, code, body) in answers.iter().filter(|(_, c, _)| *c != 200) {
        assert_eq!((*code, reason(body)), (403, "budget_exhausted"), "{body}");
    }
    // The tool ran exactly 4 times over both sidecars' logs.
    assert_eq!(executed(&a, &run) + executed(&b, &run), 4);
    // Later calls on either sidecar see the shared count.
    for server in [&a, &b] {
        let (code, body) = tester(server, &run, "slow_limited", json!({}), json!({}));
        assert_eq!((code, reason(&body)), (403, "budget_exhausted"), "{body}");
        assert_eq!(body["diagnostic"]["details"]["used"], 4, "{body}");
    }
    // Another run has its own budget, on either sidecar.
    let other = b.create_run(json!({}));
    let (code, body) = tester(&a, &other, "slow_limited", json!({}), json!({}));
    assert_eq!(code, 200, "{body}");
}

#[test]
fn a_rate_reached_on_one_sidecar_is_refused_on_the_other_with_when_to_retry() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = limited_pair(&pg, tmp.path());
    let run = a.create_run(json!({}));
    // restart: at most 3 per service per hour.
    for i in 0..3 {
        let (code, body) = tester(&a, &run, "restart", json!({}), json!({"service": "api"}));
        assert_eq!(code, 200, "restart {i}: {body}");
    }
    let (code, body) = tester(&b, &run, "restart", json!({}), json!({"service": "api"}));
    assert_eq!((code, reason(&body)), (429, "rate_limited"), "{body}");
    let d = &body["diagnostic"];
    assert_eq!(d["retryable"], true, "{body}");
    assert_eq!(d["details"]["used"], 3, "{body}");
    assert_eq!(d["details"]["key_value"], "api", "{body}");
    let wait = d["details"]["retry_after_ms"].as_u64().unwrap();
    assert!(wait > 3_500_000 && wait <= 3_600_000, "{wait}");
    // A rate is per key value, shared too: "db" has its own count on both sidecars.
    let (code, body) = tester(&b, &run, "restart", json!({}), json!({"service": "db"}));
    assert_eq!(code, 200, "{body}");
    // A rate spans runs: a new run created on B is refused on A for "api".
    let other = b.create_run(json!({}));
    let (code, body) = tester(&a, &other, "restart", json!({}), json!({"service": "api"}));
    assert_eq!((code, reason(&body)), (429, "rate_limited"), "{body}");
}

#[test]
fn counters_that_cannot_be_read_in_time_refuse_the_call_and_count_nothing() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = limited_pair(&pg, tmp.path());
    let run = a.create_run(json!({}));
    // An insider holds the counters table: claims wait out the query timeout and are
    // refused (never admitted on a guess).
    let mut holder = pg.psql_spawn(
        "BEGIN; LOCK TABLE toolgate_counters IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(15); COMMIT;",
    );
    let held = common::poll_until(Duration::from_secs(10), || {
        pg.psql(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
             WHERE c.relname = 'toolgate_counters' AND l.mode = 'AccessExclusiveLock' AND l.granted",
        ) == "1"
    });
    assert!(held, "the holder did not take the lock");
    let (code, body) = tester(&a, &run, "gated", json!({}), json!({}));
    assert!(code >= 500, "{code} {body}");
    assert_eq!(reason(&body), "counter_state_unavailable", "{body}");
    assert_eq!(body["diagnostic"]["retryable"], true, "{body}");
    let (code, body) = tester(&b, &run, "gated", json!({}), json!({}));
    assert!(code >= 500, "{code} {body}");
    assert_eq!(reason(&body), "counter_state_unavailable", "{body}");
    assert!(common::poll_until(Duration::from_secs(30), || holder
        .try_wait()
        .unwrap()
        .is_some()));
    // The refused calls counted nothing: the run's 2 calls of `gated` are all there.
    for server in [&a, &b] {
        let (code, body) = tester(server, &run, "gated", json!({}), json!({}));
        assert_eq!(code, 200, "{body}");
    }
    let (code, body) = tester(&a, &run, "gated", json!({}), json!({}));
    assert_eq!((code, reason(&body)), (403, "budget_exhausted"), "{body}");
}

fn tool_executed(server: &Server, run: &str) -> usize {
    events(server, run)
        .iter()
        .filter(|e| e["type"] == "tool_executed")
        .count()
}

#[test]
fn an_approval_requested_through_one_sidecar_is_decided_and_used_once_through_others() {
    use crate::approvals::with_approval;
    use crate::approvals::{SUPERVISOR, approval_policy, decide, draft_call, request, send};
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let start = || {
        let mut start = approval_policy(tmp.path(), 1, 600);
        start.args = vec!["--cluster-db".into(), pg.url()];
        Server::start_with(start)
    };
    let (a, b, c) = (start(), start(), start());
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&a, &call);
    let (_, first) = send(&a, &call);
    assert_eq!(
        first["diagnostic"]["details"]["approvals_shared"], true,
        "{first}"
    );
    assert_eq!(
        first["diagnostic"]["details"]["approval_id"],
        id.as_str(),
        "{first}"
    );

    // B lists it and shows it; a retry through C before the decision is pending.
    let (code, list) = b.get("/v1/approvals?status=pending", Some(SUPERVISOR));
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["approvals"][0]["approval_id"], id.as_str(), "{list}");
    let (code, list) = b.get(
        "/v1/approvals?status=pending&order=newest&limit=1",
        Some(SUPERVISOR),
    );
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["approvals"][0]["approval_id"], id.as_str(), "{list}");
    let (code, shown) = b.get(&format!("/v1/approvals/{id}"), Some(SUPERVISOR));
    assert_eq!(
        (code, &shown["status"]),
        (200, &json!("pending")),
        "{shown}"
    );
    let (code, body) = send(&c, &with_approval(&call, &id));
    assert!((400..500).contains(&code), "{code} {body}");
    assert_eq!(reason(&body), "approval_pending", "{body}");
    // The requester's role cannot approve it through another sidecar either.
    let (code, body) = decide(
        &b,
        Some(&crate::common::token("drafting_agent")),
        &id,
        "approve",
        "mine",
    );
    assert!((400..500).contains(&code), "{code} {body}");

    // Decided through B, used through C: executed once; a second use through A is refused.
    let (code, body) = decide(&b, Some(SUPERVISOR), &id, "approve", "checked");
    assert_eq!(code, 200, "{body}");
    let (code, body) = send(&c, &with_approval(&call, &id));
    assert_eq!(code, 200, "{body}");
    let (code, body) = send(&a, &with_approval(&call, &id));
    assert!((400..500).contains(&code), "{code} {body}");
    assert_eq!(reason(&body), "approval_used", "{body}");
    assert_eq!(
        tool_executed(&a, &run) + tool_executed(&b, &run) + tool_executed(&c, &run),
        1
    );

    // An unknown id is unknown on every sidecar, with a structured reason.
    let missing = "apr_00000000000000000000000000";
    let (code, body) = b.get(&format!("/v1/approvals/{missing}"), Some(SUPERVISOR));
    assert!((400..500).contains(&code), "{code} {body}");
    assert_eq!(reason(&body), "approval_unknown", "{body}");
}

#[test]
fn shared_approvals_with_the_database_down_refuse_with_a_reason_and_never_run() {
    use crate::approvals::with_approval;
    use crate::approvals::{SUPERVISOR, approval_policy, decide, draft_call, request, send};
    let mut pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let start = || {
        let mut start = approval_policy(tmp.path(), 1, 600);
        start.args = vec!["--cluster-db".into(), pg.url()];
        Server::start_with(start)
    };
    let (a, b) = (start(), start());
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let call = draft_call(&run, "Motion");
    let id = request(&a, &call);
    let (code, body) = decide(&b, Some(SUPERVISOR), &id, "approve", "checked");
    assert_eq!(code, 200, "{body}");

    pg.stop();
    // Reads, decisions and the retry: structured 503s, nothing guessed, nothing run.
    let (code, body) = b.get(&format!("/v1/approvals/{id}"), Some(SUPERVISOR));
    assert_eq!(
        (code, reason(&body)),
        (503, "approval_store_unavailable"),
        "{body}"
    );
    let (code, body) = b.get("/v1/approvals?status=approved", Some(SUPERVISOR));
    assert_eq!(
        (code, reason(&body)),
        (503, "approval_store_unavailable"),
        "{body}"
    );
    let (code, body) = send(&b, &with_approval(&call, &id));
    assert_eq!(code, 503, "{body}");
    assert!(
        ["cluster_unavailable", "approval_store_unavailable"].contains(&reason(&body)),
        "{body}"
    );
    assert_eq!(tool_executed(&a, &run) + tool_executed(&b, &run), 0);
}

#[test]
fn concurrent_retries_through_two_sidecars_consume_an_approval_once() {
    use crate::approvals::with_approval;
    use crate::approvals::{SUPERVISOR, approval_policy, decide, draft_call, request, send};
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let start = || {
        let mut start = approval_policy(tmp.path(), 1, 600);
        start.args = vec!["--cluster-db".into(), pg.url()];
        Server::start_with(start)
    };
    let (a, b) = (start(), start());
    let run = a.create_run(json!({"case_id": "C-1001"}));
    for round in 0..3 {
        let call = draft_call(&run, &format!("Motion {round}"));
        let id = request(&a, &call);
        let (code, body) = decide(&b, Some(SUPERVISOR), &id, "approve", "checked");
        assert_eq!(code, 200, "{body}");
        let retry = with_approval(&call, &id);
        let (on_a, on_b) = std::thread::scope(|s| {
            let ta = s.spawn(|| send(&a, &retry));
            let tb = s.spawn(|| send(&b, &retry));
            (ta.join().unwrap(), tb.join().unwrap())
        });
        let codes = [on_a.0, on_b.0];
        assert_eq!(
            codes.iter().filter(|c| **c == 200).count(),
            1,
            "{on_a:?} {on_b:?}"
        );
        let loser = if on_a.0 == 200 { &on_b.1 } else { &on_a.1 };
        assert_eq!(reason(loser), "approval_used", "{loser}");
    }
    assert_eq!(tool_executed(&a, &run) + tool_executed(&b, &run), 3);
}

#[test]
fn a_repeat_replayed_on_another_sidecar_does_not_count_against_the_budget() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = limited_pair(&pg, tmp.path());
    let run = a.create_run(json!({}));
    // gated: 2 calls per run. The same key on A then B executes once, counts once.
    let keyed = json!({"role_id": "tester", "run_id": run, "lane_id": "ops",
        "tool_name": "gated", "arguments": {"n": 1}, "scope": {}, "idempotency_key": "k-1"});
    let (code, first) = a.post("/v1/tool-calls", Some("demo-tester"), &keyed);
    assert_eq!(code, 200, "{first}");
    let (code, again) = b.post("/v1/tool-calls", Some("demo-tester"), &keyed);
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["output"], first["output"], "{again}");
    assert_eq!(executed(&a, &run) + executed(&b, &run), 1);
    // So one call of the budget is left, on either sidecar.
    let (code, body) = tester(&b, &run, "gated", json!({"n": 2}), json!({}));
    assert_eq!(code, 200, "{body}");
    let (code, body) = tester(&a, &run, "gated", json!({"n": 3}), json!({}));
    assert_eq!((code, reason(&body)), (403, "budget_exhausted"), "{body}");
    assert_eq!(body["diagnostic"]["details"]["used"], 2, "{body}");
}
