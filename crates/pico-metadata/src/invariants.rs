//! Invariants that `apply` maintains, checked beside the state they protect.
//!
//! `check` walks the whole state (O(total slices)): tests and debug tooling call it after
//! applying commands; `apply` itself enforces each rule at the point of change. Decoding a
//! snapshot runs the subset in `check_snapshot`.

use crate::state::State;
use std::collections::BTreeMap;

/// Checks every invariant; returns the first violation as a readable message.
pub fn check(s: &State) -> Result<(), String> {
    slices_contiguous(s)?;
    slices_end_at_end_offset(s)?;
    no_slice_below_start(s)?;
    stream_ids_allocated(s)?;
    registry_matches_streams(s)?;
    live_refs_count_slices(s)?;
    destroyed_is_unreferenced(s)?;
    owners_are_registered(s)?;
    fenced_nodes_hold_no_epoch(s)?;
    sealed_tail_holds(s)?;
    fork_counts_match(s)?;
    transfers_are_of_live_streams(s)?;
    Ok(())
}

/// The invariants a decoded snapshot must hold before it replaces the log: those whose breach
/// would make later commands destroy data (a reused stream id overwrites a live stream; an
/// undercounted `live_refs` lets GC delete an object a slice still reads). The rest of
/// [`check`] is left out for cost: with 300k streams it took about 0.25 s, 40 % of decoding,
/// mostly in the registry cross-check; these about 30 ms. Also: GC deletes every `destroyed`
/// key and the orphan pass every unknown one, so neither may be read by a slice.
pub fn check_snapshot(s: &State) -> Result<(), String> {
    stream_ids_allocated(s)?;
    live_refs_cover_slices(s)?;
    destroyed_is_unreferenced_only(s)
}

/// The half of [`destroyed_is_unreferenced`] whose breach loses data: GC deletes every key in
/// `destroyed`, so each must be a known object with no live reference.
fn destroyed_is_unreferenced_only(s: &State) -> Result<(), String> {
    for k in s.destroyed.iter() {
        match s.objects.get(k) {
            Some(o) if o.live_refs == 0 => {}
            _ => {
                return Err(format!(
                    "destroyed object is referenced or unknown: key={k}"
                ));
            }
        }
    }
    Ok(())
}

/// The part of [`live_refs_count_slices`] whose breach loses data: no object counts fewer live
/// references than the slices reading it. An overcount only keeps an object too long, and a
/// snapshot that an older version wrote with one must not stop the node from starting.
fn live_refs_cover_slices(s: &State) -> Result<(), String> {
    live_refs_against_slices(s, false)
}

/// 1. A stream's slices are non-empty ranges, ascending and contiguous (each starts where the
///    previous ends): a reader never finds a hole in committed data.
pub fn slices_contiguous(s: &State) -> Result<(), String> {
    for m in s.streams.values() {
        let mut prev_end: Option<u64> = None;
        for sl in m.slices.iter() {
            if sl.start_offset >= sl.end_offset {
                return Err(format!("empty slice: stream_id={} key={}", m.id, sl.key));
            }
            if prev_end.is_some_and(|e| e != sl.start_offset) {
                return Err(format!(
                    "slices not contiguous: stream_id={} at={}",
                    m.id, sl.start_offset
                ));
            }
            prev_end = Some(sl.end_offset);
        }
    }
    Ok(())
}

/// 2. The last slice ends at `end_offset`: commits append at the tail only.
pub fn slices_end_at_end_offset(s: &State) -> Result<(), String> {
    for m in s.streams.values() {
        if let Some(last) = m.slices.back()
            && last.end_offset != m.end_offset
        {
            return Err(format!(
                "last slice does not end at end_offset: stream_id={} slice_end={} end_offset={}",
                m.id, last.end_offset, m.end_offset
            ));
        }
    }
    Ok(())
}

