//! Policy test cases (`policy/tests/*.yaml`): requests and the decisions they must get,
//! run offline by `toolgate policy test`.
//!
//! ```yaml
//! tests:
//!   - name: research may not read privileged documents
//!     request: {role: research_agent, lane: research, tool: read_document,
//!               scope: {case_id: C-1001}, arguments: {path: privileged/strategy.md}}
//!     expect: {decision: deny, reason: prohibited_flag}
//! ```

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::read::{parse_yaml, read_file};
use super::{Problem, RunStatus};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CasesFile {
    tests: Vec<PolicyCase>,
}

/// One test case.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyCase {
    pub name: String,
    pub request: CaseRequest,
    #[serde(default)]
    pub run: CaseRun,
    pub expect: CaseExpect,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRequest {
    pub role: String,
    pub lane: String,
    pub tool: String,
    #[serde(default)]
    pub scope: Map<String, Value>,
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// The run the request belongs to. By default an active run bound to the request's
/// string scope values and pinned to the policy under test.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRun {
    #[serde(default)]
    pub status: Option<RunStatus>,
    /// The scope the run is bound to (default: the request's string scope values).
    #[serde(default)]
    pub scope: Option<Map<String, Value>>,
    /// No such run exists.
    #[serde(default)]
    pub missing: bool,
    /// The run was created under other policy versions.
    #[serde(default)]
    pub other_policy: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectedDecision {
    Allow,
    Deny,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseExpect {
    pub decision: ExpectedDecision,
    /// The reason of the denial (required to be right when given).
    #[serde(default)]
    pub reason: Option<String>,
    /// The failed step of the denial.
    #[serde(default)]
    pub step: Option<u8>,
    /// For `reason: condition_failed`: the name of the condition that denied.
    #[serde(default)]
    pub condition: Option<String>,
    /// For an allow: whether the call needs human approval first (`approval:`).
    #[serde(default)]
    pub approval: Option<bool>,
}

/// Reads every `*.yaml` file in `dir`, in name order. Returns (file name, case) pairs, or
/// every problem found.
pub fn load_cases(dir: &Path) -> Result<Vec<(String, PolicyCase)>, Vec<Problem>> {
    let problem = |file: String, message: String| Problem {
        file,
        line: None,
        column: None,
        message,
        help: None,
    };
    let entries = std::fs::read_dir(dir).map_err(|e| {
        vec![problem(
            dir.display().to_string(),
            format!("cannot read the test directory: {e}"),
        )]
    })?;
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    let mut problems = Vec::new();
    for path in files {
        let name = path.display().to_string();
        // The same bounded, symlink-safe reading and YAML budgets as the policy files.
        match read_file(&path, dir).and_then(|file| parse_yaml::<CasesFile>(&file)) {
            Ok(file) => cases.extend(file.tests.into_iter().map(|c| (name.clone(), c))),
            Err(problem) => problems.push(problem),
        }
    }
    if problems.is_empty() {
        Ok(cases)
    } else {
        Err(problems)
    }
}
