//! Daemonless builds checked by independent tools: skopeo, umoci and the Docker engine read
//! what gpubake writes. The base image is made here with umoci from busybox-static and the
//! host's libc (enough to run the gpubake probe inside it), and cached between runs.

mod common;

use common::{assert_exit, build_args, from_base, gpubake, gpubake_in, run, stderr, stdout, write};
use gpubake::image::Transport;
use gpubake::image::digest::Digest;
use gpubake::image::layout::{Layout, REF_NAME, descriptor};
use oci_spec::image::{ImageManifestBuilder, MediaType};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A recipe file in `dir`, with extra YAML lines.
fn recipe_in(dir: &Path, extra: &str) -> String {
    write(
        dir,
        "recipe.yaml",
        &format!(
            "name: imgtest\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base, nvlink]\n{extra}"
        ),
    )
}

/// Builds `recipe` on the busybox base and returns the JSON report.
fn build(recipe: &str, to: &str, extra: &[&str]) -> Value {
    common::build_json_in(&common::root(), recipe, to, extra)
}

/// [`build`] with the gpubake cache at `cache`: for tests that count what a build writes,
/// which layers from other builds in a shared cache would make reused.
fn build_cached_in(cache: &Path, recipe: &str, to: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(build_args(recipe, &from_base(), to, &["--json"]))
        .env("GPUBAKE_CACHE_DIR", cache)
        .current_dir(common::root())
        .output()
        .unwrap();
    assert_exit(&out, 0);
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn oci(dir: &Path, tag: &str) -> String {
    format!("oci:{}:{tag}", dir.display())
}

#[test]
fn skopeo_umoci_and_docker_read_the_image() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let out = dir.path().join("out");
    let report = build(&recipe, &oci(&out, "v1"), &[]);
    assert_eq!(report["layers"].as_array().unwrap().len(), 3, "{report}");

    let inspect: Value = serde_json::from_str(&run(Command::new("skopeo")
        .arg("inspect")
        .arg(oci(&out, "v1"))))
    .unwrap();
    assert_eq!(inspect["Digest"], report["manifest"]);
    assert_eq!(inspect["Labels"]["io.gpubake.torch"], "2.9.1+cu128");
    assert_eq!(inspect["Labels"]["io.gpubake.nccl"], "2.27.5");
    assert!(
        inspect["Env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "NCCL_P2P_LEVEL=NVL"),
        "{inspect}"
    );
    assert!(
        inspect["Env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "NVIDIA_REQUIRE_CUDA=cuda>=12.0,driver>=525.60.13"),
        "{inspect}"
    );

    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(oci(&out, "v1").trim_start_matches("oci:"))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    let conf = std::fs::read_to_string(rootfs.join("etc/nccl.conf")).unwrap();
    assert_eq!(
        conf,
        "NCCL_CUMEM_ENABLE=1\nNCCL_DEBUG=WARN\nNCCL_P2P_LEVEL=NVL\nNCCL_SOCKET_IFNAME=^docker,lo,veth\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(rootfs.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("usr/local/bin/gpubake"), 0o755);
    assert_eq!(mode("etc/nccl.conf"), 0o644);
    assert_eq!(mode("etc/gpubake"), 0o755);
    let lock = std::fs::read_to_string(rootfs.join("etc/gpubake/lock.yaml")).unwrap();
    assert!(lock.contains("requirement: torch==2.9.1+cu128"), "{lock}");
    assert!(
        rootfs.join("bin/busybox").exists(),
        "the base layer is there too"
    );

    let archive = dir.path().join("copy.tar");
    run(Command::new("skopeo")
        .arg("copy")
        .arg(oci(&out, "v1"))
        .arg(format!(
            "docker-archive:{}:skopeo/copy:v1",
            archive.display()
        )));
    let v = gpubake(&["verify", &format!("docker-archive:{}", archive.display())]);
    assert_exit(&v, 0);

    if !common::have("docker", "info") {
        return;
    }
    let tar = dir.path().join("image.tar");
    let tag = format!("gpubake-image-test:{}", std::process::id());
    build(
        &recipe,
        &format!("docker-archive:{}:{tag}", tar.display()),
        &[],
    );
    run(Command::new("docker").arg("load").arg("-i").arg(&tar));
    let cat = run(Command::new("docker").args(["run", "--rm", &tag, "cat", "/etc/nccl.conf"]));
    let version = run(Command::new("docker").args(["run", "--rm", &tag, "gpubake", "--version"]));
    let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
    assert_eq!(cat, conf);
    assert!(version.starts_with("gpubake "), "{version}");
}

#[test]
fn two_builds_give_the_same_digest() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    for compression in ["gzip", "zstd", "uncompressed"] {
        let a = build(
            &recipe,
            &oci(&dir.path().join(format!("a-{compression}")), "x"),
            &["--compression", compression],
        );
        let b = build(
            &recipe,
            &oci(&dir.path().join(format!("b-{compression}")), "x"),
            &["--compression", compression],
        );
        assert_eq!(a["manifest"], b["manifest"], "{compression}");
        let media = run(Command::new("skopeo")
            .args(["inspect", "--raw"])
            .arg(oci(&dir.path().join(format!("a-{compression}")), "x")));
        let layer_type = match compression {
            "uncompressed" => "application/vnd.oci.image.layer.v1.tar\"".to_string(),
            _ => format!("tar+{compression}"),
        };
        assert!(media.contains(&layer_type), "{media}");
    }
    // An uncompressed layer's blob is its tar: its digest is its diff ID, and umoci, which
    // reads layers by their media type, unpacks the image.
    let layout = dir.path().join("a-uncompressed");
    let inspect = |what: &str| -> Value {
        serde_json::from_str(&run(Command::new("skopeo")
            .args(["inspect", what])
            .arg(oci(&layout, "x"))))
        .unwrap()
    };
    let (manifest, config) = (inspect("--raw"), inspect("--config"));
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    let plain: Vec<&Value> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["mediaType"] == "application/vnd.oci.image.layer.v1.tar")
        .collect();
    assert!(!plain.is_empty(), "{manifest}");
    for layer in plain {
        assert!(diff_ids.contains(&layer["digest"]), "{layer} {config}");
    }
    assert_exit(&gpubake(&["verify", &oci(&layout, "x")]), 0);
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:x", layout.display()))
        .arg(dir.path().join("bundle")));
    assert!(dir.path().join("bundle/rootfs/etc/nccl.conf").is_file());
    // The epoch is part of the content.
    let other = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(build_args(
            &recipe,
            &from_base(),
            &oci(&dir.path().join("c"), "x"),
            &["--json"],
        ))
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .unwrap();
    assert_exit(&other, 0);
    let c: Value = serde_json::from_slice(&other.stdout).unwrap();
    let a = build(&recipe, &oci(&dir.path().join("a-gzip"), "x"), &[]);
    assert_ne!(a["manifest"], c["manifest"]);
}

/// Without a terminal a long step prints lines saying how far it is (every
/// GPUBAKE_PROGRESS_SECONDS, here at every update), and the last one at the end.
#[test]
fn long_steps_print_progress_lines_without_a_terminal() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let image = oci(&dir.path().join("out"), "x");
    build(&recipe, &image, &[]);
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["inspect", "--libraries", &image])
        .env("GPUBAKE_PROGRESS_SECONDS", "0")
        .output()
        .unwrap();
    assert_exit(&out, 0);
    let err = stderr(&out);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("reading the layers: "))
        .collect();
    assert!(lines.len() >= 3, "{err}");
    assert!(lines.last().unwrap().contains("(100%)"), "{err}");
    // By default a short step prints nothing.
    let out = gpubake(&["inspect", "--libraries", &image]);
    assert!(
        !stderr(&out).contains("reading the layers"),
        "{}",
        stderr(&out)
    );
    // verify re-reads every layer; a copy into the engine streams the archive.
    let lines_of = |args: &[&str], label: &str| -> Vec<String> {
        let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(args)
            .env("GPUBAKE_PROGRESS_SECONDS", "0")
            .output()
            .unwrap();
        assert_exit(&out, 0);
        stderr(&out)
            .lines()
            .filter(|l| l.starts_with(label))
            .map(str::to_string)
            .collect()
    };
    let verified = lines_of(&["verify", &image], "verifying the layers: ");
    assert!(
        verified.last().is_some_and(|l| l.contains("(100%)")),
        "{verified:?}"
    );
    if common::have("docker", "info") {
        let tag = format!("gpubake-progress:{}", std::process::id());
        let loaded = lines_of(
            &["copy", &image, &format!("docker-daemon:{tag}")],
            "loading into the engine: ",
        );
        let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
        assert!(!loaded.is_empty() && loaded[0].contains("MB"), "{loaded:?}");
    }
}

