//! An image's files as its layers leave them, read in one pass and held in memory: what the
//! static checks read (the link closure, the pins against the content), without writing the
//! gigabytes of an image to disk. Layers apply in order as [`super::unpack`] applies them
//! (whiteouts, opaque directories, a file replacing a directory, parents through links), but
//! a regular file keeps only its facts: its size, what its ELF header and dynamic section say
//! (read as the bytes stream past, from the head, the tail and the dynamic segment), the
//! `PyInit_` symbol a would-be extension module defines, the version a libnccl reports, and
//! the bytes of the few files checks read by name (under /etc, `*.dist-info/METADATA`, paths
//! the config's `Env` names).
//!
//! Nothing is guessed: an ELF file whose dynamic strings lie outside what was kept is read
//! again from its layer with those ranges kept, and a check that reads a file whose bytes were
//! not kept is answered by [`Scanned::answer`] after another pass that keeps them.

use super::links::{ElfInfo, Entry, Listing, Module, Tree};
use super::model::Image;
use crate::error::{Error, Result};
use object::read::elf::{FileHeader, ProgramHeader};
use object::{ReadRef, elf};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Files up to this size are read whole (and dropped once their facts are taken).
const WHOLE: u64 = 32 << 20;
/// Of a larger ELF file, the head and the tail are kept: GNU ld puts the dynamic symbols and
/// strings at the head, patchelf moves them to the end, and the section headers are last.
const HEAD: u64 = 16 << 20;
const TAIL: u64 = 16 << 20;
/// The bytes of a file kept for the checks that read it by name, at most.
const KEPT: u64 = 1 << 20;
/// The chunk a file is read in.
const CHUNK: usize = 1 << 20;

/// An image's file tree in memory; see the module's text.
pub struct Scanned {
    nodes: BTreeMap<String, Node>,
    /// The config's `Env`.
    pub env: Vec<(String, String)>,
    /// Absolute paths the config's `Env` names: files a check may read by that name.
    named: BTreeSet<String>,
    /// Files a check read whose bytes were not kept.
    missed: RefCell<BTreeSet<String>>,
    /// ELF files to read again, by layer, with the ranges of them still missing.
    pending: BTreeMap<usize, Again>,
}

#[derive(Clone)]
enum Node {
    Dir,
    Link(String),
    /// A regular file (hard links share one), or a device, a FIFO (no facts).
    File(Option<Arc<Facts>>),
}

/// What the checks need of one regular file.
#[derive(Debug, Default)]
struct Facts {
    /// The layer that wrote it and its path there: where another pass finds its bytes.
    layer: usize,
    entry: String,
    elf: Option<ElfInfo>,
    /// For a bare `.so` where CPython's importer looks: whether it defines its `PyInit_`.
    module_init: bool,
    /// For a libnccl: the version its banner carries, if any.
    nccl: Option<Option<String>>,
    content: Option<Vec<u8>>,
}

/// What another pass over a layer must keep of an entry, by its path there.
#[derive(Default)]
struct Again {
    ranges: BTreeMap<String, Vec<Range<u64>>>,
    content: BTreeSet<String>,
}

impl Scanned {
    /// Reads every layer of `image` in one pass that also checks it, going on past a layer
    /// that does not read: each layer's own result (its blob digest and diff id checked while
    /// it is read). What lies above a bad layer may be missing from the tree.
    pub fn checked(image: &Image) -> Result<(Self, Vec<std::result::Result<(), String>>)> {
        let env = image
            .typed_config()
            .map(|c| c.env_pairs())
            .unwrap_or_default();
        let mut scanned = Scanned::empty(env);
        let layers = image.layers();
        let progress = crate::progress::Progress::new(
            "reading the layers",
            crate::progress::Unit::Bytes,
            Some(layers.iter().map(|l| l.size()).sum()),
        );
        let mut results = Vec::with_capacity(layers.len());
        for (index, layer) in layers.iter().enumerate() {
            results.push(layer.read_tar(true, |archive, end| {
                for entry in archive.entries()? {
                    let mut entry = entry?;
                    end.saw(&entry);
                    scanned.apply(index, &mut entry)?;
                }
                end.check()
            }));
            progress.inc(layer.size());
        }
        progress.finish();
        scanned.complete_elf_files(image)?;
        Ok((scanned, results))
    }

