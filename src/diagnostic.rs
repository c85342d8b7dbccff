//! The diagnostic catalog: every way a call can fail, with its stable reason code.
//!
//! A refusal anywhere in the gateway is a [`Reason`] plus a message and details. The
//! catalog ([`Reason::info`]) is the one exhaustive match that gives each reason its
//! contract error code, category, pipeline step, retryability, severity, meaning and
//! fix. `contract/diagnostics.json` is generated from it and checked by a test, so the
//! published catalog cannot drift from the code.
//!
//! This module knows nothing of HTTP; the server maps a diagnostic to a status code.

use serde::Serialize;
use serde_json::Value;

/// The six standard error codes of the tool gateway contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ErrorCode {
    #[serde(rename = "TOOL_NOT_IMPLEMENTED")]
    NotImplemented,
    #[serde(rename = "TOOL_DENIED")]
    Denied,
    #[serde(rename = "TOOL_INVALID_ARGUMENTS")]
    InvalidArguments,
    #[serde(rename = "TOOL_TIMEOUT")]
    Timeout,
    #[serde(rename = "TOOL_DEPENDENCY_DOWN")]
    DependencyDown,
    #[serde(rename = "TOOL_INTERNAL_ERROR")]
    InternalError,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotImplemented => "TOOL_NOT_IMPLEMENTED",
            ErrorCode::Denied => "TOOL_DENIED",
            ErrorCode::InvalidArguments => "TOOL_INVALID_ARGUMENTS",
            ErrorCode::Timeout => "TOOL_TIMEOUT",
            ErrorCode::DependencyDown => "TOOL_DEPENDENCY_DOWN",
            ErrorCode::InternalError => "TOOL_INTERNAL_ERROR",
        }
    }
}

/// Coarse grouping for dashboards and for agents deciding what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Request,
    Authentication,
    Authorization,
    Run,
    Scope,
    Prohibition,
    Arguments,
    Capacity,
    Idempotency,
    Execution,
    Dependency,
    Timeout,
    Output,
    Audit,
    Safety,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Error,
    Critical,
}

/// Every stable reason sub-code. Adding one forces an entry in [`Reason::info`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    RequestMalformed,
    ProtocolVersionUnsupported,
    OriginNotAllowed,
    AcceptUnsupported,
    BatchUnsupported,
    RequestTooLarge,
    EndpointNotFound,
    ArtifactNotFound,
    MethodNotAllowed,
    RateLimited,
    AuditCapacityExhausted,
    SafetyLockEngaged,
    CredentialMissing,
    CredentialInvalid,
    CredentialExpired,
    RunTokenRequired,
    CredentialNotForRun,
    JwtMalformed,
    JwtExpired,
    JwtNotYetValid,
    JwtIssuerMismatch,
    JwtAudienceMismatch,
    JwtUnknownKid,
    JwtAlgorithmRefused,
    JwtSignatureInvalid,
    JwksUnavailable,
    RoleUnknown,
    RoleDisabled,
    RunNotFound,
    PolicyVersionMismatch,
    LaneUnknown,
    LaneNotAllowedForRole,
    RunNotActive,
    ToolUnregistered,
    ToolDisabled,
    ToolNotAllowedInLane,
    ScopeKeyMissing,
    ScopeConflictsWithRun,
    ArgumentsInvalid,
    ArgumentUnsafe,
    ProhibitedFlag,
    ConditionFailed,
    IdempotencyConflict,
    AuditUnavailable,
    ConcurrencyLimitReached,
    AdapterNotImplemented,
    ToolTimeout,
    Cancelled,
    DependencyDown,
    ToolError,
    OutputSchemaViolation,
    ArtifactStoreFailed,
    PolicyUnavailable,
    PolicyInvalid,
    InternalError,
    ClusterUnavailable,
    SafetyLockUnconfirmed,
    IdempotencyInFlight,
}

