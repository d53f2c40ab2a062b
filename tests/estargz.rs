//! gpubake's eStargz and zstd:chunked layers judged by the stargz snapshotter's own reader:
//! tests/estargz-check, built with Debian's Go against Debian's source of the snapshotter's
//! library, opens each blob as the snapshotter does before it mounts a layer (footer, TOC
//! against the descriptor's digest, every chunk through its verifier) and inflates it as a
//! runtime that unpacks it does. A corrupt chunk, TOC, footer or annotation must fail it.

mod common;

use common::toc::{check, checker, field, toc_at, toc_names, toc_of};

use gpubake::image::Compression;
use gpubake::image::estargz::{
    self, FOOTER_SIZE, NO_PREFETCH_LANDMARK, PREFETCH_LANDMARK, TOC_DIGEST,
};
use gpubake::image::layer::{BuiltLayer, Entry, LayerSpec, Prefetch, ROOT, Source, build_layer};
use gpubake::image::layout::{Layout, digest_of};
use sha2::{Digest as _, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

fn entry(path: &str, mode: u32, source: Source) -> Entry {
    Entry {
        path: path.into(),
        mode,
        owner: ROOT,
        source,
    }
}

/// Bytes that compress unevenly: random stretches between text, so members are both
/// stored and deflated.
fn mixed(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|i| {
            if (i / 100_000) % 2 == 0 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            } else {
                b"all-reduce "[i % 11]
            }
        })
        .collect()
}

fn random(len: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// Every kind of entry gpubake's layers hold.
fn every_kind(dir: &Path) -> LayerSpec {
    let on_disk = dir.join("on-disk.so");
    std::fs::write(&on_disk, mixed(300_000)).unwrap();
    let long = format!("opt/{}/lib.so", "n".repeat(140));
    LayerSpec {
        name: "every-kind".into(),
        created_by: "tests/estargz.rs".into(),
        entries: vec![
            entry(
                "etc/small.conf",
                0o644,
                Source::Bytes(b"NCCL_DEBUG=WARN\n".to_vec()),
            ),
            entry("etc/empty", 0o644, Source::Bytes(Vec::new())),
            // Three chunks and a piece.
            entry(
                "usr/lib/libbig.so",
                0o755,
                Source::Bytes(mixed(3 * estargz::CHUNK as usize + 12_345)),
            ),
            entry(
                "usr/lib/exact.bin",
                0o644,
                Source::Bytes(mixed(estargz::CHUNK as usize)),
            ),
            // Random bytes, which the compressor stores as they are.
            entry("usr/lib/random.bin", 0o644, Source::Bytes(random(2 << 20))),
            entry(
                "usr/lib/libbig.so.1",
                0o777,
                Source::Symlink("libbig.so".into()),
            ),
            entry(
                "usr/bin/setuid-tool",
                0o4755,
                Source::Bytes(b"#!/bin/sh\n".to_vec()),
            ),
            entry("var/empty-dir", 0o755, Source::Dir),
            entry(&long, 0o644, Source::Bytes(b"long".to_vec())),
            entry(
                "srv/données-ü.txt",
                0o644,
                Source::Bytes(b"non-ascii".to_vec()),
            ),
            entry("srv/.wh.gone", 0o644, Source::Bytes(Vec::new())),
            entry("srv/old/.wh..wh..opq", 0o644, Source::Bytes(Vec::new())),
            entry("usr/lib/on-disk.so", 0o755, Source::File(on_disk)),
        ],
        prefetch: None,
    }
}

fn blob_of(layout: &Layout, built: &BuiltLayer) -> PathBuf {
    layout.blob_path(&digest_of(&built.descriptor).unwrap())
}

fn annotation<'a>(built: &'a BuiltLayer, key: &str) -> &'a str {
    built
        .descriptor
        .annotations()
        .as_ref()
        .and_then(|a| a.get(key))
        .unwrap_or_else(|| panic!("no {key} annotation"))
}

/// Both formats with a table of contents.
const LAZY: [Compression; 2] = [Compression::Estargz, Compression::ZstdChunked];

#[test]
fn every_kind_of_entry_reads_back_through_the_snapshotters_reader() {
    let Some(checker) = checker() else { return };
    for compression in LAZY {
        every_kind_reads_back(&checker, compression);
    }
}

