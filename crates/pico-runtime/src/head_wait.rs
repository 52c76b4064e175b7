//! The wait for a request, bounded per connection rather than by a timer per request.
//!
//! A client that opens a connection and sends nothing, half a request head, or nothing more
//! after a kept-alive exchange, would hold its socket and task for good. hyper's HTTP/1.1
//! `header_read_timeout` bounds that, but allocates, registers and drops a timer for every
//! request head (and forces one more read after each head to start it): a per-request cost a
//! busy connection pays for a deadline that never fires. [`HeadWait`] keeps the same bound with
//! one sleep per connection:
//! - a wait starts at the first read that finds nothing while no request is being served: at
//!   the connection's start, or after the previous response ended. It ends when the next
//!   request reaches the service ([`Exchanges::begin`]). Bytes arriving in between do not
//!   restart it, so a head trickled in a byte at a time is cut at the same bound as silence;
//! - while a request is served (from `begin` until its response body is dropped, see
//!   [`Tracked`]) nothing counts: an SSE or long-poll answer whose client sends nothing is
//!   never cut here (the write-stall limit and the request body's timers bound those);
//! - once the whole HTTP/2 preface is in, it is off: HTTP/2 pings a quiet connection instead.
//!
//! Cost per request: two atomic increments, and when a wait starts a clock read and a poll of
//! the connection's sleep (already registered). The sleep is not moved when a wait ends; when it
//! fires for a wait that has since ended it is reset once to the current wait's deadline, so a
//! busy connection moves it at most once per limit.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::coalesce::{Sniff, sniff};

/// The HTTP/2 connection preface (RFC 9113 §3.4): hyper reads this many bytes, or up to the
/// first that differs, to choose the protocol.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Requests a connection's service has begun and responses it has ended; shared by the
/// connection's [`HeadWait`] and its service.
#[derive(Debug, Default)]
pub struct Exchanges {
    begun: AtomicU64,
    ended: AtomicU64,
}

impl Exchanges {
    /// A request reached the service: no wait counts until the returned guard is dropped
    /// (with the response body, see [`Tracked`]).
    pub fn begin(self: &Arc<Self>) -> Exchange {
        self.begun.fetch_add(1, Ordering::Release);
        Exchange(self.clone())
    }

    /// The number of requests begun, if none is being served now.
    fn idle(&self) -> Option<u64> {
        let begun = self.begun.load(Ordering::Acquire);
        (self.ended.load(Ordering::Acquire) == begun).then_some(begun)
    }
}

/// A request being served; dropping it ends the exchange.
#[derive(Debug)]
pub struct Exchange(Arc<Exchanges>);

impl Drop for Exchange {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::Release);
    }
}

/// A response body that ends its [`Exchange`] when hyper drops it: once it has been sent, or
/// with the connection.
#[derive(Debug)]
pub struct Tracked<B> {
    body: B,
    _exchange: Option<Exchange>,
}

