//! The docs tell the truth about the diagnostic catalog (contract/diagnostics.json):
//! every reason and every error code a doc names exists, and an HTTP status written
//! beside a reason is that reason's status.
//!
//! Read: docs/*.md, README.md and ARCHITECTURE.md, as Markdown blocks (paragraphs, list
//! items, table rows, code blocks). Pure file reading, no server.
//!
//! What counts as naming a reason. Most backticked snake_case words in the docs are
//! not reasons (fields, event types, metrics, flags, CLI error kinds, the kinds of
//! `audit verify` problems), and several of those namespaces use refusal-like words
//! (`hub_fleet_key_mismatch`, `root_mismatch`, `tool_commit_refused`). So a word is held
//! to the catalog in two ways:
//! - **Named as a reason**, then it must be one: a backticked word right after an HTTP
//!   status ("403 x"), or right before one in parentheses ("x (403)"), or after the
//!   word "reason" ("reason x", "reasons: x"); a cell of a table column headed
//!   "reason"; the value of a JSON `"reason"` that is a snake_case identifier with an
//!   `_` (MCP's cancellation `"reason": "stop"` is free text).
//! - **Looks like a reason**, then it must be one or be a name the code knows: a
//!   backticked word within two edits of a cataloged reason, or ending the way reasons
//!   end (`_mismatch`, `_unavailable`, `_refused`, ...: the last word of each reason,
//!   less the nouns `run`, `role`, `lane`, `flag`, `kid`, `timeout`). "The code knows
//!   it" means the word, or a CamelCase name spelling it, is in src/ outside comment
//!   lines: an event type, a diff kind, a field, a CLI error kind. An invented reason
//!   is in neither.
//!
//! Words after verbs ("refused with x", "answers x") are not taken as named reasons:
//! the CLI's error kinds and the hub's and `audit verify`'s refusals are refused and
//! answered too, in their own words (`hub_fleet_key_mismatch`, `root_mismatch`).
//!
//! Error codes: every `TOOL_*` word and every UPPER_SNAKE word ending like an error
//! code (`_DENIED`, `_ERROR`, ...) is a cataloged error code or a `const`/`static`
//! declared in src/ (`TOOL_FIELDS`, `QUERY_TIMEOUT`); a JSON `"error_code"` value is a
//! cataloged error code.
//!
//! Statuses: in one table row, or one sentence (split at `. ` and `;`) of prose, each
//! HTTP status (a 4xx or 5xx number that is not a measure: not followed by a unit, not
//! one side of `a / b`) must be the status of the reason written nearest to it; in a
//! table with a reason column and an HTTP column, each reason of a row has the row's
//! status. [`STATUS_EXCEPTIONS`] lists where the product itself answers a reason with
//! another status.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A reason answered with another status than the catalog's, each with where and why.
/// Every entry must still be needed: a doc that no longer says it fails the test until
/// the entry is taken off.
const STATUS_EXCEPTIONS: [(&str, u16, &str); 2] = [
    (
        "request_too_large",
        431,
        "hyper refuses too many or too large headers itself; src/transport.rs gives that 431 the structured body",
    ),
    (
        "request_too_large",
        414,
        "hyper refuses a URI over 64 KiB itself; src/transport.rs gives that 414 the structured body",
    ),
];

/// Last words of reasons that name a thing, not an outcome: too common in field names
/// to make a word look like a reason.
const NOUN_ENDINGS: [&str; 6] = ["run", "role", "lane", "flag", "kid", "timeout"];

