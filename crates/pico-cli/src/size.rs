//! Byte sizes on the command line: `65536`, `64KiB`, `32MiB`, `1GiB` (also `KB`/`MB`/`GB`).

/// Parses a size; binary suffixes are powers of 1024, decimal ones powers of 1000.
pub fn parse_size(raw: &str) -> Result<usize, String> {
    let s = raw.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    if digits.is_empty() {
        return Err(format!("size needs a number, e.g. 64KiB: size=`{raw}`"));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("size is too large: size=`{raw}`"))?;
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size suffix (use KiB, MiB, GiB): suffix=`{other}`"
            ));
        }
    };
    let bytes = n
        .checked_mul(mult)
        .ok_or_else(|| format!("size is too large: size=`{raw}`"))?;
    usize::try_from(bytes).map_err(|_| format!("size is too large: size=`{raw}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed_sizes() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(64 * 1024));
        assert_eq!(parse_size("32MiB"), Ok(32 * 1024 * 1024));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2kb"), Ok(2000));
        assert_eq!(parse_size("7 MiB"), Ok(7 << 20));
        assert_eq!(parse_size("16k"), Ok(16 << 10));
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(parse_size("").is_err());
        assert!(parse_size("KiB").is_err());
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999GiB").is_err());
    }
}
