//! `serve --ship`: committed audit events streamed to a syslog listener (TCP and UDP), a
//! Splunk-HEC-compatible HTTP server and an OTLP logs collector, all written here. Every
//! event arrives at least once and in order after the receivers were down for 5 s and
//! after a gateway restart (syslog over UDP is best effort, without acknowledgement or
//! flow control: what it delivered is counted and printed, not required); calls are not refused while the sinks are down (throughput
//! printed); hostile sinks (never reading, 500 forever, garbage answers) leave the
//! gateway serving with bounded memory and the lag visible in /metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{self, Server, Start, lab};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message as _;
use serde_json::{Value, json};

/// What one receiver got: seqs in arrival order.
type Seqs = Arc<Mutex<Vec<u64>>>;

/// How a receiver reads and answers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    SyslogTcp,
    SyslogUdp,
    Hec,
    Otlp,
    /// Accepts TCP connections and never reads.
    NeverReads,
    /// HTTP that answers 500 to everything.
    Fails,
    /// HTTP that answers 200 with garbage.
    Garbage,
    /// HEC that refuses (413) a batch holding any event larger than 12 KiB, as a
    /// receiver with a size limit does.
    HecSmall,
}

/// A receiver on a fixed loopback port that can be taken down and brought back.
struct Receiver {
    kind: Kind,
    addr: SocketAddr,
    seqs: Seqs,
    up: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

const HEC_TOKEN: &str = "hec-test-token-0123";
/// Added to the seq a receiver records for a stub (a record sent as its seq and hash).
const STUB: u64 = 1 << 40;

fn seq_of_syslog(message: &str) -> Option<u64> {
    let at = message.find(" seq=\"")? + 6;
    message[at..].split('"').next()?.parse().ok()
}

impl Receiver {
    fn start(kind: Kind) -> Receiver {
        let addr = match kind {
            Kind::SyslogUdp => UdpSocket::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap(),
            _ => TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap(),
        };
        let mut r = Receiver {
            kind,
            addr,
            seqs: Arc::default(),
            up: Arc::default(),
            threads: Vec::new(),
        };
        r.up();
        r
    }

    fn spec(&self, token_file: &Path) -> String {
        let a = self.addr;
        match self.kind {
            Kind::SyslogTcp | Kind::NeverReads => format!("syslog+tcp://{a}"),
            Kind::SyslogUdp => format!("syslog+udp://{a}"),
            Kind::Hec | Kind::Fails => {
                format!("hec+http://{a}?token_file={}", token_file.display())
            }
            Kind::HecSmall => format!(
                "hec+http://{a}?token_file={}&max_record_bytes=8192",
                token_file.display()
            ),
            Kind::Otlp | Kind::Garbage => format!("otlp+http://{a}"),
        }
    }

