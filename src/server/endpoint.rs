//! The route table: every endpoint the server answers, by method and path.
//!
//! A request is looked up once, in [`ROUTES`], into a [`Route`]: the endpoint it names
//! (with the path segments it captures), or the methods its path serves instead (a
//! 405's `Allow`), or nothing (404). Dispatch and `Allow` read the same rows, so they
//! cannot disagree.

use hyper::Method;
use serde_json::json;

use crate::diagnostic::{Reason, Refusal};

/// An endpoint of the server, with the path segments it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint<'a> {
    /// `POST /v1/tool-calls`
    CallTool,
    /// `POST /v1/tool-calls/{call_id}/commit`
    CommitCall { call_id: &'a str },
    /// `POST /v1/runs`
    CreateRun,
    /// `GET /v1/runs`
    ListRuns,
    /// `GET /v1/runs/{run_id}`
    GetRun { run_id: &'a str },
    /// `POST /v1/runs/{run_id}/status`
    SetRunStatus { run_id: &'a str },
    /// `POST /v1/runs/{run_id}/repin`
    RepinRun { run_id: &'a str },
    /// `POST /v1/runs/{run_id}/tokens/{token_id}/revoke`
    RevokeRunToken { run_id: &'a str, token_id: &'a str },
    /// `GET /v1/runs/{run_id}/events`
    RunEvents { run_id: &'a str },
    /// `GET /v1/runs/{run_id}/export`
    RunExport { run_id: &'a str },
    /// `GET /v1/tools`
    ListTools,
    /// `GET /v1/safety-lock`
    GetSafetyLock,
    /// `POST /v1/safety-lock`
    SetSafetyLock,
    /// `GET /v1/audit/events`
    AuditEvents,
    /// `GET /v1/artifacts/{sha256}`
    Artifact { sha256: &'a str },
    /// `GET /v1/approvals`
    ListApprovals,
    /// `GET /v1/approvals/{approval_id}`
    GetApproval { approval_id: &'a str },
    /// `POST /v1/approvals/{approval_id}/decision`
    DecideApproval { approval_id: &'a str },
    /// `POST /v1/policy/reload`
    ReloadPolicy,
    /// `GET /v1/policy`
    GetPolicy,
    /// `GET /metrics`
    Metrics,
    /// `GET /healthz`
    Health,
    /// `GET /readyz`
    Ready,
    /// `POST /mcp`: the MCP front.
    Mcp,
    /// `GET /.well-known/oauth-protected-resource[/mcp]` (RFC 9728).
    ResourceMetadata,
    /// `GET` or `HEAD` of the console's page or one of its assets (`console.rs`).
    Console,
}

/// How a path is matched.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// Segment by segment, ignoring leading and trailing slashes; `{name}` matches any
    /// one segment and is captured.
    Segments,
    /// The path exactly as sent.
    Exact,
}

/// The segments a row captures, in order (unused ones empty).
type Captures<'a> = [&'a str; 2];

/// One row of the route table.
struct Row {
    method: Method,
    path: &'static str,
    shape: Shape,
    endpoint: for<'a> fn(Captures<'a>) -> Endpoint<'a>,
}

const fn api(
    method: Method,
    path: &'static str,
    endpoint: for<'a> fn(Captures<'a>) -> Endpoint<'a>,
) -> Row {
    Row {
        method,
        path,
        shape: Shape::Segments,
        endpoint,
    }
}

const fn exact(
    method: Method,
    path: &'static str,
    endpoint: for<'a> fn(Captures<'a>) -> Endpoint<'a>,
) -> Row {
    Row {
        method,
        path,
        shape: Shape::Exact,
        endpoint,
    }
}

/// The route table. A path's methods are listed in `Allow` in the order of its rows.
static ROUTES: &[Row] = &[
    api(Method::POST, "/v1/tool-calls", |_| Endpoint::CallTool),
    api(
        Method::POST,
        "/v1/tool-calls/{call_id}/commit",
        |[call_id, _]| Endpoint::CommitCall { call_id },
    ),
    api(Method::GET, "/v1/runs", |_| Endpoint::ListRuns),
    api(Method::POST, "/v1/runs", |_| Endpoint::CreateRun),
    api(Method::GET, "/v1/runs/{run_id}", |[run_id, _]| {
        Endpoint::GetRun { run_id }
    }),
    api(Method::POST, "/v1/runs/{run_id}/status", |[run_id, _]| {
        Endpoint::SetRunStatus { run_id }
    }),
    api(Method::POST, "/v1/runs/{run_id}/repin", |[run_id, _]| {
        Endpoint::RepinRun { run_id }
    }),
    api(
        Method::POST,
        "/v1/runs/{run_id}/tokens/{token_id}/revoke",
        |[run_id, token_id]| Endpoint::RevokeRunToken { run_id, token_id },
    ),
    api(Method::GET, "/v1/runs/{run_id}/events", |[run_id, _]| {
        Endpoint::RunEvents { run_id }
    }),
    api(Method::GET, "/v1/runs/{run_id}/export", |[run_id, _]| {
        Endpoint::RunExport { run_id }
    }),
    api(Method::GET, "/v1/tools", |_| Endpoint::ListTools),
    api(Method::GET, "/v1/safety-lock", |_| Endpoint::GetSafetyLock),
    api(Method::POST, "/v1/safety-lock", |_| Endpoint::SetSafetyLock),
    api(Method::GET, "/v1/audit/events", |_| Endpoint::AuditEvents),
    api(Method::GET, "/v1/artifacts/{sha256}", |[sha256, _]| {
        Endpoint::Artifact { sha256 }
    }),
    api(Method::GET, "/v1/approvals", |_| Endpoint::ListApprovals),
    api(
        Method::GET,
        "/v1/approvals/{approval_id}",
        |[approval_id, _]| Endpoint::GetApproval { approval_id },
    ),
    api(
        Method::POST,
        "/v1/approvals/{approval_id}/decision",
        |[approval_id, _]| Endpoint::DecideApproval { approval_id },
    ),
    api(Method::POST, "/v1/policy/reload", |_| {
        Endpoint::ReloadPolicy
    }),
    api(Method::GET, "/v1/policy", |_| Endpoint::GetPolicy),
    api(Method::GET, "/metrics", |_| Endpoint::Metrics),
    api(Method::GET, "/healthz", |_| Endpoint::Health),
    api(Method::GET, "/readyz", |_| Endpoint::Ready),
    exact(Method::POST, crate::mcp::front::ENDPOINT, |_| Endpoint::Mcp),
    exact(Method::GET, super::mcp::RESOURCE_METADATA, |_| {
        Endpoint::ResourceMetadata
    }),
    exact(Method::GET, super::mcp::RESOURCE_METADATA_MCP, |_| {
        Endpoint::ResourceMetadata
    }),
    exact(Method::GET, "/console", |_| Endpoint::Console),
    exact(Method::HEAD, "/console", |_| Endpoint::Console),
    exact(Method::GET, "/console/", |_| Endpoint::Console),
    exact(Method::HEAD, "/console/", |_| Endpoint::Console),
    exact(Method::GET, "/console/assets/console.js", |_| {
        Endpoint::Console
    }),
    exact(Method::HEAD, "/console/assets/console.js", |_| {
        Endpoint::Console
    }),
    exact(Method::GET, "/console/assets/console.css", |_| {
        Endpoint::Console
    }),
    exact(Method::HEAD, "/console/assets/console.css", |_| {
        Endpoint::Console
    }),
];

/// What the route table says about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    Endpoint(Endpoint<'a>),
    Unrouted(Unrouted<'a>),
}

/// A request that names no endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrouted<'a> {
    /// The path is an endpoint's but not with this method: `allow` lists the methods it
    /// is served with, `at` is one of its endpoints.
    MethodNotAllowed {
        at: Endpoint<'a>,
        allow: Vec<&'static str>,
    },
    NotFound,
}

impl<'a> Route<'a> {
    /// Looks `method` and `path` up in the route table.
    pub fn parse(method: &Method, path: &'a str) -> Route<'a> {
        let mut wrong_method: Option<(Endpoint<'a>, Vec<&'static str>)> = None;
        for row in ROUTES {
            let Some(captures) = row.matches(path) else {
                continue;
            };
            let endpoint = (row.endpoint)(captures);
            if row.method == method {
                return Route::Endpoint(endpoint);
            }
            let (_, allow) = wrong_method.get_or_insert_with(|| (endpoint, Vec::new()));
            allow.push(row.method.as_str());
        }
        Route::Unrouted(match wrong_method {
            Some((at, allow)) => Unrouted::MethodNotAllowed { at, allow },
            None => Unrouted::NotFound,
        })
    }

    /// What a request to this route passes before its handler runs.
    pub fn access(&self, path: &str) -> Access {
        match self {
            Route::Endpoint(at) | Route::Unrouted(Unrouted::MethodNotAllowed { at, .. }) => {
                at.access()
            }
            // A console path that is no file is answered like the files: no credential.
            Route::Unrouted(Unrouted::NotFound) if path.starts_with("/console/") => Access::Console,
            Route::Unrouted(Unrouted::NotFound) => Access::Api,
        }
    }
}

impl Unrouted<'_> {
    /// Its refusal: 404 `endpoint_not_found`, or 405 `method_not_allowed` with the
    /// methods of its path (`details.allow`, which the response also sends as `Allow`).
    pub fn refusal(&self, method: &Method, path: &str) -> Refusal {
        let path = crate::text::prefix_chars(path, 200);
        match self {
            Unrouted::NotFound => not_found(method, &path),
            Unrouted::MethodNotAllowed { at, allow } => {
                let message = match at {
                    Endpoint::Mcp => format!(
                        "`{method} {path}` is not served: mcp requests are POSTed; this server opens no streams and keeps no sessions"
                    ),
                    _ => format!(
                        "`{method} {path}` is not served; this endpoint serves {}",
                        allow.join(", ")
                    ),
                };
                Refusal::new(Reason::MethodNotAllowed, message)
                    .with_details(json!({ "allow": allow }))
            }
        }
    }
}

/// The refusal of a request for a path that is no endpoint.
pub fn not_found(method: &Method, path: &str) -> Refusal {
    let path = crate::text::prefix_chars(path, 200);
    Refusal::new(
        Reason::EndpointNotFound,
        format!("no endpoint `{method} {path}`"),
    )
}

/// What a request must pass before its handler runs (`server::handle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `/healthz`, `/readyz`, `/metrics`: not rate-limited; a second `Authorization`
    /// header is not refused.
    Probe,
    /// `/v1/tool-calls`: the credential is the pipeline's to check (and audit).
    ToolCall,
    /// The rest of the API: rate-limited, one credential, a JWT verified first.
    Api,
    /// `/mcp`: the MCP front, which reads its credential itself.
    Mcp,
    /// The OAuth protected-resource metadata: no credential.
    ResourceMetadata,
    /// The console's page and assets: no credential (the page asks for one and sends it
    /// to the API like any client).
    Console,
}

impl Endpoint<'_> {
    pub fn access(&self) -> Access {
        match self {
            Endpoint::CallTool => Access::ToolCall,
            Endpoint::Metrics | Endpoint::Health | Endpoint::Ready => Access::Probe,
            Endpoint::Mcp => Access::Mcp,
            Endpoint::ResourceMetadata => Access::ResourceMetadata,
            Endpoint::Console => Access::Console,
            _ => Access::Api,
        }
    }
}

impl Row {
    /// The segments `path` captures when it is this row's path.
    fn matches<'a>(&self, path: &'a str) -> Option<Captures<'a>> {
        let mut captures: Captures<'a> = ["", ""];
        match self.shape {
            Shape::Exact => (path == self.path).then_some(captures),
            Shape::Segments => {
                let mut want = self.path.trim_matches('/').split('/');
                let mut got = path.trim_matches('/').split('/');
                let mut captured = 0;
                loop {
                    match (want.next(), got.next()) {
                        (None, None) => return Some(captures),
                        (Some(w), Some(g)) if w.starts_with('{') => {
                            if let Some(slot) = captures.get_mut(captured) {
                                *slot = g;
                            }
                            captured += 1;
                        }
                        (Some(w), Some(g)) if w == g => {}
                        _ => return None,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_captures_at_most_two_segments_and_no_two_rows_collide() {
        for row in ROUTES {
            assert!(row.path.matches('{').count() <= 2, "{}", row.path);
            let twins = ROUTES
                .iter()
                .filter(|other| other.method == row.method && other.path == row.path)
                .count();
            assert_eq!(twins, 1, "{} {}", row.method, row.path);
        }
    }
}
