//! Conditions: CEL expressions on lanes and tools (`conditions: [{name, expr, message}]`),
//! compiled once when the policy loads and evaluated at pipeline step 8.
//!
//! Bounded at both ends. At load an expression is refused when it is longer than
//! [`MAX_EXPR_BYTES`], nests brackets deeper than [`MAX_NESTING`], has more than
//! [`MAX_NODES`] nodes once its macros are expanded, nests comprehensions (`all`,
//! `exists`, `exists_one`, `map`, `filter`) deeper than [`MAX_COMPREHENSION_NESTING`],
//! names a variable other than the six it is given, or (on a tool) reads an argument the
//! tool's closed input schema does not declare. At evaluation an upper bound of its cost
//! over the call's actual values is computed first; over [`EVAL_BUDGET`] the condition is
//! not evaluated and the call is denied. An evaluation error (missing key, wrong type) is
//! a denial, never an allow.
//!
//! Pure: no I/O, no clock. The CEL implementation is the `cel` crate (cel-rust); see
//! docs/decisions.md.

use std::fmt;
use std::sync::{Arc, OnceLock};

use cel::common::ast::{EntryExpr, Expr, LiteralValue};
use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, IdedExpr, Value as CelValue};
use serde::Serialize;
use serde_json::Value;

/// The longest expression accepted, in bytes.
pub const MAX_EXPR_BYTES: usize = 4096;
/// The deepest bracket nesting accepted (checked before parsing).
pub const MAX_NESTING: usize = 24;
/// The deepest grammar recursion the parser accepts.
const MAX_PARSE_DEPTH: u16 = 32;
/// The most nodes an expression may have after its macros are expanded.
pub const MAX_NODES: usize = 512;
/// The deepest syntax tree accepted (evaluation recurses once per level).
pub const MAX_DEPTH: usize = 64;
/// The stack of the thread that parses an expression at load.
const COMPILE_STACK_BYTES: usize = 256 * 1024 * 1024;
/// How deep comprehensions may nest (a comprehension inside another's body).
pub const MAX_COMPREHENSION_NESTING: usize = 2;
/// The most cost units one condition may take on one call (see [`Condition::cost`]).
pub const EVAL_BUDGET: u64 = 1_000_000;
/// The variables a condition may read.
pub const VARIABLES: [&str; 6] = ["args", "scope", "run", "caller", "tool", "lane"];

/// One condition of a lane or a tool.
#[derive(Clone)]
pub struct Condition {
    /// An id, unique within its lane or tool.
    pub name: String,
    /// The CEL source as written.
    pub expr: String,
    /// Why a call that fails it is denied, for the caller.
    pub message: String,
    compiled: Arc<Compiled>,
}

impl fmt::Debug for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Condition")
            .field("name", &self.name)
            .field("expr", &self.expr)
            .field("message", &self.message)
            .finish()
    }
}

impl PartialEq for Condition {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.expr == other.expr && self.message == other.message
    }
}

impl Serialize for Condition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_json::json!({"name": self.name, "expr": self.expr, "message": self.message})
            .serialize(s)
    }
}

/// A parsed, checked expression.
struct Compiled {
    ast: IdedExpr,
    /// The arguments it reads (`args.a.b` as `/a/b`), with where in the expression.
    arg_refs: Vec<ArgRef>,
    /// The variables ([`VARIABLE_NAMES`]) it names: only these are handed to the
    /// evaluator (issue 19).
    roots: Vec<&'static str>,
}

/// The variables a condition sees, in the order [`Variables::new`] lists them.
const VARIABLE_NAMES: [&str; 6] = ["args", "scope", "run", "caller", "tool", "lane"];

/// The variables of [`VARIABLE_NAMES`] that `ast` names anywhere (any identifier of
/// that name, so none the evaluator may look up is left out).
fn roots(ast: &IdedExpr) -> Vec<&'static str> {
    let mut named = [false; VARIABLE_NAMES.len()];
    let mut stack = vec![ast];
    while let Some(e) = stack.pop() {
        if let Expr::Ident(name) = &e.expr
            && let Some(i) = VARIABLE_NAMES.iter().position(|v| v == name)
        {
            named[i] = true;
        }
        stack.extend(children(e));
    }
    VARIABLE_NAMES
        .iter()
        .zip(named)
        .filter_map(|(name, named)| named.then_some(*name))
        .collect()
}

