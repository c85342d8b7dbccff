//! Validation rules, adapters: adapter settings and redaction.

use super::*;

pub(super) fn check_adapter(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    adapter: &Spanned<RawAdapter>,
    servers: &BTreeMap<String, McpServer>,
    tools_dir: &Path,
) -> Option<AdapterConfig> {
    let before = report.problems.len();
    let raw = &adapter.value;
    let kind = raw.kind.value;
    let allowed = check_fields(report, file, owner, adapter);
    let mut missing = Vec::new();
    let config = match kind {
        RawAdapterKind::Builtin => builtin(report, file, owner, raw, &mut missing),
        RawAdapterKind::Command => command(report, file, owner, raw, tools_dir, &mut missing),
        RawAdapterKind::Http => http(report, file, owner, raw, &mut missing),
        RawAdapterKind::Mcp => mcp(
            report,
            (file, owner),
            adapter,
            servers,
            tools_dir,
            &mut missing,
        ),
    };
    if !missing.is_empty() {
        report.spanned(
            file,
            adapter,
            format!(
                "{owner}: adapter of kind `{}` is missing {}",
                kind.as_str(),
                missing
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            format!(
                "an adapter of kind `{}` takes: {}",
                kind.as_str(),
                allowed.join(", ")
            ),
        );
    }
    (report.problems.len() == before)
        .then_some(config)
        .flatten()
}

/// The fields an adapter of its kind takes; each other field present is a problem.
fn check_fields(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    adapter: &Spanned<RawAdapter>,
) -> &'static [&'static str] {
    let raw = &adapter.value;
    let kind = raw.kind.value;
    let present: [(&str, Option<Location>); 19] = [
        ("name", raw.name.as_ref().map(|v| v.referenced)),
        ("settings", raw.settings.as_ref().map(|v| v.referenced)),
        ("argv", raw.argv.as_ref().map(|v| v.referenced)),
        (
            "working_dir",
            raw.working_dir.as_ref().map(|v| v.referenced),
        ),
        (
            "env_allowlist",
            raw.env_allowlist.as_ref().map(|v| v.referenced),
        ),
        ("command", raw.command.as_ref().map(|v| v.referenced)),
        ("url", raw.url.as_ref().map(|v| v.referenced)),
        (
            "allowed_hosts",
            raw.allowed_hosts.as_ref().map(|v| v.referenced),
        ),
        ("method", raw.method.as_ref().map(|v| v.referenced)),
        ("query", raw.query.as_ref().map(|v| v.referenced)),
        ("headers", raw.headers.as_ref().map(|v| v.referenced)),
        ("body", raw.body.as_ref().map(|v| v.referenced)),
        (
            "forward_scope",
            raw.forward_scope.as_ref().map(|v| v.referenced),
        ),
        ("server", raw.server.as_ref().map(|v| v.referenced)),
        ("tool", raw.tool.as_ref().map(|v| v.referenced)),
        ("sandbox", raw.sandbox.as_ref().map(|v| v.referenced)),
        ("auth", raw.auth.as_ref().map(|v| v.referenced)),
        ("ca", raw.ca.as_ref().map(|v| v.referenced)),
        ("proxy", raw.proxy.as_ref().map(|v| v.referenced)),
    ];
    let allowed: &'static [&'static str] = match kind {
        RawAdapterKind::Builtin => &["name", "settings"],
        RawAdapterKind::Command => &["argv", "working_dir", "env_allowlist", "sandbox"],
        RawAdapterKind::Http => &[
            "url",
            "allowed_hosts",
            "method",
            "query",
            "headers",
            "body",
            "forward_scope",
            "auth",
            "ca",
            "proxy",
        ],
        RawAdapterKind::Mcp => &["server", "tool", "command", "url", "sandbox"],
    };
    for (field, location) in present {
        if let Some(location) = location
            && !allowed.contains(&field)
        {
            report.at(
                file,
                location,
                adapter.referenced,
                format!(
                    "{owner}: adapter field `{field}` does not apply to kind `{}`",
                    kind.as_str()
                ),
                format!(
                    "an adapter of kind `{}` takes: {}",
                    kind.as_str(),
                    allowed.join(", ")
                ),
            );
        }
    }
    allowed
}

