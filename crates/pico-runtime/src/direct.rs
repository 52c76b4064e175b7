//! The bottom of a connection's IO: the accepted socket, shared so that a live stream's hub
//! can write a caught-up HTTP/1.1 SSE subscriber's events to it directly ([`DirectOut`]),
//! without waking the connection's task or polling hyper once per subscriber per event.
//!
//! hyper writes through [`DirectIo`]; the hub through the connection's [`Lender`]. The
//! connection is in one of three modes:
//! - **hyper** (the start): only hyper writes;
//! - **lending**: the response body, with nothing to send, lent it (`lend`); hyper may still
//!   hold bytes of that body, so the hub's `send` is refused;
//! - **lent**: hyper flushed, and hyper calls its IO's `poll_flush` only once everything it
//!   buffered is on the socket, so it holds nothing: the hub writes. The body takes the
//!   connection back (`reclaim`) before it gives hyper anything again.
//!
//! Invariants:
//! - **Bytes leave in order.** The hub writes only while lent, each `send` whole chunks; what
//!   a write does not take waits in `pending` (the hub then writes nothing more to the socket
//!   until it is drained, only appends), and every later hyper write and flush drains
//!   `pending` first. A connection is lent only with `pending` empty, so nothing the hub
//!   writes can overtake bytes hyper still holds.
//! - **Bounded.** `pending` holds at most [`PENDING_MAX`] bytes beyond one partly written
//!   chunk; a `send` that does not fit is refused (nothing of it taken), and its subscriber
//!   sends it through hyper after taking the connection back, so a client that stops reading
//!   ends up under [`WriteStall`](crate::listener::WriteStall)'s limit as before. The
//!   connection's task drains `pending` from its flushes (hyper flushes on each turn, and the
//!   hub wakes the task when it leaves bytes), under that same stall limit.
//! - **Free when unused.** A connection that never lent (every append, every HTTP/2
//!   connection) only reads one atomic flag per write; the lock is taken once it has lent.

use hyper::body::{Buf, Bytes};
use pico_server::live::hub::DirectOut;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Bytes the hub may leave waiting on one connection (as the HTTP/2 coalescer's buffer).
pub const PENDING_MAX: usize = 256 * 1024;

/// Chunks handed to one vectored write when draining.
const DRAIN_IOVS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Hyper,
    Lending,
    Lent,
}

struct State {
    mode: Mode,
    /// Bytes written through the hub that the socket did not take yet, oldest first.
    pending: VecDeque<Bytes>,
    pending_len: usize,
    /// The connection's task, woken to drain `pending`.
    waker: Option<Waker>,
    /// A write through the hub failed: the socket is gone; hyper's next write finds out.
    failed: bool,
}

/// What the connection's IO and its lender share.
pub struct Shared {
    write: OwnedWriteHalf,
    /// Set once the connection has lent: until then writes skip the lock.
    engaged: AtomicBool,
    state: Mutex<State>,
}

/// The connection as hyper sees it.
pub struct DirectIo {
    read: OwnedReadHalf,
    shared: Arc<Shared>,
}

/// The connection as its live responses lend it to their hub.
#[derive(Clone)]
pub struct Lender(Arc<Shared>);

impl Lender {
    pub fn out(&self) -> Arc<dyn DirectOut> {
        Arc::new(self.clone())
    }
}

