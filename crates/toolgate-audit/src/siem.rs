//! SIEM views of audit events: OCSF 1.8.0 records (JSON) and ArcSight CEF lines, each
//! carrying what ties it back to the evidence (seq, leaf hash, the signed checkpoint
//! that covers it, and with an export the inclusion proof).
//!
//! Both are derived from the event's canonical line alone (pure functions, no I/O), so
//! `audit export --format ocsf|cef` and the shippers (`serve --ship`) produce the same
//! records. docs/audit.md maps every field.
//!
//! INVARIANT: a value from the event (a tool name, an argument, a reason) never becomes
//! structure: in OCSF it is a JSON string; in CEF it is escaped so that it cannot end
//! its field, start another or break the line.

use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The OCSF schema version the records follow.
pub const OCSF_VERSION: &str = "1.8.0";
/// The product block of every record.
const PRODUCT: &str = "toolgate";

/// The signed checkpoint a record points at.
#[derive(Debug, Clone)]
pub struct CheckpointRef {
    pub size: u64,
    /// Hex RFC 9162 root.
    pub root: String,
    /// The whole C2SP signed note.
    pub note: String,
}

/// What ties a SIEM record back to the evidence.
#[derive(Debug, Clone)]
pub struct Evidence<'a> {
    pub seq: u64,
    /// Hex SHA-256(0x00 || line).
    pub leaf_hash: String,
    /// The signed checkpoint whose tree includes the event (None: none signed yet).
    pub checkpoint: Option<&'a CheckpointRef>,
    /// The RFC 9162 inclusion proof against `checkpoint` (hex hashes), when known.
    pub inclusion_proof: Option<Vec<String>>,
}

impl Evidence<'_> {
    fn to_json(&self) -> Value {
        let mut out = json!({
            "seq": self.seq,
            "leaf_index": self.seq.saturating_sub(1),
            "leaf_hash_sha256": self.leaf_hash,
            "leaf_hash_rule": "SHA-256(0x00 || raw_data)",
        });
        if let Some(c) = self.checkpoint {
            out["checkpoint"] = json!({"size": c.size, "root": c.root, "note": c.note});
        }
        if let Some(path) = &self.inclusion_proof {
            out["inclusion_proof"] = json!(path);
        }
        out
    }
}

/// The fields of a canonical line the views read.
struct Event<'a> {
    value: &'a Value,
}

impl<'a> Event<'a> {
    fn text(&self, key: &str) -> Option<&'a str> {
        self.value.get(key).and_then(Value::as_str)
    }
    fn number(&self, key: &str) -> Option<u64> {
        self.value.get(key).and_then(Value::as_u64)
    }
    fn kind(&self) -> &'a str {
        self.text("type").unwrap_or("unknown")
    }
    fn details(&self) -> Option<&'a Map<String, Value>> {
        self.value.get("details").and_then(Value::as_object)
    }
    fn detail(&self, key: &str) -> Option<&'a Value> {
        self.details().and_then(|d| d.get(key))
    }
    fn detail_text(&self, key: &str) -> Option<&'a str> {
        self.detail(key).and_then(Value::as_str)
    }
    /// Milliseconds since the Unix epoch of `timestamp_utc` (0 if unparseable).
    fn time_ms(&self) -> i64 {
        self.text("timestamp_utc")
            .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
            .map_or(0, |t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
    }
}

/// The OCSF class an event type maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    ApiActivity,
    EntityManagement,
    ApplicationLifecycle,
    EventLogActivity,
    Base,
}

impl Class {
    fn of(kind: &str) -> Class {
        match kind {
            "tool_requested" | "tool_allowed" | "tool_denied" | "tool_executed" | "tool_failed"
            | "tool_timeout" | "artifact_read" | "shadow_divergence" => Class::ApiActivity,
            "run_created" | "run_status_changed" | "run_repinned" | "run_token_issued"
            | "run_token_revoked" => Class::EntityManagement,
            "policy_loaded" | "safety_lock_engaged" | "safety_lock_released" => {
                Class::ApplicationLifecycle
            }
            "audit_segments_archived" => Class::EventLogActivity,
            _ => Class::Base,
        }
    }

