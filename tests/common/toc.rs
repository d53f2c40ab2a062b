//! eStargz and zstd:chunked blobs read back: the stargz snapshotter's own reader
//! (tests/estargz-check) and the TOC as JSON.

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

/// Where the TOC's bytes begin (a gzip member, or a zstd:chunked TOC's compressed JSON),
/// and how many there are for zstd:chunked, read from the footer as a reader does:
/// zstd:chunked's 40 bytes (`GnUlInUx` last) or eStargz's 51.
pub fn toc_at(blob: &[u8]) -> (usize, Option<usize>) {
    if blob.ends_with(b"GnUlInUx") {
        let footer = &blob[blob.len() - 40..];
        let field = |i: usize| u64::from_le_bytes(footer[i..i + 8].try_into().unwrap()) as usize;
        return (field(0), Some(field(8)));
    }
    let at = estargz::toc_offset(&blob[blob.len() - FOOTER_SIZE..]).unwrap() as usize;
    (at, None)
}

/// The TOC's JSON, read from the blob's footer onwards.
pub fn toc_of(blob: &[u8]) -> serde_json::Value {
    let (at, zstd_len) = toc_at(blob);
    if let Some(len) = zstd_len {
        let json = zstd::stream::decode_all(&blob[at..at + len]).unwrap();
        return serde_json::from_slice(&json).unwrap();
    }
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
                // The root directory's name is empty, and left out.
                e["name"].as_str().unwrap_or_default().to_string(),
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
