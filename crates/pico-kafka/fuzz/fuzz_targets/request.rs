//! One request frame (without its length prefix) through the broker's whole request path:
//! version check, the structural pass (`validate`), the `kafka-protocol` decoder and the
//! handler, against an in-memory node. A panic, an abort (an allocation the input cannot
//! back) or libFuzzer's RSS limit fails the run.
//!
//! Input: byte 0 picks an API this listener serves, byte 1 a version of it, the rest follows
//! the api key and version (correlation id, client id, body), so no effort goes to frames
//! refused on their first four bytes. With byte 0 = 0xff the rest is the raw frame instead.
//!
//! `seeds/` holds one valid request per API and version in that form (as pico-kafka's
//! `tests/wire.rs` builds them, one entry in each array), so the fuzzer starts past the decoder.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use pico_kafka::versions::SUPPORTED;
use pico_kafka::{Broker, KafkaOptions};

/// How long one request may take: Fetch and JoinGroup wait by design (Fetch up to its
/// max_wait, JoinGroup for the rebalance), and only the decode path is under test.
const PER_REQUEST: Duration = Duration::from_millis(50);

fn shared() -> &'static (tokio::runtime::Runtime, Broker) {
    static SHARED: OnceLock<(tokio::runtime::Runtime, Broker)> = OnceLock::new();
    SHARED.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let node = rt.block_on(pico_server::testing::start_test_node());
        (rt, Broker::new(node, KafkaOptions::default()))
    })
}

fn frame(data: &[u8]) -> Option<Vec<u8>> {
    let (&pick, rest) = data.split_first()?;
    if pick == 0xff {
        return Some(rest.to_vec());
    }
    let (&vsel, rest) = rest.split_first()?;
    let (key, min, max) = SUPPORTED[pick as usize % SUPPORTED.len()];
    let version = min + (i16::from(vsel) % (max - min + 1));
    let mut f = Vec::with_capacity(4 + rest.len());
    f.extend_from_slice(&(key as i16).to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(rest);
    Some(f)
}

fuzz_target!(|data: &[u8]| {
    let Some(f) = frame(data) else { return };
    let (rt, broker) = shared();
    let _ = rt.block_on(async { tokio::time::timeout(PER_REQUEST, broker.handle(f.into())).await });
});
