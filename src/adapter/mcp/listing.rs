//! What `toolgate mcp import` reads of an upstream server: its tools through rmcp, and
//! beside rmcp the raw `tools/list` answers (a bounded copy of a stdio server's output,
//! a wrapper of the Streamable HTTP client), because rmcp's `Tool` drops `execution`
//! and a task-required tool must be seen to be warned about.

/// Most bytes of a stdio server's output `toolgate mcp import` keeps to read the raw
/// `tools/list` answers; past it the import says it could not check them.
const TAP_MAX_BYTES: usize = 16 * 1024 * 1024;

use super::*;

/// What an upstream server says about itself and its tools (`toolgate mcp import`).
pub struct Listing {
    pub server: Option<Implementation>,
    pub tools: Vec<rmcp::model::Tool>,
    /// Fields of the raw `tools/list` answers that rmcp's `Tool` drops.
    pub raw: RawListing,
}

/// What `toolgate mcp import` reads from the raw `tools/list` answers (MCP 2025-11-25
/// fields rmcp does not model).
#[derive(Debug, Default, Clone, PartialEq)]
pub enum RawListing {
    /// The answers were read: the tools whose `execution.taskSupport` is `"required"`
    /// (callable only as tasks, which toolgate does not serve).
    Read { task_required: BTreeSet<String> },
    /// The answers could not be read (the transport does not expose them, or they
    /// were larger than [`TAP_MAX_BYTES`]).
    #[default]
    Unseen,
}

/// Connects to `upstream`, lists every tool and disconnects (stopping a stdio server).
pub async fn list_tools(upstream: &Upstream, deadline: Instant) -> Result<Listing, ExecError> {
    let tap = Tap::default();
    let work = async {
        // `mcp import` lists an operator's server before any policy names it: it runs
        // as the operator started it, unconfined.
        let connection = open(
            upstream,
            (&Reach::default(), None, None),
            &upstream.describe(),
            Bounds {
                hard_cap: usize::MAX,
                read_timeout: deadline
                    .saturating_duration_since(Instant::now())
                    .max(HTTP_READ_TIMEOUT_FLOOR),
            },
            deadline,
            Arc::default(),
            Some(tap.clone()),
        )
        .await?;
        let server = connection
            .client
            .peer()
            .peer_info()
            .and_then(|info| info.server_info.clone());
        let tools = connection
            .client
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| {
                ExecError::DependencyDown(format!(
                    "mcp server {} did not list its tools: {e}",
                    upstream.describe()
                ))
            })?;
        let raw = tap.listing();
        Ok(Listing { server, tools, raw })
    };
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or(Err(ExecError::Timeout))
}

/// A bounded copy of the bytes a stdio server writes (`toolgate mcp import` only).
#[derive(Clone, Default)]
pub(super) struct Tap(Arc<Mutex<TapBuf>>);

#[derive(Default)]
struct TapBuf {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl Tap {
    /// Forgets what was kept: the answers were too large to read.
    fn overflow(&self) {
        if let Ok(mut buf) = self.0.lock() {
            buf.overflowed = true;
            buf.bytes = Vec::new();
        }
    }

    fn record(&self, bytes: &[u8]) {
        if let Ok(mut buf) = self.0.lock() {
            if buf.overflowed || buf.bytes.len() + bytes.len() > TAP_MAX_BYTES {
                buf.overflowed = true;
                buf.bytes = Vec::new();
            } else {
                buf.bytes.extend_from_slice(bytes);
            }
        }
    }

