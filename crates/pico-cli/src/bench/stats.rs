//! Counters, HDR histograms and the final report (text or JSON).

use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Highest latency the histograms hold: 5 minutes in microseconds.
const MAX_US: u64 = 300_000_000;

pub fn histogram() -> Histogram<u64> {
    // Constant bounds that hdrhistogram accepts (low ≥ 1, high ≥ 2·low, 3 significant digits).
    #[allow(clippy::expect_used)]
    Histogram::new_with_bounds(1, MAX_US, 3).expect("constant histogram bounds are valid")
}

pub fn record(h: &mut Histogram<u64>, us: u64) {
    h.saturating_record(us.clamp(1, MAX_US));
}

/// One set of totals (counted on ack / on delivery).
#[derive(Default)]
struct Totals {
    write_records: AtomicU64,
    write_bytes: AtomicU64,
    write_requests: AtomicU64,
    write_errors: AtomicU64,
    write_abandoned: AtomicU64,
    write_unknown: AtomicU64,
    write_retries: AtomicU64,
    read_records: AtomicU64,
    read_bytes: AtomicU64,
    read_errors: AtomicU64,
}

impl Totals {
    fn snapshot(&self) -> Snapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            write_records: l(&self.write_records),
            write_bytes: l(&self.write_bytes),
            write_requests: l(&self.write_requests),
            write_errors: l(&self.write_errors),
            write_abandoned: l(&self.write_abandoned),
            write_unknown: l(&self.write_unknown),
            write_retries: l(&self.write_retries),
            read_records: l(&self.read_records),
            read_bytes: l(&self.read_bytes),
            read_errors: l(&self.read_errors),
        }
    }
}

/// Totals updated by every writer and reader: those of the measured window, for the report,
/// and those of the whole run, for the progress lines (so the warmup shows its traffic, and a
/// server that answers nothing shows as such before the measurement starts).
#[derive(Default)]
pub struct Counters {
    window: Totals,
    all: Totals,
    first_error: OnceLock<String>,
    /// Requests still unanswered when the run stopped, and the oldest one's age.
    unfinished: AtomicU64,
    unfinished_max_us: AtomicU64,
}

impl Counters {
    fn each(&self, in_window: bool, f: impl Fn(&Totals)) {
        f(&self.all);
        if in_window {
            f(&self.window);
        }
    }

    pub fn add_write(&self, records: u64, bytes: u64, in_window: bool) {
        self.each(in_window, |t| {
            t.write_records.fetch_add(records, Ordering::Relaxed);
            t.write_bytes.fetch_add(bytes, Ordering::Relaxed);
            t.write_requests.fetch_add(1, Ordering::Relaxed);
        });
    }

    pub fn add_read(&self, records: u64, bytes: u64, in_window: bool) {
        self.each(in_window, |t| {
            t.read_records.fetch_add(records, Ordering::Relaxed);
            t.read_bytes.fetch_add(bytes, Ordering::Relaxed);
        });
    }

    /// Counts an error; the first one is kept for the report and printed once.
    pub fn error(&self, write: bool, in_window: bool, msg: impl FnOnce() -> String) {
        self.each(in_window, |t| {
            let c = if write {
                &t.write_errors
            } else {
                &t.read_errors
            };
            c.fetch_add(1, Ordering::Relaxed);
        });
        if self.first_error.get().is_none() {
            let m = msg();
            if self.first_error.set(m.clone()).is_ok() {
                eprintln!("\nbench: first error: {m}");
            }
        }
    }

    /// Counts a producer batch abandoned after an earlier batch of its producer failed: not
    /// written, but not a failure of its own (that one is counted once, as an error).
    pub fn abandoned(&self, in_window: bool) {
        self.each(in_window, |t| {
            t.write_abandoned.fetch_add(1, Ordering::Relaxed);
        });
    }

    /// Counts a producer batch given up after an earlier batch of its producer failed, but
    /// sent before that (unanswered or answered 5xx): maybe written, so neither written nor
    /// abandoned.
    pub fn outcome_unknown(&self, in_window: bool) {
        self.each(in_window, |t| {
            t.write_unknown.fetch_add(1, Ordering::Relaxed);
        });
    }

