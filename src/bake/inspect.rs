//! Reading images back: `inspect` (pins, presets, layers, environment) and `verify` (every
//! blob re-hashed, the OCI structure checked, and the labels, the lock and `/etc/nccl.conf`
//! in the layers checked against each other).

use super::fs::{PRESET_PATH_IN_IMAGE, read_file};
use crate::error::{Error, Result};
use crate::image::digest::Digest;
use crate::image::layout::digest_of;
use crate::image::model::{ConfigView, Image, Platform};
use crate::image::referrers::{self, Referrer};
use crate::image::transport::Transport;
use crate::lock::{KIND_LABEL, LOCK_PATH_IN_IMAGE, Lock, PROBE_KIND, VERSION_LABEL};
use crate::preset::MergedEnv;
use crate::sign::bundle::{self, Bundle};
use crate::sign::keys::PublicKey;
use crate::verdict::{Check, Verdict};
use oci_spec::image::MediaType;
use serde::Serialize;
use serde_json::Value;

/// One layer as `inspect` shows it.
#[derive(Debug, Serialize)]
pub struct LayerInfo {
    /// Digest.
    pub digest: String,
    /// Compressed size in bytes.
    pub size: u64,
    /// Media type.
    pub media_type: String,
    /// How it is compressed: `gzip`, `zstd`, `estargz` or `zstd:chunked` (with a table of
    /// contents, for lazy pulls), `none`, or the media type itself when it is none of those.
    pub compression: String,
    /// For an eStargz or zstd:chunked layer, its TOC's digest, as the descriptor gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toc_digest: Option<String>,
    /// For an eStargz or zstd:chunked layer whose blob is at hand, what the stargz
    /// snapshotter prefetches of it before the container starts (its landmark's offset), and
    /// how many files that holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<crate::image::estargz::PrefetchSize>,
    /// What made it, from the history.
    pub created_by: String,
}

/// What `inspect` shows.
#[derive(Debug, Serialize)]
pub struct Inspection {
    /// The image.
    pub image: String,
    /// Manifest digest.
    pub manifest: Digest,
    /// Creation time from the config.
    pub created: Option<String>,
    /// `linux/amd64`.
    pub platform: String,
    /// The labels gpubake sets (`io.gpubake.*`) and the rest.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The config's environment.
    pub env: Vec<String>,
    /// Layers, base first.
    pub layers: Vec<LayerInfo>,
    /// The merged preset with provenance, when the image has one.
    pub presets: Option<MergedEnv>,
    /// True when gpubake made the manifest: the source (a docker archive, an engine's
    /// export) carries none, so another tool may make another, with another digest.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub manifest_made_by_gpubake: bool,
    /// The platforms of an index read without `--platform`, in its order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub platforms: Vec<String>,
    /// For an image in a registry: the artifacts attached to it (certificates, SBOMs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub referrers: Option<Vec<Referrer>>,
    /// With `inspect --key`: what each signed (or signable) referrer says once its signature
    /// is checked with the key, or why it is not believed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub signatures: Vec<SignatureCheck>,
}

/// One referrer's signature checked with a public key (`inspect --key`).
#[derive(Debug, Serialize)]
pub struct SignatureCheck {
    /// The referrer's digest.
    pub digest: Digest,
    /// The signature verifies with the key and the signed statement is about this image.
    pub verified: bool,
    /// What the signed statement says (a certificate's verdict and scope, else its predicate
    /// type), or why it is not believed.
    pub says: String,
}

/// A layer's compression by its media type (OCI's or Docker's), and whether its descriptor
/// names a TOC (eStargz for gzip, zstd:chunked for zstd).
fn compression_of(media_type: &str, toc: bool) -> String {
    let kind = match media_type.rsplit(['+', '.']).next().unwrap_or_default() {
        "gzip" if toc => "estargz",
        "zstd" if toc => "zstd:chunked",
        "gzip" => "gzip",
        "zstd" => "zstd",
        "tar" => "uncompressed",
        _ => media_type,
    };
    kind.to_string()
}