/// Units a measured number may carry: such a number is never an HTTP status.
const UNITS: [&str; 24] = [
    "ms",
    "s",
    "us",
    "ns",
    "KiB",
    "MiB",
    "GiB",
    "KB",
    "MB",
    "GB",
    "B",
    "bytes",
    "calls",
    "calls/s",
    "samples",
    "rounds",
    "nodes",
    "times",
    "allocations",
    "switches",
    "lines",
    "events",
    "requests",
    "x",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What contract/diagnostics.json says: each reason's status, and the error codes.
struct Catalog {
    status: BTreeMap<String, u16>,
    codes: BTreeSet<String>,
    /// The endings that make a word look like a reason (`_mismatch`, ...).
    endings: BTreeSet<String>,
    /// The endings of error codes (`_DENIED`, `_ERROR`, ...).
    code_endings: BTreeSet<String>,
}

impl Catalog {
    fn read(root: &Path) -> Catalog {
        let text = std::fs::read_to_string(root.join("contract/diagnostics.json")).unwrap();
        let json: Value = serde_json::from_str(&text).unwrap();
        let mut status = BTreeMap::new();
        let mut codes = BTreeSet::new();
        for entry in json["reasons"].as_array().unwrap() {
            let reason = entry["reason"].as_str().unwrap().to_string();
            let http = u16::try_from(entry["http_status"].as_u64().unwrap()).unwrap();
            status.insert(reason, http);
            codes.insert(entry["error_code"].as_str().unwrap().to_string());
        }
        let endings = status
            .keys()
            .filter_map(|r| r.rsplit_once('_').map(|(_, last)| last))
            .filter(|last| !NOUN_ENDINGS.contains(last))
            .map(|last| format!("_{last}"))
            .collect();
        let code_endings = codes
            .iter()
            .filter_map(|c| c.rsplit_once('_').map(|(_, last)| format!("_{last}")))
            .collect();
        Catalog {
            status,
            codes,
            endings,
            code_endings,
        }
    }

    fn is_reason(&self, word: &str) -> bool {
        self.status.contains_key(word)
    }

    /// The reason nearest in spelling to `word`, when within two edits (among the
    /// reasons that, like `word`, have an `_` or, like `cancelled`, have none).
    fn near(&self, word: &str) -> Option<&str> {
        self.status
            .keys()
            .filter(|r| r.contains('_') == word.contains('_'))
            .map(|r| (edits(word, r, 2), r))
            .filter(|(d, _)| *d <= 2)
            .min()
            .map(|(_, r)| r.as_str())
    }

    /// Whether `word` looks like a reason: near one in spelling, or ending like one.
    fn looks_like_reason(&self, word: &str) -> bool {
        self.near(word).is_some() || self.endings.iter().any(|e| word.ends_with(e.as_str()))
    }
}

/// Levenshtein distance (of ASCII words), or `bound + 1` when it is larger than `bound`.
fn edits(a: &str, b: &str, bound: usize) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len().abs_diff(b.len()) > bound {
        return bound + 1;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j + 1] + 1)
                .min(cur[j] + 1)
                .min(prev[j] + usize::from(ca != cb));
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()].min(bound + 1)
}

/// The names the code knows: words of src/ and of the audit crate's sources
/// (crates/toolgate-audit/src/) outside comment lines (CamelCase names also spelled in
/// snake_case), and the `const`/`static` items they declare.
struct CodeNames {
    words: HashSet<String>,
    consts: BTreeSet<String>,
}

impl CodeNames {
    fn read(root: &Path) -> CodeNames {
        let mut files = Vec::new();
        rust_files(&root.join("src"), &mut files);
        rust_files(&root.join("crates/toolgate-audit/src"), &mut files);
        let texts: Vec<String> = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect();
        // Each distinct word once (borrowed), then spelled as the docs would. A byte
        // loop: the test profile does not optimize this crate.
        let mut seen: HashSet<&str> = HashSet::new();
        let mut consts = BTreeSet::new();
        for text in &texts {
            let bytes = text.as_bytes();
            let mut comment = false;
            let mut line_start = true;
            let mut word_start = usize::MAX;
            // Whether the word has an `_` or a capital after its first letter: only
            // such words can spell a snake_case name with an `_`.
            let mut compound = false;
            let mut previous = "";
            for i in 0..=bytes.len() {
                let b = if i < bytes.len() { bytes[i] } else { b'\n' };
                let part = b.is_ascii_alphanumeric() || b == b'_';
                if part {
                    if word_start == usize::MAX {
                        word_start = i;
                        compound = false;
                    } else if b == b'_' || b.is_ascii_uppercase() {
                        compound = true;
                    }
                } else if word_start != usize::MAX {
                    let word = &text[word_start..i];
                    word_start = usize::MAX;
                    if !comment {
                        if previous == "const" || previous == "static" {
                            consts.insert(word.to_string());
                        }
                        if compound {
                            seen.insert(word);
                        }
                        previous = word;
                    }
                }
                if b == b'\n' {
                    comment = false;
                    line_start = true;
                } else if line_start && b == b'/' && bytes.get(i + 1) == Some(&b'/') {
                    comment = true;
                } else if b != b' ' && b != b'\t' {
                    line_start = false;
                }
            }
        }
        let words = seen
            .into_iter()
            .map(|word| {
                if word.starts_with(|c: char| c.is_ascii_uppercase())
                    && word.bytes().any(|b| b.is_ascii_lowercase())
                {
                    snake(word)
                } else {
                    word.to_string()
                }
            })
            .collect();
        CodeNames { words, consts }
    }
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

/// `ApprovalStoreUnavailable` -> `approval_store_unavailable`.
fn snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The docs the test reads.
fn doc_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.push(root.join("README.md"));
    files.push(root.join("ARCHITECTURE.md"));
    files
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A paragraph, a list item or a heading.
    Prose,
    /// One table row.
    Row,
    /// A fenced or indented code block.
    Code,
}

