//! `gpubake preflight`: on a GPU node's host, before any container starts, whether the node
//! is set up to give containers their GPUs: the driver, the NVIDIA Container Toolkit, each
//! container engine's config as `nvidia-ctk runtime configure` writes it and as the engine
//! reads it, the CDI specs the engines read, and the cgroup setup that loses GPUs on a
//! `systemctl daemon-reload`. Each finding names the error a user would meet and the fix.
//! Everything is read from files under a root (`/`, or a recorded tree in tests), so the
//! preflight needs no GPU call, no engine API and no privilege beyond reading.

pub mod containerd;
pub mod crio;
pub mod docker;
pub mod host;
pub mod nvct;

use super::report::{Report, Status};
use containerd::Containerd;
use crio::Crio;
use docker::Docker;
use host::Host;
use nvct::Toolkit;
use std::time::Instant;

/// The phases, in the order they run.
const DRIVER: &str = "driver";
const TOOLKIT: &str = "toolkit";
const DOCKER: &str = "docker";
const CONTAINERD: &str = "containerd";
const CRIO: &str = "cri-o";
const PODMAN: &str = "podman";
const CDI: &str = "cdi";
const CGROUP: &str = "cgroup";

/// Runs the preflight on the host under `root`.
pub fn preflight(root: &std::path::Path) -> Report {
    let started = Instant::now();
    let host = Host::under(root);
    let mut report = Report {
        title: "preflight".into(),
        gpubake: env!("CARGO_PKG_VERSION").to_string(),
        ..Report::default()
    };
    let driver = driver(&host, &mut report);
    if driver.is_none() {
        report.no_gpu = true;
    }
    let toolkit = read_or_fail(
        Toolkit::read(&host).map(Some),
        TOOLKIT,
        "NVIDIA Container Toolkit",
        &mut report,
    );
    if let Some(kit) = &toolkit {
        toolkit_checks(&host, kit, &mut report);
    }
    let docker = read_or_fail(Docker::read(&host), DOCKER, "daemon.json", &mut report);
    let containerd = read_or_fail(Containerd::read(&host), CONTAINERD, "config", &mut report);
    if let (Some(d), Some(kit)) = (&docker, &toolkit) {
        docker_checks(&host, d, kit, &mut report);
    }
    if let Some(c) = &containerd {
        containerd_checks(&host, c, &mut report);
    }
    let crio = read_or_fail(Crio::read(&host), CRIO, "config", &mut report);
    if let Some(c) = &crio {
        crio_checks(&host, c, &mut report);
    }
    let podman = host.program("podman").is_some();
    if podman {
        podman_checks(&host, &mut report);
    }
    if docker.is_none() && containerd.is_none() && crio.is_none() && !podman {
        report.push(
            "engines",
            "container engine",
            Status::Skip,
            "no Docker Engine, containerd, CRI-O or podman on this host: nothing to give GPUs \
             to",
        );
    }
    let dirs = spec_dirs(&host, toolkit.as_ref(), docker.as_ref(), crio.as_ref());
    cdi_checks(
        &host,
        &dirs,
        driver.as_deref(),
        toolkit.as_ref(),
        &mut report,
    );
    if let Some(kit) = &toolkit {
        let engines = Engines {
            docker: docker.as_ref(),
            containerd: containerd.as_ref(),
            crio: crio.as_ref(),
        };
        cgroup_checks(&host, kit, &engines, &mut report);
    }
    report.seconds = started.elapsed().as_secs_f64();
    report
}

/// What a reader found, or None with a failed check naming what it could not read.
fn read_or_fail<T>(
    read: Result<Option<T>, String>,
    phase: &'static str,
    name: &str,
    report: &mut Report,
) -> Option<T> {
    read.unwrap_or_else(|e| {
        report.push(phase, name, Status::Fail, e);
        None
    })
}

