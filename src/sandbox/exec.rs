//! The launcher (`toolgate sandbox-exec`): a fresh, single-threaded process that
//! confines a tool process and executes it.
//!
//! toolgate starts it with the [`LaunchSpec`] in [`SPEC_VAR`], the tool's stdin,
//! stdout and stderr, and the write end of the report pipe on fd 3. In order:
//! 1. every guarantee is matched to a mechanism this kernel offers, or the launcher
//!    reports `unavailable` and exits: nothing is executed;
//! 2. namespaces (user when not root, pid, net for `none` and `connect`) where the
//!    kernel allows them (else the other mechanisms hold);
//! 3. it forks: with a pid namespace the child is the namespace's init, which forks
//!    the tool's process and reaps; without one the launcher is a child subreaper;
//! 4. the tool's process: parent-death signal, working directory, uid and gid when
//!    toolgate is root, every capability dropped (bounding and ambient sets too),
//!    Landlock (`no_new_privs`), the seccomp filters, the `started` record, rlimits
//!    last, then `execve`;
//! 5. the waiter reports the exit status and the launcher the resource usage.
//!
//! INVARIANT: nothing is executed unless every guarantee held; this is the only
//! module of toolgate that forks (and it runs in no process but the launcher).

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitCode;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
};

use super::seccomp::{self, Sockets};
use super::{Enforced, LaunchSpec, NetworkSpec, REPORT_FD, Record, SPEC_VAR};

/// The launcher's exit code when it refused to execute the tool.
const REFUSED: u8 = 125;

/// Runs the launcher; `args` are the arguments after `sandbox-exec`.
pub fn main(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--probe") {
        return probe();
    }
    // SAFETY: fd 3 is the report pipe toolgate gave; taken once, never elsewhere.
    let mut report = unsafe { Report::open() };
    let spec = match std::env::var(SPEC_VAR)
        .map_err(|e| e.to_string())
        .and_then(|s| serde_json::from_str::<LaunchSpec>(&s).map_err(|e| e.to_string()))
    {
        Ok(spec) => spec,
        Err(e) => {
            report.send(&unavailable("launcher", &format!("no launch spec: {e}")));
            return ExitCode::from(REFUSED);
        }
    };
    match launch(&spec, &mut report) {
        Ok(code) => ExitCode::from(code),
        Err(record) => {
            report.send(&record);
            ExitCode::from(REFUSED)
        }
    }
}

/// The report pipe (fd 3); writes are single lines under PIPE_BUF, so a concurrent
/// writer (the init process of a pid namespace) never interleaves within one.
struct Report {
    file: Option<File>,
}

impl Report {
    /// # Safety
    /// Fd 3 must not be owned by anything else in this process.
    unsafe fn open() -> Report {
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let valid = unsafe { libc::fcntl(REPORT_FD, libc::F_GETFD) } >= 0;
        Report {
            // SAFETY: the caller guarantees fd 3 is ours alone.
            file: valid.then(|| unsafe { File::from_raw_fd(REPORT_FD) }),
        }
    }

    fn send(&mut self, record: &Record) {
        if let (Some(file), Ok(mut line)) = (&mut self.file, serde_json::to_vec(record)) {
            line.push(b'\n');
            let _ = file.write_all(&line);
        }
    }
}

fn boxed(guarantee: &str, detail: &str) -> Box<Record> {
    Box::new(unavailable(guarantee, detail))
}

fn unavailable(guarantee: &str, detail: &str) -> Record {
    Record::Unavailable {
        guarantee: guarantee.to_string(),
        detail: detail.to_string(),
    }
}

/// The mechanisms chosen for a spec on this kernel.
struct Chosen {
    abi: u32,
    enforced: Enforced,
    sockets: Sockets,
    pid_namespace: bool,
    user_namespace: bool,
}

/// What the host offers against what the spec needs: the Landlock ABI, or the
/// guarantee that cannot hold.
fn check_host(spec: &LaunchSpec, root: bool) -> Result<u32, Box<Record>> {
    let abi = if spec.landlock_missing {
        0
    } else {
        super::host::landlock_abi()
    };
    let seccomp = super::host::seccomp_available();
    if abi < 3 {
        return Err(boxed(
            "filesystem",
            &format!(
                "the kernel offers Landlock ABI {abi}; confining the file system needs ABI 3 (Linux 6.2) or later"
            ),
        ));
    }
    if !seccomp {
        return Err(boxed(
            "syscalls",
            "the kernel does not offer seccomp filters",
        ));
    }
    if let NetworkSpec::Ports(_) = spec.network
        && abi < 4
    {
        return Err(boxed(
            "network",
            &format!(
                "`network: {{ports}}` needs Landlock ABI 4 (Linux 6.7); the kernel offers ABI {abi}"
            ),
        ));
    }
    if spec.run_as.is_some() != root {
        return Err(boxed(
            "privileges",
            "the launch spec's user does not match the launcher's",
        ));
    }
    if spec.run_as.is_some_and(|(uid, gid)| uid == 0 || gid == 0) {
        return Err(boxed("privileges", "a tool never runs as root"));
    }
    Ok(abi)
}

