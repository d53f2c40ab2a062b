//! A layer cache kept in a registry (`build --cache-to`, `--cache-from`): one OCI artifact
//! under a tag, whose records map a layer's key (the name its inputs give it in the local
//! cache, the same on every machine) to the blob that holds it, with its diff ID, so that a
//! build on a machine with an empty cache names that blob in its manifest instead of
//! fetching the wheels, installing and compressing them again.
//!
//! The artifact is an image manifest of artifact type [`ARTIFACT_TYPE`] with the empty
//! config; its first layer is the records (JSON), the others are the side records (a wheel
//! layer's file list, gzip) and the layer blobs themselves, so the registry keeps every blob
//! a record names and a push to another repository of the same registry can mount them.
//! `skopeo inspect --raw` shows it, and `oras pull` fetches it (each blob is titled).
//!
//! A record is never believed on its word. Its key is looked up, not read: the build computes
//! each layer's key from its own inputs. The blob must be in the destination or mountable
//! there, and its digest and diff ID are checked on first use: a blob that the destination's
//! current image pairs with the same diff ID has been used there already; any other is read
//! once, hashed and decompressed, before the image names it. A record that fails is named,
//! and its layer is built.

use super::digest::Digest;
use super::layer::{BuiltLayer, Compression, RegistryLayers, Reuse};
use super::layout::{Layout, MAX_JSON_BYTES, canonical_json, descriptor, digest_of};
use super::referrers::{EMPTY_CONFIG, EMPTY_CONFIG_TYPE};
use super::registry::{Pulling, Remote, Session, declared_type, fetch_blob, upload};
use crate::error::{Error, Result};
use oci_client::Reference;
use oci_client::manifest::OciDescriptor;
use oci_spec::image::{Descriptor, MediaType};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;

/// The artifact type of a gpubake layer cache.
pub const ARTIFACT_TYPE: &str = "application/vnd.gpubake.layer-cache.v1";

/// The media type of its records.
const RECORDS_TYPE: &str = "application/vnd.gpubake.layer-cache.records.v1+json";

/// The media type of a side record: the layout record's bytes, gzip.
const SIDE_TYPE: &str = "application/vnd.gpubake.layer-cache.side.v1+gzip";

/// The largest side record accepted once inflated.
const MAX_SIDE_BYTES: u64 = 256 << 20;

const TITLE: &str = "org.opencontainers.image.title";

/// How many times `--cache-to` reads, merges and writes again when another build changed the
/// tag meanwhile.
const WRITE_ATTEMPTS: u32 = 8;

/// How long a write waits before it reads the tag back: longer than another build takes from
/// its read of the tag to its write (a few requests), so a write based on an older read has
/// landed by then.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// What the cache records, by layer key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Records {
    /// The format's version: 1.
    pub version: u32,
    /// Each layer by its key (the hex of its local record's name).
    pub layers: BTreeMap<String, Record>,
}

/// One layer as a build wrote it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The blob's digest.
    pub digest: String,
    /// Its size.
    pub size: u64,
    /// Its media type.
    pub media_type: String,
    /// The sha256 of its tar stream.
    #[serde(rename = "diffID")]
    pub diff_id: String,
    /// The compression it was written with (`--compression`).
    pub compression: String,
    /// Its descriptor's annotations (an eStargz layer's TOC digest).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The layout records that go with it (a wheel layer's file list), by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub side: BTreeMap<String, SideBlob>,
    /// An image in the cache's registry (`REPOSITORY@DIGEST`) that holds the layer: the one
    /// the recording build pushed. Its config vouches for the diff ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

impl Record {
    /// Whether `other` records the same layer: the same blob, tar stream, compression and
    /// annotations. Which image it names and the side records' packing may differ: two
    /// builds that write one layer at once each name their own image.
    fn same_layer(&self, other: &Record) -> bool {
        (
            &self.digest,
            self.size,
            &self.media_type,
            &self.diff_id,
            &self.compression,
            &self.annotations,
        ) == (
            &other.digest,
            other.size,
            &other.media_type,
            &other.diff_id,
            &other.compression,
            &other.annotations,
        ) && self.side.keys().eq(other.side.keys())
    }
}

