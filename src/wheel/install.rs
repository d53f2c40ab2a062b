//! The native wheel installer: plans a wheel's installation into an install [`Scheme`] as
//! image layer entries, following the binary distribution format (PEP 427 and its successors
//! on packaging.python.org), with no pip, uv or container involved.
//!
//! Nothing is unpacked. Files whose bytes the wheel already holds stay in it and are streamed
//! out by the layer writer, which checks each against the sha256 RECORD gives; only the few
//! files whose bytes change or are generated (`#!python` scripts, entry-point scripts,
//! INSTALLER, RECORD) are held in memory. The output matches what pypa `installer` 1.x writes
//! for a posix target with the same scheme and no bytecode, file for file, so the tests can use
//! it as an oracle.

use crate::error::{Error, Result};
use crate::image::layer::{Entry, ROOT, Source, ZipMember};
use base64::Engine as _;
use sha2::{Digest as _, Sha256, Sha384, Sha512};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

/// Files this module parses (WHEEL, METADATA, RECORD, entry_points.txt) are read whole; a bound
/// keeps a hostile archive from making that an unbounded allocation.
const MAX_PARSED: u64 = 64 << 20;

/// Where a wheel's files go in the image: absolute paths inside the image, e.g. a virtual env.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheme {
    /// Pure-Python modules (`site-packages`).
    pub purelib: String,
    /// Platform-specific modules; the same directory as `purelib` in a virtual env.
    pub platlib: String,
    /// Console scripts and `.data/scripts` (`bin`).
    pub scripts: String,
    /// C headers; each wheel's distribution name is appended to it.
    pub headers: String,
    /// `.data/data`: paths relative to the environment's prefix.
    pub data: String,
    /// The interpreter written into script shebangs.
    pub interpreter: String,
}

impl Scheme {
    /// The scheme of a virtual environment at `prefix` (e.g. "/opt/gpubake/venv") for CPython
    /// `python` ("3.11"): purelib = platlib = `{prefix}/lib/python3.11/site-packages`,
    /// scripts = `{prefix}/bin`, headers = `{prefix}/include/site/python3.11` (the
    /// distribution name is appended per wheel, as pip and installer do in a venv),
    /// data = `{prefix}`, interpreter = `{prefix}/bin/python` (used in shebangs).
    pub fn venv(prefix: &str, python: &str) -> Scheme {
        let prefix = prefix.trim_end_matches('/');
        let site = format!("{prefix}/lib/python{python}/site-packages");
        Scheme {
            purelib: site.clone(),
            platlib: site,
            scripts: format!("{prefix}/bin"),
            headers: format!("{prefix}/include/site/python{python}"),
            data: if prefix.is_empty() {
                "/".to_string()
            } else {
                prefix.to_string()
            },
            interpreter: format!("{prefix}/bin/python"),
        }
    }
}

/// A wheel's installation, planned: what to put in a layer and what it installs.
#[derive(Clone, Debug)]
pub struct Installed {
    /// The distribution name as METADATA spells it.
    pub name: String,
    /// The version as METADATA gives it.
    pub version: String,
    /// The layer entries, sorted by path; parent directories are left to the layer writer.
    pub entries: Vec<Entry>,
    /// Every installed file with its content hash, sorted by path, so that a caller can
    /// tell two wheels that ship the same bytes at one path from a real clash.
    pub files: Vec<InstalledFile>,
}

/// One installed file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstalledFile {
    /// Path inside the image, relative (no leading slash).
    pub path: String,
    /// Its sha256 in hex; [`install`] always knows it (from RECORD for files streamed out of
    /// the wheel, which the layer writer holds them to, or from the bytes it made).
    pub sha256: Option<String>,
}

/// Plans the installation of `wheel` under `scheme`; `installer` is written to the INSTALLER
/// file ("gpubake").
///
/// Every member must be listed in RECORD with a sha256 (or stronger) hash and its size, and
/// every RECORD entry must be in the archive. Files read here (WHEEL, METADATA,
/// entry_points.txt, `#!python` scripts, members hashed with something other than sha256)
/// are checked now; the rest are checked by the layer writer as it streams them.
pub fn install(wheel: &Path, scheme: &Scheme, installer: &str) -> Result<Installed> {
    Planner::open(wheel, scheme)?.plan(installer)
}

/// The five install locations of the binary distribution format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Purelib,
    Platlib,
    Scripts,
    Headers,
    Data,
}

impl Kind {
    fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "purelib" => Kind::Purelib,
            "platlib" => Kind::Platlib,
            "scripts" => Kind::Scripts,
            "headers" => Kind::Headers,
            "data" => Kind::Data,
            _ => return None,
        })
    }
}

/// What the members of one wheel are checked against and where they go.
struct Targets<'a> {
    rows: &'a BTreeMap<String, Row>,
    dirs: &'a Dirs,
    root: Kind,
    data_dir: &'a str,
    record_name: &'a str,
    signatures: &'a [String; 2],
}

/// The scheme's directories, normalised, with the distribution name already under headers.
struct Dirs {
    purelib: String,
    platlib: String,
    scripts: String,
    headers: String,
    data: String,
}

impl Dirs {
    fn of(&self, kind: Kind) -> &str {
        match kind {
            Kind::Purelib => &self.purelib,
            Kind::Platlib => &self.platlib,
            Kind::Scripts => &self.scripts,
            Kind::Headers => &self.headers,
            Kind::Data => &self.data,
        }
    }
}

/// A hash algorithm RECORD may use. Weaker ones (md5, sha1) are refused: RECORD is what the
/// layer's integrity check rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algo {
    Sha256,
    Sha384,
    Sha512,
}

#[derive(Clone, Debug)]
struct Hash {
    algo: Algo,
    digest: Vec<u8>,
}

/// One RECORD row, parsed.
#[derive(Clone, Debug)]
struct Row {
    line: usize,
    hash: Option<Hash>,
    size: Option<u64>,
}

/// One member of the archive's central directory.
#[derive(Clone, Debug)]
struct Member {
    index: usize,
    name: String,
    size: u64,
    is_dir: bool,
    executable: bool,
}

/// A file to install.
struct Planned {
    kind: Kind,
    /// Path within its scheme directory, as RECORD gives it.
    rel: String,
    /// Path inside the image, relative.
    image: String,
    mode: u32,
    source: Source,
    sha256: [u8; 32],
    size: u64,
    /// What put it there, for clash messages.
    origin: String,
}