/// An argument a condition reads, as a JSON pointer into the arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgRef {
    pub pointer: String,
    /// 1-based line and column inside the expression.
    pub line: usize,
    pub column: usize,
}

/// A problem found while compiling, located inside the expression (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// What a condition gave on one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    True,
    False,
    /// Not evaluated to a boolean (error, non-boolean, over budget): a denial.
    Error(String),
}

impl Outcome {
    /// The value shown by explain and traces: true, false, or null for an error.
    pub fn value(&self) -> Value {
        match self {
            Outcome::True => Value::Bool(true),
            Outcome::False => Value::Bool(false),
            Outcome::Error(_) => Value::Null,
        }
    }
}

/// The values a condition sees on one call, each converted to CEL at most once per
/// call, and only if a condition names it.
pub struct Variables {
    /// None for a variable no condition of the call names: it is never built.
    values: Vec<(&'static str, Option<Value>, OnceLock<CelValue>)>,
    /// The largest list or map anywhere in the values: what a comprehension may iterate.
    largest: u64,
}

/// The input of [`Variables::new`], as JSON. A variable that none of the call's
/// conditions names ([`Condition::names`]) may be left out (None), so that it is
/// never built (issue 19); a condition naming a left-out variable is an error.
pub struct Inputs {
    pub args: Option<Value>,
    pub scope: Option<Value>,
    pub run: Option<Value>,
    pub caller: Option<Value>,
    pub tool: Option<Value>,
    pub lane: Option<Value>,
}

impl Variables {
    pub fn new(inputs: Inputs) -> Variables {
        let json = [
            inputs.args,
            inputs.scope,
            inputs.run,
            inputs.caller,
            inputs.tool,
            inputs.lane,
        ];
        let largest = json.iter().flatten().map(largest_container).max();
        Variables {
            values: VARIABLE_NAMES
                .into_iter()
                .zip(json)
                .map(|(name, value)| (name, value, OnceLock::new()))
                .collect(),
            largest: largest.unwrap_or(0),
        }
    }
}

/// The standard CEL environment, built once.
fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(Env::stdlib()))
}

impl Condition {
    /// Compiles `expr`. `input_schema` is the tool's input schema (None for a lane: its
    /// argument references are checked against each of its tools by the caller).
    pub fn compile(
        name: &str,
        expr: &str,
        message: &str,
        input_schema: Option<&Value>,
    ) -> Result<Condition, Vec<CompileError>> {
        let compiled = compile(expr)?;
        if let Some(schema) = input_schema {
            let problems: Vec<CompileError> = compiled
                .arg_refs
                .iter()
                .filter_map(|r| {
                    super::validate::pointer_fits_schema(&r.pointer, schema)
                        .err()
                        .map(|why| CompileError {
                            line: r.line,
                            column: r.column,
                            message: format!("`args{}` {why}", dotted(&r.pointer)),
                        })
                })
                .collect();
            if !problems.is_empty() {
                return Err(problems);
            }
        }
        Ok(Condition {
            name: name.to_string(),
            expr: expr.to_string(),
            message: message.to_string(),
            compiled: Arc::new(compiled),
        })
    }

    /// The arguments this condition reads.
    pub fn arg_refs(&self) -> &[ArgRef] {
        &self.compiled.arg_refs
    }

    /// Whether the expression names the variable `root` (`args`, `scope`, `run`,
    /// `caller`, `tool` or `lane`).
    pub fn names(&self, root: &str) -> bool {
        self.compiled.roots.contains(&root)
    }

    /// An upper bound of the work evaluating this condition takes when no list or map
    /// in the variables is longer than `largest`, in node visits.
    pub fn cost(&self, largest: u64) -> u64 {
        cost(&self.compiled.ast, largest).0
    }

