//! What `gpubake build` bakes into an image, audited: nothing from the build environment, no
//! file from outside the recipe's directory unless allowed, no world-writable file, the
//! modes asked for, and the base's user. Small `--without-python` images on the busybox base
//! the tests make (tests/common), read back blob by blob.

mod common;

use common::{assert_exit, build_args, from_base, gpubake_in, stderr, write};
use gpubake::image::layout::Layout;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `gpubake build --without-python RECIPE --from BASE --to oci:OUT:v1` in `cwd` with
/// extra environment variables and arguments.
fn build_in(
    cwd: &Path,
    recipe: &str,
    out: &Path,
    env: &[(&str, &str)],
    extra: &[&str],
) -> std::process::Output {
    let to = format!("oci:{}:v1", out.display());
    let from = from_base();
    Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(build_args(recipe, &from, &to, extra))
        .current_dir(cwd)
        .env_remove("GPUBAKE_PRESET_PATH")
        .envs(env.iter().copied())
        .output()
        .expect("the gpubake binary runs")
}

/// An image read back: its manifest and config as bytes, and each layer's uncompressed tar.
struct Image {
    manifest: Vec<u8>,
    config: Value,
    config_bytes: Vec<u8>,
    layers: Vec<(String, Vec<u8>)>,
}

fn read_image(layout: &Path, tag: &str) -> Image {
    let layout = Layout::open(layout).unwrap();
    let desc = layout.find(Some(tag)).unwrap();
    let image =
        gpubake::image::Image::in_layout(layout, &desc, &gpubake::image::Platform::host(), None)
            .unwrap();
    let config_bytes = image.config_bytes().unwrap();
    let layers = image
        .layers()
        .iter()
        .map(|l| {
            let mut raw = Vec::new();
            l.compressed().unwrap().read_to_end(&mut raw).unwrap();
            let mut tar = Vec::new();
            flate2::read::MultiGzDecoder::new(&raw[..])
                .read_to_end(&mut tar)
                .unwrap();
            (l.digest().unwrap().to_string(), tar)
        })
        .collect();
    Image {
        manifest: image.raw_manifest().to_vec(),
        config: serde_json::from_slice(&config_bytes).unwrap(),
        config_bytes,
        layers,
    }
}

