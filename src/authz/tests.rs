//! Unit tests of the pure authorization checks: the denial matrix of steps 2-8.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;

use super::*;

fn map(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
}

/// (run scope, call scope, effective scope or the conflicting keys, keys from the run)
type Row = (
    Value,
    Value,
    Result<Value, Vec<&'static str>>,
    Vec<&'static str>,
);

#[test]
fn the_run_scope_binds_every_call() {
    let table: Vec<Row> = vec![
        // The call omits a run key: it applies anyway.
        (
            json!({"case_id": "C-1", "sealed": true}),
            json!({"case_id": "C-1"}),
            Ok(json!({"case_id": "C-1", "sealed": true})),
            vec!["case_id", "sealed"],
        ),
        // The call adds a key the run does not have.
        (
            json!({"case_id": "C-1"}),
            json!({"matter_id": "M-1"}),
            Ok(json!({"case_id": "C-1", "matter_id": "M-1"})),
            vec!["case_id"],
        ),
        // Repeating a run key with the same value is fine.
        (
            json!({"case_id": "C-1"}),
            json!({"case_id": "C-1"}),
            Ok(json!({"case_id": "C-1"})),
            vec!["case_id"],
        ),
        // No run scope: the call's scope as is.
        (json!({}), json!({"x": 1}), Ok(json!({"x": 1})), vec![]),
        // Contradictions, `false` and `null` included, are refused.
        (
            json!({"case_id": "C-1"}),
            json!({"case_id": "C-2"}),
            Err(vec!["case_id"]),
            vec![],
        ),
        (
            json!({"sealed": true, "case_id": "C-1"}),
            json!({"sealed": false, "case_id": null}),
            Err(vec!["case_id", "sealed"]),
            vec![],
        ),
        (json!({"n": 1}), json!({"n": 1.0}), Err(vec!["n"]), vec![]),
    ];
    for (run, call, expected, from_run) in table {
        let got = merge_scope(&map(run.clone()), &map(call.clone()));
        match expected {
            Ok(scope) => {
                let got = got.unwrap_or_else(|c| panic!("{run} + {call}: conflict {c:?}"));
                assert_eq!(Value::Object(got.scope), scope, "{run} + {call}");
                assert_eq!(got.from_run, from_run, "{run} + {call}");
            }
            Err(keys) => assert_eq!(got.unwrap_err(), keys, "{run} + {call}"),
        }
    }
}

#[test]
fn a_flag_names_where_it_came_from() {
    let scope = merge_scope(
        &map(json!({"sealed": true})),
        &map(json!({"privileged": true, "urgent": false})),
    )
    .unwrap();
    assert_eq!(scope.flag_source("sealed"), Some("run"));
    assert_eq!(scope.flag_source("privileged"), Some("call"));
    assert_eq!(scope.flag_source("urgent"), None);
    assert_eq!(scope.flag_source("other"), None);
}

// -----------------------------------------------------------------------------------
// The denial matrix of steps 2-8: every reason each pure check can return, and the
// allow cases, one row each, over the shipped demo policy.

use crate::identity::RunBinding;
use crate::policy::RunStatus;

/// The demo policy with what the shipped one does not have, made in code: a disabled
/// role, and a run-tokens-only role that also binds a static token.
fn world_policy() -> Policy {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut policy =
        crate::policy::load(&root.join("policy"), &root.join("tools/tool_registry.yaml")).unwrap();
    let mut retired = policy.roles["research_agent"].clone();
    retired.role_id = "retired_agent".into();
    retired.enabled = false;
    retired.credential =
        Credential::TokenSha256(crate::canonical::sha256_hex(b"demo-retired_agent"));
    policy.roles.insert("retired_agent".into(), retired);
    policy.roles.get_mut("paralegal_agent").unwrap().credential = Credential::RunTokensOnly {
        sha256: Some(crate::canonical::sha256_hex(b"demo-paralegal_agent")),
    };
    policy
}

fn run_record(policy: &Policy, status: RunStatus, scope: Value) -> RunRecord {
    RunRecord {
        run_id: "run-1".into(),
        status,
        scope: map(scope),
        policy_versions: policy.versions.clone(),
        created_at: "2026-11-23T00:00:00.000Z".into(),
        created_by: "ops".into(),
    }
}

fn binding(role: &str, run: &str, lanes: &[&str]) -> RunBinding {
    RunBinding {
        token_id: "rtk-1".into(),
        run_id: run.into(),
        role_id: role.into(),
        lanes: lanes.iter().map(|l| l.to_string()).collect(),
        expires_unix: i64::MAX,
    }
}

