//! The one shape an image has in gpubake, whatever it was read from: an [`Image`] (the
//! manifest as stored and as parsed, its digest, the config, the layers) and a [`Layer`]
//! (digest, diff id, size, media type, and readers of its compressed and uncompressed bytes
//! that check both digests). Every source (an OCI layout, a docker archive, an engine, a
//! registry) produces an `Image` and every sink takes one; build, inspect, verify, certify and
//! unpack read images only through these two types.
//!
//! The blobs of an image always sit in a [`Layout`]: the image's own layout, or a staging one
//! that its source filled (an archive's members, a registry's downloads), kept for as long as
//! the image is.

use super::digest::{Digest, HashingReader, VerifyingReader};
use super::layout::{Layout, digest_of};
use super::tarstream::{End, Padded};
use crate::error::{Error, Result};
use crate::interrupt::ScratchDir;
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, MediaType};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufReader, Read};
use std::ops::ControlFlow;
use std::path::{Component, Path, PathBuf};

/// An operating system, CPU architecture and optional CPU variant, as image indexes name them
/// (`linux/amd64`, `linux/arm64/v8`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// `amd64`, `arm64`, ...
    pub architecture: String,
    /// `v8` for `linux/arm64/v8`; None when not written.
    pub variant: Option<String>,
}

/// The platforms gpubake builds images for: those whose wheels, probe and GPUs it knows.
pub const BUILDABLE: [&str; 2] = ["linux/amd64", "linux/arm64"];

impl Platform {
    /// The platform this binary runs on, in Go's names (what image indexes use).
    pub fn host() -> Self {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            other => other,
        };
        Platform {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: None,
        }
    }

    /// The variant that counts when comparing: arm64's only variant is v8, so an arm64
    /// entry without one and one with `v8` are the same platform (containerd and Docker
    /// read them alike).
    fn effective_variant(&self) -> Option<&str> {
        match (self.architecture.as_str(), self.variant.as_deref()) {
            ("arm64", Some("v8" | "8")) => None,
            (_, v) => v,
        }
    }

    /// True when an image for `other` serves this platform: same OS and architecture, and
    /// the same variant where this one names one.
    pub fn accepts(&self, other: &Platform) -> bool {
        self.os == other.os
            && self.architecture == other.architecture
            && (self.effective_variant().is_none()
                || self.effective_variant() == other.effective_variant())
    }

    /// The same platform, in the fewest words: `linux/arm64/v8` is `linux/arm64`.
    pub fn same_as(&self, other: &Platform) -> bool {
        self.os == other.os
            && self.architecture == other.architecture
            && self.effective_variant() == other.effective_variant()
    }

    /// Refuses a platform gpubake cannot build for, listing those it can.
    pub fn buildable(&self) -> std::result::Result<(), String> {
        let known = self.os == "linux"
            && (self.architecture == "amd64" && self.variant.is_none()
                || self.architecture == "arm64" && self.effective_variant().is_none());
        if known {
            Ok(())
        } else {
            Err(format!(
                "gpubake builds images for {} (arm64 may be written linux/arm64/v8), not {self}",
                BUILDABLE.join(" and ")
            ))
        }
    }

    /// The ELF machine number (`e_machine`) of executables for this platform.
    pub fn elf_machine(&self) -> Option<u16> {
        match self.architecture.as_str() {
            "amd64" => Some(62),
            "arm64" => Some(183),
            _ => None,
        }
    }

    /// The platform of an index entry or a config, when it names one.
    pub fn of_descriptor(desc: &Descriptor) -> Option<Platform> {
        desc.platform().as_ref().map(|p| Platform {
            os: p.os().to_string(),
            architecture: p.architecture().to_string(),
            variant: p.variant().clone(),
        })
    }

    /// As an index entry's `platform`.
    pub fn to_oci(&self) -> oci_spec::image::Platform {
        let mut p = oci_spec::image::PlatformBuilder::default()
            .os(oci_spec::image::Os::from(self.os.as_str()))
            .architecture(oci_spec::image::Arch::from(self.architecture.as_str()))
            .build()
            .expect("os and architecture are all a platform needs");
        p.set_variant(self.variant.clone());
        p
    }
}

