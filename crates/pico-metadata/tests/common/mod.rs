//! Shared proptest generators: random commands over a small universe of ids, so that
//! sequences collide (same names, streams, keys) and exercise real transitions.
#![allow(dead_code)]

use pico_metadata::{Command, CommitRange, ForkOrigin, Initial, ProducerMark, State, StreamConfig};
use proptest::prelude::*;

pub fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("c/d".to_string()),
        "[a-z]{1,3}"
    ]
}

pub fn config() -> impl Strategy<Value = StreamConfig> {
    (
        prop_oneof![
            Just("application/json".to_string()),
            Just("text/plain".to_string())
        ],
        proptest::option::of(0u64..3),
        proptest::option::of(-1i64..2),
    )
        .prop_map(|(content_type, ttl_secs, expires_at_ms)| StreamConfig {
            content_type: content_type.into(),
            ttl_secs,
            expires_at_ms,
        })
}

pub fn producer() -> impl Strategy<Value = ProducerMark> {
    ("p[0-2]", 0u64..3, 0u64..100, 0u64..100, 0u64..5).prop_map(
        |(id, epoch, seq, start_offset, len)| ProducerMark {
            id,
            epoch,
            seq,
            start_offset,
            end_offset: start_offset + len,
        },
    )
}

pub fn range() -> impl Strategy<Value = CommitRange> {
    (
        0u64..5,
        -1i64..4,
        0u64..40,
        0u64..8,
        any::<u64>(),
        any::<u64>(),
        proptest::collection::vec(producer(), 0..3),
    )
        .prop_map(
            |(stream_id, epoch, start, n, position, len, producers)| CommitRange {
                stream_id,
                epoch,
                start_offset: start,
                end_offset: start + n,
                position,
                len,
                producers,
                stream_seq: None,
            },
        )
}

fn initial() -> impl Strategy<Value = Initial> {
    prop_oneof![
        Just(Initial::None),
        Just(Initial::Records),
        Just(Initial::RecordsThenClose)
    ]
}

/// Any command, with field values drawn from small ranges.
pub fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (0u32..3, 0u64..4, "[a-z:0-9]{0,8}", any::<i64>()).prop_map(
            |(node_id, node_epoch, address, now_ms)| Command::RegisterNode {
                node_id,
                node_epoch,
                address,
                now_ms
            }
        ),
        (name(), config(), any::<bool>(), initial(), any::<i64>()).prop_map(
            |(name, config, closed, initial, now_ms)| Command::CreateStream {
                name,
                config,
                closed,
                initial,
                now_ms
            }
        ),
        (0u64..5, 0u32..3, 0u64..4).prop_map(|(stream_id, node_id, node_epoch)| {
            Command::OpenStream {
                stream_id,
                node_id,
                node_epoch,
            }
        }),
        (0u64..5, -1i64..4, 0u32..3, 0u64..4).prop_map(
            |(stream_id, epoch, node_id, node_epoch)| Command::ReleaseStream {
                stream_id,
                epoch,
                node_id,
                node_epoch
            }
        ),
        (
            0u64..5,
            0u64..60,
            proptest::option::of(producer()),
            any::<i64>()
        )
            .prop_map(
                |(stream_id, closed_at, producer, now_ms)| Command::SealStream {
                    stream_id,
                    closed_at,
                    producer,
                    now_ms
                }
            ),
        (0u64..5, 0u64..60).prop_map(|(stream_id, start_offset)| Command::Trim {
            stream_id,
            start_offset
        }),
        (name(), 0u64..5).prop_map(|(name, stream_id)| Command::DeleteStream { name, stream_id }),
        (
            0u32..3,
            0u64..4,
            "k[0-9]{1,2}",
            any::<u64>(),
            proptest::collection::vec(range(), 0..4),
            any::<i64>()
        )
            .prop_map(|(node_id, node_epoch, key, size, ranges, now_ms)| {
                Command::CommitObject {
                    node_id,
                    node_epoch,
                    key,
                    size,
                    ranges,
                    now_ms,
                }
            }),
        "k[0-9]{1,2}".prop_map(|key| Command::ForgetObject { key }),
        (0u64..5, any::<i64>())
            .prop_map(|(stream_id, now_ms)| Command::Touch { stream_id, now_ms }),
        ("[a-z]{0,4}", proptest::collection::vec(any::<u8>(), 0..16))
            .prop_map(|(key, value)| Command::KvPut { key, value }),
        "[a-z]{0,4}".prop_map(|key| Command::KvDelete { key }),
        ("[a-z]{0,4}", proptest::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(key, value)| Command::KvInit { key, value }),
        (0u32..3, 0u64..4, any::<i64>()).prop_map(|(node_id, node_epoch, now_ms)| {
            Command::Heartbeat {
                node_id,
                node_epoch,
                now_ms,
            }
        }),
        (0u64..5, 0u32..3, any::<i64>()).prop_map(|(stream_id, to_node, now_ms)| {
            Command::TransferStream {
                stream_id,
                to_node,
                now_ms,
            }
        }),
        (0u64..5, -1i64..4, 0u32..3, 0u64..4, 0u32..3, any::<i64>()).prop_map(
            |(stream_id, epoch, node_id, node_epoch, to_node, now_ms)| {
                Command::CompleteTransfer {
                    stream_id,
                    epoch,
                    node_id,
                    node_epoch,
                    to_node,
                    now_ms,
                }
            }
        ),
        (0u32..3, 0u64..5, -1i64..2, 0u32..3, 0u64..4).prop_map(
            |(node_id, node_epoch, last_heartbeat_ms, by_node_id, by_node_epoch)| {
                Command::FenceNode {
                    node_id,
                    node_epoch,
                    last_heartbeat_ms,
                    by_node_id,
                    by_node_epoch,
                }
            }
        ),
        (0u32..3, 0u64..5, 0u32..3, 0u64..4).prop_map(
            |(node_id, node_epoch, by_node_id, by_node_epoch)| Command::ReleaseFenced {
                node_id,
                node_epoch,
                by_node_id,
                by_node_epoch,
            }
        ),
        (
            name(),
            name(),
            0u64..5,
            0u64..60,
            0u64..3,
            any::<bool>(),
            config(),
            any::<bool>(),
            initial(),
            any::<i64>()
        )
            .prop_map(
                |(
                    name,
                    source,
                    source_stream_id,
                    offset,
                    sub_offset,
                    offset_given,
                    config,
                    closed,
                    initial,
                    now_ms,
                )| {
                    Command::ForkStream {
                        name,
                        origin: ForkOrigin {
                            source,
                            source_stream_id,
                            offset,
                            sub_offset,
                        },
                        inherit_end: offset + sub_offset,
                        offset_given,
                        config,
                        closed,
                        initial,
                        now_ms,
                    }
                }
            ),
    ]
}

