//! Shared fan-out for caught-up live subscribers (Pico SSE, DS SSE).
//!
//! Without it every subscriber of a stream, on every append, waits, reads, decodes and renders
//! the same records: 1000 subscribers cost 1000 reads and renderings per append. A [`Hub`] does
//! that once per stream: one task waits for the tail to move and reads the new records once
//! (values shared with the cache, not copied) into a [`Frame`]. Subscribers that would send the
//! same bytes form a group (same [`GroupKey`]: protocol, rendering, DS cursor, Pico limits);
//! the group's [`Encoder`] (the facade's) turns the frame into its wire bytes once, and the hub
//! pushes that one [`Delivery`] (shared, not copied) into each group member's bounded slot and
//! wakes only that member's waker. A subscriber's body then just pops ready bytes: no channel
//! receive, no rendering and no per-subscriber timer per event.
//!
//! The hub is only an accelerator: a subscriber that sees a delivery it cannot use (it lagged,
//! the frame starts elsewhere, the encoder left it to the subscriber, the hub ended) falls back
//! to its own reads and rejoins once caught up, so every irregular case (delete, re-create,
//! read errors) is decided by the ordinary read path. Hubs exist only while somebody
//! subscribes: the registry (one per [`Node`]) holds weak references, and the last
//! subscriber's drop stops the task and removes the entry.
//!
//! An HTTP/1.1 subscriber with nothing queued can lend its connection to the hub
//! ([`Subscription::lend`], a [`DirectOut`] from the runtime): its deliveries are then written
//! by the hub task straight to the socket as HTTP/1.1 chunks built once per group
//! ([`Delivery::chunked`]), with no wake and no body poll per subscriber. Anything the hub
//! cannot write that way (a frame that does not line up, a closed stream, a full connection) is
//! queued in the slot as usual, and the subscriber takes its connection back before sending it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use pico_common::StreamName;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::{LongPoll, payload_len};
use crate::api::{ReadFrom, ReadOutcome, ReadRecord, ReadRequest};
use crate::node::Node;

/// Deliveries one subscriber's slot holds. A subscriber further behind is marked lagged (its
/// slot emptied) and catches up with its own reads; this bounds a slot to this many
/// deliveries, each shared with the other subscribers of its group.
pub const CAPACITY: usize = 64;

/// Record bytes of one read the hub still holds for its subscribers; a larger read (a single
/// huge append) is left to each subscriber's own read, so the deliveries pin at most
/// `CAPACITY × SHARE_MAX` of values.
pub const SHARE_MAX: usize = 1024 * 1024;

/// Pause after a wake-up that found nothing to read (the view lags the durable tail): retry
/// shortly instead of spinning.
const EMPTY_WAKE_PAUSE: Duration = Duration::from_millis(20);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One read's worth of records, shared by every subscriber at `from`.
#[derive(Debug)]
pub struct Frame {
    /// Where the records start: only a subscriber whose next offset is this can use the frame.
    pub from: u64,
    pub next: u64,
    /// The read's records; empty when it had none (a bare close) or is `unshared`.
    pub records: Arc<[ReadRecord]>,
    /// Record bytes of the read (values, keys, headers).
    pub payload_len: usize,
    /// A read too large for the hub to hold (over [`SHARE_MAX`]): each subscriber reads it for
    /// itself.
    pub unshared: bool,
    pub up_to_date: bool,
    pub closed: bool,
    /// Renderings made by encoders, by kind, for the other groups of that kind (DS groups of
    /// one rendering differ only in their control event's cursor).
    rendered: Mutex<Vec<(&'static str, Bytes)>>,
}

impl Frame {
    /// This frame rendered as `kind`: made by `render` for the first group that asks, then
    /// shared. A facade uses it only for reads small enough to render at once.
    pub fn rendered(&self, kind: &'static str, render: impl FnOnce(&Frame) -> Bytes) -> Bytes {
        let mut cache = lock(&self.rendered);
        if let Some((_, b)) = cache.iter().find(|(k, _)| *k == kind) {
            return b.clone();
        }
        let b = render(self);
        cache.push((kind, b.clone()));
        b
    }
}

/// Which subscribers send the same bytes for a frame: same protocol and rendering (`kind`) and
/// the same parameters (a DS cursor, Pico limits). One encoding per group per frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupKey {
    pub kind: &'static str,
    pub params: [u64; 2],
}

