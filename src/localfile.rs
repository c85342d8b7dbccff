//! Reading a small local file that someone else may have replaced: a key file, a token
//! file, a cursor, a record in the data directory. An insider with the directory can
//! put anything in its place (a symlink to `/dev/zero`, a FIFO, a file of gigabytes),
//! and the reader must still answer at once, with a bounded amount of memory.
//!
//! INVARIANT: [`read`], [`open`] and [`open_append`] never block on a FIFO or device
//! and accept only a regular file (symlinks to one are followed: secret volumes are mounted that way);
//! [`read`] never holds more than `max + 1` bytes of it, however large it is or grows
//! while read.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

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
    // O_NONBLOCK: opening a FIFO for reading waits for a writer otherwise. It does not
    // change reads of a regular file.
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
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
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => ReadError::NotAFile,
            _ => ReadError::Io(e),
        })?;
    if !file.metadata().map_err(ReadError::Io)?.is_file() {
        return Err(ReadError::NotAFile);
    }
    Ok(file)
}

/// The whole file at `path`, at most `max` bytes.
pub fn read(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let file = open(path)?;
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
}
