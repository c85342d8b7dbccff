//! `toolgate approvals list|show|approve|deny`: the approvers' commands, against a
//! running server's API (`/v1/approvals`, docs/api.md). The bearer token is read from
//! an environment variable, never from the command line (where `ps` would show it).

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Exit, Format, refuse};

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// List approvals (default: the pending ones).
    List(ListArgs),
    /// Show one approval: the exact call, requester, run, policy versions, decisions.
    Show(ShowArgs),
    /// Approve an approval (as one of its approvers).
    Approve(DecideArgs),
    /// Deny an approval (as one of its approvers).
    Deny(DecideArgs),
}

/// Where the server is and who is asking.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8787")]
    pub server: String,
    /// The environment variable holding the bearer token (an approver's or admin's).
    #[arg(long, default_value = "TOOLGATE_TOKEN")]
    pub token_env: String,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// pending, approved, denied, expired, used, or all.
    #[arg(long, default_value = "pending")]
    pub status: String,
    /// Only the approvals of this run.
    #[arg(long)]
    pub run_id: Option<String>,
    /// At most this many (1 to 200).
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    pub approval_id: String,
}

#[derive(Debug, Args)]
pub struct DecideArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    pub approval_id: String,
    /// Why (recorded in the audit log; 1 to 1000 bytes).
    #[arg(long)]
    pub reason: String,
}

/// Runs an approvals command: 0 on success, 1 when the server refused or could not be
/// reached (the refusal is printed), 4 when the token variable is unset. With `--format
/// json` every outcome is one JSON object on stdout: the server's answer (its
/// `diagnostic` for a refusal), or for a failure here `{"status": "error", "kind":
/// "token" | "unreachable" | "answer", ...}`.
pub fn approvals_command(command: &ApprovalsCommand) -> Exit {
    let (server, request) = match command {
        ApprovalsCommand::List(a) => {
            let mut query = vec![format!("limit={}", a.limit)];
            if a.status != "all" {
                query.push(format!("status={}", encode(&a.status)));
            }
            if let Some(run) = &a.run_id {
                query.push(format!("run_id={}", encode(run)));
            }
            (
                &a.server,
                Request::Get(format!("/v1/approvals?{}", query.join("&"))),
            )
        }
        ApprovalsCommand::Show(a) => (
            &a.server,
            Request::Get(format!("/v1/approvals/{}", encode(&a.approval_id))),
        ),
        ApprovalsCommand::Approve(a) | ApprovalsCommand::Deny(a) => {
            let decision = match command {
                ApprovalsCommand::Approve(_) => "approve",
                _ => "deny",
            };
            (
                &a.server,
                Request::Post(
                    format!("/v1/approvals/{}/decision", encode(&a.approval_id)),
                    json!({ "decision": decision, "reason": a.reason }),
                ),
            )
        }
    };
    let Ok(token) = std::env::var(&server.token_env) else {
        return refuse(
            server.format,
            "token",
            &format!("${} is not set", server.token_env),
            Some("set the bearer token (an approver's or admin's) in that variable"),
            Exit::InvalidConfig,
        );
    };
    let runtime = match super::runtime(tokio::runtime::Builder::new_current_thread().enable_all()) {
        Ok(r) => r,
        Err(exit) => return exit,
    };
    let answer = runtime.block_on(send(&server.server, &token, request));
    let (status, body) = match answer {
        Ok(answer) => answer,
        Err(Unanswered { kind, message }) => {
            return refuse(server.format, kind, &message, None, Exit::Failure);
        }
    };
    if !(200..300).contains(&status) {
        let d = &body["diagnostic"];
        match server.format {
            Format::Json => println!("{body}"),
            Format::Text => eprintln!(
                "refused ({status} {}): {}\n  fix: {}",
                d["reason"].as_str().unwrap_or("?"),
                d["message"].as_str().unwrap_or("?"),
                d["suggested_fix"].as_str().unwrap_or("?")
            ),
        }
        return Exit::Failure;
    }
    match (server.format, command) {
        (Format::Json, _) => println!("{body}"),
        (Format::Text, ApprovalsCommand::List(_)) => {
            let approvals = body["approvals"].as_array().cloned().unwrap_or_default();
            if approvals.is_empty() {
                println!("no approvals");
            }
            for a in &approvals {
                println!("{}", summary(a));
            }
            if let Some(next) = body["next_cursor"].as_str() {
                println!("(more: the API's cursor {next})");
            }
        }
        (Format::Text, _) => print!("{}", details(&body)),
    }
    Exit::Ok
}

