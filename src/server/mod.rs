//! The HTTP API: the accept loop, and [`handle`], which takes one request through the
//! front's checks to its endpoint's handler and returns the response.
//!
//! # Layout
//! - `mod.rs`: [`serve`] (accept, connection caps, drain) and [`handle`] (the request
//!   path, in order).
//! - `endpoint.rs`: the route table; a request's [`Endpoint`] or why it has none.
//! - `handlers.rs`: one handler per endpoint of the API.
//! - `query.rs`: the typed query of each endpoint.
//! - `body.rs`: reading a body within the size and time limits.
//! - `respond.rs`: a refusal to a response, and the HTTP status of a diagnostic.
//! - `mcp.rs`: the bridge to the MCP front and the OAuth resource metadata.
//! - `overflow.rs`: the health-only answers of a connection over the caps.
//!
//! INVARIANT: this is the only module that serves HTTP (hyper), apart from the MCP
//! front it hands `/mcp` to (`mcp::front`). A refusal is always the structured
//! diagnostic, never free text, and the HTTP status is derived from the diagnostic in
//! one place ([`http_status`]).

mod body;
mod endpoint;
mod handlers;
mod mcp;
mod overflow;
mod query;
mod respond;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Request;
use hyper::header::{AUTHORIZATION, CONNECTION, HeaderMap, HeaderValue, TRANSFER_ENCODING};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::json;
use tokio::net::TcpListener;

pub use body::RequestBody;
pub use endpoint::{Endpoint, Route, Unrouted};
pub use respond::{Body, HttpResponse, http_status, published_catalog};

use crate::diagnostic::{Reason, Refusal};
use crate::gateway::Gateway;
use crate::limits::{Admission, ClientLimits, Limit, LimitOptions};
use crate::observe::trace::TraceParent;
use crate::transport::JsonRefusals;
use crate::workers::Workers;
use endpoint::Access;
use handlers::Checked;

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

/// What every request is served with: the gateway, the front's options and its
/// per-client tables.
#[derive(Clone)]
pub struct Shared {
    pub gateway: Arc<Gateway>,
    options: Arc<ServerOptions>,
    limits: Arc<ClientLimits>,
}

