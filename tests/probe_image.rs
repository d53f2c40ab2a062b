//! The probe image (`pytorch: none`): examples/probe-image.yaml built on the smallest glibc
//! base (scripts/make-glibc-base: Debian's libc6 and libgcc-s1, made here with mmdebstrap)
//! stays under 50 MB, is valid OCI to skopeo and umoci, holds the probe and no lock, and under
//! the Docker Engine starts `gpubake probe`, which finds no GPU on this machine and says so
//! with exit 3 rather than failing to start.

mod common;

use common::{assert_exit, gpubake, run, stderr, stdout};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The bound the image is held to, compressed (what a node pulls and a registry stores) and
/// uncompressed (what the node unpacks).
const BOUND: u64 = 50_000_000;

/// True when the tools these tests need run (in CI their absence fails the test).
fn tools() -> bool {
    common::have("mmdebstrap", "--version")
        && common::have("umoci", "--version")
        && common::have("skopeo", "--version")
        && common::have("strip", "--version")
}

/// scripts/make-glibc-base's layout, made once per run of this test binary.
fn glibc_base() -> String {
    static BASE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let layout = BASE.get_or_init(|| {
        let layout = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("glibc-base");
        if !layout.join("index.json").exists() {
            let staging = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
            let tmp = staging.path().join("layout");
            run(Command::new(common::root().join("scripts/make-glibc-base")).arg(&tmp));
            // Another run may have made it meanwhile; either copy is fine.
            let _ = std::fs::rename(&tmp, &layout);
        }
        layout
    });
    format!("oci:{}:bookworm", layout.display())
}

/// This build's gpubake without its symbols and debug info, as the probe: the debug build
/// is hundreds of MB of debug info, where a fleet ships a release build (22 MB stripped).
fn stripped_probe(dir: &Path) -> String {
    let path = dir.join("gpubake");
    run(Command::new("strip")
        .arg("-o")
        .arg(&path)
        .arg(env!("CARGO_BIN_EXE_gpubake")));
    format!("linux/amd64={}", path.display())
}

/// Builds `recipe` on the glibc base into `to` with the stripped probe; returns the report.
fn build(recipe: &str, to: &str, probe: &str) -> Value {
    let base = glibc_base();
    let out = gpubake(&[
        "build",
        recipe,
        "--from",
        &base,
        "--to",
        to,
        "--probe-binary",
        probe,
        "--json",
    ]);
    assert_exit(&out, 0);
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

/// Each layer of the layout's image `tag`: its compressed size and its size as a tar.
fn layer_sizes(layout: &Path, tag: &str) -> Vec<(u64, u64)> {
    let manifest: Value = serde_json::from_str(&run(Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(format!("oci:{}:{tag}", layout.display()))))
    .unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let digest = l["digest"].as_str().unwrap().trim_start_matches("sha256:");
            let blob = std::fs::File::open(layout.join("blobs/sha256").join(digest)).unwrap();
            // Every member: a layer compressed in parallel is several gzip members end to end.
            let mut tar = flate2::read::MultiGzDecoder::new(blob);
            let unpacked = std::io::copy(&mut tar, &mut std::io::sink()).unwrap();
            (l["size"].as_u64().unwrap(), unpacked)
        })
        .collect()
}

#[test]
fn the_probe_image_is_under_50_mb_valid_oci_and_holds_the_probe_but_no_lock() {
    if !tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let probe = stripped_probe(dir.path());
    let recipe = common::root().join("examples/probe-image.yaml");
    let recipe = recipe.to_str().unwrap();
    let layout = dir.path().join("out");
    let to = format!("oci:{}:v1", layout.display());
    let report = build(recipe, &to, &probe);
    let names: Vec<&str> = report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["base", "probe"], "{report}");

    let sizes = layer_sizes(&layout, "v1");
    let compressed: u64 = sizes.iter().map(|s| s.0).sum();
    let uncompressed: u64 = sizes.iter().map(|s| s.1).sum();
    eprintln!("probe image: {compressed} bytes compressed, {uncompressed} uncompressed");
    assert!(compressed < BOUND, "{compressed} bytes compressed");
    assert!(uncompressed < BOUND, "{uncompressed} bytes uncompressed");

    // skopeo reads it as the image it is: what runs, what it says of itself, and no
    // requirement that would keep the toolkit from starting it on a node with an old driver.
    let config: Value = serde_json::from_str(&run(Command::new("skopeo")
        .args(["inspect", "--config"])
        .arg(&to)))
    .unwrap();
    let c = &config["config"];
    assert_eq!(
        c["Entrypoint"],
        serde_json::json!(["/usr/local/bin/gpubake"])
    );
    assert_eq!(c["Cmd"], serde_json::json!(["probe", "--level", "1"]));
    assert_eq!(c["Labels"]["io.gpubake.version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(c["Labels"]["io.gpubake.kind"], "probe");
    assert_eq!(c["Labels"]["io.gpubake.python-stack"], "none");
    assert_eq!(c["Labels"]["org.opencontainers.image.title"], "gpu-probe");
    assert!(c["Labels"].get("io.gpubake.torch").is_none(), "{config}");
    let env: Vec<&str> = c["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=all"), "{env:?}");
    assert!(
        env.contains(&"NVIDIA_DRIVER_CAPABILITIES=compute,utility"),
        "{env:?}"
    );
    assert!(
        !env.iter().any(|e| e.starts_with("NVIDIA_REQUIRE_CUDA=")),
        "{env:?}"
    );

    // umoci unpacks it: the probe where every gpubake image has it, and nothing of a lock.
    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:v1", layout.display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    assert_eq!(common::mode(&rootfs.join("usr/local/bin/gpubake")), 0o755);
    assert!(rootfs.join("lib/x86_64-linux-gnu/libc.so.6").exists());
    assert!(!rootfs.join("etc/gpubake").exists());
    assert!(!rootfs.join("etc/nccl.conf").exists());
    assert!(!rootfs.join("opt/gpubake").exists());

    let verify = gpubake(&["verify", &to]);
    assert_exit(&verify, 0);
    assert!(
        stdout(&verify).contains("a probe image"),
        "{}",
        stdout(&verify)
    );
    // The same recipe and base give the same image.
    let again = build(recipe, &format!("oci:{}:v2", layout.display()), &probe);
    assert_eq!(again["manifest"], report["manifest"]);
}

