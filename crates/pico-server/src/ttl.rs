//! Sliding TTL. Every read or write slides a stream's idle TTL; the last access is kept in memory
//! here and persisted through the metadata log in batches by the maintenance loop (a metadata write
//! per read would make reads cost a SQL commit). Only streams with a TTL that were touched since
//! the last persist are in the map, so it stays small.

use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
pub struct Touches {
    map: Mutex<HashMap<u64, i64>>,
}

impl Touches {
    pub fn touch(&self, stream_id: u64, now_ms: i64) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(stream_id).or_insert(now_ms);
        *e = (*e).max(now_ms);
    }

    pub fn get(&self, stream_id: u64) -> Option<i64> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&stream_id)
            .copied()
    }

    pub fn remove(&self, stream_id: u64) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&stream_id);
    }

    /// A copy of the pending touches.
    pub fn pending(&self) -> Vec<(u64, i64)> {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// Forgets a touch once persisted, unless it moved meanwhile.
    pub fn persisted(&self, stream_id: u64, at_ms: i64) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.get(&stream_id).is_some_and(|v| *v <= at_ms) {
            m.remove(&stream_id);
        }
    }
}
