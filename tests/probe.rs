//! The probe on a machine without a GPU (CI): it must exit 3 and say what to do, never
//! panic, and still write its JSON and JUnit reports. On a GPU node these tests step aside.

mod common;

use common::{assert_exit, gpubake, stderr, stdout};

fn gpu_present() -> bool {
    let present = std::path::Path::new("/dev/nvidia0").exists();
    if present {
        eprintln!("skipped: a GPU is present; the no-GPU behaviour is not testable here");
    }
    present
}

#[test]
fn no_gpu_exits_3_with_what_to_do() {
    if gpu_present() {
        return;
    }
    let out = gpubake(&["probe"]);
    assert_exit(&out, 3);
    let text = stdout(&out);
    assert!(text.contains("no NVIDIA GPU is visible"), "{text}");
    assert!(
        text.contains("--gpus all") || text.contains("install the NVIDIA driver"),
        "{text}"
    );
    assert!(text.contains("FAIL  libnvidia-ml.so.1"), "{text}");
}

#[test]
fn reports_are_written_even_without_a_gpu() {
    if gpu_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("probe.xml");
    let out = gpubake(&[
        "probe",
        "--json",
        "--quick",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_exit(&out, 3);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["no_gpu"], true);
    assert!(
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["phase"] == "nvml" && c["status"] == "FAIL")
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.starts_with("<?xml") && xml.contains("<testsuite name=\"nvml\""),
        "{xml}"
    );
}

#[test]
fn a_bad_policy_file_is_located() {
    let dir = tempfile::tempdir().unwrap();
    let policy = common::write(
        dir.path(),
        "policy.yaml",
        "- match: H200\n  model: x\n  pcie: {gen: five, width: 16}\n",
    );
    let out = gpubake(&["probe", "--policy", &policy]);
    assert_exit(&out, 2);
    assert!(
        common::stderr(&out).contains("policy.yaml:3:"),
        "{}",
        common::stderr(&out)
    );
}

#[test]
fn bad_sizes_are_usage_errors() {
    for bad in ["1G:4K", "abc", "0", "4:"] {
        let out = gpubake(&["probe", "--sizes", bad]);
        assert_exit(&out, 2);
    }
}

/// Sizes past what a u64 or any GPU holds are usage errors naming the size, never a panic
/// or an endless ladder.
#[test]
fn huge_sizes_are_usage_errors_naming_the_size() {
    for (sizes, named) in [
        ("4:4294967296G", "4294967296G"),
        ("17179869184G", "17179869184G"),
        ("4,99999999999999999999999", "99999999999999999999999"),
        ("4:2048G", "2048G"),
    ] {
        let out = gpubake(&["probe", "--sizes", sizes]);
        assert_exit(&out, 2);
        assert!(
            stderr(&out).contains(&format!("`{named}` is too large")),
            "{sizes}: {}",
            stderr(&out)
        );
    }
}

/// On a GPU node (not in CI) the quick probe must pass and its all-reduce must be exact.
#[test]
fn the_quick_probe_passes_on_a_gpu() {
    if !std::path::Path::new("/dev/nvidia0").exists() {
        eprintln!(
            "skipped: no GPU here (/dev/nvidia0 is absent); benches/h200.sh runs this on an H200"
        );
        return;
    }
    let out = gpubake(&["probe", "--quick", "--json"]);
    assert_exit(&out, 0);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let results = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["phase"] == "allreduce" && c["name"] == "results");
    assert_eq!(
        results.map(|c| c["status"].clone()),
        Some(serde_json::json!("PASS")),
        "{report}"
    );
}

