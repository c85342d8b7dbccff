//! Load runs: the soak and the fleet benchmarks. They take minutes and print figures
//! for docs/performance.md, so they are not part of `cargo test` (`test = false` in
//! Cargo.toml); run one on purpose, e.g. `cargo test --release --test load soak --
//! --nocapture`. They share the integration tests' harness (`tests/it/common`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../it/common/mod.rs"]
mod common;
// Three sidecars on one PostgreSQL: calls/s and the hub's ship lag.
mod fleet;
// WAL and RSS bounded under sustained load.
mod soak;