struct Planner<'a> {
    path: &'a Path,
    scheme: &'a Scheme,
    zip: zip::ZipArchive<BufReader<File>>,
    members: Vec<Member>,
}

impl<'a> Planner<'a> {
    fn open(path: &'a Path, scheme: &'a Scheme) -> Result<Self> {
        let bad = |message: String| wheel_error(path, message);
        let file = File::open(path).map_err(|e| Error::reading(path, e))?;
        let zip = zip::ZipArchive::new(BufReader::new(file))
            .map_err(|e| bad(format!("not a readable zip archive: {e}")))?;
        if zip.has_duplicate_names() {
            return Err(bad(
                "the archive lists a member name more than once; which copy to install is ambiguous"
                    .into(),
            ));
        }
        let mut members = Vec::with_capacity(zip.len());
        for index in 0..zip.len() {
            let entry = zip
                .by_index_data(index)
                .map_err(|e| bad(format!("member #{index}: {e}")))?;
            let name = entry
                .name()
                .map_err(|e| bad(format!("member #{index}: unreadable name: {e}")))?
                .into_owned();
            check_member_name(&name).map_err(|why| bad(format!("member `{name}`: {why}")))?;
            if entry.encrypted() {
                return Err(bad(format!("member `{name}` is encrypted")));
            }
            let is_dir = name.ends_with('/');
            if !is_dir
                && !matches!(
                    entry.compression(),
                    zip::CompressionMethod::Stored | zip::CompressionMethod::Deflated
                )
            {
                return Err(bad(format!(
                    "member `{name}` uses compression {}, but wheels use deflate or none",
                    entry.compression()
                )));
            }
            // pip and installer read the raw high 16 bits whatever system made the archive, and
            // count only regular files with an execute bit as executable.
            let mode = entry.external_attributes() >> 16;
            let executable = mode & 0o170000 == 0o100000 && mode & 0o111 != 0;
            members.push(Member {
                index,
                size: entry.size(),
                is_dir,
                executable,
                name,
            });
        }
        Ok(Planner {
            path,
            scheme,
            zip,
            members,
        })
    }

    fn bad(&self, message: impl Into<String>) -> Error {
        wheel_error(self.path, message.into())
    }

