//! Subscription records: the normalized configuration (and its idempotency hash), the durable
//! cursor state, the wake in flight, and their JSON forms (KV storage and API responses).

use std::collections::BTreeMap;

use pico_protocol::format_offset;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::error::SubError;
use super::glob::Pattern;
use super::webhook_url;

pub const DEFAULT_LEASE_TTL_MS: u64 = 30_000;
pub const MIN_LEASE_TTL_MS: u64 = 1_000;
pub const MAX_LEASE_TTL_MS: u64 = 600_000;
/// Longest subscription id; ids never contain `/` (they are one URL segment and a KV key part).
pub const MAX_ID_LEN: usize = 256;
/// Most explicit streams in one request.
pub const MAX_STREAMS_PER_REQUEST: usize = 1_000;
/// Pattern bounds: every append is matched against every subscription's pattern.
pub const MAX_PATTERN_LEN: usize = 1_024;
pub const MAX_PATTERN_SEGMENTS: usize = 32;
pub const MAX_PATTERN_DOUBLE_STARS: usize = 4;
pub const MAX_DESCRIPTION_LEN: usize = 4_096;
pub const MAX_WEBHOOK_URL_LEN: usize = 2_048;
/// Subscriptions per node: each append is checked against all of them.
pub const MAX_SUBSCRIPTIONS: usize = 10_000;
/// Linked streams per subscription: each wake lists (and heartbeats rewrite) all of them.
pub const MAX_LINKS_PER_SUB: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubType {
    #[serde(rename = "webhook")]
    Webhook,
    #[serde(rename = "pull-wake")]
    PullWake,
}

impl SubType {
    pub fn as_str(self) -> &'static str {
        match self {
            SubType::Webhook => "webhook",
            SubType::PullWake => "pull-wake",
        }
    }
}

/// The client-supplied configuration, normalized. Equal configs hash equal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    #[serde(rename = "type")]
    pub kind: SubType,
    pub pattern: Option<Pattern>,
    /// Sorted, deduplicated, normalized.
    pub streams: Vec<String>,
    pub webhook_url: Option<String>,
    pub wake_stream: Option<String>,
    pub lease_ttl_ms: u64,
    pub description: Option<String>,
}

impl Config {
    /// Parses and validates a PUT body (`allow_local`: see [`webhook_url::validate`]).
    pub fn parse(body: &Value, allow_local: bool) -> Result<Config, SubError> {
        let obj = body
            .as_object()
            .ok_or_else(|| SubError::invalid("request body must be a JSON object"))?;
        let kind = match obj.get("type").and_then(Value::as_str) {
            Some("webhook") => SubType::Webhook,
            Some("pull-wake") => SubType::PullWake,
            _ => {
                return Err(SubError::invalid(
                    r#"type must be "webhook" or "pull-wake""#,
                ));
            }
        };
        let pattern = match obj.get("pattern") {
            None | Some(Value::Null) => None,
            Some(Value::String(p)) if normalize_path(p).is_empty() => None,
            Some(Value::String(p)) => Some(parse_pattern(p)?),
            Some(_) => return Err(SubError::invalid("pattern must be a string")),
        };
        let streams = match obj.get("streams") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => parse_stream_list(v)?,
        };
        if pattern.is_none() && streams.is_empty() {
            return Err(SubError::invalid(
                "at least one of pattern or streams is required",
            ));
        }
        let lease_ttl_ms = match obj.get("lease_ttl_ms") {
            None | Some(Value::Null) => DEFAULT_LEASE_TTL_MS,
            Some(v) => v
                .as_u64()
                .filter(|ms| (MIN_LEASE_TTL_MS..=MAX_LEASE_TTL_MS).contains(ms))
                .ok_or_else(|| {
                    SubError::invalid("lease_ttl_ms must be an integer from 1000 to 600000")
                })?,
        };
        let description = match obj.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) if d.len() > MAX_DESCRIPTION_LEN => {
                return Err(SubError::invalid(format!(
                    "description must be at most {MAX_DESCRIPTION_LEN} bytes"
                )));
            }
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => return Err(SubError::invalid("description must be a string")),
        };
        let mut webhook_url = None;
        let mut wake_stream = None;
        match kind {
            SubType::Webhook => {
                let url = obj
                    .get("webhook")
                    .and_then(|w| w.get("url"))
                    .and_then(Value::as_str)
                    .filter(|u| !u.is_empty())
                    .ok_or_else(|| {
                        SubError::invalid("webhook subscriptions require webhook.url")
                    })?;
                if url.len() > MAX_WEBHOOK_URL_LEN {
                    return Err(SubError::invalid(format!(
                        "webhook.url must be at most {MAX_WEBHOOK_URL_LEN} bytes"
                    )));
                }
                webhook_url::validate(url, allow_local).map_err(SubError::WebhookUrlRejected)?;
                webhook_url = Some(url.to_string());
            }
            SubType::PullWake => {
                let ws = obj
                    .get("wake_stream")
                    .and_then(Value::as_str)
                    .map(normalize_path)
                    .filter(|w| !w.is_empty())
                    .ok_or_else(|| {
                        SubError::invalid("pull-wake subscriptions require wake_stream")
                    })?;
                check_stream_path(&ws)?;
                wake_stream = Some(ws);
            }
        }
        Ok(Config {
            kind,
            pattern,
            streams,
            webhook_url,
            wake_stream,
            lease_ttl_ms,
            description,
        })
    }

    /// Hex SHA-256 of the canonical JSON of the normalized config.
    pub fn hash(&self) -> String {
        let canonical = serde_json::to_vec(self).unwrap_or_default();
        hex(&Sha256::digest(canonical))
    }

    /// Whether a glob link applies to `path` (a pull-wake subscription never links its own wake
    /// stream: each wake event would otherwise wake it again).
    pub fn pattern_matches(&self, path: &str) -> bool {
        match &self.pattern {
            Some(p) => self.wake_stream.as_deref() != Some(path) && p.matches(path),
            None => false,
        }
    }
}

