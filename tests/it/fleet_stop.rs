//! A fleet's tail at a graceful stop (issue 38, finding 8), with a real PostgreSQL and
//! two shipping sidecars whose shippers would not run again for ten minutes: SIGTERM
//! right after their last calls ships those calls to the hub before the sidecars exit,
//! and the fleet export holds them and verifies; a sidecar stopped while the hub is
//! unreachable logs it, the fleet export says it is not complete (naming that
//! sidecar) until the sidecar starts again and ships its tail.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::postgres::Postgres;
use crate::common::{Server, Start};
use crate::fleet_audit::{export, fleet_key, origin, python_with, research, shipped};

/// How long a stopping sidecar may take (the demo policy's drain time is 31 s).
const STOP_WITHIN: Duration = Duration::from_secs(60);

/// A shipping sidecar whose shipper runs once at start and then not for ten minutes:
/// whatever the hub gets of its later events, it gets at the stop.
fn sidecar(url: &str, fleet: &Path, name: &str, data_dir: &Path) -> Server {
    sidecar_shipping_every(url, fleet, name, data_dir, "600000")
}

/// A shipping sidecar whose shipper runs every `interval_ms`.
fn sidecar_shipping_every(
    url: &str,
    fleet: &Path,
    name: &str,
    data_dir: &Path,
    interval_ms: &str,
) -> Server {
    Server::start_with(Start {
        data_dir: Some(data_dir.to_path_buf()),
        args: vec![
            "--cluster-db".into(),
            url.to_string(),
            "--fleet-key-dir".into(),
            fleet.display().to_string(),
            "--audit-origin".into(),
            origin(name),
            "--hub-ship-interval-ms".into(),
            interval_ms.into(),
        ],
        ..Start::default()
    })
}

/// The events of a fleet export, all sidecars together.
fn exported_events(out: &Path) -> Vec<Value> {
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let mut events = Vec::new();
    for sidecar in manifest["sidecars"].as_array().unwrap() {
        let path = out
            .join(sidecar["dir"].as_str().unwrap())
            .join("events.jsonl");
        for line in std::fs::read_to_string(path).unwrap().lines() {
            events.push(serde_json::from_str(line).unwrap());
        }
    }
    events
}

/// Whether the export holds the closing event of `call`, made by sidecar `name`.
fn holds_call(out: &Path, call: &Value, name: &str) -> bool {
    let call_id = call["call_id"].as_str().unwrap();
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let dir = manifest["sidecars"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["origin"] == origin(name))
        .map(|s| out.join(s["dir"].as_str().unwrap()));
    let Some(dir) = dir else { return false };
    std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .any(|e| e["call_id"] == call_id && e["type"] == "tool_executed")
}

#[test]
fn two_sidecars_stopped_right_after_their_last_calls_ship_them_and_the_fleet_export_is_complete() {
    let pg = Postgres::start();
    let url = pg.url();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, fingerprint) = fleet_key(tmp.path());
    let mut a = sidecar(&url, &fleet_dir, "a", &tmp.path().join("a"));
    let mut b = sidecar(&url, &fleet_dir, "b", &tmp.path().join("b"));
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let (code, through_a) = research(&a, &run, "the last call through a");
    assert_eq!(code, 200, "{through_a}");
    let (code, through_b) = research(&b, &run, "the last call through b");
    assert_eq!(code, 200, "{through_b}");

    // Both stopped at once, right away: no shipping round ran since the calls.
    a.terminate();
    b.terminate();
    assert!(a.wait_exit(STOP_WITHIN).success());
    assert!(b.wait_exit(STOP_WITHIN).success());

    let out = tmp.path().join("export");
    let (code, summary, text) = export(&url, &run, &out, Some(&fleet_dir));
    assert_eq!(code, 0, "{text}");
    assert_eq!(summary["complete"], json!(true), "{summary}");
    assert_eq!(summary["warnings"], json!([]), "{summary}");
    assert!(holds_call(&out, &through_a, "a"), "{text}");
    assert!(holds_call(&out, &through_b, "b"), "{text}");
    let (code, text) = python_with(
        &out,
        &[
            "--expect-run",
            run.as_str(),
            "--fleet-key-fingerprint",
            fingerprint.as_str(),
        ],
    );
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("from 2 sidecars"), "{text}");
    // Nothing is left marked as held by a sidecar.
    assert_eq!(pg.psql("SELECT count(*) FROM hub_unshipped"), "0");
}

#[test]
fn a_sidecar_stopped_while_the_hub_is_down_leaves_the_export_incomplete_until_it_ships_at_its_next_start()
 {
    let mut pg = Postgres::start();
    let url = pg.url();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, fingerprint) = fleet_key(tmp.path());
    let data_b = tmp.path().join("b");
    let mut a = sidecar(&url, &fleet_dir, "a", &tmp.path().join("a"));
    let mut b = sidecar(&url, &fleet_dir, "b", &data_b);
    let run = a.create_run(json!({"case_id": "C-1001"}));
    let (code, through_a) = research(&a, &run, "through a");
    assert_eq!(code, 200, "{through_a}");
    a.terminate();
    assert!(a.wait_exit(STOP_WITHIN).success());
    let (code, through_b) = research(&b, &run, "through b, then the hub goes down");
    assert_eq!(code, 200, "{through_b}");

    // The hub is unreachable when b stops: b says so and exits.
    pg.stop();
    b.terminate();
    assert!(b.wait_exit(STOP_WITHIN).success());
    let said = b.log_lines_with("did not take this sidecar's last events");
    assert_eq!(said.len(), 1, "no log line about the tail left behind");
    assert!(said[0].contains(&origin("b")), "{}", said[0]);
    pg.restart();

    // The export holds what the hub has, and says it is not complete, naming b.
    let out = tmp.path().join("while-b-holds-its-tail");
    let (code, summary, text) = export(&url, &run, &out, Some(&fleet_dir));
    assert_eq!(code, 0, "{text}");
    assert_eq!(summary["complete"], json!(false), "{summary}");
    let warnings = summary["warnings"].to_string();
    assert!(
        warnings.contains(&origin("b")) && warnings.contains("not complete"),
        "{summary}"
    );
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["complete"], json!(false), "{manifest}");
    assert_eq!(
        manifest["unshipped"][0]["origin"],
        json!(origin("b")),
        "{manifest}"
    );
    assert!(holds_call(&out, &through_a, "a"));
    assert!(!holds_call(&out, &through_b, "b"));
    assert!(
        exported_events(&out)
            .iter()
            .all(|e| e["call_id"] != through_b["call_id"])
    );
    // The offline verifier checks what it holds, and refuses it as the complete run.
    let pins = ["--fleet-key-fingerprint", fingerprint.as_str()];
    let (code, text) = python_with(&out, &pins);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("NOT complete"), "{text}");
    let mut expect = pins.to_vec();
    expect.extend(["--expect-run", run.as_str()]);
    let (code, text) = python_with(&out, &expect);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("not complete"), "{text}");

    // b starts again with its data directory: the tail ships, and the export is
    // complete.
    let b = sidecar_shipping_every(&url, &fleet_dir, "b", &data_b, "100");
    shipped(&b);
    let out = tmp.path().join("after-b-shipped");
    let (code, summary, text) = export(&url, &run, &out, Some(&fleet_dir));
    assert_eq!(code, 0, "{text}");
    assert_eq!(summary["complete"], json!(true), "{summary}");
    assert!(holds_call(&out, &through_a, "a"));
    assert!(holds_call(&out, &through_b, "b"));
    let (code, text) = python_with(&out, &expect);
    assert_eq!(code, 0, "{text}");
}