/// The image's date and its base's name as an image tool shows them: `created` is the newest
/// date of the inputs (here the base's own), or SOURCE_DATE_EPOCH; a base read from a layout
/// is named only when `--base-name` says what registry image it is a copy of.
#[test]
fn the_image_is_dated_by_its_inputs_and_names_the_base_it_is_told() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let config_of = |image: &str| -> Value {
        serde_json::from_str(&run(
            Command::new("skopeo").args(["inspect", "--config", "--raw", image])
        ))
        .unwrap()
    };
    let annotations_of = |image: &str| -> Value {
        serde_json::from_str::<Value>(&run(
            Command::new("skopeo").args(["inspect", "--raw", image])
        ))
        .unwrap()["annotations"]
            .clone()
    };
    let base_created = config_of(&from_base())["created"]
        .as_str()
        .expect("umoci dates the base")
        .to_string();
    assert!(!base_created.starts_with("1970"), "{base_created}");
    const NAME: &str = "org.opencontainers.image.base.name";

    let plain = oci(&dir.path().join("plain"), "x");
    let report = build(&recipe, &plain, &[]);
    let config = config_of(&plain);
    assert_eq!(
        gpubake::units::parse_rfc3339(config["created"].as_str().unwrap()),
        gpubake::units::parse_rfc3339(&base_created),
        "{config}"
    );
    assert_eq!(report["created"], config["created"], "{report}");
    assert!(config["config"]["Labels"].get(NAME).is_none(), "{config}");
    assert!(annotations_of(&plain).get(NAME).is_none());

    let named = oci(&dir.path().join("named"), "x");
    build(
        &recipe,
        &named,
        &["--base-name", "docker.io/library/busybox:1.36"],
    );
    let config = config_of(&named);
    assert_eq!(
        config["config"]["Labels"][NAME], "docker.io/library/busybox:1.36",
        "{config}"
    );
    assert_eq!(
        annotations_of(&named)[NAME],
        "docker.io/library/busybox:1.36"
    );
    // A name that is no image reference, or a transport, is refused before any work.
    for bad in ["", "Not A Ref", "docker://busybox:1.36", "oci:./base"] {
        let out = gpubake(&build_args(
            &recipe,
            &from_base(),
            &oci(&dir.path().join("refused"), "x"),
            &["--base-name", bad],
        ));
        assert_exit(&out, 2);
        assert!(stderr(&out).contains("--base-name"), "{}", stderr(&out));
        assert!(!dir.path().join("refused").exists());
    }
    // The lock the image carries says what its config says: verify holds the labels to it.
    let verified = gpubake(&["verify", &named]);
    assert_exit(&verified, 0);
    let unpacked = dir.path().join("unpacked");
    run(Command::new("umoci")
        .args(["raw", "unpack", "--rootless", "--image"])
        .arg(format!("{}:x", dir.path().join("named").display()))
        .arg(&unpacked));
    let lock = std::fs::read_to_string(unpacked.join("etc/gpubake/lock.yaml")).unwrap();
    assert!(lock.contains("docker.io/library/busybox:1.36"), "{lock}");

    let dated = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(build_args(
            &recipe,
            &from_base(),
            &oci(&dir.path().join("dated"), "x"),
            &[],
        ))
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .unwrap();
    assert_exit(&dated, 0);
    let config = config_of(&oci(&dir.path().join("dated"), "x"));
    assert_eq!(config["created"], "2023-11-14T22:13:20Z", "{config}");
}

#[test]
fn a_preset_change_rewrites_only_the_small_layers() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::write(data.join("train.py"), "print('hi')\n").unwrap();
    std::fs::write(data.join("sub/weights.bin"), vec![7u8; 1 << 20]).unwrap();
    let files = "files:\n  - {src: data, dest: /workspace}\n";
    let recipe = recipe_in(dir.path(), files);
    let out = oci(&dir.path().join("out"), "v1");
    let cache = dir.path().join("cache");
    let first = build_cached_in(&cache, &recipe, &out);
    let names: Vec<&str> = first["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["base", "files", "probe", "presets"]);

    recipe_in(dir.path(), &format!("{files}env:\n  NCCL_DEBUG: INFO\n"));
    let second = build_cached_in(&cache, &recipe, &out);
    let layers = second["layers"].as_array().unwrap();
    for (i, name) in ["base", "files", "probe"].iter().enumerate() {
        assert_eq!(
            layers[i]["reused"], true,
            "{name} layer was rewritten: {second}"
        );
        assert_eq!(layers[i]["digest"], first["layers"][i]["digest"]);
    }
    assert_eq!(layers[3]["reused"], false);
    assert_ne!(layers[3]["digest"], first["layers"][3]["digest"]);
    assert_ne!(second["manifest"], first["manifest"]);

    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(out.trim_start_matches("oci:"))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    assert_eq!(
        std::fs::read(rootfs.join("workspace/sub/weights.bin"))
            .unwrap()
            .len(),
        1 << 20
    );
    assert!(
        std::fs::read_to_string(rootfs.join("etc/nccl.conf"))
            .unwrap()
            .contains("NCCL_DEBUG=INFO")
    );
    assert_exit(&gpubake(&["verify", &out]), 0);
}

/// Flips one byte of `blob` in this layout's file: a new file replaces it, so the layouts and
/// the cache that share the blob's inode (`--link-blobs`) keep theirs.
fn flip(layout: &Path, digest: &str) {
    let path = layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    let mut bytes = std::fs::read(&path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x40;
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn verify_names_a_tampered_blob() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let layout = dir.path().join("out");
    let report = build(&recipe, &oci(&layout, "v1"), &[]);
    assert_exit(&gpubake(&["verify", &oci(&layout, "v1")]), 0);
    for i in 0..3 {
        let copy = dir.path().join(format!("copy{i}"));
        run(Command::new("cp").arg("-r").arg(&layout).arg(&copy));
        let digest = report["layers"][i]["digest"].as_str().unwrap();
        flip(&copy, digest);
        let out = gpubake(&["verify", &oci(&copy, "v1")]);
        assert_exit(&out, 1);
        let text = stdout(&out);
        assert!(
            text.contains(&format!("FAIL layer {}", i + 1)) && text.contains(digest),
            "{text}"
        );
    }
    let copy = dir.path().join("copy-config");
    run(Command::new("cp").arg("-r").arg(&layout).arg(&copy));
    flip(&copy, report["config"].as_str().unwrap());
    let out = gpubake(&["verify", &oci(&copy, "v1")]);
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains(report["config"].as_str().unwrap()),
        "{}",
        stdout(&out)
    );
}

