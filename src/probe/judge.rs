//! The verdicts on what the workers measured: each GPU's memory bandwidth against its own
//! model's floor, each P2P pair against the lower floor of its two GPUs, the bundled
//! all-reduce's results and bandwidth, and NCCL beside it. A value the worker did not return
//! is "not measured" with its reason, never 0 GB/s held against a floor.

use super::cuda::normalise_bus_id;
use super::nvml::Gpu;
use super::policy::{self, ModelPolicy};
use super::report::{Report, Status};
use serde_json::{Value, json};

/// Below this size an all-reduce's buffers stay in the GPU's cache, so its bandwidth says
/// nothing about links or memory.
pub const SMALLEST_BANDWIDTH_SIZE: u64 = 64 << 20;

/// The bundled two-shot all-reduce's busbw floor, as a share of the GPUs' P2P copy floor. On
/// 2x H200 the kernel reached 317 GB/s busbw at 64 MiB against a 394 GB/s one-way P2P copy
/// (docs/results-h200.md), 0.8 of it; half the P2P floor leaves room for more GPUs and for
/// NVSwitch, which were not measured.
pub const ALLREDUCE_SHARE_OF_P2P_FLOOR: f64 = 0.5;

/// One GPU being measured, as NVML and the policy know it.
#[derive(Clone, Debug)]
pub struct GpuUnderTest {
    /// NVML index: the number the report names it by.
    pub index: u32,
    /// NVML's model name.
    pub name: String,
    /// PCI address, normalised (`0000:1b:00.0`); how the worker finds its CUDA device.
    pub pci_bus_id: Option<String>,
    /// Its own model's policy entry.
    pub policy: Option<ModelPolicy>,
}

impl GpuUnderTest {
    fn label(&self) -> String {
        format!("GPU {}", self.index)
    }
}

/// Each GPU with the policy entry of its own model.
pub fn under_test(gpus: &[Gpu], policy: &[ModelPolicy]) -> Vec<GpuUnderTest> {
    gpus.iter()
        .map(|g| GpuUnderTest {
            index: g.index,
            name: g.name.clone(),
            pci_bus_id: normalise_bus_id(&g.pci_bus_id),
            policy: policy::for_gpu(policy, &g.name).cloned(),
        })
        .collect()
}

/// When the GPUs are not all one model, which are which. Mixed nodes are legal, but a
/// collective runs at the pace of the slowest GPU, which the reader should know.
pub fn mixed_models(gpus: &[Gpu]) -> Option<String> {
    let mut models: Vec<(&str, Vec<String>)> = Vec::new();
    for g in gpus {
        match models.iter_mut().find(|(name, _)| *name == g.name) {
            Some((_, indices)) => indices.push(g.index.to_string()),
            None => models.push((&g.name, vec![g.index.to_string()])),
        }
    }
    if models.len() < 2 {
        return None;
    }
    let groups: Vec<String> = models
        .iter()
        .map(|(name, indices)| {
            format!(
                "{name} (GPU{} {})",
                if indices.len() > 1 { "s" } else { "" },
                indices.join(", ")
            )
        })
        .collect();
    Some(format!(
        "GPUs of different models: {}; each GPU is held to its own model's floors, pairs and the all-reduce to the lower of theirs",
        groups.join(", ")
    ))
}

/// Whether the workers are asked for NCCL runs, and if not, why: the reason a NCCL check
/// is skipped rather than failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Nccl {
    /// NCCL is timed; a missing figure is a failure.
    Asked,
    /// NCCL is not timed, for this reason.
    NotAsked(String),
}

/// NCCL runs need two GPUs (the one-GPU all-reduce puts several ranks on one GPU, which
/// NCCL refuses), an NCCL in the image, and the time `--quick` does not give.
pub fn nccl_plan(nccl_in_image: bool, quick: bool, gpus: usize) -> Nccl {
    if gpus < 2 {
        Nccl::NotAsked("needs two or more GPUs".into())
    } else if !nccl_in_image {
        Nccl::NotAsked(
            "no libnccl.so.2 in the image (Python environments and library path): nothing to compare with".into(),
        )
    } else if quick {
        Nccl::NotAsked("not run with --quick (NCCL takes seconds to start)".into())
    } else {
        Nccl::Asked
    }
}

