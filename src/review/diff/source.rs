//! Where the two sides of `policy diff` come from: a directory laid out like the
//! repository, or a git revision of the repository the current directory is in,
//! materialized into a private temporary directory with git itself.
//!
//! Only what the policy loader reads is materialized: the policy directory's
//! `roles.yaml` and `lanes.yaml`, the tool registry, and every file under
//! `<tools dir>/<tool>/schema/` (where schema paths must point).
//!
//! Bounded: every git command has a deadline and an output cap, at most
//! [`MAX_FILES`] files are written, each no larger than the loader accepts (plus one
//! byte, so an oversized file is still reported as too large).

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// How long one git command may take before it is killed.
const GIT_TIMEOUT: Duration = Duration::from_secs(20);
/// The most output kept from a git command that lists things.
const MAX_LISTING: u64 = 16 * 1024 * 1024;
/// The most files materialized from one revision.
pub const MAX_FILES: usize = 4096;

/// Why a side could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceError {
    /// A path given for the layout is absolute or leaves the repository.
    BadLayoutPath { flag: &'static str, path: String },
    /// Neither an existing directory nor something git can use as a revision.
    InvalidRevision { rev: String },
    /// A bare name that is both an existing directory and a git revision: which one
    /// was meant cannot be known, and a directory may come from the change under review.
    Ambiguous { spec: String, commit: String },
    /// OLD given as a bare name that is a directory inside a git work tree: the work
    /// tree holds the change under review, so it does not stand for the old policy
    /// unless written as a path.
    OldInWorkTree { spec: String },
    /// A spec written as a path (`./x`, `../x`, `/x`) that is not a directory.
    NotADirectory { path: String },
    /// The current directory is not inside a git work tree (or git is missing).
    NotARepository { dir: String, what: String },
    /// git does not know the revision.
    UnknownRevision { rev: String },
    /// A git command failed or took too long.
    Git { what: String },
    /// The revision holds more files than we materialize.
    TooManyFiles { rev: String },
    /// The temporary directory could not be written.
    Io { path: String, what: String },
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::BadLayoutPath { flag, path } => {
                write!(
                    f,
                    "{flag} `{path}` must be a relative path inside the repository"
                )
            }
            SourceError::InvalidRevision { rev } => {
                write!(f, "`{rev}` is neither a directory nor a git revision")
            }
            SourceError::Ambiguous { spec, commit } => write!(
                f,
                "`{spec}` names both a directory (`./{spec}`) and a git revision (commit {}); refusing to guess",
                commit.get(..12).unwrap_or(commit)
            ),
            SourceError::OldInWorkTree { spec } => write!(
                f,
                "`{spec}` is a directory inside the git work tree, which holds the change under review, so it does not stand for the old policy"
            ),
            SourceError::NotADirectory { path } => write!(f, "`{path}` is not a directory"),
            SourceError::NotARepository { dir, what } => {
                write!(f, "`{dir}` is not inside a git work tree: {what}")
            }
            SourceError::UnknownRevision { rev } => {
                write!(f, "git does not know the revision `{rev}`")
            }
            SourceError::Git { what } => write!(f, "git failed: {what}"),
            SourceError::TooManyFiles { rev } => write!(
                f,
                "revision `{rev}` holds more than {MAX_FILES} policy and schema files"
            ),
            SourceError::Io { path, what } => write!(f, "`{path}`: {what}"),
        }
    }
}

impl SourceError {
    /// What the user can do about it.
    pub fn help(&self) -> String {
        let text = match self {
            SourceError::BadLayoutPath { .. } => {
                "give paths relative to the repository root, e.g. `policy` and `tools/tool_registry.yaml`"
            }
            SourceError::InvalidRevision { .. } | SourceError::UnknownRevision { .. } => {
                "name a commit, branch or tag (`main`, `HEAD~1`, `origin/main`), or a directory holding policy/ and tools/; in CI fetch the base branch first (`git fetch origin main`)"
            }
            SourceError::Ambiguous { spec, commit } => {
                return format!(
                    "write `./{spec}` for the directory, or `{commit}` for the revision; in CI a directory in the checkout holds whatever the pull request committed"
                );
            }
            SourceError::OldInWorkTree { spec } => {
                return format!(
                    "name a git revision fetched before the diff (`git fetch origin main`), or write `./{spec}` to compare against the directory"
                );
            }
            SourceError::NotADirectory { .. } => {
                "a spec starting with `./`, `../` or `/` is always a directory; drop the prefix to name a git revision"
            }
            SourceError::NotARepository { .. } => {
                "run the command inside the repository, or compare two directories"
            }
            SourceError::Git { .. } => "check that git is installed and the repository is readable",
            SourceError::TooManyFiles { .. } => "compare two directories instead",
            SourceError::Io { .. } => "check that the temporary directory is writable",
        };
        text.to_string()
    }
}

