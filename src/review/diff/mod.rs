//! `toolgate policy diff OLD NEW`: the change in effective permissions between two
//! versions of the policy, for a reviewer or a CI gate.
//!
//! OLD and NEW are each a directory laid out like the repository (holding `policy/` and
//! `tools/`) or a git revision of the repository the current directory is in. Both are
//! loaded with the strict loader, then compared as models, not as text: which (role,
//! lane, tool) triples became allowed or denied, which guards were added or dropped,
//! which limits moved, and how each tool's schemas changed. Every change is marked
//! widening, narrowing or neutral.
//!
//! - `source`: reads a side (directory, or a git revision materialized with git).
//! - `compare`: the changes and the version rules, over two loaded policies.
//! - `fields`: the table of a tool's compared fields (field, getter, kind, effect).
//! - `schema`: the JSON Schema comparator.
//! - `render`: text, markdown and JSON.
//!
//! Exit codes: 0 done; 1 `--fail-on widening` and some change widens; 4 a side that
//! cannot be read or does not load (or bad flags); 5 a version rule violation (a schema
//! change without the version bump it needs), with or without `--fail-on`.

pub mod compare;
mod fields;
pub mod render;
pub mod schema;
pub mod source;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::policy::{Policy, PolicyVersions, Problem};
pub use compare::{Change, Effect, Kind, Section, Violation};
pub use source::{Layout, Side, SourceError};

/// One side of the report.
#[derive(Debug, Clone, Serialize)]
pub struct SideInfo {
    /// As given on the command line.
    pub label: String,
    /// The commit, when the side is a git revision.
    pub commit: Option<String>,
    pub versions: PolicyVersions,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyDiff {
    pub old: SideInfo,
    pub new: SideInfo,
    pub changes: Vec<Change>,
    pub violations: Vec<Violation>,
}

impl PolicyDiff {
    pub fn compare(old: (&Side, &Policy), new: (&Side, &Policy)) -> PolicyDiff {
        let info = |(side, policy): (&Side, &Policy)| SideInfo {
            label: side.label.clone(),
            commit: side.commit.clone(),
            versions: policy.versions.clone(),
        };
        PolicyDiff {
            old: info(old),
            new: info(new),
            changes: compare::changes(old.1, new.1),
            violations: compare::version_violations(old.1, new.1),
        }
    }

    pub fn count(&self, effect: Effect) -> usize {
        self.changes.iter().filter(|c| c.effect == effect).count()
    }

    pub fn widens(&self) -> bool {
        self.count(Effect::Widening) > 0
    }
}

/// Why a comparison could not be made.
#[derive(Debug)]
pub enum DiffError {
    Source {
        side: &'static str,
        error: SourceError,
    },
    Load {
        /// `old`, `new`, `base` or `current`.
        side: &'static str,
        /// The side as given (`HEAD~1 (3f28ce3...)`, a directory).
        label: String,
        problems: Vec<Problem>,
    },
}

impl DiffError {
    /// The error for stderr, one problem a line (each line ends in a newline).
    pub fn message(&self) -> String {
        match self {
            DiffError::Source { side, error } => {
                format!("error: {side}: {error}\n  help: {}\n", error.help())
            }
            DiffError::Load {
                side,
                label,
                problems,
            } => {
                let n = problems.len();
                let plural = if n == 1 { "problem" } else { "problems" };
                let mut out =
                    format!("error: the {side} policy (`{label}`) did not load ({n} {plural})\n");
                for p in problems {
                    out.push_str(&format!("  {p}\n"));
                }
                out
            }
        }
    }
}

/// The environment the comparison loads with: every `token_env` variable reads as a
/// placeholder, so the report does not depend on the caller's environment (credentials
/// are compared by kind and variable name, never by value).
fn placeholder_env(_: &str) -> Option<String> {
    Some("policy-diff-placeholder".to_string())
}

/// Loads one side with the placeholder environment.
pub fn load_side(side: &Side, layout: &Layout, name: &'static str) -> Result<Policy, DiffError> {
    crate::policy::load_for_review(
        &side.policy_dir(layout),
        &side.tools_file(layout),
        &placeholder_env,
    )
    .map_err(|problems| DiffError::Load {
        side: name,
        label: side.describe(),
        problems: problems.into_iter().map(|p| side.locate(p)).collect(),
    })
}

/// Reads, loads and compares two sides.
pub fn diff(old: &str, new: &str, cwd: &Path, layout: &Layout) -> Result<PolicyDiff, DiffError> {
    let old_side = source::open(old, cwd, layout, source::Which::Old)
        .map_err(|error| DiffError::Source { side: "OLD", error })?;
    let new_side = source::open(new, cwd, layout, source::Which::New)
        .map_err(|error| DiffError::Source { side: "NEW", error })?;
    let old_policy = load_side(&old_side, layout, "old")?;
    let new_policy = load_side(&new_side, layout, "new")?;
    Ok(PolicyDiff::compare(
        (&old_side, &old_policy),
        (&new_side, &new_policy),
    ))
}

/// `policy check --base REV`: the version rules between revision `base` of the
/// repository holding `policy_dir` and the policy on disk. The paths inside the
/// repository are those of `policy_dir` and `tools_file` relative to its root.
pub fn base_violations(
    policy_dir: &Path,
    tools_file: &Path,
    base: &str,
) -> Result<(Side, Vec<Violation>), DiffError> {
    let source_error = |error| DiffError::Source {
        side: "--base",
        error,
    };
    let top = source::toplevel(policy_dir).map_err(source_error)?;
    let top = top.canonicalize().unwrap_or(top);
    let relative = |path: &Path, flag: &'static str| -> Result<PathBuf, DiffError> {
        let absolute = path.canonicalize().map_err(|e| {
            source_error(SourceError::Io {
                path: path.display().to_string(),
                what: e.to_string(),
            })
        })?;
        absolute
            .strip_prefix(&top)
            .map(Path::to_path_buf)
            .map_err(|_| {
                source_error(SourceError::BadLayoutPath {
                    flag,
                    path: path.display().to_string(),
                })
            })
    };
    let layout = Layout::new(
        &relative(policy_dir, "--policy-dir")?,
        &relative(tools_file, "--tools")?,
    )
    .map_err(source_error)?;
    let base_side = source::materialize(&top, base, &layout).map_err(source_error)?;
    let old = load_side(&base_side, &layout, "base")?;
    let new = crate::policy::load_for_review(policy_dir, tools_file, &placeholder_env).map_err(
        |problems| DiffError::Load {
            side: "current",
            label: policy_dir.display().to_string(),
            problems,
        },
    )?;
    Ok((base_side, compare::version_violations(&old, &new)))
}
