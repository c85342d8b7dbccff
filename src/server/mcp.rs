//! The bridge to the MCP front (`mcp::front`) at `/mcp`, and the OAuth
//! protected-resource metadata (RFC 9728) that tells an MCP client where to get a
//! token.

use std::sync::Arc;

use http_body_util::{BodyExt, Either, Full};
use hyper::header::{CONTENT_TYPE, HOST, HeaderMap};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::ServerOptions;
use super::body::RequestBody;
use super::endpoint::Route;
use super::respond::{self, HttpResponse};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::Gateway;

/// The OAuth protected-resource metadata path (RFC 9728), and its form for the MCP
/// endpoint (the well-known segment inserted before `/mcp`).
pub const RESOURCE_METADATA: &str = "/.well-known/oauth-protected-resource";
pub const RESOURCE_METADATA_MCP: &str = "/.well-known/oauth-protected-resource/mcp";

/// `POST /mcp`: the MCP front, with the API's body limits (stateless: no
/// server-initiated streams, no sessions to delete, so no other method). Bodies stay
/// JSON: the transport's plain-text errors (406, 415, ...) are wrapped in the
/// structured refusal, keeping their status.
pub async fn serve(
    gateway: Arc<Gateway>,
    options: &ServerOptions,
    req: Request<RequestBody>,
) -> HttpResponse {
    if let Some(unauthorized) = unauthorized(&gateway, req.headers()).await {
        return unauthorized;
    }
    let (parts, body) = req.into_parts();
    let body = match super::body::read(&parts.headers, body, options).await {
        Ok(body) => body,
        Err(refusal) => return respond::refusal(&refusal),
    };
    if let Some(refusal) = crate::mcp::transport::refusal(&parts.headers, &body) {
        return match crate::mcp::transport::jsonrpc_error(&refusal, &body) {
            Some(error) => respond::json(respond::http_status(refusal.reason), &error),
            None => respond::refusal(&refusal),
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
        return respond::json(StatusCode::BAD_REQUEST, &error);
    }
    let response =
        crate::mcp::front::handle(gateway, Request::from_parts(parts, Full::new(body))).await;
    // The front answers with JSON (`json_response`), complete when the handler returns,
    // except a call that reports progress: its answer is an SSE stream, bounded by the
    // call's deadline, sent as it comes (dropping it cancels the call).
    let (head, body) = response.into_parts();
    let content_type = head
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let stream = content_type.starts_with("text/event-stream");
    if stream && head.status.is_success() {
        return Response::from_parts(head, Either::Right(body));
    }
    let is_json = stream || content_type.starts_with("application/json");
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    if !is_json && !head.status.is_success() {
        let text = String::from_utf8_lossy(&bytes)
            .chars()
            .take(500)
            .collect::<String>();
        let mut response = respond::refusal(
            &Refusal::new(Reason::RequestMalformed, format!("mcp transport: {text}"))
                .with_details(json!({ "problems": [text] })),
        );
        *response.status_mut() = head.status;
        return response;
    }
    Response::from_parts(head, respond::full(bytes))
}

/// `GET /.well-known/oauth-protected-resource[/mcp]` (RFC 9728), served when the
/// policy has identity providers: the MCP resource URI and the providers' issuers as
/// its authorization servers. Without providers the path is no endpoint, whatever the
/// method.
pub fn resource_metadata(
    gateway: &Gateway,
    route: &Route<'_>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> HttpResponse {
    let loaded = gateway.current();
    let providers = &loaded.policy.identity.providers;
    if providers.is_empty() {
        return respond::refusal(&Refusal::new(
            Reason::EndpointNotFound,
            "no identity providers are configured, so no protected-resource metadata is published",
        ));
    }
    if let Route::Unrouted(unrouted) = route {
        return respond::refusal(&unrouted.refusal(method, path));
    }
    let mut issuers: Vec<&str> = providers.values().map(|p| p.issuer.as_str()).collect();
    issuers.sort();
    issuers.dedup();
    let resource = format!(
        "{}{}",
        public_base(gateway, headers),
        crate::mcp::front::ENDPOINT
    );
    respond::json(
        StatusCode::OK,
        &json!({
            "resource": resource,
            "authorization_servers": issuers,
            "bearer_methods_supported": ["header"],
            "resource_name": "toolgate",
        }),
    )
}

/// The base URL of this server: `serve --public-url`, else `http://` and the request's
/// `Host` (well-formed, or `localhost`).
fn public_base(gateway: &Gateway, headers: &HeaderMap) -> String {
    if let Some(url) = gateway.public_url() {
        return url.to_string();
    }
    let host = headers
        .get(HOST)
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

/// `/mcp` when the policy has identity providers (MCP authorization): a request
/// without a credential, or with a JWT that does not verify, is answered 401 with
/// `WWW-Authenticate: Bearer resource_metadata="..."` (the refusal as the body).
async fn unauthorized(gateway: &Gateway, headers: &HeaderMap) -> Option<HttpResponse> {
    let loaded = gateway.current();
    if loaded.policy.identity.providers.is_empty() {
        return None;
    }
    if super::authorization_twice(headers).is_some() {
        // Two credentials prove nothing: the front refuses the request as malformed
        // (a `tools/call` through the pipeline, audited).
        return None;
    }
    let token = super::bearer_token(headers);
    let refusal = match token.as_deref() {
        None => Refusal::new(
            Reason::CredentialMissing,
            "no bearer token in the Authorization header",
        ),
        Some(t) => gateway.authenticate(&loaded.policy, Some(t)).await?.err()?,
    };
    let metadata = format!("{}{RESOURCE_METADATA_MCP}", public_base(gateway, headers));
    let challenge = match refusal.reason {
        Reason::CredentialMissing => format!("Bearer resource_metadata=\"{metadata}\""),
        _ => format!("Bearer error=\"invalid_token\", resource_metadata=\"{metadata}\""),
    };
    Some(respond::refusal_with_challenge(&refusal, Some(&challenge)))
}
