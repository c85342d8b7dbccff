//! The gateway's run-token operations: resolving a bearer token to its run binding,
//! creating a run that issues tokens, revoking one, and reading a call whose ids come
//! from its run token. The token store itself is `identity::run_tokens`.

use crate::call::{CallBody, Received};
use crate::diagnostic::{Reason, Refusal};
use crate::gateway::Gateway;
use crate::gateway::principal::Admin;
use crate::identity::{RunBinding, fill_from_binding, run_tokens};
use crate::policy::RunStatus;
use crate::requests::CreateRun;
use crate::runs::RunRecord;

/// `POST /v1/runs`' answer: the run, and the tokens issued for it (returned only here).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunCreated {
    #[serde(flatten)]
    pub run: RunRecord,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<run_tokens::IssuedToken>,
}

impl Gateway {
    /// The binding of a run token (None when `token` is another kind of credential):
    /// known, unexpired, not revoked, and its run not closed.
    pub fn run_binding(&self, token: &str) -> Option<Result<RunBinding, Refusal>> {
        let binding = match self.run_tokens.resolve(token)? {
            Ok(binding) => binding,
            Err(refusal) => return Some(Err(refusal)),
        };
        // Live runs are always in memory; a run that is not is closed (or never was).
        let open = self
            .runs
            .shared(&binding.run_id)
            .is_some_and(|run| run.status != RunStatus::Closed);
        if !open {
            return Some(Err(Refusal::new(
                Reason::CredentialExpired,
                format!(
                    "run token `{}` died when run `{}` closed",
                    binding.token_id, binding.run_id
                ),
            )));
        }
        Some(Ok(binding))
    }

    /// `POST /v1/runs`: creates the run (admin), then, with `issue_tokens`, issues one
    /// run token per entry. Each token is audited (`run_token_issued`, its sha256)
    /// before it is valid and returned, once.
    pub async fn create_run_issuing(
        &self,
        admin: &Admin,
        mut request: CreateRun,
    ) -> Result<RunCreated, Refusal> {
        let Some(issue) = request.issue_tokens.take() else {
            let run = self.create_run(admin, request).await?;
            return Ok(RunCreated {
                run,
                tokens: Vec::new(),
            });
        };
        // Every token request is checked before the run is created.
        let requests = run_tokens::parse_requests(&admin.loaded().policy, &issue)?;
        let run = self.create_run(admin, request).await?;
        let tokens = self
            .run_tokens
            .issue(&self.audit, &run.run_id, &requests, admin.admin_id())
            .await?;
        if let Some(cluster) = &self.cluster {
            self.fleet_publish_tokens(cluster, &tokens).await?;
        }
        Ok(RunCreated { run, tokens })
    }

    /// `POST /v1/runs/{run_id}/tokens/{token_id}/revoke` (admin): the token is dead
    /// once `run_token_revoked` is recorded.
    pub async fn revoke_run_token(
        &self,
        admin: &Admin,
        run_id: &str,
        token_id: &str,
    ) -> Result<run_tokens::Revoked, Refusal> {
        if let Some(cluster) = &self.cluster {
            return self
                .fleet_revoke_token(cluster, run_id, token_id, admin.admin_id())
                .await;
        }
        self.run_tokens
            .revoke(&self.audit, run_id, token_id, admin.admin_id())
            .await
    }

    /// Checks a tool call's body. With a run token, the body may omit `role_id`,
    /// `run_id` (the token names them), `scope` (the run's binds the call) and `lane_id`
    /// when the token names exactly one lane; ids the body does carry are checked
    /// against the token in steps 2-4 (a dead token is refused at step 2).
    pub fn parse_call(&self, token: Option<&str>, mut body: CallBody) -> Received {
        if let Some(binding) = token.and_then(|t| self.run_tokens.lookup(t)) {
            fill_from_binding(&mut body, &binding);
        }
        body.into_request()
    }
}