/// 3. No slice lies wholly below `start_offset`: trimmed data holds no object reference.
pub fn no_slice_below_start(s: &State) -> Result<(), String> {
    for m in s.streams.values() {
        if let Some(first) = m.slices.front()
            && first.end_offset <= m.start_offset
        {
            return Err(format!(
                "slice below start_offset: stream_id={} key={}",
                m.id, first.key
            ));
        }
    }
    Ok(())
}

/// 4. Stream ids are allocated once: every id in use is below `next_stream_id`, so an id is
///    never reused (not even after delete).
pub fn stream_ids_allocated(s: &State) -> Result<(), String> {
    let max_stream = s.streams.keys().next_back().copied();
    let max_entry = s.registry.values().map(|e| e.stream_id).max();
    for id in [max_stream, max_entry].into_iter().flatten() {
        if id >= s.next_stream_id {
            return Err(format!(
                "stream id not allocated: id={id} next={}",
                s.next_stream_id
            ));
        }
    }
    Ok(())
}

/// 5. Registry and streams agree: each name points at a live stream carrying that name, and each
///    live stream is reachable from its name (no orphan ids: create does both in one command).
pub fn registry_matches_streams(s: &State) -> Result<(), String> {
    for (name, e) in s.registry.iter() {
        if e.soft_deleted {
            // Its data is released; only forks keep the name reserved.
            if e.forks == 0 || s.streams.contains_key(&e.stream_id) {
                return Err(format!(
                    "soft-deleted entry not held by forks: name=`{name}`"
                ));
            }
            continue;
        }
        match s.streams.get(&e.stream_id) {
            Some(m) if !m.deleted && &m.name == name => {}
            _ => return Err(format!("registry entry without live stream: name=`{name}`")),
        }
    }
    for m in s.streams.values().filter(|m| !m.deleted) {
        if s.registry.get(&m.name).map(|e| e.stream_id) != Some(m.id) {
            return Err(format!(
                "live stream without registry entry: stream_id={}",
                m.id
            ));
        }
    }
    Ok(())
}

/// 6. An object's `live_refs` equals the number of slices that reference it, and every slice
///    references a known object: GC never deletes an object a reader could need.
pub fn live_refs_count_slices(s: &State) -> Result<(), String> {
    live_refs_against_slices(s, true)
}

fn live_refs_against_slices(s: &State, exact: bool) -> Result<(), String> {
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for m in s.streams.values() {
        for sl in m.slices.iter() {
            *counts.entry(sl.key.as_str()).or_default() += 1;
        }
    }
    // An unknown object would be the orphan pass's to delete while a slice reads it.
    if let Some(k) = counts.keys().find(|k| !s.objects.contains_key(**k)) {
        return Err(format!("slice references unknown object: key={k}"));
    }
    for o in s.objects.values() {
        let n = counts.get(o.key.as_str()).copied().unwrap_or(0);
        if n > o.live_refs || (exact && n != o.live_refs) {
            return Err(format!(
                "live_refs mismatch: key={} live_refs={} slices={n}",
                o.key, o.live_refs
            ));
        }
    }
    Ok(())
}

/// 7. `destroyed` is exactly the set of known objects with no live reference.
pub fn destroyed_is_unreferenced(s: &State) -> Result<(), String> {
    destroyed_is_unreferenced_only(s)?;
    for o in s.objects.values() {
        if o.live_refs == 0 && !s.destroyed.contains(&o.key) {
            return Err(format!("unreferenced object not destroyed: key={}", o.key));
        }
    }
    Ok(())
}

/// 8. An owner is a registered node at an epoch no newer than its current one, and an owned
///    stream has been opened (epoch >= 0).
pub fn owners_are_registered(s: &State) -> Result<(), String> {
    for m in s.streams.values() {
        if let Some(o) = m.owner {
            match s.nodes.get(&o.node_id) {
                Some(n) if o.node_epoch <= n.epoch => {}
                _ => {
                    return Err(format!(
                        "owner not registered: stream_id={} node_id={}",
                        m.id, o.node_id
                    ));
                }
            }
            if m.epoch < 0 {
                return Err(format!("owned stream never opened: stream_id={}", m.id));
            }
        }
    }
    Ok(())
}