/// A field that must not be empty.
fn non_empty(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    field: &str,
    value: &Spanned<String>,
) {
    if value.value.trim().is_empty() {
        report.spanned(
            file,
            value,
            format!("{owner}: adapter `{field}` is empty"),
            format!("give the adapter's `{field}`"),
        );
    }
}

/// A program and its fixed arguments: the program must be there.
fn argv_ok(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    field: &str,
    argv: &Spanned<Vec<String>>,
) {
    if argv
        .value
        .first()
        .is_none_or(|program| program.trim().is_empty())
    {
        report.spanned(
            file,
            argv,
            format!("{owner}: adapter `{field}` has no program"),
            format!(
                "`{field}` is the program and its fixed arguments, e.g. `[python3, tools/x.py]`"
            ),
        );
    }
}

fn builtin(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    raw: &RawAdapter,
    missing: &mut Vec<&'static str>,
) -> Option<AdapterConfig> {
    let name = raw.name.as_ref();
    match name {
        Some(name) => non_empty(report, file, owner, "name", name),
        None => missing.push("name"),
    }
    name.map(|name| AdapterConfig::Builtin {
        name: name.value.clone(),
        settings: raw
            .settings
            .as_ref()
            .map(|s| s.value.clone())
            .unwrap_or_default(),
    })
}

fn command(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    raw: &RawAdapter,
    tools_dir: &Path,
    missing: &mut Vec<&'static str>,
) -> Option<AdapterConfig> {
    match &raw.argv {
        Some(argv) => argv_ok(report, file, owner, "argv", argv),
        None => missing.push("argv"),
    }
    let mut env_allowlist = Vec::new();
    for var in raw.env_allowlist.iter().flat_map(|l| &l.value) {
        if !is_env_var_name(&var.value) {
            report.spanned(
                file,
                var,
                format!(
                    "{owner}: `{}` is not an environment variable name",
                    var.value.escape_debug()
                ),
                "use letters, digits and `_`, not starting with a digit",
            );
        }
        env_allowlist.push(var.value.clone());
    }
    env_allowlist.sort();
    env_allowlist.dedup();
    let sandbox = check_sandbox(report, file, owner, raw.sandbox.as_ref(), tools_dir);
    match (raw.argv.as_ref(), sandbox) {
        (Some(argv), Some(sandbox)) => Some(AdapterConfig::Command {
            argv: argv.value.clone(),
            working_dir: raw.working_dir.as_ref().map(|w| w.value.clone()),
            env_allowlist,
            sandbox,
        }),
        _ => None,
    }
}

fn http(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    raw: &RawAdapter,
    missing: &mut Vec<&'static str>,
) -> Option<AdapterConfig> {
    match &raw.url {
        Some(url) => non_empty(report, file, owner, "url", url),
        None => missing.push("url"),
    }
    let hosts: Vec<String> = raw
        .allowed_hosts
        .iter()
        .flat_map(|l| &l.value)
        .map(|h| h.value.clone())
        .collect();
    match &raw.allowed_hosts {
        Some(list) if list.value.is_empty() => report.spanned(
            file,
            list,
            format!("{owner}: `allowed_hosts` is empty"),
            "list the host (or host:port) the adapter may connect to",
        ),
        None => missing.push("allowed_hosts"),
        Some(_) => {}
    }
    if let Some(url) = &raw.url
        && let Err(e) = crate::policy::template::parse_url_template(&url.value)
    {
        report.spanned(
                file,
                url,
                format!("{owner}: adapter `url`: {e}"),
                "write e.g. `https://fhir.example.org/Patient/{args.patient_id}`; placeholders stand in the path and query only",
            );
    }
    let request = check_http_request(report, file, owner, raw);
    raw.url.as_ref().map(|url| AdapterConfig::Http {
        url: url.value.clone(),
        allowed_hosts: hosts,
        request,
    })
}

