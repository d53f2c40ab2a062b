//! eStargz layers: gzip that the stargz snapshotter can pull lazily and every other runtime
//! reads as plain gzip; and zstd:chunked, the same layout in zstd (see [`TocFormat`]).
//!
//! The layer's tar stream is cut into gzip members where each regular file's payload begins
//! and every [`CHUNK`] bytes within it, so a reader can inflate one chunk on its own. After
//! the entries comes a member holding one more tar entry, `stargz.index.json`: the table of
//! contents, every entry with the blob offset of its member and the sha256 of each chunk.
//! A 51-byte empty gzip member closes the blob and names the TOC's offset in its extra
//! field. The layer's descriptor carries the TOC's digest (the snapshotter refuses a layer
//! without it, or whose TOC does not hash to it) and the size of the inflated stream.
//!
//! A landmark file marks the prefetch: `.no.prefetch.landmark`, first, tells the snapshotter
//! to prefetch nothing; `.prefetch.landmark` follows the entries a job's start-up reads (see
//! [`crate::image::layer::Prefetch`]), and the snapshotter fetches the blob up to its
//! payload's member before the container starts. The inflated stream holds the landmark and the TOC as files, so the
//! layer's diff ID is of that stream, and a runtime that unpacks the layer (Docker,
//! containerd's overlayfs, podman) writes `/.no.prefetch.landmark` and `/stargz.index.json`,
//! mode 0000, into the rootfs; the stargz snapshotter hides both.

use crate::image::digest::Digest;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::mpsc;

/// Names how layers are framed, for the layer cache: a record of an older framing hands back
/// a blob the snapshotter may not read (before this, a TOC over 1 MiB spanned members), or
/// one that keeps an earlier framing's TOC and landmark files.
pub const FRAMING: &str = "; estargz TOC in one member; earlier TOCs and landmarks dropped";

/// How a blob carries its table of contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TocFormat {
    /// eStargz: gzip members, the TOC a tar entry `stargz.index.json` in a member of its
    /// own, the 51-byte gzip footer.
    Estargz,
    /// zstd:chunked (as the stargz snapshotter writes and reads it): zstd frames, the TOC's
    /// JSON zstd-compressed in a skippable frame after the tar stream, then the 40-byte
    /// footer in a skippable frame of its own. Skippable frames inflate to nothing, so the
    /// inflated stream is the tar stream alone.
    ZstdChunked,
}

/// The descriptor annotation holding the compressed TOC's digest, for zstd:chunked
/// (containers/storage reads it; the snapshotter reads `toc.digest`).
pub const MANIFEST_CHECKSUM: &str = "io.containers.zstd-chunked.manifest-checksum";
/// The descriptor annotation `OFFSET:COMPRESSED:RAW:1` placing the zstd:chunked TOC.
pub const MANIFEST_POSITION: &str = "io.containers.zstd-chunked.manifest-position";
/// The zstd:chunked footer's length, inside its skippable frame.
pub const ZSTD_FOOTER_SIZE: usize = 40;
/// The zstd:chunked footer's closing magic.
const ZSTD_CHUNKED_MAGIC: &[u8; 8] = b"GnUlInUx";
/// The magic number of a zstd skippable frame (the first of sixteen).
const SKIPPABLE_MAGIC: [u8; 4] = [0x50, 0x2a, 0x4d, 0x18];
/// The manifest type of a TOC in the stargz JSON form.
const MANIFEST_TYPE_CRFS: u64 = 1;

/// The descriptor annotation holding the TOC's digest.
pub const TOC_DIGEST: &str = "containerd.io/snapshot/stargz/toc.digest";
/// The descriptor annotation holding the inflated stream's length in bytes.
pub const UNCOMPRESSED_SIZE: &str = "io.containers.estargz.uncompressed-size";
/// The chunk size: a file's payload starts a new gzip member every this many bytes (the
/// stargz writer's default).
pub const CHUNK: u64 = 4 << 20;
/// The name of the TOC's tar entry.
pub const TOC_NAME: &str = "stargz.index.json";
/// The landmark that asks for no prefetch.
pub const NO_PREFETCH_LANDMARK: &str = ".no.prefetch.landmark";
/// The landmark after the files a prefetch fetches.
pub const PREFETCH_LANDMARK: &str = ".prefetch.landmark";
/// What a landmark file holds.
const LANDMARK_BYTE: u8 = 0xf;
/// The length of the footer.
pub const FOOTER_SIZE: usize = 51;

/// The gzip compressor under an eStargz stream: what the stream writes goes into the
/// current member, and the stream says where members end.
pub trait Members: Write {
    /// Ends the current gzip member; the receiver gets the blob offset at which the next
    /// one begins, once everything before it is written.
    fn cut(&mut self) -> io::Result<mpsc::Receiver<u64>>;
    /// Writes `bytes` of the inflated stream as one gzip member of their own, however long:
    /// the snapshotter reads the TOC's member alone (Go's gzip without multistream), so a
    /// TOC split across members reads as cut short.
    fn whole_member(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Appends bytes to the blob as they are: outside any member, and outside the inflated
    /// stream (the footer).
    fn append_raw(&mut self, bytes: Vec<u8>) -> io::Result<()>;
}

/// What a finished eStargz or zstd:chunked stream adds to its layer's descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toc {
    /// sha256 of the TOC's JSON.
    pub digest: Digest,
    /// Bytes of the inflated stream.
    pub uncompressed_size: u64,
    /// For zstd:chunked, the compressed TOC's digest and its `OFFSET:COMPRESSED:RAW:1`
    /// position.
    pub manifest: Option<(Digest, String)>,
}