/// A Markdown block: its lines joined (with a space, or a newline in code), and where
/// each line starts, to name the line of an offset.
struct Block {
    kind: Kind,
    text: String,
    starts: Vec<(usize, usize)>,
    /// For a table row: the table's header cells, lowercased, without backticks.
    header: Option<Vec<String>>,
}

impl Block {
    fn new(kind: Kind, lines: &[(usize, &str)], header: Option<Vec<String>>) -> Block {
        let mut text = String::new();
        let mut starts = Vec::new();
        for (n, line) in lines {
            starts.push((text.len(), *n));
            text.push_str(line);
            text.push(if kind == Kind::Code { '\n' } else { ' ' });
        }
        Block {
            kind,
            text,
            starts,
            header,
        }
    }

    fn line_at(&self, offset: usize) -> usize {
        self.starts
            .iter()
            .take_while(|(start, _)| *start <= offset)
            .last()
            .map_or(0, |(_, n)| *n)
    }
}

fn is_separator_row(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('|') && t.contains('-') && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

fn is_list_item(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("- ")
        || t.starts_with("* ")
        || t.split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// The cells of a table row (`\|` is a pipe inside a cell).
fn cells(row: &str) -> Vec<String> {
    let t = row.trim().replace("\\|", "\u{1}");
    let t = t.strip_prefix('|').unwrap_or(&t);
    let t = t.strip_suffix('|').unwrap_or(t);
    t.split('|').map(|c| c.replace('\u{1}', "|")).collect()
}

fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<(usize, &str)> = text.lines().enumerate().map(|(i, l)| (i + 1, l)).collect();
    let mut out = Vec::new();
    let mut para: Vec<(usize, &str)> = Vec::new();
    let mut code: Vec<(usize, &str)> = Vec::new();
    let mut fenced = false;
    let mut prev_blank = true;
    let mut header: Option<Vec<String>> = None;
    let flush = |out: &mut Vec<Block>, buf: &mut Vec<(usize, &str)>, kind| {
        if !buf.is_empty() {
            out.push(Block::new(kind, buf, None));
            buf.clear();
        }
    };
    for (i, &(n, line)) in lines.iter().enumerate() {
        if line.trim_start().starts_with("```") {
            flush(&mut out, &mut para, Kind::Prose);
            flush(&mut out, &mut code, Kind::Code);
            fenced = !fenced;
            prev_blank = false;
            continue;
        }
        if fenced {
            code.push((n, line));
            continue;
        }
        if line.trim().is_empty() {
            flush(&mut out, &mut para, Kind::Prose);
            prev_blank = true;
            continue;
        }
        if line.starts_with("    ") && (prev_blank || !code.is_empty()) {
            flush(&mut out, &mut para, Kind::Prose);
            code.push((n, line));
            prev_blank = false;
            continue;
        }
        flush(&mut out, &mut code, Kind::Code);
        prev_blank = false;
        if line.trim_start().starts_with('|') {
            flush(&mut out, &mut para, Kind::Prose);
            if is_separator_row(line) {
                continue;
            }
            let next = lines.get(i + 1).map_or("", |(_, l)| *l);
            if is_separator_row(next) {
                header = Some(
                    cells(line)
                        .iter()
                        .map(|c| c.replace('`', "").trim().to_ascii_lowercase())
                        .collect(),
                );
                continue;
            }
            out.push(Block::new(Kind::Row, &[(n, line)], header.clone()));
            continue;
        }
        header = None;
        if line.starts_with('#') {
            flush(&mut out, &mut para, Kind::Prose);
            out.push(Block::new(Kind::Prose, &[(n, line)], None));
            continue;
        }
        if is_list_item(line) {
            flush(&mut out, &mut para, Kind::Prose);
        }
        para.push((n, line));
    }
    flush(&mut out, &mut para, Kind::Prose);
    flush(&mut out, &mut code, Kind::Code);
    out
}

/// Inline code spans: (start of the content, end of the content, content). A run of n
/// backticks opens a span that the next run of exactly n closes (CommonMark).
fn code_spans(text: &str) -> Vec<(usize, usize, &str)> {
    let bytes = text.as_bytes();
    let run_at = |i: usize| bytes[i..].iter().take_while(|&&b| b == b'`').count();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let n = run_at(i);
        let mut j = i + n;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let m = run_at(j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                spans.push((i + n, j, &text[i + n..j]));
                i = j + n;
            }
            None => i += n,
        }
    }
    spans
}

