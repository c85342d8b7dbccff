//! The integration tests, in one test binary so the dependency tree is linked once.
//!
//! Each module drives the real `toolgate` binary (or the real library) the way a user
//! would: the server on `127.0.0.1:0` with a temporary data directory, real SQLite
//! files, real subprocesses, the real MCP SDKs. `tests/deadline.rs` stays a binary of
//! its own: it measures a time bound, so no other test may share the machine with it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod audit_support;
mod common;
mod mcp_support;

mod adapters;
mod approvals;
mod approvals_insider;
mod architecture;
mod audit_crash;
mod audit_export;
mod audit_insider;
mod audit_log;
mod audit_segments;
mod audit_verify;
mod authz;
mod bench;
mod budgets;
mod console;
mod contract;
mod data_files;
// The docs name only the catalog's reasons, error codes and statuses.
mod docs_truth;
mod drain;
mod durability;
mod fleet;
mod fleet_approvals;
mod fleet_audit;
mod fleet_claims;
mod fleet_export_offline;
mod fleet_stop;
mod gateway;
mod hostile;
mod http_adapter;
mod identity;
mod jwt;
mod lab;
mod mcp_adapter;
mod mcp_adapter_flood;
mod mcp_front;
mod mcp_sandbox;
mod mcp_session;
mod metrics;
mod outbound;
// Secrets, outbound auth (bearer, basic, client credentials, mTLS), private CAs, scrubbing.
mod outbound_auth;
mod policy_check;
mod policy_diff;
mod redaction;
mod requests;
mod review_live;
mod sandbox;
// The request path through `server::handle` without a socket: routes, 405/404, queries, refusal responses.
mod server_handle;
mod ship;
mod siem;
mod soak;
mod traces;
mod two_phase;
mod witness;
