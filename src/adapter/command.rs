//! The command adapter: runs a program with a fixed argument vector, the call's
//! arguments as JSON on stdin, and reads one JSON value from its stdout.
//!
//! INVARIANT: programs are never run through a shell (argv is passed to `execve` as
//! is, so shell metacharacters in arguments are plain bytes), with a cleared
//! environment plus the tool's `env_allowlist`, in their own process group. When a
//! call ends, by any path (success, failure, deadline, or the call future being
//! dropped), the whole process group is sent SIGKILL: a call leaves no process behind
//! unless a process deliberately left the group (`setsid`), which only an OS sandbox
//! (cgroups) could prevent.
//!
//! A confined tool (every command tool but one whose profile says `unconfined`) is
//! started through the sandbox launcher (`sandbox::run`): its process runs inside its
//! profile, in a pid namespace where the host allows one (then nothing it starts
//! outlives it) or under a subreaper that kills what it leaves behind; the evidence of
//! the confinement goes to the call's `details.sandbox`.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{
    AdapterEnv, ExecContext, ExecError, SettingProblem, output_hard_cap, parse_output,
    strings_with_pointers, unsafe_argument,
};
use crate::canonical::{to_canonical_bytes, to_canonical_string};
use crate::diagnostic::Refusal;
use crate::policy::Tool;
use crate::sandbox::run::{Launch, Outcome, put};
use crate::sandbox::{Evidence, Plan};

/// Largest arguments (as JSON) a program is given.
pub const MAX_ARGUMENT_BYTES: usize = 1024 * 1024;
/// How much of stderr is kept (its end) for the error message.
const STDERR_TAIL_BYTES: usize = 4096;
/// How much of that tail goes into the error message.
const STDERR_MESSAGE_BYTES: usize = 1536;
/// How long to wait for a killed program to be reaped before leaving it to the runtime.
const REAP_GRACE: Duration = Duration::from_millis(500);
/// Allowlisted variables whose values are removed from error messages.
const SECRET_NAME_PARTS: &[&str] = &["TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL"];

/// The command adapter of one tool.
#[derive(Debug)]
pub struct CommandAdapter {
    /// argv[0] as written in the registry, for messages.
    argv0: String,
    /// The program to execute: absolute, resolved on PATH at build for bare names.
    program: PathBuf,
    /// argv[1..].
    args: Vec<String>,
    /// Absolute or relative to the process's working directory; checked at build.
    working_dir: PathBuf,
    /// Variables passed through from toolgate's environment (read at each call).
    env_allowlist: Vec<String>,
    /// How the process is confined (set by `adapter::build` from the policy).
    confinement: Confinement,
}

/// A local process's confinement.
#[derive(Debug, Clone)]
pub(crate) enum Confinement {
    /// Through the launcher, inside this plan.
    Confined(Arc<Plan>),
    /// `sandbox: {unconfined: reason}`: started directly, audited with its reason.
    Unconfined(String),
}

