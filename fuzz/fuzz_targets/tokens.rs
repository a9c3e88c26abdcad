//! Tokens from outside: the session JWTs of `Authorization: Bearer` and of GitLab's
//! `_gitlab_kas` cookie (`verify_session`), the header and key set of CI/CD ID tokens (the JWT
//! header read before a key is looked up, GitLab's JWKS answer), the watch API's one-time tokens,
//! and the test that tells a JWT from a personal access token. The input is spliced into a
//! session token freshly signed with the fuzz key (its first byte picks where), so that
//! mutations start from a token that verifies. The oracle: nothing but that token's own header
//! and claims is accepted, and no token but an issued one redeems.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use axum::http::{HeaderValue, Request};
use envlens::auth::secrets::{Secret, Secrets};
use envlens::auth::{mint_session, verify_session, Keys, Via};
use envlens::k8s::watch_api::tokens::{Bound, Tokens};
use libfuzzer_sys::fuzz_target;

const SESSION_KEY: &[u8] = b"fuzz session key, 32 bytes long!";

struct Fixture {
    keys: Keys,
    token: String,
    csrf: String,
    watch: Tokens,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let keys = Keys::new(Secrets {
            internal: Secret::new(b"fuzz internal key, 32 bytes long".to_vec()),
            session: Secret::new(SESSION_KEY.to_vec()),
            webhook_token: Secret::new(b"fuzz webhook token".to_vec()),
            generated: Vec::new(),
        });
        let (token, csrf) =
            mint_session(SESSION_KEY, 1, "alice", Duration::from_secs(3600)).expect("minted");
        Fixture {
            keys,
            token,
            csrf,
            watch: Tokens::new(Duration::from_secs(60), 1000),
        }
    })
}

fuzz_target!(|input: &[u8]| {
    let f = fixture();
    let Some((&at, rest)) = input.split_first() else {
        return;
    };
    let rest = String::from_utf8_lossy(rest);
    // Spliced in at `at` (past the end: the input alone), so mutations start from a real token.
    let candidate = match f.token.get(..at as usize) {
        Some(head) if (at as usize) < f.token.len() => format!("{head}{rest}"),
        _ => rest.clone().into_owned(),
    };
    let signed = f
        .token
        .rsplit_once('.')
        .map(|(h, _)| h)
        .expect("three parts");

    for (name, value) in [
        ("authorization", format!("Bearer {candidate}")),
        ("cookie", format!("_gitlab_kas={candidate}")),
    ] {
        let Ok(value) = HeaderValue::from_str(&value) else {
            continue;
        };
        let (parts, ()) = Request::get("/api/user")
            .header(name, value)
            .header("x-csrf-token", f.csrf.as_str())
            .body(())
            .expect("a request")
            .into_parts();
        if let Ok(session) = verify_session(&parts, &f.keys) {
            let sent = candidate.trim();
            let sent = match name {
                "cookie" => sent
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(sent),
                _ => sent,
            };
            assert_eq!(
                sent.rsplit_once('.').map(|(h, _)| h),
                Some(signed),
                "accepted {candidate}"
            );
            assert_eq!(session.user_id, 1);
        }
    }

    // A CI/CD ID token's header, and GitLab's key set, as `gitlab::id_token` reads them.
    let _ = jsonwebtoken::decode_header(&candidate);
    if let Ok(set) = serde_json::from_str::<jsonwebtoken::jwk::JwkSet>(&rest) {
        let _ = envlens::gitlab::id_token::usable_keys(&set);
    }

    let _ = envlens::gitlab::tokens::is_jwt(&candidate);
    let issued = f.watch.issue(Bound {
        agent_id: 7,
        user_id: 1,
        via: Via::Cookie,
    });
    if candidate != issued {
        assert_eq!(f.watch.redeem(&candidate), None, "redeemed {candidate}");
    }
    assert!(f.watch.redeem(&issued).is_some());
});
