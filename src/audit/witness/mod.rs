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
//! The parts: this file holds the protocol (the cosignature key and its checks, one
//! add-checkpoint request, the quorum check of stored cosignatures); `submit.rs` the
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

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signature, VerifyingKey};
use sha2::{Digest, Sha256};

use super::AuditError;
use super::checkpoint::{Checkpoint, NotesFileError, read_notes_file, verify_note};
use super::keys::{VerifierKey, key_text, parse_key_text};
use super::merkle::Hash;
use crate::outbound::error_chain;

pub use local::{WitnessOptions, default_cosignature_file, start};

/// The file, next to the audit database, holding every cosigned checkpoint.
pub const COSIGNATURE_FILE: &str = "cosigned-checkpoints.log";
/// The C2SP cosignature key type byte of Ed25519 (`cosignature/v1`).
const COSIGNATURE_TYPE: u8 = 0x04;
/// The signature line prefix.
const SIGNATURE_PREFIX: &str = "\u{2014} ";
/// The longest one add-checkpoint request may take, connecting included.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest witness response read.
const MAX_RESPONSE_BYTES: usize = 16 * 1024;
/// The most leaves one submission may span: a witness further behind is brought up in
/// several submissions, each through a stored checkpoint (bounded memory).
pub(crate) const MAX_LEAVES_PER_SUBMISSION: u64 = 1 << 20;

/// A witness's public key: `<name>+<key id hex>+<base64(0x04 || Ed25519 key)>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessKey {
    pub name: String,
    pub key_id: [u8; 4],
    pub key: VerifyingKey,
}

/// key ID = SHA-256(name || "\n" || 0x04 || public key)[:4] (tlog-cosignature).
pub fn cosignature_key_id(name: &str, public_key: &[u8; 32]) -> [u8; 4] {
    let mut hasher = Sha256::new();
    hasher.update(name.as_bytes());
    hasher.update([0x0A, COSIGNATURE_TYPE]);
    hasher.update(public_key);
    let digest = hasher.finalize();
    [digest[0], digest[1], digest[2], digest[3]]
}

/// The message a `cosignature/v1` signs: the header, the time line, the note body.
pub fn cosigned_message(timestamp: u64, body: &str) -> String {
    format!("cosignature/v1\ntime {timestamp}\n{body}")
}

impl WitnessKey {
    pub fn new(name: &str, key: VerifyingKey) -> Self {
        WitnessKey {
            name: name.to_string(),
            key_id: cosignature_key_id(name, key.as_bytes()),
            key,
        }
    }

    /// Parses the vkey form, checking the type byte (0x04) and the key id.
    pub fn parse_vkey(text: &str) -> Result<Self, String> {
        let text = parse_key_text(text, COSIGNATURE_TYPE, "witness key")?;
        let key = VerifyingKey::from_bytes(&text.key)
            .map_err(|_| "the witness key is not a valid Ed25519 point".to_string())?;
        let parsed = WitnessKey::new(text.name, key);
        if crate::canonical::to_hex(parsed.key_id) != text.key_id {
            return Err(format!(
                "the key id `{}` does not match the witness key",
                text.key_id
            ));
        }
        Ok(parsed)
    }

    /// The vkey form.
    pub fn to_vkey(&self) -> String {
        key_text(
            &self.name,
            self.key_id,
            COSIGNATURE_TYPE,
            self.key.as_bytes(),
        )
    }

    /// Checks this witness's cosignatures on `note` (a checkpoint note with signature
    /// lines). Returns the newest timestamp among the valid ones; None when the note
    /// has no signature line of this key; an error when one does not verify.
    pub fn check_note(&self, note: &str) -> Result<Option<u64>, String> {
        let Some(split) = note.rfind("\n\n") else {
            return Err("the note has no signature lines".into());
        };
        let body = &note[..split + 1];
        let mut newest = None;
        for line in note[split + 2..].lines() {
            let Some(rest) = line.strip_prefix(SIGNATURE_PREFIX) else {
                return Err("a signature line does not start with an em dash".into());
            };
            let Some((name, sig)) = rest.split_once(' ') else {
                return Err("a signature line has no signature".into());
            };
            let Ok(sig) = B64.decode(sig) else {
                return Err("a signature is not base64".into());
            };
            if name != self.name || sig.len() < 4 || sig[..4] != self.key_id {
                continue;
            }
            let timestamp = self.verify_signature(body, &sig[4..]).ok_or_else(|| {
                format!("the cosignature of witness `{}` does not verify", self.name)
            })?;
            newest = newest.max(Some(timestamp));
        }
        Ok(newest)
    }