/// Where the policy sits inside a repository (or a directory laid out like one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The policy directory (holding roles.yaml and lanes.yaml), e.g. `policy`.
    pub policy_dir: PathBuf,
    /// The tool registry, e.g. `tools/tool_registry.yaml`.
    pub tools_file: PathBuf,
}

impl Layout {
    /// Checks both paths are relative and stay inside the root.
    pub fn new(policy_dir: &Path, tools_file: &Path) -> Result<Layout, SourceError> {
        Ok(Layout {
            policy_dir: inside("--policy-dir-in-repo", policy_dir)?,
            tools_file: inside("--tools-in-repo", tools_file)?,
        })
    }

    /// The directory holding the registry (`` for the root).
    fn tools_dir(&self) -> PathBuf {
        self.tools_file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// Whether the loader may read `path` (relative to the root).
    fn wanted(&self, path: &Path) -> bool {
        if path == self.tools_file
            || path == self.policy_dir.join("roles.yaml")
            || path == self.policy_dir.join("lanes.yaml")
        {
            return true;
        }
        // <tools dir>/<tool>/schema/...
        match path.strip_prefix(self.tools_dir()) {
            Ok(rest) => {
                let parts: Vec<Component> = rest.components().collect();
                parts.len() >= 3 && parts[1].as_os_str() == "schema"
            }
            Err(_) => false,
        }
    }
}

/// A relative path without `..`, `.` or root components, normalized.
fn inside(flag: &'static str, path: &Path) -> Result<PathBuf, SourceError> {
    let bad = || SourceError::BadLayoutPath {
        flag,
        path: path.display().to_string(),
    };
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            _ => return Err(bad()),
        }
    }
    if flag == "--tools-in-repo" && out.as_os_str().is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// One side of a comparison, ready to load.
#[derive(Debug)]
pub struct Side {
    /// As given on the command line.
    pub label: String,
    /// The commit, for a git revision.
    pub commit: Option<String>,
    /// The root holding the policy directory and the registry.
    pub root: PathBuf,
    /// Removes the materialized tree when the side is dropped.
    _tmp: Option<TempTree>,
}

impl Side {
    pub fn policy_dir(&self, layout: &Layout) -> PathBuf {
        self.root.join(&layout.policy_dir)
    }

    pub fn tools_file(&self, layout: &Layout) -> PathBuf {
        self.root.join(&layout.tools_file)
    }

    /// A problem in a materialized revision names its file as git does
    /// (`main:policy/roles.yaml`), not by the temporary directory.
    pub fn locate(&self, mut problem: crate::policy::Problem) -> crate::policy::Problem {
        if self.commit.is_some()
            && let Ok(relative) = Path::new(&problem.file).strip_prefix(&self.root)
        {
            problem.file = format!("{}:{}", self.label, relative.display());
        }
        problem
    }

    /// `main (3f28ce3)` for a revision, the path for a directory.
    pub fn describe(&self) -> String {
        match &self.commit {
            Some(commit) => format!("{} ({})", self.label, commit.get(..12).unwrap_or(commit)),
            None => self.label.clone(),
        }
    }
}

/// Which side of the comparison a spec names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The baseline the review trusts.
    Old,
    /// The change under review.
    New,
}

/// Whether `spec` is written as a path: absolute, `.` or `..`, or starting with `./`
/// or `../`. Such a spec is always a directory, never a git revision.
pub fn written_as_path(spec: &str) -> bool {
    spec == "."
        || spec == ".."
        || spec.starts_with('/')
        || spec.starts_with("./")
        || spec.starts_with("../")
}

