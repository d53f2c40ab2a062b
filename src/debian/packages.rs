//! A suite's Packages index: chosen from the files its Release lists, checked against the
//! Release's size and SHA256 before a byte of it is parsed, then read stanza by stanza.

use super::http::Client;
use super::release::Release;
use crate::error::{Error, Result};
use debian_control::lossy::Relations;
use debversion::Version;
use sha2::Digest;
use std::io::Read;

/// A compressed index bigger than this is no archive's (Debian main amd64 is 9 MB as xz).
const COMPRESSED_LIMIT: u64 = 1 << 30;
/// Nor one that unpacks to more than this (it is 50 MB).
const UNPACKED_LIMIT: u64 = 4 << 30;

/// How a package may serve other architectures (`Multi-Arch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MultiArch {
    /// `no`, or no field: only its own architecture.
    #[default]
    No,
    /// `same`: co-installable across architectures.
    Same,
    /// `foreign`: satisfies dependencies of every architecture.
    Foreign,
    /// `allowed`: satisfies `NAME:any` dependencies.
    Allowed,
}

/// Where a package's `.deb` lies in its archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolFile {
    /// The archive's base URI (`http://deb.debian.org/debian`).
    pub base: String,
    /// `Filename`, relative to the base (`pool/main/n/numactl/numactl_2.0.16-1_amd64.deb`).
    pub filename: String,
    /// `Size` in bytes.
    pub size: u64,
    /// `SHA256`, lower-case hex.
    pub sha256: String,
}

/// One binary package: a stanza of a Packages index or of dpkg's status.
#[derive(Clone, Debug)]
pub struct Package {
    /// `Package`.
    pub name: String,
    /// `Version`.
    pub version: Version,
    /// `Architecture` (`amd64`, `all`).
    pub architecture: String,
    /// `Multi-Arch`.
    pub multi_arch: MultiArch,
    /// `Essential: yes`.
    pub essential: bool,
    /// `Priority` (`required`, `important`, `standard`, `optional`, `extra`).
    pub priority: Option<String>,
    /// `Pre-Depends`.
    pub pre_depends: Relations,
    /// `Depends`.
    pub depends: Relations,
    /// `Conflicts`.
    pub conflicts: Relations,
    /// `Breaks`.
    pub breaks: Relations,
    /// `Provides`.
    pub provides: Relations,
    /// The source package's name: `Source` without the version dpkg adds in parentheses
    /// when it differs from the binary's; None when the field is absent (the source package
    /// has the binary's name).
    pub source: Option<String>,
    /// The `.deb` in the archive; None for a package read from dpkg's status.
    pub file: Option<PoolFile>,
}

impl Package {
    /// `NAME VERSION`, as messages name a package.
    pub fn label(&self) -> String {
        format!("{} {}", self.name, self.version)
    }
}

/// The packages of one deb822 index: Packages text when `base` is the archive's URI, dpkg's
/// status when it is None (no file fields are needed there). `at` names the file in errors.
/// A stanza `keep` refuses is skipped before its relations are parsed.
pub fn parse_index(
    text: &str,
    base: Option<&str>,
    at: &str,
    keep: impl Fn(&deb822_fast::Paragraph) -> bool,
) -> Result<Vec<Package>> {
    let doc: deb822_fast::Deb822 = text
        .parse()
        .map_err(|e| Error::Usage(format!("{at}: not a deb822 index: {e}")))?;
    let mut out = Vec::with_capacity(doc.len());
    for stanza in doc.iter() {
        if !keep(stanza) {
            continue;
        }
        out.push(package(stanza, base, at)?);
    }
    Ok(out)
}

fn package(stanza: &deb822_fast::Paragraph, base: Option<&str>, at: &str) -> Result<Package> {
    let name = stanza
        .get("Package")
        .map(str::trim)
        .ok_or_else(|| Error::Usage(format!("{at}: a stanza has no Package field")))?;
    let bad = |what: &str, e: String| Error::Usage(format!("{at}: package {name}: {what}: {e}"));
    let required = |field: &str| -> Result<&str> {
        stanza
            .get(field)
            .map(str::trim)
            .ok_or_else(|| bad(field, "missing".into()))
    };
    let version: Version = required("Version")?
        .parse()
        .map_err(|e: debversion::ParseError| bad("Version", e.to_string()))?;
    let relations = |field: &str| -> Result<Relations> {
        match stanza.get(field) {
            None => Ok(Relations(Vec::new())),
            Some(text) => text.trim().parse().map_err(|e| bad(field, e)),
        }
    };
    let file = match base {
        None => None,
        Some(base) => {
            let sha256 = required("SHA256")?.to_ascii_lowercase();
            if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad("SHA256", format!("`{sha256}` is not a SHA256")));
            }
            Some(PoolFile {
                base: base.to_string(),
                filename: required("Filename")?.to_string(),
                size: required("Size")?
                    .parse()
                    .map_err(|e: std::num::ParseIntError| bad("Size", e.to_string()))?,
                sha256,
            })
        }
    };
    Ok(Package {
        name: name.to_string(),
        version,
        architecture: required("Architecture")?.to_string(),
        multi_arch: match stanza.get("Multi-Arch").map(str::trim) {
            Some("same") => MultiArch::Same,
            Some("foreign") => MultiArch::Foreign,
            Some("allowed") => MultiArch::Allowed,
            _ => MultiArch::No,
        },
        essential: stanza.get("Essential").is_some_and(|v| v.trim() == "yes"),
        priority: stanza.get("Priority").map(|v| v.trim().to_string()),
        pre_depends: relations("Pre-Depends")?,
        depends: relations("Depends")?,
        conflicts: relations("Conflicts")?,
        breaks: relations("Breaks")?,
        provides: relations("Provides")?,
        source: stanza
            .get("Source")
            .and_then(|s| s.split_whitespace().next())
            .map(str::to_string),
        file,
    })
}

