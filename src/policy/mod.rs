//! The policy: `policy/roles.yaml`, `policy/lanes.yaml` and `tools/tool_registry.yaml`,
//! loaded strictly and validated as one.
//!
//! Loading happens in two phases: raw serde types that reject unknown fields
//! (`raw`), then one validation step (`validate`) that checks every cross-reference and
//! builds the [`Policy`] model, reporting every problem at once with file, line and
//! column. The file format is documented field by field in docs/policy.md.
//!
//! - `read`: bounded, symlink-safe file reading and the YAML parser's budget.
//! - `raw`: the serde shapes of the three files.
//! - `validate`: every rule, and the model it builds.
//! - `schema`: tool input/output JSON Schemas (paths, meta-schema, compilation).
//! - `git`: the commit a policy was loaded from.
//! - `flags`: which flags a call raises and which prohibitions they hit.
//! - `notes`: what a valid policy allows that its reviewers should still see.
//!
//! INVARIANT: only this module knows YAML. A policy that fails to load is never
//! returned, so it can never replace one that works.

pub mod condition;
mod flags;
pub(crate) mod git;
mod identity;
mod model;
mod notes;
mod raw;
mod read;
mod schema;
pub mod secrets;
pub mod template;
mod validate;

pub use flags::{ProhibitedBy, Prohibition, prohibitions, raised_flags};
pub use model::*;
pub use notes::{Note, notes};
pub use read::{MAX_FILE_BYTES, MAX_YAML_DEPTH};
pub use validate::is_id;
pub(crate) use validate::parse_host_port as normal_host_port;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// One thing wrong with a policy, located as precisely as we can.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The file, as given on the command line or relative to the policy directory.
    pub file: String,
    /// 1-based line and column, when known.
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// What is wrong: one line, lowercase, user input in backticks.
    pub message: String,
    /// How to fix it.
    pub help: Option<String>,
}

impl Problem {
    /// A problem at a line and column of `file`.
    pub fn at(
        file: &str,
        line: usize,
        column: usize,
        message: impl Into<String>,
        help: Option<&str>,
    ) -> Problem {
        Problem {
            file: file.to_string(),
            line: Some(line),
            column: Some(column),
            message: message.into(),
            help: help.map(str::to_string),
        }
    }

    /// A problem with the whole of `file` (missing, unreadable, too large).
    pub fn at_file(file: &str, message: impl Into<String>, help: Option<&str>) -> Problem {
        Problem {
            file: file.to_string(),
            line: None,
            column: None,
            message: message.into(),
            help: help.map(str::to_string),
        }
    }

    fn sort_key(&self) -> (&str, Option<usize>, Option<usize>, &str) {
        (&self.file, self.line, self.column, &self.message)
    }
}

/// Sorts problems by file, line and column, and drops exact repeats.
pub fn sort_problems(problems: &mut Vec<Problem>) {
    problems.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    problems.dedup();
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        write!(f, ": {}", self.message)?;
        if let Some(help) = &self.help {
            write!(f, " (help: {help})")?;
        }
        Ok(())
    }
}

/// Loads and validates the three registries. `policy_dir` holds `roles.yaml` and
/// `lanes.yaml`; `tools_file` is the tool registry (schema paths resolve against its
/// directory). Returns every problem found, sorted by file, line and column.
///
/// `token_env` credentials are read from the process environment at this moment.
pub fn load(policy_dir: &Path, tools_file: &Path) -> Result<Policy, Vec<Problem>> {
    load_with_env(policy_dir, tools_file, &|var| std::env::var(var).ok())
}

/// [`load`] with an explicit environment (for `token_env` credentials).
pub fn load_with_env(
    policy_dir: &Path,
    tools_file: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Policy, Vec<Problem>> {
    load_inner(policy_dir, tools_file, env, true)
}

/// [`load_with_env`] without reading any secret (each stands as a placeholder): for
/// `policy diff`, which compares secrets by id and source, never by value, and loads
/// revisions where the secret files are not.
pub fn load_for_review(
    policy_dir: &Path,
    tools_file: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Policy, Vec<Problem>> {
    load_inner(policy_dir, tools_file, env, false)
}

fn load_inner(
    policy_dir: &Path,
    tools_file: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    read_secrets: bool,
) -> Result<Policy, Vec<Problem>> {
    let mut problems = Vec::new();
    let tools_dir = tools_dir(tools_file);
    let roles_path = policy_dir.join("roles.yaml");
    let lanes_path = policy_dir.join("lanes.yaml");
    let input = validate::Input {
        roles: parse(&roles_path, policy_dir, &mut problems),
        lanes: parse(&lanes_path, policy_dir, &mut problems),
        registry: parse(tools_file, &tools_dir, &mut problems),
        tools_dir: &tools_dir,
        policy_dir,
        env,
        read_secrets,
    };
    let policy = validate::build(input, &mut problems);
    match policy {
        Some(mut policy) if problems.is_empty() => {
            let (git_commit, git_dirty) =
                git::commit_and_dirty(policy_dir, &[&roles_path, &lanes_path, tools_file]);
            policy.source = PolicySource {
                policy_dir: policy_dir.display().to_string(),
                tools_file: tools_file.display().to_string(),
                git_commit,
                git_dirty,
            };
            Ok(policy)
        }
        _ => {
            sort_problems(&mut problems);
            Err(problems)
        }
    }
}

/// The directory holding the tool registry (schema paths and adapter data resolve
/// against it); `.` for a bare file name.
pub fn tools_dir(tools_file: &Path) -> PathBuf {
    match tools_file.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Reads and parses one registry file; on failure records the problem.
fn parse<T: DeserializeOwned>(
    path: &Path,
    root: &Path,
    problems: &mut Vec<Problem>,
) -> Option<validate::Parsed<T>> {
    let file = read::read_file(path, root)
        .map_err(|p| problems.push(p))
        .ok()?;
    let raw = read::parse_yaml(&file).map_err(|p| problems.push(p)).ok()?;
    Some(validate::Parsed { file, raw })
}

mod cases;
pub use cases::{CaseExpect, CaseRequest, CaseRun, ExpectedDecision, PolicyCase, load_cases};