    /// The one top-level `*.dist-info` directory.
    fn dist_info(&self) -> Result<String> {
        let dirs: BTreeSet<&str> = self
            .members
            .iter()
            .filter_map(|m| m.name.split_once('/').map(|(top, _)| top))
            .filter(|top| top.ends_with(".dist-info"))
            .collect();
        match dirs.len() {
            1 => Ok(dirs.into_iter().next().expect("one").to_string()),
            0 => Err(self.bad("no `.dist-info` directory: this is not a wheel")),
            _ => Err(self.bad(format!(
                "{} `.dist-info` directories ({}): a wheel has exactly one",
                dirs.len(),
                dirs.into_iter().collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    fn member(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| !m.is_dir && m.name == name)
    }

    /// The whole member, at most `limit` bytes.
    fn read(&mut self, member: &Member, limit: u64) -> Result<Vec<u8>> {
        if member.size > limit {
            return Err(self.bad(format!(
                "{}: {} bytes, more than the {limit} this installer reads into memory",
                member.name, member.size
            )));
        }
        let path = self.path;
        let bad = |e: String| wheel_error(path, format!("{}: {e}", member.name));
        let reader = self
            .zip
            .by_index(member.index)
            .map_err(|e| bad(e.to_string()))?;
        // The listed size is only a claim until the bytes are read: no allocation on its word.
        let mut bytes = Vec::with_capacity(member.size.min(1 << 20) as usize);
        reader
            .take(member.size.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| bad(e.to_string()))?;
        if bytes.len() as u64 != member.size {
            return Err(bad(format!(
                "{} bytes, but the archive lists {}",
                bytes.len(),
                member.size
            )));
        }
        Ok(bytes)
    }

    /// The first bytes of a member, up to `n`.
    fn head(&mut self, member: &Member, n: u64) -> Result<Vec<u8>> {
        let path = self.path;
        let bad = |e: String| wheel_error(path, format!("{}: {e}", member.name));
        let reader = self
            .zip
            .by_index(member.index)
            .map_err(|e| bad(e.to_string()))?;
        let mut bytes = Vec::new();
        reader
            .take(n)
            .read_to_end(&mut bytes)
            .map_err(|e| bad(e.to_string()))?;
        Ok(bytes)
    }

    /// Hashes a member as it streams by, for RECORD rows in another algorithm than sha256:
    /// the layer writer checks sha256 only, so the stronger hash is checked here.
    fn stream_check(&mut self, member: &Member, row: &Row) -> Result<[u8; 32]> {
        let path = self.path;
        let bad = |e: String| wheel_error(path, format!("{}: {e}", member.name));
        let mut reader = self
            .zip
            .by_index(member.index)
            .map_err(|e| bad(e.to_string()))?;
        let mut hasher = Hasher::new(row.hash.as_ref().map_or(Algo::Sha256, |h| h.algo));
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(bad(e.to_string())),
            };
            hasher.update(&buf[..n]);
        }
        drop(reader);
        let (sha256, other, size) = hasher.finish();
        self.compare(member, row, &sha256, &other, size)?;
        Ok(sha256)
    }

    /// Checks bytes read here against the member's RECORD row.
    fn check_bytes(&self, member: &Member, row: &Row, bytes: &[u8]) -> Result<[u8; 32]> {
        let mut hasher = Hasher::new(row.hash.as_ref().map_or(Algo::Sha256, |h| h.algo));
        hasher.update(bytes);
        let (sha256, other, size) = hasher.finish();
        self.compare(member, row, &sha256, &other, size)?;
        Ok(sha256)
    }

    fn compare(
        &self,
        member: &Member,
        row: &Row,
        sha256: &[u8; 32],
        other: &[u8],
        size: u64,
    ) -> Result<()> {
        if let Some(want) = row.size
            && want != size
        {
            return Err(self.bad(format!(
                "{}: {size} bytes, but RECORD line {} says {want}",
                member.name, row.line
            )));
        }
        if let Some(hash) = &row.hash {
            let got: &[u8] = if hash.algo == Algo::Sha256 {
                sha256
            } else {
                other
            };
            if got != hash.digest.as_slice() {
                return Err(self.bad(format!(
                    "{}: {} {} does not match RECORD's {} (line {})",
                    member.name,
                    algo_name(hash.algo),
                    b64(got),
                    b64(&hash.digest),
                    row.line
                )));
            }
        }
        Ok(())
    }

    /// Reads and checks a dist-info file this module parses.
    fn read_checked(&mut self, name: &str, rows: &BTreeMap<String, Row>) -> Result<Vec<u8>> {
        let member = self
            .member(name)
            .cloned()
            .ok_or_else(|| self.bad(format!("no `{name}` in the wheel")))?;
        let bytes = self.read(&member, MAX_PARSED)?;
        let row = self.row_for(&member, rows)?;
        self.check_bytes(&member, &row, &bytes)?;
        Ok(bytes)
    }

    /// The member's RECORD row, which must carry a hash.
    fn row_for(&self, member: &Member, rows: &BTreeMap<String, Row>) -> Result<Row> {
        let row = rows.get(&member.name).ok_or_else(|| {
            self.bad(format!(
                "{} is not listed in RECORD, so its content cannot be verified",
                member.name
            ))
        })?;
        if row.hash.is_none() {
            return Err(self.bad(format!(
                "{}: RECORD line {} gives no hash, so its content cannot be verified",
                member.name, row.line
            )));
        }
        if let Some(want) = row.size
            && want != member.size
        {
            return Err(self.bad(format!(
                "{}: the archive lists {} bytes, RECORD line {} says {want}",
                member.name, member.size, row.line
            )));
        }
        Ok(row.clone())
    }

    fn text(&self, name: &str, bytes: Vec<u8>) -> Result<String> {
        String::from_utf8(bytes).map_err(|_| self.bad(format!("{name} is not UTF-8")))
    }

    fn plan(mut self, installer: &str) -> Result<Installed> {
        let dist_info = self.dist_info()?;
        let stem = dist_info
            .strip_suffix(".dist-info")
            .expect("found by suffix")
            .to_string();
        let data_dir = format!("{stem}.data");
        let record_name = format!("{dist_info}/RECORD");

        // RECORD first: everything else is checked against it.
        let record_member = self.member(&record_name).cloned().ok_or_else(|| {
            self.bad(format!(
                "no `{record_name}`: without it no file can be verified"
            ))
        })?;
        let record_bytes = self.read(&record_member, MAX_PARSED)?;
        let record_text = self.text(&record_name, record_bytes)?;
        let rows =
            parse_record(&record_text).map_err(|e| self.bad(format!("{record_name}: {e}")))?;

        let wheel_text = {
            let bytes = self.read_checked(&format!("{dist_info}/WHEEL"), &rows)?;
            self.text(&format!("{dist_info}/WHEEL"), bytes)?
        };
        let wheel_meta = parse_headers(&wheel_text);
        let root =
            root_kind(&wheel_meta).map_err(|e| self.bad(format!("{dist_info}/WHEEL: {e}")))?;

        let (name, version) = self.name_and_version(&dist_info, &stem, &rows)?;

        let dirs = self
            .dirs(&name)
            .map_err(|e| self.bad(format!("install scheme: {e}")))?;
        let interpreter = &self.scheme.interpreter;
        if interpreter.is_empty() || interpreter.contains(['\n', '\r', '\0']) {
            return Err(self.bad(format!(
                "install scheme: interpreter `{}` cannot go in a shebang line",
                interpreter.escape_debug()
            )));
        }

        // Every member in RECORD and every RECORD row in the archive, before anything else.
        let signatures = [
            format!("{dist_info}/RECORD.jws"),
            format!("{dist_info}/RECORD.p7s"),
        ];
        let targets = Targets {
            rows: &rows,
            dirs: &dirs,
            root,
            data_dir: &data_dir,
            record_name: &record_name,
            signatures: &signatures,
        };
        self.check_record_lists_the_archive(&targets)?;

        // installer writes entry-point scripts first; RECORD's order follows from it.
        let mut planned = self.entry_point_scripts(&dist_info, &targets)?;
        for member in self.members.clone() {
            if let Some(p) = self.plan_member(&member, &targets)? {
                planned.push(p);
            }
        }

        planned.push(generated(
            &dirs,
            root,
            &format!("{dist_info}/INSTALLER"),
            0o644,
            format!("{installer}\n").into_bytes(),
            "INSTALLER".into(),
        ));

        let record = record_file(&planned, &dirs, root, &record_name);
        planned.push(generated(
            &dirs,
            root,
            &record_name,
            0o644,
            record,
            "RECORD".into(),
        ));
        check_clashes(&planned).map_err(|e| self.bad(e))?;

        planned.sort_by(|a, b| a.image.cmp(&b.image));
        let files = planned
            .iter()
            .map(|p| InstalledFile {
                path: p.image.clone(),
                sha256: Some(hex::encode(p.sha256)),
            })
            .collect();
        let entries = planned
            .into_iter()
            .map(|p| Entry {
                path: p.image,
                mode: p.mode,
                owner: ROOT,
                source: p.source,
            })
            .collect();
        Ok(Installed {
            name,
            version,
            entries,
            files,
        })
    }

    /// The distribution's Name and Version from METADATA (checked against RECORD), which must
    /// be a valid name that the .dist-info directory belongs to.
    fn name_and_version(
        &mut self,
        dist_info: &str,
        stem: &str,
        rows: &BTreeMap<String, Row>,
    ) -> Result<(String, String)> {
        let metadata_name = format!("{dist_info}/METADATA");
        let metadata_text = {
            let bytes = self.read_checked(&metadata_name, rows)?;
            self.text(&metadata_name, bytes)?
        };
        let metadata = parse_headers(&metadata_text);
        let name = header(&metadata, "Name")
            .ok_or_else(|| self.bad(format!("{metadata_name} has no Name")))?
            .to_string();
        let version = header(&metadata, "Version")
            .ok_or_else(|| self.bad(format!("{metadata_name} has no Version")))?
            .to_string();
        if !valid_name(&name) {
            return Err(self.bad(format!(
                "{metadata_name}: `{name}` is not a valid distribution name"
            )));
        }
        if !canonical(stem).starts_with(&format!("{}-", canonical(&name))) {
            return Err(self.bad(format!(
                "`{dist_info}` does not belong to `{name}`, the Name in its METADATA"
            )));
        }
        Ok((name, version))
    }

    /// Every member of the archive has its RECORD row and every RECORD row its member.
    fn check_record_lists_the_archive(&self, t: &Targets) -> Result<()> {
        let mut unlisted = t.rows.clone();
        unlisted.remove(t.record_name);
        for member in &self.members {
            if !(member.is_dir
                || member.name == t.record_name
                || t.signatures.contains(&member.name))
            {
                self.row_for(member, t.rows)?;
            }
            unlisted.remove(&member.name);
        }
        if let Some((path, row)) = unlisted.iter().next() {
            return Err(self.bad(format!(
                "RECORD line {} lists `{path}`, which is not in the wheel{}",
                row.line,
                if unlisted.len() > 1 {
                    format!(" ({} such entries)", unlisted.len())
                } else {
                    String::new()
                }
            )));
        }
        Ok(())
    }

    /// The console and GUI scripts entry_points.txt names, as installer writes them.
    fn entry_point_scripts(&mut self, dist_info: &str, t: &Targets) -> Result<Vec<Planned>> {
        let entry_points_name = format!("{dist_info}/entry_points.txt");
        if self.member(&entry_points_name).is_none() {
            return Ok(Vec::new());
        }
        let bytes = self.read_checked(&entry_points_name, t.rows)?;
        let text = self.text(&entry_points_name, bytes)?;
        let scripts =
            parse_entry_points(&text).map_err(|e| self.bad(format!("{entry_points_name}: {e}")))?;
        Ok(scripts
            .into_iter()
            .map(|script| {
                let body = script_body(&self.scheme.interpreter, &script.module, &script.attr);
                generated(
                    t.dirs,
                    Kind::Scripts,
                    &script.name,
                    0o755,
                    body,
                    format!(
                        "{} script `{}` from entry_points.txt",
                        script.section, script.name
                    ),
                )
            })
            .collect())
    }

    /// Where one member of the archive goes and what it holds, checked against its RECORD
    /// row; None for what is not installed (directories, RECORD itself, `__pycache__`).
    fn plan_member(&mut self, member: &Member, t: &Targets) -> Result<Option<Planned>> {
        if member.is_dir || member.name == t.record_name {
            return Ok(None);
        }
        // installer skips these as a security risk; they would be bytecode anyway.
        let (parents, _) = member.name.rsplit_once('/').unwrap_or(("", ""));
        if parents.split('/').any(|c| c == "__pycache__") {
            return Ok(None);
        }
        let (kind, rel) = match member.name.strip_prefix(&format!("{}/", t.data_dir)) {
            None => (t.root, member.name.clone()),
            Some(rest) => {
                let (scheme_name, rel) = rest.split_once('/').ok_or_else(|| {
                    self.bad(format!(
                        "{}: files in `{}` belong in one of its purelib, platlib, scripts, headers or data directories",
                        member.name, t.data_dir
                    ))
                })?;
                let kind = Kind::parse(scheme_name).ok_or_else(|| {
                    self.bad(format!(
                        "{}: `{scheme_name}` is not a scheme a wheel may install to (purelib, platlib, scripts, headers, data)",
                        member.name
                    ))
                })?;
                (kind, rel.to_string())
            }
        };
        let mode = if member.executable { 0o755 } else { 0o644 };
        if t.signatures.contains(&member.name) {
            // Not in RECORD, so read here to know what is installed.
            let bytes = self.read(member, MAX_PARSED)?;
            let origin = member.name.clone();
            return Ok(Some(generated(t.dirs, kind, &rel, mode, bytes, origin)));
        }
        let row = self.row_for(member, t.rows)?;
        if kind == Kind::Scripts && self.head(member, 8)? == b"#!python" {
            let bytes = self.read(member, u64::MAX)?;
            self.check_bytes(member, &row, &bytes)?;
            let rest = bytes
                .iter()
                .position(|&b| b == b'\n')
                .map_or(&[][..], |i| &bytes[i + 1..]);
            let mut body = format!("#!{}\n", self.scheme.interpreter).into_bytes();
            body.extend_from_slice(rest);
            let origin = member.name.clone();
            return Ok(Some(generated(t.dirs, kind, &rel, mode, body, origin)));
        }
        let hash = row.hash.as_ref().expect("row_for requires a hash");
        let sha256: [u8; 32] = if hash.algo == Algo::Sha256 {
            hash.digest
                .as_slice()
                .try_into()
                .expect("parse_hash checks the length")
        } else {
            self.stream_check(member, &row)?
        };
        Ok(Some(Planned {
            kind,
            image: image_path(t.dirs.of(kind), &rel),
            rel,
            mode,
            source: Source::Zip(ZipMember {
                archive: self.path.to_path_buf(),
                index: member.index,
                size: member.size,
                sha256: Some(sha256),
                name: member.name.clone(),
            }),
            sha256,
            size: member.size,
            origin: member.name.clone(),
        }))
    }

    fn dirs(&self, name: &str) -> Result<Dirs, String> {
        let s = self.scheme;
        let headers = normalize("headers", &s.headers)?;
        Ok(Dirs {
            purelib: normalize("purelib", &s.purelib)?,
            platlib: normalize("platlib", &s.platlib)?,
            scripts: normalize("scripts", &s.scripts)?,
            headers: if headers == "/" {
                format!("/{name}")
            } else {
                format!("{headers}/{name}")
            },
            data: normalize("data", &s.data)?,
        })
    }
}

fn wheel_error(path: &Path, message: String) -> Error {
    Error::Wheel {
        wheel: path.display().to_string(),
        message,
    }
}

/// A file whose bytes are made here.
fn generated(
    dirs: &Dirs,
    kind: Kind,
    rel: &str,
    mode: u32,
    bytes: Vec<u8>,
    origin: String,
) -> Planned {
    let sha256: [u8; 32] = Sha256::digest(&bytes).into();
    Planned {
        kind,
        rel: rel.to_string(),
        image: image_path(dirs.of(kind), rel),
        mode,
        size: bytes.len() as u64,
        source: Source::Bytes(bytes),
        sha256,
        origin,
    }
}

/// Two files at one path, or a file where another needs a directory, would leave the result
/// depending on order; installer refuses both too.
fn check_clashes(planned: &[Planned]) -> Result<(), String> {
    let mut by_path: BTreeMap<&str, &str> = BTreeMap::new();
    for p in planned {
        if let Some(first) = by_path.insert(&p.image, &p.origin) {
            return Err(format!(
                "{first} and {} both install to /{}",
                p.origin, p.image
            ));
        }
    }
    for p in planned {
        let mut at = p.image.as_str();
        while let Some((parent, _)) = at.rsplit_once('/') {
            if let Some(other) = by_path.get(parent) {
                return Err(format!(
                    "{other} installs a file at /{parent}, where {} needs a directory",
                    p.origin
                ));
            }
            at = parent;
        }
    }
    Ok(())
}

/// The installed RECORD: every file relative to the root scheme's directory, files of other
/// schemes through `..` as installer writes them, sorted as installer sorts them (by the path
/// within each file's scheme, stably), RECORD itself last with no hash or size.
fn record_file(planned: &[Planned], dirs: &Dirs, root: Kind, record_name: &str) -> Vec<u8> {
    let mut rows: Vec<(&str, String, String, String)> = planned
        .iter()
        .map(|p| {
            // installer compares scheme names, not directories: purelib files in a platlib
            // wheel get `./` even where both are one directory.
            let path = if p.kind == root {
                p.rel.clone()
            } else {
                format!("{}/{}", relpath(dirs.of(p.kind), dirs.of(root)), p.rel)
            };
            (
                p.rel.as_str(),
                path,
                format!("sha256={}", b64(&p.sha256)),
                p.size.to_string(),
            )
        })
        .collect();
    rows.push((
        record_name,
        record_name.to_string(),
        String::new(),
        String::new(),
    ));
    rows.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = String::new();
    for (_, path, hash, size) in rows {
        write_csv_row(&mut out, &[&path, &hash, &size]);
    }
    out.into_bytes()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn algo_name(algo: Algo) -> &'static str {
    match algo {
        Algo::Sha256 => "sha256",
        Algo::Sha384 => "sha384",
        Algo::Sha512 => "sha512",
    }
}

/// sha256 always (the layer's check and [`InstalledFile`] need it), plus RECORD's algorithm
/// when that is another.
enum Hasher {
    Sha256(Sha256, u64),
    Sha384(Sha256, Sha384, u64),
    Sha512(Sha256, Sha512, u64),
}

impl Hasher {
    fn new(algo: Algo) -> Self {
        match algo {
            Algo::Sha256 => Hasher::Sha256(Sha256::new(), 0),
            Algo::Sha384 => Hasher::Sha384(Sha256::new(), Sha384::new(), 0),
            Algo::Sha512 => Hasher::Sha512(Sha256::new(), Sha512::new(), 0),
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(a, n) => {
                a.update(bytes);
                *n += bytes.len() as u64;
            }
            Hasher::Sha384(a, b, n) => {
                a.update(bytes);
                b.update(bytes);
                *n += bytes.len() as u64;
            }
            Hasher::Sha512(a, b, n) => {
                a.update(bytes);
                b.update(bytes);
                *n += bytes.len() as u64;
            }
        }
    }

    fn finish(self) -> ([u8; 32], Vec<u8>, u64) {
        match self {
            Hasher::Sha256(a, n) => (a.finalize().into(), Vec::new(), n),
            Hasher::Sha384(a, b, n) => (a.finalize().into(), b.finalize().to_vec(), n),
            Hasher::Sha512(a, b, n) => (a.finalize().into(), b.finalize().to_vec(), n),
        }
    }
}

/// Refuses names that could land outside their scheme directory or mean different files to
/// different readers.
fn check_member_name(name: &str) -> Result<(), String> {
    let body = name.strip_suffix('/').unwrap_or(name);
    if body.is_empty() {
        return Err("an empty path".into());
    }
    if name.starts_with('/') {
        return Err("an absolute path is refused".into());
    }
    if name.contains('\\') {
        return Err("a backslash in a path is refused (it separates paths on Windows)".into());
    }
    if name.contains('\0') {
        return Err("a NUL byte in a path is refused".into());
    }
    for part in body.split('/') {
        match part {
            ".." => return Err("a `..` path component is refused".into()),
            "." => return Err("a `.` path component is refused".into()),
            "" => return Err("an empty path component is refused".into()),
            _ => {}
        }
    }
    Ok(())
}

/// An absolute image path with `.`, `..` and repeated slashes resolved, as installer's
/// `os.path.abspath` would; no trailing slash except for the root.
fn normalize(field: &str, value: &str) -> Result<String, String> {
    if !value.starts_with('/') {
        return Err(format!("{field} `{value}` is not an absolute path"));
    }
    if value.contains(['\0', '\n', '\r']) {
        return Err(format!(
            "{field} `{}` contains a control character",
            value.escape_debug()
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in value.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// `rel` under `dir`, as a path inside the image without the leading slash.
fn image_path(dir: &str, rel: &str) -> String {
    let dir = dir.trim_start_matches('/');
    if dir.is_empty() {
        rel.to_string()
    } else {
        format!("{dir}/{rel}")
    }
}

/// `target` relative to `start` (both normalised absolute paths), like `os.path.relpath`.
fn relpath(target: &str, start: &str) -> String {
    let t: Vec<&str> = target.split('/').filter(|p| !p.is_empty()).collect();
    let s: Vec<&str> = start.split('/').filter(|p| !p.is_empty()).collect();
    let common = t.iter().zip(&s).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<&str> = vec![".."; s.len() - common];
    parts.extend(&t[common..]);
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

/// PEP 503 normalisation: lower case, runs of `-`, `_` and `.` as one `-`.
fn canonical(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_run {
                out.push('-');
            }
            in_run = true;
        } else {
            out.extend(c.to_lowercase());
            in_run = false;
        }
    }
    out
}

/// The core metadata rule for names: ASCII letters and digits, with `.`, `_`, `-` inside.
/// It also keeps the name safe to use as the headers directory.
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    let ends_ok = |c: &u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.first().is_some_and(ends_ok)
        && b.last().is_some_and(ends_ok)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// Which scheme the archive root goes to, from WHEEL.
fn root_kind(wheel: &[(String, String)]) -> Result<Kind, String> {
    let version = header(wheel, "Wheel-Version").ok_or("no Wheel-Version")?;
    let major = version.split('.').next().unwrap_or("");
    if major != "1" {
        return Err(format!(
            "Wheel-Version {version} is not supported; this installer reads version 1.x wheels"
        ));
    }
    Ok(
        match header(wheel, "Root-Is-Purelib").map(str::to_ascii_lowercase) {
            Some(v) if v == "true" => Kind::Purelib,
            _ => Kind::Platlib,
        },
    )
}

/// Headers of an RFC 822 style file (METADATA, WHEEL): `Key: value` lines up to the first
/// blank line, indented lines continuing the previous value.
fn parse_headers(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            match out.last_mut() {
                Some((_, value)) => {
                    value.push('\n');
                    value.push_str(line);
                }
                None => break,
            }
            continue;
        }
        match line.split_once(':') {
            Some((key, value)) if !key.is_empty() && !key.contains([' ', '\t']) => {
                out.push((key.to_string(), value.trim().to_string()));
            }
            // Like Python's email parser: a line that is no header starts the body.
            _ => break,
        }
    }
    out
}

/// The first value of `key`, compared without case as email headers are.
fn header<'h>(headers: &'h [(String, String)], key: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// RECORD rows by path, each with a hash in an accepted algorithm (or none) and a size.
fn parse_record(text: &str) -> Result<BTreeMap<String, Row>, String> {
    let mut rows = BTreeMap::new();
    for (line, fields) in read_csv(text)? {
        let [path, hash, size] = fields.as_slice() else {
            return Err(format!(
                "line {line}: {} fields, but a RECORD row has path, hash and size",
                fields.len()
            ));
        };
        // RECORD files written on Windows may use backslashes; installer reads them as `/`.
        let path = path.replace('\\', "/");
        if path.is_empty() {
            return Err(format!("line {line}: an empty path"));
        }
        let hash = if hash.is_empty() {
            None
        } else {
            Some(parse_hash(hash).map_err(|e| format!("line {line} ({path}): {e}"))?)
        };
        let size =
            if size.is_empty() {
                None
            } else {
                Some(size.parse::<u64>().map_err(|_| {
                    format!("line {line} ({path}): size `{size}` is not a byte count")
                })?)
            };
        if rows
            .insert(path.clone(), Row { line, hash, size })
            .is_some()
        {
            return Err(format!("line {line}: `{path}` is listed twice"));
        }
    }
    Ok(rows)
}

fn parse_hash(text: &str) -> Result<Hash, String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("hash `{text}` is not `algorithm=digest`"))?;
    let (algo, len) = match name {
        "sha256" => (Algo::Sha256, 32),
        "sha384" => (Algo::Sha384, 48),
        "sha512" => (Algo::Sha512, 64),
        other => {
            return Err(format!(
                "hash algorithm `{other}` is not accepted (sha256, sha384 or sha512)"
            ));
        }
    };
    let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD_INDIFFERENT
        .decode(value)
        .map_err(|e| format!("hash `{text}` is not URL-safe base64: {e}"))?;
    if digest.len() != len {
        return Err(format!(
            "hash `{text}` has {} bytes, but {name} has {len}",
            digest.len()
        ));
    }
    Ok(Hash { algo, digest })
}

/// CSV as Python's `csv` module writes it: fields split by commas, quoted with `"` when they
/// hold a comma, quote or line break, quotes doubled inside. Returns each record with the line
/// it starts on; blank lines are skipped.
fn read_csv(text: &str) -> Result<Vec<(usize, Vec<String>)>, String> {
    let mut records = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    loop {
        let start = line;
        let mut fields = Vec::new();
        let mut field = String::new();
        let mut seen = false;
        let mut ended = false;
        loop {
            let Some(c) = chars.next() else {
                ended = true;
                break;
            };
            seen = true;
            match c {
                '"' if field.is_empty() => loop {
                    match chars.next() {
                        None => return Err(format!("line {start}: a quoted field is not closed")),
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            field.push('"');
                        }
                        Some('"') => match chars.peek() {
                            None | Some(',' | '\n' | '\r') => break,
                            Some(other) => {
                                return Err(format!(
                                    "line {line}: `{other}` after a closing quote"
                                ));
                            }
                        },
                        Some(ch) => {
                            if ch == '\n' {
                                line += 1;
                            }
                            field.push(ch);
                        }
                    }
                },
                ',' => fields.push(std::mem::take(&mut field)),
                '\r' | '\n' => {
                    if c == '\r' && chars.peek() == Some(&'\n') {
                        chars.next();
                    }
                    line += 1;
                    break;
                }
                c => field.push(c),
            }
        }
        // A line with nothing on it is no record.
        if seen && !(fields.is_empty() && field.is_empty()) {
            fields.push(field);
            records.push((start, fields));
        }
        if ended {
            return Ok(records);
        }
    }
}

