//! Responses: the one place that turns a refusal into an HTTP response, and the one
//! place that derives an HTTP status from a diagnostic ([`http_status`]).
//!
//! INVARIANT: every response body is JSON except the console's files, the metrics
//! text, an artifact's bytes and an MCP answer's event stream; a refusal is always the
//! structured diagnostic, never free text.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{Either, Full};
use hyper::header::{
    ALLOW, CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE,
    X_CONTENT_TYPE_OPTIONS,
};
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use crate::call::{CallResponse, Status};
use crate::diagnostic::{Reason, Refusal};

/// The body of a response: whole, or a stream sent as it is written (an MCP call that
/// reports progress).
pub type Body = Either<Full<Bytes>, BoxBody<Bytes, Infallible>>;

/// A response of the server.
pub type HttpResponse = Response<Body>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Either::Left(Full::new(bytes.into()))
}

/// The response to a refused request that is not a tool call: the structured refusal as
/// the body, its HTTP status, and the headers its details call for (a 405's `Allow`
/// from `details.allow`, `Retry-After` from `details.retry_after_ms`).
pub fn refusal(refusal: &Refusal) -> HttpResponse {
    refusal_with_challenge(refusal, None)
}

/// [`refusal`], with a `WWW-Authenticate` challenge when its status is 401.
pub fn refusal_with_challenge(refusal: &Refusal, challenge: Option<&str>) -> HttpResponse {
    let diagnostic = refusal.diagnostic();
    let body = json!({
        "status": Status::of(refusal.reason),
        "error_code": diagnostic.error_code,
        "error_message": refusal.message,
        "diagnostic": diagnostic,
    });
    let status = http_status(refusal.reason);
    let mut http = json(status, &body);
    add_retry_after(&mut http, Some(&refusal.details));
    let headers = http.headers_mut();
    if refusal.reason == Reason::MethodNotAllowed
        && let Some(allow) = refusal.details["allow"].as_array()
    {
        let allow: Vec<&str> = allow.iter().filter_map(Value::as_str).collect();
        if let Ok(value) = HeaderValue::from_str(&allow.join(", ")) {
            headers.insert(ALLOW, value);
        }
    }
    if status == StatusCode::UNAUTHORIZED
        && let Some(value) = challenge.and_then(|c| HeaderValue::from_str(c).ok())
    {
        headers.insert(WWW_AUTHENTICATE, value);
    }
    http
}

/// The answer of a tool call (allowed or refused), with `Retry-After` when its
/// diagnostic says when to retry.
pub fn call(response: &CallResponse) -> HttpResponse {
    let status = match &response.diagnostic {
        None => StatusCode::OK,
        Some(d) => http_status(d.reason),
    };
    // Serialized straight to bytes (no intermediate JSON value): the hot path. A gated
    // call's answer is a few KB: room for it up front saves the buffer's regrowths.
    let mut bytes = Vec::with_capacity(4096);
    if serde_json::to_writer(&mut bytes, response).is_err() {
        bytes = b"{}".to_vec();
    }
    let mut http = with_json_type(Response::new(full(bytes)));
    *http.status_mut() = status;
    add_retry_after(&mut http, response.diagnostic.as_ref().map(|d| &d.details));
    http
}

/// `ok` with the value as JSON, or the refusal.
pub fn result<T: serde::Serialize>(result: Result<T, Refusal>, ok: StatusCode) -> HttpResponse {
    match result {
        Ok(value) => json(ok, &json!(value)),
        Err(r) => refusal(&r),
    }
}

/// A JSON response.
pub fn json(status: StatusCode, body: &Value) -> HttpResponse {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = with_json_type(Response::new(full(bytes)));
    *response.status_mut() = status;
    response
}