/// `--compression estargz`: the layers gpubake writes carry the TOC's digest and the inflated
/// size; umoci unpacks them as gzip (the landmark and the TOC become files); verify reads each
/// TOC back and fails a layer whose descriptor names another.
#[test]
fn an_estargz_image_unpacks_as_gzip_and_verify_checks_its_tocs() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let layout = dir.path().join("out");
    let report = build(&recipe, &oci(&layout, "v1"), &["--compression", "estargz"]);
    let raw: Value = serde_json::from_str(&run(Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(oci(&layout, "v1"))))
    .unwrap();
    let layers = raw["layers"].as_array().unwrap();
    // The base's layer is rewritten as eStargz too: a lazily pulling containerd fetches every
    // layer above the first one it cannot mount.
    for layer in layers {
        let a = &layer["annotations"];
        assert!(
            a["containerd.io/snapshot/stargz/toc.digest"]
                .as_str()
                .is_some_and(|d| d.starts_with("sha256:")),
            "{raw}"
        );
        assert!(
            a["io.containers.estargz.uncompressed-size"]
                .as_str()
                .is_some()
        );
        assert_eq!(
            layer["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
    }
    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:v1", layout.display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    assert!(rootfs.join("etc/nccl.conf").exists());
    assert_eq!(
        std::fs::read(rootfs.join(".no.prefetch.landmark")).unwrap(),
        [0xf]
    );
    let verified = gpubake(&["verify", &oci(&layout, "v1")]);
    assert_exit(&verified, 0);
    let text = stdout(&verified);
    for i in 1..=3 {
        assert!(text.contains(&format!("ok   layer {i} TOC")), "{text}");
    }
    // The base's gzip blob is not left in the layout beside its eStargz form.
    let base_layer = report["layers"][0]["digest"].as_str().unwrap();
    let base_tar = common::base().join("index.json");
    assert!(base_tar.exists());
    let blobs: Vec<String> = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| format!("sha256:{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert!(blobs.contains(&base_layer.to_string()), "{blobs:?}");
    let source_layers: Value = serde_json::from_str(&run(Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(common::from_base())))
    .unwrap();
    let source = source_layers["layers"][0]["digest"].as_str().unwrap();
    assert_ne!(source, base_layer);
    assert!(!blobs.contains(&source.to_string()), "{blobs:?}");

    // The descriptor of layer 3 names another TOC: a new manifest in the index.
    let index_path = layout.join("index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let mut manifest = raw.clone();
    manifest["layers"][2]["annotations"]["containerd.io/snapshot/stargz/toc.digest"] =
        format!("sha256:{}", "0".repeat(64)).into();
    let bytes = serde_json::to_vec(&manifest).unwrap();
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    std::fs::write(layout.join("blobs/sha256").join(&digest), &bytes).unwrap();
    index["manifests"][0]["digest"] = format!("sha256:{digest}").into();
    index["manifests"][0]["size"] = bytes.len().into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let out = gpubake(&["verify", &oci(&layout, "v1")]);
    assert_exit(&out, 1);
    let text = stdout(&out);
    assert!(
        text.contains("FAIL layer 3 TOC") && text.contains("the descriptor says sha256:000"),
        "{text}"
    );
    assert_eq!(report["layers"].as_array().unwrap().len(), 3);
}

/// `--compression zstd:chunked`: every layer zstd with the TOC's annotations and the two
/// containers/storage reads; `inspect` names the compression and reads each layer's TOC for
/// its prefetch; verify reads each TOC back and fails a layer whose descriptor names another.
#[test]
fn a_zstd_chunked_image_carries_its_tocs_and_verify_checks_them() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let layout = dir.path().join("out");
    build(
        &recipe,
        &oci(&layout, "v1"),
        &["--compression", "zstd:chunked"],
    );
    let raw: Value = serde_json::from_str(&run(Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(oci(&layout, "v1"))))
    .unwrap();
    let layers = raw["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 3);
    for layer in layers {
        assert_eq!(
            layer["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
        let a = &layer["annotations"];
        for key in [
            "containerd.io/snapshot/stargz/toc.digest",
            "io.containers.estargz.uncompressed-size",
            "io.containers.zstd-chunked.manifest-checksum",
            "io.containers.zstd-chunked.manifest-position",
        ] {
            assert!(a[key].as_str().is_some(), "{key}: {raw}");
        }
    }
    let out = gpubake(&["inspect", &oci(&layout, "v1"), "--json"]);
    assert_exit(&out, 0);
    let info: Value = serde_json::from_str(&stdout(&out)).unwrap();
    for l in info["layers"].as_array().unwrap() {
        assert_eq!(l["compression"], "zstd:chunked", "{l}");
        // No record: each layer leads with the no-prefetch landmark.
        assert_eq!(l["prefetch"]["bytes"], 0, "{l}");
    }
    let verified = gpubake(&["verify", &oci(&layout, "v1")]);
    assert_exit(&verified, 0);
    let text = stdout(&verified);
    for i in 1..=3 {
        assert!(text.contains(&format!("ok   layer {i} TOC")), "{text}");
    }

    let index_path = layout.join("index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let mut manifest = raw.clone();
    manifest["layers"][1]["annotations"]["containerd.io/snapshot/stargz/toc.digest"] =
        format!("sha256:{}", "0".repeat(64)).into();
    let bytes = serde_json::to_vec(&manifest).unwrap();
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    std::fs::write(layout.join("blobs/sha256").join(&digest), &bytes).unwrap();
    index["manifests"][0]["digest"] = format!("sha256:{digest}").into();
    index["manifests"][0]["size"] = bytes.len().into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let out = gpubake(&["verify", &oci(&layout, "v1")]);
    assert_exit(&out, 1);
    let text = stdout(&out);
    assert!(
        text.contains("FAIL layer 2 TOC") && text.contains("the descriptor says sha256:000"),
        "{text}"
    );
}

#[test]
fn broken_layouts_exit_2_with_a_clear_message() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let layout = dir.path().join("out");
    let report = build(&recipe, &oci(&layout, "v1"), &[]);

    let truncated = dir.path().join("truncated");
    run(Command::new("cp").arg("-r").arg(&layout).arg(&truncated));
    let index = std::fs::read(truncated.join("index.json")).unwrap();
    std::fs::write(truncated.join("index.json"), &index[..index.len() / 2]).unwrap();
    for cmd in ["verify", "inspect"] {
        let out = gpubake(&[cmd, &oci(&truncated, "v1")]);
        assert_exit(&out, 2);
        assert!(
            stderr(&out).contains("index.json: not a valid OCI image index"),
            "{}",
            stderr(&out)
        );
    }

    let missing = dir.path().join("missing");
    run(Command::new("cp").arg("-r").arg(&layout).arg(&missing));
    // Every missing blob is named, not only the first.
    for i in [1, 2] {
        let layer = report["layers"][i]["digest"].as_str().unwrap();
        std::fs::remove_file(
            missing
                .join("blobs/sha256")
                .join(layer.trim_start_matches("sha256:")),
        )
        .unwrap();
    }
    let out = gpubake(&["verify", &oci(&missing, "v1")]);
    assert_exit(&out, 2);
    for i in [1, 2] {
        let layer = report["layers"][i]["digest"].as_str().unwrap();
        assert!(
            stderr(&out).contains(&format!("blob {layer} is missing")),
            "{}",
            stderr(&out)
        );
    }

    let out = gpubake(&["inspect", &oci(&layout, "nope")]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("no image tagged `nope`"),
        "{}",
        stderr(&out)
    );
    let out = gpubake(&[
        "inspect",
        &format!("oci:{}", dir.path().join("nothing").display()),
    ]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("not an OCI layout"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_killed_build_leaves_the_previous_image_readable() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let layout = dir.path().join("out");
    let first = build(&recipe, &oci(&layout, "v1"), &[]);

    // A second build with a large files layer, killed while it compresses.
    let data = dir.path().join("big");
    std::fs::create_dir_all(&data).unwrap();
    common::noise(&data.join("noise.bin"), 256, 0x9e3779b97f4a7c15);
    recipe_in(dir.path(), "files:\n  - {src: big, dest: /data}\n");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(build_args(&recipe, &from_base(), &oci(&layout, "v1"), &[]))
        // A cache of its own: a shared one may hold the layer from an earlier run.
        .env("GPUBAKE_CACHE_DIR", dir.path().join("cache"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the build has started writing a blob (beside index.json), then kill it.
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(20) {
        let writing = std::fs::read_dir(&layout).unwrap().any(|e| {
            let e = e.unwrap();
            e.file_name().to_string_lossy().starts_with(".gpubake-tmp-")
                && e.metadata().unwrap().len() > (1 << 20)
        });
        if writing {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the build finished before it could be killed"
    );

    let out = gpubake(&["verify", &oci(&layout, "v1")]);
    assert_exit(&out, 0);
    let inspect: Value = serde_json::from_str(&run(Command::new("skopeo")
        .arg("inspect")
        .arg(oci(&layout, "v1"))))
    .unwrap();
    assert_eq!(inspect["Digest"], first["manifest"]);
}

#[test]
fn concurrent_builds_into_one_layout_both_land() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        dir.path(),
        "a.yaml",
        "name: a\nbase: x\npytorch: '2.9'\npresets: [base]\n",
    );
    let b = write(
        dir.path(),
        "b.yaml",
        "name: b\nbase: x\npytorch: '2.8'\npresets: [pcie]\n",
    );
    let layout = dir.path().join("shared");
    let spawn = |recipe: &str, tag: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(build_args(recipe, &from_base(), &oci(&layout, tag), &[]))
            .output()
    };
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| spawn(&a, "a").unwrap());
        let hb = s.spawn(|| spawn(&b, "b").unwrap());
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_exit(&ra, 0);
    assert_exit(&rb, 0);
    for tag in ["a", "b"] {
        assert_exit(&gpubake(&["verify", &oci(&layout, tag)]), 0);
    }
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"].as_array().unwrap().len(), 2, "{index}");
}

/// Writes a one-layer image whose layer holds one entry with a raw (unchecked) path.
fn hostile_base(dir: &Path, name: &[u8], kind: tar::EntryType, link: Option<&[u8]>) -> PathBuf {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    if let Some(link) = link {
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    }
    header.set_entry_type(kind);
    header.set_size(if kind == tar::EntryType::Regular {
        4
    } else {
        0
    });
    header.set_mode(0o644);
    header.set_cksum();
    let mut layer = header.as_bytes().to_vec();
    if kind == tar::EntryType::Regular {
        layer.extend_from_slice(b"evil");
        layer.resize(1024, 0);
    }
    layer.resize(layer.len() + 1024, 0);
    let root = dir.join(String::from_utf8_lossy(name).replace(['/', '.'], "_"));
    let config = config_for(std::slice::from_ref(&layer));
    image_of(&root, &config, &[layer])
}

/// A linux/amd64 config whose diff IDs are those of the (uncompressed) `layers`.
fn config_for(layers: &[Vec<u8>]) -> Value {
    let diff_ids: Vec<String> = layers.iter().map(|l| Digest::of(l).to_string()).collect();
    serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "config": {}
    })
}

/// Writes an OCI layout at `root` whose image `latest` has `config` (any JSON, well formed
/// or not) and the uncompressed `layers`.
fn image_of(root: &Path, config: &Value, layers: &[Vec<u8>]) -> PathBuf {
    let layout = Layout::create(root).unwrap();
    let layers = layers
        .iter()
        .map(|l| {
            let (digest, size) = layout.write_blob(l).unwrap();
            descriptor(MediaType::ImageLayer, &digest, size)
        })
        .collect::<Vec<_>>();
    let config_desc = layout.write_json(config, MediaType::ImageConfig).unwrap();
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config_desc)
        .layers(layers)
        .build()
        .unwrap();
    let mut desc = layout
        .write_json(&manifest, MediaType::ImageManifest)
        .unwrap();
    desc.set_annotations(Some(HashMap::from([(
        REF_NAME.to_string(),
        "latest".to_string(),
    )])));
    let mut index = layout.index_or_empty().unwrap();
    index.set_manifests(vec![desc]);
    layout.write_index(&index).unwrap();
    root.to_path_buf()
}

/// An entry name, its kind, its link target and the error expected for it.
type HostileCase = (
    &'static [u8],
    tar::EntryType,
    Option<&'static [u8]>,
    &'static str,
);

#[test]
fn hostile_base_layers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "r.yaml", "name: r\nbase: x\npytorch: '2.9'\n");
    let cases: [HostileCase; 4] = [
        (
            b"../etc/passwd",
            tar::EntryType::Regular,
            None,
            "entry `../etc/passwd` escapes the root",
        ),
        (
            b"/etc/passwd",
            tar::EntryType::Regular,
            None,
            "entry `/etc/passwd` escapes the root",
        ),
        (
            b"usr/lib/link",
            tar::EntryType::Symlink,
            Some(b"../../../etc/shadow"),
            "symlink `usr/lib/link` -> `../../../etc/shadow` escapes",
        ),
        (
            b"etc/hard",
            tar::EntryType::Link,
            Some(b"../../outside"),
            "hard link `etc/hard` -> `../../outside` escapes",
        ),
    ];
    for (name, kind, link, expected) in cases {
        let base = hostile_base(dir.path(), name, kind, link);
        let out_dir = dir.path().join("out");
        let out = gpubake_in(
            dir.path(),
            &build_args(
                &recipe,
                &format!("oci:{}:latest", base.display()),
                &oci(&out_dir, "x"),
                &[],
            ),
        );
        assert_exit(&out, 2);
        assert!(
            stderr(&out).contains(expected),
            "{}: {}",
            String::from_utf8_lossy(name),
            stderr(&out)
        );
        let index = out_dir.join("index.json");
        assert!(
            !index.exists() || !std::fs::read_to_string(&index).unwrap().contains("\"x\""),
            "nothing was tagged"
        );
    }
    // An absolute symlink target is resolved inside the root by runtimes: accepted.
    let ok = hostile_base(
        dir.path(),
        b"etc/alt",
        tar::EntryType::Symlink,
        Some(b"/usr/bin/python3"),
    );
    let out = gpubake_in(
        dir.path(),
        &build_args(
            &recipe,
            &format!("oci:{}:latest", ok.display()),
            &oci(&dir.path().join("ok"), "x"),
            &[],
        ),
    );
    assert_exit(&out, 0);
}

#[test]
fn hostile_archive_members_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut header = tar::Header::new_old();
    let name = b"../../evil.json";
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.set_size(2);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let mut bytes = header.as_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    bytes.resize(512 * 4, 0);
    let archive = dir.path().join("evil.tar");
    std::fs::write(&archive, bytes).unwrap();
    let recipe = write(dir.path(), "r.yaml", "name: r\nbase: x\npytorch: '2.9'\n");
    let out = gpubake(&build_args(
        &recipe,
        &format!("docker-archive:{}", archive.display()),
        &oci(&dir.path().join("o"), "x"),
        &[],
    ));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("points outside the archive"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn unsupported_sources_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    // Without --from the recipe's base is pulled from its registry; one that does not answer
    // (nothing listens on port 1) is the environment's fault, named with the way around it.
    let recipe = write(
        dir.path(),
        "r.yaml",
        "name: r\nbase: 127.0.0.1:1/team/base:1\npytorch: '2.9'\n",
    );
    let to = oci(&dir.path().join("o"), "x");
    let out = gpubake(&["build", "--without-python", &recipe, "--to", &to]);
    assert_exit(&out, 3);
    for said in [
        "docker://127.0.0.1:1/team/base:1: the registry did not answer",
        "pass --from with a local copy (oci:DIR[:TAG]",
    ] {
        assert!(stderr(&out).contains(said), "{}", stderr(&out));
    }
    let out = gpubake(&build_args(&recipe, "docker://", &to, &[]));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("docker:// needs an image"),
        "{}",
        stderr(&out)
    );
    let out = gpubake(&build_args(&recipe, "oci:/nonexistent/layout", &to, &[]));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("oci:/nonexistent/layout")
            || stderr(&out).contains("/nonexistent/layout"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn inspect_shows_pins_presets_and_layers() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let layout = dir.path().join("out");
    build(&recipe, &oci(&layout, "v1"), &[]);
    let out = gpubake(&["inspect", &oci(&layout, "v1"), "--json"]);
    assert_exit(&out, 0);
    let info: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(info["labels"]["io.gpubake.cuda"], "12.8");
    assert_eq!(info["presets"]["NCCL_P2P_LEVEL"]["by"], "preset nvlink");
    let created: Vec<&str> = info["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["created_by"].as_str().unwrap())
        .collect();
    assert!(
        created[1].contains("probe") && created[2].contains("NCCL preset [base, nvlink]"),
        "{created:?}"
    );
    let text = stdout(&gpubake(&["inspect", &oci(&layout, "v1")]));
    assert!(
        text.contains("NCCL_P2P_LEVEL=NVL  (preset nvlink)"),
        "{text}"
    );
}

/// The layer cache knows a file by its bytes, not its path, size and mtime: a change that
/// keeps both gives a new layer, the one `--no-cache` writes too; the file as it was gives the
/// cached layer back.
#[test]
fn the_layer_cache_sees_a_change_that_keeps_size_and_mtime() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let file = dir.path().join("data/model.bin");
    std::fs::write(&file, b"AAAA").unwrap();
    let recipe = recipe_in(dir.path(), "files:\n  - {src: data, dest: /data}\n");
    let out = oci(&dir.path().join("out"), "v1");
    let first = build(&recipe, &out, &[]);
    let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
    let rewrite = |bytes: &[u8]| {
        std::fs::write(&file, bytes).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    };
    rewrite(b"BBBB");
    let changed = build(&recipe, &out, &[]);
    assert_ne!(changed["layers"][1]["digest"], first["layers"][1]["digest"]);
    let fresh = build(&recipe, &out, &["--no-cache"]);
    assert_eq!(fresh["layers"][1]["digest"], changed["layers"][1]["digest"]);
    rewrite(b"AAAA");
    let back = build(&recipe, &out, &[]);
    assert_eq!(back["layers"][1]["digest"], first["layers"][1]["digest"]);
    assert_eq!(back["layers"][1]["from"], "local-cache");
}

/// The digest depends on the lock and the base's content, not on how their paths are spelled
/// or where the build runs: recipe as `r.yaml`, `./r.yaml` or an absolute path, the base by a
/// relative or absolute path, with or without its tag, or copied elsewhere.
#[test]
fn path_spelling_and_working_directory_do_not_change_the_digest() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let base = dir.path().join("base");
    let copy = dir.path().join("elsewhere/base-copy");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    for target in [&base, &copy] {
        let status = Command::new("cp")
            .arg("-a")
            .arg(common::base())
            .arg(target)
            .status()
            .unwrap();
        assert!(status.success());
    }
    let abs_recipe = Path::new(&recipe).to_path_buf();
    let spellings: Vec<(&Path, String, String)> = vec![
        (dir.path(), "recipe.yaml".into(), "oci:base".into()),
        (
            dir.path(),
            "./recipe.yaml".into(),
            "oci:./base:latest".into(),
        ),
        (
            Path::new("/"),
            abs_recipe.display().to_string(),
            format!("oci:{}", copy.display()),
        ),
    ];
    let mut digests = Vec::new();
    for (i, (cwd, recipe, from)) in spellings.iter().enumerate() {
        let to = format!("oci:{}:x", dir.path().join(format!("out{i}")).display());
        let out = common::gpubake_in(cwd, &build_args(recipe, from, &to, &["--json"]));
        assert_exit(&out, 0);
        let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
        digests.push(report["manifest"].as_str().unwrap().to_string());
        let raw = run(Command::new("skopeo").args(["inspect", "--raw"]).arg(&to));
        assert!(!raw.contains(&dir.path().display().to_string()), "{raw}");
    }
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
}

