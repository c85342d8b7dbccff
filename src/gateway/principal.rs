//! Who a request of the admin API is: the one authentication step of a request that is
//! not a tool call, and the proofs it produces. A handler authenticates first
//! (`Gateway::admin`, `auditor`, `reader`, `principal` or `approver`), then parses
//! its query and body, then calls the gateway method, which takes the proof.
//!
//! INVARIANT: only this file constructs a proof (their fields are private), and every
//! gateway method of the admin API takes one, so a method cannot run for a caller that
//! was not authenticated, and a malformed request is answered only to an authenticated
//! caller. Tool calls, commits and artifact reads authenticate inside their audited
//! paths (`Credential`): a bad credential there is recorded, not only refused.

use std::sync::Arc;

use serde_json::json;

use super::{Gateway, Loaded};
use crate::approvals::{self, ApprovalRecord};
use crate::authz;
use crate::diagnostic::{Reason, Refusal};
use crate::identity::RunBinding;
use crate::policy::AdminAccess;

/// Proof that the caller is one of the policy's admins with full access.
pub struct Admin {
    admin_id: String,
    /// The policy snapshot the credential was checked against.
    loaded: Arc<Loaded>,
}

impl Admin {
    /// The admin's id, as the audit events name it (`by`).
    pub fn admin_id(&self) -> &str {
        &self.admin_id
    }

    /// The policy snapshot the credential was checked against.
    pub fn loaded(&self) -> &Arc<Loaded> {
        &self.loaded
    }
}

/// Proof that the caller is one of the policy's admins, `full` or `audit_read`: it
/// may read the audit log and the runs' evidence.
pub struct Auditor {
    _admin_id: String,
}

/// Proof that the caller holds a known credential: an admin's (either access) or a
/// role's. It may read what every credential may read (a run, the policy's versions,
/// the safety lock).
pub struct Reader {
    _proven: (),
}

/// Proof that the caller holds a role, for one of its lanes: by the role's static
/// token or JWT, or by a run token of that role that names the lane.
pub struct RoleCaller {
    role_id: String,
    lane_id: String,
    /// The policy snapshot the credential was checked against.
    loaded: Arc<Loaded>,
}

impl RoleCaller {
    pub fn role_id(&self) -> &str {
        &self.role_id
    }

    pub fn lane_id(&self) -> &str {
        &self.lane_id
    }

    /// The policy snapshot the credential was checked against.
    pub fn loaded(&self) -> &Arc<Loaded> {
        &self.loaded
    }
}

/// Who is reading or deciding approvals: every principal a credential proves.
pub struct Principal {
    /// `admin:<id>` when the credential is an admin's with full access.
    admin: Option<String>,
    /// `admin:<id>` when the credential is an `access: audit_read` admin's: it reads
    /// every approval and decides none.
    auditor: Option<String>,
    /// The roles the credential proves.
    roles: Vec<String>,
    /// `issuer#subject` of a JWT credential.
    subject: Option<String>,
    /// A run token's binding: it reads the approvals its role requested in its run
    /// (an agent polling its own approval) and decides none.
    run: Option<RunBinding>,
}

impl Principal {
    /// `admin:<id>` of an admin with full access.
    pub fn admin(&self) -> Option<&str> {
        self.admin.as_deref()
    }

    /// The roles the credential proves.
    pub fn roles(&self) -> &[String] {
        &self.roles
    }

    /// `issuer#subject` of a JWT credential.
    pub fn subject(&self) -> Option<&str> {
        self.subject.as_deref()
    }

    /// May read this approval: an admin (either access), an eligible approver, the
    /// requester's role, or a run token of the requester's role in the approval's run.
    pub fn may_read(&self, record: &ApprovalRecord) -> bool {
        self.admin.is_some()
            || self.auditor.is_some()
            || self
                .roles
                .iter()
                .any(|r| record.eligible(r) || *r == record.requester.role_id)
            || self.run.as_ref().is_some_and(|run| {
                run.role_id == record.requester.role_id && run.run_id == record.binding.run_id
            })
    }
}

/// Proof that the caller may decide approvals: a [`Principal`] that is an admin with
/// full access or proves a role (whether it may decide a given approval is that
/// approval's question).
pub struct Approver(Principal);

impl std::ops::Deref for Approver {
    type Target = Principal;

    fn deref(&self) -> &Principal {
        &self.0
    }
}

impl Gateway {
    /// Authenticates an admin with full access, by a static token or by a JWT verified
    /// for this request.
    pub fn admin(&self, token: Option<&str>) -> Result<Admin, Refusal> {
        let loaded = self.current();
        let admin_id = self.admin_of(&loaded.policy, token)?.admin_id.clone();
        Ok(Admin { admin_id, loaded })
    }

    /// Authenticates an admin of either access (`full` or `audit_read`).
    pub fn auditor(&self, token: Option<&str>) -> Result<Auditor, Refusal> {
        let loaded = self.current();
        let admin_id = self.auditor_of(&loaded.policy, token)?.admin_id.clone();
        Ok(Auditor {
            _admin_id: admin_id,
        })
    }

