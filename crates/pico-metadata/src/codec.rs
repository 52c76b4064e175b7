//! Hand-written, versioned binary codec for commands (log rows) and state (snapshots).
//!
//! Layout: the first byte is the codec version ([`VERSION`]); then little-endian fixed-width
//! integers, `u32` length-prefixed strings/bytes/lists, a `u8` tag for enums and options.
//! Decoding checks every length against the bytes left, so garbage yields a [`CodecError`]
//! (never a panic, never a huge allocation). There is one version: any other version byte is
//! refused (see "Format version and upgrades" in docs/design/metadata-log.md for the rule once
//! a release exists).

use crate::command::{Command, CommitRange, ForkOrigin, Initial, ProducerMark, StreamConfig};
use crate::invariants;
use crate::state::{
    NodeInfo, ObjectMeta, Owner, ProducerState, RegistryEntry, Slice, State, StreamMeta, Transfer,
};
use std::sync::Arc;
use thiserror::Error;

/// The codec version (first byte of every encoded value), the only one decoded.
pub const VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CodecError {
    #[error("empty input")]
    Empty,
    #[error("unsupported codec version: version={0} supported={VERSION}")]
    UnsupportedVersion(u8),
    #[error("truncated input: reading={0}")]
    Truncated(&'static str),
    #[error("unknown tag: reading={what} tag={tag}")]
    BadTag { what: &'static str, tag: u8 },
    #[error("invalid utf-8 in string")]
    BadUtf8,
    #[error("trailing bytes after value: count={0}")]
    Trailing(usize),
    /// A snapshot that decodes but breaks a state invariant (see [`crate::invariants`]).
    #[error("decoded state breaks an invariant: {0}")]
    Invariant(String),
}

// ---------------------------------------------------------------- public entry points

pub fn encode_command(cmd: &Command) -> Vec<u8> {
    let mut w = Writer(vec![VERSION]);
    w.command(cmd);
    w.0
}

pub fn decode_command(bytes: &[u8]) -> Result<Command, CodecError> {
    let mut r = Reader::versioned(bytes)?;
    let cmd = r.command()?;
    r.finish()?;
    Ok(cmd)
}

/// A batch of commands (one log row).
pub fn encode_commands(cmds: &[Command]) -> Vec<u8> {
    let mut w = Writer(vec![VERSION]);
    w.len(cmds.len());
    for c in cmds {
        w.command(c);
    }
    w.0
}

pub fn decode_commands(bytes: &[u8]) -> Result<Vec<Command>, CodecError> {
    let mut r = Reader::versioned(bytes)?;
    let n = r.count("command count", 1)?;
    // The count is checked against the bytes left, not against a command's size in memory.
    let mut out = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        out.push(r.command()?);
    }
    r.finish()?;
    Ok(out)
}

/// A snapshot of the whole state.
pub fn encode_state(s: &State) -> Vec<u8> {
    let mut w = Writer(vec![VERSION]);
    w.u64(s.applied_index);
    w.u64(s.next_stream_id);
    w.len(s.nodes.len());
    for n in s.nodes.values() {
        w.u32(n.node_id);
        w.u64(n.epoch);
        w.str(&n.address);
        w.i64(n.registered_at_ms);
        w.i64(n.last_heartbeat_ms);
    }
    w.len(s.streams.len());
    for m in s.streams.values() {
        w.stream(m);
    }
    w.len(s.registry.len());
    for (name, e) in s.registry.iter() {
        w.str(name);
        w.u64(e.stream_id);
        w.config(&e.config);
        w.i64(e.created_at_ms);
        w.bool(e.closed);
        w.opt_u64(e.closed_at);
        match &e.closed_by {
            None => w.u8(0),
            Some(p) => {
                w.u8(1);
                w.producer(p);
            }
        }
        w.i64(e.last_touch_ms);
        w.fork(e.fork.as_deref());
        w.u32(e.forks);
        w.bool(e.soft_deleted);
        w.initial(e.initial);
    }
    w.len(s.objects.len());
    for o in s.objects.values() {
        w.str(&o.key);
        w.u64(o.size);
        w.u32(o.live_refs);
        w.u32(o.node_id);
        w.i64(o.committed_at_ms);
    }
    w.len(s.destroyed.len());
    for k in s.destroyed.iter() {
        w.str(k);
    }
    w.len(s.kv.len());
    for (k, v) in s.kv.iter() {
        w.str(k);
        w.bytes(v);
    }
    // Optional trailing sections, each a tag then its body, written only when not empty: a
    // snapshot without them keeps the layout it had before they existed.
    let fenced: Vec<(u32, u64)> = s
        .nodes
        .values()
        .filter_map(|n| Some((n.node_id, n.fenced_epoch?)))
        .collect();
    if !fenced.is_empty() {
        w.u8(SECTION_FENCED);
        w.len(fenced.len());
        for (id, e) in fenced {
            w.u32(id);
            w.u64(e);
        }
    }
    if !s.transfers.is_empty() {
        w.u8(SECTION_TRANSFERS);
        w.len(s.transfers.len());
        for (id, t) in s.transfers.iter() {
            w.u64(*id);
            w.u32(t.to_node);
            w.owner(t.from);
            w.i64(t.epoch);
            w.i64(t.requested_ms);
            w.opt_i64(t.released_ms);
        }
    }
    w.0
}

/// Trailing snapshot section: nodes failover fenced, as (node id, fenced epoch).
const SECTION_FENCED: u8 = 1;
/// Trailing snapshot section: live transfers, as (stream id, transfer).
const SECTION_TRANSFERS: u8 = 2;

/// A snapshot of the whole state. The decoded state must also pass
/// [`invariants::check_snapshot`]: a snapshot is trusted in place of the log it replaces, and a
/// bad value in it (say a `next_stream_id` at or below a live stream's id) would otherwise
/// corrupt later commands.
pub fn decode_state(bytes: &[u8]) -> Result<State, CodecError> {
    let mut r = Reader::versioned(bytes)?;
    let mut s = State::new();
    s.applied_index = r.u64("applied_index")?;
    s.next_stream_id = r.u64("next_stream_id")?;
    for _ in 0..r.count("nodes", 4 + 8 + 4 + 8 + 8)? {
        let n = NodeInfo {
            node_id: r.u32("node_id")?,
            epoch: r.u64("node epoch")?,
            address: r.str("address")?,
            registered_at_ms: r.i64("registered_at_ms")?,
            last_heartbeat_ms: r.i64("last_heartbeat_ms")?,
            fenced_epoch: None,
        };
        s.nodes.insert(n.node_id, n);
    }
    for _ in 0..r.count("streams", 8)? {
        let m = r.stream()?;
        s.streams.insert(m.id, Arc::new(m));
    }
    for _ in 0..r.count("registry", 8)? {
        let name = r.str("registry name")?;
        let e = RegistryEntry {
            stream_id: r.u64("registry stream_id")?,
            config: r.config()?,
            created_at_ms: r.i64("created_at_ms")?,
            closed: r.bool("closed")?,
            closed_at: r.opt_u64("closed_at")?,
            closed_by: match r.u8("closed_by tag")? {
                0 => None,
                1 => Some(Box::new(r.producer()?)),
                tag => {
                    return Err(CodecError::BadTag {
                        what: "closed_by",
                        tag,
                    });
                }
            },
            last_touch_ms: r.i64("last_touch_ms")?,
            fork: r.fork()?.map(Box::new),
            forks: r.u32("forks")?,
            soft_deleted: r.bool("soft_deleted")?,
            initial: r.initial()?,
        };
        let e = RegistryEntry {
            config: s.content_types.config(&e.config),
            ..e
        };
        // One allocation per name: the key is the stream's own `name` when it is this entry's.
        // A live entry naming another stream would have a delete of this name destroy that
        // stream's data (streams decode before the registry).
        let key: Arc<str> = match s.streams.get(&e.stream_id) {
            Some(m) if *m.name == *name => m.name.clone(),
            _ if e.soft_deleted => Arc::from(name),
            _ => {
                return Err(CodecError::Invariant(format!(
                    "registry entry without its stream: name=`{name}`"
                )));
            }
        };
        s.registry.insert(key, Arc::new(e));
    }
    for _ in 0..r.count("objects", 4 + 8 + 4 + 4 + 8)? {
        let o = ObjectMeta {
            key: r.str("object key")?,
            size: r.u64("object size")?,
            live_refs: r.u32("live_refs")?,
            node_id: r.u32("object node_id")?,
            committed_at_ms: r.i64("committed_at_ms")?,
        };
        s.objects.insert(o.key.clone(), o);
    }
    for _ in 0..r.count("destroyed", 4)? {
        s.destroyed.insert(r.str("destroyed key")?);
    }
    for _ in 0..r.count("kv", 8)? {
        let k = r.str("kv key")?;
        let v = r.bytes("kv value")?;
        s.kv.insert(k, v);
    }
    while !r.buf.is_empty() {
        match r.u8("section tag")? {
            SECTION_FENCED => {
                for _ in 0..r.count("fenced nodes", 4 + 8)? {
                    let id = r.u32("fenced node_id")?;
                    let e = r.u64("fenced epoch")?;
                    let n = s.nodes.get_mut(&id).ok_or_else(|| {
                        CodecError::Invariant(format!("fenced node not registered: node_id={id}"))
                    })?;
                    n.fenced_epoch = Some(e);
                }
            }
            SECTION_TRANSFERS => {
                for _ in 0..r.count("transfers", 8 + 4 + 1 + 8 + 8 + 1)? {
                    let id = r.u64("transfer stream_id")?;
                    let t = Transfer {
                        to_node: r.u32("transfer to_node")?,
                        from: r.owner()?,
                        epoch: r.i64("transfer epoch")?,
                        requested_ms: r.i64("transfer requested_ms")?,
                        released_ms: r.opt_i64("transfer released_ms")?,
                    };
                    s.transfers.insert(id, t);
                }
            }
            tag => {
                return Err(CodecError::BadTag {
                    what: "snapshot section",
                    tag,
                });
            }
        }
    }
    r.finish()?;
    invariants::check_snapshot(&s).map_err(CodecError::Invariant)?;
    Ok(s)
}

// ---------------------------------------------------------------- writer

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn initial(&mut self, v: Initial) {
        self.u8(match v {
            Initial::None => 0,
            Initial::Records => 1,
            Initial::RecordsThenClose => 2,
        });
    }
    fn bool(&mut self, v: bool) {
        self.0.push(v as u8);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Lengths are u32: a single value over 4 GiB is not a metadata value.
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u64(x);
            }
        }
    }
    fn opt_i64(&mut self, v: Option<i64>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.i64(x);
            }
        }
    }
    fn opt_str(&mut self, v: Option<&str>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.str(x);
            }
        }
    }
    fn owner(&mut self, o: Option<Owner>) {
        match o {
            None => self.u8(0),
            Some(o) => {
                self.u8(1);
                self.u32(o.node_id);
                self.u64(o.node_epoch);
            }
        }
    }
    fn fork(&mut self, f: Option<&ForkOrigin>) {
        match f {
            None => self.u8(0),
            Some(f) => {
                self.u8(1);
                self.str(&f.source);
                self.u64(f.source_stream_id);
                self.u64(f.offset);
                self.u64(f.sub_offset);
            }
        }
    }
    fn config(&mut self, c: &StreamConfig) {
        self.str(&c.content_type);
        self.opt_u64(c.ttl_secs);
        self.opt_i64(c.expires_at_ms);
    }
    fn producer(&mut self, p: &ProducerMark) {
        self.str(&p.id);
        self.u64(p.epoch);
        self.u64(p.seq);
        self.u64(p.start_offset);
        self.u64(p.end_offset);
    }
    fn stream(&mut self, m: &StreamMeta) {
        self.u64(m.id);
        self.str(&m.name);
        self.i64(m.epoch);
        self.owner(m.owner);
        self.u64(m.start_offset);
        self.u64(m.end_offset);
        self.bool(m.deleted);
        self.len(m.slices.len());
        for s in m.slices.iter() {
            self.str(&s.key);
            self.u64(s.start_offset);
            self.u64(s.end_offset);
            self.u64(s.position);
            self.u64(s.len);
        }
        self.len(m.producers.len());
        for (id, p) in m.producers.iter() {
            self.str(id);
            self.u64(p.epoch);
            self.u64(p.seq);
            self.u64(p.start_offset);
            self.u64(p.end_offset);
            self.i64(p.last_ms);
        }
        self.opt_str(m.stream_seq.as_deref());
    }
    fn command(&mut self, cmd: &Command) {
        match cmd {
            Command::RegisterNode {
                node_id,
                node_epoch,
                address,
                now_ms,
            } => {
                self.u8(1);
                self.u32(*node_id);
                self.u64(*node_epoch);
                self.str(address);
                self.i64(*now_ms);
            }
            Command::CreateStream {
                name,
                config,
                closed,
                initial,
                now_ms,
            } => {
                self.u8(2);
                self.str(name);
                self.config(config);
                self.bool(*closed);
                self.i64(*now_ms);
                self.initial(*initial);
            }
            Command::ForkStream {
                name,
                origin,
                inherit_end,
                offset_given,
                config,
                closed,
                initial,
                now_ms,
            } => {
                self.u8(13);
                self.str(name);
                self.fork(Some(origin));
                self.u64(*inherit_end);
                self.bool(*offset_given);
                self.config(config);
                self.bool(*closed);
                self.i64(*now_ms);
                self.initial(*initial);
            }
            Command::OpenStream {
                stream_id,
                node_id,
                node_epoch,
            } => {
                self.u8(3);
                self.u64(*stream_id);
                self.u32(*node_id);
                self.u64(*node_epoch);
            }
            Command::ReleaseStream {
                stream_id,
                epoch,
                node_id,
                node_epoch,
            } => {
                self.u8(4);
                self.u64(*stream_id);
                self.i64(*epoch);
                self.u32(*node_id);
                self.u64(*node_epoch);
            }
            Command::SealStream {
                stream_id,
                closed_at,
                producer,
                now_ms,
            } => {
                self.u8(5);
                self.u64(*stream_id);
                self.u64(*closed_at);
                match producer {
                    None => self.u8(0),
                    Some(p) => {
                        self.u8(1);
                        self.producer(p);
                    }
                }
                self.i64(*now_ms);
            }
            Command::Trim {
                stream_id,
                start_offset,
            } => {
                self.u8(6);
                self.u64(*stream_id);
                self.u64(*start_offset);
            }
            Command::DeleteStream { name, stream_id } => {
                self.u8(7);
                self.str(name);
                self.u64(*stream_id);
            }
            Command::CommitObject {
                node_id,
                node_epoch,
                key,
                size,
                ranges,
                now_ms,
            } => {
                self.u8(8);
                self.u32(*node_id);
                self.u64(*node_epoch);
                self.str(key);
                self.u64(*size);
                self.len(ranges.len());
                for r in ranges {
                    self.u64(r.stream_id);
                    self.i64(r.epoch);
                    self.u64(r.start_offset);
                    self.u64(r.end_offset);
                    self.u64(r.position);
                    self.u64(r.len);
                    self.len(r.producers.len());
                    for p in &r.producers {
                        self.producer(p);
                    }
                    self.opt_str(r.stream_seq.as_deref());
                }
                self.i64(*now_ms);
            }
            Command::ForgetObject { key } => {
                self.u8(9);
                self.str(key);
            }
            Command::Touch { stream_id, now_ms } => {
                self.u8(10);
                self.u64(*stream_id);
                self.i64(*now_ms);
            }
            Command::KvPut { key, value } => {
                self.u8(11);
                self.str(key);
                self.bytes(value);
            }
            Command::KvDelete { key } => {
                self.u8(12);
                self.str(key);
            }
            Command::KvInit { key, value } => {
                self.u8(14);
                self.str(key);
                self.bytes(value);
            }
            // Tags are sparse: 20 and up are the cluster's (liveness, fencing).
            Command::Heartbeat {
                node_id,
                node_epoch,
                now_ms,
            } => {
                self.u8(20);
                self.u32(*node_id);
                self.u64(*node_epoch);
                self.i64(*now_ms);
            }
            // 21 and 22 are failover's, 25 the Kafka frontend's.
            Command::TransferStream {
                stream_id,
                to_node,
                now_ms,
            } => {
                self.u8(23);
                self.u64(*stream_id);
                self.u32(*to_node);
                self.i64(*now_ms);
            }
            Command::CompleteTransfer {
                stream_id,
                epoch,
                node_id,
                node_epoch,
                to_node,
                now_ms,
            } => {
                self.u8(24);
                self.u64(*stream_id);
                self.i64(*epoch);
                self.u32(*node_id);
                self.u64(*node_epoch);
                self.u32(*to_node);
                self.i64(*now_ms);
            }
            Command::FenceNode {
                node_id,
                node_epoch,
                last_heartbeat_ms,
                by_node_id,
                by_node_epoch,
            } => {
                self.u8(21);
                self.u32(*node_id);
                self.u64(*node_epoch);
                self.i64(*last_heartbeat_ms);
                self.u32(*by_node_id);
                self.u64(*by_node_epoch);
            }
            Command::ReleaseFenced {
                node_id,
                node_epoch,
                by_node_id,
                by_node_epoch,
            } => {
                self.u8(22);
                self.u32(*node_id);
                self.u64(*node_epoch);
                self.u32(*by_node_id);
                self.u64(*by_node_epoch);
            }
        }
    }
}