/// The kernel module's version against the NVML library's that the toolkit loads; None
/// where no driver is loaded.
fn driver(host: &Host, report: &mut Report) -> Option<String> {
    let module = match host.read("/proc/driver/nvidia/version") {
        Ok(Some(text)) => crate::cdi::driver_version(&text),
        Ok(None) => None,
        Err(e) => {
            report.push(DRIVER, "kernel module", Status::Fail, e);
            return None;
        }
    };
    let Some(module) = module else {
        report.push(
            DRIVER,
            "kernel module",
            Status::Skip,
            "no NVIDIA kernel module is loaded (/proc/driver/nvidia/version): no GPU to give \
             containers; install or load the driver",
        );
        return None;
    };
    report.push(
        DRIVER,
        "kernel module",
        Status::Pass,
        format!("NVIDIA kernel module {module}"),
    );
    let libraries = nvml_libraries(host);
    let wanted = format!("libnvidia-ml.so.{module}");
    let (status, detail) = if libraries.is_empty() {
        (
            Status::Fail,
            "no libnvidia-ml.so.1 in the host's library directories: the toolkit's hook fails \
             with `nvidia-container-cli: initialization error: load library failed: \
             libnvidia-ml.so.1: cannot open shared object file`; install the driver's user-space \
             libraries (and run ldconfig)"
                .to_string(),
        )
    } else if libraries.iter().any(|l| l.ends_with(&wanted)) {
        (
            Status::Pass,
            format!("{wanted} beside the module of the same version"),
        )
    } else {
        (
            Status::Fail,
            format!(
                "the libraries ({}) are not of the loaded module's version {module}: NVML \
                 answers `Driver/library version mismatch`; reboot (or reload the module) \
                 after the driver upgrade",
                libraries.join(", ")
            ),
        )
    };
    report.push(DRIVER, "NVML library", status, detail);
    kernel_modules(host, &module, report);
    driver_daemons(host, report);
    Some(module)
}

/// The driver's other kernel modules: of the running driver's version, `nvidia_uvm` (CUDA's
/// `/dev/nvidia-uvm`), and `nvidia_peermem` where the host has RDMA devices.
fn kernel_modules(host: &Host, driver: &str, report: &mut Report) {
    let Ok(Some(modules)) = host.read("/proc/modules") else {
        return;
    };
    let loaded: Vec<&str> = modules
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let nvidia: Vec<&str> = loaded
        .iter()
        .copied()
        .filter(|m| m.starts_with("nvidia"))
        .collect();
    let other: Vec<String> = nvidia
        .iter()
        .filter_map(|m| {
            let version = host.read(&format!("/sys/module/{m}/version")).ok()??;
            let version = version.trim();
            (version != driver).then(|| format!("{m} {version}"))
        })
        .collect();
    report.push(
        DRIVER,
        "kernel modules",
        if other.is_empty() {
            Status::Pass
        } else {
            Status::Fail
        },
        if other.is_empty() {
            format!("{} loaded, of driver {driver}", nvidia.join(", "))
        } else {
            format!(
                "modules of another driver than the running {driver}: {}; an upgrade left \
                 them loaded: reboot, or unload and load the driver's modules",
                other.join(", ")
            )
        },
    );
    if !loaded.contains(&"nvidia_uvm") {
        report.push(
            DRIVER,
            "nvidia_uvm",
            Status::Warn,
            "not loaded: /dev/nvidia-uvm, which CUDA needs, appears only once the toolkit \
             (nvidia-container-cli's load-kmods) or nvidia-modprobe loads it; a runtime that \
             cannot load modules starts containers where CUDA fails to initialise; load it at \
             boot (`modprobe nvidia-uvm`)",
        );
    }
    let rdma = std::fs::read_dir(host.at("/sys/class/infiniband"))
        .map(|d| d.count() > 0)
        .unwrap_or(false);
    if rdma && !loaded.contains(&"nvidia_peermem") {
        report.push(
            DRIVER,
            "nvidia_peermem",
            Status::Warn,
            "the host has RDMA devices and nvidia_peermem is not loaded: GPUDirect RDMA needs it \
             or DMA-BUF (the open kernel modules); without either NCCL logs `GPU Direct RDMA \
             Disabled` and moves every message through host memory; `modprobe nvidia-peermem`",
        );
    }
}

/// The driver's daemons: nvidia-persistenced, and the fabric manager where NVSwitches need one.
fn driver_daemons(host: &Host, report: &mut Report) {
    if !host.exists("/proc/1") {
        return;
    }
    let persistenced = !host.daemons("nvidia-persistenced").is_empty();
    report.push(
        DRIVER,
        "persistence daemon",
        if persistenced {
            Status::Pass
        } else {
            Status::Warn
        },
        if persistenced {
            "nvidia-persistenced runs: the GPUs stay initialised between containers".to_string()
        } else {
            "nvidia-persistenced does not run: without persistence each container's first CUDA \
             call initialises the GPUs again; enable the nvidia-persistenced service"
                .to_string()
        },
    );
    let switches = std::fs::read_dir(host.at("/proc/driver/nvidia-nvswitch/devices"))
        .map(|d| d.count())
        .unwrap_or(0);
    if switches > 0 {
        let manager = !host.daemons("nv-fabricmanager").is_empty();
        report.push(
            DRIVER,
            "fabric manager",
            if manager { Status::Pass } else { Status::Fail },
            if manager {
                format!("nv-fabricmanager runs for the {switches} NVSwitches")
            } else {
                format!(
                    "{switches} NVSwitches and no nv-fabricmanager: CUDA fails to initialise \
                     (cuInit: system not yet initialized, 802); start nvidia-fabricmanager, of \
                     the driver's version"
                )
            },
        );
    }
}

