//! Builds into the Docker Engine: what its `docker load` does with an archive that leaves out
//! the files of layers the engine holds (recorded against the engine itself), and gpubake's
//! build streaming an image into it, sending only what it lacks.

mod common;

use common::{run, write};
use gpubake::image::digest::Digest;
use serde_json::{Value, json};
use std::process::Command;

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker").args(args).output().unwrap()
}

fn engine() -> bool {
    common::tools() && common::have("docker", "version")
}

/// Removes the images named, quietly (a test that failed before making them has none).
fn remove(names: &[&str]) {
    let _ = Command::new("docker")
        .args(["rmi", "-f"])
        .args(names)
        .output();
}

/// A tar of `members` (name, bytes), in that order: a layer, or a docker archive.
fn archive(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, bytes) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, name, *bytes).unwrap();
    }
    tar.into_inner().unwrap()
}

/// A config over `layers` (their diff IDs), and its member name.
fn config_of(layers: &[&[u8]]) -> (String, Vec<u8>) {
    let diffs: Vec<String> = layers.iter().map(|l| Digest::of(l).to_string()).collect();
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/hello.txt"]},
        "rootfs": {"type": "layers", "diff_ids": diffs},
    }))
    .unwrap();
    (format!("{}.json", Digest::of(&config).hex()), config)
}

/// What gpubake leaves out of the archive it loads rests on this: the engine (20.10's
/// classic store) looks each layer up by chain ID and opens the file of a missing layer only;
/// without the layer, the missing file is the engine's error.
#[test]
fn the_engines_load_opens_only_the_files_of_layers_it_lacks() {
    if !engine() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (below, top) = ("gpubake-test-engine-below:1", "gpubake-test-engine-top:1");
    remove(&[top, below]);
    // A bottom layer no other image has: the test's own directory name is in it.
    let mark = format!("{}\n", dir.path().display());
    let bottom = archive(&[("below.txt", mark.as_bytes())]);
    let upper = archive(&[("hello.txt", b"from the second layer\n")]);
    let load = |bytes: Vec<u8>| {
        let path = dir.path().join("load.tar");
        std::fs::write(&path, bytes).unwrap();
        Command::new("docker")
            .args(["load", "-q", "-i"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let (name, config) = config_of(&[&bottom]);
    let manifest = serde_json::to_vec(&json!([{
        "Config": name, "RepoTags": [below], "Layers": ["0.tar"],
    }]))
    .unwrap();
    let out = load(archive(&[
        ("0.tar", &bottom),
        (&name, &config),
        ("manifest.json", &manifest),
    ]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The bottom layer is named, and not in the archive.
    let (name, config) = config_of(&[&bottom, &upper]);
    let manifest = serde_json::to_vec(&json!([{
        "Config": name, "RepoTags": [top], "Layers": ["0.tar", "1.tar"],
    }]))
    .unwrap();
    let partial = archive(&[
        ("1.tar", &upper),
        (&name, &config),
        ("manifest.json", &manifest),
    ]);
    let out = load(partial.clone());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let image: Value =
        serde_json::from_str(&run(Command::new("docker").args(["image", "inspect", top]))).unwrap();
    assert_eq!(
        image[0]["RootFS"]["Layers"][0],
        Digest::of(&bottom).to_string()
    );

    // Without the bottom layer in the engine, the file it would need is missing, in its words.
    remove(&[top, below]);
    let out = load(partial);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("0.tar: no such file or directory"), "{err}");
}

fn build_json(recipe: &str, to: &str) -> Value {
    common::build_json_in(&common::root(), recipe, to, &[])
}

/// A build into the engine streams each layer as it is made, uncompressed; a second build
/// sends only the layers the engine lacks; the engine's image is the layout build's config.
#[test]
fn a_build_into_the_engine_sends_only_the_layers_it_lacks() {
    if !engine() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    common::noise(&data.join("weights.bin"), 3, 7);
    let files = format!("files:\n  - {{src: {}, dest: /data}}\n", data.display());
    let recipe = write(
        dir.path(),
        "recipe.yaml",
        &format!("name: streamtest\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\n{files}"),
    );
    let (first, second) = ("gpubake-test-stream:1", "gpubake-test-stream:2");
    remove(&[first, second]);
    let _ = docker(&["rmi", "-f", "gpubake-test-stream-base:1"]);

    let layout = build_json(
        &recipe,
        &format!("oci:{}:v1", dir.path().join("out").display()),
    );
    let one = build_json(&recipe, &format!("docker-daemon:{first}"));
    // The engine's image ID is the layout's config: the same image, layers sent unpacked.
    assert_eq!(one["config"], layout["config"], "{one}");
    let id = run(Command::new("docker").args(["image", "inspect", "-f", "{{.Id}}", first]));
    assert_eq!(id.trim(), layout["config"].as_str().unwrap());
    let layers = one["layers"].as_array().unwrap();
    let engine = &one["engine"];
    assert_eq!(
        engine["sent"].as_u64().unwrap() + engine["left_out"].as_u64().unwrap(),
        layers.len() as u64,
        "{one}"
    );
    // What went was the plain tar: its size is the tar stream's.
    for l in layers.iter().filter(|l| !l["timing"].is_null()) {
        assert_eq!(l["size"], l["timing"]["tar_bytes"], "{l}");
    }
    let base_layers = layers.iter().filter(|l| l["name"] == "base").count() as u64;
    let out = docker(&[
        "run",
        "--rm",
        first,
        "busybox",
        "sha256sum",
        "/data/weights.bin",
    ]);
    let theirs = String::from_utf8_lossy(&out.stdout).to_string();
    let ours = Digest::of(&std::fs::read(data.join("weights.bin")).unwrap())
        .hex()
        .to_string();
    assert!(theirs.starts_with(&ours), "{theirs} vs {ours}");

    // A preset change: only the presets layer goes; the rest the engine holds.
    write(
        dir.path(),
        "recipe.yaml",
        &format!(
            "name: streamtest\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\nenv:\n  NCCL_DEBUG: INFO\n{files}"
        ),
    );
    let two = build_json(&recipe, &format!("docker-daemon:{second}"));
    assert_eq!(two["engine"]["sent"], 1, "{two}");
    assert_eq!(
        two["engine"]["left_out"].as_u64().unwrap(),
        layers.len() as u64 - 1,
        "{two}"
    );
    let env = run(Command::new("docker").args([
        "run",
        "--rm",
        second,
        "sh",
        "-c",
        "echo $NCCL_DEBUG; busybox sha256sum /data/weights.bin",
    ]));
    assert!(env.starts_with("INFO\n") && env.contains(&ours), "{env}");

    // With the images gone from the engine, every layer of gpubake's goes again (the base
    // may stay, held by another image), and the image is the same.
    remove(&[first, second]);
    let again = build_json(&recipe, &format!("docker-daemon:{second}"));
    assert!(
        again["engine"]["left_out"].as_u64().unwrap() <= base_layers,
        "{again}"
    );
    assert_eq!(again["config"], two["config"]);
    let env = run(Command::new("docker").args(["run", "--rm", second, "cat", "/etc/nccl.conf"]));
    assert!(env.contains("NCCL_DEBUG=INFO"), "{env}");
    remove(&[second]);
}
