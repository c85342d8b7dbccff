//! One handler per endpoint of the API: each authenticates the caller, reads its
//! query and body into their typed requests, and calls the gateway's typed method
//! with them.
//!
//! A handler runs once its request has passed the checks of `server::handle` (rate
//! limit, one credential, a JWT verified, the body read within its limits). The admin
//! API's order is the only one that compiles: the gateway's authentication step
//! (`gateway::principal`) gives a proof, the query and the body are read only with a
//! proof in hand (`Checked::query`, `Checked::body`), and the gateway method takes
//! the proof; so a caller that is not authenticated never learns that its request was
//! malformed. A query with a parameter its endpoint does not name is refused
//! (`query`). The endpoints that are not the admin API read theirs without a proof
//! (`Checked::open_query`): the probes and the metrics (no credential), a tool call
//! and a commit (authenticated and audited by the pipeline), the tool catalog (its
//! query names the role the credential is checked for) and an artifact read (audited,
//! allowed or refused).

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{
    CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HeaderValue,
    REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::endpoint::{Endpoint, Route};
use super::query::{self, NoQuery, Query};
use super::respond::{self, HttpResponse};
use crate::call::{CallBody, CallSignals};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::{Authenticated, Gateway};
use crate::limits::ClientLimits;
use crate::observe::trace::TraceParent;
use crate::requests;

/// A request past the checks of `server::handle`, on its way to its handler.
pub struct Checked<'a> {
    pub gateway: &'a Arc<Gateway>,
    pub limits: &'a ClientLimits,
    /// The bearer token, exactly as sent (None with two `Authorization` headers).
    pub token: Option<String>,
    /// The refusal of a request with two `Authorization` headers, which reaches a
    /// handler only as a tool call (refused and audited by the pipeline).
    pub twice: Option<Refusal>,
    pub parent: Option<TraceParent>,
    pub query: Option<&'a str>,
    pub body: Bytes,
}

impl Checked<'_> {
    fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The request's query as `Q`, read for an authenticated caller.
    fn query<Q: Query>(&self, _caller: &impl Authenticated) -> Result<Q, Refusal> {
        query::parse::<Q>(self.query)
    }

    /// The request's body as `T`, read for an authenticated caller; refused with the
    /// query's problems first when the endpoint has no query parameters and one came.
    fn body<T: requests::Body>(&self, caller: &impl Authenticated) -> Result<T, Refusal> {
        self.query::<NoQuery>(caller)
            .and_then(|_| requests::parse(&self.body))
    }

    /// The query of an endpoint that is not the admin API (see the module's doc).
    fn open_query<Q: Query>(&self) -> Result<Q, Refusal> {
        query::parse::<Q>(self.query)
    }

    /// The query of an endpoint outside the admin API that has no parameters.
    fn no_open_query(&self) -> Result<(), Refusal> {
        self.open_query::<NoQuery>().map(|_| ())
    }
}

/// Runs `endpoint`'s handler.
pub async fn dispatch(endpoint: Endpoint<'_>, cx: Checked<'_>) -> HttpResponse {
    match endpoint {
        Endpoint::CallTool => call_tool(cx).await,
        Endpoint::CommitCall { call_id } => commit_call(cx, call_id).await,
        Endpoint::CreateRun => create_run(cx).await,
        Endpoint::ListRuns => list_runs(cx).await,
        Endpoint::GetRun { run_id } => get_run(cx, run_id).await,
        Endpoint::SetRunStatus { run_id } => set_run_status(cx, run_id).await,
        Endpoint::RepinRun { run_id } => repin_run(cx, run_id).await,
        Endpoint::RevokeRunToken { run_id, token_id } => {
            revoke_run_token(cx, run_id, token_id).await
        }
        Endpoint::RunEvents { run_id } => run_events(cx, run_id).await,
        Endpoint::RunExport { run_id } => run_export(cx, run_id).await,
        Endpoint::ListTools => list_tools(cx).await,
        Endpoint::GetSafetyLock => get_safety_lock(cx),
        Endpoint::SetSafetyLock => set_safety_lock(cx).await,
        Endpoint::AuditEvents => audit_events(cx).await,
        Endpoint::Artifact { sha256 } => artifact(cx, sha256).await,
        Endpoint::ListApprovals => list_approvals(cx).await,
        Endpoint::GetApproval { approval_id } => get_approval(cx, approval_id).await,
        Endpoint::DecideApproval { approval_id } => decide_approval(cx, approval_id).await,
        Endpoint::ReloadPolicy => reload_policy(cx).await,
        Endpoint::GetPolicy => get_policy(cx),
        Endpoint::Metrics => metrics(cx),
        Endpoint::Health => probe(cx, |_| health()),
        Endpoint::Ready => probe(cx, ready),
        // Served before the API's checks, in `server::handle`; never dispatched here.
        Endpoint::Mcp | Endpoint::ResourceMetadata | Endpoint::Console => respond::refusal(
            &Refusal::new(Reason::EndpointNotFound, "no endpoint of the json api"),
        ),
    }
}

