//! OIDC/JWT credentials: a bearer JWT verified against its issuer's published keys
//! into a typed [`JwtIdentity`], before the pipeline decides (which stays pure).
//!
//! The token's `iss` picks the identity provider; its `alg` must be one the provider
//! accepts (never `none`, never HMAC); its `kid` names a key of the provider's JWK Set;
//! then the signature is checked and `exp`, `nbf`, `iat` (with the provider's leeway)
//! and `aud` (the provider's audience or the server's MCP resource URI). Each refusal
//! has its own reason (`jwt_*`, `jwks_unavailable`).
//!
//! Key sets are cached per source: fetched on first use, again when older than
//! `jwks_refresh_s`, and on an unknown `kid` at most once per `jwks_cooldown_s`. While
//! the source is unreachable the cached keys keep serving for up to [`MAX_STALE`] past
//! their refresh time; with no usable key the call is refused (`jwks_unavailable`).
//!
//! INVARIANT: the token itself is never stored, logged or audited; the verified-token
//! cache is keyed by its sha256.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value, json};

use crate::diagnostic::{Reason, Refusal};
use crate::policy::{IdentityProvider, JWT_ALGORITHMS, JwksSource, JwtCredential, Policy};

/// Bearer JWTs longer than this are refused before any parsing.
pub const MAX_JWT_BYTES: usize = 8 * 1024;
/// A JWK Set document larger than this is refused (its fetch is cut off there).
pub const MAX_JWKS_BYTES: usize = 256 * 1024;
/// A JWK Set with more keys than this is refused.
pub const MAX_JWKS_KEYS: usize = 64;
/// The whole fetch of a JWK Set (connect, headers, body) must finish within this.
pub const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Connecting to a `jwks_uri` must finish within this.
const JWKS_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long past `jwks_refresh_s` cached keys keep serving while the source is down.
pub const MAX_STALE: Duration = Duration::from_secs(3_600);
/// RSA keys shorter than this many bits are not used (too weak), nor longer than
/// [`MAX_RSA_BITS`] (a verification would take too long).
const MIN_RSA_BITS: usize = 2048;
const MAX_RSA_BITS: usize = 8192;
/// Verified tokens remembered (by sha256), and for how long at most.
const VERIFIED_ENTRIES: usize = 4096;
const VERIFIED_TTL: Duration = Duration::from_secs(30);
/// The longest claim value echoed in a refusal message.
const SHOWN: usize = 128;

/// Who a verified JWT says the caller is. Built only by [`JwtVerifier::authenticate`].
#[derive(Debug, Clone, PartialEq)]
pub struct JwtIdentity {
    /// The id of the identity provider whose issuer signed it.
    pub provider: String,
    pub issuer: String,
    pub subject: Option<String>,
    pub kid: String,
    pub jti: Option<String>,
    /// The verified claims, for matching `credential.jwt.claim`.
    pub claims: Map<String, Value>,
    /// `exp` plus the provider's leeway: the token is dead after this (Unix seconds).
    pub valid_until_unix: u64,
}

impl JwtIdentity {
    /// Whether this identity proves `credential`: same provider, the claim is the value
    /// (or an array containing it), and the subject when the credential pins one.
    pub fn proves(&self, credential: &JwtCredential) -> bool {
        let claim_holds = match self.claims.get(&credential.claim) {
            Some(Value::String(s)) => *s == credential.value,
            Some(Value::Array(items)) => items
                .iter()
                .any(|v| v.as_str() == Some(credential.value.as_str())),
            _ => false,
        };
        let subject_holds = match &credential.subject {
            None => true,
            Some(pinned) => self.subject.as_deref() == Some(pinned.as_str()),
        };
        credential.provider == self.provider && claim_holds && subject_holds
    }

    /// What the audit events of a JWT call record about the caller (never the token).
    pub fn caller_json(&self) -> Value {
        let mut caller = json!({
            "kind": "jwt",
            "provider": self.provider,
            "issuer": self.issuer,
            "kid": self.kid,
        });
        if let Some(subject) = &self.subject {
            caller["subject"] = json!(subject);
        }
        if let Some(jti) = &self.jti {
            caller["jti"] = json!(jti);
        }
        caller
    }
}

