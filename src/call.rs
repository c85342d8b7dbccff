//! A tool call's request and response, and the decision trace they carry.
//!
//! Parsing is strict and lists every problem at once: malformed JSON, missing fields,
//! wrong types and unknown fields all come back together in one `request_malformed`
//! refusal.

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::diagnostic::{Diagnostic, ErrorCode, Reason, Refusal};

mod trace;

pub use trace::{ApprovalRequirement, ConditionResult, LimitClaim, Trace};

/// Longest id (role, run, lane, tool) accepted.
const MAX_ID_LEN: usize = 128;
/// Longest idempotency key accepted.
const MAX_KEY_LEN: usize = 256;
/// Unknown fields named one by one in a refusal; the rest are counted, so what a caller
/// who has not proved anything can make the log record stays small.
const MAX_NAMED_UNKNOWN: usize = 10;
/// Deepest nesting accepted in `scope` and in `arguments` (the object itself is level
/// 1). Deeper values are refused at step 1, well inside what the audit line accepts.
pub const MAX_DEPTH: usize = 32;
/// Largest `scope` accepted, as compact JSON. A scope names a case, a matter and a few
/// flags; anything larger is refused at step 1.
pub const MAX_SCOPE_BYTES: usize = 16 * 1024;
/// Longest excerpt of a refused value kept in the audit log.
pub const MAX_EXCERPT_CHARS: usize = 256;

/// A parsed, well-formed tool-call request (not yet authorized).
#[derive(Debug, Clone, PartialEq)]
pub struct CallRequest {
    pub role_id: String,
    pub run_id: String,
    pub lane_id: String,
    pub tool_name: String,
    pub arguments: Value,
    pub scope: Map<String, Value>,
    pub timeout_ms: Option<u64>,
    pub idempotency_key: Option<String>,
    /// Decide and trace, never execute.
    pub dry_run: bool,
    /// The approval this call presents (a retry after `approval_required`).
    pub approval_id: Option<String>,
}

/// What a malformed request still tells us, for the audit record of its refusal.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartialRequest {
    pub role_id: Option<String>,
    pub run_id: Option<String>,
    pub lane_id: Option<String>,
    pub tool_name: Option<String>,
    /// A bounded digest of what was received but could not be accepted (the body, the
    /// scope, the arguments): hashes, sizes and a short sanitized excerpt, never the
    /// value itself. See [`digest_value`].
    pub received: Map<String, Value>,
}

/// A request as received: parsed, or refused with whatever ids could be read.
pub type Received = Result<CallRequest, Box<(Refusal, PartialRequest)>>;

/// The credential of an `Authorization` header, compared later exactly as sent: the
/// value must be `Bearer <token>` (scheme in any case, one space). Anything else that
/// is present (spaces or tabs around the token, another scheme, bytes that are not
/// text) is returned whole, so it is refused as an invalid credential rather than
/// trimmed into a valid one or mistaken for a missing one.
pub fn bearer_token(value: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(value);
    if text.is_empty() {
        return None;
    }
    let token = match text.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("bearer ") => &text[7..],
        _ => return Some(text.into_owned()),
    };
    if token.is_empty() {
        return Some(text.into_owned());
    }
    Some(token.to_string())
}

/// `received`, refused with `refusal` instead: a request refused for what came with
/// its body (its headers), still audited under whatever ids the body names.
pub fn refused(received: Received, refusal: Refusal) -> Received {
    let partial = match received {
        Ok(request) => PartialRequest {
            role_id: Some(request.role_id),
            run_id: Some(request.run_id),
            lane_id: Some(request.lane_id),
            tool_name: Some(request.tool_name),
            received: Map::new(),
        },
        Err(rejected) => rejected.1,
    };
    Err(Box::new((refusal, partial)))
}