    /// (class_uid, class_name, category_uid, category_name)
    fn ids(self) -> (u32, &'static str, u32, &'static str) {
        match self {
            Class::ApiActivity => (6003, "API Activity", 6, "Application Activity"),
            Class::EntityManagement => {
                (3004, "Entity Management", 3, "Identity & Access Management")
            }
            Class::ApplicationLifecycle => {
                (6002, "Application Lifecycle", 6, "Application Activity")
            }
            Class::EventLogActivity => (1008, "Event Log Activity", 1, "System Activity"),
            Class::Base => (0, "Base Event", 0, "Uncategorized"),
        }
    }
}

/// (activity_id, activity_name) of an event.
fn activity(class: Class, kind: &str) -> (u32, &'static str) {
    match (class, kind) {
        (Class::ApiActivity, "artifact_read") => (2, "Read"),
        (Class::ApiActivity, "shadow_divergence") => (99, "Shadow Decision"),
        (Class::ApiActivity, _) => (99, "Execute Tool"),
        (Class::EntityManagement, "run_created" | "run_token_issued") => (1, "Create"),
        (Class::EntityManagement, "run_token_revoked") => (11, "Deactivate"),
        (Class::EntityManagement, _) => (3, "Update"),
        (Class::ApplicationLifecycle, "safety_lock_engaged") => (7, "Disable"),
        (Class::ApplicationLifecycle, "safety_lock_released") => (6, "Enable"),
        (Class::ApplicationLifecycle, _) => (8, "Update"),
        (Class::EventLogActivity, _) => (4, "Archive"),
        (Class::Base, _) => (99, "Other"),
    }
}

/// How an event's outcome reads to a SIEM.
struct Outcome {
    status_id: u32,
    status: &'static str,
    severity_id: u32,
    severity: &'static str,
    /// security_control profile: (action_id, action, disposition_id, disposition).
    control: Option<(u32, &'static str, u32, &'static str)>,
    /// CEF severity 0-10.
    cef_severity: u8,
}

fn outcome(event: &Event) -> Outcome {
    let refused = event.text("error_code").is_some();
    let o = |status_id, status, severity_id, severity, control, cef_severity| Outcome {
        status_id,
        status,
        severity_id,
        severity,
        control,
        cef_severity,
    };
    match event.kind() {
        "tool_requested" => o(
            99,
            "Requested",
            1,
            "Informational",
            Some((3, "Observed", 17, "Logged")),
            3,
        ),
        "tool_allowed" | "tool_executed" => o(
            1,
            "Success",
            1,
            "Informational",
            Some((1, "Allowed", 1, "Allowed")),
            3,
        ),
        "tool_denied" => o(
            2,
            "Failure",
            3,
            "Medium",
            Some((2, "Denied", 2, "Blocked")),
            6,
        ),
        "tool_failed" | "tool_timeout" => {
            o(2, "Failure", 2, "Low", Some((1, "Allowed", 27, "Error")), 5)
        }
        "artifact_read" if refused => o(
            2,
            "Failure",
            3,
            "Medium",
            Some((2, "Denied", 2, "Blocked")),
            6,
        ),
        "artifact_read" => o(
            1,
            "Success",
            1,
            "Informational",
            Some((1, "Allowed", 1, "Allowed")),
            3,
        ),
        "shadow_divergence" => o(99, "Shadow", 2, "Low", None, 4),
        "safety_lock_engaged" => o(1, "Success", 4, "High", None, 8),
        "safety_lock_released" => o(1, "Success", 3, "Medium", None, 6),
        "run_token_revoked" | "audit_segments_archived" | "run_repinned" | "shadow_dropped" => {
            o(1, "Success", 2, "Low", None, 4)
        }
        _ => o(1, "Success", 1, "Informational", None, 3),
    }
}

