//! Outbound credentials of http tools and MCP servers: the `Authorization` a tool's
//! `auth` adds after the call is authorized (bearer, basic, an OAuth 2.0 client
//! credentials token fetched and cached, a token exchanged for the caller's verified
//! JWT per RFC 8693 and cached per caller), and the [`Scrubber`] that keeps every
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

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use bytes::BytesMut;
use hyper::header::HeaderValue;
use serde_json::{Map, Value};
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
            ExecError::CallerJwtRequired(m) => ExecError::CallerJwtRequired(self.text(&m)),
            ExecError::CredentialRefused(m) => ExecError::CredentialRefused(self.text(&m)),
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
    /// An access token exchanged for the caller's verified JWT (RFC 8693), cached per
    /// subject token.
    TokenExchange(Box<ExchangeSource>),
}

impl Credential {
    /// The credential of `auth` (mTLS is the client's, not a header), with every value
    /// it sends added to `values` (for the scrubber). `Err` for a reference that does
    /// not resolve.
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
                let resolved = ResolvedGrant::new(grant, secrets, values)?;
                Ok(Credential::ClientCredentials(Box::new(TokenSource::new(
                    resolved,
                    client.clone(),
                ))))
            }
            Some(OutboundAuth::TokenExchange(grant)) => {
                let resolved = ResolvedGrant::new(grant, secrets, values)?;
                Ok(Credential::TokenExchange(Box::new(ExchangeSource {
                    grant: resolved,
                    client: client.clone(),
                    cache: Mutex::new(HashMap::new()),
                })))
            }
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

/// RFC 8693's token type of a JWT: the subject token's, and an actor token's unless
/// the registry names another.
pub(crate) const JWT_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";
/// RFC 8693's grant type.
const TOKEN_EXCHANGE_GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// How many exchanged tokens one tool keeps (one per subject token).
const MAX_EXCHANGED: usize = 1024;
/// The largest `sub` recorded in `details.delegation`.
const MAX_DELEGATION_SUB_BYTES: usize = 512;
/// The largest `act` (as JSON) recorded in `details.delegation`, and its deepest nesting.
const MAX_DELEGATION_ACT_BYTES: usize = 4096;
const MAX_DELEGATION_ACT_DEPTH: usize = 16;

/// A token grant (client credentials or token exchange) with its references resolved.
#[derive(Debug)]
pub(crate) struct ResolvedGrant {
    token_url: reqwest::Url,
    /// `host:port` of the token endpoint, for messages.
    label: String,
    /// The `Authorization: Basic` value of the client (RFC 6749 2.3.1).
    basic: String,
    scope: Option<String>,
    audience: Option<String>,
    /// `token_exchange` only: the sidecar's own actor token and its type.
    actor_token: Option<String>,
    actor_token_type: String,
}

impl ResolvedGrant {
    /// The grant with its secrets resolved; every value it sends is added to `values`.
    fn new(
        grant: &TokenGrant,
        secrets: &Secrets,
        values: &mut Vec<String>,
    ) -> Result<ResolvedGrant, String> {
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
        let actor_token = grant.actor_token.as_deref().map(resolve).transpose()?;
        values.push(client_secret);
        values.push(basic.clone());
        values.extend(actor_token.clone());
        Ok(ResolvedGrant {
            token_url,
            label,
            basic,
            scope: grant.scope.clone(),
            audience: grant.audience.clone(),
            actor_token,
            actor_token_type: grant
                .actor_token_type
                .clone()
                .unwrap_or_else(|| JWT_TOKEN_TYPE.to_string()),
        })
    }

