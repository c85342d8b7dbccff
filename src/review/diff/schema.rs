//! Compares two JSON Schemas keyword by keyword and classifies each difference as
//! breaking, compatible or annotation-only, for the version rules of `policy diff`.
//!
//! The rule behind the classes: a change is **compatible** when every document the old
//! schema accepted is still accepted (an optional property added, an enum widened, a
//! constraint loosened), and **breaking** when some document the old schema accepted is
//! now refused (a property removed, a type changed or narrowed, a property made
//! required, an enum narrowed, `additionalProperties` closed, a constraint added or
//! tightened). Annotations (`title`, `description`, `default`, ...) change no document's
//! validity. The contract applies the same rule to input and output schemas.
//!
//! Only the common keywords are understood. A difference in any other keyword (`$ref`,
//! `allOf`, `anyOf`, `oneOf`, `not`, `if`, `patternProperties`, ...) is reported as an
//! unclassified change and treated as breaking.
//!
//! Pure: no I/O. Bounded: nesting deeper than [`MAX_DEPTH`] is compared as a whole.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Map, Value};

/// How deep the comparator descends; below this a difference is unclassified.
pub const MAX_DEPTH: usize = 64;

/// How a schema change affects documents that were valid before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Only annotations changed: every document keeps its validity.
    Annotation,
    /// Every document valid before is still valid.
    Compatible,
    /// Some document valid before may now be refused.
    Breaking,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Annotation => "annotation",
            Class::Compatible => "compatible",
            Class::Breaking => "breaking",
        }
    }
}

/// One difference between two schemas.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct SchemaChange {
    /// JSON pointer into the schema where the difference is (`` for the root).
    pub pointer: String,
    pub class: Class,
    /// One line, lowercase, names in backticks.
    pub message: String,
    /// Whether the new schema may accept a document the old one refused (a loosening,
    /// or a change whose direction is unknown).
    #[serde(skip)]
    pub loosens: bool,
}

/// Every difference between `old` and `new`, sorted by pointer then message.
pub fn compare(old: &Value, new: &Value) -> Vec<SchemaChange> {
    let cx = Cx {
        plain_refs: refs_name_definitions(old) && refs_name_definitions(new),
    };
    let mut out = Vec::new();
    node(old, new, "", 0, &cx, &mut out);
    out.sort();
    out.dedup();
    out
}

/// What the whole comparison knows about the two schemas.
struct Cx {
    /// Whether every reference in both schemas names a definition by a plain pointer
    /// (`#/$defs/NAME` or `#/definitions/NAME`) and neither uses `$id`, `$anchor` or
    /// `$dynamicAnchor`: then a definition added or removed is one no `$ref` resolves
    /// to, and changes no document's validity.
    plain_refs: bool,
}

/// Keywords that let a `$ref` resolve to a schema by something other than the name of
/// its definition (or move the base it resolves against).
const REF_TARGETS: [&str; 6] = [
    "$id",
    "$anchor",
    "$dynamicAnchor",
    "$dynamicRef",
    "$recursiveRef",
    "$recursiveAnchor",
];

/// Whether `schema` uses no keyword of [`REF_TARGETS`] and each `$ref` is a plain
/// pointer to one definition. Conservative: any key with such a name counts, wherever
/// it is, and a schema nested deeper than [`MAX_DEPTH`] does not qualify.
fn refs_name_definitions(schema: &Value) -> bool {
    let plain = |r: &str| {
        ["#/$defs/", "#/definitions/"].iter().any(|prefix| {
            r.strip_prefix(prefix)
                .is_some_and(|name| !name.is_empty() && !name.contains('/'))
        })
    };
    let mut stack = vec![(schema, 0usize)];
    while let Some((value, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return false;
        }
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    if REF_TARGETS.contains(&key.as_str()) {
                        return false;
                    }
                    if key == "$ref" && !v.as_str().is_some_and(plain) {
                        return false;
                    }
                    stack.push((v, depth + 1));
                }
            }
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
    true
}

/// The most severe class among `changes` (None when there are none).
pub fn overall(changes: &[SchemaChange]) -> Option<Class> {
    changes.iter().map(|c| c.class).max()
}

