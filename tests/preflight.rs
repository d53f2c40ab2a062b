//! `gpubake preflight` on recorded host trees: each failure class the toolkit's issues and
//! NVIDIA's troubleshooting guide name, built from what `nvidia-ctk runtime configure` and
//! `nvidia-ctk cdi generate` write (the toolkit's own code), each giving its finding, the
//! error a user would see and the fix; and on this machine, against `docker info`.

mod common;

use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const DRIVER: &str = "580.95.05";

/// A host's files under a temporary root.
struct Tree {
    dir: tempfile::TempDir,
    packages: std::cell::RefCell<Vec<(String, String)>>,
}

impl Tree {
    fn new() -> Tree {
        Tree {
            dir: tempfile::tempdir().unwrap(),
            packages: Default::default(),
        }
    }

    fn path(&self, path: &str) -> std::path::PathBuf {
        self.dir.path().join(path.trim_start_matches('/'))
    }

    fn file(&self, path: &str, text: &str) -> &Self {
        let at = self.path(path);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, text).unwrap();
        self
    }

    fn exe(&self, path: &str) -> &Self {
        self.file(path, "#!/bin/sh\n");
        std::fs::set_permissions(self.path(path), std::fs::Permissions::from_mode(0o755)).unwrap();
        self
    }

    fn dir(&self, path: &str) -> &Self {
        std::fs::create_dir_all(self.path(path)).unwrap();
        self
    }

    /// An installed package in dpkg's status database.
    fn package(&self, name: &str, version: &str) -> &Self {
        self.packages
            .borrow_mut()
            .push((name.to_string(), version.to_string()));
        let status: String = self
            .packages
            .borrow()
            .iter()
            .map(|(n, v)| {
                format!("Package: {n}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {v}\n\n")
            })
            .collect();
        self.file("/var/lib/dpkg/status", &status)
    }

    /// The driver: its kernel module and the NVML library of `library`'s version.
    fn driver(&self, module: &str, library: Option<&str>) -> &Self {
        self.file(
            "/proc/driver/nvidia/version",
            &format!(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {module}  Release Build  \
                 (dvs-builder@U22-I3-AF03-09-1)  Sun Sep  7 00:00:00 UTC 2025\nGCC version:  gcc \
                 version 12.2.0 (Debian 12.2.0-14)\n"
            ),
        );
        if let Some(version) = library {
            self.file(
                &format!("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}"),
                "",
            );
        }
        self
    }

    /// The toolkit's package and programs, and runc.
    fn toolkit(&self, version: &str) -> &Self {
        self.package("nvidia-container-toolkit", version)
            .package("nvidia-container-toolkit-base", version)
            .exe("/usr/bin/nvidia-container-runtime")
            .exe("/usr/bin/nvidia-container-runtime-hook")
            .exe("/usr/bin/nvidia-ctk")
            .exe("/usr/bin/nvidia-cdi-hook")
            .exe("/usr/sbin/runc")
    }

    /// The Docker Engine of `version`, with `daemon.json` where given.
    fn docker(&self, version: &str, daemon_json: Option<&str>) -> &Self {
        self.package("docker-ce", &format!("5:{version}-1~debian.12~bookworm"))
            .exe("/usr/bin/dockerd");
        if let Some(json) = daemon_json {
            self.file("/etc/docker/daemon.json", json);
        }
        self
    }

    fn preflight(&self) -> (Value, i32) {
        let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(["preflight", "--json", "--root"])
            .arg(self.dir.path())
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}{}", common::stdout(&out), common::stderr(&out)));
        (report, out.status.code().unwrap_or(-1))
    }
}

/// The status and detail of the check `name` of `phase`.
fn check(report: &Value, phase: &str, name: &str) -> (String, String) {
    let found = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["phase"] == phase && c["name"] == name)
        .unwrap_or_else(|| panic!("no check {phase}/{name} in {report:#}"));
    (
        found["status"].as_str().unwrap().to_string(),
        found["detail"].as_str().unwrap().to_string(),
    )
}