    /// Evaluates the condition over `vars`: true, false, or an error (a denial).
    pub fn evaluate(&self, vars: &Variables) -> Outcome {
        let cost = self.cost(vars.largest);
        if cost > EVAL_BUDGET {
            return Outcome::Error(format!(
                "evaluation budget exceeded: up to {cost} steps over these values, the budget is {EVAL_BUDGET}"
            ));
        }
        let mut context = Context::with_env(env().clone());
        for (name, json, cel) in &vars.values {
            if self.compiled.roots.contains(name) {
                let Some(json) = json else {
                    // Fail closed: a value the caller did not build is never guessed.
                    return Outcome::Error(format!("the variable `{name}` was not provided"));
                };
                let value = cel.get_or_init(|| to_cel(json)).clone();
                context.add_variable_from_value(*name, value);
            }
        }
        let ast = &self.compiled.ast;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            CelValue::resolve(ast, &context)
        }));
        match result {
            Ok(Ok(CelValue::Bool(true))) => Outcome::True,
            Ok(Ok(CelValue::Bool(false))) => Outcome::False,
            Ok(Ok(other)) => Outcome::Error(format!(
                "the expression gave {}, not a boolean",
                other.type_of()
            )),
            Ok(Err(e)) => Outcome::Error(bounded(&e.to_string())),
            Err(_) => Outcome::Error("the evaluator failed".to_string()),
        }
    }
}

/// `/a/b` as `.a.b` for messages.
fn dotted(pointer: &str) -> String {
    pointer.replace('/', ".")
}

/// At most 300 characters of an evaluator message (it may quote values).
fn bounded(s: &str) -> String {
    crate::text::cut_chars(s, 300)
}

fn compile(expr: &str) -> Result<Compiled, Vec<CompileError>> {
    let at_start = |message: String| {
        vec![CompileError {
            line: 1,
            column: 1,
            message,
        }]
    };
    if expr.trim().is_empty() {
        return Err(at_start("the expression is empty".into()));
    }
    if expr.len() > MAX_EXPR_BYTES {
        return Err(at_start(format!(
            "the expression is {} bytes long; at most {MAX_EXPR_BYTES} are accepted",
            expr.len()
        )));
    }
    if let Some((offset, depth)) = too_deep(expr) {
        let (line, column) = line_col(expr, offset);
        return Err(vec![CompileError {
            line,
            column,
            message: format!(
                "brackets nest {depth} deep here; at most {MAX_NESTING} levels are accepted"
            ),
        }]);
    }
    // The parser recurses once per member access or operator in a chain (`a.b.c...`),
    // which the bracket check does not see: it runs on a thread of its own with a stack
    // large enough for any expression of MAX_EXPR_BYTES, and whatever it builds deeper
    // than MAX_DEPTH is refused (and dropped) there, so nothing deep reaches a caller.
    let source = expr.to_string();
    let compiler = std::thread::Builder::new()
        .name("cel-compile".into())
        .stack_size(COMPILE_STACK_BYTES)
        .spawn(move || parse_and_check(&source));
    match compiler {
        Ok(handle) => handle
            .join()
            .unwrap_or_else(|_| Err(at_start("the expression could not be parsed".into()))),
        Err(e) => Err(at_start(format!(
            "the expression could not be compiled: no thread for the compiler ({e})"
        ))),
    }
}

/// The children of a node.
fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => Vec::new(),
        Expr::Select(select) => vec![&*select.operand],
        Expr::Call(call) => call
            .target
            .iter()
            .map(|t| &**t)
            .chain(call.args.iter())
            .collect(),
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => map
            .entries
            .iter()
            .flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Struct(s) => s
            .entries
            .iter()
            .flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
    }
}

/// The depth and the node count of a tree, without recursion; stops counting once
/// either is over its bound.
fn depth_and_nodes(root: &IdedExpr) -> (usize, usize) {
    let mut stack = vec![(root, 1usize)];
    let (mut deepest, mut nodes) = (0usize, 0usize);
    while let Some((e, depth)) = stack.pop() {
        nodes += 1;
        deepest = deepest.max(depth);
        if deepest > MAX_DEPTH || nodes > MAX_NODES {
            break;
        }
        stack.extend(children(e).into_iter().map(|c| (c, depth + 1)));
    }
    (deepest, nodes)
}

