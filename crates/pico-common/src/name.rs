//! Stream names are URL-path-like (`logs/api/prod`). The canonical form has no leading or
//! trailing slash; `/orders/42`, `orders/42` and `orders/42/` name the same stream.
//!
//! A name means its percent-decoded text: `/%61` and `/a` are one stream, as are `a:b` and
//! `a%3A` (see "Names" in docs/design/streams.md). [`StreamName::from_path`] is the one rule
//! every request path goes through, in both protocols: it decodes once, refuses what would give
//! a name two meanings (an encoded `/`, an encoded control character, bytes that are not UTF-8,
//! a `%` that starts no escape, a `.` or `..` segment however spelled) and spells the result in
//! one canonical way, which is what the registry stores and listings show: characters allowed
//! in a path segment as themselves, every other character as `%HH` escapes of its UTF-8 bytes
//! with upper-case hex. So the stored spelling is itself a URL path naming the same stream.

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
        "stream name has an encoded `/` (`%2F`): `/` separates segments, so it must be sent \
         as itself: name=`{0}`"
    )]
    EncodedSlash(String),
    #[error("stream name has an encoded control character (`%00`-`%1F`, `%7F`): name=`{0}`")]
    ControlChar(String),
    #[error("stream name is not UTF-8 once percent-decoded: name=`{0}`")]
    NotUtf8(String),
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
    /// Validates a stored name, or one built by the server itself, and returns its canonical
    /// form (leading/trailing `/` dropped). Names read back from the registry go through this:
    /// it keeps the rules names were created under before [`Self::from_path`], so no stream
    /// stored earlier fails to load, list or expire. Request paths use [`Self::from_path`].
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
        if !trimmed
            .chars()
            .all(|c| c == '%' || c == '/' || is_literal(c))
        {
            return Err(NameError::BadChar(trimmed.to_string()));
        }
        Ok(StreamName(trimmed.to_string()))
    }

    /// The stream a request path (or a client's name) names, in both protocols: the path is
    /// percent-decoded once, the decoded text must be UTF-8 without control characters, its
    /// segments separated by literal `/` only and none empty, `.` or `..`; the result is spelled
    /// canonically (see the module docs). Two paths name one stream exactly when they decode to
    /// the same text.
    pub fn from_path(raw: &str) -> Result<StreamName, NameError> {
        let trimmed = raw.trim_matches('/');
        // An escape is three characters for one: anything longer cannot fit once decoded.
        if trimmed.len() > 3 * MAX_NAME_LEN {
            return Err(NameError::TooLong(trimmed.len()));
        }
        // Nearly every path spells its name canonically already (literal characters and `/`,
        // no escape): decoding and encoding it again would give it back unchanged, and it holds
        // no control character. Only its segments and length are left to check.
        if trimmed.bytes().all(|b| b == b'/' || is_literal_byte(b)) {
            if trimmed.is_empty() {
                return Err(NameError::Empty);
            }
            return StreamName::checked(trimmed, trimmed);
        }
        let text = decode(trimmed)?;
        StreamName::from_text(&text)
    }

    /// The name whose decoded text is `text` (segments separated by `/`, no escapes).
    pub fn from_text(text: &str) -> Result<StreamName, NameError> {
        let text = text.trim_matches('/');
        if text.is_empty() {
            return Err(NameError::Empty);
        }
        let canonical = encode(text);
        if text.chars().any(char::is_control) {
            return Err(NameError::ControlChar(canonical));
        }
        StreamName::checked(text, &canonical)
    }

    /// The last checks of [`Self::from_text`], for non-empty `text` without control characters
    /// whose canonical spelling is `canonical`: its segments, then the spelling's length.
    fn checked(text: &str, canonical: &str) -> Result<StreamName, NameError> {
        if text
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..")
        {
            return Err(NameError::BadSegment(canonical.to_string()));
        }
        if canonical.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong(canonical.len()));
        }
        Ok(StreamName(canonical.to_string()))
    }

    /// The rule for a name a client creates (both facades, and the client library):
    /// [`Self::from_path`], and not [reserved](Self::is_reserved) (however spelled: `%5Fsys` is
    /// `_sys`).
    pub fn parse_new(raw: &str) -> Result<StreamName, NameError> {
        let name = StreamName::from_path(raw)?;
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

    /// What the name means: its percent-decoded text. `None` only for a name stored before
    /// [`Self::from_path`] that it refuses (`a%2Fb`, `%ff`, a malformed escape).
    pub fn text(&self) -> Option<String> {
        decode(&self.0).ok()
    }

    /// The name as a URL path, with one leading slash.
    pub fn to_path(&self) -> String {
        format!("/{}", self.0)
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// Characters a canonical name holds as themselves: RFC 3986's unreserved characters and the
/// sub-delimiters, `:` and `@` (what a path segment may hold unescaped), bar `%`.
fn is_literal(c: char) -> bool {
    u8::try_from(c).is_ok_and(is_literal_byte)
}

/// [`is_literal`] for one byte, by table: it runs for every byte of every request's path.
fn is_literal_byte(b: u8) -> bool {
    const LITERAL: [bool; 256] = {
        let mut t = [false; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = (i as u8).is_ascii_alphanumeric();
            i += 1;
        }
        let others = b"-._~:@!$&'()*+,;=";
        let mut j = 0;
        while j < others.len() {
            t[others[j] as usize] = true;
            j += 1;
        }
        t
    };
    LITERAL[usize::from(b)]
}

/// Percent-decodes `raw` once into UTF-8 text. An escape may not stand for `/` or a control
/// character; outside escapes only literal characters and `/` may appear.
fn decode(raw: &str) -> Result<String, NameError> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            if b != b'/' && !is_literal_byte(b) {
                return Err(NameError::BadChar(raw.to_string()));
            }
            out.push(b);
            i += 1;
            continue;
        }
        let hex = |j: usize| bytes.get(j).and_then(|&h| char::from(h).to_digit(16));
        let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
            return Err(NameError::BadEscape(raw.to_string()));
        };
        // Both digits are below 16, so the value fits a byte.
        let d = (hi * 16 + lo) as u8;
        if d == b'/' {
            return Err(NameError::EncodedSlash(raw.to_string()));
        }
        if d < 0x20 || d == 0x7f {
            return Err(NameError::ControlChar(raw.to_string()));
        }
        out.push(d);
        i += 3;
    }
    String::from_utf8(out).map_err(|_| NameError::NotUtf8(raw.to_string()))
}

