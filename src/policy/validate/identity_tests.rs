//! Loader tests of roles.yaml's identity settings: `identity_providers`, `jwt`
//! credentials and `run_tokens.max_ttl_s`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::tests::{LANES, REGISTRY, ROLES, check, problems};
use crate::policy::{Credential, JWT_ALGORITHMS};

/// ROLES with one identity provider (`yaml` replaces its body) and the writer
/// proven by a JWT credential (`credential`).
fn with_provider(provider: &str, credential: &str) -> String {
    ROLES
        .replace(
            "roles:\n",
            &format!("identity_providers:\n  - {provider}\nroles:\n"),
        )
        .replace("{token_env: WRITER_TOKEN}", credential)
}

const PROVIDER: &str =
    "{id: idp, issuer: \"https://idp.test\", audience: gate, jwks_uri: \"https://idp.test/jwks\"}";

#[test]
fn a_jwt_credential_names_a_declared_provider() {
    let ok = with_provider(
        PROVIDER,
        "{jwt: {provider: idp, claim: groups, value: writers}}",
    );
    let policy = check(&ok, LANES, REGISTRY).unwrap();
    assert!(matches!(
        &policy.roles["writer"].credential,
        Credential::Jwt(c) if c.provider == "idp" && c.claim == "groups"
    ));
    let provider = &policy.identity.providers["idp"];
    assert_eq!(
        (
            provider.leeway_s,
            provider.jwks_refresh_s,
            provider.jwks_cooldown_s
        ),
        (60, 300, 10)
    );
    assert_eq!(provider.algorithms.len(), JWT_ALGORITHMS.len());

    let unknown = with_provider(
        PROVIDER,
        "{jwt: {provider: idq, claim: groups, value: writers}}",
    );
    let found = problems(&unknown, LANES, REGISTRY);
    assert!(
        found
            .iter()
            .any(|p| p.contains("unknown identity provider `idq`")),
        "{found:#?}"
    );
    let mixed = with_provider(
        PROVIDER,
        "{jwt: {provider: idp, claim: groups, value: w}, token_env: WRITER_TOKEN}",
    );
    let found = problems(&mixed, LANES, REGISTRY);
    assert!(
        found
            .iter()
            .any(|p| p.contains("a `jwt` credential stands alone")),
        "{found:#?}"
    );
}

#[test]
fn providers_refuse_none_hmac_unknown_algorithms_and_unbounded_settings() {
    let jwt = "{jwt: {provider: idp, claim: groups, value: writers}}";
    for (provider, expected) in [
        (
            PROVIDER.replace('}', ", algorithms: [RS256, none]}"),
            "algorithm `none` is never accepted",
        ),
        (
            PROVIDER.replace('}', ", algorithms: [HS256]}"),
            "algorithm `HS256` is never accepted",
        ),
        (
            PROVIDER.replace('}', ", algorithms: [rs256]}"),
            "algorithm `rs256` is not supported",
        ),
        (
            PROVIDER.replace('}', ", algorithms: []}"),
            "`algorithms` is empty",
        ),
        (
            PROVIDER.replace('}', ", algorithms: [ES256, ES256]}"),
            "listed twice",
        ),
        (
            PROVIDER.replace('}', ", leeway_s: 3600}"),
            "`leeway_s` 3600 is out of range",
        ),
        (
            PROVIDER.replace('}', ", jwks_cooldown_s: 0}"),
            "`jwks_cooldown_s` 0 is out of range",
        ),
        (
            PROVIDER.replace("https://idp.test/jwks", "http://idp.test/jwks"),
            "plain http to a host that is not loopback",
        ),
        (
            PROVIDER.replace(", jwks_uri: \"https://idp.test/jwks\"", ""),
            "needs exactly one of `jwks_uri` or `jwks_file`",
        ),
        (
            PROVIDER.replace(
                "jwks_uri: \"https://idp.test/jwks\"",
                "jwks_file: missing.json",
            ),
            "`jwks_file` `missing.json` is not a file",
        ),
        (
            PROVIDER.replace("audience: gate", "audience: \"\""),
            "`audience` is empty",
        ),
    ] {
        let found = problems(&with_provider(&provider, jwt), LANES, REGISTRY);
        assert!(
            found.iter().any(|p| p.contains(expected)),
            "{provider}: {found:#?}"
        );
    }
    let twice = ROLES.replace(
        "roles:\n",
        &format!(
            "identity_providers:\n  - {PROVIDER}\n  - {}\nroles:\n",
            PROVIDER.replace("id: idp", "id: idp2")
        ),
    );
    let found = problems(&twice, LANES, REGISTRY);
    assert!(
        found
            .iter()
            .any(|p| p.contains("has the same issuer as identity provider `idp`")),
        "{found:#?}"
    );
    // Loopback http is fine for a local key-set server.
    let local = PROVIDER.replace("https://idp.test/jwks", "http://127.0.0.1:8080/jwks");
    assert!(check(&with_provider(&local, jwt), LANES, REGISTRY).is_ok());
}

#[test]
fn the_run_token_ttl_cap_is_policy_with_a_bounded_default() {
    let policy = check(ROLES, LANES, REGISTRY).unwrap();
    assert_eq!(policy.identity.run_token_max_ttl_s, 86_400);
    let capped = ROLES.replace("roles:\n", "run_tokens: {max_ttl_s: 900}\nroles:\n");
    assert_eq!(
        check(&capped, LANES, REGISTRY)
            .unwrap()
            .identity
            .run_token_max_ttl_s,
        900
    );
    let wide = ROLES.replace("roles:\n", "run_tokens: {max_ttl_s: 99999999}\nroles:\n");
    let found = problems(&wide, LANES, REGISTRY);
    assert!(
        found
            .iter()
            .any(|p| p.contains("`run_tokens.max_ttl_s` 99999999 is out of range")),
        "{found:#?}"
    );
}