/// Parses and checks on the compiler thread.
fn parse_and_check(expr: &str) -> Result<Compiled, Vec<CompileError>> {
    let at_start = |message: String| {
        vec![CompileError {
            line: 1,
            column: 1,
            message,
        }]
    };
    let parser = env().parser().max_recursion_depth(MAX_PARSE_DEPTH);
    let (ast, info) = match parser.parse_with_source_info(expr) {
        Ok(parsed) => parsed,
        Err(errors) => {
            let mut out: Vec<CompileError> = errors
                .errors
                .iter()
                .take(5)
                .map(|e| CompileError {
                    line: usize::try_from(e.pos.0).unwrap_or(1).max(1),
                    column: usize::try_from(e.pos.1).unwrap_or(0).saturating_add(1),
                    message: format!(
                        "syntax error: {}",
                        bounded(e.msg.trim_start_matches("Syntax error: "))
                    ),
                })
                .collect();
            if out.is_empty() {
                out = at_start("syntax error".into());
            }
            return Err(out);
        }
    };
    let (depth, nodes) = depth_and_nodes(&ast);
    if depth > MAX_DEPTH {
        return Err(at_start(format!(
            "the expression nests more than {MAX_DEPTH} levels deep (operators, member accesses and calls count)"
        )));
    }
    if nodes > MAX_NODES {
        return Err(at_start(format!(
            "the expression has more than {MAX_NODES} nodes once its macros are expanded"
        )));
    }
    let position = |id: u64| -> (usize, usize) {
        match info.offset_for(id) {
            Some((start, _)) => line_col_chars(expr, start as usize),
            None => (1, 1),
        }
    };
    let mut walk = Walk {
        nodes: 0,
        problems: Vec::new(),
        arg_refs: Vec::new(),
        bound: Vec::new(),
        position: &position,
    };
    walk.expr(&ast, 0, 0);
    if walk.nodes > MAX_NODES {
        walk.problems.insert(
            0,
            CompileError {
                line: 1,
                column: 1,
                message: format!(
                    "the expression has {} nodes once its macros are expanded; at most {MAX_NODES} are accepted",
                    walk.nodes
                ),
            },
        );
    }
    if walk.problems.is_empty() {
        Ok(Compiled {
            roots: roots(&ast),
            ast,
            arg_refs: walk.arg_refs,
        })
    } else {
        walk.problems.truncate(10);
        Err(walk.problems)
    }
}