/// Runs `work` in a task of its own and waits for it: a client that goes away drops
/// the wait, not the work, so a call or a commit runs to its audit event.
async fn detached<T: Send + 'static>(
    what: &str,
    work: impl Future<Output = T> + Send + 'static,
) -> Result<T, Refusal> {
    tokio::spawn(work)
        .await
        .map_err(|_| Refusal::new(Reason::InternalError, format!("the {what} task failed")))
}

/// `POST /v1/tool-calls`. A body that does not parse (or a query, or two credentials)
/// is still a tool call: refused at step 1 and audited like every call. A dropped
/// connection drops this future, and the guard cancels the call (closed as
/// `cancelled`).
async fn call_tool(cx: Checked<'_>) -> HttpResponse {
    let gateway = cx.gateway.clone();
    let query = cx.no_open_query().err();
    let Checked {
        token,
        twice,
        parent,
        body,
        ..
    } = cx;
    let refusal = twice.or(query);
    let signals = CallSignals::default();
    let cancel_on_disconnect = signals.cancel.clone().drop_guard();
    let joined = detached("call", async move {
        // In a fleet, the run token's binding is read from the cluster database first
        // (a failure is refused by the pipeline itself).
        let _ = gateway.fleet_refresh(token.as_deref(), None).await;
        let request =
            CallBody::from_bytes(&body).and_then(|body| gateway.parse_call(token.as_deref(), body));
        let request = match refusal {
            Some(refusal) => crate::call::refused(request, refusal),
            None => request,
        };
        gateway
            .handle_signalled(token.as_deref(), request, parent.as_ref(), signals)
            .await
    })
    .await;
    cancel_on_disconnect.disarm();
    match joined {
        Ok(response) => respond::call(&response),
        Err(refusal) => respond::refusal(&refusal),
    }
}

/// `POST /v1/tool-calls` whose body could not be read: refused and audited, in a task
/// of its own like every call, so a client that goes away (a JWT's identity provider
/// can take seconds) cannot cut it short.
pub async fn call_unread(
    gateway: &Arc<Gateway>,
    token: Option<String>,
    parent: Option<TraceParent>,
    refusal: Refusal,
) -> HttpResponse {
    if let Some(unrecorded) = gateway.unrecorded_refusal() {
        return respond::refusal(&unrecorded);
    }
    let gateway = gateway.clone();
    let request = Err(Box::new((refusal, Default::default())));
    let joined = detached("call", async move {
        gateway
            .handle_traced(token.as_deref(), request, parent.as_ref())
            .await
    })
    .await;
    match joined {
        Ok(response) => respond::call(&response),
        Err(refusal) => respond::refusal(&refusal),
    }
}

/// `POST /v1/tool-calls/{call_id}/commit`, in a task of its own like a call: a
/// disconnect cannot cut a commit between its claim and its audit event.
async fn commit_call(cx: Checked<'_>, call_id: &str) -> HttpResponse {
    let gateway = cx.gateway.clone();
    // A commit names a call: its credential is checked and audited by the commit
    // itself, a malformed one included (`Gateway::refuse_malformed_commit`).
    let request = cx
        .no_open_query()
        .and_then(|()| requests::parse::<requests::Commit>(&cx.body));
    let token = cx.token;
    let call_id = call_id.to_string();
    let joined = detached("commit", async move {
        match request {
            Ok(request) => gateway.commit(token.as_deref(), &call_id, request).await,
            Err(malformed) => Err(gateway
                .refuse_malformed_commit(token.as_deref(), &call_id, malformed)
                .await),
        }
    })
    .await;
    match joined {
        Ok(result) => respond::result(result, StatusCode::OK),
        Err(refusal) => respond::refusal(&refusal),
    }
}

/// `POST /v1/runs`
async fn create_run(cx: Checked<'_>) -> HttpResponse {
    let created = async {
        let admin = cx.gateway.admin(cx.token())?;
        let request = cx.body(&admin)?;
        cx.gateway.create_run_issuing(&admin, request).await
    };
    respond::result(created.await, StatusCode::CREATED)
}

/// `GET /v1/runs`
async fn list_runs(cx: Checked<'_>) -> HttpResponse {
    let listed = async {
        let auditor = cx.gateway.auditor(cx.token())?;
        let request = cx.query::<query::ListRuns>(&auditor)?.request()?;
        cx.gateway.list_runs(&auditor, request).await
    };
    respond::result(listed.await, StatusCode::OK)
}

