//! The JSON bodies envlens takes from outside: the internal API's (identity snapshot, agent,
//! agent tokens, agent configuration, deployment creation), the CI job's request
//! (`POST /api/v4/ci/deployments`) and GitLab's hooks (system, deployment, push), each read and
//! checked as its handler does before anything is written. The first byte picks the body; the
//! oracle: no panic, and every refusal a 4xx.
#![no_main]

use envlens::error::Error;
use envlens::gitlab::agent_config::AgentConfig;
use envlens::gitlab::push::PushEvent;
use envlens::http::extract::{from_value, parse, parse_list};
use envlens::ingest::agents::{AgentBody, TokenIn};
use envlens::ingest::deployments::{CreationBody, DeploymentHook, KubernetesIn};
use envlens::ingest::identity::{IdentitySnapshot, SystemHook};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn client_error<T>(result: Result<T, Error>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            assert!(e.status().is_client_error(), "{}: {e}", e.status());
            None
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&which, body)) = input.split_first() else {
        return;
    };
    match which % 9 {
        0 => {
            client_error(parse::<IdentitySnapshot>(body));
        }
        1 => {
            client_error(parse::<AgentBody>(body));
        }
        2 => {
            client_error(parse_list::<TokenIn>(body));
        }
        3 => {
            // The configuration endpoint's `agent_config` (the agent's config.yaml as JSON).
            if let Some(value) = client_error(parse::<Value>(body)) {
                let config = client_error(from_value::<AgentConfig>(value, "agent_config"));
                if let Some(config) = config {
                    client_error(config.validate("agent_config"));
                }
            }
        }
        4 => {
            if let Some(body) = client_error(parse::<CreationBody>(body)) {
                client_error(body.check());
            }
        }
        5 => {
            if let Some(kubernetes) = client_error(parse::<KubernetesIn>(body)) {
                client_error(kubernetes.check());
            }
        }
        6 => {
            if let Some(value) = client_error(parse::<Value>(body)) {
                if let Some(hook) = client_error(SystemHook::from_json(value)) {
                    if client_error(hook.validate()).is_some() {
                        let _ = hook.footprint();
                    }
                }
            }
        }
        7 => {
            if let Some(value) = client_error(parse::<Value>(body)) {
                let hook = client_error(from_value::<DeploymentHook>(value, ""));
                if let Some(status) = hook.and_then(|h| client_error(h.validate())) {
                    let _ = status.footprint();
                    let _ = status.succeeded();
                }
            }
        }
        _ => {
            if let Some(value) = client_error(parse::<Value>(body)) {
                if let Some(push) = client_error(from_value::<PushEvent>(value, "")) {
                    let _ = push.agents_untouched();
                    let _ = push.footprint();
                }
            }
        }
    }
});
