//! Property tests: codec round trips, decoding garbage never panics, apply keeps invariants,
//! and snapshot-at-k + replay equals replay from the start (ARCHITECTURE invariant 3).

mod common;

use pico_metadata::codec::{
    decode_command, decode_commands, decode_state, encode_command, encode_commands, encode_state,
};
use pico_metadata::{State, invariants};
use proptest::prelude::*;

fn run(cmds: &[pico_metadata::Command]) -> State {
    let mut s = State::new();
    for c in cmds {
        let _ = s.apply(c);
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn command_round_trips(cmd in common::command()) {
        let bytes = encode_command(&cmd);
        prop_assert_eq!(decode_command(&bytes).unwrap(), cmd);
    }

    #[test]
    fn batch_round_trips(cmds in proptest::collection::vec(common::command(), 0..20)) {
        let bytes = encode_commands(&cmds);
        prop_assert_eq!(decode_commands(&bytes).unwrap(), cmds);
    }

    #[test]
    fn state_round_trips(cmds in common::commands()) {
        let s = run(&cmds);
        let bytes = encode_state(&s);
        prop_assert_eq!(decode_state(&bytes).unwrap(), s);
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_command(&bytes);
        let _ = decode_commands(&bytes);
        let _ = decode_state(&bytes);
        // Also behind a valid version byte, where the decoders get further.
        let mut v = vec![pico_metadata::codec::VERSION];
        v.extend_from_slice(&bytes);
        let _ = decode_command(&v);
        let _ = decode_commands(&v);
        let _ = decode_state(&v);
    }

    #[test]
    fn truncated_or_extended_encodings_are_errors(cmd in common::command(), cut in any::<prop::sample::Index>()) {
        let bytes = encode_command(&cmd);
        let at = cut.index(bytes.len());
        prop_assert!(decode_command(&bytes[..at]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert!(decode_command(&longer).is_err());
    }

    #[test]
    fn apply_keeps_invariants(cmds in common::commands()) {
        let mut s = State::new();
        for (i, c) in cmds.iter().enumerate() {
            let before = s.clone();
            let r = s.apply(c);
            prop_assert_eq!(s.applied_index, i as u64 + 1);
            if r.is_err() {
                // Rejected: only the index moved.
                let mut expect = before;
                expect.applied_index += 1;
                prop_assert_eq!(&s, &expect);
            }
            if let Err(e) = invariants::check(&s) {
                return Err(TestCaseError::fail(format!("after {c:?}: {e}")));
            }
        }
    }

    #[test]
    fn snapshot_plus_replay_equals_full_replay(cmds in common::commands(), k in any::<prop::sample::Index>()) {
        let full = run(&cmds);
        let k = k.index(cmds.len() + 1);
        let snap = encode_state(&run(&cmds[..k]));
        let mut restored = decode_state(&snap).unwrap();
        let mut outcomes_tail = Vec::new();
        for c in &cmds[k..] {
            outcomes_tail.push(restored.apply(c));
        }
        prop_assert_eq!(&restored, &full);
        // Outcomes are deterministic too.
        let mut again = run(&cmds[..k]);
        for (c, o) in cmds[k..].iter().zip(outcomes_tail) {
            prop_assert_eq!(again.apply(c), o);
        }
    }
}

#[test]
fn generator_reaches_committed_slices() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut with_slices = 0;
    for _ in 0..50 {
        let cmds = common::commands().new_tree(&mut runner).unwrap().current();
        let s = run(&cmds);
        if s.streams.values().any(|m| !m.slices.is_empty()) {
            with_slices += 1;
        }
    }
    assert!(
        with_slices > 5,
        "generator rarely commits data: {with_slices}/50"
    );
}

#[test]
fn bad_version_is_reported() {
    let mut bytes = encode_command(&pico_metadata::Command::KvDelete { key: "x".into() });
    bytes[0] = 99;
    assert_eq!(
        decode_command(&bytes),
        Err(pico_metadata::CodecError::UnsupportedVersion(99))
    );
    assert_eq!(decode_state(&[]), Err(pico_metadata::CodecError::Empty));
}