/// Runs `cmd` and returns its stdout as bytes, failing the test unless it succeeds.
fn run_bytes(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `tar` cut right after its last member's data: no padding to the block, no end blocks, as
/// umoci 0.4.7's `insert` writes layers.
fn cut_after_last_data(tar: &[u8]) -> Vec<u8> {
    let mut archive = tar::Archive::new(tar);
    let mut end = 0;
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        end = entry.raw_file_position() + entry.size();
    }
    assert_ne!(end % 512, 0, "the last member must leave its padding out");
    tar[..end as usize].to_vec()
}

/// Build, verify and inspect read every layer umoci, skopeo and `docker load` read: GNU tar's
/// and bsdtar's, and streams that stop right after the last member's data, as umoci 0.4.7's
/// `insert` writes them (and any `docker save` archive cut the same way).
#[test]
fn layers_other_tools_write_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/blob"), vec![7u8; 1000]).unwrap();
    std::fs::write(tree.join("etc/hello"), "hello\n").unwrap();
    // Files last, in a known order, so the last member has data to pad.
    let members = ["etc", "etc/blob", "etc/hello"];
    let gnu = run_bytes(
        Command::new("tar")
            .args(["--format=gnu", "--no-recursion", "-cf", "-", "-C"])
            .arg(&tree)
            .args(members),
    );
    let mut layers = vec![cut_after_last_data(&gnu), gnu];
    if Command::new("bsdtar").arg("--version").output().is_ok() {
        layers.push(run_bytes(
            Command::new("bsdtar")
                .args(["-n", "-cf", "-", "-C"])
                .arg(&tree)
                .args(members),
        ));
    } else {
        eprintln!("bsdtar is not available; its layer is left out");
    }
    let mut bases = vec![image_of(
        &dir.path().join("tools"),
        &config_for(&layers),
        &layers,
    )];
    if common::have("umoci", "--version") {
        let layout = dir.path().join("umoci");
        let image = format!("{}:latest", layout.display());
        run(Command::new("umoci")
            .arg("init")
            .arg("--layout")
            .arg(&layout));
        run(Command::new("umoci").args(["new", "--image", &image]));
        for (src, dest) in [("etc/hello", "/etc/hello"), ("etc/blob", "/opt/blob")] {
            run(Command::new("umoci")
                .args(["insert", "--image", &image])
                .arg(tree.join(src))
                .arg(dest));
        }
        bases.push(layout);
    }

    let recipe = write(dir.path(), "r.yaml", "name: r\nbase: x\npytorch: '2.9'\n");
    for (i, base) in bases.iter().enumerate() {
        let from = format!("oci:{}:latest", base.display());
        for cmd in ["verify", "inspect"] {
            assert_exit(&gpubake(&[cmd, &from]), 0);
        }
        // Unpacked as certify unpacks a bundle's root filesystem.
        let opened = from.parse::<Transport>().unwrap().open().unwrap();
        let rootfs = dir.path().join(format!("rootfs{i}"));
        gpubake::image::unpack::unpack(&opened, &rootfs).unwrap();
        assert_eq!(
            std::fs::read_to_string(rootfs.join("etc/hello")).unwrap(),
            "hello\n"
        );
        let built = dir.path().join(format!("built{i}"));
        let out = gpubake(&build_args(&recipe, &from, &oci(&built, "x"), &[]));
        assert_exit(&out, 0);
        assert_exit(&gpubake(&["verify", &oci(&built, "x")]), 0);
    }

    // A `docker save` archive that stops after its last member's data reads as well.
    let archive = dir.path().join("image.tar");
    let out = gpubake(&build_args(
        &recipe,
        &format!("oci:{}:latest", bases[0].display()),
        &format!("docker-archive:{}:cut/test:v1", archive.display()),
        &[],
    ));
    assert_exit(&out, 0);
    let cut = dir.path().join("cut.tar");
    std::fs::write(&cut, cut_after_last_data(&std::fs::read(&archive).unwrap())).unwrap();
    let out = gpubake(&["verify", &format!("docker-archive:{}", cut.display())]);
    assert_exit(&out, 0);
}

