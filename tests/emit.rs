//! `gpubake probe --emit`: the files fleets read, written by the real binary. On a machine
//! without a GPU the probe exits 3 and both files must still appear, whole, with the mode the
//! umask gives; promtool must accept the metrics without a lint problem, and the feature file
//! must follow NFD's grammar and Kubernetes' label rules line by line.

mod common;

use common::nvml::fake_nvml;
use common::{assert_exit, gpubake, gpubake_umask, mode, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn gpu_present() -> bool {
    let present = Path::new("/dev/nvidia0").exists();
    if present {
        eprintln!("skipped: a GPU is present; the no-GPU behaviour is not testable here");
    }
    present
}

/// promtool's lint of the metrics in `path` (`promtool check metrics`, which reads standard
/// input); None where promtool is absent, which fails the test in CI (scripts/test installs
/// it there).
fn promtool(path: &Path) -> Option<String> {
    if !common::have("promtool", "--version") {
        return None;
    }
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(path).unwrap())
        .output()
        .expect("promtool runs");
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "promtool failed: {said}");
    Some(said)
}

/// The entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A Kubernetes label name, the part after the prefix (IsQualifiedName), or a non-empty
/// label value (IsValidLabelValue): at most 63 characters, `[a-z0-9A-Z]` at both ends and
/// `[-_.a-z0-9A-Z]` between.
fn qualified(s: &str) -> bool {
    let re = regex::Regex::new(r"^[a-zA-Z0-9]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?$").unwrap();
    s.len() <= 63 && re.is_match(s)
}

/// A label prefix: a DNS subdomain (RFC 1123), at most 253 characters.
fn dns_subdomain(s: &str) -> bool {
    let re =
        regex::Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
            .unwrap();
    s.len() <= 253 && re.is_match(s)
}

