//! The subscription driver: links and cursors, wake generations, webhook delivery with
//! retries, pull-wake claims, leases, and fencing. All subscriptions live in memory behind one
//! sync lock (a control plane: operations are rare next to appends), held only while a
//! transition decides: it reads tails from the node's in-memory view and the injected clock,
//! and queues its KV writes as one batch (`effects::Txn`). After the lock is released the caller
//! waits for the batch (every change is in the metadata KV, [`Store`], before the request that
//! caused it is answered), then starts deliveries (through a [`WebhookSender`]) and appends
//! wake events.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use pico_common::StreamName;
use pico_common::clock::{self, SharedClock};
use pico_protocol::Record as DataRecord;
use serde_json::{Value, json};
use tokio::sync::{OnceCell, Semaphore, broadcast};

use super::delivery::{Delivered, HttpSender, WebhookSender};
use super::effects::{Effects, Txn};
use super::error::SubError;
use super::model::{
    Config, Link, MAX_LINKS_PER_SUB, MAX_SUBSCRIPTIONS, Record, Status, StreamView, Sub, SubType,
    check_id,
};
use super::routed::{RoutedEvent, routed_cmd};
use super::signing::{Keys, TokenClaims};
use super::state::{self, DeliveryChange, Due};
use super::store::Store;
use super::wake::{WakeRequest, check_fence, check_kind, hex, webhook_body};
use crate::{AppendRequest, Node, StreamEvent, maintenance};

/// Concurrent webhook requests across all subscriptions.
const MAX_CONCURRENT_DELIVERIES: usize = 32;
/// How often leases and retry schedules are checked.
pub const TICK: Duration = Duration::from_millis(100);
/// Ticks between two prune slices (1 s): at most 1,000 links checked per second.
const PRUNE_EVERY_TICKS: u64 = 10;

/// Outcome of a create-or-confirm.
pub struct Upserted {
    pub created: bool,
    pub body: Value,
}

pub struct Manager {
    pub(super) node: Node,
    keys: OnceCell<Arc<Keys>>,
    /// Ordered so the link prune can resume where the last tick stopped. A sync lock, taken
    /// only for a transition: nothing is awaited while it is held (writes are queued in
    /// [`Store`]; waiting for them, events and deliveries come after it is released).
    subs: std::sync::Mutex<BTreeMap<String, Sub>>,
    /// Where the next link prune starts: (subscription id, last path checked). Only touched by
    /// the timer task while it holds `subs`.
    pub(super) prune_cursor: std::sync::Mutex<Option<(String, String)>>,
    /// Timer ticks so far (the link prune runs every `PRUNE_EVERY_TICKS`).
    ticks: std::sync::atomic::AtomicU64,
    pub(super) store: Store,
    sender: Arc<dyn WebhookSender>,
    clock: SharedClock,
    delivery_slots: Arc<Semaphore>,
    background: AtomicBool,
    /// This node delivers: it holds the maintenance lease and its memory was loaded from the
    /// log when it took it. Cleared when the lease is seen lost.
    active: AtomicBool,
    /// A takeover happened: the next timer pass rescans (wakes what the previous holder left).
    rescan_due: AtomicBool,
}

impl Manager {
    /// Whether loopback webhook URLs are accepted (the node is bound to loopback).
    pub fn allow_local_webhooks(&self) -> bool {
        self.node.config().allow_local_webhooks
    }

    /// A manager on the system clock, delivering over HTTP.
    pub fn new(node: Node) -> Manager {
        Manager::with(node, clock::system(), Arc::new(HttpSender::new()))
    }

