//! Witnesses: the client side of the C2SP tlog-witness protocol
//! (c2sp.org/tlog-witness, c2sp.org/tlog-cosignature). Each configured witness gets
//! the log's newest signed checkpoint with a consistency proof from the size it last
//! cosigned, checks both and answers with a timestamped Ed25519 cosignature, which is
//! stored, with the checkpoint it signs, in an append-only, fsynced file next to the
//! log (`cosigned-checkpoints.log`, the checkpoint sink format).
//!
//! A witness keeps the newest size and root it cosigned for the log's origin and never
//! cosigns a checkpoint that does not extend it: a log cut or rewritten together with
//! its local checkpoints can no longer produce a checkpoint the witnesses sign, and the
//! cosignatures already given prove what the log held.
//!
//! The parts: this file holds the protocol's client (one add-checkpoint request; the
//! cosignature key, its checks and the quorum check of stored cosignatures are the
//! audit crate's `toolgate_audit::cosign`, which `audit verify` needs); `submit.rs` the
//! task that offers a log's checkpoints to one witness, shared with the fleet log of
//! the audit hub (`hub::witness`); `local.rs` the sidecar's own log as that task reads
//! it (its segments and the cosignature file).
//!
//! INVARIANT: witnessing never delays or refuses a call: one task per witness reads
//! committed checkpoints and leaf hashes over its own read-only connections; a witness
//! that is down or refuses is retried at the next round and counted in its status
//! (`/metrics`), never blocking the writer.

mod local;
pub(crate) mod submit;

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use super::merkle::Hash;
use crate::outbound::error_chain;

pub use local::{WitnessOptions, start};
pub use toolgate_audit::cosign::{
    COSIGNATURE_FILE, WitnessKey, WitnessProblem, WitnessReport, check_cosignatures,
    cosignature_key_id, cosigned_message, default_cosignature_file, lines_of, read_cosigned,
};

/// The longest one add-checkpoint request may take, connecting included.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest witness response read.
const MAX_RESPONSE_BYTES: usize = 16 * 1024;
/// The most leaves one submission may span: a witness further behind is brought up in
/// several submissions, each through a stored checkpoint (bounded memory).
pub(crate) const MAX_LEAVES_PER_SUBMISSION: u64 = 1 << 20;

/// One configured witness: its submission prefix and its key (`--witness URL+VKEY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessConfig {
    /// The submission prefix; `add-checkpoint` is appended.
    pub url: String,
    pub key: WitnessKey,
}

impl WitnessConfig {
    /// Parses `URL+VKEY`: the URL (http or https, no `+` in it) up to the first `+`,
    /// then the witness's vkey.
    pub fn parse(text: &str) -> Result<WitnessConfig, String> {
        let Some((url, vkey)) = text.split_once('+') else {
            return Err("expected `URL+VKEY`, e.g. `https://witness.example/w1+witness.example/w1+1a2b3c4d+BASE64`".into());
        };
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https")
            || parsed.host_str().is_none_or(str::is_empty)
            || !parsed.username().is_empty()
            || parsed.query().is_some()
        {
            return Err(format!(
                "`{url}` must be an http(s) URL with a host, without user or query"
            ));
        }
        let key = WitnessKey::parse_vkey(vkey)?;
        Ok(WitnessConfig {
            url: url.trim_end_matches('/').to_string(),
            key,
        })
    }
}

/// What `/metrics` shows of one witness.
#[derive(Debug)]
pub struct WitnessStatus {
    pub name: String,
    /// The newest checkpoint size this witness cosigned (0: none yet).
    pub cosigned_size: AtomicU64,
    /// The newest checkpoint size offered to it.
    pub checkpoint_size: AtomicU64,
    /// Submissions that failed (unreachable, refused, a bad answer).
    pub failures: AtomicU64,
    /// Submissions the witness refused as conflicting (409: a fork or a rollback).
    pub conflicts: AtomicU64,
    /// The last failure, for the logs.
    pub last_error: Mutex<Option<String>>,
}

impl WitnessStatus {
    pub(crate) fn new(name: &str) -> Self {
        WitnessStatus {
            name: name.to_string(),
            cosigned_size: AtomicU64::new(0),
            checkpoint_size: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }
    }
}

/// What a witness answered to one add-checkpoint request (c2sp.org/tlog-witness).
pub(crate) enum Answer {
    /// 200 with a cosignature by the witness's key: its signature lines and timestamp.
    Cosigned {
        lines: String,
        timestamp: u64,
    },
    Refused(Refusal),
}

/// A witness's refusal of a checkpoint.
pub(crate) enum Refusal {
    /// 409: the size the witness stands at, when it said one.
    Conflict(Option<u64>),
    /// Any other status, with the start of the body.
    Status(u16, String),
}

/// One add-checkpoint request: the checkpoint `note`, with the consistency proof from
/// the size `from` the witness last cosigned. A 200 whose body is not a cosignature by
/// the witness's key is an error, as is a witness that cannot be reached.
pub(crate) async fn add_checkpoint(
    client: &reqwest::Client,
    witness: &WitnessConfig,
    from: u64,
    proof: &[Hash],
    note: &str,
) -> Result<Answer, String> {
    let mut body = format!("old {from}\n");
    for hash in proof {
        body.push_str(&B64.encode(hash));
        body.push('\n');
    }
    body.push('\n');
    body.push_str(note);
    let url = format!("{}/add-checkpoint", witness.url);
    let response = client
        .post(&url)
        .body(body)
        .send()
        .await
        .map_err(|e| format!("{url}: {}", error_chain(&e.without_url())))?;
    let status = response.status().as_u16();
    let text = String::from_utf8_lossy(&read_limited(response).await?).into_owned();
    let name = &witness.key.name;
    Ok(match status {
        200 => {
            let timestamp = witness
                .key
                .check_note(&format!("{note}{text}"))
                .map_err(|e| format!("witness `{name}`: {e}"))?
                .ok_or_else(|| {
                    format!("witness `{name}` answered without a cosignature by its key")
                })?;
            Answer::Cosigned {
                lines: lines_of(&text, &witness.key),
                timestamp,
            }
        }
        409 => Answer::Refused(Refusal::Conflict(text.trim().parse::<u64>().ok())),
        code => Answer::Refused(Refusal::Status(
            code,
            text.trim().chars().take(200).collect(),
        )),
    })
}

pub(crate) async fn read_limited(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("reading the witness answer: {}", error_chain(&e)))?
    {
        out.extend_from_slice(&chunk);
        if out.len() > MAX_RESPONSE_BYTES {
            return Err("the witness answer is too large".into());
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::keys::SignerKey;
    use ed25519_dalek::SigningKey;

    #[test]
    fn witness_flags_parse() {
        let k = WitnessKey::new(
            "w.example/a",
            SigningKey::from_bytes(&[9; 32]).verifying_key(),
        );
        let config =
            WitnessConfig::parse(&format!("http://127.0.0.1:9/w/+{}", k.to_vkey())).unwrap();
        assert_eq!(config.url, "http://127.0.0.1:9/w");
        assert_eq!(config.key, k);
        assert!(WitnessConfig::parse("http://127.0.0.1:9/w").is_err());
        assert!(WitnessConfig::parse(&format!("ftp://h+{}", k.to_vkey())).is_err());
        // A log key (type 0x01) is not a cosignature key.
        let log = SignerKey::from_seed("w.example/a", [9; 32]).unwrap();
        assert!(WitnessConfig::parse(&format!("http://h+{}", log.verifier.to_vkey())).is_err());
    }
}
