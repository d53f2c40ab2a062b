//! Level 3, the burn: every GPU runs bf16 GEMMs at once (gemm.rs, one worker process per GPU)
//! for the set time while NVML is read once a second; then each GPU is judged on its rate
//! against its model's floor, its clocks and throttle reasons, temperature, power and memory
//! errors under load, and its results against themselves, the CPU's and the other GPUs'.

use super::budget::{self, Deadline};
use super::env::Discovery;
use super::nvml;
use super::report::{Report, Status};
use super::{ProbeOptions, policy};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Duration;

const PHASE: &str = "burn";
/// How often NVML is read during the burn.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One NVML read of one GPU under load; None for what NVML would not say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// SM clock, MHz.
    pub sm_mhz: Option<u32>,
    /// The throttle reasons set (nvmlClocksThrottleReasons bits).
    pub throttle: Option<u64>,
    /// Power drawn, milliwatts.
    pub power_mw: Option<u32>,
    /// GPU temperature, °C.
    pub temperature_c: Option<u32>,
}

/// Counters that must not move under load.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Counters {
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_uncorrected: Option<u64>,
    /// Corrected ECC errors since the driver loaded.
    pub ecc_corrected: Option<u64>,
    /// Rows remapped for uncorrectable errors.
    pub rows_uncorrectable: Option<u32>,
    /// A remap waits for a GPU reset.
    pub remap_pending: Option<bool>,
    /// A remap failed: the row could not be replaced.
    pub remap_failed: Option<bool>,
    /// Pages wait to be retired.
    pub pages_pending: Option<bool>,
}

/// Everything NVML said about one GPU during the burn.
#[derive(Clone, Debug, Default)]
pub struct Watch {
    /// NVML index.
    pub index: u32,
    /// Highest SM clock the GPU supports, MHz.
    pub max_sm_mhz: Option<u32>,
    /// The power limit in force, milliwatts.
    pub power_limit_mw: Option<u32>,
    /// The temperature at which the GPU slows itself down, °C.
    pub slowdown_c: Option<u32>,
    /// Counters before the burn.
    pub before: Counters,
    /// Counters after it.
    pub after: Counters,
    /// The reads, once a second.
    pub samples: Vec<Sample>,
    /// Why NVML could not be read, if it could not.
    pub error: Option<String>,
}

/// What one GPU's worker returned (gemm::Burn as JSON).
#[derive(Debug, Deserialize)]
pub struct Measured {
    /// Seconds of timed GEMMs.
    pub seconds: f64,
    /// GEMMs run.
    pub gemms: u64,
    /// TFLOP/s of each timed batch.
    pub tflops: Vec<f64>,
    /// Full results compared.
    pub readbacks: u32,
    /// Readbacks against the first.
    pub repeat: Comparison,
    /// The CPU's tiles.
    pub reference: Comparison,
    /// Freivalds' check of the whole result, in rows.
    pub product: Comparison,
    /// sha256 of the first result.
    pub sha256: String,
}

/// gemm::Mismatch as JSON.
#[derive(Debug, Deserialize)]
pub struct Comparison {
    /// Elements compared.
    pub checked: u64,
    /// Elements that differ.
    pub wrong: u64,
    /// The first that differs.
    pub first: Option<String>,
}