impl CommandAdapter {
    pub(super) fn build(
        argv: &[String],
        working_dir: Option<&str>,
        env_allowlist: &[String],
        env: &AdapterEnv,
    ) -> Result<Self, Vec<SettingProblem>> {
        let mut problems = Vec::new();
        let program = match argv.first() {
            None => {
                problems.push(
                    SettingProblem::new("`argv` is empty")
                        .help("give the program and its fixed arguments, e.g. [\"python3\", \"scripts/tool.py\"]"),
                );
                None
            }
            Some(argv0) => match resolve_program(argv0) {
                Ok(p) => Some(p),
                Err(p) => {
                    problems.push(p);
                    None
                }
            },
        };
        for (i, arg) in argv.iter().enumerate() {
            if arg.contains('\0') {
                problems.push(SettingProblem::new(format!(
                    "`argv[{i}]` contains a nul byte"
                )));
            }
        }
        let dir = match working_dir {
            None => env.tools_dir.clone(),
            Some(d) if Path::new(d).is_absolute() => PathBuf::from(d),
            Some(d) => env.tools_dir.join(d),
        };
        if !dir.is_dir() {
            problems.push(
                SettingProblem::new(format!(
                    "working_dir `{}` is not an existing directory",
                    dir.display()
                ))
                .help("relative working_dirs resolve against the directory of tool_registry.yaml"),
            );
        }
        for name in env_allowlist {
            let valid = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                problems.push(
                    SettingProblem::new(format!(
                        "`env_allowlist` entry `{name}` is not a variable name"
                    ))
                    .help("use names like `PATH` or `LANG` (letters, digits, underscore)"),
                );
            } else if name.starts_with("TOOLGATE_") {
                problems.push(SettingProblem::new(format!(
                    "`env_allowlist` entry `{name}` is reserved (toolgate sets TOOLGATE_* itself)"
                )));
            }
        }
        match (program, problems.is_empty()) {
            (Some(program), true) => Ok(CommandAdapter {
                argv0: argv.first().cloned().unwrap_or_default(),
                program,
                args: argv.iter().skip(1).cloned().collect(),
                working_dir: dir,
                env_allowlist: env_allowlist.to_vec(),
                confinement: Confinement::Unconfined(String::new()),
            }),
            _ => Err(problems),
        }
    }

    /// The program this adapter runs (for the sandbox plan).
    pub(crate) fn program(&self) -> &Path {
        &self.program
    }

    /// The working directory this adapter runs in.
    pub(crate) fn working_dir(&self) -> &Path {
        &self.working_dir
    }

    /// How the process is confined.
    pub(crate) fn confinement(&self) -> &Confinement {
        &self.confinement
    }

    /// Sets how the process is confined.
    pub(crate) fn confine(mut self, confinement: Confinement) -> Self {
        self.confinement = confinement;
        self
    }

    /// Arguments never reach a shell (they go to the program's stdin as JSON), so
    /// shell metacharacters are harmless; refused are NUL bytes in any string (a
    /// program written in C would see a truncated value) and arguments larger than
    /// [`MAX_ARGUMENT_BYTES`].
    pub(super) fn validate(&self, arguments: &Value) -> Result<(), Refusal> {
        let size = to_canonical_bytes(arguments).len();
        if size > MAX_ARGUMENT_BYTES {
            return Err(unsafe_argument(
                "",
                &format!(
                    "the arguments are {size} bytes, more than the {MAX_ARGUMENT_BYTES} a program is given"
                ),
            ));
        }
        for (pointer, s) in strings_with_pointers(arguments) {
            if s.contains('\0') {
                return Err(unsafe_argument(&pointer, "contains a nul byte"));
            }
        }
        Ok(())
    }

    pub(super) async fn execute(
        &self,
        tool: &Tool,
        arguments: &Value,
        ctx: ExecContext<'_>,
    ) -> Result<Value, ExecError> {
        let input = to_canonical_bytes(arguments);
        let (vars, secrets) = self.environment(&ctx);
        let (mut command, mut launch, plan) = self.command(vars, &ctx)?;
        command
            .current_dir(&self.working_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);

        // A program that could not start ran nothing: a retry cannot repeat an effect,
        // and the call's idempotency key is not spent on it.
        let mut child = command.spawn().map_err(|e| {
            ExecError::Unreachable(format!("could not start `{}`: {e}", self.argv0))
        })?;
        let reports = launch.as_mut().map(|l| tokio::spawn(l.spawned().read()));
        // Declared after `child`, so it is dropped first. On the deadline and
        // cancellation paths the group is killed before the leader is reaped, so its
        // pid (the group id) cannot have been reused; after a normal exit the kill
        // reaches only processes the program left behind, which keep the id alive.
        let group = ProcessGroup::of(child.id());
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let cap = output_hard_cap(tool);

        let work = async {
            let write = async {
                if let Some(mut stdin) = stdin {
                    // A program that does not read its stdin closes the pipe; that is
                    // its choice, not an error.
                    let _ = stdin.write_all(&input).await;
                    let _ = stdin.shutdown().await;
                }
            };
            let read_out = async {
                let result = read_capped(stdout, cap).await;
                if result.is_err() {
                    group.kill();
                }
                result
            };
            let (_, out, err, status) = tokio::join!(
                write,
                read_out,
                read_tail(stderr, STDERR_TAIL_BYTES),
                child.wait()
            );
            (out, err, status)
        };
        let confined = plan.zip(reports);
        let (out, err, status) = match tokio::time::timeout_at(ctx.deadline, work).await {
            Ok(done) => done,
            Err(_) => {
                group.kill();
                let _ = tokio::time::timeout(REAP_GRACE, child.wait()).await;
                if let Some((plan, reports)) = confined {
                    let records = reports_within_grace(reports).await;
                    let traffic = launch.as_ref().and_then(Launch::traffic);
                    put(
                        ctx.sandbox,
                        crate::sandbox::run::conclude(plan, &records, traffic).1,
                    );
                }
                return Err(ExecError::Timeout);
            }
        };
        // A confined tool: what the launcher reported decides first.
        let mut killed_by = None;
        if let Some((plan, reports)) = confined {
            let records = reports_within_grace(reports).await;
            let traffic = launch.as_ref().and_then(Launch::traffic);
            let (outcome, evidence) = crate::sandbox::run::conclude(plan, &records, traffic);
            put(ctx.sandbox, evidence);
            killed_by = self.launcher_outcome(outcome, &err, &secrets)?;
        }
        let stdout = out.map_err(|e| match e {
            ReadError::Overflow => ExecError::Failed(format!(
                "`{}` wrote more than {cap} bytes to stdout",
                self.argv0
            )),
            ReadError::Io(e) => {
                ExecError::Failed(format!("reading stdout of `{}` failed: {e}", self.argv0))
            }
        })?;
        let status = status
            .map_err(|e| ExecError::Failed(format!("waiting for `{}` failed: {e}", self.argv0)))?;
        if !status.success() {
            return Err(self.failed(status, killed_by, &err, &secrets));
        }
        if stdout.iter().all(u8::is_ascii_whitespace) {
            return Err(ExecError::OutputNotJson(format!(
                "`{}` wrote nothing to stdout",
                self.argv0
            )));
        }
        // The program has exited; a large output's parse still ends at the deadline.
        match tokio::time::timeout_at(ctx.deadline, parse_output(stdout)).await {
            Ok(parsed) => parsed.map_err(|e| {
                ExecError::OutputNotJson(format!(
                    "stdout of `{}` is not one json value: {e}",
                    self.argv0
                ))
            }),
            Err(_) => Err(ExecError::Timeout),
        }
    }

    /// The program's environment: the allowlisted variables of toolgate's own and the
    /// call's ids and scope; with the values of secret-named ones, kept to redact
    /// stderr.
    fn environment(&self, ctx: &ExecContext<'_>) -> (Vec<(OsString, OsString)>, Vec<String>) {
        let mut secrets = Vec::new();
        let mut vars: Vec<(OsString, OsString)> = Vec::new();
        for name in &self.env_allowlist {
            if let Some(value) = std::env::var_os(name) {
                if is_secret_name(name) && value.len() >= 4 {
                    secrets.push(value.to_string_lossy().into_owned());
                }
                vars.push((name.into(), value));
            }
        }
        vars.push(("TOOLGATE_CALL_ID".into(), ctx.call_id.into()));
        vars.push(("TOOLGATE_RUN_ID".into(), ctx.run_id.into()));
        vars.push(("TOOLGATE_SCOPE".into(), scope_json(ctx.scope).into()));
        (vars, secrets)
    }

    /// The process to spawn: the program itself, or the sandbox launcher that confines
    /// it (with the launch it reports through, and the profile).
    fn command(
        &self,
        vars: Vec<(OsString, OsString)>,
        ctx: &ExecContext<'_>,
    ) -> Result<(tokio::process::Command, Option<Launch>, Option<&Plan>), ExecError> {
        match &self.confinement {
            Confinement::Unconfined(reason) => {
                put(ctx.sandbox, Evidence::unconfined(reason));
                let mut command = tokio::process::Command::new(&self.program);
                command.args(&self.args).env_clear().envs(vars);
                Ok((command, None, None))
            }
            Confinement::Confined(plan) => {
                // Until the launcher reports, the call's evidence is its profile.
                put(
                    ctx.sandbox,
                    crate::sandbox::run::conclude(plan, &[], None).1,
                );
                let mut argv = vec![self.argv0.clone()];
                argv.extend(self.args.iter().cloned());
                let mut launch = Launch::prepare(plan, &self.program, &argv, vars, ctx.call_id)
                    .map_err(|u| ExecError::SandboxUnavailable {
                        guarantee: u.guarantee,
                        detail: u.detail,
                    })?;
                let command =
                    std::mem::replace(&mut launch.command, tokio::process::Command::new("/"));
                Ok((command, Some(launch), Some(plan)))
            }
        }
    }

    /// What the launcher reported, as the call's failure, or the signal that killed
    /// the program (None: it exited).
    fn launcher_outcome(
        &self,
        outcome: Outcome,
        err: &[u8],
        secrets: &[String],
    ) -> Result<Option<i32>, ExecError> {
        match outcome {
            Outcome::Unavailable { guarantee, detail } => {
                Err(ExecError::SandboxUnavailable { guarantee, detail })
            }
            Outcome::NotStarted(detail) => Err(ExecError::Unreachable(detail)),
            Outcome::LimitHit { limit, signal } => {
                let tail = redact(&String::from_utf8_lossy(err), secrets);
                Err(ExecError::ResourceLimit {
                    limit,
                    detail: format!(
                        "`{}` was killed by signal {signal}; stderr: {}",
                        self.argv0,
                        tail_of(tail.trim(), STDERR_MESSAGE_BYTES)
                    ),
                })
            }
            Outcome::Exited { signal, .. } => Ok(signal),
        }
    }

    /// A program that did not succeed: how it ended and the redacted tail of stderr.
    fn failed(
        &self,
        status: std::process::ExitStatus,
        killed_by: Option<i32>,
        err: &[u8],
        secrets: &[String],
    ) -> ExecError {
        let how = match (killed_by, status.code(), status.signal()) {
            (Some(signal), _, _) => format!("was killed by signal {signal}"),
            (None, Some(code), _) => format!("exited with status {code}"),
            (None, None, Some(signal)) => format!("was killed by signal {signal}"),
            (None, None, None) => "failed".to_string(),
        };
        let tail = redact(&String::from_utf8_lossy(err), secrets);
        let tail = tail_of(tail.trim(), STDERR_MESSAGE_BYTES);
        let stderr_part = if tail.is_empty() {
            "stderr is empty".to_string()
        } else {
            format!("stderr: {tail}")
        };
        ExecError::Failed(format!("`{}` {how}; {stderr_part}", self.argv0))
    }
}