impl Toc {
    /// The annotations a layer descriptor carries for it.
    pub fn annotations(&self) -> std::collections::HashMap<String, String> {
        let mut all = std::collections::HashMap::from([
            (TOC_DIGEST.to_string(), self.digest.to_string()),
            (
                UNCOMPRESSED_SIZE.to_string(),
                self.uncompressed_size.to_string(),
            ),
        ]);
        if let Some((checksum, position)) = &self.manifest {
            all.insert(MANIFEST_CHECKSUM.to_string(), checksum.to_string());
            all.insert(MANIFEST_POSITION.to_string(), position.clone());
        }
        all
    }
}

/// Converts a whole tar stream into an eStargz blob on `out`, compressing member by member
/// on this thread (layers gpubake writes go through its parallel compressor instead).
pub fn convert(mut tar: impl io::Read, out: impl Write) -> io::Result<Toc> {
    let mut writer = Writer::new(
        Serial {
            out,
            written: 0,
            member: Vec::new(),
        },
        TocFormat::Estargz,
    )?;
    io::copy(&mut tar, &mut writer)?;
    let (mut serial, toc) = writer.finish()?;
    serial.out.flush()?;
    Ok(toc)
}

/// Members compressed one at a time, each as it ends.
struct Serial<W: Write> {
    out: W,
    written: u64,
    member: Vec<u8>,
}

impl<W: Write> Serial<W> {
    fn emit(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn close_member(&mut self) -> io::Result<()> {
        if self.member.is_empty() {
            return Ok(());
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&self.member)?;
        let packed = gz.finish()?;
        self.member.clear();
        self.emit(&packed)
    }
}

impl<W: Write> Write for Serial<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.member.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<W: Write> Members for Serial<W> {
    fn cut(&mut self) -> io::Result<mpsc::Receiver<u64>> {
        self.close_member()?;
        let (offset, at) = mpsc::sync_channel(1);
        offset.send(self.written).expect("the receiver is held");
        Ok(at)
    }

    fn whole_member(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.close_member()?;
        self.member.extend_from_slice(bytes);
        self.close_member()
    }

    fn append_raw(&mut self, bytes: Vec<u8>) -> io::Result<()> {
        self.close_member()?;
        self.emit(&bytes)
    }
}

/// One TOC entry, as the stargz reader takes it: zero values left out.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "is_zero")]
    size: u64,
    #[serde(rename = "modtime", skip_serializing_if = "String::is_empty")]
    mod_time: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    link_name: String,
    #[serde(skip_serializing_if = "is_zero")]
    mode: u64,
    #[serde(skip_serializing_if = "is_zero")]
    uid: u64,
    #[serde(skip_serializing_if = "is_zero")]
    gid: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    user_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    group_name: String,
    #[serde(skip_serializing_if = "is_zero")]
    dev_major: u64,
    #[serde(skip_serializing_if = "is_zero")]
    dev_minor: u64,
    /// Base64 values, as Go's JSON writes a byte slice.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    xattrs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    digest: String,
    #[serde(skip_serializing_if = "is_zero")]
    offset: u64,
    #[serde(skip_serializing_if = "is_zero")]
    chunk_offset: u64,
    #[serde(skip_serializing_if = "is_zero")]
    chunk_size: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    chunk_digest: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize)]
struct TocJson<'a> {
    version: u32,
    entries: &'a [Entry],
}

/// What the parser is in the middle of.
enum State {
    /// Collecting a 512-byte header block.
    Header,
    /// The data of a PAX or GNU long-name header, collected to apply to the next entry.
    Extension { kind: u8, left: u64, pad: u64 },
    /// A payload; `file` is the TOC entry of a regular file, which is chunked.
    Payload {
        left: u64,
        pad: u64,
        file: Option<usize>,
    },
    /// An entry left out (a TOC or landmark of an earlier framing): its payload and padding.
    Skip { left: u64 },
    /// The end-of-archive blocks: nothing more is passed on.
    End,
}

/// What PAX and GNU extension headers say of the entry that follows them.
#[derive(Default)]
struct Overrides {
    path: Option<String>,
    link: Option<String>,
    records: BTreeMap<String, Vec<u8>>,
}

/// A chunk being written: its TOC entry and its hash.
struct OpenChunk {
    entry: usize,
    left: u64,
    hash: Sha256,
}

/// Turns a tar stream, written into it, into an eStargz or zstd:chunked stream on `M`.
pub struct Writer<M: Members> {
    out: M,
    format: TocFormat,
    block: Vec<u8>,
    state: State,
    extension: Vec<u8>,
    overrides: Overrides,
    /// Extension headers and their data, passed on with the entry they describe, or left
    /// out with it.
    held: Vec<u8>,
    /// Whether the writer is writing its own landmark, which is not left out.
    framing_own: bool,
    entries: Vec<Entry>,
    /// Each chunk's entry, and where its member will begin.
    offsets: Vec<(usize, mpsc::Receiver<u64>)>,
    chunk: Option<OpenChunk>,
    file_hash: Option<Sha256>,
    /// Bytes of the regular file being written that are not yet in a chunk.
    file_written: u64,
    inflated: u64,
}