impl std::str::FromStr for Platform {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let parts: Vec<&str> = text.split('/').collect();
        let (os, arch, variant) = match parts.as_slice() {
            [os, arch] => (*os, *arch, None),
            [os, arch, variant] if !variant.is_empty() => (*os, *arch, Some(variant.to_string())),
            _ => ("", "", None),
        };
        if os.is_empty() || arch.is_empty() {
            return Err(Error::Usage(format!(
                "--platform `{text}`: expected OS/ARCH[/VARIANT], as in linux/amd64 or \
                 linux/arm64/v8"
            )));
        }
        Ok(Platform {
            os: os.to_string(),
            architecture: arch.to_string(),
            variant,
        })
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// An image: its manifest and where its blobs are.
pub struct Image {
    store: Layout,
    desc: Descriptor,
    /// The manifest's digest, checked when the descriptor was read.
    digest: Digest,
    raw_manifest: Vec<u8>,
    manifest: ImageManifest,
    origin: Option<Origin>,
    made_here: bool,
    _staging: Option<ScratchDir>,
}

/// A registry repository that holds some of an image's blobs (the image was pulled from it,
/// or built on a base that was), so a push to the same registry can mount them instead of
/// uploading them again.
#[derive(Clone, Debug)]
pub struct Origin {
    /// The registry's host (and port).
    pub registry: String,
    /// The repository.
    pub repository: String,
    /// The digests of the blobs it holds.
    pub blobs: std::collections::HashSet<String>,
}

impl Image {
    /// The image `desc` names in `store`; an index is descended into for `platform`.
    /// `staging` is kept alive as long as the image: the directory its source filled.
    pub fn in_layout(
        store: Layout,
        desc: &Descriptor,
        platform: &Platform,
        staging: Option<ScratchDir>,
    ) -> Result<Image> {
        let digest = digest_of(desc)?;
        let bytes = store.read_blob(&digest, Some(desc.size()))?;
        if is_index(desc) {
            let index: ImageIndex = serde_json::from_slice(&bytes)
                .map_err(|e| Error::image(store.describe(), format!("index {digest}: {e}")))?;
            let pick = pick_platform(&index, platform)
                .ok_or_else(|| {
                    Error::image(
                        store.describe(),
                        format!(
                            "index {digest} has no {platform} image; it has {}",
                            index_platforms(&index).join(", ")
                        ),
                    )
                })?
                .clone();
            return Image::in_layout(store, &pick, platform, staging);
        }
        let manifest: ImageManifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::image(store.describe(), format!("manifest {digest}: {e}")))?;
        Ok(Image {
            store,
            desc: desc.clone(),
            digest,
            raw_manifest: bytes,
            manifest,
            origin: None,
            made_here: false,
            _staging: staging,
        })
    }

    /// The same image, known to have blobs in `origin`.
    pub fn with_origin(mut self, origin: Option<Origin>) -> Image {
        self.origin = origin;
        self
    }

    /// The same image, marked as one whose manifest gpubake made (`made`): its source, a
    /// docker archive or an engine's export, held none.
    pub fn made_here(mut self, made: bool) -> Image {
        self.made_here = made;
        self
    }

    /// True when gpubake made the manifest, so another tool reading the same source may make
    /// another, with another digest (the config's digest, the image ID, is the same).
    pub fn is_made_here(&self) -> bool {
        self.made_here
    }

    /// The registry repository that holds some of its blobs, when known.
    pub fn origin(&self) -> Option<&Origin> {
        self.origin.as_ref()
    }

    /// The manifest's descriptor: its digest, size and media type.
    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    /// The manifest's digest.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// The manifest, parsed.
    pub fn manifest(&self) -> &ImageManifest {
        &self.manifest
    }

    /// The manifest exactly as stored: its digest is the image's.
    pub fn raw_manifest(&self) -> &[u8] {
        &self.raw_manifest
    }

    /// The layout holding the blobs.
    pub fn store(&self) -> &Layout {
        &self.store
    }

    /// Where the image was read from, for messages.
    pub fn describe(&self) -> String {
        self.store.describe()
    }

    /// The config blob, verified and capped in size as every manifest and config is.
    pub fn config_bytes(&self) -> Result<Vec<u8>> {
        let desc = self.manifest.config();
        self.store.read_blob(&digest_of(desc)?, Some(desc.size()))
    }

    /// The config through oci-spec's types, for reading.
    pub fn typed_config(&self) -> Result<ConfigView> {
        let config = self.config()?;
        ConfigView::parse(&config).map_err(|e| {
            Error::image(
                self.describe(),
                format!("config {}: {e}", self.manifest.config().digest()),
            )
        })
    }

    /// The config, parsed.
    pub fn config(&self) -> Result<Value> {
        let digest = digest_of(self.manifest.config())?;
        serde_json::from_slice(&self.config_bytes()?)
            .map_err(|e| Error::image(self.describe(), format!("config {digest}: {e}")))
    }

    /// The layers, base first, each with the diff id the config lists for it (None where the
    /// config is unreadable or lists fewer).
    pub fn layers(&self) -> Vec<Layer> {
        let diff_ids = self
            .config()
            .map(|c| strings(&c["rootfs"]["diff_ids"]))
            .unwrap_or_default();
        self.manifest
            .layers()
            .iter()
            .enumerate()
            .map(|(i, desc)| Layer {
                store: self.store.clone(),
                desc: desc.clone(),
                diff_id: diff_ids.get(i).cloned(),
            })
            .collect()
    }

