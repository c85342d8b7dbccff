//! The HTTP API: routes requests to the gateway and turns its answers into responses.
//!
//! INVARIANT: this is the only module that serves HTTP (hyper), apart from the MCP
//! front it hands `/mcp` to (`mcp::front`). Every response body is JSON: a refusal is
//! always the structured diagnostic, never free text, and the HTTP status is derived
//! from the diagnostic in one place ([`http_status`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{
    ALLOW, AUTHORIZATION, CACHE_CONTROL, CONNECTION, CONTENT_SECURITY_POLICY, CONTENT_TYPE,
    HeaderValue, REFERRER_POLICY, RETRY_AFTER, TRANSFER_ENCODING, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::audit::{EventFilter, EventType};
use crate::call::{CallBody, CallResponse, Status};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::Gateway;
use crate::limits::{Admission, ClientLimits, Limit, LimitOptions, Permit};
use crate::observe::trace::TraceParent;
use crate::requests::{self, ListRuns};
use crate::transport::JsonRefusals;
use crate::workers::Workers;

/// Limits of the HTTP front.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Request bodies larger than this get 413.
    pub max_body_bytes: usize,
    /// Connections in total, per client address, and the request rate per client.
    pub limits: LimitOptions,
    /// Time allowed to send the request headers and, separately, the body. An idle
    /// connection (no request started) is closed after this long too.
    pub read_timeout: Duration,
    /// The threads that serve connections (none: the caller's runtime).
    pub workers: Workers,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_body_bytes: 1024 * 1024,
            limits: LimitOptions::default(),
            read_timeout: Duration::from_secs(30),
            workers: Workers::default(),
        }
    }
}

/// How long an overflow connection may take to send its request head.
const OVERFLOW_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest request head an overflow connection may send.
const OVERFLOW_HEAD_BYTES: usize = 2048;

/// Serves the API on `listener` until `shutdown` resolves, then stops accepting and
/// waits (up to `drain`) for in-flight requests to finish.
///
/// The accept loop never waits for a free slot: a connection over the per-client or
/// the total cap is admitted as an overflow connection that answers the health
/// endpoints and refuses the rest with a 429 (see `limits.rs`).
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    options: ServerOptions,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let limits = ClientLimits::new(options.limits);
    let options = Arc::new(options);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors or similar: back off briefly.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let permit = match limits.admit(peer.ip()) {
            Admission::Full(permit) => permit,
            Admission::Overflow(permit) => {
                tokio::spawn(overflow(stream, permit, gateway.clone()));
                continue;
            }
            Admission::Closed => {
                drop(stream);
                continue;
            }
        };
        let gateway = gateway.clone();
        let read_timeout = options.read_timeout;
        let options = options.clone();
        let limits = limits.clone();
        let watcher = graceful.watcher();
        options
            .workers
            .clone()
            .spawn_connection(stream, move |stream| {
                let service = service_fn(move |req| {
                    served(gateway.clone(), options.clone(), limits.clone(), peer, req)
                });
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(read_timeout)
                    .serve_connection(TokioIo::new(JsonRefusals::new(stream)), service);
                let conn = watcher.watch(conn);
                async move {
                    let _ = conn.await;
                    drop(permit);
                }
            });
    }
    drop(listener);
    // The drain time of the policy loaded now: a reload may have raised a tool's limits.
    let drain = gateway.drain_time();
    let finished = graceful.shutdown();
    tokio::pin!(finished);
    if tokio::time::timeout(drain, &mut finished).await.is_err() {
        // Calls still running are cancelled, not cut off: each closes as `cancelled`
        // with its closing event, and only then may the log close.
        tracing::warn!(
            drain_ms = drain.as_millis() as u64,
            "in-flight requests did not finish in time; cancelling them"
        );
        gateway.cancel_in_flight();
        if tokio::time::timeout(CANCEL_GRACE, finished).await.is_err() {
            tracing::error!(
                grace_ms = CANCEL_GRACE.as_millis() as u64,
                "cancelled requests did not close in time"
            );
        }
    }
}

/// How long a shutdown waits for cancelled calls to write their closing events once
/// the drain time has run out (a command's process group is killed at once; an MCP
/// cancellation is one notification).
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// An overflow connection: reads one request head (bounded in bytes and time),
/// answers `GET /healthz` and `GET /readyz`, refuses anything else with a 429, and
/// closes. It never reaches the pipeline and holds no more than one small buffer.
async fn overflow(mut stream: TcpStream, permit: Permit, gateway: Arc<Gateway>) {
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
    let line = head[..len]
        .split(|b| *b == b'\r')
        .next()
        .unwrap_or_default();
    let response = if line == b"GET /healthz HTTP/1.1" || line == b"GET /healthz HTTP/1.0" {
        raw_json(200, &health())
    } else if line == b"GET /readyz HTTP/1.1" || line == b"GET /readyz HTTP/1.0" {
        raw_json(200, &ready(&gateway))
    } else {
        let limit = permit.overflow().unwrap_or(Limit::Connections);
        let refusal = Refusal::new(
            Reason::RateLimited,
            format!(
                "too many connections ({}); this one only answers /healthz and /readyz",
                limit.as_str().replace('_', " ")
            ),
        )
        .with_details(json!({ "limit": limit.as_str(), "retry_after_ms": 1000 }));
        crate::transport::json_response(429, &refusal)
    };
    let _ = tokio::time::timeout(OVERFLOW_READ_TIMEOUT, stream.write_all(&response)).await;
    let _ = stream.shutdown().await;
    drop(permit);
}

