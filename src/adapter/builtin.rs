//! The builtin adapter: the demo deployment's tools (legal services), implemented in
//! Rust over the data shipped in `<tools dir>/data/`; their argument and output
//! schemas are registered in `tools/tool_registry.yaml`.
//!
//! INVARIANT: `read_document` reads exactly the file its normalized `path` names,
//! inside `data/cases/<case_id>/`: the path is normalized lexically first, then opened
//! beneath the case folder with no symlink followed at any component (`open_beneath`:
//! openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or an O_NOFOLLOW walk), in one
//! operation, so a symlink, even one swapped in while the call runs, can neither lead
//! out of the folder nor make flag rules (evaluated on the normalized path, e.g.
//! `privileged/`) see another file than the one read. `case_lookup` and
//! `file_with_court` open their files the same way beneath `data/cases/` and
//! `<data_dir>/drafts/`; those two folders are kept open for at most a second
//! (`files::DataFolder`), the files beneath them opened on every call. The file access
//! itself is in `builtin/files.rs`. `draft_document`
//! writes only inside `<data_dir>/drafts/<case_id>/`. `case_id` must be a plain
//! identifier before it is used in a path.
//!
//! File I/O runs on tokio's blocking pool and every call is bounded by its deadline.
//! A blocking read or write already running when the deadline passes finishes in the
//! background and its result is discarded; a draft write is atomic (temp file and
//! rename), so it leaves either the old or the new draft, never a partial one.

mod files;

use std::collections::BTreeMap;
use std::path::PathBuf;

use files::{DataFolder, read_beneath, read_confined, read_data_file, write_atomically};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::http::Upstream;
use super::{
    AdapterEnv, ExecContext, ExecError, SettingProblem, output_hard_cap, scope_id, unsafe_argument,
};
use crate::canonical::sha256_hex;
use crate::diagnostic::Refusal;
use crate::policy::Tool;

/// Every builtin this build has, sorted.
pub const BUILTIN_NAMES: &[&str] = &[
    "case_lookup",
    "conflict_check",
    "draft_document",
    "echo",
    "file_with_court",
    "legal_search",
    "read_document",
];

/// Longest `path` argument `read_document` accepts, in bytes.
pub const MAX_PATH_BYTES: usize = 512;
/// Most components a document path may have.
const MAX_PATH_DEPTH: usize = 32;
/// Largest data file (clients list, case record, corpus file, draft) a builtin reads.
const MAX_DATA_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Most corpus files searched.
const MAX_CORPUS_FILES: usize = 256;
/// Default and largest `limit` of `legal_search`.
const DEFAULT_SEARCH_LIMIT: u64 = 10;
const MAX_SEARCH_LIMIT: u64 = 50;
/// Longest line of a search result, in bytes.
const MAX_RESULT_TEXT_BYTES: usize = 1000;

const DEFAULT_COURT_URL: &str = "http://127.0.0.1:8799/filings";
const DEFAULT_COURT_HOST: &str = "127.0.0.1:8799";

/// The builtin adapter of one tool.
#[derive(Debug)]
pub struct BuiltinAdapter {
    kind: Builtin,
    /// `<tools dir>/data`: the shipped, read-only demo data.
    data_root: PathBuf,
    /// The gateway's data directory: where drafts are written.
    data_dir: PathBuf,
    /// `<data_root>/cases`, where `case_lookup` reads.
    cases: DataFolder,
    /// `<data_dir>/drafts`, where `file_with_court` reads.
    drafts: DataFolder,
}

#[derive(Debug)]
enum Builtin {
    ConflictCheck,
    CaseLookup,
    LegalSearch,
    ReadDocument,
    DraftDocument,
    FileWithCourt(Box<Upstream>),
    Echo,
}

