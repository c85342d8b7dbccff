//! Traces and logs: the tracing subscriber (JSON or text logs on stderr), one span per
//! tool call with the pipeline steps as child spans, W3C `traceparent` continuation,
//! and OTLP export (HTTP, protobuf) when an endpoint is configured.
//!
//! INVARIANT: without an OTLP endpoint no layer is interested in spans, so every span
//! macro is a disabled callsite (one cached interest check, no allocation) and nothing
//! is exported; the logs (events) are unaffected. With an endpoint, spans are batched
//! and exported from a background thread; a slow or absent collector never delays a
//! call (the queue is bounded and drops when full).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, FilterExt, Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use crate::call::{CallResponse, Status};

/// The span of one tool call: its fields are filled in as the pipeline learns them.
/// Exported as `execute_tool {tool}` (OpenTelemetry GenAI semantic conventions), or
/// `execute_tool` while the tool is not known.
pub const CALL_SPAN: &str = "tool_call";
/// `gen_ai.operation.name` of a call span, and its exported name's first word.
pub const GEN_AI_OPERATION: &str = "execute_tool";

/// How long one OTLP export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest collector response read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// A parsed W3C `traceparent` header (trace context level 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Parses `version-trace_id-parent_id-flags` (lowercase hex). Version `ff`, all-zero
    /// ids and malformed values are rejected (the call then starts a new trace). A
    /// version above 00 may carry more fields after the flags; they are ignored.
    pub fn parse(header: &str) -> Option<TraceParent> {
        let header = header.trim();
        let bytes = header.as_bytes();
        if bytes.len() < 55 || (bytes.len() > 55 && bytes[55] != b'-') {
            return None;
        }
        let version = hex_bytes::<1>(&header[0..2])?[0];
        if version == 0xff || (version == 0 && bytes.len() != 55) {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex_bytes::<16>(&header[3..35])?;
        let parent_id = hex_bytes::<8>(&header[36..52])?;
        let flags = hex_bytes::<1>(&header[53..55])?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        crate::canonical::to_hex(self.trace_id)
    }
}

