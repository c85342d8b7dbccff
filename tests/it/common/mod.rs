//! Test harness: starts the real `toolgate serve` binary on an ephemeral port with a
//! temporary data directory, and talks to it over real HTTP.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub mod demo;
pub mod fleet;
pub mod golden;
pub mod lab;
pub mod postgres;
pub mod python;
pub mod snapshot;

pub const BIN: &str = env!("CARGO_BIN_EXE_toolgate");

/// The binary a test server runs: `BIN`, or `TOOLGATE_TEST_BIN` when set (the soak
/// runs a release binary from a debug test build).
pub fn server_bin() -> String {
    std::env::var("TOOLGATE_TEST_BIN").unwrap_or_else(|_| BIN.to_string())
}

/// How often [`poll_until`] and [`poll_for`] look again.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Waits until `condition` holds, looking every 20 ms, for at most `within`; returns
/// whether it held. Tests synchronize on something they can observe (an event in the
/// log, a file, a process) through this, never on a fixed sleep.
pub fn poll_until(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    poll_for(within, || condition().then_some(())).is_some()
}

/// Waits until `probe` returns a value, looking every 20 ms, for at most `within`.
pub fn poll_for<T>(within: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// [`poll_until`] for async tests: yields to the runtime between looks, so the task
/// being waited for can run on a current-thread runtime.
pub async fn poll_until_async(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// The pids of the live children of `pid` (from /proc), e.g. the tool processes a
/// server is running right now.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            // /proc/<pid>/stat: `pid (comm) state ppid ...`; comm may hold spaces.
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = stat.rsplit_once(") ")?.1;
                    let mut fields = rest.split_whitespace();
                    let state = fields.next()?;
                    let ppid = fields.next()?.parse::<u32>().ok()?;
                    Some(ppid == pid && state != "Z")
                })
                .unwrap_or(false)
        })
        .collect()
}

/// The repository root (where the demo policy lives).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Copies the tree `from` (directories and regular files, as the demo policy and the
/// test fixtures hold) to `to`, creating `to` and its parents.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Runs the independent verifier, `audit/verify_export.py`, with the system `python3`
/// (it needs nothing beyond the standard library) on the export in `dir` with `args`.
pub fn verify_export_output(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("python3")
        .arg(repo().join("audit/verify_export.py"))
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
}

