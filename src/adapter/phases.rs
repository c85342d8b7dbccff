//! Two-phase tools: the commit and rollback calls of a tool whose own call only
//! prepares its effect (`adapter.phases` in the registry).
//!
//! The prepare call is the tool's ordinary adapter; it answers a commit token in a
//! top-level field (`phases.token_field`). A commit or rollback sends
//! `{"commit_token", "call_id", "commit_id", "phase"}` as JSON: POSTed to the phase's
//! `url` (http and builtin adapters; only hosts of the adapter's allowlist) or on the
//! stdin of the phase's `argv` (command adapters). A 2xx answer (exit status 0) with a
//! JSON body confirms the phase. An http tool's phase calls carry its `auth` (bearer,
//! basic, client credentials; not `token_exchange`: there is no caller's JWT then).
//!
//! INVARIANT: an attempt is retried only when the upstream could not be reached, was
//! busy, answered 5xx, refused the access token (401: it did not act, and the next
//! attempt has a new token) or did not answer in time, at most `phases.max_attempts`
//! in all; an upstream that answered another refusal (4xx, non-zero exit) is never
//! retried. The
//! upstream must treat a repeated commit or rollback of one token as the same request
//! (the retry rule of the contract for side effects).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::command::CommandAdapter;
use super::credentials::{Credential, Scrubber};
use super::http::Upstream;
use super::{AdapterEnv, ExecContext, ExecError, SettingProblem};
use crate::policy::secrets::Secrets;
use crate::policy::{AdapterConfig, PhaseCall, Phases, Tool};

/// The first retry waits this long; each next one twice as long, up to the cap.
const RETRY_BASE: Duration = Duration::from_millis(200);
const RETRY_CAP: Duration = Duration::from_secs(2);

/// Which phase a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Commit,
    Rollback,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Commit => "commit",
            Phase::Rollback => "rollback",
        }
    }
}

/// Where one phase call goes.
#[derive(Debug)]
enum Target {
    Http(Box<Upstream>, Box<PhaseAuth>),
    Command(CommandAdapter),
}

/// The credential of an http phase call: the tool's own `auth` (bearer, basic, client
/// credentials), and the scrubber of every value it sends.
#[derive(Debug, Default)]
struct PhaseAuth {
    credential: Option<Credential>,
    scrubber: Scrubber,
}

impl PhaseAuth {
    /// POSTs `body` with the credential; a refused access token is dropped (the next
    /// attempt fetches a new one). What the upstream answers is scrubbed.
    async fn post(
        &self,
        upstream: &Upstream,
        body: &Value,
        ctx: &ExecContext<'_>,
        cap: usize,
    ) -> Result<Value, ExecError> {
        let (authorization, token) = match &self.credential {
            None | Some(Credential::None) => (None, None),
            Some(Credential::Header(value)) => (Some(value.clone()), None),
            Some(Credential::ClientCredentials(source)) => {
                let token = source.token(ctx.deadline, &self.scrubber).await?;
                (
                    Some(super::http::bearer_value(&token)?),
                    Some((source, token)),
                )
            }
            Some(Credential::TokenExchange(_)) => {
                return Err(ExecError::Unreachable(
                    "a phase call has no caller's JWT to exchange; nothing was sent".into(),
                ));
            }
        };
        let result = upstream.post_json_with(body, ctx, cap, authorization).await;
        if let (Err(ExecError::CredentialRefused(_)), Some((source, token))) = (&result, token) {
            source.reject(&token).await;
        }
        if self.scrubber.is_empty() {
            return result;
        }
        match result {
            Ok(value) => Ok(self.scrubber.value(value)),
            Err(e) => Err(self.scrubber.error(e)),
        }
    }
}

/// The commit and rollback calls of one two-phase tool.
#[derive(Debug)]
pub struct PhaseRunner {
    commit: Target,
    rollback: Target,
    pub settings: Phases,
}

/// What a phase call came to.
#[derive(Debug)]
pub struct PhaseOutcome {
    /// How many attempts were made (1 ..= max_attempts).
    pub attempts: u32,
    /// The upstream's answer, or the last attempt's error.
    pub result: Result<Value, ExecError>,
    /// The last attempt's `details.sandbox` (a command phase's process).
    pub sandbox: Option<Map<String, Value>>,
}

