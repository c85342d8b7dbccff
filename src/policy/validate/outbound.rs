//! Validation rules, outbound credentials: the registry's `secrets:`, `${env:VAR}` in
//! urls and hosts (resolved before the adapters are checked), where a `${secret:ID}`
//! may stand (adapter `headers`, `auth` settings, a stdio server's `env`; anywhere
//! else in the three files is a problem at its line and column), and `auth`, `ca`,
//! `proxy` of http adapters and `url` servers.

use super::*;
use crate::policy::model::{OutboundAuth, OutboundSettings, TokenGrant};
use crate::policy::raw::{RawAuth, RawSecret, RawServer};
use crate::policy::secrets::{self, Secret, SecretSource, Secrets};

/// Byte ranges of the scalars a placeholder may stand in.
#[derive(Default)]
pub(super) struct Allowed {
    ranges: Vec<(u64, u64)>,
}

impl Allowed {
    fn add<T>(&mut self, value: &Spanned<T>) {
        let span = value.referenced.span();
        if let (Some(offset), Some(len)) = (span.byte_offset(), span.byte_len()) {
            self.ranges.push((offset, offset + len.max(1)));
        }
    }

    fn contains(&self, at: u64) -> bool {
        self.ranges
            .iter()
            .any(|(start, end)| *start <= at && at < *end)
    }
}

/// Every `${env:VAR}` of the registry's urls, hosts and proxies replaced by the
/// variable's value (each problem located); the values resolved are recorded. Returns
/// where `${env:` may stand.
pub(super) fn resolve_registry_env(
    report: &mut Report<'_>,
    file: &str,
    raw: &mut RegistryFile,
    env: &dyn Fn(&str) -> Option<String>,
    resolved: &mut BTreeMap<String, String>,
) -> Allowed {
    let mut allowed = Allowed::default();
    let mut fields: Vec<&mut Spanned<String>> = Vec::new();
    for server in &mut raw.servers {
        let server = &mut server.value;
        fields.extend(server.url.as_mut());
        fields.extend(server.proxy.as_mut());
        if let Some(auth) = server.auth.as_mut() {
            fields.extend(token_urls(&mut auth.value));
        }
    }
    for tool in &mut raw.tools {
        let adapter = &mut tool.value.adapter.value;
        fields.extend(adapter.url.as_mut());
        fields.extend(adapter.proxy.as_mut());
        if let Some(hosts) = adapter.allowed_hosts.as_mut() {
            fields.extend(hosts.value.iter_mut());
        }
        if let Some(phases) = adapter.phases.as_mut() {
            let phases = &mut phases.value;
            fields.extend(phases.commit.value.url.as_mut());
            fields.extend(phases.rollback.value.url.as_mut());
        }
        if let Some(auth) = adapter.auth.as_mut() {
            fields.extend(token_urls(&mut auth.value));
        }
    }
    for field in fields {
        allowed.add(field);
        if !field.value.contains("${env:") {
            continue;
        }
        match secrets::resolve_env(&field.value, env, resolved) {
            Ok(text) => field.value = text,
            Err(e) => report.spanned(
                file,
                field,
                format!("`{}`: {e}", field.value.escape_debug()),
                "`${env:VAR}` stands for a host, a port or a scheme; set the variable to plain host or port text before loading",
            ),
        }
    }
    allowed
}

fn token_urls(auth: &mut RawAuth) -> Vec<&mut Spanned<String>> {
    let mut urls = Vec::new();
    if let Some(grant) = auth.oauth2_client_credentials.as_mut() {
        urls.push(&mut grant.value.token_url);
    }
    if let Some(grant) = auth.token_exchange.as_mut() {
        urls.push(&mut grant.value.token_url);
    }
    urls
}

