//! New layers, written reproducibly: entries sorted, parent directories included, owner
//! root, mtimes set to one epoch, modes normalised, fixed compression settings. The tar
//! stream is hashed (diff ID) and compressed on every core while it is written, and the
//! compressed stream is hashed (digest) on its way to disk; nothing is held in memory.
//!
//! A layer whose inputs are unchanged (same paths, modes and contents) is found in the
//! layout's cache, or in a registry's (see [`super::layercache`]), and not written again.

use super::digest::{Digest, HashingWriter};
use super::layout::{Adopted, Layout, descriptor};
use super::stream::EngineStream;
use crate::error::{Error, Result};
use oci_spec::image::{Descriptor, MediaType};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;

/// How layers are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// gzip (parallel, pigz-style blocks): what every runtime reads.
    Gzip,
    /// zstd (multi-threaded): smaller and faster; containerd 1.5+, Docker 23+, podman.
    Zstd,
    /// eStargz: gzip with a table of contents, which the stargz snapshotter pulls lazily,
    /// chunk by chunk, and every other runtime reads as gzip.
    Estargz,
    /// zstd:chunked: zstd frames with the same table of contents, which the stargz
    /// snapshotter pulls lazily and decodes four to five times faster than eStargz; every
    /// other runtime reads it as zstd (containerd 1.5+, Docker 23+, podman).
    #[value(name = "zstd:chunked")]
    #[serde(rename = "zstd:chunked")]
    ZstdChunked,
    /// No compression: the blob is the layer's tar (the README's torch image: 7.1 GB of
    /// blobs against gzip's 4.3 GB), with nothing to decode: for a network fast enough that a
    /// node waits on unpacking, not on the pull. Every runtime reads it.
    Uncompressed,
}

impl Compression {
    /// The OCI media type of a layer compressed this way.
    pub fn media_type(self) -> MediaType {
        match self {
            Compression::Gzip | Compression::Estargz => MediaType::ImageLayerGzip,
            Compression::Zstd | Compression::ZstdChunked => MediaType::ImageLayerZstd,
            Compression::Uncompressed => MediaType::ImageLayer,
        }
    }

    /// How a layer written this way carries a table of contents for lazy pulling; None for
    /// a plain stream.
    pub fn toc(self) -> Option<super::estargz::TocFormat> {
        match self {
            Compression::Estargz => Some(super::estargz::TocFormat::Estargz),
            Compression::ZstdChunked => Some(super::estargz::TocFormat::ZstdChunked),
            Compression::Gzip | Compression::Zstd | Compression::Uncompressed => None,
        }
    }

    /// The name users give it (`--compression`).
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
            Compression::Estargz => "estargz",
            Compression::ZstdChunked => "zstd:chunked",
            Compression::Uncompressed => "uncompressed",
        }
    }

    /// The fixed level: speed over the last few percent of size, the same on every machine.
    /// Gzip's 1 is libdeflate's level 1: on text 1.4 times as fast as zlib's level 1 and 5%
    /// smaller (zlib-ng's level 1 is faster still, but 40% larger); zstd's 3 is its default.
    fn level(self) -> u32 {
        match self {
            Compression::Gzip | Compression::Estargz => 1,
            Compression::Zstd | Compression::ZstdChunked => 3,
            Compression::Uncompressed => 0,
        }
    }
}

/// Where a new file's bytes come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Bytes in memory (generated files).
    Bytes(Vec<u8>),
    /// A file on disk, streamed.
    File(PathBuf),
    /// A symbolic link to this target.
    Symlink(String),
    /// A directory.
    Dir,
    /// A member of a zip archive (a wheel), streamed out of the archive and checked against
    /// the sha256 its RECORD gives, so a tampered wheel fails the layer, naming the file.
    Zip(ZipMember),
}

/// One file inside a zip archive.
#[derive(Clone, Debug)]
pub struct ZipMember {
    /// The archive on disk.
    pub archive: PathBuf,
    /// The member's index in the archive's central directory.
    pub index: usize,
    /// Its uncompressed size.
    pub size: u64,
    /// The sha256 it must have (raw bytes); None for the few files RECORD lists without one.
    pub sha256: Option<[u8; 32]>,
    /// Its name inside the archive, for errors.
    pub name: String,
}

/// One entry of a new layer.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Path inside the image, relative (`etc/nccl.conf`).
    pub path: String,
    /// Permission bits.
    pub mode: u32,
    /// The owning user and group ids.
    pub owner: Owner,
    /// Content.
    pub source: Source,
}

/// Who owns an entry: numeric ids, as a layer's tar holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Owner {
    /// The user id.
    pub uid: u32,
    /// The group id.
    pub gid: u32,
}

/// root:root, what every entry but a few of the OS layer's has.
pub const ROOT: Owner = Owner { uid: 0, gid: 0 };

/// What a layer holds and how the history should describe it.
#[derive(Clone, Debug)]
pub struct LayerSpec {
    /// Short name: `files`, `probe`, `presets`.
    pub name: String,
    /// What made it, for the image history.
    pub created_by: String,
    /// The entries; parents are added and order is fixed by the writer.
    pub entries: Vec<Entry>,
    /// The order a job's start-up reads the image in, for an eStargz layer; none: the
    /// snapshotter prefetches nothing of it.
    pub prefetch: Option<Arc<Prefetch>>,
}

/// Which files of an image a job's start-up reads, as image paths (`opt/...`) in the order
/// it first touched them. An eStargz layer holds its `fetched` files first, then
/// `.prefetch.landmark`, so the stargz snapshotter fetches them, and only them, before the
/// container starts; its `lazy` files follow the landmark, read on demand and first in the
/// background fetch; the rest follows in path order. A layer holding no `fetched` file
/// leads with `.no.prefetch.landmark`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prefetch {
    /// Read in full or in large part: prefetched whole.
    pub fetched: Vec<String>,
    /// Read in small part (a large library whose few pages were mapped): left to be read on
    /// demand.
    pub lazy: Vec<String>,
}

impl Prefetch {
    /// What a layer cache key must cover of it.
    pub fn key(&self) -> String {
        let mut h = Sha256::new();
        for (kind, paths) in [("fetched", &self.fetched), ("lazy", &self.lazy)] {
            h.update(format!("{kind} {}\n", paths.len()));
            for p in paths {
                h.update(format!("{p}\n"));
            }
        }
        hex::encode(h.finalize())
    }

    /// `entries` (with their parents, as [`complete`] gives them) in the order an eStargz
    /// layer holds them, and how many go before the landmark (none: no entry is fetched).
    /// Each entry's parents come before it.
    fn order(&self, entries: &[Entry]) -> (Vec<Entry>, Option<usize>) {
        let all = complete(entries);
        let index: std::collections::HashMap<&str, usize> = all
            .iter()
            .enumerate()
            .map(|(i, e)| (e.path.as_str(), i))
            .collect();
        let mut taken = vec![false; all.len()];
        let mut order = Vec::with_capacity(all.len());
        let mut take = |path: &str, order: &mut Vec<usize>| {
            let Some(&at) = index.get(path) else { return };
            let mut chain: Vec<usize> = Path::new(path)
                .ancestors()
                .filter_map(|a| index.get(a.to_str()?).copied())
                .collect();
            chain.reverse();
            debug_assert_eq!(chain.last(), Some(&at));
            for i in chain {
                if !std::mem::replace(&mut taken[i], true) {
                    order.push(i);
                }
            }
        };
        for path in &self.fetched {
            take(path, &mut order);
        }
        let landmark = (!order.is_empty()).then_some(order.len());
        for path in &self.lazy {
            take(path, &mut order);
        }
        let mut rest: Vec<usize> = (0..all.len()).filter(|&i| !taken[i]).collect();
        order.append(&mut rest);
        let mut slots: Vec<Option<Entry>> = all.into_iter().map(Some).collect();
        let ordered = order
            .into_iter()
            .map(|i| slots[i].take().expect("each entry once"))
            .collect();
        (ordered, landmark)
    }
}

/// A layer in the layout.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BuiltLayer {
    /// Its descriptor in the manifest.
    pub descriptor: Descriptor,
    /// sha256 of the uncompressed tar.
    pub diff_id: Digest,
    /// Where it came from: written now, or found in a cache.
    #[serde(skip)]
    pub from: Reuse,
    /// The record it is cached under (see [`Target::record_name`]); None for a layer no cache
    /// keeps (streamed to an engine).
    #[serde(skip)]
    pub record: Option<String>,
    /// The layout's other records that belong with it (a wheel layer's file list), which a
    /// registry cache keeps beside it.
    #[serde(skip)]
    pub side_records: Vec<String>,
    /// Where the time went, for a layer written now.
    #[serde(skip)]
    pub timing: Option<LayerTiming>,
    /// How its blob went between the layout and gpubake's layer cache (to the cache for a
    /// layer written now, from it for one found there); None where it did not.
    #[serde(skip)]
    pub placed: Option<crate::fsutil::Placement>,
}

