//! `toolgate mcp import`: asks an MCP server for its tools and prints registry entries
//! for them, for a person to review and enable.
//!
//! The server is printed once, as a `servers:` entry, and every tool as a `tools:` entry
//! with `enabled: false`, the server's schemas inline, and an `mcp` adapter that refers
//! to the server by its id (so all its tools share one upstream session). Nothing the server says is trusted: its
//! annotations only pick the more cautious of two defaults (a tool is
//! `side_effectful` and not idempotent unless it says `readOnlyHint` or
//! `idempotentHint`), and the reviewer decides the rest.
//!
//! The entries are YAML whose values are written as JSON (JSON is YAML), so no YAML
//! library is needed to print them and the policy loader reads them back as is.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::adapter::mcp::{Listing, RawListing, Upstream};

/// Defaults of an imported entry; the reviewer tightens them.
const TIMEOUT_DEFAULT_MS: u64 = 10_000;
const TIMEOUT_MAX_MS: u64 = 30_000;
const MAX_OUTPUT_BYTES: u64 = 65_536;
const MAX_CONCURRENCY: u32 = 4;
/// Longest registry tool name.
const MAX_NAME: usize = 64;

/// What a person must know before enabling the listed tools: a tool that can only be
/// called as an MCP task (`execution.taskSupport: "required"`, MCP 2025-11-25) cannot be
/// served by toolgate, which calls tools directly; a declared output schema is enforced
/// by MCP clients on every result (the registry's `output_schema` is what the front
/// advertises, so it must describe what the upstream returns).
pub fn warnings(listing: &Listing) -> Vec<String> {
    let mut names: Vec<&rmcp::model::Tool> = listing.tools.iter().collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = Vec::new();
    match &listing.raw {
        RawListing::Read { task_required } => {
            for name in task_required {
                out.push(format!(
                    "upstream tool {} requires task augmentation (execution.taskSupport \"required\"): \
                     toolgate calls tools directly and cannot serve it; its entry is printed disabled, \
                     leave it so",
                    json!(name)
                ));
            }
        }
        RawListing::Unseen => out.push(
            "could not read the raw tools/list answers (an http server, or answers larger than \
             the import keeps): tools that require task augmentation (execution.taskSupport \
             \"required\") cannot be served by toolgate and are not marked; check the server's \
             listing before enabling any tool"
                .to_string(),
        ),
    }
    out.extend(names.iter().filter(|t| t.output_schema.is_some()).map(|t| {
        format!(
            "upstream tool {} declares an outputSchema: MCP clients (the TypeScript and Python SDKs) \
             reject a success whose structuredContent does not match it; the entry copies it into \
             output_schema, keep it exact when you tighten it",
            json!(t.name)
        )
    }));
    out
}