fn push(out: &mut Vec<SchemaChange>, pointer: &str, class: Class, loosens: bool, message: String) {
    out.push(SchemaChange {
        pointer: pointer.to_string(),
        class,
        message,
        loosens,
    });
}

fn unclassified(out: &mut Vec<SchemaChange>, pointer: &str, what: &str) {
    push(
        out,
        pointer,
        Class::Breaking,
        true,
        format!("{what}: unclassified change -> treated as breaking"),
    );
}

/// Escapes one reference token of a JSON pointer (RFC 6901).
fn token(name: &str) -> String {
    crate::text::pointer_token(name)
}

fn child(pointer: &str, parts: &[&str]) -> String {
    let mut p = pointer.to_string();
    for part in parts {
        p.push('/');
        p.push_str(&token(part));
    }
    p
}

/// `true`, `{}` and an absent subschema all accept everything.
fn accepts_all(v: &Value) -> bool {
    matches!(v, Value::Bool(true)) || matches!(v, Value::Object(m) if m.is_empty())
}

fn node(old: &Value, new: &Value, ptr: &str, depth: usize, cx: &Cx, out: &mut Vec<SchemaChange>) {
    if old == new || (accepts_all(old) && accepts_all(new)) {
        return;
    }
    if depth >= MAX_DEPTH {
        unclassified(out, ptr, "schema nested too deeply to compare");
        return;
    }
    match (old, new) {
        (Value::Bool(false), _) => push(
            out,
            ptr,
            Class::Compatible,
            true,
            "accepts documents where it accepted none".into(),
        ),
        (_, Value::Bool(false)) => push(
            out,
            ptr,
            Class::Breaking,
            false,
            "now refuses every document".into(),
        ),
        (o, Value::Bool(true)) if o.is_object() => push(
            out,
            ptr,
            Class::Compatible,
            true,
            "no longer constrains documents".into(),
        ),
        (Value::Bool(true), Value::Object(n)) => keywords(&Map::new(), n, ptr, depth, cx, out),
        (Value::Object(o), Value::Object(n)) => keywords(o, n, ptr, depth, cx, out),
        _ => unclassified(out, ptr, "not a schema object"),
    }
}

const ANNOTATIONS: [&str; 10] = [
    "title",
    "description",
    "default",
    "examples",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentMediaType",
    "contentEncoding",
];

/// Lower bounds: raising one (or adding one) refuses documents.
const LOWER_BOUNDS: [&str; 6] = [
    "minLength",
    "minItems",
    "minProperties",
    "minimum",
    "exclusiveMinimum",
    "minContains",
];

/// Upper bounds: lowering one (or adding one) refuses documents.
const UPPER_BOUNDS: [&str; 6] = [
    "maxLength",
    "maxItems",
    "maxProperties",
    "maximum",
    "exclusiveMaximum",
    "maxContains",
];