/// A complete `connection: close` JSON response with `status`.
fn raw_json(status: u16, body: &Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "HTTP/1.1 {status} OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn health() -> Value {
    json!({ "status": "ok" })
}

fn ready(gateway: &Gateway) -> Value {
    let loaded = gateway.current();
    json!({
        "ready": true,
        "policy_versions": loaded.policy.versions,
        "safety_lock": gateway.safety_lock().engaged,
    })
}

type HttpResponse = Response<Full<Bytes>>;

/// What a connection sends: a whole body, or the SSE stream of an MCP call that reports
/// progress (it must reach the client as it happens, not at the end).
type ServedBody = http_body_util::Either<Full<Bytes>, StreamBody>;
type StreamBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The SSE body of an MCP answer, carried from [`mcp`] to [`served`] in the
/// response's extensions (the router's responses are whole bodies).
#[derive(Clone)]
struct StreamedBody(Arc<std::sync::Mutex<Option<StreamBody>>>);

/// Routes one request; an MCP answer that streams is sent as a stream. Dropping the
/// stream (the client went away) cancels the MCP call it carries.
async fn served(
    gateway: Arc<Gateway>,
    options: Arc<ServerOptions>,
    limits: Arc<ClientLimits>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<ServedBody>, Infallible> {
    let mut response = match route(gateway, options, limits, peer, req).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let streamed = response
        .extensions_mut()
        .remove::<StreamedBody>()
        .and_then(|s| s.0.lock().ok().and_then(|mut body| body.take()));
    Ok(match streamed {
        Some(body) => response.map(|_| http_body_util::Either::Right(body)),
        None => response.map(http_body_util::Either::Left),
    })
}

/// Routes one request. Never fails: every outcome is a JSON response.
async fn route(
    gateway: Arc<Gateway>,
    options: Arc<ServerOptions>,
    limits: Arc<ClientLimits>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<HttpResponse, Infallible> {
    if let Some(refusal) = transport_refusal(&req) {
        let mut response = refusal_response(&refusal);
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return Ok(response);
    }
    let health_path = matches!(req.uri().path(), "/healthz" | "/readyz" | "/metrics");
    if !health_path && let Err(wait) = limits.allow_request(peer.ip(), std::time::Instant::now()) {
        let rate = limits.options().max_requests_per_second_per_client;
        let refusal = Refusal::new(
            Reason::RateLimited,
            format!("more than {rate} requests per second from this client"),
        )
        .with_details(json!({
            "limit": Limit::RequestsPerSecond.as_str(),
            "max_requests_per_second": rate,
            "retry_after_ms": (wait.as_millis() as u64).max(1),
        }));
        return Ok(refusal_response(&refusal));
    }
    // One credential per request: of two or more `Authorization` headers none is
    // picked, and the request is malformed (a tool call is still a call: refused and
    // audited). `/mcp` reads its headers itself, with the same rule.
    let twice = authorization_twice(&req);
    let token = match twice {
        Some(_) => None,
        None => bearer_token(&req),
    };
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = query_params(req.uri().query());
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if let Some(metadata) = protected_resource_metadata(&gateway, &req) {
        return Ok(metadata);
    }
    if path == crate::mcp::front::ENDPOINT {
        return Ok(mcp(gateway, &options, req).await);
    }
    // The console's page and assets need no credential: the page asks for one and
    // sends it to the API like any client.
    if path == crate::console::PATH || path.starts_with("/console/") {
        return Ok(console(&method, &path));
    }
    if let Some(refusal) = &twice
        && !health_path
        && path != "/v1/tool-calls"
    {
        return Ok(refusal_response(refusal));
    }
    // A bearer JWT is verified once, before any endpoint reads it (the pipeline
    // verifies and audits its own).
    if path != "/v1/tool-calls"
        && let Some(Err(refusal)) = gateway
            .authenticate(&gateway.current().policy, token.as_deref())
            .await
    {
        return Ok(refusal_response(&refusal));
    }

    let body = match read_body(req, &options).await {
        Ok(body) => body,
        Err(refusal) => {
            if (method, segments.as_slice()) == (Method::POST, ["v1", "tool-calls"].as_slice()) {
                if let Some(unrecorded) = gateway.unrecorded_refusal() {
                    return Ok(refusal_response(&unrecorded));
                }
                // A refused tool call is still a tool call: it gets its audit record,
                // in a task of its own like every call, so a client that goes away
                // (a JWT's identity provider can take seconds) cannot cut it short.
                let request = Err(Box::new((refusal, Default::default())));
                let gw = gateway.clone();
                let handle = tokio::spawn(async move {
                    gw.handle_traced(token.as_deref(), request, parent.as_ref())
                        .await
                });
                return Ok(match handle.await {
                    Ok(response) => call_response(&response),
                    Err(_) => refusal_response(&Refusal::new(
                        Reason::InternalError,
                        "the call task failed",
                    )),
                });
            }
            return Ok(refusal_response(&refusal));
        }
    };

    // With the audit log down to the reserve kept for admin changes, calls and
    // commits are refused here, unrecorded (docs/operations.md, "Audit capacity"),
    // once their bodies are read (so the answer arrives).
    if method == Method::POST
        && matches!(segments.as_slice(), ["v1", "tool-calls", ..])
        && let Some(refusal) = gateway.unrecorded_refusal()
    {
        return Ok(refusal_response(&refusal));
    }
    let response = match (&method, segments.as_slice()) {
        (&Method::POST, ["v1", "tool-calls"]) => {
            // Spawned so a client that disconnects cannot cut a call halfway: every
            // call runs to its closing audit event. A dropped connection drops this
            // future, and the guard cancels the call (closed as `cancelled`).
            let gw = gateway.clone();
            let signals = crate::call::CallSignals::default();
            let cancel_on_disconnect = signals.cancel.clone().drop_guard();
            let handle = tokio::spawn(async move {
                // A body that does not parse is still a tool call: refused at step 1
                // and audited like every call.
                // In a fleet, the run token's binding is read from the cluster
                // database first (a failure is refused by the pipeline itself).
                let _ = gw.fleet_refresh(token.as_deref(), None).await;
                let request = CallBody::from_bytes(&body)
                    .and_then(|body| gw.parse_call(token.as_deref(), body));
                let request = match twice {
                    Some(refusal) => crate::call::refused(request, refusal),
                    None => request,
                };
                gw.handle_signalled(token.as_deref(), request, parent.as_ref(), signals)
                    .await
            });
            let joined = handle.await;
            cancel_on_disconnect.disarm();
            match joined {
                Ok(response) => call_response(&response),
                Err(_) => {
                    refusal_response(&Refusal::new(Reason::InternalError, "the call task failed"))
                }
            }
        }
        (&Method::POST, ["v1", "tool-calls", call_id, "commit"]) => {
            // Spawned like a call: a disconnect cannot cut a commit between its claim
            // and its audit event.
            let gw = gateway.clone();
            let call_id = call_id.to_string();
            let handle = tokio::spawn(async move {
                gw.commit(token.as_deref(), &call_id, requests::parse(&body))
                    .await
            });
            match handle.await {
                Ok(result) => respond(result, StatusCode::OK),
                Err(_) => refusal_response(&Refusal::new(
                    Reason::InternalError,
                    "the commit task failed",
                )),
            }
        }
        (&Method::POST, ["v1", "runs"]) => respond(
            gateway
                .create_run_issuing(token.as_deref(), requests::parse(&body))
                .await,
            StatusCode::CREATED,
        ),
        (&Method::POST, ["v1", "runs", run_id, "tokens", token_id, "revoke"]) => respond(
            gateway
                .revoke_run_token(token.as_deref(), run_id, token_id)
                .await,
            StatusCode::OK,
        ),
        (&Method::GET, ["v1", "runs"]) => respond(
            gateway
                .list_runs(
                    token.as_deref(),
                    ListRuns::from_query(
                        query.get("status").map(String::as_str),
                        query.get("limit").map(String::as_str),
                        query.get("cursor").map(String::as_str),
                    ),
                )
                .await,
            StatusCode::OK,
        ),
        (&Method::POST, ["v1", "runs", run_id, "repin"]) => respond(
            gateway
                .repin_run(token.as_deref(), run_id, requests::parse(&body))
                .await,
            StatusCode::OK,
        ),
        (&Method::GET, ["v1", "runs", run_id, "events"]) => respond(
            gateway
                .run_events(
                    token.as_deref(),
                    run_id,
                    crate::gateway::EvidencePage::from_query(
                        query.get("after_seq").map(String::as_str),
                        query.get("limit").map(String::as_str),
                    ),
                )
                .await,
            StatusCode::OK,
        ),
        (&Method::GET, ["v1", "runs", run_id, "export"]) => {
            match gateway.run_export(token.as_deref(), run_id).await {
                Ok(bundle) => {
                    let mut response = json_response(StatusCode::OK, &json!(bundle));
                    let name = format!("toolgate-run-{run_id}-export.json");
                    if let Ok(v) =
                        HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
                    {
                        response
                            .headers_mut()
                            .insert(hyper::header::CONTENT_DISPOSITION, v);
                    }
                    response
                }
                Err(r) => refusal_response(&r),
            }
        }
        (&Method::GET, ["v1", "runs", run_id]) => respond(
            gateway.get_run(token.as_deref(), run_id).await,
            StatusCode::OK,
        ),
        (&Method::POST, ["v1", "runs", run_id, "status"]) => respond(
            gateway
                .set_run_status(token.as_deref(), run_id, requests::parse(&body))
                .await,
            StatusCode::OK,
        ),
        (&Method::GET, ["v1", "tools"]) => {
            let role = query.get("role_id").map(String::as_str).unwrap_or_default();
            let lane = query.get("lane_id").map(String::as_str).unwrap_or_default();
            let catalog = match gateway.fleet_refresh(token.as_deref(), None).await {
                Ok(_) => gateway.tool_catalog(token.as_deref(), role, lane),
                Err(refusal) => Err(refusal),
            };
            match catalog {
                Ok(catalog) => json_response(StatusCode::OK, &catalog),
                Err(r) => refusal_response(&r),
            }
        }
        (&Method::POST, ["v1", "safety-lock"]) => respond(
            gateway
                .set_safety_lock(token.as_deref(), requests::parse(&body))
                .await,
            StatusCode::OK,
        ),
        (&Method::GET, ["v1", "safety-lock"]) => match gateway.verify_any(token.as_deref()) {
            Ok(()) => json_response(StatusCode::OK, &json!(gateway.safety_lock())),
            Err(r) => refusal_response(&r),
        },
        (&Method::GET, ["v1", "audit", "events"]) => {
            let filter = match audit_filter(&query) {
                Ok(f) => f,
                Err(r) => return Ok(refusal_response(&r)),
            };
            match gateway.audit_events(token.as_deref(), filter).await {
                Ok(events) => {
                    let next = events.last().and_then(|e| e["seq"].as_u64());
                    json_response(
                        StatusCode::OK,
                        &json!({ "events": events, "next_after_seq": next }),
                    )
                }
                Err(r) => refusal_response(&r),
            }
        }
        (&Method::GET, ["v1", "artifacts", sha256]) => {
            let artifact = gateway.artifact(
                token.as_deref(),
                sha256,
                query.get("run_id").map(String::as_str),
                query.get("role_id").map(String::as_str),
            );
            match artifact.await {
                Ok(bytes) => with_json_type(Response::new(Full::new(Bytes::from(bytes)))),
                Err(r) => refusal_response(&r),
            }
        }
        (&Method::GET, ["v1", "approvals"]) => respond(
            gateway
                .list_approvals(
                    token.as_deref(),
                    requests::ListApprovals::from_query(
                        query.get("status").map(String::as_str),
                        query.get("run_id").map(String::as_str),
                        query.get("limit").map(String::as_str),
                        query.get("cursor").map(String::as_str),
                        query.get("order").map(String::as_str),
                    ),
                )
                .await,
            StatusCode::OK,
        ),
        (&Method::GET, ["v1", "approvals", approval_id]) => respond(
            gateway.get_approval(token.as_deref(), approval_id).await,
            StatusCode::OK,
        ),
        (&Method::POST, ["v1", "approvals", approval_id, "decision"]) => respond(
            gateway
                .decide_approval(token.as_deref(), approval_id, requests::parse(&body))
                .await,
            StatusCode::OK,
        ),
        (&Method::POST, ["v1", "policy", "reload"]) => respond(
            gateway.reload_as_admin(token.as_deref()).await,
            StatusCode::OK,
        ),
        (&Method::GET, ["v1", "policy"]) => match gateway.verify_any(token.as_deref()) {
            Ok(()) => {
                let loaded = gateway.current();
                json_response(
                    StatusCode::OK,
                    &json!({ "policy_versions": loaded.policy.versions, "source": loaded.policy.source }),
                )
            }
            Err(r) => refusal_response(&r),
        },
        // No credential: the listener is loopback by default; see docs/operations.md.
        (&Method::GET, ["metrics"]) => {
            let mut response = Response::new(Full::new(Bytes::from(
                gateway.render_metrics(Some(limits.open())),
            )));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(crate::observe::metrics::CONTENT_TYPE),
            );
            response
        }
        (&Method::GET, ["healthz"]) => json_response(StatusCode::OK, &health()),
        (&Method::GET, ["readyz"]) => json_response(StatusCode::OK, &ready(&gateway)),
        _ => match allowed_methods(&segments) {
            Some(allow) => {
                let refusal = Refusal::new(
                    Reason::MethodNotAllowed,
                    format!(
                        "`{method} {}` is not served; this endpoint serves {allow}",
                        path.chars().take(200).collect::<String>()
                    ),
                )
                .with_details(json!({ "allow": allow.split(", ").collect::<Vec<_>>() }));
                let mut response = refusal_response(&refusal);
                response
                    .headers_mut()
                    .insert(ALLOW, HeaderValue::from_static(allow));
                response
            }
            None => refusal_response(&Refusal::new(
                Reason::EndpointNotFound,
                format!(
                    "no endpoint `{method} {}`",
                    path.chars().take(200).collect::<String>()
                ),
            )),
        },
    };
    Ok(response)
}

/// The methods an existing endpoint serves (for a 405's `Allow`), None for a path
/// that is no endpoint.
fn allowed_methods(segments: &[&str]) -> Option<&'static str> {
    match segments {
        ["v1", "tool-calls"] | ["v1", "runs"] | ["v1", "runs", _, "status"] => Some("POST"),
        ["v1", "runs", _, "tokens", _, "revoke"] => Some("POST"),
        ["v1", "tool-calls", _, "commit"] => Some("POST"),
        ["v1", "policy", "reload"] => Some("POST"),
        ["v1", "approvals", _, "decision"] => Some("POST"),
        ["v1", "approvals"] | ["v1", "approvals", _] => Some("GET"),
        ["v1", "safety-lock"] => Some("GET, POST"),
        ["v1", "runs", _]
        | ["v1", "runs", _, "events"]
        | ["v1", "runs", _, "export"]
        | ["v1", "tools"]
        | ["v1", "audit", "events"]
        | ["v1", "artifacts", _]
        | ["v1", "policy"]
        | ["metrics"]
        | ["healthz"]
        | ["readyz"] => Some("GET"),
        _ => None,
    }
}

