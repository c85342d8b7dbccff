//! The audit hub with a real PostgreSQL (`common::postgres`): sidecars ship their logs,
//! `audit verify --cluster-db` checks every sidecar and the fleet log and names the
//! sidecar and seq of an edited hub row, a run export across sidecars verifies offline
//! and fails after a line is edited, a sidecar SIGKILLed under load ships every event
//! it acknowledged after its restart, and hostile input (a forged line, a replayed
//! old checkpoint, another sidecar's origin, an unreachable database) is refused with
//! a structured error and nothing accepted.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

pub(crate) use crate::common::fleet::{fleet_key, origin, research, shipped, toolgate};
use crate::common::fleet::{gauge, scrape, shipping_sidecar as sidecar, verify_hub};
use crate::common::postgres::Postgres;
use crate::common::{self, Server, Start};

fn verify_hub_pinned(url: &str, fingerprint: &str) -> (i32, Value, String) {
    toolgate(
        Path::new("."),
        &[
            "audit",
            "verify",
            "--cluster-db",
            url,
            "--fleet-key-fingerprint",
            fingerprint,
            "--format",
            "json",
        ],
    )
}

/// `audit export --cluster-db URL --run RUN --out OUT [--fleet-key-dir DIR]`.
pub(crate) fn export(
    url: &str,
    run: &str,
    out: &Path,
    fleet: Option<&Path>,
) -> (i32, Value, String) {
    let mut args = vec![
        "audit",
        "export",
        "--cluster-db",
        url,
        "--run",
        run,
        "--out",
        out.to_str().unwrap(),
    ];
    if let Some(dir) = fleet {
        args.extend(["--fleet-key-dir", dir.to_str().unwrap()]);
    }
    toolgate(out.parent().unwrap(), &args)
}

/// The signed manifest of a fleet export lists every event of the run: a bundle
/// missing a line fails, and so does one whose manifest was edited to match without
/// the fleet key; an export needs the fleet key the hub is bound to.
fn completeness_is_signed(url: &str, run: &str, tmp: &Path, fleet_dir: &Path) {
    let cut = |name: &str| -> (PathBuf, PathBuf, Value) {
        let out = tmp.join(name);
        let (code, _, text) = export(url, run, &out, Some(fleet_dir));
        assert_eq!(code, 0, "{text}");
        let manifest: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap())
                .unwrap();
        let events = out
            .join(manifest["sidecars"][0]["dir"].as_str().unwrap())
            .join("events.jsonl");
        let lines = std::fs::read_to_string(&events).unwrap();
        let kept: Vec<&str> = lines.lines().collect();
        assert!(kept.len() >= 2, "{lines}");
        let mut shorter = kept[..kept.len() - 1].join("\n");
        shorter.push('\n');
        std::fs::write(&events, shorter).unwrap();
        (out, events, manifest)
    };
    // A line removed from the bundle: the signed manifest still lists it.
    let (out, _, manifest) = cut("cut-line");
    let (code, text) = python_with(&out, &["--expect-run", run]);
    assert_eq!(code, 1, "{text}");
    let last = manifest["sidecars"][0]["seqs"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(text.contains(&format!("at seq {last}")), "{text}");
    // ... and the manifest edited to match, without the fleet key: its signature fails.
    let (out, _, mut manifest) = cut("cut-line-and-manifest");
    let entry = &mut manifest["sidecars"][0];
    entry["events"] = json!(entry["events"].as_u64().unwrap() - 1);
    entry["seqs"].as_array_mut().unwrap().pop();
    entry["leaf_hashes"].as_array_mut().unwrap().pop();
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap() + "\n",
    )
    .unwrap();
    let (code, text) = python_with(&out, &["--expect-run", run]);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("manifest.json does not verify"), "{text}");
    // Another run expected: refused.
    let out = tmp.join("intact");
    assert_eq!(export(url, run, &out, Some(fleet_dir)).0, 0);
    let (code, text) = python_with(&out, &["--expect-run", "run-other"]);
    assert_eq!(code, 1, "{text}");
    // No fleet key, or another one: no export.
    let (code, report, text) = export(url, run, &tmp.join("no-key"), None);
    assert_eq!(code, 4, "{text}");
    assert_eq!(report["error"], "fleet_key_missing", "{report}");
    let (other, _) = fleet_key(&tmp.join("other"));
    let (code, report, text) = export(url, run, &tmp.join("other-key"), Some(&other));
    assert_eq!(code, 3, "{text}");
    assert_eq!(report["error"], "hub_fleet_key_mismatch", "{report}");
}

