//! Durable Streams JSON mode: a POST body is one JSON value; a top-level array is flattened
//! exactly one level (each element is one message), anything else is one message. Messages keep
//! their original bytes (trimmed), so a read returns exactly what was written.

use bytes::Bytes;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DsJsonError {
    #[error("invalid JSON: {0}")]
    Invalid(String),
    #[error("too many messages in one append: max={max}")]
    TooMany { max: usize },
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s
        && is_ws(*first)
    {
        s = rest;
    }
    while let [rest @ .., last] = s
        && is_ws(*last)
    {
        s = rest;
    }
    s
}

/// The messages of a JSON-mode body, at most `max` (the scan stops at the first one past it, so
/// a huge array never becomes as many messages). An empty array yields no messages (the caller
/// decides: `[]` is an error on append and an empty stream on create).
pub fn split_messages(body: &Bytes, max: usize) -> Result<Vec<Bytes>, DsJsonError> {
    // JSON is UTF-8 (RFC 8259), and `from_slice` does not check the bytes inside strings:
    // stored invalid UTF-8 would be read back mangled. Validation allocates nothing per element.
    let text = std::str::from_utf8(body).map_err(|e| {
        DsJsonError::Invalid(format!(
            "body is not valid UTF-8: at byte {}",
            e.valid_up_to()
        ))
    })?;
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map_err(|e| DsJsonError::Invalid(e.to_string()))?;
    let value = trim(body);
    let start = value.as_ptr() as usize - body.as_ptr() as usize;
    if value.first() != Some(&b'[') {
        return Ok(vec![body.slice(start..start + value.len())]);
    }
    // The body is valid JSON, so a small scanner finds the top-level element boundaries.
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut elem_start = start + 1;
    for (i, &b) in value.iter().enumerate() {
        let at = start + i;
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => depth += 1,
            b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    push_element(body, elem_start, at, &mut out, max)?;
                }
            }
            b',' if depth == 1 => {
                push_element(body, elem_start, at, &mut out, max)?;
                elem_start = at + 1;
            }
            _ => {}
        }
    }
    Ok(out)
}

fn push_element(
    body: &Bytes,
    from: usize,
    to: usize,
    out: &mut Vec<Bytes>,
    max: usize,
) -> Result<(), DsJsonError> {
    let raw = &body[from..to];
    let t = trim(raw);
    if t.is_empty() {
        return Ok(()); // `[]`: no element
    }
    if out.len() >= max {
        return Err(DsJsonError::TooMany { max });
    }
    let off = from + (t.as_ptr() as usize - raw.as_ptr() as usize);
    out.push(body.slice(off..off + t.len()));
    Ok(())
}

/// A JSON array of stored messages (`[]` when empty).
pub fn render_array<'a>(messages: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = vec![b'['];
    for (i, m) in messages.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(m);
    }
    out.push(b']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> Result<Vec<String>, DsJsonError> {
        split_at_most(s, usize::MAX)
    }

    fn split_at_most(s: &str, max: usize) -> Result<Vec<String>, DsJsonError> {
        split_messages(&Bytes::copy_from_slice(s.as_bytes()), max).map(|v| {
            v.into_iter()
                .map(|b| String::from_utf8(b.to_vec()).unwrap())
                .collect()
        })
    }

    #[test]
    fn flattens_exactly_one_level() {
        assert_eq!(split(r#"{"a":1}"#).unwrap(), vec![r#"{"a":1}"#]);
        assert_eq!(split(" 42 ").unwrap(), vec!["42"]);
        assert_eq!(
            split(r#"[{"a":1}, {"b":[2,3]}]"#).unwrap(),
            vec![r#"{"a":1}"#, r#"{"b":[2,3]}"#]
        );
        assert_eq!(split("[[1,2],[3,4]]").unwrap(), vec!["[1,2]", "[3,4]"]);
        assert_eq!(split("[[[1,2,3]]]").unwrap(), vec!["[[1,2,3]]"]);
        assert_eq!(
            split(r#"["a,]b\"", "c"]"#).unwrap(),
            vec![r#""a,]b\"""#, r#""c""#]
        );
        assert!(split("[]").unwrap().is_empty());
        assert!(split(" [ ] ").unwrap().is_empty());
    }

    #[test]
    fn message_count_is_bounded() {
        assert_eq!(split_at_most("[1,2,3]", 3).unwrap(), vec!["1", "2", "3"]);
        let e = split_at_most("[1,2,3,4]", 3).unwrap_err();
        assert_eq!(e, DsJsonError::TooMany { max: 3 });
        assert!(e.to_string().contains("max=3"), "{e}");
        // Nested arrays count as one message each; a single value is one message.
        assert_eq!(split_at_most("[[1,2,3,4]]", 1).unwrap().len(), 1);
        assert_eq!(
            split_at_most("[1,2,3,4,5]", 1),
            Err(DsJsonError::TooMany { max: 1 })
        );
        assert!(split_at_most("[]", 0).unwrap().is_empty());
    }

    #[test]
    fn rejects_invalid_json() {
        for bad in ["", "{ invalid json }", "[1,", "1 2", "[1]]"] {
            assert!(split(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rejects_invalid_utf8_even_inside_strings() {
        for bad in [
            &b"[\"\xff\"]"[..],
            b"\"a\xc3\"",
            b"{\"k\xed\xa0\x80\":1}",
            b"[1]\xff",
        ] {
            let e = split_messages(&Bytes::copy_from_slice(bad), usize::MAX).unwrap_err();
            assert!(
                matches!(&e, DsJsonError::Invalid(m) if m.starts_with("body is not valid UTF-8")),
                "{bad:?}: {e}"
            );
        }
        assert_eq!(
            e_msg(&b"[\"ok\",\"\xff\"]"[..]),
            "invalid JSON: body is not valid UTF-8: at byte 7"
        );
        // Multi-byte UTF-8 and escapes are fine.
        assert_eq!(
            split(r#"["é", "\u00e9"]"#).unwrap(),
            vec![r#""é""#, r#""\u00e9""#]
        );
    }

    fn e_msg(body: &[u8]) -> String {
        split_messages(&Bytes::copy_from_slice(body), usize::MAX)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn renders_arrays() {
        assert_eq!(render_array(Vec::<&[u8]>::new()), b"[]");
        assert_eq!(render_array([&b"1"[..], b"{\"a\":2}"]), b"[1,{\"a\":2}]");
    }
}
