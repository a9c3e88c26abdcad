//! CI/CD ID tokens (SPEC 12.2) against the in-process GitLab: GitLab's own tokens pass, every
//! kind of forgery is refused, and the key set is fetched again only as often as it must.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use envlens::gitlab::api::{GitLab, Policy};
use envlens::gitlab::id_token::{IdTokens, Refused};
use serde_json::json;

use crate::support::gitlab::{Signer, TestGitLab};

const AUDIENCE: &str = "https://envlens.example.com";

async fn verifier(gitlab: &TestGitLab) -> IdTokens {
    let client = GitLab::new(&gitlab.url, None, Arc::default(), Policy::default()).unwrap();
    IdTokens::new(client, AUDIENCE).with_refetch_interval(REFETCH)
}

const REFETCH: std::time::Duration = std::time::Duration::from_millis(300);

#[tokio::test]
async fn gitlabs_own_tokens_name_the_job() {
    let gitlab = TestGitLab::start().await;
    let tokens = verifier(&gitlab).await;
    for signer in [Signer::Rsa, Signer::Ec] {
        let token = gitlab.sign(&gitlab.job_claims(AUDIENCE), signer);
        let job = tokens
            .verify(&token)
            .await
            .unwrap_or_else(|e| panic!("{signer:?}: {e}"));
        assert_eq!(job.project_id, "42");
        assert_eq!(job.project_path, "acme/apps/web");
        assert_eq!(job.job_id, "302");
        assert_eq!(job.ref_protected, "true");
        assert_eq!(job.environment.as_deref(), Some("production"));
        assert_eq!(job.deployment_tier.as_deref(), Some("production"));
        assert_eq!(job.user_id.as_deref(), Some("2"));
    }
    // One fetch of the key set served both.
    assert_eq!(gitlab.key_fetches.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn every_forgery_is_refused() {
    let gitlab = TestGitLab::start().await;
    let tokens = verifier(&gitlab).await;
    let now = chrono::Utc::now().timestamp();
    let with = |changes: serde_json::Value| {
        let mut claims = gitlab.job_claims(AUDIENCE);
        for (k, v) in changes.as_object().unwrap() {
            claims[k] = v.clone();
        }
        claims
    };
    let cases: Vec<(&str, String)> = vec![
        (
            "another key",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Forged),
        ),
        (
            "an unknown kid",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::UnknownKid),
        ),
        (
            "alg none",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::NoAlgorithm),
        ),
        (
            "HS256 with the public key",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::HmacWithPublicKey),
        ),
        (
            "RS384",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Rs384),
        ),
        (
            "another audience",
            gitlab.sign(
                &with(json!({"aud": "https://elsewhere.example.com"})),
                Signer::Rsa,
            ),
        ),
        (
            "another issuer",
            gitlab.sign(
                &with(json!({"iss": "https://gitlab.evil.example"})),
                Signer::Rsa,
            ),
        ),
        (
            "expired",
            gitlab.sign(
                &with(json!({"exp": now - 60, "iat": now - 400, "nbf": now - 400})),
                Signer::Rsa,
            ),
        ),
        (
            "not yet valid",
            gitlab.sign(&with(json!({"nbf": now + 120})), Signer::Rsa),
        ),
        ("no expiry", {
            let mut claims = gitlab.job_claims(AUDIENCE);
            claims.as_object_mut().unwrap().remove("exp");
            gitlab.sign(&claims, Signer::Rsa)
        }),
        ("not a JWT", "glpat-xxxxxxxxxxxxxxxxxxxx".to_owned()),
        ("a tampered payload", {
            let token = gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Rsa);
            let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
            use base64::Engine;
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
            let mut claims: serde_json::Value =
                serde_json::from_slice(&b64.decode(&parts[1]).unwrap()).unwrap();
            claims["project_id"] = json!("1");
            parts[1] = b64.encode(claims.to_string());
            parts.join(".")
        }),
    ];
    for (what, token) in cases {
        match tokens.verify(&token).await {
            Ok(job) => panic!("{what}: accepted as {job:?}"),
            Err(Refused::Keys(e)) => panic!("{what}: GitLab unreachable? {e}"),
            Err(_) => {}
        }
    }
    // The set was fetched once: the unknown kid came within the refetch interval.
    assert_eq!(gitlab.key_fetches.load(Ordering::SeqCst), 1);
    // Past the interval an unknown kid fetches it again, once for a whole burst.
    // (Signed first: RSA signing is slow in a debug build.)
    let burst = gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::UnknownKid);
    tokio::time::sleep(REFETCH + std::time::Duration::from_millis(50)).await;
    for _ in 0..20 {
        assert!(tokens.verify(&burst).await.is_err());
    }
    assert_eq!(gitlab.key_fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn gitlab_unreachable_is_not_a_refusal_of_the_token() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let policy = Policy {
        attempts: 2,
        backoff: std::time::Duration::from_millis(10),
        ..Policy::default()
    };
    let tokens = IdTokens::new(
        GitLab::new(&url, None, Arc::default(), policy).unwrap(),
        AUDIENCE,
    );
    let gitlab = TestGitLab::start().await;
    let token = gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Rsa);
    assert!(matches!(tokens.verify(&token).await, Err(Refused::Keys(_))));
}