/// The CUDA ordinal the worker gave `gpu`, from the result's `devices`.
fn ordinal_of(v: &Value, gpu: &GpuUnderTest) -> Option<u64> {
    let wanted = gpu.pci_bus_id.as_deref()?;
    v["devices"].as_array()?.iter().find_map(|d| {
        let id = normalise_bus_id(d["pci_bus_id"].as_str()?)?;
        (id == wanted).then(|| d["cuda_ordinal"].as_u64()).flatten()
    })
}

/// The GPU at position `pos` of the worker's device list (the peer-access matrix's order).
fn at_position<'a>(v: &Value, gpus: &'a [GpuUnderTest], pos: usize) -> Option<&'a GpuUnderTest> {
    let id = normalise_bus_id(v["devices"].get(pos)?["pci_bus_id"].as_str()?)?;
    gpus.iter()
        .find(|g| g.pci_bus_id.as_deref() == Some(id.as_str()))
}

/// Why a value is absent: the worker's own error, or that it returned nothing.
fn why_absent(entry: Option<&Value>) -> String {
    match entry.and_then(|e| e["error"].as_str()) {
        Some(e) => e.to_string(),
        None => "the worker returned no value".to_string(),
    }
}

/// The floor two GPUs are held to over their link: the lower of their models' P2P floors,
/// with words for where it comes from. Err names a GPU whose model has no entry.
fn pair_floor(a: &GpuUnderTest, b: &GpuUnderTest) -> Result<(f64, String), String> {
    let (pa, pb) = match (&a.policy, &b.policy) {
        (Some(pa), Some(pb)) => (pa, pb),
        (None, _) => return Err(format!("no floor for {}", a.name)),
        (_, None) => return Err(format!("no floor for {}", b.name)),
    };
    if pa.model == pb.model {
        return Ok((
            pa.p2p_gbps_floor,
            format!("the {} floor of {:.0}", pa.model, pa.p2p_gbps_floor),
        ));
    }
    let low = if pa.p2p_gbps_floor <= pb.p2p_gbps_floor {
        pa
    } else {
        pb
    };
    Ok((
        low.p2p_gbps_floor,
        format!(
            "the lower floor of {} ({:.0}) and {} ({:.0})",
            pa.model, pa.p2p_gbps_floor, pb.model, pb.p2p_gbps_floor
        ),
    ))
}

/// How the worker's CUDA ordinals line up with NVML's GPUs, checked by PCI address.
pub fn device_mapping(v: &Value, gpus: &[GpuUnderTest], report: &mut Report) {
    let mut pairs = Vec::new();
    let mut missing = Vec::new();
    for g in gpus {
        match ordinal_of(v, g) {
            Some(o) => pairs.push(format!(
                "{} = CUDA {o} ({})",
                g.label(),
                g.pci_bus_id.as_deref().unwrap_or("?")
            )),
            None => missing.push(g.label()),
        }
    }
    if missing.is_empty() {
        report.push("cuda", "CUDA devices", Status::Pass, pairs.join(", "));
    } else {
        report.push(
            "cuda",
            "CUDA devices",
            Status::Fail,
            format!(
                "no CUDA device at the PCI address of {}; found: {}",
                missing.join(", "),
                pairs.join(", ")
            ),
        );
    }
}

