//! The event line: how a [`NewEvent`] becomes the one line of canonical JSON that is
//! stored, hashed and exported.
//!
//! The expensive part (canonicalizing each field's value) happens in the appending task
//! ([`prepare`]); the writer thread only merges in the four fields it owns (`event_id`,
//! `prev`, `seq`, `timestamp_utc`) by key order ([`render`]). Because every key is ASCII,
//! byte order is the RFC 8785 (UTF-16 code unit) order, so the result is exactly the RFC
//! 8785 serialization of the whole object; a unit test holds the two together.

use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::FormatItem;
use time::macros::format_description;

use super::{AuditError, EventType, NewEvent};
use crate::canonical::{sorted_entries, write_canonical, write_number, write_string};
use crate::policy::PolicyVersions;

/// The `prev` of the first event: 64 zeros.
pub const GENESIS_PREV: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// The largest integer every JSON implementation (JavaScript and Python's included)
/// represents exactly: 2^53 - 1.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;
/// No event line is longer than this.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// Nesting deeper than this in `arguments` or `details` is refused.
const MAX_DEPTH: usize = 64;

const TIMESTAMP: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// `timestamp_utc`: RFC 3339, UTC, millisecond precision, fixed width (so that string
/// order is time order).
pub fn format_timestamp(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    if !(0..=9999).contains(&at.year()) {
        return at.format(TIMESTAMP).unwrap_or_default();
    }
    // The same text as TIMESTAMP, written directly: the writer stamps every commit
    // with it, and the format description's interpreter cost a few microseconds.
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.millisecond()
    )
}

/// The `event_id` of the event with this seq.
pub fn event_id(seq: u64) -> String {
    format!("ev-{seq:012}")
}

/// An event whose fields are already canonical JSON, waiting for its place in the log.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub event_type: EventType,
    pub run_id: Option<String>,
    /// (key, canonical JSON of the value), sorted by key; none of the writer's keys.
    fields: Vec<(&'static str, String)>,
    /// The length of the rendered line without the writer's fields.
    len: usize,
}

/// Writes `value` in RFC 8785 form, replacing what a JSON implementation might not
/// reproduce byte for byte: a number that is not an integer within +-(2^53 - 1)
/// becomes a string holding its RFC 8785 form. Nesting deeper than [`MAX_DEPTH`] is
/// refused. Writes straight into `out`, without building an intermediate value.
fn write_portable(value: &Value, depth: usize, out: &mut String) -> Result<(), AuditError> {
    if depth > MAX_DEPTH {
        return Err(AuditError::InvalidEvent {
            what: format!("nesting deeper than {MAX_DEPTH} levels"),
        });
    }
    match value {
        Value::Number(n) => {
            let safe = n.as_u64().is_some_and(|v| v <= MAX_SAFE_INTEGER)
                || n.as_i64()
                    .is_some_and(|v| v.unsigned_abs() <= MAX_SAFE_INTEGER);
            if safe {
                write_number(n, out);
            } else if n.is_f64() {
                let mut text = String::new();
                write_number(n, &mut text);
                write_string(&text, out);
            } else {
                // An integer beyond 2^53: its exact decimal digits.
                write_string(&n.to_string(), out);
            }
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_portable(item, depth + 1, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => write_portable_map(map, depth, out)?,
        other => write_canonical(other, out),
    }
    Ok(())
}

/// [`write_portable`] for an object at `depth`.
fn write_portable_map(
    map: &Map<String, Value>,
    depth: usize,
    out: &mut String,
) -> Result<(), AuditError> {
    out.push('{');
    for (i, (key, item)) in sorted_entries(map).enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        write_portable(item, depth + 1, out)?;
    }
    out.push('}');
    Ok(())
}

/// [`write_portable`] into a new string.
fn portable_text(value: &Value) -> Result<String, AuditError> {
    let mut out = String::with_capacity(64);
    write_portable(value, 0, &mut out)?;
    Ok(out)
}

/// A JSON string as RFC 8785 writes it: `"` and `\` escaped, the five short escapes
/// for \b \t \n \f \r, `\u00xx` (lowercase) for the other control characters, and
/// everything else as is. Same bytes as the canonicalizer, without building a `Value`.
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    write_string(s, &mut out);
    out
}

