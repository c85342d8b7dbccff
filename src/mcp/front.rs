//! The MCP server front: agents speak the Model Context Protocol (Streamable HTTP) to
//! `/mcp`, and every `tools/call` runs the same 13-step pipeline, with the same audit
//! events, as `POST /v1/tool-calls`.
//!
//! The transport and JSON-RPC framing are rmcp's ([`StreamableHttpService`], stateless:
//! one POST is one request; no sessions, no server-initiated streams, so GET and DELETE
//! answer 405). This module only maps MCP requests onto the gateway:
//!
//! - the caller's identity and context travel as HTTP headers on every request
//!   (`Authorization: Bearer`, `X-Toolgate-Role`, `-Run`, `-Lane`, `-Scope`);
//! - `initialize`, `server/discover`, `ping` and `tools/list` are refused with a
//!   JSON-RPC error ([`REFUSED`], the diagnostic in `data`) unless the headers are
//!   well-formed, the credential holds the role, the role may act in the lane, and
//!   the run exists, is the run token's (if the credential is one) and is open for the
//!   lane;
//! - `tools/list` is the gateway's tool catalog for that role and lane;
//! - `tools/call` becomes a [`crate::call::CallRequest`] and goes through
//!   [`Gateway::handle`]: a denial, failure or timeout is a tool result with
//!   `isError: true` and the diagnostic as text and in `_meta` ([`META_DIAGNOSTIC`]); a tool name the
//!   registry does not know is a JSON-RPC error (`-32602`), after it was audited.
//!
//! INVARIANT: role, run, lane and scope come only from the headers. Nothing in the
//! JSON-RPC body (`_meta`, `arguments`) can name or widen them; the only `_meta` keys
//! read are `io.toolgate/idempotency_key`, `io.toolgate/timeout_ms` and
//! `io.toolgate/approval_id`, which the pipeline bounds and checks like the same
//! fields of the HTTP API (an approval id only names an approval bound to the exact
//! call).

use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use http_body_util::combinators::BoxBody;
use hyper::http::{HeaderMap, Request, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, DiscoverResult,
    ErrorCode, ErrorData, Implementation, InitializeRequestParams, InitializeResult, JsonObject,
    ListToolsResult, MetaObject, PaginatedRequestParams, ProgressToken, ProtocolVersion,
    ServerCapabilities, ServerConfig, Tool as McpTool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Map, Value, json};

use crate::call::{
    ArtifactRef, CallResponse, CallSignals, PartialRequest, Received, Status, digest_bytes,
    parse_request_value,
};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::{CatalogTool, Gateway, ToolCatalog};
use crate::mcp::signals::{self, InFlightCalls, InFlightKey, progress_param};

/// The path the front is served at.
pub const ENDPOINT: &str = "/mcp";

