//! roles.yaml's `identity_providers` and `run_tokens.max_ttl_s`.

use super::*;

/// The providers' settings as JSON (nothing in them is secret).
pub(super) fn provider_json(p: &IdentityProvider) -> Value {
    let (uri, file) = match &p.jwks {
        JwksSource::Uri(u) => (json!(u), Value::Null),
        JwksSource::File(f) => (Value::Null, json!(f.display().to_string())),
    };
    json!({
        "issuer": p.issuer,
        "audience": p.audience,
        "jwks_uri": uri,
        "jwks_file": file,
        "algorithms": p.algorithms,
        "leeway_s": p.leeway_s,
        "jwks_refresh_s": p.jwks_refresh_s,
        "jwks_cooldown_s": p.jwks_cooldown_s,
    })
}

pub(super) fn jwks_words(j: &JwksSource) -> String {
    match j {
        JwksSource::Uri(u) => format!("jwks_uri `{u}`"),
        JwksSource::File(f) => format!("jwks_file `{}`", f.display()),
    }
}

/// Whether some role or admin of `policy` is proven by a JWT of provider `id`.
pub(super) fn provider_named(policy: &Policy, id: &str) -> Vec<String> {
    let named = |c: &Credential| matches!(c, Credential::Jwt(j) if j.provider == id);
    let roles = policy
        .roles
        .values()
        .filter(|r| named(&r.credential))
        .map(|r| format!("role `{}`", r.role_id));
    let admins = policy
        .admins
        .iter()
        .filter(|a| named(&a.credential))
        .map(|a| format!("admin `{}`", a.admin_id));
    roles.chain(admins).collect()
}

/// roles.yaml's `identity_providers` (by id) and `run_tokens.max_ttl_s`.
///
/// A provider added is widening when a role or admin names it, else neutral (it proves
/// nothing yet); removed narrows. A provider changed widens when any part of the change
/// may admit a token it refused (another issuer, audience or key source; an algorithm
/// added; more leeway; a longer refresh; a changed cooldown, whose effect on the keys
/// trusted is unclear), else narrows (an algorithm removed, less leeway, a shorter
/// refresh). A longer `max_ttl_s` widens, a shorter one narrows.
pub(super) fn identity(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    let (op, np) = (&old.identity.providers, &new.identity.providers);
    for (id, o, n) in pair(op, np) {
        match (o, n) {
            (None, Some(p)) => {
                let users = provider_named(new, id);
                let (effect, who) = if users.is_empty() {
                    (Effect::Neutral, "no role or admin names it".to_string())
                } else {
                    (Effect::Widening, format!("named by {}", users.join(", ")))
                };
                out.push(
                    Change::new(
                        Kind::IdentityProviderAdded,
                        effect,
                        format!(
                            "identity provider `{id}` added (issuer `{}`; {who})",
                            p.issuer
                        ),
                    )
                    .provider(id)
                    .values(Value::Null, provider_json(p)),
                );
            }
            (Some(p), None) => out.push(
                Change::new(
                    Kind::IdentityProviderRemoved,
                    Effect::Narrowing,
                    format!("identity provider `{id}` removed"),
                )
                .provider(id)
                .values(provider_json(p), Value::Null),
            ),
            (Some(o), Some(n)) => provider_fields(id, o, n, out),
            (None, None) => {}
        }
    }
    let (o, n) = (
        old.identity.run_token_max_ttl_s,
        new.identity.run_token_max_ttl_s,
    );
    if o != n {
        let (effect, word) = if n > o {
            (Effect::Widening, "raised")
        } else {
            (Effect::Narrowing, "lowered")
        };
        out.push(
            Change::new(
                Kind::RunTokenMaxTtlChanged,
                effect,
                format!("run tokens: `max_ttl_s` {word} from {o} to {n}"),
            )
            .values(json!(o), json!(n)),
        );
    }
}

pub(super) fn provider_fields(
    id: &str,
    o: &IdentityProvider,
    n: &IdentityProvider,
    out: &mut Vec<Change>,
) {
    if o == n {
        return;
    }
    let mut wider = Vec::new();
    let mut narrower = Vec::new();
    if o.issuer != n.issuer {
        wider.push(format!(
            "issuer changed from `{}` to `{}`",
            o.issuer, n.issuer
        ));
    }
    if o.audience != n.audience {
        wider.push(format!(
            "audience changed from `{}` to `{}`",
            o.audience, n.audience
        ));
    }
    match (&o.jwks, &n.jwks) {
        (a, b) if a == b => {}
        (JwksSource::Uri(a), JwksSource::Uri(b)) => {
            wider.push(format!("jwks_uri changed from `{a}` to `{b}`"))
        }
        (JwksSource::File(a), JwksSource::File(b)) => wider.push(format!(
            "jwks_file changed from `{}` to `{}`",
            a.display(),
            b.display()
        )),
        (a, b) => wider.push(format!(
            "keys now from {} instead of {}",
            jwks_words(b),
            jwks_words(a)
        )),
    }
    let (added, removed) = set_diff(&o.algorithms, &n.algorithms);
    for alg in added {
        wider.push(format!("algorithm `{alg}` added"));
    }
    for alg in removed {
        narrower.push(format!("algorithm `{alg}` removed"));
    }
    let mut number = |name: &str, a: u64, b: u64, raised_widens: bool| {
        let (list, word) = match (b > a, raised_widens) {
            (true, true) => (&mut wider, "raised"),
            (false, true) => (&mut narrower, "lowered"),
            (true, false) => (&mut narrower, "raised"),
            (false, false) => (&mut wider, "lowered"),
        };
        if a != b {
            list.push(format!("{name} {word} from {a} to {b}"));
        }
    };
    number("leeway_s", o.leeway_s, n.leeway_s, true);
    // A longer refresh keeps trusting a key the provider dropped for longer.
    number("jwks_refresh_s", o.jwks_refresh_s, n.jwks_refresh_s, true);
    if o.jwks_cooldown_s != n.jwks_cooldown_s {
        wider.push(format!(
            "jwks_cooldown_s changed from {} to {}",
            o.jwks_cooldown_s, n.jwks_cooldown_s
        ));
    }
    let effect = if !wider.is_empty() || narrower.is_empty() {
        Effect::Widening
    } else {
        Effect::Narrowing
    };
    let mut parts: Vec<String> = wider.into_iter().chain(narrower).collect();
    if parts.is_empty() {
        parts.push("settings changed".into());
    }
    out.push(
        Change::new(
            Kind::IdentityProviderChanged,
            effect,
            format!("identity provider `{id}` changed ({})", parts.join(", ")),
        )
        .provider(id)
        .values(provider_json(o), provider_json(n)),
    );
}
