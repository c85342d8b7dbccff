//! The gateway under test: `toolgate serve` as a child process on loopback, and a
//! client's keep-alive connection to it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1 as client_http1;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

use super::report::BenchDurability;
use super::stats::Scrape;
use crate::{BenchError, DEMO_CASE, REQUEST_TIMEOUT, SERVER_START_TIMEOUT, io, toolgate_exe};

/// The gateway under test: `toolgate serve` as a child process.
pub(crate) struct GatewayServer {
    pub(crate) child: Option<Child>,
    pub(crate) addr: SocketAddr,
    /// Log lines the server wrote (its stderr is drained, as a log shipper would).
    pub(crate) log_lines: Arc<AtomicU64>,
}

impl GatewayServer {
    pub(crate) fn start(
        work: &Path,
        name: &str,
        policy_dir: &Path,
        tools_file: &Path,
        durability: BenchDurability,
    ) -> Result<GatewayServer, BenchError> {
        let exe = toolgate_exe()?;
        let data_dir = work.join(format!("var-{name}"));
        let mut child = Command::new(exe)
            .arg("serve")
            .args([
                "--listen",
                "127.0.0.1:0",
                "--durability",
                durability.as_str(),
            ])
            .arg("--policy-dir")
            .arg(policy_dir)
            .arg("--tools")
            .arg(tools_file)
            .arg("--data-dir")
            .arg(&data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("starting `toolgate serve`"))?;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let mut server = GatewayServer {
            child: Some(child),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_lines: Arc::new(AtomicU64::new(0)),
        };
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            return Err(BenchError::Server("no stdout or stderr pipe".into()));
        };
        let lines = server.log_lines.clone();
        std::thread::spawn(move || {
            for _ in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.fetch_add(1, Ordering::Relaxed);
            }
        });
        // The listening line comes first; a reader thread hands it over with a timeout.
        let (found, listening) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            for line in lines.by_ref().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("toolgate listening on http://") {
                    let _ = found.send(addr.trim().to_string());
                    break;
                }
            }
            for _ in lines {}
        });
        let addr = listening
            .recv_timeout(SERVER_START_TIMEOUT)
            .map_err(|_| BenchError::Server("it did not report its address in time".into()))?;
        server.addr = addr
            .parse()
            .map_err(|_| BenchError::Server(format!("unexpected address `{addr}`")))?;
        Ok(server)
    }

    /// The server's process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Opens the measured run (for the demo policy, bound to [`DEMO_CASE`]).
    pub(crate) async fn create_run(&self, admin: &str, demo: bool) -> Result<String, BenchError> {
        let mut conn = Conn::open(self.addr).await?;
        let body = if demo {
            json!({ "scope": { "case_id": DEMO_CASE } }).to_string()
        } else {
            "{}".to_string()
        };
        let (status, body) = conn
            .request(Method::POST, "/v1/runs", Some(admin), Bytes::from(body))
            .await?;
        let value: Value = serde_json::from_slice(&body)
            .map_err(|_| BenchError::Http("POST /v1/runs did not answer json".into()))?;
        match (status, value["run_id"].as_str()) {
            (201, Some(id)) => Ok(id.to_string()),
            _ => Err(BenchError::Http(format!(
                "POST /v1/runs answered {status}: {value}"
            ))),
        }
    }

    pub(crate) async fn scrape(&self) -> Result<Scrape, BenchError> {
        let mut conn = Conn::open(self.addr).await?;
        let (status, body) = conn
            .request(Method::GET, "/metrics", None, Bytes::new())
            .await?;
        if status != 200 {
            return Err(BenchError::Http(format!("GET /metrics answered {status}")));
        }
        Ok(Scrape(String::from_utf8_lossy(&body).into_owned()))
    }

    pub(crate) fn stop(mut self) {
        self.shutdown();
    }

    /// SIGTERM (graceful: the audit log is closed), then SIGKILL if it lingers.
    pub(crate) fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + SERVER_START_TIMEOUT;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for GatewayServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One HTTP/1.1 keep-alive connection of a client.
pub(crate) struct Conn {
    pub(crate) sender: client_http1::SendRequest<Full<Bytes>>,
    pub(crate) host: HeaderValue,
}

impl Conn {
    pub(crate) async fn open(addr: SocketAddr) -> Result<Conn, BenchError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(io(format!("connecting to {addr}")))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = client_http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| BenchError::Http(format!("handshake with {addr}: {e}")))?;
        tokio::spawn(connection);
        let host = HeaderValue::from_str(&addr.to_string())
            .map_err(|e| BenchError::Http(e.to_string()))?;
        Ok(Conn { sender, host })
    }

    pub(crate) async fn request(
        &mut self,
        method: Method,
        path: &'static str,
        token: Option<&str>,
        body: Bytes,
    ) -> Result<(u16, Bytes), BenchError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(token) = token {
            builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = builder
            .body(Full::new(body))
            .map_err(|e| BenchError::Http(e.to_string()))?;
        let exchange = async {
            self.sender
                .ready()
                .await
                .map_err(|e| BenchError::Http(e.to_string()))?;
            let response = self
                .sender
                .send_request(request)
                .await
                .map_err(|e| BenchError::Http(e.to_string()))?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| BenchError::Http(e.to_string()))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| BenchError::Http(format!("no answer within {REQUEST_TIMEOUT:?}")))?
    }
}
