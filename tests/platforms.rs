//! Multi-platform images: a recipe's `platforms:` builds one manifest per platform, each on
//! the base's image for that platform with a probe binary for that machine, under one OCI
//! image index that skopeo, umoci and gpubake's own readers pick platforms from.

mod common;

use common::{assert_exit, build_args, gpubake, run, stderr, stdout, write};
use gpubake::image::layout::{Layout, descriptor};
use oci_spec::image::{Descriptor, ImageIndex, MediaType};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A copy of the busybox base whose tag `multi` is an index of two images: the busybox one as
/// linux/amd64, and a linux/arm64 one whose single layer holds a few plain files (the builder
/// never runs a base, so they need not be Arm programs). Returns `oci:DIR:multi` and the
/// arm64 manifest's digest.
fn two_platform_base(dir: &Path) -> (String, String) {
    let layout_dir = dir.join("base");
    std::fs::create_dir_all(dir).unwrap();
    run(Command::new("cp")
        .arg("-r")
        .arg(common::base())
        .arg(&layout_dir));
    let layout = Layout::open(&layout_dir).unwrap();
    let amd = layout.find(Some("latest")).unwrap();

    let mut tar = tar::Builder::new(Vec::new());
    for (path, text) in [
        ("etc/os-release", "ID=armbase\n"),
        ("etc/hostname", "arm\n"),
        ("usr/share/arm-base", "an arm64 base for tests\n"),
    ] {
        let mut h = tar::Header::new_ustar();
        h.set_size(text.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        tar.append_data(&mut h, path, text.as_bytes()).unwrap();
    }
    let layer = tar.into_inner().unwrap();
    let (layer_digest, layer_size) = layout.write_blob(&layer).unwrap();
    let config = serde_json::json!({
        "architecture": "arm64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest.to_string()]},
    });
    let config = layout.write_json(&config, MediaType::ImageConfig).unwrap();
    let manifest = oci_spec::image::ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config)
        .layers(vec![descriptor(
            MediaType::ImageLayer,
            &layer_digest,
            layer_size,
        )])
        .build()
        .unwrap();
    let arm = layout
        .write_json(&manifest, MediaType::ImageManifest)
        .unwrap();

    common::tag_index(
        &layout,
        &[(&amd, "linux/amd64"), (&arm, "linux/arm64")],
        "multi",
    );
    (
        format!("oci:{}:multi", layout_dir.display()),
        arm.digest().to_string(),
    )
}

/// A real aarch64 executable: a small Rust program built for aarch64-unknown-linux-musl and
/// linked with rust-lld (scripts/test adds the target). Made once and kept in the target
/// directory.
fn aarch64_program() -> PathBuf {
    static PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROGRAM
        .get_or_init(|| {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("aarch64-probe");
            let out = dir.join("probe");
            if !out.exists() {
                std::fs::create_dir_all(&dir).unwrap();
                let src = dir.join("probe.rs");
                std::fs::write(&src, "fn main() { println!(\"probe on aarch64\"); }\n").unwrap();
                let tmp = dir.join(format!("probe.{}", std::process::id()));
                run(Command::new("rustc")
                    .args([
                        "--target",
                        "aarch64-unknown-linux-musl",
                        "-C",
                        "linker=rust-lld",
                        "-C",
                        "link-self-contained=yes",
                        "-C",
                        "opt-level=s",
                        "-o",
                    ])
                    .arg(&tmp)
                    .arg(&src));
                std::fs::rename(&tmp, &out).unwrap();
            }
            out
        })
        .clone()
}

/// A recipe for both platforms, without GPUs or presets that would need anything else.
fn two_platform_recipe(dir: &Path) -> String {
    write(
        dir,
        "multi.yaml",
        &common::recipe("pytorch: '2.9'\nplatforms: [linux/amd64, linux/arm64]\n"),
    )
}

fn skopeo_json(args: &[&str]) -> Value {
    serde_json::from_str(&run(Command::new("skopeo").args(args))).unwrap()
}

/// The manifest of `oci:DIR:TAG` as stored (an index or a manifest).
fn raw(dir: &Path, tag: &str) -> Value {
    skopeo_json(&["inspect", "--raw", &format!("oci:{}:{tag}", dir.display())])
}