enum Request {
    Get(String),
    Post(String, Value),
}

/// Why there is no answer from the server to show: `kind` is `unreachable` (no answer
/// at all, or none within 30 s) or `answer` (an answer that is not the API's JSON).
struct Unanswered {
    kind: &'static str,
    message: String,
}

fn unreachable(message: String) -> Unanswered {
    Unanswered {
        kind: "unreachable",
        message,
    }
}

async fn send(base: &str, token: &str, request: Request) -> Result<(u16, Value), Unanswered> {
    let client = crate::outbound::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| unreachable(format!("cannot set up the HTTP client: {e}")))?;
    let base = base.trim_end_matches('/');
    let builder = match request {
        Request::Get(path) => client.get(format!("{base}{path}")),
        Request::Post(path, body) => client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string()),
    };
    let response = builder.bearer_auth(token).send().await.map_err(|e| {
        unreachable(format!(
            "cannot reach {base}: {}",
            crate::outbound::error_chain(&e)
        ))
    })?;
    let status = response.status().as_u16();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| unreachable(format!("cannot read the answer: {e}")))?;
    let body = serde_json::from_slice(&bytes).map_err(|e| Unanswered {
        kind: "answer",
        message: format!("the answer ({status}) is not JSON: {e}"),
    })?;
    Ok((status, body))
}

/// Percent-encodes a path segment or query value (everything but unreserved bytes).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One line: id, status, tool, run, requester, expiry.
fn summary(a: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    format!(
        "{}  {:8}  {}@{}  run {}  by {}  expires {}",
        s(&a["approval_id"]),
        s(&a["status"]),
        s(&a["binding"]["tool_name"]),
        s(&a["binding"]["tool_version"]),
        s(&a["binding"]["run_id"]),
        s(&a["requester"]["role_id"]),
        s(&a["expires_at"])
    )
}

/// The whole approval, field per line.
fn details(a: &Value) -> String {
    let b = &a["binding"];
    let mut out = format!("{}\n", summary(a));
    out.push_str(&format!(
        "  call      {} (lane {}, role {})\n",
        a["call_id"].as_str().unwrap_or("?"),
        b["lane_id"].as_str().unwrap_or("?"),
        b["role_id"].as_str().unwrap_or("?")
    ));
    out.push_str(&format!(
        "  arguments {} ({})\n",
        a["arguments"],
        a["redaction"].as_str().unwrap_or("?")
    ));
    out.push_str(&format!("  scope     {}\n", a["scope"]));
    out.push_str(&format!(
        "  digest    {}\n",
        a["call_digest"].as_str().unwrap_or("?")
    ));
    out.push_str(&format!("  policy    {}\n", b["policy_versions"]));
    for r in a["requirements"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  needs     {} of {} ({})\n",
            r["quorum"],
            r["approvers"],
            r["owner"].as_str().unwrap_or("?")
        ));
    }
    for d in a["decisions"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  decided   {} {} at {}: {}\n",
            d["approver"].as_str().unwrap_or("?"),
            d["decision"].as_str().unwrap_or("?"),
            d["at"].as_str().unwrap_or("?"),
            d["reason"].as_str().unwrap_or("")
        ));
    }
    if let Some(call) = a["used_by_call_id"].as_str() {
        out.push_str(&format!("  used by   {call}\n"));
    }
    out
}