/// Every entry of a layer: path -> (mode, entry type).
fn entries(tar: &[u8]) -> BTreeMap<String, (u32, tar::EntryType)> {
    let mut out = BTreeMap::new();
    for e in tar::Archive::new(tar).entries().unwrap() {
        let e = e.unwrap();
        let path = e.path().unwrap().to_string_lossy().into_owned();
        out.insert(path, (e.header().mode().unwrap(), e.header().entry_type()));
    }
    out
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn nothing_from_the_build_environment_reaches_the_image() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe_dir = dir.path().join("recipe");
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    // Values that exist nowhere but in this test's environment and files.
    let stamp = format!("{}-{}", std::process::id(), rand_suffix());
    let env_secret = format!("env-secret-{stamp}");
    let file_secret = format!("file-secret-{stamp}");
    let dir_secret = format!("recipe-dir-secret-{stamp}");
    write(&cwd, "credentials", &file_secret);
    write(&cwd, ".env", &format!("TOKEN={file_secret}\n"));
    write(&recipe_dir, ".env", &format!("TOKEN={dir_secret}\n"));
    write(&recipe_dir, "id_rsa", &dir_secret);
    write(&recipe_dir, "app/train.py", "print('train')\n");
    // A preset of the team's, from a directory given by its absolute path.
    let presets = dir.path().join("presets");
    write(
        &presets,
        "team.yaml",
        "description: the team's\nenv:\n  NCCL_IB_TIMEOUT:\n    value: '22'\n    reason: long links\n",
    );
    let recipe = write(
        &recipe_dir,
        "recipe.yaml",
        "name: audit\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base, team]\n\
         env: {NCCL_DEBUG: WARN}\nlabels: {team: ml}\n\
         files: [{src: app, dest: /workspace/app}]\n",
    );
    let out = dir.path().join("out");
    let built = build_in(
        &cwd,
        &recipe,
        &out,
        &[
            ("AWS_SECRET_ACCESS_KEY", &env_secret),
            ("HF_TOKEN", &env_secret),
            ("NCCL_SOCKET_IFNAME", &env_secret),
            ("GPUBAKE_AUDIT_PASSWORD", &env_secret),
        ],
        &["--preset-dir", presets.to_str().unwrap()],
    );
    assert_exit(&built, 0);
    let image = read_image(&out, "v1");
    // The recipe's own file is there (so the scan below reads real layers)...
    let files = image
        .layers
        .iter()
        .map(|(_, t)| entries(t))
        .find(|e| e.contains_key("workspace/app/train.py"));
    assert!(files.is_some(), "the files layer holds the recipe's file");
    // ...and nothing of the environment or of files the recipe did not name is anywhere:
    // manifest, config (env, labels, history) or any layer.
    for secret in [&env_secret, &file_secret, &dir_secret] {
        assert!(
            !contains(&image.manifest, secret),
            "manifest holds {secret}"
        );
        assert!(
            !contains(&image.config_bytes, secret),
            "config holds {secret}"
        );
        for (digest, tar) in &image.layers {
            assert!(!contains(tar, secret), "layer {digest} holds {secret}");
        }
    }
    let env = image.config["config"]["Env"].to_string();
    assert!(env.contains("NCCL_DEBUG=WARN"), "{env}");
    assert!(!env.contains("AWS_") && !env.contains("HF_TOKEN"), "{env}");
    // Nor the paths the build ran in: the lock's provenance names files, not directories.
    let work = dir.path().display().to_string();
    assert!(
        !contains(&image.config_bytes, &work),
        "config holds the build directory"
    );
    for (digest, tar) in &image.layers {
        assert!(
            !contains(tar, &work),
            "layer {digest} holds the build directory {work}: {:?}",
            entries(tar).keys().collect::<Vec<_>>()
        );
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn files_outside_the_recipe_directory_are_refused_unless_allowed() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe_dir = dir.path().join("recipe");
    write(dir.path(), "outside/secret.txt", "not for the image\n");
    write(&recipe_dir, "inside.txt", "fine\n");
    std::os::unix::fs::symlink(dir.path().join("outside"), recipe_dir.join("link")).unwrap();
    let outside = dir.path().join("outside/secret.txt");
    let out = dir.path().join("out");
    let head = "name: audit\nbase: ubuntu:24.04\npytorch: '2.9'\nfiles:\n  - {src: inside.txt, dest: /a}\n";
    for (src, what) in [
        ("../outside/secret.txt".to_string(), "a path through .."),
        (outside.display().to_string(), "an absolute path"),
        ("link/secret.txt".into(), "a symlink's target"),
        ("link".into(), "a symlinked directory"),
    ] {
        let recipe = write(
            &recipe_dir,
            "recipe.yaml",
            &format!("{head}  - src: {src}\n    dest: /b\n"),
        );
        for cmd in [
            &["resolve", recipe.as_str()][..],
            &["lint", recipe.as_str()][..],
        ] {
            let refused = gpubake_in(dir.path(), cmd);
            let err = common::stdout(&refused) + &stderr(&refused);
            assert!(!refused.status.success(), "{what}: {cmd:?} passed:\n{err}");
            assert!(
                err.contains("recipe.yaml:6:10"),
                "{what}: no file:line:column:\n{err}"
            );
            assert!(err.contains("files[1].src"), "{what}: no field:\n{err}");
        }
        let refused = build_in(dir.path(), &recipe, &out, &[], &[]);
        assert_exit(&refused, 2);
        let err = stderr(&refused);
        assert!(err.contains("recipe.yaml:6:10"), "{what}: {err}");
        assert!(err.contains("files[1].src"), "{what}: {err}");
        assert!(
            err.contains("outside the recipe's directory"),
            "{what}: {err}"
        );
        assert!(err.contains("allow_outside: true"), "{what}: {err}");
        assert!(
            !out.join("index.json").exists(),
            "{what}: a refused build wrote an image"
        );
        // Allowed by the flag.
        let allowed = build_in(dir.path(), &recipe, &out, &[], &["--allow-files-outside"]);
        assert_exit(&allowed, 0);
        std::fs::remove_dir_all(&out).unwrap();
    }
    // Allowed by the entry itself.
    let recipe = write(
        &recipe_dir,
        "recipe.yaml",
        &format!("{head}  - {{src: ../outside/secret.txt, dest: /b, allow_outside: true}}\n"),
    );
    assert_exit(&build_in(dir.path(), &recipe, &out, &[], &[]), 0);
    let image = read_image(&out, "v1");
    assert!(
        image
            .layers
            .iter()
            .any(|(_, t)| entries(t).contains_key("b")),
        "the allowed file is in the image"
    );
}

/// A `files:` tree whose symlink points at a host path, or an entry that would land on a
/// file gpubake writes, is refused at resolve, lint and build, naming the entry.
#[test]
fn files_with_host_symlinks_or_on_gpubakes_own_paths_are_refused() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe_dir = dir.path().join("recipe");
    write(dir.path(), "x/secret.txt", "host only\n");
    write(&recipe_dir, "app/main.py", "print()\n");
    write(&recipe_dir, "conf.yaml", "a: 1\n");
    write(&recipe_dir, "tree/gpubake/lock.yaml", "a: 1\n");
    std::fs::create_dir_all(recipe_dir.join("up/sub")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("x/secret.txt"), recipe_dir.join("app/link"))
        .unwrap();
    std::os::unix::fs::symlink("../../app/main.py", recipe_dir.join("up/sub/out")).unwrap();
    let out = dir.path().join("out");
    let head = "name: audit\nbase: ubuntu:24.04\npytorch: '2.9'\nfiles:\n";
    for (entry, said) in [
        ("{src: app, dest: /workspace}", "the symlink"),
        ("{src: up, dest: /workspace}", "points at ../../app/main.py"),
        (
            "{src: conf.yaml, dest: /etc/gpubake/lock.yaml}",
            "would replace /etc/gpubake",
        ),
        (
            "{src: conf.yaml, dest: /opt/gpubake/venv/bin/python3}",
            "would replace /opt/gpubake/venv",
        ),
        (
            "{src: conf.yaml, dest: /etc/nccl.conf}",
            "would replace /etc/nccl.conf",
        ),
        (
            "{src: tree, dest: /etc}",
            "gpubake would land at /etc/gpubake,",
        ),
    ] {
        let recipe = write(&recipe_dir, "recipe.yaml", &format!("{head}  - {entry}\n"));
        for cmd in [
            &["resolve", recipe.as_str()][..],
            &["lint", recipe.as_str()][..],
        ] {
            let refused = gpubake_in(dir.path(), cmd);
            let err = common::stdout(&refused) + &stderr(&refused);
            assert_eq!(refused.status.code(), Some(2), "{entry}: {cmd:?}:\n{err}");
            assert!(
                err.contains("recipe.yaml:5:")
                    && err.contains("files[0].src")
                    && err.contains(said),
                "{entry}: {cmd:?}:\n{err}"
            );
        }
        let refused = build_in(dir.path(), &recipe, &out, &[], &[]);
        assert_exit(&refused, 2);
        assert!(
            stderr(&refused).contains(said),
            "{entry}: {}",
            stderr(&refused)
        );
        assert!(
            !out.join("index.json").exists(),
            "{entry}: a refused build wrote an image"
        );
    }
    // A symlink that stays inside its tree goes in as it is.
    std::fs::remove_file(recipe_dir.join("app/link")).unwrap();
    std::os::unix::fs::symlink("main.py", recipe_dir.join("app/link")).unwrap();
    let recipe = write(
        &recipe_dir,
        "recipe.yaml",
        &format!("{head}  - {{src: app, dest: /workspace}}\n"),
    );
    assert_exit(&build_in(dir.path(), &recipe, &out, &[], &[]), 0);
}

