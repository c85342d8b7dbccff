//! Canonical JSON (RFC 8785, JCS) and the hashes taken over it.
//!
//! Everything toolgate hashes (arguments, outputs, audit lines) is hashed over these
//! bytes, so the same value always gives the same hash whatever its key order.

use std::cmp::Ordering;

use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

/// The RFC 8785 canonical serialization of `value`.
pub fn to_canonical_bytes(value: &Value) -> Vec<u8> {
    to_canonical_string(value).into_bytes()
}

/// The RFC 8785 canonical serialization of `value` as a string.
pub fn to_canonical_string(value: &Value) -> String {
    let mut out = String::with_capacity(128);
    write_canonical(value, &mut out);
    out
}

/// Appends the RFC 8785 form of `value` to `out`.
///
/// INVARIANT: the bytes are exactly those of `serde_json_canonicalizer` (a test
/// compares them on generated values): strings, key order and integers within +-2^53
/// are written here, on the hot path; every other number goes through the crate
/// (ECMAScript number formatting).
pub fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in sorted_entries(map).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

/// The largest integer every JSON implementation (JavaScript and Python's included)
/// represents exactly: 2^53 - 1.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;
/// Nesting deeper than this is refused by [`write_portable`] (the audit log's bound on
/// `arguments` and `details`).
pub const MAX_PORTABLE_DEPTH: usize = 64;

/// A value nested deeper than [`MAX_PORTABLE_DEPTH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep;

/// Appends `value` in its portable form: RFC 8785, except that a number that is not an
/// integer within +-(2^53 - 1) becomes a string holding its RFC 8785 form, so that every
/// JSON implementation reads back the same bytes. `depth` is the nesting level of
/// `value` itself; a value nested deeper than [`MAX_PORTABLE_DEPTH`] is refused. This
/// is the form of every value in an audit event line.
pub fn write_portable(value: &Value, depth: usize, out: &mut String) -> Result<(), TooDeep> {
    if depth > MAX_PORTABLE_DEPTH {
        return Err(TooDeep);
    }
    match value {
        Value::Number(n) => {
            let safe = n.as_u64().is_some_and(|v| v <= MAX_SAFE_INTEGER)
                || n.as_i64()
                    .is_some_and(|v| v.unsigned_abs() <= MAX_SAFE_INTEGER);
            if safe {
                write_number(n, out);
            } else if n.is_f64() {
                let mut text = String::new();
                write_number(n, &mut text);
                write_string(&text, out);
            } else {
                // An integer beyond 2^53: its exact decimal digits.
                write_string(&n.to_string(), out);
            }
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_portable(item, depth + 1, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => write_portable_map(map, depth, out)?,
        other => write_canonical(other, out),
    }
    Ok(())
}

/// [`write_portable`] for an object at nesting level `depth`.
pub fn write_portable_map(
    map: &Map<String, Value>,
    depth: usize,
    out: &mut String,
) -> Result<(), TooDeep> {
    out.push('{');
    for (i, (key, item)) in sorted_entries(map).enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        write_portable(item, depth + 1, out)?;
    }
    out.push('}');
    Ok(())
}

/// [`write_portable`] for an unsigned integer.
pub fn write_portable_u64(n: u64, out: &mut String) {
    use std::fmt::Write;
    if n <= MAX_SAFE_INTEGER {
        let _ = write!(out, "{n}");
    } else {
        out.push('"');
        let _ = write!(out, "{n}");
        out.push('"');
    }
}

/// A value already written in its portable form ([`write_portable`]), shared by what
/// carries it: the pipeline renders a call's arguments, scope and trace once, and
/// both of the call's audit events take the text as is (issue 19).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Portable(std::sync::Arc<str>);

impl Portable {
    /// `value` at nesting level `depth` (0 for an event's field, 1 for an entry of its
    /// `details`).
    pub fn of(value: &Value, depth: usize) -> Result<Portable, TooDeep> {
        let mut out = String::with_capacity(64);
        write_portable(value, depth, &mut out)?;
        Ok(Portable(out.into()))
    }

    /// [`Portable::of`] for an object, without wrapping it in a `Value`.
    pub fn of_map(map: &Map<String, Value>, depth: usize) -> Result<Portable, TooDeep> {
        let mut out = String::with_capacity(64);
        write_portable_map(map, depth, &mut out)?;
        Ok(Portable(out.into()))
    }

    /// Text a typed writer produced with this module's writers (`Trace::portable`).
    /// Every such writer has a test holding its text to [`Portable::of`] of the value
    /// it stands for.
    pub fn from_written(text: String) -> Portable {
        Portable(text.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Appends the RFC 8785 form of a number.
pub fn write_number(n: &Number, out: &mut String) {
    use std::fmt::Write;
    let limit = 1u64 << 53;
    if let Some(u) = n.as_u64().filter(|u| *u <= limit) {
        let _ = write!(out, "{u}");
    } else if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= limit) {
        let _ = write!(out, "{i}");
    } else {
        // A number beyond 2^53 or with a fraction: ECMAScript's formatting.
        let text = serde_json_canonicalizer::to_string(&Value::Number(n.clone()));
        out.push_str(&text.unwrap_or_default());
    }
}

/// Appends `s` as an RFC 8785 string: `"` and `\` escaped, control characters as
/// `\b \t \n \f \r` or `\u00xx`, everything else as is.
pub fn write_string(s: &str, out: &mut String) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    let mut plain = 0;
    while let Some(i) = next_escape(bytes, plain) {
        out.push_str(&s[plain..i]);
        let b = bytes[i];
        let escape: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            0x0c => "\\f",
            b'\r' => "\\r",
            _ => "",
        };
        if escape.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(b & 0x0f)]));
        } else {
            out.push_str(escape);
        }
        plain = i + 1;
    }
    out.push_str(&s[plain..]);
    out.push('"');
}

