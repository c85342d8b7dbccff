//! Continuous shipping (`serve --ship SINK`, repeatable): every committed audit event
//! is delivered to each sink, in order, at least once, as an OCSF record (see `siem`)
//! or as its native canonical line: to a rotated file, syslog (RFC 5424 over UDP, TCP
//! or TCP+TLS), a Splunk HTTP Event Collector, or an OTLP/HTTP logs endpoint.
//!
//! Each sink has its own task that reads the committed log (never the hot path: a call
//! hands nothing to a shipper and waits for none), at most [`BATCH_EVENTS`] events at a
//! time, delivers them, and only then moves its durable cursor
//! (`<data_dir>/ship/<sink id>.cursor`, written atomically); a restart resumes after
//! the cursor. A failed delivery is retried with exponential backoff (from
//! [`MIN_BACKOFF`] to [`MAX_BACKOFF`]); every network operation has a time limit.
//!
//! INVARIANT: a sink never holds more than one batch in memory, and nothing a sink does
//! (down, slow, never reading, answering garbage) reaches a tool call: the lag grows and
//! shows in /metrics (`toolgate_ship_lag_events`, `toolgate_ship_lag_seconds`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::siem::{self, CheckpointRef, Evidence};
use super::{AuditError, AuditLog, EventFilter, StoredEvent};
use crate::outbound::{self, CaBundle, error_chain};

mod deliver;
use deliver::Delivery;

/// Events read and delivered together, at most.
pub const BATCH_EVENTS: usize = 100;
/// The first retry delay after a failed delivery; doubles up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often an idle sink looks for new events.
const POLL: Duration = Duration::from_millis(100);
/// Connecting (TCP and TLS) may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Writing one batch, or one HTTP exchange, may take this long.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read from an HTTP sink.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// The largest syslog datagram sent; a larger record goes as a stub naming its seq.
const MAX_DATAGRAM_BYTES: usize = 65_000;
/// The largest record a sink is sent by default (`max_record_bytes`); a larger one goes
/// as a stub naming its seq, so one event a receiver refuses for its size cannot stop
/// the sink. The bounds of the option.
const DEFAULT_MAX_RECORD_BYTES: u64 = 64 * 1024;
const MIN_RECORD_BYTES: u64 = 1024;
const MAX_RECORD_BYTES: u64 = 16 * 1024 * 1024;
/// The kernel send buffer of a syslog TCP/TLS connection.
const SEND_BUFFER_BYTES: u32 = 256 * 1024;
/// A token file larger than this is refused.
const MAX_TOKEN_BYTES: u64 = 4096;
/// Defaults of a file sink.
const DEFAULT_FILE_MAX_BYTES: u64 = 100 * 1024 * 1024;
const DEFAULT_FILE_KEEP: u32 = 5;
/// The private enterprise number of the syslog structured-data element (RFC 5612's
/// number for documentation examples; no number is registered for toolgate).
const SD_ID: &str = "toolgate@32473";

/// What a sink receives per event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShipFormat {
    /// The OCSF 1.8.0 record, with its evidence.
    Ocsf,
    /// The event's canonical line, the exact hashed bytes.
    Native,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyslogTransport {
    Udp,
    Tcp,
    Tls,
}

/// Where a sink delivers.
#[derive(Debug, Clone)]
pub enum ShipTarget {
    File {
        path: PathBuf,
        max_bytes: u64,
        keep: u32,
    },
    Syslog {
        transport: SyslogTransport,
        host: String,
        port: u16,
        /// TLS only: trust this CA bundle instead of the system's roots.
        ca: Option<PathBuf>,
    },
    Hec {
        url: reqwest::Url,
        token: TokenSource,
    },
    Otlp {
        url: reqwest::Url,
    },
}

/// Where a HEC token comes from: never the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    Env(String),
}

