//! s3stream: the stream storage engine of PicoMQ. Stream ids are plain `u64`, epochs `i64`,
//! offsets `u64`; the engine knows nothing of names, HTTP or SQL.
//!
//! - `storage`: `ObjectStorage` trait, `FileStorage` (crash-atomic files), `MemoryStorage`,
//!   `S3Storage` (any S3-compatible store).
//! - `wal`: the `Wal` trait (one shared WAL per node) and `ObjectWal` on object storage.
//! - `segment_wal`: `SegmentWal`, the WAL as append-only segment files on a local disk.
//! - `parts`: `Parts`, bytes as pieces for vectored writes (large batches never copied).
//! - `crc`: CRC32C of concatenations from their parts' CRCs (a batch is checksummed once).
//! - `format`: sans-IO codecs of WAL entries and data objects (framed, versioned, CRC32C).
//! - `engine`: `Engine` — append with group commit, log cache, uploader into stream-set and
//!   stream objects committed through the host's `Catalog`, block cache, recovery.
//! - `telemetry`: metric names and the timings recorded per WAL group and object put.
//! - `testing`: `MemCatalog`, `FaultWal`, `SlowStorage` and `FaultStorage` (errors, resets,
//!   lost answers, latency on any backend) test doubles, also for the host's tests.
//! - `testing_s3`: a fresh bucket on the test S3 server (`PICO_TEST_S3_ENDPOINT`), or a loud skip.
//!
//! Design and invariants: docs/design/engine.md.

pub mod crc;
pub mod engine;
pub mod format;
pub mod parts;
pub mod segment_format;
pub mod segment_wal;
pub mod storage;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(any(test, feature = "testing"))]
pub mod testing_s3;
pub mod wal;

pub use engine::{
    AppendRequest, Appended, Catalog, CatalogError, CommitRange, DurableHook, Engine, EngineConfig,
    EngineError, EngineStats, ObjectCommit, ObjectSlice, PendingAppend, RangeAux, RecoveryReport,
    SLICE_TARGET_BYTES, TryAppendError,
};
pub use format::StoredBatch;
pub use parts::Parts;
pub use segment_wal::SegmentWal;
pub use storage::{
    FileStorage, MemoryStorage, ObjectStorage, S3Config, S3ConfigError, S3Storage, StorageError,
};
pub use wal::{BlockingAppend, ObjectWal, Wal, WalError, WalRecord};