/// Whether a bearer token is to be read as a JWT: three dot-separated parts (static
/// and run tokens never have that shape).
pub fn looks_like_jwt(token: &str) -> bool {
    token.bytes().filter(|b| *b == b'.').count() == 2
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn refuse(reason: Reason, message: impl Into<String>) -> Refusal {
    Refusal::new(reason, message)
}

fn shown(text: &str) -> String {
    text.chars()
        .take(SHOWN)
        .collect::<String>()
        .escape_debug()
        .to_string()
}

/// A usable signing key of a JWK Set.
struct Key {
    decoding: DecodingKey,
    kind: KeyKind,
    /// The JWK's `alg`, when it names one: the token's must be the same.
    alg: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
}

impl KeyKind {
    fn fits(self, alg: &str) -> bool {
        match self {
            KeyKind::Rsa => alg.starts_with("RS") || alg.starts_with("PS"),
            KeyKind::P256 => alg == "ES256",
            KeyKind::P384 => alg == "ES384",
            KeyKind::Ed25519 => alg == "EdDSA",
        }
    }
}

/// The usable keys of one fetched JWK Set, by `kid`.
struct Keys {
    by_kid: HashMap<String, Arc<Key>>,
}

#[derive(Default)]
struct KeyState {
    keys: Option<Arc<Keys>>,
    /// When `keys` were fetched.
    fetched: Option<Instant>,
    /// When the last fetch started (the cooldown counts from here).
    attempted: Option<Instant>,
    /// Why the last fetch failed (None after a success).
    error: Option<String>,
}

/// The cache of one key-set source.
#[derive(Default)]
struct KeySet {
    state: Mutex<KeyState>,
    /// One fetch at a time per source.
    fetching: tokio::sync::Mutex<()>,
}

impl KeySet {
    fn state(&self) -> MutexGuard<'_, KeyState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Verified {
    roles_sha256: String,
    identity: Arc<JwtIdentity>,
    at: Instant,
}

/// Verifies bearer JWTs and caches key sets and verified tokens.
pub struct JwtVerifier {
    http: Option<reqwest::Client>,
    key_sets: Mutex<HashMap<String, Arc<KeySet>>>,
    verified: Mutex<HashMap<String, Verified>>,
}

impl Default for JwtVerifier {
    fn default() -> Self {
        JwtVerifier::new()
    }
}

impl JwtVerifier {
    pub fn new() -> JwtVerifier {
        let http = crate::outbound::builder()
            .timeout(JWKS_FETCH_TIMEOUT)
            .connect_timeout(JWKS_CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .ok();
        JwtVerifier {
            http,
            key_sets: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// Verifies `token` when it is a JWT and the policy has identity providers; None
    /// for any other kind of credential. `resource` is the server's MCP resource URI,
    /// accepted as an audience (RFC 8707) beside each provider's own.
    pub async fn authenticate(
        &self,
        policy: &Policy,
        resource: Option<&str>,
        token: &str,
    ) -> Option<Result<Arc<JwtIdentity>, Refusal>> {
        if policy.identity.providers.is_empty() || !looks_like_jwt(token) {
            return None;
        }
        if let Some(Ok(identity)) = self.cached(policy, token) {
            return Some(Ok(identity));
        }
        let verified = self
            .verify(&policy.identity.providers, resource, token)
            .await
            .map(Arc::new);
        if let Ok(identity) = &verified {
            self.remember(policy, token, identity.clone());
        }
        Some(verified)
    }

    /// The identity of a JWT verified moments ago (by [`Self::authenticate`]) under the
    /// same roles.yaml, for the synchronous checks of the admin and read endpoints;
    /// None for another kind of credential.
    pub fn cached(
        &self,
        policy: &Policy,
        token: &str,
    ) -> Option<Result<Arc<JwtIdentity>, Refusal>> {
        if policy.identity.providers.is_empty() || !looks_like_jwt(token) {
            return None;
        }
        let key = crate::canonical::sha256_hex(token.as_bytes());
        let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        let hit = verified.get(&key).filter(|v| {
            v.roles_sha256 == policy.versions.roles.sha256
                && v.at.elapsed() < VERIFIED_TTL
                && now_unix() <= v.identity.valid_until_unix
        });
        Some(match hit {
            Some(v) => Ok(v.identity.clone()),
            None => Err(refuse(
                Reason::CredentialInvalid,
                "the bearer JWT was not verified",
            )),
        })
    }

    fn remember(&self, policy: &Policy, token: &str, identity: Arc<JwtIdentity>) {
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if verified.len() >= VERIFIED_ENTRIES {
            verified.retain(|_, v| v.at.elapsed() < VERIFIED_TTL);
            if verified.len() >= VERIFIED_ENTRIES {
                verified.clear();
            }
        }
        verified.insert(
            crate::canonical::sha256_hex(token.as_bytes()),
            Verified {
                roles_sha256: policy.versions.roles.sha256.clone(),
                identity,
                at: Instant::now(),
            },
        );
    }

    /// The checks, in order: size and shape, header, issuer, algorithm, key, signature,
    /// times, audience.
    pub async fn verify(
        &self,
        providers: &BTreeMap<String, IdentityProvider>,
        resource: Option<&str>,
        token: &str,
    ) -> Result<JwtIdentity, Refusal> {
        let malformed = |why: &str| {
            refuse(
                Reason::JwtMalformed,
                format!("the bearer JWT is malformed: {why}"),
            )
        };
        if token.len() > MAX_JWT_BYTES {
            return Err(malformed(&format!(
                "it is {} bytes, more than the {MAX_JWT_BYTES} accepted",
                token.len()
            )));
        }
        let parts: Vec<&str> = token.split('.').collect();
        let [header, payload, _signature] = parts.as_slice() else {
            return Err(malformed("it does not have three dot-separated parts"));
        };
        let header = decode_part(header).map_err(|e| malformed(&format!("header: {e}")))?;
        let payload = decode_part(payload).map_err(|e| malformed(&format!("payload: {e}")))?;
        let Some(alg) = header.get("alg").and_then(Value::as_str) else {
            return Err(malformed("the header has no `alg`"));
        };
        if header.contains_key("crit") {
            return Err(malformed(
                "the header has `crit` extensions, none of which are understood",
            ));
        }
        let Some(issuer) = payload.get("iss").and_then(Value::as_str) else {
            return Err(malformed("the payload has no `iss`"));
        };
        let Some(provider) = providers.values().find(|p| p.issuer == issuer) else {
            return Err(refuse(
                Reason::JwtIssuerMismatch,
                format!("no identity provider has issuer `{}`", shown(issuer)),
            ));
        };
        if !JWT_ALGORITHMS.contains(&alg) || !provider.algorithms.iter().any(|a| a == alg) {
            return Err(refuse(
                Reason::JwtAlgorithmRefused,
                format!(
                    "algorithm `{}` is not accepted for identity provider `{}` (accepted: {})",
                    shown(alg),
                    provider.id,
                    provider.algorithms.join(", ")
                ),
            )
            .with_details(json!({ "accepted": provider.algorithms })));
        }
        let Some(kid) = header.get("kid").and_then(Value::as_str) else {
            return Err(refuse(
                Reason::JwtUnknownKid,
                "the JWT header names no key (`kid`)",
            ));
        };
        let key = self.key(provider, kid).await?;
        if !key.kind.fits(alg) || key.alg.as_deref().is_some_and(|a| a != alg) {
            return Err(refuse(
                Reason::JwtAlgorithmRefused,
                format!("key `{}` is not a key for algorithm `{alg}`", shown(kid)),
            ));
        }
        let algorithm: Algorithm = alg.parse().map_err(|_| {
            refuse(
                Reason::JwtAlgorithmRefused,
                format!("algorithm `{alg}` is not supported"),
            )
        })?;
        let mut validation = Validation::new(algorithm);
        // The claims are checked below, each with its own reason.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        if let Err(e) = jsonwebtoken::decode::<Value>(token, &key.decoding, &validation) {
            use jsonwebtoken::errors::ErrorKind as K;
            return Err(match e.kind() {
                K::InvalidSignature => refuse(
                    Reason::JwtSignatureInvalid,
                    format!("the signature does not verify with key `{}`", shown(kid)),
                ),
                K::Base64(_) | K::Json(_) | K::Utf8(_) | K::InvalidToken => {
                    malformed(&e.to_string())
                }
                _ => refuse(
                    Reason::JwtSignatureInvalid,
                    format!("the signature could not be verified: {e}"),
                ),
            });
        }
        check_claims(provider, resource, &payload)?;
        let text = |name: &str| -> Result<Option<String>, Refusal> {
            match payload.get(name) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(malformed(&format!("`{name}` is not a string"))),
            }
        };
        let exp = numeric(&payload, "exp")
            .map_err(|e| malformed(&e))?
            .unwrap_or(0);
        Ok(JwtIdentity {
            provider: provider.id.clone(),
            issuer: issuer.to_string(),
            subject: text("sub")?,
            kid: kid.to_string(),
            jti: text("jti")?,
            valid_until_unix: exp.saturating_add(provider.leeway_s),
            claims: payload,
        })
    }

    fn key_set(&self, source: &JwksSource) -> Arc<KeySet> {
        let id = match source {
            JwksSource::Uri(uri) => format!("uri:{uri}"),
            JwksSource::File(path) => format!("file:{}", path.display()),
        };
        let mut sets = self.key_sets.lock().unwrap_or_else(|p| p.into_inner());
        sets.entry(id).or_default().clone()
    }

    /// The key `kid` of the provider's key set: from the cache, or after a (rate
    /// limited) fetch.
    async fn key(&self, provider: &IdentityProvider, kid: &str) -> Result<Arc<Key>, Refusal> {
        let set = self.key_set(&provider.jwks);
        let refresh = Duration::from_secs(provider.jwks_refresh_s);
        let cooldown = Duration::from_secs(provider.jwks_cooldown_s);
        let asked = Instant::now();
        let (known, fresh, may_fetch) = {
            let state = set.state();
            let known = state.keys.as_ref().and_then(|k| k.by_kid.get(kid).cloned());
            let fresh = state.fetched.is_some_and(|t| t.elapsed() < refresh);
            let may_fetch = state.attempted.is_none_or(|t| t.elapsed() >= cooldown);
            (known, fresh, may_fetch)
        };
        if let (Some(key), true) = (&known, fresh) {
            return Ok(key.clone());
        }
        if may_fetch {
            let _one = set.fetching.lock().await;
            let someone_else = set.state().attempted.is_some_and(|t| t >= asked);
            if !someone_else {
                set.state().attempted = Some(Instant::now());
                let fetched = self.fetch(&provider.jwks).await;
                let mut state = set.state();
                match fetched {
                    Ok(keys) => {
                        state.keys = Some(Arc::new(keys));
                        state.fetched = Some(Instant::now());
                        state.error = None;
                    }
                    Err(e) => {
                        tracing::warn!(provider = %provider.id, error = %e, "jwks fetch failed");
                        state.error = Some(e);
                    }
                }
            }
        }
        let state = set.state();
        let usable = state
            .fetched
            .is_some_and(|t| t.elapsed() < refresh + MAX_STALE);
        let unavailable = |why: &str| {
            refuse(
                Reason::JwksUnavailable,
                format!(
                    "no signing keys of identity provider `{}` can be had: {why}",
                    provider.id
                ),
            )
            .with_details(json!({ "provider": provider.id }))
        };
        match (&state.keys, usable) {
            (Some(keys), true) => match keys.by_kid.get(kid) {
                Some(key) => Ok(key.clone()),
                None => match &state.error {
                    Some(e) => Err(unavailable(&format!(
                        "key `{}` is not cached and the key set could not be fetched again ({e})",
                        shown(kid)
                    ))),
                    None => Err(refuse(
                        Reason::JwtUnknownKid,
                        format!(
                            "identity provider `{}` publishes no usable key `{}`",
                            provider.id,
                            shown(kid)
                        ),
                    )),
                },
            },
            _ => Err(unavailable(
                state
                    .error
                    .as_deref()
                    .unwrap_or("the key set was never fetched"),
            )),
        }
    }

    /// Fetches and parses a key set, within [`JWKS_FETCH_TIMEOUT`] and
    /// [`MAX_JWKS_BYTES`].
    async fn fetch(&self, source: &JwksSource) -> Result<Keys, String> {
        let bytes = match source {
            JwksSource::File(path) => {
                let path = path.clone();
                let read = tokio::task::spawn_blocking(move || read_bounded_file(&path));
                read.await
                    .map_err(|_| "the read task failed".to_string())??
            }
            JwksSource::Uri(uri) => {
                let Some(http) = &self.http else {
                    return Err("no HTTP client could be built".into());
                };
                tokio::time::timeout(JWKS_FETCH_TIMEOUT, fetch_uri(http, uri))
                    .await
                    .map_err(|_| format!("the fetch took longer than {JWKS_FETCH_TIMEOUT:?}"))??
            }
        };
        parse_jwks(&bytes)
    }
}

async fn fetch_uri(http: &reqwest::Client, uri: &str) -> Result<Vec<u8>, String> {
    let mut response = http
        .get(uri)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| format!("fetching the key set failed: {e}"))?;
    if !response.status().is_success() {
        return Err(format!(
            "the key set endpoint answered {}",
            response.status()
        ));
    }
    if response
        .content_length()
        .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
    {
        return Err(format!("the key set is larger than {MAX_JWKS_BYTES} bytes"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("reading the key set failed: {e}"))?
    {
        if body.len() + chunk.len() > MAX_JWKS_BYTES {
            return Err(format!("the key set is larger than {MAX_JWKS_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn read_bounded_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    crate::localfile::read(path, MAX_JWKS_BYTES as u64)
        .map_err(|e| format!("reading `{}` failed: {e}", path.display()))
}

/// The usable keys of a JWK Set document. Keys that are not for signatures, have no
/// `kid`, are symmetric (`oct`), weak or unparseable are left out; a set with none left
/// is an error.
fn parse_jwks(bytes: &[u8]) -> Result<Keys, String> {
    let doc: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the key set is not JSON: {e}"))?;
    let Some(list) = doc.get("keys").and_then(Value::as_array) else {
        return Err("the key set has no `keys` array".into());
    };
    if list.len() > MAX_JWKS_KEYS {
        return Err(format!(
            "the key set has {} keys, more than {MAX_JWKS_KEYS}",
            list.len()
        ));
    }
    let mut by_kid = HashMap::new();
    for raw in list {
        if let Some((kid, key)) = usable_key(raw) {
            by_kid.insert(kid, Arc::new(key));
        }
    }
    if by_kid.is_empty() {
        return Err("the key set has no usable signing key".into());
    }
    Ok(Keys { by_kid })
}

fn usable_key(raw: &Value) -> Option<(String, Key)> {
    let kid = raw.get("kid")?.as_str()?.to_string();
    if raw.get("use").is_some_and(|u| u.as_str() != Some("sig")) {
        return None;
    }
    let alg = match raw.get("alg") {
        None => None,
        Some(a) => Some(a.as_str()?.to_string()),
    };
    let jwk: Jwk = serde_json::from_value(raw.clone()).ok()?;
    let kind = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            let n = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(rsa.n.trim_end_matches('='))
                .ok()?;
            let bits = n.iter().skip_while(|b| **b == 0).count() * 8;
            if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
                return None;
            }
            KeyKind::Rsa
        }
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => KeyKind::P256,
            EllipticCurve::P384 => KeyKind::P384,
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            EllipticCurve::Ed25519 => KeyKind::Ed25519,
            _ => return None,
        },
        // Never a shared secret; nothing unknown.
        _ => return None,
    };
    if alg.as_deref().is_some_and(|a| !kind.fits(a)) {
        return None;
    }
    let decoding = DecodingKey::from_jwk(&jwk).ok()?;
    Some((
        kid,
        Key {
            decoding,
            kind,
            alg,
        },
    ))
}

/// One base64url part of a compact JWT, decoded to a JSON object.
fn decode_part(part: &str) -> Result<Map<String, Value>, String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|e| format!("not base64url: {e}"))?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// A NumericDate claim: None when absent, an error when not a non-negative number.
fn numeric(claims: &Map<String, Value>, name: &str) -> Result<Option<u64>, String> {
    match claims.get(name) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(n) if n >= 0.0 && n.is_finite() => Ok(Some(n as u64)),
            _ => Err(format!("`{name}` is not a NumericDate")),
        },
    }
}

