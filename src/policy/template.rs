//! URL templates of http tools: `{args.x}`, `{scope.x}` and `{run.scope.x}`
//! placeholders in the path and query of `adapter.url` and in `adapter.query` values.
//!
//! INVARIANT: a placeholder never stands in the scheme, host or port (refused at load);
//! the adapter percent-encodes every value it puts in (RFC 3986 unreserved characters
//! only), so a value can never add a path segment, a query, a fragment or change the
//! host.

use std::fmt;

/// Where a placeholder's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaceholderSource {
    /// A top-level argument of the call.
    Args,
    /// A key of the call's scope (`scope.x`, also written `run.scope.x`).
    Scope,
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    Literal(String),
    Placeholder {
        source: PlaceholderSource,
        key: String,
        /// The placeholder as written, for messages.
        written: String,
    },
}

/// A parsed template: literal text and placeholders, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Template {
    pub parts: Vec<TemplatePart>,
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                TemplatePart::Literal(s) => f.write_str(s)?,
                TemplatePart::Placeholder { written, .. } => write!(f, "{{{written}}}")?,
            }
        }
        Ok(())
    }
}

impl Template {
    /// Parses `text` (any placeholders anywhere; see [`parse_url_template`] for URLs).
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(i) = rest.find(['{', '}']) {
            literal.push_str(&rest[..i]);
            if rest[i..].starts_with('}') {
                return Err("a `}` without its `{`".to_string());
            }
            let after = &rest[i + 1..];
            let Some(end) = after
                .find(['{', '}'])
                .filter(|&j| after[j..].starts_with('}'))
            else {
                return Err("a `{` without its `}`".to_string());
            };
            let written = &after[..end];
            let (source, key) = if let Some(key) = written.strip_prefix("args.") {
                (PlaceholderSource::Args, key)
            } else if let Some(key) = written.strip_prefix("run.scope.") {
                (PlaceholderSource::Scope, key)
            } else if let Some(key) = written.strip_prefix("scope.") {
                (PlaceholderSource::Scope, key)
            } else {
                return Err(format!(
                    "placeholder `{{{}}}` is not `{{args.NAME}}`, `{{scope.NAME}}` or `{{run.scope.NAME}}`",
                    written.escape_debug()
                ));
            };
            if key.is_empty()
                || !key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!(
                    "placeholder `{{{}}}` names no key (letters, digits, `_` and `-`)",
                    written.escape_debug()
                ));
            }
            if !literal.is_empty() {
                parts.push(TemplatePart::Literal(std::mem::take(&mut literal)));
            }
            parts.push(TemplatePart::Placeholder {
                source,
                key: key.to_string(),
                written: written.to_string(),
            });
            rest = &after[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(TemplatePart::Literal(literal));
        }
        Ok(Template { parts })
    }

    /// Whether the template holds a placeholder.
    pub fn has_placeholders(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, TemplatePart::Placeholder { .. }))
    }

    /// The template with every placeholder replaced by `with` (for load-time checks of
    /// the URL's shape).
    pub fn sample(&self, with: &str) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                TemplatePart::Literal(s) => s.as_str(),
                TemplatePart::Placeholder { .. } => with,
            })
            .collect()
    }
}

/// Parses an http tool's `url`: placeholders only after the authority (in the path and
/// query), never a fragment.
pub fn parse_url_template(url: &str) -> Result<Template, String> {
    let template = Template::parse(url)?;
    let start = url.find("://").map(|i| i + 3).unwrap_or(0);
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map(|i| start + i)
        .unwrap_or(url.len());
    if url[..authority_end].contains(['{', '}']) {
        return Err(
            "a placeholder may not stand in the scheme, host or port (only in the path and query)"
                .to_string(),
        );
    }
    if url.contains('#') {
        return Err("a url template may not have a fragment (`#`)".to_string());
    }
    Ok(template)
}

/// Percent-encodes `value` so that it stays one path segment or one query value: every
/// byte but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`) is written `%XX`.
pub fn encode_component(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_parse() {
        let t = parse_url_template("http://h:1/Patient/{args.patient_id}?x={run.scope.tenant}")
            .unwrap();
        assert_eq!(t.parts.len(), 4);
        assert_eq!(t.sample("v"), "http://h:1/Patient/v?x=v");
        assert_eq!(
            t.to_string(),
            "http://h:1/Patient/{args.patient_id}?x={run.scope.tenant}"
        );
        for bad in [
            "http://{args.host}/x",
            "http://h:{args.port}/x",
            "http://h/x#{args.f}",
            "http://h/x#frag",
            "http://h/{args.}",
            "http://h/{other.x}",
            "http://h/{args.x",
            "http://h/args.x}",
            "http://h/{args.a b}",
            "{args.x}://h/",
        ] {
            assert!(parse_url_template(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn encoding_keeps_only_unreserved() {
        assert_eq!(
            encode_component("a/b?c#d@e\\f %"),
            "a%2Fb%3Fc%23d%40e%5Cf%20%25"
        );
        assert_eq!(encode_component("\u{e9}"), "%C3%A9");
        assert_eq!(encode_component("A-z_0.9~"), "A-z_0.9~");
    }
}
