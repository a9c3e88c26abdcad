//! An address range as the configuration writes it (`10.0.0.0/8`, `2001:db8::/32`, or one
//! address), for `trusted_proxies`.

use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `address` is in the range (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, address.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                mask32(u32::from(net), self.prefix) == mask32(u32::from(a), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                mask128(u128::from(net), self.prefix) == mask128(u128::from(a), self.prefix)
            }
            _ => false,
        }
    }
}

fn mask32(bits: u32, prefix: u8) -> u32 {
    bits.checked_shr(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(bits: u128, prefix: u8) -> u128 {
    bits.checked_shr(128 - u32::from(prefix)).unwrap_or(0)
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not an address or a range like 10.0.0.0/8");
        let (address, prefix) = match text.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text.trim(), None),
        };
        let network: IpAddr = address.parse().map_err(|_| bad())?;
        let network = network.to_canonical();
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { network, prefix })
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ranges_and_single_addresses() {
        let private: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(private.contains(ip("10.1.2.3")));
        assert!(private.contains(ip("::ffff:10.1.2.3")));
        assert!(!private.contains(ip("11.0.0.1")));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.9")) && !all.contains(ip("2001:db8::1")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        for bad in ["10.0.0.0/33", "example.com", "10.0.0.0/", "::/129", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