    /// A manager with its clock and webhook sender chosen (tests drive a manual clock).
    pub fn with(node: Node, clock: SharedClock, sender: Arc<dyn WebhookSender>) -> Manager {
        Manager {
            store: Store::new(node.clone()),
            node,
            keys: OnceCell::new(),
            subs: std::sync::Mutex::new(BTreeMap::new()),
            prune_cursor: std::sync::Mutex::new(None),
            ticks: std::sync::atomic::AtomicU64::new(0),
            sender,
            clock,
            delivery_slots: Arc::new(Semaphore::new(MAX_CONCURRENT_DELIVERIES)),
            background: AtomicBool::new(false),
            active: AtomicBool::new(false),
            rescan_due: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Sub>> {
        self.subs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a transition: the state lock and an empty set of effects.
    fn begin(&self) -> Txn<'_> {
        Txn::new(self.lock(), &self.store)
    }

    /// Loads (or creates) the signing key, once. Subscriptions are loaded when this node
    /// starts delivering ([`Manager::delivering`]).
    pub async fn ready(&self) -> Result<&Arc<Keys>, SubError> {
        self.keys
            .get_or_try_init(|| async { Ok(Arc::new(self.load_keys().await?)) })
            .await
    }

    /// Whether this node changes and delivers subscriptions now: only the maintenance-lease
    /// holder does, so a cluster delivers each wake from one node, and the next holder takes
    /// over when it dies. Taking over reloads every subscription from the metadata log (the
    /// previous holder changed them; this node's memory is stale) and schedules a rescan.
    async fn delivering(&self) -> bool {
        if !maintenance::held_now(&self.node).await {
            if self.active.swap(false, Ordering::AcqRel) {
                tracing::info!("maintenance lease lost: subscription delivery stops here");
                self.node.inner.events.want(false);
            }
            return false;
        }
        if !self.active.load(Ordering::Acquire) {
            let mut subs = self.lock();
            // Checked again under the lock: one reload per takeover.
            if !self.active.load(Ordering::Acquire) {
                *subs = self.store.load();
                // Before the rescan reads the tails (`events`).
                self.track(&subs);
                tracing::info!(
                    subscriptions = subs.len(),
                    "durable streams subscriptions loaded: this node delivers them"
                );
                self.active.store(true, Ordering::Release);
                self.rescan_due.store(true, Ordering::Release);
            }
        }
        true
    }

    /// Appends send events while this node delivers some subscription (see `events`). Called
    /// with the state lock held, so concurrent changes set the flag in the order they happened.
    fn track(&self, subs: &BTreeMap<String, Sub>) {
        self.node.inner.events.want(!subs.is_empty());
    }

    /// [`Manager::delivering`] for a request that changes a subscription: elsewhere, it names
    /// the node to ask instead.
    async fn here(&self) -> Result<(), SubError> {
        if self.delivering().await {
            return Ok(());
        }
        Err(SubError::NotHere {
            holder: maintenance::holder_url(&self.node).await,
        })
    }

    /// Where requests changing subscriptions are served: `Ok` here, else the holder's URL
    /// (`None` while the lease moves). Facades redirect to it.
    pub async fn home(&self) -> Result<(), Option<String>> {
        match self.here().await {
            Ok(()) => Ok(()),
            Err(SubError::NotHere { holder }) => Err(holder),
            Err(_) => Err(None),
        }
    }

    async fn load_keys(&self) -> Result<Keys, SubError> {
        if let Some(seed) = self.store.seed() {
            return Ok(Keys::from_seed(seed));
        }
        let (_, seed) = Keys::generate();
        // Whatever the log holds is the key every node signs with.
        Ok(Keys::from_seed(self.store.init_seed(seed).await?))
    }

    /// Base for callback URLs when a request carries no Host.
    pub fn advertised_url(&self) -> String {
        self.node.config().advertised_url.clone()
    }

    /// The signing keys, for JWKS and signatures.
    pub async fn keys(&self) -> Result<Arc<Keys>, SubError> {
        self.ready().await.cloned()
    }

    /// Carries out what a transition decided, in order: writes (the first failure is the
    /// answer), then deliveries and wake events.
    async fn settle(self: &Arc<Self>, fx: Effects) -> Result<(), SubError> {
        let result = match fx.written {
            Some(receipt) => receipt.wait().await,
            None => Ok(()),
        };
        for (id, wake_id) in fx.deliveries {
            let this = self.clone();
            tokio::spawn(async move { this.deliver(id, wake_id).await });
        }
        // The lease may have moved to a newer process of this node id (which the clock rule
        // does not see): no event is appended on a lease the row no longer names.
        if !fx.events.is_empty() && !maintenance::confirm(&self.node).await {
            return result;
        }
        for (sub, name, event) in fx.events {
            let ws = name.to_string();
            let req = AppendRequest {
                name,
                records: vec![DataRecord::from_value(event)],
                producer: None,
                match_seq: None,
                close: false,
                content_type: None,
            };
            if let Err(e) = self.node.append(req).await {
                // The application owns the wake stream; a claim still works without the event.
                tracing::warn!(%sub, wake_stream = %ws, error = %e, "wake event not written");
            }
        }
        result
    }

    /// [`Manager::settle`] for work nobody waits on: failures are logged.
    async fn settle_logged(self: &Arc<Self>, fx: Effects, what: &str) {
        if let Err(e) = self.settle(fx).await {
            tracing::warn!(error = %e, "{what} not persisted");
        }
    }

    // ---- background ----

    /// Starts the event follower and the lease/retry timer once, if a runtime is available
    /// (otherwise the next request retries). Both hold only a weak reference: they end once every
    /// router holding this manager is gone.
    pub fn ensure_background(self: &Arc<Self>) {
        if self.background.load(Ordering::Acquire) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.background.swap(true, Ordering::AcqRel) {
            return;
        }
        let rx = self.node.subscribe_events();
        rt.spawn(run_events(Arc::downgrade(self), rx));
        rt.spawn(run_timers(Arc::downgrade(self)));
    }

    async fn on_append(self: &Arc<Self>, path: &str, stream_id: u64, next_seq: u64) {
        // Not the holder: it rescans what it finds when it takes over.
        if self.ready().await.is_err() || !self.delivering().await {
            return;
        }
        let fx = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            for sub in subs.values_mut() {
                // Discovered by an append: linked before it, so the append is pending.
                let new_link = !sub.links.contains_key(path)
                    && sub.rec.config.pattern_matches(path)
                    && sub.link_glob(path, None);
                let Some(link) = sub.links.get_mut(path) else {
                    continue;
                };
                let mut changed = new_link;
                match link.stream_id {
                    None => {
                        link.stream_id = Some(stream_id);
                        changed = true;
                    }
                    // Deleted and re-created: the old cursor means nothing for the new stream.
                    Some(id) if id != stream_id => {
                        link.stream_id = Some(stream_id);
                        link.acked = None;
                        changed = true;
                    }
                    Some(_) => {}
                }
                let pending = link.pending(next_seq);
                if changed {
                    fx.persist_links(sub, &[path]);
                }
                if sub.rec.wake.is_none() && pending {
                    self.wake(sub, fx);
                }
            }
            txn.finish()
        };
        self.settle_logged(fx, "subscription change").await;
    }

    /// Re-links pattern matches and wakes idle subscriptions with pending work (after a lag or
    /// at start-up).
    async fn rescan(self: &Arc<Self>) {
        if self.ready().await.is_err() || !self.delivering().await {
            return;
        }
        let fx = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            for sub in subs.values_mut() {
                self.link_new_matches(sub, fx);
                self.adopt_incarnations(sub, fx);
                if sub.rec.wake.is_none() {
                    self.wake(sub, fx);
                }
            }
            txn.finish()
        };
        self.settle_logged(fx, "subscription rescan").await;
    }

    /// Links matching streams not linked yet, as discovered by an append (acked `-1`): they
    /// appeared after the subscription was created (existing ones were linked at creation).
    fn link_new_matches(&self, sub: &mut Sub, fx: &mut Effects) {
        let mut added = Vec::new();
        for name in self.unlinked_matches(sub) {
            if sub.link_glob(&name, None) {
                if let Some(link) = sub.links.get_mut(&name) {
                    link.stream_id = self.stream_id(&name);
                }
                added.push(name);
            }
        }
        let refs: Vec<&str> = added.iter().map(String::as_str).collect();
        fx.persist_links(sub, &refs);
    }

