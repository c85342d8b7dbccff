//! The golden request -> response examples of contract/examples/, read into typed
//! structs: a key the format does not know (a typo in a setup key included) fails the
//! example instead of being ignored.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

/// One file of contract/examples/.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Example {
    /// What the example shows, one line.
    pub description: String,
    pub setup: Setup,
    pub request: Request,
    pub response: Response,
}

/// What exists before the request is sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    /// The scope of the run the request names as `$RUN`.
    pub run_scope: Map<String, Value>,
    /// The run is created under another policy version (lanes.yaml's version changed),
    /// then the server restarts on the demo policy with the same data directory.
    #[serde(default)]
    pub run_under_other_policy: bool,
    /// An admin sets the run to this status first.
    #[serde(default)]
    pub run_status: Option<String>,
    /// Calls made first, each must succeed; a `draft_id` in an output becomes `$DRAFT`.
    #[serde(default)]
    pub before: Vec<Request>,
    /// The safety lock is engaged for the request (and released after it).
    #[serde(default)]
    pub safety_lock: bool,
    /// The request needs approval: it is sent once (answered `approval_required`), this
    /// token approves it, and the request is sent again with its `approval_id`.
    #[serde(default)]
    pub approved_by: Option<String>,
}

/// A tool call sent to `POST /v1/tool-calls`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The bearer token; empty for no Authorization header.
    pub token: String,
    /// The body as sent (any JSON: a malformed request is an example too), with `$RUN`
    /// and `$DRAFT` placeholders.
    pub body: Value,
}

/// What the gateway must answer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    pub http_status: u16,
    /// A subset of the body: every field here must be in the answer with this value
    /// (so a misspelled field fails as missing).
    pub body: Value,
}

impl Example {
    pub fn read(path: &Path) -> Example {
        let text = std::fs::read_to_string(path).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The expected `status` (`success`, `denied`, `failed`).
    pub fn status(&self) -> &str {
        self.response.body["status"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: response.body.status missing", self.description))
    }

    /// The expected diagnostic, or None for a success.
    pub fn diagnostic(&self) -> Option<&Value> {
        let d = &self.response.body["diagnostic"];
        (!d.is_null()).then_some(d)
    }

    /// Whether the request asks for a dry run.
    pub fn dry_run(&self) -> bool {
        self.request.body["dry_run"] == Value::Bool(true)
    }
}
