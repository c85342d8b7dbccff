//! The diagnostic catalog: every way a call can fail, with its stable reason code.
//!
//! A refusal anywhere in the gateway is a [`Reason`] plus a message and details. The
//! catalog is one table (the `reasons!` rows) that gives each reason its stable code,
//! contract error code, category, pipeline step, retryability, severity, meaning and
//! fix; the enum, [`Reason::ALL`], [`Reason::as_str`] and [`Reason::info`] are
//! generated from it. `contract/diagnostics.json` is generated from the catalog and
//! checked by a test, so the published catalog cannot drift from the code.
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
    /// Human approval of a call (approval_required and the decisions).
    Approval,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Error,
    Critical,
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

/// The catalog as one table, one row per reason in catalog order: the variant, its
/// stable snake_case code, then its error code, category, step, retryability,
/// severity, meaning, likely cause and suggested fix. The macro generates [`Reason`],
/// [`Reason::ALL`], [`Reason::as_str`] and [`Reason::info`] from it, so a reason
/// cannot exist without its row, nor appear in one list and not another.
macro_rules! reasons {
    ($(
        $variant:ident => $code:literal {
            $error_code:ident, $category:ident, step $step:literal, retryable $retryable:literal, $severity:ident,
            $meaning:literal,
            $likely_cause:literal,
            $suggested_fix:literal $(,)?
        }
    ),+ $(,)?) => {
        /// Every stable reason sub-code, generated with its catalog entry by `reasons!`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Reason {
            $($variant,)+
        }

        /// How many reasons the catalog holds.
        const REASON_COUNT: usize = [$(Reason::$variant),+].len();

        impl Reason {
            /// Every reason, in catalog order.
            pub const ALL: [Reason; REASON_COUNT] = [$(Reason::$variant),+];

            /// The stable snake_case code, as it appears in responses and the audit log.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $code,)+
                }
            }

            /// The catalog: the one place that says what each reason means.
            pub fn info(self) -> ReasonInfo {
                match self {
                    $(Reason::$variant => ReasonInfo {
                        error_code: ErrorCode::$error_code,
                        category: Category::$category,
                        step: $step,
                        retryable: $retryable,
                        severity: Severity::$severity,
                        meaning: $meaning,
                        likely_cause: $likely_cause,
                        suggested_fix: $suggested_fix,
                    },)+
                }
            }
        }
    };
}