/// Resolves `spec`, relative to `cwd`:
///
/// - written as a path (`./old`, `../x`, `/tmp/x`, `.`): that directory;
/// - a bare name that is both a directory and a git revision: refused
///   ([`SourceError::Ambiguous`]), whichever side it is;
/// - a bare name that is a directory inside a git work tree, for OLD: refused
///   ([`SourceError::OldInWorkTree`]): the base may simply not have been fetched, and
///   the work tree holds the change under review;
/// - another bare name that is a directory: that directory;
/// - anything else: a git revision of the repository holding `cwd`.
// INVARIANT: a bare name never silently stands for a directory when it also names a
// revision, and never for OLD inside a work tree; a pull request cannot choose the
// baseline it is compared against by committing a directory.
pub fn open(spec: &str, cwd: &Path, layout: &Layout, which: Which) -> Result<Side, SourceError> {
    let as_dir = cwd.join(spec);
    let directory = || Side {
        label: spec.to_string(),
        commit: None,
        root: as_dir.clone(),
        _tmp: None,
    };
    let here = if cwd.as_os_str().is_empty() {
        Path::new(".")
    } else {
        cwd
    };
    if written_as_path(spec) {
        if as_dir.is_dir() {
            return Ok(directory());
        }
        return Err(SourceError::NotADirectory {
            path: spec.to_string(),
        });
    }
    if as_dir.is_dir() {
        let Ok(top) = toplevel(here) else {
            // Not in a work tree: no revision to confuse it with.
            return Ok(directory());
        };
        if let Ok(commit) = resolve(&top, spec) {
            return Err(SourceError::Ambiguous {
                spec: spec.to_string(),
                commit,
            });
        }
        if which == Which::Old {
            return Err(SourceError::OldInWorkTree {
                spec: spec.to_string(),
            });
        }
        return Ok(directory());
    }
    let top = toplevel(here)?;
    materialize(&top, spec, layout)
}

/// The root of the work tree holding `dir`.
pub fn toplevel(dir: &Path) -> Result<PathBuf, SourceError> {
    let out = git(dir, &["rev-parse", "--show-toplevel"], 64 * 1024).map_err(|what| {
        SourceError::NotARepository {
            dir: dir.display().to_string(),
            what,
        }
    })?;
    let text = String::from_utf8_lossy(&out).trim().to_string();
    if text.is_empty() {
        return Err(SourceError::NotARepository {
            dir: dir.display().to_string(),
            what: "git printed no work tree".into(),
        });
    }
    Ok(PathBuf::from(text))
}

/// Writes the files the loader needs from revision `rev` of the repository at `top`
/// into a new private temporary directory.
pub fn materialize(top: &Path, rev: &str, layout: &Layout) -> Result<Side, SourceError> {
    let commit = resolve(top, rev)?;
    let mut listing_args = vec![
        "ls-tree".to_string(),
        "-r".into(),
        "-z".into(),
        "-l".into(),
        "--full-tree".into(),
        commit.clone(),
        "--".into(),
    ];
    let tools_dir = layout.tools_dir();
    for dir in [&layout.policy_dir, &tools_dir] {
        let spec = dir.display().to_string();
        listing_args.push(if spec.is_empty() { ".".into() } else { spec });
    }
    let refs: Vec<&str> = listing_args.iter().map(String::as_str).collect();
    let listing = git(top, &refs, MAX_LISTING).map_err(|what| SourceError::Git { what })?;
    let mut files = Vec::new();
    for entry in listing.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let Some(tab) = entry.iter().position(|b| *b == b'\t') else {
            continue;
        };
        let head = String::from_utf8_lossy(&entry[..tab]).to_string();
        let Ok(path) = std::str::from_utf8(&entry[tab + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = head.split_whitespace().collect();
        // Regular files only: symlinks and submodules are not materialized.
        let [mode, "blob", oid, _size] = fields.as_slice() else {
            continue;
        };
        if !mode.starts_with("100") {
            continue;
        }
        let Ok(relative) = inside("a path in the revision", Path::new(path)) else {
            continue;
        };
        if layout.wanted(&relative) {
            files.push((relative, oid.to_string()));
        }
    }
    if files.len() > MAX_FILES {
        return Err(SourceError::TooManyFiles {
            rev: rev.to_string(),
        });
    }
    let tmp = TempTree::create()?;
    for (relative, oid) in &files {
        let bytes = git(
            top,
            &["cat-file", "blob", oid],
            crate::policy::MAX_FILE_BYTES + 1,
        )
        .map_err(|what| SourceError::Git { what })?;
        let path = tmp.path.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error(parent, &e))?;
        }
        std::fs::write(&path, bytes).map_err(|e| io_error(&path, &e))?;
    }
    Ok(Side {
        label: rev.to_string(),
        commit: Some(commit),
        root: tmp.path.clone(),
        _tmp: Some(tmp),
    })
}

