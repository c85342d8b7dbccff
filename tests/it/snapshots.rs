//! Whole-output snapshots of what a person reads: `policy check|explain|diff|test`
//! and `audit verify`, each run by the real binary on a copy of the demo policy (or a
//! log made by the real server) and compared with `tests/snapshots/<name>.txt`.
//! Values that differ from run to run (digests, keys, temp paths) are given stable
//! names first ([`common::snapshot::redact`]). `TOOLGATE_BLESS=1` rewrites them.

use std::path::Path;

use serde_json::json;

use crate::common::demo::Demo;
use crate::common::snapshot::{assert_snapshot, redact};
use crate::common::{self, Server};

/// Runs the binary in `dir`: the exit code, then stdout and stderr as a reader sees
/// them, each under a header.
fn transcript(dir: &Path, args: &[&str]) -> String {
    let (code, stdout, stderr) = common::run(dir, args);
    let mut out = format!("$ toolgate {}\n", args.join(" "));
    out.push_str(&format!("exit {code}\n"));
    if !stdout.is_empty() {
        out.push_str("--- stdout\n");
        out.push_str(&stdout);
    }
    if !stderr.is_empty() {
        out.push_str("--- stderr\n");
        out.push_str(&stderr);
    }
    out
}

/// The demo policy copied into a fresh temp directory (not a git work tree).
fn demo() -> (tempfile::TempDir, Demo) {
    let dir = tempfile::tempdir().unwrap();
    let demo = Demo::copy_into(dir.path());
    (dir, demo)
}

#[test]
fn policy_check_of_the_demo() {
    let (dir, _) = demo();
    assert_snapshot(
        "policy_check_demo",
        &transcript(dir.path(), &["policy", "check"]),
    );
}

#[test]
fn policy_check_of_a_broken_policy_names_each_problem() {
    let (dir, demo) = demo();
    demo.edit(
        "policy/lanes.yaml",
        "tools: [read_document, draft_document]",
        "tools: [read_document, draft_document, no_such_tool]",
    );
    demo.edit(
        "policy/roles.yaml",
        "  - role_id: filing_agent",
        "  - role_id: filing agent",
    );
    assert_snapshot(
        "policy_check_broken",
        &transcript(dir.path(), &["policy", "check"]),
    );
}

#[test]
fn policy_explain_of_an_allowed_and_a_refused_call() {
    let (dir, _) = demo();
    let mut out = transcript(
        dir.path(),
        &[
            "policy",
            "explain",
            "--role",
            "research_agent",
            "--lane",
            "research",
            "--tool",
            "legal_search",
            "--scope",
            r#"{"case_id": "C-1001"}"#,
            "--arguments",
            r#"{"query": "duty of care"}"#,
        ],
    );
    out.push('\n');
    out.push_str(&transcript(
        dir.path(),
        &[
            "policy",
            "explain",
            "--role",
            "research_agent",
            "--lane",
            "filing",
            "--tool",
            "file_with_court",
        ],
    ));
    assert_snapshot("policy_explain", &out);
}

#[test]
fn policy_test_of_the_demo_suite() {
    let (dir, _) = demo();
    assert_snapshot(
        "policy_test_demo",
        &transcript(dir.path(), &["policy", "test"]),
    );
}

#[test]
fn policy_diff_of_a_widening_and_a_narrowing() {
    let dir = tempfile::tempdir().unwrap();
    Demo::copy_into(&dir.path().join("old"));
    let new = Demo::copy_into(&dir.path().join("new"));
    // Widen: the research agent may also act in intake. Narrow: the supervisor no
    // longer acts in filing.
    new.edit(
        "policy/roles.yaml",
        "    lanes: [research]",
        "    lanes: [research, intake]",
    );
    new.edit(
        "policy/roles.yaml",
        "    lanes: [intake, research, drafting, filing]",
        "    lanes: [intake, research, drafting]",
    );
    let text = transcript(
        dir.path(),
        &["policy", "diff", "./old", "./new", "--fail-on", "widening"],
    );
    assert_snapshot("policy_diff", &text);
}

#[test]
fn audit_verify_of_a_sound_log_and_of_an_edited_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("var");
    let server = Server::start_with(common::Start {
        data_dir: Some(data.clone()),
        ..common::Start::default()
    });
    let run = server.create_run(json!({"case_id": "C-1001"}));
    let (code, _) = server.look_up_case(&run);
    assert_eq!(code, 200);
    server.stop();
    let paths = [(dir.path().to_str().unwrap(), "<tmp>")];
    let db = data.join("audit.db");
    let db = db.to_str().unwrap();
    let mut out = transcript(dir.path(), &["audit", "verify", "--db", db]);
    // An insider edits one event in place; the chain names it.
    let conn = crate::audit_support::tamper(&data.join("audit.db"));
    let changed = conn
        .execute(
            "UPDATE events SET line = replace(line, 'C-1001', 'C-9999') WHERE seq = (SELECT max(seq) FROM events WHERE line LIKE '%C-1001%')",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(conn);
    out.push('\n');
    out.push_str(&transcript(dir.path(), &["audit", "verify", "--db", db]));
    assert_snapshot("audit_verify", &redact(&out, &paths));
}