fn keywords(
    o: &Map<String, Value>,
    n: &Map<String, Value>,
    ptr: &str,
    depth: usize,
    cx: &Cx,
    out: &mut Vec<SchemaChange>,
) {
    let keys: BTreeSet<&String> = o.keys().chain(n.keys()).collect();
    for key in keys {
        let (ov, nv) = (o.get(key), n.get(key));
        if ov == nv {
            continue;
        }
        let at = child(ptr, &[key]);
        let k = key.as_str();
        match k {
            _ if ANNOTATIONS.contains(&k) => push(
                out,
                &at,
                Class::Annotation,
                false,
                format!("`{k}` {}", verb(ov, nv)),
            ),
            "type" => type_change(ov, nv, &at, out),
            "properties" => properties(o, n, ptr, depth, cx, out),
            "required" => required(o, n, &at, out),
            "additionalProperties" => additional(ov, nv, &at, depth, cx, out),
            "items" => match (ov, nv) {
                (Some(Value::Array(_)), _) | (_, Some(Value::Array(_))) => {
                    unclassified(out, &at, "`items` as an array")
                }
                _ => node(
                    ov.unwrap_or(&Value::Bool(true)),
                    nv.unwrap_or(&Value::Bool(true)),
                    &at,
                    depth + 1,
                    cx,
                    out,
                ),
            },
            "enum" => enum_change(ov, nv, &at, out),
            "const" => match (ov, nv) {
                (_, None) => push(out, &at, Class::Compatible, true, "`const` removed".into()),
                (None, Some(v)) => push(
                    out,
                    &at,
                    Class::Breaking,
                    false,
                    format!("`const` added: only {v} is accepted"),
                ),
                (Some(a), Some(b)) => push(
                    out,
                    &at,
                    Class::Breaking,
                    true,
                    format!("`const` changed from {a} to {b}"),
                ),
            },
            _ if LOWER_BOUNDS.contains(&k) => bound(k, ov, nv, true, &at, out),
            _ if UPPER_BOUNDS.contains(&k) => bound(k, ov, nv, false, &at, out),
            "pattern" | "format" | "multipleOf" => match (ov, nv) {
                (_, None) => push(
                    out,
                    &at,
                    Class::Compatible,
                    true,
                    format!("`{k}` removed (loosened)"),
                ),
                (None, Some(v)) => push(
                    out,
                    &at,
                    Class::Breaking,
                    false,
                    format!("`{k}` added ({v}) (tightened)"),
                ),
                (Some(a), Some(b)) => push(
                    out,
                    &at,
                    Class::Breaking,
                    true,
                    format!("`{k}` changed from {a} to {b} (treated as breaking)"),
                ),
            },
            "uniqueItems" => {
                let before = ov == Some(&Value::Bool(true));
                let after = nv == Some(&Value::Bool(true));
                match (before, after) {
                    (false, true) => push(
                        out,
                        &at,
                        Class::Breaking,
                        false,
                        "`uniqueItems` now required".into(),
                    ),
                    (true, false) => push(
                        out,
                        &at,
                        Class::Compatible,
                        true,
                        "`uniqueItems` no longer required".into(),
                    ),
                    _ => {}
                }
            }
            "$defs" | "definitions" => definitions(ov, nv, &at, depth, cx, out),
            _ => unclassified(out, &at, &format!("`{k}` {}", verb(ov, nv))),
        }
    }
}

fn verb(ov: Option<&Value>, nv: Option<&Value>) -> &'static str {
    match (ov, nv) {
        (None, _) => "added",
        (_, None) => "removed",
        _ => "changed",
    }
}

/// The set of types a `type` keyword allows; None when absent (any type).
fn types(v: Option<&Value>) -> Result<Option<BTreeSet<String>>, ()> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(BTreeSet::from([s.clone()]))),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string).ok_or(()))
            .collect::<Result<BTreeSet<_>, _>>()
            .map(Some),
        Some(_) => Err(()),
    }
}

/// Whether every value of `inner` types is allowed by `outer` (integer is a number).
fn subset(inner: &BTreeSet<String>, outer: &BTreeSet<String>) -> bool {
    inner
        .iter()
        .all(|t| outer.contains(t) || (t == "integer" && outer.contains("number")))
}

fn list(set: &BTreeSet<String>) -> String {
    set.iter().cloned().collect::<Vec<_>>().join(" | ")
}

fn type_change(ov: Option<&Value>, nv: Option<&Value>, at: &str, out: &mut Vec<SchemaChange>) {
    let (Ok(old), Ok(new)) = (types(ov), types(nv)) else {
        unclassified(out, at, "`type` is not a string or a list of strings");
        return;
    };
    match (old, new) {
        (None, None) => {}
        (Some(_), None) => push(
            out,
            at,
            Class::Compatible,
            true,
            "`type` constraint removed".into(),
        ),
        (None, Some(new)) => push(
            out,
            at,
            Class::Breaking,
            false,
            format!("`type` restricted to {}", list(&new)),
        ),
        (Some(old), Some(new)) => {
            if subset(&old, &new) && subset(&new, &old) {
                return;
            }
            let (from, to) = (list(&old), list(&new));
            if subset(&old, &new) {
                push(
                    out,
                    at,
                    Class::Compatible,
                    true,
                    format!("type widened from {from} to {to}"),
                );
            } else if subset(&new, &old) {
                push(
                    out,
                    at,
                    Class::Breaking,
                    false,
                    format!("type narrowed from {from} to {to}"),
                );
            } else {
                push(
                    out,
                    at,
                    Class::Breaking,
                    true,
                    format!("type changed from {from} to {to}"),
                );
            }
        }
    }
}

