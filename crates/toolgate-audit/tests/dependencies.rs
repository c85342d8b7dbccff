//! What an auditor must trust is this crate's dependency tree: `cargo metadata` read
//! here, so that no HTTP stack, PostgreSQL client, CEL interpreter or MCP SDK (nor the
//! application itself) ever enters it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// Crates the audit log must never depend on, directly or not.
const FORBIDDEN: [&str; 12] = [
    "toolgate",
    "hyper",
    "hyper-util",
    "reqwest",
    "tokio-postgres",
    "postgres",
    "deadpool-postgres",
    "cel",
    "cel-interpreter",
    "rmcp",
    "jsonschema",
    "opentelemetry",
];

/// The host's target triple (`rustc -vV`).
fn host() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = Command::new(rustc).arg("-vV").output().expect("rustc runs");
    let text = String::from_utf8(output.stdout).expect("rustc -vV prints UTF-8");
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// The workspace's `cargo metadata` for this host (resolved from the committed
/// Cargo.lock, with the packages a build has already fetched: no network).
fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

/// The names of every package `root` depends on for building and running (not its
/// dev-dependencies), directly or not.
fn closure(metadata: &Value, root: &str) -> BTreeSet<String> {
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root_id = names
        .iter()
        .find(|(_, name)| **name == root)
        .map(|(id, _)| *id)
        .unwrap_or_else(|| panic!("{root} is not in the workspace"));
    let mut seen = BTreeSet::new();
    let mut stack = vec![root_id];
    while let Some(id) = stack.pop() {
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].as_str() != Some("dev"));
            let dep_id = dep["pkg"].as_str().unwrap();
            if normal && seen.insert(dep_id) {
                stack.push(dep_id);
            }
        }
    }
    seen.iter().map(|id| names[id].to_string()).collect()
}

#[test]
fn the_audit_crate_depends_on_no_http_stack_postgres_cel_mcp_or_the_application() {
    let metadata = metadata();
    let audit = closure(&metadata, "toolgate-audit");
    // The reading is real: the crate's own storage and signature crates are found.
    for needed in ["rusqlite", "ed25519-dalek", "sha2"] {
        assert!(audit.contains(needed), "{needed} missing from {audit:?}");
    }
    let found: Vec<&str> = FORBIDDEN
        .iter()
        .copied()
        .filter(|name| audit.contains(*name))
        .collect();
    assert!(
        found.is_empty(),
        "the audit crate depends on {found:?}; what an auditor must trust stays small \
         (docs/decisions.md)"
    );
    // The same reading of the application finds what the audit crate must not have.
    let application = closure(&metadata, "toolgate");
    for name in ["toolgate-audit", "hyper", "tokio-postgres", "cel", "rmcp"] {
        assert!(
            application.contains(name),
            "{name} missing from the application"
        );
    }
}
