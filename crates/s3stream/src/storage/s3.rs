//! `S3Storage`: objects in a bucket of any S3-compatible store, through `aws-sdk-s3`.
//!
//! Only standard S3 is relied on (PUT, ranged GET, ListObjectsV2, DELETE, multipart upload)
//! plus `If-None-Match: *` for [`ObjectStorage::put_if_absent`]. Transient failures
//! (throttling, 5xx, timeouts, connection resets) are retried by the SDK's standard retry
//! strategy: exponential backoff with jitter, configured explicitly here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::{Semaphore, SemaphorePermit};

use super::{ObjectStorage, StorageError, range_error};
use crate::parts::Parts;

/// Requests in flight to the store at once, by default (`concurrency`).
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Objects above this size are uploaded in parts of this size (`partBytes`).
pub const DEFAULT_PART_BYTES: usize = 16 << 20;
/// S3's smallest part (all but the last).
pub const MIN_PART_BYTES: usize = 5 << 20;
/// S3's largest part.
pub const MAX_PART_BYTES: usize = 5 << 30;
/// Attempts per request, the first included (`maxAttempts`).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 6;
/// Longest single attempt of a request (`attemptTimeoutMs`): a hung connection is cut and
/// the request retried.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Parts of one object uploaded at once (each also takes a request permit).
const PARTS_IN_FLIGHT: usize = 4;
/// Tries of a conditional put answered 409 (another conditional write to the key in flight).
const CONFLICT_TRIES: u32 = 5;
/// Keys per DeleteObjects request (S3's limit).
const DELETE_BATCH: usize = 1000;
/// Region when neither the URI nor the environment names one (S3-compatible servers ignore it).
const FALLBACK_REGION: &str = "us-east-1";

/// A bad `s3://` location or parameter.
#[derive(Debug, thiserror::Error)]
pub enum S3ConfigError {
    #[error("s3 location needs a bucket name: location=`{0}`")]
    NoBucket(String),
    #[error("bad s3 parameter `{name}={value}`: {why}")]
    Param {
        name: &'static str,
        value: String,
        why: String,
    },
}

/// Where and how to reach a bucket. Built from a bucket URI's location and parameters by
/// [`S3Config::from_uri`], or field by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// Prepended to every key: empty, or ending in '/'.
    pub prefix: String,
    /// None: the AWS environment / profile's region, else `us-east-1`.
    pub region: Option<String>,
    /// None: AWS (or `AWS_ENDPOINT_URL`).
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), which most S3-compatible servers need.
    pub path_style: bool,
    pub concurrency: usize,
    pub part_bytes: usize,
    pub max_attempts: u32,
    pub attempt_timeout: Duration,
    /// Fixed (access key, secret key) instead of the standard chain: for tests only, never
    /// read from a URI (a node takes its credentials from the environment or a profile).
    pub static_credentials: Option<(String, String)>,
}

impl S3Config {
    /// Defaults for `bucket` with no prefix.
    pub fn new(bucket: impl Into<String>) -> S3Config {
        S3Config {
            bucket: bucket.into(),
            prefix: String::new(),
            region: None,
            endpoint: None,
            path_style: false,
            concurrency: DEFAULT_CONCURRENCY,
            part_bytes: DEFAULT_PART_BYTES,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            static_credentials: None,
        }
    }

