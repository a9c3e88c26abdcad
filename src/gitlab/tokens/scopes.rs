//! Which GitLab tokens envlens takes for what (SPEC 13, "GitLab's tokens"): the scopes GitLab
//! itself asks for. Pure: the answer GitLab gave about a token, and the use asked for.

/// What a GitLab token is to be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// GraphQL and envlens' own API: GitLab's API asks `read_api` (or `api`).
    Api,
    /// The Kubernetes proxy and GitLab's watch API: KAS asks `k8s_proxy` (or `api`).
    Kubernetes,
}

impl Purpose {
    /// The scopes that admit a token, the narrowest first.
    pub fn scopes(self) -> &'static [&'static str] {
        match self {
            Purpose::Api => &["read_api", "api"],
            Purpose::Kubernetes => &["k8s_proxy", "api"],
        }
    }

    fn what(self) -> &'static str {
        match self {
            Purpose::Api => "GraphQL and the API",
            Purpose::Kubernetes => "the Kubernetes proxy and the watch API",
        }
    }
}

/// What kind of token GitLab said it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenKind {
    /// A personal, project or group access token (`GET /personal_access_tokens/self`).
    AccessToken,
    /// An OAuth access token (`GET /oauth/token/info`); `own_application` when GitLab issued it
    /// to envlens' own application (`gitlab.client_id`, "Sign in with GitLab").
    OAuth { own_application: bool },
}

/// A token GitLab vouches for: whose, of which kind, with which scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vouched {
    pub user_id: i64,
    pub kind: TokenKind,
    pub scopes: Vec<String>,
}

/// Whether the token may be used for `purpose`: envlens' own OAuth application's tokens for
/// everything (the user signed in to envlens itself), any other token only with one of the
/// purpose's scopes. The refusal names the scope missing.
pub fn admits(token: &Vouched, purpose: Purpose) -> Result<(), String> {
    if token.kind
        == (TokenKind::OAuth {
            own_application: true,
        })
    {
        return Ok(());
    }
    if purpose
        .scopes()
        .iter()
        .any(|wanted| token.scopes.iter().any(|s| s == wanted))
    {
        return Ok(());
    }
    let [narrow, broad] = purpose.scopes() else {
        unreachable!("two scopes per purpose")
    };
    let whose = match token.kind {
        TokenKind::AccessToken => "the access token",
        TokenKind::OAuth { .. } => "the OAuth token, issued to another application,",
    };
    Err(format!(
        "{whose} lacks the scope `{narrow}` (or `{broad}`) that {} need",
        purpose.what()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(kind: TokenKind, scopes: &[&str]) -> Vouched {
        Vouched {
            user_id: 7,
            kind,
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn access_tokens_need_the_scope_of_their_use() {
        let pat = |scopes: &[&str]| token(TokenKind::AccessToken, scopes);
        for (scopes, api, kubernetes) in [
            (&["api"][..], true, true),
            (&["read_api"][..], true, false),
            (&["k8s_proxy"][..], false, true),
            (&["read_user"][..], false, false),
            (&["read_repository", "read_user"][..], false, false),
            (&[][..], false, false),
        ] {
            assert_eq!(
                admits(&pat(scopes), Purpose::Api).is_ok(),
                api,
                "{scopes:?}"
            );
            assert_eq!(
                admits(&pat(scopes), Purpose::Kubernetes).is_ok(),
                kubernetes,
                "{scopes:?}"
            );
        }
        let refused = admits(&pat(&["read_user"]), Purpose::Api).unwrap_err();
        assert!(refused.contains("`read_api`"), "{refused}");
        let refused = admits(&pat(&["read_api"]), Purpose::Kubernetes).unwrap_err();
        assert!(refused.contains("`k8s_proxy`"), "{refused}");
    }

    #[test]
    fn oauth_tokens_of_envlens_pass_and_others_need_scopes() {
        let own = token(
            TokenKind::OAuth {
                own_application: true,
            },
            &["openid", "read_user"],
        );
        assert!(admits(&own, Purpose::Api).is_ok());
        assert!(admits(&own, Purpose::Kubernetes).is_ok());
        let other = token(
            TokenKind::OAuth {
                own_application: false,
            },
            &["openid", "read_user"],
        );
        assert!(admits(&other, Purpose::Api)
            .unwrap_err()
            .contains("another application"));
        assert!(admits(&other, Purpose::Kubernetes).is_err());
        let other_api = token(
            TokenKind::OAuth {
                own_application: false,
            },
            &["api"],
        );
        assert!(admits(&other_api, Purpose::Kubernetes).is_ok());
    }
}
