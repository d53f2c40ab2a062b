//! New layers, written reproducibly: entries sorted, parent directories included, owner
//! root, mtimes set to one epoch, modes normalised, fixed compression settings. The tar
//! stream is hashed (diff ID) and compressed on every core while it is written, and the
//! compressed stream is hashed (digest) on its way to disk; nothing is held in memory.
//!
//! A layer whose inputs are unchanged (same paths, modes, sizes and mtimes of its source
//! files) is found in the layout's cache and not written again.

use super::digest::{Digest, HashingWriter};
use super::layout::{Layout, descriptor};
use crate::error::{Error, Result};
use oci_spec::image::{Descriptor, MediaType};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// How layers are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// gzip (parallel, pigz-style blocks): what every runtime reads.
    Gzip,
    /// zstd (multi-threaded): smaller and faster; containerd 1.5+, Docker 23+, podman.
    Zstd,
}

impl Compression {
    /// The OCI media type of a layer compressed this way.
    pub fn media_type(self) -> MediaType {
        match self {
            Compression::Gzip => MediaType::ImageLayerGzip,
            Compression::Zstd => MediaType::ImageLayerZstd,
        }
    }

    /// The fixed level: speed over the last few percent of size, the same on every machine.
    fn level(self) -> u32 {
        match self {
            Compression::Gzip => 1,
            Compression::Zstd => 3,
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
}

/// One entry of a new layer.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Path inside the image, relative (`etc/nccl.conf`).
    pub path: String,
    /// Permission bits.
    pub mode: u32,
    /// Content.
    pub source: Source,
}

/// What a layer holds and how the history should describe it.
pub struct LayerSpec {
    /// Short name: `files`, `probe`, `presets`.
    pub name: String,
    /// What made it, for the image history.
    pub created_by: String,
    /// The entries; parents are added and order is fixed by the writer.
    pub entries: Vec<Entry>,
}

/// A layer in the layout.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BuiltLayer {
    /// Its descriptor in the manifest.
    pub descriptor: Descriptor,
    /// sha256 of the uncompressed tar.
    pub diff_id: Digest,
    /// Found in the cache, not written.
    #[serde(skip)]
    pub reused: bool,
}

/// Builds `spec` into `layout`, or finds it in the cache unless `use_cache` is false.
pub fn build_layer(
    layout: &Layout,
    spec: &LayerSpec,
    compression: Compression,
    epoch: u64,
    use_cache: bool,
) -> Result<BuiltLayer> {
    let key = cache_key(spec, compression, epoch)?;
    let cache_dir = layout.root().join(".gpubake/layers");
    let cache_file = cache_dir.join(format!("{key}.json"));
    if let Some(mut hit) = std::fs::read(&cache_file)
        .ok()
        .filter(|_| use_cache)
        .and_then(|b| serde_json::from_slice::<BuiltLayer>(&b).ok())
        .filter(|l| {
            super::layout::digest_of(&l.descriptor)
                .is_ok_and(|d| layout.has_blob(&d, l.descriptor.size()))
        })
    {
        hit.reused = true;
        return Ok(hit);
    }
    let built = write_layer(layout, spec, compression, epoch)?;
    std::fs::create_dir_all(&cache_dir).map_err(|e| Error::io(&cache_dir, e))?;
    let record = serde_json::to_vec(&built).expect("layers serialize");
    crate::fsutil::write_atomic(&cache_file, &record)?;
    Ok(built)
}

/// Identifies a layer's inputs without reading file contents: paths, modes, bytes of
/// generated files, and size and mtime of files on disk.
fn cache_key(spec: &LayerSpec, compression: Compression, epoch: u64) -> Result<String> {
    let mut h = Sha256::new();
    h.update(format!("gpubake-layer-v1 {compression:?} {epoch}\n"));
    for e in &spec.entries {
        h.update(format!("{} {:o} ", e.path, e.mode));
        match &e.source {
            Source::Bytes(b) => h.update(Sha256::digest(b)),
            Source::File(p) => {
                let m = std::fs::metadata(p).map_err(|err| Error::io(p, err))?;
                let mtime = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                h.update(format!("file {} {} {mtime}", p.display(), m.len()));
            }
            Source::Symlink(t) => h.update(format!("link {t}")),
            Source::Dir => h.update("dir"),
        }
        h.update("\n");
    }
    Ok(hex::encode(h.finalize()))
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
                source: Source::Dir,
            });
            parent = p.parent();
        }
        all.insert(e.path.clone(), e.clone());
    }
    all.into_values().collect()
}

