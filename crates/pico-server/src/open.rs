//! Streams open on this node: the per-stream writer state that serializes the producer and
//! match-seq checks with offset assignment. Only streams with recent activity are here; idle ones
//! are released by the maintenance loop, so memory does not grow with the number of streams.

use crate::producers::ProducerState;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use tokio::sync::{Mutex, Notify, OnceCell};

/// One open stream.
pub struct OpenStream {
    pub stream_id: u64,
    pub epoch: i64,
    /// Held while checking and submitting an append (not while waiting for durability).
    pub writer: Mutex<Writer>,
    /// Last use (ms), for idle release.
    pub last_used_ms: AtomicI64,
    /// Signalled whenever a producer's state moves: appends that arrived ahead of their
    /// predecessors wait on it (bounded) instead of failing with a sequence gap.
    pub producers_moved: Notify,
}

/// Writer state: the in-flight view of producers and closure, ahead of the committed metadata.
pub struct Writer {
    pub producers: HashMap<String, ProducerState>,
    /// Closed by a client (appends rejected); `closed_by` is the producer claim that closed it.
    pub closed: bool,
    pub closed_by: Option<(String, u64, u64)>,
    /// Last accepted Durable Streams `Stream-Seq` (per stream, byte-wise lexicographic).
    pub stream_seq: Option<String>,
    /// An append failed to become durable: the stream must be reopened before more appends.
    pub broken: bool,
}

impl OpenStream {
    pub fn touch(&self, now_ms: i64) {
        self.last_used_ms.store(now_ms, Ordering::Relaxed);
    }
}

/// The table of open streams; a slot's `OnceCell` makes concurrent first requests share one open.
#[derive(Default)]
pub struct OpenTable {
    slots: std::sync::Mutex<HashMap<u64, Arc<OnceCell<Arc<OpenStream>>>>>,
}

impl OpenTable {
    pub fn slot(&self, stream_id: u64) -> Arc<OnceCell<Arc<OpenStream>>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.entry(stream_id).or_default().clone()
    }

    pub fn get(&self, stream_id: u64) -> Option<Arc<OpenStream>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.get(&stream_id).and_then(|c| c.get().cloned())
    }

    /// Removes the slot if it still holds exactly this open stream. Identity, not epoch: a slot
    /// whose open is still in progress belongs to someone else and must survive, or two opens
    /// of one stream could run at once.
    pub fn remove_open(&self, open: &Arc<OpenStream>) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots
            .get(&open.stream_id)
            .and_then(|c| c.get())
            .is_some_and(|o| Arc::ptr_eq(o, open))
        {
            slots.remove(&open.stream_id);
        }
    }

    /// Removes the slot if it is still this (uninitialised) cell: an open that failed because
    /// the stream is gone must not leave an empty slot behind.
    pub fn remove_cell(&self, stream_id: u64, cell: &Arc<OnceCell<Arc<OpenStream>>>) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots
            .get(&stream_id)
            .is_some_and(|c| Arc::ptr_eq(c, cell) && !c.initialized())
        {
            slots.remove(&stream_id);
        }
    }

    /// Drops the slot whatever it holds (the stream was deleted; a late open re-checks).
    pub fn remove_any(&self, stream_id: u64) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&stream_id);
    }

    /// Open streams not used since `before_ms`.
    pub fn idle(&self, before_ms: i64) -> Vec<Arc<OpenStream>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .values()
            .filter_map(|c| c.get())
            .filter(|o| o.last_used_ms.load(Ordering::Relaxed) < before_ms)
            .cloned()
            .collect()
    }

    pub fn all(&self) -> Vec<Arc<OpenStream>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.values().filter_map(|c| c.get()).cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
