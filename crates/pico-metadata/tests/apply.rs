//! Scenario tests of `State::apply`: each command's acceptance rules and effects.

use pico_metadata::{
    ApplyError, Command, CommitRange, ForkOrigin, Outcome, ProducerMark, State, StreamConfig,
    invariants,
};

fn cfg(ct: &str) -> StreamConfig {
    StreamConfig {
        content_type: ct.into(),
        ttl_secs: None,
        expires_at_ms: None,
    }
}

fn ok(s: &mut State, c: Command) -> Outcome {
    let o = s
        .apply(&c)
        .unwrap_or_else(|e| panic!("{c:?} rejected: {e}"));
    invariants::check(s).unwrap();
    o
}

fn err(s: &mut State, c: Command) -> ApplyError {
    let before = s.clone();
    let e = s.apply(&c).expect_err("command should be rejected");
    assert_eq!(
        s.applied_index,
        before.applied_index + 1,
        "rejection must consume a log position"
    );
    let mut expect = before;
    expect.applied_index += 1;
    assert_eq!(*s, expect, "rejection must leave the state unchanged");
    e
}

fn register(s: &mut State, node_id: u32, node_epoch: u64) -> Outcome {
    ok(
        s,
        Command::RegisterNode {
            node_id,
            node_epoch,
            address: format!("n{node_id}"),
            now_ms: 1,
        },
    )
}

fn create(s: &mut State, name: &str) -> u64 {
    match ok(
        s,
        Command::CreateStream {
            name: name.into(),
            config: cfg("text/plain"),
            closed: false,
            initial: Default::default(),
            now_ms: 5,
        },
    ) {
        Outcome::Created {
            stream_id,
            created: true,
        } => stream_id,
        o => panic!("unexpected {o:?}"),
    }
}

fn range(stream_id: u64, epoch: i64, start: u64, end: u64) -> CommitRange {
    CommitRange {
        stream_id,
        epoch,
        start_offset: start,
        end_offset: end,
        position: 0,
        len: end - start,
        producers: vec![ProducerMark {
            id: "p1".into(),
            epoch: 0,
            seq: end,
            start_offset: start,
            end_offset: end,
        }],
        stream_seq: None,
    }
}

fn commit(s: &mut State, node: (u32, u64), key: &str, ranges: Vec<CommitRange>) -> Vec<bool> {
    match ok(
        s,
        Command::CommitObject {
            node_id: node.0,
            node_epoch: node.1,
            key: key.into(),
            size: 10,
            ranges,
            now_ms: 9,
        },
    ) {
        Outcome::Committed { accepted } => accepted,
        o => panic!("unexpected {o:?}"),
    }
}

/// One node (1, epoch 1) owning a fresh stream `a` at epoch 0.
fn setup() -> (State, u64) {
    let mut s = State::new();
    register(&mut s, 1, 1);
    let id = create(&mut s, "a");
    assert_eq!(
        ok(
            &mut s,
            Command::OpenStream {
                stream_id: id,
                node_id: 1,
                node_epoch: 1
            }
        ),
        Outcome::Opened {
            epoch: 0,
            start_offset: 0,
            end_offset: 0
        }
    );
    (s, id)
}

#[test]
fn register_node_requires_higher_epoch() {
    let mut s = State::new();
    register(&mut s, 1, 3);
    assert_eq!(
        err(
            &mut s,
            Command::RegisterNode {
                node_id: 1,
                node_epoch: 3,
                address: "x".into(),
                now_ms: 2
            }
        ),
        ApplyError::StaleNodeEpoch {
            node_id: 1,
            given: 3,
            current: 3
        }
    );
    // The answer names the incarnation replaced while it may still run.
    assert_eq!(
        register(&mut s, 1, 4),
        Outcome::NodeRegistered {
            replaced_unfenced: Some(3)
        }
    );
    assert_eq!(s.node(1).unwrap().epoch, 4);
    assert_eq!(
        register(&mut s, 2, 1),
        Outcome::NodeRegistered {
            replaced_unfenced: None
        }
    );
}

#[test]
fn heartbeats_need_the_current_epoch_and_never_go_back() {
    let mut s = State::new();
    let beat = |node_epoch, now_ms| Command::Heartbeat {
        node_id: 1,
        node_epoch,
        now_ms,
    };
    assert_eq!(
        err(&mut s, beat(1, 5)),
        ApplyError::UnknownNode { node_id: 1 }
    );
    register(&mut s, 1, 3);
    assert_eq!(ok(&mut s, beat(3, 500)), Outcome::HeartbeatRecorded);
    assert_eq!(s.node(1).unwrap().last_heartbeat_ms, 500);
    // A heartbeat that arrives behind a newer one keeps the newer time.
    ok(&mut s, beat(3, 400));
    assert_eq!(s.node(1).unwrap().last_heartbeat_ms, 500);
    // The process of an older epoch is told it was replaced.
    register(&mut s, 1, 4);
    assert_eq!(
        err(&mut s, beat(3, 900)),
        ApplyError::StaleNodeEpoch {
            node_id: 1,
            given: 3,
            current: 4
        }
    );
}

