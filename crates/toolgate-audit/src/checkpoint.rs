//! Checkpoints: the tree size and root hash of the log, signed as a C2SP signed note
//! (c2sp.org/signed-note, c2sp.org/tlog-checkpoint) with Ed25519.
//!
//! ```text
//! toolgate/audit            <- origin
//! 1042                      <- tree size
//! 3q2+7w...=                <- base64 of the RFC 9162 root hash
//!                           <- blank line
//! \u{2014} toolgate/audit AbCd...   <- em dash, key name, base64(key id || signature)
//! ```
//!
//! The signature covers the note text: the three lines, each ending in a newline.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use super::AuditError;
use super::keys::{SignerKey, VerifierKey};
use super::merkle::Hash;
use super::signer::Signer;

/// The em dash (U+2014) that opens a signature line, followed by a space.
const SIGNATURE_PREFIX: &str = "\u{2014} ";
/// A note larger than this is refused (bounded parsing).
pub const MAX_NOTE_BYTES: usize = 16 * 1024;
/// At most this many signature lines are read from one note.
const MAX_SIGNATURES: usize = 16;

/// What a checkpoint commits to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
}

impl Checkpoint {
    /// The note text: `origin\nsize\nbase64(root)\n`.
    pub fn body(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            B64.encode(self.root)
        )
    }

    /// The signed note: the body, a blank line, and one signature line.
    pub fn sign(&self, key: &SignerKey) -> String {
        let body = self.body();
        let mut sig = key.verifier.key_id.to_vec();
        sig.extend_from_slice(&key.sign(body.as_bytes()));
        format!(
            "{body}\n{SIGNATURE_PREFIX}{} {}\n",
            key.verifier.name,
            B64.encode(sig)
        )
    }

    /// The signed note, signed by `signer` (which may be another process).
    pub fn sign_with(&self, signer: &dyn Signer) -> Result<String, AuditError> {
        let body = self.body();
        let verifier = signer.verifier();
        let mut sig = verifier.key_id.to_vec();
        sig.extend_from_slice(&signer.sign(body.as_bytes())?);
        Ok(format!(
            "{body}\n{SIGNATURE_PREFIX}{} {}\n",
            verifier.name,
            B64.encode(sig)
        ))
    }
}

/// Why a note was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoteError {
    /// The text is not a well-formed checkpoint note.
    Malformed(String),
    /// No signature line names the key (by name and key id).
    NoSignatureByKey { key_name: String },
    /// A signature line names the key but its signature does not verify.
    BadSignature { key_name: String },
}

impl std::fmt::Display for NoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoteError::Malformed(what) => write!(f, "malformed checkpoint note: {what}"),
            NoteError::NoSignatureByKey { key_name } => {
                write!(f, "the checkpoint carries no signature by key `{key_name}`")
            }
            NoteError::BadSignature { key_name } => write!(
                f,
                "the checkpoint signature by key `{key_name}` does not verify"
            ),
        }
    }
}

/// Parses a checkpoint note and verifies it with `key`, following the signed-note rules:
/// signatures from other keys are ignored, a signature from `key` must verify, and at
/// least one must be present.
pub fn verify_note(note: &str, key: &VerifierKey) -> Result<Checkpoint, NoteError> {
    let malformed = |what: &str| NoteError::Malformed(what.to_string());
    if note.len() > MAX_NOTE_BYTES {
        return Err(malformed("the note is too large"));
    }
    if note.chars().any(|c| c.is_control() && c != '\n') {
        return Err(malformed("the note contains a control character"));
    }
    // The text ends at the last blank line.
    let split = note
        .rfind("\n\n")
        .ok_or_else(|| malformed("no blank line before the signatures"))?;
    let body = &note[..split + 1];
    let signatures = &note[split + 2..];
    let checkpoint = parse_body(body)?;
    if !signatures.ends_with('\n') {
        return Err(malformed(
            "the last signature line does not end in a newline",
        ));
    }
    let mut found = false;
    for (i, line) in signatures.lines().enumerate() {
        if i >= MAX_SIGNATURES {
            return Err(malformed("too many signature lines"));
        }
        let rest = line.strip_prefix(SIGNATURE_PREFIX).ok_or_else(|| {
            malformed("a signature line does not start with an em dash and a space")
        })?;
        let (name, sig) = rest
            .split_once(' ')
            .ok_or_else(|| malformed("a signature line has no signature"))?;
        let sig = B64
            .decode(sig)
            .map_err(|_| malformed("a signature is not valid base64"))?;
        if sig.len() < 4 || name != key.name || sig[..4] != key.key_id {
            continue;
        }
        let bytes: [u8; 64] = sig[4..].try_into().map_err(|_| NoteError::BadSignature {
            key_name: key.name.clone(),
        })?;
        if !key.verify(body.as_bytes(), &bytes) {
            return Err(NoteError::BadSignature {
                key_name: key.name.clone(),
            });
        }
        found = true;
    }
    if found {
        Ok(checkpoint)
    } else {
        Err(NoteError::NoSignatureByKey {
            key_name: key.name.clone(),
        })
    }
}

