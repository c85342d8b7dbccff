//! The MCP adapter: a registry tool executed by a tool on an upstream MCP server,
//! started and supervised by the gateway (stdio) or reached over Streamable HTTP.
//!
//! The client side of the protocol is rmcp's. Each upstream server (a `servers:`
//! entry of the registry, or one inline `command`/`url`) has one [`Session`] per
//! loaded policy, shared by every registry tool on it: one connection, opened on the
//! first call (building a policy starts nothing) and shared by concurrent calls, at
//! most the server's `max_concurrency` requests in flight at once (more are refused
//! with `concurrency_limit_reached`, nothing sent). A connection that dies (the
//! process exited, the transport closed) is dropped and reopened by the next call,
//! after a backoff that doubles from [`BACKOFF_BASE`] to [`BACKOFF_CAP`] while the
//! upstream keeps failing; a call never waits for a backoff past its deadline (it gets
//! `dependency_down`).
//!
//! Progress and cancellation: every request carries a progress token of the session's
//! own (never the caller's, so callers sharing a server cannot hear each other); the
//! upstream's `notifications/progress` for it go to the call's [`CallSignals`]. A call
//! whose future is dropped before its answer (the caller cancelled, or the deadline
//! passed) sends `notifications/cancelled` for its request upstream.
//!
//! INVARIANT: a call returns by its deadline. A stdio server that does not answer in
//! time is killed with its whole process group (and restarted by a later call), so
//! no work runs on past the deadline; over HTTP the request is abandoned and MCP's
//! cancellation is sent. A stdio server runs without a shell, in its own process
//! group, with a cleared environment plus [`PASSED_ENV`], in the registry's directory.

use crate::backoff::Backoff;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig,
    ClientRequest, ContentBlock, Implementation, ServerResult,
};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::{PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::Instant;

use crate::adapter::command::Confinement;
use crate::adapter::{
    AdapterEnv, ExecContext, ExecError, SettingProblem, output_hard_cap, unsafe_argument,
};
use crate::call::CallSignals;
use crate::canonical::to_canonical_bytes;
use crate::diagnostic::Refusal;
use crate::policy::secrets::Secrets;
use crate::policy::{AdapterConfig, Policy, Problem};

mod bounded;
mod listing;
mod process;
mod reach;
mod upcalls;
pub use bounded::MAX_UPSTREAM_REQUESTS;
use bounded::{Bounded, Tripwire};
pub use listing::{Listing, RawListing, list_tools};
use listing::{Tap, Tapped, TappedHttp};
use process::{Pipes, Process, Start};
use reach::Reach;
pub use reach::Upstream;
use upcalls::{InFlight, ProgressRoutes, Route, Upcalls};

/// First wait before restarting an upstream that failed; doubles per failure.
pub const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Longest wait between restarts.
pub const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// Largest arguments (as JSON) sent upstream.
pub const MAX_ARGUMENT_BYTES: usize = 1024 * 1024;
/// Environment variables a stdio server inherits from toolgate (package runners such
/// as `npx` and `uvx` need them); every other variable is cleared.
pub const PASSED_ENV: [&str; 6] = ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];
/// How much of a stdio server's stderr is kept (its end) for error messages.
const STDERR_TAIL_BYTES: usize = 2048;
/// How long to wait for a dead server's last stderr lines.
const STDERR_GRACE: Duration = Duration::from_millis(200);
/// Longest upstream tool name accepted (MCP names are at most 128 characters).
const MAX_TOOL_NAME: usize = 128;
/// How long connecting to an HTTP upstream may take.
pub const HTTP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest read timeout of an HTTP upstream (its tools' longest deadline, if
/// longer): a read waiting longer fails, and an idle stream is reopened.
pub const HTTP_READ_TIMEOUT_FLOOR: Duration = Duration::from_secs(60);

/// What one upstream's connection accepts, from the registry entries of its tools.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    /// Largest response accepted from the upstream: the largest hard cap of its tools.
    hard_cap: usize,
    /// Longest wait for bytes from an HTTP upstream: its tools' longest deadline, at
    /// least [`HTTP_READ_TIMEOUT_FLOOR`].
    read_timeout: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            hard_cap: 0,
            read_timeout: HTTP_READ_TIMEOUT_FLOOR,
        }
    }
}