fn every_kind_reads_back(checker: &Path, compression: Compression) {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::create(&dir.path().join("layout")).unwrap();
    let spec = every_kind(dir.path());
    let built = build_layer(&layout, &spec, compression, 0, false).unwrap();
    assert_eq!(built.descriptor.media_type(), &compression.media_type());
    let blob = blob_of(&layout, &built);
    let toc = annotation(&built, TOC_DIGEST);
    let fields = check(checker, &blob, toc).unwrap();

    assert_eq!(field(&fields, "diffID"), built.diff_id.as_str());
    assert_eq!(
        field(&fields, "uncompressed"),
        annotation(&built, estargz::UNCOMPRESSED_SIZE)
    );
    assert_eq!(field(&fields, "landmark"), NO_PREFETCH_LANDMARK);
    estargz::check_toc(&blob, toc).unwrap();
    assert_eq!(field(&fields, "prefetch"), "0");
    // The landmark and the eight regular files with content; libbig.so in four chunks,
    // exact.bin in one, the others in one each.
    assert_eq!(field(&fields, "files"), "9");
    assert_eq!(field(&fields, "chunks"), "12");
    let bytes = std::fs::read(&blob).unwrap();
    assert_eq!(bytes.len() as u64, built.descriptor.size());
    assert_eq!(
        format!("sha256:{}", hex::encode(Sha256::digest(&bytes))),
        built.descriptor.digest().to_string()
    );
    if compression == Compression::ZstdChunked {
        // What containers/storage reads: the compressed TOC's digest and its place.
        let (at, len) = toc_at(&bytes);
        let len = len.expect("a zstd:chunked footer");
        let json = zstd::stream::decode_all(&bytes[at..at + len]).unwrap();
        assert_eq!(
            annotation(&built, estargz::MANIFEST_CHECKSUM),
            format!(
                "sha256:{}",
                hex::encode(Sha256::digest(&bytes[at..at + len]))
            )
        );
        assert_eq!(
            annotation(&built, estargz::MANIFEST_POSITION),
            format!("{at}:{len}:{}:1", json.len())
        );
        assert_eq!(
            toc,
            format!("sha256:{}", hex::encode(Sha256::digest(&json)))
        );
    }

    // The same entries give the same blob.
    let again = Layout::create(&dir.path().join("again")).unwrap();
    let rebuilt = build_layer(&again, &spec, compression, 0, false).unwrap();
    assert_eq!(rebuilt.descriptor, built.descriptor);
    assert_eq!(rebuilt.diff_id, built.diff_id);
}

#[test]
fn a_corrupt_chunk_toc_footer_or_annotation_fails_the_reader() {
    let Some(checker) = checker() else { return };
    for compression in LAZY {
        corruption_is_caught(&checker, compression);
    }
}

fn corruption_is_caught(checker: &Path, compression: Compression) {
    let zstd = compression == Compression::ZstdChunked;
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::create(&dir.path().join("layout")).unwrap();
    let built = build_layer(&layout, &every_kind(dir.path()), compression, 0, false).unwrap();
    let good = std::fs::read(blob_of(&layout, &built)).unwrap();
    let toc_digest = annotation(&built, TOC_DIGEST).to_string();
    let toc = toc_of(&good);
    let chunk = toc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "chunk")
        .expect("a chunk entry");
    let chunk_at = chunk["offset"].as_u64().unwrap() as usize;
    let (toc_at, _) = toc_at(&good);

    let write = |name: &str, flip: Option<usize>| {
        let mut bytes = good.clone();
        if let Some(at) = flip {
            bytes[at] ^= 0x55;
        }
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let zeros = format!("sha256:{}", "0".repeat(64));
    let tampered = dir.path().join("tampered");
    let random_at = toc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "usr/lib/random.bin")
        .unwrap()["offset"]
        .as_u64()
        .unwrap() as usize;
    if zstd {
        // zstd keeps random bytes in raw blocks, and its frames carry no checksum here:
        // a changed byte there reads back without complaint, but for the chunk's digest.
        let mut bytes = good.clone();
        bytes[random_at + 1000] ^= 0x55;
        std::fs::write(&tampered, bytes).unwrap();
    } else {
        std::fs::write(
            &tampered,
            tamper_stored_chunk(&good, &toc, "usr/lib/random.bin"),
        )
        .unwrap();
    }
    // The footer's TOC offset (zstd:chunked's first field; eStargz's hex digits).
    let footer_at = if zstd {
        good.len() - estargz::ZSTD_FOOTER_SIZE
    } else {
        good.len() - 20
    };
    let cases = [
        // A flipped bit inside a compressed member or frame: gzip's own CRC sees it, and
        // zstd cannot decode it or the chunk's digest sees it.
        (
            "a member",
            write("member", Some(chunk_at + 4000)),
            &toc_digest,
            if zstd { "FAIL " } else { "FAIL read" },
        ),
        // Other bytes in a member that is valid gzip: only the chunk's digest sees it.
        (
            "a chunk",
            tampered,
            &toc_digest,
            "FAIL chunk: chunk digest mismatch",
        ),
        (
            "the TOC",
            write("toc", Some(toc_at + if zstd { 40 } else { 600 })),
            &toc_digest,
            "FAIL ",
        ),
        (
            "the footer",
            write("footer", Some(footer_at)),
            &toc_digest,
            "FAIL Open",
        ),
        (
            "the annotation",
            write("good", None),
            &zeros,
            "FAIL VerifyTOC: invalid TOC JSON",
        ),
    ];
    for (what, path, digest, said) in cases {
        let err = check(checker, &path, digest).expect_err(what);
        println!("{compression:?}, {what}: {err}");
        assert!(err.starts_with(said), "{compression:?}, {what}: {err}");
        // gpubake's own check (inspect --check, verify) refuses what is wrong in the TOC.
        if matches!(what, "the TOC" | "the footer" | "the annotation") {
            let ours = estargz::check_toc(&path, digest).expect_err(what);
            println!("{compression:?}, {what}, gpubake: {ours}");
        }
    }
    // And the blob unchanged passes.
    check(checker, &dir.path().join("good"), &toc_digest).unwrap();
}

