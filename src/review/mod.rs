//! Policy as code: the commands a policy author or reviewer runs before a change ships.
//!
//! - `explain`: the decision of steps 1-8 for one request, step by step, offline.
//! - `test`: YAML test cases of requests and expected decisions, with coverage.
//! - `diff`: the change in effective permissions between two versions of the policy.
//! - `replay`: recorded calls re-decided under a candidate policy.
//!
//! They decide with the same code as the live gateway (`pipeline::explain`), so what
//! they say is what the gateway would do.

pub mod diff;
pub mod explain;
pub mod replay;
pub mod test;
