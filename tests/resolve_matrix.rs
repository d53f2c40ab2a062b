//! The resolution matrix, CI's slice of it: `gpubake resolve -o` for each release's PyPI build
//! on the newest and the oldest base glibc, with CPython 3.12, against uv's own resolution
//! (scripts/resolve-matrix runs every cell and prints the table in docs/resolve-matrix.md).

mod common;

use std::path::Path;
use std::process::Command;

/// The releases the slice resolves: every one from 2.4 to 2.11, CUDA 12 and 13 both.
const RELEASES: &[&str] = &["2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11"];

#[test]
fn every_release_resolves_on_ubuntu_24_04_and_debian_10_with_uvs_pins() {
    if !common::have("uv", "--version") {
        return;
    }
    let mut cmd =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/resolve-matrix"));
    cmd.args([
        "--gpubake",
        env!("CARGO_BIN_EXE_gpubake"),
        "--json",
        "--pypi-only",
    ])
    .args(["--python", "3.12", "--glibc", "2.39", "--glibc", "2.28"]);
    for r in RELEASES {
        cmd.args(["--release", r]);
    }
    let out = cmd.output().expect("scripts/resolve-matrix runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(3) && std::env::var_os("CI").is_none() {
        eprintln!("skipped: {stderr}");
        return;
    }
    let cells: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&out.stdout)));
    let cells = cells.as_array().unwrap();
    assert_eq!(cells.len(), RELEASES.len() * 2, "{cells:#?}");
    for cell in cells {
        assert_eq!(cell["status"], "ok", "{cell:#}");
        for pin in ["NCCL", "cuDNN", "CUDA runtime", "cuBLAS"] {
            assert!(cell["pins"][pin].is_string(), "{pin} missing: {cell:#}");
        }
    }
    let cuda13: Vec<_> = cells.iter().filter(|c| c["variant"] == "cu130").collect();
    assert_eq!(cuda13.len(), 2, "2.11 is the CUDA 13 release of the slice");
    assert_eq!(cuda13[0]["pins"]["cuBLAS"], "13.1.0.3");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}
