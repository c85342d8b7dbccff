//! The typed requests of the API's run, safety-lock and listing endpoints: what
//! `server` parses from a request's body (or query) before it calls the gateway's
//! typed methods, so the gateway never sees bytes. A tool call's body is
//! `call::CallBody`.
//!
//! A body is a JSON object with only the fields its endpoint names (docs/api.md):
//! unknown fields are refused, every one of them named; an empty body reads as `{}`.
//! Each problem is a `request_malformed` refusal in the words docs/api.md and the
//! tests give. The gateway answers a malformed request only after it has
//! authenticated the caller, so it takes the parse's result, not only the request.

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde_json::{Map, Value, json};

use crate::diagnostic::{Reason, Refusal};
use crate::policy::RunStatus;
use crate::runs::valid_run_id;

/// A request body this module parses.
pub trait Body: DeserializeOwned {
    /// The fields the body may carry; any other is refused.
    const FIELDS: &'static [&'static str];
    /// The fields it must carry, each with the problem its absence is reported as.
    const REQUIRED: &'static [(&'static str, &'static str)] = &[];
}

/// `POST /v1/runs`: a run bound to a scope, optionally issuing run tokens.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// The run's id; generated when absent.
    #[serde(default, deserialize_with = "run_id")]
    pub run_id: Option<String>,
    /// The scope every call of the run is decided on (merged with the call's).
    #[serde(default, deserialize_with = "scope")]
    pub scope: Map<String, Value>,
    /// `[{role_id, lanes?, ttl_s?}]`: checked against the policy by the gateway
    /// (`identity::run_tokens::parse_requests`), which alone knows the roles.
    #[serde(default)]
    pub issue_tokens: Option<Value>,
}

impl Body for CreateRun {
    const FIELDS: &'static [&'static str] = &["issue_tokens", "run_id", "scope"];
}

/// `POST /v1/runs/{run_id}/status`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetRunStatus {
    #[serde(deserialize_with = "run_status")]
    pub status: RunStatus,
}

const STATUS_PROBLEM: &str = "`status` must be one of active, suspended, closed";

impl Body for SetRunStatus {
    const FIELDS: &'static [&'static str] = &["status"];
    const REQUIRED: &'static [(&'static str, &'static str)] = &[("status", STATUS_PROBLEM)];
}

/// `POST /v1/runs/{run_id}/repin`: no fields (an empty body or `{}`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Repin {}

impl Body for Repin {
    const FIELDS: &'static [&'static str] = &[];
}

/// `POST /v1/safety-lock`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetSafetyLock {
    #[serde(deserialize_with = "engaged")]
    pub engaged: bool,
    /// Why, for the audit log and `GET /v1/safety-lock`; at most 1024 bytes.
    #[serde(default, deserialize_with = "lock_reason")]
    pub reason: Option<String>,
}

const ENGAGED_PROBLEM: &str = "`engaged` must be a boolean";

impl Body for SetSafetyLock {
    const FIELDS: &'static [&'static str] = &["engaged", "reason"];
    const REQUIRED: &'static [(&'static str, &'static str)] = &[("engaged", ENGAGED_PROBLEM)];
}

/// `POST /v1/tool-calls/{call_id}/commit`: the commit of a prepared two-phase call, by
/// the role and run that made it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Commit {
    /// `details.commit.commit_id` of the prepared call's response.
    #[serde(deserialize_with = "commit_field")]
    pub commit_id: String,
    #[serde(deserialize_with = "commit_field")]
    pub role_id: String,
    #[serde(deserialize_with = "commit_field")]
    pub run_id: String,
}

impl Body for Commit {
    const FIELDS: &'static [&'static str] = &["commit_id", "role_id", "run_id"];
    const REQUIRED: &'static [(&'static str, &'static str)] = &[
        (
            "commit_id",
            "`commit_id` is required (details.commit.commit_id of the prepared call)",
        ),
        (
            "role_id",
            "`role_id` is required (the role that made the call)",
        ),
        ("run_id", "`run_id` is required (the run of the call)"),
    ];
}

/// A commit request's id field: a string of 1 to 256 bytes.
fn commit_field<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) if !s.is_empty() && s.len() <= 256 => Ok(s),
        _ => Err(D::Error::custom(
            "`commit_id`, `role_id` and `run_id` must be strings of 1 to 256 bytes",
        )),
    }
}