/// Runs the burn on every GPU of `facts` and judges it into `report`.
pub fn phase(
    disc: &Discovery,
    facts: &nvml::Facts,
    opts: &ProbeOptions,
    deadline: Deadline,
    report: &mut Report,
) {
    let gpus: Vec<&nvml::Gpu> = facts
        .gpus
        .iter()
        .filter(|g| !g.pci_bus_id.is_empty())
        .collect();
    let seconds = opts
        .burn
        .min(deadline.left().saturating_sub(budget::BURN_MARGIN));
    // The steps before the burn have level 2's budget; past it, the burn gets only what is
    // left, and a burn shorter than asked has not shown what was asked of it.
    if seconds < opts.burn {
        // What cut it: --budget where one was given, else the steps before the burn.
        let (theirs, whose) = match opts.budget {
            Some(b) => (String::new(), format!("--budget {}", b.as_secs())),
            None => (
                format!(" of their {} s", budget::ACTIVE.as_secs()),
                "level 3's budget".to_string(),
            ),
        };
        report.push(
            PHASE,
            "burn length",
            Status::Fail,
            format!(
                "{} s of the {} s asked: the steps before it took {:.0} s{theirs}, and the burn \
                 ran only in what was left of {whose}",
                seconds.as_secs(),
                opts.burn.as_secs(),
                deadline.elapsed().as_secs_f64(),
            ),
        );
    }
    let (env, _shim) = super::worker_env(disc, gpus.len());
    let step = budget::Budget::new(seconds + budget::BURN_MARGIN, deadline);
    let (tx, rx) = std::sync::mpsc::channel();
    for (slot, gpu) in gpus.iter().enumerate() {
        let args = vec![
            "--pci-bus-ids".to_string(),
            gpu.pci_bus_id.clone(),
            "burn".to_string(),
            "--seconds".to_string(),
            format!("{:.3}", seconds.as_secs_f64()),
        ];
        let (tx, env) = (tx.clone(), env.clone());
        std::thread::spawn(move || {
            let _ = tx.send((slot, super::run_worker(&args, &env, step)));
        });
    }
    drop(tx);
    let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    let (watches, results) = watch_while(&indices, rx);
    let policy = opts
        .policy
        .clone()
        .unwrap_or_else(|| policy::embedded().to_vec());
    let mut digests = Vec::new();
    let mut summary = Vec::new();
    for ((gpu, watch), result) in gpus.iter().zip(&watches).zip(results) {
        let tag = format!("GPU {}", gpu.index);
        let floor = policy::for_gpu(&policy, &gpu.name)
            .and_then(|p| Some((p.bf16_tflops_floor?, p.model.clone())));
        judge_health(&tag, watch, report);
        let measured = match result.and_then(|v| {
            serde_json::from_value::<Measured>(v).map_err(|e| format!("the worker's result: {e}"))
        }) {
            Ok(m) => m,
            Err(e) => {
                report.push(PHASE, format!("{tag} GEMMs"), Status::Fail, e);
                continue;
            }
        };
        judge_gemm(&tag, &measured, floor.as_ref(), report);
        digests.push((tag.clone(), measured.sha256.clone()));
        summary.push(summarise(gpu, watch, &measured));
    }
    judge_across(&digests, report);
    report.fact(PHASE, json!(summary));
}

/// Reads NVML for every GPU in `indices` once a second until every worker has answered on
/// `rx`; the reads and each worker's result, in the order of `indices`.
fn watch_while(
    indices: &[u32],
    rx: std::sync::mpsc::Receiver<(usize, Result<serde_json::Value, String>)>,
) -> (Vec<Watch>, Vec<Result<serde_json::Value, String>>) {
    let mut results: Vec<Option<Result<serde_json::Value, String>>> =
        indices.iter().map(|_| None).collect();
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"));
    let mut watches: Vec<Watch> = indices
        .iter()
        .map(|&index| match &nvml {
            Ok(nvml) => match nvml.device_by_index(index) {
                Ok(d) => Watch {
                    index,
                    max_sm_mhz: d.max_clock_info(Clock::SM).ok(),
                    power_limit_mw: d.enforced_power_limit().ok(),
                    slowdown_c: d.temperature_threshold(TemperatureThreshold::Slowdown).ok(),
                    before: counters(&d),
                    ..Watch::default()
                },
                Err(e) => Watch {
                    index,
                    error: Some(format!("NVML cannot open it: {e}")),
                    ..Watch::default()
                },
            },
            Err(e) => Watch {
                index,
                error: Some(e.clone()),
                ..Watch::default()
            },
        })
        .collect();
    let mut left = indices.len();
    while left > 0 {
        match rx.recv_timeout(SAMPLE_EVERY) {
            Ok((slot, r)) => {
                results[slot] = Some(r);
                left -= 1;
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if let Ok(nvml) = &nvml {
            for w in watches.iter_mut().filter(|w| w.error.is_none()) {
                if let Ok(d) = nvml.device_by_index(w.index) {
                    w.samples.push(Sample {
                        sm_mhz: d.clock_info(Clock::SM).ok(),
                        throttle: d.current_throttle_reasons().ok().map(|r| r.bits()),
                        power_mw: d.power_usage().ok(),
                        temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
                    });
                }
            }
        }
    }
    if let Ok(nvml) = &nvml {
        for w in watches.iter_mut().filter(|w| w.error.is_none()) {
            if let Ok(d) = nvml.device_by_index(w.index) {
                w.after = counters(&d);
            }
        }
    }
    let results = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("the worker's thread ended without a result".into())))
        .collect();
    (watches, results)
}

/// The counters of one GPU; remapped rows through NVML's raw call, which nvml-wrapper lacks.
fn counters(d: &nvml_wrapper::Device) -> Counters {
    let mut c = Counters {
        ecc_uncorrected: d
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok(),
        ecc_corrected: d
            .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .ok(),
        pages_pending: d.are_pages_pending_retired().ok(),
        ..Counters::default()
    };
    if let Ok(get) = d.nvml().lib().nvmlDeviceGetRemappedRows.as_ref() {
        let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
        // SAFETY: the handle is NVML's; NVML writes the four counts it is given.
        let code = unsafe { (*get)(d.handle(), &mut corr, &mut unc, &mut pending, &mut failed) };
        if nvml_wrapper::error::nvml_try(code).is_ok() {
            c.rows_uncorrectable = Some(unc);
            c.remap_pending = Some(pending != 0);
            c.remap_failed = Some(failed != 0);
        }
    }
    c
}

