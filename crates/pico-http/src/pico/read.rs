//! `GET /{name}`: catch-up reads (cacheable, ETag), long-poll (`live=long-poll`) and SSE
//! (`live=sse`). Query: `seq` (number or `now`; absent = the stream's start), `count`, `bytes`,
//! `format=json|binary|raw`, `live`, `cursor`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::Stream;
use pico_common::StreamName;
use pico_protocol::headers as h;
use pico_protocol::json_render::JsonRecordsWriter;
use pico_protocol::{encode_binary, render_json};
use pico_server::live::hub::{Delivery, Encoder, Event, Frame, GroupKey, Subscription};
use pico_server::node::MAX_READ_RECORDS;
use pico_server::{LongPoll, Node, ReadError, ReadFrom, ReadOutcome, ReadRecord, ReadRequest};
use serde_json::json;
use tokio::time::Instant;

use super::{Params, no_store, set, set_true, stream_name, text_value};
use crate::error::HttpError;
use crate::headers::{Live, header_list, header_str};
use crate::pieces::{Pieces, RENDER_AT_ONCE_MAX, Render, payload_len};
use crate::telemetry::{SseOpen, live_read};

const CACHE_CATCH_UP: &str = "public, max-age=60, stale-while-revalidate=300";
const SPURIOUS_WAKE_BACKOFF: Duration = Duration::from_millis(50);

/// The kind of a hub frame's shared Pico rendering (its whole `event: data`).
const PICO_DATA: &str = "pico-sse-data";

/// An SSE comment sent after this long without an event, as proxies drop idle responses.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Binary,
    Raw,
}

impl Format {
    fn tag(self) -> &'static str {
        match self {
            Format::Json => "j",
            Format::Binary => "b",
            Format::Raw => "r",
        }
    }
}

/// A parsed read query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadQuery {
    /// `None` = from the stream's first readable record.
    pub from: Option<ReadFrom>,
    pub count: Option<usize>,
    pub bytes: Option<usize>,
    pub format: Format,
    pub live: Live,
    pub cursor: Option<u64>,
}

impl ReadQuery {
    pub fn parse(p: &Params) -> Result<ReadQuery, HttpError> {
        let from = match p.get("seq") {
            None => None,
            Some("now") => Some(ReadFrom::Now),
            Some(_) => p.u64("seq")?.map(ReadFrom::Offset),
        };
        let format = match p.get("format") {
            None | Some("json") => Format::Json,
            Some("binary") => Format::Binary,
            Some("raw") => Format::Raw,
            Some(other) => {
                return Err(HttpError::bad_request(format!(
                    "bad format (want json, binary or raw): format=`{other}`"
                )));
            }
        };
        let live = Live::parse(p.get("live"))?;
        if live == Live::Sse && format != Format::Json {
            return Err(HttpError::bad_request(
                "live=sse carries JSON events only: drop format or use format=json",
            ));
        }
        Ok(ReadQuery {
            from,
            count: p.positive("count")?,
            bytes: p.positive("bytes")?,
            format,
            live,
            cursor: p.u64("cursor")?,
        })
    }
}

pub async fn read(
    State(node): State<Node>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    read_named(node, stream_name(&uri)?, &uri, headers).await
}

/// [`read`] of a stream whose name the caller has parsed from `uri`.
pub async fn read_named(
    node: Node,
    name: StreamName,
    uri: &Uri,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let q = ReadQuery::parse(&Params::parse(uri)?)?;
    match q.live {
        Live::CatchUp => catch_up(&node, &name, &q, &headers).await,
        Live::LongPoll => long_poll(&node, &name, &q).await.map(live_read),
        Live::Sse => {
            let from = match header_str(&headers, h::LAST_EVENT_ID)? {
                Some(id) => Some(ReadFrom::Offset(
                    pico_protocol::parse_strict_u64(id).map_err(|e| {
                        HttpError::bad_request(format!("bad {}: {e}", h::LAST_EVENT_ID))
                    })?,
                )),
                None => q.from,
            };
            // Surface a missing stream or a bad offset as a plain error, not an SSE event.
            let first = read_once(&node, &name, from, q.count, q.bytes).await?;
            Ok(live_read(sse(node, name, q, first)))
        }
    }
}