/// A facade's encoding of a frame for one group of subscribers.
pub trait Encoder: Send + Sync + 'static {
    /// The bytes each subscriber of the group sends for `f`, in order; `None` when each must
    /// handle the frame itself (too large to render at once, not what its own read would
    /// return, or `unshared`).
    fn encode(&self, f: &Frame) -> Option<Vec<Bytes>>;
}

/// One frame as encoded for one group, shared by its members.
#[derive(Debug)]
pub struct Delivery {
    pub frame: Arc<Frame>,
    /// The group's bytes for the frame, or `None` (see [`Encoder::encode`]).
    pub parts: Option<Vec<Bytes>>,
    /// `parts` as HTTP/1.1 chunks, made for the first member whose connection is lent.
    chunked: OnceLock<Option<Bytes>>,
}

impl Delivery {
    pub fn new(frame: Arc<Frame>, parts: Option<Vec<Bytes>>) -> Delivery {
        Delivery {
            frame,
            parts,
            chunked: OnceLock::new(),
        }
    }

    /// The group's bytes as the HTTP/1.1 chunks hyper writes for them (each part one chunk,
    /// `{len:X}\r\n{part}\r\n`, empty parts skipped as hyper skips empty frames): built once per
    /// delivery, shared by every lent member of the group.
    pub fn chunked(&self) -> Option<&Bytes> {
        self.chunked
            .get_or_init(|| {
                let parts = self.parts.as_ref()?;
                let len = parts.iter().map(|p| p.len() + 20).sum();
                let mut out = Vec::with_capacity(len);
                for p in parts.iter().filter(|p| !p.is_empty()) {
                    out.extend_from_slice(format!("{:X}\r\n", p.len()).as_bytes());
                    out.extend_from_slice(p);
                    out.extend_from_slice(b"\r\n");
                }
                Some(Bytes::from(out))
            })
            .as_ref()
    }
}

/// A subscriber's HTTP/1.1 connection, lent to its hub while its response has nothing else to
/// send (implemented by the runtime). The connection keeps the bytes in order: those its
/// response body wrote before lending leave first, those written through it leave before
/// anything the body writes after taking it back.
pub trait DirectOut: Send + Sync + 'static {
    /// Lends the connection: `false` while bytes written through it earlier still wait to go
    /// out. Until the connection has written out what it buffered before, `send` refuses.
    fn lend(&self) -> bool;
    /// Writes `wire` (complete HTTP/1.1 chunks) after what was written before, now or, up to
    /// a bound, later from the connection's own task. `false`: nothing of it was taken (not
    /// lent yet, over the bound, or the socket failed).
    fn send(&self, wire: &Bytes) -> bool;
    /// Takes the connection back for the response body.
    fn reclaim(&self);
}

/// Put by a live response into its extensions; the listener fills it with the response's
/// connection when that is HTTP/1.1 (chunked), and the body lends it once caught up.
#[derive(Clone, Default)]
pub struct DirectOffer(Arc<OnceLock<Arc<dyn DirectOut>>>);

impl DirectOffer {
    pub fn fill(&self, out: Arc<dyn DirectOut>) {
        // Filled once per response; a second fill would be another connection's: ignored.
        let _ = self.0.set(out);
    }

    pub fn get(&self) -> Option<&Arc<dyn DirectOut>> {
        self.0.get()
    }
}

impl std::fmt::Debug for DirectOffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectOffer")
            .field("filled", &self.0.get().is_some())
            .finish()
    }
}

/// Where a subscriber stands after taking its connection back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaimed {
    /// Its next offset: past every delivery the hub wrote for it.
    pub next: u64,
    /// When the hub last wrote one for it (its keep-alive counts from there).
    pub last: Option<Instant>,
}

/// What a subscriber's slot yields.
#[derive(Debug)]
pub enum Event {
    Delivery(Arc<Delivery>),
    /// Deliveries were dropped because the slot was full: read for yourself. The slot takes
    /// deliveries again from this moment, so a read started after this sees all it missed.
    Lagged,
    /// The hub ended (close, delete, read error) after everything it delivered: read for
    /// yourself, and join a fresh hub once caught up.
    Ended,
}

#[derive(Default)]
struct SlotState {
    queue: VecDeque<Arc<Delivery>>,
    waker: Option<Waker>,
    lagged: bool,
    ended: bool,
    /// The subscriber's connection while lent to the hub.
    lent: Option<Lent>,
}

/// A connection lent to the hub and where its subscriber stands.
struct Lent {
    out: Arc<dyn DirectOut>,
    next: u64,
    last: Option<Instant>,
}

