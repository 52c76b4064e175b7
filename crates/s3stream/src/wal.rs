//! The WAL seam and its object-storage implementation.
//!
//! One WAL per node, shared by all streams: every `append` is one durable write holding the
//! records of many streams. `ObjectWal` writes one object per append at
//! `{prefix}/{position:020}`; positions are strictly increasing and continue after the highest
//! existing entry across restarts. Entries are created only where none exists
//! (`put_if_absent`): of two writers at one position (a zombie and its successor), one fails.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::Mutex;

use crate::format::{self, FormatError};
use crate::parts::Parts;
use crate::storage::{ObjectStorage, StorageError};

/// One append as written to the WAL.
#[derive(Clone, Debug, PartialEq)]
pub struct WalRecord {
    pub stream: u64,
    pub epoch: i64,
    pub base_offset: u64,
    pub record_count: u32,
    pub batch: Bytes,
    /// `crc32c(batch)`, computed once when the batch enters the engine: the WAL entry and the
    /// data object frame extend their checksums over the batch with it ([`crate::crc::chain`]).
    pub batch_crc: u32,
    pub aux: Bytes,
}

impl WalRecord {
    /// A record with its batch's CRC computed here.
    pub fn new(
        stream: u64,
        epoch: i64,
        base_offset: u64,
        record_count: u32,
        batch: Bytes,
        aux: Bytes,
    ) -> WalRecord {
        WalRecord {
            stream,
            epoch,
            base_offset,
            record_count,
            batch_crc: crc32c::crc32c(&batch),
            batch,
            aux,
        }
    }

    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("wal storage: {0}")]
    Storage(#[from] StorageError),
    #[error("wal entry corrupt: key=`{key}`: {source}")]
    Corrupt {
        key: String,
        #[source]
        source: FormatError,
    },
    #[error("wal entry position mismatch: key=`{key}` stored={stored}")]
    PositionMismatch { key: String, stored: u64 },
    /// Recovery found positions that may hold acknowledged records, are not committed to
    /// objects, and cannot be read: starting would lose them and give their offsets out again.
    #[error(
        "wal segment `{file}` {why}: {range} may hold acknowledged records that are not in \
         objects yet; refusing to start rather than lose them and give their offsets out \
         again. Restore the file from a copy; or, to start without them, move the WAL \
         directory `{dir}` aside (every WAL entry not yet uploaded is then lost too)",
        range = lost_range(*from, *to)
    )]
    Lost {
        file: String,
        why: String,
        from: u64,
        /// `None`: every position from `from` on.
        to: Option<u64>,
        dir: String,
    },
    #[error("wal fenced: {0}")]
    Fenced(String),
    #[error("wal: {0}")]
    Other(String),
}

fn lost_range(from: u64, to: Option<u64>) -> String {
    match to {
        Some(to) if to == from => format!("WAL position {from}"),
        Some(to) => format!("WAL positions {from} to {to}"),
        None => format!("every WAL position from {from} on"),
    }
}

/// A WAL that can append synchronously, on a thread the caller dedicates to it (the local-file
/// WAL: one vectored write and one `fdatasync`).
pub trait BlockingAppend: Send + Sync {
    /// [`Wal::append`], blocking the calling thread until the entry is durable.
    fn append_sync(&self, records: &[WalRecord]) -> Result<u64, WalError>;
}

#[async_trait::async_trait]
pub trait Wal: Send + Sync + 'static {
    /// `Some` when appends can run synchronously: the engine then runs its writer on a thread
    /// of its own that forms each group, writes it and acknowledges it, so no task is woken
    /// between the sync and the acks.
    fn blocking(&self) -> Option<&dyn BlockingAppend> {
        None
    }
    /// Whether opening this WAL fenced every earlier process of the same node id: their
    /// appends fail from the open on (the Postgres WAL's registration). When false and other
    /// processes can reach the WAL (object storage), a new process waits out its predecessor's
    /// acknowledgement window before it reads the WAL (docs/design/failover.md).
    fn fences_earlier_writers(&self) -> bool {
        false
    }
    /// One durable write holding all `records`; returns its position (strictly increasing).
    async fn append(&self, records: Vec<WalRecord>) -> Result<u64, WalError>;
    /// Everything still in the WAL, ascending by position.
    async fn recover(&self) -> Result<Vec<(u64, Vec<WalRecord>)>, WalError>;
    /// Drop every entry with position <= upto.
    async fn trim(&self, upto: u64) -> Result<(), WalError>;
}

