//! The comparison over the demo policy and hand-made edits of it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use super::*;

fn demo() -> Policy {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate::policy::load_with_env(
        &root.join("policy"),
        &root.join("tools/tool_registry.yaml"),
        &|_| Some("t".into()),
    )
    .unwrap()
}

fn kinds(changes: &[Change]) -> Vec<(Kind, Effect)> {
    changes.iter().map(|c| (c.kind, c.effect)).collect()
}

#[test]
fn the_same_policy_has_no_changes() {
    let p = demo();
    assert!(changes(&p, &p).is_empty());
    assert!(version_violations(&p, &p).is_empty());
}

#[test]
fn a_tool_added_to_a_lane_widens_every_role_in_that_lane() {
    let old = demo();
    let mut new = old.clone();
    new.lanes
        .get_mut("research")
        .unwrap()
        .tools
        .push("conflict_check".into());
    new.tools
        .get_mut("conflict_check")
        .unwrap()
        .allowed_lanes
        .push("research".into());
    let c = changes(&old, &new);
    assert_eq!(
        kinds(&c),
        vec![
            (Kind::TripleAllowed, Effect::Widening),
            (Kind::TripleAllowed, Effect::Widening)
        ]
    );
    assert_eq!(c[0].role.as_deref(), Some("research_agent"));
    assert_eq!(c[1].role.as_deref(), Some("supervisor"));
    assert_eq!(
        c[0].message,
        "`research_agent` may now call `conflict_check` in lane `research`"
    );
    // Only one side of the allowlist is not enough.
    let mut half = old.clone();
    half.lanes
        .get_mut("research")
        .unwrap()
        .tools
        .push("conflict_check".into());
    assert!(changes(&old, &half).is_empty());
}

#[test]
fn disabling_a_role_or_tool_denies_its_triples() {
    let old = demo();
    let mut new = old.clone();
    new.roles.get_mut("filing_agent").unwrap().enabled = false;
    let c = changes(&old, &new);
    assert_eq!(
        kinds(&c),
        vec![
            (Kind::TripleDenied, Effect::Narrowing),
            (Kind::TripleDenied, Effect::Narrowing),
            (Kind::RoleDisabled, Effect::Narrowing),
        ]
    );
    let mut new = old.clone();
    new.tools.get_mut("disabled_tool").unwrap().enabled = true;
    let c = changes(&old, &new);
    assert!(
        c.iter()
            .any(|c| c.kind == Kind::ToolEnabled && c.effect == Effect::Widening)
    );
    assert_eq!(
        c.iter().filter(|c| c.kind == Kind::TripleAllowed).count(),
        2
    );
}

#[test]
fn guards_dropped_widen_and_guards_added_narrow() {
    let old = demo();
    let mut new = old.clone();
    let lane = new.lanes.get_mut("filing").unwrap();
    lane.required_scope_keys.retain(|k| k != "matter_id");
    lane.prohibited_flags.push("privileged".into());
    lane.prohibited_flags.sort();
    lane.run_statuses.push(crate::policy::RunStatus::Suspended);
    let tool = new.tools.get_mut("legal_search").unwrap();
    tool.prohibited_flags.clear();
    tool.limits.max_output_bytes *= 2;
    tool.limits.timeout_ms_max /= 2;
    let c = changes(&old, &new);
    let got: Vec<(Kind, Effect, &str)> = c
        .iter()
        .map(|c| (c.kind, c.effect, c.message.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                Kind::LaneScopeKeyRemoved,
                Effect::Widening,
                "lane `filing` no longer requires scope key `matter_id`"
            ),
            (
                Kind::LaneProhibitionAdded,
                Effect::Narrowing,
                "lane `filing` now prohibits flag `privileged`"
            ),
            (
                Kind::LaneRunStatusAdded,
                Effect::Widening,
                "lane `filing` may now act in `suspended` runs"
            ),
            (
                Kind::ToolProhibitionRemoved,
                Effect::Widening,
                "tool `legal_search` no longer prohibits flag `sealed`"
            ),
            (
                Kind::ToolTimeoutChanged,
                Effect::Narrowing,
                "tool `legal_search`: `limits.timeout_ms_max` lowered from 30000 to 15000"
            ),
            (
                Kind::ToolLimitChanged,
                Effect::Widening,
                "tool `legal_search`: `limits.max_output_bytes` raised from 65536 to 131072"
            ),
        ]
    );
}

