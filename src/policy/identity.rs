//! Validation of identity settings in roles.yaml: `run_tokens_only` credentials and the
//! values of `identity_providers` and `jwt` credentials.

use serde_saphyr::Spanned;

use super::model::JWT_ALGORITHMS;
use super::raw::RawCredential;

/// `(least, default, most)` seconds of a provider's `leeway_s`: clock skew allowed on
/// `exp`, `nbf` and `iat`.
pub(crate) const LEEWAY_S: (u64, u64, u64) = (0, 60, 300);
/// `(least, default, most)` seconds of `jwks_refresh_s`: the cached key set's age limit.
pub(crate) const REFRESH_S: (u64, u64, u64) = (10, 300, 86_400);
/// `(least, default, most)` seconds of `jwks_cooldown_s`: the least time between two
/// fetches of a key set.
pub(crate) const COOLDOWN_S: (u64, u64, u64) = (1, 10, 3_600);

/// The longest issuer, audience, claim value or subject accepted.
const MAX_TEXT: usize = 512;

/// An issuer, audience, claim value or subject: 1 to 512 bytes without control
/// characters. The problem, worded to follow the field name.
pub(crate) fn check_text(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("is empty".into());
    }
    if text.len() > MAX_TEXT {
        return Err(format!("is longer than {MAX_TEXT} bytes"));
    }
    if text.chars().any(char::is_control) {
        return Err("contains control characters".into());
    }
    Ok(())
}

/// A top-level claim name: 1-128 characters of letters, digits and `_:.-/`.
pub(crate) fn is_claim_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':' | b'.' | b'-' | b'/'))
}

/// A `jwks_uri`: an absolute `https` URL, or `http` to a loopback address (a key set
/// fetched in the clear from another host could be swapped on the way).
pub(crate) fn check_jwks_uri(uri: &str) -> Result<(), (String, String)> {
    let help = "use the issuer's https `jwks_uri` (from its /.well-known/openid-configuration), or `jwks_file`".to_string();
    let url = match reqwest::Url::parse(uri) {
        Ok(url) => url,
        Err(e) => {
            return Err((
                format!("`jwks_uri` `{}` is not a URL: {e}", uri.escape_debug()),
                help,
            ));
        }
    };
    let loopback = is_loopback_url(&url);
    match url.scheme() {
        "https" if url.host().is_some() => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err((
            format!(
                "`jwks_uri` `{}` is plain http to a host that is not loopback",
                uri.escape_debug()
            ),
            help,
        )),
        _ => Err((
            format!("`jwks_uri` `{}` is not an https URL", uri.escape_debug()),
            help,
        )),
    }
}

/// `algorithms`: a non-empty list of distinct supported asymmetric algorithms, sorted.
/// On a problem: the index of the offending entry (None for the list), the message and
/// the help.
pub(crate) fn check_algorithms(
    list: &[Spanned<String>],
) -> Result<Vec<String>, (Option<usize>, String, String)> {
    let supported = JWT_ALGORITHMS.join(", ");
    if list.is_empty() {
        return Err((
            None,
            "`algorithms` is empty".into(),
            format!("list the algorithms the issuer signs with, from: {supported}"),
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for (i, alg) in list.iter().enumerate() {
        let name = alg.value.as_str();
        if name.eq_ignore_ascii_case("none") {
            return Err((
                Some(i),
                "algorithm `none` is never accepted: an unsigned token proves nothing".into(),
                format!("use one of: {supported}"),
            ));
        }
        if name.to_ascii_uppercase().starts_with("HS") {
            return Err((
                Some(i),
                format!(
                    "algorithm `{name}` is never accepted: an HMAC key is a shared secret, so it cannot prove which workload signed (and with a public key it can be forged)"
                ),
                format!("use one of: {supported}"),
            ));
        }
        if !JWT_ALGORITHMS.contains(&name) {
            return Err((
                Some(i),
                format!("algorithm `{}` is not supported", name.escape_debug()),
                format!("use one of (case matters): {supported}"),
            ));
        }
        if out.iter().any(|a| a == name) {
            return Err((
                Some(i),
                format!("algorithm `{name}` is listed twice"),
                "list each algorithm once".into(),
            ));
        }
        out.push(name.to_string());
    }
    out.sort();
    Ok(out)
}

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
    if credential.jwt.is_some() {
        return Err((
            format!("{owner}: `run_tokens_only` does not combine with a `jwt` credential"),
            "remove `run_tokens_only`, or bind a static token beside it".to_string(),
        ));
    }
    if credential.token_sha256.is_none() && credential.token_env.is_none() {
        Ok(RunTokensOnly::Alone)
    } else {
        Ok(RunTokensOnly::WithStatic)
    }
}

/// Whether a url's host is `localhost` or a loopback address (IPv4 or IPv6): the one
/// place plain `http` is accepted for a key set or a token endpoint.
pub(crate) fn is_loopback_url(url: &reqwest::Url) -> bool {
    match url.host_str() {
        Some("localhost") => true,
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}
