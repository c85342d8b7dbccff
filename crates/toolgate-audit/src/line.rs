//! The event line: how a [`NewEvent`] becomes the one line of canonical JSON that is
//! stored, hashed and exported.
//!
//! The expensive part (canonicalizing each field's value) happens in the appending task
//! ([`prepare`]); the writer thread only merges in the four fields it owns (`event_id`,
//! `prev`, `seq`, `timestamp_utc`) by key order ([`render`]). Because every key is ASCII,
//! byte order is the RFC 8785 (UTF-16 code unit) order, so the result is exactly the RFC
//! 8785 serialization of the whole object; a unit test holds the two together.

use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::FormatItem;
use time::macros::format_description;

use super::{AuditError, EventType, NewEvent};
use crate::canonical::{self, Portable, TooDeep, write_portable_u64, write_string};

/// The `prev` of the first event: 64 zeros.
pub const GENESIS_PREV: &str = "0000000000000000000000000000000000000000000000000000000000000000";
pub use crate::canonical::MAX_SAFE_INTEGER;

/// The `version:` an author wrote and the sha256 of the file bytes, for each of the
/// policy's three registries: a line's `policy_versions`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyVersions {
    pub roles: FileVersion,
    pub lanes: FileVersion,
    pub registry: FileVersion,
}

/// One registry file's version in [`PolicyVersions`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileVersion {
    /// The author's `version:` string.
    pub version: String,
    /// Lowercase hex sha256 of the file bytes as read.
    pub sha256: String,
}
/// No event line is longer than this.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// Nesting deeper than this in `arguments` or `details` is refused.
const MAX_DEPTH: usize = canonical::MAX_PORTABLE_DEPTH;

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
    // with it, and the format description's interpreter (and then `format!`'s
    // padding) cost a few microseconds.
    let mut text = *b"0000-00-00T00:00:00.000Z";
    for (at_digits, value) in [
        (0..4, at.year().unsigned_abs()),
        (5..7, u32::from(u8::from(at.month()))),
        (8..10, u32::from(at.day())),
        (11..13, u32::from(at.hour())),
        (14..16, u32::from(at.minute())),
        (17..19, u32::from(at.second())),
        (20..23, u32::from(at.millisecond())),
    ] {
        let mut value = value;
        for digit in text[at_digits].iter_mut().rev() {
            *digit = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    String::from_utf8_lossy(&text).into_owned()
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
    /// Every field but the writer's, in key order, each written `,"key":value`.
    text: String,
    /// Where in `text` the writer's four fields go (`event_id`, `prev`, `seq`,
    /// `timestamp_utc`, in that order): each is the end of the fields sorting before it.
    gaps: [usize; 4],
}

/// The writer's fields, in key order.
const WRITER_KEYS: [&str; 4] = ["event_id", "prev", "seq", "timestamp_utc"];

/// Writes an event's fields in key order into one buffer (issue 19: one allocation for
/// the whole line instead of one per field), noting where the writer's fields go.
struct Fields {
    text: String,
    gaps: [usize; 4],
    /// How many of the writer's keys sort before the fields written so far.
    passed: usize,
    last: &'static str,
}

impl Fields {
    fn new(capacity: usize) -> Fields {
        Fields {
            text: String::with_capacity(capacity),
            gaps: [0; 4],
            passed: 0,
            last: "",
        }
    }

    /// Writes `,"key":` and returns where the value goes. Keys come in sorted order.
    fn key(&mut self, key: &'static str) -> &mut String {
        debug_assert!(self.last < key, "`{key}` written after `{}`", self.last);
        self.last = key;
        while self.passed < WRITER_KEYS.len() && WRITER_KEYS[self.passed] < key {
            self.gaps[self.passed] = self.text.len();
            self.passed += 1;
        }
        self.text.push_str(",\"");
        self.text.push_str(key);
        self.text.push_str("\":");
        &mut self.text
    }

    /// A string field, when present.
    fn string(&mut self, key: &'static str, value: &Option<String>) {
        if let Some(value) = value {
            write_string(value, self.key(key));
        }
    }

    fn finish(mut self) -> (String, [usize; 4]) {
        while self.passed < WRITER_KEYS.len() {
            self.gaps[self.passed] = self.text.len();
            self.passed += 1;
        }
        (self.text, self.gaps)
    }
}

/// [`canonical::write_portable`] refusing nesting deeper than [`MAX_DEPTH`] as an
/// invalid event.
fn write_portable(value: &Value, depth: usize, out: &mut String) -> Result<(), AuditError> {
    canonical::write_portable(value, depth, out).map_err(too_deep)
}

fn too_deep(_: TooDeep) -> AuditError {
    AuditError::InvalidEvent {
        what: format!("nesting deeper than {MAX_DEPTH} levels"),
    }
}

/// `policy_versions` in RFC 8785 form, written directly (every event carries it; going
/// through `serde_json::Value` cost two allocations per string): the keys of both
/// levels are ASCII and written in sorted order. A unit test holds it to the
/// canonicalizer.
fn write_policy_versions(versions: &PolicyVersions, out: &mut String) {
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
        write_string(key, out);
        out.push_str(":{\"sha256\":");
        write_string(&file.sha256, out);
        out.push_str(",\"version\":");
        write_string(&file.version, out);
        out.push('}');
    }
    out.push('}');
}