reasons! {
    RequestMalformed => "request_malformed" {
        InvalidArguments, Request, step 1, retryable false, Error,
        "the request body is not a valid tool-call request",
        "the body is not JSON, misses a required field, has a field of the wrong type or an unknown field",
        "send a JSON object with role_id, run_id, lane_id, tool_name, arguments and scope; see details.problems",
    },
    ProtocolVersionUnsupported => "protocol_version_unsupported" {
        InvalidArguments, Request, step 1, retryable false, Error,
        "the MCP-Protocol-Version header names a protocol revision the MCP front does not speak",
        "an old client (2024-11-05 or 2025-03-26) or a mistyped version",
        "send one of the versions listed in details.supported (or upgrade the MCP client)",
    },
    OriginNotAllowed => "origin_not_allowed" {
        Denied, Request, step 1, retryable false, Error,
        "the request's Origin is not in the MCP front's allowlist",
        "a browser page from another site, or a DNS rebinding attempt",
        "connect from an allowed origin, or add it to TOOLGATE_MCP_ALLOWED_ORIGINS",
    },
    AcceptUnsupported => "accept_unsupported" {
        InvalidArguments, Request, step 1, retryable false, Error,
        "the Accept header of an MCP POST must list both application/json and text/event-stream",
        "a client that is not a Streamable HTTP client",
        "send Accept: application/json, text/event-stream",
    },
    BatchUnsupported => "batch_unsupported" {
        InvalidArguments, Request, step 1, retryable false, Error,
        "the body is a JSON-RPC batch, which MCP (since 2025-06-18) does not allow",
        "several messages sent in one JSON array",
        "send one JSON-RPC message per POST",
    },
    RequestTooLarge => "request_too_large" {
        InvalidArguments, Request, step 1, retryable false, Error,
        "the request body is larger than the gateway accepts",
        "arguments carry a whole document or file instead of a reference to it",
        "send a reference (a path or an id) instead of the content, or raise --max-body-bytes",
    },
    EndpointNotFound => "endpoint_not_found" {
        InvalidArguments, Request, step 1, retryable false, Error,
        "no endpoint has this method and path",
        "a typo in the path, or the wrong HTTP method",
        "see docs/api.md for the endpoints",
    },
    ArtifactNotFound => "artifact_not_found" {
        Denied, Authorization, step 1, retryable false, Error,
        "no artifact with this sha256 was produced in the named run by a lane the role may act in",
        "a wrong hash or run id, or the artifact belongs to another run (the two are answered alike)",
        "fetch artifacts through the run and role whose call produced them: ?run_id=...&role_id=...",
    },
    MethodNotAllowed => "method_not_allowed" {
        InvalidArguments, Request, step 1, retryable false, Error,
        "the endpoint exists but does not serve this method",
        "a client used the wrong HTTP method for the endpoint",
        "use one of the methods in the `Allow` header (also in details.allow)",
    },
    RateLimited => "rate_limited" {
        Denied, Capacity, step 1, retryable true, Warning,
        "the client is over its connection or request-rate limit (step 1), or the call is over a lane's or tool's `rate` (step 8)",
        "too many connections or requests from this client address at once, or too many calls for one rate key within its window",
        "retry after the Retry-After header (details.retry_after_ms); reuse one connection instead of opening many",
    },
    AuditCapacityExhausted => "audit_capacity_exhausted" {
        InternalError, Audit, step 1, retryable true, Critical,
        "the audit log is close to its size cap or the disk to its free-space floor, so new calls are refused",
        "the audit database reached --max-audit-bytes, or the disk holding it is nearly full",
        "retry later; operators: archive or move the audit database, free disk space, or raise --max-audit-bytes (see /metrics toolgate_audit_headroom_bytes)",
    },
    SafetyLockEngaged => "safety_lock_engaged" {
        Denied, Safety, step 1, retryable false, Critical,
        "the safety lock is engaged: no tool call is executed",
        "an operator engaged the lock (see details.lock_reason)",
        "wait for an operator to release the lock (POST /v1/safety-lock with engaged=false)",
    },
    CredentialMissing => "credential_missing" {
        Denied, Authentication, step 2, retryable false, Error,
        "the request carries no credential",
        "the Authorization header is missing or is not `Bearer <token>`",
        "send `Authorization: Bearer <token>` with the token issued for the role",
    },
    CredentialInvalid => "credential_invalid" {
        Denied, Authentication, step 2, retryable false, Error,
        "the credential does not prove the claimed role",
        "the token belongs to another role, was rotated, or is mistyped",
        "use the token issued for this role_id",
    },
    CredentialExpired => "credential_expired" {
        Denied, Authentication, step 2, retryable false, Error,
        "the run token is no longer valid: it expired, was revoked, or its run closed",
        "the token's ttl_s passed, an admin revoked it, or the run it is bound to was closed",
        "ask the orchestrator for a new run token (POST /v1/runs with issue_tokens) for an open run",
    },
    RunTokenRequired => "run_token_required" {
        Denied, Authentication, step 2, retryable false, Error,
        "the role accepts only run tokens; its static credential cannot call tools",
        "the role sets `credential: {run_tokens_only: true}` and the call used the role's static token",
        "call with a run token issued for this role when its run was created (issue_tokens)",
    },
    CredentialNotForRun => "credential_not_for_run" {
        Denied, Run, step 3, retryable false, Error,
        "the run token is bound to another run than the one named in the request",
        "a token issued for one run was used to act in another run",
        "omit run_id (the token names its run) or use a token issued for this run",
    },
    JwtMalformed => "jwt_malformed" {
        Denied, Authentication, step 2, retryable false, Error,
        "the bearer JWT cannot be read: too large, not three base64url parts, not JSON, or a required claim is missing or mistyped",
        "a truncated or corrupted token, a token over 8 KiB, or a token without `exp`/`iss`",
        "send the token exactly as the identity provider issued it; see details and message",
    },
    JwtExpired => "jwt_expired" {
        Denied, Authentication, step 2, retryable false, Error,
        "the JWT's `exp` has passed (beyond the provider's leeway)",
        "the workload kept an old token; projected service-account tokens and IdP tokens are short-lived",
        "fetch a fresh token from the identity provider (re-read the projected token file)",
    },
    JwtNotYetValid => "jwt_not_yet_valid" {
        Denied, Authentication, step 2, retryable false, Error,
        "the JWT's `nbf` or `iat` is in the future (beyond the provider's leeway)",
        "the issuer's or toolgate's clock is wrong",
        "synchronize the clocks (NTP), or raise the provider's `leeway_s` (at most 300)",
    },
    JwtIssuerMismatch => "jwt_issuer_mismatch" {
        Denied, Authentication, step 2, retryable false, Error,
        "no identity provider in roles.yaml has the JWT's `iss`",
        "a token from another issuer, or the provider's `issuer` differs from the token's (trailing slash, scheme)",
        "declare the issuer in `identity_providers` with the exact `iss` string, or use a token from a declared issuer",
    },
    JwtAudienceMismatch => "jwt_audience_mismatch" {
        Denied, Authentication, step 2, retryable false, Error,
        "the JWT's `aud` names neither the provider's `audience` nor this server's MCP resource URI",
        "a token minted for another service was replayed here",
        "request the token for this server's audience (details.expected_audience)",
    },
    JwtUnknownKid => "jwt_unknown_kid" {
        Denied, Authentication, step 2, retryable false, Error,
        "the JWT names a signing key (`kid`) the provider's key set does not publish, or names none",
        "the issuer rotated to a key not yet fetched (toolgate refetches at most once per `jwks_cooldown_s`), or the token was signed by someone else",
        "retry after the provider's jwks_cooldown_s; if it persists, check the token's issuer and the provider's jwks_uri",
    },
    JwtAlgorithmRefused => "jwt_algorithm_refused" {
        Denied, Authentication, step 2, retryable false, Error,
        "the JWT's `alg` is not accepted: `none`, an HMAC algorithm, one the provider does not list, or one the named key is not for",
        "an unsigned or HMAC-signed token (e.g. HS256 keyed with the public key), or a provider `algorithms` list that misses the issuer's",
        "sign with an asymmetric algorithm listed in the provider's `algorithms` (RS256, ES256, EdDSA, ...)",
    },
    JwtSignatureInvalid => "jwt_signature_invalid" {
        Denied, Authentication, step 2, retryable false, Error,
        "the JWT's signature does not verify with the key it names",
        "the token was altered after signing, or signed with another key under the same kid",
        "use the token exactly as issued; check that the issuer publishes the key it signs with",
    },
    JwksUnavailable => "jwks_unavailable" {
        DependencyDown, Authentication, step 2, retryable true, Critical,
        "no signing key of the token's identity provider can be had: the key set could not be fetched and none is cached",
        "the jwks_uri is unreachable, slow, too large, not JSON or has no usable key; or jwks_file is unreadable",
        "retry later; operators: check the provider's jwks_uri from toolgate's host (see logs `jwks fetch failed`)",
    },
    RoleUnknown => "role_unknown" {
        Denied, Authentication, step 2, retryable false, Error,
        "the role_id is not defined in policy/roles.yaml",
        "a typo in role_id, or the role was removed from the policy",
        "use a role_id from policy/roles.yaml",
    },
    RoleDisabled => "role_disabled" {
        Denied, Authorization, step 2, retryable false, Error,
        "the role is disabled in policy/roles.yaml",
        "the role was switched off by a policy change",
        "ask a policy owner to enable the role, or use another role",
    },
    RunNotFound => "run_not_found" {
        Denied, Run, step 3, retryable false, Error,
        "the run_id names no run",
        "the run was never created, or the run_id is mistyped",
        "create the run first (POST /v1/runs) and use the run_id it returns",
    },
    PolicyVersionMismatch => "policy_version_mismatch" {
        Denied, Run, step 3, retryable false, Error,
        "the run is pinned to policy versions other than the loaded ones",
        "the policy was changed or reloaded after the run started",
        "start a new run under the current policy, or reload the policy the run was created under",
    },
    LaneUnknown => "lane_unknown" {
        Denied, Authorization, step 4, retryable false, Error,
        "the lane_id is not defined in policy/lanes.yaml",
        "a typo in lane_id, or the lane was removed from the policy",
        "use a lane_id from policy/lanes.yaml",
    },
    LaneNotAllowedForRole => "lane_not_allowed_for_role" {
        Denied, Authorization, step 4, retryable false, Error,
        "the role may not act in this lane",
        "the agent is working outside its stage of work",
        "call the tool from a role that lists this lane, or hand the work to that role",
    },
    RunNotActive => "run_not_active" {
        Denied, Run, step 4, retryable false, Error,
        "the run's status does not allow this lane to act",
        "the run was suspended or closed by an operator",
        "ask an operator to reactivate the run (POST /v1/runs/{run_id}/status), or start a new run",
    },
    ToolUnregistered => "tool_unregistered" {
        Denied, Authorization, step 5, retryable false, Error,
        "the tool_name is not in tools/tool_registry.yaml",
        "a typo in tool_name, or the tool was never registered",
        "use a tool listed by GET /v1/tools, or register the tool",
    },
    ToolDisabled => "tool_disabled" {
        Denied, Authorization, step 5, retryable false, Error,
        "the tool is registered but disabled",
        "the tool was switched off by a policy change",
        "use another tool, or ask a policy owner to enable it",
    },
    ToolNotAllowedInLane => "tool_not_allowed_in_lane" {
        Denied, Authorization, step 6, retryable false, Error,
        "the lane's allowlist does not include this tool",
        "the tool belongs to another stage of work",
        "call the tool from a lane that allowlists it (GET /v1/tools?role_id=&lane_id=)",
    },
    ScopeKeyMissing => "scope_key_missing" {
        Denied, Scope, step 7, retryable false, Error,
        "a scope key the lane or the tool requires is missing",
        "the caller did not pass the case or matter the call is about",
        "add the keys listed in details.missing to scope",
    },
    ScopeConflictsWithRun => "scope_conflicts_with_run" {
        Denied, Scope, step 7, retryable false, Error,
        "the call's scope contradicts the scope its run is bound to",
        "the run was created for another case or matter",
        "use the run created for this scope, or create one",
    },
    ArgumentsInvalid => "arguments_invalid" {
        InvalidArguments, Arguments, step 8, retryable false, Error,
        "the arguments do not match the tool's input schema",
        "a missing, extra or mistyped argument",
        "fix each violation listed in details.violations (JSON pointer and message)",
    },
    ArgumentUnsafe => "argument_unsafe" {
        InvalidArguments, Arguments, step 8, retryable false, Error,
        "an argument failed sanitization (path traversal, shell metacharacters, or a URL outside the allowlist)",
        "the arguments try to reach outside what the tool may touch",
        "pass a path relative to the tool's root, plain values, and only allowlisted hosts",
    },
    ProhibitedFlag => "prohibited_flag" {
        Denied, Prohibition, step 8, retryable false, Warning,
        "the call carries a flag the lane or the tool prohibits",
        "the call targets a class of resource forbidden here (for example a privileged document, or a sealed case)",
        "do not perform this action in this lane; see details.flag and details.prohibited_by",
    },
    ConditionFailed => "condition_failed" {
        Denied, Prohibition, step 8, retryable false, Warning,
        "a condition of the lane or the tool did not hold for this call (false, or it could not be evaluated)",
        "the arguments or the scope are outside what the condition allows, for example another case than the run's",
        "see details.condition and details.condition_message; change the arguments or scope to satisfy it, or use a run for that scope",
    },
    IdempotencyConflict => "idempotency_conflict" {
        Denied, Idempotency, step 9, retryable false, Error,
        "the idempotency_key was already used with different arguments",
        "the caller reuses keys across different calls",
        "use a fresh idempotency_key for a different call",
    },
    AuditUnavailable => "audit_unavailable" {
        InternalError, Audit, step 9, retryable true, Critical,
        "the audit log could not record the call, so the call was refused",
        "the audit database is unwritable, locked, corrupt, or the disk is full",
        "retry later; operators: check the data directory and `toolgate audit verify`",
    },
    ConcurrencyLimitReached => "concurrency_limit_reached" {
        Denied, Capacity, step 10, retryable true, Warning,
        "the tool is already running at its max_concurrency",
        "too many concurrent calls to this tool",
        "retry after details.retry_after_ms",
    },
    AdapterNotImplemented => "adapter_not_implemented" {
        NotImplemented, Execution, step 10, retryable false, Error,
        "the tool's adapter is not available in this build",
        "the registry names an adapter kind or builtin this gateway does not have",
        "fix the tool's adapter in tools/tool_registry.yaml",
    },
    ToolTimeout => "tool_timeout" {
        Timeout, Timeout, step 10, retryable false, Error,
        "the tool did not finish before its deadline and was terminated",
        "the tool is slow or hung, or timeout_ms is too small",
        "retry with a larger timeout_ms (up to the tool's timeout_ms_max) if the tool is idempotent",
    },
    Cancelled => "cancelled" {
        InternalError, Execution, step 10, retryable false, Warning,
        "the caller cancelled the call (MCP notifications/cancelled or a dropped connection) and its execution was stopped",
        "the client gave up on the call",
        "nothing to fix; call again if the result is still wanted (an idempotency key of a cancelled call is released)",
    },
    DependencyDown => "dependency_down" {
        DependencyDown, Dependency, step 10, retryable true, Error,
        "the tool's upstream could not be reached",
        "the upstream service is down or refused the connection",
        "retry with backoff only when diagnostic.retryable is true (details.reached_tool is false: nothing was sent; or the tool is idempotent and the call carries an idempotency_key); otherwise first check whether the call took effect; operators: check the upstream",
    },
    ToolError => "tool_error" {
        InternalError, Execution, step 10, retryable false, Error,
        "the tool ran and reported an error",
        "the tool could not do what was asked (see details.tool_error)",
        "read details.tool_error; fix the arguments or report to the tool owner",
    },
    OutputSchemaViolation => "output_schema_violation" {
        InternalError, Output, step 11, retryable false, Error,
        "the tool's output does not match its output schema, so it was withheld",
        "the tool and its registered output schema disagree",
        "report to the tool owner; see details.violations",
    },
    ArtifactStoreFailed => "artifact_store_failed" {
        InternalError, Output, step 11, retryable true, Error,
        "a large output could not be stored as an artifact",
        "the data directory is unwritable or full",
        "retry later; operators: check the data directory",
    },
    PolicyUnavailable => "policy_unavailable" {
        InternalError, Authorization, step 1, retryable true, Critical,
        "no valid policy is loaded",
        "the policy failed to load",
        "operators: run `toolgate policy check` and fix the reported problems",
    },
    PolicyInvalid => "policy_invalid" {
        InvalidArguments, Request, step 1, retryable false, Error,
        "a candidate policy failed to load, so the current policy stays in force",
        "the edited policy files have errors (see details.problems)",
        "run `toolgate policy check`, fix every problem, and reload again",
    },
    InternalError => "internal_error" {
        InternalError, Execution, step 13, retryable false, Critical,
        "the gateway hit an internal error and refused the call",
        "a defect in toolgate",
        "report it with the call_id",
    },
    ApprovalRequired => "approval_required" {
        Denied, Approval, step 8, retryable true, Info,
        "the call needs human approval before it runs; it was not executed and an approval was requested",
        "the policy's `approval` on the tool or the lane applies to this call",
        "wait until an approver decides (GET /v1/approvals/{details.approval_id}), then send the same call again with \"approval_id\": details.approval_id before details.expires_at",
    },
    ApprovalPending => "approval_pending" {
        Denied, Approval, step 8, retryable true, Info,
        "the approval named by approval_id has not been decided yet",
        "the call was retried before enough approvers approved it",
        "retry the same call later (poll GET /v1/approvals/{approval_id}); it must be decided before it expires",
    },
    ApprovalDenied => "approval_denied" {
        Denied, Approval, step 8, retryable false, Warning,
        "an approver denied the approval named by approval_id",
        "an approver refused this call (see details.decisions for who and why)",
        "do not retry this call; change it as the reason says and call again without approval_id to request a new approval",
    },
    ApprovalExpired => "approval_expired" {
        Denied, Approval, step 8, retryable false, Warning,
        "the approval named by approval_id expired before it was used",
        "nobody decided within the approval's ttl_s, or the approved call was not retried in time",
        "call again without approval_id to request a new approval",
    },
    ApprovalUsed => "approval_used" {
        Denied, Approval, step 8, retryable false, Warning,
        "the approval named by approval_id was already used by another call; an approval runs one call once",
        "the call was retried after it already executed, or two retries raced and the other one won",
        "look up the call that used it (details.used_by_call_id); to run the call again, request a new approval",
    },
    ApprovalUnknown => "approval_unknown" {
        Denied, Approval, step 8, retryable false, Error,
        "no approval with this id exists",
        "a mistyped, forged or pruned approval id",
        "use the approval_id of the approval_required answer; call again without approval_id to request a new approval",
    },
    ApprovalArgumentsMismatch => "approval_arguments_mismatch" {
        Denied, Approval, step 8, retryable false, Error,
        "the call's arguments differ from the arguments that were approved",
        "the arguments were changed after the approval was requested",
        "send exactly the approved arguments, or call again without approval_id to have the new arguments approved",
    },
    ApprovalRunMismatch => "approval_run_mismatch" {
        Denied, Approval, step 8, retryable false, Error,
        "the approval was requested in another run",
        "an approval id used in a run it was not granted for",
        "use an approval requested in this run",
    },
    ApprovalRoleMismatch => "approval_role_mismatch" {
        Denied, Approval, step 8, retryable false, Error,
        "the approval was requested by another role",
        "an approval id used by a role it was not granted to",
        "use an approval requested by this role",
    },
    ApprovalCallMismatch => "approval_call_mismatch" {
        Denied, Approval, step 8, retryable false, Error,
        "the approval was requested for another lane, tool, tool version or scope",
        "the approval id belongs to a different call",
        "send the approved call unchanged (details.mismatch names the field), or request a new approval",
    },
    ApprovalPolicyChanged => "approval_policy_changed" {
        Denied, Approval, step 8, retryable false, Warning,
        "the policy changed since the approval was requested, so the approval no longer applies",
        "a policy reload between the request and the retry",
        "call again without approval_id to request an approval under the current policy",
    },
    ApprovalLimitReached => "approval_limit_reached" {
        Denied, Capacity, step 8, retryable true, Warning,
        "too many approvals are pending (for this run or in total), so no new one is requested",
        "approvers have not kept up, or an agent requests approvals in a loop",
        "retry after details.retry_after_ms; approvers: decide or let the pending approvals expire",
    },
    ApprovalStoreUnavailable => "approval_store_unavailable" {
        InternalError, Approval, step 8, retryable true, Critical,
        "the approval store could not be read or written, so the call was refused",
        "the approvals database in the data directory is unwritable, locked or corrupt",
        "retry later; operators: check the data directory (approvals.db)",
    },
    ApproverNotAllowed => "approver_not_allowed" {
        Denied, Approval, step 1, retryable false, Error,
        "the credential is not one of the approvers the policy names for this approval",
        "a principal that is not in the tool's or lane's `approval.approvers` tried to decide (or to read an approval)",
        "decide with the credential of a listed approver (see requirements[].approvers)",
    },
    SelfApprovalRefused => "self_approval_refused" {
        Denied, Approval, step 1, retryable false, Error,
        "a principal may never approve its own call",
        "the requester's role (or, with JWT identity, the same subject) tried to approve the call it made",
        "have another approver decide",
    },
    ApprovalAlreadyDecided => "approval_already_decided" {
        Denied, Approval, step 1, retryable false, Warning,
        "the approval is no longer pending, or this approver already decided it",
        "a second decision on the same approval, or by the same approver",
        "read the approval (GET /v1/approvals/{id}) for its status and decisions",
    },
    CommitUnknown => "commit_unknown" {
        InvalidArguments, Request, step 10, retryable false, Error,
        "no prepared two-phase call has this call_id and commit_id",
        "a mistyped or forged commit_id, or a call that was not prepared by a two-phase tool",
        "commit with the call_id and details.commit.commit_id of the prepared call's response",
    },
    CommitNotAllowed => "commit_not_allowed" {
        Denied, Authorization, step 10, retryable false, Error,
        "the commit request does not come from the run and role that made the prepared call",
        "another run, another role, or a credential that does not prove the call's role",
        "commit from the same run with the same role's credential as the prepared call",
    },
    CommitAlreadyUsed => "commit_already_used" {
        Denied, Idempotency, step 10, retryable false, Warning,
        "the prepared call was already committed (or its commit is under way); a commit is never replayed",
        "a repeated or concurrent commit request",
        "see details.state; the first commit's answer is the outcome",
    },
    CommitExpired => "commit_expired" {
        Denied, Execution, step 10, retryable false, Warning,
        "the prepared call was rolled back (its commit deadline passed, or its commit failed); it can no longer be committed",
        "the commit came after details.commit_deadline, or after a failed commit",
        "call the tool again to prepare a new call, and commit before its deadline",
    },
    CommitFailed => "commit_failed" {
        DependencyDown, Dependency, step 10, retryable false, Error,
        "the upstream did not confirm the commit of a prepared call after the bounded retries",
        "the upstream is down, refused the commit token, or answered an error",
        "see details.attempts and details.rollback: the gateway rolls the call back; prepare a new call when the upstream is up",
    },
    RollbackFailed => "rollback_failed" {
        DependencyDown, Dependency, step 10, retryable false, Critical,
        "the upstream did not confirm the rollback of a prepared call after the bounded retries",
        "the upstream is down or refused the commit token",
        "operators: the effect may still be prepared upstream; check the upstream with the call_id and the audited details",
    },
    CommitStateUnavailable => "commit_state_unavailable" {
        InternalError, Audit, step 10, retryable true, Critical,
        "the gateway could not read or write its durable two-phase state, so the request was refused",
        "the data directory's phases database is unwritable, locked or corrupt, or its table is full",
        "retry later; operators: check the data directory (phases.db) and the log",
    },
    BudgetExhausted => "budget_exhausted" {
        Denied, Capacity, step 8, retryable false, Warning,
        "the run used up a lane's or tool's call budget (`budget.max_calls_per_run`)",
        "the agent called the tool (or tools of the lane) as often as the policy allows in one run",
        "see details.owner, details.max and details.used; finish the work in a new run, or ask for a larger budget",
    },
    CounterStateUnavailable => "counter_state_unavailable" {
        InternalError, Capacity, step 8, retryable true, Critical,
        "the gateway could not read or write its budget and rate counters, so a limited call was refused",
        "the counters database (counters.db in the data directory, or the cluster database in a fleet) is unwritable, locked, unreachable or corrupt",
        "retry later; operators: check counters.db in the data directory (in a fleet, the cluster database) and the log",
    },
    ClusterUnavailable => "cluster_unavailable" {
        InternalError, Dependency, step 1, retryable true, Critical,
        "the fleet's cluster database (serve --cluster-db) could not be used, so the call was refused",
        "PostgreSQL is down, unreachable, slower than the query timeout, or refused the query",
        "retry with backoff; operators: check the cluster database and the sidecar's connection to it",
    },
    SafetyLockUnconfirmed => "safety_lock_unconfirmed" {
        Denied, Safety, step 1, retryable true, Critical,
        "the safety lock's state could not be confirmed from the cluster database within its bound, so it is treated as engaged",
        "the cluster database is down or unreachable from this sidecar",
        "retry later; operators: check the cluster database (docs/deployment.md)",
    },
    IdempotencyInFlight => "idempotency_in_flight" {
        Denied, Idempotency, step 9, retryable true, Warning,
        "the first call with this idempotency key is still running on a sidecar of the fleet, past the wait bound",
        "a slow first call, or a sidecar that stopped while running it (its claim stays until an operator clears it)",
        "retry later with the same key; operators: see docs/operations.md (stale idempotency claims)",
    },
    ApprovalAttestationInvalid => "approval_attestation_invalid" {
        Denied, Approval, step 8, retryable false, Critical,
        "the approval reads approved in the fleet's shared store but carries no valid decision attestation signed with the fleet key, so it is not used",
        "the approval's row was edited in the cluster database (an insider without the fleet key), or the deciding sidecar has no or another --fleet-key-dir",
        "request a new approval and have it decided; operators: check toolgate_approvals in the cluster database and give every sidecar the same fleet key",
    },
    ApprovalStoreMismatch => "approval_store_mismatch" {
        Denied, Approval, step 8, retryable false, Critical,
        "the approval store disagrees with the audit log about this approval (details.field names what), so the store is not honoured: the log is the evidence of an approval's life",
        "approvals.db or the cluster database's toolgate_approvals was edited (status, expiry, approvers, use, call digest or quorum) by someone with access to it",
        "do not retry with this approval; request a new approval (call again without approval_id); operators: investigate the edit (toolgate_approval_store_mismatches_total) and compare the store with the audit log's approval events",
    },
    ApprovalEvidenceUnavailable => "approval_evidence_unavailable" {
        InternalError, Approval, step 8, retryable true, Critical,
        "in a fleet, the audit hub did not hold every sidecar's audit log up to now within the bounded wait, so whether the approval was already used elsewhere is not proven and it is not used",
        "a sidecar's shipping to the audit hub lags, fails or stopped (details.waiting_for names the sidecars), or this sidecar's own shipping does",
        "retry later; operators: check each sidecar's toolgate_hub_ship_* metrics and its connection to the cluster database",
    },
    SandboxUnavailable => "sandbox_unavailable" {
        DependencyDown, Dependency, step 10, retryable false, Critical,
        "the tool's sandbox profile asks for a guarantee no mechanism of this host can hold, so the tool was not started",
        "the kernel lacks Landlock (ABI 3, or 4 for `network: {ports}`) or seccomp, or refuses the namespaces `network: {connect}` needs (see details.sandbox.unavailable)",
        "operators: run `toolgate doctor` on the host and see docs/operations.md, \"Sandbox\"; nothing ran, and the call is refused the same way until the host or the profile changes",
    },
    ToolResourceLimit => "tool_resource_limit" {
        InternalError, Execution, step 10, retryable false, Error,
        "the kernel ended the tool at a limit of its sandbox profile (details.sandbox.limit_hit: cpu_s or file_size_mb)",
        "the tool used more CPU time or wrote a larger file than its profile's `limits` allow",
        "call with less work, or raise the limit in the tool's `sandbox.limits` (a policy change that `policy diff` reports as widening)",
    },
    CallerJwtRequired => "caller_jwt_required" {
        Denied, Authentication, step 10, retryable false, Error,
        "the tool's upstream credential is exchanged for the caller's verified JWT (`auth: token_exchange`), and this call was not authenticated with one; nothing was sent",
        "the call used a run token or a static token; a token exchange needs the caller's own JWT as its subject token",
        "call this tool with the workload's JWT from its identity provider, not a run token",
    },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The code a reason is serialized with (in responses and audit lines) is the
    /// code its row gives it.
    #[test]
    fn every_reason_serializes_as_its_code() {
        for reason in Reason::ALL {
            assert_eq!(
                serde_json::to_value(reason).ok(),
                Some(Value::String(reason.as_str().to_string())),
                "{reason:?}"
            );
        }
        let mut codes: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Reason::ALL.len(), "two reasons share a code");
    }
}
