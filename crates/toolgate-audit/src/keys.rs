//! The two secrets of the audit log, kept in a key directory outside the database: the
//! Ed25519 key that signs checkpoints and the HMAC key of the argument commitments.
//!
//! Files (created on first use with mode 0600; the directory 0700):
//! - `audit-signing.key`: `PRIVATE+KEY+<name>+<key id hex>+<base64(0x01 || seed)>`
//! - `audit-signing.vkey`: `<name>+<key id hex>+<base64(0x01 || public key)>` (public;
//!   the "verifier key" format of Go's golang.org/x/mod/sumdb/note)
//! - `audit-hmac.key`: 32 random bytes, hex
//!
//! INVARIANT: key material is never written to the database or to a log line.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signature, VerifyingKey};
use sha2::{Digest, Sha256};

use super::AuditError;
use super::signer::Signer as CheckpointSigner;

pub const SIGNING_KEY_FILE: &str = "audit-signing.key";
pub const VERIFIER_KEY_FILE: &str = "audit-signing.vkey";
pub const HMAC_KEY_FILE: &str = "audit-hmac.key";

/// The C2SP signed-note signature type byte of Ed25519.
const ED25519_TYPE: u8 = 0x01;
/// Key files are tiny; refuse to read anything larger.
pub const MAX_KEY_FILE_BYTES: u64 = 4096;

/// key ID = SHA-256(key name || 0x0A || 0x01 || 32-byte public key)[:4].
pub fn key_id(name: &str, public_key: &[u8; 32]) -> [u8; 4] {
    let mut hasher = Sha256::new();
    hasher.update(name.as_bytes());
    hasher.update([0x0A, ED25519_TYPE]);
    hasher.update(public_key);
    let digest = hasher.finalize();
    [digest[0], digest[1], digest[2], digest[3]]
}

/// A key name is non-empty and has no whitespace and no `+` (signed-note rules).
pub fn valid_key_name(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == '+' || c.is_control())
}

/// The text form of every key file and key flag (Go's golang.org/x/mod/sumdb/note and
/// C2SP signed-note): `<name>+<key id hex>+<base64(type byte || 32 key bytes)>`. The
/// log's keys use type 0x01 (Ed25519), a witness's cosignature key 0x04.
pub(crate) fn key_text(name: &str, key_id: [u8; 4], key_type: u8, key: &[u8; 32]) -> String {
    let mut typed = vec![key_type];
    typed.extend_from_slice(key);
    format!(
        "{name}+{}+{}",
        crate::canonical::to_hex(key_id),
        B64.encode(typed)
    )
}

/// A key's text form taken apart: the name, the key id as written (the caller checks
/// it against the key) and the 32 key bytes. No Debug: for a private key file those
/// bytes are the seed.
pub(crate) struct KeyText<'a> {
    pub name: &'a str,
    pub key_id: &'a str,
    pub key: [u8; 32],
}

/// Reads [`key_text`]'s form of a key of type `key_type`; `what` names the key in the
/// errors (`key`, `witness key`).
pub(crate) fn parse_key_text<'a>(
    text: &'a str,
    key_type: u8,
    what: &str,
) -> Result<KeyText<'a>, String> {
    let mut parts = text.trim().splitn(3, '+');
    let (Some(name), Some(key_id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected `<name>+<key id>+<base64 key>`".into());
    };
    if !valid_key_name(name) {
        return Err(format!("invalid {what} name `{name}`"));
    }
    let raw = B64
        .decode(key)
        .map_err(|_| format!("the {what} is not valid base64"))?;
    let Some((&found, key)) = raw.split_first() else {
        return Err(format!("the {what} is empty"));
    };
    if found != key_type {
        return Err(format!(
            "the {what} has type byte {found:#04x}, not {key_type:#04x} (Ed25519)"
        ));
    }
    let key: [u8; 32] = key
        .try_into()
        .map_err(|_| format!("the {what} does not hold the 32 bytes of an Ed25519 key"))?;
    Ok(KeyText { name, key_id, key })
}

/// A public key that verifies checkpoint signatures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifierKey {
    pub name: String,
    pub key_id: [u8; 4],
    pub key: VerifyingKey,
}

impl VerifierKey {
    pub fn new(name: &str, key: VerifyingKey) -> Self {
        VerifierKey {
            name: name.to_string(),
            key_id: key_id(name, key.as_bytes()),
            key,
        }
    }

    /// Lowercase hex SHA-256 of the raw 32-byte public key: what an auditor compares.
    pub fn fingerprint(&self) -> String {
        crate::canonical::sha256_hex(self.key.as_bytes())
    }

