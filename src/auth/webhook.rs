//! GitLab's hooks: a token in `X-Gitlab-Token`, checked before the body is read. The
//! instance's token (`--webhook-token-file`) is its administrators' and vouches for any event;
//! a group webhook's token (`gitlab.webhooks`) is that group's Owners', and vouches only for
//! events inside the group (SPEC 13): the extractor says which one it was.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use subtle::{Choice, ConstantTimeEq};

use super::secrets::{read_token, Secret};
use super::Keys;
use crate::error::Error;

const TOKEN_HEADER: &str = "x-gitlab-token";

/// Whose token the request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Webhook {
    /// The instance's: any event.
    Instance,
    /// The webhook token of the group at this full path (as configured): events inside it only.
    Group(String),
}

/// A group webhook's token.
#[derive(Debug)]
pub struct GroupToken {
    group: String,
    token: Secret,
}

impl GroupToken {
    /// The token in `token_file` (as `--webhook-token-file` holds it) for the group `group`.
    pub fn load(group: &str, token_file: &Path) -> anyhow::Result<Self> {
        Ok(GroupToken {
            group: group.to_owned(),
            token: read_token(token_file)?,
        })
    }
}

impl Keys {
    /// Takes the group webhooks' tokens too. Each must differ from the instance's and from
    /// the others', or an event could not tell whose it is.
    pub fn with_group_webhooks(mut self, tokens: Vec<GroupToken>) -> anyhow::Result<Self> {
        for (i, t) in tokens.iter().enumerate() {
            let same_as_earlier = tokens[..i]
                .iter()
                .any(|other| other.token.bytes() == t.token.bytes());
            anyhow::ensure!(
                t.token.bytes() != self.webhook_token.bytes() && !same_as_earlier,
                "gitlab.webhooks: the token of group {} is the instance's or another group's: \
                 each group needs a token of its own",
                t.group
            );
        }
        self.group_webhooks = tokens;
        Ok(self)
    }

    /// Whose token `sent` is, comparing it with every token in constant time, so that the
    /// time taken says nothing of which one (or how much of one) matched.
    fn webhook_of(&self, sent: &[u8]) -> Option<Webhook> {
        let instance = sent.ct_eq(self.webhook_token.bytes());
        let mut group: Option<&str> = None;
        let mut any_group = Choice::from(0);
        for t in &self.group_webhooks {
            let matched = sent.ct_eq(t.token.bytes());
            any_group |= matched;
            if bool::from(matched) {
                group = Some(&t.group);
            }
        }
        if bool::from(instance) {
            Some(Webhook::Instance)
        } else if bool::from(any_group) {
            group.map(|g| Webhook::Group(g.to_owned()))
        } else {
            None
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Webhook
where
    Arc<Keys>: FromRef<S>,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let sent = parts
            .headers
            .get(TOKEN_HEADER)
            .ok_or_else(|| Error::Unauthorized("missing X-Gitlab-Token header".into()))?;
        Arc::<Keys>::from_ref(state)
            .webhook_of(sent.as_bytes())
            .ok_or_else(|| Error::Unauthorized("X-Gitlab-Token does not match".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::secrets::Secrets;

    fn keys() -> Keys {
        Keys::new(Secrets {
            internal: Secret::new(vec![1; 32]),
            session: Secret::new(vec![2; 32]),
            webhook_token: Secret::new(b"instance".to_vec()),
            generated: Vec::new(),
        })
    }

    fn group(path: &str, token: &str) -> GroupToken {
        GroupToken {
            group: path.into(),
            token: Secret::new(token.as_bytes().to_vec()),
        }
    }

    #[test]
    fn each_token_is_its_own_source() {
        let keys = keys()
            .with_group_webhooks(vec![group("acme/a", "token-a"), group("acme/b", "token-b")])
            .unwrap();
        assert_eq!(keys.webhook_of(b"instance"), Some(Webhook::Instance));
        assert_eq!(
            keys.webhook_of(b"token-b"),
            Some(Webhook::Group("acme/b".into()))
        );
        assert_eq!(keys.webhook_of(b"token-"), None);
        assert_eq!(keys.webhook_of(b""), None);
        assert_eq!(keys.webhook_of(b"instance "), None);
    }

    #[test]
    fn a_token_shared_between_sources_is_refused() {
        assert!(keys()
            .with_group_webhooks(vec![group("acme/a", "instance")])
            .is_err());
        assert!(keys()
            .with_group_webhooks(vec![group("acme/a", "t"), group("acme/b", "t")])
            .is_err());
    }
}
