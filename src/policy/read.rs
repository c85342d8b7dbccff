//! Reading one policy file safely and parsing it as YAML into its raw type.
//!
//! Bounded on every axis: the size is checked before any byte is read, the file must be
//! a regular file that resolves (through any symlinks) inside its root directory, the
//! bytes must be UTF-8, and the YAML parser runs under a budget that caps nesting
//! depth, node count, alias expansion and scalar bytes, so an alias bomb or a deeply
//! nested document is refused with a problem instead of exhausting memory or stack.
//!
//! INVARIANT: this module and `raw.rs` are the only places that know YAML.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_saphyr::granit_parser::ErrorKind;
use serde_saphyr::{
    Error as YamlError, ExternalMessageSource, MessageFormatter, UserMessageFormatter,
};

use super::Problem;
use crate::localfile::ReadError;

/// The largest registry or schema file we read: 10 MiB.
pub const MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;

/// Deepest YAML nesting accepted (sequences plus mappings). The registry itself needs
/// about six levels; the rest is room for inline JSON Schemas.
pub const MAX_YAML_DEPTH: usize = 32;

/// A file read whole, with the name used in problems.
#[derive(Debug)]
pub(crate) struct SourceFile {
    /// The path as the user gave it (used in every problem about this file).
    pub display: String,
    pub bytes: Vec<u8>,
}

/// Reads `path`, refusing a missing file, a directory or other non-regular file, a file
/// over [`MAX_FILE_BYTES`] and a path that resolves outside `root`.
pub(crate) fn read_file(path: &Path, root: &Path) -> Result<SourceFile, Problem> {
    let display = path.display().to_string();
    let fail = |message: String, help: &str| Problem::at_file(&display, message, Some(help));

    if let Err(err) = std::fs::symlink_metadata(path) {
        return Err(if err.kind() == std::io::ErrorKind::NotFound {
            fail(
                format!("file `{display}` does not exist"),
                "check --policy-dir and --tools; the policy needs roles.yaml, lanes.yaml and the tool registry",
            )
        } else {
            fail(
                format!("cannot read `{display}`: {}", io_reason(&err)),
                "check the file's permissions",
            )
        });
    }
    let resolved = match path.canonicalize() {
        Ok(resolved) => resolved,
        Err(err) => {
            return Err(match std::fs::read_link(path) {
                Ok(target) => fail(
                    format!(
                        "`{display}` is a symlink to `{}`, which does not exist",
                        target.display()
                    ),
                    "point the symlink at a real file inside the policy directory, or replace it with the file",
                ),
                Err(_) => fail(
                    format!("cannot resolve `{display}`: {}", io_reason(&err)),
                    "check the path and its permissions",
                ),
            });
        }
    };
    let root_resolved = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    if !resolved.starts_with(&root_resolved) {
        return Err(fail(
            format!(
                "`{display}` resolves to `{}`, outside `{}`",
                resolved.display(),
                root.display()
            ),
            "policy files must live inside their directory; replace the symlink with the file itself",
        ));
    }
    // INVARIANT: from here on only `resolved` is used, so the file read is the file checked.
    let metadata = match std::fs::metadata(&resolved) {
        Ok(metadata) => metadata,
        Err(err) => {
            return Err(fail(
                format!("cannot read `{display}`: {}", io_reason(&err)),
                "check the file's permissions",
            ));
        }
    };
    if metadata.is_dir() {
        return Err(fail(
            format!("`{display}` is a directory, not a file"),
            "point at the YAML file itself",
        ));
    }
    if !metadata.is_file() {
        return Err(fail(
            format!("`{display}` is not a regular file"),
            "policy files must be regular files (not a fifo, socket or device)",
        ));
    }
    if metadata.len() > MAX_FILE_BYTES {
        return Err(too_large(&display, metadata.len()));
    }
    // The one bounded opener (`localfile`): without blocking (a fifo swapped in after
    // the checks cannot hang us), not through a symlink swapped in for the last
    // component, and at most one byte past the limit.
    match crate::localfile::read_resolved(&resolved, MAX_FILE_BYTES) {
        Ok(bytes) => Ok(SourceFile { display, bytes }),
        Err(ReadError::TooLarge { max }) => Err(too_large(&display, max + 1)),
        Err(ReadError::NotAFile) => Err(fail(
            format!("cannot read `{display}`: not a regular file"),
            "check the file's permissions",
        )),
        Err(ReadError::Io(err)) => Err(fail(
            format!("cannot read `{display}`: {}", io_reason(&err)),
            "check the file's permissions",
        )),
    }
}

