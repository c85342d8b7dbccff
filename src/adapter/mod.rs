//! Adapters: how an authorized call is executed (builtin, command, http, mcp).
//!
//! Every registered tool gets one [`Adapter`], built once per policy load by [`build`].
//! The pipeline calls, in order: [`Adapter::validate`] (sanitize: paths, command
//! strings, URLs), [`Adapter::normalize`] (the canonical arguments that are hashed and
//! that flag rules see), [`Adapter::execute`] (bounded by the call's deadline), and on
//! error [`Adapter::classify_error`].
//!
//! INVARIANT: adapters never see a call the pipeline has not authorized, and never run
//! past the deadline they are given: at the deadline the work is terminated (process
//! group killed, request aborted), not abandoned.
//! This module knows nothing of HTTP serving, the audit log or the policy loader.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Map, Value, json};
use tokio::time::Instant;

use crate::call::CallSignals;
use crate::diagnostic::{Reason, Refusal};
use crate::policy::{AdapterConfig, Policy, Problem, Tool};

/// Where adapters find their files.
#[derive(Debug, Clone)]
pub struct AdapterEnv {
    /// The directory holding `tool_registry.yaml`; demo data lives in `data/` below it,
    /// and relative `working_dir`s of command tools resolve against it.
    pub tools_dir: PathBuf,
    /// The gateway's data directory (`var/` by default): drafts and other tool writes.
    pub data_dir: PathBuf,
}

/// What an adapter knows about the call it executes.
#[derive(Debug, Clone, Copy)]
pub struct ExecContext<'a> {
    pub call_id: &'a str,
    pub run_id: &'a str,
    pub scope: &'a Map<String, Value>,
    /// Work must be finished or terminated by then.
    pub deadline: Instant,
    /// Where a local process's sandbox evidence goes (`details.sandbox`), if the
    /// caller keeps it.
    pub sandbox: Option<&'a crate::sandbox::EvidenceSlot>,
    /// The caller's bearer JWT as it sent it, only when it verified at step 2 (the
    /// subject token of a `token_exchange`); None for a run token, a static token or
    /// no token.
    pub subject_token: Option<&'a str>,
    /// The call's `idempotency_key`: with an idempotent tool, an upstream request that
    /// failed on a refused access token may be sent again (contract: retry rule).
    pub idempotency_key: Option<&'a str>,
    /// Where a `token_exchange` records the delegation of the token it sent
    /// (`details.delegation`), if the caller keeps it.
    pub delegation: Option<&'a DelegationSlot>,
}

/// The `details.delegation` of a call whose upstream credential was exchanged for the
/// caller's JWT: `{sub, act}` of the issued token, never the token.
pub type DelegationSlot = std::sync::Mutex<Option<Value>>;

impl ExecContext<'_> {
    /// Records the delegation of the token sent upstream.
    pub(crate) fn delegated(&self, delegation: Value) {
        if let Some(slot) = self.delegation {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(delegation);
        }
    }
}

