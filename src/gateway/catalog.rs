//! The catalog of tools a caller sees on a run: what the MCP front answers to
//! `tools/list` (and checks before `initialize`, `server/discover` and `ping`).

use crate::authz;
use crate::diagnostic::Refusal;
use crate::gateway::Gateway;

impl Gateway {
    /// The catalog an MCP client sees on a run (`tools/list`; the admission of
    /// `initialize`, `server/discover` and `ping`): [`Gateway::tool_catalog`], after the
    /// checks a call on that run passes at steps 3 and 4: a run token is the run's
    /// (`credential_not_for_run`), the run exists and is pinned to the loaded policy,
    /// and its status lets the lane act (`run_not_active`).
    pub async fn run_catalog(
        &self,
        token: Option<&str>,
        role_id: &str,
        run_id: &str,
        lane_id: &str,
    ) -> Result<super::ToolCatalog, Refusal> {
        if let Some(Ok(binding)) = token.and_then(|t| self.run_binding(t)) {
            authz::check_token_run(&binding, run_id)?;
        }
        let caller = self.role_caller(token, role_id, lane_id)?;
        let catalog = self.tool_catalog(&caller)?;
        if self.cluster.is_some() {
            self.fleet_refresh(None, Some(run_id)).await?;
        }
        let loaded = self.current();
        let policy = &loaded.policy;
        let run = self.runs.get(run_id);
        let run = authz::verify_run(run.as_ref(), run_id, &policy.versions)?;
        authz::authorize_lane(policy, authz::find_role(policy, role_id)?, lane_id, run)?;
        Ok(catalog)
    }
}
