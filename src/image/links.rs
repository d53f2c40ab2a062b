//! The link closure of an image, read statically: every ELF file's DT_NEEDED resolved as
//! glibc's ld.so would resolve it inside the image's root, and what that says about the image:
//! libraries nothing provides, sonames with more than one provider (and which one each file
//! binds), a library bound from another copy than its siblings, a compat libcuda the loader
//! reaches, and the bytes of copies nothing binds.
//!
//! The search follows glibc's `_dl_map_object` (elf/dl-load.c) for each file taken as the
//! main object, as `ldd FILE` does: objects load breadth first; a name an object already
//! loaded answers to (its DT_SONAME or the name it was asked for) is not searched again; a
//! name with a slash is a path; otherwise DT_RPATH of the asking object and of each object
//! that loaded it (only while the asking object has no DT_RUNPATH, and an object with
//! DT_RUNPATH has no DT_RPATH), `LD_LIBRARY_PATH` from the image config, the asking object's
//! own DT_RUNPATH, `/etc/ld.so.cache`, then the system directories (the last two not for
//! an object marked DF_1_NODEFLIB). `$ORIGIN` is the asking object's directory; a candidate of
//! another ELF class or machine is passed over, as ld.so passes it over. The glibc-hwcaps
//! subdirectories are not searched (images rarely have them).
//!
//! lddtree-rs (the `lddtree` crate) reads the host's /etc/ld.so.conf rather than the root's,
//! ignores `LD_LIBRARY_PATH` under a root and puts it after DT_RUNPATH, walks depth first and
//! never reads ld.so.cache, so it binds other copies than ld.so would exactly where two copies
//! meet; the ELF reading here is the `object` crate's, the search order is ld.so's own.

use crate::error::{Error, Result};
use object::read::elf::{Dyn, FileHeader, ProgramHeader};
use object::{FileKind, ReadCache, ReadRef, elf};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Component, Path, PathBuf};

/// What one ELF file says about linking.
#[derive(Debug, Clone, Default)]
pub struct ElfInfo {
    /// ELFCLASS64 (else 32).
    pub class64: bool,
    /// e_machine.
    pub machine: u16,
    /// DT_SONAME.
    pub soname: Option<String>,
    /// DT_NEEDED, in order.
    pub needed: Vec<String>,
    /// DT_RPATH, already empty when the file has DT_RUNPATH (ld.so ignores it then).
    pub rpath: Vec<String>,
    /// DT_RUNPATH.
    pub runpath: Vec<String>,
    /// DF_1_NODEFLIB: neither the cache nor the system directories are searched.
    pub nodeflib: bool,
    /// PT_INTERP.
    pub interpreter: Option<String>,
    /// The file's size.
    pub bytes: u64,
}

/// Reads the dynamic section of the ELF file at `path`; None when it is no ELF file, or an
/// ELF file without a dynamic section (a static binary, an object file).
pub fn read_elf(path: &Path) -> Option<ElfInfo> {
    let file = std::fs::File::open(path).ok()?;
    let bytes = file.metadata().ok()?.len();
    elf_info(&ReadCache::new(file), bytes)
}

/// What the ELF file in `data` (`bytes` long) says about linking; None as for [`read_elf`].
pub fn elf_info<'a, R: ReadRef<'a>>(data: R, bytes: u64) -> Option<ElfInfo> {
    let info = match FileKind::parse(data).ok()? {
        FileKind::Elf64 => parse::<elf::FileHeader64<object::Endianness>, R>(data, true),
        FileKind::Elf32 => parse::<elf::FileHeader32<object::Endianness>, R>(data, false),
        _ => None,
    }?;
    Some(ElfInfo { bytes, ..info })
}

fn parse<'a, H: FileHeader<Endian = object::Endianness>, R: ReadRef<'a>>(
    data: R,
    class64: bool,
) -> Option<ElfInfo> {
    let header = H::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let interpreter = header
        .program_headers(endian, data)
        .ok()?
        .iter()
        .find_map(|ph| ph.interpreter(endian, data).ok().flatten())
        .map(|b| String::from_utf8_lossy(b).into_owned());
    let sections = header.sections(endian, data).ok()?;
    let (dyns, link) = sections.dynamic(endian, data).ok()??;
    let strings = sections.strings(endian, data, link).ok()?;
    let text = |d: &H::Dyn| -> Option<String> {
        d.string(endian, strings)
            .ok()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    };
    let split = |s: String| -> Vec<String> { s.split(':').map(str::to_string).collect() };
    let mut info = ElfInfo {
        class64,
        machine: header.e_machine(endian),
        soname: None,
        needed: Vec::new(),
        rpath: Vec::new(),
        runpath: Vec::new(),
        nodeflib: false,
        interpreter,
        bytes: 0,
    };
    for d in dyns {
        match d.tag(endian) {
            elf::DT_NULL => break,
            elf::DT_NEEDED => info.needed.extend(text(d)),
            elf::DT_SONAME => info.soname = text(d),
            elf::DT_RPATH => info.rpath = text(d).map(split).unwrap_or_default(),
            elf::DT_RUNPATH => info.runpath = text(d).map(split).unwrap_or_default(),
            elf::DT_FLAGS_1 => info.nodeflib = d.val(endian) & u64::from(elf::DF_1_NODEFLIB) != 0,
            _ => {}
        }
    }
    if !info.runpath.is_empty() {
        info.rpath.clear();
    }
    Some(info)
}

/// What a path names in a tree, without following a final symbolic link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Nothing is there.
    Absent,
    /// A symbolic link, with its target.
    Link(String),
    /// A directory.
    Dir,
    /// Anything else: a regular file, a device.
    File,
}

/// A file tree the loader searches: an unpacked image, or a record of a machine's files.
pub trait Tree {
    /// What is at `path` (absolute, inside the tree).
    fn entry(&self, path: &str) -> Entry;
    /// What the ELF file at `real` (a path without symbolic links) says about linking; None
    /// when it is no ELF file with a dynamic section.
    fn elf(&self, real: &str) -> Option<ElfInfo>;
    /// The bytes of the file at `real`.
    fn read(&self, real: &str) -> std::io::Result<Vec<u8>>;
}

