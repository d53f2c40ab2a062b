//! Resolution: the pins chosen for (release, CUDA variant) pairs match the research table,
//! choices follow the documented rules, and conflicts are explained.

mod common;

use gpubake::document::Document;
use gpubake::error::Error;
use gpubake::lock::Lock;
use gpubake::recipe::LoadedRecipe;
use gpubake::resolve::{Options, resolve_recipe};

fn resolve_text(text: &str) -> Result<Lock, Error> {
    let loaded = LoadedRecipe::parse(Document::from_text("test.yaml", text))?;
    resolve_recipe(&loaded, &Options::default()).map(|r| r.lock)
}

fn lock(extra: &str) -> Lock {
    resolve_text(&common::recipe(extra)).unwrap_or_else(|e| panic!("{e}"))
}

fn conflict(extra: &str) -> String {
    match resolve_text(&common::recipe(extra)) {
        Err(e @ Error::Unsatisfiable(_)) => e.to_string(),
        Err(other) => panic!("expected a conflict, got another error: {other}"),
        Ok(lock) => panic!(
            "expected a conflict, resolved to {}",
            lock.torch.requirement
        ),
    }
}

fn text(v: &Option<gpubake::version::Version>) -> String {
    v.as_ref()
        .map(ToString::to_string)
        .unwrap_or_else(|| "unknown".into())
}

/// (pytorch, cuda, expected variant, nccl, cudnn, CUDA runtime), as compat-matrix.yaml gives them.
const PAIRS: &[(&str, &str, &str, &str, &str, &str)] = &[
    ("2.4", "12.1", "cu121", "2.20.5", "9.1.0.70", "12.1.105"),
    ("2.4", "11.8", "cu118", "2.20.5", "9.1.0.70", "11.8.89"),
    ("2.5", "12.4", "cu124", "2.21.5", "9.1.0.70", "12.4.127"),
    ("2.6", "12.6", "cu126", "2.21.5", "9.5.1.17", "12.6.77"),
    ("2.7", "12.6", "cu126", "2.26.2", "9.5.1.17", "12.6.77"),
    ("2.8", "12.8", "cu128", "2.27.3", "9.10.2.21", "12.8.90"),
    ("2.9", "12.8", "cu128", "2.27.5", "9.10.2.21", "12.8.90"),
    ("2.9", "13.0", "cu130", "2.27.7", "9.13.0.50", "13.0.48"),
    ("2.10", "12.8", "cu128", "2.27.5", "9.10.2.21", "12.8.90"),
    ("2.11", "13.0", "cu130", "2.28.9", "9.19.0.56", "13.0.96"),
    ("2.12", "12.6", "cu126", "2.29.3", "9.10.2.21", "unknown"),
    ("2.13", "13.2", "cu132", "2.29.7", "9.20.0.48", "unknown"),
    ("2.14", "13.0", "cu130", "2.30.7", "9.24.0.43", "13.0.96"),
    ("2.15", "13.2", "cu132", "2.30.7", "9.26.0.51", "13.2.86"),
];

#[test]
fn pins_match_the_research_table() {
    for (pytorch, cuda, variant, nccl, cudnn, runtime) in PAIRS {
        let lock = lock(&format!(
            "pytorch: '{pytorch}'\ncuda: '{cuda}'\ndriver: '>=580.95'\n"
        ));
        let what = format!("torch {pytorch} cuda {cuda}");
        assert_eq!(lock.torch.variant, *variant, "{what}");
        assert_eq!(text(&lock.nccl.version), *nccl, "{what}: nccl");
        assert_eq!(text(&lock.cudnn.version), *cudnn, "{what}: cudnn");
        assert_eq!(
            lock.cuda
                .runtime
                .clone()
                .unwrap_or_else(|| "unknown".into()),
            *runtime,
            "{what}: runtime"
        );
        assert!(
            lock.torch.version.to_string().starts_with(pytorch),
            "{what}: {}",
            lock.torch.version
        );
        assert_eq!(
            lock.torch.index_url,
            format!("https://download.pytorch.org/whl/{variant}")
        );
    }
}

#[test]
fn newest_patch_and_pypi_default_win() {
    let l = lock("pytorch: '2.9'\n");
    assert_eq!(l.torch.requirement, "torch==2.9.1+cu128");
    assert!(l.torch.pypi_default);
    assert!(l.torch.rule.contains("PyPI default"), "{}", l.torch.rule);
    let l = lock("pytorch: '==2.9.0'\n");
    assert_eq!(l.torch.version.to_string(), "2.9.0");
    let l = lock("pytorch: '>=2.4'\n");
    assert_eq!(l.torch.version.to_string(), "2.15.0");
}

#[test]
fn confirmed_pins_go_to_pip_and_unconfirmed_ones_warn() {
    let confirmed = lock("pytorch: '2.9'\ncuda: '12.8'\n");
    assert_eq!(confirmed.packages["nvidia-nccl-cu12"], "==2.27.5");
    assert!(!confirmed.nccl.unconfirmed);
    let unconfirmed = lock("pytorch: '2.11'\ncuda: '12.8'\n");
    assert!(unconfirmed.nccl.unconfirmed);
    assert!(
        unconfirmed
            .warnings
            .iter()
            .any(|w| w.contains("not confirmed from the shipped wheel")),
        "{:?}",
        unconfirmed.warnings
    );
}

