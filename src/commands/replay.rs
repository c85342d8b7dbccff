//! `toolgate audit replay`: re-decides recorded calls under a candidate policy
//! (`review::replay`) and prints what would change.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::audit::{AuditError, AuditReader};
use crate::call::Decision;
use crate::call::Verdict;
use crate::commands::{Exit, Format};
use crate::gateway::Loaded;
use crate::review::replay::{ChangeKind, ReplayReport, Replayed, replay_db};

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
    let candidate = match Loaded::load(&args.policy_dir, &args.tools, Path::new("var")) {
        Ok(l) => l,
        Err(problems) => {
            eprintln!("error: the candidate policy did not load");
            for p in &problems {
                eprintln!("{p}");
            }
            return Exit::InvalidConfig;
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

fn verdict_text(v: &Verdict) -> String {
    match (v.decision, v.step, &v.reason) {
        (Decision::Allow, _, _) => "allow".to_string(),
        (Decision::Deny, step, reason) => format!(
            "deny at step {} ({}): {}",
            step.unwrap_or_default(),
            reason.as_deref().unwrap_or("?"),
            v.message.as_deref().unwrap_or("")
        ),
    }
}

fn call_line(c: &Replayed) -> String {
    format!(
        "  seq {}  {}  {}  {} / {} / {}{}\n",
        c.seq,
        c.timestamp.as_deref().unwrap_or("-"),
        c.call_id,
        c.role_id,
        c.lane_id,
        c.tool_name,
        if c.dry_run { "  (dry run)" } else { "" }
    )
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn render_text(report: &ReplayReport, candidate: &Loaded, db: &Path) -> String {
    let v = &candidate.policy.versions;
    let mut out = format!(
        "audit replay: `{}` under `{}` (roles {}, lanes {}, registry {})\n",
        db.display(),
        candidate.policy.source.policy_dir,
        v.roles.version,
        v.lanes.version,
        v.registry.version
    );
    out.push_str(&format!(
        "{} replayed: {} unchanged, {} allowed -> denied, {} denied -> allowed, {} with a different denial reason\n",
        plural(report.replayed, "call", "calls"),
        report.unchanged,
        report.count(ChangeKind::AllowedToDenied),
        report.count(ChangeKind::DeniedToAllowed),
        report.count(ChangeKind::ReasonChanged),
    ));
    if !report.changes.is_empty() {
        out.push_str("\nchanged decisions:\n");
        for c in &report.changes {
            out.push_str(&call_line(c));
            out.push_str(&format!("    was: {}\n", verdict_text(&c.was)));
            out.push_str(&format!("    now: {}", verdict_text(&c.now)));
            if !c.arguments_checked {
                out.push_str(" (arguments not kept: step-8 argument checks not re-run)");
            }
            out.push('\n');
        }
    }
    if !report.undetermined.is_empty() {
        out.push_str(
            "\nundetermined (denied at step 8 before; the arguments were not kept, so the step-8 argument checks could not be re-run):\n",
        );
        for c in &report.undetermined {
            out.push_str(&call_line(c));
            out.push_str(&format!("    was: {}\n", verdict_text(&c.was)));
        }
    }
    if report.not_rechecked > 0 {
        out.push_str(&format!(
            "\nnote: {} re-decided without the step-8 argument checks (arguments not kept)\n",
            plural(report.not_rechecked, "call was", "calls were")
        ));
    }
    for (why, n) in &report.skipped {
        out.push_str(&format!(
            "skipped: {} ({why})\n",
            plural(*n, "call", "calls")
        ));
    }
    if report.truncated {
        out.push_str("truncated: more calls matched than --limit allows\n");
    }
    out
}

fn render_json(report: &ReplayReport, candidate: &Loaded, db: &Path) -> String {
    let value = json!({
        "db": db.display().to_string(),
        "candidate": {
            "source": candidate.policy.source,
            "versions": candidate.policy.versions,
        },
        "summary": {
            "replayed": report.replayed,
            "unchanged": report.unchanged,
            "allowed_to_denied": report.count(ChangeKind::AllowedToDenied),
            "denied_to_allowed": report.count(ChangeKind::DeniedToAllowed),
            "reason_changed": report.count(ChangeKind::ReasonChanged),
            "undetermined": report.undetermined.len(),
            "not_rechecked": report.not_rechecked,
            "skipped": report.skipped,
            "truncated": report.truncated,
        },
        "changes": report.changes,
        "undetermined": report.undetermined,
    });
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| "{}".to_string());
    text.push('\n');
    text
}