/// Parses a request body. On failure returns the refusal (listing every problem) and
/// whatever ids could be read, so the refusal can still be audited under them.
pub fn parse_request(body: &[u8]) -> Received {
    CallBody::from_bytes(body).and_then(CallBody::into_request)
}

/// The body of `POST /v1/tool-calls` as sent, field by field: what `server` parses from
/// the bytes and the gateway completes (from a run token) and checks
/// ([`CallBody::into_request`]).
///
/// Each field is kept as the JSON value received (null read as absent) so that the
/// check can name every problem at once, in the documented words ("`role_id` must be a
/// string, not a number"), rather than stop at the first wrong type. Unknown fields are
/// refused too (docs/api.md), all of them named, together with the other problems:
/// they are collected here instead of failing the parse at the first one, as
/// `deny_unknown_fields` would.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct CallBody {
    #[serde(default)]
    pub role_id: Option<Value>,
    #[serde(default)]
    pub run_id: Option<Value>,
    #[serde(default)]
    pub lane_id: Option<Value>,
    #[serde(default)]
    pub tool_name: Option<Value>,
    #[serde(default)]
    pub arguments: Option<Value>,
    #[serde(default)]
    pub scope: Option<Value>,
    #[serde(default)]
    pub timeout_ms: Option<Value>,
    #[serde(default)]
    pub idempotency_key: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<Value>,
    #[serde(default)]
    pub approval_id: Option<Value>,
    /// Every other field, by name: each is refused.
    #[serde(flatten)]
    pub unknown: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

impl CallBody {
    /// Reads a body: a JSON object, or the refusal saying why not (with a digest of
    /// what was received when it is not JSON at all).
    pub fn from_bytes(body: &[u8]) -> Result<CallBody, Box<(Refusal, PartialRequest)>> {
        // One pass from the bytes straight into the fields.
        if let Ok(parsed) = serde_json::from_slice::<CallBody>(body) {
            return Ok(parsed);
        }
        // Not an object, not JSON, or a field given twice (the last one counts, as in
        // any JSON object): read it as JSON to say which.
        match serde_json::from_slice::<Value>(body) {
            Ok(value) => CallBody::from_value(value),
            Err(e) => {
                let problem = if std::str::from_utf8(body).is_err() {
                    "the body is not valid UTF-8".to_string()
                } else {
                    format!("the body is not valid JSON: {e}")
                };
                let mut partial = PartialRequest::default();
                partial.received.insert("body".into(), digest_bytes(body));
                Err(Box::new((malformed(vec![problem]), partial)))
            }
        }
    }

    /// Reads a body already parsed as JSON (the MCP front builds one from headers).
    pub fn from_value(value: Value) -> Result<CallBody, Box<(Refusal, PartialRequest)>> {
        if !value.is_object() {
            return Err(Box::new((
                malformed(vec!["the body must be a JSON object".into()]),
                PartialRequest::default(),
            )));
        }
        // Every field is a JSON value: an object always reads.
        serde_json::from_value(value).map_err(|e| {
            Box::new((
                malformed(vec![format!("the body could not be read: {e}")]),
                PartialRequest::default(),
            ))
        })
    }

    /// Checks every field and bound; the request, or a refusal listing every problem
    /// with whatever ids could be read.
    pub fn into_request(self) -> Received {
        check_call(self)
    }
}

/// A bounded, sanitized record of raw bytes: their sha256, size and the first
/// [`MAX_EXCERPT_CHARS`] characters with control characters replaced.
pub fn digest_bytes(bytes: &[u8]) -> Value {
    let head = &bytes[..bytes.len().min(MAX_EXCERPT_CHARS * 4)];
    let text = String::from_utf8_lossy(head);
    json!({
        "sha256": crate::canonical::sha256_hex(bytes),
        "bytes": bytes.len(),
        "excerpt": excerpt(&text),
    })
}

