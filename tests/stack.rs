//! The Python stack in real images: small real wheels from PyPI, fetched through the wheel
//! cache, installed natively into the venv over a real Debian base, then read back by skopeo
//! and umoci and run by the Docker Engine.

mod common;
#[path = "common/local_registry.rs"]
#[allow(dead_code)]
mod local_registry;

use common::stack::{build_options, wheel_cache};
use common::{assert_exit, have};
use gpubake::bake::BuildReport;
use gpubake::bake::render::{self, ContextPlan};
use gpubake::closure::{self, Closure};
use gpubake::document::Document;
use gpubake::recipe::LoadedRecipe;
use gpubake::resolve::{self, Resolved};
use gpubake::wheel::cache::{FetchOptions, WheelCache};
use std::path::Path;
use std::process::Command;

const SMALL: &str = include_str!("fixtures/pylock.small.toml");

/// six 1.17.0, the extra that the second recipe adds.
const SIX: &str = r#"
[[packages]]
name = "six"
version = "1.17.0"
wheels = [{ url = "https://files.pythonhosted.org/packages/b7/ce/149a00dd41f10bc29e5921b496af8b574d8413afcd5e30dfa0ed46c2cc5e/six-1.17.0-py2.py3-none-any.whl", size = 11050, hashes = { sha256 = "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274" } }]
"#;

/// pip 25.3, which a recipe that wants pip in its image lists in `pip:`.
const PIP: &str = r#"
[[packages]]
name = "pip"
version = "25.3"
wheels = [{ url = "https://files.pythonhosted.org/packages/44/3c/d717024885424591d5376220b5e836c2d5293ce2011523c9de23ff7bf068/pip-25.3-py3-none-any.whl", upload-time = 2025-10-25T00:55:39.247292Z, size = 1778622, hashes = { sha256 = "9655943313a94722b7774661c21049070f6bbb0a1516bf02f7c8d5d9201514cd" } }]
"#;

fn recipe(dir: &Path, python: &str, pip: &[&str]) -> (LoadedRecipe, Resolved) {
    let text = format!(
        "name: stack-test\nbase: debian:bookworm\npython: \"{python}\"\npytorch: \"2.9\"\n\
         presets: [base]\npip: [{}]\n",
        pip.join(", ")
    );
    let path = dir.join("recipe.yaml");
    std::fs::write(&path, &text).unwrap();
    let loaded =
        LoadedRecipe::parse(Document::from_text(path.display().to_string(), text)).unwrap();
    let resolved = resolve::resolve_recipe(&loaded, &resolve::Options::default()).unwrap();
    (loaded, resolved)
}

fn small_closure(extra: &str) -> Closure {
    closure::parse(Path::new("pylock.small.toml"), &format!("{SMALL}{extra}")).unwrap()
}

fn build(
    loaded: &LoadedRecipe,
    resolved: &Resolved,
    closure: Closure,
    base: &Path,
    to: &str,
) -> gpubake::Result<BuildReport> {
    let from = format!("oci:{}:bookworm", base.display());
    gpubake::bake::build(loaded, resolved, &build_options(&from, to, Some(closure)))
}

fn layer<'a>(report: &'a BuildReport, name: &str) -> &'a str {
    &report
        .layers
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no layer {name} in {:?}", report.layers))
        .digest
}

fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker").args(args).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_stack_installs_runs_and_reproduces_on_a_debian_base() {
    let Some(base) = common::debian_base() else {
        return;
    };
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (loaded, resolved) = recipe(dir.path(), "3.11", &["tqdm==4.67.1"]);

    let out_a = dir.path().join("a");
    let a = build(
        &loaded,
        &resolved,
        small_closure(""),
        &base,
        &format!("oci:{}:v1", out_a.display()),
    )
    .unwrap();
    let names: Vec<&str> = a.layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "base", "venv", "nvidia", "python", "extras", "probe", "presets"
        ],
        "{:?}",
        a.layers
    );
    // A fresh layout and the same inputs give the same image.
    let out_b = dir.path().join("b");
    let again = build(
        &loaded,
        &resolved,
        small_closure(""),
        &base,
        &format!("oci:{}:v1", out_b.display()),
    )
    .unwrap();
    assert_eq!(a.manifest, again.manifest);
    // ... taking every layer from the cache's layout rather than writing it again, each
    // blob a file of the layout's own (a reflink or a copy), never the cache's.
    for l in again.layers.iter().filter(|l| l.name != "base") {
        assert!(l.reused, "{} was written again: {:?}", l.name, again.layers);
        assert!(
            matches!(
                l.placed,
                Some(gpubake::fsutil::Placement::Copy | gpubake::fsutil::Placement::Reflink)
            ),
            "{}: {:?}",
            l.name,
            l.placed
        );
        let hex = l.digest.trim_start_matches("sha256:");
        let here = std::fs::metadata(out_b.join("blobs/sha256").join(hex)).unwrap();
        let cached = wheel_cache().join("layout/blobs/sha256").join(hex);
        let cached = std::fs::metadata(&cached).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(
            (here.dev(), here.ino()) != (cached.dev(), cached.ino()),
            "{} is the cache's own file",
            l.name
        );
        assert_eq!(here.len(), cached.len());
    }

    // A recipe that differs only in its extras shares every other stack layer.
    let (loaded6, resolved6) = recipe(dir.path(), "3.11", &["tqdm==4.67.1", "six==1.17.0"]);
    let six = build(
        &loaded6,
        &resolved6,
        small_closure(SIX),
        &base,
        &format!("oci:{}:six", out_a.display()),
    )
    .unwrap();
    for name in ["venv", "nvidia", "python"] {
        assert_eq!(layer(&a, name), layer(&six, name), "layer {name} differs");
    }
    assert_ne!(layer(&a, "extras"), layer(&six, "extras"));

    // Independent readers.
    let image = format!("oci:{}:v1", out_a.display());
    let out = Command::new("skopeo")
        .args(["inspect", &image])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bundle = dir.path().join("bundle");
    let out = Command::new("umoci")
        .args([
            "unpack",
            "--rootless",
            "--image",
            &format!("{}:v1", out_a.display()),
        ])
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let venv = bundle.join("rootfs/opt/gpubake/venv");
    let tqdm = std::fs::read_to_string(venv.join("bin/tqdm")).unwrap();
    assert!(
        tqdm.starts_with("#!/opt/gpubake/venv/bin/python\n"),
        "{tqdm}"
    );
    let rst2html = std::fs::read_to_string(venv.join("bin/rst2html.py")).unwrap();
    assert!(
        rst2html.starts_with("#!/opt/gpubake/venv/bin/python\n"),
        "{rst2html}"
    );
    // Nothing of the build host lands in the image: no bytecode, no host paths.
    let host = [
        wheel_cache().display().to_string(),
        env!("CARGO_MANIFEST_DIR").to_string(),
        dir.path().display().to_string(),
    ];
    for item in walkdir::WalkDir::new(&venv) {
        let item = item.unwrap();
        let name = item.file_name().to_string_lossy();
        assert!(!name.ends_with(".pyc"), "{}", item.path().display());
        if item.file_type().is_file() {
            let bytes = std::fs::read(item.path()).unwrap();
            for h in &host {
                assert!(
                    memchr::memmem::find(&bytes, h.as_bytes()).is_none(),
                    "{} holds the host path {h}",
                    item.path().display()
                );
            }
        }
    }
    // A training image whose lock names torch but that holds none is not certified.
    let out = common::gpubake(&["certify", &image, "--gpus", "none"]);
    assert_exit(&out, 1);
    let text = common::stdout(&out);
    assert!(
        text.contains("FAIL  pins vs content")
            && text.contains("the lock pins torch 2.9.1+cu128, but no torch is installed"),
        "{text}"
    );
    let nvtx = venv.join("lib/python3.11/site-packages/nvidia/nvtx/lib");
    assert!(
        nvtx.is_dir(),
        "the nvidia namespace is shared: {}",
        nvtx.display()
    );

    // The Docker Engine runs it: the venv's python is first on PATH and imports everything.
    if !have("docker", "info") {
        return;
    }
    let tag = format!("gpubake-stack-test:{}", std::process::id());
    let loaded_to = format!("docker-daemon:{tag}");
    build(&loaded, &resolved, small_closure(""), &base, &loaded_to).unwrap();
    let (ok, text) = docker(&[
        "run",
        "--rm",
        &tag,
        "sh",
        "-c",
        "python3 -c 'import sys, tqdm, markupsafe, docutils, nvidia.nvtx, nvidia.cuda_runtime; \
         print(sys.prefix, tqdm.__version__, markupsafe.__version__, docutils.__version__)' \
         && tqdm --version && rst2html.py --version && gpubake --version",
    ]);
    assert!(ok, "{text}");
    assert!(
        text.contains("/opt/gpubake/venv 4.67.1 3.0.4 0.20.1"),
        "{text}"
    );
    assert!(text.contains("Docutils 0.20.1"), "{text}");
    assert!(
        text.contains(concat!("gpubake ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );

    // The rendered Dockerfile, built by the engine from its context, installs the same tree.
    let engine_tag = format!("gpubake-stack-engine:{}", std::process::id());
    let base_tag = format!("gpubake-debian:{}", std::process::id());
    common::stack::base_into_engine(&base, &base_tag);
    let mut lock = resolved.lock.clone();
    lock.rebase(base_tag.clone());
    let plan = ContextPlan::for_recipe(&loaded, true).unwrap();
    let dockerfile = render::render(
        &lock,
        &plan,
        render::DEFAULT_TEMPLATE,
        "Dockerfile.template",
    )
    .unwrap();
    let closure = small_closure("");
    let cache = WheelCache::open(wheel_cache()).unwrap();
    cache
        .fetch(&closure.wheels, &FetchOptions::default())
        .unwrap();
    let entries = plan
        .entries(
            &dockerfile,
            Path::new(env!("CARGO_BIN_EXE_gpubake")),
            Some((&closure, &cache)),
        )
        .unwrap();
    let context = dir.path().join("context.tar");
    let file = std::fs::File::create(&context).unwrap();
    gpubake::image::layer::write_tar(&entries, 0, file, &context).unwrap();
    let engine = gpubake::engine::Engine::connect().unwrap();
    let mut log = Vec::new();
    let built = engine.build(&context, &engine_tag, |line| log.push(line.to_string()));
    let tree = "find /opt/gpubake/venv -printf '%p %y %m %s %l\\n' | sort; \
                python3 -c 'import importlib.metadata as m; \
                print(sorted((d.metadata[\"Name\"], d.version) for d in m.distributions()))'";
    let (ok_a, daemonless) = docker(&["run", "--rm", &tag, "sh", "-c", tree]);
    let (ok_b, engine_built) = if built.is_ok() {
        docker(&["run", "--rm", &engine_tag, "sh", "-c", tree])
    } else {
        (false, String::new())
    };
    // The labels and certify's verdict on the pins agree between the two paths.
    let labels =
        |t: &str| docker(&["image", "inspect", "--format", "{{json .Config.Labels}}", t]).1;
    let (labels_a, labels_b) = (labels(&tag), labels(&engine_tag));
    let pins = |t: &str| {
        let out = common::gpubake(&["certify", &format!("docker-daemon:{t}"), "--gpus", "none"]);
        let text = common::stdout(&out);
        let line = text
            .lines()
            .find(|l| l.contains("pins vs content"))
            .map(|l| l.split_whitespace().take(1).collect::<String>());
        (out.status.code(), line, text)
    };
    let (verdict_a, verdict_b) = if built.is_ok() {
        (pins(&tag), pins(&engine_tag))
    } else {
        Default::default()
    };
    for t in [&tag, &engine_tag, &base_tag] {
        let _ = docker(&["rmi", "-f", t]);
    }
    if let Err(e) = built {
        panic!("the engine build failed: {e}\n{}", log.join("\n"));
    }
    assert!(ok_a && ok_b, "{daemonless}\n{engine_built}");
    assert!(daemonless.contains("('tqdm', '4.67.1')"), "{daemonless}");
    assert_eq!(labels_a, labels_b, "the two build paths label differently");
    assert!(
        labels_a.contains(r#""io.gpubake.python-stack":"/opt/gpubake/venv""#),
        "{labels_a}"
    );
    // The small closure has no torch: both paths fail the same check, the same way.
    assert_eq!(
        (&verdict_a.0, &verdict_a.1),
        (&verdict_b.0, &verdict_b.1),
        "{}\n{}",
        verdict_a.2,
        verdict_b.2
    );
    assert_eq!(
        daemonless, engine_built,
        "the two build paths installed different trees"
    );
}

/// The venv has no pip unless the recipe lists it; listed, it is installed like any wheel and
/// runs in the container, as `pip` and as `python -m pip`, and sees the image's packages.
#[test]
fn pip_is_in_the_image_only_when_the_recipe_lists_it() {
    let Some(base) = common::debian_base() else {
        return;
    };
    if !common::tools() || !have("docker", "info") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (loaded, resolved) = recipe(dir.path(), "3.11", &["tqdm==4.67.1", "pip==25.3"]);
    let tag = format!("gpubake-stack-pip:{}", std::process::id());
    build(
        &loaded,
        &resolved,
        small_closure(PIP),
        &base,
        &format!("docker-daemon:{tag}"),
    )
    .unwrap();
    let (ok, text) = docker(&[
        "run",
        "--rm",
        &tag,
        "sh",
        "-c",
        "command -v pip && pip --version && python3 -m pip list --disable-pip-version-check",
    ]);
    let (_, created) = docker(&["image", "inspect", "--format", "{{.Created}}", &tag]);
    let _ = docker(&["rmi", "-f", &tag]);
    assert!(ok, "{text}");
    assert!(text.contains("/opt/gpubake/venv/bin/pip\n"), "{text}");
    assert!(
        text.contains("pip 25.3 from /opt/gpubake/venv/lib/python3.11/site-packages/pip"),
        "{text}"
    );
    assert!(text.contains("tqdm") && text.contains("4.67.1"), "{text}");
    // Dated by its newest input: the base's own date or markupsafe's wheel (2026-10-02, the
    // newest of the closure), whichever is later.
    let base_config = Command::new("skopeo")
        .args(["inspect", "--config", "--raw"])
        .arg(format!("oci:{}:bookworm", base.display()))
        .output()
        .unwrap();
    let base_config: serde_json::Value = serde_json::from_slice(&base_config.stdout).unwrap();
    let at = |t: &str| gpubake::units::parse_rfc3339(t).unwrap_or_else(|| panic!("{t}"));
    let want = at(base_config["created"]
        .as_str()
        .unwrap_or("1970-01-01T00:00:00Z"))
    .max(at("2026-10-02T23:04:41Z"));
    assert_eq!(at(created.trim()), want, "{created} {base_config}");

    let without = format!("gpubake-stack-nopip:{}", std::process::id());
    let (loaded, resolved) = recipe(dir.path(), "3.11", &["tqdm==4.67.1"]);
    build(
        &loaded,
        &resolved,
        small_closure(""),
        &base,
        &format!("docker-daemon:{without}"),
    )
    .unwrap();
    let (ok, text) = docker(&["run", "--rm", &without, "python3", "-m", "pip", "--version"]);
    let _ = docker(&["rmi", "-f", &without]);
    assert!(!ok && text.contains("No module named pip"), "{text}");
}

#[test]
fn a_base_with_another_python_is_refused_naming_it() {
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (loaded, resolved) = recipe(dir.path(), "3.12", &[]);
    let to = format!("oci:{}:v1", dir.path().join("out").display());
    let err = build(&loaded, &resolved, small_closure(""), &base, &to).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let text = err.to_string();
    assert!(
        text.contains("CPython 3.11 (/usr/bin/python3.11)"),
        "{text}"
    );
    assert!(text.contains("pins CPython 3.12"), "{text}");
    assert!(
        !dir.path().join("out/index.json").exists(),
        "nothing is tagged"
    );
}

#[test]
fn a_tampered_pylock_hash_is_refused_naming_the_wheel() {
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (loaded, resolved) = recipe(dir.path(), "3.11", &[]);
    let real = "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274";
    let fake = "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3275";
    let closure = closure::parse(
        Path::new("p.toml"),
        &format!("{SMALL}{}", SIX.replace(real, fake)),
    )
    .unwrap();
    let to = format!("oci:{}:v1", dir.path().join("out").display());
    let err = build(&loaded, &resolved, closure, &base, &to).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("six"), "{text}");
    assert!(text.contains(fake) && text.contains(real), "{text}");
    assert_eq!(err.exit_code(), 2, "{text}");
}

/// A requirement uv cannot find is placed at the recipe's `pip:` entry, with uv's words
/// under gpubake's and one `error:` (issue 40, finding 9).
#[test]
fn a_pip_typo_is_named_at_its_recipe_line_with_uvs_words_once() {
    if !have("uv", "--version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        "name: typo\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
         presets: [base]\npip:\n  - tqdm==4.67.1\n  - numpyy==2.3.4\n",
    );
    let lock = dir.path().join("r.lock");
    let out = common::gpubake(&["resolve", &recipe, "-o", lock.to_str().unwrap()]);
    let err = common::stderr(&out);
    if err.contains("cannot be reached") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: PyPI is not reachable");
        return;
    }
    assert_exit(&out, 2);
    assert!(
        err.contains(&format!(
            "\nerror: {recipe}:8:5: field `pip[1]`: no closure"
        )),
        "{err}"
    );
    assert!(
        err.contains("uv says:\n  ") && err.contains("numpyy"),
        "{err}"
    );
    assert_eq!(err.matches("error:").count(), 1, "{err}");
}

#[test]
fn resolve_writes_the_closure_beside_the_lock_with_every_hash() {
    if !have("uv", "--version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        "name: closure-test\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
         presets: [base]\npip: [tqdm==4.67.1]\n",
    );
    let lock = dir.path().join("r.lock");
    let out = common::gpubake(&["resolve", &recipe, "-o", lock.to_str().unwrap()]);
    if common::stderr(&out).contains("cannot be reached") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: PyPI is not reachable");
        return;
    }
    assert_exit(&out, 0);
    let path = dir.path().join("pylock.closure-test.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let closure = closure::parse(&path, &text).unwrap();
    let names: Vec<&str> = closure.wheels.iter().map(|w| w.name.as_str()).collect();
    for want in [
        "torch",
        "nvidia-nccl-cu12",
        "nvidia-cudnn-cu12",
        "tqdm",
        "triton",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(
        closure
            .wheels
            .iter()
            .all(|w| w.size.is_some() && w.sha256.len() == 64)
    );
    assert!(text.contains("[tool.gpubake]"), "{text}");
    // The lock it sits beside names exact versions only.
    let lock_text = std::fs::read_to_string(&lock).unwrap();
    assert!(
        lock_text.contains("nvidia-nccl-cu12: ==2.27.5"),
        "{lock_text}"
    );

    // The builds below need a base with CPython 3.11: a build checks its base first.
    let Some(base) = common::debian_base() else {
        return;
    };
    let from = format!("oci:{}:bookworm", base.display());
    let to = format!("oci:{}", dir.path().join("out").display());
    let cache = tempfile::tempdir().unwrap();

    // Without uv on PATH, a build from that pylock goes on past the closure (here to the
    // wheels, which an empty cache lacks offline): only resolving needs uv.
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["build", &recipe, "--offline", "--from", &from, "--to", &to])
        .env("PATH", "/nonexistent")
        .env("GPUBAKE_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = common::stderr(&out);
    assert!(
        err.contains("--offline:") && err.contains("not in the cache") && !err.contains("uv"),
        "{err}"
    );

    // A changed recipe makes that closure stale, and a build says so before any work.
    std::fs::write(
        &recipe,
        "name: closure-test\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
         presets: [base]\npip: [tqdm==4.67.0]\n",
    )
    .unwrap();
    let out = common::gpubake(&["build", &recipe, "--offline", "--from", &from, "--to", &to]);
    assert_exit(&out, 2);
    let err = common::stderr(&out);
    assert!(
        err.contains("is stale") && err.contains("tqdm==4.67.0"),
        "{err}"
    );
    // The hint is the command that writes it, with the build's --from (issue 40, finding 9).
    let again = format!(
        "run `gpubake resolve {recipe} -o {} --from {from}` again",
        dir.path().join("r.lock").display()
    );
    assert!(err.contains(&again), "{err}");

    // A closure that disagrees with the lock is refused, naming both versions.
    let tampered = text.replace("version = \"2.27.5\"", "version = \"2.27.3\"");
    let wrong = dir.path().join("pylock.wrong.toml");
    std::fs::write(&wrong, tampered).unwrap();
    std::fs::write(
        &recipe,
        "name: closure-test\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
         presets: [base]\npip: [tqdm==4.67.1]\n",
    )
    .unwrap();
    let out = common::gpubake(&[
        "build",
        &recipe,
        "--pylock",
        wrong.to_str().unwrap(),
        "--from",
        &from,
        "--to",
        &to,
    ]);
    assert_exit(&out, 2);
    let err = common::stderr(&out);
    assert!(
        err.contains("nvidia-nccl-cu12: the lock pins 2.27.5, the closure has 2.27.3"),
        "{err}"
    );
    assert!(!dir.path().join("out").exists(), "nothing was written");
}

/// Files in `dir`, by name.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_build_checks_its_base_before_it_resolves_or_writes() {
    if !common::tools() || !have("uv", "--version") {
        return;
    }
    // The recipe of a new user, on a base without CPython: the build fails naming that,
    // before any resolution (none reaches the cache) and without a file beside the recipe.
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        "name: early\nbase: ubuntu:24.04\npython: \"3.12\"\npytorch: \"2.9\"\n",
    );
    let arm = common::write(
        dir.path(),
        "arm.yaml",
        "name: early-arm\nbase: ubuntu:24.04\npython: \"3.12\"\npytorch: \"2.11\"\n\
         platforms: [linux/arm64]\n",
    );
    let out_dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let build = |recipe: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(["build", recipe, "--from", &common::from_base(), "--to"])
            .arg(format!("oci:{}", out_dir.path().join("out").display()))
            .env("GPUBAKE_CACHE_DIR", cache.path())
            .output()
            .unwrap()
    };
    let out = build(&recipe);
    assert_exit(&out, 2);
    let err = common::stderr(&out);
    assert!(err.contains("the base has no CPython"), "{err}");
    assert!(!err.contains("resolved"), "{err}");
    // A base of another architecture is refused as early.
    let out = build(&arm);
    assert_exit(&out, 2);
    let err = common::stderr(&out);
    assert!(
        err.contains("the base for linux/arm64 is linux/amd64"),
        "{err}"
    );
    assert_eq!(listing(dir.path()), ["arm.yaml", "r.yaml"]);
    assert!(
        !cache.path().join("closures").exists(),
        "nothing was resolved"
    );
    assert!(listing(out_dir.path()).is_empty(), "nothing was built");
}

