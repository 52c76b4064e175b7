//! The applied metadata state and its queries; `apply` (the pure, deterministic transition) is
//! in `state/apply.rs`.
//!
//! Every map is an `im` persistent map, so `State::clone` is O(1): the log publishes a fresh
//! immutable view after each applied row without copying, and snapshots serialize a clone in the
//! background. No `HashMap` anywhere: iteration order is part of determinism (snapshots, replay).

mod apply;

use crate::command::{ForkOrigin, Initial, ProducerMark, StreamConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A registered node process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub node_id: u32,
    pub epoch: u64,
    pub address: String,
    pub registered_at_ms: i64,
    /// The node's own clock at its latest accepted heartbeat (at registration, its start).
    /// Liveness is judged by whether this changes, on the observer's clock (see
    /// docs/design/cluster.md), so clock skew between nodes does not matter.
    pub last_heartbeat_ms: i64,
    /// `Some(e)`: failover fenced this node's process at epoch `e` (`FenceNode`); `epoch` is
    /// then `e + 1`, an epoch no process holds, until the node registers again.
    pub fenced_epoch: Option<u64>,
}

impl NodeInfo {
    /// Whether `owner` is this node's fenced incarnation: its streams wait for failover to
    /// commit its WAL and release them, and nobody serves them meanwhile.
    pub fn fenced(&self, owner: &Owner) -> bool {
        owner.node_id == self.node_id && self.fenced_epoch == Some(owner.node_epoch)
    }
}

/// The node process that currently owns a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub node_id: u32,
    pub node_epoch: u64,
}

/// A committed range `[start_offset, end_offset)` of a stream, stored at `position..position+len`
/// of object `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    pub key: String,
    pub start_offset: u64,
    pub end_offset: u64,
    pub position: u64,
    pub len: u64,
}

/// Last committed (epoch, seq) of a producer on a stream, the offsets `[start_offset,
/// end_offset)` of that append, and when it was last committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerState {
    pub epoch: u64,
    pub seq: u64,
    pub start_offset: u64,
    pub end_offset: u64,
    /// `now_ms` of the commit that last moved it.
    pub last_ms: i64,
}

/// How long a producer's state outlives its last commit (the Durable Streams spec suggests a
/// 7-day TTL). Without it the map grows with every producer id a stream ever saw. A producer
/// silent for longer is unknown again: its next append must start at seq 0.
pub const PRODUCER_TTL_MS: i64 = 7 * 24 * 60 * 60 * 1000;

/// Maps smaller than this are never pruned (a pass would cost more than it frees).
pub const PRODUCER_PRUNE_MIN: usize = 64;

/// Whether a producer map that grew from `before` to `after` entries is due a prune pass: when
/// its size crosses a power of two from [`PRODUCER_PRUNE_MIN`] up. A pass is O(size), so this
/// keeps pruning O(1) amortised per new producer, and the map within twice the producers seen
/// in the last [`PRODUCER_TTL_MS`] (or the minimum).
pub fn producer_prune_due(before: usize, after: usize) -> bool {
    let bits = |n: usize| usize::BITS - n.leading_zeros();
    after >= PRODUCER_PRUNE_MIN && bits(after) > bits(before)
}

/// Whether producer `id`, last seen at `last_ms`, is still remembered at `now_ms`. Ids that
/// start with NUL are the server's own claims (no HTTP header can carry NUL, so no client can
/// send one): the claim a create's records are appended under is what makes a retried create
/// append them at most once, so it is never forgotten.
pub fn producer_live(id: &str, last_ms: i64, now_ms: i64) -> bool {
    id.starts_with('\0') || now_ms.saturating_sub(last_ms) < PRODUCER_TTL_MS
}

/// Producer state of one stream (see [`StreamMeta::producers`]).
pub type Producers = Arc<BTreeMap<String, ProducerState>>;

/// The producers of a stream that has none: one shared empty map, so an idle stream allocates
/// nothing for them (a first producer copies it through `Arc::make_mut`).
pub fn no_producers() -> Producers {
    static EMPTY: std::sync::LazyLock<Producers> = std::sync::LazyLock::new(Producers::default);
    EMPTY.clone()
}

