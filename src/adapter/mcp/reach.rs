//! Where an upstream MCP server is (a stdio command or a Streamable HTTP url) and what
//! its `servers:` entry adds to reaching it (its `env`, `headers`, `auth`, `ca` and
//! `proxy`), resolved with the policy's secrets.

use std::path::PathBuf;

use reqwest::header::{HeaderName, HeaderValue};

use crate::adapter::credentials::{Credential, Scrubber, TokenSource, fixed_authorization};
use crate::adapter::{AdapterEnv, SettingProblem, resolve_program};
use crate::policy::secrets::{self, SecretValue, Secrets};
use crate::policy::{AdapterConfig, OutboundSettings};

/// What a server's `servers:` entry adds to reaching it: a stdio server's
/// environment, a Streamable HTTP server's headers (its credential among them) and
/// TLS and proxy settings, and the scrubber of every secret value among them.
#[derive(Debug, Default)]
pub(crate) struct Reach {
    /// Set in the stdio server's otherwise cleared environment.
    pub(super) env: Vec<(String, SecretValue)>,
    /// Sent with every request to an HTTP server (marked sensitive when secret).
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) outbound: OutboundSettings,
    pub(super) tools_dir: PathBuf,
    pub(super) scrubber: Scrubber,
    /// The access tokens of `auth: oauth2_client_credentials`, sent as the
    /// connection's bearer token.
    pub(super) token: Option<Box<TokenSource>>,
}

impl Reach {
    /// Resolves the entry's `env`, `headers` and `auth` (bearer, basic, client
    /// credentials, mTLS) with the policy's secrets.
    pub(super) fn build(
        config: &AdapterConfig,
        secrets: &Secrets,
        env: &AdapterEnv,
    ) -> Result<Reach, Vec<SettingProblem>> {
        let AdapterConfig::Mcp {
            env: entry_env,
            headers: entry_headers,
            outbound,
            ..
        } = config
        else {
            return Ok(Reach::default());
        };
        let mut problems = Vec::new();
        let mut values = Vec::new();
        let mut resolve = |what: &str, text: &str| match secrets::resolve(text, secrets) {
            Some(value) => {
                if !secrets::secret_ids(text).is_empty() {
                    values.push(value.clone());
                }
                Some(value)
            }
            None => {
                problems.push(SettingProblem::new(format!(
                    "{what} refers to a secret that does not resolve"
                )));
                None
            }
        };
        let mut reach_env = Vec::new();
        for (name, text) in entry_env {
            if let Some(value) = resolve(&format!("env `{name}`"), text) {
                reach_env.push((name.clone(), SecretValue::new(&value)));
            }
        }
        let mut resolved_headers = Vec::new();
        for (name, text) in entry_headers {
            let secret = !secrets::secret_ids(text).is_empty();
            if let Some(value) = resolve(&format!("header `{name}`"), text) {
                resolved_headers.push((name, value, secret));
            }
        }
        let mut headers = Vec::new();
        for (name, value, secret) in resolved_headers {
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                (Ok(n), Ok(mut v)) => {
                    v.set_sensitive(secret);
                    headers.push((n, v));
                }
                _ => problems.push(SettingProblem::new(format!(
                    "header `{name}` is not a valid header"
                ))),
            }
        }
        let mut token = None;
        match &outbound.auth {
            None | Some(crate::policy::OutboundAuth::Mtls { .. }) => {}
            Some(auth @ crate::policy::OutboundAuth::Oauth2ClientCredentials(_)) => {
                // The token endpoint is reached like the server: its CA and proxy.
                let built = crate::adapter::outbound_client(outbound, &env.tools_dir)
                    .and_then(|b| {
                        b.build()
                            .map_err(|e| format!("cannot build the http client: {e}"))
                    })
                    .and_then(|client| {
                        Credential::build(Some(auth), secrets, &client, &mut values)
                    });
                match built {
                    Ok(Credential::ClientCredentials(source)) => token = Some(source),
                    Ok(_) => {}
                    Err(e) => problems.push(SettingProblem::new(e)),
                }
            }
            Some(
                auth @ (crate::policy::OutboundAuth::Bearer(_)
                | crate::policy::OutboundAuth::Basic { .. }),
            ) => match fixed_authorization(Some(auth), secrets, &mut values) {
                Ok(Some(value)) => headers.push((hyper::header::AUTHORIZATION, value)),
                Ok(None) => {}
                Err(e) => problems.push(SettingProblem::new(e)),
            },
            Some(other) => problems.push(
                SettingProblem::new(format!(
                    "`auth: {}` is not available for an MCP server in this build",
                    other.kind()
                ))
                .help("use `bearer`, `basic` or `oauth2_client_credentials` with a secret, or `mtls`; `token_exchange` needs one caller per connection, and a server's connection is shared"),
            ),
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Reach {
            env: reach_env,
            headers,
            outbound: outbound.clone(),
            tools_dir: env.tools_dir.clone(),
            scrubber: Scrubber::new(values),
            token,
        })
    }
}