fn python(dir: &Path) -> (i32, String) {
    python_with(dir, &[])
}

/// verify_export.py on a fleet export (`--fleet`).
pub(crate) fn python_with(dir: &Path, args: &[&str]) -> (i32, String) {
    let mut all = vec!["--fleet"];
    all.extend_from_slice(args);
    common::verify_export(dir, &all)
}

#[test]
fn sidecars_ship_the_hub_verifies_and_a_run_exports_across_them() {
    let pg = Postgres::start();
    let url = pg.url();
    let keys = tempfile::tempdir().unwrap();
    let (fleet_dir, fingerprint) = fleet_key(keys.path());
    let fleet: Vec<Server> = ["a", "b", "c"]
        .iter()
        .map(|n| sidecar(&url, &fleet_dir, n, None))
        .collect();
    let run = fleet[0].create_run(json!({"case_id": "C-1001"}));
    for (i, server) in fleet.iter().enumerate() {
        for q in 0..5 {
            let (code, body) = research(server, &run, &format!("duty {i} {q}"));
            assert_eq!(code, 200, "{body}");
        }
    }
    for server in &fleet {
        shipped(server);
    }
    let (code, report, text) = verify_hub(&url);
    assert_eq!(code, 0, "{text}");
    let sidecars = report["sidecars"].as_array().unwrap();
    assert_eq!(sidecars.len(), 3, "{report}");
    assert!(report["fleet_size"].as_u64().unwrap() >= 3, "{report}");
    // Every fleet checkpoint, whichever sidecar appended it, verifies with one key.
    assert_eq!(
        report["fleet_key_fingerprint"],
        json!(fingerprint),
        "{report}"
    );
    assert_eq!(report["fleet_key_confirmed"], json!(false), "{report}");
    let (code, report, text) = verify_hub_pinned(&url, &fingerprint);
    assert_eq!(code, 0, "{text}");
    assert_eq!(report["fleet_key_confirmed"], json!(true), "{report}");

    // The run across the three sidecars, verified offline.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("export");
    let (code, summary, text) = export(&url, &run, &out, Some(&fleet_dir));
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        summary["sidecars"].as_array().unwrap().len(),
        3,
        "{summary}"
    );
    // Every key pinned: the fleet key, and each sidecar's bound to its origin.
    let pins: Vec<String> = report["sidecars"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{}={}",
                s["origin"].as_str().unwrap(),
                s["key_fingerprint"].as_str().unwrap()
            )
        })
        .collect();
    let mut args = vec![
        "--expect-run",
        run.as_str(),
        "--fleet-key-fingerprint",
        fingerprint.as_str(),
    ];
    for pin in &pins {
        args.extend(["--key-fingerprint", pin.as_str()]);
    }
    let (code, text) = python_with(&out, &args);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("from 3 sidecars"), "{text}");
    completeness_is_signed(&url, &run, tmp.path(), &fleet_dir);
    // One line edited: the offline verifier names the sidecar and the seq.
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let entry = &manifest["sidecars"][1];
    let events = out
        .join(entry["dir"].as_str().unwrap())
        .join("events.jsonl");
    let lines = std::fs::read_to_string(&events).unwrap();
    let first: Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    let edited = lines.replacen("\"timestamp_utc\":\"2", "\"timestamp_utc\":\"1", 1);
    assert_ne!(edited, lines);
    std::fs::write(&events, edited).unwrap();
    let (code, text) = python(&out);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("at seq {}", first["seq"]))
            && text.contains(entry["origin"].as_str().unwrap()),
        "{text}"
    );

    // An insider edits a row in the hub: verify names the sidecar and the seq.
    let b = origin("b");
    pg.psql(&format!(
        "UPDATE hub_events SET line = replace(line, '\"timestamp_utc\":\"2', '\"timestamp_utc\":\"1') WHERE origin = '{b}' AND seq = 3"
    ));
    let (code, report, text) = verify_hub(&url);
    assert_eq!(code, 1, "{text}");
    assert_eq!(report["sidecar"], json!(b), "{report}");
    assert_eq!(report["seq"], json!(3), "{report}");
    assert_eq!(report["kind"], "edited", "{report}");
}

