//! The change in effective permissions between two loaded policies, and the version
//! rules for tool schemas.
//!
//! Pure: compares two validated [`Policy`] values, no I/O. Every list it returns is
//! sorted, so the same two policies always give the same report.
//!
//! This file holds the change model (`Change`, `Kind`, `Effect`, `Section`) and the
//! allowed (role, lane, tool) triples; each policy section is compared in its own file:
//! `roles` (roles, admins, credentials), `identity` (identity providers and run-token
//! lifetimes), `lanes`, `tools` (fields, budgets and rates, two-phase settings, flag
//! rules), `approval` and `conditions` (shared by lanes and tools), and `versions` (the
//! contract's version rules).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Value, json};

mod approval;
mod conditions;
mod identity;
mod lanes;
mod roles;
#[cfg(test)]
mod tests;
mod tools;
mod versions;

use super::fields::TOOL_FIELDS;
use super::schema::{self, Class, SchemaChange};
use crate::policy::{
    Approval, Condition, Credential, FlagMatcher, FlagRule, IdentityProvider, JwksSource,
    JwtCredential, Lane, Policy, Role, Tool,
};

/// Whether a change gives more access, less, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    Widening,
    Narrowing,
    Neutral,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Widening => "widening",
            Effect::Narrowing => "narrowing",
            Effect::Neutral => "neutral",
        }
    }
}

/// What changed. The JSON name is the snake_case variant name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    // (role, lane, tool) triples
    TripleAllowed,
    TripleDenied,
    // roles and admins
    RoleAdded,
    RoleRemoved,
    RoleEnabled,
    RoleDisabled,
    RoleCredentialChanged,
    AdminAdded,
    AdminRemoved,
    AdminCredentialChanged,
    AdminAccessChanged,
    // identity providers and run tokens
    IdentityProviderAdded,
    IdentityProviderRemoved,
    IdentityProviderChanged,
    RunTokenMaxTtlChanged,
    // lanes
    LaneAdded,
    LaneRemoved,
    LaneScopeKeyAdded,
    LaneScopeKeyRemoved,
    LaneProhibitionAdded,
    LaneProhibitionRemoved,
    LaneRunStatusAdded,
    LaneRunStatusRemoved,
    LaneWriteChanged,
    LaneConditionAdded,
    LaneConditionRemoved,
    LaneConditionChanged,
    LaneApprovalAdded,
    LaneApprovalRemoved,
    LaneApprovalChanged,
    LaneBudgetChanged,
    LaneRateChanged,
    // tools
    ToolAdded,
    ToolRemoved,
    ToolEnabled,
    ToolDisabled,
    ToolScopeKeyAdded,
    ToolScopeKeyRemoved,
    ToolProhibitionAdded,
    ToolProhibitionRemoved,
    FlagRuleAdded,
    FlagRuleRemoved,
    FlagRuleChanged,
    ToolVersionChanged,
    ToolIdempotentChanged,
    ToolDeterminismChanged,
    ToolTimeoutChanged,
    ToolLimitChanged,
    ToolWriteTargetAdded,
    ToolWriteTargetRemoved,
    ToolAdapterChanged,
    ToolRedactionChanged,
    ToolConditionAdded,
    ToolConditionRemoved,
    ToolConditionChanged,
    InputSchemaChanged,
    OutputSchemaChanged,
    ToolApprovalAdded,
    ToolApprovalRemoved,
    ToolApprovalChanged,
    ToolBudgetChanged,
    ToolRateChanged,
    ToolPhasesChanged,
    ToolSandboxChanged,
    ToolSecretAdded,
    ToolSecretRemoved,
    ToolAuthChanged,
}

/// Which part of the policy a change is about; sections order the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Section {
    Access,
    Roles,
    Identity,
    Lanes,
    Tools,
    Schemas,
}