fn build_two(dir: &Path, to: &str, extra: &[&str]) -> std::process::Output {
    let (base, _) = two_platform_base(dir);
    let recipe = two_platform_recipe(dir);
    let probe = format!("linux/arm64={}", aarch64_program().display());
    let mut args = build_args(&recipe, &base, to, &["--probe-binary", &probe]);
    args.extend(extra);
    gpubake(&args)
}

#[test]
fn a_two_platform_recipe_builds_an_index_that_skopeo_umoci_and_gpubake_read() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let to = format!("oci:{}:v1", out_dir.display());
    let out = build_two(dir.path(), &to, &[]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("index"), "{}", stdout(&out));

    // The tag points at an index with one manifest per platform, each with its platform.
    let index = raw(&out_dir, "v1");
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let entries = index["manifests"].as_array().unwrap();
    let platforms: Vec<(String, String)> = entries
        .iter()
        .map(|m| {
            (
                m["platform"]["os"].as_str().unwrap().to_string(),
                m["platform"]["architecture"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        [
            ("linux".to_string(), "amd64".to_string()),
            ("linux".to_string(), "arm64".to_string())
        ]
    );
    for m in entries {
        assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    }

    // skopeo picks each platform, and each config says its own architecture.
    let image = format!("oci:{}:v1", out_dir.display());
    for arch in ["amd64", "arm64"] {
        let v = skopeo_json(&["--override-arch", arch, "inspect", &image]);
        assert_eq!(v["Architecture"], arch, "{v}");
        assert_eq!(v["Os"], "linux", "{v}");
    }

    // umoci unpacks each manifest; the arm64 one holds the arm64 base's files and the
    // aarch64 probe, the amd64 one busybox and the running gpubake.
    let layout = Layout::open(&out_dir).unwrap();
    for (i, m) in entries.iter().enumerate() {
        let tag = format!("p{i}");
        let desc = Descriptor::new(
            MediaType::ImageManifest,
            m["size"].as_u64().unwrap(),
            oci_spec::image::Digest::try_from(m["digest"].as_str().unwrap()).unwrap(),
        );
        layout.set_tag(&desc, &tag).unwrap();
        let bundle = dir.path().join(format!("bundle{i}"));
        run(Command::new("umoci")
            .args(["unpack", "--rootless", "--image"])
            .arg(format!("{}:{tag}", out_dir.display()))
            .arg(&bundle));
        let rootfs = bundle.join("rootfs");
        let probe = std::fs::read(rootfs.join("usr/local/bin/gpubake")).unwrap();
        if i == 0 {
            assert!(rootfs.join("bin/busybox").exists());
            assert_eq!(probe, std::fs::read(env!("CARGO_BIN_EXE_gpubake")).unwrap());
        } else {
            assert!(rootfs.join("usr/share/arm-base").exists());
            assert!(!rootfs.join("bin/busybox").exists());
            assert_eq!(probe, std::fs::read(aarch64_program()).unwrap());
            // EM_AARCH64, as the build checked.
            assert_eq!(u16::from_le_bytes([probe[18], probe[19]]), 183);
        }
        assert!(rootfs.join("etc/gpubake/lock.yaml").exists());
        let lock = std::fs::read_to_string(rootfs.join("etc/gpubake/lock.yaml")).unwrap();
        assert!(
            lock.contains("platforms:\n- linux/amd64\n- linux/arm64\n"),
            "{lock}"
        );
    }

    // gpubake verifies and inspects each platform.
    for platform in ["linux/amd64", "linux/arm64"] {
        let out = gpubake(&["verify", &image, "--platform", platform]);
        assert_exit(&out, 0);
        let out = gpubake(&["inspect", &image, "--platform", platform, "--json"]);
        assert_exit(&out, 0);
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["platform"], platform, "{v}");
        assert!(v.get("platforms").is_none(), "{v}");
    }
    // Without --platform, inspect lists what the index holds.
    let out = gpubake(&["inspect", &image]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("2 platforms: linux/amd64, linux/arm64"),
        "{}",
        stdout(&out)
    );

    // A copy of the index copies every platform, byte for byte; with --platform, one.
    let all = dir.path().join("all");
    let out = gpubake(&["copy", &image, &format!("oci:{}:c", all.display())]);
    assert_exit(&out, 0);
    assert_eq!(raw(&all, "c"), index);
    assert_eq!(
        Layout::open(&all)
            .unwrap()
            .find(Some("c"))
            .unwrap()
            .digest(),
        layout.find(Some("v1")).unwrap().digest()
    );
    let out = gpubake(&[
        "verify",
        &format!("oci:{}:c", all.display()),
        "--platform",
        "linux/arm64",
    ]);
    assert_exit(&out, 0);
    let one = dir.path().join("one");
    let out = gpubake(&[
        "copy",
        &image,
        &format!("oci:{}:c", one.display()),
        "--platform",
        "linux/arm64",
    ]);
    assert_exit(&out, 0);
    let copied = raw(&one, "c");
    assert_eq!(
        copied["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        Layout::open(&one)
            .unwrap()
            .find(Some("c"))
            .unwrap()
            .digest()
            .to_string(),
        entries[1]["digest"].as_str().unwrap()
    );

    // Two builds give one index digest.
    let again = dir.path().join("again");
    let out = build_two(
        &dir.path().join("second"),
        &format!("oci:{}:v1", again.display()),
        &[],
    );
    assert_exit(&out, 0);
    assert_eq!(raw(&again, "v1"), index);
}

#[test]
fn a_probe_binary_for_another_machine_or_none_is_refused() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = two_platform_base(dir.path());
    let recipe = two_platform_recipe(dir.path());
    let to = format!("oci:{}", dir.path().join("out").display());
    let wrong = env!("CARGO_BIN_EXE_gpubake");
    let out = gpubake(&build_args(
        &recipe,
        &base,
        &to,
        &["--probe-binary", &format!("linux/arm64={wrong}")],
    ));
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(err.contains(wrong), "{err}");
    assert!(
        err.contains("x86-64 (EM_X86_64), but linux/arm64 runs AArch64 (EM_AARCH64)"),
        "{err}"
    );
    // A file that is no executable at all.
    let text = write(dir.path(), "notes.txt", "not a program, just some text\n");
    let out = gpubake(&build_args(
        &recipe,
        &base,
        &to,
        &["--probe-binary", &format!("linux/arm64={text}")],
    ));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("is not an ELF executable"),
        "{}",
        stderr(&out)
    );
    let empty = write(dir.path(), "empty", "");
    let out = gpubake(&build_args(
        &recipe,
        &base,
        &to,
        &["--probe-binary", &format!("linux/arm64={empty}")],
    ));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("too short to be an ELF"),
        "{}",
        stderr(&out)
    );
    // None at all: the flag to pass is named.
    let out = gpubake(&build_args(&recipe, &base, &to, &[]));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("pass --probe-binary linux/arm64=PATH"),
        "{}",
        stderr(&out)
    );
    // Nothing was left behind by the refused builds.
    assert!(!dir.path().join("out").exists());
}

