//! Content-addressed artifacts: outputs larger than a tool's `max_output_bytes` are
//! kept whole under `<data_dir>/artifacts/<sha256>` and referenced from the response,
//! never silently cut.
//!
//! An artifact belongs to the runs that produced it: each producing call leaves an
//! owner record `<data_dir>/artifacts/owners/<sha256>/<sha256(run_id)>/<call>.json`
//! (run, role, lane, tool, call), written and synced before the call's response. A role
//! reads an artifact only through a run that owns it (see `Gateway::artifact`).

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::adapter::HARD_CAP_CEILING;
use crate::call::ArtifactRef;
use crate::canonical::sha256_hex;
use crate::localfile::{self, ReadError};

/// The most owner records read for one (artifact, run) pair.
const MAX_OWNER_RECORDS: usize = 1000;
/// The largest owner record read (one is a few hundred bytes).
const MAX_OWNER_RECORD_BYTES: u64 = 64 * 1024;

/// Who produced an artifact: one record per producing call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactOwner {
    pub run_id: String,
    pub role_id: String,
    pub lane_id: String,
    pub tool_name: String,
    pub call_id: String,
}

/// Whether `s` is 64 lowercase hex digits.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The most bytes the artifact store holds by default (`serve --max-artifact-bytes`).
pub const DEFAULT_MAX_ARTIFACT_BYTES: u64 = 1024 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct ArtifactStore {
    dir: PathBuf,
    /// The most bytes the artifacts may take together; a new one past it is refused.
    limit: u64,
    /// The bytes the artifacts take: counted from the folder at the first new
    /// artifact, then kept up to date (None: not counted yet).
    used: Arc<Mutex<Option<u64>>>,
}

impl ArtifactStore {
    pub fn new(dir: PathBuf) -> Self {
        ArtifactStore {
            dir,
            limit: DEFAULT_MAX_ARTIFACT_BYTES,
            used: Arc::default(),
        }
    }

    /// The store with at most `limit` bytes of artifacts.
    pub fn with_limit(self, limit: u64) -> Self {
        ArtifactStore { limit, ..self }
    }

    /// Reserves room for a new artifact of `len` bytes, or says why there is none.
    /// Blocking (the first one counts the folder).
    fn reserve(&self, len: u64) -> io::Result<()> {
        let mut used = self
            .used
            .lock()
            .map_err(|_| io::Error::other("the artifact count's lock is poisoned"))?;
        let now = match *used {
            Some(n) => n,
            None => folder_bytes(&self.dir)?,
        };
        if now.saturating_add(len) > self.limit {
            *used = Some(now);
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "the artifact store is full: it holds {now} bytes, a new artifact of \
                     {len} would pass its limit of {} (--max-artifact-bytes)",
                    self.limit
                ),
            ));
        }
        *used = Some(now + len);
        Ok(())
    }

    /// Stores `bytes` (written to a temporary file, synced, then renamed into place).
    pub async fn put(&self, bytes: Vec<u8>) -> io::Result<ArtifactRef> {
        // Hashed off the async workers: artifacts are the large outputs.
        let (bytes, sha256) = tokio::task::spawn_blocking(move || {
            let sha256 = sha256_hex(&bytes);
            (bytes, sha256)
        })
        .await
        .map_err(io::Error::other)?;
        let path = self.dir.join(&sha256);
        let len = bytes.len() as u64;
        // An artifact already stored under this hash is kept only if it holds these
        // bytes: a file planted or damaged under the name is replaced, so a call never
        // answers with an artifact that cannot be read back.
        let (bytes, intact) = tokio::task::spawn_blocking({
            let path = path.clone();
            move || {
                let intact = holds(&path, &bytes);
                (bytes, intact)
            }
        })
        .await
        .map_err(io::Error::other)?;
        if !intact {
            let store = self.clone();
            tokio::task::spawn_blocking(move || store.reserve(len))
                .await
                .map_err(io::Error::other)??;
            let tmp = self.dir.join(format!(".{sha256}.{}", uuid::Uuid::new_v4()));
            let file_path = tmp.clone();
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || -> io::Result<()> {
                use std::io::Write;
                localfile::create_dir_all(&dir)?;
                let mut f = localfile::create(&file_path, true)?;
                f.write_all(&bytes)?;
                f.sync_all()
            })
            .await
            .map_err(io::Error::other)??;
            tokio::fs::rename(&tmp, &path).await?;
        }
        Ok(ArtifactRef {
            uri: format!("artifact:sha256:{sha256}"),
            sha256,
            bytes: len,
            media_type: "application/json",
        })
    }

    /// Reads an artifact; `sha256` must be 64 lowercase hex digits. Its bytes must hash
    /// to that name: an artifact edited or replaced in the data directory is refused
    /// (InvalidData), never served, and no more than the largest output any tool may
    /// produce is read.
    pub async fn get(&self, sha256: &str) -> io::Result<Vec<u8>> {
        if !is_sha256(sha256) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a sha256"));
        }
        let path = self.dir.join(sha256);
        let expected = sha256.to_string();
        tokio::task::spawn_blocking(move || {
            let bytes = localfile::read(&path, HARD_CAP_CEILING).map_err(|e| match e {
                ReadError::Io(e) => e,
                other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
            })?;
            if sha256_hex(&bytes) != expected {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the artifact does not hash to its name",
                ));
            }
            Ok(bytes)
        })
        .await
        .map_err(io::Error::other)?
    }

    /// The directory of the owner records of `sha256` in `run_id`: named by the sha256
    /// of the run id, so no run id can name another path or be too long for one (the
    /// records inside name the run).
    fn owners_dir(&self, sha256: &str, run_id: &str) -> PathBuf {
        self.dir
            .join("owners")
            .join(sha256)
            .join(sha256_hex(run_id.as_bytes()))
    }

    /// Records that `owner`'s call produced `sha256` (synced before it returns).
    pub async fn record_owner(&self, sha256: &str, owner: &ArtifactOwner) -> io::Result<()> {
        if !is_sha256(sha256) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a sha256"));
        }
        let dir = self.owners_dir(sha256, &owner.run_id);
        let name = sha256_hex(owner.call_id.as_bytes());
        let bytes = serde_json::to_vec(owner).map_err(io::Error::other)?;
        tokio::task::spawn_blocking(move || -> io::Result<()> {
            use std::io::Write;
            localfile::create_dir_all(&dir)?;
            let tmp = dir.join(format!(".{name}.tmp"));
            let mut f = localfile::create(&tmp, false)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, dir.join(format!("{name}.json")))?;
            std::fs::File::open(&dir)?.sync_all()
        })
        .await
        .map_err(io::Error::other)?
    }

    /// The calls of `run_id` that produced `sha256` (empty when none did).
    pub async fn owners(&self, sha256: &str, run_id: &str) -> io::Result<Vec<ArtifactOwner>> {
        if !is_sha256(sha256) {
            return Ok(Vec::new());
        }
        let dir = self.owners_dir(sha256, run_id);
        tokio::task::spawn_blocking(move || -> io::Result<Vec<ArtifactOwner>> {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            let mut owners = Vec::new();
            for entry in entries.take(MAX_OWNER_RECORDS) {
                let path = entry?.path();
                if path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                // A record too large or not a file was not written by us: skipped,
                // like one that does not parse.
                let bytes = match localfile::read(&path, MAX_OWNER_RECORD_BYTES) {
                    Ok(bytes) => bytes,
                    Err(ReadError::Io(e)) => return Err(e),
                    Err(ReadError::TooLarge { .. } | ReadError::NotAFile) => continue,
                };
                if let Ok(owner) = serde_json::from_slice::<ArtifactOwner>(&bytes) {
                    owners.push(owner);
                }
            }
            Ok(owners)
        })
        .await
        .map_err(io::Error::other)?
    }
}

