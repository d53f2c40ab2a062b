//! Provenance of data/compat.yaml: scripts/refresh-compat re-derives the PyPI-default rows from
//! uv's resolution of the torch wheels on the glibc of every base gpubake builds on (2.28 to
//! 2.39), so the data agrees with it for the releases checked here, and a value changed in a copy of the data is reported with both values and, with
//! --write, put back line for line.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/refresh-compat")
}

/// Runs the script; None (with the reason printed) where uv or PyPI is not available outside
/// CI. In CI both are installed and reachable, so exit 3 fails the test there.
fn refresh(args: &[&str]) -> Option<(i32, String)> {
    let out: Output = Command::new(script())
        .args(args)
        .output()
        .expect("scripts/refresh-compat runs");
    let code = out.status.code().unwrap_or(-1);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if code == 3 {
        assert!(std::env::var_os("CI").is_none(), "exit 3 in CI:\n{stderr}");
        eprintln!("skipped: {}", stderr.trim());
        return None;
    }
    Some((code, format!("{stdout}{stderr}")))
}

#[test]
fn the_data_agrees_with_uv_for_pinned_releases() {
    let Some((code, text)) =
        refresh(&["--release", "2.9", "--release", "2.11", "--release", "2.6"])
    else {
        return;
    };
    assert_eq!(code, 0, "{text}");
    for (release, tag) in [("2.9", "cu128"), ("2.11", "cu130"), ("2.6", "cu124")] {
        assert!(
            text.contains(&format!("@@ {release} {tag}: ")),
            "{release} not named:\n{text}"
        );
    }
    assert!(text.contains("all 3 releases agree"), "{text}");
    assert!(
        text.contains("glibc 2.28, 2.31, 2.35, 2.36, 2.39"),
        "resolved on every base's glibc:\n{text}"
    );
}

#[test]
fn a_changed_value_is_reported_and_written_back() {
    let original =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/compat.yaml"))
            .unwrap();
    // 2.9's first nccl line is its PyPI-default cu128 variant's (the one before `- tag: cu126`).
    let release = original.find("- release: \"2.9\"").unwrap();
    let nccl = release + original[release..].find("nccl: \"2.27.5\"").unwrap();
    let next_variant = release + original[release..].find("- tag: cu126").unwrap();
    assert!(nccl < next_variant, "2.9 cu128 has no nccl line");
    let changed = format!(
        "{}nccl: \"2.27.4\"{}",
        &original[..nccl],
        &original[nccl + "nccl: \"2.27.5\"".len()..]
    );

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("compat.yaml");
    std::fs::write(&data, &changed).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o640)).unwrap();
    let data_arg = data.to_str().unwrap();

    // One glibc is enough for the rewriting; the test above resolves on every base's.
    let one = ["--data", data_arg, "--release", "2.9", "--glibc", "2.28"];
    let Some((code, text)) = refresh(&one) else {
        return;
    };
    assert_eq!(code, 1, "{text}");
    let line = text
        .lines()
        .find(|l| l.contains(" nccl: "))
        .unwrap_or_else(|| panic!("no nccl line:\n{text}"));
    for want in ["2.9", "nccl", "data 2.27.4", "uv 2.27.5"] {
        assert!(line.contains(want), "{want} missing from {line:?}");
    }
    assert_eq!(
        text.matches(" data ").count(),
        1,
        "only nccl differs:\n{text}"
    );
    assert_eq!(
        std::fs::read_to_string(&data).unwrap(),
        changed,
        "without --write the file stays as it was"
    );

    // --write puts uv's value back by editing that one line: the file is the original again,
    // comments and layout included, with the mode it had.
    let Some((code, text)) = refresh(&[&one[..], &["--write"]].concat()) else {
        return;
    };
    assert_eq!(code, 1, "{text}");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), original, "{text}");
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "a temporary file was left beside the data");
}