impl BuiltLayer {
    /// A layer written now.
    fn written(descriptor: Descriptor, diff_id: Digest, timing: LayerTiming) -> BuiltLayer {
        BuiltLayer {
            descriptor,
            diff_id,
            from: Reuse::Written,
            record: None,
            side_records: Vec::new(),
            timing: Some(timing),
            placed: None,
        }
    }

    /// Taken from a cache rather than written now.
    pub fn reused(&self) -> bool {
        self.from != Reuse::Written
    }
}

/// Where a layer of a build came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reuse {
    /// Written by this build.
    #[default]
    Written,
    /// Found in the local layer cache (or the engine held it).
    LocalCache,
    /// Found in a registry's layer cache (`--cache-from`), its blob left in the registry.
    RegistryCache,
}

/// Layers recorded in a registry (`build --cache-from`), asked for a layer the layout's own
/// cache lacks. Implemented by [`super::layercache::RegistryCache`].
pub trait RegistryLayers: Sync {
    /// The layer recorded under `record` (a [`Target::record_name`]), checked and ready to be
    /// named by the image's manifest; its side records are written into `layout`. None when
    /// no record names it or the one that does fails a check (said on standard error).
    fn find(&self, layout: &Layout, record: &str, compression: Compression) -> Option<BuiltLayer>;
}

/// Where a build's layers go and what may hold them already.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// The layout the layers are written into, whose cache is asked first.
    pub layout: &'a Layout,
    /// Their compression.
    pub compression: Compression,
    /// Every timestamp in them.
    pub epoch: u64,
    /// Whether a layer made before from the same inputs may be taken instead.
    pub use_cache: bool,
    /// The engine the layers stream to instead, when it is the destination.
    pub engine: Option<&'a EngineStream>,
    /// A registry's layer cache, asked when the layout's cache has no layer.
    pub registry: Option<&'a dyn RegistryLayers>,
}

impl<'a> Target<'a> {
    /// Into `layout`, with no engine and no registry cache.
    pub fn layout(
        layout: &'a Layout,
        compression: Compression,
        epoch: u64,
        use_cache: bool,
    ) -> Self {
        Target {
            layout,
            compression,
            epoch,
            use_cache,
            engine: None,
            registry: None,
        }
    }

    /// The name a layer of inputs `key` is cached under: the same on every machine for the
    /// same inputs, compression, epoch and encoder, so a registry cache can key by it too.
    pub fn record_name(&self, key: &str) -> String {
        record_name(key, self.compression, self.epoch)
    }

    /// The layer of inputs `key`, from the layout's cache or else the registry's; None when
    /// neither holds it or the cache may not be used.
    pub fn lookup(&self, key: &str) -> Option<BuiltLayer> {
        if !self.use_cache {
            return None;
        }
        let record = self.record_name(key);
        cached(self.layout, &record)
            .or_else(|| self.registry?.find(self.layout, &record, self.compression))
            .map(|mut hit| {
                hit.record = Some(record);
                hit
            })
    }
}

/// Where the time of writing one layer went. The stages run at once on threads of their
/// own, so each is the CPU time its threads used: the wall time is about the largest of
/// them when one stage holds the others up, and less than their sum when they overlap.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LayerTiming {
    /// Seconds from the first entry to the committed blob.
    pub wall_s: f64,
    /// CPU seconds making the tar stream: reading and inflating wheel members, checking
    /// them against RECORD, tar framing.
    pub install_s: f64,
    /// CPU seconds compressing.
    pub compress_s: f64,
    /// CPU seconds hashing the uncompressed stream (the diff ID).
    pub hash_s: f64,
    /// CPU seconds hashing the compressed stream (the digest) and writing it out.
    pub write_s: f64,
    /// Bytes of the uncompressed tar stream.
    pub tar_bytes: u64,
}

/// Builds `spec` into `layout`, or finds it in the cache unless `use_cache` is false.
pub fn build_layer(
    layout: &Layout,
    spec: &LayerSpec,
    compression: Compression,
    epoch: u64,
    use_cache: bool,
) -> Result<BuiltLayer> {
    build_layer_to(&Target::layout(layout, compression, epoch, use_cache), spec)
}

/// [`build_layer`] into `sink` (see [`build_keyed_to`]), keyed by its entries.
pub fn build_layer_to(sink: &Target, spec: &LayerSpec) -> Result<BuiltLayer> {
    let key = cache_key(spec)?;
    build_keyed_to(sink, &key, || Ok(spec.clone()))
}

/// Builds the layer `make` describes into `sink`, unless a cache holds one under `key`: the
/// layout's, else the registry's. For layers whose inputs are known by digest before they are
/// opened (wheels by their sha256), so a cached layer needs neither the wheel nor reading
/// it. `key` must cover everything the content depends on; compression and epoch are added
/// here. With an engine, the layer goes to the engine instead, as the next layer of the image
/// it loads: left out where the engine holds it (its diff ID known from an earlier build's
/// record), else made and streamed there as a plain tar, hashed on the way, never compressed
/// and never stored. Its descriptor is then the tar's own (digest and diff ID one).
pub fn build_keyed_to(
    sink: &Target,
    key: &str,
    make: impl FnOnce() -> Result<LayerSpec>,
) -> Result<BuiltLayer> {
    let layout = sink.layout;
    let Some(engine) = sink.engine else {
        if let Some(hit) = sink.lookup(key) {
            return Ok(hit);
        }
        let record = sink.record_name(key);
        let mut built = write_layer(layout, &make()?, sink.compression, sink.epoch)?;
        let bytes = serde_json::to_vec(&built).expect("layers serialize");
        layout.write_record(&record, &bytes, false)?;
        let digest = super::layout::digest_of(&built.descriptor)?;
        built.placed = layout.share_blob(&digest, built.descriptor.size());
        built.record = Some(record);
        return Ok(built);
    };
    let record = streamed_record_name(key, sink.epoch);
    if sink.use_cache
        && let Some(mut hit) = streamed(layout, key, sink.epoch)
        && engine.skip_if_present(&hit.diff_id)
    {
        hit.from = Reuse::LocalCache;
        return Ok(hit);
    }
    let built = stream_layer(engine, &make()?, sink.epoch, &layout.root().join("blobs"))?;
    let bytes = serde_json::to_vec(&built).expect("layers serialize");
    layout.write_record(&record, &bytes, false)?;
    Ok(built)
}

/// What an earlier build streamed to an engine under `key`: its diff ID and size.
pub fn streamed(layout: &Layout, key: &str, epoch: u64) -> Option<BuiltLayer> {
    let bytes = layout.read_record(&streamed_record_name(key, epoch))?;
    serde_json::from_slice(&bytes).ok()
}

fn streamed_record_name(key: &str, epoch: u64) -> String {
    let full = hex::encode(Sha256::digest(format!("{key}\ntar {epoch}")));
    format!("streamed/{full}.json")
}

/// Streams `spec` to `engine` as its next layer, a plain tar of the size [`tar_size`] says.
fn stream_layer(
    engine: &EngineStream,
    spec: &LayerSpec,
    epoch: u64,
    at: &Path,
) -> Result<BuiltLayer> {
    let started = std::time::Instant::now();
    let cpu_before = crate::units::thread_cpu_seconds();
    let size = tar_size(&spec.entries)?;
    let diff_id = engine.layer(size, |out| {
        let (hashed, tally) = HashingWriter::new(out);
        write_tar(&spec.entries, epoch, hashed, at)?;
        Ok(tally.finish().0)
    })?;
    Ok(BuiltLayer::written(
        descriptor(MediaType::ImageLayer, &diff_id, size),
        diff_id,
        LayerTiming {
            wall_s: started.elapsed().as_secs_f64(),
            install_s: crate::units::thread_cpu_seconds() - cpu_before,
            tar_bytes: size,
            ..LayerTiming::default()
        },
    ))
}

/// The exact length of the tar stream [`write_tar`] writes for `entries`, known before any
/// member is read: the tar writer's own headers (long names and link targets take extension
/// blocks) for each entry with no data, each entry's data padded to 512 bytes, and the two
/// zero blocks that end the archive.
pub fn tar_size(entries: &[Entry]) -> Result<u64> {
    let at = Path::new("the layer's tar headers");
    let io_err = |e: io::Error| Error::io(at, e);
    let mut tar = tar::Builder::new(CountingSink(0));
    let mut data = 0u64;
    for entry in complete(entries) {
        let len = match &entry.source {
            Source::Bytes(bytes) => bytes.len() as u64,
            Source::File(path) => std::fs::metadata(path)
                .map_err(|e| Error::reading(path, e))?
                .len(),
            Source::Zip(member) => member.size,
            Source::Symlink(_) | Source::Dir => 0,
        };
        data += len.div_ceil(512) * 512;
        let mut h = header(&entry, 0, 0);
        match &entry.source {
            Source::Symlink(target) => tar.append_link(&mut h, &entry.path, target),
            Source::Dir => tar.append_data(&mut h, format!("{}/", entry.path), io::empty()),
            _ => tar.append_data(&mut h, &entry.path, io::empty()),
        }
        .map_err(io_err)?;
    }
    let counted = tar.into_inner().map_err(io_err)?;
    Ok(counted.0 + data)
}

