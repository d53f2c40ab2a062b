//! What fleets read from a probe: node_exporter's textfile format (`--emit prometheus:FILE`)
//! and Node Feature Discovery's features.d (`--emit nfd:FILE`), each written atomically.
//!
//! Both files are replaced through a temporary file beside them (`crate::fsutil::write_atomic`,
//! whose temporary name starts with `.gpubake-` and has no suffix): node_exporter reads only
//! names ending in `.prom` and nfd-worker skips names starting with a dot, so neither ever
//! sees a half-written file.

use super::report::{Report, Status};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One `--emit KIND:FILE`.
#[derive(Clone, Debug, PartialEq)]
pub enum Emit {
    /// node_exporter's textfile collector.
    Prometheus(PathBuf),
    /// Node Feature Discovery's local feature file.
    Nfd(PathBuf),
}

impl std::str::FromStr for Emit {
    type Err = String;
    /// Refuses here, before the probe runs, a file name its reader would never read: finding
    /// that out after a burn of ten minutes, or never (the reader skips it silently), is worse.
    fn from_str(s: &str) -> Result<Emit, String> {
        match s.split_once(':') {
            Some(("prometheus", f)) if !f.is_empty() => {
                let name = file_name(f)?;
                if !name.ends_with(".prom") {
                    return Err(format!(
                        "`{f}`: node_exporter's textfile collector reads only files whose name \
                         ends in `.prom`; name it `{name}.prom` or another `*.prom`"
                    ));
                }
                Ok(Emit::Prometheus(f.into()))
            }
            Some(("nfd", f)) if !f.is_empty() => {
                let name = file_name(f)?;
                if name.starts_with('.') {
                    return Err(format!(
                        "`{f}`: nfd-worker skips feature files whose name starts with a dot; \
                         name it `{}`",
                        name.trim_start_matches('.')
                    ));
                }
                Ok(Emit::Nfd(f.into()))
            }
            _ => Err(format!("`{s}`: expected prometheus:FILE or nfd:FILE")),
        }
    }
}

/// The last component of `f`, which must name a file rather than a directory.
fn file_name(f: &str) -> Result<String, String> {
    match Path::new(f).file_name() {
        Some(name) if !f.ends_with('/') => Ok(name.to_string_lossy().into_owned()),
        _ => Err(format!("`{f}` names a directory, not a file")),
    }
}

impl std::fmt::Display for Emit {
    /// As given on the command line: `--emit prometheus:FILE`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Emit::Prometheus(path) => write!(f, "--emit prometheus:{}", path.display()),
            Emit::Nfd(path) => write!(f, "--emit nfd:{}", path.display()),
        }
    }
}

impl Emit {
    /// The file it writes.
    pub fn path(&self) -> &Path {
        match self {
            Emit::Prometheus(path) | Emit::Nfd(path) => path,
        }
    }
}

/// Writes `report` as `emit` asks.
pub fn write(report: &Report, emit: &Emit) -> crate::Result<()> {
    let now = SystemTime::now();
    match emit {
        Emit::Prometheus(path) => {
            crate::fsutil::write_atomic(path, prometheus(report, now).as_bytes())
        }
        Emit::Nfd(path) => crate::fsutil::write_atomic(path, nfd(report, now).as_bytes()),
    }
}

/// Seconds since the Unix epoch; 0 for a clock set before it.
fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------------
// What the report's facts say, each absent where the phase that records it did not run.

/// One GPU as the metrics label it: NVML index, UUID, model.
#[derive(Clone, Debug, Default, PartialEq)]
struct GpuId {
    index: u64,
    uuid: String,
    model: String,
}

impl GpuId {
    fn labels(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("gpu", self.index.to_string())];
        if !self.uuid.is_empty() {
            out.push(("uuid", self.uuid.clone()));
        }
        if !self.model.is_empty() {
            out.push(("model", self.model.clone()));
        }
        out
    }
}

