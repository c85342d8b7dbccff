//! The one validation step: raw registry files in, a [`Policy`] (or every problem) out.
//!
//! Each file is checked on its own first (ids, duplicates, values), then the
//! cross-references between files (roles -> lanes, lanes <-> tools, write tools only in
//! write lanes). A file that failed to parse is skipped, and so are the cross-checks
//! that need it, so one syntax error does not bury the report in follow-on noise.
//!
//! INVARIANT: every problem carries the file and, whenever the raw types kept one, the
//! line and column of the offending value (`Spanned`), falling back to the enclosing
//! entry's position.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;
use serde_saphyr::{Location, Spanned};

mod adapters;
mod approvals;
mod conditions;
mod cross;
mod http;
mod lanes;
mod outbound;
mod roles;
mod sandbox;
mod tools;

use super::Problem;
use super::condition::Condition;
use super::identity;
use super::model::{
    AdapterConfig, Admin, AdminAccess, Credential, DEFAULT_RUN_TOKEN_MAX_TTL_S,
    DEFAULT_SERVER_CONCURRENCY, Determinism, FileVersion, FlagMatcher, FlagRule, IdentityProvider,
    IdentitySettings, JWT_ALGORITHMS, JwksSource, JwtCredential, Lane, Limits, McpServer, Policy,
    PolicySource, PolicyVersions, Redaction, Role, RunStatus, Tool,
};
use super::raw::{
    LanesFile, RawAdapter, RawAdapterKind, RawApproval, RawCondition, RawCredential,
    RawDeterminism, RawFlagRule, RawIdentityProvider, RawJwtCredential, RawLane, RawRedaction,
    RawRedactionMode, RawRole, RawRunTokens, RawServer, RawTool, RegistryFile, RolesFile,
};
use super::read::SourceFile;
use super::schema::{self, SchemaContext};
use adapters::*;
use approvals::*;
use conditions::*;
use cross::*;
use http::*;
use lanes::*;
use roles::*;
use sandbox::check_sandbox;
pub(crate) use sandbox::parse_host_port;
pub(crate) use tools::pointer_fits_schema;
use tools::*;

/// Upper bounds on tool limits: a registry can ask for less, never more.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
pub const MAX_OUTPUT_BYTES: u64 = 64 * 1024 * 1024;
pub const MAX_CONCURRENCY: u32 = 1024;
/// The longest `run_tokens.max_ttl_s` a policy may set (30 days).
pub const MAX_RUN_TOKEN_TTL_S: u64 = 30 * 86_400;

/// A file that parsed: its bytes (for the hash) and its raw content.
pub(crate) struct Parsed<T> {
    pub file: SourceFile,
    pub raw: T,
}

/// Everything validation needs. A `None` file failed to read or parse (its problem is
/// already reported).
pub(crate) struct Input<'a> {
    pub roles: Option<Parsed<RolesFile>>,
    pub lanes: Option<Parsed<LanesFile>>,
    pub registry: Option<Parsed<RegistryFile>>,
    /// The registry's directory: schema paths resolve against it.
    pub tools_dir: &'a Path,
    /// The policy directory: `jwks_file` paths resolve against it.
    pub policy_dir: &'a Path,
    /// Reads an environment variable (for `token_env` credentials, `${env:VAR}` and
    /// secrets `from: {env}`).
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// Whether secret values are read (false for `policy diff`, which compares ids and
    /// sources only).
    pub read_secrets: bool,
}

