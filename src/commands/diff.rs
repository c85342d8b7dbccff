//! `toolgate policy diff OLD NEW`: the change in effective permissions between two
//! versions of the policy (`review::diff`), printed for a reviewer or a CI gate.
//!
//! Exit codes: 0 done; 1 `--fail-on widening` and some change widens; 4 a side that
//! cannot be read or does not load (or bad flags); 5 a version rule violation (a schema
//! change without the version bump it needs), with or without `--fail-on`.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::commands::Exit;
use crate::review::diff::{Layout, PolicyDiff, diff, render};

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The old policy: a git revision (`main`, `HEAD~1`) or a directory holding policy/
    /// and tools/ (inside a git work tree, written as a path: `./DIR`). A name that is
    /// both a directory and a revision is refused.
    pub old: String,
    /// The new policy: a git revision or a directory.
    pub new: String,
    #[arg(long, value_enum, default_value = "text")]
    pub format: DiffFormat,
    /// Exit 1 when any change widens access (for CI gates).
    #[arg(long, value_enum)]
    pub fail_on: Option<FailOn>,
    /// Where the policy directory sits in the repository (and in a directory side).
    #[arg(long, default_value = "policy")]
    pub policy_dir_in_repo: PathBuf,
    /// Where the tool registry sits in the repository (and in a directory side).
    #[arg(long, default_value = "tools/tool_registry.yaml")]
    pub tools_in_repo: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    /// For a terminal.
    Text,
    /// For a pull-request comment: a summary table, then the details.
    Markdown,
    /// For bots.
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    /// Any change that gives more access.
    Widening,
}

pub fn diff_command(args: &DiffArgs) -> Exit {
    let layout = match Layout::new(&args.policy_dir_in_repo, &args.tools_in_repo) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!("  help: {}", e.help());
            return Exit::InvalidConfig;
        }
    };
    // Relative: paths in messages read as the user typed them.
    let cwd = PathBuf::new();
    let report = match diff(&args.old, &args.new, &cwd, &layout) {
        Ok(r) => r,
        Err(e) => {
            eprint!("{}", e.message());
            return Exit::InvalidConfig;
        }
    };
    let text = match args.format {
        DiffFormat::Text => render::text(&report),
        DiffFormat::Markdown => render::markdown(&report),
        DiffFormat::Json => render::json(&report),
    };
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return Exit::Failure;
    }
    exit_for(&report, args.fail_on)
}

/// A version rule violation is a schema error (5) whatever `--fail-on` says; then a
/// widening change fails a `--fail-on widening` gate (1).
pub fn exit_for(report: &PolicyDiff, fail_on: Option<FailOn>) -> Exit {
    if !report.violations.is_empty() {
        Exit::SchemaError
    } else if fail_on == Some(FailOn::Widening) && report.widens() {
        Exit::Failure
    } else {
        Exit::Ok
    }
}
