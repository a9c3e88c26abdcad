//! How the pages order and name things: pure, tested without I/O.

use chrono::{DateTime, Utc};

/// Argo CD's order of health, best first (SPEC 5.2): the worst sorts first on the pages.
pub fn health_rank(status: &str) -> u8 {
    match status {
        "HEALTHY" => 1,
        "SUSPENDED" => 2,
        "PROGRESSING" => 3,
        "MISSING" => 4,
        "DEGRADED" => 5,
        "UNKNOWN" => 6,
        _ => 0,
    }
}

/// Production first, then staging, testing, development, other, none.
pub fn tier_rank(tier: Option<&str>) -> u8 {
    match tier.map(str::to_ascii_uppercase).as_deref() {
        Some("PRODUCTION") => 0,
        Some("STAGING") => 1,
        Some("TESTING") => 2,
        Some("DEVELOPMENT") => 3,
        Some("OTHER") => 4,
        _ => 5,
    }
}

/// The tiers a filter may name, as the URL spells them.
pub const TIERS: [&str; 5] = ["production", "staging", "testing", "development", "other"];

/// `HEALTHY` as a person reads it: `Healthy`.
pub fn title(word: &str) -> String {
    let lower = word.to_ascii_lowercase();
    let mut chars = lower.chars();
    match chars.next() {
        Some(c) => c.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// The CSS class of a health status (`h-degraded`), or of no health (`h-none`).
pub fn health_class(status: Option<&str>) -> String {
    format!(
        "h-{}",
        status.map_or("none".to_owned(), |s| s.to_ascii_lowercase())
    )
}

/// "3 min ago", "2 h ago", "4 days ago", from an RFC 3339 time.
pub fn ago(time: &str, now: DateTime<Utc>) -> String {
    let Ok(then) = DateTime::parse_from_rfc3339(time) else {
        return time.to_owned();
    };
    let seconds = (now - then.with_timezone(&Utc)).num_seconds().max(0);
    match seconds {
        0..=59 => format!("{seconds} s ago"),
        60..=3599 => format!("{} min ago", seconds / 60),
        3600..=86399 => format!("{} h ago", seconds / 3600),
        _ => match seconds / 86400 {
            1 => "1 day ago".to_owned(),
            days => format!("{days} days ago"),
        },
    }
}

/// The first 8 characters of a commit sha, as GitLab shows it.
pub fn short_sha(sha: &str) -> &str {
    sha.get(..8).unwrap_or(sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worse_health_ranks_higher_in_argo_order() {
        let order = [
            "HEALTHY",
            "SUSPENDED",
            "PROGRESSING",
            "MISSING",
            "DEGRADED",
            "UNKNOWN",
        ];
        for pair in order.windows(2) {
            assert!(health_rank(pair[0]) < health_rank(pair[1]), "{pair:?}");
        }
        assert_eq!(health_rank("nonsense"), 0);
    }

    #[test]
    fn production_comes_first_and_no_tier_last() {
        assert!(tier_rank(Some("PRODUCTION")) < tier_rank(Some("staging")));
        assert!(tier_rank(Some("other")) < tier_rank(None));
    }

    #[test]
    fn times_read_as_people_say_them() {
        let now = DateTime::parse_from_rfc3339("2026-11-24T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(ago("2026-11-24T11:59:30Z", now), "30 s ago");
        assert_eq!(ago("2026-11-24T11:00:00Z", now), "1 h ago");
        assert_eq!(ago("2026-11-22T11:00:00Z", now), "2 days ago");
        assert_eq!(ago("not a time", now), "not a time");
        assert_eq!(short_sha("0123456789abcdef"), "01234567");
        assert_eq!(title("PROGRESSING"), "Progressing");
    }
}