impl PhaseRunner {
    /// Builds the runner of a tool that declares `phases`; `None` for other tools.
    pub(super) fn build(
        tool: &Tool,
        env: &AdapterEnv,
        secrets: &Secrets,
        forbidden: &crate::sandbox::plan::Forbidden,
        registry: &str,
        located: &mut Vec<crate::policy::Problem>,
    ) -> Option<Result<PhaseRunner, Vec<SettingProblem>>> {
        let phases = tool.phases.as_ref()?;
        let mut problems = Vec::new();
        let hosts: Vec<String> = match &tool.adapter {
            AdapterConfig::Http { allowed_hosts, .. } => allowed_hosts.clone(),
            AdapterConfig::Builtin { name, settings } => {
                if name != "file_with_court" {
                    problems.push(
                        SettingProblem::new(format!(
                            "builtin `{name}` does not answer a commit token; `phases` is not available for it"
                        ))
                        .help("of the builtins only `file_with_court` is two-phase"),
                    );
                }
                if phases.token_field != crate::policy::DEFAULT_TOKEN_FIELD {
                    problems.push(SettingProblem::new(format!(
                        "builtin `{name}` answers its token in `{}`; `phases.token_field` must be that",
                        crate::policy::DEFAULT_TOKEN_FIELD
                    )));
                }
                super::builtin::court_hosts(settings)
            }
            AdapterConfig::Command { .. } | AdapterConfig::Mcp { .. } => Vec::new(),
        };
        let mut target = |call: &PhaseCall, name: &str| -> Option<Target> {
            let built = match (call, &tool.adapter) {
                (PhaseCall::Url(url), AdapterConfig::Http { request, .. }) => {
                    // The tool's own CA, proxy and credential.
                    super::outbound_client(&request.outbound, &env.tools_dir)
                        .and_then(super::http::new_client)
                        .map_err(|e| vec![SettingProblem::new(e)])
                        .and_then(|client| {
                            let upstream = Upstream::build_with(url, &hosts, client.clone())?;
                            let mut values = Vec::new();
                            let credential = Credential::build(
                                request.outbound.auth.as_ref(),
                                secrets,
                                &client,
                                &mut values,
                            )
                            .map_err(|e| vec![SettingProblem::new(e)])?;
                            if matches!(credential, Credential::TokenExchange(_)) {
                                return Err(vec![SettingProblem::new(
                                    "`auth: token_exchange` on a two-phase tool: its commit and rollback come later, without the caller's JWT",
                                )
                                .help("use the sidecar's own credential (`oauth2_client_credentials`, `bearer`, `basic`) for a two-phase tool")]);
                            }
                            let auth = PhaseAuth {
                                credential: Some(credential),
                                scrubber: Scrubber::new(values),
                            };
                            Ok(Target::Http(Box::new(upstream), Box::new(auth)))
                        })
                }
                (PhaseCall::Url(url), _) => {
                    Upstream::build(url, &hosts).map(|u| Target::Http(Box::new(u), Box::default()))
                }
                (
                    PhaseCall::Argv(argv),
                    AdapterConfig::Command {
                        working_dir,
                        env_allowlist,
                        sandbox,
                        ..
                    },
                ) => CommandAdapter::build(argv, working_dir.as_deref(), env_allowlist, env)
                    .and_then(|adapter| {
                        // A phase's own profile, else the adapter's.
                        let sandbox = phases.sandbox.as_ref().unwrap_or(sandbox);
                        let owner = format!("tool `{}` phase `{name}`", tool.tool_name);
                        match super::confinement(
                            &owner,
                            sandbox,
                            adapter.program(),
                            adapter.working_dir(),
                            forbidden,
                            registry,
                        ) {
                            Ok(c) => Ok(Target::Command(adapter.confine(c))),
                            Err(found) => {
                                located.extend(found);
                                Err(Vec::new())
                            }
                        }
                    }),
                (PhaseCall::Argv(_), _) => Err(vec![SettingProblem::new(
                    "`argv` phase calls are for command adapters",
                )]),
            };
            match built {
                Ok(t) => Some(t),
                Err(found) => {
                    problems.extend(found.into_iter().map(|p| SettingProblem {
                        message: format!("`phases.{name}`: {}", p.message),
                        help: p.help,
                    }));
                    None
                }
            }
        };
        let commit = target(&phases.commit, "commit");
        let rollback = target(&phases.rollback, "rollback");
        match (commit, rollback) {
            (Some(commit), Some(rollback)) if problems.is_empty() => Some(Ok(PhaseRunner {
                commit,
                rollback,
                settings: phases.clone(),
            })),
            _ => Some(Err(problems)),
        }
    }