    /// Counts a request still unanswered when the run stopped, `age_us` after it was sent.
    pub fn unfinished(&self, age_us: u64) {
        self.unfinished.fetch_add(1, Ordering::Relaxed);
        self.unfinished_max_us.fetch_max(age_us, Ordering::Relaxed);
    }

    /// Requests unanswered at the stop, and the oldest one's age in µs.
    pub fn unfinished_at_stop(&self) -> (u64, u64) {
        (
            self.unfinished.load(Ordering::Relaxed),
            self.unfinished_max_us.load(Ordering::Relaxed),
        )
    }

    /// Counts a transient failure a producer resent with the same sequence number (the batch
    /// may still be acknowledged: it is not among the errors).
    pub fn retried(&self, in_window: bool) {
        self.each(in_window, |t| {
            t.write_retries.fetch_add(1, Ordering::Relaxed);
        });
    }

    pub fn first_error(&self) -> Option<String> {
        self.first_error.get().cloned()
    }

    /// Totals of the measured window.
    pub fn snapshot(&self) -> Snapshot {
        self.window.snapshot()
    }

    /// Totals since the run began, warmup included.
    pub fn snapshot_all(&self) -> Snapshot {
        self.all.snapshot()
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub write_records: u64,
    pub write_bytes: u64,
    pub write_requests: u64,
    pub write_errors: u64,
    pub write_abandoned: u64,
    pub write_unknown: u64,
    pub write_retries: u64,
    pub read_records: u64,
    pub read_bytes: u64,
    pub read_errors: u64,
}

impl Snapshot {
    pub fn minus(&self, o: &Snapshot) -> Snapshot {
        Snapshot {
            write_records: self.write_records - o.write_records,
            write_bytes: self.write_bytes - o.write_bytes,
            write_requests: self.write_requests - o.write_requests,
            write_errors: self.write_errors - o.write_errors,
            write_abandoned: self.write_abandoned - o.write_abandoned,
            write_unknown: self.write_unknown - o.write_unknown,
            write_retries: self.write_retries - o.write_retries,
            read_records: self.read_records - o.read_records,
            read_bytes: self.read_bytes - o.read_bytes,
            read_errors: self.read_errors - o.read_errors,
        }
    }
}

/// Shards of the append→delivery histogram. Tailers record into a shared shard per delivery
/// rather than each keeping its own: a histogram of this range is ~150 KiB, and a thousand of
/// them turn every sample into a cache miss.
const E2E_SHARDS: usize = 16;

/// Write-ack histograms merged from the writers when they finish; delivery latencies recorded
/// as they happen.
pub struct Latencies {
    pub ack: Mutex<Histogram<u64>>,
    e2e: Vec<Mutex<Histogram<u64>>>,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            ack: Mutex::new(histogram()),
            e2e: (0..E2E_SHARDS).map(|_| Mutex::new(histogram())).collect(),
        }
    }
}

impl Latencies {
    /// Records one ack latency directly (the age of a request unanswered at the stop).
    pub fn record_ack(&self, us: u64) {
        record(&mut self.ack.lock().unwrap_or_else(|p| p.into_inner()), us);
    }

    pub fn merge_ack(&self, h: &Histogram<u64>) {
        let mut t = self.ack.lock().unwrap_or_else(|p| p.into_inner());
        // Same bounds everywhere, so adding cannot fail; a failure would only lose samples.
        let _ = t.add(h);
    }