/// A tree whose files can be listed, the whole of an image as the link closure reads it.
pub trait Listing: Tree {
    /// Every regular file (absolute, real), in the order of a walk with each directory's
    /// names sorted.
    fn files(&self) -> Result<Vec<String>>;
    /// Whether the ELF file at `real` defines the dynamic symbol `symbol`.
    fn defines(&self, real: &str, symbol: &str) -> bool;
}

/// A directory taken as `/`: an unpacked image's root.
pub struct Root<'a>(pub &'a Path);

impl Root<'_> {
    fn at(&self, path: &str) -> PathBuf {
        self.0.join(path.trim_start_matches('/'))
    }
}

impl Tree for Root<'_> {
    fn entry(&self, path: &str) -> Entry {
        match std::fs::symlink_metadata(self.at(path)) {
            Err(_) => Entry::Absent,
            Ok(meta) if meta.file_type().is_symlink() => std::fs::read_link(self.at(path))
                .map(|t| Entry::Link(t.to_string_lossy().into_owned()))
                .unwrap_or(Entry::Absent),
            Ok(meta) if meta.is_dir() => Entry::Dir,
            Ok(_) => Entry::File,
        }
    }

    fn elf(&self, real: &str) -> Option<ElfInfo> {
        read_elf(&self.at(real))
    }

    fn read(&self, real: &str) -> std::io::Result<Vec<u8>> {
        std::fs::read(self.at(real))
    }
}

impl Listing for Root<'_> {
    fn files(&self) -> Result<Vec<String>> {
        let mut files = Vec::new();
        for entry in walkdir::WalkDir::new(self.0).sort_by_file_name() {
            let entry = entry.map_err(|e| Error::reading(self.0, e.into()))?;
            if entry.file_type().is_file() {
                let inside = entry
                    .path()
                    .strip_prefix(self.0)
                    .expect("walkdir stays under its root");
                files.push(format!("/{}", inside.to_string_lossy()));
            }
        }
        Ok(files)
    }

    fn defines(&self, real: &str, symbol: &str) -> bool {
        let Ok(file) = std::fs::File::open(self.at(real)) else {
            return false;
        };
        defines_in(&ReadCache::new(file), symbol).unwrap_or(false)
    }
}

/// The real path (inside the image) of `path` (absolute, inside the image), following
/// symbolic links as the kernel would with `root` as `/`; None when it does not exist.
pub fn real_in(root: &Path, path: &str) -> Option<String> {
    real_path(&Root(root), path)
}

/// The real path of `path` in `tree`, following symbolic links as the kernel would with the
/// tree's top as `/` (never above it); None when it does not exist.
pub fn real_path(tree: &dyn Tree, path: &str) -> Option<String> {
    let mut parts: VecDeque<String> = components(path);
    let mut done: Vec<String> = Vec::new();
    let mut links = 0;
    while let Some(part) = parts.pop_front() {
        if part == ".." {
            done.pop();
            continue;
        }
        let here = format!(
            "/{}",
            done.iter()
                .chain([&part])
                .cloned()
                .collect::<Vec<_>>()
                .join("/")
        );
        match tree.entry(&here) {
            Entry::Absent => return None,
            Entry::Link(target) => {
                links += 1;
                if links > 40 {
                    return None;
                }
                if target.starts_with('/') {
                    done.clear();
                }
                for (i, p) in components(&target).into_iter().enumerate() {
                    parts.insert(i, p);
                }
            }
            Entry::File if !parts.is_empty() => return None,
            Entry::File | Entry::Dir => done.push(part),
        }
    }
    Some(format!("/{}", done.join("/")))
}

fn components(path: &str) -> VecDeque<String> {
    Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

/// The parts of the search that the image fixes for every file.
#[derive(Debug, Clone, Default)]
pub struct Search {
    /// `LD_LIBRARY_PATH` of the image config, split at `:` and `;` as ld.so splits it.
    pub ld_library_path: Vec<String>,
    /// /etc/ld.so.cache's entries (soname, path, flags) in the cache's order.
    pub cache: Option<Vec<(String, String, i32)>>,
    /// The system directories of this image's glibc.
    pub system: Vec<String>,
}

impl Search {
    /// The search of `tree` with the environment `env` (an image config's).
    pub fn of_tree(tree: &dyn Tree, env: &[(String, String)]) -> Result<Search> {
        let ld_library_path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "LD_LIBRARY_PATH")
            .map(|(_, v)| {
                v.split([':', ';'])
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let cache = match real_path(tree, "/etc/ld.so.cache") {
            Some(real) => {
                let bytes = tree
                    .read(&real)
                    .map_err(|e| Error::image("/etc/ld.so.cache", e.to_string()))?;
                Some(parse_cache(&bytes).map_err(|why| {
                    Error::image(
                        "/etc/ld.so.cache",
                        format!("not a glibc ld.so.cache: {why}"),
                    )
                })?)
            }
            None => None,
        };
        // Debian and Ubuntu build glibc with multiarch directories first; others (RHEL,
        // Fedora, SUSE) with lib64 on 64-bit machines. `ld.so --help` lists them.
        // Such a glibc searches its multiarch directories whichever of them the image has
        // (a minimal base may hold only /lib/x86_64-linux-gnu).
        let multiarch = ["x86_64-linux-gnu", "aarch64-linux-gnu"]
            .into_iter()
            .find(|t| {
                real_path(tree, &format!("/usr/lib/{t}")).is_some()
                    || real_path(tree, &format!("/lib/{t}")).is_some()
            });
        let system = match multiarch {
            Some(t) => vec![
                format!("/lib/{t}"),
                format!("/usr/lib/{t}"),
                "/lib".into(),
                "/usr/lib".into(),
            ],
            None if real_path(tree, "/usr/lib64").is_some() => {
                vec!["/lib64".into(), "/usr/lib64".into()]
            }
            None => vec!["/lib".into(), "/usr/lib".into()],
        };
        Ok(Search {
            ld_library_path,
            cache,
            system,
        })
    }
}

/// The entries of a glibc ld.so.cache ("glibc-ld.so.cache1.1", alone or after the old
/// "ld.so-1.7.0" table), in file order: (key, value, flags).
pub fn parse_cache(bytes: &[u8]) -> std::result::Result<Vec<(String, String, i32)>, String> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    let start = memchr::memmem::find(bytes, MAGIC).ok_or("no glibc-ld.so.cache1.1 header")?;
    let new = &bytes[start..];
    let u32_at = |at: usize| -> std::result::Result<u32, String> {
        new.get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(|| format!("truncated at byte {}", start + at))
    };
    let nlibs = u32_at(20)? as usize;
    let string = |off: u32| -> std::result::Result<String, String> {
        let s = new
            .get(off as usize..)
            .ok_or("a string offset past the end")?;
        let end = memchr::memchr(0, s).ok_or("an unterminated string")?;
        Ok(String::from_utf8_lossy(&s[..end]).into_owned())
    };
    let mut entries = Vec::with_capacity(nlibs.min(1 << 16));
    for i in 0..nlibs {
        let at = 48 + i * 24;
        let flags = u32_at(at)? as i32;
        let key = string(u32_at(at + 4)?)?;
        let value = string(u32_at(at + 8)?)?;
        let hwcap = u64::from(u32_at(at + 16)?) | (u64::from(u32_at(at + 20)?) << 32);
        // An entry for a glibc-hwcaps subdirectory serves only CPUs of that level; ld.so
        // falls back to the plain entry, which is the one this static view takes.
        if hwcap == 0 {
            entries.push((key, value, flags));
        }
    }
    Ok(entries)
}

/// How a needed name was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// An object already loaded answers to the name.
    Loaded,
    /// The name has a slash: a path.
    Path,
    /// DT_RPATH of the asking object or of one that loaded it.
    Rpath,
    /// The image config's `LD_LIBRARY_PATH`.
    LdLibraryPath,
    /// DT_RUNPATH of the asking object.
    Runpath,
    /// /etc/ld.so.cache.
    LdSoCache,
    /// A system directory of glibc.
    SystemDir,
}

