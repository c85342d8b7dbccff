//! The http adapter's check of string arguments that hold URLs: every URL an argument
//! names must be an http(s) URL to an allowed host, read the way a URL parser reads it.

use serde_json::Value;

use super::HostAllowlist;
use crate::adapter::{strings_with_pointers, unsafe_argument};
use crate::diagnostic::Refusal;
use hyper::Uri;

/// Refuses every string argument that holds a URL (any `scheme://`, or a scheme a URL
/// parser reads a host from without `//`) unless it is an http(s) URL to an allowed
/// host, and every reference to another host (`//host/...`).
pub(crate) fn check_url_arguments(
    arguments: &Value,
    allowed: &HostAllowlist,
) -> Result<(), Refusal> {
    for (pointer, s) in strings_with_pointers(arguments) {
        if let Some(problem) = url_problem(s, allowed) {
            return Err(unsafe_argument(&pointer, &problem));
        }
    }
    Ok(())
}

/// The schemes a URL parser reads a host from even without `//` (the WHATWG URL
/// standard's special schemes: `http:169.254.169.254/` is `http://169.254.169.254/`).
const SPECIAL_SCHEMES: [&str; 6] = ["http", "https", "ws", "wss", "ftp", "file"];

/// A placeholder base that a host-relative reference (`//host/...`) is resolved against.
const RELATIVE_BASE: &str = "http://relative.invalid/";

/// Why `s` names a place the tool may not be sent to, if it does. Every URL in it is
/// read the way a URL parser (the WHATWG standard that browsers and the `url` crate
/// follow) would read it: ASCII tabs and newlines are dropped anywhere, control
/// characters and white space end a URL, `\` counts as `/`, a special scheme needs no
/// `//`, and a reference that starts with two slashes names a host of its own. URLs
/// inside longer text are found too (`see http://host/`).
fn url_problem(s: &str, allowed: &HostAllowlist) -> Option<String> {
    let cleaned: String = s
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    cleaned
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|token| !token.is_empty())
        .find_map(|token| token_problem(token, allowed))
}

/// The first URL or host reference in one white-space-free token that is not allowed.
fn token_problem(token: &str, allowed: &HostAllowlist) -> Option<String> {
    let bytes = token.as_bytes();
    let in_scheme = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.');
    let slash = |b: u8| b == b'/' || b == b'\\';
    for (i, &b) in bytes.iter().enumerate() {
        let at_boundary = i == 0 || !in_scheme(bytes[i - 1]);
        if b.is_ascii_alphabetic() && at_boundary {
            let len = bytes[i..].iter().take_while(|&&c| in_scheme(c)).count();
            if bytes.get(i + len) == Some(&b':') {
                let rest = &token[i..];
                let after = &token[i + len + 1..];
                let scheme = token[i..i + len].to_ascii_lowercase();
                if let Some(problem) = scheme_problem(&scheme, rest, after, allowed) {
                    return Some(problem);
                }
            }
        }
        let starts_reference = slash(b)
            && bytes.get(i + 1).copied().is_some_and(slash)
            && (i == 0
                || !matches!(
                    bytes[i - 1],
                    b'/' | b'\\' | b':' | b'.' | b'%' | b'~' | b'_' | b'-'
                ) && !bytes[i - 1].is_ascii_alphanumeric());
        if starts_reference && let Some(problem) = reference_problem(&token[i..], allowed) {
            return Some(problem);
        }
    }
    None
}