    /// Reads every layer of `image`; the first that does not read is an error.
    pub fn of(image: &Image) -> Result<Self> {
        let (scanned, layers) = Self::checked(image)?;
        match layers.into_iter().find_map(|r| r.err()) {
            Some(e) => Err(Error::image(image.describe(), e)),
            None => Ok(scanned),
        }
    }

    fn empty(env: Vec<(String, String)>) -> Self {
        let named = env
            .iter()
            .flat_map(|(_, v)| v.split(':'))
            .filter(|p| p.starts_with('/'))
            .map(str::to_string)
            .collect();
        let mut nodes = BTreeMap::new();
        nodes.insert("/".to_string(), Node::Dir);
        Scanned {
            nodes,
            env,
            named,
            missed: RefCell::default(),
            pending: BTreeMap::new(),
        }
    }

    /// Runs `check` on this tree; when it read a file whose bytes were not kept, reads them
    /// from their layers and runs it again, so no check is answered from a missing file.
    pub fn answer<T>(&mut self, image: &Image, check: impl Fn(&Scanned) -> T) -> Result<T> {
        for _ in 0..4 {
            self.missed.borrow_mut().clear();
            let out = check(self);
            let missed = std::mem::take(&mut *self.missed.borrow_mut());
            if missed.is_empty() {
                return Ok(out);
            }
            let mut again: BTreeMap<usize, Again> = BTreeMap::new();
            for path in missed {
                if let Some(Node::File(Some(facts))) = self.nodes.get(&path) {
                    again
                        .entry(facts.layer)
                        .or_default()
                        .content
                        .insert(facts.entry.clone());
                }
            }
            self.read_again(image, again)?;
        }
        Err(Error::image(
            image.describe(),
            "a check kept asking for files the scan of its layers had not kept",
        ))
    }

    /// The link closure of `image` (for `platform`, else its default one).
    pub fn links_of(
        image: &crate::image::Transport,
        platform: Option<&crate::image::Platform>,
    ) -> Result<super::links::LinkReport> {
        let image = image.open_platform(platform)?;
        let mut scanned = Scanned::of(&image)?;
        scanned.answer(&image, |tree| super::links::analyze_tree(tree, &tree.env))?
    }

    /// The regular files whose names say they are libnccl, with the version each reports.
    pub fn nccl_libraries(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.nodes.iter().filter_map(|(path, node)| match node {
            Node::File(Some(facts)) => facts.nccl.as_ref().map(|v| (path.as_str(), v.as_deref())),
            _ => None,
        })
    }

    /// Applies one entry of layer `index`.
    fn apply<R: Read>(
        &mut self,
        index: usize,
        entry: &mut tar::Entry<'_, R>,
    ) -> std::io::Result<()> {
        let raw = entry.path()?.into_owned();
        let inside = super::unpack::within(&raw).ok_or_else(|| {
            std::io::Error::other(format!("entry `{}` escapes the root", raw.display()))
        })?;
        let entry_path = inside.to_string_lossy().into_owned();
        let (parent, name) = match entry_path.rsplit_once('/') {
            Some((p, n)) => (p.to_string(), n.to_string()),
            None => (String::new(), entry_path.clone()),
        };
        if name.is_empty() {
            return Ok(());
        }
        let parent = self.make_dirs(&parent)?;
        if name == OPAQUE {
            self.remove_below(&parent);
            return Ok(());
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            self.remove(&join(&parent, hidden));
            return Ok(());
        }
        let path = join(&parent, &name);
        let kind = entry.header().entry_type();
        let is_dir = kind.is_dir();
        if !(is_dir && matches!(self.nodes.get(&path), Some(Node::Dir))) {
            self.remove(&path);
        }
        let node = if is_dir {
            Node::Dir
        } else if kind.is_symlink() {
            let target = entry.link_name()?.unwrap_or_default();
            Node::Link(target.to_string_lossy().into_owned())
        } else if kind.is_hard_link() {
            let target = entry.link_name()?.unwrap_or_default();
            let target = super::unpack::within(&target).unwrap_or_default();
            let target = format!("/{}", target.to_string_lossy());
            match super::links::real_path(self, &target).and_then(|r| self.nodes.get(&r)) {
                Some(node @ Node::File(_)) => node.clone(),
                _ => {
                    return Err(std::io::Error::other(format!(
                        "entry `{entry_path}` links to `{target}`, which is not a file"
                    )));
                }
            }
        } else if kind.is_file() || kind.is_gnu_sparse() || kind == tar::EntryType::Continuous {
            let keep = Keep {
                ranges: &[],
                content: self.keeps_content(&path, entry.size()),
            };
            let facts = self.take(index, &entry_path, {
                let size = entry.size();
                facts_of(entry, size, &path, keep)?
            });
            Node::File(Some(Arc::new(facts)))
        } else {
            Node::File(None)
        };
        self.nodes.insert(path, node);
        Ok(())
    }