/// The bytes of the artifacts in `dir` (its regular files; a missing folder holds none).
fn folder_bytes(dir: &std::path::Path) -> io::Result<u64> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut total = 0u64;
    for entry in entries {
        let meta = entry?.metadata()?;
        if meta.is_file() {
            total = total.saturating_add(meta.len());
        }
    }
    Ok(total)
}

/// Whether the file at `path` holds exactly `bytes` (a missing, larger, different or
/// unreadable file does not).
fn holds(path: &std::path::Path, bytes: &[u8]) -> bool {
    localfile::read(path, bytes.len() as u64).is_ok_and(|stored| stored == bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn owner(call_id: &str) -> ArtifactOwner {
        ArtifactOwner {
            run_id: "run-1".into(),
            role_id: "research_agent".into(),
            lane_id: "research".into(),
            tool_name: "read_document".into(),
            call_id: call_id.into(),
        }
    }

    /// What an insider with the data directory can do to a stored artifact and its
    /// owner records, and what a reader then gets.
    #[tokio::test]
    async fn an_artifact_edited_in_the_data_directory_is_refused_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(dir.path().to_path_buf());
        let stored = store.put(b"{\"a\":1}".to_vec()).await.unwrap();
        assert_eq!(store.get(&stored.sha256).await.unwrap(), b"{\"a\":1}");

        let path = dir.path().join(&stored.sha256);
        std::fs::write(&path, b"{\"a\":2}").unwrap();
        let edited = store.get(&stored.sha256).await.unwrap_err();
        assert_eq!(edited.kind(), io::ErrorKind::InvalidData, "{edited}");

        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let device = store.get(&stored.sha256).await.unwrap_err();
        assert_eq!(device.kind(), io::ErrorKind::InvalidData, "{device}");

        // The next call that produces these bytes replaces what was planted under
        // their name (a symlink, then junk of the same length), so its answer's
        // artifact can be read back.
        for planted in [None, Some(b"{\"a\":9}".as_slice())] {
            if let Some(junk) = planted {
                std::fs::remove_file(&path).unwrap();
                std::fs::write(&path, junk).unwrap();
            }
            let again = store.put(b"{\"a\":1}".to_vec()).await.unwrap();
            assert_eq!(again.sha256, stored.sha256);
            assert_eq!(store.get(&stored.sha256).await.unwrap(), b"{\"a\":1}");
            assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        }

        // Owner records: a real one is read; one of a terabyte (sparse) and one that
        // is a FIFO are skipped at once.
        store
            .record_owner(&stored.sha256, &owner("call-1"))
            .await
            .unwrap();
        let owners = store.owners_dir(&stored.sha256, "run-1");
        std::fs::File::create(owners.join("huge.json"))
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let fifo = std::ffi::CString::new(owners.join("fifo.json").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(
            store.owners(&stored.sha256, "run-1").await.unwrap(),
            vec![owner("call-1")]
        );
    }
}
