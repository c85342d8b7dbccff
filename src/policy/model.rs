//! The validated policy model: what the gateway decides with.
//!
//! These types are built only by `policy::load` after every file parsed and every
//! cross-reference checked, so code that holds a `Policy` may rely on its invariants
//! (listed on each type) without checking again.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

pub use super::condition::Condition;

/// One complete, validated policy: the three registries loaded together.
///
/// INVARIANT: every id a role, lane or tool names exists in the same `Policy`; a tool's
/// `allowed_lanes` and the lanes' `tools` allowlists agree; a tool with write targets is
/// only allowlisted in write lanes; every schema compiled.
#[derive(Debug, Clone)]
pub struct Policy {
    pub roles: BTreeMap<String, Role>,
    pub admins: Vec<Admin>,
    pub lanes: BTreeMap<String, Lane>,
    pub tools: BTreeMap<String, Tool>,
    /// Versions and content hashes of the three files, pinned into every run record.
    pub versions: PolicyVersions,
    /// Where the policy came from (directory and, when inside a git work tree, the commit).
    pub source: PolicySource,
    /// Identity providers and run-token settings (roles.yaml).
    pub identity: IdentitySettings,
    /// The registry's `secrets:` by id, their values read at load (never printed or
    /// serialized; see `policy::secrets`).
    pub secrets: super::secrets::Secrets,
}

/// The identity settings of roles.yaml: `identity_providers` and `run_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentitySettings {
    /// By provider id.
    pub providers: BTreeMap<String, IdentityProvider>,
    /// The longest `ttl_s` a run token may be issued with (`run_tokens.max_ttl_s`).
    pub run_token_max_ttl_s: u64,
}

impl Default for IdentitySettings {
    fn default() -> Self {
        IdentitySettings {
            providers: BTreeMap::new(),
            run_token_max_ttl_s: DEFAULT_RUN_TOKEN_MAX_TTL_S,
        }
    }
}

/// `run_tokens.max_ttl_s` when roles.yaml does not set it.
pub const DEFAULT_RUN_TOKEN_MAX_TTL_S: u64 = 86_400;

/// An OIDC issuer whose JWTs may prove a role or an admin (`identity_providers`).
///
/// INVARIANT: `issuer` is unique among the policy's providers; `algorithms` is a
/// non-empty subset of [`JWT_ALGORITHMS`]; `leeway_s`, `jwks_refresh_s` and
/// `jwks_cooldown_s` are within the bounds the loader documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityProvider {
    pub id: String,
    /// The exact `iss` of its tokens.
    pub issuer: String,
    /// A value the token's `aud` must contain (or the server's MCP resource URI).
    pub audience: String,
    pub jwks: JwksSource,
    /// The `alg` values accepted, sorted.
    pub algorithms: Vec<String>,
    /// Clock skew allowed on `exp`, `nbf` and `iat`.
    pub leeway_s: u64,
    /// How old the cached key set may get before it is fetched again.
    pub jwks_refresh_s: u64,
    /// The least time between two fetches (the rate limit on refetching for an unknown
    /// `kid`, and the back-off after a failed fetch).
    pub jwks_cooldown_s: u64,
}

/// The asymmetric JWS algorithms toolgate verifies. `none` and the HMAC algorithms are
/// never accepted: a shared secret cannot prove which workload signed.
pub const JWT_ALGORITHMS: [&str; 9] = [
    "EdDSA", "ES256", "ES384", "PS256", "PS384", "PS512", "RS256", "RS384", "RS512",
];

/// Where a provider's signing keys (a JWK Set) are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// Fetched over HTTPS (plain HTTP only to a loopback address).
    Uri(String),
    /// Read from a file (resolved against the policy directory), e.g. a Kubernetes
    /// cluster's `/openid/v1/jwks` saved by the platform team.
    File(std::path::PathBuf),
}

/// `credential: {jwt: ...}`: a JWT from `provider` proves the role or admin when its
/// `claim` is `value` (or an array containing it) and, with `subject`, its `sub` is
/// that subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtCredential {
    pub provider: String,
    pub claim: String,
    pub value: String,
    pub subject: Option<String>,
}

/// The policy versions a line records, and what the audit log keeps of a call's
/// arguments: the audit crate's types (the line format is its).
pub use toolgate_audit::Redaction;
pub use toolgate_audit::line::{FileVersion, PolicyVersions};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PolicySource {
    pub policy_dir: String,
    pub tools_file: String,
    /// The git commit the policy directory was loaded from, if it is inside a work tree.
    pub git_commit: Option<String>,
    /// Whether the policy files differ from that commit.
    pub git_dirty: Option<bool>,
}