/// The compressor between the tar stream and the blob file.
enum Encoder {
    Gzip(
        gzp::par::compress::ParCompress<
            'static,
            gzp::deflate::Gzip,
            HashingWriter<BufWriter<File>>,
        >,
    ),
    Zstd(zstd::stream::write::Encoder<'static, HashingWriter<BufWriter<File>>>),
}

impl Encoder {
    fn new(compression: Compression, out: HashingWriter<BufWriter<File>>) -> io::Result<Self> {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Ok(match compression {
            Compression::Gzip => Encoder::Gzip(
                gzp::par::compress::ParCompressBuilder::<gzp::deflate::Gzip>::new()
                    .num_threads(threads)
                    .map_err(io::Error::other)?
                    .compression_level(gzp::Compression::new(compression.level()))
                    .from_writer(out),
            ),
            Compression::Zstd => {
                let mut enc = zstd::stream::write::Encoder::new(out, compression.level() as i32)?;
                // Multi-threaded zstd output is the same for any worker count >= 1.
                enc.multithread(threads as u32)?;
                Encoder::Zstd(enc)
            }
        })
    }

    /// Ends the stream and flushes the file underneath, so write errors surface here.
    fn finish(self) -> io::Result<()> {
        let mut out = match self {
            Encoder::Gzip(mut e) => {
                use gzp::ZWriter;
                e.finish().map_err(io::Error::other)?
            }
            Encoder::Zstd(e) => e.finish()?,
        };
        out.flush()
    }
}

impl Write for Encoder {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::Gzip(e) => e.write(buf),
            Encoder::Zstd(e) => e.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.flush(),
            Encoder::Zstd(e) => e.flush(),
        }
    }
}

fn header(entry: &Entry, size: u64, epoch: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mtime(epoch);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mode(entry.mode);
    h.set_size(size);
    h.set_entry_type(match entry.source {
        Source::Dir => tar::EntryType::Directory,
        Source::Symlink(_) => tar::EntryType::Symlink,
        _ => tar::EntryType::Regular,
    });
    h
}

/// Counts bytes into a progress bar on their way to the compressor.
struct Progress<W> {
    inner: W,
    bar: indicatif::ProgressBar,
}

impl<W: Write> Write for Progress<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A byte progress bar on stderr for large layers; indicatif draws nothing when stderr is
/// not a terminal.
fn progress_bar(spec: &LayerSpec) -> indicatif::ProgressBar {
    let total: u64 = spec
        .entries
        .iter()
        .map(|e| match &e.source {
            Source::Bytes(b) => b.len() as u64,
            Source::File(p) => std::fs::metadata(p).map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum();
    if total < 64 << 20 {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .expect("the template is valid")
        .progress_chars("=> "),
    );
    bar.set_prefix(spec.name.clone());
    bar
}

fn write_layer(
    layout: &Layout,
    spec: &LayerSpec,
    compression: Compression,
    epoch: u64,
) -> Result<BuiltLayer> {
    let mut blob = layout.blob_writer()?;
    let io_err = |e: io::Error| Error::io(layout.root().join("blobs"), e);
    let encoder = Encoder::new(compression, blob.take_writer()).map_err(io_err)?;
    let (tee, diff_tally) = HashingWriter::new(encoder);
    let bar = progress_bar(spec);
    let mut tar = tar::Builder::new(Progress {
        inner: tee,
        bar: bar.clone(),
    });
    for entry in complete(&spec.entries) {
        match &entry.source {
            Source::Bytes(bytes) => {
                let mut h = header(&entry, bytes.len() as u64, epoch);
                tar.append_data(&mut h, &entry.path, bytes.as_slice())
                    .map_err(io_err)?;
            }
            Source::File(path) => {
                let file = File::open(path).map_err(|e| Error::io(path, e))?;
                let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
                let mut h = header(&entry, len, epoch);
                // A file that changes size while it is read would corrupt the tar; `take`
                // and the size check below catch it.
                let mut reader = io::Read::take(file, len);
                tar.append_data(&mut h, &entry.path, &mut reader)
                    .map_err(|e| Error::io(path, e))?;
            }
            Source::Symlink(target) => {
                let mut h = header(&entry, 0, epoch);
                tar.append_link(&mut h, &entry.path, target)
                    .map_err(io_err)?;
            }
            Source::Dir => {
                let mut h = header(&entry, 0, epoch);
                tar.append_data(&mut h, format!("{}/", entry.path), io::empty())
                    .map_err(io_err)?;
            }
        }
    }
    let tee = tar.into_inner().map_err(io_err)?.inner;
    bar.finish_and_clear();
    let encoder = tee.into_inner();
    encoder.finish().map_err(io_err)?;
    let (diff_id, _) = diff_tally.finish();
    let (digest, size) = blob.commit()?;
    Ok(BuiltLayer {
        descriptor: descriptor(compression.media_type(), &digest, size),
        diff_id,
        reused: false,
    })
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
            Error::io(
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
            let target = std::fs::read_link(item.path()).map_err(|e| Error::io(item.path(), e))?;
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
                    .map_err(|e| Error::io(item.path(), e.into()))?
                    .permissions()
                    .mode();
                if disk & 0o111 != 0 { 0o755 } else { 0o644 }
            }
        };
        if path.is_empty() {
            continue;
        }
        out.push(Entry { path, mode, source });
    }
    Ok(out)
}