fn is_snake(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_lowercase())
        && word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// HTTP statuses written in `text`: (start, end, status).
fn statuses(text: &str) -> Vec<(usize, usize, u16)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i - start != 3 {
            continue;
        }
        let Ok(status) = text[start..i].parse::<u16>() else {
            continue;
        };
        if !(400..=599).contains(&status) {
            continue;
        }
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || "._-/:+~,#$".contains(c)) {
            continue;
        }
        let after = text[i..].chars().next();
        if after.is_some_and(|c| c.is_ascii_alphanumeric() || "._-/%".contains(c)) {
            continue;
        }
        if text[i..].starts_with(',') && text[i + 1..].starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        // One side of `a / b`: two measured counts.
        if text[..start].trim_end().ends_with('/') || text[i..].trim_start().starts_with('/') {
            continue;
        }
        let next_word = text[i..]
            .trim_start()
            .split(|c: char| c.is_whitespace() || ",;:)".contains(c))
            .next()
            .unwrap_or("");
        if UNITS.contains(&next_word) {
            continue;
        }
        out.push((start, i, status));
    }
    out
}

/// The sentences of a prose block: split after `. ` (not `e.g. `, `i.e. `) before a
/// capital, a backtick, a quote or a parenthesis, and after `;`.
fn sentences(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    for i in 0..bytes.len() {
        let end = match bytes[i] {
            b';' => i + 1,
            b'.' => {
                let rest = text[i + 1..].trim_start();
                let spaced = bytes.get(i + 1).is_some_and(u8::is_ascii_whitespace);
                let next_opens = rest.is_empty()
                    || rest.starts_with(|c: char| c.is_ascii_uppercase() || "`\"(".contains(c));
                let abbreviation = text[..i].ends_with("e.g") || text[..i].ends_with("i.e");
                if spaced && next_opens && !abbreviation {
                    i + 1
                } else {
                    continue;
                }
            }
            _ => continue,
        };
        out.push((start, end));
        start = end;
    }
    if start < text.len() {
        out.push((start, text.len()));
    }
    out
}

/// The word right before `offset`, lowercased, skipping spaces and `:`/`(`.
fn word_before(text: &str, offset: usize) -> String {
    let head = text[..offset].trim_end_matches([' ', ':', '(']);
    let start = head
        .rfind(|c: char| !c.is_ascii_alphanumeric())
        .map_or(0, |p| p + 1);
    head[start..].to_ascii_lowercase()
}

