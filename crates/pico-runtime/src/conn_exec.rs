//! Runs an HTTP/2 connection's streams inside the connection's own task.
//!
//! hyper spawns every HTTP/2 stream (its handler and the piping of its response body) as a task
//! of its own. One append to 1000 SSE subscribers on two connections then wakes 1000 tasks,
//! which the workers run in any order while all of them lock the same connection's stream
//! table, whose cache lines travel between cores frame after frame. With [`ConnExec`] a
//! connection's streams are futures in one `FuturesUnordered`, polled by the task that polls
//! the connection: waking a stream costs no trip through the scheduler, and one thread at a
//! time touches a connection's state. A side effect is that the connection's writer
//! ([`Coalesce`](crate::coalesce)) yields to exactly the streams of its own connection.
//!
//! The price: the streams of one HTTP/2 connection share one thread, so one connection uses at
//! most one core at a time (as an HTTP/1.1 connection always did); many connections still
//! spread over all workers.
//!
//! Streams whose client stops taking their response are dropped. A client that keeps its
//! connection alive (it reads the socket, answers PINGs) but never opens a stream's flow-control
//! window leaves hyper waiting for send capacity forever: the body is no longer polled, so no
//! deadline inside it can fire, and the socket stays writable, so the connection's write-stall
//! timer ([`WriteStall`](crate::listener::WriteStall)) never starts either. Each stream therefore
//! runs under a watchdog: response bodies (through the listener's wrapper, [`body_polled`]) tell it, through a thread-local
//! set while the stream is polled, whether the body's last poll handed over a frame (hyper then
//! waits for capacity) or found nothing to send (the body waits on its source: an idle SSE or
//! long-poll answer, never a stall). A stream whose frame has waited for the client longer than
//! the stall limit, with no new frame taken in between, is dropped: h2 resets it, and its body
//! (buffers, subscriptions) goes with it.
//!
//! Invariants: [`ConnExec::drive`] returns only once the connection and every stream it
//! spawned have finished, so a graceful shutdown that waits for the connection also waits for
//! its streams; a stream that panics is dropped and logged, the connection and its other
//! streams go on (as with a task of its own).

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::task::AtomicWaker;
use std::cell::Cell;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::wait_timer::WaitTimer;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Spawned {
    /// Streams handed over since the driver last looked.
    queue: Mutex<Vec<Task>>,
    /// Set after a push to `queue`: the driver takes the lock only then (an HTTP/1.1
    /// connection never spawns a stream, and would pay a lock per poll for nothing).
    queued: AtomicBool,
    /// The driving task, woken when a stream is handed over from outside its poll.
    waker: AtomicWaker,
    /// Longest a stream's response frame may wait for the client to take it.
    stall_limit: Duration,
}

/// The executor of one connection: give a clone to its hyper builder and run the connection
/// with [`ConnExec::drive`].
#[derive(Clone)]
pub struct ConnExec(Arc<Spawned>);

/// With the production stall limit ([`STALL_LIMIT`](crate::listener::STALL_LIMIT)).
impl Default for ConnExec {
    fn default() -> Self {
        ConnExec::new(crate::listener::STALL_LIMIT)
    }
}

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for ConnExec {
    fn execute(&self, fut: F) {
        let limit = self.0.stall_limit;
        let task = Box::pin(async move {
            let mut fut = std::pin::pin!(AssertUnwindSafe(fut).catch_unwind());
            let mut dog = Watchdog::new(limit);
            match std::future::poll_fn(|cx| dog.poll(cx, fut.as_mut())).await {
                Some(Ok(())) => {}
                Some(Err(_)) => tracing::error!("an HTTP/2 stream panicked; it was dropped"),
                None => tracing::debug!(
                    limit_ms = limit.as_millis() as u64,
                    "HTTP/2 stream dropped: its client took no response data within the stall limit"
                ),
            }
        });
        self.queue().push(task);
        self.0.queued.store(true, Ordering::Release);
        self.0.waker.wake();
    }
}

impl ConnExec {
    /// An executor whose streams are dropped once their response has waited `stall_limit` for
    /// the client (see the module docs).
    pub fn new(stall_limit: Duration) -> Self {
        ConnExec(Arc::new(Spawned {
            queue: Mutex::default(),
            queued: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            stall_limit,
        }))
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Task>> {
        self.0.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drives `conn` and every stream it spawns on this executor; returns the connection's
    /// output once it and all of its streams have finished.
    pub async fn drive<T>(&self, conn: impl Future<Output = T>) -> T {
        let mut conn = std::pin::pin!(conn);
        let mut out = None;
        let mut running = FuturesUnordered::new();
        std::future::poll_fn(|cx| {
            self.0.waker.register(cx.waker());
            // Streams first, the connection after: the frames every ready stream queues leave
            // in the connection's next write, instead of the write going out before the
            // streams woken since the last turn have run (one write per few streams).
            let mut poll_streams = |cx: &mut std::task::Context<'_>| loop {
                // A push sets the flag after it, and wakes this task after that: a push this
                // poll misses is seen by the poll its wake causes. Loaded before it is swapped:
                // a plain load of a flag that is nearly always clear costs no locked write.
                if self.0.queued.load(Ordering::Relaxed)
                    && self.0.queued.swap(false, Ordering::Acquire)
                {
                    running.extend(self.queue().drain(..));
                }
                if running.is_empty() {
                    break;
                }
                match running.poll_next_unpin(cx) {
                    Poll::Ready(Some(())) => continue,
                    Poll::Ready(None) | Poll::Pending => break,
                }
            };
            poll_streams(cx);
            if out.is_none()
                && let Poll::Ready(r) = conn.as_mut().poll(cx)
            {
                out = Some(r);
            }
            // Streams the connection's poll spawned (new requests) run in this same turn.
            // The `FuturesUnordered` yields on its own after polling each stream once, so a
            // busy connection cannot starve the rest of the runtime.
            poll_streams(cx);
            if out.is_some()
                && running.is_empty()
                && self.queue().is_empty()
                && let Some(r) = out.take()
            {
                return Poll::Ready(r);
            }
            Poll::Pending
        })
        .await
    }
}

/// What a stream's response body last did, as reported by [`body_polled`].
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// The last poll handed over a frame: the stream now waits for the client to take it.
    waiting_on_client: bool,
    /// Frames handed over so far: a new one means the client took the previous one.
    frames: u64,
}

