//! The training job's own path: the image's interpreter imports torch, initialises CUDA, runs
//! a bf16 GEMM and a cuDNN convolution against CPU references and a `torch.distributed` NCCL
//! all-reduce with one process per GPU, as torchrun starts them, then lists the libraries the
//! process really mapped. The bundled kernel and the directly loaded libnccl prove the node; this
//! proves what the job will meet.

use super::report::{Report, Status};
use crate::lock::Lock;
use crate::startup::{FileRead, StartupRecord};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The check script, run by the image's python (standard library plus torch).
const SCRIPT: &str = include_str!("framework.py");

/// Where a gpubake image keeps its Python stack's interpreter.
pub fn image_python() -> PathBuf {
    Path::new(crate::names::VENV).join("bin/python3")
}

/// `name` as the shell finds it: a bare name (`python3`) through PATH, anything else as given.
pub fn on_path(name: &Path) -> PathBuf {
    if name.components().count() > 1 {
        return name.to_path_buf();
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| name.to_path_buf())
}

/// The libraries whose copy and version the report names.
const WATCHED: [&str; 8] = [
    "libcuda.so",
    "libcudart.so",
    "libcublas.so",
    "libcublasLt.so",
    "libcudnn",
    "libnccl.so",
    "libnvrtc.so",
    "libnvidia-ml.so",
];

/// A bf16 GEMM's relative error against the CPU reference that still counts as right: the
/// product is rounded to bf16 (8 bits of mantissa), so about 2^-8 of the largest entry.
const GEMM_TOLERANCE: f64 = 2e-2;
/// A float convolution's, with cuDNN free to use TF32 (10 bits of mantissa).
const CONV_TOLERANCE: f64 = 1e-2;

/// How the framework check is to run.
pub struct Run<'a> {
    /// The interpreter, with its environment.
    pub python: &'a Path,
    /// One process per GPU; each takes its GPU by LOCAL_RANK.
    pub ranks: usize,
    /// CUDA_VISIBLE_DEVICES for the ranks, where only some GPUs are probed.
    pub visible: Option<String>,
    /// The GEMM's edge.
    pub gemm_n: u32,
    /// All-reduce sizes in bytes.
    pub sizes: Vec<u64>,
    /// For the whole run, every rank included.
    pub budget: Duration,
    /// Rank 0 records what its start-up reads (see [`startup_record`]).
    pub record: bool,
}