/// The busybox base with one more layer holding a setuid file and a sticky world-writable
/// directory (as /tmp is), and a user and working directory in its config.
fn base_with_user(dir: &Path) -> PathBuf {
    let layout = dir.join("base");
    let out = Command::new("cp")
        .args(["-a"])
        .arg(common::base())
        .arg(&layout)
        .output()
        .unwrap();
    assert!(out.status.success());
    let bundle = dir.join("bundle");
    let image = format!("{}:latest", layout.display());
    let umoci = |args: &[&str]| {
        let out = Command::new("umoci").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "umoci {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    umoci(&[
        "unpack",
        "--rootless",
        "--image",
        &image,
        bundle.to_str().unwrap(),
    ]);
    let rootfs = bundle.join("rootfs");
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(rootfs.join("tmp")).unwrap();
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(rootfs.join("bin/su-tool"), "x").unwrap();
    std::fs::set_permissions(
        rootfs.join("bin/su-tool"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    std::fs::create_dir_all(rootfs.join("home/app")).unwrap();
    umoci(&["repack", "--image", &image, bundle.to_str().unwrap()]);
    umoci(&[
        "config",
        "--image",
        &image,
        "--config.user",
        "1000:1000",
        "--config.workingdir",
        "/home/app",
    ]);
    layout
}

/// Runs `gpubake build --without-python RECIPE --from oci:BASE:latest --to TO` in `cwd`:
/// a build on a base of the test's own (as [`base_with_user`] makes).
fn build_on(cwd: &Path, recipe: &str, base: &Path, to: &str) -> std::process::Output {
    let from = format!("oci:{}:latest", base.display());
    gpubake_in(cwd, &build_args(recipe, &from, to, &[]))
}

#[test]
fn gpubake_layers_keep_modes_add_nothing_world_writable_and_keep_the_base_user() {
    if !common::tools() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let base = base_with_user(dir.path());
    let recipe_dir = dir.path().join("recipe");
    let set = |name: &str, mode: u32| {
        write(&recipe_dir, name, "content\n");
        std::fs::set_permissions(recipe_dir.join(name), std::fs::Permissions::from_mode(mode))
            .unwrap();
    };
    set("app/run.sh", 0o755);
    set("app/data.txt", 0o644);
    set("app/shared.txt", 0o666);
    set("app/tool", 0o777);
    set("key.pem", 0o600);
    std::fs::set_permissions(
        recipe_dir.join("app"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let recipe = write(
        &recipe_dir,
        "recipe.yaml",
        "name: audit\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\nfiles:\n\
         \x20 - {src: app, dest: /workspace/app}\n\
         \x20 - {src: key.pem, dest: /etc/app/key.pem, mode: '0600'}\n\
         \x20 - {src: app/run.sh, dest: /usr/local/bin/run, mode: '0750'}\n",
    );
    let out = dir.path().join("out");
    let to = format!("oci:{}:v1", out.display());
    let built = build_on(dir.path(), &recipe, &base, &to);
    assert_exit(&built, 0);
    let base_image = read_image(&base, "latest");
    let image = read_image(&out, "v1");

    // The base's layers are the base's blobs, byte for byte: its setuid file and sticky
    // /tmp keep their modes.
    let n = base_image.layers.len();
    for (i, (digest, _)) in base_image.layers.iter().enumerate() {
        assert_eq!(&image.layers[i].0, digest, "base layer {i} was rewritten");
    }
    let base_top = entries(&base_image.layers[n - 1].1);
    assert_eq!(base_top.get("bin/su-tool").map(|e| e.0), Some(0o4755));
    assert_eq!(base_top.get("tmp/").map(|e| e.0), Some(0o1777));

    // What gpubake adds: the modes the recipe asked for, else the source's execute bit, and
    // nothing world-writable (symlinks aside, whose mode means nothing).
    let mut added = BTreeMap::new();
    for (_, tar) in &image.layers[n..] {
        added.extend(entries(tar));
    }
    for (path, (mode, kind)) in &added {
        if !kind.is_symlink() {
            assert_eq!(mode & 0o002, 0, "{path} is world-writable ({mode:o})");
            assert_eq!(mode & 0o6000, 0, "{path} is setuid or setgid ({mode:o})");
        }
    }
    let mode = |p: &str| {
        added
            .get(p)
            .map(|e| e.0)
            .unwrap_or_else(|| panic!("{p} missing: {added:?}"))
    };
    assert_eq!(mode("workspace/app/run.sh"), 0o755);
    assert_eq!(mode("workspace/app/data.txt"), 0o644);
    assert_eq!(mode("workspace/app/shared.txt"), 0o644);
    assert_eq!(mode("workspace/app/tool"), 0o755);
    assert_eq!(mode("etc/app/key.pem"), 0o600);
    assert_eq!(mode("usr/local/bin/run"), 0o750);
    assert_eq!(mode("usr/local/bin/gpubake"), 0o755);
    assert_eq!(mode("etc/nccl.conf"), 0o644);

    // The base's user and working directory stand: gpubake has no field that changes them.
    assert_eq!(image.config["config"]["User"], "1000:1000");
    assert_eq!(image.config["config"]["WorkingDir"], "/home/app");
    let plain = read_image(&common::base(), "latest");
    assert!(
        plain.config["config"]["User"]
            .as_str()
            .unwrap_or("")
            .is_empty()
    );

    // A mode that would make a file world-writable is refused, naming the field.
    let recipe = write(
        &recipe_dir,
        "recipe.yaml",
        "name: audit\nbase: ubuntu:24.04\npytorch: '2.9'\nfiles:\n\
         \x20 - {src: key.pem, dest: /etc/app/key.pem, mode: '0666'}\n",
    );
    let refused = build_on(dir.path(), &recipe, &base, &to);
    assert_exit(&refused, 2);
    let err = stderr(&refused);
    assert!(
        err.contains("recipe.yaml:5:50") && err.contains("files[0].mode"),
        "{err}"
    );
    assert!(err.contains("world-writable"), "{err}");
}

#[test]
fn the_image_runs_as_the_bases_user_in_the_engine() {
    if !common::tools() || !common::have("docker", "info") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let base = base_with_user(dir.path());
    let recipe = write(
        dir.path(),
        "recipe.yaml",
        "name: audit\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\n",
    );
    let tag = format!("gpubake-audit-user:{}", std::process::id());
    let to = format!("docker-daemon:{tag}");
    let built = build_on(dir.path(), &recipe, &base, &to);
    assert_exit(&built, 0);
    let run = Command::new("docker")
        .args([
            "run",
            "--rm",
            &tag,
            "/bin/busybox",
            "sh",
            "-c",
            "id -u; id -g; pwd",
        ])
        .output()
        .unwrap();
    let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "1000\n1000\n/home/app\n"
    );
}