/// 8b. A fenced node's registered epoch is one above its fenced incarnation (no process can
///     hold it: registration needs a higher one), and nothing is owned at that epoch.
pub fn fenced_nodes_hold_no_epoch(s: &State) -> Result<(), String> {
    for n in s.nodes.values() {
        if let Some(e) = n.fenced_epoch
            && e.checked_add(1) != Some(n.epoch)
        {
            return Err(format!(
                "fenced node not one epoch above its fenced incarnation: node_id={} epoch={} fenced={e}",
                n.node_id, n.epoch
            ));
        }
    }
    for m in s.streams.values() {
        if let Some(o) = m.owner
            && s.nodes
                .get(&o.node_id)
                .is_some_and(|n| n.fenced_epoch.is_some() && o.node_epoch == n.epoch)
        {
            return Err(format!(
                "stream owned at a fenced node's placeholder epoch: stream_id={} node_id={}",
                m.id, o.node_id
            ));
        }
    }
    Ok(())
}

/// 9. A sealed stream has no committed data past its close point, and `closed_at` implies closed.
pub fn sealed_tail_holds(s: &State) -> Result<(), String> {
    for e in s.registry.values() {
        if let Some(at) = e.closed_at {
            if !e.closed {
                return Err(format!(
                    "closed_at set on open stream: stream_id={}",
                    e.stream_id
                ));
            }
            if let Some(m) = s.streams.get(&e.stream_id)
                && m.end_offset > at
            {
                return Err(format!(
                    "data past close point: stream_id={} closed_at={at} end_offset={}",
                    e.stream_id, m.end_offset
                ));
            }
        }
    }
    Ok(())
}

/// 10. A source's fork count equals the registry entries forked from it, so a soft-deleted
///     source is removed exactly when its last fork is gone (and never while one remains).
pub fn fork_counts_match(s: &State) -> Result<(), String> {
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for e in s.registry.values() {
        if let Some(f) = &e.fork
            && s.registry
                .get(f.source.as_str())
                .is_some_and(|src| src.stream_id == f.source_stream_id)
        {
            *counts.entry(f.source.as_str()).or_default() += 1;
        }
    }
    for (name, e) in s.registry.iter() {
        let n = counts.get(&**name).copied().unwrap_or(0);
        if e.forks != n {
            return Err(format!(
                "fork count mismatch: name=`{name}` forks={} referencing={n}",
                e.forks
            ));
        }
    }
    Ok(())
}