#[test]
fn removing_or_weakening_an_approval_widens() {
    let old = demo();
    fn court(p: &mut Policy) -> &mut Approval {
        let tool = p.tools.get_mut("file_with_court").unwrap();
        tool.approval.as_mut().unwrap()
    }
    let mut removed = old.clone();
    removed.tools.get_mut("file_with_court").unwrap().approval = None;
    assert_eq!(
        kinds(&changes(&old, &removed)),
        vec![(Kind::ToolApprovalRemoved, Effect::Widening)]
    );
    assert_eq!(
        kinds(&changes(&removed, &old)),
        vec![(Kind::ToolApprovalAdded, Effect::Narrowing)]
    );
    let mut more_approvers = old.clone();
    court(&mut more_approvers)
        .approvers
        .push("filing_agent".into());
    assert_eq!(
        kinds(&changes(&old, &more_approvers)),
        vec![(Kind::ToolApprovalChanged, Effect::Widening)]
    );
    let mut longer = old.clone();
    court(&mut longer).ttl_s += 60;
    assert_eq!(
        kinds(&changes(&old, &longer)),
        vec![(Kind::ToolApprovalChanged, Effect::Widening)]
    );
    let mut shorter = old.clone();
    court(&mut shorter).ttl_s = 60;
    assert_eq!(
        kinds(&changes(&old, &shorter)),
        vec![(Kind::ToolApprovalChanged, Effect::Narrowing)]
    );
    // Mixed: a raised quorum and an added approver is still widening.
    let mut mixed = old.clone();
    court(&mut mixed).quorum = 2;
    court(&mut mixed).approvers.push("filing_agent".into());
    assert_eq!(
        kinds(&changes(&old, &mixed)),
        vec![(Kind::ToolApprovalChanged, Effect::Widening)]
    );
    let mut on_the_lane = old.clone();
    on_the_lane.lanes.get_mut("filing").unwrap().approval =
        old.tools["file_with_court"].approval.clone();
    assert_eq!(
        kinds(&changes(&old, &on_the_lane)),
        vec![(Kind::LaneApprovalAdded, Effect::Narrowing)]
    );
}

#[test]
fn a_credential_change_never_shows_the_hash() {
    let old = demo();
    let mut new = old.clone();
    let role = new.roles.get_mut("intake_agent").unwrap();
    role.credential = Credential::TokenSha256("ab".repeat(32));
    let c = changes(&old, &new);
    assert_eq!(
        kinds(&c),
        vec![(Kind::RoleCredentialChanged, Effect::Neutral)]
    );
    let text = serde_json::to_string(&c).unwrap();
    assert!(!text.contains(&"ab".repeat(32)), "{text}");
    let Credential::TokenSha256(old_hash) = &old.roles["intake_agent"].credential else {
        panic!("demo credential kind")
    };
    assert!(!text.contains(old_hash.as_str()), "{text}");
}

#[test]
fn flag_rule_changes_are_classified_by_what_they_raise() {
    let old = demo();
    let set_prefix = |prefix: &str| {
        let mut new = old.clone();
        let rule = &mut new.tools.get_mut("read_document").unwrap().flag_rules[0];
        rule.matcher = FlagMatcher::Prefix(prefix.into());
        changes(&old, &new)
    };
    // Raises on fewer paths: more calls pass.
    assert_eq!(
        kinds(&set_prefix("privileged/secret/")),
        vec![(Kind::FlagRuleChanged, Effect::Widening)]
    );
    // Raises on more paths: fewer calls pass.
    assert_eq!(
        kinds(&set_prefix("priv")),
        vec![(Kind::FlagRuleChanged, Effect::Narrowing)]
    );
    let mut new = old.clone();
    new.tools
        .get_mut("read_document")
        .unwrap()
        .flag_rules
        .clear();
    assert_eq!(
        kinds(&changes(&old, &new)),
        vec![(Kind::FlagRuleRemoved, Effect::Widening)]
    );
    assert_eq!(
        kinds(&changes(&new, &old)),
        vec![(Kind::FlagRuleAdded, Effect::Narrowing)]
    );
}

fn with_schema(p: &Policy, tool: &str, version: &str, edit: impl Fn(&mut Value)) -> Policy {
    let mut new = p.clone();
    let t = new.tools.get_mut(tool).unwrap();
    let mut schema = (*t.input_schema).clone();
    edit(&mut schema);
    t.input_schema = Arc::new(schema);
    t.version = semver::Version::parse(version).unwrap();
    new
}