impl<B> Tracked<B> {
    /// `exchange` is `None` where no wait is counted (HTTP/2).
    pub fn new(body: B, exchange: Option<Exchange>) -> Self {
        Tracked {
            body,
            _exchange: exchange,
        }
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection whose reads fail with `TimedOut` once it has waited `limit` for a request (see
/// the module docs).
#[derive(Debug)]
pub struct HeadWait<T> {
    inner: T,
    limit: Duration,
    exchanges: Arc<Exchanges>,
    /// The wait being counted: the requests begun when it started, and when.
    wait: (u64, Instant),
    /// Allocated at the first read that waits; its deadline may lag the current wait's.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Bytes read so far that match the HTTP/2 preface, until the protocol is known.
    sniffed: Option<usize>,
    /// HTTP/2: no deadline.
    off: bool,
}

impl<T> HeadWait<T> {
    /// Starts the clock for the first request (needs a Tokio runtime).
    pub fn new(inner: T, limit: Duration, exchanges: Arc<Exchanges>) -> Self {
        HeadWait {
            inner,
            limit,
            exchanges,
            wait: (0, Instant::now()),
            sleep: None,
            sniffed: Some(0),
            off: false,
        }
    }

    /// Whether the current wait for a request has lasted the limit; registers `cx` to be
    /// woken when it will have.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(begun) = self.exchanges.idle() else {
            return false;
        };
        if self.wait.0 != begun {
            self.wait = (begun, Instant::now());
        }
        let deadline = self.wait.1 + self.limit;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        while sleep.as_mut().poll(cx).is_ready() {
            if sleep.deadline() >= deadline {
                return true;
            }
            // Set for a wait that has ended since.
            sleep.as_mut().reset(deadline);
        }
        false
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for HeadWait<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let out = Pin::new(&mut this.inner).poll_read(cx, buf);
        if this.off {
            return out;
        }
        match out {
            Poll::Ready(Ok(())) => {
                if let Some(seen) = this.sniffed {
                    let got = &buf.filled()[before..];
                    match sniff(H2_PREFACE, seen, got) {
                        Sniff::More(seen) if !got.is_empty() => this.sniffed = Some(seen),
                        Sniff::Matched => {
                            this.off = true;
                            this.sleep = None;
                        }
                        // A byte off the preface (HTTP/1.1) or the end of the stream.
                        _ => this.sniffed = None,
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no request arrived within {:?}", this.limit),
            ))),
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for HeadWait<T> {
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    const LIMIT: Duration = Duration::from_secs(30);

    /// A connection under a [`HeadWait`] and its client's end.
    fn conn() -> (HeadWait<DuplexStream>, DuplexStream, Arc<Exchanges>) {
        let (server, client) = duplex(1024);
        let exchanges = Arc::new(Exchanges::default());
        (
            HeadWait::new(server, LIMIT, exchanges.clone()),
            client,
            exchanges,
        )
    }

    /// Reads until the read fails; how long after `start` it did (the clock is paused, so
    /// this is exact).
    async fn fails_after(io: &mut HeadWait<DuplexStream>, start: Instant) -> Duration {
        let mut buf = [0u8; 64];
        loop {
            let read = tokio::time::timeout(LIMIT * 10, io.read(&mut buf)).await;
            match read.expect("still waiting after ten limits") {
                Ok(0) => panic!("closed, not timed out"),
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
                    return start.elapsed();
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_fails_at_the_limit() {
        let (mut io, _client, _) = conn();
        assert_eq!(fails_after(&mut io, Instant::now()).await, LIMIT);
    }

    /// Bytes that arrive without completing a request do not restart the wait.
    #[tokio::test(start_paused = true)]
    async fn a_trickled_head_fails_at_the_limit_from_its_start() {
        let (mut io, mut client, _) = conn();
        let start = Instant::now();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LIMIT / 10).await;
                if client.write_all(b"G").await.is_err() {
                    break;
                }
            }
        });
        assert_eq!(fails_after(&mut io, start).await, LIMIT);
    }

    /// Nothing counts while a request is served, however long its client stays silent (a
    /// long-poll, an SSE answer); the next wait starts at the first read after it ended.
    #[tokio::test(start_paused = true)]
    async fn a_request_being_served_is_never_cut() {
        let (mut io, mut client, exchanges) = conn();
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        assert!(io.read(&mut buf).await.unwrap() > 0);
        let exchange = exchanges.begin();
        let body = Tracked::new(axum::body::Body::empty(), Some(exchange));
        // Ten limits of silence: the read is still waiting.
        let read = tokio::time::timeout(LIMIT * 10, io.read(&mut buf)).await;
        assert!(read.is_err(), "cut while serving: {read:?}");
        drop(body);
        let ended = Instant::now();
        assert_eq!(fails_after(&mut io, ended).await, LIMIT);
    }

    /// Each kept-alive wait is counted from its own start: requests that each come within the
    /// limit keep the connection, however long it lives.
    #[tokio::test(start_paused = true)]
    async fn each_wait_has_its_own_limit() {
        let (mut io, mut client, exchanges) = conn();
        let mut buf = [0u8; 64];
        for _ in 0..5 {
            tokio::time::sleep(LIMIT * 3 / 4).await;
            client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
            assert!(io.read(&mut buf).await.unwrap() > 0);
            drop(exchanges.begin());
            // The first read after the answer finds nothing: the next wait starts.
            let read = tokio::time::timeout(Duration::from_millis(1), io.read(&mut buf)).await;
            assert!(read.is_err(), "{read:?}");
        }
        let start = Instant::now() - Duration::from_millis(1);
        assert_eq!(fails_after(&mut io, start).await, LIMIT);
    }

    /// Once the HTTP/2 preface is in, the connection may stay quiet (HTTP/2 pings it instead).
    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_has_no_limit() {
        let (mut io, mut client, _) = conn();
        client.write_all(H2_PREFACE).await.unwrap();
        let mut buf = [0u8; 64];
        let mut got = 0;
        while got < H2_PREFACE.len() {
            got += io.read(&mut buf).await.unwrap();
        }
        let read = tokio::time::timeout(LIMIT * 10, io.read(&mut buf)).await;
        assert!(read.is_err(), "an HTTP/2 connection was cut: {read:?}");
        // Half a preface is no HTTP/2 yet.
        let (mut io, mut client, _) = conn();
        client.write_all(&H2_PREFACE[..10]).await.unwrap();
        assert_eq!(fails_after(&mut io, Instant::now()).await, LIMIT);
    }
}
