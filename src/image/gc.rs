//! What a layout holds that nothing needs: the temporary files killed writers left, and the
//! blobs its `index.json` does not reach (as `umoci gc` finds them), with gpubake's records
//! of those blobs. Found under the layout's lock, so no build is writing it meanwhile.

use super::digest::Digest;
use super::layout::{Layout, MAX_JSON_BYTES};
use crate::error::{Error, Result};
use crate::interrupt::Leftovers;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;

/// What [`garbage`] found.
#[derive(Debug, Default)]
pub struct Garbage {
    /// Temporary files no live process owns.
    pub temp: Leftovers,
    /// Blobs nothing reaches, with their sizes.
    pub blobs: Vec<(PathBuf, u64)>,
    /// gpubake's records (`.gpubake/KIND/NAME.json`) that name a blob about to go.
    pub records: Vec<PathBuf>,
}

impl Garbage {
    /// The bytes removing it all gives back.
    pub fn bytes(&self) -> u64 {
        self.temp.bytes() + self.blobs.iter().map(|(_, s)| s).sum::<u64>()
    }

    /// Removes it: temporary files, then the records, then the blobs they named, so that a
    /// record never names a blob that is gone.
    pub fn remove(&self) -> Result<()> {
        self.temp
            .remove()
            .map_err(|(path, e)| Error::writing(path, e))?;
        for path in self.records.iter().chain(self.blobs.iter().map(|(p, _)| p)) {
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
pub enum Roots {
    /// What `index.json` reaches: a user's layout.
    Index,
    /// What `index.json` reaches, every manifest or index stored in it (a pulled image's),
    /// and every blob a record names: gpubake's cache, whose point is what it records.
    IndexManifestsAndRecords,
}

/// The garbage in `layout`. Every document on the way is read once and through its digest:
/// a damaged manifest, an unreadable `index.json` or record is an error, never a reason to
/// drop what it names.
pub fn garbage(layout: &Layout, roots: Roots) -> Result<Garbage> {
    let mut blobs = Blobs::of(layout);
    let index = layout.root().join("index.json");
    let index_bytes = match std::fs::read(&index) {
        Ok(bytes) => bytes,
        // The cache's layout has no index until an image is pulled into it.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && matches!(roots, Roots::IndexManifestsAndRecords) =>
        {
            Vec::new()
        }
        Err(e) => return Err(Error::reading(&index, e)),
    };
    let mut wanted = names_in(&index_bytes);
    let records = record_files(layout)?;
    if let Roots::IndexManifestsAndRecords = roots {
        for (_, names) in &records {
            wanted.extend(names.iter().map(|d| (d.clone(), None)));
        }
        for digest in blobs.small() {
            if blobs.json(&digest)?.is_some_and(is_manifest) {
                wanted.push((digest, None));
            }
        }
    }
    let mut reached: HashSet<Digest> = HashSet::new();
    while let Some((digest, said)) = wanted.pop() {
        let Some(&size) = blobs.sizes.get(&digest) else {
            continue;
        };
        if let Some(said) = said
            && said != size
        {
            return Err(Error::image(
                layout.describe(),
                format!(
                    "blob {digest} is {size} bytes where its descriptor says {said}: \
                     the layout is damaged, and gc removed nothing"
                ),
            ));
        }
        if !reached.insert(digest.clone()) {
            continue;
        }
        if let Some(json) = blobs.json(&digest)? {
            wanted.extend(names_in(json));
        }
    }
    let gone: BTreeSet<&Digest> = blobs
        .sizes
        .keys()
        .filter(|d| !reached.contains(*d))
        .collect();
    Ok(Garbage {
        temp: temp_files(layout),
        blobs: gone
            .iter()
            .map(|d| (layout.blob_path(d), blobs.sizes[*d]))
            .collect(),
        records: records
            .into_iter()
            .filter(|(_, names)| names.iter().any(|d| gone.contains(d)))
            .map(|(path, _)| path)
            .collect(),
    })
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
}

impl<'a> Blobs<'a> {
    /// Every blob file named by a sha256 digest, with its size.
    fn of(layout: &'a Layout) -> Self {
        let dir = layout.root().join("blobs/sha256");
        let sizes = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let digest = format!("sha256:{name}").parse::<Digest>().ok()?;
                let meta = e.metadata().ok().filter(|m| m.is_file())?;
                Some((digest, meta.len()))
            })
            .collect();
        Blobs {
            layout,
            sizes,
            json: HashMap::new(),
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
    /// against its digest; `None` for a layer or anything else that is not JSON.
    fn json(&mut self, digest: &Digest) -> Result<Option<&[u8]>> {
        if !self.json.contains_key(digest) {
            // Small blobs are read whole, so that one damaged into something that is not
            // JSON is caught by its digest rather than taken for a layer.
            let bytes = match self.sizes.get(digest) {
                Some(&size) if size <= MAX_JSON_BYTES => {
                    Some(self.layout.read_blob(digest, Some(size))?)
                        .filter(|b| b.first() == Some(&b'{'))
                }
                _ => None,
            };
            self.json.insert(digest.clone(), bytes);
        }
        Ok(self.json[digest].as_deref())
    }
}

/// The records under `.gpubake/`, each with the blob digests it names.
fn record_files(layout: &Layout) -> Result<Vec<(PathBuf, Vec<Digest>)>> {
    let mut found = Vec::new();
    let kinds = std::fs::read_dir(layout.root().join(".gpubake"))
        .into_iter()
        .flatten()
        .flatten();
    for kind in kinds.filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
        let entries = std::fs::read_dir(kind.path()).map_err(|e| Error::reading(kind.path(), e))?;
        for record in entries.flatten() {
            let path = record.path();
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

/// The blobs a document names, each with the size its descriptor gives where it is one.
fn names_in(bytes: &[u8]) -> Vec<(Digest, Option<u64>)> {
    let mut sizes = HashMap::new();
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
        descriptor_sizes(&value, &mut sizes);
    }
    digests_in(bytes)
        .into_iter()
        .map(|d| {
            let size = sizes.get(&d).copied();
            (d, size)
        })
        .collect()
}

/// Every OCI descriptor (`{"digest": .., "size": ..}`) anywhere in `value`.
fn descriptor_sizes(value: &serde_json::Value, into: &mut HashMap<Digest, u64>) {
    match value {
        serde_json::Value::Object(map) => {
            if let (Some(digest), Some(size)) = (
                map.get("digest")
                    .and_then(|d| d.as_str())
                    .and_then(|d| d.parse::<Digest>().ok()),
                map.get("size").and_then(|s| s.as_u64()),
            ) {
                into.insert(digest, size);
            }
            map.values().for_each(|v| descriptor_sizes(v, into));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| descriptor_sizes(v, into)),
        _ => {}
    }
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
    fn a_descriptor_gives_its_size_and_a_bare_digest_none() {
        let a: Digest = format!("sha256:{}", "a".repeat(64)).parse().unwrap();
        let b: Digest = format!("sha256:{}", "b".repeat(64)).parse().unwrap();
        let text = format!(r#"{{"layers":[{{"size":7,"digest":"{a}"}}],"diff_ids":["{b}"]}}"#);
        let mut names = names_in(text.as_bytes());
        names.sort();
        assert_eq!(names, vec![(a.clone(), Some(7)), (b.clone(), None)]);
        // Text that is not JSON still names its digests, without sizes.
        let broken = &text.as_bytes()[..text.len() - 3];
        assert_eq!(names_in(broken), vec![(a, None), (b, None)]);
    }
}
