//! Strict parsing of Durable Streams request headers and query parameters. Malformed values are
//! 400s naming the header; `Stream-Closed` is the exception (anything but `true` means absent).

use axum::http::header::{AsHeaderName, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Uri};
use pico_protocol::headers as h;
use pico_protocol::{OffsetSpec, parse_offset, parse_strict_u64};
use pico_server::ProducerClaim;

use super::error::DsError;
use crate::headers::{Live, header_str, parse_rfc3339_ms, single_str, validate_content_type};

/// Producer epochs and sequences must stay exact in JavaScript.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

// Built at compile time: looking a header up by `&str` parses the name on every call.
const STREAM_CLOSED: HeaderName = HeaderName::from_static(h::DS_STREAM_CLOSED);
const STREAM_SEQ: HeaderName = HeaderName::from_static(h::DS_STREAM_SEQ);
const PRODUCER_ID: HeaderName = HeaderName::from_static(h::DS_PRODUCER_ID);
const PRODUCER_EPOCH: HeaderName = HeaderName::from_static(h::DS_PRODUCER_EPOCH);
const PRODUCER_SEQ: HeaderName = HeaderName::from_static(h::DS_PRODUCER_SEQ);

fn strict<K>(headers: &HeaderMap, name: K) -> Result<Option<u64>, DsError>
where
    K: AsHeaderName + std::fmt::Display + Copy,
{
    strict_of(header_str(headers, name)?, name)
}

fn strict_of<N: std::fmt::Display>(v: Option<&str>, name: N) -> Result<Option<u64>, DsError> {
    v.map(|s| {
        parse_strict_u64(s)
            .map_err(|e| DsError::bad_request(format!("bad header: header={name} {e}")))
    })
    .transpose()
}

/// The values a request carries under one name: the first, and whether more followed.
#[derive(Debug, Clone, Copy, Default)]
struct Found<'a> {
    first: Option<&'a HeaderValue>,
    repeated: bool,
}

impl<'a> Found<'a> {
    fn lookup(headers: &'a HeaderMap, name: &HeaderName) -> Found<'a> {
        let mut values = headers.get_all(name).iter();
        Found {
            first: values.next(),
            repeated: values.next().is_some(),
        }
    }

    fn see(&mut self, value: &'a HeaderValue) {
        match self.first {
            Some(_) => self.repeated = true,
            None => self.first = Some(value),
        }
    }

    /// As [`header_str`] answers.
    fn text(&self, name: &HeaderName) -> Result<Option<&'a str>, DsError> {
        Ok(single_str(name, self.first, self.repeated)?)
    }
}

/// `Stream-Closed: true` (case-insensitive); any other value is treated as absent.
pub fn closed(headers: &HeaderMap) -> Result<bool, DsError> {
    closed_of(Found::lookup(headers, &STREAM_CLOSED))
}

fn closed_of(v: Found<'_>) -> Result<bool, DsError> {
    Ok(v.text(&STREAM_CLOSED)?
        .is_some_and(|v| v.eq_ignore_ascii_case("true")))
}

/// TTL and expiry of a PUT: strict decimal seconds, RFC 3339; both together is a 400.
pub fn ttl_and_expiry(headers: &HeaderMap) -> Result<(Option<u64>, Option<i64>), DsError> {
    let ttl = strict(headers, h::DS_STREAM_TTL)?;
    let expires = header_str(headers, h::DS_STREAM_EXPIRES_AT)?
        .map(parse_rfc3339_ms)
        .transpose()?;
    if ttl.is_some() && expires.is_some() {
        return Err(DsError::bad_request(
            "send either Stream-TTL or Stream-Expires-At, not both",
        ));
    }
    Ok((ttl, expires))
}

/// The request's content type, validated (`None` when absent).
pub fn content_type(headers: &HeaderMap) -> Result<Option<String>, DsError> {
    content_type_of(Found::lookup(headers, &CONTENT_TYPE))
}

