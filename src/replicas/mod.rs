//! Replicas that share the clusters (SPEC 16): N `serve` processes on one database, each
//! cluster connection watched by one of them. Membership and ownership (`ownership`: a row per
//! replica with its heartbeat, rendezvous hashing (`rendezvous`) over the live ones, a fenced
//! lease per connection) and the internal listener other replicas reach this one at
//! (`internal`). A single process is the same code with a set of one.

pub mod forward;
pub mod internal;
pub mod memo;
pub mod ownership;
pub mod rendezvous;
mod watches;
pub mod wire;

use std::net::SocketAddr;

pub use ownership::Ownership;

/// The internal listener's port in a pod, when `--internal-listen` is not given.
pub const POD_INTERNAL_PORT: u16 = 8081;

/// Where the internal listener listens: `--internal-listen`, else in a pod (`POD_IP` set)
/// every address on [`POD_INTERNAL_PORT`], else a free port of the loopback interface (one
/// machine: a developer's, a test's).
pub fn internal_listen(flag: Option<SocketAddr>, pod_ip: Option<&str>) -> SocketAddr {
    flag.unwrap_or_else(|| match pod_ip {
        Some(_) => SocketAddr::from(([0, 0, 0, 0], POD_INTERNAL_PORT)),
        None => SocketAddr::from(([127, 0, 0, 1], 0)),
    })
}

/// The address other replicas reach this one at: `--advertise-url`, else in a pod
/// `http://<POD_IP>:<internal port>`, else the internal listener's own address.
pub fn advertise_url(flag: Option<&str>, pod_ip: Option<&str>, bound: SocketAddr) -> String {
    if let Some(url) = flag {
        return url.trim_end_matches('/').to_owned();
    }
    let host = match pod_ip.and_then(|ip| ip.parse::<std::net::IpAddr>().ok()) {
        Some(ip) => ip,
        None if bound.ip().is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        None => bound.ip(),
    };
    format!("http://{}", SocketAddr::new(host, bound.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_a_pod_the_address_is_the_pods_own_on_the_internal_port() {
        let listen = internal_listen(None, Some("10.1.2.3"));
        assert_eq!(listen, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(
            advertise_url(None, Some("10.1.2.3"), listen),
            "http://10.1.2.3:8081"
        );
        assert_eq!(
            advertise_url(None, Some("fd00::7"), "[::]:9000".parse().unwrap()),
            "http://[fd00::7]:9000"
        );
    }

    #[test]
    fn the_flag_wins_and_outside_a_pod_the_bound_address_is_used() {
        let bound: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        assert_eq!(internal_listen(None, None), "127.0.0.1:0".parse().unwrap());
        assert_eq!(advertise_url(None, None, bound), "http://127.0.0.1:41234");
        assert_eq!(
            advertise_url(
                Some("http://envlens-0.envlens:8081/"),
                Some("10.1.2.3"),
                bound
            ),
            "http://envlens-0.envlens:8081"
        );
        let flag: SocketAddr = "192.168.0.9:7000".parse().unwrap();
        assert_eq!(internal_listen(Some(flag), Some("10.1.2.3")), flag);
    }
}