#[test]
fn create_is_idempotent_and_detects_conflicts() {
    let mut s = State::new();
    let id = create(&mut s, "a");
    let again = ok(
        &mut s,
        Command::CreateStream {
            name: "a".into(),
            config: cfg("text/plain"),
            closed: false,
            initial: Default::default(),
            now_ms: 7,
        },
    );
    assert_eq!(
        again,
        Outcome::Created {
            stream_id: id,
            created: false
        }
    );
    let e = err(
        &mut s,
        Command::CreateStream {
            name: "a".into(),
            config: cfg("application/json"),
            closed: false,
            initial: Default::default(),
            now_ms: 7,
        },
    );
    assert!(matches!(e, ApplyError::Conflict { .. }));
    let e = err(
        &mut s,
        Command::CreateStream {
            name: "a".into(),
            config: cfg("text/plain"),
            closed: true,
            initial: Default::default(),
            now_ms: 7,
        },
    );
    assert!(matches!(e, ApplyError::Conflict { ref reason, .. } if reason.contains("closed")));
    let b = create(&mut s, "b");
    assert_ne!(id, b);
    let (entry, meta) = s.stream_by_name("a").unwrap();
    assert_eq!(
        (entry.stream_id, meta.epoch, entry.created_at_ms),
        (id, -1, 5)
    );
}

#[test]
fn open_requires_current_node_epoch_and_bumps_epoch() {
    let (mut s, id) = setup();
    assert_eq!(
        err(
            &mut s,
            Command::OpenStream {
                stream_id: id,
                node_id: 1,
                node_epoch: 0
            }
        ),
        ApplyError::StaleNodeEpoch {
            node_id: 1,
            given: 0,
            current: 1
        }
    );
    assert_eq!(
        err(
            &mut s,
            Command::OpenStream {
                stream_id: id,
                node_id: 2,
                node_epoch: 1
            }
        ),
        ApplyError::UnknownNode { node_id: 2 }
    );
    assert_eq!(
        err(
            &mut s,
            Command::OpenStream {
                stream_id: 99,
                node_id: 1,
                node_epoch: 1
            }
        ),
        ApplyError::StreamNotFound { stream_id: 99 }
    );
    register(&mut s, 2, 1);
    let open = |node_id, node_epoch| Command::OpenStream {
        stream_id: id,
        node_id,
        node_epoch,
    };
    // Node 1 owns it: its acknowledged tail may sit only in its WAL, so node 2 may not take
    // it by bumping the epoch, live or restarted (the new process recovers that WAL).
    assert_eq!(
        err(&mut s, open(2, 1)),
        ApplyError::OwnedElsewhere {
            stream_id: id,
            owner_node_id: 1
        }
    );
    register(&mut s, 1, 2);
    assert!(matches!(
        err(&mut s, open(2, 1)),
        ApplyError::OwnedElsewhere { .. }
    ));
    // The owner node's new process reopens it: the epoch bump fences the old one's commits.
    assert!(matches!(
        ok(&mut s, open(1, 2)),
        Outcome::Opened { epoch: 1, .. }
    ));
    assert_eq!(
        commit(&mut s, (1, 2), "k0", vec![range(id, 0, 0, 5)]),
        vec![false]
    );
    // Released by its owner, it opens anywhere.
    ok(
        &mut s,
        Command::ReleaseStream {
            stream_id: id,
            epoch: 1,
            node_id: 1,
            node_epoch: 2,
        },
    );
    assert!(matches!(
        ok(&mut s, open(2, 1)),
        Outcome::Opened { epoch: 2, .. }
    ));
    assert_eq!(
        commit(&mut s, (1, 2), "k1", vec![range(id, 1, 0, 5)]),
        vec![false]
    );
    assert_eq!(
        commit(&mut s, (2, 1), "k2", vec![range(id, 2, 0, 5)]),
        vec![true]
    );
}

#[test]
fn release_requires_owner_and_epoch() {
    let (mut s, id) = setup();
    register(&mut s, 2, 1);
    assert_eq!(
        err(
            &mut s,
            Command::ReleaseStream {
                stream_id: id,
                epoch: 0,
                node_id: 2,
                node_epoch: 1
            }
        ),
        ApplyError::NotOwner { stream_id: id }
    );
    assert_eq!(
        err(
            &mut s,
            Command::ReleaseStream {
                stream_id: id,
                epoch: 5,
                node_id: 1,
                node_epoch: 1
            }
        ),
        ApplyError::StaleStreamEpoch {
            stream_id: id,
            given: 5,
            current: 0
        }
    );
    assert_eq!(
        ok(
            &mut s,
            Command::ReleaseStream {
                stream_id: id,
                epoch: 0,
                node_id: 1,
                node_epoch: 1
            }
        ),
        Outcome::Released
    );
    assert_eq!(s.stream(id).unwrap().owner, None);
    // Unowned: commits are refused.
    assert_eq!(
        commit(&mut s, (1, 1), "k", vec![range(id, 0, 0, 1)]),
        vec![false]
    );
}

#[test]
fn commit_accepts_only_tail_ranges_of_owned_streams() {
    let (mut s, id) = setup();
    let other = create(&mut s, "b"); // never opened
    let acc = commit(
        &mut s,
        (1, 1),
        "k1",
        vec![
            range(id, 0, 0, 3),
            range(id, 0, 3, 7),
            range(id, 0, 9, 10),
            range(other, -1, 0, 2),
            range(id, -1, 7, 8),
        ],
    );
    assert_eq!(acc, vec![true, true, false, false, false]);
    let m = s.stream(id).unwrap();
    assert_eq!(m.end_offset, 7);
    assert_eq!(m.slices.len(), 2);
    assert_eq!(m.producers["p1"].seq, 7);
    // Where the producer's last append lies, for answering its retry.
    let p = m.producers["p1"];
    assert_eq!((p.start_offset, p.end_offset), (3, 7));
    assert_eq!(s.objects["k1"].live_refs, 2);
    // Stale node epoch: the whole command is rejected.
    register(&mut s, 1, 2);
    assert_eq!(
        err(
            &mut s,
            Command::CommitObject {
                node_id: 1,
                node_epoch: 1,
                key: "k2".into(),
                size: 1,
                ranges: vec![range(id, 0, 7, 8)],
                now_ms: 0
            }
        ),
        ApplyError::StaleNodeEpoch {
            node_id: 1,
            given: 1,
            current: 2
        }
    );
    // The same key twice is refused (a retried commit cannot apply twice).
    assert!(matches!(
        err(
            &mut s,
            Command::CommitObject {
                node_id: 1,
                node_epoch: 2,
                key: "k1".into(),
                size: 1,
                ranges: vec![],
                now_ms: 0
            }
        ),
        ApplyError::Invalid(_)
    ));
    // Nothing accepted: the object is destroyed at once.
    assert_eq!(
        commit(&mut s, (1, 2), "k3", vec![range(id, 0, 0, 1)]),
        vec![false]
    );
    assert!(s.destroyed.contains("k3"));
}

