//! Text forms of record offsets (Durable Streams `Stream-Next-Offset`, `offset=`).
//! Offsets are zero-padded to 20 digits so lexicographic order equals numeric order.
//!
//! For interoperability, the reference server's `RRRRRRRRRRRRRRRR_BBBBBBBBBBBBBBBB` form is also
//! accepted on input (clients and the conformance suite hard-code its zero offset): it names
//! record offset `B`. We never mint it, so only `R` = 0 is accepted: any other `R` came from
//! another server, and reading from `B` would read the wrong place (offsets are opaque and
//! server-private; a server need only accept its own).

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
    #[error(
        "bad offset: value=`{0}` (not an offset of this server: the part before `_` must be 0)"
    )]
    Foreign(String),
}

/// The 20-digit, zero-padded form of `offset`.
pub fn format_offset(offset: u64) -> String {
    let mut out = Vec::with_capacity(20);
    push_offset(&mut out, offset);
    // Only ASCII digits were written.
    String::from_utf8(out).unwrap_or_default()
}

/// Appends the 20-digit form of `offset` (as [`format_offset`], without allocating).
pub fn push_offset(out: &mut Vec<u8>, offset: u64) {
    crate::number::push_decimal(out, offset, 20);
}

/// Parses `-1`, `now`, up to 20 ASCII digits (leading zeros allowed), or the interop form
/// `0_digits` (`R` zero in any number of digits; see the module doc).
pub fn parse_offset(s: &str) -> Result<OffsetSpec, OffsetError> {
    let digits = |d: &str| -> Option<u64> {
        if !d.is_empty() && d.len() <= 20 && d.bytes().all(|b| b.is_ascii_digit()) {
            d.parse::<u64>().ok()
        } else {
            None
        }
    };
    match s {
        "-1" => Ok(OffsetSpec::Beginning),
        "now" => Ok(OffsetSpec::Now),
        _ => {
            let value = match s.split_once('_') {
                Some((read_seq, position)) => match (digits(read_seq), digits(position)) {
                    (Some(0), b) => b,
                    (Some(_), Some(_)) => return Err(OffsetError::Foreign(s.to_string())),
                    _ => None,
                },
                None => digits(s),
            };
            value
                .map(OffsetSpec::At)
                .ok_or_else(|| OffsetError::Bad(s.to_string()))
        }
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
        assert_eq!(
            parse_offset("0000000000000000_0000000000000000"),
            Ok(OffsetSpec::At(0))
        );
        assert_eq!(
            parse_offset("0000000000000000_0000000000000007"),
            Ok(OffsetSpec::At(7))
        );
        assert_eq!(parse_offset("0_7"), Ok(OffsetSpec::At(7)));
        // A non-zero read sequence was minted elsewhere: refused, not read from `B`.
        for foreign in [
            "0000000000000001_0000000000000007",
            "5_7",
            "9999999999999999_0",
        ] {
            assert_eq!(
                parse_offset(foreign),
                Err(OffsetError::Foreign(foreign.to_string()))
            );
        }
        for bad in [
            "",
            "-2",
            "+1",
            "1.5",
            "NOW",
            "99999999999999999999",
            "000000000000000000001",
            "0,1",
            "0 1",
            "_1",
            "1_",
            "1_2_3",
            "a_1",
        ] {
            assert!(parse_offset(bad).is_err(), "{bad}");
        }
    }
}
