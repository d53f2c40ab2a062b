//! A software bill of materials of a built image, in SPDX 2.3 JSON: the image (with the
//! lock's pins), the base it was built on (by digest), and every wheel of the Python stack
//! with its version, its URL and its sha256, as a purl. `build --sbom FILE` writes it, and
//! attaches it to an image pushed to a registry as a referrer.

use crate::lock::Lock;
use crate::wheel::cache::WheelRef;
use serde_json::{Value, json};

/// The media type (and artifact type) of an SPDX JSON document.
pub const SPDX_TYPE: &str = "application/spdx+json";

/// What the SBOM describes.
pub struct Subject<'a> {
    /// The lock the image was built from.
    pub lock: &'a Lock,
    /// The image's manifest digest.
    pub manifest: &'a str,
    /// The base image's manifest digest.
    pub base_digest: &'a str,
    /// The wheels installed (none for an image without the Python stack).
    pub wheels: &'a [WheelRef],
    /// The creation time (RFC 3339), the image's own, so the document is reproducible.
    pub created: &'a str,
}

/// The SPDX 2.3 document.
pub fn spdx(s: &Subject) -> Value {
    let pins: Vec<String> = s
        .lock
        .labels
        .iter()
        .filter(|(k, _)| k.starts_with("io.gpubake."))
        .map(|(k, v)| format!("{}={v}", k.trim_start_matches("io.gpubake.")))
        .collect();
    let sha = |digest: &str| digest.trim_start_matches("sha256:").to_string();
    let mut packages = vec![
        json!({
            "SPDXID": "SPDXRef-image",
            "name": s.lock.recipe.name,
            "versionInfo": s.manifest,
            "downloadLocation": "NOASSERTION",
            "primaryPackagePurpose": "CONTAINER",
            "checksums": [{"algorithm": "SHA256", "checksumValue": sha(s.manifest)}],
            "comment": format!("gpubake pins: {}", pins.join(", ")),
        }),
        json!({
            "SPDXID": "SPDXRef-base",
            "name": s.lock.base,
            "versionInfo": s.base_digest,
            "downloadLocation": "NOASSERTION",
            "primaryPackagePurpose": "CONTAINER",
            "checksums": [{"algorithm": "SHA256", "checksumValue": sha(s.base_digest)}],
        }),
    ];
    let mut relationships = vec![
        json!({"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
               "relatedSpdxElement": "SPDXRef-image"}),
        json!({"spdxElementId": "SPDXRef-image", "relationshipType": "DESCENDANT_OF",
               "relatedSpdxElement": "SPDXRef-base"}),
    ];
    for (i, w) in s.wheels.iter().enumerate() {
        let id = format!("SPDXRef-wheel-{}", i + 1);
        packages.push(json!({
            "SPDXID": id,
            "name": w.name,
            "versionInfo": w.version,
            "downloadLocation": w.url,
            "primaryPackagePurpose": "LIBRARY",
            "checksums": [{"algorithm": "SHA256", "checksumValue": w.sha256}],
            "externalRefs": [{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": format!("pkg:pypi/{}@{}",
                    crate::closure::normalize(&w.name), w.version.replace('+', "%2B")),
            }],
        }));
        relationships.push(json!({"spdxElementId": "SPDXRef-image",
            "relationshipType": "CONTAINS", "relatedSpdxElement": id}));
    }
    json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{} {}", s.lock.recipe.name, s.manifest),
        "documentNamespace": format!("https://spdx.org/spdxdocs/gpubake-{}-{}",
            s.lock.recipe.name, sha(s.manifest)),
        "creationInfo": {
            "created": s.created,
            "creators": [format!("Tool: gpubake-{}", env!("CARGO_PKG_VERSION"))],
        },
        "packages": packages,
        "relationships": relationships,
    })
}

/// Writes `doc` to `path` (atomically) and, for an image in a registry, attaches it there as
/// a referrer of `manifest`; returns the artifact's digest when it was attached.
pub fn write(
    doc: &Value,
    path: &std::path::Path,
    dest: &super::Transport,
    manifest: &str,
) -> crate::error::Result<Option<String>> {
    let bytes = serde_json::to_vec_pretty(doc).expect("SBOMs serialize");
    crate::fsutil::write_atomic(path, &bytes)?;
    match dest {
        super::Transport::Registry(remote) => super::referrers::attach(
            remote,
            manifest,
            SPDX_TYPE,
            &bytes,
            std::collections::BTreeMap::from([(
                "org.opencontainers.image.created".to_string(),
                doc["creationInfo"]["created"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )]),
        )
        .map(Some),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wheel_is_a_package_with_its_hash_and_purl() {
        let lock = crate::resolve::resolve_recipe(
            &crate::recipe::LoadedRecipe::builtin_default(),
            &crate::resolve::Options::default(),
        )
        .unwrap()
        .lock;
        let wheels = vec![WheelRef {
            name: "torch".into(),
            version: "2.9.1+cu128".into(),
            url: "https://download.pytorch.org/whl/cu128/torch-2.9.1%2Bcu128-cp311-cp311-manylinux_2_28_x86_64.whl".into(),
            size: Some(1),
            sha256: "ab".repeat(32),
        }];
        let doc = spdx(&Subject {
            lock: &lock,
            manifest: &format!("sha256:{}", "1".repeat(64)),
            base_digest: &format!("sha256:{}", "2".repeat(64)),
            wheels: &wheels,
            created: "1970-01-01T00:00:00Z",
        });
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        let torch = &doc["packages"][2];
        assert_eq!(torch["versionInfo"], "2.9.1+cu128");
        assert_eq!(torch["checksums"][0]["checksumValue"], "ab".repeat(32));
        assert_eq!(
            torch["externalRefs"][0]["referenceLocator"],
            "pkg:pypi/torch@2.9.1%2Bcu128"
        );
        assert_eq!(
            doc["packages"][1]["checksums"][0]["checksumValue"],
            "2".repeat(64)
        );
        assert_eq!(doc["relationships"].as_array().unwrap().len(), 3);
    }
}