/// A bounded record of a JSON value: the sha256 of its canonical form, its size,
/// nesting depth and, when `with_excerpt`, the first characters of that form.
pub fn digest_value(value: &Value, with_excerpt: bool) -> Value {
    let canonical = crate::canonical::to_canonical_string(value);
    let mut digest = json!({
        "sha256": crate::canonical::sha256_hex(canonical.as_bytes()),
        "bytes": canonical.len(),
        "depth": depth(value),
    });
    if with_excerpt {
        digest["excerpt"] = json!(excerpt(&canonical));
    }
    digest
}

/// The first [`MAX_EXCERPT_CHARS`] characters of `text`, control characters replaced
/// by U+FFFD.
fn excerpt(text: &str) -> String {
    text.chars()
        .take(MAX_EXCERPT_CHARS)
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// The nesting depth of a value: 0 for a scalar, 1 for a flat object or array.
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|c| (c, d + 1))),
            Value::Object(map) => stack.extend(map.values().map(|c| (c, d + 1))),
            _ => continue,
        }
        deepest = deepest.max(d + 1);
    }
    deepest
}

/// The largest integer a JSON number carries exactly everywhere (2^53 - 1, ECMAScript's
/// `Number.MAX_SAFE_INTEGER`). The audit log's canonical form (RFC 8785) writes a
/// larger integer as the double nearest to it, so two such integers can hash the same.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Whether `value` holds an integer beyond +-[`MAX_SAFE_INTEGER`]: such a number's
/// hash (the arguments' hash, an approval's binding, an idempotency key's fingerprint)
/// would not tell it apart from its neighbours.
pub fn has_inexact_integer(value: &Value) -> bool {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Number(n) => {
                let beyond = match (n.as_u64(), n.as_i64()) {
                    (Some(u), _) => u > MAX_SAFE_INTEGER,
                    (None, Some(i)) => i.unsigned_abs() > MAX_SAFE_INTEGER,
                    (None, None) => false,
                };
                if beyond {
                    return true;
                }
            }
            Value::Array(items) => stack.extend(items.iter()),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
    false
}

/// The size of a value as compact JSON, counted without building it and stopping
/// once past `limit` (so the answer is exact up to `limit`, and `> limit` beyond).
pub fn json_size(value: &Value, limit: usize) -> usize {
    let mut size = 0usize;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        size += match v {
            Value::Null => 4,
            Value::Bool(b) => 4 + usize::from(!b),
            Value::Number(n) => n.to_string().len(),
            Value::String(s) => s.len() + 2,
            Value::Array(items) => {
                stack.extend(items.iter());
                2 + items.len().saturating_sub(1)
            }
            Value::Object(map) => {
                stack.extend(map.values());
                2 + map.len().saturating_sub(1) + map.keys().map(|k| k.len() + 3).sum::<usize>()
            }
        };
        if size > limit {
            break;
        }
    }
    size
}

/// Parses a request already read as JSON (the MCP front builds one from headers).
pub fn parse_request_value(value: Value) -> Received {
    CallBody::from_value(value).and_then(CallBody::into_request)
}