/// The index files to read for `component` and `arch`: the architecture's own, and
/// binary-all's when the Release does not say `all` packages are already in it. Each is the
/// first of Packages.xz, Packages.gz, Packages the Release lists.
pub fn index_paths(release: &Release, component: &str, arch: &str) -> Result<Vec<String>> {
    let pick = |a: &str| {
        ["Packages.xz", "Packages.gz", "Packages"]
            .iter()
            .map(|f| format!("{component}/binary-{a}/{f}"))
            .find(|p| release.sha256.contains_key(p))
    };
    let Some(own) = pick(arch) else {
        let why = if !release.components.is_empty()
            && !release.components.iter().any(|c| c == component)
        {
            format!(
                "the suite has no component `{component}` (it has {})",
                release.components.join(", ")
            )
        } else {
            format!("it lists no {component}/binary-{arch}/Packages index")
        };
        return Err(Error::Usage(format!("{}: {why}", release.url)));
    };
    let mut out = vec![own];
    // apt reads binary-all only where the Release lists `all` among its Architectures (and
    // does not say `all` packages are in each architecture's index already): Debian's
    // security archive lists a binary-all it does not mean apt to read.
    let lists_all =
        release.architectures.is_empty() || release.architectures.iter().any(|a| a == "all");
    if lists_all
        && !release.all_in_arch
        && let Some(all) = pick("all")
    {
        out.push(all);
    }
    Ok(out)
}

/// The bytes of the index at `path` (as the Release names it), refused unless their size and
/// SHA256 are the ones the signed Release lists.
pub fn fetch_checked(client: &Client, release: &Release, path: &str) -> Result<Vec<u8>> {
    let expected = release
        .sha256
        .get(path)
        .ok_or_else(|| Error::Usage(format!("{}: lists no SHA256 for {path}", release.url)))?;
    let limit = COMPRESSED_LIMIT.min(expected.size + 1);
    let mut url = release.url_of(path);
    let bytes = match client.get(&url, limit) {
        Ok(bytes) => bytes,
        // A mirror that has not got the by-hash copy yet still serves the path, as apt
        // falls back to it; the hash check below is the same either way.
        Err(_) if release.acquire_by_hash => {
            url = format!("{}/{path}", release.dist);
            client.get(&url, limit)?
        }
        Err(e) => return Err(e),
    };
    let actual = hex::encode(sha2::Sha256::digest(&bytes));
    if bytes.len() as u64 != expected.size || actual != expected.sha256 {
        return Err(Error::Usage(format!(
            "{url}: refused: {} bytes with sha256 {actual}, but {} lists {} bytes with sha256 {} \
             (a damaged download, a mirror caught mid-update, or tampering)",
            bytes.len(),
            release.url,
            expected.size,
            expected.sha256
        )));
    }
    Ok(bytes)
}

/// The text of index bytes, unpacked by the name's suffix.
pub fn unpack(bytes: &[u8], path: &str, at: &str) -> Result<String> {
    let mut text = String::new();
    let reader: Box<dyn Read + '_> = if path.ends_with(".xz") {
        Box::new(lzma_rust2::XzReader::new(bytes, true))
    } else if path.ends_with(".gz") {
        Box::new(flate2::read::MultiGzDecoder::new(bytes))
    } else {
        Box::new(bytes)
    };
    reader
        .take(UNPACKED_LIMIT)
        .read_to_string(&mut text)
        .map_err(|e| Error::Usage(format!("{at}: cannot unpack: {e}")))?;
    Ok(text)
}

