//! One contract for every `ObjectStorage`: memory, `file://` and S3 (the server of
//! `PICO_TEST_S3_ENDPOINT`, a fresh bucket per test; skipped loudly without one, failed under
//! `PICO_TEST_REQUIRE_ALL=1`).

use std::sync::Arc;

use bytes::Bytes;
use s3stream::parts::PartsWriter;
use s3stream::testing_s3::TestBucket;
use s3stream::{FileStorage, MemoryStorage, ObjectStorage, Parts, S3Storage, StorageError};

fn b(s: &'static [u8]) -> Bytes {
    Bytes::from_static(s)
}

/// Deterministic, non-repeating bytes (a misplaced part or range shows).
fn pattern(len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len);
    let mut x: u32 = 0x9e37_79b9;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

async fn basics(s: &dyn ObjectStorage) {
    s.put("a/b/1", b(b"hello world")).await.unwrap();
    s.put("a/b/2", b(b"two")).await.unwrap();
    s.put("a/c", b(b"c")).await.unwrap();
    s.put("ab", b(b"ab")).await.unwrap();
    s.put("empty", Bytes::new()).await.unwrap();
    assert_eq!(s.get("a/b/1").await.unwrap(), b(b"hello world"));
    assert_eq!(s.get("empty").await.unwrap(), Bytes::new());
    assert!(matches!(
        s.get("a/b/3").await,
        Err(StorageError::NotFound { key }) if key == "a/b/3"
    ));
    assert_eq!(s.list("a/").await.unwrap(), vec!["a/b/1", "a/b/2", "a/c"]);
    assert_eq!(s.list("a/b").await.unwrap(), vec!["a/b/1", "a/b/2"]);
    assert_eq!(
        s.list("a").await.unwrap(),
        vec!["a/b/1", "a/b/2", "a/c", "ab"]
    );
    assert_eq!(
        s.list("").await.unwrap(),
        vec!["a/b/1", "a/b/2", "a/c", "ab", "empty"]
    );
    assert!(s.list("zz/").await.unwrap().is_empty());
    // Overwrite replaces.
    s.put("a/b/1", b(b"new")).await.unwrap();
    assert_eq!(s.get("a/b/1").await.unwrap(), b(b"new"));
    // Pieces are written in order.
    let mut w = PartsWriter::with_capacity(0);
    w.put_bytes(&pattern(256 << 10));
    w.put_slice(b"tail");
    let parts = w.finish();
    let whole = parts.concat();
    s.put_parts("a/p", parts).await.unwrap();
    assert_eq!(s.get("a/p").await.unwrap(), whole);
    s.delete("a/p").await.unwrap();
    s.delete("a/b/1").await.unwrap();
    s.delete("a/b/1").await.unwrap(); // missing = Ok
    s.delete("never/was").await.unwrap();
    assert!(matches!(
        s.get("a/b/1").await,
        Err(StorageError::NotFound { .. })
    ));
    assert_eq!(s.list("a/").await.unwrap(), vec!["a/b/2", "a/c"]);
    // Many keys at once; missing ones are fine, and nothing else goes.
    s.put("m/1", b(b"1")).await.unwrap();
    s.put("m/2", b(b"2")).await.unwrap();
    s.put("m/3", b(b"3")).await.unwrap();
    let gone = ["m/1", "m/3", "m/never"].map(String::from);
    s.delete_many(&gone).await.unwrap();
    assert_eq!(s.list("m/").await.unwrap(), vec!["m/2"]);
    s.delete_many(&["m/2".to_string()]).await.unwrap();
    s.delete_many(&[]).await.unwrap();
    assert!(s.list("m/").await.unwrap().is_empty());
}

async fn ranges(s: &dyn ObjectStorage) {
    s.put("r", b(b"hello world")).await.unwrap();
    assert_eq!(s.get_range("r", 6, 5).await.unwrap(), b(b"world"));
    assert_eq!(s.get_range("r", 0, 11).await.unwrap(), b(b"hello world"));
    assert_eq!(s.get_range("r", 10, 1).await.unwrap(), b(b"d"));
    assert_eq!(s.get_range("r", 0, 0).await.unwrap(), Bytes::new());
    assert_eq!(s.get_range("r", 11, 0).await.unwrap(), Bytes::new());
    // Past the end, partly or wholly: an error, never short data.
    for (start, len) in [(6, 6), (11, 1), (20, 5), (12, 0), (u64::MAX, 2)] {
        let r = s.get_range("r", start, len).await;
        assert!(
            matches!(&r, Err(StorageError::Other(m)) if m.contains("range") && m.contains("`r`")),
            "range {start}+{len}: {r:?}"
        );
    }
    assert!(matches!(
        s.get_range("missing", 0, 1).await,
        Err(StorageError::NotFound { key }) if key == "missing"
    ));
}

async fn conditional(s: &dyn ObjectStorage) {
    assert!(
        s.put_if_absent("c/1", Parts::from(b(b"first")))
            .await
            .unwrap()
    );
    assert!(
        !s.put_if_absent("c/1", Parts::from(b(b"second")))
            .await
            .unwrap()
    );
    assert_eq!(s.get("c/1").await.unwrap(), b(b"first"));
    // Deleted, the key can be created again.
    s.delete("c/1").await.unwrap();
    assert!(
        s.put_if_absent("c/1", Parts::from(b(b"third")))
            .await
            .unwrap()
    );
    assert_eq!(s.get("c/1").await.unwrap(), b(b"third"));
    assert_eq!(s.list("c/").await.unwrap(), vec!["c/1"]);
}