/// The protocol revisions the front speaks: two with the `initialize` handshake and
/// the stateless revision (`server/discover`, per-request `_meta`).
pub const SUPPORTED_VERSIONS: [ProtocolVersion; 3] = [
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// The JSON-RPC error code of a request the gateway refuses before any tool is
/// involved (bad or missing headers, credential, role or lane). `data` holds the
/// structured diagnostic. In the range JSON-RPC leaves to implementations and not one
/// that MCP or its SDKs define.
pub const REFUSED: ErrorCode = ErrorCode(-32040);

/// The headers every MCP request carries.
pub const HEADER_ROLE: &str = "x-toolgate-role";
pub const HEADER_RUN: &str = "x-toolgate-run";
pub const HEADER_LANE: &str = "x-toolgate-lane";
pub const HEADER_SCOPE: &str = "x-toolgate-scope";

/// The `_meta` keys of a `tools/call` that toolgate reads.
pub const META_IDEMPOTENCY_KEY: &str = "io.toolgate/idempotency_key";
pub const META_TIMEOUT_MS: &str = "io.toolgate/timeout_ms";
/// The approval a retried `tools/call` runs under (docs/mcp.md, "Approvals").
pub const META_APPROVAL_ID: &str = "io.toolgate/approval_id";

/// Longest id header accepted (as for ids in the HTTP API).
const MAX_ID_LEN: usize = 128;
/// Largest `X-Toolgate-Scope` header accepted (as for `scope` in the HTTP API).
const MAX_SCOPE_BYTES: usize = crate::call::MAX_SCOPE_BYTES;

/// Serves one HTTP request to [`ENDPOINT`]; its body was already read within the
/// server's size and time limits.
pub async fn handle(
    gateway: Arc<Gateway>,
    request: Request<Full<Bytes>>,
) -> Response<BoxBody<Bytes, Infallible>> {
    if let Some(accepted) = cancellation(&gateway, &request).await {
        return accepted;
    }
    let config = StreamableHttpServerConfig::default()
        // Stateless: every POST stands alone, so any gateway instance can answer it
        // and no session state can outlive a policy reload.
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        // The server already read the body within its own limit.
        .with_max_request_body_bytes(usize::MAX)
        // The sidecar is addressed by whatever name its deployment gives it; every
        // request must carry a credential anyway. Origin, protocol version, Accept and
        // batches were checked by [`super::transport::refusal`] before the request got here.
        .disable_allowed_hosts();
    let service = StreamableHttpService::new(
        move || Ok(Front::new(gateway.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    service.handle(request).await
}

/// The rmcp server handler: one per request, holding the gateway.
#[derive(Clone)]
pub struct Front {
    gateway: Arc<Gateway>,
}

impl Front {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        Front { gateway }
    }

    /// Checks the headers, the caller's right to the role and lane, and the run (a run
    /// token's own, existing, open for the lane); returns the catalog of tools the role
    /// may use in the lane.
    async fn admit(&self, context: &RequestContext<RoleServer>) -> Result<ToolCatalog, ErrorData> {
        let headers = headers(context)?;
        let fleet = self.gateway.fleet_token(bearer_token(headers)).await;
        fleet.map_err(|r| refused(&r))?;
        let caller = Caller::read_for(&self.gateway, headers);
        if let Some(refusal) = caller.malformed() {
            return Err(refused(&refusal));
        }
        // A bearer JWT is verified first (the catalog's identity check is synchronous).
        let loaded = self.gateway.current();
        if let Some(Err(refusal)) = self
            .gateway
            .authenticate(&loaded.policy, caller.token.as_deref())
            .await
        {
            return Err(refused(&refusal));
        }
        let role_id = caller.role_id.as_deref().unwrap_or_default();
        let run_id = caller.run_id.as_deref().unwrap_or_default();
        let lane_id = caller.lane_id.as_deref().unwrap_or_default();
        self.gateway
            .run_catalog(caller.token.as_deref(), role_id, run_id, lane_id)
            .await
            .map_err(|r| refused(&r))
    }
}

impl ServerHandler for Front {
    fn get_info(&self) -> ServerConfig {
        let mut info = InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
            .with_server_info(Implementation::new("toolgate", env!("CARGO_PKG_VERSION")));
        info.instructions = Some(
            "Every tool call passes toolgate's policy checks and is recorded in its audit log. \
             A refused or failed call returns isError with a structured diagnostic \
             (reason, message, suggested_fix) as JSON text and in _meta[\"io.toolgate/diagnostic\"]."
                .into(),
        );
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(&SUPPORTED_VERSIONS)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.admit(&context).await?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        self.admit(&context).await?;
        Ok(DiscoverResult::from_server_info(
            SUPPORTED_VERSIONS.to_vec(),
            self.get_info(),
        ))
    }

    async fn ping(&self, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.admit(&context).await.map(|_| ())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let catalog = self.admit(&context).await?;
        let tools = catalog.tools.iter().map(mcp_tool).collect();
        let mut result = ListToolsResult::with_all_items(tools);
        // The list depends on the caller's role and lane: never shared, never stale.
        result.ttl_ms = Some(0);
        result.cache_scope = Some(rmcp::model::CacheScope::Private);
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The audit log at the reserve kept for admin changes: refused unrecorded, as
        // the HTTP API does (docs/operations.md, "Audit capacity").
        if let Some(refusal) = self.gateway.unrecorded_refusal() {
            return Err(refused(&refusal));
        }
        let token = bearer_token(headers(&context)?);
        let _ = self.gateway.fleet_token(token).await;
        let caller = Caller::read_for(&self.gateway, headers(&context)?);
        let mut meta = context.meta.0.0.clone();
        if let Some(own) = &request.meta {
            meta.extend(own.0.0.clone());
        }
        let token = caller.token.clone();
        let key = InFlightKey::of(
            &self.gateway,
            caller.token.as_deref(),
            &caller.role_id,
            &caller.run_id,
            &context.id,
        );
        let received = caller.into_request(&request, &meta);
        let progress_token = meta
            .get("progressToken")
            .and_then(|t| serde_json::from_value::<ProgressToken>(t.clone()).ok());
        let (progress, mut heard) = tokio::sync::watch::channel(None);
        let signals = CallSignals {
            cancel: tokio_util::sync::CancellationToken::new(),
            progress: progress_token.is_some().then_some(progress),
            mcp_method: Some("tools/call"),
        };
        let _registered = InFlightCalls::register(key, &signals);
        // Spawned so a client that disconnects cannot cut a call halfway: every call
        // runs to its closing audit event. Cancelling (the client's
        // `notifications/cancelled`, or its connection dropped) stops the execution.
        let gateway = self.gateway.clone();
        let task_signals = signals.clone();
        let mut task = tokio::spawn(async move {
            gateway
                .handle_signalled(token.as_deref(), received, None, task_signals)
                .await
        });
        // Should this handler be dropped (the client went away), the call is cancelled.
        let cancel_on_drop = signals.cancel.clone().drop_guard();
        let mut listening = progress_token.is_some();
        let mut connected = true;
        let joined = loop {
            tokio::select! {
                joined = &mut task => break joined,
                () = context.ct.cancelled(), if connected => {
                    connected = false;
                    signals.cancel.cancel();
                }
                changed = heard.changed(), if listening && connected => {
                    let latest = heard.borrow_and_update().clone();
                    match (changed, latest, &progress_token) {
                        (Ok(()), Some(latest), Some(token)) => {
                            // The latest report only: reports that came while this one
                            // was being sent were coalesced by the watch.
                            if context.peer.notify_progress(progress_param(token, latest)).await.is_err() {
                                listening = false;
                            }
                        }
                        (Ok(()), None, _) => {}
                        _ => listening = false,
                    }
                }
            }
        };
        cancel_on_drop.disarm();
        let response =
            joined.map_err(|_| ErrorData::internal_error("the call task failed", None))?;
        if let Some(d) = &response.diagnostic
            && d.reason == Reason::ToolUnregistered
        {
            // A tool the server does not have is a protocol error in MCP (it was
            // still audited as a denied call, like on the HTTP API).
            return Err(ErrorData::invalid_params(
                d.message.clone(),
                Some(error_fields(&response)),
            ));
        }
        Ok(CallToolResponse::Complete(
            tool_result(&self.gateway, &response).await,
        ))
    }
}

/// A client's `notifications/cancelled`, answered here (`202 Accepted`) because the
/// front is stateless: the call it names runs in another request's handler. It
/// cancels the caller's own call with that request id, if one is in flight; anything
/// else is ignored, as MCP says a cancellation of an unknown request is.
async fn cancellation(
    gateway: &Arc<Gateway>,
    request: &Request<Full<Bytes>>,
) -> Option<Response<BoxBody<Bytes, Infallible>>> {
    use http_body_util::BodyExt;
    let bytes = request.body().clone().collect().await.ok()?.to_bytes();
    let request_id = signals::cancelled_request(&bytes)?;
    if let Some(request_id) = request_id {
        let caller = Caller::read_for(gateway, request.headers());
        let key = InFlightKey::of(
            gateway,
            caller.token.as_deref(),
            &caller.role_id,
            &caller.run_id,
            &request_id,
        );
        let cancelled = InFlightCalls::cancel(&key);
        tracing::debug!(cancelled, "mcp notifications/cancelled");
    }
    let accepted = Response::builder()
        .status(hyper::StatusCode::ACCEPTED)
        .body(
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed(),
        )
        .ok()?;
    Some(accepted)
}

/// The HTTP request headers rmcp put in the request's extensions.
fn headers(context: &RequestContext<RoleServer>) -> Result<&HeaderMap, ErrorData> {
    context
        .extensions
        .get::<hyper::http::request::Parts>()
        .map(|parts| &parts.headers)
        .ok_or_else(|| ErrorData::internal_error("the http request is not available", None))
}

/// What the toolgate headers of one request say, and every problem with them.
#[derive(Debug, Clone, Default, PartialEq)]
struct Caller {
    token: Option<String>,
    role_id: Option<String>,
    run_id: Option<String>,
    lane_id: Option<String>,
    scope: Option<Map<String, Value>>,
    /// The `X-Toolgate-Scope` header as sent, when it could not be accepted; only its
    /// digest is audited.
    scope_header: Option<String>,
    problems: Vec<String>,
}

impl Caller {
    /// [`Caller::read`], where a run token answers the headers left out: role, run,
    /// scope (the run's, so `{}` here) and the lane when the token names exactly one.
    /// Whether the token is live is checked with the credential (step 2).
    fn read_for(gateway: &Gateway, headers: &HeaderMap) -> Caller {
        let binding = bearer_token(headers).and_then(|t| gateway.run_tokens.lookup(&t));
        let Some(binding) = binding else {
            return Caller::read(headers);
        };
        let mut filled = headers.clone();
        let lane = match binding.lanes.as_slice() {
            [lane] => Some(lane.as_str()),
            _ => None,
        };
        for (name, value) in [
            (HEADER_ROLE, Some(binding.role_id.as_str())),
            (HEADER_RUN, Some(binding.run_id.as_str())),
            (HEADER_LANE, lane),
            (HEADER_SCOPE, Some("{}")),
        ] {
            if let Some(value) = value
                && !filled.contains_key(name)
                && let Ok(value) = hyper::header::HeaderValue::from_str(value)
            {
                filled.insert(name, value);
            }
        }
        Caller::read(&filled)
    }

    fn read(headers: &HeaderMap) -> Caller {
        let mut caller = Caller {
            token: bearer_token(headers),
            ..Caller::default()
        };
        if headers
            .get_all(hyper::header::AUTHORIZATION)
            .iter()
            .nth(1)
            .is_some()
        {
            caller
                .problems
                .push("header `Authorization` is given more than once".into());
        }
        let mut id = |name: &str, display: &str| -> Option<String> {
            let value = single(headers, name, display, &mut caller.problems)?;
            if value.is_empty() || value.len() > MAX_ID_LEN {
                caller.problems.push(format!(
                    "header `{display}` must be 1 to {MAX_ID_LEN} bytes"
                ));
                return None;
            }
            Some(value)
        };
        caller.role_id = id(HEADER_ROLE, "X-Toolgate-Role");
        caller.run_id = id(HEADER_RUN, "X-Toolgate-Run");
        caller.lane_id = id(HEADER_LANE, "X-Toolgate-Lane");
        if let Some(scope) = single(
            headers,
            HEADER_SCOPE,
            "X-Toolgate-Scope",
            &mut caller.problems,
        ) {
            if scope.len() > MAX_SCOPE_BYTES {
                caller.problems.push(format!(
                    "header `X-Toolgate-Scope` is larger than {MAX_SCOPE_BYTES} bytes"
                ));
                caller.scope_header = Some(scope);
            } else {
                match serde_json::from_str::<Value>(&scope) {
                    Ok(Value::Object(map)) => caller.scope = Some(map),
                    Ok(_) => {
                        caller
                            .problems
                            .push("header `X-Toolgate-Scope` must be a JSON object".into());
                        caller.scope_header = Some(scope);
                    }
                    Err(e) => {
                        caller
                            .problems
                            .push(format!("header `X-Toolgate-Scope` is not valid JSON: {e}"));
                        caller.scope_header = Some(scope);
                    }
                }
            }
        }
        caller
    }

    /// A `request_malformed` refusal listing every header problem, if there is one.
    fn malformed(&self) -> Option<Refusal> {
        let first = self.problems.first()?;
        let message = if self.problems.len() > 1 {
            format!(
                "malformed request: {first} (and {} more)",
                self.problems.len() - 1
            )
        } else {
            format!("malformed request: {first}")
        };
        Some(
            Refusal::new(Reason::RequestMalformed, message)
                .with_details(json!({ "problems": self.problems })),
        )
    }

    /// The tool-call request these headers and this `tools/call` make, parsed like a
    /// body of `POST /v1/tool-calls`.
    fn into_request(self, call: &CallToolRequestParams, meta: &JsonObject) -> Received {
        let tool_name = call.name.to_string();
        if let Some(refusal) = self.malformed() {
            let mut partial = PartialRequest {
                role_id: self.role_id,
                run_id: self.run_id,
                lane_id: self.lane_id,
                tool_name: Some(tool_name).filter(|n| !n.is_empty() && n.len() <= MAX_ID_LEN),
                received: Map::new(),
            };
            if let Some(raw) = &self.scope_header {
                partial
                    .received
                    .insert("scope_header".into(), digest_bytes(raw.as_bytes()));
            }
            return Err(Box::new((refusal, partial)));
        }
        let mut body = json!({
            "role_id": self.role_id,
            "run_id": self.run_id,
            "lane_id": self.lane_id,
            "tool_name": tool_name,
            "arguments": call.arguments.clone().unwrap_or_default(),
            "scope": self.scope,
        });
        if let Some(key) = meta.get(META_IDEMPOTENCY_KEY) {
            body["idempotency_key"] = key.clone();
        }
        if let Some(ms) = meta.get(META_TIMEOUT_MS) {
            body["timeout_ms"] = ms.clone();
        }
        // Not identity or context: an approval is bound to the exact call (run, role,
        // lane, tool, arguments, scope, policy), so naming one cannot widen anything.
        if let Some(id) = meta.get(META_APPROVAL_ID) {
            body["approval_id"] = id.clone();
        }
        parse_request_value(body)
    }
}

/// The value of a header that must appear exactly once, as UTF-8 text without
/// control characters.
fn single(
    headers: &HeaderMap,
    name: &str,
    display: &str,
    problems: &mut Vec<String>,
) -> Option<String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        problems.push(format!("missing header `{display}`"));
        return None;
    };
    if values.next().is_some() {
        problems.push(format!("header `{display}` is given more than once"));
        return None;
    }
    match value.to_str() {
        Ok(s) if !s.chars().any(char::is_control) => Some(s.trim().to_string()),
        _ => {
            problems.push(format!(
                "header `{display}` must be visible ASCII text (in JSON, write other characters as \\u escapes such as \\u00e9)"
            ));
            None
        }
    }
}

/// The bearer token of the request's one `Authorization` header. Two or more prove
/// nothing (None; [`Caller::read`] refuses the request as malformed): which one a
/// proxy or a client meant is not for the front to guess.
fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let mut values = headers.get_all(hyper::header::AUTHORIZATION).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    crate::call::bearer_token(value.as_bytes())
}