impl<M: Members> Writer<M> {
    /// Starts the stream with the no-prefetch landmark.
    pub fn new(out: M, format: TocFormat) -> io::Result<Self> {
        let mut writer = Self::prefetching(out, format);
        writer.write_landmark(NO_PREFETCH_LANDMARK)?;
        Ok(writer)
    }

    /// Starts a stream whose first entries are the ones a prefetch fetches: the caller
    /// writes them, then [`Writer::landmark`], then the rest.
    pub fn prefetching(out: M, format: TocFormat) -> Self {
        Writer {
            out,
            format,
            block: Vec::with_capacity(512),
            state: State::Header,
            extension: Vec::new(),
            overrides: Overrides::default(),
            held: Vec::new(),
            framing_own: false,
            entries: Vec::new(),
            offsets: Vec::new(),
            chunk: None,
            file_hash: None,
            file_written: 0,
            inflated: 0,
        }
    }

    /// Writes `.prefetch.landmark` here, between two entries: the snapshotter prefetches
    /// the blob up to the member that holds the landmark's byte.
    pub fn landmark(&mut self) -> io::Result<()> {
        if !matches!(self.state, State::Header) || !self.block.is_empty() {
            return Err(io::Error::other(
                "the prefetch landmark goes between two entries of the tar stream",
            ));
        }
        self.write_landmark(PREFETCH_LANDMARK)
    }

    fn write_landmark(&mut self, name: &str) -> io::Result<()> {
        self.framing_own = true;
        let written = self.write_all(&single_file(name, &[LANDMARK_BYTE], false));
        self.framing_own = false;
        written
    }

    /// Writes the TOC and the footer after the tar stream's end; returns the compressor and
    /// what the layer's descriptor says of the stream.
    pub fn finish(mut self) -> io::Result<(M, Toc)> {
        // A stream that ends between entries without the end-of-archive blocks is taken, as
        // Go's and GNU tar's readers take it.
        let between_entries = matches!(self.state, State::Header) && self.block.is_empty();
        if !matches!(self.state, State::End) && !between_entries {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the tar stream ended inside an entry",
            ));
        }
        if self.format == TocFormat::ZstdChunked {
            // The TOC is no tar entry here: the stream ends as a tar stream does.
            let end = [0; 1024];
            self.out.write_all(&end)?;
            self.inflated += end.len() as u64;
        }
        let toc_at = self.out.cut()?;
        let stopped = |_| io::Error::other("the layer writer stopped");
        for (entry, offset) in std::mem::take(&mut self.offsets) {
            self.entries[entry].offset = offset.recv().map_err(stopped)?;
        }
        let json = serde_json::to_vec(&TocJson {
            version: 1,
            entries: &self.entries,
        })
        .expect("a TOC serializes");
        let digest = Digest::of(&json);
        let manifest = match self.format {
            TocFormat::Estargz => {
                let toc = single_file(TOC_NAME, &json, true);
                self.out.whole_member(&toc)?;
                self.inflated += toc.len() as u64;
                let toc_offset = toc_at.recv().map_err(stopped)?;
                self.out.append_raw(footer(toc_offset))?;
                None
            }
            TocFormat::ZstdChunked => {
                let packed = zstd::bulk::compress(&json, 3)?;
                let checksum = Digest::of(&packed);
                let packed_len = packed.len() as u64;
                self.out.append_raw(skippable(packed))?;
                // The TOC's bytes begin after the skippable frame's 8-byte header.
                let toc_offset = toc_at.recv().map_err(stopped)? + 8;
                let footer = zstd_footer(toc_offset, packed_len, json.len() as u64);
                self.out.append_raw(skippable(footer))?;
                let position = format!(
                    "{toc_offset}:{packed_len}:{}:{MANIFEST_TYPE_CRFS}",
                    json.len()
                );
                Some((checksum, position))
            }
        };
        let toc = Toc {
            digest,
            uncompressed_size: self.inflated,
            manifest,
        };
        Ok((self.out, toc))
    }

    /// Passes bytes of the tar stream on.
    fn pass(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inflated += bytes.len() as u64;
        self.out.write_all(bytes)
    }

    /// A complete header block.
    fn header(&mut self) -> io::Result<()> {
        let block: [u8; 512] = self.block[..].try_into().expect("a whole block");
        self.block.clear();
        if block.iter().all(|&b| b == 0) {
            self.state = State::End;
            return Ok(());
        }
        let kind = block[156];
        // A PAX size (of a file over 8 GiB) stands for the header's.
        let size = match self.overrides.records.get("size") {
            Some(value) if !matches!(kind, b'x' | b'g' | b'L' | b'K') => lossy(value)
                .parse()
                .map_err(|_| bad("PAX size is not a number"))?,
            _ => numeric(&block[124..136])?,
        };
        let pad = (512 - size % 512) % 512;
        if matches!(kind, b'x' | b'g' | b'L' | b'K') {
            self.held.extend_from_slice(&block);
            self.extension.clear();
            self.state = State::Extension {
                kind,
                left: size,
                pad,
            };
            return Ok(());
        }
        let overrides = std::mem::take(&mut self.overrides);
        let entry = entry_of(&block, size, overrides)?;
        let held = std::mem::take(&mut self.held);
        // A layer framed before (an eStargz base, or one rewritten in the other format)
        // brings its own TOC and landmark as files: the new framing writes its own, and a
        // second landmark would tell the snapshotter another prefetch.
        if matches!(
            entry.name.as_str(),
            TOC_NAME | NO_PREFETCH_LANDMARK | PREFETCH_LANDMARK
        ) && !self.framing_own
        {
            self.state = State::Skip { left: size + pad };
            return Ok(());
        }
        self.pass(&held)?;
        self.pass(&block)?;
        let regular = entry.kind == "reg";
        self.entries.push(entry);
        self.state = if size == 0 {
            State::Header
        } else {
            State::Payload {
                left: size,
                pad,
                file: regular.then_some(self.entries.len() - 1),
            }
        };
        if regular && size > 0 {
            self.file_hash = Some(Sha256::new());
            self.file_written = 0;
        }
        Ok(())
    }

    /// Bytes of a regular file's payload, cut into chunks.
    fn payload(&mut self, file: usize, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            if self.chunk.is_none() {
                let at = self.out.cut()?;
                let size = self.entries[file].size;
                let left = (size - self.file_written).min(CHUNK);
                let entry = if self.file_written == 0 {
                    file
                } else {
                    self.entries.push(Entry {
                        kind: "chunk",
                        chunk_offset: self.file_written,
                        ..Entry::default()
                    });
                    self.entries.len() - 1
                };
                // A chunk of the full size says so; the last one runs to the file's end.
                if left == CHUNK {
                    self.entries[entry].chunk_size = CHUNK;
                }
                self.offsets.push((entry, at));
                self.chunk = Some(OpenChunk {
                    entry,
                    left,
                    hash: Sha256::new(),
                });
            }
            let chunk = self.chunk.as_mut().expect("opened above");
            let take = (chunk.left as usize).min(bytes.len());
            chunk.hash.update(&bytes[..take]);
            chunk.left -= take as u64;
            if let Some(hash) = &mut self.file_hash {
                hash.update(&bytes[..take]);
            }
            self.file_written += take as u64;
            if chunk.left == 0 {
                let done = self.chunk.take().expect("open");
                self.entries[done.entry].chunk_digest = prefixed(done.hash);
            }
            self.pass(&bytes[..take])?;
            bytes = &bytes[take..];
        }
        Ok(())
    }

    /// The end of a regular file's payload: its digest.
    fn file_done(&mut self, file: usize) {
        if let Some(hash) = self.file_hash.take() {
            self.entries[file].digest = prefixed(hash);
        }
    }

    /// An extension header's data, complete: what it says of the next entry.
    fn extension_done(&mut self, kind: u8) -> io::Result<()> {
        let data = std::mem::take(&mut self.extension);
        let text = || {
            let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
            String::from_utf8_lossy(&data[..end]).into_owned()
        };
        match kind {
            b'L' => self.overrides.path = Some(text()),
            b'K' => self.overrides.link = Some(text()),
            b'x' => {
                for (key, value) in pax_records(&data)? {
                    match key.as_str() {
                        "path" => self.overrides.path = Some(lossy(&value)),
                        "linkpath" => self.overrides.link = Some(lossy(&value)),
                        _ => {
                            self.overrides.records.insert(key, value);
                        }
                    }
                }
            }
            // Global headers apply to the archive; gpubake's layers have none.
            _ => {}
        }
        Ok(())
    }
}