#[test]
fn slices_from_uses_offsets() {
    let (mut s, id) = setup();
    commit(&mut s, (1, 1), "k1", vec![range(id, 0, 0, 3)]);
    commit(&mut s, (1, 1), "k2", vec![range(id, 0, 3, 7)]);
    commit(&mut s, (1, 1), "k3", vec![range(id, 0, 7, 9)]);
    let keys = |v: Vec<pico_metadata::Slice>| v.into_iter().map(|x| x.key).collect::<Vec<_>>();
    assert_eq!(keys(s.slices_from(id, 0, 10)), ["k1", "k2", "k3"]);
    assert_eq!(keys(s.slices_from(id, 3, 10)), ["k2", "k3"]);
    assert_eq!(keys(s.slices_from(id, 6, 1)), ["k2"]);
    assert_eq!(keys(s.slices_from(id, 9, 10)), Vec::<String>::new());
    assert!(s.slices_from(42, 0, 10).is_empty());
}

#[test]
fn trim_drops_whole_slices_and_releases_objects() {
    let (mut s, id) = setup();
    commit(&mut s, (1, 1), "k1", vec![range(id, 0, 0, 3)]);
    commit(&mut s, (1, 1), "k2", vec![range(id, 0, 3, 7)]);
    assert_eq!(
        ok(
            &mut s,
            Command::Trim {
                stream_id: id,
                start_offset: 4
            }
        ),
        Outcome::Trimmed { start_offset: 4 }
    );
    assert_eq!(s.stream(id).unwrap().slices.len(), 1);
    assert!(s.destroyed.contains("k1"));
    // Never moves backwards.
    assert_eq!(
        ok(
            &mut s,
            Command::Trim {
                stream_id: id,
                start_offset: 1
            }
        ),
        Outcome::Trimmed { start_offset: 4 }
    );
    // Trim ahead of committed data (WAL tail); a later commit wholly below is accepted but dropped.
    ok(
        &mut s,
        Command::Trim {
            stream_id: id,
            start_offset: 12,
        },
    );
    assert!(s.destroyed.contains("k2"));
    assert_eq!(
        commit(&mut s, (1, 1), "k3", vec![range(id, 0, 7, 10)]),
        vec![true]
    );
    assert_eq!(s.stream(id).unwrap().end_offset, 10);
    assert!(s.stream(id).unwrap().slices.is_empty());
    assert!(s.destroyed.contains("k3"));
    assert_eq!(
        commit(&mut s, (1, 1), "k4", vec![range(id, 0, 10, 14)]),
        vec![true]
    );
    assert_eq!(s.objects["k4"].live_refs, 1);
}

#[test]
fn seal_is_idempotent_and_stops_commits_past_close() {
    let (mut s, id) = setup();
    commit(&mut s, (1, 1), "k1", vec![range(id, 0, 0, 3)]);
    assert!(matches!(
        err(
            &mut s,
            Command::SealStream {
                stream_id: id,
                closed_at: 2,
                producer: None,
                now_ms: 1
            }
        ),
        ApplyError::Invalid(_)
    ));
    let p = ProducerMark {
        id: "p1".into(),
        epoch: 0,
        seq: 9,
        start_offset: 5,
        end_offset: 5,
    };
    assert_eq!(
        ok(
            &mut s,
            Command::SealStream {
                stream_id: id,
                closed_at: 5,
                producer: Some(p.clone()),
                now_ms: 1
            }
        ),
        Outcome::Sealed { closed_at: 5 }
    );
    assert_eq!(
        ok(
            &mut s,
            Command::SealStream {
                stream_id: id,
                closed_at: 8,
                producer: None,
                now_ms: 1
            }
        ),
        Outcome::Sealed { closed_at: 5 }
    );
    let (e, _) = s.stream_by_name("a").unwrap();
    assert_eq!(
        (e.closed, e.closed_at, e.closed_by.clone()),
        (true, Some(5), Some(Box::new(p)))
    );
    // WAL data up to the close point still commits; nothing beyond.
    assert_eq!(
        commit(&mut s, (1, 1), "k2", vec![range(id, 0, 3, 6)]),
        vec![false]
    );
    assert_eq!(
        commit(&mut s, (1, 1), "k3", vec![range(id, 0, 3, 5)]),
        vec![true]
    );
}