    /// Whether a file's bytes are kept as it streams past: the small files checks read by
    /// name. Any other a check reads is read again by [`Scanned::answer`].
    fn keeps_content(&self, path: &str, size: u64) -> bool {
        size <= KEPT
            && (path.starts_with("/etc/")
                || path.ends_with(".dist-info/METADATA")
                || self.named.contains(path))
    }

    /// The real path of directory `parent` (relative, as in a layer), made where missing as
    /// a runtime's unpacking makes it; an error where a file stands in its way.
    fn make_dirs(&mut self, parent: &str) -> std::io::Result<String> {
        self.make_dirs_at(parent, 0)
    }

    fn make_dirs_at(&mut self, parent: &str, depth: usize) -> std::io::Result<String> {
        let mut real = String::new();
        for part in parent.split('/').filter(|p| !p.is_empty()) {
            let next = join(&real, part);
            let resolved = match (super::links::real_path(self, &next), self.nodes.get(&next)) {
                (Some(r), _) => r,
                // A link to nothing yet: the directories are made where it points.
                (None, Some(Node::Link(target))) if depth < 40 => {
                    let target = if target.starts_with('/') {
                        target.clone()
                    } else {
                        join(&real, target)
                    };
                    self.make_dirs_at(&target, depth + 1)?
                }
                (None, _) => {
                    self.nodes.insert(next.clone(), Node::Dir);
                    next
                }
            };
            if !matches!(self.nodes.get(&resolved), Some(Node::Dir)) {
                return Err(std::io::Error::other(format!(
                    "`{parent}` is not a directory in the layers below"
                )));
            }
            real = resolved;
        }
        Ok(real)
    }

    /// Removes `path` and everything below it.
    fn remove(&mut self, path: &str) {
        self.nodes.remove(path);
        self.remove_below(path);
    }

    /// Removes everything below directory `path`, keeping it.
    fn remove_below(&mut self, path: &str) {
        let from = format!("{}/", path.trim_end_matches('/'));
        let to = format!("{}0", path.trim_end_matches('/'));
        let below: Vec<String> = self.nodes.range(from..to).map(|(k, _)| k.clone()).collect();
        for k in below {
            self.nodes.remove(&k);
        }
    }