/// The `secrets:` section: ids valid and unique, exactly one source, every value read
/// now under the rules of `policy::secrets` (unless `read` is false: `policy diff`
/// compares ids and sources, never values, and runs where the files are not).
pub(super) fn check_secrets(
    report: &mut Report<'_>,
    file: &str,
    raw: &[Spanned<RawSecret>],
    env: &dyn Fn(&str) -> Option<String>,
    tools_dir: &Path,
    read: bool,
) -> (Secrets, BTreeSet<String>) {
    let mut secrets = Secrets::new();
    let mut declared = BTreeSet::new();
    let mut seen = BTreeMap::new();
    for entry in raw {
        let id = &entry.value.id;
        if !(check_id(report, file, "secret id", id)
            && check_unique(report, file, "secret id", &mut seen, id))
        {
            continue;
        }
        declared.insert(id.value.clone());
        let from = &entry.value.from;
        let owner = format!("secret `{}`", id.value);
        let (source, value) = match (&from.value.env, &from.value.file) {
            (Some(var), None) => {
                if !is_env_var_name(&var.value) {
                    report.spanned(
                        file,
                        var,
                        format!(
                            "{owner}: `{}` is not an environment variable name",
                            var.value.escape_debug()
                        ),
                        "e.g. `from: {env: FHIR_CLIENT_SECRET}`",
                    );
                    continue;
                }
                let value = if read {
                    secrets::read_env_secret(&var.value, env)
                } else {
                    Ok(secrets::SecretValue::new("policy-review-placeholder"))
                };
                (
                    SecretSource::Env(var.value.clone()),
                    value.map_err(|e| (var, e)),
                )
            }
            (None, Some(path)) => {
                let resolved = tools_dir.join(&path.value);
                let value = if read {
                    secrets::read_file_secret(&resolved)
                } else {
                    Ok(secrets::SecretValue::new("policy-review-placeholder"))
                };
                (
                    SecretSource::File(path.value.clone().into()),
                    value.map_err(|e| (path, e)),
                )
            }
            _ => {
                report.spanned(
                    file,
                    from,
                    format!("{owner}: `from` needs exactly one of `env` and `file`"),
                    "write `from: {env: VAR}` or `from: {file: /run/secrets/NAME}`",
                );
                continue;
            }
        };
        match value {
            Ok(value) => {
                secrets.insert(
                    id.value.clone(),
                    Secret {
                        id: id.value.clone(),
                        source,
                        value,
                    },
                );
            }
            Err((at, e)) => report.spanned(
                file,
                at,
                format!("{owner}: {source}: {e}"),
                "a secret file is a regular file only its owner can write and others cannot read (`chmod 600`; group-readable for one of the process's groups), reached through no symlink leaving its directory",
            ),
        }
    }
    (secrets, declared)
}

/// The references of a text that may hold secrets: each must name a declared secret.
fn check_refs(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    what: &str,
    value: &Spanned<String>,
    declared: &BTreeSet<String>,
) {
    let parts = match secrets::secret_parts(&value.value) {
        Ok(parts) => parts,
        Err(e) => {
            report.spanned(
                file,
                value,
                format!("{owner}: {what}: {e}"),
                "refer to a secret as `${secret:ID}`, an id of the registry's `secrets:`",
            );
            return;
        }
    };
    for part in parts {
        if let secrets::SecretPart::Secret(id) = part
            && !declared.contains(&id)
        {
            report.spanned(
                file,
                value,
                format!("{owner}: {what}: `${{secret:{id}}}` is not in the registry's `secrets:`"),
                match did_you_mean(&id, declared) {
                    Some(guess) => format!("did you mean `{guess}`?"),
                    None => {
                        "declare it under `secrets:` with `{id, from: {env: VAR} | {file: PATH}}`"
                            .to_string()
                    }
                },
            );
        }
    }
}