/// An MCP adapter: its tool and exactly one upstream (a `servers:` entry, an inline
/// stdio `command` or a `url`); `at` is (file, owner).
fn mcp(
    report: &mut Report<'_>,
    at: (&str, &str),
    adapter: &Spanned<RawAdapter>,
    servers: &BTreeMap<String, McpServer>,
    tools_dir: &Path,
    missing: &mut Vec<&'static str>,
) -> Option<AdapterConfig> {
    let (file, owner) = at;
    let raw = &adapter.value;
    match &raw.tool {
        Some(tool) => non_empty(report, file, owner, "tool", tool),
        None => missing.push("tool"),
    }
    let upstream = match (&raw.server, &raw.command, &raw.url) {
        (Some(id), None, None) => match servers.get(&id.value) {
            Some(server) => Some((
                Some(server.server_id.clone()),
                server.command.clone(),
                server.url.clone(),
                server.max_concurrency,
                server.sandbox.clone(),
            )),
            None => {
                let known: Vec<&str> = servers.keys().map(String::as_str).collect();
                report.spanned(
                    file,
                    id,
                    format!(
                        "{owner}: adapter `server` `{}` is not in the registry's `servers:`",
                        id.value.escape_debug()
                    ),
                    if known.is_empty() {
                        "define it under `servers:` with `server_id`, and `command` or `url`"
                            .to_string()
                    } else {
                        format!("known servers: {}", known.join(", "))
                    },
                );
                None
            }
        },
        (None, Some(command), None) => {
            argv_ok(report, file, owner, "command", command);
            check_sandbox(report, file, owner, raw.sandbox.as_ref(), tools_dir).map(|sandbox| {
                (
                    None,
                    Some(command.value.clone()),
                    None,
                    DEFAULT_SERVER_CONCURRENCY,
                    Some(sandbox),
                )
            })
        }
        (None, None, Some(url)) => {
            non_empty(report, file, owner, "url", url);
            Some((
                None,
                None,
                Some(url.value.clone()),
                DEFAULT_SERVER_CONCURRENCY,
                None,
            ))
        }
        _ => {
            report.spanned(
                    file,
                    adapter,
                    format!(
                        "{owner}: adapter of kind `mcp` needs exactly one of `server`, `command` or `url`"
                    ),
                    "name the server once under `servers:` and refer to it with `server: <server_id>`",
                );
            None
        }
    };
    if let Some(sandbox) = &raw.sandbox
        && raw.command.is_none()
    {
        report.spanned(
                file,
                sandbox,
                format!("{owner}: adapter `sandbox` applies only to an inline stdio `command`"),
                "give a `servers:` entry's process its `sandbox:` on the entry; an HTTP server runs elsewhere",
            );
    }
    match (raw.tool.as_ref(), upstream) {
        (Some(tool), Some((server, command, url, max_concurrency, sandbox))) => {
            Some(AdapterConfig::Mcp {
                server,
                command,
                url,
                tool: tool.value.clone(),
                max_concurrency,
                sandbox,
                env: BTreeMap::new(),
                headers: BTreeMap::new(),
                outbound: Default::default(),
            })
        }
        _ => None,
    }
}

/// The registry's `servers:` section: ids valid and unique, exactly one of `command`
/// and `url`, `max_concurrency` within bounds. Returns the valid entries by id.
pub(super) fn check_servers(
    report: &mut Report<'_>,
    file: &str,
    servers: &[Spanned<RawServer>],
    tools_dir: &Path,
) -> BTreeMap<String, McpServer> {
    let mut valid = BTreeMap::new();
    let mut seen = BTreeMap::new();
    for entry in servers {
        let before = report.problems.len();
        let raw = &entry.value;
        let id = &raw.server_id;
        let unique = check_id(report, file, "server id", id)
            && check_unique(report, file, "server id", &mut seen, id);
        let owner = format!("server `{}`", id.value.escape_debug());
        if let Some(description) = &raw.description {
            check_description(report, file, &owner, description);
        }
        match (&raw.command, &raw.url) {
            (Some(command), None) => {
                if command.value.first().is_none_or(|p| p.trim().is_empty()) {
                    report.spanned(
                        file,
                        command,
                        format!("{owner}: `command` has no program"),
                        "`command` is the server's program and its arguments, e.g. `[uvx, mcp-server-time]`",
                    );
                }
            }
            (None, Some(url)) => {
                if url.value.trim().is_empty() {
                    report.spanned(file, url, format!("{owner}: `url` is empty"), "give the server's Streamable HTTP endpoint");
                }
            }
            _ => report.spanned(
                file,
                entry,
                format!("{owner} needs exactly one of `command` or `url`"),
                "start the server with `command: [argv...]` or connect to it with `url: http://...`",
            ),
        }
        let max_concurrency = match &raw.max_concurrency {
            None => DEFAULT_SERVER_CONCURRENCY,
            Some(n) if (1..=MAX_CONCURRENCY).contains(&n.value) => n.value,
            Some(n) => {
                report.spanned(
                    file,
                    n,
                    format!("{owner}: `max_concurrency` must be 1 to {MAX_CONCURRENCY}"),
                    "how many requests may be in flight on the server's session at once",
                );
                DEFAULT_SERVER_CONCURRENCY
            }
        };
        let sandbox = match (&raw.command, &raw.sandbox) {
            (Some(_), block) => check_sandbox(report, file, &owner, block.as_ref(), tools_dir),
            (None, Some(block)) => {
                report.spanned(
                    file,
                    block,
                    format!("{owner}: `sandbox` applies only to a server started with `command`"),
                    "a server reached over `url` runs outside toolgate; confine it where it runs",
                );
                None
            }
            (None, None) => None,
        };
        if unique && report.problems.len() == before {
            valid.insert(
                id.value.clone(),
                McpServer {
                    server_id: id.value.clone(),
                    command: raw.command.as_ref().map(|c| c.value.clone()),
                    url: raw.url.as_ref().map(|u| u.value.clone()),
                    max_concurrency,
                    sandbox,
                    env: BTreeMap::new(),
                    headers: BTreeMap::new(),
                    outbound: Default::default(),
                },
            );
        }
    }
    valid
}

