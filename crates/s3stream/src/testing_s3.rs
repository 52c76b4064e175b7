//! A fresh bucket on the S3-compatible server of the tests, shared by this crate's tests and
//! the host's end-to-end tests.
//!
//! The server is `PICO_TEST_S3_ENDPOINT` (e.g. `http://127.0.0.1:9000`; `scripts/lib/moto.sh`
//! starts one). Unset: the test fails under `PICO_TEST_REQUIRE_ALL=1`, otherwise it is skipped
//! loudly. Credentials are `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, else `testing`.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::storage::{ObjectStorage, S3Config, S3Storage};

/// The variable naming the test server.
pub const ENDPOINT_VAR: &str = "PICO_TEST_S3_ENDPOINT";

/// A bucket made for one test.
#[derive(Debug, Clone)]
pub struct TestBucket {
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

impl TestBucket {
    /// A new empty bucket, or `None` (test skipped) when no server is configured. A server
    /// that is configured but does not answer fails the test.
    pub async fn create() -> Option<TestBucket> {
        let Some(endpoint) = std::env::var(ENDPOINT_VAR).ok().filter(|e| !e.is_empty()) else {
            if std::env::var("PICO_TEST_REQUIRE_ALL").as_deref() == Ok("1") {
                panic!(
                    "no S3 server and PICO_TEST_REQUIRE_ALL=1: set {ENDPOINT_VAR} (scripts/test.sh \
                     starts moto through scripts/lib/moto.sh)"
                );
            }
            // Straight to the stderr stream: libtest would capture `eprintln!`, hiding it.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED (no S3 server: set {ENDPOINT_VAR})"
            );
            return None;
        };
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let bucket = format!(
            "pico-test-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let b = TestBucket {
            endpoint,
            bucket,
            access_key: env_or("AWS_ACCESS_KEY_ID", "testing"),
            secret_key: env_or("AWS_SECRET_ACCESS_KEY", "testing"),
        };
        let s = b.storage().await;
        if let Err(e) = s.client().create_bucket().bucket(&b.bucket).send().await {
            panic!(
                "creating bucket {} on {} failed: {}",
                b.bucket,
                b.endpoint,
                aws_sdk_s3::error::DisplayErrorContext(&e)
            );
        }
        Some(b)
    }

    /// The storage's settings for this bucket, under `prefix` ("" for none).
    pub fn config(&self, prefix: &str) -> S3Config {
        let mut c = S3Config::new(&self.bucket);
        if !prefix.is_empty() {
            c.prefix = format!("{}/", prefix.trim_matches('/'));
        }
        c.region = Some("us-east-1".into());
        c.endpoint = Some(self.endpoint.clone());
        c.path_style = true;
        c.static_credentials = Some((self.access_key.clone(), self.secret_key.clone()));
        c
    }

    /// A storage on the whole bucket.
    pub async fn storage(&self) -> S3Storage {
        S3Storage::connect(&self.config("")).await
    }

    /// `bucket/prefix?region=…&endpoint=…&pathStyle=true`: what follows `s3://` in a bucket
    /// URI naming this bucket (the node then needs the credentials in its environment).
    pub fn uri_location(&self, prefix: &str) -> String {
        let path = if prefix.is_empty() {
            self.bucket.clone()
        } else {
            format!("{}/{}", self.bucket, prefix.trim_matches('/'))
        };
        format!(
            "{path}?region=us-east-1&endpoint={}&pathStyle=true",
            self.endpoint
        )
    }

    /// Deletes every object and the bucket (best effort: a test server forgets it anyway).
    pub async fn destroy(self) {
        let s = self.storage().await;
        if let Ok(keys) = s.list("").await {
            for k in keys {
                let _ = s.delete(&k).await;
            }
        }
        let _ = s.client().delete_bucket().bucket(&self.bucket).send().await;
    }
}