/// The catalog entry of one reason.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ReasonInfo {
    pub error_code: ErrorCode,
    pub category: Category,
    /// The pipeline step (1-13) at which this reason stops a call.
    pub step: u8,
    pub retryable: bool,
    pub severity: Severity,
    /// What the reason means, one line.
    pub meaning: &'static str,
    /// The most likely cause, for the caller.
    pub likely_cause: &'static str,
    /// What to do about it.
    pub suggested_fix: &'static str,
}

impl Reason {
    /// Every reason, in catalog order.
    pub const ALL: [Reason; 58] = [
        Reason::RequestMalformed,
        Reason::ProtocolVersionUnsupported,
        Reason::OriginNotAllowed,
        Reason::AcceptUnsupported,
        Reason::BatchUnsupported,
        Reason::RequestTooLarge,
        Reason::EndpointNotFound,
        Reason::ArtifactNotFound,
        Reason::MethodNotAllowed,
        Reason::RateLimited,
        Reason::AuditCapacityExhausted,
        Reason::SafetyLockEngaged,
        Reason::CredentialMissing,
        Reason::CredentialInvalid,
        Reason::CredentialExpired,
        Reason::RunTokenRequired,
        Reason::CredentialNotForRun,
        Reason::JwtMalformed,
        Reason::JwtExpired,
        Reason::JwtNotYetValid,
        Reason::JwtIssuerMismatch,
        Reason::JwtAudienceMismatch,
        Reason::JwtUnknownKid,
        Reason::JwtAlgorithmRefused,
        Reason::JwtSignatureInvalid,
        Reason::JwksUnavailable,
        Reason::RoleUnknown,
        Reason::RoleDisabled,
        Reason::RunNotFound,
        Reason::PolicyVersionMismatch,
        Reason::LaneUnknown,
        Reason::LaneNotAllowedForRole,
        Reason::RunNotActive,
        Reason::ToolUnregistered,
        Reason::ToolDisabled,
        Reason::ToolNotAllowedInLane,
        Reason::ScopeKeyMissing,
        Reason::ScopeConflictsWithRun,
        Reason::ArgumentsInvalid,
        Reason::ArgumentUnsafe,
        Reason::ProhibitedFlag,
        Reason::ConditionFailed,
        Reason::IdempotencyConflict,
        Reason::AuditUnavailable,
        Reason::ConcurrencyLimitReached,
        Reason::AdapterNotImplemented,
        Reason::ToolTimeout,
        Reason::Cancelled,
        Reason::DependencyDown,
        Reason::ToolError,
        Reason::OutputSchemaViolation,
        Reason::ArtifactStoreFailed,
        Reason::PolicyUnavailable,
        Reason::PolicyInvalid,
        Reason::InternalError,
        Reason::ClusterUnavailable,
        Reason::SafetyLockUnconfirmed,
        Reason::IdempotencyInFlight,
    ];

