//! Roles, admins and their credentials: who may prove a principal, and what a
//! credential change admits.

use super::*;

/// Compares credentials without ever exposing a hash: the kind and, for `token_env`,
/// the variable name.
pub(super) fn same_credential(a: &Credential, b: &Credential) -> bool {
    match (a, b) {
        (Credential::TokenSha256(x), Credential::TokenSha256(y)) => x == y,
        (Credential::TokenEnv { var: x, .. }, Credential::TokenEnv { var: y, .. }) => x == y,
        (Credential::RunTokensOnly { sha256: x }, Credential::RunTokensOnly { sha256: y }) => {
            x == y
        }
        (Credential::Jwt(x), Credential::Jwt(y)) => x == y,
        _ => false,
    }
}

/// Who a JWT credential admits, in words: `a jwt of `corp` whose `groups` is `x``, and
/// its subject or `any subject`.
pub(super) fn jwt_words(jwt: &JwtCredential) -> String {
    let subject = match &jwt.subject {
        Some(s) => format!("subject `{s}`"),
        None => "any subject".to_string(),
    };
    format!(
        "a jwt of provider `{}` whose `{}` is `{}`, {subject}",
        jwt.provider, jwt.claim, jwt.value
    )
}

/// What a credential change does to who can prove the principal, and why (None for a
/// plain rotation of a static token, which is neutral and needs no words).
///
/// Widening: a move to a `jwt` credential (every holder of a matching token proves
/// it); a changed jwt provider, claim, value or subject, or a subject dropped; a move
/// away from `jwt` (unclear, so reviewed as a widening); `run_tokens_only` dropped for
/// a static token (which calls tools in any run). Narrowing: a subject added to an
/// otherwise unchanged jwt; a static token replaced by `run_tokens_only`.
pub(super) fn credential_change(o: &Credential, n: &Credential) -> (Effect, Option<String>) {
    use Credential::{Jwt, RunTokensOnly, TokenEnv, TokenSha256};
    match (o, n) {
        (Jwt(a), Jwt(b)) => {
            let same_claim = a.provider == b.provider && a.claim == b.claim && a.value == b.value;
            if same_claim && let (None, Some(subject)) = (&a.subject, &b.subject) {
                return (
                    Effect::Narrowing,
                    Some(format!("now only subject `{subject}`")),
                );
            }
            let mut parts = Vec::new();
            if a.provider != b.provider {
                parts.push(format!("jwt provider `{}` -> `{}`", a.provider, b.provider));
            }
            if a.claim != b.claim {
                parts.push(format!("jwt claim `{}` -> `{}`", a.claim, b.claim));
            }
            if a.value != b.value {
                parts.push(format!("jwt value `{}` -> `{}`", a.value, b.value));
            }
            match (&a.subject, &b.subject) {
                (Some(_), None) => parts.push("subject dropped: any subject proves it".into()),
                (x, y) if x != y => parts.push("jwt subject changed".into()),
                _ => {}
            }
            (
                Effect::Widening,
                Some(format!("{}; now {}", parts.join(", "), jwt_words(b))),
            )
        }
        (_, Jwt(b)) => (
            Effect::Widening,
            Some(format!("now proven by {}", jwt_words(b))),
        ),
        (Jwt(_), _) => (
            Effect::Widening,
            Some("no longer a jwt credential; reviewed as a widening".into()),
        ),
        (RunTokensOnly { .. }, TokenSha256(_) | TokenEnv { .. }) => (
            Effect::Widening,
            Some("`run_tokens_only` dropped: a static token now calls tools in any run".into()),
        ),
        (TokenSha256(_) | TokenEnv { .. }, RunTokensOnly { .. }) => (
            Effect::Narrowing,
            Some("now `run_tokens_only`: tools are called with run tokens only".into()),
        ),
        (
            TokenSha256(_) | TokenEnv { .. } | RunTokensOnly { .. },
            TokenSha256(_) | TokenEnv { .. } | RunTokensOnly { .. },
        ) => (Effect::Neutral, None),
    }
}

/// The change of a role's or admin's credential, when it changed.
pub(super) fn credential_message(
    who: &str,
    o: &Credential,
    n: &Credential,
) -> Option<(Effect, String)> {
    if same_credential(o, n) {
        return None;
    }
    let (effect, why) = credential_change(o, n);
    let message = match why {
        Some(why) => format!("{who}: credential changed ({why})"),
        None => format!("{who}: credential changed"),
    };
    Some((effect, message))
}