impl Shared {
    pub fn new(gateway: Arc<Gateway>, options: ServerOptions) -> Shared {
        Shared {
            gateway,
            limits: ClientLimits::new(options.limits),
            options: Arc::new(options),
        }
    }
}

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
    let shared = Shared::new(gateway, options);
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
        let permit = match shared.limits.admit(peer.ip()) {
            Admission::Full(permit) => permit,
            Admission::Overflow(permit) => {
                tokio::spawn(overflow::serve(stream, permit, shared.gateway.clone()));
                continue;
            }
            Admission::Closed => {
                drop(stream);
                continue;
            }
        };
        let read_timeout = shared.options.read_timeout;
        let watcher = graceful.watcher();
        let connection = shared.clone();
        shared
            .options
            .workers
            .clone()
            .spawn_connection(stream, move |stream| {
                let service = service_fn(move |req| {
                    let shared = connection.clone();
                    let req = req.map(RequestBody::from);
                    async move { Ok::<_, Infallible>(handle(&shared, peer, req).await) }
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
    let drain = shared.gateway.drain_time();
    let finished = graceful.shutdown();
    tokio::pin!(finished);
    if tokio::time::timeout(drain, &mut finished).await.is_err() {
        // Calls still running are cancelled, not cut off: each closes as `cancelled`
        // with its closing event, and only then may the log close.
        tracing::warn!(
            drain_ms = drain.as_millis() as u64,
            "in-flight requests did not finish in time; cancelling them"
        );
        shared.gateway.cancel_in_flight();
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

/// Answers one request from `peer`. Never fails: every outcome is a response, and
/// every refusal the structured one.
///
/// In order: framing toolgate refuses; the client's request rate; the endpoints outside
/// the JSON API's credential checks (`/mcp`, which reads its own; the OAuth metadata;
/// the console); then, for the API, one credential, a JWT verified, the body read, and
/// the endpoint's handler.
/// An MCP answer that streams is sent as a stream; dropping it (the client went away)
/// cancels the MCP call it carries.
pub async fn handle(shared: &Shared, peer: SocketAddr, req: Request<RequestBody>) -> HttpResponse {
    if let Some(refusal) = transport_refusal(req.headers()) {
        let mut response = respond::refusal(&refusal);
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let route = Route::parse(&method, &path);
    let access = route.access(&path);
    // The probes are never rate-limited: an orchestrator must see a busy server alive.
    if access != Access::Probe
        && let Err(wait) = shared.limits.allow_request(peer.ip(), Instant::now())
    {
        return respond::refusal(&rate_limited(&shared.limits, wait));
    }
    match access {
        Access::Mcp => match route {
            Route::Unrouted(unrouted) => respond::refusal(&unrouted.refusal(&method, &path)),
            Route::Endpoint(_) => mcp::serve(shared.gateway.clone(), &shared.options, req).await,
        },
        Access::ResourceMetadata => {
            mcp::resource_metadata(&shared.gateway, &route, &method, &path, req.headers())
        }
        Access::Console => handlers::console(&route, &method, &path),
        Access::Probe | Access::ToolCall | Access::Api => api(shared, route, access, req).await,
    }
}

/// The API's part of [`handle`]: its credential and body checks, then the handler.
async fn api(
    shared: &Shared,
    route: Route<'_>,
    access: Access,
    req: Request<RequestBody>,
) -> HttpResponse {
    let gateway = &shared.gateway;
    // One credential per request: of two or more `Authorization` headers none is
    // picked, and the request is malformed (a tool call is still a call: refused and
    // audited). `/mcp` reads its headers itself, with the same rule.
    let twice = authorization_twice(req.headers());
    let token = match twice {
        Some(_) => None,
        None => bearer_token(req.headers()),
    };
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    if let Some(refusal) = &twice
        && access == Access::Api
    {
        return respond::refusal(refusal);
    }
    // A bearer JWT is verified once, before any endpoint reads it (the pipeline
    // verifies and audits its own).
    if access != Access::ToolCall
        && let Some(Err(refusal)) = gateway
            .authenticate(&gateway.current().policy, token.as_deref())
            .await
    {
        return respond::refusal(&refusal);
    }
    let (parts, body) = req.into_parts();
    let body = match body::read(&parts.headers, body, &shared.options).await {
        Ok(body) => body,
        Err(refusal) if route == Route::Endpoint(Endpoint::CallTool) => {
            return handlers::call_unread(gateway, token, parent, refusal).await;
        }
        Err(refusal) => return respond::refusal(&refusal),
    };
    // With the audit log down to the reserve kept for admin changes, calls and
    // commits are refused here, unrecorded (docs/operations.md, "Audit capacity"),
    // once their bodies are read (so the answer arrives).
    if let Route::Endpoint(Endpoint::CallTool | Endpoint::CommitCall { .. }) = route
        && let Some(refusal) = gateway.unrecorded_refusal()
    {
        return respond::refusal(&refusal);
    }
    let endpoint = match route {
        Route::Endpoint(endpoint) => endpoint,
        Route::Unrouted(unrouted) => {
            return respond::refusal(&unrouted.refusal(&parts.method, parts.uri.path()));
        }
    };
    let checked = Checked {
        gateway,
        limits: &shared.limits,
        token,
        twice,
        parent,
        query: parts.uri.query(),
        body,
    };
    handlers::dispatch(endpoint, checked).await
}

/// The refusal of a request over its client's request rate.
fn rate_limited(limits: &ClientLimits, wait: Duration) -> Refusal {
    let rate = limits.options().max_requests_per_second_per_client;
    Refusal::new(
        Reason::RateLimited,
        format!("more than {rate} requests per second from this client"),
    )
    .with_details(json!({
        "limit": Limit::RequestsPerSecond.as_str(),
        "max_requests_per_second": rate,
        "retry_after_ms": (wait.as_millis() as u64).max(1),
    }))
}

/// A request whose framing toolgate refuses before reading it: any
/// `Transfer-Encoding` (request bodies must carry `Content-Length`; with both headers,
/// the request-smuggling shape, hyper would silently drop one of them).
fn transport_refusal(headers: &HeaderMap) -> Option<Refusal> {
    if headers.contains_key(TRANSFER_ENCODING) {
        let message = "`Transfer-Encoding` is not accepted: send the request body with `Content-Length` (and never both)";
        return Some(
            Refusal::new(Reason::RequestMalformed, message)
                .with_details(json!({ "problems": [message] })),
        );
    }
    None
}

/// The refusal of a request with more than one `Authorization` header: which one a
/// proxy or a client meant is not for the server to guess.
fn authorization_twice(headers: &HeaderMap) -> Option<Refusal> {
    headers.get_all(AUTHORIZATION).iter().nth(1)?;
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
fn bearer_token(headers: &HeaderMap) -> Option<String> {
    crate::call::bearer_token(headers.get(AUTHORIZATION)?.as_bytes())
}