    /// From the parts of `-2@s3://bucket/optional/prefix?region=…&endpoint=…&pathStyle=true`:
    /// `location` is `bucket/optional/prefix`. Parameters not named here are left alone (the
    /// same URI carries the engine's).
    pub fn from_uri(
        location: &str,
        params: &BTreeMap<String, String>,
    ) -> Result<S3Config, S3ConfigError> {
        let location = location.trim_matches('/');
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        if bucket.is_empty() {
            return Err(S3ConfigError::NoBucket(location.to_string()));
        }
        let mut cfg = S3Config::new(bucket);
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            cfg.prefix = format!("{prefix}/");
        }
        let bad = |name: &'static str, value: &str, why: &str| S3ConfigError::Param {
            name,
            value: value.to_string(),
            why: why.to_string(),
        };
        let number = |name: &'static str, lo: u64, hi: u64| -> Result<Option<u64>, S3ConfigError> {
            let Some(v) = params.get(name) else {
                return Ok(None);
            };
            let n: u64 = v.parse().map_err(|_| bad(name, v, "not a number"))?;
            if !(lo..=hi).contains(&n) {
                return Err(bad(name, v, &format!("must be between {lo} and {hi}")));
            }
            Ok(Some(n))
        };
        if let Some(r) = params.get("region").filter(|r| !r.is_empty()) {
            cfg.region = Some(r.clone());
        }
        if let Some(e) = params.get("endpoint").filter(|e| !e.is_empty()) {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(bad("endpoint", e, "must start with http:// or https://"));
            }
            cfg.endpoint = Some(e.clone());
        }
        if let Some(v) = params.get("pathStyle") {
            cfg.path_style = match v.as_str() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return Err(bad("pathStyle", v, "must be true or false")),
            };
        }
        if let Some(n) = number("concurrency", 1, 4096)? {
            cfg.concurrency = n as usize;
        }
        if let Some(n) = number("partBytes", MIN_PART_BYTES as u64, MAX_PART_BYTES as u64)? {
            cfg.part_bytes = n as usize;
        }
        if let Some(n) = number("maxAttempts", 1, 100)? {
            cfg.max_attempts = n as u32;
        }
        if let Some(n) = number("attemptTimeoutMs", 100, 3_600_000)? {
            cfg.attempt_timeout = Duration::from_millis(n);
        }
        Ok(cfg)
    }
}

/// A bucket (and key prefix) on an S3-compatible store.
pub struct S3Storage {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
    part_bytes: usize,
    /// Bounds the requests in flight (each part of a multipart upload is one).
    permits: Semaphore,
    /// Set once the store answered a conditional write 501 (not implemented).
    no_conditional_writes: AtomicBool,
    /// Set once the store refused a DeleteObjects request (not implemented, or a checksum
    /// header it does not take): keys are then deleted one request each.
    no_batch_deletes: AtomicBool,
}

impl std::fmt::Debug for S3Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Storage")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Aborts a multipart upload whose `put_multipart` future was dropped before it completed or
/// aborted the upload itself. The abort runs as a task of its own (a drop cannot wait), without
/// a permit: one request per dropped upload, which the uploader's own bound on uploads in
/// flight already limits. Left behind, the parts would cost space until a lifecycle rule
/// removes them; that still happens when the runtime is shutting down (its new tasks do not
/// run), or when the drop came during the completion and the object exists (the abort then
/// answers NoSuchUpload, logged).
struct AbortIfDropped {
    request: Option<
        aws_sdk_s3::operation::abort_multipart_upload::builders::AbortMultipartUploadFluentBuilder,
    >,
}

impl Drop for AbortIfDropped {
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("a dropped multipart upload was not aborted: no runtime to send it");
            return;
        };
        runtime.spawn(async move {
            match request.send().await {
                Ok(_) => tracing::debug!("aborted a dropped multipart upload"),
                Err(e) => tracing::warn!(
                    error = %DisplayErrorContext(&e),
                    "aborting a dropped multipart upload failed; its parts stay until a \
                     lifecycle rule removes them"
                ),
            }
        });
    }
}

/// The SDK client for `cfg`: credentials from the standard chain (`AWS_*` environment,
/// profiles, web identity, container and instance metadata), explicit retries and timeouts.
pub(crate) async fn client(cfg: &S3Config) -> aws_sdk_s3::Client {
    // rustls on ring: the crypto the rest of the tree already builds.
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    // The loader resolves a region the URI does not give with this HTTP client (the default
    // chain's instance-metadata lookup needs one).
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(http);
    if let Some(r) = &cfg.region {
        loader = loader.region(Region::new(r.clone()));
    }
    if let Some((key, secret)) = &cfg.static_credentials {
        loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
            key, secret, None, None, "static",
        ));
    }
    let shared = loader.load().await;
    let retry = RetryConfig::standard()
        .with_max_attempts(cfg.max_attempts)
        .with_initial_backoff(INITIAL_BACKOFF)
        .with_max_backoff(MAX_BACKOFF);
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(cfg.attempt_timeout)
        .build();
    let mut s3 = aws_sdk_s3::config::Builder::from(&shared)
        .retry_config(retry)
        .timeout_config(timeouts)
        .force_path_style(cfg.path_style)
        // Checksums only where S3 requires them (DeleteObjects). Safe: every WAL entry and
        // object carries its own CRC32C, checked on every read, so damage at rest or in flight
        // is caught where it matters; in flight the body is covered anyway, by SigV4's signed
        // `x-amz-content-sha256` (the SDK hashes and signs a body held in memory, as ours all
        // are) and by TLS over HTTPS.
        // A default CRC32 would cost a pass over each body, and S3-compatible servers differ in
        // the trailing-checksum encodings they accept.
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
    if shared.region().is_none() {
        s3 = s3.region(Region::from_static(FALLBACK_REGION));
    }
    if let Some(e) = &cfg.endpoint {
        s3 = s3.endpoint_url(e);
    }
    aws_sdk_s3::Client::from_conf(s3.build())
}

