//! Bounded text for messages and audit fields, and JSON pointer tokens: the one home of
//! cutting a string (by bytes or characters, on a character boundary, marked with
//! `...` or not) and of RFC 6901 escaping. Pure.

/// The mark a cut string ends (or, for a tail, starts) with.
pub const MARK: &str = "...";

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn prefix_bytes(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` cut to at most `max` bytes in all, [`MARK`] included when cut.
pub fn cut_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    format!("{}{MARK}", prefix_bytes(s, max.saturating_sub(MARK.len())))
}

/// The first `max` characters of `s`, unmarked.
pub fn prefix_chars(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// The first `max` characters of `s`, followed by [`MARK`] when cut.
pub fn cut_chars(s: &str, max: usize) -> String {
    let mut out = prefix_chars(s, max);
    if out.len() < s.len() {
        out.push_str(MARK);
    }
    out
}

/// The last `max` bytes of `s` on a character boundary, preceded by [`MARK`] when cut.
pub fn tail_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("{MARK}{}", &s[start..])
}

/// One JSON pointer reference token (RFC 6901): `~` as `~0`, `/` as `~1`.
pub fn pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// A reference token read back: `~1` as `/`, then `~0` as `~` (in that order, so
/// `~01` stays `~1`).
pub fn pointer_unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_land_on_character_boundaries() {
        let s = "aé€😀b";
        for max in 0..=s.len() + 1 {
            assert!(prefix_bytes(s, max).len() <= max);
            assert!(cut_bytes(s, max).len() <= max.max(MARK.len()));
            let tail = tail_bytes(s, max);
            assert!(tail.len() <= max + MARK.len());
        }
        assert_eq!(prefix_bytes("é", 1), "");
        assert_eq!(cut_bytes("abcdef", 5), "ab...");
        assert_eq!(cut_bytes("abc", 3), "abc");
        assert_eq!(tail_bytes("abcdef", 2), "...ef");
        assert_eq!(cut_chars("abcdef", 3), "abc...");
        assert_eq!(cut_chars("abc", 3), "abc");
        assert_eq!(prefix_chars("ééé", 2), "éé");
    }

    #[test]
    fn pointer_tokens_escape_and_read_back() {
        for token in ["a/b", "~", "~1", "a~/b", "", "plain"] {
            assert_eq!(pointer_unescape(&pointer_token(token)), token);
        }
        assert_eq!(pointer_token("a/b~c"), "a~1b~0c");
    }
}
