//! A tool's input and output JSON Schemas: resolving `{path: ...}` references inside
//! `tools/<tool_name>/schema/`, and compiling every schema once at load.
//!
//! INVARIANT: schemas never reach the network or the file system while compiling:
//! every `$ref` that is not inside the schema itself is refused, so a policy loads the
//! same way everywhere.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use serde_saphyr::Spanned;

use super::Problem;
use super::read;

/// A schema, compiled.
#[derive(Debug, Clone)]
pub(crate) struct CompiledSchema {
    pub value: Arc<Value>,
    pub validator: Arc<jsonschema::Validator>,
}

/// Where a tool's schemas live and how problems about them are reported.
pub(crate) struct SchemaContext<'a> {
    /// The directory holding `tool_registry.yaml`; schema paths resolve against it.
    pub tools_dir: &'a Path,
    /// The registry file, as displayed in problems.
    pub registry: &'a str,
    pub tool_name: &'a str,
    /// `input_schema` or `output_schema`.
    pub field: &'a str,
}

/// Refuses every external reference: schemas must be self-contained.
struct NoRetrieval;

impl jsonschema::Retrieve for NoRetrieval {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(
            format!("external reference `{uri}` is not allowed; schemas must be self-contained")
                .into(),
        )
    }
}

/// Resolves and compiles one schema; on failure pushes the problems and returns `None`.
pub(crate) fn load(
    raw: &Spanned<Value>,
    ctx: &SchemaContext<'_>,
    problems: &mut Vec<Problem>,
) -> Option<CompiledSchema> {
    let line = raw.referenced.line() as usize;
    let column = raw.referenced.column() as usize;
    let here =
        |message: String, help: &str| Problem::at(ctx.registry, line, column, message, Some(help));

    let (schema, origin) = match reference(&raw.value) {
        Reference::Path(path) => {
            if let Err(problem) = check_path(path, ctx.tool_name) {
                problems.push(here(
                    format!("{} of tool `{}`: {problem}", ctx.field, ctx.tool_name),
                    &path_help(ctx),
                ));
                return None;
            }
            let full = ctx.tools_dir.join(path);
            let root = ctx.tools_dir.join(ctx.tool_name).join("schema");
            let file = match read::read_file(&full, &root) {
                Ok(file) => file,
                Err(problem) => {
                    problems.push(here(
                        format!(
                            "{} of tool `{}`: {}",
                            ctx.field, ctx.tool_name, problem.message
                        ),
                        &path_help(ctx),
                    ));
                    return None;
                }
            };
            match read::parse_json(&file) {
                Ok(value) => (value, format!("`{}`", file.display)),
                Err(problem) => {
                    // The fix is in the schema file, so that is where we point.
                    problems.push(problem);
                    return None;
                }
            }
        }
        Reference::BadPath => {
            problems.push(here(
                format!(
                    "{} of tool `{}`: `path` must be a string",
                    ctx.field, ctx.tool_name
                ),
                &path_help(ctx),
            ));
            return None;
        }
        Reference::PathWithOthers => {
            problems.push(here(
                format!(
                    "{} of tool `{}`: a schema reference holds only `path`",
                    ctx.field, ctx.tool_name
                ),
                "write either an inline JSON Schema object or `{path: <tool>/schema/<file>.json}`",
            ));
            return None;
        }
        Reference::Inline(value) => (value.clone(), "the inline schema".to_string()),
    };

    if !schema.is_object() {
        problems.push(here(
            format!(
                "{} of tool `{}`: {origin} is not a JSON Schema object",
                ctx.field, ctx.tool_name
            ),
            "a schema is a JSON object such as `{\"type\": \"object\", \"properties\": {...}}`",
        ));
        return None;
    }
    if ctx.field == "input_schema" && schema.get("type") != Some(&Value::String("object".into())) {
        problems.push(here(
            format!(
                "input_schema of tool `{}`: {origin} must have `\"type\": \"object\"`",
                ctx.tool_name
            ),
            "tool arguments are always a JSON object; declare them under `properties`",
        ));
        return None;
    }
    match compile(&schema) {
        Ok(validator) => Some(CompiledSchema {
            value: Arc::new(schema),
            validator: Arc::new(validator),
        }),
        Err(message) => {
            problems.push(here(
                format!("{} of tool `{}`: {origin} is not a valid JSON Schema: {message}", ctx.field, ctx.tool_name),
                "fix the schema; it is checked against the JSON Schema 2020-12 meta-schema unless it names another draft in `$schema`",
            ));
            None
        }
    }
}