/// Steps 2-8 for one call as the pipeline runs them, after identity and run: lane,
/// tool, allowlist, scope, arguments, prohibitions, conditions.
fn from_lane(
    policy: &Policy,
    role: &str,
    lane: &str,
    tool: &str,
    run: &RunRecord,
    scope: Value,
    arguments: Value,
) -> Result<(), Refusal> {
    let role = find_role(policy, role)?;
    let lane = authorize_lane(policy, role, lane, run)?;
    let tool = find_tool(policy, tool)?;
    lane_permits(lane, tool)?;
    let scope = check_scope(lane, tool, &map(scope), run)?;
    check_arguments(tool, &arguments)?;
    let flags = raised_flags(tool, &scope.scope, &arguments);
    check_prohibitions(lane, tool, &flags, &scope)?;
    let vars = condition_variables(role, lane, tool, run, &scope, &arguments);
    check_conditions(lane, tool, &evaluate_conditions(lane, tool, &vars))
}

/// A row's check: one or more of the pure functions above, on the policy.
type Check = dyn Fn(&Policy) -> Result<(), Refusal>;

/// One row: the step, what it shows, the decision (None allows), and the check.
struct Decision {
    step: u8,
    case: &'static str,
    expect: Option<Reason>,
    check: Box<Check>,
}

fn row(
    step: u8,
    case: &'static str,
    expect: Option<Reason>,
    check: impl Fn(&Policy) -> Result<(), Refusal> + 'static,
) -> Decision {
    Decision {
        step,
        case,
        expect,
        check: Box::new(check),
    }
}

fn active(p: &Policy, scope: Value) -> RunRecord {
    run_record(p, RunStatus::Active, scope)
}