/// One read. With no explicit start, reads from the stream's first readable record (retrying
/// once at the trim watermark the server reports).
async fn read_once(
    node: &Node,
    name: &StreamName,
    from: Option<ReadFrom>,
    count: Option<usize>,
    bytes: Option<usize>,
) -> Result<ReadOutcome, ReadError> {
    let req = |from| ReadRequest {
        name: name.clone(),
        from,
        max_records: count,
        max_bytes: bytes,
        touch: true,
    };
    match node.read(req(from.unwrap_or(ReadFrom::Offset(0)))).await {
        Err(ReadError::Trimmed { start_seq, .. }) if from.is_none() => {
            node.read(req(ReadFrom::Offset(start_seq))).await
        }
        other => other,
    }
}

/// The offset a response starts at: the first record's, else where it continues.
fn first_offset(out: &ReadOutcome) -> u64 {
    out.records.first().map_or(out.next_seq, |r| r.offset)
}

/// Body and content type of a read in `format`. A large JSON read streams out as it is
/// rendered; a raw read of one record shares its bytes.
fn render(out: &ReadOutcome, format: Format) -> Result<(Body, HeaderValue), HttpError> {
    let recs = out.records.iter().map(|r| (r.offset, &r.record));
    Ok(match format {
        Format::Json if payload_len(out) > RENDER_AT_ONCE_MAX => {
            let w = JsonRecordsWriter::new(recs);
            let chunks = futures::stream::unfold(w, |mut w| async move {
                w.next_chunk().map(|c| (Ok::<Bytes, Infallible>(c), w))
            });
            (
                Body::from_stream(chunks),
                HeaderValue::from_static("application/json"),
            )
        }
        Format::Json => (
            Body::from(render_json(recs)),
            HeaderValue::from_static("application/json"),
        ),
        Format::Binary => (
            Body::from(
                encode_binary(recs)
                    .map_err(|e| HttpError::internal(format!("cannot frame records: {e}")))?,
            ),
            HeaderValue::from_static(h::CONTENT_TYPE_BINARY_BATCH),
        ),
        Format::Raw => (
            Body::from(crate::pieces::raw_body(out)),
            text_value(&out.info.content_type),
        ),
    })
}

/// Headers every read response carries.
fn read_headers(hm: &mut HeaderMap, out: &ReadOutcome) {
    set(hm, h::PICO_NEXT_SEQ, out.next_seq);
    if out.up_to_date {
        set_true(hm, h::PICO_UP_TO_DATE);
    }
    if out.closed {
        set_true(hm, h::PICO_CLOSED);
    }
}

/// The validator of a catch-up response: same stream incarnation, same range, same format,
/// same closure flag → same bytes.
pub fn etag(stream_id: u64, from: u64, next: u64, format: Format, closed: bool) -> String {
    let c = if closed { ":c" } else { "" };
    format!("\"{stream_id}:{from}:{next}:{}{c}\"", format.tag())
}

/// Whether an If-None-Match value matches `tag` (weak comparison, `*` matches anything).
pub fn if_none_match(value: &str, tag: &str) -> bool {
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_string();
    value
        .split(',')
        .any(|t| t.trim() == "*" || bare(t) == bare(tag))
}