/// A stand-in `libnvidia-ml.so.1` built with the C compiler: NVML that initialises, reports
/// two GPUs, and cannot open GPU 1 (as for a GPU fallen off the bus). With `needs`, it is
/// linked against a library that is then deleted, so loading it fails as in an image that
/// lacks a dependency. None when no C compiler is installed.
fn fake_nvml(dir: &std::path::Path, needs: Option<&str>) -> Option<std::path::PathBuf> {
    let cc = |args: &[&str]| {
        std::process::Command::new("cc")
            .args(args)
            .current_dir(dir)
            .status()
            .is_ok_and(|s| s.success())
    };
    let source = r#"
        #include <stdio.h>
        int nvmlInit_v2(void) { return 0; }
        int nvmlShutdown(void) { return 0; }
        int nvmlSystemGetDriverVersion(char *v, unsigned n) { snprintf(v, n, "580.95.05"); return 0; }
        int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return 0; }
        int nvmlDeviceGetCount_v2(unsigned *c) { *c = 2; return 0; }
        /* 15 is NVML_ERROR_GPU_IS_LOST. */
        int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {
            if (i == 1) return 15;
            *d = (void *)0x1000;
            return 0;
        }
    "#;
    std::fs::write(dir.join("nvml.c"), source).unwrap();
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let built = match needs {
        None => cc(&["-shared", "-fPIC", "-o", "lib/libnvidia-ml.so.1", "nvml.c"]),
        Some(dep) => {
            std::fs::write(dir.join("dep.c"), "int gpubake_dep(void) { return 0; }\n").unwrap();
            let soname = format!("-Wl,-soname,{dep}");
            cc(&["-shared", "-fPIC", &soname, "-o", dep, "dep.c"])
                && cc(&[
                    "-shared",
                    "-fPIC",
                    "-Wl,--no-as-needed",
                    "-o",
                    "lib/libnvidia-ml.so.1",
                    "nvml.c",
                    &format!("./{dep}"),
                ])
                && std::fs::remove_file(dir.join(dep)).is_ok()
        }
    };
    if !built {
        eprintln!("skipped: no working C compiler (cc) to build a stand-in NVML");
        return None;
    }
    Some(lib)
}

fn probe_with(lib: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .arg("probe")
        .args(args)
        .env("LD_LIBRARY_PATH", lib)
        .output()
        .expect("the gpubake binary runs")
}

#[test]
fn a_gpu_nvml_cannot_open_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = fake_nvml(dir.path(), None) else {
        return;
    };
    let out = probe_with(&lib, &["--json", "--quick"]);
    assert_exit(&out, 1);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["no_gpu"], false);
    let checks = report["checks"].as_array().unwrap();
    let gpu1 = checks
        .iter()
        .find(|c| c["phase"] == "nvml" && c["name"] == "GPU 1")
        .unwrap_or_else(|| panic!("no check for GPU 1: {report}"));
    assert_eq!(gpu1["status"], "FAIL");
    // GPU 0 was still probed.
    assert!(
        checks.iter().any(|c| c["name"] == "GPU 0 model"),
        "{report}"
    );
    assert!(!stdout(&out).contains("no NVIDIA GPU is visible"));
}

#[test]
fn devices_past_the_last_gpu_are_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = fake_nvml(dir.path(), None) else {
        return;
    };
    let out = probe_with(&lib, &["--devices", "0,7"]);
    assert_exit(&out, 2);
    let err = common::stderr(&out);
    assert!(err.contains("index 7") && err.contains("2 GPUs"), "{err}");
}

#[test]
fn an_nvml_that_does_not_load_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = fake_nvml(dir.path(), Some("libgpubake-absent.so.0")) else {
        return;
    };
    let out = probe_with(&lib, &[]);
    assert_exit(&out, 1);
    let text = stdout(&out);
    assert!(
        text.contains("libgpubake-absent.so.0: cannot open shared object file"),
        "{text}"
    );
    assert!(!text.contains("install the NVIDIA driver"), "{text}");
    assert!(!text.contains("no NVIDIA GPU is visible"), "{text}");
}

/// The framework phase with an interpreter that has no torch: skipped, in the interpreter's
/// own words, on any machine.
#[test]
fn a_python_without_torch_skips_the_framework_with_the_reason() {
    let python = std::process::Command::new("python3")
        .args(["-c", "import torch"])
        .output();
    if python.as_ref().map_or(true, |o| o.status.success()) {
        eprintln!("skipped: no python3, or one that has torch");
        return;
    }
    let out = gpubake(&["probe", "--json", "--quick", "--python", "python3"]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["phase"] == "framework")
        .cloned()
        .unwrap_or_default();
    assert_eq!(check["status"], "SKIP", "{check}");
    let detail = check["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("cannot import torch") && detail.contains("No module named 'torch'"),
        "{detail}"
    );
}

/// Without `--python` the phase looks for the image's venv; a host or a torch-less image has
/// none, and says so.
#[test]
fn without_a_python_stack_the_framework_phase_says_so() {
    if std::path::Path::new("/opt/gpubake/venv/bin/python3").exists() {
        eprintln!("skipped: this machine has a gpubake venv");
        return;
    }
    let out = gpubake(&["probe", "--quick"]);
    let text = stdout(&out);
    assert!(
        text.contains("SKIP  torch")
            && text.contains("no Python stack: /opt/gpubake/venv/bin/python3 does not exist"),
        "{text}"
    );
}
