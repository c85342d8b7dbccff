//! How a `--ship` sink delivers one batch: a rotated file, syslog datagrams or an
//! octet-counted TCP/TLS stream, a Splunk HEC POST, or an OTLP/HTTP logs request (its
//! protobuf written here).

use super::*;

/// A byte stream to a syslog receiver (TCP or TLS).
pub(super) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A sink's connection state.
pub(super) enum Delivery {
    File {
        path: PathBuf,
        max_bytes: u64,
        keep: u32,
    },
    Udp {
        addr: String,
        socket: Option<tokio::net::UdpSocket>,
    },
    Stream {
        addr: String,
        host: String,
        tls: Option<Arc<rustls::ClientConfig>>,
        stream: Option<Box<dyn Stream>>,
    },
    Hec {
        url: reqwest::Url,
        token: String,
        client: reqwest::Client,
    },
    Otlp {
        url: reqwest::Url,
        client: reqwest::Client,
    },
}

fn read_token(source: &TokenSource) -> Result<String, String> {
    let token = match source {
        TokenSource::Env(name) => std::env::var(name).map_err(|_| {
            format!("the environment variable `{name}` holding the token is not set")
        })?,
        TokenSource::File(path) => crate::localfile::read_to_string(path, MAX_TOKEN_BYTES)
            .map_err(|e| format!("cannot read the token file `{}`: {e}", path.display()))?,
    };
    let token = token.trim().to_string();
    if token.is_empty() || token.chars().any(|c| c.is_control() || c == ' ') {
        return Err("the HEC token is empty or holds spaces or control characters".into());
    }
    Ok(token)
}

fn http_client() -> Result<reqwest::Client, String> {
    outbound::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(IO_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build the http client: {}", error_chain(&e)))
}

impl Delivery {
    pub(super) fn open(spec: &ShipSpec) -> Result<Delivery, String> {
        Ok(match &spec.target {
            ShipTarget::File {
                path,
                max_bytes,
                keep,
            } => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    crate::localfile::create_dir_all(dir)
                        .map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
                }
                crate::localfile::open_append(path)
                    .map_err(|e| format!("cannot open `{}`: {e}", path.display()))?;
                Delivery::File {
                    path: path.clone(),
                    max_bytes: *max_bytes,
                    keep: *keep,
                }
            }
            ShipTarget::Syslog {
                transport,
                host,
                port,
                ca,
            } => {
                let addr = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                match transport {
                    SyslogTransport::Udp => Delivery::Udp { addr, socket: None },
                    SyslogTransport::Tcp => Delivery::Stream {
                        addr,
                        host: host.clone(),
                        tls: None,
                        stream: None,
                    },
                    SyslogTransport::Tls => {
                        let ca = match ca {
                            Some(path) => Some(CaBundle::load(path).map_err(|e| e.to_string())?),
                            None => None,
                        };
                        Delivery::Stream {
                            addr,
                            host: host.clone(),
                            tls: Some(outbound::tls_config(ca.as_ref())?),
                            stream: None,
                        }
                    }
                }
            }
            ShipTarget::Hec { url, token } => Delivery::Hec {
                url: url.clone(),
                token: read_token(token)?,
                client: http_client()?,
            },
            ShipTarget::Otlp { url } => Delivery::Otlp {
                url: url.clone(),
                client: http_client()?,
            },
        })
    }

    pub(super) async fn deliver(
        &mut self,
        format: ShipFormat,
        events: &[StoredEvent],
        records: &[String],
    ) -> Result<(), String> {
        match self {
            Delivery::File {
                path,
                max_bytes,
                keep,
            } => deliver_file(path, *max_bytes, *keep, records).await,
            Delivery::Udp { addr, socket } => deliver_udp(addr, socket, events, records).await,
            Delivery::Stream {
                addr,
                host,
                tls,
                stream,
            } => deliver_stream((addr, host, tls.as_ref()), stream, events, records).await,
            Delivery::Hec { url, token, client } => {
                deliver_hec(url, token, client, format, events, records).await
            }
            Delivery::Otlp { url, client } => {
                deliver_otlp(url, client, format, events, records).await
            }
        }
    }
}