#[test]
fn an_archive_cannot_hold_an_index_but_takes_one_platform() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("img.tar");
    let to = format!("docker-archive:{}", tar.display());
    let out = build_two(dir.path(), &to, &[]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(err.contains("holds one platform's image only"), "{err}");
    assert!(err.contains("--platform linux/amd64"), "{err}");
    assert!(!tar.exists());

    let out = build_two(&dir.path().join("arm"), &to, &["--platform", "linux/arm64"]);
    assert_exit(&out, 0);
    let v = skopeo_json(&["inspect", &format!("docker-archive:{}", tar.display())]);
    assert_eq!(v["Architecture"], "arm64", "{v}");
}

#[test]
fn one_platform_builds_a_plain_manifest() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (base, arm_base) = two_platform_base(dir.path());
    // A recipe without `platforms:` on the two-platform base takes the amd64 image and makes
    // a plain manifest, as before.
    let recipe = write(dir.path(), "one.yaml", &common::recipe("pytorch: '2.9'\n"));
    let out_dir = dir.path().join("out");
    let out = gpubake(&build_args(
        &recipe,
        &base,
        &format!("oci:{}:v1", out_dir.display()),
        &[],
    ));
    assert_exit(&out, 0);
    let m = raw(&out_dir, "v1");
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    // The same build from the amd64 base alone gives the same digest: the index was only
    // read for its amd64 entry.
    let plain = dir.path().join("plain");
    let out = gpubake(&build_args(
        &recipe,
        &common::from_base(),
        &format!("oci:{}:v1", plain.display()),
        &[],
    ));
    assert_exit(&out, 0);
    assert_eq!(raw(&plain, "v1"), m);

    // `--platform linux/arm64` of the two-platform recipe builds that one as a manifest on
    // the arm64 base.
    let arm = dir.path().join("arm");
    let recipe = two_platform_recipe(dir.path());
    let probe = format!("linux/arm64={}", aarch64_program().display());
    let out = gpubake(&build_args(
        &recipe,
        &base,
        &format!("oci:{}:v1", arm.display()),
        &["--probe-binary", &probe, "--platform", "linux/arm64"],
    ));
    assert_exit(&out, 0);
    let m = raw(&arm, "v1");
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(
        m["annotations"]["org.opencontainers.image.base.digest"],
        arm_base.as_str()
    );
    // A platform the recipe does not name is refused.
    let out = gpubake(&build_args(
        &recipe,
        &base,
        &format!("oci:{}:v2", arm.display()),
        &["--platform", "linux/ppc64le"],
    ));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("the recipe builds for linux/amd64, linux/arm64"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_base_without_the_platform_is_refused_naming_both() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = two_platform_recipe(dir.path());
    let probe = format!("linux/arm64={}", aarch64_program().display());
    let out = gpubake(&build_args(
        &recipe,
        &common::from_base(),
        &format!("oci:{}", dir.path().join("out").display()),
        &["--probe-binary", &probe],
    ));
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("the base for linux/arm64 is linux/amd64"),
        "{err}"
    );
    assert!(!dir.path().join("out").exists());
}

