//! Validation rules, http adapters: `method`, `query`, `headers`, `body`,
//! `forward_scope`.

use super::*;
use crate::policy::model::{HttpBody, HttpMethod, HttpRequestModel};
use crate::policy::template::Template;

/// Headers the adapter sets itself or that would change how the request is framed or
/// routed; a registry may not set them.
const MANAGED_HEADERS: [&str; 13] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
    "toolgate-scope",
    "x-toolgate-call-id",
    "x-toolgate-run-id",
];

/// An RFC 9110 token character (a header name is a token).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

pub(super) fn check_http_request(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    raw: &RawAdapter,
) -> HttpRequestModel {
    let mut model = HttpRequestModel::default();
    if let Some(method) = &raw.method {
        match HttpMethod::ALL
            .iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(&method.value))
        {
            Some(m) => model.method = *m,
            None => report.spanned(
                file,
                method,
                format!(
                    "{owner}: adapter `method` `{}` is not supported",
                    method.value.escape_debug()
                ),
                "use one of GET, POST, PUT, PATCH, DELETE",
            ),
        }
    }
    let bodyless = matches!(model.method, HttpMethod::Get | HttpMethod::Delete);
    model.body = if bodyless {
        HttpBody::None
    } else {
        HttpBody::Arguments
    };
    if let Some(body) = &raw.body {
        match body.value.as_str() {
            "arguments" if model.method == HttpMethod::Get => report.spanned(
                file,
                body,
                format!("{owner}: a GET request carries no body (`body: arguments`)"),
                "use `body: none` (the default for GET), or pass arguments in the url or `query`",
            ),
            "arguments" => model.body = HttpBody::Arguments,
            "none" => model.body = HttpBody::None,
            other => report.spanned(
                file,
                body,
                format!(
                    "{owner}: adapter `body` `{}` is not `arguments` or `none`",
                    other.escape_debug()
                ),
                "use `body: arguments` (the call's arguments as JSON) or `body: none`",
            ),
        }
    }
    for (name, value) in raw.query.iter().flat_map(|q| &q.value) {
        if name.is_empty() {
            report.spanned(
                file,
                value,
                format!("{owner}: a `query` parameter has an empty name"),
                "name every query parameter",
            );
        }
        if let Err(e) = Template::parse(&value.value) {
            report.spanned(
                file,
                value,
                format!("{owner}: query parameter `{}`: {e}", name.escape_debug()),
                "write fixed text and `{args.NAME}` / `{scope.NAME}` placeholders",
            );
        }
        model.query.insert(name.clone(), value.value.clone());
    }
    for (name, value) in raw.headers.iter().flat_map(|h| &h.value) {
        let lower = name.to_ascii_lowercase();
        if lower.is_empty() || !lower.bytes().all(is_tchar) {
            report.spanned(
                file,
                value,
                format!("{owner}: `{}` is not a header name", name.escape_debug()),
                "a header name is letters, digits and `-`",
            );
        } else if MANAGED_HEADERS.contains(&lower.as_str()) {
            report.spanned(
                file,
                value,
                format!("{owner}: header `{lower}` is set by toolgate, not the registry"),
                format!("remove it; toolgate sets: {}", MANAGED_HEADERS.join(", ")),
            );
        }
        if !value
            .value
            .bytes()
            .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
        {
            report.spanned(
                file,
                value,
                format!(
                    "{owner}: the value of header `{}` holds a character a header may not",
                    name.escape_debug()
                ),
                "header values are printable ASCII on one line",
            );
        }
        if model
            .headers
            .insert(lower.clone(), value.value.clone())
            .is_some()
        {
            report.spanned(
                file,
                value,
                format!("{owner}: header `{lower}` is given twice"),
                "header names are case-insensitive; give each once",
            );
        }
    }
    for key in raw.forward_scope.iter().flat_map(|k| &k.value) {
        if !is_id(&key.value) {
            report.spanned(
                file,
                key,
                format!(
                    "{owner}: `forward_scope` entry `{}` is not a scope key",
                    key.value.escape_debug()
                ),
                "list scope keys like `tenant`",
            );
        }
        model.forward_scope.push(key.value.clone());
    }
    model.forward_scope.sort();
    model.forward_scope.dedup();
    model
}
