//! Canonical JSON (RFC 8785, JCS) and the hashes taken over it.
//!
//! Everything toolgate hashes (arguments, outputs, audit lines) is hashed over these
//! bytes, so the same value always gives the same hash whatever its key order.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The RFC 8785 canonical serialization of `value`.
pub fn to_canonical_bytes(value: &Value) -> Vec<u8> {
    // Serializing a `serde_json::Value` cannot fail: its map keys are strings and its
    // numbers are finite.
    serde_json_canonicalizer::to_vec(value).unwrap_or_default()
}

/// The RFC 8785 canonical serialization of `value` as a string.
pub fn to_canonical_string(value: &Value) -> String {
    String::from_utf8(to_canonical_bytes(value)).unwrap_or_default()
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
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

    #[test]
    fn strings_are_escaped_as_rfc8785_says() {
        let v = json!({"k": "line\nbreak \u{1} \"q\" \u{e9}"});
        assert_eq!(
            to_canonical_string(&v),
            "{\"k\":\"line\\nbreak \\u0001 \\\"q\\\" \u{e9}\"}"
        );
    }
}
