//! `GET ?live=sse`: every read becomes `event: data` (the chunk: text, a JSON array, or base64
//! for non-text types) immediately followed by `event: control` (`streamNextOffset`,
//! `streamCursor` while open, `upToDate`, `streamClosed`). A closed stream ends the response after
//! its final control; otherwise it ends after `sse_max_duration` (clients resume from the last
//! `streamNextOffset`). Each wait that times out sends a keep-alive control.
//!
//! A subscriber reads for itself until it is at the tail; from then on it follows the stream's
//! shared hub (`pico_server::live::hub`), which reads each append once for all subscribers and
//! encodes its events once per group of subscribers that send the same bytes (same rendering,
//! same cursor, [`GroupEncoder`]); the body takes the ready bytes from its slot. Whenever the
//! hub's frames do not line up with its offset it reads for itself again.
//!
//! Over HTTP/1.1 the response offers its connection ([`DirectOffer`], filled by the listener):
//! a subscriber with nothing to send lends it to the hub, which then writes the group's chunks
//! straight to the socket; the body takes it back before it sends anything itself (a queued
//! delivery, a keep-alive, the end).

use std::borrow::Cow;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures::Stream;
use pico_common::StreamName;
use pico_protocol::headers as h;
use pico_protocol::headers::is_json;
use pico_protocol::{OffsetSpec, push_decimal, push_offset};
use pico_server::live::hub::{
    Delivery, DirectOffer, Encoder, Event, Frame, GroupKey, Reclaimed, Subscription,
};
use pico_server::{ReadOutcome, ReadRecord};
use tokio::time::{Instant, Sleep};

use crate::telemetry::SseOpen;

use super::error::DsError;
use super::headers::ReadQuery;
use super::read::{read_from, values_body};
use super::sse_render::DataFrameWriter;
use super::{Ds, set, sse_is_text};
use crate::pieces::{Pieces, RENDER_AT_ONCE_MAX, payload_len};

/// Appends one SSE event; every payload line gets its own `data: ` line (CR, LF and CRLF all
/// end a line in SSE, so none can smuggle an event boundary). Parsers strip one space after the
/// colon, so a line that itself starts with a space gets `data: ` (its own space survives);
/// others get `data:` with nothing after, as the reference server writes (and the conformance
/// suite matches literally).
pub fn frame(out: &mut Vec<u8>, event: &str, payload: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.push(b'\n');
    let mut rest = payload;
    loop {
        let cut = rest.find(['\r', '\n']);
        let (line, tail) = match cut {
            Some(i) => {
                let skip = if rest[i..].starts_with("\r\n") { 2 } else { 1 };
                (&rest[..i], Some(&rest[i + skip..]))
            }
            None => (rest, None),
        };
        out.extend_from_slice(if line.starts_with(' ') {
            b"data: "
        } else {
            b"data:"
        });
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
        match tail {
            Some(t) => rest = t,
            None => break,
        }
    }
    out.push(b'\n');
}

/// How a stream's records become the `data:` payload (fixed by its content type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Render {
    pub json: bool,
    pub text: bool,
}

impl Render {
    /// The key of this rendering among a hub frame's renderings.
    fn kind(self) -> &'static str {
        match (self.json, self.text) {
            (true, true) => "ds-json",
            (true, false) => "ds-json-base64",
            (false, true) => "ds-text",
            (false, false) => "ds-base64",
        }
    }
}

/// The `event: data` frame of a read's records: text, a JSON array for JSON streams, or base64
/// for non-text types. Shared by per-subscriber reads and hub frames (rendered once each).
pub fn data_frame(buf: &mut Vec<u8>, records: &[ReadRecord], render: Render) {
    let body = values_body(records, render.json);
    let payload = if render.text {
        String::from_utf8_lossy(&body)
    } else {
        Cow::Owned(STANDARD.encode(&body))
    };
    buf.reserve(payload.len() + 160);
    frame(buf, "data", &payload);
}