/// How an execution failed, before classification into a reason.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecError {
    /// The deadline passed; the work was terminated.
    Timeout,
    /// The caller cancelled the call; the work was terminated.
    Cancelled,
    /// The upstream server already has as many requests in flight as its
    /// `max_concurrency`; nothing was sent to it.
    Busy(String),
    /// The upstream could not be reached (connection refused, reset, DNS, 5xx).
    DependencyDown(String),
    /// The upstream could not be reached and nothing was sent to it (the connection or
    /// the upstream process could not be set up): a retry cannot repeat an effect.
    Unreachable(String),
    /// The tool ran and reported an error (non-zero exit, 4xx, an error result).
    Failed(String),
    /// The upstream answered 429 Too Many Requests; `retry_after_ms` from its
    /// `Retry-After`.
    RateLimited {
        message: String,
        retry_after_ms: Option<u64>,
    },
    /// The tool's output is not a JSON value.
    OutputNotJson(String),
    /// The adapter kind or builtin is not available.
    NotImplemented(String),
    /// An argument turned out unsafe only when the file system was consulted (a symlink
    /// resolving outside the folder the tool is confined to). `pointer` is a JSON
    /// pointer into the arguments.
    ArgumentUnsafe { pointer: String, problem: String },
    /// No mechanism of this host could hold a guarantee of the tool's sandbox
    /// profile; nothing was executed.
    SandboxUnavailable { guarantee: String, detail: String },
    /// The kernel ended the tool at a limit of its sandbox profile.
    ResourceLimit { limit: &'static str, detail: String },
    /// The upstream answered 401 to the access token it was sent (and no new token
    /// could be sent again): it refused the request before acting on it (RFC 9110
    /// 15.5.2), so, as when nothing was sent, no side effect can have happened.
    CredentialRefused(String),
    /// The tool's upstream credential is exchanged for the caller's verified JWT
    /// (`token_exchange`), and this call was not made with one; nothing was sent.
    CallerJwtRequired(String),
}

impl ExecError {
    /// Whether the request reached the tool: `Some(false)` when nothing was sent to it
    /// (the upstream was busy or unreachable, the sandbox could not be held), so no side
    /// effect can have happened; `None` when it may have. The pipeline decides on this
    /// (an admitted call that reached no tool is not counted, its idempotency key and
    /// approval are given back), and the refusal's `details.reached_tool` says it.
    pub fn reached_tool(&self) -> Option<bool> {
        match self {
            ExecError::Busy(_)
            | ExecError::Unreachable(_)
            | ExecError::SandboxUnavailable { .. }
            | ExecError::CallerJwtRequired(_)
            | ExecError::CredentialRefused(_) => Some(false),
            ExecError::Timeout
            | ExecError::Cancelled
            | ExecError::DependencyDown(_)
            | ExecError::Failed(_)
            | ExecError::RateLimited { .. }
            | ExecError::OutputNotJson(_)
            | ExecError::NotImplemented(_)
            | ExecError::ArgumentUnsafe { .. }
            | ExecError::ResourceLimit { .. } => None,
        }
    }
}

mod builtin;
mod command;
mod credentials;
mod http;
pub mod mcp;
mod phases;

pub use builtin::BUILTIN_NAMES;
pub(crate) use command::{ProcessGroup, resolve_program};
pub use phases::{MAX_TOKEN_BYTES, Phase, PhaseOutcome, PhaseRunner, take_token};

/// One tool's executor.
#[derive(Debug)]
pub enum Adapter {
    Builtin(builtin::BuiltinAdapter),
    Command(command::CommandAdapter),
    /// Boxed: its request model makes it the largest adapter by far.
    Http(Box<http::HttpAdapter>),
    Mcp(mcp::McpAdapter),
    /// An adapter kind this build cannot execute: the tool loads, and every call to
    /// it fails with `adapter_not_implemented`.
    NotImplemented {
        kind: &'static str,
    },
}

/// The adapters of one policy, by tool name.
#[derive(Debug, Default)]
pub struct Adapters {
    pub by_tool: BTreeMap<String, Adapter>,
    /// The commit and rollback calls of two-phase tools (`adapter.phases`).
    pub phases: BTreeMap<String, PhaseRunner>,
}

/// How long a caller refused because an upstream server is busy is told to wait.
const BUSY_RETRY_AFTER_MS: u64 = 100;

/// Largest tool error message kept in a refusal's details.
pub const MAX_TOOL_ERROR_BYTES: usize = 2048;

/// Largest output an adapter accepts from a tool, whatever its `max_output_bytes`:
/// larger outputs are turned into artifacts by the pipeline, up to this hard cap.
const HARD_CAP_FLOOR: u64 = 16 * 1024 * 1024;
/// No output of any tool is larger: the most bytes an artifact may hold.
pub const HARD_CAP_CEILING: u64 = 256 * 1024 * 1024;