impl<M: Members> Write for Writer<M> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut rest = buf;
        while !rest.is_empty() {
            match self.state {
                State::End => break,
                State::Skip { left } => {
                    let take = (left as usize).min(rest.len());
                    rest = &rest[take..];
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        State::Header
                    } else {
                        State::Skip { left }
                    };
                }
                State::Header => {
                    let take = (512 - self.block.len()).min(rest.len());
                    self.block.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if self.block.len() == 512 {
                        self.header()?;
                    }
                }
                State::Extension { kind, left, pad } => {
                    let take = ((left + pad) as usize).min(rest.len());
                    let data = (left as usize).min(take);
                    self.extension.extend_from_slice(&rest[..data]);
                    let (bytes, after) = rest.split_at(take);
                    self.held.extend_from_slice(bytes);
                    rest = after;
                    let left_all = left + pad - take as u64;
                    if left_all == 0 {
                        self.state = State::Header;
                        self.extension_done(kind)?;
                    } else {
                        let left = left.saturating_sub(data as u64);
                        self.state = State::Extension {
                            kind,
                            left,
                            pad: left_all - left,
                        };
                    }
                }
                State::Payload { left, pad, file } => {
                    if left > 0 {
                        let take = (left as usize).min(rest.len());
                        let (bytes, after) = rest.split_at(take);
                        match file {
                            Some(file) => self.payload(file, bytes)?,
                            None => self.pass(bytes)?,
                        }
                        rest = after;
                        let left = left - take as u64;
                        if left == 0
                            && let Some(file) = file
                        {
                            self.file_done(file);
                        }
                        self.state = State::Payload { left, pad, file };
                    } else {
                        // The padding rides in the member of the payload's last chunk.
                        let take = (pad as usize).min(rest.len());
                        let (bytes, after) = rest.split_at(take);
                        self.pass(bytes)?;
                        rest = after;
                        let pad = pad - take as u64;
                        self.state = if pad == 0 {
                            State::Header
                        } else {
                            State::Payload { left, pad, file }
                        };
                    }
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The TOC entry of a main header block, with what extension headers said of it.
fn entry_of(block: &[u8; 512], size: u64, overrides: Overrides) -> io::Result<Entry> {
    let field = |range: std::ops::Range<usize>| {
        let bytes = &block[range];
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    };
    let posix = &block[257..263] == b"ustar\0";
    let name = overrides.path.clone().unwrap_or_else(|| {
        let (prefix, name) = (field(345..500), field(0..100));
        if posix && !prefix.is_empty() {
            format!("{prefix}/{name}")
        } else {
            name
        }
    });
    let link = overrides.link.clone().unwrap_or_else(|| field(157..257));
    let kind = match block[156] {
        b'0' | 0 | b'7' => "reg",
        b'1' => "hardlink",
        b'2' => "symlink",
        b'3' => "char",
        b'4' => "block",
        b'5' => "dir",
        b'6' => "fifo",
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{name}: tar entry type {:?} has no eStargz form",
                    other as char
                ),
            ));
        }
    };
    let number = |key: &str, range: std::ops::Range<usize>| -> io::Result<u64> {
        match overrides.records.get(key) {
            Some(value) => lossy(value).parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{name}: PAX {key} is not a number"),
                )
            }),
            None => numeric(&block[range]),
        }
    };
    let text = |key: &str, range: std::ops::Range<usize>| match overrides.records.get(key) {
        Some(value) => lossy(value),
        None => field(range),
    };
    let mtime = match overrides.records.get("mtime") {
        // PAX times may have a fraction; the TOC keeps whole seconds, as Go rounds them.
        Some(value) => lossy(value)
            .split('.')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        None => numeric(&block[136..148])?,
    };
    use base64::Engine as _;
    let xattrs = overrides
        .records
        .iter()
        .filter_map(|(key, value)| {
            let name = key.strip_prefix("SCHILY.xattr.")?;
            Some((
                name.to_string(),
                base64::engine::general_purpose::STANDARD.encode(value),
            ))
        })
        .collect();
    let device = matches!(kind, "char" | "block");
    Ok(Entry {
        name: clean(&name),
        kind,
        size: if kind == "reg" { size } else { 0 },
        mod_time: crate::units::rfc3339(mtime),
        link_name: match kind {
            "hardlink" => clean(&link),
            "symlink" => link,
            _ => String::new(),
        },
        mode: numeric(&block[100..108])?,
        uid: number("uid", 108..116)?,
        gid: number("gid", 116..124)?,
        user_name: text("uname", 265..297),
        group_name: text("gname", 297..329),
        dev_major: if device {
            numeric(&block[329..337])?
        } else {
            0
        },
        dev_minor: if device {
            numeric(&block[337..345])?
        } else {
            0
        },
        xattrs,
        ..Entry::default()
    })
}

