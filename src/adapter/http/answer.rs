//! The http adapter's mapping of an upstream's answer to an output or an error.

use hyper::StatusCode;
use hyper::header::{CONTENT_TYPE, LOCATION, RETRY_AFTER};
use serde_json::{Value, json};

use super::{Answer, ERROR_BODY_BYTES, within};
use crate::adapter::{ExecContext, ExecError, parse_output, truncate};

/// Maps an upstream's answer: 2xx JSON (or text as `{"text": ...}`), 3xx never followed,
/// 429 retryable with its `Retry-After`, other 4xx the tool's error, 5xx the upstream
/// down.
pub(super) async fn map_answer(
    label: &str,
    answer: Answer,
    ctx: &ExecContext<'_>,
) -> Result<Value, ExecError> {
    let status = answer.status;
    let excerpt = || {
        truncate(
            String::from_utf8_lossy(&answer.body).trim(),
            ERROR_BODY_BYTES,
        )
    };
    if status.is_success() {
        let content_type = answer
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let json = content_type.contains("json");
        if !json && (answer.body.is_empty() || content_type.starts_with("text/")) {
            return text_output(label, status, answer.body);
        }
        let body = answer.body;
        let fallback = (!json && std::str::from_utf8(&body).is_ok()).then(|| body.clone());
        return match within(ctx, parse_output(body)).await? {
            Ok(value) => Ok(value),
            Err(_) if fallback.is_some() => {
                text_output(label, status, fallback.unwrap_or_default())
            }
            Err(e) => Err(ExecError::OutputNotJson(format!(
                "upstream `{label}` answered {status} with a body that is not one json value: {e}"
            ))),
        };
    }
    if status.is_redirection() {
        let host = answer
            .headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|l| {
                reqwest::Url::parse(&format!("http://{label}/"))
                    .ok()?
                    .join(l)
                    .ok()
            })
            .and_then(|u| u.host_str().map(str::to_string))
            .unwrap_or_else(|| "unknown".to_string());
        return Err(ExecError::Failed(format!(
            "upstream `{label}` answered {status} redirecting to host `{host}`; redirects are not followed"
        )));
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        let retry_after_ms = answer
            .headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(retry_after_ms);
        return Err(ExecError::RateLimited {
            message: format!("upstream `{label}` answered {status}: {}", excerpt()),
            retry_after_ms,
        });
    }
    if status.is_server_error() {
        return Err(ExecError::DependencyDown(format!(
            "upstream `{label}` answered {status}: {}",
            excerpt()
        )));
    }
    Err(ExecError::Failed(format!(
        "upstream `{label}` answered {status}: {}",
        excerpt()
    )))
}

/// A text answer as `{"text": ...}`; a body that is not UTF-8 is not an output.
fn text_output(label: &str, status: StatusCode, body: Vec<u8>) -> Result<Value, ExecError> {
    match String::from_utf8(body) {
        Ok(text) => Ok(json!({ "text": text })),
        Err(_) => Err(ExecError::OutputNotJson(format!(
            "upstream `{label}` answered {status} with a body that is neither json nor utf-8 text"
        ))),
    }
}

/// `Retry-After` in milliseconds: delay-seconds or an HTTP date (RFC 9110), at most a
/// day.
fn retry_after_ms(value: &str) -> Option<u64> {
    let value = value.trim();
    let seconds = match value.parse::<u64>() {
        Ok(s) => s,
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            at.duration_since(std::time::SystemTime::now())
                .map(|d| d.as_secs())
                .unwrap_or(0)
        }
    };
    Some(seconds.min(86_400).saturating_mul(1000))
}