/// `blob` with one byte of `name`'s chunk changed inside its stored (uncompressed) gzip
/// member, and the member's CRC made right again: gzip reads it without complaint.
fn tamper_stored_chunk(blob: &[u8], toc: &serde_json::Value, name: &str) -> Vec<u8> {
    let entry = toc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap();
    let at = entry["offset"].as_u64().unwrap() as usize;
    let mut rest = &blob[at..];
    let mut data = Vec::new();
    flate2::bufread::GzDecoder::new(&mut rest)
        .read_to_end(&mut data)
        .unwrap();
    let end = blob.len() - rest.len();
    let window = &data[1000..1032];
    let found = blob[at..end]
        .windows(window.len())
        .position(|w| w == window)
        .expect("the member stores the bytes as they are");
    let mut out = blob.to_vec();
    out[at + found] ^= 0x55;
    data[1000] ^= 0x55;
    let mut crc = flate2::Crc::new();
    crc.update(&data);
    out[end - 8..end - 4].copy_from_slice(&crc.sum().to_le_bytes());
    out
}

/// A layer of many files has a TOC larger than the compressor's 1 MiB blocks (a Debian base:
/// 3 MB). The snapshotter reads the TOC's gzip member alone, so the TOC is one member from
/// both writers, and a TOC split across members is refused by gpubake's check as by Go's.
#[test]
fn a_toc_larger_than_a_block_is_one_member() {
    let Some(checker) = checker() else { return };
    let dir = tempfile::tempdir().unwrap();
    let entries: Vec<Entry> = (0..12_000)
        .map(|i| {
            let body = format!("file {i}\n").into_bytes();
            entry(
                &format!("usr/share/doc/p{}/f{i}", i % 97),
                0o644,
                Source::Bytes(body),
            )
        })
        .collect();
    let spec = LayerSpec {
        name: "many-files".into(),
        created_by: "tests/estargz.rs".into(),
        entries,
        prefetch: None,
    };
    let layout = Layout::create(&dir.path().join("layout")).unwrap();
    let built = build_layer(&layout, &spec, Compression::Estargz, 0, false).unwrap();
    let blob = blob_of(&layout, &built);
    let toc = annotation(&built, TOC_DIGEST);
    let bytes = std::fs::read(&blob).unwrap();
    let json = serde_json::to_vec(&toc_of(&bytes)).unwrap();
    assert!(json.len() > 2 << 20, "a TOC of {} bytes", json.len());
    check(&checker, &blob, toc).unwrap();
    estargz::check_toc(&blob, toc).unwrap();

    // zstd:chunked keeps the TOC in one skippable frame, whatever its size.
    let zstd = build_layer(&layout, &spec, Compression::ZstdChunked, 0, false).unwrap();
    let zstd_blob = blob_of(&layout, &zstd);
    check(&checker, &zstd_blob, annotation(&zstd, TOC_DIGEST)).unwrap();
    estargz::check_toc(&zstd_blob, annotation(&zstd, TOC_DIGEST)).unwrap();

    // The serial writer, which frames another tool's tar, on the same files.
    let mut tar = tar::Builder::new(Vec::new());
    for e in &spec.entries {
        let Source::Bytes(body) = &e.source else {
            unreachable!()
        };
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(e.mode);
        tar.append_data(&mut h, &e.path, &body[..]).unwrap();
    }
    let mut serial = Vec::new();
    let converted = estargz::convert(&tar.into_inner().unwrap()[..], &mut serial).unwrap();
    let path = dir.path().join("serial");
    std::fs::write(&path, &serial).unwrap();
    check(&checker, &path, converted.digest.as_str()).unwrap();

    // The TOC's member cut in two: same bytes inflated, same offset and digest.
    let at = estargz::toc_offset(&bytes[bytes.len() - FOOTER_SIZE..]).unwrap() as usize;
    let mut inflated = Vec::new();
    flate2::read::GzDecoder::new(&bytes[at..bytes.len() - FOOTER_SIZE])
        .read_to_end(&mut inflated)
        .unwrap();
    let mut split = bytes[..at].to_vec();
    for half in inflated.chunks(inflated.len() / 2 + 1) {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, half).unwrap();
        split.extend(gz.finish().unwrap());
    }
    split.extend_from_slice(&bytes[bytes.len() - FOOTER_SIZE..]);
    let path = dir.path().join("split");
    std::fs::write(&path, &split).unwrap();
    let go = check(&checker, &path, toc).expect_err("Go reads the TOC's member alone");
    assert!(go.contains("error decoding TOC JSON"), "{go}");
    let ours = estargz::check_toc(&path, toc).unwrap_err();
    assert!(ours.contains("reads the TOC as one member"), "{ours}");
}