/// A path as the stargz reader names entries: no leading `/` or `./`, no trailing `/`,
/// `.` and `..` resolved.
fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
}

/// A tar numeric field: octal text, or base-256 when its high bit is set.
fn numeric(field: &[u8]) -> io::Result<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut n: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            n = n
                .checked_mul(256)
                .and_then(|n| n.checked_add(u64::from(b)))
                .ok_or_else(|| bad("a tar number overflows"))?;
        }
        return Ok(n);
    }
    let text: String = field
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as char)
        .collect();
    let text = text.trim();
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).map_err(|_| bad(&format!("tar number {text:?} is not octal")))
}

fn bad(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The records of a PAX extended header: `LEN KEY=VALUE\n`, LEN counting the whole record.
fn pax_records(mut data: &[u8]) -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut records = Vec::new();
    while !data.is_empty() && data[0] != 0 {
        let space = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("a PAX record has no length"))?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&n| n > space + 1 && n <= data.len())
            .ok_or_else(|| bad("a PAX record's length is wrong"))?;
        let record = &data[space + 1..len - 1];
        let eq = record
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| bad("a PAX record has no `=`"))?;
        records.push((lossy(&record[..eq]), record[eq + 1..].to_vec()));
        data = &data[len..];
    }
    Ok(records)
}

