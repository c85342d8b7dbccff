//! ARCHITECTURE.md against the code: the layering of `src/` (no module may import one
//! the map lists above it), the files over 900 lines, who uses rusqlite, the one
//! bounded file opener, canonical hashing and `src/lib.rs`'s layout.
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
    rust_files(&root().join(AUDIT_CRATE_SRC), &mut files);
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

// The invariants of ARCHITECTURE.md that a reading of the source can check. Each reads
// the code of `src/` (not `src/bin/`) as the compiler sees it outside tests: comments
// and `#[cfg(test)] mod ... { }` blocks and `tests.rs` files left out.

/// Where the audit crate's sources are, and the prefix its files are named with.
const AUDIT_CRATE_SRC: &str = "crates/toolgate-audit/src";
const AUDIT_CRATE: &str = "toolgate-audit/";

/// The library's source files (`src/` without `src/bin/` and test-only files, and the
/// audit crate's), each with its path under `src/` (the audit crate's prefixed with
/// `toolgate-audit/`) and its code outside comments and test modules.
fn library_code() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (src, prefix) in [
        (root().join("src"), ""),
        (root().join(AUDIT_CRATE_SRC), AUDIT_CRATE),
    ] {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        for file in files {
            let name = file.strip_prefix(&src).unwrap().display().to_string();
            if name.starts_with("bin/") || name.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let code = without_test_modules(&strip_comments(&text));
            out.push((format!("{prefix}{name}"), code));
        }
    }
    assert!(
        out.iter()
            .any(|(name, _)| name == "toolgate-audit/localfile.rs"),
        "the audit crate's sources are not read"
    );
    out
}

/// `source` without its `#[cfg(test)]` modules: from the attribute to the `}` at the
/// indentation of the `mod` line.
fn without_test_modules(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim().starts_with("#[") {
                j += 1;
            }
            if let Some(line) = lines.get(j)
                && line.trim_start().starts_with("mod ")
                && line.trim_end().ends_with('{')
            {
                let indent = &line[..line.len() - line.trim_start().len()];
                let end = format!("{indent}}}");
                while j < lines.len() && lines[j] != end {
                    j += 1;
                }
                i = j + 1;
                continue;
            }
        }
        out.push(lines[i]);
        i += 1;
    }
    out.join("\n")
}

/// Whether `code` holds `word` with no identifier character on either side.
fn has_word(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The files of `allowed` (path under `src/` -> reason) that no longer do what they
/// are allowed: each entry must still be needed, so the list only shrinks.
fn stale<'a>(allowed: &[(&'a str, &str)], offenders: &BTreeSet<String>) -> Vec<&'a str> {
    allowed
        .iter()
        .map(|(file, _)| *file)
        .filter(|file| !offenders.contains(*file))
        .collect()
}

/// ARCHITECTURE.md (`audit/`): only these modules use SQLite through rusqlite. Every
/// other file that names `rusqlite` fails the test (seen failing: a `use
/// rusqlite::Connection;` added to `src/runs.rs` was named).
const RUSQLITE_USERS: [&str; 4] = [AUDIT_CRATE, "audit/", "approvals/store.rs", "state/"];

#[test]
fn only_the_listed_modules_use_rusqlite() {
    let mut users = BTreeSet::new();
    for (file, code) in library_code() {
        if has_word(&code, "rusqlite") {
            users.insert(file);
        }
    }
    let outside: Vec<&String> = users
        .iter()
        .filter(|f| !RUSQLITE_USERS.iter().any(|u| f.starts_with(u)))
        .collect();
    assert!(
        outside.is_empty(),
        "rusqlite used outside {RUSQLITE_USERS:?} (see ARCHITECTURE.md): {outside:?}"
    );
    for user in RUSQLITE_USERS {
        assert!(
            users.iter().any(|f| f.starts_with(user)),
            "{user} no longer uses rusqlite: take it off RUSQLITE_USERS and ARCHITECTURE.md"
        );
    }
}