/// A side record's blob: the record's bytes, gzip.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SideBlob {
    /// Its digest.
    pub digest: String,
    /// Its size.
    pub size: u64,
}

/// The key of a layer's local record name (`layers/HEX.json`).
fn key_of(record: &str) -> &str {
    record
        .strip_prefix("layers/")
        .and_then(|r| r.strip_suffix(".json"))
        .unwrap_or(record)
}

/// A registry repository the build reads records from, with what it holds.
struct Source {
    remote: Remote,
    reference: Reference,
    session: Session,
    records: Records,
}

/// The registry caches a build reads (`--cache-from`, in order) and the registry image it
/// writes, if any: what [`RegistryLayers::find`] needs.
pub struct RegistryCache {
    sources: Vec<Source>,
    destination: Option<(Reference, Session)>,
    /// Blob digest to diff ID, as the destination's current image pairs them.
    vouched: HashMap<String, String>,
    /// The same for each image records name, read when a record first names it.
    recorded_images: std::sync::Mutex<HashMap<String, HashMap<String, String>>>,
}

impl RegistryCache {
    /// Reads the records of every cache in `from` (a tag that holds none is an empty cache,
    /// said once) and, when the image goes to the registry `to`, how the image now under that
    /// tag pairs blobs and diff IDs.
    pub fn open(from: &[Remote], to: Option<&Remote>) -> Result<RegistryCache> {
        let mut sources = Vec::new();
        for remote in from {
            let reference = remote.parsed()?;
            let read = Session::open(remote, &reference).and_then(|session| {
                let records = session
                    .runtime
                    .block_on(read_records(&session, &reference))?;
                Ok((session, records))
            });
            let (session, records) = match read {
                Ok(read) => read,
                // A cache is a shortcut: one the registry cannot serve now leaves the layers
                // to the local cache and the build. What is not a cache is refused.
                Err(Error::Environment(why)) => {
                    eprintln!(
                        "warning: {why}; the layer cache is not read, and its layers are \
                         looked up locally or built"
                    );
                    continue;
                }
                Err(e) => return Err(e),
            };
            match &records {
                Some((r, _)) => eprintln!(
                    "layer cache docker://{}: {} layers recorded",
                    remote.reference,
                    r.layers.len()
                ),
                None => eprintln!(
                    "layer cache docker://{}: none there yet; every layer is looked up \
                     locally or built",
                    remote.reference
                ),
            }
            sources.push(Source {
                remote: remote.clone(),
                reference,
                session,
                records: records.map(|(r, _)| r).unwrap_or_default(),
            });
        }
        let (destination, vouched) = match to {
            Some(remote) => {
                let reference = remote.parsed()?;
                let session = Session::open(remote, &reference)?;
                let vouched = session.runtime.block_on(pairs_of(&session, &reference))?;
                (Some((reference, session)), vouched)
            }
            None => (None, HashMap::new()),
        };
        Ok(RegistryCache {
            sources,
            destination,
            vouched,
            recorded_images: Default::default(),
        })
    }

