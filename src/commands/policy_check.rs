//! `toolgate policy check`: load the policy (and build its adapters) and report.
//!
//! Text output is for people: the three files with their versions and hashes and the
//! policy's notes (`file: note: message`, a `help:` line; they do not change the exit
//! code), or every problem as `file:line:col: error: message` with a `help:` line.
//! `--format json` prints one JSON object for machines. Both go to stdout; the exit code says which.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};

use crate::commands::{Exit, Format, PolicyCheckArgs};
use crate::policy::{Policy, Problem, load, notes, sort_problems, tools_dir};
use crate::review::diff::{DiffError, Violation, base_violations};

/// Runs the check; `Exit::Ok` when the policy loads and its adapters build,
/// `Exit::InvalidConfig` when there is any problem (or `--base` cannot be compared),
/// `Exit::SchemaError` when `--base` finds a version rule violation, `Exit::Failure`
/// when the report cannot be written.
pub fn check_command(args: &PolicyCheckArgs) -> Exit {
    let outcome = check(
        &args.location.policy_dir,
        &args.location.tools,
        &args.data_dir,
    );
    // With --base, a policy that loads is also held to the version rules.
    let base = match (&args.base, &outcome) {
        (Some(rev), Ok(_)) => Some(BaseCheck::run(
            &args.location.policy_dir,
            &args.location.tools,
            rev,
        )),
        _ => None,
    };
    let exit = match (&outcome, base.as_ref().and_then(|b| b.exit())) {
        (Err(_), _) => Exit::InvalidConfig,
        (Ok(_), Some(exit)) => exit,
        (Ok(_), None) => Exit::Ok,
    };
    let text = match args.format {
        Format::Text => {
            let mut text = render_text(&outcome);
            if let Some(base) = &base {
                text.push_str(&base.text());
            }
            text
        }
        Format::Json => render_json(&outcome, base.as_ref().map(|b| b.json())),
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => exit,
        Err(_) => Exit::Failure,
    }
}

/// Loads the policy, then builds its adapters (which check adapter settings) with the
/// tools directory and the default data directory.
fn check(policy_dir: &Path, tools_file: &Path, data_dir: &Path) -> Result<Policy, Vec<Problem>> {
    let policy = load(policy_dir, tools_file)?;
    let env = crate::adapter::AdapterEnv {
        tools_dir: tools_dir(tools_file),
        data_dir: data_dir.to_path_buf(),
    };
    match crate::adapter::build(&policy, &env) {
        // An empty list carries no problem (the adapters are not built by this check).
        Err(mut problems) if !problems.is_empty() => {
            sort_problems(&mut problems);
            Err(problems)
        }
        _ => Ok(policy),
    }
}

