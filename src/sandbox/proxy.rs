//! `network: {connect: ["host:port", ...]}`: the tool runs in an empty network
//! namespace whose only way out is an egress proxy toolgate runs for the call.
//!
//! Two halves:
//! - [`EgressProxy`] (toolgate's side, a task per call): listens on a Unix socket,
//!   reads one HTTP request head per connection (`CONNECT host:port`, or an
//!   absolute-form `GET http://host:port/...`), checks the target against the
//!   profile's list, connects and relays; every attempt is recorded for the closing
//!   event.
//! - [`Forwarder`] (the launcher's side, a process in the tool's namespace): listens
//!   on the namespace's loopback and relays each connection to that Unix socket. The
//!   tool finds it through `HTTPS_PROXY` and `HTTP_PROXY`.
//!
//! INVARIANT: a target outside the list is never connected to; the answer is a 403.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The longest request head the proxy reads.
const MAX_HEAD_BYTES: usize = 8 * 1024;
/// The most attempts recorded per call (the rest are counted).
const MAX_RECORDED: usize = 64;
/// The most connections open through the proxy at once, per call.
const MAX_OPEN: usize = 16;

/// The forwarder's port in the tool's namespace (set before the tool's process forks).
static FORWARDER_PORT: AtomicU16 = AtomicU16::new(0);

/// The forwarder's loopback port, once bound.
pub fn forwarder_port() -> Option<u16> {
    match FORWARDER_PORT.load(Ordering::Relaxed) {
        0 => None,
        port => Some(port),
    }
}

/// The launcher's relay from the namespace's loopback to the proxy's socket.
pub struct Forwarder {
    listener: TcpListener,
    socket: PathBuf,
}

impl Forwarder {
    /// Binds 127.0.0.1:0 in the current (the tool's) network namespace.
    pub fn bind(socket: &Path) -> std::io::Result<Forwarder> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        FORWARDER_PORT.store(listener.local_addr()?.port(), Ordering::Relaxed);
        Ok(Forwarder {
            listener,
            socket: socket.to_path_buf(),
        })
    }

    /// Relays connections until the process is killed (the namespace's end).
    pub fn serve(self) {
        for stream in self.listener.incoming() {
            let Ok(client) = stream else { continue };
            let socket = self.socket.clone();
            std::thread::spawn(move || {
                if let Ok(upstream) = UnixStream::connect(&socket) {
                    relay(client, upstream);
                }
            });
        }
    }
}

/// Copies both ways until either side closes.
fn relay(client: TcpStream, upstream: UnixStream) {
    let (Ok(mut client_read), Ok(mut upstream_write)) = (client.try_clone(), upstream.try_clone())
    else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_read, &mut upstream_write);
        let _ = upstream_write.shutdown(std::net::Shutdown::Write);
    });
    let (mut upstream_read, mut client_write) = (upstream, client);
    let mut buf = [0u8; 16 * 1024];
    loop {
        match upstream_read.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if client_write.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = client_write.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

/// One attempt through the proxy, as the closing event records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    /// `host:port` as the tool asked for it (normalized).
    pub target: String,
    pub allowed: bool,
    /// Why a connection was not made (not in the list, unreachable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// What the proxy saw during one call.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Traffic {
    pub attempts: Vec<Attempt>,
    /// Attempts past the recorded ones.
    pub more: u64,
}

