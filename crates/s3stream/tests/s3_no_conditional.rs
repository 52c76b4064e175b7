//! `S3Storage` on a store without conditional writes: an HTTP proxy in front of the test's S3
//! server (`PICO_TEST_S3_ENDPOINT`) answers `501 NotImplemented` to every request carrying
//! `If-None-Match`, as servers that predate conditional writes do, and forwards the rest. The
//! storage must fall back to a look (HEAD) and a plain put: a first create succeeds, a second
//! on the same key reports it exists and leaves the first's bytes, the 501 is not retried and
//! is asked only once per storage, large (multipart) objects take the same fallback, and an
//! object WAL on such a store appends and recovers. What the fallback cannot give, refusing a
//! concurrent writer's create, is said where the warning is logged (`storage/s3.rs`).
//! The same proxy, told to, refuses DeleteObjects instead (with 501, 405 or 400, as stores
//! without it or wanting another checksum header do): deletes fall back to one per key.
//! Told to hold part uploads unanswered instead, it shows that a multipart upload whose
//! future is dropped mid-way (the uploader's timeout) is aborted, not left behind.
//! Without a server the test is skipped loudly (failed under `PICO_TEST_REQUIRE_ALL=1`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use s3stream::testing_s3::TestBucket;
use s3stream::{ObjectStorage, ObjectWal, S3Storage, StorageError, Wal, WalRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `S3Storage`'s defaults (private to it): objects above 16 MiB go multipart, in parts of at
/// least 5 MiB.
const DEFAULT_PART_BYTES: usize = 16 << 20;
const MIN_PART_BYTES: usize = 5 << 20;

/// Requests the proxy saw: all, and those it refused.
#[derive(Default)]
struct Seen {
    requests: AtomicU64,
    refused: AtomicU64,
}

/// What the proxy refuses.
#[derive(Clone, Copy)]
enum Refuse {
    /// Requests with `If-None-Match`, with 501.
    Conditional,
    /// DeleteObjects (`POST /bucket?delete`), with this status.
    BatchDelete(u16),
    /// Nothing; it holds every UploadPart (`PUT …?partNumber=…`) unanswered.
    HoldParts,
}

/// Serves one request per client connection (every answer says `Connection: close`): one
/// that `refuse` names gets an S3 error, any other is sent upstream and its answer relayed
/// until the server closes.
async fn proxy(upstream: String, refuse: Refuse) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(one_request(client, upstream.clone(), s.clone(), refuse));
        }
    });
    (format!("http://{addr}"), seen)
}

async fn one_request(mut client: TcpStream, upstream: String, seen: Arc<Seen>, refuse: Refuse) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 8192];
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let len: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
    while buf.len() < head_end + len {
        let mut chunk = vec![0u8; 64 << 10];
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let request_line = head.lines().next().unwrap_or("");
    let refusal = match refuse {
        Refuse::Conditional if header("if-none-match").is_some() => {
            Some((501, "Not Implemented", "NotImplemented"))
        }
        Refuse::BatchDelete(status)
            if request_line.starts_with("POST ") && request_line.contains("?delete") =>
        {
            Some(match status {
                501 => (501, "Not Implemented", "NotImplemented"),
                405 => (405, "Method Not Allowed", "MethodNotAllowed"),
                _ => (400, "Bad Request", "InvalidRequest"),
            })
        }
        _ => None,
    };
    if matches!(refuse, Refuse::HoldParts) && request_line.contains("partNumber=") {
        // Until the client gives up on it: the connection closes when its future is dropped.
        let _ = client.read(&mut [0u8; 1]).await;
        return;
    }
    if let Some((status, reason, code)) = refusal {
        seen.refused.fetch_add(1, Ordering::SeqCst);
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
             <Message>refused by the test's proxy</Message></Error>"
        );
        let answer = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = client.write_all(answer.as_bytes()).await;
        return;
    }
    // The same request, asking the server to close after answering.
    let mut out = Vec::with_capacity(buf.len() + 32);
    for line in head[..head_end - 4].split("\r\n") {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(&buf[head_end..]);
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return;
    };
    if server.write_all(&out).await.is_err() {
        return;
    }
    let _ = tokio::io::copy(&mut server, &mut client).await;
}

/// A storage on `bucket` under `prefix`, through a fresh proxy refusing conditional writes.
async fn refusing_storage(
    bucket: &TestBucket,
    prefix: &str,
    part_bytes: usize,
) -> (S3Storage, Arc<Seen>) {
    storage_through_proxy(bucket, prefix, part_bytes, Refuse::Conditional).await
}