/// How a caller proves it holds a role (or the admin right).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// Lowercase hex sha256 of the bearer token; the token itself is never stored.
    TokenSha256(String),
    /// The token is read from this environment variable when the policy loads; only its
    /// sha256 is kept in memory.
    TokenEnv { var: String, sha256: Option<String> },
    /// `{run_tokens_only: true}`: the role calls tools only with run tokens issued for a
    /// run (see `identity::run_tokens`). A static token the entry also binds (its sha256
    /// here) is recognized only to answer `run_token_required`.
    RunTokensOnly { sha256: Option<String> },
    /// `{jwt: {provider, claim, value, subject?}}`: a verified JWT proves it (see
    /// `identity::jwt`); no static token does.
    Jwt(JwtCredential),
}

#[derive(Debug, Clone)]
pub struct Role {
    pub role_id: String,
    pub description: String,
    pub enabled: bool,
    /// Lanes this role may act in, sorted.
    pub lanes: Vec<String>,
    pub credential: Credential,
}

#[derive(Debug, Clone)]
pub struct Admin {
    pub admin_id: String,
    pub description: String,
    pub credential: Credential,
    /// What the admin may do (`access`, default `full`).
    pub access: AdminAccess,
}

/// An admin's `access`: `full` operates the gateway; `audit_read` only reads the audit
/// trail (a run's evidence and export bundle, `GET /v1/audit/events`, runs and the
/// policy versions), for compliance users. An `audit_read` credential is refused by
/// every endpoint that changes anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminAccess {
    Full,
    AuditRead,
}

impl AdminAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            AdminAccess::Full => "full",
            AdminAccess::AuditRead => "audit_read",
        }
    }
}

/// Run statuses; a lane lists the ones in which it may act.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Active,
    Suspended,
    Closed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Active => "active",
            RunStatus::Suspended => "suspended",
            RunStatus::Closed => "closed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Lane {
    pub lane_id: String,
    pub description: String,
    /// Tool allowlist, sorted.
    pub tools: Vec<String>,
    /// Scope keys every call in this lane must carry, sorted.
    pub required_scope_keys: Vec<String>,
    /// Flags that deny a call in this lane (see `Prohibition`).
    pub prohibited_flags: Vec<String>,
    /// Run statuses in which this lane may act; never empty.
    pub run_statuses: Vec<RunStatus>,
    /// A write lane may host tools with write targets.
    pub write: bool,
    /// CEL conditions every call in this lane must satisfy (step 8), in file order.
    pub conditions: Vec<Condition>,
    /// Human approval every call in this lane needs (or, with `when`, some calls).
    pub approval: Option<Approval>,
    /// `budget` and `rate`: counted at admission (step 8).
    pub call_limits: CallLimits,
}

/// The call budget and rate of a lane or tool (step 8): counters kept by the gateway,
/// claimed at admission (see `authz::limit_claims`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CallLimits {
    pub budget: Option<Budget>,
    pub rate: Option<RateLimit>,
}

/// At most `max_calls_per_run` admitted calls per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budget {
    pub max_calls_per_run: u64,
}

/// At most `max` admitted calls in any `per_s` seconds, per value of `key` (one
/// counter for all calls when there is no key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RateLimit {
    pub max: u64,
    pub per_s: u64,
    pub key: Option<LimitKey>,
}

/// What a rate is counted per: `run`, `role`, `scope.<key>` or `args.<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitKey {
    Run,
    Role,
    Scope(String),
    Args(String),
}

impl LimitKey {
    /// Parses `run`, `role`, `scope.<id>` or `args.<id>`.
    pub fn parse(text: &str) -> Option<LimitKey> {
        let id = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        match text.split_once('.') {
            None if text == "run" => Some(LimitKey::Run),
            None if text == "role" => Some(LimitKey::Role),
            Some(("scope", k)) if id(k) => Some(LimitKey::Scope(k.to_string())),
            Some(("args", k)) if id(k) => Some(LimitKey::Args(k.to_string())),
            _ => None,
        }
    }
}

impl std::fmt::Display for LimitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitKey::Run => f.write_str("run"),
            LimitKey::Role => f.write_str("role"),
            LimitKey::Scope(k) => write!(f, "scope.{k}"),
            LimitKey::Args(k) => write!(f, "args.{k}"),
        }
    }
}

