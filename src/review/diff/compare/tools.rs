//! Tools: every compared field, budgets and rates, two-phase settings and flag rules.

use super::*;

pub(super) fn tools(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    for (id, o, n) in pair(&old.tools, &new.tools) {
        match (o, n) {
            (None, Some(t)) => out.push(
                Change::new(
                    Kind::ToolAdded,
                    if t.enabled {
                        Effect::Widening
                    } else {
                        Effect::Neutral
                    },
                    format!(
                        "tool `{id}` {} added ({}, lanes: {})",
                        t.version,
                        if t.enabled { "enabled" } else { "disabled" },
                        t.allowed_lanes.join(", ")
                    ),
                )
                .tool(id),
            ),
            (Some(_), None) => out.push(
                Change::new(
                    Kind::ToolRemoved,
                    Effect::Narrowing,
                    format!("tool `{id}` removed"),
                )
                .tool(id),
            ),
            (Some(o), Some(n)) => tool_fields(id, o, n, out),
            (None, None) => {}
        }
    }
}

/// The changes of one tool present on both sides: every field of `fields::TOOL_FIELDS`, then
/// its flag rules and conditions.
pub(super) fn tool_fields(id: &str, o: &Tool, n: &Tool, out: &mut Vec<Change>) {
    for field in &TOOL_FIELDS {
        field.compare(id, o, n, out);
    }
    flag_rules(id, &o.flag_rules, &n.flag_rules, out);
    conditions(Owner::Tool(id), &o.conditions, &n.conditions, out);
    approval(
        Owner::Tool(id),
        o.approval.as_ref(),
        n.approval.as_ref(),
        out,
    );
    call_limits(Owner::Tool(id), &o.call_limits, &n.call_limits, out);
    phases(id, o.phases.as_ref(), n.phases.as_ref(), out);
    sandboxes(id, o, n, out);
    credentials(id, o, n, out);
}

/// The outbound credentials a tool's adapter sends: a secret it starts to send widens
/// (the tool can now act with it), one it stops sending narrows; a changed `auth`
/// widens (it changes who the upstream takes the caller for). Compared by id and
/// kind, never by value.
fn credentials(id: &str, o: &Tool, n: &Tool, out: &mut Vec<Change>) {
    let (old, new) = (o.adapter.secret_ids(), n.adapter.secret_ids());
    let (added, removed) = set_diff(&old, &new);
    for secret in added {
        out.push(
            Change::new(
                Kind::ToolSecretAdded,
                Effect::Widening,
                format!("tool `{id}` now sends secret `{secret}`"),
            )
            .tool(id),
        );
    }
    for secret in removed {
        out.push(
            Change::new(
                Kind::ToolSecretRemoved,
                Effect::Narrowing,
                format!("tool `{id}` no longer sends secret `{secret}`"),
            )
            .tool(id),
        );
    }
    let auth = |t: &Tool| t.adapter.outbound().and_then(|o| o.auth.clone());
    let (a, b) = (auth(o), auth(n));
    if a != b {
        let kind =
            |x: &Option<crate::policy::OutboundAuth>| x.as_ref().map_or("none", |a| a.kind());
        out.push(
            Change::new(
                Kind::ToolAuthChanged,
                Effect::Widening,
                format!(
                    "tool `{id}`: outbound auth {} -> {} (treated as widening: it changes who the upstream takes the call for)",
                    kind(&a),
                    kind(&b)
                ),
            )
            .tool(id)
            .values(json!(a), json!(b)),
        );
    }
}