    /// The `<name>+<key id hex>+<base64(0x01 || public key)>` form.
    pub fn to_vkey(&self) -> String {
        key_text(&self.name, self.key_id, ED25519_TYPE, self.key.as_bytes())
    }

    /// Parses the `vkey` form, checking that the key id matches the key.
    pub fn parse_vkey(text: &str) -> Result<Self, String> {
        let text = parse_key_text(text, ED25519_TYPE, "key")?;
        let key = VerifyingKey::from_bytes(&text.key)
            .map_err(|_| "the public key is not a valid Ed25519 point".to_string())?;
        let verifier = VerifierKey::new(text.name, key);
        if crate::canonical::to_hex(verifier.key_id) != text.key_id {
            return Err(format!(
                "the key id `{}` does not match the key",
                text.key_id
            ));
        }
        Ok(verifier)
    }

    /// Verifies an Ed25519 signature (RFC 8032, strict: no malleable signatures).
    pub fn verify(&self, message: &[u8], signature: &[u8; 64]) -> bool {
        self.key
            .verify_strict(message, &Signature::from_bytes(signature))
            .is_ok()
    }
}

/// The private checkpoint signing key and its name.
///
/// It signs with AWS-LC, which signs Ed25519 about twice as fast as `ed25519-dalek`
/// on the machines measured (two signatures per one-client call, docs/decisions.md);
/// what it signs is checked with dalek's strict verification ([`VerifierKey`]).
/// Ed25519 signatures are deterministic, so both give the same bytes (a unit test
/// holds the signer to RFC 8032's test vectors).
#[derive(Debug, Clone)]
pub struct SignerKey {
    signing: Arc<Ed25519KeyPair>,
    pub verifier: VerifierKey,
}

impl SignerKey {
    /// The key whose 32-byte private seed is `seed`, named `name`.
    pub fn from_seed(name: &str, seed: [u8; 32]) -> Result<Self, String> {
        let signing = Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|e| format!("the private key is not usable: {e}"))?;
        let public: [u8; 32] = signing
            .public_key()
            .as_ref()
            .try_into()
            .map_err(|_| "an Ed25519 public key has 32 bytes".to_string())?;
        let key = VerifyingKey::from_bytes(&public)
            .map_err(|_| "the public key is not a valid Ed25519 point".to_string())?;
        Ok(SignerKey {
            signing: Arc::new(signing),
            verifier: VerifierKey::new(name, key),
        })
    }

    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        let mut signature = [0u8; 64];
        signature.copy_from_slice(self.signing.sign(message).as_ref());
        signature
    }

    fn parse_skey(text: &str) -> Result<Self, String> {
        let rest = text
            .trim()
            .strip_prefix("PRIVATE+KEY+")
            .ok_or("expected `PRIVATE+KEY+<name>+<key id>+<base64 key>`")?;
        let text = parse_key_text(rest, ED25519_TYPE, "key")?;
        let signer = SignerKey::from_seed(text.name, text.key)?;
        if crate::canonical::to_hex(signer.verifier.key_id) != text.key_id {
            return Err(format!(
                "the key id `{}` does not match the key",
                text.key_id
            ));
        }
        Ok(signer)
    }
}

/// The `PRIVATE+KEY+<name>+<key id hex>+<base64(0x01 || seed)>` form of a new key.
fn to_skey(verifier: &VerifierKey, seed: &[u8; 32]) -> String {
    let key = key_text(&verifier.name, verifier.key_id, ED25519_TYPE, seed);
    format!("PRIVATE+KEY+{key}")
}

/// Both secrets: the checkpoint signer (the key file, or another process holding it)
/// and the HMAC key, loaded from (or created in) a key directory.
#[derive(Clone)]
pub struct Keys {
    pub signer: Arc<dyn CheckpointSigner>,
    pub hmac_key: [u8; 32],
}

/// Shows the signer's public key; never the HMAC key (it would let anyone who reads a
/// log line confirm guessed arguments against their commitments).
impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("signer", &self.signer.verifier())
            .field("hmac_key", &"(redacted)")
            .finish()
    }
}