/// Validates and builds. Pushes every problem found; returns the policy only when there
/// are none (its `source` is left empty for the caller to fill in).
pub(crate) fn build(mut input: Input<'_>, problems: &mut Vec<Problem>) -> Option<Policy> {
    let before = problems.len();
    let mut report = Report { problems };

    // `${env:VAR}` is resolved before anything reads a url; secrets are read once.
    let mut resolved_env = BTreeMap::new();
    let env_allowed = input.registry.as_mut().map(|p| {
        outbound::resolve_registry_env(
            &mut report,
            &p.file.display,
            &mut p.raw,
            input.env,
            &mut resolved_env,
        )
    });
    let (secrets, declared) = input
        .registry
        .as_ref()
        .map(|p| {
            outbound::check_secrets(
                &mut report,
                &p.file.display,
                &p.raw.secrets,
                input.env,
                input.tools_dir,
                input.read_secrets,
            )
        })
        .unwrap_or_default();

    let roles = input.roles.as_ref().map(|p| {
        check_roles(
            &mut report,
            &p.file.display,
            &p.raw,
            input.env,
            input.policy_dir,
        )
    });
    let lanes = input
        .lanes
        .as_ref()
        .map(|p| check_lanes(&mut report, &p.file.display, &p.raw));
    let mut tools = input
        .registry
        .as_ref()
        .map(|p| check_tools(&mut report, &p.file.display, &p.raw, input.tools_dir));
    if let (Some(p), Some(tools)) = (&input.registry, tools.as_mut()) {
        let secret_allowed =
            outbound::check_outbound(&mut report, &p.file.display, &p.raw, &declared, tools);
        outbound::check_placements(&mut report, &p.file, &secret_allowed, env_allowed.as_ref());
    }
    for parsed in [
        input.roles.as_ref().map(|p| &p.file),
        input.lanes.as_ref().map(|p| &p.file),
    ] {
        outbound::check_placements_elsewhere(&mut report, parsed);
    }

    if let (Some(roles_file), Some(lanes)) = (&input.roles, &lanes) {
        check_role_lanes(
            &mut report,
            &roles_file.file.display,
            &roles_file.raw,
            lanes,
        );
    }
    if let (Some(lanes_file), Some(lanes), Some(registry_file)) =
        (&input.lanes, &lanes, &input.registry)
    {
        check_lanes_and_tools(
            &mut report,
            (&lanes_file.file.display, &lanes_file.raw),
            lanes,
            (&registry_file.file.display, &registry_file.raw),
        );
    }
    if let (Some(lanes_file), Some(lanes), Some(tools)) = (&input.lanes, &lanes, &tools) {
        check_lane_condition_arguments(
            &mut report,
            (&lanes_file.file.display, &lanes_file.raw),
            lanes,
            tools,
        );
    }

    if let Some(roles_file) = &input.roles {
        check_approvers(
            &mut report,
            &roles_file.raw,
            (
                input.lanes.as_ref().map_or("", |p| p.file.display.as_str()),
                input.lanes.as_ref().map(|p| &p.raw),
            ),
            (
                input
                    .registry
                    .as_ref()
                    .map_or("", |p| p.file.display.as_str()),
                input.registry.as_ref().map(|p| &p.raw),
            ),
        );
    }

    if report.problems.len() != before {
        return None;
    }
    let (roles_file, lanes_file, registry_file) = (input.roles?, input.lanes?, input.registry?);
    let (roles, admins, identity) = roles?;
    let lanes = lanes?;
    let tools = tools?;
    if !outbound::check_token_exchange_callers(
        &mut report,
        &registry_file.file.display,
        &registry_file.raw,
        &roles,
        &lanes,
        &tools,
    ) {
        return None;
    }
    let version = |parsed_version: &Spanned<String>, file: &SourceFile| FileVersion {
        version: parsed_version.value.clone(),
        sha256: crate::canonical::sha256_hex(&file.bytes),
    };
    let mut registry_version = version(&registry_file.raw.version, &registry_file.file);
    if !resolved_env.is_empty() {
        // The resolved settings pin the registry's version too (secret values never do).
        registry_version.sha256 =
            crate::canonical::sha256_hex(&crate::canonical::to_canonical_bytes(
                &serde_json::json!({ "file_sha256": registry_version.sha256, "env": resolved_env }),
            ));
    }
    Some(Policy {
        roles,
        admins,
        lanes,
        tools,
        versions: PolicyVersions {
            roles: version(&roles_file.raw.version, &roles_file.file),
            lanes: version(&lanes_file.raw.version, &lanes_file.file),
            registry: registry_version,
        },
        source: PolicySource::default(),
        identity,
        secrets,
    })
}

// ---------------------------------------------------------------------------------------
// Reporting

struct Report<'p> {
    problems: &'p mut Vec<Problem>,
}

impl Report<'_> {
    /// A problem at `at`, or at `fallback` when the parser kept no position for `at`.
    fn at(
        &mut self,
        file: &str,
        at: Location,
        fallback: Location,
        message: String,
        help: impl Into<String>,
    ) {
        let location = if at.line() > 0 { at } else { fallback };
        let help = Some(help.into());
        self.problems.push(if location.line() > 0 {
            Problem {
                file: file.to_string(),
                line: Some(location.line() as usize),
                column: Some(location.column() as usize),
                message,
                help,
            }
        } else {
            Problem {
                file: file.to_string(),
                line: None,
                column: None,
                message,
                help,
            }
        });
    }

    fn spanned<T>(
        &mut self,
        file: &str,
        value: &Spanned<T>,
        message: String,
        help: impl Into<String>,
    ) {
        self.at(file, value.referenced, value.referenced, message, help);
    }
}

