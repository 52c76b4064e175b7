//! Strict parsing of Pico request headers. Every malformed value is a 400 naming the header.

use std::borrow::Cow;

use axum::http::header::AsHeaderName;
use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use pico_protocol::headers as h;
use pico_protocol::parse_strict_u64;
use pico_server::ProducerClaim;

use crate::error::HttpError;

/// Read mode (`live=`), the same on both protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    CatchUp,
    LongPoll,
    Sse,
}

impl Live {
    /// `live` absent = a catch-up read.
    pub fn parse(v: Option<&str>) -> Result<Live, HttpError> {
        match v {
            None => Ok(Live::CatchUp),
            Some("long-poll") => Ok(Live::LongPoll),
            Some("sse") => Ok(Live::Sse),
            Some(other) => Err(HttpError::bad_request(format!(
                "bad live mode (want long-poll or sse): live=`{other}`"
            ))),
        }
    }
}

/// Longest accepted producer id, in bytes.
pub const MAX_PRODUCER_ID_LEN: usize = 256;

/// The single value of header `name` as text; `None` when absent. Repeated headers and
/// non-visible-ASCII values are rejected.
///
/// `name` may be a `&HeaderName` built once (a `const`): a `&str` is parsed and checked as a
/// header name on every call, which the append path paid six times per request.
pub fn header_str<K>(headers: &HeaderMap, name: K) -> Result<Option<&str>, HttpError>
where
    K: AsHeaderName + std::fmt::Display + Copy,
{
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    single_str(name, first, values.next().is_some())
}

/// What [`header_str`] answers for header `name` whose first value is `first` (`None`: absent)
/// and which came `repeated` or not: for callers that found the values themselves (one pass over
/// a request's headers instead of a lookup per name).
pub fn single_str<N: std::fmt::Display>(
    name: N,
    first: Option<&HeaderValue>,
    repeated: bool,
) -> Result<Option<&str>, HttpError> {
    let Some(v) = first else {
        return Ok(None);
    };
    if repeated {
        return Err(HttpError::bad_request(format!(
            "header repeated: header={name}"
        )));
    }
    // `to_str` admits visible ASCII, spaces and tabs only: the ASCII trim is the whole trim.
    v.to_str()
        .map(|s| Some(s.trim_ascii()))
        .map_err(|_| HttpError::bad_request(format!("header is not visible ASCII: header={name}")))
}

/// A list header (`If-None-Match`, …) as one comma-separated value: RFC 9110 lets a client
/// split the list over several field lines, which mean the same as one line joined with ", ".
/// `None` when absent; non-visible-ASCII values are rejected.
pub fn header_list<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<Cow<'a, str>>, HttpError> {
    let mut joined: Option<Cow<'a, str>> = None;
    for v in headers.get_all(name) {
        let s = v.to_str().map_err(|_| {
            HttpError::bad_request(format!("header is not visible ASCII: header={name}"))
        })?;
        let s = s.trim();
        joined = Some(match joined {
            None => Cow::Borrowed(s),
            Some(prev) => Cow::Owned(format!("{prev}, {s}")),
        });
    }
    Ok(joined)
}

/// A strict decimal u64 header (no sign, no leading zeros, no decimal point).
pub fn header_u64(headers: &HeaderMap, name: &str) -> Result<Option<u64>, HttpError> {
    header_str(headers, name)?
        .map(|s| {
            parse_strict_u64(s).map_err(|e| {
                HttpError::bad_request(format!("bad integer header: header={name} {e}"))
            })
        })
        .transpose()
}

/// A boolean header: `true` or `false` (case-insensitive); absent = false.
pub fn header_bool(headers: &HeaderMap, name: &str) -> Result<bool, HttpError> {
    match header_str(headers, name)? {
        None => Ok(false),
        Some(s) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(s) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(s) => Err(HttpError::bad_request(format!(
            "bad boolean header (want true or false): header={name} value=`{s}`"
        ))),
    }
}

/// Parses an RFC 3339 timestamp into ms since the Unix epoch.
pub fn parse_rfc3339_ms(s: &str) -> Result<i64, HttpError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            HttpError::bad_request(format!(
                "bad RFC 3339 time: header={} value=`{s}` ({e})",
                h::PICO_EXPIRES_AT
            ))
        })
}

/// Formats ms since the Unix epoch as RFC 3339 (UTC, millisecond precision).
pub fn format_rfc3339_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// A content type must look like `type/subtype[; params]`.
pub fn validate_content_type(ct: &str) -> Result<(), HttpError> {
    // Checked as written: the token characters are the same in either case, and every DS
    // append with a body runs this (no lowercased copy).
    let media = h::media_essence(ct);
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
    };
    match media.split_once('/') {
        Some((t, st)) if token(t) && token(st) => Ok(()),
        _ => Err(HttpError::bad_request(format!(
            "bad content type: value=`{ct}`"
        ))),
    }
}

