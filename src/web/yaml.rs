//! A manifest as YAML, the way `kubectl get -o yaml` shows it: block style, keys in the
//! object's order, strings plain unless YAML would read them as something else.

use serde_json::Value;

pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => write_seq(&mut out, items, 0),
        scalar => {
            out.push_str(&scalar_text(scalar, 0));
            out.push('\n');
        }
    }
    out
}

fn indent(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn write_map(out: &mut String, map: &serde_json::Map<String, Value>, level: usize) {
    let mut first = true;
    for (key, value) in map {
        if !first || level > 0 {
            // The first key of a sequence item stays on the item's line (see write_seq).
        }
        if !first {
            indent(out, level);
        }
        first = false;
        out.push_str(&string_text(key, level));
        out.push(':');
        write_value_after_key(out, value, level);
    }
}

fn write_value_after_key(out: &mut String, value: &Value, level: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            indent(out, level + 2);
            write_map(out, map, level + 2);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            indent(out, level);
            write_seq(out, items, level);
        }
        scalar => {
            out.push(' ');
            out.push_str(&scalar_text(scalar, level + 2));
            out.push('\n');
        }
    }
}

fn write_seq(out: &mut String, items: &[Value], level: usize) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            indent(out, level);
        }
        out.push_str("- ");
        match item {
            Value::Object(map) if !map.is_empty() => write_map(out, map, level + 2),
            Value::Array(inner) if !inner.is_empty() => {
                write_seq(out, inner, level + 2);
            }
            scalar => {
                out.push_str(&scalar_text(scalar, level + 2));
                out.push('\n');
            }
        }
    }
}

fn scalar_text(value: &Value, level: usize) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string_text(s, level),
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
    }
}

/// A string plain when YAML reads it back as the same string, a literal block for readable
/// multi-line text, else double-quoted (JSON's escapes are YAML's).
fn string_text(s: &str, level: usize) -> String {
    if plain_is_safe(s) {
        return s.to_owned();
    }
    if s.contains('\n')
        && !s.starts_with([' ', '\n'])
        && !s.ends_with("\n\n")
        && s.chars().all(|c| c == '\n' || !c.is_control())
        && s.lines().all(|l| !l.ends_with(' '))
    {
        let chomp = if s.ends_with('\n') { "|" } else { "|-" };
        let mut out = chomp.to_owned();
        for line in s.trim_end_matches('\n').split('\n') {
            out.push('\n');
            if !line.is_empty() {
                out.extend(std::iter::repeat_n(' ', level.max(2)));
                out.push_str(line);
            }
        }
        return out;
    }
    serde_json::to_string(s).unwrap_or_default()
}

fn plain_is_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if "-?:,[]{}#&*!|>'\"%@`".contains(first) || first.is_whitespace() {
        return false;
    }
    if s.ends_with([' ', ':']) || s.contains(": ") || s.contains(" #") || s.contains('\t') {
        return false;
    }
    if s.chars().any(|c| c.is_control()) {
        return false;
    }
    let lower = s.to_ascii_lowercase();
    if matches!(
        lower.as_str(),
        "true"
            | "false"
            | "null"
            | "~"
            | "yes"
            | "no"
            | "on"
            | "off"
            | "y"
            | "n"
            | ".nan"
            | ".inf"
            | "-.inf"
            | "+.inf"
            | "<<"
    ) {
        return false;
    }
    // Anything that looks like a number stays a string only when quoted.
    let numeric = s
        .chars()
        .all(|c| c.is_ascii_digit() || "+-._eExXoOaAbBcCdDfF:".contains(c));
    if numeric && s.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip(v: Value) {
        let text = to_yaml(&v);
        let back: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(back, v, "\n{text}");
    }

    #[test]
    fn a_manifest_reads_back_the_same() {
        round_trip(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app.gitlab.com/project_id": "42", "on": "yes", "empty": ""},
                         "annotations": {"note": "a: b # c", "multi": "line one\nline two\n", "tail": "x\n\n"}},
            "spec": {"replicas": 3, "paused": false, "selector": null, "ports": [{"port": 80, "name": "http"}, {"port": 443}],
                     "args": ["-v", "--flag=1", "1e3", "0x1F", "*star", ""], "nested": [[1, 2], []], "obj": {}},
        }));
    }

    #[test]
    fn strings_that_look_like_other_things_are_quoted() {
        assert_eq!(to_yaml(&json!({"a": "true"})), "a: \"true\"\n");
        assert_eq!(to_yaml(&json!({"a": "42"})), "a: \"42\"\n");
        assert_eq!(to_yaml(&json!({"a": "plain text"})), "a: plain text\n");
        assert_eq!(
            to_yaml(&json!({"a": ["x", {"b": 1, "c": 2}]})),
            "a:\n- x\n- b: 1\n  c: 2\n"
        );
    }
}