/// Status and S3 error code of a failed request (`None` when no response came).
fn status_and_code<E: ProvideErrorMetadata>(e: &SdkError<E>) -> (Option<u16>, Option<String>) {
    let status = e.raw_response().map(|r| r.status().as_u16());
    (status, e.code().map(str::to_string))
}

/// An SDK error as a `StorageError` naming the key; 404 / `NoSuchKey` is `NotFound`.
fn storage_error<E>(op: &str, key: &str, e: SdkError<E>) -> StorageError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let (status, code) = status_and_code(&e);
    // A missing bucket is a 404 too, but not a missing object.
    let missing_key = match code.as_deref() {
        Some("NoSuchKey") => true,
        Some("NoSuchBucket") => false,
        _ => status == Some(404),
    };
    if missing_key {
        return StorageError::NotFound {
            key: key.to_string(),
        };
    }
    let status = status.map_or_else(|| "none".to_string(), |s| s.to_string());
    StorageError::Other(format!(
        "s3 {op} failed: key=`{key}` status={status} code={}: {}",
        code.as_deref().unwrap_or("-"),
        DisplayErrorContext(&e)
    ))
}

/// How a conditional request ended.
enum Conditional {
    Done,
    /// 412: the object exists.
    Exists,
    /// 409: another conditional write to the key is in flight; try again.
    Conflict,
    /// 501: the store does not implement conditional writes.
    Unsupported,
}

fn conditional<T, E>(
    op: &str,
    key: &str,
    r: Result<T, SdkError<E>>,
) -> Result<Conditional, StorageError>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match r {
        Ok(_) => Ok(Conditional::Done),
        Err(e) => match status_and_code(&e) {
            (Some(412), _) => Ok(Conditional::Exists),
            (_, Some(code)) if code == "PreconditionFailed" => Ok(Conditional::Exists),
            (Some(409), _) => Ok(Conditional::Conflict),
            (Some(501), _) => Ok(Conditional::Unsupported),
            (_, Some(code)) if code == "NotImplemented" => Ok(Conditional::Unsupported),
            _ => Err(storage_error(op, key, e)),
        },
    }
}

impl S3Storage {
    /// A storage on `cfg`'s bucket; makes no request (a missing bucket or bad credentials show
    /// on the first one).
    pub async fn connect(cfg: &S3Config) -> S3Storage {
        S3Storage {
            client: client(cfg).await,
            bucket: cfg.bucket.clone(),
            prefix: cfg.prefix.clone(),
            part_bytes: cfg.part_bytes.clamp(MIN_PART_BYTES, MAX_PART_BYTES),
            permits: Semaphore::new(cfg.concurrency.max(1)),
            no_conditional_writes: AtomicBool::new(false),
            no_batch_deletes: AtomicBool::new(false),
        }
    }

    /// The SDK client (tests create buckets with it).
    pub fn client(&self) -> &aws_sdk_s3::Client {
        &self.client
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Whether `delete_many` still sends DeleteObjects (no store refused one yet).
    pub fn deletes_in_batches(&self) -> bool {
        !self.no_batch_deletes.load(Ordering::Relaxed)
    }

    fn object_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    async fn permit(&self) -> Result<SemaphorePermit<'_>, StorageError> {
        self.permits
            .acquire()
            .await
            .map_err(|_| StorageError::Other("s3 storage closed".into()))
    }

    /// One PUT of the whole object; `if_absent` adds `If-None-Match: *`.
    async fn put_single(
        &self,
        key: &str,
        data: Bytes,
        if_absent: bool,
    ) -> Result<Conditional, StorageError> {
        let _permit = self.permit().await?;
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .content_length(data.len() as i64)
            .body(ByteStream::from(data));
        if if_absent {
            req = req.if_none_match("*");
        }
        conditional("put", key, req.send().await)
    }

