//! The gateway's OIDC/JWT operations: verifying a bearer JWT before the pure decision
//! (`identity::jwt`), the admin and role checks that accept a verified JWT, and the MCP
//! resource URI derived from `serve --public-url`.

use std::sync::Arc;

use crate::authz;
use crate::diagnostic::Refusal;
use crate::gateway::Gateway;
use crate::identity::JwtIdentity;
use crate::policy::{Admin, Policy, Role};

/// The MCP front's path (`mcp::front::ENDPOINT`; the front sits above the gateway).
const MCP_ENDPOINT: &str = "/mcp";

impl Gateway {
    /// Sets the public base URL the MCP resource URI is derived from.
    pub fn with_public_url(mut self, public_url: Option<String>) -> Gateway {
        self.public_url = public_url.map(|u| u.trim_end_matches('/').to_string());
        self
    }

    /// The public base URL, when configured (`serve --public-url`).
    pub fn public_url(&self) -> Option<&str> {
        self.public_url.as_deref()
    }

    /// The MCP resource URI (RFC 9728 `resource`), when a public URL is configured.
    pub fn resource_uri(&self) -> Option<String> {
        self.public_url
            .as_ref()
            .map(|base| format!("{base}{MCP_ENDPOINT}"))
    }

    /// Verifies a bearer JWT (None for any other kind of credential, or when the
    /// policy has no identity providers). A verified token is remembered briefly so
    /// the synchronous checks of the same request find it.
    pub async fn authenticate(
        &self,
        policy: &Policy,
        token: Option<&str>,
    ) -> Option<Result<Arc<JwtIdentity>, Refusal>> {
        let resource = self.resource_uri();
        self.jwt
            .authenticate(policy, resource.as_deref(), token?)
            .await
    }

    /// Admin endpoints: the caller proves it is one of the policy's admins, by a static
    /// token or by a JWT verified for this request (`authenticate`).
    pub(super) fn admin_of<'p>(
        &self,
        policy: &'p Policy,
        token: Option<&str>,
    ) -> Result<&'p Admin, Refusal> {
        match token.and_then(|t| self.jwt.cached(policy, t)) {
            Some(identity) => authz::verify_admin_jwt(policy, &*identity?),
            None => authz::verify_admin(policy, token),
        }
    }

    /// Read-only audit endpoints: the caller proves it is one of the policy's admins,
    /// `full` or `audit_read`, by a static token or a JWT verified for this request.
    pub(super) fn auditor_of<'p>(
        &self,
        policy: &'p Policy,
        token: Option<&str>,
    ) -> Result<&'p Admin, Refusal> {
        match token.and_then(|t| self.jwt.cached(policy, t)) {
            Some(identity) => authz::verify_auditor_jwt(policy, &*identity?),
            None => authz::verify_auditor(policy, token),
        }
    }

    /// The caller proves it holds `role_id`, by a static token or by a JWT verified for
    /// this request (`authenticate`).
    pub(super) fn role_of<'p>(
        &self,
        policy: &'p Policy,
        role_id: &str,
        token: Option<&str>,
    ) -> Result<&'p Role, Refusal> {
        match token.and_then(|t| self.jwt.cached(policy, t)) {
            Some(identity) => authz::verify_jwt(policy, role_id, &*identity?),
            None => authz::verify_identity(policy, role_id, token),
        }
    }
}