    /// The task-required tools named in the recorded `tools/list` answers (one
    /// JSON-RPC message per line, as MCP's stdio transport sends them).
    fn listing(&self) -> RawListing {
        let Ok(buf) = self.0.lock() else {
            return RawListing::Unseen;
        };
        if buf.overflowed {
            return RawListing::Unseen;
        }
        RawListing::Read {
            task_required: task_required(&buf.bytes),
        }
    }
}

/// The names of the tools with `execution.taskSupport: "required"` in the
/// `tools/list` answers among `lines` (JSON-RPC messages, one a line).
pub(super) fn task_required(lines: &[u8]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in lines.split(|b| *b == b'\n') {
        let Ok(message) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        let Some(tools) = message.pointer("/result/tools").and_then(Value::as_array) else {
            continue;
        };
        for tool in tools {
            if tool.pointer("/execution/taskSupport") == Some(&json!("required"))
                && let Some(name) = tool.get("name").and_then(Value::as_str)
            {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// rmcp's HTTP client (reqwest) for `toolgate mcp import`: a `tools/list` request is
/// sent here and its answer (JSON or SSE) read whole, at most [`TAP_MAX_BYTES`], and
/// copied into the [`Tap`] as one JSON-RPC message a line before rmcp reads it; every
/// other request is reqwest's.
#[derive(Clone)]
pub(super) struct TappedHttp {
    pub(super) inner: reqwest::Client,
    pub(super) tap: Tap,
}

type HttpError = StreamableHttpError<reqwest::Error>;

impl StreamableHttpClient for TappedHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let is_list = matches!(
            &message,
            ClientJsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::ListToolsRequest(_))
        );
        if !is_list {
            return self
                .inner
                .post_message_with_response_limits(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    custom_headers,
                    limits,
                )
                .await;
        }
        let body = serde_json::to_vec(&message)?;
        let mut request = self
            .inner
            .post(uri.as_ref())
            .header(
                reqwest::header::ACCEPT,
                "application/json, text/event-stream",
            )
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        if let Some(auth) = auth_header {
            request = request.bearer_auth(auth);
        }
        if let Some(session) = session_id {
            request = request.header("Mcp-Session-Id", session.as_ref());
        }
        let mut response = request.send().await.map_err(StreamableHttpError::Client)?;
        let status = response.status();
        if !status.is_success() {
            return Err(StreamableHttpError::UnexpectedServerResponse(
                format!("tools/list answered {status}").into(),
            ));
        }
        let sse = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(StreamableHttpError::Client)?
        {
            if bytes.len() + chunk.len() > TAP_MAX_BYTES {
                self.tap.overflow();
                return Err(StreamableHttpError::UnexpectedServerResponse(
                    "the tools/list answer is too large".into(),
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        let messages = if sse {
            sse_messages(&bytes)
        } else {
            serde_json::from_slice::<Value>(&bytes)
                .into_iter()
                .collect()
        };
        let mut answer = None;
        for message in messages {
            self.tap.record(format!("{message}\n").as_bytes());
            if message.get("id").is_some()
                && (message.get("result").is_some() || message.get("error").is_some())
            {
                answer = Some(message);
            }
        }
        let Some(answer) = answer else {
            return Err(StreamableHttpError::UnexpectedServerResponse(
                "the tools/list answer holds no response".into(),
            ));
        };
        let answer: ServerJsonRpcMessage = serde_json::from_value(answer)?;
        Ok(StreamableHttpPostResponse::Json(answer, None))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<
        Pin<Box<dyn futures_core::Stream<Item = Result<sse_stream::Sse, SseError>> + Send>>,
        HttpError,
    > {
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }
}

/// The JSON values of the `data` of the events of an SSE body.
pub(super) fn sse_messages(body: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    text.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            serde_json::from_str(&data.join("\n")).ok()
        })
        .collect()
}

/// A stdio server's stdout, copied into a [`Tap`] when there is one.
pub(super) struct Tapped<R> {
    pub(super) inner: R,
    pub(super) tap: Option<Tap>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Tapped<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(tap)) = (&poll, &self.tap) {
            tap.record(&buf.filled()[before..]);
        }
        poll
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn raw_listings_name_only_task_required_tools() {
        let lines = [
            "not json".to_string(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25"}}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[
                {"name":"a","execution":{"taskSupport":"required"}},
                {"name":"b","execution":{"taskSupport":"optional"}},
                {"name":"c"},{"execution":{"taskSupport":"required"}}]}}"#
                .replace('\n', ""),
            r#"{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"d","execution":{"taskSupport":"required"}}]}}"#.to_string(),
        ]
        .join("\n");
        let names = task_required(lines.as_bytes());
        assert_eq!(names, ["a".to_string(), "d".to_string()].into());
        let tap = Tap::default();
        tap.record(lines.as_bytes());
        assert_eq!(
            tap.listing(),
            RawListing::Read {
                task_required: names
            }
        );
        tap.overflow();
        assert_eq!(tap.listing(), RawListing::Unseen);
    }

    #[test]
    fn sse_bodies_are_read_event_by_event() {
        let body = "event: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n: comment\n\nid: 2\ndata:{\"b\":2}\n\ndata: not json\n\n";
        assert_eq!(
            sse_messages(body.as_bytes()),
            vec![json!({"a": 1}), json!({"b": 2})]
        );
    }
}