/// An I/O error as a lowercase phrase without the OS error number.
fn io_reason(err: &std::io::Error) -> String {
    let text = err.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_string();
    lowercase_first(&text)
}

fn too_large(display: &str, len: u64) -> Problem {
    Problem::at_file(
        display,
        format!("`{display}` is {len} bytes, over the limit of {MAX_FILE_BYTES} bytes (10 MiB)"),
        Some("policy files are small; split out or remove the bulk"),
    )
}

/// The text of a file: must be non-empty UTF-8.
pub(crate) fn text(file: &SourceFile) -> Result<&str, Problem> {
    let text = match std::str::from_utf8(&file.bytes) {
        Ok(text) => text,
        Err(err) => {
            let (line, column) = line_column(&file.bytes, err.valid_up_to());
            return Err(Problem::at(
                &file.display,
                line,
                column,
                format!(
                    "`{}` is not valid UTF-8 (invalid byte at offset {})",
                    file.display,
                    err.valid_up_to()
                ),
                Some("save the file as UTF-8"),
            ));
        }
    };
    if text.trim().is_empty() {
        return Err(Problem::at_file(
            &file.display,
            format!("`{}` is empty", file.display),
            Some("a registry file needs at least `version:` and its list; see docs/policy.md"),
        ));
    }
    Ok(text)
}

/// 1-based line and column (in characters) of byte `offset`; the prefix before `offset`
/// must be valid UTF-8 (it is: it is what `from_utf8` accepted).
fn line_column(bytes: &[u8], offset: usize) -> (usize, usize) {
    let prefix = String::from_utf8_lossy(&bytes[..offset.min(bytes.len())]);
    let line = prefix.matches('\n').count() + 1;
    let column = prefix
        .rsplit('\n')
        .next()
        .map_or(0, |last| last.chars().count())
        + 1;
    (line, column)
}

/// The parser settings for registry files: YAML 1.2 booleans, no unknown tags, one
/// document, and a budget sized for hand-written policy files.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_YAML_DEPTH,
            flow_nesting_limit: MAX_YAML_DEPTH,
            max_documents: 1,
            max_nodes: 200_000,
            max_events: 500_000,
            max_aliases: 1_000,
            max_anchors: 1_000,
            max_recorded_anchor_events: 100_000,
            max_recorded_anchor_bytes: 1024 * 1024,
            max_total_scalar_bytes: 10 * 1024 * 1024,
            max_merge_keys: 1_000,
            max_inclusion_depth: 0,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 100_000,
            max_replay_stack_depth: 16,
        },
        strict_booleans: true,
        reject_unsupported_tags: true,
        reject_tagged_field_names: true,
        with_snippet: false,
    }
}

/// Parses `file` as YAML into `T`; on failure, one problem at the parser's position.
pub(crate) fn parse_yaml<T: DeserializeOwned>(file: &SourceFile) -> Result<T, Problem> {
    let text = text(file)?;
    serde_saphyr::from_str_with_options(text, yaml_options())
        .map_err(|err| yaml_problem(&file.display, &err))
}

/// Parses `file` as JSON (a schema file).
pub(crate) fn parse_json(file: &SourceFile) -> Result<serde_json::Value, Problem> {
    let text = text(file)?;
    serde_json::from_str(text).map_err(|err| {
        Problem::at(
            &file.display,
            err.line().max(1),
            err.column().max(1),
            format!(
                "`{}` is not valid JSON: {}",
                file.display,
                strip_json_position(&err.to_string())
            ),
            Some("a schema file holds one JSON Schema object"),
        )
    })
}

