//! The registry's `secrets:`: outbound credentials the agent never holds, read at load
//! (and again at every reload) from an environment variable or a file, and used only
//! by reference, `${secret:ID}`, in an adapter's `headers`, its `auth` settings and a
//! stdio server's `env`. `${env:VAR}` stands in urls, hosts and ports and is resolved
//! at load.
//!
//! INVARIANT: a secret's value is held only in a [`SecretValue`], which never prints
//! (its `Debug` says `[secret]`) and is never serialized: the policy's serialized form,
//! its versions, `policy explain` and `policy diff` carry ids and sources only.
//! INVARIANT: a secret file is read only when it is a regular file that no one but its
//! owner can write and others cannot read (its group may read it when the group is one
//! of the process's own), reached through symlinks only while they stay inside the
//! secret's directory.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

/// The largest secret value read, from a file or an environment variable.
pub const MAX_SECRET_BYTES: u64 = 64 * 1024;
/// The shortest secret value accepted: a shorter one could not be scrubbed from an
/// upstream's error text without destroying the text.
pub const MIN_SECRET_BYTES: usize = 8;

/// Where a secret's value is read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretSource {
    /// An environment variable of the sidecar's process.
    Env(String),
    /// A file (relative paths resolve against the registry's directory).
    File(PathBuf),
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Env(var) => write!(f, "env `{var}`"),
            SecretSource::File(path) => write!(f, "file `{}`", path.display()),
        }
    }
}

/// A secret's value. Never printed, never serialized.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Arc<str>);

impl SecretValue {
    pub fn new(value: &str) -> SecretValue {
        SecretValue(Arc::from(value))
    }

    /// The value, for the one place that sends it (an outbound request's header, a
    /// token request's form, a process's environment).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[secret]")
    }
}

/// One `secrets:` entry, its value read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Secret {
    pub id: String,
    pub source: SecretSource,
    #[serde(skip)]
    pub value: SecretValue,
}

/// The registry's secrets by id.
pub type Secrets = BTreeMap<String, Secret>;

/// Text with `${secret:ID}` references: literal pieces and secret ids, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretPart {
    Literal(String),
    Secret(String),
}

/// Splits `text` at its `${secret:ID}` references. Any other `${...}` is an error (an
/// `${env:VAR}` does not stand in these places).
pub fn secret_parts(text: &str) -> Result<Vec<SecretPart>, String> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        if i > 0 {
            parts.push(SecretPart::Literal(rest[..i].to_string()));
        }
        let after = &rest[i + 2..];
        let Some(end) = after.find('}') else {
            return Err("a `${` without its `}`".to_string());
        };
        let inner = &after[..end];
        match inner.strip_prefix("secret:") {
            Some(id) if super::validate::is_id(id) => {
                parts.push(SecretPart::Secret(id.to_string()))
            }
            Some(id) => {
                return Err(format!(
                    "`${{secret:{}}}` does not name a secret id",
                    id.escape_debug()
                ));
            }
            None => {
                return Err(format!(
                    "`${{{}}}` is not `${{secret:ID}}` (only a secret reference stands here)",
                    inner.escape_debug()
                ));
            }
        }
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        parts.push(SecretPart::Literal(rest.to_string()));
    }
    Ok(parts)
}

/// The ids `text` refers to (none for text that does not parse).
pub fn secret_ids(text: &str) -> Vec<String> {
    secret_parts(text)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| match p {
            SecretPart::Secret(id) => Some(id),
            SecretPart::Literal(_) => None,
        })
        .collect()
}

/// `text` with every `${secret:ID}` replaced by its value; None when a reference does
/// not parse or names no secret of `secrets` (never after a successful load).
pub fn resolve(text: &str, secrets: &Secrets) -> Option<String> {
    let mut out = String::new();
    for part in secret_parts(text).ok()? {
        match part {
            SecretPart::Literal(s) => out.push_str(&s),
            SecretPart::Secret(id) => out.push_str(secrets.get(&id)?.value.expose()),
        }
    }
    Some(out)
}

/// Replaces every `${env:VAR}` of `text` with the variable's value; records each in
/// `resolved`. A variable that is unset, empty, or holds a character that could change
/// a url's shape (anything but letters, digits, `.`, `-`, `_`, `:`, `[` and `]`) is an
/// error. Any other `${...}` is left for the caller's own checks.
pub fn resolve_env(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    resolved: &mut BTreeMap<String, String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("${env:") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 6..];
        let Some(end) = after.find('}') else {
            return Err("a `${env:` without its `}`".to_string());
        };
        let var = &after[..end];
        if !super::validate::is_env_var_name(var) {
            return Err(format!(
                "`${{env:{}}}` does not name an environment variable",
                var.escape_debug()
            ));
        }
        let value = env(var).unwrap_or_default();
        if value.is_empty() {
            return Err(format!("environment variable `{var}` is not set"));
        }
        if value.len() > 255
            || !value.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'[' | b']')
            })
        {
            return Err(format!(
                "environment variable `{var}` holds a character that does not belong in a host or port"
            ));
        }
        out.push_str(&value);
        resolved.insert(var.to_string(), value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Reads a secret from the environment: set, within the size bounds, one line.
pub fn read_env_secret(
    var: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<SecretValue, String> {
    let Some(value) = env(var) else {
        return Err(format!("environment variable `{var}` is not set"));
    };
    checked_value(value)
}

/// Reads a secret file under the rules of the module's invariant. A trailing newline
/// is dropped (files written with `echo` end with one).
pub fn read_file_secret(path: &Path) -> Result<SecretValue, String> {
    let bytes = read_private_file(path)?;
    let text = String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_string())?;
    let text = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text)
        .to_string();
    checked_value(text)
}