fn assert_check(report: &Value, phase: &str, name: &str, status: &str, says: &[&str]) {
    let (got, detail) = check(report, phase, name);
    assert_eq!(got, status, "{phase}/{name}: {detail}");
    for s in says {
        assert!(detail.contains(s), "{phase}/{name} lacks {s:?}: {detail}");
    }
}

/// What `nvidia-ctk runtime configure --runtime=docker` writes.
const DAEMON_JSON_WITH_NVIDIA: &str = "{\n    \"runtimes\": {\n        \"nvidia\": {\n            \"args\": [],\n            \"path\": \"nvidia-container-runtime\"\n        }\n    }\n}";

#[test]
fn a_host_without_the_toolkit_fails_with_dockers_own_error() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .docker("28.2.1", Some("{}"))
        .exe("/usr/sbin/runc");
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(
        &report,
        "toolkit",
        "NVIDIA Container Toolkit",
        "FAIL",
        &[
            "not installed",
            "could not select device driver \"\" with capabilities: [[gpu]]",
        ],
    );
    assert_check(
        &report,
        "docker",
        "--gpus",
        "FAIL",
        &["install nvidia-container-toolkit"],
    );
    assert_check(&report, "driver", "NVML library", "PASS", &[DRIVER]);
}

#[test]
fn the_toolkit_without_dockers_runtime_warns_and_gpus_works_through_the_hook() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.18.1-1")
        .docker("28.2.1", Some("{}"));
    let (report, code) = tree.preflight();
    assert_eq!(code, 0, "{report:#}");
    assert_check(
        &report,
        "docker",
        "runtime nvidia",
        "WARN",
        &[
            "unknown or invalid runtime name: nvidia",
            "nvidia-ctk runtime configure --runtime=docker",
        ],
    );
    assert_check(
        &report,
        "docker",
        "--gpus",
        "PASS",
        &["/usr/bin/nvidia-container-runtime-hook"],
    );
    assert_check(&report, "docker", "CDI", "PASS", &["on (Docker 28.2.1)"]);
    assert_check(
        &report,
        "toolkit",
        "config.toml",
        "PASS",
        &["no file, defaults", "auto (the runtime injects by jit-cdi)"],
    );
}

#[test]
fn cdi_mode_without_a_spec_fails_for_the_runtime_and_the_hook() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.17.8-1")
        .docker("27.5.1", Some(DAEMON_JSON_WITH_NVIDIA))
        .file(
            "/etc/nvidia-container-runtime/config.toml",
            "[nvidia-container-runtime]\nmode = \"cdi\"\n",
        );
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(
        &report,
        "docker",
        "runtime nvidia",
        "PASS",
        &["/usr/bin/nvidia-container-runtime"],
    );
    assert_check(
        &report,
        "cdi",
        "CDI spec",
        "FAIL",
        &[
            "unresolvable CDI devices nvidia.com/gpu=all",
            "nvidia-ctk cdi generate",
        ],
    );
    assert_check(
        &report,
        "docker",
        "--gpus",
        "FAIL",
        &["invoking the NVIDIA Container Runtime Hook directly"],
    );
    // Docker 27 has CDI only behind its feature flag.
    assert_check(
        &report,
        "docker",
        "CDI",
        "WARN",
        &["off (Docker 27.5.1)", "\"cdi\": true"],
    );
}