impl Via {
    /// The step's name as ld.so's documentation gives it.
    pub fn describe(self) -> &'static str {
        match self {
            Via::Loaded => "an object already loaded",
            Via::Path => "its path",
            Via::Rpath => "DT_RPATH",
            Via::LdLibraryPath => "LD_LIBRARY_PATH",
            Via::Runpath => "DT_RUNPATH",
            Via::LdSoCache => "/etc/ld.so.cache",
            Via::SystemDir => "a system directory",
        }
    }
}

/// One library in a file's closure: the name asked for, who asked, where it was found.
#[derive(Debug, Clone, Serialize)]
pub struct Binding {
    /// The DT_NEEDED name.
    pub needed: String,
    /// The object that asked for it (the first one in load order).
    pub by: String,
    /// The path ld.so opens (None: not found).
    pub path: Option<String>,
    /// That path with every symbolic link resolved.
    pub real: Option<String>,
    /// Which step of the search found it.
    pub via: Option<Via>,
}

/// A file's closure as `ldd FILE` lists it: every library in load order.
#[derive(Debug, Clone, Serialize)]
pub struct Closure {
    /// The file taken as the main object.
    pub file: String,
    /// What a job does with the file.
    pub role: Role,
    /// Every DT_NEEDED of the closure, in load order.
    pub libraries: Vec<Binding>,
}

struct Loaded {
    real: String,
    /// The path it was opened by (ld.so's `l_name`).
    path: String,
    /// What `$ORIGIN` expands to in its paths.
    origin: String,
    names: Vec<String>,
    info: ElfInfo,
    /// The index of the object that loaded it (None: the main object).
    loader: Option<usize>,
}

/// The objects of one process, as ld.so has loaded them so far: the main object and its
/// DT_NEEDED closure, then whatever `dlopen` added.
pub struct Process {
    main: ElfInfo,
    loaded: Vec<Loaded>,
    /// Objects in the order their DT_NEEDED are read (breadth first).
    order: Vec<usize>,
    next: usize,
    libraries: Vec<Binding>,
}

/// The name [`Process::of_plain_program`]'s program is loaded by.
const PLAIN_PROGRAM: &str = "<program>";

impl Process {
    /// A process whose program (for ELF `machine`, 64-bit) has no DT_RPATH, DT_RUNPATH or
    /// DT_NEEDED of its own: what `dlopen(name)` from it finds is what any object without
    /// search paths of its own reaches (LD_LIBRARY_PATH, the cache, the system directories).
    fn of_plain_program(machine: u16) -> Process {
        let main = ElfInfo {
            class64: true,
            machine,
            ..ElfInfo::default()
        };
        Process {
            main: main.clone(),
            loaded: vec![Loaded {
                real: String::new(),
                path: PLAIN_PROGRAM.into(),
                origin: "/".into(),
                names: Vec::new(),
                info: main,
                loader: None,
            }],
            order: vec![0],
            next: 1,
            libraries: Vec::new(),
        }
    }

    /// Every object loaded: the path it was opened by and its real path, in load order.
    pub fn objects(&self) -> impl Iterator<Item = (&str, &str)> {
        self.loaded
            .iter()
            .map(|l| (l.path.as_str(), l.real.as_str()))
    }

    /// Every name asked for so far, in load order.
    pub fn libraries(&self) -> &[Binding] {
        &self.libraries
    }

    /// The object `caller` names: the path it was opened by, or its real path.
    fn index_of(&self, caller: &str) -> Option<usize> {
        self.loaded
            .iter()
            .position(|l| l.path == caller)
            .or_else(|| self.loaded.iter().position(|l| l.real == caller))
    }

    /// The object already loaded that answers to `name`: its path, or a name it was loaded
    /// by or its DT_SONAME (glibc's `_dl_name_match_p` and the soname compare after it).
    fn answering(&self, name: &str) -> Option<usize> {
        self.loaded
            .iter()
            .position(|l| l.path == name || l.names.iter().any(|n| n == name))
    }
}

/// The image's ELF files and the search, with each file read once.
pub struct Linker<'a> {
    tree: &'a dyn Tree,
    search: &'a Search,
    files: HashMap<String, Option<ElfInfo>>,
}

