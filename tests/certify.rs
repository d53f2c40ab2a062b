//! `gpubake certify` against images built here, and the Docker engine that runs on this
//! machine: the probe in a container without GPUs exits 3 with its message; certify names the
//! failing check for a tampered blob, labels that disagree with the lock, an invalid NCCL
//! value, a token in Env, and too many layers.

mod common;

use common::{assert_exit, build_args, from_base, gpubake, stdout, write};
use gpubake::engine::{Engine, Gpus};
use gpubake::image::layout::{Layout, REF_NAME};
use oci_spec::image::{ImageManifest, MediaType};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// Builds an image from a recipe with extra lines into `dir/out:v1`; returns the reference.
fn build(dir: &Path, extra: &str) -> String {
    build_with(dir, extra, &[])
}

/// [`build`] with extra arguments (`--skip-checks` for a recipe certify is to fail).
fn build_with(dir: &Path, extra: &str, args: &[&str]) -> String {
    let recipe = write(
        dir,
        "recipe.yaml",
        &format!("name: cert\nbase: x\npytorch: '2.9'\npresets: [base, nvlink]\n{extra}"),
    );
    let image = format!("oci:{}:v1", dir.join("out").display());
    let out = gpubake(&build_args(&recipe, &from_base(), &image, args));
    assert_exit(&out, 0);
    image
}

fn certify(image: &str, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["certify", image, "--gpus", "none"];
    args.extend(extra);
    let out = gpubake(&args);
    let text = stdout(&out);
    assert!(!common::stderr(&out).contains("panicked"));
    (out.status.code().unwrap(), text)
}

/// A preflight image (built without the Python stack, and labelled so) is certified on the
/// rest; its pins against content are a skip that says why.
#[test]
fn a_clean_preflight_image_is_certified_and_the_certificate_is_written() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let cert = dir.path().join("cert.json");
    let junit = dir.path().join("cert.xml");
    let out = gpubake(&[
        "certify",
        &image,
        "--gpus",
        "none",
        "--out",
        cert.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains(
            "SKIP  gpubake probe in a container  not requested (--gpus none or 0 asks for no GPU)"
        ),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("SKIP  pins vs content")
            && stdout(&out).contains("a preflight image"),
        "{}",
        stdout(&out)
    );
    let c: Value = serde_json::from_slice(&std::fs::read(&cert).unwrap()).unwrap();
    assert_eq!(c["gpubake"], env!("CARGO_PKG_VERSION"));
    assert!(
        c["facts"]["manifest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert!(
        std::fs::read_to_string(&junit)
            .unwrap()
            .contains("<testsuite name=\"static\"")
    );
}

#[test]
fn certify_names_what_fails() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();

    let tampered = dir.path().join("tampered");
    let image = build(&tampered, "");
    let report: Value =
        serde_json::from_str(&stdout(&gpubake(&["inspect", &image, "--json"]))).unwrap();
    let top = report["layers"][2]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let blob = tampered.join("out/blobs/sha256").join(&top);
    let mut bytes = std::fs::read(&blob).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 1;
    // A new file: the blob's hard links elsewhere keep their bytes.
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(&blob, bytes).unwrap();
    let (code, text) = certify(&image, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("FAIL  layer 3") && text.contains(&top),
        "{text}"
    );

    let nccl = dir.path().join("nccl");
    let image = build_with(&nccl, "env:\n  NCCL_NTHREADS: '1000'\n", &["--skip-checks"]);
    let (code, text) = certify(&image, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("FAIL  NCCL preset lint") && text.contains("NCCL_NTHREADS"),
        "{text}"
    );

    let token = dir.path().join("token");
    let image = build_with(&token, "env:\n  HF_TOKEN: hf_abc\n", &["--skip-checks"]);
    let (code, text) = certify(&image, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("FAIL  no secrets in Env") && text.contains("HF_TOKEN"),
        "{text}"
    );
    assert!(
        !text.contains("hf_abc"),
        "the secret's value is never printed"
    );

    let many = dir.path().join("many");
    let image = build(&many, "");
    let (code, text) = certify(&image, &["--max-layers", "2"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("FAIL  layer count") && text.contains("3 layers (at most 2)"),
        "{text}"
    );
}

/// Rewrites the image's config so a label disagrees with the lock baked into the layers.
#[test]
fn labels_that_disagree_with_the_lock_fail() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let layout = Layout::open(&dir.path().join("out")).unwrap();
    let manifest = gpubake::image::Transport::Oci {
        dir: dir.path().join("out"),
        tag: Some("v1".into()),
    }
    .open()
    .unwrap()
    .manifest()
    .clone();
    let config_digest = gpubake::image::layout::digest_of(manifest.config()).unwrap();
    let mut config: Value =
        serde_json::from_slice(&layout.read_blob(&config_digest, None).unwrap()).unwrap();
    config["config"]["Labels"]["io.gpubake.nccl"] = Value::from("2.99.0");
    let config_desc = layout.write_json(&config, MediaType::ImageConfig).unwrap();
    let mut edited: ImageManifest = manifest.clone();
    edited.set_config(config_desc);
    let mut desc = layout
        .write_json(&edited, MediaType::ImageManifest)
        .unwrap();
    desc.set_annotations(Some(HashMap::from([(
        REF_NAME.to_string(),
        "v1".to_string(),
    )])));
    let mut index = layout.index().unwrap();
    index.set_manifests(vec![desc]);
    layout.write_index(&index).unwrap();

    let (code, text) = certify(&image, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("FAIL  labels vs lock") && text.contains("io.gpubake.nccl"),
        "{text}"
    );
}

