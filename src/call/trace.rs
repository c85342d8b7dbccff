//! The decision trace of a call: what it matched, how far it got, and what step 8
//! found (flags, conditions, approvals, limits). The response carries it as JSON and
//! both of the call's audit events carry it in the line's form, written straight from
//! the fields ([`Trace::portable`]).

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::canonical::{
    Portable, TooDeep, write_portable, write_portable_map, write_portable_u64, write_string,
};

/// The decision trace: what the call matched and how far it got.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Trace {
    /// The matched role, lane and registry entry (`name@version`).
    pub role: Option<String>,
    pub lane: Option<String>,
    pub tool: Option<String>,
    /// Flags the call raised (step 8).
    pub flags: Vec<String>,
    /// The last step that passed (0 when step 1 failed).
    pub passed_step: u8,
    /// The first failing check, `step:reason`, if any.
    pub failed: Option<String>,
    /// The scope the call was decided on: the run's scope merged with the call's (known
    /// once step 7 passed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effective_scope: Option<Map<String, Value>>,
    /// The keys of `effective_scope` that came from the run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scope_from_run: Vec<String>,
    /// Each condition of the lane and the tool with its value (step 8).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ConditionResult>,
    /// The human approvals this call needs (step 8; the gate runs before step 9).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approval: Vec<ApprovalRequirement>,
    /// The budgets and rates the call is counted against (step 8), with their keys'
    /// values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitClaim>,
}

/// One `approval:` (of the lane or the tool) that applies to a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ApprovalRequirement {
    /// `lane:<id>` or `tool:<name>`.
    pub owner: String,
    /// Role or admin ids, sorted.
    pub approvers: Vec<String>,
    pub quorum: u32,
    pub ttl_s: u64,
    /// The `when` condition that selected the call (None for `required: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Why `when` applies although it did not evaluate to true (fail closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_error: Option<String>,
}

/// One counter a call is counted against: a lane's or tool's `budget` (per run) or
/// `rate` (per value of its key). Which counters apply, and their keys' values, is a
/// pure function of the decided call; the counts themselves are state the pipeline
/// claims after step 8 (the gateway's `admit`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitClaim {
    /// `lane:<id>` or `tool:<name>`.
    pub owner: String,
    /// `budget` or `rate`.
    pub kind: &'static str,
    pub max: u64,
    /// The rate's window; None for a budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_s: Option<u64>,
    /// The rate's key as written (`scope.service`); None for a budget or an unkeyed rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The key's value on this call (the run id for a budget); null when absent.
    pub key_value: Value,
    /// The counter's identity: kind, owner and the canonical key value.
    #[serde(skip)]
    pub counter: String,
}

/// A condition's value on one call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConditionResult {
    pub name: String,
    /// `lane:<id>` or `tool:<name>`.
    pub owner: String,
    /// true, false, or null when it could not be evaluated (see `error`).
    pub value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Trace {
    /// The compact form kept in the audit log: `role -> lane -> tool@version`.
    pub fn matched(&self) -> String {
        fn part(p: &Option<String>) -> &str {
            p.as_deref().unwrap_or("?")
        }
        format!(
            "{} -> {} -> {}",
            part(&self.role),
            part(&self.lane),
            part(&self.tool)
        )
    }

    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "matched": self.matched(),
            "flags": self.flags,
            "passed_step": self.passed_step,
            "failed": self.failed,
        });
        if let Some(scope) = &self.effective_scope {
            out["effective_scope"] = Value::Object(scope.clone());
            out["scope_from_run"] = json!(self.scope_from_run);
        }
        if !self.conditions.is_empty() {
            out["conditions"] = json!(self.conditions);
        }
        if !self.approval.is_empty() {
            out["approval"] = json!(self.approval);
        }
        if !self.limits.is_empty() {
            out["limits"] = json!(self.limits);
        }
        out
    }
}

impl Trace {
    /// [`Trace::to_json`] in the audit line's form, as an entry of an event's `details`,
    /// written straight from the fields without building a JSON tree (issue 19: the
    /// trace is in both of a call's events). The keys are written in RFC 8785 order;
    /// a unit test holds the text to [`Portable::of`] of [`Trace::to_json`].
    pub fn portable(&self) -> Result<Portable, TooDeep> {
        // The trace is an entry of `details` (level 1); its fields are level 2.
        let mut out = String::with_capacity(512);
        let mut trace = Fields::open(&mut out);
        if !self.approval.is_empty() {
            let out = trace.key("approval");
            list(out, &self.approval, |out, a| {
                let mut item = Fields::open(out);
                strings(item.key("approvers"), &a.approvers);
                write_string(&a.owner, item.key("owner"));
                write_portable_u64(u64::from(a.quorum), item.key("quorum"));
                write_portable_u64(a.ttl_s, item.key("ttl_s"));
                if let Some(when) = &a.when {
                    write_string(when, item.key("when"));
                }
                if let Some(error) = &a.when_error {
                    write_string(error, item.key("when_error"));
                }
                item.close();
                Ok(())
            })?;
        }
        if !self.conditions.is_empty() {
            let out = trace.key("conditions");
            list(out, &self.conditions, |out, c| {
                let mut item = Fields::open(out);
                if let Some(error) = &c.error {
                    write_string(error, item.key("error"));
                }
                write_string(&c.name, item.key("name"));
                write_string(&c.owner, item.key("owner"));
                write_portable(&c.value, 4, item.key("value"))?;
                item.close();
                Ok(())
            })?;
        }
        if let Some(scope) = &self.effective_scope {
            write_portable_map(scope, 2, trace.key("effective_scope"))?;
        }
        match &self.failed {
            Some(failed) => write_string(failed, trace.key("failed")),
            None => trace.key("failed").push_str("null"),
        }
        strings(trace.key("flags"), &self.flags);
        if !self.limits.is_empty() {
            let out = trace.key("limits");
            list(out, &self.limits, |out, l| {
                let mut item = Fields::open(out);
                if let Some(key) = &l.key {
                    write_string(key, item.key("key"));
                }
                write_portable(&l.key_value, 4, item.key("key_value"))?;
                write_string(l.kind, item.key("kind"));
                write_portable_u64(l.max, item.key("max"));
                write_string(&l.owner, item.key("owner"));
                if let Some(per_s) = l.per_s {
                    write_portable_u64(per_s, item.key("per_s"));
                }
                item.close();
                Ok(())
            })?;
        }
        write_string(&self.matched(), trace.key("matched"));
        write_portable_u64(u64::from(self.passed_step), trace.key("passed_step"));
        if self.effective_scope.is_some() {
            strings(trace.key("scope_from_run"), &self.scope_from_run);
        }
        trace.close();
        Ok(Portable::from_written(out))
    }
}

