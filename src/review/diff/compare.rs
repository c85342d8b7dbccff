//! The change in effective permissions between two loaded policies, and the version
//! rules for tool schemas.
//!
//! Pure: compares two validated [`Policy`] values, no I/O. Every list it returns is
//! sorted, so the same two policies always give the same report.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Value, json};

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
            ToolBudgetChanged | ToolRateChanged | ToolPhasesChanged => Section::Tools,
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

/// Compares credentials without ever exposing a hash: the kind and, for `token_env`,
/// the variable name.
fn same_credential(a: &Credential, b: &Credential) -> bool {
    match (a, b) {
        (Credential::TokenSha256(x), Credential::TokenSha256(y)) => x == y,
        (Credential::TokenEnv { var: x, .. }, Credential::TokenEnv { var: y, .. }) => x == y,
        (Credential::RunTokensOnly { sha256: x }, Credential::RunTokensOnly { sha256: y }) => {
            x == y
        }
        (Credential::Jwt(x), Credential::Jwt(y)) => x == y,
        _ => false,
    }
}

/// Who a JWT credential admits, in words: `a jwt of `corp` whose `groups` is `x``, and
/// its subject or `any subject`.
fn jwt_words(jwt: &JwtCredential) -> String {
    let subject = match &jwt.subject {
        Some(s) => format!("subject `{s}`"),
        None => "any subject".to_string(),
    };
    format!(
        "a jwt of provider `{}` whose `{}` is `{}`, {subject}",
        jwt.provider, jwt.claim, jwt.value
    )
}

/// What a credential change does to who can prove the principal, and why (None for a
/// plain rotation of a static token, which is neutral and needs no words).
///
/// Widening: a move to a `jwt` credential (every holder of a matching token proves
/// it); a changed jwt provider, claim, value or subject, or a subject dropped; a move
/// away from `jwt` (unclear, so reviewed as a widening); `run_tokens_only` dropped for
/// a static token (which calls tools in any run). Narrowing: a subject added to an
/// otherwise unchanged jwt; a static token replaced by `run_tokens_only`.
fn credential_change(o: &Credential, n: &Credential) -> (Effect, Option<String>) {
    use Credential::{Jwt, RunTokensOnly, TokenEnv, TokenSha256};
    match (o, n) {
        (Jwt(a), Jwt(b)) => {
            let same_claim = a.provider == b.provider && a.claim == b.claim && a.value == b.value;
            if same_claim && let (None, Some(subject)) = (&a.subject, &b.subject) {
                return (
                    Effect::Narrowing,
                    Some(format!("now only subject `{subject}`")),
                );
            }
            let mut parts = Vec::new();
            if a.provider != b.provider {
                parts.push(format!("jwt provider `{}` -> `{}`", a.provider, b.provider));
            }
            if a.claim != b.claim {
                parts.push(format!("jwt claim `{}` -> `{}`", a.claim, b.claim));
            }
            if a.value != b.value {
                parts.push(format!("jwt value `{}` -> `{}`", a.value, b.value));
            }
            match (&a.subject, &b.subject) {
                (Some(_), None) => parts.push("subject dropped: any subject proves it".into()),
                (x, y) if x != y => parts.push("jwt subject changed".into()),
                _ => {}
            }
            (
                Effect::Widening,
                Some(format!("{}; now {}", parts.join(", "), jwt_words(b))),
            )
        }
        (_, Jwt(b)) => (
            Effect::Widening,
            Some(format!("now proven by {}", jwt_words(b))),
        ),
        (Jwt(_), _) => (
            Effect::Widening,
            Some("no longer a jwt credential; reviewed as a widening".into()),
        ),
        (RunTokensOnly { .. }, TokenSha256(_) | TokenEnv { .. }) => (
            Effect::Widening,
            Some("`run_tokens_only` dropped: a static token now calls tools in any run".into()),
        ),
        (TokenSha256(_) | TokenEnv { .. }, RunTokensOnly { .. }) => (
            Effect::Narrowing,
            Some("now `run_tokens_only`: tools are called with run tokens only".into()),
        ),
        (
            TokenSha256(_) | TokenEnv { .. } | RunTokensOnly { .. },
            TokenSha256(_) | TokenEnv { .. } | RunTokensOnly { .. },
        ) => (Effect::Neutral, None),
    }
}

