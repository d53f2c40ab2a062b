//! What the container runtime and nvidia-container-toolkit gave this process: whether it is
//! in a container, the `NVIDIA_*` variables, the `/dev/nvidia*` nodes, and the driver's
//! libraries with their versions. Every path is looked up under a root, so tests can point
//! the discovery at a fake tree.

use crate::version::Version;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Where to look: `/` on a real node, a fake tree in tests.
#[derive(Clone, Debug)]
pub struct Discovery {
    root: PathBuf,
    ld_library_path: Vec<PathBuf>,
    /// The environment variables that say where the process runs (`container`,
    /// `KUBERNETES_SERVICE_HOST`), captured once so the detection itself reads no process state.
    env: Vec<(String, String)>,
}

/// Variables a runtime sets inside what it starts: systemd-nspawn, podman and others set
/// `container`; every Kubernetes pod gets `KUBERNETES_SERVICE_HOST`.
const CONTAINER_VARS: &[&str] = &["container", "KUBERNETES_SERVICE_HOST"];

/// Words in a cgroup path or in the root mount that only a container runtime leaves there.
/// Each maps to the kind reported (which picks the advice when no GPU is visible).
const RUNTIME_HINTS: &[(&str, &str)] = &[
    ("kubepods", "kubernetes"),
    ("kubelet", "kubernetes"),
    ("crio", "kubernetes"),
    ("docker", "docker"),
    ("libpod", "podman"),
    ("containers/storage", "podman"),
    ("containerd", "container"),
    ("/var/lib/machines", "container"),
];

/// A shared library found on disk.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FoundLib {
    /// The path it was found at (a link such as `libcuda.so.1`, as the loader would open it).
    pub path: PathBuf,
    /// The file it resolves to.
    pub real: PathBuf,
    /// The version in the real file's name (`libcuda.so.580.95.05` gives 580.95.05).
    pub version: Option<String>,
}

/// Directories the dynamic loader searches on common distributions, and where the toolkit
/// and CUDA images put the driver's libraries.
const LIB_DIRS: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/compat",
];

impl Discovery {
    /// Discovery on this machine: the real root and `LD_LIBRARY_PATH`.
    pub fn system() -> Self {
        let ld = std::env::var_os("LD_LIBRARY_PATH")
            .map(|v| std::env::split_paths(&v).collect())
            .unwrap_or_default();
        let env = CONTAINER_VARS
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect();
        Discovery {
            root: PathBuf::from("/"),
            ld_library_path: ld,
            env,
        }
    }

    /// Discovery under a fake root, with no `LD_LIBRARY_PATH` and no environment variables.
    pub fn under(root: &Path) -> Self {
        Discovery {
            root: root.to_path_buf(),
            ld_library_path: Vec::new(),
            env: Vec::new(),
        }
    }

