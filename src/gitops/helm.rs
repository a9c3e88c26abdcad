//! A Flux HelmRelease's objects when it has no `status.inventory` (helm-controller before 1.5):
//! the labels helm-controller's post-renderer puts on them, else the manifest of the Helm
//! release it installed, read from Helm's storage Secret as Helm's storage driver wrote it.

use base64::Engine;
use serde::Deserialize;

use super::{at, text, ObjRef};
use crate::resources::tree::Tree;

/// The labels helm-controller's post-renderer puts on every object of a release.
pub const NAME_LABEL: &str = "helm.toolkit.fluxcd.io/name";
pub const NAMESPACE_LABEL: &str = "helm.toolkit.fluxcd.io/namespace";

/// Helm's release Secrets: `sh.helm.release.v1.<release>.v<revision>`.
pub const SECRET_PREFIX: &str = "sh.helm.release.v1.";

/// A release decoded from its Secret is at most this large: a Secret holds at most 1 MiB, and
/// gzip of YAML rarely shrinks it more than tenfold.
pub const MAX_RELEASE_BYTES: usize = 16 << 20;

/// The Helm release name of `helm_release`, as helm-controller computes it: `spec.releaseName`,
/// else the name it recorded (`status.history[0].name`), else `[<targetNamespace>-]<name>`,
/// shortened by [`shorten_name`].
pub fn release_name(helm_release: &Tree) -> String {
    let given = text(helm_release, &["spec", "releaseName"]);
    if !given.is_empty() {
        return shorten_name(given);
    }
    let recorded = at(helm_release, &["status", "history"])
        .and_then(Tree::as_array)
        .and_then(|h| h.first())
        .and_then(|h| h.get("name"))
        .and_then(Tree::as_str)
        .unwrap_or("");
    if !recorded.is_empty() {
        return recorded.to_owned();
    }
    let name = text(helm_release, &["metadata", "name"]);
    let target = text(helm_release, &["spec", "targetNamespace"]);
    if target.is_empty() {
        shorten_name(name)
    } else {
        shorten_name(&format!("{target}-{name}"))
    }
}

/// helm-controller's `release.ShortenName`: a name over 53 bytes becomes its first 40 bytes, a
/// `-`, and the first 12 hex digits of its SHA-256.
pub fn shorten_name(name: &str) -> String {
    const MAX: usize = 53;
    const HASH: usize = 12;
    if name.len() <= MAX {
        return name.to_owned();
    }
    let sum = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let hex: String = sum.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    // Go slices bytes; a Kubernetes name is ASCII, so the cut is on a character boundary. Any
    // other is moved back to the one before it.
    let mut cut = MAX - (HASH + 1);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{}", &name[..cut], &hex[..HASH])
}

/// Where Helm stores the release: `spec.storageNamespace`, else the HelmRelease's namespace.
pub fn storage_namespace(helm_release: &Tree) -> String {
    let given = text(helm_release, &["spec", "storageNamespace"]);
    if given.is_empty() {
        text(helm_release, &["metadata", "namespace"]).to_owned()
    } else {
        given.to_owned()
    }
}

/// The namespace objects of the release go to when their manifest names none:
/// `spec.targetNamespace`, else the HelmRelease's namespace.
pub fn target_namespace(helm_release: &Tree) -> String {
    let given = text(helm_release, &["spec", "targetNamespace"]);
    if given.is_empty() {
        text(helm_release, &["metadata", "namespace"]).to_owned()
    } else {
        given.to_owned()
    }
}

/// Of Secrets as the API lists them, the newest `deployed` one of `release` (by the revision
/// its name ends with), and its `data.release`.
pub fn newest_deployed<'a>(secrets: &'a [serde_json::Value], release: &str) -> Option<&'a str> {
    let prefix = format!("{SECRET_PREFIX}{release}.v");
    secrets
        .iter()
        .filter_map(|s| {
            let name = s.pointer("/metadata/name")?.as_str()?;
            let revision: u64 = name.strip_prefix(&prefix)?.parse().ok()?;
            let status = s.pointer("/metadata/labels/status")?.as_str()?;
            let data = s.pointer("/data/release")?.as_str()?;
            (status == "deployed").then_some((revision, data))
        })
        .max_by_key(|(revision, _)| *revision)
        .map(|(_, data)| data)
}