/// An abstract step: either a raw random command, or a "well-formed" one resolved against the
/// current state (so commits, opens and trims actually succeed often).
#[derive(Debug, Clone)]
pub enum Step {
    Raw(Command),
    /// Register node `n` at its next epoch.
    Register(u32),
    /// Open stream #i (index into the live streams) on node `n` at its current epoch.
    Open(usize, u32),
    /// Commit an object with `n` records to each of the chosen live streams at their tail.
    Commit(Vec<(usize, u64)>, u8),
    /// Trim stream #i to its end_offset minus `back`.
    Trim(usize, u64),
    /// Seal stream #i at its end offset plus `ahead`.
    Seal(usize, u64),
    /// Create a stream (names collide on purpose).
    Create(String, bool),
    /// Delete live stream #i by name.
    Delete(usize),
    /// Forget destroyed object #i.
    Forget(usize),
    /// Fork live stream #i into `name`, `back` records below its committed end.
    Fork(usize, String, u64, bool),
    /// Ask for live stream #i to move to node `n`.
    Transfer(usize, u32),
    /// The owner of live stream #i completes its pending transfer.
    CompleteTransfer(usize),
}

pub fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => command().prop_map(Step::Raw),
        2 => (name(), proptest::bool::weighted(0.1)).prop_map(|(n, c)| Step::Create(n, c)),
        1 => (0u32..3).prop_map(Step::Register),
        2 => (any::<usize>(), 0u32..3).prop_map(|(i, n)| Step::Open(i, n)),
        4 => (proptest::collection::vec((any::<usize>(), 1u64..5), 1..4), any::<u8>()).prop_map(|(v, k)| Step::Commit(v, k)),
        1 => (any::<usize>(), 0u64..6).prop_map(|(i, b)| Step::Trim(i, b)),
        1 => (any::<usize>(), 0u64..20).prop_map(|(i, a)| Step::Seal(i, a)),
        1 => any::<usize>().prop_map(Step::Delete),
        1 => any::<usize>().prop_map(Step::Forget),
        2 => (any::<usize>(), name(), 0u64..4, any::<bool>())
            .prop_map(|(i, n, b, c)| Step::Fork(i, n, b, c)),
        1 => (any::<usize>(), 0u32..3).prop_map(|(i, n)| Step::Transfer(i, n)),
        1 => any::<usize>().prop_map(Step::CompleteTransfer),
    ]
}