/// Splits an accepted socket into hyper's IO and the lender.
pub fn split(tcp: TcpStream) -> (DirectIo, Lender) {
    let (read, write) = tcp.into_split();
    let shared = Arc::new(Shared {
        write,
        engaged: AtomicBool::new(false),
        state: Mutex::new(State {
            mode: Mode::Hyper,
            pending: VecDeque::new(),
            pending_len: 0,
            waker: None,
            failed: false,
        }),
    });
    (
        DirectIo {
            read,
            shared: shared.clone(),
        },
        Lender(shared),
    )
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn tcp(&self) -> &TcpStream {
        self.write.as_ref()
    }

    /// Runs the write `f` once the socket is writable; `Pending` registers `cx` for that.
    fn poll_io(
        &self,
        cx: &mut Context<'_>,
        mut f: impl FnMut(&TcpStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.tcp().poll_write_ready(cx))?;
            match f(self.tcp()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    /// Writes out `pending` (from the connection's task).
    fn poll_drain(&self, st: &mut State, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while st.pending_len > 0 {
            let mut iovs = [IoSlice::new(&[]); DRAIN_IOVS];
            let k = st.pending.len().min(DRAIN_IOVS);
            for (iov, b) in iovs.iter_mut().zip(&st.pending) {
                *iov = IoSlice::new(b);
            }
            let n = match ready!(self.poll_io(cx, |t| t.try_write_vectored(&iovs[..k]))) {
                Ok(0) => Err(io::ErrorKind::WriteZero.into()),
                r => r,
            };
            let n = match n {
                Ok(n) => n,
                Err(e) => {
                    st.failed = true;
                    return Poll::Ready(Err(e));
                }
            };
            st.pending_len -= n;
            let mut left = n;
            while left > 0 {
                let Some(front) = st.pending.front_mut() else {
                    break;
                };
                if front.len() > left {
                    front.advance(left);
                    break;
                }
                left -= front.len();
                st.pending.pop_front();
            }
        }
        Poll::Ready(Ok(()))
    }

    /// A hyper write: after `pending` once the connection has lent.
    fn poll_hyper_write(
        &self,
        cx: &mut Context<'_>,
        f: impl FnMut(&TcpStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        if !self.engaged.load(Ordering::Acquire) {
            return self.poll_io(cx, f);
        }
        let mut st = lock(&self.state);
        ready!(self.poll_drain(&mut st, cx))?;
        self.poll_io(cx, f)
    }

    fn push(&self, st: &mut State, b: Bytes) {
        st.pending_len += b.len();
        st.pending.push_back(b);
    }
}

impl AsyncRead for DirectIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().read).poll_read(cx, buf)
    }
}

impl AsyncWrite for DirectIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.shared.poll_hyper_write(cx, |t| t.try_write(data))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.shared
            .poll_hyper_write(cx, |t| t.try_write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// hyper flushes only after writing out everything it buffered: a connection lent since
    /// its last flush becomes the hub's here.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let sh = &self.shared;
        if !sh.engaged.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        let mut st = lock(&sh.state);
        if st.mode == Mode::Lending {
            st.mode = Mode::Lent;
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        sh.poll_drain(&mut st, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.as_mut().poll_flush(cx))?;
        Poll::Ready(socket2::SockRef::from(self.shared.tcp()).shutdown(std::net::Shutdown::Write))
    }
}

impl DirectOut for Lender {
    fn lend(&self) -> bool {
        let mut st = lock(&self.0.state);
        if st.failed || st.mode != Mode::Hyper || st.pending_len > 0 {
            return false;
        }
        st.mode = Mode::Lending;
        self.0.engaged.store(true, Ordering::Release);
        true
    }

    fn send(&self, wire: &Bytes) -> bool {
        let sh = &self.0;
        let mut st = lock(&sh.state);
        if st.mode != Mode::Lent || st.failed {
            return false;
        }
        if st.pending_len > 0 {
            // The task is already draining (woken when the first bytes were left).
            if st.pending_len + wire.len() > PENDING_MAX {
                return false;
            }
            sh.push(&mut st, wire.clone());
            return true;
        }
        let rest = match sh.tcp().try_write(wire) {
            Ok(n) if n == wire.len() => return true,
            Ok(n) => wire.slice(n..),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if wire.len() > PENDING_MAX {
                    return false;
                }
                wire.clone()
            }
            Err(e) => {
                tracing::debug!(error = %e, "direct write to a live subscriber failed");
                st.failed = true;
                return false;
            }
        };
        sh.push(&mut st, rest);
        if let Some(w) = &st.waker {
            w.wake_by_ref();
        }
        true
    }

    fn reclaim(&self) {
        lock(&self.0.state).mode = Mode::Hyper;
    }
}
