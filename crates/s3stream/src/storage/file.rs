//! `FileStorage`: objects as files under a root directory, with crash-atomic puts.

use std::collections::HashSet;
use std::io::{IoSlice, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{ObjectStorage, StorageError, range_error};
use crate::parts::Parts;

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
        // Every object is fsynced with its directory chain up to `root`; `root` itself here.
        create_dir_durably(&root).map_err(io)?;
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

    /// Writes `data` to a synced temp file, then moves it to `key`'s path: replacing what is
    /// there (`rename`), or only if nothing is (`link`, which fails if the name exists, so
    /// of racing writers exactly one creates it). `Ok(false)`: not replacing, and it existed.
    async fn write(&self, key: &str, data: Parts, replace: bool) -> Result<bool, StorageError> {
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
            if !replace && path.exists() {
                return Ok(false);
            }
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
                let created = if replace {
                    std::fs::rename(&tmp, &path)?;
                    true
                } else {
                    let linked = match std::fs::hard_link(&tmp, &path) {
                        Ok(()) => true,
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
                        Err(e) => return Err(e),
                    };
                    std::fs::remove_file(&tmp)?;
                    linked
                };
                // The new entry is durable only once the directory is.
                fsync_dir(&dir)?;
                Ok(created)
            })();
            if result.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            result.map_err(wrap)
        })
        .await
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

/// `create_dir_all`, with each directory it creates synced into its parent: a file is only as
/// durable as the path to it. The engine's copy of `pico_common::fs::create_dir_durably`
/// (as with [`fsync_dir`]).
pub(crate) fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.is_dir()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    for d in missing {
        match d.parent() {
            Some(p) if p.as_os_str().is_empty() => fsync_dir(Path::new("."))?,
            Some(p) => fsync_dir(p)?,
            None => {}
        }
    }
    Ok(())
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
        self.write(key, data, true).await.map(|_| ())
    }

    async fn put_if_absent(&self, key: &str, data: Parts) -> Result<bool, StorageError> {
        self.write(key, data, false).await
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemoryStorage;

    #[tokio::test]
    async fn file_storage_keys_are_paths() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStorage::open(dir.path()).unwrap();
        s.put("a/b/2", Bytes::from_static(b"two")).await.unwrap();
        assert!(
            !s.put_if_absent("a/b/2", Parts::from(Bytes::from_static(b"x")))
                .await
                .unwrap()
        );
        assert!(
            s.put_if_absent("a/b/3", Parts::from(Bytes::from_static(b"3")))
                .await
                .unwrap()
        );
        assert_eq!(s.get("a/b/2").await.unwrap(), Bytes::from_static(b"two"));
        // Keys map to subdirectories; a conditional put leaves no temp file behind.
        assert!(dir.path().join("a/b/2").is_file());
        let names: Vec<_> = std::fs::read_dir(dir.path().join("a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
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
}
