//! Raw serde types for the three registry files, exactly as written in YAML.
//!
//! Every struct rejects unknown fields, so a misspelled key is an error rather than a
//! silently ignored setting. Ids and references are wrapped in [`Spanned`] so the
//! validation step (`validate.rs`) can point at the line and column of a dangling
//! reference, not only at YAML syntax errors.
//!
//! Shapes that are "one of" several forms (credential, adapter, redaction, flag
//! matcher, schema reference) are flat structs of optional fields here: serde's tagged
//! and untagged enums buffer their content and lose source positions, and a flat struct
//! lets validation say precisely which field is missing or does not belong.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use serde_saphyr::Spanned;

use super::model::RunStatus;

/// `policy/roles.yaml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RolesFile {
    pub version: Spanned<String>,
    /// OIDC issuers whose JWTs may prove a role or admin (see policy/identity.rs).
    #[serde(default)]
    pub identity_providers: Vec<Spanned<RawIdentityProvider>>,
    /// Settings of the run tokens issued with `POST /v1/runs`.
    pub run_tokens: Option<Spanned<RawRunTokens>>,
    pub roles: Vec<Spanned<RawRole>>,
    pub admins: Vec<Spanned<RawAdmin>>,
}

/// One OIDC issuer: exactly one of `jwks_uri` and `jwks_file` (checked in validation).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIdentityProvider {
    pub id: Spanned<String>,
    pub issuer: Spanned<String>,
    pub audience: Spanned<String>,
    pub jwks_uri: Option<Spanned<String>>,
    pub jwks_file: Option<Spanned<String>>,
    pub algorithms: Option<Spanned<Vec<Spanned<String>>>>,
    pub leeway_s: Option<Spanned<u64>>,
    pub jwks_refresh_s: Option<Spanned<u64>>,
    pub jwks_cooldown_s: Option<Spanned<u64>>,
}

/// `run_tokens: {max_ttl_s}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRunTokens {
    pub max_ttl_s: Spanned<u64>,
}

/// `credential: {jwt: {provider, claim, value, subject?}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwtCredential {
    pub provider: Spanned<String>,
    pub claim: Spanned<String>,
    pub value: Spanned<String>,
    pub subject: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRole {
    pub role_id: Spanned<String>,
    pub description: Spanned<String>,
    pub enabled: bool,
    pub lanes: Vec<Spanned<String>>,
    pub credential: Spanned<RawCredential>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub admin_id: Spanned<String>,
    pub description: Spanned<String>,
    pub credential: Spanned<RawCredential>,
    /// `full` (the default) or `audit_read`.
    pub access: Option<Spanned<String>>,
}

/// Exactly one of `token_sha256`, `token_env` and `jwt` must be set (checked in
/// validation).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCredential {
    pub token_sha256: Option<Spanned<String>>,
    pub token_env: Option<Spanned<String>>,
    /// A JWT from one of the `identity_providers` (see policy/identity.rs).
    pub jwt: Option<Spanned<RawJwtCredential>>,
    /// Roles only: the role calls tools only with run tokens (see policy/identity.rs).
    pub run_tokens_only: Option<Spanned<bool>>,
}

/// `policy/lanes.yaml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LanesFile {
    pub version: Spanned<String>,
    pub lanes: Vec<Spanned<RawLane>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLane {
    pub lane_id: Spanned<String>,
    pub description: Spanned<String>,
    pub tools: Vec<Spanned<String>>,
    pub required_scope_keys: Vec<Spanned<String>>,
    pub prohibited_flags: Vec<Spanned<String>>,
    pub run_statuses: Spanned<Vec<Spanned<RunStatus>>>,
    pub write: bool,
    #[serde(default)]
    pub conditions: Vec<Spanned<RawCondition>>,
    /// Human approval for every call in this lane (see `RawApproval`).
    #[serde(default)]
    pub approval: Option<Spanned<RawApproval>>,
    pub budget: Option<Spanned<RawBudget>>,
    pub rate: Option<Spanned<RawRate>>,
}

/// `approval: {required: true | when: <CEL>, approvers: [...], quorum: N, ttl_s: N}`:
/// exactly one of `required: true` and `when` (checked in validation).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApproval {
    pub required: Option<Spanned<bool>>,
    pub when: Option<Spanned<String>>,
    pub approvers: Spanned<Vec<Spanned<String>>>,
    pub quorum: Option<Spanned<u32>>,
    pub ttl_s: Option<Spanned<u64>>,
}

/// `budget: {max_calls_per_run}` of a lane or tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBudget {
    pub max_calls_per_run: Spanned<u64>,
}