impl SlotState {
    /// Takes the connection back, if lent.
    fn reclaim(&mut self) -> Option<Reclaimed> {
        let l = self.lent.take()?;
        l.out.reclaim();
        Some(Reclaimed {
            next: l.next,
            last: l.last,
        })
    }
}

/// One subscriber's inbox, filled by the hub task.
#[derive(Default)]
struct Slot(Mutex<SlotState>);

impl Slot {
    /// Queues `d` (or marks the slot lagged when full); the waker to wake, if any, goes to
    /// `wake` so that waking happens after the hub's lock is released.
    fn push(&self, d: &Arc<Delivery>, now: &mut Option<Instant>, wake: &mut Vec<Waker>) {
        let mut s = lock(&self.0);
        if s.lagged {
            // Already told to read for itself: holding more would only pin memory.
            return;
        }
        // Lent: written straight to the connection when the subscriber would send exactly
        // this, in order (nothing queued before it); anything else is queued, which makes the
        // subscriber take its connection back.
        if let (true, Some(l)) = (s.queue.is_empty(), &mut s.lent) {
            let f = &d.frame;
            if f.next <= l.next && f.from != l.next && !f.closed {
                // Covered by the subscriber's own read (its `poll_follow` skips these too).
                return;
            }
            if f.from == l.next
                && !f.closed
                && let Some(wire) = d.chunked()
                && l.out.send(wire)
            {
                l.next = f.next;
                l.last = Some(*now.get_or_insert_with(Instant::now));
                return;
            }
        }
        if s.queue.len() >= CAPACITY {
            s.queue.clear();
            s.lagged = true;
        } else {
            s.queue.push_back(d.clone());
        }
        if let Some(w) = s.waker.take() {
            wake.push(w);
        }
    }

    fn end(&self, wake: &mut Vec<Waker>) {
        let mut s = lock(&self.0);
        s.ended = true;
        if let Some(w) = s.waker.take() {
            wake.push(w);
        }
    }
}

/// The registry of live hubs, keyed by stream id (an incarnation, not a name).
#[derive(Default)]
pub struct Hubs {
    map: Mutex<HashMap<u64, Entry>>,
    /// Tells hubs of one stream apart, so a dying hub never removes its successor's entry.
    generation: AtomicU64,
}

struct Entry {
    generation: u64,
    hub: Weak<Hub>,
}

struct Group {
    encoder: Arc<dyn Encoder>,
    slots: Vec<(u64, Arc<Slot>)>,
}

/// What the hub task and its subscribers share, under one lock: joining, leaving and
/// publishing are ordered by it.
struct State {
    groups: HashMap<GroupKey, Group>,
    /// Where the frames delivered so far end: a subscriber that joins behind it must read the
    /// gap, since it will not get those frames.
    published: u64,
    /// The task has ended: a new subscriber needs a new hub.
    ended: bool,
    next_id: u64,
    subscribers: usize,
}

/// A subscriber's share of a hub: its slot, in its group, while this lives.
pub struct Subscription {
    pub hub: Arc<Hub>,
    key: GroupKey,
    id: u64,
    slot: Arc<Slot>,
}