/// The MCP adapter of one registry tool: a tool on a shared [`Session`].
pub struct McpAdapter {
    session: Arc<Session>,
    /// The tool's name on the upstream server.
    tool: String,
}

impl fmt::Debug for McpAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpAdapter")
            .field("upstream", &self.session.upstream)
            .field("tool", &self.tool)
            .finish_non_exhaustive()
    }
}

/// The one supervised session of an upstream server, shared by all its tools.
pub struct Session {
    /// How the server is named in messages: its `server_id`, or its command or url.
    label: String,
    upstream: Upstream,
    /// How a stdio server's process is confined (None over HTTP).
    confinement: Option<Confinement>,
    bounds: Bounds,
    /// One permit per request in flight (the server's `max_concurrency`).
    slots: Arc<tokio::sync::Semaphore>,
    max_concurrency: u32,
    supervisor: tokio::sync::Mutex<Supervisor>,
    /// Where the upstream's progress notifications go, by the session's own token.
    routes: Arc<ProgressRoutes>,
    /// The entry's environment, headers, TLS settings and their scrubber.
    reach: Reach,
}

/// The sessions of one policy's MCP servers, while its adapters are built.
pub(crate) struct Servers {
    sessions: BTreeMap<String, Arc<Session>>,
    /// The policy's secrets, for the entries' `env`, `headers` and `auth`.
    secrets: Secrets,
    /// The largest hard cap and longest deadline of the tools of each server.
    bounds: BTreeMap<String, Bounds>,
}

/// Which session a tool's adapter settings name: its `servers:` entry, or its inline
/// command or url (tools giving the same one share it).
fn session_key(config: &AdapterConfig) -> Option<String> {
    match config {
        AdapterConfig::Mcp {
            server: Some(id), ..
        } => Some(format!("server:{id}")),
        AdapterConfig::Mcp {
            command: Some(argv),
            ..
        } => Some(format!("command:{}", json!(argv))),
        AdapterConfig::Mcp { url: Some(url), .. } => Some(format!("url:{url}")),
        _ => None,
    }
}

impl Servers {
    pub(crate) fn new(policy: &Policy) -> Servers {
        let mut bounds: BTreeMap<String, Bounds> = BTreeMap::new();
        for tool in policy.tools.values() {
            if let Some(key) = session_key(&tool.adapter) {
                let server = bounds.entry(key).or_default();
                server.hard_cap = server.hard_cap.max(output_hard_cap(tool));
                server.read_timeout = server
                    .read_timeout
                    .max(Duration::from_millis(tool.limits.timeout_ms_max));
            }
        }
        Servers {
            sessions: BTreeMap::new(),
            secrets: policy.secrets.clone(),
            bounds,
        }
    }

