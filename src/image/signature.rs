//! The image's own signature in the form podman, skopeo and CRI-O check at pull under a
//! `sigstoreSigned` policy (containers-policy.json(5)), and cosign verifies: a "simple
//! signing" payload naming the image and its manifest digest, signed with ECDSA P-256, kept
//! as a layer of a manifest under the tag `sha256-<hex>.sig` beside the image.

use super::digest::Digest;
use super::registry::{Remote, Session};
use crate::error::{Error, Result};
use oci_client::manifest::OciDescriptor;
use oci_client::{Reference, RegistryOperation};

/// The media type of a simple-signing payload layer.
pub const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation that holds the payload's signature (standard base64 of DER).
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// `reference` as a signature names it: registry, repository and tag written out in full, as
/// containers/image writes them (`user/app:v1` is `docker.io/user/app:v1`).
pub fn signed_name(reference: &Reference) -> String {
    reference.whole()
}

/// The payload that says `reference` (`host[:port]/repository:tag`) is the image whose
/// manifest is `manifest`. containers/image refuses any key beyond these, so nothing else is
/// written; the creator is constant, so two signings of one image give one payload.
pub fn payload(reference: &str, manifest: &Digest) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "critical": {
            "identity": {"docker-reference": reference},
            "image": {"docker-manifest-digest": manifest.as_str()},
            "type": "cosign container image signature",
        },
        "optional": {"creator": format!("gpubake {}", env!("CARGO_PKG_VERSION"))},
    }))
    .expect("JSON serializes")
}

/// The tag the signatures of `manifest` are kept under.
pub fn tag(manifest: &Digest) -> String {
    format!("{}.sig", manifest.as_str().replacen(':', "-", 1))
}

/// Adds a signature (`payload` and its DER signature) of the manifest `manifest` to the
/// `sha256-<hex>.sig` manifest in `remote`'s repository, creating it when absent and leaving
/// the signatures already there (by other keys, say) in place. Returns the signature
/// manifest's digest.
pub fn attach(
    remote: &Remote,
    manifest: &Digest,
    payload: &[u8],
    signature: &[u8],
) -> Result<Digest> {
    let reference = remote.parsed()?;
    let session = Session::open(remote, &reference)?;
    session.runtime.block_on(attach_async(
        &session, &reference, manifest, payload, signature,
    ))
}

async fn attach_async(
    s: &Session,
    reference: &Reference,
    manifest: &Digest,
    payload: &[u8],
    signature: &[u8],
) -> Result<Digest> {
    use base64::Engine as _;
    s.client
        .auth(reference, &s.auth, RegistryOperation::Push)
        .await
        .map_err(|e| s.failed("signing: logging in", e))?;
    let tagged = Reference::with_tag(
        reference.registry().to_string(),
        reference.repository().to_string(),
        tag(manifest),
    );
    let mut layers: Vec<serde_json::Value> = match s
        .manifest(&tagged, "signing: reading the signatures already there")
        .await?
    {
        Some((bytes, _)) => {
            let existing: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
                Error::image(
                    &s.what,
                    format!("signature manifest {}: {e}", tag(manifest)),
                )
            })?;
            existing["layers"].as_array().cloned().ok_or_else(|| {
                Error::image(
                    &s.what,
                    format!(
                        "tag {} holds something other than signatures",
                        tag(manifest)
                    ),
                )
            })?
        }
        None => Vec::new(),
    };
    let payload_digest = Digest::of(payload);
    let layer = serde_json::json!({
        "mediaType": PAYLOAD_TYPE,
        "digest": payload_digest.as_str(),
        "size": payload.len(),
        "annotations": {SIGNATURE_ANNOTATION: base64::engine::general_purpose::STANDARD.encode(signature)},
    });
    if !layers.contains(&layer) {
        layers.push(layer);
    }
    // The config lists each payload as a layer's diff ID, as containers/image writes it.
    let diff_ids: Vec<&serde_json::Value> = layers.iter().map(|l| &l["digest"]).collect();
    let config = super::layout::canonical_json(&serde_json::json!({
        "architecture": "",
        "os": "",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }));
    let config_digest = Digest::of(&config);
    for (bytes, digest) in [(payload, &payload_digest), (&config[..], &config_digest)] {
        if !s
            .has_blob(reference, digest, "signing: asking for a blob")
            .await?
        {
            s.client
                .push_blob(reference, bytes.to_vec(), digest.as_str())
                .await
                .map_err(|e| s.failed("signing: uploading a blob", e))?;
        }
    }
    let signatures = super::layout::canonical_json(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest.as_str(),
            "size": config.len(),
        },
        "layers": layers,
    }));
    // containers/image reads the tag only when it is served as an OCI manifest.
    let content_type =
        reqwest::header::HeaderValue::from_static("application/vnd.oci.image.manifest.v1+json");
    s.client
        .push_manifest_raw(&tagged, signatures.clone(), content_type)
        .await
        .map_err(|e| s.failed("signing: pushing the signature manifest", e))?;
    Ok(Digest::of(&signatures))
}

