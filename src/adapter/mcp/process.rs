//! A stdio server's process: started directly (`sandbox: {unconfined: reason}`) or,
//! by default, through the sandbox launcher under its profile, as a command tool is.
//!
//! A confined server is not spoken to until the launcher has reported that every
//! guarantee of its profile holds (or that one cannot, and nothing was executed: the
//! call is refused with `sandbox_unavailable`). Its evidence (the profile's sha256 and
//! the mechanism that held each guarantee) is recorded on every call the server
//! answers. Its limits apply over the process's lifetime: `cpu_s` is the CPU time of
//! the server across all the calls it answers, and a server the kernel ends at a limit
//! is restarted by the next call, as after any crash.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::time::Instant;

use super::{PASSED_ENV, STDERR_GRACE, STDERR_TAIL_BYTES};
use crate::adapter::ExecError;
use crate::adapter::ProcessGroup;
use crate::adapter::command::Confinement;
use crate::sandbox::run::{Evidence, Launch, Outcome, conclude};

/// The scratch directory's name stem for a server (the per-call name of a command tool).
const SCRATCH_STEM: &str = "mcp-server";

/// A started stdio server.
pub(super) struct Process {
    // INVARIANT: `group` is declared before `child`, so it is dropped first: the group
    // is killed while the child is still unreaped, so its id cannot have been reused.
    group: ProcessGroup,
    child: Mutex<tokio::process::Child>,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_done: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// What the calls it answers record in `details.sandbox`.
    pub(super) evidence: Evidence,
    /// The scratch directory and egress proxy of a confined server: they live as long
    /// as the process (declared after `child`, so dropped after it).
    _launch: Option<Mutex<Launch>>,
}

/// The pipes the MCP client speaks over.
pub(super) struct Pipes {
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
}

/// The program to start and where.
pub(super) struct Start<'a> {
    pub argv0: &'a str,
    pub program: &'a Path,
    pub args: &'a [String],
    pub working_dir: &'a Path,
    pub confinement: Option<&'a Confinement>,
    /// The entry's own `env` (secrets among them), set after [`PASSED_ENV`].
    pub env: &'a [(String, crate::policy::secrets::SecretValue)],
}

impl Process {
    /// Starts the server; for a confined one, waits (until `deadline`) for the launcher
    /// to confirm the confinement before anything is spoken to it.
    pub(super) async fn start(
        start: Start<'_>,
        deadline: Instant,
    ) -> Result<(Arc<Process>, Pipes), ExecError> {
        let vars: Vec<(OsString, OsString)> = PASSED_ENV
            .iter()
            .filter_map(|name| std::env::var_os(name).map(|value| ((*name).into(), value)))
            .chain(
                start
                    .env
                    .iter()
                    .map(|(name, value)| (name.into(), value.expose().into())),
            )
            .collect();
        let (mut command, mut launch) = match start.confinement {
            Some(Confinement::Confined(plan)) => {
                let mut argv = vec![start.argv0.to_string()];
                argv.extend(start.args.iter().cloned());
                let mut launch = Launch::prepare(plan, start.program, &argv, vars, SCRATCH_STEM)
                    .map_err(|u| ExecError::SandboxUnavailable {
                        guarantee: u.guarantee,
                        detail: u.detail,
                    })?;
                let command =
                    std::mem::replace(&mut launch.command, tokio::process::Command::new("/"));
                (command, Some(launch))
            }
            Some(Confinement::Unconfined(_)) | None => {
                let mut command = tokio::process::Command::new(start.program);
                command.args(start.args).env_clear().envs(vars);
                (command, None)
            }
        };
        command
            .current_dir(start.working_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let argv0 = start.argv0;
        let mut child = command.spawn().map_err(|e| {
            ExecError::DependencyDown(format!("could not start mcp server `{argv0}`: {e}"))
        })?;
        let group = ProcessGroup::of(child.id());
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let reader = child
            .stderr
            .take()
            .map(|pipe| tokio::spawn(keep_tail(pipe, stderr.clone())));
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        let evidence = match (start.confinement, launch.as_mut()) {
            (Some(Confinement::Confined(plan)), Some(launch)) => {
                let mut reports = launch.spawned().stream();
                let records = match tokio::time::timeout_at(deadline, reports.until_started()).await
                {
                    Ok(records) => records,
                    Err(_) => {
                        group.kill();
                        return Err(ExecError::Timeout);
                    }
                };
                // The launcher's later records (the exit) are read and let go.
                tokio::spawn(reports.rest());
                let (outcome, mut evidence) = conclude(plan, &records, None);
                match outcome {
                    Outcome::Unavailable { guarantee, detail } => {
                        group.kill();
                        return Err(ExecError::SandboxUnavailable { guarantee, detail });
                    }
                    Outcome::NotStarted(detail) => {
                        group.kill();
                        return Err(ExecError::Unreachable(format!(
                            "could not start mcp server `{argv0}` in its sandbox: {detail}"
                        )));
                    }
                    _ => {}
                }
                evidence.details.insert("lifetime".into(), json!("server"));
                evidence
            }
            (Some(Confinement::Unconfined(reason)), _) => Evidence::unconfined(reason),
            _ => Evidence::default(),
        };
        let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
            group.kill();
            return Err(ExecError::DependencyDown(format!(
                "mcp server `{argv0}` has no stdio pipes"
            )));
        };
        let process = Arc::new(Process {
            group,
            child: Mutex::new(child),
            stderr,
            stderr_done: Mutex::new(reader),
            evidence,
            _launch: launch.map(Mutex::new),
        });
        Ok((process, Pipes { stdin, stdout }))
    }

    /// Whether the process has exited (reaping it if so).
    pub(super) fn exited(&self) -> bool {
        self.child
            .lock()
            .map(|mut child| matches!(child.try_wait(), Ok(Some(_))))
            .unwrap_or(false)
    }

    /// Kills the process group, unless the process was already reaped (its id could
    /// then belong to another process).
    pub(super) fn kill(&self) {
        if let Ok(mut child) = self.child.lock()
            && matches!(child.try_wait(), Ok(None))
        {
            self.group.kill();
        }
    }

    /// The end of the server's stderr, waiting briefly (never past `deadline`) for its
    /// last lines.
    pub(super) async fn stderr_tail(&self, deadline: Instant) -> String {
        let reader = self.stderr_done.lock().ok().and_then(|mut h| h.take());
        if let Some(reader) = reader {
            let until = (Instant::now() + STDERR_GRACE).min(deadline);
            let _ = tokio::time::timeout_at(until, reader).await;
        }
        let bytes = self.stderr.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).trim().to_string()
    }
}

/// Reads a pipe to its end, keeping its last [`STDERR_TAIL_BYTES`] bytes.
async fn keep_tail(mut pipe: tokio::process::ChildStderr, tail: Arc<Mutex<Vec<u8>>>) {
    let mut buf = [0u8; 4096];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Ok(mut tail) = tail.lock() {
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > STDERR_TAIL_BYTES {
                        let cut = tail.len() - STDERR_TAIL_BYTES;
                        tail.drain(..cut);
                    }
                }
            }
        }
    }
}