    /// The adapter of a tool on the server its settings name, sharing the server's
    /// session with the other tools on it.
    ///
    /// `confine` gives a stdio server's confinement from its program and working
    /// directory (its located problems go to `located`).
    pub(crate) fn adapter(
        &mut self,
        config: &AdapterConfig,
        upstream_tool: &str,
        env: &AdapterEnv,
        confine: impl FnOnce(&Path, &Path) -> Result<Option<Confinement>, Vec<Problem>>,
        located: &mut Vec<Problem>,
    ) -> Result<McpAdapter, Vec<SettingProblem>> {
        let mut problems = Vec::new();
        if upstream_tool.is_empty()
            || upstream_tool.len() > MAX_TOOL_NAME
            || upstream_tool.chars().any(char::is_control)
        {
            problems.push(SettingProblem::new(format!(
                "upstream tool name `{}` must be 1 to {MAX_TOOL_NAME} characters without control characters",
                upstream_tool.escape_debug()
            )));
        }
        let AdapterConfig::Mcp {
            server,
            command,
            url,
            max_concurrency,
            ..
        } = config
        else {
            return Err(vec![SettingProblem::new("not an `mcp` adapter")]);
        };
        let key = session_key(config).unwrap_or_default();
        let session = match self.sessions.get(&key) {
            Some(session) => Ok(session.clone()),
            None => Upstream::build(command.as_deref(), url.as_deref(), env).and_then(|upstream| {
                let reach = Reach::build(config, &self.secrets, env)?;
                let confinement = match &upstream {
                    Upstream::Stdio {
                        program,
                        working_dir,
                        ..
                    } => confine(program, working_dir).map_err(|found| {
                        located.extend(found);
                        Vec::new()
                    })?,
                    Upstream::Http { .. } => None,
                };
                let label = match server {
                    Some(id) => format!("`{id}`"),
                    None => upstream.describe(),
                };
                let bounds = self.bounds.get(&key).copied().unwrap_or(Bounds {
                    hard_cap: usize::MAX,
                    ..Bounds::default()
                });
                let session = Arc::new(Session::new(
                    label,
                    upstream,
                    confinement,
                    bounds,
                    *max_concurrency,
                    reach,
                ));
                self.sessions.insert(key, session.clone());
                Ok(session)
            }),
        };
        match session {
            Ok(session) if problems.is_empty() => Ok(McpAdapter {
                session,
                tool: upstream_tool.to_string(),
            }),
            Ok(_) => Err(problems),
            Err(found) => {
                problems.extend(found);
                Err(problems)
            }
        }
    }
}

/// The restart bookkeeping of one upstream.
struct Supervisor {
    current: Option<Arc<Connection>>,
    /// Failures (failed starts, deaths, timeouts) since the last successful call, and
    /// the wait they make the next start take.
    backoff: Backoff,
    /// No restart before this instant.
    retry_at: Option<Instant>,
}

impl Default for Supervisor {
    fn default() -> Supervisor {
        Supervisor {
            current: None,
            backoff: Backoff::new(BACKOFF_BASE, BACKOFF_CAP),
            retry_at: None,
        }
    }
}

impl Supervisor {
    fn note_failure(&mut self) {
        let wait = self.backoff.fail();
        self.retry_at = Some(Instant::now() + wait);
    }
}

/// One open connection to the upstream.
struct Connection {
    client: RunningService<RoleClient, Upcalls>,
    /// The server process, for stdio upstreams. Dropped after `client`: the process
    /// group is killed, then the process is reaped by the runtime.
    process: Option<Arc<Process>>,
    /// The bound on the upstream's own requests; tripped, the connection is closed.
    wire: Arc<Tripwire>,
    /// The access token it was opened with (`auth: oauth2_client_credentials`).
    token: Option<String>,
}

impl Connection {
    /// Whether the server process has exited (stdio), seen without waiting, or the
    /// connection was closed for passing [`MAX_UPSTREAM_REQUESTS`].
    fn exited(&self) -> bool {
        self.wire.is_tripped() || self.process.as_ref().is_some_and(|p| p.exited())
    }

    /// The end of the server's stderr (stdio), waiting briefly for its last lines.
    async fn stderr_tail(&self, deadline: Instant) -> String {
        match &self.process {
            Some(process) => process.stderr_tail(deadline).await,
            None => String::new(),
        }
    }
}

impl McpAdapter {
    /// How the tool's stdio server is confined (None for a server over HTTP).
    pub(crate) fn confinement(&self) -> Option<&Confinement> {
        self.session.confinement.as_ref()
    }

    /// Arguments travel as JSON-RPC, so only their size is bounded.
    pub fn validate(&self, arguments: &Value) -> Result<(), Refusal> {
        let size = to_canonical_bytes(arguments).len();
        if size > MAX_ARGUMENT_BYTES {
            return Err(unsafe_argument(
                "",
                &format!(
                    "the arguments are {size} bytes, more than the {MAX_ARGUMENT_BYTES} sent to an mcp server"
                ),
            ));
        }
        Ok(())
    }