/// The egress proxy of one call; stops when dropped.
pub struct EgressProxy {
    pub socket: PathBuf,
    traffic: Arc<Mutex<Traffic>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl EgressProxy {
    /// Listens on `socket` (a fresh path) for the targets `allowed` (normal
    /// `host:port` forms).
    pub fn start(socket: PathBuf, allowed: Vec<String>) -> std::io::Result<EgressProxy> {
        let listener = tokio::net::UnixListener::bind(&socket)?;
        let traffic = Arc::new(Mutex::new(Traffic::default()));
        let seen = traffic.clone();
        let open = Arc::new(tokio::sync::Semaphore::new(MAX_OPEN));
        let allowed = Arc::new(allowed);
        let task = tokio::spawn(async move {
            let mut tunnels = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let Ok(permit) = open.clone().try_acquire_owned() else {
                            drop(stream);
                            continue;
                        };
                        let allowed = allowed.clone();
                        let seen = seen.clone();
                        tunnels.spawn(async move {
                            serve_one(stream, &allowed, &seen).await;
                            drop(permit);
                        });
                    }
                    Some(_) = tunnels.join_next(), if !tunnels.is_empty() => {}
                }
            }
        });
        Ok(EgressProxy {
            socket,
            traffic,
            task,
        })
    }

    /// What the proxy saw so far.
    pub fn traffic(&self) -> Traffic {
        self.traffic.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

fn record(seen: &Mutex<Traffic>, attempt: Attempt) {
    if let Ok(mut t) = seen.lock() {
        if t.attempts.len() < MAX_RECORDED {
            t.attempts.push(attempt);
        } else {
            t.more += 1;
        }
    }
}

/// One client connection: its request head, the check, then the tunnel.
async fn serve_one(mut client: tokio::net::UnixStream, allowed: &[String], seen: &Mutex<Traffic>) {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let end = loop {
        if let Some(end) = find_head_end(&head) {
            break end;
        }
        if head.len() > MAX_HEAD_BYTES {
            let _ = client
                .write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n")
                .await;
            return;
        }
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let rest = head[end..].to_vec();
    let Some(request) = parse_request(&text) else {
        let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        return;
    };
    let target = request.target.clone();
    if !allowed.contains(&target) {
        record(
            seen,
            Attempt {
                target,
                allowed: false,
                refused: Some("not in the profile's `connect` list".into()),
            },
        );
        let _ = client
            .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await;
        return;
    }
    let (host, port) = match target.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']').to_string(),
            p,
        ),
        None => return,
    };
    let Ok(port) = port.parse::<u16>() else {
        return;
    };
    let mut upstream = match tokio::net::TcpStream::connect((host.as_str(), port)).await {
        Ok(s) => s,
        Err(e) => {
            record(
                seen,
                Attempt {
                    target,
                    allowed: true,
                    refused: Some(format!("unreachable: {e}")),
                },
            );
            let _ = client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                .await;
            return;
        }
    };
    record(
        seen,
        Attempt {
            target,
            allowed: true,
            refused: None,
        },
    );
    let sent = if request.connect {
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_ok()
            && upstream.write_all(&rest).await.is_ok()
    } else {
        let mut first = request.forward_head.into_bytes();
        first.extend_from_slice(&rest);
        upstream.write_all(&first).await.is_ok()
    };
    if sent {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

fn find_head_end(head: &[u8]) -> Option<usize> {
    head.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
}

struct Request {
    connect: bool,
    /// Normal `host:port`.
    target: String,
    /// For a plain HTTP request: the head rewritten to origin form.
    forward_head: String,
}

/// `CONNECT host:port HTTP/1.x`, or `METHOD http://host[:port]/path HTTP/1.x`.
fn parse_request(head: &str) -> Option<Request> {
    let (line, rest) = head.split_once("\r\n")?;
    let mut parts = line.split(' ');
    let (method, uri, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    if method == "CONNECT" {
        let target = crate::policy::normal_host_port(uri)?;
        return Some(Request {
            connect: true,
            target,
            forward_head: String::new(),
        });
    }
    let after = uri.strip_prefix("http://")?;
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let target = crate::policy::normal_host_port(&with_port)?;
    Some(Request {
        connect: false,
        target,
        forward_head: format!("{method} {path} {version}\r\n{rest}"),
    })
}

#[cfg(test)]
mod tests {
    use super::parse_request;

    #[test]
    fn requests_name_their_target() {
        let c = parse_request("CONNECT Example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap_or_else(|| panic!());
        assert!(c.connect);
        assert_eq!(c.target, "example.com:443");
        let g = parse_request("GET http://localhost:8080/a?b HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap_or_else(|| panic!());
        assert_eq!(g.target, "localhost:8080");
        assert!(
            g.forward_head
                .starts_with("GET /a?b HTTP/1.1\r\nHost: localhost")
        );
        let d = parse_request("GET http://h/ HTTP/1.0\r\n\r\n").unwrap_or_else(|| panic!());
        assert_eq!(d.target, "h:80");
        assert!(parse_request("GET /relative HTTP/1.1\r\n\r\n").is_none());
        assert!(parse_request("CONNECT nohost HTTP/1.1\r\n\r\n").is_none());
    }
}