fn engine() -> Option<Engine> {
    match Engine::connect() {
        Ok(e) => Some(e),
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI starts the Docker engine: {e}"
            );
            eprintln!("skipped: {e}");
            None
        }
    }
}

#[test]
fn the_probe_in_a_container_without_gpus_exits_3_and_says_why() {
    if !common::tools() {
        return;
    }
    let Some(engine) = engine() else { return };
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("gpubake-certify-test:{}", std::process::id());
    let archive = dir.path().join("image.tar");
    let recipe = write(
        dir.path(),
        "r.yaml",
        "name: p\nbase: x\npytorch: '2.9'\npresets: [base]\n",
    );
    let to = format!("docker-archive:{}:{tag}", archive.display());
    let out = gpubake(&build_args(&recipe, &from_base(), &to, &[]));
    assert_exit(&out, 0);
    engine.load(&archive).unwrap();
    let run = engine.run(
        &tag,
        &["gpubake", "probe"],
        &[],
        &Gpus::None,
        std::time::Duration::from_secs(60),
    );
    engine.remove_image(&tag);
    let run = run.unwrap();
    assert_eq!(run.exit_code, 3, "{}{}", run.stdout, run.stderr);
    // The engine ran it as a training job is run: the host's IPC, and locked memory lifted
    // unless the engine said it may not.
    assert!(
        run.settings.applied.starts_with("--ipc host"),
        "{:?}",
        run.settings
    );
    assert!(run.stdout.contains("PASS  IPC namespace"), "{}", run.stdout);
    match &run.settings.withheld {
        None => assert!(
            run.stdout.contains("PASS  RLIMIT_MEMLOCK"),
            "{}",
            run.stdout
        ),
        Some(refused) => assert!(refused.contains("memlock=-1"), "{refused}"),
    }
    assert!(
        run.stdout
            .contains("no NVIDIA GPU is visible to this docker"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("--gpus all"), "{}", run.stdout);
}

#[test]
fn asking_for_gpus_without_a_gpu_runtime_exits_3() {
    if !common::tools() {
        return;
    }
    if engine().is_none() || Path::new("/dev/nvidia0").exists() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let out = gpubake(&["certify", &image, "--gpus", "all"]);
    assert_exit(&out, 3);
    let text = stdout(&out);
    assert!(
        text.contains("SKIP  gpubake probe in a container"),
        "{text}"
    );
    assert!(
        text.contains("static checks passed; the GPU probe could not run here"),
        "{text}"
    );
}

#[test]
fn a_missing_engine_is_an_environment_problem() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["certify", &image, "--gpus", "all"])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    assert_exit(&out, 3);
    let text = stdout(&out);
    assert!(
        text.contains("no Docker engine answers at unix:///nonexistent/docker.sock"),
        "{text}"
    );
}