/// A refusal before any tool is involved, as a JSON-RPC error.
fn refused(refusal: &Refusal) -> ErrorData {
    ErrorData::new(
        REFUSED,
        refusal.message.clone(),
        Some(diagnostic_data(refusal)),
    )
}

/// A refusal's diagnostic plus its `status`, as the `data` of a JSON-RPC error.
pub(super) fn diagnostic_data(refusal: &Refusal) -> Value {
    let diagnostic = refusal.diagnostic();
    let status = Status::of(refusal.reason);
    let mut data = serde_json::to_value(&diagnostic).unwrap_or_else(|_| json!({}));
    if let Some(obj) = data.as_object_mut() {
        obj.insert("status".into(), json!(status));
    }
    data
}

/// One catalog entry as an MCP tool: the registry's name, description and schemas;
/// annotations derived from the registry (hints for the client, never trusted by us).
fn mcp_tool(entry: &CatalogTool) -> McpTool {
    let name = entry.tool_name.clone();
    let description = entry.description.clone();
    let input_schema = match &*entry.input_schema {
        Value::Object(map) => map.clone(),
        _ => json!({ "type": "object" })
            .as_object()
            .cloned()
            .unwrap_or_default(),
    };
    let mut tool = McpTool::new(name, description, Arc::new(input_schema));
    // MCP output schemas describe an object (structuredContent is an object).
    if let Value::Object(schema) = &*entry.output_schema
        && advertised_output_schema(&entry.output_schema)
    {
        tool = tool.with_raw_output_schema(Arc::new(schema.clone()));
    }
    let determinism = json!(entry.determinism);
    tool = tool.with_annotations(
        ToolAnnotations::new()
            .read_only(determinism.as_str() == Some("pure"))
            .idempotent(entry.idempotent),
    );
    let mut meta = MetaObject::new();
    meta.insert("io.toolgate/version".into(), json!(entry.version));
    meta.insert("io.toolgate/determinism".into(), determinism);
    meta.insert(
        "io.toolgate/required_scope_keys".into(),
        json!(entry.required_scope_keys),
    );
    tool.with_meta(meta)
}