    /// Binds the same port again and serves.
    fn up(&mut self) {
        self.up.store(true, Ordering::SeqCst);
        let (kind, seqs, up) = (self.kind, self.seqs.clone(), self.up.clone());
        if kind == Kind::SyslogUdp {
            let socket = UdpSocket::bind(self.addr).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            self.threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 70_000];
                while up.load(Ordering::SeqCst) {
                    if let Ok(n) = socket.recv(&mut buf)
                        && let Some(seq) = seq_of_syslog(&String::from_utf8_lossy(&buf[..n]))
                    {
                        seqs.lock().unwrap().push(seq);
                    }
                }
            }));
            return;
        }
        let listener = TcpListener::bind(self.addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        self.threads.push(std::thread::spawn(move || {
            let mut connections = Vec::new();
            while up.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        stream
                            .set_read_timeout(Some(Duration::from_millis(20)))
                            .unwrap();
                        let (seqs, up) = (seqs.clone(), up.clone());
                        connections.push(std::thread::spawn(move || {
                            serve_connection(kind, stream, &seqs, &up)
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for c in connections {
                let _ = c.join();
            }
        }));
    }

    /// Closes the port and every connection; returns once they are closed.
    fn down(&mut self) {
        self.up.store(false, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }

    fn seqs(&self) -> Vec<u64> {
        self.seqs.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.down();
    }
}

/// Serves one connection until the receiver goes down.
fn serve_connection(kind: Kind, mut stream: TcpStream, seqs: &Seqs, up: &AtomicBool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        if !up.load(Ordering::SeqCst) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return;
        }
        if kind == Kind::NeverReads {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => return,
        }
        if kind == Kind::SyslogTcp {
            // Octet-counted frames: "LEN SP MSG".
            while let Some(space) = buf.iter().position(|b| *b == b' ') {
                let len: usize = std::str::from_utf8(&buf[..space]).unwrap().parse().unwrap();
                if buf.len() < space + 1 + len {
                    break;
                }
                let message = String::from_utf8_lossy(&buf[space + 1..space + 1 + len]).to_string();
                assert!(message.starts_with('<'), "{message}");
                seqs.lock().unwrap().push(seq_of_syslog(&message).unwrap());
                buf.drain(..space + 1 + len);
            }
            continue;
        }
        // HTTP/1.1: a head and a Content-Length body.
        let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let lower = l.to_ascii_lowercase();
                lower
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        if buf.len() < head_end + 4 + length {
            continue;
        }
        let body = buf[head_end + 4..head_end + 4 + length].to_vec();
        buf.drain(..head_end + 4 + length);
        let (status, content_type, answer): (&str, &str, Vec<u8>) = match kind {
            Kind::HecSmall
                if String::from_utf8_lossy(&body)
                    .lines()
                    .any(|l| l.len() > 12 * 1024) =>
            {
                (
                    "413 Payload Too Large",
                    "application/json",
                    br#"{"text":"Content too large","code":27}"#.to_vec(),
                )
            }
            Kind::Hec | Kind::HecSmall => {
                assert!(head.contains(&format!("Splunk {HEC_TOKEN}")), "{head}");
                for line in String::from_utf8(body).unwrap().lines() {
                    let item: Value = serde_json::from_str(line).unwrap();
                    let seq = item["fields"]["seq"].as_u64().unwrap();
                    // The OCSF record inside names the same seq (a stub: its seq).
                    if item["event"]["truncated"] == json!(true) {
                        assert_eq!(item["event"]["seq"], json!(seq), "{item}");
                        seqs.lock().unwrap().push(seq + STUB);
                        continue;
                    }
                    assert_eq!(item["event"]["metadata"]["sequence"], json!(seq));
                    seqs.lock().unwrap().push(seq);
                }
                (
                    "200 OK",
                    "application/json",
                    br#"{"text":"Success","code":0}"#.to_vec(),
                )
            }
            Kind::Otlp => {
                assert!(head.starts_with("POST /v1/logs "), "{head}");
                // Decoded by opentelemetry-proto, as a collector would.
                let request = ExportLogsServiceRequest::decode(body.as_slice()).unwrap();
                for resource in &request.resource_logs {
                    for scope in &resource.scope_logs {
                        for record in &scope.log_records {
                            let seq = record
                                .attributes
                                .iter()
                                .find(|kv| kv.key == "toolgate.seq")
                                .and_then(|kv| kv.value.as_ref()?.value.clone());
                            let Some(any_value::Value::IntValue(seq)) = seq else {
                                panic!("a log record without toolgate.seq: {record:?}");
                            };
                            seqs.lock().unwrap().push(seq as u64);
                        }
                    }
                }
                ("200 OK", "application/x-protobuf", Vec::new())
            }
            Kind::Fails => ("500 Internal Server Error", "text/plain", b"down".to_vec()),
            _ => (
                "200 OK",
                "application/json",
                b"\xff\x00<garbage>{{{".to_vec(),
            ),
        };
        let mut response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        )
        .into_bytes();
        response.extend_from_slice(&answer);
        if stream.write_all(&response).is_err() {
            return;
        }
    }
}

/// The seq of a call's closing event (its `audit_event_id`).
fn closing_seq(body: &Value) -> u64 {
    body["audit_event_id"]
        .as_str()
        .and_then(|id| id.strip_prefix("ev-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no audit_event_id: {body}"))
}