async fn catch_up(
    node: &Node,
    name: &StreamName,
    q: &ReadQuery,
    headers: &HeaderMap,
) -> Result<Response, HttpError> {
    let out = read_once(node, name, q.from, q.count, q.bytes).await?;
    // `seq=now` answers "where is the tail right now": never cache it.
    let cacheable = q.from != Some(ReadFrom::Now);
    let tag = etag(
        out.info.stream_id,
        first_offset(&out),
        out.next_seq,
        q.format,
        out.closed,
    );
    if cacheable
        && let Some(inm) = header_list(headers, "if-none-match")?
        && if_none_match(&inm, &tag)
    {
        let mut resp = StatusCode::NOT_MODIFIED.into_response();
        let hm = resp.headers_mut();
        hm.insert(header::ETAG, text_value(&tag));
        hm.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static(CACHE_CATCH_UP),
        );
        read_headers(hm, &out);
        return Ok(resp);
    }
    let (body, ct) = render(&out, q.format)?;
    let mut resp = Response::new(body);
    let hm = resp.headers_mut();
    hm.insert(header::CONTENT_TYPE, ct);
    read_headers(hm, &out);
    if cacheable {
        hm.insert(header::ETAG, text_value(&tag));
        hm.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static(CACHE_CATCH_UP),
        );
    } else {
        no_store(hm);
    }
    Ok(resp)
}

async fn long_poll(node: &Node, name: &StreamName, q: &ReadQuery) -> Result<Response, HttpError> {
    let cursor = node.live_cursor(q.cursor);
    let mut out = read_once(node, name, q.from, q.count, q.bytes).await?;
    if out.records.is_empty() && !out.closed {
        let req = ReadRequest {
            name: name.clone(),
            from: ReadFrom::Offset(out.next_seq),
            max_records: q.count,
            max_bytes: q.bytes,
            touch: true,
        };
        match node.long_poll(req, node.config().long_poll_timeout).await? {
            LongPoll::Data(o) | LongPoll::Closed(o) => out = o,
            LongPoll::Timeout => {}
        }
    }
    let mut resp = if out.records.is_empty() {
        let mut resp = StatusCode::NO_CONTENT.into_response();
        // Nothing new: the reader is at the tail.
        out.up_to_date = true;
        read_headers(resp.headers_mut(), &out);
        resp
    } else {
        let (body, ct) = render(&out, q.format)?;
        let mut resp = Response::new(body);
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
        read_headers(resp.headers_mut(), &out);
        resp
    };
    let hm = resp.headers_mut();
    set(hm, h::PICO_CURSOR, cursor);
    no_store(hm);
    Ok(resp)
}

/// SSE: `event: data` (id = next seq, data = JSON array) then `event: control`
/// (`{"next_seq":N,"up_to_date":bool,"closed"?:true}`); ends at close or after
/// `sse_max_duration` (clients resume with `Last-Event-ID`).
fn sse(node: Node, name: StreamName, q: ReadQuery, first: ReadOutcome) -> Response {
    let deadline = Instant::now() + node.config().sse_max_duration;
    let poll = node.config().long_poll_timeout;
    let mut st = SseState {
        node,
        name,
        stream_id: first.info.stream_id,
        count: q.count,
        bytes: q.bytes,
        deadline,
        poll,
        pending: Pieces::default(),
        next: 0,
        done: false,
        hub: None,
        _open: SseOpen::new("pico"),
    };
    let caught_up = st.absorb(first, true);
    let events = KeepAlive {
        inner: Box::pin(sse_events(st, caught_up)),
        timer: Box::pin(tokio::time::sleep(SSE_KEEP_ALIVE)),
    };
    let mut resp = Response::new(Body::from_stream(events));
    let hm = resp.headers_mut();
    hm.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    no_store(hm);
    resp
}

/// An SSE event: `event`, an optional `id`, one `data` line (`data` holds no line break: JSON
/// as `serde_json` writes it), as axum's `Event` renders them.
fn event_bytes(event: &str, id: Option<u64>, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + event.len() + 40);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.push(b'\n');
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.to_string().as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// `event: data` around a [`JsonRecordsWriter`].
struct DataEvent {
    head: Option<Bytes>,
    json: JsonRecordsWriter,
    ended: bool,
}