/// The byte offset and depth where brackets first nest deeper than [`MAX_NESTING`],
/// skipping quoted strings.
fn too_deep(expr: &str) -> Option<(usize, usize)> {
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut escaped = false;
    for (i, b) in expr.bytes().enumerate() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == q {
                quote = None;
            }
            continue;
        }
        match b {
            b'"' | b'\'' => quote = Some(b),
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some((i, depth));
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// 1-based line and column of a byte offset.
fn line_col(s: &str, offset: usize) -> (usize, usize) {
    let before = &s.as_bytes()[..offset.min(s.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |p| p + 1);
    (line, offset.min(s.len()) - line_start + 1)
}

/// 1-based line and column of a character offset (the parser counts characters).
fn line_col_chars(s: &str, chars: usize) -> (usize, usize) {
    let offset = s.char_indices().nth(chars).map_or(s.len(), |(i, _)| i);
    line_col(s, offset)
}

struct Walk<'a> {
    nodes: usize,
    problems: Vec<CompileError>,
    arg_refs: Vec<ArgRef>,
    /// Variables bound by the comprehensions around the current node.
    bound: Vec<String>,
    position: &'a dyn Fn(u64) -> (usize, usize),
}

impl Walk<'_> {
    fn problem(&mut self, id: u64, message: String) {
        let (line, column) = (self.position)(id);
        self.problems.push(CompileError {
            line,
            column,
            message,
        });
    }

    /// `args.a.b` (or `args["a"].b`) as `/a/b`, when `e` spells one.
    fn arg_pointer(&self, e: &IdedExpr) -> Option<String> {
        let mut tokens = Vec::new();
        let mut current = e;
        loop {
            match &current.expr {
                Expr::Select(select) => {
                    tokens.push(select.field.clone());
                    current = &select.operand;
                }
                Expr::Call(call)
                    if call.func_name == "_[_]"
                        && call.target.is_none()
                        && call.args.len() == 2 =>
                {
                    let Expr::Literal(LiteralValue::String(key)) = &call.args[1].expr else {
                        return None;
                    };
                    tokens.push(key.inner().to_string());
                    current = &call.args[0];
                }
                Expr::Ident(name) if name == "args" && !self.bound.iter().any(|b| b == "args") => {
                    if tokens.is_empty() {
                        return None;
                    }
                    tokens.reverse();
                    let pointer = tokens
                        .iter()
                        .map(|t| format!("/{}", crate::text::pointer_token(t)))
                        .collect();
                    return Some(pointer);
                }
                _ => return None,
            }
        }
    }

    fn expr(&mut self, e: &IdedExpr, depth: usize, comprehensions: usize) {
        self.nodes += 1;
        if self.nodes > MAX_NODES || depth > MAX_DEPTH {
            return;
        }
        if let Some(pointer) = self.arg_pointer(e) {
            let (line, column) = (self.position)(e.id);
            if !self.arg_refs.iter().any(|r| r.pointer == pointer) {
                self.arg_refs.push(ArgRef {
                    pointer,
                    line,
                    column,
                });
            }
        }
        let next = depth + 1;
        match &e.expr {
            Expr::Unspecified | Expr::Literal(_) => {}
            Expr::Ident(name) => {
                let known = VARIABLES.contains(&name.as_str()) || self.bound.contains(name);
                if !known {
                    self.problem(
                        e.id,
                        format!(
                            "unknown variable `{}`; a condition may read {}",
                            bounded(name),
                            VARIABLES.join(", ")
                        ),
                    );
                }
            }
            Expr::Select(select) => self.expr(&select.operand, next, comprehensions),
            Expr::Call(call) => {
                if let Some(target) = &call.target {
                    self.expr(target, next, comprehensions);
                }
                for arg in &call.args {
                    self.expr(arg, next, comprehensions);
                }
            }
            Expr::List(list) => {
                for element in &list.elements {
                    self.expr(element, next, comprehensions);
                }
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(m) => {
                            self.expr(&m.key, next, comprehensions);
                            self.expr(&m.value, next, comprehensions);
                        }
                        EntryExpr::StructField(f) => self.expr(&f.value, next, comprehensions),
                    }
                }
            }
            Expr::Struct(s) => {
                self.problem(
                    e.id,
                    format!(
                        "message construction `{}{{...}}` is not supported in conditions",
                        bounded(&s.type_name)
                    ),
                );
            }
            Expr::Comprehension(c) => {
                if comprehensions + 1 > MAX_COMPREHENSION_NESTING {
                    self.problem(
                        e.id,
                        format!(
                            "comprehensions (all, exists, exists_one, map, filter) nest more than {MAX_COMPREHENSION_NESTING} deep"
                        ),
                    );
                }
                // The range is evaluated outside the loop.
                self.expr(&c.iter_range, next, comprehensions);
                self.expr(&c.accu_init, next, comprehensions);
                let before = self.bound.len();
                self.bound.push(c.iter_var.clone());
                if let Some(v) = &c.iter_var2 {
                    self.bound.push(v.clone());
                }
                self.bound.push(c.accu_var.clone());
                self.expr(&c.loop_cond, next, comprehensions + 1);
                self.expr(&c.loop_step, next, comprehensions + 1);
                self.expr(&c.result, next, comprehensions + 1);
                self.bound.truncate(before);
            }
        }
    }
}