/// One `--ship` sink as configured.
#[derive(Debug, Clone)]
pub struct ShipSpec {
    /// The spec as given (it holds no secret): names the sink in logs and metrics and
    /// keys its cursor.
    pub name: String,
    pub target: ShipTarget,
    pub format: ShipFormat,
    /// A record larger than this is sent as a stub (`max_record_bytes`).
    pub max_record_bytes: usize,
}

impl ShipSpec {
    /// Parses `file:PATH`, `syslog+udp://HOST:PORT`, `syslog+tcp://HOST:PORT`,
    /// `syslog+tls://HOST:PORT`, `hec+http(s)://HOST:PORT[/PATH]` or
    /// `otlp+http(s)://HOST:PORT[/PATH]`, each with options after `?`: `format=ocsf`
    /// (default) or `native`, `max_record_bytes=N` (1024 to 16 MiB, default 64 KiB); file: `max_bytes=N`, `keep=N`; tls: `ca=FILE`; hec:
    /// `token_file=FILE` or `token_env=NAME` (one is required; a token itself is refused).
    pub fn parse(text: &str) -> Result<ShipSpec, String> {
        let bad = |what: &str| format!("ship sink `{text}`: {what}");
        let (body, query) = match text.rsplit_once('?') {
            Some((body, query)) => (body, query),
            None => (text, ""),
        };
        let mut options: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let mut take = |key: &str| -> Option<String> {
            let i = options.iter().position(|(k, _)| k == key)?;
            Some(options.remove(i).1)
        };
        let format = match take("format").as_deref() {
            None | Some("ocsf") => ShipFormat::Ocsf,
            Some("native") => ShipFormat::Native,
            Some(other) => return Err(bad(&format!("format `{other}` is not ocsf or native"))),
        };
        if take("token").is_some() {
            return Err(bad(
                "a token on the command line is refused (it would show in ps and shell \
                 history): use token_file=FILE or token_env=NAME",
            ));
        }
        let number = |value: Option<String>, key: &str, default: u64| -> Result<u64, String> {
            match value {
                None => Ok(default),
                Some(v) => v
                    .parse::<u64>()
                    .map_err(|_| bad(&format!("{key} must be a whole number"))),
            }
        };
        let max_record_bytes = number(
            take("max_record_bytes"),
            "max_record_bytes",
            DEFAULT_MAX_RECORD_BYTES,
        )?;
        if !(MIN_RECORD_BYTES..=MAX_RECORD_BYTES).contains(&max_record_bytes) {
            return Err(bad(&format!(
                "max_record_bytes must be {MIN_RECORD_BYTES} to {MAX_RECORD_BYTES}"
            )));
        }
        let target = if let Some(path) = body.strip_prefix("file:") {
            if path.is_empty() {
                return Err(bad("file: needs a path"));
            }
            let max_bytes = number(take("max_bytes"), "max_bytes", DEFAULT_FILE_MAX_BYTES)?;
            if max_bytes < 4096 {
                return Err(bad("max_bytes must be at least 4096"));
            }
            let keep = number(take("keep"), "keep", u64::from(DEFAULT_FILE_KEEP))?;
            if keep > 1000 {
                return Err(bad("keep must be at most 1000"));
            }
            ShipTarget::File {
                path: PathBuf::from(path),
                max_bytes,
                keep: keep as u32,
            }
        } else {
            let (scheme, rest) = body
                .split_once("://")
                .ok_or_else(|| bad("expected file:PATH or KIND://HOST:PORT"))?;
            match scheme {
                "syslog+udp" | "syslog+tcp" | "syslog+tls" => {
                    let transport = match scheme {
                        "syslog+udp" => SyslogTransport::Udp,
                        "syslog+tcp" => SyslogTransport::Tcp,
                        _ => SyslogTransport::Tls,
                    };
                    let url = reqwest::Url::parse(&format!("tcp://{rest}"))
                        .map_err(|_| bad("expected HOST:PORT"))?;
                    let host = url
                        .host_str()
                        .filter(|h| !h.is_empty())
                        .ok_or_else(|| bad("no host"))?
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string();
                    let port = url.port().ok_or_else(|| bad("no port"))?;
                    if url.path() != "/" && !url.path().is_empty() {
                        return Err(bad("a syslog sink has no path"));
                    }
                    let ca = take("ca").map(PathBuf::from);
                    if ca.is_some() && transport != SyslogTransport::Tls {
                        return Err(bad("ca= is for syslog+tls only"));
                    }
                    ShipTarget::Syslog {
                        transport,
                        host,
                        port,
                        ca,
                    }
                }
                "hec+http" | "hec+https" | "otlp+http" | "otlp+https" => {
                    let (kind, http) = scheme.split_once('+').unwrap_or(("", "http"));
                    let mut url = reqwest::Url::parse(&format!("{http}://{rest}"))
                        .map_err(|_| bad("expected HOST:PORT[/PATH]"))?;
                    if url.host_str().is_none_or(str::is_empty)
                        || !url.username().is_empty()
                        || url.password().is_some()
                    {
                        return Err(bad("expected HOST:PORT[/PATH] without user info"));
                    }
                    if kind == "hec" {
                        if url.path() == "/" {
                            url.set_path("/services/collector/event");
                        }
                        let token = match (take("token_file"), take("token_env")) {
                            (Some(file), None) => TokenSource::File(PathBuf::from(file)),
                            (None, Some(env)) => TokenSource::Env(env),
                            _ => {
                                return Err(bad(
                                    "hec needs token_file=FILE or token_env=NAME (one)",
                                ));
                            }
                        };
                        ShipTarget::Hec { url, token }
                    } else {
                        if !url.path().ends_with("/v1/logs") {
                            let path = format!("{}/v1/logs", url.path().trim_end_matches('/'));
                            url.set_path(&path);
                        }
                        ShipTarget::Otlp { url }
                    }
                }
                other => {
                    return Err(bad(&format!(
                        "unknown kind `{other}` (file, syslog+udp, syslog+tcp, syslog+tls, \
                         hec+http(s), otlp+http(s))"
                    )));
                }
            }
        };
        if let Some((key, _)) = options.first() {
            return Err(bad(&format!("unknown option `{key}`")));
        }
        Ok(ShipSpec {
            name: text.to_string(),
            target,
            format,
            max_record_bytes: max_record_bytes as usize,
        })
    }

