//! The builtins' file access: files opened beneath a data folder with no symlink
//! followed at any component (`open_beneath`: openat2 with RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS, or an O_NOFOLLOW walk), read within a size cap, drafts written
//! atomically, and the data folders kept open for a second (`DataFolder`).

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::MAX_DATA_FILE_BYTES;
use crate::adapter::ExecError;

/// How long an opened data folder is used before it is opened again: a folder replaced
/// (renamed over, or deleted and created again) is seen within this time.
const FOLDER_REOPEN_AFTER: Duration = Duration::from_secs(1);

/// A data folder whose descriptor is kept for [`FOLDER_REOPEN_AFTER`] rather than
/// opened and closed on every call (two system calls, 4% of a gated call's CPU;
/// issue 19). Files beneath it are still opened on every call, so an edited or
/// replaced file is read at once; only the folder itself is remembered, and a folder
/// that cannot be opened is never remembered.
#[derive(Debug)]
pub(super) struct DataFolder {
    path: PathBuf,
    opened: Mutex<Option<(Arc<OwnedFd>, Instant)>>,
}

impl DataFolder {
    pub(super) fn new(path: PathBuf) -> DataFolder {
        DataFolder {
            path,
            opened: Mutex::new(None),
        }
    }

    /// The folder's descriptor: the one opened less than [`FOLDER_REOPEN_AFTER`] ago,
    /// else a new one. Blocking (an open).
    fn descriptor(&self) -> std::io::Result<Arc<OwnedFd>> {
        self.descriptor_at(Instant::now())
    }

    /// [`DataFolder::descriptor`] at the time `now`.
    fn descriptor_at(&self, now: Instant) -> std::io::Result<Arc<OwnedFd>> {
        if let Ok(opened) = self.opened.lock()
            && let Some((fd, at)) = opened.as_ref()
            && now.saturating_duration_since(*at) < FOLDER_REOPEN_AFTER
        {
            return Ok(fd.clone());
        }
        let fd = Arc::new(open_folder(&self.path)?);
        if let Ok(mut opened) = self.opened.lock() {
            *opened = Some((fd.clone(), now));
        }
        Ok(fd)
    }
}

/// Reads `rel` (already lexically normal) inside `case_dir`, opened beneath it without
/// following a symlink at any component ([`open_beneath`]). Blocking.
pub(super) fn read_confined(
    case_dir: &Path,
    case_id: &str,
    rel: &str,
    cap: usize,
) -> Result<Vec<u8>, ExecError> {
    let file = open_beneath(case_dir, rel).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            ExecError::Failed(format!("document `{rel}` not found in case `{case_id}`"))
        }
        _ if is_symlink_refusal(&e) => ExecError::ArgumentUnsafe {
            pointer: "/path".into(),
            problem: "the path goes through a symlink; pass the document's real path".into(),
        },
        _ => ExecError::Failed(format!("document `{rel}` cannot be opened: {e}")),
    })?;
    read_bounded(file, rel, cap)
}

/// Reads an open regular file of at most `cap` bytes.
fn read_bounded(file: std::fs::File, what: &str, cap: usize) -> Result<Vec<u8>, ExecError> {
    let meta = file
        .metadata()
        .map_err(|e| ExecError::Failed(format!("document `{what}` cannot be read: {e}")))?;
    read_bounded_as(file, &meta, what, cap)
}

/// [`read_bounded`] with the file's metadata already read.
fn read_bounded_as(
    file: std::fs::File,
    meta: &std::fs::Metadata,
    what: &str,
    cap: usize,
) -> Result<Vec<u8>, ExecError> {
    if !meta.is_file() {
        return Err(ExecError::Failed(format!("`{what}` is not a regular file")));
    }
    let limit = u64::try_from(cap).unwrap_or(u64::MAX);
    if meta.len() > limit {
        return Err(ExecError::Failed(format!(
            "document `{what}` is larger than {cap} bytes"
        )));
    }
    // Sized from the metadata (+1 to see the end): two reads, not a probe and regrowths.
    let expected = usize::try_from(meta.len()).unwrap_or(cap).min(cap);
    let mut bytes = Vec::with_capacity(expected.saturating_add(1));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ExecError::Failed(format!("document `{what}` cannot be read: {e}")))?;
    if bytes.len() > cap {
        return Err(ExecError::Failed(format!(
            "document `{what}` is larger than {cap} bytes"
        )));
    }
    Ok(bytes)
}

