//! Small Go programs the tests build against Debian's source of the stargz snapshotter
//! (golang-github-containerd-stargz-snapshotter-dev), with Debian's Go in GOPATH mode: no
//! module is downloaded.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian puts the library's source.
pub const STARGZ: &str = "/usr/share/gocode/src/github.com/containerd/stargz-snapshotter";

/// Builds `tests/NAME/main.go` once per target directory; None (with the reason printed)
/// where Go or the library is missing outside CI. `left_out` names files of the library to
/// build without: a program that needs a package Debian lacks only through one file (the
/// resolver's CRI keychain imports Kubernetes' CRI API) builds against a copy without it.
pub fn build(name: &str, left_out: &[&str]) -> Option<PathBuf> {
    if !super::have("go", "version") {
        return None;
    }
    if !Path::new(STARGZ).is_dir() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs golang-github-containerd-stargz-snapshotter-dev"
        );
        eprintln!("skipped: {STARGZ} is missing");
        return None;
    }
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("go-{name}"));
    let binary = work.join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/{name}/main.go"));
    let fresh = |b: &Path| {
        let built = b.metadata().and_then(|m| m.modified()).ok();
        let written = source.metadata().and_then(|m| m.modified()).ok();
        built.is_some() && built >= written
    };
    if fresh(&binary) {
        return Some(binary);
    }
    let staging = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let gopath = staging.path();
    let src = gopath.join("src").join(name);
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(&source, src.join("main.go")).unwrap();
    if !left_out.is_empty() {
        let copy = gopath.join("src/github.com/containerd");
        std::fs::create_dir_all(&copy).unwrap();
        let copied = Command::new("cp")
            .arg("-r")
            .arg(STARGZ)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(copied.success(), "copying {STARGZ}");
        for file in left_out {
            std::fs::remove_file(copy.join("stargz-snapshotter").join(file)).unwrap();
        }
    }
    std::fs::create_dir_all(&work).unwrap();
    let built = staging.path().join(name);
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&built)
        .arg(".")
        .current_dir(&src)
        .env("GO111MODULE", "off")
        .env("GOPATH", format!("{}:/usr/share/gocode", gopath.display()))
        .env("GOCACHE", work.join("cache"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go build tests/{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Test binaries may build it at once; either copy is fine.
    std::fs::rename(&built, &binary).unwrap();
    Some(binary)
}
