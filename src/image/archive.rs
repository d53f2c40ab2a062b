//! `docker save` archives: read into an OCI layout (every member stored as a blob under its
//! digest), and written from one (a tar with Docker's `manifest.json` beside an OCI layout,
//! which `docker load` and skopeo both read).

use super::digest::Digest;
use super::layout::{Layout, REF_NAME, canonical_json, descriptor, digest_of};
use super::model::{Image, is_index};
use super::tarstream::Padded;
use crate::error::{Error, Result};
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, ImageManifestBuilder, MediaType};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Component, Path, PathBuf};

/// One image in Docker's `manifest.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerManifest {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// A member path that stays inside the archive: relative, no `..`.
fn safe_member(path: &Path) -> bool {
    path.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// The media type of a layer, from its first bytes.
pub fn sniff_layer_type(head: &[u8]) -> MediaType {
    match head {
        [0x1f, 0x8b, ..] => MediaType::ImageLayerGzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => MediaType::ImageLayerZstd,
        _ => MediaType::ImageLayer,
    }
}

/// Reads `archive` into `staging` and returns the manifest descriptor of the image named
/// `reference` (or of the only image), and whether gpubake made that manifest. The image is
/// the one Docker's `manifest.json` names (its config and layers, which `docker load` reads);
/// its manifest is the one the archive's `index.json` lists for exactly that config and those
/// layers (an OCI layout beside `manifest.json`, as gpubake writes it), so an image keeps its
/// digest through an archive; an archive without one (skopeo's, Docker 20.10's) gets a
/// manifest made from `manifest.json`, whose digest is gpubake's own.
pub fn read(
    archive: &Path,
    reference: Option<&str>,
    staging: &Layout,
) -> Result<(Descriptor, bool)> {
    let what = format!("docker-archive:{}", archive.display());
    let file = File::open(archive).map_err(|e| Error::reading(archive, e))?;
    // `docker save` archives are read as leniently as their layers (see `tarstream`).
    let (reader, end) = Padded::new(BufReader::with_capacity(1 << 20, file));
    let mut tar = tar::Archive::new(reader);
    let mut members: HashMap<PathBuf, (Digest, u64)> = HashMap::new();
    let mut links: HashMap<PathBuf, PathBuf> = HashMap::new();
    let bad = |m: String| Error::image(&what, m);
    for entry in tar
        .entries()
        .map_err(|e| bad(format!("not a tar archive: {e}")))?
    {
        let mut entry = entry.map_err(|e| bad(format!("damaged tar: {e}")))?;
        end.saw(&entry);
        let path = entry.path().map_err(|e| bad(e.to_string()))?.into_owned();
        if !safe_member(&path) {
            return Err(bad(format!(
                "member `{}` points outside the archive; refusing it",
                path.display()
            )));
        }
        let kind = entry.header().entry_type();
        if kind.is_symlink() {
            let target = entry
                .link_name()
                .ok()
                .flatten()
                .map(|t| t.into_owned())
                .unwrap_or_default();
            let resolved = path.parent().unwrap_or(Path::new("")).join(&target);
            let normal = normalize(&resolved).ok_or_else(|| {
                bad(format!(
                    "link `{}` -> `{}` escapes the archive",
                    path.display(),
                    target.display()
                ))
            })?;
            links.insert(path, normal);
        } else if kind.is_file() {
            let mut w = staging.blob_writer()?;
            std::io::copy(&mut entry, &mut w)
                .map_err(|e| bad(format!("{}: {e}", path.display())))?;
            let (digest, size) = w.commit()?;
            // Members named by digest (`blobs/sha256/<hex>`) must hold that content.
            if let Some(hex) = path
                .strip_prefix("blobs/sha256")
                .ok()
                .and_then(|p| p.to_str())
                && hex != digest.hex()
            {
                return Err(bad(format!(
                    "member {} holds content with digest {digest}",
                    path.display()
                )));
            }
            members.insert(normalize(&path).unwrap_or(path), (digest, size));
        }
    }
    end.check().map_err(|e| bad(format!("damaged tar: {e}")))?;
    let member = |name: &str| -> Result<(Digest, u64)> {
        let mut p = normalize(Path::new(name))
            .ok_or_else(|| bad(format!("`{name}` escapes the archive")))?;
        for _ in 0..8 {
            match links.get(&p) {
                Some(next) => p = next.clone(),
                None => break,
            }
        }
        members
            .get(&p)
            .cloned()
            .ok_or_else(|| bad(format!("`{name}` is named in manifest.json but missing")))
    };
    let (digest, size) = member("manifest.json")?;
    let images: Vec<DockerManifest> =
        serde_json::from_slice(&staging.read_blob(&digest, Some(size))?)
            .map_err(|e| bad(format!("manifest.json: {e}")))?;
    let image = match reference {
        Some(r) => images
            .iter()
            .find(|i| i.repo_tags.iter().flatten().any(|t| t == r))
            .ok_or_else(|| bad(format!("holds no image tagged `{r}`")))?,
        None if images.len() == 1 => &images[0],
        None => {
            return Err(bad(format!(
                "holds {} images; name one with :NAME:TAG",
                images.len()
            )));
        }
    };
    let (config_digest, config_size) = member(&image.config)?;
    let layer_members = image
        .layers
        .iter()
        .map(|name| member(name))
        .collect::<Result<Vec<_>>>()?;
    if let Some((d, s)) = members.get(Path::new("index.json"))
        && let Some(found) = carried_manifest(staging, d, *s, &config_digest, &layer_members)?
    {
        return Ok((found, false));
    }
    let mut layers = Vec::new();
    for (d, s) in layer_members {
        let mut head = [0u8; 4];
        let n = staging
            .open_blob(&d, Some(s))?
            .read(&mut head)
            .map_err(|e| bad(e.to_string()))?;
        layers.push(descriptor(sniff_layer_type(&head[..n]), &d, s));
    }
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(
            MediaType::ImageConfig,
            &config_digest,
            config_size,
        ))
        .layers(layers)
        .build()
        .map_err(|e| bad(e.to_string()))?;
    Ok((
        staging.write_json(&manifest, MediaType::ImageManifest)?,
        true,
    ))
}

