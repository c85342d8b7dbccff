//! toolgate's side of a confined launch: the per-call scratch directory, the
//! launcher's command, the report pipe, the egress proxy, and what the reports come to.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Take};
use tokio::net::unix::pipe;

use super::host::{TestSwitch, config};
use super::plan::{Plan, scratch_base};
use super::proxy::{EgressProxy, Traffic};
use super::{LaunchSpec, NetworkSpec, Record, SCRATCH_VAR, SPEC_VAR};
use crate::policy::SandboxNetwork;

/// The most bytes read from the report pipe.
const MAX_REPORT_BYTES: u64 = 64 * 1024;

/// What a call's closing event and response record of its sandbox.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// `details.sandbox`.
    pub details: Map<String, Value>,
    /// The tool's CPU time and peak resident memory, from its usage at exit.
    pub cpu_ms: Option<u64>,
    pub memory_peak_mb: Option<u64>,
}

impl Evidence {
    /// The evidence of an unconfined process.
    pub fn unconfined(reason: &str) -> Evidence {
        let mut details = Map::new();
        details.insert("unconfined".into(), json!(reason));
        Evidence {
            details,
            ..Evidence::default()
        }
    }
}

/// Where an adapter leaves the evidence of the call it executed.
pub type EvidenceSlot = Mutex<Option<Evidence>>;

/// Fills `slot` (when there is one).
pub fn put(slot: Option<&EvidenceSlot>, evidence: Evidence) {
    if let Some(slot) = slot
        && let Ok(mut s) = slot.lock()
    {
        *s = Some(evidence);
    }
}

/// A prepared launch: the command to spawn and what must live until it ends.
pub struct Launch {
    pub command: tokio::process::Command,
    report: Option<OwnedFd>,
    writer: Option<OwnedFd>,
    _scratch: Scratch,
    proxy: Option<EgressProxy>,
}

/// The per-call scratch directory; removed (with what the tool left in it, symlinks
/// not followed) when dropped.
struct Scratch {
    path: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let path = std::mem::take(&mut self.path);
        let remove = move || {
            let _ = std::fs::remove_dir_all(&path);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(remove);
            }
            Err(_) => remove(),
        }
    }
}

/// Why a launch could not be prepared (nothing was started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    pub guarantee: String,
    pub detail: String,
}

impl Launch {
    /// The launcher's command for `plan` running `program` with `argv` (argv[0]
    /// included) and the environment `env`, for the call `call_id`.
    pub fn prepare(
        plan: &Plan,
        program: &Path,
        argv: &[String],
        env: Vec<(OsString, OsString)>,
        call_id: &str,
    ) -> Result<Launch, Unavailable> {
        let unavailable = |guarantee: &str, detail: String| Unavailable {
            guarantee: guarantee.to_string(),
            detail,
        };
        let launcher = std::env::current_exe()
            .map_err(|e| unavailable("launcher", format!("toolgate's own binary: {e}")))?;
        let config = config();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let run_as = root.then_some(config.run_as);
        let scratch = make_scratch(&config.scratch_root, call_id, run_as)
            .map_err(|e| unavailable("filesystem", format!("the scratch directory: {e}")))?;
        let proxy = match &plan.profile.network {
            SandboxNetwork::Connect(hosts) => {
                let socket = scratch.path.with_extension("proxy");
                Some(
                    EgressProxy::start(socket, hosts.clone())
                        .map_err(|e| unavailable("network", format!("the egress proxy: {e}")))?,
                )
            }
            _ => None,
        };
        let switch = TestSwitch::current();
        let mut write = plan.write.clone();
        write.push(scratch.path.clone());
        let spec = LaunchSpec {
            program: program.to_path_buf(),
            argv: argv.to_vec(),
            working_dir: plan.working_dir.clone(),
            read: plan.read.clone(),
            exec: plan.exec.clone(),
            write,
            network: match (&plan.profile.network, &proxy) {
                (SandboxNetwork::None, _) => NetworkSpec::None,
                (SandboxNetwork::Ports(p), _) => NetworkSpec::Ports(p.clone()),
                (SandboxNetwork::Connect(_), Some(proxy)) => NetworkSpec::Proxy {
                    socket: proxy.socket.clone(),
                },
                (SandboxNetwork::Connect(_), None) => NetworkSpec::None,
            },
            limits: plan.profile.limits,
            run_as,
            namespaces: !switch.userns_refused,
            landlock_missing: switch.landlock_missing,
        };
        let spec = serde_json::to_string(&spec)
            .map_err(|e| unavailable("launcher", format!("the launch spec: {e}")))?;
        let (reader, writer) =
            report_pipe().map_err(|e| unavailable("launcher", format!("the report pipe: {e}")))?;
        let mut command = tokio::process::Command::new(launcher);
        command
            .arg("sandbox-exec")
            .env_clear()
            .envs(env)
            .env(SCRATCH_VAR, &scratch.path)
            .env(SPEC_VAR, spec);
        let fd = writer.as_raw_fd();
        // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if fd == super::REPORT_FD {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, super::REPORT_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(Launch {
            command,
            report: Some(reader),
            writer: Some(writer),
            _scratch: scratch,
            proxy,
        })
    }

    /// Call once the launcher was spawned: closes toolgate's copy of the pipe's write
    /// end and gives the reader of the reports.
    pub fn spawned(&mut self) -> ReportReader {
        self.writer = None;
        ReportReader {
            fd: self.report.take(),
        }
    }

    /// What the egress proxy saw (connect mode).
    pub fn traffic(&self) -> Option<Traffic> {
        self.proxy.as_ref().map(EgressProxy::traffic)
    }
}