/// A request's pattern, normalized and bounded (stored patterns load unchecked).
fn parse_pattern(raw: &str) -> Result<Pattern, SubError> {
    let p = normalize_path(raw);
    if p.len() > MAX_PATTERN_LEN {
        return Err(SubError::invalid(format!(
            "pattern must be at most {MAX_PATTERN_LEN} bytes"
        )));
    }
    let segs = p.split('/').filter(|s| !s.is_empty());
    if segs.clone().count() > MAX_PATTERN_SEGMENTS {
        return Err(SubError::invalid(format!(
            "pattern must have at most {MAX_PATTERN_SEGMENTS} segments"
        )));
    }
    if segs.filter(|s| *s == "**").count() > MAX_PATTERN_DOUBLE_STARS {
        return Err(SubError::invalid(format!(
            "pattern must have at most {MAX_PATTERN_DOUBLE_STARS} ** segments"
        )));
    }
    Ok(Pattern::new(&p))
}

/// `{"streams": [...]}` member or PUT `streams`: non-empty strings, normalized, deduplicated.
pub fn parse_stream_list(v: &Value) -> Result<Vec<String>, SubError> {
    let arr = v
        .as_array()
        .ok_or_else(|| SubError::invalid("streams must be an array of stream paths"))?;
    if arr.len() > MAX_STREAMS_PER_REQUEST {
        return Err(SubError::invalid(format!(
            "at most {MAX_STREAMS_PER_REQUEST} streams per request"
        )));
    }
    let mut out = Vec::with_capacity(arr.len());
    for s in arr {
        let p = s
            .as_str()
            .map(normalize_path)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| SubError::invalid("streams must contain non-empty strings"))?;
        check_stream_path(&p)?;
        out.push(p);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn check_stream_path(p: &str) -> Result<(), SubError> {
    pico_common::StreamName::parse(p)
        .map(|_| ())
        .map_err(|e| SubError::invalid(format!("bad stream path: {e}")))
}

/// Stream-root-relative form: no leading or trailing slashes.
pub fn normalize_path(p: &str) -> String {
    p.trim_matches('/').to_string()
}

/// Subscription ids are one URL segment: printable, no `/`, bounded.
pub fn check_id(id: &str) -> Result<(), SubError> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "-._~:@!$&'()*+,;=%".contains(c);
    if id.is_empty() || id.len() > MAX_ID_LEN || !id.chars().all(ok) {
        return Err(SubError::invalid(format!(
            "subscription id must be 1..={MAX_ID_LEN} characters of [A-Za-z0-9-._~:@!$&'()*+,;=%]"
        )));
    }
    Ok(())
}