/// Peer access, each GPU's memory bandwidth, and each pair's P2P copies.
pub fn cuda_checks(v: &Value, gpus: &[GpuUnderTest], report: &mut Report) {
    const PHASE: &str = "cuda";
    device_mapping(v, gpus, report);
    let peer = v["peer_access"].as_array().cloned().unwrap_or_default();
    let name_at = |pos: usize| {
        at_position(v, gpus, pos)
            .map(GpuUnderTest::label)
            .unwrap_or_else(|| format!("CUDA device {pos}"))
    };
    let mut blocked = Vec::new();
    for (i, row) in peer.iter().enumerate() {
        for (j, ok) in row.as_array().into_iter().flatten().enumerate() {
            if i != j && ok != &json!(true) {
                blocked.push(format!("{}->{}", name_at(i), name_at(j)));
            }
        }
    }
    if gpus.len() > 1 {
        let n = gpus.len();
        report.push(
            PHASE,
            "peer access",
            if blocked.is_empty() && peer.len() == n {
                Status::Pass
            } else {
                Status::Fail
            },
            if peer.len() != n {
                format!("not measured: the worker returned no matrix for {n} GPUs")
            } else if blocked.is_empty() {
                format!("all {} pairs", n * (n - 1))
            } else {
                format!("no peer access: {}", blocked.join(", "))
            },
        );
    }

    let empty = Vec::new();
    let memory = v["memory"].as_array().unwrap_or(&empty);
    for g in gpus {
        let name = format!("{} memory bandwidth", g.label());
        let entry =
            ordinal_of(v, g).and_then(|o| memory.iter().find(|m| m["gpu"].as_u64() == Some(o)));
        let Some(gbps) = entry.and_then(|m| m["gbps"].as_f64()) else {
            report.push(
                PHASE,
                name,
                Status::Fail,
                format!("not measured: {}", why_absent(entry)),
            );
            continue;
        };
        match &g.policy {
            Some(p) if gbps < p.memory_gbps_floor => report.push(
                PHASE,
                name,
                Status::Fail,
                format!(
                    "{gbps:.0} GB/s copy (read+write), below the {} floor of {:.0}",
                    p.model, p.memory_gbps_floor
                ),
            ),
            Some(p) => report.push(
                PHASE,
                name,
                Status::Pass,
                format!(
                    "{gbps:.0} GB/s copy (read+write); floor {:.0} for {}",
                    p.memory_gbps_floor, p.model
                ),
            ),
            None => report.push(
                PHASE,
                name,
                Status::Pass,
                format!("{gbps:.0} GB/s copy (read+write); no floor for {}", g.name),
            ),
        }
    }

    let p2p = v["p2p"].as_array().unwrap_or(&empty);
    for a in gpus {
        for b in gpus {
            if a.index == b.index {
                continue;
            }
            let name = format!("P2P {}->{}", a.index, b.index);
            let (oa, ob) = (ordinal_of(v, a), ordinal_of(v, b));
            let entry = p2p
                .iter()
                .find(|p| oa.is_some() && p["from"].as_u64() == oa && p["to"].as_u64() == ob);
            let measured = entry.and_then(|p| p["gbps"].as_f64().map(|gbps| (p, gbps)));
            let Some((entry, gbps)) = measured else {
                let why = if entry.is_none()
                    && blocked.contains(&format!("{}->{}", a.label(), b.label()))
                {
                    "no peer access between them".to_string()
                } else {
                    why_absent(entry)
                };
                report.push(PHASE, name, Status::Fail, format!("not measured: {why}"));
                continue;
            };
            let both = entry["bidir_gbps"]
                .as_f64()
                .map(|b| format!("{b:.0} GB/s both ways"))
                .unwrap_or_else(|| "both ways not measured".into());
            let small = entry["small_copy_us"]
                .as_f64()
                .map(|t| format!("a 4-byte copy every {t:.1} µs back to back"))
                .unwrap_or_else(|| "small copies not measured".into());
            let detail = format!("{gbps:.0} GB/s one way, {both}, {small}");
            match pair_floor(a, b) {
                Ok((floor, source)) if gbps < floor => report.push(
                    PHASE,
                    name,
                    Status::Fail,
                    format!("{detail}; below {source}"),
                ),
                Ok((_, source)) => {
                    report.push(PHASE, name, Status::Pass, format!("{detail}; {source}"))
                }
                Err(no_floor) => {
                    report.push(PHASE, name, Status::Pass, format!("{detail}; {no_floor}"))
                }
            }
        }
    }
}

