//! The body of a catch-up read that does not fit one page: every record from the first page up to
//! the tail as of the request, fetched a page at a time as the client takes the body.
//!
//! Real clients (the TypeScript and Python DS clients) end a `live: false` read after its first
//! response, `Stream-Up-To-Date` or not, so a catch-up response must hold everything up to the
//! tail. The tail is a snapshot taken by the first page: the headers (`Stream-Next-Offset`, the
//! ETag) go out before the body and must describe it. Pages are at most `--max-chunk-size` of
//! records (or one larger record) and the next one is read only when the previous one has been
//! handed to the connection, so a reader of a 1 GiB stream holds about one page, not the stream.
//!
//! A page that fails after the headers went out (the stream was deleted, trimmed under the
//! reader, or re-created) ends the body with an error: the connection drops the response rather
//! than let a prefix pass for the whole range.

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use pico_common::StreamName;
use pico_protocol::OffsetSpec;
use pico_server::ReadOutcome;
use thiserror::Error;

use super::Ds;
use super::read::read_from;

/// Why a body stopped before its announced end.
#[derive(Debug, Error)]
#[error("catch-up read stopped before its end: stream={name} offset={offset} end={end}: {reason}")]
pub struct PageError {
    name: StreamName,
    offset: u64,
    end: u64,
    reason: String,
}

/// Records `[first page's start, end)` of `first`'s stream, rendered as concatenated values or,
/// for JSON streams, as one JSON array across all pages.
pub fn body(ds: Ds, name: StreamName, first: ReadOutcome, end: u64, json: bool) -> Body {
    let pages = Pages {
        ds,
        name,
        stream_id: first.info.stream_id,
        next: first.records.first().map_or(first.next_seq, |r| r.offset),
        end,
        json,
        page: Some(first),
        values_sent: false,
        done: false,
    };
    Body::from_stream(futures::stream::try_unfold(pages, Pages::next_chunk))
}

struct Pages {
    ds: Ds,
    name: StreamName,
    /// The incarnation the headers describe: a page from a re-created stream of the same name is
    /// an error, not a continuation.
    stream_id: u64,
    /// The first offset not sent yet.
    next: u64,
    /// The tail at the request's start: the body ends there.
    end: u64,
    json: bool,
    /// A page read but not sent yet (the first one, read before the headers).
    page: Option<ReadOutcome>,
    /// Some JSON value went out, so the next one needs a comma.
    values_sent: bool,
    done: bool,
}

impl Pages {
    async fn next_chunk(mut self) -> Result<Option<(Bytes, Pages)>, PageError> {
        if self.done {
            return Ok(None);
        }
        if self.next >= self.end && self.page.is_none() {
            self.done = true;
            if self.json {
                return Ok(Some((Bytes::from_static(b"]"), self)));
            }
            return Ok(None);
        }
        let mut page = match self.page.take() {
            Some(p) => p,
            None => self.fetch().await?,
        };
        // A page read after the snapshot may run past it: those records belong to a later read.
        page.records.retain(|r| r.offset < self.end);
        // Offsets are consecutive from `next`; anything else would silently skip records.
        match (page.records.first(), page.records.last()) {
            (Some(first), Some(last)) if first.offset == self.next => self.next = last.offset + 1,
            _ => return Err(self.error("no records where the stream has some")),
        }
        let bytes = if self.json {
            self.json_piece(&page)
        } else {
            crate::pieces::raw_body(&page)
        };
        Ok(Some((bytes, self)))
    }

    async fn fetch(&self) -> Result<ReadOutcome, PageError> {
        let page = read_from(&self.ds, &self.name, OffsetSpec::At(self.next), false)
            .await
            .map_err(|e| self.error(&e.message))?;
        if page.info.stream_id != self.stream_id {
            return Err(self.error("the stream was deleted and re-created"));
        }
        Ok(page)
    }

    /// The page's values as the next part of one JSON array: `[` before the first value,
    /// commas between values (also across pages); `]` comes after the last page.
    fn json_piece(&mut self, page: &ReadOutcome) -> Bytes {
        let len: usize = page.records.iter().map(|r| r.record.value.len() + 1).sum();
        let mut buf = BytesMut::with_capacity(len + 1);
        for r in &page.records {
            buf.extend_from_slice(if self.values_sent { b"," } else { b"[" });
            buf.extend_from_slice(&r.record.value);
            self.values_sent = true;
        }
        buf.freeze()
    }

    fn error(&self, reason: &str) -> PageError {
        let e = PageError {
            name: self.name.clone(),
            offset: self.next,
            end: self.end,
            reason: reason.to_string(),
        };
        tracing::warn!(error = %e, "catch-up response cut short");
        e
    }
}
