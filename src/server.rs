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
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::audit::{EventFilter, EventType};
use crate::call::{CallResponse, Status, parse_request};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::Gateway;
use crate::observe::trace::TraceParent;

/// Limits of the HTTP front.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Request bodies larger than this get 413.
    pub max_body_bytes: usize,
    /// The most connections served at once; more wait in the accept queue.
    pub max_connections: usize,
    /// Time allowed to send the request headers and, separately, the body.
    pub read_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_body_bytes: 1024 * 1024,
            max_connections: 4096,
            read_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves the API on `listener` until `shutdown` resolves, then stops accepting and
/// waits (up to `drain`) for in-flight requests to finish.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    options: ServerOptions,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) {
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(options.max_connections));
    let options = Arc::new(options);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let gateway = gateway.clone();
        let read_timeout = options.read_timeout;
        let options = options.clone();
        let service = service_fn(move |req| route(gateway.clone(), options.clone(), peer, req));
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(read_timeout)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            drain_ms = drain.as_millis() as u64,
            "in-flight requests did not finish in time"
        );
    }
}

type HttpResponse = Response<Full<Bytes>>;

/// Routes one request. Never fails: every outcome is a JSON response.
async fn route(
    gateway: Arc<Gateway>,
    options: Arc<ServerOptions>,
    _peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<HttpResponse, Infallible> {
    let token = bearer_token(&req);
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = query_params(req.uri().query());
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if path == crate::mcp::front::ENDPOINT {
        return Ok(mcp(gateway, &options, req).await);
    }

    let body = match read_body(req, &options).await {
        Ok(body) => body,
        Err(refusal) => {
            if (method, segments.as_slice()) == (Method::POST, ["v1", "tool-calls"].as_slice()) {
                // A refused tool call is still a tool call: it gets its audit record.
                let request = Err(Box::new((refusal, Default::default())));
                let response = gateway
                    .handle_traced(token.as_deref(), request, parent.as_ref())
                    .await;
                return Ok(call_response(&response));
            }
            return Ok(refusal_response(&refusal));
        }
    };

    let response = match (&method, segments.as_slice()) {
        (&Method::POST, ["v1", "tool-calls"]) => {
            // Spawned so a client that disconnects cannot cancel a call halfway: every
            // call runs to its closing audit event.
            let gw = gateway.clone();
            let handle = tokio::spawn(async move {
                let request = parse_request(&body);
                gw.handle_traced(token.as_deref(), request, parent.as_ref())
                    .await
            });
            match handle.await {
                Ok(response) => call_response(&response),
                Err(_) => {
                    refusal_response(&Refusal::new(Reason::InternalError, "the call task failed"))
                }
            }
        }
        (&Method::POST, ["v1", "runs"]) => respond(
            gateway.create_run(token.as_deref(), &body).await,
            StatusCode::CREATED,
        ),
        (&Method::GET, ["v1", "runs"]) => respond(
            gateway.list_runs(
                token.as_deref(),
                query.get("status").map(String::as_str),
                query.get("limit").map(String::as_str),
                query.get("cursor").map(String::as_str),
            ),
            StatusCode::OK,
        ),
        (&Method::POST, ["v1", "runs", run_id, "repin"]) => respond(
            gateway.repin_run(token.as_deref(), run_id, &body).await,
            StatusCode::OK,
        ),
        (&Method::GET, ["v1", "runs", run_id]) => {
            respond(gateway.get_run(token.as_deref(), run_id), StatusCode::OK)
        }
        (&Method::POST, ["v1", "runs", run_id, "status"]) => respond(
            gateway
                .set_run_status(token.as_deref(), run_id, &body)
                .await,
            StatusCode::OK,
        ),
        (&Method::GET, ["v1", "tools"]) => {
            let role = query.get("role_id").map(String::as_str).unwrap_or_default();
            let lane = query.get("lane_id").map(String::as_str).unwrap_or_default();
            match gateway.tool_catalog(token.as_deref(), role, lane) {
                Ok(catalog) => json_response(StatusCode::OK, &catalog),
                Err(r) => refusal_response(&r),
            }
        }
        (&Method::POST, ["v1", "safety-lock"]) => respond(
            gateway.set_safety_lock(token.as_deref(), &body).await,
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
            let mut response = Response::new(Full::new(Bytes::from(gateway.render_metrics())));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(crate::observe::metrics::CONTENT_TYPE),
            );
            response
        }
        (&Method::GET, ["healthz"]) => json_response(StatusCode::OK, &json!({ "status": "ok" })),
        (&Method::GET, ["readyz"]) => {
            let loaded = gateway.current();
            json_response(
                StatusCode::OK,
                &json!({
                    "ready": true,
                    "policy_versions": loaded.policy.versions,
                    "safety_lock": gateway.safety_lock().engaged,
                }),
            )
        }
        _ => refusal_response(&Refusal::new(
            Reason::EndpointNotFound,
            format!(
                "no endpoint `{method} {}`",
                path.chars().take(200).collect::<String>()
            ),
        )),
    };
    Ok(response)
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
            Reason::EndpointNotFound,
            format!(
                "`{} /mcp` is not served: mcp requests are POSTed; this server opens no streams and keeps no sessions",
                req.method()
            ),
        );
        let mut response = refusal_response(&refusal);
        *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        response
            .headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    let (parts, body) = req.into_parts();
    let body = match read_body(Request::from_parts(parts.clone(), body), options).await {
        Ok(body) => body,
        Err(refusal) => return refusal_response(&refusal),
    };
    let response =
        crate::mcp::front::handle(gateway, Request::from_parts(parts, Full::new(body))).await;
    // INVARIANT: the front answers with JSON (`json_response`), so the body is complete
    // when the handler returns; collecting it does not wait on a stream.
    let (head, body) = response.into_parts();
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

