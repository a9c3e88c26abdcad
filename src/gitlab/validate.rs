//! Field checks shared by every write endpoint; each failure is a 422 naming the field.

use crate::error::{Error, Result};

pub fn positive(field: &str, id: i64) -> Result<()> {
    if id > 0 {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("must be a positive id, got {id}"),
        ))
    }
}

pub fn non_empty(field: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        Err(Error::invalid(field, "must not be empty"))
    } else {
        Ok(())
    }
}

/// A GitLab full path: `/`-separated segments of letters, digits, `_`, `-` and `.`, none
/// empty and none starting with `-`.
pub fn full_path(field: &str, path: &str) -> Result<()> {
    let valid_segment = |s: &str| {
        !s.is_empty()
            && !s.starts_with('-')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    if path.len() <= 1024 && path.split('/').all(valid_segment) {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("`{path}` is not a GitLab full path like `group/subgroup/project`"),
        ))
    }
}

pub fn visibility(field: &str, value: &str) -> Result<()> {
    match value {
        "private" | "internal" | "public" => Ok(()),
        _ => Err(Error::invalid(
            field,
            format!("`{value}` is not one of private, internal, public"),
        )),
    }
}

/// GitLab's access levels; 5 is "Minimal Access".
pub const ACCESS_LEVELS: [(i32, &str); 7] = [
    (5, "Minimal Access"),
    (10, "Guest"),
    (15, "Planner"),
    (20, "Reporter"),
    (30, "Developer"),
    (40, "Maintainer"),
    (50, "Owner"),
];

pub fn access_level(field: &str, level: i32) -> Result<i32> {
    if ACCESS_LEVELS.iter().any(|(n, _)| *n == level) {
        Ok(level)
    } else {
        Err(Error::invalid(
            field,
            format!("{level} is not an access level (10, 15, 20, 30, 40, 50)"),
        ))
    }
}

/// An access level as system hooks name it (`"Developer"`), case-insensitively; `Master` is
/// the name GitLab gave Maintainer before 11.0, and older GitLabs still send it.
pub fn access_level_named(name: &str) -> Option<i32> {
    let name = name.trim();
    if name.eq_ignore_ascii_case("Master") {
        return Some(40);
    }
    ACCESS_LEVELS
        .iter()
        .find(|(_, n)| n.eq_ignore_ascii_case(name))
        .map(|(level, _)| *level)
}

pub fn source_type(field: &str, value: &str) -> Result<()> {
    match value {
        "project" | "group" => Ok(()),
        _ => Err(Error::invalid(
            field,
            format!("`{value}` is not one of project, group"),
        )),
    }
}

/// A DNS-1123 label, as Kubernetes requires of namespace and agent names.
pub fn dns_label(field: &str, value: &str) -> Result<()> {
    let bytes = value.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-';
    if valid {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("`{value}` must be a DNS-1123 label: at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert!(full_path("f", "group/sub.group/my_app-1").is_ok());
        for bad in [
            "",
            "/group",
            "group/",
            "group//app",
            "group/-app",
            "group/a b",
            "grüppe",
        ] {
            assert!(full_path("f", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn dns_labels() {
        assert!(dns_label("f", "default").is_ok());
        assert!(dns_label("f", &"a".repeat(63)).is_ok());
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(dns_label("f", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn access_levels() {
        assert_eq!(access_level_named("developer"), Some(30));
        assert_eq!(access_level_named("Minimal Access"), Some(5));
        assert_eq!(access_level_named("Master"), Some(40));
        assert_eq!(access_level_named("Maintainer"), Some(40));
        assert_eq!(access_level_named("Admin"), None);
        assert!(access_level("f", 25).is_err());
    }
}
