//! The accept loop: HTTP/1.1 and HTTP/2 (prior knowledge) on one port.
//!
//! Our own loop rather than `axum::serve` for settings it does not expose:
//! - `TCP_NODELAY` on every accepted socket: SSE and long-poll answers are small writes that
//!   must leave at once, not wait for the previous segment's ACK (Nagle);
//! - TCP keepalive on every accepted socket: a client whose network died leaves no FIN, and an
//!   idle HTTP/1.1 SSE or long-poll connection would otherwise never learn it is gone;
//! - HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`: hyper's default (200) caps how many tailers
//!   one multiplexed connection can hold.
//!
//! HTTP/2 connections gather their writes ([`Coalesce`]) so that one append's frames for many
//! subscribers leave in one write, and run their streams in the connection's own task
//! ([`ConnExec`]) instead of a task per stream.
//!
//! Connections that stop talking are closed rather than held forever:
//! - [`HeadWait`] bounds the wait for a request: for the first bytes that show the protocol
//!   (hyper's protocol detection has no timer of its own), then on HTTP/1.1 for each request's
//!   head, counted from the end of the previous response; one sleep per connection rather than
//!   hyper's `header_read_timeout`, which arms a timer per request;
//! - HTTP/2 pings a connection that has gone quiet and closes it when no answer comes;
//! - a request body that stops arriving mid-way fails after [`BODY_IDLE_TIMEOUT`], one that
//!   trickles in below [`BODY_MIN_RATE`] (after [`BODY_RATE_GRACE`]) or is not complete within
//!   [`BODY_DEADLINE`] fails too, and each is answered 408 ([`guard`](crate::guard));
//! - a client that stops reading its responses: writes to a full socket that make no progress
//!   for [`STALL_LIMIT`] fail the connection ([`WriteStall`]; hyper only polls a response body
//!   when it can write, so no deadline inside the body would fire), and an HTTP/2 stream whose
//!   client keeps the socket drained but its flow-control window shut is dropped after the same
//!   limit ([`ConnExec`]'s watchdog).

use crate::coalesce::Coalesce;
use crate::conn_exec::ConnExec;
use crate::direct;
use crate::guard::{self, BodyLimits, Edge};
use crate::head_wait::{Exchanges, HeadWait, Tracked};
use crate::host::HostPolicy;
use crate::shutdown::Drain;
use crate::wait_timer::WaitTimer;
use axum::extract::Request;
use axum::http::Version;
use axum::response::Response;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use pico_http::fast::seal;
use pico_server::live::hub::DirectOffer;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What a listener serves. The listener puts the guard ([`crate::guard`]) and the router's
/// last touches ([`seal`]) around it: plain calls, no layers.
pub trait App: Clone + Send + Sync + 'static {
    /// Answers one request; the future owns what it needs.
    fn call(&self, req: Request) -> impl Future<Output = Response> + Send + use<Self>;
}

/// Admin and startup apps, and tests.
impl App for axum::Router {
    fn call(&self, req: Request) -> impl Future<Output = Response> + Send + use<> {
        use tower::ServiceExt;
        let answer = self.clone().oneshot(req);
        async move {
            match answer.await {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        }
    }
}

/// The protocol listener: stream routes on the hot path, the rest through its router.
impl App for pico_http::fast::Protocol {
    fn call(&self, req: Request) -> impl Future<Output = Response> + Send + use<> {
        pico_http::fast::Protocol::call(self, req)
    }
}

/// Listener settings.
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    /// HTTP/2 streams one connection may have open at once.
    pub http2_max_streams: u32,
}

/// Longest wait for a request's headers on an HTTP/1.1 connection, and for the first bytes
/// (the protocol) of any connection.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest wait for the next chunk of a request body a handler is reading.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Least average rate of a request body once [`BODY_RATE_GRACE`] has passed (see
/// [`BodyLimits`]).
pub const BODY_MIN_RATE: u64 = 1024;

