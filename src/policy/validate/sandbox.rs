//! Validation rules, sandbox: the `sandbox:` block of a command tool, a command phase
//! and a stdio MCP server.
//!
//! What is checked here needs only the registry and the file system: the shape
//! (`unconfined` alone, or `filesystem`, `network`, `limits`), each path (absolute or
//! relative to the registry's directory, no `..`, existing, no symlink on the way) and
//! each limit's bounds. What needs the running gateway (the data and key directories,
//! other tools' directories, the policy files) is checked when the adapters are built
//! (`sandbox::check_paths`), with the line and column kept in `SandboxPath`.

use std::path::{Component, PathBuf};

use super::*;
use crate::policy::model::{Sandbox, SandboxLimits, SandboxNetwork, SandboxPath, SandboxProfile};
use crate::policy::raw::{RawSandbox, RawSandboxNetwork};

/// The most paths one list may hold, and the most ports or hosts.
const MAX_PATHS: usize = 64;
const MAX_NETWORK_ENTRIES: usize = 64;

/// The profile of one `sandbox:` block (the default profile when `raw` is None).
pub(super) fn check_sandbox(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    raw: Option<&Spanned<RawSandbox>>,
    tools_dir: &Path,
) -> Option<Sandbox> {
    let Some(block) = raw else {
        return Some(Sandbox::default());
    };
    let before = report.problems.len();
    let RawSandbox {
        filesystem,
        network,
        limits,
        unconfined,
    } = &block.value;
    if let Some(reason) = unconfined {
        if filesystem.is_some() || network.is_some() || limits.is_some() {
            report.spanned(
                file,
                block,
                format!("{owner}: `sandbox.unconfined` cannot be combined with `filesystem`, `network` or `limits`"),
                "an unconfined process runs with none of them; remove `unconfined` to confine it",
            );
        }
        if reason.value.trim().is_empty() {
            report.spanned(
                file,
                reason,
                format!("{owner}: `sandbox.unconfined` needs a reason"),
                "say why this process cannot run confined, e.g. `unconfined: \"drives the host's GPU\"`",
            );
        }
        return (report.problems.len() == before).then(|| Sandbox::Unconfined {
            reason: reason.value.trim().to_string(),
        });
    }
    let mut profile = SandboxProfile {
        given: true,
        ..SandboxProfile::default()
    };
    if let Some(fs) = filesystem {
        for (name, list, out) in [
            ("read", &fs.value.read, &mut profile.read),
            ("write", &fs.value.write, &mut profile.write),
            ("exec", &fs.value.exec, &mut profile.exec),
        ] {
            if list.len() > MAX_PATHS {
                report.spanned(
                    file,
                    fs,
                    format!(
                        "{owner}: `sandbox.filesystem.{name}` lists more than {MAX_PATHS} paths"
                    ),
                    "give directories rather than their files",
                );
            }
            for entry in list {
                if let Some(path) = check_path(report, file, owner, name, entry, tools_dir) {
                    out.push(path);
                }
            }
            out.sort_by(|a, b| a.path.cmp(&b.path));
            out.dedup_by(|a, b| a.path == b.path);
        }
    }
    if let Some(network) = network
        && let Some(found) = check_network(report, file, owner, network)
    {
        profile.network = found;
    }
    if let Some(limits) = limits {
        let raw = &limits.value;
        let mut out = SandboxLimits::default();
        let given = [
            (&raw.cpu_s, &mut out.cpu_s),
            (&raw.memory_mb, &mut out.memory_mb),
            (&raw.processes, &mut out.processes),
            (&raw.open_files, &mut out.open_files),
            (&raw.file_size_mb, &mut out.file_size_mb),
        ];
        for ((value, slot), (name, least, most)) in given.into_iter().zip(SandboxLimits::BOUNDS) {
            let Some(value) = value else { continue };
            if (least..=most).contains(&value.value) {
                *slot = value.value;
            } else {
                report.spanned(
                    file,
                    value,
                    format!(
                        "{owner}: `sandbox.limits.{name}` is {}, not within {least}..={most}",
                        value.value
                    ),
                    "a limit of 0 would stop every tool; a larger one than the bound is no limit",
                );
            }
        }
        profile.limits = out;
    }
    (report.problems.len() == before).then_some(Sandbox::Confined(profile))
}