/// The caller as OCSF `actor.user`: the proved identity (JWT subject or run token),
/// the role as a group.
fn actor_user(event: &Event) -> Option<Value> {
    let caller = event.detail("caller");
    let kind = caller.and_then(|c| c.get("kind")).and_then(Value::as_str);
    let mut user = Map::new();
    match kind {
        Some("jwt") => {
            let subject = caller
                .and_then(|c| c.get("subject"))
                .and_then(Value::as_str);
            if let Some(s) = subject {
                user.insert("uid".into(), json!(s));
                user.insert("name".into(), json!(s));
            }
            if let Some(issuer) = caller.and_then(|c| c.get("issuer")).and_then(Value::as_str) {
                user.insert("domain".into(), json!(issuer));
            }
            if let Some(jti) = caller.and_then(|c| c.get("jti")).and_then(Value::as_str) {
                user.insert("credential_uid".into(), json!(jti));
            }
        }
        Some("run_token") => {
            if let Some(id) = caller
                .and_then(|c| c.get("token_id"))
                .and_then(Value::as_str)
            {
                user.insert("credential_uid".into(), json!(id));
                user.insert("uid".into(), json!(format!("run-token:{id}")));
            }
        }
        _ => {}
    }
    let role = event.text("role_id");
    if let Some(role) = role {
        user.insert("groups".into(), json!([{"name": role, "type": "role"}]));
        if !user.contains_key("uid") {
            user.insert("name".into(), json!(role));
        }
    }
    if user.is_empty() {
        return None;
    }
    if !user.contains_key("uid") && !user.contains_key("name") {
        user.insert("name".into(), json!("unidentified"));
    }
    user.insert("type_id".into(), json!(99));
    user.insert("type".into(), json!("AI Agent"));
    Some(Value::Object(user))
}

/// An administrator named by an admin event (`details.by`).
fn admin_user(event: &Event) -> Option<Value> {
    let by = event.detail_text("by").or_else(|| {
        event
            .detail("run")
            .and_then(|r| r.get("created_by"))
            .and_then(Value::as_str)
    })?;
    Some(json!({"name": by, "type_id": 2, "type": "Admin"}))
}

fn message(event: &Event) -> String {
    let mut m = event.kind().to_string();
    if let Some(tool) = event.text("tool_name") {
        m.push(' ');
        m.push_str(tool);
    }
    if let Some(code) = event.text("error_code") {
        m.push_str(": ");
        m.push_str(code);
        if let Some(reason) = event.text("reason") {
            m.push_str(" (");
            m.push_str(reason);
            m.push(')');
        }
    }
    m
}

/// The OCSF 1.8.0 record of one event line (an object; `raw_data` is the line itself).
/// A line that is not a JSON object still yields a valid Base Event around it.
pub fn ocsf(line: &str, evidence: &Evidence) -> Value {
    let parsed: Value = serde_json::from_str(line).unwrap_or(Value::Null);
    let event = Event { value: &parsed };
    let kind = event.kind();
    let class = Class::of(kind);
    let (class_uid, class_name, category_uid, category_name) = class.ids();
    let (activity_id, activity_name) = activity(class, kind);
    let out = outcome(&event);
    let mut metadata = json!({
        "version": OCSF_VERSION,
        "product": {"name": PRODUCT, "vendor_name": PRODUCT, "version": env!("CARGO_PKG_VERSION")},
        "uid": event.text("event_id").unwrap_or_default(),
        "sequence": evidence.seq,
        "event_code": kind,
        "log_name": "audit",
        "log_provider": PRODUCT,
        "log_format": "toolgate canonical JSON (RFC 8785)",
    });
    if let Some(t) = event.text("timestamp_utc") {
        metadata["original_time"] = json!(t);
    }
    if let Some(call) = event.text("call_id") {
        metadata["correlation_uid"] = json!(call);
    }
    let mut record = json!({
        "class_uid": class_uid,
        "class_name": class_name,
        "category_uid": category_uid,
        "category_name": category_name,
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": class_uid * 100 + activity_id,
        "type_name": format!("{class_name}: {activity_name}"),
        "time": event.time_ms(),
        "severity_id": out.severity_id,
        "severity": out.severity,
        "status_id": out.status_id,
        "status": out.status,
        "message": message(&event),
        "raw_data": line,
    });
    if let Some(code) = event.text("error_code") {
        record["status_code"] = json!(code);
    }
    if let Some(reason) = event.text("reason") {
        record["status_detail"] = json!(reason);
    }
    // What has no OCSF field (or is needed to re-verify) goes under unmapped.toolgate.
    let mut extra = Map::new();
    extra.insert("evidence".into(), evidence.to_json());
    for key in [
        "event_id",
        "type",
        "prev",
        "lane_id",
        "failed_step",
        "arguments_hash_sha256",
        "arguments_hmac_sha256",
        "output_hash_sha256",
        "policy_versions",
        "contract_version",
    ] {
        if let Some(v) = parsed.get(key) {
            extra.insert(key.into(), v.clone());
        }
    }
    for key in [
        "caller",
        "diagnostic_details",
        "dry_run",
        "replay_of",
        "trigger",
        "source",
    ] {
        if let Some(v) = event.detail(key) {
            extra.insert(key.into(), v.clone());
        }
    }
    match class {
        Class::ApiActivity => api_activity(&event, kind, &out, &mut record, &mut metadata),
        Class::EntityManagement => entity_management(&event, kind, &mut record),
        Class::ApplicationLifecycle => {
            record["app"] = json!({
                "name": PRODUCT,
                "vendor_name": PRODUCT,
                "version": env!("CARGO_PKG_VERSION"),
            });
            // `actor` belongs to the host profile in this class: the admin stays in
            // unmapped.toolgate.details.by.
            if let Some(details) = event.details() {
                extra.insert("details".into(), Value::Object(details.clone()));
            }
        }
        Class::EventLogActivity => {
            record["log_name"] = json!("toolgate audit");
            record["log_provider"] = json!(PRODUCT);
            if let Some(details) = event.details() {
                extra.insert("details".into(), Value::Object(details.clone()));
            }
        }
        Class::Base => {
            if let Some(details) = event.details() {
                extra.insert("details".into(), Value::Object(details.clone()));
            }
        }
    }
    record["metadata"] = metadata;
    record["unmapped"] = json!({ "toolgate": Value::Object(extra) });
    record
}

