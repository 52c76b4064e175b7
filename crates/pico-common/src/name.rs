//! Stream names are URL-path-like (`logs/api/prod`). The canonical form has no leading or
//! trailing slash; `/orders/42`, `orders/42` and `orders/42/` name the same stream.
//!
//! Names are the raw (still percent-encoded) request path and are compared byte for byte:
//! `a%2fb` and `a%2Fb` are two streams, as are `a%41` and `aA` (see docs/design/streams.md for
//! why they are not normalised). So a `%` must start a well-formed escape, and a segment a URL
//! parser resolves as `.` or `..` (`%2e`, `.%2E`, …) is refused: a client would send another
//! path than the name.

use std::fmt;
use thiserror::Error;

/// Longest accepted canonical name, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// First segments no client may create a stream under: Pico's system namespaces and the
/// Durable Streams control namespace, in both facades (they name the same streams).
const RESERVED_FIRST_SEGMENTS: &[&str] = &["_sys", "_groups", "__ds"];
/// The Durable Streams mount: `/v1/stream/x` is a DS path, never the Pico stream `v1/stream/x`.
const DS_MOUNT: &str = "v1/stream";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    #[error("stream name is empty")]
    Empty,
    #[error("stream name too long: len={0} max={MAX_NAME_LEN}")]
    TooLong(usize),
    #[error("stream name has an empty, `.` or `..` segment (`%2e` counts as `.`): name=`{0}`")]
    BadSegment(String),
    #[error("stream name has a character outside [A-Za-z0-9-._~:@!$&'()*+,;=%]: name=`{0}`")]
    BadChar(String),
    #[error("stream name has a `%` not followed by two hex digits: name=`{0}`")]
    BadEscape(String),
    #[error(
        "stream name is reserved (first segment `_sys`, `_groups` or `__ds`, or `v1/stream` \
         and below): name=`{0}`"
    )]
    Reserved(String),
}

/// A validated canonical stream name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamName(String);