/// The floor of the bundled all-reduce's busbw across `gpus`: a share of the lowest P2P
/// floor among them, where every GPU talks over NVLink. Err says why there is none.
fn allreduce_floor(gpus: &[GpuUnderTest]) -> Result<(f64, String), String> {
    let mut lowest: Option<&ModelPolicy> = None;
    for g in gpus {
        let Some(p) = &g.policy else {
            return Err(format!("no floor for {}", g.name));
        };
        if p.link != "nvlink" {
            return Err(format!(
                "{} talks over PCIe: the kernel's peer loads over PCIe were never measured, so there is no floor",
                p.model
            ));
        }
        if lowest.is_none_or(|l| p.p2p_gbps_floor < l.p2p_gbps_floor) {
            lowest = Some(p);
        }
    }
    let p = lowest.ok_or("no GPU")?;
    let floor = p.p2p_gbps_floor * ALLREDUCE_SHARE_OF_P2P_FLOOR;
    Ok((
        floor,
        format!(
            "floor {floor:.0}, half the {} P2P floor of {:.0}",
            p.model, p.p2p_gbps_floor
        ),
    ))
}

/// The bundled all-reduce: exact results, its bandwidth against a floor (several GPUs) or
/// against a plain copy (ranks sharing one GPU), and NCCL beside it when NCCL was asked.
pub fn allreduce_checks(
    v: &Value,
    gpus: &[GpuUnderTest],
    per_gpu: usize,
    nccl: &Nccl,
    report: &mut Report,
) {
    const PHASE: &str = "allreduce";
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let ranks = rows.first().and_then(|r| r["ranks"].as_u64()).unwrap_or(0);
    let wrong: Vec<String> = rows
        .iter()
        .filter(|r| r["wrong"].as_u64().unwrap_or(1) > 0)
        .map(|r| {
            format!(
                "{} {} {} B: {} wrong ({})",
                r["dtype"].as_str().unwrap_or(""),
                r["algo"].as_str().unwrap_or(""),
                r["bytes"],
                r["wrong"],
                r["first_wrong"].as_str().unwrap_or("")
            )
        })
        .collect();
    let checked: u64 = rows
        .iter()
        .map(|r| r["checked"].as_u64().unwrap_or(0))
        .sum();
    let placement = if per_gpu > 1 {
        format!("{ranks} ranks on one GPU")
    } else {
        format!("{ranks} ranks, one per GPU")
    };
    report.push(
        PHASE,
        "results",
        if wrong.is_empty() && !rows.is_empty() {
            Status::Pass
        } else {
            Status::Fail
        },
        if rows.is_empty() {
            "not measured: the worker returned no all-reduce".to_string()
        } else if wrong.is_empty() {
            format!(
                "{} cases, {checked} elements bit-identical to the CPU reference ({placement}, NVRTC {})",
                rows.len(),
                v["nvrtc"].as_str().unwrap_or("?")
            )
        } else {
            wrong.join("; ")
        },
    );

    let largest = rows
        .iter()
        .filter(|r| r["dtype"] == "f32" && r["algo"] == "two-shot")
        .max_by_key(|r| r["bytes"].as_u64().unwrap_or(0));
    let Some(row) = largest else {
        report.push(
            PHASE,
            "bandwidth",
            Status::Fail,
            "not measured: no float32 two-shot row in the worker's result",
        );
        return;
    };
    let bytes = row["bytes"].as_u64().unwrap_or(0);
    if per_gpu > 1 {
        throughput_vs_copy(v, row, bytes, report);
        return;
    }

    let name = "all-reduce busbw";
    match (
        bytes >= SMALLEST_BANDWIDTH_SIZE,
        row["busbw"].as_f64(),
        allreduce_floor(gpus),
    ) {
        (false, _, _) => report.push(
            PHASE,
            name,
            Status::Skip,
            format!("the largest size, {bytes} B, stays in the GPUs' caches; use 64 MiB or more"),
        ),
        (true, None, _) => report.push(
            PHASE,
            name,
            Status::Fail,
            "not measured: the worker returned no time for the largest size",
        ),
        (true, Some(busbw), Err(why)) => report.push(
            PHASE,
            name,
            Status::Skip,
            format!("{busbw:.0} GB/s at {bytes} B; {why}"),
        ),
        (true, Some(busbw), Ok((floor, source))) => report.push(
            PHASE,
            name,
            if busbw < floor {
                Status::Fail
            } else {
                Status::Pass
            },
            format!(
                "{busbw:.0} GB/s at {bytes} B{}; {source}",
                if busbw < floor {
                    ", below the floor"
                } else {
                    ""
                }
            ),
        ),
    }

    let name = "busbw vs NCCL";
    match nccl {
        Nccl::NotAsked(why) => report.push(PHASE, name, Status::Skip, why.clone()),
        Nccl::Asked => match (row["busbw"].as_f64(), row["nccl_busbw"].as_f64()) {
            (Some(ours), Some(theirs)) if theirs > 0.0 => {
                let ratio = ours / theirs;
                report.push(
                    PHASE,
                    name,
                    if ratio >= 0.9 {
                        Status::Pass
                    } else {
                        Status::Warn
                    },
                    format!(
                        "{ours:.0} GB/s against NCCL's {theirs:.0} at {bytes} B ({:.0}%)",
                        ratio * 100.0
                    ),
                );
            }
            _ => report.push(
                PHASE,
                name,
                Status::Fail,
                format!(
                    "not measured: {}",
                    row["nccl_error"]
                        .as_str()
                        .unwrap_or("the worker returned no NCCL time")
                ),
            ),
        },
    }
}

