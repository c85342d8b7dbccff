//! Validation rules, roles: roles.yaml and its credentials.

use super::*;

pub(super) fn check_roles(
    report: &mut Report<'_>,
    file: &str,
    raw: &RolesFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> RolesAndAdmins {
    check_version(report, file, &raw.version);
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
        let credential = check_credential(report, file, &owner, credential, env, &mut holders);
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
        let credential =
            check_credential(report, file, &owner, &admin.credential, env, &mut holders);
        if let (true, Some(credential)) = (unique, credential) {
            admins.push(Admin {
                admin_id: admin.admin_id.value.clone(),
                description: admin.description.value.clone(),
                credential,
            });
        }
    }
    admins.sort_by(|a, b| a.admin_id.cmp(&b.admin_id));
    (roles, admins)
}

pub(super) fn check_credential(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    credential: &Spanned<RawCredential>,
    env: &dyn Fn(&str) -> Option<String>,
    holders: &mut BTreeMap<String, String>,
) -> Option<Credential> {
    const HELP: &str =
        "bind the credential as `{token_sha256: <64 lowercase hex>}` or `{token_env: VAR_NAME}`";
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

// ---------------------------------------------------------------------------------------
// lanes.yaml