/// Enters the namespaces the host allows and chooses the mechanism that holds each
/// guarantee (with whether a network namespace was entered).
fn choose(spec: &LaunchSpec, root: bool, abi: u32) -> Result<(Chosen, bool), Box<Record>> {
    // 2. namespaces
    let wants_net = matches!(spec.network, NetworkSpec::None | NetworkSpec::Proxy { .. });
    let (pid_namespace, net_namespace, user_namespace) = if spec.namespaces {
        enter_namespaces(root, wants_net)
    } else {
        (false, false, false)
    };
    let mut enforced = Enforced {
        filesystem: format!("landlock_abi_{abi}"),
        syscalls: "seccomp".to_string(),
        limits: "rlimit".to_string(),
        landlock_abi: abi,
        uid: spec.run_as.map_or_else(euid, |(uid, _)| uid),
        ..Enforced::default()
    };
    let sockets;
    (enforced.network, sockets) = match (&spec.network, net_namespace) {
        (NetworkSpec::None, true) => ("network_namespace".to_string(), Sockets::Any),
        (NetworkSpec::None, false) => ("seccomp_unix_only".to_string(), Sockets::UnixOnly),
        (NetworkSpec::Ports(_), _) => (
            "landlock_ports+seccomp_tcp_only".to_string(),
            Sockets::UnixAndTcp,
        ),
        (NetworkSpec::Proxy { .. }, true) => {
            ("network_namespace+egress_proxy".to_string(), Sockets::Any)
        }
        (NetworkSpec::Proxy { .. }, false) => {
            return Err(boxed(
                "network",
                "`network: {connect}` needs a network namespace, which this host refuses",
            ));
        }
    };
    enforced.isolation = if pid_namespace {
        "pid_namespace".to_string()
    } else if abi >= 6 {
        "landlock_scope".to_string()
    } else if root {
        "uid".to_string()
    } else {
        return Err(boxed(
            "isolation",
            "neither a pid namespace nor Landlock's scopes (ABI 6) are available to keep the tool from signalling toolgate",
        ));
    };
    enforced.privileges = match spec.run_as {
        Some((uid, _)) => format!("no_new_privs,uid_{uid},capabilities_dropped"),
        None => "no_new_privs,capabilities_dropped".to_string(),
    };
    for (on, name) in [
        (user_namespace, "user"),
        (pid_namespace, "pid"),
        (net_namespace, "net"),
    ] {
        if on {
            enforced.namespaces.push(name.to_string());
        }
    }
    let chosen = Chosen {
        abi,
        enforced,
        sockets,
        pid_namespace,
        user_namespace,
    };
    Ok((chosen, net_namespace))
}

fn launch(spec: &LaunchSpec, report: &mut Report) -> Result<u8, Box<Record>> {
    let root = euid() == 0;
    let abi = check_host(spec, root)?;
    let (chosen, net_namespace) = choose(spec, root, abi)?;
    let forwarder = match (&spec.network, net_namespace) {
        (NetworkSpec::Proxy { socket }, true) => {
            Some(super::proxy::Forwarder::bind(socket).map_err(|e| {
                boxed(
                    "network",
                    &format!("the egress forwarder could not start: {e}"),
                )
            })?)
        }
        _ => None,
    };
    // 3. fork
    if chosen.pid_namespace {
        // SAFETY: single-threaded process; the child only runs this function's code.
        match unsafe { libc::fork() } {
            -1 => Err(boxed("isolation", &last_error("fork"))),
            0 => {
                // The namespace's init.
                let code = init(spec, &chosen, forwarder, report);
                // SAFETY: _exit ends this process without running the parent's exit
                // handlers a second time.
                unsafe { libc::_exit(code) }
            }
            child => {
                release_stdio();
                Ok(wait_and_report(child, report, false))
            }
        }
    } else {
        // Orphans of the tool reparent here, and are killed when it ends.
        // SAFETY: prctl with these arguments only sets a flag on this process.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        match unsafe { libc::fork() } {
            -1 => Err(boxed("limits", &last_error("fork"))),
            0 => {
                let record = tool_process(spec, &chosen, report);
                report.send(&record);
                // SAFETY: see above.
                unsafe { libc::_exit(127) }
            }
            child => {
                release_stdio();
                Ok(wait_and_report(child, report, true))
            }
        }
    }
}