/// Writes a JSON object's fields in the order they are given (the caller gives them in
/// RFC 8785 key order).
struct Fields<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Fields<'a> {
    fn open(out: &'a mut String) -> Fields<'a> {
        out.push('{');
        Fields { out, first: true }
    }

    /// Writes `"key":` and returns where the value goes.
    fn key(&mut self, key: &str) -> &mut String {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        write_string(key, self.out);
        self.out.push(':');
        self.out
    }

    fn close(self) {
        self.out.push('}');
    }
}

/// Writes a JSON array, each item with `item`.
fn list<T>(
    out: &mut String,
    items: &[T],
    item: impl Fn(&mut String, &T) -> Result<(), TooDeep>,
) -> Result<(), TooDeep> {
    out.push('[');
    for (i, value) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        item(out, value)?;
    }
    out.push(']');
    Ok(())
}

/// Writes a JSON array of strings.
fn strings(out: &mut String, items: &[String]) {
    out.push('[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(s, out);
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn full_trace() -> Trace {
        let scope = json!({
            "case_id": "C-1 \"q\"\n",
            "z\u{10000}": [1.5, 9007199254740993u64, {"\u{e000}": null}],
            "a": {"deep": [true, false, -3]},
        });
        Trace {
            role: Some("paralegal".into()),
            lane: None,
            tool: Some("case_lookup@1.0.0".into()),
            flags: vec!["external\u{1}".into(), "pii".into()],
            passed_step: 8,
            failed: Some("10:timeout".into()),
            effective_scope: scope.as_object().cloned(),
            scope_from_run: vec!["case_id".into()],
            conditions: vec![
                ConditionResult {
                    name: "business_hours".into(),
                    owner: "lane:research".into(),
                    value: json!(true),
                    error: None,
                },
                ConditionResult {
                    name: "small\u{e9}".into(),
                    owner: "tool:case_lookup".into(),
                    value: Value::Null,
                    error: Some("no such key `x`".into()),
                },
            ],
            approval: vec![
                ApprovalRequirement {
                    owner: "tool:file_with_court".into(),
                    approvers: vec!["partner".into(), "supervisor".into()],
                    quorum: 2,
                    ttl_s: 3600,
                    when: Some("args.amount > 100".into()),
                    when_error: Some("type error".into()),
                },
                ApprovalRequirement {
                    owner: "lane:filing".into(),
                    approvers: vec![],
                    quorum: 1,
                    ttl_s: u64::MAX,
                    when: None,
                    when_error: None,
                },
            ],
            limits: vec![
                LimitClaim {
                    owner: "lane:research".into(),
                    kind: "budget",
                    max: 9_007_199_254_740_993,
                    per_s: None,
                    key: None,
                    key_value: json!("run-1"),
                    counter: "budget|lane:research|run-1".into(),
                },
                LimitClaim {
                    owner: "tool:case_lookup".into(),
                    kind: "rate",
                    max: 10,
                    per_s: Some(60),
                    key: Some("scope.case_id".into()),
                    key_value: json!({"n": 0.1, "m": [1e21]}),
                    counter: "rate|tool:case_lookup|x".into(),
                },
            ],
        }
    }

    #[test]
    fn the_trace_is_written_as_its_json_would_be() {
        let full = full_trace();
        let mut no_scope = full.clone();
        no_scope.effective_scope = None;
        let empty_scope = Trace {
            effective_scope: Some(Map::new()),
            ..Trace::default()
        };
        for trace in [Trace::default(), full, no_scope, empty_scope] {
            let expected = Portable::of(&trace.to_json(), 1).unwrap();
            assert_eq!(trace.portable().unwrap(), expected, "{trace:?}");
        }
    }

    #[test]
    fn a_trace_nested_too_deep_is_refused_as_its_json_would_be() {
        // The scope sits at level 2 of the trace (level 1 of `details`): the written
        // trace must refuse exactly the nesting the JSON path refuses.
        let nested = |levels: usize| {
            let mut v = json!(1);
            for _ in 0..levels {
                v = json!([v]);
            }
            Trace {
                effective_scope: json!({ "k": v }).as_object().cloned(),
                ..Trace::default()
            }
        };
        for levels in [55, 60, 61, 62, 63, 70] {
            let trace = nested(levels);
            let by_json = Portable::of(&trace.to_json(), 1);
            assert_eq!(trace.portable(), by_json, "{levels} levels");
        }
        assert!(nested(61).portable().is_ok());
        assert!(nested(62).portable().is_err());
    }
}
