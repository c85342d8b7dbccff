//! The http adapter: POSTs a call's arguments as JSON to an upstream and returns the
//! JSON it answers. [`Upstream`] is also the client of builtins that call out
//! (`file_with_court`).
//!
//! INVARIANT: a request only ever goes to a host:port in the tool's `allowed_hosts`,
//! checked when the adapter is built and again before every request; redirects are
//! not followed and no proxy is used. `https://` upstreams are verified against the
//! system's CA roots (`SSL_CERT_FILE` to trust a private CA); the client is the
//! project's one HTTP stack (`crate::outbound`).
//! INVARIANT: an answer body is read chunk by chunk and refused as soon as it would pass
//! the cap; no more than the cap (plus one network chunk) is ever held.

use std::time::Duration;

use bytes::BytesMut;
use hyper::header::{
    ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, USER_AGENT,
};
use hyper::http::uri::{Authority, Scheme};
use hyper::{StatusCode, Uri};
use serde_json::Value;

use serde_json::{Map, json};

use super::credentials::{Credential, Scrubber};

mod answer;
mod arguments;

use super::{
    ExecContext, ExecError, SettingProblem, output_hard_cap, parse_output, truncate,
    unsafe_argument,
};
use crate::canonical::to_canonical_bytes;
use crate::diagnostic::Reason;
use crate::diagnostic::Refusal;
use crate::outbound::error_chain;
use crate::policy::Tool;
use crate::policy::secrets::{self, Secrets};
use crate::policy::template::{
    PlaceholderSource, Template, TemplatePart, encode_component, parse_url_template,
};
use crate::policy::{HttpBody, HttpMethod, HttpRequestModel};
use answer::map_answer;
pub(crate) use arguments::check_url_arguments;

/// How long connecting may take before the upstream counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How much of an error answer's body goes into the error message.
const ERROR_BODY_BYTES: usize = 1024;
/// Idle pooled connections are closed after this long.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// An upstream's answer, read in full (up to the cap).
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// `work`, or `ExecError::Timeout` at the call's deadline (dropping the work aborts the
/// request and its connection).
async fn within<T>(
    ctx: &ExecContext<'_>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, ExecError> {
    tokio::time::timeout_at(ctx.deadline, work)
        .await
        .map_err(|_| ExecError::Timeout)
}

/// One allowed host, `host` (any port) or `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostPattern {
    /// Lowercase host, IPv6 literals in brackets.
    host: String,
    port: Option<u16>,
}

/// The hosts an adapter may reach.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostAllowlist {
    patterns: Vec<HostPattern>,
}

impl HostAllowlist {
    /// Parses `host` or `host:port` entries; returns the entries that do not parse.
    pub(crate) fn parse(entries: &[String]) -> Result<Self, Vec<SettingProblem>> {
        let mut patterns = Vec::new();
        let mut problems = Vec::new();
        for entry in entries {
            match entry.parse::<Authority>() {
                Ok(a) if !entry.contains('@') && !a.host().is_empty() => {
                    patterns.push(HostPattern {
                        host: a.host().to_ascii_lowercase(),
                        port: a.port_u16(),
                    })
                }
                _ => problems.push(
                    SettingProblem::new(format!(
                        "allowed host `{entry}` is not `host` or `host:port`"
                    ))
                    .help("write entries like `127.0.0.1:8799` or `api.example.com`"),
                ),
            }
        }
        if problems.is_empty() {
            Ok(HostAllowlist { patterns })
        } else {
            Err(problems)
        }
    }

    /// Whether `uri` (an absolute http(s) URI) points at an allowed host and port. An
    /// entry without a port allows every port of that host.
    pub(crate) fn allows(&self, uri: &Uri) -> bool {
        let Some(authority) = uri.authority() else {
            return false;
        };
        let port = authority.port_u16().or(match uri.scheme_str() {
            Some("http") => Some(80),
            Some("https") => Some(443),
            _ => None,
        });
        self.allows_host(authority.host(), port)
    }