    /// Calls the tool on the server's session within `ctx.deadline`, reporting its
    /// progress to `signals`. Dropping the future cancels the request upstream.
    pub async fn execute(
        &self,
        arguments: &Value,
        ctx: ExecContext<'_>,
        signals: &CallSignals,
    ) -> Result<Value, ExecError> {
        let result = self.call(arguments, ctx, signals).await;
        let scrubber = &self.session.reach.scrubber;
        if scrubber.is_empty() {
            return result;
        }
        // INVARIANT: nothing a server given secrets answered (its results, its
        // errors, its stderr) leaves the adapter unscrubbed.
        match result {
            Ok(value) => Ok(scrubber.value(value)),
            Err(e) => Err(scrubber.error(e)),
        }
    }

    async fn call(
        &self,
        arguments: &Value,
        ctx: ExecContext<'_>,
        signals: &CallSignals,
    ) -> Result<Value, ExecError> {
        let session = &self.session;
        let deadline = ctx.deadline;
        let Ok(_slot) = session.slots.clone().try_acquire_owned() else {
            return Err(ExecError::Busy(format!(
                "mcp server {} already has {} requests in flight, its max_concurrency",
                session.label, session.max_concurrency
            )));
        };
        // Nothing has been sent to the tool until the connection stands.
        let connection = session.connection(deadline).await.map_err(|e| match e {
            ExecError::DependencyDown(m) => ExecError::Unreachable(m),
            ExecError::SandboxUnavailable { guarantee, detail } => {
                if let Some(Confinement::Confined(plan)) = &session.confinement {
                    let refused = crate::sandbox::Record::Unavailable {
                        guarantee: guarantee.clone(),
                        detail: detail.clone(),
                    };
                    let evidence = crate::sandbox::run::conclude(plan, &[refused], None).1;
                    crate::sandbox::run::put(ctx.sandbox, evidence);
                }
                ExecError::SandboxUnavailable { guarantee, detail }
            }
            other => other,
        })?;
        if let Some(process) = &connection.process {
            crate::sandbox::run::put(ctx.sandbox, process.evidence.clone());
        }
        let mut params = CallToolRequestParams::new(self.tool.clone());
        if let Value::Object(map) = arguments {
            params = params.with_arguments(map.clone());
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let sent = connection
            .client
            .peer()
            .send_cancellable_request(request, PeerRequestOptions::no_options());
        let outcome = match tokio::time::timeout_at(deadline, sent).await {
            Err(_) => Err(None),
            Ok(Err(error)) => Ok(Err(error)),
            Ok(Ok(handle)) => {
                let _route = signals.progress.is_some().then(|| {
                    let token = handle.progress_token.clone();
                    if let Ok(mut routes) = session.routes.by_token.lock() {
                        routes.insert(token.clone(), signals.clone());
                    }
                    Route {
                        routes: &session.routes,
                        token,
                    }
                });
                let mut in_flight = InFlight {
                    handle: Some(handle),
                };
                let answered = async {
                    tokio::select! {
                        answer = in_flight.response() => answer,
                        () = connection.wire.tripped() => Err(ServiceError::TransportClosed),
                    }
                };
                match tokio::time::timeout_at(deadline, answered).await {
                    Ok(answer) => Ok(answer),
                    // Dropping `in_flight` sends the cancellation upstream.
                    Err(_) => Err(Some(in_flight)),
                }
            }
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(in_flight) => {
                drop(in_flight);
                if connection.process.is_some() {
                    // A stdio server that missed the deadline is stopped, not left
                    // running the call: killed now, restarted by a later call.
                    session.retire(&connection).await;
                }
                return Err(ExecError::Timeout);
            }
        };
        match outcome {
            Ok(ServerResult::CallToolResult(result)) => {
                session.supervisor.lock().await.backoff.reset();
                output_of(result)
            }
            Ok(_) => Err(ExecError::Failed(
                "the upstream answered the call with something other than a tool result".into(),
            )),
            Err(ServiceError::McpError(error)) => Err(ExecError::Failed(format!(
                "the upstream refused the call ({}): {}",
                error.code.0, error.message
            ))),
            Err(ServiceError::Timeout { .. }) => Err(ExecError::Timeout),
            Err(error) => {
                session.retire(&connection).await;
                if let Some(why) = connection.wire.why() {
                    return Err(ExecError::DependencyDown(why));
                }
                let tail = connection.stderr_tail(deadline).await;
                Err(ExecError::DependencyDown(with_stderr(
                    format!(
                        "the connection to mcp server {} failed during the call: {error}",
                        session.label
                    ),
                    &tail,
                )))
            }
        }
    }
}

impl Session {
    fn new(
        label: String,
        upstream: Upstream,
        confinement: Option<Confinement>,
        bounds: Bounds,
        max_concurrency: u32,
        reach: Reach,
    ) -> Session {
        Session {
            label,
            upstream,
            confinement,
            bounds,
            slots: Arc::new(tokio::sync::Semaphore::new(max_concurrency as usize)),
            max_concurrency,
            supervisor: tokio::sync::Mutex::new(Supervisor::default()),
            routes: Arc::default(),
            reach,
        }
    }

