//! Pico protocol header names (lowercase, as `http::HeaderName` wants them), and content types
//! and how they compare: one home for both protocols and the node.

// Request headers.
pub const PICO_TTL: &str = "pico-ttl";
pub const PICO_EXPIRES_AT: &str = "pico-expires-at";
pub const PICO_CLOSED: &str = "pico-closed";
pub const PICO_PRODUCER_ID: &str = "pico-producer-id";
pub const PICO_PRODUCER_EPOCH: &str = "pico-producer-epoch";
pub const PICO_PRODUCER_SEQ: &str = "pico-producer-seq";
pub const PICO_MATCH_SEQ: &str = "pico-match-seq";
pub const PICO_TRIM_SEQ: &str = "pico-trim-seq";
pub const PICO_KEY: &str = "pico-key";
pub const LAST_EVENT_ID: &str = "last-event-id";

// Response headers (`pico-ttl`, `pico-expires-at`, `pico-closed`, `pico-producer-epoch` and
// `pico-producer-seq` are shared with requests).
pub const PICO_NEXT_SEQ: &str = "pico-next-seq";
pub const PICO_START_SEQ: &str = "pico-start-seq";
/// `true` on the answer to a producer append already applied (nothing written).
pub const PICO_DUPLICATE: &str = "pico-duplicate";
pub const PICO_TIMESTAMP: &str = "pico-timestamp";
pub const PICO_UP_TO_DATE: &str = "pico-up-to-date";
pub const PICO_CURSOR: &str = "pico-cursor";
pub const PICO_EXPECTED_SEQ: &str = "pico-expected-seq";
pub const PICO_RECEIVED_SEQ: &str = "pico-received-seq";

/// Every Pico-specific header, for CORS `Access-Control-Expose-Headers` / `-Allow-Headers`.
pub const ALL_PICO_HEADERS: &[&str] = &[
    PICO_TTL,
    PICO_EXPIRES_AT,
    PICO_CLOSED,
    PICO_PRODUCER_ID,
    PICO_PRODUCER_EPOCH,
    PICO_PRODUCER_SEQ,
    PICO_MATCH_SEQ,
    PICO_TRIM_SEQ,
    PICO_KEY,
    PICO_NEXT_SEQ,
    PICO_START_SEQ,
    PICO_DUPLICATE,
    PICO_TIMESTAMP,
    PICO_UP_TO_DATE,
    PICO_CURSOR,
    PICO_EXPECTED_SEQ,
    PICO_RECEIVED_SEQ,
];

// Durable Streams headers (lowercase).
pub const DS_STREAM_TTL: &str = "stream-ttl";
pub const DS_STREAM_EXPIRES_AT: &str = "stream-expires-at";
pub const DS_STREAM_CLOSED: &str = "stream-closed";
pub const DS_STREAM_SEQ: &str = "stream-seq";
pub const DS_STREAM_CURSOR: &str = "stream-cursor";
pub const DS_STREAM_NEXT_OFFSET: &str = "stream-next-offset";
pub const DS_STREAM_UP_TO_DATE: &str = "stream-up-to-date";
pub const DS_STREAM_FORKED_FROM: &str = "stream-forked-from";
pub const DS_STREAM_FORK_OFFSET: &str = "stream-fork-offset";
pub const DS_STREAM_FORK_SUB_OFFSET: &str = "stream-fork-sub-offset";
pub const DS_SSE_DATA_ENCODING: &str = "stream-sse-data-encoding";
pub const DS_PRODUCER_ID: &str = "producer-id";
pub const DS_PRODUCER_EPOCH: &str = "producer-epoch";
pub const DS_PRODUCER_SEQ: &str = "producer-seq";
pub const DS_PRODUCER_EXPECTED_SEQ: &str = "producer-expected-seq";
pub const DS_PRODUCER_RECEIVED_SEQ: &str = "producer-received-seq";

/// Every Durable Streams header, for CORS `Access-Control-Expose-Headers` / `-Allow-Headers`.
pub const ALL_DS_HEADERS: &[&str] = &[
    DS_STREAM_TTL,
    DS_STREAM_EXPIRES_AT,
    DS_STREAM_CLOSED,
    DS_STREAM_SEQ,
    DS_STREAM_CURSOR,
    DS_STREAM_NEXT_OFFSET,
    DS_STREAM_UP_TO_DATE,
    DS_STREAM_FORKED_FROM,
    DS_STREAM_FORK_OFFSET,
    DS_STREAM_FORK_SUB_OFFSET,
    DS_SSE_DATA_ENCODING,
    DS_PRODUCER_ID,
    DS_PRODUCER_EPOCH,
    DS_PRODUCER_SEQ,
    DS_PRODUCER_EXPECTED_SEQ,
    DS_PRODUCER_RECEIVED_SEQ,
];