/// containerd's config in each version the toolkit writes, with and without `enable_cdi`:
/// version 2 in place (toolkit 1.17), version 3 through the toolkit's drop-in (1.18.1 and
/// later) that the top-level file imports.
#[test]
fn containerd_configs_of_versions_2_and_3_with_and_without_enable_cdi() {
    let nvidia = |plugin: &str, cdi: Option<bool>| {
        format!(
            "{}[plugins.\"{plugin}\".containerd.runtimes.nvidia]\n  runtime_type = \
             \"io.containerd.runc.v2\"\n[plugins.\"{plugin}\".containerd.runtimes.nvidia.options]\n  \
             BinaryName = \"/usr/bin/nvidia-container-runtime\"\n  SystemdCgroup = true\n\
             [plugins.\"{plugin}\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n",
            cdi.map(|c| format!("[plugins.\"{plugin}\"]\n  enable_cdi = {c}\n"))
                .unwrap_or_default()
        )
    };
    for (version, cdi, on) in [
        (2, None, false),
        (2, Some(true), true),
        (3, None, true),
        (3, Some(false), false),
    ] {
        let tree = Tree::new();
        tree.driver(DRIVER, Some(DRIVER))
            .toolkit("1.18.1-1")
            .exe("/usr/bin/containerd");
        if version == 2 {
            tree.file(
                "/etc/containerd/config.toml",
                &format!("version = 2\n{}", nvidia("io.containerd.grpc.v1.cri", cdi)),
            );
        } else {
            tree.file(
                "/etc/containerd/config.toml",
                "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n",
            )
            .file(
                "/etc/containerd/conf.d/99-nvidia.toml",
                &format!(
                    "version = 3\n{}",
                    nvidia("io.containerd.cri.v1.runtime", cdi)
                ),
            );
        }
        let (report, code) = tree.preflight();
        assert_eq!(code, 0, "version {version}: {report:#}");
        assert_check(
            &report,
            "containerd",
            "runtime nvidia",
            "PASS",
            &["/usr/bin/nvidia-container-runtime"],
        );
        let (_, detail) = check(&report, "containerd", "CDI");
        assert!(
            detail.starts_with(if on { "on" } else { "off" }),
            "version {version}, enable_cdi {cdi:?}: {detail}"
        );
        assert_eq!(report["facts"]["containerd"]["version"], version);
    }
}

#[test]
fn a_containerd_drop_in_nothing_imports_or_in_the_wrong_versions_table_is_named() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.18.1-1")
        .exe("/usr/bin/containerd")
        .file("/etc/containerd/config.toml", "version = 2\n")
        .file(
            "/etc/containerd/conf.d/99-nvidia.toml",
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n\
             BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
        );
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(
        &report,
        "containerd",
        "toolkit drop-in",
        "FAIL",
        &[
            "/etc/containerd/conf.d/99-nvidia.toml is not imported",
            "imports =",
        ],
    );
    assert_check(
        &report,
        "containerd",
        "runtime nvidia",
        "WARN",
        &["RuntimeClass nvidia"],
    );

    // Without a top-level file containerd reads nothing, the drop-in included.
    std::fs::remove_file(tree.path("/etc/containerd/config.toml")).unwrap();
    let (report, _) = tree.preflight();
    assert_check(
        &report,
        "containerd",
        "config",
        "FAIL",
        &["reads no config at all and ignores /etc/containerd/conf.d/99-nvidia.toml"],
    );

    // A version 3 file with the runtime under version 2's table: containerd 2 never sees it.
    tree.file(
        "/etc/containerd/config.toml",
        "version = 3\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n\
         BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
    );
    std::fs::remove_file(tree.path("/etc/containerd/conf.d/99-nvidia.toml")).unwrap();
    let (report, _) = tree.preflight();
    assert_check(
        &report,
        "containerd",
        "runtime nvidia",
        "WARN",
        &["plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes"],
    );
}

/// What `nvidia-ctk cdi generate` writes, for driver `version`, with its hook.
fn spec(version: &str) -> String {
    format!(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    \
         deviceNodes:\n    - path: /dev/nvidia0\n- name: all\n  containerEdits:\n    deviceNodes:\n    \
         - path: /dev/nvidia0\ncontainerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n  hooks:\n  \
         - hookName: createContainer\n    path: /usr/bin/nvidia-cdi-hook\n    args: [nvidia-cdi-hook, \
         update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]\n  mounts:\n  - hostPath: \
         /usr/lib/x86_64-linux-gnu/libcuda.so.{version}\n    containerPath: \
         /usr/lib/x86_64-linux-gnu/libcuda.so.{version}\n    options: [ro, nosuid, nodev, bind]\n"
    )
}

