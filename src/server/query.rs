//! The query strings of the API: one typed struct per endpoint, read with
//! `serde_urlencoded`.
//!
//! Like a body, a query carries only the parameters its endpoint names (docs/api.md):
//! an unknown parameter (every one is named) or one given twice is a
//! `request_malformed` refusal, never ignored. An endpoint without parameters takes
//! [`NoQuery`]. The values are checked by the typed requests they become
//! (`requests::ListRuns::from_query`, ...), in the documented words.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::audit::{EventFilter, EventType};
use crate::diagnostic::{Reason, Refusal};
use crate::requests::{self, malformed};

/// The query of an endpoint.
pub trait Query: DeserializeOwned {
    /// The parameters it may carry; any other is refused.
    const FIELDS: &'static [&'static str];
}

/// At most this many unknown parameters are named in a refusal; the rest are counted.
const MAX_NAMED: usize = 10;

/// Reads a request's query string (None: there is none) into `T`.
pub fn parse<T: Query>(query: Option<&str>) -> Result<T, Refusal> {
    let query = query.unwrap_or_default();
    let mut unknown = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut repeated = BTreeSet::new();
    for (key, _) in form_urlencoded::parse(query.as_bytes()) {
        match T::FIELDS.iter().find(|f| **f == key) {
            Some(field) if !seen.insert(*field) => {
                repeated.insert(*field);
            }
            Some(_) => {}
            None => {
                unknown.insert(crate::text::prefix_chars(&key, 64));
            }
        }
    }
    let mut problems: Vec<String> = unknown
        .iter()
        .take(MAX_NAMED)
        .map(|k| format!("unknown query parameter `{k}`"))
        .collect();
    if unknown.len() > MAX_NAMED {
        problems.push(format!(
            "{} more unknown query parameters",
            unknown.len() - MAX_NAMED
        ));
    }
    problems.extend(
        repeated
            .iter()
            .map(|k| format!("query parameter `{k}` is given more than once")),
    );
    if let Some(first) = problems.first() {
        return Err(Refusal::new(
            Reason::RequestMalformed,
            format!("malformed request: {first}"),
        )
        .with_details(json!({ "problems": problems })));
    }
    // The checks above leave nothing for the parser to refuse (every field is an
    // optional string); its error, should it have one, is still an answer.
    serde_urlencoded::from_str(query).map_err(|e| malformed(&format!("the query: {e}")))
}

/// The query of an endpoint that has no parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

impl Query for NoQuery {
    const FIELDS: &'static [&'static str] = &[];
}

/// `GET /v1/runs?status=&limit=&cursor=`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListRuns {
    status: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

impl Query for ListRuns {
    const FIELDS: &'static [&'static str] = &["status", "limit", "cursor"];
}

impl ListRuns {
    pub fn request(&self) -> Result<requests::ListRuns, Refusal> {
        requests::ListRuns::from_query(
            self.status.as_deref(),
            self.limit.as_deref(),
            self.cursor.as_deref(),
        )
    }
}

/// `GET /v1/runs/{run_id}/events?after_seq=&limit=`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunEvents {
    after_seq: Option<String>,
    limit: Option<String>,
}

impl Query for RunEvents {
    const FIELDS: &'static [&'static str] = &["after_seq", "limit"];
}

impl RunEvents {
    pub fn page(&self) -> Result<crate::gateway::EvidencePage, Refusal> {
        crate::gateway::EvidencePage::from_query(self.after_seq.as_deref(), self.limit.as_deref())
    }
}

/// `GET /v1/tools?role_id=&lane_id=` (absent reads as empty: refused by the gateway).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListTools {
    #[serde(default)]
    pub role_id: String,
    #[serde(default)]
    pub lane_id: String,
}

impl Query for ListTools {
    const FIELDS: &'static [&'static str] = &["role_id", "lane_id"];
}

/// `GET /v1/audit/events?run_id=&type=&after_seq=&limit=`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditEvents {
    run_id: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    after_seq: Option<String>,
    limit: Option<String>,
}

impl Query for AuditEvents {
    const FIELDS: &'static [&'static str] = &["run_id", "type", "after_seq", "limit"];
}