/// Loads the test base into the engine as `tag` (skopeo writes the archive).
fn load_base(engine: &Engine, dir: &Path, tag: &str) {
    let archive = dir.join("base.tar");
    let out = Command::new("skopeo")
        .arg("copy")
        .arg(format!("oci:{}:latest", common::base().display()))
        .arg(format!("docker-archive:{}:{tag}", archive.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    engine.load(&archive).unwrap();
}

fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn engine_builds_from_the_rendered_dockerfile_and_loads_daemonless_builds() {
    if !common::tools() {
        return;
    }
    let Some(engine) = engine() else { return };
    let dir = tempfile::tempdir().unwrap();
    let id = std::process::id();
    let base = format!("gpubake-test-base:{id}");
    load_base(&engine, dir.path(), &base);
    let recipe = write(
        dir.path(),
        "r.yaml",
        "name: eb\nbase: x\npytorch: '2.9'\npresets: [base, nvlink]\n",
    );
    let built = format!("gpubake-engine-build:{id}");
    let out = gpubake(&[
        "build",
        &recipe,
        "--engine-build",
        "--without-python",
        "--from",
        &format!("docker-daemon:{base}"),
        "--to",
        &format!("docker-daemon:{built}"),
    ]);
    assert_exit(&out, 0);
    assert!(
        common::stderr(&out).contains("Step 1/"),
        "the build log streams: {}",
        common::stderr(&out)
    );
    let (_, labels) = docker(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config.Labels}}",
        &built,
    ]);
    let labels: Value = serde_json::from_str(&labels).unwrap();
    assert_eq!(labels["io.gpubake.torch"], "2.9.1+cu128");
    let (ok, conf) = docker(&["run", "--rm", &built, "cat", "/etc/nccl.conf"]);
    assert!(ok);
    assert!(conf.contains("NCCL_P2P_LEVEL=NVL"), "{conf}");
    // The built-in template copies the probe from the context it is sent with.
    let (ok, version) = docker(&["run", "--rm", &built, "gpubake", "--version"]);
    assert!(
        ok && version.contains(env!("CARGO_PKG_VERSION")),
        "{version}"
    );

    // The same recipe built daemonless and loaded into the engine.
    let loaded = format!("gpubake-loaded:{id}");
    let out = gpubake(&[
        "build",
        "--without-python",
        &recipe,
        "--from",
        &format!("docker-daemon:{base}"),
        "--to",
        &format!("docker-daemon:{loaded}"),
    ]);
    assert_exit(&out, 0);
    // The digest the build names for the engine is the one the engine shows.
    let (ok, id_shown) = docker(&["image", "inspect", "--format", "{{.Id}}", &loaded]);
    assert!(ok);
    assert!(
        stdout(&out).contains(&format!("image ID {} in the engine", id_shown.trim())),
        "{}",
        stdout(&out)
    );
    let (ok, conf2) = docker(&["run", "--rm", &loaded, "cat", "/etc/nccl.conf"]);
    assert!(ok && conf2 == conf, "{conf2}");
    // Both paths label the image alike (a preflight image says so) and certify judges them
    // alike.
    let (_, loaded_labels) = docker(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config.Labels}}",
        &loaded,
    ]);
    let loaded_labels: Value = serde_json::from_str(&loaded_labels).unwrap();
    assert_eq!(
        labels, loaded_labels,
        "the two build paths label differently"
    );
    assert_eq!(labels["io.gpubake.python-stack"], "none", "{labels}");
    let (built_code, built_text) = certify(&format!("docker-daemon:{built}"), &[]);
    let (loaded_code, loaded_text) = certify(&format!("docker-daemon:{loaded}"), &[]);
    assert_eq!(
        (built_code, loaded_code),
        (0, 0),
        "{built_text}\n{loaded_text}"
    );

    for image in [&built, &loaded, &base] {
        engine.remove_image(image);
    }
}