/// The `_meta` key of a refused or failed call's diagnostic (with its status, error
/// code, call id and audit event id).
pub const META_DIAGNOSTIC: &str = "io.toolgate/diagnostic";
/// The `_meta` key of the artifact reference when the output is held as an artifact.
pub const META_ARTIFACT: &str = "io.toolgate/artifact";

/// The call's outcome as an MCP tool result.
///
/// - Success: the output as JSON text, and as `structuredContent` when it is an
///   object (it was validated against the tool's output schema by the pipeline).
/// - Success held as an artifact (over `max_output_bytes`): a `resource_link` to the
///   artifact and a text summary; when the tool advertises an `outputSchema` the MCP
///   spec requires conforming `structuredContent`, so the stored output (validated
///   before it was stored) is read back and sent as `structuredContent`.
/// - Anything else: `isError: true`, the diagnostic as JSON text and under
///   [`META_DIAGNOSTIC`] in `_meta`, and never a `structuredContent` (it would not
///   match the tool's `outputSchema` and official clients reject such a result).
async fn tool_result(gateway: &Gateway, response: &CallResponse) -> CallToolResult {
    let mut meta = MetaObject::new();
    meta.insert("io.toolgate/call_id".into(), json!(response.call_id));
    meta.insert(
        "io.toolgate/audit_event_id".into(),
        json!(response.audit_event_id),
    );
    meta.insert("io.toolgate/status".into(), json!(response.status));
    if response.replayed {
        meta.insert("io.toolgate/replayed".into(), json!(true));
    }
    if let Some(details) = &response.details {
        // A two-phase tool's prepared call: its commit id, deadline and commit URL.
        meta.insert("io.toolgate/two_phase".into(), json!(details));
    }
    let mut result = if response.status == Status::Success {
        match (&response.output, &response.artifact) {
            (Some(output), _) => match upstream_content(gateway, response, output) {
                Some((content, advertised)) => {
                    // An MCP upstream's content blocks, as it sent them.
                    let mut result = CallToolResult::success(content);
                    if advertised {
                        result.structured_content = Some(output.clone());
                    }
                    result
                }
                None => {
                    let mut result =
                        CallToolResult::success(vec![ContentBlock::text(output.to_string())]);
                    if output.is_object() {
                        result.structured_content = Some(output.clone());
                    }
                    result
                }
            },
            (None, Some(artifact)) => match artifact_result(gateway, response, artifact).await {
                Ok(result) => {
                    meta.insert(META_ARTIFACT.into(), json!(artifact));
                    result
                }
                Err(fields) => {
                    meta.insert(META_DIAGNOSTIC.into(), fields.clone());
                    CallToolResult::error(vec![ContentBlock::text(fields.to_string())])
                }
            },
            (None, None) => CallToolResult::success(vec![ContentBlock::text("null")]),
        }
    } else {
        let fields = error_fields(response);
        meta.insert(META_DIAGNOSTIC.into(), fields.clone());
        CallToolResult::error(vec![ContentBlock::text(fields.to_string())])
    };
    result.meta = Some(meta);
    result
}