impl Serialize for LimitKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// `approval:` on a lane or a tool: a call it applies to is not executed until
/// `quorum` distinct subjects proving an approver of `approvers` approved that exact call.
///
/// INVARIANT: `approvers` is sorted, non-empty, and each names a role or an admin of
/// the same policy (never both); `1 <= quorum <= approvers.len()`;
/// `MIN_APPROVAL_TTL_S <= ttl_s <= MAX_APPROVAL_TTL_S`.
#[derive(Debug, Clone)]
pub struct Approval {
    /// None for `required: true`; else approval is needed when this condition holds
    /// (or cannot be evaluated: fail closed).
    pub when: Option<Condition>,
    pub approvers: Vec<String>,
    pub quorum: u32,
    /// How long an approval request stays valid (deciding and the retry), seconds.
    pub ttl_s: u64,
}

/// `ttl_s` of an approval when the policy does not say (one hour).
pub const DEFAULT_APPROVAL_TTL_S: u64 = 3600;
/// The shortest and the longest `ttl_s` an approval may have (1 s, 7 days).
pub const MIN_APPROVAL_TTL_S: u64 = 1;
pub const MAX_APPROVAL_TTL_S: u64 = 7 * 86_400;

/// How a tool behaves when called twice (contract 000, section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Determinism {
    Pure,
    Idempotent,
    SideEffectful,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub timeout_ms_max: u64,
    pub max_output_bytes: u64,
    pub max_concurrency: u32,
}

/// A rule that raises a flag on a call from its (normalized) arguments, evaluated at
/// step 8 before execution, e.g. `read_document` raises `privileged` when `/path` starts
/// with `privileged/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlagRule {
    pub flag: String,
    /// JSON pointer into the normalized arguments.
    pub pointer: String,
    pub matcher: FlagMatcher,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlagMatcher {
    /// The string value equals this.
    Equals(String),
    /// The string value starts with this (for paths: a normalized relative path).
    Prefix(String),
    /// The value is boolean `true`.
    IsTrue,
}

/// How a tool is executed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AdapterConfig {
    /// A tool implemented in Rust inside toolgate; `name` picks the implementation and
    /// `settings` configure it (checked by `adapter::build`, not by the policy loader).
    Builtin {
        name: String,
        settings: BTreeMap<String, Value>,
    },
    /// A program run with an argument vector, never through a shell.
    Command {
        /// argv[0] and fixed arguments; the call's arguments are passed as JSON on stdin.
        argv: Vec<String>,
        /// Working directory, relative to the repository root / policy base directory.
        working_dir: Option<String>,
        /// Environment variables passed through from toolgate's environment; all
        /// others are cleared.
        env_allowlist: Vec<String>,
        /// The process's confinement (`sandbox:`, or the default profile).
        sandbox: Sandbox,
    },
    /// An upstream reached with one HTTP request per call (by default a JSON POST of
    /// the arguments to a fixed URL); see [`HttpRequestModel`].
    Http {
        /// A URL template: `{args.x}`, `{scope.x}` and `{run.scope.x}` placeholders may
        /// stand in the path and query only (checked at load).
        url: String,
        /// Hosts (host or host:port) the adapter may connect to.
        allowed_hosts: Vec<String>,
        /// Method, query, headers, body and scope forwarding; the default is today's
        /// JSON POST, and a default model is left out of the serialized form.
        #[serde(flatten, skip_serializing_if = "HttpRequestModel::is_default")]
        request: HttpRequestModel,
    },
    /// A tool on an upstream MCP server. Every tool of one server shares one
    /// supervised session with it (see `adapter::mcp`).
    ///
    /// INVARIANT: exactly one of `command` and `url` is set; when `server` names a
    /// `servers:` entry, they are that entry's.
    Mcp {
        /// The `servers:` entry the tool runs on; None when the adapter gives its
        /// server inline (`command` or `url`): then tools giving the same one share it.
        server: Option<String>,
        /// Start this server over stdio (argv), or
        command: Option<Vec<String>>,
        /// connect to this Streamable HTTP endpoint.
        url: Option<String>,
        /// The tool's name on the upstream server.
        tool: String,
        /// How many requests may be in flight on the server's session at once.
        max_concurrency: u32,
        /// The confinement of a stdio server's process (Some exactly when `command`
        /// is set): the `servers:` entry's, or the adapter's for an inline command.
        sandbox: Option<Sandbox>,
        /// The `servers:` entry's `env` (stdio), `headers` and `auth`, `ca`, `proxy`
        /// (Streamable HTTP); empty for an inline server.
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        env: BTreeMap<String, String>,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, String>,
        #[serde(flatten)]
        outbound: OutboundSettings,
    },
}