/// Whether an open failed because a component is a symlink (ELOOP from O_NOFOLLOW or
/// RESOLVE_NO_SYMLINKS) or would leave the root (EXDEV from RESOLVE_BENEATH).
fn is_symlink_refusal(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV))
}

/// Opens `rel` (relative, lexically normal: no `..`, no empty part) for reading
/// beneath `root`, following no symlink at any component of `rel` and never leaving
/// `root`: `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where the kernel has it
/// (Linux 5.6), otherwise a walk that opens each component with `O_NOFOLLOW` relative
/// to the directory opened before it. Either way the check and the open are one
/// operation, so a component swapped for a symlink meanwhile cannot redirect it.
/// Blocking.
pub(crate) fn open_beneath(root: &Path, rel: &str) -> std::io::Result<std::fs::File> {
    let dir = open_folder(root)?;
    open_beneath_at(dir.as_fd(), rel)
}

/// Opens the folder `root` as a directory descriptor (for [`open_beneath_at`]).
fn open_folder(root: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)?;
    Ok(dir.into())
}

/// [`open_beneath`] beneath a folder already open as `dir`.
fn open_beneath_at(dir: BorrowedFd<'_>, rel: &str) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let invalid = || std::io::Error::from_raw_os_error(libc::EINVAL);
    if rel.is_empty()
        || rel.starts_with('/')
        || rel
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
    {
        return Err(invalid());
    }
    let c_rel = std::ffi::CString::new(rel).map_err(|_| invalid())?;
    /// `struct open_how` of openat2(2).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        // O_NONBLOCK: a FIFO or device planted in the data folder opens at once (and
        // is then refused as not a regular file) instead of blocking the caller.
        flags: (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK) as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: the arguments are a valid directory descriptor, a NUL-terminated path,
    // and a pointer to an `open_how` of the size passed; the kernel only reads them.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c_rel.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd >= 0 {
        // SAFETY: openat2 returned a new descriptor that nothing else owns.
        return Ok(std::fs::File::from(unsafe {
            OwnedFd::from_raw_fd(fd as i32)
        }));
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        // No openat2 here (old kernel, or a seccomp filter): walk the components.
        Some(libc::ENOSYS) | Some(libc::EPERM) => {}
        _ => return Err(error),
    }
    open_by_walk(dir, rel)
}