/// One CSV row as Python's `csv.writer` (minimal quoting, `\n` line ends) writes it.
fn write_csv_row(out: &mut String, fields: &[&str]) {
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if field.contains([',', '"', '\n', '\r']) {
            out.push('"');
            out.push_str(&field.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(field);
        }
    }
    out.push('\n');
}

/// A console or GUI script entry point.
#[derive(Debug, PartialEq, Eq)]
struct Script {
    name: String,
    module: String,
    attr: String,
    section: &'static str,
}

/// The `console_scripts` and `gui_scripts` of an entry_points.txt, read as Python's
/// `ConfigParser` reads it (installer uses one): `[section]` headers, `name = value` options
/// with case kept, `#` and `;` comment lines, indented continuation lines, options in
/// `[DEFAULT]` inherited by every section, duplicates refused.
fn parse_entry_points(text: &str) -> Result<Vec<Script>, String> {
    type Section = Vec<(String, String, usize)>;
    let mut sections: Vec<(String, Section)> = Vec::new();
    let mut defaults: Section = Vec::new();
    let mut in_default = false;
    let mut current: Option<usize> = None;
    // The option a continuation line extends: (indent of its key, whether it is in DEFAULT).
    let mut last_indent: Option<usize> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = raw.trim();
        let indent = raw.len() - raw.trim_start().len();
        if trimmed.starts_with(['#', ';']) {
            continue;
        }
        if trimmed.is_empty() {
            // A blank line ends no value in ConfigParser, but values are stripped, so
            // dropping it changes nothing we use.
            continue;
        }
        if let Some(key_indent) = last_indent
            && indent > key_indent
            && (current.is_some() || in_default)
        {
            let target = if in_default {
                defaults.last_mut()
            } else {
                current.and_then(|c| sections[c].1.last_mut())
            };
            if let Some((_, value, _)) = target {
                value.push('\n');
                value.push_str(trimmed);
                continue;
            }
        }
        if trimmed.starts_with('[') && trimmed.ends_with(']') && trimmed.len() > 2 {
            let name = &trimmed[1..trimmed.len() - 1];
            last_indent = None;
            if name == "DEFAULT" {
                in_default = true;
                current = None;
                continue;
            }
            if sections.iter().any(|(s, _)| s == name) {
                return Err(format!("line {n}: section [{name}] appears twice"));
            }
            in_default = false;
            sections.push((name.to_string(), Vec::new()));
            current = Some(sections.len() - 1);
            continue;
        }
        let Some((key, value)) = raw.split_once('=') else {
            return Err(format!(
                "line {n}: `{trimmed}` is neither a section nor `name = value`"
            ));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("line {n}: an option with no name"));
        }
        let section = if in_default {
            &mut defaults
        } else {
            match current {
                Some(c) => &mut sections[c].1,
                None => return Err(format!("line {n}: an option before any [section]")),
            }
        };
        if section.iter().any(|(k, _, _)| k == key) {
            return Err(format!("line {n}: `{key}` appears twice in its section"));
        }
        section.push((key.to_string(), value.trim().to_string(), n));
        last_indent = Some(indent);
    }
    let mut scripts = Vec::new();
    for (name, options) in &sections {
        let section = match name.as_str() {
            "console_scripts" => "console",
            "gui_scripts" => "gui",
            _ => continue,
        };
        // ConfigParser lists inherited options first, in their order, a section's own value
        // replacing an inherited one in place.
        let mut merged: Vec<(&str, &str, usize)> = defaults
            .iter()
            .map(|(k, v, l)| (k.as_str(), v.as_str(), *l))
            .collect();
        for (k, v, l) in options {
            match merged.iter_mut().find(|(mk, _, _)| mk == k) {
                Some(slot) => *slot = (k, v, *l),
                None => merged.push((k, v, *l)),
            }
        }
        for (key, value, line) in merged {
            let (module, attr) = parse_entry_point(value).ok_or_else(|| {
                format!("line {line}: `{key} = {value}` is not `module:attribute`")
            })?;
            if key.contains(['/', '\0']) || key == "." || key == ".." {
                return Err(format!(
                    "line {line}: `{key}` cannot be a script's file name"
                ));
            }
            scripts.push(Script {
                name: key.to_string(),
                module: module.to_string(),
                attr: attr.to_string(),
                section,
            });
        }
    }
    Ok(scripts)
}