#[test]
fn refused_engine_builds_leave_no_tag() {
    if !common::tools() {
        return;
    }
    let Some(engine) = engine() else { return };
    let dir = tempfile::tempdir().unwrap();
    let id = std::process::id();
    let base = format!("gpubake-test-base2:{id}");
    load_base(&engine, dir.path(), &base);
    let recipe = write(dir.path(), "r.yaml", "name: eb\nbase: x\npytorch: '2.9'\n");
    let failing = write(
        dir.path(),
        "fail.tmpl",
        "FROM {{ lock.base }}\nRUN echo step-two\nRUN false\nLABEL never=1\n",
    );
    let tag = format!("gpubake-refused:{id}");
    let out = gpubake(&[
        "build",
        &recipe,
        "--engine-build",
        "--without-python",
        "--template",
        &failing,
        "--from",
        &format!("docker-daemon:{base}"),
        "--to",
        &format!("docker-daemon:{tag}"),
    ]);
    assert_exit(&out, 2);
    let err = common::stderr(&out);
    assert!(
        err.contains("the build failed at Step 3/4 : RUN false"),
        "{err}"
    );
    assert!(!engine.has_image(&tag), "a failed build left {tag} behind");

    let out = gpubake(&[
        "build",
        &recipe,
        "--engine-build",
        "--without-python",
        "--template",
        &failing,
        "--from",
        "docker-daemon:gpubake-no-such-base:never",
        "--to",
        &format!("docker-daemon:{tag}"),
    ]);
    assert_exit(&out, 2);
    assert!(
        common::stderr(&out).contains("the build failed"),
        "{}",
        common::stderr(&out)
    );
    assert!(!engine.has_image(&tag));
    engine.remove_image(&base);
}

