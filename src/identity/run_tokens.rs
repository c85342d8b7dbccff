//! Run tokens: bearer tokens bound to one run, one role and some of its lanes.
//!
//! A token is 32 random bytes (base64url, prefixed `tgr_`), returned once when issued.
//! Only its sha256 is kept: in this table and in the `run_token_issued` audit event the
//! table is rebuilt from at start, so a restart keeps unexpired tokens valid. A token
//! dies when it expires, when an admin revokes it (`run_token_revoked`), or when its
//! run closes. Neither the token nor anything derived from it but the sha256 reaches a
//! log, a metric or an audit event.

use std::collections::HashMap;
use std::sync::RwLock;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use serde_json::{Value, json};

use crate::audit::{AuditError, AuditLog, EventFilter, EventType, NewEvent};
use crate::diagnostic::{Reason, Refusal};
use crate::policy::Policy;

/// Every run token starts with this, so a call's credential is told apart without a
/// table lookup per role.
pub const PREFIX: &str = "tgr_";
/// The lifetime of a token issued without `ttl_s` (or the policy's cap, when lower).
pub const DEFAULT_TTL_S: u64 = 3_600;
/// The longest lifetime a token may be issued with when roles.yaml does not set
/// `run_tokens.max_ttl_s`.
pub const MAX_TTL_S: u64 = crate::policy::DEFAULT_RUN_TOKEN_MAX_TTL_S;
/// The most tokens one `POST /v1/runs` may issue.
pub const MAX_TOKENS_PER_REQUEST: usize = 32;
/// The most live tokens kept; issuing more is refused (bounded memory).
pub const MAX_TOKENS: usize = 1_000_000;
/// The longest string taken for a run token (a real one is 47 bytes).
const MAX_TOKEN_LEN: usize = 128;

/// What a run token binds a call to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunBinding {
    /// The token's public id (`rtk-<uuid>`), recorded in audit events and used to
    /// revoke it.
    pub token_id: String,
    pub run_id: String,
    pub role_id: String,
    /// The lanes the token may act in (a subset of the role's), sorted.
    pub lanes: Vec<String>,
    /// Unix seconds after which the token is dead.
    pub expires_unix: i64,
}

/// One token's entry, keyed by the sha256 of the token.
#[derive(Debug, Clone)]
struct Entry {
    binding: RunBinding,
    revoked: bool,
}

/// A token to issue, as asked for in `issue_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    pub role_id: String,
    pub lanes: Vec<String>,
    pub ttl_s: u64,
}

/// An issued token, as returned (once) to the admin that created the run.
#[derive(Debug, Clone, Serialize)]
pub struct IssuedToken {
    pub role_id: String,
    pub token_id: String,
    pub token: String,
    pub lanes: Vec<String>,
    pub expires_utc: String,
}

/// `POST /v1/runs/{run_id}/tokens/{token_id}/revoke`'s answer: the token revoked.
#[derive(Debug, Clone, Serialize)]
pub struct Revoked {
    pub run_id: String,
    pub token_id: String,
    pub role_id: String,
    /// Always true: a token that is not revoked is refused, never answered.
    pub revoked: bool,
}

impl Revoked {
    pub fn new(run_id: &str, token_id: &str, role_id: String) -> Revoked {
        Revoked {
            run_id: run_id.to_string(),
            token_id: token_id.to_string(),
            role_id,
            revoked: true,
        }
    }
}

/// The run tokens by sha256, rebuilt from the audit log.
#[derive(Debug, Default)]
pub struct RunTokenStore {
    by_hash: RwLock<HashMap<String, Entry>>,
    /// token_id -> sha256, for revocation.
    by_id: RwLock<HashMap<String, String>>,
    /// Serializes writers so the audit order and the table order agree.
    write: tokio::sync::Mutex<()>,
}

fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

fn malformed(problem: String) -> Refusal {
    Refusal::new(
        Reason::RequestMalformed,
        format!("malformed request: {problem}"),
    )
    .with_details(json!({ "problems": [problem] }))
}