/// The fallback of [`open_beneath_at`] where the kernel has no openat2: opens each
/// component of `rel` (already checked: relative, no `.`, `..` or empty part) relative
/// to the one before it with `O_NOFOLLOW`, the folders with `O_DIRECTORY` and the last
/// with `O_NONBLOCK`. A symlink at any component fails its own open.
fn open_by_walk(dir: BorrowedFd<'_>, rel: &str) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let invalid = || std::io::Error::from_raw_os_error(libc::EINVAL);
    let parts: Vec<&str> = rel.split('/').collect();
    // The folder itself is borrowed (it may be a kept descriptor); each component
    // opened on the way is owned and closed when the next one is open.
    let mut current: Option<OwnedFd> = None;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() || *part == "." || *part == ".." {
            return Err(invalid());
        }
        let last = i + 1 == parts.len();
        let c_part = std::ffi::CString::new(*part).map_err(|_| invalid())?;
        let kind = if last {
            libc::O_NONBLOCK
        } else {
            libc::O_DIRECTORY
        };
        let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | kind;
        let base = current.as_ref().map_or(dir.as_raw_fd(), AsRawFd::as_raw_fd);
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        let fd = unsafe { libc::openat(base, c_part.as_ptr(), flags) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: openat returned a new descriptor that nothing else owns.
        current = Some(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    current.map(std::fs::File::from).ok_or_else(invalid)
}

/// Writes `root/<folders...>/name` atomically: each folder beneath `root` is made if
/// missing and opened with `O_NOFOLLOW` (a symlink planted at any of them is refused,
/// never followed out of `root`), then a temporary file is created in the last one
/// with `O_EXCL | O_NOFOLLOW`, synced, and renamed over `name` relative to that same
/// folder's descriptor. Blocking.
pub(super) fn write_atomically(
    root: &Path,
    folders: &[&str],
    name: &str,
    content: &[u8],
) -> Result<(), ExecError> {
    use std::io::Write;
    use std::os::fd::{AsRawFd, FromRawFd};
    let failed = |e: std::io::Error| {
        if is_symlink_refusal(&e) {
            ExecError::Failed(format!(
                "writing draft `{name}` failed: a symlink on its path is refused"
            ))
        } else {
            ExecError::Failed(format!("writing draft `{name}` failed: {e}"))
        }
    };
    let c = |part: &str| {
        std::ffi::CString::new(part).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
    };
    let mut dir = open_folder(root).map_err(failed)?;
    for folder in folders {
        if folder.is_empty() || *folder == "." || *folder == ".." || folder.contains('/') {
            return Err(failed(std::io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let c_folder = c(folder).map_err(failed)?;
        // Owner-only like everything in the data directory (`localfile::PRIVATE_DIR`).
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        let created = unsafe {
            libc::mkdirat(
                dir.as_raw_fd(),
                c_folder.as_ptr(),
                crate::localfile::PRIVATE_DIR as libc::mode_t,
            )
        } == 0;
        if !created {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(failed(e));
            }
        }
        let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_DIRECTORY;
        // SAFETY: as above.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), c_folder.as_ptr(), flags) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            // O_NOFOLLOW | O_DIRECTORY on a symlink is ENOTDIR.
            if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) {
                return Err(ExecError::Failed(format!(
                    "writing draft `{name}` failed: a symlink on its path is refused \
                     (`{folder}` is not a folder)"
                )));
            }
            return Err(failed(e));
        }
        // SAFETY: openat returned a new descriptor that nothing else owns.
        dir = unsafe { OwnedFd::from_raw_fd(fd) };
        // The umask may have taken bits from the mode asked for: set it exactly.
        // SAFETY: a valid descriptor.
        if created
            && unsafe {
                libc::fchmod(
                    dir.as_raw_fd(),
                    crate::localfile::PRIVATE_DIR as libc::mode_t,
                )
            } != 0
        {
            return Err(failed(std::io::Error::last_os_error()));
        }
    }
    let tmp = format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple());
    let (c_tmp, c_name) = (c(&tmp).map_err(failed)?, c(name).map_err(failed)?);
    let flags = libc::O_WRONLY | libc::O_CLOEXEC | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    // SAFETY: as above; the mode is read only with O_CREAT.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c_tmp.as_ptr(),
            flags,
            crate::localfile::PRIVATE_FILE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(
            crate::localfile::PRIVATE_FILE,
        ))
        .map_err(failed)?;
    }
    let result = file
        .write_all(content)
        .and_then(|()| file.sync_all())
        .and_then(|()| {
            // SAFETY: valid descriptors and NUL-terminated names.
            let renamed = unsafe {
                libc::renameat(
                    dir.as_raw_fd(),
                    c_tmp.as_ptr(),
                    dir.as_raw_fd(),
                    c_name.as_ptr(),
                )
            };
            if renamed == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    if result.is_err() {
        // SAFETY: as above.
        unsafe { libc::unlinkat(dir.as_raw_fd(), c_tmp.as_ptr(), 0) };
    }
    result.map_err(failed)
}

/// A data file at most this large is read on the calling task: reading a few KiB costs
/// less than two thread wake-ups via the blocking pool (issue 19).
const INLINE_READ_BYTES: u64 = 64 * 1024;

/// Reads `rel` beneath `root` ([`open_beneath`]: no symlink at any component), at
/// most [`MAX_DATA_FILE_BYTES`]; a missing file is a tool error naming `what`. The
/// open (one `openat2`) and a file of at most [`INLINE_READ_BYTES`] are done on the
/// calling task, a larger file's read on the blocking pool.
pub(super) async fn read_beneath(
    folder: &DataFolder,
    rel: String,
    what: String,
) -> Result<Vec<u8>, ExecError> {
    let cap = usize::try_from(MAX_DATA_FILE_BYTES).unwrap_or(usize::MAX);
    let opened = folder
        .descriptor()
        .and_then(|dir| open_beneath_at(dir.as_fd(), &rel));
    let file = opened.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ExecError::Failed(format!("{what} not found")),
        _ if is_symlink_refusal(&e) => ExecError::Failed(format!(
            "{what} cannot be opened: a symlink on its path is refused"
        )),
        _ => ExecError::Failed(format!("{what} cannot be opened: {e}")),
    })?;
    let meta = file
        .metadata()
        .map_err(|e| ExecError::Failed(format!("{what} cannot be read: {e}")))?;
    if meta.is_file() && meta.len() <= INLINE_READ_BYTES {
        return read_bounded_as(file, &meta, &what, cap);
    }
    tokio::task::spawn_blocking(move || read_bounded_as(file, &meta, &what, cap))
        .await
        .map_err(|e| ExecError::Failed(format!("reading failed: {e}")))?
}