/// A tool's output at most this large is parsed on the calling task; a larger one on the
/// blocking pool ([`parse_output`]).
const INLINE_PARSE_BYTES: usize = 64 * 1024;

/// Parses a tool's output as one JSON value. A large one (16 MiB takes about a second)
/// is parsed on the blocking pool: the call's deadline can still end the wait, and the
/// other calls on the same connection thread are not held up meanwhile.
pub(crate) async fn parse_output(bytes: Vec<u8>) -> Result<Value, serde_json::Error> {
    if bytes.len() <= INLINE_PARSE_BYTES {
        return serde_json::from_slice(&bytes);
    }
    tokio::task::spawn_blocking(move || serde_json::from_slice(&bytes))
        .await
        .unwrap_or_else(|e| {
            Err(serde::de::Error::custom(format!(
                "the parsing task failed: {e}"
            )))
        })
}

/// The most bytes an adapter reads from a tool's output:
/// `max(max_output_bytes * 16, 16 MiB)`, never more than 256 MiB.
pub fn output_hard_cap(tool: &Tool) -> usize {
    let cap = tool
        .limits
        .max_output_bytes
        .saturating_mul(16)
        .clamp(HARD_CAP_FLOOR, HARD_CAP_CEILING);
    usize::try_from(cap).unwrap_or(usize::MAX)
}

/// A problem found in one tool's adapter settings, before it is located in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SettingProblem {
    pub message: String,
    pub help: Option<String>,
}

impl SettingProblem {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        SettingProblem {
            message: message.into(),
            help: None,
        }
    }

    pub(crate) fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

/// Builds an adapter for every registered tool, checking each adapter's settings
/// (unknown builtin, empty argv, bad URL, host not in its own allowlist, ...).
/// Problems point at the tool in `tool_registry.yaml`; every problem is reported.
pub fn build(policy: &Policy, env: &AdapterEnv) -> Result<Adapters, Vec<Problem>> {
    let mut adapters = Adapters::default();
    let mut problems = Vec::new();
    let mut servers = mcp::Servers::new(policy);
    let forbidden = crate::sandbox::plan::Forbidden::of(policy, &env.tools_dir, &env.data_dir);
    let registry = policy.source.tools_file.clone();
    for (name, tool) in &policy.tools {
        let owner = format!("tool `{name}`");
        let built = match &tool.adapter {
            AdapterConfig::Builtin { name, settings } => {
                builtin::BuiltinAdapter::build(name, settings, env).map(Adapter::Builtin)
            }
            AdapterConfig::Command {
                argv,
                working_dir,
                env_allowlist,
                sandbox,
            } => command::CommandAdapter::build(argv, working_dir.as_deref(), env_allowlist, env)
                .and_then(|adapter| {
                    match confinement(
                        &owner,
                        sandbox,
                        adapter.program(),
                        adapter.working_dir(),
                        &forbidden,
                        &registry,
                    ) {
                        Ok(c) => Ok(Adapter::Command(adapter.confine(c))),
                        Err(found) => {
                            problems.extend(found);
                            Err(Vec::new())
                        }
                    }
                }),
            AdapterConfig::Http {
                url,
                allowed_hosts,
                request,
            } => http::HttpAdapter::build(
                url,
                allowed_hosts,
                request,
                &policy.secrets,
                &env.tools_dir,
            )
            .map(|h| Adapter::Http(Box::new(h))),
            AdapterConfig::Mcp {
                tool: upstream_tool,
                sandbox,
                ..
            } => {
                let confine = |program: &std::path::Path, working_dir: &std::path::Path| {
                    sandbox
                        .as_ref()
                        .map(|sandbox| {
                            confinement(
                                &owner,
                                sandbox,
                                program,
                                working_dir,
                                &forbidden,
                                &registry,
                            )
                        })
                        .transpose()
                };
                servers
                    .adapter(&tool.adapter, upstream_tool, env, confine, &mut problems)
                    .map(Adapter::Mcp)
            }
        };
        match built {
            Ok(adapter) => {
                adapters.by_tool.insert(name.clone(), adapter);
            }
            Err(found) => problems.extend(found.into_iter().map(|p| Problem {
                file: policy.source.tools_file.clone(),
                line: None,
                column: None,
                message: format!("tool `{name}`: {}", p.message),
                help: p.help,
            })),
        }
    }
    let (runners, found) = phases::build_all(
        &policy.tools,
        env,
        &policy.secrets,
        &forbidden,
        &registry,
        &mut problems,
    );
    adapters.phases = runners;
    problems.extend(found.into_iter().map(|(name, p)| Problem {
        file: policy.source.tools_file.clone(),
        line: None,
        column: None,
        message: format!("tool `{name}`: {}", p.message),
        help: p.help,
    }));
    if problems.is_empty() {
        Ok(adapters)
    } else {
        Err(problems)
    }
}