/// Appends the batch to the file, rotating it past `max_bytes`.
async fn deliver_file(
    path: &Path,
    max_bytes: u64,
    keep: u32,
    records: &[String],
) -> Result<(), String> {
    let mut bytes = Vec::with_capacity(records.iter().map(|r| r.len() + 1).sum());
    for record in records {
        bytes.extend_from_slice(record.as_bytes());
        bytes.push(b'\n');
    }
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || append_rotated(&path, max_bytes, keep, &bytes))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// Sends each record as a syslog datagram on the (re)connected socket.
async fn deliver_udp(
    addr: &str,
    socket: &mut Option<tokio::net::UdpSocket>,
    events: &[StoredEvent],
    records: &[String],
) -> Result<(), String> {
    if socket.is_none() {
        let s = tokio::net::UdpSocket::bind(if addr.starts_with('[') {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        })
        .await
        .map_err(|e| e.to_string())?;
        s.connect(addr).await.map_err(|e| e.to_string())?;
        *socket = Some(s);
    }
    let Some(s) = socket else {
        return Err("no socket".into());
    };
    for (event, record) in events.iter().zip(records) {
        let mut message = syslog_message(event, record);
        if message.len() > MAX_DATAGRAM_BYTES {
            message = syslog_message(event, &stub(event, record.len()).to_string());
        }
        let sent = tokio::time::timeout(IO_TIMEOUT, s.send(message.as_bytes())).await;
        if let Err(e) = sent
            .map_err(|_| "timed out".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            *socket = None;
            return Err(e);
        }
    }
    // A receiver that is not listening answers with an ICMP error, kept on
    // the connected socket: then the batch counts as not delivered. (UDP
    // cannot confirm more than that: it is best effort.)
    tokio::task::yield_now().await;
    if let Ok(Some(e)) | Err(e) = s.take_error() {
        *socket = None;
        return Err(e.to_string());
    }
    Ok(())
}

/// Writes the batch as octet-counted syslog frames on the (re)connected TCP or TLS
/// stream; `to` is (address, TLS host name, TLS configuration).
async fn deliver_stream(
    to: (&str, &str, Option<&Arc<rustls::ClientConfig>>),
    stream: &mut Option<Box<dyn Stream>>,
    events: &[StoredEvent],
    records: &[String],
) -> Result<(), String> {
    let (addr, host, tls) = to;
    // A connection the receiver closed while we were idle is replaced
    // before anything is written to it (the write would vanish).
    if let Some(s) = stream.as_mut()
        && peer_closed(s).await
    {
        *stream = None;
    }
    if stream.is_none() {
        *stream = Some(connect(addr, host, tls).await?);
    }
    let Some(s) = stream.as_mut() else {
        return Err("no connection".into());
    };
    let mut frames = Vec::new();
    for (event, record) in events.iter().zip(records) {
        let message = syslog_message(event, record);
        // RFC 6587 octet counting: "LEN SP MSG".
        frames.extend_from_slice(format!("{} ", message.len()).as_bytes());
        frames.extend_from_slice(message.as_bytes());
    }
    let written = tokio::time::timeout(IO_TIMEOUT, async {
        s.write_all(&frames).await?;
        s.flush().await
    })
    .await;
    match written {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            *stream = None;
            Err(e.to_string())
        }
        Err(_) => {
            *stream = None;
            Err("the receiver did not take the batch in time".into())
        }
    }
}

