//! Health scripts in Argo CD's format (SPEC 11): the user's Lua, run per object, sandboxed.
//!
//! As Argo CD: a script sees the whole object as the global `obj` (JSON turned into Lua tables:
//! arrays from 1, `null` is `nil`) and returns `{status = ..., message = ...}`; `nil` or an
//! empty table means no health. Argo CD runs them in gopher-lua: Lua 5.1 with `goto`, which
//! Argo CD's own scripts use. Here LuaJIT, which is that too (Lua 5.4 would not do: its
//! integers print `4/2` as `2.0`, and it has no `unpack`), with its compiler off so that the
//! instruction bound counts every instruction; with only the base, `string`, `table` and `math`
//! libraries, and none of the base functions that load code or reach outside (`dofile`,
//! `load`, `require`, ...).
//!
//! Which script applies, in Argo CD's order: an inline script (`health.scripts`, keyed as in
//! `argocd-cm`: `<group>_<Kind>`, `<Kind>` for the core group, `*` and `?` as wildcards, `all`
//! for every kind), then the folder (`health.customizations`, laid out as Argo CD's
//! `resource_customizations`: `<group>/<Kind>/health.lua`, `<Kind>/health.lua` for the core
//! group, and a `_` in a folder name standing for any text but `/`), each exact key before
//! patterns. A script replaces the built-in rule of its kind.
//!
//! Scripts are compiled when envlens starts, into each interpreter of a small pool: an
//! interpreter runs one object at a time, and the resource group reads its objects on two
//! threads. One that does not compile is logged, counted ([`Customizations::not_compiled`]) and
//! gives the objects of its kind `Unknown` with the reason: it costs only its kind, never the
//! folder, since a folder such as Argo CD's holds scripts written for another Lua than ours. A
//! script that fails, returns something else than a health or runs past its bounds
//! (instructions, memory) gives that object `Unknown` with the reason.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use mlua::{Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, VmState};
use serde_json::Value;

use super::{Health, HealthStatus};

/// Instructions a script may run for one object: 100 steps of 100,000, some tenths of a second
/// (Argo CD stops a script after a second).
const STEP: u32 = 100_000;
const STEPS: u32 = 100;
/// Memory of one interpreter: its scripts and the object it is given.
const MEMORY: usize = 64 << 20;
/// Base functions that load code, reach files or the collector: not for a health script.
const REMOVED: &[&str] = &[
    "dofile",
    "loadfile",
    "load",
    "loadstring",
    "require",
    "module",
    "collectgarbage",
    "gcinfo",
    "newproxy",
    "getfenv",
    "setfenv",
    // LuaJIT's switches of its compiler, turned off below.
    "jit",
];
/// Argo CD's answer to a status that is not one of its six.
const INVALID: &str = "Lua returned an invalid health status";

/// One script: where it came from (the name its errors carry) and its text.
struct Script {
    name: String,
    source: String,
    /// Why it does not compile, as its kind's health says.
    error: Option<String>,
}

/// Scripts by kind: exact keys, then patterns in order.
#[derive(Default)]
struct Index {
    /// Kind, then (group, script). Looked up for every object of a group: Fx, not SipHash,
    /// whose hashing of the kind was most of what loaded scripts cost the kinds without one.
    exact: rustc_hash::FxHashMap<Box<str>, Vec<(Box<str>, usize)>>,
    /// (pattern over `<group>/<Kind>` or `<Kind>`, whether `*` also matches `/`, script).
    patterns: Vec<(String, bool, usize)>,
}

impl Index {
    fn find(&self, group: &str, kind: &str, key: &mut Option<String>) -> Option<usize> {
        let exact = self.exact.get(kind).and_then(|groups| {
            groups
                .iter()
                .find(|(g, _)| &**g == group)
                .map(|(_, script)| *script)
        });
        if exact.is_some() || self.patterns.is_empty() {
            return exact;
        }
        let key = key.get_or_insert_with(|| config_map_key(group, kind));
        self.patterns
            .iter()
            .find(|(pattern, slash, _)| glob(pattern.as_bytes(), key.as_bytes(), *slash))
            .map(|(_, _, script)| *script)
    }