/// The client builder of an upstream with `settings`: its CA bundle, its mTLS client
/// certificate (the key file held to the rules of a secret file) and its proxy; paths
/// resolve against the registry's directory.
pub(crate) fn outbound_client(
    settings: &crate::policy::OutboundSettings,
    tools_dir: &std::path::Path,
) -> Result<reqwest::ClientBuilder, String> {
    let ca = settings
        .ca
        .as_ref()
        .map(|path| crate::outbound::CaBundle::load(&tools_dir.join(path)))
        .transpose()
        .map_err(|e| e.to_string())?;
    let identity = match &settings.auth {
        Some(crate::policy::OutboundAuth::Mtls { cert, key }) => {
            let cert_bytes = crate::localfile::read(&tools_dir.join(cert), 1024 * 1024)
                .map_err(|e| format!("mtls `cert` `{cert}`: {e}"))?;
            let key_bytes = crate::policy::secrets::read_private_file(&tools_dir.join(key))
                .map_err(|e| format!("mtls `key` `{key}`: {e}"))?;
            Some(crate::outbound::ClientIdentity::from_pem(
                &cert_bytes,
                &key_bytes,
            )?)
        }
        _ => None,
    };
    crate::outbound::builder_for(ca.as_ref(), identity.as_ref(), settings.proxy.as_deref())
        .map_err(|e| e.to_string())
}

/// The confinement of `owner`'s process: a plan for a confined profile (its located
/// problems when a path reaches what no profile may), or the reason it is unconfined.
pub(crate) fn confinement(
    owner: &str,
    sandbox: &crate::policy::Sandbox,
    program: &std::path::Path,
    working_dir: &std::path::Path,
    forbidden: &crate::sandbox::plan::Forbidden,
    registry: &str,
) -> Result<command::Confinement, Vec<Problem>> {
    match sandbox {
        crate::policy::Sandbox::Unconfined { reason } => {
            Ok(command::Confinement::Unconfined(reason.clone()))
        }
        crate::policy::Sandbox::Confined(profile) => {
            crate::sandbox::Plan::build(owner, profile, program, working_dir, forbidden, registry)
                .map(|plan| command::Confinement::Confined(std::sync::Arc::new(plan)))
        }
    }
}

impl Adapter {
    /// The effective sandbox profile of the tool's process (`policy explain`): the
    /// paths, network and limits it runs with and the profile's sha256, or the reason
    /// it runs unconfined; None for a tool that starts no local process.
    pub fn sandbox_profile(&self) -> Option<Value> {
        let confinement = match self {
            Adapter::Command(c) => c.confinement(),
            Adapter::Mcp(m) => m.confinement()?,
            _ => return None,
        };
        Some(match confinement {
            command::Confinement::Confined(plan) => {
                json!({ "profile_sha256": plan.sha256, "profile": plan.effective() })
            }
            command::Confinement::Unconfined(reason) => json!({ "unconfined": reason }),
        })
    }