    /// A multipart upload in parts of `part_bytes`, `PARTS_IN_FLIGHT` at once; the object
    /// appears whole at the complete (conditional with `if_absent`). Aborted on any failure,
    /// and when the future is dropped ([`AbortIfDropped`]).
    async fn put_multipart(
        &self,
        key: &str,
        data: Bytes,
        if_absent: bool,
    ) -> Result<Conditional, StorageError> {
        let object_key = self.object_key(key);
        let upload_id = {
            let _permit = self.permit().await?;
            self.client
                .create_multipart_upload()
                .bucket(&self.bucket)
                .key(&object_key)
                .send()
                .await
                .map_err(|e| storage_error("create multipart upload", key, e))?
                .upload_id
                .ok_or_else(|| {
                    StorageError::Other(format!("s3 multipart upload without an id: key=`{key}`"))
                })?
        };
        // Armed until this call finished or aborted the upload itself: a caller that drops
        // the future (the uploader's timeout) would otherwise leave the parts behind.
        let mut dropped = AbortIfDropped {
            request: Some(
                self.client
                    .abort_multipart_upload()
                    .bucket(&self.bucket)
                    .key(&object_key)
                    .upload_id(&upload_id),
            ),
        };
        let result = self
            .upload_parts_and_complete(key, &object_key, &upload_id, data, if_absent)
            .await;
        if !matches!(result, Ok(Conditional::Done)) {
            let abort = async {
                let _permit = self.permit().await?;
                self.client
                    .abort_multipart_upload()
                    .bucket(&self.bucket)
                    .key(&object_key)
                    .upload_id(&upload_id)
                    .send()
                    .await
                    .map_err(|e| storage_error("abort multipart upload", key, e))
            };
            // Left behind, the parts only cost space until a lifecycle rule removes them.
            if let Err(e) = abort.await {
                tracing::warn!(error = %e, "aborting a multipart upload failed");
            }
        }
        // Disarmed only now: a drop during the abort above still aborts.
        dropped.request = None;
        result
    }

    async fn upload_parts_and_complete(
        &self,
        key: &str,
        object_key: &str,
        upload_id: &str,
        data: Bytes,
        if_absent: bool,
    ) -> Result<Conditional, StorageError> {
        let chunks: Vec<(i32, Bytes)> = (0..data.len())
            .step_by(self.part_bytes)
            .zip(1..)
            .map(|(start, n)| {
                let end = (start + self.part_bytes).min(data.len());
                (n, data.slice(start..end))
            })
            .collect();
        let parts: Vec<CompletedPart> = futures::stream::iter(chunks)
            .map(|(n, chunk)| async move {
                let _permit = self.permit().await?;
                let out = self
                    .client
                    .upload_part()
                    .bucket(&self.bucket)
                    .key(object_key)
                    .upload_id(upload_id)
                    .part_number(n)
                    .content_length(chunk.len() as i64)
                    .body(ByteStream::from(chunk))
                    .send()
                    .await
                    .map_err(|e| storage_error(&format!("upload part {n}"), key, e))?;
                Ok::<_, StorageError>(
                    CompletedPart::builder()
                        .part_number(n)
                        .set_e_tag(out.e_tag)
                        .build(),
                )
            })
            .buffered(PARTS_IN_FLIGHT)
            .try_collect()
            .await?;
        let _permit = self.permit().await?;
        let mut req = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(object_key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            );
        if if_absent {
            req = req.if_none_match("*");
        }
        conditional("complete multipart upload", key, req.send().await)
    }

    /// `put_if_absent` on a store without conditional writes: a look, then a plain put.
    async fn put_if_absent_unfenced(&self, key: &str, data: Bytes) -> Result<bool, StorageError> {
        let exists = {
            let _permit = self.permit().await?;
            match self
                .client
                .head_object()
                .bucket(&self.bucket)
                .key(self.object_key(key))
                .send()
                .await
            {
                Ok(_) => true,
                Err(e) => match storage_error("head", key, e) {
                    StorageError::NotFound { .. } => false,
                    e => return Err(e),
                },
            }
        };
        if exists {
            return Ok(false);
        }
        self.write(key, data, false).await.map(|_| true)
    }