/// The content blocks of an MCP upstream's result, when the call's tool has an `mcp`
/// adapter and its output is the adapter's `{"content": [...]}` form (the upstream
/// sent neither `structuredContent` nor a single JSON text block): each block is sent
/// as the upstream sent it (image, audio, resource link, embedded resource, with their
/// annotations); a block of a type this gateway does not know is sent as text holding
/// its JSON. Also whether the tool advertises an `outputSchema` (then the output goes
/// in `structuredContent` too).
fn upstream_content(
    gateway: &Gateway,
    response: &CallResponse,
    output: &Value,
) -> Option<(Vec<ContentBlock>, bool)> {
    let Value::Object(map) = output else {
        return None;
    };
    let blocks = map.get("content")?.as_array()?;
    if map.len() != 1 {
        return None;
    }
    let loaded = gateway.current();
    let tool = loaded.policy.tools.get(response.tool_name.as_deref()?)?;
    if !matches!(tool.adapter, crate::policy::AdapterConfig::Mcp { .. }) {
        return None;
    }
    let content = blocks
        .iter()
        .map(|block| {
            serde_json::from_value::<ContentBlock>(block.clone())
                .unwrap_or_else(|_| ContentBlock::text(block.to_string()))
        })
        .collect();
    Some((content, advertised_output_schema(&tool.output_schema)))
}