/// A request whose framing toolgate refuses before reading it: any
/// `Transfer-Encoding` (request bodies must carry `Content-Length`; with both headers,
/// the request-smuggling shape, hyper would silently drop one of them).
fn transport_refusal(req: &Request<Incoming>) -> Option<Refusal> {
    if req.headers().contains_key(TRANSFER_ENCODING) {
        let message = "`Transfer-Encoding` is not accepted: send the request body with `Content-Length` (and never both)";
        return Some(
            Refusal::new(Reason::RequestMalformed, message)
                .with_details(json!({ "problems": [message] })),
        );
    }
    None
}

/// `/mcp`: the MCP front (`mcp::front`), with the API's body limits. Only POST is
/// served (stateless: no server-initiated streams, no sessions to delete). Bodies
/// stay JSON: the transport's plain-text errors (406, 415, ...) are wrapped in the
/// structured refusal, keeping their status.
async fn mcp(
    gateway: Arc<Gateway>,
    options: &ServerOptions,
    req: Request<Incoming>,
) -> HttpResponse {
    if req.method() != Method::POST {
        let refusal = Refusal::new(
            Reason::MethodNotAllowed,
            format!(
                "`{} /mcp` is not served: mcp requests are POSTed; this server opens no streams and keeps no sessions",
                req.method()
            ),
        )
        .with_details(json!({ "allow": ["POST"] }));
        let mut response = refusal_response(&refusal);
        response
            .headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    if let Some(unauthorized) = mcp_unauthorized(&gateway, &req).await {
        return unauthorized;
    }
    let (parts, body) = req.into_parts();
    let body = match read_body(Request::from_parts(parts.clone(), body), options).await {
        Ok(body) => body,
        Err(refusal) => return refusal_response(&refusal),
    };
    if let Some(refusal) = crate::mcp::transport::refusal(&parts.headers, &body) {
        return match crate::mcp::transport::jsonrpc_error(&refusal, &body) {
            Some(error) => json_response(http_status(refusal.reason), &error),
            None => refusal_response(&refusal),
        };
    }
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
        // Not JSON at all: a JSON-RPC parse error (the transport would answer 415).
        let error = json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {
                "code": -32700,
                "message": format!("parse error: the body is not valid JSON: {e}"),
            },
        });
        return json_response(StatusCode::BAD_REQUEST, &error);
    }
    let response =
        crate::mcp::front::handle(gateway, Request::from_parts(parts, Full::new(body))).await;
    // The front answers with JSON (`json_response`), complete when the handler returns,
    // except a call that reports progress: its answer is an SSE stream, bounded by the
    // call's deadline, sent as it comes.
    let (head, body) = response.into_parts();
    let stream = head
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if stream && head.status.is_success() {
        let mut response = Response::from_parts(head, Full::new(Bytes::new()));
        response
            .extensions_mut()
            .insert(StreamedBody(Arc::new(std::sync::Mutex::new(Some(body)))));
        return response;
    }
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    let is_json = head
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/event-stream"));
    if !is_json && !head.status.is_success() {
        let text = String::from_utf8_lossy(&bytes)
            .chars()
            .take(500)
            .collect::<String>();
        let mut response = refusal_response(
            &Refusal::new(Reason::RequestMalformed, format!("mcp transport: {text}"))
                .with_details(json!({ "problems": [text] })),
        );
        *response.status_mut() = head.status;
        return response;
    }
    Response::from_parts(head, Full::new(bytes))
}