    /// One DeleteObjects request for `keys` (at most [`DELETE_BATCH`]). `Ok(false)`: the
    /// store refused the request as such (it deleted nothing); delete one by one instead.
    async fn delete_batch(&self, keys: &[String]) -> Result<bool, StorageError> {
        let first = keys.first().map_or("", String::as_str);
        let objects = keys
            .iter()
            .map(|k| ObjectIdentifier::builder().key(self.object_key(k)).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StorageError::Other(format!("s3 delete objects: key=`{first}`: {e}")))?;
        // Quiet: the answer lists only the keys that could not be deleted.
        let delete = Delete::builder()
            .set_objects(Some(objects))
            .quiet(true)
            .build()
            .map_err(|e| StorageError::Other(format!("s3 delete objects: key=`{first}`: {e}")))?;
        let _permit = self.permit().await?;
        let out = match self
            .client
            .delete_objects()
            .bucket(&self.bucket)
            .delete(delete)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                return match status_and_code(&e) {
                    // Not implemented, or a request form the store does not take (some want
                    // Content-MD5 where the SDK sends a CRC32 header): nothing was deleted.
                    (Some(400 | 405 | 501), _) => {
                        tracing::warn!(
                            bucket = %self.bucket,
                            error = %DisplayErrorContext(&e),
                            "the object store refused a DeleteObjects request: deleting one \
                             key per request instead"
                        );
                        Ok(false)
                    }
                    _ => Err(storage_error("delete objects", first, e)),
                };
            }
        };
        // A missing key is deleted as far as S3 is concerned; anything listed here is not.
        if let Some(e) = out.errors().first() {
            return Err(StorageError::Other(format!(
                "s3 delete objects failed: key=`{}` code={}: {} ({} of {} keys not deleted)",
                e.key().unwrap_or("-"),
                e.code().unwrap_or("-"),
                e.message().unwrap_or("-"),
                out.errors().len(),
                keys.len()
            )));
        }
        Ok(true)
    }

    async fn write(
        &self,
        key: &str,
        data: Bytes,
        if_absent: bool,
    ) -> Result<Conditional, StorageError> {
        if data.len() > self.part_bytes {
            self.put_multipart(key, data, if_absent).await
        } else {
            self.put_single(key, data, if_absent).await
        }
    }
}