/// Posts the batch to a Splunk HTTP Event Collector; only its JSON acknowledgement
/// confirms it.
async fn deliver_hec(
    url: &reqwest::Url,
    token: &str,
    client: &reqwest::Client,
    format: ShipFormat,
    events: &[StoredEvent],
    records: &[String],
) -> Result<(), String> {
    let mut body = String::new();
    for (event, record) in events.iter().zip(records) {
        let payload = match format {
            ShipFormat::Ocsf => serde_json::from_str(record).unwrap_or(Value::Null),
            ShipFormat::Native => Value::String(record.clone()),
        };
        let item = json!({
            "time": time_ms(event) as f64 / 1000.0,
            "host": hostname(),
            "source": "toolgate",
            "sourcetype": match format { ShipFormat::Ocsf => "toolgate:ocsf", ShipFormat::Native => "toolgate:audit" },
            "event": payload,
            "fields": {"seq": event.seq, "leaf_hash_sha256": leaf_hex(event), "event_type": event_text(event, "type")},
        });
        body.push_str(&item.to_string());
        body.push('\n');
    }
    let response = client
        .post(url.clone())
        .header(reqwest::header::AUTHORIZATION, format!("Splunk {token}"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| error_chain(&e.without_url()))?;
    let status = response.status();
    let answer = read_bounded(response).await?;
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    // Splunk answers {"text":"Success","code":0}; anything else is not a
    // confirmation.
    let parsed: Value = serde_json::from_slice(&answer)
        .map_err(|_| "the answer is not the HEC JSON acknowledgement".to_string())?;
    if parsed.get("code").and_then(Value::as_i64) != Some(0) {
        return Err(format!(
            "the answer does not confirm: {}",
            truncate(&parsed.to_string())
        ));
    }
    Ok(())
}

/// Posts the batch as an OTLP/HTTP protobuf logs request.
async fn deliver_otlp(
    url: &reqwest::Url,
    client: &reqwest::Client,
    format: ShipFormat,
    events: &[StoredEvent],
    records: &[String],
) -> Result<(), String> {
    let body = otlp::logs_request(events, records, format);
    let response = client
        .post(url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
        .body(body)
        .send()
        .await
        .map_err(|e| error_chain(&e.without_url()))?;
    let status = response.status();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let answer = read_bounded(response).await?;
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    if !answer.is_empty()
        && (!content_type.starts_with("application/x-protobuf") || !otlp::is_wellformed(&answer))
    {
        return Err("the answer is not an OTLP protobuf response".into());
    }
    Ok(())
}

fn truncate(s: &str) -> String {
    crate::text::prefix_chars(s, 200)
}

async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| error_chain(&e.without_url()))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err("the answer is too large".into());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Whether the receiver closed the connection (or sent something we do not expect);
/// never waits.
async fn peer_closed(stream: &mut Box<dyn Stream>) -> bool {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(Duration::ZERO, stream.read(&mut buf)).await {
        Err(_) => false,
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => false,
    }
}

async fn connect(
    addr: &str,
    host: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Box<dyn Stream>, String> {
    let target = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| format!("`{addr}` resolves to no address"))?;
    let socket = if target.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(|e| e.to_string())?;
    // Bounded buffering: what a receiver that stops reading can leave queued in the
    // kernel is this much, not the autotuned megabytes.
    let _ = socket.set_send_buffer_size(SEND_BUFFER_BYTES);
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target))
        .await
        .map_err(|_| "connecting timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    match tls {
        None => Ok(Box::new(tcp)),
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| format!("`{host}` is not a TLS server name: {e}"))?;
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp))
                .await
                .map_err(|_| "the TLS handshake timed out".to_string())?
                .map_err(|e| format!("TLS: {e}"))?;
            Ok(Box::new(stream))
        }
    }
}

/// Appends `bytes` to `path` (fsynced), first rotating when they would take it past
/// `max_bytes`: `path` -> `path.1` -> ... -> `path.<keep>` (the oldest is removed).
pub(super) fn append_rotated(
    path: &Path,
    max_bytes: u64,
    keep: u32,
    bytes: &[u8],
) -> std::io::Result<()> {
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if size > 0 && size + bytes.len() as u64 > max_bytes {
        let numbered = |n: u32| {
            let mut name = path.as_os_str().to_owned();
            name.push(format!(".{n}"));
            PathBuf::from(name)
        };
        if keep == 0 {
            std::fs::remove_file(path)?;
        } else {
            let _ = std::fs::remove_file(numbered(keep));
            for n in (1..keep).rev() {
                let from = numbered(n);
                if from.exists() {
                    std::fs::rename(&from, numbered(n + 1))?;
                }
            }
            std::fs::rename(path, numbered(1))?;
        }
    }
    let mut file = crate::localfile::open_append(path).map_err(|e| match e {
        crate::localfile::ReadError::Io(e) => e,
        other => std::io::Error::other(other.to_string()),
    })?;
    file.write_all(bytes)?;
    file.sync_data()
}

fn time_ms(event: &StoredEvent) -> i64 {
    event
        .value
        .get("timestamp_utc")
        .and_then(Value::as_str)
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
        .map_or(0, |t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// This host's name as RFC 5424 allows it (printable ASCII, at most 255), else `-`.
fn hostname() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let name = name.trim();
        if name.is_empty() || name.len() > 255 || !name.bytes().all(|b| (33..=126).contains(&b)) {
            "-".to_string()
        } else {
            name.to_string()
        }
    })
    .clone()
}

