//! The accept loop: HTTP/1.1 and HTTP/2 (prior knowledge) on one port.
//!
//! Our own loop rather than `axum::serve` for two settings it does not expose:
//! - `TCP_NODELAY` on every accepted socket: SSE and long-poll answers are small writes that
//!   must leave at once, not wait for the previous segment's ACK (Nagle);
//! - HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`: hyper's default (200) caps how many tailers
//!   one multiplexed connection can hold.
//!
//! HTTP/2 connections gather their writes ([`Coalesce`]) so that one append's frames for many
//! subscribers leave in one write, and run their streams in the connection's own task
//! ([`ConnExec`]) instead of a task per stream.
//!
//! Connections that stop talking are closed rather than held forever:
//! - until the first bytes show the protocol, [`Preface`] bounds the wait (hyper's protocol
//!   detection has no timer of its own, so a client that sends nothing, or half the HTTP/2
//!   preface, would otherwise hold its socket and task for good);
//! - HTTP/1.1 then has its header read timer (also between requests on a kept-alive
//!   connection);
//! - HTTP/2 pings a connection that has gone quiet and closes it when no answer comes.

use crate::coalesce::{Coalesce, Sniff, sniff};
use crate::conn_exec::ConnExec;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Listener settings.
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    /// HTTP/2 streams one connection may have open at once.
    pub http2_max_streams: u32,
}

/// Longest wait for a request's headers on an HTTP/1.1 connection, and for the first bytes
/// (the protocol) of any connection.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an HTTP/2 connection may stay silent before it is pinged, and then how long the
/// ping may go unanswered before the connection is closed (a peer gone without a FIN).
const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Bytes one HTTP/2 stream may have queued for a client that does not read (hyper's default
/// is ~400 KiB). One read chunk (64 KiB by default) fits; with 1024 streams a connection holds
/// at most 64 MiB for slow readers instead of 400 MiB.
const H2_SEND_BUF: usize = 64 * 1024;

/// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The connection builder, with `exec` running the connection's HTTP/2 streams (public so
/// `examples/sse_floor.rs` measures the same stack).
pub fn builder(opts: ListenOptions, exec: ConnExec) -> Builder<ConnExec> {
    builder_with(opts, HEADER_READ_TIMEOUT, exec)
}

fn builder_with(
    opts: ListenOptions,
    header_read_timeout: Duration,
    exec: ConnExec,
) -> Builder<ConnExec> {
    let mut b = Builder::new(exec);
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    b.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT)
        .max_concurrent_streams(opts.http2_max_streams)
        .max_send_buf_size(H2_SEND_BUF);
    b
}

/// Serves `app` until `stop` turns true, then waits for open connections to finish their
/// in-flight requests (the caller bounds that wait with its drain timeout).
///
/// `header_read_timeout` bounds the wait for the protocol and for each HTTP/1.1 request's
/// headers ([`HEADER_READ_TIMEOUT`] in production). A parameter rather than a field of
/// [`ListenOptions`], which code outside this crate builds field by field.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    opts: ListenOptions,
    header_read_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let svc = TowerToHyperService::new(app.clone());
        // An executor per connection, so its HTTP/2 streams run in its own task.
        let exec = ConnExec::default();
        let io = Coalesce::new(Preface::new(tcp, header_read_timeout));
        let conn = builder_with(opts, header_read_timeout, exec.clone())
            .serve_connection_with_upgrades(TokioIo::new(io), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = exec.drive(conn).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The HTTP/2 connection preface (RFC 9113 §3.4): hyper reads this many bytes, or up to the
/// first that differs, to choose the protocol.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection whose reads fail with `TimedOut` if the bytes that choose its protocol (the
/// whole HTTP/2 preface, or a byte that departs from it) have not arrived within the timeout.
/// Past that point it is the socket itself: the protocols' own timers take over.
#[derive(Debug)]
pub struct Preface<T> {
    inner: T,
    /// Armed until the protocol is known.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Bytes read so far, all matching the preface.
    seen: usize,
}

impl<T> Preface<T> {
    /// Starts the clock (needs a Tokio runtime).
    pub fn new(inner: T, timeout: Duration) -> Self {
        Preface {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
            seen: 0,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Preface<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.deadline.is_some() {
                    let got = &buf.filled()[before..];
                    // End of stream, a byte off the preface, or the whole preface: decided.
                    match sniff(H2_PREFACE, this.seen, got) {
                        Sniff::More(seen) if !got.is_empty() => this.seen = seen,
                        _ => this.deadline = None,
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if let Some(d) = this.deadline.as_mut()
                    && d.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no request started in time",
                    )));
                }
                Poll::Pending
            }
            err => err,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Preface<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// Far above the 200 ms under test, so a loaded machine does not fail it.
    const CLOSE_WITHIN: Duration = Duration::from_secs(10);

    /// Serves an app that answers 200 with a 200 ms protocol timeout; returns its address.
    async fn server() -> (std::net::SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop_tx, stop_rx) = watch::channel(false);
        let opts = ListenOptions {
            http2_max_streams: 16,
        };
        tokio::spawn(serve(
            listener,
            app,
            opts,
            Duration::from_millis(200),
            stop_rx,
        ));
        (addr, stop_tx)
    }

    /// Sends `first`, then waits for the server to close the connection: false if it was still
    /// open after [`CLOSE_WITHIN`].
    async fn closes(addr: std::net::SocketAddr, first: &'static [u8]) -> bool {
        tokio::task::spawn_blocking(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(first).unwrap();
            c.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
            let mut buf = [0u8; 64];
            loop {
                match c.read(&mut buf) {
                    // Closed (or reset) by the server; an answer before that is fine.
                    Ok(0) => return true,
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        return false;
                    }
                    Err(_) => return true,
                }
            }
        })
        .await
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_that_never_shows_its_protocol_is_closed() {
        let (addr, _stop) = server().await;
        assert!(closes(addr, b"").await, "silent connection kept open");
        assert!(
            closes(addr, b"PRI * HT").await,
            "half a preface kept the connection open"
        );
        // HTTP/1.1's own header timer, after the first byte decided the protocol.
        assert!(
            closes(addr, b"GET / HT").await,
            "half a request line kept the connection open"
        );
    }

    /// Once the preface is in, the protocol timer is off: an HTTP/2 connection idle for longer
    /// than it still serves requests.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_http2_connection_outlives_the_protocol_timeout() {
        let (addr, _stop) = server().await;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tcp),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let req = hyper::Request::get("http://localhost/")
            .body(axum::body::Body::empty())
            .unwrap();
        let res = tokio::time::timeout(CLOSE_WITHIN, send.send_request(req))
            .await
            .expect("no answer")
            .unwrap();
        assert_eq!(res.status(), 200);
    }
}