/// The change of a role's or admin's credential, when it changed.
fn credential_message(who: &str, o: &Credential, n: &Credential) -> Option<(Effect, String)> {
    if same_credential(o, n) {
        return None;
    }
    let (effect, why) = credential_change(o, n);
    let message = match why {
        Some(why) => format!("{who}: credential changed ({why})"),
        None => format!("{who}: credential changed"),
    };
    Some((effect, message))
}

fn credential_kind(c: &Credential) -> Value {
    match c {
        Credential::TokenSha256(_) => json!("token_sha256"),
        Credential::TokenEnv { var, .. } => json!(format!("token_env:{var}")),
        Credential::RunTokensOnly { .. } => json!("run_tokens_only"),
        Credential::Jwt(jwt) => json!(format!("jwt:{}", jwt.provider)),
    }
}

fn roles(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    for (id, o, n) in pair(&old.roles, &new.roles) {
        match (o, n) {
            (None, Some(r)) => out.push(
                Change::new(
                    Kind::RoleAdded,
                    if r.enabled {
                        Effect::Widening
                    } else {
                        Effect::Neutral
                    },
                    format!(
                        "role `{id}` added ({}, lanes: {})",
                        if r.enabled { "enabled" } else { "disabled" },
                        r.lanes.join(", ")
                    ),
                )
                .role(id),
            ),
            (Some(_), None) => out.push(
                Change::new(
                    Kind::RoleRemoved,
                    Effect::Narrowing,
                    format!("role `{id}` removed"),
                )
                .role(id),
            ),
            (Some(o), Some(n)) => role_fields(id, o, n, out),
            (None, None) => {}
        }
    }
}

fn role_fields(id: &str, o: &Role, n: &Role, out: &mut Vec<Change>) {
    if o.enabled != n.enabled {
        let (kind, effect, word) = if n.enabled {
            (Kind::RoleEnabled, Effect::Widening, "enabled")
        } else {
            (Kind::RoleDisabled, Effect::Narrowing, "disabled")
        };
        out.push(Change::new(kind, effect, format!("role `{id}` {word}")).role(id));
    }
    if let Some((effect, message)) =
        credential_message(&format!("role `{id}`"), &o.credential, &n.credential)
    {
        out.push(
            Change::new(Kind::RoleCredentialChanged, effect, message)
                .role(id)
                .values(
                    credential_kind(&o.credential),
                    credential_kind(&n.credential),
                ),
        );
    }
}

fn admins(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    let map = |p: &Policy| -> BTreeMap<String, Credential> {
        p.admins
            .iter()
            .map(|a| (a.admin_id.clone(), a.credential.clone()))
            .collect()
    };
    let (o, n) = (map(old), map(new));
    for (id, a, b) in pair(&o, &n) {
        match (a, b) {
            (None, Some(_)) => out.push(
                Change::new(
                    Kind::AdminAdded,
                    Effect::Widening,
                    format!("admin `{id}` added"),
                )
                .admin(id),
            ),
            (Some(_), None) => out.push(
                Change::new(
                    Kind::AdminRemoved,
                    Effect::Narrowing,
                    format!("admin `{id}` removed"),
                )
                .admin(id),
            ),
            (Some(a), Some(b)) => {
                if let Some((effect, message)) = credential_message(&format!("admin `{id}`"), a, b)
                {
                    out.push(
                        Change::new(Kind::AdminCredentialChanged, effect, message)
                            .admin(id)
                            .values(credential_kind(a), credential_kind(b)),
                    );
                }
            }
            (None, None) => {}
        }
    }
    // `access`: `audit_read` -> `full` widens what the admin may do.
    let access = |p: &Policy| -> BTreeMap<String, crate::policy::AdminAccess> {
        p.admins
            .iter()
            .map(|a| (a.admin_id.clone(), a.access))
            .collect()
    };
    let (o, n) = (access(old), access(new));
    for (id, a, b) in pair(&o, &n) {
        if let (Some(a), Some(b)) = (a, b)
            && a != b
        {
            let effect = if *b == crate::policy::AdminAccess::Full {
                Effect::Widening
            } else {
                Effect::Narrowing
            };
            out.push(
                Change::new(
                    Kind::AdminAccessChanged,
                    effect,
                    format!("admin `{id}`: access {} -> {}", a.as_str(), b.as_str()),
                )
                .admin(id)
                .values(serde_json::json!(a.as_str()), serde_json::json!(b.as_str())),
            );
        }
    }
}

