//! The per-request guards the listener puts around every app it serves: two plain calls per
//! request ([`admit`] before the app, [`Passed::settle`] after it), no layers.
//!
//! - The `Host` ([`HostPolicy`]): a loopback listener answers loopback names and configured
//!   hosts only (DNS rebinding); HTTP/1.1 without `Host` is a 400.
//! - Codings we would store undecoded: a transfer coding other than `chunked` (`gzip, chunked`:
//!   hyper undoes the chunking, not the gzip) is a 400, and a request body with a
//!   `Content-Encoding` other than `identity` a 415, both before the body is read.
//! - Request bodies get timers ([`GuardedBody`], limits in [`BodyLimits`]): once a request's
//!   headers are in, hyper's header read timer no longer applies, so a client that declares a
//!   32 MiB body and then trickles it (or stops) would hold its task, socket and buffer for
//!   good, and enough of them exhaust file descriptors. When a timer runs out the body fails
//!   with [`BodyTimeout`]: `read_body` answers that 408 itself, and for handlers that take the
//!   body through an extractor (`Bytes`, whose rejection would be a 400) [`Passed::settle`]
//!   turns the answer into the same 408. hyper then closes the connection, the body being unread.
//! - HTTP/2 response bodies report their progress to the stream watchdog of
//!   [`ConnExec`](crate::conn_exec) through the listener's body wrapper
//!   ([`Tracked`](crate::head_wait::Tracked)).

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};
use pico_http::HttpError;
use pico_http::error::BodyTimeout;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

use crate::host::HostPolicy;

/// What a request body must do to be read to its end; any of them failing is a 408.
///
/// The idle timer alone lets a body trickle in forever (one byte every few seconds restarts
/// it), so the body as a whole must also keep an average rate, counted from its first read:
/// after `rate_grace`, at least `min_rate` bytes per second (a small body just has to be in
/// within the grace). Every body must also be complete within `deadline`, whatever its rate:
/// that bounds how long any one request can hold a connection. The defaults (30 s idle, 1 KiB/s
/// after 10 s, 5 minutes) cost an honest client nothing: at the deadline a 32 MiB body (the
/// default `--max-request-size`) needs ~110 KiB/s; an operator whose clients upload that much
/// over slower links raises the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Longest wait for the next chunk.
    pub idle: Duration,
    /// Least average rate, bytes per second, once `rate_grace` has passed (0: no minimum).
    pub min_rate: u64,
    pub rate_grace: Duration,
    /// Longest a whole body may take.
    pub deadline: Duration,
}

/// The guard's settings for one listener, built once.
#[derive(Debug, Clone)]
pub struct Edge {
    pub body: BodyLimits,
    pub hosts: HostPolicy,
}

/// A request [`admit`] let through: what [`Passed::settle`] checks on the way out.
#[derive(Debug)]
pub struct Passed {
    /// Set by the request body's timers when one ran out (bodiless requests have none).
    fired: Option<Arc<OnceLock<BodyTimeout>>>,
}

/// A request refused before any app saw it: [`Refused::into_response`] is the answer.
#[derive(Debug)]
pub struct Refused {
    error: HttpError,
    version: Version,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        refuse(self.error, self.version)
    }
}

/// Checks a request before any app sees it (see the module docs): `Err` is answered instead
/// of serving it. A request body gets its timers here.
pub fn admit<B>(edge: &Edge, req: axum::http::Request<B>) -> Result<(Request, Passed), Refused>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<axum::BoxError>,
{
    let version = req.version();
    let seen = Seen::of(req.headers());
    let checked = edge
        .hosts
        .check_found(&req, seen.host, seen.hosts > 1)
        .and_then(|()| check_codings(&req, &seen));
    if let Err(error) = checked {
        return Err(Refused { error, version });
    }
    // Bodiless requests (GET, HEAD: most of the traffic) need no timer.
    let fired = (!req.body().is_end_stream()).then(|| Arc::new(OnceLock::new()));
    let req = match &fired {
        Some(fired) => req.map(|b| Body::new(GuardedBody::new(b, edge.body, fired.clone()))),
        None => req.map(Body::new),
    };
    Ok((req, Passed { fired }))
}

impl Passed {
    /// The app's answer as sent: a 408 if the body's timers ran out. (HTTP/2 response bodies
    /// are watched for stalls by the listener's body wrapper, `head_wait::Tracked`.)
    pub fn settle(self, res: Response) -> Response {
        if let Some(e) = self.fired.as_deref().and_then(OnceLock::get)
            && res.status() != StatusCode::REQUEST_TIMEOUT
        {
            // Whatever the handler made of the failed body (an extractor's 400), the cause is
            // the client's pace; a handler that answered 408 itself keeps its protocol's form.
            return HttpError::request_timeout(e.to_string()).into_response();
        }
        res
    }
}