/// Reads `issue_tokens` of a `POST /v1/runs` body: a list of `{role_id, lanes?,
/// ttl_s?}`, each naming an enabled role, lanes it may act in, and a lifetime of 1 to
/// the policy's `run_tokens.max_ttl_s` seconds.
pub fn parse_requests(policy: &Policy, value: &Value) -> Result<Vec<TokenRequest>, Refusal> {
    let items = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) if items.len() <= MAX_TOKENS_PER_REQUEST => items,
        Value::Array(_) => {
            return Err(malformed(format!(
                "`issue_tokens` may ask for at most {MAX_TOKENS_PER_REQUEST} tokens"
            )));
        }
        _ => return Err(malformed("`issue_tokens` must be an array".into())),
    };
    let mut requests = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(obj) = item else {
            return Err(malformed(format!("`issue_tokens[{i}]` must be an object")));
        };
        if let Some(key) = obj
            .keys()
            .find(|k| !["role_id", "lanes", "ttl_s"].contains(&k.as_str()))
        {
            return Err(malformed(format!(
                "`issue_tokens[{i}]`: unknown field `{}`",
                key.chars().take(64).collect::<String>()
            )));
        }
        let Some(role_id) = obj.get("role_id").and_then(Value::as_str) else {
            return Err(malformed(format!(
                "`issue_tokens[{i}].role_id` must be a string"
            )));
        };
        let Some(role) = policy.roles.get(role_id).filter(|r| r.enabled) else {
            return Err(malformed(format!(
                "`issue_tokens[{i}].role_id`: `{}` is not an enabled role",
                role_id.chars().take(64).collect::<String>()
            )));
        };
        let mut lanes: Vec<String> = match obj.get("lanes") {
            None | Some(Value::Null) => role.lanes.clone(),
            Some(Value::Array(names)) if !names.is_empty() => {
                let mut lanes = Vec::with_capacity(names.len());
                for name in names {
                    match name.as_str() {
                        Some(lane) if role.lanes.iter().any(|l| l == lane) => {
                            lanes.push(lane.to_string());
                        }
                        _ => {
                            return Err(malformed(format!(
                                "`issue_tokens[{i}].lanes` must name lanes role `{role_id}` may act in: {:?}",
                                role.lanes
                            )));
                        }
                    }
                }
                lanes
            }
            Some(_) => {
                return Err(malformed(format!(
                    "`issue_tokens[{i}].lanes` must be a non-empty array of lane ids"
                )));
            }
        };
        lanes.sort();
        lanes.dedup();
        if lanes.is_empty() {
            // A token acts only in its lanes: one with none could never act.
            return Err(malformed(format!(
                "`issue_tokens[{i}]`: role `{role_id}` may act in no lane, so a run token for it could never act; a token's `lanes` are a non-empty subset of its role's"
            )));
        }
        let max_ttl_s = policy.identity.run_token_max_ttl_s;
        let ttl_s = match obj.get("ttl_s") {
            None | Some(Value::Null) => DEFAULT_TTL_S.min(max_ttl_s),
            Some(v) => match v.as_u64() {
                Some(n) if (1..=max_ttl_s).contains(&n) => n,
                _ => {
                    return Err(malformed(format!(
                        "`issue_tokens[{i}].ttl_s` must be an integer from 1 to {max_ttl_s} (roles.yaml `run_tokens.max_ttl_s`)"
                    )));
                }
            },
        };
        requests.push(TokenRequest {
            role_id: role_id.to_string(),
            lanes,
            ttl_s,
        });
    }
    Ok(requests)
}

/// A fresh token: `tgr_` and 32 random bytes in base64url.
fn mint() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