fn parent_of(path: &str) -> String {
    Path::new(path)
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".into())
}

impl<'a> Linker<'a> {
    /// A linker over `tree`, searching as `search` says.
    pub fn new(tree: &'a dyn Tree, search: &'a Search) -> Self {
        Linker {
            tree,
            search,
            files: HashMap::new(),
        }
    }

    fn info(&mut self, real: &str) -> Option<ElfInfo> {
        let tree = self.tree;
        self.files
            .entry(real.to_string())
            .or_insert_with(|| tree.elf(real))
            .clone()
    }

    /// The object at `path` when it is an ELF file ld.so would load beside `main`.
    fn candidate(&mut self, path: &str, main: &ElfInfo) -> Option<(String, ElfInfo)> {
        let real = real_path(self.tree, path)?;
        let info = self.info(&real)?;
        (info.class64 == main.class64 && info.machine == main.machine).then_some((real, info))
    }

    /// The closure of the ELF file at `file` (an absolute path inside the image), as
    /// `ldd FILE` lists it.
    pub fn closure(&mut self, file: &str) -> Option<Closure> {
        let process = self.start(file)?;
        Some(Closure {
            file: file.to_string(),
            role: Role::Plugin,
            libraries: process.libraries,
        })
    }

    /// A process of the program at `file`, started as the kernel and ld.so start it: the
    /// program, its interpreter, and the DT_NEEDED closure.
    pub fn start(&mut self, file: &str) -> Option<Process> {
        let real = real_path(self.tree, file)?;
        let main = self.info(&real)?;
        let mut process = Process {
            main: main.clone(),
            loaded: vec![Loaded {
                // The main program's `$ORIGIN` is its real directory (/proc/self/exe).
                origin: parent_of(&real),
                real,
                path: file.to_string(),
                names: main.soname.iter().cloned().collect(),
                info: main.clone(),
                loader: None,
            }],
            order: vec![0],
            next: 0,
            libraries: Vec::new(),
        };
        // ld.so itself is loaded before anything else asks: libc's DT_NEEDED on
        // ld-linux-x86-64.so.2 finds it by its soname.
        if let Some(interp) = &main.interpreter
            && let Some((real, info)) = self.candidate(interp, &main)
        {
            let mut names: Vec<String> = info.soname.iter().cloned().collect();
            names.push(interp.clone());
            process.loaded.push(Loaded {
                real,
                path: interp.clone(),
                origin: parent_of(interp),
                names,
                info,
                loader: Some(0),
            });
        }
        self.load_needed(&mut process);
        Some(process)
    }

    /// What `dlopen(name)` called from the object `caller` (the path it was opened by, as
    /// LD_DEBUG names it) loads: the object and then its DT_NEEDED closure. The binding of
    /// `name` itself is returned (its path None when ld.so finds nothing, as dlopen fails);
    /// None when `caller` is not loaded.
    pub fn dlopen(&mut self, process: &mut Process, caller: &str, name: &str) -> Option<Binding> {
        let asker = process.index_of(caller)?;
        let binding = self.bind(process, asker, name);
        self.load_needed(process);
        Some(binding)
    }

    /// The DT_NEEDED of every object not yet read, breadth first, as `_dl_map_object_deps`.
    fn load_needed(&mut self, process: &mut Process) {
        while process.next < process.order.len() {
            let asker = process.order[process.next];
            process.next += 1;
            for needed in process.loaded[asker].info.needed.clone() {
                let binding = self.bind(process, asker, &needed);
                process.libraries.push(binding);
            }
        }
    }

    /// Binds `needed`, asked by `process.loaded[asker]`: an object already loaded that
    /// answers to it, else the search's find, loaded and queued for its own DT_NEEDED.
    fn bind(&mut self, process: &mut Process, asker: usize, needed: &str) -> Binding {
        let by = process.loaded[asker].path.clone();
        if let Some(i) = process.answering(needed) {
            // The interpreter is loaded first but its DT_NEEDED are read when asked for.
            if !process.order.contains(&i) {
                process.order.push(i);
            }
            return Binding {
                needed: needed.to_string(),
                by,
                path: Some(process.loaded[i].path.clone()),
                real: Some(process.loaded[i].real.clone()),
                via: Some(Via::Loaded),
            };
        }
        let main = process.main.clone();
        let Some((path, real, info, via)) = self.find(&process.loaded, asker, needed, &main) else {
            return Binding {
                needed: needed.to_string(),
                by,
                path: None,
                real: None,
                via: None,
            };
        };
        if let Some(i) = process.loaded.iter().position(|l| l.real == real) {
            // The same file by another name (ld.so compares the inode).
            process.loaded[i].names.push(needed.to_string());
        } else {
            let mut names: Vec<String> = info.soname.iter().cloned().collect();
            names.push(needed.to_string());
            process.loaded.push(Loaded {
                real: real.clone(),
                origin: parent_of(&path),
                path: path.clone(),
                names,
                info,
                loader: Some(asker),
            });
            process.order.push(process.loaded.len() - 1);
        }
        Binding {
            needed: needed.to_string(),
            by,
            path: Some(path),
            real: Some(real),
            via: Some(via),
        }
    }