/// Parses a request body into `T`: a JSON object (an empty body reads as `{}`) with
/// only `T`'s fields (every unknown one is named), its required fields present, and
/// each field of its type.
pub fn parse<T: Body>(body: &[u8]) -> Result<T, Refusal> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}" as &[u8]
    } else {
        body
    };
    let map = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(malformed("the body must be a JSON object")),
        Err(e) => return Err(malformed(&format!("the body is not valid JSON: {e}"))),
    };
    // The map is sorted by key: the unknown fields come out in order.
    let unknown: Vec<String> = map
        .keys()
        .filter(|k| !T::FIELDS.contains(&k.as_str()))
        .map(|k| format!("unknown field `{}`", k.chars().take(64).collect::<String>()))
        .collect();
    if let Some(first) = unknown.first() {
        return Err(Refusal::new(
            Reason::RequestMalformed,
            format!("malformed request: {first}"),
        )
        .with_details(json!({ "problems": unknown })));
    }
    if let Some((_, problem)) = T::REQUIRED.iter().find(|(f, _)| !map.contains_key(*f)) {
        return Err(malformed(problem));
    }
    // The field deserializers below fail with the documented problem as their message.
    T::deserialize(Value::Object(map)).map_err(|e| malformed(&e.to_string()))
}

/// `GET /v1/runs?status=&limit=&cursor=`.
#[derive(Debug, Clone, PartialEq)]
pub struct ListRuns {
    pub status: Option<RunStatus>,
    /// 1 to 1000; 100 when not given.
    pub limit: usize,
    /// The run id the page starts after.
    pub cursor: Option<String>,
}

impl ListRuns {
    /// Reads the query parameters.
    pub fn from_query(
        status: Option<&str>,
        limit: Option<&str>,
        cursor: Option<&str>,
    ) -> Result<ListRuns, Refusal> {
        let status = match status {
            None => None,
            Some(s) => Some(
                serde_json::from_value::<RunStatus>(json!(s))
                    .map_err(|_| malformed(STATUS_PROBLEM))?,
            ),
        };
        let limit = match limit {
            None => 100,
            Some(l) => match l.parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => n,
                _ => return Err(malformed("`limit` must be an integer from 1 to 1000")),
            },
        };
        Ok(ListRuns {
            status,
            limit,
            cursor: cursor.map(str::to_string),
        })
    }
}

/// `POST /v1/approvals/{id}/decision`: `{"decision": "approve" | "deny", "reason": "..."}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideApproval {
    #[serde(deserialize_with = "decision")]
    pub decision: crate::approvals::Verdict,
    /// Why, for the audit log and the requester: 1 to 1000 bytes.
    #[serde(deserialize_with = "decision_reason")]
    pub reason: String,
}

const DECISION_PROBLEM: &str = "`decision` must be one of approve, deny";
const DECISION_REASON_PROBLEM: &str =
    "`reason` must be a non-empty string of at most 1000 bytes without control characters";

impl Body for DecideApproval {
    const FIELDS: &'static [&'static str] = &["decision", "reason"];
    const REQUIRED: &'static [(&'static str, &'static str)] = &[
        ("decision", DECISION_PROBLEM),
        ("reason", DECISION_REASON_PROBLEM),
    ];
}

fn decision<'de, D: Deserializer<'de>>(d: D) -> Result<crate::approvals::Verdict, D::Error> {
    serde_json::from_value(Value::deserialize(d)?).map_err(|_| D::Error::custom(DECISION_PROBLEM))
}

fn decision_reason<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s)
            if !s.trim().is_empty()
                && s.len() <= crate::approvals::MAX_REASON_BYTES
                && !s.chars().any(|c| c.is_control() && c != '\n') =>
        {
            Ok(s)
        }
        _ => Err(D::Error::custom(DECISION_REASON_PROBLEM)),
    }
}

