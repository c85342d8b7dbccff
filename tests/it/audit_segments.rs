//! Sealed audit segments through the real server binary: calls spread over several
//! segment files verify and export as one log, a restart continues the chain, an
//! archive leaves what remains verifiable, and an insider with the data directory who
//! deletes, swaps, edits or cuts segments (or forges an archive's start) is caught with
//! the documented exit code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::audit_support::{code, fingerprint, stdout, tamper, toolgate, verify};
use crate::common::{self, Server, Start};

/// The smallest segment `serve` accepts: a few dozen events each.
const SEGMENT_BYTES: &str = "65536";

fn serve(data: &Path) -> Server {
    serve_with(data, "full")
}

/// With `--durability normal` a lone client's commits run on its connection thread,
/// which never seals: the writer thread seals at the next append (docs/audit.md).
fn serve_with(data: &Path, durability: &str) -> Server {
    Server::start_with(Start {
        data_dir: Some(data.to_path_buf()),
        args: vec![
            "--audit-segment-bytes".into(),
            SEGMENT_BYTES.into(),
            "--durability".into(),
            durability.into(),
        ],
        ..Start::default()
    })
}

/// Allowed and denied calls in one run; returns the run id.
fn traffic(server: &Server, calls: usize) -> String {
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    for i in 0..calls {
        let (status, body) = server.call(
            "research_agent",
            &run,
            "research",
            "legal_search",
            json!({"query": format!("duty of care {i}"), "limit": 3}),
            scope.clone(),
        );
        assert_eq!(status, 200, "{body}");
        let (status, body) = server.call(
            "research_agent",
            &run,
            "research",
            "file_with_court",
            json!({"document_id": format!("doc-{i}")}),
            scope.clone(),
        );
        assert_ne!(status, 200, "{body}");
    }
    run
}

/// The segment files of the log in `dir`, oldest first (`audit.db`, `audit-000002.db`...).
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let base = dir.join("audit.db");
    toolgate::audit::segments::list_in(&base, Some(dir))
        .unwrap()
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

fn verify_json(db: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--format", "json"]);
    let out = verify(db, &args);
    let value: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr)));
    (code(&out), value)
}

fn export_ok(db: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "audit",
        "export",
        "--db",
        db.to_str().unwrap(),
        "--format",
        "jsonl",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let output = toolgate(&args);
    assert_eq!(
        code(&output),
        0,
        "{}{}",
        stdout(&output),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn python_ok(dir: &Path, fingerprint: &str) {
    let (exit, out) = common::verify_export(dir, &["--key-fingerprint", fingerprint]);
    assert_eq!(exit, 0, "{out}");
}

fn archive(data: &Path, to: &Path, extra: &[&str]) -> (i32, String) {
    let out = archive_output(data, to, extra);
    (
        code(&out),
        format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr)),
    )
}