    /// The layer `record` names in `source`, checked; or why it cannot be used.
    fn take(
        &self,
        source: &Source,
        record: &Record,
        layout: &Layout,
        compression: Compression,
    ) -> std::result::Result<BuiltLayer, String> {
        if record.media_type != compression.media_type().to_string()
            || record.compression != compression.name()
        {
            return Err(format!(
                "it is a {} layer ({}) and this build writes {}",
                record.compression,
                record.media_type,
                compression.name()
            ));
        }
        let digest: Digest = record.digest.parse()?;
        let diff_id: Digest = record
            .diff_id
            .parse()
            .map_err(|e| format!("its diff ID: {e}"))?;
        let mut desc = descriptor(compression.media_type(), &digest, record.size);
        if !record.annotations.is_empty() {
            desc.set_annotations(Some(record.annotations.clone().into_iter().collect()));
        }
        // Where the image goes the blob must be, or be mountable there. Each session's
        // requests run on its own runtime, whose reactor its connections belong to.
        let in_destination = match &self.destination {
            Some((to, session)) => session.runtime.block_on(async {
                let has = session.has_blob(to, &digest, "reading the layer cache");
                if has.await.map_err(|e| e.to_string())? {
                    return Ok::<bool, String>(true);
                }
                let same_registry = to.resolve_registry() == source.reference.resolve_registry();
                Ok(same_registry
                    && matches!(
                        session.mount(to, &source.reference, &digest).await,
                        Ok(true)
                    ))
            })?,
            None => false,
        };
        let checked = self.vouches(source, record)?;
        if !(in_destination && checked) {
            // First use: the blob is read once (from the destination when it is there now,
            // else from the cache), checked against its digest, kept, and inflated to check
            // the diff ID.
            if !layout.has_blob(&digest, record.size) {
                let (session, from) = match &self.destination {
                    Some((to, session)) if in_destination => (session, to),
                    _ => (&source.session, &source.reference),
                };
                session
                    .runtime
                    .block_on(fetch_blob(
                        session,
                        from,
                        &desc,
                        layout,
                        Pulling::Digests,
                        None,
                    ))
                    .map_err(|e| e.to_string())?;
            }
            check_local(layout, &desc, &digest, &diff_id)?;
        }
        for (name, blob) in &record.side {
            let bytes = source
                .session
                .runtime
                .block_on(side_record(&source.session, &source.reference, blob))
                .map_err(|e| format!("its side record {name}: {e}"))?;
            layout
                .write_record(name, &bytes, false)
                .map_err(|e| e.to_string())?;
        }
        Ok(BuiltLayer {
            descriptor: desc,
            diff_id,
            from: Reuse::RegistryCache,
            record: None,
            side_records: record.side.keys().cloned().collect(),
            timing: None,
            placed: None,
        })
    }
}

impl RegistryCache {
    /// Whether an image already pairs the record's blob with its diff ID: the one under the
    /// destination's tag, else the one the record names. An image that pairs the blob with
    /// another diff ID is an error; one that does not hold it vouches for nothing.
    fn vouches(&self, source: &Source, record: &Record) -> std::result::Result<bool, String> {
        let contradicted = |whose: &str, paired: &str| {
            Err(format!(
                "it gives blob {} the diff ID {}, and {whose} pairs that blob with {paired}",
                record.digest, record.diff_id
            ))
        };
        match self.vouched.get(&record.digest) {
            Some(paired) if *paired == record.diff_id => return Ok(true),
            Some(paired) => return contradicted("the destination's image", paired),
            None => {}
        }
        let Some(image) = &record.image else {
            return Ok(false);
        };
        let mut images = self
            .recorded_images
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !images.contains_key(image) {
            let pairs = match image.split_once('@') {
                Some((repository, digest)) => {
                    let reference = Reference::with_digest(
                        source.reference.registry().to_string(),
                        repository.to_string(),
                        digest.to_string(),
                    );
                    let s = &source.session;
                    s.runtime
                        .block_on(pairs_of(s, &reference))
                        .map_err(|e| e.to_string())?
                }
                None => HashMap::new(),
            };
            images.insert(image.clone(), pairs);
        }
        match images[image].get(&record.digest) {
            Some(paired) if *paired == record.diff_id => Ok(true),
            Some(paired) => contradicted(&format!("the image it names ({image})"), paired),
            None => Ok(false),
        }
    }
}

impl RegistryLayers for RegistryCache {
    fn find(&self, layout: &Layout, record: &str, compression: Compression) -> Option<BuiltLayer> {
        let key = key_of(record);
        for source in &self.sources {
            let Some(found) = source.records.layers.get(key) else {
                continue;
            };
            match self.take(source, found, layout, compression) {
                Ok(layer) => return Some(layer),
                Err(why) => eprintln!(
                    "warning: layer cache docker://{}: the record of layer {} is not used: \
                     {why}; the layer is built instead",
                    source.remote.reference,
                    &key[..key.len().min(12)]
                ),
            }
        }
        None
    }
}