/// Ranks sharing one GPU: the two-shot all-reduce's memory traffic against a plain copy.
fn throughput_vs_copy(v: &Value, row: &Value, bytes: u64, report: &mut Report) {
    const NAME: &str = "throughput vs copy";
    if bytes < SMALLEST_BANDWIDTH_SIZE {
        report.push(
            "allreduce",
            NAME,
            Status::Skip,
            format!("the largest size, {bytes} B, stays in the GPU's cache; use 64 MiB or more"),
        );
        return;
    }
    match (row["local_gbps"].as_f64(), v["copy_gbps"].as_f64()) {
        (Some(local), Some(copy)) if copy > 0.0 => {
            let ratio = local / copy;
            report.push(
                "allreduce",
                NAME,
                if ratio >= 0.9 {
                    Status::Pass
                } else {
                    Status::Warn
                },
                format!(
                    "two-shot moves {local:.0} GB/s at {bytes} B, {:.0}% of a plain copy's {copy:.0} GB/s",
                    ratio * 100.0
                ),
            );
        }
        (None, _) => report.push(
            "allreduce",
            NAME,
            Status::Fail,
            "not measured: the worker returned no throughput for the largest size",
        ),
        _ => report.push(
            "allreduce",
            NAME,
            Status::Fail,
            "not measured: the worker returned no plain-copy bandwidth to compare with",
        ),
    }
}

