//! Health scripts' results: the object handed to a script (JSON to Lua) and what the script
//! returns turned into a health (Lua to envlens' `Health`), as Argo CD's scripts are run. The
//! input is a JSON value; one script returns it as it came (`obj.result`), another builds its
//! answer from its fields, a third walks it. The oracle: no panic, no hang (the sandbox's
//! instruction and memory bounds hold), and a health only from a table with a known status.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use envlens::resources::health::Customizations;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

const SCRIPTS: [(&str, &str); 3] = [
    ("example.com_Returned", "return obj.result"),
    (
        "example.com_Built",
        "local hs = {}\n\
         if obj.result ~= nil and type(obj.result) == 'table' then\n\
           hs.status = obj.result.status\n\
           hs.message = obj.result.message\n\
         end\n\
         return hs",
    ),
    (
        "example.com_Walked",
        "local n = 0\n\
         local function walk(v, depth)\n\
           if depth > 50 then return end\n\
           if type(v) == 'table' then\n\
             for k, x in pairs(v) do n = n + 1; walk(x, depth + 1) end\n\
           end\n\
         end\n\
         walk(obj.result, 0)\n\
         return {status = n > 3 and 'Degraded' or 'Healthy', message = tostring(n)}",
    ),
];

fn custom() -> &'static Customizations {
    static CUSTOM: OnceLock<Customizations> = OnceLock::new();
    CUSTOM.get_or_init(|| {
        let inline: BTreeMap<String, String> = SCRIPTS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let custom = Customizations::load(None, &inline).expect("scripts compile");
        assert_eq!(custom.not_compiled().count(), 0);
        custom
    })
}

fuzz_target!(|input: &[u8]| {
    let Ok(result) = serde_json::from_slice::<Value>(input) else {
        return;
    };
    for kind in ["Returned", "Built", "Walked"] {
        let object = json!({
            "apiVersion": "example.com/v1",
            "kind": kind,
            "metadata": {"name": "w", "namespace": "apps"},
            "result": result,
        });
        let health = custom().script_health(&object);
        assert!(health.is_some(), "a script applies to {kind}");
    }
});
