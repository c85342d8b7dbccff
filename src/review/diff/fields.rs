//! A tool's fields as a table for `policy diff`: each row names a field, how to read
//! it (the getter, which also says how two values are compared), the kind of change
//! it makes and its effect on access, and the message. `compare::tool_fields` walks
//! the table for every tool present on both sides.

use serde_json::{Value, json};

use super::compare::{Change, Effect, Kind, SchemaDiff, set_diff};
use super::schema::{self, Class};
use crate::policy::Tool;
use Effect::{Narrowing, Neutral, Widening};

/// How a field of a tool is read; the reading also says how two tools' fields are
/// compared and which side of the change (the first or the second of a row's kinds,
/// effects and messages) a difference is on.
#[derive(Clone, Copy)]
enum Getter {
    /// On or off: turned on is the first side, turned off the second.
    Switch(fn(&Tool) -> bool),
    /// A set of names: each name added (first side) or removed (second) is a change.
    Names(fn(&Tool) -> &[String]),
    /// A number: raised (first side) or lowered (second).
    Number(fn(&Tool) -> u64),
    /// A value compared whole (first side), and the words that name it in a message.
    Whole(fn(&Tool) -> Value, fn(&Value) -> &str),
    /// A JSON Schema, compared keyword by keyword (`schema::compare`; first side).
    Schema(fn(&Tool) -> &Value),
}

/// What a change of a field does to access.
#[derive(Clone, Copy)]
enum FieldEffect {
    /// The effect of each side (turned on, added or raised; turned off, removed or
    /// lowered).
    Sides(Effect, Effect),
    /// An input schema: widening when it accepts anything it refused before,
    /// narrowing when it only refuses more, neutral otherwise.
    InputSchema,
}