    /// The open connection, or a new one (after the backoff, within the deadline).
    async fn connection(&self, deadline: Instant) -> Result<Arc<Connection>, ExecError> {
        let Ok(mut supervisor) = tokio::time::timeout_at(deadline, self.supervisor.lock()).await
        else {
            return Err(ExecError::Timeout);
        };
        // The connection's access token, fresh: a connection opened with another (it
        // expired, or was refused) is replaced.
        let token = match &self.reach.token {
            Some(source) => Some(source.token(deadline, &self.reach.scrubber).await?),
            None => None,
        };
        if let Some(current) = &supervisor.current {
            if current.token != token {
                supervisor.current = None;
            } else if !current.client.peer().is_transport_closed() && !current.exited() {
                return Ok(current.clone());
            }
        }
        if let Some(current) = &supervisor.current {
            if let Some(why) = current.wire.why() {
                tracing::info!(server = %self.label, "opening a new connection: {why}");
            }
            // It died while idle: forget it (killing what is left of its group).
            supervisor.current = None;
            supervisor.note_failure();
        }
        if let Some(at) = supervisor.retry_at
            && at > Instant::now()
        {
            if at >= deadline {
                return Err(ExecError::DependencyDown(format!(
                    "mcp server {} failed {} times in a row and is down; the next restart is in {} ms, after this call's deadline",
                    self.label,
                    supervisor.backoff.failures(),
                    at.saturating_duration_since(Instant::now()).as_millis()
                )));
            }
            tokio::time::sleep_until(at).await;
        }
        let opened = open(
            &self.upstream,
            (&self.reach, self.confinement.as_ref(), token.clone()),
            &self.label,
            self.bounds,
            deadline,
            self.routes.clone(),
            None,
        );
        match tokio::time::timeout_at(deadline, opened).await {
            Ok(Ok(connection)) => {
                let connection = Arc::new(connection);
                supervisor.current = Some(connection.clone());
                Ok(connection)
            }
            Ok(Err(e)) => {
                supervisor.note_failure();
                // The handshake may have failed on the token (a 401): the next
                // attempt fetches a new one.
                self.forget_token(token.as_deref()).await;
                Err(e)
            }
            Err(_) => {
                supervisor.note_failure();
                Err(ExecError::Timeout)
            }
        }
    }

    /// Drops `token` from the server's token cache, if it has one.
    async fn forget_token(&self, token: Option<&str>) {
        if let (Some(source), Some(token)) = (&self.reach.token, token) {
            source.reject(token).await;
        }
    }