/// `details` in the line's form: the entries of `event.details` and the rendered ones
/// of `event.details_portable`, merged in RFC 8785 key order. A key given in both, or
/// twice, is refused.
fn write_details(event: &NewEvent, out: &mut String) -> Result<(), AuditError> {
    if event.details_portable.is_empty() {
        return canonical::write_portable_map(&event.details, 0, out).map_err(too_deep);
    }
    enum Entry<'a> {
        Value(&'a Value),
        Rendered(&'a Portable),
    }
    let mut entries: Vec<(&str, Entry)> = canonical::sorted_entries(&event.details)
        .map(|(key, value)| (key.as_str(), Entry::Value(value)))
        .chain(
            event
                .details_portable
                .iter()
                .map(|(key, rendered)| (*key, Entry::Rendered(rendered))),
        )
        .collect();
    entries.sort_by(|a, b| canonical::utf16_cmp(a.0, b.0));
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(AuditError::InvalidEvent {
            what: format!("`details.{}` given twice", pair[0].0),
        });
    }
    out.push('{');
    for (i, (key, entry)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        match entry {
            Entry::Value(value) => write_portable(value, 1, out)?,
            Entry::Rendered(rendered) => out.push_str(rendered.as_str()),
        }
    }
    out.push('}');
    Ok(())
}

/// Canonicalizes the event's fields; fails on an event too large or too deep.
pub(crate) fn prepare(event: &NewEvent) -> Result<Prepared, AuditError> {
    let mut fields = Fields::new(1536);
    match (&event.arguments, &event.arguments_portable) {
        (Some(_), Some(_)) => {
            return Err(AuditError::InvalidEvent {
                what: "`arguments` given twice".into(),
            });
        }
        (Some(arguments), None) => write_portable(arguments, 0, fields.key("arguments"))?,
        (None, Some(rendered)) => fields.key("arguments").push_str(rendered.as_str()),
        (None, None) => {}
    }
    fields.string("arguments_hash_sha256", &event.arguments_hash_sha256);
    fields.string("arguments_hmac_sha256", &event.arguments_hmac_sha256);
    fields.string("call_id", &event.call_id);
    write_string(crate::CONTRACT_VERSION, fields.key("contract_version"));
    write_details(event, fields.key("details"))?;
    fields.string("error_code", &event.error_code);
    if let Some(ms) = event.execution_time_ms {
        write_portable_u64(ms.min(MAX_SAFE_INTEGER), fields.key("execution_time_ms"));
    }
    if let Some(step) = event.failed_step {
        write_portable_u64(u64::from(step), fields.key("failed_step"));
    }
    fields.string("lane_id", &event.lane_id);
    fields.string("output_hash_sha256", &event.output_hash_sha256);
    if let Some(versions) = &event.policy_versions {
        write_policy_versions(versions, fields.key("policy_versions"));
    }
    fields.string("reason", &event.reason);
    fields.string("role_id", &event.role_id);
    fields.string("run_id", &event.run_id);
    fields.string("tool_name", &event.tool_name);
    fields.string("tool_version", &event.tool_version);
    write_string(event.event_type.as_str(), fields.key("type"));
    let (text, gaps) = fields.finish();
    // Room for the writer's fields: about 160 bytes.
    if text.len() + 200 > MAX_LINE_BYTES {
        return Err(AuditError::TooLarge {
            what: "event line".into(),
            limit: MAX_LINE_BYTES as u64,
        });
    }
    Ok(Prepared {
        event_type: event.event_type,
        run_id: event.run_id.clone(),
        text,
        gaps,
    })
}

