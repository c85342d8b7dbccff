//! The sandbox of local tool processes: a `command` tool, a command phase of a
//! two-phase tool and a stdio MCP server run inside their policy's `sandbox:` profile,
//! enforced by the kernel and recorded in the closing event (`details.sandbox`).
//!
//! toolgate never confines a process from inside its own multi-threaded process: it
//! starts its own binary as a launcher (`toolgate sandbox-exec`, [`exec`]) with the
//! resolved profile ([`LaunchSpec`], JSON in an environment variable the launcher
//! removes). The launcher, a fresh single-threaded process, sets up namespaces where
//! the kernel allows them, forks the tool's process, which applies rlimits, drops to an
//! unprivileged uid when toolgate is root, drops every capability, sets
//! `no_new_privs`, applies Landlock and the seccomp filters, reports what held on
//! file descriptor 3 and executes the tool. The launcher waits for it and reports its
//! exit status and resource usage on the same pipe ([`Record`]).
//!
//! - `plan`: a policy profile and a tool's program into a [`LaunchSpec`]; the checks
//!   that need the running gateway (data and key directories, other tools' directories,
//!   the policy files).
//! - `run`: toolgate's side: the per-call scratch directory, the launcher's command,
//!   the report pipe and what it comes to (`Outcome`).
//! - `exec`: the launcher's side (the only module of toolgate that forks).
//! - `seccomp`: the filters.
//! - `host`: what this host can enforce (`toolgate doctor`, `/readyz`), the user a tool
//!   runs as when toolgate is root, and the test-only switches.
//! - `proxy`: the egress proxy of `network: {connect: [...]}`.
//!
//! INVARIANT: fail closed per guarantee. Each guarantee a profile asks for (file
//! system, network, isolation from toolgate, system calls, privileges, limits) holds by
//! one of its mechanisms or the tool is not executed (`sandbox_unavailable`); the
//! mechanism that held each is recorded. Nothing falls back to running unconfined.

pub mod exec;
pub mod host;
pub mod plan;
pub mod proxy;
pub mod run;
mod seccomp;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::policy::SandboxLimits;

pub use host::{Host, HostConfig};
pub use plan::{Plan, check_paths};
pub use run::{Evidence, EvidenceSlot, Outcome};

/// The environment variable holding the [`LaunchSpec`] for the launcher.
pub const SPEC_VAR: &str = "TOOLGATE_SANDBOX_SPEC";
/// The environment variable naming the per-call scratch directory.
pub const SCRATCH_VAR: &str = "TOOLGATE_SCRATCH";
/// The launcher's report pipe.
pub const REPORT_FD: i32 = 3;

/// What the launcher is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// The program to execute (absolute).
    pub program: PathBuf,
    /// argv, argv[0] included.
    pub argv: Vec<String>,
    pub working_dir: PathBuf,
    /// Landlock rules: read (files and directories beneath), read and execute, read
    /// and write (create, remove, truncate beneath).
    pub read: Vec<PathBuf>,
    pub exec: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub network: NetworkSpec,
    pub limits: SandboxLimits,
    /// When toolgate runs as root: the uid and gid the tool runs as.
    pub run_as: Option<(u32, u32)>,
    /// Whether namespaces may be tried (false: the test switch refusing them).
    pub namespaces: bool,
    /// The test switch reporting that the kernel lacks Landlock.
    pub landlock_missing: bool,
}

/// The network a launched process gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkSpec {
    None,
    Ports(Vec<u16>),
    /// Only the egress proxy listening on this Unix socket, reached through a
    /// forwarder on the namespace's loopback (`HTTPS_PROXY`, `HTTP_PROXY`).
    Proxy {
        socket: PathBuf,
    },
}

/// One line of the launcher's report pipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    /// Every guarantee held; the tool is being executed.
    Started(Enforced),
    /// A guarantee could not be held; nothing was executed.
    Unavailable { guarantee: String, detail: String },
    /// Confined, the program could not be executed (errno's text).
    ExecFailed { detail: String },
    /// The tool's process ended.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// The resource usage of the tool and its descendants.
    Usage { cpu_ms: u64, maxrss_kb: u64 },
}

/// Which mechanism held each guarantee (`details.sandbox.enforced`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforced {
    /// `landlock_abi_<N>`.
    pub filesystem: String,
    /// `network_namespace`, `seccomp_unix_only`, `landlock_ports+seccomp_tcp_only` or
    /// `network_namespace+egress_proxy`.
    pub network: String,
    /// What keeps the tool from seeing, signalling or tracing toolgate:
    /// `pid_namespace`, `landlock_scope`, `uid`.
    pub isolation: String,
    /// `seccomp`.
    pub syscalls: String,
    /// `no_new_privs`, with `uid_<N>` and `capabilities_dropped` when toolgate is root.
    pub privileges: String,
    /// `rlimit`.
    pub limits: String,
    /// The namespaces the tool runs in (`user`, `pid`, `net`).
    pub namespaces: Vec<String>,
    pub landlock_abi: u32,
    /// The uid the tool runs as.
    pub uid: u32,
}