#[test]
fn version_rules() {
    let old = demo();
    let tighten = |s: &mut Value| s["properties"]["limit"]["maximum"] = json!(10);
    let loosen = |s: &mut Value| s["properties"]["limit"]["maximum"] = json!(100);
    let cases = [
        (
            with_schema(&old, "legal_search", "1.0.0", tighten),
            Some(Class::Breaking),
        ),
        (
            with_schema(&old, "legal_search", "1.9.0", tighten),
            Some(Class::Breaking),
        ),
        (with_schema(&old, "legal_search", "2.0.0", tighten), None),
        (
            with_schema(&old, "legal_search", "1.0.1", loosen),
            Some(Class::Compatible),
        ),
        (with_schema(&old, "legal_search", "1.1.0", loosen), None),
        (with_schema(&old, "legal_search", "2.0.0", loosen), None),
        (
            with_schema(&old, "legal_search", "1.0.0", |s| {
                s["description"] = json!("x")
            }),
            None,
        ),
    ];
    for (i, (new, expected)) in cases.iter().enumerate() {
        let v = version_violations(&old, new);
        assert_eq!(
            v.first().and_then(|v| v.class),
            *expected,
            "case {i}: {v:?}"
        );
        assert!(v.len() <= 1);
    }
    let back = with_schema(&old, "legal_search", "0.9.0", |_| {});
    let v = version_violations(&old, &back);
    assert_eq!(v.len(), 1);
    assert!(v[0].message.contains("backwards"), "{}", v[0].message);
    let v = version_violations(&old, &cases[0].0);
    assert_eq!(
        v[0].help,
        "set `version: 2.0.0` (or make the change compatible)"
    );
}

#[test]
fn schema_effects_on_access() {
    let old = demo();
    let tightened = with_schema(&old, "legal_search", "2.0.0", |s| {
        s["properties"]["limit"]["maximum"] = json!(10)
    });
    assert_eq!(
        kinds(&changes(&old, &tightened)),
        vec![
            (Kind::ToolVersionChanged, Effect::Neutral),
            (Kind::InputSchemaChanged, Effect::Narrowing),
        ]
    );
    let loosened = with_schema(&old, "legal_search", "1.1.0", |s| {
        s["properties"]["limit"]["maximum"] = json!(100)
    });
    let c = changes(&old, &loosened);
    assert_eq!(c[1].kind, Kind::InputSchemaChanged);
    assert_eq!(c[1].effect, Effect::Widening);
    assert_eq!(c[1].schema.as_ref().unwrap().class, Class::Compatible);
}

#[test]
fn the_order_is_stable() {
    let old = demo();
    let mut new = old.clone();
    new.roles.clear();
    new.lanes
        .get_mut("intake")
        .unwrap()
        .required_scope_keys
        .clear();
    new.tools.get_mut("file_with_court").unwrap().enabled = false;
    let a = changes(&old, &new);
    let b = changes(&old, &new);
    assert_eq!(a, b);
    let sections: Vec<Section> = a.iter().map(|c| c.section).collect();
    let mut sorted = sections.clone();
    sorted.sort();
    assert_eq!(sections, sorted);
    assert_eq!(
        a.iter().filter(|c| c.kind == Kind::RoleRemoved).count(),
        old.roles.len()
    );
    assert_eq!(old.roles.len(), 7, "the demo's roles");
}

#[test]
fn removing_a_property_of_an_open_object_widens() {
    let demo = demo();
    let open = with_schema(&demo, "legal_search", "1.0.0", |s| {
        s.as_object_mut().unwrap().remove("additionalProperties");
    });
    let removed = with_schema(&open, "legal_search", "2.0.0", |s| {
        s["properties"].as_object_mut().unwrap().remove("limit");
    });
    let c = changes(&open, &removed);
    let input = c
        .iter()
        .find(|c| c.kind == Kind::InputSchemaChanged)
        .unwrap();
    assert_eq!(input.effect, Effect::Widening, "{input:?}");
    // With unknown properties refused, the removal only refuses more.
    let closed = with_schema(&demo, "legal_search", "2.0.0", |s| {
        s["properties"].as_object_mut().unwrap().remove("limit");
    });
    let c = changes(&demo, &closed);
    let input = c
        .iter()
        .find(|c| c.kind == Kind::InputSchemaChanged)
        .unwrap();
    assert_eq!(input.effect, Effect::Narrowing, "{input:?}");
}