/// Checks a blob the layout holds against the diff ID a record gives it, by inflating it.
fn check_local(
    layout: &Layout,
    desc: &Descriptor,
    digest: &Digest,
    diff_id: &Digest,
) -> std::result::Result<(), String> {
    let blob = layout
        .open_blob(digest, Some(desc.size()))
        .map_err(|e| e.to_string())?;
    let mut tar = super::model::decompressor(desc.media_type(), blob)
        .map_err(|e| format!("blob {digest}: {e}"))?;
    let (mut hashed, tally) = super::digest::HashingWriter::new(std::io::sink());
    std::io::copy(&mut tar, &mut hashed).map_err(|e| format!("blob {digest}: {e}"))?;
    let got = tally.finish().0;
    if got != *diff_id {
        return Err(format!(
            "its blob {digest} holds a tar stream of {got}, and the record gives the diff ID \
             {diff_id}"
        ));
    }
    Ok(())
}

/// The records under `reference`'s tag and the manifest's digest; None when the tag is not
/// there. Anything else under it is refused, naming it.
async fn read_records(s: &Session, reference: &Reference) -> Result<Option<(Records, Digest)>> {
    let Some((bytes, digest)) = s.manifest(reference, "reading the layer cache").await? else {
        return Ok(None);
    };
    let tag = reference.tag().unwrap_or("latest");
    let not_ours = |why: String| {
        Error::image(
            &s.what,
            format!("tag {tag} is not a gpubake layer cache ({ARTIFACT_TYPE}): {why}"),
        )
    };
    let manifest: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| not_ours(e.to_string()))?;
    if manifest["artifactType"] != ARTIFACT_TYPE {
        return Err(not_ours(match manifest["artifactType"].as_str() {
            Some(other) => format!("its artifact type is {other}"),
            None => "it holds an image, or another artifact without a type".into(),
        }));
    }
    let first = &manifest["layers"][0];
    if first["mediaType"] != RECORDS_TYPE {
        return Err(not_ours("its first blob is not the records".into()));
    }
    let wanted = OciDescriptor {
        digest: first["digest"].as_str().unwrap_or_default().to_string(),
        size: first["size"].as_i64().unwrap_or(-1),
        media_type: RECORDS_TYPE.into(),
        ..OciDescriptor::default()
    };
    let body = s
        .small_blob(reference, &wanted, "reading the layer cache")
        .await
        .map_err(|e| Error::image(&s.what, format!("layer cache {tag}: {e}")))?;
    let records: Records = serde_json::from_slice(&body)
        .map_err(|e| Error::image(&s.what, format!("layer cache {tag}: its records: {e}")))?;
    if records.version != 1 {
        return Err(not_ours(format!(
            "records of version {}, and this gpubake reads version 1",
            records.version
        )));
    }
    Ok(Some((
        records,
        digest.parse().map_err(|e: String| not_ours(e))?,
    )))
}

