//! Identities beyond static role tokens: run tokens bound to one run, role and lanes,
//! and OIDC/JWT workload identities (`jwt`).
//!
//! A run token is minted when an admin creates a run (`issue_tokens`), returned once,
//! and kept only as its sha256 (in memory and in the `run_token_issued` audit event the
//! table is rebuilt from at start). A call with a run token is bound to the token's run,
//! role and lanes (pipeline steps 2-4).

pub mod jwt;
pub mod run_tokens;

use serde_json::{Value, json};

pub use jwt::{JwtIdentity, JwtVerifier};
pub use run_tokens::{RunBinding, RunTokenStore};

use crate::call::CallBody;
use crate::policy::Credential;

/// Whether `token` is the static token a run-tokens-only role still binds (so the
/// refusal can say `run_token_required` instead of `credential_invalid`).
pub fn static_token_of_run_tokens_only(credential: &Credential, token: &str) -> bool {
    let Credential::RunTokensOnly {
        sha256: Some(expected),
    } = credential
    else {
        return false;
    };
    let actual = crate::canonical::sha256_hex(token.as_bytes());
    subtle::ConstantTimeEq::ct_eq(actual.as_bytes(), expected.as_bytes()).into()
}

/// What the audit events of a run-token call record about the caller (never the token).
pub fn caller_json(binding: &RunBinding) -> Value {
    json!({ "kind": "run_token", "token_id": binding.token_id })
}

/// Fills the ids a run-token call may leave out.
pub fn fill_from_binding(body: &mut CallBody, binding: &RunBinding) {
    let absent = |field: &Option<Value>| matches!(field, None | Some(Value::Null));
    if absent(&body.role_id) {
        body.role_id = Some(json!(binding.role_id));
    }
    if absent(&body.run_id) {
        body.run_id = Some(json!(binding.run_id));
    }
    if absent(&body.scope) {
        // The run's scope binds the call (the effective scope); the call adds nothing.
        body.scope = Some(json!({}));
    }
    if absent(&body.lane_id)
        && let [lane] = binding.lanes.as_slice()
    {
        body.lane_id = Some(json!(lane));
    }
}
