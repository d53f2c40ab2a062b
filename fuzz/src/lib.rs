//! The bodies of gpubake's fuzz targets, one function per input format. Each feeds arbitrary
//! bytes to the narrowest public function that reads that format, then to what consumes the
//! result, and asserts what must hold for any input: no panic, no hang, nothing written outside
//! the scratch directory. An error is a fine outcome; only a crash is a finding.
//!
//! `fuzz_targets/*.rs` wrap these for libFuzzer (`scripts/fuzz`, or `cargo fuzz run NAME` on a
//! nightly toolchain), and `tests/fuzz_corpus.rs` replays every seed and every past crash
//! through them under `cargo test`.

use gpubake::bake::build::BuildOptions;
use gpubake::document::Document;
use gpubake::image::Transport;
use gpubake::image::layout::{Layout, REF_NAME};
use gpubake::image::{Image, Platform};
use gpubake::lint::{LintOptions, lint_file};
use gpubake::recipe::LoadedRecipe;
use gpubake::resolve::{Options, Resolved, resolve_recipe};
use sha2::Digest as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A scratch directory for one input, removed afterwards.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gpubake-fuzz-")
        .tempdir()
        .expect("a temporary directory")
}

fn lint_options() -> LintOptions {
    LintOptions {
        nccl: None,
        resolve: Options::default(),
    }
}

/// A recipe: parsed, resolved against the embedded data, and linted, as `resolve` and `lint`
/// read one.
pub fn recipe(data: &[u8]) {
    let dir = scratch();
    let path = dir.path().join("recipe.yaml");
    std::fs::write(&path, data).unwrap();
    let _ = lint_file(&path, &lint_options());
    if let Ok(loaded) = LoadedRecipe::read(&path)
        && let Ok(resolved) = resolve_recipe(&loaded, &Options::default())
    {
        // The lock a recipe resolves to is always one gpubake can read back.
        let text = resolved.lock.to_yaml();
        let again: gpubake::lock::Lock = serde_yaml::from_str(&text)
            .unwrap_or_else(|e| panic!("a resolved lock does not read back: {e}\n{text}"));
        assert_eq!(
            again, resolved.lock,
            "a resolved lock changes on reading back"
        );
    }
}

/// A preset: parsed and linted.
pub fn preset(data: &[u8]) {
    let dir = scratch();
    let path = dir.path().join("preset.yaml");
    std::fs::write(&path, data).unwrap();
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = gpubake::preset::Preset::parse("fuzz", Document::from_text("preset.yaml", text));
    }
    let _ = lint_file(&path, &lint_options());
}

/// A lock as `verify` and `certify` read it from an image, and what is made from it.
pub fn lock(data: &[u8]) {
    let Ok(lock) = serde_yaml::from_slice::<gpubake::lock::Lock>(data) else {
        return;
    };
    let _ = lock.image_env();
    let _ = lock.requirements();
    let text = lock.to_yaml();
    // What gpubake writes, it reads back as the same lock.
    let again: gpubake::lock::Lock = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("a lock gpubake wrote does not read back: {e}\n{text}"));
    assert_eq!(again.to_yaml(), text, "a lock changes on reading back");
}

/// A start-up record, as `build --startup-record` reads it and lays layers out by it: what
/// it accepts writes back as itself, and every file it names lands on one side of the landmark.
pub fn startup_record(data: &[u8]) {
    let dir = scratch();
    let path = dir.path().join("startup.json");
    std::fs::write(&path, data).expect("a scratch file");
    let Ok(record) = gpubake::startup::StartupRecord::read(&path) else {
        return;
    };
    let again = dir.path().join("again.json");
    record.write(&again).expect("a record writes");
    let reread = gpubake::startup::StartupRecord::read(&again)
        .unwrap_or_else(|e| panic!("a record gpubake wrote does not read back: {e}"));
    assert_eq!(reread, record, "a record changes on reading back");
    let site = "opt/gpubake/venv/lib/python3.12/site-packages";
    let prefetch = gpubake::bake::prefetch::plan(&record, site);
    assert_eq!(
        prefetch.fetched.len() + prefetch.lazy.len(),
        record.files.len()
    );
    for path in prefetch.fetched.iter().chain(&prefetch.lazy) {
        assert!(path.starts_with(site), "{path} is outside site-packages");
    }
}