fn matrix() -> Vec<Decision> {
    use Reason as R;
    fn case() -> Value {
        json!({"case_id": "C-1"})
    }
    fn ok(r: Result<&Role, Refusal>) -> Result<(), Refusal> {
        r.map(|_| ())
    }
    vec![
        // Step 2: identity (static tokens).
        row(2, "no token", Some(R::CredentialMissing), |p| {
            ok(verify_identity(p, "research_agent", None))
        }),
        row(2, "a wrong token", Some(R::CredentialInvalid), |p| {
            ok(verify_identity(p, "research_agent", Some("guess")))
        }),
        row(2, "another role's token", Some(R::CredentialInvalid), |p| {
            ok(verify_identity(
                p,
                "research_agent",
                Some("demo-supervisor"),
            ))
        }),
        row(
            2,
            "an unknown role is answered as a bad credential, not role_unknown",
            Some(R::CredentialInvalid),
            |p| {
                ok(verify_identity(
                    p,
                    "ghost_agent",
                    Some("demo-research_agent"),
                ))
            },
        ),
        row(
            2,
            "the static token of a run-tokens-only role",
            Some(R::RunTokenRequired),
            |p| {
                ok(verify_identity(
                    p,
                    "paralegal_agent",
                    Some("demo-paralegal_agent"),
                ))
            },
        ),
        row(
            2,
            "a run-tokens-only role with a wrong token",
            Some(R::CredentialInvalid),
            |p| ok(verify_identity(p, "paralegal_agent", Some("guess"))),
        ),
        row(
            2,
            "a disabled role with its token",
            Some(R::RoleDisabled),
            |p| {
                ok(verify_identity(
                    p,
                    "retired_agent",
                    Some("demo-retired_agent"),
                ))
            },
        ),
        row(2, "the role's own token", None, |p| {
            ok(verify_identity(
                p,
                "research_agent",
                Some("demo-research_agent"),
            ))
        }),
        // Step 2: offline (explain, replay): the role only.
        row(2, "offline: an unknown role", Some(R::RoleUnknown), |p| {
            ok(find_role(p, "ghost_agent"))
        }),
        row(2, "offline: a disabled role", Some(R::RoleDisabled), |p| {
            ok(find_role(p, "retired_agent"))
        }),
        row(2, "offline: an enabled role", None, |p| {
            ok(find_role(p, "research_agent"))
        }),
        // Step 2: run tokens.
        row(
            2,
            "a run token naming another role",
            Some(R::CredentialInvalid),
            |p| {
                let b = binding("paralegal_agent", "run-1", &["drafting"]);
                ok(verify_run_token(p, &b, "drafting_agent"))
            },
        ),
        row(2, "a run token for its own role", None, |p| {
            let b = binding("paralegal_agent", "run-1", &["drafting"]);
            ok(verify_run_token(p, &b, "paralegal_agent"))
        }),
        // Step 2: admin endpoints.
        row(2, "admin: no token", Some(R::CredentialMissing), |p| {
            verify_admin(p, None).map(|_| ())
        }),
        row(
            2,
            "admin: a role's token",
            Some(R::CredentialInvalid),
            |p| verify_admin(p, Some("demo-supervisor")).map(|_| ()),
        ),
        row(2, "admin: the admin token", None, |p| {
            verify_admin(p, Some("demo-admin")).map(|_| ())
        }),
        // Step 3: the run.
        row(
            3,
            "a run token for another run",
            Some(R::CredentialNotForRun),
            |_| check_token_run(&binding("paralegal_agent", "run-1", &["drafting"]), "run-2"),
        ),
        row(3, "a run token for its run", None, |_| {
            check_token_run(&binding("paralegal_agent", "run-1", &["drafting"]), "run-1")
        }),
        row(3, "no such run", Some(R::RunNotFound), |p| {
            verify_run(None::<&RunRecord>, "run-404", &p.versions).map(|_| ())
        }),
        row(
            3,
            "a run pinned to other policy versions",
            Some(R::PolicyVersionMismatch),
            |p| {
                let mut run = active(p, json!({}));
                run.policy_versions.lanes.version = "0.0.1-other".into();
                verify_run(Some(&run), "run-1", &p.versions).map(|_| ())
            },
        ),
        row(3, "a run pinned to the loaded policy", None, |p| {
            let run = active(p, json!({}));
            verify_run(Some(&run), "run-1", &p.versions).map(|_| ())
        }),
        // Step 4: the lane.
        row(
            4,
            "a lane outside the run token's lanes",
            Some(R::LaneNotAllowedForRole),
            |_| {
                check_token_lane(
                    &binding("paralegal_agent", "run-1", &["drafting"]),
                    "filing",
                )
            },
        ),
        row(4, "a lane of the run token", None, |_| {
            check_token_lane(
                &binding("paralegal_agent", "run-1", &["drafting"]),
                "drafting",
            )
        }),
        row(
            4,
            "an unknown lane (before the role's lanes)",
            Some(R::LaneUnknown),
            |p| {
                let run = active(p, case());
                let role = &p.roles["research_agent"];
                authorize_lane(p, role, "reserch", &run).map(|_| ())
            },
        ),
        row(
            4,
            "a lane the role may not act in",
            Some(R::LaneNotAllowedForRole),
            |p| {
                let run = active(p, case());
                authorize_lane(p, &p.roles["research_agent"], "drafting", &run).map(|_| ())
            },
        ),
        row(4, "a suspended run", Some(R::RunNotActive), |p| {
            let run = run_record(p, RunStatus::Suspended, case());
            authorize_lane(p, &p.roles["research_agent"], "research", &run).map(|_| ())
        }),
        row(4, "a closed run", Some(R::RunNotActive), |p| {
            let run = run_record(p, RunStatus::Closed, case());
            authorize_lane(p, &p.roles["research_agent"], "research", &run).map(|_| ())
        }),
        row(4, "the role's lane on an active run", None, |p| {
            let run = active(p, case());
            authorize_lane(p, &p.roles["research_agent"], "research", &run).map(|_| ())
        }),
        // Step 5: the tool.
        row(5, "an unregistered tool", Some(R::ToolUnregistered), |p| {
            find_tool(p, "shred_documents").map(|_| ())
        }),
        row(5, "a disabled tool", Some(R::ToolDisabled), |p| {
            find_tool(p, "disabled_tool").map(|_| ())
        }),
        row(5, "an enabled tool", None, |p| {
            find_tool(p, "case_lookup").map(|_| ())
        }),
        // Step 6: the lane's allowlist.
        row(
            6,
            "a tool the lane does not allowlist",
            Some(R::ToolNotAllowedInLane),
            |p| lane_permits(&p.lanes["research"], &p.tools["draft_document"]),
        ),
        row(
            6,
            "a lane listing a tool that does not name the lane",
            Some(R::ToolNotAllowedInLane),
            |p| {
                let mut lane = p.lanes["drafting"].clone();
                lane.tools.push("legal_search".into());
                lane_permits(&lane, &p.tools["legal_search"])
            },
        ),
        row(6, "an allowlisted tool", None, |p| {
            lane_permits(&p.lanes["drafting"], &p.tools["draft_document"])
        }),
        // Step 7: the scope.
        row(
            7,
            "a call scope contradicting the run's",
            Some(R::ScopeConflictsWithRun),
            |p| {
                let run = active(p, json!({"case_id": "C-1"}));
                let scope = map(json!({"case_id": "C-2"}));
                check_scope(&p.lanes["research"], &p.tools["case_lookup"], &scope, &run).map(|_| ())
            },
        ),
        row(
            7,
            "a contradiction is reported before a missing key",
            Some(R::ScopeConflictsWithRun),
            |p| {
                let run = active(p, json!({"sealed": true}));
                let scope = map(json!({"sealed": false}));
                check_scope(&p.lanes["research"], &p.tools["case_lookup"], &scope, &run).map(|_| ())
            },
        ),
        row(
            7,
            "a required scope key missing",
            Some(R::ScopeKeyMissing),
            |p| {
                let run = active(p, json!({}));
                check_scope(
                    &p.lanes["filing"],
                    &p.tools["file_with_court"],
                    &map(case()),
                    &run,
                )
                .map(|_| ())
            },
        ),
        row(
            7,
            "a required scope key null",
            Some(R::ScopeKeyMissing),
            |p| {
                let run = active(p, json!({}));
                let scope = map(json!({"case_id": null}));
                check_scope(&p.lanes["research"], &p.tools["case_lookup"], &scope, &run).map(|_| ())
            },
        ),
        row(7, "a required key that comes from the run", None, |p| {
            let run = active(p, case());
            check_scope(
                &p.lanes["research"],
                &p.tools["case_lookup"],
                &map(json!({})),
                &run,
            )
            .map(|_| ())
        }),
        // Step 8: arguments, prohibitions, conditions.
        row(
            8,
            "arguments outside the input schema",
            Some(R::ArgumentsInvalid),
            |p| check_arguments(&p.tools["read_document"], &json!({"path": "", "x": 1})),
        ),
        row(8, "arguments inside the input schema", None, |p| {
            check_arguments(&p.tools["read_document"], &json!({"path": "notes.md"}))
        }),
        row(
            8,
            "a flag the call's scope raises, prohibited by the lane",
            Some(R::ProhibitedFlag),
            |p| {
                let run = active(p, case());
                from_lane(
                    p,
                    "research_agent",
                    "research",
                    "case_lookup",
                    &run,
                    json!({"case_id": "C-1", "privileged": true}),
                    json!({}),
                )
            },
        ),
        row(
            8,
            "a flag the run's scope raises, prohibited by the lane and the tool",
            Some(R::ProhibitedFlag),
            |p| {
                let run = active(p, json!({"case_id": "C-1", "sealed": true}));
                from_lane(
                    p,
                    "drafting_agent",
                    "drafting",
                    "read_document",
                    &run,
                    json!({}),
                    json!({"path": "notes.md"}),
                )
            },
        ),
        row(
            8,
            "a flag a flag rule raises from the arguments",
            Some(R::ProhibitedFlag),
            |p| {
                let run = active(p, case());
                from_lane(
                    p,
                    "research_agent",
                    "research",
                    "read_document",
                    &run,
                    json!({}),
                    json!({"path": "privileged/strategy.md"}),
                )
            },
        ),
        row(
            8,
            "the same flag in a lane that does not prohibit it",
            None,
            |p| {
                let run = active(p, case());
                from_lane(
                    p,
                    "drafting_agent",
                    "drafting",
                    "read_document",
                    &run,
                    json!({}),
                    json!({"path": "privileged/strategy.md"}),
                )
            },
        ),
        row(
            8,
            "a condition that is false",
            Some(R::ConditionFailed),
            |p| {
                let run = active(p, case());
                from_lane(
                    p,
                    "research_agent",
                    "research",
                    "legal_search",
                    &run,
                    json!({}),
                    json!({"query": "duty", "limit": 50}),
                )
            },
        ),
        row(
            8,
            "a condition on a run without the case it reads",
            Some(R::ConditionFailed),
            |p| {
                let run = active(p, json!({}));
                from_lane(
                    p,
                    "research_agent",
                    "research",
                    "case_lookup",
                    &run,
                    case(),
                    json!({}),
                )
            },
        ),
        row(8, "every condition true: the call is allowed", None, |p| {
            let run = active(p, case());
            from_lane(
                p,
                "research_agent",
                "research",
                "legal_search",
                &run,
                json!({}),
                json!({"query": "duty", "limit": 5}),
            )
        }),
    ]
}