/// Names the encoder's output format: a record written by another encoder would hand back a
/// blob with other bytes for the same content, and the digest would depend on the cache.
const ENCODER: &str = "libdeflate-1 blocks of 1 MiB, stored random pieces; zstd-3 mt";

/// The record of a layer, under the layout's `.gpubake/`.
fn record_name(key: &str, compression: Compression, epoch: u64) -> String {
    let framing = match compression {
        Compression::Estargz => super::estargz::FRAMING,
        Compression::ZstdChunked => "; zstd:chunked frames of 1 MiB blocks",
        Compression::Gzip | Compression::Zstd | Compression::Uncompressed => "",
    };
    let full = hex::encode(Sha256::digest(format!(
        "{key}\n{compression:?} {epoch}\n{ENCODER}{framing}"
    )));
    format!("layers/{full}.json")
}

/// A cache record whose blob is in the layout, or in its cache and now linked here.
fn cached(layout: &Layout, record: &str) -> Option<BuiltLayer> {
    let bytes = layout.read_record(record)?;
    let mut hit = serde_json::from_slice::<BuiltLayer>(&bytes).ok()?;
    let digest = super::layout::digest_of(&hit.descriptor).ok()?;
    if let Adopted::Placed(how) = layout.adopt_blob(&digest, hit.descriptor.size())? {
        hit.placed = Some(how);
    }
    hit.from = Reuse::LocalCache;
    Some(hit)
}

/// Identifies a layer's inputs by content: paths, modes, owners, and the sha256 of every
/// file's bytes, so the same inputs give the same key on any machine (a registry cache keys
/// by it), whatever their paths and dates on this one.
fn cache_key(spec: &LayerSpec) -> Result<String> {
    let mut h = Sha256::new();
    h.update("gpubake-layer-v3\n");
    if let Some(prefetch) = &spec.prefetch {
        h.update(format!("prefetch {}\n", prefetch.key()));
    }
    for e in &spec.entries {
        h.update(format!("{} {:o} ", e.path, e.mode));
        if e.owner != ROOT {
            h.update(format!("{}:{} ", e.owner.uid, e.owner.gid));
        }
        match &e.source {
            Source::Bytes(b) => h.update(Sha256::digest(b)),
            Source::File(p) => h.update(format!("file {}", file_sha256(p)?)),
            Source::Symlink(t) => h.update(format!("link {t}")),
            Source::Dir => h.update("dir"),
            Source::Zip(m) => h.update(format!("zip {} {}", file_sha256(&m.archive)?, m.index)),
        }
        h.update("\n");
    }
    Ok(hex::encode(h.finalize()))
}

/// The sha256 of a file's bytes, streamed.
fn file_sha256(path: &Path) -> Result<String> {
    let (mut hashed, tally) = HashingWriter::new(io::sink());
    let mut file = File::open(path).map_err(|e| Error::reading(path, e))?;
    io::copy(&mut file, &mut hashed).map_err(|e| Error::reading(path, e))?;
    Ok(tally.finish().0.hex().to_string())
}

/// The entries plus every parent directory, sorted by path.
fn complete(entries: &[Entry]) -> Vec<Entry> {
    let mut all: BTreeMap<String, Entry> = BTreeMap::new();
    for e in entries {
        let mut parent = Path::new(&e.path).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            let key = p.to_string_lossy().into_owned();
            all.entry(key.clone()).or_insert(Entry {
                path: key,
                mode: 0o755,
                owner: ROOT,
                source: Source::Dir,
            });
            parent = p.parent();
        }
        all.insert(e.path.clone(), e.clone());
    }
    all.into_values().collect()
}

/// The tar stream goes to the compressor in blocks of this size, cut at fixed offsets: the gzip
/// output depends on where blocks start, so they must not move with the sizes of the tar
/// writer's writes or with the number of threads.
const BLOCK: usize = 1 << 20;

/// Gzip blocks are judged compressible or not in pieces of this size.
const PIECE: usize = 64 << 10;

/// How many blocks may wait for each of the hashing and the writer threads: enough to keep
/// the compressors busy while those catch up, few enough to bound memory (a block each).
const QUEUE: usize = 8;

/// What the writer thread receives, in stream order.
enum Chunk {
    /// Compressed bytes, hashed (the blob digest) and written.
    Packed(Vec<u8>),
    /// Compressed bytes that a gzip worker is still making.
    Pending(mpsc::Receiver<Vec<u8>>),
    /// Asks for the blob offset reached here: where the next gzip member begins.
    Mark(mpsc::SyncSender<u64>),
}

/// A block of the tar stream, shared by the hashing thread and a compressor.
type Block = Arc<Vec<u8>>;

/// A block for a worker and where its compressed bytes go.
type Job = (Block, mpsc::SyncSender<Vec<u8>>);

/// Spent buffers, kept for the next blocks: a fresh megabyte costs 256 page faults (plus,
/// for libdeflate's output, zeroing), a few percent of the whole layer's time.
#[derive(Clone, Default)]
struct Pool(Arc<Mutex<Vec<Vec<u8>>>>);

impl Pool {
    /// An empty buffer with room for `len` bytes.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut buf = self
            .0
            .lock()
            .ok()
            .and_then(|mut p| p.pop())
            .unwrap_or_default();
        buf.clear();
        buf.reserve(len);
        buf
    }

    fn give(&self, buf: Vec<u8>) {
        // As many as the queues between threads can hold; more would only sit there.
        if let Ok(mut pool) = self.0.lock()
            && pool.len() < 4 * QUEUE
        {
            pool.push(buf);
        }
    }

    /// Takes back a block once its last user is done with it.
    fn give_block(&self, block: Block) {
        if let Some(buf) = Arc::into_inner(block) {
            self.give(buf);
        }
    }
}

enum Kind {
    /// Each block compressed on its own by a worker: gzip members, or for zstd:chunked one
    /// zstd frame per block, which any zstd reader takes as one stream.
    Blocks {
        jobs: Option<mpsc::SyncSender<Job>>,
        workers: Vec<thread::JoinHandle<()>>,
    },
    Zstd(Option<zstd::stream::write::Encoder<'static, ChunkWriter>>),
    /// Blocks go to the writer as they are: an uncompressed layer.
    Plain,
}

/// The compressor between the tar stream and the blob file. Work is spread so that on a
/// small machine no core waits on another's: the caller's thread only cuts the tar stream into
/// blocks (and, for zstd, hands them to zstd's own workers); gzip blocks are compressed on
/// worker threads; one thread hashes the uncompressed blocks (diff ID), and one writer thread
/// hashes the compressed stream (blob digest, in the blob writer) and writes the file.
/// SHA-256 runs at about 1.3 GB/s a core, so in line with the tar stream or the compressor
/// it would hold them up; on threads of their own the two hashes run while they wait.
///
/// Gzip output is a series of gzip members, one or a few per block, which gzip readers take
/// as one stream (RFC 1952, section 2.2; Go's reader, used by docker, containerd, skopeo and
/// umoci, reads them by default; eStargz layers are built the same way). Members are
/// independent, which is what lets libdeflate, which has no streaming interface, compress
/// them in parallel. flate2's `GzDecoder` reads only the first member: use `MultiGzDecoder`.
struct Encoder {
    compression: Compression,
    block: Vec<u8>,
    /// Whether a block went out yet: an empty stream still needs one gzip member.
    sent: bool,
    kind: Kind,
    pool: Pool,
    to_hasher: Option<mpsc::SyncSender<Block>>,
    hasher: Option<thread::JoinHandle<(Digest, f64)>>,
    to_writer: Option<mpsc::SyncSender<Chunk>>,
    writer: Option<thread::JoinHandle<(io::Result<()>, f64)>>,
    /// CPU seconds the block workers have used, added as each one ends.
    worker_cpu: Arc<Mutex<f64>>,
}

/// What the encoder's threads did once it finished.
struct Finished {
    diff_id: Digest,
    hash_s: f64,
    write_s: f64,
    /// The block workers' CPU seconds (0 for an uncompressed layer); None for zstd, whose
    /// threads are its own.
    blocks_s: Option<f64>,
}

impl Encoder {
    /// Starts the threads; `threads` compress (the output is the same for any count).
    fn new(
        compression: Compression,
        out: HashingWriter<BufWriter<File>>,
        threads: usize,
    ) -> io::Result<Self> {
        let threads = threads.max(1);
        let pool = Pool::default();
        let (to_hasher, blocks) = mpsc::sync_channel(QUEUE);
        let hasher = thread::Builder::new().name("layer-hash".into()).spawn({
            let pool = pool.clone();
            move || {
                let diff_id = hash_all(blocks, &pool);
                (diff_id, crate::units::thread_cpu_seconds())
            }
        })?;
        let (to_writer, chunks) = mpsc::sync_channel(QUEUE);
        let writer = thread::Builder::new().name("layer-writer".into()).spawn({
            let pool = pool.clone();
            move || {
                let written = drain(chunks, out, &pool);
                (written, crate::units::thread_cpu_seconds())
            }
        })?;
        let worker_cpu = Arc::new(Mutex::new(0.0));
        let kind = match compression {
            Compression::Gzip | Compression::Estargz | Compression::ZstdChunked => {
                let (jobs, queue) = mpsc::sync_channel::<Job>(threads);
                let queue = Arc::new(Mutex::new(queue));
                let workers = (0..threads)
                    .map(|i| {
                        let (queue, pool) = (queue.clone(), pool.clone());
                        let cpu = worker_cpu.clone();
                        thread::Builder::new()
                            .name(format!("compress-{i}"))
                            .spawn(move || {
                                block_worker(&queue, &pool, compression);
                                if let Ok(mut total) = cpu.lock() {
                                    *total += crate::units::thread_cpu_seconds();
                                }
                            })
                    })
                    .collect::<io::Result<_>>()?;
                Kind::Blocks {
                    jobs: Some(jobs),
                    workers,
                }
            }
            Compression::Zstd => {
                let sink = ChunkWriter {
                    buf: pool.take(BLOCK),
                    pool: pool.clone(),
                    to_writer: to_writer.clone(),
                };
                let mut enc = zstd::stream::write::Encoder::new(sink, compression.level() as i32)?;
                // Multi-threaded zstd output is the same for any worker count >= 1, and
                // differs from single-threaded output, so there is always at least one.
                enc.multithread(threads as u32)?;
                Kind::Zstd(Some(enc))
            }
            Compression::Uncompressed => Kind::Plain,
        };
        Ok(Encoder {
            compression,
            block: Vec::with_capacity(BLOCK),
            sent: false,
            kind,
            pool,
            to_hasher: Some(to_hasher),
            hasher: Some(hasher),
            to_writer: Some(to_writer),
            writer: Some(writer),
            worker_cpu,
        })
    }