/// Decodes exactly `N` bytes of lowercase hex.
fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// A new call span. Its identifying fields are recorded as the pipeline learns them;
/// with a `traceparent`, the span continues that trace.
pub fn call_span(parent: Option<&TraceParent>) -> Span {
    let span = tracing::info_span!(
        target: "toolgate::call",
        CALL_SPAN,
        otel.name = GEN_AI_OPERATION,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        // OpenTelemetry GenAI (execute_tool) and MCP semantic conventions.
        gen_ai.operation.name = GEN_AI_OPERATION,
        gen_ai.tool.name = tracing::field::Empty,
        gen_ai.tool.call.id = tracing::field::Empty,
        error.type = tracing::field::Empty,
        mcp.method.name = tracing::field::Empty,
        call_id = tracing::field::Empty,
        run_id = tracing::field::Empty,
        role_id = tracing::field::Empty,
        lane_id = tracing::field::Empty,
        tool_name = tracing::field::Empty,
        status = tracing::field::Empty,
        error_code = tracing::field::Empty,
        reason = tracing::field::Empty,
        failed_step = tracing::field::Empty,
    );
    if let Some(parent) = parent
        && !span.is_disabled()
    {
        let remote = SpanContext::new(
            TraceId::from_bytes(parent.trace_id),
            SpanId::from_bytes(parent.parent_id),
            TraceFlags::new(parent.flags & 0x01),
            true,
            TraceState::default(),
        );
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
    span
}

/// Records the GenAI attributes once the call id and tool are known: the span is then
/// exported as `execute_tool {tool}`.
pub fn record_tool_call(span: &Span, call_id: &str, tool: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    span.record("gen_ai.tool.call.id", call_id);
    if let Some(tool) = tool {
        span.record("gen_ai.tool.name", tool);
        // `otel.name` applies only before the OpenTelemetry span exists (a traceparent
        // creates it at once): rename the span itself.
        let context = span.context();
        context
            .span()
            .update_name(format!("{GEN_AI_OPERATION} {tool}"));
    }
}

/// Records the MCP method that carried the call (`mcp.method.name`).
pub fn record_mcp_method(span: &Span, method: &'static str) {
    if !span.is_disabled() {
        span.record("mcp.method.name", method);
    }
}

/// A child span of the call span for one pipeline step (or, for `authorize`, steps
/// 1-8): exported under `name`, with the step number as a field.
pub fn step_span(name: &'static str, step: u8) -> Span {
    tracing::info_span!(target: "toolgate::call", "step", otel.name = name, step = step)
}

/// Records a call's outcome on its span: status, and for a refusal the error code,
/// reason and failed step. Failures and timeouts mark the span as an error; a denial
/// is a decision, not an error.
pub fn record_outcome(span: &Span, response: &CallResponse) {
    if span.is_disabled() {
        return;
    }
    span.record("status", response.status.as_str());
    if let Some(d) = &response.diagnostic {
        span.record("error_code", d.error_code.as_str());
        span.record("reason", d.reason.as_str());
        span.record("failed_step", d.failed_step);
    }
    // error.type: the error code of a failure or timeout (a denial is not an error).
    if matches!(response.status, Status::Failed | Status::Timeout) {
        let kind = response
            .error_code
            .map(|c| c.as_str())
            .unwrap_or(response.status.as_str());
        span.record("error.type", kind);
    }
    match response.status {
        Status::Success => span.record("otel.status_code", "ok"),
        Status::Failed | Status::Timeout => span.record("otel.status_code", "error"),
        Status::Denied => span,
    };
}

/// One INFO line per call: ids, outcome and duration; never arguments, scope, output
/// or credentials.
pub fn log_call(response: &CallResponse, trace_id: Option<&str>) {
    tracing::info!(
        target: "toolgate::call",
        call_id = %response.call_id,
        tool_name = response.tool_name.as_deref().unwrap_or("-"),
        status = response.status.as_str(),
        duration_ms = response.execution_time_ms,
        error_code = response.error_code.map(|c| c.as_str()).unwrap_or("-"),
        reason = response.diagnostic.as_ref().map(|d| d.reason.as_str()).unwrap_or("-"),
        failed_step = response.diagnostic.as_ref().map(|d| d.failed_step).unwrap_or(0),
        audit_event_id = response.audit_event_id.as_deref().unwrap_or("-"),
        replayed = response.replayed,
        trace_id = trace_id.unwrap_or("-"),
        "tool call"
    );
}

/// The trace id of `span` when it is exported (32 hex digits), else None.
pub fn exported_trace_id(span: &Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// Why tracing could not be set up.
#[derive(Debug)]
pub enum TraceError {
    /// The OTLP endpoint is not an `http://` URL.
    Endpoint { endpoint: String, problem: String },
    /// The exporter could not be built.
    Exporter(String),
    /// The log writer thread could not be started.
    LogWriter(String),
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Endpoint { endpoint, problem } => {
                write!(f, "invalid otlp endpoint `{endpoint}`: {problem}")
            }
            TraceError::Exporter(e) => write!(f, "cannot build the otlp exporter: {e}"),
            TraceError::LogWriter(e) => write!(f, "cannot start the log writer thread: {e}"),
        }
    }
}

/// Keeps the log writer and the exporter alive; [`Telemetry::shutdown`] flushes the
/// spans still queued, and dropping it flushes the logs.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    /// The log writer thread; dropped last, it writes out the lines still buffered.
    _logs: Option<super::log_writer::LogFlusher>,
    /// Where spans go, when they are exported.
    pub traces_url: Option<String>,
}

impl Telemetry {
    /// Exports the spans still queued (bounded by the export timeout) and stops.
    pub fn shutdown(&self) {
        if let Some(provider) = &self.provider
            && let Err(e) = provider.shutdown_with_timeout(EXPORT_TIMEOUT)
        {
            tracing::warn!(error = %e, "flushing traces at shutdown failed");
        }
    }
}

/// The OTLP/HTTP traces URL for a base endpoint: `/v1/traces` is appended unless the
/// endpoint already names it (as `OTEL_EXPORTER_OTLP_ENDPOINT` is interpreted).
pub fn traces_url(endpoint: &str) -> Result<String, TraceError> {
    let problem = |p: &str| TraceError::Endpoint {
        endpoint: endpoint.chars().take(200).collect(),
        problem: p.to_string(),
    };
    let uri: hyper::Uri = endpoint
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| problem(&e.to_string()))?;
    if uri.scheme_str() != Some("http") {
        return Err(problem(
            "only http:// is supported (send to a local collector, which may forward over tls)",
        ));
    }
    if uri.host().is_none() {
        return Err(problem("the url has no host"));
    }
    let trimmed = endpoint.trim_end_matches('/');
    Ok(if trimmed.ends_with("/v1/traces") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/v1/traces")
    })
}