/// A PEP 751 pylock, as `build` reads the closure.
pub fn pylock(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(closure) = gpubake::closure::parse(Path::new("pylock.fuzz.toml"), text) {
        let _ = closure.inputs();
    }
}

/// `NVIDIA_REQUIRE_*`, parsed and checked against a few nodes.
pub fn nvidia_require(data: &[u8]) {
    use gpubake::probe::require::{Requirement, Target};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(req) = Requirement::parse(text) else {
        return;
    };
    let _ = req.to_string();
    for (cuda, driver, arch, brand) in [
        ("12.8", "570.124.06", Some("9.0"), Some("nvidia")),
        ("13.0", "580.159.03", None, None),
        ("11", "450", Some("8"), Some("tesla")),
    ] {
        let target = Target {
            cuda: cuda.parse().unwrap(),
            driver: driver.parse().unwrap(),
            arch: arch.map(|a| a.parse().unwrap()),
            brand: brand.map(String::from),
        };
        let _ = req.check(&target);
    }
}

/// An nccl.conf, as the linter reads it (which reads it as NCCL's loader does).
pub fn nccl_conf(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        for (_, line) in gpubake::nccl::conf::read(text) {
            let _ = line;
        }
    }
    let dir = scratch();
    let path = dir.path().join("nccl.conf");
    std::fs::write(&path, data).unwrap();
    let _ = lint_file(&path, &lint_options());
}

/// The placeholders an `oci_image` input may use where a digest or a size must match bytes
/// the fuzzer cannot hash: the harness writes the config, the manifest and the layer as blobs
/// and puts their real digests and sizes in.
const MANIFEST_DIGEST: &str = "@MANIFEST@";
const MANIFEST_SIZE: &str = "@MANIFEST_SIZE@";
const CONFIG_DIGEST: &str = "@CONFIG@";
const CONFIG_SIZE: &str = "@CONFIG_SIZE@";
const LAYER_DIGEST: &str = "@LAYER@";
const LAYER_SIZE: &str = "@LAYER_SIZE@";
const DIFF_ID: &str = "@DIFF_ID@";

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// A small uncompressed layer: a directory, a file, a link.
fn sample_layer() -> &'static [u8] {
    static LAYER: OnceLock<Vec<u8>> = OnceLock::new();
    LAYER.get_or_init(|| {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, "etc/", std::io::empty()).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(5);
        b.append_data(&mut h, "etc/hostname", &b"fuzz\n"[..])
            .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "etc/name", "hostname").unwrap();
        b.into_inner().unwrap()
    })
}

/// Writes an OCI layout at `root` from an index, a manifest, a config and a layer, filling the
/// placeholders; the blobs are stored under their real digests.
fn write_layout(root: &Path, index: &[u8], manifest: &[u8], config: &[u8], layer: &[u8]) {
    let fill = |bytes: &[u8], pairs: &[(&str, String)]| -> Vec<u8> {
        let mut text = String::from_utf8_lossy(bytes).into_owned();
        for (from, to) in pairs {
            text = text.replace(from, to);
        }
        text.into_bytes()
    };
    let layer_digest = sha256(layer);
    let config = fill(config, &[(DIFF_ID, layer_digest.clone())]);
    let manifest = fill(
        manifest,
        &[
            (CONFIG_SIZE, config.len().to_string()),
            (CONFIG_DIGEST, sha256(&config)),
            (LAYER_SIZE, layer.len().to_string()),
            (LAYER_DIGEST, layer_digest),
        ],
    );
    let index = fill(
        index,
        &[
            (MANIFEST_SIZE, manifest.len().to_string()),
            (MANIFEST_DIGEST, sha256(&manifest)),
        ],
    );
    let blobs = root.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for blob in [&config, &manifest, &layer.to_vec()] {
        let name = sha256(blob);
        std::fs::write(blobs.join(name.trim_start_matches("sha256:")), blob).unwrap();
    }
    std::fs::write(
        root.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    std::fs::write(root.join("index.json"), index).unwrap();
}

/// The recipe every fuzzed base is built on, resolved once.
fn base_recipe() -> &'static (LoadedRecipe, Resolved) {
    static RECIPE: OnceLock<(LoadedRecipe, Resolved)> = OnceLock::new();
    RECIPE.get_or_init(|| {
        let doc = Document::from_text(
            "fuzz.yaml",
            "name: fuzz\nbase: ubuntu:24.04\npytorch: '2.9'\n",
        );
        let loaded = LoadedRecipe::parse(doc).expect("the fuzz recipe parses");
        let resolved = resolve_recipe(&loaded, &Options::default()).expect("it resolves");
        (loaded, resolved)
    })
}