/// Throttle reasons that mean the GPU protects itself from heat or its power supply, or
/// that something outside it slows it: a fault under a load the GPU is built to carry.
const HARMFUL: [(ThrottleReasons, &str); 4] = [
    (ThrottleReasons::HW_SLOWDOWN, "hardware slowdown"),
    (
        ThrottleReasons::HW_THERMAL_SLOWDOWN,
        "hardware thermal slowdown",
    ),
    (
        ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
        "power brake (the supply asked the GPU to slow)",
    ),
    (
        ThrottleReasons::SW_THERMAL_SLOWDOWN,
        "software thermal slowdown",
    ),
];

/// Clocks, temperature, power and counters of one GPU under load, into checks.
pub fn judge_health(tag: &str, w: &Watch, report: &mut Report) {
    if let Some(e) = &w.error {
        report.push(
            PHASE,
            format!("{tag} health under load"),
            Status::Fail,
            e.clone(),
        );
        return;
    }
    if w.samples.is_empty() {
        report.push(
            PHASE,
            format!("{tag} health under load"),
            Status::Fail,
            "no NVML reading during the burn",
        );
        return;
    }
    let n = w.samples.len();
    let seen = |bit: ThrottleReasons| {
        w.samples
            .iter()
            .filter(|s| s.throttle.is_some_and(|t| t & bit.bits() != 0))
            .count()
    };
    let mut clocks: Vec<u32> = w.samples.iter().filter_map(|s| s.sm_mhz).collect();
    clocks.sort_unstable();
    let clock_text = match (clocks.first(), clocks.get(clocks.len() / 2)) {
        (Some(lo), Some(mid)) => format!(
            "SM clock median {mid} MHz, lowest {lo} MHz{}",
            w.max_sm_mhz
                .map(|m| format!(" (max {m} MHz)"))
                .unwrap_or_default()
        ),
        _ => "SM clock unread".to_string(),
    };
    // Power says why the clock is where it is (the power cap); it judges nothing itself, so
    // it is said here and kept in the facts rather than made a check that always passes.
    let peak = w.samples.iter().filter_map(|s| s.power_mw).max();
    let clock_text = match peak {
        Some(peak) => format!(
            "{clock_text}; highest {} W{}",
            peak / 1000,
            w.power_limit_mw
                .map(|l| format!(" of its {} W limit", l / 1000))
                .unwrap_or_default()
        ),
        None => clock_text,
    };
    let harmful: Vec<String> = HARMFUL
        .iter()
        .filter_map(|(bit, name)| match seen(*bit) {
            0 => None,
            k => Some(format!("{name} in {k} of {n} reads")),
        })
        .collect();
    let capped = seen(ThrottleReasons::SW_POWER_CAP);
    // A clock or throttle reason NVML never gave is a load nobody watched: not a pass.
    let unread: Vec<&str> = [
        (clocks.is_empty(), "the SM clock"),
        (
            w.samples.iter().all(|s| s.throttle.is_none()),
            "the throttle reasons",
        ),
    ]
    .into_iter()
    .filter_map(|(missing, what)| missing.then_some(what))
    .collect();
    if !unread.is_empty() && harmful.is_empty() {
        report.push(
            PHASE,
            format!("{tag} clocks under load"),
            Status::Fail,
            format!(
                "not measured: none of NVML's {n} reads gave {}",
                unread.join(" or ")
            ),
        );
    } else if harmful.is_empty() {
        let cap = if capped > 0 {
            format!("; held at its power limit in {capped} of {n} reads, as a full load should be")
        } else {
            String::new()
        };
        report.push(
            PHASE,
            format!("{tag} clocks under load"),
            Status::Pass,
            format!("{clock_text}{cap}"),
        );
    } else {
        report.push(
            PHASE,
            format!("{tag} clocks under load"),
            Status::Fail,
            format!("{}; {clock_text}", harmful.join(", ")),
        );
    }

    let hottest = w.samples.iter().filter_map(|s| s.temperature_c).max();
    let (status, detail) = match (hottest, w.slowdown_c) {
        (None, _) => (
            Status::Fail,
            format!("not measured: none of NVML's {n} reads gave the temperature"),
        ),
        (Some(t), Some(limit)) if t >= limit => (
            Status::Fail,
            format!("{t} °C, at or past the {limit} °C where it slows itself: cooling"),
        ),
        (Some(t), Some(limit)) if t + 5 >= limit => (
            Status::Warn,
            format!("{t} °C, within 5 °C of the {limit} °C where it slows itself"),
        ),
        (Some(t), Some(limit)) => (
            Status::Pass,
            format!("highest {t} °C (slows at {limit} °C)"),
        ),
        (Some(t), None) => (Status::Pass, format!("highest {t} °C")),
    };
    report.push(
        PHASE,
        format!("{tag} temperature under load"),
        status,
        detail,
    );

    let (status, detail) = memory_errors(&w.before, &w.after);
    report.push(
        PHASE,
        format!("{tag} memory errors under load"),
        status,
        detail,
    );
}

