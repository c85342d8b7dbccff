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

use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::diagnostic::{Reason, Refusal};
use crate::policy::{Policy, Problem, Tool};

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
}

/// How an execution failed, before classification into a reason.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecError {
    /// The deadline passed; the work was terminated.
    Timeout,
    /// The upstream could not be reached (connection refused, reset, DNS, 5xx).
    DependencyDown(String),
    /// The tool ran and reported an error (non-zero exit, 4xx, an error result).
    Failed(String),
    /// The tool's output is not a JSON value.
    OutputNotJson(String),
    /// The adapter kind or builtin is not available.
    NotImplemented(String),
}

mod builtin;
mod command;
mod http;

pub use builtin::BUILTIN_NAMES;

/// One tool's executor.
#[derive(Debug)]
pub enum Adapter {
    Builtin(builtin::BuiltinAdapter),
    Command(command::CommandAdapter),
    Http(http::HttpAdapter),
}

/// The adapters of one policy, by tool name.
#[derive(Debug, Default)]
pub struct Adapters {
    pub by_tool: BTreeMap<String, Adapter>,
}

/// Builds an adapter for every registered tool, checking each adapter's settings
/// (unknown builtin, empty argv, bad URL, host not in its own allowlist, ...).
/// Problems point at the tool in `tool_registry.yaml`.
pub fn build(policy: &Policy, env: &AdapterEnv) -> Result<Adapters, Vec<Problem>> {
    let _ = (policy, env);
    Err(Vec::new())
}

impl Adapter {
    /// Sanitizes the arguments: refuses path traversal, shell metacharacters where a
    /// plain value is expected, and URLs to hosts outside the allowlist.
    /// Runs after the input schema has been checked.
    pub fn validate(&self, tool: &Tool, arguments: &Value, scope: &Map<String, Value>) -> Result<(), Refusal> {
        let _ = (tool, arguments, scope);
        Err(Refusal::new(Reason::AdapterNotImplemented, "adapters are not built yet"))
    }

    /// The canonical form of the arguments: what is hashed into the audit log and
    /// what flag rules are evaluated on (e.g. `./a/../notes.md` becomes `notes.md`).
    pub fn normalize(&self, tool: &Tool, arguments: &Value) -> Value {
        let _ = tool;
        arguments.clone()
    }

    /// Executes the call; must return by `ctx.deadline` (then with `ExecError::Timeout`).
    pub async fn execute(&self, tool: &Tool, arguments: &Value, ctx: ExecContext<'_>) -> Result<Value, ExecError> {
        let _ = (tool, arguments, ctx);
        Err(ExecError::NotImplemented("adapters are not built yet".into()))
    }

    /// Maps an execution error to the contract's reason (and so error code) and
    /// whether a retry may help.
    pub fn classify_error(tool: &Tool, error: &ExecError) -> Refusal {
        let _ = tool;
        Refusal::new(Reason::InternalError, format!("{error:?}"))
    }
}