/// NCCL with the image's preset against NCCL's defaults, from the two runs' busbw at the
/// largest size.
pub fn preset_verdict(with_preset: &Value, defaults: &Value, names: &[&str]) -> (Status, String) {
    let busbw = |v: &Value| {
        v["rows"]
            .as_array()
            .and_then(|r| r.last())
            .and_then(|r| r["busbw"].as_f64())
    };
    let (pa, pb) = match (busbw(with_preset), busbw(defaults)) {
        (Some(pa), Some(pb)) if pb > 0.0 => (pa, pb),
        (None, _) => {
            return (
                Status::Fail,
                "not measured: the run with the preset returned no bandwidth".into(),
            );
        }
        _ => {
            return (
                Status::Fail,
                "not measured: the run with NCCL's defaults returned no bandwidth".into(),
            );
        }
    };
    let ratio = pa / pb;
    (
        if ratio >= 0.95 {
            Status::Pass
        } else {
            Status::Warn
        },
        format!(
            "busbw at 512 MiB: {pa:.0} GB/s with the preset ({}), {pb:.0} with NCCL's defaults: the preset {} ({:+.0}%)",
            names.join(" "),
            if ratio >= 1.05 {
                "helps"
            } else if ratio >= 0.95 {
                "is neutral"
            } else {
                "hurts"
            },
            (ratio - 1.0) * 100.0
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, name: &str, bus: &str) -> Gpu {
        Gpu {
            index,
            name: name.into(),
            uuid: String::new(),
            arch: "9.0".into(),
            brand: "nvidia".into(),
            memory_total: 0,
            pci_bus_id: bus.into(),
        }
    }

    /// An H200 and an A100 SXM 80GB; CUDA numbered them the other way round.
    fn mixed() -> (Vec<Gpu>, Vec<GpuUnderTest>) {
        let gpus = vec![
            gpu(0, "NVIDIA H200", "00000000:1B:00.0"),
            gpu(1, "NVIDIA A100-SXM4-80GB", "00000000:43:00.0"),
        ];
        let under = under_test(&gpus, policy::embedded());
        (gpus, under)
    }

    fn devices() -> Value {
        json!([
            {"cuda_ordinal": 1, "pci_bus_id": "0000:1b:00.0"},
            {"cuda_ordinal": 0, "pci_bus_id": "0000:43:00.0"}
        ])
    }

    fn check<'a>(report: &'a Report, name: &str) -> &'a super::super::report::Check {
        report
            .checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no check {name}: {:#?}", report.checks))
    }

    #[test]
    fn each_gpu_is_held_to_its_own_model() {
        let (gpus, under) = mixed();
        // 3000 GB/s passes an A100 80GB (floor 1400) but not an H200 (floor 3600).
        let v = json!({
            "devices": devices(),
            "peer_access": [[true, true], [true, true]],
            "memory": [{"gpu": 1, "gbps": 4200.0}, {"gpu": 0, "gbps": 3000.0}],
            "p2p": [
                {"from": 1, "to": 0, "gbps": 250.0, "bidir_gbps": 480.0, "small_copy_us": 2.8},
                {"from": 0, "to": 1, "gbps": 150.0, "bidir_gbps": 480.0, "small_copy_us": 2.8}
            ]
        });
        let mut report = Report::default();
        cuda_checks(&v, &under, &mut report);
        assert_eq!(
            check(&report, "GPU 0 memory bandwidth").status,
            Status::Pass
        );
        let a100 = check(&report, "GPU 1 memory bandwidth");
        assert_eq!(a100.status, Status::Pass, "{}", a100.detail);
        assert!(a100.detail.contains("A100 SXM 80GB"), "{}", a100.detail);
        // The pair is held to the lower of the two floors: 200, not the H200's 300.
        let forth = check(&report, "P2P 0->1");
        assert_eq!(forth.status, Status::Pass, "{}", forth.detail);
        assert!(forth.detail.contains("lower floor"), "{}", forth.detail);
        // Queued 4-byte copies are not a round trip: not called latency.
        assert!(
            forth
                .detail
                .contains("a 4-byte copy every 2.8 µs back to back")
                && !forth.detail.contains("latency"),
            "{}",
            forth.detail
        );
        assert_eq!(check(&report, "P2P 1->0").status, Status::Fail);
        assert!(
            check(&report, "CUDA devices")
                .detail
                .contains("GPU 0 = CUDA 1 (0000:1b:00.0)")
        );
        let warning = mixed_models(&gpus).unwrap();
        assert!(
            warning.contains("NVIDIA H200 (GPU 0)") && warning.contains("A100-SXM4-80GB (GPU 1)"),
            "{warning}"
        );
        assert!(mixed_models(&gpus[..1]).is_none());
    }

    #[test]
    fn a_missing_measurement_fails_as_not_measured() {
        let (_, under) = mixed();
        let v = json!({
            "devices": devices(),
            "peer_access": [[true, false], [true, true]],
            "memory": [{"gpu": 1, "error": "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY"}],
            "p2p": [{"from": 0, "to": 1, "error": "cuMemcpyPeerAsync: CUDA_ERROR_LAUNCH_FAILED"}]
        });
        let mut report = Report::default();
        cuda_checks(&v, &under, &mut report);
        let gpu0 = check(&report, "GPU 0 memory bandwidth");
        assert_eq!(gpu0.status, Status::Fail);
        assert!(
            gpu0.detail.contains("not measured: cuMemAlloc"),
            "{}",
            gpu0.detail
        );
        let gpu1 = check(&report, "GPU 1 memory bandwidth");
        assert_eq!(gpu1.status, Status::Fail);
        assert!(gpu1.detail.starts_with("not measured"), "{}", gpu1.detail);
        let blocked = check(&report, "P2P 0->1");
        assert!(
            blocked.detail.contains("not measured: no peer access"),
            "{}",
            blocked.detail
        );
        let failed = check(&report, "P2P 1->0");
        assert!(
            failed.detail.contains("CUDA_ERROR_LAUNCH_FAILED"),
            "{}",
            failed.detail
        );
        assert!(
            report.checks.iter().all(|c| !c.detail.contains(" 0 GB/s")),
            "{:#?}",
            report.checks
        );

        let (status, detail) = preset_verdict(
            &json!({"rows": []}),
            &json!({"rows": [{"busbw": 300.0}]}),
            &["NCCL_ALGO"],
        );
        assert_eq!(status, Status::Fail);
        assert!(detail.starts_with("not measured"), "{detail}");
    }

    fn two_gpu_allreduce(busbw: Option<f64>, nccl: Value) -> Value {
        let mut row = json!({"dtype": "f32", "algo": "two-shot", "bytes": 64u64 << 20, "ranks": 2,
            "checked": 100, "wrong": 0});
        if let Some(b) = busbw {
            row["busbw"] = json!(b);
        }
        if let Some(fields) = nccl.as_object() {
            for (k, v) in fields {
                row[k] = v.clone();
            }
        }
        json!({"devices": devices(), "nvrtc": "13.0", "rows": [row]})
    }

    #[test]
    fn quick_keeps_a_bandwidth_floor_for_the_bundled_all_reduce() {
        let gpus = [
            gpu(0, "NVIDIA H200", "00000000:1B:00.0"),
            gpu(1, "NVIDIA H200", "00000000:43:00.0"),
        ];
        let under = under_test(&gpus, policy::embedded());
        let quick = nccl_plan(true, true, 2);
        let mut report = Report::default();
        allreduce_checks(
            &two_gpu_allreduce(Some(317.0), json!({})),
            &under,
            1,
            &quick,
            &mut report,
        );
        let busbw = check(&report, "all-reduce busbw");
        assert_eq!(busbw.status, Status::Pass, "{}", busbw.detail);
        assert!(busbw.detail.contains("floor 150"), "{}", busbw.detail);
        assert_eq!(check(&report, "busbw vs NCCL").status, Status::Skip);

        let mut report = Report::default();
        allreduce_checks(
            &two_gpu_allreduce(Some(90.0), json!({})),
            &under,
            1,
            &quick,
            &mut report,
        );
        assert_eq!(check(&report, "all-reduce busbw").status, Status::Fail);

        let mut report = Report::default();
        allreduce_checks(
            &two_gpu_allreduce(None, json!({})),
            &under,
            1,
            &quick,
            &mut report,
        );
        let missing = check(&report, "all-reduce busbw");
        assert_eq!(missing.status, Status::Fail);
        assert!(
            missing.detail.starts_with("not measured"),
            "{}",
            missing.detail
        );
    }

    #[test]
    fn no_nccl_in_the_image_skips_the_nccl_comparison() {
        let (_, under) = mixed();
        let plan = nccl_plan(false, false, 2);
        let Nccl::NotAsked(why) = &plan else {
            panic!("NCCL asked for without a libnccl");
        };
        assert!(why.contains("no libnccl.so.2"), "{why}");
        assert_eq!(
            nccl_plan(true, false, 1),
            Nccl::NotAsked("needs two or more GPUs".into())
        );
        assert_eq!(nccl_plan(true, false, 2), Nccl::Asked);

        let mut report = Report::default();
        allreduce_checks(
            &two_gpu_allreduce(Some(300.0), json!({})),
            &under,
            1,
            &plan,
            &mut report,
        );
        let row = check(&report, "busbw vs NCCL");
        assert_eq!(row.status, Status::Skip);
        assert!(row.detail.contains("no libnccl.so.2"), "{}", row.detail);

        // Asked for and broken is the image's fault: a failure, with NCCL's reason.
        let mut report = Report::default();
        allreduce_checks(
            &two_gpu_allreduce(
                Some(300.0),
                json!({"nccl_error": "ncclCommInitAll: NCCL_ERROR_SYSTEM_ERROR"}),
            ),
            &under,
            1,
            &Nccl::Asked,
            &mut report,
        );
        let row = check(&report, "busbw vs NCCL");
        assert_eq!(row.status, Status::Fail);
        assert!(
            row.detail.contains("not measured: ncclCommInitAll"),
            "{}",
            row.detail
        );
    }
}