#[test]
fn a_stale_spec_and_a_spec_whose_hook_is_missing_fail() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.18.1-1")
        .docker("28.2.1", Some(DAEMON_JSON_WITH_NVIDIA))
        .file("/dev/nvidia0", "")
        .file("/dev/nvidiactl", "")
        .file("/usr/lib/x86_64-linux-gnu/libcuda.so.575.57.08", "")
        .file("/var/run/cdi/nvidia.yaml", &spec("575.57.08"));
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(
        &report,
        "cdi",
        "CDI driver libraries",
        "FAIL",
        &[
            "another driver than the running 580.95.05",
            "nvidia-ctk cdi generate",
        ],
    );
    assert_check(&report, "cdi", "CDI hooks", "PASS", &["1 hooks"]);

    std::fs::remove_file(tree.path("/usr/bin/nvidia-cdi-hook")).unwrap();
    tree.file(
        &format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER}"),
        "",
    )
    .file("/var/run/cdi/nvidia.yaml", &spec(DRIVER));
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(&report, "cdi", "CDI driver libraries", "PASS", &[DRIVER]);
    assert_check(
        &report,
        "cdi",
        "CDI hooks",
        "FAIL",
        &["/usr/bin/nvidia-cdi-hook", "does not start"],
    );
}

#[test]
fn libraries_of_another_version_than_the_module_or_none_at_all_fail() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some("575.57.08")).toolkit("1.18.1-1");
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(
        &report,
        "driver",
        "NVML library",
        "FAIL",
        &[
            "Driver/library version mismatch",
            "libnvidia-ml.so.575.57.08",
        ],
    );
    std::fs::remove_file(tree.path("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.575.57.08")).unwrap();
    let (report, _) = tree.preflight();
    assert_check(
        &report,
        "driver",
        "NVML library",
        "FAIL",
        &["load library failed: libnvidia-ml.so.1"],
    );
    // No engine: said, not failed.
    let bare = Tree::new();
    bare.driver(DRIVER, Some(DRIVER));
    let (bare_report, code) = bare.preflight();
    assert_eq!(code, 0, "{bare_report:#}");
    assert_check(
        &bare_report,
        "toolkit",
        "NVIDIA Container Toolkit",
        "SKIP",
        &["not installed"],
    );
    assert_check(
        &report,
        "engines",
        "container engine",
        "SKIP",
        &["no Docker Engine"],
    );
}

#[test]
fn a_host_without_a_driver_is_not_judged_and_bad_configs_are_named_not_crashed_on() {
    let tree = Tree::new();
    tree.toolkit("1.18.1-1");
    let (report, code) = tree.preflight();
    assert_eq!(code, 3, "{report:#}");
    assert_check(
        &report,
        "driver",
        "kernel module",
        "SKIP",
        &["no NVIDIA kernel module"],
    );

    tree.driver(DRIVER, Some(DRIVER))
        .docker(
            "28.2.1",
            Some("{\n  \"runtimes\": {\n    \"nvidia\": {\"path\": }\n  }\n}"),
        )
        .file(
            "/etc/nvidia-container-runtime/config.toml",
            "[nvidia-container-cli]\nldconfig = \"/sbin/ldconfig\"\n",
        )
        .exe("/usr/bin/containerd")
        .file("/etc/containerd/config.toml", "version = 2\n[plugins\n");
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(
        &report,
        "docker",
        "daemon.json",
        "FAIL",
        &["/etc/docker/daemon.json:3:"],
    );
    assert_check(
        &report,
        "containerd",
        "config",
        "FAIL",
        &["/etc/containerd/config.toml:2: not TOML"],
    );
    assert_check(
        &report,
        "toolkit",
        "config.toml",
        "FAIL",
        &["is not host-relative", "@/sbin/ldconfig"],
    );
}

/// Creates the character device `path` (MAJOR:MINOR) in the tree; false where this process
/// may not (not root).
fn mknod(tree: &Tree, path: &str, major: u32, minor: u32) -> bool {
    let at = tree.path(path);
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and plain integers.
    unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        ) == 0
    }
}