    fn add(&mut self, key: &str, pattern_slash: bool, script: usize) {
        if key.contains(['*', '?']) {
            self.patterns.push((key.to_string(), pattern_slash, script));
            return;
        }
        let (group, kind) = key.split_once('/').unwrap_or(("", key));
        self.exact
            .entry(kind.into())
            .or_default()
            .push((group.into(), script));
    }
}

/// Argo CD's key of a kind: `<group>/<Kind>`, or `<Kind>` in the core group.
fn config_map_key(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_string()
    } else {
        format!("{group}/{kind}")
    }
}

/// `*` (any text; not `/` unless `slash`) and `?` (one character) over bytes.
fn glob(pattern: &[u8], text: &[u8], slash: bool) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len())
            .take_while(|&i| i == 0 || slash || text[i - 1] != b'/')
            .any(|i| glob(rest, &text[i..], slash)),
        Some((&p, rest)) => text.split_first().is_some_and(|(&t, more)| {
            (p == t || (p == b'?' && t != b'/')) && glob(rest, more, slash)
        }),
    }
}

/// The user's health scripts, compiled; `Default` has none.
#[derive(Default)]
pub struct Customizations {
    scripts: Vec<Script>,
    inline: Index,
    folder: Index,
    idle: Mutex<Vec<Interpreter>>,
}

impl Customizations {
    /// Reads the folder's `health.lua` files and takes the inline scripts; compiles them all.
    pub fn load(folder: Option<&Path>, inline: &BTreeMap<String, String>) -> anyhow::Result<Self> {
        let mut custom = Customizations::default();
        for (key, source) in inline {
            let key = override_key(key)?;
            custom.inline.add(&key, true, custom.scripts.len());
            custom.scripts.push(Script {
                name: format!("health.scripts.{}", key.replacen('/', "_", 1)),
                source: source.clone(),
                error: None,
            });
        }
        if let Some(folder) = folder {
            let mut found = Vec::new();
            find_scripts(folder, "", 0, &mut found)
                .with_context(|| format!("health customizations {}", folder.display()))?;
            // Sorted, as Argo CD sorts its patterns, so that the first match is always the same.
            found.sort();
            for key in found {
                let path = folder.join(&key).join("health.lua");
                let source = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let pattern = key.replace('_', "*");
                custom.folder.add(&pattern, false, custom.scripts.len());
                custom.scripts.push(Script {
                    name: format!("{key}/health.lua"),
                    source,
                    error: None,
                });
            }
        }
        if !custom.scripts.is_empty() {
            let (interpreter, errors) = Interpreter::new(&custom.scripts)?;
            for (script, error) in custom.scripts.iter_mut().zip(errors) {
                if let Some(error) = &error {
                    tracing::warn!(
                        script = %script.name,
                        %error,
                        "health script does not compile: its kind's health is Unknown"
                    );
                }
                script.error = error.map(|e| format!("does not compile: {e}"));
            }
            custom.idle.lock().expect("pool").push(interpreter);
        }
        Ok(custom)
    }

    /// The scripts that do not compile: (name, why).
    pub fn not_compiled(&self) -> impl Iterator<Item = (&str, &str)> {
        self.scripts
            .iter()
            .filter_map(|s| Some((s.name.as_str(), s.error.as_deref()?)))
    }

    pub fn is_empty(&self) -> bool {
        self.scripts.is_empty()
    }

    /// How many scripts there are.
    pub fn len(&self) -> usize {
        self.scripts.len()
    }

    /// What the script for `object`'s kind says of it, as Argo CD's `ExecuteHealthLua` gives it
    /// (and its `TestLuaHealthScript` checks it): the script alone, without the deletion rule
    /// that [`super::health_with`] applies first, as Argo CD's controller does. None when no
    /// script applies to the kind.
    pub fn script_health(&self, object: &Value) -> Option<Option<Health>> {
        let text = |field: &str| object.get(field).and_then(Value::as_str).unwrap_or("");
        let group = text("apiVersion")
            .split_once('/')
            .map_or("", |(group, _)| group);
        let script = self.script_for(group, text("kind"))?;
        Some(self.run(script, object))
    }

    /// The script for a kind, if any.
    pub(super) fn script_for(&self, group: &str, kind: &str) -> Option<usize> {
        let mut key = None;
        self.inline
            .find(group, kind, &mut key)
            .or_else(|| self.folder.find(group, kind, &mut key))
    }