impl AuditEvents {
    /// The filter it asks for: `after_seq` 0 and `limit` 100 (clamped to 1-1000) when
    /// not given.
    pub fn filter(self) -> Result<EventFilter, Refusal> {
        let number = |name: &str, value: Option<&str>, default: u64| match value {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| {
                Refusal::new(
                    Reason::RequestMalformed,
                    format!("`{name}` must be a non-negative integer"),
                )
            }),
        };
        let mut event_types = Vec::new();
        if let Some(t) = &self.event_type {
            let parsed: EventType = serde_json::from_value(json!(t)).map_err(|_| {
                Refusal::new(
                    Reason::RequestMalformed,
                    format!("unknown event type `{t}`"),
                )
            })?;
            event_types.push(parsed);
        }
        Ok(EventFilter {
            event_types,
            after_seq: number("after_seq", self.after_seq.as_deref(), 0)?,
            limit: number("limit", self.limit.as_deref(), 100)?.clamp(1, 1000) as usize,
            run_id: self.run_id,
            ..EventFilter::default()
        })
    }
}

/// `GET /v1/artifacts/{sha256}?run_id=&role_id=`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub run_id: Option<String>,
    pub role_id: Option<String>,
}

impl Query for Artifact {
    const FIELDS: &'static [&'static str] = &["run_id", "role_id"];
}

/// `GET /v1/approvals?status=&run_id=&limit=&cursor=&order=`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListApprovals {
    status: Option<String>,
    run_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
    order: Option<String>,
}

impl Query for ListApprovals {
    const FIELDS: &'static [&'static str] = &["status", "run_id", "limit", "cursor", "order"];
}

impl ListApprovals {
    pub fn request(&self) -> Result<requests::ListApprovals, Refusal> {
        requests::ListApprovals::from_query(
            self.status.as_deref(),
            self.run_id.as_deref(),
            self.limit.as_deref(),
            self.cursor.as_deref(),
            self.order.as_deref(),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Every listed parameter is a field of its struct (a field missing from the list
    /// would be refused as unknown by `parse` before serde sees it).
    fn takes_all_its_fields<T: Query>() {
        let query: Vec<String> = T::FIELDS.iter().map(|f| format!("{f}=1")).collect();
        assert!(
            parse::<T>(Some(&query.join("&"))).is_ok(),
            "{:?}",
            T::FIELDS
        );
    }

    #[test]
    fn each_query_reads_exactly_its_parameters() {
        takes_all_its_fields::<NoQuery>();
        takes_all_its_fields::<ListRuns>();
        takes_all_its_fields::<RunEvents>();
        takes_all_its_fields::<ListTools>();
        takes_all_its_fields::<AuditEvents>();
        takes_all_its_fields::<Artifact>();
        takes_all_its_fields::<ListApprovals>();
        let tools = parse::<ListTools>(Some("role_id=a%20b&lane_id=")).unwrap();
        assert_eq!(
            (tools.role_id.as_str(), tools.lane_id.as_str()),
            ("a b", "")
        );
        assert!(parse::<NoQuery>(None).is_ok());
        assert!(parse::<NoQuery>(Some("")).is_ok());
    }

    #[test]
    fn unknown_and_repeated_parameters_are_refused_every_one_named() {
        let refusal = parse::<ListRuns>(Some("zeta=1&limit=5&alpha&limit=6&zeta=2")).unwrap_err();
        assert_eq!(refusal.reason, Reason::RequestMalformed);
        assert_eq!(
            refusal.message,
            "malformed request: unknown query parameter `alpha`"
        );
        assert_eq!(
            refusal.details["problems"],
            json!([
                "unknown query parameter `alpha`",
                "unknown query parameter `zeta`",
                "query parameter `limit` is given more than once"
            ])
        );
        let many: Vec<String> = (0..25).map(|i| format!("k{i:02}=1")).collect();
        let refusal = parse::<NoQuery>(Some(&many.join("&"))).unwrap_err();
        let problems = refusal.details["problems"].as_array().unwrap();
        assert_eq!(problems.len(), MAX_NAMED + 1);
        assert_eq!(problems[MAX_NAMED], "15 more unknown query parameters");
        let long = format!("{}=1", "x".repeat(5000));
        let refusal = parse::<NoQuery>(Some(&long)).unwrap_err();
        assert!(refusal.message.len() < 200, "{}", refusal.message);
    }
}
