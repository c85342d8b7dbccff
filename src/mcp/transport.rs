//! The MCP transport checks of the 2025-11-25 and 2026-07-28 Streamable HTTP specs
//! (Origin, protocol version, Accept, batches), made on the request's headers and body
//! before the front hands it to rmcp.

use hyper::http::HeaderMap;
use rmcp::model::ErrorCode;
use serde_json::{Value, json};

use super::front::{SUPPORTED_VERSIONS, diagnostic_data};
use crate::diagnostic::{Reason, Refusal};

/// The environment variable listing the browser origins allowed besides localhost
/// (comma-separated, exact `scheme://host[:port]`).
pub const ALLOWED_ORIGINS_ENV: &str = "TOOLGATE_MCP_ALLOWED_ORIGINS";

/// The transport checks of the 2025-11-25 and 2026-07-28 Streamable HTTP specs, made
/// before the body is handed to rmcp, each with a reason of its own:
///
/// - `Origin` (when present) is a localhost origin or one listed in
///   [`ALLOWED_ORIGINS_ENV`] (`origin_not_allowed`, 403; DNS rebinding defence);
/// - `MCP-Protocol-Version` (when present) is one of [`SUPPORTED_VERSIONS`]
///   (`protocol_version_unsupported`, 400, answered as the JSON-RPC error of
///   [`jsonrpc_error`]);
/// - `Accept` lists both `application/json` and `text/event-stream`
///   (`accept_unsupported`, 406);
/// - the body is one JSON-RPC message, not a batch (`batch_unsupported`, 400).
pub fn refusal(headers: &HeaderMap, body: &[u8]) -> Option<Refusal> {
    if let Some(origin) = headers.get(hyper::header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if !origin_allowed(origin, &allowed_origins()) {
            return Some(
                Refusal::new(
                    Reason::OriginNotAllowed,
                    format!("the origin `{}` may not call /mcp", shorten(origin)),
                )
                .with_details(json!({ "origin": shorten(origin) })),
            );
        }
    }
    if let Some(version) = headers.get("mcp-protocol-version") {
        let version = version.to_str().unwrap_or_default();
        if !SUPPORTED_VERSIONS.iter().any(|v| v.as_str() == version) {
            let supported: Vec<&str> = SUPPORTED_VERSIONS.iter().map(|v| v.as_str()).collect();
            return Some(
                Refusal::new(
                    Reason::ProtocolVersionUnsupported,
                    format!(
                        "MCP-Protocol-Version `{}` is not supported; supported: {}",
                        shorten(version),
                        supported.join(", ")
                    ),
                )
                .with_details(json!({ "supported": supported, "requested": shorten(version) })),
            );
        }
    }
    if !accepts_both(headers) {
        return Some(Refusal::new(
            Reason::AcceptUnsupported,
            "the Accept header must list application/json and text/event-stream",
        ));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Some(Refusal::new(
            Reason::BatchUnsupported,
            "a JSON-RPC batch is not accepted: send one message per POST",
        ));
    }
    None
}

/// The JSON-RPC error that answers a transport refusal, when the protocol defines
/// one: an unsupported `MCP-Protocol-Version` is the 2026-07-28 revision's
/// `UnsupportedProtocolVersion` error (`-32022`, HTTP 400) with `data.supported` (the
/// revisions the front speaks) and `data.requested` (the header's value), which a
/// client reads to pick a version it shares; toolgate's diagnostic (with `status`)
/// rides along as `data.diagnostic`. The error answers the request's `id` when the
/// body names one (else null). None for the other transport refusals, which keep the
/// HTTP API's structured refusal body.
pub fn jsonrpc_error(refusal: &Refusal, body: &[u8]) -> Option<Value> {
    if refusal.reason != Reason::ProtocolVersionUnsupported {
        return None;
    }
    let id = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(message)) => match message.get("id") {
            Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
            _ => Value::Null,
        },
        _ => Value::Null,
    };
    Some(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": ErrorCode::UNSUPPORTED_PROTOCOL_VERSION.0,
            "message": refusal.message,
            "data": {
                "supported": refusal.details["supported"],
                "requested": refusal.details["requested"],
                "diagnostic": diagnostic_data(refusal),
            },
        },
    }))
}

/// At most 200 characters of a header value, for messages.
fn shorten(value: &str) -> String {
    crate::text::prefix_chars(value, 200)
}

/// The origins of [`ALLOWED_ORIGINS_ENV`], read once.
fn allowed_origins() -> Vec<String> {
    static ORIGINS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    ORIGINS
        .get_or_init(|| {
            std::env::var(ALLOWED_ORIGINS_ENV)
                .unwrap_or_default()
                .split(',')
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .filter(|o| !o.is_empty())
                .collect()
        })
        .clone()
}