    /// The sink's id: the first 16 hex digits of the sha256 of its spec.
    pub fn id(&self) -> String {
        let mut id = crate::canonical::sha256_hex(self.name.as_bytes());
        id.truncate(16);
        id
    }
}

/// The handles a sink updates in /metrics.
#[derive(Debug, Clone, Default)]
pub struct ShipMetrics {
    pub delivered: prometheus_client::metrics::counter::Counter,
    pub failures: prometheus_client::metrics::counter::Counter,
    pub lag_events: prometheus_client::metrics::gauge::Gauge,
    pub lag_seconds: prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Events that left the data directory (archived) before the sink received them.
    pub skipped: prometheus_client::metrics::counter::Counter,
}

/// The running shippers; dropping it stops them (a delivery in progress is abandoned,
/// and sent again after a restart: at least once).
pub struct Shipper {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Shipper {
    /// Stops every sink, waiting at most `grace` for deliveries in progress.
    pub async fn stop(self, grace: Duration) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

/// Checks every sink's configuration (token readable, CA usable, cursor directory
/// writable) and starts one task per sink on the current runtime.
pub fn start(
    specs: &[ShipSpec],
    log: &AuditLog,
    data_dir: &Path,
    metrics: impl Fn(&str) -> ShipMetrics,
) -> Result<Shipper, AuditError> {
    let config = |what: String| AuditError::Config { what };
    let dir = data_dir.join("ship");
    if !specs.is_empty() {
        crate::localfile::create_dir_all(&dir).map_err(|e| AuditError::Io {
            path: dir.clone(),
            what: format!("cannot create the ship cursor directory: {e}"),
        })?;
    }
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for spec in specs {
        if !ids.insert(spec.id()) {
            return Err(config(format!("ship sink `{}` is given twice", spec.name)));
        }
        let delivery =
            Delivery::open(spec).map_err(|e| config(format!("ship sink `{}`: {e}", spec.name)))?;
        let cursor = Cursor {
            path: dir.join(format!("{}.cursor", spec.id())),
        };
        let start_at = cursor
            .load()
            .map_err(|e| config(format!("ship sink `{}`: {e}", spec.name)))?;
        // A new sink's cursor is written at once (0: nothing confirmed), so that
        // `audit archive` sees a sink that has not delivered anything yet.
        if start_at == 0 && !cursor.path.exists() {
            cursor.store(0).map_err(|e| AuditError::Io {
                path: cursor.path.clone(),
                what: format!("cannot write the ship cursor: {e}"),
            })?;
        }
        let sink = Sink {
            spec: spec.clone(),
            log: log.clone(),
            cursor,
            delivery,
            metrics: metrics(&spec.name),
            stopped: stopped.clone(),
        };
        tasks.push(tokio::spawn(sink.run(start_at)));
    }
    Ok(Shipper { stop, tasks })
}

/// A cursor file holds one number: anything longer is not one.
const MAX_CURSOR_BYTES: u64 = 64;

/// The cursors of the sinks that shipped from `data_dir` (`<data_dir>/ship/*.cursor`):
/// each file and the seq of the last event its sink confirmed. A cursor that cannot be
/// read is an error: what it would say is not known.
pub fn cursors(data_dir: &Path) -> Result<Vec<(PathBuf, u64)>, String> {
    let dir = data_dir.join("ship");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read `{}`: {e}", dir.display())),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot read `{}`: {e}", dir.display()))?
            .path();
        if path.extension().is_some_and(|e| e == "cursor") {
            let seq = Cursor { path: path.clone() }.load()?;
            found.push((path, seq));
        }
    }
    found.sort();
    Ok(found)
}

