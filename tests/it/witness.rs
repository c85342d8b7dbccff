//! Witnesses (`serve --witness`, `audit verify --witness-key --quorum`): a C2SP
//! tlog-witness written here (a small HTTP server speaking `add-checkpoint`, keeping
//! its own newest size and root per origin, verifying the log's signature and the
//! consistency proofs, cosigning with `cosignature/v1`) against the real gateway.
//! Covers: checkpoints get cosigned and verify offline with a quorum; a forked log
//! with the same key is refused by the witness and cannot reach a quorum; a witness
//! that is down never stops calls and its gap shows in /metrics and verify; a restart
//! resumes from the stored cosignatures; a cosignature lost before it was stored is
//! collected again, not taken for a fork; an edited cosignature fails verify. In a
//! fleet (real PostgreSQL): three sidecars submit the fleet checkpoint, its
//! cosignatures are stored in the hub and reach a quorum in `audit verify
//! --cluster-db` and the offline verifier, and a witness that saw a fork of the fleet
//! log refuses it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{Value, json};

use toolgate::audit::checkpoint::verify_note;
use toolgate::audit::keys::VerifierKey;
use toolgate::audit::merkle::verify_consistency;
use toolgate::audit::witness::{WitnessKey, cosigned_message};

use crate::common::postgres::Postgres;
use crate::common::{self, Server, Start};

/// What the witness has seen, for the test's assertions.
#[derive(Default)]
struct WitnessState {
    /// The newest (size, root) it cosigned for the log's origin.
    latest: Option<(u64, [u8; 32])>,
    /// Every status it answered, in order.
    answers: Vec<u16>,
}

/// A tlog-witness for one log origin, on 127.0.0.1:0.
struct TestWitness {
    url: String,
    key: WitnessKey,
    state: Arc<Mutex<WitnessState>>,
}

impl TestWitness {
    /// A witness trusting the log key in `log_vkey` (read at each request: the
    /// gateway creates it at its first start) for `origin`.
    fn start(name: &str, seed: u8, origin: &str, log_vkey: PathBuf) -> TestWitness {
        let signing = SigningKey::from_bytes(&[seed; 32]);
        let key = WitnessKey::new(name, signing.verifying_key());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/w", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(WitnessState::default()));
        let shared = state.clone();
        let origin = origin.to_string();
        let name = name.to_string();
        let key_id = key.key_id;
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (state, origin, name, vkey) = (
                    shared.clone(),
                    origin.clone(),
                    name.clone(),
                    log_vkey.clone(),
                );
                let signing = signing.clone();
                std::thread::spawn(move || {
                    serve_one(stream, |body| {
                        let answer =
                            add_checkpoint(&state, &origin, &vkey, &signing, &name, key_id, body);
                        state.lock().unwrap().answers.push(answer.0);
                        answer
                    })
                });
            }
        });
        TestWitness { url, key, state }
    }

    /// The `--witness` flag value.
    fn flag(&self) -> String {
        format!("{}+{}", self.url, self.key.to_vkey())
    }

    fn latest(&self) -> Option<(u64, [u8; 32])> {
        self.state.lock().unwrap().latest
    }

    fn answers(&self) -> Vec<u16> {
        self.state.lock().unwrap().answers.clone()
    }
}

