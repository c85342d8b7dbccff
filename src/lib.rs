//! toolgate: a policy-and-audit enforcement sidecar for AI agents.
//!
//! # Layout
//!
//! ARCHITECTURE.md is the map: what each module owns, the layer order and the
//! invariants. In that order, top first:
//!
//! - [`commands`]: the `toolgate` command line: every subcommand's entry point, output
//!   and exit code; `main.rs` only calls [`commands::main`].
//! - [`server`]: the HTTP API (hyper): one route table, one handler per endpoint.
//! - [`console`]: the approver's console and run evidence page, served at `/console`.
//! - [`limits`]: per-client connection caps and request-rate buckets of the HTTP front.
//! - [`transport`]: the socket wrapper that gives hyper's own refusals a JSON body.
//! - [`workers`]: the connection threads of `toolgate serve`.
//! - [`mcp`]: the `/mcp` front for agents and `toolgate mcp import`.
//! - [`review`]: policy as code, offline: explain, test, diff, replay.
//! - [`shadow`]: shadow mode: a candidate policy decides a copy of every call.
//! - [`pipeline`]: the 13 steps of a tool call, in order: `decide` (steps 1-8) and
//!   `Gateway::handle` (steps 9-13).
//! - [`gateway`]: the running gateway's state and its admin operations.
//! - [`cluster`]: a fleet's shared state in PostgreSQL.
//! - [`requests`]: the typed requests of the run and safety-lock endpoints.
//! - [`authz`]: the pure authorization checks of steps 2-8; no I/O, no clock.
//! - [`runs`]: run records, rebuilt from the audit log at start.
//! - [`identity`]: run tokens and OIDC/JWT credentials.
//! - [`idempotency`]: first-outcome replay of a repeated idempotency key.
//! - [`capacity`]: the audit log's disk headroom (`--max-audit-bytes`,
//!   `--min-free-disk-bytes`).
//! - [`artifacts`]: content-addressed storage of large outputs, read through their run.
//! - [`approvals`]: human approval bound to the exact call, and its durable store.
//! - [`observe`]: metrics (`GET /metrics`), traces (OTLP) and logs.
//! - [`hub`]: the fleet's audit hub in the cluster database.
//! - [`adapter`]: executes authorized calls (builtin, command, http, mcp).
//! - [`sandbox`]: the kernel-enforced sandbox of local tool processes.
//! - [`audit`]: the hash-chained, append-only audit log (the `toolgate-audit` crate:
//!   the line, tree, checkpoints, keys, store, writer, reader, verify and export) and
//!   what the application adds: shipping, witnesses, archiving, webhook sinks.
//! - [`state`]: durable gateway state beside the audit log (two-phase commits,
//!   budget and rate counters).
//! - [`policy`]: loads and validates the three YAML registries into a [`policy::Policy`].
//! - [`call`]: a tool call's body, request, response and decision trace.
//! - [`diagnostic`]: the catalog of refusal reasons and the structured diagnostic block.
//! - [`outbound`]: the one outgoing HTTP client stack (reqwest over rustls with
//!   AWS-LC).
//! - [`canonical`]: RFC 8785 canonical JSON and the sha256 helpers (the audit crate's).
//! - [`localfile`]: the one bounded opener of local files, and owner-only creation (the
//!   audit crate's).
//! - [`text`]: bounded text and JSON pointer tokens.
//! - [`backoff`]: the doubling delay between retries.

pub mod adapter;
pub mod approvals;
pub mod artifacts;
pub mod audit;
pub mod authz;
pub mod backoff;
pub mod call;
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
pub mod text;
pub mod transport;
pub mod workers;

/// The version of the tool gateway contract this build implements, recorded in every
/// audit event (defined by the audit crate, whose line records it).
pub use toolgate_audit::CONTRACT_VERSION;
/// RFC 8785 canonical JSON and the sha256 helpers, and the one bounded opener of local
/// files: the audit crate's, the application's only copies.
pub use toolgate_audit::{canonical, localfile};