/// A sink's durable cursor: the seq of the last event delivered.
struct Cursor {
    path: PathBuf,
}

impl Cursor {
    fn load(&self) -> Result<u64, String> {
        use crate::localfile::{ReadError, read_to_string};
        match read_to_string(&self.path, MAX_CURSOR_BYTES) {
            Ok(text) => text.trim().parse().map_err(|_| {
                format!(
                    "the cursor file `{}` is not a number; remove it to ship from seq 1",
                    self.path.display()
                )
            }),
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(format!("cannot read `{}`: {e}", self.path.display())),
        }
    }

    /// Writes the cursor atomically (temporary file, fsync, rename).
    fn store(&self, seq: u64) -> std::io::Result<()> {
        let tmp = self.path.with_extension("cursor.tmp");
        let mut file = crate::localfile::create(&tmp, false)?;
        file.write_all(format!("{seq}\n").as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)
    }
}

struct Sink {
    spec: ShipSpec,
    log: AuditLog,
    cursor: Cursor,
    delivery: Delivery,
    metrics: ShipMetrics,
    stopped: watch::Receiver<bool>,
}

impl Sink {
    /// Waits `delay` or until stopped; true when stopped.
    async fn pause(&mut self, delay: Duration) -> bool {
        if *self.stopped.borrow() {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => false,
            _ = self.stopped.changed() => true,
        }
    }