/// `rate: {max, per_s, key}` of a lane or tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRate {
    pub max: Spanned<u64>,
    pub per_s: Spanned<u64>,
    pub key: Option<Spanned<String>>,
}

/// A CEL condition: `{name, expr, message}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCondition {
    pub name: Spanned<String>,
    pub expr: Spanned<String>,
    pub message: Spanned<String>,
}

/// `tools/tool_registry.yaml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegistryFile {
    pub version: Spanned<String>,
    /// Outbound credentials, referred to as `${secret:ID}` (see policy/secrets.rs).
    #[serde(default)]
    pub secrets: Vec<Spanned<RawSecret>>,
    /// The upstream MCP servers the `mcp` adapters refer to by `server`.
    #[serde(default)]
    pub servers: Vec<Spanned<RawServer>>,
    pub tools: Vec<Spanned<RawTool>>,
}

/// An upstream MCP server, named once and shared by every tool that refers to it:
/// exactly one of `command` and `url` (checked in validation).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub server_id: Spanned<String>,
    pub description: Option<Spanned<String>>,
    pub command: Option<Spanned<Vec<String>>>,
    pub url: Option<Spanned<String>>,
    pub max_concurrency: Option<Spanned<u32>>,
    /// The confinement of a `command` server's process (see `RawSandbox`).
    pub sandbox: Option<Spanned<RawSandbox>>,
    /// A `command` server's environment: fixed values and `${secret:ID}`.
    pub env: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    /// A `url` server's request headers, its credential, CA and proxy.
    pub headers: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    pub auth: Option<Spanned<RawAuth>>,
    pub ca: Option<Spanned<String>>,
    pub proxy: Option<Spanned<String>>,
}

/// `secrets: [{id, from: {env: VAR} | {file: PATH}}]`: exactly one source (checked in
/// validation).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSecret {
    pub id: Spanned<String>,
    pub from: Spanned<RawSecretFrom>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSecretFrom {
    pub env: Option<Spanned<String>>,
    pub file: Option<Spanned<String>>,
}

/// `auth:` of an http adapter or a `url` server: exactly one kind (checked in
/// validation; an unknown kind is an unknown field).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAuth {
    pub bearer: Option<Spanned<String>>,
    pub basic: Option<Spanned<RawBasicAuth>>,
    pub oauth2_client_credentials: Option<Spanned<RawTokenGrant>>,
    pub token_exchange: Option<Spanned<RawTokenGrant>>,
    pub mtls: Option<Spanned<RawMtls>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBasicAuth {
    pub username: Spanned<String>,
    pub password: Spanned<String>,
}

/// `{token_url, client_id, client_secret, scope, audience}` (and `actor_token`,
/// `actor_token_type` for `token_exchange`, checked in validation).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTokenGrant {
    pub token_url: Spanned<String>,
    pub client_id: Spanned<String>,
    pub client_secret: Spanned<String>,
    pub scope: Option<Spanned<String>>,
    pub audience: Option<Spanned<String>>,
    pub actor_token: Option<Spanned<String>>,
    pub actor_token_type: Option<Spanned<String>>,
}

/// `mtls: {cert, key, ca}`: PEM files.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMtls {
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
    pub ca: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTool {
    pub tool_name: Spanned<String>,
    pub description: Spanned<String>,
    pub enabled: bool,
    pub version: Spanned<String>,
    pub determinism: Spanned<RawDeterminism>,
    pub idempotent: Spanned<bool>,
    pub timeout_default_ms: Spanned<u64>,
    pub limits: RawLimits,
    pub allowed_lanes: Vec<Spanned<String>>,
    pub required_scope_keys: Vec<Spanned<String>>,
    pub prohibited_flags: Vec<Spanned<String>>,
    #[serde(default)]
    pub flag_rules: Vec<Spanned<RawFlagRule>>,
    #[serde(default)]
    pub conditions: Vec<Spanned<RawCondition>>,
    /// Human approval for every call of this tool (see `RawApproval`).
    #[serde(default)]
    pub approval: Option<Spanned<RawApproval>>,
    pub write_targets: Spanned<Vec<Spanned<String>>>,
    pub adapter: Spanned<RawAdapter>,
    pub redaction: Option<Spanned<RawRedaction>>,
    pub budget: Option<Spanned<RawBudget>>,
    pub rate: Option<Spanned<RawRate>>,
    pub input_schema: Spanned<Value>,
    pub output_schema: Spanned<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawDeterminism {
    Pure,
    Idempotent,
    SideEffectful,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub timeout_ms_max: Spanned<u64>,
    pub max_output_bytes: Spanned<u64>,
    pub max_concurrency: Spanned<u32>,
}

/// `flag` and `pointer`, plus exactly one matcher (checked in validation).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFlagRule {
    pub flag: Spanned<String>,
    pub pointer: Spanned<String>,
    pub prefix: Option<Spanned<String>>,
    pub equals: Option<Spanned<String>>,
    pub is_true: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawAdapterKind {
    Builtin,
    Command,
    Http,
    Mcp,
}

impl RawAdapterKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RawAdapterKind::Builtin => "builtin",
            RawAdapterKind::Command => "command",
            RawAdapterKind::Http => "http",
            RawAdapterKind::Mcp => "mcp",
        }
    }
}

