//! `toolgate policy explain`: runs the authorization steps for one request without
//! executing anything, and prints each step with pass or fail and why.

use clap::Args;
use serde_json::{Value, json};

use crate::commands::{Exit, Format, PolicyLocation, not_loaded};

use crate::pipeline::{Explanation, explain};
use crate::policy::RunStatus;
use crate::review::explain::{offline_request, offline_run};

#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub location: PolicyLocation,
    /// The role making the call.
    #[arg(long)]
    pub role: String,
    /// The lane it acts in.
    #[arg(long)]
    pub lane: String,
    /// The tool it calls.
    #[arg(long)]
    pub tool: String,
    /// The call's scope, a JSON object.
    #[arg(long, default_value = "{}")]
    pub scope: String,
    /// The call's arguments, a JSON object.
    #[arg(long, default_value = "{}")]
    pub arguments: String,
    /// The scope of the run the call belongs to, a JSON object (default: the call's
    /// string scope values). Its keys apply to the call (the effective scope).
    #[arg(long)]
    pub run_scope: Option<String>,
    /// The status of the run the call belongs to.
    #[arg(long, value_enum, default_value = "active")]
    pub run_status: RunStatusArg,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RunStatusArg {
    Active,
    Suspended,
    Closed,
}

impl From<RunStatusArg> for RunStatus {
    fn from(s: RunStatusArg) -> RunStatus {
        match s {
            RunStatusArg::Active => RunStatus::Active,
            RunStatusArg::Suspended => RunStatus::Suspended,
            RunStatusArg::Closed => RunStatus::Closed,
        }
    }
}

pub fn explain_command(args: &ExplainArgs) -> Exit {
    let scope = match serde_json::from_str::<Value>(&args.scope) {
        Ok(Value::Object(m)) => m,
        _ => {
            eprintln!("error: --scope must be a JSON object");
            return Exit::InvalidConfig;
        }
    };
    let arguments = match serde_json::from_str::<Value>(&args.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            eprintln!("error: --arguments must be a JSON object");
            return Exit::InvalidConfig;
        }
    };
    let loaded = match super::load_offline(&args.location.policy_dir, &args.location.tools) {
        Ok(l) => l,
        Err(problems) => return not_loaded(args.format, "policy", "the policy", &problems),
    };
    let mut run = offline_run(&scope, args.run_status.into(), &loaded.policy.versions);
    if let Some(run_scope) = &args.run_scope {
        match serde_json::from_str::<Value>(run_scope) {
            Ok(Value::Object(m)) => run.scope = m,
            _ => {
                eprintln!("error: --run-scope must be a JSON object");
                return Exit::InvalidConfig;
            }
        }
    }
    let request = offline_request(&args.role, &args.lane, &args.tool, scope, arguments);
    let explanation = explain(&loaded, request, Some(run));
    // The tool's effective sandbox profile, when it starts a local process.
    let sandbox = loaded
        .adapter(&args.tool)
        .ok()
        .and_then(crate::adapter::Adapter::sandbox_profile);
    match args.format {
        Format::Text => {
            print!("{}", render_text(&explanation));
            if let Some(sandbox) = &sandbox {
                println!(
                    "sandbox: {}",
                    serde_json::to_string_pretty(sandbox).unwrap_or_default()
                );
            }
        }
        Format::Json => {
            let mut value = render_json(&explanation);
            if let (Some(o), Some(sandbox)) = (value.as_object_mut(), sandbox) {
                o.insert("sandbox".into(), sandbox);
            }
            println!("{value}");
        }
    }
    if explanation.refusal.is_none() {
        Exit::Ok
    } else {
        Exit::Failure
    }
}

fn render_text(e: &Explanation) -> String {
    let mut out = String::new();
    out.push_str(&format!("matched: {}\n", e.trace.matched()));
    for (step, name, outcome) in e.steps() {
        out.push_str(&format!("  {step:>2}. {name:<40} {outcome}\n"));
    }
    if let Some(scope) = &e.trace.effective_scope {
        out.push_str(&format!(
            "effective scope: {} (from the run: {})\n",
            Value::Object(scope.clone()),
            if e.trace.scope_from_run.is_empty() {
                "none".to_string()
            } else {
                e.trace.scope_from_run.join(", ")
            }
        ));
    }
    if !e.trace.flags.is_empty() {
        out.push_str(&format!("flags raised: {}\n", e.trace.flags.join(", ")));
    }
    for c in &e.trace.conditions {
        out.push_str(&format!(
            "condition {} ({}): {}{}\n",
            c.name,
            c.owner,
            c.value,
            c.error
                .as_ref()
                .map(|e| format!(" (error: {e})"))
                .unwrap_or_default()
        ));
    }
    for a in &e.trace.approval {
        out.push_str(&format!(
            "approval ({}): {} of [{}] within {} s{}\n",
            a.owner,
            a.quorum,
            a.approvers.join(", "),
            a.ttl_s,
            a.when
                .as_ref()
                .map(|w| format!(", because `{w}` holds"))
                .unwrap_or_default()
        ));
    }
    for l in &e.trace.limits {
        let window = l
            .per_s
            .map(|s| format!(" in {s} s"))
            .unwrap_or_else(|| " per run".into());
        let key = l
            .key
            .as_ref()
            .map(|k| format!(", {k} = {}", l.key_value))
            .unwrap_or_default();
        out.push_str(&format!(
            "limit {} ({}): at most {}{window}{key} (counted at admission; explain does not count)\n",
            l.kind, l.owner, l.max
        ));
    }
    match &e.refusal {
        None if !e.trace.approval.is_empty() => out.push_str(
            "decision: allow once approved (the gate after step 8 answers approval_required until an approval of this exact call is presented)\n",
        ),
        None => out.push_str("decision: allow (steps 9-13 would record, execute and return)\n"),
        Some(r) => {
            let d = r.diagnostic();
            out.push_str(&format!(
                "decision: deny at step {} ({}, {})\n  why: {}\n  fix: {}\n",
                d.failed_step,
                d.reason.as_str(),
                d.error_code.as_str(),
                d.message,
                d.suggested_fix
            ));
        }
    }
    out
}

fn render_json(e: &Explanation) -> Value {
    json!({
        "decision": if e.refusal.is_none() { "allow" } else { "deny" },
        "trace": e.trace,
        "steps": e.steps().iter().map(|(step, name, outcome)| json!({"step": step, "name": name, "outcome": outcome})).collect::<Vec<_>>(),
        "diagnostic": e.refusal.as_ref().map(|r| r.diagnostic()),
    })
}
