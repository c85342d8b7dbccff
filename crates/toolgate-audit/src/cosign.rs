//! Witness cosignatures (c2sp.org/tlog-cosignature): the cosignature key, its checks,
//! the cosignature file next to the log and the quorum check of stored cosignatures,
//! which `audit verify` and an export need. Asking witnesses to cosign (the
//! tlog-witness client) is the application's.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signature, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::AuditError;
use crate::checkpoint::{Checkpoint, NotesFileError, read_notes_file, verify_note};
use crate::keys::{VerifierKey, key_text, parse_key_text};
use crate::merkle::Hash;

/// The file, next to the audit database, holding every cosigned checkpoint.
pub const COSIGNATURE_FILE: &str = "cosigned-checkpoints.log";
/// The C2SP cosignature key type byte of Ed25519 (`cosignature/v1`).
const COSIGNATURE_TYPE: u8 = 0x04;
/// The signature line prefix.
const SIGNATURE_PREFIX: &str = "\u{2014} ";

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

/// The default cosignature file for a database.
pub fn default_cosignature_file(db_path: &Path) -> PathBuf {
    db_path
        .parent()
        .unwrap_or(Path::new("."))
        .join(COSIGNATURE_FILE)
}

/// The signature lines of `answer` that are `key`'s (other keys' lines are ignored,
/// as the protocol says).
pub fn lines_of(answer: &str, key: &WitnessKey) -> String {
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
    use crate::keys::SignerKey;
    use crate::merkle::leaf_hash;
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
}