fn archive_output(data: &Path, to: &Path, extra: &[&str]) -> std::process::Output {
    let db = data.join("audit.db");
    let mut args = vec![
        "audit",
        "archive",
        "--db",
        db.to_str().unwrap(),
        "--to",
        to.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    toolgate(&args)
}

/// A stopped server's data directory whose log spans at least `min` segments.
fn segmented_log(data: &Path, min: usize) -> String {
    let server = serve(data);
    let run = traffic(&server, 40);
    server.stop();
    let files = segment_files(data);
    assert!(files.len() >= min, "only {} segments", files.len());
    run
}

#[rstest::rstest]
#[case::full("full")]
#[case::normal("normal")]
fn calls_span_sealed_segments_that_verify_and_export_as_one_log(#[case] durability: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let server = serve_with(&data, durability);
    let run = traffic(&server, 40);
    let live = segment_files(&data);
    assert!(live.len() >= 3, "only {} segments: {live:?}", live.len());
    let db = data.join("audit.db");
    // Verified while the server runs (and may seal the next segment meanwhile).
    let (exit, report) = verify_json(&db, &[]);
    assert_eq!(exit, 0, "{report}");
    assert_eq!(report["first_seq"], json!(1));
    assert!(
        report["segments"].as_array().unwrap().len() >= 3,
        "{report}"
    );
    server.stop();

    // Each sealed segment ends where the next starts; a restart continues the chain,
    // and the run (created in segment 1) is rebuilt from the segments.
    let server = serve_with(&data, durability);
    let (status, body) = server.call(
        "research_agent",
        &run,
        "research",
        "legal_search",
        json!({"query": "after the restart", "limit": 1}),
        json!({"case_id": "C-1001"}),
    );
    assert_eq!(status, 200, "{body}");
    traffic(&server, 10);
    server.stop();
    let (exit, report) = verify_json(&db, &[]);
    assert_eq!(exit, 0, "{report}");
    let events = report["events"].as_u64().unwrap();
    assert!(events > 100, "{report}");
    assert_eq!(report["latest_checkpoint_size"], json!(events), "{report}");

    // `audit tail` reads the newest events across segments, and from any seq on.
    let tail = |extra: &[&str]| -> Vec<u64> {
        let mut args = vec!["audit", "tail", "--db", db.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = toolgate(&args);
        assert_eq!(code(&out), 0, "{}", stdout(&out));
        stdout(&out)
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    let newest: Vec<u64> = ((events - 39)..=events).collect();
    assert_eq!(tail(&["--limit", "40"]), newest);
    let after: Vec<u64> = (6..=45).collect();
    assert_eq!(tail(&["--after-seq", "5", "--limit", "40"]), after);

    // A full export and a run export both span segments and verify without toolgate.
    let fp = fingerprint(&data);
    let full = tmp.path().join("full");
    export_ok(&db, &full, &[]);
    python_ok(&full, &fp);
    let exported = std::fs::read_to_string(full.join("events.jsonl")).unwrap();
    assert_eq!(exported.lines().count() as u64, events);
    let by_run = tmp.path().join("run");
    export_ok(&db, &by_run, &["--run", &run]);
    python_ok(&by_run, &fp);
    let seqs: Vec<u64> = std::fs::read_to_string(by_run.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    let first_seal_end = seal_end(&live[0]);
    assert!(
        seqs.first().unwrap() <= &first_seal_end && seqs.last().unwrap() > &first_seal_end,
        "the run export does not span segments: {seqs:?}"
    );
}

fn event_count(path: &Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap()
}

/// The seal record of a sealed segment file.
fn seal(path: &Path) -> Value {
    let conn = rusqlite::Connection::open(path).unwrap();
    let text: String = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'segment_seal'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The last seq of a sealed segment file.
fn seal_end(path: &Path) -> u64 {
    seal(path)["last_seq"].as_u64().unwrap()
}

#[test]
fn archived_segments_leave_a_log_that_verifies_from_its_start() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    segmented_log(&data, 4);
    let db = data.join("audit.db");
    let before = segment_files(&data).len();
    let to = tmp.path().join("archive");

    // Not while a gateway writes the log.
    let server = serve(&data);
    let (exit, text) = archive(&data, &to, &["--keep-segments", "1"]);
    assert_eq!(exit, 4, "{text}");
    assert!(text.contains("locked"), "{text}");
    assert!(!to.join("audit.db").exists());
    // With --format json the refusal is JSON on stdout too.
    let out = archive_output(&data, &to, &["--keep-segments", "1", "--format", "json"]);
    assert_eq!(code(&out), 4);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&answer["status"], &answer["kind"], &answer["exit_code"]),
        (&json!("error"), &json!("locked"), &json!(4)),
        "{answer}"
    );
    assert!(!to.join("audit.db").exists());
    server.stop();

    let (exit, text) = archive(&data, &to, &["--keep-segments", "1"]);
    assert_eq!(exit, 0, "{text}");
    let left = segment_files(&data);
    // The newest sealed one and the active one stay.
    assert_eq!(left.len(), 2, "{left:?} of {before}");
    assert!(!data.join("audit.db").exists());
    assert!(to.join("audit.db").exists() && to.join("audit.db.seal.json").exists());

    let (exit, report) = verify_json(&db, &[]);
    assert_eq!(exit, 0, "{report}");
    let first = report["first_seq"].as_u64().unwrap();
    assert!(first > 1, "{report}");
    assert_eq!(report["archived_through_seq"], json!(first - 1));
    let text = stdout(&verify(&db, &[]));
    assert!(
        text.contains(&format!("verified from seq {first}")),
        "{text}"
    );

    // With the archive, the whole log verifies from seq 1 and exports.
    let archive_dir = to.to_str().unwrap();
    let (exit, report) = verify_json(&db, &["--archive", archive_dir]);
    assert_eq!(exit, 0, "{report}");
    assert_eq!(report["first_seq"], json!(1));
    let out = tmp.path().join("export");
    export_ok(&db, &out, &["--archive", archive_dir]);
    python_ok(&out, &fingerprint(&data));
    // Without it an export refuses (it needs every leaf from seq 1).
    let refused = toolgate(&[
        "audit",
        "export",
        "--db",
        db.to_str().unwrap(),
        "--format",
        "jsonl",
        "--out",
        tmp.path().join("partial").to_str().unwrap(),
    ]);
    assert_eq!(code(&refused), 1, "{}", stdout(&refused));

    // The gateway continues after an archive.
    let server = serve(&data);
    traffic(&server, 3);
    server.stop();
    let (exit, report) = verify_json(&db, &[]);
    assert_eq!(exit, 0, "{report}");
    assert_eq!(report["first_seq"], json!(first));
}

/// Replaces the largest subtree hash of a segment's start record.
fn forge_start(segment: &Path) {
    let conn = rusqlite::Connection::open(segment).unwrap();
    let text: String = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'segment_start'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let mut start: Value = serde_json::from_str(&text).unwrap();
    let nodes = start["frontier"].as_array_mut().unwrap();
    nodes[0] = json!(hex::encode([7u8; 32]));
    let changed = conn
        .execute(
            "UPDATE meta SET value = ?1 WHERE key = 'segment_start'",
            [start.to_string()],
        )
        .unwrap();
    assert_eq!(changed, 1);
}

/// Runs `attack` on a copy of the segmented data directory and returns verify's exit
/// code and failure kind.
fn attacked(source: &Path, attack: impl FnOnce(&Path)) -> (i32, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    common::copy_dir(source, &data);
    attack(&data);
    let (exit, value) = verify_json(&data.join("audit.db"), &[]);
    (exit, value["kind"].clone())
}

#[test]
fn an_insider_with_the_data_directory_is_caught_across_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    segmented_log(&data, 4);
    let files = segment_files(&data);
    let name = |p: &Path| p.file_name().unwrap().to_owned();

    // A middle segment deleted.
    let middle = name(&files[1]);
    let got = attacked(&data, |d| std::fs::remove_file(d.join(&middle)).unwrap());
    assert_eq!(got, (1, json!("missing")));

    // The oldest segment deleted (no archive recorded it).
    let got = attacked(&data, |d| std::fs::remove_file(d.join("audit.db")).unwrap());
    assert_eq!(got, (1, json!("missing")));

    // Two segments swapped.
    let (a, b) = (name(&files[1]), name(&files[2]));
    let got = attacked(&data, |d| {
        std::fs::rename(d.join(&a), d.join("swap")).unwrap();
        std::fs::rename(d.join(&b), d.join(&a)).unwrap();
        std::fs::rename(d.join("swap"), d.join(&b)).unwrap();
    });
    assert_eq!(got, (1, json!("reordered")));

    // A middle segment's start record re-pointed (another right edge).
    let third = name(&files[2]);
    let got = attacked(&data, |d| forge_start(&d.join(&third)));
    assert_eq!(got, (1, json!("edited")));

    // An event edited in a sealed segment.
    let sealed = name(&files[1]);
    let got = attacked(&data, |d| {
        let conn = tamper(&d.join(&sealed));
        let seq: i64 = conn
            .query_row("SELECT min(seq) + 2 FROM events", [], |r| r.get(0))
            .unwrap();
        let changed = conn
            .execute(
                "UPDATE events SET line = replace(line, '\"timestamp_utc\":\"2', '\"timestamp_utc\":\"3') WHERE seq = ?1",
                [seq],
            )
            .unwrap();
        assert_eq!(changed, 1);
    });
    assert_eq!(got, (1, json!("edited")));

    // The newest segment's tail cut (its signed head and the sink know better).
    let with_events: Vec<&PathBuf> = files.iter().filter(|f| event_count(f) > 0).collect();
    let newest = name(with_events.last().unwrap());
    let empty_after: Vec<_> = files
        .iter()
        .skip_while(|f| name(f) != newest)
        .skip(1)
        .map(|f| name(f))
        .collect();
    let got = attacked(&data, |d| {
        tamper(&d.join(&newest))
            .execute(
                "DELETE FROM events WHERE seq > (SELECT max(seq) - 3 FROM events)",
                [],
            )
            .unwrap();
    });
    assert_eq!(got.0, 2, "{got:?}");
    assert_eq!(got.1, json!("truncated"));

    // The whole newest segment removed: the sink's checkpoints cover more.
    let got = attacked(&data, |d| {
        for file in empty_after.iter().chain([&newest]) {
            std::fs::remove_file(d.join(file)).unwrap();
        }
    });
    assert_eq!(got, (2, json!("truncated")));

    // After an archive: the oldest remaining segment's start record replaced (the
    // frontier of another size), and a start re-pointed at another seq.
    let archived = tmp.path().join("archived");
    common::copy_dir(&data, &archived);
    let (exit, text) = archive(&archived, &tmp.path().join("to"), &["--keep-segments", "2"]);
    assert_eq!(exit, 0, "{text}");
    let oldest = segment_files(&archived)[0].clone();
    let oldest_name = name(&oldest);
    let (exit, _) = verify_json(&archived.join("audit.db"), &[]);
    assert_eq!(exit, 0);
    let got = attacked(&archived, |d| forge_start(&d.join(&oldest_name)));
    assert_eq!(got, (1, json!("edited")));
    // Deleting one more segment than was archived is not covered by the record.
    let got = attacked(&archived, |d| {
        std::fs::remove_file(d.join(&oldest_name)).unwrap()
    });
    assert_eq!(got, (1, json!("missing")));
}

#[test]
fn segments_are_also_sealed_by_age() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let server = Server::start_with(Start {
        data_dir: Some(data.clone()),
        args: vec![
            "--audit-segment-max-age-s".into(),
            "1".into(),
            "--checkpoint-interval-ms".into(),
            "100".into(),
        ],
        ..Start::default()
    });
    let scope = json!({"case_id": "C-1001"});
    let run = server.create_run(scope.clone());
    // Each round: one call, then wait (bounded) for the timer to seal its segment.
    for round in 1..=2usize {
        let (status, body) = server.call(
            "research_agent",
            &run,
            "research",
            "legal_search",
            json!({"query": format!("round {round}"), "limit": 1}),
            scope.clone(),
        );
        assert_eq!(status, 200, "{body}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while segment_files(&data).len() <= round {
            assert!(
                std::time::Instant::now() < deadline,
                "segment {round} was not sealed by age"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let (exit, report) = verify_json(&data.join("audit.db"), &[]);
    assert_eq!(exit, 0, "{report}");
    assert!(
        report["segments"].as_array().unwrap().len() >= 3,
        "{report}"
    );
    server.stop();
    let (exit, report) = verify_json(&data.join("audit.db"), &[]);
    assert_eq!(exit, 0, "{report}");
}

#[test]
fn a_crash_between_a_seal_and_the_next_segment_is_finished_at_the_next_start() {
    use toolgate::audit::{AuditLog, AuditOptions, EventType, NewEvent};
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let mut options = AuditOptions::new(&data);
    options.segment_max_bytes = Some(65_536);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let event = |i: u64| {
        let mut e = NewEvent::new(EventType::PolicyLoaded);
        e.reason = Some(format!("event {i} {}", "x".repeat(600)));
        e
    };
    // Append until the first seal, then stop at once: the new segment is still empty.
    let log = AuditLog::open(options.clone()).unwrap();
    let mut appended = 0u64;
    rt.block_on(async {
        while segment_files(&data).len() < 2 {
            appended += 1;
            assert!(appended < 10_000, "never sealed");
            log.append(event(appended)).await.unwrap();
        }
        log.close().await.unwrap();
    });
    let files = segment_files(&data);
    assert_eq!(files.len(), 2);
    assert_eq!(event_count(&files[1]), 0);
    assert_eq!(seal_end(&files[0]), appended);
    // The crash: the sealed segment exists, its successor does not.
    std::fs::remove_file(&files[1]).unwrap();

    let log = AuditLog::open(options).unwrap();
    let next = rt.block_on(async {
        let next = log.append(event(appended + 1)).await.unwrap();
        log.close().await.unwrap();
        next
    });
    assert_eq!(next.seq, appended + 1);
    assert_eq!(segment_files(&data).len(), 2);
    let (exit, report) = verify_json(&data.join("audit.db"), &[]);
    assert_eq!(exit, 0, "{report}");
    assert_eq!(report["events"], json!(appended + 1));
    assert_eq!(report["segments"], json!([1, 2]));
}

#[test]
fn verify_passes_while_the_server_seals_segments_under_load() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    let server = std::sync::Arc::new(serve(&data));
    let busy = server.clone();
    let load = std::thread::spawn(move || traffic(&busy, 60));
    let db = data.join("audit.db");
    let mut runs = 0;
    let mut seen_segments = 0;
    while !load.is_finished() || runs < 3 {
        let (exit, report) = verify_json(&db, &[]);
        assert_eq!(exit, 0, "{report}");
        seen_segments = seen_segments.max(report["segments"].as_array().unwrap().len());
        runs += 1;
    }
    load.join().unwrap();
    assert!(
        seen_segments >= 3,
        "the log never spanned 3 segments during the runs"
    );
    let (exit, report) = verify_json(&db, &[]);
    assert_eq!(exit, 0, "{report}");
}

/// The signed seal note of a sealed segment file.
fn seal_note(path: &Path) -> String {
    seal(path)["note"].as_str().unwrap().to_string()
}

/// A trusted checkpoint below the oldest segment present cannot be checked from what
/// is here: a key thief could forge a log whose oldest segment starts above it and
/// claim the older ones were archived. That is a failure (2) unless `--archive`
/// brings the segments that show it, never a warning.
#[test]
fn a_trusted_checkpoint_below_the_oldest_segment_needs_the_archive() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    segmented_log(&data, 4);
    let db = data.join("audit.db");
    // The auditor kept the seal of segment 1; a forged one has another root there.
    let kept = seal_note(&db);
    let size: u64 = kept.lines().nth(1).unwrap().parse().unwrap();
    let key = toolgate::audit::keys::load_signer(&data.join("keys")).unwrap();
    let forged = toolgate::audit::checkpoint::Checkpoint {
        origin: kept.lines().next().unwrap().to_string(),
        size,
        root: [7u8; 32],
    }
    .sign(&key);
    let trusted = tmp.path().join("trusted.note");
    let other = tmp.path().join("other.note");
    std::fs::write(&trusted, &kept).unwrap();
    std::fs::write(&other, &forged).unwrap();
    let to = tmp.path().join("archive");
    let (exit, text) = archive(&data, &to, &["--keep-segments", "1"]);
    assert_eq!(exit, 0, "{text}");
    let (exit, report) = verify_json(&db, &[]);
    assert_eq!(exit, 0, "{report}");
    assert!(report["first_seq"].as_u64().unwrap() > size + 1, "{report}");

    // Without the archive, neither can be shown: both fail, the truth included.
    for note in [&trusted, &other] {
        let (exit, report) = verify_json(&db, &["--trusted-checkpoint", note.to_str().unwrap()]);
        assert_eq!(
            (exit, report["kind"].clone()),
            (2, json!("truncated")),
            "{report}"
        );
        assert!(
            report["message"]
                .as_str()
                .unwrap()
                .contains("cannot show that the log extends"),
            "{report}"
        );
    }
    // With it, the kept one passes and the other is a fork.
    let archive_dir = to.to_str().unwrap();
    let (exit, report) = verify_json(
        &db,
        &[
            "--trusted-checkpoint",
            trusted.to_str().unwrap(),
            "--archive",
            archive_dir,
        ],
    );
    assert_eq!(exit, 0, "{report}");
    assert_eq!(report["trusted_checkpoint_size"], json!(size), "{report}");
    let (exit, report) = verify_json(
        &db,
        &[
            "--trusted-checkpoint",
            other.to_str().unwrap(),
            "--archive",
            archive_dir,
        ],
    );
    assert_eq!(
        (exit, report["kind"].clone()),
        (2, json!("fork")),
        "{report}"
    );
}

/// A `--ship` sink reads the log in the data directory: archiving events it has not
/// confirmed would mean it never gets them. `audit archive` refuses that, naming the
/// sink's cursor, unless told `--ignore-ship-cursors`.
#[test]
fn archiving_events_a_ship_sink_has_not_confirmed_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("var");
    segmented_log(&data, 3);
    // A sink that never confirms anything: nothing listens on its port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let server = Server::start_with(Start {
        data_dir: Some(data.clone()),
        args: vec!["--ship".into(), format!("otlp+http://{closed}")],
        ..Start::default()
    });
    assert_eq!(server.stop().code(), Some(0));
    let before = segment_files(&data).len();
    let to = tmp.path().join("archive");
    let (exit, text) = archive(&data, &to, &["--keep-segments", "1"]);
    assert_ne!(exit, 0, "{text}");
    assert!(text.contains("--ignore-ship-cursors"), "{text}");
    assert!(text.contains("at seq 0"), "{text}");
    assert_eq!(segment_files(&data).len(), before, "nothing was archived");

    let (exit, text) = archive(
        &data,
        &to,
        &["--keep-segments", "1", "--ignore-ship-cursors"],
    );
    assert_eq!(exit, 0, "{text}");
    assert!(segment_files(&data).len() < before, "{text}");
}