/// An internal stream (the data side; the name lives in the registry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMeta {
    pub id: u64,
    /// The same allocation as the stream's registry key (one copy of each name in memory).
    pub name: Arc<str>,
    /// -1 = created, never opened; bumped by every open, never reset.
    pub epoch: i64,
    pub owner: Option<Owner>,
    /// First readable offset (trim point). May be ahead of `end_offset` (trimmed at the tail
    /// of data still in a WAL).
    pub start_offset: u64,
    /// End of committed (object-backed) data.
    pub end_offset: u64,
    pub deleted: bool,
    /// Ascending and contiguous; the last one ends at `end_offset`.
    pub slices: im::Vector<Slice>,
    /// Last accepted claim per producer. A plain map behind an `Arc` rather than an `im` map:
    /// an empty `im::OrdMap` allocates a full node (~3 KiB), which every idle stream would pay.
    pub producers: Producers,
    /// Last Durable Streams `Stream-Seq` committed with the data (forks start without one).
    /// Boxed: most streams never see one, and the 8 bytes saved keep the entry in a smaller
    /// allocator size class (see the size guard below).
    pub stream_seq: Option<Box<str>>,
}

impl StreamMeta {
    /// A stream just allocated (by a create, or a fork inheriting `slices` up to `end_offset`):
    /// never opened, no owner, no producers.
    fn never_opened(
        id: u64,
        name: Arc<str>,
        start_offset: u64,
        end_offset: u64,
        slices: im::Vector<Slice>,
    ) -> StreamMeta {
        StreamMeta {
            id,
            name,
            epoch: pico_common::ids::NEVER_OPENED,
            owner: None,
            start_offset,
            end_offset,
            deleted: false,
            slices,
            producers: no_producers(),
            stream_seq: None,
        }
    }
}

/// A name → stream entry with the client-visible config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryEntry {
    pub stream_id: u64,
    pub config: StreamConfig,
    pub created_at_ms: i64,
    pub closed: bool,
    /// Tail at close; `None` while open, and for a stream created closed until it is sealed.
    pub closed_at: Option<u64>,
    /// Boxed, like `fork`: rare, and every idle stream would pay for them inline.
    pub closed_by: Option<Box<ProducerMark>>,
    pub last_touch_ms: i64,
    /// Set when the stream was created as a fork.
    pub fork: Option<Box<ForkOrigin>>,
    /// Registry entries (live or soft-deleted) forked from this one.
    pub forks: u32,
    /// Deleted while forks still referenced it: the name is reserved, the data released.
    pub soft_deleted: bool,
    /// What the create (or fork) that made it carried besides its config.
    pub initial: Initial,
}

// Every stream, idle or not, holds one `Arc<StreamMeta>` and one `Arc<RegistryEntry>`, and the
// allocator rounds each up to its size class (jemalloc: 128, 160, 192, 224): a field that moves an
// entry past a boundary costs every stream the whole step. Rare fields are boxed for this reason,
// and content types are shared `Arc<str>`s (see `ContentTypes`).
// `examples/state_memory.rs` measures the state's bytes per stream.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<StreamMeta>() + 16 <= 192);
    assert!(size_of::<RegistryEntry>() + 16 <= 128);
};

/// A live transfer of a stream to another node (docs/design/transfer.md), keyed by stream id
/// in [`State::transfers`]. Any `OpenStream` of the stream ends it (the target opened it, or
/// the transfer was abandoned and someone reopened it), and so does deleting the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    pub to_node: u32,
    /// The owner when it was requested; `None`: nobody owned it, nothing to drain.
    pub from: Option<Owner>,
    /// The stream epoch when it was requested.
    pub epoch: i64,
    pub requested_ms: i64,
    /// When the source released the stream for `to_node` (its clock): from then on the
    /// record is a routing hint. `None` while the source drains.
    pub released_ms: Option<i64>,
}

impl Transfer {
    /// Whether the source still has to drain and release: requested, not released, and the
    /// stream still owned by the same process at the same epoch.
    pub fn pending_on(&self, meta: &StreamMeta) -> bool {
        self.released_ms.is_none()
            && self.from.is_some()
            && meta.owner == self.from
            && meta.epoch == self.epoch
    }
}

/// A committed object in storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    /// Number of slices (across all streams) that reference it.
    pub live_refs: u32,
    pub node_id: u32,
    pub committed_at_ms: i64,
}

/// The whole applied metadata state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// Number of commands applied (including rejected ones).
    pub applied_index: u64,
    pub next_stream_id: u64,
    pub nodes: im::OrdMap<u32, NodeInfo>,
    /// Deleted streams are removed once they own no slices.
    pub streams: im::OrdMap<u64, Arc<StreamMeta>>,
    /// Keyed by the same `Arc<str>` as each stream's `StreamMeta::name`.
    pub registry: im::OrdMap<Arc<str>, Arc<RegistryEntry>>,
    pub objects: im::OrdMap<String, ObjectMeta>,
    /// Objects with `live_refs == 0` awaiting GC.
    pub destroyed: im::OrdSet<String>,
    pub kv: im::OrdMap<String, Vec<u8>>,
    /// Transfers requested and not yet ended by an open of the stream (usually empty).
    pub transfers: im::OrdMap<u64, Transfer>,
    /// Content types shared by the registry's entries (a cache: not encoded, not compared).
    pub content_types: ContentTypes,
}