/// The framing takes any tar, not only gpubake's: hard links, extended attributes, devices
/// and fifos from another tool's layer convert and read back.
#[test]
fn a_foreign_tar_with_hard_links_xattrs_and_devices_converts() {
    let Some(checker) = checker() else { return };
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(5);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append_pax_extensions([("SCHILY.xattr.security.capability", &b"\x01\x00\x00\x02"[..])])
        .unwrap();
    tar.append_data(&mut h, "bin/ping", &b"ping!"[..]).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Link);
    h.set_size(0);
    h.set_cksum();
    tar.append_link(&mut h, "bin/ping6", "bin/ping").unwrap();
    for (name, kind) in [
        ("dev/null", tar::EntryType::Char),
        ("run/pipe", tar::EntryType::Fifo),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
        h.set_cksum();
        tar.append_data(&mut h, name, std::io::empty()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    let mut blob = Vec::new();
    let toc = estargz::convert(&tar.into_inner().unwrap()[..], &mut blob).unwrap();
    std::fs::write(&path, &blob).unwrap();
    let fields = check(&checker, &path, toc.digest.as_str()).unwrap();
    assert_eq!(
        field(&fields, "uncompressed"),
        toc.uncompressed_size.to_string()
    );
    let entries = toc_of(&blob)["entries"].clone();
    let kinds: Vec<&str> = entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["reg", "reg", "hardlink", "char", "fifo"]);
    assert_eq!(entries[1]["xattrs"]["security.capability"], "AQAAAg==");
    assert_eq!(entries[2]["linkName"], "bin/ping");
    assert_eq!(entries[3]["devMajor"], 1);
}

#[test]
fn a_prefetch_puts_its_files_first_then_the_landmark_whose_offset_is_the_prefetch() {
    let Some(checker) = checker() else { return };
    for compression in LAZY {
        prefetch_order(&checker, compression);
    }
}