#[test]
fn python_is_the_newest_allowed() {
    assert_eq!(
        text(
            &lock("pytorch: '2.9'\npython: '>=3.11,<3.14'\n")
                .python
                .version
        ),
        "3.13"
    );
    assert_eq!(text(&lock("pytorch: '2.9'\n").python.version), "3.14");
    assert_eq!(
        lock("pytorch: '2.9'\npython: '3.13t'\n").labels["io.gpubake.python"],
        "3.13t"
    );
}

#[test]
fn gpus_map_to_the_code_that_runs_on_them() {
    let l = lock("pytorch: '2.9'\ngpus: [l40s, h100]\n");
    assert_eq!(l.gpus[0].arch, "sm_89");
    assert_eq!(l.gpus[0].runs, "sm_86");
    assert_eq!(l.gpus[1].runs, "sm_90");
}

#[test]
fn driver_floor_follows_the_cuda_major() {
    let l = lock("pytorch: '2.9'\ncuda: '12.8'\ndriver: '>=570.86'\n");
    assert_eq!(l.driver.min.to_string(), "525.60.13");
    assert_eq!(l.nvidia.require_cuda, "cuda>=12.0,driver>=525.60.13");
    let l = lock("pytorch: '2.11'\ncuda: '13.0'\n");
    assert_eq!(l.driver.min.to_string(), "580");
    assert_eq!(l.nvidia.require_cuda, "cuda>=13.0,driver>=580");
}

#[test]
fn conflict_python_too_new() {
    let msg = conflict("pytorch: '2.9'\npython: '3.15'\n");
    assert!(msg.contains("Python 3.10..3.14, not 3.15"), "{msg}");
    assert!(
        msg.contains("with another PyTorch release: torch 2.15+cu132 would run"),
        "{msg}"
    );
}

#[test]
fn conflict_python_too_old() {
    let msg = conflict("pytorch: '2.15'\npython: '3.10'\n");
    assert!(msg.contains("Python 3.11..3.15, not 3.10"), "{msg}");
}

#[test]
fn conflict_driver_too_old_for_the_cuda_major() {
    let msg = conflict("pytorch: '2.11'\ncuda: '>=13.0'\ndriver: '>=550'\n");
    assert!(
        msg.contains("torch 2.11+cu130 needs driver >= 580 (CUDA 13 minor-version compatibility); the fleet floor is 550"),
        "{msg}"
    );
    assert!(
        msg.contains("with another CUDA (cu128 is CUDA 12.8): torch 2.11+cu128 would run"),
        "{msg}"
    );
    assert!(
        msg.contains("on a fleet with driver >= 580: torch 2.11+cu130 would run"),
        "{msg}"
    );
}

#[test]
fn conflict_gpu_arch_not_in_the_wheel() {
    let msg = conflict("pytorch: '2.11'\ncuda: '13.0'\ngpus: [v100]\n");
    assert!(msg.contains("has no code for v100 (sm_70)"), "{msg}");
    assert!(
        msg.contains("torch 2.10+cu128 would run") || msg.contains("torch 2.11+cu128 would run"),
        "{msg}"
    );
}

#[test]
fn conflict_nccl_unsatisfiable() {
    let msg = conflict("pytorch: '2.9'\nnccl: '>=2.29'\n");
    assert!(msg.contains("ships NCCL 2.27.5, not `>=2.29`"), "{msg}");
    assert!(msg.contains("without `nccl >=2.29 (recipe)`"), "{msg}");
}

#[test]
fn conflict_from_a_preset_requirement() {
    let dir = tempfile::tempdir().unwrap();
    common::write(
        dir.path(),
        "new.yaml",
        "description: x\nrequires: {nccl: '>=2.30'}\nenv:\n  NCCL_DEBUG: {value: WARN, reason: quiet}\n",
    );
    let recipe = common::recipe("pytorch: '2.9'\npresets: [new]\n");
    let loaded = LoadedRecipe::parse(Document::from_text("r.yaml", recipe)).unwrap();
    let opts = Options {
        preset_dirs: vec![dir.path().to_path_buf()],
        ..Options::default()
    };
    let msg = resolve_recipe(&loaded, &opts).err().unwrap().to_string();
    assert!(msg.contains("(preset new)"), "{msg}");
}

#[test]
fn conflict_old_glibc_base() {
    let msg = match resolve_text("name: t\nbase: centos:7\npytorch: '2.9'\n") {
        Err(e) => e.to_string(),
        Ok(_) => panic!("centos7 has glibc 2.17"),
    };
    assert!(
        msg.contains("needs glibc >= 2.28; the base (centos7) has 2.17"),
        "{msg}"
    );
}

