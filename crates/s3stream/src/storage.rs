//! Object storage abstraction: the only durable medium the engine writes data to.
//!
//! `FileStorage` maps keys onto a directory tree with crash-atomic puts; `MemoryStorage` is the
//! in-process double used by tests, with fault injection.

use std::collections::{BTreeMap, HashSet};
use std::io::{IoSlice, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::parts::Parts;

/// Errors of every storage operation.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("object not found: key=`{key}`")]
    NotFound { key: String },
    #[error("storage io error: key=`{key}`: {source}")]
    Io {
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("storage error: {0}")]
    Other(String),
}

/// A flat key space of immutable objects (keys may contain '/').
#[async_trait::async_trait]
pub trait ObjectStorage: Send + Sync + 'static {
    /// Atomic: readers see the whole object or nothing.
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError>;
    /// `put` of an object given as pieces; storages that write vectored override it.
    async fn put_parts(&self, key: &str, parts: Parts) -> Result<(), StorageError> {
        self.put(key, parts.concat()).await
    }
    /// `NotFound` if missing.
    async fn get(&self, key: &str) -> Result<Bytes, StorageError>;
    /// Exactly `len` bytes from `start`; a range past the end of the object is an error.
    async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError>;
    /// A missing key is Ok.
    async fn delete(&self, key: &str) -> Result<(), StorageError>;
    /// Keys starting with `prefix`, sorted ascending.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError>;
}

fn range_error(key: &str, start: u64, len: u64, size: u64) -> StorageError {
    StorageError::Other(format!(
        "range out of bounds: key=`{key}` start={start} len={len} size={size}"
    ))
}

// ---------------------------------------------------------------------------------------------
// FileStorage
// ---------------------------------------------------------------------------------------------

/// Objects as files under a root directory. Temp files start with '.', so keys whose path
/// components start with '.' are rejected and such files are invisible to `list`/`get`.
#[derive(Debug)]
pub struct FileStorage {
    root: PathBuf,
    tmp_counter: AtomicU64,
    /// Directories whose entries up to `root` this process has synced (see
    /// `create_dirs_durably`).
    synced_dirs: Arc<Mutex<HashSet<PathBuf>>>,
}

const TMP_MARKER: &str = ".tmp-";