    /// The same discovery, seeing `key=value` in its environment (for tests).
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    fn var(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// `path` (absolute) under the root.
    pub fn at(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Whether the program `name` is on the process's PATH (the Debian default where PATH is
    /// unset), as a shell would find it.
    pub fn on_path(&self, name: &str) -> bool {
        let path = std::env::var("PATH")
            .ok()
            .filter(|_| self.root == Path::new("/"))
            .unwrap_or_else(|| {
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
            });
        path.split(':').filter(|d| !d.is_empty()).any(|d| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(self.at(d).join(name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    }

    /// The first `name` on the loader's search path, resolved.
    pub fn find_lib(&self, name: &str) -> Option<FoundLib> {
        self.find_all(name).into_iter().next()
    }

    /// Every copy of `name` on the search path, in search order, duplicates removed.
    pub fn find_all(&self, name: &str) -> Vec<FoundLib> {
        let mut dirs: Vec<PathBuf> = self
            .ld_library_path
            .iter()
            .map(|d| self.at(&d.to_string_lossy()))
            .collect();
        dirs.extend(LIB_DIRS.iter().map(|d| self.at(d)));
        let mut out: Vec<FoundLib> = Vec::new();
        for dir in dirs {
            let path = dir.join(name);
            if let Some(found) = resolve(&path)
                && !out.iter().any(|f| f.real == found.real)
            {
                out.push(found);
            }
        }
        out
    }

    /// The Python package directories of the image: virtual environments under /opt, the
    /// system Pythons, and `$VIRTUAL_ENV`.
    pub fn site_packages(&self) -> Vec<PathBuf> {
        let mut patterns: Vec<String> = vec![
            // gpubake's own environment first: launchers may scrub VIRTUAL_ENV.
            format!("{}/lib/python3*/site-packages", crate::names::VENV),
            "/opt/*/lib/python3*/site-packages".into(),
            "/opt/*/.venv/lib/python3*/site-packages".into(),
            "/usr/local/lib/python3*/site-packages".into(),
            "/usr/local/lib/python3*/dist-packages".into(),
            "/usr/lib/python3*/site-packages".into(),
            "/usr/lib/python3/dist-packages".into(),
        ];
        if let Ok(venv) = std::env::var("VIRTUAL_ENV")
            && self.root == Path::new("/")
        {
            patterns.insert(0, format!("{venv}/lib/python3*/site-packages"));
        }
        let mut out = Vec::new();
        for p in patterns {
            for dir in glob(&self.at(&p)) {
                if !out.contains(&dir) {
                    out.push(dir);
                }
            }
        }
        out
    }

    /// Every `libnccl.so.2` in the order PyTorch would pick: the nvidia-nccl wheel next to
    /// torch in each Python environment first, then the system's.
    pub fn nccl_candidates(&self) -> Vec<FoundLib> {
        let mut out: Vec<FoundLib> = Vec::new();
        for site in self.site_packages() {
            for rel in ["nvidia/nccl/lib/libnccl.so.2", "torch/lib/libnccl.so.2"] {
                if let Some(found) = resolve(&site.join(rel))
                    && !out.iter().any(|f| f.real == found.real)
                {
                    out.push(found);
                }
            }
        }
        for found in self.find_all("libnccl.so.2") {
            if !out.iter().any(|f| f.real == found.real) {
                out.push(found);
            }
        }
        out
    }

    /// NVRTC libraries: PyTorch's (from the nvidia pip packages), the CUDA toolkit's, then
    /// the system's.
    pub fn nvrtc_candidates(&self) -> Vec<FoundLib> {
        self.toolkit_candidates("libnvrtc.so")
    }

    /// cuBLAS libraries (level 3's GEMMs), found where NVRTC is.
    pub fn cublas_candidates(&self) -> Vec<FoundLib> {
        self.toolkit_candidates("libcublas.so")
    }

    /// The files whose names start with `prefix` (a CUDA toolkit library, `libnvrtc.so`) in
    /// the nvidia pip packages of each Python environment, the CUDA toolkit, then the system.
    fn toolkit_candidates(&self, prefix: &str) -> Vec<FoundLib> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for site in self.site_packages() {
            dirs.extend(glob(&site.join("nvidia/*/lib")));
        }
        dirs.push(self.at("/usr/local/cuda/lib64"));
        dirs.extend(
            self.ld_library_path
                .iter()
                .map(|d| self.at(&d.to_string_lossy())),
        );
        dirs.extend(LIB_DIRS.iter().map(|d| self.at(d)));
        let mut out: Vec<FoundLib> = Vec::new();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect();
            names.sort();
            for name in names {
                if let Some(found) = resolve(&dir.join(name))
                    && !out.iter().any(|f| f.real == found.real)
                {
                    out.push(found);
                }
            }
        }
        out
    }

    /// The `/dev/nvidia*` nodes.
    pub fn device_nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = std::fs::read_dir(self.at("/dev"))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("nvidia"))
                    .collect()
            })
            .unwrap_or_default();
        nodes.sort();
        nodes
    }

    /// `docker`, `podman`, `kubernetes`, `container` or `host`.
    pub fn container_kind(&self) -> &'static str {
        self.container().0
    }

    /// Where this runs and what gave it away: `("docker", "/.dockerenv")`. Runtimes leave
    /// different marks (docker a file, podman another, crun and systemd-nspawn a variable,
    /// Kubernetes its service variables), and some leave none but the cgroup or the root
    /// mount, so each is tried in turn; `host` only when none is found.
    pub fn container(&self) -> (&'static str, String) {
        if self.var("KUBERNETES_SERVICE_HOST").is_some() {
            return ("kubernetes", "KUBERNETES_SERVICE_HOST is set".into());
        }
        if self.at("/.dockerenv").exists() {
            return ("docker", "/.dockerenv".into());
        }
        if self.at("/run/.containerenv").exists() {
            return ("podman", "/run/.containerenv".into());
        }
        if let Some(value) = self.var("container") {
            let kind = match value {
                "docker" => "docker",
                "podman" => "podman",
                _ => "container",
            };
            return (kind, format!("container={value}"));
        }
        let cgroup = std::fs::read_to_string(self.at("/proc/1/cgroup")).unwrap_or_default();
        if let Some((word, kind)) = runtime_hint(&cgroup) {
            return (kind, format!("/proc/1/cgroup mentions {word}"));
        }
        let mountinfo =
            std::fs::read_to_string(self.at("/proc/self/mountinfo")).unwrap_or_default();
        if let Some(line) = root_mount(&mountinfo) {
            if let Some((word, kind)) = runtime_hint(line) {
                return (kind, format!("the root mount comes from {word}"));
            }
            // An OCI runtime's bundle: `/` is a bind mount of a directory (its root field,
            // the fourth, names that directory), where a host's `/` is a filesystem's root.
            // btrfs hosts mount a subvolume (`/@`) at `/`: not a bundle.
            let fs_type = line
                .split(" - ")
                .nth(1)
                .and_then(|t| t.split_whitespace().next());
            if let Some(source) = line
                .split_whitespace()
                .nth(3)
                .filter(|r| *r != "/" && fs_type != Some("btrfs"))
            {
                return (
                    "container",
                    format!("the root filesystem is a bind mount of {source}"),
                );
            }
        }
        ("host", "no container runtime's marks".into())
    }
}