/// `${secret:` and `${env:` outside the places they may stand in the registry.
pub(super) fn check_placements(
    report: &mut Report<'_>,
    file: &SourceFile,
    secret_allowed: &Allowed,
    env_allowed: Option<&Allowed>,
) {
    let Ok(text) = std::str::from_utf8(&file.bytes) else {
        return;
    };
    check_stray(
        report,
        &file.display,
        text,
        "${secret:",
        secret_allowed,
        "a secret is used only in an adapter's `headers`, its `auth` settings and a stdio server's `env`",
    );
    if let Some(env_allowed) = env_allowed {
        check_stray(
            report,
            &file.display,
            text,
            "${env:",
            env_allowed,
            "`${env:VAR}` stands only in urls, `allowed_hosts`, `proxy` and `token_url`",
        );
    }
}

/// `${secret:` and `${env:` anywhere in roles.yaml or lanes.yaml.
pub(super) fn check_placements_elsewhere(report: &mut Report<'_>, file: Option<&SourceFile>) {
    let Some(file) = file else {
        return;
    };
    let Ok(text) = std::str::from_utf8(&file.bytes) else {
        return;
    };
    for needle in ["${secret:", "${env:"] {
        check_stray(
            report,
            &file.display,
            text,
            needle,
            &Allowed::default(),
            "secrets and `${env:VAR}` stand only in the tool registry's adapters",
        );
    }
}

/// `${secret:` or `${env:` anywhere outside the places they may stand in `text` (a
/// registry, roles or lanes file): each a problem at its line and column.
fn check_stray(
    report: &mut Report<'_>,
    file: &str,
    text: &str,
    needle: &str,
    allowed: &Allowed,
    help: &str,
) {
    for (at, _) in text.match_indices(needle) {
        if allowed.contains(at as u64) {
            continue;
        }
        let before = &text[..at];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = text[line_start..at].chars().count() + 1;
        if text[line_start..at].trim_start().starts_with('#') {
            // A comment.
            continue;
        }
        report.problems.push(Problem::at(
            file,
            line,
            column,
            format!("`{needle}...}}` may not stand here"),
            Some(help),
        ));
    }
}

/// The `auth`, `ca`, `proxy` and secret references of every http adapter and `servers:`
/// entry, put into the tools already built. Returns where `${secret:` may stand.
pub(super) fn check_outbound(
    report: &mut Report<'_>,
    file: &str,
    raw: &RegistryFile,
    declared: &BTreeSet<String>,
    tools: &mut BTreeMap<String, Tool>,
) -> Allowed {
    let mut allowed = Allowed::default();
    let mut by_server: BTreeMap<&str, ServerSettings> = BTreeMap::new();
    for entry in &raw.servers {
        let server = &entry.value;
        let owner = format!("server `{}`", server.server_id.value.escape_debug());
        let settings = check_server(report, file, &owner, server, declared, &mut allowed);
        by_server.insert(&server.server_id.value, settings);
    }
    for entry in &raw.tools {
        let raw_tool = &entry.value;
        let adapter = &raw_tool.adapter.value;
        let owner = format!("tool `{}`", raw_tool.tool_name.value.escape_debug());
        for (name, value) in adapter.headers.iter().flat_map(|h| &h.value) {
            allowed.add(value);
            check_refs(report, file, &owner, "header", value, declared);
            if name.eq_ignore_ascii_case("authorization")
                && adapter
                    .auth
                    .as_ref()
                    .is_some_and(|a| a.value.mtls.is_none())
            {
                report.spanned(
                    file,
                    value,
                    format!("{owner}: header `authorization` and `auth` both set the credential"),
                    "keep one: `auth` (bearer, basic, oauth2_client_credentials) or the header",
                );
            }
        }
        let outbound = outbound_settings(
            report,
            file,
            &owner,
            (
                adapter.auth.as_ref(),
                adapter.ca.as_ref(),
                adapter.proxy.as_ref(),
            ),
            declared,
            &mut allowed,
        );
        let Some(tool) = tools.get_mut(&raw_tool.tool_name.value) else {
            continue;
        };
        match &mut tool.adapter {
            AdapterConfig::Http { request, .. } => request.outbound = outbound,
            AdapterConfig::Mcp {
                server: Some(id),
                env,
                headers,
                outbound,
                ..
            } => {
                if let Some((e, h, o)) = by_server.get(id.as_str()) {
                    *env = e.clone();
                    *headers = h.clone();
                    *outbound = o.clone();
                }
            }
            _ => {}
        }
    }
    allowed
}