/// How the image under `reference`'s tag pairs its layers' blobs with diff IDs, every
/// platform of an index; empty when the tag is not there or holds no image.
async fn pairs_of(s: &Session, reference: &Reference) -> Result<HashMap<String, String>> {
    let mut pairs = HashMap::new();
    let Some((bytes, _)) = s
        .manifest(reference, "reading the destination's image")
        .await?
    else {
        return Ok(pairs);
    };
    let mut manifests = vec![bytes.clone()];
    if super::registry::is_index(&declared_type(&bytes)) {
        let index: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        manifests.clear();
        for entry in index["manifests"].as_array().into_iter().flatten() {
            let Some(digest) = entry["digest"].as_str() else {
                continue;
            };
            let child = reference.clone_with_digest(digest.to_string());
            if let Some((bytes, _)) = s
                .manifest(&child, "reading the destination's image")
                .await?
            {
                manifests.push(bytes);
            }
        }
    }
    for bytes in manifests {
        let Ok(manifest) = serde_json::from_slice::<oci_spec::image::ImageManifest>(&bytes) else {
            continue;
        };
        let wanted = super::registry::wanted(manifest.config());
        let Ok(config) = s
            .small_blob(reference, &wanted, "reading the destination's image")
            .await
        else {
            continue;
        };
        let config: serde_json::Value = serde_json::from_slice(&config).unwrap_or_default();
        let diff_ids = config["rootfs"]["diff_ids"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if diff_ids.len() != manifest.layers().len() {
            continue;
        }
        for (layer, diff_id) in manifest.layers().iter().zip(diff_ids) {
            if let Some(diff_id) = diff_id.as_str() {
                pairs.insert(layer.digest().to_string(), diff_id.to_string());
            }
        }
    }
    Ok(pairs)
}

/// A side record's bytes: its gzip blob, checked against its digest and inflated.
async fn side_record(
    s: &Session,
    reference: &Reference,
    blob: &SideBlob,
) -> std::result::Result<Vec<u8>, String> {
    let wanted = OciDescriptor {
        digest: blob.digest.clone(),
        size: i64::try_from(blob.size.min(MAX_JSON_BYTES)).unwrap_or(0),
        media_type: SIDE_TYPE.into(),
        ..OciDescriptor::default()
    };
    let packed = s
        .small_blob(reference, &wanted, "reading the layer cache")
        .await?;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(packed.as_slice())
        .take(MAX_SIDE_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("blob {}: {e}", blob.digest))?;
    if out.len() as u64 > MAX_SIDE_BYTES {
        return Err(format!(
            "blob {} inflates past {MAX_SIDE_BYTES} bytes",
            blob.digest
        ));
    }
    Ok(out)
}

/// The record of `layer` as written in `layout`, with its side records packed; None for a
/// layer that no cache keeps.
fn record_of(
    layer: &BuiltLayer,
    compression: Compression,
    layout: &Layout,
    image: Option<&String>,
) -> Option<(String, Record, Vec<Vec<u8>>)> {
    let key = key_of(layer.record.as_deref()?).to_string();
    let mut side = BTreeMap::new();
    let mut blobs = Vec::new();
    for name in &layer.side_records {
        let bytes = layout.read_record(name)?;
        let mut packed = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut packed, &bytes).ok()?;
        let packed = packed.finish().ok()?;
        side.insert(
            name.clone(),
            SideBlob {
                digest: Digest::of(&packed).to_string(),
                size: packed.len() as u64,
            },
        );
        blobs.push(packed);
    }
    let record = Record {
        digest: layer.descriptor.digest().to_string(),
        size: layer.descriptor.size(),
        media_type: layer.descriptor.media_type().to_string(),
        diff_id: layer.diff_id.to_string(),
        compression: compression.name().to_string(),
        annotations: layer
            .descriptor
            .annotations()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        side,
        image: image.cloned(),
    };
    Some((key, record, blobs))
}

/// What `--cache-to` wrote.
#[derive(Debug)]
pub struct Written {
    /// Records the cache now holds.
    pub layers: usize,
    /// Of this build's layers, those recorded.
    pub recorded: usize,
    /// The artifact's manifest digest.
    pub digest: Digest,
}

/// A build's layers, for `--cache-to`.
pub struct Recorded<'a> {
    /// The layers.
    pub layers: Vec<&'a BuiltLayer>,
    /// Their compression.
    pub compression: Compression,
    /// The layout they were written into (or their blobs fetched into).
    pub layout: &'a Layout,
    /// The image the build pushed, when it went to a registry: its repository holds every
    /// layer blob, and on the cache's registry the records name it.
    pub pushed: Option<(&'a Remote, Digest)>,
    /// Other repositories that may hold the blobs (the caches the build read).
    pub mounts: Vec<&'a Remote>,
}

