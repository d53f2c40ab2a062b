//! The build pipeline is the library's: `bake::pipeline::run` builds a preflight image on the
//! busybox base with no command line, and the image is the one `gpubake build` gives for the
//! same recipe, base and probe, manifest for manifest.

mod common;

use gpubake::bake::pipeline::{self, Built};
use gpubake::bake::request::Request;
use gpubake::image::registry::Access;
use gpubake::recipe::LoadedRecipe;
use std::path::{Path, PathBuf};

/// A request for a preflight image of `recipe` on the busybox base, into `to`, with the
/// gpubake binary the command runs as its probe (the command puts itself there).
fn request(recipe: &Path, to: String) -> Request {
    Request {
        recipe: LoadedRecipe::read(recipe).unwrap(),
        recipe_file: Some(recipe.to_path_buf()),
        to,
        from: Some(common::from_base()),
        access: Access::default(),
        platform: None,
        base_name: None,
        compression: gpubake::image::Compression::Gzip,
        startup_record: None,
        no_cache: false,
        link_blobs: false,
        cache_from: Vec::new(),
        cache_to: None,
        pylock: None,
        offline: false,
        lock: None,
        lock_out: None,
        without_python: true,
        stack_layers: 60,
        skip_checks: false,
        engine_build: None,
        driver: None,
        preset_dirs: Vec::new(),
        sbom: None,
        probe_binaries: Vec::new(),
        probe: PathBuf::from(env!("CARGO_BIN_EXE_gpubake")),
        key: None,
        provenance: None,
        resolve_command: None,
        began: std::time::Instant::now(),
    }
}

/// The manifest digest a layout's index names for `tag`.
fn tagged(layout: &Path, tag: &str) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    let entry = manifests
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap_or_else(|| panic!("no {tag} in {index}"));
    entry["digest"].as_str().unwrap().to_string()
}

#[test]
fn the_library_alone_builds_the_image_the_command_builds() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        &common::recipe("pytorch: '2.9'\npresets: [base, nvlink]\n"),
    );
    let library = dir.path().join("library");
    let to = format!("oci:{}:v1", library.display());
    let Built::Image(report) = pipeline::run(&request(Path::new(&recipe), to)).unwrap() else {
        panic!("a daemonless build reports an image");
    };
    assert_eq!(report.manifest.to_string(), tagged(&library, "v1"));
    assert!(report.layers.iter().any(|l| l.name == "probe"));

    let command = dir.path().join("command");
    let to = format!("oci:{}:v1", command.display());
    // In the test's own directory, as the library ran: presets are looked up there first.
    let built = common::build_json_in(&common::root(), &recipe, &to, &[]);
    assert_eq!(built["manifest"], report.manifest.to_string());
    assert_eq!(tagged(&command, "v1"), tagged(&library, "v1"));
    // Both layouts hold every blob their manifests name, as skopeo reads them.
    for layout in [&library, &command] {
        common::run(
            std::process::Command::new("skopeo")
                .arg("inspect")
                .arg(format!("oci:{}:v1", layout.display())),
        );
    }
}