/// One signature of the `.sig` manifest: the payload (its digest checked) and the signature
/// as the layer's annotation holds it.
pub struct Signed {
    /// The payload's bytes.
    pub payload: Vec<u8>,
    /// Standard base64 of the DER signature; empty when the layer has none.
    pub signature: String,
}

/// The simple signatures of the manifest `manifest` in `remote`'s repository; none when the
/// `.sig` tag does not exist. Layers of other types (attachments that are no signatures) are
/// left out, as containers/image leaves them. A signature whose payload cannot be read
/// (too large, missing, not its digest) is its own error, so one bad layer pushed beside
/// the others does not hide them.
pub fn signatures(
    remote: &Remote,
    manifest: &Digest,
) -> Result<Vec<std::result::Result<Signed, String>>> {
    let reference = remote.parsed()?;
    let s = Session::open(remote, &reference)?;
    s.runtime.block_on(async {
        let tagged = Reference::with_tag(
            reference.registry().to_string(),
            reference.repository().to_string(),
            tag(manifest),
        );
        let Some((bytes, _)) = s
            .manifest(&tagged, "reading the image's signatures")
            .await?
        else {
            return Ok(Vec::new());
        };
        let listed: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            Error::image(
                &s.what,
                format!("signature manifest {}: {e}", tag(manifest)),
            )
        })?;
        let mut out = Vec::new();
        for layer in listed["layers"].as_array().into_iter().flatten() {
            if layer["mediaType"] != PAYLOAD_TYPE {
                continue;
            }
            let (Some(digest), Some(size)) = (layer["digest"].as_str(), layer["size"].as_u64())
            else {
                continue;
            };
            // containers/image's own bound on a payload is 4 MiB, as is gpubake's.
            let wanted = OciDescriptor {
                digest: digest.to_string(),
                size: i64::try_from(size).unwrap_or(i64::MAX),
                media_type: PAYLOAD_TYPE.to_string(),
                ..OciDescriptor::default()
            };
            let payload = match s
                .small_blob(&reference, &wanted, "reading a signature's payload")
                .await
            {
                Ok(payload) => payload,
                Err(e) => {
                    out.push(Err(format!("its payload {e}")));
                    continue;
                }
            };
            out.push(Ok(Signed {
                payload,
                signature: layer["annotations"][SIGNATURE_ANNOTATION]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            }));
        }
        Ok(out)
    })
}