/// Refuses a key directory (or key file in it) that anyone but its owner can write:
/// whoever can replace the key can sign a rewritten log.
pub fn check_private(dir: &Path) -> Result<(), AuditError> {
    use std::os::unix::fs::PermissionsExt;
    let mut paths = vec![dir.to_path_buf()];
    for name in [SIGNING_KEY_FILE, VERIFIER_KEY_FILE, HMAC_KEY_FILE] {
        if dir.join(name).exists() {
            paths.push(dir.join(name));
        }
    }
    for path in paths {
        let meta = fs::symlink_metadata(&path)
            .map_err(|e| key_error(&path, format!("cannot inspect: {e}")))?;
        if meta.file_type().is_symlink() {
            return Err(key_error(&path, "is a symbolic link; give the real path"));
        }
        let mode = meta.permissions().mode();
        if mode & 0o022 != 0 {
            return Err(key_error(
                &path,
                format!(
                    "is writable by group or others (mode {:o}); run `chmod go-w` on it",
                    mode & 0o777
                ),
            ));
        }
    }
    Ok(())
}

fn key_error(path: &Path, what: impl Into<String>) -> AuditError {
    AuditError::Key {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

fn read_small(path: &Path) -> Result<String, AuditError> {
    crate::localfile::read_to_string(path, MAX_KEY_FILE_BYTES)
        .map_err(|e| key_error(path, format!("cannot read the key file: {e}")))
}

fn random_32(path: &Path) -> Result<[u8; 32], AuditError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| key_error(path, format!("no randomness for a new key: {e}")))?;
    Ok(bytes)
}

/// Writes a new file that did not exist, owner-only, and syncs it.
fn write_new(path: &Path, contents: &str) -> Result<(), AuditError> {
    let mut file = crate::localfile::create(path, true)
        .map_err(|e| key_error(path, format!("cannot create the key file: {e}")))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| key_error(path, format!("cannot write the key file: {e}")))
}

impl Keys {
    /// Loads the keys from `dir`, creating the directory and, if `may_create` (a new,
    /// empty log), any missing key. A new signing key is named `name`; an existing one
    /// keeps the name it was made with. For an existing log a missing key is an error:
    /// a new one could neither verify its checkpoints nor its argument commitments.
    pub fn load_or_create(dir: &Path, name: &str, may_create: bool) -> Result<Keys, AuditError> {
        if !valid_key_name(name) {
            return Err(key_error(
                dir,
                format!("invalid key name `{name}`: it must be non-empty, without spaces or `+`"),
            ));
        }
        if !dir.exists() {
            crate::localfile::create_dir_all(dir)
                .map_err(|e| key_error(dir, format!("cannot create the key directory: {e}")))?;
        }
        let signing_path = dir.join(SIGNING_KEY_FILE);
        let signer = if signing_path.exists() {
            SignerKey::parse_skey(&read_small(&signing_path)?)
                .map_err(|e| key_error(&signing_path, e))?
        } else if !may_create {
            return Err(key_error(
                &signing_path,
                "the log already has events but its signing key is missing",
            ));
        } else {
            new_signer(&signing_path, name)?
        };
        check_or_write_vkey(dir, &signer.verifier)?;
        let hmac_key = load_hmac(dir, may_create)?;
        Ok(Keys {
            signer: Arc::new(signer),
            hmac_key,
        })
    }

    /// The keys of a log signed by `signer` (e.g. a [`super::signer::SocketSigner`]):
    /// the HMAC key from `dir`, and the public key recorded there (written on first use,
    /// checked against the signer afterwards).
    pub fn with_signer(
        dir: &Path,
        signer: Arc<dyn CheckpointSigner>,
        may_create: bool,
    ) -> Result<Keys, AuditError> {
        if !dir.exists() {
            crate::localfile::create_dir_all(dir)
                .map_err(|e| key_error(dir, format!("cannot create the key directory: {e}")))?;
        }
        check_or_write_vkey(dir, signer.verifier())?;
        let hmac_key = load_hmac(dir, may_create)?;
        Ok(Keys { signer, hmac_key })
    }
}

/// Checks the `vkey` file in `dir` names `verifier`, or writes it.
fn check_or_write_vkey(dir: &Path, verifier: &VerifierKey) -> Result<(), AuditError> {
    let vkey_path = dir.join(VERIFIER_KEY_FILE);
    if vkey_path.exists() {
        let stored = VerifierKey::parse_vkey(&read_small(&vkey_path)?)
            .map_err(|e| key_error(&vkey_path, e))?;
        if stored != *verifier {
            return Err(key_error(
                &vkey_path,
                "the public key does not belong to the signing key next to it",
            ));
        }
    } else {
        write_new(&vkey_path, &format!("{}\n", verifier.to_vkey()))?;
    }
    Ok(())
}