impl BuiltinAdapter {
    pub(super) fn build(
        name: &str,
        settings: &BTreeMap<String, Value>,
        env: &AdapterEnv,
    ) -> Result<Self, Vec<SettingProblem>> {
        let known: &[&str] = match name {
            "file_with_court" => &["allowed_hosts", "url"],
            n if BUILTIN_NAMES.contains(&n) => &[],
            _ => {
                return Err(vec![
                    SettingProblem::new(format!("unknown builtin `{name}`"))
                        .help(format!("builtins are: {}", BUILTIN_NAMES.join(", "))),
                ]);
            }
        };
        let mut problems: Vec<SettingProblem> = settings
            .keys()
            .filter(|k| !known.contains(&k.as_str()))
            .map(|k| {
                let help = if known.is_empty() {
                    format!("builtin `{name}` takes no settings")
                } else {
                    format!("settings of builtin `{name}` are: {}", known.join(", "))
                };
                SettingProblem::new(format!("unknown setting `{k}` for builtin `{name}`"))
                    .help(help)
            })
            .collect();
        let kind = match name {
            "conflict_check" => Builtin::ConflictCheck,
            "case_lookup" => Builtin::CaseLookup,
            "legal_search" => Builtin::LegalSearch,
            "read_document" => Builtin::ReadDocument,
            "draft_document" => Builtin::DraftDocument,
            "echo" => Builtin::Echo,
            _ => match court_upstream(settings) {
                Ok(upstream) => Builtin::FileWithCourt(Box::new(upstream)),
                Err(found) => {
                    problems.extend(found);
                    return Err(problems);
                }
            },
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        let data_root = env.tools_dir.join("data");
        Ok(BuiltinAdapter {
            kind,
            cases: DataFolder::new(data_root.join("cases")),
            drafts: DataFolder::new(env.data_dir.join("drafts")),
            data_root,
            data_dir: env.data_dir.clone(),
        })
    }

    pub(super) fn validate(
        &self,
        arguments: &Value,
        scope: &Map<String, Value>,
    ) -> Result<(), Refusal> {
        match &self.kind {
            Builtin::ConflictCheck | Builtin::LegalSearch | Builtin::Echo => Ok(()),
            Builtin::CaseLookup => scope_id(scope, "case_id").map(drop),
            Builtin::ReadDocument => {
                scope_id(scope, "case_id")?;
                let path = str_arg(arguments, "path").unwrap_or_default();
                normalize_relative(path)
                    .map(drop)
                    .map_err(|problem| unsafe_argument("/path", problem))
            }
            Builtin::DraftDocument => {
                scope_id(scope, "case_id")?;
                let title = str_arg(arguments, "title").unwrap_or_default();
                if title.chars().any(char::is_control) {
                    return Err(unsafe_argument(
                        "/title",
                        "must be one line without control characters",
                    ));
                }
                Ok(())
            }
            Builtin::FileWithCourt(upstream) => {
                scope_id(scope, "case_id")?;
                scope_id(scope, "matter_id")?;
                let draft_id = str_arg(arguments, "draft_id").unwrap_or_default();
                if !is_draft_id(draft_id) {
                    return Err(unsafe_argument("/draft_id", "must match ^d-[0-9a-f]{16}$"));
                }
                super::http::check_url_arguments(arguments, upstream.allowed())
            }
        }
    }

    pub(super) fn normalize(&self, arguments: &Value) -> Value {
        let mut normalized = arguments.clone();
        match &self.kind {
            Builtin::ReadDocument => {
                if let Some(Value::String(path)) = normalized.get_mut("path")
                    && let Ok(normal) = normalize_relative(path)
                {
                    *path = normal;
                }
            }
            Builtin::LegalSearch => {
                if let Value::Object(map) = &mut normalized {
                    map.entry("limit").or_insert(json!(DEFAULT_SEARCH_LIMIT));
                }
            }
            _ => {}
        }
        normalized
    }

    pub(super) async fn execute(
        &self,
        tool: &Tool,
        arguments: &Value,
        ctx: ExecContext<'_>,
    ) -> Result<Value, ExecError> {
        let work = async {
            match &self.kind {
                Builtin::ConflictCheck => self.conflict_check(arguments).await,
                Builtin::CaseLookup => self.case_lookup(case_id(ctx.scope)?).await,
                Builtin::LegalSearch => self.legal_search(arguments).await,
                Builtin::ReadDocument => {
                    self.read_document(case_id(ctx.scope)?, arguments, output_hard_cap(tool))
                        .await
                }
                Builtin::DraftDocument => self.draft_document(case_id(ctx.scope)?, arguments).await,
                Builtin::FileWithCourt(upstream) => {
                    self.file_with_court(upstream, arguments, &ctx, output_hard_cap(tool))
                        .await
                }
                Builtin::Echo => Ok(json!({ "echo": arguments })),
            }
        };
        tokio::time::timeout_at(ctx.deadline, work)
            .await
            .unwrap_or(Err(ExecError::Timeout))
    }

    async fn conflict_check(&self, arguments: &Value) -> Result<Value, ExecError> {
        let party_name = str_arg(arguments, "party_name").unwrap_or_default();
        let bytes = read_data_file(&self.data_root.join("clients.json"), "clients.json").await?;
        let mut clients: Vec<ClientEntry> = serde_json::from_slice(&bytes)
            .map_err(|e| ExecError::Failed(format!("`clients.json` is malformed: {e}")))?;
        let needle = party_name.to_lowercase();
        clients.retain(|c| c.name.to_lowercase().contains(&needle));
        clients.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        let conflict = clients
            .iter()
            .any(|c| c.relationship != Relationship::Client);
        Ok(json!({ "party_name": party_name, "conflict": conflict, "matches": clients }))
    }

    async fn case_lookup(&self, case_id: &str) -> Result<Value, ExecError> {
        let rel = format!("{case_id}/case.json");
        let bytes = read_beneath(&self.cases, rel, format!("case `{case_id}`")).await?;
        let record: CaseRecord = serde_json::from_slice(&bytes).map_err(|e| {
            ExecError::Failed(format!("the record of case `{case_id}` is malformed: {e}"))
        })?;
        if record.case_id != case_id {
            return Err(ExecError::Failed(format!(
                "the record in folder `{case_id}` is for case `{}`",
                record.case_id
            )));
        }
        serde_json::to_value(record).map_err(|e| ExecError::Failed(e.to_string()))
    }

    async fn legal_search(&self, arguments: &Value) -> Result<Value, ExecError> {
        let query = str_arg(arguments, "query").unwrap_or_default();
        let limit = arguments
            .get("limit")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_SEARCH_LIMIT)
            .clamp(1, MAX_SEARCH_LIMIT);
        let terms: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        if terms.is_empty() {
            return Err(ExecError::Failed(format!(
                "query `{query}` has no search terms"
            )));
        }
        let corpus = self.data_root.join("corpus");
        let mut names = Vec::new();
        let mut entries = tokio::fs::read_dir(&corpus)
            .await
            .map_err(|e| ExecError::Failed(format!("the corpus cannot be listed: {e}")))?;
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|e| ExecError::Failed(format!("the corpus cannot be listed: {e}")))?
        {
            if let Some(name) = entry.file_name().to_str()
                && name.ends_with(".txt")
                && !name.starts_with('.')
            {
                names.push(name.to_string());
            }
        }
        names.sort();
        names.truncate(MAX_CORPUS_FILES);