pub(super) fn check_redaction(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    redaction: Option<&Spanned<RawRedaction>>,
) -> Option<Redaction> {
    let Some(redaction) = redaction else {
        return Some(Redaction::Full);
    };
    let RawRedaction { mode, pointers } = &redaction.value;
    match (mode.value, pointers) {
        (RawRedactionMode::Full, None) => Some(Redaction::Full),
        (RawRedactionMode::HashOnly, None) => Some(Redaction::HashOnly),
        (RawRedactionMode::Fields, Some(pointers)) if !pointers.is_empty() => {
            let before = report.problems.len();
            for pointer in pointers {
                if !is_json_pointer(&pointer.value) {
                    report.spanned(
                        file,
                        pointer,
                        format!("{owner}: redaction pointer `{}` is not a JSON pointer", pointer.value.escape_debug()),
                        "a JSON pointer starts with `/`, e.g. `/body`; use `mode: hash_only` to keep nothing",
                    );
                }
            }
            let mut list: Vec<String> = pointers.iter().map(|p| p.value.clone()).collect();
            list.sort();
            list.dedup();
            (report.problems.len() == before).then_some(Redaction::Fields { pointers: list })
        }
        (RawRedactionMode::Fields, _) => {
            report.spanned(
                file,
                redaction,
                format!("{owner}: redaction `mode: fields` needs a non-empty `pointers` list"),
                "e.g. `{mode: fields, pointers: [/body]}`",
            );
            None
        }
        (_, Some(_)) => {
            report.spanned(
                file,
                redaction,
                format!("{owner}: redaction `pointers` only apply to `mode: fields`"),
                "remove `pointers` or use `mode: fields`",
            );
            None
        }
    }
}

// ---------------------------------------------------------------------------------------
// Cross-references