    async fn on_tick(self: &Arc<Self>) {
        if self.keys.get().is_none() {
            // Not loaded yet (metadata log unavailable at start): keep trying.
            if self.ready().await.is_err() {
                return;
            }
        }
        let tick = self.ticks.fetch_add(1, Ordering::Relaxed);
        let delivering = self.delivering().await;
        // On every node: wake events routed to the wake stream's owner through the log.
        self.deliver_routed_events(delivering).await;
        if !delivering {
            return;
        }
        // After a takeover, and every second while other nodes are registered: appends on
        // other nodes raise no event here, their commits show in the view.
        let peers =
            tick.is_multiple_of(PRUNE_EVERY_TICKS) && self.node.meta().view().nodes.len() > 1;
        if self.rescan_due.swap(false, Ordering::AcqRel) || peers {
            self.rescan().await;
        }
        let now = self.clock.now_ms();
        let fx = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            // Every few ticks, not every tick: each checked link is a stream lookup under this
            // lock, and most ticks have no deleted stream to find.
            if tick.is_multiple_of(PRUNE_EVERY_TICKS) {
                self.prune_gone_links(subs, fx);
            }
            for sub in subs.values_mut() {
                match state::due(sub, now) {
                    Due::Nothing => {}
                    Due::Delivery => self.queue_delivery(sub, fx),
                    Due::LeaseExpired => {
                        tracing::info!(sub = %sub.rec.id, generation = sub.rec.generation, "lease expired");
                        sub.rec.wake = None;
                        if !self.wake(sub, fx) {
                            fx.persist(sub, &[]);
                        }
                    }
                }
            }
            txn.finish()
        };
        self.settle_logged(fx, "subscription timer change").await;
    }

    // ---- API ----

    pub async fn upsert(
        self: &Arc<Self>,
        id: &str,
        config: Config,
        ds_root: &str,
    ) -> Result<Upserted, SubError> {
        check_id(id)?;
        let keys = self.keys().await?;
        self.here().await?;
        let hash = config.hash();
        let (body, created_at, fx) = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            if let Some(existing) = subs.get(id) {
                if existing.rec.config_hash != hash {
                    return Err(SubError::AlreadyExists);
                }
                return Ok(Upserted {
                    created: false,
                    body: existing.to_json(ds_root, keys.kid()),
                });
            }
            if subs.len() >= MAX_SUBSCRIPTIONS {
                return Err(SubError::LimitExceeded(format!(
                    "this node already has the maximum of {MAX_SUBSCRIPTIONS} subscriptions"
                )));
            }
            // Before the tails are read: an append after them sends its event (`events`).
            self.node.inner.events.want(true);
            let created_at = self.clock.now_ms();
            let mut sub = Sub::new(Record {
                id: id.to_string(),
                config_hash: hash,
                created_at_ms: created_at,
                base_url: ds_root.to_string(),
                generation: 0,
                wake: None,
                status: Status::Active,
                retry_count: 0,
                next_attempt_at_ms: None,
                config,
            });
            // Existing streams are linked at their tail: creation does not replay history.
            for path in sub.rec.config.streams.clone() {
                let tail = self.tail(&path);
                sub.links.insert(
                    path.clone(),
                    Link {
                        explicit: true,
                        // A glob link exists only for a stream that exists.
                        glob: tail.is_ok() && sub.rec.config.pattern_matches(&path),
                        acked: Some(tail.unwrap_or(0)),
                        stream_id: self.stream_id(&path),
                    },
                );
            }
            for path in self.unlinked_matches(&sub) {
                let tail = self.tail(&path).unwrap_or(0);
                if sub.link_glob(&path, Some(tail))
                    && let Some(link) = sub.links.get_mut(&path)
                {
                    link.stream_id = self.stream_id(&path);
                }
            }
            let paths: Vec<String> = sub.links.keys().cloned().collect();
            let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
            fx.persist(&sub, &refs);
            let body = sub.to_json(ds_root, keys.kid());
            subs.insert(id.to_string(), sub);
            (body, created_at, txn.finish())
        };
        if let Err(e) = self.settle(fx).await {
            // Not stored: forget it, unless something else already changed it.
            let mut subs = self.lock();
            if subs
                .get(id)
                .is_some_and(|s| s.rec.created_at_ms == created_at && s.rec.generation == 0)
            {
                subs.remove(id);
            }
            self.track(&subs);
            return Err(e);
        }
        Ok(Upserted {
            created: true,
            body,
        })
    }

    /// Served on any node: from memory on the holder, else from the log's view.
    pub async fn get(&self, id: &str, ds_root: &str) -> Result<Value, SubError> {
        let keys = self.keys().await?;
        if !(self.active.load(Ordering::Acquire) && self.node.holds_maintenance_lease()) {
            let sub = self.store.load_one(id).ok_or(SubError::NotFound)?;
            return Ok(sub.to_json(ds_root, keys.kid()));
        }
        let subs = self.lock();
        let sub = subs.get(id).ok_or(SubError::NotFound)?;
        Ok(sub.to_json(ds_root, keys.kid()))
    }

    /// Tombstones the subscription: its wake, tokens and cursors are gone (idempotent).
    pub async fn delete(self: &Arc<Self>, id: &str) -> Result<(), SubError> {
        self.ready().await?;
        self.here().await?;
        let (removed, fx) = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            let Some(sub) = subs.remove(id) else {
                return Ok(());
            };
            fx.delete(&sub);
            (sub, txn.finish())
        };
        if let Err(e) = self.settle(fx).await {
            // Still stored: keep serving it, so that a retried delete removes it.
            self.lock().entry(id.to_string()).or_insert(removed);
            return Err(e);
        }
        // Only now: until the delete is stored, an undo may bring the subscription back.
        self.track(&self.lock());
        Ok(())
    }

    pub async fn add_streams(
        self: &Arc<Self>,
        id: &str,
        streams: Vec<String>,
    ) -> Result<(), SubError> {
        self.ready().await?;
        self.here().await?;
        let fx = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            let sub = subs.get_mut(id).ok_or(SubError::NotFound)?;
            let new = streams
                .iter()
                .filter(|p| !sub.links.contains_key(*p))
                .count();
            if sub.links.len() + new > MAX_LINKS_PER_SUB {
                return Err(SubError::LimitExceeded(format!(
                    "a subscription links at most {MAX_LINKS_PER_SUB} streams ({} linked, {new} new)",
                    sub.links.len()
                )));
            }
            let mut changed = Vec::new();
            for path in streams {
                match sub.links.get_mut(&path) {
                    Some(link) if link.explicit => {}
                    Some(link) => {
                        link.explicit = true;
                        changed.push(path);
                    }
                    None => {
                        let tail = self.tail(&path);
                        let glob = tail.is_ok() && sub.rec.config.pattern_matches(&path);
                        sub.links.insert(
                            path.clone(),
                            Link {
                                explicit: true,
                                glob,
                                acked: Some(tail.unwrap_or(0)),
                                stream_id: self.stream_id(&path),
                            },
                        );
                        changed.push(path);
                    }
                }
            }
            let refs: Vec<&str> = changed.iter().map(String::as_str).collect();
            fx.persist_links(sub, &refs);
            txn.finish()
        };
        self.settle(fx).await
    }

    /// Drops the explicit link; a glob link to the same stream stays (idempotent).
    pub async fn remove_stream(self: &Arc<Self>, id: &str, path: &str) -> Result<(), SubError> {
        self.ready().await?;
        self.here().await?;
        let fx = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            let sub = subs.get_mut(id).ok_or(SubError::NotFound)?;
            let Some(link) = sub.links.get_mut(path) else {
                return Ok(());
            };
            link.explicit = false;
            if !link.glob {
                sub.links.remove(path);
            }
            fx.persist_links(sub, &[path]);
            txn.finish()
        };
        self.settle(fx).await
    }

    /// Webhook callback: acks, lease extension, `done`.
    pub async fn callback(
        self: &Arc<Self>,
        id: &str,
        token: Option<&str>,
        req: WakeRequest,
    ) -> Result<Value, SubError> {
        self.finish_or_extend(id, token, req, SubType::Webhook)
            .await
    }

    /// Pull-wake ack (a heartbeat without `done`).
    pub async fn ack(
        self: &Arc<Self>,
        id: &str,
        token: Option<&str>,
        req: WakeRequest,
    ) -> Result<Value, SubError> {
        self.finish_or_extend(id, token, req, SubType::PullWake)
            .await
    }

    async fn finish_or_extend(
        self: &Arc<Self>,
        id: &str,
        token: Option<&str>,
        req: WakeRequest,
        kind: SubType,
    ) -> Result<Value, SubError> {
        let keys = self.keys().await?;
        self.here().await?;
        let (next_wake, fx) = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            let sub = subs.get_mut(id).ok_or(SubError::NotFound)?;
            check_kind(sub, kind)?;
            check_fence(&keys, sub, token, &req)?;
            let acked = self.apply_acks(sub, &req.acks)?;
            let refs: Vec<&str> = acked.iter().map(String::as_str).collect();
            let lease = self.clock.now_ms() + sub.rec.config.lease_ttl_ms as i64;
            let mut next_wake = false;
            if req.done {
                sub.rec.wake = None;
                sub.rec.next_attempt_at_ms = None;
                next_wake = self.wake(sub, fx);
            } else if let Some(w) = sub.rec.wake.as_mut() {
                w.lease_expires_ms = Some(lease);
            }
            if !next_wake {
                fx.persist(sub, &refs);
            } else {
                fx.persist_links(sub, &refs);
            }
            (next_wake, txn.finish())
        };
        self.settle(fx).await?;
        Ok(json!({ "ok": true, "next_wake": next_wake }))
    }

    pub async fn claim(self: &Arc<Self>, id: &str, worker: &str) -> Result<Value, SubError> {
        let keys = self.keys().await?;
        self.here().await?;
        let (answer, fx) = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            let sub = subs.get_mut(id).ok_or(SubError::NotFound)?;
            check_kind(sub, SubType::PullWake)?;
            let now = self.clock.now_ms();
            state::check_claimable(sub, now)?;
            // Streams created since the last event we processed are pending too.
            self.link_new_matches(sub, fx);
            let views = self.views(sub, fx);
            if !views.iter().any(StreamView::pending) {
                // Links dropped on the way are queued already and still get written.
                return Err(SubError::NoPendingWork);
            }
            if sub.rec.wake.is_none() {
                self.wake(sub, fx);
            }
            let generation = sub.rec.generation;
            let lease_ttl_ms = sub.rec.config.lease_ttl_ms;
            let Some(w) = sub.rec.wake.as_mut() else {
                return Err(SubError::NoPendingWork);
            };
            w.holder = Some(worker.to_string());
            w.lease_expires_ms = Some(now + lease_ttl_ms as i64);
            let token = keys.token(&TokenClaims {
                sub: id.to_string(),
                generation,
                wake_id: w.wake_id.clone(),
            });
            let wake_id = w.wake_id.clone();
            fx.persist(sub, &[]);
            let answer = json!({
                "wake_id": wake_id,
                "generation": generation,
                "token": token,
                "streams": views.iter().map(StreamView::to_json).collect::<Vec<_>>(),
                "lease_ttl_ms": lease_ttl_ms,
            });
            (answer, txn.finish())
        };
        self.settle(fx).await?;
        Ok(answer)
    }

    /// Gives the wake back without acking; pending work gets a new wake.
    pub async fn release(
        self: &Arc<Self>,
        id: &str,
        token: Option<&str>,
        req: WakeRequest,
    ) -> Result<(), SubError> {
        let keys = self.keys().await?;
        self.here().await?;
        let fx = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            let sub = subs.get_mut(id).ok_or(SubError::NotFound)?;
            check_kind(sub, SubType::PullWake)?;
            check_fence(&keys, sub, token, &req)?;
            sub.rec.wake = None;
            if !self.wake(sub, fx) {
                fx.persist(sub, &[]);
            }
            txn.finish()
        };
        self.settle(fx).await
    }

    // ---- wakes ----

    /// Issues a new wake generation if any linked stream has pending work: queues the record
    /// (and links dropped because their stream is gone) and the delivery or wake event.
    /// Returns whether a wake was issued.
    fn wake(&self, sub: &mut Sub, fx: &mut Effects) -> bool {
        let views = self.views(sub, fx);
        let wake_id = format!("w_{}", hex(&rand::random::<[u8; 12]>()));
        let Some(trigger) = state::issue_wake(sub, &views, self.clock.now_ms(), wake_id) else {
            return false;
        };
        fx.persist(sub, &[]);
        match sub.rec.config.kind {
            SubType::Webhook => self.queue_delivery(sub, fx),
            SubType::PullWake => self.queue_wake_event(sub, &trigger, fx),
        }
        tracing::debug!(sub = %sub.rec.id, generation = sub.rec.generation, "wake issued");
        true
    }

    fn queue_wake_event(&self, sub: &mut Sub, trigger: &str, fx: &mut Effects) {
        let Some(ws) = &sub.rec.config.wake_stream else {
            return;
        };
        let event = json!({
            "type": "wake",
            "subscription_id": sub.rec.id,
            "stream": trigger,
            "generation": sub.rec.generation,
            "ts": self.clock.now_ms(),
        });
        let Ok(name) = StreamName::parse(ws) else {
            return;
        };
        // Appending here would open a stream another node owns, fencing it and dropping the
        // appends it acknowledged but has not committed (or, with its owner lapsed, before
        // failover recovered them): the event goes through the log to the owner instead, in
        // this transition's batch (`routed.rs`).
        if !matches!(self.node.route(&name), crate::Route::Local) {
            tracing::debug!(sub = %sub.rec.id, wake_stream = %ws, "wake event routed to the wake stream's owner");
            fx.push(routed_cmd(&RoutedEvent {
                sub: sub.rec.id.clone(),
                generation: sub.rec.generation,
                stream: ws.clone(),
                event,
            }));
            return;
        }
        fx.events
            .push((sub.rec.id.clone(), name, event.to_string().into_bytes()));
    }

    /// Starts a delivery of the wake in flight unless one is running for it.
    fn queue_delivery(&self, sub: &mut Sub, fx: &mut Effects) {
        let Some(wake) = &sub.rec.wake else {
            return;
        };
        if sub.delivering.as_ref() == Some(&wake.wake_id) {
            return;
        }
        sub.delivering = Some(wake.wake_id.clone());
        fx.deliveries
            .push((sub.rec.id.clone(), wake.wake_id.clone()));
    }

    /// One delivery attempt. Boxed as `Send`: a delivery's outcome may start the next one,
    /// and the compiler cannot see through that recursion on its own.
    fn deliver(self: Arc<Self>, id: String, wake_id: String) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let Ok(_permit) = self.delivery_slots.clone().acquire_owned().await else {
                return;
            };
            let Ok(keys) = self.keys().await else {
                return;
            };
            let prepared = {
                let subs = self.lock();
                subs.get(&id).and_then(|sub| {
                    let wake = sub.rec.wake.as_ref().filter(|w| w.wake_id == wake_id)?;
                    let url = sub.rec.config.webhook_url.clone()?;
                    Some((url, webhook_body(sub, wake, &keys)))
                })
            };
            // The lease moved since the wake was queued: the new holder sends it.
            let Some((url, body)) = prepared.filter(|_| self.holds()) else {
                self.clear_delivering(&id, &wake_id);
                return;
            };
            // Right before sending: the lease row still names this incarnation.
            if !maintenance::confirm(&self.node).await {
                self.clear_delivering(&id, &wake_id);
                return;
            }
            let signature = keys.signature_header(self.clock.now_ms() / 1000, &body);
            let outcome = self.sender.send(&url, signature, body).await;
            self.finish_delivery(&id, &wake_id, outcome).await;
        })
    }

    fn clear_delivering(&self, id: &str, wake_id: &str) {
        if let Some(sub) = self.lock().get_mut(id)
            && sub.delivering.as_deref() == Some(wake_id)
        {
            sub.delivering = None;
        }
    }

    /// Whether this node is (still) the delivering one, without IO.
    fn holds(&self) -> bool {
        self.active.load(Ordering::Acquire) && self.node.holds_maintenance_lease()
    }

    async fn finish_delivery(self: &Arc<Self>, id: &str, wake_id: &str, outcome: Delivered) {
        if !self.holds() {
            // The lease moved during the request: the new holder loaded the wake as it was
            // stored and sends it again (at least once).
            self.clear_delivering(id, wake_id);
            return;
        }
        let fx = {
            let mut txn = self.begin();
            let Txn { subs, fx, .. } = &mut txn;
            let Some(sub) = subs.get_mut(id) else {
                return;
            };
            let now = self.clock.now_ms();
            match state::on_delivered(sub, wake_id, &outcome, now, rand::random::<f64>()) {
                // The wake finished (callback) or was replaced meanwhile.
                DeliveryChange::Stale => return,
                DeliveryChange::Finished { acked } => {
                    let refs: Vec<&str> = acked.iter().map(String::as_str).collect();
                    fx.persist_links(sub, &refs);
                    if !self.wake(sub, fx) {
                        fx.persist(sub, &[]);
                    }
                }
                DeliveryChange::Extended => fx.persist(sub, &[]),
                DeliveryChange::Retry { attempt, delay_ms } => {
                    if let Delivered::Failed(reason) = &outcome {
                        tracing::warn!(
                            sub = %sub.rec.id, attempt, retry_in_ms = delay_ms, %reason,
                            "webhook delivery failed"
                        );
                    }
                    fx.persist(sub, &[]);
                }
            }
            txn.finish()
        };
        self.settle_logged(fx, "delivery outcome").await;
    }
}