pub(super) fn credential_kind(c: &Credential) -> Value {
    match c {
        Credential::TokenSha256(_) => json!("token_sha256"),
        Credential::TokenEnv { var, .. } => json!(format!("token_env:{var}")),
        Credential::RunTokensOnly { .. } => json!("run_tokens_only"),
        Credential::Jwt(jwt) => json!(format!("jwt:{}", jwt.provider)),
    }
}

pub(super) fn roles(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    for (id, o, n) in pair(&old.roles, &new.roles) {
        match (o, n) {
            (None, Some(r)) => out.push(
                Change::new(
                    Kind::RoleAdded,
                    if r.enabled {
                        Effect::Widening
                    } else {
                        Effect::Neutral
                    },
                    format!(
                        "role `{id}` added ({}, lanes: {})",
                        if r.enabled { "enabled" } else { "disabled" },
                        r.lanes.join(", ")
                    ),
                )
                .role(id),
            ),
            (Some(_), None) => out.push(
                Change::new(
                    Kind::RoleRemoved,
                    Effect::Narrowing,
                    format!("role `{id}` removed"),
                )
                .role(id),
            ),
            (Some(o), Some(n)) => role_fields(id, o, n, out),
            (None, None) => {}
        }
    }
}

pub(super) fn role_fields(id: &str, o: &Role, n: &Role, out: &mut Vec<Change>) {
    if o.enabled != n.enabled {
        let (kind, effect, word) = if n.enabled {
            (Kind::RoleEnabled, Effect::Widening, "enabled")
        } else {
            (Kind::RoleDisabled, Effect::Narrowing, "disabled")
        };
        out.push(Change::new(kind, effect, format!("role `{id}` {word}")).role(id));
    }
    if let Some((effect, message)) =
        credential_message(&format!("role `{id}`"), &o.credential, &n.credential)
    {
        out.push(
            Change::new(Kind::RoleCredentialChanged, effect, message)
                .role(id)
                .values(
                    credential_kind(&o.credential),
                    credential_kind(&n.credential),
                ),
        );
    }
}

pub(super) fn admins(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    let map = |p: &Policy| -> BTreeMap<String, Credential> {
        p.admins
            .iter()
            .map(|a| (a.admin_id.clone(), a.credential.clone()))
            .collect()
    };
    let (o, n) = (map(old), map(new));
    for (id, a, b) in pair(&o, &n) {
        match (a, b) {
            (None, Some(_)) => out.push(
                Change::new(
                    Kind::AdminAdded,
                    Effect::Widening,
                    format!("admin `{id}` added"),
                )
                .admin(id),
            ),
            (Some(_), None) => out.push(
                Change::new(
                    Kind::AdminRemoved,
                    Effect::Narrowing,
                    format!("admin `{id}` removed"),
                )
                .admin(id),
            ),
            (Some(a), Some(b)) => {
                if let Some((effect, message)) = credential_message(&format!("admin `{id}`"), a, b)
                {
                    out.push(
                        Change::new(Kind::AdminCredentialChanged, effect, message)
                            .admin(id)
                            .values(credential_kind(a), credential_kind(b)),
                    );
                }
            }
            (None, None) => {}
        }
    }
    // `access`: `audit_read` -> `full` widens what the admin may do.
    let access = |p: &Policy| -> BTreeMap<String, crate::policy::AdminAccess> {
        p.admins
            .iter()
            .map(|a| (a.admin_id.clone(), a.access))
            .collect()
    };
    let (o, n) = (access(old), access(new));
    for (id, a, b) in pair(&o, &n) {
        if let (Some(a), Some(b)) = (a, b)
            && a != b
        {
            let effect = if *b == crate::policy::AdminAccess::Full {
                Effect::Widening
            } else {
                Effect::Narrowing
            };
            out.push(
                Change::new(
                    Kind::AdminAccessChanged,
                    effect,
                    format!("admin `{id}`: access {} -> {}", a.as_str(), b.as_str()),
                )
                .admin(id)
                .values(serde_json::json!(a.as_str()), serde_json::json!(b.as_str())),
            );
        }
    }
}