#[test]
fn delete_frees_name_and_objects() {
    let (mut s, id) = setup();
    commit(&mut s, (1, 1), "k1", vec![range(id, 0, 0, 3)]);
    assert_eq!(
        err(
            &mut s,
            Command::DeleteStream {
                name: "zz".into(),
                stream_id: id
            }
        ),
        ApplyError::NameNotFound { name: "zz".into() }
    );
    assert!(matches!(
        err(
            &mut s,
            Command::DeleteStream {
                name: "a".into(),
                stream_id: id + 1
            }
        ),
        ApplyError::Conflict { .. }
    ));
    assert_eq!(
        ok(
            &mut s,
            Command::DeleteStream {
                name: "a".into(),
                stream_id: id
            }
        ),
        Outcome::Deleted
    );
    assert!(s.stream_by_name("a").is_none());
    assert!(s.stream(id).is_none());
    assert!(s.destroyed.contains("k1"));
    // The name is reusable at once, with a new id.
    let again = create(&mut s, "a");
    assert_ne!(again, id);
    assert_eq!(
        err(
            &mut s,
            Command::Trim {
                stream_id: id,
                start_offset: 1
            }
        ),
        ApplyError::StreamNotFound { stream_id: id }
    );
    // Forget: only unreferenced objects; idempotent.
    assert_eq!(
        ok(&mut s, Command::ForgetObject { key: "k1".into() }),
        Outcome::Forgotten
    );
    assert!(!s.objects.contains_key("k1") && s.destroyed.is_empty());
    assert_eq!(
        ok(&mut s, Command::ForgetObject { key: "k1".into() }),
        Outcome::Forgotten
    );
}

#[test]
fn forget_refuses_live_objects() {
    let (mut s, id) = setup();
    commit(&mut s, (1, 1), "k1", vec![range(id, 0, 0, 3)]);
    assert!(matches!(
        err(&mut s, Command::ForgetObject { key: "k1".into() }),
        ApplyError::Invalid(_)
    ));
}