/// A stand-in for the probe binary every build copies into the image.
fn probe_file() -> PathBuf {
    static PROBE: OnceLock<PathBuf> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let path =
                std::env::temp_dir().join(format!("gpubake-fuzz-probe-{}", std::process::id()));
            std::fs::write(&path, b"#!/bin/sh\n").unwrap();
            path
        })
        .clone()
}

/// Reads the image at `root` as every command does: verify, inspect, unpack (as `certify
/// --runtime` does) and a `--without-python` build on it as the base.
fn read_image(root: &Path, scratch: &Path) {
    let image = Transport::Oci {
        dir: root.to_path_buf(),
        tag: None,
    };
    let _ = gpubake::bake::inspect::verify(&image, None);
    let _ = gpubake::bake::inspect::inspect(&image, None);
    if let Ok(opened) = image.open() {
        unpack_unprivileged(&opened, &scratch.join("bundle"));
    }
    let (loaded, resolved) = base_recipe();
    let opts = BuildOptions {
        to: Transport::Oci {
            dir: scratch.join("out"),
            tag: Some("v1".into()),
        },
        from: Some(image),
        compression: gpubake::image::Compression::Gzip,
        epoch: 0,
        created: None,
        base_name: None,
        no_cache: false,
        link_blobs: false,
        closure: None,
        offline: true,
        cache_dir: scratch.join("cache"),
        stack_layers: 60,
        probe: probe_file(),
        base_packages: true,
        startup: None,
        cache_from: Vec::new(),
        cache_to: None,
    };
    let _ = gpubake::bake::build(loaded, resolved, &opts);
}

/// Unpacks with the effective user `nobody`: an unpacker bug that wrote through a link would
/// then fail on the host's files instead of changing them. The check that nothing lands
/// outside the bundle's directory catches it either way.
fn unpack_unprivileged(image: &Image, bundle: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let parent = bundle.parent().unwrap();
    let fence = parent.join("fence");
    std::fs::create_dir_all(&fence).unwrap();
    std::fs::create_dir_all(bundle).unwrap();
    for dir in [parent, &fence, bundle] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        assert_eq!(unsafe { libc::seteuid(65534) }, 0, "seteuid(nobody)");
    }
    let _ = gpubake::image::unpack::unpack(image, &bundle.join("rootfs"));
    if root {
        assert_eq!(unsafe { libc::seteuid(0) }, 0, "seteuid(root)");
    }
    let outside: Vec<_> = std::fs::read_dir(&fence).unwrap().flatten().collect();
    assert!(
        outside.is_empty(),
        "the unpacker wrote beside the bundle: {outside:?}"
    );
}

/// An image in an OCI layout: the input is the index, the manifest and the config, separated
/// by NUL bytes, with the placeholders above for digests and sizes; the layer is fixed.
pub fn oci_image(data: &[u8]) {
    let mut parts = data.splitn(3, |b| *b == 0);
    let (Some(index), Some(manifest), Some(config)) = (parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    let dir = scratch();
    let root = dir.path().join("image");
    write_layout(&root, index, manifest, config, sample_layer());
    read_image(&root, dir.path());
}

/// A layer's tar stream (whiteouts, links, long names, PAX headers), in an image otherwise
/// well formed: scanned by verify and build, listed by inspect, applied by the unpacker.
pub fn layer_tar(data: &[u8]) {
    let dir = scratch();
    let root = dir.path().join("image");
    // Under a well-formed first layer, so whiteouts and links have something to act on.
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["{}","{}"]}}}}"#,
        sha256(sample_layer()),
        sha256(data)
    );
    let layout = Layout::create(&root).unwrap();
    let (lower, lower_size) = layout.write_blob(sample_layer()).unwrap();
    let (upper, upper_size) = layout.write_blob(data).unwrap();
    let (cfg, cfg_size) = layout.write_blob(config.as_bytes()).unwrap();
    let layer = "application/vnd.oci.image.layer.v1.tar";
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{cfg}","size":{cfg_size}}},"layers":[{{"mediaType":"{layer}","digest":"{lower}","size":{lower_size}}},{{"mediaType":"{layer}","digest":"{upper}","size":{upper_size}}}]}}"#
    );
    let (m, m_size) = layout.write_blob(manifest.as_bytes()).unwrap();
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{m}","size":{m_size},"annotations":{{"{REF_NAME}":"latest"}}}}]}}"#
    );
    std::fs::write(root.join("index.json"), index).unwrap();
    read_image(&root, dir.path());
}