/// The GPUs NVML opened (`facts["nvml"]["gpus"]`), in its order.
fn nvml_gpus(report: &Report) -> Vec<GpuId> {
    let Some(gpus) = report.facts.get("nvml").and_then(|n| n["gpus"].as_array()) else {
        return Vec::new();
    };
    gpus.iter()
        .filter_map(|g| {
            Some(GpuId {
                index: g["index"].as_u64()?,
                uuid: g["uuid"].as_str().unwrap_or_default().to_string(),
                model: g["name"].as_str().unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// The GPU of NVML index `index`: its UUID and model where NVML gave them.
fn gpu_by_index(gpus: &[GpuId], index: u64) -> GpuId {
    gpus.iter()
        .find(|g| g.index == index)
        .cloned()
        .unwrap_or(GpuId {
            index,
            ..GpuId::default()
        })
}

/// A non-empty string fact.
fn text(v: &Value) -> Option<String> {
    v.as_str()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().to_string())
}

/// A finite number: a NaN or an infinity is no measurement.
fn number(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

/// The driver version NVML gave.
fn driver(report: &Report) -> Option<String> {
    text(&report.facts.get("nvml")?["driver"])
}

/// The version of the libnccl.so.2 PyTorch would load: the first the compatibility phase
/// lists (`facts["nccl"]`, in load order), as `ncclGetVersion` or its file name says.
fn nccl_version(report: &Report) -> Option<String> {
    text(&report.facts.get("nccl")?.get(0)?["version"])
}

/// Each GPU's device-to-device copy bandwidth in GB/s (read plus write), by NVML GPU. The
/// worker numbers GPUs by CUDA ordinal, which need not be NVML's index (CUDA_DEVICE_ORDER,
/// CUDA_VISIBLE_DEVICES), so each is matched by PCI address as the cuda phase does; one that
/// cannot be matched is left out rather than guessed.
fn memory_bandwidth(report: &Report, gpus: &[GpuId]) -> Vec<(GpuId, f64)> {
    use super::cuda::normalise_bus_id;
    let (Some(cuda), Some(nvml)) = (report.facts.get("cuda"), report.facts.get("nvml")) else {
        return Vec::new();
    };
    let bus_of_ordinal = |ordinal: u64| {
        cuda["devices"].as_array()?.iter().find_map(|d| {
            (d["cuda_ordinal"].as_u64() == Some(ordinal))
                .then(|| normalise_bus_id(d["pci_bus_id"].as_str()?))
                .flatten()
        })
    };
    let index_of_bus = |bus: &str| {
        nvml["gpus"].as_array()?.iter().find_map(|g| {
            let id = normalise_bus_id(g["pci_bus_id"].as_str()?)?;
            (id == bus).then(|| g["index"].as_u64()).flatten()
        })
    };
    let mut out = Vec::new();
    for m in cuda["memory"].as_array().into_iter().flatten() {
        let found = m["gpu"]
            .as_u64()
            .and_then(bus_of_ordinal)
            .and_then(|bus| index_of_bus(&bus));
        if let (Some(index), Some(gbps)) = (found, number(&m["gbps"])) {
            out.push((gpu_by_index(gpus, index), gbps));
        }
    }
    out
}

/// The all-reduce bus bandwidth in GB/s that the `all-reduce busbw` check judges: the bundled
/// kernel's float32 two-shot at its largest size. None where that size stays in the GPUs'
/// caches, or where the ranks shared one GPU (one GPU runs four ranks on itself, which
/// measures its memory, not a link between GPUs).
fn allreduce_busbw(report: &Report) -> Option<f64> {
    let v = report.facts.get("allreduce")?;
    let row = v["rows"]
        .as_array()?
        .iter()
        .filter(|r| r["dtype"] == "f32" && r["algo"] == "two-shot")
        .max_by_key(|r| r["bytes"].as_u64().unwrap_or(0))?;
    if row["bytes"].as_u64()? < super::judge::SMALLEST_BANDWIDTH_SIZE {
        return None;
    }
    let ranks = row["ranks"].as_u64()?;
    let devices = match v["devices"].as_array() {
        Some(d) => d.len() as u64,
        None => nvml_gpus(report).len() as u64,
    };
    if ranks < 2 || ranks != devices {
        return None;
    }
    number(&row["busbw"]).filter(|b| *b > 0.0)
}

/// One GPU's burn (`facts["burn"]`, level 3).
struct Burn {
    gpu: GpuId,
    tflops_median: Option<f64>,
    tflops_min: Option<f64>,
    sm_mhz_median: Option<f64>,
    sm_mhz_min: Option<f64>,
    power_w_max: Option<f64>,
    temperature_c_max: Option<f64>,
    /// ECC errors counted during the burn, (corrected, uncorrected): after less before.
    ecc_during: (Option<f64>, Option<f64>),
    /// Rows remapped for uncorrectable errors, read after the burn.
    remapped_rows: Option<f64>,
    /// The throttle reasons NVML reported in any read.
    throttle: Vec<String>,
}

fn burns(report: &Report, gpus: &[GpuId]) -> Vec<Burn> {
    let Some(list) = report.facts.get("burn").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|b| {
            let index = b["index"].as_u64()?;
            let known = gpu_by_index(gpus, index);
            let gpu = GpuId {
                index,
                uuid: text(&b["uuid"]).unwrap_or(known.uuid),
                model: text(&b["name"]).unwrap_or(known.model),
            };
            Some(Burn {
                gpu,
                tflops_median: number(&b["tflops_median"]),
                tflops_min: number(&b["tflops_min"]),
                sm_mhz_median: number(&b["sm_mhz_median"]),
                sm_mhz_min: number(&b["sm_mhz_min"]),
                power_w_max: number(&b["power_w_max"]),
                temperature_c_max: number(&b["temperature_c_max"]),
                ecc_during: (moved(b, "ecc_corrected"), moved(b, "ecc_uncorrected")),
                remapped_rows: number(&b["counters_after"]["rows_uncorrectable"]),
                throttle: b["throttle"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r.as_str().map(String::from))
                    .collect(),
            })
        })
        .collect()
}

/// How far the counter `name` moved during a burn; None where either read is missing.
fn moved(burn: &Value, name: &str) -> Option<f64> {
    let before = number(&burn["counters_before"][name])?;
    let after = number(&burn["counters_after"][name])?;
    Some(after - before)
}

/// The NVML index a check is about: checks about one GPU are named `GPU N` or `GPU N ...`.
fn check_gpu(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("GPU ")?;
    let digits = rest.split(' ').next()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// Prometheus text exposition format 0.0.4, as node_exporter's textfile collector reads it.

/// One metric family: its name, help, and samples, each a label set and a value.
struct Family {
    name: &'static str,
    help: &'static str,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    fn new(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            samples: Vec::new(),
        }
    }

    /// Adds a sample. A label set the family already has keeps one line, with the lower
    /// value: the format allows each series once, and for a check reported twice a failure
    /// must win.
    fn add(&mut self, labels: Vec<(&'static str, String)>, value: f64) {
        match self.samples.iter_mut().find(|(l, _)| *l == labels) {
            Some((_, v)) => *v = v.min(value),
            None => self.samples.push((labels, value)),
        }
    }

    fn add_if(&mut self, labels: Vec<(&'static str, String)>, value: Option<f64>) {
        if let Some(v) = value {
            self.add(labels, v);
        }
    }

    /// The family's lines; nothing when it has no sample.
    fn render(&self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(self.help));
        let _ = writeln!(out, "# TYPE {} gauge", self.name);
        for (labels, value) in &self.samples {
            out.push_str(self.name);
            if !labels.is_empty() {
                let pairs: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape_label_value(v)))
                    .collect();
                let _ = write!(out, "{{{}}}", pairs.join(","));
            }
            let _ = writeln!(out, " {}", sample_value(*value));
        }
    }
}

/// A label value as the format quotes it: backslash, double quote and line feed escaped.
fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text as the format takes it: backslash and line feed escaped (a quote is plain).
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A value as Go's ParseFloat reads it; Rust writes infinities and NaN its own way.
fn sample_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// The status counts' label values, in the verdict's order.
const STATUSES: [(Status, &str); 4] = [
    (Status::Pass, "pass"),
    (Status::Warn, "warn"),
    (Status::Skip, "skip"),
    (Status::Fail, "fail"),
];

/// The run as a whole: verdict, level, duration, when, what software, how many checks.
fn run_families(report: &Report, now: SystemTime) -> Vec<Family> {
    let exit = report.exit_code();
    let mut healthy = Family::new(
        "gpubake_probe_healthy",
        "1 when the last probe passed (exit 0, warnings included), 0 when a check failed or no GPU was visible.",
    );
    healthy.add(vec![], if exit == 0 { 1.0 } else { 0.0 });
    let mut exit_code = Family::new(
        "gpubake_probe_exit_code",
        "Exit code of the last probe: 0 pass, 1 a check failed, 3 no GPU visible.",
    );
    exit_code.add(vec![], f64::from(exit));
    let mut level = Family::new(
        "gpubake_probe_level",
        "Level of the last probe: 1 passive, 2 active, 3 burn.",
    );
    level.add(vec![], f64::from(report.level));
    let mut duration = Family::new(
        "gpubake_probe_duration_seconds",
        "Seconds the last probe took.",
    );
    duration.add(vec![], report.seconds.max(0.0));
    let mut last_run = Family::new(
        "gpubake_probe_last_run_timestamp_seconds",
        "Unix time the last probe finished and wrote this file; alert when it is older than the probe's interval.",
    );
    last_run.add(vec![], (unix_seconds(now) * 1000.0).round() / 1000.0);
    let mut info = Family::new(
        "gpubake_probe_info",
        "Always 1; its labels name gpubake's version, the NCCL PyTorch would load and the driver, where the probe found them.",
    );
    let mut labels = vec![("version", version(report))];
    labels.extend(nccl_version(report).map(|v| ("nccl_version", v)));
    labels.extend(driver(report).map(|v| ("driver", v)));
    info.add(labels, 1.0);
    let mut gpus = Family::new(
        "gpubake_probe_gpus",
        "GPUs the last probe opened through NVML.",
    );
    if report.no_gpu || report.facts.contains_key("nvml") {
        gpus.add(vec![], nvml_gpus(report).len() as f64);
    }
    let mut counts = Family::new(
        "gpubake_probe_checks",
        "Checks of the last probe by status: pass, warn, skip (not judged), fail.",
    );
    for (status, label) in STATUSES {
        let n = report.checks.iter().filter(|c| c.status == status).count();
        counts.add(vec![("status", label.to_string())], n as f64);
    }
    vec![
        healthy, exit_code, level, duration, last_run, info, gpus, counts,
    ]
}

/// gpubake's version as the report names it.
fn version(report: &Report) -> String {
    if report.gpubake.is_empty() {
        env!("CARGO_PKG_VERSION").to_string()
    } else {
        report.gpubake.clone()
    }
}

/// One sample per judged check. A skipped check was not judged, so neither 1 nor 0 would be
/// true of it: it is left out here and counted in `gpubake_probe_checks{status="skip"}`.
fn check_family(report: &Report, gpus: &[GpuId]) -> Family {
    let mut checks = Family::new(
        "gpubake_probe_check_ok",
        "1 when the check held (warnings included), 0 when it failed; skipped checks are left out. gpu, uuid and model name the GPU of a check about one GPU.",
    );
    for c in report.checks.iter().filter(|c| c.status != Status::Skip) {
        let mut labels = vec![("phase", c.phase.to_string()), ("check", c.name.clone())];
        if let Some(index) = check_gpu(&c.name) {
            labels.extend(gpu_by_index(gpus, index).labels());
        }
        checks.add(labels, if c.failed() { 0.0 } else { 1.0 });
    }
    checks
}

/// The measurements, per GPU in base units (bytes, hertz, celsius, watts) as Prometheus'
/// naming asks, so that PromQL and Grafana scale them: rates end in `_per_second`, the GEMM
/// rate counts floating-point operations (a TFLOP/s is 1e12), and a statistic other than the
/// median comes before the quantity (`min_`, `max_`).
fn measured_families(report: &Report, gpus: &[GpuId]) -> Vec<Family> {
    let mut allreduce = Family::new(
        "gpubake_probe_allreduce_bus_bandwidth_bytes_per_second",
        "All-reduce bus bandwidth across the node's GPUs (nccl-tests' busbw), the bundled kernel's float32 two-shot at the largest size.",
    );
    allreduce.add_if(vec![], allreduce_busbw(report).map(|g| g * 1e9));
    let mut memory = Family::new(
        "gpubake_gpu_memory_copy_bandwidth_bytes_per_second",
        "Device-to-device copy bandwidth of the GPU's memory, bytes read plus bytes written per second.",
    );
    for (gpu, gbps) in memory_bandwidth(report, gpus) {
        memory.add(gpu.labels(), gbps * 1e9);
    }
    let mut flops = Family::new(
        "gpubake_gpu_burn_gemm_flops_per_second",
        "Median bf16 GEMM rate of the burn, floating-point operations per second (1e12 is 1 TFLOP/s).",
    );
    let mut flops_min = Family::new(
        "gpubake_gpu_burn_min_gemm_flops_per_second",
        "Slowest batch's bf16 GEMM rate during the burn, floating-point operations per second.",
    );
    let mut clock = Family::new(
        "gpubake_gpu_burn_sm_clock_hertz",
        "Median SM clock under the burn's load.",
    );
    let mut clock_min = Family::new(
        "gpubake_gpu_burn_min_sm_clock_hertz",
        "Lowest SM clock NVML read under the burn's load.",
    );
    let mut temperature = Family::new(
        "gpubake_gpu_burn_max_temperature_celsius",
        "Highest GPU temperature NVML read during the burn.",
    );
    let mut power = Family::new(
        "gpubake_gpu_burn_max_power_watts",
        "Highest power draw NVML read during the burn.",
    );
    let mut ecc = Family::new(
        "gpubake_gpu_burn_ecc_errors",
        "ECC errors the GPU counted during the burn (type corrected or uncorrected).",
    );
    let mut remapped = Family::new(
        "gpubake_gpu_burn_remapped_rows",
        "Rows remapped for uncorrectable errors, read after the burn.",
    );
    let mut throttled = Family::new(
        "gpubake_gpu_burn_throttled",
        "1 for each throttle reason NVML reported in any read of the burn (the software power cap is what a full load looks like).",
    );
    for b in burns(report, gpus) {
        let l = b.gpu.labels();
        for (kind, count) in [
            ("corrected", b.ecc_during.0),
            ("uncorrected", b.ecc_during.1),
        ] {
            let mut labels = l.clone();
            labels.push(("type", kind.to_string()));
            ecc.add_if(labels, count);
        }
        remapped.add_if(l.clone(), b.remapped_rows);
        for reason in &b.throttle {
            let mut labels = l.clone();
            labels.push(("reason", reason.clone()));
            throttled.add(labels, 1.0);
        }
        flops.add_if(l.clone(), b.tflops_median.map(|t| t * 1e12));
        flops_min.add_if(l.clone(), b.tflops_min.map(|t| t * 1e12));
        clock.add_if(l.clone(), b.sm_mhz_median.map(|m| m * 1e6));
        clock_min.add_if(l.clone(), b.sm_mhz_min.map(|m| m * 1e6));
        temperature.add_if(l.clone(), b.temperature_c_max);
        power.add_if(l, b.power_w_max);
    }
    vec![
        allreduce,
        memory,
        flops,
        flops_min,
        clock,
        clock_min,
        temperature,
        power,
        ecc,
        remapped,
        throttled,
    ]
}

/// The report in Prometheus' text format, stamped `now`. No sample carries a timestamp:
/// node_exporter's textfile collector refuses a file that has one.
pub fn prometheus(report: &Report, now: SystemTime) -> String {
    let gpus = nvml_gpus(report);
    let mut families = run_families(report, now);
    families.push(check_family(report, &gpus));
    families.extend(measured_families(report, &gpus));
    let mut out = String::new();
    for f in &families {
        f.render(&mut out);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Node Feature Discovery's feature file: `name=value` lines, `#` comments, and the
// `# +expiry-time=RFC3339` directive, which applies to the lines after it.

/// The labels' namespace. nfd-master allows any namespace but `kubernetes.io` and its
/// subdomains (feature.node.kubernetes.io aside) unless its denyLabelNs says otherwise.
pub const NFD_PREFIX: &str = "gpubake.io";

/// Kubernetes' limit on a label value and on the name part of a label key.
const LABEL_MAX: usize = 63;

/// How long the labels stand after the run that wrote them: about twice the interval each
/// level is meant to run at (level 1, seconds of reads, every 30 minutes; level 2, two minutes
/// that hold the GPUs, every 3 hours; level 3, a burn of ten minutes or more, every 12 hours),
/// so one missed run keeps them and a probe that stopped running loses them. NFD drops an
/// expired file's labels at its next re-discovery.
pub fn nfd_lifetime(level: u8) -> Duration {
    const HOUR: u64 = 3600;
    Duration::from_secs(match level {
        3 => 24 * HOUR,
        2 => 6 * HOUR,
        _ => HOUR,
    })
}

/// All-reduce bus bandwidth classes, in GB/s (1e9 bytes/s, nccl-tests' busbw), each from
/// its lower bound up to the next one's. The bounds part the interconnects a node's GPUs
/// reduce over: PCIe (below 50), PCIe Gen5 peer-to-peer and NVLink 2 (to 150), NVLink 3 of
/// A100s (to 300; half the H100/H200 P2P floor, the probe's own all-reduce floor, is 150),
/// NVLink 4 of H100/H200 (to 600), NVLink 5 of B200 and later (above). `GBps` with a capital
/// B says bytes: `gbps` would read as gigabits.
const ALLREDUCE_CLASSES: &[(f64, &str)] = &[
    (0.0, "lt-50GBps"),
    (50.0, "50-150GBps"),
    (150.0, "150-300GBps"),
    (300.0, "300-600GBps"),
    (600.0, "ge-600GBps"),
];

/// The class of a bus bandwidth in GB/s.
pub fn allreduce_class(gbps: f64) -> &'static str {
    ALLREDUCE_CLASSES
        .iter()
        .rev()
        .find(|(low, _)| gbps >= *low)
        .map(|(_, class)| *class)
        .unwrap_or(ALLREDUCE_CLASSES[0].1)
}

/// `raw` as a Kubernetes label value: every other character becomes `-`, runs of them one,
/// then it is cut to 63 and trimmed to begin and end with a letter or digit. None when
/// nothing is left, as a label that says nothing is better left out.
pub fn label_value(raw: &str) -> Option<String> {
    let mut mapped = String::new();
    for c in raw.chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
            c
        } else {
            '-'
        };
        if !(c == '-' && mapped.ends_with('-')) {
            mapped.push(c);
        }
    }
    let trimmed = mapped.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let cut: String = trimmed.chars().take(LABEL_MAX).collect();
    let value = cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    (!value.is_empty()).then(|| value.to_string())
}

/// The node's health as a label value: `no-gpu` is kept apart from `fail` since it is most
/// often the probe's own pod that got no GPU (no runtime class, no device request), not a
/// broken node; either way a workload that selects `health=pass` stays off the node.
fn health(report: &Report) -> &'static str {
    match report.exit_code() {
        0 => "pass",
        3 => "no-gpu",
        _ => "fail",
    }
}

