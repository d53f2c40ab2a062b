//! A gpubake eStargz image pulled lazily by the real thing: Debian's containerd on a private
//! root and socket, the stargz snapshotter as its proxy snapshotter (tests/stargz-daemon,
//! built from Debian's source of the snapshotter) and Debian's docker-registry on 127.0.0.1.
//! `ctr-remote image rpull` pulls the image, `ctr run --snapshotter stargz` runs it; the
//! snapshotter's own log says whether it mounted each layer remotely and verified its TOC,
//! and the registry's log says how many bytes of each blob it served.
//!
//! Needs root (containerd mounts), /dev/fuse and the tools scripts/test installs; skipped
//! with the reason otherwise. Every daemon is stopped by its PID.

mod common;
#[allow(dead_code)]
#[path = "common/local_registry.rs"]
mod local_registry;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn runs_here() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        eprintln!("skipped: containerd needs root to mount snapshots");
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse for the snapshotter's mounts");
        return false;
    }
    common::tools()
        && common::have("containerd", "--version")
        && common::have("ctr", "--version")
        && common::have("ctr-remote", "--version")
        && common::have("runc", "--version")
        && common::have("docker-registry", "--version")
        && common::have("fusermount", "-V")
}

/// A daemon the test started, stopped by its PID with `signal` (then killed) when dropped.
struct Daemon {
    child: Child,
    signal: &'static str,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill")
            .args(["-s", self.signal, &pid])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(command: &mut Command, log: &Path, signal: &'static str) -> Daemon {
    let file = std::fs::File::create(log).unwrap();
    let child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    Daemon { child, signal }
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// containerd and the stargz snapshotter, each on a fresh root under `dir`: snapshots are
/// kept by chain ID, so a second pull of the same layers on the same roots reads nothing.
struct Node {
    dir: PathBuf,
    // Dropped in this order: the snapshotter first (it unmounts), then containerd.
    _stargz: Daemon,
    _containerd: Daemon,
}

impl Node {
    fn start(dir: &Path, daemon: &Path) -> Node {
        std::fs::create_dir_all(dir.join("run")).unwrap();
        let config = dir.join("containerd.toml");
        let d = dir.display();
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{d}/containerd-root\"\nstate = \"{d}/containerd-state\"\n\
                 [grpc]\n  address = \"{d}/run/containerd.sock\"\n\
                 [ttrpc]\n  address = \"{d}/run/containerd.sock.ttrpc\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\"]\n  disable_tcp_service = true\n\
                 [proxy_plugins]\n  [proxy_plugins.stargz]\n    type = \"snapshot\"\n    \
                 address = \"{d}/run/stargz.sock\"\n"
            ),
        )
        .unwrap();
        // On-demand reads only: what the registry serves is what the job read. Said in the
        // snapshotter's config.toml, as a node says it.
        let stargz_config = dir.join("stargz.toml");
        std::fs::write(&stargz_config, "no_background_fetch = true\n").unwrap();
        let stargz = spawn(
            Command::new(daemon)
                .arg("-address")
                .arg(dir.join("run/stargz.sock"))
                .arg("-root")
                .arg(dir.join("stargz-root"))
                .arg("-config")
                .arg(&stargz_config),
            &dir.join("stargz.log"),
            "INT",
        );
        wait_until("the stargz snapshotter", || {
            dir.join("run/stargz.sock").exists()
        });
        let containerd = spawn(
            Command::new("containerd").arg("--config").arg(&config),
            &dir.join("containerd.log"),
            "TERM",
        );
        let node = Node {
            dir: dir.to_path_buf(),
            _stargz: stargz,
            _containerd: containerd,
        };
        wait_until("containerd", || {
            node.ctr("ctr", &["version"]).status.success()
        });
        node
    }

    fn ctr(&self, tool: &str, args: &[&str]) -> Output {
        Command::new(tool)
            .arg("--address")
            .arg(self.dir.join("run/containerd.sock"))
            .args(["-n", "gpubake-test"])
            .args(args)
            .output()
            .unwrap()
    }

