//! The wait for a request, bounded per connection rather than by a timer per request.
//!
//! A client that opens a connection and sends nothing, half a request head, or nothing more
//! after a kept-alive exchange, would hold its socket and task for good. hyper's HTTP/1.1
//! `header_read_timeout` bounds that, but allocates, registers and drops a timer for every
//! request head (and forces one more read after each head to start it): a per-request cost a
//! busy connection pays for a deadline that never fires. [`HeadWait`] keeps the same bound with
//! one sleep per connection:
//! - a wait starts when the connection opens or the previous response ends (its body is
//!   dropped). It ends when the next request reaches the service ([`Exchanges::begin`]). Bytes arriving in between do not
//!   restart it, so a head trickled in a byte at a time is cut at the same bound as silence;
//! - while a request is served (from `begin` until its response body is dropped, see
//!   [`Tracked`]) nothing counts: an SSE or long-poll answer whose client sends nothing is
//!   never cut here (the write-stall limit and the request body's timers bound those);
//! - once the whole HTTP/2 preface is in, it is off: HTTP/2 pings a quiet connection instead.
//!
//! Cost per request: two atomic increments and a clock read (when the response ends); a read
//! that finds nothing checks the connection's sleep for having fired (a flag load) and polls it
//! only if it has, or if the connection is polled with another waker. The sleep stays armed from the
//! first such read: at most a limit ahead while a request is served, at the current wait's
//! deadline otherwise, and it is moved only when it fires (at most once per limit). Armed even
//! while serving because hyper, having found the socket empty then, reads again only once the
//! socket is readable: the wait that starts when the response ends must wake it by itself.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
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
#[derive(Debug)]
pub struct Exchanges {
    begun: AtomicU64,
    ended: AtomicU64,
    /// When the last exchange ended, in nanoseconds after `start`.
    last_end: AtomicU64,
    start: Instant,
}

impl Default for Exchanges {
    fn default() -> Self {
        Exchanges::new()
    }
}