/// Reads an image's pins, presets, layers and environment. For an index, the image of
/// `platform`; without one, this machine's (else the index's first), and the platforms the
/// index holds are listed.
pub fn inspect(image: &Transport, platform: Option<&Platform>) -> Result<Inspection> {
    let mut platforms = Vec::new();
    let img = match platform {
        Some(p) => image.open_platform(Some(p))?,
        None => match image.open_index()? {
            Some(index) => {
                platforms = index.platforms();
                let host = Platform::host();
                let pick = index
                    .images()
                    .iter()
                    .position(|i| {
                        Platform::of_descriptor(i.descriptor()).is_none_or(|p| host.accepts(&p))
                    })
                    .unwrap_or(0);
                let desc = index.images()[pick].descriptor().clone();
                Image::in_layout(index.store().clone(), &desc, &host, None)?
            }
            None => {
                platforms = image.index_platforms()?;
                image.open()?
            }
        },
    };
    let config = img.typed_config()?;
    let history = config.layer_history();
    let layers = img
        .manifest()
        .layers()
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let toc_digest = l
                .annotations()
                .as_ref()
                .and_then(|a| a.get(crate::image::estargz::TOC_DIGEST))
                .cloned();
            let media_type = l.media_type().to_string();
            // Read where the blob is on this machine: a registry's layer is not fetched for it.
            let prefetch = toc_digest
                .as_ref()
                .and_then(|_| crate::image::layout::digest_of(l).ok())
                .map(|d| img.store().blob_path(&d))
                .filter(|blob| blob.exists())
                .and_then(|blob| crate::image::estargz::prefetch_size(&blob).ok().flatten());
            LayerInfo {
                digest: l.digest().to_string(),
                size: l.size(),
                compression: compression_of(&media_type, toc_digest.is_some()),
                media_type,
                toc_digest,
                prefetch,
                created_by: history.get(i).copied().unwrap_or("").to_string(),
            }
        })
        .collect();
    let presets = read_file(&img, PRESET_PATH_IN_IMAGE)?
        .and_then(|bytes| serde_yaml::from_slice::<MergedEnv>(&bytes).ok());
    Ok(Inspection {
        image: image.to_string(),
        manifest: img.digest().clone(),
        manifest_made_by_gpubake: img.is_made_here(),
        created: config.created().map(String::from),
        platform: config.platform(),
        labels: config.labels(),
        env: config.env(),
        layers,
        presets,
        platforms,
        referrers: match image {
            Transport::Registry(remote) => Some(referrers::referrers(remote, img.digest())?),
            _ => None,
        },
        signatures: Vec::new(),
    })
}

impl Inspection {
    /// Checks the signature of every attached bundle with `key` (`inspect --key`): the
    /// listing's annotations are written by whoever pushed, so only a statement signed with
    /// the key, about this very manifest, is shown as checked.
    pub fn check_signatures(&mut self, image: &Transport, key: &PublicKey) -> Result<()> {
        let Transport::Registry(remote) = image else {
            return Err(Error::Usage(format!(
                "{image}: --key checks the signatures of artifacts attached in a registry; name \
                 the image as docker://REGISTRY/NAME:TAG"
            )));
        };
        let manifest = self.manifest.as_str().to_string();
        for r in self.referrers.iter().flatten() {
            let judged = if r.artifact_type == referrers::CERTIFICATE_TYPE {
                Err("an unsigned certificate: anyone who can push could have written it".into())
            } else if r.artifact_type == bundle::MEDIA_TYPE {
                referrers::artifact_content(remote, &r.digest)
                    .map_err(|e| format!("unreadable: {e}"))
                    .and_then(|content| signed_claim(&content, key, &manifest))
            } else {
                continue;
            };
            self.signatures.push(SignatureCheck {
                digest: r.digest.clone(),
                verified: judged.is_ok(),
                says: judged.unwrap_or_else(|why| why),
            });
        }
        Ok(())
    }