impl AdapterConfig {
    /// The ids of the secrets the adapter sends (sorted, each once).
    pub fn secret_ids(&self) -> Vec<String> {
        let mut texts: Vec<&str> = Vec::new();
        let (headers, env, outbound) = match self {
            AdapterConfig::Http { request, .. } => {
                (Some(&request.headers), None, Some(&request.outbound))
            }
            AdapterConfig::Mcp {
                env,
                headers,
                outbound,
                ..
            } => (Some(headers), Some(env), Some(outbound)),
            _ => (None, None, None),
        };
        texts.extend(
            headers
                .into_iter()
                .flat_map(|h| h.values().map(String::as_str)),
        );
        texts.extend(env.into_iter().flat_map(|e| e.values().map(String::as_str)));
        if let Some(auth) = outbound.and_then(|o| o.auth.as_ref()) {
            texts.extend(auth.secret_fields());
        }
        let mut ids: Vec<String> = texts
            .into_iter()
            .flat_map(super::secrets::secret_ids)
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The outbound settings of an http tool or an MCP server.
    pub fn outbound(&self) -> Option<&OutboundSettings> {
        match self {
            AdapterConfig::Http { request, .. } => Some(&request.outbound),
            AdapterConfig::Mcp { outbound, .. } => Some(outbound),
            _ => None,
        }
    }
}

/// An http tool's request model beyond its URL (`method`, `query`, `headers`, `body`,
/// `forward_scope`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HttpRequestModel {
    pub method: HttpMethod,
    /// Query parameters appended to the URL: name to a template (fixed text and
    /// placeholders). A parameter whose one placeholder has no value is left out.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub query: BTreeMap<String, String>,
    /// Fixed request headers (name, lowercase, to value).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    pub body: HttpBody,
    /// Scope keys sent as the RFC 8785 JSON object of a `Toolgate-Scope` header.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub forward_scope: Vec<String>,
    /// The outbound credential, private CA and proxy of the upstream.
    #[serde(flatten)]
    pub outbound: OutboundSettings,
}

/// How toolgate reaches one upstream (an http tool's, or an MCP server's over
/// `https://`): its credential, the CAs it is trusted through and a proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OutboundSettings {
    /// The credential toolgate adds after the call is authorized (the agent never
    /// holds it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<OutboundAuth>,
    /// A PEM file of the CAs the upstream's certificate must chain to, instead of the
    /// system's roots (as written; relative to the registry's directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// An `http://` proxy the connection goes through (CONNECT for https).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
}

/// `auth:` of an http tool or an MCP server. Credential fields hold `${secret:ID}`
/// references, never values: this form is what `policy explain` and `policy diff`
/// show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboundAuth {
    /// `Authorization: Bearer <value>`.
    Bearer(String),
    /// `Authorization: Basic base64(username:password)`.
    Basic { username: String, password: String },
    /// An OAuth 2.0 access token from the client credentials grant (RFC 6749 4.4),
    /// cached until shortly before it expires.
    Oauth2ClientCredentials(TokenGrant),
    /// An RFC 8693 token exchange of the caller's verified JWT.
    TokenExchange(TokenGrant),
    /// A TLS client certificate (PEM files, as written).
    Mtls { cert: String, key: String },
}

impl OutboundAuth {
    /// The auth kind as written in the registry.
    pub fn kind(&self) -> &'static str {
        match self {
            OutboundAuth::Bearer(_) => "bearer",
            OutboundAuth::Basic { .. } => "basic",
            OutboundAuth::Oauth2ClientCredentials(_) => "oauth2_client_credentials",
            OutboundAuth::TokenExchange(_) => "token_exchange",
            OutboundAuth::Mtls { .. } => "mtls",
        }
    }

    /// Every text field that may hold `${secret:ID}` references.
    pub fn secret_fields(&self) -> Vec<&str> {
        match self {
            OutboundAuth::Bearer(token) => vec![token],
            OutboundAuth::Basic { username, password } => vec![username, password],
            OutboundAuth::Oauth2ClientCredentials(grant) | OutboundAuth::TokenExchange(grant) => {
                let mut fields = vec![grant.client_id.as_str(), grant.client_secret.as_str()];
                fields.extend(grant.actor_token.as_deref());
                fields
            }
            OutboundAuth::Mtls { .. } => Vec::new(),
        }
    }
}