/// The registry entries for every listed tool, sorted by upstream name, with a header
/// comment saying how to review them.
pub fn render(
    listing: &Listing,
    upstream: &Upstream,
    lanes: &[String],
    server_id: Option<&str>,
) -> String {
    let (server_name, server_version) = match &listing.server {
        Some(info) => (info.name.clone(), info.version.clone()),
        None => (String::from("unnamed"), String::new()),
    };
    let version = semver::Version::parse(&server_version)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| "1.0.0".to_string());
    let server_id = match server_id {
        Some(id) => id.to_string(),
        None => registry_name(&server_name, &mut BTreeSet::new()),
    };
    let endpoint = match upstream {
        Upstream::Stdio { argv0, args, .. } => {
            let mut argv = vec![argv0.clone()];
            argv.extend(args.iter().cloned());
            format!("command: {}", json!(argv))
        }
        Upstream::Http { url } => format!("url: {}", json!(url)),
    };
    let mut tools: Vec<&rmcp::model::Tool> = listing.tools.iter().collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let mut taken = BTreeSet::new();
    let mut out = String::new();
    out.push_str(&format!(
        "# {} tool(s) of mcp server {} {}, printed by `toolgate mcp import`.\n",
        tools.len(),
        json!(server_name),
        json!(server_version)
    ));
    out.push_str(
        "# Review every entry before enabling it: descriptions, schemas and annotations come\n\
         # from the server and are not trusted. To enable a tool: list its lanes in\n\
         # `allowed_lanes`, add it to those lanes' `tools` in policy/lanes.yaml, set\n\
         # `enabled: true`, tighten schemas and limits, then run `toolgate policy check`.\n\
         # A stdio server runs in the directory of tool_registry.yaml: use absolute paths\n\
         # or programs on PATH in `command`. It runs in the strict default sandbox (no\n\
         # network, no files but its program's): give the entry a `sandbox:` with what it\n\
         # needs (docs/policy.md, \"Sandbox\").\n\
         # The server goes in the registry's `servers:` list and the tools in its `tools:`\n\
         # list: if the registry has no `servers:` yet, paste the `servers:` part as is.\n",
    );
    if !lanes.is_empty() {
        out.push_str(&format!(
            "# These entries name lane(s) {}: the policy loads only once those lanes list\n\
             # the tools in their `tools` in policy/lanes.yaml.\n",
            lanes.join(", ")
        ));
    }
    out.push_str("\nservers:\n");
    out.push_str(&format!("  - server_id: {server_id}\n"));
    out.push_str(&format!(
        "    description: {}\n",
        json!(format!("MCP server `{server_name}` {server_version}").trim_end())
    ));
    out.push_str(&format!("    {endpoint}\n"));
    out.push_str(&format!("    max_concurrency: {MAX_CONCURRENCY}\n"));
    out.push_str("\ntools:\n");
    for tool in tools {
        let name = registry_name(&tool.name, &mut taken);
        let annotations = tool.annotations.as_ref();
        let read_only = annotations.and_then(|a| a.read_only_hint) == Some(true);
        let idempotent_hint = annotations.and_then(|a| a.idempotent_hint) == Some(true);
        let cautious = !(read_only || idempotent_hint);
        let (determinism, idempotent) = if cautious {
            ("side_effectful", false)
        } else {
            ("idempotent", true)
        };
        // The server by its id (the raw name may hold `:` or control characters, which
        // `policy check` refuses in a target), the tool by its upstream name unless
        // that holds control characters.
        let target_tool = if tool.name.chars().any(char::is_control) {
            name.as_str()
        } else {
            &tool.name
        };
        let write_targets = if cautious {
            json!([format!("mcp:{server_id}/{target_tool}")])
        } else {
            json!([])
        };
        let description = tool
            .description
            .as_deref()
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| format!("Tool `{}` of mcp server `{server_name}`.", tool.name));
        let output_schema = tool
            .output_schema
            .as_ref()
            .map(|s| Value::Object((**s).clone()))
            .unwrap_or_else(|| json!({}));
        let hints = match annotations {
            Some(a) => format!(
                "readOnlyHint={}, idempotentHint={}, destructiveHint={}",
                hint(a.read_only_hint),
                hint(a.idempotent_hint),
                hint(a.destructive_hint)
            ),
            None => "none".to_string(),
        };
        out.push_str(&format!(
            "\n  # upstream tool {}; annotations: {hints}{}\n",
            json!(tool.name),
            if tool.output_schema.is_none() {
                "; no output schema: `{}` accepts any output, tighten it"
            } else {
                ""
            }
        ));
        if task_required(listing, &tool.name) {
            out.push_str(
                "  # CANNOT BE SERVED: the server requires this tool to be called as a task\n\
                 \x20 # (execution.taskSupport \"required\"); toolgate calls tools directly, so\n\
                 \x20 # the upstream refuses every call. Leave it disabled.\n",
            );
        }
        out.push_str(&format!("  - tool_name: {name}\n"));
        out.push_str(&format!("    description: {}\n", json!(description)));
        out.push_str("    enabled: false\n");
        out.push_str(&format!("    version: {version}\n"));
        out.push_str(&format!("    determinism: {determinism}\n"));
        out.push_str(&format!("    idempotent: {idempotent}\n"));
        out.push_str(&format!("    timeout_default_ms: {TIMEOUT_DEFAULT_MS}\n"));
        out.push_str(&format!(
            "    limits: {{timeout_ms_max: {TIMEOUT_MAX_MS}, max_output_bytes: {MAX_OUTPUT_BYTES}, max_concurrency: {MAX_CONCURRENCY}}}\n"
        ));
        out.push_str(&format!("    allowed_lanes: {}\n", json!(lanes)));
        out.push_str("    required_scope_keys: []\n");
        out.push_str("    prohibited_flags: []\n");
        out.push_str(&format!("    write_targets: {write_targets}\n"));
        out.push_str(&format!(
            "    adapter: {{kind: mcp, server: {server_id}, tool: {}}}\n",
            json!(tool.name)
        ));
        out.push_str(&format!(
            "    input_schema: {}\n",
            Value::Object((*tool.input_schema).clone())
        ));
        out.push_str(&format!("    output_schema: {output_schema}\n"));
    }
    out
}

/// Whether the raw listing says `name` can only be called as a task.
fn task_required(listing: &Listing, name: &str) -> bool {
    matches!(&listing.raw, RawListing::Read { task_required } if task_required.contains(name))
}

fn hint(value: Option<bool>) -> &'static str {
    match value {
        Some(true) => "true",
        Some(false) => "false",
        None => "unset",
    }
}