/// The OAuth protected-resource metadata path (RFC 9728), and its form for the MCP
/// endpoint (the well-known segment inserted before `/mcp`).
const RESOURCE_METADATA: &str = "/.well-known/oauth-protected-resource";

/// The base URL of this server: `serve --public-url`, else `http://` and the request's
/// `Host` (well-formed, or `localhost`).
fn public_base(gateway: &Gateway, req: &Request<Incoming>) -> String {
    if let Some(url) = gateway.public_url() {
        return url.to_string();
    }
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
                })
        })
        .unwrap_or("localhost");
    format!("http://{host}")
}

/// `GET /.well-known/oauth-protected-resource[/mcp]` (RFC 9728), served when the
/// policy has identity providers: the MCP resource URI and the providers' issuers as
/// its authorization servers. None for any other request.
fn protected_resource_metadata(gateway: &Gateway, req: &Request<Incoming>) -> Option<HttpResponse> {
    let path = req.uri().path();
    // The bare path or the one suffixed with the MCP endpoint; checked without
    // building a string, as every request passes here.
    match path.strip_prefix(RESOURCE_METADATA) {
        Some("") => {}
        Some(rest) if rest == crate::mcp::front::ENDPOINT => {}
        _ => return None,
    }
    let loaded = gateway.current();
    let providers = &loaded.policy.identity.providers;
    if providers.is_empty() {
        return Some(refusal_response(&Refusal::new(
            Reason::EndpointNotFound,
            "no identity providers are configured, so no protected-resource metadata is published",
        )));
    }
    if req.method() != Method::GET {
        let refusal = Refusal::new(
            Reason::MethodNotAllowed,
            format!(
                "`{} {path}` is not served; this endpoint serves GET",
                req.method()
            ),
        )
        .with_details(json!({ "allow": ["GET"] }));
        let mut response = refusal_response(&refusal);
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return Some(response);
    }
    let mut issuers: Vec<&str> = providers.values().map(|p| p.issuer.as_str()).collect();
    issuers.sort();
    issuers.dedup();
    let resource = format!(
        "{}{}",
        public_base(gateway, req),
        crate::mcp::front::ENDPOINT
    );
    Some(json_response(
        StatusCode::OK,
        &json!({
            "resource": resource,
            "authorization_servers": issuers,
            "bearer_methods_supported": ["header"],
            "resource_name": "toolgate",
        }),
    ))
}