/// The versioned `libnvidia-ml.so.VERSION` files the host's loader finds: those its
/// `/etc/ld.so.cache` leads to (libnvidia-container loads the soname through it), then those
/// in the usual library directories.
fn nvml_libraries(host: &Host) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let cached = std::fs::read(host.at("/etc/ld.so.cache"))
        .ok()
        .and_then(|bytes| crate::image::links::parse_cache(&bytes).ok())
        .unwrap_or_default();
    let mut candidates: Vec<String> = cached
        .into_iter()
        .filter(|(soname, _, _)| soname == "libnvidia-ml.so.1")
        .map(|(_, path, _)| path)
        .collect();
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/lib/x86_64-linux-gnu",
        "/lib64",
    ];
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(host.at(dir)) else {
            continue;
        };
        let mut here: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("libnvidia-ml.so."))
            .map(|n| format!("{dir}/{n}"))
            .collect();
        here.sort();
        candidates.extend(here);
    }
    for path in candidates {
        let Some(real) = host.resolve(&path) else {
            continue;
        };
        let versioned = real
            .rsplit('/')
            .next()
            .and_then(|n| n.strip_prefix("libnvidia-ml.so."))
            .is_some_and(|v| v.contains('.'));
        if versioned && host.at(&real).is_file() && !found.contains(&real) {
            found.push(real);
        }
    }
    found
}

fn toolkit_checks(host: &Host, kit: &Toolkit, report: &mut Report) {
    if !kit.installed() {
        // A host without an engine gives no container its GPUs: it lacks nothing.
        let engine = ["dockerd", "containerd", "crio", "podman"]
            .iter()
            .any(|p| host.program(p).is_some())
            || host.exists("/snap/docker");
        report.push(
            TOOLKIT,
            "NVIDIA Container Toolkit",
            if engine { Status::Fail } else { Status::Skip },
            "not installed (no nvidia-container-toolkit package, no nvidia-container-runtime, \
             -runtime-hook or nvidia-ctk on the PATH): `docker run --gpus all` fails with \
             `could not select device driver \"\" with capabilities: [[gpu]]`; install \
             nvidia-container-toolkit",
        );
        return;
    }
    let pieces: Vec<String> = [
        ("runtime", &kit.runtime),
        ("hook", &kit.hook),
        ("CDI hook", &kit.cdi_hook),
        ("nvidia-ctk", &kit.ctk),
    ]
    .iter()
    .map(|(what, path)| match path {
        Some(p) => format!("{what} {p}"),
        None => format!("no {what}"),
    })
    .collect();
    report.push(
        TOOLKIT,
        "NVIDIA Container Toolkit",
        Status::Pass,
        format!(
            "{}: {}",
            kit.version
                .as_deref()
                .map(|v| format!("version {v}"))
                .unwrap_or_else(|| "version unknown (no dpkg record)".into()),
            pieces.join(", ")
        ),
    );
    let config = &kit.config;
    let mode = match kit.runtime_mode() {
        Some(m) if config.mode == "auto" => format!("auto (the runtime injects by {m})"),
        Some(m) => m.to_string(),
        None => "auto (legacy before toolkit 1.18, jit-cdi from it; the version is unknown)".into(),
    };
    let ldconfig_ok = config.ldconfig.starts_with('@') || config.ldconfig_from_container;
    report.push(
        TOOLKIT,
        "config.toml",
        if ldconfig_ok {
            Status::Pass
        } else {
            Status::Fail
        },
        if ldconfig_ok {
            format!(
                "{}mode {mode}; no-cgroups {}; ldconfig {}",
                if config.present {
                    ""
                } else {
                    "no file, defaults: "
                },
                config.no_cgroups,
                config.ldconfig
            )
        } else {
            format!(
                "{}: nvidia-container-cli.ldconfig = \"{}\" is not a host path: the toolkit \
                 (1.17.3 and later) refuses it (`is not host-relative (does not start with a \
                 '@')`); write \"@/sbin/ldconfig\"",
                nvct::CONFIG,
                config.ldconfig
            )
        },
    );
    let low_level = config.runtimes.iter().find_map(|r| host.program(r));
    report.push(
        TOOLKIT,
        "low-level runtime",
        if low_level.is_some() {
            Status::Pass
        } else {
            Status::Fail
        },
        match low_level {
            Some(path) => format!("the runtime hands containers to {path}"),
            None => format!(
                "none of {} is on the PATH: nvidia-container-runtime fails with `error locating \
                 runtime: no runtime binary found from candidate list`; install runc or set \
                 nvidia-container-runtime.runtimes in {}",
                config.runtimes.join(", "),
                nvct::CONFIG
            ),
        },
    );
}