    async fn run(mut self, mut cursor: u64) {
        let name = self.spec.name.clone();
        let mut backoff = crate::backoff::Backoff::new(MIN_BACKOFF, MAX_BACKOFF);
        let mut failing = false;
        // The batch waiting to be delivered, kept across retries.
        let mut pending: Option<(Vec<StoredEvent>, Vec<String>)> = None;
        loop {
            if *self.stopped.borrow() {
                return;
            }
            let head = self.log.head().map_or(0, |(seq, _)| seq);
            if cursor > head {
                tracing::warn!(sink = %name, cursor, head, "the ship cursor is past the end of the log (a new log?); shipping from seq 1");
                cursor = 0;
            }
            self.metrics.lag_events.set((head - cursor) as i64);
            if pending.is_none() {
                if head == cursor {
                    self.metrics.lag_seconds.set(0.0);
                    if self.pause(POLL).await {
                        return;
                    }
                    continue;
                }
                let filter = EventFilter {
                    run_id: None,
                    event_types: Vec::new(),
                    after_seq: cursor,
                    since: None,
                    until: None,
                    limit: BATCH_EVENTS,
                    contains: None,
                };
                let events = match self.log.events(filter).await {
                    Ok(events) if !events.is_empty() => events,
                    Ok(_) => {
                        if self.pause(POLL).await {
                            return;
                        }
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(sink = %name, error = %e, "cannot read the audit log to ship");
                        if self.pause(backoff.fail()).await {
                            return;
                        }
                        continue;
                    }
                };
                if let Some(first) = events.first()
                    && first.seq > cursor + 1
                {
                    // Archived (`audit archive`) before this sink received them: they
                    // are in the archive, not in the log it reads. Said loudly, never
                    // passed over in silence.
                    let missing = first.seq - cursor - 1;
                    self.metrics.skipped.inc_by(missing);
                    tracing::error!(sink = %name, from_seq = cursor + 1, to_seq = first.seq - 1, "audit events left the data directory before this sink received them (archived); send them from the archive (toolgate audit export --archive)");
                }
                let checkpoint = signed_head(&self.log).await;
                let records = events
                    .iter()
                    .map(|e| {
                        let record = render(self.spec.format, e, checkpoint.as_ref());
                        if record.len() > self.spec.max_record_bytes {
                            stub(e, record.len()).to_string()
                        } else {
                            record
                        }
                    })
                    .collect();
                pending = Some((events, records));
            }
            let Some((events, records)) = &pending else {
                continue;
            };
            if let Some(first) = events.first() {
                self.metrics.lag_seconds.set(age_seconds(first));
            }
            let result = tokio::select! {
                r = self.delivery.deliver(self.spec.format, events, records) => r,
                _ = self.stopped.changed() => return,
            };
            match result {
                Ok(()) => {
                    let last = events.last().map_or(cursor, |e| e.seq);
                    let count = events.len() as u64;
                    let store = {
                        let path = self.cursor.path.clone();
                        tokio::task::spawn_blocking(move || Cursor { path }.store(last)).await
                    };
                    if let Ok(Err(e)) | Err(e) = store.map_err(std::io::Error::other) {
                        tracing::error!(sink = %name, error = %e, "cannot store the ship cursor; events may be sent again after a restart");
                    }
                    cursor = last;
                    pending = None;
                    self.metrics.delivered.inc_by(count);
                    self.metrics.lag_events.set((head.max(last) - last) as i64);
                    backoff.reset();
                    if failing {
                        failing = false;
                        tracing::info!(sink = %name, seq = last, "ship sink delivers again");
                    }
                }
                Err(e) => {
                    self.metrics.failures.inc();
                    if !failing {
                        failing = true;
                        tracing::warn!(sink = %name, error = %e, "ship sink failed; retrying with backoff, the events stay in the log");
                    } else {
                        tracing::debug!(sink = %name, error = %e, "ship sink still failing");
                    }
                    if self.pause(backoff.fail()).await {
                        return;
                    }
                }
            }
        }
    }
}