/// The full commit id `rev` names.
fn resolve(top: &Path, rev: &str) -> Result<String, SourceError> {
    if rev.is_empty() || rev.starts_with('-') || rev.chars().any(char::is_control) {
        return Err(SourceError::InvalidRevision {
            rev: rev.to_string(),
        });
    }
    let spec = format!("{rev}^{{commit}}");
    let out = git(
        top,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &spec,
        ],
        4096,
    )
    .map_err(|_| SourceError::UnknownRevision {
        rev: rev.to_string(),
    })?;
    let commit = String::from_utf8_lossy(&out).trim().to_string();
    if commit.len() < 40 || !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(SourceError::UnknownRevision {
            rev: rev.to_string(),
        });
    }
    Ok(commit)
}

fn io_error(path: &Path, e: &std::io::Error) -> SourceError {
    SourceError::Io {
        path: path.display().to_string(),
        what: e.to_string(),
    }
}

/// Runs git in `dir` within [`GIT_TIMEOUT`], keeping at most `limit` bytes of stdout.
fn git(dir: &Path, args: &[&str], limit: u64) -> Result<Vec<u8>, String> {
    crate::policy::git::git(dir, args, limit, GIT_TIMEOUT)
}

/// A private temporary directory, removed when dropped.
#[derive(Debug)]
struct TempTree {
    path: PathBuf,
}

impl TempTree {
    fn create() -> Result<TempTree, SourceError> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("toolgate-diff-{}", uuid::Uuid::new_v4()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| io_error(&path, &e))?;
        Ok(TempTree { path })
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(Path::new("policy"), Path::new("tools/tool_registry.yaml")).unwrap()
    }

    #[test]
    fn layout_paths_stay_inside_the_root() {
        assert!(Layout::new(Path::new("../policy"), Path::new("tools/r.yaml")).is_err());
        assert!(Layout::new(Path::new("/etc"), Path::new("tools/r.yaml")).is_err());
        assert!(Layout::new(Path::new("policy"), Path::new("")).is_err());
        let l = Layout::new(Path::new("./policy/"), Path::new("tools/r.yaml")).unwrap();
        assert_eq!(l.policy_dir, PathBuf::from("policy"));
    }

    #[test]
    fn only_what_the_loader_reads_is_wanted() {
        let l = layout();
        for yes in [
            "policy/roles.yaml",
            "policy/lanes.yaml",
            "tools/tool_registry.yaml",
            "tools/read_document/schema/input.json",
            "tools/x/schema/nested/a.json",
        ] {
            assert!(l.wanted(Path::new(yes)), "{yes}");
        }
        for no in [
            "policy/tests/research.yaml",
            "tools/data/clients.json",
            "tools/read_document/input.json",
            "tools/schema/x.json",
        ] {
            assert!(!l.wanted(Path::new(no)), "{no}");
        }
    }

    #[test]
    fn revisions_that_look_like_options_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for rev in ["--output=/tmp/x", "-p", ""] {
            assert!(matches!(
                resolve(dir.path(), rev),
                Err(SourceError::InvalidRevision { .. })
            ));
        }
    }

    #[test]
    fn outside_a_work_tree_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let err = open("HEAD", dir.path(), &layout(), Which::New).unwrap_err();
        assert!(matches!(err, SourceError::NotARepository { .. }), "{err}");
    }
}
