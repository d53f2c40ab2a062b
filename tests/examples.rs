//! The README's own example image and the shipped example recipes, used as the README tells a
//! new user to: `scripts/make-debian-base`, `resolve -o`, `build --from --to`, then `certify
//! --gpus none`, which must certify them. One test builds them all so that the training images
//! share one download of the wheels and one write of their layers (the multi-node image takes
//! every stack layer from the cache), and removes its images as it goes: a PyTorch image is
//! about 4 GB.

mod common;

use common::{assert_exit, gpubake_in, stderr, stdout};
use std::path::Path;

/// `resolve --from -o` then `build` of `recipe` (a path under examples/) on the Debian base
/// into a layout in `dir`, as the README's tour runs them (`--from`: the base's glibc and apt
/// sources, which a recipe with `system:` resolves against); returns the image's reference.
fn build_example(dir: &Path, recipe: &str, base: &str) -> String {
    let lock = lock_path(dir, recipe);
    let out = gpubake_in(
        &common::root(),
        &[
            "resolve",
            recipe,
            "--from",
            base,
            "-o",
            lock.to_str().unwrap(),
        ],
    );
    assert_exit(&out, 0);
    let image = format!("oci:{}:v1", dir.join("out").display());
    let out = gpubake_in(
        &common::root(),
        &[
            "build",
            recipe,
            "--pylock",
            dir.join(closure_name(recipe)).to_str().unwrap(),
            "--lock",
            lock.to_str().unwrap(),
            "--from",
            base,
            "--to",
            &image,
        ],
    );
    assert_exit(&out, 0);
    image
}

/// Where `build_example` writes the lock of `recipe`.
fn lock_path(dir: &Path, recipe: &str) -> std::path::PathBuf {
    dir.join(format!("{}.lock", recipe.replace('/', "-")))
}

/// The digest of `image`'s layer of OS packages (`system:`), from `inspect --json`.
fn os_layer(image: &str) -> String {
    let out = gpubake_in(&common::root(), &["inspect", image, "--json"]);
    assert_exit(&out, 0);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let layers = report["layers"].as_array().unwrap();
    let system: Vec<_> = layers
        .iter()
        .filter(|l| {
            l["created_by"]
                .as_str()
                .unwrap()
                .starts_with("gpubake: system packages ")
        })
        .collect();
    assert_eq!(system.len(), 1, "{image}: {layers:?}");
    system[0]["digest"].as_str().unwrap().to_string()
}

/// The pylock `resolve -o` writes beside the lock for `recipe`: pylock.NAME.toml, NAME the
/// recipe's `name:`.
fn closure_name(recipe: &str) -> String {
    let text = std::fs::read_to_string(common::root().join(recipe)).unwrap();
    let name = text
        .lines()
        .find_map(|l| l.strip_prefix("name: "))
        .expect("the recipe has a name")
        .trim();
    gpubake::closure::file_name(name)
}

/// `certify IMAGE --gpus none` certifies it, on its static checks: exit 0, no check failed, the
/// link closure judged.
fn certifies(image: &str) -> String {
    let out = gpubake_in(&common::root(), &["certify", image, "--gpus", "none"]);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{image}:\n{text}\n{}",
        stderr(&out)
    );
    assert!(
        text.contains("certified on the static checks only"),
        "{text}"
    );
    assert!(!text.contains("FAIL "), "{text}");
    let closure = text
        .lines()
        .find(|l| l.contains("link closure"))
        .unwrap_or_else(|| panic!("no link closure check:\n{text}"));
    assert!(!closure.trim_start().starts_with("SKIP"), "{closure}");
    text
}