#[test]
fn touch_kv_and_list() {
    let (mut s, id) = setup();
    ok(
        &mut s,
        Command::Touch {
            stream_id: id,
            now_ms: 100,
        },
    );
    ok(
        &mut s,
        Command::Touch {
            stream_id: id,
            now_ms: 50,
        },
    );
    assert_eq!(s.stream_by_name("a").unwrap().0.last_touch_ms, 100);
    ok(
        &mut s,
        Command::KvPut {
            key: "t".into(),
            value: vec![1, 2],
        },
    );
    assert_eq!(s.kv["t"], vec![1, 2]);
    ok(&mut s, Command::KvDelete { key: "t".into() });
    assert!(s.kv.is_empty());
    for n in ["logs/a", "logs/b", "logs/c", "m"] {
        create(&mut s, n);
    }
    let names = |v: Vec<(&str, &pico_metadata::RegistryEntry)>| {
        v.into_iter()
            .map(|(n, _)| n.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(s.list("logs/", None, 10)),
        ["logs/a", "logs/b", "logs/c"]
    );
    assert_eq!(names(s.list("logs/", Some("logs/a"), 1)), ["logs/b"]);
    assert_eq!(names(s.list("", Some("logs/c"), 10)), ["m"]);
    assert_eq!(names(s.list("", None, 10)).len(), 5);
}

fn fork_cmd(name: &str, source: &str, source_id: u64, at: u64) -> Command {
    Command::ForkStream {
        name: name.into(),
        origin: ForkOrigin {
            source: source.into(),
            source_stream_id: source_id,
            offset: at,
            sub_offset: 0,
        },
        inherit_end: at,
        offset_given: true,
        config: cfg("text/plain"),
        closed: false,
        initial: Default::default(),
        now_ms: 7,
    }
}

fn created_id(o: Outcome) -> u64 {
    match o {
        Outcome::Created {
            stream_id,
            created: true,
        } => stream_id,
        o => panic!("unexpected {o:?}"),
    }
}

#[test]
fn fork_shares_slices_cut_at_the_fork_point() {
    let (mut s, a) = setup();
    commit(&mut s, (1, 1), "k1", vec![range(a, 0, 0, 4)]);
    commit(&mut s, (1, 1), "k2", vec![range(a, 0, 4, 10)]);
    // Beyond committed data: rejected (the node flushes first).
    assert!(matches!(
        err(&mut s, fork_cmd("f", "a", a, 11)),
        ApplyError::Invalid(_)
    ));
    let f = created_id(ok(&mut s, fork_cmd("f", "a", a, 6)));
    let m = &s.streams[&f];
    assert_eq!((m.start_offset, m.end_offset, m.epoch), (0, 6, -1));
    let ends: Vec<(u64, u64)> = m
        .slices
        .iter()
        .map(|x| (x.start_offset, x.end_offset))
        .collect();
    assert_eq!(ends, vec![(0, 4), (4, 6)]);
    assert!(m.producers.is_empty() && m.stream_seq.is_none());
    assert_eq!(s.objects["k1"].live_refs, 2);
    assert_eq!(s.objects["k2"].live_refs, 2);
    assert_eq!(s.registry["a"].forks, 1);
    // Idempotent: same fork → existing; another offset → conflict; default offset matches.
    assert_eq!(
        ok(&mut s, fork_cmd("f", "a", a, 6)),
        Outcome::Created {
            stream_id: f,
            created: false
        }
    );
    assert!(matches!(
        err(&mut s, fork_cmd("f", "a", a, 5)),
        ApplyError::Conflict { .. }
    ));
    let mut default_offset = fork_cmd("f", "a", a, 9);
    if let Command::ForkStream { offset_given, .. } = &mut default_offset {
        *offset_given = false;
    }
    assert!(matches!(
        ok(&mut s, default_offset),
        Outcome::Created { created: false, .. }
    ));
    // A missing or mismatched source.
    assert!(matches!(
        err(&mut s, fork_cmd("g", "nope", a, 0)),
        ApplyError::NameNotFound { .. }
    ));
    assert!(matches!(
        err(&mut s, fork_cmd("g", "a", a + 100, 0)),
        ApplyError::NameNotFound { .. }
    ));
}

#[test]
fn delete_with_forks_soft_deletes_and_the_last_fork_cascades() {
    let (mut s, a) = setup();
    commit(&mut s, (1, 1), "k1", vec![range(a, 0, 0, 4)]);
    let b = created_id(ok(&mut s, fork_cmd("b", "a", a, 4)));
    let c = created_id(ok(&mut s, fork_cmd("c", "b", b, 4)));
    assert_eq!(s.objects["k1"].live_refs, 3);

    // a and b are referenced: soft delete keeps the names, releases their data.
    let del = |name: &str, stream_id| Command::DeleteStream {
        name: name.into(),
        stream_id,
    };
    assert_eq!(ok(&mut s, del("a", a)), Outcome::SoftDeleted);
    assert_eq!(ok(&mut s, del("b", b)), Outcome::SoftDeleted);
    assert!(s.registry["a"].soft_deleted && s.registry["b"].soft_deleted);
    assert!(!s.streams.contains_key(&a) && !s.streams.contains_key(&b));
    assert_eq!(
        s.objects["k1"].live_refs, 1,
        "only the leaf fork still reads k1"
    );
    assert!(s.stream_by_name("a").is_none());
    assert!(s.list("", None, 10).iter().all(|(n, _)| *n == "c"));
    // Deleting again, re-creating or forking a soft-deleted stream is refused.
    assert!(matches!(
        err(&mut s, del("a", a)),
        ApplyError::StreamDeleted { .. }
    ));
    assert!(matches!(
        err(
            &mut s,
            Command::CreateStream {
                name: "a".into(),
                config: cfg("text/plain"),
                closed: false,
                initial: Default::default(),
                now_ms: 1
            }
        ),
        ApplyError::Conflict { .. }
    ));
    assert!(matches!(
        err(&mut s, fork_cmd("d", "b", b, 0)),
        ApplyError::Conflict { .. }
    ));

    // The last fork goes: the whole chain is removed and the object destroyed.
    assert_eq!(ok(&mut s, del("c", c)), Outcome::Deleted);
    assert!(s.registry.is_empty());
    assert_eq!(s.objects["k1"].live_refs, 0);
    assert!(s.destroyed.contains("k1"));
}

#[test]
fn stream_seq_is_committed_with_data() {
    let (mut s, a) = setup();
    let mut r = range(a, 0, 0, 2);
    r.stream_seq = Some("009".into());
    commit(&mut s, (1, 1), "k1", vec![r]);
    commit(&mut s, (1, 1), "k2", vec![range(a, 0, 2, 3)]);
    assert_eq!(s.streams[&a].stream_seq.as_deref(), Some("009"));
}

#[test]
fn streams_share_their_content_type_across_snapshots() {
    let mut s = State::new();
    create(&mut s, "a");
    create(&mut s, "b");
    let ct = |s: &State, n: &str| s.registry[n].config.content_type.clone();
    assert!(std::sync::Arc::ptr_eq(&ct(&s, "a"), &ct(&s, "b")));
    let restored = pico_metadata::codec::decode_state(&pico_metadata::codec::encode_state(&s))
        .expect("snapshot decodes");
    assert_eq!(restored, s);
    assert!(std::sync::Arc::ptr_eq(
        &ct(&restored, "a"),
        &ct(&restored, "b")
    ));
}

#[test]
fn content_type_sharing_is_capped() {
    use pico_metadata::state::ContentTypes;
    use std::sync::Arc;
    let mut c = ContentTypes::default();
    let first: Arc<str> = "t/0".into();
    assert!(Arc::ptr_eq(&c.intern(&first), &first));
    assert!(Arc::ptr_eq(&c.intern(&"t/0".into()), &first), "shared");
    for i in 1..ContentTypes::MAX + 10 {
        c.intern(&format!("t/{i}").into());
    }
    let late: Arc<str> = format!("t/{}", ContentTypes::MAX + 1).into();
    assert!(Arc::ptr_eq(&c.intern(&late), &late));
    assert!(
        !Arc::ptr_eq(&c.intern(&late.to_string().into()), &late),
        "past the cap a type is not remembered"
    );
    assert!(Arc::ptr_eq(&c.intern(&"t/0".into()), &first), "kept");
}

/// Each stream's name is held once: `StreamMeta::name` and the registry key are one
/// allocation, after a create and after a snapshot round trip (RSS per idle stream).
#[test]
fn a_stream_name_is_one_allocation_shared_by_the_registry_and_the_stream() {
    let mut s = State::new();
    let a = create(&mut s, "orders/42");
    let b = create(&mut s, "orders/43");
    let shared = |s: &State, id: u64| {
        let m = &s.streams[&id];
        let (key, _) = s.registry.get_key_value(&*m.name).expect("registered");
        std::sync::Arc::ptr_eq(key, &m.name)
    };
    assert!(shared(&s, a) && shared(&s, b));
    let restored = pico_metadata::codec::decode_state(&pico_metadata::codec::encode_state(&s))
        .expect("decodes");
    assert_eq!(restored, s);
    assert!(shared(&restored, a) && shared(&restored, b));
}

#[test]
fn producers_silent_for_the_ttl_are_forgotten_once_the_map_grows() {
    use pico_metadata::state::{PRODUCER_PRUNE_MIN, PRODUCER_TTL_MS};
    let (mut s, id) = setup();
    let mut end = 0;
    let mut commit_at = |s: &mut State, key: &str, ids: Vec<String>, now_ms: i64| {
        let mut r = range(id, 0, end, end + 1);
        end += 1;
        r.producers = ids
            .into_iter()
            .map(|id| ProducerMark {
                id,
                epoch: 0,
                seq: 0,
                start_offset: end - 1,
                end_offset: end,
            })
            .collect();
        let c = Command::CommitObject {
            node_id: 1,
            node_epoch: 1,
            key: key.into(),
            size: 1,
            ranges: vec![r],
            now_ms,
        };
        assert_eq!(
            ok(s, c),
            Outcome::Committed {
                accepted: vec![true]
            }
        );
    };
    // The server's own claim (a NUL-prefixed id) is as old as the rest but never forgotten.
    let old: Vec<String> = (0..PRODUCER_PRUNE_MIN - 3)
        .map(|i| format!("old{i}"))
        .chain(["\u{0}initial".to_string()])
        .collect();
    commit_at(&mut s, "k0", old, 10);
    commit_at(
        &mut s,
        "k1",
        vec!["recent".into()],
        10 + PRODUCER_TTL_MS - 1,
    );
    // One short of the minimum: nothing is pruned, however old.
    assert_eq!(
        s.stream(id).unwrap().producers.len(),
        PRODUCER_PRUNE_MIN - 1
    );
    commit_at(&mut s, "k2", vec!["new".into()], 10 + PRODUCER_TTL_MS);
    let m = s.stream(id).unwrap();
    let left: Vec<&str> = m.producers.keys().map(String::as_str).collect();
    assert_eq!(left, ["\u{0}initial", "new", "recent"]);
    assert_eq!(m.producers["recent"].last_ms, 10 + PRODUCER_TTL_MS - 1);
    // A known producer committing again does not grow the map, so no pass runs.
    assert!(!pico_metadata::state::producer_prune_due(2, 2));
}

#[test]
fn a_fork_created_closed_compares_closed_like_a_create() {
    let (mut s, a) = setup();
    commit(&mut s, (1, 1), "k1", vec![range(a, 0, 0, 4)]);
    let closed = |mut c: Command| {
        if let Command::ForkStream { closed, .. } = &mut c {
            *closed = true;
        }
        c
    };
    let f = created_id(ok(&mut s, closed(fork_cmd("f", "a", a, 4))));
    assert!(s.registry["f"].closed);
    assert_eq!(
        s.registry["f"].closed_at,
        Some(4),
        "closed at the fork point"
    );
    assert_eq!(
        ok(&mut s, closed(fork_cmd("f", "a", a, 4))),
        Outcome::Created {
            stream_id: f,
            created: false
        }
    );
    assert!(matches!(
        err(&mut s, fork_cmd("f", "a", a, 4)),
        ApplyError::Conflict { .. }
    ));
    // And an open fork is not made closed by a closed retry.
    created_id(ok(&mut s, fork_cmd("g", "a", a, 4)));
    assert!(matches!(
        err(&mut s, closed(fork_cmd("g", "a", a, 4))),
        ApplyError::Conflict { .. }
    ));
}

/// `KvInit` fixes a value once: the first of racing writers wins, the others are refused
/// (two nodes starting at once on an empty log with different cluster ids).
#[test]
fn kv_init_stores_once_and_refuses_another_value() {
    let mut s = State::new();
    let init = |v: &str| Command::KvInit {
        key: "cluster/id".into(),
        value: v.as_bytes().to_vec(),
    };
    assert_eq!(ok(&mut s, init("alpha")), Outcome::KvDone);
    assert_eq!(ok(&mut s, init("alpha")), Outcome::KvDone);
    assert!(matches!(
        err(&mut s, init("beta")),
        ApplyError::Conflict { .. }
    ));
    assert_eq!(s.kv["cluster/id"], b"alpha".to_vec());
}

// ---- transfers (docs/design/transfer.md) ----

fn transfer(stream_id: u64, to_node: u32) -> Command {
    Command::TransferStream {
        stream_id,
        to_node,
        now_ms: 100,
    }
}

fn complete(stream_id: u64, epoch: i64, node: (u32, u64), to_node: u32) -> Command {
    Command::CompleteTransfer {
        stream_id,
        epoch,
        node_id: node.0,
        node_epoch: node.1,
        to_node,
        now_ms: 200,
    }
}

/// The whole handoff: requested at the owner's epoch, completed by the owner (releasing it with
/// a hint naming the target), ended by the target's open at the next epoch; committed data and
/// producer state are the stream's, so they carry over untouched.
#[test]
fn transfer_is_requested_completed_by_the_owner_and_ended_by_the_open() {
    let (mut s, id) = setup();
    register(&mut s, 2, 7);
    let mut r = range(id, 0, 0, 3);
    r.producers = vec![ProducerMark {
        id: "p".into(),
        epoch: 0,
        seq: 2,
        start_offset: 2,
        end_offset: 3,
    }];
    commit(&mut s, (1, 1), "k1", vec![r]);
    let owner = s.streams[&id].owner;
    assert_eq!(
        ok(&mut s, transfer(id, 2)),
        Outcome::TransferRequested {
            from: owner,
            epoch: 0,
            released: false
        }
    );
    let t = s.transfers[&id];
    assert!(t.pending_on(&s.streams[&id]));
    assert_eq!(t.released_ms, None);
    // Only the owner, at its epochs, for the recorded target.
    assert!(matches!(
        err(&mut s, complete(id, 0, (2, 7), 2)),
        ApplyError::NotOwner { .. }
    ));
    assert!(matches!(
        err(&mut s, complete(id, 0, (1, 1), 3)),
        ApplyError::Invalid(_)
    ));
    assert!(matches!(
        err(&mut s, complete(id, 1, (1, 1), 2)),
        ApplyError::StaleStreamEpoch { .. }
    ));
    assert_eq!(ok(&mut s, complete(id, 0, (1, 1), 2)), Outcome::Released);
    assert_eq!(s.streams[&id].owner, None);
    assert_eq!(s.transfers[&id].released_ms, Some(200));
    // Once released there is nothing left to complete.
    assert!(matches!(
        err(&mut s, complete(id, 0, (1, 1), 2)),
        ApplyError::NotOwner { .. }
    ));
    let opened = ok(
        &mut s,
        Command::OpenStream {
            stream_id: id,
            node_id: 2,
            node_epoch: 7,
        },
    );
    assert_eq!(
        opened,
        Outcome::Opened {
            epoch: 1,
            start_offset: 0,
            end_offset: 3
        }
    );
    assert!(s.transfers.is_empty(), "the target's open ends it");
    assert_eq!(s.streams[&id].producers["p"].seq, 2);
}

/// Rejections: unknown stream or target, a target that already owns it, a second transfer
/// while one is under way. A transfer the source never finished is superseded by any open
/// (its epoch moves on), after which a new one may start.
#[test]
fn transfer_rejections_and_supersession() {
    let (mut s, id) = setup();
    register(&mut s, 2, 7);
    assert!(matches!(
        err(&mut s, transfer(99, 2)),
        ApplyError::StreamNotFound { .. }
    ));
    assert!(matches!(
        err(&mut s, transfer(id, 5)),
        ApplyError::UnknownNode { node_id: 5 }
    ));
    assert!(matches!(
        err(&mut s, transfer(id, 1)),
        ApplyError::Conflict { .. }
    ));
    ok(&mut s, transfer(id, 2));
    let e = err(&mut s, transfer(id, 2));
    assert!(
        matches!(&e, ApplyError::Conflict { reason, .. } if reason.contains("under way")),
        "{e}"
    );
    // The source gave up and reopened: the pending transfer is over.
    ok(
        &mut s,
        Command::OpenStream {
            stream_id: id,
            node_id: 1,
            node_epoch: 1,
        },
    );
    assert!(s.transfers.is_empty());
    assert!(matches!(
        err(&mut s, complete(id, 0, (1, 1), 2)),
        ApplyError::StaleStreamEpoch { .. }
    ));
    ok(&mut s, transfer(id, 2));
    // Deleting the stream ends a transfer too.
    ok(
        &mut s,
        Command::DeleteStream {
            name: "a".into(),
            stream_id: id,
        },
    );
    assert!(s.transfers.is_empty());
}

/// A stream nobody owns has nothing to drain: released for the target at once. A released
/// transfer is only a hint, so another request replaces it.
#[test]
fn transfer_of_an_unowned_stream_is_released_at_once() {
    let mut s = State::new();
    register(&mut s, 1, 1);
    register(&mut s, 2, 1);
    let id = create(&mut s, "u");
    assert_eq!(
        ok(&mut s, transfer(id, 2)),
        Outcome::TransferRequested {
            from: None,
            epoch: -1,
            released: true
        }
    );
    assert_eq!(s.transfers[&id].released_ms, Some(100));
    ok(&mut s, transfer(id, 1));
    assert_eq!(s.transfers[&id].to_node, 1);
}

/// Transfers, pending or released, survive a snapshot.
#[test]
fn transfers_round_trip_through_snapshots() {
    use pico_metadata::codec::{decode_state, encode_state};
    let (mut s, id) = setup();
    register(&mut s, 2, 7);
    assert_eq!(decode_state(&encode_state(&s)).unwrap(), s);
    ok(&mut s, transfer(id, 2));
    assert_eq!(decode_state(&encode_state(&s)).unwrap(), s);
    ok(&mut s, complete(id, 0, (1, 1), 2));
    assert_eq!(decode_state(&encode_state(&s)).unwrap(), s);
}

/// Failover at the metadata level: the fence is a compare-and-set on the lapsed heartbeat, it
/// locks the zombie out of every node-scoped command, lets the fencer commit the zombie's WAL
/// tail at the stream's current epoch, and only then releases its streams for a reopen at
/// epoch + 1. A registration of the node afterwards ends the fenced state.
#[test]
fn fence_commits_on_behalf_and_releases_the_fenced_incarnations_streams() {
    let (mut s, id) = setup();
    register(&mut s, 2, 7);
    let fence = |hb: i64, by_epoch: u64| Command::FenceNode {
        node_id: 1,
        node_epoch: 1,
        last_heartbeat_ms: hb,
        by_node_id: 2,
        by_node_epoch: by_epoch,
    };
    // A stale fencer, a stale view of the heartbeat, a node fencing itself: refused.
    assert!(matches!(
        err(&mut s, fence(1, 6)),
        ApplyError::StaleNodeEpoch { node_id: 2, .. }
    ));
    ok(
        &mut s,
        Command::Heartbeat {
            node_id: 1,
            node_epoch: 1,
            now_ms: 50,
        },
    );
    assert!(matches!(err(&mut s, fence(1, 7)), ApplyError::Invalid(_)));
    assert!(matches!(
        err(
            &mut s,
            Command::FenceNode {
                node_id: 2,
                node_epoch: 7,
                last_heartbeat_ms: 1,
                by_node_id: 2,
                by_node_epoch: 7,
            }
        ),
        ApplyError::Invalid(_)
    ));
    // Releasing before the fence: refused (not a fenced incarnation).
    let release = Command::ReleaseFenced {
        node_id: 1,
        node_epoch: 1,
        by_node_id: 2,
        by_node_epoch: 7,
    };
    assert!(matches!(
        err(&mut s, release.clone()),
        ApplyError::Invalid(_)
    ));
    // Node 2 may not commit to node 1's stream while node 1 is live.
    assert_eq!(
        commit(&mut s, (2, 7), "early", vec![range(id, 0, 0, 2)]),
        vec![false]
    );

    assert_eq!(ok(&mut s, fence(50, 7)), Outcome::NodeFenced);
    // Fenced but not yet released: its WAL is still being committed, so no open elsewhere.
    assert!(matches!(
        err(
            &mut s,
            Command::OpenStream {
                stream_id: id,
                node_id: 2,
                node_epoch: 7,
            }
        ),
        ApplyError::OwnedElsewhere { .. }
    ));
    assert_eq!(s.nodes[&1].epoch, 2);
    assert_eq!(s.nodes[&1].fenced_epoch, Some(1));
    assert!(matches!(
        err(&mut s, fence(50, 7)),
        ApplyError::StaleNodeEpoch { .. }
    ));
    pico_metadata::invariants::check(&s).unwrap();
    // The zombie: heartbeats, commits, opens and releases rejected.
    for c in [
        Command::Heartbeat {
            node_id: 1,
            node_epoch: 1,
            now_ms: 60,
        },
        Command::CommitObject {
            node_id: 1,
            node_epoch: 1,
            key: "zombie".into(),
            size: 1,
            ranges: vec![range(id, 0, 0, 1)],
            now_ms: 60,
        },
        Command::OpenStream {
            stream_id: id,
            node_id: 1,
            node_epoch: 1,
        },
        Command::ReleaseStream {
            stream_id: id,
            epoch: 0,
            node_id: 1,
            node_epoch: 1,
        },
    ] {
        assert!(matches!(err(&mut s, c), ApplyError::StaleNodeEpoch { .. }));
    }
    // The fencer commits the recovered tail at the stream's current epoch, as the owner would.
    assert_eq!(
        commit(&mut s, (2, 7), "recovered", vec![range(id, 0, 0, 3)]),
        vec![true]
    );
    assert_eq!(s.streams[&id].end_offset, 3);
    assert_eq!(
        ok(&mut s, release.clone()),
        Outcome::ReleasedFenced { streams: 1 }
    );
    assert_eq!(s.streams[&id].owner, None);
    // Released: nobody commits at the old epoch any more; the next open bumps it.
    assert_eq!(
        commit(&mut s, (2, 7), "late", vec![range(id, 0, 3, 4)]),
        vec![false]
    );
    assert!(matches!(
        ok(
            &mut s,
            Command::OpenStream {
                stream_id: id,
                node_id: 2,
                node_epoch: 7,
            }
        ),
        Outcome::Opened {
            epoch: 1,
            end_offset: 3,
            ..
        }
    ));
    pico_metadata::invariants::check(&s).unwrap();
    // The node comes back: a higher epoch than the fence's placeholder, not fenced any more.
    assert!(matches!(
        err(
            &mut s,
            Command::RegisterNode {
                node_id: 1,
                node_epoch: 2,
                address: "n1".into(),
                now_ms: 70,
            }
        ),
        ApplyError::StaleNodeEpoch { .. }
    ));
    // Replacing a fenced incarnation: nothing of it can still acknowledge.
    assert_eq!(
        register(&mut s, 1, 3),
        Outcome::NodeRegistered {
            replaced_unfenced: None
        }
    );
    assert_eq!(s.nodes[&1].fenced_epoch, None);
    assert!(matches!(err(&mut s, release), ApplyError::Invalid(_)));
    // The fenced state survives a snapshot.
    let mut f = s.clone();
    ok(
        &mut f,
        Command::FenceNode {
            node_id: 1,
            node_epoch: 3,
            last_heartbeat_ms: 1,
            by_node_id: 2,
            by_node_epoch: 7,
        },
    );
    let back = pico_metadata::codec::decode_state(&pico_metadata::codec::encode_state(&f)).unwrap();
    assert_eq!(back, f);
    assert_eq!(back.nodes[&1].fenced_epoch, Some(3));
}

/// A node that restarted still owns streams under its previous incarnation until it reopens
/// them; when the new incarnation is fenced, failover committed the node's whole WAL, so
/// releasing frees those streams too (nothing else could: no other node may open them).
#[test]
fn release_fenced_frees_the_streams_of_earlier_incarnations_too() {
    let (mut s, a) = setup();
    register(&mut s, 2, 7);
    register(&mut s, 1, 2);
    let b = create(&mut s, "b");
    ok(
        &mut s,
        Command::OpenStream {
            stream_id: b,
            node_id: 1,
            node_epoch: 2,
        },
    );
    let hb = s.nodes[&1].last_heartbeat_ms;
    ok(
        &mut s,
        Command::FenceNode {
            node_id: 1,
            node_epoch: 2,
            last_heartbeat_ms: hb,
            by_node_id: 2,
            by_node_epoch: 7,
        },
    );
    assert_eq!(
        ok(
            &mut s,
            Command::ReleaseFenced {
                node_id: 1,
                node_epoch: 2,
                by_node_id: 2,
                by_node_epoch: 7,
            }
        ),
        Outcome::ReleasedFenced { streams: 2 }
    );
    for id in [a, b] {
        assert_eq!(s.streams[&id].owner, None);
        assert!(matches!(
            ok(
                &mut s,
                Command::OpenStream {
                    stream_id: id,
                    node_id: 2,
                    node_epoch: 7,
                }
            ),
            Outcome::Opened { .. }
        ));
    }
}