/// Makes calls for `window` (or `count` calls); all must succeed. Returns (calls,
/// calls per second, the last closing seq).
fn calls_for(server: &Server, run: &str, window: Duration, count: usize) -> (usize, f64, u64) {
    let started = Instant::now();
    let (mut n, mut last) = (0, 0);
    while (window.is_zero() || started.elapsed() < window) && (count == 0 || n < count) {
        let (code, body) = lab::call(
            server,
            run,
            "echo_cmd",
            json!({"text": format!("call {n}")}),
            json!({}),
        );
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["status"], "success", "{body}");
        last = closing_seq(&body);
        n += 1;
    }
    (n, n as f64 / started.elapsed().as_secs_f64(), last)
}

/// Every seq from 1 to `head` arrived, in order: each new seq is at most one past the
/// highest seen (a redelivery repeats a suffix, never skips).
fn complete_in_order(seqs: &[u64], head: u64) -> Result<(), String> {
    let mut highest = 0;
    for (i, seq) in seqs.iter().enumerate() {
        if *seq > highest + 1 {
            return Err(format!(
                "seq {seq} arrived at position {i} after only {highest}"
            ));
        }
        highest = highest.max(*seq);
    }
    if highest < head {
        return Err(format!("only up to {highest} of {head}"));
    }
    Ok(())
}

/// The check of a receiver's kind.
fn check(kind: Kind, seqs: &[u64], head: u64) -> Result<(), String> {
    match kind {
        // Best effort: counted and printed at the end, not required.
        Kind::SyslogUdp => Ok(()),
        _ => complete_in_order(seqs, head),
    }
}

/// A metric's value for one sink, from the /metrics text.
fn metric(base: &str, name: &str, sink: &str) -> Option<f64> {
    let text = ureq::get(format!("{base}/metrics"))
        .call()
        .ok()?
        .body_mut()
        .read_to_string()
        .ok()?;
    let label = format!(
        "{name}{{sink=\"{}\"}} ",
        sink.replace('\\', "\\\\").replace('"', "\\\"")
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&label))
        .and_then(|v| v.trim().parse().ok())
}

fn start_shipping(dir: &Path, data_dir: &Path, specs: &[String]) -> Server {
    let mut start: Start = lab::lab(dir);
    start.data_dir = Some(data_dir.to_path_buf());
    for spec in specs {
        start.args.push("--ship".into());
        start.args.push(spec.clone());
    }
    Server::start_with(start)
}

fn wait_complete(receivers: &[&Receiver], head: u64, within: Duration) {
    let ok = common::poll_until(within, || {
        receivers
            .iter()
            .all(|r| check(r.kind, &r.seqs(), head).is_ok())
    });
    let report: Vec<String> = receivers
        .iter()
        .map(|r| {
            let seqs = r.seqs();
            format!(
                "{:?}: {:?} ({} received)",
                r.kind,
                check(r.kind, &seqs, head),
                seqs.len()
            )
        })
        .collect();
    assert!(ok, "not every receiver has every event: {report:?}");
}

/// An agent's call whose event is too large for the receiver (it answers 413 to it,
/// every time) cannot stop the sink: a record over `max_record_bytes` goes as a stub
/// naming its seq and leaf hash, and every event after it still arrives.
#[test]
fn one_event_too_large_for_the_receiver_does_not_stop_the_sink() {
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("hec.token");
    std::fs::write(&token_file, format!("{HEC_TOKEN}\n")).unwrap();
    let receiver = Receiver::start(Kind::HecSmall);
    let server = start_shipping(
        tmp.path(),
        &tmp.path().join("var"),
        &[receiver.spec(&token_file)],
    );
    let run = server.create_run(json!({}));
    let (code, body) = lab::call(
        &server,
        &run,
        "echo_cmd",
        json!({"text": "x".repeat(20_000)}),
        json!({}),
    );
    assert_eq!(code, 200, "{body}");
    let big = closing_seq(&body);
    let (_, _, head) = calls_for(&server, &run, Duration::ZERO, 3);
    let arrived = common::poll_until(Duration::from_secs(30), || receiver.seqs().contains(&head));
    let seqs = receiver.seqs();
    assert!(arrived, "the sink stopped before seq {head}: {seqs:?}");
    // The large call's two events went as stubs, every other event whole.
    assert!(seqs.contains(&(big + STUB)), "{seqs:?}");
    assert!(seqs.contains(&(big - 1 + STUB)), "{seqs:?}");
    for seq in 1..=head {
        if seq != big && seq != big - 1 {
            assert!(seqs.contains(&seq), "seq {seq} missing: {seqs:?}");
        }
    }
}