/// Where the code opens a file to read it, other than through `localfile`, and why
/// each is not a file an insider may have replaced. A new place fails the test (seen
/// failing: `policy/read.rs` with its own `OpenOptions::new().read(true)` opener, as it
/// was before `localfile::read_resolved`); an entry that no longer opens one fails too.
const OTHER_OPENERS: [(&str, &str); 8] = [
    (
        "adapter/builtin/files.rs",
        "the demo tools' data files, opened beneath their root with no symlink followed \
         (openat2 RESOLVE_BENEATH) and read within MAX_DATA_FILE_BYTES",
    ),
    (
        "artifacts.rs",
        "opens the artifact directory only to fsync it",
    ),
    (
        "audit/ship/deliver.rs",
        "the kernel's /proc/sys/kernel/hostname",
    ),
    ("sandbox/exec.rs", "the kernel's /proc files"),
    (
        "sandbox/plan.rs",
        "the first 256 bytes of a tool's program, for its #! line",
    ),
    (
        "toolgate-audit/export.rs",
        "reads back the events.csv it has just written into the new export directory",
    ),
    (
        "toolgate-audit/segments.rs",
        "opens the segment directory only to fsync it",
    ),
    (
        "toolgate-audit/wal.rs",
        "opens the WAL and database only to fsync them",
    ),
];

/// Whether `code` opens a file for reading: `File::open`, `fs::read`,
/// `fs::read_to_string` (std or tokio), or `OpenOptions::new()` with a `.read(true)`
/// (in one chain or set on a binding).
fn opens_for_reading(code: &str) -> bool {
    let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    ["File::open(", "fs::read(", "fs::read_to_string("]
        .iter()
        .any(|p| compact.contains(p))
        || (compact.contains("OpenOptions::new()") && compact.contains(".read(true)"))
}

#[test]
fn local_files_are_opened_by_the_one_bounded_opener() {
    let mut openers = BTreeSet::new();
    for (file, code) in library_code() {
        if file != "toolgate-audit/localfile.rs" && opens_for_reading(&code) {
            openers.insert(file);
        }
    }
    let new: Vec<&String> = openers
        .iter()
        .filter(|f| !OTHER_OPENERS.iter().any(|(a, _)| a == f))
        .collect();
    assert!(
        new.is_empty(),
        "files opened for reading outside `localfile` (ARCHITECTURE.md: the one bounded \
         opener; use localfile::read or localfile::open): {new:?}"
    );
    let stale = stale(&OTHER_OPENERS, &openers);
    assert!(
        stale.is_empty(),
        "no longer open a file for reading: take them off OTHER_OPENERS: {stale:?}"
    );
}

/// The files that use the sha2 crate itself rather than `canonical`'s helpers, and
/// why: each hashes a binary format or a stream, never a JSON value. A new one fails
/// the test (seen failing: `authz.rs`, `hub/fleet.rs` and `audit/ship/mod.rs`, which
/// hashed bytes with `Sha256::digest` before they used `canonical::sha256_hex`).
const SHA2_USERS: [(&str, &str); 6] = [
    (
        "audit/archive.rs",
        "a segment's sha256, streamed while it is copied",
    ),
    (
        "toolgate-audit/cosign.rs",
        "the tlog-cosignature key ID over name, type byte and key",
    ),
    (
        "toolgate-audit/export.rs",
        "each export file's sha256, streamed as it is written (`Hashed`)",
    ),
    (
        "toolgate-audit/keys.rs",
        "the signed-note key ID over name, type byte and key",
    ),
    (
        "toolgate-audit/lib.rs",
        "HMAC-SHA256 of the canonical arguments (the hmac crate takes the hash type)",
    ),
    (
        "toolgate-audit/merkle.rs",
        "RFC 9162 leaf and node hashes over prefixed bytes",
    ),
];

