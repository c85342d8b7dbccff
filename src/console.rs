//! The approver's console and a run's evidence page: plain HTML, CSS and JavaScript
//! shipped in the binary (no build step, nothing fetched at run time), served by
//! `server` at `/console`. The page talks to the same JSON API as every other client.
//!
//! INVARIANT: the page renders data only as text (`textContent`), loads no script but
//! its own file (the Content-Security-Policy below allows nothing else: no inline
//! script, no other origin), and keeps the credential in `sessionStorage` only.

/// The page's path.
pub const PATH: &str = "/console";
/// The prefix of its assets.
pub const ASSETS: &str = "/console/assets/";

/// What every console response carries: only this server's own script, style and API;
/// no inline code, no framing, no form posts, no plugins.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    pub content_type: &'static str,
    pub body: &'static [u8],
}

const INDEX: &str = include_str!("../console/index.html");
const SCRIPT: &str = include_str!("../console/console.js");
const STYLE: &str = include_str!("../console/console.css");

/// The file served at `path` (`/console`, `/console/` or an asset), None for any
/// other path.
pub fn asset(path: &str) -> Option<Asset> {
    let (content_type, body) = match path {
        "/console" | "/console/" => ("text/html; charset=utf-8", INDEX),
        "/console/assets/console.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/console/assets/console.css" => ("text/css; charset=utf-8", STYLE),
        _ => return None,
    };
    Some(Asset {
        content_type,
        body: body.as_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets_and_no_inline_script() {
        let page = std::str::from_utf8(asset(PATH).map(|a| a.body).unwrap_or_default())
            .unwrap_or_default();
        assert!(page.contains(r#"<script src="/console/assets/console.js" defer></script>"#));
        // Every <script> has a src: no inline code (the CSP would block it anyway).
        assert_eq!(page.matches("<script").count(), 1);
        assert!(!page.contains("style=\""), "no inline style attributes");
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "no other origin"
        );
        for name in ["console.js", "console.css"] {
            assert!(asset(&format!("{ASSETS}{name}")).is_some());
        }
        assert!(asset("/console/assets/../index.html").is_none());
    }

    #[test]
    fn the_script_never_writes_html() {
        let script = std::str::from_utf8(SCRIPT.as_bytes()).unwrap_or_default();
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ] {
            assert!(!script.contains(sink), "console.js uses `{sink}`");
        }
        assert!(
            !script.contains("localStorage"),
            "the credential stays in sessionStorage"
        );
    }
}
