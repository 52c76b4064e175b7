//! Stream names are URL-path-like (`logs/api/prod`). The canonical form has no leading or
//! trailing slash; `/orders/42`, `orders/42` and `orders/42/` name the same stream.

use std::fmt;
use thiserror::Error;

/// Longest accepted canonical name, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    #[error("stream name is empty")]
    Empty,
    #[error("stream name too long: len={0} max={MAX_NAME_LEN}")]
    TooLong(usize),
    #[error("stream name has an empty, `.` or `..` segment: name=`{0}`")]
    BadSegment(String),
    #[error("stream name has a character outside [A-Za-z0-9-._~:@!$&'()*+,;=%]: name=`{0}`")]
    BadChar(String),
}

/// A validated canonical stream name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamName(String);

impl StreamName {
    /// Validates `raw` (leading/trailing `/` ignored) and returns its canonical form.
    pub fn parse(raw: &str) -> Result<StreamName, NameError> {
        let trimmed = raw.trim_matches('/');
        if trimmed.is_empty() {
            return Err(NameError::Empty);
        }
        if trimmed.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong(trimmed.len()));
        }
        for seg in trimmed.split('/') {
            if seg.is_empty() || seg == "." || seg == ".." {
                return Err(NameError::BadSegment(trimmed.to_string()));
            }
        }
        let ok = |c: char| c.is_ascii_alphanumeric() || "-._~:@!$&'()*+,;=%/".contains(c);
        if !trimmed.chars().all(ok) {
            return Err(NameError::BadChar(trimmed.to_string()));
        }
        Ok(StreamName(trimmed.to_string()))
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
}