fn parse_body(body: &str) -> Result<Checkpoint, NoteError> {
    let malformed = |what: &str| NoteError::Malformed(what.to_string());
    let mut lines = body.lines();
    let origin = lines
        .next()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| malformed("no origin line"))?;
    let size_text = lines.next().ok_or_else(|| malformed("no tree size line"))?;
    if size_text.is_empty()
        || (size_text.len() > 1 && size_text.starts_with('0'))
        || !size_text.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(malformed(
            "the tree size is not a decimal number without leading zeroes",
        ));
    }
    let size: u64 = size_text
        .parse()
        .map_err(|_| malformed("the tree size is out of range"))?;
    let root_text = lines.next().ok_or_else(|| malformed("no root hash line"))?;
    let root: Hash = B64
        .decode(root_text)
        .ok()
        .and_then(|r| r.try_into().ok())
        .ok_or_else(|| malformed("the root hash is not 32 bytes of base64"))?;
    if lines.any(str::is_empty) {
        return Err(malformed("an extension line is empty"));
    }
    Ok(Checkpoint {
        origin: origin.to_string(),
        size,
        root,
    })
}

/// The largest file of notes read whole (a checkpoint sink's file, the cosignature
/// file).
pub const MAX_NOTES_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// Why a file of notes could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotesFileError {
    /// It cannot be read, or holds more than [`MAX_NOTES_FILE_BYTES`].
    Io(String),
    /// Text in it does not form a note.
    Malformed(String),
}

/// Reads a file of notes whole (at most [`MAX_NOTES_FILE_BYTES`], however large it
/// grows while being read); `what` names it in the errors (`the checkpoint file`).
pub fn read_notes_file(path: &Path, what: &str) -> Result<Vec<String>, NotesFileError> {
    read_notes_within(path, what, MAX_NOTES_FILE_BYTES)
}

fn read_notes_within(path: &Path, what: &str, max: u64) -> Result<Vec<String>, NotesFileError> {
    use crate::localfile::ReadError;
    let text = crate::localfile::read_to_string(path, max).map_err(|e| match e {
        ReadError::TooLarge { .. } => NotesFileError::Io(format!("{what} is too large")),
        e => NotesFileError::Io(format!("cannot read {what}: {e}")),
    })?;
    split_notes(&text)
        .map_err(|why| NotesFileError::Malformed(format!("`{}`: {why}", path.display())))
}

