//! Test support for the MCP tests: the Python environment of the tests
//! (tests/it/common/python.rs) with the official Python MCP SDK (`mcp`) and the
//! reference server `mcp-server-time`, and a Node
//! package directory holding the official TypeScript SDK and the reference server
//! `@modelcontextprotocol/server-everything`; both created on first use under the
//! target directory and reused by later runs.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The directory of the test scripts (tests/mcp/).
pub fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// The test environment's Python (tests/it/common/python.rs), with `mcp` and
/// `mcp_server_time` importable.
pub fn python() -> PathBuf {
    common::python::python()
}

pub use crate::common::python::run_bounded;

/// The npm packages the tests install, pinned.
const NODE_PACKAGES: [&str; 2] = [
    "@modelcontextprotocol/sdk@1.32.2",
    "@modelcontextprotocol/server-everything@2026.8.31",
];
/// How long installing the npm packages may take, in all.
const NODE_INSTALL_LIMIT: Duration = Duration::from_secs(600);

/// The Node package directory: `TOOLGATE_TEST_NODE`, or `test-node` in the target
/// directory. Its `node_modules` holds [`NODE_PACKAGES`]; installs them when needed
/// and panics with a clear message when that fails (for example when the npm registry
/// cannot be reached).
pub fn node_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(prepare_node).clone()
}

fn prepare_node() -> PathBuf {
    let dir = std::env::var_os("TOOLGATE_TEST_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::python::venv_dir().with_file_name("test-node"));
    fs::create_dir_all(&dir).unwrap();
    let lock = File::create(dir.with_extension("lock")).unwrap();
    lock.lock().unwrap();
    if node_ready(&dir) {
        return dir;
    }
    let package_json = dir.join("package.json");
    if !package_json.exists() {
        fs::write(
            &package_json,
            r#"{"name":"toolgate-test-clients","private":true}"#,
        )
        .unwrap();
    }
    let out = run_bounded(
        Command::new("npm")
            .arg("install")
            .arg("--prefix")
            .arg(&dir)
            .args([
                "--no-audit",
                "--no-fund",
                "--fetch-timeout=60000",
                "--fetch-retries=1",
            ])
            .args(NODE_PACKAGES),
        NODE_INSTALL_LIMIT,
    );
    assert!(
        out.status.success() && node_ready(&dir),
        "could not install {NODE_PACKAGES:?} from the npm registry into {} \
         (is the registry reachable? is Node 20 with npm installed? set TOOLGATE_TEST_NODE \
         to a directory whose node_modules has them):\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

fn node_ready(dir: &Path) -> bool {
    let modules = dir.join("node_modules/@modelcontextprotocol");
    modules.join("sdk/package.json").exists()
        && modules.join("server-everything/package.json").exists()
}

/// Runs tests/mcp/client.mjs (the TypeScript SDK client) with `plan`; returns what it
/// printed, parsed. Bounded by `limit`.
pub fn node_client(plan: &serde_json::Value, limit: Duration) -> serde_json::Value {
    let dir = node_dir();
    // The script is copied next to node_modules so Node resolves the packages.
    let script = dir.join("client.mjs");
    fs::copy(scripts().join("client.mjs"), &script).unwrap();
    let out_file = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new("node")
        .arg(&script)
        .arg(plan.to_string())
        .stdin(Stdio::null())
        .stdout(out_file.reopen().unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node is installed");
    if !common::poll_until(limit, || child.try_wait().unwrap().is_some()) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the TypeScript client did not finish within {limit:?}");
    }
    let text = fs::read_to_string(out_file.path()).unwrap();
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("the TypeScript client printed no JSON ({e}): {text}"))
}

/// The entry script of `@modelcontextprotocol/server-everything` (run with `node`).
pub fn server_everything() -> PathBuf {
    node_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
}

/// A `sandbox:` block (YAML flow) for a test's stdio server: read on `read`, write on
/// `write`. Paths are made canonical: a profile path may pass
/// through no symlink.
pub fn sandbox(read: &[PathBuf], write: &[&Path]) -> String {
    let canonical = |p: &Path| fs::canonicalize(p).unwrap();
    let reads: Vec<PathBuf> = read.iter().map(|p| canonical(p)).collect();
    let writes: Vec<PathBuf> = write.iter().map(|p| canonical(p)).collect();
    format!(
        "{{filesystem: {{read: {}, write: {}}}}}",
        serde_json::json!(reads),
        serde_json::json!(writes)
    )
}

/// The system's Python, for servers that need only its standard library.
pub const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Opens `state` (a test's directory in a fresh temporary directory) to a confined
/// server: when the tests run as root the server runs as an unprivileged user, which
/// must traverse the temporary directory and write in `state`.
/// Returns the directory beside `state` holding a copy of tests/mcp/lab_server.py,
/// readable by that user (the checkout may sit where it cannot read).
pub fn open_to_sandbox(state: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(state).unwrap();
    let parent = state.parent().unwrap();
    fs::set_permissions(parent, fs::Permissions::from_mode(0o711)).unwrap();
    fs::set_permissions(state, fs::Permissions::from_mode(0o777)).unwrap();
    let bin = parent.join("lab-bin");
    fs::create_dir_all(&bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    fs::copy(scripts().join("lab_server.py"), bin.join("lab_server.py")).unwrap();
    bin
}

/// The `sandbox:` of a server run by the test environment's Python: that Python lives
/// under the home of the user running the tests, which the unprivileged user a
/// confined server runs as (when the tests run as root) cannot enter.
pub const UNCONFINED_PYTHON: &str =
    "{unconfined: \"the test environment's Python lives in a home the sandbox user cannot enter\"}";

/// The `sandbox:` of the Node reference server, installed under the build directory,
/// which may sit in a home the unprivileged sandbox user cannot enter.
pub const UNCONFINED_NODE: &str = "{unconfined: \"the test packages live under the build directory, which the sandbox user may not enter\"}";