/// WAL on object storage: one object per append.
pub struct ObjectWal {
    storage: Arc<dyn ObjectStorage>,
    prefix: String,
    /// Next position to write; `None` until the existing entries were listed once.
    next: Mutex<Option<u64>>,
    /// Puts at this position that failed without telling whether they landed, with their
    /// bytes: finding exactly one of them there later means the entry is this writer's own.
    /// The whole bytes, not a checksum: every entry ends with the CRC32C of what precedes it,
    /// so the CRC32C of any whole entry is the same constant, and a length and a checksum
    /// would not tell a successor's entry from ours.
    in_doubt: std::sync::Mutex<InDoubt>,
}

/// [`ObjectWal::in_doubt`]: the position and the bytes of each failed attempt there (at most
/// [`MAX_IN_DOUBT`], the newest; an older attempt found there then reads as another writer's,
/// which fails safe: fenced, never overwritten).
#[derive(Default)]
struct InDoubt {
    position: u64,
    attempts: Vec<Bytes>,
}

const MAX_IN_DOUBT: usize = 8;

impl InDoubt {
    fn add(&mut self, position: u64, bytes: Bytes) {
        if self.position != position {
            self.position = position;
            self.attempts.clear();
        }
        if self.attempts.len() == MAX_IN_DOUBT {
            self.attempts.remove(0);
        }
        self.attempts.push(bytes);
    }

    fn holds(&self, position: u64, existing: &[u8]) -> bool {
        self.position == position && self.attempts.iter().any(|a| a[..] == *existing)
    }
}

impl ObjectWal {
    pub fn new(storage: Arc<dyn ObjectStorage>, prefix: String) -> ObjectWal {
        let prefix = prefix.trim_end_matches('/').to_string();
        ObjectWal {
            storage,
            prefix,
            next: Mutex::new(None),
            in_doubt: std::sync::Mutex::new(InDoubt::default()),
        }
    }

    fn key(&self, position: u64) -> String {
        format!("{}/{position:020}", self.prefix)
    }

    /// Existing entries as (position, key), ascending. Keys that are not positions are ignored.
    async fn entries(&self) -> Result<Vec<(u64, String)>, WalError> {
        let dir = format!("{}/", self.prefix);
        let mut out: Vec<(u64, String)> = self
            .storage
            .list(&dir)
            .await?
            .into_iter()
            .filter_map(|k| {
                let rest = k.strip_prefix(&dir)?;
                (rest.len() == 20 && rest.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| rest.parse().ok().map(|p| (p, k.clone())))
                    .flatten()
            })
            .collect();
        out.sort();
        Ok(out)
    }

    async fn next_position(&self, next: &mut Option<u64>) -> Result<u64, WalError> {
        if let Some(n) = *next {
            return Ok(n);
        }
        let n = self.entries().await?.last().map_or(1, |(p, _)| p + 1);
        *next = Some(n);
        Ok(n)
    }

