//! Outbound credentials of http tools and MCP servers: the `Authorization` a tool's
//! `auth` adds after the call is authorized (bearer, basic, an OAuth 2.0 client
//! credentials token fetched and cached), and the [`Scrubber`] that keeps every
//! secret value, and every form derived from one, out of what an upstream answers.
//!
//! INVARIANT: a secret value or a fetched token never leaves an adapter except in the
//! request it authenticates: every error text and output of a tool that uses secrets
//! passes through its scrubber, which replaces each value (raw, base64 of a basic
//! credential and of the value itself, JSON-escaped, form- and percent-encoded) with
//! `[secret]`.
//! INVARIANT: a token fetch is bounded in time ([`TOKEN_FETCH_TIMEOUT`], and half the
//! time left to the call's deadline) and size ([`MAX_TOKEN_RESPONSE_BYTES`]); a failed one sends nothing to
//! the tool (`Unreachable`: `dependency_down`, `reached_tool: false`).

use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use bytes::BytesMut;
use hyper::header::HeaderValue;
use serde_json::Value;
use tokio::time::Instant;

use super::ExecError;
use crate::outbound::error_chain;
use crate::policy::secrets::{self, Secrets};
use crate::policy::{OutboundAuth, TokenGrant};

/// What replaces a secret in any text an upstream sent back.
pub(crate) const SCRUBBED: &str = "[secret]";
/// How long a token request may take at most (less when the call's deadline is nearer).
pub(crate) const TOKEN_FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest token endpoint answer read.
pub(crate) const MAX_TOKEN_RESPONSE_BYTES: usize = 64 * 1024;
/// A cached token is used until this long before it expires.
pub(crate) const TOKEN_EXPIRY_SKEW: Duration = Duration::from_secs(30);
/// The lifetime assumed of a token whose answer gives no `expires_in`.
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(300);
/// How many fetched tokens a scrubber remembers besides its fixed values.
const MAX_DYNAMIC: usize = 8;

/// The secret values of one adapter and their derived forms, replaced by
/// [`SCRUBBED`] wherever an upstream's answer or error holds them.
#[derive(Debug, Default)]
pub(crate) struct Scrubber {
    fixed: Vec<String>,
    /// Fetched tokens, newest last.
    dynamic: Mutex<Vec<String>>,
}

impl Scrubber {
    pub(crate) fn new(values: impl IntoIterator<Item = String>) -> Scrubber {
        let mut fixed = Vec::new();
        for value in values {
            push_forms(&mut fixed, &value);
        }
        fixed.sort_by_key(|v| std::cmp::Reverse(v.len()));
        fixed.dedup();
        Scrubber {
            fixed,
            dynamic: Mutex::new(Vec::new()),
        }
    }

    /// Adds a fetched token (its forms); the oldest beyond [`MAX_DYNAMIC`] is forgotten.
    pub(crate) fn add(&self, value: &str) {
        let mut dynamic = self.dynamic.lock().unwrap_or_else(|p| p.into_inner());
        push_forms(&mut dynamic, value);
        let excess = dynamic.len().saturating_sub(MAX_DYNAMIC * 4);
        dynamic.drain(..excess);
    }