    /// Pulls `image` lazily and runs `cmd` in it under the stargz snapshotter.
    fn pull_and_run(&self, image: &str, cmd: &[&str]) -> String {
        let pulled = self.ctr("ctr-remote", &["image", "rpull", "--plain-http", image]);
        assert!(pulled.status.success(), "rpull: {pulled:?}");
        let mut args = vec!["run", "--rm", "--snapshotter", "stargz", image, "lazy-test"];
        args.extend(cmd);
        let ran = self.ctr("ctr", &args);
        assert!(
            ran.status.success(),
            "ctr run: {}\n{}",
            String::from_utf8_lossy(&ran.stderr),
            self.log()
        );
        String::from_utf8_lossy(&ran.stdout).into_owned()
    }

    /// The snapshotter's log: JSON lines.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stargz.log")).unwrap_or_default()
    }

    /// The snapshotter's verdicts on the layers it was asked to mount remotely: each
    /// `remote-snapshot-prepared` line's value, with its error.
    fn verdicts(&self) -> Vec<(String, String)> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| {
                let said = v["remote-snapshot-prepared"].as_str()?.to_string();
                Some((said, v["error"].as_str().unwrap_or_default().to_string()))
            })
            .collect()
    }
}

/// Bytes the registry served of `digest`, from its access log.
fn served(registry_log: &Path, digest: &str) -> u64 {
    let log = std::fs::read_to_string(registry_log).unwrap();
    log.lines()
        .filter(|l| l.contains("response completed") && l.contains(digest))
        .filter_map(|l| l.split("http.response.written=").nth(1))
        .filter_map(|n| n.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A copy of the layout at `from` in `to` whose last layer's descriptor names a TOC of
/// zeros: a new manifest in the index, the blobs unchanged.
fn with_wrong_toc(from: &Path, to: &Path) {
    let copied = Command::new("cp")
        .arg("-r")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(copied.success());
    let index_path = to.join("index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let blob = |digest: &str| {
        to.join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let old = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(blob(&old)).unwrap()).unwrap();
    let last = manifest["layers"].as_array().unwrap().len() - 1;
    manifest["layers"][last]["annotations"]["containerd.io/snapshot/stargz/toc.digest"] =
        format!("sha256:{}", "0".repeat(64)).into();
    let bytes = serde_json::to_vec(&manifest).unwrap();
    let digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes))
    );
    std::fs::write(blob(&digest), &bytes).unwrap();
    index["manifests"][0]["digest"] = digest.into();
    index["manifests"][0]["size"] = bytes.len().into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
}