fn render_text(outcome: &Result<Policy, Vec<Problem>>) -> String {
    let mut out = String::new();
    match outcome {
        Ok(policy) => {
            let v = &policy.versions;
            let source = &policy.source;
            let roles_file = Path::new(&source.policy_dir)
                .join("roles.yaml")
                .display()
                .to_string();
            let lanes_file = Path::new(&source.policy_dir)
                .join("lanes.yaml")
                .display()
                .to_string();
            let files = [
                (roles_file, &v.roles),
                (lanes_file, &v.lanes),
                (source.tools_file.clone(), &v.registry),
            ];
            let width = files.iter().map(|(f, _)| f.len()).max().unwrap_or(0);
            for (file, version) in &files {
                out.push_str(&format!(
                    "{file:width$}  version {}  sha256 {}\n",
                    version.version, version.sha256
                ));
            }
            match (&source.git_commit, source.git_dirty) {
                (Some(commit), Some(true)) => {
                    out.push_str(&format!("git commit {commit} (policy files modified)\n"))
                }
                (Some(commit), Some(false)) => {
                    out.push_str(&format!("git commit {commit} (clean)\n"))
                }
                (Some(commit), None) => out.push_str(&format!("git commit {commit}\n")),
                (None, _) => out.push_str("git: not inside a work tree\n"),
            }
            let enabled = policy.tools.values().filter(|t| t.enabled).count();
            out.push_str(&format!(
                "ok: {}, {}, {}, {} ({enabled} enabled)\n",
                count(policy.roles.len(), "role"),
                count(policy.admins.len(), "admin"),
                count(policy.lanes.len(), "lane"),
                count(policy.tools.len(), "tool"),
            ));
            for note in notes(policy) {
                out.push_str(&format!("{}: note: {}\n", note.file, note.message));
                out.push_str(&format!("  help: {}\n", note.help));
            }
        }
        Err(problems) => {
            for problem in problems {
                out.push_str(&problem.file);
                if let Some(line) = problem.line {
                    out.push_str(&format!(":{line}"));
                    if let Some(column) = problem.column {
                        out.push_str(&format!(":{column}"));
                    }
                }
                out.push_str(&format!(": error: {}\n", problem.message));
                if let Some(help) = &problem.help {
                    out.push_str(&format!("  help: {help}\n"));
                }
            }
            out.push_str(&format!(
                "error: {} found; the policy was not loaded\n",
                count(problems.len(), "problem")
            ));
        }
    }
    out
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn render_json(outcome: &Result<Policy, Vec<Problem>>, base: Option<Value>) -> String {
    let mut value: Value = match outcome {
        Ok(policy) => json!({
            "ok": true,
            "versions": policy.versions,
            "source": policy.source,
            "counts": {
                "roles": policy.roles.len(),
                "admins": policy.admins.len(),
                "lanes": policy.lanes.len(),
                "tools": policy.tools.len(),
                "tools_enabled": policy.tools.values().filter(|t| t.enabled).count(),
            },
            "problems": [],
            "notes": notes(policy),
        }),
        Err(problems) => json!({
            "ok": false,
            "versions": null,
            "source": null,
            "counts": null,
            "problems": problems,
            "notes": [],
        }),
    };
    if let (Some(base), Some(object)) = (base, value.as_object_mut()) {
        object.insert("base".into(), base);
    }
    let mut text =
        serde_json::to_string_pretty(&value).unwrap_or_else(|_| String::from("{\"ok\": false}"));
    text.push('\n');
    text
}

/// The outcome of `policy check --base REV`, rendered by `policy check`.
#[derive(Debug)]
pub struct BaseCheck {
    pub rev: String,
    pub result: Result<(Option<String>, Vec<Violation>), DiffError>,
}

impl BaseCheck {
    pub fn run(policy_dir: &Path, tools_file: &Path, rev: &str) -> BaseCheck {
        BaseCheck {
            rev: rev.to_string(),
            result: base_violations(policy_dir, tools_file, rev)
                .map(|(side, violations)| (side.commit.clone(), violations)),
        }
    }

    /// Exit 4 when the base could not be compared, 5 on a violation, else None.
    pub fn exit(&self) -> Option<Exit> {
        match &self.result {
            Err(_) => Some(Exit::InvalidConfig),
            Ok((_, v)) if !v.is_empty() => Some(Exit::SchemaError),
            Ok(_) => None,
        }
    }

    fn against(&self, commit: &Option<String>) -> String {
        match commit {
            Some(c) => format!("`{}` ({})", self.rev, c.get(..12).unwrap_or(c)),
            None => format!("`{}`", self.rev),
        }
    }

    /// Lines for the text report (the error itself goes to stderr).
    pub fn text(&self) -> String {
        match &self.result {
            Err(e) => {
                eprint!("{}", e.message());
                format!(
                    "error: the version rules could not be checked against `{}`\n",
                    self.rev
                )
            }
            Ok((commit, violations)) if violations.is_empty() => {
                format!("version rules: ok against {}\n", self.against(commit))
            }
            Ok((commit, violations)) => {
                let mut out = String::new();
                for v in violations {
                    out.push_str(&format!("error: {}\n  help: {}\n", v.message, v.help));
                }
                out.push_str(&format!(
                    "error: {} version rule violation(s) against {}\n",
                    violations.len(),
                    self.against(commit)
                ));
                out
            }
        }
    }

    /// The `base` member of the JSON report.
    pub fn json(&self) -> serde_json::Value {
        match &self.result {
            Err(e) => {
                eprint!("{}", e.message());
                serde_json::json!({ "rev": self.rev, "ok": false, "error": "the base could not be compared", "violations": [] })
            }
            Ok((commit, violations)) => serde_json::json!({
                "rev": self.rev,
                "commit": commit,
                "ok": violations.is_empty(),
                "violations": violations,
            }),
        }
    }
}
