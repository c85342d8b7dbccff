//! `toolgate audit replay`: re-decides recorded calls under a candidate policy
//! (`review::replay`) and prints what would change.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::audit::{AuditError, AuditReader};
use crate::commands::{Exit, Format, not_loaded};

use crate::review::replay::render::{render_json, render_text};
use crate::review::replay::replay_db;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The candidate policy directory (roles.yaml, lanes.yaml).
    #[arg(long)]
    pub policy_dir: PathBuf,
    /// The candidate's tool registry.
    #[arg(long, default_value = "tools/tool_registry.yaml")]
    pub tools: PathBuf,
    /// The audit database (opened read-only).
    #[arg(long, default_value = "var/audit.db")]
    pub db: PathBuf,
    /// Only calls recorded at or after this time (RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// Replay at most this many calls.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub limit: u64,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

pub fn replay_command(args: &ReplayArgs) -> Exit {
    let since = match &args.since {
        None => None,
        Some(text) => match OffsetDateTime::parse(text, &Rfc3339) {
            Ok(t) => Some(t),
            Err(_) => {
                eprintln!("error: --since `{text}` is not an RFC 3339 time");
                eprintln!("help: write it like 2026-11-23T08:00:00Z");
                return Exit::InvalidConfig;
            }
        },
    };
    let candidate = match super::load_offline(&args.policy_dir, &args.tools) {
        Ok(l) => l,
        Err(problems) => {
            return not_loaded(
                args.format,
                "candidate_policy",
                "the candidate policy",
                &problems,
            );
        }
    };
    let report = AuditReader::open(&args.db).and_then(|reader| {
        let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
        replay_db(&reader, &candidate, since, limit)
    });
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(help) = e.help() {
                eprintln!("help: {help}");
            }
            return match e {
                AuditError::Corrupt { .. } => Exit::Failure,
                _ => Exit::InvalidConfig,
            };
        }
    };
    let text = match args.format {
        Format::Text => render_text(&report, &candidate, &args.db),
        Format::Json => render_json(&report, &candidate, &args.db),
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Exit::Ok,
        Err(_) => Exit::Failure,
    }
}