#[test]
fn recipe_platforms_are_checked_and_recorded_in_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "bad.yaml",
        &common::recipe("pytorch: '2.9'\nplatforms:\n  - linux/amd64\n  - linux/s390x\n"),
    );
    let out = gpubake(&["resolve", &bad, "--no-closure"]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(err.contains("bad.yaml:6:5"), "{err}");
    assert!(err.contains("platforms[1]"), "{err}");
    assert!(err.contains("linux/amd64 and linux/arm64"), "{err}");

    let recipe = two_platform_recipe(dir.path());
    let out = gpubake(&["resolve", &recipe, "--no-closure"]);
    assert_exit(&out, 0);
    let lock: Value = serde_yaml::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        lock["platforms"],
        serde_json::json!(["linux/amd64", "linux/arm64"])
    );
    // A lock without `platforms:` is the default, linux/amd64, and does not say so.
    let one = write(dir.path(), "one.yaml", &common::recipe("pytorch: '2.9'\n"));
    let out = gpubake(&["resolve", &one, "--no-closure"]);
    assert_exit(&out, 0);
    assert!(!stdout(&out).contains("platforms:"), "{}", stdout(&out));

    // GH200's Grace host is arm64: an image for it resolves once the recipe builds arm64.
    let gh = write(
        dir.path(),
        "gh.yaml",
        &common::recipe("pytorch: '2.9'\ngpus: [gh200]\nplatforms: [linux/arm64]\n"),
    );
    let out = gpubake(&["resolve", &gh, "--no-closure"]);
    assert_exit(&out, 0);
    let gh = write(
        dir.path(),
        "gh-amd.yaml",
        &common::recipe("pytorch: '2.9'\ngpus: [gh200]\n"),
    );
    let out = gpubake(&["resolve", &gh, "--no-closure"]);
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("linux/arm64"), "{}", stderr(&out));
}

/// A registry on 127.0.0.1 with TLS (gpubake speaks HTTPS only) and no logins, killed when
/// dropped.
struct Registry {
    dir: tempfile::TempDir,
    addr: String,
    child: std::process::Child,
}

