//! Text forms of record offsets (Durable Streams `Stream-Next-Offset`, `offset=`).
//! Offsets are zero-padded to 20 digits so lexicographic order equals numeric order.

use thiserror::Error;

/// Where a reader asks to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// `-1`: the first readable record.
    Beginning,
    /// `now`: the current tail.
    Now,
    /// A concrete offset (20-digit padded or plain digits).
    At(u64),
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OffsetError {
    #[error("bad offset: value=`{0}` (want -1, now, or up to 20 decimal digits)")]
    Bad(String),
}

/// The 20-digit, zero-padded form of `offset`.
pub fn format_offset(offset: u64) -> String {
    format!("{offset:020}")
}

/// Parses `-1`, `now`, or up to 20 ASCII digits (leading zeros allowed).
pub fn parse_offset(s: &str) -> Result<OffsetSpec, OffsetError> {
    match s {
        "-1" => Ok(OffsetSpec::Beginning),
        "now" => Ok(OffsetSpec::Now),
        _ if !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()) => s
            .parse::<u64>()
            .map(OffsetSpec::At)
            .map_err(|_| OffsetError::Bad(s.to_string())),
        _ => Err(OffsetError::Bad(s.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_sorts_like_numbers() {
        assert_eq!(format_offset(0), "00000000000000000000");
        assert_eq!(format_offset(u64::MAX), "18446744073709551615");
        assert!(format_offset(9) < format_offset(10));
    }

    #[test]
    fn parse_forms() {
        assert_eq!(parse_offset("-1"), Ok(OffsetSpec::Beginning));
        assert_eq!(parse_offset("now"), Ok(OffsetSpec::Now));
        assert_eq!(parse_offset("42"), Ok(OffsetSpec::At(42)));
        assert_eq!(parse_offset(&format_offset(42)), Ok(OffsetSpec::At(42)));
        for bad in [
            "",
            "-2",
            "+1",
            "1.5",
            "NOW",
            "99999999999999999999",
            "000000000000000000001",
        ] {
            assert!(parse_offset(bad).is_err(), "{bad}");
        }
    }
}