/// One linked stream's cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub explicit: bool,
    pub glob: bool,
    /// Last acked offset (a stream tail as served in `Stream-Next-Offset`); `None` = `-1`, never
    /// acked (a stream discovered by a matching append).
    pub acked: Option<u64>,
    /// The stream incarnation (internal id) the cursor belongs to, adopted from the first append
    /// seen; a stream deleted and re-created under the name starts its cursor over.
    #[serde(default)]
    pub stream_id: Option<u64>,
}

impl Link {
    pub fn link_type(&self) -> &'static str {
        if self.explicit { "explicit" } else { "glob" }
    }

    /// Unprocessed data exists below `tail`.
    pub fn pending(&self, tail: u64) -> bool {
        tail > self.acked.unwrap_or(0)
    }
}

pub fn offset_text(acked: Option<u64>) -> String {
    match acked {
        Some(o) => format_offset(o),
        None => "-1".to_string(),
    }
}

/// The wake in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wake {
    pub wake_id: String,
    /// Stream tails when the wake was issued (auto-acked on a webhook's `{"done": true}`).
    pub snapshot: BTreeMap<String, u64>,
    /// The stream incarnation (link `stream_id`) each snapshot tail belongs to, where known: a
    /// stream deleted and re-created since the wake was issued is not acked by its answer.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub incarnations: BTreeMap<String, u64>,
    /// Pull-wake: the worker holding the lease.
    pub holder: Option<String>,
    /// When the lease ends (ms since epoch); `None` = no lease running (pull-wake not claimed).
    pub lease_expires_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Active,
    Failed,
}

/// Everything about a subscription except its links (stored under their own keys so an ack
/// rewrites only the streams it touches).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub config: Config,
    pub config_hash: String,
    pub created_at_ms: i64,
    /// The `__ds` root URL seen when the subscription was created; callback URLs derive from it.
    pub base_url: String,
    pub generation: u64,
    pub wake: Option<Wake>,
    pub status: Status,
    pub retry_count: u32,
    pub next_attempt_at_ms: Option<i64>,
}

/// A subscription in memory.
#[derive(Debug, Clone)]
pub struct Sub {
    pub rec: Record,
    pub links: BTreeMap<String, Link>,
    /// The wake a delivery attempt is running for (not persisted).
    pub delivering: Option<String>,
    /// A glob match was skipped at [`MAX_LINKS_PER_SUB`] and logged (not persisted): warns once
    /// per filling up, not on every append.
    pub link_cap_warned: bool,
}

/// One stream as shown in wakes and claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamView {
    pub path: String,
    pub link_type: &'static str,
    pub acked: Option<u64>,
    pub tail: u64,
}

impl StreamView {
    pub fn pending(&self) -> bool {
        self.tail > self.acked.unwrap_or(0)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "path": self.path,
            "link_type": self.link_type,
            "acked_offset": offset_text(self.acked),
            "tail_offset": format_offset(self.tail),
            "has_pending": self.pending(),
        })
    }
}

impl Sub {
    /// A subscription without links.
    pub fn new(rec: Record) -> Sub {
        Sub {
            rec,
            links: BTreeMap::new(),
            delivering: None,
            link_cap_warned: false,
        }
    }

    /// Links `path` as a glob match with cursor `acked`, unless the subscription already has
    /// [`MAX_LINKS_PER_SUB`] links (then the match is skipped, logged once). Returns whether it
    /// was linked.
    pub fn link_glob(&mut self, path: &str, acked: Option<u64>) -> bool {
        if self.links.len() >= MAX_LINKS_PER_SUB {
            if !self.link_cap_warned {
                self.link_cap_warned = true;
                tracing::warn!(
                    sub = %self.rec.id, stream = path, max = MAX_LINKS_PER_SUB,
                    "subscription link limit reached; further pattern matches are not linked"
                );
            }
            return false;
        }
        self.link_cap_warned = false;
        self.links.insert(
            path.to_string(),
            Link {
                explicit: false,
                glob: true,
                acked,
                stream_id: None,
            },
        );
        true
    }