/// Reads one HTTP/1.1 request, answers it with `handle(body)` and closes.
fn serve_one(mut stream: TcpStream, handle: impl FnOnce(&str) -> (u16, &'static str, String)) {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length.min(1 << 20)];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let (status, content_type, text) = if request_line.starts_with("POST /w/add-checkpoint ") {
        handle(&String::from_utf8_lossy(&body))
    } else {
        (404, "text/plain", "not found\n".to_string())
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

/// The add-checkpoint rules of c2sp.org/tlog-witness.
fn add_checkpoint(
    state: &Mutex<WitnessState>,
    origin: &str,
    log_vkey: &Path,
    signing: &SigningKey,
    name: &str,
    key_id: [u8; 4],
    body: &str,
) -> (u16, &'static str, String) {
    let plain = "text/plain";
    let Some((head, note)) = body.split_once("\n\n") else {
        return (400, plain, "no blank line\n".into());
    };
    let mut lines = head.lines();
    let Some(old) = lines
        .next()
        .and_then(|l| l.strip_prefix("old "))
        .and_then(|n| n.parse::<u64>().ok())
    else {
        return (400, plain, "no old size line\n".into());
    };
    let proof: Vec<[u8; 32]> = match lines
        .map(|l| B64.decode(l).ok().and_then(|b| b.try_into().ok()))
        .collect::<Option<Vec<_>>>()
    {
        Some(proof) if proof.len() <= 63 => proof,
        _ => return (400, plain, "bad proof line\n".into()),
    };
    if !note.starts_with(&format!("{origin}\n")) {
        return (404, plain, "unknown origin\n".into());
    }
    let Ok(vkey) = std::fs::read_to_string(log_vkey) else {
        return (404, plain, "no key for the origin yet\n".into());
    };
    let log_key = VerifierKey::parse_vkey(&vkey).unwrap();
    let Ok(checkpoint) = verify_note(note, &log_key) else {
        return (403, plain, "no valid signature by the log key\n".into());
    };
    if old > checkpoint.size {
        return (400, plain, "old size beyond the checkpoint\n".into());
    }
    // Checked and updated under one lock: atomic, as the protocol requires.
    let mut state = state.lock().unwrap();
    let (have_size, have_root) = state.latest.unwrap_or((0, [0u8; 32]));
    if old != have_size {
        return (409, "text/x.tlog.size", format!("{have_size}\n"));
    }
    if old == checkpoint.size {
        if have_root != checkpoint.root {
            return (409, "text/x.tlog.size", format!("{have_size}\n"));
        }
    } else if old == 0 {
        if !proof.is_empty() {
            return (422, plain, "a proof from size 0\n".into());
        }
    } else if !verify_consistency(old, checkpoint.size, &proof, &have_root, &checkpoint.root) {
        return (422, plain, "the consistency proof does not verify\n".into());
    }
    state.latest = Some((checkpoint.size, checkpoint.root));
    drop(state);
    let text_end = note.rfind("\n\n").unwrap() + 1;
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signature = signing.sign(cosigned_message(time, &note[..text_end]).as_bytes());
    let mut bytes = key_id.to_vec();
    bytes.extend_from_slice(&time.to_be_bytes());
    bytes.extend_from_slice(&signature.to_bytes());
    (
        200,
        plain,
        format!("\u{2014} {name} {}\n", B64.encode(bytes)),
    )
}

/// Fast checkpoints and witness rounds, so tests wait tens of milliseconds.
fn args(witnesses: &[String]) -> Vec<String> {
    let mut out: Vec<String> = [
        "--checkpoint-every-events",
        "4",
        "--checkpoint-interval-ms",
        "100",
        "--witness-interval-ms",
        "50",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for w in witnesses {
        out.push("--witness".into());
        out.push(w.clone());
    }
    out
}

fn start(data_dir: &Path, witnesses: &[String]) -> Server {
    Server::start_with(Start {
        data_dir: Some(data_dir.to_path_buf()),
        args: args(witnesses),
        ..Start::default()
    })
}

/// Makes `n` successful calls.
fn calls(server: &Server, n: usize) {
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    for i in 0..n {
        let (code, body) = server.call(
            "research_agent",
            &run,
            "research",
            "legal_search",
            json!({"query": format!("q{i}")}),
            scope.clone(),
        );
        assert_eq!(code, 200, "{body}");
    }
}

/// The newest checkpoint of the log once it covers every event (the timed checkpoint
/// over the last calls is written up to `--checkpoint-interval-ms` after them), so no
/// newer checkpoint reaches a witness after this returns unless more events come.
fn newest_checkpoint(db: &Path) -> u64 {
    common::poll_for(Duration::from_secs(30), || {
        let (checkpoint, events) = sizes(db);
        (checkpoint == events).then_some(checkpoint)
    })
    .unwrap_or_else(|| panic!("no checkpoint covered every event: {:?}", sizes(db)))
}

/// The size of the newest stored checkpoint and the number of events.
fn sizes(db: &Path) -> (u64, u64) {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.query_row(
        "SELECT (SELECT coalesce(max(size), 0) FROM checkpoints), \
                (SELECT coalesce(max(seq), 0) FROM events)",
        [],
        |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
    )
    .unwrap()
}

/// Waits until the sidecar stored `witness`'s cosignature of `size` (its own count;
/// the witness holds its cosignature before the sidecar has read the answer).
fn wait_stored(server: &Server, witness: &TestWitness, size: u64) {
    assert!(
        common::poll_until(Duration::from_secs(30), || series(
            &scrape(server),
            "toolgate_witness_cosigned_size",
            &witness.key.name
        ) >= size),
        "{}",
        scrape(server)
    );
}

fn scrape(server: &Server) -> String {
    let mut response = ureq::get(format!("{}/metrics", server.base))
        .call()
        .unwrap();
    response.body_mut().read_to_string().unwrap()
}

/// The value of one series (`name{witness="w"}`), 0 if absent.
fn series(text: &str, name: &str, witness: &str) -> u64 {
    let prefix = format!("{name}{{witness=\"{witness}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs audit/verify_export.py on an export with witness keys and a quorum (and
/// `extra` flags, `--fleet` for a fleet export).
fn python(dir: &Path, keys: &[&WitnessKey], quorum: usize, extra: &[&str]) -> (i32, String) {
    let quorum = quorum.to_string();
    let vkeys: Vec<String> = keys.iter().map(|key| key.to_vkey()).collect();
    let mut args: Vec<&str> = extra.to_vec();
    args.extend(["--quorum", &quorum]);
    for vkey in &vkeys {
        args.extend(["--witness-key", vkey.as_str()]);
    }
    common::verify_export(dir, &args)
}

fn verify(dir: &Path, db: &Path, keys: &[&WitnessKey], quorum: usize) -> (i32, Value) {
    let mut owned: Vec<String> = vec![
        "audit".into(),
        "verify".into(),
        "--db".into(),
        db.display().to_string(),
        "--format".into(),
        "json".into(),
        "--quorum".into(),
        quorum.to_string(),
    ];
    for key in keys {
        owned.push("--witness-key".into());
        owned.push(key.to_vkey());
    }
    let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
    let (code, out, err) = common::run(dir, &refs);
    let value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}\n{err}"));
    (code, value)
}

#[test]
fn checkpoints_are_cosigned_verified_with_a_quorum_and_resumed_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let vkey = data.join("keys/audit-signing.vkey");
    let w1 = TestWitness::start("w1.example/witness", 11, "toolgate/audit", vkey.clone());
    let w2 = TestWitness::start("w2.example/witness", 12, "toolgate/audit", vkey);
    let server = start(&data, &[w1.flag(), w2.flag()]);
    calls(&server, 6);
    let db = server.db();
    let target = newest_checkpoint(&db);
    assert!(target >= 4, "no checkpoint was stored ({target})");
    for w in [&w1, &w2] {
        assert!(
            common::poll_until(Duration::from_secs(30), || w
                .latest()
                .is_some_and(|l| l.0 >= target)),
            "witness {} did not cosign size {target}: {:?}",
            w.key.name,
            w.answers()
        );
    }
    wait_stored(&server, &w1, target);
    wait_stored(&server, &w2, target);
    server.stop();
    let (code, report) = verify(tmp.path(), &db, &[&w1.key, &w2.key], 2);
    assert_eq!(code, 0, "{report}");
    assert!(report["witnesses"]["witnessed_size"].as_u64().unwrap() >= target);

    // The export carries the cosignatures; the offline verifier checks the quorum.
    let out = tmp.path().join("export");
    let (code, stdout, stderr) = common::run(
        tmp.path(),
        &["audit", "verify", "--db", db.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (code, stdout, stderr) = common::run(
        tmp.path(),
        &[
            "audit",
            "export",
            "--db",
            db.to_str().unwrap(),
            "--format",
            "jsonl",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (code, text) = python(&out, &[&w1.key, &w2.key], 2, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("witnessed up to size"), "{text}");
    let stranger = WitnessKey::new(
        "stranger.example/w",
        SigningKey::from_bytes(&[99; 32]).verifying_key(),
    );
    let (code, text) = python(&out, &[&w1.key, &stranger], 2, &[]);
    assert_eq!(code, 3, "{text}");

    // A restart resumes from the stored cosignatures: no 409 (a resync) is needed.
    let before = w1.answers().len();
    let server = start(&data, &[w1.flag(), w2.flag()]);
    calls(&server, 6);
    let target = newest_checkpoint(&server.db());
    assert!(common::poll_until(Duration::from_secs(30), || w1
        .latest()
        .is_some_and(|l| l.0 >= target)));
    let after: Vec<u16> = w1.answers()[before..].to_vec();
    assert!(after.iter().all(|&s| s == 200), "{after:?}");
    server.stop();

    // An edited cosignature: verify fails with a signature problem (exit 3).
    let file = data.join("cosigned-checkpoints.log");
    let text = std::fs::read_to_string(&file).unwrap();
    let line = text
        .lines()
        .rfind(|l| l.starts_with("\u{2014} w2.example/witness "))
        .unwrap()
        .to_string();
    let sig = line.rsplit(' ').next().unwrap();
    let mut bytes = B64.decode(sig).unwrap();
    bytes[20] ^= 1;
    let edited = text.replace(
        &line,
        &format!("\u{2014} w2.example/witness {}", B64.encode(bytes)),
    );
    std::fs::write(&file, edited).unwrap();
    let (code, report) = verify(tmp.path(), &db, &[&w1.key, &w2.key], 2);
    assert_eq!(code, 3, "{report}");
    assert_eq!(report["kind"], "witness");
}

/// The sidecar stopped between the witness's answer and the store (here: the
/// cosignature file is gone, as after a crash at that moment or an older copy put
/// back): at the restart the witness stands beyond what the log stored. That is not a
/// fork, and nothing is counted as a conflict:
/// - the witness at the newest checkpoint: the task rebuilds the edge at its size and
///   offers the same checkpoint with an empty proof, which the witness cosigns again
///   only because its root is the log's;
/// - the witness behind the newest checkpoint: the proof starts from its size.
#[test]
fn a_cosignature_lost_before_it_was_stored_is_collected_again_without_a_conflict() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let w = TestWitness::start(
        "lost.example/w",
        41,
        "toolgate/audit",
        data.join("keys/audit-signing.vkey"),
    );
    let file = data.join("cosigned-checkpoints.log");
    let server = start(&data, &[w.flag()]);
    calls(&server, 5);
    let target = newest_checkpoint(&server.db());
    wait_stored(&server, &w, target);
    let db = server.db();
    server.stop();
    assert_eq!(w.latest().map(|l| l.0), Some(target));
    std::fs::remove_file(&file).unwrap();

    // The start's own event (`policy_loaded`) stays out of any checkpoint for a
    // minute: the newest checkpoint is the one the witness holds.
    let mut slow = args(&[w.flag()]);
    for (flag, value) in [
        ("--checkpoint-every-events", "1000"),
        ("--checkpoint-interval-ms", "60000"),
    ] {
        let at = slow.iter().position(|a| a == flag).unwrap();
        slow[at + 1] = value.into();
    }
    // Each restart ends the same way: the cosignature of `size` is stored again, no
    // conflict is counted, and verify finds the witness at `size` at least (the stop
    // signs a last checkpoint over the start's event, which may be cosigned too).
    // Returns the witness's answers up to the stop.
    let finish = |server: Server, size: u64, before: usize| {
        wait_stored(&server, &w, size);
        let metrics = scrape(&server);
        let answers = w.answers()[before..].to_vec();
        server.stop();
        let conflicts = series(&metrics, "toolgate_witness_conflicts_total", &w.key.name);
        assert_eq!(conflicts, 0, "{metrics}");
        let (code, report) = verify(tmp.path(), &db, &[&w.key], 1);
        assert_eq!(code, 0, "{report}");
        assert!(report["witnesses"]["witnessed_size"].as_u64() >= Some(size));
        answers
    };
    let before = w.answers().len();
    let server = Server::start_with(Start {
        data_dir: Some(data.clone()),
        args: slow,
        ..Start::default()
    });
    assert_eq!(sizes(&db), (target, target + 1));
    // One 409 naming the witness's size, then the same checkpoint cosigned again.
    assert_eq!(finish(server, target, before), [409, 200]);

    // Lost again; this time the log has grown past the witness (the events of the
    // starts are checkpointed at once).
    std::fs::remove_file(&file).unwrap();
    let before = w.answers().len();
    let server = start(&data, &[w.flag()]);
    let newest = newest_checkpoint(&server.db());
    assert!(newest > target, "{newest} {target}");
    // One 409, then cosignatures (one per checkpoint the rounds saw).
    let answers = finish(server, newest, before);
    assert_eq!(answers[0], 409, "{answers:?}");
    assert!(answers[1..].iter().all(|&a| a == 200), "{answers:?}");
}

#[test]
fn a_down_witness_never_stops_calls_and_its_gap_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let up = TestWitness::start(
        "up.example/w",
        21,
        "toolgate/audit",
        data.join("keys/audit-signing.vkey"),
    );
    // A witness that is down: nothing listens on its port.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let down_url = format!("http://{}/w", closed.local_addr().unwrap());
    drop(closed);
    let down_key = WitnessKey::new(
        "down.example/w",
        SigningKey::from_bytes(&[22; 32]).verifying_key(),
    );
    let server = start(
        &data,
        &[up.flag(), format!("{down_url}+{}", down_key.to_vkey())],
    );
    calls(&server, 8);
    let target = newest_checkpoint(&server.db());
    assert!(common::poll_until(Duration::from_secs(30), || up
        .latest()
        .is_some_and(|l| l.0 >= target)));
    let metrics = common::poll_for(Duration::from_secs(30), || {
        let m = scrape(&server);
        // Each witness's task reads the newest checkpoint at its own pace: wait until
        // the down witness's round has seen `target` too.
        (series(&m, "toolgate_witness_failures_total", "down.example/w") > 0
            && series(&m, "toolgate_witness_lag_events", "down.example/w") >= target)
            .then_some(m)
    })
    .expect("the down witness's failures and its whole gap were never shown");
    assert_eq!(
        series(&metrics, "toolgate_witness_cosigned_size", "down.example/w"),
        0,
        "{metrics}"
    );
    assert!(
        series(&metrics, "toolgate_witness_lag_events", "down.example/w") >= target,
        "{metrics}"
    );
    assert_eq!(
        series(&metrics, "toolgate_witness_lag_events", "up.example/w"),
        series(&metrics, "toolgate_witness_checkpoint_size", "up.example/w")
            - series(&metrics, "toolgate_witness_cosigned_size", "up.example/w"),
    );
    let db = server.db();
    server.stop();
    // A quorum of both fails; one of two passes and reports the gap.
    let (code, report) = verify(tmp.path(), &db, &[&up.key, &down_key], 2);
    assert_eq!(code, 3, "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("`down.example/w` cosigned nothing"),
        "{report}"
    );
    let (code, report) = verify(tmp.path(), &db, &[&up.key, &down_key], 1);
    assert_eq!(code, 0, "{report}");
    assert!(report["witnesses"]["witnessed_size"].as_u64().unwrap() >= target);
}

#[test]
fn a_forked_log_under_the_same_key_is_refused_by_the_witness() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("a");
    let witness = TestWitness::start(
        "w.example/fork",
        31,
        "toolgate/audit",
        first.join("keys/audit-signing.vkey"),
    );
    let server = start(&first, &[witness.flag()]);
    calls(&server, 6);
    let target = newest_checkpoint(&server.db());
    assert!(common::poll_until(Duration::from_secs(30), || witness
        .latest()
        .is_some_and(|l| l.0 >= target)));
    server.stop();
    let cosigned = witness.latest().unwrap();

    // An insider copies the key and starts another history: the same key, the same
    // origin, other events.
    let second = tmp.path().join("b");
    std::fs::create_dir_all(&second).unwrap();
    let keys = second.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    for name in ["audit-signing.key", "audit-signing.vkey", "audit-hmac.key"] {
        std::fs::copy(first.join("keys").join(name), keys.join(name)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o700)).unwrap();
    let server = start(&second, &[witness.flag()]);
    calls(&server, 12);
    assert!(
        common::poll_until(Duration::from_secs(30), || {
            let answers = witness.answers();
            answers.contains(&409) && answers.contains(&422)
        }),
        "{:?}",
        witness.answers()
    );
    // The witness still holds the first history; it cosigned nothing of the fork.
    assert_eq!(witness.latest(), Some(cosigned));
    // The witness counts its answer before the sidecar has read it: wait for the
    // sidecar's own count.
    let metrics = common::poll_for(Duration::from_secs(30), || {
        let m = scrape(&server);
        (series(&m, "toolgate_witness_conflicts_total", "w.example/fork") > 0).then_some(m)
    })
    .expect("the sidecar never counted the witness's refusals");
    // Every round after the first sends the proof from the size the witness holds and
    // gets a 422: each is counted as a conflict, not only the first 409.
    assert!(
        common::poll_until(Duration::from_secs(30), || series(
            &scrape(&server),
            "toolgate_witness_conflicts_total",
            "w.example/fork"
        ) >= 3),
        "the 422 refusals of the forked log were not counted: {}",
        scrape(&server)
    );
    // The forked log holds no cosignature: the size the witness stands at is the
    // other history's, and the whole forked log shows as the gap.
    assert_eq!(
        series(&metrics, "toolgate_witness_cosigned_size", "w.example/fork"),
        0,
        "{metrics}"
    );
    assert_eq!(
        series(&metrics, "toolgate_witness_lag_events", "w.example/fork"),
        series(
            &metrics,
            "toolgate_witness_checkpoint_size",
            "w.example/fork"
        ),
        "{metrics}"
    );
    // Calls go on.
    calls(&server, 1);
    let db = server.db();
    server.stop();
    assert!(!second.join("cosigned-checkpoints.log").exists());
    let (code, report) = verify(tmp.path(), &db, &[&witness.key], 1);
    assert_eq!(code, 3, "{report}");

    // A checkpoint of the cosigned size with another root (signed with the stolen
    // key) is refused with 409 and the size the witness holds.
    let signer = toolgate::audit::keys::load_signer(&first.join("keys")).unwrap();
    let forged = toolgate::audit::checkpoint::Checkpoint {
        origin: "toolgate/audit".into(),
        size: cosigned.0,
        root: [7u8; 32],
    }
    .sign(&signer);
    let address = witness
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/w")
        .to_string();
    let mut stream = TcpStream::connect(address).unwrap();
    let body = format!("old {}\n\n{forged}", cosigned.0);
    write!(
        stream,
        "POST /w/add-checkpoint HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 409"), "{answer}");
    assert!(answer.contains("text/x.tlog.size"), "{answer}");
    assert!(
        answer.ends_with(&format!("\r\n\r\n{}\n", cosigned.0)),
        "{answer}"
    );
    assert_eq!(witness.latest(), Some(cosigned));
}

// ---- In a fleet: the fleet checkpoint is witnessed.

/// A sidecar shipping to the hub at `url`, witnessed by `witnesses`.
fn fleet_sidecar(url: &str, fleet: &Path, name: &str, witnesses: &[String]) -> Server {
    let mut args = args(witnesses);
    for a in [
        "--cluster-db",
        url,
        "--fleet-key-dir",
        fleet.to_str().unwrap(),
        "--audit-origin",
        &crate::fleet_audit::origin(name),
        "--hub-ship-interval-ms",
        "100",
    ] {
        args.push(a.to_string());
    }
    Server::start_with(Start {
        args,
        ..Start::default()
    })
}

/// `audit verify --cluster-db URL --witness-key ... --quorum N --format json`.
fn verify_fleet(url: &str, keys: &[&WitnessKey], quorum: usize) -> (i32, Value, String) {
    let mut owned: Vec<String> = ["audit", "verify", "--cluster-db", url, "--format", "json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    owned.extend(["--quorum".to_string(), quorum.to_string()]);
    for key in keys {
        owned.push("--witness-key".into());
        owned.push(key.to_vkey());
    }
    let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
    crate::fleet_audit::toolgate(Path::new("."), &refs)
}

fn fleet_size(pg: &Postgres, url: &str) -> u64 {
    pg.psql_at(url, "SELECT coalesce(max(seq), 0) FROM hub_fleet")
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn fleet_checkpoints_are_cosigned_by_a_quorum_across_three_sidecars_and_a_forked_fleet_log_is_refused()
 {
    use crate::fleet_audit::{fleet_key, research, shipped};
    let pg = Postgres::start();
    let url = pg.url();
    let tmp = tempfile::tempdir().unwrap();
    let (fleet_dir, _) = fleet_key(tmp.path());
    let vkey = fleet_dir.join("audit-signing.vkey");
    let w1 = TestWitness::start("w1.example/witness", 21, "toolgate/fleet", vkey.clone());
    let w2 = TestWitness::start("w2.example/witness", 22, "toolgate/fleet", vkey);
    let flags = [w1.flag(), w2.flag()];
    let fleet: Vec<Server> = ["a", "b", "c"]
        .iter()
        .map(|n| fleet_sidecar(&url, &fleet_dir, n, &flags))
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
    // Three sidecars submit concurrently; both witnesses end at the newest fleet
    // checkpoint and its cosignatures are in the hub.
    let size = fleet_size(&pg, &url);
    assert!(size >= 3, "{size}");
    assert!(
        common::poll_until(Duration::from_secs(60), || {
            w1.latest().map(|l| l.0) == Some(size) && w2.latest().map(|l| l.0) == Some(size)
        }),
        "the witnesses never reached fleet size {size}: {:?} {:?}",
        w1.latest(),
        w2.latest()
    );
    let stored = |at: u64| -> u64 {
        pg.psql(&format!(
            "SELECT count(*) FROM hub_fleet_cosignatures WHERE size = {at}"
        ))
        .parse()
        .unwrap()
    };
    assert!(
        common::poll_until(Duration::from_secs(30), || stored(size) == 2),
        "the cosignatures at fleet size {size} were not stored"
    );
    let (code, report, text) = verify_fleet(&url, &[&w1.key, &w2.key], 2);
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        report["witnesses"]["witnessed_size"],
        json!(size),
        "{report}"
    );
    // A quorum the stored cosignatures cannot meet fails (exit 3).
    let w3 = WitnessKey::new(
        "w3.example/witness",
        SigningKey::from_bytes(&[23; 32]).verifying_key(),
    );
    let (code, report, text) = verify_fleet(&url, &[&w1.key, &w2.key, &w3], 3);
    assert_eq!(code, 3, "{text}");
    assert_eq!(report["kind"], "witness", "{report}");

    // The run exported across the fleet carries the cosigned fleet checkpoint.
    let out = tmp.path().join("export");
    let (code, _, text) = crate::fleet_audit::export(&url, &run, &out, Some(&fleet_dir));
    assert_eq!(code, 0, "{text}");
    let (code, text) = python(&out, &[&w1.key, &w2.key], 2, &["--fleet"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("witnessed up to fleet size"), "{text}");
    let (code, text) = python(&out, &[&w1.key, &w2.key, &w3], 3, &["--fleet"]);
    assert_eq!(code, 3, "{text}");

    // A fork of the fleet log (another hub database, the same fleet key and
    // witnesses): the witnesses refuse it and nothing is cosigned.
    let before = (w1.latest(), w2.latest());
    pg.psql("CREATE DATABASE fork");
    let fork = pg.url_as("postgres", common::postgres::PASSWORD, "fork");
    let d = fleet_sidecar(&fork, &fleet_dir, "d", &flags);
    let fork_run = d.create_run(json!({"case_id": "C-1001"}));
    // Longer than the fleet log the witnesses saw, so a consistency proof is asked.
    let mut q = 0;
    while fleet_size(&pg, &fork) <= size {
        assert!(q < 400, "the fork's fleet log does not grow");
        assert_eq!(research(&d, &fork_run, &format!("fork {q}")).0, 200);
        q += 1;
        if q % 8 == 0 {
            shipped(&d);
        }
    }
    for w in [&w1, &w2] {
        assert!(
            common::poll_until(Duration::from_secs(30), || {
                series(&scrape(&d), "toolgate_witness_conflicts_total", &w.key.name) > 0
            }),
            "witness {} did not refuse the fork: {}",
            w.key.name,
            scrape(&d)
        );
    }
    assert_eq!((w1.latest(), w2.latest()), before);
    assert_eq!(
        pg.psql_at(&fork, "SELECT count(*) FROM hub_fleet_cosignatures")
            .unwrap(),
        "0"
    );
    let (code, report, text) = verify_fleet(&fork, &[&w1.key, &w2.key], 1);
    assert_eq!(code, 3, "{text}");
    assert_eq!(report["kind"], "witness", "{report}");

    // A stored cosignature edited in the hub fails verify (exit 3).
    pg.psql(&format!(
        "UPDATE hub_fleet_cosignatures SET cosignature = overlay(cosignature PLACING CASE WHEN substr(cosignature, length(cosignature) - 10, 1) = 'A' THEN 'B' ELSE 'A' END FROM length(cosignature) - 10 FOR 1) WHERE size = {size}"
    ));
    let (code, report, text) = verify_fleet(&url, &[&w1.key, &w2.key], 2);
    assert_eq!(code, 3, "{text}");
    assert_eq!(report["kind"], "witness", "{report}");
}