    /// Whether the client's own reading of the URL (the one it connects to) points at
    /// an allowed host and port too, so two URL parsers cannot disagree about where a
    /// request goes.
    fn allows_url(&self, url: &reqwest::Url) -> bool {
        match url.host_str() {
            Some(host) => self.allows_host(host, url.port_or_known_default()),
            None => false,
        }
    }

    fn allows_host(&self, host: &str, port: Option<u16>) -> bool {
        let host = host.to_ascii_lowercase();
        self.patterns
            .iter()
            .any(|p| p.host == host && (p.port.is_none() || p.port == port))
    }

    /// The entries, for messages.
    fn describe(&self) -> String {
        let entries: Vec<String> = self
            .patterns
            .iter()
            .map(|p| match p.port {
                Some(port) => format!("{}:{port}", p.host),
                None => p.host.clone(),
            })
            .collect();
        entries.join(", ")
    }
}

/// An http upstream: a fixed URL, its allowlist and a pooled client.
#[derive(Debug)]
pub(crate) struct Upstream {
    uri: Uri,
    /// `uri` as the client reads it.
    url: reqwest::Url,
    /// `host:port` of `uri`, for messages (never includes credentials: URLs with
    /// user info are refused at build).
    label: String,
    allowed: HostAllowlist,
    /// One client per adapter, so connections are pooled across calls.
    client: reqwest::Client,
}

impl Upstream {
    /// Checks the URL (absolute `http://` or `https://`, no user info, host in
    /// `allowed_hosts`) and builds the client. Needs no tokio runtime.
    pub(crate) fn build(url: &str, allowed_hosts: &[String]) -> Result<Self, Vec<SettingProblem>> {
        let client =
            new_client(crate::outbound::builder()).map_err(|e| vec![SettingProblem::new(e)])?;
        Upstream::build_with(url, allowed_hosts, client)
    }