    /// ld.so's search for `needed`, asked by `loaded[asker]`.
    fn find(
        &mut self,
        loaded: &[Loaded],
        asker: usize,
        needed: &str,
        main: &ElfInfo,
    ) -> Option<(String, String, ElfInfo, Via)> {
        if needed.contains('/') {
            let (real, info) = self.candidate(needed, main)?;
            return Some((needed.to_string(), real, info, Via::Path));
        }
        let expand = |dirs: &[String], l: &Loaded| -> Vec<String> {
            dirs.iter()
                .map(|d| {
                    d.replace("${ORIGIN}", &l.origin)
                        .replace("$ORIGIN", &l.origin)
                })
                .collect()
        };
        let mut tries: Vec<(Vec<String>, Via)> = Vec::new();
        let me = &loaded[asker];
        if me.info.runpath.is_empty() {
            // The asking object's DT_RPATH, then that of each object that loaded it, up to
            // the main program's.
            let mut at = Some(asker);
            while let Some(i) = at {
                tries.push((expand(&loaded[i].info.rpath, &loaded[i]), Via::Rpath));
                at = loaded[i].loader;
            }
        }
        tries.push((self.search.ld_library_path.clone(), Via::LdLibraryPath));
        tries.push((expand(&me.info.runpath, me), Via::Runpath));
        for (dirs, via) in tries {
            for dir in dirs {
                // An empty entry is the working directory, which a static view has not.
                if dir.is_empty() || !dir.starts_with('/') {
                    continue;
                }
                let path = format!("{}/{needed}", dir.trim_end_matches('/'));
                if let Some((real, info)) = self.candidate(&path, main) {
                    return Some((path, real, info, via));
                }
            }
        }
        if me.info.nodeflib {
            return None;
        }
        if let Some(cache) = &self.search.cache {
            let hits: Vec<String> = cache
                .iter()
                .filter(|(key, _, flags)| key == needed && flags & 0xff == 3)
                .map(|(_, value, _)| value.clone())
                .collect();
            for path in hits {
                if let Some((real, info)) = self.candidate(&path, main) {
                    return Some((path, real, info, Via::LdSoCache));
                }
            }
        }
        for dir in self.search.system.clone() {
            let path = format!("{dir}/{needed}");
            if let Some((real, info)) = self.candidate(&path, main) {
                return Some((path, real, info, Via::SystemDir));
            }
        }
        None
    }
}

/// A soname more than one file provides, and which files bind each.
#[derive(Debug, Clone, Serialize)]
pub struct Duplicate {
    /// The soname.
    pub soname: String,
    /// Every file of the image with that soname.
    pub providers: Vec<Provider>,
}

/// One file providing a duplicated soname.
#[derive(Debug, Clone, Serialize)]
pub struct Provider {
    /// Its real path in the image.
    pub path: String,
    /// Its size.
    pub bytes: u64,
    /// The files whose closure binds this copy.
    pub bound_by: Vec<String>,
}

/// A library bound from another copy than a sibling that its own copy also provides.
#[derive(Debug, Clone, Serialize)]
pub struct CrossCopy {
    /// The file whose closure mixes copies.
    pub file: String,
    /// One library of the pair.
    pub soname: String,
    /// The copy it binds.
    pub bound: String,
    /// Its sibling.
    pub sibling: String,
    /// The copy the sibling binds.
    pub sibling_bound: String,
}

/// An unresolved DT_NEEDED.
#[derive(Debug, Clone, Serialize)]
pub struct Unresolved {
    /// The file whose closure lacks it.
    pub file: String,
    /// The name not found.
    pub needed: String,
    /// The object that asked for it.
    pub by: String,
    /// The driver's library, which the container toolkit mounts at run time.
    pub driver: bool,
}

/// What a job does with an ELF file: starts it (a program), imports it (a Python extension
/// module), loads it because one of those needs it, or nothing by DT_NEEDED at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// An ELF file with an interpreter (PT_INTERP): the kernel starts it.
    Program,
    /// A shared object CPython's importer takes as an extension module.
    Extension,
    /// A library in the DT_NEEDED closure of a program or an extension module.
    Needed,
    /// A shared object no program or extension module needs: whatever opens it does so with
    /// dlopen, when something selects it.
    Plugin,
}

impl Role {
    /// Whether a job starts or imports the file itself.
    pub fn is_root(self) -> bool {
        matches!(self, Role::Program | Role::Extension)
    }
}

/// A plugin whose own needs the image cannot resolve: it cannot load here.
#[derive(Debug, Clone, Serialize)]
pub struct CannotLoad {
    /// The plugin.
    pub file: String,
    /// The names nothing in the image provides (the driver's own left out).
    pub missing: Vec<String>,
    /// For a plugin of data/plugins.yaml: the library that opens it.
    pub loader: Option<String>,
    /// For a plugin of data/plugins.yaml: what would select it, one line per way.
    pub selectors: Vec<String>,
    /// The image's own settings that select it; None when nothing the image sets does.
    pub selected_by: Option<String>,
}

/// The link closure of a whole image.
#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    /// ELF files with a dynamic section.
    pub elf_files: usize,
    /// The config's `LD_LIBRARY_PATH`.
    pub ld_library_path: Vec<String>,
    /// Entries of /etc/ld.so.cache (None: the image has none).
    pub ld_so_cache: Option<usize>,
    /// Programs and extension modules: what a job starts or imports.
    pub roots: usize,
    /// Every unresolved DT_NEEDED in the closure of a program or an extension module.
    pub unresolved: Vec<Unresolved>,
    /// Plugins whose own needs the image cannot resolve.
    pub cannot_load: Vec<CannotLoad>,
    /// Sonames with more than one provider.
    pub duplicates: Vec<Duplicate>,
    /// Libraries bound from another copy than their siblings.
    pub cross_copy: Vec<CrossCopy>,
    /// libcuda.so.1 copies in the image that the loader reaches (compat or stubs): they shadow
    /// the driver's own when bound.
    pub compat_libcuda: Vec<String>,
    /// Copies of a duplicated soname that no file binds, with their bytes.
    pub dead: Vec<(String, u64)>,
    /// Their bytes together.
    pub dead_bytes: u64,
    /// Every file's closure.
    pub closures: Vec<Closure>,
}

/// Whether `soname` is a driver library (mounted into the container at run time).
fn driver_library(soname: &str) -> bool {
    ["libcuda.so", "libnvidia-", "libnvcuvid.so", "libnvoptix.so"]
        .iter()
        .any(|p| soname.starts_with(p))
}

