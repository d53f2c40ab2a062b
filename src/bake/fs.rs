//! An image's filesystem as a runtime would see it, read out of its layers: one file
//! (`read_file`), every path (`paths`), and its glibc (`base_glibc`); later layers replace
//! earlier ones and whiteouts delete, as the image spec says. Once unpacked, the Python
//! distributions and NCCL libraries it installs (`contents_of_tree`).

use crate::error::Result;
use crate::image::model::{Image, LayerEntry};
use serde::Serialize;
use std::io::Read;
use std::ops::ControlFlow;

/// Where the merged preset, with provenance, is stored in the image.
pub const PRESET_PATH_IN_IMAGE: &str = "/etc/gpubake/preset.yaml";

/// Files larger than this are not read out of layers.
const MAX_FILE: u64 = 16 << 20;

/// Reads `path` from the image's filesystem: the top-most layer that has it wins, and a
/// whiteout above it means the file was deleted.
pub fn read_file(image: &Image, path: &str) -> Result<Option<Vec<u8>>> {
    let wanted = path.trim_start_matches('/');
    let (dir, name) = wanted.rsplit_once('/').unwrap_or(("", wanted));
    let whiteout = if dir.is_empty() {
        format!(".wh.{name}")
    } else {
        format!("{dir}/.wh.{name}")
    };
    for layer in image.layers().iter().rev() {
        // Some(None): deleted by a whiteout; Some(Some(bytes)): found.
        let mut found: Option<Option<Vec<u8>>> = None;
        layer.each_entry(|p, entry| {
            if p == whiteout {
                found = Some(None);
                return Ok(ControlFlow::Break(()));
            }
            if p == wanted && entry.header().entry_type().is_file() {
                let mut out = Vec::new();
                entry.by_ref().take(MAX_FILE).read_to_end(&mut out)?;
                found = Some(Some(out));
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        if let Some(found) = found {
            return Ok(found);
        }
    }
    Ok(None)
}

/// Where glibc's `libc.so.6` lives in the distributions gpubake meets.
const LIBC_PATHS: [&str; 5] = [
    "lib/x86_64-linux-gnu/libc.so.6",
    "usr/lib/x86_64-linux-gnu/libc.so.6",
    "lib64/libc.so.6",
    "usr/lib64/libc.so.6",
    "lib/libc.so.6",
];

/// The glibc of the base a build reads, for [`crate::resolve::Options::base_glibc`]: what was read, never
/// where (host paths stay out of images). The base given is the one whose glibc counts, not
/// the recipe's `base:` text (`recipe_base`). With `note` (a base the build was given, and
/// wheels to check), says so where the base is another than the recipe's.
pub fn glibc_of_base(
    base: &crate::image::Transport,
    recipe_base: &str,
    note: bool,
) -> Result<Option<(crate::version::Version, String)>> {
    let found = base_glibc(&base.open()?)?;
    if let Some((v, what)) = &found
        && note
        && !base.is_registry_reference(recipe_base)
    {
        eprintln!(
            "note: checking the wheels against {what} {v}, read from {base}, not against the \
             recipe's base `{recipe_base}`"
        );
    }
    Ok(found.map(|(v, what)| (v, format!("{what}, read from the base image"))))
}

/// The glibc of an image, read from its own files: the version in `libc.so.6` ("release
/// version 2.36", or the `libc-2.31.so` a link names on older releases), with the
/// distribution's name from /etc/os-release. None when the image has no glibc.
pub fn base_glibc(image: &Image) -> Result<Option<(crate::version::Version, String)>> {
    let mut found: Option<String> = None;
    let mut os: Option<String> = None;
    each_entry(image, |path, entry| {
        if LIBC_PATHS.contains(&path) {
            let kind = entry.header().entry_type();
            if kind.is_symlink() {
                let target = entry.link_name()?.unwrap_or_default();
                let name = target.file_name().map(|n| n.to_string_lossy().into_owned());
                if let Some(v) = name
                    .as_deref()
                    .and_then(|n| n.strip_prefix("libc-"))
                    .and_then(|n| n.strip_suffix(".so"))
                {
                    found = Some(v.to_string());
                }
            } else if kind.is_file() {
                let mut bytes = Vec::new();
                entry.by_ref().take(MAX_FILE).read_to_end(&mut bytes)?;
                if let Some(v) = release_version(&bytes) {
                    found = Some(v);
                }
            }
        } else if path == "etc/os-release" || path == "usr/lib/os-release" {
            let mut text = String::new();
            entry.by_ref().take(1 << 16).read_to_string(&mut text)?;
            os = text
                .lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string());
        }
        Ok(())
    })?;
    Ok(found.and_then(|v| v.parse().ok()).map(|v| {
        let what = match os {
            Some(os) => format!("glibc of {os}"),
            None => "glibc".to_string(),
        };
        (v, what)
    }))
}

/// The `X.Y` after glibc's "release version " in libc.so.6.
fn release_version(bytes: &[u8]) -> Option<String> {
    let at = memchr::memmem::find(bytes, b"release version ")? + "release version ".len();
    let digits: String = bytes[at..]
        .iter()
        .take(16)
        .map(|&b| b as char)
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let version = digits.trim_end_matches('.');
    version.contains('.').then(|| version.to_string())
}

/// Visits every entry of every layer, base first, with its path (no `./`, no trailing `/`).
fn each_entry(
    image: &Image,
    mut visit: impl FnMut(&str, &mut LayerEntry<'_>) -> std::io::Result<()>,
) -> Result<()> {
    for layer in image.layers() {
        layer.each_entry(|path, entry| visit(path, entry).map(ControlFlow::Continue))?;
    }
    Ok(())
}

/// What a layer entry at `path` deletes from the layers below, by the image spec's
/// whiteouts: an opaque directory's contents, or one path and everything under it.
enum Deletes {
    /// Everything under this directory (with its trailing `/`), not the directory itself.
    Contents(String),
    /// This path and everything under it.
    Path(String),
}

fn deletes(path: &str) -> Option<Deletes> {
    let (dir, name) = path
        .rsplit_once('/')
        .map(|(d, n)| (format!("{d}/"), n))
        .unwrap_or((String::new(), path));
    if name == ".wh..wh..opq" {
        Some(Deletes::Contents(dir))
    } else {
        name.strip_prefix(".wh.")
            .map(|gone| Deletes::Path(format!("{dir}{gone}")))
    }
}

impl Deletes {
    /// Whether `q`, a path of a lower layer, is deleted.
    fn hits(&self, q: &str) -> bool {
        match self {
            Deletes::Contents(dir) => q.starts_with(dir.as_str()),
            Deletes::Path(gone) => q == gone || q.starts_with(&format!("{gone}/")),
        }
    }
}

/// Every path in the image's filesystem after applying each layer's whiteouts, sorted.
pub fn paths(image: &Image) -> Result<Vec<String>> {
    let mut all = std::collections::BTreeSet::new();
    each_entry(image, |p, _| {
        match deletes(p) {
            Some(d) => all.retain(|q: &String| !d.hits(q)),
            None => {
                all.insert(p.to_string());
            }
        }
        Ok(())
    })?;
    Ok(all.into_iter().collect())
}

/// What a path of an image's filesystem is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// A regular file (or anything not a directory or link), with its mode and size.
    File {
        /// Permission bits.
        mode: u32,
        /// Size in bytes.
        size: u64,
    },
    /// A directory.
    Dir,
    /// A symbolic link, with its target.
    Link(String),
}

/// Every path of the image's filesystem with what it is, after later layers and whiteouts
/// have had their say.
pub fn listing(image: &Image) -> Result<std::collections::BTreeMap<String, Node>> {
    let mut all = std::collections::BTreeMap::new();
    each_entry(image, |p, entry| {
        if let Some(d) = deletes(p) {
            all.retain(|q: &String, _| !d.hits(q));
            return Ok(());
        }
        let header = entry.header();
        let kind = header.entry_type();
        let node = if kind.is_symlink() {
            Node::Link(
                entry
                    .link_name()?
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
            )
        } else if kind.is_dir() {
            Node::Dir
        } else {
            Node::File {
                mode: header.mode()? & 0o7777,
                size: header.size()?,
            }
        };
        all.insert(p.to_string(), node);
        Ok(())
    })?;
    Ok(all)
}

/// Every symbolic link in the image's filesystem with its target, after later layers and
/// whiteouts have had their say.
pub fn symlinks(image: &Image) -> Result<std::collections::BTreeMap<String, String>> {
    Ok(listing(image)?
        .into_iter()
        .filter_map(|(p, n)| match n {
            Node::Link(t) => Some((p, t)),
            _ => None,
        })
        .collect())
}

/// What the layers install, read from the files themselves: every Python distribution by
/// its `METADATA` and every `libnccl.so*` by the version string compiled into it.
#[derive(Debug, Default, Serialize)]
pub struct Contents {
    /// Normalized distribution name -> (version as METADATA says, dist-info path).
    pub dists: std::collections::BTreeMap<String, (String, String)>,
    /// libnccl path -> the version it reports (`2.27.5`), when found.
    pub nccl: std::collections::BTreeMap<String, Option<String>>,
}

/// The Python distributions and NCCL libraries of an image read into memory (its layers
/// applied, whiteouts included): what the image installs, read from the files a runtime would
/// see.
pub fn contents_of(tree: &crate::image::scan::Scanned) -> Result<Contents> {
    use crate::image::links::{Listing, Tree};
    let mut out = Contents::default();
    for path in tree.files()? {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", &path));
        if name == "METADATA" && dir.ends_with(".dist-info") {
            // A file that does not read is no distribution, as it was to the walk before.
            let Ok(bytes) = tree.read(&path) else {
                continue;
            };
            let text = String::from_utf8_lossy(&bytes);
            if let Some((dist, version)) = metadata_name_version(&text) {
                let dir = dir.trim_start_matches('/').to_string();
                out.dists
                    .insert(crate::names::normalize(&dist), (version, dir));
            }
        }
    }
    for (path, version) in tree.nccl_libraries() {
        out.nccl.insert(
            path.trim_start_matches('/').to_string(),
            version.map(str::to_string),
        );
    }
    Ok(out)
}

/// `Name` and `Version` of core metadata (the email-header part before the body).
fn metadata_name_version(text: &str) -> Option<(String, String)> {
    let mut name = None;
    let mut version = None;
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("Name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("Version:") {
            version = Some(v.trim().to_string());
        }
    }
    Some((name?, version?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_release_versions_are_read_from_libc() {
        let text = b"xx GNU C Library (Debian GLIBC 2.36-9+deb12u4) stable release version 2.36.\n";
        assert_eq!(release_version(text).as_deref(), Some("2.36"));
        assert_eq!(release_version(b"nothing here"), None);
    }
}