/// The memory counters' movement during the burn.
pub fn memory_errors(before: &Counters, after: &Counters) -> (Status, String) {
    let grew = |b: Option<u64>, a: Option<u64>| match (b, a) {
        (Some(b), Some(a)) if a > b => Some(a - b),
        _ => None,
    };
    let mut fail = Vec::new();
    if let Some(k) = grew(before.ecc_uncorrected, after.ecc_uncorrected) {
        fail.push(format!("{k} uncorrected ECC errors"));
    }
    if let Some(k) = grew(
        before.rows_uncorrectable.map(u64::from),
        after.rows_uncorrectable.map(u64::from),
    ) {
        fail.push(format!("{k} rows remapped for uncorrectable errors"));
    }
    if after.remap_failed == Some(true) {
        fail.push("a row remap failed".into());
    }
    if after.remap_pending == Some(true) {
        fail.push("a row remap waits for a GPU reset".into());
    }
    if after.pages_pending == Some(true) {
        fail.push("pages wait to be retired".into());
    }
    if !fail.is_empty() {
        return (Status::Fail, fail.join(", "));
    }
    // A counter read on one side of the burn only cannot show what moved during it.
    let one_sided: Vec<&str> = [
        (
            before.ecc_uncorrected.is_some(),
            after.ecc_uncorrected.is_some(),
            "uncorrected ECC",
        ),
        (
            before.ecc_corrected.is_some(),
            after.ecc_corrected.is_some(),
            "corrected ECC",
        ),
        (
            before.rows_uncorrectable.is_some(),
            after.rows_uncorrectable.is_some(),
            "remapped rows",
        ),
    ]
    .into_iter()
    .filter_map(|(b, a, what)| (b != a).then_some(what))
    .collect();
    if !one_sided.is_empty() {
        return (
            Status::Fail,
            format!(
                "not measured: {} read on one side of the burn only",
                one_sided.join(", ")
            ),
        );
    }
    if let Some(k) = grew(before.ecc_corrected, after.ecc_corrected) {
        return (
            Status::Warn,
            format!("{k} corrected ECC errors during the burn"),
        );
    }
    if after.ecc_uncorrected.is_none() && after.rows_uncorrectable.is_none() {
        return (
            Status::Warn,
            "NVML reports neither ECC counts nor remapped rows".into(),
        );
    }
    (
        Status::Pass,
        "no ECC error, no row remapped or pending".into(),
    )
}

/// The median of the batches after the first (which carries cuBLAS's start).
pub fn median_rate(tflops: &[f64]) -> Option<f64> {
    let mut steady: Vec<f64> = tflops.iter().skip(1).copied().collect();
    if steady.is_empty() {
        steady = tflops.to_vec();
    }
    steady.sort_by(f64::total_cmp);
    steady.get(steady.len() / 2).copied()
}

