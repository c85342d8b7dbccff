//! The three forms of a policy diff: text for a terminal, markdown for a pull-request
//! comment (a summary table, then the details), JSON for bots. All three list the same
//! changes in the same (sorted) order.

use serde_json::{Value, json};

use super::compare::{Change, Effect, Section};
use super::{PolicyDiff, SideInfo};
use crate::policy::FileVersion;

fn side(info: &SideInfo) -> String {
    match &info.commit {
        Some(commit) => format!("{} ({})", info.label, commit.get(..12).unwrap_or(commit)),
        None => info.label.clone(),
    }
}

/// The three files' versions: `2026.11.1 -> 2026.11.2`, or unchanged.
fn files(report: &PolicyDiff) -> Vec<(&'static str, String)> {
    let (o, n) = (&report.old.versions, &report.new.versions);
    let line = |a: &FileVersion, b: &FileVersion| -> String {
        if a.sha256 == b.sha256 {
            format!("{} (unchanged)", b.version)
        } else if a.version == b.version {
            format!("{} (content changed, version not bumped)", b.version)
        } else {
            format!("{} -> {}", a.version, b.version)
        }
    };
    vec![
        ("roles.yaml", line(&o.roles, &n.roles)),
        ("lanes.yaml", line(&o.lanes, &n.lanes)),
        ("tool registry", line(&o.registry, &n.registry)),
    ]
}

fn summary(report: &PolicyDiff) -> String {
    let mut s = format!(
        "{} widening, {} narrowing, {} neutral",
        report.count(Effect::Widening),
        report.count(Effect::Narrowing),
        report.count(Effect::Neutral)
    );
    match report.violations.len() {
        0 => {}
        1 => s.push_str("; 1 version rule violation"),
        n => s.push_str(&format!("; {n} version rule violations")),
    }
    s
}

fn in_section(report: &PolicyDiff, section: Section) -> Vec<&Change> {
    report
        .changes
        .iter()
        .filter(|c| c.section == section)
        .collect()
}

/// For a terminal.
pub fn text(report: &PolicyDiff) -> String {
    let mut out = format!(
        "policy diff: {} -> {}\n",
        side(&report.old),
        side(&report.new)
    );
    for (file, line) in files(report) {
        out.push_str(&format!("  {file:<14} {line}\n"));
    }
    if report.changes.is_empty() {
        out.push_str("\nno change in effective permissions, limits or schemas\n");
    }
    for section in Section::ALL {
        let changes = in_section(report, section);
        if changes.is_empty() {
            continue;
        }
        out.push_str(&format!("\n{}:\n", section.title()));
        for c in changes {
            out.push_str(&format!("  {:<10} {}\n", c.effect.as_str(), c.message));
            if let Some(schema) = &c.schema {
                for sc in &schema.changes {
                    let pointer = if sc.pointer.is_empty() {
                        "/"
                    } else {
                        &sc.pointer
                    };
                    out.push_str(&format!(
                        "               {pointer}: {} ({})\n",
                        sc.message,
                        sc.class.as_str()
                    ));
                }
            }
        }
    }
    if !report.violations.is_empty() {
        out.push_str("\nversion rules:\n");
        for v in &report.violations {
            out.push_str(&format!("  error: {}\n    help: {}\n", v.message, v.help));
        }
    }
    out.push_str(&format!("\n{}\n", summary(report)));
    out
}

/// Escapes a table cell: pipes and line breaks would end it.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// For a pull-request comment.
pub fn markdown(report: &PolicyDiff) -> String {
    let mut out = String::from("## toolgate policy diff\n\n");
    out.push_str(&format!(
        "`{}` -> `{}`\n\n",
        side(&report.old),
        side(&report.new)
    ));
    if report.widens() {
        out.push_str("**This change widens access.** Review every widening change below.\n\n");
    } else {
        out.push_str("No change widens access.\n\n");
    }
    if !report.violations.is_empty() {
        out.push_str(&format!(
            "**{} version rule violation(s):** a schema changed without the version bump it needs.\n\n",
            report.violations.len()
        ));
    }
    out.push_str("| Section | Widening | Narrowing | Neutral |\n|---|---:|---:|---:|\n");
    for section in Section::ALL {
        let changes = in_section(report, section);
        let n = |e: Effect| changes.iter().filter(|c| c.effect == e).count();
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            section.title(),
            n(Effect::Widening),
            n(Effect::Narrowing),
            n(Effect::Neutral)
        ));
    }
    out.push_str(&format!(
        "| **total** | **{}** | **{}** | **{}** |\n\n",
        report.count(Effect::Widening),
        report.count(Effect::Narrowing),
        report.count(Effect::Neutral)
    ));
    out.push_str("| File | Version |\n|---|---|\n");
    for (file, line) in files(report) {
        out.push_str(&format!("| {file} | {} |\n", cell(&line)));
    }
    out.push('\n');
    if !report.violations.is_empty() {
        out.push_str("### Version rule violations\n\n");
        for v in &report.violations {
            out.push_str(&format!("- **error**: {} (help: {})\n", v.message, v.help));
        }
        out.push('\n');
    }
    if report.changes.is_empty() {
        out.push_str("No change in effective permissions, limits or schemas.\n");
        return out;
    }
    out.push_str("### Details\n");
    for section in Section::ALL {
        let changes = in_section(report, section);
        if changes.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "\n#### {}\n\n| Effect | Change |\n|---|---|\n",
            section.title()
        ));
        for c in &changes {
            let effect = match c.effect {
                Effect::Widening => "**widening**",
                Effect::Narrowing => "narrowing",
                Effect::Neutral => "neutral",
            };
            out.push_str(&format!("| {effect} | {} |\n", cell(&c.message)));
        }
        for c in &changes {
            let Some(schema) = &c.schema else {
                continue;
            };
            let which = if c.kind == super::Kind::InputSchemaChanged {
                "input"
            } else {
                "output"
            };
            out.push_str(&format!(
                "\n<details><summary>{} schema of `{}`: {}</summary>\n\n| Pointer | Class | Change |\n|---|---|---|\n",
                which,
                cell(c.tool.as_deref().unwrap_or_default()),
                schema.class.as_str()
            ));
            for sc in &schema.changes {
                let pointer = if sc.pointer.is_empty() {
                    "/"
                } else {
                    &sc.pointer
                };
                out.push_str(&format!(
                    "| `{}` | {} | {} |\n",
                    cell(pointer),
                    sc.class.as_str(),
                    cell(&sc.message)
                ));
            }
            out.push_str("\n</details>\n");
        }
    }
    out
}

/// For bots: the whole report, with a summary.
pub fn json(report: &PolicyDiff) -> String {
    let value: Value = json!({
        "old": report.old,
        "new": report.new,
        "summary": {
            "widening": report.count(Effect::Widening),
            "narrowing": report.count(Effect::Narrowing),
            "neutral": report.count(Effect::Neutral),
            "violations": report.violations.len(),
            "widens": report.widens(),
        },
        "changes": report.changes,
        "violations": report.violations,
    });
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| "{}".to_string());
    text.push('\n');
    text
}
