//! Whole-output snapshots: a command's text output compared with the file
//! `tests/snapshots/<name>.txt`, so a reviewer sees in the diff of that file what a
//! change does to what a user reads. `TOOLGATE_BLESS=1` rewrites the files (the bless
//! flag of contract/diagnostics.json too); review their diff before committing.

use std::collections::BTreeMap;

use similar::TextDiff;

use super::repo;

/// Asserts that `actual` is the snapshot `name`, or writes it under TOOLGATE_BLESS.
pub fn assert_snapshot(name: &str, actual: &str) {
    let path = repo().join("tests/snapshots").join(format!("{name}.txt"));
    if std::env::var_os("TOOLGATE_BLESS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        let diff = TextDiff::from_lines(expected.as_str(), actual)
            .unified_diff()
            .header("snapshot", "actual")
            .to_string();
        panic!(
            "the output differs from tests/snapshots/{name}.txt; if the change is intended, run `TOOLGATE_BLESS=1 cargo test --test it snapshots` and review the diff\n{diff}"
        );
    }
}

/// `text` with what differs from one run to the next replaced by stable names: every
/// 64-hex-digit value by `<hex:N>` (N by first appearance, so equal values keep equal
/// names), each `(from, to)` of `paths` (a temp directory) by its name.
pub fn redact(text: &str, paths: &[(&str, &str)]) -> String {
    let mut text = text.to_string();
    for (from, to) in paths {
        text = text.replace(from, to);
    }
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let run = bytes[i..]
            .iter()
            .take_while(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            .count();
        let bounded = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        if run == 64 && bounded {
            let value = &text[i..i + 64];
            let next = names.len() + 1;
            let n = *names.entry(value.to_string()).or_insert(next);
            out.push_str(&format!("<hex:{n}>"));
            i += 64;
        } else {
            let step = run.max(1);
            let end = (i + step).min(bytes.len());
            // Never split a UTF-8 character: hex digits are ASCII, so a step of one
            // lands mid-character only on a non-ASCII byte; copy the whole character.
            let end = (end..=bytes.len())
                .find(|&e| text.is_char_boundary(e))
                .unwrap_or(bytes.len());
            out.push_str(&text[i..end]);
            i = end;
        }
    }
    out
}