/// `GET /v1/approvals?status=&run_id=&limit=&cursor=&order=`.
#[derive(Debug, Clone, PartialEq)]
pub struct ListApprovals {
    pub status: Option<crate::approvals::ApprovalStatus>,
    pub run_id: Option<String>,
    /// 1 to `approvals::MAX_PAGE`; `approvals::DEFAULT_PAGE` when not given.
    pub limit: usize,
    /// Where the previous page ended (its `next_cursor`); 0 for the first page.
    pub cursor: i64,
    /// `order=newest`: the most recently requested first (the console's recent
    /// decisions); `oldest`, the default, is the order they were requested in.
    pub newest_first: bool,
}

impl ListApprovals {
    /// Reads the query parameters.
    pub fn from_query(
        status: Option<&str>,
        run_id: Option<&str>,
        limit: Option<&str>,
        cursor: Option<&str>,
        order: Option<&str>,
    ) -> Result<ListApprovals, Refusal> {
        use crate::approvals::{ApprovalStatus, DEFAULT_PAGE, MAX_PAGE};
        let status = match status {
            None => None,
            Some(s) => Some(ApprovalStatus::parse(s).ok_or_else(|| {
                malformed("`status` must be one of pending, approved, denied, expired, used")
            })?),
        };
        if let Some(run) = run_id
            && !valid_run_id(run)
        {
            return Err(malformed("`run_id` must match ^[A-Za-z0-9._-]{1,128}$"));
        }
        let limit = match limit {
            None => DEFAULT_PAGE,
            Some(l) => match l.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
                _ => {
                    return Err(malformed(&format!(
                        "`limit` must be an integer from 1 to {MAX_PAGE}"
                    )));
                }
            },
        };
        let cursor =
            match cursor {
                None => 0,
                Some(c) => c.parse::<i64>().ok().filter(|c| *c >= 0).ok_or_else(|| {
                    malformed("`cursor` must be the next_cursor of a previous page")
                })?,
            };
        let newest_first = match order {
            None | Some("oldest") => false,
            Some("newest") => true,
            Some(_) => return Err(malformed("`order` must be oldest or newest")),
        };
        Ok(ListApprovals {
            status,
            run_id: run_id.map(str::to_string),
            limit,
            cursor,
            newest_first,
        })
    }
}

/// A `request_malformed` refusal naming one problem.
pub fn malformed(problem: &str) -> Refusal {
    Refusal::new(
        Reason::RequestMalformed,
        format!("malformed request: {problem}"),
    )
    .with_details(json!({ "problems": [problem] }))
}

fn run_id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) if valid_run_id(&s) => Ok(Some(s)),
        _ => Err(D::Error::custom(
            "`run_id` must match ^[A-Za-z0-9._-]{1,128}$",
        )),
    }
}

fn scope<'de, D: Deserializer<'de>>(d: D) -> Result<Map<String, Value>, D::Error> {
    let value = Value::deserialize(d)?;
    if crate::call::has_inexact_integer(&value) {
        return Err(D::Error::custom(format!(
            "`scope` holds an integer beyond +-{} (send it as a string)",
            crate::call::MAX_SAFE_INTEGER
        )));
    }
    match value {
        Value::Null => Ok(Map::new()),
        Value::Object(m) => Ok(m),
        _ => Err(D::Error::custom("`scope` must be an object")),
    }
}

fn run_status<'de, D: Deserializer<'de>>(d: D) -> Result<RunStatus, D::Error> {
    serde_json::from_value(Value::deserialize(d)?).map_err(|_| D::Error::custom(STATUS_PROBLEM))
}

fn engaged<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Value::deserialize(d)? {
        Value::Bool(b) => Ok(b),
        _ => Err(D::Error::custom(ENGAGED_PROBLEM)),
    }
}

