//! YAML configuration: envlens' own file (`Settings::parse`, with every check it makes at
//! start-up) and an agent's `.gitlab/agents/<name>/config.yaml` as the sync reads it from the
//! repository (any YAML, then the mapping read as an agent configuration and checked as GitLab
//! checks it). The first byte picks which. The oracle: no panic, no hang, and a refusal of the
//! agent's configuration a 4xx.
#![no_main]

use envlens::config::file::Settings;
use envlens::gitlab::agent_config::AgentConfig;
use envlens::http::extract::from_value;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|input: &[u8]| {
    let Some((&which, rest)) = input.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    if which % 2 == 0 {
        let _ = Settings::parse(&text);
        return;
    }
    let Ok(Value::Object(config)) = serde_saphyr::from_str::<Value>(&text) else {
        return;
    };
    match from_value::<AgentConfig>(Value::Object(config), "agent_config") {
        Ok(config) => {
            if let Err(e) = config.validate("agent_config") {
                assert!(e.status().is_client_error(), "{e}");
            }
        }
        Err(e) => assert!(e.status().is_client_error(), "{e}"),
    }
});