    /// Reads again, from their layers, the ELF files whose dynamic section or strings lay
    /// outside what was kept, until every one is whole.
    fn complete_elf_files(&mut self, image: &Image) -> Result<()> {
        for _ in 0..4 {
            let again = std::mem::take(&mut self.pending);
            if again.is_empty() {
                return Ok(());
            }
            self.read_again(image, again)?;
        }
        Err(Error::image(
            image.describe(),
            format!(
                "the dynamic section of {} could not be read whole",
                self.pending
                    .values()
                    .flat_map(|a| a.ranges.keys())
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ))
    }

    /// Reads layers again, keeping what `again` asks of their entries, and puts the new facts
    /// in place of the old wherever the old ones still stand.
    fn read_again(&mut self, image: &Image, again: BTreeMap<usize, Again>) -> Result<()> {
        let layers = image.layers();
        for (index, wanted) in again {
            let Some(layer) = layers.get(index) else {
                continue;
            };
            let mut fresh: Vec<(String, Taken)> = Vec::new();
            layer
                .read_tar(false, |archive, end| {
                    for entry in archive.entries()? {
                        let mut entry = entry?;
                        end.saw(&entry);
                        let raw = entry.path()?.into_owned();
                        let Some(inside) = super::unpack::within(&raw) else {
                            continue;
                        };
                        let name = inside.to_string_lossy().into_owned();
                        let ranges = wanted.ranges.get(&name);
                        let content = wanted.content.contains(&name);
                        if ranges.is_none() && !content {
                            continue;
                        }
                        let keep = Keep {
                            ranges: ranges.map(Vec::as_slice).unwrap_or_default(),
                            content,
                        };
                        let path = format!("/{name}");
                        let mut taken = {
                            let size = entry.size();
                            facts_of(&mut entry, size, &path, keep)?
                        };
                        if !taken.gaps.is_empty() {
                            // Keep what was asked and what is still missing, next time.
                            taken.gaps.extend(keep.ranges.iter().cloned());
                        }
                        fresh.push((name, taken));
                    }
                    Ok(())
                })
                .map_err(|e| Error::image(image.describe(), e))?;
            for (name, taken) in fresh {
                let facts = Arc::new(self.take(index, &name, taken));
                for node in self.nodes.values_mut() {
                    if let Node::File(Some(old)) = node
                        && old.layer == index
                        && old.entry == name
                    {
                        *node = Node::File(Some(facts.clone()));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Scanned {
    /// The facts of what [`facts_of`] took of entry `entry` of layer `layer`, noting the
    /// ranges it still misses for another pass.
    fn take(&mut self, layer: usize, entry: &str, taken: Taken) -> Facts {
        if !taken.gaps.is_empty() {
            self.pending
                .entry(layer)
                .or_default()
                .ranges
                .insert(entry.to_string(), taken.gaps);
        }
        Facts {
            layer,
            entry: entry.to_string(),
            ..taken.facts
        }
    }
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// What to keep of a file as it streams past, beyond what its facts need.
#[derive(Clone, Copy)]
struct Keep<'a> {
    /// Ranges of a large ELF file an earlier pass found missing.
    ranges: &'a [Range<u64>],
    /// Its bytes, for a check that reads it (a file of up to [`WHOLE`] bytes).
    content: bool,
}

/// A file's facts, and the ranges of it that were needed and not kept.
struct Taken {
    facts: Facts,
    gaps: Vec<Range<u64>>,
}

/// Reads a regular file's bytes once (`size` of them) and takes its facts; it is at `path`.
fn facts_of(file: &mut impl Read, size: u64, path: &str, keep: Keep) -> std::io::Result<Taken> {
    let name = path.rsplit('/').next().unwrap_or_default();
    let mut banner = name.starts_with("libnccl.so").then(NcclBanner::default);
    let mut facts = Facts::default();
    let mut gaps = Vec::new();
    if size <= WHOLE {
        let mut bytes = Vec::with_capacity(size as usize);
        file.read_to_end(&mut bytes)?;
        if let Some(b) = banner.as_mut() {
            b.feed(&bytes);
        }
        let data: &[u8] = &bytes;
        facts.elf = super::links::elf_info(data, bytes.len() as u64);
        if facts.elf.is_some()
            && let Some(Module::Bare(init)) = super::links::module_name(path)
        {
            facts.module_init = super::links::defines_in(data, &init).unwrap_or(false);
        }
        if keep.content {
            facts.content = Some(bytes);
        }
    } else {
        let mut sieve = Sieve::new(size, keep.ranges);
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let n = file.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            sieve.feed(&chunk[..n]);
            if let Some(b) = banner.as_mut() {
                b.feed(&chunk[..n]);
            }
        }
        let sparse = sieve.into_sparse();
        if sparse.is_elf() {
            facts.elf = super::links::elf_info(&sparse, size);
            if facts.elf.is_some()
                && let Some(Module::Bare(init)) = super::links::module_name(path)
            {
                facts.module_init = super::links::defines_in(&sparse, &init).unwrap_or(false);
            }
            gaps = sparse.missed.into_inner();
        }
    }
    facts.nccl = banner.map(NcclBanner::finish);
    Ok(Taken { facts, gaps })
}

/// The ranges of a large file kept as its bytes stream past: its head and tail, what its
/// program headers point at (the dynamic segment, the section headers), and what an earlier
/// pass found missing.
struct Sieve {
    size: u64,
    wanted: Vec<Range<u64>>,
    parts: Vec<(u64, Vec<u8>)>,
    head: u64,
    at: u64,
    looked: bool,
}

impl Sieve {
    fn new(size: u64, extra: &[Range<u64>]) -> Sieve {
        Sieve::with(size, HEAD, TAIL, extra)
    }

    fn with(size: u64, head: u64, tail: u64, extra: &[Range<u64>]) -> Sieve {
        let mut sieve = Sieve {
            size,
            wanted: Vec::new(),
            parts: Vec::new(),
            head,
            at: 0,
            looked: false,
        };
        sieve.want(0..head);
        sieve.want(size.saturating_sub(tail)..size);
        for r in extra {
            sieve.want(r.clone());
        }
        sieve
    }

    /// Adds `range` (cut to the file) to what is kept, merged with the rest.
    fn want(&mut self, range: Range<u64>) {
        let range = range.start.min(self.size)..range.end.min(self.size);
        if range.is_empty() {
            return;
        }
        self.wanted.push(range);
        self.wanted.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(self.wanted.len());
        for r in self.wanted.drain(..) {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        self.wanted = merged;
    }

    fn feed(&mut self, bytes: &[u8]) {
        let (start, end) = (self.at, self.at + bytes.len() as u64);
        for i in 0..self.wanted.len() {
            let r = &self.wanted[i];
            let (lo, hi) = (r.start.max(start), r.end.min(end));
            if lo < hi {
                let slice = &bytes[(lo - start) as usize..(hi - start) as usize];
                match self.parts.last_mut() {
                    Some((at, part)) if *at + part.len() as u64 == lo => {
                        part.extend_from_slice(slice)
                    }
                    _ => self.parts.push((lo, slice.to_vec())),
                }
            }
        }
        self.at = end;
        if !self.looked && self.at >= self.head.min(self.size) {
            self.looked = true;
            for r in self.pointed_at() {
                self.want(r);
            }
        }
    }

    /// What the ELF header and program headers in the head point at: the dynamic segment,
    /// the interpreter's name and the section header table.
    fn pointed_at(&self) -> Vec<Range<u64>> {
        fn of<H: FileHeader<Endian = object::Endianness>>(head: &[u8]) -> Option<Vec<Range<u64>>> {
            let header = H::parse(head).ok()?;
            let endian = header.endian().ok()?;
            let mut out = Vec::new();
            for ph in header.program_headers(endian, head).ok()? {
                let kind = ph.p_type(endian);
                if kind == elf::PT_DYNAMIC || kind == elf::PT_INTERP {
                    let offset: u64 = ph.p_offset(endian).into();
                    let size: u64 = ph.p_filesz(endian).into();
                    out.push(offset..offset + size);
                }
            }
            let shoff: u64 = header.e_shoff(endian).into();
            let table = u64::from(header.e_shnum(endian)) * u64::from(header.e_shentsize(endian));
            out.push(shoff..shoff + table);
            Some(out)
        }
        let Some((0, head)) = self.parts.first() else {
            return Vec::new();
        };
        match object::FileKind::parse(head.as_slice()) {
            Ok(object::FileKind::Elf64) => of::<elf::FileHeader64<object::Endianness>>(head),
            Ok(object::FileKind::Elf32) => of::<elf::FileHeader32<object::Endianness>>(head),
            _ => None,
        }
        .unwrap_or_default()
    }

    fn into_sparse(self) -> Sparse {
        Sparse {
            size: self.size,
            parts: self.parts,
            missed: RefCell::default(),
        }
    }
}

/// A file of which only some ranges are held; a read outside them fails and is noted, so the
/// file can be read again with them.
struct Sparse {
    size: u64,
    parts: Vec<(u64, Vec<u8>)>,
    missed: RefCell<Vec<Range<u64>>>,
}

impl Sparse {
    fn is_elf(&self) -> bool {
        matches!(self.parts.first(), Some((0, head)) if head.starts_with(b"\x7fELF"))
    }

    /// The held part `offset` falls in.
    fn part(&self, offset: u64) -> Option<&(u64, Vec<u8>)> {
        let i = self.parts.partition_point(|(at, _)| *at <= offset);
        let part = self.parts.get(i.checked_sub(1)?)?;
        (offset < part.0 + part.1.len() as u64).then_some(part)
    }

    fn miss(&self, range: Range<u64>) {
        let range = range.start.min(self.size)..range.end.min(self.size);
        if !range.is_empty() {
            self.missed.borrow_mut().push(range);
        }
    }
}

/// A string is looked for this far past a held part's end.
const STRING_REACH: u64 = 64 << 10;

impl<'a> ReadRef<'a> for &'a Sparse {
    fn len(self) -> std::result::Result<u64, ()> {
        Ok(self.size)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> std::result::Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        let end = offset.checked_add(size).ok_or(())?;
        match self.part(offset) {
            Some((at, part)) if end <= at + part.len() as u64 => {
                Ok(&part[(offset - at) as usize..(end - at) as usize])
            }
            _ => {
                self.miss(offset..end);
                Err(())
            }
        }
    }

    fn read_bytes_at_until(
        self,
        range: Range<u64>,
        delimiter: u8,
    ) -> std::result::Result<&'a [u8], ()> {
        let Some((at, part)) = self.part(range.start) else {
            self.miss(range.start..range.end.min(range.start + STRING_REACH));
            return Err(());
        };
        let part_end = at + part.len() as u64;
        let from = (range.start - at) as usize;
        let to = (range.end.min(part_end) - at) as usize;
        match memchr::memchr(delimiter, &part[from..to]) {
            Some(i) => Ok(&part[from..from + i]),
            None if part_end < range.end => {
                self.miss(part_end..range.end.min(part_end + STRING_REACH));
                Err(())
            }
            None => Err(()),
        }
    }
}

/// The version a libnccl's banner (`NCCL version 2.27.5+cuda12.9`) carries, found as the
/// library's bytes stream past.
#[derive(Default)]
struct NcclBanner {
    /// The last bytes seen, in case the banner straddles two chunks.
    tail: Vec<u8>,
    /// The bytes after the banner's words, once found.
    after: Option<Vec<u8>>,
}

impl NcclBanner {
    const WORDS: &'static [u8] = b"NCCL version ";
    const AFTER: usize = 32;

    fn feed(&mut self, bytes: &[u8]) {
        if let Some(after) = &mut self.after {
            let more = Self::AFTER.saturating_sub(after.len()).min(bytes.len());
            after.extend_from_slice(&bytes[..more]);
            return;
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(bytes);
        match memchr::memmem::find(&window, Self::WORDS) {
            Some(at) => {
                let rest = &window[at + Self::WORDS.len()..];
                self.after = Some(rest[..rest.len().min(Self::AFTER)].to_vec());
            }
            None => {
                let keep = (Self::WORDS.len() - 1).min(window.len());
                self.tail = window[window.len() - keep..].to_vec();
            }
        }
    }

    fn finish(self) -> Option<String> {
        let after = self.after?;
        let version: String = after
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .map(|b| *b as char)
            .collect();
        let version = version.trim_end_matches('.');
        (!version.is_empty()).then(|| version.to_string())
    }
}

impl Tree for Scanned {
    fn entry(&self, path: &str) -> Entry {
        match self.nodes.get(path) {
            None => Entry::Absent,
            Some(Node::Dir) => Entry::Dir,
            Some(Node::Link(target)) => Entry::Link(target.clone()),
            Some(Node::File(_)) => Entry::File,
        }
    }

    fn elf(&self, real: &str) -> Option<ElfInfo> {
        match self.nodes.get(real) {
            Some(Node::File(Some(facts))) => facts.elf.clone(),
            _ => None,
        }
    }

    fn read(&self, real: &str) -> std::io::Result<Vec<u8>> {
        match self.nodes.get(real) {
            Some(Node::File(Some(facts))) => match &facts.content {
                Some(bytes) => Ok(bytes.clone()),
                None => {
                    self.missed.borrow_mut().insert(real.to_string());
                    Err(std::io::Error::other(format!(
                        "{real}: its bytes were not kept from the layers"
                    )))
                }
            },
            Some(_) => Err(std::io::Error::other(format!("{real}: not a regular file"))),
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }
}

impl Listing for Scanned {
    fn files(&self) -> Result<Vec<String>> {
        let mut files: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| matches!(n, Node::File(Some(_))))
            .map(|(p, _)| p.clone())
            .collect();
        // A walk that sorts each directory's names: name by name, not byte by byte
        // (`/a/b` before `/a.b`).
        files.sort_by(|a, b| a.split('/').cmp(b.split('/')));
        Ok(files)
    }

    fn defines(&self, real: &str, symbol: &str) -> bool {
        let asked_at_scan = matches!(
            super::links::module_name(real),
            Some(Module::Bare(init)) if init == symbol
        );
        match self.nodes.get(real) {
            Some(Node::File(Some(facts))) if asked_at_scan => facts.module_init,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum Item<'a> {
        Dir(&'a str),
        File(&'a str, &'a [u8]),
        Link(&'a str, &'a str),
    }

    fn layer(items: &[Item]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for item in items {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o755);
            match item {
                Item::Dir(p) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    b.append_data(&mut h, p, std::io::empty()).unwrap();
                }
                Item::File(p, bytes) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(bytes.len() as u64);
                    b.append_data(&mut h, p, *bytes).unwrap();
                }
                Item::Link(p, target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    b.append_link(&mut h, p, target).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    fn scan(layers: &[Vec<u8>]) -> Scanned {
        let mut scanned = Scanned::empty(vec![("CONF".into(), "/opt/app.json".into())]);
        for (index, l) in layers.iter().enumerate() {
            let mut archive = tar::Archive::new(l.as_slice());
            for entry in archive.entries().unwrap() {
                scanned.apply(index, &mut entry.unwrap()).unwrap();
            }
        }
        scanned
    }

    fn kind(s: &Scanned, path: &str) -> Entry {
        s.entry(path)
    }

    #[test]
    fn layers_apply_as_a_runtime_unpacks_them() {
        let lower = layer(&[
            Item::Dir("usr/lib/"),
            Item::Link("lib", "usr/lib"),
            Item::File("usr/lib/a", b"a"),
            Item::File("usr/lib/b", b"b"),
            Item::Dir("opt/x/"),
            Item::File("opt/x/old", b"x"),
            Item::Dir("d/"),
            Item::File("d/inner", b"1"),
            Item::Link("dangling", "/made/here"),
        ]);
        let upper = layer(&[
            // Through the link into usr/lib, as usrmerge's layers do.
            Item::File("lib/c", b"c"),
            Item::File("usr/lib/.wh.a", b""),
            Item::File("opt/x/.wh..wh..opq", b""),
            Item::File("opt/x/new", b"n"),
            Item::File("d", b"now a file"),
            Item::File("dangling/f", b"f"),
        ]);
        let s = scan(&[lower, upper]);
        assert_eq!(kind(&s, "/usr/lib/c"), Entry::File);
        assert_eq!(kind(&s, "/lib"), Entry::Link("usr/lib".into()));
        assert_eq!(kind(&s, "/usr/lib/a"), Entry::Absent);
        assert_eq!(kind(&s, "/usr/lib/b"), Entry::File);
        assert_eq!(kind(&s, "/opt/x/old"), Entry::Absent);
        assert_eq!(kind(&s, "/opt/x/new"), Entry::File);
        assert_eq!(kind(&s, "/d"), Entry::File);
        assert_eq!(kind(&s, "/d/inner"), Entry::Absent);
        assert_eq!(kind(&s, "/made/here/f"), Entry::File);
        assert_eq!(
            s.files().unwrap(),
            [
                "/d",
                "/made/here/f",
                "/opt/x/new",
                "/usr/lib/b",
                "/usr/lib/c"
            ]
        );
    }

    #[test]
    fn a_file_under_a_file_is_refused() {
        let mut s = Scanned::empty(Vec::new());
        let l = layer(&[Item::File("f", b"1"), Item::File("f/g", b"2")]);
        let mut archive = tar::Archive::new(l.as_slice());
        let mut entries = archive.entries().unwrap();
        s.apply(0, &mut entries.next().unwrap().unwrap()).unwrap();
        assert!(s.apply(0, &mut entries.next().unwrap().unwrap()).is_err());
    }

    #[test]
    fn bytes_are_kept_for_files_read_by_name_and_a_read_of_others_is_noted() {
        let s = scan(&[layer(&[
            Item::File("etc/ld.so.conf", b"include /x/*.conf\n"),
            Item::File("opt/app.json", b"{}"),
            Item::File("opt/other.json", b"{}"),
            Item::File(
                "site/foo-1.0.dist-info/METADATA",
                b"Name: foo\nVersion: 1.0\n",
            ),
        ])]);
        assert_eq!(s.read("/etc/ld.so.conf").unwrap(), b"include /x/*.conf\n");
        assert_eq!(s.read("/opt/app.json").unwrap(), b"{}");
        assert!(s.read("/site/foo-1.0.dist-info/METADATA").is_ok());
        assert!(s.missed.borrow().is_empty());
        assert!(s.read("/opt/other.json").is_err());
        assert_eq!(
            s.missed.borrow().iter().collect::<Vec<_>>(),
            ["/opt/other.json"]
        );
    }

    /// A large ELF file read with little kept is completed pass by pass from the ranges it
    /// missed, and then says what the whole file says.
    #[test]
    fn a_large_elf_file_is_completed_from_the_ranges_it_missed() {
        let path = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("the host's libc");
        let bytes = std::fs::read(path).unwrap();
        let whole = super::super::links::read_elf(std::path::Path::new(path)).unwrap();
        let mut ranges: Vec<Range<u64>> = Vec::new();
        let mut passes = 0;
        let info = loop {
            passes += 1;
            assert!(passes <= 4, "still missing {ranges:?}");
            let mut sieve = Sieve::with(bytes.len() as u64, 4096, 4096, &ranges);
            for chunk in bytes.chunks(1000) {
                sieve.feed(chunk);
            }
            let sparse = sieve.into_sparse();
            let held: usize = sparse.parts.iter().map(|(_, p)| p.len()).sum();
            assert!(held < bytes.len() / 2, "kept {held} of {}", bytes.len());
            let info = super::super::links::elf_info(&sparse, bytes.len() as u64);
            let missed = sparse.missed.into_inner();
            if missed.is_empty() {
                break info.unwrap();
            }
            ranges.extend(missed);
        };
        assert!(
            passes > 1,
            "4 KiB of head and tail held libc's dynamic strings"
        );
        assert_eq!(info.soname, whole.soname);
        assert_eq!(info.needed, whole.needed);
        assert_eq!(info.interpreter, whole.interpreter);
        assert_eq!(info.bytes, whole.bytes);
    }

    #[test]
    fn the_nccl_banner_is_found_across_chunks() {
        let text = b"xxxx NCCL version 2.27.5+cuda12.9 yyyy";
        for split in 0..text.len() {
            let mut b = NcclBanner::default();
            b.feed(&text[..split]);
            b.feed(&text[split..]);
            assert_eq!(b.finish().as_deref(), Some("2.27.5"), "split at {split}");
        }
        let mut none = NcclBanner::default();
        none.feed(b"NCCL version x");
        assert_eq!(none.finish(), None);
    }
}