/// How long a request body may arrive at any pace before [`BODY_MIN_RATE`] applies.
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(10);

/// Longest a whole request body may take, whatever its rate.
pub const BODY_DEADLINE: Duration = Duration::from_secs(300);

/// Longest a response may wait for a client that takes none of it: a write to a full socket,
/// or an HTTP/2 stream's frame waiting for its flow-control window. Generous, as a client on a
/// slow or briefly lost link still takes something within it.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// TCP keepalive on accepted sockets: first probe after this much silence, then one every
/// [`KEEPALIVE_INTERVAL`], the connection reset after [`KEEPALIVE_RETRIES`] unanswered: a peer
/// gone without a FIN is noticed within about two minutes.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 6;

/// The listener's timers. A parameter of [`serve`] rather than fields of [`ListenOptions`],
/// which code outside this crate builds field by field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// The wait for the protocol and for each HTTP/1.1 request's headers.
    pub header_read: Duration,
    /// The wait for each chunk of a request body being read (then 408).
    pub body_idle: Duration,
    /// A request body's least average rate in bytes/s after `body_rate_grace` (0: none).
    pub body_min_rate: u64,
    pub body_rate_grace: Duration,
    /// Longest a whole request body may take.
    pub body_deadline: Duration,
    /// How long responses may wait for a client that takes none of their bytes.
    pub stall: Duration,
}

impl Timeouts {
    pub fn body_limits(&self) -> BodyLimits {
        BodyLimits {
            idle: self.body_idle,
            min_rate: self.body_min_rate,
            rate_grace: self.body_rate_grace,
            deadline: self.body_deadline,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: HEADER_READ_TIMEOUT,
            body_idle: BODY_IDLE_TIMEOUT,
            body_min_rate: BODY_MIN_RATE,
            body_rate_grace: BODY_RATE_GRACE,
            body_deadline: BODY_DEADLINE,
            stall: STALL_LIMIT,
        }
    }
}

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
/// HTTP/1.1 has no header read timer: [`HeadWait`] around the socket bounds that wait.
pub fn builder(opts: ListenOptions, exec: ConnExec) -> Builder<ConnExec> {
    let mut b = Builder::new(exec);
    b.http1().header_read_timeout(None);
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
/// `timeouts` are [`Timeouts::default`] in production; tests shorten them. `hosts` are the
/// `Host` values it answers ([`HostPolicy::for_listener`]).
pub async fn serve<A: App>(
    listener: TcpListener,
    app: A,
    opts: ListenOptions,
    timeouts: Timeouts,
    hosts: HostPolicy,
    mut stop: watch::Receiver<bool>,
) {
    let edge = Arc::new(Edge {
        body: timeouts.body_limits(),
        hosts,
    });
    let drain = Drain::default();
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
        tune(&tcp);
        let (tcp, lender) = direct::split(tcp);
        let exchanges = Arc::new(Exchanges::default());
        let svc = {
            let (app, edge, exchanges) = (app.clone(), edge.clone(), exchanges.clone());
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                // HTTP/1.1: no wait for a request counts until this answer has been sent.
                let exchange = (req.version() < Version::HTTP_2).then(|| exchanges.begin());
                let lend = lends(&req).then(|| lender.out());
                let method = req.method().clone();
                let admitted =
                    guard::admit(&edge, req).map(|(req, passed)| (app.call(req), passed));
                async move {
                    let mut resp = match admitted {
                        Ok((answer, passed)) => passed.settle(answer.await),
                        Err(refused) => axum::response::IntoResponse::into_response(refused),
                    };
                    seal(&mut resp, &method);
                    if let (Some(out), Some(offer)) = (lend, resp.extensions().get::<DirectOffer>())
                    {
                        offer.fill(out);
                    }
                    Ok::<_, Infallible>(resp.map(|b| Tracked::new(b, exchange)))
                }
            })
        };
        // An executor per connection, so its HTTP/2 streams run in its own task.
        let exec = ConnExec::new(timeouts.stall);
        let io = Coalesce::new(HeadWait::new(
            WriteStall::new(tcp, timeouts.stall),
            timeouts.header_read,
            exchanges,
        ));
        let conn = builder(opts, exec.clone())
            .serve_connection_with_upgrades(TokioIo::new(io), svc)
            .into_owned();
        let mut watch = drain.watch();
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let conn = std::future::poll_fn(move |cx| {
                if watch.stopping(cx) {
                    conn.as_mut().graceful_shutdown();
                }
                conn.as_mut().poll(cx)
            });
            if let Err(e) = exec.drive(conn).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    drain.shutdown().await;
}

