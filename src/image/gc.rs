//! What a layout holds that nothing needs: the temporary files killed writers left, and the
//! blobs its `index.json` does not reach (as `umoci gc` finds them), with gpubake's records
//! of those blobs. Found under the layout's lock, so no build is writing it meanwhile.

use super::digest::Digest;
use super::layout::{Layout, MAX_JSON_BYTES};
use crate::error::{Error, Result};
use crate::interrupt::Leftovers;
use std::collections::{BTreeSet, HashSet};
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
        self.temp.remove().map_err(|(path, e)| Error::io(path, e))?;
        for path in self.records.iter().chain(self.blobs.iter().map(|(p, _)| p)) {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io(path, e));
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

/// The garbage in `layout`. Blobs are read through their digests on the way: a damaged
/// manifest is an error, not a reason to drop what it names.
pub fn garbage(layout: &Layout, roots: Roots) -> Result<Garbage> {
    let present = blob_digests(layout);
    let mut wanted: Vec<Digest> =
        digests_in(&std::fs::read(layout.root().join("index.json")).unwrap_or_default());
    let records = record_files(layout);
    if let Roots::IndexManifestsAndRecords = roots {
        for (_, names) in &records {
            wanted.extend(names.iter().cloned());
        }
        for (digest, size) in &present {
            if *size <= MAX_JSON_BYTES && is_manifest(layout, digest, *size) {
                wanted.push(digest.clone());
            }
        }
    }
    let sizes: std::collections::HashMap<&Digest, u64> =
        present.iter().map(|(d, s)| (d, *s)).collect();
    let mut reached: HashSet<Digest> = HashSet::new();
    while let Some(digest) = wanted.pop() {
        let Some(&size) = sizes.get(&digest) else {
            continue;
        };
        if !reached.insert(digest.clone()) || size > MAX_JSON_BYTES {
            continue;
        }
        if let Some(json) = json_blob(layout, &digest, size)? {
            wanted.extend(digests_in(&json));
        }
    }
    let gone: BTreeSet<&Digest> = present
        .iter()
        .map(|(d, _)| d)
        .filter(|d| !reached.contains(*d))
        .collect();
    let mut found = Garbage {
        temp: temp_files(layout),
        blobs: gone
            .iter()
            .map(|d| (layout.blob_path(d), sizes[d]))
            .collect(),
        records: records
            .into_iter()
            .filter(|(_, names)| names.iter().any(|d| gone.contains(d)))
            .map(|(path, _)| path)
            .collect(),
    };
    found.records.sort();
    Ok(found)
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

/// Every blob file named by a sha256 digest, with its size.
fn blob_digests(layout: &Layout) -> Vec<(Digest, u64)> {
    let dir = layout.root().join("blobs/sha256");
    let mut found: Vec<(Digest, u64)> = std::fs::read_dir(&dir)
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
    found.sort();
    found
}

/// The records under `.gpubake/`, each with the blob digests it names.
fn record_files(layout: &Layout) -> Vec<(PathBuf, Vec<Digest>)> {
    let mut found = Vec::new();
    let kinds = std::fs::read_dir(layout.root().join(".gpubake"))
        .into_iter()
        .flatten()
        .flatten();
    for kind in kinds.filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
        for record in std::fs::read_dir(kind.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = record.path();
            if path.extension().is_some_and(|x| x == "json") {
                let names = std::fs::read(&path)
                    .map(|b| digests_in(&b))
                    .unwrap_or_default();
                found.push((path, names));
            }
        }
    }
    found.sort();
    found
}

/// A blob's bytes when it is a JSON document (a manifest, an index, a config), checked
/// against its digest.
fn json_blob(layout: &Layout, digest: &Digest, size: u64) -> Result<Option<Vec<u8>>> {
    let mut head = [0u8; 1];
    let starts_as_json = std::fs::File::open(layout.blob_path(digest))
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|()| head[0] == b'{');
    if !starts_as_json {
        return Ok(None);
    }
    layout.read_blob(digest, Some(size)).map(Some)
}

/// Whether a blob is an image manifest or index: a pulled image keeps its blobs.
fn is_manifest(layout: &Layout, digest: &Digest, size: u64) -> bool {
    let Ok(Some(json)) = json_blob(layout, digest, size) else {
        return false;
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&json) else {
        return false;
    };
    value.get("manifests").is_some_and(|m| m.is_array())
        || value.get("layers").is_some_and(|l| l.is_array())
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
}