/// A POST body holding a JSON batch (see [`crate::json_batch`]).
pub const CONTENT_TYPE_JSON_BATCH: &str = "application/vnd.picomq.batch+json";
/// A POST body or read response in the binary batch framing (see [`crate::binary`]).
pub const CONTENT_TYPE_BINARY_BATCH: &str = "application/vnd.picomq.batch";
/// The default stream content type.
pub const CONTENT_TYPE_OCTET_STREAM: &str = "application/octet-stream";

/// The media type of a Content-Type value: parameters dropped, trimmed, lowercased.
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The stored form of a content type: the media type lowercased (parameters kept as given),
/// `application/octet-stream` when absent, so creates compare case-insensitively.
pub fn normalize_content_type(ct: Option<&str>) -> String {
    let ct = ct.map(str::trim).filter(|c| !c.is_empty());
    let Some(ct) = ct else {
        return "application/octet-stream".to_string();
    };
    match ct.split_once(';') {
        Some((media, params)) => {
            format!("{}; {}", media.trim().to_ascii_lowercase(), params.trim())
        }
        None => ct.to_ascii_lowercase(),
    }
}

/// Whether a content type selects Durable Streams JSON mode (one record per message).
pub fn is_json(ct: &str) -> bool {
    media_essence(ct).eq_ignore_ascii_case("application/json")
}

/// The essence (type/subtype) of a Content-Type value as written: parameters dropped, trimmed,
/// case kept ([`media_type`] without the lowercased copy).
///
/// Byte-wise, as it runs on every DS append: the first `;` ends the essence, and the trim is
/// ASCII whitespace only. A content type reaches here from a header value (visible ASCII, spaces
/// and tabs) or as stored from one, where that is the whole of Unicode's whitespace too.
pub fn media_essence(content_type: &str) -> &str {
    let end = content_type
        .bytes()
        .position(|b| b == b';')
        .unwrap_or(content_type.len());
    // `;` is ASCII, so `end` is a char boundary.
    content_type[..end].trim_ascii()
}

/// Content types match on their essence (type/subtype), case-insensitively, ignoring parameters.
pub fn content_type_matches(a: &str, b: &str) -> bool {
    // Runs on every DS append: compare in place rather than lowercase into new strings, and
    // a client usually sends the stream's content type as stored (equal strings match).
    a == b || media_essence(a).eq_ignore_ascii_case(media_essence(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowercase_and_media_type_normalizes() {
        for h in ALL_PICO_HEADERS.iter().chain(ALL_DS_HEADERS) {
            assert_eq!(*h, h.to_ascii_lowercase());
        }
        assert_eq!(
            media_type(" Application/VND.picomq.Batch+JSON ; charset=utf-8"),
            CONTENT_TYPE_JSON_BATCH
        );
        assert_eq!(media_type(""), "");
    }

    #[test]
    fn content_types_match_on_their_essence() {
        assert!(content_type_matches("text/plain", "text/plain"));
        assert!(content_type_matches(
            " Text/Plain ; charset=utf-8",
            "text/plain"
        ));
        assert!(content_type_matches(
            "application/json",
            "APPLICATION/JSON;x=1"
        ));
        assert!(!content_type_matches("text/plain", "text/html"));
        assert!(!content_type_matches("text/plain", "text/plainx"));
        assert!(!content_type_matches("", "text/plain"));
        assert!(content_type_matches("", " ; charset=x"));
        // Equal strings match whatever they hold; parameters never decide.
        assert!(content_type_matches("text/plain; a=1", "text/plain; a=1"));
        assert!(content_type_matches("Text/Plain; a=1", " text/plain ; b=2"));
        assert!(!content_type_matches("text/plain; a=1", "text/html; a=1"));
        assert_eq!(media_essence(" Text/Plain ; charset=x"), "Text/Plain");
        assert_eq!(media_essence(""), "");
        assert!(is_json("\tApplication/JSON ;charset=utf-8"));
        assert!(!is_json("application/jsonx"));
    }

    proptest::proptest! {
        /// On what a header value can hold (visible ASCII, spaces, tabs) the byte-wise essence
        /// is the split-and-trim one it replaced.
        #[test]
        fn the_essence_is_the_split_and_trimmed_value(ct in "[ \t!-~]{0,40}") {
            let old = ct.split(';').next().unwrap_or("").trim();
            proptest::prop_assert_eq!(media_essence(&ct), old);
            proptest::prop_assert_eq!(is_json(&ct), old.eq_ignore_ascii_case("application/json"));
        }
    }
}