/// The `systemctl daemon-reload` case: Docker's `--gpus` goes through the legacy hook, and on
/// cgroup v2 under systemd dockerd uses the systemd cgroup driver unless told otherwise.
#[test]
fn the_legacy_hook_under_systemds_cgroup_driver_loses_gpus_on_a_daemon_reload() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.17.8-1")
        .docker("27.5.1", Some("{}"))
        .file(
            "/sys/fs/cgroup/cgroup.controllers",
            "cpuset cpu io memory pids\n",
        )
        .dir("/run/systemd/system");
    let (report, _) = tree.preflight();
    let (_, detail) = check(&report, "cgroup", "daemon-reload");
    assert!(
        detail.contains("Failed to initialize NVML: Unknown Error"),
        "{detail}"
    );
    assert_eq!(report["facts"]["docker"]["cgroup_driver"], "systemd");

    if mknod(&tree, "/dev/nvidia0", 195, 0) && mknod(&tree, "/dev/nvidiactl", 195, 255) {
        let (report, code) = tree.preflight();
        assert_eq!(code, 1, "{report:#}");
        assert_check(
            &report,
            "cgroup",
            "daemon-reload",
            "FAIL",
            &[
                "/dev/nvidia0",
                "/dev/nvidiactl",
                "nvidia-ctk system create-dev-char-symlinks",
            ],
        );
        std::fs::create_dir_all(tree.path("/dev/char")).unwrap();
        for link in ["195:0", "195:255"] {
            std::os::unix::fs::symlink("../nvidia0", tree.path(&format!("/dev/char/{link}")))
                .unwrap();
        }
        let (report, _) = tree.preflight();
        assert_check(
            &report,
            "cgroup",
            "daemon-reload",
            "PASS",
            &["/dev/char link"],
        );
    } else {
        eprintln!("skipping the /dev/char half: mknod needs root");
    }

    // cgroupfs, as exec-opts may choose: no risk.
    tree.file(
        "/etc/docker/daemon.json",
        "{\"exec-opts\": [\"native.cgroupdriver=cgroupfs\"]}",
    );
    let (report, _) = tree.preflight();
    assert_check(&report, "cgroup", "daemon-reload", "PASS", &["no engine"]);
    // CDI mode for the runtime and Docker 29.2 with nvidia-cdi-hook: `--gpus` goes through CDI.
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.18.1-1")
        .docker("29.2.0", Some("{}"))
        .file("/sys/fs/cgroup/cgroup.controllers", "")
        .dir("/run/systemd/system")
        .file("/var/run/cdi/nvidia.yaml", &spec(DRIVER));
    let (report, _) = tree.preflight();
    assert_check(&report, "cgroup", "daemon-reload", "PASS", &["no engine"]);
    assert_check(&report, "docker", "--gpus", "PASS", &["through CDI"]);
}

/// A config changed after the daemon started: the daemon's start from its /proc entry and
/// the boot time, against the file's modification time.
#[test]
fn a_config_newer_than_the_running_daemon_is_named() {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.18.1-1")
        .docker("28.2.1", Some(DAEMON_JSON_WITH_NVIDIA));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    // Booted 1000 s ago; dockerd started 100 s after boot.
    tree.file(
        "/proc/stat",
        &format!("cpu  1 2 3 4\nbtime {}\n", now - 1000),
    )
    .file("/proc/4242/cmdline", "/usr/bin/dockerd\0-H\0fd://\0")
    .file(
        "/proc/4242/stat",
        &format!(
            "4242 (dockerd) S 1 4242 4242 0 -1 4194560 1 0 0 0 1 1 0 0 20 0 30 0 {} 1 1",
            100 * ticks
        ),
    );
    let set_mtime = |ago: u64| {
        std::fs::File::options()
            .write(true)
            .open(tree.path("/etc/docker/daemon.json"))
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(ago))
            .unwrap();
    };
    set_mtime(10);
    let (report, _) = tree.preflight();
    assert_check(
        &report,
        "docker",
        "config loaded",
        "WARN",
        &[
            "changed after the running dockerd started",
            "systemctl restart docker",
        ],
    );
    assert_eq!(report["facts"]["docker"]["pid"], 4242);
    set_mtime(2000);
    let (report, _) = tree.preflight();
    assert_check(
        &report,
        "docker",
        "config loaded",
        "PASS",
        &["started after"],
    );
}