    /// Runs a script over the whole object: None when it says nothing (`nil`, `{}`).
    pub(super) fn run(&self, script: usize, object: &Value) -> Option<Health> {
        if let Some(error) = &self.scripts[script].error {
            return Some(Health::new(HealthStatus::Unknown, error.as_str()));
        }
        let idle = self.idle.lock().expect("pool").pop();
        let interpreter = match idle {
            Some(interpreter) => interpreter,
            None => match Interpreter::new(&self.scripts) {
                Ok((interpreter, _)) => interpreter,
                Err(e) => return Some(Health::new(HealthStatus::Unknown, format!("{e:#}"))),
            },
        };
        let health = interpreter.run(script, object);
        self.idle.lock().expect("pool").push(interpreter);
        health
    }
}

/// `argocd-cm`'s `<group>_<Kind>`, `<Kind>` or `all` as Argo CD's key (`<group>/<Kind>`, ...).
fn override_key(key: &str) -> anyhow::Result<String> {
    let parts: Vec<&str> = key.split('_').collect();
    match parts[..] {
        ["all"] => Ok("*/*".into()),
        [kind] if !kind.is_empty() => Ok(kind.into()),
        [group, kind] if !kind.is_empty() => Ok(format!("{group}/{kind}")),
        _ => anyhow::bail!("health.scripts: `{key}` is not `<group>_<Kind>` or `<Kind>`"),
    }
}

/// The folders (relative, `/`-separated) under `dir` that hold a `health.lua`, two levels deep
/// at most: `<group>/<Kind>` or `<Kind>`.
fn find_scripts(
    dir: &Path,
    prefix: &str,
    depth: usize,
    found: &mut Vec<String>,
) -> anyhow::Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if depth > 0 && name == "health.lua" {
            found.push(prefix.to_string());
        } else if depth < 2 && entry.file_type()?.is_dir() {
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            find_scripts(&entry.path(), &path, depth + 1, found)?;
        }
    }
    Ok(())
}

/// One Lua state with every script compiled, used by one object at a time.
struct Interpreter {
    lua: Lua,
    /// None for a script that does not compile.
    scripts: Vec<Option<Function>>,
    /// `{__index = the sandbox's globals}`: each run gets fresh globals of its own, as a fresh
    /// gopher-lua state gives each of Argo CD's runs.
    globals: Table,
    steps: Arc<AtomicU32>,
}

impl Interpreter {
    /// The interpreter, and why each script does not compile (None: it does).
    fn new(scripts: &[Script]) -> anyhow::Result<(Self, Vec<Option<String>>)> {
        let libs = StdLib::TABLE | StdLib::STRING | StdLib::MATH | StdLib::JIT;
        let lua = Lua::new_with(libs, LuaOptions::default())?;
        lua.set_memory_limit(MEMORY)?;
        let globals = lua.globals();
        // LuaJIT calls the count hook from its interpreter only: compiled code (a hot loop)
        // would run past the instruction bound. Off for the whole state; scripts are short,
        // and the interpreter alone is faster than Lua 5.1's.
        lua.load("jit.off()").exec()?;
        for name in REMOVED {
            globals.raw_set(*name, mlua::Value::Nil)?;
        }
        // Scripts written for Argo CD may print while debugging: kept, and silent.
        globals.raw_set("print", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
        let steps = Arc::new(AtomicU32::new(0));
        let counted = steps.clone();
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(STEP),
            move |_, _| {
                if counted.fetch_add(1, Ordering::Relaxed) + 1 >= STEPS {
                    return Err(mlua::Error::runtime(format!(
                        "the script ran past its bound of {} instructions",
                        u64::from(STEP) * u64::from(STEPS)
                    )));
                }
                Ok(VmState::Continue)
            },
        )?;
        let (compiled, errors) = scripts
            .iter()
            .map(|s| {
                let chunk = lua.load(s.source.as_str()).set_name(format!("={}", s.name));
                match chunk.into_function() {
                    Ok(function) => (Some(function), None),
                    Err(e) => (None, Some(error_text(&e))),
                }
            })
            .unzip();
        let meta = lua.create_table()?;
        meta.raw_set("__index", globals)?;
        let interpreter = Interpreter {
            lua,
            scripts: compiled,
            globals: meta,
            steps,
        };
        Ok((interpreter, errors))
    }

