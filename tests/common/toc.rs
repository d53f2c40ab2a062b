//! eStargz blobs read back: the stargz snapshotter's own reader (tests/estargz-check) and the
//! TOC as JSON.

use gpubake::image::estargz::{self, FOOTER_SIZE};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The checker, built once per target directory; None where Go or the library is missing.
pub fn checker() -> Option<PathBuf> {
    super::go::build("estargz-check", &[])
}

/// What the checker said: its OK line's fields, or its failure.
pub fn check(checker: &Path, blob: &Path, toc: &str) -> Result<Vec<(String, String)>, String> {
    let out = Command::new(checker).arg(blob).arg(toc).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let line = stdout.trim().strip_prefix("OK ").expect("an OK line");
    Ok(line
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

pub fn field<'a>(fields: &'a [(String, String)], key: &str) -> &'a str {
    &fields.iter().find(|(k, _)| k == key).expect(key).1
}

/// The TOC's JSON, read from the blob's footer onwards.
pub fn toc_of(blob: &[u8]) -> serde_json::Value {
    let at = estargz::toc_offset(&blob[blob.len() - FOOTER_SIZE..]).unwrap() as usize;
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(&blob[at..])
        .read_to_end(&mut tar)
        .unwrap();
    let mut archive = tar::Archive::new(&tar[..]);
    let mut entry = archive.entries().unwrap().next().unwrap().unwrap();
    let mut json = Vec::new();
    entry.read_to_end(&mut json).unwrap();
    serde_json::from_slice(&json).unwrap()
}

/// The TOC's entry names in blob order, and each one's offset.
pub fn toc_names(blob: &[u8]) -> Vec<(String, u64)> {
    toc_of(blob)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] != "chunk")
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["offset"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// The TOC digest the manifest in `layout` gives the layer `digest`.
pub fn toc_digest(layout: &Path, digest: &str) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let blob = |d: &str| {
        layout
            .join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["digest"] == digest)
        .unwrap()["annotations"]["containerd.io/snapshot/stargz/toc.digest"]
        .as_str()
        .unwrap()
        .to_string()
}
