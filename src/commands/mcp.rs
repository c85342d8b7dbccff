//! `toolgate mcp ...`: the MCP commands (`import`); the listing and rendering are
//! `mcp::import`'s.

use std::time::Duration;

use clap::{Args, Subcommand};
use tokio::time::Instant;

use crate::adapter::mcp::{Upstream, list_tools};
use crate::adapter::{AdapterEnv, ExecError};
use crate::commands::Exit;
use crate::mcp::import::render;

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Ask an MCP server for its tools and print registry entries for them (disabled,
    /// with no lanes) for a person to review.
    Import(ImportArgs),
}

/// Runs a `toolgate mcp` command.
pub fn mcp_command(command: &McpCommand) -> Exit {
    match command {
        McpCommand::Import(args) => import_command(args),
    }
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Reach the server at this Streamable HTTP endpoint (http://...).
    #[arg(
        long,
        value_name = "URL",
        conflicts_with = "command",
        required_unless_present = "command"
    )]
    pub url: Option<String>,
    /// Lane to put in each entry's `allowed_lanes` (repeatable); entries stay disabled.
    #[arg(long, value_name = "LANE")]
    pub lane: Vec<String>,
    /// The `server_id` of the printed `servers:` entry (default: from the server's name).
    #[arg(long, value_name = "ID")]
    pub server_id: Option<String>,
    /// How long to wait for the server to start and list its tools.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub timeout_secs: u64,
    /// Start the server with this program and its arguments (over stdio). Give it last:
    /// every word after it belongs to the command.
    #[arg(long, value_name = "ARGV", num_args = 1.., allow_hyphen_values = true)]
    pub command: Vec<String>,
}

pub fn import_command(args: &ImportArgs) -> Exit {
    if let Some(id) = &args.server_id
        && !crate::policy::is_id(id)
    {
        eprintln!("error: --server-id {id:?} is not an id");
        eprintln!("  help: an id is 1-64 characters of a-z, 0-9 and _, starting with a letter");
        return Exit::InvalidConfig;
    }
    let env = match std::env::current_dir() {
        Ok(dir) => AdapterEnv {
            tools_dir: dir.clone(),
            data_dir: dir,
        },
        Err(e) => {
            eprintln!("error: cannot read the current directory: {e}");
            return Exit::Failure;
        }
    };
    let command = (!args.command.is_empty()).then_some(args.command.as_slice());
    let upstream = match Upstream::build(command, args.url.as_deref(), &env) {
        Ok(upstream) => upstream,
        Err(problems) => {
            for p in problems {
                eprintln!("error: {}", p.message);
                if let Some(help) = p.help {
                    eprintln!("  help: {help}");
                }
            }
            return Exit::InvalidConfig;
        }
    };
    let runtime = match crate::commands::runtime(&mut tokio::runtime::Builder::new_current_thread())
    {
        Ok(rt) => rt,
        Err(exit) => return exit,
    };
    let timeout = Duration::from_secs(args.timeout_secs.max(1));
    let listing = runtime.block_on(async { list_tools(&upstream, Instant::now() + timeout).await });
    match listing {
        Ok(listing) => {
            for warning in crate::mcp::import::warnings(&listing) {
                eprintln!("warning: {warning}");
            }
            print!(
                "{}",
                render(&listing, &upstream, &args.lane, args.server_id.as_deref())
            );
            Exit::Ok
        }
        Err(e) => {
            let why = match e {
                ExecError::Timeout => {
                    format!("the server did not answer within {} s", timeout.as_secs())
                }
                ExecError::DependencyDown(m) | ExecError::Unreachable(m) | ExecError::Failed(m) => {
                    m
                }
                other => format!("{other:?}"),
            };
            eprintln!("error: cannot list the tools of the mcp server: {why}");
            Exit::Failure
        }
    }
}
