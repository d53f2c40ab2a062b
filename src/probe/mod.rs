//! `gpubake probe`: checks, inside a container on a GPU node, what the image will meet:
//! the environment nvidia-container-toolkit prepared, the GPUs through NVML, and the image's
//! lock against the driver and the NCCL it would load. Every phase runs under a time budget,
//! so a hung driver call becomes a failed check instead of a stuck job. NVIDIA libraries are
//! loaded at run time, so the probe starts anywhere and says what is missing.

pub mod env;
pub mod nvml;
pub mod policy;
pub mod report;
pub mod require;

use crate::lock::{LOCK_PATH_IN_IMAGE, Lock};
use crate::version::Version;
use env::Discovery;
use report::{Report, Status};
use serde_json::json;
use std::time::{Duration, Instant};

/// What to probe.
#[derive(Clone, Debug, Default)]
pub struct ProbeOptions {
    /// Only these GPU indices.
    pub devices: Option<Vec<u32>>,
    /// Shorter budgets and fewer sizes.
    pub quick: bool,
    /// Expectations per model, replacing the built-in table.
    pub policy: Option<Vec<policy::ModelPolicy>>,
}

/// Runs `f` on its own thread; None when it does not finish within `budget`.
fn with_budget<T: Send + 'static>(
    budget: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(budget).ok()
}

/// Runs every phase and returns the report.
pub fn run(opts: &ProbeOptions) -> Report {
    let start = Instant::now();
    let mut report = Report {
        gpubake: env!("CARGO_PKG_VERSION").to_string(),
        ..Report::default()
    };
    let disc = Discovery::system();
    environment(&disc, &mut report);

    let policy = opts
        .policy
        .clone()
        .unwrap_or_else(|| policy::embedded().to_vec());
    let devices = opts.devices.clone();
    let budget = Duration::from_secs(if opts.quick { 10 } else { 30 });
    let nvml_result = with_budget(budget, move || nvml::run(&policy, devices.as_deref()));
    let facts = match nvml_result {
        None => {
            report.push(
                "nvml",
                "NVML",
                Status::Fail,
                format!(
                    "no answer within {} s: the driver is hung",
                    budget.as_secs()
                ),
            );
            None
        }
        Some(Err(e)) => {
            report.no_gpu = true;
            let kind = disc.container_kind();
            report.push(
                "nvml",
                "NVML",
                Status::Fail,
                format!("{e}; {}", env::no_gpu_help(kind)),
            );
            None
        }
        Some(Ok((facts, checks))) => {
            for (name, status, detail) in checks {
                report.push("nvml", name, status, detail);
            }
            if facts.gpus.is_empty() {
                report.no_gpu = true;
                report.push(
                    "nvml",
                    "GPUs",
                    Status::Fail,
                    env::no_gpu_help(disc.container_kind()),
                );
            }
            report.fact("nvml", json!(facts));
            Some(facts)
        }
    };
    compatibility(&disc, facts.as_ref(), &mut report);
    report.seconds = start.elapsed().as_secs_f64();
    report
}