/// Loads the HMAC key from `dir`, creating it if `may_create`.
fn load_hmac(dir: &Path, may_create: bool) -> Result<[u8; 32], AuditError> {
    let hmac_path = dir.join(HMAC_KEY_FILE);
    let hmac_key = if hmac_path.exists() {
        let text = read_small(&hmac_path)?;
        let bytes = hex::decode(text.trim())
            .map_err(|_| key_error(&hmac_path, "the hmac key is not hex"))?;
        bytes
            .try_into()
            .map_err(|_| key_error(&hmac_path, "the hmac key must have 32 bytes"))?
    } else if !may_create {
        return Err(key_error(
            &hmac_path,
            "the log already has events but its hmac key is missing",
        ));
    } else {
        let key = random_32(&hmac_path)?;
        write_new(&hmac_path, &format!("{}\n", crate::canonical::to_hex(key)))?;
        key
    };
    Ok(hmac_key)
}

/// Loads only the public key from `dir`: the `vkey` file, or, failing that, the public
/// half of the signing key.
pub fn load_verifier(dir: &Path) -> Result<VerifierKey, AuditError> {
    let vkey_path = dir.join(VERIFIER_KEY_FILE);
    if vkey_path.exists() {
        return VerifierKey::parse_vkey(&read_small(&vkey_path)?)
            .map_err(|e| key_error(&vkey_path, e));
    }
    let signing_path = dir.join(SIGNING_KEY_FILE);
    if signing_path.exists() {
        return Ok(SignerKey::parse_skey(&read_small(&signing_path)?)
            .map_err(|e| key_error(&signing_path, e))?
            .verifier);
    }
    Err(key_error(
        dir,
        format!("no `{VERIFIER_KEY_FILE}` or `{SIGNING_KEY_FILE}` in the key directory"),
    ))
}

/// Loads the existing signing key from `dir`; never creates one.
pub fn load_signer(dir: &Path) -> Result<SignerKey, AuditError> {
    let signing_path = dir.join(SIGNING_KEY_FILE);
    if !signing_path.exists() {
        return Err(key_error(
            dir,
            format!("no `{SIGNING_KEY_FILE}` in the key directory"),
        ));
    }
    SignerKey::parse_skey(&read_small(&signing_path)?).map_err(|e| key_error(&signing_path, e))
}

/// Creates a new signing key (and its `vkey` file) in `dir`, for `toolgate signer`.
pub fn create_signer(dir: &Path, name: &str) -> Result<SignerKey, AuditError> {
    if !valid_key_name(name) {
        return Err(key_error(dir, format!("invalid key name `{name}`")));
    }
    if !dir.exists() {
        crate::localfile::create_dir_all(dir)
            .map_err(|e| key_error(dir, format!("cannot create the key directory: {e}")))?;
    }
    let signing_path = dir.join(SIGNING_KEY_FILE);
    let signer = new_signer(&signing_path, name)?;
    check_or_write_vkey(dir, &signer.verifier)?;
    Ok(signer)
}

/// A new random signing key named `name`, written to `path` (which must not exist).
fn new_signer(path: &Path, name: &str) -> Result<SignerKey, AuditError> {
    let seed = random_32(path)?;
    let signer = SignerKey::from_seed(name, seed).map_err(|e| key_error(path, e))?;
    write_new(path, &format!("{}\n", to_skey(&signer.verifier, &seed)))?;
    Ok(signer)
}