/// Resolves `recipe` with `resolve -o` into `dir`, or None where PyPI is not reachable
/// outside CI.
fn resolve_beside(recipe: &str, dir: &Path) -> Option<()> {
    let out = common::gpubake(&[
        "resolve",
        recipe,
        "-o",
        dir.join("r.lock").to_str().unwrap(),
    ]);
    if common::stderr(&out).contains("cannot be reached") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: PyPI is not reachable");
        return None;
    }
    assert_exit(&out, 0);
    Some(())
}

#[test]
fn a_pylock_for_another_base_is_resolved_again_into_the_cache_or_refused_offline() {
    if !have("uv", "--version") {
        return;
    }
    let Some(base) = common::debian_base() else {
        return;
    };
    // Resolved for ubuntu:24.04 (glibc 2.39); built on Debian 12 (glibc 2.36).
    let dir = tempfile::tempdir().unwrap();
    let text = "name: moved\nbase: ubuntu:24.04\npython: \"3.11\"\npytorch: \"2.9\"\n";
    let recipe = common::write(dir.path(), "r.yaml", text);
    if resolve_beside(&recipe, dir.path()).is_none() {
        return;
    }
    let beside = dir.path().join("pylock.moved.toml");
    let written = std::fs::read(&beside).unwrap();
    assert!(String::from_utf8_lossy(&written).contains("x86_64-manylinux_2_39"));

    // Offline, the build refuses it, naming the base as what changed.
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["build", &recipe, "--offline", "--from"])
        .arg(format!("oci:{}:bookworm", base.display()))
        .arg("--to")
        .arg(format!("oci:{}", dir.path().join("out").display()))
        .env("GPUBAKE_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    assert_exit(&out, 2);
    let err = common::stderr(&out);
    for want in [
        "was resolved for x86_64-manylinux_2_39",
        "glibc 2.36",
        "x86_64-manylinux_2_36",
        "the base changed, not the recipe",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    assert!(!err.contains("stale"), "{err}");

    // Online, the closure is resolved again for this base, into the cache: the recipe's
    // folder keeps its files as they were.
    let loaded =
        LoadedRecipe::parse(Document::from_text(recipe.clone(), text.to_string())).unwrap();
    let glibc = Some(("2.36".parse().unwrap(), "glibc of Debian 12".to_string()));
    let resolved = resolve::resolve_recipe(
        &loaded,
        &resolve::Options {
            base_glibc: glibc,
            ..Default::default()
        },
    )
    .unwrap();
    let source = closure::Source {
        recipe_file: Some(Path::new(&recipe)),
        explicit: None,
        index: None,
        offline: false,
        cache_dir: cache.path(),
    };
    let again = closure::for_build(&resolved.lock, &source).unwrap();
    assert!(
        again.path.starts_with(cache.path().join("closures")),
        "{}",
        again.path.display()
    );
    assert_eq!(again.inputs().unwrap().platform, "x86_64-manylinux_2_36");
    assert_eq!(std::fs::read(&beside).unwrap(), written);
    assert_eq!(
        listing(dir.path()),
        ["pylock.moved.toml", "r.lock", "r.yaml"]
    );
    // The next build, offline too, takes it from the cache.
    let offline = closure::Source {
        offline: true,
        ..source
    };
    let cached = closure::for_build(&resolved.lock, &offline).unwrap();
    assert_eq!(cached.path, again.path);
    // A recipe without the file beside it resolves into the cache as well.
    std::fs::remove_file(&beside).unwrap();
    let fresh = closure::for_build(&resolved.lock, &source).unwrap();
    assert_eq!(fresh.path, again.path);
    assert!(!beside.exists());
}

#[test]
fn lock_out_writes_the_lock_of_the_image_and_is_checked_before_the_build() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(dir.path(), "r.yaml", &common::recipe("pytorch: \"2.9\"\n"));
    let to = format!("oci:{}", dir.path().join("out").display());
    let from = common::from_base();
    // A path that can never be a file is refused before anything is built.
    let out = common::gpubake(&common::build_args(
        &recipe,
        &from,
        &to,
        &["--lock-out", dir.path().to_str().unwrap()],
    ));
    assert_exit(&out, 2);
    assert!(!dir.path().join("out").exists());
    let lock_out = dir.path().join("kept/image.lock");
    std::fs::create_dir(dir.path().join("kept")).unwrap();
    let out = common::gpubake(&common::build_args(
        &recipe,
        &from,
        &to,
        &["--lock-out", lock_out.to_str().unwrap()],
    ));
    assert_exit(&out, 0);
    let lock: gpubake::lock::Lock =
        serde_yaml::from_str(&std::fs::read_to_string(&lock_out).unwrap()).unwrap();
    assert_eq!(lock.torch.version.to_string(), "2.9.1");
    // The image carries the pins of the lock written, read from the base it was built on.
    let inspect = common::gpubake(&["inspect", &to, "--json"]);
    assert_exit(&inspect, 0);
    let shown: serde_json::Value = serde_json::from_str(&common::stdout(&inspect)).unwrap();
    for (key, value) in &lock.labels {
        assert_eq!(shown["labels"][key], value.as_str(), "{key}");
    }
    assert!(
        lock.platform
            .base_glibc_from
            .as_deref()
            .is_some_and(|f| f.ends_with("read from the base image")),
        "{:?}",
        lock.platform
    );
}