/// The RFC 5424 message of one event: facility local0, severity warning for a refused
/// or failed call and informational otherwise; MSGID the event type; the seq and leaf
/// hash as structured data; the record as MSG.
fn syslog_message(event: &StoredEvent, record: &str) -> String {
    let kind = event_text(event, "type");
    let severity = match kind {
        "tool_denied" | "tool_failed" | "tool_timeout" | "safety_lock_engaged" => 4,
        _ => 6,
    };
    let msgid: String = kind
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(32)
        .collect();
    let sd_value = |v: &str| {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace(']', "\\]")
    };
    format!(
        "<{}>1 {} {} toolgate {} {} [{SD_ID} seq=\"{}\" leaf=\"{}\" event_id=\"{}\"] {}",
        16 * 8 + severity,
        event_text(event, "timestamp_utc"),
        hostname(),
        std::process::id(),
        if msgid.is_empty() {
            "-".to_string()
        } else {
            msgid
        },
        event.seq,
        leaf_hex(event),
        sd_value(event_text(event, "event_id")),
        record
    )
}

/// OTLP/HTTP logs in protobuf, written by hand (the few messages needed; field numbers
/// from opentelemetry-proto's logs/v1, common/v1, resource/v1 and collector/logs/v1).
pub(super) mod otlp {
    use opentelemetry_proto::tonic::collector::logs::v1::{
        ExportLogsServiceRequest, ExportLogsServiceResponse,
    };
    use opentelemetry_proto::tonic::common::v1::{
        AnyValue, InstrumentationScope, KeyValue, any_value,
    };
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use prost::Message as _;

    use super::*;

    fn string(s: &str) -> Option<AnyValue> {
        Some(AnyValue {
            value: Some(any_value::Value::StringValue(s.to_string())),
        })
    }

    fn attribute(key: &str, value: Option<AnyValue>) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value,
            ..KeyValue::default()
        }
    }

    /// One event as a log record: body the record, attributes the seq, event id and
    /// type, leaf hash, and call and run ids.
    fn log_record(event: &StoredEvent, record: &str, format: ShipFormat, now: u64) -> LogRecord {
        let kind = event_text(event, "type");
        let warn = matches!(
            kind,
            "tool_denied" | "tool_failed" | "tool_timeout" | "safety_lock_engaged"
        );
        let mut attributes = vec![
            attribute(
                "toolgate.seq",
                Some(AnyValue {
                    value: Some(any_value::Value::IntValue(event.seq as i64)),
                }),
            ),
            attribute("toolgate.event_id", string(event_text(event, "event_id"))),
            attribute("toolgate.event_type", string(kind)),
            attribute("toolgate.leaf_hash_sha256", string(&leaf_hex(event))),
            attribute(
                "toolgate.format",
                string(match format {
                    ShipFormat::Ocsf => "ocsf",
                    ShipFormat::Native => "native",
                }),
            ),
        ];
        for (key, name) in [
            ("call_id", "gen_ai.tool.call.id"),
            ("tool_name", "gen_ai.tool.name"),
            ("run_id", "toolgate.run_id"),
        ] {
            if let Some(v) = event.value.get(key).and_then(Value::as_str) {
                attributes.push(attribute(name, string(v)));
            }
        }
        LogRecord {
            time_unix_nano: (time_ms(event).max(0) as u64) * 1_000_000,
            observed_time_unix_nano: now,
            // SeverityNumber WARN (13) or INFO (9).
            severity_number: if warn { 13 } else { 9 },
            severity_text: if warn { "WARN" } else { "INFO" }.to_string(),
            body: string(record),
            attributes,
            event_name: format!("toolgate.audit.{kind}"),
            ..LogRecord::default()
        }
    }

    /// An `ExportLogsServiceRequest` (opentelemetry-proto's messages, prost's
    /// encoding) with one log record per event.
    pub(crate) fn logs_request(
        events: &[StoredEvent],
        records: &[String],
        format: ShipFormat,
    ) -> Vec<u8> {
        let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos() as u64;
        let log_records = events
            .iter()
            .zip(records)
            .map(|(event, record)| log_record(event, record, format, now))
            .collect();
        let request = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(Resource {
                    attributes: vec![
                        attribute("service.name", string("toolgate")),
                        attribute("service.version", string(env!("CARGO_PKG_VERSION"))),
                    ],
                    ..Resource::default()
                }),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: "toolgate.audit".to_string(),
                        version: env!("CARGO_PKG_VERSION").to_string(),
                        ..InstrumentationScope::default()
                    }),
                    log_records,
                    ..ScopeLogs::default()
                }],
                ..ResourceLogs::default()
            }],
        };
        request.encode_to_vec()
    }

    /// Whether `data` is an `ExportLogsServiceResponse` (an empty body is one too).
    pub(crate) fn is_wellformed(data: &[u8]) -> bool {
        ExportLogsServiceResponse::decode(data).is_ok()
    }
}