/// [`verify_export_output`]: its exit code (-1 if a signal ended it) and its stdout
/// followed by its stderr.
pub fn verify_export(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = verify_export_output(dir, args);
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

pub fn token(role: &str) -> String {
    format!("demo-{role}")
}

pub const ADMIN: &str = "demo-admin";

/// A running gateway.
pub struct Server {
    child: Option<Child>,
    pub base: String,
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    agent: ureq::Agent,
    /// The server's stderr (its log lines), the newest [`MAX_LOG_LINES`].
    logs: Arc<Mutex<VecDeque<String>>>,
}

const MAX_LOG_LINES: usize = 10_000;

/// How to start a server.
#[derive(Clone)]
pub struct Start {
    pub policy_dir: PathBuf,
    pub tools: PathBuf,
    pub data_dir: Option<PathBuf>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Start the server as this uid and gid (the test runs as root): toolgate as a
    /// non-root user.
    pub run_as: Option<(u32, u32)>,
}

impl Default for Start {
    fn default() -> Self {
        Start {
            policy_dir: repo().join("policy"),
            tools: repo().join("tools/tool_registry.yaml"),
            data_dir: None,
            args: Vec::new(),
            env: Vec::new(),
            run_as: None,
        }
    }
}

impl Server {
    /// The demo policy, a fresh data directory.
    pub fn start() -> Server {
        Server::start_with(Start::default())
    }

    pub fn start_with(start: Start) -> Server {
        Server::launch(start, None)
    }

    /// [`Server::start_with`], the server running under `umask` (octal, as the shell's
    /// `umask` builtin takes it), set by `sh` before it execs the server.
    pub fn start_under_umask(start: Start, umask: &str) -> Server {
        Server::launch(start, Some(umask))
    }

    fn launch(start: Start, umask: Option<&str>) -> Server {
        let (tmp, data_dir) = match start.data_dir {
            Some(d) => (None, d),
            None => {
                let t = tempfile::tempdir().unwrap();
                let d = t.path().join("var");
                (Some(t), d)
            }
        };
        let mut cmd = match umask {
            None => Command::new(server_bin()),
            Some(umask) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
                    .arg(server_bin());
                sh
            }
        };
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--policy-dir")
            .arg(&start.policy_dir)
            .arg("--tools")
            .arg(&start.tools)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(&start.args)
            .env("TOOLGATE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &start.env {
            cmd.env(k, v);
        }
        if let Some((uid, gid)) = start.run_as {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        let mut child = cmd.spawn().expect("start toolgate");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut base = None;
        while Instant::now() < deadline {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(addr) = line.strip_prefix("toolgate listening on ") {
                        base = Some(addr.trim().to_string());
                        break;
                    }
                }
                _ => break,
            }
        }
        let Some(base) = base else {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "server did not start: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(VecDeque::new()));
        let kept = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("TOOLGATE_TEST_STDERR").is_some() {
                    eprintln!("[server] {line}");
                }
                let mut kept = kept.lock().unwrap();
                if kept.len() == MAX_LOG_LINES {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Server {
            child: Some(child),
            base,
            data_dir,
            _tmp: tmp,
            agent,
            logs,
        }
    }

    /// The server's log lines that contain `needle`, waiting up to 5 s for the first
    /// (a call's log line is written just after its response).
    pub fn log_lines_with(&self, needle: &str) -> Vec<String> {
        let lines = || -> Vec<String> {
            self.logs
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(needle))
                .cloned()
                .collect()
        };
        poll_for(Duration::from_secs(5), || {
            Some(lines()).filter(|found| !found.is_empty())
        })
        .unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn db(&self) -> PathBuf {
        self.data_dir.join("audit.db")
    }

    /// Sends a raw request body.
    pub fn post_raw(&self, path: &str, token: Option<&str>, body: &[u8]) -> (u16, Value) {
        let mut req = self.agent.post(format!("{}{}", self.base, path));
        if let Some(t) = token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        let mut resp = req
            .header("Content-Type", "application/json")
            .send(body)
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        let value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        (status, value)
    }

    pub fn post(&self, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
        self.post_raw(path, token, body.to_string().as_bytes())
    }

    pub fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let mut req = self.agent.get(format!("{}{}", self.base, path));
        if let Some(t) = token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        let mut resp = req.call().unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        let value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        (status, value)
    }

    /// Creates a run bound to `scope` and returns its id.
    /// The text of `/metrics`.
    pub fn metrics(&self) -> String {
        ureq::get(format!("{}/metrics", self.base))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap()
    }

    pub fn create_run(&self, scope: Value) -> String {
        let (status, body) = self.post("/v1/runs", Some(ADMIN), &json!({ "scope": scope }));
        assert_eq!(status, 201, "{body}");
        body["run_id"].as_str().unwrap().to_string()
    }

    /// The demo's gated call: `research_agent` looks up case C-1001 in `run`
    /// (created with that case in scope).
    pub fn look_up_case(&self, run_id: &str) -> (u16, Value) {
        self.call(
            "research_agent",
            run_id,
            "research",
            "case_lookup",
            json!({}),
            json!({"case_id": "C-1001"}),
        )
    }

    /// Makes a tool call as `role` (with that role's demo token).
    pub fn call(
        &self,
        role: &str,
        run_id: &str,
        lane: &str,
        tool: &str,
        arguments: Value,
        scope: Value,
    ) -> (u16, Value) {
        let body = json!({
            "role_id": role, "run_id": run_id, "lane_id": lane, "tool_name": tool,
            "arguments": arguments, "scope": scope,
        });
        self.post("/v1/tool-calls", Some(&token(role)), &body)
    }

    /// Stops the server with SIGTERM and waits for it.
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        unsafe_free_kill(child.id(), "TERM");
        child.wait().unwrap()
    }

    /// Sends SIGTERM without waiting (to stop several servers at once).
    pub fn terminate(&self) {
        unsafe_free_kill(self.pid(), "TERM");
    }

    /// Waits, at most `within`, for the server to exit; its log lines stay readable.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let child = self.child.as_mut().unwrap();
        let status = poll_for(within, || child.try_wait().unwrap())
            .unwrap_or_else(|| panic!("the server did not exit within {within:?}"));
        self.child = None;
        status
    }

    /// Kills the server with SIGKILL.
    pub fn kill9(mut self) -> PathBuf {
        let mut child = self.child.take().unwrap();
        unsafe_free_kill(child.id(), "KILL");
        child.wait().unwrap();
        self.data_dir.clone()
    }
}

/// Sends a signal with the `kill` program (no unsafe code in tests).
pub fn unsafe_free_kill(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs the toolgate binary with `args` in `dir`; returns exit code, stdout, stderr.
pub fn run(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts that every field of `expected` is in `actual` with the same value
/// (objects are compared recursively; arrays and scalars exactly).
pub fn assert_subset(expected: &Value, actual: &Value, path: &str) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                let p = format!("{path}/{k}");
                let Some(av) = a.get(k) else {
                    panic!("missing {p} in {actual}")
                };
                assert_subset(v, av, &p);
            }
        }
        _ => assert_eq!(expected, actual, "at {path}"),
    }
}