impl Section {
    pub const ALL: [Section; 6] = [
        Section::Access,
        Section::Roles,
        Section::Identity,
        Section::Lanes,
        Section::Tools,
        Section::Schemas,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Section::Access => "access (role / lane / tool)",
            Section::Roles => "roles and admins",
            Section::Identity => "identity providers and run tokens",
            Section::Lanes => "lanes",
            Section::Tools => "tools",
            Section::Schemas => "schemas",
        }
    }
}

impl Kind {
    pub fn section(self) -> Section {
        use Kind::*;
        match self {
            TripleAllowed | TripleDenied => Section::Access,
            RoleAdded
            | RoleRemoved
            | RoleEnabled
            | RoleDisabled
            | RoleCredentialChanged
            | AdminAdded
            | AdminRemoved
            | AdminCredentialChanged
            | AdminAccessChanged => Section::Roles,
            IdentityProviderAdded
            | IdentityProviderRemoved
            | IdentityProviderChanged
            | RunTokenMaxTtlChanged => Section::Identity,
            LaneAdded
            | LaneRemoved
            | LaneScopeKeyAdded
            | LaneScopeKeyRemoved
            | LaneProhibitionAdded
            | LaneProhibitionRemoved
            | LaneRunStatusAdded
            | LaneRunStatusRemoved
            | LaneWriteChanged
            | LaneConditionAdded
            | LaneConditionRemoved
            | LaneConditionChanged
            | LaneApprovalAdded
            | LaneApprovalRemoved
            | LaneApprovalChanged => Section::Lanes,
            LaneBudgetChanged | LaneRateChanged => Section::Lanes,
            InputSchemaChanged | OutputSchemaChanged => Section::Schemas,
            ToolAdded
            | ToolRemoved
            | ToolEnabled
            | ToolDisabled
            | ToolScopeKeyAdded
            | ToolScopeKeyRemoved
            | ToolProhibitionAdded
            | ToolProhibitionRemoved
            | FlagRuleAdded
            | FlagRuleRemoved
            | FlagRuleChanged
            | ToolVersionChanged
            | ToolIdempotentChanged
            | ToolDeterminismChanged
            | ToolTimeoutChanged
            | ToolLimitChanged
            | ToolWriteTargetAdded
            | ToolWriteTargetRemoved
            | ToolAdapterChanged
            | ToolRedactionChanged
            | ToolConditionAdded
            | ToolConditionRemoved
            | ToolConditionChanged
            | ToolApprovalAdded
            | ToolApprovalRemoved
            | ToolApprovalChanged => Section::Tools,
            ToolBudgetChanged | ToolRateChanged | ToolPhasesChanged | ToolSandboxChanged => {
                Section::Tools
            }
            ToolSecretAdded | ToolSecretRemoved | ToolAuthChanged => Section::Tools,
        }
    }
}

/// The schema part of an `input_schema_changed` / `output_schema_changed` change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemaDiff {
    /// The most severe class among `changes`.
    pub class: Class,
    pub changes: Vec<SchemaChange>,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub kind: Kind,
    pub section: Section,
    pub effect: Effect,
    pub role: Option<String>,
    pub admin: Option<String>,
    /// The identity provider (`identity_providers[].id`) a change is about.
    pub provider: Option<String>,
    pub lane: Option<String>,
    pub tool: Option<String>,
    /// One line, lowercase, names in backticks.
    pub message: String,
    /// The old and new value where one helps (never a credential).
    pub before: Option<Value>,
    pub after: Option<Value>,
    pub schema: Option<SchemaDiff>,
}

impl Change {
    pub(super) fn new(kind: Kind, effect: Effect, message: String) -> Change {
        Change {
            kind,
            section: kind.section(),
            effect,
            role: None,
            admin: None,
            provider: None,
            lane: None,
            tool: None,
            message,
            before: None,
            after: None,
            schema: None,
        }
    }

