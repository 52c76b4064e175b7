//! Sliding TTL. Every read or write slides a stream's idle TTL; the last access is kept in memory
//! here and persisted through the metadata log in batches by the maintenance loop (a metadata write
//! per read would make reads cost a SQL commit). A touch is persisted once it moves the persisted
//! time by a quarter of the TTL ([`persist_after_ms`]); whether it does is decided when it
//! happens, so each pass handles only the touches that are due, not every stream touched within
//! its TTL (a million TTL streams would otherwise be rescanned every second).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// How far a touch must move a stream's persisted last access before it is persisted: a quarter
/// of the TTL (at least 1 ms). A crash loses at most that much sliding.
pub fn persist_after_ms(ttl_secs: u64) -> i64 {
    let ttl_ms = i64::try_from(ttl_secs.min(crate::node::MAX_TTL_SECS))
        .unwrap_or(i64::MAX / 1000)
        .saturating_mul(1000);
    (ttl_ms / 4).max(1)
}

#[derive(Default)]
struct State {
    /// Last access per touched TTL stream, not yet persisted.
    last: HashMap<u64, i64>,
    /// Streams whose touch is due for persisting.
    due: HashSet<u64>,
}

#[derive(Default)]
pub struct Touches {
    state: Mutex<State>,
}

impl Touches {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an access; `due` = it moved the persisted time by [`persist_after_ms`].
    pub fn touch(&self, stream_id: u64, now_ms: i64, due: bool) {
        let mut s = self.lock();
        let e = s.last.entry(stream_id).or_insert(now_ms);
        *e = (*e).max(now_ms);
        if due {
            s.due.insert(stream_id);
        }
    }

    pub fn get(&self, stream_id: u64) -> Option<i64> {
        self.lock().last.get(&stream_id).copied()
    }

    pub fn remove(&self, stream_id: u64) {
        let mut s = self.lock();
        s.last.remove(&stream_id);
        s.due.remove(&stream_id);
    }

    /// Takes the due touches (they are due again only if persisting them fails: [`Self::due`]).
    pub fn take_due(&self) -> Vec<(u64, i64)> {
        let mut s = self.lock();
        let due = std::mem::take(&mut s.due);
        due.into_iter()
            .filter_map(|id| s.last.get(&id).map(|at| (id, *at)))
            .collect()
    }

    /// Marks touches due again (persisting them failed).
    pub fn due(&self, ids: impl IntoIterator<Item = u64>) {
        let mut s = self.lock();
        for id in ids {
            if s.last.contains_key(&id) {
                s.due.insert(id);
            }
        }
    }

    /// A copy of every pending touch, due or not.
    pub fn pending(&self) -> Vec<(u64, i64)> {
        self.lock().last.iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// Forgets a touch once persisted, unless it moved meanwhile.
    pub fn persisted(&self, stream_id: u64, at_ms: i64) {
        let mut s = self.lock();
        if s.last.get(&stream_id).is_some_and(|v| *v <= at_ms) {
            s.last.remove(&stream_id);
            s.due.remove(&stream_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_due_touches_are_taken() {
        let t = Touches::default();
        for id in 0..1000 {
            t.touch(id, 5, false);
        }
        t.touch(7, 9, true);
        assert_eq!(t.take_due(), vec![(7, 9)]);
        assert!(t.take_due().is_empty(), "taken once");
        t.due([7, 5000]);
        assert_eq!(
            t.take_due(),
            vec![(7, 9)],
            "only known streams are due again"
        );
        t.persisted(7, 9);
        assert_eq!(t.get(7), None);
        assert_eq!(t.pending().len(), 999);
    }

    #[test]
    fn a_quarter_of_the_ttl() {
        assert_eq!(persist_after_ms(3600), 900_000);
        assert_eq!(persist_after_ms(0), 1);
        assert!(persist_after_ms(u64::MAX) > 0);
    }
}