fn required_set(m: &Map<String, Value>) -> Option<BTreeSet<String>> {
    match m.get("required") {
        None => Some(BTreeSet::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect(),
        Some(_) => None,
    }
}

/// Whether an object level refuses every property its `properties` do not name:
/// `additionalProperties: false` and no `patternProperties`.
fn refuses_unknown(m: &Map<String, Value>) -> bool {
    m.get("additionalProperties") == Some(&Value::Bool(false))
        && !m.contains_key("patternProperties")
}

fn props(m: &Map<String, Value>) -> Option<&Map<String, Value>> {
    m.get("properties").and_then(Value::as_object)
}

fn properties(
    o: &Map<String, Value>,
    n: &Map<String, Value>,
    ptr: &str,
    depth: usize,
    cx: &Cx,
    out: &mut Vec<SchemaChange>,
) {
    let empty = Map::new();
    let (op, np) = match (o.get("properties"), n.get("properties")) {
        (Some(a), _) if !a.is_object() => {
            return unclassified(
                out,
                &child(ptr, &["properties"]),
                "`properties` is not an object",
            );
        }
        (_, Some(b)) if !b.is_object() => {
            return unclassified(
                out,
                &child(ptr, &["properties"]),
                "`properties` is not an object",
            );
        }
        _ => (props(o).unwrap_or(&empty), props(n).unwrap_or(&empty)),
    };
    let new_required = required_set(n).unwrap_or_default();
    let names: BTreeSet<&String> = op.keys().chain(np.keys()).collect();
    for name in names {
        let at = child(ptr, &["properties", name]);
        match (op.get(name), np.get(name)) {
            // Breaking (a document holding it may be refused), and loosening unless
            // the level refuses unknown properties: the name may now hold any value.
            (Some(_), None) => push(
                out,
                &at,
                Class::Breaking,
                !refuses_unknown(n),
                format!("property `{name}` removed"),
            ),
            (None, Some(_)) if new_required.contains(name) => push(
                out,
                &at,
                Class::Breaking,
                false,
                format!("required property `{name}` added"),
            ),
            (None, Some(_)) => push(
                out,
                &at,
                Class::Compatible,
                true,
                format!("optional property `{name}` added"),
            ),
            (Some(a), Some(b)) => node(a, b, &at, depth + 1, cx, out),
            (None, None) => {}
        }
    }
}

fn required(o: &Map<String, Value>, n: &Map<String, Value>, at: &str, out: &mut Vec<SchemaChange>) {
    let (Some(old), Some(new)) = (required_set(o), required_set(n)) else {
        unclassified(out, at, "`required` is not a list of strings");
        return;
    };
    let empty = Map::new();
    let (op, np) = (props(o).unwrap_or(&empty), props(n).unwrap_or(&empty));
    for name in new.difference(&old) {
        // A property that is new and required is reported once, under `properties`.
        if np.contains_key(name) && !op.contains_key(name) {
            continue;
        }
        push(
            out,
            at,
            Class::Breaking,
            false,
            format!("property `{name}` made required"),
        );
    }
    for name in old.difference(&new) {
        // A removed property is reported once, under `properties`.
        if op.contains_key(name) && !np.contains_key(name) {
            continue;
        }
        push(
            out,
            at,
            Class::Compatible,
            true,
            format!("property `{name}` no longer required"),
        );
    }
}

fn additional(
    ov: Option<&Value>,
    nv: Option<&Value>,
    at: &str,
    depth: usize,
    cx: &Cx,
    out: &mut Vec<SchemaChange>,
) {
    let open = Value::Bool(true);
    let (old, new) = (ov.unwrap_or(&open), nv.unwrap_or(&open));
    match (old, new) {
        (o, Value::Bool(false)) if o != &Value::Bool(false) => push(
            out,
            at,
            Class::Breaking,
            false,
            "`additionalProperties` closed: unknown properties are now refused".into(),
        ),
        (Value::Bool(false), n) if accepts_all(n) => push(
            out,
            at,
            Class::Compatible,
            true,
            "`additionalProperties` opened: unknown properties are now accepted".into(),
        ),
        (o, n) => node(o, n, at, depth + 1, cx, out),
    }
}

fn enum_change(ov: Option<&Value>, nv: Option<&Value>, at: &str, out: &mut Vec<SchemaChange>) {
    let set = |v: Option<&Value>| -> Result<Option<BTreeSet<String>>, ()> {
        match v {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items.iter().map(Value::to_string).collect())),
            Some(_) => Err(()),
        }
    };
    let (Ok(old), Ok(new)) = (set(ov), set(nv)) else {
        unclassified(out, at, "`enum` is not a list");
        return;
    };
    let join = |s: Vec<&String>| s.into_iter().cloned().collect::<Vec<_>>().join(", ");
    match (old, new) {
        (None, None) => {}
        (Some(_), None) => push(out, at, Class::Compatible, true, "`enum` removed".into()),
        (None, Some(new)) => push(
            out,
            at,
            Class::Breaking,
            false,
            format!("`enum` added: only {} accepted", join(new.iter().collect())),
        ),
        (Some(old), Some(new)) => {
            let removed: Vec<&String> = old.difference(&new).collect();
            let added: Vec<&String> = new.difference(&old).collect();
            match (removed.is_empty(), added.is_empty()) {
                (true, true) => {}
                (true, false) => push(
                    out,
                    at,
                    Class::Compatible,
                    true,
                    format!("enum widened: adds {}", join(added)),
                ),
                (false, true) => push(
                    out,
                    at,
                    Class::Breaking,
                    false,
                    format!("enum narrowed: removes {}", join(removed)),
                ),
                (false, false) => push(
                    out,
                    at,
                    Class::Breaking,
                    true,
                    format!(
                        "enum changed: removes {}; adds {}",
                        join(removed),
                        join(added)
                    ),
                ),
            }
        }
    }
}

