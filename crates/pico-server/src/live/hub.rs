//! Shared fan-out for caught-up live subscribers (Pico SSE, DS SSE).
//!
//! Without it every subscriber of a stream, on every append, waits, reads and decodes the same
//! records: 1000 subscribers cost 1000 reads per append. A [`Hub`] does that once per stream:
//! one task waits for the tail to move, reads the new records and publishes them (values shared
//! with the cache, not copied) with their offsets as an `Arc<Frame>` through a bounded broadcast
//! channel. Each facade renders its own frames; a rendering made by one subscriber is kept on
//! the frame for the others of the same kind ([`Frame::rendered`]).
//!
//! The hub is only an accelerator: a subscriber that sees a frame it cannot use (it lagged, the
//! frame starts elsewhere, the hub ended) falls back to its own reads and rejoins once caught
//! up, so every irregular case (delete, re-create, read errors) is decided by the ordinary read
//! path. Hubs exist only while somebody subscribes: the registry (one per [`Node`]) holds weak
//! references, and the last subscriber's drop stops the task and removes the entry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use pico_common::StreamName;
use tokio::sync::broadcast;
use tokio::task::AbortHandle;

use super::{LongPoll, payload_len};
use crate::api::{ReadFrom, ReadOutcome, ReadRecord, ReadRequest};
use crate::node::Node;

/// Frames a hub buffers for slow subscribers. A subscriber further behind gets `Lagged` and
/// catches up with its own reads; this bounds a hub's memory to this many frames.
pub const CAPACITY: usize = 64;

/// Record bytes of one read the hub still holds for its subscribers; a larger read (a single
/// huge append) is left to each subscriber's own read, so the channel pins at most
/// `CAPACITY × SHARE_MAX` of values.
pub const SHARE_MAX: usize = 1024 * 1024;

/// Pause after a wake-up that found nothing to read (the view lags the durable tail): retry
/// shortly instead of spinning.
const EMPTY_WAKE_PAUSE: Duration = Duration::from_millis(20);

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
    /// Renderings made by subscribers, by kind, for the other subscribers of that kind.
    rendered: Mutex<Vec<(&'static str, Bytes)>>,
}

impl Frame {
    /// This frame rendered as `kind`: made by `render` for the first subscriber that asks, then
    /// shared. A facade uses it only for reads small enough to render at once.
    pub fn rendered(&self, kind: &'static str, render: impl FnOnce(&Frame) -> Bytes) -> Bytes {
        let mut cache = self.rendered.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, b)) = cache.iter().find(|(k, _)| *k == kind) {
            return b.clone();
        }
        let b = render(self);
        cache.push((kind, b.clone()));
        b
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

/// A subscriber's share of a hub: keep `hub` alive as long as `rx` is used.
pub struct Subscription {
    pub hub: Arc<Hub>,
    pub rx: broadcast::Receiver<Arc<Frame>>,
}

pub struct Hub {
    hubs: Arc<Hubs>,
    stream_id: u64,
    generation: u64,
    /// Weak, so the channel closes (subscribers see `Closed`) as soon as the task ends.
    tx: broadcast::WeakSender<Arc<Frame>>,
    /// The `next` of the last frame sent, stored before the send: a subscriber that joins
    /// after a send sees it here (the channel's lock orders the two), since it will not get
    /// the frame itself.
    published: Arc<AtomicU64>,
    task: AbortHandle,
}

impl Hub {
    /// Where the frames published so far end; one that joins behind it must read the gap.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::SeqCst)
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.task.abort();
        let mut map = self.hubs.map.lock().unwrap_or_else(|p| p.into_inner());
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
    /// Joins the hub of stream `name` (incarnation `stream_id`), starting one at `from` if there
    /// is none. Frames published before this call are not seen; the caller reconciles by offset
    /// ([`Hub::published`]).
    pub fn follow(&self, name: &StreamName, stream_id: u64, from: u64) -> Subscription {
        self.hubs().subscribe(Follow {
            node: self.clone(),
            name: name.clone(),
            stream_id,
            from,
            poll: self.config().long_poll_timeout,
        })
    }
}

impl Hubs {
    fn subscribe(self: &Arc<Self>, f: Follow) -> Subscription {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        // A hub whose task ended is replaced. It must be dropped only after the lock is
        // released: if it was the last reference, its drop takes this same lock.
        let ended = match map.get(&f.stream_id).and_then(|e| e.hub.upgrade()) {
            Some(hub) => match hub.tx.upgrade() {
                Some(tx) => {
                    let rx = tx.subscribe();
                    return Subscription { hub, rx };
                }
                None => Some(hub),
            },
            None => None,
        };
        let (tx, rx) = broadcast::channel(CAPACITY);
        let weak = tx.downgrade();
        let stream_id = f.stream_id;
        let published = Arc::new(AtomicU64::new(f.from));
        let task = tokio::spawn(run(f, tx, published.clone())).abort_handle();
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let hub = Arc::new(Hub {
            hubs: self.clone(),
            stream_id,
            generation,
            tx: weak,
            published,
            task,
        });
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
        Subscription { hub, rx }
    }

    /// Live hubs (for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Subscribers of all live hubs (for tests and diagnostics).
    pub fn subscribers(&self) -> usize {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.values()
            .filter_map(|e| e.hub.upgrade())
            .filter_map(|hub| hub.tx.upgrade())
            .map(|tx| tx.receiver_count())
            .sum()
    }
}

/// The hub task: wait for the tail, read once, publish. Returning drops the only sender, which
/// subscribers see as `Closed` (after the frames already sent) and answer by reading for
/// themselves.
async fn run(f: Follow, tx: broadcast::Sender<Arc<Frame>>, published: Arc<AtomicU64>) {
    let mut last = f.from;
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
            published.store(last, Ordering::SeqCst);
            // No receivers is not an error: the last subscriber is just leaving (and its
            // drop aborts this task).
            let _ = tx.send(Arc::new(frame));
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

    /// Subscribers of one stream share one hub, get each append's records once with their
    /// offsets, share a rendering by kind, and the hub goes with the last subscriber.
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
        let mut a = node.follow(&name, info.stream_id, 0);
        let mut b = node.follow(&name, info.stream_id, 0);
        assert!(Arc::ptr_eq(&a.hub, &b.hub));
        assert_eq!(node.hubs().len(), 1);
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
        let fa = tokio::time::timeout(patience, a.rx.recv())
            .await
            .unwrap()
            .unwrap();
        let fb = tokio::time::timeout(patience, b.rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(Arc::ptr_eq(&fa, &fb));
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
        let again = fb.rendered("k", |_| unreachable!("rendered once per kind"));
        assert_eq!((first, again), (Bytes::from("2"), Bytes::from("2")));
        drop((a, b, fa, fb));
        assert!(node.hubs().is_empty());
    }
}