/// A registry tool name (`^[a-z][a-z0-9_]{0,63}$`) for an upstream tool name, unique
/// among `taken`: lowercase, camelCase split with `_`, other characters as `_`.
fn registry_name(upstream: &str, taken: &mut BTreeSet<String>) -> String {
    let mut name = String::new();
    let mut previous_lower = false;
    for c in upstream.chars() {
        if c.is_ascii_uppercase() {
            if previous_lower {
                name.push('_');
            }
            name.push(c.to_ascii_lowercase());
            previous_lower = false;
        } else if c.is_ascii_lowercase() || c.is_ascii_digit() {
            name.push(c);
            previous_lower = true;
        } else {
            name.push('_');
            previous_lower = false;
        }
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        name.insert_str(0, "mcp_");
    }
    name.truncate(MAX_NAME - 4);
    let mut candidate = name.clone();
    let mut n = 2;
    while taken.contains(&candidate) {
        candidate = format!("{name}_{n}");
        n += 1;
    }
    taken.insert(candidate.clone());
    candidate
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_become_registry_ids() {
        let mut taken = BTreeSet::new();
        assert_eq!(
            registry_name("get_current_time", &mut taken),
            "get_current_time"
        );
        assert_eq!(
            registry_name("getCurrentTime", &mut taken),
            "get_current_time_2"
        );
        assert_eq!(registry_name("read-file.v2", &mut taken), "read_file_v2");
        assert_eq!(registry_name("2fa", &mut taken), "mcp_2fa");
        assert_eq!(registry_name("_x", &mut taken), "mcp__x");
        let long = registry_name(&"a".repeat(200), &mut taken);
        assert!(long.len() <= MAX_NAME);
    }

    #[test]
    fn entries_are_cautious_unless_the_server_says_otherwise() {
        let tools: Vec<rmcp::model::Tool> = serde_json::from_value(json!([
            {"name": "write_thing", "inputSchema": {"type": "object"}},
            {"name": "read_thing", "description": "Reads.", "inputSchema": {"type": "object"},
             "outputSchema": {"type": "object", "properties": {"a": {"type": "string"}}},
             "annotations": {"readOnlyHint": true}},
        ]))
        .unwrap();
        let listing = Listing {
            server: None,
            tools,
            raw: RawListing::Read {
                task_required: ["write_thing".to_string()].into(),
            },
        };
        let upstream = Upstream::Http {
            url: "http://127.0.0.1:9/mcp".into(),
        };
        let text = render(&listing, &upstream, &[], None);
        let read = text.find("- tool_name: read_thing").unwrap();
        let write = text.find("- tool_name: write_thing").unwrap();
        assert!(read < write, "sorted by name");
        let write_entry = &text[write..];
        assert!(write_entry.contains("determinism: side_effectful"));
        assert!(write_entry.contains("idempotent: false"));
        assert!(write_entry.contains(r#"write_targets: ["mcp:unnamed/write_thing"]"#));
        assert!(write_entry.contains("output_schema: {}"));
        let read_entry = &text[read..write];
        assert!(read_entry.contains("determinism: idempotent"));
        assert!(read_entry.contains("write_targets: []"));
        assert!(
            read_entry.contains(r#"adapter: {kind: mcp, server: unnamed, tool: "read_thing"}"#)
        );
        // The server is named once, before the tools, and both tools refer to it.
        let servers = text.find("\nservers:\n  - server_id: unnamed\n").unwrap();
        assert!(servers < text.find("\ntools:\n").unwrap());
        assert!(text.contains(r#"    url: "http://127.0.0.1:9/mcp""#));
        assert_eq!(text.matches("server: unnamed,").count(), 2);
        let named = render(&listing, &upstream, &[], Some("search"));
        assert!(named.contains("  - server_id: search\n"));
        assert_eq!(named.matches("server: search,").count(), 2);
        assert!(text.matches("enabled: false").count() == 2);
        assert!(text.matches("allowed_lanes: []").count() == 2);
        // The task-required tool is marked, the other is not.
        let write_note = text.find(r#"# upstream tool "write_thing""#).unwrap();
        let read_note = text.find(r#"# upstream tool "read_thing""#).unwrap();
        assert!(text[write_note..].contains("CANNOT BE SERVED"));
        assert!(!text[read_note..write_note].contains("CANNOT BE SERVED"));
        let warned = warnings(&listing);
        assert!(
            warned
                .iter()
                .any(|w| w.contains(r#""write_thing" requires task augmentation"#)),
            "{warned:?}"
        );
    }

    #[test]
    fn write_targets_name_the_server_by_its_id() {
        // A server name with `:` and control characters, as a hostile server may send.
        let listing = Listing {
            server: Some(rmcp::model::Implementation::new(
                "evil:srv\u{7}\nx",
                "1.0.0",
            )),
            tools: serde_json::from_value(json!([
                {"name": "write_thing", "inputSchema": {"type": "object"}},
            ]))
            .unwrap(),
            raw: RawListing::Unseen,
        };
        let upstream = Upstream::Http {
            url: "http://127.0.0.1:9/mcp".into(),
        };
        let text = render(&listing, &upstream, &[], None);
        assert!(text.contains("  - server_id: evil_srv__x\n"), "{text}");
        assert!(
            text.contains(r#"write_targets: ["mcp:evil_srv__x/write_thing"]"#),
            "{text}"
        );
        let named = render(&listing, &upstream, &[], Some("search"));
        assert!(
            named.contains(r#"write_targets: ["mcp:search/write_thing"]"#),
            "{named}"
        );
    }
}