fn strip_json_position(message: &str) -> &str {
    message.split(" at line ").next().unwrap_or(message)
}

/// Turns a YAML error into a problem: the parser's position, a lowercase message
/// without the position suffix, and advice for the common cases.
fn yaml_problem(display: &str, err: &YamlError) -> Problem {
    let location = err.location().filter(|l| l.line() > 0);
    let inner = original(err);
    let text: String = UserMessageFormatter
        .format_message(inner)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let too_deep = matches!(
        inner,
        YamlError::ExternalMessage { source, .. }
            if matches!(source.as_ref(), ExternalMessageSource::Parser(scan) if matches!(scan.kind(), ErrorKind::RecursionLimitExceeded))
    );
    let (message, help) = match inner {
        _ if too_deep => (
            format!("YAML too deeply nested: more than {MAX_YAML_DEPTH} levels"),
            format!("policy files are limited to {MAX_YAML_DEPTH} levels of nesting"),
        ),
        YamlError::Budget { .. }
        | YamlError::AliasReplayLimitExceeded { .. }
        | YamlError::AliasExpansionLimitExceeded { .. }
        | YamlError::AliasReplayStackDepthExceeded { .. }
        | YamlError::AliasReplayCounterOverflow { .. } => (
            format!("YAML too large or too deeply nested: {}", trim_budget_prefix(&text)),
            format!(
                "policy files are limited to {MAX_YAML_DEPTH} levels of nesting, 1000 aliases and 100000 replayed alias events; write the values out instead of nesting aliases"
            ),
        ),
        YamlError::SerdeUnknownField { .. } => (
            text,
            "remove the field or fix its spelling; every field is listed in docs/policy.md".to_string(),
        ),
        YamlError::SerdeMissingField { .. } => (
            text,
            "add the field; every required field is listed in docs/policy.md".to_string(),
        ),
        YamlError::DuplicateMappingKey { .. } => (text, "write each key once".to_string()),
        YamlError::InvalidScalar { ty, .. } => (
            format!("wrong type: expected {}", scalar_kind(ty)),
            "check the field's type in docs/policy.md".to_string(),
        ),
        YamlError::SerdeInvalidType { .. }
        | YamlError::SerdeInvalidValue { .. }
        | YamlError::InvalidBooleanStrict { .. }
        | YamlError::NullIntoString { .. } => (
            format!("wrong type: {text}"),
            "check the field's type in docs/policy.md (booleans are `true`/`false`; quote strings that look like numbers)"
                .to_string(),
        ),
        YamlError::SerdeUnknownVariant { .. } => (text, "use one of the listed values".to_string()),
        _ => (
            format!("invalid YAML: {text}"),
            "fix the YAML syntax at this position".to_string(),
        ),
    };
    let message = lowercase_first(&message);
    match location {
        Some(location) => Problem::at(
            display,
            location.line() as usize,
            location.column() as usize,
            message,
            Some(&help),
        ),
        None => Problem::at_file(display, message, Some(&help)),
    }
}

/// What a scalar of Rust type `ty` must look like, in the policy author's words.
fn scalar_kind(ty: &str) -> String {
    match ty {
        "u64" => "a whole number from 0 to 18446744073709551615".into(),
        "u32" => "a whole number from 0 to 4294967295".into(),
        "bool" => "`true` or `false`".into(),
        other => format!("a value of type {other}"),
    }
}

/// The error under any snippet or alias wrapper.
fn original(err: &YamlError) -> &YamlError {
    match err.without_snippet() {
        YamlError::AliasError { error, .. } => original(error),
        other => other,
    }
}

fn trim_budget_prefix(text: &str) -> &str {
    text.strip_prefix("YAML document too large or too complex: ")
        .unwrap_or(text)
}

fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) if first.is_uppercase() && !text.starts_with("YAML") => {
            first.to_lowercase().chain(chars).collect()
        }
        _ => text.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::policy::raw::LanesFile;

    fn file(text: &[u8]) -> SourceFile {
        SourceFile {
            display: "lanes.yaml".into(),
            bytes: text.to_vec(),
        }
    }

    #[test]
    fn line_column_counts_characters() {
        assert_eq!(line_column(b"ab\ncd", 4), (2, 2));
        assert_eq!(line_column("é\nxé".as_bytes(), 6), (2, 3));
        assert_eq!(line_column(b"", 0), (1, 1));
    }

    #[test]
    fn syntax_errors_carry_a_position() {
        let problem = parse_yaml::<LanesFile>(&file(b"version: '1'\nlanes: [x\n")).unwrap_err();
        assert_eq!(problem.file, "lanes.yaml");
        assert!(problem.line.is_some());
        assert!(
            problem.message.starts_with("invalid YAML"),
            "{}",
            problem.message
        );
    }

    #[test]
    fn unknown_fields_are_refused_where_they_are() {
        let yaml = b"version: '1'\nlanes: []\nbogus: 1\n";
        let problem = parse_yaml::<LanesFile>(&file(yaml)).unwrap_err();
        assert_eq!((problem.line, problem.column), (Some(3), Some(1)));
        assert!(
            problem.message.contains("unknown field `bogus`"),
            "{}",
            problem.message
        );
    }

    #[test]
    fn yaml_1_1_booleans_are_refused() {
        let yaml = b"version: '1'\nlanes:\n  - lane_id: a\n    description: d\n    tools: []\n    required_scope_keys: []\n    prohibited_flags: []\n    run_statuses: [active]\n    write: yes\n";
        let problem = parse_yaml::<LanesFile>(&file(yaml)).unwrap_err();
        assert_eq!(problem.line, Some(9));
        assert!(
            problem.message.starts_with("wrong type"),
            "{}",
            problem.message
        );
    }

    #[test]
    fn a_second_document_is_refused() {
        let problem = parse_yaml::<LanesFile>(&file(
            b"version: '1'\nlanes: []\n---\nversion: '2'\nlanes: []\n",
        ))
        .unwrap_err();
        assert!(problem.message.contains("too large"), "{}", problem.message);
    }

    #[test]
    fn an_alias_bomb_is_refused_quickly() {
        let mut yaml = String::from("a: &a [x,x,x,x,x,x,x,x,x,x]\n");
        for (name, prev) in [
            ("b", "a"),
            ("c", "b"),
            ("d", "c"),
            ("e", "d"),
            ("f", "e"),
            ("g", "f"),
            ("h", "g"),
        ] {
            let refs = vec![format!("*{prev}"); 10].join(",");
            yaml.push_str(&format!("{name}: &{name} [{refs}]\n"));
        }
        // Expanded, this is 10^8 scalars; the budget stops it long before.
        let problem = parse_yaml::<serde_json::Value>(&file(yaml.as_bytes())).unwrap_err();
        assert!(problem.message.contains("too large"), "{}", problem.message);
        assert!(problem.line.is_some());
    }

    #[test]
    fn deep_nesting_is_refused() {
        let flow = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let mut block = String::new();
        for depth in 0..200 {
            block.push_str(&format!("{}k{depth}:\n", "  ".repeat(depth)));
        }
        block.push_str(&format!("{}leaf: 1\n", "  ".repeat(200)));
        for deep in [flow, block] {
            let problem = parse_yaml::<serde_json::Value>(&file(deep.as_bytes())).unwrap_err();
            assert!(problem.message.contains("nested"), "{}", problem.message);
            assert!(problem.line.is_some());
        }
    }

    #[test]
    fn empty_and_non_utf8_files_are_refused() {
        assert!(
            parse_yaml::<LanesFile>(&file(b"  \n\n"))
                .unwrap_err()
                .message
                .contains("is empty")
        );
        let problem = parse_yaml::<LanesFile>(&file(b"version: '1'\nlanes: [\xff]\n")).unwrap_err();
        assert_eq!((problem.line, problem.column), (Some(2), Some(9)));
        assert!(problem.message.contains("not valid UTF-8"));
    }
}