/// [`CallBody::into_request`]: every problem at once, in the order of the fields.
fn check_call(body: CallBody) -> Received {
    let mut problems = Vec::new();
    for key in body.unknown.keys().take(MAX_NAMED_UNKNOWN) {
        problems.push(format!("unknown field `{}`", truncate(key, 64)));
    }
    if body.unknown.len() > MAX_NAMED_UNKNOWN {
        problems.push(format!(
            "{} more unknown fields",
            body.unknown.len() - MAX_NAMED_UNKNOWN
        ));
    }
    let role_id = required_id("role_id", &body.role_id, &mut problems);
    let run_id = required_id("run_id", &body.run_id, &mut problems);
    let lane_id = required_id("lane_id", &body.lane_id, &mut problems);
    let tool_name = required_id("tool_name", &body.tool_name, &mut problems);
    let mut partial = PartialRequest {
        role_id: role_id.clone(),
        run_id: run_id.clone(),
        lane_id: lane_id.clone(),
        tool_name: tool_name.clone(),
        received: Map::new(),
    };
    let arguments = required_object("arguments", body.arguments, &mut problems);
    // Kept as the value received until its bounds are checked, then unwrapped.
    let scope = required_object("scope", body.scope, &mut problems);
    let options = CallOptions::check(
        &body.timeout_ms,
        &body.idempotency_key,
        &body.dry_run,
        &body.approval_id,
        &mut problems,
    );
    check_bounds(&arguments, &scope, &mut partial, &mut problems);
    let scope = match scope {
        Some(Value::Object(m)) => Some(m),
        _ => None,
    };
    match (role_id, run_id, lane_id, tool_name, arguments, scope) {
        (
            Some(role_id),
            Some(run_id),
            Some(lane_id),
            Some(tool_name),
            Some(arguments),
            Some(scope),
        ) if problems.is_empty() => Ok(CallRequest {
            role_id,
            run_id,
            lane_id,
            tool_name,
            arguments,
            scope,
            timeout_ms: options.timeout_ms,
            idempotency_key: options.idempotency_key,
            dry_run: options.dry_run,
            approval_id: options.approval_id,
        }),
        _ => Err(Box::new((malformed(problems), partial))),
    }
}

/// A required id field: a string of 1 to [`MAX_ID_LEN`] bytes without control
/// characters.
fn required_id(name: &str, value: &Option<Value>, problems: &mut Vec<String>) -> Option<String> {
    match value {
        None | Some(Value::Null) => {
            problems.push(format!("missing required field `{name}`"));
            None
        }
        Some(Value::String(s)) if s.is_empty() || s.len() > MAX_ID_LEN => {
            problems.push(format!("`{name}` must be 1 to {MAX_ID_LEN} bytes"));
            None
        }
        Some(Value::String(s)) if s.chars().any(char::is_control) => {
            problems.push(format!("`{name}` must not contain control characters"));
            None
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            problems.push(format!("`{name}` must be a string, not {}", kind(other)));
            None
        }
    }
}

/// A required object field (`arguments`, `scope`); `{}` stands for none.
fn required_object(name: &str, value: Option<Value>, problems: &mut Vec<String>) -> Option<Value> {
    match value {
        Some(v @ Value::Object(_)) => Some(v),
        None | Some(Value::Null) => {
            problems.push(format!(
                "missing required field `{name}` (use {{}} for none)"
            ));
            None
        }
        Some(other) => {
            problems.push(format!("`{name}` must be an object, not {}", kind(&other)));
            None
        }
    }
}

/// The optional fields of a call.
struct CallOptions {
    timeout_ms: Option<u64>,
    idempotency_key: Option<String>,
    dry_run: bool,
    approval_id: Option<String>,
}

impl CallOptions {
    fn check(
        timeout_ms: &Option<Value>,
        idempotency_key: &Option<Value>,
        dry_run: &Option<Value>,
        approval_id: &Option<Value>,
        problems: &mut Vec<String>,
    ) -> CallOptions {
        let timeout_ms = match timeout_ms {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(ms) if ms > 0 => Some(ms),
                _ => {
                    problems.push("`timeout_ms` must be a positive integer".into());
                    None
                }
            },
        };
        let idempotency_key = match idempotency_key {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_KEY_LEN => Some(s.clone()),
            Some(_) => {
                problems.push(format!(
                    "`idempotency_key` must be a string of 1 to {MAX_KEY_LEN} bytes"
                ));
                None
            }
        };
        let dry_run = match dry_run {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                problems.push(format!("`dry_run` must be a boolean, not {}", kind(other)));
                false
            }
        };
        let approval_id = match approval_id {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if is_approval_id(s) => Some(s.clone()),
            Some(_) => {
                problems.push(format!(
                    "`approval_id` must be a string of 1 to {MAX_ID_LEN} letters, digits, `-` or `_`"
                ));
                None
            }
        };
        CallOptions {
            timeout_ms,
            idempotency_key,
            dry_run,
            approval_id,
        }
    }
}

