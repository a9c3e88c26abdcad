//! Whose request it is, by address (SPEC 13): the connection's peer, or, when the peer is one
//! of the configured `trusted_proxies`, the address those proxies put in `X-Forwarded-For`.
//! The middleware records it on every request as [`ClientAddress`], for the bounds kept per
//! client (the GitLab token checks of `gitlab::tokens::budget`).
//!
//! `X-Forwarded-For` is read from the right: each trusted proxy appends the address it was
//! reached from, so the rightmost address that is not a trusted proxy is the client; what a
//! client wrote further left is its own claim and never believed. A malformed entry ends the
//! walk at the last proxy that was trusted.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::http::HeaderMap;

use crate::config::cidr::Cidr;

const FORWARDED_FOR: &str = "x-forwarded-for";
/// Addresses read from `X-Forwarded-For` at most: a longer chain is cut there.
const MAX_HOPS: usize = 32;

/// The client's address, as [`resolve`] decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress(pub IpAddr);

/// The reverse proxies whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Arc<[Cidr]>);

impl TrustedProxies {
    pub fn new(ranges: Vec<Cidr>) -> Self {
        TrustedProxies(ranges.into())
    }

    fn trusts(&self, address: IpAddr) -> bool {
        self.0.iter().any(|range| range.contains(address))
    }
}

/// The client of a request from `peer` with these headers.
pub fn resolve(peer: IpAddr, headers: &HeaderMap, trusted: &TrustedProxies) -> IpAddr {
    let mut client = peer.to_canonical();
    if !trusted.trusts(client) {
        return client;
    }
    let hops: Vec<&str> = headers
        .get_all(FORWARDED_FOR)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .collect();
    for hop in hops.iter().rev().take(MAX_HOPS) {
        let Ok(address) = hop.trim().parse::<IpAddr>() else {
            break;
        };
        client = address.to_canonical();
        if !trusted.trusts(client) {
            break;
        }
    }
    client
}

/// Records the request's [`ClientAddress`] when its connection's peer is known. Called by
/// the request middleware (`http::middleware::Observe`), not a layer of its own: each layer
/// of the router clones and boxes the routes below it on every request.
pub fn record(request: &mut Request, trusted: &TrustedProxies) {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip());
    if let Some(peer) = peer {
        let client = resolve(peer, request.headers(), trusted);
        request.extensions_mut().insert(ClientAddress(client));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(FORWARDED_FOR, v.parse().unwrap());
        }
        headers
    }

    fn proxies() -> TrustedProxies {
        TrustedProxies::new(vec![
            "10.0.0.0/8".parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
        ])
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let headers = forwarded(&["198.51.100.1"]);
        assert_eq!(
            resolve(ip("203.0.113.5"), &headers, &proxies()),
            ip("203.0.113.5")
        );
        assert_eq!(
            resolve(ip("203.0.113.5"), &headers, &TrustedProxies::default()),
            ip("203.0.113.5")
        );
    }

    #[test]
    fn behind_trusted_proxies_the_rightmost_untrusted_hop() {
        let p = proxies();
        // The client's own claim (left) is not believed.
        let headers = forwarded(&["1.2.3.4, 198.51.100.7", "10.0.0.2"]);
        assert_eq!(resolve(ip("10.0.0.1"), &headers, &p), ip("198.51.100.7"));
        // No header: the proxy itself.
        assert_eq!(
            resolve(ip("10.0.0.1"), &HeaderMap::new(), &p),
            ip("10.0.0.1")
        );
        // A malformed hop stops at the last trusted one.
        let headers = forwarded(&["198.51.100.7, garbage"]);
        assert_eq!(resolve(ip("10.0.0.1"), &headers, &p), ip("10.0.0.1"));
        // IPv4-mapped peers are IPv4.
        let headers = forwarded(&["2001:db8::9"]);
        assert_eq!(
            resolve(ip("::ffff:127.0.0.1"), &headers, &p),
            ip("2001:db8::9")
        );
    }
}
