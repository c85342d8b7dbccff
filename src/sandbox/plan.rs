//! A policy profile made concrete for one program: the paths the tool gets (what the
//! registry wrote plus what every tool gets), checked against what no profile may
//! reach, and the profile's hash.
//!
//! Every confined tool gets, besides its profile's paths: read and execute on its
//! program, the program's interpreter (a `#!` line's) and the system's library
//! directories; read on the loader's cache, the certificate directories, the time zone
//! and name-service files and a few devices (`/dev/null` also written); read and
//! execute on its working directory unless that directory holds something no profile
//! may reach (then the working directory is left out, and `policy explain` says so);
//! read and write on the call's scratch directory.
//!
//! Never reachable, whatever a profile says: the data directory, the audit key
//! directory, the policy directory and the tool registry, the scratch root (every
//! call's scratch directory is below it), and other tools' working directories. A
//! profile path that is one of them, lies below one or holds one is refused when the
//! adapters are built (serve's start and every reload, and `policy check`).

use std::path::{Component, Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use crate::policy::{Policy, Problem, Sandbox, SandboxNetwork, SandboxPath, SandboxProfile};

/// Read and execute, when they exist (symlinks resolved).
const SYSTEM_EXEC: &[&str] = &[
    "/usr/lib",
    "/usr/lib64",
    "/usr/lib32",
    "/usr/libexec",
    "/lib",
    "/lib64",
    "/usr/local/lib",
];

/// Read only, when they exist.
const SYSTEM_READ: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl",
    "/etc/pki",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/usr/share/ca-certificates",
    "/etc/localtime",
    "/usr/share/zoneinfo",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
    "/dev/full",
];

/// Read and write.
const SYSTEM_WRITE: &[&str] = &["/dev/null"];

/// What no profile may reach, each with what it is (for messages).
#[derive(Debug, Clone, Default)]
pub struct Forbidden {
    paths: Vec<(PathBuf, String)>,
    /// Tools' working directories, by owner (`tool `x``, `server `y``).
    working_dirs: Vec<(String, PathBuf)>,
}

impl Forbidden {
    /// The gateway's own paths and every local process's working directory.
    pub fn of(policy: &Policy, tools_dir: &Path, data_dir: &Path) -> Forbidden {
        let config = super::host::config();
        let mut paths = vec![
            (absolute(data_dir), "the data directory".to_string()),
            (
                absolute(
                    &config
                        .key_dir
                        .clone()
                        .unwrap_or_else(|| data_dir.join("keys")),
                ),
                "the audit key directory".to_string(),
            ),
            (
                absolute(Path::new(&policy.source.policy_dir)),
                "the policy directory".to_string(),
            ),
            (
                absolute(Path::new(&policy.source.tools_file)),
                "the tool registry".to_string(),
            ),
            (
                scratch_base(&absolute(&config.scratch_root)),
                "the scratch root".to_string(),
            ),
        ];
        paths.retain(|(p, _)| !p.as_os_str().is_empty());
        let mut working_dirs = Vec::new();
        for (name, tool) in &policy.tools {
            let dir = match &tool.adapter {
                crate::policy::AdapterConfig::Command { working_dir, .. } => {
                    Some(resolve_working_dir(tools_dir, working_dir.as_deref()))
                }
                crate::policy::AdapterConfig::Mcp {
                    command: Some(_), ..
                } => Some(absolute(tools_dir)),
                _ => None,
            };
            if let Some(dir) = dir {
                working_dirs.push((format!("tool `{name}`"), dir));
            }
        }
        Forbidden {
            paths,
            working_dirs,
        }
    }

    /// Why `path` is out of reach of `owner`'s profile, if it is.
    fn conflict(&self, owner: &str, own_dir: &Path, path: &Path) -> Option<String> {
        for (forbidden, what) in &self.paths {
            if overlaps(path, forbidden) {
                return Some(format!("{what} `{}`", forbidden.display()));
            }
        }
        for (other, dir) in &self.working_dirs {
            if other == owner || dir == own_dir || self.holds_forbidden(dir) {
                continue;
            }
            if overlaps(path, dir) {
                return Some(format!(
                    "the working directory of {other} `{}`",
                    dir.display()
                ));
            }
        }
        None
    }