    /// Copies the image's blobs and manifest into `store`, each verified on the way; blobs
    /// already there are kept.
    pub fn copy_to(&self, store: &Layout) -> Result<()> {
        for desc in self.blobs() {
            let digest = digest_of(desc)?;
            if store.has_blob(&digest, desc.size()) {
                continue;
            }
            let mut w = store.blob_writer()?;
            std::io::copy(
                &mut self.store.open_blob(&digest, Some(desc.size()))?,
                &mut w,
            )
            .map_err(|e| {
                // A full destination is the destination's, not the image's.
                if crate::error::out_of_space(&e) {
                    Error::writing_needing(store.root(), e, desc.size())
                } else {
                    Error::image(self.describe(), e.to_string())
                }
            })?;
            w.commit()?;
        }
        store.write_blob(&self.raw_manifest)?;
        Ok(())
    }

    /// Checks every blob against the manifest and the config, as a copy does before it writes
    /// anything: the config's digest, that it parses and (for an image's config) lists a diff
    /// id for each layer, and each layer's digest, tar stream and diff id.
    pub fn check(&self) -> Result<()> {
        self.check_except(&std::collections::HashSet::new())
    }

    /// As [`Image::check`], leaving out the layers in `checked`: those a pull checked as they
    /// streamed in, which need not be read again.
    pub fn check_except(&self, checked: &std::collections::HashSet<Digest>) -> Result<()> {
        let config = self.config()?;
        let image_config = [
            MediaType::ImageConfig.to_string(),
            "application/vnd.docker.container.image.v1+json".to_string(),
        ];
        let layers = self.layers();
        if image_config.contains(&self.manifest.config().media_type().to_string()) {
            let diff_ids = strings(&config["rootfs"]["diff_ids"]);
            if diff_ids.len() != layers.len() {
                return Err(Error::image(
                    self.describe(),
                    format!(
                        "config {} lists {} diff ids for {} layers",
                        self.manifest.config().digest(),
                        diff_ids.len(),
                        layers.len()
                    ),
                ));
            }
        }
        for layer in &layers {
            if checked.contains(&layer.digest()?) {
                continue;
            }
            layer
                .check(false)
                .map_err(|e| Error::image(self.describe(), e))?;
        }
        Ok(())
    }

    /// The platform the config names (`os`, `architecture`, `variant`), when it names one.
    pub fn platform(&self) -> Result<Option<Platform>> {
        let config = self.config()?;
        Ok(
            match (config["os"].as_str(), config["architecture"].as_str()) {
                (Some(os), Some(arch)) => Some(Platform {
                    os: os.to_string(),
                    architecture: arch.to_string(),
                    variant: config["variant"].as_str().map(String::from),
                }),
                _ => None,
            },
        )
    }

    /// Every blob: the config, then the layers.
    pub fn blobs(&self) -> impl Iterator<Item = &Descriptor> {
        std::iter::once(self.manifest.config()).chain(self.manifest.layers())
    }
}

/// True when a descriptor names an image index (OCI's or Docker's manifest list).
pub fn is_index(desc: &Descriptor) -> bool {
    *desc.media_type() == MediaType::ImageIndex
        || desc.media_type().to_string()
            == "application/vnd.docker.distribution.manifest.list.v2+json"
}

/// An image index: one image per platform, and the index's own bytes, whose digest is the
/// multi-platform image's.
pub struct IndexImage {
    store: Layout,
    desc: Descriptor,
    /// The index's digest, checked when the descriptor was read.
    digest: Digest,
    raw: Vec<u8>,
    images: Vec<Image>,
    _staging: Option<ScratchDir>,
}

impl IndexImage {
    /// Writes an index of `images` into `store`; each image's descriptor carries its
    /// platform, which the index lists.
    pub fn write(store: &Layout, images: Vec<Image>) -> Result<IndexImage> {
        let index = oci_spec::image::ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(
                images
                    .iter()
                    .map(|i| i.descriptor().clone())
                    .collect::<Vec<_>>(),
            )
            .build()
            .map_err(|e| Error::image(store.describe(), e.to_string()))?;
        let desc = store.write_json(&index, MediaType::ImageIndex)?;
        let digest = digest_of(&desc)?;
        let raw = store.read_blob(&digest, Some(desc.size()))?;
        Ok(IndexImage {
            store: store.clone(),
            desc,
            digest,
            raw,
            images,
            _staging: None,
        })
    }