    /// [`Upstream::build`] with a client of the upstream's own TLS and proxy settings.
    pub(crate) fn build_with(
        url: &str,
        allowed_hosts: &[String],
        client: reqwest::Client,
    ) -> Result<Self, Vec<SettingProblem>> {
        let mut problems = Vec::new();
        let allowed = match HostAllowlist::parse(allowed_hosts) {
            Ok(a) => a,
            Err(found) => {
                problems.extend(found);
                HostAllowlist::default()
            }
        };
        if allowed_hosts.is_empty() {
            problems.push(
                SettingProblem::new("`allowed_hosts` is empty")
                    .help("list the host:port of the url in `allowed_hosts`"),
            );
        }
        let uri = match url.parse::<Uri>() {
            Ok(uri) => Some(uri),
            Err(e) => {
                problems.push(
                    SettingProblem::new(format!("url `{url}` does not parse: {e}"))
                        .help("write an absolute url like `http://127.0.0.1:8799/path`"),
                );
                None
            }
        };
        if let Some(uri) = &uri {
            if !matches!(uri.scheme(), Some(s) if *s == Scheme::HTTP || *s == Scheme::HTTPS)
                || uri.authority().is_none()
            {
                problems.push(
                    SettingProblem::new(format!("url `{url}` is not an absolute http(s) url"))
                        .help("write an absolute url like `http://127.0.0.1:8799/path` or `https://api.example.com/path`"),
                );
            } else if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
                problems.push(
                    SettingProblem::new("url carries user info (credentials)")
                        .help("remove `user:password@` from the url; credentials do not belong in the registry"),
                );
            } else if !allowed_hosts.is_empty() && !allowed.allows(uri) {
                problems.push(
                    SettingProblem::new(format!(
                        "url `{url}` points at a host not in its own `allowed_hosts` ({})",
                        allowed.describe()
                    ))
                    .help("add the url's host:port to `allowed_hosts`, or fix the url"),
                );
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let Some(uri) = uri else {
            return Err(problems);
        };
        let url = match reqwest::Url::parse(url) {
            Ok(parsed) if allowed.allows_url(&parsed) => parsed,
            _ => {
                return Err(vec![
                    SettingProblem::new(format!(
                        "url `{url}` is read differently by the http client"
                    ))
                    .help("write the url plainly: a host name or IP address, an optional port, a path"),
                ]);
            }
        };
        let label = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        Ok(Upstream {
            uri,
            url,
            label,
            allowed,
            client,
        })
    }

    /// The allowlist, for argument checks.
    pub(crate) fn allowed(&self) -> &HostAllowlist {
        &self.allowed
    }

    /// POSTs `body` as JSON and returns the JSON answer, within `ctx.deadline`; the
    /// answer body is read up to `cap` bytes.
    pub(crate) async fn post_json(
        &self,
        body: &Value,
        ctx: &ExecContext<'_>,
        cap: usize,
    ) -> Result<Value, ExecError> {
        self.post_json_with(body, ctx, cap, None).await
    }

    /// [`Upstream::post_json`] with an `Authorization` value (a two-phase tool's
    /// credential); a 401 to it is `CredentialRefused`.
    pub(crate) async fn post_json_with(
        &self,
        body: &Value,
        ctx: &ExecContext<'_>,
        cap: usize,
        authorization: Option<HeaderValue>,
    ) -> Result<Value, ExecError> {
        // INVARIANT: checked at build too; checked again so no code path can send a
        // request elsewhere.
        if !self.allowed.allows(&self.uri) || !self.allowed.allows_url(&self.url) {
            return Err(ExecError::Failed(format!(
                "upstream `{}` is not in the tool's allowed hosts",
                self.label
            )));
        }
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, concat!("toolgate/", env!("CARGO_PKG_VERSION")));
        for (name, value) in [
            ("x-toolgate-call-id", ctx.call_id),
            ("x-toolgate-run-id", ctx.run_id),
        ] {
            if let Ok(v) = HeaderValue::from_str(value) {
                request = request.header(name, v);
            }
        }
        let refusable = authorization.is_some();
        if let Some(value) = authorization {
            request = request.header(AUTHORIZATION, value);
        }
        let request = request.body(to_canonical_bytes(body));

        let answer = self.exchange(request, ctx, cap).await?;
        if refusable && answer.status == StatusCode::UNAUTHORIZED {
            return Err(ExecError::CredentialRefused(format!(
                "upstream `{}` answered 401 to the credential",
                self.label
            )));
        }
        if answer.status.is_success() {
            // Parsed within the deadline (a large answer on the blocking pool).
            return within(ctx, parse_output(answer.body)).await?.map_err(|e| {
                ExecError::OutputNotJson(format!(
                    "upstream `{}` answered {} with a body that is not one json value: {e}",
                    self.label, answer.status
                ))
            });
        }
        Err(self.failure(answer.status, &answer.body))
    }

    /// Sends `request` and reads its answer (status, headers, body up to `cap` bytes),
    /// within `ctx.deadline`.
    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
        ctx: &ExecContext<'_>,
        cap: usize,
    ) -> Result<Answer, ExecError> {
        let exchange = async {
            let mut response = request.send().await.map_err(|e| self.request_error(e))?;
            let status = response.status();
            let headers = response.headers().clone();
            let too_large = || {
                ExecError::Failed(format!(
                    "upstream `{}` answered more than {cap} bytes",
                    self.label
                ))
            };
            if response.content_length().is_some_and(|n| n > cap as u64) {
                return Err(too_large());
            }
            let mut bytes = BytesMut::new();
            loop {
                match response.chunk().await {
                    Ok(Some(chunk)) => {
                        if bytes.len() + chunk.len() > cap {
                            return Err(too_large());
                        }
                        bytes.extend_from_slice(&chunk);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        return Err(ExecError::DependencyDown(format!(
                            "upstream `{}` dropped the connection while answering: {}",
                            self.label,
                            error_chain(&e.without_url())
                        )));
                    }
                }
            }
            Ok(Answer {
                status,
                headers,
                body: Vec::from(bytes.freeze()),
            })
        };
        within(ctx, exchange).await?
    }

    fn request_error(&self, e: reqwest::Error) -> ExecError {
        let e = e.without_url();
        if e.is_connect() {
            // The connection (TCP, and for https the TLS handshake with its certificate
            // check) was not set up, so no byte of the request was sent.
            return ExecError::Unreachable(format!(
                "could not connect to upstream `{}`: {}",
                self.label,
                error_chain(&e)
            ));
        }
        ExecError::DependencyDown(format!(
            "lost the connection to upstream `{}`: {}",
            self.label,
            error_chain(&e)
        ))
    }

    /// The error of an answer whose status is not a success.
    fn failure(&self, status: StatusCode, body: &[u8]) -> ExecError {
        let label = &self.label;
        let excerpt = truncate(String::from_utf8_lossy(body).trim(), ERROR_BODY_BYTES);
        if status.is_server_error() {
            ExecError::DependencyDown(format!("upstream `{label}` answered {status}: {excerpt}"))
        } else {
            ExecError::Failed(format!("upstream `{label}` answered {status}: {excerpt}"))
        }
    }
}