/// The GEMMs' rate against the floor, and their results against the first and the CPU's.
pub fn judge_gemm(tag: &str, m: &Measured, floor: Option<&(f64, String)>, report: &mut Report) {
    match median_rate(&m.tflops) {
        None => report.push(
            PHASE,
            format!("{tag} GEMM rate"),
            Status::Fail,
            "no GEMM was timed",
        ),
        Some(rate) => {
            let lowest = m.tflops.iter().copied().fold(f64::INFINITY, f64::min);
            let what = format!(
                "{rate:.0} TFLOP/s median over {} GEMMs in {:.0} s (lowest batch {lowest:.0})",
                m.gemms, m.seconds
            );
            let (status, detail) = match floor {
                Some((floor, model)) if rate < *floor => (
                    Status::Fail,
                    format!("{what}, below the {floor:.0} TFLOP/s floor of {model}"),
                ),
                Some((floor, model)) => (
                    Status::Pass,
                    format!(
                        "{what}: {:.0}% of the {floor:.0} TFLOP/s floor of {model}",
                        rate / floor * 100.0
                    ),
                ),
                None => (Status::Pass, format!("{what}; no floor for this model")),
            };
            report.push(PHASE, format!("{tag} GEMM rate"), status, detail);
        }
    }
    let compared = |c: &Comparison, against: &str| match (&c.first, c.wrong) {
        (_, 0) if c.checked > 0 => (
            Status::Pass,
            format!("{} elements equal to {against}, bit for bit", c.checked),
        ),
        (_, 0) => (Status::Fail, "nothing was compared".to_string()),
        (first, wrong) => (
            Status::Fail,
            format!(
                "{wrong} of {} elements differ from {against}: silent data corruption{}",
                c.checked,
                first
                    .as_ref()
                    .map(|f| format!(" (first: {f})"))
                    .unwrap_or_default()
            ),
        ),
    };
    let (s, d) = compared(
        &m.repeat,
        &format!("the first result over {} readbacks", m.readbacks),
    );
    report.push(PHASE, format!("{tag} GEMM repeats"), s, d);
    let (s, d) = compared(&m.reference, "the CPU's exact tiles");
    report.push(PHASE, format!("{tag} GEMM against the CPU"), s, d);
    let p = &m.product;
    let (s, d) = match (p.checked, p.wrong) {
        (0, _) => (Status::Fail, "nothing was compared".to_string()),
        (rows, 0) => (
            Status::Pass,
            format!(
                "every element: {rows} rows of C·x equal to A·(B·x) for random x, exactly \
                 in integers (Freivalds' check of the first and last results)"
            ),
        ),
        (rows, wrong) => (
            Status::Fail,
            format!(
                "{wrong} of {rows} rows of C·x differ from A·(B·x): silent data corruption{}",
                p.first
                    .as_ref()
                    .map(|f| format!(" (first: {f})"))
                    .unwrap_or_default()
            ),
        ),
    };
    report.push(PHASE, format!("{tag} GEMM whole product"), s, d);
}