/// The image's directories a library copy is named by: `/usr/local/cuda/lib64/libcudart.so.12`
/// is in copy `/usr/local/cuda/lib64`.
fn dir_of(path: &str) -> String {
    Path::new(path)
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The link closure of the image unpacked at `root`, whose config's environment is `env`.
pub fn analyze(root: &Path, env: &[(String, String)]) -> Result<LinkReport> {
    analyze_tree(&Root(root), env)
}

/// [`analyze`] of any listed tree: an unpacked root, or an image read into memory.
pub fn analyze_tree(tree: &dyn Listing, env: &[(String, String)]) -> Result<LinkReport> {
    let search = Search::of_tree(tree, env)?;
    let mut linker = Linker::new(tree, &search);
    let mut files = tree.files()?;
    files.retain(|f| linker.info(f).is_some());
    let mut closures: Vec<Closure> = files.iter().filter_map(|f| linker.closure(f)).collect();
    for c in &mut closures {
        let info = linker.info(&c.file).expect("read above");
        if info.interpreter.is_some() {
            c.role = Role::Program;
        } else if extension_module(tree, &c.file) {
            c.role = Role::Extension;
        }
    }
    // What a job loads: the roots and everything their closures bind.
    let needed: BTreeSet<String> = closures
        .iter()
        .filter(|c| c.role.is_root())
        .flat_map(|c| c.libraries.iter().filter_map(|b| b.real.clone()))
        .collect();
    for c in &mut closures {
        if c.role == Role::Plugin && needed.contains(&c.file) {
            c.role = Role::Needed;
        }
    }

    // Providers: every shared library by its DT_SONAME, and a file without one (a plugin, a
    // program) only under the names it is bound by.
    let mut providers: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        if let Some(soname) = linker.info(f).expect("read above").soname {
            providers.entry(soname).or_default().insert(f.clone());
        }
    }
    for c in &closures {
        for b in &c.libraries {
            if let Some(real) = &b.real
                && linker.info(real).is_some_and(|i| i.soname.is_none())
            {
                providers
                    .entry(b.needed.clone())
                    .or_default()
                    .insert(real.clone());
            }
        }
    }
    let provider_of: HashMap<&str, &str> = providers
        .iter()
        .flat_map(|(s, ps)| ps.iter().map(move |p| (p.as_str(), s.as_str())))
        .collect();
    let mut bound_by: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut unresolved = Vec::new();
    for c in &closures {
        for b in &c.libraries {
            match &b.real {
                Some(real) => {
                    bound_by
                        .entry(real.clone())
                        .or_default()
                        .insert(c.file.clone());
                }
                None if c.role.is_root() => unresolved.push(Unresolved {
                    file: c.file.clone(),
                    needed: b.needed.clone(),
                    by: b.by.clone(),
                    driver: driver_library(&b.needed),
                }),
                None => {}
            }
        }
    }
    let cannot_load = cannot_load(tree, env, &closures);
    let bytes = |linker: &mut Linker, p: &str| linker.info(p).map(|i| i.bytes).unwrap_or(0);
    let mut duplicates = Vec::new();
    let mut dead = Vec::new();
    for (soname, paths) in &providers {
        if paths.len() < 2 {
            continue;
        }
        let mut list = Vec::new();
        for p in paths {
            let by: Vec<String> = bound_by.get(p).into_iter().flatten().cloned().collect();
            if by.is_empty() {
                dead.push((p.clone(), bytes(&mut linker, p)));
            }
            list.push(Provider {
                path: p.clone(),
                bytes: bytes(&mut linker, p),
                bound_by: by,
            });
        }
        duplicates.push(Duplicate {
            soname: soname.clone(),
            providers: list,
        });
    }
    let dead_bytes = dead.iter().map(|(_, b)| b).sum();

    let cross_copy = cross_copies(&closures, &duplicates, &provider_of);
    let compat_libcuda = reachable_libcuda(&mut linker);

    Ok(LinkReport {
        elf_files: files.len(),
        ld_library_path: search.ld_library_path.clone(),
        ld_so_cache: search.cache.as_ref().map(Vec::len),
        roots: closures.iter().filter(|c| c.role.is_root()).count(),
        unresolved,
        cannot_load,
        duplicates,
        cross_copy,
        compat_libcuda,
        dead,
        dead_bytes,
        closures,
    })
}

/// The plugins whose closures miss a library the image does not provide (the driver's own,
/// mounted at run time, left out), each with what selects it when data/plugins.yaml knows it
/// and whether the image's own settings do.
fn cannot_load(tree: &dyn Tree, env: &[(String, String)], closures: &[Closure]) -> Vec<CannotLoad> {
    let read = |path: &str| -> Option<Vec<u8>> {
        let real = real_path(tree, path)?;
        tree.read(&real).ok()
    };
    let settings = crate::image::plugins::Settings { env, read: &read };
    closures
        .iter()
        .filter(|c| c.role == Role::Plugin)
        .filter_map(|c| {
            let mut missing: Vec<String> = c
                .libraries
                .iter()
                .filter(|b| b.real.is_none() && !driver_library(&b.needed))
                .map(|b| b.needed.clone())
                .collect();
            missing.dedup();
            if missing.is_empty() {
                return None;
            }
            let known = crate::image::plugins::known(&c.file);
            Some(CannotLoad {
                file: c.file.clone(),
                missing,
                loader: known.map(|p| p.loader.clone()),
                selectors: known.map(|p| p.selectors()).unwrap_or_default(),
                selected_by: known.and_then(|p| p.selected_by(&settings)),
            })
        })
        .collect()
}

/// Whether CPython's importer takes the shared object at `path` (inside `tree`) as an
/// extension module. Python/dynload_shlib.c lists the suffixes it tries after a module's
/// name, `.<SOABI>.so` (`.cpython-311-x86_64-linux-gnu.so`), `.abi3.so` and a bare `.so`,
/// and imports the file only when it defines `PyInit_<name>`. A tagged suffix says the file
/// was built as a module; a bare `.so` is also what every library without a version is named
/// (`libtorch_cuda.so`), so there the symbol decides.
fn extension_module(tree: &dyn Listing, path: &str) -> bool {
    match module_name(path) {
        None => false,
        Some(Module::Tagged) => true,
        Some(Module::Bare(init)) => tree.defines(path, &init),
    }
}

/// What the name of a shared object at `path` says of it as an extension module.
pub enum Module {
    /// A suffix only modules carry (`.cpython-311-x86_64-linux-gnu.so`, `.abi3.so`).
    Tagged,
    /// A bare `.so`: a module only if the file defines this `PyInit_<name>`.
    Bare(String),
}

