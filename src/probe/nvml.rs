//! The NVML phase: driver and CUDA driver versions, and per GPU its model, memory, ECC and
//! retired pages, persistence and MIG modes, clocks and throttle reasons, PCIe link, NVLink
//! links, plus the topology and P2P-status matrices between GPUs.

use super::policy::{ModelPolicy, for_gpu};
use super::report::Status;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, P2pCapabilitiesIndex, TopologyLevel,
};

use serde::Serialize;

/// One GPU as NVML describes it.
#[derive(Clone, Debug, Serialize)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Model name.
    pub name: String,
    /// UUID.
    pub uuid: String,
    /// Compute capability, `9.0`.
    pub arch: String,
    /// Brand (`Nvidia`, `Tesla`), lower-cased.
    pub brand: String,
    /// Total memory, bytes.
    pub memory_total: u64,
    /// PCIe bus id.
    pub pci_bus_id: String,
}

/// What the phase found, besides its checks.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Facts {
    /// The driver version.
    pub driver: String,
    /// The CUDA version the driver supports, `13.0`.
    pub cuda: String,
    /// The GPUs.
    pub gpus: Vec<Gpu>,
    /// `topology[i][j]`: NVML's common-ancestor level between GPUs i and j.
    pub topology: Vec<Vec<String>>,
    /// `p2p[i][j]`: NVML's P2P read status between GPUs i and j.
    pub p2p: Vec<Vec<String>>,
}

/// A check result before it is placed in the report.
pub type Found = (String, Status, String);

/// Runs the phase. Err means NVML itself could not be used (no library, no driver).
pub fn run(policy: &[ModelPolicy], devices: Option<&[u32]>) -> Result<(Facts, Vec<Found>), String> {
    let nvml = Nvml::init().map_err(|e| format!("NVML did not initialise: {e}"))?;
    let mut checks: Vec<Found> = Vec::new();
    let mut facts = Facts {
        driver: nvml.sys_driver_version().map_err(|e| e.to_string())?,
        ..Facts::default()
    };
    let cuda = nvml.sys_cuda_driver_version().map_err(|e| e.to_string())?;
    facts.cuda = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
    checks.push((
        "driver".into(),
        Status::Pass,
        format!("{} (supports CUDA {})", facts.driver, facts.cuda),
    ));
    let count = nvml.device_count().map_err(|e| e.to_string())?;
    let indices: Vec<u32> = match devices {
        Some(list) => list.iter().copied().filter(|i| *i < count).collect(),
        None => (0..count).collect(),
    };
    let mut handles = Vec::new();
    for &i in &indices {
        let d = nvml
            .device_by_index(i)
            .map_err(|e| format!("GPU {i}: {e}"))?;
        let name = d.name().unwrap_or_else(|_| "unknown".into());
        let cc = d
            .cuda_compute_capability()
            .map(|c| format!("{}.{}", c.major, c.minor))
            .unwrap_or_default();
        let gpu = Gpu {
            index: i,
            uuid: d.uuid().unwrap_or_default(),
            arch: cc,
            brand: d
                .brand()
                .map(|b| format!("{b:?}").to_ascii_lowercase())
                .unwrap_or_default(),
            memory_total: d.memory_info().map(|m| m.total).unwrap_or(0),
            pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
            name: name.clone(),
        };
        let tag = format!("GPU {i}");
        let model = for_gpu(policy, &name);
        checks.push((
            format!("{tag} model"),
            if model.is_some() {
                Status::Pass
            } else {
                Status::Warn
            },
            match model {
                Some(m) => format!(
                    "{name}, sm_{}, {:.0} GiB, policy {}",
                    gpu.arch.replace('.', ""),
                    gpu.memory_total as f64 / (1u64 << 30) as f64,
                    m.model
                ),
                None => format!("{name}: no policy entry for this model; floors not checked"),
            },
        ));
        checks.push(ecc(&d, &tag));
        checks.push(match d.is_in_persistent_mode() {
            Ok(true) => (format!("{tag} persistence"), Status::Pass, "on".into()),
            Ok(false) => (format!("{tag} persistence"), Status::Warn, "off: the driver tears down and re-initialises the GPU between jobs, adding seconds to each start".into()),
            Err(e) => (format!("{tag} persistence"), Status::Skip, format!("not readable: {e}")),
        });
        checks.push(match d.mig_mode() {
            Ok(m) if m.current == 1 => (
                format!("{tag} MIG"),
                Status::Warn,
                "MIG is on: the probe sees a partition, not the whole GPU".into(),
            ),
            Ok(_) => (format!("{tag} MIG"), Status::Pass, "off".into()),
            Err(_) => (
                format!("{tag} MIG"),
                Status::Skip,
                "not supported on this GPU".into(),
            ),
        });
        checks.push(clocks(&d, &tag));
        if let Some(m) = model {
            checks.push(pcie(&d, &tag, m));
            checks.push(nvlink(&d, &tag, m));
        }
        facts.gpus.push(gpu);
        handles.push(d);
    }
    for (ai, a) in handles.iter().enumerate() {
        let mut topo = Vec::new();
        let mut p2p = Vec::new();
        for (bi, b) in handles.iter().enumerate() {
            if ai == bi {
                topo.push("X".into());
                p2p.push("X".into());
                continue;
            }
            let by_value = nvml
                .device_by_index(indices[bi])
                .map_err(|e| e.to_string())?;
            topo.push(match a.topology_common_ancestor(by_value) {
                Ok(TopologyLevel::Internal) => "internal".into(),
                Ok(TopologyLevel::Single) => "PIX".into(),
                Ok(TopologyLevel::Multiple) => "PXB".into(),
                Ok(TopologyLevel::HostBridge) => "PHB".into(),
                Ok(TopologyLevel::Node) => "NODE".into(),
                Ok(TopologyLevel::System) => "SYS".into(),
                Err(e) => format!("? ({e})"),
            });
            p2p.push(match a.p2p_status(b, P2pCapabilitiesIndex::Read) {
                Ok(s) => format!("{s:?}"),
                Err(e) => format!("? ({e})"),
            });
        }
        facts.topology.push(topo);
        facts.p2p.push(p2p);
    }
    if handles.len() > 1 {
        let blocked: Vec<String> = facts
            .p2p
            .iter()
            .enumerate()
            .flat_map(|(i, row)| {
                row.iter()
                    .enumerate()
                    .filter(|(_, s)| *s != "X" && *s != "Ok")
                    .map(move |(j, s)| format!("{i}->{j}: {s}"))
            })
            .collect();
        checks.push((
            "P2P status (NVML)".into(),
            if blocked.is_empty() {
                Status::Pass
            } else {
                Status::Warn
            },
            if blocked.is_empty() {
                "every pair reports P2P reads possible".into()
            } else {
                blocked.join(", ")
            },
        ));
    }
    Ok((facts, checks))
}