fn docker_checks(host: &Host, docker: &Docker, kit: &Toolkit, report: &mut Report) {
    let config = &docker.config_path;
    report.fact(
        DOCKER,
        serde_json::json!({
            "config": config,
            "version": docker.version,
            "runtimes": docker.runtimes,
            "default_runtime": docker.default_runtime.as_deref().unwrap_or("runc"),
            "cgroup_driver": docker.cgroup_driver(host),
            "cdi": docker.cdi_enabled(),
            "snap": docker.snap,
            "pid": docker.daemon.as_ref().map(|d| d.pid),
        }),
    );
    if docker.snap {
        report.push(
            DOCKER,
            "snap",
            Status::Warn,
            format!(
                "Docker is the snap: it reads {config}, not {}, and brings its own toolkit; \
                 `docker run --runtime nvidia --gpus all` uses it (a host toolkit package breaks \
                 the snap's from 29.2)",
                docker::DEFAULT_CONFIG
            ),
        );
    }
    docker_gpus(docker, kit, report);
    docker_runtimes(host, docker, report);
    docker_cdi(docker, report);
    stale_daemon(
        host,
        DOCKER,
        "dockerd",
        docker.started(),
        &[config.as_str()],
        report,
    );
    if let (Some(started), Some(hook)) = (docker.started(), kit.hook.as_deref())
        && host.modified(hook).is_some_and(|m| m > started)
    {
        report.push(
            DOCKER,
            "--gpus since start",
            Status::Fail,
            format!(
                "{hook} is newer than the running dockerd, which looks for it only when it \
                 starts: `--gpus` fails with `could not select device driver \"\"` until \
                 `systemctl restart docker`"
            ),
        );
    }
}

/// Whether Docker's `--gpus` goes through CDI: from 29.2, with CDI on and nvidia-cdi-hook
/// there, dockerd turns it into CDI requests.
fn gpus_by_cdi(docker: &Docker, kit: &Toolkit) -> bool {
    kit.cdi_hook.is_some()
        && docker
            .version
            .as_deref()
            .is_some_and(|v| docker::at_least(v, (29, 2)))
        && docker.cdi_enabled() == Some(true)
}

/// `--gpus`: dockerd registers its GPU driver at start when the toolkit's hook is on its
/// PATH (or, from 29.2, nvidia-cdi-hook, through CDI).
fn docker_gpus(docker: &Docker, kit: &Toolkit, report: &mut Report) {
    let cdi_gpus = gpus_by_cdi(docker, kit);
    let (status, detail) = if kit.hook.is_none() && !cdi_gpus {
        (
            Status::Fail,
            "no nvidia-container-runtime-hook on dockerd's PATH: `docker run --gpus all` fails \
             with `could not select device driver \"\" with capabilities: [[gpu]]`; install \
             nvidia-container-toolkit and restart docker"
                .to_string(),
        )
    } else if !cdi_gpus && kit.hook_refuses() {
        (
            Status::Fail,
            format!(
                "{} sets mode = \"{}\", and the hook `--gpus` runs refuses it: `invoking the \
                 NVIDIA Container Runtime Hook directly (e.g. specifying the docker --gpus flag) \
                 is not supported`; use `--runtime=nvidia`, or set the mode to auto",
                nvct::CONFIG,
                kit.config.mode
            ),
        )
    } else {
        (
            Status::Pass,
            if cdi_gpus {
                "through CDI (Docker 29.2 or later with nvidia-cdi-hook)".to_string()
            } else {
                format!(
                    "through the toolkit's hook {}",
                    kit.hook.as_deref().unwrap_or("")
                )
            },
        )
    };
    report.push(DOCKER, "--gpus", status, detail);
}

/// The `nvidia` runtime and `default-runtime` of daemon.json.
fn docker_runtimes(host: &Host, docker: &Docker, report: &mut Report) {
    let config = &docker.config_path;
    let nvidia = docker.runtimes.get("nvidia");
    let (status, detail) = match nvidia {
        None => (
            Status::Warn,
            format!(
                "{config} registers no `nvidia` runtime: `docker run --runtime=nvidia` fails with \
                 `unknown or invalid runtime name: nvidia`; `nvidia-ctk runtime configure \
                 --runtime=docker`, then `systemctl restart docker`"
            ),
        ),
        Some(None) => (
            Status::Fail,
            format!(
                "{config}: runtimes.nvidia has no path: dockerd refuses it (`either a \
                 runtimeType or a path must be configured`)"
            ),
        ),
        Some(Some(path)) => match host.program(path) {
            Some(found) => (Status::Pass, format!("runtime nvidia: {found}")),
            None => (
                Status::Fail,
                format!(
                    "{config}: runtimes.nvidia.path {path} is not an executable on dockerd's \
                     PATH: containers run with it fail to start; install \
                     nvidia-container-toolkit-base or give its absolute path"
                ),
            ),
        },
    };
    report.push(DOCKER, "runtime nvidia", status, detail);
    if let Some(default) = &docker.default_runtime {
        let known = docker.runtimes.contains_key(default)
            || ["runc", "io.containerd.runc.v2"].contains(&default.as_str());
        report.push(
            DOCKER,
            "default-runtime",
            if known { Status::Pass } else { Status::Fail },
            if known {
                default.clone()
            } else {
                format!(
                    "{config}: default-runtime {default} is not a configured runtime: dockerd \
                     does not start (`specified default runtime '{default}' does not exist`)"
                )
            },
        );
    }
}

