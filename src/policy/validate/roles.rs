//! Validation rules, roles: roles.yaml and its credentials.

use super::*;

pub(super) fn check_roles(
    report: &mut Report<'_>,
    file: &str,
    raw: &RolesFile,
    env: &dyn Fn(&str) -> Option<String>,
    policy_dir: &Path,
) -> RolesAndAdmins {
    check_version(report, file, &raw.version);
    let identity = IdentitySettings {
        providers: check_providers(report, file, &raw.identity_providers, policy_dir),
        run_token_max_ttl_s: check_run_tokens(report, file, raw.run_tokens.as_ref()),
    };
    let providers = &identity.providers;
    let mut roles = BTreeMap::new();
    let mut seen = BTreeMap::new();
    // Who holds each credential hash, so two principals never share a token.
    let mut holders: BTreeMap<String, String> = BTreeMap::new();

    for entry in &raw.roles {
        let RawRole {
            role_id,
            description,
            enabled,
            lanes,
            credential,
        } = &entry.value;
        let id_ok = check_id(report, file, "role id", role_id);
        let unique = id_ok && check_unique(report, file, "role id", &mut seen, role_id);
        check_description(
            report,
            file,
            &format!("role `{}`", role_id.value),
            description,
        );
        let owner = format!("role `{}`", role_id.value);
        let lanes = check_id_list(report, file, "lane", &owner, lanes);
        let credential = check_credential(
            report,
            file,
            &owner,
            credential,
            (env, providers),
            &mut holders,
        );
        if let (true, Some(credential)) = (unique, credential) {
            roles.insert(
                role_id.value.clone(),
                Role {
                    role_id: role_id.value.clone(),
                    description: description.value.clone(),
                    enabled: *enabled,
                    lanes,
                    credential,
                },
            );
        }
    }

    let mut admins = Vec::new();
    let mut seen_admins = BTreeMap::new();
    for entry in &raw.admins {
        let admin = &entry.value;
        let id_ok = check_id(report, file, "admin id", &admin.admin_id);
        let unique =
            id_ok && check_unique(report, file, "admin id", &mut seen_admins, &admin.admin_id);
        check_description(
            report,
            file,
            &format!("admin `{}`", admin.admin_id.value),
            &admin.description,
        );
        let owner = format!("admin `{}`", admin.admin_id.value);
        let credential = check_credential(
            report,
            file,
            &owner,
            &admin.credential,
            (env, providers),
            &mut holders,
        );
        let access = match admin.access.as_ref().map(|a| a.value.as_str()) {
            None | Some("full") => Some(AdminAccess::Full),
            Some("audit_read") => Some(AdminAccess::AuditRead),
            Some(other) => {
                if let Some(spanned) = &admin.access {
                    report.spanned(
                        file,
                        spanned,
                        format!("{owner}: unknown `access` `{}`", other.escape_debug()),
                        "use `full` (the default) or `audit_read`",
                    );
                }
                None
            }
        };
        if let (true, Some(credential), Some(access)) = (unique, credential, access) {
            admins.push(Admin {
                admin_id: admin.admin_id.value.clone(),
                description: admin.description.value.clone(),
                credential,
                access,
            });
        }
    }
    admins.sort_by(|a, b| a.admin_id.cmp(&b.admin_id));
    (roles, admins, identity)
}

/// What credentials are checked against: the environment (`token_env`) and the
/// declared identity providers (`jwt`).
type CredentialContext<'a> = (
    &'a dyn Fn(&str) -> Option<String>,
    &'a BTreeMap<String, IdentityProvider>,
);