#[test]
fn a_sidecar_killed_under_load_ships_every_acknowledged_event_after_its_restart() {
    let pg = Postgres::start();
    let url = pg.url();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("b");
    let (fleet_dir, _) = fleet_key(tmp.path());
    let server = Arc::new(sidecar(&url, &fleet_dir, "b", Some(&data)));
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (server, run, stop, acknowledged) = (
                server.clone(),
                run.clone(),
                stop.clone(),
                acknowledged.clone(),
            );
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(30)))
                    .build()
                    .into();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({
                        "role_id": "research_agent", "run_id": run, "lane_id": "research",
                        "tool_name": "legal_search",
                        "arguments": {"query": format!("load {w} {i}")},
                        "scope": {"case_id": "C-1001"},
                    });
                    let answer = agent
                        .post(format!("{}/v1/tool-calls", server.base))
                        .header("Authorization", "Bearer demo-research_agent")
                        .send_json(&body);
                    match answer {
                        Ok(mut response) if response.status().as_u16() == 200 => {
                            let value: Value = response.body_mut().read_json().unwrap();
                            acknowledged
                                .lock()
                                .unwrap()
                                .push(value["call_id"].as_str().unwrap().to_string());
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                    i += 1;
                }
            })
        })
        .collect();
    // Kill it once some calls went through and some are shipped.
    assert!(common::poll_until(Duration::from_secs(60), || {
        acknowledged.lock().unwrap().len() >= 40
    }));
    let pid = server.pid();
    common::unsafe_free_kill(pid, "KILL");
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }
    drop(server);
    let acknowledged: HashSet<String> = acknowledged.lock().unwrap().iter().cloned().collect();
    let restarted = sidecar(&url, &fleet_dir, "b", Some(&data));
    shipped(&restarted);
    let (code, _, text) = verify_hub(&url);
    assert_eq!(code, 0, "{text}");
    let b = origin("b");
    let in_hub: HashSet<String> = pg
        .psql(&format!(
            "SELECT line::jsonb->>'call_id' FROM hub_events WHERE origin = '{b}' AND line::jsonb->>'type' = 'tool_executed'"
        ))
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let missing: Vec<&String> = acknowledged.difference(&in_hub).collect();
    assert!(
        missing.is_empty(),
        "acknowledged but not in the hub: {missing:?}"
    );
    // No duplicates: one row per seq, as many as the local log holds.
    let rows: u64 = pg
        .psql(&format!(
            "SELECT count(*) FROM hub_events WHERE origin = '{b}'"
        ))
        .trim()
        .parse()
        .unwrap();
    let local = gauge(&scrape(&restarted), "toolgate_hub_shipped_seq").unwrap();
    assert_eq!(rows, local);
}

