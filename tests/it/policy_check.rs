//! `toolgate policy check` through the real binary: the shipped policy passes, every
//! broken fixture under tests/fixtures/policy/ is refused with its problem, the JSON
//! format parses, and the contract schemas accept the shipped YAML.
//!
//! Each fixture is its own test case (rstest's `#[files]`), so a new case is a new
//! directory (see tests/fixtures/policy/README.md for the format).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use rstest::rstest;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common;

const BIN: &str = env!("CARGO_BIN_EXE_toolgate");
/// The environment variable the `token_env_unset` fixture names; never set in tests.
const UNSET_VAR: &str = "TOOLGATE_FIXTURE_UNSET_TOKEN";
/// A generous bound that only proves "no hang" (an alias bomb must not take minutes).
const NO_HANG: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures() -> PathBuf {
    repo().join("tests/fixtures/policy")
}

/// Runs the binary in `dir` and waits at most [`NO_HANG`].
fn toolgate(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .current_dir(dir)
        .env_remove(UNSET_VAR)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    if !crate::common::poll_until(NO_HANG, || child.try_wait().unwrap().is_some()) {
        child.kill().unwrap();
        panic!(
            "toolgate {args:?} in {} did not finish within {NO_HANG:?}",
            dir.display()
        );
    }
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// A temp dir holding a copy of the shipped `policy/` and `tools/`.
fn demo_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    common::demo::Demo::copy_into(dir.path());
    dir
}

fn sha256_file(path: &Path) -> String {
    hex::encode(Sha256::digest(fs::read(path).unwrap()))
}

// ---------------------------------------------------------------------------------------
// Fixtures

/// One fixture's `expect.yaml` (format: tests/fixtures/policy/README.md). A key the
/// format does not know, a typo included, fails the fixture.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    #[serde(default)]
    setup: Vec<SetupStep>,
    /// The file the problem must name, as printed (relative to the temp dir).
    file: String,
    /// The line the problem must name; `~` for a problem with the whole file.
    line: Option<usize>,
    /// A substring of the problem's message.
    message: String,
    /// How many problems the check must report in all.
    count: usize,
}

/// A change applied after the overlay, to make what cannot be committed.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum SetupStep {
    /// Pads the file past 10 MiB (too big to commit).
    Oversize(String),
    /// Replaces the file with a symlink to `target`.
    Symlink { path: String, target: String },
    /// Replaces the file with a directory.
    Directory(String),
    /// Deletes the file.
    Remove(String),
}

fn read_expect(case: &Path) -> Expect {
    let path = case.join("expect.yaml");
    let text = fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The demo policy with the fixture's files laid over it, then its setup steps applied.
fn materialize(case: &Path, expect: &Expect) -> tempfile::TempDir {
    let dir = demo_copy();
    for entry in fs::read_dir(case).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            common::copy_dir(&entry.path(), &dir.path().join(entry.file_name()));
        }
    }
    for step in &expect.setup {
        match step {
            SetupStep::Oversize(file) => {
                let path = dir.path().join(file);
                let mut text = fs::read_to_string(&path).unwrap();
                text.push('#');
                text.push_str(&"x".repeat(10 * 1024 * 1024));
                text.push('\n');
                fs::write(&path, text).unwrap();
            }
            SetupStep::Symlink { path, target } => {
                let path = dir.path().join(path);
                fs::remove_file(&path).unwrap();
                std::os::unix::fs::symlink(target, &path).unwrap();
            }
            SetupStep::Directory(file) => {
                let path = dir.path().join(file);
                fs::remove_file(&path).unwrap();
                fs::create_dir(&path).unwrap();
            }
            SetupStep::Remove(file) => fs::remove_file(dir.path().join(file)).unwrap(),
        }
    }
    dir
}