/// Seconds since the epoch of an RFC 3339 time, or None where it is not one.
fn rfc3339(s: &str) -> Option<i64> {
    let re = regex::Regex::new(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
        .unwrap();
    if !re.is_match(s) {
        return None;
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp())
}

/// Checks an NFD feature file against the documented format (NFD's customization guide,
/// "Feature files" and "Input format"; Kubernetes' label syntax) and returns its labels.
/// Every rule is checked line by line: at most 64 KiB; blank lines and `#` comments; a
/// comment starting `# +` is a directive and must be one NFD knows; `# +expiry-time=` takes
/// RFC 3339 and must precede every label for it to cover them; each label line is
/// `prefix/name[=value]` with the prefix a DNS subdomain outside `kubernetes.io` (which
/// nfd-master denies), the name and value valid labels; no label twice.
fn nfd_labels(text: &str) -> (Vec<(String, String)>, i64) {
    assert!(
        text.len() <= 65_536,
        "NFD ignores a feature file over 64 KiB"
    );
    let mut labels: Vec<(String, String)> = Vec::new();
    let mut expiry = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(directive) = line.strip_prefix("# +") {
            match directive.split_once('=') {
                Some(("expiry-time", t)) => {
                    assert!(labels.is_empty(), "the expiry comes after a label: {line}");
                    expiry = Some(rfc3339(t.trim()).unwrap_or_else(|| panic!("{line}")));
                }
                _ => assert!(
                    ["no-label", "no-feature"].contains(&directive),
                    "not a directive NFD knows: {line}"
                ),
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or((line, "true"));
        let (prefix, name) = key
            .split_once('/')
            .unwrap_or_else(|| panic!("unprefixed names are deprecated in NFD: {line}"));
        assert!(dns_subdomain(prefix), "prefix: {line}");
        assert!(
            prefix != "kubernetes.io" && !prefix.ends_with(".kubernetes.io"),
            "nfd-master denies kubernetes.io: {line}"
        );
        assert!(qualified(name), "name: {line}");
        assert!(value.is_empty() || qualified(value), "value: {line}");
        assert!(labels.iter().all(|(k, _)| k != key), "{key} twice:\n{text}");
        labels.push((key.to_string(), value.to_string()));
    }
    (labels, expiry.expect("an expiry-time directive"))
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Two folders as a node has them: node_exporter's textfile directory and NFD's features.d,
/// with the file each is to get.
fn folders(root: &Path) -> (PathBuf, PathBuf) {
    for dir in ["textfile", "features.d"] {
        std::fs::create_dir(root.join(dir)).unwrap();
    }
    (
        root.join("textfile/gpubake.prom"),
        root.join("features.d/gpubake"),
    )
}

#[test]
fn a_probe_without_a_gpu_still_writes_both_files_whole() {
    if gpu_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (prom, nfd) = folders(dir.path());
    let before = now();
    let out = gpubake_umask(
        "027",
        &[
            "probe",
            "--level",
            "1",
            "--emit",
            &format!("prometheus:{}", prom.display()),
            "--emit",
            &format!("nfd:{}", nfd.display()),
        ],
    );
    assert_exit(&out, 3);
    let after = now();
    // Atomic: only the file itself is left, never the temporary it was renamed from.
    assert_eq!(entries(prom.parent().unwrap()), ["gpubake.prom"]);
    assert_eq!(entries(nfd.parent().unwrap()), ["gpubake"]);
    assert_eq!(mode(&prom), 0o640, "0666 less the umask 027");
    assert_eq!(mode(&nfd), 0o640, "0666 less the umask 027");

    let metrics = std::fs::read_to_string(&prom).unwrap();
    for line in [
        "gpubake_probe_healthy 0\n",
        "gpubake_probe_exit_code 3\n",
        "gpubake_probe_level 1\n",
        "# TYPE gpubake_probe_healthy gauge\n",
    ] {
        assert!(metrics.contains(line), "no {line:?} in:\n{metrics}");
    }
    let stamp: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gpubake_probe_last_run_timestamp_seconds "))
        .expect("a last-run timestamp")
        .parse()
        .unwrap();
    assert!(
        (before as f64 - 1.0..=after as f64 + 1.0).contains(&stamp),
        "{stamp} not within the run ({before}..{after})"
    );
    if let Some(said) = promtool(&prom) {
        assert_eq!(said.trim(), "", "promtool's lint:\n{said}\n{metrics}");
    }

    let text = std::fs::read_to_string(&nfd).unwrap();
    let (labels, expiry) = nfd_labels(&text);
    assert_eq!(
        labels[0],
        ("gpubake.io/health".into(), "no-gpu".into()),
        "{text}"
    );
    assert!(
        labels.contains(&("gpubake.io/probe-level".into(), "1".into())),
        "{text}"
    );
    assert!(
        (before + 3600 - 1..=after + 3600 + 1).contains(&expiry),
        "level 1's labels stand an hour: {text}"
    );
}

#[test]
fn an_emitted_file_that_exists_keeps_its_mode() {
    if gpu_present() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (prom, _) = folders(dir.path());
    std::fs::write(&prom, "old\n").unwrap();
    std::fs::set_permissions(&prom, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = gpubake(&[
        "probe",
        "--level",
        "1",
        "--emit",
        &format!("prometheus:{}", prom.display()),
    ]);
    assert_exit(&out, 3);
    assert_eq!(mode(&prom), 0o600);
    assert!(
        std::fs::read_to_string(&prom)
            .unwrap()
            .contains("gpubake_probe_exit_code 3\n")
    );
}

#[test]
fn a_file_its_reader_would_skip_is_refused_before_the_probe_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (prom, nfd) = folders(dir.path());
    let txt = prom.with_extension("txt");
    let hidden = nfd.with_file_name(".gpubake");
    for (arg, says) in [
        (format!("prometheus:{}", txt.display()), "`.prom`"),
        (format!("nfd:{}", hidden.display()), "starts with a dot"),
        ("statsd:/tmp/x".to_string(), "prometheus:FILE or nfd:FILE"),
    ] {
        let out = gpubake(&["probe", "--level", "1", "--emit", &arg]);
        assert_exit(&out, 2);
        let err = stderr(&out);
        assert!(err.contains(says), "{arg}: {err}");
        assert!(stdout(&out).is_empty(), "the probe ran: {}", stdout(&out));
    }
    assert!(entries(prom.parent().unwrap()).is_empty());
    assert!(entries(nfd.parent().unwrap()).is_empty());
}

#[test]
fn a_failing_gpu_is_named_in_the_metrics_and_fails_the_health_label() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = fake_nvml(dir.path(), None) else {
        return;
    };
    let (prom, nfd) = folders(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["probe", "--level", "1", "--json", "--emit"])
        .arg(format!("prometheus:{}", prom.display()))
        .arg("--emit")
        .arg(format!("nfd:{}", nfd.display()))
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .unwrap();
    assert_exit(&out, 1);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let metrics = std::fs::read_to_string(&prom).unwrap();
    assert!(metrics.contains("gpubake_probe_healthy 0\n"), "{metrics}");
    assert!(metrics.contains("gpubake_probe_exit_code 1\n"), "{metrics}");
    assert!(
        metrics.contains("gpubake_probe_check_ok{phase=\"nvml\",check=\"GPU 1\",gpu=\"1\"} 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("driver=\"580.95.05\""),
        "the info metric names the driver: {metrics}"
    );
    // One line per check that was judged, none for a skipped one.
    let judged = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] != "SKIP")
        .map(|c| (c["phase"].as_str().unwrap(), c["name"].as_str().unwrap()))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let lines = metrics
        .lines()
        .filter(|l| l.starts_with("gpubake_probe_check_ok{"))
        .count();
    assert_eq!(lines, judged, "{metrics}");
    if let Some(said) = promtool(&prom) {
        assert_eq!(said.trim(), "", "promtool's lint:\n{said}\n{metrics}");
    }
    let text = std::fs::read_to_string(&nfd).unwrap();
    let (labels, _) = nfd_labels(&text);
    assert_eq!(labels[0].1, "fail", "{text}");
}

/// A file in a directory that does not exist cannot be written: the report is still printed
/// whole before the error, which names the directory, and the run exits 2 (bad input).
#[test]
fn an_emit_file_in_a_missing_directory_is_named_after_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir");
    let target = format!("prometheus:{}", missing.join("gpubake.prom").display());
    let out = gpubake(&["probe", "--level", "1", "--json", "--emit", &target]);
    assert_exit(&out, 2);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{e}: the report was not printed whole: {}", stdout(&out)));
    assert_eq!(report["level"], 1);
    assert!(
        stderr(&out).contains(&missing.display().to_string()),
        "{}",
        stderr(&out)
    );
    assert!(!missing.exists());
}

/// A failing node whose files cannot be written still exits 1, so a prolog drains it: the
/// write error (here the directory's, as a full disk would be) never replaces the verdict.
#[test]
fn a_file_that_cannot_be_written_never_hides_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = fake_nvml(dir.path(), None) else {
        return;
    };
    let missing = dir.path().join("no-such-dir");
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["probe", "--level", "1", "--json", "--emit"])
        .arg(format!(
            "prometheus:{}",
            missing.join("gpubake.prom").display()
        ))
        .arg("--junit")
        .arg(missing.join("probe.xml"))
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .unwrap();
    assert_exit(&out, 1);
    assert!(
        stderr(&out).matches(&missing.display().to_string()).count() >= 2,
        "both unwritten files are named: {}",
        stderr(&out)
    );
}