/// Every adapter field of every kind; validation checks that only the fields of the
/// chosen `kind` are set.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdapter {
    pub kind: Spanned<RawAdapterKind>,
    // builtin
    pub name: Option<Spanned<String>>,
    pub settings: Option<Spanned<BTreeMap<String, Value>>>,
    // command (and mcp over stdio)
    pub argv: Option<Spanned<Vec<String>>>,
    pub working_dir: Option<Spanned<String>>,
    pub env_allowlist: Option<Spanned<Vec<Spanned<String>>>>,
    // mcp over stdio
    pub command: Option<Spanned<Vec<String>>>,
    // http (and mcp over streamable http)
    pub url: Option<Spanned<String>>,
    pub allowed_hosts: Option<Spanned<Vec<Spanned<String>>>>,
    // http only
    pub method: Option<Spanned<String>>,
    pub query: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    pub headers: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    pub body: Option<Spanned<String>>,
    pub forward_scope: Option<Spanned<Vec<Spanned<String>>>>,
    // http: the outbound credential, the CAs the upstream is trusted through, a proxy
    pub auth: Option<Spanned<RawAuth>>,
    pub ca: Option<Spanned<String>>,
    pub proxy: Option<Spanned<String>>,
    // mcp
    pub server: Option<Spanned<String>>,
    pub tool: Option<Spanned<String>>,
    // two-phase tools (http, command, builtin `file_with_court`)
    pub phases: Option<Spanned<RawPhases>>,
    // command, and mcp with an inline `command`: the process's confinement
    pub sandbox: Option<Spanned<RawSandbox>>,
}

/// A two-phase tool's commit and rollback calls (see `model::Phases`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPhases {
    pub commit: Spanned<RawPhaseCall>,
    pub rollback: Spanned<RawPhaseCall>,
    pub commit_within_s: Spanned<u64>,
    pub token_field: Option<Spanned<String>>,
    pub max_attempts: Option<Spanned<u32>>,
    pub timeout_ms: Option<Spanned<u64>>,
    /// The confinement of the `argv` phase calls (default: the adapter's).
    pub sandbox: Option<Spanned<RawSandbox>>,
}

/// One phase call: `url` (http and builtin adapters) or `argv` (command adapters).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPhaseCall {
    pub url: Option<Spanned<String>>,
    pub argv: Option<Spanned<Vec<String>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawRedactionMode {
    Full,
    Fields,
    HashOnly,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedaction {
    pub mode: Spanned<RawRedactionMode>,
    pub pointers: Option<Vec<Spanned<String>>>,
}

/// `sandbox:` of a command tool, a command phase or a stdio MCP server: either
/// `unconfined: "reason"` alone, or any of `filesystem`, `network` and `limits`
/// (checked in validation; see `model::Sandbox`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSandbox {
    pub filesystem: Option<Spanned<RawSandboxFilesystem>>,
    pub network: Option<Spanned<RawSandboxNetwork>>,
    pub limits: Option<Spanned<RawSandboxLimits>>,
    pub unconfined: Option<Spanned<String>>,
}

/// `filesystem: {read, write, exec}`: paths added to the default profile.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSandboxFilesystem {
    #[serde(default)]
    pub read: Vec<Spanned<String>>,
    #[serde(default)]
    pub write: Vec<Spanned<String>>,
    #[serde(default)]
    pub exec: Vec<Spanned<String>>,
}

/// `network: none | {ports: [N, ...]} | {connect: ["host:port", ...]}`. An untagged
/// shape: its position is the enclosing `Spanned`'s.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawSandboxNetwork {
    Mode(String),
    Rules(RawSandboxNetworkRules),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSandboxNetworkRules {
    pub ports: Option<Vec<u64>>,
    pub connect: Option<Vec<String>>,
}

/// `limits: {cpu_s, memory_mb, processes, open_files, file_size_mb}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSandboxLimits {
    pub cpu_s: Option<Spanned<u64>>,
    pub memory_mb: Option<Spanned<u64>>,
    pub processes: Option<Spanned<u64>>,
    pub open_files: Option<Spanned<u64>>,
    pub file_size_mb: Option<Spanned<u64>>,
}
