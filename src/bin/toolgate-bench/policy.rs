//! The policies measured: the generated benchmark policy (`builtin`, `upstream`) and a
//! copy of the shipped demo policy, in a temporary directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::json;

use toolgate::canonical::sha256_hex;

use crate::{ADMIN_TOKEN, AGENT_TOKEN, BenchError, DEMO_CASE, io};

/// A temporary directory for the policy and the data dirs, removed when dropped.
pub(crate) struct WorkDir(pub(crate) PathBuf);

impl WorkDir {
    pub(crate) fn create() -> Result<WorkDir, BenchError> {
        let dir = std::env::temp_dir().join(format!("toolgate-bench-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).map_err(io(format!("creating `{}`", dir.display())))?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes the benchmark policy: one role, one lane, the `builtin` tool (echo) and the
/// `upstream` http tool. Returns (policy dir, tool registry).
pub(crate) fn write_policy(
    dir: &Path,
    upstream: SocketAddr,
) -> Result<(PathBuf, PathBuf), BenchError> {
    let policy = dir.join("policy");
    let tools = dir.join("tools");
    let roles = format!(
        r#"version: "1.0.0"
roles:
  - role_id: bench_agent
    description: The benchmark's load generator.
    enabled: true
    lanes: [bench]
    credential:
      token_sha256: {agent}
admins:
  - admin_id: bench_admin
    description: Creates the benchmark's run.
    credential:
      token_sha256: {admin}
"#,
        agent = sha256_hex(AGENT_TOKEN.as_bytes()),
        admin = sha256_hex(ADMIN_TOKEN.as_bytes()),
    );
    let lanes = r#"version: "1.0.0"
lanes:
  - lane_id: bench
    description: Benchmark calls.
    tools: [builtin, upstream]
    required_scope_keys: []
    prohibited_flags: []
    run_statuses: [active]
    write: false
"#;
    let tool = |name: &str, adapter: &str| {
        format!(
            r#"  - tool_name: {name}
    description: Does nothing and returns an empty object.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 5000
    limits: {{timeout_ms_max: 30000, max_output_bytes: 65536, max_concurrency: 1024}}
    allowed_lanes: [bench]
    required_scope_keys: []
    prohibited_flags: []
    write_targets: []
    adapter: {adapter}
    input_schema: {{path: {name}/schema/input.json}}
    output_schema: {{path: {name}/schema/output.json}}
"#
        )
    };
    let registry = format!(
        "version: \"1.0.0\"\ntools:\n{}{}",
        tool("builtin", "{kind: builtin, name: echo}"),
        tool(
            "upstream",
            &format!(
                "{{kind: http, url: \"http://{upstream}/noop\", allowed_hosts: [\"{upstream}\"]}}"
            )
        ),
    );
    let input = r#"{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "additionalProperties": false}"#;
    let output = r#"{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}"#;
    let mut files = vec![
        (policy.join("roles.yaml"), roles),
        (policy.join("lanes.yaml"), lanes.to_string()),
        (tools.join("tool_registry.yaml"), registry),
    ];
    for name in ["builtin", "upstream"] {
        let schema = tools.join(name).join("schema");
        files.push((schema.join("input.json"), input.to_string()));
        files.push((schema.join("output.json"), output.to_string()));
    }
    for (path, text) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating `{}`", parent.display())))?;
        }
        std::fs::write(&path, text).map_err(io(format!("writing `{}`", path.display())))?;
    }
    Ok((policy, tools.join("tool_registry.yaml")))
}

/// The body of the demo's gated call (`research_agent` -> `case_lookup`) in `run_id`.
pub(crate) fn demo_call_body(run_id: &str, dry_run: bool) -> String {
    let mut body = json!({
        "role_id": "research_agent", "run_id": run_id, "lane_id": "research",
        "tool_name": "case_lookup", "arguments": {}, "scope": {"case_id": DEMO_CASE},
    });
    if dry_run {
        body["dry_run"] = json!(true);
    }
    body.to_string()
}

/// Copies the demo policy and registry (with its schemas and data) into `dir`, with
/// `case_lookup`'s `max_concurrency` lifted to 1024 so that no measured call is refused
/// at its cap. Returns (policy dir, tool registry).
pub(crate) fn write_demo_policy(
    dir: &Path,
    policy: &Path,
    tools: &Path,
) -> Result<(PathBuf, PathBuf), BenchError> {
    let policy_out = dir.join("demo-policy");
    let tools_out = dir.join("demo-tools");
    std::fs::create_dir_all(&policy_out)
        .map_err(io(format!("creating `{}`", policy_out.display())))?;
    for name in ["roles.yaml", "lanes.yaml"] {
        std::fs::copy(policy.join(name), policy_out.join(name))
            .map_err(io(format!("copying `{}`", policy.join(name).display())))?;
    }
    copy_tree(tools, &tools_out, 0)?;
    let registry = tools_out.join("tool_registry.yaml");
    let text = std::fs::read_to_string(&registry)
        .map_err(io(format!("reading `{}`", registry.display())))?;
    let lifted = lift_concurrency(&text, "case_lookup").ok_or_else(|| {
        BenchError::Policy("the demo registry has no `case_lookup` with `max_concurrency`".into())
    })?;
    std::fs::write(&registry, lifted).map_err(io(format!("writing `{}`", registry.display())))?;
    Ok((policy_out, registry))
}

/// `text` with the first `max_concurrency: N` after `tool_name: <tool>` set to 1024.
pub(crate) fn lift_concurrency(text: &str, tool: &str) -> Option<String> {
    let at = text.find(&format!("tool_name: {tool}\n"))?;
    let key = "max_concurrency: ";
    let from = at + text[at..].find(key)? + key.len();
    let digits = text[from..].find(|c: char| !c.is_ascii_digit())?;
    Some(format!("{}1024{}", &text[..from], &text[from + digits..]))
}

/// Copies a directory tree (regular files and directories only, at most 8 levels).
pub(crate) fn copy_tree(from: &Path, to: &Path, depth: usize) -> Result<(), BenchError> {
    if depth > 8 {
        return Err(BenchError::Policy(format!(
            "`{}` is nested too deeply",
            from.display()
        )));
    }
    std::fs::create_dir_all(to).map_err(io(format!("creating `{}`", to.display())))?;
    let entries = std::fs::read_dir(from).map_err(io(format!("listing `{}`", from.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("listing `{}`", from.display())))?;
        let kind = entry
            .file_type()
            .map_err(io(format!("reading `{}`", entry.path().display())))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target, depth + 1)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)
                .map_err(io(format!("copying `{}`", entry.path().display())))?;
        }
    }
    Ok(())
}