    /// The human view: pins, layers, presets with provenance, environment.
    pub fn to_text(&self) -> String {
        let info = self;
        let rebuilt = if info.manifest_made_by_gpubake {
            crate::image::MADE_HERE
        } else {
            ""
        };
        let mut out = format!(
            "image     {}\nmanifest  {}{rebuilt}\nplatform  {}\n",
            info.image, info.manifest, info.platform
        );
        if !info.platforms.is_empty() {
            out.push_str(&format!(
                "index     {} platforms: {} (pick one with --platform)\n",
                info.platforms.len(),
                info.platforms.join(", ")
            ));
        }
        if let Some(c) = &info.created {
            out.push_str(&format!("created   {c}\n"));
        }
        // gpubake's labels are the pins; the rest (the base's, the recipe's) are shown as
        // labels. A heading with nothing under it is left out.
        let (pins, labels): (Vec<_>, Vec<_>) = info
            .labels
            .iter()
            .partition(|(k, _)| k.starts_with("io.gpubake."));
        if !pins.is_empty() {
            out.push_str("pins\n");
            for (k, v) in &pins {
                out.push_str(&format!(
                    "  {:<28} {}\n",
                    k.trim_start_matches("io.gpubake."),
                    v
                ));
            }
        }
        if !labels.is_empty() {
            out.push_str("labels\n");
            for (k, v) in &labels {
                out.push_str(&format!("  {k}={v}\n"));
            }
        }
        out.push_str("layers\n");
        for l in &info.layers {
            out.push_str(&format!(
                "  {} {:>9}  {:<7}  {}\n",
                l.digest,
                crate::units::human_size(l.size),
                l.compression,
                l.created_by
            ));
            if let Some(p) = l.prefetch.filter(|p| p.files > 0) {
                out.push_str(&format!(
                    "      prefetched before the container starts: {} ({} files)\n",
                    crate::units::human_size(p.bytes),
                    p.files
                ));
            }
        }
        if let Some(p) = &info.presets {
            out.push_str("presets\n");
            for (k, v) in &p.0 {
                out.push_str(&format!("  {k}={}  ({})\n", v.value, v.origin.by));
            }
        }
        if let Some(referrers) = &info.referrers {
            out.push_str("referrers\n");
            for r in referrers {
                out.push_str(&format!("  {} {}", r.digest, r.artifact_type));
                let checked = self.signatures.iter().find(|c| c.digest == r.digest);
                if let Some(SignatureCheck {
                    verified: true,
                    says,
                    ..
                }) = checked
                {
                    out.push_str(&format!("  {says} [signed with the key]\n"));
                    continue;
                }
                // The listing's annotations are unsigned: what they say is shown as said by
                // whoever pushed, and labelled so.
                let verdict = r
                    .annotations
                    .get(referrers::VERDICT)
                    .map(|v| format!("  {v}"))
                    .unwrap_or_default();
                let scope = r
                    .annotations
                    .get(referrers::SCOPE)
                    .map(|s| format!(" ({s})"))
                    .unwrap_or_default();
                let label = match checked {
                    Some(refused) => format!(" [not believed: {}]", refused.says),
                    None if verdict.is_empty() && scope.is_empty() => String::new(),
                    None => " [unchecked: an unsigned annotation; inspect --key PUB.pem checks \
                             the signature]"
                        .to_string(),
                };
                out.push_str(&format!("{verdict}{scope}{label}\n"));
            }
        }
        out.push_str("env\n");
        for e in &info.env {
            out.push_str(&format!("  {e}\n"));
        }
        out
    }
}

/// What a bundle signed with `key` says about the manifest `digest`: a certificate's verdict
/// and scope (both inside the signed statement), else its predicate type; Err: why it is not
/// believed.
fn signed_claim(
    content: &[u8],
    key: &PublicKey,
    digest: &str,
) -> std::result::Result<String, String> {
    let statement = Bundle::from_slice(content)?.verify(key)?;
    if !statement.about(digest) {
        return Err(format!("it is signed for another image, not {digest}"));
    }
    let predicate = &statement.predicate;
    Ok(match predicate["verdict"].as_str() {
        Some(verdict) => match predicate["scope"].as_str() {
            Some(scope) => format!("{verdict} ({scope})"),
            None => verdict.to_string(),
        },
        None => statement.predicate_type.clone(),
    })
}

/// What `verify` found.
#[derive(Debug, Serialize)]
pub struct Verification {
    /// The image.
    pub image: String,
    /// The checks, in order.
    pub checks: Vec<Check>,
}

impl Verification {
    /// The verdict: whether every check held.
    pub fn verdict(&self) -> Verdict {
        Verdict::of(&self.checks, false)
    }

    /// True when every check held.
    pub fn passed(&self) -> bool {
        self.verdict() == Verdict::Pass
    }

    /// Adds the check `name`: held with its detail (Ok), or failed with why (Err).
    pub fn check(&mut self, name: impl Into<String>, result: std::result::Result<String, String>) {
        self.checks.push(Check::held("structure", name, result));
    }
}

/// The link closure of the image (`inspect --libraries`): every ELF file's needs as the
/// loader would meet them, from one read of the layers.
pub fn libraries(
    image: &Transport,
    platform: Option<&Platform>,
) -> Result<crate::image::links::LinkReport> {
    crate::image::scan::Scanned::links_of(image, platform)
}