    fn doubts(&self) -> std::sync::MutexGuard<'_, InDoubt> {
        self.in_doubt.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `key` already existed when this writer went to create it. Its own entry (an earlier
    /// attempt landed, its answer lost) is fine; its own failed write of other records is
    /// replaced, as an unconditional put used to; anything else is another writer's, which
    /// fences this one.
    async fn resolve_taken(&self, position: u64, key: &str, data: Parts) -> Result<(), WalError> {
        let bytes = data.concat();
        let existing = self.storage.get(key).await?;
        if existing == bytes {
            return Ok(());
        }
        if self.doubts().holds(position, &existing) {
            // Held by this position's earlier attempts only: nobody else writes here.
            if let Err(e) = self.storage.put(key, bytes.clone()).await {
                self.doubts().add(position, bytes);
                return Err(e.into());
            }
            return Ok(());
        }
        Err(WalError::Fenced(format!(
            "WAL position {position} was written by another writer: key=`{key}`"
        )))
    }
}

#[async_trait::async_trait]
impl Wal for ObjectWal {
    async fn append(&self, records: Vec<WalRecord>) -> Result<u64, WalError> {
        // Held across the put: appends are serialized so positions stay ordered.
        let mut next = self.next.lock().await;
        let position = self.next_position(&mut next).await?;
        let data = format::encode_wal_entry_parts(position, &records).map_err(|source| {
            WalError::Corrupt {
                key: self.key(position),
                source,
            }
        })?;
        // On failure the position is reused by the retry: a put that failed but landed is
        // found there by the retry (same bytes) or replaced by the next write (its own
        // bytes), never duplicated at two positions.
        let key = self.key(position);
        match self.storage.put_if_absent(&key, data.clone()).await {
            Ok(true) => {}
            Ok(false) => self
                .resolve_taken(position, &key, data)
                .await
                .inspect_err(|e| {
                    // Someone else wrote here: list again before the next write. After a
                    // storage error the retry stays at this position: what is there may be
                    // this writer's own, and writing past it would duplicate its records.
                    if matches!(e, WalError::Fenced(_)) {
                        *next = None;
                    }
                })?,
            Err(e) => {
                self.doubts().add(position, data.concat());
                return Err(e.into());
            }
        }
        *self.doubts() = InDoubt::default();
        *next = Some(position + 1);
        Ok(position)
    }

    async fn recover(&self) -> Result<Vec<(u64, Vec<WalRecord>)>, WalError> {
        let mut next = self.next.lock().await;
        let entries = self.entries().await?;
        let mut out = Vec::with_capacity(entries.len());
        for (position, key) in &entries {
            let data = self.storage.get(key).await?;
            let (stored, records) =
                format::decode_wal_entry(&data).map_err(|source| WalError::Corrupt {
                    key: key.clone(),
                    source,
                })?;
            if stored != *position {
                return Err(WalError::PositionMismatch {
                    key: key.clone(),
                    stored,
                });
            }
            out.push((*position, records));
        }
        let after = entries.last().map_or(1, |(p, _)| p + 1);
        *next = Some(next.map_or(after, |n| n.max(after)));
        Ok(out)
    }