/// An entry's `auth`, `ca` and `proxy`, as written.
type Given<'a> = (
    Option<&'a Spanned<RawAuth>>,
    Option<&'a Spanned<String>>,
    Option<&'a Spanned<String>>,
);

type ServerSettings = (
    BTreeMap<String, String>,
    BTreeMap<String, String>,
    OutboundSettings,
);

fn check_server(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    server: &RawServer,
    declared: &BTreeSet<String>,
    allowed: &mut Allowed,
) -> ServerSettings {
    let mut env = BTreeMap::new();
    if let Some(block) = &server.env {
        if server.command.is_none() {
            report.spanned(
                file,
                block,
                format!("{owner}: `env` applies only to a server started with `command`"),
                "give a `url` server its credential with `headers` or `auth`",
            );
        }
        for (name, value) in &block.value {
            allowed.add(value);
            if !is_env_var_name(name) {
                report.spanned(
                    file,
                    value,
                    format!(
                        "{owner}: `{}` is not an environment variable name",
                        name.escape_debug()
                    ),
                    "names are letters, digits and `_`, not starting with a digit",
                );
            }
            check_refs(report, file, owner, "env", value, declared);
            env.insert(name.clone(), value.value.clone());
        }
    }
    let mut headers = BTreeMap::new();
    if let Some(block) = &server.headers {
        if server.url.is_none() {
            report.spanned(
                file,
                block,
                format!("{owner}: `headers` apply only to a server reached over `url`"),
                "give a stdio server its credential with `env`",
            );
        }
        for (name, value) in &block.value {
            allowed.add(value);
            let lower = name.to_ascii_lowercase();
            if lower.is_empty()
                || !lower
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
                || matches!(
                    lower.as_str(),
                    "host"
                        | "content-length"
                        | "transfer-encoding"
                        | "connection"
                        | "mcp-session-id"
                        | "mcp-protocol-version"
                )
            {
                report.spanned(
                    file,
                    value,
                    format!(
                        "{owner}: `{}` is not a header the registry may set",
                        name.escape_debug()
                    ),
                    "set request headers such as `authorization` or `x-api-key`",
                );
            }
            check_refs(report, file, owner, "header", value, declared);
            headers.insert(lower, value.value.clone());
        }
    }
    let given = (
        server.auth.as_ref(),
        server.ca.as_ref(),
        server.proxy.as_ref(),
    );
    if server.url.is_none()
        && let Some(at) = given
            .0
            .map(|a| a.referenced)
            .or(given.1.map(|c| c.referenced))
            .or(given.2.map(|p| p.referenced))
    {
        report.at(
            file,
            at,
            at,
            format!("{owner}: `auth`, `ca` and `proxy` apply only to a server reached over `url`"),
            "give a stdio server its credential with `env`",
        );
    }
    let outbound = outbound_settings(report, file, owner, given, declared, allowed);
    (env, headers, outbound)
}

