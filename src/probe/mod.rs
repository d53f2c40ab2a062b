//! `gpubake probe`: checks, inside a container on a GPU node, what the image will meet:
//! the environment nvidia-container-toolkit prepared, the GPUs through NVML, and the image's
//! lock against the driver and the NCCL it would load. Every phase runs under a time budget,
//! so a hung driver call becomes a failed check instead of a stuck job. NVIDIA libraries are
//! loaded at run time, so the probe starts anywhere and says what is missing.

pub mod actions;
pub mod budget;
pub mod burn;
pub mod causes;
pub mod cuda;
pub mod effective;
pub mod emit;
pub mod env;
pub mod framework;
pub mod gemm;
pub mod judge;
pub mod limits;
pub mod loader;
pub mod nccl_log;
pub mod nvml;
pub mod policy;
pub mod report;
pub mod require;
pub mod schedule;
pub mod toolkit;
pub mod transport;
pub mod worker;
pub mod world;

use crate::error::Error;
use crate::lock::{LOCK_PATH_IN_IMAGE, Lock};
use crate::version::Version;
use env::Discovery;
use judge::{GpuUnderTest, Nccl};
use nccl_log::NcclLog;
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
    /// All-reduce message sizes in bytes, replacing the default ladder.
    pub sizes: Option<Vec<u64>>,
    /// Expectations per model, replacing the built-in table.
    pub policy: Option<Vec<policy::ModelPolicy>>,
    /// The interpreter whose torch the framework phase checks; the image's venv when unset.
    pub python: Option<std::path::PathBuf>,
    /// Record what the framework phase's start-up reads, into [`Report::startup`] (see
    /// [`crate::startup`]).
    pub record_startup: bool,
    /// Leave the framework phase out (the ranks of `probe --world` hold the GPUs themselves).
    pub no_framework: bool,
    /// How deep to look, within the level's hard budget.
    pub level: budget::Level,
    /// How long level 3 keeps every GPU busy.
    pub burn: Duration,
    /// A budget in place of the level's own (tests of what happens when it runs out).
    pub budget: Option<Duration>,
}

impl ProbeOptions {
    /// The hard budget of the whole run.
    pub fn total_budget(&self) -> Duration {
        self.budget
            .unwrap_or_else(|| budget::of_level(self.level, self.burn))
    }
}

/// What NVIDIA_VISIBLE_DEVICES says about how GPUs reach the container. `void` asks the
/// toolkit's legacy hook for nothing; CDI specs (`nvidia-ctk cdi generate`) set it so while
/// they bring the device nodes themselves, so `void` with GPU nodes present is CDI at work.
fn visible_devices(value: Option<&str>, in_container: bool, gpu_nodes: usize) -> (Status, String) {
    match value {
        Some(v @ ("void" | "none" | "")) if in_container && gpu_nodes > 0 => (
            Status::Pass,
            format!("`{v}` with {gpu_nodes} GPU nodes present: the devices came through CDI"),
        ),
        Some(v @ ("void" | "none" | "")) if in_container => {
            (Status::Warn, format!("`{v}`: the toolkit injects no GPU"))
        }
        Some(v) => (Status::Pass, v.to_string()),
        None if in_container && gpu_nodes > 0 => (
            Status::Pass,
            format!("unset, {gpu_nodes} GPU nodes present (a CDI device or a device mount)"),
        ),
        None if in_container => (
            Status::Warn,
            "unset: without it (or --gpus / a CDI device) the toolkit injects nothing".into(),
        ),
        None => (Status::Skip, "unset (not needed on a host)".into()),
    }
}