/// A Helm v3 release, the fields read of it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Release {
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub version: i64,
    #[serde(default)]
    pub manifest: String,
}

/// Why a release Secret could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the release is not base64: {0}")]
    Base64(String),
    #[error("the release is not gzip: {0}")]
    Gzip(String),
    #[error("the release is larger than {MAX_RELEASE_BYTES} bytes")]
    TooLarge,
    #[error("the release is not a Helm release: {0}")]
    Json(String),
}

/// Decodes `data.release` of a Helm release Secret, as listed (Kubernetes' base64 of the value):
/// the value is Helm's base64 of gzip of the release's JSON (`storage/driver/util.go`'s
/// `encodeRelease`); a value that is not gzip is the JSON itself, as Helm's `decodeRelease`
/// accepts.
pub fn decode_release(data: &str) -> Result<Release, DecodeError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let inner = b64
        .decode(data.trim())
        .map_err(|e| DecodeError::Base64(e.to_string()))?;
    let bytes = b64
        .decode(inner.trim_ascii())
        .map_err(|e| DecodeError::Base64(e.to_string()))?;
    let json = if bytes.starts_with(&[0x1f, 0x8b]) {
        gunzip(&bytes)?
    } else {
        bytes
    };
    serde_json::from_slice(&json).map_err(|e| DecodeError::Json(e.to_string()))
}

/// One gzip member (RFC 1952): its header skipped, its deflate data inflated up to
/// [`MAX_RELEASE_BYTES`]. The trailer's CRC is not checked: the JSON that follows is.
fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, DecodeError> {
    const FHCRC: u8 = 2;
    const FEXTRA: u8 = 4;
    const FNAME: u8 = 8;
    const FCOMMENT: u8 = 16;
    let short = || DecodeError::Gzip("truncated header".into());
    if bytes.len() < 10 || bytes[2] != 8 {
        return Err(DecodeError::Gzip("not deflate".into()));
    }
    let flags = bytes[3];
    let mut pos = 10;
    if flags & FEXTRA != 0 {
        let len = bytes.get(pos..pos + 2).ok_or_else(short)?;
        pos += 2 + usize::from(u16::from_le_bytes([len[0], len[1]]));
    }
    for flag in [FNAME, FCOMMENT] {
        if flags & flag != 0 {
            let end = bytes
                .get(pos..)
                .ok_or_else(short)?
                .iter()
                .position(|&b| b == 0);
            pos += end.ok_or_else(short)? + 1;
        }
    }
    if flags & FHCRC != 0 {
        pos += 2;
    }
    let body = bytes.get(pos..).ok_or_else(short)?;
    miniz_oxide::inflate::decompress_to_vec_with_limit(body, MAX_RELEASE_BYTES).map_err(|e| match e
        .status
    {
        miniz_oxide::inflate::TINFLStatus::HasMoreOutput => DecodeError::TooLarge,
        status => DecodeError::Gzip(format!("{status:?}")),
    })
}

/// The objects of a release's `manifest`: Helm's rendered templates, YAML documents separated
/// by `---`. Only what names an object is read (top-level `apiVersion` and `kind`, `metadata`'s
/// `name` and `namespace`), in block style as Helm renders templates, or a document that is
/// JSON; a document without a kind or a name (empty, comments only) is skipped.
pub fn manifest_objects(manifest: &str) -> Vec<ObjRef> {
    let mut refs = Vec::new();
    for doc in documents(manifest) {
        let fields = match serde_json::from_str::<serde_json::Value>(doc.trim()) {
            Ok(json) if json.is_object() => {
                let s = |p: &str| json.pointer(p).and_then(|v| v.as_str()).unwrap_or("");
                [
                    s("/apiVersion"),
                    s("/kind"),
                    s("/metadata/name"),
                    s("/metadata/namespace"),
                ]
                .map(str::to_owned)
            }
            _ => block_fields(doc),
        };
        let [api_version, kind, name, namespace] = fields;
        if kind.is_empty() || name.is_empty() {
            continue;
        }
        let (group, version) = super::split_api_version(&api_version);
        refs.push(ObjRef {
            group: group.to_owned(),
            version: Some(version.to_owned()).filter(|v| !v.is_empty()),
            kind,
            namespace: Some(namespace).filter(|ns| !ns.is_empty()),
            name,
        });
    }
    refs
}