/// The first runtime word in `text`, with the kind it means.
fn runtime_hint(text: &str) -> Option<(&'static str, &'static str)> {
    RUNTIME_HINTS
        .iter()
        .find(|(word, _)| text.contains(word))
        .copied()
}

/// The line of `/proc/self/mountinfo` that mounts `/`. Only that line: on a host running
/// containers, other lines name the runtime's overlay directories too.
fn root_mount(mountinfo: &str) -> Option<&str> {
    mountinfo
        .lines()
        .find(|line| line.split_whitespace().nth(4) == Some("/"))
}

/// Follows links to the real file and reads a version from its name.
fn resolve(path: &Path) -> Option<FoundLib> {
    let real = std::fs::canonicalize(path).ok()?;
    if !real.is_file() {
        return None;
    }
    let name = real.file_name()?.to_string_lossy().into_owned();
    let version = name
        .split_once(".so.")
        .map(|(_, v)| v.to_string())
        .filter(|v| v.parse::<Version>().is_ok() && v.contains('.'));
    Some(FoundLib {
        path: path.to_path_buf(),
        real,
        version,
    })
}

/// Expands `*` in the path's components (no other wildcards), sorted.
fn glob(pattern: &Path) -> Vec<PathBuf> {
    let mut paths = vec![PathBuf::from("/")];
    for comp in pattern.components().skip(1) {
        let comp = comp.as_os_str().to_string_lossy();
        let mut next = Vec::new();
        for base in &paths {
            if let Some((pre, post)) = comp.split_once('*') {
                let Ok(entries) = std::fs::read_dir(base) else {
                    continue;
                };
                let mut names: Vec<String> = entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| {
                        n.starts_with(pre) && n.ends_with(post) && n.len() >= pre.len() + post.len()
                    })
                    .collect();
                names.sort();
                next.extend(names.into_iter().map(|n| base.join(n)));
            } else {
                let p = base.join(comp.as_ref());
                if p.exists() {
                    next.push(p);
                }
            }
        }
        paths = next;
    }
    paths
}