/// A base config build cannot extend (not a JSON object, no `rootfs.diff_ids`, a diff ID that
/// is not a string) is bad input naming the base and what is wrong, never a panic.
#[test]
fn base_configs_without_diff_ids_are_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "r.yaml", "name: r\nbase: x\npytorch: '2.9'\n");
    let layer = run_bytes(Command::new("tar").args(["-cf", "-", "-C", "/", "etc/hostname"]));
    let platform = serde_json::json!({"architecture": "amd64", "os": "linux", "config": {}});
    let mut no_rootfs_one_layer = platform.clone();
    no_rootfs_one_layer["history"] = serde_json::json!([]);
    let cases: [(&str, Value, Vec<Vec<u8>>, &str); 6] = [
        (
            "no-rootfs",
            platform.clone(),
            vec![],
            "has no rootfs.diff_ids list",
        ),
        (
            "no-rootfs-layer",
            no_rootfs_one_layer,
            vec![layer.clone()],
            "has no rootfs.diff_ids list",
        ),
        (
            "no-diff-ids",
            serde_json::json!({"os": "linux", "rootfs": {"type": "layers"}}),
            vec![],
            "has no rootfs.diff_ids list",
        ),
        (
            "number-diff-id",
            serde_json::json!({"os": "linux", "rootfs": {"diff_ids": [7]}}),
            vec![layer],
            "rootfs.diff_ids[0] is a number, not a string",
        ),
        (
            "list",
            serde_json::json!([1, 2]),
            vec![],
            "is a list, not a JSON object",
        ),
        (
            "text",
            serde_json::json!("config"),
            vec![],
            "is a string, not a JSON object",
        ),
    ];
    for (name, config, layers, expected) in cases {
        let base = image_of(&dir.path().join(name), &config, &layers);
        let from = format!("oci:{}:latest", base.display());
        let out = gpubake(&build_args(
            &recipe,
            &from,
            &oci(&dir.path().join("out"), name),
            &[],
        ));
        assert_exit(&out, 2);
        let err = stderr(&out);
        assert!(
            err.contains(&from) && err.contains(expected),
            "{name}: {err}"
        );
    }
}