/// The adapter's client: the project's stack, system roots for https, a connect
/// timeout (TCP and TLS handshake), pooled connections closed after a while idle.
pub(crate) fn new_client(builder: reqwest::ClientBuilder) -> Result<reqwest::Client, String> {
    builder
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build the http client: {}", error_chain(&e)))
}

/// The value of the `Toolgate-Scope` header.
const SCOPE_HEADER: &str = "toolgate-scope";

/// Template-expansion failure: nothing was sent.
fn nothing_sent(problem: String) -> ExecError {
    ExecError::Failed(format!("{problem}; nothing was sent"))
}

/// The http adapter of one tool: its URL template, request model and upstream.
#[derive(Debug)]
pub struct HttpAdapter {
    upstream: Upstream,
    template: Template,
    query: Vec<(String, Template)>,
    /// The registry's headers, secrets resolved (marked sensitive).
    headers: HeaderMap,
    request: HttpRequestModel,
    method: reqwest::Method,
    /// The `Authorization` its `auth` adds.
    credential: Credential,
    /// Every secret value it sends, scrubbed from what the upstream answers.
    scrubber: Scrubber,
}

impl HttpAdapter {
    pub(super) fn build(
        url: &str,
        allowed_hosts: &[String],
        request: &HttpRequestModel,
        secrets: &Secrets,
        tools_dir: &std::path::Path,
    ) -> Result<Self, Vec<SettingProblem>> {
        let template = parse_url_template(url)
            .map_err(|e| vec![SettingProblem::new(format!("url `{url}`: {e}"))])?;
        // The URL's shape is checked with every placeholder standing for one plain
        // segment; the client must read its path and query exactly as written, so an
        // expanded URL can be compared with what was built.
        let sample = template.sample("x");
        let client = super::outbound_client(&request.outbound, tools_dir)
            .and_then(new_client)
            .map_err(|e| vec![SettingProblem::new(e)])?;
        let upstream = Upstream::build_with(&sample, allowed_hosts, client)?;
        let mut problems = Vec::new();
        if let Err(e) = expected_matches(&upstream.url, &sample) {
            problems.push(
                SettingProblem::new(format!("url `{url}` is read differently by the http client: {e}"))
                    .help("percent-encode the url's fixed text (RFC 3986) and write no `.` or `..` segment"),
            );
        }
        let mut query = Vec::new();
        for (name, value) in &request.query {
            match Template::parse(value) {
                Ok(t) => query.push((name.clone(), t)),
                Err(e) => problems.push(SettingProblem::new(format!("query `{name}`: {e}"))),
            }
        }
        let mut headers = HeaderMap::new();
        let mut values = Vec::new();
        for (name, value) in &request.headers {
            let sends_secret = !secrets::secret_ids(value).is_empty();
            let Some(resolved) = secrets::resolve(value, secrets) else {
                problems.push(SettingProblem::new(format!(
                    "header `{name}` refers to a secret that does not resolve"
                )));
                continue;
            };
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&resolved),
            ) {
                (Ok(n), Ok(mut v)) => {
                    v.set_sensitive(sends_secret);
                    headers.insert(n, v);
                }
                _ => problems.push(SettingProblem::new(format!(
                    "header `{name}` is not a valid header"
                ))),
            }
        }
        let method = match request.method {
            HttpMethod::Get => reqwest::Method::GET,
            HttpMethod::Post => reqwest::Method::POST,
            HttpMethod::Put => reqwest::Method::PUT,
            HttpMethod::Patch => reqwest::Method::PATCH,
            HttpMethod::Delete => reqwest::Method::DELETE,
        };
        for id in secrets::secret_ids(
            &request
                .headers
                .values()
                .cloned()
                .collect::<Vec<_>>()
                .join(" "),
        ) {
            if let Some(secret) = secrets.get(&id) {
                values.push(secret.value.expose().to_string());
            }
        }
        let credential = match Credential::build(
            request.outbound.auth.as_ref(),
            secrets,
            &upstream.client,
            &mut values,
        ) {
            Ok(c) => c,
            Err(e) => {
                problems.push(SettingProblem::new(e));
                Credential::None
            }
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(HttpAdapter {
            upstream,
            template,
            query,
            headers,
            request: request.clone(),
            method,
            credential,
            scrubber: Scrubber::new(values),
        })
    }

    pub(super) fn validate(
        &self,
        arguments: &Value,
        scope: &Map<String, Value>,
    ) -> Result<(), Refusal> {
        check_url_arguments(arguments, self.upstream.allowed())?;
        match self.expand(arguments, scope) {
            Ok(_) => Ok(()),
            Err(ExecError::ArgumentUnsafe { pointer, problem }) => {
                Err(unsafe_argument(&pointer, &problem))
            }
            Err(ExecError::Failed(m)) => Err(Refusal::new(
                Reason::ArgumentUnsafe,
                format!("the tool's url cannot be made from the arguments: {m}"),
            )
            .with_details(json!({ "location": "arguments", "pointer": "", "problem": m }))),
            Err(_) => Ok(()),
        }
    }

    /// The request URL: the template with every placeholder's value percent-encoded,
    /// then the `query` parameters. Checked against the allowlist, and against the
    /// client's own reading of it (the path and query it sends are the ones built).
    fn expand(
        &self,
        arguments: &Value,
        scope: &Map<String, Value>,
    ) -> Result<reqwest::Url, ExecError> {
        let mut text = String::new();
        for part in &self.template.parts {
            match part {
                TemplatePart::Literal(s) => text.push_str(s),
                TemplatePart::Placeholder { .. } => match lookup(part, arguments, scope)? {
                    Some(v) => text.push_str(&encode_component(&v)),
                    None => {
                        return Err(nothing_sent(format!(
                            "placeholder `{{{}}}` of the url has no value",
                            placeholder_name(part)
                        )));
                    }
                },
            }
        }
        let mut pairs = Vec::new();
        for (name, template) in &self.query {
            let mut value = String::new();
            let mut missing = false;
            for part in &template.parts {
                match part {
                    TemplatePart::Literal(s) => value.push_str(s),
                    TemplatePart::Placeholder { .. } => match lookup(part, arguments, scope)? {
                        Some(v) => value.push_str(&v),
                        None => missing = true,
                    },
                }
            }
            if missing {
                if template.parts.len() == 1 {
                    // `name: "{args.x}"` with no `x`: the parameter is left out.
                    continue;
                }
                return Err(nothing_sent(format!(
                    "query parameter `{name}` has a placeholder without a value"
                )));
            }
            pairs.push(format!(
                "{}={}",
                encode_component(name),
                encode_component(&value)
            ));
        }
        if !pairs.is_empty() {
            text.push(if text.contains('?') { '&' } else { '?' });
            text.push_str(&pairs.join("&"));
        }
        let url = reqwest::Url::parse(&text)
            .map_err(|e| nothing_sent(format!("the expanded url does not parse: {e}")))?;
        // INVARIANT: the host and port are the template's (no value can change them),
        // and in the allowlist; the path and query are exactly the ones built (no value
        // made a dot segment the client would remove).
        let same_origin = url.host_str() == self.upstream.url.host_str()
            && url.port_or_known_default() == self.upstream.url.port_or_known_default()
            && url.scheme() == self.upstream.url.scheme();
        if !same_origin || !self.upstream.allowed.allows_url(&url) {
            return Err(nothing_sent(
                "the expanded url points at another host".to_string(),
            ));
        }
        expected_matches(&url, &text).map_err(|e| {
            nothing_sent(format!(
                "a value would change the url's path (a `.` or `..` segment): {e}"
            ))
        })?;
        Ok(url)
    }

    pub(super) async fn execute(
        &self,
        tool: &Tool,
        arguments: &Value,
        ctx: ExecContext<'_>,
    ) -> Result<Value, ExecError> {
        // The caller's JWT and the token exchanged for it are this call's own secrets.
        let call_secrets = match (&self.credential, ctx.subject_token) {
            (Credential::TokenExchange(_), Some(subject)) => Scrubber::new([subject.to_string()]),
            _ => Scrubber::default(),
        };
        let result = self.send(tool, arguments, ctx, &call_secrets).await;
        if self.scrubber.is_empty() && call_secrets.is_empty() {
            return result;
        }
        // INVARIANT: nothing an upstream of a tool with secrets answered leaves the
        // adapter unscrubbed.
        match result {
            Ok(value) => Ok(call_secrets.value(self.scrubber.value(value))),
            Err(e) => Err(call_secrets.error(self.scrubber.error(e))),
        }
    }

    async fn send(
        &self,
        tool: &Tool,
        arguments: &Value,
        ctx: ExecContext<'_>,
        call_secrets: &Scrubber,
    ) -> Result<Value, ExecError> {
        if self.request.is_default() && !self.template.has_placeholders() {
            // Today's adapter: a JSON POST of the arguments to a fixed URL.
            return self
                .upstream
                .post_json(arguments, &ctx, output_hard_cap(tool))
                .await;
        }
        let url = self.expand(arguments, ctx.scope)?;
        let label = &self.upstream.label;
        let mut request = self
            .upstream
            .client
            .request(self.method.clone(), url)
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, concat!("toolgate/", env!("CARGO_PKG_VERSION")));
        for (name, value) in [
            ("x-toolgate-call-id", ctx.call_id),
            ("x-toolgate-run-id", ctx.run_id),
        ] {
            if let Ok(v) = HeaderValue::from_str(value) {
                request = request.header(name, v);
            }
        }
        if !self.request.forward_scope.is_empty() {
            let forwarded: Map<String, Value> = self
                .request
                .forward_scope
                .iter()
                .filter_map(|k| ctx.scope.get(k).map(|v| (k.clone(), v.clone())))
                .collect();
            let value = HeaderValue::from_bytes(&to_canonical_bytes(&Value::Object(forwarded)))
                .map_err(|_| nothing_sent("the forwarded scope is not a header value".into()))?;
            request = request.header(SCOPE_HEADER, value);
        }
        if self.request.body == HttpBody::Arguments {
            request = request
                .header(CONTENT_TYPE, "application/json")
                .body(to_canonical_bytes(arguments));
        }
        // The registry's headers last: they may set `accept` and `content-type`.
        request = request.headers(self.headers.clone());
        let cap = output_hard_cap(tool);
        // The credential after everything else: nothing may replace it.
        let mut answer = match &self.credential {
            Credential::None => self.upstream.exchange(request, &ctx, cap).await?,
            Credential::Header(value) => {
                let request = request.header(AUTHORIZATION, value.clone());
                self.upstream.exchange(request, &ctx, cap).await?
            }
            Credential::ClientCredentials(_) | Credential::TokenExchange(_) => {
                self.send_with_token(tool, request, &ctx, cap, call_secrets)
                    .await?
            }
        };
        if !self.scrubber.is_empty() || !call_secrets.is_empty() {
            // Before any excerpt is cut from it, so no part of a secret survives.
            answer.body = call_secrets.bytes(self.scrubber.bytes(answer.body));
        }
        map_answer(label, answer, &ctx).await
    }

    /// Sends `request` with an access token (fetched, or exchanged for the caller's
    /// JWT). When the upstream answers 401 the token is dropped, and the request is
    /// sent once more with a new token only under the contract's retry rule (an
    /// idempotent tool called with an `idempotency_key`); otherwise the call fails
    /// `dependency_down`, retryable, and the next call uses a new token.
    async fn send_with_token(
        &self,
        tool: &Tool,
        request: reqwest::RequestBuilder,
        ctx: &ExecContext<'_>,
        cap: usize,
        call_secrets: &Scrubber,
    ) -> Result<Answer, ExecError> {
        let label = &self.upstream.label;
        let resend = tool.idempotent && ctx.idempotency_key.is_some();
        let again = if resend { request.try_clone() } else { None };
        let token = self.access_token(ctx, call_secrets).await?;
        let answer = self
            .upstream
            .exchange(bearer(request, &token)?, ctx, cap)
            .await?;
        if answer.status != StatusCode::UNAUTHORIZED {
            return Ok(answer);
        }
        self.reject(ctx, &token).await;
        let Some(again) = again else {
            return Err(ExecError::CredentialRefused(format!(
                "upstream `{label}` answered 401 to the access token; a new token is fetched for the next call (this call is sent again only when the tool is idempotent and the call carries an idempotency_key)"
            )));
        };
        // The upstream refused the request, so it had no effect: sent again once,
        // with a new token. A token that cannot be had now fails the call as one that
        // reached the upstream.
        let token = self
            .access_token(ctx, call_secrets)
            .await
            .map_err(|e| match e {
                ExecError::Unreachable(m) => ExecError::CredentialRefused(format!(
                    "upstream `{label}` answered 401 to the access token, and no new one could be had: {m}"
                )),
                other => other,
            })?;
        let answer = self
            .upstream
            .exchange(bearer(again, &token)?, ctx, cap)
            .await?;
        if answer.status == StatusCode::UNAUTHORIZED {
            self.reject(ctx, &token).await;
            return Err(ExecError::CredentialRefused(format!(
                "upstream `{label}` answered 401 to a newly fetched access token too"
            )));
        }
        Ok(answer)
    }

    /// The access token of this call: the client's own (client credentials), or one
    /// exchanged for the caller's verified JWT, whose delegation is recorded.
    async fn access_token(
        &self,
        ctx: &ExecContext<'_>,
        call_secrets: &Scrubber,
    ) -> Result<String, ExecError> {
        match &self.credential {
            Credential::ClientCredentials(source) => {
                source.token(ctx.deadline, &self.scrubber).await
            }
            Credential::TokenExchange(source) => {
                let Some(subject) = ctx.subject_token else {
                    return Err(ExecError::CallerJwtRequired(
                        "the call was not authenticated with a verified JWT (a run token or a static token carries no subject to exchange)".to_string(),
                    ));
                };
                let (token, delegation) = source.token(subject, ctx.deadline, call_secrets).await?;
                ctx.delegated(delegation);
                Ok(token)
            }
            Credential::None | Credential::Header(_) => Err(ExecError::Unreachable(
                "the tool has no token credential; nothing was sent".to_string(),
            )),
        }
    }

    /// Drops `token` after the upstream refused it.
    async fn reject(&self, ctx: &ExecContext<'_>, token: &str) {
        match (&self.credential, ctx.subject_token) {
            (Credential::ClientCredentials(source), _) => source.reject(token).await,
            (Credential::TokenExchange(source), Some(subject)) => source.reject(subject, token),
            _ => {}
        }
    }
}

