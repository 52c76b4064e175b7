//! Bucket URIs: `<bucket id>@<scheme>://<location>?<params>`, e.g. `-2@file://./objects`,
//! `-2@s3://bucket?region=us-east-1&endpoint=http://127.0.0.1:9000&pathStyle=true`,
//! `-3@memory://wal`. The numeric id lets one flag express placement as well as location.

use std::collections::BTreeMap;
use std::fmt;
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    File,
    Memory,
    S3,
    Postgres,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UriError {
    #[error("bucket uri needs `<id>@<scheme>://<location>`: uri=`{0}`")]
    Shape(String),
    #[error("bucket id is not an integer: uri=`{0}`")]
    BadId(String),
    #[error("unsupported bucket scheme (file, memory, s3, postgres): scheme=`{0}`")]
    Scheme(String),
    #[error("bad bucket uri parameter: param=`{0}`")]
    Param(String),
}

/// A parsed bucket URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketUri {
    pub id: i32,
    pub scheme: Scheme,
    /// Path for `file`, name for `memory`, bucket for `s3`, whole URL for `postgres`.
    pub location: String,
    pub params: BTreeMap<String, String>,
}

impl BucketUri {
    /// Parses `-2@file://./objects?batchInterval=5`. A `postgres://…` URL without an id
    /// is accepted for the WAL flag and gets id 0.
    pub fn parse(raw: &str) -> Result<BucketUri, UriError> {
        let raw = raw.trim();
        if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
            return Ok(BucketUri {
                id: 0,
                scheme: Scheme::Postgres,
                location: raw.to_string(),
                params: BTreeMap::new(),
            });
        }
        let (id, rest) = raw
            .split_once('@')
            .ok_or_else(|| UriError::Shape(raw.to_string()))?;
        let id: i32 = id.parse().map_err(|_| UriError::BadId(raw.to_string()))?;
        let (scheme, rest) = rest
            .split_once("://")
            .ok_or_else(|| UriError::Shape(raw.to_string()))?;
        let scheme = match scheme {
            "file" => Scheme::File,
            "memory" | "mem" => Scheme::Memory,
            "s3" => Scheme::S3,
            "postgres" | "postgresql" => Scheme::Postgres,
            other => return Err(UriError::Scheme(other.to_string())),
        };
        if scheme == Scheme::Postgres {
            return Ok(BucketUri {
                id,
                scheme,
                location: format!("postgres://{rest}"),
                params: BTreeMap::new(),
            });
        }
        let (location, query) = match rest.split_once('?') {
            Some((l, q)) => (l, Some(q)),
            None => (rest, None),
        };
        if location.is_empty() {
            return Err(UriError::Shape(raw.to_string()));
        }
        let mut params = BTreeMap::new();
        if let Some(q) = query {
            for pair in q.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| UriError::Param(pair.to_string()))?;
                if k.is_empty() {
                    return Err(UriError::Param(pair.to_string()));
                }
                params.insert(k.to_string(), v.to_string());
            }
        }
        Ok(BucketUri {
            id,
            scheme,
            location: location.to_string(),
            params,
        })
    }

    /// A numeric parameter, if present; a present but malformed value is an error.
    pub fn param_u64(&self, key: &str) -> Result<Option<u64>, UriError> {
        match self.params.get(key) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| UriError::Param(format!("{key}={v}"))),
        }
    }

    /// The same location with another bucket id (the default WAL is storage id − 1).
    pub fn with_id(&self, id: i32) -> BucketUri {
        BucketUri { id, ..self.clone() }
    }
}

impl fmt::Display for BucketUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scheme == Scheme::Postgres {
            return f.write_str(&self.location);
        }
        let scheme = match self.scheme {
            Scheme::File => "file",
            Scheme::Memory => "memory",
            Scheme::S3 => "s3",
            Scheme::Postgres => "postgres",
        };
        write!(f, "{}@{}://{}", self.id, scheme, self.location)?;
        for (i, (k, v)) in self.params.iter().enumerate() {
            write!(f, "{}{}={}", if i == 0 { '?' } else { '&' }, k, v)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_uri_with_params() {
        let u =
            BucketUri::parse("-2@file://./objects?batchInterval=5&maxBytesInBatch=1024").unwrap();
        assert_eq!(u.id, -2);
        assert_eq!(u.scheme, Scheme::File);
        assert_eq!(u.location, "./objects");
        assert_eq!(u.param_u64("batchInterval").unwrap(), Some(5));
        assert_eq!(u.param_u64("missing").unwrap(), None);
        assert_eq!(
            u.to_string(),
            "-2@file://./objects?batchInterval=5&maxBytesInBatch=1024"
        );
        assert_eq!(u.with_id(-3).id, -3);
    }

    #[test]
    fn parses_s3_and_postgres() {
        let u = BucketUri::parse("-2@s3://bkt?region=us-east-1&endpoint=http://127.0.0.1:9000")
            .unwrap();
        assert_eq!(u.scheme, Scheme::S3);
        assert_eq!(u.params["endpoint"], "http://127.0.0.1:9000");
        let p = BucketUri::parse("postgres://127.0.0.1/test").unwrap();
        assert_eq!(p.scheme, Scheme::Postgres);
    }

    #[test]
    fn rejects_malformed() {
        assert!(matches!(
            BucketUri::parse("file://x"),
            Err(UriError::Shape(_))
        ));
        assert!(matches!(
            BucketUri::parse("x@file://a"),
            Err(UriError::BadId(_))
        ));
        assert!(matches!(
            BucketUri::parse("1@ftp://a"),
            Err(UriError::Scheme(_))
        ));
        assert!(matches!(
            BucketUri::parse("1@file://a?x=1").unwrap().param_u64("x"),
            Ok(Some(1))
        ));
        assert!(
            BucketUri::parse("1@file://a?x=z")
                .unwrap()
                .param_u64("x")
                .is_err()
        );
    }
}
