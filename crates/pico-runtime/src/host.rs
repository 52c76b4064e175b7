//! Which `Host` a listener answers (DNS rebinding).
//!
//! A page on `http://evil.example` whose name the attacker then points at 127.0.0.1 talks to a
//! local node as its own origin: the browser sends `Host: evil.example` (and no CORS check
//! applies, the page being "same-origin"). A listener bound to loopback can only be reached
//! from this machine, so the names it is reached by are known: loopback names and addresses,
//! plus what the operator configures (`--allowed-hosts`, the host of `--http-address`). Any
//! other `Host` is answered 421 (Misdirected Request: this server does not serve that
//! authority) before routing. A listener bound elsewhere is reached by names we cannot know;
//! it needs authentication or `--insecure-allow-remote` anyway, so it checks nothing here.
//!
//! On every listener, an HTTP/1.1 request without a `Host` (or with several) is a 400, as
//! RFC 9112 §3.2 requires.

use axum::http::{HeaderValue, StatusCode, Version, header};
use pico_http::HttpError;
use pico_http::cors::authority_of;
use std::net::{IpAddr, SocketAddr};

/// The hosts one listener accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPolicy {
    /// `None`: any host (a non-loopback bind). Else loopback names plus these (normalized by
    /// [`normalize`], compared ignoring case).
    allowed: Option<Vec<String>>,
}

impl HostPolicy {
    /// Any host (non-loopback listeners, and tests).
    pub fn any() -> HostPolicy {
        HostPolicy { allowed: None }
    }

    /// The policy of a listener bound to `bind`: loopback names plus `extra` when `bind` is a
    /// loopback address, any host otherwise.
    pub fn for_listener(bind: SocketAddr, extra: &[String]) -> HostPolicy {
        if !bind.ip().is_loopback() {
            return HostPolicy::any();
        }
        HostPolicy {
            allowed: Some(extra.iter().filter_map(|h| normalize(h)).collect()),
        }
    }

    /// Checks `req`'s host: `Err` is the answer to send instead of serving it.
    pub fn check<B>(&self, req: &axum::http::Request<B>) -> Result<(), HttpError> {
        let mut hosts = req.headers().get_all(header::HOST).iter();
        let first = hosts.next();
        self.check_found(req, first, hosts.next().is_some())
    }

    /// [`HostPolicy::check`] for a caller that has found `req`'s first `Host` header already
    /// (`host`), and whether another follows (`repeated`).
    pub fn check_found<B>(
        &self,
        req: &axum::http::Request<B>,
        host: Option<&HeaderValue>,
        repeated: bool,
    ) -> Result<(), HttpError> {
        // The `Host` value found here is the one `cors::request_authority` would look up: one
        // lookup per request, not two.
        let mut host_header = None;
        if req.uri().authority().is_none() {
            host_header = host;
            match (host_header, repeated) {
                (Some(_), true) => {
                    return Err(HttpError::bad_request(
                        "more than one Host header".to_string(),
                    ));
                }
                (None, _) if req.version() == Version::HTTP_11 => {
                    return Err(HttpError::bad_request(
                        "an HTTP/1.1 request needs a Host header".to_string(),
                    ));
                }
                _ => {}
            }
        }
        let Some(allowed) = &self.allowed else {
            return Ok(());
        };
        // No authority at all (HTTP/1.0, or HTTP/2 without `:authority`): no browser sends
        // that, so it cannot be a rebound name.
        let Some(authority) = authority_of(req.uri(), || host_header) else {
            return Ok(());
        };
        // Plain string work, no allocation: this runs for every request.
        let host = host_part(authority).filter(|_| !authority.as_bytes().contains(&b'@'));
        match host {
            Some(h) if is_loopback_name(h) || allowed.iter().any(|a| a.eq_ignore_ascii_case(h)) => {
                Ok(())
            }
            _ => Err(HttpError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected_request",
                format!(
                    "Host `{authority}` is not served here: this node listens on loopback and \
                     answers only localhost, loopback addresses and --allowed-hosts (see \
                     docs/browsers.md)"
                ),
            )),
        }
    }
}

/// A configured host as compared: lowercase, without IPv6 brackets, port or a trailing dot.
/// `None` for an empty one.
pub fn normalize(host: &str) -> Option<String> {
    host_part(host.trim()).map(str::to_ascii_lowercase)
}