/// The API Activity fields of a call's event: the tool as the service, the run as the
/// actor's session and the source endpoint, and a decision as a security control.
fn api_activity(
    event: &Event,
    kind: &str,
    out: &Outcome,
    record: &mut Value,
    metadata: &mut Value,
) {
    let parsed = event.value;
    let operation = match kind {
        "artifact_read" => "read_artifact",
        "shadow_divergence" => "shadow_decision",
        _ => "execute_tool",
    };
    let mut api = json!({"operation": operation});
    if let Some(tool) = event.text("tool_name") {
        api["service"] = json!({"name": tool});
        if let Some(v) = event.text("tool_version") {
            api["service"]["version"] = json!(v);
        }
    }
    if let Some(call) = event.text("call_id") {
        api["request"] = json!({"uid": call});
    }
    if let Some(code) = event.text("error_code") {
        api["response"] = json!({"error": code});
        if let Some(reason) = event.text("reason") {
            api["response"]["error_message"] = json!(reason);
        }
    }
    if let Some(lane) = event.text("lane_id") {
        api["group"] = json!({"name": lane, "type": "lane"});
    }
    record["api"] = api;
    let mut actor = Map::new();
    if let Some(run) = event.text("run_id") {
        actor.insert("session".into(), json!({"uid": run}));
    }
    if let Some(user) = actor_user(event) {
        actor.insert("user".into(), user);
    }
    if actor.is_empty() {
        actor.insert(
            "user".into(),
            json!({"name": "unidentified", "type_id": 0, "type": "Unknown"}),
        );
    }
    record["actor"] = Value::Object(actor);
    // The log records no network address: the endpoint is the run (or unknown).
    record["src_endpoint"] = match event.text("run_id") {
        Some(run) => json!({"uid": run, "type_id": 99, "type": "AI Agent Run"}),
        None => json!({"name": "unidentified", "type_id": 0, "type": "Unknown"}),
    };
    if let Some(ms) = event.number("execution_time_ms") {
        record["duration"] = json!(ms);
    }
    if let Some((action_id, action, disposition_id, disposition)) = out.control {
        metadata["profiles"] = json!(["security_control"]);
        record["action_id"] = json!(action_id);
        record["action"] = json!(action);
        record["disposition_id"] = json!(disposition_id);
        record["disposition"] = json!(disposition);
        if let Some(versions) = parsed.get("policy_versions") {
            let v = |k: &str| {
                versions
                    .get(k)
                    .and_then(|f| f.get("version"))
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_string()
            };
            record["policy"] = json!({
                "name": "toolgate policy",
                "version": format!("roles {}, lanes {}, registry {}", v("roles"), v("lanes"), v("registry")),
            });
        }
    }
}