    /// Records one delivery latency; `who` picks the shard (any number, e.g. the reader index).
    pub fn record_e2e(&self, who: usize, us: u64) {
        let mut h = self.e2e[who % E2E_SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        record(&mut h, us);
    }

    /// All delivery latencies so far.
    pub fn e2e(&self) -> Histogram<u64> {
        let mut all = histogram();
        for shard in &self.e2e {
            let _ = all.add(&*shard.lock().unwrap_or_else(|p| p.into_inner()));
        }
        all
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Option<Percentiles> {
        if h.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(Percentiles {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        })
    }

    fn line(&self) -> String {
        format!(
            "p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3} ms  (n={})",
            self.p50_ms, self.p90_ms, self.p99_ms, self.p999_ms, self.max_ms, self.count
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub mib_per_sec: f64,
    pub records_per_sec: f64,
    pub requests_per_sec: f64,
    pub records: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Producer batches not written because an earlier batch of the same producer failed
    /// (that failure is one of `errors`); always 0 for reads and plain appends.
    pub abandoned: u64,
    /// Producer batches given up after an earlier batch failed, but sent (unanswered or
    /// answered 5xx) before: they may have been written, so they are in neither `records` nor
    /// `abandoned`; always 0 for reads and plain appends.
    pub outcome_unknown: u64,
    /// Transient failures (transport errors, 500/502/503) producers resent with the same
    /// sequence number, whether or not the batch was acknowledged in the end; always 0 for
    /// reads and plain appends, which do not retry.
    pub retries: u64,
    /// Requests (producer batches) still unanswered when the run stopped, whenever they were
    /// sent before the window closed; each one's age is among the ack latencies. 0 for reads.
    pub unfinished: u64,
    /// The oldest of them: how long it had waited at the stop.
    pub unfinished_max_ms: f64,
}

impl Throughput {
    /// `unfinished`: [`Counters::unfinished_at_stop`].
    pub fn write(s: &Snapshot, secs: f64, unfinished: (u64, u64)) -> Throughput {
        Throughput {
            mib_per_sec: s.write_bytes as f64 / MIB / secs,
            records_per_sec: s.write_records as f64 / secs,
            requests_per_sec: s.write_requests as f64 / secs,
            records: s.write_records,
            bytes: s.write_bytes,
            errors: s.write_errors,
            abandoned: s.write_abandoned,
            outcome_unknown: s.write_unknown,
            retries: s.write_retries,
            unfinished: unfinished.0,
            unfinished_max_ms: unfinished.1 as f64 / 1000.0,
        }
    }

    pub fn read(s: &Snapshot, secs: f64) -> Throughput {
        Throughput {
            mib_per_sec: s.read_bytes as f64 / MIB / secs,
            records_per_sec: s.read_records as f64 / secs,
            requests_per_sec: 0.0,
            records: s.read_records,
            bytes: s.read_bytes,
            errors: s.read_errors,
            abandoned: 0,
            outcome_unknown: 0,
            retries: 0,
            unfinished: 0,
            unfinished_max_ms: 0.0,
        }
    }
}

pub const MIB: f64 = 1024.0 * 1024.0;

/// Everything `--output json` prints; the text form shows the same fields.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub protocol: &'static str,
    pub http: &'static str,
    pub endpoint: String,
    pub streams: usize,
    pub connections: usize,
    pub in_flight: usize,
    pub batch: usize,
    pub record_size: usize,
    pub producer: bool,
    pub readers: usize,
    pub read_mode: &'static str,
    pub target_mibps: Option<f64>,
    pub warmup_secs: f64,
    pub duration_secs: f64,
    pub setup_secs: f64,
    pub write: Throughput,
    pub write_latency: Option<Percentiles>,
    pub read: Option<Throughput>,
    pub e2e_latency: Option<Percentiles>,
    pub first_error: Option<String>,
    /// The bench's own CPU over warmup and measurement (it shares the machine): seconds, and
    /// the same as cores in use on average.
    pub client_cpu_secs: f64,
    pub client_cpu_cores: f64,
    /// The whole machine over the same span (absent where it cannot be read).
    pub machine: Option<super::machine::Load>,
}

impl Report {
    pub fn text(&self) -> String {
        let mut s = String::new();
        let mode = if self.producer {
            "idempotent producer"
        } else if self.protocol == "kafka" {
            "Produce requests"
        } else {
            "plain appends"
        };
        s.push_str(&format!(
            "pico bench: protocol {} over {}, {}\n  {} stream(s), {} connection(s) × {} in flight, batch {} × {} B, {}, {:.1}s measured after {:.1}s warmup (setup {:.1}s)\n",
            self.protocol,
            self.http,
            self.endpoint,
            self.streams,
            self.connections,
            self.in_flight,
            self.batch,
            self.record_size,
            mode,
            self.duration_secs,
            self.warmup_secs,
            self.setup_secs,
        ));
        if let Some(t) = self.target_mibps {
            s.push_str(&format!("  target rate {t} MiB/s\n"));
        }
        let w = &self.write;
        let mut producer_notes = String::new();
        if w.abandoned > 0 {
            producer_notes.push_str(&format!(", {} batches abandoned after them", w.abandoned));
        }
        if w.outcome_unknown > 0 {
            producer_notes.push_str(&format!(
                ", {} batches sent but given up after them (outcome unknown)",
                w.outcome_unknown
            ));
        }
        if w.retries > 0 {
            producer_notes.push_str(&format!(", {} transient failures retried", w.retries));
        }
        s.push_str(&format!(
            "write: {:.2} MiB/s  {:.0} records/s  {:.0} requests/s  ({} records, {} errors{producer_notes})\n",
            w.mib_per_sec, w.records_per_sec, w.requests_per_sec, w.records, w.errors
        ));
        if let Some(p) = &self.write_latency {
            s.push_str(&format!("  ack latency  {}\n", p.line()));
        }
        if w.unfinished > 0 {
            s.push_str(&format!(
                "  unfinished at stop: {} requests unanswered, oldest {:.3} ms (their ages are among the ack latencies)\n",
                w.unfinished, w.unfinished_max_ms
            ));
        }
        if let Some(r) = &self.read {
            s.push_str(&format!(
                "read ({} reader(s), {}): {:.2} MiB/s  {:.0} records/s  ({} records, {} errors)\n",
                self.readers, self.read_mode, r.mib_per_sec, r.records_per_sec, r.records, r.errors
            ));
            match &self.e2e_latency {
                Some(p) => s.push_str(&format!("  end-to-end   {}\n", p.line())),
                None => s.push_str("  end-to-end   no records delivered\n"),
            }
        }
        s.push_str(&format!(
            "client: {:.2} s of CPU, {:.2} cores (the bench itself, over warmup and measurement)\n",
            self.client_cpu_secs, self.client_cpu_cores
        ));
        if let Some(m) = &self.machine {
            s.push_str(&format!("{}\n", m.line()));
        }
        if let Some(e) = &self.first_error {
            s.push_str(&format!("first error: {e}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_counts_the_window_and_progress_the_whole_run() {
        let c = Counters::default();
        c.add_write(10, 1000, false); // warmup
        c.add_write(5, 500, true);
        c.add_read(3, 30, false);
        c.error(true, false, || "during warmup".into());
        c.error(false, true, || "measured".into());
        let w = c.snapshot();
        assert_eq!(
            (w.write_records, w.write_bytes, w.write_requests),
            (5, 500, 1)
        );
        assert_eq!((w.read_records, w.write_errors, w.read_errors), (0, 0, 1));
        let a = c.snapshot_all();
        assert_eq!(
            (a.write_records, a.write_bytes, a.write_requests),
            (15, 1500, 2)
        );
        assert_eq!((a.read_records, a.write_errors, a.read_errors), (3, 1, 1));
        assert_eq!(c.first_error().as_deref(), Some("during warmup"));
        c.abandoned(true);
        c.abandoned(false);
        assert_eq!(
            (
                c.snapshot().write_abandoned,
                c.snapshot_all().write_abandoned
            ),
            (1, 2)
        );
        assert_eq!(
            c.snapshot().write_errors,
            0,
            "an abandoned batch is not an error"
        );
        // Sent, then given up after an earlier failure: maybe written, so counted apart from
        // both the errors and the batches certainly not written.
        c.outcome_unknown(true);
        let w = c.snapshot();
        assert_eq!(
            (w.write_unknown, w.write_abandoned, w.write_errors),
            (1, 1, 0)
        );
        assert_eq!(Throughput::write(&w, 1.0, (0, 0)).outcome_unknown, 1);
        c.retried(true);
        c.retried(true);
        c.retried(false);
        assert_eq!(
            (c.snapshot().write_retries, c.snapshot_all().write_retries),
            (2, 3)
        );
    }

    #[test]
    fn percentiles_come_from_the_histogram() {
        let mut h = histogram();
        for us in 1..=1000 {
            record(&mut h, us * 10);
        }
        let p = Percentiles::of(&h).unwrap();
        assert_eq!(p.count, 1000);
        assert!((p.p50_ms - 5.0).abs() < 0.01, "{p:?}");
        assert!((p.p99_ms - 9.9).abs() < 0.02, "{p:?}");
        assert!((p.max_ms - 10.0).abs() < 0.01, "{p:?}");
        assert_eq!(Percentiles::of(&histogram()), None);
    }
}