/// Checks one fixture; returns what is wrong, if anything.
fn check_fixture(case: &Path) -> Result<(), String> {
    let expect = read_expect(case);
    let dir = materialize(case, &expect);
    let output = toolgate(dir.path(), &["policy", "check"], &[]);
    let out = stdout(&output);
    if output.status.code() != Some(4) {
        return Err(format!("exit {:?}, want 4\n{out}", output.status.code()));
    }
    let errors: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(": error: ") && !l.starts_with("error:"))
        .collect();
    let location = match expect.line {
        Some(line) => format!("{}:{line}:", expect.file),
        None => format!("{}: error: ", expect.file),
    };
    if !errors
        .iter()
        .any(|l| l.starts_with(&location) && l.contains(&expect.message))
    {
        return Err(format!(
            "no problem at `{location}` containing `{}`\n{out}",
            expect.message
        ));
    }
    if errors.len() != expect.count {
        return Err(format!(
            "{} problems, want {}\n{out}",
            errors.len(),
            expect.count
        ));
    }
    // Every problem comes with advice, and the summary counts them.
    let lines: Vec<&str> = out.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if errors.contains(line)
            && !lines
                .get(i + 1)
                .is_some_and(|next| next.starts_with("  help: "))
        {
            return Err(format!("problem without a help line: {line}"));
        }
    }
    let summary = if errors.len() == 1 {
        "error: 1 problem found".to_string()
    } else {
        format!("error: {} problems found", errors.len())
    };
    if !out.contains(&summary) {
        return Err(format!("missing summary `{summary}`\n{out}"));
    }
    Ok(())
}

/// One test per fixture: `cargo test --test it broken_fixture` lists each by its
/// directory name. The list is taken when the test binary is compiled (CI builds afresh;
/// locally, touch this file after adding a fixture); the test below catches a fixture
/// directory the compiled list could not have picked up.
#[rstest]
fn broken_fixture_is_refused_with_its_problem(
    #[files("tests/fixtures/policy/*/expect.yaml")] expect: PathBuf,
) {
    let case = expect.parent().unwrap();
    if let Err(why) = check_fixture(case) {
        panic!("{}: {why}", case.file_name().unwrap().to_string_lossy());
    }
}

#[test]
fn every_fixture_directory_has_an_expect_yaml() {
    let mut cases = 0;
    for entry in fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            cases += 1;
            assert!(
                path.join("expect.yaml").is_file(),
                "{} has no expect.yaml, so no test case",
                path.display()
            );
            read_expect(&path);
        }
    }
    assert!(cases >= 18, "only {cases} fixtures");
}

/// A typo in a key of expect.yaml fails instead of being ignored.
#[test]
fn a_typo_in_an_expect_key_is_refused() {
    let good = "file: \"policy/roles.yaml\"\nline: 3\nmessage: \"m\"\ncount: 1\n";
    assert!(serde_saphyr::from_str::<Expect>(good).is_ok());
    for bad in [
        good.replace("count", "cuont"),
        good.to_string() + "setup:\n  - oversise: \"policy/roles.yaml\"\n",
        good.to_string() + "setup:\n  - symlink: {path: a, target: b, mode: c}\n",
        good.replace("count: 1\n", ""),
    ] {
        assert!(
            serde_saphyr::from_str::<Expect>(&bad).is_err(),
            "accepted:\n{bad}"
        );
    }
}

#[test]
fn problems_are_reported_all_at_once_and_sorted() {
    let dir = demo_copy();
    let roles = dir.path().join("policy/roles.yaml");
    let text = fs::read_to_string(&roles)
        .unwrap()
        .replace("lanes: [research]", "lanes: [reserch]");
    fs::write(&roles, text).unwrap();
    let registry = dir.path().join("tools/tool_registry.yaml");
    let text = fs::read_to_string(&registry)
        .unwrap()
        .replace("version: 1.0.0", "version: \"1\"");
    fs::write(&registry, text).unwrap();

    let output = toolgate(dir.path(), &["policy", "check"], &[]);
    assert_eq!(output.status.code(), Some(4));
    let out = stdout(&output);
    let errors: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(": error: ") && !l.starts_with("error:"))
        .collect();
    // One dangling lane plus one bad version per tool (7 tools).
    assert_eq!(errors.len(), 8, "{out}");
    assert!(errors[0].starts_with("policy/roles.yaml:"), "{out}");
    let key = |l: &&str| -> (String, usize) {
        let mut parts = l.split(':');
        (
            parts.next().unwrap().to_string(),
            parts.next().unwrap().parse().unwrap(),
        )
    };
    let keys: Vec<(String, usize)> = errors.iter().map(key).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
}