/// Docker's own CDI, by its version and `features.cdi`.
fn docker_cdi(docker: &Docker, report: &mut Report) {
    let (status, cdi) = match (docker.cdi_enabled(), docker.version.as_deref()) {
        (Some(true), Some(v)) => (Status::Pass, format!("on (Docker {v})")),
        (Some(false), Some(v)) if docker::at_least(v, (25, 0)) => (
            Status::Warn,
            format!(
                "off (Docker {v}): `--device nvidia.com/gpu=all` fails with `could not select \
                 device driver \"cdi\"`; set \"features\": {{\"cdi\": true}} (or leave it \
                 out from 28.2) and restart docker"
            ),
        ),
        (Some(false), Some(v)) => (
            Status::Skip,
            format!("Docker {v} has no CDI (25.0 and later have)"),
        ),
        _ => (
            Status::Skip,
            "not judged: no package records Docker's version".into(),
        ),
    };
    report.push(DOCKER, "CDI", status, cdi);
}

fn containerd_checks(host: &Host, c: &Containerd, report: &mut Report) {
    let plugin = c.plugin();
    report.fact(
        CONTAINERD,
        serde_json::json!({
            "config": c.config_path,
            "files": c.files,
            "version": c.version,
            "nvidia": c.nvidia.as_ref().map(|r| r.binary.clone()),
            "default_runtime": c.default_runtime,
            "cdi": c.cdi_enabled(),
            "pid": c.daemon.as_ref().map(|d| d.pid),
        }),
    );
    if c.files.is_empty() {
        let drop_in = containerd::TOOLKIT_DROP_INS.iter().find(|d| host.exists(d));
        report.push(
            CONTAINERD,
            "config",
            if drop_in.is_some() {
                Status::Fail
            } else {
                Status::Warn
            },
            match drop_in {
                Some(d) => format!(
                    "no {}, so containerd reads no config at all and ignores {d}; re-run \
                     `nvidia-ctk runtime configure --runtime=containerd`, which writes the \
                     top-level file with its imports",
                    c.config_path
                ),
                None => format!(
                    "no {}: containerd runs on its defaults, without the nvidia runtime",
                    c.config_path
                ),
            },
        );
    } else {
        report.push(
            CONTAINERD,
            "config",
            Status::Pass,
            format!("version {}: {}", c.version, c.files.join(", ")),
        );
        let ignored: Vec<&str> = containerd::TOOLKIT_DROP_INS
            .iter()
            .copied()
            .filter(|d| host.exists(d) && !c.files.iter().any(|f| f == d))
            .collect();
        if !ignored.is_empty() {
            report.push(
                CONTAINERD,
                "toolkit drop-in",
                Status::Fail,
                format!(
                    "{} is not imported by {}: containerd ignores it; add imports = \
                     [\"/etc/containerd/conf.d/*.toml\"] (re-running `nvidia-ctk runtime \
                     configure --runtime=containerd` does)",
                    ignored.join(", "),
                    c.config_path
                ),
            );
        }
    }
    let (status, detail) = match &c.nvidia {
        None => (
            Status::Warn,
            format!(
                "no runtime nvidia under plugins.\"{plugin}\".containerd.runtimes: a pod of \
                 RuntimeClass nvidia fails (`no runtime for \"nvidia\" is configured`); \
                 `nvidia-ctk runtime configure --runtime=containerd`, then `systemctl restart \
                 containerd`"
            ),
        ),
        Some(r) => match r.binary.as_deref() {
            None => (
                Status::Fail,
                "runtime nvidia has no options.BinaryName: it runs plain runc, without the \
                 toolkit"
                    .to_string(),
            ),
            Some(binary) if host.program(binary).is_some() => {
                (Status::Pass, format!("runtime nvidia: {binary}"))
            }
            Some(binary) => (
                Status::Fail,
                format!(
                    "runtime nvidia's BinaryName {binary} is not an executable: its containers \
                     fail to start; install nvidia-container-toolkit-base"
                ),
            ),
        },
    };
    report.push(CONTAINERD, "runtime nvidia", status, detail);
    if let Some(nvidia) = &c.nvidia
        && nvidia.systemd_cgroup.unwrap_or(false) != c.runc_systemd_cgroup.unwrap_or(false)
    {
        report.push(
            CONTAINERD,
            "SystemdCgroup",
            Status::Warn,
            format!(
                "runtime nvidia has SystemdCgroup = {} and runc {}: pods of the two classes \
                 use different cgroup drivers, and the kubelet's matches only one",
                nvidia.systemd_cgroup.unwrap_or(false),
                c.runc_systemd_cgroup.unwrap_or(false)
            ),
        );
    }
    report.push(
        CONTAINERD,
        "CDI",
        Status::Pass,
        format!(
            "{} (enable_cdi {}{})",
            if c.cdi_enabled() { "on" } else { "off" },
            c.enable_cdi
                .map(|b| b.to_string())
                .unwrap_or_else(|| "not set".into()),
            if c.enable_cdi.is_none() {
                format!(", containerd's default for config version {}", c.version)
            } else {
                String::new()
            }
        ),
    );
    let files: Vec<&str> = c.files.iter().map(String::as_str).collect();
    stale_daemon(host, CONTAINERD, "containerd", c.started(), &files, report);
}