/// A build whose engine goes away midway reports it (exit 3) and leaves no tag: the engine
/// is reached through a socat proxy that the test kills while a step runs.
#[test]
fn losing_the_engine_mid_build_leaves_no_tag() {
    if !common::tools() {
        return;
    }
    let Some(engine) = engine() else { return };
    if Command::new("socat").arg("-V").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "CI installs socat");
        eprintln!("skipped: socat is not installed");
        return;
    }
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let id = std::process::id();
    let base = format!("gpubake-test-base3:{id}");
    load_base(&engine, dir.path(), &base);
    let socket = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(String::from))
        .unwrap_or_else(|| "/var/run/docker.sock".into());
    let proxy = dir.path().join("proxy.sock");
    let mut socat = Command::new("socat")
        .arg(format!("UNIX-LISTEN:{},fork", proxy.display()))
        .arg(format!("UNIX-CONNECT:{socket}"))
        .process_group(0)
        .spawn()
        .unwrap();
    while !proxy.exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let recipe = write(dir.path(), "r.yaml", "name: eb\nbase: x\npytorch: '2.9'\n");
    let slow = write(
        dir.path(),
        "slow.tmpl",
        "FROM {{ lock.base }}\nRUN sleep 8\nLABEL done=1\n",
    );
    let tag = format!("gpubake-cut:{id}");
    let build = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args([
            "build",
            &recipe,
            "--engine-build",
            "--without-python",
            "--template",
            &slow,
        ])
        .args([
            "--from",
            &format!("docker-daemon:{base}"),
            "--to",
            &format!("docker-daemon:{tag}"),
        ])
        .env("DOCKER_HOST", format!("unix://{}", proxy.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    // Cut every connection: socat and the children it forked share one process group.
    let _ = Command::new("kill")
        .arg("--")
        .arg(format!("-{}", socat.id()))
        .status();
    let _ = socat.wait();
    let out = build.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lost the engine at"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Give the engine time to notice the cancelled request, then check nothing was tagged.
    std::thread::sleep(std::time::Duration::from_secs(8));
    assert!(
        !engine.has_image(&tag),
        "a build cut midway left {tag} behind"
    );
    engine.remove_image(&base);
}

/// A CDI spec for a node with no GPU: the `nvidia.com/gpu=all` device exists but brings no
/// device node and no driver library, as a spec generated on a GPU-less CI runner would.
fn gpu_less_cdi_spec(dir: &Path, env: &str) -> std::path::PathBuf {
    let specs = dir.join("cdi");
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::write(
        specs.join("nvidia.yaml"),
        format!(
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n  containerEdits:\n    env: [{env}]\n"
        ),
    )
    .unwrap();
    specs
}

/// The OCI runtime the tests run: runc where it is installed (it comes with the Docker
/// Engine and runs on hybrid cgroup hierarchies, which Debian's crun 1.8 refuses), else crun.
fn oci_runtime() -> Option<&'static str> {
    let found = ["runc", "crun"]
        .into_iter()
        .find(|r| common::have(r, "--version"));
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs crun (scripts/test)"
        );
        eprintln!("skipped: neither runc nor crun is installed (scripts/test installs crun)");
    }
    found
}

