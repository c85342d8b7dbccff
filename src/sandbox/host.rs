//! What this host can enforce, and the process-wide sandbox settings `serve` gives
//! (the user a tool runs as when toolgate is root, where scratch directories go, the
//! key directory no profile may reach).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Serialize;

/// The uid and gid a tool runs as when toolgate runs as root, unless `serve` says
/// otherwise (`--sandbox-uid`): `nobody`.
pub const DEFAULT_RUN_AS: (u32, u32) = (65534, 65534);

/// The test-only switch (debug builds only): a comma-separated list of
/// `landlock-missing` (the kernel reports no Landlock) and `userns-refused` (no
/// namespace can be created, as under Docker's default seccomp profile).
pub const TEST_SWITCH_VAR: &str = "TOOLGATE_TEST_SANDBOX";

/// The process-wide sandbox settings.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// When toolgate runs as root, the tool runs as this uid and gid.
    pub run_as: (u32, u32),
    /// The directory under which each call's scratch directory is made.
    pub scratch_root: PathBuf,
    /// The audit key directory (never reachable from a profile).
    pub key_dir: Option<PathBuf>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            run_as: DEFAULT_RUN_AS,
            scratch_root: std::env::temp_dir(),
            key_dir: None,
        }
    }
}

static CONFIG: OnceLock<HostConfig> = OnceLock::new();

/// Sets the process-wide settings (once, by `serve` before the policy loads).
pub fn configure(config: HostConfig) {
    let _ = CONFIG.set(config);
}

/// The process-wide settings (the defaults when `serve` set none).
pub fn config() -> &'static HostConfig {
    CONFIG.get_or_init(HostConfig::default)
}

/// The test switches in force (always none in a release build).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TestSwitch {
    pub landlock_missing: bool,
    pub userns_refused: bool,
}

impl TestSwitch {
    pub fn current() -> TestSwitch {
        if !cfg!(debug_assertions) {
            return TestSwitch::default();
        }
        let value = std::env::var(TEST_SWITCH_VAR).unwrap_or_default();
        let has = |word: &str| value.split(',').any(|w| w.trim() == word);
        TestSwitch {
            landlock_missing: has("landlock-missing"),
            userns_refused: has("userns-refused"),
        }
    }
}

/// What this host can enforce (`toolgate doctor`, `/readyz`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Host {
    /// The Landlock ABI the kernel offers (0: none).
    pub landlock_abi: u32,
    pub seccomp: bool,
    /// Whether a namespace (user, pid, net) could be created by the launcher.
    pub namespaces: bool,
    pub root: bool,
    /// The guarantees and the mechanism each would hold by for the default profile
    /// (`network: none`), and for the other network modes.
    pub guarantees: Vec<(String, Option<String>)>,
}

impl Host {
    /// Probes this host: Landlock and seccomp from here, namespaces by starting the
    /// launcher in its probe mode (`toolgate sandbox-exec --probe`).
    pub fn probe() -> Host {
        let switch = TestSwitch::current();
        let landlock_abi = if switch.landlock_missing {
            0
        } else {
            landlock_abi()
        };
        let seccomp = seccomp_available();
        let namespaces = !switch.userns_refused && probe_namespaces();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let ns = |m: &str| namespaces.then(|| m.to_string());
        let or = |a: Option<String>, b: Option<String>| a.or(b);
        let guarantees = vec![
            (
                "filesystem".to_string(),
                (landlock_abi >= 3).then(|| format!("landlock_abi_{landlock_abi}")),
            ),
            (
                "network_none".to_string(),
                or(
                    ns("network_namespace"),
                    seccomp.then(|| "seccomp_unix_only".to_string()),
                ),
            ),
            (
                "network_ports".to_string(),
                (landlock_abi >= 4 && seccomp)
                    .then(|| "landlock_ports+seccomp_tcp_only".to_string()),
            ),
            (
                "network_connect".to_string(),
                ns("network_namespace+egress_proxy"),
            ),
            (
                "isolation".to_string(),
                or(
                    ns("pid_namespace"),
                    or(
                        (landlock_abi >= 6).then(|| "landlock_scope".to_string()),
                        root.then(|| "uid".to_string()),
                    ),
                ),
            ),
            (
                "syscalls".to_string(),
                seccomp.then(|| "seccomp".to_string()),
            ),
            ("limits".to_string(), Some("rlimit".to_string())),
        ];
        Host {
            landlock_abi,
            seccomp,
            namespaces,
            root,
            guarantees,
        }
    }

    /// Whether the default profile (`network: none`) can be enforced here.
    pub fn default_profile_enforceable(&self) -> bool {
        self.guarantees
            .iter()
            .filter(|(g, _)| !matches!(g.as_str(), "network_ports" | "network_connect"))
            .all(|(_, m)| m.is_some())
    }
}

static PROBED: OnceLock<Host> = OnceLock::new();

/// This host's probe, made once (serve's start) and kept for `/readyz`.
pub fn probe_once() -> &'static Host {
    PROBED.get_or_init(Host::probe)
}

/// The probe made at start, if any.
pub fn probed() -> Option<&'static Host> {
    PROBED.get()
}

/// Makes this process non-dumpable: a process of the same user (an unconfined tool)
/// can neither trace it nor read its memory or environment through /proc.
pub fn make_undumpable() {
    // SAFETY: prctl with these arguments only clears this process's dumpable flag.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
}

/// The Landlock ABI of the running kernel (0 when it has none).
pub fn landlock_abi() -> u32 {
    // SAFETY: with a null attribute, size 0 and the VERSION flag the call only returns
    // the ABI version (or an error); it touches no memory.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    u32::try_from(v).unwrap_or(0)
}

/// Whether seccomp filters can be installed (SECCOMP_GET_ACTION_AVAIL for ERRNO).
pub fn seccomp_available() -> bool {
    let action: u32 = 0x0005_0000; // SECCOMP_RET_ERRNO
    // SAFETY: the kernel reads one u32 from the pointer, which outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            2u32, // SECCOMP_GET_ACTION_AVAIL
            0u32,
            &action as *const u32,
        )
    };
    r == 0
}

/// Starts the launcher in probe mode: it tries the namespaces a call would use and
/// answers `ok` on stdout.
fn probe_namespaces() -> bool {
    let Ok(exe) = std::env::current_exe() else {
        return false;
    };
    std::process::Command::new(exe)
        .args(["sandbox-exec", "--probe"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .is_ok_and(|out| out.status.success() && out.stdout.starts_with(b"ok"))
}

/// Whether `inner` is `outer` or below it (by components).
pub fn is_within(inner: &Path, outer: &Path) -> bool {
    inner.starts_with(outer)
}