/// One compared field of a tool.
pub(super) struct ToolField {
    /// The field's name in the registry.
    field: &'static str,
    get: Getter,
    /// The kind of change of each side (the same twice when the field has one).
    kind: [Kind; 2],
    effect: FieldEffect,
    /// The message of each side: `{id}` is the tool, `{field}` the field, `{item}` the
    /// name added or removed (or a schema change's class), `{old}` and `{new}` the
    /// values.
    text: [&'static str; 2],
    /// Whether the change carries the old and new values.
    values: bool,
}

/// Every field `tool_fields` compares, with what a change of it means. The tool's flag
/// rules and conditions are lists compared rule by rule (`flag_rules`, `conditions`).
pub(super) const TOOL_FIELDS: [ToolField; 15] = [
    ToolField {
        field: "enabled",
        get: Getter::Switch(|t| t.enabled),
        kind: [Kind::ToolEnabled, Kind::ToolDisabled],
        effect: FieldEffect::Sides(Widening, Narrowing),
        text: ["tool `{id}` enabled", "tool `{id}` disabled"],
        values: false,
    },
    ToolField {
        field: "version",
        get: Getter::Whole(|t| json!(t.version.to_string()), as_text),
        kind: [Kind::ToolVersionChanged; 2],
        effect: FieldEffect::Sides(Neutral, Neutral),
        text: ["tool `{id}`: version {old} -> {new}"; 2],
        values: true,
    },
    ToolField {
        field: "required_scope_keys",
        get: Getter::Names(|t| &t.required_scope_keys),
        kind: [Kind::ToolScopeKeyAdded, Kind::ToolScopeKeyRemoved],
        effect: FieldEffect::Sides(Narrowing, Widening),
        text: [
            "tool `{id}` now requires scope key `{item}`",
            "tool `{id}` no longer requires scope key `{item}`",
        ],
        values: false,
    },
    ToolField {
        field: "prohibited_flags",
        get: Getter::Names(|t| &t.prohibited_flags),
        kind: [Kind::ToolProhibitionAdded, Kind::ToolProhibitionRemoved],
        effect: FieldEffect::Sides(Narrowing, Widening),
        text: [
            "tool `{id}` now prohibits flag `{item}`",
            "tool `{id}` no longer prohibits flag `{item}`",
        ],
        values: false,
    },
    ToolField {
        field: "idempotent",
        get: Getter::Switch(|t| t.idempotent),
        kind: [Kind::ToolIdempotentChanged; 2],
        effect: FieldEffect::Sides(Widening, Narrowing),
        text: [
            "tool `{id}` is now idempotent: failed calls may be retried",
            "tool `{id}` is no longer idempotent: failed calls are not retried",
        ],
        values: true,
    },
    ToolField {
        field: "determinism",
        get: Getter::Whole(|t| json!(t.determinism), as_text),
        kind: [Kind::ToolDeterminismChanged; 2],
        effect: FieldEffect::Sides(Neutral, Neutral),
        text: ["tool `{id}`: determinism {old} -> {new}"; 2],
        values: true,
    },
    ToolField {
        field: "timeout_default_ms",
        get: Getter::Number(|t| t.timeout_default_ms),
        kind: [Kind::ToolTimeoutChanged; 2],
        effect: FieldEffect::Sides(Widening, Narrowing),
        text: RAISED_LOWERED,
        values: true,
    },
    ToolField {
        field: "limits.timeout_ms_max",
        get: Getter::Number(|t| t.limits.timeout_ms_max),
        kind: [Kind::ToolTimeoutChanged; 2],
        effect: FieldEffect::Sides(Widening, Narrowing),
        text: RAISED_LOWERED,
        values: true,
    },
    ToolField {
        field: "limits.max_output_bytes",
        get: Getter::Number(|t| t.limits.max_output_bytes),
        kind: [Kind::ToolLimitChanged; 2],
        effect: FieldEffect::Sides(Widening, Narrowing),
        text: RAISED_LOWERED,
        values: true,
    },
    ToolField {
        field: "limits.max_concurrency",
        get: Getter::Number(|t| u64::from(t.limits.max_concurrency)),
        kind: [Kind::ToolLimitChanged; 2],
        effect: FieldEffect::Sides(Widening, Narrowing),
        text: RAISED_LOWERED,
        values: true,
    },
    ToolField {
        field: "write_targets",
        get: Getter::Names(|t| &t.write_targets),
        kind: [Kind::ToolWriteTargetAdded, Kind::ToolWriteTargetRemoved],
        effect: FieldEffect::Sides(Widening, Narrowing),
        text: [
            "tool `{id}` now writes to `{item}`",
            "tool `{id}` no longer writes to `{item}`",
        ],
        values: false,
    },
    ToolField {
        field: "adapter",
        // The sandbox is compared on its own (`compare::tools::sandboxes`), loosening
        // and tightening told apart.
        get: Getter::Whole(
            |t| {
                let mut adapter = json!(t.adapter);
                if let Some(o) = adapter.as_object_mut() {
                    o.remove("sandbox");
                    // Compared on its own (`compare::tools::credentials`).
                    o.remove("auth");
                }
                adapter
            },
            as_text,
        ),
        kind: [Kind::ToolAdapterChanged; 2],
        // Treated as widening: it changes what runs.
        effect: FieldEffect::Sides(Widening, Widening),
        text: ["tool `{id}`: adapter changed (treated as widening: it changes what runs)"; 2],
        values: true,
    },
    ToolField {
        field: "redaction",
        get: Getter::Whole(
            |t| json!(t.redaction),
            |v| v["mode"].as_str().unwrap_or_default(),
        ),
        kind: [Kind::ToolRedactionChanged; 2],
        effect: FieldEffect::Sides(Neutral, Neutral),
        text: ["tool `{id}`: audit redaction {old} -> {new}"; 2],
        values: true,
    },
    ToolField {
        field: "input_schema",
        get: Getter::Schema(|t| &*t.input_schema),
        kind: [Kind::InputSchemaChanged; 2],
        effect: FieldEffect::InputSchema,
        text: ["tool `{id}`: input schema changed ({item})"; 2],
        values: false,
    },
    ToolField {
        // An output schema changes what callers get, not what they may do.
        field: "output_schema",
        get: Getter::Schema(|t| &*t.output_schema),
        kind: [Kind::OutputSchemaChanged; 2],
        effect: FieldEffect::Sides(Neutral, Neutral),
        text: ["tool `{id}`: output schema changed ({item})"; 2],
        values: false,
    },
];

const RAISED_LOWERED: [&str; 2] = [
    "tool `{id}`: `{field}` raised from {old} to {new}",
    "tool `{id}`: `{field}` lowered from {old} to {new}",
];

/// A JSON string's text (empty for any other value).
fn as_text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// The words of one change of a field, filled into its message.
#[derive(Default)]
struct Words<'a> {
    item: &'a str,
    old: &'a str,
    new: &'a str,
}