        let mut results = Vec::new();
        let mut total: u64 = 0;
        for name in &names {
            let bytes =
                read_data_file(&corpus.join(name), &format!("corpus file `{name}`")).await?;
            let text = String::from_utf8_lossy(&bytes);
            for (i, line) in text.lines().enumerate() {
                let lower = line.to_lowercase();
                if terms.iter().all(|t| lower.contains(t.as_str())) {
                    total += 1;
                    if total <= limit {
                        results.push(json!({
                            "source": name,
                            "line": i + 1,
                            "text": super::truncate(line.trim_end(), MAX_RESULT_TEXT_BYTES),
                        }));
                    }
                }
            }
        }
        Ok(json!({ "query": query, "results": results, "total": total }))
    }

    async fn read_document(
        &self,
        case_id: &str,
        arguments: &Value,
        cap: usize,
    ) -> Result<Value, ExecError> {
        let requested = str_arg(arguments, "path").unwrap_or_default();
        let rel = normalize_relative(requested).map_err(|problem| ExecError::ArgumentUnsafe {
            pointer: "/path".into(),
            problem: problem.into(),
        })?;
        let case_dir = self.data_root.join("cases").join(case_id);
        let (case, path) = (case_id.to_string(), rel.clone());
        let bytes =
            tokio::task::spawn_blocking(move || read_confined(&case_dir, &case, &path, cap))
                .await
                .map_err(|e| ExecError::Failed(format!("reading the document failed: {e}")))??;
        let sha256 = sha256_hex(&bytes);
        let size = bytes.len();
        let content = String::from_utf8(bytes)
            .map_err(|_| ExecError::Failed(format!("document `{rel}` is not utf-8 text")))?;
        Ok(json!({
            "case_id": case_id,
            "path": rel,
            "bytes": size,
            "sha256": sha256,
            "content": content,
        }))
    }

    async fn draft_document(&self, case_id: &str, arguments: &Value) -> Result<Value, ExecError> {
        let title = str_arg(arguments, "title").unwrap_or_default();
        let body = str_arg(arguments, "body").unwrap_or_default();
        let draft_id = draft_id(case_id, title, body);
        let content = format!("# {title}\n\n{body}\n").into_bytes();
        let sha256 = sha256_hex(&content);
        let size = content.len();
        let data_dir = self.data_dir.clone();
        let case = case_id.to_string();
        let file_name = format!("{draft_id}.md");
        tokio::task::spawn_blocking(move || {
            write_atomically(&data_dir, &["drafts", &case], &file_name, &content)
        })
        .await
        .map_err(|e| ExecError::Failed(format!("writing the draft failed: {e}")))??;
        Ok(json!({
            "draft_id": draft_id,
            "case_id": case_id,
            "path": format!("drafts/{case_id}/{draft_id}.md"),
            "bytes": size,
            "sha256": sha256,
        }))
    }

    async fn file_with_court(
        &self,
        upstream: &Upstream,
        arguments: &Value,
        ctx: &ExecContext<'_>,
        cap: usize,
    ) -> Result<Value, ExecError> {
        let case_id = case_id(ctx.scope)?;
        let matter_id = match ctx.scope.get("matter_id") {
            Some(Value::String(m)) if super::is_safe_id(m) => m.as_str(),
            _ => {
                return Err(ExecError::Failed(
                    "scope key `matter_id` is missing or not an id".into(),
                ));
            }
        };
        let draft_id = str_arg(arguments, "draft_id").unwrap_or_default();
        if !is_draft_id(draft_id) {
            return Err(ExecError::ArgumentUnsafe {
                pointer: "/draft_id".into(),
                problem: "must match ^d-[0-9a-f]{16}$".into(),
            });
        }
        let rel = format!("{case_id}/{draft_id}.md");
        let bytes = read_beneath(
            &self.drafts,
            rel,
            format!("draft `{draft_id}` of case `{case_id}`"),
        )
        .await?;
        let text = String::from_utf8(bytes)
            .map_err(|_| ExecError::Failed(format!("draft `{draft_id}` is not utf-8 text")))?;
        let (title, body) = parse_draft(&text).ok_or_else(|| {
            ExecError::Failed(format!("draft `{draft_id}` is not in draft format"))
        })?;
        let filing = json!({
            "case_id": case_id,
            "matter_id": matter_id,
            "draft_id": draft_id,
            "title": title,
            "body": body,
            "sha256": sha256_hex(text.as_bytes()),
        });
        let answer = upstream.post_json(&filing, ctx, cap).await?;
        let field = |name: &str| {
            answer
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| {
                    ExecError::Failed(format!("the court's answer has no string `{name}`"))
                })
        };
        let mut filed = json!({
            "draft_id": draft_id,
            "filing_id": field("filing_id")?,
            "status": field("status")?,
        });
        // A two-phase court answers a commit token; it is passed on for the gateway
        // to take (and never shown to the caller).
        if let (Some(token), Value::Object(filed)) = (answer.get("commit_token"), &mut filed) {
            filed.insert("commit_token".into(), token.clone());
        }
        Ok(filed)
    }
}