    async fn trim(&self, upto: u64) -> Result<(), WalError> {
        // Remember the position first: trimming everything must not restart positions at 1.
        {
            let mut next = self.next.lock().await;
            self.next_position(&mut next).await?;
        }
        // One request for all of them where the store deletes many keys at once (S3): a trim
        // after an upload covers every group commit since the last one.
        let keys: Vec<String> = self
            .entries()
            .await?
            .into_iter()
            .take_while(|(position, _)| *position <= upto)
            .map(|(_, key)| key)
            .collect();
        self.storage.delete_many(&keys).await?;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::storage::MemoryStorage;

    /// A small record for WAL tests (also used by `segment_wal`'s).
    pub(crate) fn rec(stream: u64, base: u64, n: u32) -> WalRecord {
        WalRecord::new(
            stream,
            3,
            base,
            n,
            Bytes::from(format!("batch-{stream}-{base}")),
            Bytes::from_static(b"aux"),
        )
    }

    #[tokio::test]
    async fn append_recover_trim_and_positions_continue_across_restarts() {
        let storage = Arc::new(MemoryStorage::new());
        let wal = ObjectWal::new(storage.clone(), "wal/n1".into());
        let p1 = wal.append(vec![rec(1, 0, 2), rec(2, 0, 1)]).await.unwrap();
        let p2 = wal.append(vec![rec(1, 2, 1)]).await.unwrap();
        assert!(p2 > p1);
        assert_eq!(storage.keys(), vec![wal.key(p1), wal.key(p2)]);

        let wal2 = ObjectWal::new(storage.clone(), "wal/n1".into());
        let got = wal2.recover().await.unwrap();
        assert_eq!(
            got,
            vec![
                (p1, vec![rec(1, 0, 2), rec(2, 0, 1)]),
                (p2, vec![rec(1, 2, 1)])
            ]
        );
        let p3 = wal2.append(vec![rec(3, 0, 1)]).await.unwrap();
        assert!(p3 > p2);
        wal2.trim(p2).await.unwrap();
        assert_eq!(
            wal2.recover().await.unwrap(),
            vec![(p3, vec![rec(3, 0, 1)])]
        );
        wal2.trim(p3).await.unwrap();
        assert!(wal2.recover().await.unwrap().is_empty());
        // Positions keep increasing in-process even after the WAL is empty.
        let p4 = wal2.append(vec![rec(3, 1, 1)]).await.unwrap();
        assert!(p4 > p3);
    }

    #[tokio::test]
    async fn corrupt_entry_fails_recovery_loudly() {
        let storage = Arc::new(MemoryStorage::new());
        let wal = ObjectWal::new(storage.clone(), "wal".into());
        let p = wal.append(vec![rec(1, 0, 1)]).await.unwrap();
        let key = wal.key(p);
        let mut bytes = storage.get(&key).await.unwrap().to_vec();
        bytes[30] ^= 0x40;
        storage.raw_put(&key, Bytes::from(bytes));
        let err = ObjectWal::new(storage.clone(), "wal".into())
            .recover()
            .await
            .unwrap_err();
        assert!(matches!(err, WalError::Corrupt { .. }), "{err}");
    }

    #[tokio::test]
    async fn failed_put_reuses_position() {
        let storage = Arc::new(MemoryStorage::new());
        let wal = ObjectWal::new(storage.clone(), "wal".into());
        let p1 = wal.append(vec![rec(1, 0, 1)]).await.unwrap();
        storage.fail_puts(1);
        assert!(wal.append(vec![rec(1, 1, 1)]).await.is_err());
        let p2 = wal.append(vec![rec(1, 1, 1)]).await.unwrap();
        assert_eq!(p2, p1 + 1);
    }
    #[tokio::test]
    async fn two_writers_never_both_write_one_position() {
        let storage = Arc::new(MemoryStorage::new());
        let zombie = ObjectWal::new(storage.clone(), "wal".into());
        let successor = ObjectWal::new(storage.clone(), "wal".into());
        assert!(zombie.recover().await.unwrap().is_empty());
        assert!(successor.recover().await.unwrap().is_empty());
        let p = successor.append(vec![rec(2, 0, 1)]).await.unwrap();
        // The zombie still believes position `p` free: refused, the successor's entry kept.
        let err = zombie.append(vec![rec(1, 0, 1)]).await.unwrap_err();
        assert!(matches!(err, WalError::Fenced(_)), "{err}");
        assert!(err.to_string().contains(&wal_key(p)), "{err}");
        assert_eq!(
            successor.recover().await.unwrap(),
            vec![(p, vec![rec(2, 0, 1)])]
        );
    }

    /// Every whole entry has the same CRC32C (it ends with the CRC of what precedes it), so
    /// only its bytes tell a writer's own failed attempt from another writer's entry: a
    /// zombie whose put failed without landing must not take its successor's entry of the same
    /// length at that position for its own and overwrite it.
    #[tokio::test]
    async fn a_failed_put_never_claims_another_writers_entry_of_the_same_length() {
        let a = format::encode_wal_entry_parts(1, &[rec(1, 0, 1)])
            .unwrap()
            .concat();
        let b = format::encode_wal_entry_parts(1, &[rec(2, 0, 1)])
            .unwrap()
            .concat();
        assert_eq!(a.len(), b.len());
        assert_eq!(crc32c::crc32c(&a), crc32c::crc32c(&b));

        let storage = Arc::new(MemoryStorage::new());
        let zombie = ObjectWal::new(storage.clone(), "wal".into());
        assert!(zombie.recover().await.unwrap().is_empty());
        storage.fail_puts(1);
        assert!(zombie.append(vec![rec(1, 0, 1)]).await.is_err());
        let successor = ObjectWal::new(storage.clone(), "wal".into());
        assert!(successor.recover().await.unwrap().is_empty());
        let p = successor.append(vec![rec(2, 0, 1)]).await.unwrap();
        let err = zombie.append(vec![rec(1, 0, 1)]).await.unwrap_err();
        assert!(matches!(err, WalError::Fenced(_)), "{err}");
        assert_eq!(
            successor.recover().await.unwrap(),
            vec![(p, vec![rec(2, 0, 1)])]
        );
    }

    /// Storage that records how keys are deleted: (keys per `delete_many`, single deletes).
    #[derive(Default)]
    struct DeleteLog {
        inner: MemoryStorage,
        log: std::sync::Mutex<(Vec<usize>, usize)>,
    }

    #[async_trait::async_trait]
    impl ObjectStorage for DeleteLog {
        async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
            self.inner.put(key, data).await
        }
        async fn put_if_absent(&self, key: &str, data: Parts) -> Result<bool, StorageError> {
            self.inner.put_if_absent(key, data).await
        }
        async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
            self.inner.get(key).await
        }
        async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError> {
            self.inner.get_range(key, start, len).await
        }
        async fn delete(&self, key: &str) -> Result<(), StorageError> {
            self.log.lock().unwrap().1 += 1;
            self.inner.delete(key).await
        }
        async fn delete_many(&self, keys: &[String]) -> Result<(), StorageError> {
            self.log.lock().unwrap().0.push(keys.len());
            self.inner.delete_many(keys).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
            self.inner.list(prefix).await
        }
    }