fn content_type_of(v: Found<'_>) -> Result<Option<String>, DsError> {
    v.text(&CONTENT_TYPE)?
        .filter(|ct| !ct.is_empty())
        .map(|ct| validate_content_type(ct).map(|()| ct.to_string()))
        .transpose()
        .map_err(DsError::from)
}

/// The producer triple: all three or none; id non-empty; integers strict and ≤ 2^53−1.
pub fn producer(headers: &HeaderMap) -> Result<Option<ProducerClaim>, DsError> {
    producer_of(
        Found::lookup(headers, &PRODUCER_ID),
        Found::lookup(headers, &PRODUCER_EPOCH),
        Found::lookup(headers, &PRODUCER_SEQ),
    )
}

fn producer_of(
    id: Found<'_>,
    epoch: Found<'_>,
    seq: Found<'_>,
) -> Result<Option<ProducerClaim>, DsError> {
    let id = id.text(&PRODUCER_ID)?;
    let epoch = strict_of(epoch.text(&PRODUCER_EPOCH)?, &PRODUCER_EPOCH)?;
    let seq = strict_of(seq.text(&PRODUCER_SEQ)?, &PRODUCER_SEQ)?;
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            if id.is_empty() || id.len() > crate::headers::MAX_PRODUCER_ID_LEN {
                return Err(DsError::bad_request(format!(
                    "bad Producer-Id: len={} (want 1..={})",
                    id.len(),
                    crate::headers::MAX_PRODUCER_ID_LEN
                )));
            }
            if epoch > MAX_SAFE_INTEGER || seq > MAX_SAFE_INTEGER {
                return Err(DsError::bad_request(
                    "Producer-Epoch and Producer-Seq must be at most 2^53-1",
                ));
            }
            Ok(Some(ProducerClaim {
                id: id.to_string(),
                epoch,
                seq,
            }))
        }
        _ => Err(DsError::bad_request(
            "send all of Producer-Id, Producer-Epoch, Producer-Seq or none",
        )),
    }
}

/// `Stream-Seq`, an opaque string compared byte-wise.
pub fn stream_seq(headers: &HeaderMap) -> Result<Option<String>, DsError> {
    stream_seq_of(Found::lookup(headers, &STREAM_SEQ))
}

fn stream_seq_of(v: Found<'_>) -> Result<Option<String>, DsError> {
    Ok(v.text(&STREAM_SEQ)?.map(str::to_string))
}

/// The headers of a DS `POST`, parsed as [`closed`], [`producer`], [`stream_seq`] and
/// [`content_type`] parse them (same values, same errors, checked in that order).
#[derive(Debug)]
pub struct AppendHeaders {
    pub close: bool,
    pub producer: Option<ProducerClaim>,
    pub stream_seq: Option<String>,
    pub content_type: Option<String>,
}

impl AppendHeaders {
    /// One pass over the request's headers (a few, usually) instead of a hashed lookup per name:
    /// every append makes this call, and six lookups cost more than the pass.
    pub fn parse(headers: &HeaderMap) -> Result<AppendHeaders, DsError> {
        let [
            mut closed,
            mut id,
            mut epoch,
            mut seq,
            mut stream_seq,
            mut ct,
        ] = [Found::default(); 6];
        for (name, value) in headers {
            let slot = if *name == CONTENT_TYPE {
                &mut ct
            } else {
                match name.as_str() {
                    h::DS_STREAM_CLOSED => &mut closed,
                    h::DS_PRODUCER_ID => &mut id,
                    h::DS_PRODUCER_EPOCH => &mut epoch,
                    h::DS_PRODUCER_SEQ => &mut seq,
                    h::DS_STREAM_SEQ => &mut stream_seq,
                    _ => continue,
                }
            };
            slot.see(value);
        }
        // In the lookups' order, so the first error is theirs.
        let close = closed_of(closed)?;
        // Most appends carry no producer: nothing of it to check.
        let producer = match (id.first, epoch.first, seq.first) {
            (None, None, None) => None,
            _ => producer_of(id, epoch, seq)?,
        };
        Ok(AppendHeaders {
            close,
            producer,
            stream_seq: stream_seq_of(stream_seq)?,
            content_type: content_type_of(ct)?,
        })
    }
}

