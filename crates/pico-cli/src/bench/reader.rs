//! Tailers: follow one stream from its tail and measure append→delivery latency from the send
//! time stamped into every record body.
//!
//! Long-poll (Pico with `format=binary`, Durable Streams over `text/plain`) goes through
//! reqwest, one task per tailer. SSE tailers are driven by [`sse_conn`](super::sse_conn); this
//! module only says what to request and what to do with the bytes ([`SseTail`]): Pico data
//! events are JSON arrays of records, Durable Streams ones the records' bytes (text or base64).

use super::Ctx;
use super::payload::{self, Splitter, now_us};
use super::sse;
use super::target::chain;
use crate::cli::Protocol;
use base64::Engine;
use serde::Deserialize;
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub const ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Most deliveries a Durable Streams SSE tailer holds waiting for a `control` event with the
/// next offset: a server that never sends one would otherwise grow them for the whole run.
const MAX_HELD: usize = 1 << 16;

struct Tail {
    ctx: Arc<Ctx>,
    /// This reader's index (picks its latency shard).
    idx: usize,
    /// Where to resume: None = the tail at connect time.
    pos: Option<String>,
    split: Splitter,
    connected: bool,
    /// Hold deliveries until [`Tail::commit`]: a Durable Streams SSE `data` event moves the
    /// resume offset only with the `control` event after it, so records counted at once would
    /// be counted again when a response breaks between the two and is reopened.
    holding: bool,
    /// Deliveries held: (in the window, append→delivery µs if stamped, bytes).
    held: Vec<(bool, Option<u64>, u64)>,
    /// The splitter's carry at the last commit: Durable Streams offsets are byte positions, so
    /// the resume offset may fall inside a record, whose start a reopened response then lacks.
    committed_carry: Vec<u8>,
}

impl Tail {
    fn new(ctx: Arc<Ctx>, idx: usize) -> Tail {
        Tail {
            ctx,
            idx,
            pos: None,
            split: Splitter::default(),
            connected: false,
            holding: false,
            held: Vec::new(),
            committed_carry: Vec::new(),
        }
    }

    fn deliver(&mut self, body: &[u8]) {
        let t = now_us();
        let in_window = self.ctx.in_window(t);
        let latency = payload::stamp_of(body)
            .filter(|_| in_window)
            .map(|stamp| t.saturating_sub(stamp));
        let bytes = body.len() as u64;
        if self.holding {
            self.held.push((in_window, latency, bytes));
        } else {
            self.count(in_window, latency, bytes);
        }
    }

    fn count(&self, in_window: bool, latency: Option<u64>, bytes: u64) {
        if let Some(us) = latency {
            self.ctx.lat.record_e2e(self.idx, us);
        }
        self.ctx.counters.add_read(1, bytes, in_window);
    }

    /// Counts the held deliveries: the resume position has moved past them.
    fn commit(&mut self) {
        let mut held = std::mem::take(&mut self.held);
        for &(in_window, latency, bytes) in &held {
            self.count(in_window, latency, bytes);
        }
        held.clear();
        self.held = held; // keeps its capacity: one data event per append per subscriber
        self.committed_carry.clear();
        self.committed_carry.extend_from_slice(self.split.carry());
    }

    /// Drops what a broken response delivered past the resume position (it comes again), and
    /// returns the splitter to that position: the bytes of a record cut there stay, any after
    /// it go.
    fn rewind(&mut self) {
        self.held.clear();
        self.split.reset_to(&self.committed_carry);
    }

    fn feed_ds(&mut self, bytes: &[u8]) {
        let size = self.ctx.record_size;
        let mut split = std::mem::take(&mut self.split);
        split.feed(bytes, size, |r| self.deliver(r));
        self.split = split;
    }

    /// Sets the resume position, reusing the string.
    fn set_pos(&mut self, p: &str) {
        match &mut self.pos {
            Some(s) => {
                s.clear();
                s.push_str(p);
            }
            None => self.pos = Some(p.to_string()),
        }
    }

