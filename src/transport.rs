//! The connection beneath the HTTP parser: gives hyper's own refusals a JSON body.
//!
//! When hyper cannot parse a request (a bad request line, a NUL in a header, an
//! invalid or negative `Content-Length`, obsolete line folding, too many headers, a URI
//! over its limit) it answers by itself, before any handler runs, with a status line,
//! `content-length: 0` and no body, then closes the connection. [`JsonRefusals`] wraps
//! the socket and replaces exactly such a response (an error status with an empty
//! body, which toolgate's own handlers never send) with the same status and the
//! structured refusal body every other toolgate refusal has.
//!
//! INVARIANT: only a complete response head with status 400-599 and
//! `content-length: 0` is replaced; every other byte passes through unchanged.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::diagnostic::{Reason, Refusal};

/// A socket whose bodiless error responses are rewritten as JSON refusals.
pub struct JsonRefusals<S> {
    inner: S,
    /// A replacement response still being written, and how much of it was.
    pending: Vec<u8>,
    written: usize,
}

impl<S> JsonRefusals<S> {
    pub fn new(inner: S) -> Self {
        JsonRefusals {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

impl<S: AsyncWrite + Unpin> JsonRefusals<S> {
    /// Writes what is left of a replacement response.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonRefusals<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonRefusals<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        if let Some(replacement) = replacement(buf) {
            self.pending = replacement;
            self.written = 0;
            // Accepted whole; the replacement is written now or by the next flush.
            if let Poll::Ready(Err(e)) = self.drain(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The JSON response replacing `buf`, when `buf` is one complete bodiless error
/// response head.
fn replacement(buf: &[u8]) -> Option<Vec<u8>> {
    let rest = buf.strip_prefix(b"HTTP/1.1 ")?;
    if !buf.ends_with(b"\r\n\r\n") || buf.len() > 1024 {
        return None;
    }
    let status: u16 = std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()?;
    if !(400..=599).contains(&status) {
        return None;
    }
    let head = String::from_utf8_lossy(buf).to_ascii_lowercase();
    if !head.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let refusal = refusal_for(status);
    Some(json_response(status, &refusal))
}

/// What each of hyper's own refusals means.
fn refusal_for(status: u16) -> Refusal {
    let (reason, message) = match status {
        431 => (
            Reason::RequestTooLarge,
            "the request headers are too many or too large",
        ),
        414 => (Reason::RequestTooLarge, "the request uri is too long"),
        _ => (
            Reason::RequestMalformed,
            "the request is not valid http/1.1 (request line, header syntax, obsolete line folding, or message framing)",
        ),
    };
    Refusal::new(reason, message).with_details(json!({ "problems": [message] }))
}

/// A complete HTTP/1.1 response carrying `refusal` as the structured body; the
/// connection closes after it.
pub fn json_response(status: u16, refusal: &Refusal) -> Vec<u8> {
    let diagnostic = refusal.diagnostic();
    let body = json!({
        "status": crate::call::Status::of(refusal.reason),
        "error_code": diagnostic.error_code,
        "error_message": refusal.message,
        "diagnostic": diagnostic,
    });
    closing_json(status, &body)
}

/// A complete HTTP/1.1 response with `body`, after which the connection closes. The
/// status line's phrase is the status's canonical one.
pub fn closing_json(status: u16, body: &serde_json::Value) -> Vec<u8> {
    let body = body.to_string();
    let phrase = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    format!(
        "HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn only_bodiless_error_heads_are_replaced() {
        let hyper_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Mon, 23 Nov 2026 10:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(replacement(hyper_400).unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
        let body: serde_json::Value =
            serde_json::from_str(out.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["diagnostic"]["reason"], "request_malformed");
        let h431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert!(
            String::from_utf8(replacement(h431).unwrap())
                .unwrap()
                .contains("request_too_large")
        );
        // A toolgate response (a body), a success, a partial head: untouched.
        assert!(replacement(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n").is_none());
    }
}
