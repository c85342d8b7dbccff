//! Flags: which flags a call raises, and which lane or tool prohibitions they hit.
//!
//! A call's flags are (a) every scope key whose value is boolean `true` (scope
//! `{"case_id": "C-1001", "sealed": true}` raises `sealed`) and (b) the flags raised by
//! the tool's flag rules over the normalized arguments (`read_document` raises
//! `privileged` when `/path` starts with `privileged/`). A call is denied at pipeline
//! step 8 when any raised flag is prohibited by its lane or by its tool.
//!
//! Pure functions over the model: no I/O, no clock.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Map, Value};

use super::model::{FlagMatcher, FlagRule, Lane, Tool};

impl FlagRule {
    /// Whether this rule raises its flag for `arguments` (the normalized arguments).
    /// A pointer that does not resolve, or a value of another type, raises nothing.
    pub fn raises(&self, arguments: &Value) -> bool {
        let Some(value) = arguments.pointer(&self.pointer) else {
            return false;
        };
        match &self.matcher {
            FlagMatcher::Equals(expected) => value.as_str() == Some(expected.as_str()),
            FlagMatcher::Prefix(prefix) => value
                .as_str()
                .is_some_and(|s| s.starts_with(prefix.as_str())),
            FlagMatcher::IsTrue => value == &Value::Bool(true),
        }
    }
}

/// Every flag a call raises: the scope's `true` keys plus the tool's flag rules over
/// the normalized arguments. Sorted.
pub fn raised_flags(
    scope: &Map<String, Value>,
    tool: &Tool,
    normalized_arguments: &Value,
) -> BTreeSet<String> {
    let from_scope = scope
        .iter()
        .filter(|(_, value)| **value == Value::Bool(true))
        .map(|(key, _)| key.clone());
    let from_rules = tool
        .flag_rules
        .iter()
        .filter(|rule| rule.raises(normalized_arguments))
        .map(|rule| rule.flag.clone());
    from_scope.chain(from_rules).collect()
}

/// Who prohibits a raised flag.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "by", content = "id", rename_all = "snake_case")]
pub enum ProhibitedBy {
    Lane(String),
    Tool(String),
}

/// A raised flag that a prohibition matches: why a call is denied at step 8.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Prohibition {
    pub flag: String,
    #[serde(flatten)]
    pub by: ProhibitedBy,
}

/// The prohibitions `raised` hits in `lane` and `tool`, sorted (lane before tool for
/// the same flag). Empty means step 8 passes.
pub fn prohibitions(lane: &Lane, tool: &Tool, raised: &BTreeSet<String>) -> Vec<Prohibition> {
    let mut hits = Vec::new();
    for flag in raised {
        if lane.prohibited_flags.contains(flag) {
            hits.push(Prohibition {
                flag: flag.clone(),
                by: ProhibitedBy::Lane(lane.lane_id.clone()),
            });
        }
        if tool.prohibited_flags.contains(flag) {
            hits.push(Prohibition {
                flag: flag.clone(),
                by: ProhibitedBy::Tool(tool.tool_name.clone()),
            });
        }
    }
    hits
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;
    use crate::policy::{Policy, load};

    fn demo() -> Policy {
        load(Path::new("policy"), Path::new("tools/tool_registry.yaml")).unwrap()
    }

    fn scope(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    fn denied(
        policy: &Policy,
        lane: &str,
        tool: &str,
        scope_value: Value,
        arguments: Value,
    ) -> Vec<Prohibition> {
        let lane = &policy.lanes[lane];
        let tool = &policy.tools[tool];
        prohibitions(
            lane,
            tool,
            &raised_flags(&scope(scope_value), tool, &arguments),
        )
    }

    #[test]
    fn matchers_look_at_the_pointer_only() {
        let rule = |matcher| FlagRule {
            flag: "f".into(),
            pointer: "/a/b".into(),
            matcher,
        };
        assert!(rule(FlagMatcher::Prefix("x/".into())).raises(&json!({"a": {"b": "x/y"}})));
        assert!(!rule(FlagMatcher::Prefix("x/".into())).raises(&json!({"a": {"b": "y/x/"}})));
        assert!(!rule(FlagMatcher::Prefix("x/".into())).raises(&json!({"a": {"c": "x/y"}})));
        assert!(rule(FlagMatcher::Equals("v".into())).raises(&json!({"a": {"b": "v"}})));
        assert!(!rule(FlagMatcher::Equals("v".into())).raises(&json!({"a": {"b": "vv"}})));
        assert!(rule(FlagMatcher::IsTrue).raises(&json!({"a": {"b": true}})));
        assert!(!rule(FlagMatcher::IsTrue).raises(&json!({"a": {"b": "true"}})));
        assert!(!rule(FlagMatcher::IsTrue).raises(&json!({"a": {"b": 1}})));
    }

    #[test]
    fn only_boolean_true_scope_values_raise_flags() {
        let policy = demo();
        let tool = &policy.tools["case_lookup"];
        let raised = raised_flags(
            &scope(
                json!({"case_id": "C-1001", "sealed": true, "urgent": false, "privileged": "true"}),
            ),
            tool,
            &json!({}),
        );
        assert_eq!(
            raised.into_iter().collect::<Vec<_>>(),
            vec!["sealed".to_string()]
        );
    }

    #[test]
    fn research_reads_documents_but_never_privileged_ones() {
        let policy = demo();
        let case = json!({"case_id": "C-1001"});
        assert!(
            denied(
                &policy,
                "research",
                "read_document",
                case.clone(),
                json!({"path": "notes.md"})
            )
            .is_empty()
        );
        assert_eq!(
            denied(
                &policy,
                "research",
                "read_document",
                case.clone(),
                json!({"path": "privileged/strategy.md"})
            ),
            vec![Prohibition {
                flag: "privileged".into(),
                by: ProhibitedBy::Lane("research".into())
            }]
        );
        // The drafting lane does not prohibit `privileged`: drafting may read strategy.
        assert!(
            denied(
                &policy,
                "drafting",
                "read_document",
                case,
                json!({"path": "privileged/strategy.md"})
            )
            .is_empty()
        );
    }

    #[test]
    fn no_tool_runs_while_the_scope_says_sealed() {
        let policy = demo();
        let sealed =
            json!({"case_id": "C-1001", "matter_id": "M-1", "client_id": "CL-1", "sealed": true});
        for lane in policy.lanes.values() {
            for tool in &lane.tools {
                let hits = denied(&policy, &lane.lane_id, tool, sealed.clone(), json!({}));
                assert!(
                    hits.iter().any(|p| p.flag == "sealed"),
                    "{tool} in lane {} runs while sealed",
                    lane.lane_id
                );
            }
        }
    }
}