impl RunTokenStore {
    /// Rebuilds the table from `run_token_issued` and `run_token_revoked` events,
    /// leaving out tokens that expired.
    pub async fn rebuild(audit: &AuditLog) -> Result<RunTokenStore, AuditError> {
        let events = audit
            .events(EventFilter {
                event_types: vec![EventType::RunTokenIssued, EventType::RunTokenRevoked],
                ..EventFilter::default()
            })
            .await?;
        let now = now_unix();
        let mut by_hash = HashMap::new();
        let mut by_id = HashMap::new();
        for event in events.iter().map(|e| &e.value) {
            let d = &event["details"];
            let Some(token_id) = d["token_id"].as_str() else {
                continue;
            };
            match event["type"].as_str() {
                Some("run_token_issued") => {
                    let (Some(hash), Some(run_id), Some(role_id), Some(expires)) = (
                        d["token_sha256"].as_str(),
                        event["run_id"].as_str(),
                        event["role_id"].as_str(),
                        d["expires_unix"].as_i64(),
                    ) else {
                        continue;
                    };
                    if expires <= now {
                        continue;
                    }
                    let lanes = d["lanes"]
                        .as_array()
                        .map(|l| {
                            l.iter()
                                .filter_map(|v| v.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default();
                    let binding = RunBinding {
                        token_id: token_id.to_string(),
                        run_id: run_id.to_string(),
                        role_id: role_id.to_string(),
                        lanes,
                        expires_unix: expires,
                    };
                    by_id.insert(token_id.to_string(), hash.to_string());
                    by_hash.insert(
                        hash.to_string(),
                        Entry {
                            binding,
                            revoked: false,
                        },
                    );
                }
                Some("run_token_revoked") => {
                    if let Some(entry) = by_id.get(token_id).and_then(|h| by_hash.get_mut(h)) {
                        entry.revoked = true;
                    }
                }
                _ => {}
            }
        }
        Ok(RunTokenStore {
            by_hash: RwLock::new(by_hash),
            by_id: RwLock::new(by_id),
            write: tokio::sync::Mutex::new(()),
        })
    }

    /// Live (unexpired) tokens in the table.
    pub fn len(&self) -> usize {
        self.by_hash.read().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Mints the tokens of `requests` for `run_id`, records each as `run_token_issued`
    /// (its sha256, never the token) and only then makes it valid.
    pub async fn issue(
        &self,
        audit: &AuditLog,
        run_id: &str,
        requests: &[TokenRequest],
        by: &str,
    ) -> Result<Vec<IssuedToken>, Refusal> {
        let _writer = self.write.lock().await;
        self.sweep();
        if self.len() + requests.len() > MAX_TOKENS {
            return Err(Refusal::new(
                Reason::InternalError,
                "the run token table is full",
            ));
        }
        let mut issued = Vec::with_capacity(requests.len());
        for request in requests {
            let token = mint().map_err(|e| {
                Refusal::new(
                    Reason::InternalError,
                    format!("no token could be minted: {e}"),
                )
            })?;
            let hash = crate::canonical::sha256_hex(token.as_bytes());
            let token_id = format!("rtk-{}", uuid::Uuid::new_v4());
            let expires_unix = now_unix().saturating_add(request.ttl_s as i64);
            let expires_utc = rfc3339(expires_unix);
            let mut event = NewEvent::new(EventType::RunTokenIssued);
            event.run_id = Some(run_id.to_string());
            event.role_id = Some(request.role_id.clone());
            event.details.insert("token_id".into(), json!(token_id));
            event.details.insert("token_sha256".into(), json!(hash));
            event.details.insert("lanes".into(), json!(request.lanes));
            event.details.insert("ttl_s".into(), json!(request.ttl_s));
            event
                .details
                .insert("expires_unix".into(), json!(expires_unix));
            event
                .details
                .insert("expires_utc".into(), json!(expires_utc));
            event.details.insert("by".into(), json!(by));
            audit.append(event).await.map_err(|e| {
                Refusal::new(
                    Reason::AuditUnavailable,
                    format!("the audit log could not record the token: {e}"),
                )
            })?;
            let binding = RunBinding {
                token_id: token_id.clone(),
                run_id: run_id.to_string(),
                role_id: request.role_id.clone(),
                lanes: request.lanes.clone(),
                expires_unix,
            };
            if let (Ok(mut by_hash), Ok(mut by_id)) = (self.by_hash.write(), self.by_id.write()) {
                by_id.insert(token_id.clone(), hash.clone());
                by_hash.insert(
                    hash,
                    Entry {
                        binding,
                        revoked: false,
                    },
                );
            }
            issued.push(IssuedToken {
                role_id: request.role_id.clone(),
                token_id,
                token,
                lanes: request.lanes.clone(),
                expires_utc,
            });
        }
        Ok(issued)
    }

    /// Revokes a token of `run_id` by its id: records `run_token_revoked`, then the
    /// token is dead. Revoking a dead or unknown token is refused as not found.
    pub async fn revoke(
        &self,
        audit: &AuditLog,
        run_id: &str,
        token_id: &str,
        by: &str,
    ) -> Result<Revoked, Refusal> {
        let _writer = self.write.lock().await;
        let not_found = || {
            Refusal::new(
                Reason::RequestMalformed,
                format!(
                    "run `{run_id}` has no live run token `{}`",
                    token_id.chars().take(64).collect::<String>()
                ),
            )
            .with_details(json!({ "problems": ["no such live run token"] }))
        };
        let hash = self
            .by_id
            .read()
            .ok()
            .and_then(|ids| ids.get(token_id).cloned())
            .ok_or_else(not_found)?;
        let entry = self
            .by_hash
            .read()
            .ok()
            .and_then(|m| m.get(&hash).cloned())
            .filter(|e| !e.revoked && e.binding.run_id == run_id)
            .ok_or_else(not_found)?;
        let mut event = NewEvent::new(EventType::RunTokenRevoked);
        event.run_id = Some(run_id.to_string());
        event.role_id = Some(entry.binding.role_id.clone());
        event.details.insert("token_id".into(), json!(token_id));
        event.details.insert("by".into(), json!(by));
        audit.append(event).await.map_err(|e| {
            Refusal::new(
                Reason::AuditUnavailable,
                format!("the audit log could not record the revocation: {e}"),
            )
        })?;
        if let Ok(mut by_hash) = self.by_hash.write()
            && let Some(entry) = by_hash.get_mut(&hash)
        {
            entry.revoked = true;
        }
        Ok(Revoked::new(run_id, token_id, entry.binding.role_id))
    }

    /// The binding of `token` if it is a run token: None when it is not one (another
    /// kind of credential), an error when it is unknown, expired or revoked. Whether
    /// its run is still open is the caller's check ([`crate::gateway::Gateway`]).
    pub fn resolve(&self, token: &str) -> Option<Result<RunBinding, Refusal>> {
        if !token.starts_with(PREFIX) {
            return None;
        }
        let invalid = || {
            Refusal::new(
                Reason::CredentialInvalid,
                "the bearer token is not a valid run token",
            )
        };
        if token.len() > MAX_TOKEN_LEN {
            return Some(Err(invalid()));
        }
        let hash = crate::canonical::sha256_hex(token.as_bytes());
        let entry = self.by_hash.read().ok().and_then(|m| m.get(&hash).cloned());
        let Some(entry) = entry else {
            return Some(Err(invalid()));
        };
        if entry.revoked {
            return Some(Err(Refusal::new(
                Reason::CredentialExpired,
                format!("run token `{}` was revoked", entry.binding.token_id),
            )));
        }
        if entry.binding.expires_unix <= now_unix() {
            return Some(Err(Refusal::new(
                Reason::CredentialExpired,
                format!(
                    "run token `{}` expired at {}",
                    entry.binding.token_id,
                    rfc3339(entry.binding.expires_unix)
                ),
            )));
        }
        Some(Ok(entry.binding))
    }

    /// The binding a run token names, live or not (None for an unknown token): used
    /// only to fill the ids a call may leave out, so a dead token's call still parses
    /// and is refused at step 2 with the reason it died.
    pub fn lookup(&self, token: &str) -> Option<RunBinding> {
        if !token.starts_with(PREFIX) || token.len() > MAX_TOKEN_LEN {
            return None;
        }
        let hash = crate::canonical::sha256_hex(token.as_bytes());
        let by_hash = self.by_hash.read().ok()?;
        by_hash.get(&hash).map(|e| e.binding.clone())
    }

    /// Keeps a token as read from the cluster database (`serve --cluster-db`), the
    /// authority in a fleet; `None` forgets it (the database has no such token).
    pub fn remember(&self, sha256: &str, found: Option<(RunBinding, bool)>) {
        if let (Ok(mut by_hash), Ok(mut by_id)) = (self.by_hash.write(), self.by_id.write()) {
            match found {
                Some((binding, revoked)) => {
                    // A cache in a fleet: kept within MAX_TOKENS by dropping one token,
                    // which the next call carrying it reads again.
                    if by_hash.len() >= MAX_TOKENS
                        && !by_hash.contains_key(sha256)
                        && let Some(old) = by_hash.keys().next().cloned()
                        && let Some(entry) = by_hash.remove(&old)
                    {
                        by_id.remove(&entry.binding.token_id);
                    }
                    by_id.insert(binding.token_id.clone(), sha256.to_string());
                    by_hash.insert(sha256.to_string(), Entry { binding, revoked });
                }
                None => {
                    if let Some(entry) = by_hash.remove(sha256) {
                        by_id.remove(&entry.binding.token_id);
                    }
                }
            }
        }
    }

    /// The sha256 of `token` when it has the form of a run token.
    pub fn hash_of(token: &str) -> Option<String> {
        (token.starts_with(PREFIX) && token.len() <= MAX_TOKEN_LEN)
            .then(|| crate::canonical::sha256_hex(token.as_bytes()))
    }

    /// Drops expired tokens.
    fn sweep(&self) {
        let now = now_unix();
        if let (Ok(mut by_hash), Ok(mut by_id)) = (self.by_hash.write(), self.by_id.write()) {
            by_hash.retain(|_, e| e.binding.expires_unix > now);
            by_id.retain(|_, hash| by_hash.contains_key(hash));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_are_prefixed_random_and_short() {
        let a = mint().unwrap();
        let b = mint().unwrap();
        assert!(a.starts_with(PREFIX) && b.starts_with(PREFIX));
        assert_ne!(a, b);
        assert_eq!(a.len(), PREFIX.len() + 43);
        assert!(a.len() <= MAX_TOKEN_LEN);
    }

    #[test]
    fn a_token_that_is_not_a_run_token_is_left_to_other_checks() {
        let store = RunTokenStore::default();
        assert!(store.resolve("demo-research_agent").is_none());
        let unknown = store.resolve("tgr_unknown").unwrap().unwrap_err();
        assert_eq!(unknown.reason, Reason::CredentialInvalid);
        let long = format!("{PREFIX}{}", "a".repeat(100_000));
        let refused = store.resolve(&long).unwrap().unwrap_err();
        assert_eq!(refused.reason, Reason::CredentialInvalid);
    }
}
