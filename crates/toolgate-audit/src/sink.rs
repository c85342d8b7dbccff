//! Publishing checkpoints outside the database: an append-only file (written and
//! fsynced by the writer itself), webhooks and syslog (best effort, from a helper
//! thread, so a slow endpoint never delays an append).
//!
//! The remote sinks (webhooks, syslog) get the newest signed note, latest wins: each has
//! a one-slot mailbox ([`tokio::sync::watch`]) that a newer note overwrites, so nothing
//! queues up behind a slow or dead endpoint and handing a note over never blocks. Besides
//! the periodic checkpoints they get the signed head of the newest commit batch
//! ([`Sinks::publish_head`], offered by the WAL thread at most every
//! [`HEAD_INTERVAL`]), so what a remote sink holds is never more than about that
//! interval (plus one delivery) behind the acknowledged events. File sinks keep the
//! periodic checkpoints only (one note per commit would grow them without bound).
//!
//! Webhooks are delivered by the application ([`WebhookClient`]: this crate holds no
//! HTTP client); the mailbox, the ordering and the bounds are here.
//!
//! INVARIANT: notes reach a remote sink in signing order (a note never replaces a newer
//! one); closing waits at most [`CLOSE_GRACE`] for the last note to go out.

use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::time::Duration;

use tokio::sync::watch;

use super::{AuditError, CheckpointSink};
use crate::localfile::ReadError;

/// A delivery of one note to a remote sink: Err is what went wrong, for the log.
pub type Delivery<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// One remote sink the application delivers to (a webhook).
pub trait NoteTarget: Send + Sync + 'static {
    /// How the sink is named in logs (`webhook https://...`).
    fn name(&self) -> String;
    /// Sends one signed note; bounded in time by the implementation.
    fn deliver<'a>(&'a self, note: &'a str) -> Delivery<'a>;
}

/// Builds the targets of the webhook sinks: the application's HTTP client stack.
pub trait WebhookClient: Send + Sync + std::fmt::Debug {
    /// One target per url of `urls`, in order; with `ca`, https trusts only that CA
    /// bundle. Err: a configuration error (a bad url, an unreadable CA, a CA with no
    /// https url), refused at open.
    fn targets(
        &self,
        urls: &[String],
        ca: Option<&Path>,
    ) -> Result<Vec<Box<dyn NoteTarget>>, String>;
}

/// How often the WAL thread offers the newest signed head to the remote sinks.
pub const HEAD_INTERVAL: Duration = Duration::from_secs(1);
/// How long closing waits for the remote sinks to send the last note.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// One signed note and the tree size it covers.
#[derive(Clone)]
struct Note {
    size: u64,
    text: Arc<str>,
}

pub(crate) struct Sinks {
    files: Vec<(PathBuf, File)>,
    remote: Option<Remote>,
}

/// The helper thread and the mailbox of the remote sinks.
struct Remote {
    newest: watch::Sender<Option<Note>>,
    /// The size of the newest note handed over.
    size: Option<u64>,
    /// Closed by the helper thread when it ends.
    done: Receiver<()>,
}

/// Where a remote sink delivers.
enum Target {
    Webhook(Box<dyn NoteTarget>),
    Syslog { socket: PathBuf },
}

impl Target {
    fn name(&self) -> String {
        match self {
            Target::Webhook(target) => target.name(),
            Target::Syslog { socket } => format!("syslog {}", socket.display()),
        }
    }
}