impl Registry {
    fn start() -> Option<Registry> {
        if !common::tools()
            || !common::have("docker-registry", "--version")
            || !common::have("openssl", "version")
        {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        run(Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=localhost"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .arg("-keyout")
            .arg(d.join("key.pem"))
            .arg("-out")
            .arg(d.join("cert.pem")));
        std::fs::write(
            d.join("config.yml"),
            format!(
                "version: 0.1\nlog: {{level: warn}}\n\
                 storage:\n  filesystem: {{rootdirectory: {dir}/data}}\n\
                 http:\n  addr: {addr}\n  secret: gpubake-test\n  \
                 tls: {{certificate: {dir}/cert.pem, key: {dir}/key.pem}}\n",
                dir = d.display(),
            ),
        )
        .unwrap();
        std::fs::create_dir(d.join("docker")).unwrap();
        let log = std::fs::File::create(d.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(d.join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry starts");
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(start.elapsed().as_secs() < 20, "the registry did not start");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Some(Registry { dir, addr, child })
    }

    /// gpubake with no registry logins in reach (this registry asks for none).
    fn gpubake(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(args)
            .args(["--tls-verify=false"])
            .current_dir(common::root())
            .env("DOCKER_CONFIG", self.dir.path().join("docker"))
            .env_remove("REGISTRY_AUTH_FILE")
            .output()
            .expect("the gpubake binary runs")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_index_is_pushed_with_every_platform_and_its_own_digest() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = two_platform_base(dir.path());
    let recipe = two_platform_recipe(dir.path());
    let probe = format!("linux/arm64={}", aarch64_program().display());
    let remote = format!("docker://{}/multi/app:v1", reg.addr);
    let out = reg.gpubake(&build_args(
        &recipe,
        &base,
        &remote,
        &["--probe-binary", &probe, "--json"],
    ));
    assert_exit(&out, 0);
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();

    // The registry holds the index gpubake wrote, byte for byte: the digest of the same
    // build into a layout.
    let local = dir.path().join("local");
    let out = build_two(
        &dir.path().join("again"),
        &format!("oci:{}:v1", local.display()),
        &[],
    );
    assert_exit(&out, 0);
    let pushed = skopeo_json(&["inspect", "--raw", "--tls-verify=false", &remote]);
    assert_eq!(pushed, raw(&local, "v1"));
    assert_eq!(
        report["manifest"].as_str().unwrap(),
        Layout::open(&local)
            .unwrap()
            .find(Some("v1"))
            .unwrap()
            .digest()
            .to_string()
    );
    assert_eq!(pushed["manifests"].as_array().unwrap().len(), 2);
    let v = skopeo_json(&[
        "--override-arch",
        "arm64",
        "inspect",
        "--tls-verify=false",
        &remote,
    ]);
    assert_eq!(v["Architecture"], "arm64", "{v}");

    // Without --platform, inspect names what the registry's index holds.
    let out = reg.gpubake(&["inspect", &remote]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("2 platforms: linux/amd64, linux/arm64"),
        "{}",
        stdout(&out)
    );

    // gpubake reads each platform back from the registry.
    for platform in ["linux/amd64", "linux/arm64"] {
        let out = reg.gpubake(&["verify", &remote, "--platform", platform]);
        assert_exit(&out, 0);
        let out = reg.gpubake(&["inspect", &remote, "--platform", platform, "--json"]);
        assert_exit(&out, 0);
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["platform"], platform, "{v}");
    }

    // A copy of the registry's index pulls every platform and keeps the index's bytes, into
    // a layout and into another repository alike.
    let mirror = dir.path().join("mirror");
    let out = reg.gpubake(&["copy", &remote, &format!("oci:{}:m", mirror.display())]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("platforms linux/amd64, linux/arm64"),
        "{}",
        stdout(&out)
    );
    assert_eq!(raw(&mirror, "m"), pushed);
    for platform in ["linux/amd64", "linux/arm64"] {
        let out = gpubake(&[
            "verify",
            &format!("oci:{}:m", mirror.display()),
            "--platform",
            platform,
        ]);
        assert_exit(&out, 0);
    }
    let other = format!("docker://{}/mirror/app:v1", reg.addr);
    let out = reg.gpubake(&["copy", &remote, &other]);
    assert_exit(&out, 0);
    assert_eq!(
        skopeo_json(&["inspect", "--raw", "--tls-verify=false", &other]),
        pushed
    );
}

/// Each platform's closure is resolved with uv for its own machine from PyPI (metadata only):
/// for PyTorch 2.11, whose aarch64 wheels are CUDA 13 builds as the x86_64 ones are, both hold
/// the lock's pins, each in its own pylock beside the lock, naming its own machine's wheels.
/// For 2.9, PyPI's aarch64 torch is a CPU build: the arm64 closure lacks NCCL and the rest, and
/// is refused naming the platform.
#[test]
fn each_platform_gets_its_own_closure_or_a_refusal_naming_it() {
    if !common::have("uv", "--version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(
        dir.path(),
        "multi.yaml",
        &common::recipe("pytorch: '2.11'\npython: '3.12'\nplatforms: [linux/amd64, linux/arm64]\n"),
    );
    let lock = dir.path().join("multi.lock");
    let out = gpubake(&["resolve", &recipe, "-o", &lock.display().to_string()]);
    assert_exit(&out, 0);
    for (file, machine, other) in [
        ("pylock.test-linux-amd64.toml", "x86_64", "aarch64"),
        ("pylock.test-linux-arm64.toml", "aarch64", "x86_64"),
    ] {
        let text = std::fs::read_to_string(dir.path().join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}\n{}", stderr(&out)));
        let torch = text
            .lines()
            .find(|l| l.contains("/torch-2.11"))
            .unwrap_or_else(|| panic!("{file} has no torch wheel:\n{text}"));
        assert!(torch.contains(machine), "{torch}");
        assert!(!text.contains(&format!("{other}.whl")), "{file}:\n{text}");
        assert!(text.contains("nvidia-nccl-cu13"), "{file}");
    }
    assert!(!dir.path().join("pylock.test.toml").exists());

    let old = write(
        dir.path(),
        "old.yaml",
        &common::recipe("pytorch: '2.9'\npython: '3.12'\nplatforms: [linux/amd64, linux/arm64]\n"),
    );
    let out = gpubake(&[
        "resolve",
        &old,
        "-o",
        &dir.path().join("old.lock").display().to_string(),
    ]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(err.contains("linux/arm64: "), "{err}");
    assert!(err.contains("nvidia-nccl-cu12: the lock pins"), "{err}");
    assert!(err.contains("CPU builds through 2.10"), "{err}");
    // The lock is not written when a platform's closure fails.
    assert!(!dir.path().join("old.lock").exists());
}

/// A multi-platform build with the Python stack resolves each platform's closure before any
/// layer is written, so a platform whose wheels break the lock's pins (PyTorch 2.9's aarch64
/// wheels on PyPI are CPU builds) stops the build, naming the platform. `--engine-build`,
/// whose Dockerfile installs the linux/amd64 closure, refuses such a recipe.
#[test]
fn a_platform_whose_closure_breaks_the_pins_stops_the_build() {
    if !common::have("uv", "--version") {
        return;
    }
    let Some(debian) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base = debian_with_arm64(&debian, dir.path());
    let recipe = write(
        dir.path(),
        "multi.yaml",
        &common::recipe("pytorch: '2.9'\npython: '3.11'\nplatforms: [linux/amd64, linux/arm64]\n"),
    );
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["build", &recipe, "--from"])
        .arg(format!("oci:{}:multi", base.display()))
        .arg("--to")
        .arg(format!("oci:{}", dir.path().join("out").display()))
        .env("GPUBAKE_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(err.contains("linux/arm64: "), "{err}");
    assert!(err.contains("CPU builds through 2.10"), "{err}");
    assert!(!dir.path().join("out").exists());
    // linux/amd64's closure was resolved into the cache; nothing was written beside the recipe.
    assert!(cache.path().join("closures").exists(), "{err}");
    assert!(!dir.path().join("pylock.test-linux-amd64.toml").exists());
    assert!(!dir.path().join("pylock.test.toml").exists());
    // The engine builds the rendered Dockerfile, whose closure is linux/amd64's.
    let recipe = two_platform_recipe(dir.path());
    let out = gpubake(&[
        "build",
        &recipe,
        "--engine-build",
        "--to",
        "docker-daemon:gpubake-platforms-test:v1",
    ]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("--engine-build builds linux/amd64 only"),
        "{}",
        stderr(&out)
    );
}

/// PyYAML 6.0.2 for CPython 3.11 on `machine` (its wheels on PyPI), and six, pure Python.
fn yaml_closure(machine: &str, url: &str, size: u64, sha256: &str) -> gpubake::closure::Closure {
    let text = format!(
        "lock-version = \"1.0\"\ncreated-by = \"uv\"\nrequires-python = \">=3.11\"\n\n\
         [[packages]]\nname = \"pyyaml\"\nversion = \"6.0.2\"\n\
         wheels = [{{ url = \"{url}\", size = {size}, hashes = {{ sha256 = \"{sha256}\" }} }}]\n\n\
         [[packages]]\nname = \"six\"\nversion = \"1.17.0\"\n\
         wheels = [{{ url = \"https://files.pythonhosted.org/packages/b7/ce/149a00dd41f10bc29e5921b496af8b574d8413afcd5e30dfa0ed46c2cc5e/six-1.17.0-py2.py3-none-any.whl\", size = 11050, hashes = {{ sha256 = \"4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274\" }} }}]\n"
    );
    gpubake::closure::parse(Path::new(&format!("pylock.{machine}.toml")), &text).unwrap()
}

/// A copy of the Debian base under `dir` as an index tagged `multi`: Debian bookworm as
/// linux/amd64, and an arm64 image with /usr/bin/python3.11 (a name only: the builder reads
/// the base's paths, never runs them).
fn debian_with_arm64(debian: &Path, dir: &Path) -> PathBuf {
    use gpubake::image::Platform;
    let base_dir = dir.join("base");
    run(Command::new("cp").arg("-r").arg(debian).arg(&base_dir));
    let layout = Layout::open(&base_dir).unwrap();
    let amd = layout.find(Some("bookworm")).unwrap();
    let mut tar = tar::Builder::new(Vec::new());
    for (path, text) in [
        ("usr/bin/python3.11", "#!/bin/false\n"),
        (
            "usr/lib/python3.11/os.py",
            "# stands for the standard library\n",
        ),
    ] {
        let mut h = tar::Header::new_ustar();
        h.set_size(text.len() as u64);
        h.set_mode(0o755);
        tar.append_data(&mut h, path, text.as_bytes()).unwrap();
    }
    let (layer, size) = layout.write_blob(&tar.into_inner().unwrap()).unwrap();
    let config = serde_json::json!({
        "architecture": "arm64", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer.to_string()]},
    });
    let config = layout.write_json(&config, MediaType::ImageConfig).unwrap();
    let manifest = oci_spec::image::ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config)
        .layers(vec![descriptor(MediaType::ImageLayer, &layer, size)])
        .build()
        .unwrap();
    let arm = layout
        .write_json(&manifest, MediaType::ImageManifest)
        .unwrap();
    let entry = |d: &Descriptor, p: &str| {
        let mut e = Descriptor::new(MediaType::ImageManifest, d.size(), d.digest().clone());
        e.set_platform(Some(p.parse::<Platform>().unwrap().to_oci()));
        e
    };
    let index: ImageIndex = oci_spec::image::ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![entry(&amd, "linux/amd64"), entry(&arm, "linux/arm64")])
        .build()
        .unwrap();
    let index_desc = layout.write_json(&index, MediaType::ImageIndex).unwrap();
    layout.set_tag(&index_desc, "multi").unwrap();
    base_dir
}

