//! [`AdminClient`]: the admin listener's API (default `http://127.0.0.1:9090`).

use crate::error::ClientError;
use crate::wire;
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use std::time::{Duration, Instant};

/// A client of one node's admin listener. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AdminClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// The answer to a transfer request (`202 Accepted`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransferStarted {
    pub stream: String,
    pub stream_id: u64,
    /// The owner that drains it; `None`: nobody owned it (released for the target at once).
    pub from_node: Option<u32>,
    pub to_node: u32,
    /// The stream epoch it leaves.
    pub epoch: i64,
}

/// `GET /admin/streams/{name}`: where a stream lives.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    pub stream_id: u64,
    pub epoch: i64,
    pub owner: Option<PlacementOwner>,
    pub committed_end: u64,
    pub closed: bool,
    pub transfer: Option<PlacementTransfer>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementOwner {
    pub node_id: u32,
    pub node_epoch: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementTransfer {
    pub to_node: u32,
    pub from_node: Option<u32>,
    pub epoch: i64,
    pub released: bool,
}

/// A transfer seen through to its end by [`AdminClient::transfer_and_wait`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    pub started: TransferStarted,
    /// The stream epoch the target opened it at.
    pub epoch: i64,
    /// From sending the request to seeing the target own the stream.
    pub elapsed: Duration,
}

/// How often [`AdminClient::transfer_and_wait`] looks.
const POLL: Duration = Duration::from_millis(10);

impl AdminClient {
    pub fn new(endpoint: &str, token: Option<String>) -> Result<AdminClient, ClientError> {
        let base = endpoint.trim_end_matches('/').to_string();
        Url::parse(&base).map_err(|e| {
            ClientError::Transport(format!("bad admin endpoint: {e}: endpoint=`{endpoint}`"))
        })?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build()?;
        Ok(AdminClient { http, base, token })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Asks for stream `name` to move to node `to_node`; returns once the node accepted it.
    pub async fn transfer(&self, name: &str, to_node: u32) -> Result<TransferStarted, ClientError> {
        let path = wire::stream_path(name)?;
        let resp = self
            .request(reqwest::Method::POST, "/admin/transfer")
            .json(&serde_json::json!({ "stream": path, "toNode": to_node }))
            .send()
            .await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        if status != StatusCode::ACCEPTED {
            return Err(ClientError::from_response(status.as_u16(), &body));
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Where stream `name` lives; `None` if it does not exist.
    pub async fn placement(&self, name: &str) -> Result<Option<Placement>, ClientError> {
        let path = wire::stream_path(name)?;
        let resp = self
            .request(reqwest::Method::GET, &format!("/admin/streams{path}"))
            .send()
            .await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(ClientError::from_response(status.as_u16(), &body));
        }
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// [`AdminClient::transfer`], then waits (at most `timeout`) until the target owns the
    /// stream, as this node's view shows it.
    pub async fn transfer_and_wait(
        &self,
        name: &str,
        to_node: u32,
        timeout: Duration,
    ) -> Result<Handoff, ClientError> {
        let t0 = Instant::now();
        let started = self.transfer(name, to_node).await?;
        loop {
            let p = self.placement(name).await?.ok_or_else(|| {
                ClientError::Invalid(format!("stream deleted during its transfer: name=`{name}`"))
            })?;
            if p.owner.is_some_and(|o| o.node_id == to_node) && p.epoch > started.epoch {
                return Ok(Handoff {
                    started,
                    epoch: p.epoch,
                    elapsed: t0.elapsed(),
                });
            }
            // Reopened elsewhere (the source gave the transfer up, or another node opened it
            // after the hint expired): this transfer is over without reaching its target.
            if p.transfer.is_none() && p.epoch > started.epoch {
                return Err(ClientError::Invalid(format!(
                    "transfer did not complete: the stream was opened on node {:?} at epoch {}",
                    p.owner.map(|o| o.node_id),
                    p.epoch
                )));
            }
            if t0.elapsed() >= timeout {
                return Err(ClientError::Timeout(timeout));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
