//! The seccomp filters of a confined process, built with `seccompiler` (no
//! hand-written BPF; docs/decisions.md says why).
//!
//! Two filters are installed, both allow-by-default deny lists:
//! - the deny list proper: system calls no tool needs and every escape or spying
//!   technique uses (ptrace, another process's memory, io_uring, bpf, mounts, kernel
//!   keyrings, modules, namespaces, ...) fail with EPERM; so does `socket` for the
//!   families the network mode forbids;
//! - `clone3`, whose flags live in memory a filter cannot read, fails with ENOSYS, so
//!   that the C library falls back to `clone`, whose namespace flags the first filter
//!   checks.
//!
//! A filter also kills the process on a system call made through another
//! architecture's entry (seccompiler checks the audit architecture); the x32 numbers
//! of the denied calls on x86_64 are denied too.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// What `socket` may create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sockets {
    /// Any family (the network is confined by a namespace).
    Any,
    /// AF_UNIX only (`network: none` without a network namespace).
    UnixOnly,
    /// AF_UNIX, and AF_INET/AF_INET6 stream sockets only (`network: {ports}`: Landlock
    /// filters TCP by port; UDP and raw sockets it cannot see are refused).
    UnixAndTcp,
}

/// The system calls that always fail with EPERM.
const DENIED: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "syslog",
    "kcmp",
    "lookup_dcookie",
    "fanotify_init",
    "personality",
    "iopl",
    "ioperm",
    "uselib",
];

/// Namespace flags of `clone`: a confined process creates no namespace.
const CLONE_NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// x86_64's x32 entry: the same calls with this bit set in the number.
#[cfg(target_arch = "x86_64")]
const X32_BIT: i64 = 0x4000_0000;

/// The two filters, ready to install (deny list first, then clone3).
pub fn filters(sockets: Sockets) -> Result<Vec<BpfProgram>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for name in DENIED {
        if let Some(nr) = number(name) {
            rules.insert(nr, Vec::new());
            #[cfg(target_arch = "x86_64")]
            rules.insert(nr | X32_BIT, Vec::new());
        }
    }
    // x32's own numbers of the calls whose arguments differ from x86_64's.
    #[cfg(target_arch = "x86_64")]
    for nr in [521_i64, 539, 540] {
        rules.insert(nr | X32_BIT, Vec::new());
    }
    // `clone` with any namespace flag: one rule per flag (rules are or-ed).
    if let Some(nr) = number("clone") {
        rules.insert(nr, any_bit(0, CLONE_NAMESPACES, &[])?);
    }
    let socket_rules = match sockets {
        Sockets::Any => Vec::new(),
        Sockets::UnixOnly => vec![rule(vec![cond(
            0,
            SeccompCmpOp::Ne,
            libc::AF_UNIX as u64,
        )?])?],
        Sockets::UnixAndTcp => {
            let mut found = vec![rule(vec![
                cond(0, SeccompCmpOp::Ne, libc::AF_UNIX as u64)?,
                cond(0, SeccompCmpOp::Ne, libc::AF_INET as u64)?,
                cond(0, SeccompCmpOp::Ne, libc::AF_INET6 as u64)?,
            ])?];
            // An inet socket whose type (low 4 bits; SOCK_NONBLOCK and SOCK_CLOEXEC sit
            // above them) is not SOCK_STREAM (1): bit 0 clear, or any of bits 1-3 set.
            for family in [libc::AF_INET, libc::AF_INET6] {
                let is_family = cond(0, SeccompCmpOp::Eq, family as u64)?;
                found.push(rule(vec![
                    is_family.clone(),
                    cond(1, SeccompCmpOp::MaskedEq(1), 0)?,
                ])?);
                found.extend(any_bit(1, 0b1110, &[is_family])?);
            }
            found
        }
    };
    if !socket_rules.is_empty()
        && let Some(nr) = number("socket")
    {
        rules.insert(nr, socket_rules);
    }
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let mut clone3 = BTreeMap::new();
    if let Some(nr) = number("clone3") {
        clone3.insert(nr, Vec::new());
    }
    let clone3 = SeccompFilter::new(
        clone3,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    Ok(vec![
        deny.try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())?,
        clone3
            .try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())?,
    ])
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions).map_err(|e| e.to_string())
}