fn prefetch_order(checker: &Path, compression: Compression) {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::create(&dir.path().join("layout")).unwrap();
    let mut spec = every_kind(dir.path());
    spec.prefetch = Some(std::sync::Arc::new(Prefetch {
        // First-touch order, not path order; a path of another layer is passed over.
        fetched: vec![
            "usr/lib/on-disk.so".into(),
            "not/in/this/layer.py".into(),
            "usr/lib/libbig.so".into(),
            "etc/small.conf".into(),
        ],
        lazy: vec!["usr/lib/random.bin".into()],
    }));
    let built = build_layer(&layout, &spec, compression, 0, false).unwrap();
    let blob = blob_of(&layout, &built);
    let fields = check(checker, &blob, annotation(&built, TOC_DIGEST)).unwrap();
    assert_eq!(field(&fields, "landmark"), PREFETCH_LANDMARK);
    assert_eq!(field(&fields, "diffID"), built.diff_id.as_str());
    assert_eq!(
        field(&fields, "uncompressed"),
        annotation(&built, estargz::UNCOMPRESSED_SIZE)
    );
    // Everything but the new landmark is there, as before.
    assert_eq!(field(&fields, "files"), "9");
    assert_eq!(field(&fields, "chunks"), "12");

    let bytes = std::fs::read(&blob).unwrap();
    let names = toc_names(&bytes);
    let order: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
    // Each fetched file after its parents, in the prefetch's order, then the landmark, then
    // the lazy file, then the rest in path order (parents first).
    assert_eq!(
        order[..8],
        [
            "usr",
            "usr/lib",
            "usr/lib/on-disk.so",
            "usr/lib/libbig.so",
            "etc",
            "etc/small.conf",
            PREFETCH_LANDMARK,
            "usr/lib/random.bin",
        ]
    );
    let rest = &order[8..];
    let mut sorted = rest.to_vec();
    sorted.sort();
    assert_eq!(rest, sorted.as_slice());
    assert!(!rest.contains(&NO_PREFETCH_LANDMARK));

    // The prefetch (the landmark's offset, as the snapshotter reads it) holds every chunk of
    // the fetched files and nothing of the others.
    let prefetch: u64 = field(&fields, "prefetch").parse().unwrap();
    let landmark = names.iter().find(|(n, _)| n == PREFETCH_LANDMARK).unwrap();
    assert_eq!(prefetch, landmark.1);
    let toc = toc_of(&bytes);
    let mut name = "";
    for e in toc["entries"].as_array().unwrap() {
        // A chunk after the first is the file's before it, as the reader takes it.
        if e["type"] != "chunk" {
            name = e["name"].as_str().unwrap();
        }
        let Some(offset) = e["offset"]
            .as_u64()
            .filter(|_| e["size"].as_u64() > Some(0) || e["type"] == "chunk")
        else {
            continue;
        };
        let fetched = ["usr/lib/on-disk.so", "usr/lib/libbig.so", "etc/small.conf"].contains(&name);
        assert_eq!(
            offset < prefetch,
            fetched,
            "{name} at {offset}, prefetch {prefetch}"
        );
    }
    assert!(
        prefetch > (3 * estargz::CHUNK) / 4,
        "libbig.so is in the prefetch"
    );

    // Another prefetch is another layer, not the cached one; no fetched file of this layer
    // gives the no-prefetch landmark.
    let mut other = every_kind(dir.path());
    other.prefetch = Some(std::sync::Arc::new(Prefetch {
        fetched: vec!["not/here.py".into()],
        lazy: vec!["usr/lib/random.bin".into()],
    }));
    let again = build_layer(&layout, &other, compression, 0, true).unwrap();
    assert!(!again.reused());
    let bytes = std::fs::read(blob_of(&layout, &again)).unwrap();
    let names = toc_names(&bytes);
    assert_eq!(names[0].0, NO_PREFETCH_LANDMARK);
    assert_eq!(names[3].0, "usr/lib/random.bin", "{names:?}");
    let fields = check(
        checker,
        &blob_of(&layout, &again),
        annotation(&again, TOC_DIGEST),
    )
    .unwrap();
    assert_eq!(field(&fields, "prefetch"), "0");
    // A prefetch means nothing to gzip: the layer is the one without it.
    let plain = build_layer(
        &layout,
        &every_kind(dir.path()),
        Compression::Gzip,
        0,
        false,
    )
    .unwrap();
    let mut with = every_kind(dir.path());
    with.prefetch = spec.prefetch.clone();
    let gz = build_layer(&layout, &with, Compression::Gzip, 0, false).unwrap();
    assert_eq!(plain.descriptor.digest(), gz.descriptor.digest());
}