/// Resolves steps into concrete commands, applying them to a scratch state as it goes.
pub fn resolve(steps: &[Step]) -> Vec<Command> {
    let mut s = State::new();
    let mut out = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let live: Vec<u64> = s.streams.keys().copied().collect();
        let pick = |i: usize| {
            if live.is_empty() {
                None
            } else {
                Some(live[i % live.len()])
            }
        };
        let cmd = match step {
            Step::Raw(c) => Some(c.clone()),
            Step::Register(n) => Some(Command::RegisterNode {
                node_id: *n,
                node_epoch: s.nodes.get(n).map_or(1, |x| x.epoch + 1),
                address: format!("node{n}"),
                now_ms: i as i64,
            }),
            Step::Open(idx, n) => pick(*idx).and_then(|id| {
                s.nodes.get(n).map(|node| Command::OpenStream {
                    stream_id: id,
                    node_id: *n,
                    node_epoch: node.epoch,
                })
            }),
            Step::Commit(targets, k) => {
                let mut ranges = Vec::new();
                let mut node = None;
                let mut ends = std::collections::BTreeMap::new();
                for (idx, n) in targets {
                    let Some(id) = pick(*idx) else { continue };
                    let m = &s.streams[&id];
                    let Some(owner) = m.owner else { continue };
                    if *node.get_or_insert(owner) != owner {
                        continue;
                    }
                    let start = *ends.get(&id).unwrap_or(&m.end_offset);
                    ends.insert(id, start + n);
                    ranges.push(CommitRange {
                        stream_id: id,
                        epoch: m.epoch,
                        start_offset: start,
                        end_offset: start + n,
                        position: 0,
                        len: *n,
                        producers: vec![ProducerMark {
                            id: "p".into(),
                            epoch: 0,
                            seq: start + n,
                            start_offset: start,
                            end_offset: start + n,
                        }],
                        stream_seq: Some(format!("{:08}", start + n)),
                    });
                }
                node.map(|o| Command::CommitObject {
                    node_id: o.node_id,
                    node_epoch: s.nodes.get(&o.node_id).map_or(0, |x| x.epoch),
                    key: format!("obj-{i}-{k}"),
                    size: 100,
                    ranges,
                    now_ms: i as i64,
                })
            }
            Step::Trim(idx, back) => pick(*idx).map(|id| Command::Trim {
                stream_id: id,
                start_offset: s.streams[&id].end_offset.saturating_sub(*back),
            }),
            Step::Seal(idx, ahead) => pick(*idx).map(|id| Command::SealStream {
                stream_id: id,
                closed_at: s.streams[&id].end_offset + ahead,
                producer: None,
                now_ms: i as i64,
            }),
            Step::Create(name, closed) => Some(Command::CreateStream {
                name: name.clone(),
                config: StreamConfig {
                    content_type: "text/plain".into(),
                    ttl_secs: None,
                    expires_at_ms: None,
                },
                closed: *closed,
                initial: Default::default(),
                now_ms: i as i64,
            }),
            Step::Fork(idx, name, back, closed) => pick(*idx).map(|id| {
                let m = &s.streams[&id];
                let at = m.end_offset.saturating_sub(*back);
                Command::ForkStream {
                    name: name.clone(),
                    origin: ForkOrigin {
                        source: m.name.to_string(),
                        source_stream_id: id,
                        offset: at,
                        sub_offset: 0,
                    },
                    inherit_end: at,
                    offset_given: true,
                    config: StreamConfig {
                        content_type: "text/plain".into(),
                        ttl_secs: None,
                        expires_at_ms: None,
                    },
                    closed: *closed,
                    initial: Default::default(),
                    now_ms: i as i64,
                }
            }),
            Step::Transfer(idx, n) => pick(*idx).map(|id| Command::TransferStream {
                stream_id: id,
                to_node: *n,
                now_ms: i as i64,
            }),
            Step::CompleteTransfer(idx) => pick(*idx).and_then(|id| {
                let m = &s.streams[&id];
                let (t, o) = (s.transfers.get(&id)?, m.owner?);
                Some(Command::CompleteTransfer {
                    stream_id: id,
                    epoch: m.epoch,
                    node_id: o.node_id,
                    node_epoch: o.node_epoch,
                    to_node: t.to_node,
                    now_ms: i as i64,
                })
            }),
            Step::Delete(idx) => pick(*idx).map(|id| Command::DeleteStream {
                name: s.streams[&id].name.to_string(),
                stream_id: id,
            }),
            Step::Forget(idx) => {
                let d: Vec<String> = s.destroyed.iter().cloned().collect();
                if d.is_empty() {
                    None
                } else {
                    Some(Command::ForgetObject {
                        key: d[idx % d.len()].clone(),
                    })
                }
            }
        };
        if let Some(cmd) = cmd {
            let _ = s.apply(&cmd);
            out.push(cmd);
        }
    }
    out
}

pub fn commands() -> impl Strategy<Value = Vec<Command>> {
    proptest::collection::vec(step(), 0..120).prop_map(|steps| resolve(&steps))
}
