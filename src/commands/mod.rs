//! The `toolgate` command line: flag definitions, dispatch, and every subcommand's
//! entry point, output and exit code (one file per command).
//!
//! This is the only place that prints a command's final error and picks the process
//! exit code (see [`Exit`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub mod approvals;
pub mod audit;
pub mod audit_fleet;
pub mod diff;
pub mod doctor;
pub mod explain;
pub mod mcp;
pub mod policy_check;
pub mod replay;
pub mod serve;
mod serve_args;
pub mod test;

/// Exit codes, as documented in docs/operations.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Success.
    Ok = 0,
    /// Generic failure (an I/O error, a server that could not start).
    Failure = 1,
    /// Verification found a truncation or a fork (audit).
    Truncated = 2,
    /// A key or signature problem (audit).
    Signature = 3,
    /// Invalid configuration: a policy that does not load, bad flags.
    InvalidConfig = 4,
    /// A schema error: a document that does not match its JSON Schema.
    SchemaError = 5,
    /// The cluster database (`serve --cluster-db`) is unreachable, refuses the
    /// credentials, is not PostgreSQL, or has a schema newer than this binary.
    Cluster = 6,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "toolgate",
    version,
    about = "Policy-and-audit enforcement sidecar for AI agents"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the sidecar: the HTTP API on the loaded policy.
    Serve(Box<serve::ServeArgs>),
    /// Check, review and test the policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Verify, export and inspect the audit log.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Work with MCP servers (import their tools into the registry).
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// Hold the audit signing key in this process and sign checkpoints for a gateway
    /// over a Unix socket (run it as another user).
    Signer(audit::SignerArgs),
    /// Decide approvals of calls that need one, against a running server.
    #[command(subcommand)]
    Approvals(approvals::ApprovalsCommand),
    /// Report what this host can enforce for sandboxed tools (Landlock, seccomp,
    /// namespaces) and which mechanism would hold each guarantee.
    Doctor(doctor::DoctorArgs),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Load and validate the policy; print the versions and hashes, or every problem.
    Check(PolicyCheckArgs),
    /// Run the authorization steps for one request and print each with pass or fail.
    Explain(explain::ExplainArgs),
    /// Run the policy test cases (policy/tests/*.yaml) offline.
    Test(test::TestArgs),
    /// Show the change in effective permissions between two versions of the policy.
    Diff(diff::DiffArgs),
}

