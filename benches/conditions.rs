//! The cost of conditions: `cargo bench --bench conditions` compiles the demo's and the
//! DevOps example's CEL conditions and times their evaluation on one call's variables
//! (what step 8 adds per condition), and the budget refusal of a heavy one.

use std::time::Instant;

use serde_json::json;
use toolgate::policy::condition::{Condition, Inputs, Variables};

const ROUNDS: u32 = 100_000;

fn main() {
    let scope = json!({"case_id": "C-1001", "service": "checkout", "max_lines": 100});
    let scope = scope.as_object().cloned().unwrap_or_default();
    let args = json!({"service": "checkout", "limit": 10, "lines": 50, "hosts": ["checkout-1", "checkout-2"]});
    let variables = || {
        Variables::new(Inputs {
            args: Some(args.clone()),
            scope: Some(json!(scope)),
            run: Some(json!({"id": "run-1", "status": "active", "scope": scope})),
            caller: Some(json!({"role": "research_agent", "lanes": ["research"]})),
            tool: Some(json!({"name": "legal_search", "version": "1.0.0"})),
            lane: Some(json!("research")),
        })
    };
    let started = Instant::now();
    for _ in 0..ROUNDS / 10 {
        std::hint::black_box(variables());
    }
    let per = started.elapsed() / (ROUNDS / 10);
    println!("{:<70} {:>9.2?} per call", "building the variables", per);
    let vars = variables();
    for expr in [
        "args.limit <= 20",
        "has(run.scope.case_id) && scope.case_id == run.scope.case_id",
        "args.service == scope.service",
        "!has(args.hosts) || args.hosts.all(h, h.startsWith(scope.service + '-'))",
    ] {
        let Ok(condition) = Condition::compile("c", expr, "m", None) else {
            eprintln!("error: `{expr}` did not compile");
            std::process::exit(1);
        };
        let started = Instant::now();
        for _ in 0..ROUNDS {
            std::hint::black_box(condition.evaluate(&vars));
        }
        let per = started.elapsed() / ROUNDS;
        println!("{expr:<70} {per:>9.2?} per evaluation");
    }
}