fn outbound_settings(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    (auth, ca, proxy): Given<'_>,
    declared: &BTreeSet<String>,
    allowed: &mut Allowed,
) -> OutboundSettings {
    let mut settings = OutboundSettings {
        auth: None,
        ca: ca.map(|c| c.value.clone()),
        proxy: None,
    };
    if let Some(proxy) = proxy {
        settings.proxy = check_proxy(report, file, owner, proxy);
    }
    let Some(auth) = auth else {
        return settings;
    };
    let raw = &auth.value;
    let given = [
        raw.bearer.is_some(),
        raw.basic.is_some(),
        raw.oauth2_client_credentials.is_some(),
        raw.token_exchange.is_some(),
        raw.mtls.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        report.spanned(
            file,
            auth,
            format!("{owner}: `auth` needs exactly one kind"),
            "one of `bearer`, `basic`, `oauth2_client_credentials`, `token_exchange`, `mtls`",
        );
        return settings;
    }
    let mut secret_field = |report: &mut Report<'_>,
                            what: &str,
                            value: &Spanned<String>,
                            required: bool| {
        allowed.add(value);
        check_refs(report, file, owner, what, value, declared);
        if required && secrets::secret_ids(&value.value).is_empty() {
            report.spanned(
                file,
                value,
                format!("{owner}: auth `{what}` is written in the registry instead of referring to a secret"),
                "declare the credential under `secrets:` and write `${secret:ID}` here",
            );
        }
        value.value.clone()
    };
    settings.auth = if let Some(token) = &raw.bearer {
        Some(OutboundAuth::Bearer(secret_field(
            report, "bearer", token, true,
        )))
    } else if let Some(basic) = &raw.basic {
        Some(OutboundAuth::Basic {
            username: secret_field(report, "username", &basic.value.username, false),
            password: secret_field(report, "password", &basic.value.password, true),
        })
    } else if let Some(grant) = raw
        .oauth2_client_credentials
        .as_ref()
        .or(raw.token_exchange.as_ref())
    {
        let g = &grant.value;
        if let Err(e) = check_token_url(&g.token_url.value) {
            report.spanned(
                file,
                &g.token_url,
                format!("{owner}: `token_url`: {e}"),
                "the token endpoint is an https url (plain http only to a loopback address)",
            );
        }
        let exchange = raw.token_exchange.is_some();
        check_actor(report, (file, owner), g, exchange);
        let grant = TokenGrant {
            token_url: g.token_url.value.clone(),
            client_id: secret_field(report, "client_id", &g.client_id, false),
            client_secret: secret_field(report, "client_secret", &g.client_secret, true),
            scope: g.scope.as_ref().map(|s| s.value.clone()),
            audience: g.audience.as_ref().map(|s| s.value.clone()),
            actor_token: g
                .actor_token
                .as_ref()
                .map(|a| secret_field(report, "actor_token", a, true)),
            actor_token_type: g.actor_token_type.as_ref().map(|t| t.value.clone()),
        };
        Some(if exchange {
            OutboundAuth::TokenExchange(grant)
        } else {
            OutboundAuth::Oauth2ClientCredentials(grant)
        })
    } else if let Some(mtls) = &raw.mtls {
        if let Some(mtls_ca) = &mtls.value.ca {
            if ca.is_some() {
                report.spanned(
                    file,
                    mtls_ca,
                    format!("{owner}: `ca` is given twice (in `mtls` and beside `auth`)"),
                    "give the upstream's CA once",
                );
            }
            settings.ca = Some(mtls_ca.value.clone());
        }
        Some(OutboundAuth::Mtls {
            cert: mtls.value.cert.value.clone(),
            key: mtls.value.key.value.clone(),
        })
    } else {
        None
    };
    settings
}

/// A `proxy:`: an `http://host:port` url without credentials or path.
fn check_proxy(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    proxy: &Spanned<String>,
) -> Option<String> {
    match reqwest::Url::parse(&proxy.value) {
        Ok(url)
            if url.scheme() == "http"
                && url.host_str().is_some()
                && url.username().is_empty()
                && url.password().is_none()
                && matches!(url.path(), "" | "/") =>
        {
            Some(proxy.value.clone())
        }
        _ => {
            report.spanned(
                file,
                proxy,
                format!("{owner}: `proxy` `{}` is not an `http://host:port` url", proxy.value.escape_debug()),
                "give the proxy as `http://proxy.internal:3128` (https upstreams go through it with CONNECT)",
            );
            None
        }
    }
}