/// A private directory for the workers' files. Minimal images may have no /tmp (nor
/// TMPDIR): /dev/shm, which every runtime mounts, and /var/tmp come next.
pub(crate) fn scratch_dir() -> Result<tempfile::TempDir, String> {
    let mut tried = Vec::new();
    match tempfile::tempdir() {
        Ok(dir) => return Ok(dir),
        Err(e) => tried.push(format!("{}: {e}", std::env::temp_dir().display())),
    }
    for place in ["/dev/shm", "/var/tmp"] {
        match tempfile::tempdir_in(place) {
            Ok(dir) => return Ok(dir),
            Err(e) => tried.push(format!("{place}: {e}")),
        }
    }
    Err(format!(
        "cannot make a temporary directory ({})",
        tried.join("; ")
    ))
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

/// Runs every phase of the level and returns the report. Err only for bad input that the
/// node reveals: `--devices` naming a GPU it does not have.
pub fn run(opts: &ProbeOptions) -> crate::Result<Report> {
    let start = Instant::now();
    let deadline = budget::Deadline::new(opts.level, opts.total_budget());
    let mut report = Report {
        gpubake: env!("CARGO_PKG_VERSION").to_string(),
        level: opts.level.number(),
        ..Report::default()
    };
    let disc = Discovery::system();
    deadline.enter("environment");
    environment(&disc, &mut report);
    deadline.enter("container limits");
    let limits = limits::check(&disc, &mut report);
    let memory_binding = effective::MemoryBind::from(limits.memory_binding.as_ref());

    let policy = opts
        .policy
        .clone()
        .unwrap_or_else(|| policy::embedded().to_vec());
    let devices = opts.devices.clone();
    deadline.enter("NVML");
    let nvml_budget = budget::Budget::new(budget::nvml(opts.quick), deadline);
    let allowed = nvml_budget.now();
    let nvml_result = with_budget(allowed, move || nvml::run(&policy, devices.as_deref()));
    let facts = nvml_phase(
        nvml_result,
        &disc,
        nvml_budget.stopped(allowed),
        &mut report,
    )?;
    deadline.enter("cuInit");
    causes::check(
        &disc,
        facts.as_ref(),
        deadline.cut(budget::nvml(opts.quick)),
        &mut report,
    );
    deadline.enter("compatibility");
    let lock = compatibility(&disc, facts.as_ref(), &mut report);
    let gpus = facts.as_ref().map(|f| f.gpus.clone()).unwrap_or_default();
    if opts.level >= budget::Level::Active {
        if let Some(facts) = facts.as_ref().filter(|f| !f.gpus.is_empty()) {
            gpu_phases(
                &disc,
                facts,
                lock.as_ref(),
                memory_binding,
                opts,
                deadline,
                &mut report,
            );
        }
        if !opts.no_framework {
            deadline.enter("framework");
            framework_phase(&gpus, lock.as_ref(), opts, deadline, &mut report);
        }
    }
    if opts.level == budget::Level::Burn
        && let Some(facts) = facts.as_ref().filter(|f| !f.gpus.is_empty())
    {
        deadline.enter("burn");
        burn::phase(&disc, facts, opts, deadline, &mut report);
    }
    deadline.enter("report");
    if let Some(step) = deadline.overran() {
        report.push(
            "budget",
            format!("level {}", opts.level.number()),
            Status::Fail,
            format!(
                "ran past its {} s budget in step `{step}`; what that step and those after it \
                 had not measured is missing",
                deadline.budget().as_secs(),
            ),
        );
    }
    actions::advise(&mut report);
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// The image's own PyTorch on the GPUs: the interpreter `--python` names, else the image's
/// venv; skipped with the reason where there is none.
fn framework_phase(
    gpus: &[nvml::Gpu],
    lock: Option<&Lock>,
    opts: &ProbeOptions,
    deadline: budget::Deadline,
    report: &mut Report,
) {
    let python = opts
        .python
        .as_deref()
        .map(framework::on_path)
        .unwrap_or_else(framework::image_python);
    if !python.exists() {
        report.push(
            "framework",
            "torch",
            Status::Skip,
            format!(
                "no Python stack: {} does not exist (`probe --python PATH` names another interpreter)",
                python.display()
            ),
        );
        return;
    }
    let visible = opts.devices.as_ref().map(|_| {
        gpus.iter()
            .map(|g| g.uuid.clone())
            .collect::<Vec<_>>()
            .join(",")
    });
    let budget = deadline.cut(budget::framework(opts.quick));
    let run = framework::Run {
        python: &python,
        // Without a GPU one rank still says whether torch imports.
        ranks: gpus.len().max(1),
        visible,
        gemm_n: if opts.quick { 4096 } else { 8192 },
        sizes: if opts.quick {
            vec![1 << 20]
        } else {
            vec![1 << 20, 256 << 20]
        },
        budget,
        record: opts.record_startup,
    };
    let nccl = report.facts.get("nccl").cloned();
    let measured_nccl = nccl
        .as_ref()
        .and_then(|n| Some((n[0]["path"].as_str()?, n[0]["version"].as_str()?)));
    let allreduce = report.facts.get("allreduce").cloned();
    let policy = opts
        .policy
        .clone()
        .unwrap_or_else(|| policy::embedded().to_vec());
    let floor = gpus
        .first()
        .and_then(|g| policy::for_gpu(&policy, &g.name))
        .and_then(|p| Some((p.bf16_tflops_floor?, p.model.clone())));
    let measured = framework::Measured {
        nccl: measured_nccl,
        allreduce: allreduce.as_ref(),
        gemm_floor: floor.as_ref().map(|(f, m)| (*f, m.as_str())),
        loader: Some(&framework::loader_here),
    };
    match framework::run(&run) {
        Ok(ranks) => {
            framework::judge(&ranks, !gpus.is_empty(), lock, &measured, report);
            if opts.record_startup {
                report.startup = Some(framework::startup_record(&ranks[0]));
            }
        }
        Err(e) => {
            if opts.record_startup {
                report.startup = Some(Err(e.clone()));
            }
            report.push("framework", "torch", Status::Fail, e)
        }
    }
}

/// Writes the start-up record the framework phase took (`probe --record-startup`) to `path`;
/// says what it holds, or, naming the flag, why there is none.
pub fn write_startup_record(
    path: &std::path::Path,
    taken: Option<Result<crate::startup::StartupRecord, String>>,
) -> Result<String, String> {
    let not_written =
        |why: String| format!("--record-startup {}: not written: {why}", path.display());
    let record = match taken {
        Some(Ok(record)) => record,
        Some(Err(e)) => return Err(not_written(e)),
        None => {
            return Err(not_written(
                "the framework phase did not run (its check above says why)".into(),
            ));
        }
    };
    record.write(path).map_err(|e| not_written(e.to_string()))?;
    let (read, size) = record.totals();
    Ok(format!(
        "recorded the start-up ({}) in {}: {} files under site-packages, {} read of \
         their {}",
        record.steps.join(", "),
        path.display(),
        record.files.len(),
        crate::units::human_size(read),
        crate::units::human_size(size)
    ))
}

/// Puts the NVML phase's outcome in the report and returns the facts to go on with.
/// `no_gpu` (exit 3) is set only where the node lacks a GPU or driver; an image that cannot
/// load NVML, or a GPU that does not open, is a failed check (exit 1).
fn nvml_phase(
    outcome: Option<Result<(nvml::Facts, Vec<nvml::Found>), nvml::Failure>>,
    disc: &Discovery,
    stopped: String,
    report: &mut Report,
) -> crate::Result<Option<nvml::Facts>> {
    let (facts, checks) = match outcome {
        None => {
            report.push(
                "nvml",
                "NVML",
                Status::Fail,
                format!("{stopped}: the driver is hung"),
            );
            return Ok(None);
        }
        Some(Err(nvml::Failure::NoSuchDevice(e))) => return Err(Error::Usage(e)),
        Some(Err(e @ nvml::Failure::LibraryUnloadable { .. })) => {
            report.push("nvml", "NVML", Status::Fail, e.explain());
            return Ok(None);
        }
        Some(Err(nvml::Failure::Unknown(e))) if !disc.device_nodes().is_empty() => {
            report.push("nvml", "NVML", Status::Fail, causes::nvml_unknown(disc, &e));
            return Ok(None);
        }
        Some(Err(e)) => {
            report.no_gpu = true;
            report.push(
                "nvml",
                "NVML",
                Status::Fail,
                format!(
                    "{}; {}",
                    e.explain(),
                    env::no_gpu_help(disc.container_kind())
                ),
            );
            return Ok(None);
        }
        Some(Ok(found)) => found,
    };
    for (name, status, detail) in checks {
        report.push("nvml", name, status, detail);
    }
    if facts.count == 0 {
        report.no_gpu = true;
        report.push(
            "nvml",
            "GPUs",
            Status::Fail,
            env::no_gpu_help(disc.container_kind()),
        );
    } else if facts.gpus.is_empty() {
        report.push(
            "nvml",
            "GPUs",
            Status::Fail,
            format!(
                "NVML counts {} GPUs but none of those asked for could be opened",
                facts.count
            ),
        );
    }
    if let Some(mixed) = judge::mixed_models(&facts.gpus) {
        report.push("nvml", "GPU models", Status::Warn, mixed);
    }
    report.fact("nvml", json!(facts));
    Ok(Some(facts))
}

/// The default all-reduce sizes: 4 B to 1 GiB in steps of 16x (to 64 MiB with `--quick`).
pub fn default_sizes(quick: bool) -> Vec<u64> {
    let top = if quick { 64u64 << 20 } else { 1 << 30 };
    let mut sizes: Vec<u64> = std::iter::successors(Some(4u64), |s| Some(s * 16))
        .take_while(|s| *s <= top)
        .collect();
    if *sizes.last().expect("4 B is there") != top {
        sizes.push(top);
    }
    sizes
}

/// The environment a worker starts with: the libraries the image would load (NCCL from the
/// torch environment, NVRTC) reachable by their plain names, CUDA devices in PCI order, and
/// NVLink multicast off.
pub(crate) fn worker_env(
    disc: &Discovery,
    gpus: usize,
) -> (Vec<(String, String)>, Option<tempfile::TempDir>) {
    let mut env = Vec::new();
    let shim = scratch_dir().ok();
    let mut dirs: Vec<String> = Vec::new();
    if let Some(shim) = &shim {
        let mut link = |name: &str, found: Option<env::FoundLib>| {
            if let Some(f) = found {
                let _ = std::os::unix::fs::symlink(&f.real, shim.path().join(name));
                if let Some(parent) = f.real.parent() {
                    dirs.push(parent.display().to_string());
                }
            }
        };
        link("libnccl.so", disc.nccl_candidates().into_iter().next());
        link("libnvrtc.so", disc.nvrtc_candidates().into_iter().next());
        link("libcublas.so", disc.cublas_candidates().into_iter().next());
        dirs.insert(0, shim.path().display().to_string());
    }
    if let Ok(existing) = std::env::var("LD_LIBRARY_PATH") {
        dirs.push(existing);
    }
    env.push(("LD_LIBRARY_PATH".to_string(), dirs.join(":")));
    // The workers find GPUs by PCI address anyway; in PCI order CUDA's ordinals (and NCCL's
    // logs) also count the GPUs as NVML and nvidia-smi do.
    env.push(("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()));
    if gpus > 1 {
        env.push(("NCCL_NVLS_ENABLE".to_string(), "0".to_string()));
    }
    (env, shim)
}

/// Runs `gpubake probe-worker ARGS` with `env`; kills it after `budget`. The result comes
/// back in a file: NCCL writes its own messages to standard output.
fn run_worker(
    args: &[String],
    env: &[(String, String)],
    budget: budget::Budget,
) -> Result<serde_json::Value, String> {
    let allowed = budget.now();
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the gpubake binary: {e}"))?;
    let dir = scratch_dir()?;
    let result = dir.path().join("result.json");
    let mut command = std::process::Command::new(exe);
    command
        .arg("probe-worker")
        .arg("--result")
        .arg(&result)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // A probe stopped at its level's end exits while a hung worker may still hold a GPU: the
    // worker dies with the thread that waits for it.
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start the worker: {e}"))?;
    let done = crate::child::wait(&mut child, allowed, || {}).map_err(|e| e.to_string())?;
    if done.timed_out {
        return Err(format!(
            "{}: killed (a hung kernel or driver call, or more work than the time allows)",
            budget.stopped(allowed)
        ));
    }
    let value: serde_json::Value = std::fs::read(&result)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| {
            // NCCL writes to standard output; the worker's own failure is on standard error.
            format!(
                "the worker failed: {}",
                crate::child::last_words(&format!("{}{}", done.stdout, done.stderr))
            )
        })?;
    match value.get("error") {
        Some(e) => Err(e.as_str().unwrap_or("unknown error").to_string()),
        None => Ok(value["ok"].clone()),
    }
}

/// CUDA copies, the all-reduce and NCCL's effective configuration, in worker processes; then
/// where each GPU sits relative to the CPUs.
fn gpu_phases(
    disc: &Discovery,
    facts: &nvml::Facts,
    lock: Option<&Lock>,
    memory_binding: effective::MemoryBind,
    opts: &ProbeOptions,
    deadline: budget::Deadline,
    report: &mut Report,
) {
    let policy = opts
        .policy
        .clone()
        .unwrap_or_else(|| policy::embedded().to_vec());
    // Workers find each GPU by its PCI address: an NVML index is not a CUDA ordinal.
    let (gpus, unaddressed): (Vec<GpuUnderTest>, Vec<GpuUnderTest>) =
        judge::under_test(&facts.gpus, &policy)
            .into_iter()
            .partition(|g| g.pci_bus_id.is_some());
    for g in &unaddressed {
        report.push(
            "cuda",
            format!("GPU {}", g.index),
            Status::Fail,
            "not measured: NVML gave no PCI address, so its CUDA device cannot be found",
        );
    }
    if gpus.is_empty() {
        return;
    }
    let addresses: Vec<String> = gpus.iter().filter_map(|g| g.pci_bus_id.clone()).collect();
    let selection = vec!["--pci-bus-ids".to_string(), addresses.join(",")];
    let (env, _shim) = worker_env(disc, gpus.len());
    let budget = budget::Budget::new(budget::worker(opts.quick), deadline);
    let nccl = judge::nccl_plan(!disc.nccl_candidates().is_empty(), opts.quick, gpus.len());

    let mut args = selection.clone();
    args.extend([
        "cuda".to_string(),
        "--bytes".to_string(),
        (if opts.quick { 256u64 << 20 } else { 1 << 30 }).to_string(),
    ]);
    deadline.enter("CUDA copies");
    match run_worker(&args, &env, budget) {
        Err(e) => report.push("cuda", "CUDA", Status::Fail, e),
        Ok(v) => {
            judge::cuda_checks(&v, &gpus, report);
            report.fact("cuda", v);
        }
    }

    let sizes = opts
        .sizes
        .clone()
        .unwrap_or_else(|| default_sizes(opts.quick));
    let per_gpu = if gpus.len() == 1 { 4 } else { 1 };
    let mut args = selection.clone();
    args.extend([
        "allreduce".to_string(),
        "--ranks-per-gpu".to_string(),
        per_gpu.to_string(),
        "--sizes".to_string(),
        sizes
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(","),
        "--iters".to_string(),
        (if opts.quick { 5 } else { 20 }).to_string(),
    ]);
    if nccl == Nccl::Asked {
        args.push("--nccl".to_string());
    }
    deadline.enter("all-reduce");
    match run_worker(&args, &env, budget) {
        Err(e) => report.push("allreduce", "bundled all-reduce", Status::Fail, e),
        Ok(v) => {
            judge::allreduce_checks(&v, &gpus, per_gpu, &nccl, report);
            report.fact("allreduce", v);
        }
    }
    deadline.enter("preset against NCCL's defaults");
    preset_ab(disc, &selection, &env, budget, &nccl, report);

    let image_presets: Vec<&str> = lock
        .map(|l| {
            l.env
                .0
                .values()
                .filter_map(|v| v.origin.by.strip_prefix("preset "))
                .collect()
        })
        .unwrap_or_default();
    deadline.enter("NCCL's effective settings");
    let logged = nccl_effective(
        disc,
        &selection,
        &env,
        budget,
        &nccl,
        &image_presets,
        report,
    );
    if logged.is_none() && !opts.quick && !disc.nccl_candidates().is_empty() {
        deadline.enter("IB transport");
        ib_transport_run(disc, &addresses[0], &env, budget, report);
    }
    // Local rank r drives CUDA device r, and CUDA counts GPUs in PCI order here.
    let mut by_address: Vec<&GpuUnderTest> = gpus.iter().collect();
    by_address.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    let in_rank_order: Vec<u32> = by_address.iter().map(|g| g.index).collect();
    let launch = effective::Launch {
        torch: lock.map(|l| l.torch.version.clone()),
        ranks: in_rank_order.len(),
        numactl: disc.on_path("numactl"),
        memory_binding,
    };
    effective::affinity_checks(
        &facts.affinity,
        &in_rank_order,
        logged.as_ref(),
        &machine(disc),
        &launch,
        report,
    );
}

/// The image's NCCL preset: /etc/nccl.conf overlaid by the NCCL_* environment, as NCCL layers
/// them (the environment wins), keeping only NCCL's own parameters (images also carry
/// NCCL_VERSION and the like).
pub(crate) fn image_preset(disc: &Discovery) -> Vec<(String, String)> {
    let mut preset: Vec<(String, String)> = std::fs::read_to_string(disc.at("/etc/nccl.conf"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    for (k, v) in std::env::vars().filter(|(k, _)| k.starts_with("NCCL_")) {
        preset.retain(|(p, _)| *p != k);
        preset.push((k, v));
    }
    let table = crate::nccl::params::ParamTable::embedded();
    preset.retain(|(k, _)| table.get(k).is_some());
    preset
}

/// The subsystems NCCL logs in the effective run: INIT for the channel connections, channel
/// counts and CPU affinity; ENV for the variables it applied; TUNING for the algorithm and
/// protocol of each call. The version and refusals print under any subsystem.
const NCCL_LOG_SUBSYS: &str = "INIT,ENV,TUNING";

/// Message sizes of the logged run, spanning the ranges where NCCL's tuner picks LL, LL128
/// and SIMPLE.
const EFFECTIVE_SIZES: [u64; 5] = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];

/// NCCL once more with the image's preset, logging at INFO to files, and what the log says
/// NCCL applied, connected and chose. The log is read even when the run fails: a refused
/// value is often why. None when NCCL did not run or wrote no log.
fn nccl_effective(
    disc: &Discovery,
    selection: &[String],
    env: &[(String, String)],
    budget: budget::Budget,
    nccl: &Nccl,
    image_presets: &[&str],
    report: &mut Report,
) -> Option<NcclLog> {
    const PHASE: &str = effective::PHASE;
    if let Nccl::NotAsked(why) = nccl {
        report.push(PHASE, "effective configuration", Status::Skip, why.clone());
        return None;
    }
    let logs = match scratch_dir() {
        Ok(dir) => dir,
        Err(e) => {
            report.push(
                PHASE,
                "NCCL run",
                Status::Fail,
                format!("cannot make a directory for NCCL's log: {e}"),
            );
            return None;
        }
    };
    let preset = image_preset(disc);
    let probe_sets = |k: &str| effective::SET_BY_PROBE.contains(&k);
    let run_env = logged_env(env, &preset, NCCL_LOG_SUBSYS, logs.path());
    let mut args = selection.to_vec();
    args.extend([
        "nccl".into(),
        "--sizes".into(),
        EFFECTIVE_SIZES.map(|s| s.to_string()).join(","),
        "--iters".into(),
        "1".into(),
    ]);
    let outcome = run_worker(&args, &run_env, budget);
    let text = read_logs(logs.path());
    let log = NcclLog::parse(&text);
    let version = log.version.as_deref().unwrap_or("(version not logged)");
    match &outcome {
        Ok(_) => report.push(
            PHASE,
            "NCCL run",
            Status::Pass,
            format!(
                "NCCL {version} ran all-reduce at {} bytes {}",
                EFFECTIVE_SIZES.map(|s| s.to_string()).join(", "),
                if preset.iter().any(|(k, _)| !probe_sets(k)) {
                    "under the image's preset"
                } else {
                    "with its defaults (no preset variable set)"
                }
            ),
        ),
        Err(e) => {
            let warned = if log.warnings.is_empty() {
                String::new()
            } else {
                format!("; NCCL warned: {}", log.warnings.join(" | "))
            };
            report.push(PHASE, "NCCL run", Status::Fail, format!("{e}{warned}"));
        }
    }
    if text.trim().is_empty() {
        report.push(
            PHASE,
            "NCCL log",
            Status::Warn,
            "NCCL wrote no log to NCCL_DEBUG_FILE, so what it applied and chose is unknown",
        );
        return None;
    }
    let expects_nvlink = effective::expects_nvlink(&preset, image_presets);
    effective::nccl_checks(
        &log,
        &preset,
        expects_nvlink.as_deref(),
        crate::nccl::params::ParamTable::embedded(),
        report,
    );
    if crate::nccl::needs::of_node(&preset, &transport::rdma_devices(disc)).is_some() {
        let (status, detail) = effective::ib_verdict(&log);
        report.push(PHASE, "IB transport", status, detail);
    }
    report.fact(
        "nccl_effective",
        json!({"variables": preset, "expects_nvlink": expects_nvlink, "log": log}),
    );
    Some(log)
}

/// The worker's environment for a logged NCCL run: `env`, the image's `preset` (less what the
/// probe sets itself), NCCL's INFO log of `subsys` into files under `logs`, and multicast off.
fn logged_env(
    env: &[(String, String)],
    preset: &[(String, String)],
    subsys: &str,
    logs: &std::path::Path,
) -> Vec<(String, String)> {
    let mut run_env: Vec<(String, String)> = env
        .iter()
        .chain(preset.iter())
        .filter(|(k, _)| !effective::SET_BY_PROBE.contains(&k.as_str()))
        .cloned()
        .collect();
    run_env.extend([
        ("NCCL_DEBUG".to_string(), "INFO".to_string()),
        ("NCCL_DEBUG_SUBSYS".to_string(), subsys.to_string()),
        // NCCL expands %h to the host name and %p to the process id (src/debug.cc,
        // ncclDebugInit): one file per process, all of them read back.
        (
            "NCCL_DEBUG_FILE".to_string(),
            logs.join("nccl.%h.%p.log").display().to_string(),
        ),
        // Multicast stays off whatever the image says.
        ("NCCL_NVLS_ENABLE".to_string(), "0".to_string()),
    ]);
    run_env
}

/// Where the effective run did not happen (one GPU), one rank of NCCL on the GPU at
/// `address`, for what NCCL says of its IB transport when the image or the node needs it: a
/// communicator of one rank still starts NCCL's network plugins, IB first (recorded on the
/// one-GPU H200 machine). With `NCCL_NET=IB` on a node without an RDMA device NCCL refuses to
/// start, which the check says beside what NCCL logged.
fn ib_transport_run(
    disc: &Discovery,
    address: &str,
    env: &[(String, String)],
    budget: budget::Budget,
    report: &mut Report,
) {
    const PHASE: &str = effective::PHASE;
    let preset = image_preset(disc);
    if crate::nccl::needs::of_node(&preset, &transport::rdma_devices(disc)).is_none() {
        return;
    }
    let logs = match scratch_dir() {
        Ok(dir) => dir,
        Err(e) => {
            let why = format!("cannot make a directory for NCCL's log: {e}");
            return report.push(PHASE, "IB transport", Status::Fail, why);
        }
    };
    let run_env = logged_env(env, &preset, "INIT", logs.path());
    let args: Vec<String> = [
        "--pci-bus-ids",
        address,
        "nccl",
        "--sizes",
        "1024",
        "--iters",
        "1",
    ]
    .map(String::from)
    .to_vec();
    let outcome = run_worker(&args, &run_env, budget);
    let log = NcclLog::parse(&read_logs(logs.path()));
    let (mut status, mut detail) = effective::ib_verdict(&log);
    if let Err(e) = &outcome {
        if status == Status::Pass {
            status = Status::Warn;
        }
        detail.push_str(&format!(
            "; NCCL did not start with the image's settings here: {e}"
        ));
        if !log.warnings.is_empty() {
            detail.push_str(&format!(" (NCCL warned: {})", log.warnings.join(" | ")));
        }
    }
    report.push(PHASE, "IB transport", status, format!("one rank: {detail}"));
    report.fact(
        "nccl_ib",
        json!({"ib": log.ib, "warnings": log.warnings, "network": log.network, "ran": outcome.is_ok()}),
    );
}

/// Every log file NCCL wrote in `dir`, in name order, as one text.
fn read_logs(dir: &std::path::Path) -> String {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    let mut text = String::new();
    for file in files {
        if let Ok(bytes) = std::fs::read(&file) {
            text.push_str(&String::from_utf8_lossy(&bytes));
            text.push('\n');
        }
    }
    text
}

/// The node's CPUs and NUMA nodes as the kernel lists them; unknown where /sys is hidden.
fn machine(disc: &Discovery) -> effective::Machine {
    let count = |path: &str| {
        std::fs::read_to_string(disc.at(path))
            .ok()
            .and_then(|text| nccl_log::parse_ranges(&text))
            .filter(|listed| !listed.is_empty())
            .map(|listed| listed.len())
    };
    effective::Machine {
        cpus: count("/sys/devices/system/cpu/present"),
        numa_nodes: count("/sys/devices/system/node/online"),
    }
}

/// NCCL with the image's preset against NCCL's defaults, each in a fresh process since NCCL
/// reads its environment once. For the defaults, every preset variable is set empty, which
/// NCCL treats as unset and which keeps /etc/nccl.conf from filling it in.
fn preset_ab(
    disc: &Discovery,
    selection: &[String],
    env: &[(String, String)],
    budget: budget::Budget,
    nccl: &Nccl,
    report: &mut Report,
) {
    const PHASE: &str = "allreduce";
    if let Nccl::NotAsked(why) = nccl {
        report.push(PHASE, "preset vs NCCL defaults", Status::Skip, why.clone());
        return;
    }
    let mut preset = image_preset(disc);
    // Never multicast: NCCL_NVLS_ENABLE stays 0 in both runs.
    preset.retain(|(k, _)| k != "NCCL_NVLS_ENABLE");
    if preset.is_empty() {
        report.push(
            PHASE,
            "preset vs NCCL defaults",
            Status::Skip,
            "the image sets no NCCL_* variable",
        );
        return;
    }
    let sizes = [1u64 << 20, 64 << 20, 512 << 20];
    let mut args = selection.to_vec();
    args.extend([
        "nccl".into(),
        "--sizes".into(),
        sizes.map(|s| s.to_string()).join(","),
    ]);
    let mut with_preset = env.to_vec();
    with_preset.extend(preset.iter().cloned());
    let mut defaults = env.to_vec();
    defaults.extend(preset.iter().map(|(k, _)| (k.clone(), String::new())));
    match (
        run_worker(&args, &with_preset, budget),
        run_worker(&args, &defaults, budget),
    ) {
        (Ok(a), Ok(b)) => {
            let names: Vec<&str> = preset.iter().map(|(k, _)| k.as_str()).collect();
            let (status, detail) = judge::preset_verdict(&a, &b, &names);
            report.push(PHASE, "preset vs NCCL defaults", status, detail);
            report.fact(
                "preset_ab",
                json!({"preset": a, "defaults": b, "variables": preset}),
            );
        }
        (Err(e), _) | (_, Err(e)) => report.push(PHASE, "preset vs NCCL defaults", Status::Fail, e),
    }
}

/// Container or host, the toolkit's variables, device nodes and driver libraries.
/// On a host, the node's CDI specs as runtimes will read them: present, their device nodes
/// there, their libraries those of the running driver. Specs are optional (the toolkit's
/// legacy hook needs none), so their absence is a skip; a broken one is a failure.
fn cdi_preflight(disc: &Discovery, report: &mut Report) {
    const PHASE: &str = "cdi";
    let dirs: Vec<std::path::PathBuf> = crate::cdi::DEFAULT_SPEC_DIRS
        .iter()
        .map(|d| disc.at(d))
        .collect();
    let specs = match crate::cdi::load(&dirs) {
        Ok(specs) => specs,
        Err(e) => {
            report.push(PHASE, "CDI spec", Status::Fail, e.to_string());
            return;
        }
    };
    if specs.is_empty() {
        report.push(
            PHASE,
            "CDI spec",
            Status::Skip,
            format!(
                "none in {}: containers get GPUs through the toolkit's hook, or \
                 `nvidia-ctk cdi generate` writes one for CDI runtimes",
                crate::cdi::DEFAULT_SPEC_DIRS.join(" or ")
            ),
        );
        return;
    }
    let driver = std::fs::read_to_string(disc.at("/proc/driver/nvidia/version"))
        .ok()
        .and_then(|t| crate::cdi::driver_version(&t));
    let exists = |p: &str| disc.at(p).exists();
    // The preflight's checks are of this phase.
    report.checks.extend(crate::cdi::preflight(
        &specs,
        &dirs,
        driver.as_deref(),
        &exists,
    ));
}

fn environment(disc: &Discovery, report: &mut Report) {
    const PHASE: &str = "environment";
    let (kind, evidence) = disc.container();
    report.push(
        PHASE,
        "runs in",
        Status::Pass,
        format!("{kind} ({evidence})"),
    );
    let in_container = kind != "host";
    if !in_container {
        cdi_preflight(disc, report);
    }
    let visible = std::env::var("NVIDIA_VISIBLE_DEVICES").ok();
    let gpu_nodes = disc
        .device_nodes()
        .iter()
        .filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    let (status, detail) = visible_devices(visible.as_deref(), in_container, gpu_nodes);
    report.push(PHASE, "NVIDIA_VISIBLE_DEVICES", status, detail);
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

/// The image's lock against the driver, `NVIDIA_REQUIRE_*`, the NCCL PyTorch would load, and
/// the libraries its IB transport would.
/// Returns the lock, which later phases read too.
fn compatibility(
    disc: &Discovery,
    facts: Option<&nvml::Facts>,
    report: &mut Report,
) -> Option<Lock> {
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
                format!(
                    "no {LOCK_PATH_IN_IMAGE}: a probe image (`pytorch: none`, which pins \
                     nothing) or not a gpubake image; the driver is not held to a lock"
                ),
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
    transport::check(disc, report);
    lock
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
                format!(
                    "`{}` holds for driver {driver} (CUDA {cuda})",
                    shorten(&value, 60)
                ),
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

/// The first `max` characters of `text`, marked when cut.
fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// Every libnccl.so.2 the image holds, the one PyTorch would load first, and its version
/// against the lock's pin.
fn nccl_check(disc: &Discovery, lock: Option<&Lock>, report: &mut Report) {
    const PHASE: &str = "compatibility";
    let found = disc.nccl_candidates();
    let mut listed = Vec::new();
    let mut load_error = None;
    for (i, f) in found.iter().enumerate() {
        let version = match nccl_version(&f.real) {
            Ok(v) => Some(v),
            Err(e) => {
                if i == 0 {
                    load_error = Some(e);
                }
                f.version.clone()
            }
        };
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
    let (status, why) = match (&load_error, &loaded, &pinned) {
        // The library PyTorch would load does not load: training would fail at import.
        (Some(e), _, _) => (Status::Fail, loader::explain("libnccl.so.2", e)),
        (None, loaded, pinned) => match (loaded, pinned) {
            (Some(v), Some(p)) if v.parse::<Version>().ok().as_ref() == Some(p) => {
                (Status::Pass, format!("{v}, as pinned"))
            }
            (Some(v), Some(p)) => (Status::Fail, format!("{v}, but the lock pins {p}")),
            (Some(v), None) => (Status::Pass, v.to_string()),
            (None, _) => (Status::Warn, "version unreadable".to_string()),
        },
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
fn nccl_version(path: &std::path::Path) -> Result<String, String> {
    // Loading a library runs its constructors; NCCL's are inert until a communicator is made.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| loader::message(&e))?;
    let get: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
        unsafe { lib.get(b"ncclGetVersion\0") }.map_err(|e| loader::message(&e))?;
    let mut code = 0i32;
    if unsafe { get(&mut code) } != 0 {
        return Err("ncclGetVersion failed".into());
    }
    let (major, minor, patch) = if code >= 10000 {
        (code / 10000, code / 100 % 100, code % 100)
    } else {
        (code / 1000, code / 100 % 10, code % 100)
    };
    Ok(format!("{major}.{minor}.{patch}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_with_a_cdi_spec_left_by_an_older_driver_fails_its_preflight() {
        let root = tempfile::tempdir().unwrap();
        let put = |path: &str, text: &str| {
            let at = root.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::fs::write(at, text).unwrap();
        };
        put("/dev/nvidia0", "");
        put("/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15", "");
        put(
            "/proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 2025\n",
        );
        put(
            "/etc/cdi/nvidia.yaml",
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n  containerEdits:\n    deviceNodes: [{path: /dev/nvidia0}]\ncontainerEdits:\n  mounts:\n  - {hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15, containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15}\n",
        );
        let mut report = Report::default();
        cdi_preflight(&Discovery::under(root.path()), &mut report);
        let libs = report
            .checks
            .iter()
            .find(|c| c.name == "CDI driver libraries")
            .unwrap();
        assert_eq!(libs.status, Status::Fail, "{}", libs.detail);
        assert!(libs.detail.contains("580.95.05"), "{}", libs.detail);
        let nodes = report
            .checks
            .iter()
            .find(|c| c.name == "CDI device nodes")
            .unwrap();
        assert_eq!(nodes.status, Status::Pass, "{}", nodes.detail);

        let bare = tempfile::tempdir().unwrap();
        let mut report = Report::default();
        cdi_preflight(&Discovery::under(bare.path()), &mut report);
        assert_eq!(report.checks[0].status, Status::Skip);
    }

    #[test]
    fn void_with_gpu_nodes_is_cdi_and_void_without_them_is_no_gpu() {
        assert_eq!(visible_devices(Some("void"), true, 2).0, Status::Pass);
        assert!(visible_devices(Some("void"), true, 2).1.contains("CDI"));
        assert_eq!(visible_devices(Some("void"), true, 0).0, Status::Warn);
        assert_eq!(visible_devices(None, true, 0).0, Status::Warn);
        assert_eq!(visible_devices(Some("0,1"), true, 2).0, Status::Pass);
        assert_eq!(visible_devices(None, false, 0).0, Status::Skip);
    }

    #[test]
    fn default_sizes_climb_by_16_to_the_top() {
        assert_eq!(
            default_sizes(true),
            vec![4, 64, 1024, 16 << 10, 256 << 10, 4 << 20, 64 << 20]
        );
        let full = default_sizes(false);
        assert_eq!(full.last(), Some(&(1 << 30)));
        assert!(full.windows(2).all(|w| w[0] < w[1]));
    }

    fn one_gpu_of_two() -> nvml::Facts {
        nvml::Facts {
            count: 2,
            driver: "580.95.05".into(),
            cuda: "13.0".into(),
            gpus: vec![nvml::Gpu {
                index: 0,
                name: "NVIDIA H200".into(),
                uuid: String::new(),
                arch: "9.0".into(),
                brand: "nvidia".into(),
                memory_total: 0,
                pci_bus_id: "00000000:1B:00.0".into(),
            }],
            ..nvml::Facts::default()
        }
    }

    fn phase(
        outcome: Result<(nvml::Facts, Vec<nvml::Found>), nvml::Failure>,
    ) -> (crate::Result<Option<nvml::Facts>>, Report) {
        let dir = tempfile::tempdir().unwrap();
        let mut report = Report::default();
        let result = nvml_phase(
            Some(outcome),
            &Discovery::under(dir.path()),
            "no result within 1 s".into(),
            &mut report,
        );
        (result, report)
    }

    #[test]
    fn a_gpu_that_does_not_open_leaves_the_others_probed() {
        let (_, failed) =
            nvml::open_each(
                &[0, 1],
                |i| {
                    if i == 1 { Err("GPU is lost") } else { Ok(()) }
                },
            );
        let (result, report) = phase(Ok((one_gpu_of_two(), failed)));
        let facts = result.unwrap().expect("the phase goes on");
        assert_eq!(facts.gpus.len(), 1);
        assert!(!report.no_gpu, "{:#?}", report.checks);
        assert_eq!(report.exit_code(), 1);
        assert!(
            report
                .checks
                .iter()
                .all(|c| !c.detail.contains("no NVIDIA GPU is visible"))
        );

        // None of them opens: still a failed check, not an empty node.
        let mut none = one_gpu_of_two();
        none.gpus.clear();
        let (result, report) = phase(Ok((none, Vec::new())));
        assert!(result.unwrap().is_some());
        assert!(!report.no_gpu);
        assert_eq!(report.exit_code(), 1);
    }

    #[test]
    fn devices_past_the_last_gpu_exit_2() {
        let failure = nvml::select_devices(Some(&[7]), 2).unwrap_err();
        let (result, _) = phase(Err(failure));
        let err = result.unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("index 7"), "{err}");
    }

    #[test]
    fn an_image_that_cannot_load_nvml_fails_without_blaming_the_node() {
        let (result, report) = phase(Err(nvml::load_failure(
            "libpthread.so.0: cannot open shared object file: No such file or directory",
        )));
        assert!(result.unwrap().is_none());
        assert!(!report.no_gpu);
        assert_eq!(report.exit_code(), 1);
        let detail = &report.checks[0].detail;
        assert!(detail.contains("libpthread.so.0"), "{detail}");
        assert!(!detail.contains("install the NVIDIA driver"), "{detail}");

        // No driver library at all is the node's: exit 3 with how to inject it.
        let (_, report) = phase(Err(nvml::load_failure(
            "libnvidia-ml.so.1: cannot open shared object file: No such file or directory",
        )));
        assert!(report.no_gpu);
        assert!(
            report.checks[0]
                .detail
                .contains("install the NVIDIA driver")
        );
    }

    #[test]
    fn no_nccl_skips_the_preset_comparison() {
        let dir = tempfile::tempdir().unwrap();
        let disc = Discovery::under(dir.path());
        let plan = judge::nccl_plan(!disc.nccl_candidates().is_empty(), false, 2);
        let mut report = Report::default();
        preset_ab(
            &disc,
            &["--pci-bus-ids".into(), "0000:1b:00.0,0000:43:00.0".into()],
            &[],
            budget::Budget::new(Duration::from_secs(1), budget::Deadline::unlimited()),
            &plan,
            &mut report,
        );
        assert_eq!(report.checks.len(), 1);
        assert_eq!(report.checks[0].status, Status::Skip);
        assert!(report.checks[0].detail.contains("no libnccl.so.2"));
    }

    #[test]
    fn no_nccl_skips_the_effective_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let disc = Discovery::under(dir.path());
        let plan = judge::nccl_plan(!disc.nccl_candidates().is_empty(), false, 2);
        let mut report = Report::default();
        let logged = nccl_effective(
            &disc,
            &["--pci-bus-ids".into(), "0000:1b:00.0,0000:43:00.0".into()],
            &[],
            budget::Budget::new(Duration::from_secs(1), budget::Deadline::unlimited()),
            &plan,
            &[],
            &mut report,
        );
        assert!(logged.is_none());
        assert_eq!(report.checks.len(), 1);
        assert_eq!(report.checks[0].phase, effective::PHASE);
        assert_eq!(report.checks[0].status, Status::Skip);
        assert!(report.checks[0].detail.contains("no libnccl.so.2"));
    }

    #[test]
    fn every_process_log_is_read() {
        // NCCL_DEBUG_FILE=nccl.%h.%p.log gives one file per process: both ranks' lines count.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("nccl.node.100.log"),
            "node:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("nccl.node.101.log"),
            b"node:101:101 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/IPC\xff",
        )
        .unwrap();
        let log = NcclLog::parse(&read_logs(dir.path()));
        assert_eq!(log.links.len(), 2, "{log:?}");
        assert!(read_logs(&dir.path().join("absent")).is_empty());
    }

    #[test]
    fn the_machine_is_read_from_sys_or_left_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let disc = Discovery::under(dir.path());
        assert_eq!(machine(&disc), effective::Machine::default());
        let sys = dir.path().join("sys/devices/system");
        std::fs::create_dir_all(sys.join("cpu")).unwrap();
        std::fs::create_dir_all(sys.join("node")).unwrap();
        std::fs::write(sys.join("cpu/present"), "0-223\n").unwrap();
        std::fs::write(sys.join("node/online"), "0-1\n").unwrap();
        assert_eq!(
            machine(&disc),
            effective::Machine {
                cpus: Some(224),
                numa_nodes: Some(2)
            }
        );
    }

    #[test]
    fn long_text_is_shortened_on_a_character_boundary() {
        assert_eq!(shorten("abcdef", 3), "abc…");
        assert_eq!(shorten("ab", 3), "ab");
        assert_eq!(shorten("äöüß", 2), "äö…");
    }
}