/// `template` with its placeholders filled in, in one pass (a filled-in value is never
/// read as a placeholder).
fn fill(template: &str, id: &str, field: &str, words: &Words<'_>) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let value = [
            ("{id}", id),
            ("{field}", field),
            ("{item}", words.item),
            ("{old}", words.old),
            ("{new}", words.new),
        ]
        .into_iter()
        .find(|(name, _)| rest.starts_with(name));
        match value {
            Some((name, value)) => {
                out.push_str(value);
                rest = &rest[name.len()..];
            }
            None => {
                out.push('{');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

impl ToolField {
    /// The change on `side` (0 or 1), with the effect given (or the side's own).
    fn change(&self, id: &str, side: usize, effect: Option<Effect>, words: &Words<'_>) -> Change {
        let effect = match (effect, self.effect) {
            (Some(effect), _) => effect,
            (None, FieldEffect::Sides(first, second)) => [first, second][side],
            (None, FieldEffect::InputSchema) => Neutral,
        };
        let message = fill(self.text[side], id, self.field, words);
        Change::new(self.kind[side], effect, message).tool(id)
    }

    /// The changes of this field from `o` to `n`.
    pub(super) fn compare(&self, id: &str, o: &Tool, n: &Tool, out: &mut Vec<Change>) {
        match self.get {
            Getter::Switch(get) => {
                let (a, b) = (get(o), get(n));
                if a != b {
                    let change = self.change(id, usize::from(!b), None, &Words::default());
                    out.push(if self.values {
                        change.values(json!(a), json!(b))
                    } else {
                        change
                    });
                }
            }
            Getter::Names(get) => {
                let (added, removed) = set_diff(get(o), get(n));
                for (side, items) in [(0, added), (1, removed)] {
                    for item in items {
                        let words = Words {
                            item: item.as_str(),
                            ..Words::default()
                        };
                        out.push(self.change(id, side, None, &words));
                    }
                }
            }
            Getter::Number(get) => {
                let (a, b) = (get(o), get(n));
                if a != b {
                    let (old, new) = (a.to_string(), b.to_string());
                    let words = Words {
                        old: &old,
                        new: &new,
                        ..Words::default()
                    };
                    let change = self.change(id, usize::from(b < a), None, &words);
                    out.push(change.values(json!(a), json!(b)));
                }
            }
            Getter::Whole(get, name) => {
                let (a, b) = (get(o), get(n));
                if a != b {
                    let words = Words {
                        old: name(&a),
                        new: name(&b),
                        ..Words::default()
                    };
                    let change = self.change(id, 0, None, &words);
                    out.push(if self.values {
                        change.values(a, b)
                    } else {
                        change
                    });
                }
            }
            Getter::Schema(get) => {
                let changes = schema::compare(get(o), get(n));
                let Some(class) = schema::overall(&changes) else {
                    return;
                };
                let effect = match self.effect {
                    FieldEffect::InputSchema if changes.iter().any(|c| c.loosens) => Widening,
                    FieldEffect::InputSchema if class == Class::Breaking => Narrowing,
                    FieldEffect::InputSchema => Neutral,
                    FieldEffect::Sides(effect, _) => effect,
                };
                let also = if class == Class::Breaking && effect == Widening {
                    "; it also accepts arguments it refused before"
                } else {
                    ""
                };
                let item = format!("{}{also}", class.as_str());
                let words = Words {
                    item: &item,
                    ..Words::default()
                };
                let mut change = self.change(id, 0, Some(effect), &words);
                change.schema = Some(SchemaDiff { class, changes });
                out.push(change);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_once_and_unknown_braces_stay() {
        let words = Words {
            item: "{id}",
            old: "1",
            new: "2",
        };
        assert_eq!(
            fill("`{id}` {field} {item} {old}->{new} {x}", "t", "f", &words),
            "`t` f {id} 1->2 {x}"
        );
    }

    #[test]
    fn every_field_is_compared_once() {
        let mut names: Vec<&str> = TOOL_FIELDS.iter().map(|f| f.field).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TOOL_FIELDS.len());
    }
}