/// The manifest the archive's `index.json` lists (directly, or inside an index it lists)
/// whose config and layers are exactly `config` and `layers`; None when it lists none.
fn carried_manifest(
    staging: &Layout,
    index: &Digest,
    index_size: u64,
    config: &Digest,
    layers: &[(Digest, u64)],
) -> Result<Option<Descriptor>> {
    let at = staging.describe();
    let bad = |what: &str, e: serde_json::Error| Error::image(&at, format!("{what}: {e}"));
    let index: ImageIndex = serde_json::from_slice(&staging.read_blob(index, Some(index_size))?)
        .map_err(|e| bad("index.json", e))?;
    let mut entries: Vec<Descriptor> = index.manifests().clone();
    let mut seen = 0;
    while let Some(mut entry) = entries.pop() {
        let digest = digest_of(&entry)?;
        // Only blobs the archive holds count; a listed manifest it lacks is not its own.
        seen += 1;
        if seen > 64 || !staging.has_blob(&digest, entry.size()) {
            continue;
        }
        let bytes = staging.read_blob(&digest, Some(entry.size()))?;
        if is_index(&entry) {
            let inner: ImageIndex =
                serde_json::from_slice(&bytes).map_err(|e| bad(&format!("index {digest}"), e))?;
            entries.extend(inner.manifests().iter().cloned());
            continue;
        }
        let manifest: ImageManifest =
            serde_json::from_slice(&bytes).map_err(|e| bad(&format!("manifest {digest}"), e))?;
        let same = digest_of(manifest.config())? == *config
            && manifest.layers().len() == layers.len()
            && manifest
                .layers()
                .iter()
                .zip(layers)
                .all(|(l, (d, _))| digest_of(l).is_ok_and(|got| got == *d));
        if same {
            entry.set_annotations(None);
            return Ok(Some(entry));
        }
    }
    Ok(None)
}

/// Resolves `.` and `..` in a relative path; None when it climbs out.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            _ => return None,
        }
    }
    Some(out)
}

