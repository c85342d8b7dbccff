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

use serde::{Deserialize, Serialize};

use crate::call::ArtifactRef;
use crate::canonical::sha256_hex;

/// The most owner records read for one (artifact, run) pair.
const MAX_OWNER_RECORDS: usize = 1000;

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

#[derive(Debug, Clone)]
pub struct ArtifactStore {
    dir: PathBuf,
}

impl ArtifactStore {
    pub fn new(dir: PathBuf) -> Self {
        ArtifactStore { dir }
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
        if tokio::fs::metadata(&path).await.is_err() {
            tokio::fs::create_dir_all(&self.dir).await?;
            let tmp = self.dir.join(format!(".{sha256}.{}", uuid::Uuid::new_v4()));
            let file_path = tmp.clone();
            tokio::task::spawn_blocking(move || -> io::Result<()> {
                use std::io::Write;
                let mut f = std::fs::File::create(&file_path)?;
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

    /// Reads an artifact; `sha256` must be 64 lowercase hex digits.
    pub async fn get(&self, sha256: &str) -> io::Result<Vec<u8>> {
        if !is_sha256(sha256) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a sha256"));
        }
        tokio::fs::read(self.dir.join(sha256)).await
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
            std::fs::create_dir_all(&dir)?;
            let tmp = dir.join(format!(".{name}.tmp"));
            let mut f = std::fs::File::create(&tmp)?;
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
                let bytes = std::fs::read(&path)?;
                if bytes.len() > 64 * 1024 {
                    continue;
                }
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