/// Points this process's stdin, stdout and stderr at /dev/null. Only the tool keeps the
/// pipes toolgate gave the launcher, so they close when the tool ends: a stdio MCP
/// server's death is seen at once, not when the launcher has reaped it and exited.
fn release_stdio() {
    // SAFETY: open, dup2 and close act only on this process's own descriptors.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for fd in 0..=2 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
}

/// The init of a pid namespace: starts the forwarder (if any) and the tool's process,
/// reaps every process of the namespace, and reports the tool's exit. Its exit ends
/// every process left in the namespace.
fn init(
    spec: &LaunchSpec,
    chosen: &Chosen,
    forwarder: Option<super::proxy::Forwarder>,
    report: &mut Report,
) -> i32 {
    // SAFETY: prctl only sets this process's parent-death signal.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if let Some(forwarder) = forwarder {
        // SAFETY: single-threaded; the child runs only the forwarder.
        match unsafe { libc::fork() } {
            -1 => {
                report.send(&unavailable("network", &last_error("fork")));
                return i32::from(REFUSED);
            }
            0 => {
                release_stdio();
                forwarder.serve();
                // SAFETY: see `launch`.
                unsafe { libc::_exit(0) }
            }
            _ => drop(forwarder),
        }
    }
    // SAFETY: single-threaded; the child runs only `tool_process`.
    let tool = match unsafe { libc::fork() } {
        -1 => {
            report.send(&unavailable("limits", &last_error("fork")));
            return i32::from(REFUSED);
        }
        0 => {
            let record = tool_process(spec, chosen, report);
            report.send(&record);
            // SAFETY: see `launch`.
            unsafe { libc::_exit(127) }
        }
        pid => pid,
    };
    release_stdio();
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == tool {
            report.send(&exited(status));
            return exit_code(status);
        }
        if pid < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    }
}

/// Waits for `child` (with its resource usage), reports its exit (unless the init of
/// a pid namespace did) and the usage; returns the exit code the launcher ends with.
fn wait_and_report(child: libc::pid_t, report: &mut Report, report_exit: bool) -> u8 {
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: zeroed rusage is a valid value; wait4 fills it in.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: pointers to locals.
        let pid = unsafe { libc::wait4(child, &mut status, 0, &mut usage) };
        if pid == child {
            break (status, usage);
        }
        if pid < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    };
    if report_exit {
        report.send(&exited(status));
        kill_orphans();
    }
    let ms = |t: libc::timeval| (t.tv_sec as u64) * 1000 + (t.tv_usec as u64) / 1000;
    report.send(&Record::Usage {
        cpu_ms: ms(usage.ru_utime) + ms(usage.ru_stime),
        maxrss_kb: usage.ru_maxrss.max(0) as u64,
    });
    u8::try_from(exit_code(status)).unwrap_or(1)
}