/// `GET /v1/runs/{run_id}`
async fn get_run(cx: Checked<'_>, run_id: &str) -> HttpResponse {
    let run = async {
        let reader = cx.gateway.reader(cx.token())?;
        cx.query::<NoQuery>(&reader)?;
        cx.gateway.get_run(&reader, run_id).await
    };
    respond::result(run.await, StatusCode::OK)
}

/// `POST /v1/runs/{run_id}/status`
async fn set_run_status(cx: Checked<'_>, run_id: &str) -> HttpResponse {
    let set = async {
        let admin = cx.gateway.admin(cx.token())?;
        let request = cx.body(&admin)?;
        cx.gateway.set_run_status(&admin, run_id, request).await
    };
    respond::result(set.await, StatusCode::OK)
}

/// `POST /v1/runs/{run_id}/repin`
async fn repin_run(cx: Checked<'_>, run_id: &str) -> HttpResponse {
    let repinned = async {
        let admin = cx.gateway.admin(cx.token())?;
        let request = cx.body(&admin)?;
        cx.gateway.repin_run(&admin, run_id, request).await
    };
    respond::result(repinned.await, StatusCode::OK)
}

/// `POST /v1/runs/{run_id}/tokens/{token_id}/revoke` (no body is read).
async fn revoke_run_token(cx: Checked<'_>, run_id: &str, token_id: &str) -> HttpResponse {
    let revoked = async {
        let admin = cx.gateway.admin(cx.token())?;
        cx.query::<NoQuery>(&admin)?;
        cx.gateway.revoke_run_token(&admin, run_id, token_id).await
    };
    respond::result(revoked.await, StatusCode::OK)
}

/// `GET /v1/runs/{run_id}/events`
async fn run_events(cx: Checked<'_>, run_id: &str) -> HttpResponse {
    let events = async {
        let auditor = cx.gateway.auditor(cx.token())?;
        let page = cx.query::<query::RunEvents>(&auditor)?.page()?;
        cx.gateway.run_events(&auditor, run_id, page).await
    };
    respond::result(events.await, StatusCode::OK)
}

/// `GET /v1/runs/{run_id}/export`: the bundle as a download.
async fn run_export(cx: Checked<'_>, run_id: &str) -> HttpResponse {
    let bundle = async {
        let auditor = cx.gateway.auditor(cx.token())?;
        cx.query::<NoQuery>(&auditor)?;
        cx.gateway.run_export(&auditor, run_id).await
    };
    match bundle.await {
        Ok(bundle) => {
            let mut response = respond::json(StatusCode::OK, &json!(bundle));
            let name = format!("toolgate-run-{run_id}-export.json");
            if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
                response.headers_mut().insert(CONTENT_DISPOSITION, v);
            }
            response
        }
        Err(r) => respond::refusal(&r),
    }
}

/// `GET /v1/tools`
async fn list_tools(cx: Checked<'_>) -> HttpResponse {
    let query = match cx.open_query::<query::ListTools>() {
        Ok(query) => query,
        Err(refusal) => return respond::refusal(&refusal),
    };
    let gateway = cx.gateway;
    let catalog = match gateway.fleet_refresh(cx.token(), None).await {
        Ok(_) => gateway
            .role_caller(cx.token(), &query.role_id, &query.lane_id)
            .and_then(|caller| gateway.tool_catalog(&caller)),
        Err(refusal) => Err(refusal),
    };
    respond::result(catalog, StatusCode::OK)
}

/// `GET /v1/safety-lock`
fn get_safety_lock(cx: Checked<'_>) -> HttpResponse {
    let lock = cx.gateway.reader(cx.token()).and_then(|reader| {
        cx.query::<NoQuery>(&reader)?;
        Ok(cx.gateway.safety_lock_for(&reader))
    });
    respond::result(lock, StatusCode::OK)
}

/// `POST /v1/safety-lock`
async fn set_safety_lock(cx: Checked<'_>) -> HttpResponse {
    let set = async {
        let admin = cx.gateway.admin(cx.token())?;
        let request = cx.body(&admin)?;
        cx.gateway.set_safety_lock(&admin, request).await
    };
    respond::result(set.await, StatusCode::OK)
}

/// `GET /v1/audit/events`
async fn audit_events(cx: Checked<'_>) -> HttpResponse {
    let events = async {
        let auditor = cx.gateway.auditor(cx.token())?;
        let filter = cx.query::<query::AuditEvents>(&auditor)?.filter()?;
        cx.gateway.audit_events(&auditor, filter).await
    };
    respond::result(events.await, StatusCode::OK)
}