/// Container or host, the toolkit's variables, device nodes and driver libraries.
fn environment(disc: &Discovery, report: &mut Report) {
    const PHASE: &str = "environment";
    let kind = disc.container_kind();
    report.push(PHASE, "runs in", Status::Pass, kind);
    let in_container = kind != "host";
    let visible = std::env::var("NVIDIA_VISIBLE_DEVICES").ok();
    match visible.as_deref() {
        Some("void") | Some("none") | Some("") if in_container => report.push(
            PHASE,
            "NVIDIA_VISIBLE_DEVICES",
            Status::Warn,
            format!(
                "`{}`: the toolkit injects no GPU",
                visible.as_deref().unwrap_or("")
            ),
        ),
        Some(v) => report.push(PHASE, "NVIDIA_VISIBLE_DEVICES", Status::Pass, v.to_string()),
        None if in_container => report.push(
            PHASE,
            "NVIDIA_VISIBLE_DEVICES",
            Status::Warn,
            "unset: without it (or --gpus / a CDI device) the toolkit injects nothing",
        ),
        None => report.push(
            PHASE,
            "NVIDIA_VISIBLE_DEVICES",
            Status::Skip,
            "unset (not needed on a host)",
        ),
    }
    let caps_var = std::env::var("NVIDIA_DRIVER_CAPABILITIES").ok();
    let (caps, ok) = env::capabilities(caps_var.as_deref());
    report.push(
        PHASE,
        "NVIDIA_DRIVER_CAPABILITIES",
        if ok || !in_container {
            Status::Pass
        } else {
            Status::Fail
        },
        if ok {
            format!("{} (compute and utility granted)", caps.join(","))
        } else {
            format!(
                "{}: needs compute (CUDA) and utility (NVML, nvidia-smi)",
                caps.join(",")
            )
        },
    );
    let nodes = disc.device_nodes();
    let gpus = nodes
        .iter()
        .filter(|n| n.trim_start_matches("nvidia").parse::<u32>().is_ok())
        .count();
    report.push(
        PHASE,
        "/dev/nvidia*",
        if gpus > 0 { Status::Pass } else { Status::Fail },
        if nodes.is_empty() {
            "no device nodes".to_string()
        } else {
            format!("{gpus} GPU nodes; {}", nodes.join(" "))
        },
    );
    let mut libs = serde_json::Map::new();
    for (lib, what) in [
        ("libcuda.so.1", "the CUDA driver"),
        ("libnvidia-ml.so.1", "NVML"),
    ] {
        match disc.find_lib(lib) {
            Some(f) => {
                let v = f
                    .version
                    .clone()
                    .unwrap_or_else(|| "version unknown".into());
                report.push(
                    PHASE,
                    lib,
                    Status::Pass,
                    format!("{} ({v})", f.path.display()),
                );
                libs.insert(lib.into(), json!(f));
            }
            None => report.push(
                PHASE,
                lib,
                Status::Fail,
                format!("not found: {what} was not injected"),
            ),
        }
    }
    report.fact(
        "environment",
        json!({"container": kind, "device_nodes": nodes, "libraries": libs}),
    );
}

/// The image's lock against the driver, `NVIDIA_REQUIRE_*`, and the NCCL PyTorch would load.
fn compatibility(disc: &Discovery, facts: Option<&nvml::Facts>, report: &mut Report) {
    const PHASE: &str = "compatibility";
    let lock_path = disc.at(LOCK_PATH_IN_IMAGE);
    let lock: Option<Lock> = match std::fs::read_to_string(&lock_path) {
        Ok(text) => match serde_yaml::from_str(&text) {
            Ok(lock) => Some(lock),
            Err(e) => {
                report.push(
                    PHASE,
                    "lock",
                    Status::Fail,
                    format!("{LOCK_PATH_IN_IMAGE} does not parse: {e}"),
                );
                None
            }
        },
        Err(_) => {
            report.push(
                PHASE,
                "lock",
                Status::Skip,
                format!("no {LOCK_PATH_IN_IMAGE}: not a gpubake image"),
            );
            None
        }
    };
    let driver: Option<Version> = facts.and_then(|f| f.driver.parse().ok());
    if let (Some(lock), Some(driver)) = (&lock, &driver) {
        report.push(
            PHASE,
            "driver floor",
            if *driver >= lock.driver.min {
                Status::Pass
            } else {
                Status::Fail
            },
            format!(
                "driver {driver}, the lock needs >= {} for CUDA {} ({})",
                lock.driver.min, lock.cuda.version, lock.torch.requirement
            ),
        );
    }
    if let Some(facts) = facts {
        require_checks(facts, report);
    }
    nccl_check(disc, lock.as_ref(), report);
}

