//! `labelSelector` and `fieldSelector` parsing and matching, following the apimachinery grammar
//! closely enough that a selector the apiserver rejects is rejected here too (400 BadRequest).

use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Op {
    Eq,
    NotEq,
    In,
    NotIn,
    Exists,
    NotExists,
    Gt,
    Lt,
}

#[derive(Clone, Debug)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A parsed label selector: every requirement must hold (comma means AND).
#[derive(Clone, Debug, Default)]
pub(crate) struct LabelSelector {
    reqs: Vec<Requirement>,
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { reqs });
        }
        for part in split_top_level(s) {
            reqs.push(
                parse_requirement(part.trim())
                    .map_err(|e| format!("unable to parse requirement: {e}"))?,
            );
        }
        Ok(Self { reqs })
    }

    /// `labels` is the object's `metadata.labels` (absent means no labels).
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| {
            let v = get(&r.key);
            match r.op {
                Op::Eq => v == Some(r.values[0].as_str()),
                Op::NotEq => v != Some(r.values[0].as_str()),
                Op::In => v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                Op::NotIn => !v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                Op::Exists => v.is_some(),
                Op::NotExists => v.is_none(),
                Op::Gt | Op::Lt => {
                    let (Some(v), Ok(bound)) = (
                        v.and_then(|v| v.parse::<i64>().ok()),
                        r.values[0].parse::<i64>(),
                    ) else {
                        return false;
                    };
                    if r.op == Op::Gt {
                        v > bound
                    } else {
                        v < bound
                    }
                }
            }
        })
    }
}

/// Splits on commas that are not inside `( … )`, so `a in (x,y),b` is two requirements.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_requirement(p: &str) -> Result<Requirement, String> {
    if p.is_empty() {
        return Err("found '', expected: identifier".into());
    }
    let req = |key: &str, op: Op, values: Vec<String>| -> Result<Requirement, String> {
        let key = key.trim();
        validate_key(key)?;
        for v in &values {
            validate_value(v)?;
        }
        Ok(Requirement {
            key: key.to_string(),
            op,
            values,
        })
    };
    if let Some(rest) = p.strip_prefix('!') {
        return req(rest, Op::NotExists, Vec::new());
    }
    if p.contains('(') {
        let (key, rest) = p
            .split_once(|c: char| c.is_whitespace())
            .ok_or_else(|| format!("found '{p}', expected: 'in', 'notin'"))?;
        let rest = rest.trim_start();
        let (op, rest) = if let Some(r) = rest.strip_prefix("notin") {
            (Op::NotIn, r)
        } else if let Some(r) = rest.strip_prefix("in") {
            (Op::In, r)
        } else {
            return Err(format!("found '{rest}', expected: 'in', 'notin'"));
        };
        let inner = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(|| format!("found '{}', expected: '(' … ')'", rest.trim()))?;
        let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
        if inner.trim().is_empty() {
            return Err("for 'in', 'notin' operators, values set can't be empty".into());
        }
        return req(key, op, values);
    }
    for (sym, op) in [
        ("!=", Op::NotEq),
        ("==", Op::Eq),
        ("=", Op::Eq),
        (">", Op::Gt),
        ("<", Op::Lt),
    ] {
        if let Some((k, v)) = p.split_once(sym) {
            let v = v.trim();
            if matches!(op, Op::Gt | Op::Lt) && v.parse::<i64>().is_err() {
                return Err(format!(
                    "for 'Gt', 'Lt' operators, the value must be an integer: '{v}'"
                ));
            }
            return req(k, op, vec![v.to_string()]);
        }
    }
    req(p, Op::Exists, Vec::new())
}

/// A label name: an optional DNS-subdomain prefix and `/`, then 1–63 alphanumerics, `-`, `_`, `.`.
fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!(
                "key: Invalid value: \"{key}\": prefix part must be a DNS subdomain"
            ));
        }
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(format!(
            "key: Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ));
    }
    Ok(())
}

fn validate_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_label_value(v) {
        Ok(())
    } else {
        Err(format!(
            "values[0]: Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ))
    }
}

fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A parsed field selector. Besides `metadata.name`/`metadata.namespace` any dotted path is
/// accepted (`status.phase`, `involvedObject.name`, `spec.nodeName`): a missing field reads as ""
/// like the apiserver's field sets do.
#[derive(Clone, Debug, Default)]
pub(crate) struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { reqs });
        }
        for part in s.split(',') {
            let part = part.trim();
            let parsed = [("!=", false), ("==", true), ("=", true)]
                .into_iter()
                .find_map(|(sym, eq)| part.split_once(sym).map(|(k, v)| (k.trim(), eq, v.trim())));
            match parsed {
                Some((k, eq, v)) if !k.is_empty() => reqs.push((k.to_string(), eq, v.to_string())),
                _ => {
                    return Err(format!(
                        "invalid selector: '{s}'; can't understand '{part}'"
                    ))
                }
            }
        }
        Ok(Self { reqs })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(path, eq, want)| {
            let field = path.split('.').try_fold(obj, |v, seg| v.get(seg));
            let got = match field {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (got == *want) == *eq
        })
    }
}

/// What a list or watch asks for: a namespace (none = all) and both selectors.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filter {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn matches(&self, obj: &Value) -> bool {
        let meta = obj.get("metadata");
        if let Some(ns) = &self.namespace {
            if meta
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                != Some(ns.as_str())
            {
                return false;
            }
        }
        self.labels.matches(meta.and_then(|m| m.get("labels"))) && self.fields.matches(obj)
    }
}