#[test]
fn a_probe_recipes_presets_go_to_the_config_and_nccl_conf_without_a_lock() {
    if !tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let probe = stripped_probe(dir.path());
    let recipe = common::write(
        dir.path(),
        "probe.yaml",
        "name: probe-nvlink\nbase: debian:bookworm\npytorch: none\npresets: [base, nvlink]\n\
         env: {NCCL_DEBUG: INFO}\n",
    );
    let layout = dir.path().join("out");
    let to = format!("oci:{}:v1", layout.display());
    let report = build(&recipe, &to, &probe);
    let last = report["layers"].as_array().unwrap().last().unwrap();
    assert_eq!(last["name"], "presets", "{report}");
    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:v1", layout.display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    let conf = std::fs::read_to_string(rootfs.join("etc/nccl.conf")).unwrap();
    assert!(conf.contains("NCCL_P2P_LEVEL=NVL\n"), "{conf}");
    assert!(conf.contains("NCCL_DEBUG=INFO\n"), "{conf}");
    assert!(!rootfs.join("etc/gpubake/lock.yaml").exists());
    let inspect: Value =
        serde_json::from_str(&run(Command::new("skopeo").arg("inspect").arg(&to))).unwrap();
    assert!(
        inspect["Env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "NCCL_P2P_LEVEL=NVL"),
        "{inspect}"
    );
}

#[test]
fn the_probe_image_runs_gpubake_probe_under_docker_and_reports_no_gpu() {
    if !tools() || !common::have("docker", "info") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let probe = stripped_probe(dir.path());
    let recipe = common::root().join("examples/probe-image.yaml");
    let archive = dir.path().join("probe.tar");
    let tag = format!("gpubake-probe-image-test:{}", std::process::id());
    build(
        recipe.to_str().unwrap(),
        &format!("docker-archive:{}:{tag}", archive.display()),
        &probe,
    );
    run(Command::new("docker").arg("load").arg("-i").arg(&archive));
    // Level 1, the node's checks alone, as the image's own command runs them.
    let args = [
        "run",
        "--rm",
        tag.as_str(),
        "probe",
        "--json",
        "--level",
        "1",
    ];
    let out = Command::new("docker").args(args).output().unwrap();
    let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
    // Exit 3 is the probe's own "no GPU visible": it started, ran and judged the node.
    assert_eq!(
        out.status.code(),
        Some(3),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    let report: Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{e}: the probe printed no JSON report:\n{}", stdout(&out)));
    let text = report.to_string();
    let no_gpu = regex::Regex::new(r"(?i)no (NVIDIA )?GPU").unwrap();
    assert!(no_gpu.is_match(&text), "{text}");
}

#[test]
fn what_needs_a_lock_is_refused_for_a_probe_recipe_at_its_pytorch_field() {
    let recipe = "examples/probe-image.yaml";
    let out = gpubake(&["resolve", recipe]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("probe-image.yaml:11:10: field `pytorch`"),
        "{err}"
    );
    assert!(err.contains("nothing to pin"), "{err}");
    for flag in [["--lock-out", "lock.yaml"], ["--sbom", "x.spdx.json"]] {
        let out = gpubake(&["build", recipe, "--to", "oci:./never:v1", flag[0], flag[1]]);
        assert_exit(&out, 2);
        let err = stderr(&out);
        assert!(
            err.contains(&format!("{} reads or writes what a lock pins", flag[0])),
            "{err}"
        );
    }
    assert!(!common::root().join("never").exists());
    // Its presets are linted as any recipe's, against NCCL's table alone.
    let out = gpubake(&["lint", recipe]);
    assert_exit(&out, 0);
}
