//! What the subscription tests (`manager.rs`'s and `cluster_tests.rs`) share: a scripted
//! webhook receiver standing in for HTTP, streams, and waiting for other tasks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pico_common::StreamName;
use pico_protocol::Record as DataRecord;
use serde_json::Value;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::delivery::{Delivered, WebhookSender};
use crate::Node;

/// A webhook receiver answering from a script (the last answer repeats) and reporting each
/// request's body.
pub(super) struct Scripted {
    answers: Mutex<Vec<Delivered>>,
    bodies: UnboundedSender<Value>,
}

impl Scripted {
    /// The receiver, and the bodies it is sent.
    pub(super) fn new(answers: Vec<Delivered>) -> (Arc<Scripted>, UnboundedReceiver<Value>) {
        assert!(!answers.is_empty());
        let (bodies, sent) = unbounded_channel();
        let answers = Mutex::new(answers);
        (Arc::new(Scripted { answers, bodies }), sent)
    }
}

#[async_trait::async_trait]
impl WebhookSender for Scripted {
    async fn send(&self, _url: &str, _signature: String, body: Vec<u8>) -> Delivered {
        let _ = self
            .bodies
            .send(serde_json::from_slice(&body).unwrap_or(Value::Null));
        let mut answers = self.answers.lock().unwrap();
        if answers.len() > 1 {
            answers.remove(0)
        } else {
            answers[0].clone()
        }
    }
}

/// Creates `name` on `node` with one record.
pub(super) async fn create_stream(node: &Node, name: &str) {
    node.create(crate::CreateRequest {
        name: StreamName::parse(name).unwrap(),
        config: crate::CreateConfig::default(),
        initial: vec![DataRecord::from_value(b"1".to_vec())],
    })
    .await
    .unwrap();
}

/// Waits (bounded) for work on other tasks: a delivery's outcome, a timer pass.
pub(super) async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..2_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never happened: {what}");
}
