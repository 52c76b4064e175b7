//! The pure transitions of one subscription: issuing a wake, taking a delivery's answer, a
//! claim's lease check, and what the timer finds due. Each takes the time (`now_ms`) and
//! whatever was read for it (tails, the random parts) as arguments and only changes the
//! [`Sub`]: the driver reads, calls, then turns the result into writes and effects.

use super::delivery::Delivered;
use super::error::SubError;
use std::collections::BTreeMap;

use super::model::{Link, Status, StreamView, Sub, SubType, Wake};
use super::wake::retry_delay_ms;

/// Issues the next wake generation over `views` (every link with its tail) if any stream has
/// pending work. Returns the stream that triggered it.
pub fn issue_wake(
    sub: &mut Sub,
    views: &[StreamView],
    now_ms: i64,
    wake_id: String,
) -> Option<String> {
    let trigger = views.iter().find(|v| v.pending())?.path.clone();
    sub.rec.generation += 1;
    let kind = sub.rec.config.kind;
    sub.rec.wake = Some(Wake {
        wake_id,
        snapshot: views.iter().map(|v| (v.path.clone(), v.tail)).collect(),
        incarnations: views
            .iter()
            .filter_map(|v| Some((v.path.clone(), sub.links.get(&v.path)?.stream_id?)))
            .collect(),
        holder: None,
        // Webhook: the lease runs from issue (and again from each accepted delivery, see
        // `on_delivered`); pull-wake: from the claim.
        lease_expires_ms: match kind {
            SubType::Webhook => Some(now_ms + sub.rec.config.lease_ttl_ms as i64),
            SubType::PullWake => None,
        },
    });
    if kind == SubType::Webhook {
        sub.rec.next_attempt_at_ms = Some(now_ms);
        sub.rec.retry_count = 0;
    }
    Some(trigger)
}

/// What a delivery's answer changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryChange {
    /// The wake finished or was replaced meanwhile: nothing changes.
    Stale,
    /// `{"done": true}`: the snapshot is acked (these links moved) and the wake is over.
    Finished { acked: Vec<String> },
    /// Accepted: the lease runs again from now.
    Extended,
    /// Failed: the same wake is sent again after `delay_ms`.
    Retry { attempt: u32, delay_ms: u64 },
}

/// Takes the answer to the delivery of `wake_id`; `unit` in [0, 1) jitters the retry.
pub fn on_delivered(
    sub: &mut Sub,
    wake_id: &str,
    outcome: &Delivered,
    now_ms: i64,
    unit: f64,
) -> DeliveryChange {
    if sub.delivering.as_deref() == Some(wake_id) {
        sub.delivering = None;
    }
    if sub.rec.wake.as_ref().is_none_or(|w| w.wake_id != wake_id) {
        return DeliveryChange::Stale;
    }
    match outcome {
        Delivered::Accepted { done } => {
            sub.rec.status = Status::Active;
            sub.rec.retry_count = 0;
            sub.rec.next_attempt_at_ms = None;
            if *done {
                let mut acked = Vec::new();
                if let Some(w) = sub.rec.wake.take() {
                    for (path, tail) in w.snapshot {
                        if let Some(link) = sub.links.get_mut(&path)
                            && same_incarnation(&w.incarnations, &path, link)
                            && link.acked.is_none_or(|a| a < tail)
                        {
                            link.acked = Some(tail);
                            acked.push(path);
                        }
                    }
                }
                DeliveryChange::Finished { acked }
            } else {
                if let Some(w) = sub.rec.wake.as_mut() {
                    w.lease_expires_ms = Some(now_ms + sub.rec.config.lease_ttl_ms as i64);
                }
                DeliveryChange::Extended
            }
        }
        Delivered::Failed(_) => {
            sub.rec.retry_count = sub.rec.retry_count.saturating_add(1);
            let delay_ms = retry_delay_ms(sub.rec.retry_count, unit);
            sub.rec.status = Status::Failed;
            sub.rec.next_attempt_at_ms = Some(now_ms + delay_ms as i64);
            DeliveryChange::Retry {
                attempt: sub.rec.retry_count,
                delay_ms,
            }
        }
    }
}