    /// The index `desc` names in `store`, with every image it lists (an entry that is an
    /// index itself is refused: gpubake reads one level).
    pub fn in_layout(
        store: Layout,
        desc: &Descriptor,
        staging: Option<ScratchDir>,
    ) -> Result<IndexImage> {
        let digest = digest_of(desc)?;
        let raw = store.read_blob(&digest, Some(desc.size()))?;
        let index: ImageIndex = serde_json::from_slice(&raw)
            .map_err(|e| Error::image(store.describe(), format!("index {digest}: {e}")))?;
        let mut images = Vec::new();
        for entry in index.manifests() {
            if is_index(entry) {
                return Err(Error::image(
                    store.describe(),
                    format!(
                        "index {digest} lists another index, {}; gpubake reads one level",
                        entry.digest()
                    ),
                ));
            }
            let platform = Platform::of_descriptor(entry).unwrap_or_else(Platform::host);
            images.push(Image::in_layout(store.clone(), entry, &platform, None)?);
        }
        Ok(IndexImage {
            store,
            desc: desc.clone(),
            digest,
            raw,
            images,
            _staging: staging,
        })
    }

    /// The same index, keeping `staging` (the directory its blobs were pulled into) for as
    /// long as it lives.
    pub fn with_staging(mut self, staging: ScratchDir) -> IndexImage {
        self._staging = Some(staging);
        self
    }

    /// The index's descriptor.
    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    /// The index's digest: the multi-platform image's.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// The index exactly as stored.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// The images, in the index's order.
    pub fn images(&self) -> &[Image] {
        &self.images
    }

    /// The layout holding the blobs.
    pub fn store(&self) -> &Layout {
        &self.store
    }

    /// The platform each image names, in the index's order (`?` for an entry without one).
    pub fn platforms(&self) -> Vec<String> {
        self.images
            .iter()
            .map(|i| {
                Platform::of_descriptor(i.descriptor())
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "?".into())
            })
            .collect()
    }

    /// Copies every image and the index into `store`, each blob verified on the way.
    pub fn copy_to(&self, store: &Layout) -> Result<()> {
        for image in &self.images {
            image.copy_to(store)?;
        }
        store.write_blob(&self.raw)?;
        Ok(())
    }
}

/// The entry of an index for `platform`; an entry without a platform matches any.
pub fn pick_platform<'a>(index: &'a ImageIndex, platform: &Platform) -> Option<&'a Descriptor> {
    index
        .manifests()
        .iter()
        .find(|m| Platform::of_descriptor(m).is_none_or(|p| platform.accepts(&p)))
}

/// The platform each entry of an index names, in its order (`?` for an entry without one).
pub fn index_platforms(index: &ImageIndex) -> Vec<String> {
    index
        .manifests()
        .iter()
        .map(|m| {
            Platform::of_descriptor(m)
                .map(|p| p.to_string())
                .unwrap_or_else(|| "?".into())
        })
        .collect()
}

/// An image config read through oci-spec's types. gpubake writes configs from their JSON
/// ([`Image::config`]), which keeps the fields oci-spec does not model (Docker's among
/// them), so a base's config keeps its bytes; what it reads goes through this view.
pub struct ConfigView(oci_spec::image::ImageConfiguration);

impl ConfigView {
    /// The view of `config`, or why it is no OCI image config. The fields oci-spec requires
    /// but readers can do without (`os`, `architecture`, `rootfs`) read as empty when absent,
    /// as skopeo and docker read them; `verify` checks their presence on the JSON itself.
    pub fn parse(config: &Value) -> std::result::Result<ConfigView, String> {
        let mut config = config.clone();
        if let Some(c) = config.as_object_mut() {
            for (field, empty) in [
                ("os", serde_json::json!("")),
                ("architecture", serde_json::json!("")),
                (
                    "rootfs",
                    serde_json::json!({"type": "layers", "diff_ids": []}),
                ),
            ] {
                c.entry(field).or_insert(empty);
            }
        }
        serde_json::from_value(config)
            .map(ConfigView)
            .map_err(|e| format!("not an OCI image config: {e}"))
    }

    /// The environment, `NAME=value` entries in order.
    pub fn env(&self) -> Vec<String> {
        self.0
            .config()
            .as_ref()
            .and_then(|c| c.env().clone())
            .unwrap_or_default()
    }

    /// The environment as (name, value) pairs; an entry without `=` is left out.
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        self.env()
            .iter()
            .filter_map(|e| {
                e.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect()
    }

    /// The labels, by name.
    pub fn labels(&self) -> std::collections::BTreeMap<String, String> {
        self.0
            .config()
            .as_ref()
            .and_then(|c| c.labels().clone())
            .map(|l| l.into_iter().collect())
            .unwrap_or_default()
    }

    /// The label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.0
            .config()
            .as_ref()
            .and_then(|c| c.labels().as_ref())
            .and_then(|l| l.get(key))
            .map(String::as_str)
    }

    /// The working directory, when set.
    pub fn working_dir(&self) -> Option<&str> {
        self.0
            .config()
            .as_ref()
            .and_then(|c| c.working_dir().as_deref())
            .filter(|d| !d.is_empty())
    }

    /// The user, empty when unset.
    pub fn user(&self) -> &str {
        self.0
            .config()
            .as_ref()
            .and_then(|c| c.user().as_deref())
            .unwrap_or("")
    }