/// Whether `payload` says it is the manifest `manifest` of the repository `repository`
/// (`host[:port]/name`, matched as containers/image's `matchRepository` does); else why not.
pub fn judge_payload(
    payload: &[u8],
    manifest: &Digest,
    repository: &str,
) -> std::result::Result<(), String> {
    let p: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("its payload is not JSON: {e}"))?;
    let critical = &p["critical"];
    if critical["type"] != "cosign container image signature" {
        return Err(format!("its payload is of type {}", critical["type"]));
    }
    let digest = critical["image"]["docker-manifest-digest"]
        .as_str()
        .unwrap_or("none");
    if digest != manifest.as_str() {
        return Err(format!("it signs the manifest {digest}, not {manifest}"));
    }
    let named = critical["identity"]["docker-reference"]
        .as_str()
        .unwrap_or("");
    // Normalised as containers/image does: `user/app:v1` and `docker.io/user/app` name one
    // repository, and the tag or digest after the name does not count.
    let name = named
        .parse::<Reference>()
        .map(|r| format!("{}/{}", r.registry(), r.repository()))
        .map_err(|e| format!("it names {named:?}, which is no image reference ({e})"))?;
    if name != repository {
        return Err(format!(
            "it names the image {named}, not one of {repository}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_has_exactly_the_fields_containers_image_accepts() {
        let digest = Digest::of(b"manifest");
        let p: serde_json::Value =
            serde_json::from_slice(&payload("127.0.0.1:5000/team/app:v1", &digest)).unwrap();
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&p), ["critical", "optional"]);
        assert_eq!(keys(&p["critical"]), ["identity", "image", "type"]);
        assert_eq!(keys(&p["critical"]["identity"]), ["docker-reference"]);
        assert_eq!(keys(&p["critical"]["image"]), ["docker-manifest-digest"]);
        assert_eq!(p["critical"]["type"], "cosign container image signature");
        assert_eq!(
            p["critical"]["image"]["docker-manifest-digest"],
            digest.as_str()
        );
        assert_eq!(keys(&p["optional"]), ["creator"]);
        assert_eq!(tag(&digest), format!("sha256-{}.sig", digest.hex()));
    }

    #[test]
    fn a_payload_is_judged_by_its_digest_and_repository() {
        let digest = Digest::of(b"manifest");
        let repo = "127.0.0.1:5000/team/app";
        for named in [
            "127.0.0.1:5000/team/app:v1",
            "127.0.0.1:5000/team/app",
            "127.0.0.1:5000/team/app@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        ] {
            assert_eq!(
                judge_payload(&payload(named, &digest), &digest, repo),
                Ok(()),
                "{named}"
            );
        }
        let other = Digest::of(b"other");
        assert!(
            judge_payload(&payload(repo, &other), &digest, repo)
                .unwrap_err()
                .contains("signs the manifest")
        );
        assert!(
            judge_payload(
                &payload("127.0.0.1:5000/team/other:v1", &digest),
                &digest,
                repo
            )
            .unwrap_err()
            .contains("names the image")
        );
        assert!(judge_payload(b"{}", &digest, repo).is_err());
        assert!(judge_payload(b"not json", &digest, repo).is_err());
        assert!(
            judge_payload(&payload("Not A Name", &digest), &digest, repo)
                .unwrap_err()
                .contains("no image reference")
        );
    }

    /// Docker Hub's names in every spelling docker and skopeo accept are one repository, in
    /// what is signed and in what is checked.
    #[test]
    fn docker_hub_names_are_one_repository_however_written() {
        let digest = Digest::of(b"manifest");
        for (written, repository) in [
            ("app:v1", "docker.io/library/app"),
            ("library/app:v1", "docker.io/library/app"),
            ("docker.io/app:v1", "docker.io/library/app"),
            ("index.docker.io/library/app:v1", "docker.io/library/app"),
            ("user/app:v1", "docker.io/user/app"),
            ("docker.io/user/app", "docker.io/user/app"),
            ("localhost:5000/app:v1", "localhost:5000/app"),
        ] {
            let reference: Reference = written.parse().unwrap();
            let name = signed_name(&reference);
            assert!(name.starts_with(repository), "{written}: {name}");
            // As gpubake signs it and as another tool may have written it.
            for named in [name.as_str(), written] {
                assert_eq!(
                    judge_payload(&payload(named, &digest), &digest, repository),
                    Ok(()),
                    "{written} signed as {named}"
                );
            }
        }
    }
}