/// One profile path: resolved against the registry's directory, without `..`,
/// existing, and with no symlink at any component (a symlink could be pointed
/// elsewhere after the check).
fn check_path(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    list: &str,
    entry: &Spanned<String>,
    tools_dir: &Path,
) -> Option<SandboxPath> {
    let text = &entry.value;
    let mut problem = |message: String, help: &str| {
        report.spanned(
            file,
            entry,
            format!(
                "{owner}: `sandbox.filesystem.{list}` path `{}` {message}",
                text.escape_debug()
            ),
            help.to_string(),
        );
        None
    };
    if text.trim().is_empty() || text.contains('\0') {
        return problem(
            "is empty".into(),
            "give an absolute path or one relative to the registry's directory",
        );
    }
    let given = Path::new(text);
    if given.components().any(|c| c == Component::ParentDir) {
        return problem(
            "contains `..`".into(),
            "name the directory itself, absolute or below the registry's directory",
        );
    }
    let base = if tools_dir.is_absolute() {
        tools_dir.to_path_buf()
    } else {
        match std::env::current_dir() {
            Ok(cwd) => cwd.join(tools_dir),
            Err(_) => tools_dir.to_path_buf(),
        }
    };
    let absolute = if given.is_absolute() {
        given.to_path_buf()
    } else {
        base.join(given)
    };
    // The components, with `.` dropped; every prefix must be a real directory (or the
    // last a file), never a symlink.
    let mut walked = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::CurDir => continue,
            other => walked.push(other.as_os_str()),
        }
        match std::fs::symlink_metadata(&walked) {
            Err(_) => {
                return problem(
                    format!("does not exist (`{}`)", walked.display()),
                    "a profile names paths that exist when the policy loads",
                );
            }
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::canonicalize(&walked)
                    .map(|t| format!("; it points to `{}`", t.display()))
                    .unwrap_or_default();
                return problem(
                    format!("passes through the symlink `{}`{target}", walked.display()),
                    "name the real path: a symlink could be pointed elsewhere after the check",
                );
            }
            Ok(_) => {}
        }
    }
    Some(SandboxPath {
        path: walked,
        line: entry.referenced.line() as usize,
        column: entry.referenced.column() as usize,
    })
}

/// `none`, `{ports: [...]}` or `{connect: ["host:port", ...]}`.
fn check_network(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    network: &Spanned<RawSandboxNetwork>,
) -> Option<SandboxNetwork> {
    let mut problem = |message: String, help: &str| {
        report.spanned(
            file,
            network,
            format!("{owner}: `sandbox.network` {message}"),
            help.to_string(),
        );
        None
    };
    match &network.value {
        RawSandboxNetwork::Mode(mode) if mode == "none" => Some(SandboxNetwork::None),
        RawSandboxNetwork::Mode(mode) => problem(
            format!("is `{}`", mode.escape_debug()),
            "use `none`, `{ports: [443]}` or `{connect: [\"api.example.com:443\"]}`",
        ),
        RawSandboxNetwork::Rules(rules) => match (&rules.ports, &rules.connect) {
            (Some(ports), None) => {
                if ports.is_empty() || ports.len() > MAX_NETWORK_ENTRIES {
                    return problem(
                        format!("`ports` lists {} ports", ports.len()),
                        "list 1 to 64 TCP ports; for no network use `network: none`",
                    );
                }
                let mut out = Vec::new();
                for port in ports {
                    match u16::try_from(*port) {
                        Ok(p) if p > 0 => out.push(p),
                        _ => {
                            return problem(
                                format!("port {port} is not within 1..=65535"),
                                "a TCP port is 1 to 65535",
                            );
                        }
                    }
                }
                out.sort_unstable();
                out.dedup();
                Some(SandboxNetwork::Ports(out))
            }
            (None, Some(hosts)) => {
                if hosts.is_empty() || hosts.len() > MAX_NETWORK_ENTRIES {
                    return problem(
                        format!("`connect` lists {} hosts", hosts.len()),
                        "list 1 to 64 `host:port`s; for no network use `network: none`",
                    );
                }
                let mut out = Vec::new();
                for entry in hosts {
                    match parse_host_port(entry) {
                        Some(normal) => out.push(normal),
                        None => {
                            return problem(
                                format!(
                                    "`connect` entry `{}` is not `host:port`",
                                    entry.escape_debug()
                                ),
                                "a DNS name or an IP address, a colon and a port, e.g. `api.example.com:443` or `[::1]:8080`",
                            );
                        }
                    }
                }
                out.sort();
                out.dedup();
                Some(SandboxNetwork::Connect(out))
            }
            _ => problem(
                "needs exactly one of `ports` and `connect`".into(),
                "`{ports: [5432]}` allows TCP to those ports (any host); `{connect: [\"host:443\"]}` names hosts",
            ),
        },
    }
}

/// `host:port` in its normal form (host lowercased, IPv6 in brackets), or None.
pub(crate) fn parse_host_port(text: &str) -> Option<String> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    let host = host.to_ascii_lowercase();
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().ok()?;
        return Some(format!("[{inner}]:{port}"));
    }
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    name_ok.then(|| format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::parse_host_port;

    #[test]
    fn host_ports_are_normal() {
        assert_eq!(
            parse_host_port("API.example.com:443").as_deref(),
            Some("api.example.com:443")
        );
        assert_eq!(parse_host_port("[::1]:8080").as_deref(), Some("[::1]:8080"));
        assert_eq!(
            parse_host_port("127.0.0.1:80").as_deref(),
            Some("127.0.0.1:80")
        );
        assert_eq!(parse_host_port("localhost:0"), None);
        assert_eq!(parse_host_port("localhost"), None);
        assert_eq!(parse_host_port("a b:80"), None);
        assert_eq!(parse_host_port("[zz]:80"), None);
        assert_eq!(parse_host_port(":80"), None);
    }
}
