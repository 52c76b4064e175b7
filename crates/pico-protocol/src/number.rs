//! Strict decimal integers for headers such as `Pico-TTL`: ASCII digits only, no sign, no
//! leading zeros (except "0" itself), no decimal point or exponent, no surrounding whitespace.
//! Also the writer for decimals on hot paths ([`push_decimal`]).

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NumberError {
    #[error("empty number")]
    Empty,
    #[error("not a strict decimal integer: value=`{0}`")]
    NotDecimal(String),
    #[error("leading zero in number: value=`{0}`")]
    LeadingZero(String),
    #[error("number out of range: value=`{0}`")]
    Overflow(String),
}

/// Parses a strict decimal `u64` (see the module doc).
pub fn parse_strict_u64(s: &str) -> Result<u64, NumberError> {
    if s.is_empty() {
        return Err(NumberError::Empty);
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NumberError::NotDecimal(s.to_string()));
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err(NumberError::LeadingZero(s.to_string()));
    }
    s.parse::<u64>()
        .map_err(|_| NumberError::Overflow(s.to_string()))
}

/// Appends `v` in decimal, zero-padded to `width` digits (20 is all a u64 needs). For paths
/// that write numbers per subscriber per append, where `format!` showed up in profiles.
pub fn push_decimal(out: &mut Vec<u8>, mut v: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let start = i.min(digits.len().saturating_sub(width));
    out.extend_from_slice(&digits[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_decimal_matches_format() {
        for v in [0u64, 7, 10, 42, 1_700_000_123, u64::MAX] {
            for width in [0usize, 1, 5, 20] {
                let mut out = Vec::new();
                push_decimal(&mut out, v, width);
                assert_eq!(String::from_utf8(out).unwrap(), format!("{v:0width$}"));
            }
        }
    }

    #[test]
    fn accepts_plain_decimals() {
        assert_eq!(parse_strict_u64("0"), Ok(0));
        assert_eq!(parse_strict_u64("3600"), Ok(3600));
        assert_eq!(parse_strict_u64("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn rejects_everything_else() {
        assert_eq!(parse_strict_u64(""), Err(NumberError::Empty));
        for bad in ["+1", "-1", "1.0", "1e3", " 1", "1 ", "0x10", "abc", "١"] {
            assert!(
                matches!(parse_strict_u64(bad), Err(NumberError::NotDecimal(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_strict_u64("01"),
            Err(NumberError::LeadingZero(_))
        ));
        assert!(matches!(
            parse_strict_u64("00"),
            Err(NumberError::LeadingZero(_))
        ));
        assert!(matches!(
            parse_strict_u64("18446744073709551616"),
            Err(NumberError::Overflow(_))
        ));
    }
}