impl Subscription {
    /// The next event of this subscriber's slot; `Pending` registers `cx`'s waker, which only
    /// the hub task wakes (once per delivery batch).
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Event> {
        let mut s = lock(&self.slot.0);
        if let Some(d) = s.queue.pop_front() {
            return Poll::Ready(Event::Delivery(d));
        }
        if std::mem::take(&mut s.lagged) {
            return Poll::Ready(Event::Lagged);
        }
        if s.ended {
            return Poll::Ready(Event::Ended);
        }
        match &mut s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// [`Self::poll_next`] as a future.
    pub async fn next(&self) -> Event {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Lends `out` to the hub for this subscriber, whose next offset is `next`: from now on
    /// the hub writes its deliveries to the connection. `false` (nothing lent) when anything
    /// waits in the slot or the connection refuses.
    pub fn lend(&self, out: &Arc<dyn DirectOut>, next: u64) -> bool {
        let mut s = lock(&self.slot.0);
        if !s.queue.is_empty() || s.lagged || s.ended || s.lent.is_some() || !out.lend() {
            return false;
        }
        s.lent = Some(Lent {
            out: out.clone(),
            next,
            last: None,
        });
        true
    }

    /// While lent: `Ready` with the connection taken back once the slot holds something for
    /// the subscriber itself (a delivery not written for it, a lag, the hub's end); `Pending`
    /// registers `cx`'s waker.
    pub fn poll_lent(&self, cx: &mut Context<'_>) -> Poll<Option<Reclaimed>> {
        let mut s = lock(&self.slot.0);
        if s.queue.is_empty() && !s.lagged && !s.ended && s.lent.is_some() {
            match &mut s.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                w => *w = Some(cx.waker().clone()),
            }
            return Poll::Pending;
        }
        Poll::Ready(s.reclaim())
    }

    /// When the hub last wrote a delivery to the lent connection.
    pub fn last_sent(&self) -> Option<Instant> {
        lock(&self.slot.0).lent.as_ref().and_then(|l| l.last)
    }

    /// Takes the lent connection back (`None`: it was not lent).
    pub fn reclaim(&self) -> Option<Reclaimed> {
        lock(&self.slot.0).reclaim()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.reclaim();
        let mut st = lock(&self.hub.state);
        let State {
            groups,
            subscribers,
            ..
        } = &mut *st;
        if let Some(g) = groups.get_mut(&self.key) {
            if let Some(i) = g.slots.iter().position(|(id, _)| *id == self.id) {
                g.slots.swap_remove(i);
                *subscribers -= 1;
            }
            if g.slots.is_empty() {
                groups.remove(&self.key);
            }
        }
    }
}

pub struct Hub {
    hubs: Arc<Hubs>,
    stream_id: u64,
    generation: u64,
    state: Arc<Mutex<State>>,
    task: AbortHandle,
}

impl Hub {
    /// Where the frames delivered so far end; one that joins behind it must read the gap.
    pub fn published(&self) -> u64 {
        lock(&self.state).published
    }

    /// Subscribers of this hub (for tests and diagnostics).
    pub fn subscribers(&self) -> usize {
        lock(&self.state).subscribers
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.task.abort();
        let mut map = lock(&self.hubs.map);
        if map
            .get(&self.stream_id)
            .is_some_and(|e| e.generation == self.generation)
        {
            map.remove(&self.stream_id);
        }
        tracing::debug!(stream_id = self.stream_id, "live hub stopped");
    }
}

/// What a hub task needs to follow one stream.
struct Follow {
    node: Node,
    name: StreamName,
    stream_id: u64,
    /// The offset the first subscriber has reached; the hub publishes from here on.
    from: u64,
    /// How long one wait lasts before the hub re-checks that the stream still exists.
    poll: Duration,
}

impl Node {
    /// Joins the hub of stream `name` (incarnation `stream_id`) in group `key` (encoded by
    /// `encoder` if the group is new), starting a hub at `from` if there is none. Frames
    /// delivered before this call are not seen; the caller reconciles by offset
    /// ([`Hub::published`]).
    pub fn follow(
        &self,
        name: &StreamName,
        stream_id: u64,
        from: u64,
        key: GroupKey,
        encoder: impl FnOnce() -> Arc<dyn Encoder>,
    ) -> Subscription {
        self.hubs().subscribe(
            Follow {
                node: self.clone(),
                name: name.clone(),
                stream_id,
                from,
                poll: self.config().long_poll_timeout,
            },
            key,
            encoder,
        )
    }
}

/// Adds a slot in group `key` to `st`.
fn join(
    hub: Arc<Hub>,
    st: &mut State,
    key: GroupKey,
    encoder: impl FnOnce() -> Arc<dyn Encoder>,
) -> Subscription {
    let id = st.next_id;
    st.next_id += 1;
    st.subscribers += 1;
    let slot = Arc::new(Slot::default());
    st.groups
        .entry(key)
        .or_insert_with(|| Group {
            encoder: encoder(),
            slots: Vec::new(),
        })
        .slots
        .push((id, slot.clone()));
    Subscription { hub, key, id, slot }
}

impl Hubs {
    fn subscribe(
        self: &Arc<Self>,
        f: Follow,
        key: GroupKey,
        encoder: impl FnOnce() -> Arc<dyn Encoder>,
    ) -> Subscription {
        let mut map = lock(&self.map);
        // A hub whose task ended is replaced. It must be dropped only after the lock is
        // released: if it was the last reference, its drop takes this same lock.
        let ended = match map.get(&f.stream_id).and_then(|e| e.hub.upgrade()) {
            Some(hub) => {
                let mut st = lock(&hub.state);
                if !st.ended {
                    let sub = join(hub.clone(), &mut st, key, encoder);
                    drop(st);
                    return sub;
                }
                drop(st);
                Some(hub)
            }
            None => None,
        };
        let stream_id = f.stream_id;
        let state = Arc::new(Mutex::new(State {
            groups: HashMap::new(),
            published: f.from,
            ended: false,
            next_id: 0,
            subscribers: 0,
        }));
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        // The task starts only after the first slot is in: it cannot publish to nobody.
        let mut st = lock(&state);
        let task = tokio::spawn(run(f, state.clone())).abort_handle();
        let hub = Arc::new(Hub {
            hubs: self.clone(),
            stream_id,
            generation,
            state: state.clone(),
            task,
        });
        let sub = join(hub.clone(), &mut st, key, encoder);
        drop(st);
        map.insert(
            stream_id,
            Entry {
                generation,
                hub: Arc::downgrade(&hub),
            },
        );
        drop(map);
        drop(ended);
        tracing::debug!(stream_id, "live hub started");
        sub
    }