    /// Authenticates any role's or admin's credential (the read-only endpoints).
    pub fn reader(&self, token: Option<&str>) -> Result<Reader, Refusal> {
        self.verify_any(token)?;
        Ok(Reader { _proven: () })
    }

    /// Authenticates a role's caller for `lane_id` (the tool catalog): a run token of
    /// that role whose lanes include it, or the role's static token or JWT (whether
    /// the role may act in the lane is the catalog's question).
    pub fn role_caller(
        &self,
        token: Option<&str>,
        role_id: &str,
        lane_id: &str,
    ) -> Result<RoleCaller, Refusal> {
        let loaded = self.current();
        let policy = &loaded.policy;
        match token.and_then(|t| self.run_binding(t)) {
            // A run token: its role, and only its lanes.
            Some(bound) => {
                let binding = bound?;
                authz::verify_run_token(policy, &binding, role_id)?;
                authz::check_token_lane(&binding, lane_id)?;
            }
            None => {
                self.role_of(policy, role_id, token)?;
            }
        }
        Ok(RoleCaller {
            role_id: role_id.to_string(),
            lane_id: lane_id.to_string(),
            loaded,
        })
    }

    /// Authenticates the principals a credential proves (admin of either access,
    /// roles, JWT subject, a run token's binding), or says why none. In a fleet a run
    /// token is read from the cluster database first.
    pub async fn principal(&self, token: Option<&str>) -> Result<Principal, Refusal> {
        let loaded = self.current();
        let policy = &loaded.policy;
        if let Some(t) = token
            && crate::identity::RunTokenStore::hash_of(t).is_some()
        {
            self.fleet_refresh(token, None).await?;
            return match self.run_binding(t) {
                Some(Ok(run)) => Ok(Principal {
                    admin: None,
                    auditor: None,
                    roles: Vec::new(),
                    subject: None,
                    run: Some(run),
                }),
                Some(Err(refusal)) => Err(refusal),
                None => Err(Refusal::new(
                    Reason::CredentialInvalid,
                    "the bearer token is not a valid run token",
                )),
            };
        }
        let subject = token
            .and_then(|t| self.jwt.cached(policy, t))
            .and_then(Result::ok)
            .and_then(|identity| approvals::subject_of(&identity.caller_json()));
        let (admin, auditor) = match self.auditor_of(policy, token) {
            Ok(a) if a.access == AdminAccess::Full => (Some(format!("admin:{}", a.admin_id)), None),
            Ok(a) => (None, Some(format!("admin:{}", a.admin_id))),
            Err(_) => (None, None),
        };
        let roles: Vec<String> = policy
            .roles
            .keys()
            .filter(|role_id| self.role_of(policy, role_id, token).is_ok())
            .cloned()
            .collect();
        if admin.is_none() && auditor.is_none() && roles.is_empty() {
            self.verify_any(token)?;
            return Err(Refusal::new(
                Reason::CredentialInvalid,
                "the bearer token is not a known credential",
            ));
        }
        Ok(Principal {
            admin,
            auditor,
            roles,
            subject,
            run: None,
        })
    }

    /// Authenticates an approver: [`Gateway::principal`], refused for a credential
    /// that never decides (an `audit_read` admin, a run token) before its request is
    /// read.
    pub async fn approver(&self, token: Option<&str>) -> Result<Approver, Refusal> {
        let principal = self.principal(token).await?;
        if principal.admin.is_some() || !principal.roles.is_empty() {
            return Ok(Approver(principal));
        }
        // Authenticated, but a credential that never decides.
        Err(match (&principal.auditor, &principal.run) {
            (Some(auditor), _) => Refusal::new(
                Reason::CredentialInvalid,
                format!(
                    "{auditor} has `access: audit_read`: it reads approvals but never decides one; deciding needs an approver's credential (an admin with full access or a role the approval names)"
                ),
            )
            .with_details(json!({ "access": "audit_read", "needs": "full" })),
            (None, Some(run)) => Refusal::new(
                Reason::CredentialInvalid,
                format!(
                    "run token `{}` may read the approvals its role requested in run `{}` but never decides one; deciding needs an approver's credential",
                    run.token_id, run.run_id
                ),
            )
            .with_details(json!({ "credential": "run_token", "needs": "approver" })),
            (None, None) => Refusal::new(
                Reason::CredentialInvalid,
                "the bearer token is not a known credential",
            ),
        })
    }
}

/// A proof of the admin API's authentication step: what a server handler must hold
/// before it reads a request's query or body. Implemented by the proofs of this file
/// only (sealed).
pub trait Authenticated: sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Admin {}
    impl Sealed for super::Auditor {}
    impl Sealed for super::Reader {}
    impl Sealed for super::Principal {}
    impl Sealed for super::Approver {}
    impl Sealed for super::RoleCaller {}
}

impl Authenticated for Admin {}
impl Authenticated for Auditor {}
impl Authenticated for Reader {}
impl Authenticated for Principal {}
impl Authenticated for Approver {}
impl Authenticated for RoleCaller {}