    /// The stable snake_case code, as it appears in responses and the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RequestMalformed => "request_malformed",
            Reason::ProtocolVersionUnsupported => "protocol_version_unsupported",
            Reason::OriginNotAllowed => "origin_not_allowed",
            Reason::AcceptUnsupported => "accept_unsupported",
            Reason::BatchUnsupported => "batch_unsupported",
            Reason::RequestTooLarge => "request_too_large",
            Reason::EndpointNotFound => "endpoint_not_found",
            Reason::ArtifactNotFound => "artifact_not_found",
            Reason::MethodNotAllowed => "method_not_allowed",
            Reason::RateLimited => "rate_limited",
            Reason::AuditCapacityExhausted => "audit_capacity_exhausted",
            Reason::SafetyLockEngaged => "safety_lock_engaged",
            Reason::ClusterUnavailable => "cluster_unavailable",
            Reason::SafetyLockUnconfirmed => "safety_lock_unconfirmed",
            Reason::IdempotencyInFlight => "idempotency_in_flight",
            Reason::CredentialMissing => "credential_missing",
            Reason::CredentialInvalid => "credential_invalid",
            Reason::CredentialExpired => "credential_expired",
            Reason::RunTokenRequired => "run_token_required",
            Reason::CredentialNotForRun => "credential_not_for_run",
            Reason::JwtMalformed => "jwt_malformed",
            Reason::JwtExpired => "jwt_expired",
            Reason::JwtNotYetValid => "jwt_not_yet_valid",
            Reason::JwtIssuerMismatch => "jwt_issuer_mismatch",
            Reason::JwtAudienceMismatch => "jwt_audience_mismatch",
            Reason::JwtUnknownKid => "jwt_unknown_kid",
            Reason::JwtAlgorithmRefused => "jwt_algorithm_refused",
            Reason::JwtSignatureInvalid => "jwt_signature_invalid",
            Reason::JwksUnavailable => "jwks_unavailable",
            Reason::RoleUnknown => "role_unknown",
            Reason::RoleDisabled => "role_disabled",
            Reason::RunNotFound => "run_not_found",
            Reason::PolicyVersionMismatch => "policy_version_mismatch",
            Reason::LaneUnknown => "lane_unknown",
            Reason::LaneNotAllowedForRole => "lane_not_allowed_for_role",
            Reason::RunNotActive => "run_not_active",
            Reason::ToolUnregistered => "tool_unregistered",
            Reason::ToolDisabled => "tool_disabled",
            Reason::ToolNotAllowedInLane => "tool_not_allowed_in_lane",
            Reason::ScopeKeyMissing => "scope_key_missing",
            Reason::ScopeConflictsWithRun => "scope_conflicts_with_run",
            Reason::ArgumentsInvalid => "arguments_invalid",
            Reason::ArgumentUnsafe => "argument_unsafe",
            Reason::ProhibitedFlag => "prohibited_flag",
            Reason::ConditionFailed => "condition_failed",
            Reason::IdempotencyConflict => "idempotency_conflict",
            Reason::AuditUnavailable => "audit_unavailable",
            Reason::ConcurrencyLimitReached => "concurrency_limit_reached",
            Reason::AdapterNotImplemented => "adapter_not_implemented",
            Reason::ToolTimeout => "tool_timeout",
            Reason::Cancelled => "cancelled",
            Reason::DependencyDown => "dependency_down",
            Reason::ToolError => "tool_error",
            Reason::OutputSchemaViolation => "output_schema_violation",
            Reason::ArtifactStoreFailed => "artifact_store_failed",
            Reason::PolicyUnavailable => "policy_unavailable",
            Reason::PolicyInvalid => "policy_invalid",
            Reason::InternalError => "internal_error",
        }
    }

    /// The catalog: the one place that says what each reason means.
    pub fn info(self) -> ReasonInfo {
        use Category as C;
        use ErrorCode as E;
        use Severity as S;
        let (error_code, category, step, retryable, severity, meaning, likely_cause, suggested_fix) =
            match self {
                Reason::ProtocolVersionUnsupported => (
                    E::InvalidArguments,
                    C::Request,
                    1,
                    false,
                    S::Error,
                    "the MCP-Protocol-Version header names a protocol revision the MCP front does not speak",
                    "an old client (2024-11-05 or 2025-03-26) or a mistyped version",
                    "send one of the versions listed in details.supported (or upgrade the MCP client)",
                ),
                Reason::OriginNotAllowed => (
                    E::Denied,
                    C::Request,
                    1,
                    false,
                    S::Error,
                    "the request's Origin is not in the MCP front's allowlist",
                    "a browser page from another site, or a DNS rebinding attempt",
                    "connect from an allowed origin, or add it to TOOLGATE_MCP_ALLOWED_ORIGINS",
                ),
                Reason::AcceptUnsupported => (
                    E::InvalidArguments,
                    C::Request,
                    1,
                    false,
                    S::Error,
                    "the Accept header of an MCP POST must list both application/json and text/event-stream",
                    "a client that is not a Streamable HTTP client",
                    "send Accept: application/json, text/event-stream",
                ),
                Reason::BatchUnsupported => (
                    E::InvalidArguments,
                    C::Request,
                    1,
                    false,
                    S::Error,
                    "the body is a JSON-RPC batch, which MCP (since 2025-06-18) does not allow",
                    "several messages sent in one JSON array",
                    "send one JSON-RPC message per POST",
                ),
                Reason::RequestMalformed => (
                    E::InvalidArguments,
                    C::Request,
                    1,
                    false,
                    S::Error,
                    "the request body is not a valid tool-call request",
                    "the body is not JSON, misses a required field, has a field of the wrong type or an unknown field",
                    "send a JSON object with role_id, run_id, lane_id, tool_name, arguments and scope; see details.problems",
                ),
                Reason::RequestTooLarge => (
                    E::InvalidArguments,
                    C::Request,
                    1,
                    false,
                    S::Error,
                    "the request body is larger than the gateway accepts",
                    "arguments carry a whole document or file instead of a reference to it",
                    "send a reference (a path or an id) instead of the content, or raise --max-body-bytes",
                ),
                Reason::EndpointNotFound => (
                    E::InvalidArguments,
                    C::Request,
                    1,
                    false,
                    S::Error,
                    "no endpoint has this method and path",
                    "a typo in the path, or the wrong HTTP method",
                    "see docs/api.md for the endpoints",
                ),
                Reason::ArtifactNotFound => (
                    E::Denied,
                    C::Authorization,
                    1,
                    false,
                    S::Error,
                    "no artifact with this sha256 was produced in the named run by a lane the role may act in",
                    "a wrong hash or run id, or the artifact belongs to another run (the two are answered alike)",
                    "fetch artifacts through the run and role whose call produced them: ?run_id=...&role_id=...",
                ),
                Reason::MethodNotAllowed => (
                    E::InvalidArguments,
                    C::Request,
                    1,
                    false,
                    S::Error,
                    "the endpoint exists but does not serve this method",
                    "a client used the wrong HTTP method for the endpoint",
                    "use one of the methods in the `Allow` header (also in details.allow)",
                ),
                Reason::RateLimited => (
                    E::Denied,
                    C::Capacity,
                    1,
                    true,
                    S::Warning,
                    "the client is over its connection or request-rate limit",
                    "too many connections or requests from this client address at once",
                    "retry after the Retry-After header (details.retry_after_ms); reuse one connection instead of opening many",
                ),
                Reason::AuditCapacityExhausted => (
                    E::InternalError,
                    C::Audit,
                    1,
                    true,
                    S::Critical,
                    "the audit log is close to its size cap or the disk to its free-space floor, so new calls are refused",
                    "the audit database reached --max-audit-bytes, or the disk holding it is nearly full",
                    "retry later; operators: archive or move the audit database, free disk space, or raise --max-audit-bytes (see /metrics toolgate_audit_headroom_bytes)",
                ),
                Reason::SafetyLockEngaged => (
                    E::Denied,
                    C::Safety,
                    1,
                    false,
                    S::Critical,
                    "the safety lock is engaged: no tool call is executed",
                    "an operator engaged the lock (see details.lock_reason)",
                    "wait for an operator to release the lock (POST /v1/safety-lock with engaged=false)",
                ),
                Reason::ClusterUnavailable => (
                    E::InternalError,
                    C::Dependency,
                    1,
                    true,
                    S::Critical,
                    "the fleet's cluster database (serve --cluster-db) could not be used, so the call was refused",
                    "PostgreSQL is down, unreachable, slower than the query timeout, or refused the query",
                    "retry with backoff; operators: check the cluster database and the sidecar's connection to it",
                ),
                Reason::SafetyLockUnconfirmed => (
                    E::Denied,
                    C::Safety,
                    1,
                    true,
                    S::Critical,
                    "the safety lock's state could not be confirmed from the cluster database within its bound, so it is treated as engaged",
                    "the cluster database is down or unreachable from this sidecar",
                    "retry later; operators: check the cluster database (docs/deployment.md)",
                ),
                Reason::IdempotencyInFlight => (
                    E::Denied,
                    C::Idempotency,
                    9,
                    true,
                    S::Warning,
                    "the first call with this idempotency key is still running on a sidecar of the fleet, past the wait bound",
                    "a slow first call, or a sidecar that stopped while running it (its claim stays until an operator clears it)",
                    "retry later with the same key; operators: see docs/operations.md (stale idempotency claims)",
                ),
                Reason::CredentialMissing => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the request carries no credential",
                    "the Authorization header is missing or is not `Bearer <token>`",
                    "send `Authorization: Bearer <token>` with the token issued for the role",
                ),
                Reason::CredentialInvalid => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the credential does not prove the claimed role",
                    "the token belongs to another role, was rotated, or is mistyped",
                    "use the token issued for this role_id",
                ),
                Reason::CredentialExpired => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the run token is no longer valid: it expired, was revoked, or its run closed",
                    "the token's ttl_s passed, an admin revoked it, or the run it is bound to was closed",
                    "ask the orchestrator for a new run token (POST /v1/runs with issue_tokens) for an open run",
                ),
                Reason::RunTokenRequired => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the role accepts only run tokens; its static credential cannot call tools",
                    "the role sets `credential: {run_tokens_only: true}` and the call used the role's static token",
                    "call with a run token issued for this role when its run was created (issue_tokens)",
                ),
                Reason::CredentialNotForRun => (
                    E::Denied,
                    C::Run,
                    3,
                    false,
                    S::Error,
                    "the run token is bound to another run than the one named in the request",
                    "a token issued for one run was used to act in another run",
                    "omit run_id (the token names its run) or use a token issued for this run",
                ),
                Reason::JwtMalformed => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the bearer JWT cannot be read: too large, not three base64url parts, not JSON, or a required claim is missing or mistyped",
                    "a truncated or corrupted token, a token over 8 KiB, or a token without `exp`/`iss`",
                    "send the token exactly as the identity provider issued it; see details and message",
                ),
                Reason::JwtExpired => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the JWT's `exp` has passed (beyond the provider's leeway)",
                    "the workload kept an old token; projected service-account tokens and IdP tokens are short-lived",
                    "fetch a fresh token from the identity provider (re-read the projected token file)",
                ),
                Reason::JwtNotYetValid => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the JWT's `nbf` or `iat` is in the future (beyond the provider's leeway)",
                    "the issuer's or toolgate's clock is wrong",
                    "synchronize the clocks (NTP), or raise the provider's `leeway_s` (at most 300)",
                ),
                Reason::JwtIssuerMismatch => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "no identity provider in roles.yaml has the JWT's `iss`",
                    "a token from another issuer, or the provider's `issuer` differs from the token's (trailing slash, scheme)",
                    "declare the issuer in `identity_providers` with the exact `iss` string, or use a token from a declared issuer",
                ),
                Reason::JwtAudienceMismatch => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the JWT's `aud` names neither the provider's `audience` nor this server's MCP resource URI",
                    "a token minted for another service was replayed here",
                    "request the token for this server's audience (details.expected_audience)",
                ),
                Reason::JwtUnknownKid => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the JWT names a signing key (`kid`) the provider's key set does not publish, or names none",
                    "the issuer rotated to a key not yet fetched (toolgate refetches at most once per `jwks_cooldown_s`), or the token was signed by someone else",
                    "retry after the provider's jwks_cooldown_s; if it persists, check the token's issuer and the provider's jwks_uri",
                ),
                Reason::JwtAlgorithmRefused => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the JWT's `alg` is not accepted: `none`, an HMAC algorithm, one the provider does not list, or one the named key is not for",
                    "an unsigned or HMAC-signed token (e.g. HS256 keyed with the public key), or a provider `algorithms` list that misses the issuer's",
                    "sign with an asymmetric algorithm listed in the provider's `algorithms` (RS256, ES256, EdDSA, ...)",
                ),
                Reason::JwtSignatureInvalid => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the JWT's signature does not verify with the key it names",
                    "the token was altered after signing, or signed with another key under the same kid",
                    "use the token exactly as issued; check that the issuer publishes the key it signs with",
                ),
                Reason::JwksUnavailable => (
                    E::DependencyDown,
                    C::Authentication,
                    2,
                    true,
                    S::Critical,
                    "no signing key of the token's identity provider can be had: the key set could not be fetched and none is cached",
                    "the jwks_uri is unreachable, slow, too large, not JSON or has no usable key; or jwks_file is unreadable",
                    "retry later; operators: check the provider's jwks_uri from toolgate's host (see logs `jwks fetch failed`)",
                ),
                Reason::RoleUnknown => (
                    E::Denied,
                    C::Authentication,
                    2,
                    false,
                    S::Error,
                    "the role_id is not defined in policy/roles.yaml",
                    "a typo in role_id, or the role was removed from the policy",
                    "use a role_id from policy/roles.yaml",
                ),
                Reason::RoleDisabled => (
                    E::Denied,
                    C::Authorization,
                    2,
                    false,
                    S::Error,
                    "the role is disabled in policy/roles.yaml",
                    "the role was switched off by a policy change",
                    "ask a policy owner to enable the role, or use another role",
                ),
                Reason::RunNotFound => (
                    E::Denied,
                    C::Run,
                    3,
                    false,
                    S::Error,
                    "the run_id names no run",
                    "the run was never created, or the run_id is mistyped",
                    "create the run first (POST /v1/runs) and use the run_id it returns",
                ),
                Reason::PolicyVersionMismatch => (
                    E::Denied,
                    C::Run,
                    3,
                    false,
                    S::Error,
                    "the run is pinned to policy versions other than the loaded ones",
                    "the policy was changed or reloaded after the run started",
                    "start a new run under the current policy, or reload the policy the run was created under",
                ),
                Reason::LaneUnknown => (
                    E::Denied,
                    C::Authorization,
                    4,
                    false,
                    S::Error,
                    "the lane_id is not defined in policy/lanes.yaml",
                    "a typo in lane_id, or the lane was removed from the policy",
                    "use a lane_id from policy/lanes.yaml",
                ),
                Reason::LaneNotAllowedForRole => (
                    E::Denied,
                    C::Authorization,
                    4,
                    false,
                    S::Error,
                    "the role may not act in this lane",
                    "the agent is working outside its stage of work",
                    "call the tool from a role that lists this lane, or hand the work to that role",
                ),
                Reason::RunNotActive => (
                    E::Denied,
                    C::Run,
                    4,
                    false,
                    S::Error,
                    "the run's status does not allow this lane to act",
                    "the run was suspended or closed by an operator",
                    "ask an operator to reactivate the run (POST /v1/runs/{run_id}/status), or start a new run",
                ),
                Reason::ToolUnregistered => (
                    E::Denied,
                    C::Authorization,
                    5,
                    false,
                    S::Error,
                    "the tool_name is not in tools/tool_registry.yaml",
                    "a typo in tool_name, or the tool was never registered",
                    "use a tool listed by GET /v1/tools, or register the tool",
                ),
                Reason::ToolDisabled => (
                    E::Denied,
                    C::Authorization,
                    5,
                    false,
                    S::Error,
                    "the tool is registered but disabled",
                    "the tool was switched off by a policy change",
                    "use another tool, or ask a policy owner to enable it",
                ),
                Reason::ToolNotAllowedInLane => (
                    E::Denied,
                    C::Authorization,
                    6,
                    false,
                    S::Error,
                    "the lane's allowlist does not include this tool",
                    "the tool belongs to another stage of work",
                    "call the tool from a lane that allowlists it (GET /v1/tools?role_id=&lane_id=)",
                ),
                Reason::ScopeKeyMissing => (
                    E::Denied,
                    C::Scope,
                    7,
                    false,
                    S::Error,
                    "a scope key the lane or the tool requires is missing",
                    "the caller did not pass the case or matter the call is about",
                    "add the keys listed in details.missing to scope",
                ),
                Reason::ScopeConflictsWithRun => (
                    E::Denied,
                    C::Scope,
                    7,
                    false,
                    S::Error,
                    "the call's scope contradicts the scope its run is bound to",
                    "the run was created for another case or matter",
                    "use the run created for this scope, or create one",
                ),
                Reason::ArgumentsInvalid => (
                    E::InvalidArguments,
                    C::Arguments,
                    8,
                    false,
                    S::Error,
                    "the arguments do not match the tool's input schema",
                    "a missing, extra or mistyped argument",
                    "fix each violation listed in details.violations (JSON pointer and message)",
                ),
                Reason::ArgumentUnsafe => (
                    E::InvalidArguments,
                    C::Arguments,
                    8,
                    false,
                    S::Error,
                    "an argument failed sanitization (path traversal, shell metacharacters, or a URL outside the allowlist)",
                    "the arguments try to reach outside what the tool may touch",
                    "pass a path relative to the tool's root, plain values, and only allowlisted hosts",
                ),
                Reason::ProhibitedFlag => (
                    E::Denied,
                    C::Prohibition,
                    8,
                    false,
                    S::Warning,
                    "the call carries a flag the lane or the tool prohibits",
                    "the call targets a class of resource forbidden here (for example a privileged document, or a sealed case)",
                    "do not perform this action in this lane; see details.flag and details.prohibited_by",
                ),
                Reason::ConditionFailed => (
                    E::Denied,
                    C::Prohibition,
                    8,
                    false,
                    S::Warning,
                    "a condition of the lane or the tool did not hold for this call (false, or it could not be evaluated)",
                    "the arguments or the scope are outside what the condition allows, for example another case than the run's",
                    "see details.condition and details.condition_message; change the arguments or scope to satisfy it, or use a run for that scope",
                ),
                Reason::IdempotencyConflict => (
                    E::Denied,
                    C::Idempotency,
                    9,
                    false,
                    S::Error,
                    "the idempotency_key was already used with different arguments",
                    "the caller reuses keys across different calls",
                    "use a fresh idempotency_key for a different call",
                ),
                Reason::AuditUnavailable => (
                    E::InternalError,
                    C::Audit,
                    9,
                    true,
                    S::Critical,
                    "the audit log could not record the call, so the call was refused",
                    "the audit database is unwritable, locked, corrupt, or the disk is full",
                    "retry later; operators: check the data directory and `toolgate audit verify`",
                ),
                Reason::ConcurrencyLimitReached => (
                    E::Denied,
                    C::Capacity,
                    10,
                    true,
                    S::Warning,
                    "the tool is already running at its max_concurrency",
                    "too many concurrent calls to this tool",
                    "retry after details.retry_after_ms",
                ),
                Reason::AdapterNotImplemented => (
                    E::NotImplemented,
                    C::Execution,
                    10,
                    false,
                    S::Error,
                    "the tool's adapter is not available in this build",
                    "the registry names an adapter kind or builtin this gateway does not have",
                    "fix the tool's adapter in tools/tool_registry.yaml",
                ),
                Reason::Cancelled => (
                    E::InternalError,
                    C::Execution,
                    10,
                    false,
                    S::Warning,
                    "the caller cancelled the call (MCP notifications/cancelled or a dropped connection) and its execution was stopped",
                    "the client gave up on the call",
                    "nothing to fix; call again if the result is still wanted (an idempotency key of a cancelled call is released)",
                ),
                Reason::ToolTimeout => (
                    E::Timeout,
                    C::Timeout,
                    10,
                    false,
                    S::Error,
                    "the tool did not finish before its deadline and was terminated",
                    "the tool is slow or hung, or timeout_ms is too small",
                    "retry with a larger timeout_ms (up to the tool's timeout_ms_max) if the tool is idempotent",
                ),
                Reason::DependencyDown => (
                    E::DependencyDown,
                    C::Dependency,
                    10,
                    true,
                    S::Error,
                    "the tool's upstream could not be reached",
                    "the upstream service is down or refused the connection",
                    "retry with backoff only when diagnostic.retryable is true (details.reached_tool is false: nothing was sent; or the tool is idempotent and the call carries an idempotency_key); otherwise first check whether the call took effect; operators: check the upstream",
                ),
                Reason::ToolError => (
                    E::InternalError,
                    C::Execution,
                    10,
                    false,
                    S::Error,
                    "the tool ran and reported an error",
                    "the tool could not do what was asked (see details.tool_error)",
                    "read details.tool_error; fix the arguments or report to the tool owner",
                ),
                Reason::OutputSchemaViolation => (
                    E::InternalError,
                    C::Output,
                    11,
                    false,
                    S::Error,
                    "the tool's output does not match its output schema, so it was withheld",
                    "the tool and its registered output schema disagree",
                    "report to the tool owner; see details.violations",
                ),
                Reason::ArtifactStoreFailed => (
                    E::InternalError,
                    C::Output,
                    11,
                    true,
                    S::Error,
                    "a large output could not be stored as an artifact",
                    "the data directory is unwritable or full",
                    "retry later; operators: check the data directory",
                ),
                Reason::PolicyUnavailable => (
                    E::InternalError,
                    C::Authorization,
                    1,
                    true,
                    S::Critical,
                    "no valid policy is loaded",
                    "the policy failed to load",
                    "operators: run `toolgate policy check` and fix the reported problems",
                ),
                Reason::PolicyInvalid => (
                    E::InvalidArguments,
                    C::Request,
                    1,
                    false,
                    S::Error,
                    "a candidate policy failed to load, so the current policy stays in force",
                    "the edited policy files have errors (see details.problems)",
                    "run `toolgate policy check`, fix every problem, and reload again",
                ),
                Reason::InternalError => (
                    E::InternalError,
                    C::Execution,
                    13,
                    false,
                    S::Critical,
                    "the gateway hit an internal error and refused the call",
                    "a defect in toolgate",
                    "report it with the call_id",
                ),
            };
        ReasonInfo {
            error_code,
            category,
            step,
            retryable,
            severity,
            meaning,
            likely_cause,
            suggested_fix,
        }
    }
}