/// One regular file as tar bytes (mode 0, owned by root, dated 1970), with the
/// end-of-archive blocks after it when `end`.
fn single_file(name: &str, content: &[u8], end: bool) -> Vec<u8> {
    let mut header = tar::Header::new_ustar();
    header.set_path(name).expect("a short name");
    header.set_size(content.len() as u64);
    header.set_mode(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let mut out = header.as_bytes().to_vec();
    out.extend_from_slice(content);
    out.resize(out.len().div_ceil(512) * 512, 0);
    if end {
        out.extend_from_slice(&[0; 1024]);
    }
    out
}

/// The footer: an empty gzip member whose extra field names the TOC's offset.
pub fn footer(toc_offset: u64) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff];
    out.extend_from_slice(&26u16.to_le_bytes());
    out.extend_from_slice(b"SG");
    out.extend_from_slice(&22u16.to_le_bytes());
    out.extend_from_slice(format!("{toc_offset:016x}STARGZ").as_bytes());
    // An empty stored final block, then the CRC32 and length of nothing.
    out.extend_from_slice(&[1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
    debug_assert_eq!(out.len(), FOOTER_SIZE);
    out
}

/// `payload` as a zstd skippable frame: its magic, its length, itself.
fn skippable(payload: Vec<u8>) -> Vec<u8> {
    let mut frame = Vec::with_capacity(payload.len() + 8);
    frame.extend_from_slice(&SKIPPABLE_MAGIC);
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend(payload);
    frame
}

/// The zstd:chunked footer: the compressed TOC's offset, its compressed and raw lengths,
/// the manifest type, the magic.
fn zstd_footer(toc_offset: u64, compressed: u64, raw: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(ZSTD_FOOTER_SIZE);
    for n in [toc_offset, compressed, raw, MANIFEST_TYPE_CRFS] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(ZSTD_CHUNKED_MAGIC);
    out
}

/// The TOC offset a footer names; None for bytes that are not an eStargz footer.
pub fn toc_offset(footer: &[u8]) -> Option<u64> {
    if footer.len() != FOOTER_SIZE || footer[..4] != [0x1f, 0x8b, 8, 4] || &footer[12..14] != b"SG"
    {
        return None;
    }
    let text = std::str::from_utf8(&footer[16..38]).ok()?;
    let hex = text.strip_suffix("STARGZ")?;
    u64::from_str_radix(hex, 16).ok()
}

/// Checks an eStargz blob's table of contents against the digest its descriptor gives: the
/// footer names where the TOC is, its member holds one tar entry, `stargz.index.json`, whose
/// bytes must hash to `want`. Says what was found, or why it does not match.
pub fn check_toc(blob: &std::path::Path, want: &str) -> Result<String, String> {
    let (json, at) = toc_json(blob)?;
    let got = Digest::of(&json);
    if got.as_str() != want {
        return Err(format!(
            "the TOC hashes to {got}, the descriptor says {want}"
        ));
    }
    Ok(format!("TOC {got} ({} bytes at {at})", json.len()))
}

/// The TOC's JSON as the blob's footer places it, and its offset.
fn toc_json(blob: &std::path::Path) -> Result<(Vec<u8>, u64), String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(blob).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if let Some(found) = zstd_chunked_toc(&mut file, len)? {
        return Ok(found);
    }
    if len < FOOTER_SIZE as u64 {
        return Err(format!("{len} bytes: too short for an eStargz footer"));
    }
    let mut footer = [0u8; FOOTER_SIZE];
    file.seek(SeekFrom::Start(len - FOOTER_SIZE as u64))
        .and_then(|_| file.read_exact(&mut footer))
        .map_err(|e| e.to_string())?;
    let at = toc_offset(&footer).ok_or("the last 51 bytes are not an eStargz footer")?;
    if at >= len - FOOTER_SIZE as u64 {
        return Err(format!(
            "the footer puts the TOC at {at}, past the blob's end"
        ));
    }
    file.seek(SeekFrom::Start(at)).map_err(|e| e.to_string())?;
    let member = flate2::read::GzDecoder::new(file.take(len - FOOTER_SIZE as u64 - at));
    let mut archive = tar::Archive::new(member);
    let mut entry = archive
        .entries()
        .and_then(|mut e| e.next().transpose())
        .map_err(|e| format!("the TOC at {at}: {e}"))?
        .ok_or_else(|| format!("no TOC entry at {at}"))?;
    let name = entry
        .path()
        .map_err(|e| e.to_string())?
        .display()
        .to_string();
    if name != TOC_NAME {
        return Err(format!("the entry at {at} is `{name}`, not {TOC_NAME}"));
    }
    let size = entry.size();
    let mut json = Vec::new();
    entry
        .read_to_end(&mut json)
        .map_err(|e| format!("the TOC at {at}: {e}"))?;
    // The member is read alone, as the snapshotter reads it: one that ends inside the
    // entry is a TOC split across members, which the snapshotter cannot decode.
    if (json.len() as u64) < size {
        return Err(format!(
            "the TOC's gzip member at {at} ends {} bytes into its {size}-byte entry: \
             the snapshotter reads the TOC as one member",
            json.len()
        ));
    }
    Ok((json, at))
}

/// The TOC's JSON of a zstd:chunked blob and its offset; None for a blob whose last 40 bytes
/// are not a zstd:chunked footer.
fn zstd_chunked_toc(file: &mut std::fs::File, len: u64) -> Result<Option<(Vec<u8>, u64)>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let footer_at = len.saturating_sub(ZSTD_FOOTER_SIZE as u64);
    let mut footer = [0u8; ZSTD_FOOTER_SIZE];
    if len < ZSTD_FOOTER_SIZE as u64
        || file
            .seek(SeekFrom::Start(footer_at))
            .and_then(|_| file.read_exact(&mut footer))
            .is_err()
        || &footer[32..] != ZSTD_CHUNKED_MAGIC
    {
        return Ok(None);
    }
    let field = |i: usize| u64::from_le_bytes(footer[i * 8..i * 8 + 8].try_into().expect("8"));
    let (at, compressed, raw) = (field(0), field(1), field(2));
    if at.checked_add(compressed).is_none_or(|end| end > footer_at) {
        return Err(format!(
            "the zstd:chunked footer puts {compressed} bytes of TOC at {at}, past the blob's end"
        ));
    }
    let mut packed = vec![0; compressed as usize];
    file.seek(SeekFrom::Start(at))
        .and_then(|_| file.read_exact(&mut packed))
        .map_err(|e| e.to_string())?;
    let json = zstd::stream::decode_all(&packed[..])
        .map_err(|e| format!("the zstd:chunked TOC at {at}: {e}"))?;
    if json.len() as u64 != raw {
        return Err(format!(
            "the zstd:chunked TOC at {at} inflates to {} bytes, the footer says {raw}",
            json.len()
        ));
    }
    Ok(Some((json, at)))
}

