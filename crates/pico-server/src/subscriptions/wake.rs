//! The pure rules of a wake: who may act on it (fencing), what a webhook carries, and when a
//! failed delivery is retried. No IO and no clock: callers pass what they read.

use serde::Deserialize;
use serde_json::{Value, json};

use super::error::SubError;
use super::model::{StreamView, Sub, SubType, Wake};
use super::signing::{Keys, TokenClaims};

const RETRY_BASE_MS: u64 = 1_000;
const RETRY_MAX_MS: u64 = 60_000;

/// Ack/callback/release request body (`acks[].stream`, `acks[].path` accepted alike).
#[derive(Debug, Default, Deserialize)]
pub struct WakeRequest {
    pub wake_id: Option<String>,
    pub generation: Option<u64>,
    #[serde(default)]
    pub acks: Vec<AckItem>,
    #[serde(default)]
    pub done: bool,
}

#[derive(Debug, Deserialize)]
pub struct AckItem {
    pub stream: Option<String>,
    pub path: Option<String>,
    pub offset: String,
}

pub fn check_kind(sub: &Sub, kind: SubType) -> Result<(), SubError> {
    if sub.rec.config.kind != kind {
        return Err(SubError::invalid(format!(
            "subscription is not {}",
            kind.as_str()
        )));
    }
    Ok(())
}

/// The bearer token, the request's generation and wake id must all name the current wake.
pub fn check_fence(
    keys: &Keys,
    sub: &Sub,
    token: Option<&str>,
    req: &WakeRequest,
) -> Result<(), SubError> {
    let claims = token
        .and_then(|t| keys.verify_token(t))
        .filter(|c| c.sub == sub.rec.id)
        .ok_or(SubError::TokenInvalid)?;
    let wake = sub.rec.wake.as_ref().ok_or(SubError::Fenced)?;
    let generation = sub.rec.generation;
    if claims.generation != generation
        || claims.wake_id != wake.wake_id
        || req.generation != Some(generation)
        || req.wake_id.as_deref() != Some(wake.wake_id.as_str())
    {
        return Err(SubError::Fenced);
    }
    Ok(())
}

/// The webhook request body for the wake in flight.
pub fn webhook_body(sub: &Sub, wake: &Wake, keys: &Keys) -> Vec<u8> {
    let streams: Vec<Value> = sub
        .links
        .iter()
        .map(|(path, link)| {
            let tail = wake
                .snapshot
                .get(path)
                .copied()
                .unwrap_or(link.acked.unwrap_or(0));
            StreamView {
                path: path.clone(),
                link_type: link.link_type(),
                acked: link.acked,
                tail,
            }
            .to_json()
        })
        .collect();
    let token = keys.token(&TokenClaims {
        sub: sub.rec.id.clone(),
        generation: sub.rec.generation,
        wake_id: wake.wake_id.clone(),
    });
    let body = json!({
        "subscription_id": sub.rec.id,
        "wake_id": wake.wake_id,
        "generation": sub.rec.generation,
        "streams": streams,
        "callback_url": format!("{}/subscriptions/{}/callback", sub.rec.base_url, sub.rec.id),
        "callback_token": token,
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Exponential backoff 1 s → 60 s with ±20 % jitter; `unit` is uniform in [0, 1).
pub fn retry_delay_ms(attempt: u32, unit: f64) -> u64 {
    let exp = attempt.saturating_sub(1).min(16);
    let base = (RETRY_BASE_MS << exp).min(RETRY_MAX_MS) as f64;
    let jitter = base * 0.2 * (unit * 2.0 - 1.0);
    (base + jitter).round().max(0.0) as u64
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriptions::model::{Config, Record, Status};
    use std::collections::BTreeMap;

    fn sub_with_wake(generation: u64, wake_id: &str) -> Sub {
        let config = Config::parse(
            &json!({
                "type": "pull-wake", "pattern": "a/*", "wake_stream": "w"
            }),
            true,
        )
        .unwrap();
        Sub::new(Record {
            id: "s".into(),
            config_hash: config.hash(),
            config,
            created_at_ms: 0,
            base_url: String::new(),
            generation,
            wake: Some(Wake {
                wake_id: wake_id.into(),
                snapshot: BTreeMap::new(),
                incarnations: BTreeMap::new(),
                holder: Some("worker".into()),
                lease_expires_ms: None,
            }),
            status: Status::Active,
            retry_count: 0,
            next_attempt_at_ms: None,
        })
    }

    fn req(generation: u64, wake_id: &str) -> WakeRequest {
        WakeRequest {
            wake_id: Some(wake_id.into()),
            generation: Some(generation),
            ..WakeRequest::default()
        }
    }

    #[test]
    fn fencing_requires_current_generation_and_wake_in_token_and_body() {
        let keys = Keys::from_seed([1u8; 32]);
        let sub = sub_with_wake(5, "w_cur");
        let token = |sub: &str, generation: u64, wake: &str| {
            keys.token(&TokenClaims {
                sub: sub.into(),
                generation,
                wake_id: wake.into(),
            })
        };
        let good = token("s", 5, "w_cur");
        assert_eq!(
            check_fence(&keys, &sub, Some(&good), &req(5, "w_cur")),
            Ok(())
        );
        // Stale generation in the token or the body, or another wake of the same generation.
        let old = token("s", 4, "w_cur");
        assert_eq!(
            check_fence(&keys, &sub, Some(&old), &req(5, "w_cur")),
            Err(SubError::Fenced)
        );
        assert_eq!(
            check_fence(&keys, &sub, Some(&good), &req(4, "w_cur")),
            Err(SubError::Fenced)
        );
        let other_wake = token("s", 5, "w_old");
        assert_eq!(
            check_fence(&keys, &sub, Some(&other_wake), &req(5, "w_cur")),
            Err(SubError::Fenced)
        );
        assert_eq!(
            check_fence(&keys, &sub, Some(&good), &req(5, "w_old")),
            Err(SubError::Fenced)
        );
        // Another subscription's token, a forged one, none at all.
        let foreign = token("t", 5, "w_cur");
        assert_eq!(
            check_fence(&keys, &sub, Some(&foreign), &req(5, "w_cur")),
            Err(SubError::TokenInvalid)
        );
        assert_eq!(
            check_fence(&keys, &sub, Some("x.y"), &req(5, "w_cur")),
            Err(SubError::TokenInvalid)
        );
        assert_eq!(
            check_fence(&keys, &sub, None, &req(5, "w_cur")),
            Err(SubError::TokenInvalid)
        );
        // No wake in flight: everything is stale.
        let mut idle = sub.clone();
        idle.rec.wake = None;
        assert_eq!(
            check_fence(&keys, &idle, Some(&good), &req(5, "w_cur")),
            Err(SubError::Fenced)
        );
    }

    #[test]
    fn retry_delay_grows_to_a_minute_with_bounded_jitter() {
        assert_eq!(retry_delay_ms(1, 0.5), 1_000);
        assert_eq!(retry_delay_ms(2, 0.5), 2_000);
        assert_eq!(retry_delay_ms(3, 0.5), 4_000);
        assert_eq!(retry_delay_ms(7, 0.5), 60_000);
        assert_eq!(retry_delay_ms(100, 0.5), 60_000);
        assert_eq!(retry_delay_ms(1, 0.0), 800);
        assert!(retry_delay_ms(1, 0.999_999) <= 1_200);
        assert_eq!(retry_delay_ms(50, 0.0), 48_000);
    }
}
