//! `SegmentWal`: the WAL in append-only segment files on a local disk (`file://` storage).
//!
//! `ObjectWal` on files costs a create, a write, two fsyncs, a rename and a directory fsync per
//! group commit; here a group commit is one vectored write and one `fdatasync` on an open file.
//!
//! Layout ([`crate::segment_format`], `docs/design/formats.md`): `{dir}/{first:020}-{key:016x}.wal`,
//! each a header (magic, version, first position, key, length) and then frames `u32 len`
//! `u32 crc32c` `u64 key` `u64 trimmed` + one WAL entry as `format::encode_wal_entry` writes it
//! (magic, position, CRC32C); and `{dir}/wal.manifest`, the newest segment started and the trim
//! watermark.
//!
//! Invariants:
//! - Each segment gets a random key when it starts, and only frames carrying it are its data.
//!   Recovery searches a segment byte by byte past the end of its data (below); without the
//!   key, record bytes shaped like a frame (a client's, or a recycled file's older frames)
//!   would read as data there and fail recovery, or cost a checksum pass each.
//! - A segment starts durably before anything goes in: its file at its full length (the spare,
//!   or extended sparse) with its header, synced, then the manifest naming it as the head.
//!   So a head segment that is missing, has no valid header, or is shorter than its header's
//!   length was damaged after the fact (a crash never does that), and recovery refuses.
//! - Appends are serialized; an append returns only after its frame and everything before it in
//!   the segment are on disk, so only the last frame of the WAL can be torn.
//! - Every frame carries the trim watermark as it was when written (every position `<=` it was
//!   committed to objects); trim records it in the manifest before it removes a segment, and
//!   otherwise in an empty entry (no records) of the active segment.
//!   Damage that loses only positions `<=` the watermark costs nothing: recovery warns and goes
//!   on. Damage that loses a later position, other than a torn last frame, fails recovery with
//!   [`WalError::Lost`] naming the file and the positions: never an offset given out twice.
//! - A write or sync error abandons the segment: the next append starts a new segment at the
//!   same position. A later segment starting at `q` therefore supersedes every entry `>= q` of
//!   earlier segments (the abandoned attempt), and recovery applies exactly that rule. A
//!   segment that itself started at `q` holds nothing acknowledged and is deleted (durably)
//!   before its replacement is created.
//! - A segment followed by one starting at `q` above its own first holds every position up to
//!   `q - 1`; the oldest segment starts at most one past the trim watermark; the newest starts
//!   at or after the manifest's head. Recovery checks all three.
//! - Every append writes [`END_MARKER`] (8 zero bytes) right after its frame, in the same
//!   write, and the next append overwrites it. A segment's data ends at the marker, at zeros, at
//!   the end of the file, or at a valid frame whose position is below the segment's first (left
//!   by the file's earlier use as another segment, see recycling below).
//! - A torn last frame (cut short, failing its checksum, or with a damaged header) has no valid
//!   frame at or after the expected position anywhere after it: it is what a crash mid-append
//!   leaves and is ignored with a warning. An end of data followed by such a valid frame is
//!   damage in the middle of the log: the positions in between are lost (see above).
//! - After a restart, positions continue after the last entry recovered, the highest segment's
//!   name, the manifest's head and the trim watermark, whichever is highest: a segment whose
//!   first frame never landed still supersedes entries at or above its name, and a position at
//!   or below the watermark would read as committed.
//! - A segment start that fails after the spare was renamed leaves no active segment, so the
//!   retry starts the segment at that position itself (an entry written into the previous
//!   segment would be superseded by the new file's name).
//! - Trim deletes whole segments whose entries are all `<= upto`; the active segment is closed
//!   first when it is entirely trimmed, unless it is preallocated and has room left (then it
//!   stays, and recovery replays its committed entries, which the engine skips).
//!
//! Preallocation (on in production, [`SegmentWal::with_preallocation`]): an `fdatasync` after an
//! append that grew the file must also persist the new size and block map (a journal commit on
//! journaled ext4 or xfs, an inode write without a journal); after an overwrite of blocks
//! already on disk it flushes only the data. Measured on this project's machine (ext4 without a
//! journal): 64 KiB write + `fdatasync` 240–360 µs appending, 165–190 µs overwriting. So a new
//! segment is a spare file renamed into place, its blocks allocated and synced:
//! - recycled: a trim that deletes a full segment while no spare exists renames it to the spare
//!   instead. Its old frames stay until overwritten; their positions are all below any later
//!   segment's first (positions only grow, and a segment is trimmed only once the WAL is past
//!   it), which is how recovery tells them apart.
//! - zeros written by a background thread, only when no closed segment is left to recycle (at
//!   start-up, or when the WAL holds nothing but its active segment): writing zeros per segment
//!   doubled the disk bytes of a heavy ingest.
//!
//! A spare found at start-up is deleted, never used: a recycled spare's old frames could look
//! current to a process that does not know where its predecessor got.
//!
//! Without a ready spare a segment is extended sparse to its length, and leaves for the spare as
//! soon as there is one.