/// Splits a file of notes, each followed by a blank line (the sink file format), into
/// notes. Text that does not form a note is returned as an error with its line number.
pub fn split_notes(text: &str) -> Result<Vec<String>, String> {
    let mut notes = Vec::new();
    let mut current = String::new();
    let mut in_signatures = false;
    for (number, line) in text.lines().enumerate() {
        if line.is_empty() {
            if in_signatures {
                notes.push(std::mem::take(&mut current));
                in_signatures = false;
            } else if current.is_empty() {
                continue;
            } else {
                current.push('\n');
                in_signatures = true;
            }
            continue;
        }
        if in_signatures && !line.starts_with(SIGNATURE_PREFIX) {
            return Err(format!(
                "line {}: expected a signature line or a blank line",
                number + 1
            ));
        }
        current.push_str(line);
        current.push('\n');
        if current.len() > MAX_NOTE_BYTES {
            return Err(format!("line {}: a note is too large", number + 1));
        }
    }
    if in_signatures {
        notes.push(current);
    } else if !current.is_empty() {
        return Err("the last note has no signature".to_string());
    }
    Ok(notes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::merkle::leaf_hash;

    fn signer(name: &str, seed: u8) -> SignerKey {
        SignerKey::from_seed(name, [seed; 32]).unwrap()
    }

    #[test]
    fn a_notes_file_is_read_whole_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let key = signer("toolgate/audit", 1);
        let notes: Vec<String> = (1..=3)
            .map(|size| {
                Checkpoint {
                    origin: "toolgate/audit".into(),
                    size,
                    root: leaf_hash(&size.to_be_bytes()),
                }
                .sign(&key)
            })
            .collect();
        let file = dir.path().join("checkpoints.log");
        let text: String = notes.iter().map(|n| format!("{n}\n")).collect();
        std::fs::write(&file, &text).unwrap();
        assert_eq!(read_notes_file(&file, "the file").unwrap(), notes);
        let len = text.len() as u64;
        assert_eq!(read_notes_within(&file, "the file", len).unwrap(), notes);
        assert_eq!(
            read_notes_within(&file, "the file", len - 1),
            Err(NotesFileError::Io("the file is too large".into()))
        );
        std::fs::write(&file, "not a note\n").unwrap();
        assert!(matches!(
            read_notes_file(&file, "the file"),
            Err(NotesFileError::Malformed(_))
        ));
        assert!(matches!(
            read_notes_file(&dir.path().join("missing"), "the file"),
            Err(NotesFileError::Io(what)) if what.starts_with("cannot read the file")
        ));
    }

    #[test]
    fn a_signed_checkpoint_has_the_c2sp_shape_and_verifies() {
        let key = signer("toolgate/audit", 1);
        let cp = Checkpoint {
            origin: "toolgate/audit".into(),
            size: 12,
            root: leaf_hash(b"x"),
        };
        let note = cp.sign(&key);
        let lines: Vec<&str> = note.split('\n').collect();
        assert_eq!(lines[0], "toolgate/audit");
        assert_eq!(lines[1], "12");
        assert_eq!(B64.decode(lines[2]).unwrap(), cp.root.to_vec());
        assert_eq!(lines[3], "");
        assert!(lines[4].starts_with("\u{2014} toolgate/audit "));
        let sig = B64.decode(lines[4].rsplit(' ').next().unwrap()).unwrap();
        assert_eq!(sig.len(), 68);
        assert_eq!(sig[..4], key.verifier.key_id);
        assert_eq!(lines[5], "");
        assert_eq!(verify_note(&note, &key.verifier).unwrap(), cp);
    }

    #[test]
    fn wrong_keys_and_edits_are_rejected() {
        let key = signer("toolgate/audit", 1);
        let cp = Checkpoint {
            origin: "toolgate/audit".into(),
            size: 3,
            root: leaf_hash(b"y"),
        };
        let note = cp.sign(&key);
        let other = signer("toolgate/audit", 2);
        assert_eq!(
            verify_note(&note, &other.verifier),
            Err(NoteError::NoSignatureByKey {
                key_name: "toolgate/audit".into()
            })
        );
        let edited = note.replacen("\n3\n", "\n4\n", 1);
        assert_eq!(
            verify_note(&edited, &key.verifier),
            Err(NoteError::BadSignature {
                key_name: "toolgate/audit".into()
            })
        );
        // A signature by another key is ignored, ours still counts.
        let both = format!("{}{}", note, cp.sign(&other).lines().last().unwrap()) + "\n";
        assert_eq!(verify_note(&both, &key.verifier).unwrap(), cp);
        assert!(matches!(
            verify_note("nonsense", &key.verifier),
            Err(NoteError::Malformed(_))
        ));
    }

    #[test]
    fn notes_split_from_a_sink_file() {
        let key = signer("k", 3);
        let a = Checkpoint {
            origin: "o".into(),
            size: 1,
            root: leaf_hash(b"a"),
        }
        .sign(&key);
        let b = Checkpoint {
            origin: "o".into(),
            size: 2,
            root: leaf_hash(b"b"),
        }
        .sign(&key);
        let file = format!("{a}\n{b}\n");
        assert_eq!(split_notes(&file).unwrap(), vec![a, b]);
        assert!(split_notes("o\n1\n").is_err());
    }
}
