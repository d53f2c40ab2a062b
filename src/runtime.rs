//! A command in a container of an image without a Docker API: the image is unpacked into an
//! OCI runtime bundle, its config.json says what the image's config says (environment, user,
//! working directory) plus the node's CDI edits for the devices asked for, and an OCI runtime
//! (crun, runc, or any with their command line) runs it. This is the path of CI runners and
//! Kubernetes nodes that have containerd or CRI-O but no Docker Engine.

use crate::cdi::Edits;
use crate::engine::RunOutcome;
use crate::error::{Error, Result};
use crate::image::model::Image;
use oci_spec::runtime::{
    Hook, Hooks, LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType, LinuxNamespaceType, Mount,
    PosixRlimitBuilder, PosixRlimitType, Spec,
};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// An OCI runtime's program.
#[derive(Clone, Debug)]
pub struct Runtime {
    program: PathBuf,
}

impl Runtime {
    /// `crun`, `runc`, or a path to a program with their command line. One that cannot be
    /// found is an environment problem.
    pub fn find(name: &str) -> Result<Self> {
        let candidate = Path::new(name);
        let found = if candidate.components().count() > 1 {
            candidate.is_file().then(|| candidate.to_path_buf())
        } else {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(name))
                    .find(|p| p.is_file())
            })
        };
        found.map(|program| Runtime { program }).ok_or_else(|| {
            Error::Environment(format!(
                "--runtime {name}: no such program on this machine (install crun or runc, \
                     or give the runtime's path)"
            ))
        })
    }

    /// The program.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// crun stops on a hybrid cgroup hierarchy (v1 controllers beside a v2 mount); it can run
    /// without a cgroup of its own, which the probe does not need.
    fn refuses_hybrid_cgroups(&self) -> bool {
        self.program
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("crun"))
    }

    /// Runs the bundle's process to its end or `timeout`, with a private state directory, and
    /// deletes the container afterwards. An error means the runtime could not start it.
    pub fn run(&self, bundle: &Bundle, timeout: Duration) -> Result<RunOutcome> {
        let state = bundle.dir.path().join("state");
        let id = format!(
            "gpubake-{}-{}",
            std::process::id(),
            bundle
                .dir
                .path()
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("bundle")
                .trim_start_matches('.')
        );
        let cgroups_off =
            self.refuses_hybrid_cgroups() && hybrid_cgroups(Path::new("/sys/fs/cgroup"));
        let runtime = |args: &[&str]| {
            let mut c = Command::new(&self.program);
            c.arg("--root").arg(&state);
            if cgroups_off {
                c.arg("--cgroup-manager=disabled");
            }
            c.args(args);
            c
        };
        // The pid file exists once the runtime has created the container: without it, a
        // failure is the runtime's (cgroups, mounts, devices), not the process's.
        let pid_file = bundle.dir.path().join("container.pid");
        let mut child = runtime(&["run", "--bundle"])
            .arg(bundle.dir.path())
            .arg("--pid-file")
            .arg(&pid_file)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                Error::Environment(format!("cannot start {}: {e}", self.program.display()))
            })?;
        let done = crate::child::wait(&mut child, timeout, || {
            let _ = runtime(&["kill", &id, "KILL"]).output();
        })
        .map_err(|e| Error::Environment(format!("waiting for {}: {e}", self.program.display())))?;
        let _ = runtime(&["delete", "--force", &id]).output();
        let crate::child::Finished {
            status,
            stdout,
            stderr,
            timed_out,
        } = done;
        let exit_code = status.and_then(|s| s.code()).unwrap_or(-1) as i64;
        if exit_code != 0 && !timed_out && !pid_file.exists() && !exec_failed(&stderr) {
            return Err(Error::Environment(format!(
                "{} could not create the container: {}",
                self.program.display(),
                stderr.trim()
            )));
        }
        Ok(RunOutcome {
            exit_code,
            stdout,
            stderr,
            timed_out,
            settings: bundle.settings.clone(),
        })
    }
}