use std::fs::File;
use std::io::{IoSlice, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use std::sync::mpsc;

use tokio::sync::oneshot;

mod scan;
use scan::{live_entries, read_manifest, scan_dir};
#[cfg(test)]
use scan::{lost, scan_segment};

use crate::format;
use crate::segment_format::{
    self as layout, END_MARKER, FRAME_HEADER, MANIFEST, Manifest, SEGMENT_HEADER, SegmentHeader,
};
use crate::storage::{create_dir_durably, write_all_at};
use crate::telemetry;
use crate::wal::{BlockingAppend, Wal, WalError, WalRecord};

/// Default size after which the next append starts a new segment.
pub const DEFAULT_SEGMENT_BYTES: u64 = 32 << 20;
const SUFFIX: &str = ".wal";
/// A file ready to become the next segment, its blocks allocated and synced: zeros written in
/// the background, or a trimmed segment recycled (not a segment: no `.wal` suffix).
const SPARE: &str = "spare.segment";
/// The spare while zeros are being written into it.
const SPARE_TMP: &str = "spare.segment.tmp";

struct Segment {
    first: u64,
    path: PathBuf,
}

struct Active {
    file: File,
    /// The key in this segment's name, repeated in every frame header.
    key: u64,
    len: u64,
    /// Started from a spare (synced zeros).
    preallocated: bool,
}

#[derive(Default)]
struct State {
    loaded: bool,
    /// Next position to write.
    next: u64,
    /// Ascending by `first`; the last one is the active segment when `active` is set.
    segments: Vec<Segment>,
    active: Option<Active>,
    /// Every position `<=` this was committed to objects (trim's `upto`, never past the last
    /// position written): written into every frame.
    trimmed: u64,
    /// The head (first position, key) the manifest on disk names.
    head: Option<(u64, u64)>,
    /// The highest watermark on disk (in the manifest or a frame): a trim past it records it.
    persisted: u64,
    timings: telemetry::WalTimings,
}

pub struct SegmentWal {
    dir: PathBuf,
    segment_bytes: u64,
    preallocate: bool,
    /// A spare is being written.
    preparing: Arc<AtomicBool>,
    /// Spare threads not yet exited (a thread may outlive `preparing`: tests wait for zero).
    spare_threads: Arc<AtomicUsize>,
    /// The segments, open file and positions: the committer thread's jobs and
    /// [`BlockingAppend::append_sync`] (the engine's writer thread) take turns on them.
    state: Arc<Mutex<State>>,
    /// The committer thread that runs trims, recovery and async appends; `Err` says why it
    /// could not start.
    committer: Result<Committer, String>,
}

/// What recovery returns: every entry still in the WAL, ascending by position.
type Entries = Vec<(u64, Vec<WalRecord>)>;

/// Work for the committer thread; each job answers on its own oneshot.
enum Job {
    Append {
        records: Vec<WalRecord>,
        preallocate: bool,
        reply: oneshot::Sender<Result<(u64, bool), WalError>>,
    },
    Trim {
        upto: u64,
        preallocate: bool,
        reply: oneshot::Sender<Result<bool, WalError>>,
    },
    Recover {
        reply: oneshot::Sender<Result<Entries, WalError>>,
    },
}

/// The WAL's job thread: runs trims, recovery and appends made through the async [`Wal`]
/// API, so no async worker ever waits on the disk. The engine's appends do not come here: its
/// writer runs on a thread of its own and appends with [`BlockingAppend::append_sync`], then
/// acknowledges the group right there (`engine/writer.rs`). Both take the state lock for a
/// whole write and sync, so appends and trims stay serialized.
///
/// It sleeps in `recv` while nothing is queued and otherwise takes jobs one after another, no
/// timer, answering each caller right after the sync that made its entry durable.
///
/// Before it, an append's write and sync ran inline on the writer's async worker while they
/// were fast (and on a blocking thread after a slow one): on a 2-core machine under small
/// appends that blocked one of the two workers ~27 % of the time, the HTTP work waiting.
struct Committer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Committer {
    fn start(
        dir: PathBuf,
        segment_bytes: u64,
        state: Arc<Mutex<State>>,
    ) -> Result<Committer, String> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("wal-commit".into())
            .spawn(move || commit_loop(&dir, segment_bytes, &state, &rx))
            .map_err(|e| format!("could not start the wal committer thread: {e}"))?;
        Ok(Committer {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for Committer {
    /// Waits for the job under way, if any (at most one write and sync): a WAL opened again on
    /// the same directory (a restart in one process) must not see this one still writing.
    /// Jobs queued behind it whose caller is gone are skipped.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

fn commit_loop(dir: &Path, segment_bytes: u64, state: &Mutex<State>, jobs: &mpsc::Receiver<Job>) {
    // Ends once the WAL is dropped and every queued job has been taken.
    while let Ok(job) = jobs.recv() {
        // A caller that went away (its task aborted: a crash, in tests) never saw an answer:
        // skipping its job is as if it had never been called, and nothing is acked unwritten.
        match job {
            Job::Append {
                records,
                preallocate,
                reply,
            } => {
                if !reply.is_closed() {
                    let out = append_blocking(
                        dir,
                        segment_bytes,
                        preallocate,
                        &mut lock(state),
                        &records,
                    );
                    let _ = reply.send(out);
                }
            }
            Job::Trim {
                upto,
                preallocate,
                reply,
            } => {
                if !reply.is_closed() {
                    let out =
                        trim_blocking(dir, segment_bytes, preallocate, &mut lock(state), upto);
                    let _ = reply.send(out);
                }
            }
            Job::Recover { reply } => {
                if !reply.is_closed() {
                    let _ = reply.send(load(dir, &mut lock(state)));
                }
            }
        }
    }
}

fn io(path: &Path, e: std::io::Error) -> WalError {
    WalError::Other(format!("wal file `{}`: {e}", path.display()))
}

fn fsync_dir(dir: &Path) -> Result<(), WalError> {
    crate::storage::fsync_dir(dir).map_err(|e| io(dir, e))
}

fn parse_name(name: &str) -> Option<(u64, u64)> {
    let (digits, key) = name.strip_suffix(SUFFIX)?.split_once('-')?;
    let ok = digits.len() == 20
        && digits.bytes().all(|b| b.is_ascii_digit())
        && key.len() == 16
        && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    ok.then(|| Some((digits.parse().ok()?, u64::from_str_radix(key, 16).ok()?)))
        .flatten()
}

fn segment_name(first: u64, key: u64) -> String {
    format!("{first:020}-{key:016x}{SUFFIX}")
}

fn load(dir: &Path, st: &mut State) -> Result<Vec<(u64, Vec<WalRecord>)>, WalError> {
    // The new directories' entries must be durable before segments in them are.
    create_dir_durably(dir).map_err(|e| io(dir, e))?;
    if !st.loaded {
        // A recycled spare holds frames of positions an earlier process wrote, and this one
        // must not reason about them: spares from an earlier process are dropped, whatever
        // their name; this process writes or recycles its own.
        for name in [SPARE, SPARE_TMP, "wal.manifest.tmp"] {
            match std::fs::remove_file(dir.join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&dir.join(name), e)),
            }
        }
    }
    let manifest = read_manifest(dir)?;
    let live = live_entries(dir, scan_dir(dir)?, manifest)?;
    // A segment named `q` holds no entry when the crash came before its first frame landed;
    // positions still continue from `q`, never below it: a later segment starting at `q`
    // supersedes entries >= q of earlier ones, so an entry written at q or above into a segment
    // named below q would be dropped by the next recovery. And never at or below the watermark,
    // which says those positions were committed.
    let after = live
        .entries
        .last()
        .map_or(1, |(p, _)| p + 1)
        .max(live.segments.last().map_or(1, |s| s.first))
        .max(manifest.and_then(|m| m.head).map_or(1, |(f, _)| f))
        .max(live.trimmed + 1);
    st.next = if st.loaded { st.next.max(after) } else { after };
    st.trimmed = st.trimmed.max(live.trimmed);
    st.persisted = st.persisted.max(live.trimmed);
    st.head = manifest.and_then(|m| m.head);
    st.segments = live.segments;
    st.active = None;
    st.loaded = true;
    Ok(live.entries)
}

/// The spare thread's loop: writes spares while segments keep taking them.
fn prepare_spares(dir: &Path, bytes: u64, preparing: &AtomicBool) {
    loop {
        if let Err(e) = prepare_spare(dir, bytes) {
            // Only costs speed: the next segment is created empty instead.
            tracing::warn!(dir = %dir.display(), error = %e, "could not preallocate a wal segment");
            preparing.store(false, Ordering::Release);
            return;
        }
        preparing.store(false, Ordering::Release);
        // A segment that took the spare while this thread still held the flag found nobody
        // to ask for the next one: prepare it here.
        if dir.join(SPARE).exists() || preparing.swap(true, Ordering::AcqRel) {
            return;
        }
    }
}

/// Writes `bytes` zeros to a temporary file, syncs it and renames it to [`SPARE`]. On failure
/// the temporary file is removed: a full disk is the likely cause, and the partial file would
/// hold on to up to a segment's worth of it until the next start.
fn prepare_spare(dir: &Path, bytes: u64) -> std::io::Result<()> {
    let tmp = dir.join(SPARE_TMP);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&tmp)?;
        let zeros = vec![0u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            f.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        // Blocks allocated and the size persisted now, so an append into them syncs data only.
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(SPARE))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

impl SegmentWal {
    pub fn new(dir: impl Into<PathBuf>) -> SegmentWal {
        SegmentWal::with_segment_bytes(dir, DEFAULT_SEGMENT_BYTES)
    }

    pub fn with_segment_bytes(dir: impl Into<PathBuf>, segment_bytes: u64) -> SegmentWal {
        let dir = dir.into();
        let segment_bytes = segment_bytes.max(1);
        let state = Arc::new(Mutex::new(State::default()));
        SegmentWal {
            committer: Committer::start(dir.clone(), segment_bytes, state.clone()),
            state,
            dir,
            segment_bytes,
            preallocate: false,
            preparing: Arc::new(AtomicBool::new(false)),
            spare_threads: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// New segments start as a synced file of zeros prepared in the background (see the
    /// module docs): each append's `fdatasync` then flushes data only.
    pub fn with_preallocation(mut self, on: bool) -> SegmentWal {
        self.preallocate = on;
        self
    }

    /// Starts writing a spare segment unless one is ready or being written.
    fn kick_spare(&self) {
        if !self.preallocate || self.dir.join(SPARE).exists() {
            return;
        }
        if self.preparing.swap(true, Ordering::AcqRel) {
            return;
        }
        let dir = self.dir.clone();
        let bytes = self.segment_bytes;
        let preparing = self.preparing.clone();
        let threads = self.spare_threads.clone();
        threads.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("wal-spare".into())
            .spawn(move || {
                prepare_spares(&dir, bytes, &preparing);
                threads.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the wal preallocation thread");
            self.spare_threads.fetch_sub(1, Ordering::AcqRel);
            self.preparing.store(false, Ordering::Release);
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Hands `job` to the committer thread and waits for its answer.
    async fn run<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, WalError>>) -> Job,
    ) -> Result<T, WalError> {
        let jobs = match &self.committer {
            Ok(c) => c.jobs.as_ref(),
            Err(e) => return Err(WalError::Other(e.clone())),
        };
        let (tx, rx) = oneshot::channel();
        let stopped = || WalError::Other("the wal committer thread stopped".into());
        jobs.ok_or_else(stopped)?
            .send(job(tx))
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

/// Starts the segment at `position`: a ready spare (synced zeros or a recycled segment) or a
/// file extended sparse to `segment_bytes`, its header written and synced, then the manifest
/// naming it. Nothing goes in before all of that is durable: see the module docs.
fn start_segment(
    dir: &Path,
    segment_bytes: u64,
    preallocate: bool,
    st: &mut State,
    position: u64,
) -> Result<(), WalError> {
    // A segment that starts at this position holds nothing acknowledged (positions at or
    // above it were never acknowledged): an attempt this one replaces. Its file goes first,
    // durably, so recovery never has to choose between the two.
    let replaced: Vec<PathBuf> = st
        .segments
        .iter()
        .filter(|s| s.first == position)
        .map(|s| s.path.clone())
        .collect();
    if !replaced.is_empty() {
        st.active = None;
        // The manifest must not name a segment that is about to go: back to the one before
        // (complete: it was closed), or none. Always rewritten, rare as this is: a failed
        // start may have renamed a manifest naming the replaced segment into place.
        let head = st
            .segments
            .iter()
            .filter(|s| s.first < position)
            .max_by_key(|s| s.first)
            .and_then(|s| segment_key(&s.path).map(|k| (s.first, k)));
        write_manifest(dir, st, head)?;
        for old in &replaced {
            match std::fs::remove_file(old) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(old, e)),
            }
        }
        fsync_dir(dir)?;
        st.segments.retain(|s| s.first != position);
    }
    // A fresh random key per segment: see `scan_segment`.
    let key: u64 = rand::random();
    let path = dir.join(segment_name(position, key));
    // Listed before it exists: if starting it fails after the spare was renamed, the retry
    // finds it here and deletes it as the attempt it replaces.
    st.active = None;
    st.segments.push(Segment {
        first: position,
        path: path.clone(),
    });
    let spare = preallocate && std::fs::rename(dir.join(SPARE), &path).is_ok();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(!spare)
        .open(&path)
        .map_err(|e| io(&path, e))?;
    let started = (|| {
        let size = file.metadata()?.len();
        let length = size.max(segment_bytes);
        if size < length {
            // Sparse: the blocks are allocated by the appends, but the length is fixed now,
            // so a cut file shows.
            file.set_len(length)?;
        }
        let header = layout::encode_segment_header(&SegmentHeader {
            first: position,
            key,
            length,
        });
        write_all_at(&file, &mut [IoSlice::new(&header)], 0)?;
        file.sync_all()
    })();
    started.map_err(|e| io(&path, e))?;
    fsync_dir(dir)?;
    write_manifest(dir, st, Some((position, key)))?;
    st.active = Some(Active {
        file,
        key,
        len: SEGMENT_HEADER as u64,
        preallocated: spare,
    });
    Ok(())
}

/// The key in a segment file's name.
fn segment_key(path: &Path) -> Option<u64> {
    parse_name(&path.file_name()?.to_string_lossy()).map(|(_, k)| k)
}

fn write_manifest(dir: &Path, st: &mut State, head: Option<(u64, u64)>) -> Result<(), WalError> {
    let m = Manifest {
        head,
        trimmed: st.trimmed,
    };
    layout::write_manifest(dir, &m).map_err(|e| io(&dir.join(MANIFEST), e))?;
    st.head = head;
    st.persisted = st.persisted.max(m.trimmed);
    Ok(())
}

/// Appends one entry; returns its position and whether the background thread must write a
/// spare (it started a new segment and no closed segment is left to recycle).
fn append_blocking(
    dir: &Path,
    segment_bytes: u64,
    preallocate: bool,
    st: &mut State,
    records: &[WalRecord],
) -> Result<(u64, bool), WalError> {
    if !st.loaded {
        load(dir, st)?;
    }
    let position = st.next;
    let entry =
        format::encode_wal_entry_parts(position, records).map_err(|source| WalError::Corrupt {
            key: format!("{}@{position}", dir.display()),
            source,
        })?;
    let len = u32::try_from(entry.len())
        .map_err(|_| WalError::Other(format!("wal entry too large: {} bytes", entry.len())))?;
    // A segment started without a spare (none was ready yet, e.g. just after start-up) is left
    // for a preallocated one as soon as a spare exists, not only when it is full.
    let start = st.active.as_ref().is_none_or(|a| {
        a.len >= segment_bytes
            || (preallocate
                && !a.preallocated
                && a.len > SEGMENT_HEADER as u64
                && dir.join(SPARE).exists())
    });
    if start {
        start_segment(dir, segment_bytes, preallocate, st, position)?;
    }
    let trimmed = st.trimmed;
    let Some(active) = st.active.as_mut() else {
        return Err(WalError::Other("no active wal segment".into()));
    };
    let header = layout::frame_header(len, active.key, trimmed);
    let mut slices = Vec::with_capacity(entry.pieces().len() + 2);
    slices.push(IoSlice::new(&header));
    slices.extend(entry.pieces().iter().map(|p| IoSlice::new(p)));
    slices.push(IoSlice::new(&END_MARKER));
    // At `active.len`, not the file's cursor: the end marker after a frame is simply
    // overwritten by the next one.
    let t0 = std::time::Instant::now();
    let result = write_all_at(&active.file, &mut slices, active.len).and_then(|()| {
        let t1 = std::time::Instant::now();
        st.timings.write.record(t1 - t0);
        let synced = active.file.sync_data();
        st.timings.sync.record(t1.elapsed());
        synced
    });
    match result {
        Ok(()) => {
            active.len += (FRAME_HEADER as u64) + u64::from(len);
            st.next = position + 1;
            st.persisted = st.persisted.max(trimmed);
            // Closed segments are recycled into the spare when trimmed; zeros are written only
            // when there is none to wait for.
            Ok((position, start && st.segments.len() <= 1))
        }
        Err(e) => {
            // What reached the disk is unknown (and a failed fsync may have dropped pages):
            // abandon the segment; the retry starts a new one at the same position.
            st.active = None;
            let path = st
                .segments
                .last()
                .map(|s| s.path.clone())
                .unwrap_or_default();
            Err(io(&path, e))
        }
    }
}

/// The bytes of a file's allocated blocks: a segment started without a spare is extended
/// sparse to its full length, and recycled as the spare it would make appends into its holes
/// allocate blocks (and sync the block map) after all.
fn allocated(m: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (m.blocks() * 512).min(m.len())
    }
    #[cfg(not(unix))]
    {
        m.len()
    }
}

/// How many segments, front first, trim to `upto` removes.
fn removable(st: &State, segment_bytes: u64, upto: u64) -> usize {
    let mut n = 0;
    for i in 0..st.segments.len() {
        // Segment i holds positions [first_i, first_{i+1}); the last one up to next - 1.
        let last = match st.segments.get(i + 1) {
            Some(f) => f.first.saturating_sub(1),
            None => st.next.saturating_sub(1),
        };
        if last > upto {
            break;
        }
        // A preallocated last segment with room left stays: closing it would spend a new
        // spare (a segment of zeros written and synced) on every upload cycle of a light
        // load, and that sync delays the appends behind it (measured: SSE p99 3 -> 10 ms at
        // 100 appends/s). Its entries are committed, so recovery skips them.
        if i + 1 == st.segments.len()
            && st
                .active
                .as_ref()
                .is_some_and(|a| a.preallocated && a.len < segment_bytes)
        {
            break;
        }
        n += 1;
    }
    n
}

/// Deletes or recycles the segments `upto` covers; returns whether the background thread must
/// write a spare (preallocating, none left, and no closed segment left to recycle later).
fn trim_blocking(
    dir: &Path,
    segment_bytes: u64,
    preallocate: bool,
    st: &mut State,
    upto: u64,
) -> Result<bool, WalError> {
    if !st.loaded {
        load(dir, st)?;
    }
    // Never past the last position written: a later one is not committed whatever the caller
    // says, and the watermark goes into every frame.
    st.trimmed = st.trimmed.max(upto.min(st.next.saturating_sub(1)));
    let n = removable(st, segment_bytes, upto);
    let mut kick = false;
    if n > 0 {
        // Before anything goes: recovery then knows the missing front segments were committed,
        // and (when the last one goes too) that no segment is required.
        let head = if n == st.segments.len() {
            None
        } else {
            st.head
        };
        write_manifest(dir, st, head)?;
    } else if st.trimmed > st.persisted {
        // Recorded now, not only in the next append's frame: a WAL left idle after its upload
        // would otherwise hold committed frames recovery cannot tell from uncommitted ones, and
        // damage to them would refuse a start that loses nothing. An empty entry in the active
        // segment costs what an append costs; the manifest (two syncs and a rename) only when
        // there is no room or no active segment.
        if st.active.as_ref().is_some_and(|a| a.len < segment_bytes) {
            kick = append_blocking(dir, segment_bytes, preallocate, st, &[])?.1;
        } else {
            let head = st.head;
            write_manifest(dir, st, head)?;
        }
    }
    for _ in 0..n {
        let is_last = st.segments.len() == 1;
        let following = st.segments.get(1).map(|n| n.first);
        // Whether every frame in the file, superseded attempts included, is below any position
        // a later segment can start at (the rule recovery tells stale frames apart by). A
        // segment abandoned at `q` may hold an attempt at `q`, the following segment's first;
        // the last segment holds one at `next` unless it was active (appends that fail close it).
        let stale_below_next = match following {
            Some(f) => st.next > f,
            None => st.active.is_some(),
        };
        if is_last {
            st.active = None;
        }
        let seg = st.segments.remove(0);
        // A full segment becomes the spare when there is none: the next segment then
        // overwrites blocks already allocated without anyone writing zeros first.
        let recycle = preallocate
            && stale_below_next
            && !dir.join(SPARE).exists()
            && std::fs::metadata(&seg.path).is_ok_and(|m| allocated(&m) >= segment_bytes);
        let gone = if recycle {
            std::fs::rename(&seg.path, dir.join(SPARE))
        } else {
            std::fs::remove_file(&seg.path)
        };
        match gone {
            // Each removal durable before the next: recovery requires a closed segment to reach
            // the next one, so a crash must never keep an older segment while a newer one is
            // gone.
            Ok(()) => fsync_dir(dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                let err = io(&seg.path, e);
                st.segments.insert(0, seg);
                return Err(err);
            }
        }
    }
    Ok(kick || (preallocate && st.segments.len() <= 1 && !dir.join(SPARE).exists()))
}

impl BlockingAppend for SegmentWal {
    fn append_sync(&self, records: &[WalRecord]) -> Result<u64, WalError> {
        let (pos, kick) = append_blocking(
            &self.dir,
            self.segment_bytes,
            self.preallocate,
            &mut lock(&self.state),
            records,
        )?;
        if kick {
            self.kick_spare();
        }
        Ok(pos)
    }
}

#[async_trait::async_trait]
impl Wal for SegmentWal {
    fn blocking(&self) -> Option<&dyn BlockingAppend> {
        Some(self)
    }

    async fn append(&self, records: Vec<WalRecord>) -> Result<u64, WalError> {
        let preallocate = self.preallocate;
        let (pos, kick) = self
            .run(|reply| Job::Append {
                records,
                preallocate,
                reply,
            })
            .await?;
        if kick {
            self.kick_spare();
        }
        Ok(pos)
    }

    async fn recover(&self) -> Result<Vec<(u64, Vec<WalRecord>)>, WalError> {
        let entries = self.run(|reply| Job::Recover { reply }).await?;
        // The first segment after a restart is a new one: have a spare ready for it.
        self.kick_spare();
        Ok(entries)
    }

    async fn trim(&self, upto: u64) -> Result<(), WalError> {
        let preallocate = self.preallocate;
        let kick = self
            .run(|reply| Job::Trim {
                upto,
                preallocate,
                reply,
            })
            .await?;
        if kick {
            self.kick_spare();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Seek;

    use crate::wal::tests::rec;

    /// One frame as the WAL writes it into a segment keyed `key` (without the end marker).
    fn keyed_frame(pos: u64, recs: &[WalRecord], key: u64) -> Vec<u8> {
        let e = format::encode_wal_entry(pos, recs).unwrap();
        let mut v = layout::frame_header(e.len() as u32, key, 0).to_vec();
        v.extend_from_slice(&e);
        v
    }

    /// Writes a segment file starting at `first` holding `frames` (each a position and its
    /// records), as the WAL would; returns its path.
    fn write_segment(dir: &Path, first: u64, frames: &[(u64, Vec<WalRecord>)]) -> PathBuf {
        let key: u64 = rand::random();
        let mut body = Vec::new();
        for (pos, recs) in frames {
            body.extend(keyed_frame(*pos, recs, key));
        }
        let length = (SEGMENT_HEADER + body.len() + END_MARKER.len()) as u64;
        let mut data =
            layout::encode_segment_header(&SegmentHeader { first, key, length }).to_vec();
        data.extend(body);
        data.extend(END_MARKER);
        let path = dir.join(segment_name(first, key));
        std::fs::write(&path, data).unwrap();
        path
    }

    /// Scans a segment file the way recovery does, with the first position and key its name
    /// gives: its entries, or an error for damage before valid data.
    fn scan(path: &Path) -> Result<Vec<(u64, Vec<WalRecord>)>, WalError> {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let (first, key) = parse_name(&name).unwrap();
        let s = scan_segment(path, first, key)?;
        match s.gaps.first() {
            Some(&(from, to)) => Err(lost(path, String::new(), "gap".into(), from, Some(to))),
            None => Ok(s.entries),
        }
    }

    /// Where a segment's data ends: after its last non-zero byte (the end marker is zeros).
    fn data_end(data: &[u8]) -> usize {
        data.iter().rposition(|b| *b != 0).unwrap() + 1
    }

    /// The segment file starting at `first`.
    fn segment_path(dir: &Path, first: u64) -> PathBuf {
        let prefix = format!("{first:020}");
        let found: Vec<String> = segments(dir)
            .into_iter()
            .filter(|f| f.starts_with(&prefix))
            .collect();
        assert_eq!(found.len(), 1, "{:?}", files(dir));
        dir.join(&found[0])
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn append_recover_roll_trim_and_positions_continue() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        // Tiny segments: every second entry rolls.
        let wal = SegmentWal::with_segment_bytes(&dir, 100);
        let mut written = Vec::new();
        for i in 0..6u64 {
            let recs = vec![rec(1, i * 2, 2), rec(2, i, 1)];
            let p = wal.append(recs.clone()).await.unwrap();
            written.push((p, recs));
        }
        assert_eq!(
            written.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5, 6]
        );
        assert!(files(&dir).len() > 1, "segments rolled: {:?}", files(&dir));

        let wal2 = SegmentWal::with_segment_bytes(&dir, 100);
        assert_eq!(wal2.recover().await.unwrap(), written);
        assert_eq!(wal2.append(vec![rec(3, 0, 1)]).await.unwrap(), 7);
        wal2.trim(4).await.unwrap();
        let got: Vec<u64> = wal2
            .recover()
            .await
            .unwrap()
            .iter()
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(got, vec![5, 6, 7]);
        wal2.trim(7).await.unwrap();
        assert!(wal2.recover().await.unwrap().is_empty());
        assert!(segments(&dir).is_empty(), "{:?}", files(&dir));
        // Positions keep increasing in-process after the WAL emptied.
        assert_eq!(wal2.append(vec![rec(3, 1, 1)]).await.unwrap(), 8);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_on_a_multi_thread_runtime_recover_exactly() {
        concurrent_appends_recover_exactly().await;
    }

    #[tokio::test]
    async fn concurrent_appends_on_a_current_thread_runtime_recover_exactly() {
        concurrent_appends_recover_exactly().await;
    }

    async fn concurrent_appends_recover_exactly() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = Arc::new(SegmentWal::with_segment_bytes(&dir, 4096).with_preallocation(true));
        let mut tasks = Vec::new();
        for t in 0..4u64 {
            let wal = wal.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..50u64 {
                    let recs = vec![rec(t, i, 1)];
                    got.push((wal.append(recs.clone()).await.unwrap(), recs));
                }
                got
            }));
        }
        let mut written = Vec::new();
        for t in tasks {
            written.extend(t.await.unwrap());
        }
        written.sort_by_key(|(p, _)| *p);
        let positions: Vec<u64> = written.iter().map(|(p, _)| *p).collect();
        assert_eq!(positions, (1..=200).collect::<Vec<u64>>());
        assert_eq!(SegmentWal::new(&dir).recover().await.unwrap(), written);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_whose_callers_go_away_leave_no_hole() {
        // Half the callers are aborted while their appends are queued or being written: the
        // committer skips a job nobody waits for or writes it whole, so the WAL holds every
        // acknowledged entry at contiguous positions, and the WAL goes on after them.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = Arc::new(SegmentWal::with_segment_bytes(&dir, 4096));
        let mut tasks = Vec::new();
        for i in 0..60u64 {
            let wal = wal.clone();
            let recs = vec![rec(1, i, 1)];
            tasks.push(tokio::spawn(async move {
                let p = wal.append(recs.clone()).await.unwrap();
                (p, recs)
            }));
        }
        for t in tasks.iter().skip(1).step_by(2) {
            t.abort();
        }
        let mut acked = Vec::new();
        for t in tasks {
            if let Ok(got) = t.await {
                acked.push(got);
            }
        }
        let last = wal.append(vec![rec(2, 0, 1)]).await.unwrap();
        drop(wal);
        let recovered = SegmentWal::new(&dir).recover().await.unwrap();
        let positions: Vec<u64> = recovered.iter().map(|(p, _)| *p).collect();
        assert_eq!(positions, (1..=last).collect::<Vec<u64>>());
        for entry in &acked {
            assert!(recovered.contains(entry), "acked entry lost: {entry:?}");
        }
    }

    #[test]
    fn appends_outside_any_runtime_worker_leave_it_free() {
        // A current-thread runtime has one thread: a sync run on it would stop every task.
        // A task keeps ticking while appends wait for the committer thread.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let tmp = tempfile::tempdir().unwrap();
            let wal = SegmentWal::new(tmp.path().join("wal"));
            let ticks = Arc::new(AtomicUsize::new(0));
            let ticker = {
                let ticks = ticks.clone();
                tokio::spawn(async move {
                    loop {
                        ticks.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                    }
                })
            };
            // Every append yields to the runtime while it waits. The ticker's `yield_now` is
            // deferred to the scheduler's next park, so when the reply is already there by then
            // (this thread preempted on a loaded machine) the tick lands in the next append:
            // at least every other append ticks. Run on the runtime's thread, none would.
            for i in 0..20u64 {
                wal.append(vec![rec(1, i, 1)]).await.unwrap();
            }
            let ticks = ticks.load(Ordering::Relaxed);
            assert!(
                ticks >= 10,
                "appends held the worker: {ticks} ticks in 20 appends"
            );
            ticker.abort();
        });
    }

    #[tokio::test]
    async fn a_group_of_large_batches_is_written_whole_past_one_pwritev() {
        // Large batches are written by reference, one slice each: 1100 of them (plus small
        // ones between) need several `pwritev` calls of at most MAX_IOV slices.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = SegmentWal::new(&dir).with_preallocation(true);
        let recs: Vec<WalRecord> = (0..1100u64)
            .map(|i| {
                let r = rec(i % 3, i, 1);
                let batch = vec![(i % 251) as u8; crate::parts::COPY_BELOW + i as usize];
                WalRecord::new(
                    r.stream,
                    r.epoch,
                    r.base_offset,
                    r.record_count,
                    batch.into(),
                    r.aux,
                )
            })
            .collect();
        assert_eq!(wal.append(vec![rec(9, 0, 1)]).await.unwrap(), 1);
        assert_eq!(wal.append(recs.clone()).await.unwrap(), 2);
        assert_eq!(wal.append(vec![rec(9, 1, 1)]).await.unwrap(), 3);
        let got = SegmentWal::new(&dir).recover().await.unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[1], (2, recs));
        assert_eq!(got[2], (3, vec![rec(9, 1, 1)]));
    }

    #[tokio::test]
    async fn torn_tail_is_ignored_and_later_data_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = SegmentWal::new(&dir);
        wal.append(vec![rec(1, 0, 1)]).await.unwrap();
        wal.append(vec![rec(1, 1, 1)]).await.unwrap();
        let seg = dir.join(&segments(&dir)[0]);
        // A crash mid-append: the end of the last frame never landed.
        let mut data = std::fs::read(&seg).unwrap();
        let end = data_end(&data);
        data[end - 7..end].fill(0);
        std::fs::write(&seg, &data).unwrap();
        let wal2 = SegmentWal::new(&dir);
        let got = wal2.recover().await.unwrap();
        assert_eq!(got, vec![(1, vec![rec(1, 0, 1)])]);
        // New appends go to a new segment; recovery sees old and new.
        assert_eq!(wal2.append(vec![rec(1, 1, 1)]).await.unwrap(), 2);
        let got = SegmentWal::new(&dir).recover().await.unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1], (2, vec![rec(1, 1, 1)]));

        // The size grew but the data never landed (zeros): also a torn tail.
        let seg2 = dir.join(segments(&dir).last().unwrap());
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&seg2)
            .unwrap();
        f.write_all(&[0u8; 64]).unwrap();
        drop(f);
        assert_eq!(SegmentWal::new(&dir).recover().await.unwrap().len(), 2);
    }

    /// Waits for the background thread's spare segment and for the thread to exit (a spare
    /// written late would land wherever the test is by then).
    async fn spare_ready(wal: &SegmentWal) {
        spare_threads_done(wal, || wal.dir.join(SPARE).exists()).await;
    }

    /// Waits (5 s at most) until no spare thread runs and `also` holds.
    async fn spare_threads_done(wal: &SegmentWal, also: impl Fn() -> bool) {
        for _ in 0..500 {
            if wal.spare_threads.load(Ordering::Acquire) == 0 && also() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the spare thread did not finish in {}", wal.dir.display());
    }

    fn segments(dir: &Path) -> Vec<String> {
        files(dir)
            .into_iter()
            .filter(|f| f.ends_with(SUFFIX))
            .collect()
    }

    #[tokio::test]
    async fn preallocated_segments_recover_exactly_what_was_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let seg_bytes = 64 * 1024;
        let wal = SegmentWal::with_segment_bytes(&dir, seg_bytes).with_preallocation(true);
        assert!(wal.recover().await.unwrap().is_empty());
        spare_ready(&wal).await;
        let mut written = Vec::new();
        for i in 0..40u64 {
            let recs = vec![rec(1, i, 1)];
            let p = wal.append(recs.clone()).await.unwrap();
            written.push((p, recs));
        }
        let segs = segments(&dir);
        assert_eq!(segs.len(), 1, "{segs:?}");
        // The segment is the spare renamed: full length, zeros after the frames.
        let path = dir.join(&segs[0]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), seg_bytes);
        assert_eq!(SegmentWal::new(&dir).recover().await.unwrap(), written);

        // A crash mid-append inside preallocated space: the last frame's end never landed.
        let data = std::fs::read(&path).unwrap();
        let end = data.iter().rposition(|b| *b != 0).unwrap();
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.seek(std::io::SeekFrom::Start(end as u64 - 5)).unwrap();
        f.write_all(&[0u8; 6]).unwrap();
        drop(f);
        let wal2 = SegmentWal::with_segment_bytes(&dir, seg_bytes).with_preallocation(true);
        let got = wal2.recover().await.unwrap();
        assert_eq!(got, written[..39]);
        // Appends continue at the torn position, in a new segment that supersedes it.
        spare_ready(&wal2).await;
        assert_eq!(wal2.append(vec![rec(2, 0, 1)]).await.unwrap(), 40);
        let got = SegmentWal::new(&dir).recover().await.unwrap();
        assert_eq!(got.len(), 40);
        assert_eq!(got[39], (40, vec![rec(2, 0, 1)]));
    }

    /// A WAL whose active segment is a recycled one, for [`recycled`].
    struct Recycled {
        wal: SegmentWal,
        /// The active segment, once a trimmed segment.
        path: PathBuf,
        /// Every entry the WAL holds (recovery must return exactly these).
        live: Vec<(u64, Vec<WalRecord>)>,
        /// How many of `live` (the last ones) are in `path`.
        in_recycled: usize,
        /// `path`'s bytes before this use: an earlier segment's frames.
        stale: Vec<u8>,
    }

    /// Preallocation on, segments of `seg_bytes`: fills segments until two closed, trims the
    /// first (it becomes the spare), then appends until the next segment starts in that file,
    /// and `n - 1` entries more, over its stale frames.
    async fn recycled(dir: &Path, seg_bytes: u64, n: usize) -> Recycled {
        let wal = SegmentWal::with_segment_bytes(dir, seg_bytes).with_preallocation(true);
        assert!(wal.recover().await.unwrap().is_empty());
        spare_ready(&wal).await;
        let mut live = Vec::new();
        let mut i = 0u64;
        let append = async |live: &mut Vec<(u64, Vec<WalRecord>)>, i: &mut u64, stream| {
            let recs = vec![rec(stream, *i, 3)];
            live.push((wal.append(recs.clone()).await.unwrap(), recs));
            *i += 1;
        };
        // The first segment takes the spare and asks for the next one: let that land first,
        // or zeros renamed into place late would replace the recycled segment below.
        append(&mut live, &mut i, 1).await;
        spare_ready(&wal).await;
        while segments(dir).len() < 2 {
            append(&mut live, &mut i, 1).await;
        }
        // The roll took the spare and, with a closed segment left to recycle, asked for no
        // more zeros: the trimmed segment becomes the spare.
        assert!(!dir.join(SPARE).exists(), "{:?}", files(dir));
        let closed_upto = live[live.len() - 2].0;
        let before = segments(dir);
        wal.trim(closed_upto).await.unwrap();
        let stale = std::fs::read(dir.join(SPARE)).unwrap();
        assert!(stale.len() as u64 >= seg_bytes);
        assert!(
            stale.iter().any(|b| *b != 0),
            "the spare is the old segment, not zeros"
        );
        assert!(!dir.join(&before[0]).exists());
        live.drain(..live.len() - 1);
        while segments(dir).len() < 2 {
            append(&mut live, &mut i, 2).await;
        }
        assert!(!dir.join(SPARE).exists(), "the spare became the segment");
        for _ in 1..n {
            append(&mut live, &mut i, 3).await;
        }
        let first = live[live.len() - n].0;
        let path = segment_path(dir, first);
        Recycled {
            wal,
            path,
            live,
            in_recycled: n,
            stale,
        }
    }

    #[tokio::test]
    async fn trimmed_segments_are_recycled_and_their_stale_frames_never_replay() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let seg_bytes = 4096;
        let r = recycled(&dir, seg_bytes, 5).await;
        // Same length as before: the new frames overwrote allocated blocks.
        assert_eq!(
            std::fs::metadata(&r.path).unwrap().len(),
            r.stale.len() as u64
        );
        assert_eq!(SegmentWal::new(&dir).recover().await.unwrap(), r.live);
        let next = r.live.last().unwrap().0 + 1;
        assert_eq!(r.wal.append(vec![rec(4, 0, 1)]).await.unwrap(), next);
        assert_eq!(
            SegmentWal::new(&dir).recover().await.unwrap().len(),
            r.live.len() + 1
        );
        // A recycled spare renamed into place before its first append holds only stale
        // frames: an empty segment.
        let only_stale = dir.join(segment_name(next + 1, rand::random()));
        std::fs::write(&only_stale, &r.stale).unwrap();
        assert!(scan(&only_stale).unwrap().is_empty());
    }

    /// A spare left by an earlier process may be a recycled segment whose frames hold positions
    /// the restarted WAL reaches again (an empty WAL restarts at 1): it must not be used.
    #[tokio::test]
    async fn a_spare_from_an_earlier_process_is_never_used() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        std::fs::create_dir_all(&dir).unwrap();
        let mut old = Vec::new();
        for pos in 1..=20u64 {
            old.extend(keyed_frame(pos, &[rec(7, pos, 1)], rand::random()));
        }
        std::fs::write(dir.join(SPARE), &old).unwrap();
        let wal = SegmentWal::with_segment_bytes(&dir, 1 << 20).with_preallocation(true);
        let mut written = Vec::new();
        for i in 0..3u64 {
            let recs = vec![rec(1, i, 1)];
            written.push((wal.append(recs.clone()).await.unwrap(), recs));
        }
        assert_eq!(written[0].0, 1);
        assert_eq!(SegmentWal::new(&dir).recover().await.unwrap(), written);
    }

    /// A crash right after a segment was started (before its first frame landed) leaves a
    /// segment without entries; with every earlier one trimmed, positions must still continue
    /// from its name, or entries written below it would be superseded by it at the next recovery.
    #[tokio::test]
    async fn positions_continue_from_a_segment_without_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(segment_name(50, 7)), vec![0u8; 4096]).unwrap();
        let wal = SegmentWal::new(&dir);
        assert!(wal.recover().await.unwrap().is_empty());
        assert_eq!(wal.append(vec![rec(1, 0, 1)]).await.unwrap(), 50);
        assert_eq!(wal.append(vec![rec(1, 1, 1)]).await.unwrap(), 51);
        let got = SegmentWal::new(&dir).recover().await.unwrap();
        assert_eq!(
            got,
            vec![(50, vec![rec(1, 0, 1)]), (51, vec![rec(1, 1, 1)])]
        );
    }

    #[tokio::test]
    async fn a_segment_started_without_a_spare_gives_way_to_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = SegmentWal::with_segment_bytes(&dir, 1 << 20).with_preallocation(true);
        // The first append comes before any spare exists: an empty segment.
        let _ = std::fs::create_dir_all(&dir);
        assert_eq!(wal.append(vec![rec(1, 0, 1)]).await.unwrap(), 1);
        spare_ready(&wal).await;
        assert_eq!(wal.append(vec![rec(1, 1, 1)]).await.unwrap(), 2);
        let segs = segments(&dir);
        assert_eq!(segs.len(), 2, "{segs:?}");
        assert_eq!(
            std::fs::metadata(dir.join(&segs[1])).unwrap().len(),
            1 << 20,
            "the second segment is the preallocated spare"
        );
        let got = SegmentWal::new(&dir).recover().await.unwrap();
        assert_eq!(got.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![1, 2]);
        // Trimming everything keeps the preallocated active segment (it has room), and appends
        // continue in it; the spare is not a segment.
        wal.trim(2).await.unwrap();
        assert_eq!(segments(&dir), segs[1..]);
        // The trimmed segment, sparse, did not become the spare.
        spare_threads_done(&wal, || true).await;
        if let Ok(m) = std::fs::metadata(dir.join(SPARE)) {
            assert_eq!(allocated(&m), m.len(), "a sparse segment was recycled");
        }
        assert_eq!(wal.append(vec![rec(1, 2, 1)]).await.unwrap(), 3);
        assert_eq!(segments(&dir), segs[1..]);
        // Recovery still sees the trimmed entries of that segment (the engine skips committed
        // records) and every later one.
        let got = SegmentWal::new(&dir).recover().await.unwrap();
        assert_eq!(got.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![2, 3]);
    }

    /// Writes `entries` entries, overwrites bytes of the first segment at `at`, recovers.
    async fn recover_damaged(entries: u64, at: u64, bytes: &[u8]) -> Result<usize, WalError> {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = SegmentWal::new(&dir);
        for i in 0..entries {
            wal.append(vec![rec(1, i, 1)]).await.unwrap();
        }
        let seg = dir.join(&segments(&dir)[0]);
        let mut f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        f.seek(std::io::SeekFrom::Start(SEGMENT_HEADER as u64 + at))
            .unwrap();
        f.write_all(bytes).unwrap();
        drop(f);
        SegmentWal::new(&dir).recover().await.map(|v| v.len())
    }

    #[tokio::test]
    async fn corruption_before_valid_data_fails_loudly() {
        let err = recover_damaged(2, 30, &[0xff]).await.unwrap_err();
        assert!(
            matches!(
                err,
                WalError::Lost {
                    from: 1,
                    to: Some(1),
                    ..
                }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_damaged_frame_length_is_corruption_not_a_torn_tail() {
        // The first frame's length now points past the end of the file.
        let err = recover_damaged(3, 0, &[0xff, 0xff, 0xff, 0x7f])
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                WalError::Lost {
                    from: 1,
                    to: Some(1),
                    ..
                }
            ),
            "{err}"
        );
    }

    /// Segment 1: position 1, then an attempt at 2 (records 9/9/9) abandoned after its write.
    fn write_segment_with_abandoned_attempt(dir: &Path) {
        write_segment(dir, 1, &[(1, vec![rec(1, 0, 1)]), (2, vec![rec(9, 9, 9)])]);
    }

    #[tokio::test]
    async fn a_later_segment_supersedes_an_abandoned_attempt() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        std::fs::create_dir_all(&dir).unwrap();
        // Segment 1 holds positions 1 and 2, but 2 was an attempt whose sync failed; the retry
        // (different records: the first attempt was failed back to its callers) started
        // segment 2.
        write_segment_with_abandoned_attempt(&dir);
        write_segment(&dir, 2, &[(2, vec![rec(1, 1, 1)])]);
        let wal = SegmentWal::new(&dir);
        assert_eq!(
            wal.recover().await.unwrap(),
            vec![(1, vec![rec(1, 0, 1)]), (2, vec![rec(1, 1, 1)])]
        );
        assert_eq!(wal.append(vec![rec(1, 2, 1)]).await.unwrap(), 3);
        wal.trim(2).await.unwrap();
        let left = segments(&dir);
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(parse_name(&left[0]).unwrap().0, 3, "{left:?}");
    }

    /// A segment abandoned at `q` may hold an attempt at `q`: recycled before the WAL is past
    /// `q`, that attempt would sit in the next segment (which starts at `q`) looking current.
    #[tokio::test]
    async fn an_abandoned_attempt_at_next_is_never_recycled() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        std::fs::create_dir_all(&dir).unwrap();
        // Position 2's attempt failed in segment 1; its retry created segment 2 and failed too.
        write_segment_with_abandoned_attempt(&dir);
        std::fs::write(dir.join(segment_name(2, 5)), b"").unwrap();
        let wal = SegmentWal::with_segment_bytes(&dir, 1).with_preallocation(true);
        assert_eq!(wal.recover().await.unwrap(), vec![(1, vec![rec(1, 0, 1)])]);
        spare_ready(&wal).await;
        std::fs::remove_file(dir.join(SPARE)).unwrap();
        wal.trim(1).await.unwrap();
        assert!(segments(&dir).is_empty(), "{:?}", files(&dir));
        // With no segment left the trim asks for zeros; once they are written, the spare must
        // be those zeros, not segment 1 or 2.
        spare_is_not_recycled(&wal).await;
    }

    /// Waits for the spare thread to exit; the spare, if any, must then be zeros.
    async fn spare_is_not_recycled(wal: &SegmentWal) {
        spare_threads_done(wal, || true).await;
        if let Ok(spare) = std::fs::read(wal.dir.join(SPARE)) {
            assert!(spare.iter().all(|b| *b == 0), "a segment was recycled");
        }
    }

    /// A record whose bytes are frames a client shaped to look like WAL data, keyed with keys
    /// the client guessed, at a position far above any the WAL reaches.
    fn forged(stream: u64, base: u64) -> WalRecord {
        let mut batch = keyed_frame(1 << 60, &[rec(66, 0, 1)], rand::random());
        batch.extend(keyed_frame(1 << 60, &[rec(66, 0, 1)], 0));
        WalRecord::new(stream, 3, base, 1, batch.into(), bytes::Bytes::new())
    }

    /// Recovery searches past a torn frame for valid data after it; the torn frame's own
    /// record bytes are not WAL data, whatever they look like.
    #[tokio::test]
    async fn record_bytes_shaped_like_frames_in_a_torn_frame_are_not_wal_data() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = SegmentWal::new(&dir);
        wal.append(vec![rec(1, 0, 1)]).await.unwrap();
        wal.append(vec![forged(1, 1)]).await.unwrap();
        let seg = segment_path(&dir, 1);
        let mut data = std::fs::read(&seg).unwrap();
        // A crash mid-append: the frame's last page did not land (its checksum fails), so
        // recovery searches the rest of the file for valid frames.
        let at = data_end(&data) - 1;
        data[at] ^= 0x40;
        std::fs::write(&seg, &data).unwrap();
        let got = SegmentWal::new(&dir).recover().await.unwrap();
        assert_eq!(got, vec![(1, vec![rec(1, 0, 1)])]);
    }

    /// A recycled segment holds the records of its earlier use after its own data; a clean
    /// restart must not read frames a client shaped into them as data after the end (which
    /// would fail recovery and keep the node from starting).
    #[tokio::test]
    async fn record_bytes_shaped_like_frames_in_a_recycled_segment_are_not_wal_data() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = SegmentWal::with_segment_bytes(&dir, 8192).with_preallocation(true);
        assert!(wal.recover().await.unwrap().is_empty());
        spare_ready(&wal).await;
        let mut live = Vec::new();
        let mut i = 0u64;
        let append = async |live: &mut Vec<(u64, Vec<WalRecord>)>, r: WalRecord| {
            live.push((wal.append(vec![r.clone()]).await.unwrap(), vec![r]));
        };
        append(&mut live, forged(1, i)).await;
        i += 1;
        spare_ready(&wal).await;
        while segments(&dir).len() < 2 {
            append(&mut live, forged(1, i)).await;
            i += 1;
        }
        let closed_upto = live[live.len() - 2].0;
        wal.trim(closed_upto).await.unwrap();
        let stale = std::fs::read(dir.join(SPARE)).unwrap();
        let marker = keyed_frame(1 << 60, &[rec(66, 0, 1)], 0);
        assert!(
            stale.windows(marker.len()).any(|w| w == marker),
            "the spare holds the forged records"
        );
        live.drain(..live.len() - 1);
        // Small entries: the recycled file's forged records stay after the new data.
        while segments(&dir).len() < 2 {
            append(&mut live, rec(2, i, 1)).await;
            i += 1;
        }
        assert!(!dir.join(SPARE).exists(), "the spare became the segment");
        append(&mut live, rec(2, i, 1)).await;
        assert_eq!(SegmentWal::new(&dir).recover().await.unwrap(), live);
    }

    /// Only the WAL's last frame can be torn by a crash: a closed segment whose last frames are
    /// damaged lost acknowledged entries, and recovery says so instead of dropping them.
    #[tokio::test]
    async fn a_closed_segment_that_ends_short_of_the_next_fails_loudly() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        // Tiny segments: every second entry rolls.
        let wal = SegmentWal::with_segment_bytes(&dir, 100);
        for i in 0..4u64 {
            wal.append(vec![rec(1, i, 1)]).await.unwrap();
        }
        assert!(segments(&dir).len() >= 2, "{:?}", files(&dir));
        assert_eq!(SegmentWal::new(&dir).recover().await.unwrap().len(), 4);
        let seg = segment_path(&dir, 1);
        let mut data = std::fs::read(&seg).unwrap();
        // The first segment's last entry checksum, damaged: it reads as a torn tail.
        let at = data_end(&data) - 1;
        data[at] ^= 0x40;
        std::fs::write(&seg, &data).unwrap();
        let err = SegmentWal::new(&dir).recover().await.unwrap_err();
        assert!(matches!(err, WalError::Lost { .. }), "{err}");
    }

    /// Appends `n` entries (one record each) and returns them.
    async fn fill(wal: &SegmentWal, n: u64) -> Vec<(u64, Vec<WalRecord>)> {
        let mut written = Vec::new();
        for i in 0..n {
            let recs = vec![rec(1, i, 1)];
            written.push((wal.append(recs.clone()).await.unwrap(), recs));
        }
        written
    }

    /// The error's file, lost range, and that its message names the file.
    fn lost_of(err: &WalError) -> (String, u64, Option<u64>) {
        match err {
            WalError::Lost { file, from, to, .. } => {
                assert!(err.to_string().contains(file.as_str()), "{err}");
                (file.clone(), *from, *to)
            }
            other => panic!("not a loss: {other}"),
        }
    }

    /// Acknowledged entries that were never uploaded, their newest segment deleted: the start
    /// is refused, naming the file, rather than giving their offsets out again.
    #[tokio::test]
    async fn a_deleted_newest_segment_is_refused_naming_it() {
        for seg_bytes in [1024, 1 << 20] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("wal");
            fill(&SegmentWal::with_segment_bytes(&dir, seg_bytes), 30).await;
            let newest = dir.join(segments(&dir).last().unwrap());
            let first = parse_name(&newest.file_name().unwrap().to_string_lossy())
                .unwrap()
                .0;
            std::fs::remove_file(&newest).unwrap();
            let err = SegmentWal::new(&dir).recover().await.unwrap_err();
            assert_eq!(
                lost_of(&err),
                (newest.display().to_string(), first, None),
                "{err}"
            );
            // Refused again on the next try: the refusal changed nothing on disk.
            assert!(SegmentWal::new(&dir).recover().await.is_err());
        }
    }

    #[tokio::test]
    async fn an_emptied_newest_segment_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        fill(&SegmentWal::with_segment_bytes(&dir, 1024), 30).await;
        let newest = dir.join(segments(&dir).last().unwrap());
        let first = parse_name(&newest.file_name().unwrap().to_string_lossy())
            .unwrap()
            .0;
        std::fs::File::create(&newest).unwrap();
        let err = SegmentWal::new(&dir).recover().await.unwrap_err();
        assert_eq!(
            lost_of(&err),
            (newest.display().to_string(), first, None),
            "{err}"
        );
        assert!(err.to_string().contains("no valid header"), "{err}");
    }

    /// A cut far behind the last frame is not a torn tail: the segment's length was fixed when
    /// it started, preallocated or not.
    #[tokio::test]
    async fn a_segment_cut_far_behind_its_last_frame_is_refused() {
        for preallocate in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("wal");
            let wal =
                SegmentWal::with_segment_bytes(&dir, 64 * 1024).with_preallocation(preallocate);
            assert!(wal.recover().await.unwrap().is_empty());
            if preallocate {
                spare_ready(&wal).await;
            }
            fill(&wal, 40).await;
            let segs = segments(&dir);
            assert_eq!(segs.len(), 1, "{segs:?}");
            let seg = dir.join(&segs[0]);
            let data = std::fs::read(&seg).unwrap();
            // Into the middle of frame 20 of 40.
            let mut at = SEGMENT_HEADER;
            for _ in 1..20 {
                let len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
                at += FRAME_HEADER + len;
            }
            let cut = at + 10;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&seg)
                .unwrap()
                .set_len(cut as u64)
                .unwrap();
            let err = SegmentWal::new(&dir).recover().await.unwrap_err();
            assert_eq!(
                lost_of(&err),
                (seg.display().to_string(), 20, None),
                "{err}"
            );
            assert!(
                err.to_string()
                    .contains(&format!("was cut to {cut} of its 65536 bytes")),
                "{err}"
            );
        }
    }

    /// Damage that loses only positions the trim watermark covers (committed to objects) costs
    /// nothing: the start goes on. The same damage above the watermark is refused.
    #[tokio::test]
    async fn damage_only_in_committed_frames_does_not_block_a_start() {
        for trimmed in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("wal");
            let wal = SegmentWal::with_segment_bytes(&dir, 64 * 1024).with_preallocation(true);
            assert!(wal.recover().await.unwrap().is_empty());
            spare_ready(&wal).await;
            let mut written = fill(&wal, 10).await;
            if trimmed {
                // Committed: the preallocated segment stays, and the trim records the watermark
                // in it (an empty entry) though nothing is appended after it.
                wal.trim(10).await.unwrap();
                written.push((11, Vec::new()));
            }
            let seg = dir.join(&segments(&dir)[0]);
            let mut data = std::fs::read(&seg).unwrap();
            let mut at = SEGMENT_HEADER;
            for _ in 1..5 {
                let len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
                at += FRAME_HEADER + len;
            }
            // Frame 5's entry checksum.
            let len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
            data[at + FRAME_HEADER + len - 1] ^= 0x40;
            std::fs::write(&seg, &data).unwrap();
            let got = SegmentWal::new(&dir).recover().await;
            if trimmed {
                written.remove(4);
                assert_eq!(got.unwrap(), written);
            } else {
                let err = got.unwrap_err();
                assert_eq!(lost_of(&err), (seg.display().to_string(), 5, Some(5)));
            }
        }
    }

    /// Trim removes segments front first, recording the watermark first: a front segment gone
    /// without a trim lost entries.
    #[tokio::test]
    async fn a_missing_oldest_segment_is_refused_unless_trimmed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = SegmentWal::with_segment_bytes(&dir, 1024);
        fill(&wal, 30).await;
        let segs = segments(&dir);
        assert!(segs.len() >= 3, "{segs:?}");
        let second = parse_name(&segs[1]).unwrap().0;
        // Trimmed: the start goes on with what is left.
        wal.trim(second - 1).await.unwrap();
        assert_eq!(segments(&dir), segs[1..]);
        let got = SegmentWal::new(&dir).recover().await.unwrap();
        assert_eq!(got.first().unwrap().0, second);
        // Deleted without a trim: refused.
        std::fs::remove_file(dir.join(&segs[1])).unwrap();
        let err = SegmentWal::new(&dir).recover().await.unwrap_err();
        let third = parse_name(&segs[2]).unwrap().0;
        assert_eq!(
            lost_of(&err),
            (
                dir.join(&segs[2]).display().to_string(),
                second,
                Some(third - 1)
            )
        );
    }

    /// Positions continue above the trim watermark after a restart, even with every segment
    /// trimmed: a position at or below it would read as committed.
    #[tokio::test]
    async fn positions_never_restart_at_or_below_the_trim_watermark() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let wal = SegmentWal::new(&dir);
        fill(&wal, 3).await;
        wal.trim(3).await.unwrap();
        assert!(segments(&dir).is_empty(), "{:?}", files(&dir));
        let wal = SegmentWal::new(&dir);
        assert!(wal.recover().await.unwrap().is_empty());
        assert_eq!(wal.append(vec![rec(1, 3, 1)]).await.unwrap(), 4);
    }

    /// A segment or manifest of a layout this build does not know is refused, naming the
    /// file and the version: never skipped as damage (docs/design/formats.md).
    #[tokio::test]
    async fn an_unknown_layout_version_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        std::fs::create_dir_all(&dir).unwrap();
        let seg = write_segment(&dir, 1, &[(1, vec![rec(1, 0, 1)])]);
        let mut data = std::fs::read(&seg).unwrap();
        data[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&data[..40]);
        data[40..44].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&seg, &data).unwrap();
        let err = SegmentWal::new(&dir).recover().await.unwrap_err();
        assert!(
            matches!(
                &err,
                WalError::Corrupt { key, source: format::FormatError::UnsupportedVersion(2) }
                    if *key == seg.display().to_string()
            ),
            "{err}"
        );
    }

    /// Names: `{first:020}-{key:016x}.wal` and nothing else (one layout).
    #[test]
    fn segment_names_parse_back() {
        let key = 0x0123_4567_89ab_cdef;
        assert_eq!(parse_name(&segment_name(42, key)), Some((42, key)));
        for bad in [
            format!("{:020}.wal", 42),
            format!("{:020}", 42),
            format!("{:020}-{:015x}.wal", 42, 1),
            format!("{:020}-0123456789ABCDEF.wal", 42),
            format!("{:020}-+123456789abcdef.wal", 42),
            format!("{:019}-{key:016x}.wal", 42),
            SPARE.to_string(),
            MANIFEST.to_string(),
        ] {
            assert_eq!(parse_name(&bad), None, "{bad}");
        }
    }

    /// A spare that cannot be written leaves no partial file behind to hold the disk.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_spare_leaves_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // Every write to /dev/full fails with ENOSPC, as on a full disk.
        std::os::unix::fs::symlink("/dev/full", dir.join(SPARE_TMP)).unwrap();
        let err = prepare_spare(dir, 4096).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull, "{err}");
        assert_eq!(files(dir), Vec::<String>::new());
    }

    mod damage {
        use super::*;
        use proptest::prelude::*;

        /// A WAL of `n` entries in one segment of 4 KiB, written through the WAL itself.
        fn segment(n: u64) -> (tempfile::TempDir, PathBuf, Vec<(u64, Vec<WalRecord>)>) {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("wal");
            let wal = SegmentWal::with_segment_bytes(&dir, 4096);
            let mut written = Vec::new();
            for i in 0..n {
                let recs = vec![rec(1 + i % 3, i, 1)];
                let p = block_on(wal.append(recs.clone())).unwrap();
                written.push((p, recs));
            }
            let seg = dir.join(&segments(&dir)[0]);
            (tmp, seg, written)
        }

        fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap()
                .block_on(f)
        }

        fn recover(seg: &Path) -> Result<Vec<(u64, Vec<WalRecord>)>, WalError> {
            block_on(SegmentWal::new(seg.parent().unwrap()).recover())
        }

        /// Where the last frame of a segment starts, walking the frame lengths from the header
        /// to the end marker.
        fn last_frame(data: &[u8]) -> usize {
            let mut start = SEGMENT_HEADER;
            loop {
                let len = u32::from_le_bytes(data[start..start + 4].try_into().unwrap()) as usize;
                let next = start + FRAME_HEADER + len;
                if data[next..next + END_MARKER.len()] == END_MARKER {
                    return start;
                }
                start = next;
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// A crash never shortens a segment (its length is fixed when it starts): any cut
            /// of the newest segment is refused, naming it, whatever it cut.
            #[test]
            fn any_cut_of_the_newest_segment_is_refused(n in 1u64..6, cut in 0.0f64..1.0) {
                let (_tmp, seg, _written) = segment(n);
                let len = std::fs::metadata(&seg).unwrap().len();
                let keep = (len as f64 * cut) as u64;
                std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(keep).unwrap();
                match recover(&seg) {
                    Err(WalError::Lost { file, to: None, .. }) => {
                        prop_assert_eq!(file, seg.display().to_string());
                    }
                    other => prop_assert!(false, "{:?}", other.map(|v| v.len())),
                }
            }

            /// A preallocated segment zeroed anywhere after its header, the file keeping its
            /// length: recovery returns exactly the whole frames before the zeros, never an
            /// error. That is what a torn last frame looks like, and zeros over more frames than
            /// the last cannot be told from it (docs/design/engine.md, "What recovery cannot
            /// detect").
            #[test]
            fn any_cut_into_preallocated_zeros_recovers_the_complete_prefix(
                n in 1u64..6,
                cut in 0.0f64..1.0,
            ) {
                let (_tmp, seg, written) = segment(n);
                let mut data = std::fs::read(&seg).unwrap();
                let len = data.len();
                let keep = SEGMENT_HEADER + ((len - SEGMENT_HEADER) as f64 * cut) as usize;
                data[keep..].fill(0);
                data.resize(len + 4096, 0);
                std::fs::write(&seg, &data).unwrap();
                let got = recover(&seg).unwrap();
                prop_assert!(got.len() <= written.len());
                prop_assert_eq!(&got[..], &written[..got.len()]);
            }

            /// Only the pages of the last frame that landed survive (power loss): any subset of
            /// its 8-byte-aligned pieces. Never an error, never a partial entry.
            #[test]
            fn last_frame_landing_in_pieces_is_a_torn_tail(
                n in 1u64..6,
                keep_mask in any::<u64>(),
            ) {
                let (_tmp, seg, written) = segment(n);
                let data = std::fs::read(&seg).unwrap();
                let start = last_frame(&data);
                let end = data_end(&data) + END_MARKER.len();
                let mut torn = data[..start].to_vec();
                torn.resize(data.len(), 0);
                for (j, chunk) in data[start..end].chunks(8).enumerate() {
                    if keep_mask >> (j % 64) & 1 == 1 {
                        let at = start + j * 8;
                        torn[at..at + chunk.len()].copy_from_slice(chunk);
                    }
                }
                std::fs::write(&seg, &torn).unwrap();
                let got = recover(&seg).unwrap();
                prop_assert!(got.len() + 1 >= written.len());
                prop_assert_eq!(&got[..], &written[..got.len()]);
            }

            /// A crash while the last frame goes into a recycled segment: any subset of its
            /// 8-byte pieces (and of the end marker after it) lands over the old frames. Never
            /// an error, never a stale or partial entry.
            #[test]
            fn a_frame_torn_over_stale_frames_is_a_torn_tail(
                n in 1usize..6,
                keep_mask in any::<u64>(),
            ) {
                let tmp = tempfile::tempdir().unwrap();
                let dir = tmp.path().join("wal");
                let r = block_on(recycled(&dir, 2048, n));
                let new = std::fs::read(&r.path).unwrap();
                // Where the last frame starts: skip the frames before it.
                let mut start = SEGMENT_HEADER;
                for _ in 1..n {
                    let len = u32::from_le_bytes(new[start..start + 4].try_into().unwrap()) as usize;
                    start += FRAME_HEADER + len;
                }
                let len = u32::from_le_bytes(new[start..start + 4].try_into().unwrap()) as usize;
                let end = start + FRAME_HEADER + len + END_MARKER.len();
                let mut torn = new.clone();
                for (j, at) in (start..end).step_by(8).enumerate() {
                    if keep_mask >> (j % 64) & 1 == 0 {
                        // This piece did not land: the old frames' bytes are still there.
                        let to = (at + 8).min(end);
                        torn[at..to].copy_from_slice(&r.stale[at..to]);
                    }
                }
                std::fs::write(&r.path, &torn).unwrap();
                let got = scan(&r.path).unwrap();
                let mine = &r.live[r.live.len() - r.in_recycled..];
                prop_assert!(got.len() + 1 >= n);
                prop_assert_eq!(&got[..], &mine[..got.len()]);
            }

            /// Any flipped byte costs at most the damaged last frame (what a crash may leave),
            /// or is refused as a loss; what is returned is always exactly what was written.
            #[test]
            fn any_flipped_byte_is_detected(n in 1u64..6, at in 0.0f64..1.0, bit in 0u8..8) {
                let (_tmp, seg, written) = segment(n);
                let mut data = std::fs::read(&seg).unwrap();
                let end = data_end(&data) + END_MARKER.len();
                let i = ((end as f64) * at) as usize % end;
                data[i] ^= 1 << bit;
                std::fs::write(&seg, &data).unwrap();
                match recover(&seg) {
                    Ok(got) => {
                        prop_assert!(got.len() + 1 >= written.len(), "only the last frame may go");
                        prop_assert_eq!(&got[..], &written[..got.len()]);
                    }
                    Err(e) => prop_assert!(
                        matches!(e, WalError::Lost { .. } | WalError::PositionMismatch { .. }),
                        "{e}"
                    ),
                }
            }
        }
    }
}