/// The engines found, for the checks that look across them.
#[derive(Clone, Copy)]
struct Engines<'a> {
    docker: Option<&'a Docker>,
    containerd: Option<&'a Containerd>,
    crio: Option<&'a Crio>,
}

/// The CDI directories any engine (or the toolkit's runtime in cdi mode) reads: the
/// defaults, then each configured list.
fn spec_dirs(
    host: &Host,
    kit: Option<&Toolkit>,
    docker: Option<&Docker>,
    crio: Option<&Crio>,
) -> Vec<String> {
    let mut dirs: Vec<String> = crate::cdi::DEFAULT_SPEC_DIRS
        .iter()
        .map(|d| d.to_string())
        .collect();
    let configured = [
        kit.map(|k| k.config.spec_dirs.clone()),
        docker.and_then(|d| d.cdi_spec_dirs.clone()),
        crio.and_then(|c| c.cdi_spec_dirs.clone()),
        podman_spec_dirs(host),
    ];
    for dir in configured.into_iter().flatten().flatten() {
        if !dir.is_empty() && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

fn crio_checks(host: &Host, c: &Crio, report: &mut Report) {
    report.fact(
        CRIO,
        serde_json::json!({
            "files": c.files,
            "nvidia": c.nvidia,
            "default_runtime": c.default_runtime,
            "cgroup_manager": c.cgroup_manager,
            "pid": c.daemon.as_ref().map(|d| d.pid),
        }),
    );
    report.push(
        CRIO,
        "config",
        Status::Pass,
        if c.files.is_empty() {
            "no config file: CRI-O runs on its defaults".to_string()
        } else {
            c.files.join(", ")
        },
    );
    if host.exists(crio::UNREAD_DROP_IN) {
        report.push(
            CRIO,
            "toolkit drop-in",
            Status::Fail,
            format!(
                "{} (where toolkits 1.18.0 to 1.19.0 wrote it) is in a directory CRI-O does not \
                 read: move it to {}/ or re-run `nvidia-ctk runtime configure --runtime=crio` \
                 with toolkit 1.19.1 or later",
                crio::UNREAD_DROP_IN,
                crio::DEFAULT_DROP_INS
            ),
        );
    }
    let (status, detail) = match &c.nvidia {
        None => (
            Status::Warn,
            "no [crio.runtime.runtimes.nvidia]: a pod of RuntimeClass nvidia fails; \
             `nvidia-ctk runtime configure --runtime=crio`, then `systemctl restart crio`"
                .to_string(),
        ),
        // Without runtime_path CRI-O looks the handler's name up in its PATH.
        Some(path) => {
            let wanted = path.as_deref().unwrap_or("nvidia");
            match host.program(wanted) {
                Some(found) => (Status::Pass, format!("runtime nvidia: {found}")),
                None => (
                    Status::Fail,
                    format!(
                        "runtime nvidia's runtime_path {wanted} is not an executable: its \
                         containers fail to start; install nvidia-container-toolkit-base"
                    ),
                ),
            }
        }
    };
    report.push(CRIO, "runtime nvidia", status, detail);
    let files: Vec<&str> = c.files.iter().map(String::as_str).collect();
    stale_daemon(host, CRIO, "crio", c.started(), &files, report);
}

/// containers.conf in podman's order: the vendor's, the admin's, then its drop-ins.
fn containers_confs(host: &Host) -> Vec<String> {
    let mut files = vec![
        "/usr/share/containers/containers.conf".to_string(),
        "/etc/containers/containers.conf".to_string(),
    ];
    if let Ok(entries) = std::fs::read_dir(host.at("/etc/containers/containers.conf.d")) {
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".conf"))
            .collect();
        names.sort();
        files.extend(
            names
                .into_iter()
                .map(|n| format!("/etc/containers/containers.conf.d/{n}")),
        );
    }
    files
}