fn lock_reason<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) if s.len() <= 1024 => Ok(Some(s)),
        _ => Err(D::Error::custom(
            "`reason` must be a string of at most 1024 bytes",
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The message and problems of a refused body.
    fn refused<T: Body + std::fmt::Debug>(body: &str) -> (String, Vec<String>) {
        let refusal = parse::<T>(body.as_bytes()).unwrap_err();
        assert_eq!(refusal.reason, Reason::RequestMalformed);
        let problems = serde_json::from_value(refusal.details["problems"].clone()).unwrap();
        (refusal.message, problems)
    }

    #[test]
    fn bodies_parse_into_their_types() {
        let run = parse::<CreateRun>(br#"{"run_id": "r-1", "scope": {"case_id": "C"}}"#).unwrap();
        assert_eq!(run.run_id.as_deref(), Some("r-1"));
        assert_eq!(run.scope["case_id"], "C");
        assert_eq!(run.issue_tokens, None);
        assert_eq!(parse::<CreateRun>(b"  ").unwrap(), CreateRun::default());
        let null = parse::<CreateRun>(br#"{"run_id": null, "scope": null}"#).unwrap();
        assert_eq!(null, CreateRun::default());
        let status = parse::<SetRunStatus>(br#"{"status": "suspended"}"#).unwrap();
        assert_eq!(status.status, RunStatus::Suspended);
        let lock = parse::<SetSafetyLock>(br#"{"engaged": true, "reason": "r"}"#).unwrap();
        assert_eq!((lock.engaged, lock.reason.as_deref()), (true, Some("r")));
        assert_eq!(parse::<Repin>(b"").unwrap(), Repin {});
        assert_eq!(parse::<Repin>(b"{}").unwrap(), Repin {});
    }

    #[test]
    fn every_problem_reads_as_documented() {
        let cases: Vec<((String, Vec<String>), &str)> = vec![
            (
                refused::<Repin>("{nope"),
                "malformed request: the body is not valid JSON: key must be a string at line 1 column 2",
            ),
            (
                refused::<Repin>("[]"),
                "malformed request: the body must be a JSON object",
            ),
            (
                refused::<SetSafetyLock>(r#"{"reason": "r"}"#),
                "malformed request: `engaged` must be a boolean",
            ),
            (
                refused::<SetSafetyLock>(r#"{"engaged": null}"#),
                "malformed request: `engaged` must be a boolean",
            ),
            (
                refused::<SetSafetyLock>(r#"{"engaged": "yes"}"#),
                "malformed request: `engaged` must be a boolean",
            ),
            (
                refused::<SetSafetyLock>(&format!(
                    r#"{{"engaged": true, "reason": "{}"}}"#,
                    "x".repeat(1025)
                )),
                "malformed request: `reason` must be a string of at most 1024 bytes",
            ),
            (
                refused::<CreateRun>(r#"{"run_id": "a b"}"#),
                "malformed request: `run_id` must match ^[A-Za-z0-9._-]{1,128}$",
            ),
            (
                refused::<CreateRun>(r#"{"scope": []}"#),
                "malformed request: `scope` must be an object",
            ),
            (
                refused::<SetRunStatus>("{}"),
                "malformed request: `status` must be one of active, suspended, closed",
            ),
            (
                refused::<SetRunStatus>(r#"{"status": "open"}"#),
                "malformed request: `status` must be one of active, suspended, closed",
            ),
        ];
        for ((message, problems), expected) in cases {
            assert_eq!(message, expected);
            assert_eq!(
                problems,
                [expected.trim_start_matches("malformed request: ")]
            );
        }
    }

    #[test]
    fn every_unknown_field_is_named() {
        let (message, problems) = refused::<Repin>(r#"{"zeta": 1, "alpha": 2}"#);
        assert_eq!(message, "malformed request: unknown field `alpha`");
        assert_eq!(problems, ["unknown field `alpha`", "unknown field `zeta`"]);
        // Unknown fields are named before any other problem.
        let (message, _) = refused::<SetSafetyLock>(r#"{"engaged": "no", "extra": 1}"#);
        assert_eq!(message, "malformed request: unknown field `extra`");
    }

    #[test]
    fn list_queries_are_checked() {
        let all = ListRuns::from_query(None, None, None).unwrap();
        assert_eq!((all.status, all.limit, all.cursor), (None, 100, None));
        let page = ListRuns::from_query(Some("closed"), Some("5"), Some("run-1")).unwrap();
        assert_eq!(page.status, Some(RunStatus::Closed));
        assert_eq!((page.limit, page.cursor.as_deref()), (5, Some("run-1")));
        for (status, limit) in [(Some("open"), None), (None, Some("0")), (None, Some("x"))] {
            let refusal = ListRuns::from_query(status, limit, None).unwrap_err();
            assert_eq!(refusal.reason, Reason::RequestMalformed);
        }
    }
}