/// The sandbox of a tool's process (and of its phases): every loosening (a path added,
/// a wider network, a higher limit, `unconfined`) widens, every tightening narrows.
fn sandboxes(id: &str, o: &Tool, n: &Tool, out: &mut Vec<Change>) {
    use crate::policy::{AdapterConfig, Sandbox};
    let of_adapter = |t: &Tool| match &t.adapter {
        AdapterConfig::Command { sandbox, .. } => Some(sandbox.clone()),
        AdapterConfig::Mcp { sandbox, .. } => sandbox.clone(),
        _ => None,
    };
    let of_phases = |t: &Tool| t.phases.as_ref().and_then(|p| p.sandbox.clone());
    for (what, old, new) in [
        ("sandbox", of_adapter(o), of_adapter(n)),
        ("phases.sandbox", of_phases(o), of_phases(n)),
    ] {
        let mut push = |effect: Effect, text: String, before: Value, after: Value| {
            out.push(
                Change::new(
                    Kind::ToolSandboxChanged,
                    effect,
                    format!("tool `{id}`: {what}: {text}"),
                )
                .tool(id)
                .values(before, after),
            );
        };
        match (old, new) {
            (Some(a), Some(b)) if a == b => {}
            (Some(Sandbox::Confined(_)), Some(Sandbox::Unconfined { reason })) => push(
                Effect::Widening,
                format!("now runs unconfined (\"{reason}\")"),
                json!("confined"),
                json!({ "unconfined": reason }),
            ),
            (Some(Sandbox::Unconfined { .. }), Some(Sandbox::Confined(_))) => push(
                Effect::Narrowing,
                "now runs confined".to_string(),
                json!("unconfined"),
                json!("confined"),
            ),
            (Some(Sandbox::Unconfined { reason: a }), Some(Sandbox::Unconfined { reason: b })) => {
                push(
                    Effect::Neutral,
                    format!("the reason it runs unconfined is now \"{b}\""),
                    json!(a),
                    json!(b),
                )
            }
            (Some(Sandbox::Confined(a)), Some(Sandbox::Confined(b))) => {
                for (list, pa, pb) in [
                    ("read", &a.read, &b.read),
                    ("write", &a.write, &b.write),
                    ("exec", &a.exec, &b.exec),
                ] {
                    let pa: BTreeSet<_> = pa.iter().map(|p| p.path.display().to_string()).collect();
                    let pb: BTreeSet<_> = pb.iter().map(|p| p.path.display().to_string()).collect();
                    for added in pb.difference(&pa) {
                        push(
                            Effect::Widening,
                            format!("may now {list} `{added}`"),
                            Value::Null,
                            json!(added),
                        );
                    }
                    for removed in pa.difference(&pb) {
                        push(
                            Effect::Narrowing,
                            format!("may no longer {list} `{removed}`"),
                            json!(removed),
                            Value::Null,
                        );
                    }
                }
                if a.network != b.network {
                    let effect = network_effect(&a.network, &b.network);
                    push(
                        effect,
                        format!(
                            "network is now {}",
                            crate::sandbox::plan::network_json(&b.network)
                        ),
                        crate::sandbox::plan::network_json(&a.network),
                        crate::sandbox::plan::network_json(&b.network),
                    );
                }
                for ((name, va), (_, vb)) in a.limits.fields().into_iter().zip(b.limits.fields()) {
                    if va != vb {
                        push(
                            if vb > va {
                                Effect::Widening
                            } else {
                                Effect::Narrowing
                            },
                            format!("limit `{name}` is now {vb} (was {va})"),
                            json!(va),
                            json!(vb),
                        );
                    }
                }
            }
            // A sandbox that appears or goes with the adapter's kind: the adapter's
            // change says it.
            _ => {}
        }
    }
}

/// Whether network `b` allows at most what `a` allows (narrowing) or not (widening).
fn network_effect(a: &crate::policy::SandboxNetwork, b: &crate::policy::SandboxNetwork) -> Effect {
    use crate::policy::SandboxNetwork as N;
    let narrower = match (a, b) {
        (_, N::None) => true,
        (N::Ports(pa), N::Ports(pb)) => pb.iter().all(|p| pa.contains(p)),
        (N::Connect(ca), N::Connect(cb)) => cb.iter().all(|c| ca.contains(c)),
        _ => false,
    };
    if narrower {
        Effect::Narrowing
    } else {
        Effect::Widening
    }
}

/// A budget or rate added narrows; removed or raised (more calls, or a shorter
/// window) widens; lowered narrows; a rate whose key changed widens (whether the new
/// key counts more strictly cannot be proven).
pub(super) fn call_limits(
    owner: Owner<'_>,
    old: &crate::policy::CallLimits,
    new: &crate::policy::CallLimits,
    out: &mut Vec<Change>,
) {
    let (label, budget_kind, rate_kind) = match owner {
        Owner::Lane(id) => (
            format!("lane `{id}`"),
            Kind::LaneBudgetChanged,
            Kind::LaneRateChanged,
        ),
        Owner::Tool(id) => (
            format!("tool `{id}`"),
            Kind::ToolBudgetChanged,
            Kind::ToolRateChanged,
        ),
    };
    let attach = |change: Change| match owner {
        Owner::Lane(id) => change.lane(id),
        Owner::Tool(id) => change.tool(id),
    };
    let budget = |b: &crate::policy::Budget| b.max_calls_per_run;
    let effect = match (
        old.budget.as_ref().map(budget),
        new.budget.as_ref().map(budget),
    ) {
        (None, None) => None,
        (Some(_), None) => Some((Effect::Widening, "removed".to_string())),
        (None, Some(n)) => Some((Effect::Narrowing, format!("added: {n} calls per run"))),
        (Some(o), Some(n)) if n > o => Some((
            Effect::Widening,
            format!("raised from {o} to {n} calls per run"),
        )),
        (Some(o), Some(n)) if n < o => Some((
            Effect::Narrowing,
            format!("lowered from {o} to {n} calls per run"),
        )),
        (Some(_), Some(_)) => None,
    };
    if let Some((effect, text)) = effect {
        out.push(attach(
            Change::new(budget_kind, effect, format!("{label}: budget {text}"))
                .values(json!(old.budget), json!(new.budget)),
        ));
    }
    let describe = |r: &crate::policy::RateLimit| {
        let key = r
            .key
            .as_ref()
            .map(|k| format!(" per `{k}`"))
            .unwrap_or_default();
        format!("{} calls in {} s{key}", r.max, r.per_s)
    };
    let effect = match (&old.rate, &new.rate) {
        (None, None) => None,
        (Some(o), None) => Some((Effect::Widening, format!("removed ({})", describe(o)))),
        (None, Some(n)) => Some((Effect::Narrowing, format!("added: {}", describe(n)))),
        (Some(o), Some(n)) if o == n => None,
        (Some(o), Some(n)) => {
            let effect = if o.key != n.key || n.max > o.max || n.per_s < o.per_s {
                Effect::Widening
            } else {
                Effect::Narrowing
            };
            Some((
                effect,
                format!("changed from {} to {}", describe(o), describe(n)),
            ))
        }
    };
    if let Some((effect, text)) = effect {
        out.push(attach(
            Change::new(rate_kind, effect, format!("{label}: rate {text}"))
                .values(json!(old.rate), json!(new.rate)),
        ));
    }
}