/// Compiles `schema` (draft 2020-12 unless `$schema` says otherwise), checking it
/// against its meta-schema and refusing external references.
pub(crate) fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    // Unknown `$schema` values would need retrieval, which is refused below; check first
    // so the message names the real cause.
    if let Some(declared) = schema.get("$schema") {
        let known = [
            "https://json-schema.org/draft/2020-12/schema",
            "https://json-schema.org/draft/2019-09/schema",
            "http://json-schema.org/draft-07/schema#",
            "http://json-schema.org/draft-07/schema",
        ];
        if !declared.as_str().is_some_and(|uri| known.contains(&uri)) {
            return Err(format!(
                "`$schema` is {declared}; use https://json-schema.org/draft/2020-12/schema"
            ));
        }
    }
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .with_retriever(NoRetrieval)
        .build(schema)
        .map_err(|err| {
            let at = err.instance_path().to_string();
            let message = one_line(&err.to_string());
            if at.is_empty() {
                message
            } else {
                format!("at `{at}`: {message}")
            }
        })
}

fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > 300 {
        format!("{}...", flat.chars().take(300).collect::<String>())
    } else {
        flat
    }
}

enum Reference<'a> {
    Path(&'a str),
    BadPath,
    PathWithOthers,
    Inline(&'a Value),
}

fn reference(value: &Value) -> Reference<'_> {
    match value
        .as_object()
        .and_then(|map| map.get("path").map(|path| (map.len(), path)))
    {
        Some((1, Value::String(path))) => Reference::Path(path),
        Some((1, _)) => Reference::BadPath,
        Some(_) => Reference::PathWithOthers,
        None => Reference::Inline(value),
    }
}

fn path_help(ctx: &SchemaContext<'_>) -> String {
    format!(
        "schema paths are relative to the registry's directory and stay under `{0}/schema/`, e.g. `{{path: {0}/schema/{1}.json}}`",
        ctx.tool_name,
        if ctx.field == "input_schema" {
            "input"
        } else {
            "output"
        }
    )
}

/// Lexical checks on a schema path: relative, plain components, under
/// `<tool_name>/schema/`, a `.json` file. (Symlinks are checked when the file is read.)
fn check_path(path: &str, tool_name: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("the schema path is empty".into());
    }
    if path.contains('\\') || path.contains('\0') {
        return Err(format!(
            "schema path `{}` holds a backslash or NUL byte",
            path.escape_debug()
        ));
    }
    let segments: Vec<&str> = path.split('/').collect();
    if path.starts_with('/') {
        return Err(format!(
            "schema path `{path}` is absolute; it must be relative to the registry's directory"
        ));
    }
    if segments
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return Err(format!(
            "schema path `{path}` holds an empty, `.` or `..` component"
        ));
    }
    if segments.len() < 3 || segments[0] != tool_name || segments[1] != "schema" {
        return Err(format!(
            "schema path `{path}` is outside `{tool_name}/schema/`"
        ));
    }
    if !path.ends_with(".json") {
        return Err(format!("schema path `{path}` must name a `.json` file"));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_paths_stay_under_the_tool_schema_dir() {
        assert!(check_path("read_document/schema/input.json", "read_document").is_ok());
        assert!(check_path("read_document/schema/v1/input.json", "read_document").is_ok());
        for bad in [
            "",
            "/etc/passwd.json",
            "read_document/schema/../../x.json",
            "read_document/./schema/input.json",
            "other_tool/schema/input.json",
            "read_document/input.json",
            "read_document/schema/",
            "read_document/schema/input.yaml",
            "read_document\\schema\\input.json",
        ] {
            assert!(check_path(bad, "read_document").is_err(), "{bad}");
        }
    }

    #[test]
    fn schemas_compile_against_the_meta_schema() {
        assert!(
            compile(&json!({"type": "object", "properties": {"a": {"type": "string"}}})).is_ok()
        );
        let err = compile(&json!({"type": "object", "properties": {"a": {"type": "strin"}}}))
            .unwrap_err();
        assert!(
            err.contains("properties/a/type") || err.contains("strin"),
            "{err}"
        );
        assert!(compile(&json!({"type": "string", "pattern": "(unclosed"})).is_err());
        assert!(compile(&json!({"minLength": -1})).is_err());
    }

    #[test]
    fn external_references_are_refused() {
        assert!(compile(&json!({"$ref": "https://example.com/schema.json"})).is_err());
        assert!(compile(&json!({"$ref": "file:///etc/passwd"})).is_err());
        assert!(compile(&json!({"$schema": "https://example.com/meta"})).is_err());
        let local = json!({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s"});
        assert!(compile(&local).unwrap().is_valid(&json!("x")));
    }

    #[test]
    fn a_reference_is_a_lone_path() {
        assert!(matches!(
            reference(&json!({"path": "a/schema/x.json"})),
            Reference::Path(_)
        ));
        assert!(matches!(reference(&json!({"path": 1})), Reference::BadPath));
        assert!(matches!(
            reference(&json!({"path": "x", "type": "object"})),
            Reference::PathWithOthers
        ));
        assert!(matches!(
            reference(&json!({"type": "object"})),
            Reference::Inline(_)
        ));
    }
}