    /// Hands the current block to the compressor and the writer.
    fn send_block(&mut self) -> io::Result<()> {
        let block = Arc::new(std::mem::replace(&mut self.block, self.pool.take(BLOCK)));
        self.sent = true;
        self.hash(block.clone());
        let to_writer = self.to_writer.as_ref().expect("not finished");
        let sent = match &mut self.kind {
            Kind::Blocks { jobs, .. } => {
                let (done, pending) = mpsc::sync_channel(1);
                // The writer learns of the block before a worker gets it, so it always waits
                // on blocks in stream order.
                to_writer.send(Chunk::Pending(pending)).is_ok()
                    && jobs
                        .as_ref()
                        .expect("not finished")
                        .send((block, done))
                        .is_ok()
            }
            Kind::Plain => {
                let mut bytes = self.pool.take(block.len());
                bytes.extend_from_slice(&block);
                self.pool.give_block(block);
                to_writer.send(Chunk::Packed(bytes)).is_ok()
            }
            Kind::Zstd(enc) => match enc.as_mut().expect("not finished").write_all(&block) {
                Ok(()) => {
                    self.pool.give_block(block);
                    true
                }
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => false,
                Err(e) => return Err(e),
            },
        };
        if sent {
            Ok(())
        } else {
            Err(self.writer_error())
        }
    }

    /// Sends the block filled so far, so that what follows starts a gzip member of its own.
    fn end_block(&mut self) -> io::Result<()> {
        if self.block.is_empty() {
            return Ok(());
        }
        self.send_block()
    }

    /// Hands bytes of the stream to the diff ID's hasher.
    fn hash(&mut self, block: Block) {
        let hashing = self.to_hasher.as_ref().expect("not finished").send(block);
        if hashing.is_err() {
            // The hasher cannot fail but by a panic; pass it on.
            if let Some(Err(panic)) = self.hasher.take().map(thread::JoinHandle::join) {
                std::panic::resume_unwind(panic);
            }
        }
    }

    /// Hands the writer thread something to write in stream order, bypassing the
    /// compressors and the diff ID.
    fn send_to_writer(&mut self, chunk: Chunk) -> io::Result<()> {
        let sent = self
            .to_writer
            .as_ref()
            .expect("not finished")
            .send(chunk)
            .is_ok();
        if sent {
            Ok(())
        } else {
            Err(self.writer_error())
        }
    }

    /// The error that stopped the writer thread, which has hung up.
    fn writer_error(&mut self) -> io::Error {
        match self.writer.take().map(thread::JoinHandle::join) {
            Some(Ok((Err(e), _))) => e,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            _ => io::Error::other("the layer writer stopped"),
        }
    }

    /// Ends the stream, waits for every thread and flushes the file; returns the diff ID
    /// and what each thread cost.
    fn finish(mut self) -> io::Result<Finished> {
        let (blocks, plain) = (
            matches!(self.kind, Kind::Blocks { .. }),
            matches!(self.kind, Kind::Plain),
        );
        if !self.block.is_empty() || !self.sent {
            self.send_block()?;
        }
        match &mut self.kind {
            Kind::Blocks { jobs, workers } => {
                drop(jobs.take());
                for worker in workers.drain(..) {
                    if let Err(panic) = worker.join() {
                        std::panic::resume_unwind(panic);
                    }
                }
            }
            Kind::Plain => {}
            Kind::Zstd(enc) => {
                let ended = enc
                    .take()
                    .expect("finished once")
                    .finish()
                    .and_then(|mut sink| sink.flush());
                if let Err(e) = ended {
                    return Err(if e.kind() == io::ErrorKind::BrokenPipe {
                        self.writer_error()
                    } else {
                        e
                    });
                }
            }
        }
        drop(self.to_writer.take());
        let write_s = match self.writer.take().map(thread::JoinHandle::join) {
            Some(Ok((result, cpu))) => result.map(|()| cpu)?,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => return Err(io::Error::other("the layer writer stopped")),
        };
        drop(self.to_hasher.take());
        let (diff_id, hash_s) = match self.hasher.take().map(thread::JoinHandle::join) {
            Some(Ok(hashed)) => hashed,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => return Err(io::Error::other("the layer hasher stopped")),
        };
        let blocks_s = if plain {
            Some(0.0)
        } else {
            blocks.then(|| self.worker_cpu.lock().map(|t| *t).unwrap_or(0.0))
        };
        Ok(Finished {
            diff_id,
            hash_s,
            write_s,
            blocks_s,
        })
    }
}

impl Drop for Encoder {
    /// A layer abandoned half-way (a source file vanished) stops its threads before the
    /// temporary blob is removed, rather than leaving them compressing into a deleted file.
    fn drop(&mut self) {
        match &mut self.kind {
            Kind::Blocks { jobs, workers } => {
                drop(jobs.take());
                for worker in workers.drain(..) {
                    let _ = worker.join();
                }
            }
            Kind::Zstd(enc) => drop(enc.take()),
            Kind::Plain => {}
        }
        drop(self.to_writer.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        drop(self.to_hasher.take());
        if let Some(hasher) = self.hasher.take() {
            let _ = hasher.join();
        }
    }
}

impl Write for Encoder {
    fn write(&mut self, mut buf: &[u8]) -> io::Result<usize> {
        let n = buf.len();
        while !buf.is_empty() {
            let take = (BLOCK - self.block.len()).min(buf.len());
            self.block.extend_from_slice(&buf[..take]);
            buf = &buf[take..];
            if self.block.len() == BLOCK {
                self.send_block()?;
            }
        }
        Ok(n)
    }