/// `module:attr [extras]`, with the characters installer's pattern allows.
fn parse_entry_point(value: &str) -> Option<(&str, &str)> {
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == '.';
    let module_end = value.find(|c: char| !word(c)).unwrap_or(value.len());
    let module = &value[..module_end];
    let rest = value[module_end..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let attr_end = rest.find(|c: char| !word(c)).unwrap_or(rest.len());
    let attr = &rest[..attr_end];
    let tail = rest[attr_end..].trim();
    let tail_ok = tail.is_empty()
        || (tail.starts_with('[') && tail.ends_with(']') && !tail.contains(['\n', '\r']));
    (!module.is_empty() && !attr.is_empty() && tail_ok).then_some((module, attr))
}

/// The launcher installer 1.x writes for a posix entry point, byte for byte, so images and
/// pip-style installs behave the same.
fn script_body(interpreter: &str, module: &str, attr: &str) -> Vec<u8> {
    let import = attr.split('.').next().unwrap_or(attr);
    let mut out = shebang(interpreter);
    out.push(b'\n');
    out.extend_from_slice(
        format!(
            "# -*- coding: utf-8 -*-\n\
             import re\n\
             import sys\n\
             from {module} import {import}\n\
             if __name__ == \"__main__\":\n    \
             sys.argv[0] = re.sub(r\"(-script\\.pyw|\\.exe)?$\", \"\", sys.argv[0])\n    \
             sys.exit({attr}())\n"
        )
        .as_bytes(),
    );
    out
}

/// A shebang for `interpreter`. The kernel reads at most 127 bytes of it and splits at the
/// first space, so a long interpreter or one with a space is started through /bin/sh.
fn shebang(interpreter: &str) -> Vec<u8> {
    let simple = !interpreter.contains(' ') && interpreter.len() + 3 <= 127;
    if simple {
        return format!("#!{interpreter}").into_bytes();
    }
    format!(
        "#!/bin/sh\n'''exec' {} \"$0\" \"$@\"\n' '''",
        shell_quote(interpreter)
    )
    .into_bytes()
}

/// Python's `shlex.quote`.
fn shell_quote(s: &str) -> String {
    if s.is_empty() {
        return "''".into();
    }
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if s.chars().all(safe) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\"'\"'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_reads_quotes_commas_and_line_breaks() {
        let text = "a,sha256=x,1\r\n\"b,c\",\"\",2\n\n\"d\"\"e\",,\n\"f\ng\",h,3";
        let rows = read_csv(text).unwrap();
        assert_eq!(
            rows,
            vec![
                (1, vec!["a".into(), "sha256=x".into(), "1".into()]),
                (2, vec!["b,c".into(), "".into(), "2".into()]),
                (4, vec!["d\"e".into(), "".into(), "".into()]),
                (5, vec!["f\ng".into(), "h".into(), "3".into()]),
            ]
        );
        assert!(read_csv("\"open,x,1\n").unwrap_err().contains("not closed"));
        assert!(
            read_csv("\"a\"b,x,1\n")
                .unwrap_err()
                .contains("after a closing quote")
        );
    }

    #[test]
    fn csv_writes_what_it_reads() {
        let mut out = String::new();
        write_csv_row(&mut out, &["a,b", "say \"hi\"", "", "plain"]);
        assert_eq!(out, "\"a,b\",\"say \"\"hi\"\"\",,plain\n");
        assert_eq!(
            read_csv(&out).unwrap()[0].1,
            vec!["a,b", "say \"hi\"", "", "plain"]
        );
    }

    #[test]
    fn record_hashes_must_be_sha256_or_stronger() {
        let digest = b64(&Sha256::digest(b"x"));
        let ok = parse_record(&format!("a,sha256={digest},1\nb,,\n")).unwrap();
        assert_eq!(ok["a"].size, Some(1));
        assert!(ok["b"].hash.is_none());
        let md5 = parse_record("a,md5=AAAA,1\n").unwrap_err();
        assert!(md5.contains("`md5` is not accepted"), "{md5}");
        let short = parse_record("a,sha256=AAAA,1\n").unwrap_err();
        assert!(short.contains("has 3 bytes"), "{short}");
        let twice =
            parse_record(&format!("a,sha256={digest},1\na,sha256={digest},1\n")).unwrap_err();
        assert!(twice.contains("listed twice"), "{twice}");
        let fields = parse_record("a,b\n").unwrap_err();
        assert!(fields.contains("2 fields"), "{fields}");
        let padded = parse_record(&format!("a,sha256={digest}=,1\n")).unwrap();
        assert_eq!(padded["a"].hash.as_ref().unwrap().digest.len(), 32);
    }

    #[test]
    fn member_names_stay_inside() {
        assert!(check_member_name("pkg/mod.py").is_ok());
        assert!(check_member_name("pkg/").is_ok());
        for bad in [
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/./b",
            "a//b",
            "a\\..\\b",
            "",
            "/",
        ] {
            assert!(check_member_name(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn paths_relative_like_os_path_relpath() {
        let site = "/v/lib/python3.12/site-packages";
        assert_eq!(relpath("/v/bin", site), "../../../bin");
        assert_eq!(relpath("/v", site), "../../..");
        assert_eq!(relpath(site, site), ".");
        assert_eq!(relpath("/v/lib/python3.12/site-packages/x", site), "x");
        assert_eq!(normalize("data", "/a//b/./c/../d/").unwrap(), "/a/b/d");
        assert_eq!(normalize("data", "/").unwrap(), "/");
        assert!(normalize("data", "rel/path").is_err());
        assert_eq!(image_path("/", "x"), "x");
        assert_eq!(image_path("/opt/v", "x"), "opt/v/x");
    }

    #[test]
    fn venv_scheme() {
        let s = Scheme::venv("/opt/gpubake/venv/", "3.12");
        assert_eq!(s.purelib, "/opt/gpubake/venv/lib/python3.12/site-packages");
        assert_eq!(s.platlib, s.purelib);
        assert_eq!(s.scripts, "/opt/gpubake/venv/bin");
        assert_eq!(s.headers, "/opt/gpubake/venv/include/site/python3.12");
        assert_eq!(s.data, "/opt/gpubake/venv");
        assert_eq!(s.interpreter, "/opt/gpubake/venv/bin/python");
    }

    #[test]
    fn entry_points_as_configparser_reads_them() {
        let text = "# comment\n[console_scripts]\nTool = pkg.cli:main\nother=pkg:obj.run [extra]\n\n\
                    [gui_scripts]\ngui = pkg.gui : start\n[other]\nx = y:z\n";
        let scripts = parse_entry_points(text).unwrap();
        let got: Vec<_> = scripts
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.module.as_str(),
                    s.attr.as_str(),
                    s.section,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("Tool", "pkg.cli", "main", "console"),
                ("other", "pkg", "obj.run", "console"),
                ("gui", "pkg.gui", "start", "gui"),
            ]
        );
        assert!(
            parse_entry_points("[console_scripts]\na = b:c\na = d:e\n")
                .unwrap_err()
                .contains("twice")
        );
        assert!(
            parse_entry_points("[console_scripts]\na = b\n")
                .unwrap_err()
                .contains("module:attribute")
        );
        assert!(
            parse_entry_points("[console_scripts]\n../evil = b:c\n")
                .unwrap_err()
                .contains("file name")
        );
        assert!(
            parse_entry_points("a = b:c\n")
                .unwrap_err()
                .contains("before any")
        );
        let defaults =
            parse_entry_points("[DEFAULT]\nd = m:f\n[console_scripts]\na = b:c\n").unwrap();
        assert_eq!(defaults.len(), 2);
        assert_eq!(defaults[0].name, "d");
    }

    #[test]
    fn launcher_matches_installer() {
        let body = String::from_utf8(script_body("/v/bin/python", "pkg.cli", "app.main")).unwrap();
        assert_eq!(
            body,
            "#!/v/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom pkg.cli import app\n\
             if __name__ == \"__main__\":\n    sys.argv[0] = re.sub(r\"(-script\\.pyw|\\.exe)?$\", \"\", sys.argv[0])\n    \
             sys.exit(app.main())\n"
        );
        assert_eq!(
            String::from_utf8(shebang("/my env/bin/python")).unwrap(),
            "#!/bin/sh\n'''exec' '/my env/bin/python' \"$0\" \"$@\"\n' '''"
        );
        let long = format!("/{}/python", "x".repeat(130));
        assert!(shebang(&long).starts_with(b"#!/bin/sh\n"));
        assert_eq!(shell_quote("it's"), "'it'\"'\"'s'");
    }

    #[test]
    fn headers_and_names() {
        let h = parse_headers("Name: Foo\nVersion:  1.0 \nSummary: a\n  continued\n\nName: Body\n");
        assert_eq!(header(&h, "name"), Some("Foo"));
        assert_eq!(header(&h, "VERSION"), Some("1.0"));
        assert_eq!(header(&h, "Summary"), Some("a\n  continued"));
        assert!(valid_name("pybind11_global") && valid_name("A") && valid_name("a.b-c"));
        assert!(!valid_name("../x") && !valid_name("a/b") && !valid_name("-a") && !valid_name(""));
        assert_eq!(canonical("PyBind11__Global"), "pybind11-global");
        let wheel = parse_headers("Wheel-Version: 2.0\n");
        assert!(root_kind(&wheel).unwrap_err().contains("2.0"));
        let pure = parse_headers("Wheel-Version: 1.0\nRoot-Is-Purelib: true\n");
        assert_eq!(root_kind(&pure).unwrap(), Kind::Purelib);
        let plat = parse_headers("Wheel-Version: 1.0\nRoot-Is-Purelib: false\n");
        assert_eq!(root_kind(&plat).unwrap(), Kind::Platlib);
    }
}
