//! The layering of `src/` against ARCHITECTURE.md's code map: no module may import one
//! the map lists above it.
//!
//! The order is read from ARCHITECTURE.md itself (the backticked names before the first
//! `: ` of each top-level bullet of the "Code map" section), so the document and the
//! code cannot drift apart. Imports are every `crate::...` path in a file: `use` lines,
//! grouped `use crate::{a, b::{c, d}}` and paths written inside code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Upward imports the code still has, each with why. A new one fails the test; fixing
/// one of these fails it too, until it is taken off this list. None is left.
const KNOWN: [(&str, &str, &str); 0] = [];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The code map's units, top first (`commands`, `server`, `mcp::adapter`, ...), each
/// with the rank of its bullet (units named in one bullet are one layer).
fn code_map(text: &str) -> Vec<(String, usize)> {
    let section = text
        .split("\n## Code map\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Code map` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut units = Vec::new();
    for (rank, line) in section.lines().filter(|l| l.starts_with("- ")).enumerate() {
        let head = line.split(": ").next().unwrap_or(line);
        for (i, part) in head.split('`').enumerate() {
            if i % 2 == 1
                && let Some(unit) = unit_name(part)
            {
                units.push((unit, rank));
            }
        }
    }
    units
}

/// `server.rs` -> `server`, `audit/` -> `audit`, `mcp::adapter` stays; the benchmark
/// binary (`src/bin/...`) is not part of the library and has no place in the order.
fn unit_name(part: &str) -> Option<String> {
    if part.starts_with("src/bin/") {
        return None;
    }
    let name = part.trim_end_matches('/').trim_end_matches(".rs");
    Some(name.replace('/', "::"))
}

/// The module path of a file under `src/` (`src/mcp/adapter.rs` -> `mcp::adapter`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.first().map(String::as_str) == Some("bin") {
        return None;
    }
    if parts.last().map(String::as_str) == Some("mod") {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] {
        return None;
    }
    Some(parts.join("::"))
}

/// The listed unit a module path belongs to: the longest listed prefix.
fn unit_of<'a>(units: &'a [(String, usize)], path: &str) -> Option<(usize, &'a str)> {
    units
        .iter()
        .filter(|(u, _)| path == u.as_str() || path.starts_with(&format!("{u}::")))
        .max_by_key(|(u, _)| u.len())
        .map(|(u, rank)| (*rank, u.as_str()))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without `//` comments (doc comments name modules in prose).
fn strip_comments(source: &str) -> String {
    source
        .lines()
        .map(|line| match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every module path after each `crate::` in `source`, with groups expanded:
/// `crate::{a, b::{c, d}}` gives `a`, `b::c`, `b::d`.
fn crate_paths(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(is_ident) {
            continue;
        }
        expand(rest, String::new(), &mut out);
    }
    out
}

/// Expands the path (or group) at the start of `text` under `prefix`; returns how many
/// bytes it took.
fn expand(text: &str, prefix: String, out: &mut Vec<String>) -> usize {
    let text_trimmed = text.trim_start();
    let skipped = text.len() - text_trimmed.len();
    if let Some(inner) = text_trimmed.strip_prefix('{') {
        let mut used = 1;
        let mut cursor = inner;
        loop {
            let n = expand(cursor, prefix.clone(), out);
            used += n;
            cursor = &cursor[n..];
            let trimmed = cursor.trim_start();
            used += cursor.len() - trimmed.len();
            cursor = trimmed;
            match cursor.chars().next() {
                Some(',') => {
                    used += 1;
                    cursor = &cursor[1..];
                    if cursor.trim_start().starts_with('}') {
                        let t = cursor.trim_start();
                        used += cursor.len() - t.len() + 1;
                        return skipped + used;
                    }
                }
                Some('}') => return skipped + used + 1,
                _ => return skipped + used,
            }
        }
    }
    let end = text_trimmed
        .find(|c: char| !is_ident(c))
        .unwrap_or(text_trimmed.len());
    let segment = &text_trimmed[..end];
    let path = match (prefix.is_empty(), segment.is_empty()) {
        (_, true) => prefix.clone(),
        (true, false) => segment.to_string(),
        (false, false) => format!("{prefix}::{segment}"),
    };
    let after = &text_trimmed[end..];
    if let Some(next) = after.strip_prefix("::") {
        return skipped + end + 2 + expand(next, path, out);
    }
    if !path.is_empty() && path != "self" {
        out.push(path);
    }
    skipped + end
}

#[test]
fn group_and_inline_paths_are_read() {
    let source = "use crate::{a, b::{c, d::E}, f::g};\nfn x() { crate::h::i(); }\n// crate::j\n";
    let paths = crate_paths(&strip_comments(source));
    assert_eq!(paths, ["a", "b::c", "b::d::E", "f::g", "h::i"]);
}

#[test]
fn no_module_imports_one_listed_above_it() {
    let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let units = code_map(&map);
    assert!(
        units.len() > 10 && units.first().map(|(u, _)| u.as_str()) == Some("commands"),
        "the code map was not read: {units:?}"
    );
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut unlisted = Vec::new();
    let mut upward = BTreeSet::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let Some((rank, unit)) = unit_of(&units, &module) else {
            unlisted.push(module);
            continue;
        };
        let source = strip_comments(&std::fs::read_to_string(file).unwrap());
        for path in crate_paths(&source) {
            // Crate-root items (`crate::CONTRACT_VERSION`) belong to no unit.
            let Some((to_rank, to_unit)) = unit_of(&units, &path) else {
                continue;
            };
            if to_rank < rank {
                upward.insert((
                    unit.to_string(),
                    to_unit.to_string(),
                    format!("{} imports crate::{path}", file.display()),
                ));
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "modules missing from ARCHITECTURE.md's code map: {unlisted:?}"
    );
    let known: BTreeSet<(&str, &str)> = KNOWN.iter().map(|(a, b, _)| (*a, *b)).collect();
    let new: Vec<_> = upward
        .iter()
        .filter(|(from, to, _)| !known.contains(&(from.as_str(), to.as_str())))
        .map(|(_, _, why)| why.as_str())
        .collect();
    assert!(
        new.is_empty(),
        "imports of a module listed above the importer in ARCHITECTURE.md:\n{}",
        new.join("\n")
    );
    for (from, to, _) in KNOWN {
        assert!(
            upward.iter().any(|(f, t, _)| f == from && t == to),
            "{from} no longer imports {to}: take it off KNOWN"
        );
    }
}

#[test]
fn every_file_over_900_lines_says_why_it_is_one_unit() {
    let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = map
        .split("\n## Files over 900 lines\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Files over 900 lines` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let named: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("- `"))
        .filter_map(|l| l.split('`').nth(1))
        .collect();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let unexplained: Vec<String> = files
        .iter()
        .filter(|f| std::fs::read_to_string(f).unwrap().lines().count() > 900)
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .filter(|f| !named.iter().any(|n| f.ends_with(n)))
        .collect();
    assert!(
        unexplained.is_empty(),
        "files over 900 lines with no sentence in ARCHITECTURE.md: {unexplained:?}"
    );
}