/// The documents of a YAML stream: split at lines that are `---` (possibly followed by a
/// comment or spaces).
fn documents(stream: &str) -> impl Iterator<Item = &str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in stream.split_inclusive('\n') {
        let bare = line.trim_end();
        if bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t") {
            docs.push(&stream[start..offset]);
            start = offset + line.len();
        }
        offset += line.len();
    }
    docs.push(&stream[start..]);
    docs.into_iter()
}

/// `[apiVersion, kind, metadata.name, metadata.namespace]` of a block-style document.
fn block_fields(doc: &str) -> [String; 4] {
    let mut out: [String; 4] = Default::default();
    let mut in_metadata = false;
    let mut metadata_indent: Option<usize> = None;
    for line in doc.lines() {
        let content = line.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let indent = line.len() - content.len();
        if indent == 0 {
            in_metadata = false;
            match key_value(content) {
                Some(("apiVersion", v)) => out[0] = v,
                Some(("kind", v)) => out[1] = v,
                Some(("metadata", v)) if v.is_empty() => {
                    in_metadata = true;
                    metadata_indent = None;
                }
                _ => {}
            }
        } else if in_metadata {
            let level = *metadata_indent.get_or_insert(indent);
            if indent != level {
                continue;
            }
            match key_value(content) {
                Some(("name", v)) => out[2] = v,
                Some(("namespace", v)) => out[3] = v,
                _ => {}
            }
        }
    }
    out
}

