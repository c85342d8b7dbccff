//! Content-addressed artifacts: outputs larger than a tool's `max_output_bytes` are
//! kept whole under `<data_dir>/artifacts/<sha256>` and referenced from the response,
//! never silently cut.

use std::io;
use std::path::PathBuf;

use crate::call::ArtifactRef;
use crate::canonical::sha256_hex;

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
        let valid = sha256.len() == 64
            && sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !valid {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a sha256"));
        }
        tokio::fs::read(self.dir.join(sha256)).await
    }
}