impl Render for DataEvent {
    fn next_chunk(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        let Some(chunk) = self.json.next_chunk() else {
            self.ended = true;
            return Some(Bytes::from_static(b"\n\n"));
        };
        Some(match self.head.take() {
            Some(head) => {
                let mut v = Vec::with_capacity(head.len() + chunk.len());
                v.extend_from_slice(&head);
                v.extend_from_slice(&chunk);
                Bytes::from(v)
            }
            None => chunk,
        })
    }
}

/// Sends an SSE comment (`:`) whenever the events have paused for [`SSE_KEEP_ALIVE`].
struct KeepAlive<S> {
    inner: Pin<Box<S>>,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<S: Stream<Item = Bytes>> Stream for KeepAlive<S> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let out = match this.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(b)) => b,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {
                if this.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                Bytes::from_static(b":\n\n")
            }
        };
        this.timer.as_mut().reset(Instant::now() + SSE_KEEP_ALIVE);
        Poll::Ready(Some(Ok(out)))
    }
}

/// The `event: data` of a read small enough to render at once.
fn data_event(records: &[ReadRecord], next: u64) -> Bytes {
    let recs = records.iter().map(|r| (r.offset, &r.record));
    event_bytes("data", Some(next), render_json(recs).as_bytes())
}

/// Whether a hub frame holds exactly what a subscriber's own read with these limits would at
/// the hub's moment: all of it fits its `count` / `bytes`, and a frame cut short by the
/// server's limits is only taken by a subscriber without limits of its own.
fn fits(count: Option<usize>, bytes: Option<usize>, f: &Frame) -> bool {
    let n = f.records.len();
    if count.is_none() && bytes.is_none() {
        return true;
    }
    (f.up_to_date || f.closed)
        && count.is_none_or(|c| n <= c.clamp(1, MAX_READ_RECORDS))
        && bytes.is_none_or(|b| n <= 1 || f.payload_len <= b)
}

/// Encodes a hub frame once for the Pico subscribers with one pair of limits: the events
/// [`SseState::take`] would queue, rendered at once.
struct GroupEncoder {
    count: Option<usize>,
    bytes: Option<usize>,
}

impl Encoder for GroupEncoder {
    fn encode(&self, f: &Frame) -> Option<Vec<Bytes>> {
        if f.unshared || f.payload_len > RENDER_AT_ONCE_MAX || !fits(self.count, self.bytes, f) {
            return None;
        }
        let mut out = Vec::new();
        if !f.records.is_empty() {
            // Shared with the groups of other limits.
            out.push(f.rendered(PICO_DATA, |f| data_event(&f.records, f.next)));
        }
        if !f.records.is_empty() || f.closed {
            out.push(control(f.next, f.up_to_date, f.closed));
        }
        Some(out)
    }
}

struct SseState {
    node: Node,
    name: StreamName,
    /// The incarnation being streamed (a re-created name is another stream: end instead).
    stream_id: u64,
    count: Option<usize>,
    bytes: Option<usize>,
    deadline: Instant,
    /// Longest single wait; a keep-alive control follows each one that times out.
    poll: Duration,
    /// Events to send; at most three per step, so bounded (a large one is rendered as it goes).
    pending: Pieces,
    next: u64,
    done: bool,
    /// The stream's live hub, joined on first catching up and kept while it lives, so frames
    /// published while this subscriber writes or reads wait in its channel.
    hub: Option<Subscription>,
    /// Counts this response in `pico_http_sse_streams` until the body is dropped.
    _open: SseOpen,
}

fn control(next_seq: u64, up_to_date: bool, closed: bool) -> Bytes {
    let mut v = json!({ "next_seq": next_seq, "up_to_date": up_to_date });
    if closed {
        v["closed"] = json!(true);
    }
    event_bytes("control", None, v.to_string().as_bytes())
}

impl SseState {
    /// Queues the events for one read. Returns whether the reader is caught up (should wait).
    fn absorb(&mut self, out: ReadOutcome, first: bool) -> bool {
        let len = payload_len(&out);
        self.queue(&out.records, len, out.next_seq);
        self.end_step(
            !out.records.is_empty(),
            out.next_seq,
            out.up_to_date,
            out.closed,
            first,
        )
    }