    /// Does nothing: a block cut short by a flush would change the output. Everything
    /// reaches the file in [`Encoder::finish`].
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl super::estargz::Members for Encoder {
    fn cut(&mut self) -> io::Result<mpsc::Receiver<u64>> {
        self.end_block()?;
        let (asked, offset) = mpsc::sync_channel(1);
        self.send_to_writer(Chunk::Mark(asked))?;
        Ok(offset)
    }

    /// Compressed on this thread, as one member: the workers split a block where its bytes
    /// turn random-looking, and blocks are at most [`BLOCK`] long.
    fn whole_member(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.end_block()?;
        self.sent = true;
        self.hash(Arc::new(bytes.to_vec()));
        if matches!(self.kind, Kind::Zstd(_)) {
            return Err(io::Error::other(
                "a member of its own in a streamed zstd layer",
            ));
        }
        let mut packed = Vec::new();
        BlockCompressor::new(self.compression).whole(bytes, &mut packed);
        self.send_to_writer(Chunk::Packed(packed))
    }

    fn append_raw(&mut self, bytes: Vec<u8>) -> io::Result<()> {
        self.end_block()?;
        self.sent = true;
        self.send_to_writer(Chunk::Packed(bytes))
    }
}

/// The hashing thread: the diff ID of the uncompressed stream, once the encoder hangs up.
fn hash_all(blocks: mpsc::Receiver<Block>, pool: &Pool) -> Digest {
    let (mut diff, tally) = HashingWriter::new(io::sink());
    for block in blocks {
        diff.write_all(&block).expect("a sink takes everything");
        pool.give_block(block);
    }
    tally.finish().0
}

/// The writer thread: writes the compressed stream (hashed by `out`) in order until the
/// encoder hangs up.
fn drain(
    chunks: mpsc::Receiver<Chunk>,
    mut out: HashingWriter<BufWriter<File>>,
    pool: &Pool,
) -> io::Result<()> {
    let mut unsynced = 0;
    let mut offset = 0u64;
    for chunk in chunks {
        let bytes = match chunk {
            Chunk::Mark(asked) => {
                // The asker may be gone after an error of its own; it reports that.
                let _ = asked.send(offset);
                continue;
            }
            Chunk::Packed(bytes) => bytes,
            Chunk::Pending(pending) => pending
                .recv()
                .map_err(|_| io::Error::other("a gzip worker stopped"))?,
        };
        out.write_all(&bytes)?;
        offset += bytes.len() as u64;
        unsynced += bytes.len();
        pool.give(bytes);
        if unsynced >= WRITEBACK {
            start_writeback(out.get_ref().get_ref());
            unsynced = 0;
        }
    }
    out.flush()
}

/// Compressed bytes written between two calls to [`start_writeback`].
const WRITEBACK: usize = 16 << 20;

/// Starts writing the file's dirty pages to disk without waiting for them. The blob is
/// synced before it is renamed into place; a gigabyte-sized blob otherwise sits in the page
/// cache (below the kernel's dirty limits on a machine with some memory) and that final
/// sync waits for all of it, 0.6 to 0.9 s a gigabyte here, with the compressors done and
/// idle. Started as it is written, the writing overlaps the compression.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open (borrowed from a live File) for the whole call, and
    // sync_file_range neither keeps it nor touches memory. Failure only loses the head start;
    // the sync before the rename reports any error.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File) {}

/// Collects zstd's output into large chunks for the writer thread.
struct ChunkWriter {
    buf: Vec<u8>,
    pool: Pool,
    to_writer: mpsc::SyncSender<Chunk>,
}

impl ChunkWriter {
    fn send(&mut self) -> io::Result<()> {
        let bytes = std::mem::replace(&mut self.buf, self.pool.take(BLOCK));
        self.to_writer
            .send(Chunk::Packed(bytes))
            // BrokenPipe tells the encoder to fetch the writer's own error.
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the layer writer stopped"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= BLOCK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            self.send()
        }
    }
}

/// A gzip worker: compresses blocks from the queue until it closes.
fn block_worker(queue: &Mutex<mpsc::Receiver<Job>>, pool: &Pool, compression: Compression) {
    let mut compressor = BlockCompressor::new(compression);
    loop {
        // The lock is held only while waiting for a job, never while compressing.
        let job = queue.lock().map(|q| q.recv());
        let Ok(Ok((block, done))) = job else { return };
        let mut out = pool.take(block.len() + block.len() / 64 + 64);
        compressor.compress(&block, &mut out);
        pool.give_block(block);
        // The writer may have stopped on an error; it reports that itself.
        let _ = done.send(out);
    }
}

/// What a block worker turns blocks into.
enum BlockCompressor {
    Gzip(GzipBlocks),
    /// One zstd frame per block, at a fixed level: the same bytes on every machine.
    Zstd(zstd::bulk::Compressor<'static>),
}

impl BlockCompressor {
    fn new(compression: Compression) -> Self {
        let level = compression.level() as i32;
        match compression {
            Compression::ZstdChunked | Compression::Zstd => BlockCompressor::Zstd(
                zstd::bulk::Compressor::new(level).expect("zstd takes its default level"),
            ),
            Compression::Gzip | Compression::Estargz => {
                BlockCompressor::Gzip(GzipBlocks::new(level))
            }
            Compression::Uncompressed => {
                unreachable!("an uncompressed layer's blocks go to the writer as they are")
            }
        }
    }

    /// Writes `block`, compressed, into the empty `out`.
    fn compress(&mut self, block: &[u8], out: &mut Vec<u8>) {
        match self {
            BlockCompressor::Gzip(gzip) => gzip.compress(block, out),
            BlockCompressor::Zstd(_) => self.whole(block, out),
        }
    }

    /// Writes `bytes`, however long, into the empty `out` as one gzip member or zstd frame.
    fn whole(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        debug_assert!(out.is_empty());
        match self {
            BlockCompressor::Gzip(gzip) => gzip.member(bytes, false, out),
            BlockCompressor::Zstd(zstd) => {
                out.reserve(zstd::zstd_safe::compress_bound(bytes.len()));
                zstd.compress_to_buffer(bytes, out)
                    .expect("the output has zstd's bound of room");
            }
        }
    }
}

/// Turns blocks into gzip members: each run of random-looking pieces stored, each other run
/// compressed.
struct GzipBlocks {
    stored: libdeflater::Compressor,
    packed: libdeflater::Compressor,
    /// libdeflate's output space, zeroed once rather than for every member.
    scratch: Vec<u8>,
}

impl GzipBlocks {
    fn new(level: i32) -> Self {
        let lvl = |l| libdeflater::CompressionLvl::new(l).expect("a libdeflate level");
        GzipBlocks {
            stored: libdeflater::Compressor::new(lvl(0)),
            packed: libdeflater::Compressor::new(lvl(level)),
            scratch: Vec::new(),
        }
    }

    /// Appends `block` to `out` as one or more gzip members (one for an empty block).
    fn compress(&mut self, block: &[u8], out: &mut Vec<u8>) {
        let random: Vec<bool> = block.chunks(PIECE).map(looks_random).collect();
        let mut start = 0;
        while start < random.len() {
            let end = (start..random.len())
                .find(|&i| random[i] != random[start])
                .unwrap_or(random.len());
            let run = &block[start * PIECE..(end * PIECE).min(block.len())];
            self.member(run, random[start], out);
            start = end;
        }
        if block.is_empty() {
            self.member(block, false, out);
        }
    }

