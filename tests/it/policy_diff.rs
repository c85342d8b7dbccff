//! `toolgate policy diff` and `policy check --base` through the real binary on a real
//! git repository built in a temporary directory: three commits of the demo policy
//! (the original; access widened and narrowed with schema changes that bump their
//! versions properly; schema changes that do not), compared in text, markdown and
//! JSON, with the exit codes of `--fail-on widening` and of a version rule violation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use common::demo::{Demo, edit};
use common::{repo, run};

/// Runs git in `dir`; the test needs it to succeed.
fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=review",
            "-c",
            "user.email=review@example.com",
        ])
        .args([
            "-c",
            "commit.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .expect("the test needs git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Edits a JSON schema file.
fn edit_json(file: &Path, change: impl FnOnce(&mut Value)) {
    let mut value: Value = serde_json::from_str(&fs::read_to_string(file).unwrap()).unwrap();
    change(&mut value);
    fs::write(file, serde_json::to_string_pretty(&value).unwrap()).unwrap();
}

/// Sets `version:` of one tool in the registry.
fn tool_version(root: &Path, tool: &str, from: &str, to: &str) {
    let registry = root.join("tools/tool_registry.yaml");
    let text = fs::read_to_string(&registry).unwrap();
    let start = text.find(&format!("tool_name: {tool}\n")).unwrap();
    let at = start + text[start..].find(&format!("version: {from}\n")).unwrap();
    let mut new = text.clone();
    new.replace_range(
        at..at + format!("version: {from}").len(),
        &format!("version: {to}"),
    );
    fs::write(&registry, new).unwrap();
}

/// Copies the demo policy and tools into `root`.
fn demo_into(root: &Path) {
    Demo::copy_into(root);
}

/// Commit 2: access widened and narrowed; schemas changed compatibly and breakingly,
/// each with the version bump it needs.
fn widen_and_narrow(root: &Path) {
    // Widen: research_agent may also act in intake (and so call conflict_check there).
    edit(
        &root.join("policy/roles.yaml"),
        "lanes: [research]\n",
        "lanes: [research, intake]\n",
    );
    // Widen: the drafting lane allowlists legal_search (both sides of the allowlist).
    edit(
        &root.join("policy/lanes.yaml"),
        "tools: [read_document, draft_document]",
        "tools: [read_document, draft_document, legal_search]",
    );
    edit(
        &root.join("tools/tool_registry.yaml"),
        "allowed_lanes: [research]\n    required_scope_keys: []\n    prohibited_flags: [sealed]\n    write_targets: []\n    adapter: {kind: builtin, name: legal_search}",
        "allowed_lanes: [research, drafting]\n    required_scope_keys: []\n    prohibited_flags: [sealed]\n    write_targets: []\n    adapter: {kind: builtin, name: legal_search}",
    );
    // Widen: filing no longer requires matter_id.
    edit(
        &root.join("policy/lanes.yaml"),
        "required_scope_keys: [case_id, matter_id]",
        "required_scope_keys: [case_id]",
    );
    // Narrow: intake now prohibits `urgent`.
    edit(
        &root.join("policy/lanes.yaml"),
        "    prohibited_flags: []\n",
        "    prohibited_flags: [urgent]\n",
    );
    // Compatible input change with a minor bump.
    edit_json(&root.join("tools/legal_search/schema/input.json"), |s| {
        s["properties"]["lang"] = serde_json::json!({"type": "string"})
    });
    tool_version(root, "legal_search", "1.0.0", "1.1.0");
    // Breaking output change with a major bump.
    edit_json(&root.join("tools/case_lookup/schema/output.json"), |s| {
        s["properties"].as_object_mut().unwrap().remove("opened");
        let required = s["required"].as_array_mut().unwrap();
        required.retain(|r| r != "opened");
    });
    tool_version(root, "case_lookup", "1.0.0", "2.0.0");
}

/// Commit 3: schema changes without the bumps they need.
fn break_versions(root: &Path) {
    // Breaking, no bump.
    edit_json(&root.join("tools/read_document/schema/input.json"), |s| {
        s["properties"]["path"]["maxLength"] = serde_json::json!(256)
    });
    // Compatible, only a patch bump.
    edit_json(&root.join("tools/conflict_check/schema/input.json"), |s| {
        s["properties"]["party_name"]["maxLength"] = serde_json::json!(400)
    });
    tool_version(root, "conflict_check", "1.0.0", "1.0.1");
}

/// A repository with the three commits; HEAD is commit 3.
fn history() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    git(root, &["init", "-q"]);
    demo_into(root);
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "demo policy"]);
    widen_and_narrow(root);
    git(root, &["commit", "-q", "-a", "-m", "widen and narrow"]);
    break_versions(root);
    git(
        root,
        &["commit", "-q", "-a", "-m", "schema changes without bumps"],
    );
    tmp
}