    /// Queues the events of a hub frame too large to render at once, rendered for this
    /// subscriber as they are sent.
    fn take(&mut self, f: &Frame) -> bool {
        self.queue(&f.records, f.payload_len, f.next);
        self.end_step(!f.records.is_empty(), f.next, f.up_to_date, f.closed, false)
    }

    /// Queues the `event: data` of `records`, which end at `next`.
    fn queue(&mut self, records: &[ReadRecord], len: usize, next: u64) {
        if records.is_empty() {
            return;
        }
        let recs = records.iter().map(|r| (r.offset, &r.record));
        if len > RENDER_AT_ONCE_MAX {
            self.pending.render(DataEvent {
                head: Some(Bytes::from(format!("event: data\nid: {next}\ndata: "))),
                json: JsonRecordsWriter::new(recs),
                ended: false,
            });
            return;
        }
        self.pending.ready(data_event(records, next));
    }

    /// After a read or frame's data: its control event, the new position, the end at close.
    fn end_step(
        &mut self,
        has_data: bool,
        next: u64,
        up_to_date: bool,
        closed: bool,
        first: bool,
    ) -> bool {
        self.next = next;
        if has_data || first || closed {
            self.pending.ready(control(next, up_to_date, closed));
        }
        if closed {
            self.done = true;
        }
        !has_data || up_to_date
    }

    /// Queues a hub delivery that starts at this subscriber's offset: its group's bytes, or,
    /// for a frame left to each subscriber, the frame rendered for this one. `None` when the
    /// frame is not what this subscriber's own read would return: read for itself.
    fn deliver(&mut self, d: &Delivery) -> Option<bool> {
        let f = &d.frame;
        let Some(parts) = &d.parts else {
            if f.unshared || !fits(self.count, self.bytes, f) {
                return None;
            }
            return Some(self.take(f));
        };
        for p in parts {
            self.pending.ready(p.clone());
        }
        let has_data = !f.records.is_empty();
        self.next = f.next;
        if f.closed {
            self.done = true;
        }
        Some(!has_data || f.up_to_date)
    }

    /// Waits up to `wait` for the hub's next frame at this subscriber's offset. `Some(caught
    /// up)` when a frame or a keep-alive was queued (or the deadline passed); `None` when this
    /// subscriber must read for itself (it lagged, the frame starts elsewhere or does not fit
    /// its limits, or the hub ended).
    async fn follow(&mut self, wait: Duration) -> Option<bool> {
        if self.hub.is_none() {
            let (count, bytes) = (self.count, self.bytes);
            let key = GroupKey {
                kind: PICO_DATA,
                params: [count, bytes].map(|l| l.map_or(u64::MAX, |l| l as u64)),
            };
            let sub = self
                .node
                .follow(&self.name, self.stream_id, self.next, key, || {
                    Arc::new(GroupEncoder { count, bytes })
                });
            // A frame the hub sent between this subscriber's last read and its joining is not
            // in its channel and would never come: read the gap instead.
            let behind = sub.hub.published() > self.next;
            self.hub = Some(sub);
            if behind {
                return None;
            }
        }
        let next = self.next;
        let sub = self.hub.as_mut()?;
        let got = tokio::time::timeout(wait, async {
            loop {
                match sub.next().await {
                    // Published before this subscriber's own read got past it.
                    Event::Delivery(d)
                        if d.frame.next <= next && d.frame.from != next && !d.frame.closed =>
                    {
                        continue;
                    }
                    e => break e,
                }
            }
        })
        .await;
        match got {
            Err(_) => {
                if Instant::now() >= self.deadline {
                    self.done = true;
                } else {
                    self.pending.ready(control(self.next, true, false));
                }
                Some(true)
            }
            Ok(Event::Delivery(d)) if d.frame.from == self.next => self.deliver(&d),
            Ok(Event::Delivery(_)) => None,
            Ok(Event::Lagged) => {
                tracing::debug!(stream = %self.name, "sse subscriber lagged its hub");
                None
            }
            Ok(Event::Ended) => {
                // The hub ended (closed, deleted, read error): the read path decides what that
                // means for this subscriber; a later catch-up joins a fresh hub.
                self.hub = None;
                None
            }
        }
    }