/// Seconds since the event was committed.
fn age_seconds(event: &StoredEvent) -> f64 {
    event
        .value
        .get("timestamp_utc")
        .and_then(Value::as_str)
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
        .map_or(0.0, |t| {
            (time::OffsetDateTime::now_utc() - t)
                .as_seconds_f64()
                .max(0.0)
        })
}

/// The newest signed head of the log (it covers every committed event).
async fn signed_head(log: &AuditLog) -> Option<CheckpointRef> {
    let base = log.db_path().to_path_buf();
    tokio::task::spawn_blocking(move || read_signed_head(&base))
        .await
        .ok()
        .flatten()
}

fn read_signed_head(base: &Path) -> Option<CheckpointRef> {
    let (_, newest) = super::segments::newest(base).ok()?;
    let conn = super::store::open_reader(&newest, Duration::from_millis(2000)).ok()?;
    conn.query_row("SELECT size, root, note FROM signed_head", [], |r| {
        Ok(CheckpointRef {
            size: r.get::<_, i64>(0)? as u64,
            root: r.get(1)?,
            note: r.get(2)?,
        })
    })
    .ok()
}

/// The text a sink gets for one event.
fn render(format: ShipFormat, event: &StoredEvent, checkpoint: Option<&CheckpointRef>) -> String {
    match format {
        ShipFormat::Native => event.line.clone(),
        ShipFormat::Ocsf => {
            let evidence = Evidence {
                seq: event.seq,
                leaf_hash: crate::canonical::to_hex(super::merkle::leaf_hash(
                    event.line.as_bytes(),
                )),
                checkpoint: checkpoint.filter(|c| c.size >= event.seq),
                inclusion_proof: None,
            };
            escape_line_separators(siem::ocsf(&event.line, &evidence).to_string())
        }
    }
}