/// The providers' settings as JSON (nothing in them is secret).
fn provider_json(p: &IdentityProvider) -> Value {
    let (uri, file) = match &p.jwks {
        JwksSource::Uri(u) => (json!(u), Value::Null),
        JwksSource::File(f) => (Value::Null, json!(f.display().to_string())),
    };
    json!({
        "issuer": p.issuer,
        "audience": p.audience,
        "jwks_uri": uri,
        "jwks_file": file,
        "algorithms": p.algorithms,
        "leeway_s": p.leeway_s,
        "jwks_refresh_s": p.jwks_refresh_s,
        "jwks_cooldown_s": p.jwks_cooldown_s,
    })
}

fn jwks_words(j: &JwksSource) -> String {
    match j {
        JwksSource::Uri(u) => format!("jwks_uri `{u}`"),
        JwksSource::File(f) => format!("jwks_file `{}`", f.display()),
    }
}

/// Whether some role or admin of `policy` is proven by a JWT of provider `id`.
fn provider_named(policy: &Policy, id: &str) -> Vec<String> {
    let named = |c: &Credential| matches!(c, Credential::Jwt(j) if j.provider == id);
    let roles = policy
        .roles
        .values()
        .filter(|r| named(&r.credential))
        .map(|r| format!("role `{}`", r.role_id));
    let admins = policy
        .admins
        .iter()
        .filter(|a| named(&a.credential))
        .map(|a| format!("admin `{}`", a.admin_id));
    roles.chain(admins).collect()
}

/// roles.yaml's `identity_providers` (by id) and `run_tokens.max_ttl_s`.
///
/// A provider added is widening when a role or admin names it, else neutral (it proves
/// nothing yet); removed narrows. A provider changed widens when any part of the change
/// may admit a token it refused (another issuer, audience or key source; an algorithm
/// added; more leeway; a longer refresh; a changed cooldown, whose effect on the keys
/// trusted is unclear), else narrows (an algorithm removed, less leeway, a shorter
/// refresh). A longer `max_ttl_s` widens, a shorter one narrows.
fn identity(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    let (op, np) = (&old.identity.providers, &new.identity.providers);
    for (id, o, n) in pair(op, np) {
        match (o, n) {
            (None, Some(p)) => {
                let users = provider_named(new, id);
                let (effect, who) = if users.is_empty() {
                    (Effect::Neutral, "no role or admin names it".to_string())
                } else {
                    (Effect::Widening, format!("named by {}", users.join(", ")))
                };
                out.push(
                    Change::new(
                        Kind::IdentityProviderAdded,
                        effect,
                        format!(
                            "identity provider `{id}` added (issuer `{}`; {who})",
                            p.issuer
                        ),
                    )
                    .provider(id)
                    .values(Value::Null, provider_json(p)),
                );
            }
            (Some(p), None) => out.push(
                Change::new(
                    Kind::IdentityProviderRemoved,
                    Effect::Narrowing,
                    format!("identity provider `{id}` removed"),
                )
                .provider(id)
                .values(provider_json(p), Value::Null),
            ),
            (Some(o), Some(n)) => provider_fields(id, o, n, out),
            (None, None) => {}
        }
    }
    let (o, n) = (
        old.identity.run_token_max_ttl_s,
        new.identity.run_token_max_ttl_s,
    );
    if o != n {
        let (effect, word) = if n > o {
            (Effect::Widening, "raised")
        } else {
            (Effect::Narrowing, "lowered")
        };
        out.push(
            Change::new(
                Kind::RunTokenMaxTtlChanged,
                effect,
                format!("run tokens: `max_ttl_s` {word} from {o} to {n}"),
            )
            .values(json!(o), json!(n)),
        );
    }
}

