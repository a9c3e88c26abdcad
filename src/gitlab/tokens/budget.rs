//! How often one client address may make envlens ask GitLab about a token it has not seen
//! (SPEC 13): a token bucket per address, so that a flood of random tokens from one place costs
//! GitLab a trickle of calls while everyone else's tokens are still checked.
//!
//! Bounded: at most [`MAX_ADDRESSES`] buckets. When they are all taken, the buckets that have
//! refilled (their addresses are quiet) go; if none has, the new address shares one overflow
//! bucket with every other such address, which holds the cost to GitLab while it lasts.
//! An IPv6 client is counted by its /64, which one host usually holds whole.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Addresses tracked at once.
pub const MAX_ADDRESSES: usize = 10_000;

/// Checks one address may start at once.
pub const BURST: u32 = 10;
/// Then this many a minute.
pub const PER_MINUTE: u32 = 30;

/// Whose bucket: an IPv4 address, an IPv6 /64, or the one shared by addresses the map had no
/// room for and by requests whose address is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    V4(u32),
    V6(u64),
    Shared,
}

impl Key {
    fn of(address: Option<IpAddr>) -> Key {
        match address.map(|a| a.to_canonical()) {
            Some(IpAddr::V4(a)) => Key::V4(a.into()),
            Some(IpAddr::V6(a)) => Key::V6((u128::from(a) >> 64) as u64),
            None => Key::Shared,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The buckets of every address asking now.
pub struct Budget {
    burst: f64,
    per_second: f64,
    capacity: usize,
    buckets: Mutex<HashMap<Key, Bucket>>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(BURST, PER_MINUTE, MAX_ADDRESSES)
    }
}

impl Budget {
    pub fn new(burst: u32, per_minute: u32, capacity: usize) -> Self {
        Budget {
            burst: f64::from(burst.max(1)),
            per_second: f64::from(per_minute.max(1)) / 60.0,
            capacity: capacity.max(1),
            buckets: Mutex::default(),
        }
    }

    /// Takes one check for `address`; when its bucket is empty, how long until it has one.
    pub fn take(&self, address: Option<IpAddr>) -> Result<(), Duration> {
        self.take_at(address, Instant::now())
    }

    fn take_at(&self, address: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let mut key = Key::of(address);
        if !buckets.contains_key(&key) && buckets.len() >= self.capacity {
            let (burst, rate) = (self.burst, self.per_second);
            buckets.retain(|k, b| {
                *k == Key::Shared
                    || b.tokens + rate * now.duration_since(b.at).as_secs_f64() < burst
            });
            if buckets.len() >= self.capacity {
                key = Key::Shared;
            }
        }
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let refilled =
            bucket.tokens + self.per_second * now.duration_since(bucket.at).as_secs_f64();
        bucket.tokens = refilled.min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - bucket.tokens) / self.per_second,
            ))
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn a_burst_then_the_rate() {
        let budget = Budget::new(3, 60, 100);
        let start = Instant::now();
        for _ in 0..3 {
            assert!(budget.take_at(ip("192.0.2.1"), start).is_ok());
        }
        let wait = budget.take_at(ip("192.0.2.1"), start).unwrap_err();
        assert!(
            wait <= Duration::from_secs(1) && wait > Duration::from_millis(900),
            "{wait:?}"
        );
        // Another address has its own bucket.
        assert!(budget.take_at(ip("192.0.2.2"), start).is_ok());
        // One a second after that.
        let later = start + Duration::from_millis(1_100);
        assert!(budget.take_at(ip("192.0.2.1"), later).is_ok());
        assert!(budget.take_at(ip("192.0.2.1"), later).is_err());
    }

    #[test]
    fn an_ipv6_host_is_its_slash_64_and_mapped_ipv4_is_ipv4() {
        let budget = Budget::new(1, 1, 100);
        let now = Instant::now();
        assert!(budget.take_at(ip("2001:db8:1:2::1"), now).is_ok());
        assert!(budget.take_at(ip("2001:db8:1:2:ffff::9"), now).is_err());
        assert!(budget.take_at(ip("2001:db8:1:3::1"), now).is_ok());
        assert!(budget.take_at(ip("198.51.100.7"), now).is_ok());
        assert!(budget.take_at(ip("::ffff:198.51.100.7"), now).is_err());
    }

    #[test]
    fn bounded_quiet_addresses_go_first_then_an_overflow_is_shared() {
        let budget = Budget::new(2, 60, 3);
        let now = Instant::now();
        for i in 1..=3 {
            budget.take_at(ip(&format!("192.0.2.{i}")), now).unwrap();
        }
        assert_eq!(budget.len(), 3);
        // None has refilled: the fourth address shares the overflow bucket.
        budget.take_at(ip("192.0.2.4"), now).unwrap();
        budget.take_at(ip("192.0.2.5"), now).unwrap();
        assert!(budget.take_at(ip("192.0.2.6"), now).is_err());
        assert!(budget.len() <= 4);
        // Once they refilled, quiet addresses make room.
        let later = now + Duration::from_secs(5);
        budget.take_at(ip("192.0.2.7"), later).unwrap();
        assert!(budget.len() <= 4);
    }
}