/// Bounds: depth and size, so that everything accepted can also be audited. What is
/// beyond them is kept in `partial` as a digest.
fn check_bounds(
    arguments: &Option<Value>,
    scope: &Option<Value>,
    partial: &mut PartialRequest,
    problems: &mut Vec<String>,
) {
    if let Some(scope) = scope {
        let (d, size) = (depth(scope), json_size(scope, MAX_SCOPE_BYTES));
        if d > MAX_DEPTH {
            problems.push(format!("`scope` is nested deeper than {MAX_DEPTH} levels"));
        }
        if size > MAX_SCOPE_BYTES {
            problems.push(format!("`scope` is larger than {MAX_SCOPE_BYTES} bytes"));
        }
        if d > MAX_DEPTH || size > MAX_SCOPE_BYTES {
            partial
                .received
                .insert("scope".into(), digest_value(scope, true));
        }
    }
    if let Some(arguments) = arguments
        && depth(arguments) > MAX_DEPTH
    {
        problems.push(format!(
            "`arguments` is nested deeper than {MAX_DEPTH} levels"
        ));
        // Hash only: arguments are kept readable only once the tool's redaction is known.
        partial
            .received
            .insert("arguments".into(), digest_value(arguments, false));
    }
    for (name, value) in [("arguments", arguments), ("scope", scope)] {
        if value.as_ref().is_some_and(has_inexact_integer) {
            problems.push(format!(
                "`{name}` holds an integer beyond +-{MAX_SAFE_INTEGER} (send it as a string)"
            ));
        }
    }
}

/// An approval id as a caller may send it: 1 to 128 ASCII letters, digits, `-`, `_`.
pub fn is_approval_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn malformed(problems: Vec<String>) -> Refusal {
    let first = problems.first().cloned().unwrap_or_default();
    let message = if problems.len() > 1 {
        format!(
            "malformed request: {first} (and {} more)",
            problems.len() - 1
        )
    } else {
        format!("malformed request: {first}")
    };
    Refusal::new(Reason::RequestMalformed, message).with_details(json!({ "problems": problems }))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn truncate(s: &str, max: usize) -> String {
    crate::text::prefix_chars(s, max)
}

/// What a caller can do to its call while it runs: give up on it, and hear how far it
/// got. Every field is optional in effect: the default signals never cancel and drop
/// progress.
#[derive(Debug, Clone, Default)]
pub struct CallSignals {
    /// Cancelled when the caller gave up (an MCP `notifications/cancelled`, a dropped
    /// connection): the call's execution is stopped and it closes as `cancelled`.
    pub cancel: tokio_util::sync::CancellationToken,
    /// Where the tool's progress goes. A `watch` holds only the latest report, so a
    /// flood of upstream notifications costs one slot however fast it comes.
    pub progress: Option<tokio::sync::watch::Sender<Option<Progress>>>,
    /// The MCP method that carried the call (`tools/call`), for the span's
    /// `mcp.method.name`; None for the HTTP API.
    pub mcp_method: Option<&'static str>,
}

/// Longest progress message kept (longer ones are cut).
pub const MAX_PROGRESS_MESSAGE_BYTES: usize = 1024;

/// One progress report of a running tool (MCP `notifications/progress`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Progress {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

impl CallSignals {
    /// Reports progress, replacing any report the caller has not read yet.
    pub fn report(&self, progress: Progress) {
        if let Some(sender) = &self.progress {
            sender.send_replace(Some(progress));
        }
    }
}

/// The four outcomes of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Success,
    Failed,
    Denied,
    Timeout,
}