/// The labels the report gives, as (name under the prefix, value), each a valid label.
fn nfd_labels(report: &Report) -> Vec<(&'static str, String)> {
    let mut labels = vec![("health", health(report).to_string())];
    if report.level > 0 {
        labels.push(("probe-level", report.level.to_string()));
    }
    if let Some(v) = nccl_version(report).as_deref().and_then(label_value) {
        labels.push(("nccl-version", v));
    }
    if let Some(gbps) = allreduce_busbw(report) {
        labels.push(("allreduce-class", allreduce_class(gbps).to_string()));
    }
    let gpus = nvml_gpus(report);
    if report.facts.contains_key("nvml") {
        labels.push(("gpu-count", gpus.len().to_string()));
    }
    let mut models: Vec<&str> = gpus.iter().map(|g| g.model.as_str()).collect();
    models.dedup();
    match models.as_slice() {
        [] => {}
        // The nvml phase's word for a name NVML would not give: no model to select on.
        ["unknown"] => {}
        [one] => labels.extend(label_value(one).map(|m| ("gpu-model", m))),
        _ => labels.push(("gpu-model", "mixed".to_string())),
    }
    labels
}

/// The report as an NFD feature file whose labels expire after the level's lifetime.
pub fn nfd(report: &Report, now: SystemTime) -> String {
    let epoch = unix_seconds(now) as u64;
    let expiry = epoch + nfd_lifetime(report.level).as_secs();
    let mut out = String::new();
    // A comment must not begin with `# +`: nfd-worker reads that as a directive.
    let _ = writeln!(
        out,
        "# gpubake {} probe, level {}, {}: node labels for NFD's local feature source",
        version(report),
        report.level,
        crate::units::rfc3339(epoch)
    );
    // First, so that it covers every label below it.
    let _ = writeln!(out, "# +expiry-time={}", crate::units::rfc3339(expiry));
    for (name, value) in nfd_labels(report) {
        let _ = writeln!(out, "{NFD_PREFIX}/{name}={value}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeSet;

    /// 2026-12-02T10:00:00Z.
    fn at() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_796_205_600)
    }

    fn no_gpu() -> Report {
        let mut r = Report {
            gpubake: "0.9.0".into(),
            level: 1,
            seconds: 0.4,
            no_gpu: true,
            ..Report::default()
        };
        r.push(
            "environment",
            "libnvidia-ml.so.1",
            Status::Fail,
            "not found",
        );
        r.push("nvml", "GPUs", Status::Fail, "no NVIDIA GPU is visible");
        r
    }

    fn nvml(gpus: &[(u64, &str, &str, &str)]) -> Value {
        let list: Vec<Value> = gpus
            .iter()
            .map(|(index, uuid, name, bus)| {
                json!({"index": index, "uuid": uuid, "name": name, "pci_bus_id": bus,
                       "arch": "9.0", "brand": "nvidia", "memory_total": 150_000_000_000u64})
            })
            .collect();
        json!({"count": gpus.len(), "driver": "580.159.04", "cuda": "13.0", "gpus": list})
    }

    fn one_gpu() -> Report {
        let mut r = Report {
            gpubake: "0.9.0".into(),
            level: 2,
            seconds: 31.5,
            ..Report::default()
        };
        r.push("nvml", "GPU 0 ECC", Status::Pass, "on");
        r.push("nvml", "GPU 0 clocks", Status::Warn, "power cap");
        r.push("allreduce", "all-reduce busbw", Status::Skip, "one GPU");
        r.fact(
            "nvml",
            nvml(&[(0, "GPU-aaaa", "NVIDIA H200", "00000000:06:00.0")]),
        );
        r.fact(
            "cuda",
            json!({"devices": [{"cuda_ordinal": 0, "pci_bus_id": "0000:06:00.0"}],
                   "memory": [{"gpu": 0, "gbps": 4275.5}], "peer_access": [[true]], "p2p": []}),
        );
        r.fact(
            "allreduce",
            json!({"devices": [{"cuda_ordinal": 0, "pci_bus_id": "0000:06:00.0"}],
                   "rows": [{"bytes": 1u64 << 30, "dtype": "f32", "algo": "two-shot", "ranks": 4,
                             "busbw": 900.0, "wrong": 0}]}),
        );
        r.fact(
            "nccl",
            json!([{"path": "/venv/nvidia/nccl/lib/libnccl.so.2", "version": "2.28.9"}]),
        );
        r
    }

    /// Two H200s whose CUDA ordinals are the reverse of their NVML indices, with a burn.
    fn two_gpus() -> Report {
        let mut r = Report {
            gpubake: "0.9.0".into(),
            level: 3,
            seconds: 702.25,
            ..Report::default()
        };
        r.push("nvml", "GPU 0 ECC", Status::Pass, "on");
        r.push("nvml", "GPU 1 ECC", Status::Pass, "on");
        r.push("cuda", "P2P 0->1", Status::Pass, "394 GB/s");
        r.push(
            "burn",
            "GPU 1 GEMMs",
            Status::Fail,
            "612 TFLOP/s, below the floor",
        );
        r.push("burn", "GEMM across GPUs", Status::Pass, "one result");
        r.fact(
            "nvml",
            nvml(&[
                (0, "GPU-aaaa", "NVIDIA H200", "00000000:06:00.0"),
                (1, "GPU-bbbb", "NVIDIA H200", "00000000:07:00.0"),
            ]),
        );
        r.fact(
            "cuda",
            json!({"devices": [{"cuda_ordinal": 0, "pci_bus_id": "0000:07:00.0"},
                               {"cuda_ordinal": 1, "pci_bus_id": "0000:06:00.0"}],
                   "memory": [{"gpu": 0, "gbps": 4268.0}, {"gpu": 1, "gbps": 4275.0}]}),
        );
        r.fact(
            "allreduce",
            json!({"devices": [{}, {}], "rows": [
                {"bytes": 1024, "dtype": "f32", "algo": "two-shot", "ranks": 2, "busbw": 0.2},
                {"bytes": 1u64 << 30, "dtype": "f32", "algo": "two-shot", "ranks": 2, "busbw": 336.4},
                {"bytes": 1u64 << 30, "dtype": "bf16", "algo": "two-shot", "ranks": 2, "busbw": 20.0}]}),
        );
        r.fact(
            "nccl",
            json!([{"path": "/venv/libnccl.so.2", "version": "2.28.9"},
                   {"path": "/usr/lib/libnccl.so.2", "version": "2.21.5"}]),
        );
        let burn = |index: u64, uuid: &str, tflops: f64| {
            json!({"index": index, "uuid": uuid, "name": "NVIDIA H200", "seconds": 600.0,
                   "gemms": 90_000, "tflops_median": tflops, "tflops_min": tflops - 10.0,
                   "sm_mhz_median": 1980, "sm_mhz_min": 1755, "power_w_max": 698.5,
                   "temperature_c_max": 71, "samples": 600,
                   "throttle": ["software power cap"],
                   "counters_before": {"ecc_corrected": 4, "ecc_uncorrected": 0, "rows_uncorrectable": 0},
                   "counters_after": {"ecc_corrected": 4 + index, "ecc_uncorrected": 0, "rows_uncorrectable": index},
                   "repeat_wrong": 0, "reference_wrong": 0, "sha256": "ab"})
        };
        r.fact(
            "burn",
            json!([burn(0, "GPU-aaaa", 702.0), burn(1, "GPU-bbbb", 612.0)]),
        );
        r
    }

    /// The sample lines of `text` (no comments), each `name{labels} value`.
    fn samples(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#')).collect()
    }

    /// The value of the sample line that starts with `series` followed by a space.
    fn value(text: &str, series: &str) -> Option<f64> {
        samples(text)
            .iter()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// The exposition format's structure, checked from its rules: each family's HELP then
    /// TYPE then its samples, together; no family twice; no sample line twice; names of
    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`; every line ending in a line feed.
    fn well_formed(text: &str) {
        assert!(text.ends_with('\n'), "{text}");
        let mut seen = BTreeSet::new();
        let mut lines = BTreeSet::new();
        let mut current = String::new();
        let name_ok = |n: &str| {
            let mut cs = n.chars();
            cs.next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
                && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(name_ok(name), "{line}");
                assert!(
                    seen.insert(name.to_string()),
                    "family {name} twice:\n{text}"
                );
                current = name.to_string();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                assert_eq!(rest, format!("{current} gauge"), "{text}");
            } else {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(name, current, "a sample outside its family: {line}");
                assert!(
                    lines.insert(line.rsplit_once(' ').unwrap().0.to_string()),
                    "{line}"
                );
                let v = line.rsplit_once(' ').unwrap().1;
                assert!(v.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&v));
            }
        }
    }

    #[test]
    fn kinds_parse_and_names_their_readers_skip_are_refused() {
        assert_eq!(
            "prometheus:/var/lib/node_exporter/gpubake.prom".parse::<Emit>(),
            Ok(Emit::Prometheus(
                "/var/lib/node_exporter/gpubake.prom".into()
            ))
        );
        assert_eq!(
            "nfd:/etc/kubernetes/node-feature-discovery/features.d/gpubake".parse::<Emit>(),
            Ok(Emit::Nfd(
                "/etc/kubernetes/node-feature-discovery/features.d/gpubake".into()
            ))
        );
        let err = "prometheus:/tmp/metrics.txt".parse::<Emit>().unwrap_err();
        assert!(
            err.contains("`.prom`") && err.contains("metrics.txt.prom"),
            "{err}"
        );
        let err = "nfd:/etc/features.d/.gpubake".parse::<Emit>().unwrap_err();
        assert!(err.contains("dot") && err.contains("`gpubake`"), "{err}");
        for bad in ["prometheus:", "nfd:", "prometheus", "json:x.prom", ":x", ""] {
            let err = bad.parse::<Emit>().unwrap_err();
            assert!(err.contains("prometheus:FILE or nfd:FILE"), "{bad}: {err}");
        }
        for dir in ["prometheus:/tmp/", "nfd:/tmp/..", "prometheus:a.prom/"] {
            let err = dir.parse::<Emit>().unwrap_err();
            assert!(err.contains("directory"), "{dir}: {err}");
        }
    }

    #[test]
    fn no_gpu_is_unhealthy_with_exit_3_and_its_own_health_label() {
        let r = no_gpu();
        let text = prometheus(&r, at());
        well_formed(&text);
        assert_eq!(value(&text, "gpubake_probe_healthy"), Some(0.0));
        assert_eq!(value(&text, "gpubake_probe_exit_code"), Some(3.0));
        assert_eq!(value(&text, "gpubake_probe_level"), Some(1.0));
        assert_eq!(value(&text, "gpubake_probe_duration_seconds"), Some(0.4));
        assert_eq!(
            value(&text, "gpubake_probe_last_run_timestamp_seconds"),
            Some(1_796_205_600.0)
        );
        assert_eq!(value(&text, "gpubake_probe_gpus"), Some(0.0));
        assert_eq!(
            value(&text, "gpubake_probe_info{version=\"0.9.0\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(&text, "gpubake_probe_checks{status=\"fail\"}"),
            Some(2.0)
        );
        assert_eq!(
            value(
                &text,
                "gpubake_probe_check_ok{phase=\"nvml\",check=\"GPUs\"}"
            ),
            Some(0.0)
        );
        assert!(!text.contains("gpubake_gpu_"), "{text}");
        let nfd = nfd(&r, at());
        assert_eq!(
            nfd.lines().skip(1).collect::<Vec<_>>(),
            [
                "# +expiry-time=2026-12-02T11:00:00Z",
                "gpubake.io/health=no-gpu",
                "gpubake.io/probe-level=1",
            ],
            "{nfd}"
        );
    }

    #[test]
    fn a_report_without_facts_still_says_its_verdict() {
        let r = Report::default();
        let text = prometheus(&r, at());
        well_formed(&text);
        assert_eq!(value(&text, "gpubake_probe_healthy"), Some(1.0));
        assert_eq!(value(&text, "gpubake_probe_level"), Some(0.0));
        assert!(!text.contains("gpubake_probe_gpus"), "{text}");
        assert!(!text.contains("gpubake_probe_check_ok"), "{text}");
        assert!(
            text.contains(&format!(
                "gpubake_probe_info{{version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        let nfd = nfd(&r, at());
        assert!(nfd.ends_with("gpubake.io/health=pass\n"), "{nfd}");
        assert!(!nfd.contains("probe-level"), "{nfd}");
    }

    #[test]
    fn one_gpu_has_its_bandwidth_but_no_allreduce_class() {
        let r = one_gpu();
        let text = prometheus(&r, at());
        well_formed(&text);
        assert_eq!(value(&text, "gpubake_probe_healthy"), Some(1.0));
        let labels = "{gpu=\"0\",uuid=\"GPU-aaaa\",model=\"NVIDIA H200\"}";
        assert_eq!(
            value(
                &text,
                &format!("gpubake_gpu_memory_copy_bandwidth_bytes_per_second{labels}")
            ),
            Some(4_275_500_000_000.0)
        );
        assert_eq!(
            value(
                &text,
                "gpubake_probe_check_ok{phase=\"nvml\",check=\"GPU 0 clocks\",gpu=\"0\",uuid=\"GPU-aaaa\",model=\"NVIDIA H200\"}"
            ),
            Some(1.0),
            "a warning holds: {text}"
        );
        assert!(
            !text.contains("check=\"all-reduce busbw\""),
            "skips are left out"
        );
        assert_eq!(
            value(&text, "gpubake_probe_checks{status=\"skip\"}"),
            Some(1.0)
        );
        assert!(
            !text.contains("gpubake_probe_allreduce_bus_bandwidth"),
            "four ranks on one GPU measure its memory: {text}"
        );
        assert!(
            text.contains(
                "gpubake_probe_info{version=\"0.9.0\",nccl_version=\"2.28.9\",driver=\"580.159.04\"} 1\n"
            ),
            "{text}"
        );
        let nfd = nfd(&r, at());
        assert!(
            nfd.contains("# +expiry-time=2026-12-02T16:00:00Z\n"),
            "{nfd}"
        );
        assert!(nfd.contains("\ngpubake.io/health=pass\n"), "{nfd}");
        assert!(nfd.contains("\ngpubake.io/probe-level=2\n"), "{nfd}");
        assert!(nfd.contains("\ngpubake.io/nccl-version=2.28.9\n"), "{nfd}");
        assert!(nfd.contains("\ngpubake.io/gpu-count=1\n"), "{nfd}");
        assert!(
            nfd.contains("\ngpubake.io/gpu-model=NVIDIA-H200\n"),
            "{nfd}"
        );
        assert!(!nfd.contains("allreduce-class"), "{nfd}");
    }

    #[test]
    fn several_gpus_are_matched_by_pci_address_and_burns_are_in_base_units() {
        let r = two_gpus();
        let text = prometheus(&r, at());
        well_formed(&text);
        assert_eq!(value(&text, "gpubake_probe_healthy"), Some(0.0));
        assert_eq!(value(&text, "gpubake_probe_exit_code"), Some(1.0));
        assert_eq!(value(&text, "gpubake_probe_gpus"), Some(2.0));
        let g0 = "{gpu=\"0\",uuid=\"GPU-aaaa\",model=\"NVIDIA H200\"}";
        let g1 = "{gpu=\"1\",uuid=\"GPU-bbbb\",model=\"NVIDIA H200\"}";
        // CUDA 1 is NVML's GPU 0.
        let mem = "gpubake_gpu_memory_copy_bandwidth_bytes_per_second";
        assert_eq!(value(&text, &format!("{mem}{g0}")), Some(4.275e12));
        assert_eq!(value(&text, &format!("{mem}{g1}")), Some(4.268e12));
        let flops = "gpubake_gpu_burn_gemm_flops_per_second";
        assert_eq!(value(&text, &format!("{flops}{g0}")), Some(702e12));
        assert_eq!(value(&text, &format!("{flops}{g1}")), Some(612e12));
        assert_eq!(
            value(
                &text,
                &format!("gpubake_gpu_burn_min_gemm_flops_per_second{g1}")
            ),
            Some(602e12)
        );
        assert_eq!(
            value(&text, &format!("gpubake_gpu_burn_sm_clock_hertz{g0}")),
            Some(1.98e9)
        );
        assert_eq!(
            value(&text, &format!("gpubake_gpu_burn_min_sm_clock_hertz{g0}")),
            Some(1.755e9)
        );
        assert_eq!(
            value(
                &text,
                &format!("gpubake_gpu_burn_max_temperature_celsius{g1}")
            ),
            Some(71.0)
        );
        assert_eq!(
            value(&text, &format!("gpubake_gpu_burn_max_power_watts{g1}")),
            Some(698.5)
        );
        // What moved during the burn, not the counts since the driver loaded.
        let with = |g: &str, label: &str| format!("{}{label}}}", &g[..g.len() - 1]);
        for (g, corrected, rows) in [(g0, 0.0, 0.0), (g1, 1.0, 1.0)] {
            let ecc = "gpubake_gpu_burn_ecc_errors";
            assert_eq!(
                value(&text, &format!("{ecc}{}", with(g, ",type=\"corrected\""))),
                Some(corrected)
            );
            assert_eq!(
                value(&text, &format!("{ecc}{}", with(g, ",type=\"uncorrected\""))),
                Some(0.0)
            );
            assert_eq!(
                value(&text, &format!("gpubake_gpu_burn_remapped_rows{g}")),
                Some(rows)
            );
            assert_eq!(
                value(
                    &text,
                    &format!(
                        "gpubake_gpu_burn_throttled{}",
                        with(g, ",reason=\"software power cap\"")
                    )
                ),
                Some(1.0)
            );
        }
        assert_eq!(
            value(
                &text,
                "gpubake_probe_allreduce_bus_bandwidth_bytes_per_second"
            ),
            Some(336.4e9)
        );
        assert_eq!(
            value(
                &text,
                &format!(
                    "gpubake_probe_check_ok{{phase=\"burn\",check=\"GPU 1 GEMMs\",{}",
                    &g1[1..]
                )
            ),
            Some(0.0)
        );
        // A check about a pair or the node names no GPU.
        assert_eq!(
            value(
                &text,
                "gpubake_probe_check_ok{phase=\"cuda\",check=\"P2P 0->1\"}"
            ),
            Some(1.0)
        );
        let nfd = nfd(&r, at());
        assert!(
            nfd.contains("# +expiry-time=2026-12-03T10:00:00Z\n"),
            "{nfd}"
        );
        assert!(nfd.contains("\ngpubake.io/health=fail\n"), "{nfd}");
        assert!(
            nfd.contains("\ngpubake.io/allreduce-class=300-600GBps\n"),
            "{nfd}"
        );
        assert!(nfd.contains("\ngpubake.io/gpu-count=2\n"), "{nfd}");
        assert!(
            nfd.contains("\ngpubake.io/gpu-model=NVIDIA-H200\n"),
            "{nfd}"
        );
    }

    #[test]
    fn facts_that_cannot_be_matched_or_are_not_numbers_are_left_out() {
        let mut r = two_gpus();
        // No device list: CUDA ordinals cannot be tied to NVML's GPUs.
        r.fact("cuda", json!({"memory": [{"gpu": 0, "gbps": 4268.0}]}));
        r.fact(
            "burn",
            json!([{"index": 0, "tflops_median": null, "sm_mhz_median": "fast"},
                   {"uuid": "GPU-no-index"}]),
        );
        r.fact("allreduce", json!({"rows": "broken"}));
        r.fact("nccl", json!([]));
        let text = prometheus(&r, at());
        well_formed(&text);
        assert!(!text.contains("gpubake_gpu_"), "{text}");
        assert!(!text.contains("allreduce_bus"), "{text}");
        assert!(!text.contains("nccl_version"), "{text}");
        let nfd = nfd(&r, at());
        assert!(
            !nfd.contains("nccl-version") && !nfd.contains("allreduce"),
            "{nfd}"
        );
    }

    #[test]
    fn label_values_are_escaped_as_the_format_says() {
        let mut r = one_gpu();
        r.push(
            "framework",
            "GPU 0 torch \"cuda\" at C:\\venv\nsecond line",
            Status::Fail,
            "",
        );
        r.facts["nvml"]["gpus"][0]["name"] = json!("H200 \"SXM\"\\x");
        let text = prometheus(&r, at());
        well_formed(&text);
        assert!(
            text.contains(
                "gpubake_probe_check_ok{phase=\"framework\",check=\"GPU 0 torch \\\"cuda\\\" at C:\\\\venv\\nsecond line\",gpu=\"0\",uuid=\"GPU-aaaa\",model=\"H200 \\\"SXM\\\"\\\\x\"} 0\n"
            ),
            "{text}"
        );
        assert_eq!(text.lines().filter(|l| l.is_empty()).count(), 0, "{text}");
        assert_eq!(escape_help("a\\b\nc \"d\""), "a\\\\b\\nc \"d\"");
        assert_eq!(sample_value(f64::INFINITY), "+Inf");
        assert_eq!(sample_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(sample_value(f64::NAN), "NaN");
        assert_eq!(sample_value(4.275e12), "4275000000000");
        let nfd = nfd(&r, at());
        assert!(nfd.contains("\ngpubake.io/gpu-model=H200-SXM-x\n"), "{nfd}");
    }

    #[test]
    fn a_check_reported_twice_is_one_series_and_a_failure_wins() {
        let mut r = one_gpu();
        r.push("nccl", "IB transport", Status::Pass, "one rank: IB");
        r.push("nccl", "IB transport", Status::Fail, "sockets");
        r.push("nccl", "IB transport", Status::Pass, "IB again");
        let text = prometheus(&r, at());
        well_formed(&text);
        let series = "gpubake_probe_check_ok{phase=\"nccl\",check=\"IB transport\"}";
        assert_eq!(text.matches(series).count(), 1, "{text}");
        assert_eq!(value(&text, series), Some(0.0));
    }

    #[test]
    fn checks_name_their_gpu_only_when_named_gpu_and_a_number() {
        assert_eq!(check_gpu("GPU 0 ECC"), Some(0));
        assert_eq!(check_gpu("GPU 12"), Some(12));
        assert_eq!(check_gpu("GPU 3 CPU affinity"), Some(3));
        for name in [
            "GPUs",
            "GPU models",
            "GPU x",
            "GPU ",
            "P2P 0->1",
            "all GPU 1",
            "GPU 1a",
        ] {
            assert_eq!(check_gpu(name), None, "{name}");
        }
        // A GPU NVML did not list still gets its index.
        let r = no_gpu();
        let mut r2 = r;
        r2.push("nvml", "GPU 5", Status::Fail, "lost");
        let text = prometheus(&r2, at());
        assert!(
            text.contains("gpubake_probe_check_ok{phase=\"nvml\",check=\"GPU 5\",gpu=\"5\"} 0\n"),
            "{text}"
        );
    }

    /// A label value as Kubernetes validates it (IsValidLabelValue).
    fn valid_value(v: &str) -> bool {
        let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        v.is_empty()
            || (v.len() <= 63
                && ends(v.chars().next())
                && ends(v.chars().last())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    }

    #[test]
    fn nfd_values_are_made_valid_or_left_out() {
        assert_eq!(label_value("2.28.9").as_deref(), Some("2.28.9"));
        assert_eq!(
            label_value("2.28.9+cuda13.0").as_deref(),
            Some("2.28.9-cuda13.0")
        );
        assert_eq!(label_value("NVIDIA H200").as_deref(), Some("NVIDIA-H200"));
        assert_eq!(
            label_value("  NVIDIA  GH200 480GB (Grace) ").as_deref(),
            Some("NVIDIA-GH200-480GB-Grace")
        );
        assert_eq!(label_value("-_.x.-_").as_deref(), Some("x"));
        for nothing in ["", "   ", "+++", "._-", "日本"] {
            assert_eq!(label_value(nothing), None, "{nothing}");
        }
        let long = "NVIDIA ".repeat(20);
        let cut = label_value(&long).unwrap();
        assert!(cut.len() <= 63 && valid_value(&cut), "{cut}");
        // A cut that ends on a separator is trimmed back to a letter.
        let cut = label_value(&format!("{}-tail", "a".repeat(62))).unwrap();
        assert_eq!(cut, "a".repeat(62));
        for raw in ["é-model", "a/b", "x=y", "a\"b", "GPU\n0", &"9".repeat(100)] {
            if let Some(v) = label_value(raw) {
                assert!(valid_value(&v), "{raw:?} -> {v:?}");
            }
        }
        let mut r = one_gpu();
        r.facts["nvml"]["gpus"][0]["name"] = json!("unknown");
        assert!(!nfd(&r, at()).contains("gpu-model"));
        r.facts["nvml"]["gpus"][0]["name"] = json!("???");
        r.fact("nccl", json!([{"path": "/x", "version": "(unknown)"}]));
        let nfd = nfd(&r, at());
        assert!(!nfd.contains("gpu-model"), "{nfd}");
        assert!(nfd.contains("nccl-version=unknown\n"), "{nfd}");
    }

    #[test]
    fn mixed_models_are_labelled_mixed() {
        let mut r = two_gpus();
        r.facts["nvml"]["gpus"][1]["name"] = json!("NVIDIA H100 80GB HBM3");
        let nfd = nfd(&r, at());
        assert!(nfd.contains("\ngpubake.io/gpu-model=mixed\n"), "{nfd}");
    }

    #[test]
    fn every_nfd_line_follows_the_feature_file_grammar() {
        for r in [no_gpu(), one_gpu(), two_gpus(), Report::default()] {
            let text = nfd(&r, at());
            assert!(text.len() < 65_536, "NFD ignores a file over 64 KiB");
            let mut lines = text.lines();
            let first = lines.next().unwrap();
            assert!(
                first.starts_with("# ") && !first.starts_with("# +"),
                "{first}"
            );
            assert!(lines.next().unwrap().starts_with("# +expiry-time="));
            let mut names = BTreeSet::new();
            for line in lines {
                let (name, value) = line.split_once('=').expect(line);
                let (prefix, base) = name.split_once('/').expect(line);
                assert_eq!(prefix, NFD_PREFIX);
                assert!(
                    base.len() <= 63 && valid_value(base) && !base.is_empty(),
                    "{line}"
                );
                assert!(valid_value(value), "{line}");
                assert!(names.insert(name.to_string()), "{name} twice");
            }
        }
    }

    #[test]
    fn allreduce_classes_cover_every_bandwidth_with_valid_values() {
        assert_eq!(allreduce_class(0.0), "lt-50GBps");
        assert_eq!(allreduce_class(24.9), "lt-50GBps");
        assert_eq!(allreduce_class(50.0), "50-150GBps");
        assert_eq!(allreduce_class(230.0), "150-300GBps");
        assert_eq!(allreduce_class(336.0), "300-600GBps");
        assert_eq!(allreduce_class(600.0), "ge-600GBps");
        assert_eq!(allreduce_class(f64::MAX), "ge-600GBps");
        for (_, class) in ALLREDUCE_CLASSES {
            assert!(valid_value(class), "{class}");
        }
        assert!(ALLREDUCE_CLASSES.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn lifetimes_grow_with_the_level() {
        assert_eq!(nfd_lifetime(0), Duration::from_secs(3600));
        assert_eq!(nfd_lifetime(1), Duration::from_secs(3600));
        assert_eq!(nfd_lifetime(2), Duration::from_secs(6 * 3600));
        assert_eq!(nfd_lifetime(3), Duration::from_secs(24 * 3600));
    }

    #[test]
    fn write_replaces_the_file_and_promtool_accepts_a_two_gpu_burn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpubake.prom");
        std::fs::write(&path, "stale\n").unwrap();
        let emit = Emit::Prometheus(path.clone());
        write(&two_gpus(), &emit).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# HELP gpubake_probe_healthy "), "{text}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["gpubake.prom"], "no temporary file is left");
        let nfd_path = dir.path().join("gpubake");
        write(&two_gpus(), &Emit::Nfd(nfd_path.clone())).unwrap();
        assert!(
            std::fs::read_to_string(&nfd_path)
                .unwrap()
                .contains("gpubake.io/health=fail\n")
        );
        let promtool = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&path).unwrap())
            .output();
        match promtool {
            Err(e) => eprintln!("skipped: promtool does not run here ({e}); CI installs it"),
            Ok(out) => {
                let said = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                assert!(out.status.success(), "promtool: {said}\n{text}");
                assert_eq!(said.trim(), "", "promtool's lint: {said}\n{text}");
            }
        }
    }
}