/// serde_json's own serializers, whose bytes are not canonical.
const SERIALIZERS: [&str; 3] = [
    "serde_json::to_vec",
    "serde_json::to_string",
    "serde_json::to_writer",
];

/// What hashes bytes: the canonical helpers and the sha2/hmac calls.
const HASHERS: [&str; 4] = ["sha256_hex(", "hmac_sha256_hex(", "::digest(", ".update("];

/// The statements of `code` (split at `;`) that hash the output of a serde_json
/// serializer: written in the hashing statement itself, or bound by a `let` earlier
/// in the same function and named by it.
fn json_hashed_unsorted(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut tainted: Vec<String> = Vec::new();
    for statement in code.split(';') {
        if has_word(statement, "fn") {
            tainted.clear();
        }
        let serializes = SERIALIZERS.iter().any(|s| statement.contains(s));
        let hashes = HASHERS.iter().any(|h| statement.contains(h));
        if hashes && (serializes || tainted.iter().any(|name| has_word(statement, name))) {
            found.push(statement.trim().to_string());
        }
        if serializes && let Some(rest) = statement.split("let ").nth(1) {
            let rest = rest.trim_start().trim_start_matches("mut ");
            let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                tainted.push(name);
            }
        }
    }
    found
}

#[test]
fn the_json_hash_detector_sees_serialized_bytes_hashed() {
    let direct = "fn a(v: &Value) -> String { sha256_hex(&serde_json::to_vec(v).unwrap()) }";
    let bound = "fn b(v: &Value) -> String {\n let bytes = serde_json::to_vec(v).unwrap();\n \
                 sha256_hex(&bytes)\n}";
    let canonical = "fn c(v: &Value) -> String { sha256_hex(&to_canonical_bytes(v)) }";
    let other_fn = "fn d(v: &Value) { let bytes = serde_json::to_vec(v).unwrap(); write(&bytes); }\n\
                    fn e(bytes: &[u8]) -> String { sha256_hex(bytes) }";
    assert_eq!(json_hashed_unsorted(direct).len(), 1);
    assert_eq!(json_hashed_unsorted(bound).len(), 1);
    assert!(json_hashed_unsorted(canonical).is_empty());
    assert!(json_hashed_unsorted(other_fn).is_empty());
}

/// ARCHITECTURE.md (`canonical.rs`): a hash of a JSON value is over its canonical bytes,
/// and hashing goes through `canonical` except in the files of [`SHA2_USERS`].
#[test]
fn json_is_hashed_in_its_canonical_form() {
    let mut sha2_users = BTreeSet::new();
    let mut json_hashed = Vec::new();
    for (file, code) in library_code() {
        if file == "toolgate-audit/canonical.rs" {
            continue;
        }
        if has_word(&code, "sha2") || has_word(&code, "Sha256") {
            sha2_users.insert(file.clone());
        }
        for statement in json_hashed_unsorted(&code) {
            json_hashed.push(format!("{file}: {statement}"));
        }
    }
    assert!(
        json_hashed.is_empty(),
        "serde_json output hashed; hash `canonical::to_canonical_bytes` (or use \
         `canonical::canonical_sha256`):\n{}",
        json_hashed.join("\n")
    );
    let new: Vec<&String> = sha2_users
        .iter()
        .filter(|f| !SHA2_USERS.iter().any(|(a, _)| a == f))
        .collect();
    assert!(
        new.is_empty(),
        "sha2 used directly; hash through `canonical::sha256_hex` or \
         `canonical::canonical_sha256`: {new:?}"
    );
    let stale = stale(&SHA2_USERS, &sha2_users);
    assert!(
        stale.is_empty(),
        "no longer use sha2: take them off SHA2_USERS: {stale:?}"
    );
}

