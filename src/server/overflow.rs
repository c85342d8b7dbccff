//! The overflow path: a connection over the per-client or total cap (`limits.rs`)
//! answers the health endpoints and refuses the rest with a 429, outside hyper.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::handlers::{health, ready};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::Gateway;
use crate::limits::{Limit, Permit};
use crate::transport::{closing_json, json_response};

/// How long an overflow connection may take to send its request head.
const OVERFLOW_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest request head an overflow connection may send.
const OVERFLOW_HEAD_BYTES: usize = 2048;

/// An overflow connection: reads one request head (bounded in bytes and time),
/// answers `GET /healthz` and `GET /readyz`, refuses anything else with a 429, and
/// closes. It never reaches the pipeline and holds no more than one small buffer.
pub async fn serve(mut stream: TcpStream, permit: Permit, gateway: Arc<Gateway>) {
    let mut head = [0u8; OVERFLOW_HEAD_BYTES];
    let mut len = 0;
    let read = async {
        while len < head.len() && !head[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut head[len..]).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => len += n,
            }
        }
        true
    };
    if !matches!(
        tokio::time::timeout(OVERFLOW_READ_TIMEOUT, read).await,
        Ok(true)
    ) {
        return;
    }
    let response = match request_line(&head[..len]) {
        Some(("GET", "/healthz", _)) => closing_json(200, &health()),
        Some(("GET", "/readyz", _)) => closing_json(200, &ready(&gateway)),
        _ => {
            let limit = permit.overflow().unwrap_or(Limit::Connections);
            let refusal = Refusal::new(
                Reason::RateLimited,
                format!(
                    "too many connections ({}); this one only answers /healthz and /readyz",
                    limit.as_str().replace('_', " ")
                ),
            )
            .with_details(json!({ "limit": limit.as_str(), "retry_after_ms": 1000 }));
            json_response(429, &refusal)
        }
    };
    let _ = tokio::time::timeout(OVERFLOW_READ_TIMEOUT, stream.write_all(&response)).await;
    let _ = stream.shutdown().await;
    drop(permit);
}

/// The method, path and HTTP/1 minor version of a request head's request line (read
/// by httparse), None when the line is not a valid one.
fn request_line(head: &[u8]) -> Option<(&str, &str, u8)> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        // Only the request line matters: a head cut off at the limit, or with more
        // headers than are read here, was parsed past it.
        Ok(_) | Err(httparse::Error::TooManyHeaders) => {}
        Err(_) => return None,
    }
    Some((request.method?, request.path?, request.version?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_whole_request_line_is_read() {
        let many: String = (0..40).map(|i| format!("x-{i}: 1\r\n")).collect();
        for (head, expected) in [
            (
                "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n".to_string(),
                Some(("GET", "/healthz", 1)),
            ),
            (
                "GET /readyz HTTP/1.0\r\n\r\n".to_string(),
                Some(("GET", "/readyz", 0)),
            ),
            (
                format!("GET /healthz HTTP/1.1\r\n{many}\r\n"),
                Some(("GET", "/healthz", 1)),
            ),
            (
                "GET /healthz HTTP/1.1\r\nHost: a\r\n".to_string(),
                Some(("GET", "/healthz", 1)),
            ),
            ("GET /healthz".to_string(), None),
            ("GET /healthz HTTP/2.0\r\n\r\n".to_string(), None),
            ("GET  /healthz HTTP/1.1\r\n\r\n".to_string(), None),
            ("GET /healthz HTTP/1.1 x\r\n\r\n".to_string(), None),
        ] {
            assert_eq!(request_line(head.as_bytes()), expected, "{head:?}");
        }
    }
}