#[test]
fn hostile_shipments_are_refused_and_nothing_is_accepted() {
    let pg = Postgres::start();
    let url = pg.url();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, _) = fleet_key(tmp.path());
    let a = sidecar(&url, &fleet_dir, "a", None);
    let run = a.create_run(json!({"case_id": "C-1001"}));
    for q in 0..3 {
        assert_eq!(research(&a, &run, &format!("q{q}")).0, 200);
    }
    shipped(&a);
    let a_origin = origin("a");
    let count = |origin: &str| -> String {
        pg.psql(&format!(
            "SELECT count(*) FROM hub_events WHERE origin = '{origin}'"
        ))
    };
    let before = count(&a_origin);

    // Another sidecar shipping under a's origin (its own key): refused, counted.
    let impostor = Server::start_with(Start {
        args: vec![
            "--cluster-db".into(),
            url.clone(),
            "--fleet-key-dir".into(),
            fleet_dir.display().to_string(),
            "--audit-origin".into(),
            a_origin.clone(),
            "--hub-ship-interval-ms".into(),
            "100".into(),
        ],
        ..Start::default()
    });
    let run2 = impostor.create_run(json!({"case_id": "C-1001"}));
    assert_eq!(research(&impostor, &run2, "x").0, 200, "calls go on");
    assert!(common::poll_until(Duration::from_secs(30), || {
        gauge(&scrape(&impostor), "toolgate_hub_ship_refusals_total").unwrap_or(0) > 0
    }));
    let lines = impostor.log_lines_with("hub_origin_key_mismatch");
    assert!(!lines.is_empty(), "no structured refusal in the logs");
    drop(impostor);
    assert_eq!(count(&a_origin), before);

    // Batches built by hand from a sidecar log that does not ship: a forged line and
    // a replayed checkpoint are refused; the hub keeps what it had.
    let d = Server::start_with(Start {
        data_dir: Some(tmp.path().join("d")),
        args: vec![
            "--audit-origin".into(),
            origin("d"),
            "--checkpoint-every-events".into(),
            "4".into(),
        ],
        ..Start::default()
    });
    let run3 = d.create_run(json!({"case_id": "C-1001"}));
    for q in 0..6 {
        assert_eq!(research(&d, &run3, &format!("d{q}")).0, 200);
    }
    let db = d.db();
    d.stop();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        use toolgate::hub::{Batch, HubError, ingest, ship::hub_size};
        let pool = toolgate::hub::connect(&url).await.unwrap();
        let reader = toolgate::audit::AuditReader::open(&db).unwrap();
        let keys = db.parent().unwrap().join("keys");
        let own = toolgate::audit::keys::load_signer(&keys).unwrap();
        let key = own.verifier.clone();
        // Fleet checkpoints are signed with the fleet key.
        let signer = toolgate::audit::keys::load_signer(&fleet_dir).unwrap();
        let notes = reader.notes_between(0, u64::MAX >> 2).unwrap();
        assert!(notes.len() >= 3, "{notes:?}");
        let lines = |upto: u64| -> Vec<(u64, String)> {
            reader
                .events(&toolgate::audit::EventFilter {
                    limit: upto as usize,
                    ..Default::default()
                })
                .unwrap()
                .into_iter()
                .map(|e| (e.seq, e.line))
                .collect()
        };
        let batch = |upto: u64, note: &str| Batch {
            origin: origin("d"),
            key: key.clone(),
            lines: lines(upto),
            checkpoint: note.to_string(),
        };
        let (first, middle, last) = (&notes[0], &notes[1], &notes[notes.len() - 1]);
        // Signed with another fleet key (d's own): refused, nothing written.
        let refused = ingest(&pool, &batch(middle.0, &middle.1), &own)
            .await
            .unwrap_err();
        assert_eq!(refused.reason(), "hub_fleet_key_mismatch", "{refused:?}");
        assert_eq!(refused.to_json()["sidecar"], json!(origin("d")));
        assert_eq!(hub_size(&pool, &origin("d")).await.unwrap(), 0);
        // The second checkpoint goes in.
        let ok = ingest(&pool, &batch(middle.0, &middle.1), &signer)
            .await
            .unwrap();
        assert_eq!(ok.size, middle.0);
        // The same batch again: idempotent.
        let again = ingest(&pool, &batch(middle.0, &middle.1), &signer)
            .await
            .unwrap();
        assert_eq!(again.new_lines, 0);
        // A replayed older checkpoint the hub never stored.
        let replayed = ingest(&pool, &batch(first.0, &first.1), &signer)
            .await
            .unwrap_err();
        assert!(
            matches!(replayed, HubError::Replayed { .. }),
            "{replayed:?}"
        );
        assert_eq!(replayed.to_json()["error"], "hub_checkpoint_replayed");
        // A forged line (still canonical JSON) under the newest checkpoint.
        let mut forged = batch(last.0, &last.1);
        let at = forged.lines.len() - 1;
        forged.lines[at].1 =
            forged.lines[at]
                .1
                .replacen("\"timestamp_utc\":\"2", "\"timestamp_utc\":\"1", 1);
        let refused = ingest(&pool, &forged, &signer).await.unwrap_err();
        assert!(
            matches!(
                refused,
                HubError::BadCheckpoint { .. } | HubError::Forged { .. }
            ),
            "{refused:?}"
        );
        assert_eq!(hub_size(&pool, &origin("d")).await.unwrap(), middle.0);
        // An injected row beyond the hub's size: the next honest batch is refused.
        let next = middle.0 + 1;
        pg.psql(&format!(
            "INSERT INTO hub_events (origin, seq, line) VALUES ('{}', {next}, 'forged')",
            origin("d")
        ));
        let refused = ingest(&pool, &batch(last.0, &last.1), &signer)
            .await
            .unwrap_err();
        assert_eq!(refused.reason(), "hub_fork", "{refused:?}");
        assert_eq!(hub_size(&pool, &origin("d")).await.unwrap(), middle.0);
    });
    // verify names the injected row.
    let (code, report, text) = verify_hub(&url);
    assert_eq!(code, 1, "{text}");
    assert_eq!(report["sidecar"], json!(origin("d")), "{report}");
    assert_eq!(report["kind"], "inserted", "{report}");

    // An unreachable database: a structured error, exit 4.
    let (code, report, text) = verify_hub("postgres://toolgate:x@127.0.0.1:1/toolgate");
    assert_eq!(code, 4, "{text}");
    assert_eq!(report["error"], "hub_unavailable", "{report}");
    drop(tmp);
}

