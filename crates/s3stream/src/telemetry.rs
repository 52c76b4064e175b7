//! Timings the engine reports through the `metrics` facade (a no-op until the host installs a
//! recorder; `pico serve` renders them at the admin listener's `/metrics`).
//!
//! Only latency and size distributions live here, recorded once per WAL group or object, never
//! per record. Totals the engine already counts ([`EngineStats`](crate::EngineStats)) are
//! exported by the host from those counters instead of being counted twice. Names carry no
//! per-stream labels, so the number of series is fixed however many streams there are.

use metrics::Histogram;

/// One group commit through the `Wal`, from the call to its return; only successful attempts
/// are recorded (failures are counted in `EngineStats::wal_write_failures`).
pub const WAL_COMMIT_SECONDS: &str = "pico_wal_commit_seconds";
/// Appends (batches, any streams) sharing one group commit.
pub const WAL_GROUP_APPENDS: &str = "pico_wal_group_appends";
/// Bytes of the records in one group commit.
pub const WAL_GROUP_BYTES: &str = "pico_wal_group_bytes";
/// Segment WAL: the vectored write of one frame (the page-cache copy).
pub const WAL_WRITE_SECONDS: &str = "pico_wal_write_seconds";
/// Segment WAL: the `fdatasync` after it, what makes the group durable.
pub const WAL_SYNC_SECONDS: &str = "pico_wal_sync_seconds";
/// One data object's put into object storage (file:// includes its fsyncs).
pub const OBJECT_PUT_SECONDS: &str = "pico_object_put_seconds";
/// Bytes of one data object put successfully.
pub const OBJECT_PUT_BYTES: &str = "pico_object_put_bytes";

/// Registers help texts and units with the installed recorder (call once, after installing it).
pub fn describe() {
    use metrics::{Unit, describe_histogram};
    describe_histogram!(
        WAL_COMMIT_SECONDS,
        Unit::Seconds,
        "One WAL group commit: write and sync of every append waiting, all streams."
    );
    describe_histogram!(
        WAL_GROUP_APPENDS,
        Unit::Count,
        "Appends sharing one WAL group commit."
    );
    describe_histogram!(
        WAL_GROUP_BYTES,
        Unit::Bytes,
        "Record bytes in one WAL group commit."
    );
    describe_histogram!(
        WAL_WRITE_SECONDS,
        Unit::Seconds,
        "Segment WAL: the vectored write of one group's frame."
    );
    describe_histogram!(
        WAL_SYNC_SECONDS,
        Unit::Seconds,
        "Segment WAL: the fdatasync that makes one group durable."
    );
    describe_histogram!(
        OBJECT_PUT_SECONDS,
        Unit::Seconds,
        "One data object's put into object storage."
    );
    describe_histogram!(
        OBJECT_PUT_BYTES,
        Unit::Bytes,
        "Bytes of one data object put into object storage."
    );
}

/// The segment WAL's handles, taken when the WAL is built: recording is then a push, not a
/// registry lookup. A recorder installed after that is not seen (`pico serve` installs it
/// first thing).
pub(crate) struct WalTimings {
    pub write: Histogram,
    pub sync: Histogram,
}

impl Default for WalTimings {
    fn default() -> Self {
        WalTimings {
            write: metrics::histogram!(WAL_WRITE_SECONDS),
            sync: metrics::histogram!(WAL_SYNC_SECONDS),
        }
    }
}

/// The engine's handles (writer and uploader), taken when the engine is built.
pub(crate) struct EngineTimings {
    pub commit: Histogram,
    pub group_appends: Histogram,
    pub group_bytes: Histogram,
    pub put_seconds: Histogram,
    pub put_bytes: Histogram,
}

impl Default for EngineTimings {
    fn default() -> Self {
        EngineTimings {
            commit: metrics::histogram!(WAL_COMMIT_SECONDS),
            group_appends: metrics::histogram!(WAL_GROUP_APPENDS),
            group_bytes: metrics::histogram!(WAL_GROUP_BYTES),
            put_seconds: metrics::histogram!(OBJECT_PUT_SECONDS),
            put_bytes: metrics::histogram!(OBJECT_PUT_BYTES),
        }
    }
}