    fn needles(&self) -> Vec<String> {
        let dynamic = self.dynamic.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<String> = self.fixed.iter().chain(dynamic.iter()).cloned().collect();
        all.sort_by_key(|v| std::cmp::Reverse(v.len()));
        all
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.fixed.is_empty()
            && self
                .dynamic
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// `text` with every secret replaced.
    pub(crate) fn text(&self, text: &str) -> String {
        let mut out = text.to_string();
        for needle in self.needles() {
            if out.contains(&needle) {
                out = out.replace(&needle, SCRUBBED);
            }
        }
        out
    }

    /// `bytes` with every secret replaced (an answer body before it is read further).
    pub(crate) fn bytes(&self, bytes: Vec<u8>) -> Vec<u8> {
        let needles = self.needles();
        if needles.is_empty() {
            return bytes;
        }
        let mut out = bytes;
        for needle in needles {
            let needle = needle.as_bytes();
            if out.windows(needle.len()).any(|w| w == needle) {
                let mut replaced = Vec::with_capacity(out.len());
                let mut i = 0;
                while i < out.len() {
                    if out[i..].starts_with(needle) {
                        replaced.extend_from_slice(SCRUBBED.as_bytes());
                        i += needle.len();
                    } else {
                        replaced.push(out[i]);
                        i += 1;
                    }
                }
                out = replaced;
            }
        }
        out
    }

    /// A JSON value with every secret in its strings and keys replaced.
    pub(crate) fn value(&self, value: Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.text(&s)),
            Value::Array(items) => Value::Array(items.into_iter().map(|v| self.value(v)).collect()),
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| (self.text(&k), self.value(v)))
                    .collect(),
            ),
            other => other,
        }
    }

    /// An execution error with every secret in its texts replaced.
    pub(crate) fn error(&self, error: ExecError) -> ExecError {
        match error {
            ExecError::Busy(m) => ExecError::Busy(self.text(&m)),
            ExecError::DependencyDown(m) => ExecError::DependencyDown(self.text(&m)),
            ExecError::Unreachable(m) => ExecError::Unreachable(self.text(&m)),
            ExecError::Failed(m) => ExecError::Failed(self.text(&m)),
            ExecError::RateLimited {
                message,
                retry_after_ms,
            } => ExecError::RateLimited {
                message: self.text(&message),
                retry_after_ms,
            },
            ExecError::OutputNotJson(m) => ExecError::OutputNotJson(self.text(&m)),
            ExecError::NotImplemented(m) => ExecError::NotImplemented(self.text(&m)),
            ExecError::ArgumentUnsafe { pointer, problem } => ExecError::ArgumentUnsafe {
                pointer,
                problem: self.text(&problem),
            },
            ExecError::SandboxUnavailable { guarantee, detail } => ExecError::SandboxUnavailable {
                guarantee,
                detail: self.text(&detail),
            },
            ExecError::ResourceLimit { limit, detail } => ExecError::ResourceLimit {
                limit,
                detail: self.text(&detail),
            },
            other @ (ExecError::Timeout | ExecError::Cancelled) => other,
        }
    }
}

/// A value and the forms it takes in the texts an upstream may echo: as it is,
/// JSON-escaped, form-encoded, percent-encoded and base64 (standard and url-safe).
fn push_forms(into: &mut Vec<String>, value: &str) {
    if value.is_empty() {
        return;
    }
    into.push(value.to_string());
    let json = serde_json::to_string(value).unwrap_or_default();
    let json = json.trim_matches('"');
    let form: String = form_urlencoded::byte_serialize(value.as_bytes()).collect();
    let percent = form.replace('+', "%20");
    let base64 = base64::engine::general_purpose::STANDARD.encode(value);
    let base64_url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value);
    for form in [json.to_string(), form, percent, base64, base64_url] {
        if form != value && !form.is_empty() && !into.contains(&form) {
            into.push(form);
        }
    }
}

/// The credential an upstream's requests carry.
#[derive(Debug)]
pub(crate) enum Credential {
    None,
    /// A fixed `Authorization` value (bearer or basic).
    Header(HeaderValue),
    /// An OAuth 2.0 access token, fetched and cached.
    ClientCredentials(Box<TokenSource>),
}

impl Credential {
    /// The credential of `auth` (mTLS is the client's, not a header), with every value
    /// it sends added to `values` (for the scrubber). `Err` for an auth kind this build
    /// cannot send, or a reference that does not resolve.
    pub(crate) fn build(
        auth: Option<&OutboundAuth>,
        secrets: &Secrets,
        client: &reqwest::Client,
        values: &mut Vec<String>,
    ) -> Result<Credential, String> {
        if let Some(value) = fixed_authorization(auth, secrets, values)? {
            return Ok(Credential::Header(value));
        }
        match auth {
            None
            | Some(OutboundAuth::Mtls { .. })
            | Some(OutboundAuth::Bearer(_))
            | Some(OutboundAuth::Basic { .. }) => Ok(Credential::None),
            Some(OutboundAuth::Oauth2ClientCredentials(grant)) => {
                let resolved = ResolvedGrant::new(grant, secrets)?;
                values.push(resolved.client_secret.clone());
                values.push(resolved.basic.clone());
                Ok(Credential::ClientCredentials(Box::new(TokenSource::new(
                    resolved,
                    client.clone(),
                ))))
            }
            Some(OutboundAuth::TokenExchange(_)) => Err(
                "`token_exchange` is not available in this build: the caller's verified JWT is not handed to adapters yet"
                    .to_string(),
            ),
        }
    }
}

