//! Rendering: the replay report as text for a reviewer or as JSON for a CI gate.

use std::path::Path;

use serde_json::json;

use super::{ChangeKind, ReplayReport, Replayed};
use crate::call::{Decision, Verdict};
use crate::gateway::Loaded;

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

pub fn render_text(report: &ReplayReport, candidate: &Loaded, db: &Path) -> String {
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

pub fn render_json(report: &ReplayReport, candidate: &Loaded, db: &Path) -> String {
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