/// The preflight's view of this machine's Docker Engine is what `docker info` says of it.
#[test]
fn this_machines_docker_is_seen_as_docker_info_sees_it() {
    if !common::have("docker", "info") {
        return;
    }
    let info: Value = serde_json::from_str(&common::run(Command::new("docker").args([
        "info",
        "--format",
        "{{json .}}",
    ])))
    .unwrap();
    let out = common::gpubake(&["preflight", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let docker = &report["facts"]["docker"];
    assert!(docker.is_object(), "no Docker seen: {report:#}");
    assert_eq!(docker["cgroup_driver"], info["CgroupDriver"], "{docker}");
    assert_eq!(
        docker["default_runtime"], info["DefaultRuntime"],
        "{docker}"
    );
    for name in docker["runtimes"].as_object().unwrap().keys() {
        assert!(
            info["Runtimes"].get(name).is_some(),
            "{name}: {}",
            info["Runtimes"]
        );
    }
    // The running dockerd is the one found.
    let pid: u64 = std::fs::read_to_string("/var/run/docker.pid")
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(0);
    if pid != 0 {
        assert_eq!(docker["pid"], pid, "{docker}");
    }
}

/// Two specs of one kind in one directory, as a hand-written spec beside the toolkit's makes:
/// the CDI library drops both copies of each device they share. A `.yml` spec is never read.
#[test]
fn two_specs_of_one_kind_in_one_directory_conflict_and_a_yml_spec_is_not_read() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.18.1-1")
        .docker("28.2.1", Some(DAEMON_JSON_WITH_NVIDIA))
        .file("/dev/nvidia0", "")
        .file("/dev/nvidiactl", "")
        .file(
            &format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER}"),
            "",
        )
        .file("/var/run/cdi/nvidia.yaml", &spec(DRIVER))
        .file(
            "/var/run/cdi/gpus.json",
            &spec(DRIVER).replace("- name: all\n", "- name: gpu0\n"),
        )
        // The same devices in /etc/cdi: the later directory wins, silently.
        .file("/etc/cdi/nvidia.yaml", &spec(DRIVER))
        .file("/etc/cdi/old.yml", "cdiVersion: [not parsed\n");
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(
        &report,
        "cdi",
        "CDI device nvidia.com/gpu=0",
        "FAIL",
        &[
            "gpus.json",
            "nvidia.yaml",
            "conflicting device",
            "unresolvable CDI devices nvidia.com/gpu=0",
        ],
    );
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .filter(|n| n.starts_with("CDI device ") && n.contains('='))
        .collect();
    assert_eq!(
        names,
        ["CDI device nvidia.com/gpu=0"],
        "only the shared device"
    );
    assert_check(
        &report,
        "cdi",
        "CDI spec names",
        "WARN",
        &["old.yml is never read"],
    );
}

/// The toolkit loads NVML by its soname through the host's loader cache, so a driver whose
/// libraries lie outside the usual directories (`/usr/local/nvidia/lib64`, as GPU images and
/// some driver installers put them) is found through `/etc/ld.so.cache`, written here by
/// glibc's own ldconfig for the tree; without the cache entry the hook cannot load it.
#[test]
fn the_nvml_library_is_found_through_the_hosts_loader_cache() {
    if !common::have("gcc", "--version") || !std::path::Path::new("/sbin/ldconfig").exists() {
        return;
    }
    let tree = Tree::new();
    tree.driver(DRIVER, None)
        .toolkit("1.18.1-1")
        .file("/etc/ld.so.conf", "/usr/local/nvidia/lib64\n")
        .file(
            "/usr/local/nvidia/lib64/nvml.c",
            "int nvmlInit_v2(void) { return 0; }\n",
        );
    common::gcc(
        &tree.path("/usr/local/nvidia/lib64"),
        &[
            "-shared",
            "-fPIC",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            &format!("libnvidia-ml.so.{DRIVER}"),
            "nvml.c",
        ],
    );
    let (report, _) = tree.preflight();
    assert_check(
        &report,
        "driver",
        "NVML library",
        "FAIL",
        &["load library failed: libnvidia-ml.so.1"],
    );
    common::run(
        Command::new("/sbin/ldconfig")
            .arg("-r")
            .arg(tree.dir.path()),
    );
    assert!(
        tree.path("/usr/local/nvidia/lib64/libnvidia-ml.so.1")
            .is_symlink()
    );
    let (report, _) = tree.preflight();
    assert_check(
        &report,
        "driver",
        "NVML library",
        "PASS",
        &[&format!("libnvidia-ml.so.{DRIVER}")],
    );
}