    /// Live hubs (for tests and diagnostics).
    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Subscribers of all live hubs (for tests and diagnostics).
    pub fn subscribers(&self) -> usize {
        let hubs: Vec<Arc<Hub>> = lock(&self.map)
            .values()
            .filter_map(|e| e.hub.upgrade())
            .collect();
        hubs.iter().map(|h| h.subscribers()).sum()
    }

    /// Subscribers whose connection is lent to their hub (for tests and diagnostics).
    pub fn lent(&self) -> usize {
        let hubs: Vec<Arc<Hub>> = lock(&self.map)
            .values()
            .filter_map(|e| e.hub.upgrade())
            .collect();
        let slots: Vec<Arc<Slot>> = hubs
            .iter()
            .flat_map(|h| {
                let st = lock(&h.state);
                let all: Vec<_> = st
                    .groups
                    .values()
                    .flat_map(|g| g.slots.iter())
                    .map(|(_, s)| s.clone())
                    .collect();
                all
            })
            .collect();
        slots.iter().filter(|s| lock(&s.0).lent.is_some()).count()
    }
}

/// Encodes `frame` once per group and hands it to every slot of the group (writing it to lent
/// connections); wakes the waiting subscribers. With `end`, then marks every slot ended.
///
/// The slots are filled after the hub's lock is released: a lent connection's write is a
/// syscall, and a subscriber joining or leaving must not wait behind a thousand of them. A
/// subscriber that joins meanwhile is not among them, but `published` already says it must
/// read this frame itself; one that leaves meanwhile took its connection back first.
fn publish(state: &Mutex<State>, frame: Frame, end: bool, wake: &mut Vec<Waker>) {
    let frame = Arc::new(frame);
    let mut st = lock(state);
    st.published = frame.next;
    let mut targets = Vec::with_capacity(st.subscribers);
    for g in st.groups.values() {
        let d = Arc::new(Delivery::new(frame.clone(), g.encoder.encode(&frame)));
        targets.extend(g.slots.iter().map(|(_, slot)| (d.clone(), slot.clone())));
    }
    drop(st);
    let mut now = None;
    for (d, slot) in &targets {
        slot.push(d, &mut now, wake);
    }
    if end {
        end_all(&mut lock(state), wake);
    }
    for w in wake.drain(..) {
        w.wake();
    }
}

fn end_all(st: &mut State, wake: &mut Vec<Waker>) {
    st.ended = true;
    for g in st.groups.values() {
        for (_, slot) in &g.slots {
            slot.end(wake);
        }
    }
}

/// Ends the hub for its subscribers, after what it delivered: they read for themselves.
fn end(state: &Mutex<State>) {
    let mut wake = Vec::new();
    end_all(&mut lock(state), &mut wake);
    for w in wake {
        w.wake();
    }
}

/// The hub task: wait for the tail, read once, publish.
async fn run(f: Follow, state: Arc<Mutex<State>>) {
    follow_stream(&f, &state).await;
    end(&state);
}

async fn follow_stream(f: &Follow, state: &Mutex<State>) {
    let mut last = f.from;
    let mut wake = Vec::new();
    let req = |from| ReadRequest {
        name: f.name.clone(),
        from: ReadFrom::Offset(from),
        max_records: None,
        max_bytes: None,
        touch: false,
    };
    loop {
        let mut out = match f.node.long_poll(req(last), f.poll).await {
            Ok(LongPoll::Data(out) | LongPoll::Closed(out)) => out,
            Ok(LongPoll::Timeout) => {
                // A wait follows the name, so after a delete and re-create it would wait on
                // the new incarnation forever: check that ours is still the one named.
                match f.node.head(&f.name).await {
                    Ok(info) if info.stream_id == f.stream_id => continue,
                    _ => return,
                }
            }
            Err(e) => {
                tracing::debug!(stream = %f.name, error = %e, "live hub read failed");
                return;
            }
        };
        // Publish everything available, one chunk-sized read at a time.
        loop {
            if out.info.stream_id != f.stream_id {
                return;
            }
            if out.records.is_empty() && !out.closed {
                tokio::time::sleep(EMPTY_WAKE_PAUSE).await;
                break;
            }
            let frame = frame_of(last, out);
            last = frame.next;
            let (up_to_date, closed) = (frame.up_to_date, frame.closed);
            publish(state, frame, closed, &mut wake);
            if closed {
                return;
            }
            if up_to_date {
                break;
            }
            out = match f.node.read(req(last)).await {
                Ok(out) => out,
                Err(e) => {
                    tracing::debug!(stream = %f.name, error = %e, "live hub read failed");
                    return;
                }
            };
        }
    }
}

fn frame_of(from: u64, out: ReadOutcome) -> Frame {
    let len = payload_len(&out.records);
    let unshared = len > SHARE_MAX;
    let records: Arc<[ReadRecord]> = if unshared {
        Arc::from(Vec::new())
    } else {
        Arc::from(out.records)
    };
    Frame {
        from,
        next: out.next_seq,
        records,
        payload_len: len,
        unshared,
        up_to_date: out.up_to_date,
        closed: out.closed,
        rendered: Mutex::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AppendRequest, CreateRequest};
    use crate::testing::start_test_node;
    use pico_protocol::Record;
    use std::sync::atomic::AtomicUsize;

    /// Encodes a frame as `from-next`, counting its calls.
    struct Count(Arc<AtomicUsize>);

    impl Encoder for Count {
        fn encode(&self, f: &Frame) -> Option<Vec<Bytes>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Some(vec![Bytes::from(format!("{}-{}", f.from, f.next))])
        }
    }