/// `exp` (required), `nbf`, `iat` within the leeway, and `aud`.
fn check_claims(
    provider: &IdentityProvider,
    resource: Option<&str>,
    claims: &Map<String, Value>,
) -> Result<(), Refusal> {
    let malformed = |why: String| {
        refuse(
            Reason::JwtMalformed,
            format!("the bearer JWT is malformed: {why}"),
        )
    };
    let now = now_unix();
    let leeway = provider.leeway_s;
    let Some(exp) = numeric(claims, "exp").map_err(malformed)? else {
        return Err(malformed(
            "the payload has no `exp`; tokens without an expiry are not accepted".into(),
        ));
    };
    if now > exp.saturating_add(leeway) {
        return Err(refuse(
            Reason::JwtExpired,
            format!("the JWT expired {} s ago (leeway {leeway} s)", now - exp),
        ));
    }
    if let Some(nbf) = numeric(claims, "nbf").map_err(malformed)?
        && nbf > now.saturating_add(leeway)
    {
        return Err(refuse(
            Reason::JwtNotYetValid,
            format!(
                "the JWT is not valid for another {} s (`nbf`, leeway {leeway} s)",
                nbf - now
            ),
        ));
    }
    if let Some(iat) = numeric(claims, "iat").map_err(malformed)?
        && iat > now.saturating_add(leeway)
    {
        return Err(refuse(
            Reason::JwtNotYetValid,
            format!(
                "the JWT says it was issued {} s in the future (`iat`, leeway {leeway} s)",
                iat - now
            ),
        ));
    }
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(Value::String(a)) => vec![a.as_str()],
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let accepted = |a: &&str| *a == provider.audience || resource.is_some_and(|r| r == *a);
    if !audiences.iter().any(accepted) {
        let mut expected = vec![provider.audience.clone()];
        expected.extend(resource.map(str::to_string));
        return Err(refuse(
            Reason::JwtAudienceMismatch,
            "the JWT's `aud` does not name this server".to_string(),
        )
        .with_details(json!({ "expected_audience": expected })));
    }
    Ok(())
}