/// Headers of `PUT /{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CreateHeaders {
    pub content_type: Option<String>,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub closed: bool,
}

pub fn parse_create(headers: &HeaderMap) -> Result<CreateHeaders, HttpError> {
    let content_type = header_str(headers, "content-type")?
        .map(|ct| validate_content_type(ct).map(|()| ct.to_string()))
        .transpose()?;
    let ttl_secs = header_u64(headers, h::PICO_TTL)?;
    let expires_at_ms = header_str(headers, h::PICO_EXPIRES_AT)?
        .map(parse_rfc3339_ms)
        .transpose()?;
    if ttl_secs.is_some() && expires_at_ms.is_some() {
        return Err(HttpError::bad_request(format!(
            "send either {} or {}, not both",
            h::PICO_TTL,
            h::PICO_EXPIRES_AT
        )));
    }
    Ok(CreateHeaders {
        content_type,
        ttl_secs,
        expires_at_ms,
        closed: header_bool(headers, h::PICO_CLOSED)?,
    })
}

/// Headers of `POST /{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AppendHeaders {
    /// Normalized media type of the body (`""` when absent).
    pub media_type: String,
    pub producer: Option<ProducerClaim>,
    pub match_seq: Option<u64>,
    pub trim_seq: Option<u64>,
    pub close: bool,
    pub key: Option<Bytes>,
}

pub fn parse_append(headers: &HeaderMap) -> Result<AppendHeaders, HttpError> {
    let media_type = header_str(headers, "content-type")?
        .map(h::media_type)
        .unwrap_or_default();
    let key = {
        let mut values = headers.get_all(h::PICO_KEY).iter();
        let first = values.next();
        if values.next().is_some() {
            return Err(HttpError::bad_request(format!(
                "header repeated: header={}",
                h::PICO_KEY
            )));
        }
        // Keys are bytes: any header-legal octets are kept as sent.
        first.map(|v| Bytes::copy_from_slice(v.as_bytes()))
    };
    Ok(AppendHeaders {
        media_type,
        producer: parse_producer(headers)?,
        match_seq: header_u64(headers, h::PICO_MATCH_SEQ)?,
        trim_seq: header_u64(headers, h::PICO_TRIM_SEQ)?,
        close: header_bool(headers, h::PICO_CLOSED)?,
        key,
    })
}