    fn key(kind: &'static str) -> GroupKey {
        GroupKey {
            kind,
            params: [0, 0],
        }
    }

    /// A hub with no task, fed by `publish` directly.
    async fn idle_hub() -> (Arc<Hubs>, Arc<Hub>) {
        let hubs = Arc::new(Hubs::default());
        let hub = Arc::new(Hub {
            hubs: hubs.clone(),
            stream_id: 1,
            generation: 0,
            state: Arc::new(Mutex::new(State {
                groups: HashMap::new(),
                published: 0,
                ended: false,
                next_id: 0,
                subscribers: 0,
            })),
            task: tokio::spawn(async {}).abort_handle(),
        });
        (hubs, hub)
    }

    fn sub(hub: &Arc<Hub>, k: GroupKey, calls: &Arc<AtomicUsize>) -> Subscription {
        let calls = calls.clone();
        join(hub.clone(), &mut lock(&hub.state), k, || {
            Arc::new(Count(calls)) as Arc<dyn Encoder>
        })
    }

    fn frame(from: u64, next: u64) -> Frame {
        Frame {
            from,
            next,
            records: Arc::from(Vec::new()),
            payload_len: 0,
            unshared: false,
            up_to_date: true,
            closed: false,
            rendered: Mutex::default(),
        }
    }

    /// The next event, which must be ready.
    fn ready(s: &Subscription) -> Event {
        let mut cx = Context::from_waker(Waker::noop());
        match s.poll_next(&mut cx) {
            Poll::Ready(e) => e,
            Poll::Pending => panic!("no event ready"),
        }
    }

    fn bytes_of(e: Event) -> (Arc<Delivery>, Bytes) {
        match e {
            Event::Delivery(d) => {
                let b = d.parts.as_ref().unwrap()[0].clone();
                (d, b)
            }
            other => panic!("{other:?}"),
        }
    }

