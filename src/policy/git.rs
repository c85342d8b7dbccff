//! Which git commit a policy was loaded from, when its directory is inside a work tree.
//!
//! Best effort by design: no git binary, not a repository, a repository without commits
//! or a git that takes too long all give `None`, never an error, because a policy is
//! just as valid outside git.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long one git command may take before it is killed.
const GIT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most output we keep from one git command.
const MAX_OUTPUT: u64 = 64 * 1024;

/// The commit `HEAD` points at in the work tree holding `dir`, and whether any of
/// `files` differs from it (modified, staged or untracked).
pub(crate) fn commit_and_dirty(dir: &Path, files: &[&Path]) -> (Option<String>, Option<bool>) {
    let Some(commit) = run_git(dir, &["rev-parse", "--verify", "HEAD"]) else {
        return (None, None);
    };
    let commit = commit.trim().to_string();
    if commit.len() < 40 || !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        return (None, None);
    }
    let mut args: Vec<String> = ["status", "--porcelain", "--untracked-files=all", "--"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for file in files {
        let absolute = file.canonicalize().unwrap_or_else(|_| file.to_path_buf());
        args.push(absolute.display().to_string());
    }
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let dirty = run_git(dir, &arg_refs).map(|status| !status.trim().is_empty());
    (Some(commit), dirty)
}

/// Runs `git -C dir <args>` with a deadline; `None` on any failure.
fn run_git(dir: &Path, args: &[&str]) -> Option<String> {
    git(dir, args, MAX_OUTPUT, GIT_TIMEOUT)
        .ok()
        .and_then(|out| String::from_utf8(out).ok())
}

/// Runs `git -C dir <args>`, killed after `timeout`, keeping at most `limit` bytes of
/// stdout. On failure returns the first line git wrote to stderr (or what went wrong).
/// Shared with `review::diff`, which materializes git revisions.
pub(crate) fn git(
    dir: &Path,
    args: &[&str],
    limit: u64,
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let mut child = Command::new("git")
        .arg("-C")
        .arg(dir)
        // Never run a repository's fsmonitor hook or take index locks just to read.
        .args(["-c", "core.fsmonitor=false"])
        .args(args)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run git: {e}"))?;
    // Read on threads so a chatty git cannot block on a full pipe while we wait.
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out_reader = thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(s) = stdout {
            let _ = s.take(limit).read_to_end(&mut out);
        }
        out
    });
    let err_reader = thread::spawn(move || {
        let mut err = Vec::new();
        if let Some(s) = stderr {
            let _ = s.take(64 * 1024).read_to_end(&mut err);
        }
        err
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    match status {
        Some(status) if status.success() => Ok(out),
        Some(_) => {
            let text = String::from_utf8_lossy(&err);
            let first = text.lines().next().unwrap_or("").trim();
            Err(if first.is_empty() {
                format!("`git {}` failed", args.first().unwrap_or(&""))
            } else {
                first.to_string()
            })
        }
        None => Err(format!(
            "`git {}` took longer than {} s",
            args.first().unwrap_or(&""),
            timeout.as_secs()
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_outside_git_has_no_commit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("roles.yaml");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(commit_and_dirty(dir.path(), &[&file]), (None, None));
    }

    #[test]
    fn a_work_tree_reports_its_commit_and_dirtiness() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            Command::new("git")
                .arg("-C")
                .arg(dir.path())
                .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
                .args(args)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        assert!(git(&["init", "-q"]), "the test needs git");
        let file = dir.path().join("roles.yaml");
        std::fs::write(&file, "a").unwrap();
        assert!(git(&["add", "roles.yaml"]));
        assert!(git(&["commit", "-q", "-m", "x"]));
        let (commit, dirty) = commit_and_dirty(dir.path(), &[&file]);
        assert_eq!(commit.map(|c| c.len()), Some(40));
        assert_eq!(dirty, Some(false));
        std::fs::write(&file, "b").unwrap();
        assert_eq!(commit_and_dirty(dir.path(), &[&file]).1, Some(true));
    }
}