/// `/mcp` when the policy has identity providers (MCP authorization): a request
/// without a credential, or with a JWT that does not verify, is answered 401 with
/// `WWW-Authenticate: Bearer resource_metadata="..."` (the refusal as the body).
async fn mcp_unauthorized(gateway: &Gateway, req: &Request<Incoming>) -> Option<HttpResponse> {
    let loaded = gateway.current();
    if loaded.policy.identity.providers.is_empty() {
        return None;
    }
    if authorization_twice(req).is_some() {
        // Two credentials prove nothing: the front refuses the request as malformed
        // (a `tools/call` through the pipeline, audited).
        return None;
    }
    let token = bearer_token(req);
    let refusal = match token.as_deref() {
        None => Refusal::new(
            Reason::CredentialMissing,
            "no bearer token in the Authorization header",
        ),
        Some(t) => gateway.authenticate(&loaded.policy, Some(t)).await?.err()?,
    };
    let metadata = format!(
        "{}{RESOURCE_METADATA}{}",
        public_base(gateway, req),
        crate::mcp::front::ENDPOINT
    );
    let challenge = match refusal.reason {
        Reason::CredentialMissing => format!("Bearer resource_metadata=\"{metadata}\""),
        _ => format!("Bearer error=\"invalid_token\", resource_metadata=\"{metadata}\""),
    };
    let mut response = refusal_response(&refusal);
    if response.status() == StatusCode::UNAUTHORIZED
        && let Ok(value) = HeaderValue::from_str(&challenge)
    {
        response
            .headers_mut()
            .insert(hyper::header::WWW_AUTHENTICATE, value);
    }
    Some(response)
}