    /// Many subscribers in two groups: each frame is encoded once per group, and every
    /// subscriber gets each frame once, in order, as its group's one shared delivery.
    #[tokio::test]
    async fn each_frame_is_encoded_once_per_group_and_reaches_every_subscriber_in_order() {
        let (_hubs, hub) = idle_hub().await;
        let calls = Arc::new(AtomicUsize::new(0));
        let subs: Vec<_> = (0..200)
            .map(|i| sub(&hub, key(if i % 2 == 0 { "a" } else { "b" }), &calls))
            .collect();
        assert_eq!(hub.subscribers(), 200);
        let mut wake = Vec::new();
        for i in 0..10 {
            publish(&hub.state, frame(i, i + 1), false, &mut wake);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2 * 10);
        assert_eq!(hub.published(), 10);
        let mut first: HashMap<&'static str, Arc<Delivery>> = HashMap::new();
        for (n, s) in subs.iter().enumerate() {
            for i in 0..10 {
                let (d, b) = bytes_of(ready(s));
                assert_eq!(b, Bytes::from(format!("{i}-{}", i + 1)));
                if i == 0 {
                    let g = if n % 2 == 0 { "a" } else { "b" };
                    let shared = first.entry(g).or_insert_with(|| d.clone());
                    assert!(Arc::ptr_eq(shared, &d), "one delivery per group");
                }
            }
            let mut cx = Context::from_waker(Waker::noop());
            assert!(s.poll_next(&mut cx).is_pending(), "each frame once");
        }
    }

    /// A subscriber that never reads holds at most `CAPACITY` deliveries, then none (it is
    /// told it lagged); the others get every frame; after `Lagged` it takes deliveries again;
    /// the hub's end comes after what was delivered.
    #[tokio::test]
    async fn a_slow_subscriber_stays_bounded_and_blocks_nobody() {
        let (_hubs, hub) = idle_hub().await;
        let calls = Arc::new(AtomicUsize::new(0));
        let slow = sub(&hub, key("a"), &calls);
        let fast = sub(&hub, key("a"), &calls);
        let mut wake = Vec::new();
        let n = 3 * CAPACITY as u64;
        for i in 0..n {
            publish(&hub.state, frame(i, i + 1), false, &mut wake);
            let (_, b) = bytes_of(ready(&fast));
            assert_eq!(b, Bytes::from(format!("{i}-{}", i + 1)));
            let held = lock(&slow.slot.0).queue.len();
            assert!(held <= CAPACITY, "{held}");
        }
        assert!(lock(&slow.slot.0).queue.is_empty());
        assert!(matches!(ready(&slow), Event::Lagged));
        publish(&hub.state, frame(n, n + 1), false, &mut wake);
        end(&hub.state);
        for s in [&slow, &fast] {
            let (_, b) = bytes_of(ready(s));
            assert_eq!(b, Bytes::from(format!("{n}-{}", n + 1)));
            assert!(matches!(ready(s), Event::Ended));
        }
    }