/// The fixed `Authorization` value of a `bearer` or `basic` auth (None for other
/// kinds), with every value it sends added to `values`.
pub(crate) fn fixed_authorization(
    auth: Option<&OutboundAuth>,
    secrets: &Secrets,
    values: &mut Vec<String>,
) -> Result<Option<HeaderValue>, String> {
    let resolve = |text: &str| {
        secrets::resolve(text, secrets)
            .ok_or_else(|| "a `${secret:ID}` of its `auth` does not resolve".to_string())
    };
    match auth {
        Some(OutboundAuth::Bearer(token)) => {
            let token = resolve(token)?;
            values.push(token.clone());
            header(&format!("Bearer {token}")).map(Some)
        }
        Some(OutboundAuth::Basic { username, password }) => {
            let (username, password) = (resolve(username)?, resolve(password)?);
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
            values.push(password);
            values.push(encoded.clone());
            header(&format!("Basic {encoded}")).map(Some)
        }
        _ => Ok(None),
    }
}

fn header(value: &str) -> Result<HeaderValue, String> {
    let mut value = HeaderValue::from_str(value)
        .map_err(|_| "the credential is not a valid header value".to_string())?;
    value.set_sensitive(true);
    Ok(value)
}

/// A client credentials grant with its references resolved.
#[derive(Debug)]
pub(crate) struct ResolvedGrant {
    token_url: reqwest::Url,
    /// `host:port` of the token endpoint, for messages.
    label: String,
    client_secret: String,
    /// The `Authorization: Basic` value of the client (RFC 6749 2.3.1).
    basic: String,
    scope: Option<String>,
    audience: Option<String>,
}

impl ResolvedGrant {
    fn new(grant: &TokenGrant, secrets: &Secrets) -> Result<ResolvedGrant, String> {
        let resolve = |text: &str| {
            secrets::resolve(text, secrets)
                .ok_or_else(|| "a `${secret:ID}` of its `auth` does not resolve".to_string())
        };
        let token_url = reqwest::Url::parse(&grant.token_url)
            .map_err(|e| format!("`token_url` does not parse: {e}"))?;
        let label = format!(
            "{}:{}",
            token_url.host_str().unwrap_or(""),
            token_url.port_or_known_default().unwrap_or(0)
        );
        let client_id = resolve(&grant.client_id)?;
        let client_secret = resolve(&grant.client_secret)?;
        // RFC 6749 2.3.1: each form-encoded, then joined and base64-encoded.
        let encode = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            encode(&client_id),
            encode(&client_secret)
        ));
        Ok(ResolvedGrant {
            token_url,
            label,
            client_secret,
            basic,
            scope: grant.scope.clone(),
            audience: grant.audience.clone(),
        })
    }
}

/// A cached access token.
#[derive(Clone)]
struct Cached {
    token: String,
    /// Used until then (its expiry less [`TOKEN_EXPIRY_SKEW`]).
    fresh_until: Instant,
}

/// The access tokens of one upstream: fetched when none is fresh (one fetch at a time),
/// dropped when the upstream answers 401 to it.
pub(crate) struct TokenSource {
    grant: ResolvedGrant,
    client: reqwest::Client,
    cache: tokio::sync::Mutex<Option<Cached>>,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("token_endpoint", &self.grant.label)
            .finish()
    }
}

impl TokenSource {
    fn new(grant: ResolvedGrant, client: reqwest::Client) -> TokenSource {
        TokenSource {
            grant,
            client,
            cache: tokio::sync::Mutex::new(None),
        }
    }

