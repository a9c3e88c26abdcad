//! The dashboard's style sheet and script, compiled into the binary and served under names
//! that carry a hash of their content: a page names the exact version it was rendered with,
//! so browsers may keep each file for a year and never ask again (`immutable`), and a new
//! binary's files have new names.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// Where the assets are served.
pub const PREFIX: &str = "/-/assets/";

struct Asset {
    stem: &'static str,
    extension: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    /// `stem.<first 12 hex digits of its SHA-256>.extension`
    name: String,
}

static ASSETS: LazyLock<Vec<Asset>> = LazyLock::new(|| {
    [
        (
            "dashboard",
            "css",
            "text/css; charset=utf-8",
            include_bytes!("assets/dashboard.css").as_slice(),
        ),
        (
            "dashboard",
            "js",
            "text/javascript; charset=utf-8",
            include_bytes!("assets/dashboard.js").as_slice(),
        ),
        (
            "favicon",
            "svg",
            "image/svg+xml",
            include_bytes!("assets/favicon.svg").as_slice(),
        ),
    ]
    .into_iter()
    .map(|(stem, extension, content_type, body)| Asset {
        stem,
        extension,
        content_type,
        body,
        name: hashed_name(stem, extension, body),
    })
    .collect()
});

fn hashed_name(stem: &str, extension: &str, body: &[u8]) -> String {
    let digest = Sha256::digest(body);
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{stem}.{hex}.{extension}")
}

/// The path of an asset by its plain name (`dashboard.css`), with its hash.
pub fn path(plain: &str) -> String {
    let asset = ASSETS
        .iter()
        .find(|a| {
            plain
                .strip_suffix(a.extension)
                .and_then(|s| s.strip_suffix('.'))
                == Some(a.stem)
        })
        .expect("an embedded asset");
    format!("{PREFIX}{}", asset.name)
}

/// `GET /-/assets/{name}`: only the current hashed names exist.
pub async fn serve(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(asset) => (
            [
                (CONTENT_TYPE, asset.content_type),
                (CACHE_CONTROL, "public, max-age=31536000, immutable"),
            ],
            asset.body,
        )
            .into_response(),
        None => Error::NotFound(format!("no asset {name}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_content_hash() {
        let css = path("dashboard.css");
        assert!(css.starts_with("/-/assets/dashboard."), "{css}");
        assert!(css.ends_with(".css"));
        assert_eq!(css.len(), "/-/assets/dashboard.".len() + 12 + ".css".len());
        assert_ne!(
            hashed_name("a", "css", b"one"),
            hashed_name("a", "css", b"two")
        );
    }
}