/// Kills and reaps every process left reparented to the launcher (a subreaper).
fn kill_orphans() {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    for _ in 0..1000 {
        let list =
            std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap_or_default();
        let children: Vec<libc::pid_t> = list
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if children.is_empty() {
            return;
        }
        for pid in children {
            // SAFETY: signals a child of this process, then reaps it.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

fn exited(status: i32) -> Record {
    if libc::WIFSIGNALED(status) {
        Record::Exited {
            code: None,
            signal: Some(libc::WTERMSIG(status)),
        }
    } else {
        Record::Exited {
            code: Some(libc::WEXITSTATUS(status)),
            signal: None,
        }
    }
}

fn exit_code(status: i32) -> i32 {
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// Enters the namespaces this host allows: (pid, net, user). When toolgate is root
/// no user namespace is needed; otherwise one maps the caller's own uid and gid.
fn enter_namespaces(root: bool, net: bool) -> (bool, bool, bool) {
    let user = if root { 0 } else { libc::CLONE_NEWUSER };
    let net_flag = if net { libc::CLONE_NEWNET } else { 0 };
    let (uid, gid) = (euid(), egid());
    // SAFETY: unshare only changes this single-threaded process's namespaces.
    if unsafe { libc::unshare(user | libc::CLONE_NEWPID | net_flag) } != 0 {
        return (false, false, false);
    }
    if !root {
        let mapped = std::fs::write("/proc/self/setgroups", "deny")
            .and_then(|()| std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")))
            .and_then(|()| std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")));
        if mapped.is_err() {
            // The process is in a user namespace without a mapping: it can create
            // nothing; such a host is treated as one refusing namespaces.
            return (false, false, false);
        }
    }
    if net {
        bring_loopback_up();
    }
    (true, net, !root)
}

/// Brings up `lo` in a new network namespace (the egress forwarder listens on it).
fn bring_loopback_up() {
    // SAFETY: a socket used only for the ioctl, closed below; the ifreq is a local.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return;
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        libc::close(fd);
    }
}

/// The tool's process: confines itself and executes the tool. Returns only on failure
/// (the record to send).
fn tool_process(spec: &LaunchSpec, chosen: &Chosen, report: &mut Report) -> Record {
    // SAFETY: prctl only sets this process's parent-death signal.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if let Err(e) = std::env::set_current_dir(&spec.working_dir) {
        return unavailable(
            "filesystem",
            &format!("cannot enter `{}`: {e}", spec.working_dir.display()),
        );
    }
    if let Err(detail) = drop_privileges(spec, chosen) {
        return unavailable("privileges", &detail);
    }
    if let Err(detail) = landlock(spec, chosen) {
        return unavailable("filesystem", &detail);
    }
    // Everything execve needs, prepared before the filters and the limits.
    let prepared = match prepare_exec(spec) {
        Ok(p) => p,
        Err(detail) => return Record::ExecFailed { detail },
    };
    let filters = match seccomp::filters(chosen.sockets) {
        Ok(f) => f,
        Err(detail) => return unavailable("syscalls", &detail),
    };
    for filter in &filters {
        if let Err(e) = seccompiler::apply_filter(filter) {
            return unavailable("syscalls", &e.to_string());
        }
    }
    report.send(&Record::Started(chosen.enforced.clone()));
    if let Err(detail) = set_limits(spec) {
        return unavailable("limits", &detail);
    }
    // SAFETY: marks every descriptor from 3 up close-on-exec (the report pipe too).
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            REPORT_FD as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    let (program, argv, envp) = &prepared;
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp_ptrs: Vec<*const libc::c_char> = envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // SAFETY: NUL-terminated strings and null-terminated pointer arrays that outlive
    // the call; execve returns only on failure.
    unsafe { libc::execve(program.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    Record::ExecFailed {
        detail: format!(
            "cannot execute `{}`: {}",
            spec.program.display(),
            std::io::Error::last_os_error()
        ),
    }
}

type Prepared = (CString, Vec<CString>, Vec<CString>);

/// The program, argv and environment (without the spec; with the proxy variables in
/// `connect` mode) as C strings.
fn prepare_exec(spec: &LaunchSpec) -> Result<Prepared, String> {
    let c = |b: &[u8]| CString::new(b).map_err(|_| "a nul byte in the command".to_string());
    let program = c(spec.program.as_os_str().as_bytes())?;
    let argv = spec
        .argv
        .iter()
        .map(|a| c(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut envp = Vec::new();
    for (k, v) in std::env::vars_os() {
        if k.as_bytes() == SPEC_VAR.as_bytes() || k.as_bytes().starts_with(b"TOOLGATE_PROXY_") {
            continue;
        }
        let mut entry = k.as_bytes().to_vec();
        entry.push(b'=');
        entry.extend_from_slice(v.as_bytes());
        envp.push(c(&entry)?);
    }
    if let NetworkSpec::Proxy { .. } = spec.network
        && let Some(port) = super::proxy::forwarder_port()
    {
        let url = format!("http://127.0.0.1:{port}");
        for name in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            envp.push(c(format!("{name}={url}").as_bytes())?);
        }
        envp.push(c(b"NO_PROXY=")?);
    }
    Ok((program, argv, envp))
}

/// Drops to the tool's user (toolgate root) and every capability, in every set.
fn drop_privileges(spec: &LaunchSpec, chosen: &Chosen) -> Result<(), String> {
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .unwrap_or(63);
    if spec.run_as.is_some() || chosen.user_namespace {
        for cap in 0..=last_cap {
            // SAFETY: prctl drops one capability from the bounding set.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
            {
                return Err(last_error("dropping the capability bounding set"));
            }
        }
    }
    if let Some((uid, gid)) = spec.run_as {
        // SAFETY: plain system calls on this process's credentials.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0 {
                return Err(last_error("setgroups"));
            }
            if libc::setresgid(gid, gid, gid) != 0 {
                return Err(last_error("setresgid"));
            }
            if libc::setresuid(uid, uid, uid) != 0 {
                return Err(last_error("setresuid"));
            }
        }
        if euid() == 0 || unsafe { libc::getuid() } == 0 {
            return Err("the tool's process is still root".to_string());
        }
    }
    // SAFETY: clears the ambient set, then the effective, permitted and inheritable
    // sets (a zeroed capability header and data of version 3).
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let mut header = Header {
            version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
            pid: 0,
        };
        let data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
            return Err(last_error("capset"));
        }
    }
    Ok(())
}

/// Landlock: the file system (and connect ports), the scopes; sets `no_new_privs`.
fn landlock(spec: &LaunchSpec, chosen: &Chosen) -> Result<(), String> {
    let abi = ABI::from(i32::try_from(chosen.abi).unwrap_or(i32::MAX));
    let err = |e: landlock::RulesetError| e.to_string();
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    if let NetworkSpec::Ports(_) = spec.network {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(err)?;
    }
    if chosen.abi >= 6 {
        ruleset = ruleset
            .scope(Scope::Signal | Scope::AbstractUnixSocket)
            .map_err(err)?;
    }
    let mut created = ruleset.create().map_err(err)?;
    let read = AccessFs::from_read(abi);
    let exec = read | AccessFs::Execute;
    let all = AccessFs::from_all(abi);
    for (paths, access) in [(&spec.read, read), (&spec.exec, exec), (&spec.write, all)] {
        for path in paths {
            let Some(rule) = path_rule(path, access, abi)? else {
                continue;
            };
            created = created.add_rule(rule).map_err(err)?;
        }
    }
    if let NetworkSpec::Ports(ports) = &spec.network {
        for port in ports {
            created = created
                .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                .map_err(err)?;
        }
    }
    let status = created.restrict_self().map_err(err)?;
    if status.ruleset != landlock::RulesetStatus::FullyEnforced || !status.no_new_privs {
        return Err(format!("Landlock was not fully enforced: {status:?}"));
    }
    Ok(())
}

/// A rule for `path`, with only the file rights when it is not a directory; None
/// when the path has gone since the plan was made (nothing to grant).
fn path_rule(
    path: &Path,
    access: landlock::BitFlags<AccessFs>,
    abi: ABI,
) -> Result<Option<PathBeneath<PathFd>>, String> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(None);
    };
    let access = if meta.is_dir() {
        access
    } else {
        access & AccessFs::from_file(abi)
    };
    let fd = PathFd::new(path).map_err(|e| e.to_string())?;
    Ok(Some(PathBeneath::new(fd, access)))
}

/// The rlimits: CPU (soft at `cpu_s`, SIGXCPU; hard one second later, SIGKILL),
/// address space, processes, open files, file size, no core files.
fn set_limits(spec: &LaunchSpec) -> Result<(), String> {
    let l = &spec.limits;
    let mb = 1024 * 1024;
    let limits = [
        (libc::RLIMIT_CPU, l.cpu_s, l.cpu_s.saturating_add(1)),
        (
            libc::RLIMIT_FSIZE,
            l.file_size_mb.saturating_mul(mb),
            l.file_size_mb.saturating_mul(mb),
        ),
        (libc::RLIMIT_NPROC, l.processes, l.processes),
        (libc::RLIMIT_NOFILE, l.open_files, l.open_files),
        (libc::RLIMIT_CORE, 0, 0),
        // Last: the launcher allocates nothing after this.
        (
            libc::RLIMIT_AS,
            l.memory_mb.saturating_mul(mb),
            l.memory_mb.saturating_mul(mb),
        ),
    ];
    for (resource, soft, hard) in limits {
        let limit = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        // SAFETY: a pointer to a local.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(last_error("setrlimit"));
        }
    }
    Ok(())
}

/// Probe mode: whether the namespaces a call would use can be created here.
fn probe() -> ExitCode {
    let root = euid() == 0;
    let (pid, _, _) = enter_namespaces(root, true);
    println!("{}", if pid { "ok" } else { "no" });
    ExitCode::SUCCESS
}

fn euid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

fn egid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::getegid() }
}

fn last_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}
