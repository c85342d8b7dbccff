//! The integration tests, in one test binary so the dependency tree is linked once.
//!
//! Each module drives the real `toolgate` binary (or the real library) the way a user
//! would: the server on `127.0.0.1:0` with a temporary data directory, real SQLite
//! files, real subprocesses, the real MCP SDKs. `tests/deadline.rs` stays a binary of
//! its own: it measures a time bound, so no other test may share the machine with it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Helpers of the audit tests: build a real log, tamper with its SQLite file, run the binary.
mod audit_support;
// The harness: the real server on 127.0.0.1:0, polls, `copy_dir`, verify_export.py.
mod common;
// The MCP tests' real SDKs (Python, TypeScript) and reference servers.
mod mcp_support;

// The builtin, command and http adapters on real data, processes and upstreams.
mod adapters;
// Human approval bound to the exact call: its whole life over real HTTP.
mod approvals;
// Approvals against an insider and one person posing as two approvers.
mod approvals_insider;
// ARCHITECTURE.md holds in the code: layers, big files, rusqlite, opener, hashing.
mod architecture;
// A log appended from 32 tasks and SIGKILLed verifies with every acknowledged append.
mod audit_crash;
// `audit export` and `verify_export.py`: untouched exports verify, tampered ones are named.
mod audit_export;
// An insider with the data directory (and the key) rewrites, trims or cuts the log: caught.
mod audit_insider;
// The audit log's public API: group commit, durability, reads, triggers, typed errors.
mod audit_log;
// Sealed segments: verify, export, restart, archive and an insider across segment files.
mod audit_segments;
// `audit verify` on databases tampered with in every listed way: exit code and seq.
mod audit_verify;
// The authorization seams over the real server: run scope, CEL conditions, artifacts, auth first.
mod authz;
// `toolgate-bench` end to end, shortened: a complete report (no figures checked).
mod bench;
// Call budgets and rates with their real SQLite counters.
mod budgets;
// The console and a run's evidence page in a real headless Chromium.
mod console;
// contract/diagnostics.json is what the gateway really answers with.
mod contract;
// Every file toolgate writes is owner-only under the widest umask.
mod data_files;
// The docs name only the catalog's reasons, error codes and statuses.
mod docs_truth;
// A shutdown's drain: the loaded policy's drain time, cancelled calls still closed.
mod drain;
// SIGKILL under load and an unwritable log: every answered call recorded, none unrecorded.
mod durability;
// Three sidecars sharing one real PostgreSQL: runs, tokens, lock and keys as one state.
mod fleet;
// Fleet approvals against an insider: one expiry event, forged rows refused.
mod fleet_approvals;
// The audit hub on real PostgreSQL: shipping, `verify --cluster-db`, fleet exports.
mod fleet_audit;
// A dead sidecar's idempotency claim: repeats refused, the documented recovery.
mod fleet_claims;
// `verify_export.py --fleet` against fleet exports forged in the test, check by check.
mod fleet_export_offline;
// A graceful stop ships a fleet sidecar's last calls to the hub.
mod fleet_stop;
// Every golden example in contract/examples/ replayed against its own server.
mod gateway;
// Floods, races, repetition and malformed transport against the real server.
mod hostile;
// The http adapter's whole contract against a real upstream on 127.0.0.1.
mod http_adapter;
// Run tokens: bound, closed, revoked, expired, durable and never logged.
mod identity;
// OIDC/JWT credentials against a local JWK Set, every refusal with its reason.
mod jwt;
// Execution-stage outcomes on the lab policy: concurrency, schemas, artifacts, errors.
mod lab;
// The MCP adapter against real MCP servers over stdio and Streamable HTTP.
mod mcp_adapter;
// An upstream flooding toolgate with requests is bounded and cut off.
mod mcp_adapter_flood;
// The `/mcp` front driven by the official Python SDK and raw JSON-RPC.
mod mcp_front;
// A hostile stdio MCP server confined by its sandbox profile.
mod mcp_sandbox;
// MCP upstream sessions, restarts, cancellation and progress end to end.
mod mcp_session;
// `GET /metrics`: every family present, counters moving by label.
mod metrics;
// The one outgoing HTTP stack over real TLS: private CAs, refused certificates.
mod outbound;
// Secrets, outbound auth (bearer, basic, client credentials, mTLS), private CAs, scrubbing.
mod outbound_auth;
// `policy check`: the shipped policy passes, every broken fixture is refused.
mod policy_check;
// `policy diff` and `check --base` on a real git repository.
mod policy_diff;
// A secret under a redacted pointer appears in no response, log or export.
mod redaction;
// Typed request bodies: malformed ones answered after authentication.
mod requests;
// Shadow mode, reloads under load, SIGHUP and `audit replay` on a running gateway.
mod review_live;
// The kernel sandbox of tool processes attacked by a hostile tool.
mod sandbox;
// The request path through `server::handle` without a socket: routes, 405/404, queries, refusals.
mod server_handle;
// `serve --ship` to syslog, Splunk HEC and OTLP receivers: at least once, in order.
mod ship;
// OCSF records validated against the published schema, and CEF lines.
mod siem;
// Whole-output snapshots of `policy check|explain|diff|test` and `audit verify`.
mod snapshots;
// RFC 8693 token exchange of a JWT caller's token: delegation audited, no token kept.
mod token_exchange;
// OTLP traces within the caller's `traceparent`, and one JSON log line per call.
mod traces;
// Two-phase tools with the stand-in court: prepare, commit, rollback, refusals.
mod two_phase;
// Witnesses: cosignatures from a tlog-witness written here, quorum checks.
mod witness;