    /// Drops `connection` if it is still the current one, and counts a failure; its
    /// access token is dropped too (an upstream closes a connection whose token it
    /// refuses), so the next connection is opened with a new one.
    async fn retire(&self, connection: &Arc<Connection>) {
        self.forget_token(connection.token.as_deref()).await;
        let mut supervisor = self.supervisor.lock().await;
        if let Some(process) = &connection.process {
            process.kill();
        }
        if supervisor
            .current
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, connection))
        {
            supervisor.current = None;
            supervisor.note_failure();
        }
    }
}

/// Starts the server (stdio) or connects (HTTP) and runs the MCP handshake.
async fn open(
    upstream: &Upstream,
    (reach, confinement, token): (&Reach, Option<&Confinement>, Option<String>),
    label: &str,
    bounds: Bounds,
    deadline: Instant,
    routes: Arc<ProgressRoutes>,
    tap: Option<Tap>,
) -> Result<Connection, ExecError> {
    let upcalls = Upcalls { routes };
    let wire = Tripwire::new(label.to_string());
    match upstream {
        Upstream::Stdio {
            argv0,
            program,
            args,
            working_dir,
        } => {
            let start = Start {
                argv0,
                program,
                args,
                working_dir,
                confinement,
                env: &reach.env,
            };
            let (process, Pipes { stdin, stdout }) = Process::start(start, deadline).await?;
            let stopped = Arc::downgrade(&process);
            wire.on_trip(Box::new(move || {
                if let Some(process) = stopped.upgrade() {
                    process.kill();
                }
            }));
            let stdout = Tapped { inner: stdout, tap };
            let transport = Bounded::new(AsyncRwTransport::new_client(stdout, stdin), wire.clone());
            match upcalls.serve(transport).await {
                Ok(client) => Ok(Connection {
                    client,
                    process: Some(process),
                    wire,
                    token: None,
                }),
                Err(e) => {
                    let tail = process.stderr_tail(deadline).await;
                    Err(ExecError::DependencyDown(with_stderr(
                        format!("mcp server `{argv0}` did not complete the handshake: {e}"),
                        &tail,
                    )))
                }
            }
        }
        Upstream::Http { url } => {
            let builder =
                super::outbound_client(&reach.outbound, &reach.tools_dir).map_err(|e| {
                    ExecError::DependencyDown(format!("could not build an http client: {e}"))
                })?;
            let http = builder
                .pool_max_idle_per_host(0)
                .connect_timeout(HTTP_CONNECT_TIMEOUT)
                .read_timeout(bounds.read_timeout)
                .build()
                .map_err(|e| {
                    ExecError::DependencyDown(format!("could not build an http client: {e}"))
                })?;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            config.custom_headers = reach.headers.iter().cloned().collect();
            config.auth_header = token.clone();
            config.max_json_response_size = bounds.hard_cap;
            config.max_sse_event_size = bounds.hard_cap;
            let served = match tap {
                Some(tap) => {
                    let http = TappedHttp { inner: http, tap };
                    let inner = StreamableHttpClientTransport::with_client(http, config);
                    upcalls.serve(Bounded::new(inner, wire.clone())).await
                }
                None => {
                    let inner = StreamableHttpClientTransport::with_client(http, config);
                    upcalls.serve(Bounded::new(inner, wire.clone())).await
                }
            };
            let client = served.map_err(|e| {
                ExecError::DependencyDown(format!("could not connect to mcp server `{url}`: {e}"))
            })?;
            Ok(Connection {
                client,
                process: None,
                wire,
                token,
            })
        }
    }
}

/// How toolgate introduces itself to upstream servers.
fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("toolgate", env!("CARGO_PKG_VERSION")),
    )
}

fn with_stderr(message: String, tail: &str) -> String {
    if tail.is_empty() {
        message
    } else {
        format!("{message}; stderr: {tail}")
    }
}