/// Whether `link` still follows the stream incarnation the wake saw at `path`: a tail of a
/// stream since deleted and re-created under the name is no cursor for the new one.
pub fn same_incarnation(seen: &BTreeMap<String, u64>, path: &str, link: &Link) -> bool {
    match (seen.get(path), link.stream_id) {
        (Some(then), Some(now)) => *then == now,
        // Unknown at issue (adopted later without a reset) or not known now: nothing to compare.
        _ => true,
    }
}

/// A claim at `now_ms`: refused while another worker's lease runs; a lapsed claim not swept
/// yet is dropped (the claim then takes over with a new generation).
pub fn check_claimable(sub: &mut Sub, now_ms: i64) -> Result<(), SubError> {
    if let Some(w) = &sub.rec.wake
        && let Some(holder) = &w.holder
    {
        if w.lease_expires_ms.is_none_or(|t| t > now_ms) {
            return Err(SubError::AlreadyClaimed {
                holder: holder.clone(),
                generation: sub.rec.generation,
            });
        }
        sub.rec.wake = None;
    }
    Ok(())
}

/// What the timer finds for a subscription at `now_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    Nothing,
    /// A webhook delivery (the first after a restart, or a retry).
    Delivery,
    /// The wake's lease ran out: it is over, and a new one is issued if work is pending.
    LeaseExpired,
}