    /// Runs `phase` for a prepared call with its token: bounded attempts, each within
    /// `phases.timeout_ms`, retried (with backoff) only where a retry is safe.
    pub async fn run(
        &self,
        tool: &Tool,
        phase: Phase,
        token: &str,
        call_id: &str,
        commit_id: &str,
        run_id: &str,
    ) -> PhaseOutcome {
        let body = json!({
            "phase": phase.as_str(),
            "commit_token": token,
            "call_id": call_id,
            "commit_id": commit_id,
        });
        let target = match phase {
            Phase::Commit => &self.commit,
            Phase::Rollback => &self.rollback,
        };
        let scope = Map::new();
        let max = self.settings.max_attempts.max(1);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let slot = crate::sandbox::EvidenceSlot::default();
            let ctx = ExecContext {
                call_id,
                run_id,
                scope: &scope,
                deadline: Instant::now() + Duration::from_millis(self.settings.timeout_ms),
                sandbox: Some(&slot),
                subject_token: None,
                idempotency_key: None,
                delegation: None,
            };
            let result = match target {
                Target::Http(upstream, auth) => {
                    auth.post(upstream, &body, &ctx, super::output_hard_cap(tool))
                        .await
                }
                Target::Command(command) => command.execute(tool, &body, ctx).await,
            };
            let retry = matches!(
                result,
                Err(ExecError::Timeout
                    | ExecError::DependencyDown(_)
                    | ExecError::Unreachable(_)
                    | ExecError::CredentialRefused(_)
                    | ExecError::Busy(_))
            );
            if !retry || attempts >= max {
                let sandbox = slot.into_inner().ok().flatten().map(|e| e.details);
                return PhaseOutcome {
                    attempts,
                    result,
                    sandbox,
                };
            }
            let backoff = RETRY_BASE
                .saturating_mul(1 << (attempts - 1).min(8))
                .min(RETRY_CAP);
            tokio::time::sleep(backoff).await;
        }
    }
}

/// The runners of a policy's two-phase tools, by tool name.
pub(super) fn build_all(
    tools: &BTreeMap<String, Tool>,
    env: &AdapterEnv,
    secrets: &Secrets,
    forbidden: &crate::sandbox::plan::Forbidden,
    registry: &str,
    located: &mut Vec<crate::policy::Problem>,
) -> (BTreeMap<String, PhaseRunner>, Vec<(String, SettingProblem)>) {
    let mut runners = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, tool) in tools {
        match PhaseRunner::build(tool, env, secrets, forbidden, registry, located) {
            None => {}
            Some(Ok(runner)) => {
                runners.insert(name.clone(), runner);
            }
            Some(Err(found)) => problems.extend(found.into_iter().map(|p| (name.clone(), p))),
        }
    }
    (runners, problems)
}

/// Takes the commit token out of a prepare answer: the top-level string field
/// `token_field`, removed so that nothing downstream (output schema, response, audit
/// log) ever sees it. `Err` when the answer carries no usable token.
pub fn take_token(output: &mut Value, token_field: &str) -> Result<String, ExecError> {
    let token = output.as_object_mut().and_then(|o| o.remove(token_field));
    match token {
        Some(Value::String(t)) if !t.is_empty() && t.len() <= MAX_TOKEN_BYTES => Ok(t),
        Some(Value::String(t)) if t.len() > MAX_TOKEN_BYTES => Err(ExecError::Failed(format!(
            "the prepare answer's `{token_field}` is longer than {MAX_TOKEN_BYTES} bytes"
        ))),
        _ => Err(ExecError::Failed(format!(
            "the prepare answer carries no string `{token_field}` (the commit token)"
        ))),
    }
}

/// The longest commit token the gateway keeps.
pub const MAX_TOKEN_BYTES: usize = 4096;