    /// Runs `fetch` within [`TOKEN_FETCH_TIMEOUT`] and half the time left to
    /// `deadline` (so a token endpoint that hangs fails the call as the dependency it
    /// is, not as the tool's timeout). A failure sends nothing to the tool.
    async fn within<T>(
        &self,
        deadline: Instant,
        fetch: impl std::future::Future<Output = Result<T, String>>,
    ) -> Result<T, ExecError> {
        let now = Instant::now();
        let until = now + TOKEN_FETCH_TIMEOUT.min(deadline.saturating_duration_since(now) / 2);
        tokio::time::timeout_at(until, fetch)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "the token endpoint `{}` did not answer in time",
                    self.label
                ))
            })
            .map_err(|e| {
                ExecError::Unreachable(format!(
                    "could not obtain an access token, so nothing was sent: {e}"
                ))
            })
    }

    /// POSTs `form` to the token endpoint with the client's credential and reads the
    /// answer (at most [`MAX_TOKEN_RESPONSE_BYTES`]): the token, how long it is fresh,
    /// and the whole answer.
    async fn request(
        &self,
        client: &reqwest::Client,
        form: &[(&str, &str)],
    ) -> Result<(Cached, Value), String> {
        let label = &self.label;
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let mut authorization = HeaderValue::from_str(&format!("Basic {}", self.basic))
            .map_err(|_| "the client credential is not a valid header value".to_string())?;
        authorization.set_sensitive(true);
        let started = Instant::now();
        let mut response = client
            .post(self.token_url.clone())
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
        let cached = Cached {
            token: token.to_string(),
            fresh_until: started + lifetime.saturating_sub(TOKEN_EXPIRY_SKEW),
        };
        Ok((cached, answer))
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
        let mut form = vec![("grant_type", "client_credentials")];
        if let Some(scope) = &self.grant.scope {
            form.push(("scope", scope));
        }
        if let Some(audience) = &self.grant.audience {
            form.push(("audience", audience));
        }
        let (fetched, _) = self
            .grant
            .within(deadline, self.grant.request(&self.client, &form))
            .await?;
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
}

/// An exchanged token and the delegation it carries.
#[derive(Clone)]
struct Exchanged {
    cached: Cached,
    /// `details.delegation`: `{sub, act}` of the issued token.
    delegation: Value,
}

/// The tokens of a `token_exchange` upstream: one per subject token (the caller's
/// JWT), exchanged at the token endpoint when none is fresh and kept until shortly
/// before it expires, at most [`MAX_EXCHANGED`] of them. Concurrent first calls with
/// one subject token may each exchange it (no lock is held across a fetch, so one
/// caller's slow exchange never holds up another's).
pub(crate) struct ExchangeSource {
    grant: ResolvedGrant,
    client: reqwest::Client,
    /// By the sha256 of the subject token (the cache keeps no caller's token).
    cache: Mutex<HashMap<String, Exchanged>>,
}

impl std::fmt::Debug for ExchangeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangeSource")
            .field("token_endpoint", &self.grant.label)
            .finish()
    }
}

impl ExchangeSource {
    /// A fresh token exchanged for `subject` and its delegation: the cached one, or
    /// one exchanged now (within `deadline`). Every token issued is added to
    /// `scrubber`.
    pub(crate) async fn token(
        &self,
        subject: &str,
        deadline: Instant,
        scrubber: &Scrubber,
    ) -> Result<(String, Value), ExecError> {
        let key = crate::canonical::sha256_hex(subject.as_bytes());
        let now = Instant::now();
        if let Some(found) = self.lock().get(&key)
            && now < found.cached.fresh_until
        {
            scrubber.add(&found.cached.token);
            return Ok((found.cached.token.clone(), found.delegation.clone()));
        }
        let mut form = vec![
            ("grant_type", TOKEN_EXCHANGE_GRANT),
            ("subject_token", subject),
            ("subject_token_type", JWT_TOKEN_TYPE),
        ];
        if let Some(audience) = &self.grant.audience {
            form.push(("audience", audience));
        }
        if let Some(scope) = &self.grant.scope {
            form.push(("scope", scope));
        }
        if let Some(actor) = &self.grant.actor_token {
            form.push(("actor_token", actor));
            form.push(("actor_token_type", &self.grant.actor_token_type));
        }
        let (cached, answer) = self
            .grant
            .within(deadline, self.grant.request(&self.client, &form))
            .await?;
        scrubber.add(&cached.token);
        let delegation = scrubber.value(delegation(&cached.token, &answer));
        let token = cached.token.clone();
        if cached.fresh_until > Instant::now() {
            let mut cache = self.lock();
            if cache.len() >= MAX_EXCHANGED {
                let now = Instant::now();
                cache.retain(|_, e| e.cached.fresh_until > now);
            }
            if cache.len() >= MAX_EXCHANGED
                && let Some(oldest) = cache
                    .iter()
                    .min_by_key(|(_, e)| e.cached.fresh_until)
                    .map(|(k, _)| k.clone())
            {
                cache.remove(&oldest);
            }
            cache.insert(
                key,
                Exchanged {
                    cached,
                    delegation: delegation.clone(),
                },
            );
        }
        Ok((token, delegation))
    }