    /// Whether `dir` is or holds one of the gateway's own paths.
    fn holds_forbidden(&self, dir: &Path) -> bool {
        self.paths.iter().any(|(p, _)| overlaps(dir, p))
    }
}

/// The directory under the scratch root that holds every call's scratch directory:
/// `toolgate-scratch-<uid>`, one per user toolgate runs as.
pub fn scratch_base(root: &Path) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    root.join(format!("toolgate-scratch-{uid}"))
}

/// A profile made concrete for one program.
#[derive(Debug, Clone)]
pub struct Plan {
    pub profile: SandboxProfile,
    pub read: Vec<PathBuf>,
    pub exec: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    /// The working directory, when it is granted (read and execute).
    pub working_dir: PathBuf,
    /// Why the working directory is not granted, when it is not.
    pub working_dir_left_out: Option<String>,
    /// sha256 of the canonical JSON of [`Plan::effective`].
    pub sha256: String,
}

impl Plan {
    /// The plan of `owner`'s process running `program` in `working_dir`; problems
    /// point at the profile's paths in `registry`.
    pub fn build(
        owner: &str,
        profile: &SandboxProfile,
        program: &Path,
        working_dir: &Path,
        forbidden: &Forbidden,
        registry: &str,
    ) -> Result<Plan, Vec<Problem>> {
        let mut problems = Vec::new();
        let own_dir = absolute(working_dir);
        for (list, paths) in [
            ("read", &profile.read),
            ("write", &profile.write),
            ("exec", &profile.exec),
        ] {
            for SandboxPath { path, line, column } in paths {
                if let Some(what) = forbidden.conflict(owner, &own_dir, path) {
                    problems.push(Problem::at(
                        registry,
                        *line,
                        *column,
                        format!(
                            "{owner}: `sandbox.filesystem.{list}` path `{}` reaches {what}",
                            path.display()
                        ),
                        Some("no profile may reach the data or key directory, the policy files, the scratch root or another tool's directory; name a directory of this tool's own"),
                    ));
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let mut read = Vec::new();
        let mut exec = Vec::new();
        let mut write = Vec::new();
        let existing = |list: &[&str]| -> Vec<PathBuf> {
            list.iter()
                .filter_map(|p| std::fs::canonicalize(p).ok())
                .collect()
        };
        let keep = |p: &PathBuf| forbidden.conflict(owner, &own_dir, p).is_none();
        exec.extend(existing(SYSTEM_EXEC).into_iter().filter(keep));
        read.extend(existing(SYSTEM_READ).into_iter().filter(keep));
        write.extend(existing(SYSTEM_WRITE).into_iter().filter(keep));
        for found in program_and_interpreters(program) {
            if keep(&found) {
                exec.push(found);
            }
        }
        let working_dir_left_out = forbidden.conflict(owner, &own_dir, &own_dir);
        if working_dir_left_out.is_none() {
            exec.push(own_dir.clone());
        }
        read.extend(profile.read.iter().map(|p| p.path.clone()));
        exec.extend(profile.exec.iter().map(|p| p.path.clone()));
        write.extend(profile.write.iter().map(|p| p.path.clone()));
        for list in [&mut read, &mut exec, &mut write] {
            list.sort();
            list.dedup();
        }
        let mut plan = Plan {
            profile: profile.clone(),
            read,
            exec,
            write,
            working_dir: own_dir,
            working_dir_left_out,
            sha256: String::new(),
        };
        plan.sha256 =
            crate::canonical::sha256_hex(&crate::canonical::to_canonical_bytes(&plan.effective()));
        Ok(plan)
    }

    /// The effective profile, as `policy explain` shows it and as hashed.
    pub fn effective(&self) -> Value {
        let paths =
            |l: &[PathBuf]| -> Vec<String> { l.iter().map(|p| p.display().to_string()).collect() };
        json!({
            "filesystem": {
                "read": paths(&self.read),
                "exec": paths(&self.exec),
                "write": paths(&self.write),
                "scratch": "read and write: a fresh directory per call ($TOOLGATE_SCRATCH)",
            },
            "working_dir": self.working_dir.display().to_string(),
            "working_dir_left_out": self.working_dir_left_out,
            "network": network_json(&self.profile.network),
            "limits": self.profile.limits,
            "given": self.profile.given,
        })
    }
}

/// A profile's network as JSON: `"none"`, `{"ports": [...]}`, `{"connect": [...]}`.
pub fn network_json(network: &SandboxNetwork) -> Value {
    match network {
        SandboxNetwork::None => json!("none"),
        SandboxNetwork::Ports(p) => json!({ "ports": p }),
        SandboxNetwork::Connect(c) => json!({ "connect": c }),
    }
}

/// How a sandbox is summarized in `policy explain` and `details.sandbox` when it is
/// not confined.
#[derive(Debug, Clone, Serialize)]
pub struct UnconfinedNote<'a> {
    pub unconfined: &'a str,
}

/// Every tool's or server's sandbox with its owner, for `policy check` and `diff`.
pub fn sandboxes(policy: &Policy) -> Vec<(String, &Sandbox)> {
    let mut found = Vec::new();
    for (name, tool) in &policy.tools {
        match &tool.adapter {
            crate::policy::AdapterConfig::Command { sandbox, .. } => {
                found.push((format!("tool `{name}`"), sandbox));
            }
            crate::policy::AdapterConfig::Mcp {
                sandbox: Some(sandbox),
                ..
            } => found.push((format!("tool `{name}` (its stdio server)"), sandbox)),
            _ => {}
        }
        if let Some(phases) = &tool.phases
            && let Some(sandbox) = &phases.sandbox
        {
            found.push((format!("tool `{name}` phases"), sandbox));
        }
    }
    found
}

/// The checks of every profile against what no profile may reach (serve, reload and
/// `policy check --data-dir`).
pub fn check_paths(policy: &Policy, tools_dir: &Path, data_dir: &Path) -> Vec<Problem> {
    let forbidden = Forbidden::of(policy, tools_dir, data_dir);
    let registry = policy.source.tools_file.clone();
    let mut problems = Vec::new();
    for (name, tool) in &policy.tools {
        let owner = format!("tool `{name}`");
        let (dir, profiles): (PathBuf, Vec<&Sandbox>) = match &tool.adapter {
            crate::policy::AdapterConfig::Command {
                working_dir,
                sandbox,
                ..
            } => {
                let mut list = vec![sandbox];
                if let Some(s) = tool.phases.as_ref().and_then(|p| p.sandbox.as_ref()) {
                    list.push(s);
                }
                (resolve_working_dir(tools_dir, working_dir.as_deref()), list)
            }
            crate::policy::AdapterConfig::Mcp {
                sandbox: Some(sandbox),
                ..
            } => (absolute(tools_dir), vec![sandbox]),
            _ => continue,
        };
        for sandbox in profiles {
            if let Sandbox::Confined(profile) = sandbox
                && let Err(found) =
                    Plan::build(&owner, profile, Path::new("/"), &dir, &forbidden, &registry)
            {
                problems.extend(found);
            }
        }
    }
    problems.sort_by_key(|p| (p.line, p.column));
    problems.dedup();
    problems
}

/// A command's working directory: absolute, or relative to the registry's directory.
pub fn resolve_working_dir(tools_dir: &Path, working_dir: Option<&str>) -> PathBuf {
    match working_dir {
        None => absolute(tools_dir),
        Some(d) if Path::new(d).is_absolute() => absolute(Path::new(d)),
        Some(d) => absolute(&tools_dir.join(d)),
    }
}

/// `path` made absolute: its canonical form when it exists, else joined to the current
/// directory with `.` and `..` resolved by name.
pub fn absolute(path: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Whether one of `a` and `b` is the other or below it.
fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The program (its real path) and, for a script, its `#!` interpreter (and, through
/// `/usr/bin/env NAME`, NAME as found on PATH).
fn program_and_interpreters(program: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(real) = std::fs::canonicalize(program) else {
        return found;
    };
    found.push(real.clone());
    let mut head = [0u8; 256];
    let n = std::fs::File::open(&real)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return found;
    };
    let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    if let Some(interpreter) = words.next()
        && let Ok(real) = std::fs::canonicalize(interpreter)
    {
        let is_env = real.file_name().is_some_and(|n| n == "env");
        found.push(real);
        if is_env
            && let Some(name) = words.find(|w| !w.starts_with('-'))
            && let Some(resolved) = on_path(name)
        {
            found.push(resolved);
        }
    }
    found
}

/// `name` found on toolgate's PATH, its real path.
fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .and_then(|found| std::fs::canonicalize(found).ok())
}