    fn run(&self, script: usize, object: &Value) -> Option<Health> {
        self.steps.store(0, Ordering::Relaxed);
        let returned = (|| {
            let env = self.lua.create_table()?;
            env.set_metatable(Some(self.globals.clone()))?;
            env.raw_set("obj", to_lua(&self.lua, object)?)?;
            let Some(function) = &self.scripts[script] else {
                // Customizations::run answers for a script that does not compile.
                return Ok(mlua::Value::Nil);
            };
            function.set_environment(env)?;
            // Argo CD reads the value on top of the stack: the last one returned.
            let values = function.call::<MultiValue>(())?;
            Ok::<_, mlua::Error>(values.into_iter().last().unwrap_or(mlua::Value::Nil))
        })();
        match returned {
            Ok(value) => verdict(&value),
            Err(e) => {
                // Lua 5.1 (LuaJIT too) does not collect when an allocation fails: what the script left is
                // freed now, so that the next object has the memory back.
                let _ = self.lua.gc_collect();
                Some(Health::new(HealthStatus::Unknown, error_text(&e)))
            }
        }
    }
}

/// What a script's returned value says, as Argo CD reads it.
fn verdict(value: &mlua::Value) -> Option<Health> {
    let table = match value {
        mlua::Value::Nil => return None,
        mlua::Value::Table(table) => table,
        other => {
            let message = format!(
                "expect table output from Lua script, not {}",
                other.type_name()
            );
            return Some(Health::new(HealthStatus::Unknown, message));
        }
    };
    let field = |name: &str| {
        table
            .raw_get::<mlua::Value>(name)
            .unwrap_or(mlua::Value::Nil)
    };
    let text = |value: &mlua::Value| match value {
        mlua::Value::String(s) => Some(s.to_string_lossy()),
        _ => None,
    };
    let (status, message) = (field("status"), field("message"));
    if status.is_nil() && message.is_nil() {
        // `{}`: Argo CD's empty health, which shows none.
        return None;
    }
    let status = text(&status).and_then(|s| serde_json::from_value(Value::String(s)).ok());
    match (status, message) {
        (Some(status), mlua::Value::Nil) => Some(Health::new(status, "")),
        (Some(status), message) if text(&message).is_some() => {
            Some(Health::new(status, text(&message).unwrap_or_default()))
        }
        _ => Some(Health::new(HealthStatus::Unknown, INVALID)),
    }
}

/// The JSON object as Lua tables, as Argo CD converts it: arrays from 1, `null` is `nil`.
fn to_lua(lua: &Lua, value: &Value) -> mlua::Result<mlua::Value> {
    Ok(match value {
        Value::Null => mlua::Value::Nil,
        Value::Bool(b) => mlua::Value::Boolean(*b),
        Value::Number(n) => mlua::Value::Number(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => mlua::Value::String(lua.create_string(s)?),
        Value::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                table.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            mlua::Value::Table(table)
        }
        Value::Object(fields) => {
            let table = lua.create_table_with_capacity(0, fields.len())?;
            for (key, item) in fields {
                table.raw_set(key.as_str(), to_lua(lua, item)?)?;
            }
            mlua::Value::Table(table)
        }
    })
}