/// `adapter.phases` of a two-phase tool: only for side-effectful tools on an http,
/// command or builtin adapter; `url` phase calls for http and builtin adapters,
/// `argv` for command adapters; bounded deadlines and attempts.
pub(super) fn check_phases(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    adapter: &Spanned<RawAdapter>,
    determinism: Determinism,
    tools_dir: &Path,
) -> Option<crate::policy::Phases> {
    use crate::policy::{
        DEFAULT_PHASE_ATTEMPTS, DEFAULT_PHASE_TIMEOUT_MS, DEFAULT_TOKEN_FIELD, Phases,
    };
    let raw = adapter.value.phases.as_ref()?;
    let before = report.problems.len();
    let kind = adapter.value.kind.value;
    if kind == RawAdapterKind::Mcp {
        report.spanned(
            file,
            raw,
            format!("{owner}: adapter kind `mcp` cannot declare `phases`"),
            "two-phase tools use an http, command or builtin adapter",
        );
        return None;
    }
    if determinism != Determinism::SideEffectful {
        report.spanned(
            file,
            raw,
            format!("{owner}: `phases` is only for `determinism: side_effectful` tools"),
            "a tool without side effects has nothing to commit or roll back",
        );
    }
    let commit = phase_call(report, (file, owner), kind, "commit", &raw.value.commit);
    let rollback = phase_call(report, (file, owner), kind, "rollback", &raw.value.rollback);
    let within = raw.value.commit_within_s.value;
    if !(1..=86_400).contains(&within) {
        report.spanned(
            file,
            &raw.value.commit_within_s,
            format!("{owner}: `phases.commit_within_s` is {within}, not within 1..=86400"),
            "give the seconds a caller has to commit, at most a day",
        );
    }
    let token_field = raw
        .value
        .token_field
        .as_ref()
        .map_or(DEFAULT_TOKEN_FIELD.to_string(), |f| f.value.clone());
    if let Some(field) = &raw.value.token_field
        && !is_id(&field.value)
    {
        report.spanned(
            file,
            field,
            format!(
                "{owner}: `phases.token_field` `{}` is not a field name",
                field.value.escape_debug()
            ),
            "a top-level field of the prepare answer, e.g. `commit_token`",
        );
    }
    let max_attempts = raw
        .value
        .max_attempts
        .as_ref()
        .map_or(DEFAULT_PHASE_ATTEMPTS, |a| a.value);
    if let Some(a) = &raw.value.max_attempts
        && !(1..=10).contains(&a.value)
    {
        report.spanned(
            file,
            a,
            format!(
                "{owner}: `phases.max_attempts` is {}, not within 1..=10",
                a.value
            ),
            "commit and rollback are retried at most this many times in all",
        );
    }
    let timeout_ms = raw
        .value
        .timeout_ms
        .as_ref()
        .map_or(DEFAULT_PHASE_TIMEOUT_MS, |t| t.value);
    if let Some(t) = &raw.value.timeout_ms
        && !(1..=60_000).contains(&t.value)
    {
        report.spanned(
            file,
            t,
            format!(
                "{owner}: `phases.timeout_ms` is {}, not within 1..=60000",
                t.value
            ),
            "one commit or rollback attempt may take at most a minute",
        );
    }
    let sandbox = match (&raw.value.sandbox, kind) {
        (None, _) => None,
        (Some(block), RawAdapterKind::Command) => {
            check_sandbox(report, file, owner, Some(block), tools_dir)
        }
        (Some(block), _) => {
            report.spanned(
                file,
                block,
                format!("{owner}: `phases.sandbox` applies only to `argv` phase calls"),
                "the phases of an http or builtin adapter are requests, not processes",
            );
            None
        }
    };
    if report.problems.len() != before {
        return None;
    }
    Some(Phases {
        commit: commit?,
        rollback: rollback?,
        commit_within_s: within,
        token_field,
        max_attempts,
        timeout_ms,
        sandbox,
    })
}

/// One phase call: `url` for an http or builtin adapter, `argv` for a command adapter,
/// not empty; `at` is (file, owner).
fn phase_call(
    report: &mut Report<'_>,
    at: (&str, &str),
    kind: RawAdapterKind,
    name: &str,
    call: &Spanned<crate::policy::raw::RawPhaseCall>,
) -> Option<crate::policy::PhaseCall> {
    use crate::policy::PhaseCall;
    let (file, owner) = at;
    let wants_url = kind != RawAdapterKind::Command;
    match (&call.value.url, &call.value.argv, wants_url) {
        (Some(url), None, true) if !url.value.trim().is_empty() => {
            Some(PhaseCall::Url(url.value.clone()))
        }
        (None, Some(argv), false) if argv.value.first().is_some_and(|p| !p.trim().is_empty()) => {
            Some(PhaseCall::Argv(argv.value.clone()))
        }
        _ => {
            let want = if wants_url { "`url`" } else { "`argv`" };
            report.spanned(
                file,
                call,
                format!(
                    "{owner}: `phases.{name}` of a `{}` adapter needs exactly {want}, not empty",
                    kind.as_str()
                ),
                if wants_url {
                    "e.g. `{url: \"http://127.0.0.1:8799/filings/commit\"}` (a host of the adapter's allowed_hosts)"
                } else {
                    "e.g. `{argv: [python3, tools/x/commit.py]}`"
                },
            );
            None
        }
    }
}