fn provider_fields(id: &str, o: &IdentityProvider, n: &IdentityProvider, out: &mut Vec<Change>) {
    if o == n {
        return;
    }
    let mut wider = Vec::new();
    let mut narrower = Vec::new();
    if o.issuer != n.issuer {
        wider.push(format!(
            "issuer changed from `{}` to `{}`",
            o.issuer, n.issuer
        ));
    }
    if o.audience != n.audience {
        wider.push(format!(
            "audience changed from `{}` to `{}`",
            o.audience, n.audience
        ));
    }
    match (&o.jwks, &n.jwks) {
        (a, b) if a == b => {}
        (JwksSource::Uri(a), JwksSource::Uri(b)) => {
            wider.push(format!("jwks_uri changed from `{a}` to `{b}`"))
        }
        (JwksSource::File(a), JwksSource::File(b)) => wider.push(format!(
            "jwks_file changed from `{}` to `{}`",
            a.display(),
            b.display()
        )),
        (a, b) => wider.push(format!(
            "keys now from {} instead of {}",
            jwks_words(b),
            jwks_words(a)
        )),
    }
    let (added, removed) = set_diff(&o.algorithms, &n.algorithms);
    for alg in added {
        wider.push(format!("algorithm `{alg}` added"));
    }
    for alg in removed {
        narrower.push(format!("algorithm `{alg}` removed"));
    }
    let mut number = |name: &str, a: u64, b: u64, raised_widens: bool| {
        let (list, word) = match (b > a, raised_widens) {
            (true, true) => (&mut wider, "raised"),
            (false, true) => (&mut narrower, "lowered"),
            (true, false) => (&mut narrower, "raised"),
            (false, false) => (&mut wider, "lowered"),
        };
        if a != b {
            list.push(format!("{name} {word} from {a} to {b}"));
        }
    };
    number("leeway_s", o.leeway_s, n.leeway_s, true);
    // A longer refresh keeps trusting a key the provider dropped for longer.
    number("jwks_refresh_s", o.jwks_refresh_s, n.jwks_refresh_s, true);
    if o.jwks_cooldown_s != n.jwks_cooldown_s {
        wider.push(format!(
            "jwks_cooldown_s changed from {} to {}",
            o.jwks_cooldown_s, n.jwks_cooldown_s
        ));
    }
    let effect = if !wider.is_empty() || narrower.is_empty() {
        Effect::Widening
    } else {
        Effect::Narrowing
    };
    let mut parts: Vec<String> = wider.into_iter().chain(narrower).collect();
    if parts.is_empty() {
        parts.push("settings changed".into());
    }
    out.push(
        Change::new(
            Kind::IdentityProviderChanged,
            effect,
            format!("identity provider `{id}` changed ({})", parts.join(", ")),
        )
        .provider(id)
        .values(provider_json(o), provider_json(n)),
    );
}

fn lanes(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    for (id, o, n) in pair(&old.lanes, &new.lanes) {
        match (o, n) {
            (None, Some(l)) => out.push(
                Change::new(
                    Kind::LaneAdded,
                    Effect::Widening,
                    format!("lane `{id}` added (tools: {})", l.tools.join(", ")),
                )
                .lane(id),
            ),
            (Some(_), None) => out.push(
                Change::new(
                    Kind::LaneRemoved,
                    Effect::Narrowing,
                    format!("lane `{id}` removed"),
                )
                .lane(id),
            ),
            (Some(o), Some(n)) => lane_fields(id, o, n, out),
            (None, None) => {}
        }
    }
}

