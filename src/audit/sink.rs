//! Publishing checkpoints outside the database: an append-only file (written and
//! fsynced by the writer itself), webhooks and syslog (best effort, from a helper
//! thread with a bounded queue, so a slow endpoint never delays an append).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::Duration;

use super::{AuditError, CheckpointSink};

/// Notes waiting for the best-effort sinks; more are dropped with a warning.
const QUEUE: usize = 64;
/// The longest one webhook POST may take.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct Sinks {
    files: Vec<(PathBuf, File)>,
    remote: Option<SyncSender<String>>,
}

impl Sinks {
    /// Opens every file sink (creating it and its directory) and starts the helper
    /// thread if there is a webhook or syslog sink.
    pub(crate) fn open(sinks: &[CheckpointSink]) -> Result<Sinks, AuditError> {
        let mut files = Vec::new();
        let mut webhooks = Vec::new();
        let mut syslogs = Vec::new();
        for sink in sinks {
            match sink {
                CheckpointSink::File { path } => {
                    let io = |e: std::io::Error| AuditError::Io {
                        path: path.clone(),
                        what: format!("cannot open the checkpoint file: {e}"),
                    };
                    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                        std::fs::create_dir_all(dir).map_err(io)?;
                    }
                    let file = OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map_err(io)?;
                    files.push((path.clone(), file));
                }
                CheckpointSink::Webhook { url } => {
                    let uri: hyper::Uri = url.parse().map_err(|_| AuditError::Config {
                        what: format!("webhook url `{url}` is not a valid url"),
                    })?;
                    if uri.scheme_str() != Some("http") || uri.host().is_none() {
                        return Err(AuditError::Config {
                            what: format!("webhook url `{url}` must be `http://host[:port]/path`"),
                        });
                    }
                    webhooks.push(uri);
                }
                CheckpointSink::Syslog { socket } => syslogs.push(socket.clone()),
            }
        }
        let remote = if webhooks.is_empty() && syslogs.is_empty() {
            None
        } else {
            let (tx, rx) = sync_channel::<String>(QUEUE);
            std::thread::Builder::new()
                .name("audit-sinks".into())
                .spawn(move || remote_loop(rx, webhooks, syslogs))
                .map_err(|e| AuditError::Config {
                    what: format!("cannot start the checkpoint sink thread: {e}"),
                })?;
            Some(tx)
        };
        Ok(Sinks { files, remote })
    }

    /// Publishes one signed note. Failures are logged, never returned: the checkpoint is
    /// already stored in the database.
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
        if let Some(tx) = &self.remote {
            match tx.try_send(note.to_string()) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => tracing::warn!(
                    "checkpoint sink queue full; a checkpoint was not sent to the webhook/syslog sinks"
                ),
                Err(TrySendError::Disconnected(_)) => {
                    tracing::warn!("checkpoint sink thread stopped")
                }
            }
        }
    }
}

/// The most bytes read from the end of a sink file to find its newest note.
const TAIL_BYTES: u64 = 1024 * 1024;

/// The newest note of a checkpoint sink file (None: no file, or no note yet). Reads at
/// most the last [`TAIL_BYTES`], so a years-long sink file costs nothing at start.
pub(crate) fn newest_note(path: &Path) -> Result<Option<String>, AuditError> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |e: std::io::Error| AuditError::Io {
        path: path.to_path_buf(),
        what: format!("cannot read the checkpoint file: {e}"),
    };
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let len = file.metadata().map_err(io)?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    file.seek(SeekFrom::Start(start)).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(TAIL_BYTES).read_to_end(&mut bytes).map_err(io)?;
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

fn remote_loop(
    rx: std::sync::mpsc::Receiver<String>,
    webhooks: Vec<hyper::Uri>,
    syslogs: Vec<PathBuf>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the webhook runtime");
            return;
        }
    };
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    while let Ok(note) = rx.recv() {
        for uri in &webhooks {
            let request = hyper::Request::post(uri.clone())
                .header(hyper::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(http_body_util::Full::new(bytes::Bytes::from(note.clone())));
            let Ok(request) = request else { continue };
            let outcome = runtime.block_on(async {
                tokio::time::timeout(WEBHOOK_TIMEOUT, client.request(request)).await
            });
            match outcome {
                Ok(Ok(response)) if response.status().is_success() => {}
                Ok(Ok(response)) => {
                    tracing::warn!(url = %uri, status = %response.status(), "checkpoint webhook refused the checkpoint")
                }
                Ok(Err(e)) => tracing::warn!(url = %uri, error = %e, "checkpoint webhook failed"),
                Err(_) => tracing::warn!(url = %uri, "checkpoint webhook timed out"),
            }
        }
        for socket in &syslogs {
            // One line: facility local0, severity info (<134>).
            let message = format!(
                "<134>toolgate-audit: checkpoint {}",
                note.trim_end().replace('\n', " | ")
            );
            let sent = std::os::unix::net::UnixDatagram::unbound()
                .and_then(|s| s.send_to(message.as_bytes(), socket));
            if let Err(e) = sent {
                tracing::warn!(socket = %socket.display(), error = %e, "cannot send the checkpoint to syslog");
            }
        }
    }
}