fn changes(report: &Value) -> &Vec<Value> {
    report["changes"].as_array().unwrap()
}

/// The one change with these fields, or a panic listing them all.
fn find<'a>(report: &'a Value, fields: &[(&str, &str)]) -> &'a Value {
    let hits: Vec<&Value> = changes(report)
        .iter()
        .filter(|c| fields.iter().all(|(k, v)| c[*k] == *v))
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "{fields:?} in {:#}",
        serde_json::to_string_pretty(&report["changes"]).unwrap()
    );
    hits[0]
}

#[test]
fn json_lists_effective_changes_with_their_marks() {
    let tmp = history();
    let (code, out, err) = run(
        tmp.path(),
        &["policy", "diff", "HEAD~2", "HEAD~1", "--format", "json"],
    );
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["old"]["label"], "HEAD~2");
    assert_eq!(report["new"]["commit"].as_str().unwrap().len(), 40);

    let triple = |role: &str, lane: &str, tool: &str| {
        find(
            &report,
            &[
                ("kind", "triple_allowed"),
                ("role", role),
                ("lane", lane),
                ("tool", tool),
            ],
        )["effect"]
            .clone()
    };
    assert_eq!(
        triple("research_agent", "intake", "conflict_check"),
        "widening"
    );
    assert_eq!(
        triple("drafting_agent", "drafting", "legal_search"),
        "widening"
    );
    assert_eq!(triple("supervisor", "drafting", "legal_search"), "widening");
    assert_eq!(
        triple("paralegal_agent", "drafting", "legal_search"),
        "widening"
    );
    assert_eq!(
        changes(&report)
            .iter()
            .filter(|c| c["section"] == "access")
            .count(),
        4,
        "no other triple changed"
    );

    let dropped = find(
        &report,
        &[("kind", "lane_scope_key_removed"), ("lane", "filing")],
    );
    assert_eq!(dropped["effect"], "widening");
    assert_eq!(
        dropped["message"],
        "lane `filing` no longer requires scope key `matter_id`"
    );
    let added = find(
        &report,
        &[("kind", "lane_prohibition_added"), ("lane", "intake")],
    );
    assert_eq!(added["effect"], "narrowing");
    assert!(added["message"].as_str().unwrap().contains("`urgent`"));

    let input = find(
        &report,
        &[("kind", "input_schema_changed"), ("tool", "legal_search")],
    );
    assert_eq!(input["effect"], "widening", "accepts more arguments");
    assert_eq!(input["schema"]["class"], "compatible");
    assert_eq!(input["schema"]["changes"][0]["pointer"], "/properties/lang");
    let output = find(
        &report,
        &[("kind", "output_schema_changed"), ("tool", "case_lookup")],
    );
    assert_eq!(output["effect"], "neutral");
    assert_eq!(output["schema"]["class"], "breaking");
    let version = find(
        &report,
        &[("kind", "tool_version_changed"), ("tool", "case_lookup")],
    );
    assert_eq!(version["before"], "1.0.0");
    assert_eq!(version["after"], "2.0.0");

    assert_eq!(report["violations"], serde_json::json!([]));
    assert_eq!(report["summary"]["widens"], true);
    let widening = changes(&report)
        .iter()
        .filter(|c| c["effect"] == "widening")
        .count();
    assert_eq!(report["summary"]["widening"], widening);
}