/// The runtime path end to end on a machine without GPUs: the image is unpacked into a bundle,
/// the runtime runs the probe in it with the CDI spec's edits, the probe finds no GPU, and certify
/// says the environment lacks it (exit 3) with the CDI preflight in the report.
#[test]
fn under_an_oci_runtime_with_a_gpu_less_cdi_spec_the_probe_runs_and_certify_exits_3() {
    if Path::new("/dev/nvidia0").exists() || !common::tools() {
        return;
    }
    let Some(runtime) = oci_runtime() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let specs = gpu_less_cdi_spec(dir.path(), "NVIDIA_VISIBLE_DEVICES=void");
    let cert = dir.path().join("cert.json");
    let out = gpubake(&[
        "certify",
        &image,
        "--runtime",
        runtime,
        "--cdi-spec-dir",
        specs.to_str().unwrap(),
        "--out",
        cert.to_str().unwrap(),
    ]);
    assert_exit(&out, 3);
    let text = stdout(&out);
    assert!(text.contains("PASS  CDI spec"), "{text}");
    assert!(text.contains("the container saw no GPU"), "{text}");
    let c: Value = serde_json::from_slice(&std::fs::read(&cert).unwrap()).unwrap();
    assert_eq!(c["title"], "certify");
    assert_eq!(c["facts"]["runtime"]["devices"][0], "nvidia.com/gpu=all");
    // The probe's own report came back from inside the container, with the CDI environment.
    let probe_checks = c["facts"]["probe"]["checks"].as_array().unwrap();
    assert!(
        probe_checks.iter().any(|c| c["phase"] == "nvml"),
        "{probe_checks:?}"
    );
    assert!(
        c["facts"]["probe"]["facts"].to_string().contains("void")
            || text.contains("NVIDIA_VISIBLE_DEVICES"),
        "the spec's environment reached the container: {text}"
    );
    // Run as a training job is run, and the report says so; the probe inside saw it.
    let settings = c["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "container settings")
        .unwrap_or_else(|| panic!("{text}"));
    let detail = settings["detail"].as_str().unwrap();
    assert!(
        detail.contains("run as a training job is run")
            && detail.contains("the host's IPC namespace and /dev/shm")
            && detail.contains("--ulimit stack="),
        "{detail}"
    );
    let limit = |name: &str| {
        probe_checks
            .iter()
            .find(|c| c["phase"] == "limits" && c["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {probe_checks:?}"))
            .clone()
    };
    assert_eq!(limit("IPC namespace")["status"], "PASS");
    assert!(
        limit("IPC namespace")["detail"]
            .as_str()
            .unwrap()
            .starts_with("the host's"),
        "{text}"
    );
    assert_eq!(limit("/dev/shm")["status"], "PASS", "{text}");
}

/// No spec for the device asked for: the node lacks it, exit 3 naming where specs were sought.
#[test]
fn under_an_oci_runtime_without_a_cdi_spec_certify_exits_3_naming_the_spec() {
    if !common::tools() {
        return;
    }
    let Some(runtime) = oci_runtime() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let empty = dir.path().join("no-specs");
    let out = gpubake(&[
        "certify",
        &image,
        "--runtime",
        runtime,
        "--cdi-spec-dir",
        empty.to_str().unwrap(),
    ]);
    assert_exit(&out, 3);
    let text = stdout(&out);
    assert!(text.contains("FAIL  CDI spec"), "{text}");
    assert!(text.contains("nvidia-ctk cdi generate"), "{text}");
    // The directory searched is the one given, not the default ones.
    assert!(text.contains(empty.to_str().unwrap()), "{text}");
    assert!(!text.contains("/etc/cdi"), "{text}");
}

/// A device the node's CDI spec does not list is a wrong name on the command line: exit 2
/// naming the devices the spec has, before anything runs, as `probe --devices 7` is.
#[test]
fn a_device_the_cdi_spec_lacks_is_bad_input_naming_the_devices_it_has() {
    if !common::tools() {
        return;
    }
    let Some(runtime) = oci_runtime() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let specs = gpu_less_cdi_spec(dir.path(), "NVIDIA_VISIBLE_DEVICES=void");
    let out = gpubake(&[
        "certify",
        &image,
        "--runtime",
        runtime,
        "--cdi-spec-dir",
        specs.to_str().unwrap(),
        "--device",
        "nvidia.com/gpu=5",
    ]);
    assert_exit(&out, 2);
    let err = common::stderr(&out);
    assert!(
        err.contains("nvidia.com/gpu=5") && err.contains("has no device `5`; it has all"),
        "{err}"
    );
    assert!(stdout(&out).is_empty(), "nothing ran: {}", stdout(&out));
}

/// A CDI spec left by an older driver (it mounts a libcuda of 535.54.03 that is gone) is the
/// node's failure: exit 3, and the verdict line names the node's failing check, as the
/// README's exit codes say, not a generic "could not run here".
#[test]
fn a_cdi_spec_of_an_older_driver_is_the_node_s_failure_named_in_the_verdict() {
    if !common::tools() {
        return;
    }
    let Some(runtime) = oci_runtime() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let specs = dir.path().join("cdi");
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::write(
        specs.join("nvidia.yaml"),
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n  containerEdits:\n    env: [NVIDIA_VISIBLE_DEVICES=void]\ncontainerEdits:\n  mounts:\n  - {hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.535.54.03, containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.535.54.03, options: [ro, nosuid, nodev, bind]}\n",
    )
    .unwrap();
    let out = gpubake(&[
        "certify",
        &image,
        "--runtime",
        runtime,
        "--cdi-spec-dir",
        specs.to_str().unwrap(),
    ]);
    assert_exit(&out, 3);
    let text = stdout(&out);
    assert!(text.contains("FAIL  CDI driver libraries"), "{text}");
    let verdict = text.lines().last().unwrap_or("");
    assert!(
        verdict.contains("the node failed its preflight (CDI driver libraries")
            && verdict.contains("libcuda.so.535.54.03"),
        "{verdict}"
    );
}

/// A probe that cannot start in the container (here: the CDI spec's PATH hides it) gives no
/// report: a failure with the runtime's own words, never exit 3 and never a pass.
#[test]
fn a_probe_that_does_not_report_fails_certify_with_the_real_error() {
    if !common::tools() {
        return;
    }
    let Some(runtime) = oci_runtime() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let specs = gpu_less_cdi_spec(dir.path(), "PATH=/nowhere");
    let out = gpubake(&[
        "certify",
        &image,
        "--runtime",
        runtime,
        "--cdi-spec-dir",
        specs.to_str().unwrap(),
    ]);
    assert_exit(&out, 1);
    let text = stdout(&out);
    assert!(text.contains("without a report"), "{text}");
    assert!(text.contains("gpubake"), "{text}");
}

/// A probe that runs past its time is killed and fails certify (exit 1), not exit 3.
#[test]
fn a_probe_past_its_time_fails_certify() {
    if !common::tools() {
        return;
    }
    let Some(runtime) = oci_runtime() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let specs = gpu_less_cdi_spec(dir.path(), "NVIDIA_VISIBLE_DEVICES=void");
    let out = gpubake(&[
        "certify",
        &image,
        "--runtime",
        runtime,
        "--cdi-spec-dir",
        specs.to_str().unwrap(),
        "--probe-timeout",
        "0",
    ]);
    assert_exit(&out, 1);
    assert!(stdout(&out).contains("ran past 0 s"), "{}", stdout(&out));
}

/// `--policy` is read before anything else: a file that is not a policy is bad input (exit 2).
#[test]
fn a_policy_that_does_not_parse_is_bad_input() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let policy = write(dir.path(), "policy.yaml", "- match: H200\n  model: 7\n");
    let out = gpubake(&["certify", &image, "--policy", &policy]);
    assert_exit(&out, 2);
    assert!(
        common::stderr(&out).contains("policy.yaml"),
        "{}",
        common::stderr(&out)
    );
}