/// Reads the whole body, refusing one over the size limit or slower than the timeout.
async fn read_body(req: Request<Incoming>, options: &ServerOptions) -> Result<Bytes, Refusal> {
    let limit = options.max_body_bytes;
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|len| len.to_str().ok()?.parse::<u64>().ok());
    let mut body = req.into_body();
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

async fn drain(body: &mut Incoming, read_timeout: Duration) {
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

/// The refusal of a request with more than one `Authorization` header: which one a
/// proxy or a client meant is not for the server to guess.
fn authorization_twice(req: &Request<Incoming>) -> Option<Refusal> {
    req.headers().get_all(AUTHORIZATION).iter().nth(1)?;
    let problem = "header `Authorization` is given more than once";
    Some(
        Refusal::new(
            Reason::RequestMalformed,
            format!("malformed request: {problem}"),
        )
        .with_details(json!({ "problems": [problem] })),
    )
}

/// The token of an `Authorization: Bearer <token>` header, exactly as sent.
fn bearer_token(req: &Request<Incoming>) -> Option<String> {
    crate::call::bearer_token(req.headers().get(AUTHORIZATION)?.as_bytes())
}

fn query_params(query: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .take(32)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn audit_filter(query: &HashMap<String, String>) -> Result<EventFilter, Refusal> {
    let number = |name: &str, default: u64| -> Result<u64, Refusal> {
        match query.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| {
                Refusal::new(
                    Reason::RequestMalformed,
                    format!("`{name}` must be a non-negative integer"),
                )
            }),
        }
    };
    let mut event_types = Vec::new();
    if let Some(t) = query.get("type") {
        let parsed: EventType = serde_json::from_value(json!(t)).map_err(|_| {
            Refusal::new(
                Reason::RequestMalformed,
                format!("unknown event type `{t}`"),
            )
        })?;
        event_types.push(parsed);
    }
    Ok(EventFilter {
        run_id: query.get("run_id").cloned(),
        event_types,
        after_seq: number("after_seq", 0)?,
        limit: number("limit", 100)?.clamp(1, 1000) as usize,
        ..EventFilter::default()
    })
}