/// Whether `req`'s answer may be a live response that lends its connection to a hub
/// ([`direct`]): an HTTP/1.1 `GET` (its body goes out chunked) asking for SSE. A cheap test,
/// so no other request pays for the offer.
fn lends<B>(req: &hyper::Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.method() == axum::http::Method::GET
        && req.uri().query().is_some_and(|q| q.contains("live=sse"))
}

/// Socket options for an accepted connection (failures only cost the option: logged, not fatal).
fn tune(tcp: &TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set");
    }
    let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "macos",
        target_os = "freebsd",
        target_os = "windows"
    ))]
    let keepalive = keepalive
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "TCP keepalive not set");
    }
}

/// A connection whose writes fail with `TimedOut` once they have waited on a full socket for
/// the stall limit without a byte going out: the client stopped reading. hyper then drops the
/// connection, and with it the responses (and subscriptions) it was serving. Any progress, even
/// one byte, restarts the clock.
#[derive(Debug)]
pub struct WriteStall<T> {
    inner: T,
    limit: Duration,
    timer: WaitTimer,
}

impl<T> WriteStall<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        WriteStall {
            inner,
            limit,
            timer: WaitTimer::default(),
        }
    }

    /// Passes a write's outcome through, failing it once it has been stalled for the limit.
    fn watch<R>(&mut self, cx: &mut Context<'_>, out: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if out.is_ready() {
            self.timer.stop();
            return out;
        }
        if self.timer.expired(cx, self.limit) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("client took no response data for {:?}", self.limit),
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteStall<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteStall<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let out = Pin::new(&mut this.inner).poll_write(cx, data);
        this.watch(cx, out)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let out = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, out)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let out = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, out)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let out = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(cx, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Far above the 200 ms under test, so a loaded machine does not fail it.
    const CLOSE_WITHIN: Duration = Duration::from_secs(10);

    /// Serves an app that answers 200 with a 200 ms protocol timeout; returns its address.
    async fn server() -> (std::net::SocketAddr, watch::Sender<bool>) {
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let timeouts = Timeouts {
            header_read: Duration::from_millis(200),
            ..Timeouts::default()
        };
        serve_app(app, timeouts).await
    }

    async fn serve_app(
        app: axum::Router,
        timeouts: Timeouts,
    ) -> (std::net::SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let opts = ListenOptions {
            http2_max_streams: 16,
        };
        let hosts = HostPolicy::for_listener(addr, &[]);
        tokio::spawn(serve(listener, app, opts, timeouts, hosts, stop_rx));
        (addr, stop_tx)
    }

    /// Sends `request`, then reads until the server closes the connection; `None` if it was
    /// still open after [`CLOSE_WITHIN`].
    async fn answer_then_close(
        addr: std::net::SocketAddr,
        request: &'static [u8],
    ) -> Option<String> {
        tokio::task::spawn_blocking(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(request).unwrap();
            c.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            loop {
                match c.read(&mut buf) {
                    Ok(0) => return Some(String::from_utf8_lossy(&got).into_owned()),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(_) => return None,
                }
            }
        })
        .await
        .unwrap()
    }

    /// Sets its flag when dropped: shows that a response body was let go.
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A route whose response never ends (64 KiB chunks as fast as they are taken); `dropped`
    /// turns true when the body is dropped.
    fn flood(dropped: Arc<AtomicBool>) -> axum::routing::MethodRouter {
        axum::routing::get(move || {
            let guard = DropFlag(dropped.clone());
            let chunk = axum::body::Bytes::from(vec![b'x'; 64 * 1024]);
            let body = futures::stream::repeat(chunk).map(move |c| {
                let _ = &guard;
                Ok::<_, std::convert::Infallible>(c)
            });
            async move { axum::body::Body::from_stream(body) }
        })
    }

    /// Waits up to [`CLOSE_WITHIN`] for `flag` to turn true.
    async fn turns_true(flag: &AtomicBool) -> bool {
        let deadline = std::time::Instant::now() + CLOSE_WITHIN;
        while std::time::Instant::now() < deadline {
            if flag.load(Ordering::SeqCst) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
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

    /// Reads from `c` until what came ends with `end`; `None` if the connection closed first.
    fn read_until(c: &mut TcpStream, end: &[u8]) -> Option<Vec<u8>> {
        c.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(end) {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        Some(got)
    }

    /// Whether the server closes `c` within [`CLOSE_WITHIN`] (an answer before that is fine).
    fn closed(c: &mut TcpStream) -> bool {
        c.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
        let mut buf = [0u8; 1024];
        loop {
            match c.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) => {
                    return !matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    );
                }
            }
        }
    }

    /// A kept-alive HTTP/1.1 connection is served as long as each request comes within the
    /// limit of the previous answer (here three, 120 ms apart, outlast the 200 ms limit), and
    /// closed once its client sends nothing more. hyper's own header timer is off, so this is
    /// the listener's deadline ([`HeadWait`]).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_alive_connection_that_sends_nothing_more_is_closed() {
        let (addr, _stop) = server().await;
        tokio::task::spawn_blocking(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            for i in 0..3 {
                if i > 0 {
                    std::thread::sleep(Duration::from_millis(120));
                }
                c.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n")
                    .unwrap();
                let got = read_until(&mut c, b"ok").expect("closed while in use");
                assert!(got.starts_with(b"HTTP/1.1 200"), "request {i}");
            }
            let idle = std::time::Instant::now();
            assert!(closed(&mut c), "an idle kept-alive connection stayed open");
            // Not before the limit (less a margin for the answer's trip).
            assert!(
                idle.elapsed() >= Duration::from_millis(150),
                "{:?}",
                idle.elapsed()
            );
        })
        .await
        .unwrap();
    }

    /// A head trickled in a byte at a time, each byte well within the limit, is cut off: the
    /// limit bounds the whole wait for a request, not the gap between its bytes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trickled_head_is_cut_off() {
        let (addr, _stop) = server().await;
        let got = trickle(
            addr,
            "GET / HTTP/1.1\r\nhost: localhost\r\nx-pad: ".into(),
            Duration::from_millis(40),
            250,
        )
        .await
        .expect("a trickled head kept its connection open");
        assert!(got.is_empty(), "{got}");
    }

    /// A response that takes longer than the limit to start, and one that then waits longer
    /// than it between chunks (a long-poll, an SSE answer), are not cut while their client,
    /// as it should, sends nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_response_slower_than_the_limit_is_not_cut() {
        let app = axum::Router::new()
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    "ok"
                }),
            )
            .route(
                "/events",
                axum::routing::get(|| async {
                    let chunks = futures::stream::iter(0..3).then(|i| async move {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Ok::<_, Infallible>(axum::body::Bytes::from(format!("event {i}\n")))
                    });
                    axum::body::Body::from_stream(chunks)
                }),
            );
        let timeouts = Timeouts {
            header_read: Duration::from_millis(200),
            ..Timeouts::default()
        };
        let (addr, _stop) = serve_app(app, timeouts).await;
        tokio::task::spawn_blocking(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(b"GET /slow HTTP/1.1\r\nhost: localhost\r\n\r\n")
                .unwrap();
            let got = read_until(&mut c, b"ok").expect("a slow answer was cut");
            assert!(got.starts_with(b"HTTP/1.1 200"));
            c.write_all(b"GET /events HTTP/1.1\r\nhost: localhost\r\n\r\n")
                .unwrap();
            let got = read_until(&mut c, b"0\r\n\r\n").expect("a quiet stream was cut");
            let got = String::from_utf8_lossy(&got);
            assert!(got.contains("event 0") && got.contains("event 2"), "{got}");
        })
        .await
        .unwrap();
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

    /// A client that declares a body and stops sending it is answered 408 and its connection
    /// closed, both when the handler reads the body with `read_body` and through the `Bytes`
    /// extractor; a slow but steady body still goes through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_body_that_stops_arriving_is_answered_408() {
        let app = axum::Router::new()
            .route(
                "/bytes",
                axum::routing::post(|b: axum::body::Bytes| async move { b.len().to_string() }),
            )
            .route(
                "/read",
                axum::routing::post(|h: axum::http::HeaderMap, b: axum::body::Body| async move {
                    pico_http::pico::read_body(&h, b, 1 << 20)
                        .await
                        .map(|b| b.len().to_string())
                }),
            );
        let timeouts = Timeouts {
            body_idle: Duration::from_millis(200),
            ..Timeouts::default()
        };
        let (addr, _stop) = serve_app(app.clone(), timeouts).await;
        for path in ["/bytes", "/read"] {
            let req: &'static [u8] = if path == "/bytes" {
                b"POST /bytes HTTP/1.1\r\nhost: localhost\r\ncontent-length: 10\r\n\r\nab"
            } else {
                b"POST /read HTTP/1.1\r\nhost: localhost\r\ncontent-length: 10\r\n\r\nab"
            };
            let got = answer_then_close(addr, req)
                .await
                .unwrap_or_else(|| panic!("{path}: connection kept open"));
            assert!(got.starts_with("HTTP/1.1 408"), "{path}: {got}");
            assert!(got.contains("no data arrived"), "{path}: {got}");
        }

        // The timer restarts with every chunk: 4 gaps of 500 ms outlast a 1.5 s timer.
        let timeouts = Timeouts {
            body_idle: Duration::from_millis(1500),
            ..Timeouts::default()
        };
        let (addr, _stop) = serve_app(app, timeouts).await;
        let got = tokio::task::spawn_blocking(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(b"POST /read HTTP/1.1\r\nhost: localhost\r\ncontent-length: 5\r\n\r\n")
                .unwrap();
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(500));
                // A refused write (the server gave up) shows in the answer below.
                if c.write_all(b"x").is_err() {
                    break;
                }
            }
            c.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
            let mut buf = [0u8; 1024];
            match c.read(&mut buf) {
                Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
                Err(e) => format!("read failed: {e}"),
            }
        })
        .await
        .unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.ends_with("\r\n\r\n5"), "{got}");
    }

    /// An HTTP/1.1 client that stops reading a response: once the socket is full and nothing
    /// goes out for the stall limit, the connection is dropped, and the response body with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_stops_reading_loses_its_connection() {
        let dropped = Arc::new(AtomicBool::new(false));
        let app = axum::Router::new().route("/flood", flood(dropped.clone()));
        let timeouts = Timeouts {
            stall: Duration::from_millis(300),
            ..Timeouts::default()
        };
        let (addr, _stop) = serve_app(app, timeouts).await;
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /flood HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .unwrap();
        assert!(turns_true(&dropped).await, "response to a non-reader kept");
        drop(c);
    }

    /// An HTTP/2 client that keeps its connection alive (its connection task reads the socket
    /// and answers pings) but never reads one response, so that stream's window stays shut:
    /// the stream is dropped after the stall limit, and the connection serves on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_http2_stream_whose_window_stays_shut_is_dropped() {
        let dropped = Arc::new(AtomicBool::new(false));
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route("/flood", flood(dropped.clone()));
        let timeouts = Timeouts {
            stall: Duration::from_millis(300),
            ..Timeouts::default()
        };
        let (addr, _stop) = serve_app(app, timeouts).await;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tcp),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let req = |path: &str| {
            hyper::Request::get(format!("http://localhost{path}"))
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let stuck = tokio::time::timeout(CLOSE_WITHIN, send.send_request(req("/flood")))
            .await
            .expect("no answer")
            .unwrap();
        assert_eq!(stuck.status(), 200);
        assert!(turns_true(&dropped).await, "stalled stream kept");
        let res = tokio::time::timeout(CLOSE_WITHIN, send.send_request(req("/")))
            .await
            .expect("no answer")
            .unwrap();
        assert_eq!(res.status(), 200);
        drop(stuck);
    }

    /// An app whose `/read` reads the whole body (up to 16 MiB) and answers its length.
    fn reader() -> axum::Router {
        axum::Router::new().route(
            "/read",
            axum::routing::post(|h: axum::http::HeaderMap, b: axum::body::Body| async move {
                pico_http::pico::read_body(&h, b, 16 << 20)
                    .await
                    .map(|b| b.len().to_string())
            }),
        )
    }

    /// Sends `head`, then one body byte every `every` (at most `bytes`), and returns what the
    /// server answered once it closed the connection: `None` if it was still open after
    /// [`CLOSE_WITHIN`].
    async fn trickle(
        addr: std::net::SocketAddr,
        head: String,
        every: Duration,
        bytes: usize,
    ) -> Option<String> {
        tokio::task::spawn_blocking(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(head.as_bytes()).unwrap();
            let mut w = c.try_clone().unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let writer = {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    for _ in 0..bytes {
                        std::thread::sleep(every);
                        if stop.load(Ordering::SeqCst) || w.write_all(b"x").is_err() {
                            break;
                        }
                    }
                })
            };
            c.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            let answer = loop {
                match c.read(&mut buf) {
                    Ok(0) => break Some(String::from_utf8_lossy(&got).into_owned()),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        break Some(String::from_utf8_lossy(&got).into_owned());
                    }
                    Err(_) => break None,
                }
            };
            stop.store(true, Ordering::SeqCst);
            writer.join().unwrap();
            answer
        })
        .await
        .unwrap()
    }

    /// The slow body: a declared large body sent a byte at a time, each byte well
    /// within the idle timer, used to be held for as long as the client liked. Past its grace
    /// it must keep the minimum rate; a fast upload of several MiB is untouched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trickling_body_is_cut_off_and_a_fast_one_is_not() {
        let timeouts = Timeouts {
            body_min_rate: 1000,
            body_rate_grace: Duration::from_millis(300),
            ..Timeouts::default()
        };
        let (addr, _stop) = serve_app(reader(), timeouts).await;
        let head = "POST /read HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000000\r\n\r\n";
        // 20 bytes a second, for up to 20 s.
        let got = trickle(addr, head.into(), Duration::from_millis(50), 400)
            .await
            .expect("a trickling body kept its connection open");
        assert!(got.starts_with("HTTP/1.1 408"), "{got}");
        assert!(got.contains("too slow"), "{got}");
        assert!(got.contains("below the minimum of 1000 bytes/s"), "{got}");

        let len = 8 << 20;
        let got = tokio::task::spawn_blocking(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            let head =
                format!("POST /read HTTP/1.1\r\nhost: localhost\r\ncontent-length: {len}\r\n\r\n");
            c.write_all(head.as_bytes()).unwrap();
            c.write_all(&vec![b'x'; len]).unwrap();
            c.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
            let mut buf = [0u8; 1024];
            let n = c.read(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        })
        .await
        .unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.ends_with(&format!("\r\n\r\n{len}")), "{got}");
    }

    /// A body that keeps a good rate but is still arriving at the deadline is cut off too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_still_arriving_at_its_deadline_is_cut_off() {
        let timeouts = Timeouts {
            body_min_rate: 0,
            body_deadline: Duration::from_millis(500),
            ..Timeouts::default()
        };
        let (addr, _stop) = serve_app(reader(), timeouts).await;
        let head = "POST /read HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000\r\n\r\n";
        let got = trickle(addr, head.into(), Duration::from_millis(20), 1000)
            .await
            .expect("a body past its deadline kept its connection open");
        assert!(got.starts_with("HTTP/1.1 408"), "{got}");
        assert!(got.contains("not complete after 0.5s"), "{got}");
    }

    /// hyper undoes `chunked` only: a gzip transfer coding, or a gzip content coding, would be
    /// stored still compressed as if it were the body. Both are refused before it is read.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn codings_that_would_be_stored_undecoded_are_refused() {
        let (addr, _stop) = serve_app(reader(), Timeouts::default()).await;
        let got = answer_then_close(
            addr,
            b"POST /read HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        )
        .await
        .expect("connection kept open");
        assert!(got.starts_with("HTTP/1.1 400"), "{got}");
        assert!(
            got.contains("Transfer-Encoding `gzip, chunked` is not supported"),
            "{got}"
        );
        let got = answer_then_close(
            addr,
            b"POST /read HTTP/1.1\r\nhost: localhost\r\ncontent-encoding: gzip\r\ncontent-length: 3\r\n\r\nabc",
        )
        .await
        .expect("connection kept open");
        assert!(got.starts_with("HTTP/1.1 415"), "{got}");
        assert!(
            got.contains("Content-Encoding `gzip` is not supported"),
            "{got}"
        );
        // Plain chunking and the identity coding are fine.
        for req in [
            &b"POST /read HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n"[..],
            &b"POST /read HTTP/1.1\r\nhost: localhost\r\ncontent-encoding: identity\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc"[..],
        ] {
            let got = answer_then_close(addr, req).await.expect("connection kept open");
            assert!(got.starts_with("HTTP/1.1 200"), "{got}");
            assert!(got.ends_with("\r\n\r\n3"), "{got}");
        }
    }

    /// A loopback listener answers loopback names only (DNS rebinding), over HTTP/1.1 and
    /// HTTP/2; an HTTP/1.1 request without a Host is a 400.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_loopback_listener_refuses_foreign_hosts() {
        let (addr, _stop) = server().await;
        let got = answer_then_close(
            addr,
            b"GET / HTTP/1.1\r\nhost: evil.example:4437\r\nconnection: close\r\n\r\n",
        )
        .await
        .expect("connection kept open");
        assert!(got.starts_with("HTTP/1.1 421"), "{got}");
        assert!(got.contains("misdirected_request"), "{got}");
        let got = answer_then_close(addr, b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n")
            .await
            .expect("connection kept open");
        assert!(got.starts_with("HTTP/1.1 400"), "{got}");
        assert!(got.contains("needs a Host header"), "{got}");
        let got = answer_then_close(
            addr,
            b"GET / HTTP/1.1\r\nhost: 127.0.0.1:4437\r\nconnection: close\r\n\r\n",
        )
        .await
        .expect("connection kept open");
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");

        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tcp),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        for (uri, status) in [("http://evil.example/", 421), ("http://localhost:1/", 200)] {
            let req = hyper::Request::get(uri)
                .body(axum::body::Body::empty())
                .unwrap();
            let res = tokio::time::timeout(CLOSE_WITHIN, send.send_request(req))
                .await
                .expect("no answer")
                .unwrap();
            assert_eq!(res.status(), status, "{uri}");
        }
    }

    #[tokio::test]
    async fn accepted_sockets_get_tcp_keepalive() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        tune(&tcp);
        let sock = socket2::SockRef::from(&tcp);
        assert!(sock.keepalive().unwrap(), "SO_KEEPALIVE off");
        assert!(tcp.nodelay().unwrap());
        #[cfg(target_os = "linux")]
        {
            assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
            assert_eq!(sock.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
            assert_eq!(sock.tcp_keepalive_retries().unwrap(), KEEPALIVE_RETRIES);
        }
    }
}