    /// The diff ids of the layers, base first.
    pub fn diff_ids(&self) -> &[String] {
        self.0.rootfs().diff_ids()
    }

    /// `os/architecture`.
    pub fn os_architecture(&self) -> String {
        format!("{}/{}", self.0.os(), self.0.architecture())
    }

    /// `os/architecture[/variant]`, `?` standing for what the config leaves out.
    pub fn platform(&self) -> String {
        let or_unknown = |s: String| if s.is_empty() { "?".to_string() } else { s };
        format!(
            "{}/{}{}",
            or_unknown(self.0.os().to_string()),
            or_unknown(self.0.architecture().to_string()),
            self.0
                .variant()
                .as_ref()
                .map(|v| format!("/{v}"))
                .unwrap_or_default()
        )
    }

    /// When the image was made, as the config says.
    pub fn created(&self) -> Option<&str> {
        self.0.created().as_deref()
    }

    /// The `created_by` of each history entry that made a layer, in layer order.
    pub fn layer_history(&self) -> Vec<&str> {
        self.0
            .history()
            .iter()
            .flatten()
            .filter(|h| !h.empty_layer().unwrap_or(false))
            .map(|h| h.created_by().as_deref().unwrap_or(""))
            .collect()
    }
}

/// The strings of a JSON list (`Env`, `diff_ids`); empty when it is not one.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// One layer of an image.
#[derive(Clone)]
pub struct Layer {
    store: Layout,
    desc: Descriptor,
    diff_id: Option<String>,
}

/// A layer's tar stream, as [`Layer::read_tar`] hands it out: decompressed, hashed for the
/// diff id, and padded (see `tarstream`).
pub type LayerTar<'a> = tar::Archive<Padded<HashingReader<Box<dyn Read + 'a>>>>;

/// One entry of a layer, as [`Layer::each_entry`] visits it.
pub type LayerEntry<'a> = tar::Entry<'a, Padded<Box<dyn Read>>>;

impl Layer {
    /// The layer's descriptor.
    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    /// The compressed blob's digest.
    pub fn digest(&self) -> Result<Digest> {
        digest_of(&self.desc)
    }

    /// The compressed size.
    pub fn size(&self) -> u64 {
        self.desc.size()
    }

    /// The media type.
    pub fn media_type(&self) -> &MediaType {
        self.desc.media_type()
    }

    /// The uncompressed digest the config lists for this layer.
    pub fn diff_id(&self) -> Option<&str> {
        self.diff_id.as_deref()
    }

    /// The compressed bytes; reading fails at the end unless they match the digest and size.
    pub fn compressed(&self) -> Result<VerifyingReader<BufReader<File>>> {
        self.store.open_blob(&self.digest()?, Some(self.size()))
    }

    /// The tar stream; reading fails at the end unless it matches the diff id (and the
    /// compressed bytes their digest).
    pub fn uncompressed(&self) -> Result<VerifyingReader<Box<dyn Read>>> {
        let digest = self.digest()?;
        let diff_id: Digest = self
            .diff_id()
            .ok_or_else(|| {
                Error::image(
                    self.store.describe(),
                    format!("layer {digest}: the config lists no diff id for it"),
                )
            })?
            .parse()
            .map_err(|e: String| Error::image(self.store.describe(), e))?;
        let reader: Box<dyn Read> = decompressor(self.media_type(), self.compressed()?)
            .map_err(|e| Error::image(&digest, e.to_string()))?;
        Ok(VerifyingReader::new(
            reader,
            diff_id,
            None,
            format!("{}: layer {digest} uncompressed", self.store.describe()),
        ))
    }

    /// True when the media type names a tar layer (plain, gzip or zstd).
    pub fn is_tar(&self) -> bool {
        let media = self.media_type().to_string();
        // OCI's `tar`, `tar+gzip`, `tar+zstd`, and Docker's `rootfs.diff.tar.gzip`, the
        // type of most images in registries.
        ["tar", "tar+gzip", "tar+zstd", "tar.gzip"]
            .iter()
            .any(|s| media.ends_with(s))
    }