/// Records the layers of `recorded` in the cache `to`, merged with what is there: each
/// layer's blob is put in the cache's repository (mounted from a repository of the same
/// registry that holds it, or uploaded from the layout), then the records. Another build that
/// writes the tag meanwhile is not overwritten: the tag is read back, and while it lacks this
/// build's records they are merged into it and written again.
pub fn write(to: &Remote, recorded: &Recorded) -> Result<Written> {
    let reference = to.tagged("--cache-to names")?;
    let (compression, layout) = (recorded.compression, recorded.layout);
    let same_registry = |r: &Reference| r.resolve_registry() == reference.resolve_registry();
    let pushed = recorded
        .pushed
        .as_ref()
        .and_then(|(remote, digest)| Some((remote.parsed().ok()?, digest)))
        .filter(|(r, _)| same_registry(r));
    let image = pushed
        .as_ref()
        .map(|(r, digest)| format!("{}@{digest}", r.repository()));
    let s = Session::open(to, &reference)?;
    let mut ours = Records {
        version: 1,
        layers: BTreeMap::new(),
    };
    let mut sides: Vec<Vec<u8>> = Vec::new();
    let mut layer_blobs: Vec<Descriptor> = Vec::new();
    let mounts: Vec<Reference> = pushed
        .iter()
        .map(|(r, _)| r.clone())
        .chain(recorded.mounts.iter().filter_map(|r| r.parsed().ok()))
        .filter(same_registry)
        .collect();
    s.runtime.block_on(async {
        super::registry::log_in_to_push(&s, &reference).await?;
        for layer in &recorded.layers {
            let Some((key, record, side)) = record_of(layer, compression, layout, image.as_ref())
            else {
                continue;
            };
            let digest = digest_of(&layer.descriptor)?;
            let mut there = s
                .has_blob(&reference, &digest, "writing the layer cache")
                .await?;
            for from in &mounts {
                if there {
                    break;
                }
                there = matches!(s.mount(&reference, from, &digest).await, Ok(true));
            }
            if !there && layout.has_blob(&digest, layer.descriptor.size()) {
                let diff_id = Some(layer.diff_id.to_string());
                upload(&s, layout, &reference, &layer.descriptor, &digest, diff_id).await?;
                there = true;
            }
            if !there {
                eprintln!(
                    "warning: layer cache docker://{}: blob {digest} is neither here nor in a \
                     repository it can be mounted from; its layer is not recorded",
                    to.reference
                );
                continue;
            }
            ours.layers.insert(key, record);
            sides.extend(side);
            layer_blobs.push(layer.descriptor.clone());
        }
        for bytes in std::iter::once(EMPTY_CONFIG.to_vec()).chain(sides.iter().cloned()) {
            s.push_small(&reference, &bytes, "writing the layer cache")
                .await?;
        }
        // Registries have no conditional write of a tag, so another build may write it
        // between this one's read and write: the tag is read again just before the write (a
        // change is merged first), and after it, once writes that read before it have had
        // time to land, until it holds this build's records.
        let mut wrote = false;
        for _ in 0..WRITE_ATTEMPTS {
            let (mut merged, read) = match read_records(&s, &reference).await? {
                Some((records, digest)) => (records, Some(digest)),
                None => (Records::default(), None),
            };
            let holds_ours = |merged: &Records| {
                ours.layers
                    .iter()
                    .all(|(k, r)| merged.layers.get(k).is_some_and(|m| m.same_layer(r)))
            };
            if let Some(digest) = read.as_ref().filter(|_| holds_ours(&merged)) {
                if wrote {
                    tokio::time::sleep(SETTLE).await;
                    match read_records(&s, &reference).await? {
                        Some((later, _)) if !holds_ours(&later) => continue,
                        _ => {}
                    }
                }
                return Ok(Written {
                    layers: merged.layers.len(),
                    recorded: ours.layers.len(),
                    digest: digest.clone(),
                });
            }
            merged.version = 1;
            // A record of the same layer stays as it is (another build's image vouches as
            // well as this one's); a missing or different one is this build's.
            for (key, record) in &ours.layers {
                if !merged.layers.get(key).is_some_and(|m| m.same_layer(record)) {
                    merged.layers.insert(key.clone(), record.clone());
                }
            }
            let manifest = artifact(&s, &reference, &merged, &layer_blobs).await?;
            let now = s.manifest(&reference, "writing the layer cache").await?;
            if now.map(|(_, d)| d) != read.as_ref().map(Digest::to_string) {
                continue;
            }
            let content_type = reqwest::header::HeaderValue::from_static(
                "application/vnd.oci.image.manifest.v1+json",
            );
            s.client
                .push_manifest_raw(&reference, manifest, content_type)
                .await
                .map_err(|e| s.failed("writing the layer cache", e))?;
            wrote = true;
        }
        Err(Error::Environment(format!(
            "{}: the layer cache's tag changed under every one of {WRITE_ATTEMPTS} writes; \
             this build's records are not in it",
            s.what
        )))
    })
}