/// Installs the global subscriber: logs on stderr filtered by `TOOLGATE_LOG` (default
/// `info`), and, with an OTLP endpoint, the span exporter. Export runs on `runtime`.
/// Installing twice keeps the first subscriber.
pub fn init(
    format: LogFormat,
    otlp_endpoint: Option<&str>,
    runtime: &tokio::runtime::Handle,
) -> Result<Telemetry, TraceError> {
    let traces_url = otlp_endpoint
        .filter(|e| !e.trim().is_empty())
        .map(traces_url)
        .transpose()?;
    let env_filter =
        EnvFilter::try_from_env("TOOLGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Logs are events only: spans are for the trace exporter.
    let events_only = env_filter.and(filter_fn(|meta| meta.is_event()));
    // Lines are formatted on the calling thread and appended to one bounded buffer; a
    // writer thread puts them on stderr in batches (`log_writer`), so a call never
    // waits for (or, but for the first line of a batch, wakes) the reader of stderr.
    // Nothing is dropped: when the buffer is full, callers wait.
    let (writer, guard) = super::log_writer::spawn(
        "toolgate-log",
        Box::new(std::io::stderr()),
        Box::new(std::io::stderr()),
    )
    .map_err(|e| TraceError::LogWriter(e.to_string()))?;
    let logs = tracing_subscriber::fmt::layer().with_writer(writer);
    let logs = match format {
        LogFormat::Json => logs
            .event_format(super::json_log::JsonLines)
            .with_filter(events_only)
            .boxed(),
        LogFormat::Text => logs.with_filter(events_only).boxed(),
    };
    let Some(url) = traces_url else {
        let _ = Registry::default().with(logs).try_init();
        return Ok(Telemetry {
            _logs: Some(guard),
            ..Telemetry::default()
        });
    };
    let client = OtlpHttpClient {
        runtime: runtime.clone(),
        client: crate::outbound::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TraceError::Exporter(e.to_string()))?,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| TraceError::Exporter(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter).build())
        .with_resource(
            Resource::builder()
                .with_service_name("toolgate")
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    let tracer = provider.tracer("toolgate");
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_filter(Targets::new().with_target("toolgate", tracing::Level::INFO));
    let _ = Registry::default().with(logs).with(spans).try_init();
    Ok(Telemetry {
        provider: Some(provider),
        _logs: Some(guard),
        traces_url: Some(url),
    })
}

/// The OTLP exporter's HTTP client: the project's one HTTP client stack (reqwest) on the
/// server's runtime. The exporter runs on its own thread, outside any runtime; each
/// request is spawned onto the runtime and awaited from there.
struct OtlpHttpClient {
    runtime: tokio::runtime::Handle,
    client: reqwest::Client,
}

impl fmt::Debug for OtlpHttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OtlpHttpClient")
    }
}

/// The future `HttpClient::send_bytes` returns (the trait is declared with
/// `async_trait`; this is the signature that macro produces).
type SendFuture<'a> = Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'a>>;

impl HttpClient for OtlpHttpClient {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> SendFuture<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let mut outgoing = client.request(parts.method, parts.uri.to_string());
            for (name, value) in &parts.headers {
                outgoing = outgoing.header(name, value);
            }
            let mut response = outgoing.body(body).send().await.map_err(boxed)?;
            // Read at most MAX_RESPONSE_BYTES of the collector's answer.
            let mut body = BytesMut::new();
            while let Some(chunk) = response.chunk().await.map_err(boxed)? {
                if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    return Err(boxed("the collector's answer is too large"));
                }
                body.extend_from_slice(&chunk);
            }
            let mut answer = Response::new(body.freeze());
            *answer.status_mut() = response.status();
            *answer.headers_mut() = response.headers().clone();
            Ok(answer)
        });
        Box::pin(async move { task.await.map_err(boxed)? })
    }
}

fn boxed<E: fmt::Display>(e: E) -> HttpError {
    e.to_string().into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_spec_example() {
        let p = TraceParent::parse(VALID).unwrap();
        assert_eq!(p.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(crate::canonical::to_hex(p.parent_id), "00f067aa0ba902b7");
        assert_eq!(p.flags, 1);
    }

    #[test]
    fn rejects_malformed_headers() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\u{e9}",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_future_version_may_carry_more_fields() {
        let header = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        assert!(TraceParent::parse(header).is_some());
        assert!(TraceParent::parse(&header[..56]).is_some());
    }

    #[test]
    fn traces_url_appends_the_signal_path() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces/").unwrap(),
            "http://c:4318/v1/traces"
        );
        assert!(traces_url("https://c:4318").is_err());
        assert!(traces_url("not a url").is_err());
    }

    #[test]
    fn spans_are_disabled_without_a_subscriber() {
        assert!(call_span(TraceParent::parse(VALID).as_ref()).is_disabled());
        assert_eq!(exported_trace_id(&Span::none()), None);
    }
}
