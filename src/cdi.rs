//! The Container Device Interface: the node's own description of its GPUs, as
//! `nvidia-ctk cdi generate` writes it (`/etc/cdi/*.yaml`, `/var/run/cdi/*.json`). A spec names
//! device nodes, driver libraries to bind-mount, environment and hooks per device; gpubake
//! applies those edits to a container instead of re-implementing the toolkit's discovery.
//! The format is the container-device-interface project's SPEC.md.

use crate::error::{Error, Result};
use crate::verdict::Check;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where runtimes look for specs, lowest priority first: a spec in `/var/run/cdi` (written at
/// boot) overrides one of the same kind in `/etc/cdi`.
pub const DEFAULT_SPEC_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// The directories searched, for messages: the ones given, which need not be the defaults.
fn joined(dirs: &[PathBuf], sep: &str) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(sep)
}

/// One spec file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The spec format's version.
    pub cdi_version: String,
    /// `vendor.com/class`, e.g. `nvidia.com/gpu`.
    pub kind: String,
    /// The devices.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Edits applied whenever any device of this spec is used.
    #[serde(default)]
    pub container_edits: Edits,
    /// The file it came from (not part of the format).
    #[serde(skip)]
    pub file: PathBuf,
}

/// One named device.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Its name within the kind: `0`, `GPU-<uuid>`, `all`.
    pub name: String,
    /// What using it changes in the container.
    #[serde(default)]
    pub container_edits: Edits,
}

/// Changes to a container's configuration.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Edits {
    /// `NAME=VALUE` entries.
    #[serde(default)]
    pub env: Vec<String>,
    /// Device nodes to create.
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    /// Host files and directories to mount.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Programs the runtime runs at points of the container's life.
    #[serde(default)]
    pub hooks: Vec<Hook>,
    /// Supplementary groups for the container's process.
    #[serde(default)]
    pub additional_gids: Vec<u32>,
}

/// A device node.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Its path in the container.
    pub path: String,
    /// Its path on the host, when different.
    pub host_path: Option<String>,
    /// `c` or `b`; read from the host node when absent.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Major number; read from the host node when absent.
    pub major: Option<i64>,
    /// Minor number; read from the host node when absent.
    pub minor: Option<i64>,
    /// Cgroup access, `rwm` when absent.
    pub permissions: Option<String>,
    /// Mode bits of the node.
    pub file_mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// The node on the host.
    pub fn host(&self) -> &str {
        self.host_path.as_deref().unwrap_or(&self.path)
    }
}

/// A mount.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination in the container.
    pub container_path: String,
    /// Mount options.
    #[serde(default)]
    pub options: Vec<String>,
    /// Filesystem type, `bind` when absent.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// A hook.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// `createContainer`, `startContainer`, `prestart`, `poststart`, `poststop`, ...
    pub hook_name: String,
    /// The program.
    pub path: String,
    /// Its arguments, the program's name first.
    #[serde(default)]
    pub args: Vec<String>,
    /// Its environment.
    #[serde(default)]
    pub env: Vec<String>,
    /// Seconds before the runtime gives up on it.
    pub timeout: Option<i64>,
}

/// Every spec found in `dirs`, later directories overriding earlier ones kind by kind.
/// A directory that does not exist holds no spec; a spec that does not parse is bad input
/// naming the file, since a runtime would refuse it too.
pub fn load(dirs: &[PathBuf]) -> Result<Vec<Spec>> {
    let mut by_kind: BTreeMap<String, Spec> = BTreeMap::new();
    for dir in dirs {
        for file in spec_files(dir) {
            let spec = parse(&file)?;
            by_kind.insert(spec.kind.clone(), spec);
        }
    }
    Ok(by_kind.into_values().collect())
}

/// The spec files the CDI library reads in `dir`: `*.json` and `*.yaml` directly in it, in
/// name order. It skips a `*.yml` file and does not walk subdirectories.
fn spec_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "json")
            )
        })
        .collect();
    files.sort();
    files
}

/// The `*.yml` files in `dirs`: specs by their content that the CDI library never reads.
pub fn ignored_files(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|read| read.filter_map(|e| e.ok().map(|e| e.path())))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("yml"))
        .collect();
    found.sort();
    found
}

/// The devices two specs of one directory both define, with the two files: the CDI library
/// gives the specs of a directory one priority, records `conflicting device` against both
/// and keeps neither copy, so a request for the device is unresolvable. (Across directories
/// the later one wins, silently.)
pub fn conflicts(dirs: &[PathBuf]) -> Result<Vec<(String, PathBuf, PathBuf)>> {
    let mut found = Vec::new();
    for dir in dirs {
        let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
        for file in spec_files(dir) {
            let spec = parse(&file)?;
            for device in &spec.devices {
                let name = format!("{}={}", spec.kind, device.name);
                match seen.get(&name) {
                    Some(first) => found.push((name, first.clone(), file.clone())),
                    None => {
                        seen.insert(name, file.clone());
                    }
                }
            }
        }
    }
    Ok(found)
}