/// What `nvidia-ctk runtime configure --runtime=crio` writes (1.19.1 and later, into
/// /etc/crio/crio.conf.d/; 1.18.0 to 1.19.0 into /etc/crio/conf.d/, which CRI-O never reads).
const CRIO_DROP_IN: &str = "[crio]\n  [crio.runtime]\n    [crio.runtime.runtimes]\n      \
    [crio.runtime.runtimes.nvidia]\n        runtime_path = \"/usr/bin/nvidia-container-runtime\"\n        \
    runtime_type = \"oci\"\n";

#[test]
fn a_cri_o_drop_in_is_read_where_cri_o_reads_and_named_where_it_does_not() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.19.1-1")
        .exe("/usr/bin/crio")
        .file("/etc/crio/crio.conf.d/99-nvidia.toml", CRIO_DROP_IN);
    let (report, code) = tree.preflight();
    assert_eq!(code, 0, "{report:#}");
    assert_check(
        &report,
        "cri-o",
        "runtime nvidia",
        "PASS",
        &["/usr/bin/nvidia-container-runtime"],
    );
    assert_check(
        &report,
        "cri-o",
        "config",
        "PASS",
        &["/etc/crio/crio.conf.d/99-nvidia.toml"],
    );

    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.18.2-1")
        .exe("/usr/bin/crio")
        .file("/etc/crio/conf.d/99-nvidia.toml", CRIO_DROP_IN);
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(
        &report,
        "cri-o",
        "toolkit drop-in",
        "FAIL",
        &[
            "/etc/crio/conf.d/99-nvidia.toml",
            "CRI-O does not read",
            "/etc/crio/crio.conf.d/",
        ],
    );
    assert_check(
        &report,
        "cri-o",
        "runtime nvidia",
        "WARN",
        &["RuntimeClass nvidia"],
    );
}

/// CRI-O's cgroup manager is systemd unless set: the toolkit's runtime in legacy mode (auto
/// before 1.18) is the daemon-reload case there too.
#[test]
fn cri_o_in_legacy_mode_under_its_default_cgroup_manager_is_at_risk() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.17.8-1")
        .exe("/usr/bin/crio")
        .file("/etc/crio/crio.conf.d/99-nvidia.toml", CRIO_DROP_IN);
    let (report, _) = tree.preflight();
    let (status, detail) = check(&report, "cgroup", "daemon-reload");
    assert_ne!(status, "PASS", "{detail}");
    assert!(
        detail.contains("CRI-O's runtime nvidia in legacy mode"),
        "{detail}"
    );
    // cgroupfs: no risk.
    tree.file(
        "/etc/crio/crio.conf.d/10-cgroupfs.conf",
        "[crio.runtime]\ncgroup_manager = \"cgroupfs\"\n",
    );
    let (report, _) = tree.preflight();
    assert_check(&report, "cgroup", "daemon-reload", "PASS", &["no engine"]);
}