/// Where the policy lives.
#[derive(Debug, Clone, Args)]
pub struct PolicyLocation {
    /// Directory holding roles.yaml and lanes.yaml.
    #[arg(long, default_value = "policy")]
    pub policy_dir: PathBuf,
    /// The tool registry.
    #[arg(long, default_value = "tools/tool_registry.yaml")]
    pub tools: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Files a command needs did not load (`what`: `policy`, `candidate_policy`, `cases`;
/// `named` says it in the message), so it ran nothing: the problems go to stderr and,
/// with `--format json`, one object to stdout (`"ok": false`, `"not_loaded": what`,
/// `"problems"` as `policy check` gives them), so a pipeline reading JSON gets an
/// answer too. Exit 4.
pub(crate) fn not_loaded(
    format: Format,
    what: &str,
    named: &str,
    problems: &[crate::policy::Problem],
) -> Exit {
    eprintln!("error: {named} did not load");
    for p in problems {
        eprintln!("{p}");
    }
    if format == Format::Json {
        println!(
            "{}",
            serde_json::json!({"ok": false, "not_loaded": what, "problems": problems})
        );
    }
    Exit::InvalidConfig
}

/// The one JSON answer of a command that does not end `ok` (`audit verify`, `audit
/// archive`, `audit key`, `approvals`): `status` is `failed` (what was checked did not
/// hold; `kind` names the problem) or `error` (nothing was checked; `kind` says why),
/// with `seq` where one event is at fault, the message and the exit code.
fn say_json_outcome(
    status: &str,
    kind: impl serde::Serialize,
    seq: Option<u64>,
    message: &str,
    exit: Exit,
) {
    let value = serde_json::json!({
        "status": status,
        "kind": kind,
        "seq": seq,
        "message": message,
        "exit_code": exit as u8,
    });
    use std::io::Write;
    let _ = writeln!(
        std::io::stdout().lock(),
        "{}",
        serde_json::to_string_pretty(&value).unwrap_or_default()
    );
}

/// Refuses before anything was checked: the error on stderr and, with `--format json`,
/// the JSON answer on stdout (`status: "error"`, `kind`).
fn refuse(
    format: Format,
    kind: &str,
    error: &dyn std::fmt::Display,
    help: Option<&str>,
    exit: Exit,
) -> Exit {
    print_error(error, help);
    if format == Format::Json {
        say_json_outcome("error", kind, None, &error.to_string(), exit);
    }
    exit
}

/// Makes every entry of the data and key directories `dirs` owner-only
/// (`localfile::tighten`): what was wider and is now owner-only, and what is wider and
/// could not be changed. A directory inside another one given is walked once.
pub(crate) fn owner_only(dirs: &[&std::path::Path]) -> crate::localfile::Tightened {
    let mut all = crate::localfile::Tightened::default();
    for (i, dir) in dirs.iter().enumerate() {
        if dirs[..i].iter().any(|earlier| dir.starts_with(earlier)) {
            continue;
        }
        let done = crate::localfile::tighten(dir);
        all.tightened.extend(done.tightened);
        all.failed.extend(done.failed);
    }
    all
}

/// An error (and what to do about it) on stderr.
fn print_error(error: &dyn std::fmt::Display, help: Option<&str>) {
    eprintln!("error: {error}");
    if let Some(help) = help {
        eprintln!("help: {help}");
    }
}

#[derive(Debug, Args)]
pub struct PolicyCheckArgs {
    #[command(flatten)]
    pub location: PolicyLocation,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Also check the version rules against this git revision (a breaking schema change
    /// needs a major bump, a compatible one a minor bump); a violation exits 5.
    #[arg(long)]
    pub base: Option<String>,
    /// The data directory `serve` will use: no sandbox profile may reach it (nor its
    /// `keys/`).
    #[arg(long, default_value = "var")]
    pub data_dir: PathBuf,
}

/// The hidden subcommand of the sandbox launcher (`sandbox::exec`): toolgate runs its
/// own binary with it to confine a tool's process. It is dispatched before anything
/// else runs (no flag parsing, no thread), and is not part of the documented command
/// line.
pub const SANDBOX_EXEC: &str = "sandbox-exec";

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(SANDBOX_EXEC) {
        return crate::sandbox::exec::main(&args[2..]);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; a usage error is an
            // invalid configuration (exit 4), not clap's default 2 (which we use for
            // a truncated audit log).
            let _ = e.print();
            return if e.use_stderr() {
                Exit::InvalidConfig
            } else {
                Exit::Ok
            }
            .into();
        }
    };
    let exit = match cli.command {
        Command::Serve(args) => serve::serve_command(&args),
        Command::Policy(PolicyCommand::Check(args)) => policy_check::check_command(&args),
        Command::Policy(PolicyCommand::Explain(args)) => explain::explain_command(&args),
        Command::Policy(PolicyCommand::Test(args)) => test::test_command(&args),
        Command::Policy(PolicyCommand::Diff(args)) => diff::diff_command(&args),
        Command::Audit(command) => audit::run(command),
        Command::Mcp(command) => mcp::mcp_command(&command),
        Command::Signer(args) => audit::signer_command(&args),
        Command::Approvals(command) => approvals::approvals_command(&command),
        Command::Doctor(args) => doctor::doctor_command(&args),
    };
    exit.into()
}

/// Builds a tokio runtime from `builder` (with every driver enabled); on failure prints
/// why and gives the exit code the command returns.
pub fn runtime(builder: &mut tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, Exit> {
    builder.enable_all().build().map_err(|e| {
        eprintln!("error: cannot start the runtime: {e}");
        Exit::Failure
    })
}

/// The policy and its adapters for the offline reviews (`policy explain`, `policy test`,
/// `audit replay`), which decide and never execute: secrets are not read (each stands
/// as a placeholder), so they run where the secrets are not, as in CI.
pub(crate) fn load_offline(
    policy_dir: &std::path::Path,
    tools_file: &std::path::Path,
) -> Result<crate::gateway::Loaded, Vec<crate::policy::Problem>> {
    let policy =
        crate::policy::load_for_review(policy_dir, tools_file, &|var| std::env::var(var).ok())?;
    let env = crate::gateway::adapter_env(tools_file, std::path::Path::new("var"));
    let adapters = crate::adapter::build(&policy, &env)?;
    Ok(crate::gateway::Loaded::new(policy, adapters))
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks of every subcommand's flags (a `requires` naming
    /// a flag the subcommand lacks, a duplicate name, ...), which otherwise only fire
    /// when that subcommand is run.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