/// `GET /v1/artifacts/{sha256}`: the artifact's bytes (stored JSON).
async fn artifact(cx: Checked<'_>, sha256: &str) -> HttpResponse {
    let query = match cx.open_query::<query::Artifact>() {
        Ok(query) => query,
        Err(refusal) => return respond::refusal(&refusal),
    };
    let artifact = cx.gateway.artifact(
        cx.token(),
        sha256,
        query.run_id.as_deref(),
        query.role_id.as_deref(),
    );
    match artifact.await {
        Ok(bytes) => respond::with_json_type(Response::new(respond::full(bytes))),
        Err(r) => respond::refusal(&r),
    }
}

/// `GET /v1/approvals`
async fn list_approvals(cx: Checked<'_>) -> HttpResponse {
    let listed = async {
        let principal = cx.gateway.principal(cx.token()).await?;
        let request = cx.query::<query::ListApprovals>(&principal)?.request()?;
        cx.gateway.list_approvals(&principal, request).await
    };
    respond::result(listed.await, StatusCode::OK)
}

/// `GET /v1/approvals/{approval_id}`
async fn get_approval(cx: Checked<'_>, approval_id: &str) -> HttpResponse {
    let approval = async {
        let principal = cx.gateway.principal(cx.token()).await?;
        cx.query::<NoQuery>(&principal)?;
        cx.gateway.get_approval(&principal, approval_id).await
    };
    respond::result(approval.await, StatusCode::OK)
}

/// `POST /v1/approvals/{approval_id}/decision`
async fn decide_approval(cx: Checked<'_>, approval_id: &str) -> HttpResponse {
    let decided = async {
        let approver = cx.gateway.approver(cx.token()).await?;
        let request = cx.body(&approver)?;
        cx.gateway
            .decide_approval(&approver, approval_id, request)
            .await
    };
    respond::result(decided.await, StatusCode::OK)
}

/// `POST /v1/policy/reload` (no body is read).
async fn reload_policy(cx: Checked<'_>) -> HttpResponse {
    let reloaded = async {
        let admin = cx.gateway.admin(cx.token())?;
        cx.query::<NoQuery>(&admin)?;
        cx.gateway.reload_as_admin(&admin).await
    };
    respond::result(reloaded.await, StatusCode::OK)
}

/// `GET /v1/policy`
fn get_policy(cx: Checked<'_>) -> HttpResponse {
    let policy = cx.gateway.reader(cx.token()).and_then(|reader| {
        cx.query::<NoQuery>(&reader)?;
        Ok(cx.gateway.policy_served(&reader))
    });
    respond::result(policy, StatusCode::OK)
}

/// `GET /metrics`, in the Prometheus text format. No credential: the listener is
/// loopback by default; see docs/operations.md.
fn metrics(cx: Checked<'_>) -> HttpResponse {
    if let Err(refusal) = cx.no_open_query() {
        return respond::refusal(&refusal);
    }
    let text = cx.gateway.render_metrics(Some(cx.limits.open()));
    let mut response = Response::new(respond::full(text));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(crate::observe::metrics::CONTENT_TYPE),
    );
    response
}

/// `GET /healthz` and `GET /readyz`: `answer` as JSON.
fn probe(cx: Checked<'_>, answer: impl FnOnce(&Gateway) -> Value) -> HttpResponse {
    let answer = cx.no_open_query().map(|()| answer(cx.gateway));
    respond::result(answer, StatusCode::OK)
}

/// The answer of `GET /healthz`: the process serves.
pub fn health() -> Value {
    json!({ "status": "ok" })
}

/// The answer of `GET /readyz`: the policy it serves, the safety lock and the sandbox.
pub fn ready(gateway: &Gateway) -> Value {
    let loaded = gateway.current();
    json!({
        "ready": true,
        "policy_versions": loaded.policy.versions,
        "safety_lock": gateway.safety_lock().engaged,
        "sandbox": crate::sandbox::host::probed(),
    })
}

/// `/console` and its assets (`console.rs`): GET or HEAD, with a strict
/// Content-Security-Policy; anything else is a structured refusal.
pub fn console(route: &Route<'_>, method: &Method, path: &str) -> HttpResponse {
    let asset = match route {
        Route::Unrouted(unrouted) => return respond::refusal(&unrouted.refusal(method, path)),
        Route::Endpoint(_) => crate::console::asset(path),
    };
    let Some(asset) = asset else {
        return respond::refusal(&super::endpoint::not_found(method, path));
    };
    let body = if method == Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from_static(asset.body)
    };
    let mut response = Response::new(respond::full(body));
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