/// The default key directory for a database: `<db dir>/keys`.
pub fn default_key_dir(db_path: &Path) -> PathBuf {
    db_path.parent().unwrap_or(Path::new(".")).join("keys")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_created_once_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let keys = Keys::load_or_create(&dir.path().join("keys"), "example.com/log", true).unwrap();
        let again = Keys::load_or_create(&dir.path().join("keys"), "other.name", false).unwrap();
        // An existing log never gets a fresh key.
        let err = Keys::load_or_create(&dir.path().join("other-keys"), "x", false).unwrap_err();
        assert!(matches!(err, AuditError::Key { .. }), "{err:?}");
        assert!(
            !dir.path()
                .join("other-keys")
                .join(SIGNING_KEY_FILE)
                .exists()
        );
        assert_eq!(keys.signer.verifier(), again.signer.verifier());
        assert_eq!(again.signer.verifier().name, "example.com/log");
        assert_eq!(keys.hmac_key, again.hmac_key);
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dir.path().join("keys").join(SIGNING_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let loaded = load_verifier(&dir.path().join("keys")).unwrap();
        assert_eq!(&loaded, keys.signer.verifier());
        let sig = keys.signer.sign(b"hello").unwrap();
        assert!(loaded.verify(b"hello", &sig));
        assert!(!loaded.verify(b"hellO", &sig));
    }

    /// RFC 8032 section 7.1, tests 1-3: the signer gives exactly these signatures, and
    /// the strict verifier accepts them (and refuses them for another message).
    #[test]
    fn the_signer_matches_rfc_8032_and_the_strict_verifier_accepts_it() {
        let vectors = [
            (
                "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
                "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
                "",
                "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155\
                 5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
            ),
            (
                "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
                "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
                "72",
                "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da\
                 085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
            ),
            (
                "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
                "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
                "af82",
                "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac\
                 18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
            ),
        ];
        for (seed, public, message, signature) in vectors {
            let seed: [u8; 32] = hex::decode(seed).unwrap().try_into().unwrap();
            let message = hex::decode(message).unwrap();
            let signer = SignerKey::from_seed("rfc8032", seed).unwrap();
            assert_eq!(hex::encode(signer.verifier.key.as_bytes()), public);
            let signed = signer.sign(&message);
            assert_eq!(hex::encode(signed), signature);
            assert!(signer.verifier.verify(&message, &signed));
            assert!(!signer.verifier.verify(b"another message", &signed));
        }
    }

    /// Keys are printed in errors and traces by `{:?}`: never a secret, in any of the
    /// forms it could take (bytes, hex, base64).
    #[test]
    fn keys_never_print_their_secrets() {
        let seed = [0x5a_u8; 32];
        let hmac_key = [0x77_u8; 32];
        let signer = SignerKey::from_seed("a.example/log", seed).unwrap();
        let keys = Keys {
            signer: Arc::new(signer.clone()),
            hmac_key,
        };
        let printed = format!("{signer:?} {keys:?}");
        assert!(printed.contains("a.example/log"), "{printed}");
        for secret in [seed, hmac_key] {
            let forms = [
                hex::encode(secret),
                format!("{}, {}, {}", secret[0], secret[0], secret[0]),
                B64.encode(secret)[..16].to_string(),
            ];
            let printed = printed.to_lowercase();
            for form in forms {
                let form = form[..form.len().min(16)].to_lowercase();
                assert!(!printed.contains(&form), "{form} in {printed}");
            }
        }
    }

    #[test]
    fn vkey_round_trips_and_rejects_a_wrong_id() {
        let signer = SignerKey::from_seed("a.example/log", [7u8; 32]).unwrap();
        let vkey = signer.verifier.to_vkey();
        assert_eq!(VerifierKey::parse_vkey(&vkey).unwrap(), signer.verifier);
        let mut parts: Vec<&str> = vkey.split('+').collect();
        parts[1] = "00000000";
        assert!(VerifierKey::parse_vkey(&parts.join("+")).is_err());
    }

    /// The one reader of every key's text form: what it takes apart, and each thing it
    /// refuses (a key of the other type among them: a witness's cosignature key is no
    /// log key, nor the reverse).
    #[test]
    fn the_key_text_form_round_trips_and_refuses_what_is_not_a_key_of_its_type() {
        let key = [5u8; 32];
        let text = key_text("a.example/log", [1, 2, 3, 4], ED25519_TYPE, &key);
        assert!(text.starts_with("a.example/log+01020304+"), "{text}");
        let padded = format!(" {text}\n");
        let parsed = parse_key_text(&padded, ED25519_TYPE, "key").unwrap();
        assert_eq!(
            (parsed.name, parsed.key_id, parsed.key),
            ("a.example/log", "01020304", key)
        );
        let typed = |bytes: &[u8]| format!("n+01020304+{}", B64.encode(bytes));
        let short = typed(&[ED25519_TYPE; 32]);
        let long = typed(&[ED25519_TYPE; 34]);
        let cases: [(&str, &str); 8] = [
            ("no parts", "expected"),
            ("n+01020304", "expected"),
            ("bad name+01020304+AQ==", "invalid key name"),
            ("+01020304+AQ==", "invalid key name"),
            ("n+01020304+not base64!", "not valid base64"),
            ("n+01020304+", "is empty"),
            (&short, "32 bytes"),
            (&long, "32 bytes"),
        ];
        for (text, why) in cases {
            let error = parse_key_text(text, ED25519_TYPE, "key").err();
            assert!(
                error.as_deref().is_some_and(|e| e.contains(why)),
                "{text}: {error:?}"
            );
        }
        let other = key_text("n", [0; 4], 0x04, &key);
        // KeyText has no Debug (a private key file's seed passes through it).
        let error = parse_key_text(&other, ED25519_TYPE, "key")
            .err()
            .unwrap_or_default();
        assert!(error.contains("type byte 0x04, not 0x01"), "{error}");
    }
}
