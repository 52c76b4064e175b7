//! `GET ?live=sse`: every read becomes `event: data` (the chunk: text, a JSON array, or base64
//! for non-text types) immediately followed by `event: control` (`streamNextOffset`,
//! `streamCursor` while open, `upToDate`, `streamClosed`). A closed stream ends the response after
//! its final control; otherwise it ends after `sse_max_duration` (clients resume from the last
//! `streamNextOffset`). Each wait that times out sends a keep-alive control.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use pico_common::StreamName;
use pico_protocol::OffsetSpec;
use pico_protocol::format_offset;
use pico_protocol::headers as h;
use pico_server::{ReadOutcome, WaitOutcome, is_json};
use serde_json::json;
use tokio::time::Instant;

use super::error::DsError;
use super::headers::ReadQuery;
use super::read::{body_of, cursor, read_from};
use super::{Ds, set, sse_is_text};

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

struct SseState {
    ds: Ds,
    name: StreamName,
    /// The incarnation being streamed: a stream deleted and re-created under the same name
    /// is another stream, and this response ends rather than continue into it.
    stream_id: u64,
    json: bool,
    text: bool,
    cursor: u64,
    next: u64,
    caught_up: bool,
    done: bool,
    deadline: Instant,
    poll: Duration,
    /// Frames ready to send; at most two per step, so bounded.
    pending: VecDeque<Bytes>,
}

impl SseState {
    fn control(&self, next: u64, up_to_date: bool, closed: bool) -> Bytes {
        let mut v = json!({ "streamNextOffset": format_offset(next) });
        if closed {
            v["streamClosed"] = json!(true);
        } else {
            v["streamCursor"] = json!(self.cursor.to_string());
        }
        if up_to_date {
            v["upToDate"] = json!(true);
        }
        let mut out = Vec::new();
        frame(&mut out, "control", &v.to_string());
        Bytes::from(out)
    }

    /// Queues the frames of one read.
    fn absorb(&mut self, out: &ReadOutcome, first: bool) {
        let has_data = !out.records.is_empty();
        // A data event and its control event go out as one chunk: one socket write per
        // subscriber per batch instead of two (it matters with thousands of subscribers).
        let mut buf = Vec::new();
        if has_data {
            let body = body_of(out, self.json);
            let payload = if self.text {
                String::from_utf8_lossy(&body).into_owned()
            } else {
                STANDARD.encode(&body)
            };
            buf.reserve(payload.len() + 160);
            frame(&mut buf, "data", &payload);
        }
        if has_data || first || out.closed {
            let c = self.control(out.next_seq, out.up_to_date || out.closed, out.closed);
            buf.extend_from_slice(&c);
        }
        if !buf.is_empty() {
            self.pending.push_back(Bytes::from(buf));
        }
        self.next = out.next_seq;
        self.caught_up = out.up_to_date;
        if out.closed {
            self.done = true;
        }
    }

    async fn step(&mut self) {
        if Instant::now() >= self.deadline {
            self.done = true;
            return;
        }
        if self.caught_up {
            let left = self.deadline.saturating_duration_since(Instant::now());
            match self
                .ds
                .node
                .wait(&self.name, self.next, left.min(self.poll))
                .await
            {
                Ok(WaitOutcome::Timeout) => {
                    if Instant::now() < self.deadline {
                        let c = self.control(self.next, true, false);
                        self.pending.push_back(c);
                    } else {
                        self.done = true;
                    }
                    return;
                }
                Ok(WaitOutcome::Data | WaitOutcome::Closed) => {}
                Err(_) => {
                    // Deleted or expired while streaming: end the response.
                    self.done = true;
                    return;
                }
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

pub async fn sse(ds: &Ds, name: StreamName, q: &ReadQuery) -> Result<Response, DsError> {
    // A missing stream or a bad offset is a plain error response, not an event.
    let first = read_from(ds, &name, q.offset, true).await?;
    let ct = first.info.content_type.clone();
    let text = sse_is_text(&ct);
    let cfg = ds.node.config();
    let mut st = SseState {
        ds: ds.clone(),
        name,
        stream_id: first.info.stream_id,
        json: is_json(&ct),
        text,
        cursor: cursor(q.cursor),
        next: first.next_seq,
        caught_up: false,
        done: false,
        deadline: Instant::now() + cfg.sse_max_duration,
        poll: cfg.long_poll_timeout,
        pending: VecDeque::new(),
    };
    st.absorb(&first, true);
    let stream = futures::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(b) = st.pending.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), st));
            }
            if st.done {
                return None;
            }
            st.step().await;
        }
    });
    let mut resp = Response::new(Body::from_stream(stream));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn f(event: &str, payload: &str) -> String {
        let mut out = Vec::new();
        frame(&mut out, event, payload);
        String::from_utf8(out).unwrap()
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