pub(super) fn check_credential(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    credential: &Spanned<RawCredential>,
    (env, providers): CredentialContext<'_>,
    holders: &mut BTreeMap<String, String>,
) -> Option<Credential> {
    const HELP: &str = "bind the credential as `{token_sha256: <64 lowercase hex>}`, `{token_env: VAR_NAME}` or `{jwt: {provider, claim, value}}`";
    if let Some(jwt) = &credential.value.jwt {
        let RawCredential {
            token_sha256,
            token_env,
            run_tokens_only,
            jwt: _,
        } = &credential.value;
        if token_sha256.is_some() || token_env.is_some() || run_tokens_only.is_some() {
            report.spanned(
                file,
                credential,
                format!("{owner}: a `jwt` credential stands alone; remove `token_sha256`, `token_env` and `run_tokens_only`"),
                HELP,
            );
            return None;
        }
        let credential = check_jwt_credential(report, file, owner, jwt, providers)?;
        let key = format!(
            "jwt\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
            credential.provider,
            credential.claim,
            credential.value,
            credential.subject.as_deref().unwrap_or_default()
        );
        if let Some(first) = holders.get(&key) {
            report.spanned(
                file,
                jwt,
                format!("{owner} has the same jwt credential as {first}"),
                "give every role and admin its own claim value or subject, so a token proves exactly one identity",
            );
            return None;
        }
        holders.insert(key, owner.to_string());
        return Some(Credential::Jwt(credential));
    }
    let run_tokens_only = match crate::policy::identity::run_tokens_only(owner, &credential.value) {
        Err((message, help)) => {
            report.spanned(file, credential, message, help);
            return None;
        }
        Ok(crate::policy::identity::RunTokensOnly::Alone) => {
            return Some(Credential::RunTokensOnly { sha256: None });
        }
        Ok(crate::policy::identity::RunTokensOnly::WithStatic) => true,
        Ok(crate::policy::identity::RunTokensOnly::No) => false,
    };
    let (credential_value, sha256) = match (
        &credential.value.token_sha256,
        &credential.value.token_env,
    ) {
        (Some(_), Some(_)) | (None, None) => {
            report.spanned(
                file,
                credential,
                format!("{owner}: credential needs exactly one of `token_sha256` or `token_env`"),
                HELP,
            );
            return None;
        }
        (Some(hash), None) => {
            if !is_sha256_hex(&hash.value) {
                let hint = if hash.value.len() == 64
                    && hash.value.bytes().all(|b| b.is_ascii_hexdigit())
                {
                    "write it in lowercase"
                } else {
                    "a sha256 is 64 hex digits, e.g. `printf %s \"$TOKEN\" | sha256sum`"
                };
                report.spanned(
                    file,
                    hash,
                    format!(
                        "{owner}: `token_sha256` `{}` is not a lowercase hex sha256",
                        hash.value.escape_debug()
                    ),
                    hint,
                );
                return None;
            }
            (
                Credential::TokenSha256(hash.value.clone()),
                hash.value.clone(),
            )
        }
        (None, Some(var)) => {
            if !is_env_var_name(&var.value) {
                report.spanned(
                    file,
                    var,
                    format!(
                        "{owner}: `token_env` `{}` is not an environment variable name",
                        var.value.escape_debug()
                    ),
                    "use letters, digits and `_`, not starting with a digit",
                );
                return None;
            }
            match env(&var.value).filter(|token| !token.is_empty()) {
                Some(token) => {
                    let sha256 = crate::canonical::sha256_hex(token.as_bytes());
                    (
                        Credential::TokenEnv {
                            var: var.value.clone(),
                            sha256: Some(sha256.clone()),
                        },
                        sha256,
                    )
                }
                None => {
                    report.spanned(
                        file,
                        var,
                        format!("{owner}: environment variable `{}` is not set, so the credential cannot be proven", var.value),
                        format!("set `{}` to the token before loading the policy, or bind `token_sha256` instead", var.value),
                    );
                    return None;
                }
            }
        }
    };
    if let Some(first) = holders.get(&sha256) {
        report.spanned(
            file,
            credential,
            format!("{owner} has the same credential as {first}"),
            "give every role and admin its own token, so a token proves exactly one identity",
        );
        return None;
    }
    holders.insert(sha256.clone(), owner.to_string());
    if run_tokens_only {
        return Some(Credential::RunTokensOnly {
            sha256: Some(sha256),
        });
    }
    Some(credential_value)
}

/// `run_tokens: {max_ttl_s}`: 1 s to 30 days; the default when absent.
fn check_run_tokens(
    report: &mut Report<'_>,
    file: &str,
    raw: Option<&Spanned<RawRunTokens>>,
) -> u64 {
    let Some(raw) = raw else {
        return DEFAULT_RUN_TOKEN_MAX_TTL_S;
    };
    let max = &raw.value.max_ttl_s;
    if !(1..=MAX_RUN_TOKEN_TTL_S).contains(&max.value) {
        report.spanned(
            file,
            max,
            format!(
                "`run_tokens.max_ttl_s` {} is out of range",
                max.value
            ),
            format!("use 1 to {MAX_RUN_TOKEN_TTL_S} seconds (30 days); short-lived tokens limit what a leaked one can do"),
        );
        return DEFAULT_RUN_TOKEN_MAX_TTL_S;
    }
    max.value
}