/// Reads the launcher's report pipe to its end.
pub struct ReportReader {
    fd: Option<OwnedFd>,
}

impl ReportReader {
    pub async fn read(self) -> Vec<Record> {
        let Some(fd) = self.fd else {
            return Vec::new();
        };
        let Ok(mut pipe) = pipe::Receiver::from_owned_fd(fd) else {
            return Vec::new();
        };
        let mut bytes = Vec::new();
        let mut limited = (&mut pipe).take(MAX_REPORT_BYTES);
        let _ = limited.read_to_end(&mut bytes).await;
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect()
    }
}

/// The launcher's reports as they come, for a process that outlives a call (a stdio
/// MCP server): its start is read at once, its end whenever it comes.
pub struct ReportStream {
    lines: Option<tokio::io::Lines<BufReader<Take<pipe::Receiver>>>>,
}

impl ReportReader {
    /// Reads the reports as they come rather than at the launcher's end.
    pub fn stream(self) -> ReportStream {
        let receiver = self
            .fd
            .and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok());
        ReportStream {
            lines: receiver.map(|r| BufReader::new(r.take(MAX_REPORT_BYTES)).lines()),
        }
    }
}

impl ReportStream {
    /// The records up to the first that says whether the process started (started,
    /// unavailable, not executed), or all of them if the launcher ended first.
    pub async fn until_started(&mut self) -> Vec<Record> {
        let mut records = Vec::new();
        let Some(lines) = self.lines.as_mut() else {
            return records;
        };
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(record) = serde_json::from_str::<Record>(&line) else {
                continue;
            };
            let decisive = matches!(
                record,
                Record::Started(_) | Record::Unavailable { .. } | Record::ExecFailed { .. }
            );
            records.push(record);
            if decisive {
                break;
            }
        }
        records
    }

    /// The remaining records, to the launcher's end.
    pub async fn rest(mut self) -> Vec<Record> {
        let mut records = Vec::new();
        if let Some(lines) = self.lines.as_mut() {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(record) = serde_json::from_str::<Record>(&line) {
                    records.push(record);
                }
            }
        }
        records
    }
}

fn report_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array; both are owned below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptors owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `<root>/toolgate-scratch-<uid>/<call_id>-<random>`: the base directory toolgate's
/// own, traversable only (0711); the call's owned by the tool's user, 0700.
fn make_scratch(
    root: &Path,
    call_id: &str,
    run_as: Option<(u32, u32)>,
) -> std::io::Result<Scratch> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let base = scratch_base(root);
    match std::fs::DirBuilder::new().mode(0o711).create(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&base)?;
    // SAFETY: geteuid has no preconditions.
    if !meta.is_dir() || meta.uid() != unsafe { libc::geteuid() } {
        return Err(std::io::Error::other(format!(
            "`{}` is not a directory of toolgate's own user",
            base.display()
        )));
    }
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711))?;
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| std::io::Error::other(e.to_string()))?;
    let name: String = call_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(64)
        .collect();
    let path = base.join(format!("{name}-{}", hex::encode(random)));
    std::fs::DirBuilder::new().mode(0o700).create(&path)?;
    let scratch = Scratch { path };
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(&scratch.path, Some(uid), Some(gid))?;
    }
    Ok(scratch)
}