    /// A trim deletes every entry up to its position in one `delete_many` (one request on S3,
    /// not one per group commit) and leaves the later ones.
    #[tokio::test]
    async fn a_trim_deletes_its_entries_in_one_batch() {
        let storage = Arc::new(DeleteLog::default());
        let wal = ObjectWal::new(storage.clone(), "wal".into());
        let mut positions = Vec::new();
        for i in 0..5 {
            positions.push(wal.append(vec![rec(1, i, 1)]).await.unwrap());
        }
        wal.trim(positions[3]).await.unwrap();
        assert_eq!(*storage.log.lock().unwrap(), (vec![4], 0));
        assert_eq!(
            wal.recover().await.unwrap(),
            vec![(positions[4], vec![rec(1, 4, 1)])]
        );
    }

    fn wal_key(p: u64) -> String {
        format!("wal/{p:020}")
    }

    /// Storage whose next put lands and then reports a failure (an answer lost on the way).
    struct LandsThenFails {
        inner: MemoryStorage,
        armed: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl ObjectStorage for LandsThenFails {
        async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
            self.inner.put(key, data).await
        }
        async fn put_if_absent(&self, key: &str, data: Parts) -> Result<bool, StorageError> {
            let created = self.inner.put_if_absent(key, data).await?;
            if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                return Err(StorageError::Other("answer lost".into()));
            }
            Ok(created)
        }
        async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
            self.inner.get(key).await
        }
        async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError> {
            self.inner.get_range(key, start, len).await
        }
        async fn delete(&self, key: &str) -> Result<(), StorageError> {
            self.inner.delete(key).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
            self.inner.list(prefix).await
        }
    }

    /// A write that landed though it was reported failed is this writer's own: its retry
    /// (same records) finds it and succeeds at that position; a next write of other records
    /// replaces it, as before conditional writes. Either way one position, never two.
    #[tokio::test]
    async fn a_write_that_landed_but_failed_is_taken_as_its_own() {
        let storage = Arc::new(LandsThenFails {
            inner: MemoryStorage::new(),
            armed: false.into(),
        });
        let wal = ObjectWal::new(storage.clone(), "wal".into());
        let p1 = wal.append(vec![rec(1, 0, 1)]).await.unwrap();
        storage
            .armed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(wal.append(vec![rec(1, 1, 1)]).await.is_err());
        assert_eq!(wal.append(vec![rec(1, 1, 1)]).await.unwrap(), p1 + 1);

        storage
            .armed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(wal.append(vec![rec(1, 2, 1)]).await.is_err());
        // The engine gave those records up; the next group holds others.
        assert_eq!(wal.append(vec![rec(2, 0, 1)]).await.unwrap(), p1 + 2);
        assert_eq!(
            ObjectWal::new(storage.clone(), "wal".into())
                .recover()
                .await
                .unwrap(),
            vec![
                (p1, vec![rec(1, 0, 1)]),
                (p1 + 1, vec![rec(1, 1, 1)]),
                (p1 + 2, vec![rec(2, 0, 1)]),
            ]
        );
    }
}