#[test]
fn fail_on_widening_gates_ci() {
    let tmp = history();
    let dir = tmp.path();
    let (code, out, _) = run(
        dir,
        &[
            "policy",
            "diff",
            "HEAD~2",
            "HEAD~1",
            "--fail-on",
            "widening",
        ],
    );
    assert_eq!(code, 1, "{out}");
    // The same comparison without the gate succeeds.
    assert_eq!(run(dir, &["policy", "diff", "HEAD~2", "HEAD~1"]).0, 0);
    // Nothing widens between a commit and itself.
    let (code, out, _) = run(
        dir,
        &["policy", "diff", "HEAD", "HEAD", "--fail-on", "widening"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no change in effective permissions"), "{out}");
}

#[test]
fn a_narrowing_only_change_passes_the_gate_and_directories_work() {
    let tmp = tempfile::tempdir().unwrap();
    let (old, new) = (tmp.path().join("old"), tmp.path().join("new"));
    demo_into(&old);
    demo_into(&new);
    edit(
        &new.join("policy/lanes.yaml"),
        "    prohibited_flags: []\n",
        "    prohibited_flags: [urgent]\n",
    );
    let (code, out, err) = run(
        tmp.path(),
        &[
            "policy",
            "diff",
            "old",
            "new",
            "--fail-on",
            "widening",
            "--format",
            "json",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(changes(&report).len(), 1);
    assert_eq!(changes(&report)[0]["kind"], "lane_prohibition_added");
    assert_eq!(report["old"]["commit"], Value::Null);
    // The reverse drops the prohibition: a widening.
    let (code, out, _) = run(
        tmp.path(),
        &["policy", "diff", "new", "old", "--fail-on", "widening"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("widening   lane `intake` no longer prohibits flag `urgent`"),
        "{out}"
    );
}

#[test]
fn a_schema_change_without_its_version_bump_is_an_error() {
    let tmp = history();
    let dir = tmp.path();
    let (code, out, _) = run(
        dir,
        &["policy", "diff", "HEAD~1", "HEAD", "--format", "json"],
    );
    assert_eq!(code, 5, "a violation fails even without --fail-on: {out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let violations = report["violations"].as_array().unwrap();
    let summary: Vec<(&str, &str)> = violations
        .iter()
        .map(|v| (v["tool"].as_str().unwrap(), v["class"].as_str().unwrap()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("conflict_check", "compatible"),
            ("read_document", "breaking")
        ]
    );
    assert_eq!(
        violations[1]["help"],
        "set `version: 2.0.0` (or make the change compatible)"
    );
    // The gate does not hide it.
    assert_eq!(
        run(
            dir,
            &["policy", "diff", "HEAD~1", "HEAD", "--fail-on", "widening"]
        )
        .0,
        5
    );
    // Text says so too.
    let (_, out, _) = run(dir, &["policy", "diff", "HEAD~1", "HEAD"]);
    assert!(
        out.contains("error: tool `read_document`: a breaking schema change needs a major version bump, but the version stayed 1.0.0"),
        "{out}"
    );
    assert!(out.contains("; 2 version rule violations"), "{out}");
}

#[test]
fn policy_check_base_applies_the_version_rules() {
    let tmp = history();
    let dir = tmp.path();
    let (code, out, err) = run(dir, &["policy", "check", "--base", "HEAD~1"]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(
        out.contains("error: tool `read_document`: a breaking schema change"),
        "{out}"
    );
    assert!(out.contains("help: set `version: 1.1.0`"), "{out}");
    assert!(
        out.contains("2 version rule violation(s) against `HEAD~1`"),
        "{out}"
    );
    let (code, out, _) = run(
        dir,
        &["policy", "check", "--base", "HEAD~1", "--format", "json"],
    );
    assert_eq!(code, 5);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["ok"], true, "the policy itself loads");
    assert_eq!(report["base"]["ok"], false);
    assert_eq!(report["base"]["violations"].as_array().unwrap().len(), 2);
    // Against itself every rule holds; and commit 2 bumped what it changed.
    let (code, out, _) = run(dir, &["policy", "check", "--base", "HEAD"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("version rules: ok against `HEAD`"), "{out}");
    git(dir, &["checkout", "-q", "HEAD~1"]);
    assert_eq!(run(dir, &["policy", "check", "--base", "HEAD~1"]).0, 0);
    // An unknown base cannot be compared.
    let (code, _, err) = run(dir, &["policy", "check", "--base", "no-such-branch"]);
    assert_eq!(code, 4);
    assert!(
        err.contains("git does not know the revision `no-such-branch`"),
        "{err}"
    );
}

#[test]
fn text_and_markdown_show_the_same_changes() {
    let tmp = history();
    let dir = tmp.path();
    let (code, text, _) = run(dir, &["policy", "diff", "HEAD~2", "HEAD~1"]);
    assert_eq!(code, 0);
    for line in [
        "policy diff: HEAD~2 (",
        "access (role / lane / tool):",
        "  widening   `research_agent` may now call `conflict_check` in lane `intake`",
        "  widening   lane `filing` no longer requires scope key `matter_id`",
        "  narrowing  lane `intake` now prohibits flag `urgent`",
        "  neutral    tool `case_lookup`: output schema changed (breaking)",
        "/properties/opened: property `opened` removed (breaking)",
        "roles.yaml     2026.11.2 (content changed, version not bumped)",
    ] {
        assert!(text.contains(line), "`{line}` not in\n{text}");
    }
    assert!(
        text.ends_with("6 widening, 1 narrowing, 3 neutral\n"),
        "{text}"
    );

    let (code, md, _) = run(
        dir,
        &["policy", "diff", "HEAD~2", "HEAD~1", "--format", "markdown"],
    );
    assert_eq!(code, 0);
    for line in [
        "## toolgate policy diff",
        "**This change widens access.**",
        "| Section | Widening | Narrowing | Neutral |",
        "| access (role / lane / tool) | 4 | 0 | 0 |",
        "| **total** | **6** | **1** | **3** |",
        "| **widening** | `supervisor` may now call `legal_search` in lane `drafting` |",
        "| narrowing | lane `intake` now prohibits flag `urgent` |",
        "<details><summary>output schema of `case_lookup`: breaking</summary>",
        "| `/properties/opened` | breaking | property `opened` removed |",
    ] {
        assert!(md.contains(line), "`{line}` not in\n{md}");
    }
    // The summary table comes before the details.
    assert!(md.find("| **total** |").unwrap() < md.find("### Details").unwrap());
}

#[test]
fn sides_that_cannot_be_read_or_loaded_exit_4() {
    let tmp = history();
    let dir = tmp.path();
    let (code, _, err) = run(dir, &["policy", "diff", "no-such-rev", "HEAD"]);
    assert_eq!(code, 4);
    assert!(
        err.contains("error: OLD: git does not know the revision `no-such-rev`"),
        "{err}"
    );
    assert!(err.contains("help:"), "{err}");
    let (code, _, err) = run(dir, &["policy", "diff", "HEAD", "--output=/tmp/x"]);
    assert_eq!(code, 4, "{err}");

    let broken = dir.join("broken");
    demo_into(&broken);
    fs::write(broken.join("policy/roles.yaml"), "version: [\n").unwrap();
    let (code, out, err) = run(dir, &["policy", "diff", "HEAD", "broken"]);
    assert_eq!(code, 4, "{out}");
    assert!(
        err.contains("error: the new policy (`broken`) did not load (1 problem)"),
        "{err}"
    );
    assert!(err.contains("  broken/policy/roles.yaml:1:"), "{err}");
    assert!(err.contains("roles.yaml"), "{err}");

    // In a revision, a problem is located as git names the file.
    fs::write(dir.join("policy/roles.yaml"), "version: [\n").unwrap();
    git(dir, &["commit", "-q", "-a", "-m", "broken"]);
    let (code, _, err) = run(dir, &["policy", "diff", "HEAD~1", "HEAD"]);
    assert_eq!(code, 4);
    assert!(err.contains("error: the new policy (`HEAD ("), "{err}");
    assert!(err.contains("  HEAD:policy/roles.yaml:1:"), "{err}");
    assert!(!err.contains("toolgate-diff-"), "no temporary path: {err}");

    let outside = tempfile::tempdir().unwrap();
    let (code, _, err) = run(outside.path(), &["policy", "diff", "HEAD~1", "HEAD"]);
    assert_eq!(code, 4);
    assert!(err.contains("is not inside a git work tree"), "{err}");
}

/// A pull request on the demo policy that widens access (research_agent may also act in
/// intake) and commits, beside it, whatever `plant` puts in the work tree. The base
/// branch is `origin/main` (the demo policy), as in the documented CI job.
fn pull_request(plant: impl FnOnce(&Path)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    git(root, &["init", "-q"]);
    demo_into(root);
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "demo policy"]);
    git(root, &["update-ref", "refs/remotes/origin/main", "HEAD"]);
    edit(
        &root.join("policy/roles.yaml"),
        "lanes: [research]\n",
        "lanes: [research, intake]\n",
    );
    plant(root);
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "widen research_agent"]);
    tmp
}

/// The CI gate of docs/policy-review.md, run in the pull request's own checkout.
fn gate(dir: &Path, old: &str, new: &str) -> (i32, String, String) {
    run(dir, &["policy", "diff", old, new, "--fail-on", "widening"])
}

#[test]
fn a_committed_directory_cannot_stand_for_the_base_of_the_gate() {
    // The pull request commits `origin/main/` holding a copy of its own (widened)
    // policy: read as a directory, OLD would equal NEW and nothing would widen.
    let tmp = pull_request(|root| {
        common::copy_dir(&root.join("policy"), &root.join("origin/main/policy"));
        common::copy_dir(&root.join("tools"), &root.join("origin/main/tools"));
    });
    let dir = tmp.path();
    let (code, out, err) = gate(dir, "origin/main", "HEAD");
    assert_eq!(code, 4, "refused, not compared: {out}{err}");
    assert!(
        err.contains("error: OLD: `origin/main` names both a directory (`./origin/main`) and a git revision (commit "),
        "{err}"
    );
    assert!(
        err.contains("help: write `./origin/main` for the directory, or `"),
        "{err}"
    );
    // Said explicitly, the directory is compared (and this one widens nothing).
    let (code, out, _) = gate(dir, "./origin/main", "HEAD");
    assert_eq!(code, 0, "{out}");
    // The real base is still reachable under a name no directory shadows.
    let (code, out, _) = gate(dir, "refs/remotes/origin/main", "HEAD");
    assert_eq!(code, 1, "the change widens: {out}");
    // A base that was not fetched: the bare name is a directory of the work tree
    // only, which does not stand for OLD.
    git(dir, &["update-ref", "-d", "refs/remotes/origin/main"]);
    let (code, out, err) = gate(dir, "origin/main", "HEAD");
    assert_eq!(code, 4, "{out}{err}");
    assert!(
        err.contains("error: OLD: `origin/main` is a directory inside the git work tree"),
        "{err}"
    );
}

#[test]
fn a_committed_directory_cannot_stand_for_head() {
    // The pull request commits `HEAD/` holding the old policy: read as a directory,
    // NEW would be the old policy and nothing would widen.
    let tmp = pull_request(|root| {
        common::copy_dir(&repo().join("policy"), &root.join("HEAD/policy"));
        common::copy_dir(&repo().join("tools"), &root.join("HEAD/tools"));
    });
    let dir = tmp.path();
    let (code, out, err) = gate(dir, "origin/main", "HEAD");
    assert_eq!(code, 4, "refused, not compared: {out}{err}");
    assert!(
        err.contains("error: NEW: `HEAD` names both a directory (`./HEAD`) and a git revision"),
        "{err}"
    );
    // A path that is not a directory is never tried as a revision.
    let (code, _, err) = gate(dir, "origin/main", "./no-such-dir");
    assert_eq!(code, 4);
    assert!(err.contains("`./no-such-dir` is not a directory"), "{err}");
}

/// The demo policy with an identity provider `corp` and a role `workload_drafter`
/// proven by its JWTs (`groups: drafters`, one subject), in `root`.
fn demo_with_identity(root: &Path) {
    demo_into(root);
    let roles = root.join("policy/roles.yaml");
    let text = fs::read_to_string(&roles).unwrap();
    let text = text
        .replacen(
            "\nroles:\n",
            "\nidentity_providers:\n  - id: corp\n    issuer: \"https://idp.example\"\n    audience: toolgate\n    jwks_uri: \"https://idp.example/jwks\"\n    algorithms: [RS256]\n    leeway_s: 30\n\nroles:\n",
            1,
        )
        .replacen(
            "\nadmins:\n",
            "\n  - role_id: workload_drafter\n    description: Drafts as a platform workload.\n    enabled: true\n    lanes: [drafting]\n    credential:\n      jwt: {provider: corp, claim: groups, value: drafters, subject: \"system:serviceaccount:legal:drafter\"}\n\nadmins:\n",
            1,
        );
    fs::write(&roles, text).unwrap();
}

/// `policy diff old new --format json` in `dir` (not a repository), with its exit code.
fn diff_dirs(dir: &Path) -> (i32, Value) {
    let (code, out, err) = run(dir, &["policy", "diff", "old", "new", "--format", "json"]);
    assert!(code == 0 || code == 1, "{out}{err}");
    (code, serde_json::from_str(&out).unwrap())
}

#[test]
fn identity_provider_changes_are_compared_and_gated() {
    let tmp = tempfile::tempdir().unwrap();
    let (old, new) = (tmp.path().join("old"), tmp.path().join("new"));
    demo_with_identity(&old);
    demo_with_identity(&new);
    let roles = new.join("policy/roles.yaml");
    // The attack: the provider's keys now come from the attacker, more algorithms,
    // more clock skew; run tokens may live 30 days.
    edit(
        &roles,
        "https://idp.example/jwks",
        "https://attacker.example/jwks",
    );
    edit(&roles, "algorithms: [RS256]", "algorithms: [ES256, RS256]");
    edit(&roles, "leeway_s: 30", "leeway_s: 300");
    edit(
        &roles,
        "\nroles:\n",
        "\nrun_tokens:\n  max_ttl_s: 2592000\n\nroles:\n",
    );
    let (code, out, _) = run(
        tmp.path(),
        &["policy", "diff", "old", "new", "--fail-on", "widening"],
    );
    assert_eq!(code, 1, "the gate sees it: {out}");
    for line in [
        "identity providers and run tokens:",
        "  widening   identity provider `corp` changed (jwks_uri changed from `https://idp.example/jwks` to `https://attacker.example/jwks`, algorithm `ES256` added, leeway_s raised from 30 to 300)",
        "  widening   run tokens: `max_ttl_s` raised from 86400 to 2592000",
    ] {
        assert!(out.contains(line), "`{line}` not in\n{out}");
    }
    let (_, report) = diff_dirs(tmp.path());
    let provider = find(&report, &[("kind", "identity_provider_changed")]);
    assert_eq!(provider["section"], "identity");
    assert_eq!(provider["effect"], "widening");
    assert_eq!(provider["before"]["jwks_uri"], "https://idp.example/jwks");
    assert_eq!(
        provider["after"]["jwks_uri"],
        "https://attacker.example/jwks"
    );
    let ttl = find(&report, &[("kind", "run_token_max_ttl_changed")]);
    assert_eq!(ttl["effect"], "widening");
    let (_, md, _) = run(
        tmp.path(),
        &["policy", "diff", "old", "new", "--format", "markdown"],
    );
    assert!(
        md.contains("| identity providers and run tokens | 2 | 0 | 0 |"),
        "{md}"
    );

    // A changed issuer or audience widens; a tighter provider narrows.
    fs::remove_dir_all(&new).unwrap();
    demo_with_identity(&new);
    let roles = new.join("policy/roles.yaml");
    edit(
        &roles,
        "issuer: \"https://idp.example\"",
        "issuer: \"https://evil.example\"",
    );
    edit(&roles, "audience: toolgate", "audience: anything");
    let (code, report) = diff_dirs(tmp.path());
    assert_eq!(code, 0);
    let provider = find(&report, &[("kind", "identity_provider_changed")]);
    assert_eq!(provider["effect"], "widening");
    let message = provider["message"].as_str().unwrap();
    assert!(message.contains("issuer changed"), "{message}");
    assert!(message.contains("audience changed"), "{message}");
    fs::remove_dir_all(&new).unwrap();
    demo_with_identity(&new);
    edit(
        &new.join("policy/roles.yaml"),
        "leeway_s: 30",
        "leeway_s: 5",
    );
    let (_, report) = diff_dirs(tmp.path());
    let provider = find(&report, &[("kind", "identity_provider_changed")]);
    assert_eq!(provider["effect"], "narrowing");

    // A provider added that nothing names is neutral, and says so.
    fs::remove_dir_all(&new).unwrap();
    demo_with_identity(&new);
    edit(
        &new.join("policy/roles.yaml"),
        "\nroles:\n",
        "  - id: spare\n    issuer: \"https://spare.example\"\n    audience: toolgate\n    jwks_uri: \"https://spare.example/jwks\"\n\nroles:\n",
    );
    let (_, report) = diff_dirs(tmp.path());
    let added = find(&report, &[("kind", "identity_provider_added")]);
    assert_eq!(added["effect"], "neutral");
    assert!(
        added["message"]
            .as_str()
            .unwrap()
            .contains("no role or admin names it"),
        "{added}"
    );
}

#[test]
fn credential_changes_that_let_more_callers_in_widen() {
    const INTAKE: &str =
        "token_sha256: 8ae24a0b3740624043a86db83a36b9a5c6f5737a831bfdf70cb6b4fbad6b4018";
    const OPS: &str =
        "token_sha256: cce7a2cf1ae045989cfc914fb95a41526f167a838b3c7d33745143614abace7c";
    const WORKLOAD: &str = "jwt: {provider: corp, claim: groups, value: drafters, subject: \"system:serviceaccount:legal:drafter\"}";
    let other_token = format!("token_sha256: {}", "ab".repeat(32));
    // (what is replaced, by what, the role or admin, the expected effect)
    let cases: Vec<(&str, String, (&str, &str), &str)> = vec![
        // To a JWT from a static token: every workload of the group proves the role.
        (
            INTAKE,
            "jwt: {provider: corp, claim: groups, value: intake}".into(),
            ("role", "intake_agent"),
            "widening",
        ),
        // Run tokens only -> a static token that calls tools in any run.
        (
            "run_tokens_only: true",
            other_token.clone(),
            ("role", "paralegal_agent"),
            "widening",
        ),
        // The subject dropped: any workload of the group, not one.
        (
            WORKLOAD,
            "jwt: {provider: corp, claim: groups, value: drafters}".into(),
            ("role", "workload_drafter"),
            "widening",
        ),
        // Another group value.
        (
            WORKLOAD,
            "jwt: {provider: corp, claim: groups, value: everyone, subject: \"system:serviceaccount:legal:drafter\"}".into(),
            ("role", "workload_drafter"),
            "widening",
        ),
        // An admin proven by a JWT.
        (
            OPS,
            "jwt: {provider: corp, claim: groups, value: ops}".into(),
            ("admin", "ops"),
            "widening",
        ),
        // Static token rotations stay neutral.
        (INTAKE, other_token.clone(), ("role", "intake_agent"), "neutral"),
        (
            INTAKE,
            "token_env: INTAKE_TOKEN".into(),
            ("role", "intake_agent"),
            "neutral",
        ),
        (OPS, other_token.clone(), ("admin", "ops"), "neutral"),
        // Tighter: run tokens only.
        (
            INTAKE,
            "run_tokens_only: true".into(),
            ("role", "intake_agent"),
            "narrowing",
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let (old, new) = (tmp.path().join("old"), tmp.path().join("new"));
    demo_with_identity(&old);
    for (i, (from, to, (who, id), effect)) in cases.iter().enumerate() {
        let _ = fs::remove_dir_all(&new);
        demo_with_identity(&new);
        edit(&new.join("policy/roles.yaml"), from, to);
        let (code, report) = diff_dirs(tmp.path());
        assert_eq!(code, 0, "case {i}");
        let kind = if *who == "role" {
            "role_credential_changed"
        } else {
            "admin_credential_changed"
        };
        let change = find(&report, &[("kind", kind), (*who, *id)]);
        assert_eq!(change["effect"], *effect, "case {i}: {change}");
        let message = change["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("{who} `{id}`: credential changed")),
            "case {i}: {message}"
        );
    }
}

#[test]
fn a_renamed_anchored_definition_is_not_an_annotation() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    git(root, &["init", "-q"]);
    demo_into(root);
    let input = root.join("tools/legal_search/schema/input.json");
    edit_json(&input, |s| {
        s["properties"]["limit"] = serde_json::json!({"$ref": "#limit"});
        s["$defs"] = serde_json::json!({
            "Limit": {"$anchor": "limit", "type": "integer", "minimum": 1, "maximum": 50}
        });
    });
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "anchored limit"]);
    // Renamed, and the maximum dropped: `#limit` now resolves to the looser one.
    edit_json(&input, |s| {
        s["$defs"] = serde_json::json!({
            "Limit2": {"$anchor": "limit", "type": "integer", "minimum": 1}
        });
    });
    git(root, &["commit", "-q", "-a", "-m", "rename the definition"]);
    let (code, out, err) = run(
        root,
        &["policy", "diff", "HEAD~1", "HEAD", "--format", "json"],
    );
    assert_eq!(code, 5, "a version rule violation: {out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let input = find(
        &report,
        &[("kind", "input_schema_changed"), ("tool", "legal_search")],
    );
    assert_eq!(input["effect"], "widening", "{input}");
    assert_eq!(input["schema"]["class"], "breaking");
    let (code, out, _) = run(root, &["policy", "check", "--base", "HEAD~1"]);
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains(
            "error: tool `legal_search`: a breaking schema change needs a major version bump"
        ),
        "{out}"
    );
}
