//! Reading a small local file that someone else may have replaced: a key file, a token
//! file, a cursor, a record in the data directory, a policy file. An insider with the directory can
//! put anything in its place (a symlink to `/dev/zero`, a FIFO, a file of gigabytes),
//! and the reader must still answer at once, with a bounded amount of memory.
//!
//!
//! It is also the one place that creates files and directories in the data and key
//! directories: owner-only (files [`PRIVATE_FILE`], directories [`PRIVATE_DIR`])
//! whatever the process's umask, since the audit log, the approvals and the artifacts
//! hold what the calls were about (case or patient identifiers). [`tighten`] finds the
//! entries a wider mode left behind (an older version, a copy, an operator's `chmod`).
//!
//! INVARIANT: [`read`], [`open`] and [`open_append`] never block on a FIFO or device
//! and accept only a regular file (symlinks to one are followed: secret volumes are mounted that way);
//! [`read`] never holds more than `max + 1` bytes of it, however large it is or grows
//! while read. Every file this module creates is 0600 and every directory 0700, set
//! with `fchmod`/`chmod` after creation so that no umask can widen or narrow them.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mode of every file toolgate creates in its data and key directories.
pub const PRIVATE_FILE: u32 = 0o600;
/// The mode of every directory toolgate creates there.
pub const PRIVATE_DIR: u32 = 0o700;

/// Why a file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// It cannot be opened or read (missing, no permission, ...).
    Io(std::io::Error),
    /// It is not a regular file (a directory, a FIFO, a device).
    NotAFile,
    /// It holds more than the bytes allowed.
    TooLarge { max: u64 },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::NotAFile => f.write_str("it is not a regular file"),
            ReadError::TooLarge { max } => write!(f, "it is larger than {max} bytes"),
        }
    }
}

/// Opens `path` for reading if it is a regular file, without blocking whatever it is;
/// for a caller that reads only part of it (bound that read too).
pub fn open(path: &Path) -> Result<File, ReadError> {
    open_with(path, 0)
}

/// [`open`] with `flags` added to the open.
fn open_with(path: &Path, flags: libc::c_int) -> Result<File, ReadError> {
    // O_NONBLOCK: opening a FIFO for reading waits for a writer otherwise. It does not
    // change reads of a regular file.
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | flags)
        .open(path)
        .map_err(ReadError::Io)?;
    if !file.metadata().map_err(ReadError::Io)?.is_file() {
        return Err(ReadError::NotAFile);
    }
    Ok(file)
}

/// Opens `path` for appending, creating it if missing, if it is a regular file:
/// without blocking whatever stands there (opening a FIFO for writing otherwise waits
/// for a reader). For the files the log appends to (a checkpoint sink's file, the
/// cosignature file) and its lock file.
pub fn open_append(path: &Path) -> Result<File, ReadError> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => return Err(ReadError::NotAFile),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ReadError::Io(e)),
    }
    // Put in place between the look and the open: a FIFO without a reader is ENXIO
    // with O_NONBLOCK, one with a reader is caught by the look at the descriptor.
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(PRIVATE_FILE)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => ReadError::NotAFile,
            _ => ReadError::Io(e),
        })?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile);
    }
    if meta.len() == 0 {
        // Just created (or empty): owner-only whatever the umask.
        make_private(&file, &meta, PRIVATE_FILE).map_err(ReadError::Io)?;
    }
    Ok(file)
}