/// An answer given instead of serving: its body (if any) is left unread, so an HTTP/1.1
/// connection must not be reused (its next bytes would be that body).
fn refuse(e: HttpError, version: Version) -> Response {
    let mut resp = e.into_response();
    if version < Version::HTTP_2 {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// What the guard reads from a request's headers, found in one pass over them: a hashed
/// lookup per name (`Host`, and the two codings, which are nearly always absent) cost more
/// than the pass over a request's few headers.
#[derive(Debug, Default)]
struct Seen<'a> {
    /// The first `Host`, and how many there are (counted to 2).
    host: Option<&'a HeaderValue>,
    hosts: u8,
    transfer_encoding: bool,
    content_encoding: bool,
}

impl<'a> Seen<'a> {
    fn of(h: &'a HeaderMap) -> Seen<'a> {
        let mut seen = Seen::default();
        for (name, value) in h {
            if *name == header::HOST {
                seen.host = seen.host.or(Some(value));
                seen.hosts = seen.hosts.saturating_add(1).min(2);
            } else if *name == header::TRANSFER_ENCODING {
                seen.transfer_encoding = true;
            } else if *name == header::CONTENT_ENCODING {
                seen.content_encoding = true;
            }
        }
        seen
    }
}

/// Refuses codings the handlers would not undo: they would store the encoded bytes as if they
/// were the body. `seen` says which coding headers are there at all.
fn check_codings<B: hyper::body::Body>(
    req: &axum::http::Request<B>,
    seen: &Seen<'_>,
) -> Result<(), HttpError> {
    let h = req.headers();
    if let Some(te) = seen
        .transfer_encoding
        .then(|| other_coding(h, header::TRANSFER_ENCODING, "chunked"))
        .flatten()
    {
        return Err(HttpError::bad_request(format!(
            "Transfer-Encoding `{te}` is not supported: only `chunked` is; send the body \
             uncompressed"
        )));
    }
    if seen.content_encoding
        && !req.body().is_end_stream()
        && let Some(ce) = other_coding(h, header::CONTENT_ENCODING, "identity")
    {
        return Err(HttpError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("Content-Encoding `{ce}` is not supported: send the body uncompressed"),
        ));
    }
    Ok(())
}

/// The whole header, if any of its codings is not `allowed`.
fn other_coding(h: &HeaderMap, name: header::HeaderName, allowed: &str) -> Option<String> {
    h.get_all(&name).iter().find_map(|v| {
        let s = String::from_utf8_lossy(v.as_bytes());
        s.split(',')
            .map(str::trim)
            .any(|c| !c.is_empty() && !c.eq_ignore_ascii_case(allowed))
            .then(|| s.into_owned())
    })
}

/// Which limit the armed timer stands for.
#[derive(Debug, Clone, Copy)]
enum Limit {
    Idle,
    Rate,
    Deadline,
}

/// A request body that fails with [`BodyTimeout`] once one of its [`BodyLimits`] is broken
/// while it is being waited for. Data that is ready is never refused: only the client's time
/// counts, not the handler's.
#[derive(Debug)]
pub struct GuardedBody<B = Body> {
    inner: B,
    limits: BodyLimits,
    /// The first read.
    start: Option<Instant>,
    received: u64,
    /// A wait is being counted, with the timer armed for this limit.
    waiting: Option<Limit>,
    /// Allocated at the first wait only: most bodies are in before they are read.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Set when a timer ran out, for [`Passed::settle`].
    fired: Arc<OnceLock<BodyTimeout>>,
}

impl<B> GuardedBody<B> {
    pub fn new(inner: B, limits: BodyLimits, fired: Arc<OnceLock<BodyTimeout>>) -> Self {
        GuardedBody {
            inner,
            limits,
            start: None,
            received: 0,
            waiting: None,
            sleep: None,
            fired,
        }
    }

    /// The earliest limit the wait starting `now` can break, and when.
    fn next_limit(&self, start: Instant, now: Instant) -> Option<(Instant, Limit)> {
        let l = &self.limits;
        let mut next = now.checked_add(l.idle).map(|at| (at, Limit::Idle));
        let mut consider = |at: Option<Instant>, limit| {
            if let Some(at) = at
                && next.is_none_or(|(n, _)| at < n)
            {
                next = Some((at, limit));
            }
        };
        if l.min_rate > 0 {
            // The moment the average falls below the minimum if nothing more arrives.
            let earned = Duration::try_from_secs_f64(self.received as f64 / l.min_rate as f64)
                .unwrap_or(Duration::MAX);
            consider(start.checked_add(earned.max(l.rate_grace)), Limit::Rate);
        }
        consider(start.checked_add(l.deadline), Limit::Deadline);
        next
    }

    fn error(&self, limit: Limit, start: Instant) -> BodyTimeout {
        match limit {
            Limit::Idle => BodyTimeout::Idle(self.limits.idle),
            Limit::Rate => BodyTimeout::TooSlow {
                received: self.received,
                elapsed: start.elapsed(),
                min_rate: self.limits.min_rate,
            },
            Limit::Deadline => BodyTimeout::Deadline(self.limits.deadline),
        }
    }
}

impl<B> hyper::body::Body for GuardedBody<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let start = *this.start.get_or_insert_with(Instant::now);
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            let frame = frame.map(|f| f.map_err(axum::Error::new));
            if let Some(Ok(f)) = &frame
                && let Some(d) = f.data_ref()
            {
                this.received = this.received.saturating_add(d.len() as u64);
            }
            this.waiting = None;
            return Poll::Ready(frame);
        }
        let limit = match this.waiting {
            Some(limit) => limit,
            None => {
                let Some((at, limit)) = this.next_limit(start, Instant::now()) else {
                    return Poll::Pending;
                };
                match this.sleep.as_mut() {
                    Some(s) => s.as_mut().reset(at),
                    None => this.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
                }
                this.waiting = Some(limit);
                limit
            }
        };
        let expired = this
            .sleep
            .as_mut()
            .is_some_and(|s| s.as_mut().poll(cx).is_ready());
        if !expired {
            return Poll::Pending;
        }
        let e = this.error(limit, start);
        tracing::debug!(error = %e, "request body timed out");
        let _ = this.fired.set(e);
        Poll::Ready(Some(Err(axum::Error::new(e))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
