//! Who signs checkpoints and export manifests: the [`Signer`] interface, the file
//! signer (a [`SignerKey`] loaded from a key directory) and the socket signer (a
//! separate `toolgate signer` process, reached over a Unix socket), plus that
//! process's server loop.
//!
//! # The signer protocol (one request, one response, repeated on one connection)
//!
//! ```text
//! request:  op (1 byte) | length (u32, big endian) | payload (length bytes)
//! response: status (1 byte, 0 ok, 1 refused) | length (u32, big endian) | payload
//! ```
//!
//! - op `P` (public key), empty payload: the payload answered is the verifier key in
//!   the `<name>+<key id hex>+<base64>` form.
//! - op `S` (sign), the payload is the message: the payload answered is the 64-byte
//!   Ed25519 signature. The signer signs only a checkpoint body
//!   (`origin\nsize\nbase64 root\n`) or an export manifest statement (starting with
//!   [`MANIFEST_DOMAIN`]), so the key cannot be used to sign anything else.
//! - A refusal's payload is a UTF-8 reason.
//!
//! Every length is at most [`MAX_MESSAGE_BYTES`]; a larger one closes the connection.
//! The client waits at most [`IO_TIMEOUT`] for each step and fails closed.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::AuditError;
use super::keys::{SignerKey, VerifierKey};

/// The largest payload in either direction.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// How long the client waits for a connection, a write or an answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// The first line of every export manifest statement the signer signs.
pub const MANIFEST_DOMAIN: &str = "toolgate-audit-export-manifest/1\n";

/// The most connections the signer serves at once.
pub const MAX_CONNECTIONS: usize = 64;

const OP_PUBLIC_KEY: u8 = b'P';
const OP_SIGN: u8 = b'S';
const STATUS_OK: u8 = 0;
const STATUS_REFUSED: u8 = 1;

/// Signs checkpoint bodies and manifest statements with the log's Ed25519 key.
pub trait Signer: Send + Sync + std::fmt::Debug {
    /// The public key that verifies this signer's signatures.
    fn verifier(&self) -> &VerifierKey;
    /// The Ed25519 signature of `message`, or why there is none (fail closed).
    fn sign(&self, message: &[u8]) -> Result<[u8; 64], AuditError>;
    /// Whether signing is pure computation in this process (no I/O, no waiting on
    /// another process). Only then may a commit run on the appending thread
    /// (`log.rs`, "Quiet commits").
    fn in_process(&self) -> bool {
        false
    }
}

impl Signer for SignerKey {
    fn verifier(&self) -> &VerifierKey {
        &self.verifier
    }

    fn sign(&self, message: &[u8]) -> Result<[u8; 64], AuditError> {
        Ok(SignerKey::sign(self, message))
    }

    fn in_process(&self) -> bool {
        true
    }
}

/// A signer in another process, reached over a Unix socket (see the module docs).
#[derive(Debug)]
pub struct SocketSigner {
    socket: PathBuf,
    verifier: VerifierKey,
    /// One connection, reopened after any failure.
    conn: Mutex<Option<UnixStream>>,
}

fn signer_error(socket: &Path, what: impl Into<String>) -> AuditError {
    AuditError::Signer {
        socket: socket.to_path_buf(),
        what: what.into(),
    }
}

impl SocketSigner {
    /// Connects to the signer and asks for its public key.
    pub fn connect(socket: &Path) -> Result<SocketSigner, AuditError> {
        let mut conn = None;
        let answer = exchange(socket, &mut conn, OP_PUBLIC_KEY, b"")?;
        let text = String::from_utf8(answer)
            .map_err(|_| signer_error(socket, "the public key is not UTF-8"))?;
        let verifier = VerifierKey::parse_vkey(&text)
            .map_err(|e| signer_error(socket, format!("the public key is invalid: {e}")))?;
        Ok(SocketSigner {
            socket: socket.to_path_buf(),
            verifier,
            conn: Mutex::new(conn),
        })
    }
}

impl Signer for SocketSigner {
    fn verifier(&self) -> &VerifierKey {
        &self.verifier
    }

    fn sign(&self, message: &[u8]) -> Result<[u8; 64], AuditError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let answer = exchange(&self.socket, &mut conn, OP_SIGN, message)?;
        let signature: [u8; 64] = answer
            .try_into()
            .map_err(|_| signer_error(&self.socket, "the signature is not 64 bytes"))?;
        // A signer answering with another key's signature must not pass unnoticed.
        if !self.verifier.verify(message, &signature) {
            return Err(signer_error(
                &self.socket,
                "the signature does not verify with the signer's public key",
            ));
        }
        Ok(signature)
    }
}

/// One request over `conn` (connecting first if needed); any failure drops the
/// connection so the next request starts on a fresh one.
fn exchange(
    socket: &Path,
    conn: &mut Option<UnixStream>,
    op: u8,
    payload: &[u8],
) -> Result<Vec<u8>, AuditError> {
    if payload.len() > MAX_MESSAGE_BYTES {
        return Err(signer_error(socket, "the message is too large to sign"));
    }
    let result = (|| {
        if conn.is_none() {
            let stream = UnixStream::connect(socket)
                .map_err(|e| signer_error(socket, format!("cannot connect: {e}")))?;
            stream
                .set_read_timeout(Some(IO_TIMEOUT))
                .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
                .map_err(|e| signer_error(socket, e.to_string()))?;
            *conn = Some(stream);
        }
        let Some(stream) = conn.as_mut() else {
            return Err(signer_error(socket, "no connection"));
        };
        write_frame(stream, op, payload).map_err(|e| signer_error(socket, e.to_string()))?;
        let (status, answer) =
            read_frame(stream).map_err(|e| signer_error(socket, e.to_string()))?;
        match status {
            STATUS_OK => Ok(answer),
            _ => Err(signer_error(
                socket,
                format!("refused: {}", String::from_utf8_lossy(&answer)),
            )),
        }
    })();
    if result.is_err() {
        conn.take();
    }
    result
}