/// The hosts `file_with_court` may reach (its `allowed_hosts` setting, or the default
/// court), for its two-phase calls; a malformed setting is reported by the builtin.
pub(super) fn court_hosts(settings: &BTreeMap<String, Value>) -> Vec<String> {
    match settings.get("allowed_hosts") {
        None => vec![DEFAULT_COURT_HOST.to_string()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(_) => Vec::new(),
    }
}

fn court_upstream(settings: &BTreeMap<String, Value>) -> Result<Upstream, Vec<SettingProblem>> {
    let mut problems = Vec::new();
    let url = match settings.get("url") {
        None => DEFAULT_COURT_URL.to_string(),
        Some(Value::String(u)) => u.clone(),
        Some(_) => {
            problems.push(SettingProblem::new("setting `url` must be a string"));
            String::new()
        }
    };
    let hosts = match settings.get("allowed_hosts") {
        None => vec![DEFAULT_COURT_HOST.to_string()],
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(_) => {
            problems.push(SettingProblem::new(
                "setting `allowed_hosts` must be a list of strings",
            ));
            Vec::new()
        }
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    Upstream::build(&url, &hosts)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Relationship {
    Client,
    AdverseParty,
    FormerClient,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientEntry {
    client_id: String,
    name: String,
    relationship: Relationship,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseRecord {
    case_id: String,
    title: String,
    court: String,
    status: String,
    matter_ids: Vec<String>,
    parties: Vec<CaseParty>,
    opened: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseParty {
    name: String,
    role: String,
}

fn str_arg<'a>(arguments: &'a Value, key: &str) -> Option<&'a str> {
    arguments.get(key).and_then(Value::as_str)
}

/// The case id from the scope, already checked by `validate`; checked again so that
/// no path is ever built from an unchecked id.
fn case_id(scope: &Map<String, Value>) -> Result<&str, ExecError> {
    scope_id(scope, "case_id").map_err(|r| ExecError::ArgumentUnsafe {
        pointer: "/case_id".into(),
        problem: r.message,
    })
}

fn is_draft_id(s: &str) -> bool {
    s.len() == 18
        && s.starts_with("d-")
        && s[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `d-` and the first 16 hex digits of sha256(case_id "\n" title "\n" body).
pub fn draft_id(case_id: &str, title: &str, body: &str) -> String {
    let digest = sha256_hex(format!("{case_id}\n{title}\n{body}").as_bytes());
    format!("d-{}", &digest[..16])
}

/// Splits a draft written by `draft_document` (`# <title>\n\n<body>\n`).
fn parse_draft(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix("# ")?;
    let (title, body) = rest.split_once("\n\n")?;
    Some((title, body.strip_suffix('\n').unwrap_or(body)))
}

/// The lexical normal form of a path relative to a confining folder: `.` and empty
/// components dropped, `..` applied. Refuses what could name something outside the
/// folder or confuse a file system: absolute paths, `..` above the folder, NUL,
/// backslashes, control characters, over-long or over-deep paths.
pub fn normalize_relative(path: &str) -> Result<String, &'static str> {
    if path.is_empty() {
        return Err("the path is empty");
    }
    if path.len() > MAX_PATH_BYTES {
        return Err("the path is longer than 512 bytes");
    }
    if path.contains('\0') {
        return Err("the path contains a nul byte");
    }
    if path.contains('\\') {
        return Err("the path contains a backslash");
    }
    if path.chars().any(char::is_control) {
        return Err("the path contains a control character");
    }
    if path.starts_with('/') {
        return Err("the path is absolute");
    }
    let mut parts: Vec<&str> = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err("the path escapes the case folder with `..`");
                }
            }
            name => {
                if parts.len() >= MAX_PATH_DEPTH {
                    return Err("the path is too deep");
                }
                parts.push(name);
            }
        }
    }
    if parts.is_empty() {
        return Err("the path names the case folder itself, not a document");
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalize_lexically() {
        assert_eq!(normalize_relative("./x/../notes.md").unwrap(), "notes.md");
        assert_eq!(normalize_relative("a//b/./c").unwrap(), "a/b/c");
        assert_eq!(
            normalize_relative("privileged/../privileged/strategy.md").unwrap(),
            "privileged/strategy.md"
        );
        assert_eq!(normalize_relative("notes.md/").unwrap(), "notes.md");
    }

    #[test]
    fn unsafe_paths_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../C-1002/case.json",
            "a/../../x",
            "a\\b",
            "a\0b",
            "a\nb",
            ".",
            "x/..",
        ] {
            assert!(normalize_relative(bad).is_err(), "{bad:?}");
        }
        assert!(normalize_relative(&"a/".repeat(300)).is_err());
        assert!(normalize_relative(&"a/".repeat(40)).is_err());
    }

    #[test]
    fn drafts_round_trip() {
        let text = "# Demand letter\n\nDear Sir,\n\nPay.\n";
        assert_eq!(
            parse_draft(text),
            Some(("Demand letter", "Dear Sir,\n\nPay."))
        );
        assert!(parse_draft("no heading").is_none());
        let id = draft_id("C-1001", "t", "b");
        assert!(is_draft_id(&id), "{id}");
        assert!(!is_draft_id("d-0123456789ABCDEF"));
    }
}