/// `[engine] cdi_spec_dirs` of podman's containers.conf, the last file that sets it.
fn podman_spec_dirs(host: &Host) -> Option<Vec<String>> {
    containers_confs(host)
        .iter()
        .rev()
        .filter_map(|f| host.read(f).ok().flatten())
        .filter_map(|text| text.parse::<toml::Table>().ok())
        .filter_map(|t| {
            let dirs = t.get("engine")?.get("cdi_spec_dirs")?.as_array()?;
            Some(
                dirs.iter()
                    .filter_map(|d| d.as_str().map(str::to_string))
                    .collect(),
            )
        })
        .next()
}

/// podman reads the CDI specs on every run; the toolkit's legacy OCI hook, where it is
/// installed, injects GPUs a second way, which NVIDIA's CDI guide says to remove.
fn podman_checks(host: &Host, report: &mut Report) {
    let hooks: Vec<&str> = [
        "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json",
        "/etc/containers/oci/hooks.d/oci-nvidia-hook.json",
    ]
    .into_iter()
    .filter(|h| host.exists(h))
    .collect();
    report.push(
        PODMAN,
        "legacy hook",
        if hooks.is_empty() {
            Status::Pass
        } else {
            Status::Warn
        },
        if hooks.is_empty() {
            "no OCI hook of the toolkit: GPUs come by CDI (`--device nvidia.com/gpu=all`)"
                .to_string()
        } else {
            format!(
                "{} injects GPUs into every container beside CDI: remove it and request GPUs \
                 with `--device nvidia.com/gpu=all`",
                hooks.join(", ")
            )
        },
    );
}

/// A config changed after the daemon started: it has not read it. dockerd reloads some keys
/// on SIGHUP, containerd none.
fn stale_daemon(
    host: &Host,
    phase: &'static str,
    daemon: &str,
    started: Option<std::time::SystemTime>,
    files: &[&str],
    report: &mut Report,
) {
    let Some(started) = started else {
        return;
    };
    let newer: Vec<&str> = files
        .iter()
        .copied()
        .filter(|f| host.modified(f).is_some_and(|m| m > started))
        .collect();
    report.push(
        phase,
        "config loaded",
        if newer.is_empty() {
            Status::Pass
        } else {
            Status::Warn
        },
        if newer.is_empty() {
            format!("the running {daemon} started after its config last changed")
        } else {
            format!(
                "{} changed after the running {daemon} started: it runs on the old config until \
                 `systemctl restart {}`",
                newer.join(", "),
                if daemon == "dockerd" {
                    "docker"
                } else {
                    daemon
                }
            )
        },
    );
}

/// The CDI specs the engines (and the toolkit's runtime in cdi mode) read, as the CDI
/// library reads them.
fn cdi_checks(
    host: &Host,
    searched: &[String],
    driver: Option<&str>,
    kit: Option<&Toolkit>,
    report: &mut Report,
) {
    let dirs: Vec<std::path::PathBuf> = searched.iter().map(|d| host.at(d)).collect();
    let specs = match crate::cdi::load(&dirs) {
        Ok(specs) => specs,
        Err(e) => {
            report.push(CDI, "CDI spec", Status::Fail, e.to_string());
            return;
        }
    };
    for ignored in crate::cdi::ignored_files(&dirs) {
        report.push(
            CDI,
            "CDI spec names",
            Status::Warn,
            format!(
                "{} is never read: the CDI library reads *.yaml and *.json only; rename it",
                ignored.display()
            ),
        );
    }
    match crate::cdi::conflicts(&dirs) {
        Ok(conflicts) => {
            for (device, first, second) in conflicts {
                report.push(
                    CDI,
                    format!("CDI device {device}"),
                    Status::Fail,
                    format!(
                        "defined by both {} and {} in one directory: the CDI library keeps \
                         neither (`conflicting device`), so requests for it fail with \
                         `unresolvable CDI devices {device}`; remove one",
                        first.display(),
                        second.display()
                    ),
                );
            }
        }
        Err(e) => report.push(CDI, "CDI spec", Status::Fail, e.to_string()),
    }
    let cdi_mode = kit.is_some_and(|k| k.config.mode == "cdi");
    if specs.is_empty() && cdi_mode {
        report.push(
            CDI,
            "CDI spec",
            Status::Fail,
            format!(
                "none in {}, and {} sets mode = \"cdi\": a container run with the nvidia \
                 runtime fails with `unresolvable CDI devices nvidia.com/gpu=all`; \
                 `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml`",
                searched.join(" or "),
                nvct::CONFIG
            ),
        );
        return;
    }
    if specs.is_empty() {
        report.push(
            CDI,
            "CDI spec",
            Status::Skip,
            format!(
                "none in {}: CDI requests (`--device nvidia.com/gpu=all`) are unresolvable; \
                 `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` writes one",
                searched.join(" or ")
            ),
        );
        return;
    }
    let exists = |p: &str| host.exists(p);
    report
        .checks
        .extend(crate::cdi::preflight(&specs, &dirs, driver, &exists));
}