/// Appends the control event, rendered by hand: one per subscriber per append, so no JSON value
/// tree and no intermediate strings. The bytes are exactly what `frame` makes of the
/// `serde_json` object (keys sorted: `streamClosed`, `streamCursor`, `streamNextOffset`,
/// `upToDate`; the JSON has no line breaks and starts with `{`, hence a single `data:` line;
/// the test pins both).
fn control_frame(out: &mut Vec<u8>, cursor: u64, next: u64, up_to_date: bool, closed: bool) {
    out.extend_from_slice(b"event: control\ndata:{");
    if closed {
        out.extend_from_slice(b"\"streamClosed\":true,");
    } else {
        out.extend_from_slice(b"\"streamCursor\":\"");
        push_decimal(out, cursor, 0);
        out.extend_from_slice(b"\",");
    }
    out.extend_from_slice(b"\"streamNextOffset\":\"");
    push_offset(out, next);
    out.push(b'"');
    if up_to_date {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    out.extend_from_slice(b"}\n\n");
}

/// Shared data frames up to this size are copied into the subscriber's control chunk (one
/// socket write per event pair); larger ones go out as their own chunk, so 1000 subscribers do
/// not each copy a 64 KiB frame.
const INLINE_DATA: usize = 4 * 1024;

/// Room for one control event (its longest form is about 110 bytes).
const CONTROL_LEN: usize = 128;

/// Encodes a hub frame for one group of DS subscribers (one rendering, one cursor): the bytes
/// [`SseState::take`] would queue for a frame it renders at once, made once for the group.
struct GroupEncoder {
    render: Render,
    cursor: u64,
}

impl Encoder for GroupEncoder {
    fn encode(&self, f: &Frame) -> Option<Vec<Bytes>> {
        if f.unshared || f.payload_len > RENDER_AT_ONCE_MAX {
            // Read, or rendered piece by piece, by each subscriber ([`SseState::take`]).
            return None;
        }
        let up_to_date = f.up_to_date || f.closed;
        let data = if f.records.is_empty() {
            Bytes::new()
        } else {
            // Shared with the groups of the same rendering (other cursors).
            let render = self.render;
            f.rendered(render.kind(), |f| {
                let mut buf = Vec::new();
                data_frame(&mut buf, &f.records, render);
                Bytes::from(buf)
            })
        };
        let mut control = Vec::with_capacity(data.len().min(INLINE_DATA) + CONTROL_LEN);
        if data.len() <= INLINE_DATA {
            // One chunk, so one socket write per subscriber per event pair.
            control.extend_from_slice(&data);
            control_frame(&mut control, self.cursor, f.next, up_to_date, f.closed);
            return Some(vec![Bytes::from(control)]);
        }
        control_frame(&mut control, self.cursor, f.next, up_to_date, f.closed);
        Some(vec![data, Bytes::from(control)])
    }
}

struct SseState {
    ds: Ds,
    name: StreamName,
    /// The incarnation being streamed: a stream deleted and re-created under the same name
    /// is another stream, and this response ends rather than continue into it.
    stream_id: u64,
    render: Render,
    cursor: u64,
    next: u64,
    /// At the tail as of the last read or frame: follow the hub instead of reading.
    caught_up: bool,
    done: bool,
    deadline: Instant,
    poll: Duration,
    /// The stream's hub, joined on first catching up and kept while it lives, so frames
    /// published while this subscriber writes or reads are not lost (they wait in its slot).
    hub: Option<Subscription>,
    /// When the current wait for the hub ends with a keep-alive (set as the wait starts).
    wake: Option<Instant>,
    /// Keep-alive timer for following, armed no later than `wake`.
    keepalive: Pin<Box<Sleep>>,
    /// The waker `keepalive` last registered: while it is still ours and the timer has not
    /// fired, polling it again is skipped (one timer poll per subscriber per append saved).
    keepalive_waker: Option<Waker>,
    /// Frames to send; at most two per step, so bounded (a large one is rendered as it goes).
    pending: Pieces,
    /// This response's connection, when the listener offers it (HTTP/1.1).
    offer: DirectOffer,
    /// The connection is lent to the hub: the hub writes the deliveries, and `next` is stale
    /// until it is taken back.
    lent: bool,
    /// Counts this response in `pico_http_sse_streams` until the body is dropped.
    _open: SseOpen,
}

impl SseState {
    /// A subscriber at `next`, not yet caught up, with the node's deadline and poll interval.
    fn new(
        ds: &Ds,
        name: StreamName,
        stream_id: u64,
        render: Render,
        cursor: u64,
        next: u64,
    ) -> SseState {
        let cfg = ds.node.config();
        let deadline = Instant::now() + cfg.sse_max_duration;
        let first_wake = (Instant::now() + cfg.long_poll_timeout).min(deadline);
        SseState {
            ds: ds.clone(),
            name,
            stream_id,
            render,
            cursor,
            next,
            caught_up: false,
            done: false,
            deadline,
            poll: cfg.long_poll_timeout,
            hub: None,
            wake: None,
            keepalive: Box::pin(tokio::time::sleep_until(first_wake)),
            keepalive_waker: None,
            pending: Pieces::default(),
            offer: DirectOffer::default(),
            lent: false,
            _open: SseOpen::new("ds"),
        }
    }

    fn control(&self, next: u64, up_to_date: bool, closed: bool) -> Bytes {
        let mut out = Vec::with_capacity(CONTROL_LEN);
        control_frame(&mut out, self.cursor, next, up_to_date, closed);
        Bytes::from(out)
    }

    /// Queues the frames of one read.
    fn absorb(&mut self, out: &ReadOutcome, first: bool) {
        let has_data = !out.records.is_empty();
        // A data event and its control event go out as one chunk: one socket write per
        // subscriber per batch instead of two (it matters with thousands of subscribers).
        let mut buf = Vec::new();
        if has_data {
            if payload_len(out) > RENDER_AT_ONCE_MAX {
                let values = out.records.iter().map(|r| r.record.value.clone());
                let writer = DataFrameWriter::new(values, self.render);
                self.pending.render(writer);
            } else {
                data_frame(&mut buf, &out.records, self.render);
            }
        }
        if has_data || first || out.closed {
            let up_to_date = out.up_to_date || out.closed;
            control_frame(&mut buf, self.cursor, out.next_seq, up_to_date, out.closed);
        }
        if !buf.is_empty() {
            self.pending.ready(Bytes::from(buf));
        }
        self.next = out.next_seq;
        self.caught_up = out.up_to_date;
        if out.closed {
            self.done = true;
        }
    }

    /// Queues a hub delivery that starts at this subscriber's offset.
    fn deliver(&mut self, d: &Delivery) {
        let Some(parts) = &d.parts else {
            self.take(&d.frame);
            return;
        };
        for p in parts {
            self.pending.ready(p.clone());
        }
        self.next = d.frame.next;
        if d.frame.closed {
            self.done = true;
        }
    }

    /// Queues a hub frame its group's encoder left to each subscriber: too large to hold (read
    /// for itself) or to render at once (rendered for this subscriber as it is sent).
    fn take(&mut self, f: &Frame) {
        if f.unshared {
            self.caught_up = false;
            return;
        }
        let up_to_date = f.up_to_date || f.closed;
        let values = f.records.iter().map(|r| r.record.value.clone());
        let writer = DataFrameWriter::new(values, self.render);
        self.pending.render(writer);
        let c = self.control(f.next, up_to_date, f.closed);
        self.pending.ready(c);
        self.next = f.next;
        if f.closed {
            self.done = true;
        }
    }

    /// The fast path of a caught-up subscriber in its hub: takes the next delivery from its
    /// slot, or a keep-alive once `poll` passes without one. `Ready` with something queued,
    /// `done` set, or `caught_up` cleared when it must read for itself (it lagged, the frame
    /// starts elsewhere, or the hub ended).
    fn poll_follow(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let wake = match self.wake {
            Some(w) => w,
            None => {
                let now = Instant::now();
                if now >= self.deadline {
                    self.done = true;
                    return Poll::Ready(());
                }
                let w = now + (self.deadline - now).min(self.poll);
                self.wake = Some(w);
                w
            }
        };
        let got = loop {
            let Some(sub) = &self.hub else {
                self.caught_up = false;
                return Poll::Ready(());
            };
            match sub.poll_next(cx) {
                Poll::Ready(Event::Delivery(d))
                    if d.frame.next <= self.next
                        && d.frame.from != self.next
                        && !d.frame.closed =>
                {
                    // Published before this subscriber's own read got past it.
                    continue;
                }
                Poll::Ready(e) => break Some(e),
                Poll::Pending => break None,
            }
        };
        match got {
            Some(Event::Delivery(d)) if d.frame.from == self.next => self.deliver(&d),
            Some(Event::Delivery(_)) => self.caught_up = false,
            Some(Event::Lagged) => {
                tracing::debug!(stream = %self.name, "sse subscriber lagged its hub");
                self.caught_up = false;
            }
            Some(Event::Ended) => {
                // The hub ended (closed, deleted, read error): the read path decides what
                // that means for this subscriber; a later catch-up joins a fresh hub.
                self.hub = None;
                self.caught_up = false;
            }
            None => {
                // The timer stays armed across waits and is only moved when it fires early:
                // re-arming it per event would cost a timer-wheel insert and removal per
                // subscriber per append. `wake` never moves backwards, so firing late cannot
                // happen.
                loop {
                    std::task::ready!(poll_keepalive(
                        &mut self.keepalive,
                        &mut self.keepalive_waker,
                        cx
                    ));
                    if Instant::now() >= wake {
                        break;
                    }
                    self.keepalive.as_mut().reset(wake);
                    self.keepalive_waker = None;
                }
                if Instant::now() < self.deadline {
                    let c = self.control(self.next, true, false);
                    self.pending.ready(c);
                } else {
                    self.done = true;
                }
            }
        }
        self.wake = None;
        Poll::Ready(())
    }

    /// Waiting with nothing to send: lends the connection to the hub if it is offered.
    fn lend(&mut self) -> bool {
        let (Some(out), Some(sub)) = (self.offer.get(), &self.hub) else {
            return false;
        };
        self.lent = sub.lend(out, self.next);
        self.lent
    }

    /// While lent: `Pending` until the slot holds something for this body or the keep-alive
    /// is due (counted from the last delivery the hub wrote), then takes the connection back
    /// and picks up where the hub left it.
    fn poll_lent(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(sub) = &self.hub else {
            self.lent = false;
            return Poll::Ready(());
        };
        let back = match sub.poll_lent(cx) {
            Poll::Ready(back) => back,
            Poll::Pending => {
                loop {
                    std::task::ready!(poll_keepalive(
                        &mut self.keepalive,
                        &mut self.keepalive_waker,
                        cx
                    ));
                    let wake = match sub.last_sent() {
                        Some(t) => (t + self.poll).min(self.deadline),
                        None => self.wake.unwrap_or(self.deadline),
                    };
                    if Instant::now() >= wake {
                        break;
                    }
                    self.keepalive.as_mut().reset(wake);
                    self.keepalive_waker = None;
                }
                sub.reclaim()
            }
        };
        self.lent = false;
        if let Some(Reclaimed { next, last }) = back {
            self.next = next;
            if let Some(t) = last {
                // The wait for a keep-alive starts at the hub's last write.
                self.wake = Some((t + self.poll).min(self.deadline));
            }
        }
        Poll::Ready(())
    }

    /// The slow path: joins the hub once caught up (reading the gap if the hub is already
    /// past this subscriber), or reads for itself.
    async fn step(&mut self) {
        if Instant::now() >= self.deadline {
            self.done = true;
            return;
        }
        if self.caught_up {
            if self.hub.is_none() {
                let key = GroupKey {
                    kind: self.render.kind(),
                    params: [self.cursor, 0],
                };
                let (render, cursor) = (self.render, self.cursor);
                let sub = self
                    .ds
                    .node
                    .follow(&self.name, self.stream_id, self.next, key, || {
                        Arc::new(GroupEncoder { render, cursor })
                    });
                // A frame the hub sent between this subscriber's last read and its joining is
                // not in its slot and would never come: read the gap instead (later frames
                // wait in the slot meanwhile).
                let behind = sub.hub.published() > self.next;
                self.hub = Some(sub);
                if !behind {
                    return;
                }
                self.caught_up = false;
            } else {
                return;
            }
        }
        match read_from(&self.ds, &self.name, OffsetSpec::At(self.next), false).await {
            Ok(out) if out.info.stream_id != self.stream_id => self.done = true,
            Ok(out) => {
                let progressed = !out.records.is_empty() || out.closed;
                self.absorb(&out, false);
                if !progressed && self.pending.is_empty() {
                    // A wake-up with nothing to read (view lag): back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Err(_) => self.done = true,
        }
    }
}

/// Polls the keep-alive timer only when it fired or the task's waker changed (a registered
/// timer wakes the task itself).
fn poll_keepalive(
    timer: &mut Pin<Box<Sleep>>,
    registered: &mut Option<Waker>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    if registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) && !timer.is_elapsed() {
        return Poll::Pending;
    }
    let r = timer.as_mut().poll(cx);
    *registered = r.is_pending().then(|| cx.waker().clone());
    r
}

pub async fn sse(ds: &Ds, name: StreamName, q: &ReadQuery) -> Result<Response, DsError> {
    // A missing stream or a bad offset is a plain error response, not an event.
    let first = read_from(ds, &name, q.offset, true).await?;
    let ct = first.info.content_type.clone();
    let text = sse_is_text(&ct);
    let render = Render {
        json: is_json(&ct),
        text,
    };
    let mut st = SseState::new(
        ds,
        name,
        first.info.stream_id,
        render,
        ds.node.live_cursor(q.cursor),
        first.next_seq,
    );
    st.absorb(&first, true);
    let offer = st.offer.clone();
    let mut resp = Response::new(body(st));
    resp.extensions_mut().insert(offer);
    let hm = resp.headers_mut();
    hm.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    hm.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if !text {
        set(
            hm,
            h::DS_SSE_DATA_ENCODING,
            HeaderValue::from_static("base64"),
        );
    }
    Ok(resp)
}

/// A slow-path step in progress, owning the state until it is done.
type Step = Pin<Box<dyn Future<Output = Box<SseState>> + Send>>;

/// The response body: the queued frames; while caught up, the hub's deliveries straight from
/// the subscriber's slot (no future, no allocation per event); otherwise a step at a time.
struct SseBody {
    st: Option<Box<SseState>>,
    step: Option<Step>,
}

impl Stream for SseBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(step) = &mut this.step {
                let st = std::task::ready!(step.as_mut().poll(cx));
                this.step = None;
                this.st = Some(st);
            }
            let Some(st) = this.st.as_mut() else {
                return Poll::Ready(None);
            };
            if st.lent {
                std::task::ready!(st.poll_lent(cx));
            }
            if let Some(b) = st.pending.next_bytes() {
                return Poll::Ready(Some(Ok(b)));
            }
            if st.done {
                return Poll::Ready(None);
            }
            if st.caught_up && st.hub.is_some() {
                if st.poll_follow(cx).is_pending() && !st.lend() {
                    return Poll::Pending;
                }
                continue;
            }
            if let Some(mut st) = this.st.take() {
                this.step = Some(Box::pin(async move {
                    st.step().await;
                    st
                }));
            }
        }
    }
}