/// `copy --compression estargz`: every layer of a gzip image framed anew, each read back by
/// the snapshotter's reader against its annotation, the config's diff IDs those of the
/// inflated streams, `verify` and umoci content; the same copy again gives the same digest,
/// and an eStargz image copied so keeps its own.
#[test]
fn copy_rewrites_a_gzip_image_as_estargz() {
    let Some(checker) = checker() else { return };
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let recipe = common::write(
        d,
        "r.yaml",
        &common::recipe("pytorch: '2.9'\npresets: [base]\n"),
    );
    let oci = |name: &str| format!("oci:{}:v1", d.join(name).display());
    common::build_json_in(d, &recipe, &oci("src"), &[]);
    let copy = |from: &str, to: &str, extra: &[&str]| -> serde_json::Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .env("GPUBAKE_CACHE_DIR", d.join("cache"))
            .args(["copy", "--json", from, to])
            .args(extra)
            .output()
            .unwrap();
        common::assert_exit(&out, 0);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let gzip = copy(&oci("src"), &oci("plain"), &[]);
    let first = copy(&oci("src"), &oci("a"), &["--compression", "estargz"]);
    assert_ne!(first["manifest"], gzip["manifest"]);

    let layout = d.join("a");
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let json = |digest: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(blob(digest)).unwrap()).unwrap()
    };
    let manifest = json(first["manifest"].as_str().unwrap());
    let config = json(manifest["config"]["digest"].as_str().unwrap());
    let layers = manifest["layers"].as_array().unwrap();
    assert!(layers.len() >= 3, "{manifest}");
    for (i, l) in layers.iter().enumerate() {
        let annotations = &l["annotations"];
        let toc = annotations[TOC_DIGEST].as_str().expect("a TOC digest");
        let fields = check(&checker, &blob(l["digest"].as_str().unwrap()), toc).unwrap();
        assert_eq!(field(&fields, "diffID"), config["rootfs"]["diff_ids"][i]);
        assert_eq!(
            field(&fields, "uncompressed"),
            annotations[estargz::UNCOMPRESSED_SIZE]
        );
        assert_eq!(field(&fields, "landmark"), NO_PREFETCH_LANDMARK);
    }
    let out = common::gpubake(&["verify", &oci("a")]);
    common::assert_exit(&out, 0);
    let bundle = d.join("bundle");
    common::run(
        std::process::Command::new("umoci")
            .args(["unpack", "--rootless", "--image"])
            .arg(format!("{}:v1", layout.display()))
            .arg(&bundle),
    );
    assert!(bundle.join("rootfs/etc/nccl.conf").exists());

    // The same copy again, into a fresh layout, gives the same image; an eStargz image keeps
    // its layers and its digest.
    let again = copy(&oci("src"), &oci("b"), &["--compression", "estargz"]);
    assert_eq!(again["manifest"], first["manifest"]);
    let twice = copy(&oci("a"), &oci("c"), &["--compression", "estargz"]);
    assert_eq!(twice["manifest"], first["manifest"]);

    // zstd:chunked from the gzip image and from the eStargz one: the same layers (the old
    // TOC and landmark are dropped), each read back by the snapshotter's reader.
    let zstd = copy(&oci("src"), &oci("z1"), &["--compression", "zstd:chunked"]);
    let again = copy(&oci("a"), &oci("z2"), &["--compression", "zstd:chunked"]);
    let layout = d.join("z1");
    let manifest = json_in(&layout, zstd["manifest"].as_str().unwrap());
    let config = json_in(&layout, manifest["config"]["digest"].as_str().unwrap());
    for (i, l) in manifest["layers"].as_array().unwrap().iter().enumerate() {
        assert_eq!(
            l["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
        let toc = l["annotations"][TOC_DIGEST].as_str().expect("a TOC digest");
        let path = layout
            .join("blobs/sha256")
            .join(l["digest"].as_str().unwrap().trim_start_matches("sha256:"));
        let fields = check(&checker, &path, toc).unwrap();
        assert_eq!(field(&fields, "diffID"), config["rootfs"]["diff_ids"][i]);
        assert_eq!(field(&fields, "landmark"), NO_PREFETCH_LANDMARK);
        let names = toc_names(&std::fs::read(&path).unwrap());
        let landmarks = names
            .iter()
            .filter(|(n, _)| n.ends_with(".landmark"))
            .count();
        assert_eq!(landmarks, 1, "{names:?}");
        assert!(
            !names.iter().any(|(n, _)| n == estargz::TOC_NAME),
            "{names:?}"
        );
    }
    assert_eq!(again["manifest"], zstd["manifest"]);
    // And back: zstd:chunked rewritten as eStargz is the eStargz copy of the gzip image.
    let back = copy(&oci("z1"), &oci("e2"), &["--compression", "estargz"]);
    assert_eq!(back["manifest"], first["manifest"]);
    let out = common::gpubake(&["verify", &oci("z1")]);
    common::assert_exit(&out, 0);

    let out = common::gpubake(&["copy", "--compression", "zstd", &oci("src"), &oci("z")]);
    common::assert_exit(&out, 2);
    assert!(common::stderr(&out).contains("rewrites them as estargz or zstd:chunked"));
}

fn json_in(layout: &Path, digest: &str) -> serde_json::Value {
    let path = layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}