/// The Entity Management fields of a run's or run token's event.
fn entity_management(event: &Event, kind: &str, record: &mut Value) {
    let (entity_type, uid) = match kind {
        "run_token_issued" | "run_token_revoked" => (
            "Run Token",
            event.detail_text("token_id").or(event.text("run_id")),
        ),
        _ => ("Run", event.text("run_id")),
    };
    let mut entity = json!({
        "type_id": 99,
        "type": entity_type,
        "name": uid.unwrap_or("unknown"),
    });
    if let Some(uid) = uid {
        entity["uid"] = json!(uid);
    }
    if let Some(details) = event.details().filter(|d| !d.is_empty()) {
        entity["data"] = Value::Object(details.clone());
    }
    record["entity"] = entity;
    let mut actor = Map::new();
    if let Some(user) = admin_user(event) {
        actor.insert("user".into(), user);
    }
    if let Some(run) = event.text("run_id") {
        actor.insert("session".into(), json!({"uid": run}));
    }
    if !actor.is_empty() {
        record["actor"] = Value::Object(actor);
    }
}

/// A CEF header field: `\` and `|` escaped, line breaks replaced by a space.
fn cef_header(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '|' => out.push_str("\\|"),
            '\r' | '\n' => out.push(' '),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A CEF extension value: `\`, `=` escaped, CR and LF as `\r` and `\n`, other control
/// characters replaced by a space.
pub fn cef_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '=' => out.push_str("\\="),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The CEF (version 0) line of one event, without a line break.
pub fn cef(line: &str, evidence: &Evidence) -> String {
    let parsed: Value = serde_json::from_str(line).unwrap_or(Value::Null);
    let event = Event { value: &parsed };
    let kind = event.kind();
    let out = outcome(&event);
    let mut ext: Vec<(&str, String)> = vec![
        ("rt", event.time_ms().to_string()),
        (
            "externalId",
            event.text("event_id").unwrap_or_default().to_string(),
        ),
        ("cn1Label", "seq".into()),
        ("cn1", evidence.seq.to_string()),
        ("outcome", out.status.to_lowercase()),
        ("msg", message(&event)),
    ];
    if let Some((_, action, _, _)) = out.control {
        ext.push(("act", action.to_lowercase()));
    }
    let mut push = |key: &'static str, value: Option<&str>| {
        if let Some(v) = value {
            ext.push((key, v.to_string()));
        }
    };
    push(
        "suser",
        actor_user(&event).as_ref().and_then(|u| {
            u.get("uid")
                .or_else(|| u.get("name"))
                .and_then(Value::as_str)
        }),
    );
    push("spriv", event.text("role_id"));
    push("cs1Label", event.text("run_id").map(|_| "run_id"));
    push("cs1", event.text("run_id"));
    push("cs2Label", event.text("call_id").map(|_| "call_id"));
    push("cs2", event.text("call_id"));
    push("cs3Label", event.text("tool_name").map(|_| "tool_name"));
    push("cs3", event.text("tool_name"));
    push("cs4Label", event.text("lane_id").map(|_| "lane_id"));
    push("cs4", event.text("lane_id"));
    push("cs5Label", event.text("error_code").map(|_| "error_code"));
    push("cs5", event.text("error_code"));
    push("reason", event.text("reason"));
    ext.push(("cs6Label", "leaf_hash_sha256".into()));
    ext.push(("cs6", evidence.leaf_hash.clone()));
    if let Some(step) = event.number("failed_step") {
        ext.push(("cn2Label", "failed_step".into()));
        ext.push(("cn2", step.to_string()));
    }
    if let Some(ms) = event.number("execution_time_ms") {
        ext.push(("cn3Label", "execution_time_ms".into()));
        ext.push(("cn3", ms.to_string()));
    }
    if let Some(c) = evidence.checkpoint {
        ext.push(("flexNumber1Label", "checkpoint_size".into()));
        ext.push(("flexNumber1", c.size.to_string()));
        ext.push(("flexString1Label", "checkpoint_root".into()));
        ext.push(("flexString1", c.root.clone()));
        ext.push(("flexString2Label", "checkpoint_note".into()));
        ext.push(("flexString2", c.note.clone()));
    }
    let extension = ext
        .iter()
        .map(|(k, v)| format!("{k}={}", cef_value(v)))
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "CEF:0|{PRODUCT}|{PRODUCT}|{}|{}|{}|{}|{extension}",
        cef_header(env!("CARGO_PKG_VERSION")),
        cef_header(kind),
        cef_header(&cef_name(kind)),
        out.cef_severity
    )
}

/// The CEF Name of an event type: `tool_denied` -> `tool denied`.
fn cef_name(kind: &str) -> String {
    kind.replace('_', " ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn evidence() -> Evidence<'static> {
        Evidence {
            seq: 7,
            leaf_hash: "ab".repeat(32),
            checkpoint: None,
            inclusion_proof: None,
        }
    }

    /// Splits a CEF extension into (key, unescaped value) pairs the way a receiver
    /// does: a key is `[A-Za-z0-9_]+` directly before an unescaped `=`.
    fn parse_extension(ext: &str) -> Vec<(String, String)> {
        let chars: Vec<char> = ext.chars().collect();
        let mut starts = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] == '\\' {
                i += 2;
                continue;
            }
            if chars[i] == '=' {
                let mut k = i;
                while k > 0 && (chars[k - 1].is_ascii_alphanumeric() || chars[k - 1] == '_') {
                    k -= 1;
                }
                starts.push((k, i));
            }
            i += 1;
        }
        let mut out = Vec::new();
        for (n, (k, eq)) in starts.iter().enumerate() {
            let end = starts.get(n + 1).map_or(chars.len(), |(next, _)| next - 1);
            let key: String = chars[*k..*eq].iter().collect();
            let raw: String = chars[eq + 1..end.max(eq + 1)].iter().collect();
            let mut value = String::new();
            let mut it = raw.chars();
            while let Some(c) = it.next() {
                if c == '\\' {
                    match it.next() {
                        Some('n') => value.push('\n'),
                        Some('r') => value.push('\r'),
                        Some(o) => value.push(o),
                        None => {}
                    }
                } else {
                    value.push(c);
                }
            }
            out.push((key, value));
        }
        out
    }

    #[test]
    fn a_hostile_tool_name_cannot_inject_cef_fields() {
        let hostile = "evil|x=1 act=allowed\\ cs5=OK\nCEF:0|a|b|c|d|e|1|suser=root\r";
        let line = json!({
            "type": "tool_denied", "seq": 7, "event_id": "ev-000000000007",
            "tool_name": hostile, "reason": "a=b\\c", "error_code": "POLICY_DENIED",
            "timestamp_utc": "2026-01-02T03:04:05.678Z", "details": {},
        })
        .to_string();
        let cef = cef(&line, &evidence());
        assert!(!cef.contains('\n') && !cef.contains('\r'), "{cef}");
        // The header has exactly 7 unescaped pipes.
        let header_pipes = cef
            .char_indices()
            .filter(|(i, c)| *c == '|' && !cef[..*i].ends_with('\\'))
            .count();
        assert!(header_pipes >= 7);
        let ext = cef.splitn(8, '|').nth(7).unwrap();
        let fields = parse_extension(ext);
        let get = |k: &str| {
            fields
                .iter()
                .filter(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("cs3"), vec![hostile.to_string()]);
        assert_eq!(get("act"), vec!["denied".to_string()]);
        assert_eq!(get("cs5"), vec!["POLICY_DENIED".to_string()]);
        assert_eq!(get("reason"), vec!["a=b\\c".to_string()]);
        assert!(get("suser").is_empty());
    }

    #[test]
    fn cef_escapes_follow_the_spec() {
        assert_eq!(cef_value("a=b\\c\nd\re|f"), "a\\=b\\\\c\\nd\\re|f");
        assert_eq!(cef_header("a|b\\c\nd=e"), "a\\|b\\\\c d=e");
    }

    #[test]
    fn a_line_that_is_not_an_event_is_a_base_event() {
        let record = ocsf("not json", &evidence());
        assert_eq!(record["class_uid"], json!(0));
        assert_eq!(record["raw_data"], json!("not json"));
        assert_eq!(record["unmapped"]["toolgate"]["evidence"]["seq"], json!(7));
    }
}