/// Rules matching when any bit of `mask` is set in argument `arg` (one rule per bit,
/// each also holding `with`).
fn any_bit(arg: u8, mask: u64, with: &[SeccompCondition]) -> Result<Vec<SeccompRule>, String> {
    (0..64)
        .map(|bit| 1u64 << bit)
        .filter(|bit| mask & bit != 0)
        .map(|bit| {
            let mut conditions = with.to_vec();
            conditions.push(cond(arg, SeccompCmpOp::MaskedEq(bit), bit)?);
            rule(conditions)
        })
        .collect()
}

/// The number of a system call on this architecture.
fn number(name: &str) -> Option<i64> {
    let nr = match name {
        "ptrace" => libc::SYS_ptrace,
        "process_vm_readv" => libc::SYS_process_vm_readv,
        "process_vm_writev" => libc::SYS_process_vm_writev,
        "io_uring_setup" => libc::SYS_io_uring_setup,
        "io_uring_enter" => libc::SYS_io_uring_enter,
        "io_uring_register" => libc::SYS_io_uring_register,
        "bpf" => libc::SYS_bpf,
        "perf_event_open" => libc::SYS_perf_event_open,
        "userfaultfd" => libc::SYS_userfaultfd,
        "mount" => libc::SYS_mount,
        "umount2" => libc::SYS_umount2,
        "pivot_root" => libc::SYS_pivot_root,
        "chroot" => libc::SYS_chroot,
        "move_mount" => libc::SYS_move_mount,
        "open_tree" => libc::SYS_open_tree,
        "fsopen" => libc::SYS_fsopen,
        "fsconfig" => libc::SYS_fsconfig,
        "fsmount" => libc::SYS_fsmount,
        "fspick" => libc::SYS_fspick,
        "mount_setattr" => libc::SYS_mount_setattr,
        "keyctl" => libc::SYS_keyctl,
        "add_key" => libc::SYS_add_key,
        "request_key" => libc::SYS_request_key,
        "unshare" => libc::SYS_unshare,
        "setns" => libc::SYS_setns,
        "kexec_load" => libc::SYS_kexec_load,
        "kexec_file_load" => libc::SYS_kexec_file_load,
        "init_module" => libc::SYS_init_module,
        "finit_module" => libc::SYS_finit_module,
        "delete_module" => libc::SYS_delete_module,
        "open_by_handle_at" => libc::SYS_open_by_handle_at,
        "name_to_handle_at" => libc::SYS_name_to_handle_at,
        "swapon" => libc::SYS_swapon,
        "swapoff" => libc::SYS_swapoff,
        "reboot" => libc::SYS_reboot,
        "acct" => libc::SYS_acct,
        "quotactl" => libc::SYS_quotactl,
        "settimeofday" => libc::SYS_settimeofday,
        "clock_settime" => libc::SYS_clock_settime,
        "clock_adjtime" => libc::SYS_clock_adjtime,
        "adjtimex" => libc::SYS_adjtimex,
        "syslog" => libc::SYS_syslog,
        "kcmp" => libc::SYS_kcmp,
        "lookup_dcookie" => libc::SYS_lookup_dcookie,
        "fanotify_init" => libc::SYS_fanotify_init,
        "personality" => libc::SYS_personality,
        #[cfg(target_arch = "x86_64")]
        "iopl" => libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        "ioperm" => libc::SYS_ioperm,
        #[cfg(target_arch = "x86_64")]
        "uselib" => libc::SYS_uselib,
        "clone" => libc::SYS_clone,
        "clone3" => libc::SYS_clone3,
        "socket" => libc::SYS_socket,
        _ => return None,
    };
    Some(nr)
}