/// Fork headers of a PUT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkHeaders {
    /// The source as sent (a path, possibly a full URL).
    pub source: String,
    /// `None` = the source's tail.
    pub offset: Option<u64>,
    pub sub_offset: u64,
}

pub fn fork(headers: &HeaderMap) -> Result<Option<ForkHeaders>, DsError> {
    let source = header_str(headers, h::DS_STREAM_FORKED_FROM)?;
    let offset = header_str(headers, h::DS_STREAM_FORK_OFFSET)?;
    let sub = strict(headers, h::DS_STREAM_FORK_SUB_OFFSET)?;
    let Some(source) = source.filter(|s| !s.is_empty()) else {
        if offset.is_some() || sub.is_some() {
            return Err(DsError::bad_request(
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
            ));
        }
        return Ok(None);
    };
    let offset = match offset.map(parse_offset).transpose() {
        Ok(None) | Ok(Some(OffsetSpec::Now)) => None,
        Ok(Some(OffsetSpec::Beginning)) => Some(0),
        Ok(Some(OffsetSpec::At(n))) => Some(n),
        Err(e) => return Err(DsError::bad_request(format!("bad Stream-Fork-Offset: {e}"))),
    };
    Ok(Some(ForkHeaders {
        source: source.to_string(),
        offset,
        sub_offset: sub.unwrap_or(0),
    }))
}

/// A parsed read query: `offset` (absent = `-1`; required for live modes), `live`, `cursor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadQuery {
    pub offset: OffsetSpec,
    pub live: Live,
    pub cursor: Option<u64>,
}

impl ReadQuery {
    pub fn parse(uri: &Uri) -> Result<ReadQuery, DsError> {
        let p = crate::pico::Params::parse(uri)?;
        let live = Live::parse(p.get("live"))?;
        let offset = match p.get("offset") {
            None if live != Live::CatchUp => {
                return Err(DsError::bad_request("live reads need an offset parameter"));
            }
            None => OffsetSpec::Beginning,
            Some(v) => parse_offset(v).map_err(|e| DsError::bad_request(e.to_string()))?,
        };
        // A cursor we cannot read is treated as absent: it only steers cache keys.
        let cursor = p.get("cursor").and_then(|c| c.parse::<u64>().ok());
        Ok(ReadQuery {
            offset,
            live,
            cursor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_str(v).unwrap());
        }
        m
    }

    fn q(s: &str) -> Result<ReadQuery, DsError> {
        ReadQuery::parse(&format!("/x?{s}").parse::<Uri>().unwrap())
    }