/// Reads the whole body, refusing one over the size limit or slower than the timeout.
async fn read_body(req: Request<Incoming>, options: &ServerOptions) -> Result<Bytes, Refusal> {
    let limit = options.max_body_bytes;
    if let Some(len) = req.headers().get(hyper::header::CONTENT_LENGTH)
        && let Some(len) = len.to_str().ok().and_then(|s| s.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large(limit));
    }
    let collect = Limited::new(req.into_body(), limit).collect();
    match tokio::time::timeout(options.read_timeout, collect).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
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

fn too_large(limit: usize) -> Refusal {
    Refusal::new(
        Reason::RequestTooLarge,
        format!("the body is larger than {limit} bytes"),
    )
    .with_details(json!({ "max_body_bytes": limit }))
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer_token(req: &Request<Incoming>) -> Option<String> {
    let value = req.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
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
        | Reason::PolicyInvalid => StatusCode::BAD_REQUEST,
        Reason::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Reason::EndpointNotFound | Reason::ArtifactNotFound => StatusCode::NOT_FOUND,
        Reason::CredentialMissing | Reason::CredentialInvalid | Reason::RoleUnknown => {
            StatusCode::UNAUTHORIZED
        }
        Reason::IdempotencyConflict => StatusCode::CONFLICT,
        Reason::ConcurrencyLimitReached => StatusCode::TOO_MANY_REQUESTS,
        Reason::DependencyDown => StatusCode::BAD_GATEWAY,
        Reason::ToolTimeout => StatusCode::GATEWAY_TIMEOUT,
        Reason::AdapterNotImplemented => StatusCode::NOT_IMPLEMENTED,
        Reason::AuditUnavailable | Reason::PolicyUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::ToolError
        | Reason::OutputSchemaViolation
        | Reason::ArtifactStoreFailed
        | Reason::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
        Reason::SafetyLockEngaged
        | Reason::RoleDisabled
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
    }
}

fn call_response(response: &CallResponse) -> HttpResponse {
    let status = match &response.diagnostic {
        None => StatusCode::OK,
        Some(d) => http_status(d.reason),
    };
    // Serialized straight to bytes (no intermediate JSON value): the hot path.
    let bytes = serde_json::to_vec(response).unwrap_or_else(|_| b"{}".to_vec());
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
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
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
