//! Bucket URIs: `<bucket id>@<scheme>://<location>?<params>`, e.g. `-2@file://./objects`,
//! `-2@s3://bucket?region=us-east-1&endpoint=http://127.0.0.1:9000&pathStyle=true`,
//! `-3@memory://wal`. The numeric id lets one flag express placement as well as location.
//!
//! URIs can carry credentials (`postgres://user:password@host/db`): `Display`, `Debug` and
//! [`UriError`] show them masked (`user:***@`), since all three end up in logs and messages.

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

/// `Shape` and `BadId` hold the URI with its secrets masked (see [`redact`]).
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

/// A parsed bucket URI. `Debug` and `Display` mask secrets.
#[derive(Clone, PartialEq, Eq)]
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
        for scheme in ["postgres://", "postgresql://"] {
            if let Some(rest) = raw.strip_prefix(scheme) {
                // One spelling of the location, as with an id, so `Display` round-trips.
                return Ok(BucketUri {
                    id: 0,
                    scheme: Scheme::Postgres,
                    location: format!("postgres://{rest}"),
                    params: BTreeMap::new(),
                });
            }
        }
        let shape = || UriError::Shape(redact(raw));
        let (id, rest) = raw.split_once('@').ok_or_else(shape)?;
        let id: i32 = id.parse().map_err(|_| UriError::BadId(redact(raw)))?;
        let (scheme, rest) = rest.split_once("://").ok_or_else(shape)?;
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
            return Err(shape());
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

/// `<id>@<location>`: parses back to the same URI unless a secret was masked.
impl fmt::Display for BucketUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scheme == Scheme::Postgres {
            return write!(f, "{}@{}", self.id, redact(&self.location));
        }
        let scheme = match self.scheme {
            Scheme::File => "file",
            Scheme::Memory => "memory",
            Scheme::S3 => "s3",
            Scheme::Postgres => "postgres",
        };
        write!(f, "{}@{}://{}", self.id, scheme, self.location)?;
        for (i, (k, v)) in self.params.iter().enumerate() {
            let sep = if i == 0 { '?' } else { '&' };
            write!(f, "{sep}{k}={}", redact_param(k, v))?;
        }
        Ok(())
    }
}

impl fmt::Debug for BucketUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let params: BTreeMap<&str, String> = self
            .params
            .iter()
            .map(|(k, v)| (k.as_str(), redact_param(k, v)))
            .collect();
        f.debug_struct("BucketUri")
            .field("id", &self.id)
            .field("scheme", &self.scheme)
            .field("location", &redact(&self.location))
            .field("params", &params)
            .finish()
    }
}

/// What masked secrets read as.
const MASK: &str = "***";

/// `raw` with the password of a `user:password@` and the values of secret-named query
/// parameters masked, for logs and messages (any URL, not only bucket URIs). It also serves
/// URIs that failed to parse, so it assumes little: the user info runs from the last `://`
/// (else an `<id>@` prefix, else the start) to the last `@` before the query, which masks
/// more than a URL parser would rather than less.
pub fn redact(raw: &str) -> String {
    let (head, query) = match raw.find(['?', '#']) {
        Some(i) => raw.split_at(i),
        None => (raw, ""),
    };
    let mut out = mask_userinfo(head);
    if let Some(q) = query.strip_prefix('?') {
        out.push('?');
        for (i, pair) in q.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((k, v)) => {
                    out.push_str(k);
                    out.push('=');
                    out.push_str(&redact_param(k, v));
                }
                None => out.push_str(pair),
            }
        }
    } else {
        out.push_str(query);
    }
    out
}

/// A parameter value as shown: masked if the name says it is a secret, else with any
/// `user:password@` in it (an `endpoint` URL) masked.
fn redact_param(key: &str, value: &str) -> String {
    let key = key.to_ascii_lowercase();
    if ["password", "passwd", "secret", "token"]
        .iter()
        .any(|s| key.contains(s))
    {
        return MASK.to_string();
    }
    mask_userinfo(value)
}

fn mask_userinfo(s: &str) -> String {
    let Some(at) = s.rfind('@') else {
        return s.to_string();
    };
    let start = match s[..at].rfind("://") {
        Some(i) => i + 3,
        None => s
            .split_once('@')
            .filter(|(id, _)| id.parse::<i32>().is_ok())
            .map_or(0, |(id, _)| id.len() + 1),
    };
    // `start` is past `at` when the only `@` is the id's.
    match s.get(start..at).and_then(|info| info.find(':')) {
        Some(colon) => format!("{}{MASK}{}", &s[..start + colon + 1], &s[at..]),
        None => s.to_string(),
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

    #[test]
    fn display_keeps_the_id_and_masks_postgres_secrets() {
        let u = BucketUri::parse(
            "-1@postgres://pico:hunter2@db:5432/wal?sslmode=require&password=hunter2",
        )
        .unwrap();
        assert_eq!(
            u.to_string(),
            "-1@postgres://pico:***@db:5432/wal?sslmode=require&password=***"
        );
        assert!(!format!("{u:?}").contains("hunter2"));
        // A password holding `@` or `/` is masked whole.
        let u = BucketUri::parse("postgres://pico:a@b/c@db/wal").unwrap();
        assert_eq!(u.to_string(), "0@postgres://pico:***@db/wal");
        // Without secrets, Display parses back to the same URI.
        for raw in [
            "-1@postgres://pico@db/wal",
            "postgres://db/wal",
            "postgresql://db/wal",
            "7@postgresql://u@h/d?sslmode=disable",
            "-2@file://./objects?batchInterval=5",
            "-2@s3://bkt?endpoint=http://127.0.0.1:9000&region=r",
            "-3@memory://wal",
        ] {
            let u = BucketUri::parse(raw).unwrap();
            assert_eq!(BucketUri::parse(&u.to_string()).unwrap(), u, "{raw}");
        }
        assert_eq!(
            BucketUri::parse("postgresql://db/wal").unwrap().to_string(),
            "0@postgres://db/wal"
        );
    }

    #[test]
    fn errors_and_parameters_mask_secrets() {
        for (raw, shown) in [
            ("pico:hunter2@db/wal", "pico:***@db/wal"),
            ("x@pg://pico:hunter2@db", "x@pg://pico:***@db"),
            ("-1@postgres:/pico:hunter2@db", "-1@postgres:***@db"),
            ("-2@file://?password=hunter2", "-2@file://?password=***"),
        ] {
            let e = BucketUri::parse(raw).unwrap_err();
            assert!(
                matches!(e, UriError::Shape(_) | UriError::BadId(_)),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(!msg.contains("hunter2"), "{msg}");
            assert!(msg.contains(&format!("uri=`{shown}`")), "{msg}");
        }
        // Nothing to mask: the URI as given.
        assert_eq!(
            BucketUri::parse("x@file://a").unwrap_err(),
            UriError::BadId("x@file://a".into())
        );
        assert_eq!(redact("-1@a:b"), "-1@a:b");
        let s3 = BucketUri::parse(
            "-2@s3://bkt?secretKey=hunter2&endpoint=http://ak:hunter2@minio:9000&region=r",
        )
        .unwrap();
        assert_eq!(
            s3.to_string(),
            "-2@s3://bkt?endpoint=http://ak:***@minio:9000&region=r&secretKey=***"
        );
        assert!(!format!("{s3:?}").contains("hunter2"));
        // Only the shown form is masked.
        assert_eq!(s3.params["secretKey"], "hunter2");
    }
}
