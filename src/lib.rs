//! toolgate: a policy-and-audit enforcement sidecar for AI agents.
//!
//! # Layout
//!
//! - [`policy`]: loads and validates the three YAML registries into a [`policy::Policy`].
//! - [`diagnostic`]: the catalog of refusal reasons and the structured diagnostic block.
//! - [`authz`]: the pure authorization checks (pipeline steps 2-8); no I/O, no clock.
//! - [`pipeline`]: the 13 steps of a tool call, in order: `decide` (steps 1-8) and
//!   `Gateway::handle` (steps 9-13).
//! - [`adapter`]: executes authorized calls (builtin, command, http).
//! - [`audit`]: the hash-chained, append-only audit log in SQLite, its checkpoints,
//!   verification and export.
//! - [`requests`]: the typed requests of the run and safety-lock endpoints, parsed by
//!   [`server`] from the body.
//! - [`runs`]: run records, pinned to the policy versions they were created under.
//! - [`shadow`]: shadow mode: a candidate policy decides every call beside the active one.
//! - [`review`]: policy as code: explain, test, diff, replay.
//! - [`observe`]: metrics (`GET /metrics`), traces (OTLP) and logs.
//! - [`outbound`]: the one outgoing HTTP client stack (reqwest over rustls with ring).
//! - [`server`]: the HTTP API (hyper); the only module that serves HTTP.
//! - [`console`]: the approver's console and run evidence page (HTML, CSS, JS shipped
//!   in the binary), served by [`server`] at `/console`.
//! - [`limits`]: per-client connection and request-rate limits of the HTTP front.
//! - [`transport`]: the socket wrapper that gives hyper's own refusals a JSON body.
//! - [`workers`]: the connection threads of `toolgate serve`, one single-threaded
//!   runtime per core.
//! - [`capacity`]: the audit log's disk headroom (`--max-audit-bytes`,
//!   `--min-free-disk-bytes`).
//! - [`mcp`]: MCP on both sides: the `/mcp` front for agents, the adapter for
//!   upstream MCP servers, and `toolgate mcp import`.
//! - [`commands`]: the `toolgate` command line: every subcommand's entry point, output
//!   and exit code; `main.rs` only calls [`commands::main`].

pub mod adapter;
pub mod approvals;
pub mod artifacts;
pub mod audit;
pub mod authz;
pub mod call;
pub mod canonical;
pub mod capacity;
pub mod cluster;
pub mod commands;
pub mod console;
pub mod diagnostic;
pub mod gateway;
pub mod hub;
pub mod idempotency;
pub mod identity;
pub mod limits;
pub mod localfile;
pub mod mcp;
pub mod observe;
pub mod outbound;
pub mod pipeline;
pub mod policy;
pub mod requests;
pub mod review;
pub mod runs;
pub mod sandbox;
pub mod server;
pub mod shadow;
pub mod state;
pub mod transport;
pub mod workers;

/// The version of the tool gateway contract this build implements, recorded in every
/// audit event.
pub const CONTRACT_VERSION: &str = "v1";
