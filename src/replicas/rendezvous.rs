//! Which live replica owns a cluster connection: rendezvous (highest random weight) hashing.
//! Every replica computes the same owner from the same live set, with no coordination but
//! the set itself; a replica joining takes from each other replica only the connections it
//! now scores highest on (about 1/N of them), and one leaving hands only its own on.
//!
//! The score is SHA-256 of the connection and the replica, so that replicas built by different
//! compilers (a rolling upgrade) still agree.

use sha2::{Digest, Sha256};

/// The score of `replica` for `connection`.
fn score(connection: &str, replica: &str) -> u64 {
    let mut hash = Sha256::new();
    hash.update(connection.as_bytes());
    hash.update([0]);
    hash.update(replica.as_bytes());
    let digest = hash.finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The owner of `connection` among `live` (ids); `None` when none is live. Ties (never seen
/// in practice) go to the greater id, so the order of `live` does not matter.
pub fn owner<'a>(connection: &str, live: &'a [String]) -> Option<&'a str> {
    live.iter()
        .max_by(|a, b| (score(connection, a), a).cmp(&(score(connection, b), b)))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("replica-{i:02}")).collect()
    }

    fn connections() -> Vec<String> {
        (0..3000)
            .map(|i| format!("GitLab's agent server, as agent {i}"))
            .collect()
    }

    #[test]
    fn the_owner_is_one_of_the_live_whatever_their_order() {
        let live = replicas(5);
        let mut reversed = live.clone();
        reversed.reverse();
        for c in connections().iter().take(200) {
            let one = owner(c, &live).unwrap();
            assert!(live.iter().any(|r| r == one));
            assert_eq!(Some(one), owner(c, &reversed));
        }
        assert_eq!(owner("x", &[]), None);
    }

    #[test]
    fn connections_spread_evenly() {
        let live = replicas(4);
        let mut per = std::collections::HashMap::new();
        for c in connections() {
            *per.entry(owner(&c, &live).unwrap().to_owned()).or_insert(0) += 1;
        }
        // 3,000 over 4: 750 each, give or take a few standard deviations (~24).
        for (replica, n) in per {
            assert!((620..=880).contains(&n), "{replica}: {n}");
        }
    }

    #[test]
    fn adding_a_replica_moves_about_one_nth_and_only_to_it() {
        for n in [1, 2, 3, 4, 8] {
            let before = replicas(n);
            let after = replicas(n + 1);
            let joined = &after[n];
            let all = connections();
            let mut moved = 0;
            for c in &all {
                let (was, is) = (owner(c, &before).unwrap(), owner(c, &after).unwrap());
                if was != is {
                    moved += 1;
                    assert_eq!(is, joined, "{c} moved between two old replicas");
                }
            }
            let share = moved as f64 / all.len() as f64;
            let expected = 1.0 / (n + 1) as f64;
            assert!(
                (share - expected).abs() < 0.05,
                "{n} -> {}: {share:.3} moved, about {expected:.3} expected",
                n + 1
            );
        }
    }

    #[test]
    fn a_replica_leaving_hands_on_only_its_own() {
        let before = replicas(4);
        let gone = &before[1];
        let after: Vec<String> = before.iter().filter(|r| *r != gone).cloned().collect();
        for c in connections() {
            let was = owner(&c, &before).unwrap();
            if was != gone {
                assert_eq!(owner(&c, &after), Some(was), "{c}");
            }
        }
    }
}
