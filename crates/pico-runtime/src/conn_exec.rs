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
//! Invariants: [`ConnExec::drive`] returns only once the connection and every stream it
//! spawned have finished, so a graceful shutdown that waits for the connection also waits for
//! its streams; a stream that panics is dropped and logged, the connection and its other
//! streams go on (as with a task of its own).

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::task::AtomicWaker;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

#[derive(Default)]
struct Spawned {
    /// Streams handed over since the driver last looked.
    queue: Mutex<Vec<Task>>,
    /// The driving task, woken when a stream is handed over from outside its poll.
    waker: AtomicWaker,
}

/// The executor of one connection: give a clone to its hyper builder and run the connection
/// with [`ConnExec::drive`].
#[derive(Clone, Default)]
pub struct ConnExec(Arc<Spawned>);

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for ConnExec {
    fn execute(&self, fut: F) {
        let task = Box::pin(async move {
            if AssertUnwindSafe(fut).catch_unwind().await.is_err() {
                tracing::error!("an HTTP/2 stream panicked; it was dropped");
            }
        });
        self.queue().push(task);
        self.0.waker.wake();
    }
}

impl ConnExec {
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
                running.extend(self.queue().drain(..));
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
            if running.is_empty()
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