/// Writers racing to create one key: exactly one wins, and its bytes are what is stored.
async fn racing_creates(s: Arc<dyn ObjectStorage>) {
    const WRITERS: usize = 16;
    for round in 0..3 {
        let key = format!("race/{round}");
        let tasks: Vec<_> = (0..WRITERS)
            .map(|w| {
                let s = s.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let data = Bytes::from(format!("writer-{w}"));
                    (w, s.put_if_absent(&key, Parts::from(data)).await.unwrap())
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            let (w, created) = t.await.unwrap();
            if created {
                winners.push(w);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        assert_eq!(
            s.get(&key).await.unwrap(),
            Bytes::from(format!("writer-{}", winners[0]))
        );
    }
}

/// An object over the multipart threshold (S3: parts of `part_bytes`), whole and in ranges
/// across part boundaries.
async fn large(s: &dyn ObjectStorage, len: usize, boundary: usize) {
    let data = pattern(len);
    s.put("big/1", data.clone()).await.unwrap();
    let got = s.get("big/1").await.unwrap();
    assert_eq!(got.len(), len);
    assert!(got == data, "large object differs");
    let start = boundary as u64 - 100;
    assert_eq!(
        s.get_range("big/1", start, 300).await.unwrap(),
        data.slice(boundary - 100..boundary + 200)
    );
    // Conditionally too.
    assert!(
        s.put_if_absent("big/2", Parts::from(data.clone()))
            .await
            .unwrap()
    );
    assert!(
        !s.put_if_absent("big/2", Parts::from(pattern(len - 1)))
            .await
            .unwrap()
    );
    assert!(s.get("big/2").await.unwrap() == data);
    assert_eq!(s.list("big/").await.unwrap(), vec!["big/1", "big/2"]);
}

async fn contract(s: Arc<dyn ObjectStorage>, large_len: usize, boundary: usize) {
    basics(&*s).await;
    ranges(&*s).await;
    conditional(&*s).await;
    racing_creates(s.clone()).await;
    large(&*s, large_len, boundary).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_storage_keeps_the_contract() {
    contract(Arc::new(MemoryStorage::new()), 3 << 20, 1 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_storage_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let s = FileStorage::open(dir.path()).unwrap();
    contract(Arc::new(s), 3 << 20, 1 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_storage_keeps_the_contract() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    // Small parts (S3's minimum), so the large object is a multipart upload of 3 parts.
    let mut cfg = bucket.config("");
    cfg.part_bytes = 5 << 20;
    let s = S3Storage::connect(&cfg).await;
    contract(Arc::new(s), (12 << 20) + 12345, 5 << 20).await;
    bucket.destroy().await;
}

/// A key prefix from the URI (`s3://bucket/prefix`) is invisible in keys and listings, and
/// keeps two storages in one bucket apart.
#[tokio::test]
async fn s3_storage_prefix_is_a_namespace() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let a = S3Storage::connect(&bucket.config("node/a")).await;
    let b2 = S3Storage::connect(&bucket.config("node/b")).await;
    a.put("k/1", b(b"a1")).await.unwrap();
    b2.put("k/1", b(b"b1")).await.unwrap();
    a.put("k/2", b(b"a2")).await.unwrap();
    b2.put("k/2", b(b"b2")).await.unwrap();
    assert_eq!(a.list("").await.unwrap(), vec!["k/1", "k/2"]);
    assert_eq!(a.get("k/1").await.unwrap(), b(b"a1"));
    assert_eq!(b2.get("k/1").await.unwrap(), b(b"b1"));
    // A batch delete maps its keys under the prefix too.
    a.delete_many(&["k/2".to_string(), "k/3".to_string()])
        .await
        .unwrap();
    assert!(a.deletes_in_batches());
    let whole = bucket.storage().await;
    assert_eq!(
        whole.list("").await.unwrap(),
        vec!["node/a/k/1", "node/b/k/1", "node/b/k/2"]
    );
    bucket.destroy().await;
}

/// A listing longer than one page (1000 keys) is followed to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_storage_lists_past_one_page() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let s = Arc::new(bucket.storage().await);
    let tasks: Vec<_> = (0..1100)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { s.put(&format!("p/{i:05}"), Bytes::new()).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let keys = s.list("p/").await.unwrap();
    assert_eq!(keys.len(), 1100);
    assert_eq!(keys[0], "p/00000");
    assert_eq!(keys[1099], "p/01099");
    // More keys than one DeleteObjects request takes (1000), and all of them in batches.
    s.delete_many(&keys[..1050]).await.unwrap();
    assert!(s.deletes_in_batches());
    assert_eq!(s.list("p/").await.unwrap(), keys[1050..].to_vec());
    bucket.destroy().await;
}

/// A store that does not answer: the error names the key, and comes after the retries
/// instead of hanging.
#[tokio::test]
async fn s3_storage_errors_name_the_key() {
    // A port nobody listens on: connection refused on every attempt.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = s3stream::S3Config::new("nobucket");
    cfg.endpoint = Some(format!("http://127.0.0.1:{port}"));
    cfg.path_style = true;
    cfg.region = Some("us-east-1".into());
    cfg.max_attempts = 2;
    cfg.static_credentials = Some(("k".into(), "s".into()));
    let s = S3Storage::connect(&cfg).await;
    let err = s.get("some/key").await.unwrap_err().to_string();
    assert!(err.contains("some/key"), "{err}");
    let err = s.put("other/key", b(b"x")).await.unwrap_err().to_string();
    assert!(err.contains("other/key"), "{err}");
}

/// A bucket that does not exist is an error on every operation, not an empty listing.
#[tokio::test]
async fn s3_storage_missing_bucket_is_an_error() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let mut cfg = bucket.config("");
    cfg.bucket = format!("{}-missing", bucket.bucket);
    let s = S3Storage::connect(&cfg).await;
    assert!(s.list("").await.is_err());
    assert!(s.put("k", b(b"v")).await.is_err());
    bucket.destroy().await;
}