/// The module a file at `path` would be to CPython's importer; None when its place or name
/// rules that out.
pub fn module_name(path: &str) -> Option<Module> {
    if !in_python_stack(path) {
        return None;
    }
    let name = path.rsplit('/').next().unwrap_or_default();
    let (module, suffix) = name.split_once('.')?;
    let identifier = !module.is_empty()
        && !module.starts_with(|c: char| c.is_ascii_digit())
        && module.chars().all(|c| c.is_alphanumeric() || c == '_');
    if !identifier {
        return None;
    }
    if suffix == "abi3.so" || (suffix.starts_with("cpython-") && suffix.ends_with(".so")) {
        Some(Module::Tagged)
    } else if suffix == "so" {
        Some(Module::Bare(format!("PyInit_{module}")))
    } else {
        None
    }
}

/// Whether the ELF file in `data` defines the dynamic symbol `symbol` (as `dlsym` finds it:
/// a definition in .dynsym); None when the file does not read as ELF with dynamic symbols.
pub fn defines_in<'a, R: ReadRef<'a>>(data: R, symbol: &str) -> Option<bool> {
    fn look<'a, H: FileHeader<Endian = object::Endianness>, R: ReadRef<'a>>(
        data: R,
        symbol: &str,
    ) -> Option<bool> {
        let header = H::parse(data).ok()?;
        let endian = header.endian().ok()?;
        let sections = header.sections(endian, data).ok()?;
        let symbols = sections.symbols(endian, data, elf::SHT_DYNSYM).ok()?;
        Some(symbols.iter().any(|s| {
            use object::read::elf::Sym;
            s.is_definition(endian, symbols.strings())
                && symbols.symbol_name(endian, s) == Ok(symbol.as_bytes())
        }))
    }
    match FileKind::parse(data).ok()? {
        FileKind::Elf64 => look::<elf::FileHeader64<object::Endianness>, R>(data, symbol),
        FileKind::Elf32 => look::<elf::FileHeader32<object::Endianness>, R>(data, symbol),
        _ => None,
    }
}

/// Siblings: two duplicated sonames that one directory provides both of. A closure that
/// binds one from that directory and the other from elsewhere mixes copies.
fn cross_copies(
    closures: &[Closure],
    duplicates: &[Duplicate],
    provider_of: &HashMap<&str, &str>,
) -> Vec<CrossCopy> {
    let dup_dirs: HashMap<&str, BTreeSet<String>> = duplicates
        .iter()
        .map(|d| {
            (
                d.soname.as_str(),
                d.providers.iter().map(|p| dir_of(&p.path)).collect(),
            )
        })
        .collect();
    let mut cross_copy = Vec::new();
    for c in closures {
        let bound: Vec<(&str, &str)> = c
            .libraries
            .iter()
            .filter(|b| b.via != Some(Via::Loaded))
            .filter_map(|b| {
                let real = b.real.as_deref()?;
                let soname = *provider_of.get(real)?;
                dup_dirs.contains_key(soname).then_some((soname, real))
            })
            .collect();
        for (i, (a, a_real)) in bound.iter().enumerate() {
            for (b, b_real) in &bound[i + 1..] {
                let (a_dir, b_dir) = (dir_of(a_real), dir_of(b_real));
                if a_dir == b_dir {
                    continue;
                }
                let shared = dup_dirs[a].intersection(&dup_dirs[b]).next().is_some();
                if shared && (dup_dirs[b].contains(&a_dir) || dup_dirs[a].contains(&b_dir)) {
                    cross_copy.push(CrossCopy {
                        file: c.file.clone(),
                        soname: a.to_string(),
                        bound: a_real.to_string(),
                        sibling: b.to_string(),
                        sibling_bound: b_real.to_string(),
                    });
                }
            }
        }
    }
    cross_copy
}

/// A libcuda.so.1 in the image that the loader reaches without any RUNPATH: through
/// LD_LIBRARY_PATH, the cache or a system directory. (The driver's own is mounted at run
/// time; a copy the loader finds first is a compat or stub library.)
fn reachable_libcuda(linker: &mut Linker) -> Vec<String> {
    let mut compat_libcuda = Vec::new();
    for machine in [elf::EM_X86_64, elf::EM_AARCH64] {
        let mut process = Process::of_plain_program(machine);
        if let Some(Binding {
            path: Some(path),
            real: Some(real),
            via: Some(via),
            ..
        }) = linker.dlopen(&mut process, PLAIN_PROGRAM, "libcuda.so.1")
        {
            compat_libcuda.push(format!(
                "{path} (real {real}, reached through {})",
                via.describe()
            ));
        }
    }
    compat_libcuda
}

/// Whether `path` belongs to the Python stack: the interpreter's extension modules and
/// everything pip installs.
pub fn in_python_stack(path: &str) -> bool {
    ["/site-packages/", "/dist-packages/", "/lib-dynload/"]
        .iter()
        .any(|p| path.contains(p))
}

