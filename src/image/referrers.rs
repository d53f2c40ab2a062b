//! OCI 1.1 referrers: artifacts (a certificate, an SBOM) pushed beside an image in a registry
//! with the image's manifest as their `subject`, and found again from the image's digest.
//! Registries that answer the referrers API list them themselves; for the others (distribution
//! 2.8 and 3.x among them) gpubake keeps the referrers tag schema's index under the tag
//! `sha256-<hex>`, writing it as well as reading it (oci-client only reads it).

use super::digest::Digest;
use super::registry::{Remote, Session, declared_type};
use crate::error::{Error, Result};
use oci_client::Reference;
use oci_client::RegistryOperation;
use oci_client::manifest::OciDescriptor;
use oci_spec::image::{ImageIndex, MediaType};

/// The artifact type of a gpubake certificate attached to an image.
pub const CERTIFICATE_TYPE: &str = "application/vnd.gpubake.certificate.v1+json";

/// The annotation of a certificate artifact that holds certify's verdict.
pub const VERDICT: &str = "io.gpubake.verdict";

/// The annotation of a certificate artifact that holds what its checks covered
/// (`crate::certify::Scope`) in short.
pub const SCOPE: &str = "io.gpubake.scope";

/// The empty JSON object OCI 1.1 artifacts use as their config.
pub(super) const EMPTY_CONFIG: &[u8] = b"{}";
pub(super) const EMPTY_CONFIG_TYPE: &str = "application/vnd.oci.empty.v1+json";

/// An artifact that refers to an image (OCI 1.1 `subject`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Referrer {
    /// The artifact manifest's digest.
    pub digest: Digest,
    /// Its `artifactType`.
    pub artifact_type: String,
    /// Its annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Why its manifest could not be read, if it could not (then the type and annotations
    /// are what the index says of it): one bad entry is named, not fatal to the others.
    pub unread: Option<String>,
}

/// Attaches `content` to the image `subject` (a manifest digest) in `remote`'s repository as
/// an OCI 1.1 artifact of `artifact_type` whose `subject` is that manifest, and makes it
/// findable: through the registry's referrers API when it answers, else by adding it to the
/// `sha256-<hex>` tag's index (the referrers tag schema), creating that index when missing.
/// Returns the artifact's digest.
pub fn attach(
    remote: &Remote,
    subject: &Digest,
    artifact_type: &str,
    content: &[u8],
    annotations: std::collections::BTreeMap<String, String>,
) -> Result<Digest> {
    let reference = remote.parsed()?;
    let session = Session::open(remote, &reference)?;
    session.runtime.block_on(attach_async(
        &session,
        &reference,
        subject.as_str(),
        artifact_type,
        content,
        annotations,
    ))
}

async fn attach_async(
    s: &Session,
    reference: &Reference,
    subject: &str,
    artifact_type: &str,
    content: &[u8],
    annotations: std::collections::BTreeMap<String, String>,
) -> Result<Digest> {
    s.client
        .auth(reference, &s.auth, RegistryOperation::Push)
        .await
        .map_err(|e| s.failed("attaching: logging in", e))?;
    let subject_ref = reference.clone_with_digest(subject.to_string());
    let (subject_bytes, _) = s
        .manifest_needed(&subject_ref, "attaching: reading the image's manifest")
        .await?;
    let content_digest = Digest::of(content);
    for bytes in [EMPTY_CONFIG, content] {
        s.push_small(reference, bytes, "attaching: uploading a blob")
            .await?;
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MediaType::ImageManifest.to_string(),
        "artifactType": artifact_type,
        "config": {"mediaType": EMPTY_CONFIG_TYPE, "digest": Digest::of(EMPTY_CONFIG).as_str(), "size": EMPTY_CONFIG.len()},
        "layers": [{"mediaType": artifact_type, "digest": content_digest.as_str(), "size": content.len()}],
        "subject": {"mediaType": declared_type(&subject_bytes), "digest": subject, "size": subject_bytes.len()},
        "annotations": annotations,
    });
    let bytes = super::layout::canonical_json(&manifest);
    let digest = Digest::of(&bytes);
    let content_type =
        reqwest::header::HeaderValue::from_static("application/vnd.oci.image.manifest.v1+json");
    s.client
        .push_manifest_raw(
            &reference.clone_with_digest(digest.to_string()),
            bytes.clone(),
            content_type,
        )
        .await
        .map_err(|e| s.failed("attaching: pushing the artifact's manifest", e))?;
    if referrers_async(s, reference, subject)
        .await?
        .iter()
        .any(|r| r.digest == digest)
    {
        // The registry's referrers API lists it already.
        return Ok(digest);
    }
    // The referrers tag schema: the index under tag `sha256-<hex>` lists the artifact.
    let tag = reference_tag(reference, subject);
    let mut index: serde_json::Value = match s
        .manifest(&tag, "attaching: reading the referrers index")
        .await?
    {
        Some((bytes, _)) => {
            let value: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| Error::image(&s.what, format!("referrers index {subject}: {e}")))?;
            if !value["manifests"].is_array() {
                return Err(Error::image(
                    &s.what,
                    format!(
                        "tag {} holds something other than a referrers index",
                        tag.tag().unwrap_or("")
                    ),
                ));
            }
            value
        }
        None => serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MediaType::ImageIndex.to_string(),
            "manifests": [],
        }),
    };
    let listed = index["manifests"]
        .as_array()
        .is_some_and(|m| m.iter().any(|d| d["digest"] == digest.as_str()));
    if !listed {
        index["manifests"]
            .as_array_mut()
            .expect("checked to be a list")
            .push(serde_json::json!({
                "mediaType": MediaType::ImageManifest.to_string(),
                "digest": digest.as_str(),
                "size": bytes.len(),
                "artifactType": artifact_type,
                "annotations": manifest["annotations"],
            }));
        let content_type =
            reqwest::header::HeaderValue::from_static("application/vnd.oci.image.index.v1+json");
        s.client
            .push_manifest_raw(&tag, super::layout::canonical_json(&index), content_type)
            .await
            .map_err(|e| s.failed("attaching: writing the referrers index", e))?;
    }
    Ok(digest)
}