impl Status {
    /// The status a refusal or failure gives the call.
    pub fn of(reason: Reason) -> Status {
        match reason.info().error_code {
            ErrorCode::Timeout => Status::Timeout,
            ErrorCode::Denied | ErrorCode::InvalidArguments => Status::Denied,
            ErrorCode::NotImplemented | ErrorCode::DependencyDown | ErrorCode::InternalError => {
                Status::Failed
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::Failed => "failed",
            Status::Denied => "denied",
            Status::Timeout => "timeout",
        }
    }
}

/// An output too large to return inline, stored content-addressed in the data
/// directory and fetched with `GET /v1/artifacts/{sha256}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArtifactRef {
    pub sha256: String,
    pub bytes: u64,
    pub media_type: &'static str,
    pub uri: String,
}

/// The names of the 13 pipeline steps, as the contract gives them.
pub const STEP_NAMES: [&str; 13] = [
    "receive request",
    "verify caller identity",
    "verify run_id exists",
    "validate lane authorization",
    "validate tool is registered and enabled",
    "validate lane permits tool",
    "validate required scope keys",
    "enforce prohibition rules",
    "emit tool_requested",
    "execute tool via adapter",
    "capture output and register artifacts",
    "emit closing audit event",
    "return response",
];

/// The response to a tool call: the same shape for every outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallResponse {
    pub call_id: String,
    pub status: Status,
    pub tool_name: Option<String>,
    pub tool_version: Option<String>,
    pub execution_time_ms: u64,
    pub output: Option<Value>,
    pub artifact: Option<ArtifactRef>,
    pub error_code: Option<ErrorCode>,
    pub error_message: Option<String>,
    /// The event that closed this call in the audit log.
    pub audit_event_id: Option<String>,
    pub diagnostic: Option<Diagnostic>,
    pub trace: Trace,
    /// Present on dry runs: the decision, never executed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<DryRun>,
    /// True when this is the stored outcome of an earlier call with the same
    /// idempotency key, returned without executing again.
    pub replayed: bool,
    /// On a replay: the call_id of the first call, whose outcome this is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<String>,
    /// A two-phase tool's prepared call: `{"phase": "prepared", "commit": {commit_id,
    /// deadline, deadline_unix_ms, commit_url}}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Map<String, Value>>,
    /// A sandboxed tool process's resource use (seed 000's response metrics): present
    /// when a confined local process ran for the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
}

/// The response's `metrics`: the call's duration, and the tool process's CPU time and
/// peak resident memory from its resource usage at exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Metrics {
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_peak_mb: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DryRun {
    pub decision: Decision,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    Deny,
}

/// The outcome of steps 1-8 in a form two policies' decisions can be compared by
/// (shadow mode, `audit replay`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub decision: Decision,
    /// The denial reason (`prohibited_flag`, ...), the step and the message.
    pub reason: Option<String>,
    pub step: Option<u8>,
    pub message: Option<String>,
}

impl Verdict {
    /// Allow, or the refusal's reason, step and message.
    pub fn of(refusal: Option<&Refusal>) -> Verdict {
        match refusal {
            None => Verdict {
                decision: Decision::Allow,
                reason: None,
                step: None,
                message: None,
            },
            Some(r) => Verdict {
                decision: Decision::Deny,
                reason: Some(r.reason.as_str().to_string()),
                step: Some(r.step()),
                message: Some(r.message.clone()),
            },
        }
    }