/// `request` with `Authorization: Bearer <token>` (marked sensitive).
fn bearer(
    request: reqwest::RequestBuilder,
    token: &str,
) -> Result<reqwest::RequestBuilder, ExecError> {
    Ok(request.header(AUTHORIZATION, bearer_value(token)?))
}

/// `Bearer <token>` as a header value (marked sensitive).
pub(crate) fn bearer_value(token: &str) -> Result<HeaderValue, ExecError> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        ExecError::Unreachable("the access token is not a header value; nothing was sent".into())
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// The placeholder as written (for messages).
fn placeholder_name(part: &TemplatePart) -> &str {
    match part {
        TemplatePart::Placeholder { written, .. } => written,
        TemplatePart::Literal(s) => s,
    }
}

/// A placeholder's value as text: a string as it is, a number or boolean as JSON; no
/// value (missing or null) is None; an object or array is refused.
fn lookup(
    part: &TemplatePart,
    arguments: &Value,
    scope: &Map<String, Value>,
) -> Result<Option<String>, ExecError> {
    let TemplatePart::Placeholder { source, key, .. } = part else {
        return Ok(None);
    };
    let (value, location) = match source {
        PlaceholderSource::Args => (arguments.get(key), format!("/{key}")),
        PlaceholderSource::Scope => (scope.get(key), format!("scope /{key}")),
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(Some(v.to_string())),
        Some(Value::Array(_) | Value::Object(_)) => Err(ExecError::ArgumentUnsafe {
            pointer: location,
            problem: "an object or array cannot stand in a url".to_string(),
        }),
    }
}

