//! The probe on a machine without a GPU (CI): it must exit 3 and say what to do, never
//! panic, and still write its JSON and JUnit reports. On a GPU node these tests step aside.

mod common;

use common::{assert_exit, gpubake, stdout};

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