/// The canonical spelling of decoded `text`: literal characters and `/` as themselves, every
/// other character as `%HH` escapes of its UTF-8 bytes, upper-case hex.
fn encode(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '/' || is_literal(c) {
            out.push(c);
            continue;
        }
        let mut buf = [0u8; 4];
        for &b in c.encode_utf8(&mut buf).as_bytes() {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
                matches!(StreamName::from_path(bad), Err(NameError::BadEscape(_))),
                "{bad}"
            );
            // A stream stored under it before the rule still loads from the registry.
            assert_eq!(
                StreamName::parse(bad).unwrap().as_str(),
                bad.trim_matches('/')
            );
        }
    }

    #[test]
    fn a_name_means_its_decoded_text() {
        let canon = |p: &str| StreamName::from_path(p).unwrap().into_string();
        // One spelling per text: escapes of characters a segment holds as themselves are
        // decoded, the others kept with upper-case hex.
        for (path, want) in [
            ("/%61", "a"),
            ("a", "a"),
            ("%41%42c", "ABc"),
            ("x/%7e%7E", "x/~~"),
            ("a%3Ab%40c%21", "a:b@c!"),
            ("a%20b", "a%20b"),
            ("a b", "a b"), // not a URL path: refused below
            ("caf%c3%a9", "caf%C3%A9"),
            ("a%3fb", "a%3Fb"),
            ("100%25", "100%25"),
            ("%2e%2e%2e", "..."),
            ("a%2eb", "a.b"),
        ] {
            if path.contains(' ') {
                assert!(matches!(
                    StreamName::from_path(path),
                    Err(NameError::BadChar(_))
                ));
                continue;
            }
            assert_eq!(canon(path), want, "{path}");
            // The canonical spelling is a fixed point, and a name `parse` accepts.
            assert_eq!(canon(want), want);
            assert_eq!(StreamName::parse(want).unwrap().as_str(), want);
        }
        assert_eq!(canon("%61"), canon("a"));
        assert_eq!(canon("a%3a"), canon("a:"));
        assert_eq!(
            StreamName::from_path("caf%C3%A9")
                .unwrap()
                .text()
                .as_deref(),
            Some("café")
        );
        assert_eq!(StreamName::from_text("café").unwrap().as_str(), "caf%C3%A9");
    }

    #[test]
    fn names_with_two_meanings_are_refused() {
        for (bad, want) in [
            ("a%2Fb", "EncodedSlash"),
            ("a%2fb", "EncodedSlash"),
            ("%2F", "EncodedSlash"),
            ("a%00", "ControlChar"),
            ("a%0Ab", "ControlChar"),
            ("a%7f", "ControlChar"),
            ("a%C2%85", "ControlChar"), // U+0085, a C1 control
            ("%ff%fe", "NotUtf8"),
            ("a%C3", "NotUtf8"),
            ("%C3%28", "NotUtf8"),
            ("a?b", "BadChar"),
            ("a//b", "BadSegment"),
        ] {
            let e = StreamName::from_path(bad).unwrap_err();
            assert!(format!("{e:?}").starts_with(want), "{bad}: {e:?}");
            assert!(StreamName::parse_new(bad).is_err(), "{bad}");
        }
        assert!(
            StreamName::from_path("a%2Fb")
                .unwrap_err()
                .to_string()
                .contains("encoded `/`")
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
            let e = StreamName::from_path(bad).unwrap_err();
            assert!(matches!(e, NameError::BadSegment(_)), "{bad}: {e:?}");
            assert!(e.to_string().contains("`%2e` counts as `.`"), "{e}");
            assert!(StreamName::parse(bad).is_ok(), "{bad} still loads");
        }
        for good in ["...", "%2e%2e%2e", "a%2eb", ".a", "%2ea", "a."] {
            assert!(StreamName::parse_new(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn long_names_are_measured_canonically() {
        // 400 `é` are 800 bytes of text but 2,400 canonical bytes.
        let e = StreamName::from_text(&"é".repeat(400)).unwrap_err();
        assert_eq!(e, NameError::TooLong(2_400));
        let ok = "a".repeat(MAX_NAME_LEN);
        // `%61` spells `a`: a long spelling of a short name is fine.
        assert_eq!(
            StreamName::from_path(&"%61".repeat(MAX_NAME_LEN))
                .unwrap()
                .as_str(),
            ok
        );
    }

    /// A text name: segments of printable characters (any script), none `.`, `..` or empty.
    fn text_name() -> impl Strategy<Value = String> {
        let seg = "[^/\\p{Cc}]{1,12}".prop_filter("dot segment", |s| s != "." && s != "..");
        prop::collection::vec(seg, 1..4).prop_map(|segs| segs.join("/"))
    }

    /// Some spelling of `text`: each character as itself where a path allows it, or escaped
    /// with hex of either case.
    fn spell(text: &str, escape: &[bool], upper: &[bool]) -> String {
        let mut out = String::new();
        for (i, c) in text.chars().enumerate() {
            let pick = |v: &[bool]| v.get(i % v.len().max(1)).copied().unwrap_or(false);
            if c == '/' || (is_literal(c) && !pick(escape)) {
                out.push(c);
                continue;
            }
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                if pick(upper) {
                    out.push_str(&format!("%{b:02X}"));
                } else {
                    out.push_str(&format!("%{b:02x}"));
                }
            }
        }
        out
    }

    /// [`StreamName::from_path`] without its shortcut for canonical spellings.
    fn from_path_decoded(raw: &str) -> Result<StreamName, NameError> {
        let trimmed = raw.trim_matches('/');
        if trimmed.len() > 3 * MAX_NAME_LEN {
            return Err(NameError::TooLong(trimmed.len()));
        }
        StreamName::from_text(&decode(trimmed)?)
    }

    #[test]
    fn literal_characters_by_table() {
        for b in 0..=255u8 {
            let c = char::from(b);
            let literal = c.is_ascii_alphanumeric() || "-._~:@!$&'()*+,;=".contains(c);
            assert_eq!(is_literal_byte(b), literal, "{b:#04x}");
            assert_eq!(is_literal(c), literal, "{b:#04x}");
        }
        assert!(!is_literal('é') && !is_literal('\u{100}'));
    }

    #[test]
    fn canonical_paths_take_the_shortcut_with_the_same_answers() {
        let long = format!("/{}", "a".repeat(MAX_NAME_LEN + 1));
        let dots = format!("{}/..", "a".repeat(3 * MAX_NAME_LEN));
        for raw in [
            "/s",
            "s",
            "//s//",
            "/",
            "",
            "a//b",
            "a/./b",
            "a/..",
            ".",
            "..",
            "...",
            "a/.b",
            &long,
            &dots,
            "~a:b@c!$&'()*+,;=",
        ] {
            assert_eq!(StreamName::from_path(raw), from_path_decoded(raw), "{raw}");
        }
    }

    proptest! {
        #[test]
        fn the_shortcut_answers_as_decoding_does(raw in "[a-c./%2eEF~:é\\x01 ]{0,12}") {
            prop_assert_eq!(StreamName::from_path(&raw), from_path_decoded(&raw));
        }

        #[test]
        fn every_spelling_of_a_name_is_the_same_stream(
            text in text_name(),
            escape in prop::collection::vec(any::<bool>(), 1..8),
            upper in prop::collection::vec(any::<bool>(), 1..8),
        ) {
            let name = StreamName::from_text(&text).unwrap();
            prop_assert_eq!(name.text(), Some(text.clone()));
            let path = spell(&text, &escape, &upper);
            prop_assert_eq!(StreamName::from_path(&path).unwrap(), name.clone());
            prop_assert_eq!(StreamName::from_path(&format!("/{path}/")).unwrap(), name.clone());
            // The stored spelling reads back as the same name, by either rule.
            prop_assert_eq!(StreamName::from_path(name.as_str()).unwrap(), name.clone());
            prop_assert_eq!(StreamName::parse(name.as_str()).unwrap(), name);
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