#[test]
fn every_event_arrives_in_order_after_a_5s_outage_and_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("hec.token");
    std::fs::write(&token_file, format!("{HEC_TOKEN}\n")).unwrap();
    let mut receivers: Vec<Receiver> = [Kind::SyslogTcp, Kind::SyslogUdp, Kind::Hec, Kind::Otlp]
        .into_iter()
        .map(Receiver::start)
        .collect();
    let specs: Vec<String> = receivers.iter().map(|r| r.spec(&token_file)).collect();
    let data_dir = tmp.path().join("var");
    // A rotated file of native lines besides the network sinks (not part of `specs`,
    // whose order follows `receivers`).
    let shipped = tmp.path().join("shipped/events.jsonl");
    let file_spec = format!(
        "file:{}?format=native&max_bytes=65536&keep=1000",
        shipped.display()
    );
    let specs_with_file: Vec<String> = specs.iter().cloned().chain([file_spec]).collect();
    let server = start_shipping(tmp.path(), &data_dir, &specs_with_file);
    let run = server.create_run(json!({}));

    // Up: a baseline, everything delivered.
    let (n, up_rate, head) = calls_for(&server, &run, Duration::ZERO, 40);
    let outage_from = head;
    wait_complete(
        &receivers.iter().collect::<Vec<_>>(),
        head,
        Duration::from_secs(60),
    );
    println!("receivers up: {n} calls at {up_rate:.0} calls/s");

    // Down for 5 s: every call still succeeds, the lag shows.
    for r in &mut receivers {
        r.down();
    }
    let (n, down_rate, head) = calls_for(&server, &run, Duration::from_secs(5), 0);
    let outage_to = head;
    println!("receivers down 5 s: {n} calls at {down_rate:.0} calls/s (up: {up_rate:.0})");
    assert!(n > 0);
    for (r, spec) in receivers.iter().zip(&specs) {
        if r.kind == Kind::SyslogUdp {
            continue;
        }
        let lag = metric(&server.base, "toolgate_ship_lag_events", spec).unwrap();
        let failures = metric(&server.base, "toolgate_ship_failures_total", spec).unwrap();
        println!(
            "{:?} while down: lag {lag} events, {failures} failures",
            r.kind
        );
        assert!(
            lag > 0.0 && failures > 0.0,
            "{:?}: lag {lag}, failures {failures}",
            r.kind
        );
    }
    for r in &mut receivers {
        r.up();
    }
    wait_complete(
        &receivers.iter().collect::<Vec<_>>(),
        head,
        Duration::from_secs(90),
    );
    assert!(common::poll_until(Duration::from_secs(10), || {
        specs
            .iter()
            .all(|s| metric(&server.base, "toolgate_ship_lag_events", s) == Some(0.0))
    }));

    // Restart: the cursors resume where they stopped (no replay from seq 1).
    let before: Vec<usize> = receivers.iter().map(|r| r.seqs().len()).collect();
    assert!(server.stop().success());
    let server = start_shipping(tmp.path(), &data_dir, &specs_with_file);
    // The lab registry names a new upstream port: a new run under it.
    let run = server.create_run(json!({}));
    let (_, _, head) = calls_for(&server, &run, Duration::ZERO, 10);
    wait_complete(
        &receivers.iter().collect::<Vec<_>>(),
        head,
        Duration::from_secs(60),
    );
    for (r, skip) in receivers.iter().zip(before) {
        if r.kind == Kind::SyslogUdp {
            continue;
        }
        let after = &r.seqs()[skip..];
        assert!(
            after.first().is_some_and(|s| *s > 1),
            "{:?} replayed from the start: {after:?}",
            r.kind
        );
    }
    // UDP is best effort (no acknowledgement, no flow control: a datagram to a closed
    // port or past a full receive buffer is lost): what arrived is printed.
    let udp = receivers
        .iter()
        .find(|r| r.kind == Kind::SyslogUdp)
        .unwrap();
    let seen: std::collections::BTreeSet<u64> = udp.seqs().into_iter().collect();
    println!(
        "syslog UDP (best effort): {} of {head} events arrived ({} sent while it was down)",
        seen.len(),
        outage_to - outage_from
    );
    assert!(!seen.is_empty());
    // The file sink: rotated files, oldest (highest number) first, then the live one,
    // hold every event's exact line in order.
    let file_seqs = || -> Vec<u64> {
        let dir = shipped.parent().unwrap();
        let mut rotated: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let path = e.ok()?.path();
                let n = path.extension()?.to_str()?.parse().ok()?;
                Some((n, path))
            })
            .collect();
        rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
        let mut files: Vec<std::path::PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
        files.push(shipped.clone());
        files
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .lines()
                    .map(|l| {
                        serde_json::from_str::<Value>(l).unwrap()["seq"]
                            .as_u64()
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    assert!(
        common::poll_until(Duration::from_secs(30), || complete_in_order(
            &file_seqs(),
            head
        )
        .is_ok()),
        "file sink: {:?}",
        complete_in_order(&file_seqs(), head)
    );
    let rotated = std::fs::read_dir(shipped.parent().unwrap())
        .unwrap()
        .count();
    println!("file sink: {head} events in {rotated} files of at most 64 KiB");
    assert!(rotated > 2, "the file was never rotated");
    drop(server);
}

/// The resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn hostile_sinks_leave_the_gateway_serving_with_bounded_memory_and_visible_lag() {
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("hec.token");
    std::fs::write(&token_file, HEC_TOKEN).unwrap();
    let receivers: Vec<Receiver> = [Kind::NeverReads, Kind::Fails, Kind::Garbage]
        .into_iter()
        .map(Receiver::start)
        .collect();
    let specs: Vec<String> = receivers.iter().map(|r| r.spec(&token_file)).collect();
    // A baseline gateway without sinks, then the same load with the hostile ones.
    let plain = start_shipping(
        &tmp.path().join("plain"),
        &tmp.path().join("plain-var"),
        &[],
    );
    let run = plain.create_run(json!({}));
    let (_, plain_rate, _) = calls_for(&plain, &run, Duration::ZERO, 600);
    drop(plain);
    let server = start_shipping(tmp.path(), &tmp.path().join("var"), &specs);
    let run = server.create_run(json!({}));
    let rss_before = rss_kib(server.pid());
    let (n, rate, head) = calls_for(&server, &run, Duration::ZERO, 600);
    let rss_after = rss_kib(server.pid());
    println!(
        "hostile sinks: {n} calls at {rate:.0} calls/s (same load, no sinks: {plain_rate:.0}); \
         RSS {rss_before} -> {rss_after} KiB; head seq {head}"
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "memory grew from {rss_before} to {rss_after} KiB"
    );
    // The lag shows for every sink, and nothing was confirmed by the 500 or garbage ones.
    for (r, spec) in receivers.iter().zip(&specs) {
        let seen = common::poll_until(Duration::from_secs(30), || {
            metric(&server.base, "toolgate_ship_lag_events", spec).is_some_and(|l| l > 0.0)
                && metric(&server.base, "toolgate_ship_failures_total", spec)
                    .is_some_and(|f| f > 0.0)
        });
        let lag = metric(&server.base, "toolgate_ship_lag_events", spec);
        let lag_s = metric(&server.base, "toolgate_ship_lag_seconds", spec);
        println!("{:?}: lag {lag:?} events, {lag_s:?} s", r.kind);
        assert!(seen, "{:?}: no lag or failure in /metrics", r.kind);
        if r.kind != Kind::NeverReads {
            assert_eq!(
                metric(&server.base, "toolgate_ship_delivered_total", spec),
                Some(0.0)
            );
        }
    }
}