#[test]
fn an_unreachable_index_is_an_environment_error() {
    if !have("uv", "--version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        "name: idx\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
         presets: [base]\nindex: http://127.0.0.1:9/simple\n",
    );
    let out = common::gpubake(&[
        "resolve",
        &recipe,
        "-o",
        dir.path().join("r.lock").to_str().unwrap(),
    ]);
    assert_exit(&out, 3);
    let err = common::stderr(&out);
    assert!(
        err.contains("http://127.0.0.1:9/simple cannot be reached"),
        "{err}"
    );
    assert!(!dir.path().join("r.lock").exists());
}

#[test]
fn without_uv_resolving_the_closure_is_exit_3_saying_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["resolve", "-o"])
        .arg(dir.path().join("x.lock"))
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert_exit(&out, 3);
    assert!(
        common::stderr(&out).contains("python3 -m pip install uv"),
        "{}",
        common::stderr(&out)
    );
}

/// A build without the Python stack checks no wheels, so it says nothing of checking them
/// against the base's glibc; from the recipe's own base it says nothing of another base.
#[test]
fn a_preflight_build_says_nothing_of_wheels() {
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("r.yaml");
    std::fs::write(
        &recipe,
        "name: pre\nbase: debian:bookworm\npython: '3.11'\npytorch: '2.9'\npresets: [base]\n",
    )
    .unwrap();
    let from = format!("oci:{}:bookworm", base.display());
    let to = format!("oci:{}:v1", dir.path().join("out").display());
    let out = common::gpubake(&common::build_args(
        recipe.to_str().unwrap(),
        &from,
        &to,
        &[],
    ));
    assert_exit(&out, 0);
    let err = common::stderr(&out);
    assert!(!err.contains("checking the wheels"), "{err}");
}