    /// Verifies a `timestamped_signature` (8-byte big-endian time, 64-byte Ed25519
    /// signature) over `body`; returns its time.
    fn verify_signature(&self, body: &str, signed: &[u8]) -> Option<u64> {
        if signed.len() != 72 {
            return None;
        }
        let timestamp = u64::from_be_bytes(signed[..8].try_into().ok()?);
        if timestamp > i64::MAX as u64 {
            return None;
        }
        let signature: [u8; 64] = signed[8..].try_into().ok()?;
        self.key
            .verify_strict(
                cosigned_message(timestamp, body).as_bytes(),
                &Signature::from_bytes(&signature),
            )
            .ok()
            .map(|()| timestamp)
    }
}

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

/// The signature lines of `answer` that are `key`'s (other keys' lines are ignored,
/// as the protocol says).
pub(crate) fn lines_of(answer: &str, key: &WitnessKey) -> String {
    let mut out = String::new();
    for line in answer.lines() {
        let ours = line
            .strip_prefix(SIGNATURE_PREFIX)
            .and_then(|r| r.split_once(' '))
            .is_some_and(|(name, sig)| {
                name == key.name
                    && B64
                        .decode(sig)
                        .is_ok_and(|s| s.len() >= 4 && s[..4] == key.key_id)
            });
        if ours {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Reads every cosigned note of a cosignature file (for `audit verify`).
pub fn read_cosigned(path: &Path) -> Result<Vec<String>, AuditError> {
    read_notes_file(path, "the cosignature file").map_err(|e| match e {
        NotesFileError::Io(what) => AuditError::Io {
            path: path.to_path_buf(),
            what,
        },
        NotesFileError::Malformed(what) => AuditError::Corrupt { seq: 0, what },
    })
}

/// What a set of cosigned notes proves for a quorum of witness keys.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WitnessReport {
    pub quorum: usize,
    /// The largest checkpoint size cosigned by at least `quorum` of the keys.
    pub witnessed_size: Option<u64>,
    /// Per witness key: the largest size it cosigned (None: none).
    pub witnesses: Vec<(String, Option<u64>)>,
}

/// Why cosignatures did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WitnessProblem {
    /// A cosignature by one of the keys does not verify, or a note is malformed.
    BadCosignature(String),
    /// No checkpoint is cosigned by a quorum of the keys.
    NoQuorum(String),
}

/// Checks `notes` (each a checkpoint signed by `log_key` with cosignature lines)
/// against `keys`: every cosignature line of a key must verify; the report gives the
/// largest size cosigned by at least `quorum` of them. Two cosigned checkpoints of one
/// size with different roots are a fork the witnesses were shown.
pub fn check_cosignatures(
    notes: &[String],
    log_key: &VerifierKey,
    keys: &[WitnessKey],
    quorum: usize,
) -> Result<(WitnessReport, Vec<Checkpoint>), WitnessProblem> {
    let mut by_size: std::collections::BTreeMap<u64, (Hash, std::collections::BTreeSet<usize>)> =
        std::collections::BTreeMap::new();
    let mut newest: Vec<Option<u64>> = vec![None; keys.len()];
    let mut checkpoints = Vec::new();
    for (i, note) in notes.iter().enumerate() {
        let checkpoint = verify_note(note, log_key).map_err(|e| {
            WitnessProblem::BadCosignature(format!("cosigned checkpoint {}: {e}", i + 1))
        })?;
        let entry = by_size
            .entry(checkpoint.size)
            .or_insert((checkpoint.root, std::collections::BTreeSet::new()));
        if entry.0 != checkpoint.root {
            return Err(WitnessProblem::BadCosignature(format!(
                "two cosigned checkpoints of size {} have different roots: the log forked",
                checkpoint.size
            )));
        }
        for (k, key) in keys.iter().enumerate() {
            match key.check_note(note) {
                Ok(Some(_)) => {
                    entry.1.insert(k);
                    newest[k] = newest[k].max(Some(checkpoint.size));
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(WitnessProblem::BadCosignature(format!(
                        "cosigned checkpoint {} (size {}): {e}",
                        i + 1,
                        checkpoint.size
                    )));
                }
            }
        }
        checkpoints.push(checkpoint);
    }
    // A witness that cosigned size n vouches for every smaller size it cosigned too;
    // a quorum at n needs `quorum` distinct keys on that very checkpoint.
    let witnessed_size = by_size
        .iter()
        .rev()
        .find(|(_, (_, signers))| signers.len() >= quorum.max(1))
        .map(|(size, _)| *size);
    let report = WitnessReport {
        quorum,
        witnessed_size,
        witnesses: keys
            .iter()
            .zip(newest)
            .map(|(k, n)| (k.name.clone(), n))
            .collect(),
    };
    if quorum > 0 && witnessed_size.is_none() {
        return Err(WitnessProblem::NoQuorum(format!(
            "no checkpoint is cosigned by {quorum} of the {} given witness keys ({})",
            keys.len(),
            report
                .witnesses
                .iter()
                .map(|(name, size)| match size {
                    Some(s) => format!("`{name}` cosigned up to size {s}"),
                    None => format!("`{name}` cosigned nothing"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok((report, checkpoints))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::keys::SignerKey;
    use crate::audit::merkle::leaf_hash;
    use ed25519_dalek::{Signer, SigningKey};

    fn cosign(signing: &SigningKey, name: &str, note: &str, time: u64) -> String {
        cosign_claiming(signing, name, note, time, time)
    }

    fn cosign_claiming(
        signing: &SigningKey,
        name: &str,
        note: &str,
        time: u64,
        claimed: u64,
    ) -> String {
        let body = &note[..note.rfind("\n\n").unwrap() + 1];
        let key = WitnessKey::new(name, signing.verifying_key());
        let sig = signing.sign(cosigned_message(time, body).as_bytes());
        let mut bytes = key.key_id.to_vec();
        bytes.extend_from_slice(&claimed.to_be_bytes());
        bytes.extend_from_slice(&sig.to_bytes());
        format!("\u{2014} {name} {}\n", B64.encode(bytes))
    }

    #[test]
    fn cosignatures_verify_and_count_toward_a_quorum() {
        let log = SignerKey::from_seed("toolgate/audit", [1; 32]).unwrap();
        let w1 = SigningKey::from_bytes(&[2; 32]);
        let w2 = SigningKey::from_bytes(&[3; 32]);
        let k1 = WitnessKey::new("w1.example", w1.verifying_key());
        let k2 = WitnessKey::new("w2.example", w2.verifying_key());
        assert_eq!(WitnessKey::parse_vkey(&k1.to_vkey()).unwrap(), k1);
        let note = Checkpoint {
            origin: "toolgate/audit".into(),
            size: 5,
            root: leaf_hash(b"r"),
        }
        .sign(&log);
        let both = format!(
            "{note}{}{}",
            cosign(&w1, "w1.example", &note, 100),
            cosign(&w2, "w2.example", &note, 101)
        );
        assert_eq!(k1.check_note(&both), Ok(Some(100)));
        let keys = [k1.clone(), k2.clone()];
        let (report, _) =
            check_cosignatures(std::slice::from_ref(&both), &log.verifier, &keys, 2).unwrap();
        assert_eq!(report.witnessed_size, Some(5));
        let one = format!("{note}{}", cosign(&w1, "w1.example", &note, 100));
        assert!(matches!(
            check_cosignatures(&[one], &log.verifier, &keys, 2),
            Err(WitnessProblem::NoQuorum(_))
        ));
        // A cosignature whose time was changed does not verify.
        let forged = format!(
            "{note}{}",
            cosign_claiming(&w1, "w1.example", &note, 100, 200)
        );
        assert!(matches!(
            check_cosignatures(&[forged], &log.verifier, &keys, 1),
            Err(WitnessProblem::BadCosignature(_))
        ));
    }

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