/// The `systemctl daemon-reload` case: the toolkit's legacy hook grants the GPUs in the
/// container's device cgroup behind runc's back, so where systemd manages that cgroup, a
/// reload re-applies runc's list without them, and NVML in the container answers `Unknown
/// Error`. CDI (the device nodes in the OCI spec) or the `/dev/char` links avoid it.
fn cgroup_checks(host: &Host, kit: &Toolkit, engines: &Engines, report: &mut Report) {
    let Engines {
        docker,
        containerd,
        crio,
    } = *engines;
    if !kit.installed() {
        return;
    }
    let mut at_risk = Vec::new();
    if let Some(d) = docker {
        let driver = d.cgroup_driver(host);
        if driver == "systemd" && kit.hook.is_some() && !gpus_by_cdi(d, kit) {
            at_risk.push(format!(
                "Docker's `--gpus` (the legacy hook) with the systemd cgroup driver{}",
                match &d.cgroup_driver {
                    Some(_) => " (exec-opts)".to_string(),
                    None => " (the default on cgroup v2 under systemd)".to_string(),
                }
            ));
        }
    }
    let runtime_legacy = kit.runtime_mode() == Some("legacy");
    if let Some(c) = containerd
        && runtime_legacy
        && c.nvidia
            .as_ref()
            .is_some_and(|r| r.systemd_cgroup == Some(true))
    {
        at_risk.push("containerd's runtime nvidia in legacy mode with SystemdCgroup".into());
    }
    if let Some(c) = crio
        && runtime_legacy
        && c.nvidia.is_some()
        && c.cgroup_manager == "systemd"
    {
        at_risk.push("CRI-O's runtime nvidia in legacy mode with cgroup_manager systemd".into());
    }
    if at_risk.is_empty() {
        report.push(
            CGROUP,
            "daemon-reload",
            Status::Pass,
            "no engine injects GPUs by the legacy hook under the systemd cgroup driver",
        );
        return;
    }
    let missing = missing_char_links(host);
    let (status, detail) = match missing {
        Some(missing) if missing.is_empty() => (
            Status::Pass,
            format!(
                "{}; every NVIDIA device node has its /dev/char link, so runc lists it for \
                 systemd",
                at_risk.join("; ")
            ),
        ),
        Some(missing) => (
            Status::Fail,
            format!(
                "{}: after `systemctl daemon-reload` running containers lose their GPUs \
                 (`Failed to initialize NVML: Unknown Error`); /dev/char lacks links for {}; run \
                 `nvidia-ctk system create-dev-char-symlinks --create-all` (and its udev rule), \
                 or inject by CDI",
                at_risk.join("; "),
                missing.join(", ")
            ),
        ),
        None => (
            Status::Warn,
            format!(
                "{}: after `systemctl daemon-reload` running containers may lose their GPUs \
                 (`Failed to initialize NVML: Unknown Error`); the device nodes could not be \
                 read to check their /dev/char links",
                at_risk.join("; ")
            ),
        ),
    };
    report.push(CGROUP, "daemon-reload", status, detail);
}

/// The NVIDIA character devices under `/dev` without a `/dev/char/MAJOR:MINOR` link; None
/// where none could be read as a device.
fn missing_char_links(host: &Host) -> Option<Vec<String>> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    let mut nodes: Vec<(String, u64)> = Vec::new();
    for dir in ["/dev", "/dev/nvidia-caps"] {
        let Ok(entries) = std::fs::read_dir(host.at(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("nvidia") {
                continue;
            }
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            if meta.file_type().is_char_device() {
                nodes.push((format!("{dir}/{name}"), meta.rdev()));
            }
        }
    }
    if nodes.is_empty() {
        return None;
    }
    nodes.sort();
    Some(
        nodes
            .into_iter()
            .filter(|(_, rdev)| {
                let (major, minor) = (libc::major(*rdev), libc::minor(*rdev));
                !host.exists(&format!("/dev/char/{major}:{minor}"))
            })
            .map(|(path, _)| path)
            .collect(),
    )
}