/// The one place that derives an HTTP status from a diagnostic.
pub fn http_status(reason: Reason) -> StatusCode {
    match reason {
        Reason::RequestMalformed
        | Reason::ArgumentsInvalid
        | Reason::ArgumentUnsafe
        | Reason::PolicyInvalid
        | Reason::ProtocolVersionUnsupported
        | Reason::BatchUnsupported => StatusCode::BAD_REQUEST,
        Reason::AcceptUnsupported => StatusCode::NOT_ACCEPTABLE,
        Reason::OriginNotAllowed => StatusCode::FORBIDDEN,
        Reason::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Reason::EndpointNotFound | Reason::ArtifactNotFound => StatusCode::NOT_FOUND,
        Reason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Reason::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Reason::CredentialMissing
        | Reason::CredentialInvalid
        | Reason::CredentialExpired
        | Reason::JwtMalformed
        | Reason::JwtExpired
        | Reason::JwtNotYetValid
        | Reason::JwtIssuerMismatch
        | Reason::JwtAudienceMismatch
        | Reason::JwtUnknownKid
        | Reason::JwtAlgorithmRefused
        | Reason::JwtSignatureInvalid
        | Reason::RoleUnknown => StatusCode::UNAUTHORIZED,
        Reason::JwksUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::IdempotencyConflict => StatusCode::CONFLICT,
        Reason::ConcurrencyLimitReached => StatusCode::TOO_MANY_REQUESTS,
        Reason::DependencyDown => StatusCode::BAD_GATEWAY,
        Reason::ToolTimeout => StatusCode::GATEWAY_TIMEOUT,
        Reason::AdapterNotImplemented => StatusCode::NOT_IMPLEMENTED,
        Reason::AuditUnavailable | Reason::PolicyUnavailable | Reason::AuditCapacityExhausted => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        Reason::CommitUnknown => StatusCode::NOT_FOUND,
        Reason::CommitNotAllowed => StatusCode::FORBIDDEN,
        Reason::CommitAlreadyUsed | Reason::CommitExpired => StatusCode::CONFLICT,
        Reason::CommitFailed | Reason::RollbackFailed => StatusCode::BAD_GATEWAY,
        Reason::CommitStateUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::BudgetExhausted => StatusCode::FORBIDDEN,
        Reason::CounterStateUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::ClusterUnavailable | Reason::SafetyLockUnconfirmed => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        Reason::IdempotencyInFlight => StatusCode::CONFLICT,
        Reason::ToolError
        | Reason::Cancelled
        | Reason::OutputSchemaViolation
        | Reason::ArtifactStoreFailed
        | Reason::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
        Reason::SafetyLockEngaged
        | Reason::RoleDisabled
        | Reason::RunTokenRequired
        | Reason::CredentialNotForRun
        | Reason::RunNotFound
        | Reason::PolicyVersionMismatch
        | Reason::LaneUnknown
        | Reason::LaneNotAllowedForRole
        | Reason::RunNotActive
        | Reason::ToolUnregistered
        | Reason::ToolDisabled
        | Reason::ToolNotAllowedInLane
        | Reason::ScopeKeyMissing
        | Reason::ScopeConflictsWithRun
        | Reason::ProhibitedFlag
        | Reason::ConditionFailed => StatusCode::FORBIDDEN,
        // Not executed, waiting on a human: 409 so that a client reading only the HTTP
        // status never takes it for a success (docs/api.md, "Approvals").
        Reason::ApprovalRequired | Reason::ApprovalPending | Reason::ApprovalAlreadyDecided => {
            StatusCode::CONFLICT
        }
        Reason::ApprovalUnknown => StatusCode::NOT_FOUND,
        Reason::ApprovalLimitReached => StatusCode::TOO_MANY_REQUESTS,
        Reason::ApprovalStoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::ApprovalAttestationInvalid => StatusCode::FORBIDDEN,
        Reason::ApprovalStoreMismatch => StatusCode::FORBIDDEN,
        Reason::ApprovalEvidenceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::ApprovalDenied
        | Reason::ApprovalExpired
        | Reason::ApprovalUsed
        | Reason::ApprovalArgumentsMismatch
        | Reason::ApprovalRunMismatch
        | Reason::ApprovalRoleMismatch
        | Reason::ApprovalCallMismatch
        | Reason::ApprovalPolicyChanged
        | Reason::ApproverNotAllowed
        | Reason::SelfApprovalRefused => StatusCode::FORBIDDEN,
    }
}