/// Two-phase settings: added narrows (effects wait for a commit); removed or changed
/// widens (effects become final at once, or may wait longer for a commit).
pub(super) fn phases(
    id: &str,
    old: Option<&crate::policy::Phases>,
    new: Option<&crate::policy::Phases>,
    out: &mut Vec<Change>,
) {
    let (effect, text) = match (old, new) {
        (None, None) => return,
        (Some(o), Some(n)) if o == n => return,
        (None, Some(_)) => (
            Effect::Narrowing,
            "now two-phase: its effect waits for a commit",
        ),
        (Some(_), None) => (
            Effect::Widening,
            "is no longer two-phase: its effect is final at once",
        ),
        (Some(_), Some(_)) => (Effect::Widening, "two-phase settings changed"),
    };
    out.push(
        Change::new(
            Kind::ToolPhasesChanged,
            effect,
            format!("tool `{id}` {text}"),
        )
        .tool(id)
        .values(json!(old), json!(new)),
    );
}

pub(super) fn rule_text(rule: &FlagRule) -> String {
    let matcher = match &rule.matcher {
        FlagMatcher::Equals(s) => format!("equals `{s}`"),
        FlagMatcher::Prefix(s) => format!("prefix `{s}`"),
        FlagMatcher::IsTrue => "is_true".to_string(),
    };
    format!("`{}` at `{}` ({matcher})", rule.flag, rule.pointer)
}

/// Whether `new` raises its flag at least wherever `old` does (same flag and pointer).
pub(super) fn raises_at_least(old: &FlagRule, new: &FlagRule) -> bool {
    match (&old.matcher, &new.matcher) {
        (FlagMatcher::Prefix(o), FlagMatcher::Prefix(n)) => o.starts_with(n.as_str()),
        (FlagMatcher::Equals(o), FlagMatcher::Prefix(n)) => o.starts_with(n.as_str()),
        (a, b) => a == b,
    }
}

pub(super) fn flag_rules(id: &str, old: &[FlagRule], new: &[FlagRule], out: &mut Vec<Change>) {
    let key = |r: &FlagRule| (r.flag.clone(), r.pointer.clone(), rule_text(r));
    let o: BTreeMap<_, &FlagRule> = old.iter().map(|r| (key(r), r)).collect();
    let n: BTreeMap<_, &FlagRule> = new.iter().map(|r| (key(r), r)).collect();
    let removed: Vec<&FlagRule> = o
        .iter()
        .filter(|(k, _)| !n.contains_key(*k))
        .map(|(_, r)| *r)
        .collect();
    let added: Vec<&FlagRule> = n
        .iter()
        .filter(|(k, _)| !o.contains_key(*k))
        .map(|(_, r)| *r)
        .collect();
    let mut paired_new = BTreeSet::new();
    for r in &removed {
        // A rule with the same flag and pointer that now matches differently.
        let partner = added
            .iter()
            .enumerate()
            .find(|(i, a)| !paired_new.contains(i) && a.flag == r.flag && a.pointer == r.pointer);
        match partner {
            Some((i, a)) => {
                paired_new.insert(i);
                let effect = if raises_at_least(r, a) {
                    Effect::Narrowing
                } else {
                    Effect::Widening
                };
                out.push(
                    Change::new(
                        Kind::FlagRuleChanged,
                        effect,
                        format!(
                            "tool `{id}`: flag rule {} now matches as {}",
                            rule_text(r),
                            rule_text(a)
                        ),
                    )
                    .tool(id)
                    .values(json!(r), json!(a)),
                );
            }
            None => out.push(
                Change::new(
                    Kind::FlagRuleRemoved,
                    Effect::Widening,
                    format!("tool `{id}`: flag rule {} removed", rule_text(r)),
                )
                .tool(id)
                .values(json!(r), Value::Null),
            ),
        }
    }
    for (i, a) in added.iter().enumerate() {
        if paired_new.contains(&i) {
            continue;
        }
        out.push(
            Change::new(
                Kind::FlagRuleAdded,
                Effect::Narrowing,
                format!("tool `{id}`: flag rule {} added", rule_text(a)),
            )
            .tool(id)
            .values(Value::Null, json!(a)),
        );
    }
}