/// `src/lib.rs`'s `# Layout` names every module the crate declares, and only those
/// (seen failing: the layout that named 20 of the 32 modules).
#[test]
fn the_lib_layout_names_every_module() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    // Modules of its own, and those it takes from the audit crate
    // (`pub use toolgate_audit::{canonical, localfile};`).
    let declared: BTreeSet<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .chain(
            lib.lines()
                .filter_map(|l| l.strip_prefix("pub use toolgate_audit::{"))
                .flat_map(|l| l.trim_end_matches("};").split(", "))
                .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_')),
        )
        .collect();
    let named: BTreeSet<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//! - [`"))
        .filter_map(|l| l.split('`').next())
        .collect();
    assert!(declared.len() > 10, "no modules read from src/lib.rs");
    assert_eq!(
        declared, named,
        "src/lib.rs: the modules declared and those its `# Layout` names differ"
    );
}

/// ARCHITECTURE.md (`gateway/`, "authenticate once"): the public gateway methods that
/// take the raw bearer token, and why. Every other method of the API takes a proof
/// from `gateway/principal.rs` (seen failing: `list_runs(token, ...)`, as it was before
/// the proofs, and an entry taken off the list while its method still takes a token).
const TAKES_THE_BEARER: [(&str, &str); 14] = [
    ("admin", "an authentication step (principal.rs)"),
    ("auditor", "an authentication step (principal.rs)"),
    ("reader", "an authentication step (principal.rs)"),
    ("principal", "an authentication step (principal.rs)"),
    ("approver", "an authentication step (principal.rs)"),
    ("role_caller", "an authentication step (principal.rs)"),
    (
        "authenticate",
        "verifies a bearer JWT before any check reads it",
    ),
    (
        "credential",
        "a call's credential, checked and audited by the pipeline",
    ),
    (
        "commit",
        "a commit names a call: its credential is checked and audited",
    ),
    (
        "refuse_malformed_commit",
        "the audited refusal of a malformed commit",
    ),
    (
        "artifact",
        "every artifact read is audited, unauthenticated ones included",
    ),
    (
        "run_catalog",
        "the MCP front's admission: role_caller, then the run's checks",
    ),
    (
        "parse_call",
        "fills a call's ids from its run token; the pipeline checks it",
    ),
    (
        "fleet_refresh",
        "re-reads a run token's binding from the cluster database",
    ),
];

/// The `pub` methods of `gateway/` whose signature holds `needle`, by name.
fn gateway_methods_with(needle: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (file, code) in library_code() {
        if !file.starts_with("gateway/") {
            continue;
        }
        for (at, _) in code.match_indices("pub ") {
            let rest = &code[at + 4..];
            let rest = rest.strip_prefix("async ").unwrap_or(rest);
            let Some(rest) = rest.strip_prefix("fn ") else {
                continue;
            };
            let signature = &rest[..rest.find('{').unwrap_or(rest.len())];
            let name: String = signature.chars().take_while(|c| is_ident(*c)).collect();
            if signature.contains(needle) {
                found.insert(name);
            }
        }
    }
    found
}

#[test]
fn gateway_methods_take_a_proof_not_the_bearer_token() {
    let takers = gateway_methods_with("token: Option<&");
    let allowed: BTreeSet<String> = TAKES_THE_BEARER
        .iter()
        .map(|(name, _)| name.to_string())
        .collect();
    let unlisted: Vec<&String> = takers.difference(&allowed).collect();
    assert!(
        unlisted.is_empty(),
        "gateway methods take the raw bearer token instead of a proof from gateway/principal.rs (see ARCHITECTURE.md): {unlisted:?}"
    );
    let stale: Vec<&String> = allowed.difference(&takers).collect();
    assert!(
        stale.is_empty(),
        "no longer take the bearer token: take them off TAKES_THE_BEARER: {stale:?}"
    );
    // The typed answers: no method of the API answers an untyped JSON value.
    let untyped = gateway_methods_with("-> Result<Value, Refusal>");
    assert!(
        untyped.is_empty(),
        "gateway methods answer a serde_json::Value instead of a typed response: {untyped:?}"
    );
}