fn ecc(d: &nvml_wrapper::Device, tag: &str) -> Found {
    let name = format!("{tag} ECC");
    match d.is_ecc_enabled() {
        Ok(mode) if !mode.currently_enabled => (
            name,
            Status::Warn,
            "ECC is off: memory errors go unnoticed".into(),
        ),
        Ok(_) => {
            let volatile = d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .unwrap_or(0);
            let aggregate = d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
                .unwrap_or(0);
            let pending = d.are_pages_pending_retired().unwrap_or(false);
            if volatile > 0 {
                (
                    name,
                    Status::Fail,
                    format!(
                        "{volatile} uncorrected ECC errors since the driver loaded: drain this GPU"
                    ),
                )
            } else if pending {
                (
                    name,
                    Status::Warn,
                    "pages are pending retirement: reset the GPU when it is idle".into(),
                )
            } else {
                (
                    name,
                    Status::Pass,
                    format!(
                        "on, no uncorrected errors since load ({aggregate} in the GPU's lifetime)"
                    ),
                )
            }
        }
        Err(_) => (name, Status::Skip, "ECC not supported on this GPU".into()),
    }
}

fn clocks(d: &nvml_wrapper::Device, tag: &str) -> Found {
    let name = format!("{tag} clocks");
    let sm = d.clock_info(Clock::SM).unwrap_or(0);
    let max = d.max_clock_info(Clock::SM).unwrap_or(0);
    match d.current_throttle_reasons() {
        Ok(r) => {
            use nvml_wrapper::bitmasks::device::ThrottleReasons as T;
            let bad = T::HW_SLOWDOWN
                | T::HW_THERMAL_SLOWDOWN
                | T::HW_POWER_BRAKE_SLOWDOWN
                | T::SW_THERMAL_SLOWDOWN;
            if r.intersects(bad) {
                (
                    name,
                    Status::Warn,
                    format!("SM {sm}/{max} MHz, slowed down: {:?}", r & bad),
                )
            } else {
                (
                    name,
                    Status::Pass,
                    format!("SM {sm}/{max} MHz, no thermal or power slowdown ({:?})", r),
                )
            }
        }
        Err(e) => (
            name,
            Status::Skip,
            format!("SM {sm}/{max} MHz; throttle reasons not readable: {e}"),
        ),
    }
}

fn pcie(d: &nvml_wrapper::Device, tag: &str, m: &ModelPolicy) -> Found {
    let name = format!("{tag} PCIe link");
    let (generation, width) = (
        d.current_pcie_link_gen().unwrap_or(0),
        d.current_pcie_link_width().unwrap_or(0),
    );
    let (max_gen, max_width) = (
        d.max_pcie_link_gen().unwrap_or(0),
        d.max_pcie_link_width().unwrap_or(0),
    );
    let text = format!(
        "Gen{generation} x{width} now, Gen{max_gen} x{max_width} max, Gen{} x{} expected",
        m.pcie.generation, m.pcie.width
    );
    if max_width == 0 {
        (
            name,
            Status::Skip,
            "not readable (virtualised PCIe?)".into(),
        )
    } else if max_width < m.pcie.width || max_gen < m.pcie.generation {
        (
            name,
            Status::Fail,
            format!("{text}: the slot or riser limits the link"),
        )
    } else if width < max_width {
        (
            name,
            Status::Warn,
            format!("{text}: trained below its width"),
        )
    } else {
        // Idle GPUs drop the link generation to save power; only the width says much at rest.
        (name, Status::Pass, text)
    }
}

fn nvlink(d: &nvml_wrapper::Device, tag: &str, m: &ModelPolicy) -> Found {
    let name = format!("{tag} NVLink");
    let up = (0..18u32)
        .filter(|l| d.link_wrapper_for(*l).is_active().unwrap_or(false))
        .count() as u32;
    if m.nvlink_links == 0 {
        (
            name,
            Status::Pass,
            format!("{up} links up; none expected for {}", m.model),
        )
    } else if up >= m.nvlink_links {
        (
            name,
            Status::Pass,
            format!("{up} of {} links up", m.nvlink_links),
        )
    } else if up == 0 {
        (
            name,
            Status::Warn,
            format!(
                "no NVLink links up ({} expected on {}); a one-GPU slice of a node, or the fabric manager is down",
                m.nvlink_links, m.model
            ),
        )
    } else {
        (
            name,
            Status::Fail,
            format!("{up} of {} links up: degraded NVLink", m.nvlink_links),
        )
    }
}