/// `rest` starts with `scheme:`; `after` is what follows the colon.
fn scheme_problem(
    scheme: &str,
    rest: &str,
    after: &str,
    allowed: &HostAllowlist,
) -> Option<String> {
    let special = SPECIAL_SCHEMES.contains(&scheme);
    let authority = after.starts_with("//");
    if after.is_empty() || !(special || authority) {
        // `note:` or `urn:x`: no host to reach.
        return None;
    }
    if scheme != "http" && scheme != "https" {
        return Some(format!(
            "url scheme `{scheme}` is not allowed (only http and https)"
        ));
    }
    let Ok(url) = reqwest::Url::parse(rest) else {
        return Some("the url does not parse".to_string());
    };
    // Both readings must allow it: the client's (WHATWG) and hyper's stricter one, so a
    // form two parsers read differently (`http://ok\\@evil/`) is refused.
    let uri_allowed = rest.parse::<Uri>().is_ok_and(|uri| allowed.allows(&uri));
    if !allowed.allows_url(&url) || !uri_allowed {
        let host = url.host_str().unwrap_or("");
        return Some(format!(
            "url host `{host}` is not in the tool's allowed hosts"
        ));
    }
    None
}

/// `reference` starts with two slashes (`//host/...`, `\\\\host\\...`): relative to
/// any base it names its own host.
fn reference_problem(reference: &str, allowed: &HostAllowlist) -> Option<String> {
    let after = reference.trim_start_matches(['/', '\\']);
    if after.is_empty() {
        return None;
    }
    let resolved = reqwest::Url::parse(RELATIVE_BASE).and_then(|base| base.join(reference));
    match resolved {
        Ok(url) if url.host_str() == Some("relative.invalid") => None,
        Ok(url) if allowed.allows_url(&url) => None,
        Ok(url) => Some(format!(
            "a reference to host `{}` (`//host/...`) is not in the tool's allowed hosts",
            url.host_str().unwrap_or("")
        )),
        Err(_) => Some("a reference to another host (`//...`) does not parse".to_string()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn allow(entries: &[&str]) -> HostAllowlist {
        HostAllowlist::parse(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn url_arguments_are_checked() {
        let a = allow(&["127.0.0.1:8799"]);
        assert!(check_url_arguments(&json!({"url": "http://127.0.0.1:8799/a"}), &a).is_ok());
        for fine in [
            "see section 3: notes",
            "http://127.0.0.1:8799/a and //127.0.0.1:8799/b",
            "the http: and file: prefixes, urn:isbn:123, mailto:a@b.example",
            "path/to//file and a//b and C:\\dir",
            "Time: 10:30; ratio 3:1",
            "news:comp.lang.rust",
            "//",
        ] {
            assert!(
                check_url_arguments(&json!({"text": fine}), &a).is_ok(),
                "{fine}"
            );
        }
        for bad in [
            "http://evil.example/x",
            "file:///etc/passwd",
            "HTTP://10.0.0.1:8799/",
            "http://127.0.0.1:8799@evil.example/",
            "http://127.0.0.1:8799\\@evil.example/",
            // What a URL parser reads as http://169.254.169.254/ (the review's list).
            "http:\\\\169.254.169.254/latest",
            "http:169.254.169.254/latest",
            "http:/169.254.169.254/",
            "//169.254.169.254/latest",
            "\\\\169.254.169.254\\latest",
            "\u{1}http://169.254.169.254/",
            "ht\ttp://169.254.169.254/",
            "h\nttp://169.254.169.254/",
            "see http://169.254.169.254/latest",
            "url=http://169.254.169.254/",
            "(//169.254.169.254/x)",
            "ws://127.0.0.1:8799/",
            "ftp:evil.example",
            "file:etc/passwd",
            "gopher://127.0.0.1:8799/",
            "http://[::ffff:a9fe:a9fe]/",
            "http://127.0.0.1:8799/ok then http://evil.example/",
            "http://127.0.0.1:8799.evil.example/",
        ] {
            let r = check_url_arguments(&json!({"nested": [{"u": bad}]}), &a)
                .expect_err(&format!("{bad:?} passed"));
            assert_eq!(r.reason, crate::diagnostic::Reason::ArgumentUnsafe, "{bad}");
            assert_eq!(r.details["pointer"], "/nested/0/u");
        }
    }
}