/// Runs `serve` shipping to the hub at `url` under `name`'s origin with the fleet key
/// in `fleet` (None: no fleet key); it must exit (bounded): its code and the JSON
/// object it printed on stderr.
fn serve_exits(url: &str, name: &str, fleet: Option<&Path>) -> (i32, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let err = tmp.path().join("stderr");
    let mut command = std::process::Command::new(common::BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path().join("var"))
        .arg("--policy-dir")
        .arg(common::repo().join("policy"))
        .arg("--tools")
        .arg(common::repo().join("tools/tool_registry.yaml"))
        .args(["--cluster-db", url, "--audit-origin", &origin(name)])
        .env_remove("TOOLGATE_FLEET_KEY_DIR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap());
    if let Some(dir) = fleet {
        command.arg("--fleet-key-dir").arg(dir);
    }
    let mut child = command.spawn().unwrap();
    let Some(status) = common::poll_for(Duration::from_secs(30), || child.try_wait().unwrap())
    else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve as sidecar {name} did not exit");
    };
    let text = std::fs::read_to_string(&err).unwrap();
    let json = text
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["error"].is_string())
        })
        .unwrap_or_else(|| panic!("no JSON error on stderr: {text}"));
    (status.code().unwrap_or(-1), json)
}

#[test]
fn one_fleet_key_signs_every_fleet_checkpoint_and_another_key_is_refused() {
    let pg = Postgres::start();
    let url = pg.url();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, fingerprint) = fleet_key(tmp.path());
    let a = sidecar(&url, &fleet_dir, "a", None);
    let run = a.create_run(json!({"case_id": "C-1001"}));
    for q in 0..3 {
        assert_eq!(research(&a, &run, &format!("q{q}")).0, 200);
    }
    shipped(&a);
    let hub = || {
        pg.psql(
            "SELECT (SELECT count(*) FROM hub_logs) || '/' || (SELECT count(*) FROM hub_events) || '/' || (SELECT count(*) FROM hub_fleet) || '/' || (SELECT vkey FROM hub_fleet_head)",
        )
    };
    let before = hub();
    let bound = toolgate::audit::keys::load_verifier(&fleet_dir).unwrap();
    assert!(before.ends_with(&bound.to_vkey()), "{before}");

    // A sidecar that would ship without a fleet key does not start.
    let (code, error) = serve_exits(&url, "c", None);
    assert_eq!(code, 4, "{error}");
    assert_eq!(error["error"], "fleet_key_missing", "{error}");
    // A fleet key directory others can write is refused like a --key-dir.
    let loose = tmp.path().join("loose");
    let (loose_dir, _) = fleet_key(&loose);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&loose_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, error) = serve_exits(&url, "c", Some(&loose_dir));
    assert_eq!(code, 3, "{error}");
    assert_eq!(error["error"], "fleet_key_invalid", "{error}");
    // A sidecar with another fleet key: the hub refuses it and it does not start.
    let other = tmp.path().join("other");
    let (other_dir, other_fingerprint) = fleet_key(&other);
    assert_ne!(other_fingerprint, fingerprint);
    let (code, error) = serve_exits(&url, "c", Some(&other_dir));
    assert_eq!(code, 3, "{error}");
    assert_eq!(error["error"], "hub_fleet_key_mismatch", "{error}");
    assert_eq!(error["sidecar"], json!(origin("c")), "{error}");
    assert_eq!(hub(), before, "the hub changed");

    // A pin on another fingerprint fails verify (exit 3) even on an intact hub.
    let (code, report, text) = verify_hub_pinned(&url, &other_fingerprint);
    assert_eq!(code, 3, "{text}");
    assert_eq!(report["kind"], "key", "{report}");
    assert_eq!(report["sidecar"], "toolgate/fleet", "{report}");

    // An insider re-signs one fleet checkpoint with another key: verify names the
    // fleet seq.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let seq = runtime.block_on(async {
        use toolgate::audit::checkpoint::verify_note;
        let pool = toolgate::hub::connect(&url).await.unwrap();
        let client = pool.get().await.unwrap();
        let row = client
            .query_one("SELECT seq, note FROM hub_fleet ORDER BY seq LIMIT 1", &[])
            .await
            .unwrap();
        let (seq, note): (i64, String) = (row.get(0), row.get(1));
        let checkpoint = verify_note(&note, &bound).unwrap();
        let forger = toolgate::audit::keys::SignerKey::from_seed(&bound.name, [9u8; 32]).unwrap();
        let forged = checkpoint.sign(&forger);
        assert_ne!(forged, note);
        client
            .execute(
                "UPDATE hub_fleet SET note = $1 WHERE seq = $2",
                &[&forged, &seq],
            )
            .await
            .unwrap();
        seq
    });
    let (code, report, text) = verify_hub(&url);
    assert_eq!(code, 3, "{text}");
    assert_eq!(report["kind"], "signature", "{report}");
    assert_eq!(report["sidecar"], "toolgate/fleet", "{report}");
    assert_eq!(report["seq"], json!(seq), "{report}");
}