/// Sets `file` (whose metadata is `meta`) to exactly `mode` unless it already is. An
/// entry this process does not own cannot be changed: an error only when it is left
/// open to group or others.
fn make_private(file: &File, meta: &std::fs::Metadata, mode: u32) -> std::io::Result<()> {
    if meta.permissions().mode() & 0o7777 == mode {
        return Ok(());
    }
    match file.set_permissions(std::fs::Permissions::from_mode(mode)) {
        Ok(()) => Ok(()),
        Err(_) if meta.permissions().mode() & 0o077 == 0 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates (or truncates) the file at `path` for writing, owner-only ([`PRIVATE_FILE`],
/// also when it existed with a wider mode). `create_new`: refuse an existing file.
pub fn create(path: &Path, create_new: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).mode(PRIVATE_FILE);
    if create_new {
        options.create_new(true);
    } else {
        options.create(true).truncate(true);
    }
    let file = options.open(path)?;
    make_private(&file, &file.metadata()?, PRIVATE_FILE)?;
    Ok(file)
}

/// [`std::fs::write`], owner-only.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::io::Write::write_all(&mut create(path, false)?, bytes)
}

/// Creates `dir` and every missing parent, each owner-only ([`PRIVATE_DIR`]); the
/// directories that exist are left as they are (see [`tighten`]).
pub fn create_dir_all(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    loop {
        match std::fs::metadata(at) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("`{}` exists and is not a directory", at.display()),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(at),
            Err(e) => return Err(e),
        }
        match at.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => at = parent,
            None => break,
        }
    }
    for created in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(PRIVATE_DIR).create(created) {
            Ok(()) => {
                std::fs::set_permissions(created, std::fs::Permissions::from_mode(PRIVATE_DIR))?;
            }
            // Made by someone else in the meantime: left as it is.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Makes sure a SQLite database at `path` will be owner-only with its journal files:
/// a missing database is created empty with [`PRIVATE_FILE`] (an empty file is a new
/// database to SQLite), in an owner-only directory. SQLite creates the `-wal`, `-shm`
/// and `-journal` files with the database file's own mode, so they are 0600 too. An
/// existing file (or whatever stands there) is left to the opener.
pub fn prepare_database(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_dir_all(dir)?;
    }
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_FILE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => make_private(&file, &file.metadata()?, PRIVATE_FILE),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// What [`tighten`] did.
#[derive(Debug, Default)]
pub struct Tightened {
    /// Each entry found wider than owner-only and set to owner-only: its path and the
    /// mode it had.
    pub tightened: Vec<(PathBuf, u32)>,
    /// Each entry found wider that could not be changed (another owner, a read-only
    /// file system), with why.
    pub failed: Vec<(PathBuf, String)>,
}

/// How deep [`tighten`] looks (the data directory's deepest entries, an artifact's
/// owner records, are five levels down).
const TIGHTEN_DEPTH: usize = 16;

/// Sets every directory under `root` (itself included) that group or others may use
/// to [`PRIVATE_DIR`] and every such file to its owner's bits alone (0644 becomes
/// 0600). Symbolic links are neither followed nor changed; a missing `root` is
/// nothing to do.
pub fn tighten(root: &Path) -> Tightened {
    let mut done = Tightened::default();
    tighten_at(root, 0, &mut done);
    done
}

fn tighten_at(path: &Path, depth: usize, done: &mut Tightened) {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && depth == 0 => return,
        Err(e) => {
            done.failed.push((path.to_path_buf(), e.to_string()));
            return;
        }
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return;
    }
    let mode = meta.mode() & 0o7777;
    let wanted = if kind.is_dir() {
        PRIVATE_DIR
    } else {
        mode & 0o700
    };
    if mode & 0o7077 != 0 {
        match std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted)) {
            Ok(()) => done.tightened.push((path.to_path_buf(), mode)),
            Err(e) => done.failed.push((path.to_path_buf(), e.to_string())),
        }
    }
    if kind.is_dir() && depth < TIGHTEN_DEPTH {
        let entries = match std::fs::read_dir(path) {
            Ok(entries) => entries,
            Err(e) => {
                done.failed.push((path.to_path_buf(), e.to_string()));
                return;
            }
        };
        for entry in entries.flatten() {
            tighten_at(&entry.path(), depth + 1, done);
        }
    }
}

/// The whole file at `path`, at most `max` bytes.
pub fn read(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    read_from(open(path)?, max)
}

/// [`read`] of a path the caller has resolved and checked itself (a policy file inside
/// its directory): a symlink put in place of its last component since is refused
/// (`O_NOFOLLOW`), so the file read is the file checked.
pub fn read_resolved(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    read_from(open_with(path, libc::O_NOFOLLOW)?, max)
}

fn read_from(file: File, max: u64) -> Result<Vec<u8>, ReadError> {
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge { max });
    }
    Ok(bytes)
}