/// `identity_providers`: ids, unique issuers, one JWKS source, algorithms, bounds.
fn check_providers(
    report: &mut Report<'_>,
    file: &str,
    raw: &[Spanned<RawIdentityProvider>],
    policy_dir: &Path,
) -> BTreeMap<String, IdentityProvider> {
    let mut providers = BTreeMap::new();
    let mut seen = BTreeMap::new();
    let mut issuers: BTreeMap<String, String> = BTreeMap::new();
    for entry in raw {
        let p = &entry.value;
        let id_ok = check_id(report, file, "identity provider id", &p.id);
        let unique = id_ok && check_unique(report, file, "identity provider id", &mut seen, &p.id);
        let owner = format!("identity provider `{}`", p.id.value);
        let mut ok = unique;
        for (name, value) in [("issuer", &p.issuer), ("audience", &p.audience)] {
            if let Err(problem) = identity::check_text(&value.value) {
                report.spanned(
                    file,
                    value,
                    format!("{owner}: `{name}` {problem}"),
                    "write the exact string the tokens carry",
                );
                ok = false;
            }
        }
        if let Some(first) = issuers.get(&p.issuer.value) {
            report.spanned(
                file,
                &p.issuer,
                format!("{owner} has the same issuer as identity provider `{first}`"),
                "declare each issuer once; a token's `iss` picks its provider",
            );
            ok = false;
        } else {
            issuers.insert(p.issuer.value.clone(), p.id.value.clone());
        }
        let jwks = match (&p.jwks_uri, &p.jwks_file) {
            (Some(uri), None) => match identity::check_jwks_uri(&uri.value) {
                Ok(()) => Some(JwksSource::Uri(uri.value.clone())),
                Err((message, help)) => {
                    report.spanned(file, uri, format!("{owner}: {message}"), help);
                    None
                }
            },
            (None, Some(path)) => {
                let resolved = policy_dir.join(&path.value);
                if path.value.is_empty() || !resolved.is_file() {
                    report.spanned(
                        file,
                        path,
                        format!(
                            "{owner}: `jwks_file` `{}` is not a file",
                            path.value.escape_debug()
                        ),
                        "paths resolve against the policy directory; save the issuer's JWK Set there",
                    );
                    None
                } else {
                    Some(JwksSource::File(resolved))
                }
            }
            _ => {
                report.spanned(
                    file,
                    entry,
                    format!("{owner} needs exactly one of `jwks_uri` or `jwks_file`"),
                    "name where the issuer's signing keys (a JWK Set) are published",
                );
                None
            }
        };
        let algorithms = match &p.algorithms {
            None => Some(JWT_ALGORITHMS.iter().map(|a| a.to_string()).collect()),
            Some(list) => match identity::check_algorithms(&list.value) {
                Ok(algorithms) => Some(algorithms),
                Err((at, message, help)) => {
                    let at = at.map_or(list.referenced, |i| list.value[i].referenced);
                    report.at(
                        file,
                        at,
                        list.referenced,
                        format!("{owner}: {message}"),
                        help,
                    );
                    None
                }
            },
        };
        let mut bounded = |name: &str,
                           value: &Option<Spanned<u64>>,
                           (low, default, high): (u64, u64, u64)|
         -> u64 {
            let Some(value) = value else { return default };
            if !(low..=high).contains(&value.value) {
                report.spanned(
                    file,
                    value,
                    format!("{owner}: `{name}` {} is out of range", value.value),
                    format!("use {low} to {high} seconds (default {default})"),
                );
                ok = false;
            }
            value.value
        };
        let leeway_s = bounded("leeway_s", &p.leeway_s, identity::LEEWAY_S);
        let jwks_refresh_s = bounded("jwks_refresh_s", &p.jwks_refresh_s, identity::REFRESH_S);
        let jwks_cooldown_s = bounded("jwks_cooldown_s", &p.jwks_cooldown_s, identity::COOLDOWN_S);
        if let (true, Some(jwks), Some(algorithms)) = (ok, jwks, algorithms) {
            providers.insert(
                p.id.value.clone(),
                IdentityProvider {
                    id: p.id.value.clone(),
                    issuer: p.issuer.value.clone(),
                    audience: p.audience.value.clone(),
                    jwks,
                    algorithms,
                    leeway_s,
                    jwks_refresh_s,
                    jwks_cooldown_s,
                },
            );
        }
    }
    providers
}

/// `credential: {jwt: {provider, claim, value, subject?}}`.
fn check_jwt_credential(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    jwt: &Spanned<RawJwtCredential>,
    providers: &BTreeMap<String, IdentityProvider>,
) -> Option<JwtCredential> {
    let RawJwtCredential {
        provider,
        claim,
        value,
        subject,
    } = &jwt.value;
    let mut ok = true;
    if !providers.contains_key(&provider.value) {
        report.spanned(
            file,
            provider,
            format!(
                "{owner}: unknown identity provider `{}`",
                provider.value.escape_debug()
            ),
            unknown_help(
                "identity provider",
                &provider.value,
                providers,
                "`identity_providers`",
            ),
        );
        ok = false;
    }
    if !identity::is_claim_name(&claim.value) {
        report.spanned(
            file,
            claim,
            format!(
                "{owner}: `claim` `{}` is not a claim name",
                claim.value.escape_debug()
            ),
            "a top-level claim of the token: 1-128 characters of letters, digits and `_:.-/`",
        );
        ok = false;
    }
    for (name, text) in [("value", Some(value)), ("subject", subject.as_ref())] {
        if let Some(text) = text
            && let Err(problem) = identity::check_text(&text.value)
        {
            report.spanned(
                file,
                text,
                format!("{owner}: jwt `{name}` {problem}"),
                "write the exact string the tokens carry",
            );
            ok = false;
        }
    }
    ok.then(|| JwtCredential {
        provider: provider.value.clone(),
        claim: claim.value.clone(),
        value: value.value.clone(),
        subject: subject.as_ref().map(|s| s.value.clone()),
    })
}

// ---------------------------------------------------------------------------------------
// lanes.yaml