/// Every GPU's first result against the others': one GPU has nothing to be compared with.
pub fn judge_across(digests: &[(String, String)], report: &mut Report) {
    const NAME: &str = "GEMM across GPUs";
    if digests.len() < 2 {
        report.push(
            PHASE,
            NAME,
            Status::Skip,
            "one GPU: no other result to compare with",
        );
        return;
    }
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for (_, d) in digests {
        *counts.entry(d).or_default() += 1;
    }
    if counts.len() == 1 {
        report.push(
            PHASE,
            NAME,
            Status::Pass,
            format!("{} GPUs, one result bit for bit", digests.len()),
        );
        return;
    }
    let most = counts.values().copied().max().expect("two or more");
    let common: Vec<&str> = counts
        .iter()
        .filter(|(_, n)| **n == most)
        .map(|(d, _)| *d)
        .collect();
    if common.len() > 1 {
        // No result most GPUs agree on (two GPUs that differ): which is wrong is for each
        // GPU's own checks against the CPU to say, not for this one to guess.
        report.push(
            PHASE,
            NAME,
            Status::Fail,
            format!(
                "{} give {} different results and no majority: silent data corruption on at \
                 least one (their checks against the CPU say which, if they can)",
                digests
                    .iter()
                    .map(|(tag, _)| tag.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                counts.len()
            ),
        );
        return;
    }
    let common = common[0];
    let odd: Vec<&str> = digests
        .iter()
        .filter(|(_, d)| d.as_str() != common)
        .map(|(tag, _)| tag.as_str())
        .collect();
    report.push(
        PHASE,
        NAME,
        Status::Fail,
        format!(
            "{} differ from the others' result: silent data corruption",
            odd.join(", ")
        ),
    );
}

/// One GPU's burn as the JSON report and the metrics carry it.
fn summarise(gpu: &nvml::Gpu, w: &Watch, m: &Measured) -> serde_json::Value {
    let median = |mut v: Vec<u32>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied()
    };
    let throttle: Vec<&str> = HARMFUL
        .iter()
        .chain(std::iter::once(&(
            ThrottleReasons::SW_POWER_CAP,
            "software power cap",
        )))
        .filter(|(bit, _)| {
            w.samples
                .iter()
                .any(|s| s.throttle.is_some_and(|t| t & bit.bits() != 0))
        })
        .map(|(_, name)| *name)
        .collect();
    json!({
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "seconds": m.seconds,
        "gemms": m.gemms,
        "tflops_median": median_rate(&m.tflops),
        "tflops_min": m.tflops.iter().copied().reduce(f64::min),
        "sm_mhz_median": median(w.samples.iter().filter_map(|s| s.sm_mhz).collect()),
        "sm_mhz_min": w.samples.iter().filter_map(|s| s.sm_mhz).min(),
        "power_w_max": w.samples.iter().filter_map(|s| s.power_mw).max().map(|p| f64::from(p) / 1000.0),
        "temperature_c_max": w.samples.iter().filter_map(|s| s.temperature_c).max(),
        "samples": w.samples.len(),
        "throttle": throttle,
        "counters_before": w.before,
        "counters_after": w.after,
        "repeat_wrong": m.repeat.wrong,
        "reference_wrong": m.reference.wrong,
        "product_wrong_rows": m.product.wrong,
        "sha256": m.sha256,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statuses(report: &Report) -> Vec<(String, Status)> {
        report
            .checks
            .iter()
            .map(|c| (c.name.clone(), c.status))
            .collect()
    }

    fn watch(throttle: u64, temp: u32) -> Watch {
        Watch {
            index: 0,
            max_sm_mhz: Some(1980),
            power_limit_mw: Some(700_000),
            slowdown_c: Some(90),
            samples: vec![
                Sample {
                    sm_mhz: Some(1755),
                    throttle: Some(0),
                    power_mw: Some(690_000),
                    temperature_c: Some(60),
                },
                Sample {
                    sm_mhz: Some(1600),
                    throttle: Some(throttle),
                    power_mw: Some(700_000),
                    temperature_c: Some(temp),
                },
            ],
            before: Counters {
                ecc_uncorrected: Some(0),
                ecc_corrected: Some(0),
                rows_uncorrectable: Some(0),
                remap_pending: Some(false),
                remap_failed: Some(false),
                pages_pending: Some(false),
            },
            after: Counters {
                ecc_uncorrected: Some(0),
                ecc_corrected: Some(0),
                rows_uncorrectable: Some(0),
                remap_pending: Some(false),
                remap_failed: Some(false),
                pages_pending: Some(false),
            },
            error: None,
        }
    }

    /// The checks `judge_gemm` makes of `m` on GPU 0, in a report of their own.
    fn gemm_report(m: &Measured, floor: Option<&(f64, String)>) -> Report {
        let mut report = Report::default();
        judge_gemm("GPU 0", m, floor, &mut report);
        report
    }

    fn status_of(report: &Report, name: &str) -> Status {
        report
            .checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name}: {:?}", statuses(report)))
            .status
    }

    #[test]
    fn every_harmful_throttle_reason_fails_and_the_power_cap_passes() {
        for (bit, name) in HARMFUL {
            let mut report = Report::default();
            judge_health("GPU 0", &watch(bit.bits(), 60), &mut report);
            let check = report
                .checks
                .iter()
                .find(|c| c.name == "GPU 0 clocks under load")
                .unwrap();
            assert_eq!(check.status, Status::Fail, "{name}");
            assert!(
                check.detail.contains(name) && check.detail.contains("1 of 2"),
                "{}",
                check.detail
            );
        }
        let mut report = Report::default();
        let capped = ThrottleReasons::SW_POWER_CAP | ThrottleReasons::GPU_IDLE;
        judge_health("GPU 0", &watch(capped.bits(), 60), &mut report);
        assert_eq!(status_of(&report, "GPU 0 clocks under load"), Status::Pass);
        assert!(
            report.checks[0]
                .detail
                .contains("highest 700 W of its 700 W limit"),
            "{}",
            report.checks[0].detail
        );
        // Power is told, not judged: no check of its own that could only pass.
        let names: Vec<String> = statuses(&report).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "GPU 0 clocks under load",
                "GPU 0 temperature under load",
                "GPU 0 memory errors under load"
            ]
        );
        assert!(
            report.checks[0].detail.contains("power limit in 1 of 2"),
            "{}",
            report.checks[0].detail
        );
    }

    #[test]
    fn temperature_is_judged_against_the_gpu_s_own_slowdown_point() {
        for (temp, want) in [
            (60, Status::Pass),
            (85, Status::Warn),
            (90, Status::Fail),
            (95, Status::Fail),
        ] {
            let mut report = Report::default();
            judge_health("GPU 0", &watch(0, temp), &mut report);
            assert_eq!(
                status_of(&report, "GPU 0 temperature under load"),
                want,
                "{temp} °C"
            );
        }
    }

    #[test]
    fn no_reading_or_no_nvml_is_a_failure_not_a_pass() {
        let mut empty = watch(0, 60);
        empty.samples.clear();
        let mut report = Report::default();
        judge_health("GPU 0", &empty, &mut report);
        assert_eq!(
            statuses(&report),
            vec![("GPU 0 health under load".into(), Status::Fail)]
        );
        let mut lost = watch(0, 60);
        lost.error = Some("NVML: GPU is lost".into());
        let mut report = Report::default();
        judge_health("GPU 0", &lost, &mut report);
        assert_eq!(report.checks[0].status, Status::Fail);
        assert!(report.checks[0].detail.contains("GPU is lost"));
    }

    #[test]
    fn a_reading_nvml_never_gave_fails_as_not_measured() {
        type Blank = fn(&mut Sample);
        let cases: [(Blank, &str, &str); 3] = [
            (
                |s| s.sm_mhz = None,
                "GPU 0 clocks under load",
                "the SM clock",
            ),
            (
                |s| s.throttle = None,
                "GPU 0 clocks under load",
                "the throttle reasons",
            ),
            (
                |s| s.temperature_c = None,
                "GPU 0 temperature under load",
                "the temperature",
            ),
        ];
        for (blank, check, words) in cases {
            let mut w = watch(0, 60);
            w.samples.iter_mut().for_each(blank);
            let mut report = Report::default();
            judge_health("GPU 0", &w, &mut report);
            let c = report.checks.iter().find(|c| c.name == check).unwrap();
            assert_eq!(c.status, Status::Fail, "{check}: {}", c.detail);
            assert!(
                c.detail.starts_with("not measured:") && c.detail.contains(words),
                "{}",
                c.detail
            );
            // One read that answered is enough.
            let mut w = watch(0, 60);
            blank(&mut w.samples[0]);
            let mut report = Report::default();
            judge_health("GPU 0", &w, &mut report);
            assert_eq!(status_of(&report, check), Status::Pass, "{check}");
        }
        // A harmful reason read in some reads still names itself, not the unread clock.
        let mut w = watch(ThrottleReasons::HW_SLOWDOWN.bits(), 60);
        w.samples.iter_mut().for_each(|s| s.sm_mhz = None);
        let mut report = Report::default();
        judge_health("GPU 0", &w, &mut report);
        assert!(report.checks[0].detail.starts_with("hardware slowdown"));
    }

    #[test]
    fn a_counter_read_on_one_side_of_the_burn_only_fails() {
        let clean = watch(0, 60).before;
        type Blank = fn(&mut Counters);
        let blanks: [(Blank, &str); 3] = [
            (|c| c.ecc_uncorrected = None, "uncorrected ECC"),
            (|c| c.ecc_corrected = None, "corrected ECC"),
            (|c| c.rows_uncorrectable = None, "remapped rows"),
        ];
        for (blank, words) in blanks {
            let mut unread = clean.clone();
            blank(&mut unread);
            for (before, after) in [(&clean, &unread), (&unread, &clean)] {
                let (status, detail) = memory_errors(before, after);
                assert_eq!(status, Status::Fail, "{detail}");
                assert!(
                    detail.starts_with("not measured:") && detail.contains(words),
                    "{detail}"
                );
            }
        }
        // Growth seen is said before what could not be compared.
        let mut grown = clean.clone();
        grown.ecc_uncorrected = Some(3);
        grown.ecc_corrected = None;
        assert!(memory_errors(&clean, &grown).1.contains("3 uncorrected"));
    }

    #[test]
    fn each_memory_counter_that_moves_fails_and_corrected_errors_warn() {
        let clean = watch(0, 60).before;
        assert_eq!(memory_errors(&clean, &clean).0, Status::Pass);
        type Change = Box<dyn Fn(&mut Counters)>;
        let cases: Vec<(Change, Status, &str)> = vec![
            (
                Box::new(|c| c.ecc_uncorrected = Some(2)),
                Status::Fail,
                "2 uncorrected",
            ),
            (
                Box::new(|c| c.rows_uncorrectable = Some(1)),
                Status::Fail,
                "1 rows remapped",
            ),
            (
                Box::new(|c| c.remap_failed = Some(true)),
                Status::Fail,
                "remap failed",
            ),
            (
                Box::new(|c| c.remap_pending = Some(true)),
                Status::Fail,
                "GPU reset",
            ),
            (
                Box::new(|c| c.pages_pending = Some(true)),
                Status::Fail,
                "retired",
            ),
            (
                Box::new(|c| c.ecc_corrected = Some(5)),
                Status::Warn,
                "5 corrected",
            ),
        ];
        for (change, want, words) in cases {
            let mut after = clean.clone();
            change(&mut after);
            let (status, detail) = memory_errors(&clean, &after);
            assert_eq!(status, want, "{detail}");
            assert!(detail.contains(words), "{detail}");
        }
        // A failure and a warning at once: the failure is what is said.
        let mut both = clean.clone();
        both.ecc_corrected = Some(5);
        both.remap_pending = Some(true);
        assert_eq!(memory_errors(&clean, &both).0, Status::Fail);
        // Counters NVML does not report cannot pass as clean.
        assert_eq!(
            memory_errors(&Counters::default(), &Counters::default()).0,
            Status::Warn
        );
    }

    fn measured(tflops: Vec<f64>, repeat_wrong: u64, reference_wrong: u64) -> Measured {
        let cmp = |wrong| Comparison {
            checked: 1000,
            wrong,
            first: (wrong > 0).then(|| "C[0,0] = 1e0, expected 1.0000001e0".to_string()),
        };
        Measured {
            seconds: 10.0,
            gemms: 100,
            tflops,
            readbacks: 3,
            repeat: cmp(repeat_wrong),
            reference: cmp(reference_wrong),
            product: cmp(0),
            sha256: "x".into(),
        }
    }

    #[test]
    fn the_rate_is_the_steady_median_against_the_model_s_floor() {
        // The first batch (cuBLAS's start) does not count.
        assert_eq!(median_rate(&[10.0, 700.0, 710.0, 690.0]), Some(700.0));
        assert_eq!(median_rate(&[]), None);
        let floor = (600.0, "H200 SXM".to_string());
        for (rates, want) in [
            (vec![1.0, 700.0, 700.0], Status::Pass),
            (vec![700.0, 500.0, 550.0], Status::Fail),
        ] {
            let report = gemm_report(&measured(rates, 0, 0), Some(&floor));
            assert_eq!(status_of(&report, "GPU 0 GEMM rate"), want);
        }
        let report = gemm_report(&measured(vec![], 0, 0), Some(&floor));
        assert_eq!(status_of(&report, "GPU 0 GEMM rate"), Status::Fail);
    }

    #[test]
    fn any_differing_element_is_silent_corruption() {
        for (repeat, reference) in [(1, 0), (0, 1), (3, 2)] {
            let report = gemm_report(&measured(vec![700.0], repeat, reference), None);
            let want = |w: u64| if w > 0 { Status::Fail } else { Status::Pass };
            assert_eq!(status_of(&report, "GPU 0 GEMM repeats"), want(repeat));
            assert_eq!(
                status_of(&report, "GPU 0 GEMM against the CPU"),
                want(reference)
            );
        }
        let mut nothing = measured(vec![700.0], 0, 0);
        nothing.repeat.checked = 0;
        let report = gemm_report(&nothing, None);
        assert_eq!(status_of(&report, "GPU 0 GEMM repeats"), Status::Fail);
    }

    #[test]
    fn a_row_of_the_whole_product_that_differs_fails_and_nothing_compared_fails() {
        let mut m = measured(vec![700.0], 0, 0);
        let report = gemm_report(&m, None);
        assert_eq!(status_of(&report, "GPU 0 GEMM whole product"), Status::Pass);
        m.product.wrong = 1;
        m.product.first = Some("row 4000: C·x = 1, A·(B·x) = 2".into());
        let report = gemm_report(&m, None);
        let c = report
            .checks
            .iter()
            .find(|c| c.name == "GPU 0 GEMM whole product")
            .unwrap();
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("row 4000"), "{}", c.detail);
        // The other comparisons are their own checks: a repeated fault passes them.
        assert_eq!(status_of(&report, "GPU 0 GEMM repeats"), Status::Pass);
        m.product.checked = 0;
        let report = gemm_report(&m, None);
        assert_eq!(status_of(&report, "GPU 0 GEMM whole product"), Status::Fail);
    }

    #[test]
    fn the_gpu_whose_result_differs_is_named() {
        let d = |t: &str, h: &str| (t.to_string(), h.to_string());
        let mut report = Report::default();
        judge_across(&[d("GPU 0", "a")], &mut report);
        assert_eq!(report.checks[0].status, Status::Skip);
        let mut report = Report::default();
        judge_across(&[d("GPU 0", "a"), d("GPU 1", "a")], &mut report);
        assert_eq!(report.checks[0].status, Status::Pass);
        let mut report = Report::default();
        judge_across(
            &[d("GPU 0", "a"), d("GPU 1", "b"), d("GPU 2", "a")],
            &mut report,
        );
        assert_eq!(report.checks[0].status, Status::Fail);
        assert!(
            report.checks[0].detail.starts_with("GPU 1 differ"),
            "{}",
            report.checks[0].detail
        );
        // Two that differ, or a tie: every GPU is named and none is blamed.
        for digests in [
            vec![d("GPU 0", "a"), d("GPU 1", "b")],
            vec![
                d("GPU 0", "a"),
                d("GPU 1", "b"),
                d("GPU 2", "a"),
                d("GPU 3", "b"),
            ],
        ] {
            let mut report = Report::default();
            judge_across(&digests, &mut report);
            let c = &report.checks[0];
            assert_eq!(c.status, Status::Fail);
            assert!(
                c.detail.contains("no majority")
                    && digests.iter().all(|(t, _)| c.detail.contains(t.as_str())),
                "{}",
                c.detail
            );
        }
    }
}