fn require_checks(facts: &nvml::Facts, report: &mut Report) {
    const PHASE: &str = "compatibility";
    if std::env::var("NVIDIA_DISABLE_REQUIRE").is_ok_and(|v| v == "true" || v == "1") {
        report.push(
            PHASE,
            "NVIDIA_REQUIRE_*",
            Status::Skip,
            "NVIDIA_DISABLE_REQUIRE is set",
        );
        return;
    }
    let (Ok(cuda), Ok(driver)) = (
        facts.cuda.parse::<Version>(),
        facts.driver.parse::<Version>(),
    ) else {
        return;
    };
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("NVIDIA_REQUIRE_") && k != "NVIDIA_REQUIRE_JETPACK")
        .collect();
    vars.sort();
    if vars.is_empty() {
        report.push(
            PHASE,
            "NVIDIA_REQUIRE_*",
            Status::Skip,
            "the image sets no requirement",
        );
    }
    for (name, value) in vars {
        let req = match require::Requirement::parse(&value) {
            Ok(r) => r,
            Err(e) => {
                report.push(
                    PHASE,
                    name,
                    Status::Fail,
                    format!("`{value}` does not parse: {e}"),
                );
                continue;
            }
        };
        let failures: Vec<String> = facts
            .gpus
            .iter()
            .filter_map(|g| {
                let target = require::Target {
                    cuda: cuda.clone(),
                    driver: driver.clone(),
                    arch: g.arch.parse().ok(),
                    brand: Some(g.brand.clone()),
                };
                req.check(&target)
                    .err()
                    .map(|e| format!("GPU {}: {e}", g.index))
            })
            .collect();
        if failures.is_empty() {
            report.push(
                PHASE,
                name,
                Status::Pass,
                format!("`{value}` holds for driver {driver} (CUDA {cuda})"),
            );
        } else {
            report.push(
                PHASE,
                name,
                Status::Fail,
                format!("`{value}`: {}", failures.join("; ")),
            );
        }
    }
}

/// Every libnccl.so.2 the image holds, the one PyTorch would load first, and its version
/// against the lock's pin.
fn nccl_check(disc: &Discovery, lock: Option<&Lock>, report: &mut Report) {
    const PHASE: &str = "compatibility";
    let found = disc.nccl_candidates();
    let mut listed = Vec::new();
    for f in &found {
        let version = nccl_version(&f.real).or_else(|| f.version.clone());
        listed.push(json!({"path": f.path, "version": version}));
    }
    report.fact("nccl", json!(listed));
    let Some(first) = found.first() else {
        report.push(
            PHASE,
            "libnccl.so.2",
            Status::Skip,
            "none found in the Python environments or the system library path",
        );
        return;
    };
    let loaded = listed[0]["version"].as_str().map(String::from);
    let all: Vec<String> = listed
        .iter()
        .map(|l| {
            format!(
                "{} ({})",
                l["path"].as_str().unwrap_or("?"),
                l["version"].as_str().unwrap_or("version unknown")
            )
        })
        .collect();
    let pinned = lock.and_then(|l| l.nccl.version.clone());
    let (status, why) = match (&loaded, &pinned) {
        (Some(v), Some(p)) if v.parse::<Version>().ok().as_ref() == Some(p) => {
            (Status::Pass, format!("{v}, as pinned"))
        }
        (Some(v), Some(p)) => (Status::Fail, format!("{v}, but the lock pins {p}")),
        (Some(v), None) => (Status::Pass, v.to_string()),
        (None, _) => (Status::Warn, "version unreadable".to_string()),
    };
    report.push(
        PHASE,
        "libnccl.so.2",
        status,
        format!(
            "{why}; loads {}; found: {}",
            first.path.display(),
            all.join(", ")
        ),
    );
}

/// Asks the library itself: `ncclGetVersion` returns major*10000 + minor*100 + patch.
fn nccl_version(path: &std::path::Path) -> Option<String> {
    // Loading a library runs its constructors; NCCL's are inert until a communicator is made.
    let lib = unsafe { libloading::Library::new(path) }.ok()?;
    let get: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
        unsafe { lib.get(b"ncclGetVersion\0") }.ok()?;
    let mut code = 0i32;
    if unsafe { get(&mut code) } != 0 {
        return None;
    }
    let (major, minor, patch) = if code >= 10000 {
        (code / 10000, code / 100 % 100, code % 100)
    } else {
        (code / 1000, code / 100 % 10, code % 100)
    };
    Some(format!("{major}.{minor}.{patch}"))
}
