//! A dead sidecar's idempotency claim in a fleet (real PostgreSQL): the claim stays in
//! flight, repeats on the other sidecars are refused (never executed on a guess) with
//! the holder and the claim's age, and the operator procedure of docs/deployment.md
//! (delete the claim once the hub shows the call did not execute) lets the retry run.

use serde_json::{Value, json};

use crate::common::postgres::Postgres;
use crate::common::{ADMIN, Server};

fn sidecar(pg: &Postgres, dir: &std::path::Path) -> Server {
    let mut start = crate::budgets::write_policy(dir, crate::budgets::TOOLS);
    start.args = vec!["--cluster-db".into(), pg.url()];
    Server::start_with(start)
}

fn requested(server: &Server, run: &str) -> usize {
    let (code, page) = server.get(
        &format!("/v1/audit/events?run_id={run}&limit=1000"),
        Some(ADMIN),
    );
    assert_eq!(code, 200, "{page}");
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool_requested")
        .count()
}

#[test]
fn a_dead_sidecars_claim_is_refused_with_its_holder_and_age_until_an_operator_clears_it() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (sidecar(&pg, tmp.path()), sidecar(&pg, tmp.path()));
    let run = a.create_run(json!({}));
    let keyed = json!({"role_id": "tester", "run_id": run, "lane_id": "ops",
        "tool_name": "gated", "arguments": {"n": 1}, "scope": {}, "idempotency_key": "k-dead"});
    let (code, first) = a.post("/v1/tool-calls", Some("demo-tester"), &keyed);
    assert_eq!(code, 200, "{first}");
    // The claim as a sidecar that died after executing, before storing the outcome,
    // leaves it: in flight, its node gone, ten minutes old.
    pg.psql(
        "UPDATE toolgate_idempotency SET state = 'in_flight', outcome = NULL, \
         node_id = 'node-dead', claimed_at = now() - interval '10 minutes' \
         WHERE idempotency_key = 'k-dead'",
    );
    let (code, body) = b.post("/v1/tool-calls", Some("demo-tester"), &keyed);
    assert_eq!(code, 409, "{body}");
    let d: &Value = &body["diagnostic"];
    assert_eq!(d["reason"], "idempotency_in_flight", "{body}");
    assert_eq!(d["retryable"], true, "{body}");
    assert_eq!(d["details"]["claimed_by"], "node-dead", "{body}");
    assert!(
        d["details"]["claim_age_ms"].as_i64().unwrap() >= 600_000,
        "{body}"
    );
    assert_eq!(
        requested(&a, &run) + requested(&b, &run),
        1,
        "nothing ran again"
    );
    // The operator's step 3 (the call's outcome is unknown to the fleet): the claim is
    // deleted, and the retry runs.
    pg.psql(
        "DELETE FROM toolgate_idempotency WHERE state = 'in_flight' AND run_id = (SELECT run_id FROM toolgate_idempotency WHERE idempotency_key = 'k-dead') AND idempotency_key = 'k-dead'",
    );
    let (code, again) = b.post("/v1/tool-calls", Some("demo-tester"), &keyed);
    assert_eq!(code, 200, "{again}");
    assert_eq!(requested(&a, &run) + requested(&b, &run), 2);
}