/// A layout's blobs, index.json and oci-layout, and a docker archive, are 0644 under umask 022
/// as umoci and skopeo write them, not tempfile's 0600.
#[test]
fn layouts_and_archives_follow_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "r.yaml", "name: r\nbase: x\npytorch: '2.9'\n");
    let layer = run_bytes(Command::new("tar").args(["-cf", "-", "-C", "/", "etc/hostname"]));
    let base = image_of(
        &dir.path().join("base"),
        &config_for(std::slice::from_ref(&layer)),
        &[layer],
    );
    let from = format!("oci:{}:latest", base.display());
    let out = dir.path().join("out");
    let archive = dir.path().join("image.tar");
    for to in [
        oci(&out, "x"),
        format!("docker-archive:{}:mode/test:v1", archive.display()),
    ] {
        let args = build_args(&recipe, &from, &to, &[]);
        assert_exit(&common::gpubake_umask("022", &args), 0);
    }
    let mut files = vec![out.join("index.json"), out.join("oci-layout"), archive];
    for blob in std::fs::read_dir(out.join("blobs/sha256")).unwrap() {
        files.push(blob.unwrap().path());
    }
    assert!(files.len() > 6, "{files:?}");
    for f in files {
        assert_eq!(common::mode(&f), 0o644, "{}", f.display());
    }
}

/// SIGINT during a build removes what the build had staged (the base unpacked from a docker
/// archive) and the layout it had begun, and exits 130; nothing `.gpubake-*` is left.
#[test]
fn an_interrupted_build_leaves_nothing_behind() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("base.tar");
    let copied = std::process::Command::new("skopeo")
        .arg("copy")
        .arg(from_base())
        .arg(format!("docker-archive:{}:base:latest", archive.display()))
        .output()
        .unwrap();
    assert!(copied.status.success(), "{copied:?}");
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        "name: r\nbase: x\npytorch: '2.9'\npresets: [base]\n",
    );
    let tmp = dir.path().join("tmp");
    for attempt in 0..5 {
        std::fs::create_dir_all(&tmp).unwrap();
        let out = dir.path().join(format!("out{attempt}"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(["build", "--without-python", &recipe, "--from"])
            .arg(format!("docker-archive:{}", archive.display()))
            .arg("--to")
            .arg(&out)
            .env("TMPDIR", &tmp)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until the build has staged something, then interrupt it.
        let staged = |p: &Path| std::fs::read_dir(p).map(|d| d.count() > 0).unwrap_or(false);
        let started = std::time::Instant::now();
        while !staged(&tmp) && started.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        if child.try_wait().unwrap().is_some() {
            continue; // finished before the signal: try again
        }
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let result = child.wait_with_output().unwrap();
        if result.status.code() == Some(0) {
            continue; // the signal came after the work was done
        }
        assert_eq!(
            result.status.code(),
            Some(130),
            "{}",
            String::from_utf8_lossy(&result.stderr)
        );
        assert!(String::from_utf8_lossy(&result.stderr).contains("interrupted"));
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(!out.exists(), "the new layout is removed");
        return;
    }
    panic!("the build always finished before it could be interrupted");
}

/// `--to docker-archive:PATH` writes through a symlink (the link stays, its target gets the
/// archive) and refuses a device instead of replacing it with a file.
#[test]
fn docker_archive_outputs_write_through_links_and_never_replace_devices() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(
        dir.path(),
        "r.yaml",
        "name: r\nbase: x\npytorch: '2.9'\npresets: [base]\n",
    );
    let base = from_base();
    let real = dir.path().join("real.tar");
    let link = dir.path().join("link.tar");
    std::os::unix::fs::symlink("real.tar", &link).unwrap();
    let out = gpubake(&build_args(
        &recipe,
        &base,
        &format!("docker-archive:{}", link.display()),
        &[],
    ));
    assert_exit(&out, 0);
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(std::fs::metadata(&real).unwrap().len() > 0);

    let out = gpubake(&build_args(&recipe, &base, "docker-archive:/dev/null", &[]));
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("is a device"), "{}", stderr(&out));
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

/// The glibc that counts is the base's own, read from its libc, not the recipe's `base:`
/// text: a recipe naming Ubuntu 18.04 (glibc 2.27, too old for torch 2.9) builds on a base
/// whose libc is newer, and the lock says where its glibc came from, without host paths.
#[test]
fn the_real_base_glibc_is_checked_and_named() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(
        dir.path(),
        "old.yaml",
        "name: old\nbase: ubuntu:18.04\npytorch: '2.9'\npresets: [base]\n",
    );
    let refused = gpubake(&["resolve", &recipe, "--no-closure"]);
    assert_exit(&refused, 2);
    assert!(stderr(&refused).contains("glibc"), "{}", stderr(&refused));

    let out_dir = dir.path().join("out");
    let out = gpubake(&build_args(
        &recipe,
        &from_base(),
        out_dir.to_str().unwrap(),
        &[],
    ));
    assert_exit(&out, 0);
    // A build without the Python stack checks no wheels, and says nothing of them; the lock
    // still records the glibc it was resolved against.
    assert!(
        !stderr(&out).contains("checking the wheels"),
        "{}",
        stderr(&out)
    );
    let image = Transport::Oci {
        dir: out_dir.clone(),
        tag: None,
    }
    .open()
    .unwrap();
    let lock = gpubake::bake::fs::read_file(&image, "/etc/gpubake/lock.yaml")
        .unwrap()
        .unwrap();
    let lock = String::from_utf8(lock).unwrap();
    assert!(lock.contains("base_glibc_from:"), "{lock}");
    assert!(lock.contains("read from the base image"), "{lock}");
    assert!(!lock.contains(&dir.path().display().to_string()), "{lock}");
}

/// A base whose layer has a media type that names no layer is refused by build for that
/// reason, as verify refuses it, not with a tar reader's complaint about its bytes.
#[test]
fn a_layer_with_a_media_type_that_is_no_layer_is_named_so() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "r.yaml", "name: r\nbase: x\npytorch: '2.9'\n");
    let tar = run_bytes(Command::new("tar").args(["-cf", "-", "-C", "/", "etc/hostname"]));
    let root = dir.path().join("base");
    let layout = Layout::create(&root).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    let (digest, size) = layout.write_blob(&gz.finish().unwrap()).unwrap();
    let diff_id = Digest::of(&tar);
    let config = serde_json::json!({"architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [diff_id.to_string()]}});
    let config_desc = layout.write_json(&config, MediaType::ImageConfig).unwrap();
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config_desc)
        .layers(vec![descriptor(
            MediaType::Other("application/x-not-a-layer".into()),
            &digest,
            size,
        )])
        .build()
        .unwrap();
    let mut desc = layout
        .write_json(&manifest, MediaType::ImageManifest)
        .unwrap();
    desc.set_annotations(Some(HashMap::from([(
        REF_NAME.to_string(),
        "latest".to_string(),
    )])));
    let mut index = layout.index_or_empty().unwrap();
    index.set_manifests(vec![desc]);
    layout.write_index(&index).unwrap();
    let out = gpubake(&build_args(
        &recipe,
        &format!("oci:{}:latest", root.display()),
        &oci(&dir.path().join("out"), "x"),
        &[],
    ));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("media type application/x-not-a-layer is not a layer"),
        "{}",
        stderr(&out)
    );
}