    /// Hands the layer's tar stream to `read`. With `whole`, the rest of the stream is read
    /// after `read` returns and its uncompressed digest checked against the diff id, so the
    /// blob digest and the diff id both cover everything. Errors name the layer.
    pub fn read_tar<T>(
        &self,
        whole: bool,
        read: impl FnOnce(&mut LayerTar<'_>, &End) -> std::io::Result<T>,
    ) -> std::result::Result<T, String> {
        let digest = self.digest().map_err(|e| e.to_string())?;
        let raw = self.compressed().map_err(|e| e.to_string())?;
        let reader = decompressor(self.media_type(), raw).map_err(|e| e.to_string())?;
        // The blob is read, checked against its digest and decompressed on a thread of its
        // own while this one hashes the tar stream and hands its entries on: two cores for a
        // layer of gigabytes.
        let reader: Box<dyn Read> = Box::new(super::tarstream::ReadAhead::new(reader));
        let (reader, tally) = HashingReader::new(reader);
        // The padding goes outside the hashing reader: the diff ID covers the real bytes only.
        let (reader, end) = Padded::new(reader);
        let mut archive = tar::Archive::new(reader);
        let out = read(&mut archive, &end).map_err(|e| format!("layer {digest}: {e}"))?;
        if whole {
            let mut rest = archive.into_inner();
            std::io::copy(&mut rest, &mut std::io::sink())
                .map_err(|e| format!("layer {digest}: {e}"))?;
            let (got, _) = tally.finish();
            let want = self
                .diff_id()
                .ok_or_else(|| format!("layer {digest}: the config lists no diff id for it"))?;
            if got.as_str() != want {
                return Err(format!(
                    "layer {digest}: uncompressed content is {got}, but the config says {want}"
                ));
            }
        }
        Ok(out)
    }

    /// Visits every entry with its path (no `./`, no trailing `/`) until `visit` breaks,
    /// checking the stream's end but not the diff id (a visit may stop reading early). Errors
    /// name the image and the layer.
    pub fn each_entry(
        &self,
        mut visit: impl FnMut(&str, &mut LayerEntry<'_>) -> std::io::Result<ControlFlow<()>>,
    ) -> Result<()> {
        let digest = self.digest()?;
        // As in `scan`: a blob whose media type names no layer is not read as a tar stream.
        if !self.is_tar() {
            return Err(Error::image(
                format!("{}: layer {digest}", self.store.describe()),
                format!("media type {} is not a layer", self.media_type()),
            ));
        }
        let reader: Box<dyn Read> = decompressor(self.media_type(), self.compressed()?)
            .map_err(|e| Error::image(&digest, e.to_string()))?;
        let bad = |e: std::io::Error| {
            Error::image(
                format!("{}: layer {digest}", self.store.describe()),
                e.to_string(),
            )
        };
        let (reader, end) = Padded::new(reader);
        let mut tar = tar::Archive::new(reader);
        for entry in tar.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            end.saw(&entry);
            let path = entry.path().map_err(bad)?.to_string_lossy().into_owned();
            let path = path.trim_start_matches("./").trim_end_matches('/');
            if visit(path, &mut entry).map_err(bad)?.is_break() {
                break;
            }
        }
        end.check().map_err(bad)
    }

    /// Reads the layer through: its digest, its uncompressed digest against the diff id, and
    /// every entry's path and link target, none of which may leave the root.
    pub fn scan(&self) -> std::result::Result<(), String> {
        self.check(true)
    }

    /// Reads the compressed blob through against its digest and size.
    pub fn check_digest(&self) -> std::result::Result<(), String> {
        let mut blob = self.compressed().map_err(|e| e.to_string())?;
        std::io::copy(&mut blob, &mut std::io::sink())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Reads the layer through: its digest, its tar stream to the end and its uncompressed
    /// digest against the diff id (where the config lists one: `verify` still reads the
    /// layers of an image whose config is damaged); with `paths`, also every entry's path and
    /// link target, none of which may leave the root. A blob whose media type names no layer
    /// is refused with `paths` and otherwise only checked against its digest. When the stream
    /// does not read, a blob that does not match its digest is named as that, the cause,
    /// rather than with what the decompressor or the tar reader made of its bytes.
    pub fn check(&self, paths: bool) -> std::result::Result<(), String> {
        let digest = self.digest().map_err(|e| e.to_string())?;
        // A blob whose media type names no layer is not read as one: its bytes could be
        // anything, and a tar reader's complaint about them would hide the real problem.
        if !self.is_tar() {
            if paths {
                return Err(format!(
                    "layer {digest}: media type {} is not a layer",
                    self.media_type()
                ));
            }
            return self.check_digest();
        }
        let mut links = LayerLinks::default();
        self.read_tar(self.diff_id.is_some(), |tar, end| {
            for entry in tar.entries()? {
                let entry = entry?;
                end.saw(&entry);
                if paths {
                    check_entry(&entry).map_err(std::io::Error::other)?;
                    links.add(&entry).map_err(std::io::Error::other)?;
                }
            }
            end.check()
        })
        .map_err(|e| self.check_digest().err().unwrap_or(e))
    }
}

/// A reader of a layer's tar stream, whatever its compression.
pub fn decompressor<'a, R: Read + Send + 'a>(
    media_type: &MediaType,
    raw: R,
) -> std::io::Result<Box<dyn Read + Send + 'a>> {
    let text = media_type.to_string();
    Ok(if text.ends_with("gzip") {
        Box::new(flate2::read::MultiGzDecoder::new(raw))
    } else if text.ends_with("zstd") {
        Box::new(zstd::stream::read::Decoder::new(raw)?)
    } else {
        Box::new(raw)
    })
}

/// Refuses entries that would land outside the root: absolute paths, `..`, hard links out of
/// the tree, and relative symlinks that climb above `/`. Absolute symlink targets are fine:
/// runtimes resolve them inside the root.
fn check_entry<R: Read>(entry: &tar::Entry<R>) -> std::result::Result<(), String> {
    let path = entry.path().map_err(|e| e.to_string())?;
    let depth = depth_within(&path)
        .ok_or_else(|| format!("entry `{}` escapes the root", path.display()))?;
    let kind = entry.header().entry_type();
    if let Some(target) = entry.link_name().map_err(|e| e.to_string())? {
        if kind.is_hard_link() && depth_within(&target).is_none() {
            return Err(format!(
                "hard link `{}` -> `{}` escapes the root",
                path.display(),
                target.display()
            ));
        }
        if kind.is_symlink() && !target.is_absolute() {
            let mut level = depth as i64 - 1;
            for c in target.components() {
                match c {
                    Component::ParentDir => level -= 1,
                    Component::Normal(_) => level += 1,
                    _ => {}
                }
                if level < 0 {
                    return Err(format!(
                        "symlink `{}` -> `{}` escapes the root",
                        path.display(),
                        target.display()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The symlinks a layer has made so far, so that a later entry of the same layer under one of
/// them is seen for what it is: `esc -> /somewhere` then `esc/file` writes through the link.
/// A runtime resolves such a path inside the root, but gpubake's own unpacker (`certify
/// --runtime`) refuses a parent that resolves outside it, and verify and build refuse it too
/// so that the three agree about which layers are sound. Links of lower layers are not seen:
/// build does not read again the base layers a layout already holds.
#[derive(Default)]
struct LayerLinks(HashMap<PathBuf, PathBuf>);

impl LayerLinks {
    /// Follows the entry's parent through the links seen so far (relative ones stay inside
    /// the root: `check_entry` refused the others), refuses one that goes through an
    /// absolute link, and records the entry if it is a link itself.
    fn add<R: Read>(&mut self, entry: &tar::Entry<R>) -> std::result::Result<(), String> {
        let path = entry.path().map_err(|e| e.to_string())?;
        let mut parts: Vec<PathBuf> = Vec::new();
        let mut rest: VecDeque<PathBuf> = normal_parts(&path);
        let name = rest.pop_back();
        let mut hops = 0;
        while let Some(part) = rest.pop_front() {
            parts.push(part);
            let here: PathBuf = parts.iter().collect();
            let Some(target) = self.0.get(&here) else {
                continue;
            };
            if target.is_absolute() {
                return Err(format!(
                    "entry `{}` lies under symlink `{}` -> `{}`: it would be written through \
                     the link, which gpubake's unpacker refuses, so verify and build refuse it too",
                    path.display(),
                    here.display(),
                    target.display()
                ));
            }
            hops += 1;
            if hops > 40 {
                return Err(format!(
                    "entry `{}`: too many levels of symlinks",
                    path.display()
                ));
            }
            // Replace the link by its target and walk the result again from the top.
            parts.pop();
            let mut resolved: VecDeque<PathBuf> =
                normal_parts(&parts.iter().collect::<PathBuf>().join(target));
            resolved.extend(rest.drain(..));
            parts.clear();
            rest = resolved;
        }
        let Some(name) = name else {
            return Ok(());
        };
        let at: PathBuf = parts.iter().collect::<PathBuf>().join(name);
        match entry.link_name().map_err(|e| e.to_string())? {
            Some(target) if entry.header().entry_type().is_symlink() => {
                self.0.insert(at, target.into_owned());
            }
            // Anything else at that path replaces a link made there before.
            _ => {
                self.0.remove(&at);
            }
        }
        Ok(())
    }
}

/// The normal components of a path inside the root, `..` applied (never above the root).
fn normal_parts(path: &Path) -> VecDeque<PathBuf> {
    let mut out = VecDeque::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push_back(PathBuf::from(p)),
            Component::ParentDir => {
                out.pop_back();
            }
            _ => {}
        }
    }
    out
}

/// The number of components of a relative path that stays inside the root; None otherwise.
fn depth_within(path: &Path) -> Option<usize> {
    let mut depth = 0usize;
    for c in path.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => depth = depth.checked_sub(1)?,
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(depth)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layout holding one uncompressed layer of `entries` (path, symlink target or None
    /// for a file); returns the scan's verdict.
    fn scan(entries: &[(&str, Option<&str>)]) -> std::result::Result<(), String> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(0);
            match link {
                Some(target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    b.append_link(&mut h, path, target).unwrap();
                }
                None => b.append_data(&mut h, path, std::io::empty()).unwrap(),
            }
        }
        let bytes = b.into_inner().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Layout::create(dir.path()).unwrap();
        let (digest, size) = store.write_blob(&bytes).unwrap();
        let desc = super::super::layout::descriptor(MediaType::ImageLayer, &digest, size);
        Layer {
            store,
            desc,
            diff_id: Some(digest.to_string()),
        }
        .scan()
    }

    #[test]
    fn an_entry_written_through_an_absolute_link_of_its_layer_is_refused() {
        let err = scan(&[("esc", Some("/tmp/outside")), ("esc/through", None)]).unwrap_err();
        assert!(
            err.contains("entry `esc/through` lies under symlink `esc` -> `/tmp/outside`"),
            "{err}"
        );
        assert!(err.contains("unpacker refuses"), "{err}");
        // Through a chain of relative links that ends in an absolute one.
        let err = scan(&[
            ("b", Some("/etc")),
            ("d/", None),
            ("d/a", Some("../b")),
            ("d/a/passwd", None),
        ])
        .unwrap_err();
        assert!(err.contains("symlink `b` -> `/etc`"), "{err}");
        // Relative links that stay inside the root are followed, as the unpacker follows them.
        scan(&[
            ("usr/", None),
            ("usr/lib/", None),
            ("lib", Some("usr/lib")),
            ("lib/x", None),
        ])
        .unwrap();
        // A link replaced by a directory no longer counts.
        scan(&[("esc", Some("/tmp")), ("esc/", None), ("esc/x", None)]).unwrap();
        // Loops end.
        let err = scan(&[("a", Some("b")), ("b", Some("a")), ("a/x", None)]).unwrap_err();
        assert!(err.contains("too many levels"), "{err}");
    }

    #[test]
    fn escaping_paths_are_found() {
        assert_eq!(depth_within(Path::new("etc/passwd")), Some(2));
        assert_eq!(depth_within(Path::new("../etc/passwd")), None);
        assert_eq!(depth_within(Path::new("/etc/passwd")), None);
        assert_eq!(depth_within(Path::new("a/../b")), Some(1));
    }

    /// An image of one gzip layer holding `etc/hello`, its config listing `diff_id`.
    fn one_layer_image(dir: &Path, diff_id: Option<&str>) -> Image {
        use std::io::Write;
        let store = Layout::create(dir).unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(6);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, "etc/hello", &b"hello\n"[..])
            .unwrap();
        let plain = tar.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&plain).unwrap();
        let (digest, size) = store.write_blob(&gz.finish().unwrap()).unwrap();
        let real = Digest::of(&plain).to_string();
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [diff_id.unwrap_or(&real)]},
        });
        let config = store.write_json(&config, MediaType::ImageConfig).unwrap();
        let manifest = oci_spec::image::ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(config)
            .layers(vec![super::super::layout::descriptor(
                MediaType::ImageLayerGzip,
                &digest,
                size,
            )])
            .build()
            .unwrap();
        let desc = store
            .write_json(&manifest, MediaType::ImageManifest)
            .unwrap();
        Image::in_layout(store, &desc, &Platform::host(), None).unwrap()
    }