    /// Sanitizes the arguments: refuses path traversal, NUL bytes and oversized
    /// arguments for programs, and URLs to hosts outside the allowlist.
    /// Runs after the input schema has been checked. A refusal has reason
    /// `argument_unsafe` and details `{"location", "pointer", "problem"}`.
    pub fn validate(
        &self,
        tool: &Tool,
        arguments: &Value,
        scope: &Map<String, Value>,
    ) -> Result<(), Refusal> {
        let _ = tool;
        match self {
            Adapter::Builtin(b) => b.validate(arguments, scope),
            Adapter::Command(c) => c.validate(arguments),
            Adapter::Http(h) => h.validate(arguments, scope),
            Adapter::Mcp(m) => m.validate(arguments),
            Adapter::NotImplemented { .. } => Ok(()),
        }
    }

    /// The canonical form of the arguments: what is hashed into the audit log and
    /// what flag rules are evaluated on (e.g. `./a/../notes.md` becomes `notes.md`).
    /// Only called on arguments that passed [`Adapter::validate`].
    pub fn normalize(&self, tool: &Tool, arguments: &Value) -> Value {
        let _ = tool;
        match self {
            Adapter::Builtin(b) => b.normalize(arguments),
            Adapter::Command(_)
            | Adapter::Http(_)
            | Adapter::Mcp(_)
            | Adapter::NotImplemented { .. } => arguments.clone(),
        }
    }

    /// Executes the call; returns by `ctx.deadline` (then with `ExecError::Timeout`,
    /// the work terminated).
    pub async fn execute(
        &self,
        tool: &Tool,
        arguments: &Value,
        ctx: ExecContext<'_>,
    ) -> Result<Value, ExecError> {
        self.execute_signalled(tool, arguments, ctx, &CallSignals::default())
            .await
    }

    /// [`Adapter::execute`], reporting the tool's progress to `signals` (MCP
    /// upstreams). Cancellation is the caller's: it drops this future, which
    /// terminates the work (a process group is killed on drop, an MCP request is
    /// cancelled upstream on drop).
    pub async fn execute_signalled(
        &self,
        tool: &Tool,
        arguments: &Value,
        ctx: ExecContext<'_>,
        signals: &CallSignals,
    ) -> Result<Value, ExecError> {
        // Each adapter's work is boxed: the largest of them (HTTP, MCP) would otherwise
        // size the call's whole state machine, and every move of it (into the deadline,
        // the trace span, the task) copied those kilobytes on every call (issue 19).
        match self {
            Adapter::Builtin(b) => Box::pin(b.execute(tool, arguments, ctx)).await,
            Adapter::Command(c) => Box::pin(c.execute(tool, arguments, ctx)).await,
            Adapter::Http(h) => Box::pin(h.execute(tool, arguments, ctx)).await,
            Adapter::Mcp(m) => Box::pin(m.execute(arguments, ctx, signals)).await,
            Adapter::NotImplemented { kind } => Err(ExecError::NotImplemented(format!(
                "the {kind} adapter is not available in this build"
            ))),
        }
    }