/// The canonical line of `prepared` at `seq`, with its timestamp and `prev`: the
/// prepared fields with the writer's four merged in at their places.
pub(crate) fn render(prepared: &Prepared, seq: u64, timestamp_utc: &str, prev: &str) -> String {
    use std::fmt::Write;
    let text = &prepared.text;
    let [id_at, prev_at, seq_at, ts_at] = prepared.gaps;
    let mut line = String::with_capacity(text.len() + 200);
    line.push('{');
    // Every field is written with a leading comma; the first one (always a prepared
    // field: `contract_version` sorts before all of the writer's) loses it.
    let head = &text[..id_at];
    line.push_str(head.strip_prefix(',').unwrap_or(head));
    let _ = write!(line, ",\"event_id\":\"ev-{seq:012}\"");
    line.push_str(&text[id_at..prev_at]);
    // The writer's values are ASCII without quotes or backslashes.
    let _ = write!(line, ",\"prev\":\"{prev}\"");
    line.push_str(&text[prev_at..seq_at]);
    let _ = write!(line, ",\"seq\":{seq}");
    line.push_str(&text[seq_at..ts_at]);
    let _ = write!(line, ",\"timestamp_utc\":\"{timestamp_utc}\"");
    line.push_str(&text[ts_at..]);
    line.push('}');
    line
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::canonical::to_canonical_string;
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
        e.policy_versions = Some(std::sync::Arc::new(PolicyVersions {
            roles: v("1"),
            lanes: v("2"),
            registry: v("3"),
        }));
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
    fn rendered_fields_give_the_line_their_json_would_give() {
        // The pipeline hands over its arguments, scope and trace already rendered; the
        // line must be byte for byte the one the same values as JSON give.
        let mut by_json = full_event();
        let mut rendered = full_event();
        let arguments = rendered.arguments.take().unwrap();
        rendered.arguments_portable = Some(Portable::of(&arguments, 0).unwrap());
        let trace = json!({"passed_step": 8, "big": 9007199254740993u64, "\u{e000}": 1});
        let scope = json!({"case_id": "C-1", "z\u{10000}": [0.5]});
        for (key, value) in [("trace", trace), ("scope", scope)] {
            rendered
                .details_portable
                .push((key, Portable::of(&value, 1).unwrap()));
            by_json.details.insert(key.into(), value);
        }
        // Entries as JSON sort around the rendered ones.
        for (key, value) in [("a", json!("first")), ("zz", json!(null))] {
            rendered.details.insert(key.into(), value.clone());
            by_json.details.insert(key.into(), value);
        }
        let line = |e: &NewEvent| render(&prepare(e).unwrap(), 7, "t", GENESIS_PREV);
        assert_eq!(line(&rendered), line(&by_json));
        let value: Value = serde_json::from_str(&line(&rendered)).unwrap();
        assert_eq!(to_canonical_string(&value), line(&rendered));
    }

    #[test]
    fn a_field_given_both_rendered_and_as_json_is_refused() {
        let mut twice = full_event();
        twice.arguments_portable = Some(Portable::of(&json!({"x": 1}), 0).unwrap());
        assert!(matches!(
            prepare(&twice),
            Err(AuditError::InvalidEvent { .. })
        ));
        let mut twice = NewEvent::new(EventType::ToolRequested);
        twice.details.insert("trace".into(), json!({}));
        twice
            .details_portable
            .push(("trace", Portable::of(&json!({}), 1).unwrap()));
        assert!(matches!(
            prepare(&twice),
            Err(AuditError::InvalidEvent { .. })
        ));
        let mut twice = NewEvent::new(EventType::ToolRequested);
        for _ in 0..2 {
            twice
                .details_portable
                .push(("scope", Portable::of(&json!({}), 1).unwrap()));
        }
        assert!(matches!(
            prepare(&twice),
            Err(AuditError::InvalidEvent { .. })
        ));
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
            let mut text = String::new();
            write_policy_versions(&versions, &mut text);
            assert_eq!(text, to_canonical_string(&value));
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