/// (cost, size): an upper bound of the node visits evaluating `e` takes, and of the
/// length of the list or map it yields, when no list or map in the variables is longer
/// than `largest`. Saturating.
fn cost(e: &IdedExpr, largest: u64) -> (u64, u64) {
    match &e.expr {
        Expr::Unspecified | Expr::Literal(_) => (1, 0),
        Expr::Ident(_) => (1, largest),
        Expr::Select(select) => {
            let (c, _) = cost(&select.operand, largest);
            (c.saturating_add(1), largest)
        }
        Expr::Call(call) => {
            let mut total = 1u64;
            let mut sizes = 0u64;
            let mut biggest = 0u64;
            for part in call.target.iter().map(|t| &**t).chain(call.args.iter()) {
                let (c, s) = cost(part, largest);
                total = total.saturating_add(c);
                sizes = sizes.saturating_add(s);
                biggest = biggest.max(s);
            }
            let size = if call.func_name == "_+_" {
                sizes
            } else {
                biggest.max(largest)
            };
            (total, size)
        }
        Expr::List(list) => {
            let mut total = 1u64;
            for element in &list.elements {
                total = total.saturating_add(cost(element, largest).0);
            }
            (total, list.elements.len() as u64)
        }
        Expr::Map(map) => {
            let mut total = 1u64;
            for entry in &map.entries {
                let c = match &entry.expr {
                    EntryExpr::MapEntry(m) => cost(&m.key, largest)
                        .0
                        .saturating_add(cost(&m.value, largest).0),
                    EntryExpr::StructField(f) => cost(&f.value, largest).0,
                };
                total = total.saturating_add(c);
            }
            (total, map.entries.len() as u64)
        }
        Expr::Struct(_) => (1, 0),
        Expr::Comprehension(c) => {
            let (range_cost, range_size) = cost(&c.iter_range, largest);
            // Inside the loop an element or the accumulator may be as large as the range.
            let inner = largest.max(range_size);
            let per_iteration = cost(&c.loop_cond, inner)
                .0
                .saturating_add(cost(&c.loop_step, inner).0);
            let total = range_cost
                .saturating_add(cost(&c.accu_init, largest).0)
                .saturating_add(range_size.saturating_mul(per_iteration))
                .saturating_add(cost(&c.result, inner).0);
            (total, inner)
        }
    }
}

/// The length of the largest list or map in `v`, at any depth.
fn largest_container(v: &Value) -> u64 {
    match v {
        Value::Array(a) => a
            .iter()
            .map(largest_container)
            .max()
            .unwrap_or(0)
            .max(a.len() as u64),
        Value::Object(m) => m
            .values()
            .map(largest_container)
            .max()
            .unwrap_or(0)
            .max(m.len() as u64),
        _ => 0,
    }
}