/// The token endpoint and client of `oauth2_client_credentials` and `token_exchange`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenGrant {
    /// `${env:}` resolved; an `https://` url (or `http://` to a loopback address).
    pub token_url: String,
    pub client_id: String,
    pub client_secret: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// `token_exchange` only: the sidecar's own actor token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_token: Option<String>,
    /// `token_exchange` only: the RFC 8693 type of `actor_token` (a JWT's when not
    /// given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_token_type: Option<String>,
}

impl HttpRequestModel {
    pub fn is_default(&self) -> bool {
        *self == HttpRequestModel::default()
    }
}

/// The method of an http tool's request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    #[default]
    Post,
    Put,
    Patch,
    Delete,
}

impl HttpMethod {
    pub const ALL: [HttpMethod; 5] = [
        HttpMethod::Get,
        HttpMethod::Post,
        HttpMethod::Put,
        HttpMethod::Patch,
        HttpMethod::Delete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Delete => "DELETE",
        }
    }
}

/// What an http tool's request carries as its body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpBody {
    /// The call's arguments as canonical JSON.
    #[default]
    Arguments,
    /// No body.
    None,
}

/// A two-phase tool's settings (`adapter.phases`): the tool's own call prepares and
/// answers a commit token, which the gateway keeps; `commit` or `rollback` is called
/// later with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Phases {
    pub commit: PhaseCall,
    pub rollback: PhaseCall,
    /// How long after a successful prepare the caller may commit; then the gateway
    /// rolls back.
    pub commit_within_s: u64,
    /// The top-level field of the prepare answer holding the commit token; it is
    /// removed from the output before anything else sees it.
    pub token_field: String,
    /// How many times a commit or rollback is tried when the upstream is down.
    pub max_attempts: u32,
    /// The deadline of one commit or rollback attempt.
    pub timeout_ms: u64,
    /// The confinement of `argv` phase calls: `phases.sandbox`, else the adapter's.
    pub sandbox: Option<Sandbox>,
}

/// Where a phase call goes: a URL (JSON POST; hosts of the adapter's allowlist) or a
/// program (argv; the token as JSON on stdin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseCall {
    Url(String),
    Argv(Vec<String>),
}

/// Default `phases.token_field`.
pub const DEFAULT_TOKEN_FIELD: &str = "commit_token";
/// Default `phases.max_attempts`.
pub const DEFAULT_PHASE_ATTEMPTS: u32 = 3;
/// Default `phases.timeout_ms`.
pub const DEFAULT_PHASE_TIMEOUT_MS: u64 = 10_000;

/// An entry of the registry's `servers:` section, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    pub server_id: String,
    /// Exactly one of `command` and `url` is set.
    pub command: Option<Vec<String>>,
    pub url: Option<String>,
    pub max_concurrency: u32,
    /// The confinement of a `command` server's process (Some exactly then).
    pub sandbox: Option<Sandbox>,
    /// A stdio server's environment beyond the cleared one: fixed values and
    /// `${secret:ID}` references.
    pub env: BTreeMap<String, String>,
    /// Headers of every request to a Streamable HTTP server (fixed or `${secret:ID}`).
    pub headers: BTreeMap<String, String>,
    /// The credential, CA and proxy of a Streamable HTTP server.
    pub outbound: OutboundSettings,
}

/// Requests in flight on one MCP server's session when its entry does not say.
pub const DEFAULT_SERVER_CONCURRENCY: u32 = 16;

#[derive(Debug, Clone)]
pub struct Tool {
    pub tool_name: String,
    pub description: String,
    pub enabled: bool,
    pub version: semver::Version,
    pub determinism: Determinism,
    pub idempotent: bool,
    pub timeout_default_ms: u64,
    pub limits: Limits,
    /// Sorted.
    pub allowed_lanes: Vec<String>,
    /// Sorted.
    pub required_scope_keys: Vec<String>,
    /// Sorted.
    pub prohibited_flags: Vec<String>,
    /// Rules that raise flags from arguments (see `FlagRule`).
    pub flag_rules: Vec<FlagRule>,
    /// CEL conditions every call of this tool must satisfy (step 8), in file order.
    pub conditions: Vec<Condition>,
    /// Human approval every call of this tool needs (or, with `when`, some calls).
    pub approval: Option<Approval>,
    /// Where the tool writes (empty for read-only tools), e.g. `data:drafts/{case_id}`.
    pub write_targets: Vec<String>,
    pub adapter: AdapterConfig,
    /// Two-phase execution (prepare, then commit or rollback), from `adapter.phases`.
    pub phases: Option<Phases>,
    /// `budget` and `rate`: counted at admission (step 8).
    pub call_limits: CallLimits,
    pub redaction: Redaction,
    pub input_schema: Arc<Value>,
    pub output_schema: Arc<Value>,
    /// Compiled validators for the two schemas.
    pub input_validator: Arc<jsonschema::Validator>,
    pub output_validator: Arc<jsonschema::Validator>,
}