/// `key: value` of a line, the value unquoted and without a trailing comment.
fn key_value(line: &str) -> Option<(&str, String)> {
    let (key, value) = line.split_once(':')?;
    let value = value.trim();
    let value = if let Some(quoted) = value.strip_prefix('"') {
        quoted.split('"').next().unwrap_or("").to_owned()
    } else if let Some(quoted) = value.strip_prefix('\'') {
        quoted.split('\'').next().unwrap_or("").to_owned()
    } else {
        value.split(" #").next().unwrap_or("").trim().to_owned()
    };
    Some((key.trim(), value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gitops::tree;
    use serde_json::json;

    #[test]
    fn release_names_follow_helm_controller() {
        let hr = |spec: serde_json::Value, status: serde_json::Value| {
            tree(
                json!({"metadata": {"name": "podinfo", "namespace": "flux-system"},
                "spec": spec, "status": status}),
            )
        };
        assert_eq!(release_name(&hr(json!({}), json!({}))), "podinfo");
        assert_eq!(
            release_name(&hr(json!({"targetNamespace": "apps"}), json!({}))),
            "apps-podinfo"
        );
        assert_eq!(
            release_name(&hr(
                json!({"targetNamespace": "apps"}),
                json!({"history": [{"name": "recorded"}, {"name": "older"}]})
            )),
            "recorded"
        );
        assert_eq!(
            release_name(&hr(
                json!({"releaseName": "given", "targetNamespace": "apps"}),
                json!({"history": [{"name": "recorded"}]})
            )),
            "given"
        );
    }

    /// helm-controller's own example shape, checked against Go's `fmt.Sprintf("%x",
    /// sha256.Sum256(...))[:12]` of the same name (computed with `sha256sum`).
    #[test]
    fn long_names_are_shortened_as_helm_controller_does() {
        let name = "some-front-appended-namespace-release-with-a-very-long-name";
        assert!(name.len() > 53);
        let short = shorten_name(name);
        assert_eq!(short.len(), 53);
        assert_eq!(&short[..41], "some-front-appended-namespace-release-wi-");
        assert_eq!(&short[41..], "b9152014cc9c");
        let exactly = "a".repeat(53);
        assert_eq!(shorten_name(&exactly), exactly);
    }

    #[test]
    fn storage_and_target_namespaces_default_to_the_helm_releases() {
        let hr = tree(json!({"metadata": {"name": "p", "namespace": "flux-system"}, "spec": {}}));
        assert_eq!(storage_namespace(&hr), "flux-system");
        assert_eq!(target_namespace(&hr), "flux-system");
        let hr = tree(
            json!({"metadata": {"name": "p", "namespace": "flux-system"},
            "spec": {"storageNamespace": "store", "targetNamespace": "apps"}}),
        );
        assert_eq!(storage_namespace(&hr), "store");
        assert_eq!(target_namespace(&hr), "apps");
    }

    #[test]
    fn the_newest_deployed_secret_is_read() {
        let secret = |name: &str, status: &str, data: &str| {
            json!({"metadata": {"name": name, "labels": {"owner": "helm", "status": status}},
                "type": "helm.sh/release.v1", "data": {"release": data}})
        };
        let secrets = vec![
            secret("sh.helm.release.v1.web.v2", "superseded", "two"),
            secret("sh.helm.release.v1.web.v10", "deployed", "ten"),
            secret("sh.helm.release.v1.web.v9", "deployed", "nine"),
            secret("sh.helm.release.v1.web.v11", "failed", "eleven"),
            secret("sh.helm.release.v1.web-other.v12", "deployed", "other"),
        ];
        assert_eq!(newest_deployed(&secrets, "web"), Some("ten"));
        assert_eq!(newest_deployed(&secrets, "nothing"), None);
    }

    /// `tests/fixtures/helm/` holds a release Secret as Helm v3 writes it (see its README).
    #[test]
    fn a_real_helm_v3_release_decodes() {
        let secret: serde_json::Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/helm/release-secret.json"
        ))
        .unwrap();
        let data = newest_deployed(std::slice::from_ref(&secret), "apps-podinfo").unwrap();
        let release = decode_release(data).unwrap();
        assert_eq!(release.name, "apps-podinfo");
        assert_eq!(release.namespace, "apps");
        assert_eq!(release.version, 3);
        let objects = manifest_objects(&release.manifest);
        let named: Vec<String> = objects.iter().map(ObjRef::describe).collect();
        assert_eq!(
            named,
            [
                "ServiceAccount apps/podinfo",
                "rbac.authorization.k8s.io/ClusterRole podinfo:reader",
                "Service podinfo",
                "apps/Deployment podinfo",
            ]
        );
        assert_eq!(objects[3].api_version().as_deref(), Some("apps/v1"));
    }

    #[test]
    fn bad_payloads_are_errors_not_panics() {
        let b64 = base64::engine::general_purpose::STANDARD;
        assert!(matches!(decode_release("%%%"), Err(DecodeError::Base64(_))));
        assert!(matches!(
            decode_release(&b64.encode("%%%")),
            Err(DecodeError::Base64(_))
        ));
        let not_gzip_body = b64.encode(b64.encode([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0, 0xff]));
        assert!(matches!(
            decode_release(&not_gzip_body),
            Err(DecodeError::Gzip(_))
        ));
        let truncated = b64.encode(b64.encode([0x1f, 0x8b, 8, FNAME_FLAG, 0, 0, 0, 0, 0, 0, b'a']));
        assert!(matches!(
            decode_release(&truncated),
            Err(DecodeError::Gzip(_))
        ));
        // Plain JSON, as Helm's decodeRelease accepts too.
        let plain = b64
            .encode(b64.encode(r#"{"name": "x", "manifest": "kind: A\nmetadata:\n  name: a\n"}"#));
        let release = decode_release(&plain).unwrap();
        assert_eq!(manifest_objects(&release.manifest)[0].kind, "A");
        assert!(matches!(
            decode_release(&b64.encode(b64.encode("[]"))),
            Err(DecodeError::Json(_))
        ));
    }

    const FNAME_FLAG: u8 = 8;

    #[test]
    fn manifests_name_their_objects() {
        let manifest = "---\n# Source: c/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\n\
            metadata:\n  name: \"conf\"\n  labels:\n    name: not-this\n  namespace: 'ns' # here\n\
            data:\n  name: nor-this\n---\n# Source: empty.yaml\n---\n\
            {\"apiVersion\": \"apps/v1\", \"kind\": \"Deployment\", \"metadata\": {\"name\": \"j\"}}\n";
        let refs = manifest_objects(manifest);
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0].describe(), "ConfigMap ns/conf");
        assert_eq!(refs[1].describe(), "apps/Deployment j");
    }
}