/// The error as a user reads it: the cause, without Lua's stack traceback.
fn error_text(e: &mlua::Error) -> String {
    match e {
        mlua::Error::CallbackError { cause, .. } => error_text(cause),
        mlua::Error::RuntimeError(message) | mlua::Error::SyntaxError { message, .. } => message
            .split("\nstack traceback:")
            .next()
            .unwrap_or(message)
            .to_string(),
        mlua::Error::MemoryError(_) => format!(
            "the script ran past its bound of {} MiB of memory",
            MEMORY >> 20
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{health_with, HealthStatus::*};
    use super::*;
    use crate::resources::tree::TreeBuf;

    fn inline(scripts: &[(&str, &str)]) -> Customizations {
        let scripts = scripts
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Customizations::load(None, &scripts).expect("scripts compile")
    }

    fn widget(status: Value) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
               "metadata": {"name": "w", "namespace": "shop"}, "status": status})
    }

    /// The health of `object` by `custom`, given the whole object.
    fn judge(custom: &Customizations, object: &Value) -> Option<Health> {
        health_with(&TreeBuf::from(object), || Some(object.clone()), custom)
    }

    fn unknown(custom: &Customizations, object: &Value) -> String {
        let health = judge(custom, object).expect("a health");
        assert_eq!(health.status, Unknown, "{health:?}");
        health.message.expect("a reason")
    }

    #[test]
    fn a_script_sees_the_object_and_its_answer_is_the_health() {
        let custom = inline(&[(
            "example.com_Widget",
            r#"local c = obj.status.conditions[1]
               return {status = c.status == "True" and "Healthy" or "Degraded",
                       message = c.message .. " (" .. #obj.status.conditions .. ")"}"#,
        )]);
        let object =
            widget(json!({"conditions": [{"status": "False", "message": "broken"}, null]}));
        let got = judge(&custom, &object).unwrap();
        assert_eq!(
            (got.status, got.message.as_deref()),
            (Degraded, Some("broken (1)"))
        );
    }

    #[test]
    fn a_script_replaces_the_built_in_rule_and_deletion_comes_first() {
        let custom = inline(&[(
            "apps_Deployment",
            r#"return {status = "Suspended", message = obj.metadata.name}"#,
        )]);
        let mut deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 1}, "status": {}});
        assert_eq!(
            judge(&custom, &deployment),
            Some(Health::new(Suspended, "web"))
        );
        deployment["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        assert_eq!(
            judge(&custom, &deployment),
            Some(Health::new(Progressing, "Pending deletion"))
        );
        // Other kinds keep their rules.
        let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "status": {"phase": "Bound"}});
        assert_eq!(judge(&custom, &pvc), Some(Health::new(Healthy, "")));
    }

    #[test]
    fn nil_and_an_empty_table_give_no_health() {
        for script in ["return nil", "return {}", "local x = 1"] {
            let custom = inline(&[("example.com_Widget", script)]);
            assert_eq!(judge(&custom, &widget(json!({}))), None, "{script}");
        }
    }

    #[test]
    fn what_is_not_a_health_is_unknown_with_the_reason() {
        for (script, reason) in [
            (
                "return 'Healthy'",
                "expect table output from Lua script, not string",
            ),
            ("return {status = 'Fine'}", INVALID),
            ("return {status = 1}", INVALID),
            ("return {message = 'no status'}", INVALID),
            ("return {status = 'Healthy', message = {}}", INVALID),
            (
                "return obj.spec.replicas",
                "health.scripts.example.com_Widget:1: attempt to index field 'spec' (a nil value)",
            ),
            (
                "error('gave up')",
                "health.scripts.example.com_Widget:1: gave up",
            ),
        ] {
            let custom = inline(&[("example.com_Widget", script)]);
            assert_eq!(unknown(&custom, &widget(json!({}))), reason, "{script}");
        }
    }

    #[test]
    fn the_sandbox_has_no_way_out() {
        for name in [
            "io",
            "os",
            "require",
            "dofile",
            "loadfile",
            "load",
            "loadstring",
            "debug",
            "package",
            "setfenv",
            "jit",
            "ffi",
            "bit",
        ] {
            let script = format!("return {{status = 'Healthy', message = type({name})}}");
            let custom = inline(&[("example.com_Widget", &script)]);
            assert_eq!(
                judge(&custom, &widget(json!({}))),
                Some(Health::new(Healthy, "nil")),
                "{name}"
            );
        }
        let custom = inline(&[("example.com_Widget",
            "return {status = 'Healthy', message = string.format('%s %d', table.concat({'a', 'b'}), math.max(1, 2))}")]);
        assert_eq!(
            judge(&custom, &widget(json!({}))),
            Some(Health::new(Healthy, "ab 2"))
        );
    }

    #[test]
    fn globals_do_not_outlive_a_run() {
        let custom = inline(&[(
            "example.com_Widget",
            "seen = (seen or 0) + 1 return {status = 'Healthy', message = tostring(seen)}",
        )]);
        for _ in 0..3 {
            assert_eq!(
                judge(&custom, &widget(json!({}))),
                Some(Health::new(Healthy, "1"))
            );
        }
    }

    #[test]
    fn a_script_past_its_bounds_is_stopped_and_the_next_runs() {
        let custom = inline(&[
            ("example.com_Widget", "while true do end"),
            ("example.com_Gizmo", "return {status = 'Healthy'}"),
        ]);
        assert_eq!(
            unknown(&custom, &widget(json!({}))),
            "the script ran past its bound of 10000000 instructions"
        );
        let mut gizmo = widget(json!({}));
        gizmo["kind"] = json!("Gizmo");
        assert_eq!(judge(&custom, &gizmo), Some(Health::new(Healthy, "")));
    }

    #[test]
    fn memory_is_bounded() {
        let custom = inline(&[(
            "example.com_Widget",
            "local s = string.rep('x', 200 * 1024 * 1024) return {status = 'Healthy'}",
        )]);
        assert_eq!(
            unknown(&custom, &widget(json!({}))),
            "the script ran past its bound of 64 MiB of memory"
        );
    }

    #[test]
    fn keys_and_patterns_in_argo_cds_order() {
        let custom = inline(&[
            ("Pod", "return {status = 'Healthy', message = 'core'}"),
            (
                "*.example.com_*",
                "return {status = 'Healthy', message = 'pattern'}",
            ),
            (
                "example.com_Widget",
                "return {status = 'Healthy', message = 'exact'}",
            ),
        ]);
        let said = |api_version: &str, kind: &str| {
            let object =
                json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}});
            judge(&custom, &object).and_then(|h| h.message)
        };
        assert_eq!(said("v1", "Pod").as_deref(), Some("core"));
        assert_eq!(said("example.com/v1", "Widget").as_deref(), Some("exact"));
        assert_eq!(
            said("a.b.example.com/v1", "Thing").as_deref(),
            Some("pattern")
        );
        assert_eq!(custom.script_for("example.com", "Gadget"), None);
        assert_eq!(custom.script_for("apps", "Pod"), None);
        let all = inline(&[("all", "return nil")]);
        assert_eq!(all.script_for("apps", "Deployment"), Some(0));
        assert!(glob(
            b"*.crossplane.io/*",
            b"pkg.crossplane.io/Provider",
            false
        ));
        assert!(!glob(b"*/*", b"a/b/c", false));
        assert!(glob(b"*", b"a/b", true));
        assert!(glob(b"Wid?et", b"Widget", false));
        for bad in ["a_b_c", "_", "group_"] {
            let scripts = [(bad.to_string(), "return nil".to_string())].into();
            let err = Customizations::load(None, &scripts).err().expect("refused");
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn a_script_that_does_not_compile_costs_only_its_kind() {
        let custom = inline(&[
            ("example.com_Widget", "return {"),
            ("example.com_Gizmo", "return {status = 'Healthy'}"),
        ]);
        let reason = unknown(&custom, &widget(json!({})));
        assert!(
            reason.starts_with("does not compile: health.scripts.example.com_Widget:1:"),
            "{reason}"
        );
        let mut gizmo = widget(json!({}));
        gizmo["kind"] = json!("Gizmo");
        assert_eq!(judge(&custom, &gizmo), Some(Health::new(Healthy, "")));
    }

    /// Argo CD's 3scale and Gateway API scripts skip conditions with `goto continue`: Lua 5.2
    /// syntax that gopher-lua, and LuaJIT, take.
    #[test]
    fn a_script_with_goto_runs() {
        let custom = inline(&[(
            "example.com_Widget",
            r#"local n = 0
               for _, c in ipairs(obj.status.conditions) do
                 if c.status ~= "True" then goto continue end
                 n = n + 1
                 ::continue::
               end
               return {status = "Healthy", message = n .. " of " .. #obj.status.conditions}"#,
        )]);
        let object = widget(json!({"conditions": [{"status": "True"}, {"status": "False"}]}));
        assert_eq!(
            judge(&custom, &object),
            Some(Health::new(Healthy, "1 of 2"))
        );
    }

    /// A loop hot enough for a JIT compiler to take it is still counted, and stopped: with
    /// LuaJIT's compiler on, compiled code would never call the instruction hook. On a thread
    /// of its own, so that a bound that does not hold fails the test instead of hanging it.
    #[test]
    fn a_hot_loop_is_stopped_by_the_instruction_bound() {
        let custom = inline(&[(
            "example.com_Widget",
            "local t, s = {}, 0 for i = 1, 1e12 do t[i % 64] = i s = s + i % 7 end return {status = 'Healthy'}",
        )]);
        let (sent, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sent.send(unknown(&custom, &widget(json!({}))));
        });
        let reason = got
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the bound stops the loop");
        assert_eq!(
            reason,
            "the script ran past its bound of 10000000 instructions"
        );
    }
}