/// [`read`] for a text file: its bytes must be UTF-8.
pub fn read_to_string(path: &Path, max: u64) -> Result<String, ReadError> {
    String::from_utf8(read(path, max)?).map_err(|_| {
        ReadError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the file is not UTF-8 text",
        ))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// What an insider can leave in place of a small file, and what each read gives.
    #[test]
    fn a_replaced_file_is_refused_at_once_and_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, b"12345").unwrap();
        let zeros = dir.path().join("zeros");
        std::os::unix::fs::symlink("/dev/zero", &zeros).unwrap();
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let huge = dir.path().join("huge");
        // Sparse: a terabyte on paper, nothing on disk.
        File::create(&huge).unwrap().set_len(1 << 40).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&small, &link).unwrap();

        assert_eq!(read(&small, 5).unwrap(), b"12345");
        assert_eq!(
            read(&link, 5).unwrap(),
            b"12345",
            "a symlink to a file is read"
        );
        assert!(matches!(
            read(&small, 4),
            Err(ReadError::TooLarge { max: 4 })
        ));
        assert!(matches!(read(&zeros, 4096), Err(ReadError::NotAFile)));
        assert!(matches!(read(&fifo, 4096), Err(ReadError::NotAFile)));
        assert!(matches!(open(&fifo), Err(ReadError::NotAFile)));
        assert!(matches!(open(&zeros), Err(ReadError::NotAFile)));
        assert!(open(&link).is_ok());
        assert!(matches!(read(dir.path(), 4096), Err(ReadError::NotAFile)));
        // A resolved path: its file is read within the bound as `read` does, but a
        // symlink swapped in for its last component is not followed.
        assert_eq!(read_resolved(&small, 5).unwrap(), b"12345");
        assert!(matches!(
            read_resolved(&small, 4),
            Err(ReadError::TooLarge { max: 4 })
        ));
        assert!(matches!(
            read_resolved(&link, 5),
            Err(ReadError::Io(e)) if e.raw_os_error() == Some(libc::ELOOP)
        ));
        assert!(matches!(
            read_resolved(&fifo, 4096),
            Err(ReadError::NotAFile)
        ));
        assert!(matches!(
            read(&huge, 4096),
            Err(ReadError::TooLarge { max: 4096 })
        ));
        assert!(matches!(
            read(&dir.path().join("missing"), 4096),
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound
        ));
        std::fs::write(&small, [0xff, 0xfe]).unwrap();
        assert!(matches!(read_to_string(&small, 16), Err(ReadError::Io(_))));

        // Appending: created when missing, added to when a file, refused otherwise.
        let log = dir.path().join("log");
        for line in [&b"one\n"[..], b"two\n"] {
            std::io::Write::write_all(&mut open_append(&log).unwrap(), line).unwrap();
        }
        assert_eq!(std::fs::read(&log).unwrap(), b"one\ntwo\n");
        std::io::Write::write_all(&mut open_append(&link).unwrap(), b"!").unwrap();
        assert_eq!(std::fs::read(&small).unwrap(), [0xff, 0xfe, b'!']);
        for other in [&fifo, &zeros, &dir.path().to_path_buf()] {
            assert!(
                matches!(open_append(other), Err(ReadError::NotAFile)),
                "{other:?}"
            );
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    /// What this module creates is owner-only; what it finds wider is tightened and
    /// named, a symbolic link is neither followed nor changed.
    #[test]
    fn created_entries_are_owner_only_and_wider_ones_are_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b/c");
        create_dir_all(&nested).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&dir.path().join(d)), PRIVATE_DIR, "{d}");
        }
        let file = nested.join("f");
        write(&file, b"x").unwrap();
        assert_eq!(mode(&file), PRIVATE_FILE);
        // An existing wider file rewritten through `create` is owner-only after.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&file, b"y").unwrap();
        assert_eq!(mode(&file), PRIVATE_FILE);
        let db = nested.join("x.db");
        prepare_database(&db).unwrap();
        assert_eq!(mode(&db), PRIVATE_FILE);
        assert_eq!(std::fs::metadata(&db).unwrap().len(), 0);
        let log = nested.join("log");
        drop(open_append(&log).unwrap());
        assert_eq!(mode(&log), PRIVATE_FILE);

        // Widened: tightened and named; the link and what it points at are left alone.
        let outside = dir.path().join("outside");
        std::fs::write(&outside, b"z").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, nested.join("link")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o664)).unwrap();
        std::fs::set_permissions(
            dir.path().join("a/b"),
            std::fs::Permissions::from_mode(0o2775),
        )
        .unwrap();
        let done = tighten(&dir.path().join("a"));
        let mut named: Vec<(PathBuf, u32)> = done.tightened.clone();
        named.sort();
        assert_eq!(
            named,
            vec![(dir.path().join("a/b"), 0o2775), (file.clone(), 0o664)]
        );
        assert!(done.failed.is_empty(), "{:?}", done.failed);
        assert_eq!(mode(&dir.path().join("a/b")), PRIVATE_DIR);
        assert_eq!(mode(&file), PRIVATE_FILE);
        assert_eq!(mode(&outside), 0o644);
        assert!(tighten(&dir.path().join("missing")).tightened.is_empty());
    }
}