/// The manifest digest `gpubake inspect --json` reads for `image`.
fn inspected(image: &str) -> Value {
    let out = gpubake(&["inspect", "--json", image]);
    assert_exit(&out, 0);
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[test]
fn copy_refuses_a_tampered_source_and_leaves_the_destination_as_it_was() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.tar");
    common::skopeo_archive(&good);
    // One byte of a file's content in a layer, and one byte of a layer's first tar header.
    let content = dir.path().join("content.tar");
    common::tampered_archive(&good, &content);
    let header = dir.path().join("header.tar");
    std::fs::copy(&good, &header).unwrap();
    let (_, layers) = common::archive_members(&good);
    common::flip_byte(&header, common::member_data(&good, &layers[0]).0);
    // A layout that holds an image already: a failed copy into it must leave it as it was.
    let existing = dir.path().join("existing");
    assert_exit(
        &gpubake(&["copy", &from_base(), &oci(&existing, "base")]),
        0,
    );
    let before = common::layout_state(&existing);
    for (bad, said) in [
        (&content, "but the config says"),
        (&header, "layer sha256:"),
    ] {
        let src = format!("docker-archive:{}", bad.display());
        let out = gpubake(&["verify", &src]);
        assert_exit(&out, 1);
        assert!(stdout(&out).contains(said), "{}", stdout(&out));
        let fresh = dir.path().join("fresh");
        let out = gpubake(&["copy", &src, &oci(&fresh, "1")]);
        assert_exit(&out, 2);
        assert!(
            stderr(&out).contains(&format!("{src}: layer sha256:")),
            "{}",
            stderr(&out)
        );
        assert!(!fresh.exists(), "a refused copy left {}", fresh.display());
        let out = gpubake(&["copy", &src, &oci(&existing, "bad")]);
        assert_exit(&out, 2);
        assert_eq!(common::layout_state(&existing), before);
    }
    // A layout whose layer blob was changed on disk: refused before the destination is made.
    let tampered = dir.path().join("tampered");
    run(Command::new("cp")
        .arg("-r")
        .arg(common::base())
        .arg(&tampered));
    let layer = inspected(&from_base())["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    flip(&tampered, &layer);
    let dest = dir.path().join("dest");
    let out = gpubake(&["copy", &oci(&tampered, "latest"), &oci(&dest, "1")]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains(&format!("blob {layer}: content hashes to")),
        "{}",
        stderr(&out)
    );
    assert!(!dest.exists(), "a refused copy left {}", dest.display());
    // The untouched archive copies.
    let out = gpubake(&[
        "copy",
        &format!("docker-archive:{}", good.display()),
        &oci(&dest, "1"),
    ]);
    assert_exit(&out, 0);
}

#[test]
fn a_docker_archive_keeps_the_manifest_it_carries_and_says_when_it_has_none() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let base = inspected(&from_base());
    let ours = format!("docker-archive:{}", dir.path().join("ours.tar").display());
    assert_exit(&gpubake(&["copy", &from_base(), &ours]), 0);
    let read = inspected(&ours);
    assert_eq!(read["manifest"], base["manifest"], "{read}");
    assert!(read.get("manifest_made_by_gpubake").is_none(), "{read}");
    let back = dir.path().join("back");
    let out = gpubake(&["copy", "--json", &ours, &oci(&back, "1")]);
    assert_exit(&out, 0);
    let copied: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(copied["manifest"], base["manifest"], "{copied}");
    assert_eq!(copied["manifest_made_by_gpubake"], false, "{copied}");

    // skopeo writes no manifest into an archive: gpubake makes one and says so, in inspect
    // and in copy; the config (the image ID) is the base's.
    let theirs = common::skopeo_archive(&dir.path().join("theirs.tar"));
    let read = inspected(&theirs);
    assert_eq!(read["manifest_made_by_gpubake"], true, "{read}");
    // skopeo makes a manifest of its own for the same archive, with another digest.
    let skopeo: Value =
        serde_json::from_str(&run(Command::new("skopeo").arg("inspect").arg(&theirs))).unwrap();
    assert_ne!(skopeo["Digest"], read["manifest"], "{skopeo}");
    let out = gpubake(&["inspect", &theirs]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("made by gpubake"), "{}", stdout(&out));
    let out = gpubake(&["copy", &theirs, &oci(&dir.path().join("made"), "1")]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("made by gpubake"), "{}", stdout(&out));
    let config = |image: &str| {
        let out = Command::new("skopeo")
            .args(["inspect", "--config", image])
            .output()
            .unwrap();
        Digest::of(&out.stdout)
    };
    assert_eq!(config(&theirs), config(&from_base()));
    // Nor does the engine's `docker save` (20.10, as Debian ships it).
    if common::have("docker", "version") {
        let name = "gpubake-test-saved:1";
        let daemon = format!("docker-daemon:{name}");
        assert_exit(&gpubake(&["copy", &from_base(), &daemon]), 0);
        let saved = dir.path().join("saved.tar");
        run(Command::new("docker")
            .args(["save", name, "-o"])
            .arg(&saved));
        let _ = Command::new("docker").args(["rmi", name]).output();
        let read = inspected(&format!("docker-archive:{}", saved.display()));
        assert_eq!(read["manifest_made_by_gpubake"], true, "{read}");
    }
}

#[test]
fn verify_reports_every_bad_blob_by_its_digest_under_the_name_given() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let layout = dir.path().join("out");
    let report = build(&recipe, &oci(&layout, "v1"), &[]);

    // A bad config and a bad gzip layer: both are named, the layer by the digest its content
    // has, not by what the decompressor made of it.
    let both = dir.path().join("both");
    run(Command::new("cp").arg("-r").arg(&layout).arg(&both));
    let layer = report["layers"][1]["digest"].as_str().unwrap();
    flip(&both, report["config"].as_str().unwrap());
    flip(&both, layer);
    let name = oci(&both, "v1");
    let out = gpubake(&["verify", &name]);
    assert_exit(&out, 1);
    let text = stdout(&out);
    assert!(text.contains("FAIL config blob"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("FAIL layer 2"))
        .unwrap_or_else(|| panic!("layer 2 is not named: {text}"));
    assert!(
        line.contains(&format!("blob {layer}: content hashes to sha256:")),
        "{line}"
    );
    assert!(!text.contains("deflate"), "{text}");
    let twice = format!("oci:{}: oci:{}", both.display(), both.display());
    assert!(!text.contains(&twice), "{text}");
    let out = gpubake(&["inspect", &name]);
    assert_exit(&out, 2);
    assert!(!stderr(&out).contains(&twice), "{}", stderr(&out));

    // A label that disagrees with the lock is named in plain words.
    let relabelled = dir.path().join("relabelled");
    run(Command::new("cp").arg("-r").arg(&layout).arg(&relabelled));
    let store = Layout::open(&relabelled).unwrap();
    let desc = store.find(Some("v1")).unwrap();
    let digest = gpubake::image::layout::digest_of(&desc).unwrap();
    let mut manifest: Value =
        serde_json::from_slice(&store.read_blob(&digest, Some(desc.size())).unwrap()).unwrap();
    let config_digest: Digest = manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut config: Value =
        serde_json::from_slice(&store.read_blob(&config_digest, None).unwrap()).unwrap();
    config["config"]["Labels"]["io.gpubake.nccl"] = "2.99.0".into();
    let (d, n) = store
        .write_blob(&serde_json::to_vec(&config).unwrap())
        .unwrap();
    manifest["config"]["digest"] = d.to_string().into();
    manifest["config"]["size"] = n.into();
    let (d, n) = store
        .write_blob(&serde_json::to_vec(&manifest).unwrap())
        .unwrap();
    store
        .set_tag(&descriptor(MediaType::ImageManifest, &d, n), "v1")
        .unwrap();
    let out = gpubake(&["verify", &oci(&relabelled, "v1")]);
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains("label io.gpubake.nccl is `2.99.0`, the lock says `2.27.5`"),
        "{}",
        stdout(&out)
    );
    assert!(!stdout(&out).contains("Some("), "{}", stdout(&out));

    // An archive's image is named as the archive, never as the directory it is staged in.
    let good = dir.path().join("good.tar");
    common::skopeo_archive(&good);
    let broken = dir.path().join("broken.tar");
    std::fs::copy(&good, &broken).unwrap();
    let (config_member, _) = common::archive_members(&good);
    let (at, size) = common::member_data(&good, &config_member);
    let mut bytes = std::fs::read(&broken).unwrap();
    bytes[at as usize..(at + size) as usize].fill(b'{');
    std::fs::write(&broken, bytes).unwrap();
    let src = format!("docker-archive:{}", broken.display());
    let out = gpubake(&["inspect", &src]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains(&format!("{src}: config sha256:")),
        "{}",
        stderr(&out)
    );
    let out = gpubake(&["verify", &src]);
    assert_exit(&out, 1);
    for text in [stdout(&out), stderr(&out)] {
        assert!(!text.contains(".gpubake-open-"), "{text}");
    }
}

