//! JSON log lines: one object per event, its fields flattened beside `timestamp`,
//! `level` and `target`, written straight into the line (issue 19: the general JSON
//! formatter of `tracing-subscriber` builds a map of every field per line, a tenth of
//! a gated call's CPU with the per-call log line on).
//!
//! The line has the keys of that formatter's flattened form (`timestamp` RFC 3339 in
//! UTC with microseconds, `level`, `message` and the fields, `target`), so what reads
//! the logs is unchanged; the keys come in the order the event records them.

use std::fmt;

use time::OffsetDateTime;
use time::format_description::FormatItem;
use time::macros::format_description;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

const TIMESTAMP: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");

/// The event formatter of `--log-format json`.
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writer.write_str(&line(event, OffsetDateTime::now_utc()))
    }
}

/// The JSON line of `event` at `now`, newline included.
fn line(event: &Event<'_>, now: OffsetDateTime) -> String {
    let mut out = Vec::with_capacity(384);
    out.extend_from_slice(b"{\"timestamp\":");
    let stamp = now.format(TIMESTAMP).unwrap_or_default();
    push_str(&mut out, &stamp);
    out.extend_from_slice(b",\"level\":\"");
    out.extend_from_slice(event.metadata().level().as_str().as_bytes());
    out.push(b'"');
    event.record(&mut Fields { out: &mut out });
    out.extend_from_slice(b",\"target\":");
    push_str(&mut out, event.metadata().target());
    out.extend_from_slice(b"}\n");
    // Only valid UTF-8 went in: the pieces are `&str`s and JSON escapes of them.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A JSON string literal of `value` (serde_json's escaping) appended to `out`.
fn push_str(out: &mut Vec<u8>, value: &str) {
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"\"\"");
    }
}

/// Writes each field as `,"name":value`.
struct Fields<'a> {
    out: &'a mut Vec<u8>,
}

impl Fields<'_> {
    fn key(&mut self, field: &Field) {
        self.out.push(b',');
        push_str(self.out, field.name());
        self.out.push(b':');
    }

    fn number(&mut self, field: &Field, value: impl fmt::Display) {
        self.key(field);
        self.out.extend_from_slice(value.to_string().as_bytes());
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.key(field);
        push_str(self.out, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.number(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.number(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.number(field, value);
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.number(field, value);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.number(field, value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.number(field, value);
        } else {
            // JSON has no NaN or infinity; tracing-subscriber writes null too.
            self.key(field);
            self.out.extend_from_slice(b"null");
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.key(field);
        push_str(self.out, &value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.key(field);
        push_str(self.out, &format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Lines captured from a subscriber using [`JsonLines`].
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(emit: impl FnOnce()) -> Vec<Value> {
        let captured = Captured::default();
        let sink = captured.clone();
        // Events only, as in `trace::init`: a layer interested in spans would make the
        // process-wide interest of span callsites "always" while it lives, and spans
        // made on other test threads then stop being disabled.
        let layer = tracing_subscriber::fmt::layer()
            .event_format(JsonLines)
            .with_writer(move || sink.clone())
            .with_filter(tracing_subscriber::filter::filter_fn(|m| m.is_event()));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(text.ends_with('\n'), "{text}");
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn every_kind_of_field_is_one_json_value_and_strings_are_escaped() {
        let error = std::io::Error::other("disk \"full\"");
        let lines = logged(|| {
            tracing::warn!(
                target: "toolgate::call",
                call_id = %"call-1",
                text = "quote \" backslash \\ newline \n tab \t bell \u{7} snow \u{2603}",
                count = 7_u64,
                delta = -3_i64,
                ratio = 0.5_f64,
                nan = f64::NAN,
                yes = true,
                debug = ?vec![1, 2],
                error = &error as &(dyn std::error::Error + 'static),
                "tool {}", "call"
            );
        });
        assert_eq!(lines.len(), 1);
        let line = &lines[0];
        let stamp = line["timestamp"].as_str().unwrap();
        assert!(
            OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339).is_ok(),
            "{stamp}"
        );
        assert_eq!(stamp.len(), "2026-11-24T05:40:00.123456Z".len(), "{stamp}");
        let mut rest = line.as_object().unwrap().clone();
        rest.remove("timestamp");
        assert_eq!(
            Value::Object(rest),
            json!({
                "level": "WARN",
                "message": "tool call",
                "call_id": "call-1",
                "text": "quote \" backslash \\ newline \n tab \t bell \u{7} snow \u{2603}",
                "count": 7,
                "delta": -3,
                "ratio": 0.5,
                "nan": null,
                "yes": true,
                "debug": "[1, 2]",
                "error": "disk \"full\"",
                "target": "toolgate::call",
            })
        );
    }

    #[test]
    fn a_message_with_quotes_backslashes_and_control_characters_stays_valid_json() {
        let lines = logged(|| tracing::info!(r#"a "quoted" message with \ and {}"#, '\u{1}'));
        assert_eq!(
            lines[0]["message"],
            json!("a \"quoted\" message with \\ and \u{1}")
        );
    }
}