fn lane_fields(id: &str, o: &Lane, n: &Lane, out: &mut Vec<Change>) {
    let (added, removed) = set_diff(&o.required_scope_keys, &n.required_scope_keys);
    for key in added {
        out.push(
            Change::new(
                Kind::LaneScopeKeyAdded,
                Effect::Narrowing,
                format!("lane `{id}` now requires scope key `{key}`"),
            )
            .lane(id),
        );
    }
    for key in removed {
        out.push(
            Change::new(
                Kind::LaneScopeKeyRemoved,
                Effect::Widening,
                format!("lane `{id}` no longer requires scope key `{key}`"),
            )
            .lane(id),
        );
    }
    let (added, removed) = set_diff(&o.prohibited_flags, &n.prohibited_flags);
    for flag in added {
        out.push(
            Change::new(
                Kind::LaneProhibitionAdded,
                Effect::Narrowing,
                format!("lane `{id}` now prohibits flag `{flag}`"),
            )
            .lane(id),
        );
    }
    for flag in removed {
        out.push(
            Change::new(
                Kind::LaneProhibitionRemoved,
                Effect::Widening,
                format!("lane `{id}` no longer prohibits flag `{flag}`"),
            )
            .lane(id),
        );
    }
    let statuses = |l: &Lane| -> Vec<String> {
        l.run_statuses
            .iter()
            .map(|s| s.as_str().to_string())
            .collect()
    };
    let (os, ns) = (statuses(o), statuses(n));
    let (added, removed) = set_diff(&os, &ns);
    for status in added {
        out.push(
            Change::new(
                Kind::LaneRunStatusAdded,
                Effect::Widening,
                format!("lane `{id}` may now act in `{status}` runs"),
            )
            .lane(id),
        );
    }
    for status in removed {
        out.push(
            Change::new(
                Kind::LaneRunStatusRemoved,
                Effect::Narrowing,
                format!("lane `{id}` may no longer act in `{status}` runs"),
            )
            .lane(id),
        );
    }
    if o.write != n.write {
        let (effect, text) = if n.write {
            (Effect::Widening, "is now a write lane")
        } else {
            (Effect::Narrowing, "is no longer a write lane")
        };
        out.push(
            Change::new(
                Kind::LaneWriteChanged,
                effect,
                format!("lane `{id}` {text}"),
            )
            .lane(id)
            .values(json!(o.write), json!(n.write)),
        );
    }
    conditions(Owner::Lane(id), &o.conditions, &n.conditions, out);
    approval(
        Owner::Lane(id),
        o.approval.as_ref(),
        n.approval.as_ref(),
        out,
    );
    call_limits(Owner::Lane(id), &o.call_limits, &n.call_limits, out);
}