    /// Forgets the token exchanged for `subject` if it is `token` (the upstream
    /// answered 401 to it): the next call exchanges again.
    pub(crate) fn reject(&self, subject: &str, token: &str) {
        let key = crate::canonical::sha256_hex(subject.as_bytes());
        let mut cache = self.lock();
        if cache.get(&key).is_some_and(|e| e.cached.token == token) {
            cache.remove(&key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Exchanged>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `details.delegation` of an issued token: its `sub` and `act` (RFC 8693 4.1) read
/// from its payload when it is a JWT (not verified: the token endpoint that issued it
/// is trusted for what it issued), else from the token answer's own fields, else
/// `{"sub": null}`. Never the token.
fn delegation(token: &str, answer: &Value) -> Value {
    let claims = jwt_payload(token).or_else(|| answer.as_object().cloned());
    let mut out = Map::new();
    let sub = claims
        .as_ref()
        .and_then(|c| c.get("sub"))
        .and_then(Value::as_str)
        .map(|s| Value::String(super::truncate(s, MAX_DELEGATION_SUB_BYTES)));
    out.insert("sub".into(), sub.unwrap_or(Value::Null));
    if let Some(act) = claims.as_ref().and_then(|c| c.get("act"))
        && act.is_object()
    {
        if depth(act) > MAX_DELEGATION_ACT_DEPTH
            || serde_json::to_string(act).map_or(usize::MAX, |s| s.len()) > MAX_DELEGATION_ACT_BYTES
        {
            out.insert(
                "act_omitted".into(),
                Value::String(format!(
                    "larger than {MAX_DELEGATION_ACT_BYTES} bytes or nested deeper than {MAX_DELEGATION_ACT_DEPTH}"
                )),
            );
        } else {
            out.insert("act".into(), act.clone());
        }
    }
    Value::Object(out)
}

/// The claims of a compact JWS, if `token` is one whose payload is a JSON object.
fn jwt_payload(token: &str) -> Option<Map<String, Value>> {
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    match serde_json::from_slice::<Value>(&bytes).ok()? {
        Value::Object(claims) => Some(claims),
        _ => None,
    }
}

/// How deeply `value` nests (a scalar is 0). Iterative.
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, d + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, d + 1))),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn jwt(claims: &Value) -> String {
        let b64 =
            |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!("{}.{}.sig", b64(&json!({"alg": "RS256"})), b64(claims))
    }

    #[test]
    fn the_delegation_is_read_from_the_issued_token_then_the_answer_and_is_bounded() {
        let token =
            jwt(&json!({"sub": "dr-alice", "act": {"sub": "sidecar", "act": {"sub": "agent"}}}));
        assert_eq!(
            delegation(&token, &json!({"sub": "ignored"})),
            json!({"sub": "dr-alice", "act": {"sub": "sidecar", "act": {"sub": "agent"}}})
        );
        // An opaque token: the answer's own fields, else no subject.
        assert_eq!(
            delegation(
                "opaque-token-1",
                &json!({"access_token": "x", "sub": "dr-bob"})
            ),
            json!({"sub": "dr-bob"})
        );
        assert_eq!(
            delegation("opaque-token-1", &json!({})),
            json!({"sub": null})
        );
        assert_eq!(delegation("a.b.c", &json!({})), json!({"sub": null}));
        // A hostile issuer: an act too deep or too large is not recorded, a long sub is cut.
        let mut deep = json!({"sub": "x"});
        for _ in 0..20 {
            deep = json!({"sub": "x", "act": deep});
        }
        let recorded = delegation(
            &jwt(&json!({"sub": "s".repeat(5000), "act": deep})),
            &json!({}),
        );
        assert!(recorded.get("act").is_none(), "{recorded}");
        assert!(recorded["act_omitted"].is_string());
        assert!(recorded["sub"].as_str().unwrap().len() <= MAX_DELEGATION_SUB_BYTES);
        let wide = json!({"sub": "y".repeat(5000)});
        let recorded = delegation(&jwt(&json!({"sub": "z", "act": wide})), &json!({}));
        assert!(recorded.get("act").is_none(), "{recorded}");
    }

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