#[test]
fn a_platform_the_image_is_not_for_is_refused_naming_the_one_it_is_for() {
    if !common::tools() {
        return;
    }
    let host = gpubake::image::Platform::host();
    let other = if host.architecture == "amd64" {
        "linux/arm64"
    } else {
        "linux/amd64"
    };
    let dir = tempfile::tempdir().unwrap();
    let said = format!("the image is for {host} only, not {other}");
    for cmd in [
        &["inspect"][..],
        &["inspect", "--libraries"],
        &["verify"],
        &["certify", "--gpus", "none"],
    ] {
        let out = gpubake(&[cmd, &[&from_base(), "--platform", other]].concat());
        assert_exit(&out, 2);
        assert!(stderr(&out).contains(&said), "{cmd:?}: {}", stderr(&out));
    }
    let to = dir.path().join("to");
    let out = gpubake(&["copy", &from_base(), &oci(&to, "1"), "--platform", other]);
    assert_exit(&out, 2);
    assert!(stderr(&out).contains(&said), "{}", stderr(&out));
    assert!(!to.exists());
    // The platform it is for is taken.
    let host = host.to_string();
    let out = gpubake(&["copy", &from_base(), &oci(&to, "1"), "--platform", &host]);
    assert_exit(&out, 0);
}

/// A reference by digest or an engine's image ID names an image that exists: as the place to
/// write one it is bad input, refused before any reading or building.
#[test]
fn a_destination_by_digest_is_refused_before_anything_is_read() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let recipe = common::root().join("examples/debian-pytorch2.9.yaml");
    for to in [
        format!("docker://127.0.0.1:1/team/train@{digest}"),
        format!("docker-daemon:{digest}"),
    ] {
        // The base does not exist: only a check before reading it can answer 2 naming `to`.
        let out = gpubake(&[
            "build",
            recipe.to_str().unwrap(),
            "--from",
            "oci:/nonexistent/base:1",
            "--to",
            &to,
        ]);
        assert_exit(&out, 2);
        assert!(stderr(&out).contains(&to), "{to}: {}", stderr(&out));
        let out = gpubake(&["copy", "oci:/nonexistent/base:1", &to]);
        assert_exit(&out, 2);
        assert!(stderr(&out).contains(&to), "{to}: {}", stderr(&out));
    }
}

#[test]
fn an_archive_written_without_a_name_records_none_as_skopeo_writes_it() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let unnamed = dir.path().join("unnamed.tar");
    assert_exit(
        &gpubake(&[
            "copy",
            &from_base(),
            &format!("docker-archive:{}", unnamed.display()),
        ]),
        0,
    );
    let theirs = dir.path().join("theirs.tar");
    common::skopeo_archive(&theirs);
    let repo_tags = |archive: &Path| {
        let (at, size) = common::member_data(archive, "manifest.json");
        let bytes = std::fs::read(archive).unwrap();
        let m: Value = serde_json::from_slice(&bytes[at as usize..(at + size) as usize]).unwrap();
        m[0]["RepoTags"].clone()
    };
    assert_eq!(repo_tags(&unnamed), serde_json::json!([]));
    assert_eq!(repo_tags(&theirs), serde_json::json!([]));
    let named = dir.path().join("named.tar");
    let to = format!("docker-archive:{}:team/train:v1", named.display());
    assert_exit(&gpubake(&["copy", &from_base(), &to]), 0);
    assert_eq!(repo_tags(&named), serde_json::json!(["team/train:v1"]));
    // The engine loads the unnamed archive untagged, as it loads skopeo's.
    if common::have("docker", "version") {
        let loaded = run(Command::new("docker").arg("load").arg("-i").arg(&unnamed));
        assert!(loaded.starts_with("Loaded image ID: sha256:"), "{loaded}");
        let id = loaded
            .trim()
            .trim_start_matches("Loaded image ID: ")
            .to_string();
        let _ = Command::new("docker").args(["rmi", &id]).output();
    }
}

#[test]
fn destination_names_are_checked_before_anything_is_read_or_built() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bad_tag = format!("oci:{}:Bad Tag!", dir.path().join("tg").display());
    let out = gpubake(&["copy", &from_base(), &bad_tag]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("`Bad Tag!` is not a tag"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("tg").exists());
    // skopeo refuses that tag too, and takes the ones gpubake takes.
    let out = Command::new("skopeo")
        .args(["inspect", &bad_tag])
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("Invalid image Bad Tag!"),
        "{}",
        stderr(&out)
    );
    let fine = format!("oci:{}:v1.2-rc+1", dir.path().join("fine").display());
    assert_exit(&gpubake(&["copy", &from_base(), &fine]), 0);
    run(Command::new("skopeo").args(["inspect", &fine]));

    let recipe = recipe_in(dir.path(), "");
    let archive = format!(
        "docker-archive:{}:UPPER:1",
        dir.path().join("a.tar").display()
    );
    for to in ["docker-daemon:UPPER:1", archive.as_str()] {
        let out = gpubake(&["copy", &from_base(), to]);
        assert_exit(&out, 2);
        assert!(
            stderr(&out).contains("`UPPER:1` is not an image name Docker takes"),
            "{}",
            stderr(&out)
        );
        let start = std::time::Instant::now();
        let out = gpubake(&build_args(&recipe, &from_base(), to, &[]));
        assert_exit(&out, 2);
        assert!(
            stderr(&out).contains("is not an image name Docker takes"),
            "{}",
            stderr(&out)
        );
        assert!(!stdout(&out).contains("built"), "{}", stdout(&out));
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
    }
    assert!(!dir.path().join("a.tar").exists());
}

/// `inspect`'s text shows the labels beside the pins, leaves out a `pins` heading an image
/// without gpubake's labels would have empty, and `verify` counts one layer as one.
#[test]
fn inspect_text_shows_labels_and_only_headings_with_content() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "labels: {team: vision}\n");
    let to = format!("oci:{}:v1", dir.path().join("out").display());
    build(&recipe, &to, &[]);
    let out = gpubake(&["inspect", &to]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(
        text.contains("\npins\n") && text.contains("\n  torch "),
        "{text}"
    );
    assert!(
        text.contains("\nlabels\n")
            && text.contains("  team=vision\n")
            && text.contains("  org.opencontainers.image.title=imgtest\n"),
        "{text}"
    );
    // The busybox base has no gpubake labels and one layer.
    let base = from_base();
    let out = gpubake(&["inspect", &base]);
    assert_exit(&out, 0);
    assert!(!stdout(&out).contains("pins"), "{}", stdout(&out));
    let out = gpubake(&["verify", &base]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("(1 layer)"), "{}", stdout(&out));
}