/// Re-hashes every blob and checks structure and consistency. A missing blob or an
/// unreadable index is an error (exit 2); content that does not match is a failed check.
/// For an index, the image of `platform` (the transport's default when None). A registry
/// image is judged by the bytes the registry serves now, downloaded afresh.
pub fn verify(image: &Transport, platform: Option<&Platform>) -> Result<Verification> {
    verify_image(&image.open_as_served(platform)?, image)
}

/// [`verify`] on an image already read.
pub fn verify_image(img: &Image, image: &Transport) -> Result<Verification> {
    verify_image_with(img, image, None)
}

/// [`verify_image`], with each layer's result from a caller that has read every layer already
/// (`image::unpack::unpack_checked` checks the digest and the diff id as it unpacks), so the
/// layers are read once.
pub fn verify_image_with(
    img: &Image,
    image: &Transport,
    layers_read: Option<&[std::result::Result<(), String>]>,
) -> Result<Verification> {
    let mut v = Verification {
        image: image.to_string(),
        checks: Vec::new(),
    };
    let layout = img.store();
    let mut missing = Vec::new();
    for desc in img.blobs() {
        let digest = digest_of(desc)?;
        if !layout.blob_path(&digest).exists() {
            missing.push(format!("blob {digest} is missing"));
        }
    }
    if !missing.is_empty() {
        return Err(Error::image(layout.describe(), missing.join("; ")));
    }

    let m = img.manifest();
    v.check("manifest", manifest_check(m, img.digest()));

    // A damaged config does not stop the layers being read: each is checked against its
    // digest and read through, and only the diff ids go unchecked.
    let config = match img.config() {
        Ok(c) => {
            v.check("config blob", Ok(m.config().digest().to_string()));
            Some(c)
        }
        Err(e) => {
            v.check("config blob", Err(without(&e, &layout.describe())));
            None
        }
    };
    if let Some(config) = &config {
        let view = ConfigView::parse(config);
        let diff_ids = view.as_ref().map(ConfigView::diff_ids).unwrap_or_default();
        v.check(
            "config",
            if let Err(e) = &view {
                Err(e.clone())
            } else if config["os"].as_str().is_none() || config["architecture"].as_str().is_none() {
                Err("os or architecture missing".into())
            } else if diff_ids.len() != m.layers().len() {
                Err(format!(
                    "{} diff_ids for {} layers",
                    diff_ids.len(),
                    m.layers().len()
                ))
            } else {
                Ok(view.map(|c| c.os_architecture()).unwrap_or_default())
            },
        );
    }
    let layers = img.layers();
    // Layers read already are not read again, so they have no progress to show.
    let progress = match layers_read {
        Some(_) => crate::progress::Progress::silent("verifying the layers"),
        None => crate::progress::Progress::new(
            "verifying the layers",
            crate::progress::Unit::Bytes,
            Some(layers.iter().map(|l| l.size()).sum()),
        ),
    };
    for (i, layer) in layers.iter().enumerate() {
        let unchecked = if layer.diff_id().is_none() {
            " (diff id not checked: the config lists none for it)"
        } else {
            ""
        };
        let read = match layers_read.and_then(|r| r.get(i)) {
            Some(result) => result.clone(),
            None => layer.scan().map(|_| ()),
        };
        let result = read.map(|()| {
            format!(
                "{} {} bytes{unchecked}",
                layer.descriptor().digest(),
                layer.size()
            )
        });
        v.check(format!("layer {}", i + 1), result);
        let toc = layer
            .descriptor()
            .annotations()
            .as_ref()
            .and_then(|a| a.get(crate::image::estargz::TOC_DIGEST));
        if let Some(want) = toc {
            let blob = layout.blob_path(&digest_of(layer.descriptor())?);
            v.check(
                format!("layer {} TOC", i + 1),
                crate::image::estargz::check_toc(&blob, want),
            );
        }
        progress.inc(layer.size());
    }
    progress.finish();
    if let Some(config) = &config {
        consistency(img, config, &mut v)?;
    }
    Ok(v)
}