    /// The API representation (GET, PUT responses).
    pub fn to_json(&self, ds_root: &str, kid: &str) -> Value {
        let c = &self.rec.config;
        let streams: Vec<Value> = self
            .links
            .iter()
            .map(|(path, l)| {
                json!({
                    "path": path,
                    "link_type": l.link_type(),
                    "acked_offset": offset_text(l.acked),
                })
            })
            .collect();
        let webhook = c.webhook_url.as_ref().map(|url| {
            json!({
                "url": url,
                "signing": {
                    "alg": "ed25519",
                    "kid": kid,
                    "jwks_url": format!("{ds_root}/jwks.json"),
                }
            })
        });
        let created_at = chrono::DateTime::from_timestamp_millis(self.rec.created_at_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        json!({
            "id": self.rec.id,
            "subscription_id": self.rec.id,
            "type": c.kind.as_str(),
            "pattern": c.pattern,
            "streams": streams,
            "webhook": webhook,
            "wake_stream": c.wake_stream,
            "lease_ttl_ms": c.lease_ttl_ms,
            "created_at": created_at,
            "status": self.rec.status,
            "description": c.description,
            "generation": self.rec.generation,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<Config, SubError> {
        Config::parse(&v, true)
    }

    #[test]
    fn equal_configs_hash_equal_regardless_of_stream_order() {
        let a = parse(json!({
            "type": "webhook", "pattern": "events/*",
            "streams": ["b", "a", "a"],
            "webhook": {"url": "http://127.0.0.1:9/webhook"},
            "lease_ttl_ms": 1000, "description": "d"
        }))
        .unwrap();
        let b = parse(json!({
            "description": "d", "lease_ttl_ms": 1000,
            "webhook": {"url": "http://127.0.0.1:9/webhook"},
            "streams": ["/a/", "b"], "pattern": "/events/*", "type": "webhook"
        }))
        .unwrap();
        assert_eq!(a.streams, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(a.hash(), b.hash());
    }

    #[test]
    fn any_config_difference_changes_the_hash() {
        let base = json!({
            "type": "webhook", "pattern": "events/*",
            "webhook": {"url": "http://127.0.0.1:9/webhook"},
        });
        let h0 = parse(base.clone()).unwrap().hash();
        let variants = [
            ("pattern", json!("events/**")),
            ("lease_ttl_ms", json!(31000)),
            ("description", json!("x")),
            ("streams", json!(["s"])),
            ("webhook", json!({"url": "http://127.0.0.1:10/webhook"})),
        ];
        for (k, v) in variants {
            let mut b = base.clone();
            b[k] = v;
            assert_ne!(parse(b).unwrap().hash(), h0, "changing {k}");
        }
        // The default lease is part of the normalized config.
        let mut explicit_default = base.clone();
        explicit_default["lease_ttl_ms"] = json!(DEFAULT_LEASE_TTL_MS);
        assert_eq!(parse(explicit_default).unwrap().hash(), h0);
    }

    #[test]
    fn validation_errors() {
        let rejects = [
            json!([]),
            json!({"type": "other", "pattern": "a"}),
            json!({"type": "webhook", "webhook": {"url": "http://127.0.0.1/"}}),
            json!({"type": "webhook", "pattern": "a"}),
            json!({"type": "pull-wake", "pattern": "a"}),
            json!({"type": "pull-wake", "pattern": "a", "wake_stream": "w", "lease_ttl_ms": 999}),
            json!({"type": "pull-wake", "pattern": "a", "wake_stream": "w", "lease_ttl_ms": 600001}),
            json!({"type": "pull-wake", "pattern": "a", "wake_stream": "w", "lease_ttl_ms": 1.5}),
            json!({"type": "pull-wake", "streams": [""], "wake_stream": "w"}),
            json!({"type": "pull-wake", "streams": [1], "wake_stream": "w"}),
        ];
        for r in rejects {
            assert!(
                matches!(parse(r.clone()), Err(SubError::InvalidRequest(_))),
                "{r}"
            );
        }
        let unsafe_url = parse(json!({
            "type": "webhook", "pattern": "a", "webhook": {"url": "http://10.0.0.1/hook"}
        }));
        assert!(matches!(unsafe_url, Err(SubError::WebhookUrlRejected(_))));
    }

    #[test]
    fn patterns_descriptions_and_urls_are_bounded() {
        let pw = |pattern: String| {
            parse(json!({"type": "pull-wake", "pattern": pattern, "wake_stream": "w"}))
        };
        let invalid = |r: Result<Config, SubError>| matches!(r, Err(SubError::InvalidRequest(_)));
        // The review's case: megabytes of `**/` made every append slow.
        assert!(invalid(pw("**/".repeat(700_000))));
        assert!(invalid(pw("a".repeat(MAX_PATTERN_LEN + 1))));
        assert!(pw("a".repeat(MAX_PATTERN_LEN)).is_ok());
        assert!(invalid(pw(vec!["a"; MAX_PATTERN_SEGMENTS + 1].join("/"))));
        assert!(pw(vec!["a"; MAX_PATTERN_SEGMENTS].join("/")).is_ok());
        assert!(invalid(
            pw(["**"; MAX_PATTERN_DOUBLE_STARS + 1].join("/a/"))
        ));
        assert!(pw(["**"; MAX_PATTERN_DOUBLE_STARS].join("/a/")).is_ok());
        // Slashes around and between segments are not segments.
        assert!(
            pw(format!(
                "//{}//",
                vec!["a"; MAX_PATTERN_SEGMENTS].join("//")
            ))
            .is_ok()
        );

        let described = |d: String| {
            parse(
                json!({"type": "pull-wake", "pattern": "a", "wake_stream": "w", "description": d}),
            )
        };
        assert!(invalid(described("d".repeat(MAX_DESCRIPTION_LEN + 1))));
        assert!(described("d".repeat(MAX_DESCRIPTION_LEN)).is_ok());

        let hook = |url: String| {
            parse(json!({"type": "webhook", "pattern": "a", "webhook": {"url": url}}))
        };
        let base = "http://127.0.0.1:9/";
        assert!(invalid(hook(format!(
            "{base}{}",
            "p".repeat(MAX_WEBHOOK_URL_LEN - base.len() + 1)
        ))));
        assert!(
            hook(format!(
                "{base}{}",
                "p".repeat(MAX_WEBHOOK_URL_LEN - base.len())
            ))
            .is_ok()
        );
    }

    #[test]
    fn stored_configs_beyond_the_limits_still_load() {
        let pattern = format!("{}x", "**/".repeat(100));
        let stored = json!({
            "type": "pull-wake", "pattern": pattern, "streams": [], "webhook_url": null,
            "wake_stream": "w", "lease_ttl_ms": 30000, "description": "d".repeat(10_000)
        });
        let c: Config = serde_json::from_value(stored.clone()).unwrap();
        assert!(c.pattern_matches("a/b/x"));
        assert!(!c.pattern_matches("a/b/y"));
        // It round-trips (and so hashes) as the text it was stored with.
        assert_eq!(serde_json::to_value(&c).unwrap(), stored);
    }

    #[test]
    fn own_wake_stream_is_never_glob_linked() {
        let c = parse(json!({"type": "pull-wake", "pattern": "**", "wake_stream": "wake/pool"}))
            .unwrap();
        assert!(c.pattern_matches("events/a"));
        assert!(!c.pattern_matches("wake/pool"));
    }

    #[test]
    fn pending_compares_tail_with_acked() {
        let fresh = Link {
            explicit: false,
            glob: true,
            acked: None,
            stream_id: None,
        };
        assert!(!fresh.pending(0));
        assert!(fresh.pending(1));
        let acked = Link {
            acked: Some(3),
            ..fresh
        };
        assert!(!acked.pending(3));
        assert!(acked.pending(4));
        assert_eq!(offset_text(None), "-1");
        assert_eq!(offset_text(Some(3)), format_offset(3));
    }

    #[test]
    fn ids_are_single_segments() {
        assert!(check_id("sub-1700000000000").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id("a/b").is_err());
        assert!(check_id(&"x".repeat(MAX_ID_LEN + 1)).is_err());
    }
}