fn call_response(response: &CallResponse) -> HttpResponse {
    let status = match &response.diagnostic {
        None => StatusCode::OK,
        Some(d) => http_status(d.reason),
    };
    // Serialized straight to bytes (no intermediate JSON value): the hot path. A gated
    // call's answer is a few KB: room for it up front saves the buffer's regrowths.
    let mut bytes = Vec::with_capacity(4096);
    if serde_json::to_writer(&mut bytes, response).is_err() {
        bytes = b"{}".to_vec();
    }
    let mut http = with_json_type(Response::new(Full::new(Bytes::from(bytes))));
    *http.status_mut() = status;
    add_retry_after(&mut http, response.diagnostic.as_ref().map(|d| &d.details));
    http
}

fn respond<T: serde::Serialize>(result: Result<T, Refusal>, ok: StatusCode) -> HttpResponse {
    match result {
        Ok(value) => json_response(ok, &json!(value)),
        Err(refusal) => refusal_response(&refusal),
    }
}

/// The body of a refused request that is not a tool call.
fn refusal_response(refusal: &Refusal) -> HttpResponse {
    let diagnostic = refusal.diagnostic();
    let body = json!({
        "status": Status::of(refusal.reason),
        "error_code": diagnostic.error_code,
        "error_message": refusal.message,
        "diagnostic": diagnostic,
    });
    let mut http = json_response(http_status(refusal.reason), &body);
    add_retry_after(&mut http, Some(&refusal.details));
    http
}

fn add_retry_after(http: &mut HttpResponse, details: Option<&Value>) {
    if let Some(ms) = details.and_then(|d| d["retry_after_ms"].as_u64()) {
        let secs = ms.div_ceil(1000).max(1);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            http.headers_mut().insert(RETRY_AFTER, v);
        }
    }
}

fn json_response(status: StatusCode, body: &Value) -> HttpResponse {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = with_json_type(Response::new(Full::new(Bytes::from(bytes))));
    *response.status_mut() = status;
    response
}

fn with_json_type(mut response: HttpResponse) -> HttpResponse {
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // API data is never cached (it carries approvals, audit events, runs).
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// `/console` and its assets (`console.rs`): GET or HEAD, with a strict
/// Content-Security-Policy; anything else is a structured refusal.
fn console(method: &Method, path: &str) -> HttpResponse {
    let Some(asset) = crate::console::asset(path) else {
        return refusal_response(&Refusal::new(
            Reason::EndpointNotFound,
            format!(
                "no endpoint `{method} {}`",
                path.chars().take(200).collect::<String>()
            ),
        ));
    };
    if method != Method::GET && method != Method::HEAD {
        let refusal = Refusal::new(
            Reason::MethodNotAllowed,
            format!("`{method} {path}` is not served; this endpoint serves GET, HEAD"),
        )
        .with_details(json!({ "allow": ["GET", "HEAD"] }));
        let mut response = refusal_response(&refusal);
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let body = if method == Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from_static(asset.body)
    };
    let mut response = Response::new(Full::new(body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(crate::console::CONTENT_SECURITY_POLICY),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    // Shipped in the binary: revalidate on every load, so an upgrade shows at once.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The diagnostic catalog with the HTTP status of each reason: what
/// contract/diagnostics.json publishes.
pub fn published_catalog() -> Value {
    let mut catalog = crate::diagnostic::catalog_json();
    if let Some(reasons) = catalog["reasons"].as_array_mut() {
        for (entry, reason) in reasons.iter_mut().zip(Reason::ALL) {
            entry["http_status"] = json!(http_status(reason).as_u16());
        }
    }
    catalog
}
