//! Validation of identity settings in roles.yaml: `run_tokens_only` credentials.

use super::raw::RawCredential;

/// What a credential's `run_tokens_only` field asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunTokensOnly {
    /// Absent or false: an ordinary static credential.
    No,
    /// `{run_tokens_only: true}` alone: the role has no static credential at all.
    Alone,
    /// `run_tokens_only: true` beside a static token: the token is kept only to tell
    /// its holder `run_token_required` (a migration aid).
    WithStatic,
}

/// Checks `run_tokens_only` on the credential of `owner` (`role `x`` or `admin `y``).
/// An admin cannot be run-tokens-only: run tokens are issued to roles for runs.
/// Returns the problem and its help on an invalid use.
pub(crate) fn run_tokens_only(
    owner: &str,
    credential: &RawCredential,
) -> Result<RunTokensOnly, (String, String)> {
    let Some(flag) = &credential.run_tokens_only else {
        return Ok(RunTokensOnly::No);
    };
    if !flag.value {
        return Ok(RunTokensOnly::No);
    }
    if owner.starts_with("admin ") {
        return Err((
            format!(
                "{owner}: `run_tokens_only` is for roles; run tokens are never issued to admins"
            ),
            "remove `run_tokens_only` from the admin's credential".to_string(),
        ));
    }
    if credential.token_sha256.is_none() && credential.token_env.is_none() {
        Ok(RunTokensOnly::Alone)
    } else {
        Ok(RunTokensOnly::WithStatic)
    }
}