impl Exchanges {
    /// Starts the clock for the first request (needs a Tokio runtime).
    pub fn new() -> Self {
        Exchanges {
            begun: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    /// A request reached the service: no wait counts until the returned guard is dropped
    /// (with the response body, see [`Tracked`]).
    pub fn begin(self: &Arc<Self>) -> Exchange {
        self.begun.fetch_add(1, Ordering::Release);
        Exchange(self.clone())
    }

    /// When the current wait for a request started; `None` while one is being served.
    fn idle_since(&self) -> Option<Instant> {
        let begun = self.begun.load(Ordering::Acquire);
        if self.ended.load(Ordering::Acquire) != begun {
            return None;
        }
        Some(self.start + Duration::from_nanos(self.last_end.load(Ordering::Acquire)))
    }
}

/// A request being served; dropping it ends the exchange.
#[derive(Debug)]
pub struct Exchange(Arc<Exchanges>);

impl Drop for Exchange {
    fn drop(&mut self) {
        // The next wait starts now, whether or not a read sees it start (hyper may have found
        // the socket empty while serving, and then reads again only once it is readable).
        let since = u64::try_from(self.0.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.last_end.store(since, Ordering::Release);
        self.0.ended.fetch_add(1, Ordering::Release);
    }
}

/// The body of every response the listener sends: it ends its [`Exchange`] when hyper drops
/// it (once it has been sent, or with the connection), and, for an HTTP/2 response that
/// streams, reports each poll to the stream's watchdog ([`crate::conn_exec::body_polled`]).
/// One wrapper for both, so a response body gets one layer, not two.
#[derive(Debug)]
pub struct Tracked<B> {
    body: B,
    _exchange: Option<Exchange>,
    watched: bool,
}

impl<B: Body> Tracked<B> {
    /// `exchange` is `None` where no wait is counted (HTTP/2), and there a body that is not
    /// already at its end is watched.
    pub fn new(body: B, exchange: Option<Exchange>) -> Self {
        Tracked {
            watched: exchange.is_none() && !body.is_end_stream(),
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
        let this = self.get_mut();
        let out = Pin::new(&mut this.body).poll_frame(cx);
        if this.watched {
            crate::conn_exec::body_polled(matches!(out, Poll::Ready(Some(Ok(_)))));
        }
        out
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
    /// Armed from the first read that finds nothing, and kept armed: at most `limit` ahead
    /// while a request is served, at most the current wait's deadline while none is.
    sleep: Option<Pin<Box<Sleep>>>,
    /// The waker `sleep` was last polled with. While the sleep has not fired, polling it again
    /// with the same waker would only register that waker again: reads that find nothing skip
    /// it then (a flag load and a pointer compare instead of a timer poll).
    polled_with: Option<Waker>,
    /// Bytes read so far that match the HTTP/2 preface, until the protocol is known.
    sniffed: Option<usize>,
    /// HTTP/2: no deadline.
    off: bool,
}

impl<T> HeadWait<T> {
    /// `exchanges` is shared with the connection's service.
    pub fn new(inner: T, limit: Duration, exchanges: Arc<Exchanges>) -> Self {
        HeadWait {
            inner,
            limit,
            exchanges,
            sleep: None,
            polled_with: None,
            sniffed: Some(0),
            off: false,
        }
    }

    /// The latest the sleep may fire: the current wait's deadline, or a limit from now while
    /// a request is served (then it looks again).
    fn next_look(&self) -> Instant {
        match self.exchanges.idle_since() {
            Some(since) => since + self.limit,
            None => Instant::now() + self.limit,
        }
    }

    /// Whether the current wait for a request has lasted the limit; keeps the sleep armed so
    /// that the connection is polled (and this asked) again by then. A read that finds
    /// nothing only polls the armed sleep: no clock read, no timer moved.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if let (Some(sleep), Some(waker)) = (&self.sleep, &self.polled_with)
            && !sleep.is_elapsed()
            && waker.will_wake(cx.waker())
        {
            return false;
        }
        if self.sleep.is_none() {
            let at = self.next_look();
            self.sleep = Some(Box::pin(tokio::time::sleep_until(at)));
        }
        let Some(sleep) = self.sleep.as_mut() else {
            return false;
        };
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                if !self
                    .polled_with
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
                {
                    self.polled_with = Some(cx.waker().clone());
                }
                return false;
            }
            let now = Instant::now();
            let at = match self.exchanges.idle_since() {
                Some(since) if since + self.limit <= now => return true,
                Some(since) => since + self.limit,
                None => now + self.limit,
            };
            sleep.as_mut().reset(at);
        }
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
                            this.polled_with = None;
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
        let fails = async {
            loop {
                match io.read(&mut buf).await {
                    Ok(0) => panic!("closed, not timed out"),
                    Ok(_) => {}
                    Err(e) => return e,
                }
            }
        };
        let e = tokio::time::timeout(LIMIT * 10, fails)
            .await
            .expect("still open after ten limits");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        start.elapsed()
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

    /// Sets its flag when woken.
    struct Flag(std::sync::atomic::AtomicBool);

    impl futures::task::ArcWake for Flag {
        fn wake_by_ref(f: &Arc<Self>) {
            f.0.store(true, Ordering::SeqCst);
        }
    }

    /// hyper may find the socket empty while a request is served and then not read again until
    /// it is readable: the wait that starts when the response ends must still wake the
    /// connection, and fail it at the limit from that end.
    #[tokio::test(start_paused = true)]
    async fn a_wait_no_read_sees_start_still_ends_the_connection() {
        let (mut io, _client, exchanges) = conn();
        let exchange = exchanges.begin();
        let flag = Arc::new(Flag(Default::default()));
        let waker = futures::task::waker(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut buf = [0u8; 8];
        let mut poll = |io: &mut HeadWait<DuplexStream>| {
            Pin::new(io).poll_read(&mut cx, &mut ReadBuf::new(&mut buf))
        };
        assert!(poll(&mut io).is_pending());
        tokio::time::sleep(LIMIT / 2).await;
        drop(exchange);
        let ended = Instant::now();
        tokio::time::sleep_until(ended + LIMIT - Duration::from_millis(1)).await;
        assert!(
            flag.0.swap(false, Ordering::SeqCst),
            "not woken while waiting"
        );
        assert!(poll(&mut io).is_pending(), "cut before the limit");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(flag.0.load(Ordering::SeqCst), "not woken at the limit");
        match poll(&mut io) {
            Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::TimedOut),
            other => panic!("{other:?}"),
        }
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