    fn role(mut self, id: &str) -> Change {
        self.role = Some(id.to_string());
        self
    }
    fn admin(mut self, id: &str) -> Change {
        self.admin = Some(id.to_string());
        self
    }
    fn provider(mut self, id: &str) -> Change {
        self.provider = Some(id.to_string());
        self
    }
    fn lane(mut self, id: &str) -> Change {
        self.lane = Some(id.to_string());
        self
    }
    pub(super) fn tool(mut self, id: &str) -> Change {
        self.tool = Some(id.to_string());
        self
    }
    pub(super) fn values(mut self, before: Value, after: Value) -> Change {
        self.before = Some(before);
        self.after = Some(after);
        self
    }

    /// The report order: section, then the names, then the kind and message.
    fn sort_key(&self) -> impl Ord + '_ {
        (
            self.section,
            self.role.as_deref(),
            self.lane.as_deref(),
            self.tool.as_deref(),
            self.admin.as_deref(),
            self.provider.as_deref(),
            self.kind,
            self.message.as_str(),
        )
    }
}

/// A tool whose schema changed without the version bump the contract requires.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Violation {
    pub tool: String,
    pub old_version: String,
    pub new_version: String,
    /// The class of the schema change (`breaking` or `compatible`), or None when the
    /// version went backwards.
    pub class: Option<Class>,
    pub message: String,
    pub help: String,
}

/// Every change from `old` to `new`, in report order.
pub fn changes(old: &Policy, new: &Policy) -> Vec<Change> {
    let mut out = Vec::new();
    triples(old, new, &mut out);
    roles(old, new, &mut out);
    admins(old, new, &mut out);
    identity(old, new, &mut out);
    lanes(old, new, &mut out);
    tools(old, new, &mut out);
    out.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    out
}

/// Every (role, lane, tool) triple that is allowed: the role is enabled and lists the
/// lane, the lane allowlists the tool, the tool lists the lane and is enabled.
pub fn allowed_triples(policy: &Policy) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for role in policy.roles.values().filter(|r| r.enabled) {
        for lane_id in &role.lanes {
            let Some(lane) = policy.lanes.get(lane_id) else {
                continue;
            };
            for tool_name in &lane.tools {
                let Some(tool) = policy.tools.get(tool_name) else {
                    continue;
                };
                if tool.enabled && tool.allowed_lanes.contains(lane_id) {
                    out.insert((role.role_id.clone(), lane_id.clone(), tool_name.clone()));
                }
            }
        }
    }
    out
}

fn triples(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    let (before, after) = (allowed_triples(old), allowed_triples(new));
    for (role, lane, tool) in after.difference(&before) {
        out.push(
            Change::new(
                Kind::TripleAllowed,
                Effect::Widening,
                format!("`{role}` may now call `{tool}` in lane `{lane}`"),
            )
            .role(role)
            .lane(lane)
            .tool(tool),
        );
    }
    for (role, lane, tool) in before.difference(&after) {
        out.push(
            Change::new(
                Kind::TripleDenied,
                Effect::Narrowing,
                format!("`{role}` may no longer call `{tool}` in lane `{lane}`"),
            )
            .role(role)
            .lane(lane)
            .tool(tool),
        );
    }
}

/// Pairs the entries of two maps: only-old, only-new, both.
fn pair<'a, T>(
    old: &'a BTreeMap<String, T>,
    new: &'a BTreeMap<String, T>,
) -> Vec<(&'a String, Option<&'a T>, Option<&'a T>)> {
    let ids: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    ids.into_iter()
        .map(|id| (id, old.get(id), new.get(id)))
        .collect()
}

/// Items in `new` and not in `old`, and the reverse, sorted.
pub(super) fn set_diff<'a>(
    old: &'a [String],
    new: &'a [String],
) -> (Vec<&'a String>, Vec<&'a String>) {
    let (o, n): (BTreeSet<&String>, BTreeSet<&String>) =
        (old.iter().collect(), new.iter().collect());
    (
        n.difference(&o).copied().collect(),
        o.difference(&n).copied().collect(),
    )
}

use approval::*;
use conditions::*;
use identity::*;
use lanes::*;
use roles::*;
use tools::*;
pub use versions::version_violations;