/// Whether the client's reading of `text` keeps its path and query as written.
fn expected_matches(url: &reqwest::Url, text: &str) -> Result<(), String> {
    let after_scheme = text.find("://").map(|i| i + 3).unwrap_or(0);
    let rest = text[after_scheme..]
        .find(['/', '?'])
        .map(|i| &text[after_scheme + i..])
        .unwrap_or("");
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let path = if path.is_empty() { "/" } else { path };
    if url.path() != path {
        return Err(format!("the path would be `{}`", truncate(url.path(), 200)));
    }
    if url.query() != query {
        return Err("the query would change".to_string());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn allow(entries: &[&str]) -> HostAllowlist {
        HostAllowlist::parse(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn allowlist_matches_host_and_port() {
        let a = allow(&["127.0.0.1:8799", "Example.com"]);
        assert!(a.allows(&"http://127.0.0.1:8799/x".parse().unwrap()));
        assert!(!a.allows(&"http://127.0.0.1:8800/x".parse().unwrap()));
        assert!(!a.allows(&"http://127.0.0.1/x".parse().unwrap()));
        assert!(a.allows(&"https://example.COM/x".parse().unwrap()));
        assert!(a.allows(&"http://example.com:9000/".parse().unwrap()));
        assert!(!a.allows(&"http://127.0.0.1:8799@evil.com/".parse().unwrap()));
        assert!(!a.allows(&"http://evil.com/".parse().unwrap()));
    }

    #[test]
    fn bad_allowlist_entries_are_problems() {
        let entries = vec![
            "http://x/".to_string(),
            "a@b".to_string(),
            "ok:1".to_string(),
        ];
        let problems = HostAllowlist::parse(&entries).unwrap_err();
        assert_eq!(problems.len(), 2);
    }

    #[test]
    fn build_takes_https_and_refuses_userinfo_and_foreign_hosts() {
        let hosts = vec!["127.0.0.1:8799".to_string()];
        assert!(Upstream::build("http://127.0.0.1:8799/filings", &hosts).is_ok());
        assert!(Upstream::build("https://127.0.0.1:8799/filings", &hosts).is_ok());
        for bad in [
            "https://127.0.0.1/filings",
            "http://u:p@127.0.0.1:8799/filings",
            "http://127.0.0.1:9999/filings",
            "ftp://127.0.0.1:8799/",
            "/relative",
            "http://[::1",
        ] {
            let problems = Upstream::build(bad, &hosts).unwrap_err();
            assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
        }
        assert!(Upstream::build("http://127.0.0.1:8799/", &[]).is_err());
    }
}