    fn member(&mut self, data: &[u8], store: bool, out: &mut Vec<u8>) {
        let compressor = if store {
            &mut self.stored
        } else {
            &mut self.packed
        };
        let bound = compressor.gzip_compress_bound(data.len());
        if self.scratch.len() < bound {
            self.scratch.resize(bound, 0);
        }
        let n = compressor
            .gzip_compress(data, &mut self.scratch)
            .expect("the output has libdeflate's bound");
        out.extend_from_slice(&self.scratch[..n]);
    }
}

/// Whether deflate would save (almost) nothing on `piece`: true for random or already
/// compressed bytes, which are then stored as they are. Compressors crawl on such data
/// (libdeflate level 1: 85 MB/s on random bytes, 200 MB/s on text) to save nothing, and
/// CUDA and PyTorch libraries carry a good deal of it.
///
/// Deflate saves by repeats (LZ77) and by uneven byte frequencies (Huffman); the piece is
/// judged random only when a quick scan finds few repeats and its bytes are spread so
/// evenly that Huffman codes could not save 0.3%. Measured against compressing every piece
/// at level 1: on system libraries and binaries this stores 0.002% more bytes, on already
/// compressed files (.gz, .zip, .crate) 0.3% more.
///
/// Only integer arithmetic decides, so the verdict, and the blob, is the same on every
/// machine.
fn looks_random(piece: &[u8]) -> bool {
    few_repeats(piece) && spread_evenly(piece)
}

/// A greedy LZ scan that skips ahead ever faster while it finds nothing (as snappy and zstd's
/// fast levels do), so a random piece costs about 2,000 probes; true when repeats cover
/// under 1/32 of the piece.
fn few_repeats(piece: &[u8]) -> bool {
    const HASH_BITS: u32 = 12;
    // Deflate's window: repeats further back cannot be used.
    const WINDOW: usize = 32 << 10;
    let mut table = [0u32; 1 << HASH_BITS];
    let limit = piece.len() / 32;
    let mut covered = 0;
    let mut misses = 0;
    let mut i = 0;
    while i + 4 <= piece.len() {
        let word = u32::from_le_bytes(piece[i..i + 4].try_into().expect("four bytes"));
        let slot = (word.wrapping_mul(0x9e37_79b1) >> (32 - HASH_BITS)) as usize;
        // Positions are stored plus one, so zero means empty.
        let seen = table[slot] as usize;
        table[slot] = i as u32 + 1;
        if seen > 0 && i - (seen - 1) <= WINDOW && piece[seen - 1..seen + 3] == piece[i..i + 4] {
            let len = piece[seen - 1..]
                .iter()
                .zip(&piece[i..])
                .take_while(|(a, b)| a == b)
                .count();
            covered += len;
            if covered > limit {
                return false;
            }
            i += len;
            misses = 0;
        } else {
            misses += 1;
            i += 1 + (misses >> 5);
        }
    }
    true
}

/// Whether four 4 KiB samples spread over the piece have their bytes spread evenly over
/// the 256 values: Pearson's chi-squared against the uniform spread at most n/32, which
/// bounds what Huffman codes could save to about 0.022 bits a byte. Random bytes give 255 on
/// average, with a spread of 23, against the bound of 512 for n = 16384. (Counting the whole
/// piece would cost more than the rest of the test.) The samples are contiguous, so data
/// with a byte-lane pattern, like float arrays, is seen whole.
fn spread_evenly(piece: &[u8]) -> bool {
    const SAMPLE: usize = 4 << 10;
    // Four tables, so consecutive equal bytes do not wait on each other's increment.
    let mut counts = [[0u32; 256]; 4];
    let mut n = 0u64;
    let stride = (piece.len() / 4).max(SAMPLE);
    for start in (0..piece.len()).step_by(stride) {
        let sample = &piece[start..(start + SAMPLE).min(piece.len())];
        let mut quads = sample.chunks_exact(4);
        for q in &mut quads {
            counts[0][q[0] as usize] += 1;
            counts[1][q[1] as usize] += 1;
            counts[2][q[2] as usize] += 1;
            counts[3][q[3] as usize] += 1;
        }
        for &b in quads.remainder() {
            counts[0][b as usize] += 1;
        }
        n += sample.len() as u64;
    }
    let squares: u64 = (0..256)
        .map(|b| counts.iter().map(|c| u64::from(c[b])).sum::<u64>().pow(2))
        .sum();
    // X^2 = 256 * squares / n - n <= n / 32, without division.
    32 * 256 * squares <= 33 * n * n
}

fn header(entry: &Entry, size: u64, epoch: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mtime(epoch);
    h.set_uid(entry.owner.uid.into());
    h.set_gid(entry.owner.gid.into());
    h.set_mode(entry.mode);
    h.set_size(size);
    h.set_entry_type(match entry.source {
        Source::Dir => tar::EntryType::Directory,
        Source::Symlink(_) => tar::EntryType::Symlink,
        _ => tar::EntryType::Regular,
    });
    h
}

/// Counts what is written to it, and drops it.
struct CountingSink(u64);

impl Write for CountingSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Counts bytes into the layer's progress on their way to the compressor.
struct Counting<'a, W> {
    inner: W,
    progress: &'a crate::progress::Progress,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.progress.inc(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The progress of writing a layer: shown for large layers only (a bar on a terminal, else a
/// line every few seconds); every layer's counts its tar bytes.
fn layer_progress(spec: &LayerSpec) -> crate::progress::Progress {
    let total: u64 = spec
        .entries
        .iter()
        .map(|e| match &e.source {
            Source::Bytes(b) => b.len() as u64,
            Source::File(p) => std::fs::metadata(p).map(|m| m.len()).unwrap_or(0),
            Source::Zip(m) => m.size,
            _ => 0,
        })
        .sum();
    let label = format!("layer {}", spec.name);
    if total < 64 << 20 {
        return crate::progress::Progress::silent(label);
    }
    crate::progress::Progress::new(label, crate::progress::Unit::Bytes, Some(total))
}

/// Writes the entries, with their parent directories and in path order, as one tar stream
/// (the layer's content before compression). `at` names the destination in I/O errors.
pub fn write_tar<W: Write>(entries: &[Entry], epoch: u64, out: W, at: &Path) -> Result<W> {
    let mut tar = tar::Builder::new(out);
    append_entries(&mut tar, entries, epoch, at)?;
    tar.into_inner().map_err(|e| Error::writing(at, e))
}

/// Writes the entries as files under `root`, as the layer would hold them (parents, modes,
/// mtimes; wheel members checked against RECORD on the way): the tar stream is unpacked as
/// it is written.
pub fn materialize(entries: Vec<Entry>, epoch: u64, root: &Path) -> Result<()> {
    let (reader, writer) = io::pipe().map_err(|e| Error::io(root, e))?;
    let at = root.to_path_buf();
    let producer = thread::spawn(move || write_tar(&entries, epoch, writer, &at).map(drop));
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    let unpacked = archive.unpack(root).map_err(|e| Error::writing(root, e));
    drop(archive);
    let produced = match producer.join() {
        Ok(produced) => produced,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    // A wheel that fails its check ends the stream early: its error says why, not the
    // truncated stream's. Otherwise an unpacking error (and the writer's broken pipe after
    // it) is the unpacking error.
    match (produced, unpacked) {
        (Err(e @ Error::Wheel { .. }), _) | (_, Err(e)) | (Err(e), Ok(())) => Err(e),
        (Ok(()), Ok(())) => Ok(()),
    }
}

fn append_entries<W: Write>(
    tar: &mut tar::Builder<W>,
    entries: &[Entry],
    epoch: u64,
    at: &Path,
) -> Result<()> {
    append_list(tar, &complete(entries), epoch, at, &mut Archives::default())
}

/// Appends `entries` as they are: ordered, parents included.
fn append_list<W: Write>(
    tar: &mut tar::Builder<W>,
    entries: &[Entry],
    epoch: u64,
    at: &Path,
    archives: &mut Archives,
) -> Result<()> {
    let io_err = |e: io::Error| Error::writing(at, e);
    for entry in entries {
        match &entry.source {
            Source::Bytes(bytes) => {
                let mut h = header(entry, bytes.len() as u64, epoch);
                tar.append_data(&mut h, &entry.path, bytes.as_slice())
                    .map_err(io_err)?;
            }
            Source::File(path) => {
                let file = File::open(path).map_err(|e| Error::reading(path, e))?;
                let len = file.metadata().map_err(|e| Error::reading(path, e))?.len();
                let mut h = header(entry, len, epoch);
                // A file that changes size while it is read would corrupt the tar; `take`
                // and the size check below catch it.
                let mut reader = io::Read::take(file, len);
                // Reading the source cannot fill a disk: a full disk here is the layer's
                // destination, whichever write of the encoder's threads first found it.
                tar.append_data(&mut h, &entry.path, &mut reader)
                    .map_err(|e| Error::copying(path, at, e))?;
            }
            Source::Symlink(target) => {
                let mut h = header(entry, 0, epoch);
                tar.append_link(&mut h, &entry.path, target)
                    .map_err(io_err)?;
            }
            Source::Dir => {
                let mut h = header(entry, 0, epoch);
                tar.append_data(&mut h, format!("{}/", entry.path), io::empty())
                    .map_err(io_err)?;
            }
            Source::Zip(member) => {
                let mut h = header(entry, member.size, epoch);
                archives.append(tar, &mut h, &entry.path, member, at)?;
            }
        }
    }
    Ok(())
}

fn write_layer(
    layout: &Layout,
    spec: &LayerSpec,
    compression: Compression,
    epoch: u64,
) -> Result<BuiltLayer> {
    let threads = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    write_layer_on(layout, spec, compression, epoch, threads)
}

/// [`write_layer`] with `threads` compressing; the blob is the same for any count.
fn write_layer_on(
    layout: &Layout,
    spec: &LayerSpec,
    compression: Compression,
    epoch: u64,
    threads: usize,
) -> Result<BuiltLayer> {
    let started = std::time::Instant::now();
    let cpu_before = crate::units::process_cpu_seconds();
    let mut blob = layout.blob_writer()?;
    let blobs = layout.root().join("blobs");
    let io_err = |e: io::Error| Error::writing(&blobs, e);
    let encoder = Encoder::new(compression, blob.take_writer(), threads).map_err(io_err)?;
    let (entries, landmark) = match (&spec.prefetch, compression.toc()) {
        (Some(prefetch), Some(_)) => prefetch.order(&spec.entries),
        _ => (complete(&spec.entries), None),
    };
    let sink = match (compression.toc(), landmark) {
        (Some(format), Some(_)) => {
            Sink::Estargz(super::estargz::Writer::prefetching(encoder, format))
        }
        (Some(format), None) => {
            Sink::Estargz(super::estargz::Writer::new(encoder, format).map_err(io_err)?)
        }
        (None, _) => Sink::Plain(encoder),
    };
    let progress = layer_progress(spec);
    let mut tar = tar::Builder::new(Counting {
        inner: sink,
        progress: &progress,
    });
    let install_before = crate::units::thread_cpu_seconds();
    let mut archives = Archives::default();
    let (first, rest) = entries.split_at(landmark.unwrap_or(0));
    append_list(&mut tar, first, epoch, &blobs, &mut archives)?;
    if let Sink::Estargz(writer) = &mut tar.get_mut().inner
        && landmark.is_some()
    {
        writer.landmark().map_err(io_err)?;
    }
    append_list(&mut tar, rest, epoch, &blobs, &mut archives)?;
    let sink = tar.into_inner().map_err(io_err)?.inner;
    let install_s = crate::units::thread_cpu_seconds() - install_before;
    let tar_bytes = progress.done();
    progress.finish();
    let (encoder, toc) = match sink {
        Sink::Plain(encoder) => (encoder, None),
        Sink::Estargz(writer) => {
            let (encoder, toc) = writer.finish().map_err(io_err)?;
            (encoder, Some(toc))
        }
    };
    let done = encoder.finish().map_err(io_err)?;
    let (digest, size) = blob.commit()?;
    // zstd's workers are its own threads: they are what the process used beyond the rest.
    let compress_s = done.blocks_s.unwrap_or_else(|| {
        let all = crate::units::process_cpu_seconds() - cpu_before;
        (all - install_s - done.hash_s - done.write_s).max(0.0)
    });
    let descriptor = lazy_descriptor(compression, &digest, size, toc.as_ref());
    Ok(BuiltLayer::written(
        descriptor,
        done.diff_id,
        LayerTiming {
            wall_s: started.elapsed().as_secs_f64(),
            install_s,
            compress_s,
            hash_s: done.hash_s,
            write_s: done.write_s,
            tar_bytes,
        },
    ))
}

/// A layer's descriptor: with a TOC (eStargz, zstd:chunked), the annotations the stargz
/// snapshotter and containers/storage read of it.
fn lazy_descriptor(
    compression: Compression,
    digest: &Digest,
    size: u64,
    toc: Option<&super::estargz::Toc>,
) -> Descriptor {
    let mut d = descriptor(compression.media_type(), digest, size);
    if let Some(toc) = toc {
        d.set_annotations(Some(toc.annotations()));
    }
    d
}

/// `source`, a layer of another image (the base's), rewritten as an eStargz or zstd:chunked
/// layer in `layout`: its tar stream framed as gpubake's own layers are, so that a node that
/// pulls lazily can mount every layer of the image (containerd fetches every layer above the
/// first one it cannot mount). Its diff ID is checked on the way; the cache keeps the result
/// by the source's digest unless `use_cache` is false.
pub fn to_lazy(
    layout: &Layout,
    source: &super::Layer,
    compression: Compression,
    use_cache: bool,
) -> Result<BuiltLayer> {
    let from = source.digest()?;
    let format = compression.toc().ok_or_else(|| {
        Error::Usage(format!(
            "{} layers have no table of contents to pull lazily",
            compression.name()
        ))
    })?;
    let what = compression.name();
    let record = record_name(&format!("{what} of {from}"), compression, 0);
    if use_cache && let Some(hit) = cached(layout, &record) {
        return Ok(hit);
    }
    let started = std::time::Instant::now();
    let threads = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut blob = layout.blob_writer()?;
    let blobs = layout.root().join("blobs");
    let io_err = |e: io::Error| Error::writing(&blobs, e);
    let encoder = Encoder::new(compression, blob.take_writer(), threads).map_err(io_err)?;
    let mut framed = super::estargz::Writer::new(encoder, format).map_err(io_err)?;
    let mut tar = source.uncompressed()?;
    let progress = crate::progress::Progress::new(
        format!("rewriting base layer {} as {what}", &from.hex()[..12]),
        crate::progress::Unit::Bytes,
        None,
    );
    let copied = io::copy(
        &mut tar,
        &mut Counting {
            inner: &mut framed,
            progress: &progress,
        },
    );
    progress.finish();
    copied.map_err(|e| Error::image(&from, e.to_string()))?;
    let (encoder, toc) = framed
        .finish()
        .map_err(|e| Error::image(&from, e.to_string()))?;
    let done = encoder.finish().map_err(io_err)?;
    let (digest, size) = blob.commit()?;
    let mut built = BuiltLayer::written(
        lazy_descriptor(compression, &digest, size, Some(&toc)),
        done.diff_id,
        LayerTiming {
            wall_s: started.elapsed().as_secs_f64(),
            hash_s: done.hash_s,
            write_s: done.write_s,
            compress_s: done.blocks_s.unwrap_or(0.0),
            ..LayerTiming::default()
        },
    );
    let bytes = serde_json::to_vec(&built).expect("layers serialize");
    layout.write_record(&record, &bytes, false)?;
    built.placed = layout.share_blob(&digest, size);
    Ok(built)
}

/// Where a layer's tar stream goes: straight to the compressor, or through the eStargz
/// framing that cuts its members.
// One per layer being written, moved once: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Sink {
    Plain(Encoder),
    Estargz(super::estargz::Writer<Encoder>),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Plain(encoder) => encoder.write(buf),
            Sink::Estargz(writer) => writer.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The zip archives a layer reads from, opened once each.
#[derive(Default)]
struct Archives(BTreeMap<PathBuf, zip::ZipArchive<io::BufReader<File>>>);

impl Archives {
    /// Streams one member into the tar, hashing it on the way; a member whose bytes are not
    /// the sha256 RECORD gives, or not its size, fails the layer.
    fn append<W: Write>(
        &mut self,
        tar: &mut tar::Builder<W>,
        header: &mut tar::Header,
        path: &str,
        member: &ZipMember,
        at: &Path,
    ) -> Result<()> {
        let wheel = member.archive.display().to_string();
        let bad = |message: String| Error::Wheel {
            wheel: wheel.clone(),
            message,
        };
        if !self.0.contains_key(&member.archive) {
            let file =
                File::open(&member.archive).map_err(|e| Error::reading(&member.archive, e))?;
            let zip = zip::ZipArchive::new(io::BufReader::new(file))
                .map_err(|e| bad(format!("not a readable zip archive: {e}")))?;
            self.0.insert(member.archive.clone(), zip);
        }
        let zip = self.0.get_mut(&member.archive).expect("inserted above");
        let reader = zip
            .by_index(member.index)
            .map_err(|e| bad(format!("{}: {e}", member.name)))?;
        let (reader, tally) =
            super::digest::HashingReader::new(io::Read::take(reader, member.size));
        tar.append_data(header, path, reader).map_err(|e| {
            // Reading a wheel cannot fill a disk: that is the layer's destination.
            if crate::error::out_of_space(&e) {
                Error::writing(at, e)
            } else {
                bad(format!("{}: {e}", member.name))
            }
        })?;
        let (digest, read) = tally.finish();
        if read != member.size {
            return Err(bad(format!(
                "{}: {read} bytes, but the archive lists {}",
                member.name, member.size
            )));
        }
        if let Some(want) = member.sha256
            && digest.hex() != hex::encode(want)
        {
            return Err(bad(format!(
                "{}: sha256 {} does not match RECORD's {}",
                member.name,
                digest.hex(),
                hex::encode(want)
            )));
        }
        Ok(())
    }
}

/// Entries for a file or a directory tree on disk, placed under `dest`. Regular files get
/// 0755 when any execute bit is set on disk and 0644 otherwise, unless `mode` is given.
pub fn tree_entries(src: &Path, dest: &str, mode: Option<u32>) -> Result<Vec<Entry>> {
    let dest = dest
        .trim_start_matches('/')
        .trim_end_matches('/')
        .to_string();
    let mut out = Vec::new();
    for item in walkdir::WalkDir::new(src)
        .follow_links(false)
        .sort_by_file_name()
    {
        let item = item.map_err(|e| {
            let path = e
                .path()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| src.to_path_buf());
            Error::reading(
                path,
                e.into_io_error()
                    .unwrap_or_else(|| io::Error::other("walk failed")),
            )
        })?;
        let rel = item
            .path()
            .strip_prefix(src)
            .expect("walkdir stays under its root");
        let path = if rel.as_os_str().is_empty() {
            dest.clone()
        } else {
            format!("{dest}/{}", rel.to_string_lossy())
        };
        let ft = item.file_type();
        let source = if ft.is_dir() {
            Source::Dir
        } else if ft.is_symlink() {
            let target =
                std::fs::read_link(item.path()).map_err(|e| Error::reading(item.path(), e))?;
            Source::Symlink(target.to_string_lossy().into_owned())
        } else if ft.is_file() {
            Source::File(item.path().to_path_buf())
        } else {
            return Err(Error::Unsupported(format!(
                "{}: only regular files, directories and symlinks can go into an image",
                item.path().display()
            )));
        };
        let mode = match (&source, mode) {
            (Source::Dir, _) => 0o755,
            (Source::Symlink(_), _) => 0o777,
            (_, Some(m)) => m,
            _ => {
                use std::os::unix::fs::PermissionsExt;
                let disk = item
                    .metadata()
                    .map_err(|e| Error::reading(item.path(), e.into()))?
                    .permissions()
                    .mode();
                if disk & 0o111 != 0 { 0o755 } else { 0o644 }
            }
        };
        if path.is_empty() {
            continue;
        }
        out.push(Entry {
            path,
            mode,
            owner: ROOT,
            source,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A destination that fills after `room` bytes, as a full disk does.
    struct FullAfter {
        room: usize,
    }

    impl Write for FullAfter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_full_disk_while_a_wheel_member_is_written_names_the_destination_not_the_wheel() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("big-1.0-py3-none-any.whl");
        let payload = random(1 << 20, 7);
        let mut zip = zip::ZipWriter::new(File::create(&wheel).unwrap());
        zip.start_file("big/data.bin", zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(&payload).unwrap();
        zip.finish().unwrap();
        let member = ZipMember {
            archive: wheel.clone(),
            index: 0,
            size: payload.len() as u64,
            sha256: None,
            name: "big/data.bin".into(),
        };
        let entry = Entry {
            path: "opt/venv/big/data.bin".into(),
            mode: 0o644,
            owner: ROOT,
            source: Source::Zip(member),
        };
        let dest = dir.path().join("layout/blobs");
        let mut tar = tar::Builder::new(FullAfter { room: 64 << 10 });
        let err = append_entries(&mut tar, &[entry], 0, &dest).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("writing {}: ", dest.display())),
            "{text}"
        );
        assert!(!text.contains("whl"), "{text}");
        assert_eq!(err.exit_code(), 3);
    }

    /// Reproducible bytes that do not compress.
    fn random(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn text(len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0u64;
        while out.len() < len {
            out.extend_from_slice(
                format!("step {i} loss {:.4}\n", (i * 7919 % 1000) as f64 / 997.0).as_bytes(),
            );
            i += 1;
        }
        out.truncate(len);
        out
    }

    /// Several blocks, with random and text pieces inside one block and across block edges.
    fn mixed_spec() -> LayerSpec {
        let file = |path: &str, bytes: Vec<u8>| Entry {
            path: path.into(),
            mode: 0o644,
            owner: ROOT,
            source: Source::Bytes(bytes),
        };
        LayerSpec {
            name: "mixed".into(),
            created_by: "test".into(),
            entries: vec![
                file("a/random.bin", random(BLOCK + 3 * PIECE + 17, 1)),
                file("a/text.log", text(2 * BLOCK + 5)),
                file("b/small.bin", random(PIECE / 2, 2)),
                file("b/small.txt", text(PIECE / 3)),
                file("c/random2.bin", random(BLOCK / 2, 3)),
            ],
            prefetch: None,
        }
    }

    fn blob(layout: &Layout, layer: &BuiltLayer) -> Vec<u8> {
        let digest = super::super::layout::digest_of(&layer.descriptor).unwrap();
        std::fs::read(layout.blob_path(&digest)).unwrap()
    }

    #[test]
    fn the_blob_is_the_same_for_any_thread_count() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(dir.path()).unwrap();
        let spec = mixed_spec();
        for compression in [
            Compression::Gzip,
            Compression::Zstd,
            Compression::Estargz,
            Compression::ZstdChunked,
            Compression::Uncompressed,
        ] {
            let one = write_layer_on(&layout, &spec, compression, 0, 1).unwrap();
            let four = write_layer_on(&layout, &spec, compression, 0, 4).unwrap();
            assert_eq!(
                one.descriptor.digest(),
                four.descriptor.digest(),
                "{compression:?}"
            );
            assert_eq!(one.diff_id, four.diff_id, "{compression:?}");

            let packed = blob(&layout, &one);
            let mut tar = Vec::new();
            match compression {
                Compression::Gzip | Compression::Estargz => {
                    flate2::read::MultiGzDecoder::new(&packed[..])
                        .read_to_end(&mut tar)
                        .unwrap()
                }
                // Skippable frames (the zstd:chunked TOC and footer) inflate to nothing.
                Compression::Zstd | Compression::ZstdChunked => {
                    zstd::stream::read::Decoder::new(&packed[..])
                        .unwrap()
                        .read_to_end(&mut tar)
                        .unwrap()
                }
                Compression::Uncompressed => {
                    assert_eq!(one.descriptor.digest().to_string(), one.diff_id.to_string());
                    tar.extend_from_slice(&packed);
                    packed.len()
                }
            };
            assert_eq!(Digest::of(&tar), one.diff_id, "{compression:?}");
            let expected = write_tar(&spec.entries, 0, Vec::new(), dir.path()).unwrap();
            let written = expected.len() as u64;
            if compression == Compression::Estargz {
                // The landmark (a header and a block of payload) leads; the TOC replaces the
                // end-of-archive blocks.
                let entries = &expected[..expected.len() - 1024];
                assert!(
                    tar[1024..1024 + entries.len()] == *entries,
                    "the layer's entries"
                );
            } else if compression == Compression::ZstdChunked {
                // The landmark leads; the rest is the tar stream, its end included.
                assert!(tar[1024..] == expected[..], "the layer's entries");
            } else {
                assert!(
                    tar == expected,
                    "{compression:?}: the blob holds the layer's tar"
                );
            }
            // The timing counts the tar stream it wrote, and every stage did some work.
            let t = one.timing.clone().expect("a layer written now is timed");
            assert_eq!(t.tar_bytes, written, "{compression:?}");
            assert!(
                (t.compress_s > 0.0) == (compression != Compression::Uncompressed)
                    && t.hash_s > 0.0,
                "{compression:?}: {t:?}"
            );
            assert!(t.wall_s > 0.0 && t.write_s > 0.0, "{compression:?}: {t:?}");
            if compression == Compression::Uncompressed {
                continue;
            }
            // Random bytes cannot shrink; text does, so the blob is well under the tar.
            let incompressible = BLOCK + 3 * PIECE + PIECE / 2 + BLOCK / 2;
            assert!(packed.len() > incompressible, "{compression:?}");
            assert!(packed.len() < incompressible + BLOCK / 2, "{compression:?}");
        }
    }

    /// Every kind of entry, with names and link targets on both sides of the 100 bytes a
    /// plain header holds, and sizes on both sides of a 512-byte block.
    #[test]
    fn tar_size_is_the_written_length_for_every_kind_of_entry() {
        let dir = tempfile::tempdir().unwrap();
        let on_disk = dir.path().join("on-disk.bin");
        std::fs::write(&on_disk, random(1025, 9)).unwrap();
        let long = |n: usize| "d/".to_string() + &"n".repeat(n);
        let mut entries = Vec::new();
        for (i, name) in [
            long(97),
            long(98),
            long(99),
            long(150),
            long(300),
            "é/ü".into(),
        ]
        .into_iter()
        .enumerate()
        {
            for (j, len) in [0usize, 1, 511, 512, 513].into_iter().enumerate() {
                entries.push(Entry {
                    path: format!("{name}{i}{j}"),
                    mode: 0o644,
                    owner: ROOT,
                    source: Source::Bytes(random(len, (i * 5 + j) as u64)),
                });
            }
            entries.push(Entry {
                path: format!("{name}{i}/dir"),
                mode: 0o755,
                owner: ROOT,
                source: Source::Dir,
            });
            for (j, target) in [long(10), long(99), long(100), long(200)]
                .into_iter()
                .enumerate()
            {
                entries.push(Entry {
                    path: format!("{name}{i}/link{j}"),
                    mode: 0o777,
                    owner: ROOT,
                    source: Source::Symlink(target),
                });
            }
        }
        entries.push(Entry {
            path: long(120) + "/file",
            mode: 0o755,
            owner: ROOT,
            source: Source::File(on_disk),
        });
        let written = write_tar(&entries, 1_700_000_000, Vec::new(), dir.path()).unwrap();
        assert_eq!(tar_size(&entries).unwrap(), written.len() as u64);
        assert_eq!(
            tar_size(&[]).unwrap(),
            write_tar(&[], 0, Vec::new(), dir.path()).unwrap().len() as u64
        );
    }

    #[test]
    fn gzip_blocks_are_gzip_members() {
        let mut gzip = GzipBlocks::new(1);
        let mut block = text(PIECE * 2);
        block.extend(random(PIECE * 3, 9));
        block.extend(text(PIECE));
        let mut out = Vec::new();
        gzip.compress(&block, &mut out);
        // Three members: text, stored random, text.
        let members = out.windows(3).filter(|w| w == &[0x1f, 0x8b, 8]).count();
        assert!(members >= 3, "{members} members");
        let mut back = Vec::new();
        flate2::read::MultiGzDecoder::new(&out[..])
            .read_to_end(&mut back)
            .unwrap();
        assert!(back == block);
        assert!(out.len() < PIECE * 3 + PIECE, "the text parts shrink");

        let mut empty = Vec::new();
        gzip.compress(&[], &mut empty);
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&empty[..])
            .read_to_end(&mut back)
            .unwrap();
        assert!(back.is_empty());
    }

    #[test]
    fn only_random_looking_pieces_are_stored() {
        assert!(looks_random(&random(PIECE, 5)));
        assert!(!looks_random(&text(PIECE)));
        assert!(!looks_random(&vec![0u8; PIECE]));
        // Every byte value equally often, yet all repeats: the scan for repeats sees it.
        let ramp: Vec<u8> = (0..PIECE).map(|i| i as u8).collect();
        assert!(!looks_random(&ramp));
        // A random 1 KiB pattern repeated: even bytes, long repeats.
        assert!(!looks_random(&random(1024, 6).repeat(PIECE / 1024)));
        // float32 weights: random mantissas, no repeats, but the exponent bytes are skewed
        // enough for Huffman codes to save several percent.
        let weights: Vec<u8> = random(PIECE, 7)
            .chunks(4)
            .flat_map(|r| {
                let u = u32::from_le_bytes([r[0], r[1], r[2], r[3]]) as f64 / u32::MAX as f64;
                ((u * 0.02 - 0.01) as f32).to_le_bytes()
            })
            .collect();
        assert!(!looks_random(&weights));
        let mut deflate =
            libdeflater::Compressor::new(libdeflater::CompressionLvl::new(1).unwrap());
        let mut out = vec![0; deflate.deflate_compress_bound(PIECE)];
        let n = deflate.deflate_compress(&weights, &mut out).unwrap();
        assert!(n < PIECE * 95 / 100, "{n}: deflate does save on such data");
    }
}
