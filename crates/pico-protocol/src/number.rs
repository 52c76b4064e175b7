//! Strict decimal integers for headers such as `Pico-TTL`: ASCII digits only, no sign, no
//! leading zeros (except "0" itself), no decimal point or exponent, no surrounding whitespace.

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

#[cfg(test)]
mod tests {
    use super::*;

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