// ---------------------------------------------------------------------------------------
// The shipped policy

#[test]
fn the_shipped_policy_passes_and_prints_versions_and_hashes() {
    let output = toolgate(&repo(), &["policy", "check"], &[]);
    let out = stdout(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for (file, version) in [
        ("policy/roles.yaml", "2026.11.2"),
        ("policy/lanes.yaml", "2026.11.1"),
        ("tools/tool_registry.yaml", "2026.11.2"),
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(file))
            .unwrap_or_else(|| panic!("{file} missing\n{out}"));
        assert!(line.contains(&format!("version {version}")), "{line}");
        assert!(
            line.contains(&format!("sha256 {}", sha256_file(&repo().join(file)))),
            "{line}"
        );
    }
    assert!(
        out.contains("ok: 7 roles, 1 admin, 4 lanes, 7 tools (6 enabled)"),
        "{out}"
    );
    assert!(
        !out.contains("note:"),
        "the demo's approvers are people: {out}"
    );
}

#[test]
fn the_json_format_parses_for_success_and_failure() {
    let output = toolgate(&repo(), &["policy", "check", "--format", "json"], &[]);
    assert_eq!(output.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["problems"], serde_json::json!([]));
    assert_eq!(report["counts"]["tools"], 7);
    assert_eq!(report["notes"], serde_json::json!([]));
    for (key, file, version) in [
        ("roles", "policy/roles.yaml", "2026.11.2"),
        ("lanes", "policy/lanes.yaml", "2026.11.1"),
        ("registry", "tools/tool_registry.yaml", "2026.11.2"),
    ] {
        assert_eq!(report["versions"][key]["version"], version);
        assert_eq!(
            report["versions"][key]["sha256"],
            sha256_file(&repo().join(file)).as_str()
        );
    }
    assert_eq!(report["source"]["policy_dir"], "policy");

    let case = fixtures().join("dangling_role_lane");
    let dir = materialize(&case, &read_expect(&case));
    let output = toolgate(dir.path(), &["policy", "check", "--format", "json"], &[]);
    assert_eq!(output.status.code(), Some(4));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["versions"], Value::Null);
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0]["file"], "policy/roles.yaml");
    assert_eq!(problems[0]["line"], 31);
    assert_eq!(problems[0]["column"], 13);
    assert!(
        problems[0]["message"]
            .as_str()
            .unwrap()
            .contains("unknown lane `reserch`")
    );
    assert!(
        problems[0]["help"]
            .as_str()
            .unwrap()
            .contains("did you mean `research`?")
    );
}

#[test]
fn a_token_env_credential_loads_when_its_variable_is_set() {
    let dir = demo_copy();
    let roles = dir.path().join("policy/roles.yaml");
    let text = fs::read_to_string(&roles).unwrap().replace(
        "token_sha256: 16d03fae9f13c31ac5d0b7bfa9cdce62d2b435c88519002c541a7509c216f0a5",
        "token_env: TOOLGATE_TEST_FILING_TOKEN",
    );
    fs::write(&roles, text).unwrap();
    let set = toolgate(
        dir.path(),
        &["policy", "check"],
        &[("TOOLGATE_TEST_FILING_TOKEN", "demo-filing_agent")],
    );
    assert_eq!(set.status.code(), Some(0), "{}", stdout(&set));
    let unset = toolgate(dir.path(), &["policy", "check"], &[]);
    assert_eq!(unset.status.code(), Some(4));
    assert!(
        stdout(&unset).contains("environment variable `TOOLGATE_TEST_FILING_TOKEN` is not set")
    );
}