// ---------------------------------------------------------------------------------------
// Shared value checks

/// `^[a-z][a-z0-9_]{0,63}$`: role, admin, lane and tool ids, scope keys and flags.
pub fn is_id(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
}

/// MCP's tool-name rule: 1 to 64 characters of `[A-Za-z0-9_.-]`.
pub(crate) fn is_mcp_tool_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// An RFC 6901 JSON pointer naming something inside the document: `/` followed by
/// reference tokens in which `~` is only ever `~0` or `~1`.
pub(crate) fn is_json_pointer(s: &str) -> bool {
    if !s.starts_with('/') {
        return false;
    }
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return false;
        }
    }
    true
}

pub(crate) fn is_env_var_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

const ID_HELP: &str =
    "ids are 1-64 characters: a lowercase letter, then lowercase letters, digits or `_`";

/// The closest known id to `unknown`, if it is a plausible typo.
fn did_you_mean<'a>(
    unknown: &str,
    known: impl IntoIterator<Item = &'a String>,
) -> Option<&'a String> {
    known
        .into_iter()
        .map(|k| (edit_distance(unknown, k), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn unknown_help(
    kind: &str,
    unknown: &str,
    known: &BTreeMap<String, impl Sized>,
    defined_in: &str,
) -> String {
    match did_you_mean(unknown, known.keys()) {
        Some(guess) => format!("did you mean `{guess}`? {kind}s are defined in {defined_in}"),
        None if known.is_empty() => format!("no {kind}s are defined in {defined_in}"),
        None => format!(
            "{kind}s defined in {defined_in}: {}",
            known
                .keys()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn check_version(report: &mut Report<'_>, file: &str, version: &Spanned<String>) {
    let v = &version.value;
    if v.trim().is_empty() {
        report.spanned(
            file,
            version,
            "`version` is empty".into(),
            "write the policy version, e.g. `version: \"2026.11.1\"`",
        );
    } else if v.len() > 64 || v.chars().any(char::is_control) {
        report.spanned(
            file,
            version,
            format!(
                "`version` `{}` is longer than 64 characters or holds control characters",
                v.escape_debug()
            ),
            "use a short printable version such as `2026.11.1`",
        );
    }
}

fn check_description(
    report: &mut Report<'_>,
    file: &str,
    what: &str,
    description: &Spanned<String>,
) {
    if description.value.trim().is_empty() {
        report.spanned(
            file,
            description,
            format!("{what} has an empty description"),
            "say in one line what it is for",
        );
    }
}

/// Checks an id; returns whether it is valid.
fn check_id(report: &mut Report<'_>, file: &str, kind: &str, id: &Spanned<String>) -> bool {
    if is_id(&id.value) {
        return true;
    }
    report.spanned(
        file,
        id,
        format!("{kind} `{}` is not a valid id", id.value.escape_debug()),
        ID_HELP,
    );
    false
}

/// Checks a list of ids (scope keys, flags, lane or tool references): each valid, none
/// twice. Returns the valid ones, sorted and deduplicated.
fn check_id_list(
    report: &mut Report<'_>,
    file: &str,
    kind: &str,
    owner: &str,
    list: &[Spanned<String>],
) -> Vec<String> {
    let mut seen = BTreeSet::new();
    for item in list {
        if !check_id(report, file, kind, item) {
            continue;
        }
        if !seen.insert(item.value.clone()) {
            report.spanned(
                file,
                item,
                format!("{owner} lists {kind} `{}` twice", item.value),
                "list each entry once",
            );
        }
    }
    seen.into_iter().collect()
}

/// Registers an id; reports a duplicate (pointing back at the first definition).
fn check_unique(
    report: &mut Report<'_>,
    file: &str,
    kind: &str,
    seen: &mut BTreeMap<String, Location>,
    id: &Spanned<String>,
) -> bool {
    if let Some(first) = seen.get(&id.value) {
        report.spanned(
            file,
            id,
            format!(
                "duplicate {kind} `{}` (first defined at line {})",
                id.value,
                first.line()
            ),
            format!("every {kind} must be unique; rename or remove one of them"),
        );
        return false;
    }
    seen.insert(id.value.clone(), id.referenced);
    true
}

// ---------------------------------------------------------------------------------------
// roles.yaml

type RolesAndAdmins = (BTreeMap<String, Role>, Vec<Admin>, IdentitySettings);

#[cfg(test)]
mod identity_tests;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["a", "case_id", "r2d2", &format!("a{}", "b".repeat(63))] {
            assert!(is_id(ok), "{ok}");
        }
        for bad in [
            "",
            "A",
            "1a",
            "_a",
            "a-b",
            "a.b",
            "a b",
            "é",
            &format!("a{}", "b".repeat(64)),
        ] {
            assert!(!is_id(bad), "{bad}");
        }
    }

    #[test]
    fn every_id_is_an_mcp_tool_name() {
        for name in ["a", "read_document", &"z".repeat(64)] {
            assert!(is_id(name) && is_mcp_tool_name(name));
        }
        assert!(is_mcp_tool_name("Read.Doc-2"));
        assert!(!is_mcp_tool_name(""));
        assert!(!is_mcp_tool_name("a/b"));
        assert!(!is_mcp_tool_name(&"z".repeat(65)));
    }

    #[test]
    fn json_pointers() {
        for ok in ["/path", "/a/b", "/a~0b", "/a~1b", "/", "/0"] {
            assert!(is_json_pointer(ok), "{ok}");
        }
        for bad in ["", "path", "a/b", "/a~2", "/a~"] {
            assert!(!is_json_pointer(bad), "{bad}");
        }
    }

    #[test]
    fn sha256_hex_is_64_lowercase_digits() {
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex(&"A".repeat(64)));
        assert!(!is_sha256_hex(&"a".repeat(63)));
        assert!(!is_sha256_hex(&"g".repeat(64)));
    }

    #[test]
    fn suggestions_catch_typos_only() {
        let known: Vec<String> = ["research", "drafting", "filing"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            did_you_mean("reserch", &known).map(String::as_str),
            Some("research")
        );
        assert_eq!(
            did_you_mean("filling", &known).map(String::as_str),
            Some("filing")
        );
        assert_eq!(did_you_mean("accounting", &known), None);
    }

    #[test]
    fn flag_pointers_must_fit_a_closed_input_schema() {
        let schema = serde_json::json!({
            "type": "object", "additionalProperties": false,
            "properties": {"path": {"type": "string"}, "meta": {"type": "object"}}
        });
        assert!(pointer_fits_schema("/path", &schema).is_ok());
        assert!(pointer_fits_schema("/meta/anything", &schema).is_ok());
        assert!(pointer_fits_schema("/pth", &schema).is_err());
        let open = serde_json::json!({"type": "object", "properties": {}});
        assert!(pointer_fits_schema("/pth", &open).is_ok());
    }

    // -----------------------------------------------------------------------------------
    // Whole-policy checks over small in-memory registries.

    use crate::policy::raw::{LanesFile, RegistryFile, RolesFile};
    use crate::policy::read::parse_yaml;

    pub(super) const ROLES: &str = "version: \"1\"
roles:
  - role_id: reader
    description: Reads.
    enabled: true
    lanes: [research]
    credential: {token_sha256: 1111111111111111111111111111111111111111111111111111111111111111}
  - role_id: writer
    description: Writes.
    enabled: true
    lanes: [drafting]
    credential: {token_env: WRITER_TOKEN}
admins:
  - admin_id: ops
    description: Operations.
    credential: {token_sha256: 2222222222222222222222222222222222222222222222222222222222222222}
";

    pub(super) const LANES: &str = "version: \"1\"
lanes:
  - lane_id: research
    description: Research.
    tools: [lookup]
    required_scope_keys: [case_id]
    prohibited_flags: [sealed]
    run_statuses: [active]
    write: false
  - lane_id: drafting
    description: Drafting.
    tools: [lookup, save_draft]
    required_scope_keys: [case_id]
    prohibited_flags: []
    run_statuses: [active, suspended]
    write: true
";

    pub(super) const REGISTRY: &str = "version: \"1\"
tools:
  - tool_name: lookup
    description: Looks up.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 100
    limits: {timeout_ms_max: 1000, max_output_bytes: 1024, max_concurrency: 2}
    allowed_lanes: [research, drafting]
    required_scope_keys: []
    prohibited_flags: []
    flag_rules:
      - {flag: privileged, pointer: /path, prefix: privileged/}
    write_targets: []
    adapter: {kind: builtin, name: lookup}
    input_schema: {type: object, additionalProperties: false, properties: {path: {type: string}}}
    output_schema: {type: object}
  - tool_name: save_draft
    description: Saves.
    enabled: true
    version: 1.0.0
    determinism: side_effectful
    idempotent: false
    timeout_default_ms: 100
    limits: {timeout_ms_max: 1000, max_output_bytes: 1024, max_concurrency: 2}
    allowed_lanes: [drafting]
    required_scope_keys: [case_id]
    prohibited_flags: [sealed]
    write_targets: [\"data_dir:drafts/\"]
    adapter: {kind: command, argv: [save]}
    redaction: {mode: fields, pointers: [/body]}
    input_schema: {type: object}
    output_schema: {type: object}
";

    fn source(display: &str, text: &str) -> SourceFile {
        SourceFile {
            display: display.into(),
            bytes: text.as_bytes().to_vec(),
        }
    }

    fn parsed<T: serde::de::DeserializeOwned>(display: &str, text: &str) -> Parsed<T> {
        let file = source(display, text);
        let raw = parse_yaml(&file).unwrap_or_else(|p| panic!("{p}"));
        Parsed { file, raw }
    }

    /// Validates the three texts; the problems as `file:line:col: message`.
    pub(super) fn check(roles: &str, lanes: &str, registry: &str) -> Result<Policy, Vec<String>> {
        let dir = tempfile::tempdir().unwrap();
        let env = |var: &str| (var == "WRITER_TOKEN").then(|| "writer-token".to_string());
        let input = Input {
            policy_dir: Path::new("."),
            roles: Some(parsed::<RolesFile>("roles.yaml", roles)),
            lanes: Some(parsed::<LanesFile>("lanes.yaml", lanes)),
            registry: Some(parsed::<RegistryFile>("tool_registry.yaml", registry)),
            tools_dir: dir.path(),
            env: &env,
            read_secrets: true,
        };
        let mut problems = Vec::new();
        let policy = build(input, &mut problems);
        crate::policy::sort_problems(&mut problems);
        match policy {
            Some(policy) if problems.is_empty() => Ok(policy),
            _ => Err(problems
                .iter()
                .map(|p| {
                    format!(
                        "{}:{}:{}: {}",
                        p.file,
                        p.line.unwrap_or(0),
                        p.column.unwrap_or(0),
                        p.message
                    )
                })
                .collect()),
        }
    }

    pub(super) fn problems(roles: &str, lanes: &str, registry: &str) -> Vec<String> {
        check(roles, lanes, registry).err().unwrap_or_default()
    }

    #[test]
    fn the_base_policy_builds_with_sorted_lists() {
        let policy = check(ROLES, LANES, REGISTRY).unwrap();
        assert_eq!(policy.lanes["drafting"].tools, ["lookup", "save_draft"]);
        assert_eq!(
            policy.tools["lookup"].allowed_lanes,
            ["drafting", "research"]
        );
        assert_eq!(
            policy.lanes["drafting"].run_statuses,
            [RunStatus::Active, RunStatus::Suspended]
        );
        assert_eq!(
            policy.roles["writer"].credential,
            Credential::TokenEnv {
                var: "WRITER_TOKEN".into(),
                sha256: Some(crate::canonical::sha256_hex(b"writer-token"))
            }
        );
        assert_eq!(
            policy.tools["save_draft"].redaction,
            Redaction::Fields {
                pointers: vec!["/body".into()]
            }
        );
        assert_eq!(policy.tools["lookup"].redaction, Redaction::Full);
        assert!(
            policy.tools["lookup"]
                .input_validator
                .is_valid(&serde_json::json!({"path": "a"}))
        );
        assert!(
            !policy.tools["lookup"]
                .input_validator
                .is_valid(&serde_json::json!({"pth": "a"}))
        );
    }

    #[test]
    fn a_role_naming_an_unknown_lane() {
        let roles = ROLES.replace("lanes: [research]", "lanes: [research, filing]");
        assert_eq!(
            problems(&roles, LANES, REGISTRY),
            ["roles.yaml:6:23: role `reader` names unknown lane `filing`"]
        );
    }

    #[test]
    fn a_lane_allowlisting_an_unregistered_tool() {
        let lanes = LANES.replace("tools: [lookup]", "tools: [lookup, search]");
        assert_eq!(
            problems(ROLES, &lanes, REGISTRY),
            ["lanes.yaml:5:21: lane `research` allowlists unregistered tool `search`"]
        );
    }

    #[test]
    fn allowlists_must_agree_in_both_directions() {
        // The lane lists the tool; the tool does not list the lane.
        let registry = REGISTRY.replace(
            "allowed_lanes: [research, drafting]",
            "allowed_lanes: [drafting]",
        );
        assert_eq!(
            problems(ROLES, LANES, &registry),
            [
                "lanes.yaml:5:13: lane `research` allowlists tool `lookup`, but the tool's `allowed_lanes` does not include `research`"
            ]
        );
        // The tool lists the lane; the lane does not list the tool.
        let lanes = LANES.replace("tools: [lookup, save_draft]", "tools: [save_draft]");
        assert_eq!(
            problems(ROLES, &lanes, REGISTRY),
            [
                "tool_registry.yaml:11:31: tool `lookup` lists lane `drafting` in `allowed_lanes`, but that lane does not allowlist it"
            ]
        );
    }

    #[test]
    fn a_tool_that_writes_only_in_write_lanes() {
        let lanes = LANES.replace("tools: [lookup]", "tools: [lookup, save_draft]");
        let registry = REGISTRY.replace(
            "allowed_lanes: [drafting]",
            "allowed_lanes: [drafting, research]",
        );
        assert_eq!(
            problems(ROLES, &lanes, &registry),
            [
                "lanes.yaml:5:21: lane `research` is not a write lane, but allowlists `save_draft`, which writes"
            ]
        );
    }

    #[test]
    fn duplicate_ids_point_back_at_the_first() {
        let lanes = LANES.replace("lane_id: drafting", "lane_id: research");
        let found = problems(ROLES, &lanes, REGISTRY);
        assert!(
            found.contains(
                &"lanes.yaml:10:14: duplicate lane id `research` (first defined at line 3)"
                    .to_string()
            ),
            "{found:#?}"
        );
    }

    #[test]
    fn two_principals_may_not_share_a_token() {
        let roles = ROLES.replace(&"2".repeat(64), &"1".repeat(64));
        assert_eq!(
            problems(&roles, LANES, REGISTRY),
            ["roles.yaml:16:17: admin `ops` has the same credential as role `reader`"]
        );
    }

    #[test]
    fn determinism_write_targets_and_idempotence_agree() {
        let pure_writer = REGISTRY.replace(
            "determinism: side_effectful\n    idempotent: false",
            "determinism: pure\n    idempotent: false",
        );
        assert_eq!(
            problems(ROLES, LANES, &pure_writer),
            [
                "tool_registry.yaml:25:17: tool `save_draft` is `pure` but says `idempotent: false`",
                "tool_registry.yaml:31:20: tool `save_draft` is `pure` but declares write targets",
            ]
        );
        let silent_writer = REGISTRY.replace("[\"data_dir:drafts/\"]", "[]");
        assert_eq!(
            problems(ROLES, LANES, &silent_writer),
            [
                "tool_registry.yaml:31:20: tool `save_draft` is `side_effectful` but declares no write targets"
            ]
        );
        // Side effectful yet idempotent (a write that repeats identically) is allowed.
        let idempotent_writer = REGISTRY.replace(
            "determinism: side_effectful\n    idempotent: false",
            "determinism: side_effectful\n    idempotent: true",
        );
        assert!(check(ROLES, LANES, &idempotent_writer).is_ok());
    }

    #[test]
    fn one_file_failing_to_parse_skips_the_checks_that_need_it() {
        let dir = tempfile::tempdir().unwrap();
        let env = |_: &str| Some("t".to_string());
        let roles = ROLES.replace("lanes: [research]", "lanes: [nowhere]");
        let input = Input {
            policy_dir: Path::new("."),
            roles: Some(parsed::<RolesFile>("roles.yaml", &roles)),
            lanes: None,
            registry: Some(parsed::<RegistryFile>("tool_registry.yaml", REGISTRY)),
            tools_dir: dir.path(),
            env: &env,
            read_secrets: true,
        };
        let mut found = Vec::new();
        assert!(build(input, &mut found).is_none());
        // No "unknown lane" noise: lanes.yaml did not parse, so nothing can be said.
        assert!(found.is_empty(), "{found:#?}");
    }
}