fn bound(
    k: &str,
    ov: Option<&Value>,
    nv: Option<&Value>,
    lower: bool,
    at: &str,
    out: &mut Vec<SchemaChange>,
) {
    match (ov, nv) {
        (None, None) => {}
        (Some(_), None) => push(
            out,
            at,
            Class::Compatible,
            true,
            format!("`{k}` removed (loosened)"),
        ),
        (None, Some(v)) => push(
            out,
            at,
            Class::Breaking,
            false,
            format!("`{k}` added ({v}) (tightened)"),
        ),
        (Some(a), Some(b)) => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => {
                let tightened = if lower { y > x } else { y < x };
                if tightened {
                    push(
                        out,
                        at,
                        Class::Breaking,
                        false,
                        format!("`{k}` tightened from {a} to {b}"),
                    );
                } else if x != y {
                    push(
                        out,
                        at,
                        Class::Compatible,
                        true,
                        format!("`{k}` loosened from {a} to {b}"),
                    );
                }
            }
            _ => unclassified(out, at, &format!("`{k}` is not a number")),
        },
    }
}

fn definitions(
    ov: Option<&Value>,
    nv: Option<&Value>,
    at: &str,
    depth: usize,
    cx: &Cx,
    out: &mut Vec<SchemaChange>,
) {
    let empty = Map::new();
    let (Some(old), Some(new)) = (
        ov.map_or(Some(&empty), Value::as_object),
        nv.map_or(Some(&empty), Value::as_object),
    ) else {
        unclassified(out, at, "definitions are not an object");
        return;
    };
    let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for name in names {
        let here = child(at, &[name]);
        match (old.get(name), new.get(name)) {
            // With `$anchor`, `$id` or a `$ref` that is not a plain pointer to a
            // definition, what a `$ref` resolves to may change when a definition is
            // added, removed or renamed.
            (None, Some(_)) | (Some(_), None) if !cx.plain_refs => unclassified(
                out,
                &here,
                &format!(
                    "definition `{name}` {} (the schema resolves `$ref` by more than definition names)",
                    verb(old.get(name), new.get(name))
                ),
            ),
            // Nothing referenced a definition before it existed, and nothing references
            // one that is gone (the schema compiled): a change of `$ref` shows itself.
            (None, Some(_)) => push(
                out,
                &here,
                Class::Annotation,
                false,
                format!("definition `{name}` added"),
            ),
            (Some(_), None) => push(
                out,
                &here,
                Class::Annotation,
                false,
                format!("definition `{name}` removed"),
            ),
            (Some(a), Some(b)) => node(a, b, &here, depth + 1, cx, out),
            (None, None) => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    type Edit = Box<dyn Fn(&mut Value)>;

    fn base() -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["query"],
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 200},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                "mode": {"enum": ["fast", "full"]}
            }
        })
    }

    /// Applies `edit` to a copy of the base schema and compares.
    fn check(edit: impl FnOnce(&mut Value)) -> Vec<SchemaChange> {
        let mut new = base();
        edit(&mut new);
        compare(&base(), &new)
    }

    fn only(changes: &[SchemaChange]) -> (&str, Class, &str) {
        assert_eq!(changes.len(), 1, "{changes:#?}");
        let c = &changes[0];
        (c.pointer.as_str(), c.class, c.message.as_str())
    }

    #[test]
    fn identical_schemas_have_no_changes() {
        assert!(compare(&base(), &base()).is_empty());
        assert!(compare(&json!({}), &json!(true)).is_empty());
    }

    #[test]
    fn breaking_changes() {
        let cases: Vec<(Edit, &str, &str)> = vec![
            (
                Box::new(|s| {
                    s["properties"].as_object_mut().unwrap().remove("limit");
                }),
                "/properties/limit",
                "property `limit` removed",
            ),
            (
                Box::new(|s| s["properties"]["limit"]["type"] = json!("string")),
                "/properties/limit/type",
                "type changed from integer to string",
            ),
            (
                Box::new(|s| s["required"] = json!(["query", "limit"])),
                "/required",
                "property `limit` made required",
            ),
            (
                Box::new(|s| {
                    s["properties"]["page"] = json!({"type": "integer"});
                    s["required"] = json!(["query", "page"]);
                }),
                "/properties/page",
                "required property `page` added",
            ),
            (
                Box::new(|s| s["properties"]["mode"]["enum"] = json!(["fast"])),
                "/properties/mode/enum",
                "enum narrowed: removes \"full\"",
            ),
            (
                Box::new(|s| s["properties"]["query"]["maxLength"] = json!(100)),
                "/properties/query/maxLength",
                "`maxLength` tightened from 200 to 100",
            ),
            (
                Box::new(|s| s["properties"]["limit"]["minimum"] = json!(5)),
                "/properties/limit/minimum",
                "`minimum` tightened from 1 to 5",
            ),
            (
                Box::new(|s| s["properties"]["query"]["pattern"] = json!("^[a-z]+$")),
                "/properties/query/pattern",
                "`pattern` added (\"^[a-z]+$\") (tightened)",
            ),
            (
                Box::new(|s| s["properties"]["mode"]["type"] = json!("string")),
                "/properties/mode/type",
                "`type` restricted to string",
            ),
        ];
        for (i, (edit, pointer, message)) in cases.into_iter().enumerate() {
            let changes = check(edit);
            assert_eq!(
                only(&changes),
                (pointer, Class::Breaking, message),
                "case {i}"
            );
        }
    }

    #[test]
    fn compatible_changes() {
        let changes = check(|s| s["properties"]["page"] = json!({"type": "integer"}));
        assert_eq!(
            only(&changes),
            (
                "/properties/page",
                Class::Compatible,
                "optional property `page` added"
            )
        );
        let changes = check(|s| s["properties"]["mode"]["enum"] = json!(["fast", "full", "deep"]));
        assert_eq!(
            only(&changes),
            (
                "/properties/mode/enum",
                Class::Compatible,
                "enum widened: adds \"deep\""
            )
        );
        let changes = check(|s| s["properties"]["limit"]["maximum"] = json!(100));
        assert_eq!(
            only(&changes),
            (
                "/properties/limit/maximum",
                Class::Compatible,
                "`maximum` loosened from 50 to 100"
            )
        );
        let changes = check(|s| s["required"] = json!([]));
        assert_eq!(
            only(&changes),
            (
                "/required",
                Class::Compatible,
                "property `query` no longer required"
            )
        );
        let changes = check(|s| s["properties"]["limit"]["type"] = json!("number"));
        assert_eq!(
            only(&changes),
            (
                "/properties/limit/type",
                Class::Compatible,
                "type widened from integer to number"
            )
        );
        let changes = check(|s| {
            s.as_object_mut().unwrap().remove("additionalProperties");
        });
        assert_eq!(only(&changes).1, Class::Compatible);
        let changes = check(|s| {
            s["properties"]["query"]
                .as_object_mut()
                .unwrap()
                .remove("minLength");
        });
        assert_eq!(
            only(&changes),
            (
                "/properties/query/minLength",
                Class::Compatible,
                "`minLength` removed (loosened)"
            )
        );
    }

    #[test]
    fn closing_additional_properties_is_breaking() {
        let old = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let mut new = old.clone();
        new["additionalProperties"] = json!(false);
        assert_eq!(
            only(&compare(&old, &new)),
            (
                "/additionalProperties",
                Class::Breaking,
                "`additionalProperties` closed: unknown properties are now refused"
            )
        );
    }

    #[test]
    fn annotations_change_no_validity() {
        let changes = check(|s| {
            s["properties"]["query"]["description"] = json!("what to look for");
            s["title"] = json!("search");
        });
        assert_eq!(changes.len(), 2);
        assert!(changes.iter().all(|c| c.class == Class::Annotation));
        assert_eq!(overall(&changes), Some(Class::Annotation));
    }

    #[test]
    fn unknown_keywords_are_unclassified_and_breaking() {
        let changes = check(|s| s["properties"]["query"]["anyOf"] = json!([{"minLength": 2}]));
        let (pointer, class, message) = only(&changes);
        assert_eq!(pointer, "/properties/query/anyOf");
        assert_eq!(class, Class::Breaking);
        assert!(
            message.contains("unclassified change -> treated as breaking"),
            "{message}"
        );
        assert!(changes[0].loosens);
    }

    #[test]
    fn nested_items_and_pointer_escaping() {
        let old = json!({"type": "object", "properties": {"a/b": {"type": "array", "items": {"type": "string"}}}});
        let mut new = old.clone();
        new["properties"]["a/b"]["items"]["type"] = json!(["string", "null"]);
        assert_eq!(
            only(&compare(&old, &new)),
            (
                "/properties/a~1b/items/type",
                Class::Compatible,
                "type widened from string to null | string"
            )
        );
    }

    #[test]
    fn the_most_severe_class_wins_and_changes_are_sorted() {
        let changes = check(|s| {
            s["properties"]["page"] = json!({"type": "integer"});
            s["properties"]["query"]["maxLength"] = json!(10);
            s["description"] = json!("x");
        });
        assert_eq!(overall(&changes), Some(Class::Breaking));
        let pointers: Vec<&str> = changes.iter().map(|c| c.pointer.as_str()).collect();
        let mut sorted = pointers.clone();
        sorted.sort();
        assert_eq!(pointers, sorted);
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let mut old = json!({"type": "string"});
        let mut new = json!({"type": "integer"});
        for _ in 0..200 {
            old = json!({"type": "array", "items": old});
            new = json!({"type": "array", "items": new});
        }
        let changes = compare(&old, &new);
        let (_, class, message) = only(&changes);
        assert_eq!(class, Class::Breaking);
        assert!(message.contains("too deeply"), "{message}");
    }

    /// The law behind the classes, checked with the real validator: for a compatible
    /// change every sample the old schema accepts is still accepted; for a breaking one
    /// some sample it accepted is refused.
    #[test]
    fn classes_agree_with_the_validator() {
        let samples = [
            json!({"query": "a"}),
            json!({"query": "abc", "limit": 50}),
            json!({"query": "abc", "limit": 1, "mode": "full"}),
            json!({"query": "x".repeat(150)}),
            json!({"query": "abc", "mode": "fast"}),
        ];
        let edits: Vec<Edit> = vec![
            Box::new(|s| s["properties"]["mode"]["enum"] = json!(["fast"])),
            Box::new(|s| s["properties"]["mode"]["enum"] = json!(["fast", "full", "x"])),
            Box::new(|s| s["properties"]["limit"]["maximum"] = json!(10)),
            Box::new(|s| s["properties"]["limit"]["maximum"] = json!(100)),
            Box::new(|s| s["required"] = json!(["query", "limit"])),
            Box::new(|s| s["required"] = json!([])),
            Box::new(|s| s["properties"]["query"]["maxLength"] = json!(100)),
            Box::new(|s| {
                s["properties"].as_object_mut().unwrap().remove("mode");
            }),
            Box::new(|s| s["properties"]["extra"] = json!({"type": "string"})),
        ];
        let old = jsonschema::validator_for(&base()).unwrap();
        for (i, edit) in edits.iter().enumerate() {
            let mut schema = base();
            edit(&mut schema);
            let new = jsonschema::validator_for(&schema).unwrap();
            let class = overall(&compare(&base(), &schema)).unwrap();
            let refused_now = samples.iter().any(|s| old.is_valid(s) && !new.is_valid(s));
            assert_eq!(refused_now, class == Class::Breaking, "edit {i}: {class:?}");
        }
    }

    /// A definition renamed in a schema whose `$ref`s are not plain `#/$defs/NAME`
    /// pointers may change what a `$ref` resolves to: never an annotation.
    #[test]
    fn definitions_are_unclassified_when_refs_do_not_name_them() {
        let schema = |defs: Value, limit_ref: &str| {
            json!({
                "type": "object",
                "properties": {"limit": {"$ref": limit_ref}},
                "$defs": defs
            })
        };
        let cases: Vec<(Value, Value, &str)> = vec![
            (
                json!({"A": {"$anchor": "lim", "maximum": 50}}),
                json!({"B": {"$anchor": "lim"}}),
                "#lim",
            ),
            (
                json!({"A": {"$dynamicAnchor": "lim", "maximum": 50}}),
                json!({"B": {"$dynamicAnchor": "lim"}}),
                "#lim",
            ),
            (
                json!({"A": {"$id": "urn:lim", "maximum": 50}}),
                json!({"B": {"$id": "urn:lim"}}),
                "urn:lim",
            ),
            (
                json!({"A": {"maximum": 50}, "C": {"maximum": 5}}),
                json!({"B": {"maximum": 50}, "C": {"maximum": 5}}),
                "#/$defs/C/properties/x",
            ),
        ];
        for (i, (old_defs, new_defs, r)) in cases.into_iter().enumerate() {
            let changes = compare(&schema(old_defs, r), &schema(new_defs, r));
            assert_eq!(
                overall(&changes),
                Some(Class::Breaking),
                "case {i}: {changes:#?}"
            );
            assert!(changes.iter().all(|c| c.loosens), "case {i}: {changes:#?}");
            assert!(
                changes
                    .iter()
                    .all(|c| c.message.contains("unclassified change")),
                "case {i}: {changes:#?}"
            );
        }
        // Plain pointers name their definition: an unreferenced one is an annotation.
        let changes = compare(
            &schema(json!({"A": {"maximum": 50}, "C": {}}), "#/$defs/C"),
            &schema(json!({"B": {"maximum": 50}, "C": {}}), "#/$defs/C"),
        );
        assert_eq!(overall(&changes), Some(Class::Annotation), "{changes:#?}");
    }

    /// A property removed from an object that accepts unknown properties may now hold
    /// any value: the change loosens (widening for an input schema).
    #[test]
    fn a_removed_property_loosens_unless_unknown_properties_are_refused() {
        let cases: Vec<(Value, bool)> = vec![
            (json!({}), true),
            (json!({"additionalProperties": true}), true),
            (json!({"additionalProperties": {"type": "string"}}), true),
            (
                json!({"additionalProperties": false, "patternProperties": {"^l": {}}}),
                true,
            ),
            (json!({"additionalProperties": false}), false),
        ];
        for (i, (level, loosens)) in cases.into_iter().enumerate() {
            let mut old = level.clone();
            old["properties"] = json!({"q": {"type": "string"}, "limit": {"maximum": 50}});
            let mut new = level;
            new["properties"] = json!({"q": {"type": "string"}});
            let changes = compare(&old, &new);
            let (pointer, class, message) = only(&changes);
            assert_eq!(
                (pointer, class, message),
                (
                    "/properties/limit",
                    Class::Breaking,
                    "property `limit` removed"
                ),
                "case {i}"
            );
            assert_eq!(changes[0].loosens, loosens, "case {i}");
        }
    }
}
