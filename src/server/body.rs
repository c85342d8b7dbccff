//! Request bodies: the one body type `handle` takes, and reading it within the
//! server's size and time limits.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{CONTENT_LENGTH, HeaderMap};
use serde_json::json;

use super::ServerOptions;
use crate::diagnostic::{Reason, Refusal};

/// The body of a request: as it arrives on a connection, or whole (a request built in
/// memory, as the tests of `server::handle` do). One concrete type, so the request
/// path is compiled once, in this crate, whoever calls it.
#[derive(Debug)]
pub enum RequestBody {
    Incoming(Incoming),
    Whole(Full<Bytes>),
}

impl From<Incoming> for RequestBody {
    fn from(body: Incoming) -> Self {
        RequestBody::Incoming(body)
    }
}

impl From<Bytes> for RequestBody {
    fn from(bytes: Bytes) -> Self {
        RequestBody::Whole(Full::new(bytes))
    }
}

impl hyper::body::Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RequestBody::Incoming(body) => Pin::new(body).poll_frame(cx),
            RequestBody::Whole(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(|never: Infallible| match never {}))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Incoming(body) => body.is_end_stream(),
            RequestBody::Whole(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Incoming(body) => body.size_hint(),
            RequestBody::Whole(body) => body.size_hint(),
        }
    }
}

/// Reads the whole body, refusing one over the size limit or slower than the timeout.
pub async fn read(
    headers: &HeaderMap,
    mut body: RequestBody,
    options: &ServerOptions,
) -> Result<Bytes, Refusal> {
    let limit = options.max_body_bytes;
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|len| len.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        drain(&mut body, options.read_timeout).await;
        return Err(too_large(limit));
    }
    // The frames as they came: a body in one frame (the usual case) is not copied.
    let mut frames: Vec<Bytes> = Vec::new();
    let mut total = 0;
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            total += data.len();
            if total > limit {
                return Ok(false);
            }
            frames.push(data);
        }
        Ok::<bool, hyper::Error>(true)
    };
    match tokio::time::timeout(options.read_timeout, read).await {
        Ok(Ok(true)) if frames.len() <= 1 => Ok(frames.pop().unwrap_or_default()),
        Ok(Ok(true)) => Ok(Bytes::from(frames.concat())),
        Ok(Ok(false)) => {
            drain(&mut body, options.read_timeout).await;
            Err(too_large(limit))
        }
        Ok(Err(e)) => Err(Refusal::new(
            Reason::RequestMalformed,
            format!("the body could not be read: {e}"),
        )),
        Err(_) => Err(Refusal::new(
            Reason::RequestMalformed,
            "the body was not received in time",
        )),
    }
}

/// After an over-limit body is refused, at most this much more of it is read and
/// dropped, for at most [`DRAIN_TIME`]: a client still sending it can then read the 413
/// (closing a connection with unread data resets it, and the client gets a broken pipe
/// instead of the answer). What a caller can make the server read stays bounded.
const DRAIN_BYTES: usize = 8 * 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(2);

async fn drain(body: &mut RequestBody, read_timeout: Duration) {
    let mut left = DRAIN_BYTES;
    let _ = tokio::time::timeout(read_timeout.min(DRAIN_TIME), async {
        while left > 0 {
            match body.frame().await {
                Some(Ok(frame)) => {
                    let read = frame.data_ref().map_or(0, Bytes::len);
                    left = left.saturating_sub(read);
                }
                _ => break,
            }
        }
    })
    .await;
}

fn too_large(limit: usize) -> Refusal {
    Refusal::new(
        Reason::RequestTooLarge,
        format!("the body is larger than {limit} bytes"),
    )
    .with_details(json!({ "max_body_bytes": limit }))
}