// ---------------------------------------------------------------- reader

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn versioned(bytes: &'a [u8]) -> Result<Reader<'a>, CodecError> {
        let (&v, rest) = bytes.split_first().ok_or(CodecError::Empty)?;
        if v != VERSION {
            return Err(CodecError::UnsupportedVersion(v));
        }
        Ok(Reader { buf: rest })
    }
    fn finish(&self) -> Result<(), CodecError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(CodecError::Trailing(self.buf.len()))
        }
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CodecError> {
        if self.buf.len() < n {
            return Err(CodecError::Truncated(what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], CodecError> {
        let b = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, CodecError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn initial(&mut self) -> Result<Initial, CodecError> {
        Ok(match self.u8("initial")? {
            0 => Initial::None,
            1 => Initial::Records,
            2 => Initial::RecordsThenClose,
            tag => {
                return Err(CodecError::BadTag {
                    what: "initial",
                    tag,
                });
            }
        })
    }
    fn bool(&mut self, what: &'static str) -> Result<bool, CodecError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(CodecError::BadTag { what, tag }),
        }
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn i64(&mut self, what: &'static str) -> Result<i64, CodecError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    /// A list length, checked against the bytes left (each element takes at least
    /// `min_elem` bytes) so garbage cannot make us allocate or loop for long.
    fn count(&mut self, what: &'static str, min_elem: usize) -> Result<usize, CodecError> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_elem.max(1)) > self.buf.len() {
            return Err(CodecError::Truncated(what));
        }
        Ok(n)
    }
    fn bytes(&mut self, what: &'static str) -> Result<Vec<u8>, CodecError> {
        let n = self.u32(what)? as usize;
        Ok(self.take(n, what)?.to_vec())
    }
    fn str(&mut self, what: &'static str) -> Result<String, CodecError> {
        String::from_utf8(self.bytes(what)?).map_err(|_| CodecError::BadUtf8)
    }
    fn opt_u64(&mut self, what: &'static str) -> Result<Option<u64>, CodecError> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.u64(what)?)),
            tag => Err(CodecError::BadTag { what, tag }),
        }
    }
    fn opt_i64(&mut self, what: &'static str) -> Result<Option<i64>, CodecError> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.i64(what)?)),
            tag => Err(CodecError::BadTag { what, tag }),
        }
    }
    fn opt_str(&mut self, what: &'static str) -> Result<Option<String>, CodecError> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.str(what)?)),
            tag => Err(CodecError::BadTag { what, tag }),
        }
    }
    fn owner(&mut self) -> Result<Option<Owner>, CodecError> {
        match self.u8("owner tag")? {
            0 => Ok(None),
            1 => Ok(Some(Owner {
                node_id: self.u32("owner node_id")?,
                node_epoch: self.u64("owner node_epoch")?,
            })),
            tag => Err(CodecError::BadTag { what: "owner", tag }),
        }
    }
    fn fork(&mut self) -> Result<Option<ForkOrigin>, CodecError> {
        match self.u8("fork tag")? {
            0 => Ok(None),
            1 => Ok(Some(ForkOrigin {
                source: self.str("fork source")?,
                source_stream_id: self.u64("fork source_stream_id")?,
                offset: self.u64("fork offset")?,
                sub_offset: self.u64("fork sub_offset")?,
            })),
            tag => Err(CodecError::BadTag { what: "fork", tag }),
        }
    }
    fn config(&mut self) -> Result<StreamConfig, CodecError> {
        Ok(StreamConfig {
            content_type: self.str("content_type")?.into(),
            ttl_secs: self.opt_u64("ttl_secs")?,
            expires_at_ms: self.opt_i64("expires_at_ms")?,
        })
    }
    fn producer(&mut self) -> Result<ProducerMark, CodecError> {
        Ok(ProducerMark {
            id: self.str("producer id")?,
            epoch: self.u64("producer epoch")?,
            seq: self.u64("producer seq")?,
            start_offset: self.u64("producer start_offset")?,
            end_offset: self.u64("producer end_offset")?,
        })
    }
    fn stream(&mut self) -> Result<StreamMeta, CodecError> {
        let id = self.u64("stream id")?;
        let name = self.str("stream name")?;
        let epoch = self.i64("stream epoch")?;
        let owner = self.owner()?;
        let start_offset = self.u64("start_offset")?;
        let end_offset = self.u64("end_offset")?;
        let deleted = self.bool("deleted")?;
        let mut slices = im::Vector::new();
        for _ in 0..self.count("slices", 4 + 32)? {
            slices.push_back(Slice {
                key: self.str("slice key")?,
                start_offset: self.u64("slice start")?,
                end_offset: self.u64("slice end")?,
                position: self.u64("slice position")?,
                len: self.u64("slice len")?,
            });
        }
        let mut producers = std::collections::BTreeMap::new();
        for _ in 0..self.count("producers", 4 + 40)? {
            let pid = self.str("producer id")?;
            let st = ProducerState {
                epoch: self.u64("producer epoch")?,
                seq: self.u64("producer seq")?,
                start_offset: self.u64("producer start_offset")?,
                end_offset: self.u64("producer end_offset")?,
                last_ms: self.i64("producer last_ms")?,
            };
            producers.insert(pid, st);
        }
        let stream_seq = self.opt_str("stream_seq")?.map(String::into_boxed_str);
        Ok(StreamMeta {
            id,
            name: name.into(),
            epoch,
            owner,
            start_offset,
            end_offset,
            deleted,
            slices,
            producers: if producers.is_empty() {
                crate::state::no_producers()
            } else {
                std::sync::Arc::new(producers)
            },
            stream_seq,
        })
    }
    fn command(&mut self) -> Result<Command, CodecError> {
        let tag = self.u8("command tag")?;
        Ok(match tag {
            1 => Command::RegisterNode {
                node_id: self.u32("node_id")?,
                node_epoch: self.u64("node_epoch")?,
                address: self.str("address")?,
                now_ms: self.i64("now_ms")?,
            },
            2 => Command::CreateStream {
                name: self.str("name")?,
                config: self.config()?,
                closed: self.bool("closed")?,
                now_ms: self.i64("now_ms")?,
                initial: self.initial()?,
            },
            3 => Command::OpenStream {
                stream_id: self.u64("stream_id")?,
                node_id: self.u32("node_id")?,
                node_epoch: self.u64("node_epoch")?,
            },
            4 => Command::ReleaseStream {
                stream_id: self.u64("stream_id")?,
                epoch: self.i64("epoch")?,
                node_id: self.u32("node_id")?,
                node_epoch: self.u64("node_epoch")?,
            },
            5 => Command::SealStream {
                stream_id: self.u64("stream_id")?,
                closed_at: self.u64("closed_at")?,
                producer: match self.u8("producer tag")? {
                    0 => None,
                    1 => Some(self.producer()?),
                    tag => {
                        return Err(CodecError::BadTag {
                            what: "producer",
                            tag,
                        });
                    }
                },
                now_ms: self.i64("now_ms")?,
            },
            6 => Command::Trim {
                stream_id: self.u64("stream_id")?,
                start_offset: self.u64("start_offset")?,
            },
            7 => Command::DeleteStream {
                name: self.str("name")?,
                stream_id: self.u64("stream_id")?,
            },
            8 => {
                let node_id = self.u32("node_id")?;
                let node_epoch = self.u64("node_epoch")?;
                let key = self.str("key")?;
                let size = self.u64("size")?;
                let n = self.count("ranges", 52)?;
                let mut ranges = Vec::with_capacity(n);
                for _ in 0..n {
                    let stream_id = self.u64("range stream_id")?;
                    let epoch = self.i64("range epoch")?;
                    let start_offset = self.u64("range start")?;
                    let end_offset = self.u64("range end")?;
                    let position = self.u64("range position")?;
                    let len = self.u64("range len")?;
                    let np = self.count("range producers", 36)?;
                    let mut producers = Vec::with_capacity(np);
                    for _ in 0..np {
                        producers.push(self.producer()?);
                    }
                    let stream_seq = self.opt_str("range stream_seq")?;
                    ranges.push(CommitRange {
                        stream_id,
                        epoch,
                        start_offset,
                        end_offset,
                        position,
                        len,
                        producers,
                        stream_seq,
                    });
                }
                Command::CommitObject {
                    node_id,
                    node_epoch,
                    key,
                    size,
                    ranges,
                    now_ms: self.i64("now_ms")?,
                }
            }
            9 => Command::ForgetObject {
                key: self.str("key")?,
            },
            10 => Command::Touch {
                stream_id: self.u64("stream_id")?,
                now_ms: self.i64("now_ms")?,
            },
            11 => Command::KvPut {
                key: self.str("key")?,
                value: self.bytes("value")?,
            },
            12 => Command::KvDelete {
                key: self.str("key")?,
            },
            20 => Command::Heartbeat {
                node_id: self.u32("node_id")?,
                node_epoch: self.u64("node_epoch")?,
                now_ms: self.i64("now_ms")?,
            },
            23 => Command::TransferStream {
                stream_id: self.u64("stream_id")?,
                to_node: self.u32("to_node")?,
                now_ms: self.i64("now_ms")?,
            },
            24 => Command::CompleteTransfer {
                stream_id: self.u64("stream_id")?,
                epoch: self.i64("epoch")?,
                node_id: self.u32("node_id")?,
                node_epoch: self.u64("node_epoch")?,
                to_node: self.u32("to_node")?,
                now_ms: self.i64("now_ms")?,
            },
            14 => Command::KvInit {
                key: self.str("key")?,
                value: self.bytes("value")?,
            },
            21 => Command::FenceNode {
                node_id: self.u32("node_id")?,
                node_epoch: self.u64("node_epoch")?,
                last_heartbeat_ms: self.i64("last_heartbeat_ms")?,
                by_node_id: self.u32("by_node_id")?,
                by_node_epoch: self.u64("by_node_epoch")?,
            },
            22 => Command::ReleaseFenced {
                node_id: self.u32("node_id")?,
                node_epoch: self.u64("node_epoch")?,
                by_node_id: self.u32("by_node_id")?,
                by_node_epoch: self.u64("by_node_epoch")?,
            },
            13 => {
                let name = self.str("name")?;
                let origin = self.fork()?.ok_or(CodecError::BadTag {
                    what: "fork origin",
                    tag: 0,
                })?;
                Command::ForkStream {
                    name,
                    origin,
                    inherit_end: self.u64("inherit_end")?,
                    offset_given: self.bool("offset_given")?,
                    config: self.config()?,
                    closed: self.bool("closed")?,
                    now_ms: self.i64("now_ms")?,
                    initial: self.initial()?,
                }
            }
            tag => {
                return Err(CodecError::BadTag {
                    what: "command",
                    tag,
                });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// There is one version: rows and snapshots at any other version byte are refused, never
    /// read as something they are not.
    #[test]
    fn only_the_current_version_decodes() {
        let row = encode_commands(&[create("a")]);
        assert_eq!(row[0], VERSION);
        assert_eq!(decode_commands(&row).unwrap(), vec![create("a")]);
        let snapshot = encode_state(&State::new());
        assert_eq!(decode_state(&snapshot).unwrap(), State::new());
        for v in (0..=u8::MAX).filter(|v| *v != VERSION) {
            let mut bad = row.clone();
            bad[0] = v;
            let err = decode_commands(&bad).unwrap_err();
            assert_eq!(err, CodecError::UnsupportedVersion(v));
            assert!(
                err.to_string()
                    .contains(&format!("version={v} supported=1")),
                "{err}"
            );
            let mut bad = snapshot.clone();
            bad[0] = v;
            assert_eq!(decode_state(&bad), Err(CodecError::UnsupportedVersion(v)));
        }
    }

    /// A plain create of `name`.
    fn create(name: &str) -> Command {
        Command::CreateStream {
            name: name.into(),
            config: StreamConfig {
                content_type: "t".into(),
                ttl_secs: None,
                expires_at_ms: None,
            },
            closed: false,
            initial: Default::default(),
            now_ms: 0,
        }
    }

    #[test]
    fn a_snapshot_breaking_an_invariant_is_rejected() {
        let cmds = [
            Command::RegisterNode {
                node_id: 1,
                node_epoch: 1,
                address: "x".into(),
                now_ms: 0,
            },
            create("a"),
            create("b"),
            Command::OpenStream {
                stream_id: 1,
                node_id: 1,
                node_epoch: 1,
            },
            Command::CommitObject {
                node_id: 1,
                node_epoch: 1,
                key: "k".into(),
                size: 4,
                ranges: vec![CommitRange {
                    stream_id: 1,
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
        ];
        let mut s = State::new();
        for c in &cmds {
            s.apply(c).unwrap();
        }
        assert_eq!(decode_state(&encode_state(&s)).unwrap(), s);

        // Stream 1 is live: the next CreateStream would overwrite it.
        let mut bad = s.clone();
        bad.next_stream_id = 1;
        let err = decode_state(&encode_state(&bad)).unwrap_err();
        assert!(
            matches!(&err, CodecError::Invariant(m) if m.contains("id=1 next=1")),
            "{err:?}"
        );
        // One slice reads object `k`: a count of 0 would let GC delete it.
        let mut bad = s.clone();
        bad.objects.get_mut("k").unwrap().live_refs = 0;
        let err = decode_state(&encode_state(&bad)).unwrap_err();
        assert!(
            matches!(&err, CodecError::Invariant(m) if m.contains("live_refs")),
            "{err:?}"
        );
        // Counting too many only keeps the object longer: such a snapshot still loads.
        let mut over = s.clone();
        over.objects.get_mut("k").unwrap().live_refs = 5;
        assert_eq!(decode_state(&encode_state(&over)).unwrap(), over);
        // A slice reading an object the snapshot does not know: the orphan pass would delete
        // it from storage.
        let mut bad = s.clone();
        bad.objects.remove("k");
        let err = decode_state(&encode_state(&bad)).unwrap_err();
        assert!(
            matches!(&err, CodecError::Invariant(m) if m.contains("unknown object")),
            "{err:?}"
        );
        // GC deletes every destroyed key: one still read by a slice must not load.
        let mut bad = s.clone();
        bad.destroyed.insert("k".into());
        let err = decode_state(&encode_state(&bad)).unwrap_err();
        assert!(
            matches!(&err, CodecError::Invariant(m) if m.contains("destroyed")),
            "{err:?}"
        );
        // Name `a` pointing at stream 1 (`b`): deleting `a` would destroy `b`'s data.
        let mut bad = s.clone();
        Arc::make_mut(bad.registry.get_mut("a").unwrap()).stream_id = 1;
        let err = decode_state(&encode_state(&bad)).unwrap_err();
        assert!(
            matches!(&err, CodecError::Invariant(m) if m.contains("without its stream")),
            "{err:?}"
        );
    }

    /// Only a damaged snapshot reaches the last stream id or epoch: apply refuses rather than
    /// wrap (reusing id 0 over a live stream) or panic.
    #[test]
    fn exhausted_ids_and_epochs_are_refused() {
        let mut s = State::new();
        s.apply(&Command::RegisterNode {
            node_id: 1,
            node_epoch: 1,
            address: "x".into(),
            now_ms: 0,
        })
        .unwrap();
        s.apply(&create("a")).unwrap();
        s.next_stream_id = u64::MAX;
        let before = s.clone();
        assert!(matches!(
            s.apply(&create("x")),
            Err(crate::ApplyError::Invalid(_))
        ));
        assert_eq!(s.streams, before.streams);
        Arc::make_mut(s.streams.get_mut(&0).unwrap()).epoch = i64::MAX;
        let open = Command::OpenStream {
            stream_id: 0,
            node_id: 1,
            node_epoch: 1,
        };
        assert!(matches!(s.apply(&open), Err(crate::ApplyError::Invalid(_))));
        assert_eq!(s.streams[&0].epoch, i64::MAX);
    }
}