impl Sinks {
    /// Opens every file sink (creating it and its directory), has `webhooks` build the
    /// webhook sinks (with `ca`, https trusts only that CA bundle) and starts the helper
    /// thread if there is a webhook or syslog sink.
    pub(crate) fn open(
        sinks: &[CheckpointSink],
        ca: Option<&Path>,
        webhooks: Option<&dyn WebhookClient>,
    ) -> Result<Sinks, AuditError> {
        let config = |what: String| AuditError::Config { what };
        let mut files = Vec::new();
        let mut targets = Vec::new();
        let mut urls = Vec::new();
        for sink in sinks {
            match sink {
                CheckpointSink::File { path } => {
                    let io = |e: &dyn std::fmt::Display| AuditError::Io {
                        path: path.clone(),
                        what: format!("cannot open the checkpoint file: {e}"),
                    };
                    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                        crate::localfile::create_dir_all(dir).map_err(|e| io(&e))?;
                    }
                    let file = crate::localfile::open_append(path).map_err(|e| io(&e))?;
                    files.push((path.clone(), file));
                }
                CheckpointSink::Webhook { url } => urls.push(url.clone()),
                CheckpointSink::Syslog { socket } => targets.push(Target::Syslog {
                    socket: socket.clone(),
                }),
            }
        }
        if !urls.is_empty() || ca.is_some() {
            let Some(webhooks) = webhooks else {
                return Err(config(
                    "webhook checkpoint sinks need the application's webhook client \
                     (AuditOptions::webhooks)"
                        .into(),
                ));
            };
            let built = webhooks.targets(&urls, ca).map_err(config)?;
            targets.extend(built.into_iter().map(Target::Webhook));
        }
        let remote = if targets.is_empty() {
            None
        } else {
            let (newest, mailbox) = watch::channel(None);
            let (finished, done) = sync_channel::<()>(0);
            std::thread::Builder::new()
                .name("audit-sinks".into())
                .spawn(move || {
                    remote_loop(mailbox, targets);
                    drop(finished);
                })
                .map_err(|e| config(format!("cannot start the checkpoint sink thread: {e}")))?;
            Some(Remote {
                newest,
                size: None,
                done,
            })
        };
        Ok(Sinks { files, remote })
    }

    /// Publishes one signed checkpoint: appended to every file sink, handed to the
    /// remote sinks. Failures are logged, never returned: the checkpoint is already
    /// stored in the database.
    pub(crate) fn publish(&mut self, note: &str) {
        for (path, file) in &mut self.files {
            let written = file
                .write_all(note.as_bytes())
                .and_then(|()| file.write_all(b"\n"))
                .and_then(|()| file.sync_data());
            if let Err(e) = written {
                tracing::error!(path = %path.display(), error = %e, "cannot append the checkpoint to its file");
            }
        }
        if let Some(size) = note_size(note) {
            self.offer(size, note, true);
        }
    }

    /// Hands the signed head of the newest commit batch to the remote sinks (not to
    /// the files).
    pub(crate) fn publish_head(&mut self, size: u64, note: &str) {
        self.offer(size, note, false);
    }

    /// Whether there is a webhook or syslog sink.
    pub(crate) fn has_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Whether the remote sinks lack a note of `size` events or more.
    pub(crate) fn wants_head(&self, size: u64) -> bool {
        self.remote
            .as_ref()
            .is_some_and(|r| r.size.is_none_or(|have| have < size))
    }

    fn offer(&mut self, size: u64, note: &str, checkpoint: bool) {
        let Some(remote) = &mut self.remote else {
            return;
        };
        // Signing order: a note never replaces a newer one. A head of the size the
        // sinks already have adds nothing; a checkpoint of that size (an idle
        // heartbeat) goes out again, as the sign of life it is meant to be.
        if remote
            .size
            .is_some_and(|have| have > size || (have == size && !checkpoint))
        {
            return;
        }
        remote.size = Some(size);
        remote.newest.send_replace(Some(Note {
            size,
            text: Arc::from(note),
        }));
    }
}

impl Drop for Sinks {
    /// Closes the mailbox and waits (at most [`CLOSE_GRACE`]) for the helper thread to
    /// send the last note.
    fn drop(&mut self) {
        if let Some(remote) = self.remote.take() {
            drop(remote.newest);
            let _ = remote.done.recv_timeout(CLOSE_GRACE);
        }
    }
}

/// The tree size of a note (its second line).
fn note_size(note: &str) -> Option<u64> {
    note.lines().nth(1).and_then(|line| line.parse().ok())
}

/// The most bytes read from the end of a sink file to find its newest note.
const TAIL_BYTES: u64 = 1024 * 1024;