#[async_trait::async_trait]
impl ObjectStorage for S3Storage {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        match self.write(key, data, false).await? {
            Conditional::Done => Ok(()),
            // Only conditional requests are answered so.
            Conditional::Exists | Conditional::Conflict | Conditional::Unsupported => {
                Err(StorageError::Other(format!(
                    "s3 put failed: key=`{key}`: unconditional put answered as conditional"
                )))
            }
        }
    }

    /// `If-None-Match: *`. A `false` can also mean that an earlier attempt of this same call
    /// landed and its answer was lost (the retry found the object): callers that must tell
    /// compare the content.
    async fn put_if_absent(&self, key: &str, parts: Parts) -> Result<bool, StorageError> {
        let data = parts.concat();
        if self.no_conditional_writes.load(Ordering::Relaxed) {
            return self.put_if_absent_unfenced(key, data).await;
        }
        let mut wait = INITIAL_BACKOFF;
        for attempt in 1..=CONFLICT_TRIES {
            match self.write(key, data.clone(), true).await? {
                Conditional::Done => return Ok(true),
                Conditional::Exists => return Ok(false),
                Conditional::Conflict if attempt < CONFLICT_TRIES => {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Conditional::Conflict => break,
                Conditional::Unsupported => {
                    tracing::warn!(
                        bucket = %self.bucket,
                        "the object store does not implement conditional writes \
                         (If-None-Match): creating objects after a look instead, which does \
                         not refuse a concurrent writer's"
                    );
                    self.no_conditional_writes.store(true, Ordering::Relaxed);
                    return self.put_if_absent_unfenced(key, data).await;
                }
            }
        }
        Err(StorageError::Other(format!(
            "s3 conditional put kept conflicting with another writer: key=`{key}`"
        )))
    }

    async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        let _permit = self.permit().await?;
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .send()
            .await
            .map_err(|e| storage_error("get", key, e))?;
        let body = out.body.collect().await.map_err(|e| {
            StorageError::Other(format!("s3 get failed reading the body: key=`{key}`: {e}"))
        })?;
        Ok(body.into_bytes())
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError> {
        let Some(end) = start.checked_add(len) else {
            return Err(range_error(key, start, len, u64::MAX));
        };
        let _permit = self.permit().await?;
        if len == 0 {
            // No empty byte range exists in HTTP: the object's size says if `start` is in it.
            let head = self
                .client
                .head_object()
                .bucket(&self.bucket)
                .key(self.object_key(key))
                .send()
                .await
                .map_err(|e| storage_error("head", key, e))?;
            let size = head.content_length.unwrap_or(0).max(0) as u64;
            return if start <= size {
                Ok(Bytes::new())
            } else {
                Err(range_error(key, start, len, size))
            };
        }
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .range(format!("bytes={start}-{}", end - 1))
            .send()
            .await;
        let out = match out {
            Ok(o) => o,
            // 416: the range starts at or past the end.
            Err(e) if status_and_code(&e).0 == Some(416) => {
                return Err(StorageError::Other(format!(
                    "range out of bounds: key=`{key}` start={start} len={len} (past the end)"
                )));
            }
            Err(e) => return Err(storage_error("get range", key, e)),
        };
        // A range running past the end is answered with what there is: its size is in
        // `Content-Range: bytes a-b/size`.
        let size = out
            .content_range
            .as_deref()
            .and_then(|r| r.rsplit_once('/'))
            .and_then(|(_, s)| s.parse::<u64>().ok());
        let body = out.body.collect().await.map_err(|e| {
            StorageError::Other(format!(
                "s3 get range failed reading the body: key=`{key}`: {e}"
            ))
        })?;
        let body = body.into_bytes();
        if body.len() as u64 != len {
            return Err(range_error(
                key,
                start,
                len,
                size.unwrap_or(start + body.len() as u64),
            ));
        }
        Ok(body)
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        let _permit = self.permit().await?;
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match storage_error("delete", key, e) {
                StorageError::NotFound { .. } => Ok(()),
                e => Err(e),
            },
        }
    }

    /// DeleteObjects, up to 1000 keys per request: trimming the WAL after an upload deletes
    /// one entry per group commit, which one request each made as many requests as appends.
    async fn delete_many(&self, keys: &[String]) -> Result<(), StorageError> {
        for chunk in keys.chunks(DELETE_BATCH) {
            if chunk.len() > 1
                && !self.no_batch_deletes.load(Ordering::Relaxed)
                && self.delete_batch(chunk).await?
            {
                continue;
            }
            if chunk.len() > 1 {
                self.no_batch_deletes.store(true, Ordering::Relaxed);
            }
            for key in chunk {
                self.delete(key).await?;
            }
        }
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let full = self.object_key(prefix);
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = {
                let _permit = self.permit().await?;
                self.client
                    .list_objects_v2()
                    .bucket(&self.bucket)
                    .prefix(&full)
                    .set_continuation_token(token.take())
                    .send()
                    .await
                    .map_err(|e| storage_error("list", prefix, e))?
            };
            for object in page.contents.unwrap_or_default() {
                if let Some(k) = object
                    .key
                    .as_deref()
                    .and_then(|k| k.strip_prefix(&self.prefix))
                {
                    keys.push(k.to_string());
                }
            }
            match page.next_continuation_token {
                Some(t) if page.is_truncated == Some(true) => token = Some(t),
                _ => break,
            }
        }
        keys.sort();
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn config_from_a_bucket_uri() {
        let c = S3Config::from_uri(
            "bucket/some/prefix/",
            &params(&[
                ("region", "eu-west-1"),
                ("endpoint", "http://127.0.0.1:9000"),
                ("pathStyle", "true"),
                ("concurrency", "8"),
                ("partBytes", "8388608"),
                ("batchInterval", "5"),
            ]),
        )
        .unwrap();
        assert_eq!(c.bucket, "bucket");
        assert_eq!(c.prefix, "some/prefix/");
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert!(c.path_style);
        assert_eq!(c.concurrency, 8);
        assert_eq!(c.part_bytes, 8 << 20);
        let plain = S3Config::from_uri("bucket", &BTreeMap::new()).unwrap();
        assert_eq!(plain, S3Config::new("bucket"));
        assert!(plain.prefix.is_empty());
    }

    #[test]
    fn bad_config_is_refused_with_the_parameter_named() {
        let err = |loc: &str, p: &[(&str, &str)]| {
            S3Config::from_uri(loc, &params(p)).unwrap_err().to_string()
        };
        assert!(err("/", &[]).contains("bucket"));
        assert!(err("b", &[("pathStyle", "yes")]).contains("pathStyle"));
        assert!(err("b", &[("concurrency", "0")]).contains("between 1 and"));
        assert!(err("b", &[("partBytes", "1024")]).contains("partBytes"));
        assert!(err("b", &[("endpoint", "127.0.0.1:9000")]).contains("http://"));
        assert!(err("b", &[("maxAttempts", "x")]).contains("not a number"));
    }
}