/// The confinement of a local tool process (a `command` tool, a command phase, a stdio
/// MCP server): the `sandbox:` block, or the strict default profile when it is absent.
///
/// INVARIANT: `Unconfined` only ever comes from an explicit `sandbox: {unconfined:
/// "reason"}` with a non-empty reason; every other profile's paths are absolute,
/// existing, free of `..` and symlinks, and its limits are within
/// [`SandboxLimits::BOUNDS`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sandbox {
    Confined(SandboxProfile),
    Unconfined { reason: String },
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::Confined(SandboxProfile::default())
    }
}

/// A confined profile as the policy gives it; `sandbox::Plan` adds what every tool gets
/// (its program and interpreter, the system's library and certificate directories,
/// its working directory, the per-call scratch directory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SandboxProfile {
    /// Whether the registry wrote a `sandbox:` block (false: the default profile).
    pub given: bool,
    /// Paths the tool may also read (files and directories beneath).
    pub read: Vec<SandboxPath>,
    /// Paths the tool may also write (create, change, remove beneath).
    pub write: Vec<SandboxPath>,
    /// Paths the tool may also execute programs from (and read).
    pub exec: Vec<SandboxPath>,
    pub network: SandboxNetwork,
    pub limits: SandboxLimits,
}

/// One path of a profile: absolute, checked at load; where it was written, so that a
/// later check (the data directory, other tools' directories) can point at it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct SandboxPath {
    pub path: std::path::PathBuf,
    #[serde(skip)]
    pub line: usize,
    #[serde(skip)]
    pub column: usize,
}

/// What the tool may reach over the network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxNetwork {
    /// Nothing (the default): an empty network namespace, or a seccomp filter allowing
    /// only Unix sockets.
    #[default]
    None,
    /// TCP connections to these ports on any host (Landlock), sorted.
    Ports(Vec<u16>),
    /// These `host:port`s only, through the per-call egress proxy, sorted.
    Connect(Vec<String>),
}

/// Resource limits of a confined process (rlimits; `memory_mb` is address space).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SandboxLimits {
    /// CPU seconds (RLIMIT_CPU): past it the kernel signals SIGXCPU.
    pub cpu_s: u64,
    /// Address space in MiB (RLIMIT_AS; with cgroups v1 only, not resident memory).
    pub memory_mb: u64,
    /// Processes and threads (RLIMIT_NPROC).
    pub processes: u64,
    /// Open file descriptors (RLIMIT_NOFILE).
    pub open_files: u64,
    /// Largest file the tool may write, MiB (RLIMIT_FSIZE): past it SIGXFSZ.
    pub file_size_mb: u64,
}

impl SandboxLimits {
    /// The least and the most each limit may be set to, by field name.
    pub const BOUNDS: [(&'static str, u64, u64); 5] = [
        ("cpu_s", 1, 86_400),
        ("memory_mb", 64, 1_048_576),
        ("processes", 1, 65_536),
        ("open_files", 16, 1_048_576),
        ("file_size_mb", 1, 1_048_576),
    ];

    /// The limits by field name, in [`SandboxLimits::BOUNDS`] order.
    pub fn fields(&self) -> [(&'static str, u64); 5] {
        [
            ("cpu_s", self.cpu_s),
            ("memory_mb", self.memory_mb),
            ("processes", self.processes),
            ("open_files", self.open_files),
            ("file_size_mb", self.file_size_mb),
        ]
    }
}

impl Default for SandboxLimits {
    /// Measured so that Python 3 and Node.js start and run a small tool under them
    /// (docs/policy.md, "sandbox"): Node reserves about 1 GiB of address space at start.
    fn default() -> Self {
        SandboxLimits {
            cpu_s: 30,
            memory_mb: 2048,
            processes: 64,
            open_files: 256,
            file_size_mb: 64,
        }
    }
}