/// A refusal or failure of one call: the reason, a specific message, and details a
/// machine can act on (missing keys, schema violations, retry-after, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub reason: Reason,
    /// One line, lowercase, user input in backticks.
    pub message: String,
    /// A JSON object with reason-specific details; `{}` when there are none.
    pub details: Value,
    /// Overrides the catalog's retryable flag (a timeout is retryable only for an
    /// idempotent tool).
    pub retryable: Option<bool>,
    /// Overrides the catalog's step (an audit failure at step 12 instead of 9).
    pub step: Option<u8>,
}

impl Refusal {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Refusal {
            reason,
            message: message.into(),
            details: Value::Object(Default::default()),
            retryable: None,
            step: None,
        }
    }

    pub fn at_step(mut self, step: u8) -> Self {
        self.step = Some(step);
        self
    }

    /// The pipeline step at which this refusal stopped the call.
    pub fn step(&self) -> u8 {
        self.step.unwrap_or(self.reason.info().step)
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = Some(retryable);
        self
    }

    /// The structured diagnostic block returned to the caller and kept in the audit log.
    pub fn diagnostic(&self) -> Diagnostic {
        let info = self.reason.info();
        Diagnostic {
            error_code: info.error_code,
            category: info.category,
            reason: self.reason,
            failed_step: self.step(),
            message: self.message.clone(),
            likely_cause: info.likely_cause,
            suggested_fix: info.suggested_fix,
            retryable: self.retryable.unwrap_or(info.retryable),
            severity: info.severity,
            details: self.details.clone(),
        }
    }
}

/// The diagnostic block of the contract (plus reason, failed_step and details).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnostic {
    pub error_code: ErrorCode,
    pub category: Category,
    pub reason: Reason,
    pub failed_step: u8,
    pub message: String,
    pub likely_cause: &'static str,
    pub suggested_fix: &'static str,
    pub retryable: bool,
    pub severity: Severity,
    pub details: Value,
}

/// The whole catalog as JSON, in catalog order; `contract/diagnostics.json` holds it.
pub fn catalog_json() -> Value {
    let reasons: Vec<Value> = Reason::ALL
        .iter()
        .map(|r| {
            let info = r.info();
            serde_json::json!({
                "reason": r.as_str(),
                "error_code": info.error_code,
                "category": info.category,
                "failed_step": info.step,
                "retryable": info.retryable,
                "severity": info.severity,
                "meaning": info.meaning,
                "likely_cause": info.likely_cause,
                "suggested_fix": info.suggested_fix,
            })
        })
        .collect();
    serde_json::json!({ "contract_version": crate::CONTRACT_VERSION, "reasons": reasons })
}