    /// A pending subscriber is woken by a delivery; a dropped one leaves its group (and the
    /// group goes with its last member).
    #[tokio::test]
    async fn wakes_the_waiting_and_forgets_the_gone() {
        let (_hubs, hub) = idle_hub().await;
        let calls = Arc::new(AtomicUsize::new(0));
        let a = sub(&hub, key("a"), &calls);
        let b = sub(&hub, key("b"), &calls);
        let waiting = tokio::spawn(async move {
            let e = a.next().await;
            (a, e)
        });
        // Until the task waits, a publish would find no waker: wait for it to register.
        while lock(&hub.state).groups[&key("a")].slots[0]
            .1
            .0
            .lock()
            .unwrap()
            .waker
            .is_none()
        {
            tokio::task::yield_now().await;
        }
        publish(&hub.state, frame(0, 1), false, &mut Vec::new());
        let (a, e) = waiting.await.unwrap();
        assert_eq!(bytes_of(e).1, Bytes::from("0-1"));
        drop(b);
        assert_eq!(hub.subscribers(), 1);
        assert!(!lock(&hub.state).groups.contains_key(&key("b")));
        publish(&hub.state, frame(1, 2), false, &mut Vec::new());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "no encoding for a gone group"
        );
        drop(a);
        assert_eq!(hub.subscribers(), 0);
        assert!(lock(&hub.state).groups.is_empty());
    }

    /// A connection that records what the hub wrote to it, and refuses while `refuse` is set.
    #[derive(Default)]
    struct Wire {
        written: Mutex<Vec<u8>>,
        refuse: std::sync::atomic::AtomicBool,
        reclaimed: AtomicUsize,
    }

    impl DirectOut for Wire {
        fn lend(&self) -> bool {
            true
        }

        fn send(&self, wire: &Bytes) -> bool {
            if self.refuse.load(Ordering::SeqCst) {
                return false;
            }
            lock(&self.written).extend_from_slice(wire);
            true
        }

        fn reclaim(&self) {
            self.reclaimed.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A lent subscriber's deliveries go to its connection as HTTP/1.1 chunks, without a
    /// wake; one already covered by its own read is dropped; one the connection refuses is
    /// queued, and the subscriber takes the connection back at the offset the hub reached.
    #[tokio::test]
    async fn a_lent_subscriber_is_written_directly_until_the_connection_refuses() {
        let (_hubs, hub) = idle_hub().await;
        let calls = Arc::new(AtomicUsize::new(0));
        let s = sub(&hub, key("a"), &calls);
        let wire = Arc::new(Wire::default());
        let out: Arc<dyn DirectOut> = wire.clone();
        assert!(s.lend(&out, 5));
        assert!(!s.lend(&out, 5), "lent once");
        let mut cx = Context::from_waker(Waker::noop());
        assert!(s.poll_lent(&mut cx).is_pending());
        let mut wake = Vec::new();
        publish(&hub.state, frame(5, 6), false, &mut wake);
        publish(&hub.state, frame(3, 4), false, &mut wake);
        publish(&hub.state, frame(6, 17), false, &mut wake);
        assert_eq!(&lock(&wire.written)[..], b"3\r\n5-6\r\n4\r\n6-17\r\n");
        assert!(s.poll_lent(&mut cx).is_pending(), "nothing queued");
        assert!(s.last_sent().is_some());
        wire.refuse.store(true, Ordering::SeqCst);
        publish(&hub.state, frame(17, 18), false, &mut wake);
        let back = match s.poll_lent(&mut cx) {
            Poll::Ready(Some(back)) => back,
            other => panic!("{other:?}"),
        };
        assert_eq!(back.next, 17);
        assert_eq!(wire.reclaimed.load(Ordering::SeqCst), 1);
        assert_eq!(bytes_of(ready(&s)).1, Bytes::from("17-18"));
        // Taken back: nothing more goes to the connection.
        wire.refuse.store(false, Ordering::SeqCst);
        publish(&hub.state, frame(18, 19), false, &mut wake);
        assert_eq!(bytes_of(ready(&s)).1, Bytes::from("18-19"));
        assert_eq!(lock(&wire.written).len(), 17);
    }

    /// Subscribers of one stream share one hub, get each append's records once with their
    /// offsets, and the hub goes with the last subscriber.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_hub_publishes_each_read_and_goes_with_its_last_subscriber() {
        let node = start_test_node().await;
        let name = StreamName::parse("hub").unwrap();
        let info = node
            .create(CreateRequest {
                name: name.clone(),
                config: Default::default(),
                initial: vec![],
            })
            .await
            .unwrap()
            .info;
        let calls = Arc::new(AtomicUsize::new(0));
        let enc = || Arc::new(Count(calls.clone())) as Arc<dyn Encoder>;
        let a = node.follow(&name, info.stream_id, 0, key("k"), enc);
        let b = node.follow(&name, info.stream_id, 0, key("k"), enc);
        assert!(Arc::ptr_eq(&a.hub, &b.hub));
        assert_eq!(node.hubs().len(), 1);
        assert_eq!(node.hubs().subscribers(), 2);
        node.append(AppendRequest {
            name: name.clone(),
            records: vec![Record::from_value("x"), Record::from_value("yz")],
            producer: None,
            match_seq: None,
            close: false,
            content_type: None,
        })
        .await
        .unwrap();
        let patience = Duration::from_secs(10);
        let (da, ba) = bytes_of(tokio::time::timeout(patience, a.next()).await.unwrap());
        let (db, _) = bytes_of(tokio::time::timeout(patience, b.next()).await.unwrap());
        assert!(Arc::ptr_eq(&da, &db));
        assert_eq!(ba, Bytes::from("0-2"));
        let fa = &da.frame;
        assert_eq!((fa.from, fa.next, fa.payload_len), (0, 2, 3));
        let got: Vec<_> = fa
            .records
            .iter()
            .map(|r| (r.offset, r.record.value.clone()))
            .collect();
        assert_eq!(got, [(0, Bytes::from("x")), (1, Bytes::from("yz"))]);
        assert!(fa.up_to_date && !fa.closed && !fa.unshared);
        assert_eq!(a.hub.published(), 2);
        let first = fa.rendered("k", |f| Bytes::from(format!("{}", f.next)));
        let again = fa.rendered("k", |_| unreachable!("rendered once per kind"));
        assert_eq!((first, again), (Bytes::from("2"), Bytes::from("2")));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        drop((a, b, da, db));
        assert!(node.hubs().is_empty());
    }
}