/// What the stargz snapshotter prefetches of a layer before its container starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PrefetchSize {
    /// Bytes of the blob: the offset of `.prefetch.landmark`, 0 with `.no.prefetch.landmark`.
    pub bytes: u64,
    /// The regular files before the landmark.
    pub files: usize,
}

/// The prefetch of the eStargz blob at `blob`, read from its TOC (not checked against a
/// descriptor: [`check_toc`] does that); None for a layer with no landmark, which the
/// snapshotter prefetches by its own configured size.
pub fn prefetch_size(blob: &std::path::Path) -> Result<Option<PrefetchSize>, String> {
    #[derive(serde::Deserialize)]
    struct Toc {
        entries: Vec<TocEntry>,
    }
    #[derive(serde::Deserialize)]
    struct TocEntry {
        name: Option<String>,
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        offset: u64,
    }
    let (json, at) = toc_json(blob)?;
    let toc: Toc = serde_json::from_slice(&json).map_err(|e| format!("the TOC at {at}: {e}"))?;
    let mut files = 0;
    for e in &toc.entries {
        match e.name.as_deref() {
            Some(NO_PREFETCH_LANDMARK) => return Ok(Some(PrefetchSize { bytes: 0, files: 0 })),
            Some(PREFETCH_LANDMARK) => {
                return Ok(Some(PrefetchSize {
                    bytes: e.offset,
                    files,
                }));
            }
            _ if e.kind == "reg" => files += 1,
            _ => {}
        }
    }
    Ok(None)
}