/// A `docker save` archive, read as `--from docker-archive:` reads it, then verified.
pub fn docker_archive(data: &[u8]) {
    let dir = scratch();
    let path = dir.path().join("image.tar");
    std::fs::write(&path, data).unwrap();
    let staging = Layout::create(&dir.path().join("staging")).unwrap();
    let Ok((desc, _)) = gpubake::image::archive::read(&path, None, &staging) else {
        return;
    };
    let Ok(opened) = Image::in_layout(staging, &desc, &Platform::host(), None) else {
        return;
    };
    let image = Transport::DockerArchive {
        path: path.clone(),
        reference: None,
    };
    let _ = gpubake::bake::inspect::verify_image(&opened, &image);
    unpack_unprivileged(&opened, &dir.path().join("bundle"));
}

/// A wheel: its zip, WHEEL, METADATA, RECORD and entry points planned into layer entries,
/// then streamed into a tar, which checks every member against RECORD.
pub fn wheel(data: &[u8]) {
    let dir = scratch();
    let path = dir.path().join("fuzz-1.0-py3-none-any.whl");
    std::fs::write(&path, data).unwrap();
    let scheme = gpubake::wheel::install::Scheme::venv("/opt/gpubake/venv", "3.11");
    let Ok(installed) = gpubake::wheel::install::install(&path, &scheme, "gpubake") else {
        return;
    };
    let _ = gpubake::image::layer::write_tar(&installed.entries, 0, std::io::sink(), &path);
}

/// What a registry holds beside an image, which gpubake believes only once verified: a
/// Sigstore bundle (its envelope against a key, its statement, a certificate in it), a
/// simple-signing payload and an in-toto statement. And any JSON, made the predicate of a
/// statement and signed, verifies and reads back as that statement.
pub fn signed(data: &[u8]) {
    use gpubake::sign::bundle::Bundle;
    use gpubake::sign::keys::PrivateKey;
    use gpubake::sign::statement::{Descriptor, Statement};
    static KEY: OnceLock<PrivateKey> = OnceLock::new();
    let key = KEY.get_or_init(PrivateKey::generate);
    let public = key.public();
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)));
    if let Ok(bundle) = Bundle::from_slice(data) {
        let _ = bundle.verify(&public);
    }
    let _ = gpubake::certify::judge_bundle(data, &public, &digest, &Default::default());
    let _ = gpubake::image::signature::judge_payload(
        data,
        &digest.parse().expect("a sha256 digest"),
        "127.0.0.1:5000/fuzz/app",
    );
    if let Ok(statement) = Statement::from_slice(data) {
        let _ = statement.about(&digest);
    }
    if let Ok(predicate) = serde_json::from_slice::<serde_json::Value>(data) {
        let made = Statement::new(
            vec![Descriptor::of("fuzz", &digest)],
            gpubake::certify::CERTIFICATE_PREDICATE,
            predicate,
        );
        let bytes = serde_json::to_vec(&Bundle::sign(&made, key)).expect("bundles serialize");
        let back = Bundle::from_slice(&bytes)
            .and_then(|b| b.verify(&public))
            .unwrap_or_else(|e| panic!("a bundle gpubake signed does not verify: {e}"));
        assert_eq!(back, made, "a signed statement changes on reading back");
    }
}

/// A key file in any form `--key` reads (cosign's and skopeo's encrypted private keys with
/// an empty passphrase, PKCS#8, SEC1, public keys): what is read writes out as a public key
/// that reads back as the same key.
pub fn key(data: &[u8]) {
    use gpubake::sign::keys::{PrivateKey, PublicKey};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let public = match PrivateKey::from_pem(text, b"") {
        Ok(private) => Some(private.public()),
        Err(_) => PublicKey::from_pem(text).ok(),
    };
    if let Some(public) = public {
        let again = PublicKey::from_pem(&public.to_pem())
            .unwrap_or_else(|e| panic!("a public key gpubake wrote does not read back: {e}"));
        assert_eq!(again.hint(), public.hint());
    }
}