/// The artifact's manifest for `records`: the records, their side records and every layer
/// blob they name (`known` gives the descriptors of this build's; the others' are made from
/// their records). The records blob is pushed here.
async fn artifact(
    s: &Session,
    reference: &Reference,
    records: &Records,
    known: &[Descriptor],
) -> Result<Vec<u8>> {
    let body = canonical_json(records);
    s.push_small(reference, &body, "writing the layer cache")
        .await?;
    let titled = |media_type: &str, digest: &str, size: u64, title: String| {
        serde_json::json!({
            "mediaType": media_type, "digest": digest, "size": size,
            "annotations": {TITLE: title},
        })
    };
    let mut blobs = vec![titled(
        RECORDS_TYPE,
        Digest::of(&body).as_str(),
        body.len() as u64,
        "records.json".into(),
    )];
    let mut seen = std::collections::HashSet::new();
    for (key, record) in &records.layers {
        for (name, blob) in &record.side {
            if seen.insert(blob.digest.clone()) {
                let title = format!("{key}-{}.gz", name.replace('/', "-"));
                blobs.push(titled(SIDE_TYPE, &blob.digest, blob.size, title));
            }
        }
    }
    for (key, record) in &records.layers {
        if !seen.insert(record.digest.clone()) {
            continue;
        }
        let size = known
            .iter()
            .find(|d| d.digest().to_string() == record.digest)
            .map_or(record.size, Descriptor::size);
        blobs.push(titled(
            &record.media_type,
            &record.digest,
            size,
            format!("{key}.layer"),
        ));
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MediaType::ImageManifest.to_string(),
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_CONFIG_TYPE, "digest": Digest::of(EMPTY_CONFIG).as_str(), "size": EMPTY_CONFIG.len()},
        "layers": blobs,
    });
    Ok(canonical_json(&manifest))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records' JSON is a format other builds (and versions) read: its field names and
    /// shape are fixed, and a record read back is the record written.
    #[test]
    fn records_keep_their_format() {
        let mut records = Records {
            version: 1,
            layers: BTreeMap::new(),
        };
        records.layers.insert(
            "ab".repeat(32),
            Record {
                digest: format!("sha256:{}", "1".repeat(64)),
                size: 42,
                media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                diff_id: format!("sha256:{}", "2".repeat(64)),
                compression: "gzip".into(),
                annotations: BTreeMap::new(),
                side: BTreeMap::from([(
                    "stack/x.json".to_string(),
                    SideBlob {
                        digest: format!("sha256:{}", "3".repeat(64)),
                        size: 7,
                    },
                )]),
                image: Some(format!("team/app@sha256:{}", "4".repeat(64))),
            },
        );
        let text = String::from_utf8(canonical_json(&records)).unwrap();
        for field in [
            "\"version\":1",
            "\"diffID\":",
            "\"mediaType\":",
            "\"compression\":\"gzip\"",
            "\"side\":{\"stack/x.json\":{\"digest\":",
            "\"image\":\"team/app@sha256:",
        ] {
            assert!(text.contains(field), "{field}: {text}");
        }
        assert!(
            !text.contains("annotations"),
            "empty maps are left out: {text}"
        );
        let back: Records = serde_json::from_str(&text).unwrap();
        assert_eq!(back, records);
    }

    /// Two builds that record one layer at once name their own images: the same layer, or
    /// each would find the other's write dropping its record and write again, forever.
    #[test]
    fn records_of_one_layer_from_two_builds_are_the_same_layer() {
        let record = |image: &str, diff: char| Record {
            digest: format!("sha256:{}", "1".repeat(64)),
            size: 42,
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            diff_id: format!("sha256:{}", diff.to_string().repeat(64)),
            compression: "gzip".into(),
            annotations: BTreeMap::new(),
            side: BTreeMap::new(),
            image: Some(format!("team/app@sha256:{}", image.repeat(64))),
        };
        assert!(record("a", '2').same_layer(&record("b", '2')));
        assert!(!record("a", '2').same_layer(&record("a", '3')));
    }

    #[test]
    fn a_layer_is_keyed_by_its_record_name() {
        assert_eq!(key_of("layers/abc.json"), "abc");
        assert_eq!(key_of("abc"), "abc");
    }
}