#[test]
fn the_denial_matrix_holds_row_by_row() {
    let policy = world_policy();
    let mut failures = Vec::new();
    for row in matrix() {
        let got = (row.check)(&policy);
        match (&got, row.expect) {
            (Ok(()), None) => {}
            (Err(refusal), Some(reason)) if refusal.reason == reason => {
                if refusal.reason.info().step != row.step {
                    failures.push(format!(
                        "step {} `{}`: {:?} is cataloged at step {}",
                        row.step,
                        row.case,
                        reason,
                        reason.info().step
                    ));
                }
            }
            _ => failures.push(format!(
                "step {} `{}`: want {:?}, got {:?}",
                row.step,
                row.case,
                row.expect,
                got.map_err(|r| (r.reason, r.message))
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Reasons of steps 2-8 that are decided outside this file (not pure: they need the
/// clock or the file system), with where.
const DECIDED_ELSEWHERE: [(Reason, &str); 29] = [
    (
        Reason::JwtMalformed,
        "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
    ),
    (
        Reason::JwtExpired,
        "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
    ),
    (
        Reason::JwtNotYetValid,
        "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
    ),
    (
        Reason::JwtIssuerMismatch,
        "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
    ),
    (
        Reason::JwtAudienceMismatch,
        "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
    ),
    (
        Reason::JwtUnknownKid,
        "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
    ),
    (
        Reason::JwtAlgorithmRefused,
        "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
    ),
    (
        Reason::JwtSignatureInvalid,
        "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
    ),
    (
        Reason::JwksUnavailable,
        "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
    ),
    (
        Reason::CredentialExpired,
        "identity::run_tokens resolves a run token before the decision (the clock)",
    ),
    (
        Reason::ArgumentUnsafe,
        "the adapter's validate (a path that escapes the case folder, a symlink)",
    ),
    (
        Reason::ApprovalRequired,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalPending,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalDenied,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalExpired,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalUsed,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalUnknown,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalArgumentsMismatch,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalRunMismatch,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalRoleMismatch,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalCallMismatch,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalPolicyChanged,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalLimitReached,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalStoreUnavailable,
        "the approval gate in pipeline.rs, after the pure decision (store in gateway::approvals)",
    ),
    (
        Reason::ApprovalAttestationInvalid,
        "the approval gate in pipeline.rs, after the pure decision (the fleet key's attestation, gateway::approvals)",
    ),
    (
        Reason::ApprovalStoreMismatch,
        "the approval gate in pipeline.rs, after the pure decision (the store against the audit log's evidence, gateway::approvals)",
    ),
    (
        Reason::ApprovalEvidenceUnavailable,
        "the approval gate in pipeline.rs, after the pure decision (the audit hub's evidence in a fleet, gateway::approvals)",
    ),
    (
        Reason::BudgetExhausted,
        "gateway::budgets claims the counters authz::limit_claims names, after the decision (state)",
    ),
    (
        Reason::CounterStateUnavailable,
        "gateway::budgets claims the counters authz::limit_claims names, after the decision (state)",
    ),
];

#[test]
fn the_denial_matrix_covers_every_reason_of_steps_2_to_8() {
    let rows = matrix();
    let covered: BTreeSet<Reason> = rows.iter().filter_map(|r| r.expect).collect();
    // Every step has an allow row.
    for step in 2..=8 {
        assert!(
            rows.iter().any(|r| r.step == step && r.expect.is_none()),
            "step {step} has no allow row"
        );
    }
    // Every reason the code above returns has a row (read from the source, so a new
    // `Reason::` in this file without a row fails here).
    let source = include_str!("../authz.rs");
    let code = source.split("#[cfg(test)]").next().unwrap();
    for reason in Reason::ALL {
        let named = format!("Reason::{reason:?}");
        let returned = code.match_indices(&named).any(|(at, _)| {
            !code[at + named.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        });
        let elsewhere = DECIDED_ELSEWHERE.iter().any(|(r, _)| *r == reason);
        assert!(
            !returned || covered.contains(&reason),
            "src/authz.rs returns {reason:?} but the denial matrix has no row for it"
        );
        assert!(
            !(returned && elsewhere),
            "{reason:?} is returned here now: give it a row instead of DECIDED_ELSEWHERE"
        );
        // Every reason cataloged at steps 2-8 is a row or decided elsewhere.
        if (2..=8).contains(&reason.info().step) {
            assert!(
                covered.contains(&reason) || elsewhere,
                "{reason:?} (step {}) has no row in the denial matrix",
                reason.info().step
            );
        }
    }
}
