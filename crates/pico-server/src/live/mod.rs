//! Live reads, once for every wire protocol: waiting for records past an offset
//! ([`Node::long_poll`]), the live-response cursor ([`Node::live_cursor`]) and the SSE fan-out
//! hub ([`hub`]). The facades only render what these return.

pub mod hub;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pico_protocol::cursor::{MAX_JITTER_INTERVALS, next_cursor};

use crate::api::{ReadFrom, ReadOutcome, ReadRecord, ReadRequest, WaitOutcome};
use crate::error::ReadError;
use crate::node::Node;

/// What one long-poll got.
#[derive(Debug, Clone)]
pub enum LongPoll {
    /// The tail moved: the page read after the wake-up (rarely empty, when the read's view
    /// lagged the durable tail).
    Data(ReadOutcome),
    /// The stream closed with nothing more to read: the read that says so.
    Closed(ReadOutcome),
    /// Nothing happened before the timeout.
    Timeout,
}

impl Node {
    /// Waits until the stream's tail passes `req.from` (an offset), it closes, or `timeout`
    /// elapses, then reads one page with `req`. A stream deleted while waiting is the read's
    /// error (`NotFound` / `Gone`), as for any read.
    pub async fn long_poll(
        &self,
        req: ReadRequest,
        timeout: Duration,
    ) -> Result<LongPoll, ReadError> {
        let from = match req.from {
            ReadFrom::Offset(o) => o,
            ReadFrom::Now => self.head(&req.name).await?.next_seq,
        };
        if self.wait(&req.name, from, timeout).await? == WaitOutcome::Timeout {
            return Ok(LongPoll::Timeout);
        }
        let out = self
            .read(ReadRequest {
                from: ReadFrom::Offset(from),
                ..req
            })
            .await?;
        Ok(if out.records.is_empty() && out.closed {
            LongPoll::Closed(out)
        } else {
            LongPoll::Data(out)
        })
    }

    /// The cursor of a live response (`Pico-Cursor`, DS `Stream-Cursor`) given the client's
    /// echo, at the node's wall time.
    pub fn live_cursor(&self, client: Option<u64>) -> u64 {
        next_cursor(self.now_ms(), client, jitter())
    }
}

/// Record bytes of a read: values, keys and header values.
pub fn payload_len(records: &[ReadRecord]) -> usize {
    records.iter().map(|r| r.record.size()).sum()
}

/// Randomness for cursor jitter without a RNG dependency: sub-second clock noise (only its
/// spread matters, so it is not the node's clock, which a test may hold still).
fn jitter() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    u64::from(nanos) % MAX_JITTER_INTERVALS + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AppendRequest, CreateRequest};
    use crate::config::NodeConfig;
    use crate::testing::start_test_node_with;
    use pico_common::StreamName;
    use pico_common::clock::ManualClock;
    use pico_protocol::cursor::{CURSOR_EPOCH_MS, CURSOR_INTERVAL_MS};

    #[tokio::test]
    async fn cursor_follows_the_node_clock() {
        let clock = ManualClock::new(CURSOR_EPOCH_MS + 5 * CURSOR_INTERVAL_MS + 1);
        let node = start_test_node_with(NodeConfig {
            clock: clock.clone(),
            ..NodeConfig::default()
        })
        .await;
        assert_eq!(node.live_cursor(None), 5);
        assert_eq!(node.live_cursor(Some(3)), 5);
        let ahead = node.live_cursor(Some(5));
        assert!((6..=5 + MAX_JITTER_INTERVALS).contains(&ahead), "{ahead}");
        clock.advance(Duration::from_millis(CURSOR_INTERVAL_MS as u64));
        assert_eq!(node.live_cursor(None), 6);
    }

    fn read_req(name: &StreamName, from: u64) -> ReadRequest {
        ReadRequest {
            name: name.clone(),
            from: ReadFrom::Offset(from),
            max_records: None,
            max_bytes: None,
            touch: false,
        }
    }

    fn append(name: &StreamName, values: &[&str], close: bool) -> AppendRequest {
        AppendRequest {
            name: name.clone(),
            records: values
                .iter()
                .map(|v| pico_protocol::Record::from_value(v.to_string()))
                .collect(),
            producer: None,
            match_seq: None,
            close,
            content_type: None,
        }
    }

    /// Timeout at the tail, the page past the offset once the tail moves, the closing read once
    /// the stream closes, and the read's error once it is deleted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn long_poll_waits_then_reads_one_page() {
        let node = crate::testing::start_test_node().await;
        let name = StreamName::parse("lp").unwrap();
        node.create(CreateRequest {
            name: name.clone(),
            config: Default::default(),
            initial: vec![],
        })
        .await
        .unwrap();
        let short = Duration::from_millis(30);
        assert!(matches!(
            node.long_poll(read_req(&name, 0), short).await.unwrap(),
            LongPoll::Timeout
        ));
        let waiting = {
            let node = node.clone();
            let name = name.clone();
            tokio::spawn(async move {
                node.long_poll(read_req(&name, 0), Duration::from_secs(10))
                    .await
            })
        };
        node.append(append(&name, &["a", "b"], false))
            .await
            .unwrap();
        match waiting.await.unwrap().unwrap() {
            LongPoll::Data(out) => {
                let values: Vec<_> = out.records.iter().map(|r| r.record.value.clone()).collect();
                assert_eq!(values, ["a", "b"]);
                assert_eq!(out.next_seq, 2);
            }
            other => panic!("{other:?}"),
        }
        node.append(append(&name, &[], true)).await.unwrap();
        match node.long_poll(read_req(&name, 2), short).await.unwrap() {
            LongPoll::Closed(out) => assert!(out.closed && out.next_seq == 2),
            other => panic!("{other:?}"),
        }
        node.delete(&name).await.unwrap();
        assert!(node.long_poll(read_req(&name, 2), short).await.is_err());
    }
}