/// Writes `image` to a docker archive at `path`, atomically, recording `reference` as its tag
/// (none without one, as skopeo writes an archive: `docker load` loads it untagged).
pub fn write(image: &Image, path: &Path, reference: Option<&str>) -> Result<()> {
    let target = crate::fsutil::output_target(path)?;
    let path = target.as_path();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // What a killed write of an archive here left beside it goes first.
    crate::interrupt::sweep_temp_files(dir, &|_| false);
    let (tmp, _scratch) = crate::interrupt::temp_file(dir).map_err(|e| Error::writing(dir, e))?;
    let file = tmp
        .as_file()
        .try_clone()
        .map_err(|e| Error::writing(tmp.path(), e))?;
    let io_err = |e: std::io::Error| Error::writing(path, e);
    let out = BufWriter::with_capacity(1 << 20, file);
    let mut out = write_to(image, out, reference, &HashSet::new(), &io_err)?;
    out.flush().map_err(io_err)?;
    drop(out);
    crate::fsutil::match_mode(tmp.as_file(), path).map_err(io_err)?;
    tmp.as_file().sync_all().map_err(io_err)?;
    tmp.persist(path)
        .map_err(|e| Error::writing(path, e.error))?;
    Ok(())
}

/// Writes `image` as a docker archive into `out`, leaving out the files of the layers in
/// `left_out` (which manifest.json still lists, for an engine that has them). The blobs are
/// verified as they are read; `io_err` says what a failed write means. The OCI index the
/// archive carries for other readers is written only when nothing is left out, so that it
/// never names a blob the archive lacks.
pub fn write_to<W: Write>(
    image: &Image,
    out: W,
    reference: Option<&str>,
    left_out: &HashSet<Digest>,
    io_err: &dyn Fn(std::io::Error) -> Error,
) -> Result<W> {
    let (layout, desc, manifest) = (image.store(), image.descriptor(), image.manifest());
    let mut tar = tar::Builder::new(out);

    let blob_name = |d: &Digest| format!("blobs/sha256/{}", d.hex());
    let mut blobs: Vec<(Digest, u64)> =
        vec![(digest_of(manifest.config())?, manifest.config().size())];
    for l in manifest.layers() {
        blobs.push((digest_of(l)?, l.size()));
    }
    blobs.push((digest_of(desc)?, desc.size()));
    let mut written = HashSet::new();
    for (digest, size) in &blobs {
        if left_out.contains(digest) || !written.insert(digest.clone()) {
            continue;
        }
        let mut h = member_header(*size);
        let reader = layout.open_blob(digest, Some(*size))?;
        // The verifying reader's complaint is the blob's, not the destination's.
        tar.append_data(&mut h, blob_name(digest), reader)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => Error::image(layout.describe(), e.to_string()),
                _ => io_err(e),
            })?;
    }
    let docker = vec![DockerManifest {
        config: blob_name(&blobs[0].0),
        repo_tags: Some(reference.iter().map(|r| r.to_string()).collect()),
        layers: blobs[1..blobs.len() - 1]
            .iter()
            .map(|(d, _)| blob_name(d))
            .collect(),
    }];
    let mut tagged = desc.clone();
    tagged.set_annotations(reference.map(|reference| {
        HashMap::from([
            (
                REF_NAME.to_string(),
                reference
                    .rsplit_once(':')
                    .map(|(_, t)| t)
                    .unwrap_or(reference)
                    .to_string(),
            ),
            (
                "io.containerd.image.name".to_string(),
                reference.to_string(),
            ),
        ])
    }));
    let index = oci_spec::image::ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![tagged])
        .build()
        .map_err(|e| Error::image("docker archive", e.to_string()))?;
    let mut small: Vec<(&str, Vec<u8>)> = vec![(
        "manifest.json",
        serde_json::to_vec(&docker).expect("manifests serialize"),
    )];
    if left_out.is_empty() {
        small.insert(0, ("index.json", canonical_json(&index)));
        small.push(("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()));
    }
    for (name, bytes) in small {
        let mut h = member_header(bytes.len() as u64);
        tar.append_data(&mut h, name, bytes.as_slice())
            .map_err(io_err)?;
    }
    tar.into_inner().map_err(io_err)
}

/// The header of a regular member of `size` bytes, owned by root, mode 0644, time 0.
pub(super) fn member_header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_paths_stay_inside() {
        assert!(safe_member(Path::new("blobs/sha256/abc")));
        assert!(!safe_member(Path::new("../etc/passwd")));
        assert!(!safe_member(Path::new("/etc/passwd")));
        assert_eq!(normalize(Path::new("a/../b")), Some(PathBuf::from("b")));
        assert_eq!(normalize(Path::new("a/../../b")), None);
    }
}