/// The producer triple: all three headers or none.
pub fn parse_producer(headers: &HeaderMap) -> Result<Option<ProducerClaim>, HttpError> {
    let id = header_str(headers, h::PICO_PRODUCER_ID)?;
    let epoch = header_u64(headers, h::PICO_PRODUCER_EPOCH)?;
    let seq = header_u64(headers, h::PICO_PRODUCER_SEQ)?;
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            if id.is_empty() || id.len() > MAX_PRODUCER_ID_LEN {
                return Err(HttpError::bad_request(format!(
                    "bad producer id: len={} max={MAX_PRODUCER_ID_LEN}",
                    id.len()
                )));
            }
            Ok(Some(ProducerClaim {
                id: id.to_string(),
                epoch,
                seq,
            }))
        }
        _ => Err(HttpError::bad_request(format!(
            "send all of {}, {}, {} or none",
            h::PICO_PRODUCER_ID,
            h::PICO_PRODUCER_EPOCH,
            h::PICO_PRODUCER_SEQ
        ))),
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

    /// Checked on the essence as written, case and parameters aside.
    #[test]
    fn content_types_are_validated_on_their_essence() {
        for ok in [
            "text/plain",
            " Text/Plain ; charset=UTF-8",
            "application/vnd.picomq.batch+json",
            "APPLICATION/JSON;x=\"a;b\"",
        ] {
            assert!(validate_content_type(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "text",
            "/plain",
            "text/",
            "text /plain",
            "te xt/plain; a=b",
            "text/pl@in",
        ] {
            assert!(validate_content_type(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn list_headers_join_their_lines() {
        assert_eq!(header_list(&map(&[]), "if-none-match").unwrap(), None);
        let one = map(&[("if-none-match", " \"a\" ")]);
        assert_eq!(
            header_list(&one, "if-none-match").unwrap().as_deref(),
            Some("\"a\"")
        );
        let two = map(&[
            ("if-none-match", "\"a\", \"b\""),
            ("if-none-match", "W/\"c\""),
        ]);
        assert_eq!(
            header_list(&two, "if-none-match").unwrap().as_deref(),
            Some("\"a\", \"b\", W/\"c\"")
        );
        let mut bad = map(&[("if-none-match", "\"a\"")]);
        bad.append(
            "if-none-match",
            HeaderValue::from_bytes(b"\"\xff\"").unwrap(),
        );
        assert_eq!(header_list(&bad, "if-none-match").unwrap_err().status, 400);
    }

    #[test]
    fn ttl_is_strict_decimal() {
        let ok = parse_create(&map(&[("pico-ttl", "3600")])).unwrap();
        assert_eq!(ok.ttl_secs, Some(3600));
        for bad in ["+1", "-1", "1.5", "1e3", "01", "abc", ""] {
            let e = parse_create(&map(&[("pico-ttl", bad)])).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
            assert!(e.message.contains("pico-ttl"), "{}", e.message);
        }
    }

    #[test]
    fn expires_at_is_rfc3339_and_exclusive_with_ttl() {
        let ok = parse_create(&map(&[("pico-expires-at", "2030-01-01T00:00:00Z")])).unwrap();
        assert_eq!(ok.expires_at_ms, Some(1_893_456_000_000));
        let ok = parse_create(&map(&[("pico-expires-at", "2030-01-01T01:00:00+01:00")])).unwrap();
        assert_eq!(ok.expires_at_ms, Some(1_893_456_000_000));
        assert_eq!(
            parse_create(&map(&[("pico-expires-at", "tomorrow")]))
                .unwrap_err()
                .status,
            400
        );
        let both = parse_create(&map(&[
            ("pico-ttl", "5"),
            ("pico-expires-at", "2030-01-01T00:00:00Z"),
        ]));
        assert_eq!(both.unwrap_err().status, 400);
        assert_eq!(
            format_rfc3339_ms(1_893_456_000_000),
            "2030-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn content_type_and_closed() {
        let c = parse_create(&map(&[
            ("content-type", "text/plain; charset=utf-8"),
            ("pico-closed", "TRUE"),
        ]))
        .unwrap();
        assert_eq!(c.content_type.as_deref(), Some("text/plain; charset=utf-8"));
        assert!(c.closed);
        assert_eq!(parse_create(&map(&[])).unwrap(), CreateHeaders::default());
        for bad in ["text", "/plain", "text/", "te xt/plain"] {
            assert!(
                parse_create(&map(&[("content-type", bad)])).is_err(),
                "{bad}"
            );
        }
        assert!(parse_create(&map(&[("pico-closed", "yes")])).is_err());
    }

    #[test]
    fn producer_triple_all_or_none() {
        let ok = parse_append(&map(&[
            ("pico-producer-id", "p1"),
            ("pico-producer-epoch", "2"),
            ("pico-producer-seq", "7"),
        ]))
        .unwrap();
        assert_eq!(
            ok.producer,
            Some(ProducerClaim {
                id: "p1".into(),
                epoch: 2,
                seq: 7
            })
        );
        let partial = parse_append(&map(&[
            ("pico-producer-id", "p1"),
            ("pico-producer-seq", "7"),
        ]));
        assert!(partial.unwrap_err().message.contains("all of"));
        let bad_seq = parse_append(&map(&[
            ("pico-producer-id", "p1"),
            ("pico-producer-epoch", "2"),
            ("pico-producer-seq", "-7"),
        ]));
        assert_eq!(bad_seq.unwrap_err().status, 400);
        let empty_id = parse_append(&map(&[
            ("pico-producer-id", ""),
            ("pico-producer-epoch", "2"),
            ("pico-producer-seq", "7"),
        ]));
        assert!(empty_id.is_err());
    }

    #[test]
    fn append_headers() {
        let a = parse_append(&map(&[
            ("content-type", "Application/Vnd.Picomq.Batch+Json; x=y"),
            ("pico-match-seq", "10"),
            ("pico-trim-seq", "4"),
            ("pico-key", "user-1"),
            ("pico-closed", "false"),
        ]))
        .unwrap();
        assert_eq!(a.media_type, h::CONTENT_TYPE_JSON_BATCH);
        assert_eq!(a.match_seq, Some(10));
        assert_eq!(a.trim_seq, Some(4));
        assert_eq!(a.key, Some(Bytes::from_static(b"user-1")));
        assert!(!a.close);
        let dup = parse_append(&map(&[("pico-match-seq", "1"), ("pico-match-seq", "2")]));
        assert!(dup.unwrap_err().message.contains("repeated"));
    }
}