fn body(st: SseState) -> Body {
    Body::from_stream(SseBody {
        st: Some(Box::new(st)),
        step: None,
    })
}

/// A subscriber of a text stream whose own read just reached `next`, the tail, before it joins
/// the hub: the state between a read and the `follow` that joins (for the hub's tests).
#[cfg(test)]
pub(super) fn caught_up_at(ds: &Ds, name: StreamName, stream_id: u64, next: u64) -> Body {
    let text = Render {
        json: false,
        text: true,
    };
    let mut st = SseState::new(ds, name, stream_id, text, 0, next);
    st.caught_up = true;
    body(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pico_protocol::format_offset;

    fn f(event: &str, payload: &str) -> String {
        let mut out = Vec::new();
        frame(&mut out, event, payload);
        String::from_utf8(out).unwrap()
    }

    /// The hand-rendered control event is byte for byte what `frame` makes of the
    /// `serde_json` object.
    #[test]
    fn control_frame_matches_serde() {
        for (cursor, next) in [(0, 0), (1_700_000_123, 42), (u64::MAX, u64::MAX)] {
            for up_to_date in [false, true] {
                for closed in [false, true] {
                    let mut v = serde_json::json!({ "streamNextOffset": format_offset(next) });
                    if closed {
                        v["streamClosed"] = serde_json::json!(true);
                    } else {
                        v["streamCursor"] = serde_json::json!(cursor.to_string());
                    }
                    if up_to_date {
                        v["upToDate"] = serde_json::json!(true);
                    }
                    let mut got = Vec::new();
                    control_frame(&mut got, cursor, next, up_to_date, closed);
                    assert_eq!(
                        String::from_utf8(got).unwrap(),
                        f("control", &v.to_string())
                    );
                }
            }
        }
    }

    #[test]
    fn frames_split_every_line_ending() {
        assert_eq!(
            f("control", "{\"a\":1}"),
            "event: control\ndata:{\"a\":1}\n\n"
        );
        assert_eq!(
            f("data", "a\nb\r\nc\rd"),
            "event: data\ndata:a\ndata:b\ndata:c\ndata:d\n\n"
        );
        assert_eq!(f("data", ""), "event: data\ndata:\n\n");
        assert_eq!(f("data", " lead"), "event: data\ndata:  lead\n\n");
        assert_eq!(
            f("data", "x\n\nevent: control"),
            "event: data\ndata:x\ndata:\ndata:event: control\n\n"
        );
    }
}