/// The host of `host[:port]`, without IPv6 brackets or a trailing dot; `None` if empty.
fn host_part(authority: &str) -> Option<&str> {
    // Byte scans: `split`/`matches` with a char pattern cost a searcher each, per request.
    let b = authority.as_bytes();
    let h = match authority.strip_prefix('[') {
        Some(rest) => rest.find(']').map_or(rest, |i| &rest[..i]),
        // `host:port`; a bare IPv6 address (more than one colon) has no port.
        None => match b.iter().position(|&c| c == b':') {
            Some(i) if !b[i + 1..].contains(&b':') => &authority[..i],
            _ => authority,
        },
    };
    let h = h.strip_suffix('.').unwrap_or(h);
    (!h.is_empty()).then_some(h)
}

/// `localhost`, any `*.localhost` (RFC 6761: always loopback), and loopback addresses; any
/// letter case.
fn is_loopback_name(host: &str) -> bool {
    const SUFFIX: &str = ".localhost";
    let b = host.as_bytes();
    // The usual names first: parsing an address is the costly test.
    host == "127.0.0.1"
        || host.eq_ignore_ascii_case("localhost")
        || (b.len() > SUFFIX.len()
            && b[b.len() - SUFFIX.len()..].eq_ignore_ascii_case(SUFFIX.as_bytes()))
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::Request;

    fn req(version: Version, hosts: &[&str]) -> Request {
        let mut b = axum::http::Request::builder().uri("/s").version(version);
        for h in hosts {
            b = b.header(header::HOST, *h);
        }
        b.body(Body::empty()).unwrap()
    }

    fn status(p: &HostPolicy, r: &Request) -> u16 {
        match p.check(r) {
            Ok(()) => 200,
            Err(e) => e.status.as_u16(),
        }
    }

    #[test]
    fn loopback_listeners_answer_loopback_names_and_configured_hosts() {
        let bind: SocketAddr = "127.0.0.1:4437".parse().unwrap();
        let p = HostPolicy::for_listener(bind, &["Pico.Internal".into(), "[fd00::1]".into()]);
        let h11 = Version::HTTP_11;
        for ok in [
            "localhost",
            "localhost:4437",
            "LOCALHOST.",
            "app.localhost:8080",
            "127.0.0.1:4437",
            "127.0.0.2",
            "[::1]:4437",
            "pico.internal:80",
            "[fd00::1]:4437",
        ] {
            assert_eq!(status(&p, &req(h11, &[ok])), 200, "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:4437",
            "localhost.evil.example",
            "0.0.0.0:4437",
            "192.168.1.5",
            "[::2]:4437",
            "user@localhost",
            "",
        ] {
            assert_eq!(status(&p, &req(h11, &[bad])), 421, "{bad}");
        }
        // HTTP/2's `:authority` (the URI's authority) is what counts.
        let h2 = axum::http::Request::builder()
            .uri("http://evil.example:4437/s")
            .version(Version::HTTP_2)
            .body(Body::empty())
            .unwrap();
        assert_eq!(status(&p, &h2), 421);
        let h2 = axum::http::Request::builder()
            .uri("http://localhost:4437/s")
            .version(Version::HTTP_2)
            .body(Body::empty())
            .unwrap();
        assert_eq!(status(&p, &h2), 200);
    }

    #[test]
    fn http11_needs_exactly_one_host_everywhere() {
        let bind: SocketAddr = "0.0.0.0:4437".parse().unwrap();
        let any = HostPolicy::for_listener(bind, &[]);
        assert_eq!(any, HostPolicy::any());
        assert_eq!(status(&any, &req(Version::HTTP_11, &["evil.example"])), 200);
        assert_eq!(status(&any, &req(Version::HTTP_11, &[])), 400);
        assert_eq!(status(&any, &req(Version::HTTP_11, &["a", "b"])), 400);
        assert_eq!(status(&any, &req(Version::HTTP_10, &[])), 200);
        let local = HostPolicy::for_listener("[::1]:1".parse().unwrap(), &[]);
        assert_eq!(status(&local, &req(Version::HTTP_11, &[])), 400);
        assert_eq!(status(&local, &req(Version::HTTP_10, &[])), 200);
    }
}