/// Each platform's Python stack holds that platform's wheels: a two-platform build installs
/// PyYAML's x86_64 wheel over the real Debian base (amd64) and its aarch64 wheel over an arm64
/// base that names its CPython (the builder reads the base's paths, never runs them), with
/// the pure-Python six in both.
#[test]
fn each_platform_s_stack_holds_its_own_wheels() {
    let Some(debian) = common::debian_base() else {
        return;
    };
    if !common::tools() {
        return;
    }
    use gpubake::bake::PlatformOptions;
    use gpubake::image::{Platform, Transport};
    let dir = tempfile::tempdir().unwrap();
    let base_dir = debian_with_arm64(&debian, dir.path());

    let text =
        common::recipe("pytorch: '2.9'\npython: '3.11'\nplatforms: [linux/amd64, linux/arm64]\n");
    let (loaded, resolved) = common::stack::resolve_text(&dir.path().join("multi.yaml"), &text);
    let amd64: Platform = "linux/amd64".parse().unwrap();
    let arm64: Platform = "linux/arm64".parse().unwrap();
    let out = dir.path().join("out");
    let report = gpubake::bake::build_for(
        &loaded,
        &resolved,
        &common::stack::build_options(
            &format!("oci:{}:multi", base_dir.display()),
            &format!("oci:{}:v1", out.display()),
            None,
        ),
        &PlatformOptions {
            only: None,
            probes: vec![(arm64.clone(), aarch64_program())],
            closures: vec![
                (
                    amd64.clone(),
                    yaml_closure(
                        "x86_64",
                        "https://files.pythonhosted.org/packages/75/e4/2c27590dfc9992f73aabbeb9241ae20220bd9452df27483b6e56d3975cc5/PyYAML-6.0.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                        762952,
                        "3ad2a3decf9aaba3d29c8f537ac4b243e36bef957511b4766cb0057d32b0be85",
                    ),
                ),
                (
                    arm64.clone(),
                    yaml_closure(
                        "aarch64",
                        "https://files.pythonhosted.org/packages/ad/0c/c804f5f922a9a6563bab712d8dcc70251e8af811fce4524d57c2c0fd49a4/PyYAML-6.0.2-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
                        736829,
                        "5d225db5a45f21e78dd9358e58a98702a0302f2659a3c6cd320564b75b86f47c",
                    ),
                ),
            ],
        },
    )
    .unwrap();
    assert_eq!(report.platforms.len(), 2);
    assert_eq!(
        raw(&out, "v1")["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );

    let image: Transport = format!("oci:{}:v1", out.display()).parse().unwrap();
    for (platform, machine, other) in [(&amd64, "x86_64", "aarch64"), (&arm64, "aarch64", "x86_64")]
    {
        let img = image.open_for(platform).unwrap();
        let mut files = Vec::new();
        for layer in img.layers() {
            layer
                .each_entry(|path, _| {
                    files.push(path.to_string());
                    Ok(std::ops::ControlFlow::Continue(()))
                })
                .unwrap();
        }
        let ext = |m: &str| format!("yaml/_yaml.cpython-311-{m}-linux-gnu.so");
        assert!(
            files.iter().any(|f| f.ends_with(&ext(machine))),
            "{platform}: no {} in {files:?}",
            ext(machine)
        );
        assert!(
            !files.iter().any(|f| f.ends_with(&ext(other))),
            "{platform}"
        );
        assert!(
            files.iter().any(|f| f.ends_with("site-packages/six.py")),
            "{platform}"
        );
        let config = img.config().unwrap();
        assert_eq!(config["architecture"], platform.architecture);
        assert_eq!(
            config["config"]["Labels"]["io.gpubake.python-stack"],
            "/opt/gpubake/venv"
        );
    }
}

/// `copy --compression estargz` of an index: every platform's image rewritten, each keeping
/// its platform in a new index, every layer with its TOC, each verified.
#[test]
fn an_index_copied_as_estargz_keeps_its_platforms() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    assert_exit(
        &build_two(dir.path(), &format!("oci:{}:v1", src.display()), &[]),
        0,
    );
    let dest = dir.path().join("estargz");
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .env("GPUBAKE_CACHE_DIR", dir.path().join("cache"))
        .args(["copy", "--compression", "estargz"])
        .arg(format!("oci:{}:v1", src.display()))
        .arg(format!("oci:{}:v1", dest.display()))
        .output()
        .unwrap();
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("platforms linux/amd64, linux/arm64"),
        "{}",
        stdout(&out)
    );
    let (before, after) = (raw(&src, "v1"), raw(&dest, "v1"));
    assert_eq!(
        after["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let platforms = |index: &Value| -> Vec<Value> {
        index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["platform"].clone())
            .collect()
    };
    assert_eq!(platforms(&after), platforms(&before));
    for (i, arch) in ["amd64", "arm64"].iter().enumerate() {
        let digest = after["manifests"][i]["digest"].as_str().unwrap();
        let manifest: Value = serde_json::from_slice(
            &std::fs::read(
                dest.join("blobs/sha256")
                    .join(digest.trim_start_matches("sha256:")),
            )
            .unwrap(),
        )
        .unwrap();
        for l in manifest["layers"].as_array().unwrap() {
            assert!(
                l["annotations"]["containerd.io/snapshot/stargz/toc.digest"].is_string(),
                "{arch}: {l}"
            );
        }
        let out = gpubake(&[
            "verify",
            "--platform",
            &format!("linux/{arch}"),
            &format!("oci:{}:v1", dest.display()),
        ]);
        assert_exit(&out, 0);
    }
}