/// What the reports of one launch come to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A guarantee could not be held; nothing was executed.
    Unavailable { guarantee: String, detail: String },
    /// Confined, the program could not be executed.
    NotStarted(String),
    /// The kernel ended the tool at a limit (`cpu_s`, `file_size_mb`).
    LimitHit { limit: &'static str, signal: i32 },
    /// The tool ran and exited (code) or was killed (signal).
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

/// Reads the records of one launch into its outcome and evidence.
pub fn conclude(plan: &Plan, records: &[Record], traffic: Option<Traffic>) -> (Outcome, Evidence) {
    let mut details = Map::new();
    details.insert("profile_sha256".into(), json!(plan.sha256));
    details.insert("limits".into(), json!(plan.profile.limits));
    details.insert(
        "network".into(),
        super::plan::network_json(&plan.profile.network),
    );
    let mut evidence = Evidence::default();
    let mut started = None;
    let mut outcome = None;
    for record in records {
        match record {
            Record::Started(enforced) => started = Some(enforced.clone()),
            Record::Unavailable { guarantee, detail } => {
                outcome.get_or_insert(Outcome::Unavailable {
                    guarantee: guarantee.clone(),
                    detail: detail.clone(),
                });
            }
            Record::ExecFailed { detail } => {
                outcome.get_or_insert(Outcome::NotStarted(detail.clone()));
            }
            Record::Exited { code, signal } => {
                if started.is_some() {
                    outcome.get_or_insert(Outcome::Exited {
                        code: *code,
                        signal: *signal,
                    });
                }
            }
            Record::Usage { cpu_ms, maxrss_kb } => {
                evidence.cpu_ms = Some(*cpu_ms);
                evidence.memory_peak_mb = Some(maxrss_kb.div_ceil(1024));
            }
        }
    }
    let outcome = match (outcome, &started) {
        (Some(o), _) => o,
        (None, Some(_)) => Outcome::Exited {
            code: None,
            signal: None,
        },
        (None, None) => Outcome::Unavailable {
            guarantee: "launcher".into(),
            detail: "the launcher ended without confining the tool".into(),
        },
    };
    // A kernel-signalled limit: SIGXCPU at the soft CPU limit, SIGKILL at the hard one
    // (its CPU time says so), SIGXFSZ past the file size.
    let cpu_limit_ms = plan.profile.limits.cpu_s.saturating_mul(1000);
    let outcome = match outcome {
        Outcome::Exited {
            signal: Some(s), ..
        } if s == libc::SIGXCPU
            || (s == libc::SIGKILL && evidence.cpu_ms.is_some_and(|c| c >= cpu_limit_ms)) =>
        {
            Outcome::LimitHit {
                limit: "cpu_s",
                signal: s,
            }
        }
        Outcome::Exited {
            signal: Some(s), ..
        } if s == libc::SIGXFSZ => Outcome::LimitHit {
            limit: "file_size_mb",
            signal: s,
        },
        other => other,
    };
    match &started {
        Some(enforced) => {
            details.insert("enforced".into(), json!(enforced));
        }
        None => {
            details.insert("enforced".into(), Value::Null);
        }
    }
    details.insert(
        "limit_hit".into(),
        match &outcome {
            Outcome::LimitHit { limit, .. } => json!(limit),
            _ => Value::Null,
        },
    );
    if let Outcome::Unavailable { guarantee, detail } = &outcome {
        details.insert(
            "unavailable".into(),
            json!({ "guarantee": guarantee, "detail": detail }),
        );
    }
    if let Some(traffic) = traffic {
        details.insert("connections".into(), json!(traffic));
    }
    if let Some(cpu) = evidence.cpu_ms {
        details.insert("cpu_ms".into(), json!(cpu));
    }
    if let Some(mem) = evidence.memory_peak_mb {
        details.insert("memory_peak_mb".into(), json!(mem));
    }
    evidence.details = details;
    (outcome, evidence)
}