fn prefixed(hash: Sha256) -> String {
    format!("sha256:{}", hex::encode(hash.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estargz_of(tar: &[u8]) -> (Vec<u8>, Toc) {
        let mut blob = Vec::new();
        let toc = convert(tar, &mut blob).unwrap();
        (blob, toc)
    }

    #[test]
    fn the_footer_is_51_bytes_and_names_the_toc() {
        let f = footer(0x3507f74);
        assert_eq!(
            hex::encode(&f),
            "1f8b08040000000000ff1a00534716003030303030303030303335303766373453544152475a\
             010000ffff0000000000000000"
        );
        assert_eq!(toc_offset(&f), Some(0x3507f74));
        let mut inflated = Vec::new();
        io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&f[..]), &mut inflated).unwrap();
        assert!(inflated.is_empty());
    }

    #[test]
    fn the_stream_inflates_to_the_entries_the_landmark_and_the_toc() {
        let mut tar = tar::Builder::new(Vec::new());
        let big: Vec<u8> = (0..(CHUNK as usize * 2 + 1000))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        for (name, data) in [
            ("a/small", &b"hello"[..]),
            ("a/empty", &b""[..]),
            ("big", &big),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o4755);
            h.set_mtime(1_700_000_000);
            h.set_cksum();
            tar.append_data(&mut h, name, data).unwrap();
        }
        let tar = tar.into_inner().unwrap();
        let (blob, toc) = estargz_of(&tar);

        let mut inflated = Vec::new();
        io::Read::read_to_end(
            &mut flate2::read::MultiGzDecoder::new(&blob[..]),
            &mut inflated,
        )
        .unwrap();
        assert_eq!(inflated.len() as u64, toc.uncompressed_size);
        let names: Vec<String> = tar::Archive::new(&inflated[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [NO_PREFETCH_LANDMARK, "a/small", "a/empty", "big", TOC_NAME]
        );

        let at = toc_offset(&blob[blob.len() - FOOTER_SIZE..]).unwrap() as usize;
        let mut toc_tar = Vec::new();
        io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&blob[at..]), &mut toc_tar)
            .unwrap();
        let mut archive = tar::Archive::new(&toc_tar[..]);
        let mut entry = archive.entries().unwrap().next().unwrap().unwrap();
        let mut json = Vec::new();
        io::Read::read_to_end(&mut entry, &mut json).unwrap();
        assert_eq!(Digest::of(&json), toc.digest);
        let toc: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let entries = toc["entries"].as_array().unwrap();
        let kinds: Vec<&str> = entries
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["reg", "reg", "reg", "reg", "chunk", "chunk"]);
        // Every chunk's offset starts a member that inflates to the chunk's bytes.
        let big_entries = &entries[3..];
        for (i, e) in big_entries.iter().enumerate() {
            let offset = e["offset"].as_u64().unwrap() as usize;
            assert_eq!(&blob[offset..offset + 2], [0x1f, 0x8b]);
            let start = i * CHUNK as usize;
            let len = if i < 2 { CHUNK as usize } else { 1000 };
            let mut got = vec![0; len];
            io::Read::read_exact(&mut flate2::read::GzDecoder::new(&blob[offset..]), &mut got)
                .unwrap();
            assert_eq!(got, big[start..start + len]);
            let digest = format!("sha256:{}", hex::encode(Sha256::digest(&got)));
            assert_eq!(e["chunkDigest"], digest.as_str());
        }
        assert_eq!(entries[3]["mode"], 0o4755);
        assert_eq!(entries[3]["chunkSize"], CHUNK);
        assert_eq!(entries[5]["chunkOffset"], 2 * CHUNK);
        assert!(entries[5].get("chunkSize").is_none());
        assert_eq!(entries[2]["name"], "a/empty");
        assert!(
            entries[2].get("offset").is_none(),
            "an empty file has no payload"
        );
        assert_eq!(entries[1]["modtime"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn long_names_links_and_xattrs_come_from_their_extension_headers() {
        let long = format!("dir/{}/ünïcödé", "x".repeat(150));
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_cksum();
        tar.append_data(&mut h, &long, &b"abc"[..]).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_cksum();
        tar.append_link(&mut h, "link", "y".repeat(120)).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Link);
        h.set_size(0);
        h.set_cksum();
        tar.append_link(&mut h, "hard", format!("./{long}"))
            .unwrap();
        tar.append_pax_extensions([("SCHILY.xattr.user.k", &b"v\x00w"[..])])
            .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_cksum();
        tar.append_data(&mut h, "d/", io::empty()).unwrap();
        let (blob, _) = estargz_of(&tar.into_inner().unwrap());
        let at = toc_offset(&blob[blob.len() - FOOTER_SIZE..]).unwrap() as usize;
        let mut toc_tar = Vec::new();
        io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&blob[at..]), &mut toc_tar)
            .unwrap();
        let json = &toc_tar[512..];
        let end = json.iter().position(|&b| b == 0).unwrap();
        let toc: serde_json::Value = serde_json::from_slice(&json[..end]).unwrap();
        let e = &toc["entries"];
        assert_eq!(e[1]["name"], long.as_str());
        assert_eq!(e[2]["type"], "symlink");
        assert_eq!(e[2]["linkName"], "y".repeat(120).as_str());
        assert_eq!(e[3]["type"], "hardlink");
        assert_eq!(e[3]["linkName"], long.as_str());
        assert_eq!(e[4]["name"], "d");
        assert_eq!(e[4]["xattrs"]["user.k"], "dgB3");
    }

    /// An eStargz layer framed again (a lazily pulled base rewritten for another format, or
    /// another tool's layer) keeps its files and drops its old TOC and landmarks, even one
    /// behind an extension header, so the stream holds one landmark: the new one.
    #[test]
    fn a_layer_framed_before_keeps_its_files_and_drops_its_old_toc_and_landmarks() {
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_cksum();
        tar.append_data(&mut h, "keep/me", &b"hello"[..]).unwrap();
        let mut old = tar.into_inner().unwrap();
        old.truncate(old.len() - 1024);
        let (blob, _) = estargz_of(&old);
        let mut inflated = Vec::new();
        io::Read::read_to_end(
            &mut flate2::read::MultiGzDecoder::new(&blob[..]),
            &mut inflated,
        )
        .unwrap();
        // A prefetch landmark behind a PAX header, as another tool may write it.
        let mut pax = tar::Builder::new(Vec::new());
        pax.append_pax_extensions([("SCHILY.xattr.user.k", &b"v"[..])])
            .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_size(1);
        h.set_cksum();
        pax.append_data(&mut h, "./.prefetch.landmark", &[0xf][..])
            .unwrap();
        let mut twice = pax.into_inner().unwrap();
        twice.truncate(twice.len() - 1024);
        twice.extend_from_slice(&inflated);

        let (again, toc) = estargz_of(&twice);
        let mut out = Vec::new();
        io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&again[..]), &mut out)
            .unwrap();
        assert_eq!(out.len() as u64, toc.uncompressed_size);
        let names: Vec<String> = tar::Archive::new(&out[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, [NO_PREFETCH_LANDMARK, "keep/me", TOC_NAME]);
        // No extension header of the dropped landmark is left to apply to another entry.
        let mut archive = tar::Archive::new(&out[..]);
        let mut entries = archive.entries().unwrap();
        let _landmark = entries.next().unwrap().unwrap();
        let mut kept = entries.next().unwrap().unwrap();
        assert!(kept.pax_extensions().unwrap().is_none());
    }

    #[test]
    fn zstd_chunked_puts_the_toc_and_footer_in_skippable_frames() {
        let footer = zstd_footer(0x1234, 77, 300);
        assert_eq!(footer.len(), ZSTD_FOOTER_SIZE);
        assert_eq!(&footer[..8], 0x1234u64.to_le_bytes());
        assert_eq!(&footer[8..16], 77u64.to_le_bytes());
        assert_eq!(&footer[16..24], 300u64.to_le_bytes());
        assert_eq!(&footer[24..32], 1u64.to_le_bytes());
        // The magic as the stargz reader spells it (zstdchunked.go: zstdChunkedFrameMagic).
        assert_eq!(
            footer[32..],
            [0x47, 0x6e, 0x55, 0x6c, 0x49, 0x6e, 0x55, 0x78]
        );
        let frame = skippable(footer);
        assert_eq!(frame[..8], [0x50, 0x2a, 0x4d, 0x18, 40, 0, 0, 0]);
        // A zstd reader skips it: it inflates to nothing.
        assert!(zstd::stream::decode_all(&frame[..]).unwrap().is_empty());
    }

    #[test]
    fn a_stream_cut_short_is_refused() {
        let cut = &single_file("x", b"abc", false)[..600];
        let e = convert(cut, Vec::new()).unwrap_err();
        assert!(e.to_string().contains("inside an entry"), "{e}");
    }
}