/// A success whose output the policy kept out of the response: a `resource_link` to
/// the artifact (fetched with `GET /v1/artifacts/{sha256}`), a summary, and the output
/// as `structuredContent` when the tool advertises an `outputSchema`.
async fn artifact_result(
    gateway: &Gateway,
    response: &CallResponse,
    artifact: &ArtifactRef,
) -> Result<CallToolResult, Value> {
    let link = serde_json::from_value::<ContentBlock>(json!({
        "type": "resource_link",
        "uri": artifact.uri,
        "name": format!("artifact-{}", artifact.sha256),
        "description": "The call's output, held as an artifact: GET /v1/artifacts/{sha256}?run_id=...",
        "mimeType": artifact.media_type,
        "size": artifact.bytes,
    }))
    .map_err(|e| artifact_failure(response, &format!("the artifact link could not be built: {e}")))?;
    let summary = ContentBlock::text(json!({ "artifact": artifact }).to_string());
    let mut result = CallToolResult::success(vec![link, summary]);
    let advertised = response
        .tool_name
        .as_deref()
        .and_then(|name| {
            gateway
                .current()
                .policy
                .tools
                .get(name)
                .map(|t| advertised_output_schema(&t.output_schema))
        })
        .unwrap_or(false);
    if advertised {
        let bytes = gateway.artifacts.get(&artifact.sha256).await.map_err(|e| {
            artifact_failure(response, &format!("the artifact could not be read: {e}"))
        })?;
        let output: Value = serde_json::from_slice(&bytes)
            .map_err(|e| artifact_failure(response, &format!("the artifact is not JSON: {e}")))?;
        result.structured_content = Some(output);
    }
    Ok(result)
}