#[test]
fn unknown_gpu_is_located_with_a_suggestion() {
    let err = resolve_text(&common::recipe("pytorch: '2.9'\ngpus: [h100, h2000]\n"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.starts_with("test.yaml:4:14:"), "{err}");
    assert!(
        err.contains("unknown GPU `h2000` (did you mean `h200`?)"),
        "{err}"
    );
}

#[test]
fn resolving_is_deterministic() {
    let text = common::recipe("pytorch: '2.9'\npresets: [base, nvlink]\ngpus: [h100]\n");
    assert_eq!(
        resolve_text(&text).unwrap().to_yaml(),
        resolve_text(&text).unwrap().to_yaml()
    );
}

#[test]
fn locks_round_trip_through_yaml() {
    let lock = lock("pytorch: '2.9'\npresets: [base, nvlink]\nenv:\n  NCCL_DEBUG: INFO\n");
    let back: Lock = serde_yaml::from_str(&lock.to_yaml()).unwrap();
    assert_eq!(back, lock);
    let debug = &lock.env.0["NCCL_DEBUG"];
    assert_eq!(debug.origin.by, "recipe");
    assert_eq!(debug.replaced[0].by, "preset base");
}

#[test]
fn an_unknown_nccl_pin_resolves_with_a_warning() {
    // torch 2.5+cu118's NCCL pin is not in the data; the base preset asks for >=2.20.
    let unknown = lock("pytorch: '2.5'\ncuda: '11.8'\npresets: [base]\n");
    assert_eq!(unknown.torch.variant, "cu118");
    assert_eq!(unknown.nccl.version, None);
    assert!(
        unknown.warnings.iter().any(|w| w
            == "torch 2.5+cu118's NCCL pin is unknown, so `>=2.20` (preset base) cannot be checked"),
        "{:?}",
        unknown.warnings
    );
    // A build known to meet the constraint still wins over one whose pin is unknown.
    let known = lock("pytorch: '2.5'\npresets: [base]\n");
    assert_eq!(text(&known.nccl.version), "2.21.5");
}

/// The conflict report as a new user met it: an unknown release lists the known ones, a
/// constraint two presets share is said once, and a recipe's only GPU is never advised away.
#[test]
fn conflicts_list_known_releases_say_each_ask_once_and_keep_the_only_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = common::write(dir.path(), "a.yaml", "name: r\nbase: x\npytorch: '2.99'\n");
    let out = common::gpubake(&["resolve", &unknown, "--no-closure"]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert!(err.contains("known PyTorch releases: 2.4, 2.5"), "{err}");

    let blackwell = common::write(
        dir.path(),
        "d.yaml",
        "name: r\nbase: x\npytorch: '2.6'\ngpus: [rtx5090]\npresets: [base, nvlink]\n",
    );
    let out = common::gpubake(&["resolve", &blackwell, "--no-closure"]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert_eq!(err.matches(">=2.20").count(), 1, "{err}");
    assert!(err.contains("presets base, nvlink"), "{err}");
    assert!(!err.contains("without the GPUs"), "{err}");
    assert!(err.contains("with another PyTorch release"), "{err}");
}

/// `resolve --json` answers in JSON when it fails too, with the exit code and the conflict.
#[test]
fn a_failed_resolve_still_prints_json_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(dir.path(), "a.yaml", "name: r\nbase: x\npytorch: '2.99'\n");
    let out = common::gpubake(&["resolve", &recipe, "--no-closure", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit"], 2);
    assert!(v["error"].as_str().unwrap().contains("no PyTorch build"));
    assert!(v["conflict"]["known_releases"].as_array().unwrap().len() > 5);
}

/// GH200 nodes are aarch64: resolving x86_64 wheels for them would lock an image that cannot
/// run there, so it is refused, naming the field.
#[test]
fn an_arm_hosted_gpu_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "g.yaml",
        "name: g\nbase: x\npytorch: '2.9'\ngpus: [gh200]\n",
    );
    let out = common::gpubake(&["resolve", &recipe, "--no-closure"]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert!(err.contains("g.yaml:4"), "{err}");
    assert!(err.contains("aarch64"), "{err}");
}

/// A `files:` source that does not exist is found by resolve (and so by lint, render and
/// build before they write anything), naming the field.
#[test]
fn a_missing_files_source_is_found_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "f.yaml",
        "name: f\nbase: x\npytorch: '2.9'\nfiles:\n  - {src: nowhere/train.py, dest: /workspace/train.py}\n",
    );
    for args in [
        vec!["resolve", recipe.as_str(), "--no-closure"],
        vec!["lint", recipe.as_str()],
    ] {
        let out = common::gpubake(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = common::stderr(&out) + &common::stdout(&out);
        assert!(
            err.contains("files[0].src") && err.contains("f.yaml:5"),
            "{err}"
        );
        assert!(err.contains("does not exist"), "{err}");
    }
    let out_dir = dir.path().join("out");
    let out = common::gpubake(&[
        "build",
        &recipe,
        "--without-python",
        "--from",
        "oci:/nonexistent-base",
        "--to",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        !out_dir.exists(),
        "nothing is written for a recipe with a missing input"
    );
}