/// `policy_versions` in RFC 8785 form, written directly (every event carries it; going
/// through `serde_json::Value` cost two allocations per string): the keys of both
/// levels are ASCII and written in sorted order. A unit test holds it to the
/// canonicalizer.
fn policy_versions_text(versions: &PolicyVersions) -> String {
    let mut out = String::with_capacity(320);
    out.push('{');
    for (i, (key, file)) in [
        ("lanes", &versions.lanes),
        ("registry", &versions.registry),
        ("roles", &versions.roles),
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            out.push(',');
        }
        write_string(key, &mut out);
        out.push_str(":{\"sha256\":");
        write_string(&file.sha256, &mut out);
        out.push_str(",\"version\":");
        write_string(&file.version, &mut out);
        out.push('}');
    }
    out.push('}');
    out
}

/// Canonicalizes the event's fields; fails on an event too large or too deep.
pub(crate) fn prepare(event: &NewEvent) -> Result<Prepared, AuditError> {
    // Pushed in key order, so the sort below (kept as the guarantee) finds them sorted.
    let mut fields: Vec<(&'static str, String)> = Vec::with_capacity(20);
    if let Some(arguments) = &event.arguments {
        fields.push(("arguments", portable_text(arguments)?));
    }
    let text =
        |fields: &mut Vec<(&'static str, String)>, key: &'static str, value: &Option<String>| {
            if let Some(v) = value {
                fields.push((key, string(v)));
            }
        };
    text(
        &mut fields,
        "arguments_hash_sha256",
        &event.arguments_hash_sha256,
    );
    text(
        &mut fields,
        "arguments_hmac_sha256",
        &event.arguments_hmac_sha256,
    );
    text(&mut fields, "call_id", &event.call_id);
    fields.push(("contract_version", string(crate::CONTRACT_VERSION)));
    let mut details = String::with_capacity(256);
    write_portable_map(&event.details, 0, &mut details)?;
    fields.push(("details", details));
    text(&mut fields, "error_code", &event.error_code);
    if let Some(ms) = event.execution_time_ms {
        fields.push(("execution_time_ms", ms.min(MAX_SAFE_INTEGER).to_string()));
    }
    if let Some(step) = event.failed_step {
        fields.push(("failed_step", step.to_string()));
    }
    text(&mut fields, "lane_id", &event.lane_id);
    text(&mut fields, "output_hash_sha256", &event.output_hash_sha256);
    if let Some(versions) = &event.policy_versions {
        fields.push(("policy_versions", policy_versions_text(versions)));
    }
    text(&mut fields, "reason", &event.reason);
    text(&mut fields, "role_id", &event.role_id);
    text(&mut fields, "run_id", &event.run_id);
    text(&mut fields, "tool_name", &event.tool_name);
    text(&mut fields, "tool_version", &event.tool_version);
    fields.push(("type", string(event.event_type.as_str())));
    fields.sort_by(|a, b| a.0.cmp(b.0));
    // {"key":value,...}: quotes, colon and comma per field, braces.
    let len = fields
        .iter()
        .map(|(k, v)| k.len() + v.len() + 4)
        .sum::<usize>()
        + 2;
    // Room for the writer's fields: about 160 bytes.
    if len + 200 > MAX_LINE_BYTES {
        return Err(AuditError::TooLarge {
            what: "event line".into(),
            limit: MAX_LINE_BYTES as u64,
        });
    }
    Ok(Prepared {
        event_type: event.event_type,
        run_id: event.run_id.clone(),
        fields,
        len,
    })
}

/// The canonical line of `prepared` at `seq`, with its timestamp and `prev`.
pub(crate) fn render(prepared: &Prepared, seq: u64, timestamp_utc: &str, prev: &str) -> String {
    let id = event_id(seq);
    let seq_text = seq.to_string();
    // Sorted, as the merge below requires; strings are written quoted.
    let own: [(&str, &str, bool); 4] = [
        ("event_id", &id, true),
        ("prev", prev, true),
        ("seq", &seq_text, false),
        ("timestamp_utc", timestamp_utc, true),
    ];
    let mut line = String::with_capacity(prepared.len + 180);
    line.push('{');
    let mut first = true;
    let mut push = |line: &mut String, key: &str, value: &str, quoted: bool| {
        if !first {
            line.push(',');
        }
        first = false;
        line.push('"');
        line.push_str(key);
        line.push_str("\":");
        if quoted {
            // Writer values are ASCII without quotes or backslashes.
            line.push('"');
            line.push_str(value);
            line.push('"');
        } else {
            line.push_str(value);
        }
    };
    let mut own_iter = own.iter().peekable();
    for (key, value) in &prepared.fields {
        while let Some((k, v, q)) = own_iter.next_if(|(k, _, _)| *k < *key) {
            push(&mut line, k, v, *q);
        }
        push(&mut line, key, value, false);
    }
    for (k, v, q) in own_iter {
        push(&mut line, k, v, *q);
    }
    line.push('}');
    line
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::canonical::to_canonical_string;
    use crate::policy::FileVersion;
    use serde_json::json;

    #[test]
    fn timestamps_are_written_as_the_format_description_writes_them() {
        use time::macros::datetime;
        let instants = [
            datetime!(2026-11-24 07:05:09.000 UTC),
            datetime!(2026-01-01 00:00:00.001 UTC),
            datetime!(1999-12-31 23:59:59.999999 UTC),
            datetime!(0001-02-03 04:05:06.078 UTC),
            datetime!(9999-12-31 23:59:59.9999 UTC),
            datetime!(2026-11-24 01:30:00.5 +05:30),
            datetime!(2026-03-01 23:00:00.123 -02:00),
            datetime!(0000-01-01 00:00:00 UTC),
            datetime!(-0001-12-31 23:59:59.25 UTC),
        ];
        for at in instants {
            let slow = at
                .to_offset(time::UtcOffset::UTC)
                .format(TIMESTAMP)
                .unwrap();
            assert_eq!(format_timestamp(at), slow, "{at}");
        }
    }

    fn full_event() -> NewEvent {
        let mut e = NewEvent::new(EventType::ToolExecuted);
        e.call_id = Some("call-1".into());
        e.run_id =
            Some("run-\u{e9}\"x\"\n\t\r\u{8}\u{c}\u{1}\u{1f}\u{7f}\u{2028}\\/\u{1F600}".into());
        e.role_id = Some("paralegal".into());
        e.lane_id = Some("research".into());
        e.tool_name = Some("read_document".into());
        e.tool_version = Some("1.2.0".into());
        e.arguments_hash_sha256 = Some("ab".repeat(32));
        e.arguments_hmac_sha256 = Some("cd".repeat(32));
        e.arguments = Some(
            json!({"path": "a/b", "n": 3, "f": 1.5, "big": 9007199254740993u64, "z\u{10000}": [1, {"\u{e000}": 2}]}),
        );
        e.output_hash_sha256 = Some("ef".repeat(32));
        e.error_code = Some("TOOL_TIMEOUT".into());
        e.reason = Some("timeout".into());
        e.failed_step = Some(10);
        e.execution_time_ms = Some(u64::MAX);
        let v = |s: &str| FileVersion {
            version: s.into(),
            sha256: "00".repeat(32),
        };
        e.policy_versions = Some(PolicyVersions {
            roles: v("1"),
            lanes: v("2"),
            registry: v("3"),
        });
        e.details.insert("dry_run".into(), json!(false));
        e
    }

    #[test]
    fn rendered_lines_are_rfc8785_canonical() {
        for event in [NewEvent::new(EventType::PolicyLoaded), full_event()] {
            let prepared = prepare(&event).unwrap();
            let line = render(&prepared, 42, "2026-01-02T03:04:05.678Z", GENESIS_PREV);
            let value: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(to_canonical_string(&value), line);
            assert_eq!(value["seq"], json!(42));
            assert_eq!(value["event_id"], json!("ev-000000000042"));
            assert_eq!(value["prev"], json!(GENESIS_PREV));
            assert_eq!(value["contract_version"], json!(crate::CONTRACT_VERSION));
        }
    }

    #[test]
    fn policy_versions_are_written_as_the_canonicalizer_writes_them() {
        let v = |version: &str, sha: &str| FileVersion {
            version: version.into(),
            sha256: sha.into(),
        };
        for versions in [
            PolicyVersions {
                roles: v("1", &"00".repeat(32)),
                lanes: v("2026.11.1", &"ab".repeat(32)),
                registry: v("3", "x"),
            },
            PolicyVersions {
                roles: v("\u{e9}\"q\"\n\u{1}\u{1F600}", "\\"),
                lanes: v("", ""),
                registry: v("\u{2028}", "\u{7f}"),
            },
        ] {
            let value = serde_json::to_value(&versions).unwrap();
            assert_eq!(policy_versions_text(&versions), to_canonical_string(&value));
        }
    }

    #[test]
    fn numbers_outside_the_safe_range_become_strings() {
        let line = render(&prepare(&full_event()).unwrap(), 1, "t", GENESIS_PREV);
        let value: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["arguments"]["f"], json!("1.5"));
        assert_eq!(value["arguments"]["big"], json!("9007199254740993"));
        assert_eq!(value["arguments"]["n"], json!(3));
        assert_eq!(value["execution_time_ms"], json!(MAX_SAFE_INTEGER));
        // Absent fields are omitted, details is always there.
        let bare: Value = serde_json::from_str(&render(
            &prepare(&NewEvent::new(EventType::PolicyLoaded)).unwrap(),
            1,
            "t",
            GENESIS_PREV,
        ))
        .unwrap();
        assert!(bare.get("run_id").is_none());
        assert_eq!(bare["details"], json!({}));
    }

    #[test]
    fn nesting_is_allowed_up_to_the_limit() {
        let nested = |levels: usize| {
            let mut v = json!(1);
            for _ in 0..levels {
                v = json!([v]);
            }
            let mut e = NewEvent::new(EventType::ToolRequested);
            e.details.insert("v".into(), v);
            prepare(&e)
        };
        // details is level 0, its value level 1: MAX_DEPTH - 1 more levels fit.
        assert!(nested(MAX_DEPTH - 1).is_ok());
        assert!(matches!(
            nested(MAX_DEPTH),
            Err(AuditError::InvalidEvent { .. })
        ));
    }

    #[test]
    fn oversized_and_overdeep_events_are_refused() {
        let mut e = NewEvent::new(EventType::ToolRequested);
        e.arguments = Some(json!("x".repeat(MAX_LINE_BYTES)));
        assert!(matches!(prepare(&e), Err(AuditError::TooLarge { .. })));
        let mut deep = json!(1);
        for _ in 0..100 {
            deep = json!([deep]);
        }
        e.arguments = Some(deep);
        assert!(matches!(prepare(&e), Err(AuditError::InvalidEvent { .. })));
    }

    #[test]
    fn timestamps_are_fixed_width_utc_milliseconds() {
        let at = OffsetDateTime::from_unix_timestamp_nanos(1_767_323_045_678_900_000).unwrap();
        assert_eq!(format_timestamp(at), "2026-01-02T03:04:05.678Z");
    }
}
