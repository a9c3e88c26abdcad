//! Where GitLab's agent server keeps its Kubernetes API proxy, from `GET /api/v4/metadata`
//! (GitLab's `doc/api/metadata.md`): pure over the answer's JSON.
//!
//! ```json
//! {"version": "17.6.0", "kas": {"enabled": true, "externalUrl": "wss://kas.gitlab.com",
//!  "externalK8sProxyUrl": "https://kas.gitlab.com/k8s-proxy", "version": "17.6.0"}}
//! ```
//!
//! `externalK8sProxyUrl` came with GitLab 17.6; before, the proxy is `externalUrl` with
//! `wss://` turned to `https://` (`ws://` to `http://`) and `/k8s-proxy` appended, as `glab`
//! derives it. `externalUrl` may also be `grpc(s)://`, the agents' own port, which leads to no
//! proxy at all.

use serde::Deserialize;

use super::ProxyUrl;

/// KAS as the metadata describes it: the proxy's address and KAS' version (`null` when
/// GitLab could not ask KAS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub url: ProxyUrl,
    pub version: Option<String>,
    /// `true` when derived from `externalUrl` (GitLab before 17.6).
    pub derived: bool,
}

#[derive(Deserialize)]
struct Metadata {
    kas: Option<KasMetadata>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KasMetadata {
    #[serde(default)]
    enabled: bool,
    external_url: Option<String>,
    external_k8s_proxy_url: Option<String>,
    version: Option<String>,
}

/// The proxy's address in the metadata's JSON, or why there is none (a sentence for the
/// operator).
pub fn proxy_address(body: &[u8]) -> Result<Found, String> {
    let metadata: Metadata = serde_json::from_slice(body)
        .map_err(|e| format!("GitLab's metadata is not what /api/v4/metadata answers: {e}"))?;
    let Some(kas) = metadata.kas else {
        return Err(
            "GitLab's metadata has no `kas` (GitLab before 15.2): set gitlab.kas.url".into(),
        );
    };
    if !kas.enabled {
        return Err("the agent server is disabled on this GitLab (kas.enabled is false)".into());
    }
    let version = kas.version.filter(|v| !v.is_empty());
    if let Some(url) = kas.external_k8s_proxy_url.filter(|u| !u.is_empty()) {
        return ProxyUrl::parse(&url)
            .map(|url| Found {
                url,
                version: version.clone(),
                derived: false,
            })
            .ok_or_else(|| format!("kas.externalK8sProxyUrl `{url}` is not an http(s) URL"));
    }
    let Some(external) = kas.external_url.filter(|u| !u.is_empty()) else {
        return Err("GitLab's metadata names no address of the agent server".into());
    };
    let http = if let Some(rest) = external.strip_prefix("wss://") {
        format!("https://{rest}")
    } else if let Some(rest) = external.strip_prefix("ws://") {
        format!("http://{rest}")
    } else {
        return Err(format!(
            "kas.externalUrl `{external}` is the agents' gRPC port, which has no Kubernetes API \
             proxy: set gitlab.kas.url"
        ));
    };
    let url = format!("{}/k8s-proxy", http.trim_end_matches('/'));
    ProxyUrl::parse(&url)
        .map(|url| Found {
            url,
            version,
            derived: true,
        })
        .ok_or_else(|| format!("kas.externalUrl `{external}` is not a URL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(found: Result<Found, String>) -> String {
        found.unwrap().url.to_string()
    }

    #[test]
    fn gitlab_17_6_names_the_proxy() {
        let body = br#"{"version":"17.6.0","revision":"c401a659d0c","kas":{"enabled":true,
            "externalUrl":"grpc://gitlab.example.com:8150",
            "externalK8sProxyUrl":"https://gitlab.example.com:8150/k8s-proxy","version":"17.6.0"},
            "enterprise":true}"#;
        let found = proxy_address(body).unwrap();
        assert_eq!(
            found.url.to_string(),
            "https://gitlab.example.com:8150/k8s-proxy"
        );
        assert_eq!(found.version.as_deref(), Some("17.6.0"));
        assert!(!found.derived);
    }

    #[test]
    fn gitlab_17_5_is_derived_from_the_agents_address() {
        let body = br#"{"version":"17.5.0","kas":{"enabled":true,"externalUrl":"wss://kas.gitlab.com","version":"v17.5.0"}}"#;
        let found = proxy_address(body).unwrap();
        assert_eq!(found.url.to_string(), "https://kas.gitlab.com/k8s-proxy");
        assert!(found.derived);
        let body = br#"{"kas":{"enabled":true,"externalUrl":"ws://gitlab.example.com/-/kubernetes-agent/","version":null}}"#;
        let found = proxy_address(body).unwrap();
        assert_eq!(
            found.url.to_string(),
            "http://gitlab.example.com/-/kubernetes-agent/k8s-proxy"
        );
        assert_eq!(found.version, None);
        // 17.6's field present but null (an older KAS) falls back the same way.
        let body = br#"{"kas":{"enabled":true,"externalUrl":"wss://kas.example.com","externalK8sProxyUrl":null}}"#;
        assert_eq!(
            url(proxy_address(body)),
            "https://kas.example.com/k8s-proxy"
        );
    }

    #[test]
    fn says_why_there_is_no_proxy() {
        let why = |body: &[u8]| proxy_address(body).unwrap_err();
        assert!(why(br#"{"kas":{"enabled":false,"externalUrl":null,"externalK8sProxyUrl":null,"version":null}}"#)
            .contains("disabled"));
        assert!(
            why(br#"{"kas":{"enabled":true,"externalUrl":"grpcs://kas.example.com"}}"#)
                .contains("gitlab.kas.url")
        );
        assert!(why(br#"{"version":"15.0"}"#).contains("no `kas`"));
        assert!(why(b"<html>").contains("not what"));
        assert!(
            why(br#"{"kas":{"enabled":true,"externalK8sProxyUrl":"kas:8154"}}"#)
                .contains("not an http(s) URL")
        );
    }
}