impl LinkReport {
    /// The human report `inspect --libraries` prints.
    pub fn to_text(&self) -> String {
        use crate::units::human_size;
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "ELF files: {}; LD_LIBRARY_PATH: {}; /etc/ld.so.cache: {}",
            self.elf_files,
            if self.ld_library_path.is_empty() {
                "unset".into()
            } else {
                self.ld_library_path.join(":")
            },
            match self.ld_so_cache {
                Some(n) => format!("{n} entries"),
                None => "absent (ld.so reads no ld.so.conf without it)".into(),
            }
        );
        let _ = writeln!(
            s,
            "Programs and Python extension modules (what a job starts or imports): {}",
            self.roots
        );
        let _ = writeln!(
            s,
            "\nUnresolved libraries of programs and extension modules: {}",
            self.unresolved.len()
        );
        for u in &self.unresolved {
            let _ = writeln!(
                s,
                "  {} needs {} (asked by {}){}",
                u.file,
                u.needed,
                u.by,
                if u.driver {
                    ", the driver's: mounted at run time"
                } else {
                    ""
                }
            );
        }
        let _ = writeln!(
            s,
            "\nPlugins that cannot load here (nothing needs them; a loader opens them when selected): {}",
            self.cannot_load.len()
        );
        for p in &self.cannot_load {
            let _ = writeln!(s, "  {} needs {}", p.file, p.missing.join(", "));
            match (&p.loader, &p.selected_by) {
                (Some(loader), Some(by)) => {
                    let _ = writeln!(s, "    opened by {loader}; the image selects it: {by}");
                }
                (Some(loader), None) => {
                    let _ = writeln!(
                        s,
                        "    opened by {loader} when {}; the image does not select it",
                        p.selectors.join(" or ")
                    );
                }
                _ => {
                    let _ = writeln!(s, "    not a known plugin: what opens it is unknown");
                }
            }
        }
        let _ = writeln!(
            s,
            "\nSonames with more than one provider: {}",
            self.duplicates.len()
        );
        for d in &self.duplicates {
            let _ = writeln!(s, "  {}", d.soname);
            for p in &d.providers {
                let _ = writeln!(
                    s,
                    "    {} ({}): {}",
                    p.path,
                    human_size(p.bytes),
                    if p.bound_by.is_empty() {
                        "bound by nothing".to_string()
                    } else {
                        format!("bound by {}", p.bound_by.join(", "))
                    }
                );
            }
        }
        let _ = writeln!(s, "\nCross-copy bindings: {}", self.cross_copy.len());
        for x in &self.cross_copy {
            let _ = writeln!(
                s,
                "  {} binds {} from {} but {} from {}",
                x.file, x.soname, x.bound, x.sibling, x.sibling_bound
            );
        }
        let _ = writeln!(
            s,
            "\nCompat libcuda the loader reaches: {}",
            self.compat_libcuda.len()
        );
        for c in &self.compat_libcuda {
            let _ = writeln!(s, "  {c}");
        }
        let _ = writeln!(
            s,
            "\nCopies nothing binds: {} ({})",
            self.dead.len(),
            human_size(self.dead_bytes)
        );
        for (p, b) in &self.dead {
            let _ = writeln!(s, "  {p} ({})", human_size(*b));
        }
        s
    }
}

/// Where `dlopen(name)` from a plain program of the image in `tree` (environment `env`) lands
/// for each of `names`: the path ld.so would map, or None where it finds nothing.
pub fn dlopened(
    tree: &dyn Tree,
    env: &[(String, String)],
    names: &[&str],
) -> Result<Vec<(String, Option<String>)>> {
    let search = Search::of_tree(tree, env)?;
    let mut linker = Linker::new(tree, &search);
    Ok(names
        .iter()
        .map(|name| {
            let found = [elf::EM_X86_64, elf::EM_AARCH64]
                .into_iter()
                .find_map(|machine| {
                    let mut process = Process::of_plain_program(machine);
                    linker
                        .dlopen(&mut process, PLAIN_PROGRAM, name)
                        .and_then(|b| b.path)
                });
            (name.to_string(), found)
        })
        .collect())
}

/// Where `dlopen(name)` from an object with no search paths of its own lands in the tree at
/// `root` (environment `env`): the real path ld.so would map and the step of its search that
/// found it; None where the search finds nothing.
pub fn plain_search(
    root: &Path,
    env: &[(String, String)],
    name: &str,
) -> Result<Option<(String, Via)>> {
    let tree = Root(root);
    let search = Search::of_tree(&tree, env)?;
    let mut linker = Linker::new(&tree, &search);
    Ok([elf::EM_X86_64, elf::EM_AARCH64]
        .into_iter()
        .find_map(|machine| {
            let mut process = Process::of_plain_program(machine);
            let b = linker.dlopen(&mut process, PLAIN_PROGRAM, name)?;
            Some((b.real?, b.via?))
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/local/cuda-12.4/lib64")).unwrap();
        std::fs::write(root.join("usr/local/cuda-12.4/lib64/libx.so.1.2"), b"x").unwrap();
        std::os::unix::fs::symlink("/usr/local/cuda-12.4", root.join("usr/local/cuda")).unwrap();
        std::os::unix::fs::symlink(
            "libx.so.1.2",
            root.join("usr/local/cuda-12.4/lib64/libx.so.1"),
        )
        .unwrap();
        assert_eq!(
            real_in(root, "/usr/local/cuda/lib64/libx.so.1").as_deref(),
            Some("/usr/local/cuda-12.4/lib64/libx.so.1.2")
        );
        assert_eq!(
            real_in(root, "/usr/local/cuda/lib64/../lib64/libx.so.1").as_deref(),
            Some("/usr/local/cuda-12.4/lib64/libx.so.1.2")
        );
        // An absolute link never leaves the root.
        std::os::unix::fs::symlink("/../../etc", root.join("up")).unwrap();
        assert_eq!(real_in(root, "/up/passwd"), None);
        assert_eq!(real_in(root, "/usr/local/cuda/lib64/none"), None);
    }

    #[test]
    fn a_plain_search_names_the_step_that_finds_a_library() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let lib = root.join("opt/cuda/lib64");
        std::fs::create_dir_all(&lib).unwrap();
        // Any ELF file of this machine stands for a library: the search reads its header.
        std::fs::copy(std::env::current_exe().unwrap(), lib.join("libfoo.so.12.4")).unwrap();
        std::os::unix::fs::symlink("libfoo.so.12.4", lib.join("libfoo.so.12")).unwrap();
        let env = [("LD_LIBRARY_PATH".to_string(), "/opt/cuda/lib64".to_string())];
        assert_eq!(
            plain_search(root, &env, "libfoo.so.12").unwrap(),
            Some((
                "/opt/cuda/lib64/libfoo.so.12.4".to_string(),
                Via::LdLibraryPath
            ))
        );
        assert_eq!(plain_search(root, &[], "libfoo.so.12").unwrap(), None);
        assert_eq!(plain_search(root, &env, "libbar.so.1").unwrap(), None);
    }

    #[test]
    fn a_truncated_cache_is_an_error_not_a_panic() {
        assert!(parse_cache(b"glibc-ld.so.cache1.1\x05\0\0\0").is_err());
        assert!(parse_cache(b"nothing").is_err());
    }
}