/// Whether the backticked word spanning `[start, end)` (content) is named as a reason.
fn named_as_reason(text: &str, start: usize, end: usize) -> Option<&'static str> {
    let open = start - 1;
    let close = end + 1;
    let head = text[..open].trim_end();
    if head.len() >= 3 {
        let tail = &head[head.len() - 3..];
        let before = head[..head.len() - 3].chars().next_back();
        if tail.bytes().all(|b| b.is_ascii_digit())
            && matches!(tail.as_bytes()[0], b'4' | b'5')
            && !before.is_some_and(|c| c.is_ascii_alphanumeric() || "._-/,".contains(c))
            && head.len() < open
        {
            return Some("an HTTP status names it");
        }
    }
    let rest = text.get(close..).unwrap_or("").trim_start();
    if let Some(inner) = rest.strip_prefix('(') {
        let digits: String = inner.chars().take_while(char::is_ascii_digit).collect();
        let after = inner[digits.len()..].chars().next();
        if digits.len() == 3
            && digits.starts_with(['4', '5'])
            && after.is_some_and(|c| ",;)".contains(c))
        {
            return Some("an HTTP status names it");
        }
    }
    let mut word = word_before(text, open);
    if word == "is" || word == "of" {
        let head = text[..open].trim_end();
        word = word_before(text, head.len() - 2);
    }
    if word == "reason" || word == "reasons" {
        return Some("the word \"reason\" names it");
    }
    None
}

/// The reason a status at `end` leads to through a list of statuses, as in "431 or 414
/// `request_too_large`": each of them is that reason's.
fn reason_named_after<'r>(
    text: &str,
    mut end: usize,
    reasons: &[&'r (usize, usize, String)],
) -> Option<&'r (usize, usize, String)> {
    loop {
        let rest = &text[end..];
        let skipped = rest.len() - rest.trim_start().len();
        let rest = rest.trim_start();
        if rest.starts_with('`') {
            let at = end + skipped + 1;
            return reasons.iter().find(|(s, _, _)| *s == at).copied();
        }
        let joined = ["or ", "and ", ", ", "/ "]
            .iter()
            .find_map(|j| rest.strip_prefix(j))?;
        let digits = joined.bytes().take_while(u8::is_ascii_digit).count();
        if digits != 3 {
            return None;
        }
        end = text.len() - joined.len() + digits;
    }
}

/// The string values of a JSON key in `text`: (offset, value).
fn json_values<'a>(text: &'a str, key: &str) -> Vec<(usize, &'a str)> {
    let needle = format!("\"{key}\"");
    let mut out = Vec::new();
    for (at, _) in text.match_indices(&needle) {
        let rest = text[at + needle.len()..].trim_start();
        let Some(rest) = rest.strip_prefix(':') else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix('"') else {
            continue;
        };
        if let Some(end) = rest.find('"') {
            out.push((at, &rest[..end]));
        }
    }
    out
}