/// Where the upstream server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// Started by the gateway; spoken to over its stdin and stdout.
    Stdio {
        /// argv[0] as written in the registry, for messages.
        argv0: String,
        /// The program: absolute, resolved on PATH at build for bare names.
        program: PathBuf,
        args: Vec<String>,
        working_dir: PathBuf,
    },
    /// A Streamable HTTP endpoint (`http://` or `https://`, verified against the
    /// system's roots or the entry's `ca`).
    Http { url: String },
}

impl Upstream {
    /// Checks the settings of an `mcp` adapter: exactly one of a command (whose
    /// program exists) or an `http://` or `https://` url.
    pub(crate) fn build(
        command: Option<&[String]>,
        url: Option<&str>,
        env: &AdapterEnv,
    ) -> Result<Upstream, Vec<SettingProblem>> {
        match (command, url) {
            (Some(argv), None) => stdio(argv, env),
            (None, Some(url)) => http(url).map_err(|p| vec![p]),
            _ => Err(vec![
                SettingProblem::new("an `mcp` adapter needs exactly one of `command` or `url`")
                    .help("start the server with `command: [argv...]` or reach it with `url: http://...`"),
            ]),
        }
    }

    /// How the upstream is named in messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Upstream::Stdio { argv0, .. } => format!("`{argv0}`"),
            Upstream::Http { url } => format!("`{url}`"),
        }
    }
}

fn stdio(argv: &[String], env: &AdapterEnv) -> Result<Upstream, Vec<SettingProblem>> {
    let mut problems = Vec::new();
    let program = match argv.first() {
        None => {
            problems.push(SettingProblem::new("`command` is empty").help(
                "give the server's program and arguments, e.g. [\"uvx\", \"mcp-server-time\"]",
            ));
            None
        }
        Some(argv0) => resolve_program(argv0).map_err(|p| problems.push(p)).ok(),
    };
    for (i, arg) in argv.iter().enumerate() {
        if arg.contains('\0') {
            problems.push(SettingProblem::new(format!(
                "`command[{i}]` contains a nul byte"
            )));
        }
    }
    match program {
        Some(program) if problems.is_empty() => Ok(Upstream::Stdio {
            argv0: argv.first().cloned().unwrap_or_default(),
            program,
            args: argv.iter().skip(1).cloned().collect(),
            working_dir: env.tools_dir.clone(),
        }),
        _ => Err(problems),
    }
}

fn http(url: &str) -> Result<Upstream, SettingProblem> {
    let bad = |why: &str| {
        SettingProblem::new(format!("url `{url}` {why}"))
            .help("give the server's Streamable HTTP endpoint, e.g. http://127.0.0.1:8000/mcp")
    };
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return Err(bad("is not an absolute http:// or https:// url"));
    };
    let uri: hyper::Uri = url.parse().map_err(|_| bad("is not a valid url"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(bad(
            "has user info; credentials do not belong in the registry",
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("has no host"));
    }
    Ok(Upstream::Http {
        url: url.to_string(),
    })
}