/// Follows stream appends until the node's event channel closes or the manager is dropped.
async fn run_events(mgr: Weak<Manager>, mut rx: broadcast::Receiver<StreamEvent>) {
    match mgr.upgrade() {
        // Appends that happened while the node was down (or before we subscribed).
        Some(m) => m.rescan().await,
        None => return,
    }
    loop {
        let event = rx.recv().await;
        let Some(m) = mgr.upgrade() else {
            return;
        };
        match event {
            Ok(StreamEvent::Appended {
                name,
                stream_id,
                next_seq,
                ..
            }) => {
                m.on_append(name.as_str(), stream_id, next_seq).await;
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "subscription event listener lagged; rescanning");
                m.rescan().await;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Checks leases and retry schedules every [`TICK`] of the manager's clock (a test moving a
/// manual clock drives it).
async fn run_timers(mgr: Weak<Manager>) {
    let Some(clock) = mgr.upgrade().map(|m| m.clock.clone()) else {
        return;
    };
    loop {
        let Some(m) = mgr.upgrade() else {
            return;
        };
        m.on_tick().await;
        drop(m);
        clock.sleep(TICK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriptions::links::PRUNE_BATCH;
    use crate::subscriptions::test_support::{Scripted, create_stream, eventually};
    use pico_common::clock::Clock;

    const ROOT: &str = "http://127.0.0.1:4437/v1/stream/__ds";

    fn pull_wake(pattern: &str) -> Config {
        Config::parse(
            &json!({"type": "pull-wake", "pattern": pattern, "wake_stream": "w"}),
            true,
        )
        .unwrap()
    }

    async fn manager() -> Arc<Manager> {
        Arc::new(Manager::new(crate::testing::start_test_node().await))
    }

    fn link(explicit: bool) -> Link {
        Link {
            explicit,
            glob: !explicit,
            acked: None,
            stream_id: None,
        }
    }

    #[tokio::test]
    async fn subscriptions_per_node_are_capped() {
        let mgr = manager().await;
        assert!(mgr.upsert("first", pull_wake("a/*"), ROOT).await.is_ok());
        {
            let mut subs = mgr.lock();
            let template = subs["first"].clone();
            for i in 1..MAX_SUBSCRIPTIONS {
                let mut filler = template.clone();
                filler.rec.id = format!("filler-{i}");
                subs.insert(filler.rec.id.clone(), filler);
            }
        }
        let refused = mgr.upsert("one-more", pull_wake("b/*"), ROOT).await;
        assert!(
            matches!(refused, Err(SubError::LimitExceeded(_))),
            "creating subscription {} must be refused",
            MAX_SUBSCRIPTIONS + 1
        );
        assert!(!mgr.lock().contains_key("one-more"));
        // Re-confirming an existing subscription creates nothing.
        let again = mgr.upsert("first", pull_wake("a/*"), ROOT).await;
        assert!(again.is_ok_and(|u| !u.created));
        mgr.delete("filler-1").await.unwrap();
        let created = mgr.upsert("one-more", pull_wake("b/*"), ROOT).await;
        assert!(created.is_ok_and(|u| u.created));
    }

    #[tokio::test]
    async fn links_per_subscription_are_capped() {
        let mgr = manager().await;
        assert!(mgr.upsert("s", pull_wake("g/*"), ROOT).await.is_ok());
        let fill = |subs: &mut BTreeMap<String, Sub>, n: usize| {
            let sub = subs.get_mut("s").unwrap();
            for i in 0..n {
                sub.links.insert(format!("x/{i}"), link(true));
            }
        };
        fill(&mut mgr.lock(), MAX_LINKS_PER_SUB - 1);
        // Two new explicit links do not fit: refused, none added.
        let refused = mgr
            .add_streams("s", vec!["e/1".to_string(), "e/2".to_string()])
            .await;
        assert!(
            matches!(refused, Err(SubError::LimitExceeded(_))),
            "{refused:?}"
        );
        assert_eq!(mgr.lock()["s"].links.len(), MAX_LINKS_PER_SUB - 1);
        // One new (plus one already linked) fits.
        let added = mgr
            .add_streams("s", vec!["e/1".to_string(), "x/0".to_string()])
            .await;
        assert_eq!(added, Ok(()));
        assert_eq!(mgr.lock()["s"].links.len(), MAX_LINKS_PER_SUB);
        // A matching append beyond the cap is not linked; one already linked still counts.
        mgr.on_append("g/new", 7, 1).await;
        let subs = mgr.lock();
        assert!(!subs["s"].links.contains_key("g/new"));
        assert!(subs["s"].link_cap_warned);
        assert_eq!(subs["s"].links.len(), MAX_LINKS_PER_SUB);
    }

    #[tokio::test]
    async fn glob_matches_at_creation_stop_at_the_link_cap() {
        let mgr = manager().await;
        assert!(mgr.upsert("s", pull_wake("g/*"), ROOT).await.is_ok());
        {
            let mut subs = mgr.lock();
            let sub = subs.get_mut("s").unwrap();
            for i in 0..MAX_LINKS_PER_SUB - 1 {
                sub.links.insert(format!("x/{i}"), link(true));
            }
        }
        create_stream(&mgr.node, "g/a").await;
        create_stream(&mgr.node, "g/b").await;
        let mut subs = mgr.lock();
        let sub = subs.get_mut("s").unwrap();
        let mut fx = Effects::default();
        mgr.link_new_matches(sub, &mut fx);
        assert_eq!(sub.links.len(), MAX_LINKS_PER_SUB);
        assert!(sub.links.contains_key("g/a") && !sub.links.contains_key("g/b"));
        assert!(sub.link_cap_warned);
    }

    #[tokio::test]
    async fn links_of_deleted_streams_are_pruned_a_batch_per_tick() {
        let mgr = manager().await;
        create_stream(&mgr.node, "g/live").await;
        assert!(mgr.upsert("s", pull_wake("g/*"), ROOT).await.is_ok());
        assert!(mgr.upsert("t", pull_wake("g/*"), ROOT).await.is_ok());
        let gone = 1_500;
        let written = {
            let mut subs = mgr.lock();
            let sub = subs.get_mut("s").unwrap();
            let mut paths = vec!["g/explicit-gone".to_string()];
            sub.links.insert(paths[0].clone(), link(true));
            for i in 0..gone {
                paths.push(format!("g/gone-{i:04}"));
                sub.links.insert(format!("g/gone-{i:04}"), link(false));
            }
            let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
            mgr.store
                .enqueue(crate::subscriptions::store::link_cmds(sub, &refs).collect())
        };
        written.wait().await.unwrap();
        let stored = |id: &str| mgr.store.stored_links(id);
        assert_eq!(stored("s"), gone + 2);
        // One batch: the explicit link and 999 gone ones checked.
        let prune = || {
            let mut txn = mgr.begin();
            let Txn { subs, fx, .. } = &mut txn;
            mgr.prune_gone_links(subs, fx);
            txn.finish()
        };
        mgr.settle(prune()).await.unwrap();
        assert_eq!(mgr.lock()["s"].links.len(), gone + 2 - (PRUNE_BATCH - 1));
        // The next one resumes there, finishes `s` and checks `t`.
        mgr.settle(prune()).await.unwrap();
        {
            let subs = mgr.lock();
            let left: Vec<&String> = subs["s"].links.keys().collect();
            assert_eq!(left, ["g/explicit-gone", "g/live"]);
            assert_eq!(subs["t"].links.len(), 1);
        }
        assert_eq!(stored("s"), 2);
        assert!(mgr.prune_cursor.lock().unwrap().is_none());
    }

    /// One append can change every subscription at once: its writes go to the log as one
    /// batch, not one queued write per subscription (which overflowed the bounded write queue
    /// and lost the links of the subscriptions past it).
    #[tokio::test]
    async fn an_append_matching_thousands_of_subscriptions_stores_every_link() {
        let mgr = manager().await;
        assert!(mgr.upsert("first", pull_wake("g/*"), ROOT).await.is_ok());
        let many = 2_000;
        {
            let mut subs = mgr.lock();
            let template = subs["first"].clone();
            for i in 1..many {
                let mut more = template.clone();
                more.rec.id = format!("more-{i:04}");
                subs.insert(more.rec.id.clone(), more);
            }
        }
        create_stream(&mgr.node, "g/new").await;
        mgr.on_append("g/new", 7, 1).await;
        let unstored: Vec<String> = mgr
            .lock()
            .keys()
            .filter(|id| mgr.store.stored_links(id) != 1)
            .cloned()
            .collect();
        assert!(unstored.is_empty(), "{} links not stored", unstored.len());
    }

    /// An append sends the node's event (a lock and a task wake) only while a subscription
    /// exists here: before the first one and after the last one is deleted, nothing is sent.
    #[tokio::test]
    async fn appends_send_events_only_while_a_subscription_exists() {
        use tokio::sync::broadcast::error::TryRecvError;
        let mgr = manager().await;
        let mut rx = mgr.node.subscribe_events();
        create_stream(&mgr.node, "e/1").await;
        assert_eq!(
            rx.try_recv(),
            Err(TryRecvError::Empty),
            "no subscription yet"
        );
        assert!(mgr.upsert("e", pull_wake("e/*"), ROOT).await.is_ok());
        create_stream(&mgr.node, "e/2").await;
        let event = rx.try_recv();
        assert!(
            matches!(&event, Ok(StreamEvent::Appended { name, .. }) if name.as_str() == "e/2"),
            "{event:?}"
        );
        assert!(mgr.delete("e").await.is_ok());
        create_stream(&mgr.node, "e/3").await;
        assert_eq!(
            rx.try_recv(),
            Err(TryRecvError::Empty),
            "the last one was deleted"
        );
    }

    /// A pull-wake worker's ack for a stream deleted and re-created under its name since the
    /// claim is about the old stream: the new one's cursor stays at its start.
    #[tokio::test]
    async fn an_ack_for_a_stream_re_created_since_the_claim_moves_nothing() {
        let mgr = manager().await;
        assert!(mgr.upsert("p", pull_wake("k/*"), ROOT).await.is_ok());
        create_stream(&mgr.node, "k/1").await;
        let claim = mgr.claim("p", "worker").await.unwrap();
        let name = StreamName::parse("k/1").unwrap();
        mgr.node.delete(&name).await.unwrap();
        create_stream(&mgr.node, "k/1").await;
        // The follower sees the new stream's append: a new incarnation, its cursor reset.
        let new_id = mgr.stream_id("k/1").unwrap();
        mgr.on_append("k/1", new_id, 1).await;
        assert_eq!(mgr.lock()["p"].links["k/1"].acked, None);
        let req = WakeRequest {
            wake_id: claim["wake_id"].as_str().map(str::to_string),
            generation: claim["generation"].as_u64(),
            acks: vec![crate::subscriptions::AckItem {
                stream: Some("k/1".into()),
                path: None,
                offset: pico_protocol::format_offset(1),
            }],
            done: false,
        };
        let acked = mgr.ack("p", claim["token"].as_str(), req).await;
        assert!(acked.is_ok(), "{acked:?}");
        let links = mgr.lock()["p"].links.clone();
        assert_eq!(
            links["k/1"].acked, None,
            "the old stream's ack moved the new cursor"
        );
        assert_eq!(links["k/1"].stream_id, Some(new_id));
    }

    /// A change the metadata log refused is not kept: a create is forgotten and a delete
    /// undone, so the client's retry (it got a 503) writes again instead of finding the
    /// change already made in memory only.
    #[tokio::test]
    async fn changes_the_log_refused_are_not_kept_in_memory() {
        let mgr = manager().await;
        assert!(mgr.upsert("kept", pull_wake("a/*"), ROOT).await.is_ok());
        // Every proposal now fails; the view stays readable.
        mgr.node.meta().close().await;
        let created = mgr.upsert("new", pull_wake("b/*"), ROOT).await;
        assert!(
            matches!(created, Err(SubError::Unavailable(_))),
            "{:?}",
            created.err()
        );
        assert_eq!(mgr.get("new", ROOT).await, Err(SubError::NotFound));
        let deleted = mgr.delete("kept").await;
        assert!(
            matches!(deleted, Err(SubError::Unavailable(_))),
            "{deleted:?}"
        );
        assert!(mgr.get("kept", ROOT).await.is_ok(), "the delete is undone");
    }

    /// Moves the manager's clock by `by` once its timer is asleep on it, and waits for the
    /// timer pass that move wakes to finish (the timer is asleep again).
    async fn tick(mgr: &Manager, clock: &pico_common::clock::ManualClock, by: Duration) {
        eventually("the timer sleeps on the clock", || clock.sleepers() == 1).await;
        let before = mgr.ticks.load(Ordering::Relaxed);
        clock.advance(by);
        eventually("a timer pass", || {
            mgr.ticks.load(Ordering::Relaxed) > before && clock.sleepers() == 1
        })
        .await;
    }

    /// Timer passes a tick apart, the last one with the clock at `at` (at least a tick ahead).
    async fn passes_until(mgr: &Manager, clock: &pico_common::clock::ManualClock, at: i64) {
        let tick_ms = TICK.as_millis() as i64;
        assert!(at - clock.now_ms() >= tick_ms);
        while clock.now_ms() + 2 * tick_ms <= at {
            tick(mgr, clock, TICK).await;
        }
        // At least a tick: the timer sleeps a tick from its last pass.
        tick(
            mgr,
            clock,
            Duration::from_millis((at - clock.now_ms()) as u64),
        )
        .await;
        assert_eq!(clock.now_ms(), at);
    }

    /// Webhook subscription `id` (`config`) on a manager on a manual clock whose receiver
    /// answers `answers`, its event follower and timer running as in the server, woken by
    /// creating `stream`: the manager, its clock, what it sends, and the first webhook.
    async fn first_webhook(
        answers: Vec<Delivered>,
        id: &str,
        config: Value,
        stream: &str,
    ) -> (
        Arc<Manager>,
        Arc<pico_common::clock::ManualClock>,
        tokio::sync::mpsc::UnboundedReceiver<Value>,
        Value,
    ) {
        let node = crate::testing::start_test_node().await;
        let clock = pico_common::clock::ManualClock::new(1_000_000);
        let (sender, mut sent) = Scripted::new(answers);
        let mgr = Arc::new(Manager::with(node, clock.clone(), sender));
        let config = Config::parse(&config, true).unwrap();
        assert!(mgr.upsert(id, config, ROOT).await.is_ok());
        mgr.ensure_background();
        create_stream(&mgr.node, stream).await;
        let first = sent.recv().await.unwrap();
        assert_eq!(first["generation"], 1);
        (mgr, clock, sent, first)
    }

    /// The retry schedule runs on the manager's clock, and so does its timer: a failed
    /// delivery is not sent again however many timer passes the clock's moves wake until the
    /// clock passes its backoff, then exactly once. No real time needs to pass.
    #[tokio::test]
    async fn a_failed_delivery_is_retried_once_the_clock_passes_its_backoff() {
        let (mgr, clock, mut sent, first) = first_webhook(
            vec![
                Delivered::Failed("refused".into()),
                Delivered::Accepted { done: false },
            ],
            "r",
            json!({"type": "webhook", "pattern": "r/*", "webhook": {"url": "http://127.0.0.1:9/hook"}}),
            "r/1",
        )
        .await;
        let failed = || {
            let subs = mgr.lock();
            let sub = &subs["r"];
            (sub.rec.status == Status::Failed && sub.delivering.is_none())
                .then_some(sub.rec.next_attempt_at_ms)
                .flatten()
        };
        eventually("the failure is recorded", || failed().is_some()).await;
        let due = failed().unwrap();
        assert!((1_000_800..=1_001_200).contains(&due), "1 s ± 20 %: {due}");
        // Timer passes up to 1 ms before the backoff ends, however many: no retry.
        passes_until(&mgr, &clock, due - 1).await;
        assert!(
            mgr.lock()["r"].delivering.is_none(),
            "no retry before the clock"
        );
        assert!(sent.try_recv().is_err());
        // The next pass, past it, retries the same wake.
        clock.advance(TICK);
        let second = sent.recv().await.unwrap();
        assert_eq!(second["wake_id"], first["wake_id"], "the same wake again");
    }

    /// A webhook's lease runs on the manager's clock: while the clock stands short of it the
    /// wake stays out, however many timer passes run; the pass after it re-issues the wake at
    /// the next generation.
    #[tokio::test]
    async fn a_lease_expires_on_the_clock_and_the_wake_is_reissued() {
        let (mgr, clock, mut sent, first) = first_webhook(
            vec![Delivered::Accepted { done: false }],
            "l",
            json!({"type": "webhook", "pattern": "l/*", "lease_ttl_ms": 1000,
                "webhook": {"url": "http://127.0.0.1:9/hook"}}),
            "l/1",
        )
        .await;
        eventually("the delivery is recorded", || {
            let subs = mgr.lock();
            let sub = &subs["l"];
            sub.delivering.is_none()
                && sub
                    .rec
                    .wake
                    .as_ref()
                    .is_some_and(|w| w.lease_expires_ms.is_some())
        })
        .await;
        let expires = mgr.lock()["l"]
            .rec
            .wake
            .as_ref()
            .and_then(|w| w.lease_expires_ms)
            .unwrap();
        passes_until(&mgr, &clock, expires - 1).await;
        assert!(
            sent.try_recv().is_err(),
            "re-issued before the lease ran out"
        );
        assert_eq!(mgr.lock()["l"].rec.generation, 1);
        clock.advance(TICK);
        let second = sent.recv().await.unwrap();
        assert_eq!(second["generation"], 2);
        assert_ne!(second["wake_id"], first["wake_id"]);
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod cluster_tests;