fn tools(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
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
fn tool_fields(id: &str, o: &Tool, n: &Tool, out: &mut Vec<Change>) {
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
}

/// A budget or rate added narrows; removed or raised (more calls, or a shorter
/// window) widens; lowered narrows; a rate whose key changed widens (whether the new
/// key counts more strictly cannot be proven).
fn call_limits(
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
fn phases(
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

fn rule_text(rule: &FlagRule) -> String {
    let matcher = match &rule.matcher {
        FlagMatcher::Equals(s) => format!("equals `{s}`"),
        FlagMatcher::Prefix(s) => format!("prefix `{s}`"),
        FlagMatcher::IsTrue => "is_true".to_string(),
    };
    format!("`{}` at `{}` ({matcher})", rule.flag, rule.pointer)
}

/// Whether `new` raises its flag at least wherever `old` does (same flag and pointer).
fn raises_at_least(old: &FlagRule, new: &FlagRule) -> bool {
    match (&old.matcher, &new.matcher) {
        (FlagMatcher::Prefix(o), FlagMatcher::Prefix(n)) => o.starts_with(n.as_str()),
        (FlagMatcher::Equals(o), FlagMatcher::Prefix(n)) => o.starts_with(n.as_str()),
        (a, b) => a == b,
    }
}

fn flag_rules(id: &str, old: &[FlagRule], new: &[FlagRule], out: &mut Vec<Change>) {
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

fn approval_json(a: &Approval) -> Value {
    json!({
        "required": a.when.is_none(),
        "when": a.when.as_ref().map(|c| c.expr.clone()),
        "approvers": a.approvers,
        "quorum": a.quorum,
        "ttl_s": a.ttl_s,
    })
}

/// A lane's or tool's `approval`: added narrows, removed widens; a change is widening
/// when any part of it lets more calls through or makes approving easier (`when`
/// instead of `required`, a changed `when`, an approver added, a lower quorum, a longer
/// ttl), else narrowing (the opposite changes), else neutral.
fn approval(
    owner: Owner<'_>,
    old: Option<&Approval>,
    new: Option<&Approval>,
    out: &mut Vec<Change>,
) {
    let (label, kinds) = match owner {
        Owner::Lane(id) => (
            format!("lane `{id}`"),
            [
                Kind::LaneApprovalAdded,
                Kind::LaneApprovalRemoved,
                Kind::LaneApprovalChanged,
            ],
        ),
        Owner::Tool(id) => (
            format!("tool `{id}`"),
            [
                Kind::ToolApprovalAdded,
                Kind::ToolApprovalRemoved,
                Kind::ToolApprovalChanged,
            ],
        ),
    };
    let attach = |change: Change| match owner {
        Owner::Lane(id) => change.lane(id),
        Owner::Tool(id) => change.tool(id),
    };
    let (o, n) = match (old, new) {
        (None, None) => return,
        (None, Some(n)) => {
            out.push(attach(
                Change::new(
                    kinds[0],
                    Effect::Narrowing,
                    format!("{label} now requires approval"),
                )
                .values(Value::Null, approval_json(n)),
            ));
            return;
        }
        (Some(o), None) => {
            out.push(attach(
                Change::new(
                    kinds[1],
                    Effect::Widening,
                    format!("{label} no longer requires approval"),
                )
                .values(approval_json(o), Value::Null),
            ));
            return;
        }
        (Some(o), Some(n)) => (o, n),
    };
    let mut wider = Vec::new();
    let mut narrower = Vec::new();
    match (&o.when, &n.when) {
        (None, Some(_)) => wider.push("only calls matching `when` need approval now"),
        (Some(_), None) => narrower.push("every call needs approval now"),
        (Some(a), Some(b)) if a.expr != b.expr => wider.push("`when` changed"),
        _ => {}
    }
    if n.approvers.iter().any(|a| !o.approvers.contains(a)) {
        wider.push("approvers added");
    }
    if o.approvers.iter().any(|a| !n.approvers.contains(a)) {
        narrower.push("approvers removed");
    }
    if n.quorum < o.quorum {
        wider.push("quorum lowered");
    } else if n.quorum > o.quorum {
        narrower.push("quorum raised");
    }
    if n.ttl_s > o.ttl_s {
        wider.push("ttl_s raised");
    } else if n.ttl_s < o.ttl_s {
        narrower.push("ttl_s lowered");
    }
    let effect = if !wider.is_empty() {
        Effect::Widening
    } else if !narrower.is_empty() {
        Effect::Narrowing
    } else {
        return;
    };
    let parts: Vec<&str> = wider.into_iter().chain(narrower).collect();
    out.push(attach(
        Change::new(
            kinds[2],
            effect,
            format!("{label}: approval changed ({})", parts.join(", ")),
        )
        .values(approval_json(o), approval_json(n)),
    ));
}

/// Whose conditions are compared.
#[derive(Clone, Copy)]
enum Owner<'a> {
    Lane(&'a str),
    Tool(&'a str),
}

/// Conditions by name: an added one narrows; a removed one widens; a changed expression
/// widens (whether the new one allows less cannot be proven in general); a changed
/// message alone is neutral.
fn conditions(owner: Owner<'_>, old: &[Condition], new: &[Condition], out: &mut Vec<Change>) {
    let (label, kinds) = match owner {
        Owner::Lane(id) => (
            format!("lane `{id}`"),
            [
                Kind::LaneConditionAdded,
                Kind::LaneConditionRemoved,
                Kind::LaneConditionChanged,
            ],
        ),
        Owner::Tool(id) => (
            format!("tool `{id}`"),
            [
                Kind::ToolConditionAdded,
                Kind::ToolConditionRemoved,
                Kind::ToolConditionChanged,
            ],
        ),
    };
    let attach = |change: Change| match owner {
        Owner::Lane(id) => change.lane(id),
        Owner::Tool(id) => change.tool(id),
    };
    let o: BTreeMap<&str, &Condition> = old.iter().map(|c| (c.name.as_str(), c)).collect();
    let n: BTreeMap<&str, &Condition> = new.iter().map(|c| (c.name.as_str(), c)).collect();
    for (name, c) in &n {
        match o.get(name) {
            None => out.push(attach(
                Change::new(
                    kinds[0],
                    Effect::Narrowing,
                    format!("{label}: condition `{name}` added: {}", c.expr),
                )
                .values(Value::Null, json!(c)),
            )),
            Some(before) if before.expr != c.expr => out.push(attach(
                Change::new(
                    kinds[2],
                    Effect::Widening,
                    format!(
                        "{label}: condition `{name}` changed from `{}` to `{}` (may allow calls the old one denied)",
                        before.expr, c.expr
                    ),
                )
                .values(json!(before), json!(c)),
            )),
            Some(before) if before.message != c.message => out.push(attach(
                Change::new(
                    kinds[2],
                    Effect::Neutral,
                    format!("{label}: condition `{name}`: message changed"),
                )
                .values(json!(before), json!(c)),
            )),
            Some(_) => {}
        }
    }
    for (name, c) in &o {
        if !n.contains_key(name) {
            out.push(attach(
                Change::new(
                    kinds[1],
                    Effect::Widening,
                    format!("{label}: condition `{name}` removed: {}", c.expr),
                )
                .values(json!(c), Value::Null),
            ));
        }
    }
}

fn moved(old: &semver::Version, new: &semver::Version) -> String {
    if old == new {
        format!("the version stayed {old}")
    } else {
        format!("the version only went from {old} to {new}")
    }
}

/// The version rules of the contract: a breaking schema change needs a major bump, a
/// compatible one at least a minor bump; a version never goes backwards. Sorted.
pub fn version_violations(old: &Policy, new: &Policy) -> Vec<Violation> {
    let mut out = Vec::new();
    for (id, o, n) in pair(&old.tools, &new.tools) {
        let (Some(o), Some(n)) = (o, n) else {
            continue;
        };
        let (ov, nv) = (&o.version, &n.version);
        let violation = |class: Option<Class>, message: String, help: String| Violation {
            tool: id.clone(),
            old_version: ov.to_string(),
            new_version: nv.to_string(),
            class,
            message,
            help,
        };
        if nv < ov {
            out.push(violation(
                None,
                format!("tool `{id}`: version went backwards from {ov} to {nv}"),
                format!("a tool's version only grows; use at least {ov}"),
            ));
            continue;
        }
        let class = [
            (&o.input_schema, &n.input_schema),
            (&o.output_schema, &n.output_schema),
        ]
        .iter()
        .filter_map(|(a, b)| schema::overall(&schema::compare(a, b)))
        .max();
        match class {
            Some(Class::Breaking) if nv.major <= ov.major => out.push(violation(
                Some(Class::Breaking),
                format!(
                    "tool `{id}`: a breaking schema change needs a major version bump, but {}",
                    moved(ov, nv)
                ),
                format!("set `version: {}.0.0` (or make the change compatible)", ov.major + 1),
            )),
            Some(Class::Compatible) if (nv.major, nv.minor) <= (ov.major, ov.minor) => {
                out.push(violation(
                    Some(Class::Compatible),
                    format!(
                        "tool `{id}`: a compatible schema change needs at least a minor version bump, but {}",
                        moved(ov, nv)
                    ),
                    format!("set `version: {}.{}.0`", ov.major, ov.minor + 1),
                ))
            }
            _ => {}
        }
    }
    out.sort();
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
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
}