/// Runs the script in `run.ranks` processes and returns each rank's result, rank 0 first.
/// Err: why there is no result (the interpreter did not start, a rank hung or died), in the
/// child's own words.
pub fn run(run: &Run) -> Result<Vec<Value>, String> {
    let dir = super::scratch_dir()?;
    let script = dir.path().join("framework.py");
    std::fs::write(&script, SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port for the ranks' rendezvous: {e}"))?
        .port();
    let sizes = run
        .sizes
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let deadline = std::time::Instant::now() + run.budget;
    let mut children = Vec::new();
    for rank in 0..run.ranks {
        let result = dir.path().join(format!("rank{rank}.json"));
        let mut cmd = std::process::Command::new(run.python);
        cmd.arg(&script)
            .arg(&result)
            .arg(run.gemm_n.to_string())
            .arg(&sizes)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", run.ranks.to_string())
            .env("LOCAL_WORLD_SIZE", run.ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(v) = &run.visible {
            cmd.env("CUDA_VISIBLE_DEVICES", v);
        }
        if run.record && rank == 0 {
            cmd.env("GPUBAKE_RECORD_STARTUP", "1");
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", run.python.display()))?;
        children.push((child, result));
    }
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for (rank, (mut child, result)) in children.into_iter().enumerate() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let done = crate::child::wait(&mut child, left, || {}).map_err(|e| e.to_string())?;
        if done.timed_out {
            failures.push(format!(
                "rank {rank} gave no result within {} s and was killed: {}",
                run.budget.as_secs(),
                crate::child::last_words(&done.stderr)
            ));
            continue;
        }
        match std::fs::read(&result)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        {
            Some(v) => out.push(v),
            None => failures.push(format!(
                "rank {rank} ended without a result: {}",
                crate::child::last_words(&format!("{}{}", done.stdout, done.stderr))
            )),
        }
    }
    if failures.is_empty() {
        Ok(out)
    } else {
        Err(failures.join("; "))
    }
}

/// The record of what rank 0's start-up read, as the script took it: the steps that ran
/// (import torch; CUDA init, a bf16 GEMM, a cuDNN convolution and an NCCL all-reduce where
/// they succeeded) and the files under site-packages in first-touch order.
pub fn startup_record(first: &Value) -> Result<StartupRecord, String> {
    let taken = &first["startup"];
    if taken.is_null() {
        return Err("the framework script returned no record".into());
    }
    let torch = first["torch"]
        .as_str()
        .ok_or_else(|| format!("torch did not import: {}", first["errors"]["import"]))?;
    let names = [
        ("torch", "import torch"),
        ("device_count", "cuda init"),
        ("gemm", "bf16 gemm"),
        ("conv_rel_error", "cudnn conv"),
        ("allreduce", "nccl all-reduce"),
    ];
    let ran: Vec<&str> = taken["steps"]
        .as_array()
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let files: Vec<FileRead> = serde_json::from_value(taken["files"].clone())
        .map_err(|e| format!("the framework script's record is malformed: {e}"))?;
    Ok(StartupRecord {
        format: crate::startup::FORMAT.into(),
        torch: torch.into(),
        python: first["python_version"].as_str().unwrap_or_default().into(),
        steps: names
            .iter()
            .filter(|(key, _)| ran.contains(key))
            .map(|(_, name)| name.to_string())
            .collect(),
        gpu: first["device_name"].as_str().map(str::to_string),
        files,
    })
}

/// What the probe measured itself, to set the framework's figures beside.
#[derive(Default)]
pub struct Measured<'a> {
    /// The libnccl.so.2 the compatibility phase loaded, and its version.
    pub nccl: Option<(&'a str, &'a str)>,
    /// The best bundled-kernel and NCCL bus bandwidths per size, GB/s (the all-reduce fact).
    pub allreduce: Option<&'a Value>,
    /// The bf16 GEMM floor for this GPU model, TFLOP/s, and where it comes from.
    pub gemm_floor: Option<(f64, &'a str)>,
    /// Where a plain `dlopen(soname)` lands on this node, and by which step of the loader's
    /// search (`links::plain_search` over `/` with the ranks' environment): what names the
    /// step that chose a copy other than the wheel's.
    pub loader: Option<&'a LoaderSearch>,
}

/// Where a plain `dlopen(soname)` lands: the real path and the name of the search step.
pub type LoaderSearch = dyn Fn(&str) -> Option<(String, &'static str)>;

/// The loader's plain search on this node's root, with this process's environment (which
/// the ranks inherit), for [`Measured::loader`].
pub fn loader_here(soname: &str) -> Option<(String, &'static str)> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    crate::image::links::plain_search(Path::new("/"), &env, soname)
        .ok()
        .flatten()
        .map(|(real, via)| (real, via.describe()))
}

const PHASE: &str = "framework";

/// Puts the framework's checks into the report.
pub fn judge(
    ranks: &[Value],
    gpu: bool,
    lock: Option<&Lock>,
    measured: &Measured,
    report: &mut Report,
) {
    let Some(first) = ranks.first() else {
        return;
    };
    report.fact("framework", json!(ranks));
    let python = first["python"].as_str().unwrap_or("python");
    if let Some(e) = first["errors"]["import"].as_str() {
        report.push(
            PHASE,
            "torch",
            Status::Skip,
            format!("{python} cannot import torch ({e}): no PyTorch stack to check"),
        );
        return;
    }
    versions(first, lock, report);
    if !gpu {
        report.push(
            PHASE,
            "CUDA from torch",
            Status::Skip,
            format!(
                "torch {} is there; no GPU to run it on",
                first["torch"].as_str().unwrap_or("?")
            ),
        );
        return;
    }
    if let Some(e) = first["errors"]["cuda_init"].as_str() {
        report.push(
            PHASE,
            "CUDA from torch",
            Status::Fail,
            format!(
                "torch {} cannot initialise CUDA: {e}",
                first["torch"].as_str().unwrap_or("?")
            ),
        );
        libraries(first, lock, measured, report);
        return;
    }
    arch_coverage(first, report);
    compute(ranks, measured, report);
    allreduce(ranks, measured, report);
    libraries(first, lock, measured, report);
}

fn versions(first: &Value, lock: Option<&Lock>, report: &mut Report) {
    let torch = first["torch"].as_str().unwrap_or("?");
    let cuda = first["cuda"].as_str().unwrap_or("none");
    let (status, detail) = match lock {
        Some(l) => {
            let want = format!("{}+{}", l.torch.version, l.torch.variant);
            let cuda_ok = cuda.starts_with(&format!(
                "{}.{}",
                l.cuda.version.major(),
                l.cuda.version.minor()
            ));
            if torch != want && torch != l.torch.version.to_string() {
                (
                    Status::Fail,
                    format!("torch {torch}, but the lock pins {want}"),
                )
            } else if !cuda_ok {
                (
                    Status::Fail,
                    format!(
                        "torch {torch} is built for CUDA {cuda}, the lock pins {}",
                        l.cuda.version
                    ),
                )
            } else {
                (
                    Status::Pass,
                    format!("torch {torch} (CUDA {cuda}), as pinned"),
                )
            }
        }
        None => (
            Status::Pass,
            format!("torch {torch} (CUDA {cuda}); no lock to hold it to"),
        ),
    };
    report.push(PHASE, "torch", status, detail);
    if let (Some(v), Some(l)) = (
        first["cudnn"].as_i64(),
        lock.and_then(|l| l.cudnn.version.as_ref()),
    ) {
        // cuDNN 9 reports major*10000 + minor*100 + patch (91900 is 9.19.0).
        let have = format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
        let ok = have
            .parse::<crate::version::Version>()
            .is_ok_and(|h| h.major() == l.major() && h.minor() == l.minor());
        report.push(
            PHASE,
            "cuDNN from torch",
            if ok { Status::Pass } else { Status::Fail },
            format!("torch uses cuDNN {have}; the lock pins {l}"),
        );
    }
}

/// Whether torch carries machine code for the GPU (sm_XY of the same major, minor at most the
/// GPU's) or PTX it can compile (compute_XY at most the GPU's).
pub fn covers(arch_list: &[&str], capability: (u32, u32)) -> Option<String> {
    let (major, minor) = capability;
    arch_list.iter().find_map(|a| {
        let (kind, digits) = a.split_once('_')?;
        let n: u32 = digits.trim_end_matches(['a', 'f']).parse().ok()?;
        let (m, n) = (n / 10, n % 10);
        match kind {
            "sm" if m == major && n <= minor => Some(format!("machine code {a}")),
            "compute" if (m, n) <= (major, minor) => Some(format!("PTX {a}, compiled at load")),
            _ => None,
        }
    })
}

fn arch_coverage(first: &Value, report: &mut Report) {
    let archs: Vec<&str> = first["arch_list"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let cap = first["capability"].as_array().map(|c| {
        (
            c.first().and_then(Value::as_u64).unwrap_or(0) as u32,
            c.get(1).and_then(Value::as_u64).unwrap_or(0) as u32,
        )
    });
    let Some(cap) = cap else { return };
    let name = first["device_name"].as_str().unwrap_or("the GPU");
    match covers(&archs, cap) {
        Some(how) => report.push(
            PHASE,
            "GPU architecture in torch",
            Status::Pass,
            format!("{name} is sm_{}{}: torch has {how}", cap.0, cap.1),
        ),
        None => report.push(
            PHASE,
            "GPU architecture in torch",
            Status::Fail,
            format!(
                "{name} is sm_{}{}, and torch was built for {} only: every kernel fails with \
                 \"no kernel image is available for execution\"; use a torch build that lists it",
                cap.0,
                cap.1,
                archs.join(", ")
            ),
        ),
    }
}

fn compute(ranks: &[Value], measured: &Measured, report: &mut Report) {
    for r in ranks {
        let rank = r["rank"].as_u64().unwrap_or(0);
        let on = format!(
            "rank {rank} ({})",
            r["device_name"].as_str().unwrap_or("GPU")
        );
        match (r["errors"]["gemm"].as_str(), r["gemm_rel_error"].as_f64(), r["gemm"]["tflops"].as_f64()) {
            (Some(e), _, _) => report.push(PHASE, format!("bf16 GEMM, {on}"), Status::Fail, e),
            (None, Some(err), _) if err > GEMM_TOLERANCE => report.push(
                PHASE,
                format!("bf16 GEMM, {on}"),
                Status::Fail,
                format!("wrong: relative error {err:.2e} against the CPU reference (tolerance {GEMM_TOLERANCE:.0e})"),
            ),
            (None, Some(err), Some(tflops)) => {
                let (status, floor) = match measured.gemm_floor {
                    Some((f, _)) if tflops < f => (Status::Fail, format!(", below the floor of {f:.0}")),
                    Some((f, from)) => (Status::Pass, format!(", floor {f:.0} ({from})")),
                    None => (Status::Pass, ", no floor for this model in the policy".to_string()),
                };
                report.push(
                    PHASE,
                    format!("bf16 GEMM, {on}"),
                    status,
                    format!(
                        "{tflops:.0} TFLOP/s at {n}x{n}{floor}; right against the CPU reference (relative error {err:.1e})",
                        n = r["gemm"]["n"].as_u64().unwrap_or(0)
                    ),
                );
            }
            _ => report.push(PHASE, format!("bf16 GEMM, {on}"), Status::Fail, "no measurement"),
        }
        let conv = match (r["errors"]["conv"].as_str(), r["conv_rel_error"].as_f64()) {
            (Some(e), _) => (Status::Fail, e.to_string()),
            (None, Some(err)) if err > CONV_TOLERANCE => (
                Status::Fail,
                format!("wrong: relative error {err:.2e} against the CPU reference"),
            ),
            (None, Some(err)) if r["cudnn_enabled"].as_bool() == Some(true) => (
                Status::Pass,
                format!("right against the CPU reference (relative error {err:.1e})"),
            ),
            (None, Some(_)) => (Status::Fail, "cuDNN is not available to torch".to_string()),
            _ => (Status::Fail, "no measurement".to_string()),
        };
        report.push(PHASE, format!("cuDNN convolution, {on}"), conv.0, conv.1);
    }
}

/// The best bus bandwidth the probe's own all-reduce measured at `bytes`: (bundled, NCCL).
fn probe_busbw(allreduce: &Value, bytes: u64) -> (Option<f64>, Option<f64>) {
    let rows = allreduce["rows"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let best = |nccl: bool| {
        rows.iter()
            .filter(|r| r["bytes"].as_u64() == Some(bytes) && r["dtype"] == "f32")
            .filter(|r| (r["algo"] == "nccl") == nccl)
            .filter_map(|r| r["busbw"].as_f64())
            .reduce(f64::max)
    };
    (best(false), best(true))
}

fn allreduce(ranks: &[Value], measured: &Measured, report: &mut Report) {
    let first = &ranks[0];
    let world = first["world_size"].as_u64().unwrap_or(1);
    if let Some(e) = ranks.iter().find_map(|r| r["errors"]["allreduce"].as_str()) {
        report.push(PHASE, "torch.distributed all-reduce", Status::Fail, e);
        return;
    }
    let (sum, want) = (
        first["allreduce_sum"].as_f64(),
        first["allreduce_expected"].as_f64(),
    );
    if sum.is_none() || sum != want {
        report.push(
            PHASE,
            "torch.distributed all-reduce",
            Status::Fail,
            format!("{world} ranks summed to {sum:?}, not {want:?}"),
        );
        return;
    }
    let rows: Vec<String> = first["allreduce"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| {
            let bytes = r["bytes"].as_u64().unwrap_or(0);
            let beside = measured
                .allreduce
                .map(|a| probe_busbw(a, bytes))
                .map(|(k, n)| {
                    format!(
                        " (the bundled kernel {}, libnccl {})",
                        k.map_or("not run".into(), |v| format!("{v:.0}")),
                        n.map_or("not run".into(), |v| format!("{v:.0}"))
                    )
                })
                .unwrap_or_default();
            if world > 1 {
                format!(
                    "{}: busbw {:.0} GB/s{beside}",
                    crate::units::human_size(bytes),
                    r["busbw"].as_f64().unwrap_or(0.0)
                )
            } else {
                format!(
                    "{}: {:.1} us",
                    crate::units::human_size(bytes),
                    r["seconds"].as_f64().unwrap_or(0.0) * 1e6
                )
            }
        })
        .collect();
    let what = if world > 1 {
        format!("{world} ranks, one per GPU, right sum")
    } else {
        "one rank: ProcessGroupNCCL initialises and reduces (one rank moves no bytes between GPUs, so no bus bandwidth)".to_string()
    };
    report.push(
        PHASE,
        "torch.distributed all-reduce",
        Status::Pass,
        format!("{what}; {}", rows.join(", ")),
    );
}

/// A mapped library's version: what the library itself reports (ncclGetVersion, cudnnGetVersion,
/// cudaRuntimeGetVersion, cuDriverGetVersion), beside its file's where that says more than the
/// soname's major (the driver's libcuda.so.580.159.04).
fn version_of(m: &Value) -> String {
    let name = m["path"]
        .as_str()
        .unwrap_or("")
        .rsplit('/')
        .next()
        .unwrap_or("");
    let file = m["file_version"].as_str().filter(|v| v.contains('.'));
    let reports = m["reports"].as_i64().map(|v| {
        if name.starts_with("libcuda.so") || name.starts_with("libcudart.so") {
            // CUDA's own encoding: major * 1000 + minor * 10.
            format!("CUDA {}.{}", v / 1000, v % 1000 / 10)
        } else {
            // NCCL's and cuDNN 9's: major * 10000 + minor * 100 + patch.
            format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
        }
    });
    match (file, reports) {
        (Some(f), Some(r)) => format!("{f}, {r}"),
        (Some(f), None) => f.to_string(),
        (None, Some(r)) => r,
        (None, None) => m["file_version"]
            .as_str()
            .map_or("version unknown".into(), |v| format!("soname version {v}")),
    }
}

/// The shared libraries the image's wheels installed (the interpreter's own site-packages, as
/// the rank listed them), by the soname each is loaded by: a wheel holds no symbolic links,
/// so its file is named as ld.so looks it up (`libcublas.so.13`). Python's extension modules
/// are left out: the importer opens them by path, never by name.
fn wheel_sonames(first: &Value) -> BTreeMap<String, Vec<String>> {
    let mut provided: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for path in first["wheel_libraries"]["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|p| !is_extension_module(file_name(p)))
    {
        provided
            .entry(file_name(path).to_string())
            .or_default()
            .push(path.to_string());
    }
    provided
}

/// Whether `name` carries one of the suffixes CPython's importer gives extension modules
/// (`.cpython-312-x86_64-linux-gnu.so`, `.abi3.so`; PyPy's `.pypy…so`).
fn is_extension_module(name: &str) -> bool {
    [".cpython-", ".abi3.so", ".pypy"]
        .iter()
        .any(|s| name.contains(s))
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The soname among `provided` that a mapped file answers to: its own name, or the name with
/// the version ld.so ignores cut off (`libnvJitLink.so.12.4.127` is `libnvJitLink.so.12`).
fn provided_soname<'a>(name: &str, provided: &'a BTreeMap<String, Vec<String>>) -> Option<&'a str> {
    if let Some((soname, _)) = provided.get_key_value(name) {
        return Some(soname);
    }
    provided
        .keys()
        .filter(|s| s.contains(".so") && name.len() > s.len())
        .filter(|s| name.starts_with(s.as_str()) && name[s.len()..].starts_with('.'))
        .max_by_key(|s| s.len())
        .map(String::as_str)
}

/// Every library the process mapped whose soname one of the image's wheels provides is held
/// to that wheel's copy ([`wheel_copies`]); then whether torch's NCCL is the one the lock pins
/// and the probe measured.
fn libraries(first: &Value, lock: Option<&Lock>, measured: &Measured, report: &mut Report) {
    let maps = first["maps"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let (status, detail) = wheel_copies(first, maps, measured);
    report.push(PHASE, "libraries torch mapped", status, detail);
    torch_nccl(first, maps, lock, measured, report);
}

/// A library mapped from another copy than the wheel's fails, naming both copies and the
/// step of the loader's search that chose the other. The CUDA family (the wheels' `nvidia/`
/// tree and the driver's libraries) is listed with versions.
fn wheel_copies(first: &Value, maps: &[Value], measured: &Measured) -> (Status, String) {
    if !first["wheel_libraries"]["files"].is_array() {
        return (
            Status::Fail,
            "the rank listed no site-packages, so the copies torch bound cannot be held to \
             the image's wheels"
                .into(),
        );
    }
    let provided = wheel_sonames(first);
    let mut listed = Vec::new();
    let mut from_wheels = 0;
    let mut foreign = Vec::new();
    for m in maps {
        let path = m["path"].as_str().unwrap_or("?");
        let real = m["real"].as_str().unwrap_or(path);
        let name = file_name(real);
        let soname = provided_soname(name, &provided);
        if let Some(soname) = soname {
            let copies = &provided[soname];
            if copies.iter().any(|c| c == real || c == path) {
                from_wheels += 1;
            } else {
                foreign.push(format!(
                    "{soname} is mapped from {real}, not from the image's wheel ({}): {}",
                    copies.join(", "),
                    search_step(soname, real, measured)
                ));
            }
        }
        let watched = WATCHED.iter().any(|w| name.starts_with(w));
        if watched || (soname.is_some() && real.contains("/nvidia/")) {
            listed.push(format!("{path} ({})", version_of(m)));
        }
    }
    listed.sort();
    listed.dedup();
    if !foreign.is_empty() {
        (Status::Fail, foreign.join("; "))
    } else if listed.is_empty() {
        (
            Status::Warn,
            "none of libcuda, libcudart, cuBLAS, cuDNN, libnccl, NVRTC is mapped".into(),
        )
    } else {
        (
            Status::Pass,
            format!(
                "{}; {from_wheels} libraries of the image's wheels mapped, each from the \
                 wheel's copy",
                listed.join(", ")
            ),
        )
    }
}

/// Which step of the loader's search chose `real` for `soname`, as far as a plain dlopen on
/// this node tells: the step that finds it, or that none does (so the asking object's own
/// search path, or a path, named it).
fn search_step(soname: &str, real: &str, measured: &Measured) -> String {
    match measured.loader.and_then(|search| search(soname)) {
        Some((found, via)) if found == real => {
            format!("a plain dlopen of {soname} finds it through {via}")
        }
        Some((found, via)) => format!(
            "a plain dlopen of {soname} finds {found} through {via}, so the asking object's \
             DT_RUNPATH or DT_RPATH, or a path, chose this one"
        ),
        None => format!(
            "a plain dlopen of {soname} finds no copy, so the asking object's DT_RUNPATH or \
             DT_RPATH, or a path, chose this one"
        ),
    }
}

/// Whether torch's NCCL is the one the lock pins and the probe measured.
fn torch_nccl(
    first: &Value,
    maps: &[Value],
    lock: Option<&Lock>,
    measured: &Measured,
    report: &mut Report,
) {
    let Some(torch_nccl) = first["nccl"].as_str() else {
        return;
    };
    let mapped_nccl = maps
        .iter()
        .find(|m| m["path"].as_str().is_some_and(|p| p.contains("libnccl.so")))
        .and_then(|m| m["path"].as_str());
    let mut problems = Vec::new();
    if let Some(pin) = lock.and_then(|l| l.nccl.version.as_ref())
        && torch_nccl.parse::<crate::version::Version>().ok().as_ref() != Some(pin)
    {
        problems.push(format!("the lock pins {pin}"));
    }
    if let Some((path, version)) = measured.nccl {
        if version != torch_nccl {
            problems.push(format!("the probe measured {path} ({version})"));
        } else if let Some(m) = mapped_nccl
            && std::fs::canonicalize(m).ok() != std::fs::canonicalize(path).ok()
        {
            problems.push(format!("the probe measured another copy, {path}"));
        }
    }
    report.push(
        PHASE,
        "torch's NCCL",
        if problems.is_empty() {
            Status::Pass
        } else {
            Status::Fail
        },
        format!(
            "torch binds NCCL {torch_nccl} from {}{}",
            mapped_nccl.unwrap_or("an unmapped library"),
            if problems.is_empty() {
                String::new()
            } else {
                format!(", but {}", problems.join(" and "))
            }
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The framework phase as it ran on an H200 with the machine's torch 2.11
    /// (benches/h200-framework.sh; benches/results/probe-framework-h200-2026-12-01.json),
    /// judged again from its raw rank results.
    fn recorded() -> (Vec<Value>, Value) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("benches/results/probe-framework-h200-2026-12-01.json");
        let probe: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let ranks = probe["facts"]["framework"].as_array().unwrap().clone();
        (ranks, probe["facts"]["nccl"][0].clone())
    }

    fn judged(ranks: &[Value], measured: &Measured) -> Report {
        let mut report = Report::default();
        judge(ranks, true, None, measured, &mut report);
        report
    }

    fn detail<'a>(report: &'a Report, name: &str) -> (&'a Status, &'a str) {
        let c = report
            .checks
            .iter()
            .find(|c| c.name.starts_with(name))
            .unwrap_or_else(|| panic!("no check {name}"));
        (&c.status, c.detail.as_str())
    }

    #[test]
    fn the_h200_run_passes_and_names_the_copies_torch_bound() {
        let (ranks, nccl) = recorded();
        let measured = Measured {
            nccl: Some((
                nccl["path"].as_str().unwrap(),
                nccl["version"].as_str().unwrap(),
            )),
            allreduce: None,
            gemm_floor: Some((600.0, "H200 SXM")),
            loader: None,
        };
        let report = judged(&ranks, &measured);
        // This run predates the rank's listing of its site-packages: every check passes but
        // the one that holds the mapped copies to the wheels, which cannot judge without it.
        assert!(
            report
                .checks
                .iter()
                .all(|c| c.status == Status::Pass || c.name == "libraries torch mapped"),
            "{:?}",
            report.checks
        );
        let (status, text) = detail(&report, "libraries torch mapped");
        assert_eq!(*status, Status::Fail, "{text}");
        assert!(text.contains("listed no site-packages"), "{text}");
        let mut listing = ranks.clone();
        listing[0]["wheel_libraries"] = json!({"files": []});
        let report = judged(&listing, &measured);
        let (_, libs) = detail(&report, "libraries torch mapped");
        assert!(
            libs.contains("nvidia/nccl/lib/libnccl.so.2 (2.28.9)"),
            "{libs}"
        );
        assert!(libs.contains("nvidia/cu13/lib/libcublasLt.so.13"), "{libs}");
        assert!(
            libs.contains("libcuda.so.580.159.04 (580.159.04, CUDA 13.0)"),
            "{libs}"
        );
        assert!(
            libs.contains("nvidia/cudnn/lib/libcudnn.so.9 (9.19.0)"),
            "{libs}"
        );
        assert!(!libs.contains("/usr/local/cuda/"), "{libs}");
        let (_, gemm) = detail(&report, "bf16 GEMM");
        assert!(gemm.contains("786 TFLOP/s at 8192x8192"), "{gemm}");
    }

    #[test]
    fn the_same_run_fails_where_the_node_or_image_would() {
        let (ranks, _) = recorded();
        // The probe measured another libnccl than the one torch binds.
        let other = Measured {
            nccl: Some(("/usr/lib/x86_64-linux-gnu/libnccl.so.2", "2.27.5")),
            gemm_floor: Some((900.0, "a stricter floor")),
            ..Measured::default()
        };
        let report = judged(&ranks, &other);
        let (status, text) = detail(&report, "torch's NCCL");
        assert_eq!(*status, Status::Fail, "{text}");
        assert!(
            text.contains("the probe measured /usr/lib/x86_64-linux-gnu/libnccl.so.2 (2.27.5)"),
            "{text}"
        );
        let (status, text) = detail(&report, "bf16 GEMM");
        assert_eq!(*status, Status::Fail, "{text}");
        // A torch built without the GPU's architecture.
        let mut old = ranks.clone();
        old[0]["arch_list"] = json!(["sm_70", "sm_80"]);
        let report = judged(&old, &Measured::default());
        let (status, text) = detail(&report, "GPU architecture");
        assert_eq!(*status, Status::Fail, "{text}");
        assert!(text.contains("no kernel image is available"), "{text}");
        // CUDA that does not start: CUDA's own words.
        let mut broken = ranks.clone();
        broken[0]["errors"] =
            json!({"cuda_init": "RuntimeError: CUDA driver initialization failed"});
        let report = judged(&broken, &Measured::default());
        let (status, text) = detail(&report, "CUDA from torch");
        assert_eq!(*status, Status::Fail, "{text}");
        assert!(text.contains("CUDA driver initialization failed"), "{text}");
    }

    /// The framework script as it ran on the H200 with the listing of the venv's shared
    /// objects (benches/h200-loads.sh; benches/results/loads-h200-2026-12-04/).
    fn with_listing() -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("benches/results/loads-h200-2026-12-04/rank-default-h200-2026-12-04.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    const SITE: &str = "/opt/torch/.venv/lib/python3.12/site-packages";

    fn mapped_libraries(rank: &Value, loader: Option<&LoaderSearch>) -> (Status, String) {
        let maps = rank["maps"].as_array().unwrap();
        let measured = Measured {
            loader,
            ..Measured::default()
        };
        wheel_copies(rank, maps, &measured)
    }

    #[test]
    fn every_cuda_library_torch_maps_is_held_to_its_wheel() {
        let rank = with_listing();
        let (status, text) = mapped_libraries(&rank, None);
        assert_eq!(status, Status::Pass, "{text}");
        // The CUDA-family libraries the process mapped, the ones an older listing left
        // out among them, each from the wheel's copy; the driver's from the driver.
        for lib in [
            "cu13/lib/libcublas.so.13",
            "cu13/lib/libcublasLt.so.13",
            "cu13/lib/libcudart.so.13",
            "cu13/lib/libcufft.so.12",
            "cu13/lib/libcurand.so.10",
            "cu13/lib/libcusolver.so.12",
            "cu13/lib/libcusparse.so.12",
            "cu13/lib/libnvJitLink.so.13",
            "cu13/lib/libnvrtc-builtins.so.13.0",
            "cu13/lib/libcupti.so.13",
            "cusparselt/lib/libcusparseLt.so.0",
            "nvshmem/lib/libnvshmem_host.so.3",
            "nccl/lib/libnccl.so.2 (2.28.9)",
            "cudnn/lib/libcudnn.so.9 (9.19.0)",
        ] {
            assert!(
                text.contains(&format!("{SITE}/nvidia/{lib}")),
                "{lib}: {text}"
            );
        }
        assert!(
            text.contains("/usr/local/nvidia/lib64/libcuda.so.580.159.04 (580.159.04, CUDA 13.0)"),
            "{text}"
        );
        assert!(
            text.contains("33 libraries of the image's wheels mapped, each from the wheel's copy"),
            "{text}"
        );
    }

    /// Every class of copy the loader can bind for a soname a wheel provides: the wheel's,
    /// another found by the plain search (LD_LIBRARY_PATH), another the plain search does not
    /// find first, one it does not find at all, a versioned file name (the soname's file is
    /// a link to it), and two copies of one soname at once; a library no wheel provides is
    /// not judged.
    #[test]
    fn a_library_mapped_from_another_copy_than_the_wheels_fails_naming_both() {
        let rank = with_listing();
        let wheel_jitlink = format!("{SITE}/nvidia/cu13/lib/libnvJitLink.so.13");
        let other = "/usr/local/cuda-13.0/lib64/libnvJitLink.so.13.0.88";
        let mut moved = rank.clone();
        for m in moved["maps"].as_array_mut().unwrap() {
            if m["path"] == wheel_jitlink.as_str() {
                m["path"] = json!("/usr/local/cuda/lib64/libnvJitLink.so.13");
                m["real"] = json!(other);
            }
        }
        let through_ld_library_path =
            |s: &str| (s == "libnvJitLink.so.13").then(|| (other.to_string(), "LD_LIBRARY_PATH"));
        let (status, text) = mapped_libraries(&moved, Some(&through_ld_library_path));
        assert_eq!(status, Status::Fail, "{text}");
        assert!(
            text.contains(&format!(
                "libnvJitLink.so.13 is mapped from {other}, not from the image's wheel \
                 ({wheel_jitlink}): a plain dlopen of libnvJitLink.so.13 finds it through \
                 LD_LIBRARY_PATH"
            )),
            "{text}"
        );
        let elsewhere = |_: &str| {
            Some((
                "/usr/lib/x86_64-linux-gnu/libnvJitLink.so.13".to_string(),
                "/etc/ld.so.cache",
            ))
        };
        let (_, text) = mapped_libraries(&moved, Some(&elsewhere));
        assert!(
            text.contains("finds /usr/lib/x86_64-linux-gnu/libnvJitLink.so.13 through /etc/ld.so.cache, so the asking object's DT_RUNPATH or DT_RPATH, or a path, chose this one"),
            "{text}"
        );
        let (_, text) = mapped_libraries(&moved, Some(&|_: &str| None));
        assert!(text.contains("finds no copy"), "{text}");

        // A second NCCL beside the wheel's, from the system.
        let mut two = rank.clone();
        two["maps"].as_array_mut().unwrap().push(json!({
            "path": "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
            "real": "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3",
        }));
        let (status, text) = mapped_libraries(&two, None);
        assert_eq!(status, Status::Fail, "{text}");
        assert!(
            text.contains("libnccl.so.2 is mapped from /usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3, not from the image's wheel"),
            "{text}"
        );
        assert!(!text.contains("libnvJitLink"), "{text}");

        // The system's libraries that no wheel provides are not judged.
        let mut system = rank.clone();
        system["maps"].as_array_mut().unwrap().push(json!({
            "path": "/usr/lib/x86_64-linux-gnu/libz.so.1",
            "real": "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13",
        }));
        assert_eq!(mapped_libraries(&system, None).0, Status::Pass);
    }

    #[test]
    fn a_versioned_file_answers_to_the_soname_ld_so_looks_up() {
        let provided: BTreeMap<String, Vec<String>> = [
            ("libnvJitLink.so.12", "/a/libnvJitLink.so.12"),
            ("libcudnn.so.9", "/a/libcudnn.so.9"),
            ("libcudnn_graph.so.9", "/a/libcudnn_graph.so.9"),
            ("libnvrtc-builtins.so.13.0", "/a/libnvrtc-builtins.so.13.0"),
            ("libtorch.so", "/a/libtorch.so"),
        ]
        .into_iter()
        .map(|(s, p)| (s.to_string(), vec![p.to_string()]))
        .collect();
        for (name, want) in [
            ("libnvJitLink.so.12", Some("libnvJitLink.so.12")),
            ("libnvJitLink.so.12.4.127", Some("libnvJitLink.so.12")),
            ("libnvJitLink.so.13", None),
            ("libnvJitLink.so.120", None),
            ("libcudnn_graph.so.9.1.0", Some("libcudnn_graph.so.9")),
            (
                "libnvrtc-builtins.so.13.0.88",
                Some("libnvrtc-builtins.so.13.0"),
            ),
            ("libnvrtc.so.13", None),
            ("libtorch.so.2", Some("libtorch.so")),
            ("libtorch_cpu.so", None),
        ] {
            assert_eq!(provided_soname(name, &provided), want, "{name}");
        }
    }

    #[test]
    fn arch_coverage_follows_cuda_s_compatibility() {
        let h200 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"];
        assert!(covers(&h200, (9, 0)).unwrap().contains("sm_90"));
        // sm_80 machine code runs on 8.6 and 8.9, not on 9.0.
        assert!(covers(&["sm_80"], (8, 9)).is_some());
        assert!(covers(&["sm_80", "sm_86"], (9, 0)).is_none());
        assert!(covers(&["sm_86"], (8, 0)).is_none());
        // PTX of an older architecture compiles for a newer one.
        assert!(
            covers(&["sm_80", "compute_80"], (9, 0))
                .unwrap()
                .contains("PTX")
        );
        assert!(covers(&["compute_90"], (8, 0)).is_none());
        assert!(covers(&["sm_90a"], (9, 0)).is_some());
    }
}