/// The launcher's reports, waited for at most [`REAP_GRACE`] after the program ended.
async fn reports_within_grace(
    reports: tokio::task::JoinHandle<Vec<crate::sandbox::Record>>,
) -> Vec<crate::sandbox::Record> {
    tokio::time::timeout(REAP_GRACE, reports)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// Resolves argv[0]: an absolute path to an executable file, or a bare name found on
/// toolgate's PATH now (the program itself runs without PATH unless allowlisted).
pub(crate) fn resolve_program(argv0: &str) -> Result<PathBuf, SettingProblem> {
    let path = Path::new(argv0);
    if argv0.is_empty() {
        return Err(SettingProblem::new("`argv[0]` is empty"));
    }
    if path.is_absolute() {
        return if is_executable(path) {
            Ok(path.to_path_buf())
        } else {
            Err(SettingProblem::new(format!(
                "`argv[0]` `{argv0}` is not an executable file"
            )))
        };
    }
    if argv0.contains('/') {
        return Err(SettingProblem::new(format!(
            "`argv[0]` `{argv0}` is a relative path"
        ))
        .help("use an absolute path or a bare program name on PATH; run a shipped script through its interpreter, e.g. [\"python3\", \"scripts/tool.py\"] with `working_dir`"));
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .filter(|dir| dir.is_absolute())
            .map(|dir| dir.join(argv0))
            .find(|candidate| is_executable(candidate))
    });
    found.ok_or_else(|| {
        SettingProblem::new(format!("`argv[0]` `{argv0}` is not found on PATH"))
            .help("install the program, or give its absolute path")
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_NAME_PARTS.iter().any(|part| upper.contains(part))
}

fn redact(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_string();
    for secret in secrets {
        text = text.replace(secret.as_str(), "[redacted]");
    }
    text
}

/// The last `max` bytes of `text`, on a character boundary, marked when cut.
fn tail_of(text: &str, max: usize) -> String {
    crate::text::tail_bytes(text, max)
}

fn scope_json(scope: &Map<String, Value>) -> String {
    to_canonical_string(&Value::Object(scope.clone()))
}

/// The process group of a spawned program; killed when dropped.
pub(crate) struct ProcessGroup {
    pgid: Option<libc::pid_t>,
}

impl ProcessGroup {
    pub(crate) fn of(pid: Option<u32>) -> Self {
        // INVARIANT: never 0, 1 or negative: killpg(0) would kill toolgate's own group.
        let pgid = pid
            .and_then(|p| libc::pid_t::try_from(p).ok())
            .filter(|p| *p > 1);
        ProcessGroup { pgid }
    }

    pub(crate) fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // SAFETY: killpg only sends a signal; `pgid` is the id of a group this
            // adapter created (process_group(0) makes the child's pid its group id).
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

enum ReadError {
    Overflow,
    Io(std::io::Error),
}

/// Reads all of `reader`, failing once more than `cap` bytes arrive.
async fn read_capped<R: AsyncRead + Unpin>(
    reader: Option<R>,
    cap: usize,
) -> Result<Vec<u8>, ReadError> {
    let Some(reader) = reader else {
        return Ok(Vec::new());
    };
    let mut buf = Vec::new();
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(limit)
        .read_to_end(&mut buf)
        .await
        .map_err(ReadError::Io)?;
    if buf.len() > cap {
        return Err(ReadError::Overflow);
    }
    Ok(buf)
}

/// Reads all of `reader`, keeping only the last `keep` bytes.
async fn read_tail<R: AsyncRead + Unpin>(reader: Option<R>, keep: usize) -> Vec<u8> {
    let Some(mut reader) = reader else {
        return Vec::new();
    };
    let mut tail = Vec::with_capacity(keep * 2);
    let mut chunk = [0u8; 4096];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend_from_slice(&chunk[..n]);
                if tail.len() > keep {
                    tail.drain(..tail.len() - keep);
                }
            }
        }
    }
    tail
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn tails_are_bounded_on_char_boundaries() {
        let s = format!("{}end", "\u{e9}".repeat(1000));
        let t = tail_of(&s, 11);
        assert!(t.starts_with("..."));
        assert!(t.ends_with("end"));
        assert!(t.len() <= 14);
    }

    #[test]
    fn secrets_are_redacted() {
        assert!(is_secret_name("API_TOKEN"));
        assert!(!is_secret_name("LANG"));
        assert_eq!(
            redact("bad token s3cr3t!", &["s3cr3t".to_string()]),
            "bad token [redacted]!"
        );
    }

    #[test]
    fn relative_and_missing_programs_are_problems() {
        assert!(resolve_program("./tool").is_err());
        assert!(resolve_program("bin/tool").is_err());
        assert!(resolve_program("/nonexistent/tool").is_err());
        assert!(resolve_program("no-such-program-toolgate").is_err());
        assert!(resolve_program("").is_err());
        assert!(resolve_program("cat").unwrap().is_absolute());
    }
}