    /// Whether two verdicts differ in decision or in denial reason (not in wording).
    pub fn diverges(&self, other: &Verdict) -> bool {
        self.decision != other.decision || self.reason != other.reason
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn unknown_fields_are_named_up_to_a_bound_and_the_rest_counted() {
        let fields: Vec<String> = (0..5000).map(|i| format!("\"u{i:05}\": 0")).collect();
        let body = format!("{{{}}}", fields.join(","));
        let (refusal, _) = *parse_request(body.as_bytes()).unwrap_err();
        let problems: Vec<String> =
            serde_json::from_value(refusal.details["problems"].clone()).unwrap();
        let named = problems
            .iter()
            .filter(|p| p.starts_with("unknown field"))
            .count();
        assert_eq!(named, MAX_NAMED_UNKNOWN, "{problems:?}");
        assert!(
            problems.contains(&format!("{} more unknown fields", 5000 - MAX_NAMED_UNKNOWN)),
            "{problems:?}"
        );
        assert!(
            refusal.details.to_string().len() < 2048,
            "{}",
            refusal.details
        );
    }

    #[test]
    fn integers_a_hash_cannot_tell_apart_are_refused() {
        let call = |arguments: &str, scope: &str| {
            let body = format!(
                r#"{{"role_id": "r", "run_id": "u", "lane_id": "l", "tool_name": "t", "arguments": {arguments}, "scope": {scope}}}"#
            );
            parse_request(body.as_bytes()).map_err(|e| e.0.message)
        };
        for (arguments, scope, refused) in [
            (r#"{"n": 9007199254740991}"#, "{}", None),
            (r#"{"n": -9007199254740991}"#, "{}", None),
            (r#"{"n": 1.5e300, "m": 0.25}"#, "{}", None),
            (
                r#"{"n": 9007199254740992}"#,
                "{}",
                Some("`arguments` holds an integer"),
            ),
            (
                r#"{"n": [{"m": -9007199254740993}]}"#,
                "{}",
                Some("`arguments` holds"),
            ),
            (
                r#"{"n": 18446744073709551615}"#,
                "{}",
                Some("`arguments` holds"),
            ),
            (
                "{}",
                r#"{"case": 9007199254740993}"#,
                Some("`scope` holds an integer"),
            ),
        ] {
            match (call(arguments, scope), refused) {
                (Ok(_), None) => {}
                (Err(message), Some(needle)) => assert!(message.contains(needle), "{message}"),
                (answer, _) => panic!("{arguments} {scope}: {answer:?}"),
            }
        }
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let body = br#"{"role_id": 7, "lane_id": "", "tool_name": "t", "arguments": [], "extra": 1, "dry_run": "yes"}"#;
        let (refusal, partial) = *parse_request(body).unwrap_err();
        assert_eq!(refusal.reason, Reason::RequestMalformed);
        let problems: Vec<String> =
            serde_json::from_value(refusal.details["problems"].clone()).unwrap();
        let all = problems.join("\n");
        for needle in [
            "unknown field `extra`",
            "`role_id` must be a string",
            "missing required field `run_id`",
            "`lane_id` must be 1 to",
            "`arguments` must be an object",
            "missing required field `scope`",
            "`dry_run` must be a boolean",
        ] {
            assert!(all.contains(needle), "{needle} not in {all}");
        }
        assert_eq!(partial.tool_name.as_deref(), Some("t"));
    }

    #[test]
    fn not_json_and_not_utf8_are_malformed() {
        let (r, _) = *parse_request(b"\xff\xfe").unwrap_err();
        assert!(r.message.contains("UTF-8"), "{}", r.message);
        let (r, _) = *parse_request(b"{nope").unwrap_err();
        assert!(r.message.contains("not valid JSON"), "{}", r.message);
        let deep = "[".repeat(10_000);
        let (r, _) = *parse_request(deep.as_bytes()).unwrap_err();
        assert_eq!(r.reason, Reason::RequestMalformed);
    }

    #[test]
    fn a_good_request_parses() {
        let body = br#"{"role_id":"r","run_id":"u","lane_id":"l","tool_name":"t","arguments":{},"scope":{"case_id":"C"},"timeout_ms":50,"idempotency_key":"k"}"#;
        let req = parse_request(body).unwrap();
        assert_eq!(req.timeout_ms, Some(50));
        assert_eq!(req.idempotency_key.as_deref(), Some("k"));
        assert!(!req.dry_run);
    }
}
