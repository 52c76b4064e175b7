//! Heap bytes and allocations the metadata state holds per idle stream.
//!
//! `cargo run --release -p pico-metadata --example state_memory -- [streams]` creates that many
//! streams (names like the bench's, `text/plain`) with the same commands the server applies and
//! prints what the state's heap grew by, per stream. Counted at the allocator (requested
//! sizes, so jemalloc's size-class rounding comes on top); see docs/performance.md.

use pico_metadata::{Command, State, StreamConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;

static BYTES: AtomicIsize = AtomicIsize::new(0);
static ALLOCS: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        BYTES.fetch_add(l.size() as isize, Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        BYTES.fetch_sub(l.size() as isize, Ordering::Relaxed);
        ALLOCS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        BYTES.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let mut state = State::new();
    let (b0, a0) = (
        BYTES.load(Ordering::Relaxed),
        ALLOCS.load(Ordering::Relaxed),
    );
    for i in 0..n {
        let cmd = Command::CreateStream {
            name: format!("/bench/s{i:07}"),
            config: StreamConfig {
                content_type: "text/plain".into(),
                ttl_secs: None,
                expires_at_ms: None,
            },
            closed: false,
            initial: Default::default(),
            now_ms: 1_700_000_000_000 + i as i64,
        };
        if let Err(e) = state.apply(&cmd) {
            eprintln!("create {i}: {e}");
            std::process::exit(1);
        }
    }
    let bytes = BYTES.load(Ordering::Relaxed) - b0;
    let allocs = ALLOCS.load(Ordering::Relaxed) - a0;
    println!(
        "{n} streams: {:.1} MiB, {:.0} B and {:.2} allocations per stream",
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / n as f64,
        allocs as f64 / n as f64
    );
    println!(
        "sizes: StreamMeta {} B, RegistryEntry {} B, Slice {} B",
        std::mem::size_of::<pico_metadata::StreamMeta>(),
        std::mem::size_of::<pico_metadata::RegistryEntry>(),
        std::mem::size_of::<pico_metadata::Slice>(),
    );
    drop(state);
}
