//! One transition of the subscription state: [`Txn`] holds the state lock and collects what
//! the change needs ([`Effects`]); finishing it (or dropping it on an early return) queues all
//! its KV writes as one batch while the lock is still held, so the log sees transitions in the
//! order they happened. Everything else (waiting for the write, deliveries, wake events) runs
//! after the lock is released.

use std::collections::BTreeMap;
use std::sync::MutexGuard;

use pico_common::StreamName;
use pico_metadata::Command;

use super::error::SubError;
use super::model::Sub;
use super::store::{self, Receipt, Store};

/// What a transition leaves to do once the state lock is released.
#[derive(Default)]
#[must_use = "effects must be settled"]
pub(super) struct Effects {
    /// KV commands, queued as one batch when the transition ends.
    cmds: Vec<Command>,
    /// A record that could not be encoded: the transition's writes are refused.
    error: Option<SubError>,
    /// The queued batch.
    pub(super) written: Option<Receipt>,
    /// Webhook deliveries to start: (subscription, wake id).
    pub(super) deliveries: Vec<(String, String)>,
    /// Pull-wake events to append: (subscription, wake stream, event).
    pub(super) events: Vec<(String, StreamName, Vec<u8>)>,
}

impl Effects {
    /// Writes `sub`'s record and the given links.
    pub(super) fn persist(&mut self, sub: &Sub, links: &[&str]) {
        match store::record_cmd(sub) {
            Ok(cmd) => self.cmds.push(cmd),
            Err(e) => self.error = Some(e),
        }
        self.persist_links(sub, links);
    }

    /// Writes the given links of `sub` (deleted from the KV when no longer linked).
    pub(super) fn persist_links(&mut self, sub: &Sub, links: &[&str]) {
        self.cmds.extend(store::link_cmds(sub, links));
    }

    /// Writes one more command (a routed wake event) in the transition's batch.
    pub(super) fn push(&mut self, cmd: Result<Command, SubError>) {
        match cmd {
            Ok(cmd) => self.cmds.push(cmd),
            Err(e) => self.error = Some(e),
        }
    }

    /// Removes `sub` from the KV.
    pub(super) fn delete(&mut self, sub: &Sub) {
        self.cmds.extend(store::delete_cmds(sub));
    }

    fn queue(&mut self, store: &Store) {
        let cmds = std::mem::take(&mut self.cmds);
        self.written = Some(match self.error.take() {
            Some(e) => Receipt::failed(e),
            None => store.enqueue(cmds),
        });
    }
}

/// The state lock and the effects of the transition under way.
pub(super) struct Txn<'a> {
    pub(super) subs: MutexGuard<'a, BTreeMap<String, Sub>>,
    pub(super) fx: Effects,
    store: &'a Store,
}

impl<'a> Txn<'a> {
    pub(super) fn new(subs: MutexGuard<'a, BTreeMap<String, Sub>>, store: &'a Store) -> Txn<'a> {
        Txn {
            subs,
            fx: Effects::default(),
            store,
        }
    }

    /// Ends the transition: its writes are queued (the lock is still held) and the rest is
    /// returned to be settled without the lock.
    pub(super) fn finish(mut self) -> Effects {
        self.fx.queue(self.store);
        std::mem::take(&mut self.fx)
    }
}

impl Drop for Txn<'_> {
    /// A transition left early (an error answer) still queues the writes it collected: the
    /// state already holds those changes.
    fn drop(&mut self) {
        if self.fx.written.is_none() && (!self.fx.cmds.is_empty() || self.fx.error.is_some()) {
            self.fx.queue(self.store);
        }
    }
}