fn gpubake(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(args)
        .current_dir(common::root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpubake {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The snapshotter's daemon refuses a config.toml it cannot take whole, naming the file and
/// the key: a misspelt key would otherwise leave the default in place unnoticed.
#[test]
fn the_snapshotter_refuses_a_config_with_an_unknown_key_or_a_bad_value() {
    let Some(daemon) = common::go::build("stargz-daemon", &["service/resolver/cri.go"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (text, said) in [
        (
            "[blob]\nchunk_sise = 4194304\n",
            "unknown keys [blob.chunk_sise]",
        ),
        ("[blob]\nchunk_size = \"big\"\n", "incompatible types"),
        ("[blob\n", "cannot read"),
    ] {
        let config = dir.path().join("stargz.toml");
        std::fs::write(&config, text).unwrap();
        let out = Command::new(&daemon)
            .arg("-address")
            .arg(dir.path().join("stargz.sock"))
            .arg("-root")
            .arg(dir.path().join("root"))
            .arg("-config")
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text:?} was taken: {stderr}");
        assert!(
            stderr.contains(said) && stderr.contains(config.to_str().unwrap()),
            "{text:?}: {stderr}"
        );
        assert!(
            !dir.path().join("stargz.sock").exists(),
            "{text:?}: it served"
        );
    }
}

#[test]
fn an_estargz_image_is_pulled_lazily_and_a_wrong_toc_falls_back_to_a_full_pull() {
    if !runs_here() {
        return;
    }
    let Some(daemon) = common::go::build("stargz-daemon", &["service/resolver/cri.go"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let recipe = d.join("recipe.yaml");
    std::fs::write(
        &recipe,
        "name: lazy\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base, nvlink]\n",
    )
    .unwrap();
    let layout = d.join("layout");
    let report = common::build_json_in(
        &common::root(),
        recipe.to_str().unwrap(),
        &format!("oci:{}:v1", layout.display()),
        &["--compression", "estargz"],
    );
    // Logging every response, with the bytes it served.
    let registry = local_registry::local_registry_logging(d, "info");
    let addr = registry.1.clone();
    let image = format!("{addr}/gpubake/lazy:v1");
    gpubake(&[
        "copy",
        &format!("oci:{}:v1", layout.display()),
        &format!("docker://{image}"),
    ]);

    // Every layer mounted remotely, its TOC verified against the descriptor; the container
    // reads the presets layer's nccl.conf, and of the probe layer (the gpubake binary, the
    // largest) the registry serves only the footer and the TOC.
    let node = Node::start(&d.join("node-1"), &daemon);
    let out = node.pull_and_run(&image, &["/bin/cat", "/etc/nccl.conf"]);
    assert!(out.contains("NCCL_DEBUG="), "{out}");
    let verdicts = node.verdicts();
    let layers = report["layers"].as_array().unwrap();
    assert_eq!(
        verdicts.iter().filter(|(said, _)| said == "true").count(),
        layers.len(),
        "{verdicts:?}"
    );
    assert!(
        node.log().contains("\"msg\":\"verified\""),
        "{}",
        node.log()
    );
    let probe = layers
        .iter()
        .max_by_key(|l| l["size"].as_u64().unwrap())
        .unwrap();
    let probe_digest = probe["digest"].as_str().unwrap();
    let fetched = served(&d.join("registry.log"), probe_digest);
    let size = probe["size"].as_u64().unwrap();
    println!("the registry served {fetched} of the probe layer's {size} bytes");
    assert!(
        fetched < size / 10,
        "the registry served {fetched} of the {size} bytes of the probe layer"
    );
    drop(node);

    // The descriptor of the presets layer names another TOC: the snapshotter refuses to mount
    // it, and containerd pulls and unpacks that layer as plain gzip.
    let wrong = d.join("wrong-toc");
    with_wrong_toc(&layout, &wrong);
    let bad = format!("{addr}/gpubake/lazy:wrong-toc");
    gpubake(&[
        "copy",
        &format!("oci:{}:v1", wrong.display()),
        &format!("docker://{bad}"),
    ]);
    let node = Node::start(&d.join("node-2"), &daemon);
    let out = node.pull_and_run(&bad, &["/bin/cat", "/etc/nccl.conf"]);
    assert!(out.contains("NCCL_DEBUG="), "{out}");
    let verdicts = node.verdicts();
    assert!(
        verdicts
            .iter()
            .any(|(said, error)| said == "false" && error.contains("invalid TOC JSON")),
        "{verdicts:?}"
    );
}

/// An image laid out by a start-up record (`build --startup-record`), as eStargz and as
/// zstd:chunked: the snapshotter mounts every layer remotely and prefetches each recorded
/// layer up to its `.prefetch.landmark`, exactly the landmark's offset by its own log,
/// before the container imports what the record names; a layer the record does not touch
/// is prefetched not at all.
#[test]
fn a_recorded_start_up_is_prefetched_up_to_the_landmark() {
    use gpubake::startup::{FORMAT, FileRead, StartupRecord};
    if !runs_here() {
        return;
    }
    let Some(base) = common::debian_base() else {
        return;
    };
    let (Some(daemon), Some(checker)) = (
        common::go::build("stargz-daemon", &["service/resolver/cri.go"]),
        common::toc::checker(),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (loaded, resolved) = common::stack::resolve_text(
        &d.join("recipe.yaml"),
        "name: lazy-stack\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
         presets: [base]\npip: [tqdm==4.67.1]\n",
    );
    let closure = gpubake::closure::parse(
        Path::new("pylock.small.toml"),
        include_str!("fixtures/pylock.small.toml"),
    )
    .unwrap();
    let torch = &resolved.lock.torch;
    let read = |path: &str| FileRead {
        path: format!("site-packages/{path}"),
        size: 1,
        read: 1,
    };
    let record = StartupRecord {
        format: FORMAT.into(),
        torch: format!("{}+{}", torch.version, torch.variant),
        python: "3.11.2".into(),
        steps: vec!["import torch".into()],
        gpu: None,
        files: vec![
            read("tqdm/__init__.py"),
            read("tqdm/std.py"),
            read("tqdm/version.py"),
        ],
    };
    let registry = local_registry::local_registry_logging(d, "info");
    for compression in [
        gpubake::image::Compression::Estargz,
        gpubake::image::Compression::ZstdChunked,
    ] {
        let name = compression.name().replace(':', "-");
        let layout = d.join(format!("layout-{name}"));
        let mut opts = common::stack::build_options(
            &format!("oci:{}:bookworm", base.display()),
            &format!("oci:{}:v1", layout.display()),
            Some(closure.clone()),
        );
        opts.compression = compression;
        opts.startup = Some((d.join("startup.json"), record.clone()));
        let report = gpubake::bake::build(&loaded, &resolved, &opts).unwrap();
        let image = format!("{}/gpubake/lazy-stack:{name}", registry.1);
        gpubake(&[
            "copy",
            &format!("oci:{}:v1", layout.display()),
            &format!("docker://{image}"),
        ]);
        let node = Node::start(&d.join(format!("node-{name}")), &daemon);
        prefetched_to_the_landmark(&node, &image, &layout, &report, &checker);
    }
}

fn prefetched_to_the_landmark(
    node: &Node,
    image: &str,
    layout: &Path,
    report: &gpubake::bake::BuildReport,
    checker: &Path,
) {
    let out = node.pull_and_run(
        image,
        &[
            "/opt/gpubake/venv/bin/python3",
            "-c",
            "import tqdm; print(tqdm.__version__)",
        ],
    );
    assert_eq!(out.trim(), "4.67.1");
    // Every layer, the base's rewritten ones too, mounted remotely.
    let verdicts = node.verdicts();
    assert_eq!(
        verdicts.iter().filter(|(said, _)| said == "true").count(),
        report.layers.len(),
        "{verdicts:?}"
    );
    // Each layer's prefetch, as the snapshotter logged it once the prefetch ended.
    let prefetched: Vec<(String, u64)> = node
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["operation"] == "prefetch_total")
        .filter_map(|v| {
            let size = v["msg"].as_str()?.split("prefetch_size=").nth(1)?;
            let size = size.split_whitespace().next()?.parse().ok()?;
            Some((v["layer_sha"].as_str()?.to_string(), size))
        })
        .collect();
    let of = |name: &str| {
        let l = report.layers.iter().find(|l| l.name == name).unwrap();
        let blob = layout
            .join("blobs/sha256")
            .join(l.digest.trim_start_matches("sha256:"));
        let toc = common::toc::toc_digest(layout, &l.digest);
        let fields = common::toc::check(checker, &blob, &toc).unwrap();
        let landmark: u64 = common::toc::field(&fields, "prefetch").parse().unwrap();
        let logged = prefetched
            .iter()
            .find(|(sha, _)| *sha == l.digest)
            .map(|(_, size)| *size);
        (landmark, logged)
    };
    let (landmark, logged) = of("extras");
    assert!(landmark > 0);
    assert_eq!(logged, Some(landmark), "{prefetched:?}\n{}", node.log());
    // The nvidia layer's files were not in the record: nothing of it before the start.
    let (landmark, logged) = of("nvidia");
    assert_eq!(landmark, 0);
    assert!(logged.is_none_or(|size| size == 0), "{prefetched:?}");
}