/// `verify`'s check of an image manifest (`digest`'s): schema version 2, an image
/// manifest's media type.
pub fn manifest_check(
    m: &oci_spec::image::ImageManifest,
    digest: &Digest,
) -> std::result::Result<String, String> {
    if m.schema_version() != 2 {
        Err(format!("schemaVersion is {}, not 2", m.schema_version()))
    } else if m.media_type().as_ref().is_some_and(|t| {
        *t != MediaType::ImageManifest
            && t.to_string() != "application/vnd.docker.distribution.manifest.v2+json"
    }) {
        Err(format!(
            "media type {:?} is not an image manifest",
            m.media_type()
        ))
    } else {
        Ok(format!(
            "{digest} ({} layer{})",
            m.layers().len(),
            if m.layers().len() == 1 { "" } else { "s" }
        ))
    }
}

/// An error's text without the image's name in front: a check of `verify` is printed under
/// the image already.
fn without(e: &Error, name: &str) -> String {
    let text = e.to_string();
    text.strip_prefix(&format!("{name}: "))
        .map(str::to_string)
        .unwrap_or(text)
}

/// Labels, `/etc/gpubake/lock.yaml`, `/etc/nccl.conf` and the config's environment agree.
fn consistency(img: &Image, config: &Value, v: &mut Verification) -> Result<()> {
    let view = ConfigView::parse(config).ok();
    let labels = view.as_ref().map(ConfigView::labels).unwrap_or_default();
    if !labels.contains_key("io.gpubake.recipe.sha256") {
        v.check(
            "gpubake metadata",
            Ok("not a gpubake image; lock checks skipped".into()),
        );
        return Ok(());
    }
    if labels.get(KIND_LABEL).map(String::as_str) == Some(PROBE_KIND) {
        // A probe image pins nothing: there is no lock to hold the rest to.
        v.check(
            "lock",
            Ok(format!(
                "none: a probe image ({KIND_LABEL}={PROBE_KIND}) of gpubake {}",
                labels.get(VERSION_LABEL).map_or("?", String::as_str)
            )),
        );
        return Ok(());
    }
    let lock_bytes = match read_file(img, LOCK_PATH_IN_IMAGE) {
        Ok(Some(b)) => b,
        Ok(None) => {
            v.check(
                "lock",
                Err(format!("{LOCK_PATH_IN_IMAGE} is missing from the layers")),
            );
            return Ok(());
        }
        Err(e) => {
            v.check("lock", Err(e.to_string()));
            return Ok(());
        }
    };
    let lock: Lock = match serde_yaml::from_slice(&lock_bytes) {
        Ok(l) => l,
        Err(e) => {
            v.check(
                "lock",
                Err(format!("{LOCK_PATH_IN_IMAGE} does not parse: {e}")),
            );
            return Ok(());
        }
    };
    v.check(
        "lock",
        Ok(format!(
            "{LOCK_PATH_IN_IMAGE} for recipe {}",
            lock.recipe.name
        )),
    );

    let disagree: Vec<String> = lock
        .labels
        .iter()
        .filter(|(k, _)| k.starts_with("io.gpubake."))
        .filter(|(k, want)| labels.get(*k) != Some(*want))
        .map(|(k, want)| match labels.get(k) {
            Some(has) => format!("label {k} is `{has}`, the lock says `{want}`"),
            None => format!("label {k} is missing, the lock says `{want}`"),
        })
        .collect();
    v.check(
        "labels vs lock",
        if disagree.is_empty() {
            Ok("agree".into())
        } else {
            Err(disagree.join("; "))
        },
    );

    // A layer that does not read (a damaged blob) fails this check beside its own, rather
    // than making the whole image unreadable.
    v.check(
        "nccl.conf vs lock",
        match read_file(img, "/etc/nccl.conf") {
            Ok(Some(c)) if c == lock.env.nccl_conf().as_bytes() => Ok("agree".into()),
            Ok(Some(c)) => Err(format!(
                "/etc/nccl.conf holds {:?}, the lock's preset gives {:?}",
                String::from_utf8_lossy(&c),
                lock.env.nccl_conf()
            )),
            Ok(None) => Err("/etc/nccl.conf is missing from the layers".into()),
            Err(e) => Err(e.to_string()),
        },
    );

    let env = view.as_ref().map(ConfigView::env).unwrap_or_default();
    let missing: Vec<String> = lock
        .image_env()
        .into_iter()
        .map(|(k, val)| format!("{k}={val}"))
        .filter(|line| !env.contains(line))
        .collect();
    v.check(
        "env vs lock",
        if missing.is_empty() {
            Ok("agree".into())
        } else {
            Err(format!("config Env lacks {}", missing.join(", ")))
        },
    );
    Ok(())
}
