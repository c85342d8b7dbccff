//! A request's credential, resolved before the pure decision: a run token's binding
//! (table lookup, clock, the run's status) or a verified bearer JWT (key-set cache,
//! clock), or neither (a static token, or none). A call and the commit of a prepared
//! call resolve it here, the same way, and hand it to `authz::admit` as a `Caller`.

use std::sync::Arc;

use serde_json::Value;

use super::Gateway;
use crate::authz::Caller;
use crate::diagnostic::Refusal;
use crate::identity::{JwtIdentity, RunBinding};
use crate::policy::Policy;

/// A request's credential as resolved for one decision.
pub struct Credential<'t> {
    /// The bearer token as sent.
    token: Option<&'t str>,
    /// A run token's binding, or why it is dead (None: not a run token).
    pub run: Option<Result<RunBinding, Refusal>>,
    /// A verified JWT, or why it does not verify (None: not a JWT, or a run token).
    pub jwt: Option<Result<Arc<JwtIdentity>, Refusal>>,
}

impl Credential<'_> {
    /// The caller the decision checks.
    pub fn caller(&self) -> Caller<'_> {
        match (&self.run, &self.jwt) {
            (Some(bound), _) => Caller::Run(bound),
            (None, Some(jwt)) => Caller::Jwt(jwt),
            (None, None) => Caller::Token(self.token),
        }
    }

    /// What the audit events record about the caller beyond the role (a run token's
    /// id, a JWT's issuer and subject); never the token.
    pub fn caller_json(&self) -> Option<Value> {
        match (&self.run, &self.jwt) {
            (Some(Ok(binding)), _) => Some(crate::identity::caller_json(binding)),
            (None, Some(Ok(identity))) => Some(identity.caller_json()),
            _ => None,
        }
    }
}

impl Gateway {
    /// Resolves the bearer token of a request: a run token first, then a JWT.
    pub async fn credential<'t>(&self, policy: &Policy, token: Option<&'t str>) -> Credential<'t> {
        let run = token.and_then(|t| self.run_binding(t));
        let jwt = match &run {
            Some(_) => None,
            None => self.authenticate(policy, token).await,
        };
        Credential { token, run, jwt }
    }
}