    fn fail(&mut self, err: HttpError) {
        let body = json!({ "error": err.code, "message": err.message });
        self.pending
            .ready(event_bytes("error", None, body.to_string().as_bytes()));
        self.done = true;
    }

    /// Follows the stream's hub while caught up (bounded by the deadline); otherwise, or when
    /// the hub's frames do not line up, reads and queues events itself.
    async fn step(&mut self, caught_up: bool) -> bool {
        if caught_up {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.done = true;
                return true;
            }
            if let Some(caught_up) = self.follow(left.min(self.poll)).await {
                return caught_up;
            }
        } else if Instant::now() >= self.deadline {
            self.done = true;
            return true;
        }
        let from = Some(ReadFrom::Offset(self.next));
        match read_once(&self.node, &self.name, from, self.count, self.bytes).await {
            Ok(out) if out.info.stream_id != self.stream_id => {
                self.fail(HttpError::not_found(format!(
                    "stream was deleted and re-created: name=`{}`",
                    self.name
                )));
                true
            }
            Ok(out) => {
                let progressed = !out.records.is_empty() || out.closed;
                let caught_up = self.absorb(out, false);
                if caught_up && !progressed {
                    // A wake-up with nothing to read (view lag): back off instead of spinning.
                    tokio::time::sleep(SPURIOUS_WAKE_BACKOFF).await;
                }
                caught_up
            }
            Err(e) => {
                self.fail(HttpError::from(e));
                true
            }
        }
    }
}

fn sse_events(st: SseState, caught_up: bool) -> impl Stream<Item = Bytes> {
    futures::stream::unfold((st, caught_up), |(mut st, mut caught_up)| async move {
        loop {
            if let Some(b) = st.pending.next_bytes() {
                return Some((b, (st, caught_up)));
            }
            if st.done {
                return None;
            }
            caught_up = st.step(caught_up).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(query: &str) -> Result<ReadQuery, HttpError> {
        let uri: Uri = format!("/s?{query}").parse().unwrap();
        ReadQuery::parse(&Params::parse(&uri)?)
    }

    #[test]
    fn query_defaults_and_forms() {
        let d = q("").unwrap();
        assert_eq!(
            d,
            ReadQuery {
                from: None,
                count: None,
                bytes: None,
                format: Format::Json,
                live: Live::CatchUp,
                cursor: None,
            }
        );
        let full = q("seq=5&count=10&bytes=100&format=binary&live=long-poll&cursor=42").unwrap();
        assert_eq!(full.from, Some(ReadFrom::Offset(5)));
        assert_eq!((full.count, full.bytes), (Some(10), Some(100)));
        assert_eq!(
            (full.format, full.live, full.cursor),
            (Format::Binary, Live::LongPoll, Some(42))
        );
        assert_eq!(q("seq=now&live=sse").unwrap().from, Some(ReadFrom::Now));
        for bad in [
            "seq=",
            "seq=05",
            "seq=now1",
            "count=-1",
            "format=",
            "live=sse&format=binary",
        ] {
            assert_eq!(q(bad).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn etags_and_if_none_match() {
        let t = etag(7, 0, 3, Format::Json, false);
        assert_eq!(t, "\"7:0:3:j\"");
        assert_eq!(etag(7, 0, 3, Format::Raw, true), "\"7:0:3:r:c\"");
        assert!(if_none_match(&t, &t));
        assert!(if_none_match(&format!("\"x\", W/{t}"), &t));
        assert!(if_none_match("*", &t));
        assert!(!if_none_match("\"7:0:4:j\"", &t));
    }
}