/// Marks `response` as API data: JSON, never cached, never sniffed.
pub fn with_json_type(mut response: HttpResponse) -> HttpResponse {
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // API data is never cached (it carries approvals, audit events, runs).
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

fn add_retry_after(http: &mut HttpResponse, details: Option<&Value>) {
    if let Some(ms) = details.and_then(|d| d["retry_after_ms"].as_u64()) {
        let secs = ms.div_ceil(1000).max(1);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            http.headers_mut().insert(RETRY_AFTER, v);
        }
    }
}
/// The one place that derives an HTTP status from a diagnostic.
pub fn http_status(reason: Reason) -> StatusCode {
    match reason {
        Reason::RequestMalformed
        | Reason::ArgumentsInvalid
        | Reason::ArgumentUnsafe
        | Reason::PolicyInvalid
        | Reason::ProtocolVersionUnsupported
        | Reason::BatchUnsupported => StatusCode::BAD_REQUEST,
        Reason::AcceptUnsupported => StatusCode::NOT_ACCEPTABLE,
        Reason::OriginNotAllowed => StatusCode::FORBIDDEN,
        Reason::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Reason::EndpointNotFound | Reason::ArtifactNotFound => StatusCode::NOT_FOUND,
        Reason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Reason::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Reason::CredentialMissing
        | Reason::CredentialInvalid
        | Reason::CredentialExpired
        | Reason::JwtMalformed
        | Reason::JwtExpired
        | Reason::JwtNotYetValid
        | Reason::JwtIssuerMismatch
        | Reason::JwtAudienceMismatch
        | Reason::JwtUnknownKid
        | Reason::JwtAlgorithmRefused
        | Reason::JwtSignatureInvalid
        | Reason::RoleUnknown => StatusCode::UNAUTHORIZED,
        Reason::JwksUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::IdempotencyConflict => StatusCode::CONFLICT,
        Reason::ConcurrencyLimitReached => StatusCode::TOO_MANY_REQUESTS,
        Reason::DependencyDown => StatusCode::BAD_GATEWAY,
        Reason::ToolTimeout => StatusCode::GATEWAY_TIMEOUT,
        Reason::AdapterNotImplemented => StatusCode::NOT_IMPLEMENTED,
        Reason::AuditUnavailable | Reason::PolicyUnavailable | Reason::AuditCapacityExhausted => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        Reason::CommitUnknown => StatusCode::NOT_FOUND,
        Reason::CommitNotAllowed => StatusCode::FORBIDDEN,
        Reason::CommitAlreadyUsed | Reason::CommitExpired => StatusCode::CONFLICT,
        Reason::CommitFailed | Reason::RollbackFailed => StatusCode::BAD_GATEWAY,
        Reason::CommitStateUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::BudgetExhausted => StatusCode::FORBIDDEN,
        Reason::CounterStateUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::ClusterUnavailable | Reason::SafetyLockUnconfirmed => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        Reason::IdempotencyInFlight => StatusCode::CONFLICT,
        Reason::ToolError
        | Reason::Cancelled
        | Reason::OutputSchemaViolation
        | Reason::ArtifactStoreFailed
        | Reason::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
        Reason::SafetyLockEngaged
        | Reason::CallerJwtRequired
        | Reason::RoleDisabled
        | Reason::RunTokenRequired
        | Reason::CredentialNotForRun
        | Reason::RunNotFound
        | Reason::PolicyVersionMismatch
        | Reason::LaneUnknown
        | Reason::LaneNotAllowedForRole
        | Reason::RunNotActive
        | Reason::ToolUnregistered
        | Reason::ToolDisabled
        | Reason::ToolNotAllowedInLane
        | Reason::ScopeKeyMissing
        | Reason::ScopeConflictsWithRun
        | Reason::ProhibitedFlag
        | Reason::ConditionFailed => StatusCode::FORBIDDEN,
        // Not executed, waiting on a human: 409 so that a client reading only the HTTP
        // status never takes it for a success (docs/api.md, "Approvals").
        Reason::ApprovalRequired | Reason::ApprovalPending | Reason::ApprovalAlreadyDecided => {
            StatusCode::CONFLICT
        }
        Reason::ApprovalUnknown => StatusCode::NOT_FOUND,
        Reason::ApprovalLimitReached => StatusCode::TOO_MANY_REQUESTS,
        Reason::ApprovalStoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::ApprovalAttestationInvalid => StatusCode::FORBIDDEN,
        Reason::ApprovalStoreMismatch => StatusCode::FORBIDDEN,
        Reason::ApprovalEvidenceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::SandboxUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::ToolResourceLimit => StatusCode::INTERNAL_SERVER_ERROR,
        Reason::ApprovalDenied
        | Reason::ApprovalExpired
        | Reason::ApprovalUsed
        | Reason::ApprovalArgumentsMismatch
        | Reason::ApprovalRunMismatch
        | Reason::ApprovalRoleMismatch
        | Reason::ApprovalCallMismatch
        | Reason::ApprovalPolicyChanged
        | Reason::ApproverNotAllowed
        | Reason::SelfApprovalRefused => StatusCode::FORBIDDEN,
    }
}

/// The diagnostic catalog with the HTTP status of each reason: what
/// contract/diagnostics.json publishes.
pub fn published_catalog() -> Value {
    let mut catalog = crate::diagnostic::catalog_json();
    if let Some(reasons) = catalog["reasons"].as_array_mut() {
        for (entry, reason) in reasons.iter_mut().zip(Reason::ALL) {
            entry["http_status"] = json!(http_status(reason).as_u16());
        }
    }
    catalog
}
