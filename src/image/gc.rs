//! What a layout holds that nothing needs: the temporary files killed writers left, and the
//! blobs its `index.json` does not reach (as `umoci gc` finds them), with gpubake's records
//! of those blobs. Found under the layout's lock, so no build is writing it meanwhile.

use super::digest::Digest;
use super::layout::{Layout, MAX_JSON_BYTES};
use crate::error::{Error, Result};
use crate::interrupt::Leftovers;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Read;
use std::path::PathBuf;

/// What [`garbage`] found.
#[derive(Debug, Default)]
pub struct Garbage {
    /// Temporary files no live process owns.
    pub temp: Leftovers,
    /// Blobs nothing reaches, with their sizes.
    pub blobs: Vec<(PathBuf, u64)>,
    /// Blobs of the cache whose bytes no longer match their digest (a file changed in
    /// place), with their sizes: a build writes or fetches them again.
    pub damaged: Vec<(PathBuf, u64)>,
    /// gpubake's records (`.gpubake/KIND/NAME.json`) that name a blob about to go.
    pub records: Vec<PathBuf>,
}

impl Garbage {
    /// The bytes removing it all gives back.
    pub fn bytes(&self) -> u64 {
        let sum = |files: &[(PathBuf, u64)]| files.iter().map(|(_, s)| s).sum::<u64>();
        self.temp.bytes() + sum(&self.blobs) + sum(&self.damaged)
    }

    /// Removes it: temporary files, then the records, then the blobs they named, so that a
    /// record never names a blob that is gone.
    pub fn remove(&self) -> Result<()> {
        self.temp
            .remove()
            .map_err(|(path, e)| Error::writing(path, e))?;
        let blobs = self.blobs.iter().chain(&self.damaged).map(|(p, _)| p);
        for path in self.records.iter().chain(blobs) {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::writing(path, e));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Where the blobs a layout keeps come from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Roots {
    /// What `index.json` reaches: a user's layout.
    Index,
    /// What `index.json` reaches, every manifest or index stored in it (a pulled image's),
    /// and every blob a record names: gpubake's cache, whose point is what it records.
    IndexManifestsAndRecords,
}

/// The garbage in `layout`, found before anything is removed. Every document on the way is
/// read once and through its digest. In a user's layout, anything that leaves what a
/// document names unknown is an error, never a reason to drop it: `index.json` unreadable
/// or not an index, a manifest or index damaged, missing or too large to read, a blob whose
/// size is not its descriptor's, a record or `.gpubake/` unreadable. In the cache a damaged
/// blob is itself garbage: what holds it is rebuilt from its source.
pub fn garbage(layout: &Layout, roots: Roots) -> Result<Garbage> {
    let cache = roots == Roots::IndexManifestsAndRecords;
    let mut blobs = Blobs::of(layout, cache)?;
    let mut wanted = index_names(layout, cache)?;
    let records = record_files(layout)?;
    if cache {
        for (_, names) in &records {
            wanted.extend(names.iter().map(|d| Named::bare(d.clone())));
        }
        for digest in blobs.small() {
            if blobs.json(&digest)?.is_some_and(is_manifest) {
                wanted.push(Named::bare(digest));
            }
        }
    }
    let damaged = |why: String| {
        Error::image(
            layout.describe(),
            format!("{why}: the layout is damaged, and gc removed nothing"),
        )
    };
    let mut reached: HashSet<Digest> = HashSet::new();
    while let Some(Named { digest, descriptor }) = wanted.pop() {
        let manifest = descriptor.as_ref().is_some_and(|d| d.is_manifest());
        let Some(&size) = blobs.sizes.get(&digest) else {
            // A layer or config may be left out of a layout (a foreign layer); a manifest
            // or index names blobs of its own, which cannot be known without it. The
            // cache fetches a missing one again.
            if manifest && !cache {
                return Err(damaged(format!("manifest {digest} is named but missing")));
            }
            continue;
        };
        if let Some(d) = &descriptor
            && d.size != size
        {
            if cache {
                blobs.damaged.insert(digest);
                continue;
            }
            return Err(damaged(format!(
                "blob {digest} is {size} bytes where its descriptor says {}",
                d.size
            )));
        }
        if manifest && size > MAX_JSON_BYTES {
            return Err(damaged(format!(
                "manifest {digest} is {size} bytes, more than the {MAX_JSON_BYTES} gc reads"
            )));
        }
        if !reached.insert(digest.clone()) {
            continue;
        }
        if let Some(json) = blobs.json(&digest)? {
            wanted.extend(names_in(json));
        }
    }
    let unreached = |d: &&Digest| !reached.contains(*d) && !blobs.damaged.contains(*d);
    let gone: BTreeSet<&Digest> = blobs.sizes.keys().filter(unreached).collect();
    let with_size = |d: &Digest| (layout.blob_path(d), blobs.sizes[d]);
    Ok(Garbage {
        temp: temp_files(layout),
        blobs: gone.iter().copied().map(with_size).collect(),
        damaged: blobs.damaged.iter().map(with_size).collect(),
        records: records
            .into_iter()
            .filter(|(_, names)| {
                names
                    .iter()
                    .any(|d| gone.contains(d) || blobs.damaged.contains(d))
            })
            .map(|(path, _)| path)
            .collect(),
    })
}

/// What `index.json` names: it must be an OCI index, except in the cache, which has none
/// until an image is pulled into it.
fn index_names(layout: &Layout, cache: bool) -> Result<Vec<Named>> {
    let index = layout.root().join("index.json");
    let bytes = match std::fs::read(&index) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && cache => return Ok(Vec::new()),
        Err(e) => return Err(Error::reading(&index, e)),
    };
    let is_index = serde_json::from_slice::<serde_json::Value>(&bytes)
        .is_ok_and(|v| v.get("manifests").is_some_and(|m| m.is_array()));
    if !is_index {
        return Err(Error::image(
            index.display(),
            "is not an OCI index (no `manifests` list), so what the layout needs is unknown: \
             gc removed nothing",
        ));
    }
    Ok(names_in(&bytes))
}

/// The temporary files of a layout that no live writer owns.
fn temp_files(layout: &Layout) -> Leftovers {
    let mut all = Leftovers::default();
    for (dir, legacy) in layout.temp_dirs() {
        all.files
            .extend(crate::interrupt::temp_leftovers(&dir, &legacy).files);
    }
    all
}

/// A layout's blobs by digest, with the JSON ones read at most once.
struct Blobs<'a> {
    layout: &'a Layout,
    sizes: BTreeMap<Digest, u64>,
    json: HashMap<Digest, Option<Vec<u8>>>,
    /// Whether a blob whose bytes do not match its digest is garbage (the cache) rather
    /// than an error (a user's layout).
    damage_is_garbage: bool,
    damaged: BTreeSet<Digest>,
}

