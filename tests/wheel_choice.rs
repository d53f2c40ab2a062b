//! Where a closure lists several wheels of a package for its platform (uv writes every one
//! that fits), gpubake installs the one pip installs, as pip's own CandidateEvaluator ranks
//! them (tests/fixtures/pip-wheel-choice.py), and the lock records which and why.

mod common;

use common::assert_exit;
use gpubake::wheel::tags::Target;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// pip's answer for `request` (see the fixture).
fn pip(request: &serde_json::Value) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pip-wheel-choice.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_tag_order_is_pips() {
    for (python, platform) in [
        ("3.12", "x86_64-manylinux_2_39"),
        ("3.9", "x86_64-manylinux_2_28"),
        ("3.14", "x86_64-manylinux_2_17"),
    ] {
        let ours = Target::parse(python, platform).unwrap().tags();
        let theirs = pip(&serde_json::json!({"python": python, "platform": platform}));
        let theirs: Vec<String> = serde_json::from_value(theirs["tags"].clone()).unwrap();
        assert_eq!(ours.len(), theirs.len(), "{python} {platform}");
        if let Some(i) = (0..ours.len()).find(|&i| ours[i] != theirs[i]) {
            panic!(
                "{python} {platform}: tag {i} is {} here, {} for pip",
                ours[i], theirs[i]
            );
        }
    }
}

/// Resolves `pytorch` for ubuntu:24.04 (glibc 2.39) and CPython 3.12, as a new user would;
/// returns the lock and the pylock's text, or None where PyPI cannot be reached outside CI.
fn resolve(dir: &Path, pytorch: &str) -> Option<(gpubake::lock::Lock, String)> {
    let recipe = common::write(
        dir,
        "r.yaml",
        &format!("name: choice\nbase: ubuntu:24.04\npython: \"3.12\"\npytorch: \"=={pytorch}\"\n"),
    );
    let lock = dir.join("lock.yaml");
    let out = common::gpubake(&["resolve", &recipe, "-o", lock.to_str().unwrap()]);
    if common::stderr(&out).contains("cannot be reached") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: PyPI is not reachable");
        return None;
    }
    assert_exit(&out, 0);
    let lock = serde_yaml::from_str(&std::fs::read_to_string(&lock).unwrap()).unwrap();
    Some((
        lock,
        std::fs::read_to_string(dir.join("pylock.choice.toml")).unwrap(),
    ))
}

#[test]
fn several_fitting_wheels_resolve_to_pips_choice_recorded_in_the_lock() {
    if !common::have("uv", "--version") {
        return;
    }
    // 2.7.1: the cu12 libraries publish a manylinux2014 wheel and a manylinux_2_17 one, and
    // both run on glibc 2.39; 2.10.0: torch has a build-tag-3 re-upload beside the first.
    for (pytorch, package, wheel) in [
        (
            "2.7.1",
            "nvidia-cuda-cupti-cu12",
            "nvidia_cuda_cupti_cu12-12.6.80-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        ),
        (
            "2.10.0",
            "torch",
            "torch-2.10.0-3-cp312-cp312-manylinux_2_28_x86_64.whl",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let Some((lock, text)) = resolve(dir.path(), pytorch) else {
            return;
        };
        let pylock: toml::Value = toml::from_str(&text).unwrap();
        let mut several = serde_json::Map::new();
        for p in pylock["packages"].as_array().unwrap() {
            let urls: Vec<&str> = p["wheels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w["url"].as_str().unwrap())
                .collect();
            if urls.len() > 1 {
                several.insert(
                    p["name"].as_str().unwrap().to_string(),
                    serde_json::json!([p["version"].as_str().unwrap(), urls]),
                );
            }
        }
        assert!(several.contains_key(package), "{pytorch}: {several:?}");
        let answer = pip(&serde_json::json!({
            "python": "3.12",
            "platform": "x86_64-manylinux_2_39",
            "packages": several,
        }));
        let closure = gpubake::closure::parse(Path::new("pylock.choice.toml"), &text).unwrap();
        assert_eq!(lock.wheels.len(), several.len(), "{:#?}", lock.wheels);
        for (name, url) in answer["chosen"].as_object().unwrap() {
            let url = url.as_str().unwrap();
            let ours = closure.wheels.iter().find(|w| &w.name == name).unwrap();
            assert_eq!(ours.url, url, "{pytorch} {name}");
            let recorded = lock.wheels.iter().find(|c| &c.package == name).unwrap();
            assert_eq!(recorded.wheel, url.rsplit('/').next().unwrap());
            assert_eq!(recorded.platform, "x86_64-manylinux_2_39");
            assert!(
                recorded.rule.contains("the most specific tag"),
                "{}",
                recorded.rule
            );
        }
        let recorded = lock.wheels.iter().find(|c| c.package == package).unwrap();
        assert_eq!(recorded.wheel, wheel);
    }
}