/// Why an artifact-held output could not be returned, as error fields.
fn artifact_failure(response: &CallResponse, message: &str) -> Value {
    let refusal = Refusal::new(Reason::InternalError, message.to_string());
    let mut fields = serde_json::to_value(refusal.diagnostic()).unwrap_or_else(|_| json!({}));
    if let Some(obj) = fields.as_object_mut() {
        obj.insert("status".into(), json!(response.status));
        obj.insert("call_id".into(), json!(response.call_id));
        obj.insert("audit_event_id".into(), json!(response.audit_event_id));
        obj.insert("tool_name".into(), json!(response.tool_name));
    }
    fields
}

/// Whether the front advertises `schema` as the tool's `outputSchema`: MCP output
/// schemas describe an object (structuredContent is an object).
fn advertised_output_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// The diagnostic of a refused or failed call, with its status, error code, call id
/// and audit event id, as one object.
fn error_fields(response: &CallResponse) -> Value {
    let mut fields = response
        .diagnostic
        .as_ref()
        .and_then(|d| serde_json::to_value(d).ok())
        .unwrap_or_else(|| json!({}));
    if let Some(obj) = fields.as_object_mut() {
        obj.insert("status".into(), json!(response.status));
        obj.insert("error_code".into(), json!(response.error_code));
        obj.insert("call_id".into(), json!(response.call_id));
        obj.insert("audit_event_id".into(), json!(response.audit_event_id));
        obj.insert("tool_name".into(), json!(response.tool_name));
    }
    fields
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

    const GOOD: [(&str, &str); 5] = [
        ("authorization", "Bearer demo-research_agent"),
        ("x-toolgate-role", "research_agent"),
        ("x-toolgate-run", "run-1"),
        ("x-toolgate-lane", "research"),
        ("x-toolgate-scope", r#"{"case_id":"C-1001"}"#),
    ];

    #[test]
    fn good_headers_read_cleanly() {
        let caller = Caller::read(&headers(&GOOD));
        assert!(caller.problems.is_empty(), "{:?}", caller.problems);
        assert_eq!(caller.token.as_deref(), Some("demo-research_agent"));
        assert_eq!(caller.lane_id.as_deref(), Some("research"));
        assert_eq!(caller.scope.unwrap()["case_id"], "C-1001");
    }

    #[test]
    fn every_header_problem_is_listed() {
        let caller = Caller::read(&headers(&[
            ("x-toolgate-role", ""),
            ("x-toolgate-lane", "a"),
            ("x-toolgate-lane", "b"),
            ("x-toolgate-scope", "[1]"),
        ]));
        let all = caller.problems.join("\n");
        for needle in [
            "`X-Toolgate-Role` must be 1 to",
            "missing header `X-Toolgate-Run`",
            "`X-Toolgate-Lane` is given more than once",
            "`X-Toolgate-Scope` must be a JSON object",
        ] {
            assert!(all.contains(needle), "{needle} not in {all}");
        }
        assert!(caller.token.is_none());
        let refusal = caller.malformed().unwrap();
        assert_eq!(refusal.reason, Reason::RequestMalformed);
        assert!(
            refusal.message.contains("(and 3 more)"),
            "{}",
            refusal.message
        );
    }

    #[test]
    fn scope_that_is_not_json_is_a_problem() {
        let mut pairs = GOOD.to_vec();
        pairs[4] = ("x-toolgate-scope", "case_id=C-1");
        let caller = Caller::read(&headers(&pairs));
        assert!(
            caller.problems[0].contains("not valid JSON"),
            "{:?}",
            caller.problems
        );
    }

    #[test]
    fn meta_cannot_override_headers() {
        let caller = Caller::read(&headers(&GOOD));
        let mut call = CallToolRequestParams::new("case_lookup");
        call.arguments = Some(
            json!({"role_id": "supervisor"})
                .as_object()
                .cloned()
                .unwrap(),
        );
        let meta: JsonObject = json!({
            "io.toolgate/role_id": "supervisor",
            "role_id": "supervisor",
            "scope": {"case_id": "C-9"},
            META_IDEMPOTENCY_KEY: "k-1",
            META_TIMEOUT_MS: 250,
        })
        .as_object()
        .cloned()
        .unwrap();
        let request = caller.into_request(&call, &meta).unwrap();
        assert_eq!(request.role_id, "research_agent");
        assert_eq!(request.scope["case_id"], "C-1001");
        assert_eq!(request.idempotency_key.as_deref(), Some("k-1"));
        assert_eq!(request.timeout_ms, Some(250));
        // An argument named like a header is just an argument (the input schema
        // decides whether it is allowed).
        assert_eq!(request.arguments["role_id"], "supervisor");
    }

    #[test]
    fn bad_meta_values_are_malformed() {
        let caller = Caller::read(&headers(&GOOD));
        let call = CallToolRequestParams::new("case_lookup");
        let meta: JsonObject = json!({ META_TIMEOUT_MS: "soon" })
            .as_object()
            .cloned()
            .unwrap();
        let (refusal, partial) = *caller.into_request(&call, &meta).unwrap_err();
        assert_eq!(refusal.reason, Reason::RequestMalformed);
        assert_eq!(partial.role_id.as_deref(), Some("research_agent"));
    }

    #[test]
    fn missing_headers_keep_what_is_known_for_the_audit_record() {
        let caller = Caller::read(&headers(&GOOD[..2]));
        let call = CallToolRequestParams::new("case_lookup");
        let (refusal, partial) = *caller.into_request(&call, &JsonObject::new()).unwrap_err();
        assert_eq!(refusal.reason, Reason::RequestMalformed);
        assert_eq!(partial.role_id.as_deref(), Some("research_agent"));
        assert_eq!(partial.tool_name.as_deref(), Some("case_lookup"));
        assert!(partial.run_id.is_none());
    }

    #[test]
    fn object_output_schemas_are_advertised_others_are_not() {
        let entry = CatalogTool {
            tool_name: "t".into(),
            version: "1.0.0".into(),
            description: "d".into(),
            determinism: crate::policy::Determinism::Pure,
            idempotent: true,
            timeout_default_ms: 1000,
            limits: crate::policy::Limits {
                timeout_ms_max: 1000,
                max_output_bytes: 1024,
                max_concurrency: 1,
            },
            required_scope_keys: Vec::new(),
            conditions: Vec::new(),
            input_schema: Arc::new(json!({"type": "object"})),
            output_schema: Arc::new(
                json!({"type": "object", "properties": {"a": {"type": "string"}}}),
            ),
            prompt: String::new(),
        };
        let tool = mcp_tool(&entry);
        assert!(tool.output_schema.is_some());
        let annotations = tool.annotations.unwrap();
        assert_eq!(annotations.read_only_hint, Some(true));
        assert_eq!(annotations.idempotent_hint, Some(true));
        let mut entry = entry;
        entry.output_schema = Arc::new(json!({"type": "array"}));
        assert!(mcp_tool(&entry).output_schema.is_none());
    }
}