/// Whether `origin` may call: a loopback origin (`http(s)://localhost`, `127.0.0.1` or
/// `[::1]`, any port) or one of `allowed` exactly.
pub(super) fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    if allowed.contains(&origin) {
        return true;
    }
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let host = if let Some(v6) = rest.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, port)) if port.is_empty() || is_port(port) => host,
            _ => return false,
        }
    } else {
        match rest.split_once(':') {
            Some((host, port)) if is_port(port) => host,
            Some(_) => return false,
            None => rest,
        }
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

fn is_port(text: &str) -> bool {
    let digits = text.strip_prefix(':').unwrap_or(text);
    !digits.is_empty() && digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `Accept` lists JSON and SSE (wildcards count).
fn accepts_both(headers: &HeaderMap) -> bool {
    let mut json = false;
    let mut sse = false;
    for value in headers.get_all(hyper::header::ACCEPT) {
        for item in value.to_str().unwrap_or_default().split(',') {
            let media = item
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase();
            match media.as_str() {
                "*/*" => {
                    json = true;
                    sse = true;
                }
                "application/json" | "application/*" => json = true,
                "text/event-stream" | "text/*" => sse = true,
                _ => {}
            }
        }
    }
    json && sse
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use hyper::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                hyper::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    #[test]
    fn an_unsupported_version_is_the_json_rpc_error_of_2026_07_28() {
        let accept = ("accept", "application/json, text/event-stream");
        let asked = headers(&[accept, ("mcp-protocol-version", "2024-11-05")]);
        let body = br#"{"jsonrpc": "2.0", "id": "r-1", "method": "tools/list"}"#;
        let refused = refusal(&asked, body).unwrap();
        let error = jsonrpc_error(&refused, body).unwrap();
        assert_eq!(error["id"], "r-1");
        assert_eq!(error["error"]["code"], -32022);
        let data = &error["error"]["data"];
        assert_eq!(data["requested"], "2024-11-05");
        assert_eq!(
            data["supported"],
            json!(["2025-06-18", "2025-11-25", "2026-07-28"])
        );
        assert_eq!(data["diagnostic"]["reason"], "protocol_version_unsupported");
        assert_eq!(data["diagnostic"]["status"], "denied");
        // Not JSON, or no id: the error's id is null.
        let error = jsonrpc_error(&refused, b"{").unwrap();
        assert_eq!(error["id"], Value::Null);
        // The other transport refusals keep the HTTP API's body.
        let batch = refusal(&headers(&[accept]), b"[]").unwrap();
        assert_eq!(jsonrpc_error(&batch, b"[]"), None);
    }

    #[test]
    fn origins_are_checked_against_localhost_and_the_allowlist() {
        let allowed = vec!["https://app.example".to_string()];
        for ok in [
            "http://localhost",
            "http://localhost:6274",
            "https://127.0.0.1:8443",
            "http://[::1]:3000",
            "https://app.example",
            "HTTPS://APP.EXAMPLE/",
        ] {
            assert!(origin_allowed(ok, &allowed), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://localhost:80@evil.example",
            "http://127.0.0.1.nip.io",
            "null",
            "file://",
            "https://app.example:444",
        ] {
            assert!(!origin_allowed(bad, &allowed), "{bad}");
        }
    }

    #[test]
    fn transport_checks_have_their_own_reasons() {
        let accept = ("accept", "application/json, text/event-stream");
        let reason = |pairs: &[(&str, &str)], body: &str| {
            refusal(&headers(pairs), body.as_bytes()).map(|r| r.reason)
        };
        assert_eq!(reason(&[accept], "{}"), None);
        for old in ["2024-11-05", "2025-03-26", "junk"] {
            assert_eq!(
                reason(&[accept, ("mcp-protocol-version", old)], "{}"),
                Some(Reason::ProtocolVersionUnsupported)
            );
        }
        assert_eq!(
            reason(&[accept, ("mcp-protocol-version", "2025-11-25")], "{}"),
            None
        );
        assert_eq!(
            reason(&[("accept", "application/json")], "{}"),
            Some(Reason::AcceptUnsupported)
        );
        assert_eq!(reason(&[accept], " [{}]"), Some(Reason::BatchUnsupported));
        assert_eq!(
            reason(&[accept, ("origin", "http://evil.example")], "{}"),
            Some(Reason::OriginNotAllowed)
        );
    }
}