/// The content types streams were created with, so that entries share one allocation per
/// distinct type instead of holding a copy each (a deployment uses a handful; every idle stream
/// paid 16 B for its copy and 8 B more in its entry, which kept the entry a size class up).
/// Capped: past [`ContentTypes::MAX`] distinct types, new ones are kept unshared, so a client
/// inventing a type per stream cannot grow it. A cache rather than state: two states are equal
/// whatever it holds, and snapshots rebuild it as they load.
/// A map to itself because `im::OrdSet` cannot hand back the stored element.
#[derive(Clone, Default)]
pub struct ContentTypes(im::OrdMap<Arc<str>, Arc<str>>);

impl ContentTypes {
    pub const MAX: usize = 256;

    /// The shared copy of `ct` (remembering it while there is room).
    pub fn intern(&mut self, ct: &Arc<str>) -> Arc<str> {
        if let Some(shared) = self.0.get(ct) {
            return shared.clone();
        }
        if self.0.len() < Self::MAX {
            self.0.insert(ct.clone(), ct.clone());
        }
        ct.clone()
    }

    /// `config` with its content type shared.
    pub fn config(&mut self, config: &StreamConfig) -> StreamConfig {
        StreamConfig {
            content_type: self.intern(&config.content_type),
            ..config.clone()
        }
    }
}

impl PartialEq for ContentTypes {
    fn eq(&self, _: &ContentTypes) -> bool {
        true
    }
}

impl Eq for ContentTypes {}

impl std::fmt::Debug for ContentTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ContentTypes({})", self.0.len())
    }
}

impl Default for State {
    fn default() -> Self {
        State::new()
    }
}

impl State {
    /// Entries of every map and set: what a snapshot encodes, in O(1) (the persistent maps
    /// keep their sizes).
    pub fn entry_count(&self) -> u64 {
        (self.nodes.len()
            + self.streams.len()
            + self.registry.len()
            + self.objects.len()
            + self.destroyed.len()
            + self.kv.len()
            + self.transfers.len()) as u64
    }

    pub fn new() -> State {
        State {
            applied_index: 0,
            next_stream_id: 0,
            nodes: im::OrdMap::new(),
            streams: im::OrdMap::new(),
            registry: im::OrdMap::new(),
            objects: im::OrdMap::new(),
            destroyed: im::OrdSet::new(),
            kv: im::OrdMap::new(),
            transfers: im::OrdMap::new(),
            content_types: ContentTypes::default(),
        }
    }

    // ---- queries (views call these; no mutation) ----

    /// The registry entry and stream of a live stream name.
    pub fn stream_by_name(&self, name: &str) -> Option<(&RegistryEntry, &StreamMeta)> {
        let entry = self.registry.get(name).filter(|e| !e.soft_deleted)?;
        let meta = self.streams.get(&entry.stream_id)?;
        Some((entry, meta))
    }

    pub fn stream(&self, stream_id: u64) -> Option<&StreamMeta> {
        self.streams.get(&stream_id).map(Arc::as_ref)
    }

    pub fn node(&self, node_id: u32) -> Option<&NodeInfo> {
        self.nodes.get(&node_id)
    }

    /// Up to `max` slices covering offsets from `from_offset` on (the first one contains
    /// `from_offset` when it is committed), found by binary search.
    pub fn slices_from(&self, stream_id: u64, from_offset: u64, max: usize) -> Vec<Slice> {
        let Some(s) = self.streams.get(&stream_id) else {
            return Vec::new();
        };
        // First slice whose end is past `from_offset` (slices are sorted by end).
        let (mut lo, mut hi) = (0usize, s.slices.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if s.slices[mid].end_offset <= from_offset {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        // By index (O(log n) each): `iter().skip(lo)` steps through all `lo` slices before.
        (lo..s.slices.len())
            .take(max)
            .map(|i| s.slices[i].clone())
            .collect()
    }

    /// Registry entries whose name starts with `prefix`, in name order, strictly after
    /// `start_after` when given, at most `limit`.
    pub fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Vec<(&str, &RegistryEntry)> {
        use std::ops::Bound;
        let lower: Bound<&str> = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        self.registry
            .range::<_, str>((lower, Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix))
            .filter(|(_, e)| !e.soft_deleted)
            .take(limit)
            .map(|(name, e)| (&**name, e.as_ref()))
            .collect()
    }
}