pub fn due(sub: &Sub, now_ms: i64) -> Due {
    let Some(wake) = &sub.rec.wake else {
        return Due::Nothing;
    };
    if sub.delivering.as_ref() == Some(&wake.wake_id) {
        return Due::Nothing;
    }
    if let Some(at) = sub.rec.next_attempt_at_ms {
        return if at <= now_ms && sub.rec.config.kind == SubType::Webhook {
            Due::Delivery
        } else {
            Due::Nothing
        };
    }
    if wake.lease_expires_ms.is_some_and(|t| t <= now_ms) {
        Due::LeaseExpired
    } else {
        Due::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriptions::model::{Config, Link, Record};
    use serde_json::json;

    fn sub(kind: &str) -> Sub {
        let body = match kind {
            "webhook" => json!({"type": "webhook", "pattern": "a/*",
                "webhook": {"url": "http://127.0.0.1:9/h"}, "lease_ttl_ms": 5000}),
            _ => json!({"type": "pull-wake", "pattern": "a/*", "wake_stream": "w",
                "lease_ttl_ms": 5000}),
        };
        let config = Config::parse(&body, true).unwrap();
        let mut s = Sub::new(Record {
            id: "s".into(),
            config_hash: config.hash(),
            config,
            created_at_ms: 0,
            base_url: String::new(),
            generation: 0,
            wake: None,
            status: Status::Active,
            retry_count: 0,
            next_attempt_at_ms: None,
        });
        for (path, acked) in [("a/1", Some(2)), ("a/2", None)] {
            s.links.insert(
                path.into(),
                Link {
                    explicit: false,
                    glob: true,
                    acked,
                    stream_id: None,
                },
            );
        }
        s
    }

    fn views(tails: [u64; 2]) -> Vec<StreamView> {
        [("a/1", Some(2), tails[0]), ("a/2", None, tails[1])]
            .into_iter()
            .map(|(path, acked, tail)| StreamView {
                path: path.into(),
                link_type: "glob",
                acked,
                tail,
            })
            .collect()
    }

    #[test]
    fn a_wake_is_issued_only_for_pending_work_and_leases_by_kind() {
        let mut hook = sub("webhook");
        assert_eq!(
            issue_wake(&mut hook, &views([2, 0]), 100, "w1".into()),
            None
        );
        assert_eq!(hook.rec.generation, 0);
        let trigger = issue_wake(&mut hook, &views([2, 3]), 100, "w1".into());
        assert_eq!(trigger.as_deref(), Some("a/2"));
        let wake = hook.rec.wake.clone().unwrap();
        assert_eq!(
            (hook.rec.generation, wake.lease_expires_ms),
            (1, Some(5_100))
        );
        assert_eq!(wake.snapshot.get("a/2"), Some(&3));
        assert_eq!(hook.rec.next_attempt_at_ms, Some(100), "delivered at once");
        let mut pull = sub("pull-wake");
        issue_wake(&mut pull, &views([3, 0]), 100, "w1".into());
        let wake = pull.rec.wake.clone().unwrap();
        assert_eq!(
            (wake.lease_expires_ms, pull.rec.next_attempt_at_ms),
            (None, None)
        );
    }

    #[test]
    fn delivery_answers_finish_extend_retry_or_are_stale() {
        let mut s = sub("webhook");
        issue_wake(&mut s, &views([4, 3]), 100, "w1".into());
        s.delivering = Some("w1".into());
        let other = on_delivered(&mut s, "w0", &Delivered::Accepted { done: true }, 200, 0.5);
        assert_eq!(other, DeliveryChange::Stale);
        assert!(s.rec.wake.is_some());
        let failed = on_delivered(&mut s, "w1", &Delivered::Failed("x".into()), 200, 0.5);
        assert_eq!(
            failed,
            DeliveryChange::Retry {
                attempt: 1,
                delay_ms: 1_000
            }
        );
        assert_eq!(
            (s.rec.status, s.rec.next_attempt_at_ms),
            (Status::Failed, Some(1_200))
        );
        assert_eq!(s.delivering, None);
        let extended = on_delivered(&mut s, "w1", &Delivered::Accepted { done: false }, 300, 0.5);
        assert_eq!(extended, DeliveryChange::Extended);
        assert_eq!(s.rec.wake.as_ref().unwrap().lease_expires_ms, Some(5_300));
        assert_eq!((s.rec.status, s.rec.retry_count), (Status::Active, 0));
        let done = on_delivered(&mut s, "w1", &Delivered::Accepted { done: true }, 400, 0.5);
        assert_eq!(
            done,
            DeliveryChange::Finished {
                acked: vec!["a/1".into(), "a/2".into()]
            }
        );
        assert_eq!(s.rec.wake, None);
        assert_eq!(s.links["a/2"].acked, Some(3));
    }

    /// A `{"done": true}` answering a wake issued before its stream was deleted and re-created
    /// under the same name acks the old incarnation only: the new stream's cursor stays.
    #[test]
    fn a_done_leaves_the_cursor_of_a_re_created_stream_alone() {
        let mut s = sub("webhook");
        for (id, link) in s.links.values_mut().enumerate() {
            link.stream_id = Some(10 + id as u64);
        }
        issue_wake(&mut s, &views([4, 3]), 100, "w1".into());
        // a/2 deleted and re-created: the follower saw the new id and reset the cursor.
        let l = s.links.get_mut("a/2").unwrap();
        l.stream_id = Some(99);
        l.acked = None;
        let done = on_delivered(&mut s, "w1", &Delivered::Accepted { done: true }, 200, 0.5);
        assert_eq!(
            done,
            DeliveryChange::Finished {
                acked: vec!["a/1".into()]
            }
        );
        assert_eq!(s.links["a/1"].acked, Some(4));
        assert_eq!(
            s.links["a/2"].acked, None,
            "the new stream starts from the beginning"
        );
    }

    #[test]
    fn a_running_claim_refuses_others_until_its_lease_ends() {
        let mut s = sub("pull-wake");
        assert_eq!(check_claimable(&mut s, 0), Ok(()));
        issue_wake(&mut s, &views([3, 0]), 0, "w1".into());
        let w = s.rec.wake.as_mut().unwrap();
        w.holder = Some("a".into());
        w.lease_expires_ms = Some(1_000);
        assert_eq!(
            check_claimable(&mut s, 999),
            Err(SubError::AlreadyClaimed {
                holder: "a".into(),
                generation: 1
            })
        );
        assert_eq!(
            check_claimable(&mut s, 1_000),
            Ok(()),
            "a lease ends at its deadline"
        );
        assert_eq!(s.rec.wake, None, "the lapsed claim is dropped");
    }

    #[test]
    fn the_timer_finds_deliveries_and_lapsed_leases_on_the_given_clock() {
        let mut s = sub("webhook");
        assert_eq!(due(&s, 0), Due::Nothing);
        issue_wake(&mut s, &views([3, 0]), 100, "w1".into());
        assert_eq!(due(&s, 99), Due::Nothing);
        assert_eq!(due(&s, 100), Due::Delivery);
        s.delivering = Some("w1".into());
        assert_eq!(due(&s, 100), Due::Nothing, "one delivery at a time");
        on_delivered(&mut s, "w1", &Delivered::Accepted { done: false }, 200, 0.5);
        assert_eq!(due(&s, 5_199), Due::Nothing);
        assert_eq!(due(&s, 5_200), Due::LeaseExpired);
    }
}
