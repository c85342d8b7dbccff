//! The tiny HTTP upstream on loopback: it echoes the body it gets.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::{BenchError, io};

/// The stand-in tool upstream and the bare echo: answers every request with its body, on its own thread and
/// single-threaded runtime, until stopped.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    pub(crate) stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub(crate) thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    pub(crate) fn start() -> Result<Upstream, BenchError> {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(io("binding the upstream"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("configuring the upstream socket"))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the upstream address"))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io("starting the upstream runtime"))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-upstream".into())
            .spawn(move || runtime.block_on(serve_upstream(listener, stopped)))
            .map_err(io("starting the upstream thread"))?;
        Ok(Upstream {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub(crate) fn stop(mut self) {
        self.shutdown();
    }

    pub(crate) fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub(crate) async fn serve_upstream(
    listener: std::net::TcpListener,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    tokio::pin!(stopped);
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(|request: Request<Incoming>| async move {
                let body = match request.into_body().collect().await {
                    Ok(body) => body.to_bytes(),
                    Err(_) => Bytes::from_static(b"{}"),
                };
                let mut response = Response::new(Full::new(body));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                Ok::<_, Infallible>(response)
            });
            let _ = server_http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