/// What `NVIDIA_DRIVER_CAPABILITIES` grants, and whether compute and utility are among them.
pub fn capabilities(value: Option<&str>) -> (Vec<String>, bool) {
    // The toolkit's default when the variable is unset or empty.
    let value = value
        .filter(|v| !v.trim().is_empty())
        .unwrap_or("utility,compute");
    let caps: Vec<String> = value
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let ok = caps.iter().any(|c| c == "all")
        || (caps.iter().any(|c| c == "compute") && caps.iter().any(|c| c == "utility"));
    (caps, ok)
}

/// The message for a node where no GPU is visible: what to do about it.
pub fn no_gpu_help(kind: &str) -> String {
    let how = match kind {
        "docker" => {
            "run the container with `--gpus all` (or `--runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=all`, or a CDI device such as `--device nvidia.com/gpu=all`)"
        }
        "podman" => {
            "run the container with a CDI device: `--device nvidia.com/gpu=all` (after `nvidia-ctk cdi generate`)"
        }
        "kubernetes" => {
            "request GPUs in the pod spec (`resources.limits: {nvidia.com/gpu: 1}`) on a node with the NVIDIA device plugin"
        }
        "container" => {
            "start the container with GPUs: `--gpus all`, `--runtime=nvidia`, or a CDI device `nvidia.com/gpu=all`"
        }
        _ => {
            "install the NVIDIA driver on this host (nvidia-smi should list the GPUs), or run on a GPU node"
        }
    };
    format!("no NVIDIA GPU is visible to this {kind}: {how}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn touch(root: &Path, path: &str) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"\x7fELF").unwrap();
    }

    #[test]
    fn libraries_resolve_through_links_to_versions() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(root, "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05");
        symlink(
            "libcuda.so.580.95.05",
            root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        )
        .unwrap();
        touch(root, "/usr/local/nvidia/lib64/libnvidia-ml.so.570.86.10");
        symlink(
            "libnvidia-ml.so.570.86.10",
            root.join("usr/local/nvidia/lib64/libnvidia-ml.so.1"),
        )
        .unwrap();
        let d = Discovery::under(root);
        let cuda = d.find_lib("libcuda.so.1").unwrap();
        assert_eq!(cuda.version.as_deref(), Some("580.95.05"));
        assert!(cuda.path.ends_with("usr/lib/x86_64-linux-gnu/libcuda.so.1"));
        assert_eq!(
            d.find_lib("libnvidia-ml.so.1").unwrap().version.as_deref(),
            Some("570.86.10")
        );
        assert!(d.find_lib("libnothing.so.1").is_none());
    }

    #[test]
    fn nccl_from_the_torch_environment_comes_before_the_system() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(root, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5");
        symlink(
            "libnccl.so.2.21.5",
            root.join("usr/lib/x86_64-linux-gnu/libnccl.so.2"),
        )
        .unwrap();
        touch(
            root,
            "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
        );
        touch(
            root,
            "/usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2",
        );
        touch(
            root,
            "/opt/gpubake/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
        );
        touch(
            root,
            "/opt/gpubake/venv/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
        );
        let d = Discovery::under(root);
        let nvrtc = d.nvrtc_candidates();
        assert!(
            nvrtc[0].path.ends_with(
                "opt/gpubake/venv/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
            ),
            "{:?}",
            nvrtc[0].path
        );
        let found = d.nccl_candidates();
        let paths: Vec<String> = found
            .iter()
            .map(|f| f.path.strip_prefix(root).unwrap().display().to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "opt/gpubake/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
                "opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
                "usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                "usr/lib/x86_64-linux-gnu/libnccl.so.2",
            ]
        );
        assert_eq!(found[3].version.as_deref(), Some("2.21.5"));
        assert_eq!(
            found[0].version, None,
            "pip's libnccl.so.2 carries no full version in its name"
        );
    }

    #[test]
    fn containers_and_devices_are_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(Discovery::under(root).container_kind(), "host");
        touch(root, "/.dockerenv");
        touch(root, "/dev/nvidia0");
        touch(root, "/dev/nvidiactl");
        touch(root, "/dev/null");
        let d = Discovery::under(root);
        assert_eq!(d.container_kind(), "docker");
        assert_eq!(d.device_nodes(), ["nvidia0", "nvidiactl"]);
        assert!(no_gpu_help("docker").contains("--gpus all"));
    }

    fn write(root: &Path, path: &str, text: &str) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn runtimes_without_dockerenv_are_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let bare = || Discovery::under(root);

        // crun and systemd-nspawn leave no file, only the `container` variable.
        assert_eq!(
            bare().with_env("container", "crun").container(),
            ("container", "container=crun".to_string())
        );
        assert_eq!(
            bare().with_env("container", "podman").container_kind(),
            "podman"
        );
        assert_eq!(bare().with_env("container", "").container_kind(), "host");
        assert_eq!(
            bare()
                .with_env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
                .container_kind(),
            "kubernetes"
        );

        // A host's pid 1 and root mount: nothing, even when the host runs docker containers
        // (their overlays show up on other lines).
        write(root, "/proc/1/cgroup", "0::/init.scope\n");
        write(
            root,
            "/proc/self/mountinfo",
            "26 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n\
             300 26 0:50 / /var/lib/docker/overlay2/abc/merged rw - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/X\n",
        );
        assert_eq!(bare().container_kind(), "host");
        // crun and runc leave no mark but the bundle's rootfs bind-mounted at `/`.
        write(
            root,
            "/proc/self/mountinfo",
            "800 700 259:2 /tmp/.gpubake-bundle-x/rootfs / rw,relatime - ext4 /dev/vda rw\n",
        );
        assert_eq!(bare().container_kind(), "container");
        assert!(
            bare()
                .container()
                .1
                .contains("/tmp/.gpubake-bundle-x/rootfs")
        );
        write(
            root,
            "/proc/self/mountinfo",
            "30 1 0:27 /@ / rw,relatime shared:1 - btrfs /dev/nvme0n1p2 rw,subvol=/@\n",
        );
        assert_eq!(
            bare().container_kind(),
            "host",
            "a btrfs subvolume at / is a host"
        );
        write(
            root,
            "/proc/self/mountinfo",
            "26 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n\
             300 26 0:50 / /var/lib/docker/overlay2/abc/merged rw - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/X\n",
        );

        // cgroup v1 inside a pod.
        write(
            root,
            "/proc/1/cgroup",
            "12:memory:/kubepods/burstable/pod1234/abcdef\n",
        );
        assert_eq!(bare().container_kind(), "kubernetes");

        // cgroup v2 with its own namespace shows nothing; the root mount still tells.
        write(root, "/proc/1/cgroup", "0::/\n");
        write(
            root,
            "/proc/self/mountinfo",
            "500 400 0:60 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/containers/storage/overlay/l/A,upperdir=/var/lib/containers/storage/overlay/B/diff\n",
        );
        assert_eq!(
            bare().container(),
            (
                "podman",
                "the root mount comes from containers/storage".to_string()
            )
        );
        write(
            root,
            "/proc/self/mountinfo",
            "500 400 0:60 / / rw - overlay overlay rw,lowerdir=/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs\n",
        );
        assert_eq!(bare().container_kind(), "container");

        touch(root, "/run/.containerenv");
        assert_eq!(bare().container_kind(), "podman");
    }

    #[test]
    fn capabilities_default_like_the_toolkit() {
        assert!(capabilities(None).1);
        assert!(capabilities(Some("all")).1);
        assert!(!capabilities(Some("compute")).1);
        assert!(capabilities(Some("compute, utility,video")).1);
    }
}