#[test]
fn the_readme_image_and_the_example_recipes_build_and_certify() {
    let Some(base) = common::debian_base() else {
        return;
    };
    if !common::tools() || !common::have("uv", "--version") {
        return;
    }
    let base = format!("oci:{}:bookworm", base.display());
    let dir = tempfile::tempdir().unwrap();

    // The README's image: PyTorch 2.9 with its CUDA wheels on Debian bookworm.
    let train = dir.path().join("train");
    std::fs::create_dir_all(&train).unwrap();
    let image = build_example(&train, "examples/debian-pytorch2.9.yaml", &base);
    let text = certifies(&image);
    assert!(text.contains("PASS  pins vs content"), "{text}");
    // The wheels' optional plugins are named with what would select them, and nothing in the
    // image selects them.
    let closure = text.lines().find(|l| l.contains("link closure")).unwrap();
    assert!(
        closure.contains("nvshmem_transport_ucx.so.3")
            && closure.contains("NVSHMEM_REMOTE_TRANSPORT=ucx"),
        "{closure}"
    );
    let _ = std::fs::remove_dir_all(&train);

    // The multi-node image: the same stack with the RDMA userspace, libfabric, UCX, Open MPI,
    // numactl and ssh.
    let multi = dir.path().join("multinode");
    std::fs::create_dir_all(&multi).unwrap();
    let image = build_example(&multi, "examples/debian-multinode.yaml", &base);
    let text = certifies(&image);
    // The OS layer gives every optional plugin of the nvshmem and cuFile wheels what it
    // needs (MPI, PMIx, OpenSHMEM, libfabric with its PSM alternative, UCX, rdma-core): none
    // is left that could not load.
    let closure = text.lines().find(|l| l.contains("link closure")).unwrap();
    for plugin in [
        "libibverbs.so.1",
        "nvshmem_bootstrap_mpi",
        "nvshmem_bootstrap_pmix",
        "nvshmem_bootstrap_shmem",
        "nvshmem_transport_libfabric",
        "nvshmem_transport_ucx",
        "nvshmem_transport_ibgda",
        "libcufile_rdma",
    ] {
        assert!(!closure.contains(plugin), "{plugin}: {closure}");
    }
    // In a container, the loader cache the OS layer settled answers Python's find_library
    // (what a user debugging RDMA types first), and mpirun is Open MPI's, by its alternative.
    // The container runs the recipe's node preflight image (`--without-python`, the Debian
    // base's own python3): the same OS layer, byte for byte, without the 10 GB the engine
    // would unpack for the PyTorch stack, which no check here reads.
    if common::have("docker", "version") {
        let preflight = format!("oci:{}:preflight", multi.join("out").display());
        let out = gpubake_in(
            &common::root(),
            &[
                "build",
                "examples/debian-multinode.yaml",
                "--lock",
                lock_path(&multi, "examples/debian-multinode.yaml")
                    .to_str()
                    .unwrap(),
                "--without-python",
                "--from",
                &base,
                "--to",
                &preflight,
            ],
        );
        assert_exit(&out, 0);
        assert_eq!(os_layer(&preflight), os_layer(&image));
        let tag = "gpubake-example-multinode:v1";
        let out = gpubake_in(
            &common::root(),
            &["copy", &preflight, &format!("docker-daemon:{tag}")],
        );
        assert_exit(&out, 0);
        let run = std::process::Command::new("docker")
            .args(["run", "--rm", "--entrypoint", "sh", tag, "-c"])
            .arg(
                "python3 -c \"import ctypes.util; print(ctypes.util.find_library('ibverbs'))\" \
                 && readlink -f /usr/bin/mpirun",
            )
            .output()
            .unwrap();
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", tag])
            .output();
        let said = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert_eq!(
            said.lines().collect::<Vec<_>>(),
            ["libibverbs.so.1", "/usr/bin/orterun"],
            "{said}"
        );
    } else {
        assert!(std::env::var_os("CI").is_none(), "CI has a Docker Engine");
        eprintln!("skipped: no Docker Engine to run the multi-node image in");
    }
    let _ = std::fs::remove_dir_all(&multi);
}