/// Reads a private file (a secret, a TLS client key) under the rules of the module's
/// invariant, at most [`MAX_SECRET_BYTES`].
pub fn read_private_file(path: &Path) -> Result<Vec<u8>, String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    let target = if meta.file_type().is_symlink() {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let dir = dir
            .canonicalize()
            .map_err(|e| format!("cannot resolve its directory: {e}"))?;
        let target = path
            .canonicalize()
            .map_err(|e| format!("cannot resolve the symlink: {e}"))?;
        if !target.starts_with(&dir) {
            return Err(format!(
                "it is a symlink leading out of its directory (to `{}`)",
                target.display()
            ));
        }
        target
    } else {
        path.to_path_buf()
    };
    let mut file = crate::localfile::open(&target).map_err(|e| match e {
        crate::localfile::ReadError::NotAFile => {
            "it is not a regular file (a FIFO, device or directory)".to_string()
        }
        other => format!("cannot read it: {other}"),
    })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read it: {e}"))?;
    permission_problem(meta.mode(), meta.gid(), &own_groups()).map_or(Ok(()), Err)?;
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_SECRET_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_SECRET_BYTES {
        return Err(format!("it is larger than {MAX_SECRET_BYTES} bytes"));
    }
    Ok(bytes)
}

/// Why a file of `mode` owned by group `gid` may not hold a secret, if it may not.
pub fn permission_problem(mode: u32, gid: u32, own_groups: &[u32]) -> Option<String> {
    if mode & 0o002 != 0 || mode & 0o020 != 0 {
        return Some(format!(
            "its mode {:04o} lets others than its owner write it",
            mode & 0o7777
        ));
    }
    if mode & 0o004 != 0 {
        return Some(format!(
            "its mode {:04o} lets anyone read it",
            mode & 0o7777
        ));
    }
    if mode & 0o040 != 0 && !own_groups.contains(&gid) {
        return Some(format!(
            "its mode {:04o} lets group {gid} read it, which is not a group of this process",
            mode & 0o7777
        ));
    }
    None
}

/// The process's effective group and its supplementary groups.
fn own_groups() -> Vec<u32> {
    // SAFETY: getegid cannot fail and touches no memory of ours.
    let mut groups = vec![unsafe { libc::getegid() }];
    let mut buffer = vec![0 as libc::gid_t; 256];
    // SAFETY: the buffer holds 256 entries and its length is passed.
    let n = unsafe { libc::getgroups(buffer.len() as libc::c_int, buffer.as_mut_ptr()) };
    if let Ok(n) = usize::try_from(n) {
        groups.extend(buffer.iter().take(n).copied());
    }
    groups
}

fn checked_value(value: String) -> Result<SecretValue, String> {
    if value.len() as u64 > MAX_SECRET_BYTES {
        return Err(format!("it is larger than {MAX_SECRET_BYTES} bytes"));
    }
    if value.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "its value is shorter than {MIN_SECRET_BYTES} bytes (too short to scrub from an upstream's answers)"
        ));
    }
    if value.bytes().any(|b| b == b'\n' || b == b'\r' || b == 0) {
        return Err("its value holds a line break or a NUL byte".to_string());
    }
    Ok(SecretValue::new(&value))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        assert_eq!(
            secret_parts("Bearer ${secret:api_key}").unwrap(),
            vec![
                SecretPart::Literal("Bearer ".into()),
                SecretPart::Secret("api_key".into())
            ]
        );
        assert!(secret_parts("${secret:Bad}").is_err());
        assert!(secret_parts("${env:X}").is_err());
        assert!(secret_parts("${secret:x").is_err());
        assert_eq!(
            secret_ids("a ${secret:one} b ${secret:two}"),
            ["one", "two"]
        );
    }

    #[test]
    fn env_placeholders_resolve_to_plain_host_text() {
        let env = |v: &str| match v {
            "PORT" => Some("8443".to_string()),
            "HOST" => Some("api.example.org".to_string()),
            "EVIL" => Some("a/b@c".to_string()),
            _ => None,
        };
        let mut seen = BTreeMap::new();
        assert_eq!(
            resolve_env("https://${env:HOST}:${env:PORT}/x", &env, &mut seen).unwrap(),
            "https://api.example.org:8443/x"
        );
        assert_eq!(seen.len(), 2);
        assert!(resolve_env("http://${env:EVIL}/", &env, &mut seen).is_err());
        assert!(resolve_env("http://${env:NONE}/", &env, &mut seen).is_err());
        assert!(resolve_env("http://${env:a b}/", &env, &mut seen).is_err());
    }

    #[test]
    fn file_modes_follow_the_rules() {
        let own = [1000];
        assert!(permission_problem(0o100600, 1000, &own).is_none());
        assert!(permission_problem(0o100400, 5, &own).is_none());
        assert!(permission_problem(0o100640, 1000, &own).is_none());
        assert!(permission_problem(0o100640, 5, &own).is_some());
        assert!(permission_problem(0o100604, 1000, &own).is_some());
        assert!(permission_problem(0o100620, 1000, &own).is_some());
        assert!(permission_problem(0o100602, 1000, &own).is_some());
    }

    #[test]
    fn values_never_print() {
        let s = SecretValue::new("hunter2hunter2");
        assert_eq!(format!("{s:?}"), "[secret]");
    }
}