/// The newest note of a checkpoint sink file (None: no file, or no note yet). Reads at
/// most the last [`TAIL_BYTES`], so a years-long sink file costs nothing at start.
pub fn newest_note(path: &Path) -> Result<Option<String>, AuditError> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |e: &dyn std::fmt::Display| AuditError::Io {
        path: path.to_path_buf(),
        what: format!("cannot read the checkpoint file: {e}"),
    };
    let mut file = match crate::localfile::open(path) {
        Ok(file) => file,
        Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&e)),
    };
    let len = file.metadata().map_err(|e| io(&e))?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    file.seek(SeekFrom::Start(start)).map_err(|e| io(&e))?;
    let mut bytes = Vec::new();
    file.take(TAIL_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| io(&e))?;
    let text = String::from_utf8_lossy(&bytes);
    // Mid-file, skip to the start of a note: after a blank line that is not the one
    // between a note's text and its signatures.
    let from = if start == 0 {
        0
    } else {
        let mut found = None;
        let mut at = 0;
        while let Some(i) = text[at..].find("\n\n") {
            let next = at + i + 2;
            if !text[next..].starts_with('\u{2014}') && !text[next..].starts_with('\n') {
                found = Some(next);
                break;
            }
            at = next;
        }
        match found {
            Some(i) => i,
            None => return Ok(None),
        }
    };
    let notes =
        super::checkpoint::split_notes(&text[from..]).map_err(|what| AuditError::Corrupt {
            seq: 0,
            what: format!(
                "the checkpoint file `{}` is malformed: {what}",
                path.display()
            ),
        })?;
    Ok(notes.into_iter().next_back())
}

/// The helper thread: one task per remote sink on a small runtime of its own, each
/// sending the newest note whenever it changes; ends once the mailbox is closed and
/// every sink has sent (or failed to send) the last note.
fn remote_loop(mailbox: watch::Receiver<Option<Note>>, targets: Vec<Target>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the checkpoint sink runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let mut tasks = tokio::task::JoinSet::new();
        for target in targets {
            tasks.spawn(deliver_loop(mailbox.clone(), target));
        }
        drop(mailbox);
        while tasks.join_next().await.is_some() {}
    });
}

/// Sends each newest note to one sink. A failure is logged when the sink starts
/// failing and again when it recovers, not for every note.
async fn deliver_loop(mut mailbox: watch::Receiver<Option<Note>>, target: Target) {
    let mut failing = false;
    // `changed` still returns a note sent just before the mailbox closed.
    while mailbox.changed().await.is_ok() {
        let Some(note) = mailbox.borrow_and_update().clone() else {
            continue;
        };
        match deliver(&target, &note).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!(sink = %target.name(), size = note.size, "checkpoint sink delivers again");
            }
            Ok(()) => {}
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(sink = %target.name(), size = note.size, error = %error, "checkpoint sink failed; the checkpoint is signed and stored locally, newer ones will be sent when it is back");
            }
            Err(error) => {
                tracing::debug!(sink = %target.name(), size = note.size, error = %error, "checkpoint sink still failing");
            }
        }
    }
}

async fn deliver(target: &Target, note: &Note) -> Result<(), String> {
    match target {
        Target::Webhook(target) => target.deliver(&note.text).await,
        Target::Syslog { socket } => {
            // One line: facility local0, severity info (<134>).
            let message = format!(
                "<134>toolgate-audit: checkpoint {}",
                note.text.trim_end().replace('\n', " | ")
            );
            // Non-blocking: a full syslog socket drops this note rather than stall
            // the other sinks.
            let sock = std::os::unix::net::UnixDatagram::unbound().map_err(|e| e.to_string())?;
            sock.set_nonblocking(true).map_err(|e| e.to_string())?;
            sock.send_to(message.as_bytes(), socket)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// This crate has no HTTP client: a webhook sink, or a CA for one, with no
    /// [`WebhookClient`] given is refused at open, never silently left out.
    #[test]
    fn a_webhook_sink_without_the_applications_client_is_refused() {
        let webhook = [CheckpointSink::Webhook {
            url: "https://example.com/checkpoints".into(),
        }];
        assert!(matches!(
            Sinks::open(&webhook, None, None),
            Err(AuditError::Config { .. })
        ));
        assert!(matches!(
            Sinks::open(&[], Some(Path::new("/etc/ca.pem")), None),
            Err(AuditError::Config { .. })
        ));
        assert!(Sinks::open(&[], None, None).is_ok());
    }
}