    /// A fresh token: the cached one, or one fetched now (within `deadline`). Every
    /// token fetched is added to `scrubber`.
    pub(crate) async fn token(
        &self,
        deadline: Instant,
        scrubber: &Scrubber,
    ) -> Result<String, ExecError> {
        let mut cache = tokio::time::timeout_at(deadline, self.cache.lock())
            .await
            .map_err(|_| ExecError::Timeout)?;
        if let Some(cached) = cache.as_ref()
            && Instant::now() < cached.fresh_until
        {
            return Ok(cached.token.clone());
        }
        *cache = None;
        // At most half the time left, so a token endpoint that hangs fails the call as
        // the dependency it is, not as the tool's timeout.
        let now = Instant::now();
        let until = now + TOKEN_FETCH_TIMEOUT.min(deadline.saturating_duration_since(now) / 2);
        let fetched = tokio::time::timeout_at(until, self.fetch())
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "the token endpoint `{}` did not answer in time",
                    self.grant.label
                ))
            })
            .map_err(|e| {
                ExecError::Unreachable(format!(
                    "could not obtain an access token, so nothing was sent: {e}"
                ))
            })?;
        scrubber.add(&fetched.token);
        let token = fetched.token.clone();
        if fetched.fresh_until > Instant::now() {
            *cache = Some(fetched);
        }
        Ok(token)
    }

    /// Forgets `token` if it is the cached one (the upstream answered 401 to it): the
    /// next call fetches a new one.
    pub(crate) async fn reject(&self, token: &str) {
        let mut cache = self.cache.lock().await;
        if cache.as_ref().is_some_and(|c| c.token == token) {
            *cache = None;
        }
    }

    async fn fetch(&self) -> Result<Cached, String> {
        let label = &self.grant.label;
        let mut form = vec![("grant_type", "client_credentials")];
        if let Some(scope) = &self.grant.scope {
            form.push(("scope", scope));
        }
        if let Some(audience) = &self.grant.audience {
            form.push(("audience", audience));
        }
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let mut authorization = HeaderValue::from_str(&format!("Basic {}", self.grant.basic))
            .map_err(|_| "the client credential is not a valid header value".to_string())?;
        authorization.set_sensitive(true);
        let started = Instant::now();
        let mut response = self
            .client
            .post(self.grant.token_url.clone())
            .header(hyper::header::AUTHORIZATION, authorization)
            .header(
                hyper::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(hyper::header::ACCEPT, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "the token endpoint `{label}` could not be reached: {}",
                    error_chain(&e.without_url())
                )
            })?;
        let status = response.status();
        if response
            .content_length()
            .is_some_and(|n| n > MAX_TOKEN_RESPONSE_BYTES as u64)
        {
            return Err(format!(
                "the token endpoint `{label}` answered more than {MAX_TOKEN_RESPONSE_BYTES} bytes"
            ));
        }
        let mut bytes = BytesMut::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| {
            format!(
                "the token endpoint `{label}` dropped the connection: {}",
                error_chain(&e.without_url())
            )
        })? {
            if bytes.len() + chunk.len() > MAX_TOKEN_RESPONSE_BYTES {
                return Err(format!(
                    "the token endpoint `{label}` answered more than {MAX_TOKEN_RESPONSE_BYTES} bytes"
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            // The endpoint's own error code only (RFC 6749 5.2), never its text.
            let code = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
                .filter(|c| c.len() <= 64 && c.bytes().all(|b| b.is_ascii_graphic()))
                .unwrap_or_else(|| "no error code".to_string());
            return Err(format!(
                "the token endpoint `{label}` answered {status} ({code})"
            ));
        }
        let answer: Value = serde_json::from_slice(&bytes).map_err(|_| {
            format!("the token endpoint `{label}` answered something that is not JSON")
        })?;
        let token = answer
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| {
                !t.is_empty() && t.len() <= 16 * 1024 && t.bytes().all(|b| b.is_ascii_graphic())
            })
            .ok_or_else(|| {
                format!("the token endpoint `{label}` answered no usable `access_token`")
            })?;
        if let Some(kind) = answer.get("token_type").and_then(Value::as_str)
            && !kind.eq_ignore_ascii_case("bearer")
        {
            return Err(format!(
                "the token endpoint `{label}` answered a token of type `{}`, not bearer",
                kind.escape_debug()
            ));
        }
        let lifetime = answer
            .get("expires_in")
            .and_then(Value::as_u64)
            .map(|s| Duration::from_secs(s.min(86_400)))
            .unwrap_or(DEFAULT_TOKEN_LIFETIME);
        Ok(Cached {
            token: token.to_string(),
            fresh_until: started + lifetime.saturating_sub(TOKEN_EXPIRY_SKEW),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_form_of_a_secret_is_scrubbed() {
        let s = Scrubber::new(["p@ss w\"rd/+1".to_string()]);
        for text in [
            "echo p@ss w\"rd/+1 back",
            "json p@ss w\\\"rd/+1 back",
            "form p%40ss+w%22rd%2F%2B1 back",
            "pct p%40ss%20w%22rd%2F%2B1 back",
        ] {
            let out = s.text(text);
            assert!(out.contains(SCRUBBED), "{text} -> {out}");
            assert!(!out.contains("rd/+1") && !out.contains("rd%2F"), "{out}");
        }
        let v = s.value(json!({"a": ["x p@ss w\"rd/+1"], "p@ss w\"rd/+1": 1}));
        assert!(!v.to_string().contains("rd/+1"), "{v}");
        let b = s.bytes(b"a p@ss w\"rd/+1 b".to_vec());
        assert_eq!(b, b"a [secret] b");
        s.add("token-abcdefgh");
        assert_eq!(s.text("Bearer token-abcdefgh"), "Bearer [secret]");
    }
}