thread_local! {
    /// The progress of the stream being polled on this thread (set by its [`Watchdog`]).
    static CURRENT: Cell<Option<Progress>> = const { Cell::new(None) };
}

/// Puts the previous stream's progress back when a poll ends (also on unwind).
struct Restore(Option<Progress>);

impl Drop for Restore {
    fn drop(&mut self) {
        CURRENT.set(self.0.take());
    }
}

/// Ends a stream whose response has waited for its client longer than the limit.
struct Watchdog {
    limit: Duration,
    progress: Progress,
    timer: WaitTimer,
    /// `progress.frames` when the current wait began.
    since_frame: u64,
}

impl Watchdog {
    fn new(limit: Duration) -> Self {
        Watchdog {
            limit,
            progress: Progress::default(),
            timer: WaitTimer::default(),
            since_frame: 0,
        }
    }

    /// Polls `stream`: `Ready(None)` when it was given up on (the caller drops it).
    fn poll<F: Future>(
        &mut self,
        cx: &mut Context<'_>,
        stream: Pin<&mut F>,
    ) -> Poll<Option<F::Output>> {
        let restore = Restore(CURRENT.replace(Some(self.progress)));
        let out = stream.poll(cx);
        self.progress = CURRENT.get().unwrap_or(self.progress);
        drop(restore);
        if let Poll::Ready(out) = out {
            return Poll::Ready(Some(out));
        }
        // Waiting on the body's source is no stall; a frame taken since restarts the clock.
        if !self.progress.waiting_on_client || self.progress.frames != self.since_frame {
            self.timer.stop();
            self.since_frame = self.progress.frames;
        }
        if self.progress.waiting_on_client && self.timer.expired(cx, self.limit) {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// Reports one poll of a response body to the watchdog of the HTTP/2 stream polling it
/// (`sent`: it gave a frame, so the stream now waits on the client); outside a [`ConnExec`]
/// stream (HTTP/1.1) it does nothing. Called by the listener's body wrapper
/// ([`Tracked`](crate::head_wait::Tracked)) for HTTP/2 response bodies that stream.
pub(crate) fn body_polled(sent: bool) {
    if let Some(mut p) = CURRENT.get() {
        // Pending: waiting on its source, not on the client. Ready(None) or an error: the
        // stream is ending anyway.
        p.waiting_on_client = sent;
        p.frames += u64::from(sent);
        CURRENT.set(Some(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Streams spawned before and after the connection ends all run to completion, and only
    /// then does `drive` return the connection's output.
    #[tokio::test]
    async fn drive_waits_for_the_connection_and_every_stream() {
        let exec = ConnExec::default();
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let conn = {
            let exec = exec.clone();
            let done = done.clone();
            async move {
                for i in 0..3u64 {
                    let done = done.clone();
                    exec.execute(async move {
                        tokio::time::sleep(Duration::from_millis(10 * i)).await;
                        done.fetch_add(1, Ordering::SeqCst);
                    });
                }
                // A stream that outlives the connection.
                exec.execute(async move {
                    let _ = rx.await;
                    done.fetch_add(1, Ordering::SeqCst);
                });
                "conn done"
            }
        };
        let driving = tokio::spawn({
            let exec = exec.clone();
            async move { exec.drive(conn).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!driving.is_finished(), "returned before its last stream");
        tx.send(()).unwrap();
        assert_eq!(driving.await.unwrap(), "conn done");
        assert_eq!(done.load(Ordering::SeqCst), 4);
    }

    /// A stream that panics is dropped; the connection and the other streams go on.
    #[tokio::test]
    async fn a_panicking_stream_does_not_take_the_connection_down() {
        let exec = ConnExec::default();
        let done = Arc::new(AtomicUsize::new(0));
        let conn = {
            let exec = exec.clone();
            let done = done.clone();
            async move {
                exec.execute(async { panic!("handler bug") });
                exec.execute(async move {
                    tokio::task::yield_now().await;
                    done.fetch_add(1, Ordering::SeqCst);
                });
                7
            }
        };
        assert_eq!(exec.drive(conn).await, 7);
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }
}