/// Files given to a container through the engine are in place before its command starts:
/// this is how `certify --policy` reaches the probe.
#[test]
fn files_reach_an_engine_container_before_it_starts() {
    if !common::tools() {
        return;
    }
    let Some(engine) = engine() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tag = "gpubake-test-files:v1";
    load_base(&engine, dir.path(), tag);
    let run = engine
        .run(
            tag,
            &["cat", "/etc/gpubake/certify-policy.yaml"],
            &[("/etc/gpubake/certify-policy.yaml", b"- match: X\n".to_vec())],
            &Gpus::None,
            std::time::Duration::from_secs(60),
        )
        .unwrap();
    engine.remove_image(tag);
    assert_eq!(run.exit_code, 0, "{}", run.stderr);
    assert_eq!(run.stdout, "- match: X\n");
}

/// A layer whose compressed stream is broken (not only its digest) is a failed check: certify
/// exits 1 and still writes its certificate and JUnit file, as `verify` reports it.
#[test]
fn a_corrupt_layer_fails_certify_and_the_outputs_are_still_written() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let report: Value =
        serde_json::from_str(&stdout(&gpubake(&["inspect", &image, "--json"]))).unwrap();
    for layer in report["layers"].as_array().unwrap() {
        let digest = layer["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:");
        let blob = dir.path().join("out/blobs/sha256").join(digest);
        let mut bytes = std::fs::read(&blob).unwrap();
        // Garble the deflate stream itself past the gzip header.
        let start = 10.min(bytes.len());
        let end = (start + 256).min(bytes.len());
        for b in &mut bytes[start..end] {
            *b = 0xff;
        }
        // A new file: the blob's hard links elsewhere keep their bytes.
        std::fs::remove_file(&blob).unwrap();
        std::fs::write(&blob, bytes).unwrap();
    }
    let cert = dir.path().join("cert.json");
    let junit = dir.path().join("cert.xml");
    let out = gpubake(&[
        "certify",
        &image,
        "--gpus",
        "all",
        "--out",
        cert.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_exit(&out, 1);
    let text = stdout(&out);
    assert!(text.contains("FAIL"), "{text}");
    assert!(
        text.contains("not run: the image failed its structure checks"),
        "{text}"
    );
    let c: Value = serde_json::from_slice(&std::fs::read(&cert).unwrap()).unwrap();
    assert!(
        c["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["status"] == "FAIL"),
        "{c}"
    );
    assert!(
        std::fs::read_to_string(&junit)
            .unwrap()
            .contains("<failure")
    );
}

/// An image the engine does not have is the name given, like a missing OCI directory (exit 2);
/// only an engine that does not answer is the environment (exit 3).
#[test]
fn an_image_the_engine_does_not_have_is_bad_input() {
    if engine().is_none() {
        return;
    }
    let out = gpubake(&["inspect", "docker-daemon:gpubake-no-such-image:never"]);
    assert_exit(&out, 2);
    assert!(
        common::stderr(&out).contains("the engine has no such image"),
        "{}",
        common::stderr(&out)
    );
}

/// Debian's crun 1.8 refuses hosts with a hybrid cgroup hierarchy (this CI machine's kind):
/// the runtime cannot create the container, which is the environment's lack (exit 3) in the
/// runtime's own words, not a failed image.
#[test]
fn a_runtime_that_cannot_create_the_container_is_exit_3_in_its_own_words() {
    let hybrid = Path::new("/sys/fs/cgroup/unified").is_dir()
        && std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers")
            .is_ok_and(|c| !c.trim().is_empty());
    if !hybrid || !common::tools() || !common::have("crun", "--version") {
        eprintln!("skipped: needs crun on a hybrid cgroup host");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build(dir.path(), "");
    let specs = gpu_less_cdi_spec(dir.path(), "NVIDIA_VISIBLE_DEVICES=void");
    let out = gpubake(&[
        "certify",
        &image,
        "--runtime",
        "crun",
        "--cdi-spec-dir",
        specs.to_str().unwrap(),
    ]);
    assert_exit(&out, 3);
    let text = stdout(&out);
    assert!(text.contains("could not create the container"), "{text}");
    assert!(text.contains("hybrid"), "{text}");
}

/// Lint of a recipe with the infiniband preset, certify's preset lint of the image and lint
/// of the image's own /etc/nccl.conf give one answer: the preset's `allow: [production-risk]`
/// on NCCL_NET is baked with the value (issue 40, finding 6).
#[test]
fn a_presets_allowance_gives_one_answer_in_lint_certify_and_the_baked_nccl_conf() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(
        dir.path(),
        "ib.yaml",
        "name: ib\nbase: x\npytorch: '2.9'\npresets: [base, infiniband]\n",
    );
    let lint = gpubake(&["lint", &recipe]);
    assert!(
        !stdout(&lint).contains("production-risk"),
        "{}",
        stdout(&lint)
    );
    let image = format!("oci:{}:v1", dir.path().join("out").display());
    assert_exit(&gpubake(&build_args(&recipe, &from_base(), &image, &[])), 0);
    // The busybox base has no libibverbs, which certify fails apart; the preset lint passes.
    let (_, text) = certify(&image, &[]);
    assert!(text.contains("PASS  NCCL preset lint"), "{text}");

    let bundle = dir.path().join("bundle");
    let out = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:v1", dir.path().join("out").display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let conf = bundle.join("rootfs/etc/nccl.conf");
    let lint = gpubake(&["lint", "--nccl", "2.27.5", conf.to_str().unwrap()]);
    assert_exit(&lint, 0);
    assert!(
        stdout(&lint).contains("1 file checked: 0 errors, 0 warnings"),
        "{}\n{}",
        std::fs::read_to_string(&conf).unwrap(),
        stdout(&lint)
    );
}