    /// Maps an execution error to the contract's reason (and so error code) and
    /// whether a retry may help. Messages are bounded to [`MAX_TOOL_ERROR_BYTES`].
    pub fn classify_error(tool: &Tool, error: &ExecError) -> Refusal {
        let name = &tool.tool_name;
        match error {
            ExecError::Timeout => Refusal::new(
                Reason::ToolTimeout,
                format!("tool `{name}` did not finish before its deadline and was terminated"),
            )
            .with_retryable(tool.idempotent),
            ExecError::Cancelled => Refusal::new(
                Reason::Cancelled,
                format!("the caller cancelled the call of `{name}`; its execution was stopped"),
            ),
            ExecError::Busy(m) => Refusal::new(
                Reason::ConcurrencyLimitReached,
                format!("the upstream of tool `{name}` is busy; nothing was sent to it"),
            )
            .with_details(json!({
                "dependency_error": bounded(m),
                "reached_tool": error.reached_tool(),
                "retry_after_ms": BUSY_RETRY_AFTER_MS,
            }))
            .with_retryable(true),
            ExecError::DependencyDown(m) => Refusal::new(
                Reason::DependencyDown,
                format!("the upstream of tool `{name}` could not be reached"),
            )
            .with_details(json!({ "dependency_error": bounded(m), "reached_tool": error.reached_tool() }))
            .with_retryable(true),
            ExecError::Unreachable(m) => Refusal::new(
                Reason::DependencyDown,
                format!(
                    "the upstream of tool `{name}` could not be reached; nothing was sent to it"
                ),
            )
            .with_details(json!({ "dependency_error": bounded(m), "reached_tool": error.reached_tool() }))
            .with_retryable(true),
            ExecError::Failed(m) => Refusal::new(
                Reason::ToolError,
                format!("tool `{name}` reported an error"),
            )
            .with_details(json!({ "tool_error": bounded(m) })),
            ExecError::RateLimited {
                message,
                retry_after_ms,
            } => Refusal::new(
                Reason::ToolError,
                format!("the upstream of tool `{name}` is rate limiting; retry later"),
            )
            .with_details(json!({
                "tool_error": bounded(message),
                "retry_after_ms": retry_after_ms,
            }))
            .with_retryable(true),
            ExecError::OutputNotJson(m) => Refusal::new(
                Reason::OutputSchemaViolation,
                format!("the output of tool `{name}` is not a json value"),
            )
            .with_details(json!({
                "violations": [{ "pointer": "", "message": bounded(m) }]
            })),
            ExecError::NotImplemented(m) => Refusal::new(
                Reason::AdapterNotImplemented,
                format!("tool `{name}` cannot be executed: {}", bounded(m)),
            ),
            ExecError::ArgumentUnsafe { pointer, problem } => {
                unsafe_argument(pointer, &bounded(problem))
            }
            ExecError::SandboxUnavailable { guarantee, detail } => Refusal::new(
                Reason::SandboxUnavailable,
                format!(
                    "tool `{name}` was not started: its sandbox's `{guarantee}` guarantee cannot be held on this host"
                ),
            )
            .with_details(json!({
                "guarantee": guarantee,
                "sandbox_error": bounded(detail),
                "reached_tool": error.reached_tool(),
            })),
            ExecError::ResourceLimit { limit, detail } => Refusal::new(
                Reason::ToolResourceLimit,
                format!("tool `{name}` was stopped by the kernel at its `{limit}` limit"),
            )
            .with_details(json!({ "limit": limit, "tool_error": bounded(detail) })),
            ExecError::CredentialRefused(m) => Refusal::new(
                Reason::DependencyDown,
                format!(
                    "the upstream of tool `{name}` refused its access token (401) and did not act on the request"
                ),
            )
            .with_details(json!({ "dependency_error": bounded(m), "reached_tool": error.reached_tool() }))
            .with_retryable(true),
            ExecError::CallerJwtRequired(m) => Refusal::new(
                Reason::CallerJwtRequired,
                format!(
                    "tool `{name}` sends the caller's own delegated credential, exchanged for its verified JWT; this call was not made with one, and nothing was sent"
                ),
            )
            .with_details(json!({ "credential_error": bounded(m), "reached_tool": error.reached_tool() })),
        }
    }
}

/// An `argument_unsafe` refusal for the argument at `pointer`.
pub(crate) fn unsafe_argument(pointer: &str, problem: &str) -> Refusal {
    Refusal::new(
        Reason::ArgumentUnsafe,
        format!("argument `{pointer}` is unsafe: {problem}"),
    )
    .with_details(json!({ "location": "arguments", "pointer": pointer, "problem": problem }))
}