/// Every package of `component` for `arch` (and `all`) in the suite `release` describes.
pub fn fetch(
    client: &Client,
    release: &Release,
    component: &str,
    arch: &str,
) -> Result<Vec<Package>> {
    let mut out = Vec::new();
    for path in index_paths(release, component, arch)? {
        let bytes = fetch_checked(client, release, &path)?;
        let at = release.url_of(&path);
        let text = unpack(&bytes, &path, &at)?;
        // Only the packages this machine could install: its architecture and `all`.
        let keep = |s: &deb822_fast::Paragraph| {
            s.get("Architecture")
                .is_some_and(|a| a.trim() == arch || a.trim() == "all")
        };
        out.extend(parse_index(&text, Some(&release.base), &at, keep)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STANZAS: &str = "Package: openssh-client\n\
        Source: openssh\n\
        Version: 1:9.2p1-2+deb12u3\n\
        Architecture: amd64\n\
        Multi-Arch: foreign\n\
        Pre-Depends: init-system-helpers (>= 1.54~)\n\
        Depends: adduser, libc6 (>= 2.36), libedit2 (>= 2.11-20080614-4), passwd\n\
        Breaks: openssh-sk-helper\n\
        Conflicts: sftp\n\
        Provides: rsh-client, ssh-client\n\
        Description: secure shell (SSH) client\n continued\n\
        Filename: pool/main/o/openssh/openssh-client_9.2p1-2+deb12u3_amd64.deb\n\
        Size: 991272\n\
        SHA256: 0CD8C8E8A1B1C2D3E4F5061728394A5B6C7D8E9F00112233445566778899AABB\n\
        \n\
        Package: python3-six\n\
        Version: 1.16.0-4\n\
        Architecture: all\n\
        Depends: python3:any\n\
        Provides: python3-six-x (= 1.16)\n\
        Filename: pool/main/s/six/python3-six_1.16.0-4_all.deb\n\
        Size: 17548\n\
        SHA256: 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";

    #[test]
    fn packages_stanzas_with_every_relation_kind() {
        let got = parse_index(STANZAS, Some("http://a"), "P", |_| true).unwrap();
        assert_eq!(got.len(), 2);
        let ssh = &got[0];
        assert_eq!(ssh.version.epoch, Some(1));
        assert_eq!(ssh.multi_arch, MultiArch::Foreign);
        assert_eq!(ssh.depends.0.len(), 4);
        assert_eq!(ssh.depends.0[1][0].name, "libc6");
        assert_eq!(ssh.pre_depends.0[0][0].name, "init-system-helpers");
        assert_eq!(ssh.breaks.0[0][0].name, "openssh-sk-helper");
        assert_eq!(ssh.conflicts.0[0][0].name, "sftp");
        let provided: Vec<&str> = ssh.provides.0.iter().map(|g| g[0].name.as_str()).collect();
        assert_eq!(provided, ["rsh-client", "ssh-client"]);
        let file = ssh.file.as_ref().unwrap();
        assert_eq!(file.size, 991272);
        assert!(file.sha256.starts_with("0cd8c8e8"));
        let six = &got[1];
        assert_eq!(six.depends.0[0][0].archqual.as_deref(), Some("any"));
        assert!(six.provides.0[0][0].version.is_some());
        let only_all = parse_index(STANZAS, Some("http://a"), "P", |s| {
            s.get("Architecture") == Some("all")
        })
        .unwrap();
        assert_eq!(only_all.len(), 1);
    }

    #[test]
    fn a_stanza_with_a_bad_field_names_the_file_and_package() {
        let text = "Package: x\nVersion: 1\nArchitecture: all\nDepends: a (>> )\n";
        let e = parse_index(text, None, "status", |_| true).unwrap_err();
        assert!(
            e.to_string().starts_with("status: package x: Depends"),
            "{e}"
        );
        let text = "Package: y\nVersion: 1\nArchitecture: all\nFilename: f\nSize: 1\n";
        let e = parse_index(text, Some("b"), "P", |_| true).unwrap_err();
        assert!(e.to_string().contains("package y: SHA256: missing"), "{e}");
    }

    #[test]
    fn alternatives_and_version_operators_parse() {
        let r: Relations = "a (<< 1) | b (<= 2) | c (= 3) | d (>= 4) | e (>> 5) | f:native"
            .parse()
            .unwrap();
        use debian_control::relations::VersionConstraint as C;
        let ops: Vec<Option<C>> = r.0[0]
            .iter()
            .map(|rel| rel.version.as_ref().map(|(c, _)| c.clone()))
            .collect();
        assert_eq!(
            ops,
            [
                Some(C::LessThan),
                Some(C::LessThanEqual),
                Some(C::Equal),
                Some(C::GreaterThanEqual),
                Some(C::GreaterThan),
                None
            ]
        );
        assert_eq!(r.0[0][5].archqual.as_deref(), Some("native"));
    }

    #[test]
    fn indexes_unpack_by_suffix() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"Package: a\n").unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(unpack(&gz, "x/Packages.gz", "u").unwrap(), "Package: a\n");
        // A real Packages.xz is unpacked in tests/debian_archive.rs (made by xz(1)).
        let e = unpack(b"not xz", "x/Packages.xz", "http://u").unwrap_err();
        assert!(e.to_string().starts_with("http://u: cannot unpack"), "{e}");
    }
}