/// Reads a data file of at most [`MAX_DATA_FILE_BYTES`]; a missing file is a tool
/// error naming `what`.
pub(super) async fn read_data_file(path: &Path, what: &str) -> Result<Vec<u8>, ExecError> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ExecError::Failed(format!("{what} not found")),
            _ => ExecError::Failed(format!("{what} cannot be opened: {e}")),
        })?;
    let mut bytes = Vec::new();
    file.take(MAX_DATA_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| ExecError::Failed(format!("{what} cannot be read: {e}")))?;
    if bytes.len() as u64 > MAX_DATA_FILE_BYTES {
        return Err(ExecError::Failed(format!(
            "{what} is larger than {MAX_DATA_FILE_BYTES} bytes"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fifo_in_place_of_a_data_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let case = dir.path().join("C-1");
        std::fs::create_dir(&case).unwrap();
        let fifo = std::ffi::CString::new(case.join("case.json").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            read_beneath(
                &DataFolder::new(dir.path().to_path_buf()),
                "C-1/case.json".into(),
                "case".into(),
            ),
        )
        .await
        .expect("the read must not block on a FIFO");
        match read {
            Err(ExecError::Failed(message)) => {
                assert!(message.contains("not a regular file"), "{message}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_small_data_file_is_read_inline_and_a_large_one_on_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        let small = vec![b'a'; 100];
        let large = vec![b'b'; (INLINE_READ_BYTES + 1) as usize];
        std::fs::write(dir.path().join("small"), &small).unwrap();
        std::fs::write(dir.path().join("large"), &large).unwrap();
        let root = DataFolder::new(dir.path().to_path_buf());
        let got = read_beneath(&root, "small".into(), "small".into()).await;
        assert_eq!(got.unwrap(), small);
        let got = read_beneath(&root, "large".into(), "large".into()).await;
        assert_eq!(got.unwrap(), large);
    }

    /// Reads `rel` beneath the folder as it is at `now`.
    fn read_at(folder: &DataFolder, now: Instant, rel: &str) -> std::io::Result<Vec<u8>> {
        let dir = folder.descriptor_at(now)?;
        let mut bytes = Vec::new();
        open_beneath_at(dir.as_fd(), rel)?.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    #[test]
    fn a_kept_data_folder_sees_file_changes_at_once_and_a_replaced_folder_within_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let cases = dir.path().join("cases");
        std::fs::create_dir_all(cases.join("C-1")).unwrap();
        std::fs::write(cases.join("C-1/case.json"), "first").unwrap();
        let folder = DataFolder::new(cases.clone());
        let t0 = Instant::now();
        assert_eq!(read_at(&folder, t0, "C-1/case.json").unwrap(), b"first");

        // A file edited beneath the kept folder is read as it is now.
        std::fs::write(cases.join("C-1/case.json"), "edited").unwrap();
        assert_eq!(read_at(&folder, t0, "C-1/case.json").unwrap(), b"edited");

        // The folder itself renamed away and another put in its place: the kept
        // descriptor is used until FOLDER_REOPEN_AFTER has passed, then the new one.
        std::fs::rename(&cases, dir.path().join("cases-old")).unwrap();
        std::fs::create_dir_all(cases.join("C-1")).unwrap();
        std::fs::write(cases.join("C-1/case.json"), "replaced").unwrap();
        let just_before = t0 + FOLDER_REOPEN_AFTER - Duration::from_millis(1);
        assert_eq!(
            read_at(&folder, just_before, "C-1/case.json").unwrap(),
            b"edited"
        );
        let after = t0 + FOLDER_REOPEN_AFTER;
        assert_eq!(
            read_at(&folder, after, "C-1/case.json").unwrap(),
            b"replaced"
        );
    }

    #[test]
    fn the_walk_without_openat2_reads_beneath_a_kept_folder_and_refuses_every_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cases");
        std::fs::create_dir_all(root.join("C-1/notes")).unwrap();
        std::fs::write(root.join("C-1/notes/a.md"), "note").unwrap();
        std::fs::write(dir.path().join("secret"), "secret").unwrap();
        let folder = DataFolder::new(root.clone());
        let kept = folder.descriptor().unwrap();
        let read = |rel: &str| -> std::io::Result<Vec<u8>> {
            let mut bytes = Vec::new();
            open_by_walk(kept.as_fd(), rel)?.read_to_end(&mut bytes)?;
            Ok(bytes)
        };
        assert_eq!(read("C-1/notes/a.md").unwrap(), b"note");
        // Twice through the same kept descriptor: the walk borrows it, never closes it.
        assert_eq!(read("C-1/notes/a.md").unwrap(), b"note");
        // A symlink as the last component, as a folder on the way, and to a folder
        // outside: each is refused at its own open, and the secret is never read.
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("C-1/link.md")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("C-1/out")).unwrap();
        for rel in ["C-1/link.md", "C-1/out/secret"] {
            let refused = read(rel).unwrap_err();
            assert!(
                matches!(
                    refused.raw_os_error(),
                    Some(libc::ELOOP) | Some(libc::ENOTDIR)
                ),
                "{rel}: {refused:?}"
            );
        }
        // What the caller's check refuses, the walk refuses on its own as well.
        for rel in ["C-1/../../secret", "C-1//notes/a.md", "./C-1/notes/a.md"] {
            assert_eq!(
                read(rel).unwrap_err().raw_os_error(),
                Some(libc::EINVAL),
                "{rel}"
            );
        }
    }

    #[test]
    fn a_missing_data_folder_is_not_remembered_and_a_kept_one_still_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let drafts = dir.path().join("drafts");
        let folder = DataFolder::new(drafts.clone());
        let t0 = Instant::now();
        let missing = read_at(&folder, t0, "C-1/d.md").unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
        // Created right after: found at the same instant (a failure is not kept).
        std::fs::create_dir_all(drafts.join("C-1")).unwrap();
        std::fs::write(drafts.join("C-1/d.md"), "draft").unwrap();
        assert_eq!(read_at(&folder, t0, "C-1/d.md").unwrap(), b"draft");

        // Beneath the kept descriptor, a symlink swapped in for a component is still
        // refused, and so is a path that climbs out.
        std::fs::write(dir.path().join("secret"), "secret").unwrap();
        std::fs::remove_dir_all(drafts.join("C-1")).unwrap();
        std::os::unix::fs::symlink(dir.path(), drafts.join("C-1")).unwrap();
        let through_link = read_at(&folder, t0, "C-1/secret").unwrap_err();
        assert!(is_symlink_refusal(&through_link), "{through_link:?}");
        let climbing = read_at(&folder, t0, "../secret").unwrap_err();
        assert_eq!(climbing.raw_os_error(), Some(libc::EINVAL), "{climbing:?}");
    }
}