/// UPPER_SNAKE words: (offset, word).
fn upper_words(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        let part = c.is_ascii_alphanumeric() || c == '_';
        match (part, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                let word = &text[s..i];
                if word.contains('_')
                    && word.starts_with(|c: char| c.is_ascii_uppercase())
                    && word
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                {
                    out.push((s, word));
                }
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// The reasons a table row names in its "reason" column: (offset in the row, reason
/// as written).
fn reason_cells(block: &Block) -> Vec<(usize, usize, String)> {
    let Some(header) = &block.header else {
        return Vec::new();
    };
    let Some(col) = header.iter().position(|h| h == "reason" || h == "reasons") else {
        return Vec::new();
    };
    let text = &block.text;
    let Some(cell) = cells(text).into_iter().nth(col) else {
        return Vec::new();
    };
    let Some(cell_at) = text.find(cell.as_str()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut offset = cell_at;
    for item in cell.split([',', '/']) {
        let name = item.trim().trim_matches('`').trim();
        if !name.is_empty() {
            let at = offset + item.find(name).unwrap_or(0);
            out.push((at, at + name.len(), name.to_string()));
        }
        offset += item.len() + 1;
    }
    out
}

/// The HTTP status of a row in its "HTTP" (or "HTTP status") column.
fn status_cell(block: &Block) -> Option<u16> {
    let header = block.header.as_ref()?;
    let col = header
        .iter()
        .position(|h| h == "http" || h == "http status")?;
    cells(&block.text).get(col)?.trim().parse().ok()
}

#[derive(Default)]
struct Findings {
    /// `file:line: problem`, in the order found.
    problems: Vec<String>,
    /// The [`STATUS_EXCEPTIONS`] some doc still needs.
    exceptions_used: BTreeSet<(String, u16)>,
}

impl Findings {
    fn add(&mut self, file: &str, line: usize, problem: String) {
        self.problems.push(format!("{file}:{line}: {problem}"));
    }
}

fn check_block(
    file: &str,
    block: &Block,
    catalog: &Catalog,
    code: &CodeNames,
    findings: &mut Findings,
) {
    let text = &block.text;

    // Error codes, everywhere (prose, tables and code).
    for (at, word) in upper_words(text) {
        let code_like = word.starts_with("TOOL_")
            || catalog
                .code_endings
                .iter()
                .any(|e| word.ends_with(e.as_str()));
        if code_like && !catalog.codes.contains(word) && !code.consts.contains(word) {
            findings.add(
                file,
                block.line_at(at),
                format!("`{word}` is not an error code of contract/diagnostics.json"),
            );
        }
    }
    for (at, value) in json_values(text, "error_code") {
        if !catalog.codes.contains(value) {
            findings.add(
                file,
                block.line_at(at),
                format!("`\"error_code\": \"{value}\"` is not an error code of contract/diagnostics.json"),
            );
        }
    }
    for (at, value) in json_values(text, "reason") {
        if is_snake(value) && value.contains('_') && !catalog.is_reason(value) {
            findings.add(
                file,
                block.line_at(at),
                format!("`\"reason\": \"{value}\"` is not a reason of contract/diagnostics.json"),
            );
        }
    }
    if block.kind == Kind::Code {
        return;
    }

    // Backticked words: named as a reason, or looking like one.
    let mut reasons: Vec<(usize, usize, String)> = Vec::new();
    for (start, end, word) in code_spans(text) {
        if !is_snake(word) {
            continue;
        }
        if catalog.is_reason(word) {
            reasons.push((start, end, word.to_string()));
            continue;
        }
        let line = block.line_at(start);
        if let Some(why) = named_as_reason(text, start, end) {
            findings.add(
                file,
                line,
                format!(
                    "`{word}` is named as a reason ({why}) but is not in contract/diagnostics.json"
                ),
            );
        } else if !code.words.contains(word) && catalog.looks_like_reason(word) {
            let hint = catalog
                .near(word)
                .map(|r| format!(" (did you mean `{r}`?)"))
                .unwrap_or_default();
            findings.add(
                file,
                line,
                format!("`{word}` looks like a reason but is neither in contract/diagnostics.json nor a name in src/{hint}"),
            );
        }
    }

    // A table's reason column, and its HTTP column.
    let cells_named = reason_cells(block);
    let row_status = status_cell(block);
    for (start, end, name) in &cells_named {
        match catalog.status.get(name) {
            None => findings.add(
                file,
                block.line_at(*start),
                format!("`{name}` is in a reason column but is not in contract/diagnostics.json"),
            ),
            Some(&status) => {
                if let Some(written) = row_status.filter(|w| *w != status) {
                    findings.add(
                        file,
                        block.line_at(*start),
                        format!("`{name}` is answered {status}, the table says {written}"),
                    );
                }
                reasons.push((*start, *end, name.clone()));
            }
        }
    }

    // Each status is the status of the reason written nearest to it.
    let units = match block.kind {
        Kind::Row => vec![(0, text.len())],
        _ => sentences(text),
    };
    for (from, to) in units {
        let here: Vec<&(usize, usize, String)> = reasons
            .iter()
            .filter(|(s, e, _)| *s >= from && *e <= to)
            .collect();
        if here.is_empty() {
            continue;
        }
        for (start, end, written) in statuses(&text[from..to]) {
            let (start, end) = (start + from, end + from);
            let distance = |(s, e, _): &&&(usize, usize, String)| {
                if *s >= end {
                    s - end
                } else {
                    start.saturating_sub(*e)
                }
            };
            let named = reason_named_after(text, end, &here);
            let Some((_, _, nearest)) = named.or_else(|| here.iter().min_by_key(distance).copied())
            else {
                continue;
            };
            let status = catalog.status[nearest.as_str()];
            if status == written {
                continue;
            }
            if STATUS_EXCEPTIONS
                .iter()
                .any(|(r, s, _)| r == nearest && *s == written)
            {
                findings.exceptions_used.insert((nearest.clone(), written));
                continue;
            }
            findings.add(
                file,
                block.line_at(start),
                format!("{written} is written beside `{nearest}`, which is answered {status}"),
            );
        }
    }
}

#[test]
fn the_docs_name_only_cataloged_reasons_codes_and_statuses() {
    let root = root();
    let catalog = Catalog::read(&root);
    let code = CodeNames::read(&root);
    let mut findings = Findings::default();
    for path in doc_files(&root) {
        let text = std::fs::read_to_string(&path).unwrap();
        let file = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        for block in blocks(&text) {
            check_block(&file, &block, &catalog, &code, &mut findings);
        }
    }
    for (reason, status, why) in STATUS_EXCEPTIONS {
        if !findings
            .exceptions_used
            .contains(&(reason.to_string(), status))
        {
            findings.problems.push(format!(
                "STATUS_EXCEPTIONS: no doc writes {status} beside `{reason}` any more ({why}); take the entry off"
            ));
        }
    }
    assert!(
        findings.problems.is_empty(),
        "the docs disagree with contract/diagnostics.json ({} problems):\n{}",
        findings.problems.len(),
        findings.problems.join("\n")
    );
}

/// The recognisers on small inputs, so a change to them is seen before it hides a
/// doc error.
#[test]
fn the_docs_checker_recognises_reasons_statuses_and_codes() {
    let root = root();
    let catalog = Catalog::read(&root);
    let code = CodeNames::read(&root);
    let check = |doc: &str| -> Vec<String> {
        let mut findings = Findings::default();
        for block in blocks(doc) {
            check_block("t.md", &block, &catalog, &code, &mut findings);
        }
        findings.problems
    };
    // Named as a reason, not in the catalog.
    assert_eq!(check("It is refused with 403 `lane_forbidden`.").len(), 1);
    assert_eq!(check("Refused: `lane_forbidden` (403).").len(), 1);
    assert_eq!(check("The call closes, reason `tool_failed`.").len(), 1);
    // Looks like one: a near miss, and an invented name with a reason's ending.
    let near = check("An `approval_expird` approval.");
    assert!(
        near[0].contains("did you mean `approval_expired`"),
        "{near:?}"
    );
    assert_eq!(
        check("Refused (`approval_row_tampered_mismatch`).").len(),
        1
    );
    // Not reasons: an event type, a field, a diff kind the code knows.
    assert!(check("One `tool_failed` event; `approval_id`; `triple_denied`.").is_empty());
    // Statuses.
    assert!(check("The lock (403 `safety_lock_engaged`).").is_empty());
    assert_eq!(check("The lock (503 `safety_lock_engaged`).").len(), 1);
    assert!(check("`jwt_expired` (401) or `jwks_unavailable` (503).").is_empty());
    assert_eq!(check("`jwt_expired` (503); then stop.").len(), 1);
    assert!(check("`rate_limited` after 500 ms; 565 / 577 `rate_limited`.").is_empty());
    assert!(check("`rate_limited` first. Then 503 for the rest.").is_empty());
    assert!(check("400 `request_malformed`, 413 or 431 `request_too_large`.").is_empty());
    assert_eq!(
        check("400 `request_malformed`, 409 or 413 `request_too_large`.").len(),
        1
    );
    let table = "| reason | HTTP | when |\n| --- | --- | --- |\n| approval_used | 409 | x |\n| approval_gone | 403 | y |\n";
    let got = check(table);
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(
        got.iter().any(|p| p.starts_with("t.md:4: `approval_gone`")),
        "{got:?}"
    );
    // Error codes, in prose and in JSON.
    assert_eq!(
        check("error code `INTERNAL_ERROR`, or `TOOL_ERROR`.").len(),
        2
    );
    assert_eq!(check("    {\"error_code\": \"POLICY_DENIED\"}\n").len(), 2);
    assert!(
        check("`TOOL_INTERNAL_ERROR`; `TOOL_FIELDS` and `QUERY_TIMEOUT` are consts.").is_empty()
    );
    assert_eq!(
        check("    {\"reason\": \"tool_failure\"}\n    {\"reason\": \"stop\"}\n").len(),
        1
    );
}