fn write_frame(stream: &mut UnixStream, head: u8, payload: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(5 + payload.len());
    frame.push(head);
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    stream.write_all(&frame)
}

fn read_frame(stream: &mut UnixStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes exceeds the limit of {MAX_MESSAGE_BYTES}"),
        ));
    }
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload)?;
    Ok((head[0], payload))
}

/// Whether the signer may sign `message`: a checkpoint body or a manifest statement.
pub fn signable(message: &[u8]) -> Result<(), String> {
    if message.starts_with(MANIFEST_DOMAIN.as_bytes()) {
        return Ok(());
    }
    let text = std::str::from_utf8(message).map_err(|_| "the message is not UTF-8")?;
    let lines: Vec<&str> = text.split('\n').collect();
    // `origin\nsize\nroot\n` splits into four parts, the last one empty.
    let well_formed = lines.len() == 4
        && lines[3].is_empty()
        && !lines[0].is_empty()
        && lines[1].bytes().all(|b| b.is_ascii_digit())
        && !lines[1].is_empty()
        && lines[2].len() == 44;
    if well_formed {
        Ok(())
    } else {
        Err("only checkpoint bodies and export manifest statements are signed".into())
    }
}

/// Serves signing requests on `socket` with `key` until the process is stopped. Each
/// connection is served on its own thread (at most [`MAX_CONNECTIONS`] at once); a
/// connection idle for a minute is closed.
pub fn serve(key: SignerKey, socket: &Path) -> Result<(), AuditError> {
    use std::os::unix::fs::PermissionsExt;
    if socket.exists() {
        // A stale socket of an earlier run; a live one means another signer runs.
        if UnixStream::connect(socket).is_ok() {
            return Err(signer_error(socket, "another signer is listening here"));
        }
        std::fs::remove_file(socket)
            .map_err(|e| signer_error(socket, format!("cannot remove the stale socket: {e}")))?;
    }
    let listener = UnixListener::bind(socket)
        .map_err(|e| signer_error(socket, format!("cannot listen: {e}")))?;
    // Only the owner and the group (the gateway's user, in the documented set-up).
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| signer_error(socket, format!("cannot set the socket's mode: {e}")))?;
    let key = std::sync::Arc::new(key);
    let open = std::sync::Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        // Bounded: a connection beyond the limit is closed at once.
        if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (key, done) = (key.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("signer-conn".into())
            .spawn(move || {
                serve_connection(&key, stream);
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            open.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "cannot start a signer connection thread");
        }
    }
    Ok(())
}

fn serve_connection(key: &SignerKey, mut stream: UnixStream) {
    let idle = Some(Duration::from_secs(60));
    if stream.set_read_timeout(idle).is_err() || stream.set_write_timeout(idle).is_err() {
        return;
    }
    while let Ok((op, payload)) = read_frame(&mut stream) {
        let (status, answer) = match op {
            OP_PUBLIC_KEY => (STATUS_OK, key.verifier.to_vkey().into_bytes()),
            OP_SIGN => match signable(&payload) {
                Ok(()) => (STATUS_OK, key.sign(&payload).to_vec()),
                Err(why) => (STATUS_REFUSED, why.into_bytes()),
            },
            _ => (STATUS_REFUSED, b"unknown operation".to_vec()),
        };
        if write_frame(&mut stream, status, &answer).is_err() {
            return;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::merkle::leaf_hash;

    #[test]
    fn the_socket_signer_signs_checkpoints_and_refuses_anything_else() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("signer.sock");
        let key = SignerKey::from_seed("toolgate/audit", [5; 32]).unwrap();
        let expected = key.verifier.clone();
        let served = socket.clone();
        std::thread::spawn(move || serve(key, &served));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let signer = loop {
            match SocketSigner::connect(&socket) {
                Ok(s) => break s,
                Err(e) if std::time::Instant::now() > deadline => panic!("{e}"),
                Err(_) => std::thread::yield_now(),
            }
        };
        assert_eq!(signer.verifier(), &expected);
        let cp = Checkpoint {
            origin: "toolgate/audit".into(),
            size: 3,
            root: leaf_hash(b"x"),
        };
        let note = cp.sign_with(&signer).unwrap();
        assert_eq!(
            crate::checkpoint::verify_note(&note, &expected).unwrap(),
            cp
        );
        let err = signer.sign(b"anything else").unwrap_err();
        assert!(err.to_string().contains("only checkpoint bodies"), "{err}");
        // The connection survives a refusal; a huge message is refused locally.
        assert!(signer.sign(cp.body().as_bytes()).is_ok());
        let huge = vec![b'a'; MAX_MESSAGE_BYTES + 1];
        assert!(signer.sign(&huge).is_err());
        let manifest = format!("{MANIFEST_DOMAIN}{{}}");
        assert!(signer.sign(manifest.as_bytes()).is_ok());
    }

    #[test]
    fn an_unreachable_signer_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let err = SocketSigner::connect(&dir.path().join("none.sock")).unwrap_err();
        assert!(matches!(err, AuditError::Signer { .. }), "{err:?}");
    }
}