/// An approver that is a role with lanes is an agent's credential too: the policy is
/// valid (exit 0), and both formats name the approver, the tool or lane, and its lanes.
/// A role without lanes, an admin and a disabled role are not noted.
#[test]
fn an_approver_that_is_an_agent_role_is_noted() {
    let dir = demo_copy();
    let tools = dir.path().join("tools/tool_registry.yaml");
    let text = fs::read_to_string(&tools).unwrap();
    assert!(
        text.contains("approvers: [ops, attorney]"),
        "the demo's approvers moved"
    );
    fs::write(
        &tools,
        text.replace(
            "approvers: [ops, attorney]",
            "approvers: [ops, attorney, supervisor, intake_agent]",
        ),
    )
    .unwrap();
    let roles = dir.path().join("policy/roles.yaml");
    let text = fs::read_to_string(&roles).unwrap();
    let intake = "  - role_id: intake_agent\n    description: Opens new matters and runs conflict checks for prospective clients.\n    enabled: true";
    assert!(text.contains(intake), "intake_agent's entry moved");
    fs::write(
        &roles,
        text.replace(intake, &intake.replace("enabled: true", "enabled: false")),
    )
    .unwrap();

    let output = toolgate(dir.path(), &["policy", "check"], &[]);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    let notes: Vec<&str> = out.lines().filter(|l| l.contains(": note: ")).collect();
    assert_eq!(notes.len(), 1, "{out}");
    assert!(
        notes[0].starts_with(
            "tools/tool_registry.yaml: note: approver `supervisor` of `tool:file_with_court` \
             is a role that also acts in lanes `drafting`, `filing`, `intake`, `research`"
        ),
        "{out}"
    );
    assert!(out.contains("  help: give approvals to an admin"), "{out}");

    let output = toolgate(dir.path(), &["policy", "check", "--format", "json"], &[]);
    assert_eq!(output.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    let notes = report["notes"].as_array().unwrap();
    assert_eq!(notes.len(), 1, "{report}");
    assert_eq!(notes[0]["owner"], "tool:file_with_court", "{report}");
    assert_eq!(notes[0]["file"], "tools/tool_registry.yaml", "{report}");
}

#[test]
fn paths_are_taken_from_the_flags() {
    let dir = demo_copy();
    fs::rename(dir.path().join("policy"), dir.path().join("rules")).unwrap();
    fs::rename(dir.path().join("tools"), dir.path().join("registry")).unwrap();
    let output = toolgate(
        dir.path(),
        &[
            "policy",
            "check",
            "--policy-dir",
            "rules",
            "--tools",
            "registry/tool_registry.yaml",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    assert!(stdout(&output).contains("rules/roles.yaml"));
    let output = toolgate(dir.path(), &["policy", "check"], &[]);
    assert_eq!(output.status.code(), Some(4));
    assert!(
        stdout(&output)
            .contains("policy/roles.yaml: error: file `policy/roles.yaml` does not exist")
    );
}

// ---------------------------------------------------------------------------------------
// Contract schemas

fn yaml_to_json(path: &Path) -> Value {
    serde_saphyr::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

fn contract(name: &str) -> jsonschema::Validator {
    let schema: Value =
        serde_json::from_slice(&fs::read(repo().join("contract").join(name)).unwrap()).unwrap();
    jsonschema::options().build(&schema).unwrap()
}

#[test]
fn the_shipped_yaml_validates_against_the_contract_schemas() {
    for (file, schema) in [
        ("policy/roles.yaml", "roles.schema.json"),
        ("policy/lanes.yaml", "lanes.schema.json"),
        ("tools/tool_registry.yaml", "tool_registry.schema.json"),
    ] {
        let validator = contract(schema);
        let document = yaml_to_json(&repo().join(file));
        let errors: Vec<String> = validator
            .iter_errors(&document)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{file} against {schema}: {errors:#?}");
    }
}

#[test]
fn broken_fixtures_do_not_validate_against_the_contract_schemas() {
    for (fixture, file, schema) in [
        ("unknown_field", "policy/roles.yaml", "roles.schema.json"),
        (
            "empty_run_statuses",
            "policy/lanes.yaml",
            "lanes.schema.json",
        ),
        (
            "missing_required_field",
            "tools/tool_registry.yaml",
            "tool_registry.schema.json",
        ),
        (
            "invalid_semver",
            "tools/tool_registry.yaml",
            "tool_registry.schema.json",
        ),
        (
            "flag_rule_bad_pointer",
            "tools/tool_registry.yaml",
            "tool_registry.schema.json",
        ),
    ] {
        let document = yaml_to_json(&fixtures().join(fixture).join(file));
        assert!(
            !contract(schema).is_valid(&document),
            "{fixture}/{file} validates against {schema}"
        );
    }
}