/// The runtime made the container but could not start its program (runc reports this before
/// writing its pid file): the image's fault, not the node's.
fn exec_failed(stderr: &str) -> bool {
    stderr.contains("executable file")
        || stderr.contains("exec format error")
        || stderr.contains("exec: \"")
}

/// A hybrid hierarchy: v1 controllers mounted under `root` beside a `unified` v2 mount.
fn hybrid_cgroups(root: &Path) -> bool {
    root.join("unified").is_dir() && root.join("devices").is_dir()
}

/// A bundle on disk: `rootfs/` and `config.json`, removed when dropped.
pub struct Bundle {
    dir: crate::interrupt::ScratchDir,
    settings: crate::engine::Settings,
}

impl Bundle {
    /// The bundle's directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// What to run in the bundle.
pub struct Process<'a> {
    /// The command and its arguments.
    pub args: &'a [&'a str],
    /// Files to place in the root filesystem before it starts: (absolute path, bytes).
    pub files: &'a [(&'a str, Vec<u8>)],
    /// CDI edits for the devices asked for.
    pub edits: &'a [Edits],
}

/// Unpacks `image` into a new bundle under `parent` (the system's temporary directory when
/// None) and writes its config.json.
pub fn bundle(
    image: &Image,
    config: &serde_json::Value,
    process: &Process,
    parent: Option<&Path>,
) -> Result<Bundle> {
    let parent = parent
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let dir = crate::interrupt::scratch_dir(Some(&parent), ".gpubake-bundle-")
        .map_err(|e| Error::writing(&parent, e))?;
    let rootfs = dir.path().join("rootfs");
    crate::image::unpack::unpack(image, &rootfs)?;
    for (path, bytes) in process.files {
        let at = rootfs.join(path.trim_start_matches('/'));
        if let Some(p) = at.parent() {
            std::fs::create_dir_all(p).map_err(|e| Error::writing(p, e))?;
        }
        std::fs::write(&at, bytes).map_err(|e| Error::writing(&at, e))?;
    }
    let spec = spec_for(config, process, &rootfs)?;
    let privileged = may_raise_limits();
    let limits = job_rlimits(privileged);
    let settings = crate::engine::Settings {
        applied: format!("{SETTINGS}, {}", describe_rlimits(&limits)),
        withheld: (limits[0].1 != u64::MAX).then(|| {
            "--ulimit memlock=-1: this process lacks CAP_SYS_RESOURCE, so the container gets \
             its hard limit"
                .to_string()
        }),
    };
    let file = dir.path().join("config.json");
    std::fs::write(
        &file,
        serde_json::to_vec_pretty(&spec).expect("a runtime spec serializes"),
    )
    .map_err(|e| Error::writing(&file, e))?;
    Ok(Bundle { dir, settings })
}

/// What the runtime's container is given: `docker run --ipc host` and the limits of
/// `job_rlimits`, which the bundle's settings spell out.
pub const SETTINGS: &str = "the host's IPC namespace and /dev/shm (as --ipc host)";

/// Whether this process holds CAP_SYS_RESOURCE, which lifting a hard limit needs (the runtime
/// sets the limits with the caller's privileges).
fn may_raise_limits() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        // CAP_SYS_RESOURCE is capability 24 (linux/capability.h).
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// A training job's limits (NGC's `--ulimit memlock=-1 --ulimit stack=67108864`, and many
/// files, which NCCL and the CUDA runtime open per GPU), each capped by this process's hard
/// limit unless it may raise it: a runtime sets them with the caller's privileges.
fn job_rlimits(privileged: bool) -> Vec<(PosixRlimitType, u64)> {
    let hard = |resource| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct it is given.
        if unsafe { libc::getrlimit(resource, &mut limit) } == 0 {
            limit.rlim_max
        } else {
            0
        }
    };
    let want = |resource, value: u64| {
        if privileged {
            value
        } else {
            value.min(hard(resource))
        }
    };
    vec![
        (
            PosixRlimitType::RlimitMemlock,
            want(libc::RLIMIT_MEMLOCK, u64::MAX),
        ),
        (
            PosixRlimitType::RlimitStack,
            want(libc::RLIMIT_STACK, crate::engine::TRAINING_STACK as u64),
        ),
        (
            PosixRlimitType::RlimitNofile,
            want(libc::RLIMIT_NOFILE, 1 << 20),
        ),
    ]
}

