//! `toolgate policy test [DIR]`: runs the YAML test cases under `policy/tests/` against
//! the policy, offline, prints `N passed, N failed`, and reports the (role, lane, tool)
//! triples no test covers.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::Args;
use serde_json::{Value, json};

use crate::commands::{Exit, Format, PolicyLocation, not_loaded};

use crate::policy::load_cases;
use crate::review::test::{CaseResult, run_case, triples};

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Directory of test cases (default: `<policy-dir>/tests`).
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub location: PolicyLocation,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

pub fn test_command(args: &TestArgs) -> Exit {
    let loaded = match super::load_offline(&args.location.policy_dir, &args.location.tools) {
        Ok(l) => l,
        Err(problems) => return not_loaded(args.format, "policy", "the policy", &problems),
    };
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| args.location.policy_dir.join("tests"));
    let cases = match load_cases(&dir) {
        Ok(c) => c,
        Err(problems) => return not_loaded(args.format, "cases", "the test cases", &problems),
    };
    let results: Vec<CaseResult> = cases
        .iter()
        .map(|(file, case)| CaseResult {
            file: file.clone(),
            name: case.name.clone(),
            failure: run_case(&loaded, case),
        })
        .collect();
    let covered: BTreeSet<(String, String, String)> = cases
        .iter()
        .map(|(_, c)| {
            (
                c.request.role.clone(),
                c.request.lane.clone(),
                c.request.tool.clone(),
            )
        })
        .collect();
    let uncovered: Vec<_> = triples(&loaded.policy)
        .difference(&covered)
        .cloned()
        .collect();
    let failed = results.iter().filter(|r| r.failure.is_some()).count();
    let passed = results.len() - failed;
    match args.format {
        Format::Text => {
            for r in &results {
                match &r.failure {
                    None => println!("ok    {} ({})", r.name, r.file),
                    Some(why) => println!("FAIL  {} ({}): {why}", r.name, r.file),
                }
            }
            if uncovered.is_empty() {
                println!("coverage: every (role, lane, tool) triple has a test");
            } else {
                println!(
                    "coverage: {} (role, lane, tool) triples have no test:",
                    uncovered.len()
                );
                for (role, lane, tool) in &uncovered {
                    println!("  {role} / {lane} / {tool}");
                }
            }
            println!("{passed} passed, {failed} failed");
        }
        Format::Json => {
            let body = json!({
                "ok": failed == 0,
                "passed": passed,
                "failed": failed,
                "results": results.iter().map(|r| json!({"file": r.file, "name": r.name, "ok": r.failure.is_none(), "failure": r.failure})).collect::<Vec<Value>>(),
                "uncovered": uncovered.iter().map(|(r, l, t)| json!({"role": r, "lane": l, "tool": t})).collect::<Vec<Value>>(),
            });
            println!("{body}");
        }
    }
    if failed == 0 { Exit::Ok } else { Exit::Failure }
}