async fn storage_through_proxy(
    bucket: &TestBucket,
    prefix: &str,
    part_bytes: usize,
    refuse: Refuse,
) -> (S3Storage, Arc<Seen>) {
    let upstream = bucket
        .endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let (endpoint, seen) = proxy(upstream, refuse).await;
    let mut cfg = bucket.config(prefix);
    cfg.endpoint = Some(endpoint);
    cfg.part_bytes = part_bytes;
    (S3Storage::connect(&cfg).await, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_fall_back_to_a_look_and_a_plain_put_on_a_501() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let (s3, seen) = refusing_storage(&bucket, "small", DEFAULT_PART_BYTES).await;
    let first = Bytes::from_static(b"first writer");
    assert!(s3.put_if_absent("k", first.clone().into()).await.unwrap());
    assert_eq!(
        seen.refused.load(Ordering::SeqCst),
        1,
        "the 501 must be taken as an answer, not retried"
    );
    assert_eq!(s3.get("k").await.unwrap(), first);

    // The key exists: reported so, and its bytes are kept.
    let second = Bytes::from_static(b"second writer");
    assert!(!s3.put_if_absent("k", second.into()).await.unwrap());
    assert_eq!(s3.get("k").await.unwrap(), first);
    // A new key is created; the store is not asked for a conditional write again.
    assert!(
        s3.put_if_absent("k2", Bytes::from_static(b"x").into())
            .await
            .unwrap()
    );
    assert_eq!(
        seen.refused.load(Ordering::SeqCst),
        1,
        "conditional writes asked for again after a 501"
    );
    assert!(seen.requests.load(Ordering::SeqCst) >= 6);

    // Unconditional writes never meet the 501.
    s3.put("plain", Bytes::from_static(b"p")).await.unwrap();
    assert_eq!(s3.get("plain").await.unwrap(), Bytes::from_static(b"p"));
    bucket.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_create_falls_back_too() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    // Parts of 5 MiB (S3's smallest): a 6 MiB object is uploaded in two, and its completion
    // is the conditional request refused.
    let part = MIN_PART_BYTES;
    let (s3, seen) = refusing_storage(&bucket, "large", part).await;
    let big: Bytes = (0..part + (1 << 20))
        .map(|i| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    assert!(s3.put_if_absent("big", big.clone().into()).await.unwrap());
    assert_eq!(seen.refused.load(Ordering::SeqCst), 1);
    assert_eq!(s3.get("big").await.unwrap(), big);
    assert!(
        !s3.put_if_absent("big", Bytes::from_static(b"other").into())
            .await
            .unwrap()
    );
    assert_eq!(s3.get("big").await.unwrap().len(), big.len());
    bucket.destroy().await;
}

fn rec(stream: u64, base: u64) -> WalRecord {
    WalRecord::new(
        stream,
        1,
        base,
        1,
        Bytes::from(format!("record {stream}/{base}")),
        Bytes::new(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_wal_works_on_a_store_without_conditional_writes() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let (s3, seen) = refusing_storage(&bucket, "", DEFAULT_PART_BYTES).await;
    let s3: Arc<dyn ObjectStorage> = Arc::new(s3);
    let wal = ObjectWal::new(s3.clone(), "wal/1".into());
    let mut positions = Vec::new();
    for i in 0..5 {
        positions.push(wal.append(vec![rec(1, i), rec(2, i)]).await.unwrap());
    }
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    assert_eq!(seen.refused.load(Ordering::SeqCst), 1);

    let recovered = ObjectWal::new(s3, "wal/1".into()).recover().await.unwrap();
    assert_eq!(
        recovered.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        positions
    );
    for (i, (_, records)) in recovered.iter().enumerate() {
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].batch, rec(1, i as u64).batch);
        assert_eq!(records[1].batch, rec(2, i as u64).batch);
    }
    bucket.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_fall_back_to_one_per_key_when_delete_objects_is_refused() {
    for status in [501, 405, 400] {
        let Some(bucket) = TestBucket::create().await else {
            return;
        };
        let (s3, seen) = storage_through_proxy(
            &bucket,
            "del",
            DEFAULT_PART_BYTES,
            Refuse::BatchDelete(status),
        )
        .await;
        let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
        for k in &keys {
            s3.put(k, Bytes::from_static(b"x")).await.unwrap();
        }
        assert!(s3.deletes_in_batches());
        s3.delete_many(&keys).await.unwrap();
        assert_eq!(
            seen.refused.load(Ordering::SeqCst),
            1,
            "{status}: the refusal must be taken as an answer, not retried"
        );
        assert!(!s3.deletes_in_batches(), "{status}");
        for k in &keys {
            assert!(
                matches!(s3.get(k).await, Err(StorageError::NotFound { .. })),
                "{status}: {k} left after the fallback"
            );
        }
        // Later deletes go one per key straight away, missing keys included.
        s3.put("k0", Bytes::from_static(b"y")).await.unwrap();
        s3.delete_many(&keys).await.unwrap();
        assert_eq!(seen.refused.load(Ordering::SeqCst), 1, "{status}");
        assert!(matches!(
            s3.get("k0").await,
            Err(StorageError::NotFound { .. })
        ));
        bucket.destroy().await;
    }
}

/// The uploader drops an upload that outlives its timeout. A multipart upload dropped so, with
/// its parts in flight, is aborted (its parts would otherwise cost space until a lifecycle rule
/// removed them), and no object appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_upload_dropped_mid_way_is_aborted() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let (s3, _) =
        storage_through_proxy(&bucket, "dropped", MIN_PART_BYTES, Refuse::HoldParts).await;
    let direct = bucket.storage().await;
    let uploads = || async {
        let out = direct
            .client()
            .list_multipart_uploads()
            .bucket(&bucket.bucket)
            .send()
            .await
            .unwrap();
        out.uploads().len()
    };
    let s3 = Arc::new(s3);
    let put = tokio::spawn({
        let s3 = s3.clone();
        async move {
            let big = Bytes::from(vec![7u8; MIN_PART_BYTES + 1]);
            s3.put("big", big).await
        }
    });
    let mut started = false;
    for _ in 0..200 {
        if uploads().await == 1 {
            started = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(started, "the multipart upload never started");
    // The parts are held: the put cannot have finished. Dropped as a timeout drops it.
    assert!(!put.is_finished());
    put.abort();
    assert!(put.await.unwrap_err().is_cancelled());
    let mut left = 1;
    for _ in 0..200 {
        left = uploads().await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        left, 0,
        "the dropped multipart upload was left behind, not aborted"
    );
    assert!(matches!(
        direct.get("dropped/big").await,
        Err(StorageError::NotFound { .. })
    ));
    bucket.destroy().await;
}