#[test]
fn shipping_waits_out_a_database_outage_with_nothing_lost_or_duplicated() {
    let mut pg = Postgres::start();
    let url = pg.url();
    let keys = tempfile::tempdir().unwrap();
    let (fleet_dir, _) = fleet_key(keys.path());
    let a = sidecar(&url, &fleet_dir, "a", None);
    let run = a.create_run(json!({"case_id": "C-1001"}));
    assert_eq!(research(&a, &run, "before").0, 200);
    shipped(&a);
    pg.stop();
    // Calls are refused while the fleet's state is unreachable; each refusal is still
    // recorded in the local log first, and waits there for the hub.
    for q in 0..3 {
        let (code, body) = research(&a, &run, &format!("during {q}"));
        assert_ne!(code, 200, "{body}");
    }
    assert!(common::poll_until(Duration::from_secs(30), || {
        let m = scrape(&a);
        gauge(&m, "toolgate_hub_ship_failures_total").unwrap_or(0) > 0
            && gauge(&m, "toolgate_hub_ship_lag_events").unwrap_or(0) > 0
    }));
    pg.restart();
    assert!(common::poll_until(Duration::from_secs(60), || research(
        &a, &run, "after"
    )
    .0 == 200));
    shipped(&a);
    let (code, _, text) = verify_hub(&url);
    assert_eq!(code, 0, "{text}");
    // The refusals' run could not be marked as held while the database was down; the
    // owed mark was written and, with everything shipped, removed again.
    assert_eq!(pg.psql("SELECT count(*) FROM hub_unshipped"), "0");
    let rows: u64 = pg
        .psql(&format!(
            "SELECT count(DISTINCT seq) FROM hub_events WHERE origin = '{}'",
            origin("a")
        ))
        .trim()
        .parse()
        .unwrap();
    let shipped_seq = gauge(&scrape(&a), "toolgate_hub_shipped_seq").unwrap();
    assert_eq!(rows, shipped_seq);
    let local = common::run(
        Path::new("."),
        &[
            "audit",
            "tail",
            "--db",
            a.db().to_str().unwrap(),
            "--limit",
            "1",
        ],
    );
    let newest: Value = serde_json::from_str(local.1.lines().last().unwrap()).unwrap();
    assert_eq!(newest["seq"].as_u64().unwrap(), shipped_seq, "{}", local.1);
}