impl StreamName {
    /// Validates a name that addresses a stream (leading/trailing `/` ignored) and returns its
    /// canonical form. Stored names are read back with this, and requests for existing streams
    /// go through it: it keeps the rules names were created under before the stricter ones of
    /// [`Self::parse_new`], so no stored stream becomes unreachable or undeletable.
    pub fn parse(raw: &str) -> Result<StreamName, NameError> {
        let trimmed = raw.trim_matches('/');
        if trimmed.is_empty() {
            return Err(NameError::Empty);
        }
        if trimmed.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong(trimmed.len()));
        }
        if trimmed
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..")
        {
            return Err(NameError::BadSegment(trimmed.to_string()));
        }
        let ok = |c: char| c.is_ascii_alphanumeric() || "-._~:@!$&'()*+,;=%/".contains(c);
        if !trimmed.chars().all(ok) {
            return Err(NameError::BadChar(trimmed.to_string()));
        }
        Ok(StreamName(trimmed.to_string()))
    }

    /// The rule for a name a client creates (both facades, and the client library): [`Self::parse`],
    /// plus every `%` a two-hex-digit escape, no segment that is `.` or `..` once `%2e` is decoded
    /// (URL parsers resolve those), and not [reserved](Self::is_reserved).
    pub fn parse_new(raw: &str) -> Result<StreamName, NameError> {
        let name = StreamName::parse(raw)?;
        if name.0.split('/').any(is_dot_segment) {
            return Err(NameError::BadSegment(name.0));
        }
        if !escapes_well_formed(name.0.as_bytes()) {
            return Err(NameError::BadEscape(name.0));
        }
        if name.is_reserved() {
            return Err(NameError::Reserved(name.0));
        }
        Ok(name)
    }

    /// Whether the name lies in a namespace no client may create: first segment `_sys`,
    /// `_groups` or `__ds`, or `v1/stream` and below. Both facades reserve all of them, else a
    /// name made through one could not be reached through the other.
    pub fn is_reserved(&self) -> bool {
        let first = self.0.split('/').next().unwrap_or_default();
        RESERVED_FIRST_SEGMENTS.contains(&first)
            || self
                .0
                .strip_prefix(DS_MOUNT)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a URL path, with one leading slash.
    pub fn to_path(&self) -> String {
        format!("/{}", self.0)
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// Whether `seg` is `.` or `..` once `%2e` is decoded: WHATWG URL parsers resolve those.
fn is_dot_segment(seg: &str) -> bool {
    // `%2e%2e` is the longest spelling; longer segments skip the allocation.
    seg.len() <= 6
        && matches!(
            seg.to_ascii_lowercase().replace("%2e", ".").as_str(),
            "." | ".."
        )
}

/// Every `%` is followed by two hex digits.
fn escapes_well_formed(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        if name[i] == b'%' {
            let hex = |j: usize| name.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms_agree() {
        let a = StreamName::parse("/orders/42").unwrap();
        let b = StreamName::parse("orders/42/").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "orders/42");
        assert_eq!(a.to_path(), "/orders/42");
    }

    #[test]
    fn rejects_bad_names() {
        assert_eq!(StreamName::parse("/"), Err(NameError::Empty));
        assert!(matches!(
            StreamName::parse("a//b"),
            Err(NameError::BadSegment(_))
        ));
        assert!(matches!(
            StreamName::parse("a/../b"),
            Err(NameError::BadSegment(_))
        ));
        assert!(matches!(
            StreamName::parse("a b"),
            Err(NameError::BadChar(_))
        ));
        assert!(matches!(
            StreamName::parse("a?b"),
            Err(NameError::BadChar(_))
        ));
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            StreamName::parse(&long),
            Err(NameError::TooLong(_))
        ));
    }

    #[test]
    fn percent_must_start_a_two_digit_escape() {
        for bad in ["a%", "a%2", "%", "a%zz", "a%2g/b", "a%%41", "a/b%4"] {
            assert!(
                matches!(StreamName::parse_new(bad), Err(NameError::BadEscape(_))),
                "{bad}"
            );
            // A stream stored under it before the rule stays reachable.
            assert_eq!(
                StreamName::parse(bad).unwrap().as_str(),
                bad.trim_matches('/')
            );
        }
        // Escapes are kept as spelled: two spellings are two names.
        for good in ["a%20b", "a%2Fb", "a%2fb", "%41", "x/%7e%7E"] {
            assert_eq!(StreamName::parse(good).unwrap().as_str(), good);
        }
        assert_ne!(
            StreamName::parse("a%2fb").unwrap(),
            StreamName::parse("a%2Fb").unwrap()
        );
    }

    #[test]
    fn segments_a_url_resolves_as_dots_are_refused() {
        for bad in [
            "%2e",
            "%2E",
            "%2e%2e",
            ".%2e",
            "%2E.",
            "a/%2e%2E/b",
            "a/.%2e",
            "%2e/a",
        ] {
            let e = StreamName::parse_new(bad).unwrap_err();
            assert!(matches!(e, NameError::BadSegment(_)), "{bad}: {e:?}");
            assert!(e.to_string().contains("`%2e` counts as `.`"), "{e}");
            assert!(StreamName::parse(bad).is_ok(), "{bad} stays reachable");
        }
        for good in ["...", "%2e%2e%2e", "a%2eb", ".a", "%2ea", "a.", "%2e%2"] {
            let r = StreamName::parse_new(good);
            assert!(!matches!(r, Err(NameError::BadSegment(_))), "{good}: {r:?}");
        }
    }

    #[test]
    fn reserved_namespaces_of_both_facades() {
        for reserved in [
            "_sys",
            "/_sys/x",
            "_groups/g",
            "__ds",
            "__ds/subscriptions/1",
            "v1/stream",
            "/v1/stream/",
            "v1/stream/x/y",
        ] {
            let name = StreamName::parse(reserved).unwrap();
            assert!(name.is_reserved(), "{reserved}");
            let e = StreamName::parse_new(reserved).unwrap_err();
            assert_eq!(e, NameError::Reserved(name.into_string()), "{reserved}");
            assert!(e.to_string().starts_with("stream name is reserved"), "{e}");
        }
        for free in [
            "_system",
            "x/_sys",
            "__dsq",
            "__ds_x",
            "v1",
            "v1/streams",
            "v1/streamx/a",
            "a/v1/stream",
            "v2/stream",
        ] {
            assert!(!StreamName::parse(free).unwrap().is_reserved(), "{free}");
            assert_eq!(StreamName::parse_new(free).unwrap().as_str(), free);
        }
        // Syntax errors come first.
        assert_eq!(StreamName::parse_new("/"), Err(NameError::Empty));
    }
}