/// Whether a byte must be escaped in a JSON string: `"`, `\` or a control character.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The index of the first byte at or after `from` that [`needs_escape`]. Most strings
/// need none: they are scanned eight bytes at a time (issue 19), with the classic
/// "has a zero byte" test on each of the three conditions.
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A high bit set in the result for each byte of `x` that is zero (and possibly
    // for bytes above a zero byte, which the byte loop below sorts out).
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut i = from;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        // Bytes below 0x20: x - 0x20 borrows into the high bit where the byte was
        // below 0x20 and its own high bit was clear.
        let control = x.wrapping_sub(ONES * 0x20) & !x & HIGHS;
        let quote = zero_byte(x ^ (ONES * u64::from(b'"')));
        let backslash = zero_byte(x ^ (ONES * u64::from(b'\\')));
        if control | quote | backslash != 0 {
            break;
        }
        i += 8;
    }
    bytes[i..]
        .iter()
        .position(|b| needs_escape(*b))
        .map(|at| i + at)
}

/// The entries of `map` in RFC 8785 order: by the keys' UTF-16 code units.
pub fn sorted_entries(map: &Map<String, Value>) -> SortedEntries<'_> {
    // The map is sorted by UTF-8 bytes, which is the same order unless a key holds a
    // character beyond U+FFFF: a map in order is walked as it is, without collecting
    // its entries (issue 19); only another is sorted.
    let in_order = map
        .keys()
        .zip(map.keys().skip(1))
        .all(|(a, b)| utf16_cmp(a, b) == Ordering::Less);
    if in_order {
        return SortedEntries::InOrder(map.iter());
    }
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_by(|a, b| utf16_cmp(a.0, b.0));
    SortedEntries::Sorted(entries.into_iter())
}

/// The entries of a map in RFC 8785 order ([`sorted_entries`]).
pub enum SortedEntries<'a> {
    /// The map's own order is already RFC 8785 order.
    InOrder(serde_json::map::Iter<'a>),
    /// The entries, sorted.
    Sorted(std::vec::IntoIter<(&'a String, &'a Value)>),
}

impl<'a> Iterator for SortedEntries<'a> {
    type Item = (&'a String, &'a Value);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            SortedEntries::InOrder(entries) => entries.next(),
            SortedEntries::Sorted(entries) => entries.next(),
        }
    }
}