impl FileStorage {
    /// Creates `root` if needed and removes temp files left behind by a crash.
    pub fn open(root: impl Into<PathBuf>) -> Result<FileStorage, StorageError> {
        let root = root.into();
        let io = |source| StorageError::Io {
            key: root.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&root).map_err(io)?;
        clean_temp_files(&root).map_err(io)?;
        Ok(FileStorage {
            root,
            tmp_counter: AtomicU64::new(0),
            synced_dirs: Arc::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_of(&self, key: &str) -> Result<PathBuf, StorageError> {
        let valid = !key.is_empty()
            && !key.starts_with('/')
            && key
                .split('/')
                .all(|c| !c.is_empty() && !c.starts_with('.') && !c.contains('\\'));
        if !valid {
            return Err(StorageError::Other(format!(
                "invalid object key: key=`{key}`"
            )));
        }
        Ok(self.root.join(key))
    }
}

fn clean_temp_files(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ft = entry.file_type()?;
        if ft.is_dir() {
            clean_temp_files(&entry.path())?;
        } else if name.starts_with('.') && name.contains(TMP_MARKER) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Syncs a directory, so the entries created or renamed in it survive a power loss. The
/// engine's one copy (the WAL uses it too); `s3stream` depends on no pico crate, so
/// `pico_common::fs::fsync_dir` is the host's.
pub(crate) fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Creates the missing directories between `root` and `dir` and makes every entry on the way
/// durable (each parent fsynced), once per directory and process. An existing directory is
/// not proof of a durable entry: its creator may have failed its fsync, or still be before it
/// (concurrent puts into a new directory), so the first put into each directory syncs the
/// chain itself.
fn create_dirs_durably(
    root: &Path,
    dir: &Path,
    synced: &Mutex<HashSet<PathBuf>>,
) -> std::io::Result<()> {
    let known = |d: &Path| synced.lock().unwrap_or_else(|p| p.into_inner()).contains(d);
    if known(dir) {
        if dir.is_dir() {
            return Ok(());
        }
        // Removed under us (an operator's cleanup): made again below, so nothing recorded
        // about this tree holds any more.
        synced.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
    let mut missing = Vec::new();
    let mut cur = dir;
    while !cur.is_dir() {
        missing.push(cur.to_path_buf());
        match cur.parent() {
            Some(p) if p.starts_with(root) => cur = p,
            _ => break,
        }
    }
    for d in missing.iter().rev() {
        match std::fs::create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    // Up to `root` or a directory whose chain is known durable; recorded only once the whole
    // walk succeeded, so a known directory always has a durable chain above it.
    let mut walked = Vec::new();
    let mut cur = dir;
    while cur.starts_with(root) && cur != root && !known(cur) {
        let Some(parent) = cur.parent() else { break };
        fsync_dir(parent)?;
        walked.push(cur.to_path_buf());
        cur = parent;
    }
    synced
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(walked);
    Ok(())
}

fn walk(dir: &Path, rel: &str, prefix: &str, out: &mut Vec<String>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // temp files
        }
        let key = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if entry.file_type()?.is_dir() {
            // Descend only where keys below can still match the prefix.
            let as_dir = format!("{key}/");
            if as_dir.starts_with(prefix) || prefix.starts_with(&as_dir) {
                walk(&entry.path(), &key, prefix, out)?;
            }
        } else if key.starts_with(prefix) {
            out.push(key);
        }
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StorageError::Other(format!("blocking storage task failed: {e}")))?
}

fn io_err(key: &str, source: std::io::Error) -> StorageError {
    if source.kind() == std::io::ErrorKind::NotFound {
        StorageError::NotFound {
            key: key.to_string(),
        }
    } else {
        StorageError::Io {
            key: key.to_string(),
            source,
        }
    }
}

/// At most this many slices per vectored write (the kernel's IOV_MAX).
const MAX_IOV: usize = 1024;

/// Writes every byte of `parts` at `offset` with as few `pwritev` calls as the kernel allows
/// (short writes continue where they stopped); the file's cursor is neither used nor moved.
pub(crate) fn write_all_at(
    file: &std::fs::File,
    parts: &mut [IoSlice<'_>],
    mut offset: u64,
) -> std::io::Result<()> {
    let mut parts = parts;
    while !parts.is_empty() {
        let n = parts.len().min(MAX_IOV);
        match rustix::io::pwritev(file, &parts[..n], offset) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                IoSlice::advance_slices(&mut parts, n);
                offset += n as u64;
            }
            Err(e) if e == rustix::io::Errno::INTR => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Bytes of an object written and synced before the next are written (see [`write_paced`]).
const PACE_BYTES: usize = 1 << 20;

/// Writes `data` from offset 0 in runs of about [`PACE_BYTES`], each synced before the next:
/// the device then never holds more than one run of this object queued, so a WAL sync on the
/// same device waits for at most one run instead of the whole object (measured: a 17 MB
/// object written at once and then synced held a concurrent WAL `fdatasync` for 9 ms).
fn write_paced(f: &std::fs::File, data: &Parts) -> std::io::Result<()> {
    let mut offset = 0u64;
    let mut run: Vec<IoSlice<'_>> = Vec::new();
    let mut run_len = 0usize;
    for piece in data.pieces() {
        let mut rest: &[u8] = piece;
        while !rest.is_empty() {
            let take = rest.len().min(PACE_BYTES - run_len);
            run.push(IoSlice::new(&rest[..take]));
            run_len += take;
            rest = &rest[take..];
            if run_len == PACE_BYTES {
                write_all_at(f, &mut run, offset)?;
                f.sync_data()?;
                offset += run_len as u64;
                run.clear();
                run_len = 0;
            }
        }
    }
    // The last run is synced by the caller's `fsync` of the whole file.
    write_all_at(f, &mut run, offset)
}

/// Evicts a written, synced object from the page cache. Objects are written once and read
/// through the engine's own caches, so their pages only grow the page cache; measured here, a
/// page cache growing into memory never touched before makes the write's copy ~10× slower
/// (a VM backs guest memory on first touch) than one that recycles freed pages. Advice only:
/// a failure changes nothing but speed.
fn drop_cached_pages(f: &std::fs::File) {
    if let Err(e) = rustix::fs::fadvise(f, 0, None, rustix::fs::Advice::DontNeed) {
        tracing::debug!(error = %e, "fadvise(DONTNEED) failed");
    }
}

#[async_trait::async_trait]
impl ObjectStorage for FileStorage {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        self.put_parts(key, Parts::from(data)).await
    }

    async fn put_parts(&self, key: &str, data: Parts) -> Result<(), StorageError> {
        let path = self.path_of(key)?;
        let root = self.root.clone();
        let synced = self.synced_dirs.clone();
        let key = key.to_string();
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        blocking(move || {
            let wrap = |source: std::io::Error| StorageError::Io {
                key: key.clone(),
                source,
            };
            let dir = path
                .parent()
                .ok_or_else(|| StorageError::Other(format!("key has no parent: key=`{key}`")))?
                .to_path_buf();
            create_dirs_durably(&root, &dir, &synced).map_err(wrap)?;
            let file_name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let tmp = dir.join(format!(
                ".{file_name}{TMP_MARKER}{}-{n}",
                std::process::id()
            ));
            let result = (|| {
                let f = std::fs::File::create(&tmp)?;
                write_paced(&f, &data)?;
                f.sync_all()?;
                drop_cached_pages(&f);
                drop(f);
                std::fs::rename(&tmp, &path)?;
                // The rename is durable only once the directory entry is.
                fsync_dir(&dir)
            })();
            if result.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            result.map_err(wrap)
        })
        .await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        let path = self.path_of(key)?;
        let key = key.to_string();
        blocking(move || {
            std::fs::read(&path)
                .map(Bytes::from)
                .map_err(|e| io_err(&key, e))
        })
        .await
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError> {
        let path = self.path_of(key)?;
        let key = key.to_string();
        blocking(move || {
            let mut f = std::fs::File::open(&path).map_err(|e| io_err(&key, e))?;
            let size = f.metadata().map_err(|e| io_err(&key, e))?.len();
            if start.checked_add(len).is_none_or(|end| end > size) {
                return Err(range_error(&key, start, len, size));
            }
            let len_usize =
                usize::try_from(len).map_err(|_| range_error(&key, start, len, size))?;
            f.seek(SeekFrom::Start(start))
                .map_err(|e| io_err(&key, e))?;
            let mut buf = vec![0u8; len_usize];
            f.read_exact(&mut buf).map_err(|e| io_err(&key, e))?;
            Ok(Bytes::from(buf))
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        let path = self.path_of(key)?;
        let key = key.to_string();
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&key, e)),
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let root = self.root.clone();
        let prefix = prefix.to_string();
        blocking(move || {
            // Start from the deepest directory the prefix fully names.
            let (dir_rel, start) = match prefix.rfind('/') {
                Some(i) => (&prefix[..i], root.join(&prefix[..i])),
                None => ("", root.clone()),
            };
            let mut out = Vec::new();
            walk(&start, dir_rel, &prefix, &mut out).map_err(|e| io_err(&prefix, e))?;
            out.sort();
            Ok(out)
        })
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// MemoryStorage
// ---------------------------------------------------------------------------------------------

/// In-memory storage for tests. Share it through an `Arc` to survive a simulated crash.
/// Fault injection: `fail_puts(n)` / `fail_gets(n)` / `fail_deletes(n)` make the next n calls
/// fail.
#[derive(Debug, Default)]
pub struct MemoryStorage {
    objects: Mutex<BTreeMap<String, Bytes>>,
    fail_puts: AtomicUsize,
    fail_gets: AtomicUsize,
    fail_deletes: AtomicUsize,
    puts: AtomicU64,
    gets: AtomicU64,
    /// Every key `list` returned, in order (what a listing cost).
    listed: Mutex<Vec<String>>,
}

/// Takes one injected failure from `counter` if any are left (test doubles' fault injection).
pub(crate) fn take_failure(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl MemoryStorage {
    pub fn new() -> MemoryStorage {
        MemoryStorage::default()
    }

    /// The next `n` puts fail with an injected error (nothing is stored).
    pub fn fail_puts(&self, n: usize) {
        self.fail_puts.store(n, Ordering::SeqCst);
    }

    /// The next `n` gets / range gets fail with an injected error.
    pub fn fail_gets(&self, n: usize) {
        self.fail_gets.store(n, Ordering::SeqCst);
    }

    /// The next `n` deletes fail with an injected error (nothing is deleted).
    pub fn fail_deletes(&self, n: usize) {
        self.fail_deletes.store(n, Ordering::SeqCst);
    }

    /// Every key `list` has returned so far, in order.
    pub fn listed_keys(&self) -> Vec<String> {
        self.listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Successful puts so far.
    pub fn put_count(&self) -> u64 {
        self.puts.load(Ordering::SeqCst)
    }

    /// Successful gets (whole or range) so far.
    pub fn get_count(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }

    /// All keys currently stored.
    pub fn keys(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Overwrites an object in place, bypassing fault injection (corruption tests).
    pub fn raw_put(&self, key: &str, data: Bytes) {
        self.lock().insert(key.to_string(), data);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bytes>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait::async_trait]
impl ObjectStorage for MemoryStorage {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        if take_failure(&self.fail_puts) {
            return Err(StorageError::Other(format!(
                "injected put failure: key=`{key}`"
            )));
        }
        self.lock().insert(key.to_string(), data);
        self.puts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        if take_failure(&self.fail_gets) {
            return Err(StorageError::Other(format!(
                "injected get failure: key=`{key}`"
            )));
        }
        let data = self.lock().get(key).cloned();
        self.gets.fetch_add(1, Ordering::SeqCst);
        data.ok_or_else(|| StorageError::NotFound {
            key: key.to_string(),
        })
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError> {
        let data = self.get(key).await?;
        let size = data.len() as u64;
        match start.checked_add(len) {
            Some(end) if end <= size => Ok(data.slice(start as usize..end as usize)),
            _ => Err(range_error(key, start, len, size)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        if take_failure(&self.fail_deletes) {
            return Err(StorageError::Other(format!(
                "injected delete failure: key=`{key}`"
            )));
        }
        self.lock().remove(key);
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let keys: Vec<String> = self
            .lock()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect();
        self.listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(keys.iter().cloned());
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exercise(s: &dyn ObjectStorage) {
        s.put("a/b/1", Bytes::from_static(b"hello world"))
            .await
            .unwrap();
        s.put("a/b/2", Bytes::from_static(b"two")).await.unwrap();
        s.put("a/c", Bytes::from_static(b"c")).await.unwrap();
        s.put("ab", Bytes::from_static(b"ab")).await.unwrap();
        assert_eq!(
            s.get("a/b/1").await.unwrap(),
            Bytes::from_static(b"hello world")
        );
        assert_eq!(
            s.get_range("a/b/1", 6, 5).await.unwrap(),
            Bytes::from_static(b"world")
        );
        assert_eq!(s.get_range("a/b/1", 0, 0).await.unwrap(), Bytes::new());
        assert!(s.get_range("a/b/1", 6, 6).await.is_err());
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
            vec!["a/b/1", "a/b/2", "a/c", "ab"]
        );
        assert!(s.list("zz/").await.unwrap().is_empty());
        // Overwrite replaces atomically.
        s.put("a/b/1", Bytes::from_static(b"new")).await.unwrap();
        assert_eq!(s.get("a/b/1").await.unwrap(), Bytes::from_static(b"new"));
        s.delete("a/b/1").await.unwrap();
        s.delete("a/b/1").await.unwrap(); // missing = Ok
        assert!(matches!(
            s.get("a/b/1").await,
            Err(StorageError::NotFound { .. })
        ));
        assert_eq!(s.list("a/").await.unwrap(), vec!["a/b/2", "a/c"]);
    }

    #[tokio::test]
    async fn memory_storage_semantics() {
        exercise(&MemoryStorage::new()).await;
    }

    #[tokio::test]
    async fn file_storage_semantics() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStorage::open(dir.path()).unwrap();
        exercise(&s).await;
        // Keys map to subdirectories.
        assert!(dir.path().join("a/b/2").is_file());
    }

    /// Directories already made durable are remembered, but one removed under the storage
    /// (an operator's cleanup) is made again rather than failing every later put.
    #[tokio::test]
    async fn file_storage_remakes_a_directory_removed_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStorage::open(dir.path()).unwrap();
        s.put("data/1/2/a", Bytes::from_static(b"a")).await.unwrap();
        std::fs::remove_dir_all(dir.path().join("data")).unwrap();
        s.put("data/1/2/b", Bytes::from_static(b"b")).await.unwrap();
        assert_eq!(s.get("data/1/2/b").await.unwrap(), Bytes::from_static(b"b"));
        assert_eq!(s.list("data/").await.unwrap(), vec!["data/1/2/b"]);
    }

    #[tokio::test]
    async fn file_storage_rejects_unsafe_keys() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStorage::open(dir.path()).unwrap();
        for key in ["", "/abs", "a/../b", "a//b", ".hidden", "a/.x"] {
            assert!(
                s.put(key, Bytes::from_static(b"x")).await.is_err(),
                "key {key:?} should be rejected"
            );
        }
    }

    #[tokio::test]
    async fn file_storage_temp_files_are_invisible_and_cleaned_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStorage::open(dir.path()).unwrap();
        s.put("wal/00000000000000000001", Bytes::from_static(b"ok"))
            .await
            .unwrap();
        // A crash between write and rename leaves a temp file: never visible as an object.
        let torn = dir
            .path()
            .join("wal")
            .join(format!(".00000000000000000002{TMP_MARKER}1-0"));
        std::fs::write(&torn, b"tor").unwrap();
        assert_eq!(
            s.list("wal/").await.unwrap(),
            vec!["wal/00000000000000000001"]
        );
        drop(s);
        let s = FileStorage::open(dir.path()).unwrap();
        assert!(!torn.exists(), "temp file must be cleaned at open");
        assert_eq!(s.list("").await.unwrap(), vec!["wal/00000000000000000001"]);
    }

    #[tokio::test]
    async fn file_storage_put_leaves_no_temp_and_creates_deep_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStorage::open(dir.path().join("root")).unwrap();
        s.put("x/y/z/obj", Bytes::from(vec![7u8; 10_000]))
            .await
            .unwrap();
        let d = dir.path().join("root/x/y/z");
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["obj"]);
        assert_eq!(s.get("x/y/z/obj").await.unwrap().len(), 10_000);
        // Directory fsync helper works on the created path.
        fsync_dir(&d).unwrap();
    }

    #[tokio::test]
    async fn put_parts_writes_the_pieces_in_order_past_one_pwritev() {
        use crate::parts::{COPY_BELOW, PartsWriter};
        // More large pieces than one pwritev takes (IOV_MAX = 1024), interleaved with small ones,
        // over several paced runs (pieces cut at their ends).
        let mut w = PartsWriter::with_capacity(0);
        let mut want = Vec::new();
        for i in 0..1500u32 {
            let small = i.to_le_bytes();
            w.put_slice(&small);
            want.extend_from_slice(&small);
            let big = Bytes::from(vec![(i % 251) as u8; COPY_BELOW + (i as usize % 7)]);
            w.put_bytes(&big);
            want.extend_from_slice(&big);
        }
        let parts = w.finish();
        assert!(parts.pieces().len() > 2048);
        let dir = tempfile::tempdir().unwrap();
        let files = FileStorage::open(dir.path()).unwrap();
        let memory = MemoryStorage::new();
        for s in [&files as &dyn ObjectStorage, &memory] {
            s.put_parts("obj", parts.clone()).await.unwrap();
            assert_eq!(s.get("obj").await.unwrap(), Bytes::from(want.clone()));
        }
        // Pieces larger than a paced run, one ending exactly on a run's end.
        let mut w = PartsWriter::with_capacity(0);
        let mut want = Vec::new();
        for (len, byte) in [
            (3, 1u8),
            (PACE_BYTES * 5 / 2, 2),
            (PACE_BYTES / 2 - 3, 3),
            (5, 4),
        ] {
            let piece = Bytes::from(vec![byte; len]);
            w.put_bytes(&piece);
            want.extend_from_slice(&piece);
        }
        files.put_parts("big", w.finish()).await.unwrap();
        assert_eq!(files.get("big").await.unwrap(), Bytes::from(want));
    }

    #[tokio::test]
    async fn memory_storage_fault_injection() {
        let s = MemoryStorage::new();
        s.fail_puts(2);
        assert!(s.put("k", Bytes::new()).await.is_err());
        assert!(s.put("k", Bytes::new()).await.is_err());
        assert!(matches!(
            s.get("k").await,
            Err(StorageError::NotFound { .. })
        ));
        s.put("k", Bytes::from_static(b"v")).await.unwrap();
        s.fail_gets(1);
        assert!(s.get("k").await.is_err());
        assert_eq!(s.get("k").await.unwrap(), Bytes::from_static(b"v"));
        assert_eq!(s.put_count(), 1);
    }
}