/// JSON keeps U+0085, U+2028 and U+2029 raw inside strings, and a receiver that splits
/// lines on them (JavaScript, Python's `str.splitlines`) would cut a record in two. An
/// OCSF record has them escaped: the same JSON value, ASCII line breaks only. (A native
/// record is the exact hashed line and is sent as it is.)
fn escape_line_separators(record: String) -> String {
    if !record.contains(['\u{85}', '\u{2028}', '\u{2029}']) {
        return record;
    }
    record
        .replace('\u{85}', "\\u0085")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// What a sink is sent instead of a record too large for it: the event's seq, id, type
/// and leaf hash (it is whole in the log and in an export, and verifiable there), its
/// run, call and tool, and the record's size.
fn stub(event: &StoredEvent, bytes: usize) -> Value {
    serde_json::json!({
        "seq": event.seq,
        "event_id": event_text(event, "event_id"),
        "type": event_text(event, "type"),
        "run_id": event_text(event, "run_id"),
        "call_id": event_text(event, "call_id"),
        "tool_name": event_text(event, "tool_name"),
        "leaf_hash_sha256": leaf_hex(event),
        "truncated": true,
        "bytes": bytes,
    })
}

fn leaf_hex(event: &StoredEvent) -> String {
    crate::canonical::to_hex(super::merkle::leaf_hash(event.line.as_bytes()))
}

fn event_text<'a>(event: &'a StoredEvent, key: &str) -> &'a str {
    event.value.get(key).and_then(Value::as_str).unwrap_or("-")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_refuse_a_token_on_the_command_line() {
        let file =
            ShipSpec::parse("file:/var/log/t.jsonl?format=native&max_bytes=8192&keep=2").unwrap();
        assert!(matches!(
            file.target,
            ShipTarget::File {
                max_bytes: 8192,
                keep: 2,
                ..
            }
        ));
        assert_eq!(file.format, ShipFormat::Native);
        let udp = ShipSpec::parse("syslog+udp://127.0.0.1:514").unwrap();
        assert!(matches!(
            udp.target,
            ShipTarget::Syslog {
                transport: SyslogTransport::Udp,
                port: 514,
                ..
            }
        ));
        let hec = ShipSpec::parse("hec+http://127.0.0.1:8088?token_env=HEC").unwrap();
        match hec.target {
            ShipTarget::Hec { url, token } => {
                assert_eq!(url.path(), "/services/collector/event");
                assert_eq!(token, TokenSource::Env("HEC".into()));
            }
            other => panic!("{other:?}"),
        }
        let otlp = ShipSpec::parse("otlp+http://127.0.0.1:4318").unwrap();
        assert!(matches!(otlp.target, ShipTarget::Otlp { ref url } if url.path() == "/v1/logs"));
        for bad in [
            "hec+http://h:1?token=abc",
            "hec+http://h:1",
            "syslog+tcp://h",
            "ftp://h:1",
            "file:",
            "file:/x?format=xml",
            "file:/x?color=red",
            "syslog+udp://h:1?ca=/x",
            "file:/x?max_record_bytes=1023",
            "file:/x?max_record_bytes=16777217",
        ] {
            assert!(ShipSpec::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(file.max_record_bytes, 64 * 1024);
        let capped = ShipSpec::parse("otlp+http://h:1?max_record_bytes=4096").unwrap();
        assert_eq!(capped.max_record_bytes, 4096);
    }

    /// A record with U+0085, U+2028 or U+2029 in a string (an agent's argument) has them
    /// escaped: the same JSON value, and no line separator a receiver could split on.
    #[test]
    fn ocsf_records_escape_unicode_line_separators() {
        let value = json!({"args": "a\u{85}b\u{2028}c\u{2029}d\n"});
        let escaped = escape_line_separators(value.to_string());
        assert!(
            !escaped.contains(['\u{85}', '\u{2028}', '\u{2029}']),
            "{escaped}"
        );
        assert_eq!(escaped.lines().count(), 1);
        assert_eq!(serde_json::from_str::<Value>(&escaped).unwrap(), value);
    }

    #[test]
    fn the_otlp_request_decodes_as_the_collector_reads_it() {
        use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
        use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
        use prost::Message as _;
        let line = r#"{"event_id":"ev-000000000001","seq":1,"timestamp_utc":"2026-01-02T03:04:05.678Z","type":"tool_denied","tool_name":"t"}"#;
        let event = StoredEvent {
            seq: 1,
            line: line.into(),
            value: serde_json::from_str(line).unwrap(),
        };
        let body = deliver::otlp::logs_request(&[event], &[line.to_string()], ShipFormat::Native);
        let request = ExportLogsServiceRequest::decode(body.as_slice()).unwrap();
        let record = &request.resource_logs[0].scope_logs[0].log_records[0];
        assert_eq!(record.severity_text, "WARN");
        assert_eq!(record.time_unix_nano, 1_767_323_045_678_000_000);
        assert_eq!(record.event_name, "toolgate.audit.tool_denied");
        let body = record.body.as_ref().and_then(|b| b.value.clone());
        assert_eq!(body, Some(Any::StringValue(line.to_string())));
        let seq = record
            .attributes
            .iter()
            .find(|kv| kv.key == "toolgate.seq")
            .and_then(|kv| kv.value.as_ref()?.value.clone());
        assert_eq!(seq, Some(Any::IntValue(1)));
        // A collector's answer: empty or a response message; never an HTML page.
        assert!(deliver::otlp::is_wellformed(b""));
        assert!(!deliver::otlp::is_wellformed(b"<html>garbage</html>"));
    }

    #[test]
    fn files_rotate_and_keep_a_bounded_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ship.log");
        for _ in 0..10 {
            deliver::append_rotated(&path, 100, 2, &[b'x'; 60]).unwrap();
        }
        assert!(path.exists());
        assert!(dir.path().join("ship.log.1").exists());
        assert!(dir.path().join("ship.log.2").exists());
        assert!(!dir.path().join("ship.log.3").exists());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 60);
    }
}
