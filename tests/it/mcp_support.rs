//! Test support for the MCP tests: a Python virtual environment holding the official
//! Python MCP SDK (`mcp`) and the reference server `mcp-server-time`, created on
//! first use under the target directory and reused by later runs.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The packages the tests install, pinned so every machine runs the same clients.
const PACKAGES: [&str; 2] = ["mcp==2.3.0", "mcp-server-time==2026.10.19"];
/// How long creating the environment and installing may take, in all.
const INSTALL_LIMIT: Duration = Duration::from_secs(900);

/// The directory of the test scripts (tests/mcp/).
pub fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// Where the environment lives: `TOOLGATE_TEST_VENV`, or `test-venv` in the target
/// directory (next to `debug/`).
fn venv_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TOOLGATE_TEST_VENV") {
        return PathBuf::from(dir);
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_toolgate"));
    bin.parent()
        .and_then(Path::parent)
        .expect("the binary lives in <target>/<profile>/")
        .join("test-venv")
}

/// The environment's Python, with `mcp` and `mcp_server_time` importable. Creates
/// and fills the environment when needed; panics with a clear message if that fails
/// (for example when PyPI cannot be reached).
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(prepare).clone()
}

fn prepare() -> PathBuf {
    let venv = venv_dir();
    let python = venv.join("bin/python");
    fs::create_dir_all(venv.parent().unwrap()).unwrap();
    // One installer at a time across test binaries running in parallel.
    let lock = File::create(venv.with_extension("lock")).unwrap();
    lock.lock().unwrap();
    if ready(&python) {
        return python;
    }
    let started = Instant::now();
    if !python.exists() {
        let out = run_bounded(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            INSTALL_LIMIT,
        );
        assert!(
            out.status.success(),
            "could not create the test virtualenv at {} with `python3 -m venv` \
             (install python3 and its venv module):\n{}",
            venv.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let left = INSTALL_LIMIT.saturating_sub(started.elapsed());
    let out = run_bounded(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                "--timeout",
                "60",
            ])
            .args(PACKAGES),
        left,
    );
    assert!(
        out.status.success() && ready(&python),
        "could not install {PACKAGES:?} from PyPI into the test virtualenv {} \
         (is PyPI reachable? set TOOLGATE_TEST_VENV to a virtualenv that has them):\n{}",
        venv.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    python
}

fn ready(python: &Path) -> bool {
    python.exists()
        && Command::new(python)
            .args(["-c", "import mcp, mcp_server_time, httpx2, uvicorn"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// Runs `command` to completion, killing it if it runs longer than `limit`.
/// Its stderr goes to a file (a pipe nobody reads could fill up and stall it).
fn run_bounded(command: &mut Command, limit: Duration) -> Output {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{command:?}` did not finish within {} s:\n{}",
                limit.as_secs(),
                fs::read_to_string(log.path()).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: Vec::new(),
        stderr: fs::read(log.path()).unwrap_or_default(),
    }
}