/// The call's output: `structuredContent`, else the JSON in a single text block,
/// else `{"content": [...]}` (the content blocks as MCP sends them). An error result
/// is a tool failure carrying its text.
fn output_of(result: CallToolResult) -> Result<Value, ExecError> {
    if result.is_error == Some(true) {
        let mut text: Vec<&str> = result
            .content
            .iter()
            .filter_map(ContentBlock::as_text)
            .map(|t| t.text.as_str())
            .collect();
        let structured = result.structured_content.as_ref().map(Value::to_string);
        if text.is_empty()
            && let Some(s) = &structured
        {
            text.push(s);
        }
        return Err(ExecError::Failed(format!(
            "the upstream tool reported an error: {}",
            text.join("\n")
        )));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    if let [single] = result.content.as_slice()
        && let Some(text) = single.as_text()
        && let Ok(value) = serde_json::from_str::<Value>(&text.text)
    {
        return Ok(value);
    }
    Ok(json!({ "content": result.content }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn env() -> AdapterEnv {
        AdapterEnv {
            tools_dir: std::env::temp_dir(),
            data_dir: std::env::temp_dir(),
        }
    }

    #[test]
    fn settings_are_checked() {
        let e = env();
        assert!(Upstream::build(Some(&["sh".into()]), None, &e).is_ok());
        let empty: Vec<String> = Vec::new();
        let problems = Upstream::build(Some(&empty), None, &e).unwrap_err();
        assert!(problems[0].message.contains("`command` is empty"));
        let problems =
            Upstream::build(Some(&["no-such-program-xyz".into()]), None, &e).unwrap_err();
        assert!(problems[0].message.contains("not found on PATH"));
        assert!(Upstream::build(None, Some("http://127.0.0.1:9/mcp"), &e).is_ok());
        assert!(Upstream::build(None, Some("https://mcp.example.com/mcp"), &e).is_ok());
        for (url, needle) in [
            ("ftp://x/mcp", "not an absolute http"),
            ("http://user:pw@host/mcp", "user info"),
            ("http:///mcp", "not a valid url"),
        ] {
            let problems = Upstream::build(None, Some(url), &e).unwrap_err();
            assert!(problems[0].message.contains(needle), "{url}: {problems:?}");
        }
        assert!(Upstream::build(None, None, &e).is_err());
        assert!(Upstream::build(Some(&["sh".into()]), Some("http://h/mcp"), &e).is_err());
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let mut s = Supervisor::default();
        // (at least, at most) how long each failure makes the next start wait.
        let mut waits = Vec::new();
        for _ in 0..12 {
            let before = Instant::now();
            s.note_failure();
            let after = Instant::now();
            let at = s.retry_at.unwrap();
            waits.push((at.duration_since(before), at.duration_since(after)));
        }
        assert!(waits[0].0 >= BACKOFF_BASE && waits[0].1 <= BACKOFF_BASE);
        assert!(waits[1].0 >= BACKOFF_BASE * 2 && waits[1].1 <= BACKOFF_BASE * 2);
        assert!(waits.iter().all(|(_, at_most)| *at_most <= BACKOFF_CAP));
        assert!(waits[11].0 >= BACKOFF_CAP);
    }

    fn result(value: Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn outputs_are_read_in_order_of_preference() {
        let r = result(
            json!({"content": [{"type": "text", "text": "{\"a\":1}"}], "structuredContent": {"b": 2}}),
        );
        assert_eq!(output_of(r).unwrap(), json!({"b": 2}));
        let r = result(json!({"content": [{"type": "text", "text": "{\"a\":1}"}]}));
        assert_eq!(output_of(r).unwrap(), json!({"a": 1}));
        let r = result(json!({"content": [{"type": "text", "text": "plain words"}]}));
        assert_eq!(
            output_of(r).unwrap(),
            json!({"content": [{"type": "text", "text": "plain words"}]})
        );
        let r =
            result(json!({"content": [{"type": "text", "text": "no such zone"}], "isError": true}));
        match output_of(r).unwrap_err() {
            ExecError::Failed(m) => assert!(m.contains("no such zone"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