impl<'a> Blobs<'a> {
    /// Every blob file named by a sha256 digest (a symlink to one too), with its size.
    fn of(layout: &'a Layout, damage_is_garbage: bool) -> Result<Self> {
        let dir = layout.root().join("blobs/sha256");
        let mut sizes = BTreeMap::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Blobs::new(layout, sizes, damage_is_garbage));
            }
            Err(e) => return Err(Error::reading(&dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| Error::reading(&dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(digest) = format!("sha256:{name}").parse::<Digest>() else {
                continue;
            };
            let path = entry.path();
            let meta = std::fs::metadata(&path).map_err(|e| Error::reading(&path, e))?;
            if meta.is_file() {
                sizes.insert(digest, meta.len());
            }
        }
        Ok(Blobs::new(layout, sizes, damage_is_garbage))
    }

    fn new(layout: &'a Layout, sizes: BTreeMap<Digest, u64>, damage_is_garbage: bool) -> Self {
        Blobs {
            layout,
            sizes,
            json: HashMap::new(),
            damage_is_garbage,
            damaged: BTreeSet::new(),
        }
    }

    /// The blobs small enough to be a manifest, an index or a config.
    fn small(&self) -> Vec<Digest> {
        self.sizes
            .iter()
            .filter(|(_, size)| **size <= MAX_JSON_BYTES)
            .map(|(d, _)| d.clone())
            .collect()
    }

    /// A blob's bytes when it is a JSON document (a manifest, an index, a config), checked
    /// against its digest; `None` for a layer or anything else that is not JSON. Small
    /// blobs are read whole, so that one damaged into something that is not JSON is caught
    /// by its digest rather than taken for a layer.
    fn json(&mut self, digest: &Digest) -> Result<Option<&[u8]>> {
        if !self.json.contains_key(digest) {
            let bytes = match self.sizes.get(digest) {
                Some(&size) if size <= MAX_JSON_BYTES => self.read_small(digest)?,
                _ => None,
            };
            let bytes = bytes.filter(|b| {
                b.iter()
                    .find(|c| !c.is_ascii_whitespace())
                    .is_some_and(|c| *c == b'{')
            });
            self.json.insert(digest.clone(), bytes);
        }
        Ok(self.json[digest].as_deref())
    }

    /// A small blob's bytes, checked against its digest; `None` for a damaged one where
    /// damage is garbage.
    fn read_small(&mut self, digest: &Digest) -> Result<Option<Vec<u8>>> {
        let path = self.layout.blob_path(digest);
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|f| f.take(MAX_JSON_BYTES + 1).read_to_end(&mut bytes))
            .map_err(|e| Error::reading(&path, e))?;
        let got = Digest::of(&bytes);
        if got == *digest {
            return Ok(Some(bytes));
        }
        if self.damage_is_garbage {
            self.damaged.insert(digest.clone());
            return Ok(None);
        }
        Err(Error::image(
            self.layout.describe(),
            format!("blob {digest} hashes to {got}: the layout is damaged, and gc removed nothing"),
        ))
    }
}

