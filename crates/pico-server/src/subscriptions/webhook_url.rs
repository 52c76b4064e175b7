//! SSRF guard for webhook URLs. `https` to public hosts is accepted; plain `http` only for the
//! local development exception (`localhost`, `127.0.0.0/8`, `[::1]`); every other local, private,
//! link-local or reserved target is rejected. The same address rules are applied again to DNS
//! answers at delivery time ([`PublicResolver`]) so a public name cannot rebind to a private
//! address, and redirects are never followed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Checks a webhook URL; the error is a human-readable reason. `allow_local` admits the plain
/// http loopback exception (only for a node that is itself bound to loopback).
pub fn validate(raw: &str, allow_local: bool) -> Result<Url, String> {
    let url =
        Url::parse(raw).map_err(|_| "webhook.url must be a valid absolute URL".to_string())?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("webhook.url must not carry credentials".into());
    }
    let host = url
        .host_str()
        .ok_or_else(|| "webhook.url must have a host".to_string())?;
    let ip: Option<IpAddr> = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok();
    let dev_local = match ip {
        Some(ip) => ip.is_loopback(),
        None => is_localhost_name(host),
    };
    if dev_local && !allow_local {
        return Err("loopback webhook URLs are only allowed on a node bound to loopback".into());
    }
    match url.scheme() {
        "http" if dev_local => Ok(url),
        "http" => Err("http webhook URLs are only allowed for localhost or 127.0.0.x".into()),
        "https" => match ip {
            None if is_localhost_name(host) => Err("localhost webhook URLs must use http".into()),
            None => Ok(url),
            Some(ip) if is_public(ip) => Ok(url),
            Some(_) => {
                Err("webhook.url must not target private, loopback or link-local hosts".into())
            }
        },
        _ => Err("webhook.url must use https (or http for localhost)".into()),
    }
}

fn is_localhost_name(host: &str) -> bool {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    h == "localhost" || h.ends_with(".localhost")
}

/// Globally routable unicast (not loopback, private, link-local, CGNAT, documentation,
/// benchmarking, multicast, unspecified, or other reserved ranges).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            is_public_v6(v6)
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s0 = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s0 & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (s0 & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s0 & 0xffc0) == 0xfec0 // site-local (deprecated)
        || s0 == 0x2001 && ip.segments()[1] == 0x0db8 // documentation
        || s0 == 0x0064 && ip.segments()[1] == 0xff9b // NAT64 64:ff9b::/96 and 64:ff9b:1::/48
        || s0 == 0x0100 && ip.segments()[1..4] == [0, 0, 0] // discard-only
        || s0 == 0x2002 // 6to4: embeds an IPv4 address that may be private
        || s0 == 0x2001 && ip.segments()[1] == 0 // Teredo: embeds an IPv4 address
        || ip.segments()[..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible ::a.b.c.d (deprecated)
}

/// DNS resolution for webhook delivery: `localhost` names resolve to loopback only, every other
/// name only to public addresses.
#[derive(Debug, Default, Clone, Copy)]
pub struct PublicResolver;

impl Resolve for PublicResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let local = is_localhost_name(&host);
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| {
                    if local {
                        a.ip().is_loopback()
                    } else {
                        is_public(a.ip())
                    }
                })
                .collect();
            if addrs.is_empty() {
                return Err(format!("webhook host {host} resolves to no permitted address").into());
            }
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_http_is_the_dev_exception() {
        assert!(validate("http://127.0.0.1:3000/webhook", true).is_ok());
        assert!(validate("http://127.0.0.9/hook", true).is_ok());
        assert!(validate("http://localhost:8080/hook", true).is_ok());
        assert!(validate("http://[::1]:8080/hook", true).is_ok());
        // A node exposed beyond loopback must not call its own local services.
        assert!(validate("http://127.0.0.1:3000/webhook", false).is_err());
        assert!(validate("http://localhost:8080/hook", false).is_err());
        assert!(validate("https://hooks.example.com/x", false).is_ok());
    }

    #[test]
    fn private_and_plain_http_targets_are_rejected() {
        for bad in [
            "http://10.0.0.1/hook",
            "http://example.com/hook",
            "https://10.0.0.1/hook",
            "https://192.168.1.2/hook",
            "https://172.16.0.1/hook",
            "https://169.254.169.254/latest",
            "https://127.0.0.1/hook",
            "https://localhost/hook",
            "https://[::1]/hook",
            "https://[fd00::1]/hook",
            "https://[fe80::1]/hook",
            "https://[::ffff:10.0.0.1]/hook",
            "https://100.64.0.1/hook",
            "https://0.0.0.0/hook",
            "ftp://example.com/hook",
            "file:///etc/passwd",
            "not a url",
            "https://user:pw@example.com/hook",
        ] {
            assert!(validate(bad, true).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn public_https_is_accepted() {
        assert!(validate("https://hooks.example.com/x", true).is_ok());
        assert!(validate("https://93.184.216.34/x", true).is_ok());
        assert!(validate("https://[2606:4700::1111]/x", true).is_ok());
    }

    #[test]
    fn v6_forms_embedding_v4_are_not_public() {
        for bad in [
            "https://[2002:c0a8:0101::1]/x",   // 6to4 of 192.168.1.1
            "https://[2001:0:4136:e378::1]/x", // Teredo
            "https://[::c0a8:101]/x",          // IPv4-compatible 192.168.1.1
            "https://[64:ff9b:1::c0a8:101]/x", // local-use NAT64
        ] {
            assert!(validate(bad, true).is_err(), "{bad} should be rejected");
        }
    }
}
