//! Helpers for the tests that build the Python stack through the library or hand the Debian
//! base to the Docker Engine.

use gpubake::bake::BuildOptions;
use gpubake::closure::Closure;
use gpubake::image::Compression;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheel cache the tests share, kept in the target directory between runs.
pub fn wheel_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-wheel-cache")
}

/// The options of a stack build from `from` into `to` (transports as written), with the
/// shared wheel cache, gzip, files dated 0, the image dated by its inputs and the tested
/// binary as the probe.
pub fn build_options(from: &str, to: &str, closure: Option<Closure>) -> BuildOptions {
    BuildOptions {
        startup: None,
        to: to.parse().unwrap(),
        from: Some(from.parse().unwrap()),
        compression: Compression::Gzip,
        epoch: 0,
        created: None,
        base_name: None,
        no_cache: false,
        link_blobs: false,
        closure,
        offline: false,
        cache_dir: wheel_cache(),
        stack_layers: 60,
        probe: PathBuf::from(env!("CARGO_BIN_EXE_gpubake")),
        base_packages: false,
        cache_from: Vec::new(),
        cache_to: None,
    }
}

/// Copies the OCI layout `base` (tag `bookworm`) into the Docker Engine as `tag`, so a
/// build or a container can start from it; fails the test with skopeo's words.
pub fn base_into_engine(base: &Path, tag: &str) {
    let out = Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            &format!("oci:{}:bookworm", base.display()),
        ])
        .arg(format!("docker-daemon:{tag}"))
        .output()
        .expect("skopeo runs");
    assert!(
        out.status.success(),
        "skopeo copy into the engine as {tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The recipe `text`, read as the file `path` names (which need not exist), and its
/// resolution with the default options.
pub fn resolve_text(
    path: &Path,
    text: &str,
) -> (gpubake::recipe::LoadedRecipe, gpubake::resolve::Resolved) {
    let loaded = gpubake::recipe::LoadedRecipe::parse(gpubake::document::Document::from_text(
        path.display().to_string(),
        text.to_string(),
    ))
    .unwrap();
    let resolved =
        gpubake::resolve::resolve_recipe(&loaded, &gpubake::resolve::Options::default()).unwrap();
    (loaded, resolved)
}