/// The records under `.gpubake/`, each with the blob digests it names.
fn record_files(layout: &Layout) -> Result<Vec<(PathBuf, Vec<Digest>)>> {
    let mut found = Vec::new();
    let top = layout.root().join(".gpubake");
    let kinds = match std::fs::read_dir(&top) {
        Ok(kinds) => kinds,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(Error::reading(&top, e)),
    };
    for kind in kinds {
        let kind = kind.map_err(|e| Error::reading(&top, e))?.path();
        let meta = std::fs::metadata(&kind).map_err(|e| Error::reading(&kind, e))?;
        if !meta.is_dir() {
            continue;
        }
        for record in std::fs::read_dir(&kind).map_err(|e| Error::reading(&kind, e))? {
            let path = record.map_err(|e| Error::reading(&kind, e))?.path();
            if path.extension().is_some_and(|x| x == "json") {
                let bytes = std::fs::read(&path).map_err(|e| Error::reading(&path, e))?;
                found.push((path, digests_in(&bytes)));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Whether a JSON document is an image manifest or index: a pulled image keeps its blobs.
fn is_manifest(json: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else {
        return false;
    };
    value.get("manifests").is_some_and(|m| m.is_array())
        || value.get("layers").is_some_and(|l| l.is_array())
}

/// A blob a document names: by an OCI descriptor of a manifest or index, or by a bare
/// digest anywhere else (a record, a config's annotation).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Named {
    digest: Digest,
    descriptor: Option<Described>,
}

/// What a descriptor says of its blob.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Described {
    size: u64,
    media_type: Option<String>,
}

impl Described {
    /// Whether it names a manifest or an index (OCI's or Docker's), which names blobs too.
    fn is_manifest(&self) -> bool {
        self.media_type
            .as_deref()
            .is_some_and(|t| t.contains("manifest") || t.contains("image.index"))
    }
}

impl Named {
    fn bare(digest: Digest) -> Self {
        Named {
            digest,
            descriptor: None,
        }
    }
}

/// The blobs a document names: the descriptors of a manifest or an index (`config`,
/// `subject`, `layers`, `manifests`, `blobs`), each with its size and media type, and
/// every other digest in its text but an image config's diff IDs, which are digests of
/// uncompressed layers, not references: an uncompressed layer's blob has its diff ID for
/// digest, and every image of the same content would otherwise keep it.
fn names_in(bytes: &[u8]) -> Vec<Named> {
    let Ok(serde_json::Value::Object(mut doc)) = serde_json::from_slice::<serde_json::Value>(bytes)
    else {
        return digests_in(bytes).into_iter().map(Named::bare).collect();
    };
    let rootfs = doc.remove("rootfs");
    let text = serde_json::to_vec(&doc).unwrap_or_default();
    let mut found: Vec<Named> = digests_in(&text).into_iter().map(Named::bare).collect();
    if let Some(rootfs) = rootfs {
        doc.insert("rootfs".into(), rootfs);
    }
    let single = ["config", "subject"].iter().filter_map(|k| doc.get(*k));
    let listed = ["layers", "manifests", "blobs"]
        .iter()
        .filter_map(|k| doc.get(*k)?.as_array())
        .flatten();
    for d in single.chain(listed) {
        let digest = d["digest"].as_str().and_then(|d| d.parse::<Digest>().ok());
        if let (Some(digest), Some(size)) = (digest, d["size"].as_u64()) {
            let media_type = d["mediaType"].as_str().map(str::to_string);
            found.push(Named {
                digest,
                descriptor: Some(Described { size, media_type }),
            });
        }
    }
    found
}

/// Every `sha256:HEX` a JSON document (or any text) names: descriptors wherever they sit
/// (`config`, `layers`, `manifests`, `subject`, a record's fields), without knowing the
/// schema, so that no kind of reference is missed.
fn digests_in(bytes: &[u8]) -> Vec<Digest> {
    const TAG: &[u8] = b"sha256:";
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(TAG.len()).position(|w| w == TAG) {
        let start = at + i;
        let end = (start + TAG.len() + 64).min(bytes.len());
        if let Ok(text) = std::str::from_utf8(&bytes[start..end])
            && let Ok(digest) = text.parse::<Digest>()
        {
            found.push(digest);
        }
        at = start + TAG.len();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configs_diff_ids_are_not_references() {
        let (layer, diff) = ("a".repeat(64), "b".repeat(64));
        let config = format!(
            "{{\"rootfs\":{{\"type\":\"layers\",\"diff_ids\":[\"sha256:{diff}\"]}},\
             \"config\":{{\"Labels\":{{\"x\":\"sha256:{layer}\"}}}}}}"
        );
        let names: Vec<String> = names_in(config.as_bytes())
            .into_iter()
            .map(|n| n.digest.to_string())
            .collect();
        assert_eq!(names, [format!("sha256:{layer}")]);
    }

    #[test]
    fn digests_are_found_wherever_a_document_names_them() {
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", "b".repeat(64));
        let text = format!(
            r#"{{"config":{{"digest":"{a}"}},"subject":{{"digest":"{b}"}},"x":"sha256:short","y":"sha256:{}"}}"#,
            "A".repeat(64)
        );
        let found: Vec<String> = digests_in(text.as_bytes())
            .iter()
            .map(|d| d.to_string())
            .collect();
        assert_eq!(found, vec![a, b]);
        assert!(digests_in(b"").is_empty() && digests_in(b"sha256:").is_empty());
    }

    #[test]
    fn only_a_manifest_or_index_descriptor_gives_a_size() {
        let d = |c: &str| -> Digest { format!("sha256:{}", c.repeat(64)).parse().unwrap() };
        let (a, b, c) = (d("a"), d("b"), d("c"));
        let described = |digest: &Digest, size, media_type: Option<&str>| Named {
            digest: digest.clone(),
            descriptor: Some(Described {
                size,
                media_type: media_type.map(str::to_string),
            }),
        };
        let text = format!(
            r#"{{"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","size":7,"digest":"{a}"}}],
               "diff_ids":["{b}"],"annotations":{{"x":{{"digest":"{c}","size":1}}}}}}"#
        );
        let mut names = names_in(text.as_bytes());
        names.sort();
        let manifest = described(&a, 7, Some("application/vnd.oci.image.manifest.v1+json"));
        assert!(manifest.descriptor.as_ref().unwrap().is_manifest());
        // A {digest, size} pair outside the descriptor fields (an SBOM's, an annotation's)
        // is a bare digest.
        assert_eq!(
            names,
            vec![
                Named::bare(a.clone()),
                manifest,
                Named::bare(b.clone()),
                Named::bare(c.clone())
            ]
        );
        let config = described(&b, 3, Some("application/vnd.oci.image.config.v1+json"));
        assert!(!config.descriptor.unwrap().is_manifest());
        // Text that is not JSON still names its digests, without sizes.
        let broken = &text.as_bytes()[..text.len() - 3];
        assert_eq!(
            names_in(broken),
            vec![Named::bare(a), Named::bare(b), Named::bare(c)]
        );
    }
}