/// `REGISTRY/NAME:sha256-<hex>`, the tag the referrers tag schema keeps an image's
/// referrers under.
fn reference_tag(reference: &Reference, subject: &str) -> Reference {
    let tag: String = subject.replacen(':', "-", 1).chars().take(128).collect();
    Reference::with_tag(
        reference.registry().to_string(),
        reference.repository().to_string(),
        tag,
    )
}

/// The artifacts that refer to the manifest `subject` in `remote`'s repository, each with
/// its artifact type read from its own manifest.
pub fn referrers(remote: &Remote, subject: &Digest) -> Result<Vec<Referrer>> {
    let reference = remote.parsed()?;
    let session = Session::open(remote, &reference)?;
    session
        .runtime
        .block_on(referrers_async(&session, &reference, subject.as_str()))
}

async fn referrers_async(
    s: &Session,
    reference: &Reference,
    subject: &str,
) -> Result<Vec<Referrer>> {
    // The referrers API, or (on a 404) the tag schema's index, as the spec orders.
    let doing = "listing the image's referrers";
    let listed = s
        .referrers_index(
            reference,
            subject,
            &reference_tag(reference, subject),
            doing,
        )
        .await?;
    let index: ImageIndex = match listed {
        Some(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::image(&s.what, format!("the referrers of {subject}: {e}")))?,
        None => return Ok(Vec::new()),
    };
    let mut out = Vec::new();
    for entry in index.manifests() {
        // An entry that names no digest cannot be fetched, nor told apart from another.
        let Ok(entry_digest) = super::layout::digest_of(entry) else {
            continue;
        };
        let bytes = match s
            .manifest_needed(
                &reference.clone_with_digest(entry_digest.to_string()),
                "reading a referrer",
            )
            .await
        {
            Ok((bytes, _)) => bytes,
            Err(e) => {
                out.push(Referrer {
                    digest: entry_digest,
                    artifact_type: entry
                        .artifact_type()
                        .as_ref()
                        .map(|t| t.to_string())
                        .unwrap_or_default(),
                    annotations: entry
                        .annotations()
                        .clone()
                        .unwrap_or_default()
                        .into_iter()
                        .collect(),
                    unread: Some(e.to_string()),
                });
                continue;
            }
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        // A referrer must name this image as its subject; an index may be stale or forged.
        if value["subject"]["digest"] != subject {
            continue;
        }
        out.push(Referrer {
            digest: entry_digest,
            artifact_type: value["artifactType"]
                .as_str()
                .or(value["config"]["mediaType"].as_str())
                .unwrap_or("")
                .to_string(),
            annotations: serde_json::from_value(value["annotations"].clone()).unwrap_or_default(),
            unread: None,
        });
    }
    Ok(out)
}

/// The content (the first layer) of the artifact `digest`, verified and capped at 4 MiB.
pub fn artifact_content(remote: &Remote, digest: &Digest) -> Result<Vec<u8>> {
    let reference = remote.parsed()?;
    let s = Session::open(remote, &reference)?;
    s.runtime.block_on(async {
        let by_digest = reference.clone_with_digest(digest.to_string());
        let (bytes, _) = s.manifest_needed(&by_digest, "reading an artifact").await?;
        let manifest: oci_spec::image::ImageManifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::image(&s.what, format!("artifact {digest}: {e}")))?;
        let layer = manifest
            .layers()
            .first()
            .ok_or_else(|| Error::image(&s.what, format!("artifact {digest} has no content")))?;
        let wanted = OciDescriptor {
            digest: layer.digest().to_string(),
            size: i64::try_from(layer.size()).unwrap_or(i64::MAX),
            media_type: layer.media_type().to_string(),
            ..OciDescriptor::default()
        };
        let out = s
            .small_blob(&reference, &wanted, "reading an artifact's content")
            .await
            .map_err(|e| Error::image(&s.what, format!("artifact {digest}: its content, {e}")))?;
        Ok(out)
    })
}