/// podman reads the CDI directories its containers.conf names, and the toolkit's legacy OCI
/// hook beside CDI is named.
#[test]
fn podmans_cdi_directories_are_searched_and_its_legacy_hook_is_named() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.18.1-1")
        .exe("/usr/bin/podman")
        .file(
            "/etc/containers/containers.conf",
            "[engine]\ncdi_spec_dirs = [\"/opt/cdi\"]\n",
        )
        .file(
            "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json",
            "{\"version\": \"1.0.0\", \"hook\": {\"path\": \"/usr/bin/nvidia-container-runtime-hook\", \
             \"args\": [\"nvidia-container-runtime-hook\", \"prestart\"]}, \"when\": {\"always\": true}, \
             \"stages\": [\"prestart\"]}",
        )
        .file("/opt/cdi/nvidia.yaml", &spec("575.57.08"));
    let (report, _) = tree.preflight();
    assert_check(
        &report,
        "podman",
        "legacy hook",
        "WARN",
        &["oci-nvidia-hook.json", "--device nvidia.com/gpu=all"],
    );
    // The spec in podman's own directory is read, and judged.
    assert_check(
        &report,
        "cdi",
        "CDI driver libraries",
        "FAIL",
        &["/opt/cdi/nvidia.yaml"],
    );
}

/// The driver's modules and daemons: a module left from another driver, nvidia_uvm and
/// nvidia_peermem missing, and the fabric manager an NVSwitch system needs.
#[test]
fn modules_of_another_driver_and_a_missing_fabric_manager_are_named() {
    let tree = Tree::new();
    tree.driver(DRIVER, Some(DRIVER))
        .toolkit("1.18.1-1")
        .file(
            "/proc/modules",
            "nvidia_modeset 1 0 - Live 0x0 (POE)\nnvidia 2 1 nvidia_modeset, Live 0x0 (POE)\n",
        )
        .file("/sys/module/nvidia/version", &format!("{DRIVER}\n"))
        .file("/sys/module/nvidia_modeset/version", "575.57.08\n")
        .dir("/sys/class/infiniband/mlx5_0")
        .file("/proc/1/cmdline", "/sbin/init\0")
        .dir("/proc/driver/nvidia-nvswitch/devices/0000:05:00.0");
    let (report, code) = tree.preflight();
    assert_eq!(code, 1, "{report:#}");
    assert_check(
        &report,
        "driver",
        "kernel modules",
        "FAIL",
        &["nvidia_modeset 575.57.08", "reboot"],
    );
    assert_check(
        &report,
        "driver",
        "nvidia_uvm",
        "WARN",
        &["modprobe nvidia-uvm"],
    );
    assert_check(
        &report,
        "driver",
        "nvidia_peermem",
        "WARN",
        &["GPU Direct RDMA"],
    );
    assert_check(
        &report,
        "driver",
        "persistence daemon",
        "WARN",
        &["nvidia-persistenced"],
    );
    assert_check(
        &report,
        "driver",
        "fabric manager",
        "FAIL",
        &["1 NVSwitches", "802", "nvidia-fabricmanager"],
    );
    tree.file("/proc/2/cmdline", "/usr/bin/nv-fabricmanager\0-c\0/usr/share/nvidia/nvswitch/fabricmanager.cfg\0")
        .file("/proc/3/cmdline", "/usr/bin/nvidia-persistenced\0--user\0nvidia-persistenced\0")
        .file("/sys/module/nvidia_modeset/version", &format!("{DRIVER}\n"))
        .file(
            "/proc/modules",
            "nvidia_uvm 1 0 - Live 0x0 (POE)\nnvidia_peermem 1 0 - Live 0x0 (POE)\nnvidia 2 1 - Live 0x0 (POE)\n",
        );
    let (report, _) = tree.preflight();
    assert_check(&report, "driver", "kernel modules", "PASS", &[DRIVER]);
    assert_check(
        &report,
        "driver",
        "fabric manager",
        "PASS",
        &["nv-fabricmanager runs"],
    );
    assert_check(&report, "driver", "persistence daemon", "PASS", &[]);
    for gone in ["nvidia_uvm", "nvidia_peermem"] {
        assert!(
            !report["checks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["name"] == gone),
            "{gone}: {report:#}"
        );
    }
}