/// 11. A transfer names a stream that exists (opening or deleting the stream ends it), and a
///     released one a stream nobody owns: the release took the owner away, and the next open,
///     which would set one, ends the transfer. So the routing hint never contradicts an owner.
pub fn transfers_are_of_live_streams(s: &State) -> Result<(), String> {
    for (id, t) in s.transfers.iter() {
        let Some(m) = s.streams.get(id) else {
            return Err(format!("transfer of an unknown stream: stream_id={id}"));
        };
        if t.released_ms.is_some() && m.owner.is_some() {
            return Err(format!(
                "released transfer of an owned stream: stream_id={id}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Each invariant, broken on purpose, is detected; a healthy state passes.
    use super::*;
    use crate::command::{Command, CommitRange, StreamConfig};
    use crate::state::{Owner, Slice};
    use std::sync::Arc;

    fn healthy() -> State {
        let mut s = State::new();
        let cfg = StreamConfig {
            content_type: "t".into(),
            ttl_secs: None,
            expires_at_ms: None,
        };
        let cmds = [
            Command::RegisterNode {
                node_id: 1,
                node_epoch: 1,
                address: "x".into(),
                now_ms: 0,
            },
            Command::CreateStream {
                name: "a".into(),
                config: cfg,
                closed: false,
                initial: Default::default(),
                now_ms: 0,
            },
            Command::OpenStream {
                stream_id: 0,
                node_id: 1,
                node_epoch: 1,
            },
            Command::CommitObject {
                node_id: 1,
                node_epoch: 1,
                key: "k1".into(),
                size: 10,
                ranges: vec![CommitRange {
                    stream_id: 0,
                    epoch: 0,
                    start_offset: 0,
                    end_offset: 4,
                    position: 0,
                    len: 4,
                    producers: vec![],
                    stream_seq: None,
                }],
                now_ms: 0,
            },
            Command::CommitObject {
                node_id: 1,
                node_epoch: 1,
                key: "k2".into(),
                size: 10,
                ranges: vec![CommitRange {
                    stream_id: 0,
                    epoch: 0,
                    start_offset: 4,
                    end_offset: 6,
                    position: 0,
                    len: 2,
                    producers: vec![],
                    stream_seq: None,
                }],
                now_ms: 0,
            },
        ];
        for c in &cmds {
            s.apply(c).unwrap();
        }
        check(&s).unwrap();
        s
    }

    fn with_stream(s: &mut State, f: impl FnOnce(&mut crate::state::StreamMeta)) {
        f(Arc::make_mut(s.streams.get_mut(&0).unwrap()));
    }

    #[test]
    fn detects_gap_between_slices() {
        let mut s = healthy();
        with_stream(&mut s, |m| m.slices[1].start_offset = 5);
        assert!(slices_contiguous(&s).is_err());
    }

    #[test]
    fn detects_last_slice_not_at_end() {
        let mut s = healthy();
        with_stream(&mut s, |m| m.end_offset = 9);
        assert!(slices_end_at_end_offset(&s).is_err());
    }

    #[test]
    fn detects_slice_below_start() {
        let mut s = healthy();
        with_stream(&mut s, |m| m.start_offset = 4);
        assert!(no_slice_below_start(&s).is_err());
    }

    #[test]
    fn detects_unallocated_id() {
        let mut s = healthy();
        s.next_stream_id = 0;
        assert!(stream_ids_allocated(&s).is_err());
    }

    #[test]
    fn detects_orphans() {
        let mut s = healthy();
        s.registry.remove("a");
        assert!(registry_matches_streams(&s).is_err());
        let mut s = healthy();
        with_stream(&mut s, |m| m.name = "b".into());
        assert!(registry_matches_streams(&s).is_err());
    }

    #[test]
    fn detects_wrong_live_refs() {
        let mut s = healthy();
        s.objects.get_mut("k1").unwrap().live_refs = 2;
        assert!(live_refs_count_slices(&s).is_err());
        let mut s = healthy();
        with_stream(&mut s, |m| {
            m.slices.push_back(Slice {
                key: "nope".into(),
                start_offset: 6,
                end_offset: 7,
                position: 0,
                len: 1,
            })
        });
        assert!(live_refs_count_slices(&s).is_err());
    }

    #[test]
    fn detects_destroyed_mismatch() {
        let mut s = healthy();
        s.destroyed.insert("k1".into());
        assert!(destroyed_is_unreferenced(&s).is_err());
        let mut s = healthy();
        s.objects.get_mut("k1").unwrap().live_refs = 0;
        assert!(destroyed_is_unreferenced(&s).is_err());
    }

    #[test]
    fn detects_unregistered_owner() {
        let mut s = healthy();
        with_stream(&mut s, |m| {
            m.owner = Some(Owner {
                node_id: 7,
                node_epoch: 1,
            })
        });
        assert!(owners_are_registered(&s).is_err());
        let mut s = healthy();
        with_stream(&mut s, |m| m.epoch = -1);
        assert!(owners_are_registered(&s).is_err());
    }

    #[test]
    fn detects_data_past_close() {
        let mut s = healthy();
        let e = Arc::make_mut(s.registry.get_mut("a").unwrap());
        e.closed = true;
        e.closed_at = Some(5);
        assert!(sealed_tail_holds(&s).is_err());
        Arc::make_mut(s.registry.get_mut("a").unwrap()).closed_at = Some(6);
        assert!(sealed_tail_holds(&s).is_ok());
        Arc::make_mut(s.registry.get_mut("a").unwrap()).closed = false;
        assert!(sealed_tail_holds(&s).is_err());
    }
}