    #[test]
    fn a_layer_reads_uncompressed_only_when_it_matches_its_diff_id() {
        let dir = tempfile::tempdir().unwrap();
        let image = one_layer_image(dir.path(), None);
        let layer = &image.layers()[0];
        let mut out = Vec::new();
        layer.uncompressed().unwrap().read_to_end(&mut out).unwrap();
        assert!(layer.scan().is_ok());

        let dir = tempfile::tempdir().unwrap();
        let wrong = format!("sha256:{}", "0".repeat(64));
        let image = one_layer_image(dir.path(), Some(&wrong));
        let layer = &image.layers()[0];
        let err = layer
            .uncompressed()
            .unwrap()
            .read_to_end(&mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("uncompressed"), "{err}");
        let err = layer.scan().unwrap_err();
        assert!(err.contains("but the config says"), "{err}");
    }

    #[test]
    fn platforms_parse_and_the_host_is_linux() {
        let p: Platform = "linux/arm64".parse().unwrap();
        assert_eq!(p.architecture, "arm64");
        assert!("linux".parse::<Platform>().is_err());
        assert!("linux/arm64/".parse::<Platform>().is_err());
        let v8: Platform = "linux/arm64/v8".parse().unwrap();
        assert_eq!(v8.to_string(), "linux/arm64/v8");
        assert!(v8.same_as(&p) && p.accepts(&v8) && v8.accepts(&p));
        assert!(v8.buildable().is_ok());
        let err = "linux/s390x".parse::<Platform>().unwrap().buildable();
        assert!(err.unwrap_err().contains("linux/amd64 and linux/arm64"));
        assert!(
            "linux/amd64/v3"
                .parse::<Platform>()
                .unwrap()
                .buildable()
                .is_err()
        );
        assert_eq!(Platform::host().os, "linux");
    }
}