    #[test]
    fn read_queries() {
        assert_eq!(q("").unwrap().offset, OffsetSpec::Beginning);
        assert_eq!(q("offset=now&live=sse").unwrap().live, Live::Sse);
        assert_eq!(
            q("offset=-1&foo=bar").unwrap().offset,
            OffsetSpec::Beginning
        );
        for bad in [
            "offset=",
            "offset=a&offset=b",
            "offset=0,1",
            "offset=0%201",
            "live=long-poll",
            "live=sse",
            "live=poll&offset=-1",
        ] {
            assert_eq!(q(bad).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn producer_and_ttl_grammar() {
        let ok = producer(&map(&[
            ("producer-id", "p"),
            ("producer-epoch", "0"),
            ("producer-seq", "9007199254740991"),
        ]))
        .unwrap();
        assert_eq!(ok.unwrap().seq, MAX_SAFE_INTEGER);
        for (epoch, seq) in [
            ("1e3", "0"),
            ("0", "1abc"),
            ("-1", "0"),
            ("0", "9007199254740992"),
        ] {
            let e = producer(&map(&[
                ("producer-id", "p"),
                ("producer-epoch", epoch),
                ("producer-seq", seq),
            ]));
            assert_eq!(e.unwrap_err().status, 400, "{epoch} {seq}");
        }
        assert!(producer(&map(&[("producer-id", "p")])).is_err());
        assert!(
            producer(&map(&[
                ("producer-id", ""),
                ("producer-epoch", "0"),
                ("producer-seq", "0")
            ]))
            .is_err()
        );
        for bad in ["00060", "+60", "60.5", "1e3", "-1", "abc"] {
            assert!(
                ttl_and_expiry(&map(&[("stream-ttl", bad)])).is_err(),
                "{bad}"
            );
        }
        assert!(
            ttl_and_expiry(&map(&[
                ("stream-ttl", "5"),
                ("stream-expires-at", "2030-01-01T00:00:00Z")
            ]))
            .is_err()
        );
        assert!(!closed(&map(&[("stream-closed", "yes")])).unwrap());
        assert!(closed(&map(&[("stream-closed", "TRUE")])).unwrap());
    }

    /// The one-pass parse answers exactly as the lookups by name do, errors included (their
    /// order: `Stream-Closed`, the producer triple, `Stream-Seq`, `Content-Type`).
    #[test]
    fn the_append_pass_answers_as_the_lookups_do() {
        let bad = HeaderValue::from_bytes(b"\xff").unwrap();
        let cases: Vec<Vec<(&'static str, HeaderValue)>> = vec![
            vec![],
            vec![("content-type", hv("text/plain")), ("host", hv("h"))],
            vec![
                ("stream-closed", hv(" TRUE ")),
                ("producer-id", hv("p")),
                ("producer-epoch", hv("1")),
                ("producer-seq", hv("2")),
                ("stream-seq", hv("s1")),
                ("content-type", hv("application/json")),
            ],
            vec![("stream-closed", hv("yes"))],
            vec![("producer-id", hv("p")), ("producer-seq", hv("2"))],
            vec![
                ("producer-id", hv("p")),
                ("producer-epoch", hv("x")),
                ("producer-seq", hv("y")),
            ],
            vec![("stream-seq", hv("a")), ("stream-seq", hv("b"))],
            vec![
                ("content-type", hv("text/plain")),
                ("content-type", hv("text/plain")),
            ],
            vec![("content-type", hv("no slash"))],
            vec![("content-type", hv(""))],
            vec![
                ("stream-seq", bad.clone()),
                ("content-type", hv("no slash")),
            ],
            vec![
                ("content-type", hv("no slash")),
                ("producer-id", bad.clone()),
            ],
            vec![("stream-closed", bad.clone()), ("producer-epoch", hv("1"))],
            vec![
                ("producer-epoch", hv("1")),
                ("stream-closed", hv("true")),
                ("stream-closed", hv("true")),
            ],
        ];
        for pairs in cases {
            let mut m = HeaderMap::new();
            for (k, v) in &pairs {
                m.append(*k, v.clone());
            }
            let by_name = (|| {
                Ok::<_, DsError>((
                    closed(&m)?,
                    producer(&m)?,
                    stream_seq(&m)?,
                    content_type(&m)?,
                ))
            })();
            let pass = AppendHeaders::parse(&m)
                .map(|a| (a.close, a.producer, a.stream_seq, a.content_type));
            match (by_name, pass) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{pairs:?}"),
                (Err(a), Err(b)) => {
                    assert_eq!((a.status, &a.message), (b.status, &b.message), "{pairs:?}")
                }
                (a, b) => panic!("{pairs:?}: by name {a:?}, one pass {b:?}"),
            }
        }
    }

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn fork_headers() {
        assert_eq!(fork(&map(&[])).unwrap(), None);
        let f = fork(&map(&[
            ("stream-forked-from", "/v1/stream/a"),
            ("stream-fork-offset", "0000000000000000_0000000000000000"),
            ("stream-fork-sub-offset", "3"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((f.offset, f.sub_offset), (Some(0), 3));
        assert!(fork(&map(&[("stream-fork-sub-offset", "0")])).is_err());
        for bad in ["-1", "abc", "1.5", "05", "+1"] {
            assert!(
                fork(&map(&[
                    ("stream-forked-from", "/a"),
                    ("stream-fork-sub-offset", bad)
                ]))
                .is_err(),
                "{bad}"
            );
        }
    }
}