/// `build --compression estargz` with a start-up record: in each stack layer the recorded
/// files come first, in the record's order, then `.prefetch.landmark`, as the stargz
/// snapshotter's own reader sees it; a layer the start-up did not read leads with
/// `.no.prefetch.landmark`. A record naming a file no layer holds fails the build before
/// the image is written.
#[test]
fn a_startup_record_lays_out_the_estargz_stack_layers() {
    use gpubake::image::estargz::{NO_PREFETCH_LANDMARK, PREFETCH_LANDMARK};
    use gpubake::startup::{FORMAT, FileRead, StartupRecord};
    let Some(base) = common::debian_base() else {
        return;
    };
    let Some(checker) = common::toc::checker() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (loaded, resolved) = recipe(dir.path(), "3.11", &["tqdm==4.67.1"]);
    let torch = &resolved.lock.torch;
    let read = |path: &str, size: u64| FileRead {
        path: format!("site-packages/{path}"),
        size,
        read: size,
    };
    let record = StartupRecord {
        format: FORMAT.into(),
        torch: format!("{}+{}", torch.version, torch.variant),
        python: "3.11.2".into(),
        steps: vec!["import torch".into()],
        gpu: None,
        files: vec![
            read("tqdm/__init__.py", 1),
            read("markupsafe/__init__.py", 1),
            read("tqdm/std.py", 1),
        ],
    };
    let at = dir.path().join("startup.json");
    record.write(&at).unwrap();
    let layout = dir.path().join("out");
    let from = format!("oci:{}:bookworm", base.display());
    let mut opts = build_options(
        &from,
        &format!("oci:{}:v1", layout.display()),
        Some(small_closure("")),
    );
    opts.compression = gpubake::image::Compression::Estargz;
    opts.startup = Some((at.clone(), record.clone()));
    let report = gpubake::bake::build(&loaded, &resolved, &opts).unwrap();

    let out = common::gpubake(&["inspect", "--json", &format!("oci:{}:v1", layout.display())]);
    assert_exit(&out, 0);
    let inspected: serde_json::Value = serde_json::from_str(&common::stdout(&out)).unwrap();
    let site = "opt/gpubake/venv/lib/python3.11/site-packages";
    let expect = [
        ("venv", vec![NO_PREFETCH_LANDMARK]),
        ("nvidia", vec![NO_PREFETCH_LANDMARK]),
        ("python", vec!["markupsafe/__init__.py", PREFETCH_LANDMARK]),
        (
            "extras",
            vec!["tqdm/__init__.py", "tqdm/std.py", PREFETCH_LANDMARK],
        ),
    ];
    for (name, files) in expect {
        let l = report.layers.iter().find(|l| l.name == name).unwrap();
        let blob = layout
            .join("blobs/sha256")
            .join(l.digest.trim_start_matches("sha256:"));
        let toc = common::toc::toc_digest(&layout, &l.digest);
        let fields = common::toc::check(&checker, &blob, &toc).unwrap();
        let regular: Vec<String> = common::toc::toc_of(&std::fs::read(&blob).unwrap())["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "reg")
            .map(|e| e["name"].as_str().unwrap().to_string())
            .take(files.len())
            .collect();
        let want: Vec<String> = files
            .iter()
            .map(|f| match *f {
                NO_PREFETCH_LANDMARK | PREFETCH_LANDMARK => f.to_string(),
                f => format!("{site}/{f}"),
            })
            .collect();
        assert_eq!(regular, want, "{name}");
        assert_eq!(
            common::toc::field(&fields, "landmark"),
            files.last().unwrap().to_string()
        );
        // inspect shows the prefetch the snapshotter reads off the landmark.
        let shown = inspected["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["digest"] == l.digest)
            .unwrap();
        assert_eq!(
            shown["prefetch"]["bytes"].to_string(),
            common::toc::field(&fields, "prefetch"),
            "{name}"
        );
        assert_eq!(shown["prefetch"]["files"], files.len() - 1, "{name}");
    }
    // Every layer, the rewritten base's too (a Debian base's TOC is 3 MB), opens in the
    // snapshotter's reader.
    for layer in inspected["layers"].as_array().unwrap() {
        let digest = layer["digest"].as_str().unwrap();
        let blob = layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"));
        let toc = common::toc::toc_digest(&layout, digest);
        common::toc::check(&checker, &blob, &toc).unwrap_or_else(|e| panic!("{digest}: {e}"));
    }

    // A file the image lacks: named with its field, and no image is written.
    let mut other = record.clone();
    other.files.push(read("vllm/__init__.py", 1));
    let bad_at = dir.path().join("vllm.json");
    other.write(&bad_at).unwrap();
    let bad = dir.path().join("bad");
    let mut opts = build_options(
        &from,
        &format!("oci:{}:v1", bad.display()),
        Some(small_closure("")),
    );
    opts.compression = gpubake::image::Compression::Estargz;
    opts.startup = Some((bad_at, other));
    let e = gpubake::bake::build(&loaded, &resolved, &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("vllm.json") && e.contains("files[3].path"),
        "{e}"
    );
    assert!(e.contains("site-packages/vllm/__init__.py"), "{e}");
    let index = std::fs::read_to_string(bad.join("index.json")).unwrap_or_default();
    assert!(!index.contains("\"v1\""), "{index}");
}

/// A runner with an empty cache builds the stack from the registry's layer cache: no wheel
/// is fetched, every layer is the registry's, and the image is the warm runner's. One more
/// pip package fetches the wheels of the extras layer alone and writes that layer and the
/// presets' (the lock), and the image is the one the warm runner builds of it.
#[test]
fn a_fresh_runner_takes_the_stack_from_the_registry_cache_fetching_no_wheel() {
    let Some(base) = common::debian_base() else {
        return;
    };
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registry = local_registry::local_registry(dir.path());
    let addr = registry.1.clone();
    let from = format!("oci:{}:bookworm", base.display());
    let cache = gpubake::image::registry::Remote {
        reference: format!("{addr}/team/cache:main"),
        access: Default::default(),
    };
    let (loaded, resolved) = recipe(dir.path(), "3.11", &["tqdm==4.67.1"]);
    let to = format!("docker://{addr}/team/app:v1");
    let mut warm = build_options(&from, &to, Some(small_closure("")));
    warm.cache_to = Some(cache.clone());
    let a = gpubake::bake::build(&loaded, &resolved, &warm).unwrap();

    let fresh_runner = |name: &str, to: &str, closure: Closure| {
        let mut opts = build_options(&from, to, Some(closure));
        opts.cache_dir = dir.path().join(name);
        opts.cache_from = vec![cache.clone()];
        opts
    };
    let to = format!("docker://{addr}/team/app:v2");
    let b = gpubake::bake::build(
        &loaded,
        &resolved,
        &fresh_runner("fresh", &to, small_closure("")),
    )
    .unwrap();
    assert_eq!(a.manifest, b.manifest);
    assert_eq!(b.timings.fetch.downloaded_files, 0, "{:?}", b.timings);
    for l in b.layers.iter().filter(|l| l.name != "base") {
        assert_eq!(l.from, "registry-cache", "{}: {:?}", l.name, b.layers);
    }

    // One more pip package: the warm runner's image of it, and a fresh runner's.
    let six_dir = dir.path().join("six");
    std::fs::create_dir(&six_dir).unwrap();
    let (loaded, resolved) = recipe(&six_dir, "3.11", &["tqdm==4.67.1", "six==1.17.0"]);
    let layout = format!("oci:{}:six", dir.path().join("out").display());
    let want = build(&loaded, &resolved, small_closure(SIX), &base, &layout).unwrap();
    let to = format!("docker://{addr}/team/app:six");
    let c = gpubake::bake::build(
        &loaded,
        &resolved,
        &fresh_runner("fresh-six", &to, small_closure(SIX)),
    )
    .unwrap();
    assert_eq!(c.manifest, want.manifest);
    for l in c.layers.iter().filter(|l| l.name != "base") {
        // The presets layer holds the image's lock, which lists the pip packages.
        let expected = if ["extras", "presets"].contains(&l.name.as_str()) {
            "written"
        } else {
            "registry-cache"
        };
        assert_eq!(l.from, expected, "{}: {:?}", l.name, c.layers);
    }
    // The extras layer's wheels (tqdm and six), and no other.
    assert_eq!(c.timings.fetch.downloaded_files, 2, "{:?}", c.timings);
}