/// An `argument_unsafe` refusal for the scope value under `key`.
pub(crate) fn unsafe_scope(key: &str, problem: &str) -> Refusal {
    Refusal::new(
        Reason::ArgumentUnsafe,
        format!("scope key `{key}` is unsafe: {problem}"),
    )
    .with_details(json!({ "location": "scope", "pointer": format!("/{key}"), "problem": problem }))
}

/// `text` cut to at most [`MAX_TOOL_ERROR_BYTES`] bytes on a character boundary.
pub(crate) fn bounded(text: &str) -> String {
    truncate(text, MAX_TOOL_ERROR_BYTES)
}

/// `text` cut to at most `max` bytes on a character boundary, marked when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    crate::text::cut_bytes(text, max)
}

/// Appends one JSON pointer token (RFC 6901 escaping) to `base`.
pub(crate) fn pointer_push(base: &str, token: &str) -> String {
    format!("{base}/{}", crate::text::pointer_token(token))
}

/// Every string in `value` (object keys included) with the JSON pointer of where it
/// is, in document order. Iterative, so any depth is safe.
pub(crate) fn strings_with_pointers(value: &Value) -> Vec<(String, &str)> {
    let mut found = Vec::new();
    let mut stack: Vec<(String, &Value)> = vec![(String::new(), value)];
    while let Some((pointer, v)) = stack.pop() {
        match v {
            Value::String(s) => found.push((pointer, s.as_str())),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate().rev() {
                    stack.push((pointer_push(&pointer, &i.to_string()), item));
                }
            }
            Value::Object(map) => {
                for (k, item) in map.iter().rev() {
                    let child = pointer_push(&pointer, k);
                    found.push((child.clone(), k.as_str()));
                    stack.push((child, item));
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    found
}

/// Whether `s` is a safe identifier for a file name component: `^[A-Za-z0-9_-]{1,64}$`.
pub(crate) fn is_safe_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The scope value under `key`, which must be a string matching `^[A-Za-z0-9_-]{1,64}$`
/// (it names a folder).
pub(crate) fn scope_id<'a>(scope: &'a Map<String, Value>, key: &str) -> Result<&'a str, Refusal> {
    match scope.get(key) {
        Some(Value::String(s)) if is_safe_id(s) => Ok(s),
        Some(Value::String(_)) => Err(unsafe_scope(
            key,
            "must match ^[A-Za-z0-9_-]{1,64}$ (it names a folder)",
        )),
        Some(_) => Err(unsafe_scope(key, "must be a string")),
        None => Err(unsafe_scope(key, "is missing")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        let s = "\u{e9}".repeat(2000);
        let t = truncate(&s, 2048);
        assert!(t.len() <= 2048);
        assert!(t.ends_with("..."));
        assert_eq!(truncate("short", 2048), "short");
    }

    #[test]
    fn strings_are_found_with_escaped_pointers() {
        let v = json!({"a/b": ["x", {"c~d": "y"}], "n": 1});
        let found: Vec<(String, String)> = strings_with_pointers(&v)
            .into_iter()
            .map(|(p, s)| (p, s.to_string()))
            .collect();
        assert!(found.contains(&("/a~1b/0".into(), "x".into())));
        assert!(found.contains(&("/a~1b/1/c~0d".into(), "y".into())));
        assert!(found.contains(&("/a~1b/1/c~0d".into(), "c~d".into())));
        assert!(found.contains(&("/n".into(), "n".into())));
    }

    #[test]
    fn safe_ids() {
        assert!(is_safe_id("C-1001"));
        assert!(is_safe_id("a_b"));
        assert!(!is_safe_id(""));
        assert!(!is_safe_id("../x"));
        assert!(!is_safe_id("a.b"));
        assert!(!is_safe_id(&"a".repeat(65)));
    }
}
