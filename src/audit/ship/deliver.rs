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
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn tag(field: u32, wire: u8, out: &mut Vec<u8>) {
        varint((u64::from(field) << 3) | u64::from(wire), out);
    }

    fn bytes(field: u32, value: &[u8], out: &mut Vec<u8>) {
        tag(field, 2, out);
        varint(value.len() as u64, out);
        out.extend_from_slice(value);
    }

    fn fixed64(field: u32, value: u64, out: &mut Vec<u8>) {
        tag(field, 1, out);
        out.extend_from_slice(&value.to_le_bytes());
    }

    /// An AnyValue holding a string (field 1) or an int (field 3).
    enum Any<'a> {
        Str(&'a str),
        Int(i64),
    }

    fn key_value(field: u32, key: &str, value: Any, out: &mut Vec<u8>) {
        let mut any = Vec::new();
        match value {
            Any::Str(s) => bytes(1, s.as_bytes(), &mut any),
            Any::Int(i) => {
                tag(3, 0, &mut any);
                varint(i as u64, &mut any);
            }
        }
        let mut kv = Vec::new();
        bytes(1, key.as_bytes(), &mut kv);
        bytes(2, &any, &mut kv);
        bytes(field, &kv, out);
    }

    /// An `ExportLogsServiceRequest` with one log record per event: body the record,
    /// attributes the seq, event id and type, leaf hash, and call and run ids.
    pub(crate) fn logs_request(
        events: &[StoredEvent],
        records: &[String],
        format: ShipFormat,
    ) -> Vec<u8> {
        let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos() as u64;
        let mut scope_logs = Vec::new();
        let mut scope = Vec::new();
        bytes(1, b"toolgate.audit", &mut scope);
        bytes(2, env!("CARGO_PKG_VERSION").as_bytes(), &mut scope);
        bytes(1, &scope, &mut scope_logs);
        for (event, record) in events.iter().zip(records) {
            let kind = event_text(event, "type");
            let warn = matches!(
                kind,
                "tool_denied" | "tool_failed" | "tool_timeout" | "safety_lock_engaged"
            );
            let mut log = Vec::new();
            fixed64(1, (time_ms(event).max(0) as u64) * 1_000_000, &mut log);
            tag(2, 0, &mut log);
            varint(if warn { 13 } else { 9 }, &mut log);
            bytes(3, if warn { b"WARN" } else { b"INFO" }, &mut log);
            let mut body = Vec::new();
            bytes(1, record.as_bytes(), &mut body);
            bytes(5, &body, &mut log);
            key_value(6, "toolgate.seq", Any::Int(event.seq as i64), &mut log);
            key_value(
                6,
                "toolgate.event_id",
                Any::Str(event_text(event, "event_id")),
                &mut log,
            );
            key_value(6, "toolgate.event_type", Any::Str(kind), &mut log);
            key_value(
                6,
                "toolgate.leaf_hash_sha256",
                Any::Str(&leaf_hex(event)),
                &mut log,
            );
            key_value(
                6,
                "toolgate.format",
                Any::Str(match format {
                    ShipFormat::Ocsf => "ocsf",
                    ShipFormat::Native => "native",
                }),
                &mut log,
            );
            for (key, attribute) in [
                ("call_id", "gen_ai.tool.call.id"),
                ("tool_name", "gen_ai.tool.name"),
                ("run_id", "toolgate.run_id"),
            ] {
                if let Some(v) = event.value.get(key).and_then(Value::as_str) {
                    key_value(6, attribute, Any::Str(v), &mut log);
                }
            }
            fixed64(11, now, &mut log);
            bytes(12, format!("toolgate.audit.{kind}").as_bytes(), &mut log);
            bytes(2, &log, &mut scope_logs);
        }
        let mut resource = Vec::new();
        key_value(1, "service.name", Any::Str("toolgate"), &mut resource);
        key_value(
            1,
            "service.version",
            Any::Str(env!("CARGO_PKG_VERSION")),
            &mut resource,
        );
        let mut resource_logs = Vec::new();
        bytes(1, &resource, &mut resource_logs);
        bytes(2, &scope_logs, &mut resource_logs);
        let mut request = Vec::new();
        bytes(1, &resource_logs, &mut request);
        request
    }

    /// Whether `data` is a well-formed protobuf message (every field's tag, wire type
    /// and length valid, to the last byte).
    pub(crate) fn is_wellformed(data: &[u8]) -> bool {
        fn read_varint(data: &[u8], at: &mut usize) -> Option<u64> {
            let mut value = 0u64;
            for shift in (0..64).step_by(7) {
                let byte = *data.get(*at)?;
                *at += 1;
                value |= u64::from(byte & 0x7f) << shift;
                if byte & 0x80 == 0 {
                    return Some(value);
                }
            }
            None
        }
        let mut at = 0;
        while at < data.len() {
            let Some(key) = read_varint(data, &mut at) else {
                return false;
            };
            if key >> 3 == 0 {
                return false;
            }
            let skip = match key & 7 {
                0 => match read_varint(data, &mut at) {
                    Some(_) => 0,
                    None => return false,
                },
                1 => 8,
                2 => match read_varint(data, &mut at) {
                    Some(len) => len as usize,
                    None => return false,
                },
                5 => 4,
                _ => return false,
            };
            at = match at.checked_add(skip) {
                Some(next) if next <= data.len() => next,
                _ => return false,
            };
        }
        true
    }
}
