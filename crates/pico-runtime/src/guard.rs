//! The per-request guards the listener puts around every app it serves.
//!
//! - Request bodies get an idle timer ([`IdleBody`]): once a request's headers are in, hyper's
//!   header read timer no longer applies, so a client that declares a 32 MiB body and stops
//!   sending would hold its task, socket and buffer for good. The timer counts only while a
//!   handler waits for the next chunk, and restarts with every chunk, so a slow but steady
//!   upload is fine. When it runs out the body fails with [`BodyTimeout`]: `read_body` answers
//!   that 408 itself, and for handlers that take the body through an extractor (`Bytes`, whose
//!   rejection would be a 400) [`guard`] turns the answer into the same 408.
//! - HTTP/2 response bodies report their progress to the stream watchdog of
//!   [`ConnExec`](crate::conn_exec) ([`Watched`]).

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::Version;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Body as _, Frame, SizeHint};
use pico_http::HttpError;
use pico_http::error::BodyTimeout;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::conn_exec::Watched;
use crate::wait_timer::WaitTimer;

/// Middleware (state: the request body's idle timeout): see the module docs.
pub async fn guard(State(body_idle): State<Duration>, req: Request, next: Next) -> Response {
    let h2 = req.version() == Version::HTTP_2;
    // Bodiless requests (GET, HEAD: most of the traffic) need no timer.
    let fired = (!req.body().is_end_stream()).then(|| Arc::new(AtomicBool::new(false)));
    let req = match &fired {
        Some(fired) => req.map(|b| Body::new(IdleBody::new(b, body_idle, fired.clone()))),
        None => req,
    };
    let res = next.run(req).await;
    if fired.is_some_and(|f| f.load(Ordering::Relaxed))
        && res.status() != axum::http::StatusCode::REQUEST_TIMEOUT
    {
        // Whatever the handler made of the failed body (an extractor's 400), the cause is the
        // client's silence; a handler that answered 408 itself keeps its protocol's form.
        let msg = BodyTimeout { idle: body_idle }.to_string();
        return HttpError::request_timeout(msg).into_response();
    }
    if h2 && !res.body().is_end_stream() {
        return res.map(|b| Body::new(Watched(b)));
    }
    res
}

/// A request body that fails with [`BodyTimeout`] once no chunk has arrived for `idle` while
/// it was being waited for.
#[derive(Debug)]
pub struct IdleBody {
    inner: Body,
    idle: Duration,
    timer: WaitTimer,
    /// Set when the timer ran out, for [`guard`].
    fired: Arc<AtomicBool>,
}

impl IdleBody {
    pub fn new(inner: Body, idle: Duration, fired: Arc<AtomicBool>) -> Self {
        IdleBody {
            inner,
            idle,
            timer: WaitTimer::default(),
            fired,
        }
    }
}

impl hyper::body::Body for IdleBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.timer.stop();
            return Poll::Ready(frame);
        }
        if !this.timer.expired(cx, this.idle) {
            return Poll::Pending;
        }
        this.fired.store(true, Ordering::Relaxed);
        let e = BodyTimeout { idle: this.idle };
        tracing::debug!(error = %e, "request body timed out");
        Poll::Ready(Some(Err(axum::Error::new(e))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