    fn mark_connected(&mut self) {
        if !self.connected {
            self.connected = true;
            self.ctx.readers_connected.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A long-poll tailer (SSE tailers run in [`sse_conn`](super::sse_conn)).
pub async fn run(ctx: Arc<Ctx>, http: reqwest::Client, idx: usize) {
    let stream = ctx.streams[idx % ctx.streams.len()].clone();
    let url = ctx.target.url(&stream);
    let mut tail = Tail::new(ctx.clone(), idx);
    // No stop signal is polled here (that would cost a poll per delivery): the bench aborts
    // the tailers when it stops, and every sample is already in the shared histogram.
    while !ctx.stopped() {
        let res = match ctx.target.protocol {
            // Kafka runs have no readers (refused at the start).
            Protocol::Pico | Protocol::Kafka => pico_long_poll(&http, &url, &mut tail).await,
            Protocol::Ds => ds_long_poll(&http, &url, &mut tail).await,
        };
        if let Err(e) = res {
            ctx.counters.error(false, ctx.in_window(now_us()), || {
                format!("reader {idx}: {e}")
            });
            tokio::time::sleep(ERROR_PAUSE).await;
        }
    }
}

/// One SSE tailer's protocol side: the request that (re)opens it and what its events mean.
pub struct SseTail {
    tail: Tail,
    /// The stream's URL, without query.
    url: String,
    parser: sse::Parser,
    /// Durable Streams data events carry base64 (`Stream-SSE-Data-Encoding`).
    base64: bool,
    /// The current response has delivered body bytes.
    got_bytes: bool,
}

impl SseTail {
    pub fn new(ctx: Arc<Ctx>, idx: usize) -> SseTail {
        let url = ctx.target.url(&ctx.streams[idx % ctx.streams.len()]);
        let mut tail = Tail::new(ctx, idx);
        tail.holding = tail.ctx.target.protocol == Protocol::Ds;
        SseTail {
            tail,
            url,
            parser: sse::Parser::default(),
            base64: false,
            got_bytes: false,
        }
    }

    /// The response ended without a byte: the caller waits before reopening, so a server that
    /// answers 200 with nothing does not get reconnects in a tight loop.
    pub fn got_nothing(&self) -> bool {
        !self.got_bytes
    }

    /// The URL to open: from where the last response left off, or the tail.
    pub fn request_url(&self) -> String {
        self.request_url_at(&self.url)
    }

    /// [`SseTail::request_url`] for the stream at `stream` (its URL without query on the node
    /// a redirect named).
    pub fn request_url_at(&self, stream: &str) -> String {
        let pos = self.tail.pos.as_deref().unwrap_or("now");
        match self.tail.ctx.target.protocol {
            Protocol::Pico | Protocol::Kafka => format!("{stream}?seq={pos}&live=sse"),
            Protocol::Ds => format!("{stream}?offset={pos}&live=sse"),
        }
    }

    /// A response was accepted: events start afresh. `encoding` is the
    /// `Stream-SSE-Data-Encoding` header.
    pub fn opened(&mut self, encoding: Option<&[u8]>) {
        self.parser = sse::Parser::default();
        self.tail.rewind();
        self.base64 = encoding == Some(b"base64");
        self.got_bytes = false;
        self.tail.mark_connected();
    }

    pub fn error(&self, e: &str) {
        let idx = self.tail.idx;
        let ctx = &self.tail.ctx;
        ctx.counters.error(false, ctx.in_window(now_us()), || {
            format!("reader {idx}: {e}")
        });
    }

    /// Handles a piece of the response body. An error ends this response (the caller reopens
    /// it from the last position).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.got_bytes |= !bytes.is_empty();
        let mut parser = std::mem::take(&mut self.parser);
        let r = match self.tail.ctx.target.protocol {
            Protocol::Pico | Protocol::Kafka => {
                parser.feed(bytes, |ev| pico_event(&mut self.tail, ev))
            }
            Protocol::Ds => {
                let b64 = self.base64;
                parser.feed(bytes, |ev| ds_event(&mut self.tail, b64, ev))
            }
        };
        self.parser = parser;
        r
    }
}

/// A record of a Pico SSE `data` event (only the body matters here).
#[derive(Deserialize)]
struct PicoRecord<'a> {
    #[serde(borrow, default)]
    body: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct PicoControl {
    #[serde(default)]
    next_seq: Option<u64>,
    #[serde(default)]
    closed: bool,
}

/// The fields of a Durable Streams `control` event the tailer follows; typed, so parsing one
/// per subscriber per append builds no JSON tree.
#[derive(Deserialize)]
struct DsControl<'a> {
    #[serde(rename = "streamNextOffset", borrow, default)]
    next: Option<Cow<'a, str>>,
    #[serde(rename = "streamClosed", default)]
    closed: bool,
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

async fn get(http: &reqwest::Client, url: &str) -> Result<reqwest::Response, String> {
    let resp = super::redirect::send(
        http,
        reqwest::Method::GET,
        url,
        reqwest::header::HeaderMap::new(),
        None,
    )
    .await
    .map_err(|e| chain(&e))?;
    let status = resp.status();
    if status.is_success() {
        Ok(resp)
    } else {
        let body = resp.text().await.unwrap_or_default();
        Err(format!("read: http {status}: {}", body.trim()))
    }
}

/// Learns the tail with a catch-up read at `now` (`next_header` names the next position): a
/// long-poll on an idle stream answers nothing, not even headers, until data or its timeout,
/// so it cannot tell that the reader is in place.
async fn learn_tail(
    http: &reqwest::Client,
    now_url: &str,
    next_header: &str,
    t: &mut Tail,
) -> Result<(), String> {
    let resp = get(http, now_url).await?;
    let next = header(&resp, next_header)
        .ok_or_else(|| format!("catch-up answer without {next_header}"))?;
    t.pos = Some(next.to_string());
    t.mark_connected();
    Ok(())
}

/// One long-poll round: `GET ?seq=&format=binary&live=long-poll`.
async fn pico_long_poll(http: &reqwest::Client, url: &str, t: &mut Tail) -> Result<(), String> {
    let Some(seq) = t.pos.clone() else {
        return learn_tail(
            http,
            &format!("{url}?seq=now&format=binary"),
            "pico-next-seq",
            t,
        )
        .await;
    };
    let resp = get(
        http,
        &format!("{url}?seq={seq}&format=binary&live=long-poll"),
    )
    .await?;
    let next = header(&resp, "pico-next-seq").map(str::to_string);
    if resp.status().as_u16() == 200 {
        let body = resp.bytes().await.map_err(|e| chain(&e))?;
        let recs = pico_protocol::decode_binary(&body).map_err(|e| e.to_string())?;
        for (_, r) in &recs {
            t.deliver(&r.value);
        }
    }
    match next {
        Some(n) => t.pos = Some(n),
        None => return Err("long-poll answer without Pico-Next-Seq".into()),
    }
    Ok(())
}

/// One long-poll round: `GET /v1/stream/x?offset=&live=long-poll`.
async fn ds_long_poll(http: &reqwest::Client, url: &str, t: &mut Tail) -> Result<(), String> {
    let Some(offset) = t.pos.clone() else {
        return learn_tail(http, &format!("{url}?offset=now"), "stream-next-offset", t).await;
    };
    let resp = get(http, &format!("{url}?offset={offset}&live=long-poll")).await?;
    let next = header(&resp, "stream-next-offset").map(str::to_string);
    if resp.status().as_u16() == 200 {
        let body = resp.bytes().await.map_err(|e| chain(&e))?;
        t.feed_ds(&body);
    }
    match next {
        Some(n) => t.pos = Some(n),
        None => return Err("long-poll answer without Stream-Next-Offset".into()),
    }
    Ok(())
}

/// A Pico SSE event: `data` is a JSON array of records, `control` carries `next_seq`.
fn pico_event(t: &mut Tail, ev: sse::Event<'_>) -> Result<(), String> {
    match ev.event {
        b"data" => {
            let recs: Vec<PicoRecord<'_>> =
                serde_json::from_slice(ev.data).map_err(|e| format!("sse data: {e}"))?;
            for r in &recs {
                if let Some(body) = &r.body {
                    t.deliver(body.as_bytes());
                }
            }
            if let Some(id) = ev.id {
                t.set_pos(&String::from_utf8_lossy(id));
            }
        }
        b"control" => {
            let c: PicoControl =
                serde_json::from_slice(ev.data).map_err(|e| format!("sse control: {e}"))?;
            if let Some(n) = c.next_seq {
                t.set_pos(&n.to_string());
            }
            // As for DS: an error, so the tailer pauses before it reopens instead of
            // reconnecting in a tight loop to a stream that will not grow.
            if c.closed {
                return Err("stream closed".to_string());
            }
        }
        // The server ends the response after it.
        b"error" => return Err(format!("sse error: {}", String::from_utf8_lossy(ev.data))),
        _ => {}
    }
    Ok(())
}

/// A Durable Streams SSE event: `data` is the records' bytes, `control` the next offset.
fn ds_event(t: &mut Tail, base64: bool, ev: sse::Event<'_>) -> Result<(), String> {
    match ev.event {
        b"data" if base64 => {
            let clean: Vec<u8> = ev
                .data
                .iter()
                .copied()
                .filter(|b| *b != b'\r' && *b != b'\n')
                .collect();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(clean)
                .map_err(|e| format!("sse base64: {e}"))?;
            t.feed_ds(&bytes);
        }
        b"data" => t.feed_ds(ev.data),
        b"control" => {
            let c: DsControl<'_> =
                serde_json::from_slice(ev.data).map_err(|e| format!("sse control: {e}"))?;
            if let Some(n) = c.next {
                t.set_pos(&n);
                t.commit();
            }
            if c.closed {
                return Err("stream closed".to_string());
            }
        }
        _ => {}
    }
    if t.held.len() > MAX_HELD {
        return Err(format!(
            "sse: {MAX_HELD} records without a control event giving the next offset"
        ));
    }
    Ok(())
}

/// A bench context for unit tests: one stream `s`, 16-byte records, the window always open.
#[cfg(test)]
pub(super) fn test_ctx(protocol: Protocol) -> Arc<Ctx> {
    use crate::bench::target::Target;
    use std::sync::atomic::{AtomicU64, AtomicUsize};
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    Arc::new(Ctx {
        target: Target::new(protocol, "http://127.0.0.1:1"),
        streams: vec!["s".into()],
        run_id: "t".into(),
        batch: 1,
        record_size: 16,
        in_flight: 1,
        http2: false,
        token: None,
        pacer: None,
        counters: Default::default(),
        lat: Default::default(),
        measure_start: AtomicU64::new(0),
        measure_end: AtomicU64::new(u64::MAX),
        stop,
        readers_connected: AtomicUsize::new(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(protocol: Protocol) -> Tail {
        Tail::new(test_ctx(protocol), 0)
    }

    fn event<'a>(event: &'a [u8], data: &'a [u8]) -> sse::Event<'a> {
        sse::Event {
            event,
            id: None,
            data,
        }
    }

    /// A Durable Streams data event counts once its control event moves the resume offset: a
    /// response broken between the two is reopened from the old offset, and the records come
    /// again, so counting them at once would count them twice.
    #[test]
    fn ds_records_count_when_the_offset_moves_past_them() {
        let mut s = SseTail::new(tail(Protocol::Ds).ctx, 0);
        let rec = payload::record(16, 1);
        let control = br#"{"streamNextOffset":"2"}"#;
        let feed = |s: &mut SseTail, ev: &[u8], data: &[u8]| {
            ds_event(&mut s.tail, false, event(ev, data)).unwrap();
            s.tail.ctx.counters.snapshot_all().read_records
        };
        s.opened(None);
        assert_eq!(feed(&mut s, b"data", &rec), 0, "held until its control");
        s.opened(None); // the response broke before the control: reopened
        assert_eq!(feed(&mut s, b"data", &rec), 0);
        assert_eq!(feed(&mut s, b"control", control), 1, "counted once");
        assert_eq!(s.tail.pos.as_deref(), Some("2"));
    }

    /// Durable Streams offsets are byte positions: a data event may end inside a record and its
    /// control put the resume offset there. A response broken after that is reopened from the
    /// offset, so the record's first bytes do not come again and must be kept; bytes delivered
    /// past the offset are dropped. Before, the reopen cleared the cut record and every later
    /// record was split at the wrong place (stamps lost or misread).
    #[test]
    fn ds_reopen_keeps_a_record_cut_at_the_resume_offset() {
        let mut s = SseTail::new(tail(Protocol::Ds).ctx, 0);
        let (r1, r2) = (payload::record(16, 1), payload::record(16, 2));
        let feed = |s: &mut SseTail, ev: &[u8], data: &[u8]| {
            ds_event(&mut s.tail, false, event(ev, data)).unwrap();
            s.tail.ctx.counters.snapshot_all().read_records
        };
        s.opened(None);
        feed(&mut s, b"data", &r1[..10]);
        feed(&mut s, b"control", br#"{"streamNextOffset":"10"}"#);
        feed(&mut s, b"data", &r1[10..13]); // past the offset, then the response breaks
        s.opened(None);
        feed(&mut s, b"data", &r1[10..]);
        feed(&mut s, b"data", &r2);
        assert_eq!(feed(&mut s, b"control", br#"{"streamNextOffset":"32"}"#), 2);
        let e2e = s.tail.ctx.lat.e2e();
        assert_eq!(e2e.len(), 2, "both records' stamps read");
    }

    /// A server that sends data but never a control event with the next offset ends the
    /// response with an error once the tailer holds too many records, instead of holding more
    /// for the whole run.
    #[test]
    fn ds_holding_is_bounded() {
        let mut t = tail(Protocol::Ds);
        t.holding = true;
        let rec = payload::record(16, 1);
        let mut res = Ok(());
        for _ in 0..=MAX_HELD {
            res = ds_event(&mut t, false, event(b"data", &rec));
            if res.is_err() {
                break;
            }
        }
        assert!(res.unwrap_err().contains("control event"));
        assert!(t.held.len() <= MAX_HELD + 1);
    }

    /// A closed stream or an `error` event ends the response as an error (so the tailer pauses
    /// before reopening), in both protocols; a plain control only moves the position.
    #[test]
    fn closed_streams_and_error_events_are_errors() {
        let mut t = tail(Protocol::Pico);
        assert_eq!(
            pico_event(&mut t, event(b"control", br#"{"next_seq":5}"#)),
            Ok(())
        );
        assert_eq!(t.pos.as_deref(), Some("5"));
        let closed = br#"{"next_seq":7,"up_to_date":true,"closed":true}"#;
        assert!(pico_event(&mut t, event(b"control", closed)).is_err());
        assert_eq!(t.pos.as_deref(), Some("7"));
        let err = pico_event(&mut t, event(b"error", br#"{"error":"gone"}"#)).unwrap_err();
        assert!(err.contains("gone"), "{err}");

        let mut t = tail(Protocol::Ds);
        let closed = br#"{"streamNextOffset":"9","streamClosed":true}"#;
        assert!(ds_event(&mut t, false, event(b"control", closed)).is_err());
        assert_eq!(t.pos.as_deref(), Some("9"));
    }
}