/// A JSON value as a CEL value: integers that fit are `int`, larger ones `uint`, others
/// `double`.
pub fn to_cel(v: &Value) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                CelValue::Int(i)
            } else if let Some(u) = n.as_u64() {
                CelValue::UInt(u)
            } else {
                CelValue::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(a) => CelValue::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => {
            let map: std::collections::HashMap<Key, CelValue> = m
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            CelValue::Map(CelMap { map: Arc::new(map) })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vars(args: Value, scope: Value) -> Variables {
        Variables::new(Inputs {
            args: Some(args),
            scope: Some(scope.clone()),
            run: Some(json!({"id": "run-1", "status": "active", "scope": scope})),
            caller: Some(json!({"role": "ops_agent", "lanes": ["remediate"]})),
            tool: Some(json!({"name": "get_logs", "version": "1.0.0"})),
            lane: Some(json!("remediate")),
        })
    }

    fn check(expr: &str) -> Condition {
        Condition::compile("c", expr, "m", None).unwrap_or_else(|e| panic!("{expr}: {e:?}"))
    }

    #[test]
    fn arguments_can_be_tied_to_the_scope() {
        let c = check("args.service == scope.service");
        let v = vars(
            json!({"service": "checkout"}),
            json!({"service": "checkout"}),
        );
        assert_eq!(c.evaluate(&v), Outcome::True);
        let v = vars(
            json!({"service": "payments"}),
            json!({"service": "checkout"}),
        );
        assert_eq!(c.evaluate(&v), Outcome::False);
    }

    #[test]
    fn every_variable_is_there() {
        let c = check(
            "run.id == 'run-1' && run.status == 'active' && caller.role == 'ops_agent' && tool.name == 'get_logs' && tool.version == '1.0.0' && lane == 'remediate' && 'remediate' in caller.lanes && run.scope.service == 'checkout'",
        );
        let v = vars(json!({}), json!({"service": "checkout"}));
        assert_eq!(c.evaluate(&v), Outcome::True);
    }

    #[test]
    fn only_the_variables_a_condition_names_are_handed_over_and_each_is_converted_once() {
        let c = check("scope.case_id == run.scope.case_id && args.items.all(x, x != lane)");
        assert_eq!(c.compiled.roots, ["args", "scope", "run", "lane"]);
        assert_eq!(
            check("caller.role == tool.name").compiled.roots,
            ["caller", "tool"]
        );
        assert!(check("1 == 1").compiled.roots.is_empty());
        let v = vars(
            json!({"items": ["a", "b"], "case_id": "C-1"}),
            json!({"case_id": "C-1", "service": "x"}),
        );
        assert_eq!(c.evaluate(&v), Outcome::True);
        // Converted on first use, and only what was named.
        let converted: Vec<&str> = v
            .values
            .iter()
            .filter(|(_, _, cel)| cel.get().is_some())
            .map(|(name, _, _)| *name)
            .collect();
        assert_eq!(converted, ["args", "scope", "run", "lane"]);
        // A second condition over the same call sees the same values.
        assert_eq!(
            check("caller.role == 'ops_agent'").evaluate(&v),
            Outcome::True
        );
        let v = vars(json!({"items": ["remediate"]}), json!({"case_id": "C-1"}));
        assert_eq!(c.evaluate(&v), Outcome::False);
    }

    #[test]
    fn a_variable_left_out_is_never_guessed() {
        // The caller builds only what some condition names; a condition naming a
        // variable that was left out fails closed instead of seeing null.
        let v = Variables::new(Inputs {
            args: Some(json!({"limit": 5})),
            scope: None,
            run: None,
            caller: None,
            tool: None,
            lane: None,
        });
        assert_eq!(check("args.limit <= 20").evaluate(&v), Outcome::True);
        assert!(check("args.limit <= 20").names("args"));
        assert!(!check("args.limit <= 20").names("run"));
        match check("has(run.scope.case_id)").evaluate(&v) {
            Outcome::Error(e) => assert!(e.contains("`run` was not provided"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn integers_compare_with_integer_literals() {
        let c = check("!has(args.limit) || args.limit <= 20");
        assert_eq!(
            c.evaluate(&vars(json!({"limit": 20}), json!({}))),
            Outcome::True
        );
        assert_eq!(
            c.evaluate(&vars(json!({"limit": 21}), json!({}))),
            Outcome::False
        );
        assert_eq!(c.evaluate(&vars(json!({}), json!({}))), Outcome::True);
    }

    #[test]
    fn errors_and_non_booleans_deny() {
        let missing = check("args.service == scope.service");
        let v = vars(json!({"service": "checkout"}), json!({}));
        assert!(matches!(missing.evaluate(&v), Outcome::Error(_)));
        let wrong_type = check("args.service > 3");
        let v = vars(json!({"service": "checkout"}), json!({}));
        assert!(matches!(wrong_type.evaluate(&v), Outcome::Error(_)));
        let not_bool = check("args.service");
        assert!(matches!(not_bool.evaluate(&v), Outcome::Error(_)));
    }

    #[test]
    fn syntax_errors_and_unknown_variables_are_located() {
        let e = Condition::compile("c", "args.service ==", "m", None).unwrap_err();
        assert!(e[0].message.starts_with("syntax error"), "{e:?}");
        let e = Condition::compile("c", "args.service == request.service", "m", None).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].message.contains("unknown variable `request`"), "{e:?}");
        assert_eq!((e[0].line, e[0].column), (1, 17), "{e:?}");
        // Comprehension variables are bound inside their macro only.
        check("scope.tags.all(t, t != 'prod')");
        let e = Condition::compile("c", "scope.tags.all(t, t != 'prod') && t == 1", "m", None)
            .unwrap_err();
        assert!(e[0].message.contains("unknown variable `t`"), "{e:?}");
    }

    #[test]
    fn arguments_must_be_declared_by_a_closed_schema() {
        let schema = json!({"type": "object", "additionalProperties": false, "properties": {"service": {"type": "string"}}});
        assert!(Condition::compile("c", "args.service == 'x'", "m", Some(&schema)).is_ok());
        let e = Condition::compile("c", "args.servce == 'x'", "m", Some(&schema)).unwrap_err();
        assert!(e[0].message.contains("`args.servce`"), "{e:?}");
        let e = Condition::compile("c", "args['other'] == 'x'", "m", Some(&schema)).unwrap_err();
        assert!(e[0].message.contains("`args.other`"), "{e:?}");
        let open = json!({"type": "object"});
        assert!(Condition::compile("c", "args.anything == 'x'", "m", Some(&open)).is_ok());
    }

    #[test]
    fn huge_and_deep_expressions_are_refused_at_load() {
        let long = format!("{}true", "true && ".repeat(MAX_EXPR_BYTES / 8 + 1));
        let e = Condition::compile("c", &long, "m", None).unwrap_err();
        assert!(e[0].message.contains("bytes long"), "{e:?}");
        let deep = format!("{}true{}", "(".repeat(1000), ")".repeat(1000));
        let e = Condition::compile("c", &deep, "m", None).unwrap_err();
        assert!(e[0].message.contains("nest"), "{e:?}");
        let ternaries = format!("{}true", "true ? true : ".repeat(200));
        assert!(Condition::compile("c", &ternaries, "m", None).is_err());
        let many = format!("{}true", "lane == 'x' || ".repeat(200));
        let e = Condition::compile("c", &many, "m", None).unwrap_err();
        assert!(e[0].message.contains("nodes"), "{e:?}");
        // Long operator chains, member chains and unary chains within the byte limit.
        for chain in [
            format!("{}1 == 1", "1 + ".repeat(1000)),
            format!("lane{} == 1", ".a".repeat(2000)),
            format!("{}true", "!".repeat(4000)),
            format!("{}1 == 1", "-".repeat(4000)),
            format!("{}true", "true && ".repeat(500)),
            format!("args{} == 1", "[0]".repeat(1300)),
        ] {
            let outcome = Condition::compile("c", &chain, "m", None);
            if let Ok(c) = outcome {
                // Whatever compiles evaluates without overflowing the stack.
                let _ = c.evaluate(&vars(json!({}), json!({})));
            }
        }
        let nested = "args.a.all(x, args.a.all(y, args.a.all(z, x == y)))";
        let e = Condition::compile("c", nested, "m", None).unwrap_err();
        assert!(e[0].message.contains("comprehensions"), "{e:?}");
    }

    #[test]
    fn the_deepest_accepted_expression_evaluates_on_a_small_stack() {
        // A member chain as deep as accepted, evaluated on a thread with the stack of a
        // runtime worker (2 MiB).
        let deepest = format!("args{} == 1", ".a".repeat(MAX_DEPTH - 2));
        let c = check(&deepest);
        let mut value = json!(1);
        for _ in 0..MAX_DEPTH - 2 {
            value = json!({ "a": value });
        }
        let handle = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || c.evaluate(&vars(value, json!({}))))
            .unwrap();
        assert_eq!(handle.join().unwrap(), Outcome::True);
        let too_deep = format!("args{} == 1", ".a".repeat(MAX_DEPTH));
        let e = Condition::compile("c", &too_deep, "m", None).unwrap_err();
        assert!(e[0].message.contains("levels deep"), "{e:?}");
    }

    #[test]
    fn loops_over_large_lists_stop_at_the_budget() {
        let c = check("args.a.all(x, args.a.exists(y, x == y))");
        let small: Vec<u64> = (0..100).collect();
        assert_eq!(
            c.evaluate(&vars(json!({"a": small}), json!({}))),
            Outcome::True
        );
        let large: Vec<u64> = (0..20_000).collect();
        let started = std::time::Instant::now();
        let outcome = c.evaluate(&vars(json!({"a": large}), json!({})));
        assert!(
            matches!(&outcome, Outcome::Error(m) if m.contains("budget")),
            "{outcome:?}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