/// The limits as `docker run` flags would give them: `memlock=-1` for unlimited.
fn describe_rlimits(limits: &[(PosixRlimitType, u64)]) -> String {
    limits
        .iter()
        .map(|(typ, v)| {
            let name = match typ {
                PosixRlimitType::RlimitMemlock => "memlock",
                PosixRlimitType::RlimitStack => "stack",
                _ => "nofile",
            };
            if *v == u64::MAX {
                format!("--ulimit {name}=-1")
            } else {
                format!("--ulimit {name}={v}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The runtime configuration: the defaults of `runc spec` (namespaces, masked paths, the usual
/// mounts), with the host's network (NCCL's bootstrap and sockets find the node's interfaces,
/// as under `docker run --network host`), run as a training job is run (`SETTINGS`: the host's
/// IPC and /dev/shm, free of the 64 MiB cap that breaks NCCL's shared-memory transport, and
/// `job_rlimits`), the image's process settings, then the CDI edits in order.
fn spec_for(config: &serde_json::Value, process: &Process, rootfs: &Path) -> Result<Spec> {
    let image = crate::image::model::ConfigView::parse(config)
        .map_err(|e| Error::image(rootfs.display().to_string(), format!("its config: {e}")))?;
    let mut spec = Spec::default();
    spec.set_hostname(Some("gpubake-certify".into()));
    let mut root = spec.root().clone().unwrap_or_default();
    root.set_path(PathBuf::from("rootfs"));
    root.set_readonly(Some(false));
    spec.set_root(Some(root));

    let mut mounts: Vec<Mount> = spec
        .mounts()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.destination() != Path::new("/dev/shm"))
        .collect();
    // The host's IPC namespace comes with the host's /dev/shm, as under `docker run --ipc host`.
    let mut shm = Mount::default();
    shm.set_destination(PathBuf::from("/dev/shm"));
    shm.set_typ(Some("bind".into()));
    shm.set_source(Some(PathBuf::from("/dev/shm")));
    shm.set_options(Some(
        ["rbind", "nosuid", "noexec", "nodev"]
            .map(String::from)
            .to_vec(),
    ));
    mounts.push(shm);

    let mut env: Vec<String> = image.env();
    let mut devices: Vec<LinuxDevice> = Vec::new();
    let mut allowed: Vec<LinuxDeviceCgroup> = Vec::new();
    let mut hooks = Hooks::default();
    let mut extra_gids: Vec<u32> = Vec::new();
    for edits in process.edits {
        for entry in &edits.env {
            let name = entry.split('=').next().unwrap_or(entry);
            env.retain(|e| e.split('=').next() != Some(name));
            env.push(entry.clone());
        }
        for node in &edits.device_nodes {
            let device = device_for(node)?;
            let mut rule = LinuxDeviceCgroup::from(&device);
            rule.set_access(Some(
                node.permissions.clone().unwrap_or_else(|| "rwm".into()),
            ));
            allowed.push(rule);
            devices.push(device);
        }
        for m in &edits.mounts {
            let mut mount = Mount::default();
            mount.set_destination(PathBuf::from(&m.container_path));
            mount.set_source(Some(PathBuf::from(&m.host_path)));
            mount.set_typ(Some(m.kind.clone().unwrap_or_else(|| "bind".into())));
            let mut options = m.options.clone();
            if m.kind.as_deref().unwrap_or("bind") == "bind"
                && !options.iter().any(|o| o == "bind" || o == "rbind")
            {
                options.push("bind".into());
            }
            mount.set_options(Some(options));
            mounts.push(mount);
        }
        for h in &edits.hooks {
            let mut hook = Hook::default();
            hook.set_path(PathBuf::from(&h.path));
            hook.set_args((!h.args.is_empty()).then(|| h.args.clone()));
            hook.set_env((!h.env.is_empty()).then(|| h.env.clone()));
            hook.set_timeout(h.timeout);
            let list = match h.hook_name.as_str() {
                "createRuntime" => hooks.create_runtime_mut(),
                "createContainer" => hooks.create_container_mut(),
                "startContainer" => hooks.start_container_mut(),
                "poststart" => hooks.poststart_mut(),
                "poststop" => hooks.poststop_mut(),
                #[allow(deprecated)]
                "prestart" => hooks.prestart_mut(),
                other => {
                    return Err(Error::Usage(format!(
                        "CDI hook `{other}` ({}): not a hook the OCI runtime spec knows",
                        h.path
                    )));
                }
            };
            list.get_or_insert_with(Vec::new).push(hook);
        }
        extra_gids.extend(&edits.additional_gids);
    }
    spec.set_mounts(Some(mounts));
    if hooks != Hooks::default() {
        spec.set_hooks(Some(hooks));
    }

    let mut proc = spec.process().clone().unwrap_or_default();
    proc.set_args(Some(process.args.iter().map(|s| s.to_string()).collect()));
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.push("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    }
    proc.set_env(Some(env));
    if let Some(dir) = image.working_dir() {
        proc.set_cwd(PathBuf::from(dir));
    }
    let mut user = proc.user().clone();
    let (uid, gid) = user_of(image.user(), rootfs)?;
    user.set_uid(uid);
    user.set_gid(gid);
    if !extra_gids.is_empty() {
        user.set_additional_gids(Some(extra_gids));
    }
    proc.set_user(user);
    proc.set_rlimits(Some(
        job_rlimits(may_raise_limits())
            .into_iter()
            .map(|(typ, value)| {
                PosixRlimitBuilder::default()
                    .typ(typ)
                    .hard(value)
                    .soft(value)
                    .build()
                    .expect("every field of the limit is set")
            })
            .collect(),
    ));
    spec.set_process(Some(proc));

    let mut linux = spec.linux().clone().unwrap_or_default();
    let namespaces = linux
        .namespaces()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.typ() != LinuxNamespaceType::Network && n.typ() != LinuxNamespaceType::Ipc)
        .collect();
    linux.set_namespaces(Some(namespaces));
    linux.set_devices((!devices.is_empty()).then_some(devices));
    let mut resources = linux.resources().clone().unwrap_or_default();
    resources.set_devices(Some(allowed));
    linux.set_resources(Some(resources));
    spec.set_linux(Some(linux));
    Ok(spec)
}

/// A CDI device node as the runtime creates it; type and numbers come from the host's node
/// when the spec leaves them out, as CDI says.
fn device_for(node: &crate::cdi::DeviceNode) -> Result<LinuxDevice> {
    let host = node.host();
    let meta = std::fs::metadata(host);
    let (kind, major, minor) = match (&node.kind, node.major, node.minor) {
        (Some(k), Some(ma), Some(mi)) => (k.clone(), ma, mi),
        _ => {
            let meta = meta.as_ref().map_err(|e| {
                Error::Environment(format!(
                    "CDI device node {host}: {e} (the spec names a node the host lacks)"
                ))
            })?;
            use std::os::unix::fs::MetadataExt;
            let rdev = meta.rdev();
            let kind = if meta.file_type().is_block_device() {
                "b"
            } else if meta.file_type().is_char_device() {
                "c"
            } else {
                return Err(Error::Environment(format!(
                    "CDI device node {host} is not a device"
                )));
            };
            (
                node.kind.clone().unwrap_or_else(|| kind.into()),
                node.major.unwrap_or(libc::major(rdev) as i64),
                node.minor.unwrap_or(libc::minor(rdev) as i64),
            )
        }
    };
    let typ = match kind.as_str() {
        "c" | "u" => LinuxDeviceType::C,
        "b" => LinuxDeviceType::B,
        "p" => LinuxDeviceType::P,
        other => {
            return Err(Error::Usage(format!(
                "CDI device node {}: type `{other}` is not c, b, u or p",
                node.path
            )));
        }
    };
    let mut device = LinuxDevice::default();
    device.set_path(PathBuf::from(&node.path));
    device.set_typ(typ);
    device.set_major(major);
    device.set_minor(minor);
    device.set_file_mode(node.file_mode.or(Some(0o666)));
    device.set_uid(node.uid);
    device.set_gid(node.gid);
    Ok(device)
}

/// The image's `User` (`name`, `uid`, `name:group`, `uid:gid`) as numbers, names looked up in
/// the image's own /etc/passwd and /etc/group; empty is root.
fn user_of(user: &str, rootfs: &Path) -> Result<(u32, u32)> {
    if user.is_empty() {
        return Ok((0, 0));
    }
    let (name, group) = match user.split_once(':') {
        Some((n, g)) => (n, Some(g)),
        None => (user, None),
    };
    let lookup = |file: &str, key: &str| -> Option<(u32, Option<u32>)> {
        // The image's own files: a passwd of gigabytes is refused rather than read whole.
        let bytes = crate::fsutil::read_capped(&rootfs.join(file), 1 << 20).ok()?;
        let text = String::from_utf8_lossy(&bytes);
        text.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&key)).then(|| {
                (
                    fields.get(2).and_then(|v| v.parse().ok()).unwrap_or(0),
                    fields.get(3).and_then(|v| v.parse().ok()),
                )
            })
        })
    };
    let unknown = |what: &str| {
        Error::Usage(format!(
            "the image's User `{user}`: {what} is neither a number nor in the image's files"
        ))
    };
    let (uid, primary) = match name.parse::<u32>() {
        Ok(uid) => (uid, None),
        Err(_) => {
            let (uid, gid) = lookup("etc/passwd", name).ok_or_else(|| unknown(name))?;
            (uid, gid)
        }
    };
    let gid = match group {
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => lookup("etc/group", g).ok_or_else(|| unknown(g))?.0,
        },
        None => primary.unwrap_or(0),
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::{DeviceNode, Edits, Hook as CdiHook, Mount as CdiMount};

    fn edits() -> Edits {
        Edits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into(), "LANG=C".into()],
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia0".into(),
                host_path: None,
                kind: Some("c".into()),
                major: Some(195),
                minor: Some(0),
                permissions: None,
                file_mode: None,
                uid: None,
                gid: None,
            }],
            mounts: vec![CdiMount {
                host_path: "/usr/lib/libcuda.so.580.95.05".into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                options: vec!["ro".into(), "nosuid".into()],
                kind: None,
            }],
            hooks: vec![CdiHook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/nvidia-ctk".into(),
                args: vec!["nvidia-ctk".into(), "hook".into(), "update-ldcache".into()],
                env: vec![],
                timeout: None,
            }],
            additional_gids: vec![44],
        }
    }

    #[test]
    fn the_spec_carries_the_image_config_and_the_cdi_edits() {
        let rootfs = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(rootfs.path().join("etc")).unwrap();
        std::fs::write(
            rootfs.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\ntrainer:x:1000:1001::/home/trainer:/bin/sh\n",
        )
        .unwrap();
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
            "config": {
                "Env": ["PATH=/opt/venv/bin:/usr/bin", "LANG=C.UTF-8"],
                "User": "trainer",
                "WorkingDir": "/workspace"
            }
        });
        let spec = spec_for(
            &config,
            &Process {
                args: &["gpubake", "probe", "--json"],
                files: &[],
                edits: &[edits()],
            },
            rootfs.path(),
        )
        .unwrap();
        let json = serde_json::to_value(&spec).unwrap();
        let env = json["process"]["env"].as_array().unwrap();
        assert!(env.contains(&"PATH=/opt/venv/bin:/usr/bin".into()));
        assert!(
            env.contains(&"LANG=C".into()),
            "CDI env overrides the image's"
        );
        assert!(!env.contains(&"LANG=C.UTF-8".into()));
        assert_eq!(json["process"]["user"]["uid"], 1000);
        assert_eq!(json["process"]["user"]["gid"], 1001);
        assert_eq!(json["process"]["user"]["additionalGids"][0], 44);
        assert_eq!(json["process"]["cwd"], "/workspace");
        assert_eq!(json["process"]["args"][1], "probe");
        assert_eq!(json["linux"]["devices"][0]["path"], "/dev/nvidia0");
        assert_eq!(json["linux"]["devices"][0]["major"], 195);
        let rules = json["linux"]["resources"]["devices"].as_array().unwrap();
        assert!(
            rules
                .iter()
                .any(|r| r["major"] == 195 && r["allow"] == true)
        );
        let mounts = json["mounts"].as_array().unwrap();
        let lib = mounts
            .iter()
            .find(|m| m["destination"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
            .unwrap();
        assert_eq!(lib["type"], "bind");
        assert!(lib["options"].as_array().unwrap().contains(&"bind".into()));
        let shm = mounts
            .iter()
            .find(|m| m["destination"] == "/dev/shm")
            .unwrap();
        assert!(
            !shm["options"]
                .as_array()
                .unwrap()
                .iter()
                .any(|o| o.as_str().unwrap().starts_with("size=")),
            "no 64 MiB cap on /dev/shm"
        );
        assert_eq!(
            json["hooks"]["createContainer"][0]["path"],
            "/usr/bin/nvidia-ctk"
        );
        let namespaces = json["linux"]["namespaces"].as_array().unwrap();
        assert!(!namespaces.iter().any(|n| n["type"] == "network"));
        assert!(namespaces.iter().any(|n| n["type"] == "pid"));
        // As `docker run --ipc host`: the host's IPC namespace and its /dev/shm.
        assert!(!namespaces.iter().any(|n| n["type"] == "ipc"));
        assert_eq!(shm["source"], "/dev/shm");
        let limits = json["process"]["rlimits"].as_array().unwrap();
        for name in ["RLIMIT_MEMLOCK", "RLIMIT_STACK", "RLIMIT_NOFILE"] {
            assert!(
                limits.iter().any(|l| l["type"] == name),
                "{name}: {limits:?}"
            );
        }
    }

    #[test]
    fn a_training_job_s_limits_are_asked_for_within_what_the_caller_may_give() {
        let privileged = job_rlimits(true);
        assert_eq!(
            describe_rlimits(&privileged),
            "--ulimit memlock=-1 --ulimit stack=67108864 --ulimit nofile=1048576"
        );
        let mut hard = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut hard) };
        let memlock = job_rlimits(false)[0].1;
        assert_eq!(
            memlock, hard.rlim_max,
            "never past this process's hard limit"
        );
    }

    #[test]
    fn users_resolve_from_the_image_files() {
        let rootfs = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(rootfs.path().join("etc")).unwrap();
        std::fs::write(rootfs.path().join("etc/group"), "video:x:44:\n").unwrap();
        assert_eq!(user_of("", rootfs.path()).unwrap(), (0, 0));
        assert_eq!(user_of("1000:1000", rootfs.path()).unwrap(), (1000, 1000));
        assert_eq!(user_of("1000:video", rootfs.path()).unwrap(), (1000, 44));
        let err = user_of("nobody-here", rootfs.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("nobody-here"), "{err}");
    }

    #[test]
    fn a_program_the_image_lacks_is_told_apart_from_a_runtime_failure() {
        let runc = r#"time="2026-11-30T19:06:01Z" level=error msg="runc run failed: unable to start container process: exec: \"gpubake\": executable file not found in $PATH""#;
        assert!(exec_failed(runc));
        assert!(exec_failed(
            "crun: executable file `gpubake` not found in $PATH: No such file or directory"
        ));
        assert!(!exec_failed(
            "cgroups in hybrid mode not supported, drop all controllers from cgroupv2"
        ));
    }

    #[test]
    fn an_unknown_runtime_is_an_environment_problem() {
        assert!(matches!(
            Runtime::find("no-such-runtime-anywhere"),
            Err(Error::Environment(_))
        ));
    }
}