/// Specs generated for the largest nodes are tens of kilobytes; a cap keeps a stray file in
/// /etc/cdi from being read whole into memory.
const MAX_SPEC_BYTES: u64 = 4 << 20;

/// Reads one spec file (YAML, or JSON which YAML reads too).
pub fn parse(file: &Path) -> Result<Spec> {
    let bytes =
        crate::fsutil::read_capped(file, MAX_SPEC_BYTES).map_err(|e| Error::reading(file, e))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        Error::Usage(format!(
            "{}: not a CDI spec: not UTF-8 text",
            file.display()
        ))
    })?;
    let mut spec: Spec = serde_yaml::from_str(&text).map_err(|e| {
        Error::Usage(format!(
            "{}{}: not a CDI spec: {e}",
            file.display(),
            e.location()
                .map(|l| format!(":{}:{}", l.line(), l.column()))
                .unwrap_or_default()
        ))
    })?;
    if !spec.kind.contains('/') {
        return Err(Error::Usage(format!(
            "{}: kind `{}` is not of the form vendor.com/class",
            file.display(),
            spec.kind
        )));
    }
    spec.file = file.to_path_buf();
    Ok(spec)
}

/// The edits for fully-qualified device names (`nvidia.com/gpu=all`, `nvidia.com/gpu=0`):
/// each spec's common edits once, then each device's. A node without a spec of the kind lacks
/// something (an environment error); a device its spec does not list is a wrong name on the
/// command line (a usage error naming the devices the spec has), as `probe --devices 7` is.
pub fn edits_for(specs: &[Spec], searched: &[PathBuf], names: &[String]) -> Result<Vec<Edits>> {
    let mut out = Vec::new();
    let mut used_specs: Vec<&str> = Vec::new();
    for name in names {
        let (kind, device) = name.split_once('=').ok_or_else(|| {
            Error::Usage(format!(
                "--device {name}: expected a CDI name such as nvidia.com/gpu=all"
            ))
        })?;
        let spec = specs.iter().find(|s| s.kind == kind).ok_or_else(|| {
            Error::Environment(if specs.is_empty() {
                format!(
                    "--device {name}: no CDI spec on this node (looked in {}); \
                     `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` writes one",
                    joined(searched, ", ")
                )
            } else {
                format!(
                    "--device {name}: no CDI spec for kind {kind}; the node has {}",
                    specs
                        .iter()
                        .map(|s| s.kind.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        })?;
        let found = spec
            .devices
            .iter()
            .find(|d| d.name == device)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "--device {name}: {} has no device `{device}`; it has {}",
                    spec.file.display(),
                    spec.devices
                        .iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        if !used_specs.contains(&spec.kind.as_str()) {
            used_specs.push(&spec.kind);
            out.push(spec.container_edits.clone());
        }
        out.push(found.container_edits.clone());
    }
    Ok(out)
}

/// A preflight check of the node's CDI specs: held or not, with what was found.
fn finding(name: &str, ok: bool, detail: String) -> Check {
    Check::held("cdi", name, if ok { Ok(detail) } else { Err(detail) })
}

/// The version of the running kernel driver, from `/proc/driver/nvidia/version`'s first line
/// (`NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  ...`, or `Open Kernel Module`).
pub fn driver_version(proc_version: &str) -> Option<String> {
    let line = proc_version.lines().next()?;
    let after = line.split("Kernel Module").nth(1)?;
    after
        .split_whitespace()
        .find(|v| v.contains('.') && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_string)
}

/// The driver version a library's file name carries: `libcuda.so.580.95.05` -> `580.95.05`.
/// Only the driver's own libraries (libcuda, libnvidia-*, libnvcuvid, libnvoptix) carry it;
/// others (libnvrtc, libcudadebugger's soname) are not judged.
fn library_driver_version(file: &str) -> Option<&str> {
    let name = file.rsplit('/').next()?;
    let driver_owned = name.starts_with("libcuda.so.")
        || name.starts_with("libnvidia-")
        || name.starts_with("libnvcuvid.so.")
        || name.starts_with("libnvoptix.so.");
    if !driver_owned {
        return None;
    }
    let version = name.split_once(".so.")?.1;
    // A soname link (`libcuda.so.1`) carries no driver version.
    (version.matches('.').count() >= 1).then_some(version)
}

/// Preflight of the node's specs: one exists for GPUs, every device node it lists exists on
/// the host, and every driver library it mounts exists and belongs to the running driver (a
/// spec left behind by a driver upgrade names files that are gone, and containers then cannot
/// find libcuda). `exists` and `driver` are injected so the checks run anywhere.
pub fn preflight(
    specs: &[Spec],
    searched: &[PathBuf],
    driver: Option<&str>,
    exists: &dyn Fn(&str) -> bool,
) -> Vec<Check> {
    let gpu_specs: Vec<&Spec> = specs
        .iter()
        .filter(|s| s.kind == "nvidia.com/gpu")
        .collect();
    let mut out = vec![finding(
        "CDI spec",
        !gpu_specs.is_empty(),
        match gpu_specs.first() {
            Some(s) => format!(
                "{} (CDI {}): {} devices: {}",
                s.file.display(),
                s.cdi_version,
                s.devices.len(),
                s.devices
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => format!(
                "no spec of kind nvidia.com/gpu in {}; `nvidia-ctk cdi generate` writes one",
                joined(searched, " or ")
            ),
        },
    )];
    for spec in gpu_specs {
        let all_edits = std::iter::once(&spec.container_edits)
            .chain(spec.devices.iter().map(|d| &d.container_edits));
        let mut missing_hooks: Vec<String> = Vec::new();
        let mut missing_nodes: Vec<String> = Vec::new();
        let mut missing_files: Vec<String> = Vec::new();
        let mut stale: Vec<String> = Vec::new();
        let (mut nodes, mut libs) = (0usize, 0usize);
        let mut hooks = 0usize;
        for edits in all_edits {
            for hook in &edits.hooks {
                hooks += 1;
                if !exists(&hook.path) && !missing_hooks.contains(&hook.path) {
                    missing_hooks.push(hook.path.clone());
                }
            }
            for node in &edits.device_nodes {
                nodes += 1;
                if !exists(node.host()) && !missing_nodes.contains(&node.host().to_string()) {
                    missing_nodes.push(node.host().to_string());
                }
            }
            for mount in &edits.mounts {
                libs += 1;
                if !exists(&mount.host_path) {
                    if !missing_files.contains(&mount.host_path) {
                        missing_files.push(mount.host_path.clone());
                    }
                    continue;
                }
                if let (Some(have), Some(running)) =
                    (library_driver_version(&mount.host_path), driver)
                    && have != running
                    && !stale.contains(&mount.host_path)
                {
                    stale.push(mount.host_path.clone());
                }
            }
        }
        let file = spec.file.display();
        out.push(finding(
            "CDI device nodes",
            missing_nodes.is_empty(),
            if missing_nodes.is_empty() {
                format!("{nodes} listed in {file}, all present")
            } else {
                format!(
                    "{file} lists nodes the host lacks: {}",
                    missing_nodes.join(", ")
                )
            },
        ));
        if hooks > 0 {
            out.push(finding(
                "CDI hooks",
                missing_hooks.is_empty(),
                if missing_hooks.is_empty() {
                    format!("{hooks} hooks in {file}, their programs present")
                } else {
                    format!(
                        "{file} names hooks whose programs the host lacks: {}; a container \
                         given its devices does not start, since runc cannot run the hook; \
                         install nvidia-container-toolkit-base or regenerate the spec \
                         (`nvidia-ctk cdi generate`)",
                        missing_hooks.join(", ")
                    )
                },
            ));
        }
        out.push(finding(
            "CDI driver libraries",
            missing_files.is_empty() && stale.is_empty(),
            if !stale.is_empty() {
                format!(
                    "{file} was written for another driver than the running {}: {}; \
                     regenerate it (`nvidia-ctk cdi generate`)",
                    driver.unwrap_or("?"),
                    stale.join(", ")
                )
            } else if !missing_files.is_empty() {
                format!(
                    "{file} mounts files the host lacks (a driver upgrade since it was written?): {}",
                    missing_files.join(", ")
                )
            } else {
                format!(
                    "{libs} mounts in {file}, all present{}",
                    driver
                        .map(|d| format!(", libraries of driver {d}"))
                        .unwrap_or_default()
                )
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia1
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  deviceNodes:
  - path: /dev/nvidiactl
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05
    options: [ro, nosuid, nodev, bind]
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache]
"#;

    fn spec_in(dir: &Path, name: &str, text: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        file
    }

    #[test]
    fn a_spec_file_over_the_cap_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("huge.yaml");
        let mut text = SPEC.to_string();
        text.push_str(&"#".repeat(MAX_SPEC_BYTES as usize));
        std::fs::write(&file, text).unwrap();
        let err = parse(&file).unwrap_err().to_string();
        assert!(
            err.contains("huge.yaml") && err.contains("larger than"),
            "{err}"
        );
    }

    #[test]
    fn names_resolve_to_common_then_device_edits() {
        let dir = tempfile::tempdir().unwrap();
        spec_in(dir.path(), "nvidia.yaml", SPEC);
        let specs = load(&[dir.path().to_path_buf()]).unwrap();
        let edits = edits_for(&specs, &[], &["nvidia.com/gpu=all".into()]).unwrap();
        assert_eq!(edits.len(), 2);
        assert_eq!(edits[0].env, ["NVIDIA_VISIBLE_DEVICES=void"]);
        assert_eq!(edits[1].device_nodes.len(), 2);
        let err = edits_for(&specs, &[], &["nvidia.com/gpu=7".into()]).unwrap_err();
        assert!(err.to_string().contains("no device `7`"), "{err}");
        assert!(err.to_string().contains("0, all"), "{err}");
        assert!(matches!(
            edits_for(&[], &[], &["nvidia.com/gpu=all".into()]),
            Err(Error::Environment(_))
        ));
        assert!(matches!(
            edits_for(&specs, &[], &["gpu0".into()]),
            Err(Error::Usage(_))
        ));
    }

    #[test]
    fn a_later_directory_overrides_the_same_kind() {
        let dir = tempfile::tempdir().unwrap();
        spec_in(&dir.path().join("etc"), "nvidia.yaml", SPEC);
        let json = r#"{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[{"name":"x","containerEdits":{}}]}"#;
        spec_in(&dir.path().join("run"), "nvidia.json", json);
        let specs = load(&[dir.path().join("etc"), dir.path().join("run")]).unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].cdi_version, "0.6.0");
    }

    #[test]
    fn a_broken_spec_names_its_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        spec_in(dir.path(), "bad.yaml", "cdiVersion: 0.5.0\nkind: [\n");
        let err = load(&[dir.path().to_path_buf()]).unwrap_err().to_string();
        assert!(err.contains("bad.yaml:"), "{err}");
        assert!(err.contains("not a CDI spec"), "{err}");
    }

    #[test]
    fn the_running_driver_is_read_from_proc() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025\nGCC version: ...";
        assert_eq!(driver_version(text).as_deref(), Some("580.95.05"));
        let open =
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build";
        assert_eq!(driver_version(open).as_deref(), Some("570.86.15"));
        assert_eq!(driver_version("garbage"), None);
    }

    #[test]
    fn preflight_finds_missing_nodes_and_a_stale_spec() {
        let dir = tempfile::tempdir().unwrap();
        spec_in(dir.path(), "nvidia.yaml", SPEC);
        let specs = load(&[dir.path().to_path_buf()]).unwrap();
        let everything = |_: &str| true;
        let found = preflight(&specs, &[], Some("580.95.05"), &everything);
        assert!(found.iter().all(|f| !f.failed()), "{found:?}");

        let upgraded = preflight(&specs, &[], Some("580.105.08"), &everything);
        let libs = upgraded
            .iter()
            .find(|f| f.name == "CDI driver libraries")
            .unwrap();
        assert!(libs.failed());
        assert!(
            libs.detail.contains("libcuda.so.580.95.05"),
            "{}",
            libs.detail
        );
        assert!(libs.detail.contains("580.105.08"), "{}", libs.detail);

        let no_gpu1 = |p: &str| p != "/dev/nvidia1";
        let nodes = preflight(&specs, &[], Some("580.95.05"), &no_gpu1);
        let nodes = nodes.iter().find(|f| f.name == "CDI device nodes").unwrap();
        assert!(nodes.failed());
        assert!(nodes.detail.contains("/dev/nvidia1"), "{}", nodes.detail);

        let none = preflight(&[], &[dir.path().to_path_buf()], None, &everything);
        assert_eq!(none.len(), 1);
        assert!(none[0].failed());
        let searched = dir.path().display().to_string();
        assert!(none[0].detail.contains(&searched), "{}", none[0].detail);
    }

    #[test]
    fn only_driver_libraries_carry_the_driver_version() {
        assert_eq!(
            library_driver_version("/lib/libcuda.so.580.95.05"),
            Some("580.95.05")
        );
        assert_eq!(library_driver_version("/lib/libcuda.so.1"), None);
        assert_eq!(
            library_driver_version("/lib/libnvidia-ml.so.580.95.05"),
            Some("580.95.05")
        );
        assert_eq!(
            library_driver_version("/cuda/lib64/libnvrtc.so.13.0.88"),
            None
        );
    }
}