/// Compares two strings by their UTF-16 code units (RFC 8785 key order).
pub fn utf16_cmp(a: &str, b: &str) -> Ordering {
    // Below U+E000 byte order and UTF-16 order agree; check the rare rest exactly.
    if a.bytes().chain(b.bytes()).all(|c| c < 0xee) {
        a.cmp(b)
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    to_hex(Sha256::digest(bytes))
}

/// Lowercase hex of `bytes`: what `hex::encode` gives, written into a buffer instead of
/// collected character by character (issue 19: a gated call hexes a dozen hashes, and
/// the collecting cost about 2% of its instructions).
pub fn to_hex(bytes: impl AsRef<[u8]>) -> String {
    let bytes = bytes.as_ref();
    let mut out = vec![0u8; bytes.len() * 2];
    // Cannot fail: the buffer is exactly twice the input.
    let _ = hex::encode_to_slice(bytes, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// Lowercase hex sha256 of the canonical form of `value`.
pub fn canonical_sha256(value: &Value) -> String {
    sha256_hex(&to_canonical_bytes(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_the_hash() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,2],"x":"s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#).unwrap();
        assert_eq!(canonical_sha256(&a), canonical_sha256(&b));
        assert_eq!(
            to_canonical_string(&a),
            r#"{"a":{"x":"s","y":[1,2]},"b":1}"#
        );
    }

    /// A xorshift generator of test values.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self, below: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % below as u64) as usize
        }

        fn text(&mut self, pieces: usize) -> String {
            const PIECES: [&str; 18] = [
                "a",
                "B",
                "z",
                "\"",
                "\\",
                "\n",
                "\u{1}",
                "\u{1f}",
                "\u{7f}",
                "\u{e9}",
                "\u{2028}",
                "\u{e000}",
                "\u{ffff}",
                "\u{10000}",
                "\u{1f600}",
                " ",
                "/",
                "0",
            ];
            (0..pieces)
                .map(|_| PIECES[self.next(PIECES.len())])
                .collect()
        }

        /// Random JSON, rich in what canonical forms get wrong: key order beyond the
        /// BMP, escapes, control characters, large and fractional numbers.
        fn value(&mut self, depth: usize) -> Value {
            let numbers = [
                json!(0),
                json!(-1),
                json!(9007199254740992u64),
                json!(9007199254740993u64),
                json!(-9007199254740993i64),
                json!(18446744073709551615u64),
                json!(1.5),
                json!(0.1),
                json!(1e21),
                json!(1e-7),
                json!(5e-324),
                json!(1.7976931348623157e308),
                json!(-0.0),
                json!(123456789.125),
                json!(2.0),
            ];
            match self.next(if depth > 3 { 4 } else { 6 }) {
                0 => numbers[self.next(numbers.len())].clone(),
                1 => {
                    let n = self.next(6);
                    Value::String(self.text(n))
                }
                2 => json!(self.next(2) == 0),
                3 => Value::Null,
                4 => {
                    let n = self.next(4);
                    Value::Array((0..n).map(|_| self.value(depth + 1)).collect())
                }
                _ => {
                    let n = self.next(6);
                    Value::Object(
                        (0..n)
                            .map(|_| {
                                let len = 1 + self.next(3);
                                (self.text(len), self.value(depth + 1))
                            })
                            .collect(),
                    )
                }
            }
        }
    }

    #[test]
    fn the_fast_writer_matches_the_reference_implementation() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..5000 {
            let value = rng.value(0);
            let reference = serde_json_canonicalizer::to_vec(&value).unwrap();
            assert_eq!(
                to_canonical_bytes(&value),
                reference,
                "{}",
                String::from_utf8_lossy(&reference)
            );
        }
    }

    #[test]
    fn every_character_is_escaped_alike_at_every_offset_of_a_long_string() {
        // The word-at-a-time scan must find an escape in any lane of any word, and
        // pass over every byte that needs none (UTF-8 continuation bytes included).
        let mut characters: Vec<char> = (0u8..0x80).map(char::from).collect();
        characters.extend(['\u{e9}', '\u{7ff}', '\u{2028}', '\u{ffff}', '\u{1f600}']);
        for c in characters {
            for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 31] {
                for at in 0..=len {
                    let mut s: String = "a".repeat(len);
                    s.insert(at, c);
                    let value = Value::String(s);
                    let reference = serde_json_canonicalizer::to_string(&value).unwrap();
                    assert_eq!(to_canonical_string(&value), reference, "{c:?} at {at}");
                }
            }
        }
    }

    #[test]
    fn hex_is_written_as_the_hex_crate_writes_it() {
        let mut rng = Rng(7);
        for len in 0..70 {
            let bytes: Vec<u8> = (0..len).map(|_| rng.next(256) as u8).collect();
            assert_eq!(to_hex(&bytes), hex::encode(&bytes));
        }
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+1F600 is a surrogate pair (D83D DE00): before U+E000 in UTF-16 order,
        // after it in code point order.
        let v = json!({"\u{e000}": 1, "\u{1f600}": 2, "a": 3});
        assert_eq!(
            to_canonical_string(&v),
            "{\"a\":3,\"\u{1f600}\":2,\"\u{e000}\":1}"
        );
    }

    #[test]
    fn strings_are_escaped_as_rfc8785_says() {
        let v = json!({"k": "line\nbreak \u{1} \"q\" \u{e9}"});
        assert_eq!(
            to_canonical_string(&v),
            "{\"k\":\"line\\nbreak \\u0001 \\\"q\\\" \u{e9}\"}"
        );
    }
}