/// `actor_token` only on `token_exchange`, and `actor_token_type` only beside an
/// `actor_token`, as a token type URN; `at` is (file, owner).
fn check_actor(
    report: &mut Report<'_>,
    at: (&str, &str),
    g: &crate::policy::raw::RawTokenGrant,
    exchange: bool,
) {
    let (file, owner) = at;
    if let (false, Some(actor)) = (exchange, &g.actor_token) {
        report.spanned(
            file,
            actor,
            format!("{owner}: `actor_token` applies only to `token_exchange`"),
            "remove it",
        );
    }
    if let Some(kind) = &g.actor_token_type {
        if g.actor_token.is_none() {
            report.spanned(
                file,
                kind,
                format!("{owner}: `actor_token_type` without an `actor_token`"),
                "give the `actor_token` (a `${secret:ID}`), or remove `actor_token_type`",
            );
        } else if !kind.value.starts_with("urn:")
            || kind.value.len() > 256
            || !kind.value.bytes().all(|b| b.is_ascii_graphic())
        {
            report.spanned(
                file,
                kind,
                format!(
                    "{owner}: `actor_token_type` `{}` is not a token type URN",
                    kind.value.escape_debug()
                ),
                "write an RFC 8693 token type, e.g. urn:ietf:params:oauth:token-type:jwt",
            );
        }
    }
}

/// A token endpoint: an absolute `https` url, or `http` to a loopback address.
fn check_token_url(text: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(text)
        .map_err(|e| format!("`{}` is not a url: {e}", text.escape_debug()))?;
    let loopback = crate::policy::identity::is_loopback_url(&url);
    if !url.username().is_empty() || url.password().is_some() {
        return Err("it carries user info".to_string());
    }
    match url.scheme() {
        "https" if url.host().is_some() => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err(format!(
            "`{}` is plain http to a host that is not loopback",
            text.escape_debug()
        )),
        _ => Err(format!("`{}` is not an https url", text.escape_debug())),
    }
}

/// A `token_exchange` tool exchanges the caller's verified JWT: every role that can
/// reach it (through a lane that lists it) must prove itself with a `jwt` credential.
/// Returns whether none is reported.
pub(super) fn check_token_exchange_callers(
    report: &mut Report<'_>,
    file: &str,
    raw: &RegistryFile,
    roles: &BTreeMap<String, Role>,
    lanes: &BTreeMap<String, Lane>,
    tools: &BTreeMap<String, Tool>,
) -> bool {
    let before = report.problems.len();
    for entry in &raw.tools {
        let name = &entry.value.tool_name.value;
        let Some(tool) = tools.get(name) else {
            continue;
        };
        let exchanges = matches!(
            tool.adapter.outbound().and_then(|o| o.auth.as_ref()),
            Some(OutboundAuth::TokenExchange(_))
        );
        if !exchanges {
            continue;
        }
        let without_jwt: Vec<&str> = roles
            .values()
            .filter(|role| !matches!(role.credential, Credential::Jwt(_)))
            .filter(|role| {
                role.lanes.iter().any(|lane| {
                    lanes
                        .get(lane)
                        .is_some_and(|l| l.tools.iter().any(|t| t == name))
                })
            })
            .map(|role| role.role_id.as_str())
            .collect();
        if without_jwt.is_empty() {
            continue;
        }
        let at = entry
            .value
            .adapter
            .value
            .auth
            .as_ref()
            .map_or(entry.value.adapter.referenced, |a| a.referenced);
        report.at(
            file,
            at,
            entry.referenced,
            format!(
                "tool `{name}`: `token_exchange` needs the caller's JWT, but roles without a `jwt` credential can reach it: {}",
                without_jwt.join(", ")
            ),
            "give those roles a `jwt` credential, or take the tool out of their lanes",
        );
    }
    report.problems.len() == before
}
